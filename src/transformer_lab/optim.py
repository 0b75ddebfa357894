"""Optimisers that update a dict of NumPy parameters in place, exactly as ``torch.optim`` does.

    opt = Adam(model.params, lr=1e-3)
    schedule = WarmupSchedule(peak_lr=1e-3, warmup_steps=100, total_steps=2000)
    for step in range(2000):
        loss, grads = model.loss(src, tgt)
        clip_grad_norm(grads, max_norm=1.0)
        opt.lr = schedule(step)
        opt.step(grads)

The update rules follow ``torch.optim.SGD``, ``Adam`` and ``AdamW`` term by term, so that the
same gradients give the same parameters (tests/test_optim.py asserts it). A step checks every
gradient before it changes anything: a step that raises leaves the parameters, the optimiser's
state and ``steps`` as they were.

The classes keep the state and check the arguments; the arithmetic is the core's
(:mod:`transformer_lab.core.optim`, written in notebook 10, looked up at call time). They run
where the core runs (:mod:`transformer_lab.device`): on the CPU the core updates one parameter
array at a time; on a GPU the parameters of one dtype are laid end to end and updated by one
call, as :func:`clip_grad_norm` lays the gradients (why, and what it changes: docs/results.md,
"The core on a GPU").
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from transformer_lab import _validate as v
from transformer_lab import device
from transformer_lab.core import optim as core_optim


def _check_params(params) -> Mapping[str, np.ndarray]:
    if not isinstance(params, Mapping) or not params:
        raise TypeError("params must be a non-empty dict of name -> float array")
    for name, p in params.items():
        v.float_array(p, f"params[{name!r}]")
        v.on_device(p, f"params[{name!r}]", "update them where they live (make the model "
                                            "after transformer_lab.device.use(...))")
    names = list(params)
    for i, a in enumerate(names):  # one step per parameter: none may be another's memory
        for b in names[i + 1:]:
            if device.xp.may_share_memory(params[a], params[b]):
                raise ValueError(f"params[{a!r}] and params[{b!r}] share memory: give each "
                                 f"parameter once, under one name")
    return params


class Optimizer:
    """Base class: holds the parameters (updated in place), the learning rate ``lr`` (checked
    whenever it is set: a finite number >= 0) and ``steps``, the number of updates made."""

    def __init__(self, params: Mapping[str, np.ndarray], lr: float):
        self.params = _check_params(params)
        self.lr = lr
        self.steps = 0
        self._groups = _groups(self.params)

    @property
    def lr(self) -> float:
        return self._lr

    @lr.setter
    def lr(self, value: float) -> None:
        self._lr = v.real(value, "lr", minimum=0)

    def _checked_grads(self, grads: Mapping[str, np.ndarray]) -> list:
        """The gradients by group (:func:`_by_group`), once **every** one has been checked:
        the keys of params, each an array of its parameter's shape and dtype, finite; moved to
        the device."""
        if set(self.params) != {name for names in self._groups for name in names}:
            raise ValueError("params has gained or lost names since the optimiser was made: "
                             "make a new optimiser for the new parameters")
        if not isinstance(grads, Mapping):
            raise TypeError(f"grads must be a dict of name -> array, got {type(grads).__name__}")
        missing = set(self.params) - set(grads)
        extra = set(grads) - set(self.params)
        if missing or extra:
            raise ValueError(f"grads must have exactly the keys of params: missing "
                             f"{sorted(missing)}, unexpected {sorted(extra)}")
        checked = {name: device.put(v.grad_like(grads[name], f"grads[{name!r}]", p.shape,
                                                p.dtype, what=f"params[{name!r}]"))
                   for name, p in self.params.items()}
        flats = _by_group(self._groups, checked)
        xp = device.xp  # one look at every verdict: on a GPU, one wait
        if not device.to_host(xp.stack([xp.isfinite(g).all() for g in flats])).all():
            name = next(n for n, g in checked.items() if not device.to_host(xp.isfinite(g).all()))
            raise FloatingPointError(f"grads[{name!r}] contains NaN or infinity: the training "
                                     "diverged (lower the learning rate, or clip gradients)")
        return flats

    def step(self, grads: Mapping[str, np.ndarray]) -> None:
        raise NotImplementedError


class SGD(Optimizer):
    """SGD with momentum, as ``torch.optim.SGD``: :func:`transformer_lab.core.optim.sgd_step`
    on all the parameters (the update rule there)."""

    def __init__(self, params, lr: float, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        super().__init__(params, lr)
        self.momentum = v.real(momentum, "momentum", minimum=0)
        self.dampening = v.real(dampening, "dampening", minimum=0)
        self.weight_decay = v.real(weight_decay, "weight_decay", minimum=0)
        self.nesterov = v.boolean(nesterov, "nesterov")
        if self.nesterov and (self.momentum == 0 or self.dampening != 0):
            raise ValueError("nesterov needs momentum > 0 and dampening = 0")
        self.buffers: list = [None] * len(self._groups)  # momentum, one array per group

    def step(self, grads) -> None:
        gs, ps = self._checked_grads(grads), _by_group(self._groups, self.params)
        for i, (p, g) in enumerate(zip(ps, gs, strict=True)):
            self.buffers[i] = core_optim.sgd_step(p, g, self.buffers[i], self.lr, self.momentum,
                                                  self.dampening, self.weight_decay,
                                                  self.nesterov)
        _write_back(self._groups, self.params, ps)
        self.steps += 1


class Adam(Optimizer):
    """Adam, as ``torch.optim.Adam``; with ``decoupled=True`` AdamW, as ``torch.optim.AdamW``:
    :func:`transformer_lab.core.optim.adam_step` on all the parameters (the update rule there)."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, decoupled: bool = False):
        super().__init__(params, lr)
        self.betas = _betas(betas)
        self.eps = v.real(eps, "eps", minimum=0)
        self.weight_decay = v.real(weight_decay, "weight_decay", minimum=0)
        self.decoupled = v.boolean(decoupled, "decoupled")
        # the moment estimates, one array per group (as the parameters: see _groups)
        self.m = [device.xp.zeros_like(p) for p in _by_group(self._groups, self.params)]
        self.v = [device.xp.zeros_like(p) for p in self.m]

    def step(self, grads) -> None:
        gs, ps = self._checked_grads(grads), _by_group(self._groups, self.params)
        b1, b2 = self.betas
        t = self.steps + 1
        for p, g, m, v_ in zip(ps, gs, self.m, self.v, strict=True):
            core_optim.adam_step(p, g, m, v_, t, self.lr, b1, b2, self.eps, self.weight_decay,
                                 self.decoupled)
        _write_back(self._groups, self.params, ps)
        self.steps = t


