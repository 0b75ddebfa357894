"""Multi-head attention: project, split into heads, attend, merge, project.

Parameters are a dict in the NumPy layout ``y = x @ W + b``. Cross-attention (and any
attention whose queries, keys and values come from different places) has separate projections
``W_q (E, E)``, ``W_k (E_k, E)``, ``W_v (E_v, E)``; self-attention packs them side by side in
``W_qkv (E, 3E)`` (PyTorch's ``in_proj_weight``, transposed), one matrix product instead of
three. Both have ``W_o (E, E)``, and the biases ``b_q, b_k, b_v`` / ``b_qkv`` and ``b_o``
unless the layer has none. Gradients come back in a dict with the same keys.

The packed self-attention is written once here and takes its attention **kernel** as an
argument (notebook 13): the GPT's causal attention (``core.gqa``: RoPE, grouped-query heads,
``W_qkv`` of width ``E + 2 Hkv Dh``), its cached decoding (``core.decoding``) and tiled attention
(``core.flash``) are calls of it with their own kernel.
"""

from __future__ import annotations

import numpy as np

from transformer_lab.core.attention import attention_backward, attention_forward
from transformer_lab.core.layers import linear_backward, linear_forward

# --------------------------------------------------------------------------------------------
# Heads (04_multihead_attention)


def split_heads(x, num_heads):
    """(B, T, E) -> (B, H, T, E/H): cut the features into heads, move the heads before time."""
    ### BEGIN SOLUTION 04 §2
    B, T, E = x.shape
    x = x.reshape(B, T, num_heads, E // num_heads)  # (B, T, H, Dh)
    return x.transpose(0, 2, 1, 3)  # (B, H, T, Dh)
    ### END SOLUTION


def merge_heads(x):
    """(B, H, T, Dh) -> (B, T, H*Dh): the inverse of :func:`split_heads`."""
    ### BEGIN SOLUTION 04 §2
    B, H, T, Dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * Dh)  # (B, T, H, Dh) -> (B, T, E)
    ### END SOLUTION


# --------------------------------------------------------------------------------------------
# Multi-head attention (04_multihead_attention; backward: 05_attention_backward)


def multi_head_attention_forward(query, key, value, params, num_heads, mask=None):
    """Multi-head attention with separate projections, as ``nn.MultiheadAttention``.

    query: (B, T, E); key: (B, S, E_k); value: (B, S, E_v); params: W_q, W_k, W_v, W_o and
    optional b_q, b_k, b_v, b_o; mask: broadcastable to (B, H, T, S)  ->  out: (B, T, E).
    """
    ### BEGIN SOLUTION 04 §4
    q, c_q = linear_forward(query, params["W_q"], params.get("b_q"))  # (B, T, E)
    k, c_k = linear_forward(key, params["W_k"], params.get("b_k"))  # (B, S, E)
    v, c_v = linear_forward(value, params["W_v"], params.get("b_v"))  # (B, S, E)
    heads, c_att = attention_forward(split_heads(q, num_heads), split_heads(k, num_heads),
                                     split_heads(v, num_heads), mask)  # (B, H, T, Dh)
    out, c_o = linear_forward(merge_heads(heads), params["W_o"], params.get("b_o"))  # (B, T, E)
    ### END SOLUTION
    return out, (c_q, c_k, c_v, c_att, c_o, num_heads)


def multi_head_attention_backward(dout, cache, dweights=None):
    """Gradients of :func:`multi_head_attention_forward`.

    dout: (B, T, E); dweights: None, or the gradient of the per-head weights (B, H, T, S)
    ->  dquery (B, T, E), dkey (B, S, E_k), dvalue (B, S, E_v), grads (the keys of params).
    """
    c_q, c_k, c_v, c_att, c_o, num_heads = cache
    ### BEGIN SOLUTION 05 §6
    dheads, g_o = linear_backward(dout, c_o)  # (B, T, E)
    dheads = split_heads(dheads, num_heads)  # (B, H, T, Dh)
    dq, dk, dv = attention_backward(dheads, c_att, dweights)  # (B, H, T or S, Dh)
    dquery, g_q = linear_backward(merge_heads(dq), c_q)
    dkey, g_k = linear_backward(merge_heads(dk), c_k)
    dvalue, g_v = linear_backward(merge_heads(dv), c_v)
    grads = {"W_q": g_q["W"], "W_k": g_k["W"], "W_v": g_v["W"], "W_o": g_o["W"]}
    for name, g in (("b_q", g_q), ("b_k", g_k), ("b_v", g_v), ("b_o", g_o)):
        if "b" in g:  # each bias on its own: a layer may have some and not others
            grads[name] = g["b"]
    ### END SOLUTION
    return dquery, dkey, dvalue, grads


