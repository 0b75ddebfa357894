"""Layers as forward/backward pairs: the checked public entry points to :mod:`transformer_lab.core`.

``op_forward(...) -> (out, cache)`` and ``op_backward(dout, cache)``, the core's convention: a
backward function returns the gradients of the forward's array inputs, in order, then a dict
``grads`` keyed like the parameters (``linear_backward(dout, cache) -> (dx, {"W": dW, "b": db})``;
``embedding_backward(dout, cache) -> {"W": dW}``: token ids have no gradient). Weights use the
NumPy layout ``y = x @ W + b``, ``W`` of shape ``(in, out)`` (PyTorch stores the transpose).

This module adds the checking, nothing of the math: each function checks its arguments once,
converts what the core takes differently (softmax's ``axis``, an embedding's ``padding_idx``,
the dtype of the positional table) and calls the core function, looked up on
``transformer_lab.core.layers`` at call time so that an edited core takes effect at once. A
cache (:class:`~transformer_lab._validate.Cache`) lets the backward function refuse a foreign
cache and a ``dout`` of another shape or dtype (a float64 ``dout`` would silently turn every
gradient into float64). Arrays are float32 or float64 and keep their dtype. Attention lives in
:mod:`transformer_lab.attention`.
"""

from __future__ import annotations

import numpy as np

from transformer_lab import _validate as v
from transformer_lab.core import layers as core_layers

#: The activations by name, as the core knows them (``core.layers.ACTIVATIONS``).
ACTIVATIONS = tuple(core_layers.ACTIVATIONS)


# --------------------------------------------------------------------------------------------
# Linear


def linear_forward(x: np.ndarray, W: np.ndarray, b: np.ndarray | None = None):
    """Checked :func:`transformer_lab.core.layers.linear_forward` (shapes there)."""
    x = v.float_array(x, "x", min_ndim=1)
    W = v.float_array(W, "W", ndim=2)
    v.same_dtype("x", x, "W", W)
    if x.shape[-1] != W.shape[0]:
        raise ValueError(f"W must have shape (D_in, D_out) with D_in = x.shape[-1] = "
                         f"{x.shape[-1]}, got {W.shape}")
    if b is not None:
        b = v.float_array(b, "b", ndim=1)
        v.same_dtype("x", x, "b", b)
        v.shape_is(b, (W.shape[1],), "b", "D_out")
    out, cache = core_layers.linear_forward(x, W, b)
    return out, v.Cache(cache, out.shape, x.dtype, "linear_forward")


def linear_backward(dout: np.ndarray, cache: v.Cache):
    """Checked :func:`transformer_lab.core.layers.linear_backward` (shapes there)."""
    return core_layers.linear_backward(v.dout_of(dout, cache, "linear_backward"), cache.core)


# --------------------------------------------------------------------------------------------
# Activations


def relu_forward(x: np.ndarray):
    """Checked :func:`transformer_lab.core.layers.relu_forward`."""
    x = v.float_array(x, "x")
    out, cache = core_layers.relu_forward(x)
    return out, v.Cache(cache, x.shape, x.dtype, "relu_forward")


def relu_backward(dout: np.ndarray, cache: v.Cache):
    """Checked :func:`transformer_lab.core.layers.relu_backward`."""
    return core_layers.relu_backward(v.dout_of(dout, cache, "relu_backward"), cache.core)


def gelu_forward(x: np.ndarray, approximate: str = "none"):
    """Checked :func:`transformer_lab.core.layers.gelu_forward` (``approximate``: "none" or
    "tanh")."""
    x = v.float_array(x, "x")
    if approximate not in ("none", "tanh"):
        raise ValueError(f'approximate must be "none" or "tanh", got {approximate!r}')
    out, cache = core_layers.gelu_forward(x, approximate)
    return out, v.Cache(cache, x.shape, x.dtype, "gelu_forward")


def gelu_backward(dout: np.ndarray, cache: v.Cache):
    """Checked :func:`transformer_lab.core.layers.gelu_backward`."""
    return core_layers.gelu_backward(v.dout_of(dout, cache, "gelu_backward"), cache.core)


def check_activation(activation) -> str:
    """``activation`` if it is one of :data:`ACTIVATIONS`, else a ValueError."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    return activation


def activation_forward(x: np.ndarray, activation: str):
    """Checked :func:`transformer_lab.core.layers.activation_forward` (one of
    :data:`ACTIVATIONS`)."""
    x = v.float_array(x, "x")
    check_activation(activation)
    out, cache = core_layers.activation_forward(x, activation)
    return out, v.Cache(cache, x.shape, x.dtype, "activation_forward")


def activation_backward(dout: np.ndarray, cache: v.Cache):
    """Checked :func:`transformer_lab.core.layers.activation_backward`."""
    dout = v.dout_of(dout, cache, "activation_backward")
    return core_layers.activation_backward(dout, cache.core)


# --------------------------------------------------------------------------------------------
# Softmax, log-softmax, cross-entropy


def softmax_forward(x: np.ndarray, axis: int = -1):
    """Checked :func:`transformer_lab.core.layers.softmax_forward`, along any ``axis``.

    Every slice along ``axis`` needs a finite entry (-inf is allowed, NaN and +inf are not).
    The output is read-only: it is also the cache (copy it to modify it).
    """
    return _along_axis("softmax_forward", x, axis)


def softmax_backward(dout: np.ndarray, cache: v.Cache):
    """Checked :func:`transformer_lab.core.layers.softmax_backward`, along the forward's axis."""
    return _along_axis_backward("softmax_backward", dout, cache)


