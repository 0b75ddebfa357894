"""Attention for long sequences: the online softmax and tiled (FlashAttention-style) attention.

Naive attention (``core.attention``) forms the scores of every query with every key, a
``(..., T, S)`` array, and keeps the ``(..., T, S)`` weights for the backward pass: its memory
grows with the square of the length. Here the queries and the keys are visited one block of
``block_size`` at a time. The softmax of a row is built up block by block (the *online*
softmax: a running maximum and a running sum), so no ``(T, S)`` array is ever formed; the
forward pass keeps only each row's log-sum-exp, and the backward pass recomputes the weights
of each tile from it. Memory: ``O(T d + S d + block_size^2)`` instead of ``O(T S)``; the work
is the same ``O(T S d)`` (a little more in the backward pass, which recomputes the scores).

Causal attention uses the course's convention (``core.attention.causal_mask``): query ``i``
sees the keys ``j <= i``, also when ``T != S``. Every query therefore sees key 0, and no row is
ever empty. Queries and keys are cut into blocks of the same size at the same offsets, so a
tile is either entirely visible, entirely in the future (skipped), or on the diagonal, where
its mask is ``causal_mask(rows, columns)`` itself.

Shapes: q ``(..., T, d)``, k ``(..., S, d)``, v ``(..., S, d_v)``; the leading (batch, head)
axes are the same for all three.
"""

from __future__ import annotations

import math

import numpy as np

from transformer_lab.core.attention import causal_mask
from transformer_lab.core.multihead import self_attention_backward, self_attention_forward

# --------------------------------------------------------------------------------------------
# The online softmax (16_long_context)


def online_softmax_update(m, ell, scores):
    """Fold one block of scores into a row's running maximum ``m`` and running sum ``ell``.

    Invariant: ``ell = sum of exp(x - m)`` over the scores seen so far, ``m`` their maximum. With
    ``m_new = max(m, max(scores))``, every old term is rescaled by ``alpha = exp(m - m_new)``:
    ``ell_new = alpha * ell + sum exp(scores - m_new)``. A row that has seen only ``-inf`` (blocked
    scores) keeps ``m = -inf`` and ``ell = 0``, and its ``p`` and ``alpha`` are 0, not NaN.

    m: (..., 1), ``-inf`` before the first block; ell: (..., 1), 0 before the first block;
    scores: (..., n), ``-inf`` where blocked
    ->  m_new (..., 1), ell_new (..., 1), p = exp(scores - m_new) (..., n),
        alpha = exp(m - m_new) (..., 1), the factor that rescales whatever was summed so far.
    """
    ### BEGIN SOLUTION 16 §2
    m_new = np.maximum(m, scores.max(axis=-1, keepdims=True))  # (..., 1)
    shift = np.where(np.isneginf(m_new), 0, m_new)  # nothing seen yet: exp(-inf - 0) = 0
    alpha = np.exp(m - shift)  # (..., 1), at most 1
    p = scores - shift  # a new array (scores is the caller's) ...
    np.exp(p, out=p)  # ... exponentiated in place
    ell_new = alpha * ell + np.einsum("...j->...", p)[..., None]
    ### END SOLUTION
    return m_new, ell_new, p, alpha


# --------------------------------------------------------------------------------------------
# Tiled attention, forward (16_long_context)


def flash_attention_forward(q, k, v, causal=False, block_size=64):
    """``softmax(q k^T / sqrt(d)) v`` one ``block_size`` x ``block_size`` tile at a time.

    For each block of queries, the key blocks are folded in with :func:`online_softmax_update`;
    the output accumulator is rescaled by the same ``alpha`` as the running sum, and divided by
    it at the end. Nothing of size (T, S) is formed.

    q: (..., T, d); k: (..., S, d); v: (..., S, d_v); causal: query i sees keys j <= i
    ->  out: (..., T, d_v); the cache holds q (as given, unscaled), k, v, out and each row's
        log-sum-exp ``lse = m + log ell`` (..., T) -- all the backward pass needs.
    """
    ### BEGIN SOLUTION 16 §3
    T, S = q.shape[-2], k.shape[-2]
    qs = q * (1 / math.sqrt(q.shape[-1]))  # scaled once; a Python float keeps float32
    out = np.empty(q.shape[:-1] + v.shape[-1:], dtype=q.dtype)  # (..., T, d_v)
    lse = np.empty(q.shape[:-1], dtype=q.dtype)  # (..., T)
    for i in range(0, T, block_size):
        q_i = qs[..., i:i + block_size, :]  # (..., b, d)
        m = np.full(q_i.shape[:-1] + (1,), -np.inf, dtype=q.dtype)  # (..., b, 1)
        ell = np.zeros_like(m)
        acc = np.zeros(q_i.shape[:-1] + v.shape[-1:], dtype=q.dtype)  # (..., b, d_v)
        stop = min(S, i + block_size) if causal else S  # later keys: the future of every row
        for j in range(0, stop, block_size):
            s = q_i @ np.swapaxes(k[..., j:j + block_size, :], -1, -2)  # (..., b, b)
            if causal and j == i:  # the diagonal tile
                np.copyto(s, -np.inf, where=causal_mask(*s.shape[-2:]))
            m, ell, p, alpha = online_softmax_update(m, ell, s)
            acc *= alpha
            acc += p @ v[..., j:j + block_size, :]
        out[..., i:i + block_size, :] = acc / ell
        lse[..., i:i + block_size] = (m + np.log(ell))[..., 0]
    ### END SOLUTION
    return out, (q, k, v, out, lse, causal, block_size)


