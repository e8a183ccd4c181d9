"""The one table of mistakes every checker shares: their words, their explanations, and how scales are named.

A checker that recognises a mistake raises ``Mistake(say(key, ...), word)``: the text comes from
:data:`EXPLAIN`, so the same mistake reads the same in every checker (they used to carry copies that had
drifted apart, "dim -2" in one and "dim 2" in the other). ``word`` is a key of :data:`MISTAKES` for the
mistakes the course names, or None for the ones that are explained but not named.
"""

from __future__ import annotations

import math

import torch

#: The mistakes the checkers name, by the word their message contains.
MISTAKES = {
    "transpose": "reshaping into or out of heads without the transpose",
    "scale": "a wrong or missing scale (1/√d_model, 1/d_k, none, ...) instead of 1/√d_k",
    "softmax": "softmax over the wrong dimension",
    "inverted": "a mask read the wrong way round (True taken as blocked, or a keep-mask passed straight "
    "to nn.MultiheadAttention)",
    "value": "K used where V belongs",
    "slice": "heads that see only their slice of the embedding instead of the whole projection",
    "W_O": "no output projection W_O",
    "concat": "heads summed or averaged instead of concatenated",
    "causal": "causal=True ignored, so a token sees the future",
    "float mask": "a 0/1 mask added to the scores, which blocks nothing (the article's torch.tril(torch.ones(T, T)) "
    "used as PyTorch uses a float mask)",
}

#: Which dim a softmax over the weights (B, h, T, S) normalises, by its index from the front.
SOFTMAX_OVER = {
    0: "the batch (dim 0)",
    1: "the heads (dim 1)",
    2: "the queries (dim 2, that is dim -2)",
}

