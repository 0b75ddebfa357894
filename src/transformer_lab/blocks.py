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
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from transformer_lab import _validate as v
from transformer_lab import attention as att
from transformer_lab import layers as L

# --------------------------------------------------------------------------------------------
# Feed-forward


class FeedForwardCache(NamedTuple):
    lin1: L.LinearCache
    act: tuple
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
    h, c1 = L.linear_forward(x, params["W1"], params.get("b1"))
    if activation == "relu":
        # h belongs to this function alone: apply the ReLU in place, one (..., F) array fewer
        ca = ("relu", h > 0)
        a = np.maximum(h, 0, out=h)
    else:
        a, ca = L.activation_forward(h, activation)
    out, c2 = L.linear_forward(a, params["W2"], params.get("b2"))
    return out, FeedForwardCache(c1, ca, c2)


def feed_forward_backward(dout: np.ndarray, cache: FeedForwardCache):
    """Gradients of :func:`feed_forward_forward`: dx (..., E) and grads (keys of params)."""
    v.cache_of(cache, "feed_forward_backward", FeedForwardCache)
    da, dW2, db2 = L.linear_backward(dout, cache.lin2)
    if cache.act[0] == "relu":
        dh = np.multiply(da, cache.act[1], out=da)  # da is a fresh array: ReLU's mask in place
    else:
        dh = L.activation_backward(da, cache.act)
    dx, dW1, db1 = L.linear_backward(dh, cache.lin1)
    grads = {"W1": dW1, "W2": dW2}
    if db1 is not None:
        grads["b1"] = db1
    if db2 is not None:
        grads["b2"] = db2
    return dx, grads


def _norm_forward(x, p, eps):
    return L.layer_norm_forward(x, p.get("gamma"), p.get("beta"), eps)


def _norm_backward(dout, cache):
    dx, dgamma, dbeta = L.layer_norm_backward(dout, cache)
    grads = {}
    if dgamma is not None:
        grads["gamma"] = dgamma
    if dbeta is not None:
        grads["beta"] = dbeta
    return dx, grads


# --------------------------------------------------------------------------------------------
# Residual sublayers: the post-norm / pre-norm wiring shared by encoder and decoder layers


class ResidualCache(NamedTuple):
    norm_first: bool
    norm: L.LayerNormCache
    sub: object
    sub_backward: object  # function (dout, cache) -> (dx..., grads)


def _residual_forward(x, norm_params, eps, norm_first, sublayer):
    """``x + sublayer(norm(x))`` (pre-norm) or ``norm(x + sublayer(x))`` (post-norm).

    ``sublayer(h) -> (out, cache, backward)``; ``backward(dout, cache) -> (dh, extra, grads)``
    where ``extra`` are gradients of other inputs (e.g. the encoder memory) or None.
    """
    if norm_first:
        h, ncache = _norm_forward(x, norm_params, eps)
        out, scache, back = sublayer(h)
        return x + out, ResidualCache(True, ncache, scache, back)
    out, scache, back = sublayer(x)
    y, ncache = _norm_forward(x + out, norm_params, eps)
    return y, ResidualCache(False, ncache, scache, back)


def _residual_backward(dout, cache: ResidualCache):
    """Returns dx, extra (from the sublayer), sublayer grads, norm grads."""
    if cache.norm_first:
        dh, extra, sgrads = cache.sub_backward(dout, cache.sub)
        dxn, ngrads = _norm_backward(dh, cache.norm)
        return dout + dxn, extra, sgrads, ngrads
    dsum, ngrads = _norm_backward(dout, cache.norm)
    dh, extra, sgrads = cache.sub_backward(dsum, cache.sub)
    return dsum + dh, extra, sgrads, ngrads


def _self_attention_sublayer(params, num_heads, attn_mask, key_padding_mask):
    def forward(h):
        out, _, cache = att._self_attention_forward(h, params, num_heads, attn_mask,
                                                    key_padding_mask, True, need_weights=False)
        return out, cache, backward

    def backward(dout, cache):
        dh, grads = att.self_attention_backward(dout, cache, params)
        return dh, None, grads

    return forward


def _cross_attention_sublayer(memory, params, num_heads, attn_mask, key_padding_mask):
    def forward(h):
        out, _, cache = att._multi_head_attention_forward(h, memory, memory, params, num_heads,
                                                          attn_mask, key_padding_mask, True,
                                                          need_weights=False)
        return out, cache, backward

    def backward(dout, cache):
        dh, dkey, dvalue, grads = att.multi_head_attention_backward(dout, cache, params)
        return dh, dkey + dvalue, grads

    return forward


