"""Rotary position embeddings, RoPE (15_modern_block §1): each pair of features of a query or a
key is rotated by an angle that grows with its position, so that ``q_i . k_j`` depends on
``i - j``.
The rotation is RoFormer's and LLaMA's: counterclockwise, by ``+p * omega_i``.

Shapes: ``T`` positions, ``Dh`` the width of a head (even).
"""

from __future__ import annotations

import numpy as np

# --------------------------------------------------------------------------------------------
# Rotary position embeddings, RoPE (15_modern_block §1)


def rope_tables(positions, head_dim, base=10000.0):
    """The rotation angles ``p * omega_i`` of RoPE, ``omega_i = base^(-2i / Dh)`` (notebook 08's
    frequencies), as their cosines and sines, float64.

    positions: integers (T,); head_dim: Dh, even  ->  cos, sin: (T, Dh/2).
    """
    ### BEGIN SOLUTION 15 §1
    omega = base ** (-np.arange(0, head_dim, 2) / head_dim)  # (Dh/2,)
    angles = np.asarray(positions, dtype=np.float64)[:, None] * omega  # (T, Dh/2)
    return np.cos(angles), np.sin(angles)
    ### END SOLUTION


def rope_forward(x, cos, sin):
    """Rotate each pair of features ``(x_2i, x_2i+1)`` of position ``p`` by the angle
    ``a = p * omega_i``, counterclockwise as RoFormer and LLaMA do: the pair becomes
    ``(x_2i cos a - x_2i+1 sin a, x_2i sin a + x_2i+1 cos a)``, ``R(a) = [[cos a, -sin a],
    [sin a, cos a]]`` times the pair.

    x: (..., T, Dh); cos, sin: (T, Dh/2) from :func:`rope_tables`  ->  out: (..., T, Dh).
    """
    ### BEGIN SOLUTION 15 §1
    x0, x1 = x[..., 0::2], x[..., 1::2]  # (..., T, Dh/2) each
    out = np.empty_like(x)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    ### END SOLUTION
    return out, (cos, sin)


def rope_backward(dout, cache):
    """Gradient of :func:`rope_forward`: a rotation's transpose is its inverse, the rotation by
    minus the angle.  dout: (..., T, Dh)  ->  dx: (..., T, Dh).
    """
    cos, sin = cache
    ### BEGIN SOLUTION 15 §1
    d0, d1 = dout[..., 0::2], dout[..., 1::2]
    dx = np.empty_like(dout)
    dx[..., 0::2] = d0 * cos + d1 * sin
    dx[..., 1::2] = d1 * cos - d0 * sin
    return dx
    ### END SOLUTION
