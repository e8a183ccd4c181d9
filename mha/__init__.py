"""mha: multi-head attention, written to be read (Part 6 of the Transformer on-ramp).

Masks everywhere in this package are keep-masks: True or 1 means "this query may attend to this key". See the
README's "The mask convention".

The lesson, the article's class grown by what Part 6 teaches, read top to bottom:

- ``mha/multihead.py``: the multi-head attention layer;
- ``mha/attention.py``: scaled dot-product attention, the operation every head runs (Part 5);
- ``mha/masks.py``: keep-masks, checked, and the causal and padding masks.

Beside it, importing it: ``mha/efficient.py`` (notebook 07's grouped-query attention and KV cache),
``mha/heads.py`` (the reshapes as functions), ``mha/parameters.py`` (counting parameters) and ``mha/interop.py``
(weights to and from ``nn.MultiheadAttention``, and masks in PyTorch's conventions).

The tools, which import the lesson and are never imported by it: ``mha.plot`` (heatmaps, the head view),
``mha.exercises`` (the notebooks' checkers), ``mha.parallel`` (heads across processes), ``mha.english``
(notebook 06's model) and ``python -m mha`` (``mha/__main__.py`` and ``mha/walkthrough.py``). They load on first
use.
"""

from .attention import scaled_dot_product_attention
from .efficient import GroupedQueryAttention, KVCache
from .heads import merge_heads, project, split_heads
from .interop import from_torch, to_additive_mask, to_torch, to_torch_attn_mask
from .masks import as_keep_mask, causal_mask, padding_mask
from .multihead import MultiHeadAttention
from .parameters import ParameterCount, count_parameters

__version__ = "0.5.0"

# The tools around the lesson, loaded on first use (PEP 562), so that `import mha` stays quick and needs neither
# matplotlib nor torch.distributed, while `import mha; mha.plot.head_view(...)` works as the README writes it.
_TOOLS = ("english", "exercises", "parallel", "plot")


def __getattr__(name):
    if name in _TOOLS:
        import importlib

        return importlib.import_module(f".{name}", __name__)  # the import also sets it as an attribute
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_TOOLS))


__all__ = [
    "GroupedQueryAttention",
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
    "project",
    "scaled_dot_product_attention",
    "split_heads",
    "to_additive_mask",
    "to_torch",
    "to_torch_attn_mask",
]
