"""Exercises that check themselves and name the mistake.

Each checker calls your code on inputs it chooses, compares the result with the
right answer and with the answers of known mistakes, and returns a
:class:`CheckResult`: ``passed``, and a ``message`` that, when it recognises
the mistake, explains it with one of the words of :data:`MISTAKES`. Otherwise
the message gives the first wrong shape or the largest difference, with the
probe's sizes. The probes vary the sizes, the head count, the number of
leading dims, the memory layout and the dtype, so that code which is right
only at one notebook's sizes fails, and says why. Every message starts with
its status in words: "✅ passed:", "❌ wrong:" or "⏳ not done yet:".

    >>> from mha.exercises import check_merge_heads
    >>> check_merge_heads(lambda x: x.reshape(x.size(0), x.size(2), -1)).mistake
    'transpose'

The checkers run offline on the CPU, take well under a second, and
are deterministic: their inputs and the weights they put into your module come
from generators of their own, and the global RNG state is left as it was.
Your code never makes a checker raise (an error in it, or ``raise
NotImplementedError`` in a stub, gives ``passed=False``); passing something
that is not callable raises TypeError.

Masks follow the library's convention: True means "this query may attend to
this key".

| checker | checks |
|---|---|
| ``check_split_heads(fn)`` | ``fn(x, h)``: (B, T, D) -> (B, h, T, D // h) |
| ``check_merge_heads(fn)`` | ``fn(x)``: (B, h, T, d_k) -> (B, T, h·d_k) |
| ``check_attention(fn)`` | ``fn(q, k, v, mask=None) -> (out, weights)`` |
| ``check_multi_head_attention(cls)`` | ``cls(d_model, h)``: ``qkv``, ``out``, ``forward(x, causal=True) -> (y, w)`` |
| ``check_torch_attn_mask(fn)`` | ``fn(keep)``: a (T, S) keep-mask -> ``nn.MultiheadAttention``'s ``attn_mask`` |
| ``check_induction_score(fn)`` | ``fn(w, tokens)``: one head's (B, T, T) weights -> notebook 05's induction score |
| ``check_head(answer, scores, pattern)`` | notebook 06: the (layer, head) that does a pattern, above its baseline |
| ``check_answer(answer, expected, name=...)`` | a number (or a dict of them) against the notebook's own measure |

A wrong number is told whether it is too high or too low and roughly by how
much, never the right value: ``check_answer(..., reveal=True)`` asks for it.
"""

from ._core import CheckResult
from .answers import check_answer
from .attention import check_attention
from .heads import check_merge_heads, check_split_heads
from .induction import check_induction_score
from .masks import check_torch_attn_mask
from .mistakes import MISTAKES
from .multihead import check_multi_head_attention
from .real_heads import check_head

__all__ = [
    "MISTAKES",
    "CheckResult",
    "check_answer",
    "check_attention",
    "check_head",
    "check_induction_score",
    "check_merge_heads",
    "check_multi_head_attention",
    "check_split_heads",
    "check_torch_attn_mask",
]
