"""Transformer blocks as forward/backward pairs: feed-forward, encoder layer, decoder layer, stacks.

The same computations as PyTorch's ``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer``
(without dropout), batch-first. Parameters are nested dicts of arrays in NumPy layout:

- feed-forward ``{"W1": (E, F), "b1": (F,), "W2": (F, E), "b2": (E,)}`` (biases optional);
- layer norm ``{"gamma": (E,), "beta": (E,)}`` (beta optional);
- encoder layer ``{"self_attn": <attention params>, "ff": ..., "norm1": ..., "norm2": ...}``;
- decoder layer ``{"self_attn", "cross_attn", "ff", "norm1", "norm2", "norm3"}``;
- stacks ``{"layers": [layer params, ...], "norm": <layer norm params> or None}``.

Attention parameter dicts are those of :mod:`transformer_lab.attention` (self-attention may use
the packed ``W_qkv``). Backward functions return gradients in the same nested structure.

Post-norm (the paper, ``norm_first=False``): ``x = norm(x + sublayer(x))``.
Pre-norm (``norm_first=True``): ``x = x + sublayer(norm(x))``.

Each layer's forward and backward pass is written out step by step, for both norm orders; its
cache is a NamedTuple of the sublayers' caches (and the layer's parameters, which the attention
backward needs). The ``*_init`` functions are deterministic: without an ``rng`` they draw from
``np.random.default_rng(0)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from transformer_lab import _validate as v
from transformer_lab import attention as att
from transformer_lab import layers as L

_ACTIVATIONS = L._ACTIVATIONS  # "relu", "gelu", "gelu_tanh"

# --------------------------------------------------------------------------------------------
# Feed-forward


class FeedForwardCache(NamedTuple):
    lin1: L.LinearCache
    act: tuple  # (activation name, its cache)
    lin2: L.LinearCache


def feed_forward_forward(x: np.ndarray, params: dict, activation: str = "relu"):
    """Position-wise feed-forward network ``act(x W1 + b1) W2 + b2``.

    Args:
        x: (..., E).
        params: ``W1`` (E, F), ``W2`` (F, E), optional ``b1`` (F,), ``b2`` (E,).
        activation: "relu", "gelu" (exact) or "gelu_tanh".

    Returns:
        out: (..., E); cache.
    """
    x = v.float_array(x, "x", min_ndim=1)
    return _feed_forward(x, params, activation, "params")


def _feed_forward(x, params, activation, where):
    """:func:`feed_forward_forward`, its parameters named ``where`` in error messages."""
    _check_ff_params(params, x.shape[-1], x.dtype, where)
    _check_activation(activation)
    h, c1 = L.linear_forward(x, params["W1"], params.get("b1"))
    if activation == "relu":
        # h belongs to this function alone: apply the ReLU in place, one (..., F) array fewer
        ca = ("relu", L.ReluCache(h > 0, h.dtype))
        a = np.maximum(h, 0, out=h)
    else:
        a, ca = L.activation_forward(h, activation)
    out, c2 = L.linear_forward(a, params["W2"], params.get("b2"))
    return out, FeedForwardCache(c1, ca, c2)


def feed_forward_backward(dout: np.ndarray, cache: FeedForwardCache):
    """Gradients of :func:`feed_forward_forward`: dx (..., E) and grads (keys of params)."""
    v.cache_of(cache, "feed_forward_backward", FeedForwardCache)
    a, w2 = cache.lin2.x, cache.lin2.W
    v.grad_like(dout, "dout", (*a.shape[:-1], w2.shape[1]), a.dtype)
    da, dW2, db2 = L.linear_backward(dout, cache.lin2)
    if cache.act[0] == "relu":
        dh = np.multiply(da, cache.act[1].positive, out=da)  # da is new: ReLU's mask in place
    else:
        dh = L.activation_backward(da, cache.act)
    dx, dW1, db1 = L.linear_backward(dh, cache.lin1)
    grads = {"W1": dW1, "W2": dW2}
    if db1 is not None:
        grads["b1"] = db1
    if db2 is not None:
        grads["b2"] = db2
    return dx, grads


_FF_KEYS = frozenset({"W1", "W2", "b1", "b2"})


def _ff_params_fit(params, e: int, dtype) -> bool:
    """True when :func:`_check_ff_params` has nothing to say: the quick test of every call."""
    if not isinstance(params, dict) or not params.keys() <= _FF_KEYS:
        return False
    w1, b1, w2, b2 = params.get("W1"), params.get("b1"), params.get("W2"), params.get("b2")
    if not (isinstance(w1, np.ndarray) and w1.ndim == 2):
        return False
    f = w1.shape[1]
    return (_fits(w1, (e, f), dtype) and _fits(w2, (f, e), dtype)
            and (b1 is None or _fits(b1, (f,), dtype)) and (b2 is None or _fits(b2, (e,), dtype)))


def _fits(p, shape: tuple, dtype) -> bool:
    return isinstance(p, np.ndarray) and p.dtype == dtype and p.shape == shape


def _check_ff_params(params, e: int, dtype, where: str) -> None:
    """``W1`` (E, F), ``W2`` (F, E), optional ``b1`` (F,), ``b2`` (E,), all of x's dtype."""
    if _ff_params_fit(params, e, dtype):
        return
    if not isinstance(params, Mapping):
        raise TypeError(f"{where} must be a dict with W1 (E, F), W2 (F, E) and optionally "
                        f"b1 (F,), b2 (E,), got {type(params).__name__}")
    unknown = set(params) - _FF_KEYS
    if unknown:
        raise ValueError(f"{where} has unexpected entries {sorted(unknown)}; expected W1, W2 "
                         "and optionally b1, b2")
    for name in ("W1", "W2"):
        if name not in params:
            raise ValueError(f"{where} is missing {name!r}")
    f = v.float_array(params["W1"], f"{where}['W1']", ndim=2).shape[1]
    expected = {"W1": ((e, f), "(E, F), E = x.shape[-1]"),
                "W2": ((f, e), f"(F, E), F = {where}['W1'].shape[1]"),
                "b1": ((f,), "(F,)"), "b2": ((e,), "(E,)")}
    for name, (shape, what) in expected.items():
        if params.get(name) is None:
            continue
        arr = v.float_array(params[name], f"{where}[{name!r}]")
        if arr.dtype != dtype:
            raise TypeError(f"{where}[{name!r}] must have the dtype of x ({dtype}), "
                            f"got {arr.dtype}")
        v.shape_is(arr, shape, f"{where}[{name!r}]", what)


