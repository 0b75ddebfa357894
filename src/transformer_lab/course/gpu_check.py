"""The core on an NVIDIA GPU, measured once and recorded (issue 38):

    python -m transformer_lab.course.gpu_check --out DIR [--budget 360] [--quick] [--parts ...]

on a machine with CuPy, PyTorch and a GPU; it needs numpy, scipy, threadpoolctl, cupy, torch and
this package only. About 7.5 minutes at the defaults (``--quick``: about one minute, tiny sizes).
What it measures -- the GPT's loss and gradients on CuPy against the CPU's (:func:`parity`), a
training step against the PyTorch twin's on the same GPU (:func:`timing`), the trainer on the
GPU for ``--budget`` seconds against the shipped checkpoint (:func:`training`) -- is said for
readers in docs/results.md, "The core on a GPU". Each part is recorded whatever the others do
(an error is recorded, and the run goes on) in ``DIR/gpu_record.json`` (machine, versions,
every figure, the command), with a summary on stdout. ``--parts timing`` (or ``parity``,
``training``) runs only those: a change measured again without the rest.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from transformer_lab import device
from transformer_lab.datasets.corpus import VOCAB
from transformer_lab.gradient_check import rel_error
from transformer_lab.models.gpt import GPT, GPTConfig
from transformer_lab.tools import round_robin_times

PARITY_TOL = 1e-5
TIMING_TARGET = 2.5
KINDS = {"classic": {}, "modern": {"block": "modern"}, "tiled": {"attention_block_size": 64}}
PARTS = ("parity", "timing", "training")
#: The training run of part 3: the shipped CPU model at batch 64 (8 there), with dropout 0.1
#: and weight decay 0.1, which it needs at that batch (docs/results.md has its run on a CPU);
#: fewer steps if the budget would not hold them.
TRAIN = dict(block="classic", d_model=96, num_heads=4, num_layers=4, context=128, batch_size=64,
             steps=6000, lr=3e-3, final_lr=3e-4, warmup=200, weight_decay=0.1, dropout=0.1,
             eval_every=1000)


def gpt_config(kind: str, d_model: int, layers: int, length: int,
               vocab: int = len(VOCAB)) -> GPTConfig:
    options = dict(KINDS[kind])
    make = GPTConfig.modern if options.pop("block", "classic") == "modern" else GPTConfig.classic
    return make(vocab, d_model=d_model, num_heads=max(d_model // 64, 4), num_layers=layers,
                max_len=length, **options)


def parity(kind: str, d_model: int, layers: int = 2, length: int = 128, batch: int = 4) -> dict:
    """Part 1 for one model: the loss and every gradient on the GPU against the CPU's; and
    the global norm that clipping sums over the gradients laid end to end there (recorded)."""
    from transformer_lab.optim import clip_grad_norm, global_norm

    config = gpt_config(kind, d_model, layers, length)
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (batch, length))
    with device.on("cpu"):
        model = GPT(config, seed=0)
        cpu_loss, cpu_grads = model.loss(ids)
        cpu_norm = global_norm(cpu_grads)
    with device.on("cuda"):
        gpu_model = model.copy()
        loss, grads = gpu_model.loss(ids)
        norm = clip_grad_norm(grads, max_norm=2 * cpu_norm)  # nothing is clipped
        grads = {name: device.to_host(g) for name, g in grads.items()}
        sampled = device.to_host(gpu_model.generate(ids[:2, :4], 8, temperature=0.8, top_k=10,
                                                    top_p=0.9, seed=0))  # runs on the GPU
    errors = {name: rel_error(grads[name], g) for name, g in cpu_grads.items()}
    errors["loss"] = abs(loss - cpu_loss) / abs(cpu_loss)
    worst = max(errors, key=errors.get)
    return {"kind": kind, "d_model": d_model, "layers": layers, "length": length,
            "batch": batch, "loss_cpu": cpu_loss, "loss_device": loss, "worst": worst,
            "worst_error": errors[worst], "pass": errors[worst] < PARITY_TOL, "errors": errors,
            "parameters": sum(g.size for g in grads.values()),
            "global_norm_error": abs(norm - cpu_norm) / cpu_norm, "sampled": sampled.tolist()}


def timing(d_model: int = 384, layers: int = 6, length: int = 256, batch: int = 64,
           rounds: int = 10, warmup: int = 3, torch_device: str = "cuda") -> dict:
    """Part 2: median seconds of a training step, and of forward and backward alone, of the core
    on the GPU and of the PyTorch twin on ``torch_device``, in interleaved rounds; then where the
    core's step goes (:func:`by_function`)."""
    import torch

    from transformer_lab.optim import Adam, clip_grad_norm
    from transformer_lab.reference.torch_gpt import TorchGPT
    from transformer_lab.train.charlm import decay_groups

    config = gpt_config("classic", d_model, layers, length)
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (batch, length))
    with device.on("cpu"):
        host = GPT(config, seed=0)
    twin = TorchGPT.from_numpy(host).to(torch_device)
    named = dict(twin.named_parameters())
    groups = [{"params": [named[n] for n in names], "weight_decay": decay}
              for names, decay in zip(decay_groups(host.params), (0.1, 0.0), strict=True)]
    torch_opt = torch.optim.AdamW(groups, lr=1e-4)

    def synchronize():
        if hasattr(device.xp, "cuda"):  # CuPy's (the tests' stand-in has none)
            device.xp.cuda.Device().synchronize()
        if torch_device == "cuda":
            torch.cuda.synchronize()

    with device.on("cuda"):
        model = host.copy()
        decayed, kept = decay_groups(model.params)
        opts = [Adam(decayed, lr=1e-4, weight_decay=0.1, decoupled=True),
                Adam(kept, lr=1e-4, decoupled=True)]

        def core(step: bool):  # a training step, or forward and backward alone
            loss, grads = model.loss(ids)
            if step:
                clip_grad_norm(grads, 1.0)
                for opt in opts:
                    opt.step({name: grads[name] for name in opt.params})
            synchronize()

        def torch_(step: bool):
            torch_opt.zero_grad(set_to_none=True)
            twin.loss(ids).backward()
            if step:
                torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0)
                torch_opt.step()
            synchronize()

        times = round_robin_times({"core step": lambda: core(True),
                                   "torch step": lambda: torch_(True),
                                   "core forward+backward": lambda: core(False),
                                   "torch forward+backward": lambda: torch_(False)},
                                  rounds, warmup)
        own = by_function(lambda: core(True), synchronize)
    medians = {name: statistics.median(t) for name, t in times.items()}
    ratio = statistics.median(c / t for c, t in zip(times["core step"], times["torch step"],
                                                    strict=True))
    return {"d_model": d_model, "layers": layers, "heads": config.num_heads, "length": length,
            "batch": batch, "rounds": rounds, "warmup": warmup, "median_seconds": medians,
            "core_over_torch_step": ratio, "target": TIMING_TARGET,
            "pass": ratio <= TIMING_TARGET, "core step by function": own, "seconds": times}