def _feed_forward_sublayer(params, activation):
    def forward(h):
        out, cache = feed_forward_forward(h, params, activation)
        return out, cache, backward

    def backward(dout, cache):
        dh, grads = feed_forward_backward(dout, cache)
        return dh, None, grads

    return forward


# --------------------------------------------------------------------------------------------
# Encoder and decoder layers


class LayerCache(NamedTuple):
    kind: str  # "encoder" or "decoder"
    sublayers: tuple  # ((name, norm name, ResidualCache), ...)


def _check_layer(x, num_heads, activation):
    x = v.float_array(x, "x", ndim=3)
    if activation not in ("relu", "gelu", "gelu_tanh"):
        raise ValueError(f'activation must be "relu", "gelu" or "gelu_tanh", got {activation!r}')
    return x


def encoder_layer_forward(x, params: dict, num_heads: int, attn_mask=None,
                          key_padding_mask=None, norm_first: bool = False,
                          activation: str = "relu", eps: float = 1e-5):
    """One encoder layer: self-attention, then feed-forward, each with residual and layer norm.

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
    x = _check_layer(x, num_heads, activation)
    subs = []
    for name, norm, sub in (
        ("self_attn", "norm1", _self_attention_sublayer(params["self_attn"], num_heads,
                                                         attn_mask, key_padding_mask)),
        ("ff", "norm2", _feed_forward_sublayer(params["ff"], activation)),
    ):
        x, c = _residual_forward(x, params[norm], eps, norm_first, sub)
        subs.append((name, norm, c))
    return x, LayerCache("encoder", tuple(subs))


def encoder_layer_backward(dout, cache: LayerCache):
    """Gradients of :func:`encoder_layer_forward`: dx (B, T, E) and grads (nested like params)."""
    dx, _, grads = _layer_backward(dout, cache, "encoder")
    return dx, grads


def decoder_layer_forward(x, memory, params: dict, num_heads: int, tgt_mask=None,
                          memory_mask=None, tgt_key_padding_mask=None,
                          memory_key_padding_mask=None, norm_first: bool = False,
                          activation: str = "relu", eps: float = 1e-5):
    """One decoder layer: masked self-attention, cross-attention to the memory, feed-forward.

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
    x = _check_layer(x, num_heads, activation)
    subs = []
    for name, norm, sub in (
        ("self_attn", "norm1", _self_attention_sublayer(params["self_attn"], num_heads,
                                                         tgt_mask, tgt_key_padding_mask)),
        ("cross_attn", "norm2", _cross_attention_sublayer(memory, params["cross_attn"],
                                                           num_heads, memory_mask,
                                                           memory_key_padding_mask)),
        ("ff", "norm3", _feed_forward_sublayer(params["ff"], activation)),
    ):
        x, c = _residual_forward(x, params[norm], eps, norm_first, sub)
        subs.append((name, norm, c))
    return x, LayerCache("decoder", tuple(subs))


def decoder_layer_backward(dout, cache: LayerCache):
    """Gradients of :func:`decoder_layer_forward`: dx (B, T, E), dmemory (B, S, E), grads."""
    return _layer_backward(dout, cache, "decoder")


def _layer_backward(dout, cache: LayerCache, kind: str):
    v.cache_of(cache, f"{kind}_layer_backward", LayerCache)
    if cache.kind != kind:
        raise ValueError(f"{kind}_layer_backward: cache comes from {cache.kind}_layer_forward")
    grads, dmemory = {}, None
    for name, norm, c in reversed(cache.sublayers):
        dout, extra, grads[name], grads[norm] = _residual_backward(dout, c)
        if extra is not None:
            dmemory = extra
    return dout, dmemory, grads


# --------------------------------------------------------------------------------------------
# Stacks of layers (nn.TransformerEncoder / nn.TransformerDecoder)


class StackCache(NamedTuple):
    kind: str
    layers: list
    norm: L.LayerNormCache | None


def encoder_forward(x, params: dict, num_heads: int, mask=None, key_padding_mask=None,
                    norm_first: bool = False, activation: str = "relu", eps: float = 1e-5):
    """N encoder layers, then an optional final layer norm (``params["norm"]``, may be None).

    Returns:
        out: (B, T, E); cache.
    """
    caches = []
    for p in params["layers"]:
        x, c = encoder_layer_forward(x, p, num_heads, mask, key_padding_mask, norm_first,
                                     activation, eps)
        caches.append(c)
    ncache = None
    if params.get("norm") is not None:
        x, ncache = _norm_forward(x, params["norm"], eps)
    return x, StackCache("encoder", caches, ncache)


