"""The GPT's causal self-attention (13_gpt §3), with grouped-query attention and RoPE
(15_modern_block §1, §4).

It is notebook 04's packed self-attention (``core.multihead.self_attention_forward``) with the
GPT's attention kernel: the kernel rotates the queries and keys (RoPE), gives each key/value
head to ``H / Hkv`` query heads (grouped-query attention), and attends causally -- naively, or
tiled (notebook 16's ``flash_attention_forward``) when ``block_size`` is given.

Shapes: ``B`` batch, ``T`` positions, ``E`` width, ``H`` query heads, ``Hkv`` key/value heads
(dividing ``H``), ``Dh = E / H``. Parameters: ``{"W_qkv": (E, (H + 2 Hkv) Dh), "W_o": (E, E)}``
(+ ``b_qkv``, ``b_o``): ``E`` query columns, then ``Hkv Dh`` key and ``Hkv Dh`` value columns.
"""

from __future__ import annotations

import numpy as np

from transformer_lab.core.attention import attention_backward, attention_forward, causal_mask
from transformer_lab.core.flash import flash_attention_backward, flash_attention_forward
from transformer_lab.core.multihead import self_attention_backward, self_attention_forward
from transformer_lab.core.rope import rope_backward, rope_forward

# --------------------------------------------------------------------------------------------
# Grouped-query attention (15_modern_block §4)


def repeat_kv_forward(x, n_rep):
    """Give each key/value head to ``n_rep`` query heads: head ``j`` of the output is head
    ``j // n_rep`` of the input.  x: (B, Hkv, S, Dh)  ->  out: (B, Hkv * n_rep, S, Dh), and
    the cache: ``n_rep``.
    """
    ### BEGIN SOLUTION 15 §4
    if n_rep == 1:
        return x, n_rep
    B, Hkv, S, Dh = x.shape
    out = np.broadcast_to(x[:, :, None], (B, Hkv, n_rep, S, Dh))  # a view, no copy yet
    return out.reshape(B, Hkv * n_rep, S, Dh), n_rep
    ### END SOLUTION


def repeat_kv_backward(dout, cache):
    """Gradient of :func:`repeat_kv_forward`: a shared head receives the sum of the gradients
    of the query heads it served.  dout: (B, H, S, Dh)  ->  dx: (B, H / n_rep, S, Dh)."""
    n_rep = cache
    ### BEGIN SOLUTION 15 §4
    if n_rep == 1:
        return dout
    B, H, S, Dh = dout.shape
    return dout.reshape(B, H // n_rep, n_rep, S, Dh).sum(axis=2)  # (B, Hkv, S, Dh)
    ### END SOLUTION


# --------------------------------------------------------------------------------------------
# The causal self-attention of a block (13_gpt §3; grouped-query attention, RoPE:
# 15_modern_block §4)


def causal_self_attention_forward(x, params, num_heads, num_kv_heads=None, rope=None,
                                  block_size=None):
    """Causal multi-head self-attention: position ``t`` attends to positions ``0 .. t``.

    x: (B, T, E); params: W_qkv, W_o (+ b_qkv, b_o); num_kv_heads: Hkv, dividing H (default H);
    rope: None, or ``(cos, sin)`` (T, Dh/2) to rotate the queries and keys; block_size: None
    for ``attention_forward`` with the causal mask, or an int for notebook 16's tiled
    ``flash_attention_forward`` with blocks of that size (the same result, to rounding)
    ->  out: (B, T, E).
    """
    ### BEGIN SOLUTION 13 §3, 15 §4, 16 §6
    n_rep = num_heads // (num_kv_heads or num_heads)  # query heads per key/value head

    def attend(q, k, v):  # q: (B, H, T, Dh); k, v: (B, Hkv, T, Dh)
        c_rope = None
        if rope is not None:
            q, c_rope = rope_forward(q, *rope)  # (B, H, T, Dh)
            k, _ = rope_forward(k, *rope)  # (B, Hkv, T, Dh), the same angles
        if n_rep > 1:  # shared key/value heads (notebook 15 §4)
            k, _ = repeat_kv_forward(k, n_rep)  # (B, H, T, Dh)
            v, _ = repeat_kv_forward(v, n_rep)
        if block_size is None:
            heads, c_att = attention_forward(q, k, v, causal_mask(q.shape[2]))  # (B, H, T, Dh)
        else:  # notebook 16: tiled, never forms the (T, T) scores
            heads, c_att = flash_attention_forward(q, k, v, True, block_size)
        return heads, (c_rope, n_rep, c_att, block_size)

    out, cache = self_attention_forward(x, params, num_heads, attend=attend,
                                        num_kv_heads=num_kv_heads)  # (B, T, E)
    ### END SOLUTION
    return out, cache


def causal_self_attention_backward(dout, cache):
    """Gradients of :func:`causal_self_attention_forward`.

    dout: (B, T, E)  ->  dx (B, T, E), grads (the keys of params).
    """
    ### BEGIN SOLUTION 13 §3, 15 §4, 16 §6
    def attend_backward(dheads, c_kernel):  # dheads: (B, H, T, Dh)
        c_rope, n_rep, c_att, block_size = c_kernel
        kernel = attention_backward if block_size is None else flash_attention_backward
        dq, dk, dv = kernel(dheads, c_att)  # (B, H, T, Dh)
        if n_rep > 1:
            dk = repeat_kv_backward(dk, n_rep)  # a shared head sums its query heads' gradients
            dv = repeat_kv_backward(dv, n_rep)  # (B, Hkv, T, Dh)
        if c_rope is not None:
            dq, dk = rope_backward(dq, c_rope), rope_backward(dk, c_rope)
        return dq, dk, dv

    dx, grads = self_attention_backward(dout, cache, attend_backward=attend_backward)
    ### END SOLUTION
    return dx, grads
