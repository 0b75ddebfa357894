"""Scaled dot-product attention and its masks.

A **mask** is a boolean array, True where attention is **blocked**, broadcast against the
scores ``(..., T, S)`` (T queries, S keys). A query whose keys are all blocked attends to
nothing: its weights, its output and its gradients are zero. Attention also takes a float mask,
which is added to the scores (``-inf`` blocks), as PyTorch's ``attn_mask`` does.
"""

from __future__ import annotations

import math

import numpy as np

from transformer_lab.core.layers import softmax_backward, softmax_forward

# --------------------------------------------------------------------------------------------
# Masks (02_masking; several sequences at once: 03_minibatching; with heads: 04)


def causal_mask(T, S=None):
    """Block the future: True where key ``j`` comes after query ``i`` (``j > i``).

    -> bool (T, S), S = T by default.
    """
    ### BEGIN SOLUTION 02 §1
    S = T if S is None else S
    return np.arange(S)[None, :] > np.arange(T)[:, None]
    ### END SOLUTION


def padding_mask(lengths, S):
    """Block the padding: True where position ``j`` is at or past a sequence's length.

    lengths: integers (B,)  ->  bool (B, S).
    """
    ### BEGIN SOLUTION 02 §5
    return np.arange(S)[None, :] >= np.asarray(lengths)[:, None]
    ### END SOLUTION


def merge_masks(attn_mask=None, key_padding_mask=None):
    """One boolean mask for the scores of multi-head attention, ``(B, H, T, S)``.

    attn_mask: bool (T, S) or None, the same for every sequence (e.g. causal);
    key_padding_mask: bool (B, S) or None, the padded keys of each sequence
    ->  bool broadcastable to (B, H, T, S), or None when both are None.
    """
    ### BEGIN SOLUTION 04 §5
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask[:, None, None, :]  # (B, 1, 1, S)
    if attn_mask is None:
        return key_padding_mask
    if key_padding_mask is None:
        return attn_mask
    return attn_mask | key_padding_mask  # (B, 1, T, S)
    ### END SOLUTION


# --------------------------------------------------------------------------------------------
# Attention (01_attention; masks: 02_masking; leading axes: 03_minibatching; backward: 05)


def attention_forward(q, k, v, mask=None, scale=None):
    """``softmax(q k^T / sqrt(d_k) + mask) v``, over any leading (batch, head) axes.

    q: (..., T, d_k); k: (..., S, d_k); v: (..., S, d_v); mask: None, bool (True = blocked) or
    float (added), broadcastable to (..., T, S); scale: default ``1 / sqrt(d_k)``
    ->  out: (..., T, d_v); the cache holds the attention weights (..., T, S).
    """
    ### BEGIN SOLUTION 01 §6, 02 §2, 03 §4
    if scale is None:
        scale = 1 / math.sqrt(q.shape[-1])  # a Python float: float32 stays float32
    scores = (q * scale) @ np.swapaxes(k, -1, -2)  # (..., T, S); scaling q is T x d_k work
    if mask is not None and mask.dtype == bool:
        np.copyto(scores, -np.inf, where=mask)  # blocked -> -inf, in place (mask broadcasts)
    elif mask is not None:
        scores += mask  # a float mask is added
    weights, c_softmax = softmax_forward(scores, out=scores)  # (..., T, S), in place
    out = weights @ v  # (..., T, d_v)
    ### END SOLUTION
    return out, (q, k, v, c_softmax, scale)


def attention_backward(dout, cache, dweights=None):
    """Gradients of :func:`attention_forward`.

    With ``P`` the weights: ``dv = P^T dout``, ``dP = dout v^T``, ``dS = softmax_backward(dP)``
    (zero where blocked), ``dq = dS k * scale``, ``dk = dS^T q * scale``.
    dout: (..., T, d_v); dweights: None, or the gradient of the weights themselves (..., T, S)
    when the loss uses them too  ->  dq: (..., T, d_k), dk: (..., S, d_k), dv: (..., S, d_v).
    """
    q, k, v, c_softmax, scale = cache
    ### BEGIN SOLUTION 05 §5
    weights = c_softmax  # (..., T, S)
    dv = np.swapaxes(weights, -1, -2) @ dout  # (..., S, d_v)
    dP = dout @ np.swapaxes(v, -1, -2)  # (..., T, S)
    if dweights is not None:
        dP += dweights
    dscores = softmax_backward(dP, c_softmax, out=dP)  # (..., T, S), in place
    dq = dscores @ k * scale  # (..., T, d_k)
    dk = np.swapaxes(dscores, -1, -2) @ q * scale  # (..., S, d_k)
    ### END SOLUTION
    return dq, dk, dv