def encoder_backward(dout, cache: StackCache):
    """Gradients of :func:`encoder_forward`: dx and grads ``{"layers": [...], "norm": ...}``."""
    dx, _, grads = _stack_backward(dout, cache, "encoder")
    return dx, grads


def decoder_forward(x, memory, params: dict, num_heads: int, tgt_mask=None, memory_mask=None,
                    tgt_key_padding_mask=None, memory_key_padding_mask=None,
                    norm_first: bool = False, activation: str = "relu", eps: float = 1e-5):
    """N decoder layers over the same memory, then an optional final layer norm.

    Returns:
        out: (B, T, E); cache.
    """
    caches = []
    for p in params["layers"]:
        x, c = decoder_layer_forward(x, memory, p, num_heads, tgt_mask, memory_mask,
                                     tgt_key_padding_mask, memory_key_padding_mask, norm_first,
                                     activation, eps)
        caches.append(c)
    ncache = None
    if params.get("norm") is not None:
        x, ncache = _norm_forward(x, params["norm"], eps)
    return x, StackCache("decoder", caches, ncache)


def decoder_backward(dout, cache: StackCache):
    """Gradients of :func:`decoder_forward`: dx, dmemory (summed over the layers) and grads."""
    return _stack_backward(dout, cache, "decoder")


def _stack_backward(dout, cache: StackCache, kind: str):
    v.cache_of(cache, f"{kind}_backward", StackCache)
    if cache.kind != kind:
        raise ValueError(f"{kind}_backward: cache comes from {cache.kind}_forward")
    grads = {"layers": [None] * len(cache.layers), "norm": None}
    if cache.norm is not None:
        dout, grads["norm"] = _norm_backward(dout, cache.norm)
    dmemory = None
    for i in reversed(range(len(cache.layers))):
        dout, dmem, grads["layers"][i] = _layer_backward(dout, cache.layers[i], kind)
        if dmem is not None:
            dmemory = dmem if dmemory is None else dmemory + dmem
    return dout, dmemory, grads


# --------------------------------------------------------------------------------------------
# Initialisation


def layer_norm_init(d: int, bias: bool = True, dtype=np.float32) -> dict:
    """``{"gamma": ones, "beta": zeros}`` (no beta without bias), like ``nn.LayerNorm``."""
    p = {"gamma": np.ones(d, dtype)}
    if bias:
        p["beta"] = np.zeros(d, dtype)
    return p


def feed_forward_init(d_model: int, d_ff: int, bias: bool = True, rng=None,
                      dtype=np.float32) -> dict:
    """Feed-forward parameters, uniform(±1/sqrt(fan_in)) like ``nn.Linear``."""
    rng = rng if rng is not None else np.random.default_rng()

    def uniform(fan_in, shape):
        a = 1.0 / np.sqrt(fan_in)
        return rng.uniform(-a, a, size=shape).astype(dtype)

    p = {"W1": uniform(d_model, (d_model, d_ff)), "W2": uniform(d_ff, (d_ff, d_model))}
    if bias:
        p["b1"] = uniform(d_model, (d_ff,))
        p["b2"] = uniform(d_ff, (d_model,))
    return p


def encoder_layer_init(d_model: int, num_heads: int, d_ff: int, bias: bool = True, rng=None,
                       dtype=np.float32, packed: bool = True) -> dict:
    """Parameters of one encoder layer (self-attention packed by default, as PyTorch stores it)."""
    rng = rng if rng is not None else np.random.default_rng()
    return {"self_attn": att.mha_init(d_model, num_heads, bias=bias, packed=packed, rng=rng,
                                      dtype=dtype),
            "ff": feed_forward_init(d_model, d_ff, bias, rng, dtype),
            "norm1": layer_norm_init(d_model, bias, dtype),
            "norm2": layer_norm_init(d_model, bias, dtype)}


def decoder_layer_init(d_model: int, num_heads: int, d_ff: int, bias: bool = True, rng=None,
                       dtype=np.float32, packed: bool = True) -> dict:
    """Parameters of one decoder layer."""
    rng = rng if rng is not None else np.random.default_rng()
    return {"self_attn": att.mha_init(d_model, num_heads, bias=bias, packed=packed, rng=rng,
                                      dtype=dtype),
            "cross_attn": att.mha_init(d_model, num_heads, bias=bias, packed=False, rng=rng,
                                       dtype=dtype),
            "ff": feed_forward_init(d_model, d_ff, bias, rng, dtype),
            "norm1": layer_norm_init(d_model, bias, dtype),
            "norm2": layer_norm_init(d_model, bias, dtype),
            "norm3": layer_norm_init(d_model, bias, dtype)}
