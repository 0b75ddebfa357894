"""Time the NumPy twins against PyTorch's eager CPU autograd.

    python -m transformer_lab.course.bench              # the encoder-decoder's modules
    python -m transformer_lab.course.bench --model gpt  # the GPT's training step

One *step* is forward and backward on both sides, with the same weights and inputs, each twin
first checked in float64 against its module (:data:`PARITY_TOL`); :func:`paired_times` times
the sides in alternating rounds. What it measures and why: docs/maintainers.md, "Benchmarks";
the options: ``--help``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from transformer_lab.datasets.corpus import VOCAB
from transformer_lab.gradient_check import rel_error
from transformer_lab.tools import round_robin_times

MODULES = ("encoder_layer", "transformer")
NAMES = {"encoder_layer": "TransformerEncoderLayer", "transformer": "Transformer"}

#: Largest relative error (float64 copies) between the twin's and torch's outputs and input
#: gradients for which timing them means something.
PARITY_TOL = 1e-10


def paired_times(a: Callable[[], object], b: Callable[[], object], repeats: int, warmup: int,
                 clock: Callable[[], float] = time.perf_counter
                 ) -> tuple[list[float], list[float]]:
    """(times of ``a``, times of ``b``), one entry per timed round of
    :func:`~transformer_lab.tools.round_robin_times` (a b, b a, ...): ``b[i] / a[i]`` is round
    i's ratio. ``clock`` reads the time: wall-clock by default; ``time.process_time`` counts only
    the CPU time this process got, which other processes' load barely changes (one thread)."""
    times = round_robin_times({"a": a, "b": b}, repeats, warmup, clock)
    return times["a"], times["b"]


class Timing(NamedTuple):
    """One size's result: median seconds of a torch step and of a NumPy step, and the median
    and quartiles of the per-round ratios numpy/torch."""
    torch: float
    numpy: float
    ratio: float
    ratio_q1: float
    ratio_q3: float


def summarize(torch_times: list[float], numpy_times: list[float]) -> Timing:
    """:class:`Timing` from the per-round times of :func:`paired_times`."""
    ratios = [n / t for t, n in zip(torch_times, numpy_times, strict=True)]
    q1, q3 = quartiles(ratios)
    return Timing(statistics.median(torch_times), statistics.median(numpy_times),
                  statistics.median(ratios), q1, q3)


def quartiles(values: list[float]) -> tuple[float, float]:
    """First and third quartiles (linear interpolation, as ``np.percentile``); for one value,
    that value twice."""
    if len(values) == 1:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


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
    return _worst_error(errors, tol, "the NumPy twin's {} differs from torch's")


def _worst_error(errors: dict[str, float], tol: float, differs: str) -> float:
    """The largest of ``errors``; AssertionError, ``differs`` naming the quantity, above
    ``tol``."""
    worst = max(errors, key=errors.get)
    if not errors[worst] < tol:
        raise AssertionError(f"{differs.format(worst)} (relative error {errors[worst]:.2e} >= "
                             f"{tol:g}): timing them would compare two different computations")
    return errors[worst]


def measure(kind: str, e: int, b: int, t: int, h: int, layers: int, repeats: int, warmup: int,
            masks: bool = True, clock: Callable[[], float] = time.perf_counter) -> Timing:
    """Time one float32 forward + backward step of torch and of the NumPy twin in interleaved
    rounds (:func:`paired_times`), after checking in float64 that the twin computes what the
    module computes (:func:`check_twin`).

    Returns:
        :class:`Timing`; ``measure(...)[0]`` and ``[1]`` are the median seconds of torch and
        of NumPy.
    """
    import torch

    from transformer_lab.reference.interop import from_torch

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
        (module(*leaves, **tkwargs) * tdout).sum().backward()

    def numpy_step():
        twin.forward(*args, **kwargs)
        twin.backward(dout)

    _check_float64_twin(module, args, kwargs, dout)
    return summarize(*paired_times(torch_step, numpy_step, repeats, warmup, clock))


def _check_float64_twin(module, args, kwargs, dout) -> float:
    """Run a float64 copy of ``module`` and of its twin on the same inputs; :func:`check_twin`."""
    import copy

    import torch

    from transformer_lab.reference.interop import from_torch

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


