"""Time the NumPy twins against PyTorch's eager CPU autograd: ``python -m transformer_lab.bench``.

One *step* is what a training step does with the module: forward, then backward of
``loss = sum(out * dout)`` -- gradients of the inputs and of every parameter. Both sides get
the same weights (the twin is built with :func:`transformer_lab.interop.from_torch`), the same
float32 batch, the same masks (a causal mask for the decoder, key padding masks with a few
padded positions) and the same upstream gradient. torch keeps its default thread count.

The two sides are timed alternately, step after step, after a warm-up, and the table reports
the median of each and the ratio numpy/torch (below 1: the NumPy twin is faster).

Options: ``--quick`` (tiny sizes, a few repeats: checks that everything runs), ``--d-model``,
``--batch``, ``--length``, ``--heads``, ``--layers``, ``--repeats``, ``--warmup``,
``--modules``, ``--no-masks``, ``--threads``. See ``--help``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import statistics
import sys
import time

import numpy as np

MODULES = ("encoder_layer", "transformer")


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


def measure(kind: str, e: int, b: int, t: int, h: int, layers: int, repeats: int, warmup: int,
            masks: bool = True) -> tuple[float, float]:
    """Median seconds of one forward + backward step: (torch, numpy twin)."""
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

    def numpy_step():
        twin.forward(*args, **kwargs)
        twin.backward(dout)

    for _ in range(warmup):
        torch_step()
        numpy_step()
    times = {"torch": [], "numpy": []}
    for _ in range(repeats):  # alternate, so that a busy moment hits both sides alike
        for name, step in (("torch", torch_step), ("numpy", numpy_step)):
            t0 = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t0)
    return statistics.median(times["torch"]), statistics.median(times["numpy"])


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
                        help="torch.set_num_threads (default: torch's own, the number of cores); "
                             "NumPy's BLAS threads are set by OPENBLAS_NUM_THREADS in the "
                             "environment, e.g. OPENBLAS_NUM_THREADS=1 ... --threads 1")
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

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    blas_threads = os.environ.get("OPENBLAS_NUM_THREADS", "default")
    print(f"numpy {np.__version__} (OPENBLAS_NUM_THREADS={blas_threads}), torch "
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
