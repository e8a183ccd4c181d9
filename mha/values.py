"""Checks on values that several modules share: sizes, flags, a probability, a tensor, and broadcasting.

Every public entry point checks its own inputs at its top, in its own module; these are the few rules that more
than one of them needs. Sizes may be symbolic: under ``torch.compile``, ``torch.export`` and ``torch.jit.trace``
a tensor's sizes are ``torch.SymInt`` or 0-dim tensors, which count as ints here.
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Iterable

import torch


def is_int(n) -> bool:
    """Whether ``n`` is an integer size: an int, a ``torch.SymInt``, or (while tracing) a 0-dim integer tensor."""
    if isinstance(n, bool):
        return False
    if isinstance(n, (numbers.Integral, torch.SymInt)):
        return True
    return (
        torch.jit.is_tracing()
        and isinstance(n, torch.Tensor)
        and n.dim() == 0
        and not (n.is_floating_point() or n.is_complex() or n.dtype == torch.bool)
    )


def check_int(**sizes) -> None:
    """Raise TypeError unless every size is an integer (see :func:`is_int`; bools don't count)."""
    for name, n in sizes.items():
        if not is_int(n):
            raise TypeError(f"{name} must be an int, got {n!r}")


def check_positive(**sizes) -> None:
    """Raise unless every size is a positive integer."""
    check_int(**sizes)
    for name, n in sizes.items():
        if n <= 0:
            raise ValueError(f"{name} must be positive, got {n}")


def divisors(n: int, limit: int = 64) -> list[int]:
    """The divisors of n up to ``limit``: what to suggest when a size must divide n."""
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def flags(**values) -> None:
    """Raise TypeError unless every flag is a bool (a mask passed as is_causal, say)."""
    for name, value in values.items():
        if not isinstance(value, bool):
            kind = type(value)  # qualified outside builtins: NumPy 2 calls np.bool_ "bool"
            kind = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
            raise TypeError(f"{name} must be True or False (a Python bool), got {kind}")


def dropout(p) -> None:
    """Raise unless ``p`` is a real number in [0, 1)."""
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise TypeError(f"dropout must be a number in [0, 1), got {p!r}")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {p}")


def tensor(name: str, t, hint: str = "") -> None:
    """Raise TypeError unless ``t`` is a tensor; ``hint`` ends the message."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}{hint}")


def sequence(name: str, values, what: str) -> list:
    """``values`` as a list, when it is an iterable other than a string; else a TypeError naming it and ``what``."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be {what}, got {type(values).__name__} {values!r}")
    return list(values)


def fits(mask: torch.Tensor, target: tuple, names: str = "") -> None:
    """Raise ValueError unless ``mask`` broadcasts to ``target`` without growing it."""
    shape = broadcast(mask.shape, target)  # None if they do not broadcast (no try: it runs under compile too)
    if shape is None or tuple(shape) != tuple(target):
        where = f" {names}" if names else ""
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to{where} {tuple(target)}")


def broadcast_shapes(*shapes) -> torch.Size:
    """``torch.broadcast_shapes(*shapes)``, cheap when every size is a plain int, and checkable under compile.

    Raises:
        RuntimeError: the shapes do not broadcast (as ``torch.broadcast_shapes``).
    """
    result = broadcast(*shapes)
    if result is None:
        raise RuntimeError(f"shapes {[tuple(shape) for shape in shapes]} do not broadcast")
    return result


def broadcast(*shapes) -> tuple[int, ...] | None:
    """The shape that ``shapes`` broadcast to, or None when they do not.

    The rule in plain Python on the sizes (aligned from the right, sizes equal or 1): for plain ints it is
    cheap (``torch.broadcast_shapes`` reasons about symbolic sizes even in eager mode, about 20 us a call on a
    CPU: more than one decoding step of a small model), and under ``torch.compile`` dynamo guards on its
    comparisons as on any ``if`` on sizes, so shapes that do not broadcast reach the checks' own ValueError
    (``torch.broadcast_shapes`` fails there inside fake tensors, with dynamo's error). Sizes that are symbolic
    outside dynamo (``torch.export``'s, say) or traced go to ``torch.broadcast_shapes``, which decides them
    without guarding.
    """
    dynamo = torch.compiler.is_dynamo_compiling()
    if torch.jit.is_tracing() or not (dynamo or all(type(n) is int for shape in shapes for n in shape)):
        try:
            return torch.broadcast_shapes(*shapes)
        except RuntimeError:
            return None
    result = []
    for sizes in itertools.zip_longest(*(reversed(tuple(shape)) for shape in shapes), fillvalue=1):
        grown = [n for n in sizes if n != 1]  # the sizes other than 1 must agree: that is the size
        if any(n != grown[0] for n in grown[1:]):
            return None
        result.append(grown[0] if grown else 1)
    # A plain tuple under dynamo: torch 2.6's dynamo cannot build a torch.Size from a list.
    return tuple(reversed(result)) if dynamo else torch.Size(reversed(result))
