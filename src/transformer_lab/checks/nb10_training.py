"""Checks of notebook 10_training: the optimiser steps, clipping, the training step, and the
notebook's variants (the paper's learning-rate schedule, RMSprop, sampling with a temperature).

Expected answers come from PyTorch: ``torch.optim.SGD``, ``Adam``, ``AdamW`` and ``RMSprop``
fed the same gradients, ``torch.nn.utils.clip_grad_norm_``, and -- for the training step and
for decoding -- ``TorchTransformer``, the course model written again in PyTorch (autograd,
``torch.optim``, ``clip_grad_norm_``); none of them calls the core. The hints for the classic
mistakes of the optimiser steps are torch's optimisers with another setting (a switch ignored,
Adam for AdamW) or, where torch has no such setting, computed in NumPy from the update rules
that the core's docstrings state.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from transformer_lab.checks._torch_helpers import _np, _t, torch
from transformer_lab.checks.framework import Case, Check, later_rng
from transformer_lab.models.config import config_from_dict


def _trajectory_case(rng, name, shape, steps, dtype=np.float64, scale=1.0, zero_from=None,
                     **hyper) -> Case:
    """A parameter (shape), ``steps`` gradients for it, and the optimiser's settings."""
    p0 = rng.standard_normal(shape).astype(dtype)
    grads = rng.standard_normal((steps, *shape)) * scale
    if zero_from is not None:
        grads[zero_from:] = 0
    return Case(name, (p0, grads.astype(dtype)), hyper)


def _torch_trajectory(opt_class, params, grads, fresh_state=False, shrink=0.0, lrs=None,
                      **settings):
    """Feed ``grads`` (one dict name -> gradient a step) to ``opt_class`` over ``params`` (name
    -> array) one step at a time (``lrs``: each step's learning rate, else ``settings``' lr);
    (name -> p after each step (k, ...), name -> the optimiser's state of p after the last).
    Two mistakes: ``fresh_state``, a new optimiser, with empty state, for every step (the state
    not kept); ``shrink``, p times 1 - shrink before each step (SGD's weight decay added after
    the momentum: decoupled, as AdamW's)."""
    tensors = {k: torch.tensor(p.copy(), requires_grad=True) for k, p in params.items()}
    after = {k: [] for k in params}
    for i, g in enumerate(grads):
        if i == 0 or fresh_state:
            opt = opt_class(list(tensors.values()), **settings)
        for k, t in tensors.items():
            t.grad = torch.from_numpy(g[k].copy())
            if shrink:
                t.data *= 1 - shrink
        for group in opt.param_groups if lrs is not None else ():
            group["lr"] = lrs[i]
        opt.step()
        for k, t in tensors.items():
            after[k].append(_np(t))
    return {k: np.stack(v) for k, v in after.items()}, {k: opt.state[t] for k, t in tensors.items()}


def _torch_p_trajectory(opt_class, p0, grads, **settings):
    """:func:`_torch_trajectory` of one parameter p0, with the gradients (steps, ...) for it."""
    after, state = _torch_trajectory(opt_class, {"p": p0}, [{"p": g} for g in grads], **settings)
    return after["p"], state["p"]


# --------------------------------------------------------------------------------------------
# §4 SGD with momentum

P_AFTER = "p after each step"
BUFFER = "the momentum buffer returned after the last step"
NO_BUFFER = "without momentum, the returned buffer is None"


def _sgd_answer(after, buf, momentum) -> dict:
    """p after each step, and the buffer returned after the last (without momentum: None)."""
    return {P_AFTER: after, **({BUFFER: buf} if momentum else {NO_BUFFER: buf is None})}


class SGDStep(Check, id="check-sgd-step", functions=("sgd_step",)):
    def cases(self, rng):
        yield _trajectory_case(rng, "plain SGD, no momentum (three steps)", (3, 4), 3, lr=0.1)
        yield _trajectory_case(rng, "momentum 0.9, the first step (the buffer starts as a copy "
                                    "of g)", (3, 4), 1, lr=0.1, momentum=0.9)
        yield _trajectory_case(rng, "momentum 0.9, later steps", (5,), 5, lr=0.1, momentum=0.9)
        yield _trajectory_case(rng, "momentum 0.8 with dampening 0.5 (the first step is not "
                                    "damped)", (2, 3), 4, lr=0.05, momentum=0.8, dampening=0.5)
        yield _trajectory_case(rng, "Nesterov momentum 0.9", (4,), 4, lr=0.1, momentum=0.9,
                               nesterov=True)
        yield _trajectory_case(rng, "weight decay 0.1 (added to the gradient)", (3, 3), 3,
                               lr=0.1, weight_decay=0.1)
        yield _trajectory_case(rng, "float32 parameters, momentum 0.9 and weight decay 0.01",
                               (4, 5), 3, np.float32, lr=0.1, momentum=0.9, weight_decay=0.01)
        yield _trajectory_case(rng, "a gradient of zero, with momentum and weight decay (only "
                                    "the decay moves p)", (6,), 3, zero_from=0, lr=0.5,
                               momentum=0.9, weight_decay=0.1)

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield _trajectory_case(rng, "float32, Nesterov with weight decay", (3, 2), 4, np.float32,
                               lr=0.05, momentum=0.7, weight_decay=0.05, nesterov=True)
        yield _trajectory_case(rng, "a zero gradient after nonzero ones (momentum keeps moving "
                                    "p)", (4,), 5, zero_from=2, lr=0.1, momentum=0.9)
        yield _trajectory_case(rng, "dampening 0.3, weight decay 0.2, one parameter", (1,), 4,
                               lr=0.2, momentum=0.5, dampening=0.3, weight_decay=0.2)
    ### END HIDDEN TESTS

    def run(self, f, p0, g, **hyper):  # g: a gradient a step (named as sgd_step names it)
        p, buf, after = p0.copy(), None, []
        for g_t in g:  # a view into the case's gradients: changing it is noticed
            buf = f.sgd_step(p, g_t, buf, **hyper)
            after.append(p.copy())
        return _sgd_answer(np.stack(after), buf, hyper.get("momentum"))

    def expected(self, p0, grads, **hyper):
        after, state = _torch_p_trajectory(torch.optim.SGD, p0, grads, **hyper)
        return _sgd_answer(after, _np(state.get("momentum_buffer")), hyper.get("momentum"))

    def mistakes(self, p0, grads, **hyper):
        def torch_with(grads=grads, **settings):
            return lambda: self.expected(p0, grads, **{**hyper, **settings})

        found = {"updating a new array instead of p in place (p = p - lr * g rebinds the name; "
                 "write p -= lr * g)": torch_with(lr=0.0)}  # p stays; the buffer moves on
        if hyper.get("momentum") and hyper.get("dampening"):
            # from zero, the first step is damped as the others: torch without dampening, fed
            # the damped gradient and weight decay
            damped = 1 - hyper["dampening"]
            found["starting the momentum buffer at zero, or at (1 - dampening) g, instead of "
                  "a copy of g (torch's first step takes buf = g, undamped; both of those damp "
                  "the first step)"] = (
                torch_with(grads * damped, dampening=0.0,
                           weight_decay=damped * hyper.get("weight_decay", 0.0)))
        if hyper.get("momentum"):
            found["with dampening * g where (1 - dampening) * g belongs in the buffer's update"] = (
                torch_with(dampening=1 - hyper.get("dampening", 0.0)))
        if hyper.get("nesterov"):
            found["ignoring nesterov (with it the step uses g + momentum * buf, not buf)"] = (
                torch_with(nesterov=False))
        if hyper.get("weight_decay"):
            found["ignoring weight_decay (it adds weight_decay * p to g first)"] = (
                torch_with(weight_decay=0.0))
            if hyper.get("momentum"):
                found["adding the weight decay after the momentum instead of to g before it"] = (
                    torch_with(weight_decay=0.0, shrink=hyper["lr"] * hyper["weight_decay"]))
        return found


