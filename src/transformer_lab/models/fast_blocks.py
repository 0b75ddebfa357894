"""A speed-only path for the encoder-decoder's layers and stacks: the same numbers as
:mod:`transformer_lab.core.blocks` (and as ``core.model``'s passes), computed faster.

The ``from_torch`` twins of ``nn.TransformerEncoderLayer`` ... ``nn.Transformer``
(:mod:`transformer_lab.reference.interop`) compute with the core, what the student writes. In
the instructors' and readers' package they compute with this module instead, which takes the
same arguments and parameters and gives the same outputs and gradients (to rounding): it brings
their forward and backward pass close to PyTorch's eager one (``python -m
transformer_lab.course.bench`` measures how close, and ``--core`` the core's). So does the
encoder-decoder model (:class:`transformer_lab.models.encoder_decoder.Transformer`) with
``use_fast_path = True``, as the trainer's models have it: :func:`transformer_forward`,
:func:`transformer_backward` and :func:`transformer_loss` are ``core.model``'s, with the
stacks computed here. It is **not part of the course**: the handout leaves it out
(``course/package.py``), and there the twins and the model compute with the student's own core;
``use_fast_path = False`` does the same here, and so does replacing a function of the core
modules this module stands in for (:func:`core_is_the_packages`).
``tests/test_fast_blocks.py`` checks that the two paths agree (values and gradients, float32 and
float64, both norm orders, every activation, with and without biases, boolean and float masks,
fully masked queries, saturated softmaxes).

It is built from the GPT's fast path (:mod:`transformer_lab.models.fast_gpt`, whose docstring
explains each trick) and differs from the core in the same ways:

- **2-D throughout**: activations are ``(N, E)`` arrays, ``N = B T``; the heads are strided
  views of the projections' outputs, and the attention's products write straight into their
  destinations (no split, merge or concatenate copies);
- **the products add into their destinations**: a sublayer's output is added to the residual
  stream by the product itself (BLAS with beta = 1), a bias is written first and the product
  added to it, a layer's input gradient is added to the residual stream's;
- **the norms**: pre-norm folds the layer norm's gain and offset into the next product's
  weights; post-norm's layer norm runs a cache-sized chunk of rows at a time;
- **attention in the transposed layout**: the scores are ``S^T = K Q^T`` (keys along the rows),
  so the softmax's sums (and maximum, where needed) run along the axis NumPy reduces fastest;
  the scale ``1/sqrt(Dh)`` is folded into ``W_q``; when every score is known to be small (the
  Cauchy-Schwarz bound of :func:`fast_gpt._scores_bounded`) and the mask only blocks (0 or
  -inf), the softmax needs no shift by the maximum; the scores become the weights in place;
  the backward pass takes each query's ``sum_j P_ij dP_ij`` from P and dP as the core does
  (``dO_i . O_i``, equal in exact arithmetic, loses accuracy where the weights saturate);
- **the cross-attention's keys and values in one product** with ``[W_k | W_v]``, and the
  memory's gradient summed over the decoder's layers in one array by the products themselves.

Parameters, masks and gradients are those of :mod:`transformer_lab.core.blocks` (nested
dicts; a mask broadcastable to (B, H, T, S), boolean with True = blocked, or float, added).
The batch must not be empty (the twins give an empty one to the core).
"""

from __future__ import annotations

import math
import sys
import types
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np

from transformer_lab.core import attention as core_attention
from transformer_lab.core import blocks as core_blocks
from transformer_lab.core import layers as core_layers
from transformer_lab.core import model as core_model
from transformer_lab.core import multihead as core_multihead
from transformer_lab.models.fast_gpt import (
    _chunks,
    _column_sums,
    _copy,
    _fresh,
    _gemm_add,
    _matmul,
    _mlp_backward,
    _mlp_forward,
    _norm_linear_backward,
    _norm_linear_forward,
    _normalize_rows,
    _normalize_rows_backward,
    _ones,
    _output,
    _product,
    _scaled,
    _scores_bounded,
    _zeros,
)