#: What to say, by mistake. ``{...}`` fields are filled in by :func:`say`.
EXPLAIN = {
    # reshapes into and out of heads
    "split without transpose": "you reshape (B, T, h·d_k) straight into (B, h, T, d_k){sizes}. That cuts the sequence "
    "into h pieces instead of cutting each token's vector into h heads (transpose): view it as (B, T, h, d_k) first, "
    "then transpose(1, 2).",
    "split transpose forgotten": "you return (B, T, h, d_k){sizes}. The heads dim must come before the time dim, "
    "(B, h, T, d_k): add .transpose(1, 2).",
    "split interleaved": "head i gets every h-th column of the vector. It must get the contiguous block of columns "
    "i·d_k to (i+1)·d_k - 1 (the layout nn.MultiheadAttention's weights assume): view as (B, T, h, d_k), "
    "not (B, T, d_k, h).",
    "merge without transpose": "you reshape (B, h, T, d_k) straight into (B, T, h·d_k), so the heads get mixed up "
    "with the time steps (transpose): move h next to d_k first, x.transpose(1, 2) gives (B, T, h, d_k), then "
    "reshape(B, T, h·d_k).",
    "merge not flattened": "you return (B, T, h, d_k){sizes}: the transpose is right, now flatten the last two dims "
    "with reshape(B, T, h·d_k).",
    "merge interleaved": "you interleave the heads (value j of every head, then value j+1, ...). Concatenate head by "
    "head: the first d_k values of each token are head 0's, the next d_k head 1's. Transpose to (B, T, h, d_k), "
    "not (B, T, d_k, h).",
    "heads summed": "you {how} the heads, which throws away what each head found: the heads must be concatenated "
    "(concat), each token's h outputs side by side, (B, T, h·d_k){sizes}.",
    "split sizes swapped": "you get d_k = {d_k} heads of width h = {h}, not h heads of width d_k: the sizes in "
    "your view are swapped, (B, T, d_k, h).",
    "fixed heads": "you split into {got} whatever h is: it works only when h = {h}. Use the argument h "
    "(and d_k = x.size(-1) // h), not a number from the notebook.",
    "squeeze": "{what} has shape {got}: .squeeze() drops every dim of size 1, and here {dims} 1. Squeeze a named "
    "dim, or none: the result must be ({want}) for any sizes.",
    "extra dims": "{what} has shape {got}, with more dims than q {want}: the (T, S) mask was given leading "
    "dims (mask[None, None] or unsqueeze), which makes every result 4-d. Let the (T, S) mask broadcast as it is.",
    "dtype mix": "This probe is {dtype}, and something in your code is another dtype (a mask made with .float(), a "
    "tensor made without dtype=...): make new tensors with the inputs' dtype (dtype=q.dtype, mask.to(q.dtype)), or "
    "keep the mask bool",
    "later probe": "It passed the earlier probes: is a size (h, d_k, T) written into the code, or a view taken of a "
    "tensor that is not contiguous?",
    # attention
    "scale": "your weights are softmax(c · q kᵀ) with the scale c = {c}. The scale must be 1/√d_k = {right:.3g} "
    "(d_k = {d_k}){why}.",
    "softmax": "your softmax normalises over {over}, so the weights of one query do not sum to 1 over the keys. "
    "Each query's weights are a distribution over the keys: softmax(scores, dim=-1).",
    "inverted": "the mask is inverted: your weights are zero exactly where the mask is True. In this library True "
    "means 'may attend', so block the keys where the mask is False: scores.masked_fill(~mask, float('-inf')).",
    "inverted causal": "the causal mask is inverted: each token attends to the future and not to the past. Keep the "
    "keys where torch.tril(...) is True, block the others: scores.masked_fill(~tril, float('-inf')).",
    "value": "the weights are right but the output is weights @ K: the weights must average the value vectors, "
    "weights @ V (value).",
    "mask ignored": "the mask changes nothing: blocked keys still get weight. Set their scores to -inf before the "
    "softmax.",
    "mask after softmax": "you zero the blocked weights after the softmax, so the rows no longer sum to 1. Mask the "
    "scores (-inf) before the softmax instead.",
    "mask filled with 0": "blocked scores are set to 0, and exp(0) is not 0, so blocked keys still get weight. Fill "
    "them with float('-inf').",
    "float mask added": "you add the {mask} to the scores (float mask). Added to the scores, a 0/1 mask blocks "
    "nothing: it raises the allowed keys' scores by 1, and every blocked key keeps its weight (the float-mask trap of "
    "notebook 02, §5, and notebook 04). Block the keys where the mask is False instead: "
    "scores.masked_fill(~mask, float('-inf')), with a bool mask.",
    "weights transposed": "weights have shape {got}, keys by queries. One row per query: scores = "
    "q @ k.transpose(-2, -1), shape {want}.",
    "pair swapped": "you return (weights, out); return them the other way round, (out, weights).",
    "fixed dims": "It passed the (B, h, T, d_k) probes, so something assumes 4 dims (transpose(2, 3), size(3), "
    "dim=3, an einsum without '...'): count from the end, k.transpose(-2, -1), softmax(dim=-1), q.size(-1), "
    "'...td,...sd->...ts', so that the same code works for q of any number of dims (here {n})",
    "fill overflows": "The fill value overflows {dtype}: float16 holds nothing beyond ±65504, so -1e9 does not fit. "
    "Fill with float('-inf'), or torch.finfo(scores.dtype).min",
    "dtype": "{what} comes back as {got} for {given} inputs: {hint}keep the inputs' dtype (build new tensors with "
    "dtype=x.dtype, and don't call .float()), so that the code works in float64 and in half precision too.",
    # the layer
    "causal": "every token attends to later tokens too: forward(x, causal=True) must block the future (causal mask: "
    "query i sees keys 0..i).",
    "causal stuck": "forward(x, causal=False) still applies the causal mask: with causal=False every token may "
    "attend to every token.",
    "slice": "each head sees only its own d_k-wide slice of the embedding. Every head must see the whole embedding: "
    "project with qkv first (all d_model inputs), then split the projection into heads.",
    "slice layer": "qkv maps d_k = {d_k} inputs, so each head projects only its own slice of the embedding and is "
    "blind to the rest (slice). Every head must see the whole embedding: qkv = nn.Linear(d_model, 3 * d_model), "
    "split into heads after the projection.",
    "no W_O": "the module has no `out` layer: the heads are concatenated but never mixed. Add the output projection "
    "W_O, self.out = nn.Linear(d_model, d_model), and apply it to the concatenated heads.",
    "W_O unused": "the weights are right, but y is the concatenated heads as they are: the output projection W_O "
    "(self.out) is never applied. W_O is what mixes the heads' findings.",
    "W_O transposed": "the weights are right, but y is the heads times out.weight as it is stored. nn.Linear stores "
    "W_O as (out_features, in_features) and computes x @ weight.T + bias: call self.out(x) instead of "
    "x @ self.out.weight.",
    "out too narrow": "out maps d_k = {d_k} inputs, so the heads must be summed or averaged before it, and what each "
    "head found is mixed away. Concatenate the heads (concat) into (B, T, h·d_k) = (B, T, {d_model}) and give out "
    "d_model inputs.",
    "no qkv": "the module has no `qkv` layer{found}. The exercise's layout is one self.qkv = nn.Linear(d_model, "
    "3 * d_model) whose rows are [W_Q; W_K; W_V], so that the checker can put its weights in.",
    "interleaved qkv": "your layer reads qkv's output head by head, [q_0, k_0, v_0, q_1, ...] (GPT-NeoX's and "
    "Megatron's layout). That is a fine layout, but not this exercise's: here qkv's rows are [W_Q; W_K; W_V], all "
    "the queries first. Split qkv(x) into q, k, v first (.split(d_model, dim=-1)), then each into heads.",
    "fixed length": "It works for the shorter sequences of the earlier probes, so something in it has a fixed size "
    "(a causal-mask buffer made in __init__?): build the mask from x's T in forward, so that any length works",
    "averaged weights": "w has shape {got}: return the weights of every head, (B, h, T, T), not their average.",
    # converting a keep-mask for nn.MultiheadAttention
    "torch mask inverted": "the mask is inverted: nn.MultiheadAttention reads a bool attn_mask as True = blocked, "
    "the opposite of a keep-mask, so passing the keep-mask as it is blocks exactly the keys that should be attended "
    "to (and a causal one leaves the last query nothing: NaN). Return ~keep.",
    "float mask blocks nothing": "your float mask blocks nothing (float mask): nn.MultiheadAttention adds a float "
    "attn_mask to the scores, so finite values such as 0s and 1s only nudge them. Return a bool mask with "
    "True = blocked (~keep), or a float one with -inf where blocked and 0 elsewhere.",
    "zero times inf": "the weights come out NaN. If you built the mask as something times -inf, note that 0 * -inf "
    "is NaN: use torch.zeros(T, S).masked_fill(~keep, float('-inf')), or return ~keep.",
    "mask keys by queries": "the mask has shape {got}, keys by queries; attn_mask is (T, S) = {want}, one row per "
    "query, like the keep-mask.",
    "inputs changed in place": "your function changes {names} in place (an in-place op on an input, such as q /= "
    "... or q.mul_(...)): the caller's tensors are then changed too, and under autograd such a change raises in "
    "the backward pass. Compute new tensors (q = q / ...) and leave the inputs as they were.",
    "mask changed in place": "your function changes the keep-mask it is given (in place); return a new tensor and "
    "leave the caller's mask as it was.",
    "float mask dtype": "A float attn_mask must have the dtype of the module's inputs (float32 here), and yours is "
    "{dtype}: build it without a dtype (float32 is the default) or with the inputs' dtype, or return a bool mask "
    "(~keep), which fits every dtype",
    # notebook 05's induction score
    "score not one number": "your induction_score returns {got}, not one number. The score is one mean over every "
    "(sequence, query) pair whose letter occurred before: return it as a 0-dim tensor or a Python number (.item()).",
    "score nan": "your score is NaN: somewhere a mean is taken over nothing (0/0), for instance over a query whose "
    "letter did not occur before. Average once, over all the matched (sequence, query) pairs together.",
    "score on the occurrence": "you take the weight on the earlier occurrence p itself. The induction head looks one "
    "key further, at p + 1, the letter that came after it (the prediction): shift the matches one key to the right.",
    "score counts itself": "every query matches its own position, so each also counts the weight on the key after "
    "itself (0 under the causal mask). Compare a query only with the keys before it, p < t "
    "(torch.tril(..., diagonal=-1)).",
    "score mean of means": "you average within each sequence, then over the sequences, so a short repeat counts as "
    "much as a long one. Average once, over all the matched (sequence, query) pairs together.",
    "score every query": "you divide by the number of all queries, so the queries whose letter never occurred "
    "before count as 0. Average only over the queries whose letter occurred earlier.",
    "score wrong": "your score is {yours}; on this probe it is {right}. Recheck which queries count (those whose "
    "letter occurred earlier), which key each one reads (the one after the earlier occurrence) and what the mean "
    "is over (all those pairs together).",
}


