"""The decoder-only language model (GPT), built from the pieces of notebooks 00-08 (09_gpt).

    ids (B, T) -> token embedding (+ positions) -> N pre-norm blocks -> norm -> x @ W_emb^T
               -> logits (B, T, V): position t predicts the token at t + 1

A block is ``x = x + attn(norm1(x))``, then ``x = x + mlp(norm2(x))``, with a causal
self-attention. Two kinds of block, chosen by the attributes of ``config``:

- the 2017 / GPT-2 block: ``norm="layer"`` (layer norm), ``mlp="gelu_tanh"`` (the
  feed-forward network of ``core.blocks`` with GELU, GPT-2's tanh form), absolute positions
  added to the embeddings, every key and value head its own (``num_kv_heads == num_heads``);
- the modern (LLaMA-style) block: ``norm="rms"`` (RMSNorm), ``mlp="swiglu"``, rotary position
  embeddings (RoPE) applied to the queries and keys, grouped-query attention
  (``num_kv_heads`` key/value heads shared by ``num_heads / num_kv_heads`` query heads each).

``config`` is anything with the attributes ``num_heads``, ``num_kv_heads``, ``norm``, ``mlp``
and ``eps`` (a ``transformer_lab.gpt.GPTConfig``). Parameters are nested dicts:

- attention ``{"W_qkv": (E, (H + 2 Hkv) Dh), "W_o": (E, E)}`` (+ ``b_qkv``, ``b_o``): the query,
  key and value projections side by side, ``E = H Dh`` query columns then ``Hkv Dh`` key and
  ``Hkv Dh`` value columns (with ``Hkv = H`` this is ``core.multihead``'s packed layout);
- norm ``{"gamma"}`` (+ ``"beta"`` for a layer norm with bias); MLP ``{"W1", "b1", "W2",
  "b2"}`` (as ``core.blocks.feed_forward_forward``); SwiGLU ``{"W_gate", "W_up", "W_down"}``;
- block ``{"norm1", "attn", "norm2", "mlp"}``; model ``{"embed": {"W": (V, E)}, "layers":
  [block, ...], "norm": <norm>}`` plus ``{"pos": {"W": (L, E)}}`` for learned positions. The
  output projection is the embedding table itself (tied): its gradient is the sum of the two.

Shapes: ``B`` batch, ``T`` positions, ``E`` width, ``H`` query heads, ``Hkv`` key/value heads,
``Dh = E / H``, ``F`` hidden width of the MLP, ``V`` vocabulary, ``S`` cached positions.
"""

from __future__ import annotations

import numpy as np

from transformer_lab.core.attention import attention_backward, attention_forward, causal_mask
from transformer_lab.core.blocks import feed_forward_backward, feed_forward_forward
from transformer_lab.core.flash import flash_attention_backward, flash_attention_forward
from transformer_lab.core.layers import (
    cross_entropy_backward,
    cross_entropy_forward,
    layer_norm_backward,
    layer_norm_forward,
    linear_backward,
    linear_forward,
    softmax_forward,
    tied_output_backward,
    tied_output_forward,
)
from transformer_lab.core.model import embed_backward, embed_forward
from transformer_lab.core.multihead import merge_heads, split_heads

# --------------------------------------------------------------------------------------------
# The next-token loss (09_gpt §2)


def next_token_loss_forward(logits, ids):
    """Mean cross-entropy of predicting every next token: the logits at position ``t`` are
    scored against ``ids[:, t + 1]``; the last position has no next token and does not count.

    logits: (B, T, V), computed from ids: (B, T)  ->  loss: a float, the mean over B (T - 1).
    """
    loss, c_ce = cross_entropy_forward(logits[:, :-1], ids[:, 1:])  # (B, T-1, V) vs (B, T-1)
    return loss, (c_ce, logits.shape)


def next_token_loss_backward(dloss, cache):
    """Gradient of :func:`next_token_loss_forward`: dlogits (B, T, V), zero at the last position.
    """
    c_ce, shape = cache
    d_shifted = cross_entropy_backward(dloss, c_ce)  # (B, T-1, V)
    dlogits = np.zeros(shape, dtype=d_shifted.dtype)
    dlogits[:, :-1] = d_shifted
    return dlogits


# --------------------------------------------------------------------------------------------
# Rotary position embeddings, RoPE (09_gpt §7)