def _check_activation(activation) -> None:
    if activation not in _ACTIVATIONS:
        raise ValueError(f'activation must be "relu", "gelu" or "gelu_tanh", got {activation!r}')


# --------------------------------------------------------------------------------------------
# Layer norm with a parameter dict ({"gamma", "beta"}, each optional)


_NORM_KEYS = frozenset({"gamma", "beta"})


def _norm_forward(x, p, eps, where: str = "params"):
    """Layer norm of ``x`` with ``p = {"gamma": (E,), "beta": (E,)}`` (either may be absent)."""
    if not isinstance(p, Mapping) or not p.keys() <= _NORM_KEYS:
        raise ValueError(f"{where} must be a dict with (optional) entries 'gamma' and 'beta', "
                         f"got {sorted(p) if isinstance(p, Mapping) else type(p).__name__}")
    return L.layer_norm_forward(x, p.get("gamma"), p.get("beta"), eps)


def _norm_backward(dout, cache):
    """Gradients of :func:`_norm_forward`: dx and ``{"gamma": ..., "beta": ...}`` (those used)."""
    dx, dgamma, dbeta = L.layer_norm_backward(dout, cache)
    grads = {}
    if dgamma is not None:
        grads["gamma"] = dgamma
    if dbeta is not None:
        grads["beta"] = dbeta
    return dx, grads


# --------------------------------------------------------------------------------------------
# Encoder and decoder layers


class EncoderLayerCache(NamedTuple):
    norm_first: bool
    params: dict  # the layer's parameters: the attention backward needs its weights
    self_attn: att.MHACache
    norm1: L.LayerNormCache
    ff: FeedForwardCache
    norm2: L.LayerNormCache


class DecoderLayerCache(NamedTuple):
    norm_first: bool
    params: dict
    self_attn: att.MHACache
    norm1: L.LayerNormCache
    cross_attn: att.MHACache
    norm2: L.LayerNormCache
    ff: FeedForwardCache
    norm3: L.LayerNormCache


_ENCODER_KEYS = ("self_attn", "ff", "norm1", "norm2")
_DECODER_KEYS = ("self_attn", "cross_attn", "ff", "norm1", "norm2", "norm3")


