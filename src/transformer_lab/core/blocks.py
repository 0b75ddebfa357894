"""Transformer blocks: the feed-forward network, residual connections, encoder and decoder
layers, and stacks of them -- ``nn.TransformerEncoderLayer`` ... ``nn.TransformerDecoder``
without dropout, batch-first.

Parameters are nested dicts, and gradients come back nested the same way:

- feed-forward ``{"W1": (E, F), "b1": (F,), "W2": (F, E), "b2": (E,)}``;
- layer norm ``{"gamma": (E,), "beta": (E,)}``;
- encoder layer ``{"self_attn", "ff", "norm1", "norm2"}``; decoder layer ``{"self_attn",
  "cross_attn", "ff", "norm1", "norm2", "norm3"}`` (attention as in ``core.multihead``);
- a stack ``{"layers": [layer, ...], "norm": <layer norm> or None}``.

Biases (``b1``, ``b2``, ``beta``, ...) may be absent: a layer without biases has none.
Post-norm (the paper): ``x = norm(x + sublayer(x))``; pre-norm: ``x = x + sublayer(norm(x))``.
"""

from __future__ import annotations

import numpy as np  # noqa: F401 (the functions here compose others: np is yours to use)

from transformer_lab.core.layers import (
    activation_backward,
    activation_forward,
    layer_norm_backward,
    layer_norm_forward,
    linear_backward,
    linear_forward,
)
from transformer_lab.core.multihead import (
    multi_head_attention_backward,
    multi_head_attention_forward,
    self_attention_backward,
    self_attention_forward,
)

# --------------------------------------------------------------------------------------------
# Feed-forward network and residual connections (07_blocks; another norm: 13_gpt)


def feed_forward_forward(x, params, activation="relu"):
    """Position-wise feed-forward network ``act(x W1 + b1) W2 + b2``.

    x: (..., E); activation: "relu", "gelu" or "gelu_tanh"  ->  out: (..., E).
    """
    ### BEGIN SOLUTION 07 §2
    h, c1 = linear_forward(x, params["W1"], params.get("b1"))  # (..., F)
    a, c_act = activation_forward(h, activation)
    out, c2 = linear_forward(a, params["W2"], params.get("b2"))  # (..., E)
    ### END SOLUTION
    return out, (c1, c_act, c2)


def feed_forward_backward(dout, cache):
    """Gradients of :func:`feed_forward_forward`: dx (..., E), grads (the keys of params)."""
    c1, c_act, c2 = cache
    ### BEGIN SOLUTION 07 §2
    da, g2 = linear_backward(dout, c2)
    dh = activation_backward(da, c_act)
    dx, g1 = linear_backward(dh, c1)
    grads = {"W1": g1["W"], "W2": g2["W"]}
    if "b" in g1:  # each bias on its own: a layer may have one without the other
        grads["b1"] = g1["b"]
    if "b" in g2:
        grads["b2"] = g2["b"]
    ### END SOLUTION
    return dx, grads


def residual_forward(x, sublayer, norm, norm_first, eps=1e-5, normalize=None):
    """A sublayer with its residual connection and its norm.

    Pre-norm: ``x + sublayer(norm(x))``; post-norm: ``norm(x + sublayer(x))``.
    x: (B, T, E); sublayer: a function ``h -> (out, cache)``; norm: the norm's params (layer
    norm: gamma, optional beta); normalize: None for layer norm, or another norm
    ``(h, params, eps) -> (out, cache)`` (the GPT's, RMSNorm in notebook 15)  ->  out: (B, T, E).
    """
    ### BEGIN SOLUTION 07 §3, 13 §3
    def norm_of(h):  # (B, T, E) -> (B, T, E)
        if normalize is None:
            return layer_norm_forward(h, norm["gamma"], norm.get("beta"), eps)
        return normalize(h, norm, eps)

    if norm_first:
        h, c_norm = norm_of(x)
        y, c_sub = sublayer(h)
        out = x + y
    else:
        y, c_sub = sublayer(x)
        out, c_norm = norm_of(x + y)
    ### END SOLUTION
    return out, (norm_first, c_norm, c_sub)