def rope_tables(positions, head_dim, base=10000.0):
    """The rotation angles ``p * omega_i`` of RoPE, ``omega_i = base^(-2i / Dh)`` (notebook 06's
    frequencies), as their cosines and sines, float64.

    positions: integers (T,); head_dim: Dh, even  ->  cos, sin: (T, Dh/2).
    """
    omega = base ** (-np.arange(0, head_dim, 2) / head_dim)  # (Dh/2,)
    angles = np.asarray(positions, dtype=np.float64)[:, None] * omega  # (T, Dh/2)
    return np.cos(angles), np.sin(angles)


def rope_forward(x, cos, sin):
    """Rotate each pair of features ``(x_2i, x_2i+1)`` of position ``p`` by the angle
    ``p * omega_i``, with notebook 06's rotation ``R(a) = [[cos a, sin a], [-sin a, cos a]]``.

    x: (..., T, Dh); cos, sin: (T, Dh/2) from :func:`rope_tables`  ->  out: (..., T, Dh).
    """
    x0, x1 = x[..., 0::2], x[..., 1::2]  # (..., T, Dh/2) each
    out = np.empty_like(x)
    out[..., 0::2] = x0 * cos + x1 * sin
    out[..., 1::2] = x1 * cos - x0 * sin
    return out, (cos, sin)


def rope_backward(dout, cache):
    """Gradient of :func:`rope_forward`: a rotation's transpose is its inverse, the rotation by
    minus the angle.  dout: (..., T, Dh)  ->  dx: (..., T, Dh).
    """
    cos, sin = cache
    d0, d1 = dout[..., 0::2], dout[..., 1::2]
    dx = np.empty_like(dout)
    dx[..., 0::2] = d0 * cos - d1 * sin
    dx[..., 1::2] = d1 * cos + d0 * sin
    return dx


# --------------------------------------------------------------------------------------------
# RMSNorm and SwiGLU (09_gpt §7)


def rms_norm_forward(x, gamma, eps=1e-5):
    """RMSNorm over the last axis: ``out = x / sqrt(mean(x^2) + eps) * gamma`` -- a layer norm
    without the mean and without a bias.  x: (..., D); gamma: (D,)  ->  out: (..., D).
    """
    d = x.shape[-1]
    rstd = 1 / np.sqrt(np.einsum("...j,...j->...", x, x)[..., None] / d + eps)  # (..., 1)
    xhat = x * rstd
    out = xhat * gamma
    return out, (xhat, rstd, gamma)


def rms_norm_backward(dout, cache):
    """Gradients of :func:`rms_norm_forward`. With ``g = dout * gamma``:
    ``dx = rstd * (g - xhat * mean(g * xhat))``, ``dgamma = sum(dout * xhat)``.

    dout: (..., D)  ->  dx: (..., D), grads: {"gamma": (D,)}.
    """
    xhat, rstd, gamma = cache
    d = xhat.shape[-1]
    dgamma = (dout * xhat).reshape(-1, d).sum(axis=0)
    g = dout * gamma
    mean_gx = np.einsum("...j,...j->...", g, xhat)[..., None] / d  # (..., 1)
    dx = g - xhat * mean_gx
    dx *= rstd
    return dx, {"gamma": dgamma}


def silu_forward(x):
    """SiLU (swish), ``x * sigmoid(x)``; the sigmoid as ``(1 + tanh(x/2)) / 2``, which cannot
    overflow.  x: any shape  ->  out: the same shape."""
    s = 0.5 * (1 + np.tanh(0.5 * x))  # sigmoid(x)
    return x * s, (x, s)


def silu_backward(dout, cache):
    """Gradient of :func:`silu_forward`: ``sigmoid(x) * (1 + x * (1 - sigmoid(x)))``."""
    x, s = cache
    return dout * s * (1 + x * (1 - s))


def swiglu_forward(x, params):
    """The SwiGLU feed-forward network: ``(silu(x W_gate) * (x W_up)) W_down``.

    x: (..., E); params: W_gate (E, F), W_up (E, F), W_down (F, E)  ->  out: (..., E).
    """
    a, c_gate = linear_forward(x, params["W_gate"])  # (..., F)
    u, c_up = linear_forward(x, params["W_up"])  # (..., F)
    s, c_silu = silu_forward(a)
    out, c_down = linear_forward(s * u, params["W_down"])  # (..., E)
    return out, (c_gate, c_up, c_silu, s, u, c_down)