def _groups(params: Mapping[str, np.ndarray]) -> list[list[str]]:
    """The names of the arrays the core updates in one call: on the CPU, each alone; on
    another device, all those of one dtype (in the order of params)."""
    if device.xp is np:
        return [[name] for name in params]
    groups: dict = {}
    for name, p in params.items():
        groups.setdefault(p.dtype, []).append(name)
    return list(groups.values())


def _by_group(groups: list[list[str]], arrays: Mapping[str, np.ndarray]) -> list:
    """``arrays`` by group (:func:`_groups`): a group's one array itself (changed in place:
    :func:`_write_back` skips it), or its arrays laid end to end in one flat array."""
    xp = device.xp
    return [arrays[names[0]] if len(names) == 1 else
            xp.concatenate([arrays[name].ravel() for name in names]) for names in groups]


def _write_back(groups: list[list[str]], arrays: Mapping[str, np.ndarray], flats: list) -> None:
    """Copy the flat arrays of :func:`_by_group` back into ``arrays``."""
    for names, flat in zip(groups, flats, strict=True):
        if len(names) == 1:  # the array itself, changed in place
            continue
        start = 0
        for name in names:
            a = arrays[name]
            a[...] = flat[start:start + a.size].reshape(a.shape)
            start += a.size


def _betas(betas) -> tuple[float, float]:
    """(beta1, beta2), each a number in [0, 1)."""
    if not isinstance(betas, (tuple, list)):
        raise TypeError(f"betas must be a pair (beta1, beta2), got {betas!r}")
    if len(betas) != 2:
        raise ValueError(f"betas must be a pair (beta1, beta2), got {len(betas)} values")
    b1, b2 = (v.real(b, f"betas[{i}]") for i, b in enumerate(betas))
    if not (0 <= b1 < 1 and 0 <= b2 < 1):
        raise ValueError(f"betas must be in [0, 1), got {betas!r}")
    return b1, b2


