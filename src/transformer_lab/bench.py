"""Time the NumPy twins against PyTorch's eager CPU autograd: ``python -m transformer_lab.bench``.

One *step* is what a training step does with the module: forward, then backward of
``loss = sum(out * dout)`` -- gradients of the inputs and of every parameter. Both sides get
the same weights (the twin is built with :func:`transformer_lab.interop.from_torch`), the same
float32 batch, the same masks (a causal mask for the decoder, key padding masks with a few
padded positions) and the same upstream gradient. Before anything is timed, the twin is checked
to compute what the module computes: a float64 copy of each, same weights and inputs, must agree
on the output and the input gradients to a relative error of 1e-10 -- a benchmark of two
computations that differ would mean nothing. (The check is not made in float32: there the two
sides legitimately differ by more than rounding, e.g. 3 % on one row of an input gradient where
a ReLU input lies within float32 rounding of zero and the two sides' float32 intermediates fall
on either side of the kink.)

The two sides are timed alternately, step after step, after a warm-up
(:func:`median_times`, also used by :func:`transformer_lab.train.step_times`), and the table
reports the median of each and the ratio numpy/torch (below 1: the NumPy twin is faster).

Threads: ``--threads N`` gives NumPy's BLAS and torch N threads each
(:func:`transformer_lab.notebook.limit_threads`, threadpoolctl); without it both keep their
defaults (usually one thread per core).

Options: ``--quick`` (tiny sizes, a few repeats: checks that everything runs), ``--d-model``,
``--batch``, ``--length``, ``--heads``, ``--layers``, ``--repeats``, ``--warmup``,
``--modules``, ``--no-masks``, ``--threads``. See ``--help``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping

import numpy as np

from transformer_lab import _validate as v
from transformer_lab.gradient_check import rel_error

MODULES = ("encoder_layer", "transformer")

#: Largest relative error (float32) between the twin's and torch's outputs and input gradients
#: for which timing them means something.
PARITY_TOL = 1e-10


def median_times(steps: Mapping[str, Callable[[], object]], repeats: int, warmup: int
                 ) -> dict[str, float]:
    """Median seconds of each step function, timed alternately.

    Each round calls every function once, in order, so that a busy moment of the machine hits
    all of them alike; the first ``warmup`` rounds are not timed.

    Args:
        steps: name -> a function of no arguments (one step of the work to time).
        repeats: timed rounds (at least 1).
        warmup: untimed rounds before them (at least 0).

    Returns:
        name -> median seconds of one call.
    """
    repeats = v.integer(repeats, "repeats", minimum=1)
    warmup = v.integer(warmup, "warmup", minimum=0)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for i in range(warmup + repeats):
        for name, step in steps.items():
            t0 = time.perf_counter()
            step()
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _build(kind: str, e: int, h: int, layers: int):
    import torch
    from torch import nn

    torch.manual_seed(0)
    if kind == "encoder_layer":
        m = nn.TransformerEncoderLayer(e, h, 4 * e, dropout=0.0, batch_first=True)
    else:
        m = nn.Transformer(e, h, layers, layers, 4 * e, dropout=0.0, batch_first=True)
    return m


def _inputs(kind: str, b: int, t: int, e: int, rng):
    """Arguments and mask keywords of one step, as NumPy arrays."""
    from transformer_lab.attention import causal_mask, padding_mask

    lengths = t - rng.integers(0, max(1, t // 4), size=b)  # up to a quarter padded
    kpm = padding_mask(lengths, t)
    x = rng.standard_normal((b, t, e)).astype(np.float32)
    if kind == "encoder_layer":
        return [x], {"src_key_padding_mask": kpm}
    y = rng.standard_normal((b, t, e)).astype(np.float32)
    return [x, y], {"tgt_mask": causal_mask(t), "src_key_padding_mask": kpm,
                    "tgt_key_padding_mask": kpm, "memory_key_padding_mask": kpm}


def check_twin(out, twin_out, grads, twin_grads, tol: float = PARITY_TOL) -> float:
    """The largest relative error between torch's output and input gradients and the twin's;
    raises AssertionError above ``tol``."""
    pairs = [("output", out, twin_out)] + [(f"gradient of input {i}", g, tg)
                                           for i, (g, tg) in enumerate(zip(grads, twin_grads,
                                                                           strict=True))]
    errors = {what: rel_error(ours, theirs) for what, theirs, ours in pairs}
    worst = max(errors, key=errors.get)
    if not errors[worst] < tol:
        raise AssertionError(f"the NumPy twin's {worst} differs from torch's (relative error "
                             f"{errors[worst]:.2e} >= {tol:g}): timing them would compare two "
                             f"different computations")
    return errors[worst]


def measure(kind: str, e: int, b: int, t: int, h: int, layers: int, repeats: int, warmup: int,
            masks: bool = True) -> tuple[float, float]:
    """Median seconds of one float32 forward + backward step: (torch, numpy twin), after checking
    in float64 that the twin computes what the module computes (:func:`check_twin`)."""
    import torch

    from transformer_lab.interop import from_torch

    rng = np.random.default_rng(0)
    module = _build(kind, e, h, layers)
    twin = from_torch(module)
    args, kwargs = _inputs(kind, b, t, e, rng)
    if not masks:
        kwargs = {}
    dout = rng.standard_normal((b, t, e)).astype(np.float32)

    leaves = [torch.tensor(a, requires_grad=True) for a in args]
    tkwargs = {k: torch.tensor(m) for k, m in kwargs.items()}
    tdout = torch.tensor(dout)

    def torch_step():
        for p in module.parameters():
            p.grad = None
        for x in leaves:
            x.grad = None
        out = module(*leaves, **tkwargs)
        (out * tdout).sum().backward()
        return out

    def numpy_step():
        out = twin.forward(*args, **kwargs)
        grads = twin.backward(dout)
        return out, grads if isinstance(grads, tuple) else (grads,)

    _check_float64_twin(module, args, kwargs, dout)
    times = median_times({"torch": torch_step, "numpy": numpy_step}, repeats, warmup)
    return times["torch"], times["numpy"]


def _check_float64_twin(module, args, kwargs, dout) -> float:
    """Run a float64 copy of ``module`` and of its twin on the same inputs; :func:`check_twin`."""
    import copy

    import torch

    from transformer_lab.interop import from_torch

    ref = copy.deepcopy(module).double()
    args64 = [a.astype(np.float64) for a in args]
    dout64 = dout.astype(np.float64)
    leaves = [torch.tensor(a, requires_grad=True) for a in args64]
    out = ref(*leaves, **{k: torch.tensor(m) for k, m in kwargs.items()})
    (out * torch.tensor(dout64)).sum().backward()
    twin = from_torch(ref)
    twin_out = twin.forward(*args64, **kwargs)
    twin_grads = twin.backward(dout64)
    twin_grads = twin_grads if isinstance(twin_grads, tuple) else (twin_grads,)
    return check_twin(out.detach().numpy(), twin_out, [x.grad.numpy() for x in leaves],
                      twin_grads)


def _blas_threads() -> str:
    """The thread count of NumPy's BLAS, as threadpoolctl reports it."""
    from threadpoolctl import threadpool_info

    counts = {p["num_threads"] for p in threadpool_info() if p.get("user_api") == "blas"}
    return ", ".join(map(str, sorted(counts))) or "unknown"