def say(key: str, **fields) -> str:
    """The explanation of mistake ``key``, with its fields filled in."""
    return EXPLAIN[key].format(**fields)


def scale_names(*, d_k: int, d_v: int | None = None, n_q: int | None = None, n_k: int | None = None,
                heads: int | None = None, d_model: int | None = None) -> dict[str, float]:
    """The wrong scales learners use, by name, for one probe's sizes (only the sizes that are given)."""
    names = {
        "no scaling": 1.0,
        "1/d_k": 1 / d_k,
        "√d_k: multiplied instead of divided": math.sqrt(d_k),
        "d_k ** -1 / 2, which is (1/d_k) / 2": 1 / (2 * d_k),
    }
    optional = {
        "1/√d_v": d_v, "1/√T": n_q, "1/√S": n_k, "1/√d_model": d_model,
        "1/√(h·d_k)": heads * d_k if heads else None,
    }
    names.update({name: 1 / math.sqrt(n) for name, n in optional.items() if n})
    return names


def name_scale(c: float, d_k: int, names: dict[str, float]) -> str:
    """'0.125 (1/d_k)' when c is one of the named scales; '0.354 (1/√8, a fixed number ...)' when it is
    1/√n for another whole n (a d_k written into the code); else 'about 0.17'."""
    for name, value in names.items():
        if math.isclose(c, value, rel_tol=1e-2):
            return f"{value:.3g} ({name})"
    n = round(c**-2) if c > 0 else 0
    if 1 <= n <= 4096 and n != d_k and math.isclose(c, n**-0.5, rel_tol=1e-3):
        return f"{c:.3g} (1/√{n}, a fixed number: right only when d_k = {n})"
    return f"about {c:.2g}"


