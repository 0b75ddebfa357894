"""Sampling the next token from the logits (14_decoding §1): temperature, top-k and top-p (nucleus)
filtering, and one draw per row.

Shapes: ``B`` batch, ``V`` vocabulary; ``...`` any leading axes.
"""

from __future__ import annotations

import numpy as np

from transformer_lab.core.layers import softmax_forward

# --------------------------------------------------------------------------------------------
# Sampling (14_decoding §1)


def top_k_filter(logits, k):
    """Keep the ``k`` largest logits of each row, set the others to ``-inf`` (ties with the
    k-th largest are kept).  logits: (..., V); 1 <= k <= V  ->  filtered: (..., V)."""
    ### BEGIN SOLUTION 14 §1
    kth = np.partition(logits, -k, axis=-1)[..., -k:-k + 1 or None]  # (..., 1), k-th largest
    return np.where(logits < kth, -np.inf, logits)
    ### END SOLUTION


def top_p_filter(logits, p):
    """Nucleus filtering: keep the smallest set of most probable tokens whose probabilities add
    up to at least ``p``, set the others to ``-inf``. A token is kept when the tokens ranked
    above it hold less than ``p`` (so the most probable one always is); of tied tokens, the
    lower id ranks first (a stable sort).

    logits: (..., V); 0 < p <= 1  ->  filtered: (..., V).
    """
    ### BEGIN SOLUTION 14 §1
    probs, _ = softmax_forward(logits)  # (..., V)
    order = np.argsort(-logits, axis=-1, kind="stable")  # most probable first
    sorted_probs = np.take_along_axis(probs, order, axis=-1)
    above = np.cumsum(sorted_probs, axis=-1) - sorted_probs  # mass ranked above each token
    rank = np.argsort(order, axis=-1)  # each token's place in that order
    keep = np.take_along_axis(above < p, rank, axis=-1)  # back to the vocabulary's order
    return np.where(keep, logits, -np.inf)
    ### END SOLUTION


def sample_next(logits, rng, temperature=1.0, top_k=None, top_p=None):
    """Draw one token per row: divide the logits by ``temperature``, filter (top-k, then
    top-p), softmax, and invert the cumulative distribution at one uniform draw per row.
    ``temperature == 0`` is greedy decoding: the argmax, no draw.

    logits: (B, V); rng: a ``np.random.Generator``; top_k: None or 1..V; top_p: None or (0, 1]
    ->  ids: int64 (B,).
    """
    ### BEGIN SOLUTION 14 §1
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
    ### END SOLUTION
