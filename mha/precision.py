"""Mixed precision: what ``torch.autocast`` does to attention's inputs, and where it must not act.

Under ``torch.autocast(device_type, dtype=torch.bfloat16)`` (or float16) a
model keeps float32 parameters, and autocast runs each matmul in the low
dtype, so the activations one layer hands the next are bfloat16. Softmax is
one of the ops autocast keeps in float32. This library does the same: under an
active autocast, q, k and v are cast to its dtype (as its matmuls would cast
them), scores and softmax run in float32, and a layer accepts low-precision
activations with float32 parameters. See the PyTorch doc "Automatic Mixed
Precision package - torch.amp". (The explicit path turns autocast off around its
float32 scores with ``mha.attention.autocast_off``.)
"""

from __future__ import annotations

import torch

HALF = (torch.float16, torch.bfloat16)


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype an active ``torch.autocast`` computes in on ``device_type``, or None when it is off."""
    try:
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
    except RuntimeError:  # a device type autocast does not know (meta, say)
        pass
    return None


def autocast_casts(device_type: str, *dtypes: torch.dtype) -> bool:
    """Whether an active autocast casts every one of ``dtypes`` to its own dtype (it never casts float64)."""
    return autocast_dtype(device_type) is not None and all(
        dtype.is_floating_point and dtype != torch.float64 for dtype in dtypes
    )


def autocast_inputs(*tensors):
    """Under an active autocast, floating tensors in its dtype, as its matmuls would cast them.

    Outside autocast, and for float64 or non-floating tensors (which autocast
    leaves alone), the tensors come back unchanged.
    """
    first = tensors[0]
    dtype = autocast_dtype(first.device.type) if isinstance(first, torch.Tensor) else None
    if dtype is None:
        return tensors
    return tuple(
        t.to(dtype) if isinstance(t, torch.Tensor) and autocast_casts(t.device.type, t.dtype) else t
        for t in tensors
    )