def _check_layer(x, params, keys, norm_first, activation):
    """x (B, T, E); params a dict with exactly ``keys``; norm_first a bool; a known activation."""
    x = v.float_array(x, "x", ndim=3)
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a dict with the entries {list(keys)}, got "
                        f"{type(params).__name__}")
    if params.keys() != set(keys):
        missing = [k for k in keys if k not in params]
        unknown = sorted(set(params) - set(keys))
        raise ValueError(f"params must have the entries {list(keys)}: missing {missing}, "
                         f"unexpected {unknown}")
    v.boolean(norm_first, "norm_first")
    _check_activation(activation)
    return x


def _check_memory(memory, x):
    """The decoder's memory: (B, S, E) with the batch size, width and dtype of x."""
    memory = v.float_array(memory, "memory", ndim=3)
    v.same_dtype("x", x, "memory", memory)
    b, _, e = x.shape
    if memory.shape[0] != b or memory.shape[2] != e:
        raise ValueError(f"memory must have shape (B, S, E) = ({b}, S, {e}) (the batch size and "
                         f"width of x), got {memory.shape}")
    return memory


def encoder_layer_forward(x, params: dict, num_heads: int, attn_mask=None,
                          key_padding_mask=None, norm_first: bool = False,
                          activation: str = "relu", eps: float = 1e-5):
    """One encoder layer: self-attention, then feed-forward, each with residual and layer norm.

    Post-norm: ``x1 = norm1(x + SA(x))``, ``out = norm2(x1 + FF(x1))``.
    Pre-norm: ``x1 = x + SA(norm1(x))``, ``out = x1 + FF(norm2(x1))``.

    Args:
        x: (B, T, E).
        params: ``{"self_attn", "ff", "norm1", "norm2"}`` (see the module docstring).
        num_heads: heads of the self-attention.
        attn_mask: None or (T, T) bool/float mask; key_padding_mask: None or (B, T).
        norm_first: pre-norm (True) or post-norm (False, the paper's).
        activation: of the feed-forward network.
        eps: of the layer norms.

    Returns:
        out: (B, T, E); cache.
    """
    x = _check_layer(x, params, _ENCODER_KEYS, norm_first, activation)
    if norm_first:
        h, n1 = _norm_forward(x, params["norm1"], eps, "params['norm1']")
        a, _, sa = att.self_attention_forward(h, params["self_attn"], num_heads, attn_mask,
                                              key_padding_mask, need_weights=False)
        x1 = x + a
        h, n2 = _norm_forward(x1, params["norm2"], eps, "params['norm2']")
        f, ff = _feed_forward(h, params["ff"], activation, "params['ff']")
        out = x1 + f
    else:
        a, _, sa = att.self_attention_forward(x, params["self_attn"], num_heads, attn_mask,
                                              key_padding_mask, need_weights=False)
        x1, n1 = _norm_forward(x + a, params["norm1"], eps, "params['norm1']")
        f, ff = _feed_forward(x1, params["ff"], activation, "params['ff']")
        out, n2 = _norm_forward(x1 + f, params["norm2"], eps, "params['norm2']")
    return out, EncoderLayerCache(bool(norm_first), params, sa, n1, ff, n2)


def encoder_layer_backward(dout, cache: EncoderLayerCache):
    """Gradients of :func:`encoder_layer_forward`.

    Each residual ``y = x + f(x)`` passes ``dy`` on twice: ``dx = dy + df(dy)``.

    Args:
        dout: (B, T, E), the output's shape and dtype.

    Returns:
        dx (B, T, E) and grads (nested like params).
    """
    v.cache_of(cache, "encoder_layer_backward", EncoderLayerCache)
    v.grad_like(dout, "dout", cache.norm1.xhat.shape, cache.norm1.xhat.dtype)  # x's
    p = cache.params
    if cache.norm_first:  # out = x1 + FF(norm2(x1)), x1 = x + SA(norm1(x))
        dh, g_ff = feed_forward_backward(dout, cache.ff)
        dx1, g_n2 = _norm_backward(dh, cache.norm2)
        dx1 += dout
        dh, g_sa = att.self_attention_backward(dx1, cache.self_attn, p["self_attn"])
        dx, g_n1 = _norm_backward(dh, cache.norm1)
        dx += dx1
    else:  # out = norm2(x1 + FF(x1)), x1 = norm1(x + SA(x))
        ds, g_n2 = _norm_backward(dout, cache.norm2)  # d(x1 + FF(x1))
        dx1, g_ff = feed_forward_backward(ds, cache.ff)
        dx1 += ds
        ds, g_n1 = _norm_backward(dx1, cache.norm1)  # d(x + SA(x))
        dx, g_sa = att.self_attention_backward(ds, cache.self_attn, p["self_attn"])
        dx += ds
    return dx, {"self_attn": g_sa, "ff": g_ff, "norm1": g_n1, "norm2": g_n2}


