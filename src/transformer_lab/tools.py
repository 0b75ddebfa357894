"""Small helpers the notebooks and the trainer share: timers, a one-line agreement check, and
the bridge between our attention parameters and ``nn.MultiheadAttention`` (its layout, torch's
``(out, in)`` weights against our ``(in, out)``: :mod:`transformer_lab.reference.interop.layout`;
our packed ``W_qkv`` is ``in_proj_weight.T``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

import numpy as np

from transformer_lab import _validate as v
from transformer_lab.gradient_check import rel_error
from transformer_lab.reference.interop.layout import mha_from_torch, mha_to_torch


def best_time(fn: Callable[[], object], repeats: int = 5, number: int = 1) -> float:
    """Seconds per call of ``fn()``: the fastest of ``repeats`` measurements, each the mean of
    ``number`` calls -- the measurement least disturbed by other work on the machine."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - start) / number)
    return best


def round_robin_times(steps: Mapping[str, Callable[[], object]], repeats: int, warmup: int,
                      clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """name -> seconds of each call of ``steps[name]`` (a function of no arguments, one step of
    the work to time), in ``repeats`` >= 1 rounds after ``warmup`` >= 0 untimed ones.

    A round calls every function once, in the given order on even rounds and in the reverse
    order on odd ones, so that a busy moment of the machine hits all of them alike and none
    always runs second, on caches another warmed. ``clock`` reads the time: wall-clock by
    default; ``time.process_time`` counts only this process's CPU time.
    """
    repeats = v.integer(repeats, "repeats", minimum=1)
    warmup = v.integer(warmup, "warmup", minimum=0)
    times: dict[str, list[float]] = {name: [] for name in steps}
    order = list(steps.items())
    for i in range(warmup + repeats):
        for name, step in (order if i % 2 == 0 else order[::-1]):
            t0 = clock()
            step()
            if i >= warmup:
                times[name].append(clock() - t0)
    return times


def median_times(steps: Mapping[str, Callable[[], object]], repeats: int, warmup: int
                 ) -> dict[str, float]:
    """name -> the median of :func:`round_robin_times`' seconds of ``steps[name]``."""
    return {name: statistics.median(ts)
            for name, ts in round_robin_times(steps, repeats, warmup).items()}


def agree(name: str, ours, reference, tol: float, width: int = 50) -> float:
    """Assert that ``ours`` and ``reference`` agree to a relative error below ``tol`` (the
    course's norm-based relative error); print one line. Returns the error."""
    err = rel_error(ours, reference)
    if not err < tol:
        raise AssertionError(f"{name}: relative error {err:.2e} is not below {tol:.0e}")
    print(f"{name:<{width}} rel. error < {tol:.0e}: True")
    return err


def perturb(params, rng: np.random.Generator, scale: float = 0.3):
    """Add ``scale`` times standard-normal noise to every array of a parameter structure (a dict
    or list, nested or not; None skipped), in place, and return it: no bias stays zero and no
    gain stays one, so that a gradient check really tests every parameter's gradient."""
    for value in (params.values() if isinstance(params, dict) else params):
        if isinstance(value, (dict, list)):
            perturb(value, rng, scale)
        elif value is not None:
            value += scale * rng.standard_normal(value.shape)
    return params


def errors_summary(errors: Mapping[str, float]) -> str:
    """One line for a dict of relative errors (what ``check_gradients`` returns)."""
    return f"{len(errors)} tensors ok, largest relative error {max(errors.values()):.1e}"


def mha_params(module, packed: bool = False) -> dict[str, np.ndarray]:
    """Our parameter dict of an ``nn.MultiheadAttention`` (with ``kdim = vdim = E``): separate
    ``W_q, W_k, W_v`` or, with ``packed``, ``W_qkv``; ``W_o``; the biases if it has them."""
    state = {k: t.detach().cpu().numpy() for k, t in module.state_dict().items()}
    p = mha_from_torch(state, "", module.embed_dim, split=not packed)  # views of torch's
    return {k: np.array(a, order="C") for k, a in p.items()}  # copies


def torch_mha(params: Mapping[str, np.ndarray], num_heads: int, dtype=None,
              batch_first: bool = True):
    """``nn.MultiheadAttention(E, num_heads)`` in eval mode holding our parameters (separate
    ``W_q, W_k, W_v`` or packed ``W_qkv``, ``W_o``, optional biases), in ``dtype`` (default:
    the parameters' dtype)."""
    import torch

    state = mha_to_torch(params, "")  # one in_proj_weight (3E, E), from W_qkv or W_q, W_k, W_v
    W_o = params["W_o"]
    mha = torch.nn.MultiheadAttention(W_o.shape[0], num_heads, bias="b_o" in params,
                                      batch_first=batch_first,
                                      dtype=dtype or getattr(torch, np.dtype(W_o.dtype).name))
    mha.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(a)) for k, a in state.items()})
    return mha.eval()