def log_softmax_forward(x: np.ndarray, axis: int = -1):
    """Checked :func:`transformer_lab.core.layers.log_softmax_forward`, along any ``axis``
    (input and read-only output as for :func:`softmax_forward`)."""
    return _along_axis("log_softmax_forward", x, axis)


def log_softmax_backward(dout: np.ndarray, cache: v.Cache):
    """Checked :func:`transformer_lab.core.layers.log_softmax_backward`."""
    return _along_axis_backward("log_softmax_backward", dout, cache)


def _along_axis(forward: str, x, axis) -> tuple:
    """The core's ``forward`` (softmax or log-softmax along the last axis) along ``axis``: the
    output made read-only (the backward pass reads it again) and its cache."""
    x = v.float_array(x, "x", min_ndim=1)
    axis = v.integer(axis, "axis")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis must be an integer in [-{x.ndim}, {x.ndim}), got {axis!r}")
    axis %= x.ndim
    _check_finite_slices(x, axis)
    out, cache = getattr(core_layers, forward)(_last(x, axis))
    out.flags.writeable = False
    return _unlast(out, axis), v.Cache(cache, x.shape, x.dtype, forward, axis)


def _along_axis_backward(backward: str, dout, cache: v.Cache) -> np.ndarray:
    dout = _last(v.dout_of(dout, cache, backward), cache.extra)
    return _unlast(getattr(core_layers, backward)(dout, cache.core), cache.extra)


def _last(x: np.ndarray, axis: int) -> np.ndarray:
    """``x`` with ``axis`` moved last (a view), the layout the core's softmax takes."""
    return x if axis == x.ndim - 1 else np.moveaxis(x, axis, -1)


def _unlast(y: np.ndarray, axis: int) -> np.ndarray:
    """The inverse of :func:`_last`."""
    return y if axis == y.ndim - 1 else np.moveaxis(y, -1, axis)


def _check_finite_slices(x: np.ndarray, axis: int) -> None:
    """A ValueError unless every slice of ``x`` along ``axis`` has a finite maximum.

    The maximum is NaN when the slice holds a NaN, +inf when it holds +inf, -inf when every
    entry is -inf: the softmax of such a slice is undefined (the core returns NaN for the first
    two and zeros -- "attend to nothing", attention's convention -- for the third).
    """
    m = x.max(axis=axis)
    if not np.isfinite(m).all():
        what = ("a NaN" if np.isnan(m).any() else "+inf" if np.isposinf(m).any()
                else "only -inf entries (nothing to normalise)")
        raise ValueError(f"x must have a finite entry in every slice along axis {axis} and no "
                         f"NaN or +inf: a slice holds {what}, and its softmax is undefined")


def cross_entropy_forward(logits: np.ndarray, targets, ignore_index: int = -100,
                          reduction: str = "mean"):
    """Checked :func:`transformer_lab.core.layers.cross_entropy_forward` (shapes there).

    Refuses ``reduction="mean"`` when every target is ignored (the mean of nothing).
    """
    logits = v.float_array(logits, "logits", min_ndim=1)
    ignore_index = v.integer(ignore_index, "ignore_index")
    if reduction not in ("mean", "sum"):
        raise ValueError(f'reduction must be "mean" or "sum", got {reduction!r}')
    targets = np.asarray(targets)
    if targets.dtype == bool or not np.issubdtype(targets.dtype, np.integer):
        raise TypeError(f"targets must be an integer array of class ids, got dtype {targets.dtype}")
    v.shape_is(targets, logits.shape[:-1], "targets", "logits.shape[:-1]")
    n_classes = logits.shape[-1]
    keep = targets != ignore_index
    bad = keep & ((targets < 0) | (targets >= n_classes))
    if bad.any():
        raise ValueError(f"targets must be class ids in [0, {n_classes}) or ignore_index="
                         f"{ignore_index}, found {targets[bad].flat[0]}")
    if reduction == "mean" and not keep.any():
        raise ValueError(f"every target equals ignore_index={ignore_index}: the mean loss over "
                         "no tokens is undefined")
    loss, cache = core_layers.cross_entropy_forward(logits, targets, ignore_index, reduction)
    return loss, v.Cache(cache, logits.shape, logits.dtype, "cross_entropy_forward")


