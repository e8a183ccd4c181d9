"""mha: multi-head attention, written to be read (Part 6 of the Transformer on-ramp).

Masks everywhere in this package are keep-masks: True or 1 means "this query
may attend to this key". See the README's "The mask convention".
"""

import importlib

from . import exercises
from .attention import scaled_dot_product_attention
from .cache import KVCache
from .heads import merge_heads, split_heads
from .interop import from_torch, to_torch
from .masks import as_keep_mask, causal_mask, padding_mask, to_additive_mask, to_torch_attn_mask
from .multihead import MultiHeadAttention
from .parameters import ParameterCount, count_parameters

__version__ = "0.3.0"

# The tools around the lesson, loaded on first use (PEP 562), so that `import mha` stays quick and needs neither
# matplotlib nor torch.distributed, while `import mha; mha.plot.head_view(...)` works as the README writes it.
_LAZY_SUBMODULES = ("parallel", "plot", "viz")


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f".{name}", __name__)  # the import also sets it as an attribute
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))

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
