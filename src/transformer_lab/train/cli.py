"""The command line, ``python -m transformer_lab.train``: progress on stderr, exactly one JSON
line of metrics on stdout (``--help`` describes every option and every key)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import textwrap

from transformer_lab import _validate as v
from transformer_lab import device
from transformer_lab.datasets import tasks as D
from transformer_lab.models.config import POSITIONAL
from transformer_lab.optim import DECAYS
from transformer_lab.train import charlm
from transformer_lab.train.compare import step_times
from transformer_lab.train.config import (
    DTYPES,
    OPTIMIZERS,
    TASK_DEFAULTS,
    TrainConfig,
    check_outputs,
    count,
    make_model,
    model_config,
)
from transformer_lab.train.loop import train


def _translate(argv) -> int:
    """``--task translate-fr|translate-de``: :func:`transformer_lab.train.translate.main`,
    imported when used (it brings num2words and sacrebleu)."""
    from transformer_lab.train import translate

    return translate.main(argv)


#: The tasks with a training loop of their own (their command line parses its own options).
TRAINERS = {"charlm": charlm.main, "translate-fr": _translate, "translate-de": _translate}


#: What each key of the final JSON line means (``--help`` prints it).
METRICS_HELP = {
    "task": "the task trained",
    "seed": "the seed of the data, the initial weights and the batch order",
    "exact_match": "held-out test sequences decoded exactly right (greedy decoding), 0..1",
    "token_accuracy": "held-out target tokens right at their position (greedy decoding), 0..1",
    "val_exact_match": "validation exact match at the last evaluation (teacher-forced, which "
                       "equals greedy decoding's up to near-ties of float rounding)",
    "n_test": "number of held-out test sequences",
    "steps": "training steps taken",
    "stopped": 'why training stopped: "target" (validation exact match reached --target), '
               '"steps" (all --steps done) or "time" (--time-budget used up)',
    "seconds": "wall-clock seconds of the whole run: data, training, evaluations",
    "train_seconds": "seconds spent in training steps only",
    "tokens_per_s": "non-padding source and target tokens per second of training step",
    "step_ms": "median milliseconds of one training step",
    "final_loss": "mean training loss over the last 20 steps",
    "params": "number of model parameters",
    "threads": "BLAS threads used",
    "device": "where the core ran: cpu (NumPy) or cuda (CuPy on an NVIDIA GPU)",
    "checkpoint": "(with --checkpoint) the path of the saved model",
    "step_ms_numpy, step_ms_torch, step_ms_nn_transformer, numpy_over_torch, "
    "numpy_over_nn_transformer": "(with --compare-torch) median step times and their ratios",
}


def _default(name: str) -> str:
    """'default: X' for a TrainConfig field, with the tasks whose default differs."""
    value = next(f.default for f in dataclasses.fields(TrainConfig) if f.name == name)
    text = f"default: {value}"
    special = [f"{task}: {d[name]}" for task, d in TASK_DEFAULTS.items() if name in d]
    return text + (f"; {', '.join(special)}" if special else "")


def _parser() -> argparse.ArgumentParser:
    epilog = ("stdout gets one line, a JSON object of metrics (progress and examples go to "
              "stderr):\n")
    epilog += "\n".join(textwrap.fill(f"{key}: {text}", 79, initial_indent="  ",
                                       subsequent_indent="      ")
                         for key, text in METRICS_HELP.items())
    p = argparse.ArgumentParser(
        prog="python -m transformer_lab.train",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train the course Transformer (NumPy) on a toy sequence task. Writes "
                    "progress to stderr and one JSON line of metrics to stdout (held-out exact "
                    "match, token accuracy, steps, seconds, tokens per second; see below).",
        epilog=epilog)
    g = p.add_argument_group("data")
    g.add_argument("--task", choices=[*D.TASKS, *TRAINERS], default="reverse",
                   help="default: reverse (--task charlm trains notebook 13's GPT on text: "
                        "python -m transformer_lab.train --task charlm --help; --task "
                        "translate-fr notebook 12's translator: --task translate-fr --help)")
    g.add_argument("--seed", type=int, default=0,
                   help="seed of the data, initial weights and batch order (default: 0)")
    g.add_argument("--min-len", type=int,
                   help=f"shortest source (add: digits per operand; {_default('min_len')})")
    g.add_argument("--max-len", type=int,
                   help="longest source (add: digits per operand; default: 10; add: 3)")
    g.add_argument("--num-symbols", type=int,
                   help=f"alphabet size of copy/reverse/sort ({_default('num_symbols')})")
    g.add_argument("--n-train", type=int,
                   help=f"training sequences, all distinct ({_default('n_train')})")
    g.add_argument("--n-val", type=int,
                   help=f"validation sequences, for early stopping ({_default('n_val')})")
    g.add_argument("--n-test", type=int,
                   help=f"held-out test sequences, for the metrics ({_default('n_test')})")
    g = p.add_argument_group("model")
    g.add_argument("--d-model", type=int,
                   help=f"model width E, divisible by --heads ({_default('d_model')})")
    g.add_argument("--heads", dest="num_heads", type=int,
                   help=f"attention heads per attention layer ({_default('num_heads')})")
    g.add_argument("--layers", dest="num_layers", type=int,
                   help=f"encoder layers = decoder layers ({_default('num_layers')})")
    g.add_argument("--d-ff", type=int,
                   help=f"hidden width of the feed-forward networks ({_default('d_ff')})")
    g.add_argument("--positional", choices=POSITIONAL,
                   help=f"positional encoding ({_default('positional')})")
    g.add_argument("--post-norm", dest="norm_first", action="store_const", const=False,
                   help="post-norm layers LN(x + f(x)), as in the paper (default: pre-norm, "
                        "x + f(LN(x)))")
    g.add_argument("--dtype", choices=DTYPES, help=_default("dtype"))
    g = p.add_argument_group("optimisation")
    g.add_argument("--optimizer", choices=OPTIMIZERS,
                   help=f"{_default('optimizer')}; sgd uses momentum "
                        f"{TrainConfig.momentum}")
    g.add_argument("--lr", type=float, help=f"peak learning rate ({_default('lr')})")
    g.add_argument("--warmup", type=int,
                   help=f"linear warm-up steps, fewer than --steps ({_default('warmup')})")
    g.add_argument("--decay", choices=DECAYS,
                   help=f"learning-rate decay after the warm-up, to 0 at --steps "
                        f"({_default('decay')})")
    g.add_argument("--weight-decay", type=float, help=_default("weight_decay"))
    g.add_argument("--clip", type=float,
                   help=f"clip gradients to this global norm, 0: off ({_default('clip')})")
    g.add_argument("--batch-size", type=int, help=_default("batch_size"))
    g.add_argument("--no-bucket", dest="bucket", action="store_const", const=False,
                   help="random batches instead of batches of similar lengths (default: "
                        "bucketed)")
    g.add_argument("--steps", type=int,
                   help=f"most training steps, the schedule's length ({_default('steps')})")
    g = p.add_argument_group("stopping and output")
    g.add_argument("--target", type=float,
                   help="stop when validation exact match reaches it; 0: never stop early "
                        f"({_default('target')})")
    g.add_argument("--eval-every", type=int,
                   help=f"steps between validation evaluations ({_default('eval_every')})")
    g.add_argument("--time-budget", type=float,
                   help="seconds of training steps, evaluations not counted (default: none, "
                        "also 0; a budget makes the stopping step depend on the machine's "
                        "speed, see \"stopped\")")
    g.add_argument("--threads", type=int,
                   help="BLAS threads for NumPy during training (default: 1; the model's "
                        "64 x 64 matrices are too small for more threads to pay off, and on a "
                        "busy machine more are often slower)")
    g.add_argument("--device", choices=device.DEVICES, help=device.HELP)
    g.add_argument("--checkpoint", help="save the trained model to this .npz file")
    g.add_argument("--init", help="start from the parameters of this checkpoint")
    g.add_argument("--progress", choices=("auto", "bar", "lines", "none"), default="auto",
                   help="auto: a bar if stderr is a terminal, plain lines otherwise "
                        "(default: auto)")
    g.add_argument("--log-every", type=int,
                   help="steps between plain progress lines (default: --eval-every)")
    g.add_argument("--examples", type=count, default=0,
                   help="print this many held-out examples (source -> prediction) to stderr "
                        "(default: 0)")
    g.add_argument("--compare-torch", action="store_true",
                   help="also time one training step in NumPy and in PyTorch (eager CPU, "
                        "same threads) and add the ratios to the metrics")
    return p


def _trainer_of(argv):
    """The command line of the task ``argv`` names: the encoder-decoder's toy tasks (:func:`
    train_seq2seq`) or the GPT's ``charlm`` (:func:`transformer_lab.train.charlm.main`, which
    has its own options: ``--task charlm --help``). Only ``--task`` is read here."""
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--task", default="reverse")
    task = first.parse_known_args(argv)[0].task
    return TRAINERS.get(task, train_seq2seq)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        return _trainer_of(argv)(argv)
    except NotImplementedError as e:  # a handout's stub: its message says what to write
        print(f"python -m transformer_lab.train: stopped at a function not written yet: {e}",
              file=sys.stderr)
        return 1
    except FloatingPointError as e:  # the run diverged (train.loop.diverging): one line
        print(f"python -m transformer_lab.train: error: {e}", file=sys.stderr)
        return 1
    except MemoryError as e:  # NumPy's or CuPy's: the array it could not allocate
        print(f"python -m transformer_lab.train: error: out of memory ({e}); a smaller "
              "batch, context or model needs less", file=sys.stderr)
        return 1


def train_seq2seq(argv) -> int:
    """``python -m transformer_lab.train --task {copy,reverse,sort,add} ...``: train the
    encoder-decoder, one JSON line of metrics on stdout."""
    parser = _parser()
    args = parser.parse_args(argv)
    # the TrainConfig fields given as options (task, seed, target, time_budget: below)
    options = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
               if f.name not in ("task", "seed", "target", "time_budget")
               and getattr(args, f.name, None) is not None}
    if args.target is not None:
        options["target"] = args.target or None
    if args.time_budget is not None:
        options["time_budget"] = args.time_budget or None
    try:
        cfg = TrainConfig.for_task(args.task, seed=args.seed, **options)
        model_config(cfg, cfg.get_task())  # checks the model's sizes before any work
        device.use(cfg.device)  # CuPy and a GPU for cuda, checked before any work
        if args.log_every is not None:
            v.integer(args.log_every, "--log-every", minimum=1)
        init = None
        if args.init:
            init = make_model(cfg)
            init.load_params(args.init)
    except device.DeviceError as e:  # not a mistake in the options: the sentence alone
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    except (ValueError, TypeError) as e:
        parser.error(str(e))
    check_outputs(parser, checkpoint=args.checkpoint)
    log = sys.stderr  # progress and examples; stdout gets only the JSON line
    if args.progress != "none":
        print(f"training {cfg.task} (lengths {cfg.min_len}..{cfg.get_task().max_len}), seed "
              f"{cfg.seed}: d_model {cfg.d_model}, {cfg.num_heads} heads, {cfg.num_layers}+"
              f"{cfg.num_layers} {'pre' if cfg.norm_first else 'post'}-norm layers, batch "
              f"{cfg.batch_size}, up to {cfg.steps} steps ({cfg.warmup} warm-up), "
              f"{cfg.threads} BLAS thread(s), device {cfg.device}", file=log, flush=True)
    result = train(cfg, progress=args.progress, log_every=args.log_every, stream=log,
                   checkpoint=args.checkpoint, model=init)
    metrics = dict(result.metrics)
    if args.examples:
        for src, tgt, pred, ok in result.examples(args.examples):
            print(f"{src:>24} -> {pred:<24} {'ok' if ok else 'WRONG, expected ' + tgt}",
                  file=log)
    if args.compare_torch:
        with device.on("cpu"):  # eager CPU against eager CPU
            t = step_times(cfg, threads=cfg.threads)
        metrics["step_ms_numpy"] = round(1e3 * t["numpy"], 2)
        metrics["step_ms_torch"] = round(1e3 * t["torch"], 2)
        metrics["step_ms_nn_transformer"] = round(1e3 * t["nn.Transformer"], 2)
        metrics["numpy_over_torch"] = round(t["numpy"] / t["torch"], 3)
        metrics["numpy_over_nn_transformer"] = round(t["numpy"] / t["nn.Transformer"], 3)
    print(json.dumps(metrics), file=sys.stdout, flush=True)
    return 0