def by_function(step, synchronize, repeats: int = 3) -> dict[str, float]:
    """Seconds of ``step`` spent in each function of the core, its own time (that of the core
    functions it calls taken out), and ``"outside the core"``, per step, the most first. The
    device is synchronised as each core function starts and ends: the sum is a slower step's,
    and each function is charged the GPU's work that it queued."""
    core = str(device._CORE)  # the folder of the core's modules
    own: collections.Counter = collections.Counter()
    starts, inner = [], [0.0]  # the open calls' start, and seconds spent in their core callees

    def profile(frame, event, arg):
        if event in ("call", "return") and frame.f_code.co_filename.startswith(core):
            synchronize()
            now = time.perf_counter()
            if event == "call":
                starts.append(now)
                inner.append(0.0)
            else:
                spent = now - starts.pop()
                own[frame.f_code.co_name] += spent - inner.pop()
                inner[-1] += spent

    start = time.perf_counter()
    sys.setprofile(profile)
    try:
        for _ in range(repeats):
            step()
    finally:
        sys.setprofile(None)
    own["outside the core"] = time.perf_counter() - start - inner[0]
    return {name: seconds / repeats for name, seconds in own.most_common()}


def training(budget: float, overrides: dict | None = None, corpus=None) -> dict:
    """Part 3: the trainer on the GPU, ``TRAIN``'s run, or as many of its steps as ``budget``
    seconds hold when they hold fewer; the shipped checkpoint's bits per character on this
    machine's corpus beside it."""
    from transformer_lab.datasets.corpus import load_corpus
    from transformer_lab.train import charlm

    corpus = corpus or load_corpus()
    config = charlm.CharLMConfig(**{**TRAIN, **(overrides or {})}, device="cuda")
    at = {}  # training seconds after steps 20, 40, 60 of a probe
    charlm.train_charlm(config, corpus, lambda d: at.update({d["step"]: d["seconds"]}),
                        steps=60, warmup=5, eval_every=20)
    step = (at[60] - at[20]) / 40  # warm steps: CuPy compiles its kernels in the first ones
    steps = min(config.steps, max(config.warmup + 1, int(0.9 * budget / step)))
    config = dataclasses.replace(config, steps=steps, time_budget=budget)
    curve = []
    result = charlm.train_charlm(config, corpus, lambda d: curve.append(
        [d["step"], round(d["val_bits_per_char"], 4), round(d["seconds"], 1)]))
    with device.on("cuda"):
        shipped = charlm.bits_per_char(GPT.load(charlm.CHECKPOINT), corpus.val_ids)
    metrics = result.metrics
    return {"config": dataclasses.asdict(config), "probe_step_seconds": step,
            "metrics": metrics, "val_curve_subset": curve,
            "shipped_checkpoint_val_bits_per_char_here": shipped,
            "shipped_record_val_bits_per_char": json.loads(charlm.BLOCKS_RECORD.read_text())[
                "classic"]["metrics"]["val_bits_per_char"],
            "beats_shipped": metrics["val_bits_per_char"] < shipped,
            "corpus": {"numpy": corpus.numpy_version, "train_tokens": int(corpus.train_ids.size),
                       "val_tokens": int(corpus.val_ids.size)}}


