"""The modern (LLaMA-style) block's pieces (15_modern_block §2, §3): RMSNorm, and the SwiGLU
feed-forward network with its SiLU.

Shapes: ``E`` width, ``F`` hidden width of the network; ``...`` any leading axes.
"""

from __future__ import annotations

import numpy as np

from transformer_lab.core.layers import linear_backward, linear_forward

# --------------------------------------------------------------------------------------------
# RMSNorm and SwiGLU (15_modern_block §2, §3)


def rms_norm_forward(x, gamma, eps=1e-5):
    """RMSNorm over the last axis: ``out = x / sqrt(mean(x^2) + eps) * gamma`` -- a layer norm
    without the mean and without a bias.  x: (..., D); gamma: (D,)  ->  out: (..., D).
    """
    ### BEGIN SOLUTION 15 §2
    d = x.shape[-1]
    rstd = 1 / np.sqrt(np.einsum("...j,...j->...", x, x)[..., None] / d + eps)  # (..., 1)
    xhat = x * rstd
    out = xhat * gamma
    ### END SOLUTION
    return out, (xhat, rstd, gamma)


def rms_norm_backward(dout, cache):
    """Gradients of :func:`rms_norm_forward`. With ``g = dout * gamma``:
    ``dx = rstd * (g - xhat * mean(g * xhat))``, ``dgamma = sum(dout * xhat)``.

    dout: (..., D)  ->  dx: (..., D), grads: {"gamma": (D,)}.
    """
    xhat, rstd, gamma = cache
    ### BEGIN SOLUTION 15 §2
    d = xhat.shape[-1]
    dgamma = (dout * xhat).reshape(-1, d).sum(axis=0)
    g = dout * gamma
    mean_gx = np.einsum("...j,...j->...", g, xhat)[..., None] / d  # (..., 1)
    dx = g - xhat * mean_gx
    dx *= rstd
    ### END SOLUTION
    return dx, {"gamma": dgamma}


def silu_forward(x):
    """SiLU (swish), ``x * sigmoid(x)``; the sigmoid as ``(1 + tanh(x/2)) / 2``, which cannot
    overflow.  x: any shape  ->  out: the same shape."""
    ### BEGIN SOLUTION 15 §3
    s = 0.5 * (1 + np.tanh(0.5 * x))  # sigmoid(x)
    ### END SOLUTION
    return x * s, (x, s)


def silu_backward(dout, cache):
    """Gradient of :func:`silu_forward`: ``sigmoid(x) * (1 + x * (1 - sigmoid(x)))``."""
    x, s = cache
    ### BEGIN SOLUTION 15 §3
    return dout * s * (1 + x * (1 - s))
    ### END SOLUTION


def swiglu_forward(x, params):
    """The SwiGLU feed-forward network: ``(silu(x W_gate) * (x W_up)) W_down``.

    x: (..., E); params: W_gate (E, F), W_up (E, F), W_down (F, E)  ->  out: (..., E).
    """
    ### BEGIN SOLUTION 15 §3
    a, c_gate = linear_forward(x, params["W_gate"])  # (..., F)
    u, c_up = linear_forward(x, params["W_up"])  # (..., F)
    s, c_silu = silu_forward(a)
    out, c_down = linear_forward(s * u, params["W_down"])  # (..., E)
    ### END SOLUTION
    return out, (c_gate, c_up, c_silu, s, u, c_down)


def swiglu_backward(dout, cache):
    """Gradients of :func:`swiglu_forward`: ``x`` feeds the gate and the up projection, so its
    gradient is the sum of the two paths.  ->  dx (..., E), grads (the keys of params)."""
    c_gate, c_up, c_silu, s, u, c_down = cache
    ### BEGIN SOLUTION 15 §3
    dh, g_down = linear_backward(dout, c_down)  # (..., F)
    da = silu_backward(dh * u, c_silu)
    dx, g_gate = linear_backward(da, c_gate)
    dx_up, g_up = linear_backward(dh * s, c_up)
    dx += dx_up
    ### END SOLUTION
    return dx, {"W_gate": g_gate["W"], "W_up": g_up["W"], "W_down": g_down["W"]}