def _default_heads(e: int) -> int:
    return 4 if e <= 64 else 8


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m transformer_lab.bench",
        description="Median time of forward + backward: the NumPy twin vs torch (eager CPU, "
                    "autograd), float32, same weights, batch and masks.")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes and few repeats: check that everything runs")
    parser.add_argument("--modules", nargs="+", choices=MODULES, default=list(MODULES))
    parser.add_argument("--d-model", nargs="+", type=int, default=[64, 128, 256])
    parser.add_argument("--batch", nargs="+", type=int, default=[32, 64])
    parser.add_argument("--length", nargs="+", type=int, default=[16, 32, 64],
                        help="sequence length (source = target for nn.Transformer)")
    parser.add_argument("--heads", type=int, default=None,
                        help="attention heads (default 4 for d_model <= 64, else 8)")
    parser.add_argument("--layers", type=int, default=2,
                        help="encoder and decoder layers of nn.Transformer (default 2 + 2)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-masks", dest="masks", action="store_false",
                        help="no causal / padding masks")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for NumPy's BLAS and for torch, each (default: the "
                             "libraries' own, usually one per core)")
    args = parser.parse_args(argv)
    if args.quick:
        args.d_model, args.batch, args.length = [32], [4], [8]
        args.repeats, args.warmup, args.heads, args.layers = 3, 1, 2, 1
    for name in ("repeats", "layers", "threads"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")

    for e in args.d_model:
        h = args.heads or _default_heads(e)
        if e < 1 or e % h:
            parser.error(f"--heads {h} must divide --d-model {e}")

    import torch

    from transformer_lab.notebook import limit_threads

    if args.threads is not None:
        limit_threads(args.threads)
    print(f"numpy {np.__version__} ({_blas_threads()} BLAS threads), torch "
          f"{torch.__version__} ({torch.get_num_threads()} threads); float32, forward + "
          f"backward, median of {args.repeats} after {args.warmup} warm-up, masks "
          f"{'on' if args.masks else 'off'}")
    header = (f"{'module':<24} {'d_model':>7} {'batch':>5} {'length':>6} {'heads':>5} "
              f"{'torch ms':>9} {'numpy ms':>9} {'numpy/torch':>11}")
    print(header)
    print("-" * len(header))
    ratios = {}
    names = {"encoder_layer": "TransformerEncoderLayer",
             "transformer": f"Transformer ({args.layers}+{args.layers})"}
    for kind in args.modules:
        for e, b, t in itertools.product(args.d_model, args.batch, args.length):
            h = args.heads or _default_heads(e)
            t_torch, t_numpy = measure(kind, e, b, t, h, args.layers, args.repeats,
                                       args.warmup, args.masks)
            ratio = t_numpy / t_torch
            ratios.setdefault(kind, []).append(ratio)
            print(f"{names[kind]:<24} {e:>7} {b:>5} {t:>6} {h:>5} {t_torch * 1e3:>9.2f} "
                  f"{t_numpy * 1e3:>9.2f} {ratio:>10.2f}x", flush=True)
    print()
    for kind, rs in ratios.items():
        geo = math.exp(sum(math.log(r) for r in rs) / len(rs))
        print(f"{names[kind]}: numpy/torch geometric mean {geo:.2f}x, "
              f"range {min(rs):.2f}x - {max(rs):.2f}x over {len(rs)} sizes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
