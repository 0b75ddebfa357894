"""Optimisers that update a dict of NumPy parameters in place, exactly as ``torch.optim`` does.

    opt = Adam(model.params, lr=1e-3)
    schedule = WarmupSchedule(peak_lr=1e-3, warmup_steps=100, total_steps=2000)
    for step in range(2000):
        loss, grads = model.loss(src, tgt)
        clip_grad_norm(grads, max_norm=1.0)
        opt.lr = schedule(step)
        opt.step(grads)

The update rules follow PyTorch's implementations (``torch.optim.SGD``, ``torch.optim.Adam``,
``torch.optim.AdamW``) term by term, so that the same gradients give the same parameters;
tests/test_optim.py asserts it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np


def _check_params(params) -> dict[str, np.ndarray]:
    if not isinstance(params, Mapping) or not params:
        raise TypeError("params must be a non-empty dict of name -> float array")
    for name, p in params.items():
        if not isinstance(p, np.ndarray) or p.dtype not in (np.float32, np.float64):
            raise TypeError(f"params[{name!r}] must be a float32 or float64 NumPy array")
    return params


def _check_nonneg(value, name: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
        raise ValueError(f"{name} must be a non-negative number, got {value!r}")
    return float(value)


class Optimizer:
    """Base class: holds the parameters (updated in place) and the learning rate ``lr``."""

    def __init__(self, params: Mapping[str, np.ndarray], lr: float):
        self.params = _check_params(params)
        self.lr = _check_nonneg(lr, "lr")
        self.steps = 0

    def _grads(self, grads: Mapping[str, np.ndarray]):
        missing = set(self.params) - set(grads)
        extra = set(grads) - set(self.params)
        if missing or extra:
            raise ValueError(f"grads must have exactly the keys of params: missing "
                             f"{sorted(missing)}, unexpected {sorted(extra)}")
        for name, p in self.params.items():
            g = grads[name]
            if g.shape != p.shape:
                raise ValueError(f"grads[{name!r}] must have shape {p.shape}, got {g.shape}")
            if not np.all(np.isfinite(g)):
                raise ValueError(f"grads[{name!r}] contains NaN or infinity")
            yield name, p, g

    def step(self, grads: Mapping[str, np.ndarray]) -> None:
        raise NotImplementedError


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, as ``torch.optim.SGD``.

    ``g += weight_decay * p``; ``b = momentum * b + (1 - dampening) * g`` (``b = g`` on the first
    step); ``g = g + momentum * b`` if nesterov else ``b``; ``p -= lr * g``.
    """

    def __init__(self, params, lr: float, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        super().__init__(params, lr)
        self.momentum = _check_nonneg(momentum, "momentum")
        self.dampening = _check_nonneg(dampening, "dampening")
        self.weight_decay = _check_nonneg(weight_decay, "weight_decay")
        if nesterov and (self.momentum == 0 or self.dampening != 0):
            raise ValueError("nesterov needs momentum > 0 and dampening = 0")
        self.nesterov = nesterov
        self.buffers: dict[str, np.ndarray] = {}

    def step(self, grads) -> None:
        for name, p, g in self._grads(grads):
            if self.weight_decay:
                g = g + self.weight_decay * p
            if self.momentum:
                buf = self.buffers.get(name)
                if buf is None:
                    buf = self.buffers[name] = g.astype(p.dtype, copy=True)
                else:
                    buf *= self.momentum
                    buf += (1 - self.dampening) * g
                g = g + self.momentum * buf if self.nesterov else buf
            p -= p.dtype.type(self.lr) * g
        self.steps += 1


class Adam(Optimizer):
    """Adam, as ``torch.optim.Adam``; with ``decoupled=True`` AdamW, as ``torch.optim.AdamW``.

    ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``, then
    ``p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)``.
    Weight decay: added to the gradient (Adam, L2) or ``p *= 1 - lr * weight_decay`` before the
    update (AdamW).
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, decoupled: bool = False):
        super().__init__(params, lr)
        b1, b2 = betas
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ValueError(f"betas must be in [0, 1), got {betas!r}")
        self.betas = (float(b1), float(b2))
        self.eps = _check_nonneg(eps, "eps")
        self.weight_decay = _check_nonneg(weight_decay, "weight_decay")
        self.decoupled = decoupled
        self.m = {n: np.zeros_like(p) for n, p in self.params.items()}
        self.v = {n: np.zeros_like(p) for n, p in self.params.items()}

    def step(self, grads) -> None:
        self.steps += 1
        b1, b2 = self.betas
        t = self.steps
        bias1 = 1 - b1 ** t
        bias2_sqrt = math.sqrt(1 - b2 ** t)
        for name, p, g in self._grads(grads):
            c = p.dtype.type
            if self.weight_decay:
                if self.decoupled:
                    p *= c(1 - self.lr * self.weight_decay)
                else:
                    g = g + c(self.weight_decay) * p
            m, v = self.m[name], self.v[name]
            m += c(1 - b1) * (g - m)  # torch: m.lerp_(g, 1 - b1)
            v *= c(b2)
            v += c(1 - b2) * g * g
            denom = np.sqrt(v) / c(bias2_sqrt) + c(self.eps)
            p -= c(self.lr / bias1) * m / denom


def AdamW(params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
          weight_decay: float = 1e-2) -> Adam:
    """Adam with decoupled weight decay, as ``torch.optim.AdamW`` (same default decay 0.01)."""
    return Adam(params, lr, betas, eps, weight_decay, decoupled=True)


def clip_grad_norm(grads: Mapping[str, np.ndarray], max_norm: float) -> float:
    """Scale all gradients in place so that their global L2 norm is at most ``max_norm``.

    As ``torch.nn.utils.clip_grad_norm_``: ``scale = min(1, max_norm / (norm + 1e-6))``.

    Returns:
        The global norm before clipping.
    """
    if not isinstance(max_norm, (int, float)) or isinstance(max_norm, bool) or max_norm <= 0:
        raise ValueError(f"max_norm must be a positive number, got {max_norm!r}")
    if not grads:
        raise ValueError("grads must contain at least one array")
    total = math.sqrt(sum(float(np.vdot(g, g)) for g in grads.values()))
    scale = max_norm / (total + 1e-6)
    if scale < 1:
        for g in grads.values():
            g *= g.dtype.type(scale)
    return total


class WarmupSchedule:
    """Learning rate: linear warm-up from 0 to ``peak_lr``, then decay to ``final_lr``.

    ``lr(step)`` for step = 0, 1, 2, ...: ``peak_lr * (step + 1) / warmup_steps`` during warm-up,
    then ``"cosine"`` (half a cosine down to ``final_lr`` at ``total_steps``), ``"linear"``, or
    ``"inverse_sqrt"`` (``peak_lr * sqrt(warmup_steps / (step + 1))``, the paper's schedule up to a
    constant; ``total_steps`` and ``final_lr`` unused).
    """

    def __init__(self, peak_lr: float, warmup_steps: int, total_steps: int,
                 decay: str = "cosine", final_lr: float = 0.0):
        self.peak_lr = _check_nonneg(peak_lr, "peak_lr")
        self.final_lr = _check_nonneg(final_lr, "final_lr")
        for name, value in (("warmup_steps", warmup_steps), ("total_steps", total_steps)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if decay != "inverse_sqrt" and total_steps < warmup_steps:
            raise ValueError(f"total_steps must be at least warmup_steps, got {total_steps} < "
                             f"{warmup_steps}")
        if decay not in ("cosine", "linear", "inverse_sqrt"):
            raise ValueError(f'decay must be "cosine", "linear" or "inverse_sqrt", got {decay!r}')
        self.warmup_steps, self.total_steps, self.decay = warmup_steps, total_steps, decay

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.peak_lr * (step + 1) / self.warmup_steps
        if self.decay == "inverse_sqrt":
            return self.peak_lr * math.sqrt(max(self.warmup_steps, 1) / (step + 1))
        span = max(self.total_steps - self.warmup_steps, 1)
        frac = min((step - self.warmup_steps) / span, 1.0)
        if self.decay == "linear":
            shape = 1.0 - frac
        else:
            shape = 0.5 * (1.0 + math.cos(math.pi * frac))
        return self.final_lr + (self.peak_lr - self.final_lr) * shape