# --------------------------------------------------------------------------------------------
# §4 Adam and AdamW

M_AFTER = "m (the first moment) after the last step"
V_AFTER = "v (the second moment) after the last step"


def _adam_numpy(p0, grads, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
                decoupled=False, correction=0, eps_inside=False, rebound="", decay_after=False,
                uncorrected="", beta2_of_v=None, corrected_kept=False, unsquared=False,
                coupled_too=False, eps_corrected=False):
    """The Adam trajectory with the switches of the classic mistakes (float64). correction:
    the shift of t in the bias correction, or None for none; ``uncorrected`` ("m", "v"): that
    moment alone not corrected; ``rebound`` ("m and v", "m", "v"):
    rebound to new arrays, so the caller's stay zero; ``decay_after``: AdamW's shrink of p
    after the update; ``beta2_of_v``: the beta v's average takes (another than beta2);
    ``corrected_kept``: m and v themselves divided by the corrections (m /= 1 - beta1**t);
    ``unsquared``: v averages g, not g * g; ``coupled_too``: AdamW's decay added to g as well;
    ``eps_corrected``: eps added before v's correction, (sqrt(v) + eps) / sqrt(1 - beta2**t)."""
    p, after = p0.astype(np.float64), []
    b2 = beta2 if beta2_of_v is None else beta2_of_v
    m, v = np.zeros_like(p), np.zeros_like(p)
    for t, g in enumerate(grads.astype(np.float64), 1):
        q = p * (1 - lr * weight_decay) if decoupled else p  # AdamW shrinks p, Adam adds to g
        if weight_decay and not decoupled:
            g = g + weight_decay * p
        if coupled_too:  # the shrunk p's decay
            g = g + weight_decay * q
        m_new = beta1 * m + (1 - beta1) * g
        v_new = b2 * v + (1 - b2) * (g if unsquared else g * g)
        tc = math.inf if correction is None else t + correction  # beta ** inf = 0: no correction
        m_hat = m_new if "m" in uncorrected else m_new / (1 - beta1 ** tc)
        v_hat = v_new if "v" in uncorrected else v_new / (1 - beta2 ** tc)
        denom = np.sqrt(v_hat + eps) if eps_inside else np.sqrt(v_hat) + eps
        if eps_corrected:
            denom = (np.sqrt(v_new) + eps) / math.sqrt(1 - beta2 ** tc)
        p = (p - lr * m_hat / denom) * (1 - lr * weight_decay) if decay_after else \
            q - lr * m_hat / denom
        m = m if "m" in rebound else m_hat if corrected_kept else m_new
        v = v if "v" in rebound else v_hat if corrected_kept else v_new
        after.append(p)
    dt = p0.dtype
    return {P_AFTER: np.stack(after).astype(dt), M_AFTER: m.astype(dt), V_AFTER: v.astype(dt)}


