"""The bug zoo: attention code with the mistakes learners make, one mistake per member.

Each member is written the way a learner writes it, in the article's style, with
exactly one bug (marked `# BUG`), or a habit that is right only at some sizes,
layouts or dtypes (marked `# SIZE`, `# LAYOUT`, `# DTYPE`). Most of them run
without an error and return tensors of the right shape. ``ZOO`` lists, per
checker, each member, the word (a key of ``mha.exercises.MISTAKES``, or None for
a mistake that is explained but not named) and words its message must contain.
The layers are in tests/bug_zoo_layers.py, notebook 05's scores in tests/bug_zoo_scores.py.
"""

import math

import bug_zoo_layers as layers
import bug_zoo_scores as scores
import torch
import torch.nn.functional as F

# --- split_heads(x, h): (B, T, D) -> (B, h, T, D // h) -------------------------------------


def split_heads_without_transpose(x, h):
    B, T, D = x.shape
    return x.view(B, h, T, D // h)  # BUG: cuts the sequence, not each token's vector


def split_heads_transpose_forgotten(x, h):
    B, T, D = x.shape
    return x.view(B, T, h, D // h)  # BUG: (B, T, h, d_k), the transpose(1, 2) is missing


def split_heads_every_hth_column(x, h):
    B, T, D = x.shape
    return x.view(B, T, D // h, h).permute(0, 3, 1, 2)  # BUG: head i gets columns i, i + h, i + 2h, ...


def split_heads_four_wide(x, h):
    B, T, D = x.shape
    return x.view(B, T, -1, 4).transpose(1, 2)  # SIZE: d_k = 4 (notebook 02's), whatever h is


def split_heads_sizes_swapped(x, h):
    B, T, D = x.shape
    return x.view(B, T, D // h, h).transpose(1, 2)  # BUG: (B, T, d_k, h), d_k heads of width h (a learner's)


def split_heads_squeezed(x, h):
    B, T, D = x.shape
    return x.view(B, T, h, D // h).transpose(1, 2).squeeze()  # SIZE: drops B and h when they are 1


def split_heads_in_float32(x, h):
    B, T, D = x.shape
    return x.float().view(B, T, h, D // h).transpose(1, 2)  # DTYPE: right for float32 inputs only


# --- merge_heads(x): (B, h, T, d_k) -> (B, T, h*d_k) ------------------------------------------


def merge_heads_without_transpose(x):
    B, h, T, d_k = x.shape
    return x.reshape(B, T, h * d_k)  # BUG: mixes heads with time steps (case C6)


def merge_heads_summed(x):
    return x.sum(dim=1)  # BUG: adds the heads up instead of concatenating them


def merge_heads_averaged(x):
    return torch.mean(x, dim=1)  # BUG: averages the heads instead of concatenating them


def merge_heads_interleaved(x):
    B, h, T, d_k = x.shape
    return x.permute(0, 2, 3, 1).reshape(B, T, h * d_k)  # BUG: (B, T, d_k, h): value j of every head, then j+1


def merge_heads_not_flattened(x):
    return x.transpose(1, 2)  # BUG: (B, T, h, d_k), the last two dims are never flattened


def merge_heads_view_after_transpose(x):
    B, h, T, d_k = x.shape
    return x.transpose(1, 2).view(B, T, h * d_k)  # LAYOUT: view needs memory laid out as (B, T, h, d_k)


def merge_heads_three_heads(x):
    B, h, T, d_k = x.shape
    return x.transpose(1, 2).reshape(B, T, 3 * d_k)  # SIZE: h = 3, notebook 02's


def merge_heads_squeezed(x):
    return x.transpose(1, 2).flatten(2).squeeze()  # SIZE: drops B when it is 1


def merge_heads_in_float32(x):
    return x.transpose(1, 2).flatten(2).float()  # DTYPE: right for float32 inputs only


# --- attention(q, k, v, mask=None) -> (out, weights); mask: True = may attend -------------------


def attention_without_scale(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1)  # BUG: no 1/sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = F.softmax(scores, dim=-1)
    return weights @ v, weights


def attention_divided_by_d_k(q, k, v, mask=None):
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / d_k  # BUG: 1/d_k instead of 1/sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


def attention_scale_precedence(q, k, v, mask=None):
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) * d_k ** -1 / 2  # BUG: that is (1/d_k) / 2, not d_k ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def attention_softmax_over_queries(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = F.softmax(scores, dim=-2)  # BUG: normalises over the queries
    return weights @ v, weights


def attention_mask_inverted(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))  # BUG: blocks where the keep-mask is True
    weights = F.softmax(scores, dim=-1)
    return weights @ v, weights


def attention_averages_keys(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = F.softmax(scores, dim=-1)
    return weights @ k, weights  # BUG: K where V belongs


def attention_scale_of_notebook_01(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(8)  # SIZE: notebook 01's d_k = 8, whatever q's width
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = F.softmax(scores, dim=-1)
    return weights @ v, weights


def attention_four_dims_only(q, k, v, mask=None):
    scores = q @ k.transpose(2, 3) / math.sqrt(q.size(3))  # SIZE: dims counted from the front, 4-d only
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = F.softmax(scores, dim=3)
    return weights @ v, weights


def attention_einsum_four_dims(q, k, v, mask=None):
    scores = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(q.size(-1))  # SIZE: no '...', 4-d only
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return torch.einsum("bhts,bhsd->bhtd", weights, v), weights


def attention_fill_minus_1e9(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)  # DTYPE: -1e9 does not fit in float16
    weights = F.softmax(scores, dim=-1)
    return weights @ v, weights


def attention_scales_q_in_place(q, k, v, mask=None):
    q /= math.sqrt(q.size(-1))  # BUG: right values, but the caller's q is scaled too (and backward breaks)
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = F.softmax(scores, dim=-1)
    return weights @ v, weights


def attention_float32_mask_added(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores + torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))  # DTYPE: a float32 mask
    weights = F.softmax(scores, dim=-1)
    return weights @ v, weights


def attention_mask_given_four_dims(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask[None, None], float("-inf"))  # SIZE: makes (T, d_k) inputs 4-d
    weights = F.softmax(scores, dim=-1)
    return weights @ v, weights


def attention_in_float32(q, k, v, mask=None):
    scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.size(-1))  # DTYPE: float32 whatever q is
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = F.softmax(scores, dim=-1)
    return weights @ v.float(), weights


def attention_mask_ignored(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # BUG: the mask is never applied
    weights = F.softmax(scores, dim=-1)
    return weights @ v, weights


def attention_mask_after_softmax(q, k, v, mask=None):
    weights = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
    if mask is not None:
        weights = weights * mask  # BUG: zeroed after the softmax, rows no longer sum to 1
    return weights @ v, weights


def attention_mask_filled_with_zero(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, 0.0)  # BUG: exp(0) = 1, not 0
    weights = F.softmax(scores, dim=-1)
    return weights @ v, weights


def attention_float_mask_added(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores + mask.to(q.dtype)  # BUG: adds 0s and 1s to the scores, which blocks nothing
    weights = F.softmax(scores, dim=-1)
    return weights @ v, weights


def attention_returns_weights_first(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = F.softmax(scores, dim=-1)
    return weights, weights @ v  # BUG: (weights, out)


def attention_weights_keys_by_queries(q, k, v, mask=None):
    scores = k @ q.transpose(-2, -1) / math.sqrt(q.size(-1))  # BUG: (S, T), one row per key
    if mask is not None:
        scores = scores.masked_fill(~mask.mT, float("-inf"))
    weights = F.softmax(scores, dim=-1)
    return weights.mT @ v, weights


# --- to_torch_attn_mask(keep): keep-mask (T, S) -> nn.MultiheadAttention's attn_mask ---------------


def torch_mask_passed_through(keep):
    return keep  # BUG: nn.MultiheadAttention reads True as *blocked*


def torch_mask_as_float(keep):
    return keep.float()  # BUG: a float attn_mask is added to the scores, blocking nothing


def torch_mask_times_inf(keep):
    return (1 - keep.float()) * float("-inf")  # BUG: 0 * -inf is NaN where a key is kept (notebook 04)


def torch_mask_keys_by_queries(keep):
    return ~keep.T  # BUG: (S, T); attn_mask is (T, S)


def torch_mask_float64(keep):
    return torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, float("-inf"))  # DTYPE: float64 only


def torch_mask_flipped_in_place(keep):
    return keep.logical_not_()  # BUG: right values, but the caller's mask is flipped too


# Per checker: (member, the word it must be named by or None, words its message must contain).
ZOO = {
    "check_split_heads": [
        (split_heads_without_transpose, "transpose", "straight into (B, h, T, d_k)"),
        (split_heads_transpose_forgotten, "transpose", "add .transpose(1, 2)"),
        (split_heads_every_hth_column, None, "every h-th column"),
        (split_heads_four_wide, None, "whatever h is"),
        (split_heads_sizes_swapped, None, "the sizes in your view are swapped"),
        (split_heads_squeezed, None, ".squeeze() drops every dim of size 1"),
        (split_heads_in_float32, None, "torch.float32 for torch.float64 inputs"),
    ],
    "check_merge_heads": [
        (merge_heads_without_transpose, "transpose", "mixed up with the time steps"),
        (merge_heads_summed, "concat", "you sum the heads"),
        (merge_heads_averaged, "concat", "you average the heads"),
        (merge_heads_interleaved, None, "you interleave the heads"),
        (merge_heads_not_flattened, None, "flatten the last two dims"),
        (merge_heads_view_after_transpose, None, "view cannot flatten it"),
        (merge_heads_three_heads, None, "is a size (h, d_k, T) written into the code"),
        (merge_heads_squeezed, None, ".squeeze() drops every dim of size 1"),
        (merge_heads_in_float32, None, "torch.float32 for torch.float64 inputs"),
    ],
    "check_attention": [
        (attention_without_scale, "scale", "(no scaling)"),
        (attention_divided_by_d_k, "scale", "(1/d_k)"),
        (attention_scale_precedence, "scale", "(d_k ** -1 / 2, which is (1/d_k) / 2)"),
        (attention_softmax_over_queries, "softmax", "over the queries"),
        (attention_mask_inverted, "inverted", "zero exactly where the mask is True"),
        (attention_averages_keys, "value", "weights @ V"),
        (attention_scale_of_notebook_01, "scale", "1/√8, a fixed number"),
        (attention_four_dims_only, None, "assumes 4 dims"),
        (attention_einsum_four_dims, None, "an einsum without '...'"),
        (attention_fill_minus_1e9, None, "-1e9 does not fit"),
        (attention_scales_q_in_place, None, "changes q in place"),
        (attention_float32_mask_added, None, "This probe is torch.float16"),
        (attention_mask_given_four_dims, None, "mask was given leading dims"),
        (attention_in_float32, None, "torch.float32 for torch.float64 inputs"),
        (attention_mask_ignored, None, "the mask changes nothing"),
        (attention_mask_after_softmax, None, "after the softmax"),
        (attention_mask_filled_with_zero, None, "exp(0) is not 0"),
        (attention_float_mask_added, "float mask", "a 0/1 mask blocks nothing"),
        (attention_returns_weights_first, None, "you return (weights, out)"),
        (attention_weights_keys_by_queries, None, "keys by queries"),
    ],
    "check_multi_head_attention": [
        (layers.SplitWithoutTranspose, "transpose", "cuts the sequence"),
        (layers.MergeWithoutTranspose, "transpose", "mixed up with the time steps"),
        (layers.ScaledByDModel, "scale", "(1/√d_model)"),
        (layers.SoftmaxOverHeads, "softmax", "over the heads"),
        (layers.CausalMaskInverted, "inverted", "attends to the future and not to the past"),
        (layers.AveragesKeys, "value", "weights @ V"),
        (layers.HeadsSeeTheirSlice, "slice", "its own d_k-wide slice"),
        (layers.ProjectsEachSlice, "slice", "qkv maps d_k = 4 inputs"),
        (layers.NoOutputProjection, "W_O", "no `out` layer"),
        (layers.OutputProjectionUnused, "W_O", "never applied"),
        (layers.HeadsAveraged, "concat", "summed or averaged before it"),
        (layers.HeadsSummed, "concat", "summed or averaged before it"),
        (layers.HeadsSummedAndRepeated, "concat", "you sum the heads"),
        (layers.CausalIgnored, "causal", "attends to later tokens"),
        (layers.CausalMaskAdded, "float mask", "torch.tril(torch.ones(T, T)), to the scores"),
        (layers.QKVReadHeadByHead, None, "reads qkv's output head by head"),
        (layers.OutWeightAsStored, None, "call self.out(x) instead of x @ self.out.weight"),
        (layers.MaskBufferOfFixedSize, None, "something in it has a fixed size"),
        (layers.ScaleOfTheFirstProbe, "scale", "1/√4, a fixed number"),
        (layers.CastsToFloat32, None, "This probe is torch.float64"),
        (layers.SqueezesTheWeights, None, ".squeeze() drops every dim of size 1"),
        (layers.SeparateProjections, None, "(it has q_proj, k_proj, v_proj, out)"),
        (layers.AveragedWeights, None, "not their average"),
        (layers.AlwaysCausal, None, "causal=False) still applies the causal mask"),
        (layers.ForgetsTheBatch, None, "so that layers stack"),
    ],
    "check_induction_score": [
        (scores.score_on_the_occurrence, None, "the earlier occurrence p itself"),
        (scores.score_counts_itself, None, "every query matches its own position"),
        (scores.score_mean_of_means, None, "then over the sequences"),
        (scores.score_over_every_query, None, "divide by the number of all queries"),
        (scores.score_per_sequence, None, "a tensor of shape (4,), not one number"),
        (scores.score_per_query_first, None, "a mean is taken over nothing"),
        (scores.score_of_the_transposed_weights, None, "Recheck which queries count"),
    ],
    "check_torch_attn_mask": [
        (torch_mask_passed_through, "inverted", "reads a bool attn_mask as True = blocked"),
        (torch_mask_as_float, "float mask", "blocks nothing"),
        (torch_mask_times_inf, None, "0 * -inf is NaN"),
        (torch_mask_keys_by_queries, None, "keys by queries"),
        (torch_mask_float64, None, "yours is torch.float64"),
        (torch_mask_flipped_in_place, None, "in place"),
    ],
}
