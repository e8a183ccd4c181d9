"""Every input check of mha's public functions, in one place (a package: one module per job).

The lesson modules (attention, multihead, heads, masks, cache) do the maths and raise
nothing. Each public function, and ``MultiHeadAttention.forward``, first calls a check from
here: it raises a ValueError or TypeError that names the offending shapes or values, and
hands back the inputs in the form the maths wants (a mask as a bool keep-mask, say).

Sizes may be symbolic: under ``torch.compile``, ``torch.export`` and ``torch.jit.trace`` a
tensor's sizes are ``torch.SymInt`` or 0-dim tensors, which the checks accept as ints.
"""

from .attention import attention_inputs, merge_heads, split_heads
from .cache import cache_beams, cache_max_len, cache_update, read_only
from .layer import (
    checkpoint_heads,
    chosen_heads,
    layer_inputs,
    layer_sizes,
    module,
    torch_compatible,
    torch_module,
)
from .masks import additive_mask, causal_lengths, fits, keep_mask, padding_lengths, torch_attn_mask
from .values import (
    broadcast_shapes,
    check_int,
    check_positive,
    divisors,
    dropout,
    flags,
    is_int,
    scale,
    sequence,
    tensor,
)

__all__ = [
    "additive_mask", "attention_inputs", "broadcast_shapes", "cache_beams", "cache_max_len", "cache_update",
    "causal_lengths", "check_int", "check_positive", "checkpoint_heads", "chosen_heads", "divisors", "dropout",
    "fits", "flags", "is_int", "keep_mask", "layer_inputs", "layer_sizes", "merge_heads", "module",
    "padding_lengths", "read_only", "scale", "sequence", "split_heads", "tensor", "torch_attn_mask",
    "torch_compatible", "torch_module",
]
