"""Exercises that check themselves and name the mistake.

Each checker calls your code on inputs it chooses, compares the result with the
right answer and with the answers of known mistakes, and returns a
:class:`CheckResult`: ``passed``, and a ``message`` that, when it recognises
the mistake, explains it with one of the words of :data:`MISTAKES`. Otherwise
the message gives the first wrong shape or the largest difference, with the
probe's sizes.

    >>> from mha.exercises import check_merge_heads
    >>> check_merge_heads(lambda x: x.reshape(x.size(0), x.size(2), -1)).mistake
    'transpose'

The checkers run offline on the CPU in float32, take well under a second, and
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
| ``check_answer(answer, expected, name=...)`` | a number (or dict of numbers) against one the notebook computed |
"""

from ._core import CheckResult
from .answers import check_answer
from .attention import check_attention
from .heads import check_merge_heads, check_split_heads
from .masks import check_torch_attn_mask
from .multihead import check_multi_head_attention

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
}

__all__ = [
    "MISTAKES",
    "CheckResult",
    "check_answer",
    "check_attention",
    "check_merge_heads",
    "check_multi_head_attention",
    "check_split_heads",
    "check_torch_attn_mask",
]
