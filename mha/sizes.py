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

And :func:`broadcast_shapes` checks how shapes broadcast at a small fraction of
``torch.broadcast_shapes``' cost when every size is a plain int.
"""

from __future__ import annotations

import itertools
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
    """True when ``cond`` is known to hold, without tying a recorded graph to one length.

    * Eager: ``cond`` is a bool and is returned as it is.
    * ``torch.export`` (non-strict) and other tracing with a ``torch.SymBool``:
      True only when the symbols' ranges prove it, as for ``T == S`` in
      self-attention, where both are the same symbol. No guard is added.
    * ``torch.compile`` and strict ``torch.export`` (dynamo, where a symbolic
      condition poses as a bool, and which in torch 2.6 cannot trace
      ``statically_known_true``): decided as dynamo decides any ``if`` on
      lengths. The conditions this library asks are settled by the symbols'
      ranges for self-attention and for decoding with a cache, so one graph
      serves every length (the tests count the graphs).
    * ``torch.jit.trace`` (a 0-dim tensor): never known, so the trace
      records the general path.
    """
    if isinstance(cond, torch.Tensor):  # traced
        return False
    if isinstance(cond, torch.SymBool):
        return statically_known_true(cond)
    return True if cond else False  # a bool, or dynamo's symbolic condition (an `if` it can guard)


def broadcast_shapes(*shapes) -> torch.Size:
    """``torch.broadcast_shapes(*shapes)``, cheap when every size is a plain int.

    ``torch.broadcast_shapes`` reasons about symbolic sizes even in eager mode,
    which costs about 20 us a call on a CPU: more than the attention of one
    decoding step in a small model. Plain int sizes need only the rule itself
    (aligned from the right, sizes must be equal or 1). Symbolic and traced
    sizes still go to ``torch.broadcast_shapes``.

    Raises:
        RuntimeError: the shapes do not broadcast (as ``torch.broadcast_shapes``).
    """
    symbolic = torch.compiler.is_compiling() or torch.jit.is_tracing()  # (dynamo shows SymInts as ints)
    if symbolic or not all(type(n) is int for shape in shapes for n in shape):
        return torch.broadcast_shapes(*shapes)
    result = []
    for sizes in itertools.zip_longest(*(reversed(shape) for shape in shapes), fillvalue=1):
        not_one = set(sizes) - {1}
        if len(not_one) > 1:
            raise RuntimeError(f"shapes {[tuple(shape) for shape in shapes]} do not broadcast")
        result.append(not_one.pop() if not_one else 1)
    return torch.Size(reversed(result))