class AdamStep(Check, id="check-adam-step", functions=("adam_step",)):
    def cases(self, rng):
        yield _trajectory_case(rng, "the first step (t = 1): p moves by lr * g / (|g| + eps)",
                               (3, 4), 1, lr=0.01)
        yield _trajectory_case(rng, "later steps (t = 1 to 6)", (5,), 6, lr=0.01)
        yield _trajectory_case(rng, "betas (0.8, 0.99) and eps 1e-6", (2, 3), 4, lr=0.05,
                               beta1=0.8, beta2=0.99, eps=1e-6)
        yield _trajectory_case(rng, "Adam with weight decay 0.1 (added to the gradient)", (4,),
                               3, lr=0.01, weight_decay=0.1)
        yield _trajectory_case(rng, "AdamW: decoupled weight decay 0.1 (p shrinks by "
                                    "1 - lr * weight_decay)", (4,), 3, lr=0.05, weight_decay=0.1,
                               decoupled=True)
        yield _trajectory_case(rng, "float32 parameters", (3, 5), 3, np.float32, lr=0.01)
        yield _trajectory_case(rng, "gradients far below eps (|g| about 1e-10): steps far below "
                                    "lr", (6,), 3, scale=1e-10, lr=0.01)
        yield _trajectory_case(rng, "a gradient of zero after nonzero ones (m and v decay, p "
                                    "still moves)", (4,), 4, zero_from=2, lr=0.01)

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield _trajectory_case(rng, "float32 AdamW, betas (0.85, 0.995)", (2, 2), 4, np.float32,
                               lr=0.02, beta1=0.85, beta2=0.995, weight_decay=0.05,
                               decoupled=True)
        yield _trajectory_case(rng, "gradients of 1e4 (the step is still about lr)", (3,), 3,
                               scale=1e4, lr=0.01)
        yield _trajectory_case(rng, "a zero gradient from the first step (p does not move)",
                               (3,), 2, zero_from=0, lr=0.01)
        yield _trajectory_case(rng, "ten steps with lr 0.5", (2,), 10, lr=0.5)
    ### END HIDDEN TESTS

    def run(self, f, p0, g, **hyper):  # g: a gradient a step (named as adam_step names it)
        p, after = p0.copy(), []
        m, v = np.zeros_like(p), np.zeros_like(p)
        for t, g_t in enumerate(g, 1):
            f.adam_step(p, g_t, m, v, t, **hyper)
            after.append(p.copy())
        return {P_AFTER: np.stack(after), M_AFTER: m, V_AFTER: v}

    def expected(self, p0, grads, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
                 decoupled=False):
        cls = torch.optim.AdamW if decoupled else torch.optim.Adam
        after, state = _torch_p_trajectory(cls, p0, grads, lr=lr, betas=(beta1, beta2),
                                           eps=eps, weight_decay=weight_decay)
        return {P_AFTER: after, M_AFTER: _np(state["exp_avg"]), V_AFTER: _np(state["exp_avg_sq"])}

    def mistakes(self, p0, grads, **hyper):
        def wrong(**switches):
            return lambda: _adam_numpy(p0, grads, **hyper, **switches)

        def torch_with(**settings):
            return lambda: self.expected(p0, grads, **{**hyper, **settings})

        found = {
            "without the bias correction (m and v must be divided by 1 - beta1**t and "
            "1 - beta2**t)": wrong(correction=None),
            "without the bias correction of v (v_hat = v / (1 - beta2**t))":
                wrong(uncorrected="v"),
            "without the bias correction of m (m_hat = m / (1 - beta1**t))":
                wrong(uncorrected="m"),
            "with beta1 in v's running average (v *= beta2; v += (1 - beta2) * g * g)":
                wrong(beta2_of_v=hyper.get("beta1", 0.9)),
            "dividing m and v themselves by 1 - beta**t (m /= ... changes the stored average, "
            "which the next step corrects again: keep m_hat = m / (1 - beta1**t) apart)":
                wrong(corrected_kept=True),
            "with the bias correction of step t - 1 (t is 1 on the first step: divide by "
            "1 - beta**t)": wrong(correction=-1),
            "with the bias correction of step t + 1 (t is already 1 on the first step)":
                wrong(correction=1),
            "with eps inside the square root (torch divides by sqrt(v_hat) + eps)":
                wrong(eps_inside=True),
            "with eps added before v's bias correction, (sqrt(v) + eps) / sqrt(1 - beta2**t): "
            "torch adds eps to sqrt(v_hat) = sqrt(v) / sqrt(1 - beta2**t)":
                wrong(eps_corrected=True),
            "with beta1 and beta2 swapped (beta1, the first moment's, is 0.9 by default; "
            "beta2, the second's, 0.999)": torch_with(beta1=hyper.get("beta2", 0.999),
                                                     beta2=hyper.get("beta1", 0.9)),
            "with v averaging g instead of g * g (the second moment is of the squared "
            "gradient)": wrong(unsquared=True),
            "updating new arrays instead of m and v in place (m = beta1 * m + ... rebinds the "
            "name; the caller's m and v stay zero: write m *= beta1; m += ...)":
                wrong(rebound="m and v"),
            "rebinding m instead of updating it in place (m = m + ... or m = beta1 * m + ... "
            "makes a new array: the caller's m stays zero, every step starts afresh; write "
            "m += ..., as for v)":
                wrong(rebound="m"),
            "rebinding v instead of updating it in place (v = ... makes a new array: the "
            "caller's v stays zero; write v *= beta2; v += ...)":
                wrong(rebound="v"),
            "updating a new array instead of p in place (write p -= ...)":
                torch_with(lr=0.0),  # p stays; m and v move on
        }
        if hyper.get("weight_decay") and hyper.get("decoupled"):
            found["adding AdamW's weight decay to the gradient (that is Adam's L2 penalty; AdamW "
                  "shrinks p by 1 - lr * weight_decay before the update)"] = (
                torch_with(decoupled=False))
            found["adding AdamW's weight decay to the gradient as well as shrinking p: AdamW "
                  "only shrinks p (by 1 - lr * weight_decay), its gradient is g"] = (
                wrong(coupled_too=True))
            found["shrinking p by 1 - weight_decay instead of 1 - lr * weight_decay"] = (
                torch_with(weight_decay=hyper["weight_decay"] / hyper["lr"]))  # 1 - lr * that
            found["shrinking p after the update instead of before it (write p *= 1 - lr * "
                  "weight_decay first, then p -= the step)"] = wrong(decay_after=True)
        elif hyper.get("weight_decay"):
            found["decoupling the weight decay for Adam (decoupled=False adds weight_decay * p "
                  "to the gradient; shrinking p is AdamW)"] = torch_with(decoupled=True)
        return found


# --------------------------------------------------------------------------------------------
# §4 Gradient clipping by the global norm


def _grads_case(rng, name, shapes, dtype=np.float64, scales=None, *extra) -> Case:
    scales = scales or [1.0] * len(shapes)
    grads = {n: (rng.standard_normal(s) * c).astype(dtype)
             for (n, s), c in zip(shapes.items(), scales, strict=True)}
    return Case(name, (grads, *extra))


