"""Train the encoder-decoder to translate English number expressions into French (notebook 12).

    python -m transformer_lab.train --task translate-fr --seed 0
    python -m transformer_lab.train --task translate-de --seed 0     # German, the other direction

or, from Python::

    from transformer_lab.train.translate import TranslateConfig, train_translation
    result = train_translation(TranslateConfig(seed=0, steps=300, warmup=50))
    result.metrics["exact_match"], result.model.beam_decode(src, beam_size=4)

What a run does and measures: docs/maintainers.md, "Models and trainers"; the commands that made
the shipped checkpoints, and what they cost and reached: docs/results.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

import numpy as np
import sacrebleu

from transformer_lab import device
from transformer_lab.core import training as core_training
from transformer_lab.core import translation as core_translation
from transformer_lab.datasets import SHIPPED
from transformer_lab.datasets import tasks as D
from transformer_lab.datasets.translation import (
    LANGUAGES,
    MOST_EXAMPLES,
    Example,
    TranslationData,
    make_example,
    make_translation_data,
    vocabularies,
)
from transformer_lab.models.encoder_decoder import Transformer, TransformerConfig
from transformer_lab.models.inputs import IGNORE_INDEX, loss_labels
from transformer_lab.optim import Adam, WarmupSchedule
from transformer_lab.train.config import (
    check_choices,
    check_outputs,
    check_run_numbers,
    config_from_args,
    count,
    run_command,
)
from transformer_lab.train.evaluation import teacher_forced_accuracy
from transformer_lab.train.loop import blas_threads, run_steps
from transformer_lab.train.progress import progress_line

#: The checkpoints notebook 12 reads: the trained model, an undertrained one (300 steps), and
#: a German one (English -> German).
CHECKPOINT = SHIPPED / "translate_fr.npz"
EARLY_CHECKPOINT = SHIPPED / "translate_fr_early.npz"
GERMAN_CHECKPOINT = SHIPPED / "translate_de.npz"
#: Longest source and decoder input of the data (72 and 74 characters; a margin).
MAX_LEN = 80
#: Test sentences decoded at a time, and the widest beam of a run: its evaluation, after the
#: training, holds the decoder's caches of TRANSLATE_BATCH x beam_size hypotheses.
TRANSLATE_BATCH = 200
MOST_BEAM = 64


@dataclasses.dataclass(frozen=True)
class TranslateConfig:
    """Everything a translation run depends on (defaults: the shipped checkpoint's run): ``lang``
    ("fr" or "de", ``--task``) and the fields :data:`OPTION_HELP` describes (``--help``)."""

    seed: int = 0
    lang: str = "fr"
    n_train: int = 40_000
    n_val: int = 500
    n_test: int = 1000
    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 2
    d_ff: int = 256
    lr: float = 3e-3
    warmup: int = 200
    steps: int = 2500
    batch_size: int = 64
    clip: float = 1.0
    label_smoothing: float = 0.1
    eval_every: int = 250
    beam_size: int = 4
    alpha: float = 0.6
    threads: int = 1
    time_budget: float | None = None
    device: str = "cpu"

    def __post_init__(self):
        check_choices(self, lang=LANGUAGES, device=device.DEVICES)
        check_run_numbers(self, counts=("seed", "warmup"),
                          positive=("n_train", "n_val", "n_test", "d_model", "num_heads",
                                    "num_layers", "d_ff", "steps", "batch_size", "eval_every",
                                    "beam_size", "threads"),
                          rates=("lr", "clip", "alpha", "label_smoothing"))
        if self.n_train + self.n_val + self.n_test > MOST_EXAMPLES:
            raise ValueError(f"n_train + n_val + n_test must be at most {MOST_EXAMPLES}, got "
                             f"{self.n_train + self.n_val + self.n_test}")
        if self.beam_size > MOST_BEAM:
            raise ValueError(f"beam_size must be at most {MOST_BEAM}, got {self.beam_size}: the "
                             f"evaluation decodes {TRANSLATE_BATCH} test sentences at a time, "
                             f"each with beam_size hypotheses, after training")
        if self.label_smoothing >= 1:
            raise ValueError(f"label_smoothing must be less than 1, got {self.label_smoothing}")
        if self.batch_size > self.n_train:  # a step takes batch_size examples (no partial batch)
            raise ValueError(f"batch_size must be at most n_train = {self.n_train}, got "
                             f"{self.batch_size}")
        self.model_config(3, 3)  # the model's own checks (heads dividing d_model, ...)

    def model_config(self, src_vocab_size: int, tgt_vocab_size: int) -> TransformerConfig:
        return TransformerConfig(
            src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size, d_model=self.d_model,
            num_heads=self.num_heads, num_encoder_layers=self.num_layers,
            num_decoder_layers=self.num_layers, d_ff=self.d_ff, max_len=MAX_LEN,
            norm_first=True, pad_id=D.PAD, bos_id=D.BOS, eos_id=D.EOS)


class SmoothedLoss:
    """The model as ``core.training.train_step`` takes it, with the label-smoothed loss:
    ``loss(src, tgt) -> (loss, grads)`` through ``core.translation``'s forward and backward."""

    def __init__(self, model: Transformer, eps: float):
        self.model, self.eps = model, eps

    def loss(self, src, tgt):
        labels = loss_labels(self.model.config, tgt)  # IGNORE_INDEX after EOS and on padding
        logits, cache = self.model.forward(src, tgt[:, :-1])
        loss, c_loss = core_translation.label_smoothed_loss_forward(
            logits, device.put(labels), self.eps, IGNORE_INDEX)
        dlogits = core_translation.label_smoothed_loss_backward(1.0, c_loss)
        return loss, self.model.backward(dlogits, cache)


# --------------------------------------------------------------------------------------------
# Evaluation


def translate(model: Transformer, examples, beam_size: int = 1, alpha: float = 0.6,
              lang: str = "fr", batch_size: int = TRANSLATE_BATCH) -> list[str]:
    """The translations of ``examples`` (their ``source`` strings) into ``lang`` by beam search
    with the cache (beam size 1: greedy), decoded in batches of similar source lengths."""
    src_vocab, tgt_vocab = vocabularies(lang)
    sources = [src_vocab.encode(e.source) for e in examples]
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    out: list[str] = [""] * len(sources)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        best = model.beam_decode(D.pad([sources[i] for i in idx]), beam_size=beam_size,
                                 alpha=alpha)
        for i, ids in zip(idx, best, strict=True):
            out[i] = tgt_vocab.decode(device.to_host(ids))
    return out


def scores(hypotheses: list[str], examples) -> dict:
    """Exact match, and sacrebleu's corpus BLEU and chrF (one reference each)."""
    refs = [e.target for e in examples]
    return {"exact_match": float(np.mean([h == r for h, r in zip(hypotheses, refs,
                                                                   strict=True)])),
            "bleu": sacrebleu.corpus_bleu(hypotheses, [refs]).score,
            "chrf": sacrebleu.corpus_chrf(hypotheses, [refs]).score}


# --------------------------------------------------------------------------------------------
# Training


@dataclasses.dataclass
class TranslateResult:
    model: Transformer
    data: TranslationData
    metrics: dict
    history: dict
    config: TranslateConfig


def train_translation(config: TranslateConfig | None = None, data: TranslationData | None = None,
                      log=None, **overrides) -> TranslateResult:
    """One run (what it does: docs/maintainers.md, "Models and trainers"); progress lines go to
    ``log`` (None: none)."""
    start = time.perf_counter()
    c = dataclasses.replace(config or TranslateConfig(), **overrides)
    data = data or make_translation_data(c.n_train, c.n_val, c.n_test, c.seed, c.lang)
    with blas_threads(c.threads), device.on(c.device):
        model = Transformer(c.model_config(data.src_vocab.size, data.tgt_vocab.size),
                            seed=c.seed)
        history, timing = _train(c, data, model, log)
        t0 = time.perf_counter()
        greedy = scores(translate(model, data.test, 1, lang=c.lang), data.test)
        beam = scores(translate(model, data.test, c.beam_size, c.alpha, c.lang), data.test)
        eval_seconds = time.perf_counter() - t0
    metrics = {
        "task": f"translate-{c.lang}", "seed": c.seed,
        "exact_match": round(greedy["exact_match"], 4),
        "beam_exact_match": round(beam["exact_match"], 4),
        "bleu": round(greedy["bleu"], 2), "chrf": round(greedy["chrf"], 2),
        "beam_bleu": round(beam["bleu"], 2), "beam_chrf": round(beam["chrf"], 2),
        "beam_size": c.beam_size, "alpha": c.alpha,
        "n_test": len(data.test), "steps": len(history["loss"]), **timing,
        "eval_seconds": round(eval_seconds, 2),
        "seconds": round(time.perf_counter() - start, 2),
        "final_loss": round(float(np.mean(history["loss"][-20:])), 4),
        "params": model.num_parameters(), "threads": c.threads, "device": c.device,
        "sacrebleu": sacrebleu.__version__,
    }
    return TranslateResult(model, data, metrics, history, c)


def _train(c: TranslateConfig, data: TranslationData, model: Transformer, log):
    opt = Adam(model.params, lr=c.lr)
    schedule = WarmupSchedule(c.lr, c.warmup, c.steps)
    smoothed = SmoothedLoss(model, c.label_smoothing)
    val = data.pairs("val")
    rng = np.random.default_rng([c.seed, 1])
    train_pairs = data.pairs("train")
    history: dict = {"loss": [], "val_steps": [], "val_exact_match": []}

    def epochs():  # a new order at each epoch
        while True:
            yield from D.bucketed_batches(train_pairs, c.batch_size, rng, drop_last=True)

    batches = epochs()

    def take_step(i):
        loss, _ = core_training.train_step(smoothed, opt, *next(batches), schedule(i), c.clip)
        history["loss"].append(round(float(loss), 5))
        return loss

    def evaluate(n, loss, seconds):
        exact = teacher_forced_accuracy(model, val)["exact_match"]  # n_val >= 1
        history["val_steps"].append(n)
        history["val_exact_match"].append(round(exact, 4))
        if log is not None:
            print(progress_line(n, c.steps, loss, schedule(n - 1), seconds,
                                f"val exact (teacher-forced) {exact:.4f}"), file=log, flush=True)

    stopped, step_seconds, cpu = run_steps(c.steps, take_step, evaluate, c.eval_every,
                                           c.time_budget)
    timing = {"stopped": stopped, "train_seconds": round(sum(step_seconds), 2),
              "cpu_seconds": round(cpu, 2),
              "step_ms": round(1e3 * statistics.median(step_seconds), 2)}
    return history, timing


# --------------------------------------------------------------------------------------------
# The shipped checkpoint


def held_out_examples(model: Transformer) -> list[Example]:
    """The held-out test examples of the run that trained ``model`` (from its checkpoint's
    record), rebuilt from their numbers: no need to draw the whole data set again."""
    record = model.metadata
    lang = record["config"]["lang"]
    return [make_example(number, kind, lang) for kind, number in record["test"]]


def load_checkpoint(path=CHECKPOINT) -> Transformer:
    """The model of a checkpoint made by ``--checkpoint`` (its record in ``model.metadata``)."""
    return Transformer.load(path)


# --------------------------------------------------------------------------------------------
# Command line


#: What each option of the command line sets (``--help`` adds its default).
OPTION_HELP = {
    "task": "translate-fr: English into French; translate-de: into German",
    "seed": "seed of the data (which numbers, and their split), the initial weights and the "
            "batch order",
    "n_train": "training examples (their numbers shared with no validation or test one)",
    "n_val": "validation examples, for the exact match printed every --eval-every steps",
    "n_test": "held-out test examples, for the final metrics",
    "d_model": "model width E, divisible by --num-heads",
    "num_heads": "attention heads per attention layer",
    "num_layers": "encoder layers, and as many decoder layers",
    "d_ff": "hidden width of the feed-forward networks",
    "lr": "peak learning rate of Adam (after the warm-up; a cosine decay to 0 at --steps)",
    "warmup": "steps of linear warm-up of the learning rate, fewer than --steps",
    "steps": "training steps, the schedule's length",
    "batch_size": "examples per training step (batches of similar lengths)",
    "clip": "clip the gradients to this global norm; 0: no clipping",
    "label_smoothing": "eps of the label-smoothed loss (notebook 12 §4), in [0, 1); 0: plain "
                       "cross-entropy",
    "eval_every": "steps between evaluations on the validation set (teacher-forced exact "
                  "match) and progress lines",
    "beam_size": f"beam size of beam_exact_match, beam_bleu and beam_chrf (1: greedy; at most "
                 f"{MOST_BEAM})",
    "alpha": "length penalty exponent of the beam search, ((5 + |y|) / 6) ** alpha; 0: the "
             "summed log-probability",
    "threads": "BLAS threads for NumPy (one thread: a run is deterministic)",
    "time_budget": "stop after this many seconds of training steps; a budget makes the "
                   "stopping step depend on the machine's speed (see \"stopped\"); None: no "
                   "limit",
    "device": device.HELP,
    "checkpoint": "save the trained model (.npz) here, with its record",
    "examples": "held-out translations printed to stderr at the end (0: none)",
    "quiet": "no progress lines",
}


def _parser() -> argparse.ArgumentParser:
    d = TranslateConfig()
    p = argparse.ArgumentParser(
        prog="python -m transformer_lab.train --task translate-fr",
        description="Train the course encoder-decoder (NumPy) to translate English number "
                    "expressions into French (translate-fr) or German (translate-de), with "
                    "label smoothing. Progress on stderr; one JSON line on stdout: "
                    "exact_match (greedy, held-out numbers), beam_exact_match (beam search), "
                    "bleu and chrf (sacrebleu corpus scores, greedy; beam_bleu, beam_chrf), "
                    "seconds (the whole run), train_seconds and cpu_seconds (training steps "
                    "only), steps, stopped, params, threads, device; checkpoint (with "
                    "--checkpoint, the path saved).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--task", choices=[f"translate-{lang}" for lang in LANGUAGES],
                   default="translate-fr", help=OPTION_HELP["task"])
    for f in dataclasses.fields(TranslateConfig):
        if f.name in ("lang",):
            continue
        kind = float if f.name == "time_budget" else type(getattr(d, f.name))
        extra = {"choices": device.DEVICES} if f.name == "device" else {}
        p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=kind,
                       default=getattr(d, f.name), help=OPTION_HELP[f.name], **extra)
    p.add_argument("--checkpoint", help=OPTION_HELP["checkpoint"])
    p.add_argument("--examples", type=count, default=5, help=OPTION_HELP["examples"])
    p.add_argument("--quiet", action="store_true", help=OPTION_HELP["quiet"])
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(argv)
    config = config_from_args(parser, args, TranslateConfig, lang=args.task.split("-")[1])
    check_outputs(parser, checkpoint=args.checkpoint)
    log = None if args.quiet else sys.stderr
    if log:
        print(f"{args.task}: {config.n_train} training numbers, d_model {config.d_model}, "
              f"{config.num_layers}+{config.num_layers} layers, batch {config.batch_size}, "
              f"{config.steps} steps, label smoothing {config.label_smoothing}, "
              f"{config.threads} thread(s)", file=log, flush=True)
    result = train_translation(config, log=log)
    data, metrics = result.data, result.metrics
    if args.checkpoint:  # saved first: the examples below decode again
        record = {"command": run_command(argv), "metrics": metrics,
                  "config": dataclasses.asdict(config), "history": result.history,
                  "test": [[e.kind, e.number] for e in data.test]}
        metrics["checkpoint"] = result.model.save(args.checkpoint, metadata=record)
    shown = translate(result.model, data.test[:args.examples], config.beam_size, config.alpha,
                      config.lang) if args.examples else []
    for e, hyp in zip(data.test[:args.examples], shown, strict=True):
        print(f"{e.source} -> {hyp}  {'ok' if hyp == e.target else 'WRONG: ' + e.target}",
              file=sys.stderr)
    print(json.dumps(metrics), file=sys.stdout, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
