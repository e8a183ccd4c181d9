"""The bug zoo: learners' attention code, one mistake per member (marked `# BUG`, or `# SIZE`, `# LAYOUT`, `# DTYPE`
for a habit right only at some sizes, layouts or dtypes), most of it running and returning the right shapes. ``ZOO``
lists, per checker, each member, its word (a key of ``mha.exercises.MISTAKES``, or None) and words its message must
contain: one member per path of a checker (a mistake two checkers explain with one shared code is here once). The
layers are in tests/bug_zoo_layers.py."""

import math

import bug_zoo_layers as layers
import torch
import torch.nn.functional as F

# --- attention(q, k, v, mask=None) -> (out, weights); mask: True = may attend -------------------


def _masked(scores, mask):
    """What every member does with the keep-mask, unless its bug is there."""
    return scores if mask is None else scores.masked_fill(~mask, float("-inf"))


def _softmax_then_v(scores, v):
    """What every member does after the scores, unless its bug is there: (out, weights)."""
    weights = F.softmax(scores, dim=-1)
    return weights @ v, weights


def attention_without_scale(q, k, v, mask=None):
    return _softmax_then_v(_masked(q @ k.transpose(-2, -1), mask), v)  # BUG: no 1/sqrt(d_k)


def attention_softmax_over_queries(q, k, v, mask=None):
    weights = F.softmax(_masked(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), mask), dim=-2)  # BUG: the queries
    return weights @ v, weights


def attention_mask_inverted(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))  # BUG: blocks where the keep-mask is True
    return _softmax_then_v(scores, v)


def attention_averages_keys(q, k, v, mask=None):
    weights = F.softmax(_masked(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), mask), dim=-1)
    return weights @ k, weights  # BUG: K where V belongs


def attention_scale_of_notebook_01(q, k, v, mask=None):
    return _softmax_then_v(_masked(q @ k.transpose(-2, -1) / math.sqrt(8), mask), v)  # SIZE: notebook 01's d_k = 8


def attention_four_dims_only(q, k, v, mask=None):
    scores = q @ k.transpose(2, 3) / math.sqrt(q.size(3))  # SIZE: dims counted from the front, 4-d only
    weights = F.softmax(_masked(scores, mask), dim=3)
    return weights @ v, weights


def attention_fill_minus_1e9(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)  # DTYPE: -1e9 does not fit in float16
    return _softmax_then_v(scores, v)


def attention_scales_q_in_place(q, k, v, mask=None):
    q /= math.sqrt(q.size(-1))  # BUG: right values, but the caller's q is scaled too (and backward breaks)
    return _softmax_then_v(_masked(q @ k.transpose(-2, -1), mask), v)


def attention_float32_mask_added(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores + torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))  # DTYPE: a float32 mask
    return _softmax_then_v(scores, v)


def attention_mask_given_four_dims(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask[None, None], float("-inf"))  # SIZE: makes (T, d_k) inputs 4-d
    return _softmax_then_v(scores, v)


def attention_in_float32(q, k, v, mask=None):
    scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.size(-1))  # DTYPE: float32 whatever q is
    weights = F.softmax(_masked(scores, mask), dim=-1)
    return weights @ v.float(), weights


def attention_mask_ignored(q, k, v, mask=None):
    return _softmax_then_v(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), v)  # BUG: the mask is never applied


def attention_mask_after_softmax(q, k, v, mask=None):
    weights = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
    if mask is not None:
        weights = weights * mask  # BUG: zeroed after the softmax, rows no longer sum to 1
    return weights @ v, weights


def attention_mask_filled_with_zero(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, 0.0)  # BUG: exp(0) = 1, not 0
    return _softmax_then_v(scores, v)


def attention_float_mask_added(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores + mask.to(q.dtype)  # BUG: adds 0s and 1s to the scores, which blocks nothing
    return _softmax_then_v(scores, v)


def attention_returns_weights_first(q, k, v, mask=None):
    weights = F.softmax(_masked(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), mask), dim=-1)
    return weights, weights @ v  # BUG: (weights, out)


