"""One training step (10_training): the loss and its gradients, clipping, the update."""

from __future__ import annotations

import numpy as np  # noqa: F401 (the functions here compose others: np is yours to use)

from transformer_lab.core.optim import clip_grad_norm, global_norm


def train_step(model, optimizer, src, tgt, lr, clip):
    """One step of training ``model`` on the batch ``(src, tgt)``, in place.

    model: has ``loss(src, tgt) -> (loss, grads)``; optimizer: has ``lr`` and ``step(grads)``;
    src: (B, S), tgt: (B, T) padded token ids; lr: this step's learning rate; clip: largest
    global gradient norm (0: no clipping)  ->  (loss, gradient norm before clipping).
    """
    ### BEGIN SOLUTION 10 §6
    loss, grads = model.loss(src, tgt)
    norm = clip_grad_norm(grads, clip) if clip else global_norm(grads)
    optimizer.lr = lr
    optimizer.step(grads)
    ### END SOLUTION
    return loss, norm