def AdamW(params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
          weight_decay: float = 1e-2) -> Adam:
    """Adam with decoupled weight decay, as ``torch.optim.AdamW`` (same default decay 0.01)."""
    return Adam(params, lr, betas, eps, weight_decay, decoupled=True)


def global_norm(grads: Mapping[str, np.ndarray]) -> float:
    """Checked :func:`transformer_lab.core.optim.global_norm` (NaN or inf if a gradient holds
    NaN or inf)."""
    _check_grads(grads)
    return core_optim.global_norm(grads)


def _check_grads(grads) -> None:
    if not isinstance(grads, Mapping) or not grads:
        raise ValueError("grads must be a non-empty dict of name -> float array")
    for name, g in grads.items():
        v.float_array(g, f"grads[{name!r}]")
        v.on_device(g, f"grads[{name!r}]", "use the gradients where the model made them")


def clip_grad_norm(grads: Mapping[str, np.ndarray], max_norm: float) -> float:
    """Checked :func:`transformer_lab.core.optim.clip_grad_norm`: scales ``grads`` in place,
    returns the global norm before clipping. On a GPU the core is called once, on one flat
    array per dtype (:func:`_by_group`, keyed by the names laid end to end): one global norm,
    one scale; the flat arrays are then copied back."""
    max_norm = v.real(max_norm, "max_norm", positive=True)
    _check_grads(grads)
    groups = _groups(grads)
    flats = _by_group(groups, grads)
    given = {", ".join(names): flat for names, flat in zip(groups, flats, strict=True)}
    total = core_optim.clip_grad_norm(given, max_norm)
    if any(g is not flat for g, flat in zip(given.values(), flats, strict=True)):
        raise ValueError("the core's clip_grad_norm replaced the gradients in its dict instead "
                         "of scaling them in place (g *= scale): see check-clip-grad-norm")
    _write_back(groups, grads, flats)
    return total


#: The decays of :class:`WarmupSchedule` after its warm-up.
DECAYS = ("cosine", "linear", "inverse_sqrt")


class WarmupSchedule:
    """Learning rate: linear warm-up from 0 to ``peak_lr``, then decay to ``final_lr``.

    ``lr(step)`` for step = 0, 1, 2, ...: ``peak_lr * (step + 1) / warmup_steps`` during warm-up,
    then ``"cosine"`` (half a cosine down to ``final_lr`` at ``total_steps``), ``"linear"``, or
    ``"inverse_sqrt"`` (``peak_lr * sqrt(warmup_steps / (step + 1))``, the paper's schedule up to a
    constant; ``total_steps`` and ``final_lr`` unused).
    """

    def __init__(self, peak_lr: float, warmup_steps: int, total_steps: int,
                 decay: str = "cosine", final_lr: float = 0.0):
        self.peak_lr = v.real(peak_lr, "peak_lr", minimum=0)
        self.final_lr = v.real(final_lr, "final_lr", minimum=0)
        warmup_steps = v.integer(warmup_steps, "warmup_steps", minimum=0)
        total_steps = v.integer(total_steps, "total_steps", minimum=0)
        if decay not in DECAYS:
            raise ValueError(f"decay must be one of {', '.join(map(repr, DECAYS))}, got "
                             f"{decay!r}")
        if decay != "inverse_sqrt" and total_steps < warmup_steps:
            raise ValueError(f"total_steps must be at least warmup_steps, got {total_steps} < "
                             f"{warmup_steps}")
        self.warmup_steps, self.total_steps, self.decay = warmup_steps, total_steps, decay

    def __call__(self, step: int) -> float:
        """The learning rate at ``step``, an integer >= 0."""
        step = v.integer(step, "step", minimum=0)
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