def _torch_norms(grads):
    """The norm of every array (torch), as float64 numbers."""
    return np.array([float(torch.linalg.vector_norm(torch.from_numpy(g).double()))
                     for g in grads.values()])


def _as_dtype_of(value, grads):
    """A number in the gradients' dtype (so that float32 gradients get float32's tolerance)."""
    return np.asarray(value, dtype=next(iter(grads.values())).dtype)[()]


class GlobalNorm(Check, id="check-global-norm", functions=("global_norm",)):
    def cases(self, rng):
        yield _grads_case(rng, "one array", {"W": (3, 4)})
        yield _grads_case(rng, "arrays of different shapes", {"W": (4, 3), "b": (3,),
                                                               "E": (2, 2, 2)})
        yield _grads_case(rng, "float32 gradients", {"W": (5, 5), "b": (5,)}, np.float32)
        yield Case("every gradient zero", ({"W": np.zeros((2, 2)), "b": np.zeros(2)},))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield _grads_case(rng, "one number", {"s": (1,)})
        yield _grads_case(rng, "sizes far apart", {"big": (30, 30), "tiny": (2,)}, np.float64,
                          [1e-3, 1e3])
    ### END HIDDEN TESTS

    def expected(self, grads):
        return _as_dtype_of(math.sqrt(float((_torch_norms(grads) ** 2).sum())), grads)

    def mistakes(self, grads):
        norms = _torch_norms(grads)
        return {"adding up the arrays' norms instead of taking the norm of all entries together":
                lambda: norms.sum(),
                "without the square root (the sum of squares)": lambda: (norms ** 2).sum(),
                "taking the largest array's norm": lambda: norms.max()}


NORM = "the norm before clipping (returned)"
CLIPPED = "the gradients after clipping"


def _clip_numpy(grads, max_norm, cap=True, plus=1e-6):
    """clip_grad_norm's answer with the switches of two classic mistakes."""
    total = math.sqrt(float((_torch_norms(grads) ** 2).sum()))
    scale = min(max_norm / (total + plus), 1.0) if cap else max_norm / (total + plus)
    return {NORM: _as_dtype_of(total, grads),
            CLIPPED: {name: (g * scale).astype(g.dtype) for name, g in grads.items()}}


class ClipGradNorm(Check, id="check-clip-grad-norm", functions=("clip_grad_norm",)):
    def cases(self, rng):
        yield _grads_case(rng, "above the threshold: every gradient scaled by max_norm / (norm "
                               "+ 1e-6)", {"W": (3, 4), "b": (4,)}, np.float64, [2.0, 2.0], 1.0)
        yield _grads_case(rng, "below the threshold: nothing changes",
                          {"W": (3, 4), "b": (4,)}, np.float64, None, 100.0)
        yield _grads_case(rng, "one scale for all: a small array next to a large one",
                          {"big": (3, 3), "small": (4,)}, np.float64, [5.0, 0.01], 1.0)
        yield _grads_case(rng, "float32 gradients, clipped", {"W": (4, 4), "b": (4,)},
                          np.float32, [3.0, 3.0], 0.5)
        yield Case("every gradient zero (nothing to clip)",
                   ({"W": np.zeros((2, 3)), "b": np.zeros(3)}, 1.0))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield _grads_case(rng, "three arrays, max_norm 1e-3", {"a": (2, 2), "b": (3,),
                                                               "c": (2, 1, 2)}, np.float64,
                          None, 1e-3)
        yield _grads_case(rng, "float32, one array below max_norm on its own",
                          {"W": (6, 6), "b": (6,)}, np.float32, [1.0, 0.01], 2.0)
    ### END HIDDEN TESTS

    def run(self, f, grads, max_norm):
        given = {name: g.copy() for name, g in grads.items()}  # scaled in place by your function
        total = f.clip_grad_norm(dict(given), max_norm)  # (replacing them in its dict is not)
        return {NORM: total, CLIPPED: given}

    def expected(self, grads, max_norm):
        tensors = {name: _t(g, grad=True) for name, g in grads.items()}  # p = g: any p would do
        for t in tensors.values():
            t.grad = t.detach().clone()
        total = torch.nn.utils.clip_grad_norm_(list(tensors.values()), max_norm)
        return {NORM: _as_dtype_of(float(total), grads),
                CLIPPED: {name: t.grad.numpy().copy() for name, t in tensors.items()}}

    def mistakes(self, grads, max_norm):
        right = self.expected(grads, max_norm)
        return {
            "clipping each gradient on its own by its own norm, instead of scaling all of them "
            "by the global norm": lambda: {**right, CLIPPED: {
                k: self.expected({k: g}, max_norm)[CLIPPED][k] for k, g in grads.items()}},
            "scaling gradients below the threshold up to max_norm (the scale is "
            "min(1, max_norm / (norm + 1e-6)))": lambda: _clip_numpy(grads, max_norm, cap=False),
            "returning the norm after clipping instead of before":
                lambda: {**right, NORM: GlobalNorm().expected(right[CLIPPED])},
            "dividing by the norm without torch's + 1e-6":
                lambda: _clip_numpy(grads, max_norm, plus=0.0),
            "with new arrays (returned, or put in the dict with grads[k] = grads[k] * scale): "
            "the caller's gradient arrays are not scaled (scale them in place, g *= scale)":
            lambda: {**right, CLIPPED: grads},
        }


# --------------------------------------------------------------------------------------------
# §6 The training step, against the same step in PyTorch

LOSSES = "the losses returned"
NORMS = "the gradient norms returned (before clipping)"
PARAMS = "the parameters after the steps"
#: the training step's model: small, with learned positions (neither side needs a table)
STEP_CONFIG = {"src_vocab_size": 8, "tgt_vocab_size": 9, "d_model": 8, "num_heads": 2,
               "num_encoder_layers": 1, "num_decoder_layers": 1, "d_ff": 16, "max_len": 8,
               "positional": "learned"}