def swiglu_backward(dout, cache):
    """Gradients of :func:`swiglu_forward`: ``x`` feeds the gate and the up projection, so its
    gradient is the sum of the two paths.  ->  dx (..., E), grads (the keys of params)."""
    c_gate, c_up, c_silu, s, u, c_down = cache
    dh, g_down = linear_backward(dout, c_down)  # (..., F)
    da = silu_backward(dh * u, c_silu)
    dx, g_gate = linear_backward(da, c_gate)
    dx_up, g_up = linear_backward(dh * s, c_up)
    dx += dx_up
    return dx, {"W_gate": g_gate["W"], "W_up": g_up["W"], "W_down": g_down["W"]}


# --------------------------------------------------------------------------------------------
# Grouped-query attention and the causal self-attention of a block (09_gpt §3; GQA, RoPE: §7)


def repeat_kv_forward(x, n_rep):
    """Give each key/value head to ``n_rep`` query heads: head ``j`` of the output is head
    ``j // n_rep`` of the input.  x: (B, Hkv, S, Dh)  ->  out: (B, Hkv * n_rep, S, Dh).
    """
    if n_rep == 1:
        return x, n_rep
    B, Hkv, S, Dh = x.shape
    out = np.broadcast_to(x[:, :, None], (B, Hkv, n_rep, S, Dh))  # a view, no copy yet
    return out.reshape(B, Hkv * n_rep, S, Dh), n_rep