def format_seconds(s: float) -> str:
    """``42 s``, ``3 min 10 s``, ``1 h 05 min``."""
    s = max(0, round(s))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _blas_threads() -> str:
    """The thread count of NumPy's BLAS, as threadpoolctl reports it."""
    from threadpoolctl import threadpool_info

    counts = {p["num_threads"] for p in threadpool_info() if p.get("user_api") == "blas"}
    return ", ".join(map(str, sorted(counts))) or "unknown"


def _default_heads(e: int) -> int:
    return 4 if e <= 64 else 8


# --------------------------------------------------------------------------------------------
# The GPT's training step (--model gpt)

GPT_BLOCKS = ("classic", "modern")
#: The character model's vocabulary (the corpus's characters), the GPT's default here.
GPT_VOCAB = len(VOCAB)  # the course corpus's characters


def _gpt_default_heads(e: int) -> int:
    return 4 if e <= 128 else 8


def gpt_config(block: str, e: int, h: int, layers: int, t: int, dtype=np.float32):
    """The benchmark's :class:`GPTConfig`: ``block`` "classic" or "modern" (half as many
    key/value heads as query heads), width ``e``, ``h`` heads, ``layers`` blocks, max_len t."""
    from transformer_lab.models.gpt import GPTConfig

    make = GPTConfig.classic if block == "classic" else GPTConfig.modern
    return make(GPT_VOCAB, d_model=e, num_heads=h, num_layers=layers, max_len=t, dtype=dtype)


def gpt_step_flops(config, b: int, t: int) -> float:
    """Multiply-adds x 2 of one training step of the GPT (forward + backward ~ 3 x forward),
    counting the matrix products only: the projections, the attention's scores and weighted
    sums (all T x T of them), the feed-forward network, the output projection."""
    c, n = config, b * t
    e, kv = c.d_model, c.num_kv_heads * c.head_dim
    projections = 2 * n * e * (e + 2 * kv) + 2 * n * e * e
    attention = 4 * n * t * e
    mlp = (3 if c.mlp == "swiglu" else 2) * 2 * n * e * c.d_ff
    return 3.0 * (c.num_layers * (projections + attention + mlp) + 2 * n * e * c.vocab_size)


class GPTTiming(NamedTuple):
    """One size's result for the GPT: :class:`Timing`, and the FLOP/s of each side's median
    step."""
    timing: Timing
    numpy_flops: float
    torch_flops: float


def _check_float64_gpt(model, ids, tol: float = PARITY_TOL) -> float:
    """A float64 copy of ``model`` and its PyTorch twin: the same loss and gradients (relative
    error below ``tol``), or AssertionError."""
    from transformer_lab.reference.torch_gpt import TorchGPT

    m64 = model.astype(np.float64)
    loss, grads = m64.loss(ids)
    twin = TorchGPT.from_numpy(m64)
    tloss = twin.loss(ids)
    tloss.backward()
    theirs = twin.numpy_grads()
    errors = {name: rel_error(g, theirs[name]) for name, g in grads.items()}
    errors["loss"] = abs(loss - tloss.item()) / abs(tloss.item())
    return _worst_error(errors, tol, "the NumPy GPT's {} differs from its PyTorch twin's")


def measure_gpt(block: str, e: int, b: int, t: int, h: int, layers: int, repeats: int,
                warmup: int, clock: Callable[[], float] = time.perf_counter) -> GPTTiming:
    """Time a float32 training step of the GPT (``model.loss(ids)``: loss and gradients) and of
    its PyTorch twin (same weights, same ids) in interleaved rounds, after checking them equal
    in float64."""
    from transformer_lab.models.gpt import GPT
    from transformer_lab.reference.torch_gpt import TorchGPT

    config = gpt_config(block, e, h, layers, t)
    model = GPT(config, seed=0)
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (b, t))
    twin = TorchGPT.from_numpy(model)
    _check_float64_gpt(model, ids)

    def torch_step():
        twin.zero_grad(set_to_none=True)
        twin.loss(ids).backward()

    def numpy_step():
        model.loss(ids)

    timing = summarize(*paired_times(torch_step, numpy_step, repeats, warmup, clock))
    flops = gpt_step_flops(config, b, t)
    return GPTTiming(timing, flops / timing.numpy, flops / timing.torch)