def self_attention_forward(x, params, num_heads, mask=None, attend=None, num_kv_heads=None):
    """Multi-head self-attention with packed projections: queries, keys and values all come
    from ``x``, through one product with ``W_qkv``. The one projection-split-attend-merge-project
    of the course: the GPT (13, 15) and tiled attention (16) pass their own attention kernel.

    x: (B, T, E); params: W_qkv (E, E + 2 Hkv Dh), W_o (E, E), optional b_qkv (E + 2 Hkv Dh,),
    b_o (E,); mask: broadcastable to (B, H, T, T), for the default kernel; attend: None for
    ``attention_forward(q, k, v, mask)``, or a kernel ``(q, k, v) -> (heads, cache)`` with
    q (B, H, T, Dh), k, v (B, Hkv, T, Dh) -> heads (B, H, T, Dh) (15: RoPE, grouped-query;
    16: tiled); num_kv_heads: Hkv, the key/value heads (default H: ``W_qkv`` is (E, 3E))
    ->  out: (B, T, E).
    """
    ### BEGIN SOLUTION 04 §6, 13 §3, 15 §4
    Hkv = num_kv_heads or num_heads
    E = x.shape[-1]
    kv = Hkv * (E // num_heads)  # width of the keys (and of the values)
    qkv, c_qkv = linear_forward(x, params["W_qkv"], params.get("b_qkv"))  # (B, T, E + 2 kv)
    q, k, v = np.split(qkv, [E, E + kv], axis=-1)  # (B, T, E), (B, T, kv), (B, T, kv)
    q = split_heads(q, num_heads)  # (B, H, T, Dh)
    k, v = split_heads(k, Hkv), split_heads(v, Hkv)  # (B, Hkv, T, Dh)
    if attend is None:
        heads, c_att = attention_forward(q, k, v, mask)  # (B, H, T, Dh)
    else:
        heads, c_att = attend(q, k, v)  # (B, H, T, Dh)
    out, c_o = linear_forward(merge_heads(heads), params["W_o"], params.get("b_o"))  # (B, T, E)
    ### END SOLUTION
    return out, (c_qkv, c_att, c_o, num_heads)


def self_attention_backward(dout, cache, dweights=None, attend_backward=None):
    """Gradients of :func:`self_attention_forward`. ``x`` feeds the queries, the keys and the
    values: its gradient is the sum of the three paths, one product ``dQKV W_qkv^T``.

    dout: (B, T, E); dweights: as for :func:`multi_head_attention_backward` (default kernel);
    attend_backward: None for ``attention_backward``, or the backward of the forward's kernel
    ``(dheads, cache) -> (dq, dk, dv)``, dq (B, H, T, Dh), dk, dv (B, Hkv, T, Dh)
    ->  dx (B, T, E), grads (the keys of params).
    """
    c_qkv, c_att, c_o, num_heads = cache
    ### BEGIN SOLUTION 05 §7, 13 §3
    dheads, g_o = linear_backward(dout, c_o)  # (B, T, E)
    dheads = split_heads(dheads, num_heads)  # (B, H, T, Dh)
    if attend_backward is None:
        dq, dk, dv = attention_backward(dheads, c_att, dweights)  # (B, H, T, Dh)
    else:
        dq, dk, dv = attend_backward(dheads, c_att)  # (B, H, T, Dh), (B, Hkv, T, Dh) x 2
    dqkv = np.concatenate([merge_heads(dq), merge_heads(dk), merge_heads(dv)], axis=-1)
    dx, g_qkv = linear_backward(dqkv, c_qkv)  # dqkv: (B, T, E + 2 Hkv Dh)
    grads = {"W_qkv": g_qkv["W"], "W_o": g_o["W"]}
    if "b" in g_qkv:  # each bias on its own: b_qkv without b_o, or the reverse
        grads["b_qkv"] = g_qkv["b"]
    if "b" in g_o:
        grads["b_o"] = g_o["b"]
    ### END SOLUTION
    return dx, grads