def _random_params(config: dict, rng, scale=0.4) -> dict:
    """Random parameters for a config (plain data: name -> array); layer-norm gains near 1."""
    from transformer_lab.reference.torch_transformer import TorchTransformer

    zeros = TorchTransformer(config_from_dict(config), seed=None).numpy_params()  # the shapes
    dt = np.dtype(config["dtype"])
    return {name: ((1.0 if name.endswith("gamma") else 0.0)
                   + rng.standard_normal(z.shape) * scale).astype(dt)
            for name, z in zeros.items()}


def _batch(rng, config: dict, batch: int, max_src: int, max_tgt: int):
    """A padded (src, tgt) batch of random sequences: tgt = <s> y </s> <pad>..."""
    src = np.zeros((batch, max_src), np.int64)
    tgt = np.zeros((batch, max_tgt + 2), np.int64)
    for i in range(batch):
        n, m = rng.integers(1, max_src + 1), rng.integers(1, max_tgt + 1)
        src[i, :n] = rng.integers(3, config["src_vocab_size"], n)
        tgt[i, 0], tgt[i, m + 1] = 1, 2
        tgt[i, 1:m + 1] = rng.integers(3, config["tgt_vocab_size"], m)
    return src, tgt


def _step_answer(config, losses, norms, params) -> dict:
    dt = np.dtype(config["dtype"])
    return {LOSSES: np.asarray(losses, dt), NORMS: np.asarray(norms, dt), PARAMS: params}


def _step_case(rng, name, optimizer, lrs, clip, dtype="float64", batch=3) -> Case:
    config = {**STEP_CONFIG, "dtype": dtype}
    params = _random_params(config, rng)
    batches = [_batch(rng, config, batch, 5, 4) for _ in lrs]
    return Case(name, (config, params, batches, list(lrs), clip, optimizer))


def _numpy_model(config: dict, params: dict):
    """The package's model of the config (a dict) holding ``params``, the core's code inside."""
    from transformer_lab.models.encoder_decoder import Transformer

    model = Transformer(config_from_dict(config), seed=0)
    model.set_params(params)
    return model


def _twin(config: dict, params: dict):
    """``TorchTransformer``, the model written again in PyTorch, holding ``params``."""
    from transformer_lab.reference.torch_transformer import TorchTransformer

    twin = TorchTransformer(config_from_dict(config), seed=None)
    twin.load_numpy_params(params)
    return twin


class TrainStep(Check, id="check-train-step", functions=("train_step",)):
    reaches = ("transformer_loss", "sgd_step", "adam_step")  # the model's loss and the
    # optimisers' steps, run through Transformer.loss, optim.SGD and optim.Adam

    def cases(self, rng):
        yield _step_case(rng, "SGD with momentum, clip 0.01: the gradients are clipped", "sgd",
                         [0.05, 0.1, 0.02], 0.01)
        yield _step_case(rng, "Adam, clip 1000: nothing is clipped", "adam", [0.01, 0.03, 0.01],
                         1000.0)
        yield _step_case(rng, "clip = 0: no clipping, the norm is still returned", "sgd",
                         [0.02, 0.05], 0.0)
        yield _step_case(rng, "a float32 model, SGD, clipped", "sgd", [0.05, 0.05], 0.01,
                         "float32")

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield _step_case(rng, "Adam, clipped, a batch of one sequence", "adam", [0.01, 0.02],
                         0.05, batch=1)
        yield _step_case(rng, "Adam, clip = 0, four steps", "adam", [0.01, 0.02, 0.02, 0.005],
                         0.0)
    ### END HIDDEN TESTS

    def run(self, f, config, params, batches, lrs, clip, optimizer):
        from transformer_lab.optim import SGD, Adam

        model = _numpy_model(config, params)
        # lr 0 until your train_step sets each step's learning rate
        opt = SGD(model.params, lr=0.0, momentum=0.9) if optimizer == "sgd" else \
            Adam(model.params, lr=0.0)
        losses, norms = [], []
        for (src, tgt), lr in zip(batches, lrs, strict=True):
            loss, norm = f.train_step(model, opt, src, tgt, lr, clip)
            losses.append(loss)
            norms.append(norm)
        return _step_answer(config, losses, norms, dict(model.params))

    def expected(self, config, params, batches, lrs, clip, optimizer, variant=""):
        """The training steps in PyTorch: zero the gradients, loss, backward, clip (or not), set the
        learning rate, step -- or a classic mistake (``variant``: "clip 0 is 0", "norm after")."""
        twin = _twin(config, params)
        tparams = list(twin.parameters())
        opt = (torch.optim.SGD(tparams, lr=0.0, momentum=0.9) if optimizer == "sgd"
               else torch.optim.Adam(tparams, lr=0.0))
        losses, norms = [], []
        for (src, tgt), lr in zip(batches, lrs, strict=True):
            opt.zero_grad(set_to_none=True)
            loss = twin.loss(src, tgt)
            loss.backward()
            limit = 0.0 if variant == "clip 0 is 0" else clip or math.inf
            norm = float(torch.nn.utils.clip_grad_norm_(tparams, limit))
            if variant == "norm after":
                norm *= min(1.0, clip / (norm + 1e-6))
            for group in opt.param_groups:
                group["lr"] = lr
            opt.step()
            losses.append(loss.item())
            norms.append(norm)
        return _step_answer(config, losses, norms, twin.numpy_params())

    def mistakes(self, config, params, batches, lrs, clip, optimizer):
        def wrong(variant="", lrs=lrs, clip=clip):
            return lambda: self.expected(config, params, batches, lrs, clip, optimizer, variant)

        found = {}
        if not clip:  # first: with clip = 0 it leaves the parameters where lr = 0 does
            found["clipping to norm 0 when clip = 0 (0 means: no clipping; return the global "
                  "norm)"] = wrong("clip 0 is 0")
        found["not handing the learning rate to the optimiser (optimizer.lr = lr before its "
              "step): it stays at 0"] = wrong(lrs=[0.0] * len(lrs))
        found["setting the learning rate after the optimiser's step (each step then uses the "
              "previous step's lr)"] = wrong(lrs=[0.0, *lrs[:-1]])
        if clip:
            found["updating with the unclipped gradients (clipping after the update, or not at "
                  "all)"] = wrong(clip=0.0)  # the norm returned is the same
            found["returning the norm after clipping instead of before"] = wrong("norm after")
        return found


