"""The optimiser step, one parameter array at a time, in place, as ``torch.optim`` does it;
and gradient clipping by the global norm. (10_training)

The classes of ``transformer_lab.optim`` keep the state (momentum, the moment estimates, the
step count) and check their arguments; these functions do the arithmetic.
"""

from __future__ import annotations

import math

import numpy as np


def sgd_step(p, g, buf, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
    """One SGD step on ``p``, in place, as ``torch.optim.SGD``.

    ``g = g + weight_decay * p`` (a new array: ``g`` is the caller's); ``buf = momentum * buf +
    (1 - dampening) * g`` (a copy of ``g`` on the first step, when ``buf`` is None); ``g = g +
    momentum * buf`` with Nesterov, else ``buf``; ``p -= lr * g``.  p, g: the same shape  ->  the
    momentum buffer (None without momentum).
    """
    ### BEGIN SOLUTION 10 §4
    c = p.dtype.type
    if weight_decay:
        g = g + c(weight_decay) * p
    if momentum:
        if buf is None:
            buf = g.copy()
        else:
            buf *= c(momentum)
            buf += c(1 - dampening) * g
        g = g + c(momentum) * buf if nesterov else buf
    p -= c(lr) * g
    ### END SOLUTION
    return buf


def adam_step(p, g, m, v, t, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
              decoupled=False):
    """One Adam step (AdamW with ``decoupled``) on ``p``, in place, as ``torch.optim``.

    ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2`` (in place), then
    ``p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)``. Weight decay is added to
    the gradient (Adam) or shrinks ``p`` by ``1 - lr * weight_decay`` first (AdamW).
    p, g, m, v: the same shape; t: the step number, 1 for the first.
    """
    ### BEGIN SOLUTION 10 §4
    c = p.dtype.type
    if weight_decay and decoupled:
        p *= c(1 - lr * weight_decay)
    elif weight_decay:
        g = g + c(weight_decay) * p
    m += c(1 - beta1) * (g - m)  # = b1 m + (1 - b1) g, as torch's m.lerp_(g, 1 - b1)
    v *= c(beta2)
    v += c(1 - beta2) * g * g
    denom = np.sqrt(v) / c(math.sqrt(1 - beta2**t)) + c(eps)
    p -= c(lr / (1 - beta1**t)) * m / denom
    ### END SOLUTION


def global_norm(grads):
    """The L2 norm of all the gradients together, ``sqrt(sum of g * g over every array)``.

    grads: a dict of arrays  ->  a float.
    """
    ### BEGIN SOLUTION 10 §4
    squares = [np.vdot(g, g).astype(np.float64) for g in grads.values()]  # where g lives
    return math.sqrt(float(sum(squares)))  # one number to the host: on a GPU, one wait
    ### END SOLUTION


def clip_grad_norm(grads, max_norm):
    """Scale all gradients in place so that their global norm is at most ``max_norm``, as
    ``torch.nn.utils.clip_grad_norm_``: ``scale = min(1, max_norm / (norm + 1e-6))``.

    ->  the global norm before clipping.
    """
    ### BEGIN SOLUTION 10 §4
    total = global_norm(grads)
    scale = max_norm / (total + 1e-6)
    if scale < 1:
        for g in grads.values():
            g *= g.dtype.type(scale)
    return total
    ### END SOLUTION