# --------------------------------------------------------------------------------------------
# Tiled attention, backward (16_long_context)


def flash_attention_backward_tile(q_i, k_j, v_j, dout_i, lse_i, D_i, scale, mask=None):
    """The gradients that flow through one tile: queries of block i against keys of block j.

    The tile's weights are recomputed exactly from the row's log-sum-exp,
    ``P = exp(q_i k_j^T * scale - lse_i)``; then, as in naive attention but with
    ``D = rowsum(dO * O)`` in place of ``rowsum(dP * P)``:
    ``dV_j = P^T dO_i``, ``dP = dO_i V_j^T``, ``dZ = P * (dP - D_i)``,
    ``dQ_i = dZ K_j * scale``, ``dK_j = dZ^T Q_i * scale``.

    q_i: (..., b_q, d); k_j: (..., b_k, d); v_j: (..., b_k, d_v); dout_i: (..., b_q, d_v);
    lse_i, D_i: (..., b_q); scale: a number; mask: None or bool (b_q, b_k), True = blocked
    ->  this tile's parts of dq_i (..., b_q, d), dk_j (..., b_k, d) and dv_j (..., b_k, d_v).
    """
    ### BEGIN SOLUTION 16 §4
    qs = q_i * scale  # (..., b_q, d)
    p = qs @ np.swapaxes(k_j, -1, -2)  # the scores (..., b_q, b_k) ...
    if mask is not None:
        np.copyto(p, -np.inf, where=mask)
    p -= lse_i[..., None]
    np.exp(p, out=p)  # ... the weights P, in place
    dv_j = np.swapaxes(p, -1, -2) @ dout_i  # (..., b_k, d_v)
    dz = dout_i @ np.swapaxes(v_j, -1, -2)  # dP (..., b_q, b_k) ...
    dz -= D_i[..., None]
    dz *= p  # ... dZ = P * (dP - D), in place
    dq_i = dz @ k_j * scale  # (..., b_q, d)
    dk_j = np.swapaxes(dz, -1, -2) @ qs  # (..., b_k, d)
    ### END SOLUTION
    return dq_i, dk_j, dv_j


def flash_attention_backward(dout, cache):
    """Gradients of :func:`flash_attention_forward`, tile by tile.

    ``D = rowsum(dout * out)`` (one number per query) replaces the softmax backward's
    ``rowsum(dP * P)``, which would need a whole row of P; each tile's weights are recomputed
    from the stored log-sum-exp by :func:`flash_attention_backward_tile`.
    dout: (..., T, d_v)  ->  dq (..., T, d), dk (..., S, d), dv (..., S, d_v).
    """
    q, k, v, out, lse, causal, block_size = cache
    ### BEGIN SOLUTION 16 §4
    T, S = q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1])
    D = np.einsum("...d,...d->...", dout, out)  # rowsum(dO * O): (..., T)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for i in range(0, T, block_size):
        rows = slice(i, i + block_size)
        stop = min(S, i + block_size) if causal else S
        for j in range(0, stop, block_size):
            cols = slice(j, j + block_size)
            mask = None
            if causal and j == i:  # the diagonal tile
                mask = causal_mask(min(block_size, T - i), min(block_size, S - j))
            dq_ij, dk_ij, dv_ij = flash_attention_backward_tile(
                q[..., rows, :], k[..., cols, :], v[..., cols, :], dout[..., rows, :],
                lse[..., rows], D[..., rows], scale, mask)
            dq[..., rows, :] += dq_ij
            dk[..., cols, :] += dk_ij
            dv[..., cols, :] += dv_ij
    ### END SOLUTION
    return dq, dk, dv


# --------------------------------------------------------------------------------------------
# In the model (16_long_context): multi-head self-attention with tiled attention as its kernel


def flash_self_attention_forward(x, params, num_heads, causal=False, block_size=64):
    """:func:`core.multihead.self_attention_forward` with tiled attention as its kernel: the
    same parameters and the same result (to rounding) for causal or unmasked self-attention.

    x: (B, T, E); params: W_qkv (E, 3E), W_o (E, E), optional b_qkv (3E,), b_o (E,)
    ->  out: (B, T, E).
    """
    ### BEGIN SOLUTION 16 §6
    def attend(q, k, v):  # (B, H, T, Dh) each
        return flash_attention_forward(q, k, v, causal, block_size)

    out, cache = self_attention_forward(x, params, num_heads, attend=attend)  # (B, T, E)
    ### END SOLUTION
    return out, cache


def flash_self_attention_backward(dout, cache):
    """Gradients of :func:`flash_self_attention_forward`: dx (B, T, E), grads (the keys of
    params), as :func:`core.multihead.self_attention_backward` with the tiled backward."""
    ### BEGIN SOLUTION 16 §6
    return self_attention_backward(dout, cache, attend_backward=flash_attention_backward)
    ### END SOLUTION