def residual_backward(dout, cache, sublayer_backward, normalize_backward=layer_norm_backward):
    """Gradients of :func:`residual_forward`. Pre-norm: the identity path passes ``dout`` on
    unchanged, ``dx = dout + d(the path through the norm and the sublayer)``. Post-norm: the
    norm's backward comes first, ``ds = d(norm)``, then ``dx = ds + d(the sublayer path of ds)``.

    sublayer_backward: ``(dh, cache) -> (dh_in, *rest)``, the sublayer's backward;
    normalize_backward: the norm's backward ``(dout, cache) -> (dx, grads)`` (default layer norm's)
    ->  dx (B, T, E), the norm's grads, then ``rest`` (the sublayer's other gradients).
    """
    norm_first, c_norm, c_sub = cache
    ### BEGIN SOLUTION 07 §3, 13 §3
    if norm_first:  # out = x + sublayer(norm(x))
        dh, *rest = sublayer_backward(dout, c_sub)
        dx, g_norm = normalize_backward(dh, c_norm)
        dx += dout
    else:  # out = norm(s), s = x + sublayer(x)
        ds, g_norm = normalize_backward(dout, c_norm)
        dx, *rest = sublayer_backward(ds, c_sub)
        dx += ds
    ### END SOLUTION
    return dx, g_norm, *rest


# --------------------------------------------------------------------------------------------
# Encoder and decoder layers (07_blocks)


def encoder_layer_forward(x, params, num_heads, mask=None, norm_first=False, activation="relu",
                          eps=1e-5):
    """Self-attention, then the feed-forward network, each a residual sublayer.

    x: (B, T, E); mask: broadcastable to (B, H, T, T)  ->  out: (B, T, E).
    """
    ### BEGIN SOLUTION 07 §6
    def attend(h):
        return self_attention_forward(h, params["self_attn"], num_heads, mask)

    def feed(h):
        return feed_forward_forward(h, params["ff"], activation)

    x, c_sa = residual_forward(x, attend, params["norm1"], norm_first, eps)
    x, c_ff = residual_forward(x, feed, params["norm2"], norm_first, eps)
    ### END SOLUTION
    return x, (c_sa, c_ff)


def encoder_layer_backward(dout, cache):
    """Gradients of :func:`encoder_layer_forward`: dx (B, T, E), grads (nested like params)."""
    c_sa, c_ff = cache
    ### BEGIN SOLUTION 07 §6
    dx, g_norm2, g_ff = residual_backward(dout, c_ff, feed_forward_backward)
    dx, g_norm1, g_sa = residual_backward(dx, c_sa, self_attention_backward)
    ### END SOLUTION
    return dx, {"self_attn": g_sa, "ff": g_ff, "norm1": g_norm1, "norm2": g_norm2}


def decoder_layer_forward(x, memory, params, num_heads, tgt_mask=None, memory_mask=None,
                          norm_first=False, activation="relu", eps=1e-5):
    """Masked self-attention, cross-attention to the encoder's output, feed-forward.

    x: (B, T, E); memory: (B, S, E); tgt_mask: broadcastable to (B, H, T, T) (causal and
    padding); memory_mask: broadcastable to (B, H, T, S)  ->  out: (B, T, E).
    """
    ### BEGIN SOLUTION 07 §7
    def attend(h):
        return self_attention_forward(h, params["self_attn"], num_heads, tgt_mask)

    def cross(h):
        return multi_head_attention_forward(h, memory, memory, params["cross_attn"], num_heads,
                                            memory_mask)

    def feed(h):
        return feed_forward_forward(h, params["ff"], activation)

    x, c_sa = residual_forward(x, attend, params["norm1"], norm_first, eps)
    x, c_ca = residual_forward(x, cross, params["norm2"], norm_first, eps)
    x, c_ff = residual_forward(x, feed, params["norm3"], norm_first, eps)
    ### END SOLUTION
    return x, (c_sa, c_ca, c_ff)


