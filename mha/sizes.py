"""Where the size helpers went (kept so that imports written for mha 0.2 keep working).

The checks on sizes (:func:`is_int`, :func:`check_int`, :func:`broadcast_shapes`) live in
``mha.checks`` with every other input check; :func:`known_true`, the one decision on lengths
the maths takes, lives in ``mha.attention``, next to that maths.
"""

from .attention import known_true
from .checks import broadcast_shapes, check_int, is_int

__all__ = ["broadcast_shapes", "check_int", "is_int", "known_true"]
