"""Lengths that may be symbolic: checks and decisions that work under compile, export and tracing.

In eager PyTorch a tensor's sizes are ints. To record a graph that works for
*every* sequence length, ``torch.compile(dynamic=True)`` and ``torch.export``
hand the code a ``torch.SymInt`` instead (a length known by name, such as
``s0``), and ``torch.jit.trace`` a 0-dim integer tensor. Plain Python length
logic breaks on them: ``isinstance(T, int)`` is False, ``T == S`` is not a
bool, and ``if T > 1`` either fails or bakes the example's length into the
graph.

So the library writes its length logic with two helpers:

* :func:`check_int` accepts ints and symbolic sizes alike, and still refuses
  floats, bools and anything else;
* :func:`known_true` answers True only when a condition holds for every length
  the graph may see. It picks *shortcuts* only (PyTorch's own causal kernel,
  skipping a mask that would allow everything); when it answers False, the
  general path runs, which is right for every length.
"""

from __future__ import annotations

import numbers

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true


def is_int(n) -> bool:
    """Whether ``n`` is an integer size: an int, a ``torch.SymInt``, or a traced size.

    Bools are not sizes. Under ``torch.jit.trace`` sizes are 0-dim integer
    tensors, so those count too, but only while tracing.
    """
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


def known_true(cond) -> bool:
    """True when ``cond`` holds for every length the code may be run with.

    A Python bool is returned as it is (eager code: the lengths are known).
    A symbolic condition (compile, export) is True only when the symbols'
    known ranges prove it, such as ``T == S`` for self-attention, where both
    are the same symbol; asking never ties the graph to one length. A traced
    condition (a tensor) is never known, so tracing records the general path.
    """
    if isinstance(cond, torch.Tensor):  # traced
        return False
    # A bool stays as it is. (Don't test isinstance(cond, torch.SymBool) first:
    # while torch.compile traces, a symbolic condition claims to be a bool.)
    return statically_known_true(cond)