def decoder_layer_forward(x, memory, params: dict, num_heads: int, tgt_mask=None,
                          memory_mask=None, tgt_key_padding_mask=None,
                          memory_key_padding_mask=None, norm_first: bool = False,
                          activation: str = "relu", eps: float = 1e-5):
    """One decoder layer: masked self-attention, cross-attention to the memory, feed-forward.

    Post-norm: ``x1 = norm1(x + SA(x))``, ``x2 = norm2(x1 + CA(x1, memory))``,
    ``out = norm3(x2 + FF(x2))``.
    Pre-norm: ``x1 = x + SA(norm1(x))``, ``x2 = x1 + CA(norm2(x1), memory)``,
    ``out = x2 + FF(norm3(x2))``.

    Args:
        x: decoder input, (B, T, E).
        memory: encoder output, (B, S, E).
        params: ``{"self_attn", "cross_attn", "ff", "norm1", "norm2", "norm3"}``.
        tgt_mask: None or (T, T) mask for the self-attention (usually causal).
        memory_mask: None or (T, S) mask for the cross-attention.
        tgt_key_padding_mask: None or (B, T); memory_key_padding_mask: None or (B, S).
        norm_first, activation, eps: as for :func:`encoder_layer_forward`.

    Returns:
        out: (B, T, E); cache.
    """
    x = _check_layer(x, params, _DECODER_KEYS, norm_first, activation)
    memory = _check_memory(memory, x)
    sa_p, ca_p = params["self_attn"], params["cross_attn"]
    if norm_first:
        h, n1 = _norm_forward(x, params["norm1"], eps, "params['norm1']")
        a, _, sa = att.self_attention_forward(h, sa_p, num_heads, tgt_mask,
                                              tgt_key_padding_mask, need_weights=False)
        x1 = x + a
        h, n2 = _norm_forward(x1, params["norm2"], eps, "params['norm2']")
        c, _, ca = att.multi_head_attention_forward(h, memory, memory, ca_p, num_heads,
                                                    memory_mask, memory_key_padding_mask,
                                                    need_weights=False)
        x2 = x1 + c
        h, n3 = _norm_forward(x2, params["norm3"], eps, "params['norm3']")
        f, ff = _feed_forward(h, params["ff"], activation, "params['ff']")
        out = x2 + f
    else:
        a, _, sa = att.self_attention_forward(x, sa_p, num_heads, tgt_mask,
                                              tgt_key_padding_mask, need_weights=False)
        x1, n1 = _norm_forward(x + a, params["norm1"], eps, "params['norm1']")
        c, _, ca = att.multi_head_attention_forward(x1, memory, memory, ca_p, num_heads,
                                                    memory_mask, memory_key_padding_mask,
                                                    need_weights=False)
        x2, n2 = _norm_forward(x1 + c, params["norm2"], eps, "params['norm2']")
        f, ff = _feed_forward(x2, params["ff"], activation, "params['ff']")
        out, n3 = _norm_forward(x2 + f, params["norm3"], eps, "params['norm3']")
    return out, DecoderLayerCache(bool(norm_first), params, sa, n1, ca, n2, ff, n3)