# --------------------------------------------------------------------------------------------
# When this module may stand in for the core: while the core is the package's own


def _of_the_core(f) -> bool:
    """Whether f is a function of the package's core, written in the file of its module."""
    home = sys.modules.get(getattr(f, "__module__", None) or "")
    return isinstance(f, types.FunctionType) and home is not None \
        and home.__name__.startswith("transformer_lab.core.") \
        and f.__code__.co_filename == home.__file__


#: (module, name, function, whether it is the core's) of every function in the namespaces of
#: the core modules a layer's, a stack's or the model's computation goes through (the functions
#: they import from each other included), as they were when this module was imported
_CORE_FUNCTIONS = [(m, name, f, _of_the_core(f))
                   for m in (core_blocks, core_multihead, core_attention, core_layers, core_model)
                   for name, f in vars(m).items() if isinstance(f, types.FunctionType)]


def core_is_the_packages() -> bool:
    """Whether each of those names still holds a function of the package's core: False once
    one is replaced (by the student's, the grader's), whether before or after this module was
    imported. The twins and the encoder-decoder model compute with this module only while it
    is True, so that a replaced core function is the one that runs (about 8 microseconds for
    its 83 functions)."""
    return all(_of_the_core(getattr(m, name, None)) if getattr(m, name, None) is not f else own
               for m, name, f, own in _CORE_FUNCTIONS)


# --------------------------------------------------------------------------------------------
# Layer norm, a chunk of rows at a time


def _layer_norm(s, gamma, beta, eps):
    """``(s - mean) / sqrt(var + eps) * gamma + beta`` by rows, s (N, E) -> z (N, E), cache."""
    N, E = s.shape
    dt = s.dtype
    xhat, z, rstd = _fresh((N, E), dt), _fresh((N, E), dt), _fresh((N,), dt)
    for r in _chunks(N, E, dt.itemsize):
        xh = xhat[r]
        _normalize_rows(s[r], xh, rstd[r], True, eps)
        if gamma is None:
            z[r] = xh
        else:
            np.multiply(xh, gamma, out=z[r])
        if beta is not None:
            z[r] += beta
    return z, (xhat, rstd, gamma, beta)


def _layer_norm_backward(dz, cache):
    """Gradients of :func:`_layer_norm`: ``(ds, dgamma, dbeta)`` (None where absent), ds new.
    ``ds = rstd (g - mean(g) - xhat mean(g xhat))``, ``g = dz gamma``."""
    xhat, rstd, gamma, beta = cache
    N, E = xhat.shape
    dt = dz.dtype
    dbeta = _column_sums(dz) if beta is not None else None
    dgamma = np.zeros(E, dt) if gamma is not None else None
    ds = _fresh((N, E), dt)
    rows = _chunks(N, E, dt.itemsize)
    t = _fresh((rows[0].stop, E), dt)
    for r in rows:
        dz_, xh, g, t_ = dz[r], xhat[r], ds[r], t[:r.stop - r.start]
        if gamma is None:
            g[...] = dz_
        else:
            np.multiply(dz_, xh, out=t_)
            dgamma += _ones(t_.shape[0], dt)[0] @ t_
            np.multiply(dz_, gamma, out=g)
        _normalize_rows_backward(g, xh, rstd[r], t_, True)
    return ds, dgamma, dbeta


def layer_norm_forward(x, gamma=None, beta=None, eps=1e-5):
    """As ``core.layers.layer_norm_forward``: x (..., E) -> out (..., E), cache."""
    shape = x.shape
    z, c_rows = _layer_norm(np.ascontiguousarray(x).reshape(-1, shape[-1]), gamma, beta, eps)
    return z.reshape(shape), (c_rows, shape)


def layer_norm_backward(dout, cache):
    """As ``core.layers.layer_norm_backward``: dx (..., E), grads {"gamma", "beta"} (present)."""
    c_rows, shape = cache
    ds, dgamma, dbeta = _layer_norm_backward(
        np.ascontiguousarray(dout).reshape(-1, shape[-1]), c_rows)
    return ds.reshape(shape), _norm_grads(dgamma, dbeta)