def repeat_kv_backward(dout, cache):
    """Gradient of :func:`repeat_kv_forward`: a shared head receives the sum of the gradients
    of the query heads it served.  dout: (B, H, S, Dh)  ->  dx: (B, H / n_rep, S, Dh)."""
    n_rep = cache
    if n_rep == 1:
        return dout
    B, H, S, Dh = dout.shape
    return dout.reshape(B, H // n_rep, n_rep, S, Dh).sum(axis=2)  # (B, Hkv, S, Dh)


def project_qkv(x, params, num_heads, num_kv_heads):
    """The queries, keys and values of ``x``, one product with the packed ``W_qkv``.

    x: (B, T, E)  ->  q: (B, H, T, Dh), k, v: (B, Hkv, T, Dh), and the linear map's cache.
    """
    E = x.shape[-1]
    kv = num_kv_heads * (E // num_heads)  # width of the keys (and of the values)
    qkv, c_qkv = linear_forward(x, params["W_qkv"], params.get("b_qkv"))  # (B, T, E + 2 kv)
    q = split_heads(qkv[..., :E], num_heads)  # (B, H, T, Dh)
    k = split_heads(qkv[..., E:E + kv], num_kv_heads)  # (B, Hkv, T, Dh)
    v = split_heads(qkv[..., E + kv:], num_kv_heads)  # (B, Hkv, T, Dh)
    return q, k, v, c_qkv


def causal_self_attention_forward(x, params, num_heads, num_kv_heads=None, rope=None,
                                  block_size=None):
    """Causal multi-head self-attention: position ``t`` attends to positions ``0 .. t``.

    x: (B, T, E); params: W_qkv, W_o (+ b_qkv, b_o); num_kv_heads: Hkv, dividing H (default H);
    rope: None, or ``(cos, sin)`` (T, Dh/2) to rotate the queries and keys; block_size: None
    for ``attention_forward`` with the causal mask, or an int for notebook 10's tiled
    ``flash_attention_forward`` with blocks of that size (the same result, to rounding)
    ->  out: (B, T, E).
    """
    num_kv_heads = num_kv_heads or num_heads
    q, k, v, c_qkv = project_qkv(x, params, num_heads, num_kv_heads)
    c_rope = None
    if rope is not None:
        q, c_rope = rope_forward(q, *rope)  # (B, H, T, Dh)
        k, _ = rope_forward(k, *rope)  # (B, Hkv, T, Dh), the same angles
    n_rep = num_heads // num_kv_heads
    if n_rep > 1:  # grouped-query attention: each key/value head serves n_rep query heads
        k, _ = repeat_kv_forward(k, n_rep)  # (B, H, T, Dh)
        v, _ = repeat_kv_forward(v, n_rep)
    if block_size is None:
        heads, c_att = attention_forward(q, k, v, causal_mask(x.shape[1]))  # (B, H, T, Dh)
    else:  # notebook 10: tiled, never forms the (T, T) scores
        heads, c_att = flash_attention_forward(q, k, v, True, block_size)  # (B, H, T, Dh)
    out, c_o = linear_forward(merge_heads(heads), params["W_o"], params.get("b_o"))  # (B, T, E)
    return out, (c_qkv, c_rope, n_rep, c_att, c_o, num_heads, block_size)


def causal_self_attention_backward(dout, cache):
    """Gradients of :func:`causal_self_attention_forward`.

    dout: (B, T, E)  ->  dx (B, T, E), grads (the keys of params).
    """
    c_qkv, c_rope, n_rep, c_att, c_o, num_heads, block_size = cache
    dheads, g_o = linear_backward(dout, c_o)  # (B, T, E)
    attention_grads = attention_backward if block_size is None else flash_attention_backward
    dq, dk, dv = attention_grads(split_heads(dheads, num_heads), c_att)  # (B, H, T, Dh)
    if n_rep > 1:  # a shared head sums the gradients of its query heads
        dk, dv = repeat_kv_backward(dk, n_rep), repeat_kv_backward(dv, n_rep)  # (B, Hkv, T, Dh)
    if c_rope is not None:
        dq, dk = rope_backward(dq, c_rope), rope_backward(dk, c_rope)
    dqkv = np.concatenate([merge_heads(dq), merge_heads(dk), merge_heads(dv)], axis=-1)
    dx, g_qkv = linear_backward(dqkv, c_qkv)  # dqkv: (B, T, E + 2 Hkv Dh)
    grads = {"W_qkv": g_qkv["W"], "W_o": g_o["W"]}
    if "b" in g_qkv:  # each bias on its own: a layer may have one without the other
        grads["b_qkv"] = g_qkv["b"]
    if "b" in g_o:
        grads["b_o"] = g_o["b"]
    return dx, grads


# --------------------------------------------------------------------------------------------
# The pre-norm block (09_gpt §3; RMSNorm and SwiGLU: §7)


def norm_forward(x, params, kind, eps=1e-5):
    """The block's normalisation: ``kind`` "layer" (layer norm, ``params`` gamma and optional
    beta) or "rms" (RMSNorm, gamma).  x: (..., E)  ->  out: (..., E)."""
    if kind == "rms":
        out, cache = rms_norm_forward(x, params["gamma"], eps)
    else:
        out, cache = layer_norm_forward(x, params["gamma"], params.get("beta"), eps)
    return out, (kind, cache)


def norm_backward(dout, cache):
    """Gradients of :func:`norm_forward`: dx (..., E), grads (the keys of params)."""
    kind, inner = cache
    if kind == "rms":
        return rms_norm_backward(dout, inner)
    return layer_norm_backward(dout, inner)


def mlp_forward(x, params, kind):
    """The block's feed-forward network: ``kind`` "swiglu", or an activation of
    ``core.layers.ACTIVATIONS`` ("gelu_tanh", "gelu", "relu") for ``core.blocks``' network.
    x: (..., E)  ->  out: (..., E)."""
    if kind == "swiglu":
        out, cache = swiglu_forward(x, params)
    else:
        out, cache = feed_forward_forward(x, params, kind)
    return out, (kind, cache)


def mlp_backward(dout, cache):
    """Gradients of :func:`mlp_forward`: dx (..., E), grads (the keys of params)."""
    kind, inner = cache
    if kind == "swiglu":
        return swiglu_backward(dout, inner)
    return feed_forward_backward(dout, inner)


def gpt_block_forward(x, params, config, rope=None):
    """One pre-norm block: ``x = x + attn(norm1(x))``, then ``out = x + mlp(norm2(x))``.

    x: (B, T, E); params: norm1, attn, norm2, mlp; rope: None or (cos, sin) (T, Dh/2)
    ->  out: (B, T, E).
    """
    c = config
    h, c_norm1 = norm_forward(x, params["norm1"], c.norm, c.eps)
    a, c_attn = causal_self_attention_forward(h, params["attn"], c.num_heads, c.num_kv_heads,
                                              rope, c.attention_block_size)
    x = x + a
    h, c_norm2 = norm_forward(x, params["norm2"], c.norm, c.eps)
    m, c_mlp = mlp_forward(h, params["mlp"], c.mlp)
    out = x + m
    return out, (c_norm1, c_attn, c_norm2, c_mlp)


def gpt_block_backward(dout, cache):
    """Gradients of :func:`gpt_block_forward`. Each residual connection passes ``dout`` on
    unchanged and adds its sublayer's path.  ->  dx (B, T, E), grads (nested like params)."""
    c_norm1, c_attn, c_norm2, c_mlp = cache
    dh, g_mlp = mlp_backward(dout, c_mlp)
    dx, g_norm2 = norm_backward(dh, c_norm2)
    dx += dout  # the residual path around the MLP
    dh, g_attn = causal_self_attention_backward(dx, c_attn)
    dx_in, g_norm1 = norm_backward(dh, c_norm1)
    dx_in += dx  # the residual path around the attention
    return dx_in, {"norm1": g_norm1, "attn": g_attn, "norm2": g_norm2, "mlp": g_mlp}


# --------------------------------------------------------------------------------------------
# The model, with tied input and output embeddings (09_gpt §3)


def gpt_forward(params, ids, config, pe=None, rope=None):
    """Logits of the next token at every position.

    ids: (B, T) token ids; pe: None or a fixed table of absolute positions (L >= T, E) added to
    the embeddings (used when ``params`` has no learned ``"pos"``); rope: None or (cos, sin)
    (T, Dh/2)  ->  logits: (B, T, V) = norm(blocks(embed(ids))) @ W_emb^T.
    """
    positions = params["pos"]["W"] if "pos" in params else pe
    x, c_embed = embed_forward(ids, params["embed"]["W"], positions)  # (B, T, E)
    c_layers = []
    for layer in params["layers"]:
        x, c_layer = gpt_block_forward(x, layer, config, rope)
        c_layers.append(c_layer)
    x, c_norm = norm_forward(x, params["norm"], config.norm, config.eps)
    logits, c_out = tied_output_forward(x, params["embed"]["W"])  # x @ W_emb^T: (B, T, V)
    return logits, (c_embed, c_layers, c_norm, c_out, "pos" in params)


def gpt_backward(dlogits, cache):
    """Gradients of every parameter from the gradient of the logits (B, T, V), nested like
    ``params``. The table ``W_emb`` is used twice, so its gradient is the sum of the
    embedding's and the output projection's."""
    c_embed, c_layers, c_norm, c_out, learned = cache
    dx, g_out = tied_output_backward(dlogits, c_out)  # g_out["W"]: (V, E), the output's share
    dx, g_norm = norm_backward(dx, c_norm)
    g_layers = []
    for c_layer in reversed(c_layers):
        dx, g = gpt_block_backward(dx, c_layer)
        g_layers.insert(0, g)
    d_table, d_pos = embed_backward(dx, c_embed)
    d_table += g_out["W"]  # tied: the two uses of the table add up
    grads = {"embed": {"W": d_table}, "layers": g_layers, "norm": g_norm}
    if learned:
        grads["pos"] = {"W": d_pos}
    return grads


def gpt_loss(params, ids, config, pe=None, rope=None):
    """The next-token loss of a batch and its gradients.

    ids: (B, T)  ->  loss (a float, :func:`next_token_loss_forward`), grads (nested like params).
    """
    logits, cache = gpt_forward(params, ids, config, pe, rope)
    loss, c_loss = next_token_loss_forward(logits, ids)
    grads = gpt_backward(next_token_loss_backward(1.0, c_loss), cache)
    return loss, grads


# --------------------------------------------------------------------------------------------
# The KV cache (09_gpt §6)


def kv_cache_append(K, V, length, k, v):
    """Write the keys and values of new positions into a layer's cache.

    K, V: (B, Hkv, S_max, Dh), allocated once, the first ``length`` positions filled;
    k, v: (B, Hkv, t, Dh), positions ``length .. length + t - 1``
    ->  the filled part of the cache, K[:, :, :length + t] and V[...] (views), and length + t.
    """
    end = length + k.shape[2]
    K[:, :, length:end] = k
    V[:, :, length:end] = v
    return K[:, :, :end], V[:, :, :end], end


def causal_self_attention_step(x, params, num_heads, num_kv_heads, K, V, length, rope=None):
    """:func:`causal_self_attention_forward` for ``t`` new positions ``length .. length + t - 1``
    only, reading the keys and values of the earlier positions from the cache (and adding
    theirs). Inference: no backward.

    x: (B, t, E); K, V: this layer's cache; rope: None or (cos, sin) (t, Dh/2) of the new
    positions  ->  out: (B, t, E), the new length.
    """
    num_kv_heads = num_kv_heads or num_heads
    q, k, v, _ = project_qkv(x, params, num_heads, num_kv_heads)  # (B, H or Hkv, t, Dh)
    if rope is not None:
        q, _ = rope_forward(q, *rope)
        k, _ = rope_forward(k, *rope)
    keys, values, end = kv_cache_append(K, V, length, k, v)  # (B, Hkv, end, Dh)
    t = x.shape[1]
    mask = None  # one new position may see every cached one
    if t > 1:  # new position i (absolute length + i) must not see the later new ones
        mask = np.arange(end)[None, :] > (length + np.arange(t))[:, None]  # (t, end)
    n_rep = num_heads // num_kv_heads
    if n_rep > 1:
        keys, _ = repeat_kv_forward(keys, n_rep)  # (B, H, end, Dh)
        values, _ = repeat_kv_forward(values, n_rep)
    heads, _ = attention_forward(q, keys, values, mask)  # (B, H, t, Dh)
    out, _ = linear_forward(merge_heads(heads), params["W_o"], params.get("b_o"))  # (B, t, E)
    return out, end


def gpt_step(params, ids, config, kv_caches, length, pe=None, rope=None):
    """Logits of ``t`` new tokens at positions ``length .. length + t - 1``, given the caches
    of the earlier ones (filled in place).

    ids: (B, t); kv_caches: one ``(K, V)`` per layer, each (B, Hkv, S_max, Dh); pe: as for
    :func:`gpt_forward`; rope: None or (cos, sin) (t, Dh/2) of the new positions
    ->  logits (B, t, V), the new length.
    """
    c = config
    positions = params["pos"]["W"] if "pos" in params else pe
    if positions is not None:
        positions = positions[length:]  # the rows of the new positions
    x, _ = embed_forward(ids, params["embed"]["W"], positions)  # (B, t, E)
    for layer, (K, V) in zip(params["layers"], kv_caches, strict=True):
        h, _ = norm_forward(x, layer["norm1"], c.norm, c.eps)
        a, end = causal_self_attention_step(h, layer["attn"], c.num_heads, c.num_kv_heads, K, V,
                                            length, rope)
        x = x + a
        h, _ = norm_forward(x, layer["norm2"], c.norm, c.eps)
        x = x + mlp_forward(h, layer["mlp"], c.mlp)[0]
    x, _ = norm_forward(x, params["norm"], c.norm, c.eps)
    logits, _ = tied_output_forward(x, params["embed"]["W"])  # (B, t, V)
    return logits, end


# --------------------------------------------------------------------------------------------
# Sampling (09_gpt §5)


def top_k_filter(logits, k):
    """Keep the ``k`` largest logits of each row, set the others to ``-inf`` (ties with the
    k-th largest are kept).  logits: (..., V); 1 <= k <= V  ->  filtered: (..., V)."""
    kth = np.partition(logits, -k, axis=-1)[..., -k:-k + 1 or None]  # (..., 1), k-th largest
    return np.where(logits < kth, -np.inf, logits)


def top_p_filter(logits, p):
    """Nucleus filtering: keep the smallest set of most probable tokens whose probabilities add
    up to at least ``p``, set the others to ``-inf``. A token is kept when the tokens ranked
    above it hold less than ``p`` (so the most probable one always is).

    logits: (..., V); 0 < p <= 1  ->  filtered: (..., V).
    """
    probs, _ = softmax_forward(logits)  # (..., V)
    order = np.argsort(-logits, axis=-1, kind="stable")  # most probable first
    sorted_probs = np.take_along_axis(probs, order, axis=-1)
    above = np.cumsum(sorted_probs, axis=-1) - sorted_probs  # mass ranked above each token
    keep = np.empty(logits.shape, dtype=bool)
    np.put_along_axis(keep, order, above < p, axis=-1)  # back to the vocabulary's order
    return np.where(keep, logits, -np.inf)


def sample_next(logits, rng, temperature=1.0, top_k=None, top_p=None):
    """Draw one token per row: divide the logits by ``temperature``, filter (top-k, then
    top-p), softmax, and invert the cumulative distribution at one uniform draw per row.
    ``temperature == 0`` is greedy decoding: the argmax, no draw.

    logits: (B, V); rng: a ``np.random.Generator``; top_k: None or 1..V; top_p: None or (0, 1]
    ->  ids: int64 (B,).
    """
    if temperature == 0:
        return np.argmax(logits, axis=-1)
    z = logits / temperature
    if top_k is not None:
        z = top_k_filter(z, top_k)
    if top_p is not None:
        z = top_p_filter(z, top_p)
    probs, _ = softmax_forward(z)  # (B, V), zero where filtered
    cdf = np.cumsum(probs, axis=-1, dtype=np.float64)  # (B, V)
    u = rng.random((logits.shape[0], 1)) * cdf[:, -1:]  # below the total, whatever rounding
    return (cdf <= u).sum(axis=-1)  # the first token whose cdf exceeds u