def decoder_layer_backward(dout, cache: DecoderLayerCache):
    """Gradients of :func:`decoder_layer_forward`.

    The memory feeds the keys and the values of the cross-attention: ``dmemory = dkey + dvalue``.

    Returns:
        dx (B, T, E), dmemory (B, S, E), grads (nested like params).
    """
    v.cache_of(cache, "decoder_layer_backward", DecoderLayerCache)
    v.grad_like(dout, "dout", cache.norm1.xhat.shape, cache.norm1.xhat.dtype)  # x's
    p = cache.params
    if cache.norm_first:  # out = x2 + FF(norm3(x2)), x2 = x1 + CA(norm2(x1)), x1 = x + SA(..)
        dh, g_ff = feed_forward_backward(dout, cache.ff)
        dx2, g_n3 = _norm_backward(dh, cache.norm3)
        dx2 += dout
        dh, dmemory, dvalue, g_ca = att.multi_head_attention_backward(dx2, cache.cross_attn,
                                                                       p["cross_attn"])
        dmemory += dvalue
        dx1, g_n2 = _norm_backward(dh, cache.norm2)
        dx1 += dx2
        dh, g_sa = att.self_attention_backward(dx1, cache.self_attn, p["self_attn"])
        dx, g_n1 = _norm_backward(dh, cache.norm1)
        dx += dx1
    else:  # out = norm3(x2 + FF(x2)), x2 = norm2(x1 + CA(x1)), x1 = norm1(x + SA(x))
        ds, g_n3 = _norm_backward(dout, cache.norm3)  # d(x2 + FF(x2))
        dx2, g_ff = feed_forward_backward(ds, cache.ff)
        dx2 += ds
        ds, g_n2 = _norm_backward(dx2, cache.norm2)  # d(x1 + CA(x1))
        dx1, dmemory, dvalue, g_ca = att.multi_head_attention_backward(ds, cache.cross_attn,
                                                                        p["cross_attn"])
        dmemory += dvalue
        dx1 += ds
        ds, g_n1 = _norm_backward(dx1, cache.norm1)  # d(x + SA(x))
        dx, g_sa = att.self_attention_backward(ds, cache.self_attn, p["self_attn"])
        dx += ds
    grads = {"self_attn": g_sa, "cross_attn": g_ca, "ff": g_ff, "norm1": g_n1, "norm2": g_n2,
             "norm3": g_n3}
    return dx, dmemory, grads


# --------------------------------------------------------------------------------------------
# Stacks of layers (nn.TransformerEncoder / nn.TransformerDecoder)


class StackCache(NamedTuple):
    kind: str  # "encoder" or "decoder"
    layers: list  # one EncoderLayerCache / DecoderLayerCache per layer
    norm: L.LayerNormCache | None


def _check_stack(params) -> None:
    if not isinstance(params, Mapping) or not isinstance(params.get("layers"), (list, tuple)) \
            or not params["layers"]:
        raise ValueError('params must be a dict {"layers": [layer params, ...] (at least one), '
                         '"norm": <layer norm params> or None}')


def encoder_forward(x, params: dict, num_heads: int, mask=None, key_padding_mask=None,
                    norm_first: bool = False, activation: str = "relu", eps: float = 1e-5):
    """N encoder layers, then an optional final layer norm (``params["norm"]``, may be None).

    Returns:
        out: (B, T, E); cache.
    """
    _check_stack(params)
    caches = []
    for p in params["layers"]:
        x, c = encoder_layer_forward(x, p, num_heads, mask, key_padding_mask, norm_first,
                                     activation, eps)
        caches.append(c)
    ncache = None
    if params.get("norm") is not None:
        x, ncache = _norm_forward(x, params["norm"], eps, "params['norm']")
    return x, StackCache("encoder", caches, ncache)


def encoder_backward(dout, cache: StackCache):
    """Gradients of :func:`encoder_forward`: dx and grads ``{"layers": [...], "norm": ...}``."""
    _check_stack_backward(dout, cache, "encoder")
    grads = {"layers": [None] * len(cache.layers), "norm": None}
    if cache.norm is not None:
        dout, grads["norm"] = _norm_backward(dout, cache.norm)
    for i in reversed(range(len(cache.layers))):
        dout, grads["layers"][i] = encoder_layer_backward(dout, cache.layers[i])
    return dout, grads


def decoder_forward(x, memory, params: dict, num_heads: int, tgt_mask=None, memory_mask=None,
                    tgt_key_padding_mask=None, memory_key_padding_mask=None,
                    norm_first: bool = False, activation: str = "relu", eps: float = 1e-5):
    """N decoder layers over the same memory, then an optional final layer norm.

    Returns:
        out: (B, T, E); cache.
    """
    _check_stack(params)
    caches = []
    for p in params["layers"]:
        x, c = decoder_layer_forward(x, memory, p, num_heads, tgt_mask, memory_mask,
                                     tgt_key_padding_mask, memory_key_padding_mask, norm_first,
                                     activation, eps)
        caches.append(c)
    ncache = None
    if params.get("norm") is not None:
        x, ncache = _norm_forward(x, params["norm"], eps, "params['norm']")
    return x, StackCache("decoder", caches, ncache)