def cross_entropy_backward(dloss: float, cache: v.Cache):
    """Checked :func:`transformer_lab.core.layers.cross_entropy_backward` (``dloss``: a finite
    number, 1.0 for the final loss)."""
    v.cache_of(cache, "cross_entropy_backward", "cross_entropy_forward")
    dloss = v.real(dloss, "dloss")
    return core_layers.cross_entropy_backward(dloss, cache.core)


# --------------------------------------------------------------------------------------------
# Layer normalisation


class LayerNormCache(v.Cache):
    """A :class:`~transformer_lab._validate.Cache` of ``"layer_norm_forward"``."""

    @property
    def xhat(self) -> np.ndarray:
        """The normalised input ``(x - mean) / sqrt(var + eps)``, (..., D)."""
        return self.core[0]

    @property
    def rstd(self) -> np.ndarray:
        """``1 / sqrt(var + eps)`` of every row, (..., 1)."""
        return self.core[1]


def check_norm_params(gamma, beta, d: int, dtype, where: str = "") -> None:
    """``gamma`` and ``beta``: None or (D,) arrays of ``dtype`` (``where`` prefixes the names,
    e.g. ``"params['norm1']"``)."""
    for name, p in (("gamma", gamma), ("beta", beta)):
        if p is not None:
            v.param(p, f"{where}[{name!r}]" if where else name, (d,), dtype, what="x.shape[-1]",
                    ndim=1)


def layer_norm_forward(x: np.ndarray, gamma: np.ndarray | None = None,
                       beta: np.ndarray | None = None, eps: float = 1e-5):
    """Checked :func:`transformer_lab.core.layers.layer_norm_forward` (shapes there).

    ``eps`` may be 0, which refuses rows of equal entries (variance 0: they would give 0/0).
    """
    x = v.float_array(x, "x", min_ndim=1)
    eps = v.real(eps, "eps", minimum=0)
    check_norm_params(gamma, beta, x.shape[-1], x.dtype)
    if eps >= 1e-30:  # positive in float32 and float64 alike: var + eps > 0
        out, cache = core_layers.layer_norm_forward(x, gamma, beta, eps)
    else:  # eps may be 0 in x's dtype: a row of equal entries would give 1/sqrt(0)
        with np.errstate(divide="ignore", invalid="ignore"):
            out, cache = core_layers.layer_norm_forward(x, gamma, beta, eps)
        if not np.isfinite(cache[1]).all():  # rstd
            raise ValueError(f"x has a row whose entries are all equal (variance 0) and eps={eps} "
                             "adds nothing to it: its normalisation would be 0/0 = NaN; use "
                             "eps > 0 (PyTorch's default is 1e-5)")
    return out, LayerNormCache(cache, x.shape, x.dtype, "layer_norm_forward")


def layer_norm_backward(dout: np.ndarray, cache: LayerNormCache):
    """Checked :func:`transformer_lab.core.layers.layer_norm_backward` (shapes there)."""
    dout = v.dout_of(dout, cache, "layer_norm_backward")
    return core_layers.layer_norm_backward(dout, cache.core)


# --------------------------------------------------------------------------------------------
# Embedding and positional encoding


def embedding_forward(ids, W: np.ndarray, padding_idx: int | None = None):
    """Checked :func:`transformer_lab.core.layers.embedding_forward` (shapes there), plus
    PyTorch's ``padding_idx``: a row whose gradient is always zero, or None."""
    W = v.float_array(W, "W", ndim=2)
    ids = v.token_ids(ids, "ids", W.shape[0])
    if padding_idx is not None:
        padding_idx = v.integer(padding_idx, "padding_idx")
        if not 0 <= padding_idx < W.shape[0]:
            raise ValueError(f"padding_idx must be in [0, {W.shape[0]}), got {padding_idx}")
    out, cache = core_layers.embedding_forward(ids, W)
    return out, v.Cache(cache, out.shape, W.dtype, "embedding_forward", padding_idx)


def embedding_backward(dout: np.ndarray, cache: v.Cache):
    """Checked :func:`transformer_lab.core.layers.embedding_backward`; row ``padding_idx`` of
    the gradient is zero."""
    grads = core_layers.embedding_backward(v.dout_of(dout, cache, "embedding_backward"),
                                           cache.core)
    if cache.extra is not None:  # padding_idx
        grads["W"][cache.extra] = 0
    return grads


def positional_encoding(max_len: int, d_model: int, base: float = 10000.0,
                        dtype=np.float64) -> np.ndarray:
    """Checked :func:`transformer_lab.core.layers.positional_encoding`, rounded to ``dtype``
    (np.float32 or np.float64)."""
    max_len = v.positive_int(max_len, "max_len")
    d_model = v.positive_int(d_model, "d_model")
    base = v.real(base, "base", positive=True)
    dtype = v.float_dtype(dtype, "dtype")
    return core_layers.positional_encoding(max_len, d_model, base).astype(dtype, copy=False)