def _summary(name: str, timings: list[Timing]) -> None:
    """The ratios' geometric mean and range over the sizes, and the widest middle half."""
    ratios = [m.ratio for m in timings]
    geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    widest = max(timings, key=lambda m: m.ratio_q3 / m.ratio_q1)
    print(f"{name}: numpy/torch geometric mean {geo:.2f}x, range {min(ratios):.2f}x - "
          f"{max(ratios):.2f}x over {len(ratios)} sizes; widest middle half "
          f"{widest.ratio_q1:.2f}-{widest.ratio_q3:.2f}x")


def _start(sizes: int, args, about: str, header: str) -> float:
    """Say what the run does (stderr), then what it times -- ``about``, between the versions
    and the clock -- and the table's ``header`` (stdout); the time it starts."""
    import torch

    print(f"bench: {sizes} sizes, each {args.repeats} timed rounds after {args.warmup} "
          f"warm-up", file=sys.stderr, flush=True)
    print(f"numpy {np.__version__} ({_blas_threads()} BLAS threads), torch "
          f"{torch.__version__} ({torch.get_num_threads()} threads); {about}; "
          f"{'CPU time of this process' if args.clock == 'cpu' else 'wall-clock time'}",
          flush=True)
    print(header)
    print("-" * len(header), flush=True)
    return time.perf_counter()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m transformer_lab.course.bench",
        description="Time forward + backward: the NumPy twin vs torch (eager CPU, autograd), "
                    "float32, same weights, batch and masks, in interleaved rounds on one "
                    "thread each; with --model gpt, the GPT's training step against its "
                    "PyTorch twin. Progress goes to stderr, the table to stdout.")
    parser.add_argument("--model", choices=("encoder-decoder", "gpt"), default="encoder-decoder",
                        help="the encoder-decoder's layers (default) or the GPT")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes and few rounds: check that everything runs")
    parser.add_argument("--modules", nargs="+", choices=MODULES, default=list(MODULES))
    parser.add_argument("--blocks", nargs="+", choices=GPT_BLOCKS, default=list(GPT_BLOCKS),
                        help="--model gpt: the 2017 / GPT-2 block, the modern one (default both)")
    parser.add_argument("--d-model", nargs="+", type=int, default=None,
                        help="default 64 128 256; --model gpt: 96 256")
    parser.add_argument("--batch", nargs="+", type=int, default=None,
                        help="default 32 64; --model gpt: 8")
    parser.add_argument("--length", nargs="+", type=int, default=None,
                        help="sequence length (source = target for nn.Transformer); default "
                             "16 32 64; --model gpt: 128")
    parser.add_argument("--heads", type=int, default=None,
                        help="attention heads (default 4 for d_model <= 64, else 8; --model "
                             "gpt: 4 for d_model <= 128)")
    parser.add_argument("--layers", type=int, default=None,
                        help="encoder and decoder layers of nn.Transformer (default 2 + 2); "
                             "--model gpt: the GPT's (default 4)")
    parser.add_argument("--repeats", type=int, default=15,
                        help="timed rounds per size, each one step of each side (default 15)")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed rounds before them (default 3)")
    parser.add_argument("--no-masks", dest="masks", action="store_false",
                        help="no causal / padding masks")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads for NumPy's BLAS and for torch, each (default 1)")
    parser.add_argument("--clock", choices=("cpu", "wall"), default=None,
                        help="what a step's time is: the CPU time this process used (default "
                             "with one thread: other processes' load barely changes it) or "
                             "wall-clock time (default with --threads above 1, where CPU time "
                             "would add up the threads)")
    args = parser.parse_args(argv)
    gpt = args.model == "gpt"
    defaults = ([96, 256], [8], [128], 4) if gpt else ([64, 128, 256], [32, 64], [16, 32, 64], 2)
    for name, value in zip(("d_model", "batch", "length", "layers"), defaults, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.quick:
        args.d_model, args.batch, args.length = [32], [4], [8 if not gpt else 16]
        args.repeats, args.warmup, args.heads, args.layers = 3, 1, 2, 1
    for name in ("repeats", "layers", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must be at least 0")
    if args.clock is None:
        args.clock = "cpu" if args.threads == 1 else "wall"
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    heads = _gpt_default_heads if gpt else _default_heads
    for e in args.d_model:
        h = args.heads or heads(e)
        if e < 1 or e % h:
            parser.error(f"--heads {h} must divide --d-model {e}")
    return _run(args, gpt, heads, clock)


def _run(args, gpt: bool, default_heads: Callable[[int], int], clock) -> int:
    """Time every size of the parsed command line ``args`` (the GPT's step with ``gpt``), one
    table row each, then the summary."""
    from transformer_lab.notebook import limit_threads

    if gpt:  # their BLAS libraries loaded before the limit
        import transformer_lab.models.gpt  # noqa: F401
        import transformer_lab.reference.torch_gpt  # noqa: F401
    limit_threads(args.threads)
    sizes = [(kind, e, b, t) for kind in (args.blocks if gpt else args.modules)
             for e, b, t in itertools.product(args.d_model, args.batch, args.length)]
    names = {**NAMES, "transformer": f"Transformer ({args.layers}+{args.layers})"}
    if gpt:
        start = _start(len(sizes), args,
                       f"the GPT's training step (loss and every gradient), float32, vocabulary "
                       f"{GPT_VOCAB}, {args.layers} layers, {args.repeats} interleaved rounds "
                       f"after {args.warmup} warm-up",
                       f"{'block':<8} {'d_model':>7} {'heads':>5} {'batch':>5} {'length':>6} "
                       f"{'torch ms':>9} {'numpy ms':>9} {'numpy/torch':>11} "
                       f"{'middle half':>13} {'numpy GF/s':>10} {'torch GF/s':>10}")
    else:
        start = _start(len(sizes), args,
                       f"float32, forward + backward, {args.repeats} interleaved rounds after "
                       f"{args.warmup} warm-up, masks {'on' if args.masks else 'off'}; the twins "
                       f"compute with the core",
                       f"{'module':<24} {'d_model':>7} {'batch':>5} {'length':>6} {'heads':>5} "
                       f"{'torch ms':>9} {'numpy ms':>9} {'numpy/torch':>11} {'middle half':>13}")
    timings: dict[str, list[Timing]] = {}
    for k, (kind, e, b, t) in enumerate(sizes):
        h = args.heads or default_heads(e)
        print(f"[{k + 1}/{len(sizes)}] {f'GPT {kind}' if gpt else names[kind]}, d_model {e}, "
              f"batch {b}, length {t} ...", file=sys.stderr, flush=True)
        if gpt:
            r = measure_gpt(kind, e, b, t, h, args.layers, args.repeats, args.warmup, clock)
            m = r.timing
            kv = gpt_config(kind, e, h, args.layers, t).num_kv_heads
            heads = f"{h}/{kv}" if kv != h else f"{h}"
            row, tail = f"{kind:<8} {e:>7} {heads:>5} {b:>5} {t:>6}", \
                f" {r.numpy_flops / 1e9:>10.1f} {r.torch_flops / 1e9:>10.1f}"
        else:
            m = measure(kind, e, b, t, h, args.layers, args.repeats, args.warmup, args.masks,
                        clock)
            row, tail = f"{names[kind]:<24} {e:>7} {b:>5} {t:>6} {h:>5}", ""
        timings.setdefault("GPT" if gpt else names[kind], []).append(m)
        print(f"{row} {m.torch * 1e3:>9.2f} {m.numpy * 1e3:>9.2f} {m.ratio:>10.2f}x "
              f"{m.ratio_q1:>5.2f}-{m.ratio_q3:.2f}x{tail}", flush=True)
        print(f"    {format_seconds(time.perf_counter() - start)} elapsed", file=sys.stderr,
              flush=True)
    print()
    for name, rs in timings.items():
        _summary(name, rs)
    print(f"\n{format_seconds(time.perf_counter() - start)} in all", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