def machine() -> dict:
    """The GPU's name and the versions that made the figures (CuPy: the module the core is
    bound to)."""
    import torch

    cupy = device.xp

    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"]
    return {"gpu": name.decode() if isinstance(name, bytes) else name,
            "cupy": cupy.__version__, "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
            "cuda_driver": cupy.cuda.runtime.driverGetVersion(), "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "numpy": np.__version__,
            "python": platform.python_version(), "cpu": platform.processor()}


def _part(record: dict, name: str, run, out: Path) -> None:
    """``record[name] = run()``, or the error and its traceback; the seconds it took; the record
    so far written to ``out/gpu_record.json`` (a run cut short keeps its finished parts)."""
    start = time.perf_counter()
    try:
        record[name] = run()
    except Exception as e:  # recorded, and the next part runs
        record[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    record.setdefault("part_seconds", {})[name] = round(time.perf_counter() - start, 1)
    (out / "gpu_record.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(f"gpu_check: {name} done in {record['part_seconds'][name]} s", file=sys.stderr,
          flush=True)


def run(out: Path, budget: float, quick: bool, torch_device: str = "cuda", corpus=None,
        parts=PARTS) -> dict:
    """The ``parts`` named (all three by default); the record, also written to
    ``out/gpu_record.json`` (``torch_device`` and ``corpus``: the tests' CPU and small
    corpus)."""
    record: dict = {"command": " ".join(["python -m transformer_lab.course.gpu_check",
                                         *sys.argv[1:]]), "quick": quick}
    out.mkdir(parents=True, exist_ok=True)
    _part(record, "device", lambda: device.use("cuda") or device.name, out)
    _part(record, "machine", machine, out)
    sizes = (32,) if quick else (96, 384)
    for kind in KINDS if "parity" in parts else ():
        for d in sizes:
            _part(record, f"parity {kind} d{d}",
                  lambda k=kind, d=d: parity(k, d, layers=1 if quick else 2,
                                             length=32 if quick else 128), out)
    small = dict(d_model=64, layers=2, length=64, batch=8, rounds=3, warmup=1) if quick else {}
    if "timing" in parts:
        _part(record, "timing", lambda: timing(**small, torch_device=torch_device), out)
    tiny = dict(d_model=32, num_layers=1, warmup=5, eval_every=50) if quick else None
    if "training" in parts:
        _part(record, "training", lambda: training(budget, tiny, corpus), out)
    device.use("cpu")
    print(summary(record))
    return record


def summary(record: dict) -> str:
    lines = [f"machine: {record['machine'].get('error', record['machine'])}"]
    for name, part in record.items():
        if name.startswith("parity"):
            lines.append(f"{name}: " + (part.get("error") or
                                        f"worst {part['worst']} {part['worst_error']:.2e} "
                                        f"({'pass' if part['pass'] else 'FAIL'} < {PARITY_TOL}); "
                                        f"global norm {part['global_norm_error']:.1e}"))
    t, r = record.get("timing"), record.get("training")
    if t:
        lines.append("timing: " + (t.get("error") or ", ".join(
            f"{k} {1e3 * s:.1f} ms" for k, s in t["median_seconds"].items())
            + f"; core/torch step {t['core_over_torch_step']:.2f}x (target <= {TIMING_TARGET}x); "
            + "most of a synchronised core step: " + ", ".join(
                f"{k} {1e3 * s:.1f} ms" for k, s in list(t["core step by function"].items())[:6])))
    if r:
        lines.append("training: " + (r.get("error") or (
            f"{r['metrics']['steps']} steps in {r['metrics']['train_seconds']:.0f} s, "
            f"val {r['metrics']['val_bits_per_char']:.3f} bits/char against the shipped "
            f"checkpoint's {r['shipped_checkpoint_val_bits_per_char_here']:.3f} here")))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m transformer_lab.course.gpu_check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for gpu_record.json")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds of training steps in part 3 (default 360; --quick: 20)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: about one minute")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=PARTS,
                        help="the parts to run (default all three): e.g. timing alone, to "
                             "measure a change again without the rest")
    args = parser.parse_args(argv)
    budget = args.budget if args.budget is not None else 20.0 if args.quick else 360.0
    if budget <= 0:
        parser.error("--budget must be positive")
    run(Path(args.out), budget, args.quick, parts=args.parts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