# --------------------------------------------------------------------------------------------
# Exercise 1: the paper's learning-rate schedule (the reference would show the answer: hidden)


class NoamSchedule(Check, id="check-noam-schedule", arguments=("noam_lr",)):
    loop_free = {"noam_lr": "the formula on the whole array of steps (np.minimum)"}
    def cases(self, rng):
        yield Case("d_model 512, warm-up 4000 (the paper's), steps 1 to 12009",
                   (np.arange(1, 12010), 512, 4000))
        yield Case("d_model 64, warm-up 100, steps 1 to 309", (np.arange(1, 310), 64, 100))
        yield Case("warm-up 1: decay from the first step", (np.arange(1, 12), 16, 1))
        yield Case("a (2, 2) array of steps (the shape is kept)", (np.array([[1, 2], [3, 4]]),
                                                                    64, 2))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("steps in random order, up to a million",
                   (rng.integers(1, 10**6, size=50), 256, 8000))
        yield Case("one step, as a 0-d array", (np.array(7), 32, 10))

    def expected(self, steps, d_model, warmup):
        s = np.asarray(steps, dtype=np.float64)
        return d_model ** -0.5 * np.minimum(s ** -0.5, s * warmup ** -1.5)

    def mistakes(self, steps, d_model, warmup):
        s = np.asarray(steps, dtype=np.float64)
        return {"with warmup ** -0.5 in the warm-up branch instead of warmup ** -1.5":
                lambda: d_model ** -0.5 * np.minimum(s ** -0.5, s * warmup ** -0.5),
                "with the maximum of the two rates instead of the minimum":
                lambda: d_model ** -0.5 * np.maximum(s ** -0.5, s * warmup ** -1.5),
                "without the factor d_model ** -0.5":
                lambda: np.minimum(s ** -0.5, s * warmup ** -1.5),
                "counting the steps from 0 (s is 1 on the first step)":
                lambda: d_model ** -0.5 * np.minimum((s + 1) ** -0.5, (s + 1) * warmup ** -1.5)}
    ### END HIDDEN TESTS


# --------------------------------------------------------------------------------------------
# Exercise 2: RMSprop, as torch.optim.RMSprop

RETURNS_NONE = "rmsprop_step returns None"
SAME_ARRAYS = "params updated in place (the same arrays after the step)"


def _rmsprop_answer(after: dict, returns_none=True, same_arrays=True) -> dict:
    """What check-rmsprop compares; ``after``: name -> the parameter after each step."""
    return {RETURNS_NONE: returns_none, SAME_ARRAYS: same_arrays,
            **{f"{k} after each step": np.stack(v) for k, v in after.items()}}


def _rmsprop_case(rng, name, steps=6, dtype=np.float64, **hyper) -> Case:
    params = {"W": rng.standard_normal((3, 4)).astype(dtype),
              "b": rng.standard_normal(4).astype(dtype)}
    grads = [{k: rng.standard_normal(p.shape).astype(dtype) for k, p in params.items()}
             for _ in range(steps)]
    return Case(name, (params, grads), {"lr": 0.01, **hyper})