def decoder_layer_backward(dout, cache):
    """Gradients of :func:`decoder_layer_forward`. The memory feeds the keys and the values of
    the cross-attention: ``dmemory = dkey + dvalue``.

    ->  dx (B, T, E), dmemory (B, S, E), grads (nested like params).
    """
    c_sa, c_ca, c_ff = cache
    ### BEGIN SOLUTION 07 §7
    dx, g_norm3, g_ff = residual_backward(dout, c_ff, feed_forward_backward)
    dx, g_norm2, dkey, dvalue, g_ca = residual_backward(dx, c_ca, multi_head_attention_backward)
    dx, g_norm1, g_sa = residual_backward(dx, c_sa, self_attention_backward)
    dmemory = dkey + dvalue
    ### END SOLUTION
    grads = {"self_attn": g_sa, "cross_attn": g_ca, "ff": g_ff,
             "norm1": g_norm1, "norm2": g_norm2, "norm3": g_norm3}
    return dx, dmemory, grads


# --------------------------------------------------------------------------------------------
# Stacks (08_transformer)


def encoder_forward(x, params, num_heads, mask=None, norm_first=False, activation="relu",
                    eps=1e-5):
    """N encoder layers, then the final layer norm if ``params["norm"]`` is not None.

    x: (B, S, E)  ->  out: (B, S, E).
    """
    ### BEGIN SOLUTION 08 §2
    caches = []
    for layer in params["layers"]:
        x, cache = encoder_layer_forward(x, layer, num_heads, mask, norm_first, activation, eps)
        caches.append(cache)
    c_norm = None
    if params["norm"] is not None:
        x, c_norm = layer_norm_forward(x, params["norm"]["gamma"], params["norm"].get("beta"),
                                       eps)
    ### END SOLUTION
    return x, (caches, c_norm)


def encoder_backward(dout, cache):
    """Gradients of :func:`encoder_forward`: dx (B, S, E), grads ``{"layers": [...], "norm"}``."""
    caches, c_norm = cache
    ### BEGIN SOLUTION 08 §2
    g_norm = None
    if c_norm is not None:
        dout, g_norm = layer_norm_backward(dout, c_norm)
    g_layers = []
    for cache in reversed(caches):
        dout, g = encoder_layer_backward(dout, cache)
        g_layers.insert(0, g)
    ### END SOLUTION
    return dout, {"layers": g_layers, "norm": g_norm}


def decoder_forward(x, memory, params, num_heads, tgt_mask=None, memory_mask=None,
                    norm_first=False, activation="relu", eps=1e-5):
    """N decoder layers reading the same memory, then the final layer norm if any.

    x: (B, T, E); memory: (B, S, E)  ->  out: (B, T, E).
    """
    ### BEGIN SOLUTION 08 §2
    caches = []
    for layer in params["layers"]:
        x, cache = decoder_layer_forward(x, memory, layer, num_heads, tgt_mask, memory_mask,
                                         norm_first, activation, eps)
        caches.append(cache)
    c_norm = None
    if params["norm"] is not None:
        x, c_norm = layer_norm_forward(x, params["norm"]["gamma"], params["norm"].get("beta"),
                                       eps)
    ### END SOLUTION
    return x, (caches, c_norm)


def decoder_backward(dout, cache):
    """Gradients of :func:`decoder_forward`. Every layer reads the memory, so its gradient is
    the sum over the layers.  ->  dx (B, T, E), dmemory (B, S, E), grads."""
    caches, c_norm = cache
    ### BEGIN SOLUTION 08 §2
    g_norm = None
    if c_norm is not None:
        dout, g_norm = layer_norm_backward(dout, c_norm)
    g_layers, dmemory = [], 0
    for cache in reversed(caches):
        dout, dmem, g = decoder_layer_backward(dout, cache)
        dmemory = dmemory + dmem
        g_layers.insert(0, g)
    ### END SOLUTION
    return dout, dmemory, {"layers": g_layers, "norm": g_norm}
