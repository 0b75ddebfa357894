"""The language model's loss: predict every next token (13_gpt §2).

Shapes: ``B`` batch, ``T`` positions, ``V`` vocabulary.
"""

from __future__ import annotations

import numpy as np

from transformer_lab.core.layers import cross_entropy_backward, cross_entropy_forward

# --------------------------------------------------------------------------------------------
# The next-token loss (13_gpt §2)



def next_token_loss_forward(logits, ids):
    """Mean cross-entropy of predicting every next token: the logits at position ``t`` are
    scored against ``ids[:, t + 1]``; the last position has no next token and does not count.

    logits: (B, T, V), computed from ids: (B, T)  ->  loss: a float, the mean over B (T - 1).
    """
    ### BEGIN SOLUTION 13 §2
    loss, c_ce = cross_entropy_forward(logits[:, :-1], ids[:, 1:])  # (B, T-1, V) vs (B, T-1)
    ### END SOLUTION
    return loss, (c_ce, logits.shape)


def next_token_loss_backward(dloss, cache):
    """Gradient of :func:`next_token_loss_forward`: dlogits (B, T, V), zero at the last position.
    """
    c_ce, shape = cache
    ### BEGIN SOLUTION 13 §2
    d_shifted = cross_entropy_backward(dloss, c_ce)  # (B, T-1, V)
    dlogits = np.zeros(shape, dtype=d_shifted.dtype)
    dlogits[:, :-1] = d_shifted
    ### END SOLUTION
    return dlogits