def attention_weights_keys_by_queries(q, k, v, mask=None):
    scores = k @ q.transpose(-2, -1) / math.sqrt(q.size(-1))  # BUG: (S, T), one row per key
    weights = F.softmax(_masked(scores, None if mask is None else mask.mT), dim=-1)
    return weights.mT @ v, weights


# --- induction_score(w, tokens) -> float: notebook 05's mean weight on the key after each query's letter's earlier
# occurrence p < t, for one head's weights (B, T, T) and the letters (B, T) ---------------------------------------


def _earlier(tokens, diagonal=-1):
    """(B, T, T): query t's letter is key p's letter, for keys p <= t + diagonal."""
    T = tokens.size(1)
    return (tokens[:, :, None] == tokens[:, None, :]) & torch.ones(T, T, dtype=torch.bool).tril(diagonal)


def _after(earlier):
    """(B, T, T): the key after each marked key."""
    after = torch.zeros_like(earlier)
    after[..., 1:] = earlier[..., :-1]
    return after


def score_right(w, tokens):
    return w[_after(_earlier(tokens))].mean()  # right: the one member without a bug, tests/test_exercises.py passes it


def score_mean_of_means(w, tokens):
    after = _after(_earlier(tokens))
    return ((w * after).sum((1, 2)) / after.sum((1, 2))).mean()  # BUG: per sequence, then over sequences


def score_per_sequence(w, tokens):
    after = _after(_earlier(tokens))
    return (w * after).sum((1, 2)) / after.sum((1, 2))  # BUG: one score per sequence, (B,), not one number


def score_per_query_first(w, tokens):
    after = _after(_earlier(tokens))
    return ((w * after).sum(-1) / after.sum(-1)).mean()  # BUG: 0 / 0 for every query without an earlier occurrence