def _norm_grads(dgamma, dbeta):
    grads = {}
    if dgamma is not None:
        grads["gamma"] = dgamma
    if dbeta is not None:
        grads["beta"] = dbeta
    return grads


# --------------------------------------------------------------------------------------------
# Attention with a mask, in the transposed layout


class _Mask:
    """A mask as the transposed scores (B, H, S, T) take it: ``add`` (float, 0 or -inf where
    boolean, else the values) broadcastable to them, or None; ``blocks_only``: its values are
    0 or -inf (then bounded scores need no shift)."""

    def __init__(self, mask, dtype):
        if mask is None:
            self.add, self.blocks_only = None, True
            return
        mask = np.asarray(mask)
        mask = mask.reshape((1,) * (2 - mask.ndim) + mask.shape)  # (at least (T, S))
        if mask.dtype == bool:
            add = np.where(mask, dtype.type(-np.inf), dtype.type(0))
            self.blocks_only = True
        else:
            add = mask.astype(dtype)
            self.blocks_only = bool(np.all((add == 0) | np.isneginf(add)))
        self.add = np.ascontiguousarray(np.swapaxes(add, -1, -2))


def _heads(a, B, T, H):
    """(B T, H Dh) -> a view (B, H, T, Dh)."""
    return a.reshape(B, T, H, -1).transpose(0, 2, 1, 3)


def _attend(q, k, v, mask, shift, merged, B, T, S, H):
    """softmax(q k^T + mask) v for the heads q (N, E) (scaled), k, v (B S, E) -> written into
    merged (N, E) (the heads side by side); returns the weights P^T (B, H, S, T)."""
    dt = q.dtype
    st = np.matmul(_heads(k, B, S, H), _heads(q, B, T, H).swapaxes(-1, -2))  # (B, H, S, T)
    if mask.add is not None:
        st += mask.add
    if shift:  # softmax over the keys (a query whose keys are all -inf: no shift)
        m = st.max(axis=-2, keepdims=True)
        m[np.isneginf(m)] = 0
        st -= m
    np.exp(st, out=st)
    sums = np.matmul(_ones(S, dt), st)  # (B, H, 1, T)
    sums[sums == 0] = 1  # every key blocked: weights 0 / 1 = 0, as the core's
    np.reciprocal(sums, out=sums)
    st *= sums  # the softmax's weights P^T
    np.matmul(st.swapaxes(-1, -2), _heads(v, B, S, H),
              out=_heads(merged, B, T, H))
    return st


def _attend_backward(dmerged, st, q, k, v, dq, dk, dv, B, T, S, H):
    """Gradients of :func:`_attend` written into dq (N, E), dk, dv (B S, E) (views allowed).

    ``dS = P * dP - P * sum_j P_ij dP_ij``, the sums from P and dP as the core takes them (the
    shortcut ``sum_j P_ij dP_ij = dO_i . O_i`` loses the core's accuracy where a query's
    weights saturate: 0.14 relative in float32 for inputs of a thousand).
    """
    dh = _heads(dmerged, B, T, H)
    np.matmul(st, dh, out=_heads(dv, B, S, H))  # dV = P^T dO
    dst = np.matmul(_heads(v, B, S, H), dh.swapaxes(-1, -2))  # dP^T (B, H, S, T)
    dst *= st
    sums = np.matmul(_ones(S, dst.dtype), dst)  # (B, H, 1, T): sum_j P_ij dP_ij
    dst -= st * sums  # dS^T
    np.matmul(dst.swapaxes(-1, -2), _heads(k, B, S, H), out=_heads(dq, B, T, H))
    np.matmul(dst, _heads(q, B, T, H), out=_heads(dk, B, S, H))