class RMSprop(Check, id="check-rmsprop", arguments=("rmsprop_step",)):
    def cases(self, rng):
        yield _rmsprop_case(rng, "plain (alpha 0.99, no momentum, not centred)")
        yield _rmsprop_case(rng, "momentum 0.9", momentum=0.9)
        yield _rmsprop_case(rng, "centred", centered=True)
        yield _rmsprop_case(rng, "centred, momentum 0.5, weight decay 0.1, alpha 0.9, lr 0.05",
                            centered=True, momentum=0.5, weight_decay=0.1, alpha=0.9, lr=0.05)
        yield _rmsprop_case(later_rng(rng), "momentum 0.9, a learning rate that changes every "
                            "step (a schedule's)", momentum=0.9,
                            lrs=[0.01, 0.03, 0.02, 0.005, 0.04, 0.01])

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield _rmsprop_case(rng, "eps 0.1 (where eps is added matters)", eps=0.1)
        yield _rmsprop_case(rng, "float32, weight decay 0.01", dtype=np.float32,
                            weight_decay=0.01)
        yield _rmsprop_case(rng, "one step, centred with momentum", steps=1, centered=True,
                            momentum=0.9)

    def _numpy_mistakes(self, params, grads, **hyper):
        """Hints computed with a NumPy RMSprop (hidden: it shows the answer)."""
        def numpy_rmsprop(lr, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0,
                          centered=False, eps_inside=False, buffer_of_g=False, lrs=None,
                          lr_in_buffer=False):
            after = {}
            for k, p0 in params.items():  # each parameter on its own, through every step
                p, v, g_avg, buf, after[k] = p0.astype(np.float64), 0.0, 0.0, 0.0, []
                for t, g_all in enumerate(grads):
                    lr = lr if lrs is None else lrs[t]
                    g = g_all[k] + weight_decay * p
                    v = alpha * v + (1 - alpha) * g * g
                    g_avg = alpha * g_avg + (1 - alpha) * g
                    square = v - g_avg ** 2 if centered else v
                    a = np.sqrt(square + eps) if eps_inside else np.sqrt(square) + eps
                    if lr_in_buffer:  # b = momentum * b + lr * g / a; p -= b
                        buf = momentum * buf + lr * g / a
                        p = p - buf
                    else:
                        buf = momentum * buf + (g if buffer_of_g else g / a)  # momentum 0: g / a
                        p = p - lr * (buf / a if buffer_of_g else buf)
                    after[k].append(p.astype(p0.dtype))
            return _rmsprop_answer(after)

        found = {"with eps inside the square root (torch adds it outside: a = sqrt(v) + eps)":
                 lambda: numpy_rmsprop(**hyper, eps_inside=True)}
        if hyper.get("momentum"):
            found["accumulating g in the momentum buffer and dividing afterwards (torch: "
                  "b = momentum * b + g / a)"] = lambda: numpy_rmsprop(**hyper, buffer_of_g=True)
        if hyper.get("momentum") and hyper.get("lrs"):
            found["with lr inside the momentum buffer (b = momentum * b + lr * g / a): the same "
                  "while lr is constant, not under a schedule (torch: p -= lr * b)"] = \
                lambda: numpy_rmsprop(**hyper, lr_in_buffer=True)
        return found
    ### END HIDDEN TESTS

    def run(self, f, params, grads, lrs=None, **hyper):
        params = {k: p.copy() for k, p in params.items()}
        arrays = dict(params)
        state: dict = {}
        returned, after = [], {k: [] for k in params}
        for t, g in enumerate(grads):
            step = {**hyper, "lr": lrs[t]} if lrs is not None else hyper
            returned.append(f.rmsprop_step(params, g, state, **step))
            for k in after:
                after[k].append(np.array(params[k], copy=True))
        return _rmsprop_answer(after, all(r is None for r in returned),
                               all(params[k] is arrays[k] for k in arrays))

    def expected(self, params, grads, **settings):
        return _rmsprop_answer(_torch_trajectory(torch.optim.RMSprop, params, grads, **settings)[0])

    def mistakes(self, params, grads, **hyper):
        def torch_with(**settings):
            return lambda: self.expected(params, grads, **{**hyper, **settings})

        found = {"without keeping the running averages in state between calls (each step "
                 "starts again from zero)": torch_with(fresh_state=True),
                 "with alpha and 1 - alpha swapped (v = alpha * v + (1 - alpha) * g^2)":
                 torch_with(alpha=1 - hyper.get("alpha", 0.99))}
        if hyper.get("weight_decay"):
            found["ignoring weight_decay (g + weight_decay * p)"] = torch_with(weight_decay=0.0)
        if hyper.get("centered"):
            found["ignoring centered (subtract the squared running mean of g from v)"] = (
                torch_with(centered=False))
        if hyper.get("momentum"):
            found["ignoring momentum"] = torch_with(momentum=0.0)
        numpy_mistakes = getattr(self, "_numpy_mistakes", None)  # none in the handout
        return {**found, **(numpy_mistakes(params, grads, **hyper) if numpy_mistakes else {})}


# --------------------------------------------------------------------------------------------
# Exercise 3: sampling with a temperature

SAMPLES_CONFIG = {"src_vocab_size": 9, "tgt_vocab_size": 7, "d_model": 16, "num_heads": 2,
                  "num_encoder_layers": 1, "num_decoder_layers": 1, "d_ff": 32, "max_len": 10,
                  "positional": "learned", "dtype": "float64"}
CHECK_SRC = np.array([[3, 4, 5, 6], [7, 8, 3, 0], [5, 0, 0, 0]])
DRAWS = 10000
#: what must hold for every batch sampled (:func:`_sampling_properties`)
PROPERTIES = ("the same generator state gives the same samples",
              "one row per source, 1 + at most max_len columns",
              "every row starts with <s> (id 1)", "only <pad> (id 0) after </s> (id 2)",
              "stops as soon as every sequence has produced </s> (or after max_len)",
              "other generator states give other samples (a draw, not the likeliest token)",
              "</s> is likely at every step: some batch ends before max_len")


def _rows(out) -> dict:
    """The sampled batch row by row (short rows: a failure prints both in full)."""
    out = np.asarray(out)
    if out.ndim != 2:
        return {"the result (a 2-d array, one row per source)": out}
    return {f"row {i}: <s>, the tokens, </s>, then <pad>": row.astype(np.int64)
            for i, row in enumerate(out)}


def _sampling_properties(f, model, src, temperature, max_len, seeds=6) -> dict:
    """What must hold for every batch sampled from ``model``: reproducible, <s> first, only
    <pad> after </s>, no step after every sequence has ended -- and that the seeds' batches
    differ and (</s> being likely) some ended before max_len."""
    facts = dict.fromkeys(PROPERTIES[:-2], True)
    ended_early, batches = False, set()
    for seed in range(seeds):
        hot, again = (np.asarray(f.sample_decode(model, src, temperature,
                                                 np.random.default_rng(seed), max_len))
                      for _ in range(2))
        facts["the same generator state gives the same samples"] &= np.array_equal(hot, again)
        batches.add((hot.shape, hot.tobytes()))
        if hot.ndim != 2 or hot.shape[0] != len(src) or not 2 <= hot.shape[1] <= max_len + 1:
            facts["one row per source, 1 + at most max_len columns"] = False
            continue
        facts["every row starts with <s> (id 1)"] &= bool(np.all(hot[:, 0] == 1))
        body = hot[:, 1:]
        has_end = (body == 2).any(axis=1)
        first_end = np.where(has_end, (body == 2).argmax(axis=1), body.shape[1])
        facts["only <pad> (id 0) after </s> (id 2)"] &= all(
            bool(np.all(row[end + 1:] == 0)) for row, end in zip(body, first_end, strict=True))
        needed = int(first_end.max()) + 1 if has_end.all() else max_len
        facts["stops as soon as every sequence has produced </s> (or after max_len)"] &= (
            body.shape[1] == needed)
        ended_early |= bool(has_end.all() and needed < max_len)
    facts[PROPERTIES[-2]] = len(batches) > 1
    facts[PROPERTIES[-1]] = ended_early
    return facts