# Per checker: (member, the word it must be named by or None, words its message must contain); the one-line
# members are written here, as lambdas.
ZOO = {
    "check_split_heads": [  # split_heads(x, h): (B, T, D) -> (B, h, T, D // h)
        (lambda x, h: x.view(x.size(0), h, x.size(1), -1),  # BUG: cuts the sequence, not each token's vector
         "transpose", "straight into (B, h, T, d_k)"),
        (lambda x, h: x.view(*x.shape[:2], h, -1),  # BUG: (B, T, h, d_k), the transpose(1, 2) is missing
         "transpose", "add .transpose(1, 2)"),
        (lambda x, h: x.view(*x.shape[:2], -1, h).permute(0, 3, 1, 2),  # BUG: head i gets columns i, i + h, ...
         None, "every h-th column"),
        (lambda x, h: x.view(*x.shape[:2], -1, 4).transpose(1, 2),  # SIZE: d_k = 4 (notebook 02's), whatever h is
         None, "whatever h is"),
        (lambda x, h: x.view(*x.shape[:2], -1, h).transpose(1, 2),  # BUG: (B, T, d_k, h), d_k heads of width h
         None, "the sizes in your view are swapped"),
        (lambda x, h: x.view(*x.shape[:2], h, -1).transpose(1, 2).squeeze(),  # SIZE: drops B and h when they are 1
         None, ".squeeze() drops every dim of size 1"),
    ],
    "check_merge_heads": [  # merge_heads(x): (B, h, T, d_k) -> (B, T, h*d_k)
        (lambda x: x.reshape(x.size(0), x.size(2), -1),  # BUG: mixes heads with time steps (case C6)
         "transpose", "mixed up with the time steps"),
        (lambda x: x.sum(dim=1), "concat", "you sum the heads"),  # BUG: adds the heads up instead of concatenating
        (lambda x: x.permute(0, 2, 3, 1).flatten(2),  # BUG: (B, T, d_k, h): value j of every head, then j+1
         None, "you interleave the heads"),
        (lambda x: x.transpose(1, 2), None, "flatten the last two dims"),  # BUG: (B, T, h, d_k), never flattened
        (lambda x: x.transpose(1, 2).view(x.size(0), x.size(2), -1),  # LAYOUT: view needs (B, T, h, d_k) in memory
         None, "view cannot flatten it"),
        (lambda x: x.transpose(1, 2).reshape(x.size(0), x.size(2), 3 * x.size(3)),  # SIZE: h = 3, notebook 02's
         None, "is a size (h, d_k, T) written into the code"),
    ],
    "check_attention": [
        (attention_without_scale, "scale", "(no scaling)"),
        (attention_softmax_over_queries, "softmax", "over the queries"),
        (attention_mask_inverted, "inverted", "zero exactly where the mask is True"),
        (attention_averages_keys, "value", "weights @ V"),
        (attention_scale_of_notebook_01, "scale", "1/√8, a fixed number"),
        (attention_four_dims_only, None, "assumes 4 dims"),
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
        (layers.HeadsSummedAndRepeated, "concat", "you sum the heads"),
        (layers.CausalIgnored, "causal", "attends to later tokens"),
        (layers.CausalMaskAdded, "float mask", "torch.tril(torch.ones(T, T)), to the scores"),
        (layers.QKVReadHeadByHead, None, "reads qkv's output head by head"),
        (layers.OutWeightAsStored, None, "call self.out(x) instead of x @ self.out.weight"),
        (layers.MaskBufferOfFixedSize, None, "something in it has a fixed size"),
        (layers.CastsToFloat32, None, "This probe is torch.float64"),
        (layers.SqueezesTheWeights, None, ".squeeze() drops every dim of size 1"),
        (layers.SeparateProjections, None, "(it has q_proj, k_proj, v_proj, out)"),
        (layers.AveragedWeights, None, "not their average"),
        (layers.AlwaysCausal, None, "causal=False) still applies the causal mask"),
        (layers.ForgetsTheBatch, None, "so that layers stack"),
    ],
    "check_induction_score": [
        (lambda w, tokens: w[_earlier(tokens)].mean(),  # BUG: the weight on p, not on p + 1
         None, "the earlier occurrence p itself"),
        (lambda w, tokens: w[_after(_earlier(tokens, diagonal=0))].mean(),  # BUG: tril() keeps p = t: itself
         None, "every query matches its own position"),
        (score_mean_of_means, None, "then over the sequences"),
        (lambda w, tokens: (w * _after(_earlier(tokens))).sum(-1).mean(),  # BUG: a query with no earlier one is 0
         None, "divide by the number of all queries"),
        (score_per_sequence, None, "a tensor of shape (4,), not one number"),
        (score_per_query_first, None, "a mean is taken over nothing"),
        (lambda w, tokens: w.mT[_after(_earlier(tokens))].mean(),  # BUG (not recognised): w[b, p + 1, t]
         None, "Recheck which queries count"),
    ],
    "check_torch_attn_mask": [  # to_torch_attn_mask(keep): keep-mask (T, S) -> nn.MultiheadAttention's attn_mask
        (lambda keep: keep,  # BUG: nn.MultiheadAttention reads True as *blocked*
         "inverted", "reads a bool attn_mask as True = blocked"),
        (lambda keep: keep.float(), "float mask", "blocks nothing"),  # BUG: a float attn_mask is added to the scores
        (lambda keep: (1 - keep.float()) * float("-inf"),  # BUG: 0 * -inf is NaN where a key is kept (notebook 04)
         None, "0 * -inf is NaN"),
        (lambda keep: ~keep.T, None, "keys by queries"),  # BUG: (S, T); attn_mask is (T, S)
        (lambda keep: torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, float("-inf")),  # DTYPE
         None, "yours is torch.float64"),
        (lambda keep: keep.logical_not_(), None, "in place"),  # BUG: right values, but the caller's mask flips too
    ],
}