def _self_attention(x, P, H, mask, norm, c, B, T, into):
    """Self-attention of norm(x) (norm None: of x), x (N, E), its output added to ``into``."""
    E = x.shape[1]
    scale = 1.0 / math.sqrt(E // H)
    W_s, b_s = _scaled(P["W_qkv"], P.get("b_qkv"), slice(0, E), scale, _fresh)
    qkv, c_qkv = _norm_linear_forward(x, norm, W_s, b_s, c, _fresh)  # (N, 3E)
    q, k, v = qkv[:, :E], qkv[:, E:2 * E], qkv[:, 2 * E:]
    shift = not (mask.blocks_only and _scores_bounded(q, k, E // H))
    merged = _fresh((x.shape[0], E), x.dtype)
    st = _attend(q, k, v, mask, shift, merged, B, T, T, H)
    _output(merged, P["W_o"], P.get("b_o"), into, _fresh)
    return (c_qkv, qkv, st, merged, scale)


def _self_attention_backward(dout, cache, P, H, B, T, dx):
    """Gradients of :func:`_self_attention`: the input's added to dx (may be dout itself:
    dout is read first), returns (grads, the norm's dgamma, dbeta)."""
    c_qkv, qkv, st, merged, scale = cache
    E = merged.shape[1]
    grads = {"W_o": _matmul(merged.T, dout, _fresh)}
    if P.get("b_o") is not None:
        grads["b_o"] = _column_sums(dout)
    dmerged = _matmul(dout, P["W_o"].T, _fresh)
    dqkv = _fresh(qkv.shape, qkv.dtype)
    q, k, v = qkv[:, :E], qkv[:, E:2 * E], qkv[:, 2 * E:]
    _attend_backward(dmerged, st, q, k, v, dqkv[:, :E], dqkv[:, E:2 * E],
                     dqkv[:, 2 * E:], B, T, T, H)
    dW, db, dgamma, dbeta = _norm_linear_backward(dqkv, c_qkv, dx, _fresh)
    dW[:, :E] *= scale  # W_q was used scaled
    grads["W_qkv"] = dW
    if db is not None:
        db[:E] *= scale
        grads["b_qkv"] = db
    return _ordered(grads, P), dgamma, dbeta


def _kv_params(P):
    """[W_k | W_v] (E_k, 2E) and [b_k | b_v] (or None; a missing one as zeros)."""
    W_k = P["W_k"]
    W = np.concatenate([W_k, P["W_v"]], axis=1, out=_fresh((W_k.shape[0], 2 * W_k.shape[1]),
                                                            W_k.dtype))
    bk, bv = P.get("b_k"), P.get("b_v")
    if bk is None and bv is None:
        return W, None
    E = P["W_k"].shape[1]
    zeros = np.zeros(E, W.dtype)
    return W, np.concatenate([zeros if bk is None else bk, zeros if bv is None else bv])


def _cross_attention(x, mem, P, H, mask, norm, c, B, T, S, into):
    """Attention of norm(x)'s queries to mem (B S, E_k)'s keys and values, added to ``into``."""
    E = P["W_q"].shape[1]
    scale = 1.0 / math.sqrt(E // H)
    W_q, b_q = _scaled(P["W_q"], P.get("b_q"), slice(None), scale, _fresh)
    q, c_q = _norm_linear_forward(x, norm, W_q, b_q, c, _fresh)  # (N, E)
    W_kv, b_kv = _kv_params(P)
    kv = _product(mem, W_kv, b_kv, _fresh)  # (B S, 2E)
    k, v = kv[:, :E], kv[:, E:]
    shift = not (mask.blocks_only and _scores_bounded(q, k, E // H))
    merged = _fresh((x.shape[0], E), x.dtype)
    st = _attend(q, k, v, mask, shift, merged, B, T, S, H)
    _output(merged, P["W_o"], P.get("b_o"), into, _fresh)
    return (c_q, q, mem, W_kv, kv, st, merged, scale)


def _cross_attention_backward(dout, cache, P, H, B, T, S, dx, dmem):
    """Gradients of :func:`_cross_attention`: the input's added to dx, the memory's to dmem."""
    c_q, q, mem, W_kv, kv, st, merged, scale = cache
    E = merged.shape[1]
    grads = {"W_o": _matmul(merged.T, dout, _fresh)}
    if P.get("b_o") is not None:
        grads["b_o"] = _column_sums(dout)
    dmerged = _matmul(dout, P["W_o"].T, _fresh)
    dq, dkv = _fresh(q.shape, q.dtype), _fresh(kv.shape, kv.dtype)
    _attend_backward(dmerged, st, q, kv[:, :E], kv[:, E:], dq, dkv[:, :E], dkv[:, E:], B, T, S,
                     H)
    dW_q, db_q, dgamma, dbeta = _norm_linear_backward(dq, c_q, dx, _fresh)
    dW_q *= scale
    grads["W_q"] = dW_q
    if db_q is not None:
        db_q *= scale
        grads["b_q"] = db_q
    dW_kv = _matmul(mem.T, dkv, _fresh)
    grads["W_k"], grads["W_v"] = _copy(dW_kv[:, :E]), _copy(dW_kv[:, E:])
    db_kv = _column_sums(dkv)
    for name, part in (("b_k", db_kv[:E]), ("b_v", db_kv[E:])):
        if P.get(name) is not None:
            grads[name] = part.copy()
    _gemm_add(dkv, W_kv.T, dmem)
    return _ordered(grads, P), dgamma, dbeta


def _ordered(grads, P):
    """The gradients in the order of the params' keys (as the core returns them)."""
    return {k: grads[k] for k in P if k in grads}


# --------------------------------------------------------------------------------------------
# Layers


def _config(norm_first, activation, eps):
    """The layers' settings; ``norm`` and ``eps`` as fast_gpt's functions read them from a
    GPT's config (a layer norm)."""
    return SimpleNamespace(norm="layer", eps=eps, norm_first=norm_first, activation=activation)


def _prenorm(norm_params, x):
    """A pre-norm's (gamma, beta) for :func:`fast_gpt._norm_linear_forward` (no gamma: ones)."""
    gamma = norm_params.get("gamma")
    if gamma is None:
        gamma = np.ones(x.shape[1], x.dtype)
    return gamma, norm_params.get("beta")


def _sublayer(x, run, norm_params, c):
    """One residual sublayer: pre-norm ``x + f(norm(x))``, post-norm ``norm(x + f(x))``;
    ``run(h, norm, into)`` adds f's output to ``into`` and returns its cache."""
    s = _copy(x)
    if c.norm_first:
        return s, (run(x, _prenorm(norm_params, x), s), None, norm_params)
    c_sub = run(x, None, s)
    z, c_ln = _layer_norm(s, norm_params.get("gamma"), norm_params.get("beta"), c.eps)
    return z, (c_sub, c_ln, norm_params)


def _sublayer_backward(dout, cache, run_backward, norm_first):
    """Gradients of :func:`_sublayer`: (dx, the norm's grads, the sublayer's grads);
    ``run_backward(d, c_sub, dx)`` adds the input's gradient to dx (d itself may be dx) and
    returns (grads, dgamma, dbeta) (the pre-norm's, else None)."""
    c_sub, c_ln, norm_params = cache
    if norm_first:
        dx = _copy(dout)
        grads, dgamma, dbeta = run_backward(dx, c_sub, dx)
        if norm_params.get("gamma") is None:
            dgamma = None
        return dx, _norm_grads(dgamma, dbeta), grads
    ds, dgamma, dbeta = _layer_norm_backward(dout, c_ln)
    grads = run_backward(ds, c_sub, ds)[0]
    return ds, _norm_grads(dgamma, dbeta), grads


def _ff(params, activation, c):
    def run(h, norm, into):
        return _mlp_forward(h, params, "", norm, activation, c, _fresh, into=into)[1]
    return run


def _ff_backward(params):
    def run(d, c_ff, dx):
        grads: dict = {}
        _mlp_backward(d, c_ff, params, "", "norm", dx, grads, _fresh)
        dgamma, dbeta = grads.pop("norm.gamma", None), grads.pop("norm.beta", None)
        return _ordered(grads, params), dgamma, dbeta
    return run


def _rows(x):
    """x (B, T, E) -> (B, T, (B T, E) contiguous)."""
    B, T, E = x.shape
    return B, T, np.ascontiguousarray(x).reshape(B * T, E)


def _encoder_layer(x, params, H, mask, c, B, T):
    def attend(h, norm, into):
        return _self_attention(h, params["self_attn"], H, mask, norm, c, B, T, into)

    x, c_sa = _sublayer(x, attend, params["norm1"], c)
    x, c_ff = _sublayer(x, _ff(params["ff"], c.activation, c), params["norm2"], c)
    return x, (c_sa, c_ff)


def _encoder_layer_backward(dout, cache, params, H, c, B, T):
    c_sa, c_ff = cache

    def attend_backward(d, c_sub, dx):
        return _self_attention_backward(d, c_sub, params["self_attn"], H, B, T, dx)

    dx, g_norm2, g_ff = _sublayer_backward(dout, c_ff, _ff_backward(params["ff"]), c.norm_first)
    dx, g_norm1, g_sa = _sublayer_backward(dx, c_sa, attend_backward, c.norm_first)
    return dx, {"self_attn": g_sa, "ff": g_ff, "norm1": g_norm1, "norm2": g_norm2}


def _decoder_layer(x, mem, params, H, tgt_mask, mem_mask, c, B, T, S):
    def attend(h, norm, into):
        return _self_attention(h, params["self_attn"], H, tgt_mask, norm, c, B, T, into)

    def cross(h, norm, into):
        return _cross_attention(h, mem, params["cross_attn"], H, mem_mask, norm, c, B, T, S,
                                into)

    x, c_sa = _sublayer(x, attend, params["norm1"], c)
    x, c_ca = _sublayer(x, cross, params["norm2"], c)
    x, c_ff = _sublayer(x, _ff(params["ff"], c.activation, c), params["norm3"], c)
    return x, (c_sa, c_ca, c_ff)


def _decoder_layer_backward(dout, cache, params, H, c, B, T, S, dmem):
    """Gradients of :func:`_decoder_layer`; the memory's added to dmem (B S, E)."""
    c_sa, c_ca, c_ff = cache

    def attend_backward(d, c_sub, dx):
        return _self_attention_backward(d, c_sub, params["self_attn"], H, B, T, dx)

    def cross_backward(d, c_sub, dx):
        return _cross_attention_backward(d, c_sub, params["cross_attn"], H, B, T, S, dx, dmem)

    dx, g_norm3, g_ff = _sublayer_backward(dout, c_ff, _ff_backward(params["ff"]), c.norm_first)
    dx, g_norm2, g_ca = _sublayer_backward(dx, c_ca, cross_backward, c.norm_first)
    dx, g_norm1, g_sa = _sublayer_backward(dx, c_sa, attend_backward, c.norm_first)
    return dx, {"self_attn": g_sa, "cross_attn": g_ca, "ff": g_ff,
                "norm1": g_norm1, "norm2": g_norm2, "norm3": g_norm3}


# --------------------------------------------------------------------------------------------
# The core's interface (core.blocks): layers and stacks


def encoder_layer_forward(x, params, num_heads, mask=None, norm_first=False, activation="relu",
                          eps=1e-5):
    """As ``core.blocks.encoder_layer_forward``: x (B, T, E) -> out (B, T, E), cache."""
    B, T, x2 = _rows(x)
    c = _config(norm_first, activation, eps)
    out, cache = _encoder_layer(x2, params, num_heads, _Mask(mask, x2.dtype), c, B, T)
    return out.reshape(B, T, -1), (cache, params, num_heads, c, B, T)


def encoder_layer_backward(dout, cache):
    """As ``core.blocks.encoder_layer_backward``: dx (B, T, E), grads (nested like params)."""
    cache, params, H, c, B, T = cache
    dx, grads = _encoder_layer_backward(_rows(dout)[2], cache, params, H, c, B, T)
    return dx.reshape(B, T, -1), grads


def decoder_layer_forward(x, memory, params, num_heads, tgt_mask=None, memory_mask=None,
                          norm_first=False, activation="relu", eps=1e-5):
    """As ``core.blocks.decoder_layer_forward``: x (B, T, E), memory (B, S, E) -> out."""
    B, T, x2 = _rows(x)
    S, mem = memory.shape[1], _rows(memory)[2]
    c = _config(norm_first, activation, eps)
    out, cache = _decoder_layer(x2, mem, params, num_heads, _Mask(tgt_mask, x2.dtype),
                                _Mask(memory_mask, x2.dtype), c, B, T, S)
    return out.reshape(B, T, -1), (cache, params, num_heads, c, B, T, S, mem.shape)


def decoder_layer_backward(dout, cache):
    """As ``core.blocks.decoder_layer_backward``: dx (B, T, E), dmemory (B, S, E), grads."""
    cache, params, H, c, B, T, S, mem_shape = cache
    dmem = _zeros(mem_shape, dout.dtype)
    dx, grads = _decoder_layer_backward(_rows(dout)[2], cache, params, H, c, B, T, S, dmem)
    return dx.reshape(B, T, -1), dmem.reshape(B, S, -1), grads


def _final_norm(x, norm, eps):
    if norm is None:
        return x, None
    return _layer_norm(x, norm.get("gamma"), norm.get("beta"), eps)


def encoder_forward(x, params, num_heads, mask=None, norm_first=False, activation="relu",
                    eps=1e-5):
    """As ``core.blocks.encoder_forward``: the layers, then the final norm if any."""
    B, T, x2 = _rows(x)
    c = _config(norm_first, activation, eps)
    mk = _Mask(mask, x2.dtype)
    caches = []
    for layer in params["layers"]:
        x2, cache = _encoder_layer(x2, layer, num_heads, mk, c, B, T)
        caches.append(cache)
    x2, c_norm = _final_norm(x2, params["norm"], eps)
    return x2.reshape(B, T, -1), (caches, c_norm, params, num_heads, c, B, T)


def encoder_backward(dout, cache):
    """As ``core.blocks.encoder_backward``: dx (B, T, E), grads ``{"layers", "norm"}``."""
    caches, c_norm, params, H, c, B, T = cache
    d = _rows(dout)[2]
    g_norm = None
    if c_norm is not None:
        d, dgamma, dbeta = _layer_norm_backward(d, c_norm)
        g_norm = _norm_grads(dgamma, dbeta)
    g_layers = []
    for layer, cache in zip(reversed(params["layers"]), reversed(caches), strict=True):
        d, g = _encoder_layer_backward(d, cache, layer, H, c, B, T)
        g_layers.insert(0, g)
    return d.reshape(B, T, -1), {"layers": g_layers, "norm": g_norm}


def decoder_forward(x, memory, params, num_heads, tgt_mask=None, memory_mask=None,
                    norm_first=False, activation="relu", eps=1e-5):
    """As ``core.blocks.decoder_forward``: the layers reading one memory, then the final norm."""
    B, T, x2 = _rows(x)
    S, mem = memory.shape[1], _rows(memory)[2]
    c = _config(norm_first, activation, eps)
    tm, mm = _Mask(tgt_mask, x2.dtype), _Mask(memory_mask, x2.dtype)
    caches = []
    for layer in params["layers"]:
        x2, cache = _decoder_layer(x2, mem, layer, num_heads, tm, mm, c, B, T, S)
        caches.append(cache)
    x2, c_norm = _final_norm(x2, params["norm"], eps)
    return x2.reshape(B, T, -1), (caches, c_norm, params, num_heads, c, B, T, S, mem.shape)


def decoder_backward(dout, cache):
    """As ``core.blocks.decoder_backward``: dx, dmemory (summed over the layers), grads."""
    caches, c_norm, params, H, c, B, T, S, mem_shape = cache
    d = _rows(dout)[2]
    g_norm = None
    if c_norm is not None:
        d, dgamma, dbeta = _layer_norm_backward(d, c_norm)
        g_norm = _norm_grads(dgamma, dbeta)
    dmem = _zeros(mem_shape, d.dtype)
    g_layers = []
    for layer, cache in zip(reversed(params["layers"]), reversed(caches), strict=True):
        d, g = _decoder_layer_backward(d, cache, layer, H, c, B, T, S, dmem)
        g_layers.insert(0, g)
    return d.reshape(B, T, -1), dmem.reshape(B, S, -1), {"layers": g_layers, "norm": g_norm}


# --------------------------------------------------------------------------------------------
# The model's interface (core.model): the embeddings, the output projection and the loss by the
# core, the stacks by this module


class TransformerCache(NamedTuple):
    """What :func:`transformer_forward` keeps for :func:`transformer_backward`: the cache of
    ``core.model.transformer_forward``, with this module's stack caches."""

    encode: tuple  # (the source embedding's cache, the encoder's)
    decode: tuple  # (the target embedding's, the decoder's, the output projection's)
    learned: bool  # learned positions


def _embed(params, name, ids, config, pe):
    scale = math.sqrt(config.d_model) if config.scale_embeddings else 1.0
    pos = params[name + "_pos"]["W"] if name + "_pos" in params else pe
    return core_model.embed_forward(ids, params[name + "_embed"]["W"], pos, scale)


def transformer_forward(params, src, tgt_in, config, pe=None, src_pad=None, tgt_pad=None):
    """As ``core.model.transformer_forward``: logits (B, T, V), a :class:`TransformerCache`."""
    c = config
    src_mask = core_attention.merge_masks(None, src_pad)  # (B, 1, 1, S) or None
    x, c_src = _embed(params, "src", src, c, pe)
    memory, c_enc = encoder_forward(x, params["encoder"], c.num_heads, src_mask, c.norm_first,
                                    c.activation, c.eps)
    y, c_tgt = _embed(params, "tgt", tgt_in, c, pe)
    tgt_mask = core_attention.merge_masks(core_attention.causal_mask(tgt_in.shape[1]), tgt_pad)
    y, c_dec = decoder_forward(y, memory, params["decoder"], c.num_heads, tgt_mask, src_mask,
                               c.norm_first, c.activation, c.eps)
    logits, c_out = core_layers.linear_forward(y, params["out_proj"]["W"],
                                               params["out_proj"].get("b"))
    return logits, TransformerCache((c_src, c_enc), (c_tgt, c_dec, c_out), "src_pos" in params)


def transformer_backward(dlogits, cache):
    """As ``core.model.transformer_backward``: every parameter's gradient, nested like params."""
    (c_src, c_enc), (c_tgt, c_dec, c_out), learned = cache
    dy, g_out = core_layers.linear_backward(dlogits, c_out)
    dy, dmemory, g_dec = decoder_backward(dy, c_dec)
    d_tgt_table, d_tgt_pos = core_model.embed_backward(dy, c_tgt)
    dx, g_enc = encoder_backward(dmemory, c_enc)
    d_src_table, d_src_pos = core_model.embed_backward(dx, c_src)
    grads = {"src_embed": {"W": d_src_table}, "tgt_embed": {"W": d_tgt_table},
             "encoder": g_enc, "decoder": g_dec, "out_proj": g_out}
    if learned:
        grads.update(src_pos={"W": d_src_pos}, tgt_pos={"W": d_tgt_pos})
    return grads


def transformer_loss(params, src, tgt_in, labels, config, pe=None, src_pad=None, tgt_pad=None,
                     ignore_index=-1):
    """As ``core.model.transformer_loss``: the mean cross-entropy (the core's) and the
    gradients."""
    logits, cache = transformer_forward(params, src, tgt_in, config, pe, src_pad, tgt_pad)
    loss, c_loss = core_layers.cross_entropy_forward(logits, labels, ignore_index)
    return loss, transformer_backward(core_layers.cross_entropy_backward(1.0, c_loss), cache)