def _sampling_case(rng, name, what, temperature, max_len, change=None) -> Case:
    params = _random_params(SAMPLES_CONFIG, rng, scale=0.5)
    for _ in range(200):  # greedy cases: a model whose rows vary (tens of draws at most, here)
        if what != "samples" or change or _varied(params, max_len):
            break
        params = _random_params(SAMPLES_CONFIG, rng, scale=0.5)
    if change == "always </s>":
        params["out_proj.W"][...] = 0
        params["out_proj.b"][...] = 0
        params["out_proj.b"][2] = 10.0
    elif change == "</s> likely":
        params["out_proj.b"][2] += 4.0
    elif change == "flatter":  # smaller logits: every token has a fair chance
        params["out_proj.W"] *= 0.3
        params["out_proj.b"] *= 0.3
    return Case(name, (SAMPLES_CONFIG, params, CHECK_SRC, temperature, max_len, what))


def _varied(params, max_len) -> bool:
    """Whether the greedy rows of the model ``params`` show a mistake of position or stopping:
    three different tokens drawn at least, none of them <pad>, and a row that ends with </s>
    before max_len -- a random model may repeat one token in every row."""
    rows = _twin(SAMPLES_CONFIG, params).greedy_decode(CHECK_SRC, max_len, padded=True)[:, 1:]
    drawn = [row[:list(row).index(2) if 2 in row else len(row)] for row in rows]  # before </s>
    tokens = set(np.concatenate(drawn).tolist())
    return len(tokens) >= 3 and 0 not in tokens and any(2 in row[:max_len - 1] for row in rows)


class SampleDecode(Check, id="check-sample-decode", arguments=("sample_decode",)):
    loop_free = {"sample_decode": "one loop, over the steps; each step draws every row's token "
                                  "at once (one uniform number a row against the cumulative "
                                  "probabilities)"}
    stepwise = ("sample_decode",)

    def cases(self, rng):
        yield _sampling_case(rng, "temperature 1e-6 is greedy decoding (softmax(logits / 1e-6) "
                                  "puts every draw on the likeliest token)", "samples", 1e-6, 6)
        yield _sampling_case(rng, "a model whose likeliest token is always </s>: every sequence "
                                  "ends at the first step", "samples", 1e-6, 6, "always </s>")
        yield _sampling_case(rng, "</s> likely at every step, temperature 1: stopping and "
                                  "padding", "properties", 1.0, 8, "</s> likely")
        yield _sampling_case(rng, "first-token frequencies at temperature 0.7 (they must match "
                                  "softmax(logits / 0.7))", "frequencies", 0.7, 1, "flatter")
        yield _sampling_case(rng, "first-token frequencies at temperature 2", "frequencies",
                             2.0, 1, "flatter")

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield _sampling_case(rng, "another model, temperature 1e-6 is greedy decoding",
                             "samples", 1e-6, 9)
        yield _sampling_case(rng, "first-token frequencies at temperature 1", "frequencies",
                             1.0, 1, "flatter")
    ### END HIDDEN TESTS

    def tolerance(self, name, expected):
        return 0.04 if "frequencies" in name else super().tolerance(name, expected)

    def run(self, f, config, params, src, temperature, max_len, what):
        model = _numpy_model(config, params)
        if what == "samples":
            return _rows(f.sample_decode(model, src, temperature, np.random.default_rng(0),
                                         max_len))
        if what == "properties":
            return _sampling_properties(f, model, src, temperature, max_len)
        many = np.repeat(src[:1], DRAWS, axis=0)
        first = np.asarray(f.sample_decode(model, many, temperature, np.random.default_rng(5),
                                           max_len))[:, 1]
        return {"first-token frequencies": np.bincount(
            first, minlength=config["tgt_vocab_size"]) / DRAWS}

    def expected(self, config, params, src, temperature, max_len, what):
        twin = _twin(config, params)
        if what == "samples":
            return _rows(twin.greedy_decode(src, max_len, padded=True))
        if what == "properties":
            return dict.fromkeys(PROPERTIES, True)
        with torch.no_grad():
            logits = twin(src[:1], np.array([[1]]))[0, -1].double()
        return {"first-token frequencies": torch.softmax(logits / temperature, -1).numpy()}

    def mistakes(self, config, params, src, temperature, max_len, what):
        if what != "samples":  # the greedy cases: a mistake gives one answer
            return {}
        twin = _twin(config, params)
        return {f"with {wrong}": functools.partial(_greedy_rows, twin, src, max_len, mistake)
                for wrong, mistake in GREEDY_MISTAKES.items()}


#: sample_decode's mistakes that greedy decoding shows: what each is -> _greedy_rows' mistake
GREEDY_MISTAKES = {
    "the tokens drawn on after </s>: a finished row gets <pad> (np.where(done, pad_id, "
    "token))": "no pad",
    "</s> itself replaced by <pad>: mark a row done after its </s> is written": "pad eos",
    "all max_len steps taken: stop once every row has its </s> (if done.all(): break)":
    "no stop",
    "the <s> column left out: each row starts with <s>": "no bos",
    "max_len + 1 steps: at most max_len tokens are generated (</s> included)": "one more",
    "the logits of the first position: the next token's are the last position's "
    "(logits[:, -1])": "first"}


def _greedy_rows(twin, src, max_len, mistake=""):
    """:func:`_rows` of greedy decoding by the twin (what temperature 1e-6 samples) with one of
    :data:`GREEDY_MISTAKES`."""
    c = twin.config
    out = torch.full((src.shape[0], 1), c.bos_id, dtype=torch.long)
    done = torch.zeros(src.shape[0], dtype=torch.bool)
    for _ in range(max_len + (mistake == "one more")):
        with torch.no_grad():
            token = twin(src, out)[:, 0 if mistake == "first" else -1].argmax(-1)
        if mistake == "pad eos":
            done |= token == c.eos_id
        token = token if mistake == "no pad" else torch.where(done, c.pad_id, token)
        out = torch.cat([out, token[:, None]], dim=1)
        done |= token == c.eos_id
        if done.all() and mistake != "no stop":
            break
    return _rows(out[:, 1:] if mistake == "no bos" else out)
