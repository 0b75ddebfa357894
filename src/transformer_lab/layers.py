"""Layers as forward/backward pairs, in NumPy.

Every operation comes as ``op_forward(...) -> (out, cache)`` and ``op_backward(dout, cache)``:
the forward function returns what the backward function needs in ``cache``; the backward function
receives the upstream gradient ``dout`` (same shape as ``out``) and returns the gradients of the
inputs, in the order of the forward's arguments. Weights use the NumPy layout ``y = x @ W + b``
with ``W`` of shape ``(in, out)`` (PyTorch stores the transpose).

Arrays are float32 or float64 and keep their dtype; gradient checks run in float64. A backward
function refuses a ``dout`` that is not an array of the forward output's shape and dtype (a
float64 ``dout`` would silently turn every gradient into float64). Where a forward function
returns an array that its backward function reads again (softmax, log-softmax), that array is
read-only: editing it in place raises instead of silently changing the gradients.
Attention lives in :mod:`transformer_lab.attention`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from scipy.special import erf

from transformer_lab import _validate as v

# --------------------------------------------------------------------------------------------
# Linear


class LinearCache(NamedTuple):
    x: np.ndarray
    W: np.ndarray
    has_bias: bool


def linear_forward(x: np.ndarray, W: np.ndarray, b: np.ndarray | None = None):
    """Affine map ``out = x @ W + b`` over the last axis.

    Args:
        x: input, shape (..., D_in).
        W: weights, shape (D_in, D_out).
        b: bias, shape (D_out,), or None for no bias.

    Returns:
        out: shape (..., D_out).
        cache: for :func:`linear_backward`.
    """
    x = v.float_array(x, "x", min_ndim=1)
    W = v.float_array(W, "W", ndim=2)
    v.same_dtype("x", x, "W", W)
    if x.shape[-1] != W.shape[0]:
        raise ValueError(f"W must have shape (D_in, D_out) with D_in = x.shape[-1] = "
                         f"{x.shape[-1]}, got {W.shape}")
    out = (x.reshape(-1, W.shape[0]) @ W).reshape(*x.shape[:-1], W.shape[1])
    if b is not None:
        b = v.float_array(b, "b", ndim=1)
        v.same_dtype("x", x, "b", b)
        v.shape_is(b, (W.shape[1],), "b", "D_out")
        out += b
    return out, LinearCache(x, W, b is not None)


def linear_backward(dout: np.ndarray, cache: LinearCache):
    """Gradients of :func:`linear_forward`.

    Args:
        dout: upstream gradient, shape (..., D_out).
        cache: from :func:`linear_forward`.

    Returns:
        dx: shape (..., D_in); dW: shape (D_in, D_out); db: shape (D_out,), or None without bias.
    """
    v.cache_of(cache, "linear_backward", LinearCache)
    x, W, has_bias = cache
    d_in, d_out = W.shape
    v.grad_like(dout, "dout", (*x.shape[:-1], d_out), x.dtype)
    dout2 = dout.reshape(-1, d_out)
    dx = (dout2 @ W.T).reshape(x.shape)
    dW = x.reshape(-1, d_in).T @ dout2
    db = dout2.sum(axis=0) if has_bias else None
    return dx, dW, db


# --------------------------------------------------------------------------------------------
# Activations


class ReluCache(NamedTuple):
    positive: np.ndarray  # bool, shape S: x > 0
    dtype: np.dtype  # of x and of the output


def relu_forward(x: np.ndarray):
    """``out = max(x, 0)``. x: any shape S -> out: shape S; cache."""
    x = v.float_array(x, "x")
    out = np.maximum(x, 0)
    return out, ReluCache(x > 0, x.dtype)


def relu_backward(dout: np.ndarray, cache: ReluCache):
    """Gradient of :func:`relu_forward`: ``dx = dout * [x > 0]`` (0 at x = 0, as PyTorch)."""
    v.cache_of(cache, "relu_backward", ReluCache)
    v.grad_like(dout, "dout", cache.positive.shape, cache.dtype)
    return dout * cache.positive


_SQRT_2 = math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_GELU_C = 0.044715


class GeluCache(NamedTuple):
    x: np.ndarray
    approximate: str
    aux: np.ndarray  # Phi(x) for "none", tanh(u) for "tanh"


def gelu_forward(x: np.ndarray, approximate: str = "none"):
    """GELU, exact or tanh-approximated, as ``torch.nn.functional.gelu``.

    ``approximate="none"``: ``x * Phi(x)`` with ``Phi(x) = (1 + erf(x / sqrt 2)) / 2``.
    ``approximate="tanh"``: ``x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))``.

    Args:
        x: any shape S.
        approximate: "none" or "tanh".

    Returns:
        out: shape S; cache.
    """
    x = v.float_array(x, "x")
    if approximate == "none":
        phi = 0.5 * (1.0 + erf(x / x.dtype.type(_SQRT_2)))
        return x * phi, GeluCache(x, approximate, phi)
    if approximate == "tanh":
        t = np.tanh(x.dtype.type(_SQRT_2_OVER_PI) * (x + x.dtype.type(_GELU_C) * x ** 3))
        return 0.5 * x * (1.0 + t), GeluCache(x, approximate, t)
    raise ValueError(f'approximate must be "none" or "tanh", got {approximate!r}')


def gelu_backward(dout: np.ndarray, cache: GeluCache):
    """Gradient of :func:`gelu_forward`.

    exact: ``d/dx [x Phi(x)] = Phi(x) + x phi(x)``, phi the standard normal density;
    tanh: ``(1 + t)/2 + x/2 (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)``.
    """
    v.cache_of(cache, "gelu_backward", GeluCache)
    x, approximate, aux = cache
    v.grad_like(dout, "dout", x.shape, x.dtype)
    c = x.dtype.type
    if approximate == "none":
        local = aux + x * c(_INV_SQRT_2PI) * np.exp(-0.5 * x * x)
    else:
        local = 0.5 * (1.0 + aux) + 0.5 * x * (1.0 - aux * aux) * c(_SQRT_2_OVER_PI) * (
            1.0 + c(3 * _GELU_C) * x * x)
    return dout * local


_ACTIVATIONS = ("relu", "gelu", "gelu_tanh")


def activation_forward(x: np.ndarray, activation: str):
    """Dispatch to relu / gelu (exact) / gelu_tanh by name; cache for activation_backward."""
    if activation == "relu":
        out, cache = relu_forward(x)
    elif activation == "gelu":
        out, cache = gelu_forward(x, "none")
    elif activation == "gelu_tanh":
        out, cache = gelu_forward(x, "tanh")
    else:
        raise ValueError(f'activation must be "relu", "gelu" or "gelu_tanh", got {activation!r}')
    return out, (activation, cache)


def activation_backward(dout: np.ndarray, cache):
    """Gradient of :func:`activation_forward` (dout: the output's shape S -> dx: shape S)."""
    v.cache_of(cache, "activation_backward", tuple)
    if len(cache) != 2 or cache[0] not in _ACTIVATIONS:
        raise TypeError("activation_backward: cache must be the (activation, cache) pair "
                        "returned by activation_forward")
    activation, inner = cache
    return relu_backward(dout, inner) if activation == "relu" else gelu_backward(dout, inner)


# --------------------------------------------------------------------------------------------
# Softmax, log-softmax, cross-entropy


class SoftmaxCache(NamedTuple):
    y: np.ndarray
    axis: int


def softmax_forward(x: np.ndarray, axis: int = -1):
    """Numerically stable softmax along ``axis``.

    ``y = exp(x - max(x)) / sum(exp(x - max(x)))``: subtracting the row maximum changes nothing
    mathematically and keeps ``exp`` from overflowing.

    Args:
        x: any shape S (entries may be -inf, as long as every row has a finite entry; NaN and
            +inf are refused).
        axis: the axis that sums to one.

    Returns:
        y: shape S, read-only (it is also the cache: copy it to modify it); cache.
    """
    x = v.float_array(x, "x", min_ndim=1)
    axis = _axis(axis, x.ndim)
    e = np.exp(x - _finite_row_max(x, axis))
    e /= e.sum(axis=axis, keepdims=True)
    e.flags.writeable = False
    return e, SoftmaxCache(e, axis)


def softmax_backward(dout: np.ndarray, cache: SoftmaxCache):
    """Gradient of :func:`softmax_forward` in O(size), without the Jacobian.

    The Jacobian of one row is ``diag(y) - y y^T``, so ``dx = y * (dout - sum(dout * y))``
    with the sum along ``axis``.
    """
    v.cache_of(cache, "softmax_backward", SoftmaxCache)
    y, axis = cache
    v.grad_like(dout, "dout", y.shape, y.dtype)
    return y * (dout - (dout * y).sum(axis=axis, keepdims=True))


class LogSoftmaxCache(NamedTuple):
    out: np.ndarray
    axis: int


def log_softmax_forward(x: np.ndarray, axis: int = -1):
    """``log(softmax(x))`` computed stably as ``z - log(sum(exp(z)))``, ``z = x - max(x)``.

    Args:
        x: any shape S (as for :func:`softmax_forward`: every row needs a finite entry).
        axis: the axis of the distribution.

    Returns:
        out: shape S, read-only (it is also the cache); cache.
    """
    x = v.float_array(x, "x", min_ndim=1)
    axis = _axis(axis, x.ndim)
    z = x - _finite_row_max(x, axis)
    out = z - np.log(np.exp(z).sum(axis=axis, keepdims=True))
    out.flags.writeable = False
    return out, LogSoftmaxCache(out, axis)


def log_softmax_backward(dout: np.ndarray, cache: LogSoftmaxCache):
    """Gradient of :func:`log_softmax_forward`: ``dx = dout - softmax(x) * sum(dout)``."""
    v.cache_of(cache, "log_softmax_backward", LogSoftmaxCache)
    out, axis = cache
    v.grad_like(dout, "dout", out.shape, out.dtype)
    return dout - np.exp(out) * dout.sum(axis=axis, keepdims=True)


class CrossEntropyCache(NamedTuple):
    probs: np.ndarray  # (N, C) softmax of the logits
    targets: np.ndarray  # (N,) with ignored entries replaced by 0
    weight: np.ndarray  # (N,) 1/count (mean), 1 (sum) or 0 (ignored)
    shape: tuple


def cross_entropy_forward(logits: np.ndarray, targets, ignore_index: int = -100,
                          reduction: str = "mean"):
    """Softmax cross-entropy over the last axis, as ``torch.nn.functional.cross_entropy``.

    ``loss_i = -log softmax(logits_i)[targets_i]``, reduced over the entries whose target is not
    ``ignore_index`` (e.g. padding): their mean (``"mean"``) or sum (``"sum"``).

    Args:
        logits: shape (..., C) -- e.g. (batch, time, vocabulary).
        targets: integer class ids, shape (...), each in [0, C) or equal to ``ignore_index``.
        ignore_index: target value that contributes nothing to the loss or the gradient.
        reduction: "mean" or "sum".

    Returns:
        loss: a Python float; cache.

    Raises:
        ValueError: with ``reduction="mean"`` when every target is ignored (the mean of nothing).
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
    count = int(keep.sum())
    if reduction == "mean" and count == 0:
        raise ValueError(f"every target equals ignore_index={ignore_index}: the mean loss over "
                         "no tokens is undefined")

    flat = logits.reshape(-1, n_classes)
    t = np.where(keep, targets, 0).reshape(-1)
    z = flat - flat.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=1))
    nll = lse - z[np.arange(len(t)), t]
    w = keep.reshape(-1).astype(logits.dtype)
    if reduction == "mean":
        w /= count
    loss = float(np.dot(nll, w))
    probs = np.exp(z - lse[:, None])
    return loss, CrossEntropyCache(probs, t, w, logits.shape)


def cross_entropy_backward(dloss: float, cache: CrossEntropyCache):
    """Gradient of :func:`cross_entropy_forward`: ``(softmax(logits) - onehot(target)) * w``.

    Args:
        dloss: upstream gradient of the scalar loss, a finite number (1.0 when it is the final
            loss).
        cache: from :func:`cross_entropy_forward`.

    Returns:
        dlogits: shape (..., C), the dtype of the logits; rows of ignored targets are zero.
    """
    v.cache_of(cache, "cross_entropy_backward", CrossEntropyCache)
    dloss = v.real(dloss, "dloss")
    probs, t, w, shape = cache
    dlogits = probs.copy()
    dlogits[np.arange(len(t)), t] -= 1.0
    dlogits *= (w * dloss)[:, None]
    return dlogits.reshape(shape)


# --------------------------------------------------------------------------------------------
# Layer normalisation


class LayerNormCache(NamedTuple):
    xhat: np.ndarray
    rstd: np.ndarray
    gamma: np.ndarray | None
    has_beta: bool


def layer_norm_forward(x: np.ndarray, gamma: np.ndarray | None = None,
                       beta: np.ndarray | None = None, eps: float = 1e-5):
    """Layer normalisation over the last axis, as ``torch.nn.LayerNorm(D)``.

    ``xhat = (x - mean) / sqrt(var + eps)`` (biased variance), ``out = xhat * gamma + beta``.

    Args:
        x: shape (..., D).
        gamma: scale, shape (D,), or None (no elementwise affine).
        beta: shift, shape (D,), or None (no bias).
        eps: added to the variance, a finite number >= 0 (0 refuses rows of equal entries,
            whose variance is 0: they would give 0/0).

    Returns:
        out: shape (..., D), a new array (never the cache's); cache.
    """
    x = v.float_array(x, "x", min_ndim=1)
    eps = v.real(eps, "eps", minimum=0)
    d = x.shape[-1]
    for name, p in (("gamma", gamma), ("beta", beta)):
        if p is not None:
            v.float_array(p, name, ndim=1)
            v.same_dtype("x", x, name, p)
            v.shape_is(p, (d,), name, "x.shape[-1]")
    # Row sums as einsum: NumPy's sum/mean over a short last axis are several times slower.
    # The variance is each centred row's dot product with itself (no squared temporary), and
    # xhat is computed in place in xc.
    mu = np.einsum("...i->...", x)[..., None] / d
    xc = x - mu
    var = np.einsum("...i,...i->...", xc, xc)[..., None] / d
    var += eps
    # A row of equal entries has variance 0: with an eps that is 0 in x's dtype, 1/sqrt(0) = inf
    # and xhat = 0 * inf = NaN. An eps >= 1e-30 is positive in float32 and float64 alike, so
    # only a smaller one needs the reduction over the rows.
    if eps < 1e-30 and not var.all():
        raise ValueError(f"x has a row whose entries are all equal (variance 0) and eps={eps} "
                         "adds nothing to it: its normalisation would be 0/0 = NaN; use eps > 0 "
                         "(PyTorch's default is 1e-5)")
    rstd = 1.0 / np.sqrt(var)
    xhat = xc
    xhat *= rstd
    if gamma is not None:
        out = xhat * gamma
        if beta is not None:
            out += beta
    else:  # a copy: the caller may edit out in place, the backward reads xhat
        out = xhat.copy() if beta is None else xhat + beta
    return out, LayerNormCache(xhat, rstd, gamma, beta is not None)


def layer_norm_backward(dout: np.ndarray, cache: LayerNormCache):
    """Gradients of :func:`layer_norm_forward`.

    With ``g = dout * gamma``: ``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))``,
    ``dgamma = sum(dout * xhat)``, ``dbeta = sum(dout)`` over all leading axes.

    Returns:
        dx: shape (..., D); dgamma: shape (D,) or None; dbeta: shape (D,) or None.
    """
    v.cache_of(cache, "layer_norm_backward", LayerNormCache)
    xhat, rstd, gamma, has_beta = cache
    v.grad_like(dout, "dout", xhat.shape, xhat.dtype)
    d = xhat.shape[-1]
    dout2 = dout.reshape(-1, d)
    dgamma = np.einsum("nd,nd->d", dout2, xhat.reshape(-1, d)) if gamma is not None else None
    dbeta = dout2.sum(axis=0) if has_beta else None
    g = dout * gamma if gamma is not None else dout.copy()
    mean_g = np.einsum("...i->...", g)[..., None] / d
    mean_gx = np.einsum("...i,...i->...", g, xhat)[..., None] / d
    # dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), in place in g
    g -= mean_g
    g -= xhat * mean_gx
    g *= rstd
    return g, dgamma, dbeta


# --------------------------------------------------------------------------------------------
# Embedding and positional encoding


class EmbeddingCache(NamedTuple):
    ids: np.ndarray
    vocab_size: int
    padding_idx: int | None
    dim: int  # D, the width of the table
    dtype: np.dtype  # of the table and of the output


def embedding_forward(ids, W: np.ndarray, padding_idx: int | None = None):
    """Look up rows of ``W``: ``out[...] = W[ids[...]]``, as ``torch.nn.Embedding``.

    Args:
        ids: integer token ids, any shape S, each in [0, V).
        W: embedding table, shape (V, D).
        padding_idx: a row whose gradient is always zero (PyTorch's ``padding_idx``), or None.

    Returns:
        out: shape (*S, D); cache.
    """
    W = v.float_array(W, "W", ndim=2)
    ids = v.token_ids(ids, "ids", W.shape[0])
    if padding_idx is not None:
        padding_idx = v.integer(padding_idx, "padding_idx")
        if not 0 <= padding_idx < W.shape[0]:
            raise ValueError(f"padding_idx must be in [0, {W.shape[0]}), got {padding_idx}")
    return W[ids], EmbeddingCache(ids, W.shape[0], padding_idx, W.shape[1], W.dtype)


def embedding_backward(dout: np.ndarray, cache: EmbeddingCache):
    """Gradient of the table: each row collects the upstream gradients of its occurrences.

    The rows of ``dout`` are sorted by token id (a stable sort, so each token's rows keep their
    order) and every run of equal ids is summed by one ``np.add.reduceat``. This is faster than
    the textbook ``np.add.at(dW, ids, dout)``, which adds one row at a time, at every size we
    measured (median, one thread, float32; B=64, T=12, D=64: 45 us against 325 us for V=14,
    165 us against 325 us for V=1000; B=64, T=100, D=128, V=30000: 4.8 ms against 5.9 ms).
    A one-hot matrix product is faster still for a tiny vocabulary (23 us at V=14) but slower
    from a few hundred tokens on (850 us at V=1000), so the sort is kept. The sums equal
    ``np.add.at``'s up to float rounding (the additions are grouped differently).

    Args:
        dout: upstream gradient, shape ids.shape + (D,).
        cache: from :func:`embedding_forward`.

    Returns:
        dW: shape (V, D); row ``padding_idx`` is zero.
    """
    v.cache_of(cache, "embedding_backward", EmbeddingCache)
    ids, vocab_size, padding_idx, d, dtype = cache
    v.grad_like(dout, "dout", (*ids.shape, d), dtype)  # ids.shape + (D,)
    dW = np.zeros((vocab_size, d), dtype=dtype)
    flat_ids = ids.reshape(-1)
    if flat_ids.size:
        order = np.argsort(flat_ids, kind="stable")
        present, starts = np.unique(flat_ids[order], return_index=True)
        dW[present] = np.add.reduceat(dout.reshape(-1, d)[order], starts, axis=0)
    if padding_idx is not None:
        dW[padding_idx] = 0
    return dW


def positional_encoding(max_len: int, d_model: int, base: float = 10000.0,
                        dtype=np.float64) -> np.ndarray:
    """The sinusoidal table of "Attention Is All You Need".

    ``PE[p, 2i] = sin(p / base^(2i/d))``, ``PE[p, 2i+1] = cos(p / base^(2i/d))``.

    Args:
        max_len: number of positions L.
        d_model: model width D (odd widths get one more sine than cosine column).
        base: wavelength base, a positive number.
        dtype: np.float32 or np.float64.

    Returns:
        PE: shape (L, D).
    """
    max_len = v.positive_int(max_len, "max_len")
    d_model = v.positive_int(d_model, "d_model")
    base = v.real(base, "base", positive=True)
    dtype = v.float_dtype(dtype, "dtype")
    pos = np.arange(max_len, dtype=np.float64)[:, None]
    inv_freq = base ** (-np.arange(0, d_model, 2, dtype=np.float64) / d_model)
    angles = pos * inv_freq
    pe = np.empty((max_len, d_model), dtype=np.float64)
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles[:, : d_model // 2])
    return pe.astype(dtype)


class PositionalEncodingCache(NamedTuple):
    shape: tuple  # of x and of the output
    dtype: np.dtype


def positional_encoding_forward(x: np.ndarray, table: np.ndarray):
    """Add the first T rows of a positional table to a batch of sequences.

    Args:
        x: embeddings, shape (B, T, D) or (T, D).
        table: positional table, shape (L, D) with L >= T.

    Returns:
        out: shape of x; cache (the table is fixed: only x gets a gradient).
    """
    x = v.float_array(x, "x", min_ndim=2)
    table = v.float_array(table, "table", ndim=2)
    t, d = x.shape[-2:]
    if table.shape[1] != d:
        raise ValueError(f"table must have x.shape[-1] = {d} columns, got shape {table.shape}")
    if t > table.shape[0]:
        raise ValueError(f"x has {t} positions but the positional table has only "
                         f"{table.shape[0]}: sequences may be at most {table.shape[0]} long")
    return (x + table[:t].astype(x.dtype, copy=False),
            PositionalEncodingCache(x.shape, x.dtype))


def positional_encoding_backward(dout: np.ndarray, cache: PositionalEncodingCache):
    """The added table is a constant: ``dx = dout`` (the same array)."""
    v.cache_of(cache, "positional_encoding_backward", PositionalEncodingCache)
    return v.grad_like(dout, "dout", cache.shape, cache.dtype)


def _axis(axis: int, ndim: int) -> int:
    axis = v.integer(axis, "axis")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis must be an integer in [-{ndim}, {ndim}), got {axis!r}")
    return axis % ndim


def _finite_row_max(x: np.ndarray, axis: int) -> np.ndarray:
    """``max(x)`` along ``axis`` (keepdims), or a ValueError if a row has no finite maximum.

    The maximum is NaN when the row holds a NaN, +inf when it holds +inf, -inf when every entry
    is -inf: in each case the softmax of the row is undefined (NaN). One reduction, which the
    stable softmax needs anyway.
    """
    m = x.max(axis=axis, keepdims=True)
    if not np.isfinite(m).all():
        what = ("a NaN" if np.isnan(m).any() else "+inf" if np.isposinf(m).any()
                else "only -inf entries (nothing to normalise)")
        raise ValueError(f"x must have a finite entry in every slice along axis {axis} and no "
                         f"NaN or +inf: a slice holds {what}, and its softmax would be NaN")
    return m
