"""mha: multi-head attention, written to be read (Part 6 of the Transformer on-ramp).

Masks everywhere in this package are keep-masks: True or 1 means "this query
may attend to this key". See the README's "The mask convention".
"""

from . import exercises
from .attention import scaled_dot_product_attention
from .cache import KVCache
from .heads import merge_heads, split_heads
from .interop import from_torch, to_torch
from .masks import as_keep_mask, causal_mask, padding_mask, to_additive_mask, to_torch_attn_mask
from .multihead import MultiHeadAttention
from .parameters import ParameterCount, count_parameters

__version__ = "0.3.0"

__all__ = [
    "KVCache",
    "MultiHeadAttention",
    "ParameterCount",
    "as_keep_mask",
    "causal_mask",
    "count_parameters",
    "exercises",
    "from_torch",
    "merge_heads",
    "padding_mask",
    "scaled_dot_product_attention",
    "split_heads",
    "to_additive_mask",
    "to_torch",
    "to_torch_attn_mask",
]
