"""mha: multi-head attention, written to be read (Part 6 of the Transformer on-ramp).

Masks everywhere in this package are keep-masks: True or 1 means "this query
may attend to this key". See the README's "The mask convention".

The lesson, the text that the article and the notebooks' printed outputs follow, read top to bottom:

- ``mha/attention.py``: scaled dot-product attention, the operation every head runs (Part 5);
- ``mha/multihead.py``: the multi-head attention layer;
- ``mha/heads.py``: splitting the embedding into heads and merging them back;
- ``mha/masks.py``: keep-masks, and their conversion to PyTorch's conventions;
- ``mha/cache.py``: the key/value cache for decoding one token at a time.

Each public function of the lesson checks its own inputs at its top, in its own file, and the maths it then
calls checks nothing again. Beside the lesson, and imported by it: ``mha/values.py`` (the checks several modules
share), ``mha/precision.py`` (what autocast does), ``mha/parameters.py`` (counting, saving and copying a layer's
parameters) and ``mha/interop.py`` (weights to and from ``nn.MultiheadAttention``).

The tools, which import the lesson and are never imported by it, free to change without touching it:
``mha.plot`` (heatmaps, the head view), ``mha.exercises`` (the notebooks' checkers), ``mha.parallel`` (heads
across processes) and ``python -m mha`` (``mha/__main__.py`` and ``mha/walkthrough.py``). They load on first use.
"""

from .attention import scaled_dot_product_attention
from .cache import KVCache
from .heads import merge_heads, split_heads
from .interop import from_torch, to_torch
from .masks import as_keep_mask, causal_mask, padding_mask, to_additive_mask, to_torch_attn_mask
from .multihead import MultiHeadAttention
from .parameters import ParameterCount, count_parameters

__version__ = "0.4.0"

# The tools around the lesson, loaded on first use (PEP 562), so that `import mha` stays quick and needs neither
# matplotlib nor torch.distributed, while `import mha; mha.plot.head_view(...)` works as the README writes it.
_TOOLS = ("exercises", "parallel", "plot")


def __getattr__(name):
    if name in _TOOLS:
        import importlib

        return importlib.import_module(f".{name}", __name__)  # the import also sets it as an attribute
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_TOOLS))


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