def fit_scale(weights: torch.Tensor, scores: torch.Tensor, keep: torch.Tensor | None = None) -> float | None:
    """The c with ``weights == softmax(c * scores)`` over the last dim, if there is one.

    Within a row, log w_j - log w_i = c (s_j - s_i) for every kept key, so c is
    a least-squares slope. Returns None when no single c explains the weights
    (a blocked key got weight, a kept one got none, or the rows are not a
    softmax of these scores at all).
    """
    w, s = weights.double(), scores.double()
    keep = torch.ones_like(s, dtype=torch.bool) if keep is None else keep.expand_as(s)
    if w.shape != s.shape or not torch.isfinite(w).all() or (w[keep] <= 0).any() or (w[~keep] != 0).any():
        return None
    n = keep.sum(-1, keepdim=True).clamp(min=1)
    logw = torch.where(keep, w.clamp(min=1e-300).log(), 0.0)
    a = torch.where(keep, logw - logw.sum(-1, keepdim=True) / n, 0.0)  # centred within each row
    b = torch.where(keep, s - torch.where(keep, s, 0.0).sum(-1, keepdim=True) / n, 0.0)
    if (b * b).sum() == 0:
        return None
    c = ((a * b).sum() / (b * b).sum()).item()
    rows_sum_to_one = torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1)), atol=1e-3)
    return c if rows_sum_to_one and (a - c * b).abs().max() < 1e-2 else None


def wrong_scale(c: float, d_k: int, names: dict[str, float], why: str) -> str:
    """The 'scale' explanation for weights that are softmax(c · q kᵀ) with c != 1/√d_k."""
    return say("scale", c=name_scale(c, d_k, names), right=1 / math.sqrt(d_k), d_k=d_k, why=why)