def decoder_backward(dout, cache: StackCache):
    """Gradients of :func:`decoder_forward`: dx, dmemory (summed over the layers) and grads."""
    _check_stack_backward(dout, cache, "decoder")
    grads = {"layers": [None] * len(cache.layers), "norm": None}
    if cache.norm is not None:
        dout, grads["norm"] = _norm_backward(dout, cache.norm)
    dmemory = None
    for i in reversed(range(len(cache.layers))):
        dout, dmem, grads["layers"][i] = decoder_layer_backward(dout, cache.layers[i])
        if dmemory is None:
            dmemory = dmem
        else:
            dmemory += dmem
    return dout, dmemory, grads


def _check_stack_backward(dout, cache, kind: str) -> None:
    v.cache_of(cache, f"{kind}_backward", StackCache)
    if cache.kind != kind:
        raise ValueError(f"{kind}_backward: cache comes from {cache.kind}_forward")
    x_like = cache.layers[0].norm1.xhat  # the stack's output has the shape and dtype of x
    v.grad_like(dout, "dout", x_like.shape, x_like.dtype)


# --------------------------------------------------------------------------------------------
# Initialisation (deterministic: rng defaults to np.random.default_rng(0))


def layer_norm_init(d: int, bias: bool = True, dtype=np.float32) -> dict:
    """``{"gamma": ones, "beta": zeros}`` (no beta without bias), like ``nn.LayerNorm``."""
    d = v.positive_int(d, "d")
    dtype = v.float_dtype(dtype, "dtype")
    p = {"gamma": np.ones(d, dtype)}
    if v.boolean(bias, "bias"):
        p["beta"] = np.zeros(d, dtype)
    return p


def _rng(rng) -> np.random.Generator:
    return np.random.default_rng(0) if rng is None else v.generator(rng, "rng")


def feed_forward_init(d_model: int, d_ff: int, bias: bool = True, rng=None,
                      dtype=np.float32) -> dict:
    """Feed-forward parameters, uniform(+-1/sqrt(fan_in)) like ``nn.Linear``.

    ``rng``: a ``np.random.Generator``; default ``np.random.default_rng(0)`` (two calls without
    one give the same parameters).
    """
    d_model = v.positive_int(d_model, "d_model")
    d_ff = v.positive_int(d_ff, "d_ff")
    dtype = v.float_dtype(dtype, "dtype")
    rng = _rng(rng)

    def uniform(fan_in, shape):
        a = 1.0 / np.sqrt(fan_in)
        return rng.uniform(-a, a, size=shape).astype(dtype)

    p = {"W1": uniform(d_model, (d_model, d_ff)), "W2": uniform(d_ff, (d_ff, d_model))}
    if v.boolean(bias, "bias"):
        p["b1"] = uniform(d_model, (d_ff,))
        p["b2"] = uniform(d_ff, (d_model,))
    return p


def encoder_layer_init(d_model: int, num_heads: int, d_ff: int, bias: bool = True, rng=None,
                       dtype=np.float32, packed: bool = True) -> dict:
    """Parameters of one encoder layer (self-attention packed by default, as PyTorch stores it).

    ``rng``: default ``np.random.default_rng(0)``.
    """
    rng = _rng(rng)
    return {"self_attn": att.mha_init(d_model, num_heads, bias=bias, packed=packed, rng=rng,
                                      dtype=dtype),
            "ff": feed_forward_init(d_model, d_ff, bias, rng, dtype),
            "norm1": layer_norm_init(d_model, bias, dtype),
            "norm2": layer_norm_init(d_model, bias, dtype)}


def decoder_layer_init(d_model: int, num_heads: int, d_ff: int, bias: bool = True, rng=None,
                       dtype=np.float32, packed: bool = True) -> dict:
    """Parameters of one decoder layer. ``rng``: default ``np.random.default_rng(0)``."""
    rng = _rng(rng)
    return {"self_attn": att.mha_init(d_model, num_heads, bias=bias, packed=packed, rng=rng,
                                      dtype=dtype),
            "cross_attn": att.mha_init(d_model, num_heads, bias=bias, packed=False, rng=rng,
                                       dtype=dtype),
            "ff": feed_forward_init(d_model, d_ff, bias, rng, dtype),
            "norm1": layer_norm_init(d_model, bias, dtype),
            "norm2": layer_norm_init(d_model, bias, dtype),
            "norm3": layer_norm_init(d_model, bias, dtype)}
