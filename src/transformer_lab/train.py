"""Train the course Transformer (NumPy) on a toy task: ``python -m transformer_lab.train``.

    python -m transformer_lab.train --task reverse --seed 0
    python -m transformer_lab.train --task add --steps 4000 --checkpoint add.npz

or, from Python (notebook 07)::

    from transformer_lab.train import train
    result = train("reverse", seed=0)         # TrainConfig fields as keywords
    result.metrics["exact_match"]             # held-out exact match
    result.history.loss                       # one value per step
    result.model.greedy_decode(src)

What one run does:

1. **Data** (:mod:`transformer_lab.data`): ``n_train + n_val + n_test`` distinct source sequences
   of the task, drawn from ``seed``, split into a training set, a validation set and a held-out
   test set that share no source sequence.
2. **Model**: :class:`transformer_lab.transformer.Transformer` with ``num_layers`` encoder and
   decoder layers (pre-norm; ``norm_first=False``, ``--post-norm``: the paper's post-norm),
   initialised from ``seed``.
3. **Training**: Adam on shuffled padded batches of similar lengths (bucketed: little padding);
   learning rate warmed up linearly over ``warmup`` steps, then decayed to zero along a half
   cosine at ``steps`` (``warmup`` must be less than ``steps``, else the run would end at the
   peak learning rate); gradients clipped to global norm ``clip``.
4. **Early stopping**: every ``eval_every`` steps the model is scored on the *validation* set
   (teacher-forced exact match, which equals greedy decoding's up to float rounding; see
   :func:`teacher_forced_accuracy`); training stops as soon as it reaches ``target`` (default
   1.0: every validation sequence right), or after ``steps``, or -- only when one is given --
   when ``time_budget`` seconds have passed. The held-out test set is used once, at the end.
5. **Metrics**: greedy decoding of the held-out test set: exact match (the whole sequence
   right) and token accuracy; steps, seconds, tokens per second.

**Threads.** The model's matrices are small (64 x 64): a multithreaded BLAS spends more time
handing work between threads than computing, and on a shared 2-core machine it is several times
*slower* than one thread. So training runs with ``threads=1`` BLAS thread by default (set with
``threadpoolctl`` for the duration of the run, restored afterwards); ``--threads`` changes it.
(Notebooks get one thread for NumPy and torch from ``setup_notebook``.)

**Determinism.** With one thread and no time budget (the default), a run is deterministic: the
same seed gives the same losses, the same stopping step, the same model, on any machine. A
``time_budget`` (``--time-budget SECONDS``) makes the stopping step depend on the machine's
speed; the metrics say why a run stopped (``"stopped"``: ``"target"``, ``"steps"`` or
``"time"``), so a run cut short by the clock is visible in its JSON line.

The command line writes its progress to **stderr** -- a bar on a terminal (``\\r``-updated),
otherwise one plain line every ``--log-every`` steps (default: every evaluation) with the loss,
the learning rate and the latest validation scores -- and exactly one JSON line of metrics to
**stdout**, so that ``python -m transformer_lab.train ... > metrics.json`` captures only the JSON
(``--help`` describes every key).

**Defaults** (:class:`TrainConfig`, :data:`TASK_DEFAULTS`): d_model 64, 4 heads, 2 + 2 layers,
d_ff 128 (170 thousand parameters); batches of 64; Adam, peak lr 3e-3, 100 warm-up steps,
cosine decay over 1000 steps (3000 for "add"); clipping at 1; 40 000 training, 500 validation
and 1000 held-out sequences. Measured on a shared 2-core machine: reverse, copy and sort reach
99.5-100 % held-out exact match in 700-800 steps (about 10 s of CPU time), addition in about
2000-3000 steps (about 25 s).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import textwrap
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
from threadpoolctl import threadpool_limits

from transformer_lab import _validate as v
from transformer_lab import data as D
from transformer_lab import optim
from transformer_lab.bench import median_times
from transformer_lab.optim import SGD, Adam, WarmupSchedule, clip_grad_norm
from transformer_lab.transformer import POSITIONAL, Transformer, TransformerConfig

__all__ = ["TrainConfig", "TrainResult", "History", "train", "evaluate", "make_model",
           "make_data", "batch_stream", "train_step", "torch_loss_curve", "numpy_loss_curve",
           "step_times", "teacher_forced_accuracy", "blas_threads", "main"]

# --------------------------------------------------------------------------------------------
# Configuration


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything a training run depends on. ``TrainConfig.for_task(name)`` gives the defaults.

    Data: ``task``, ``min_len``/``max_len`` (source lengths; for "add": digits per operand),
    ``num_symbols`` (copy/reverse/sort alphabet), ``n_train``/``n_val``/``n_test`` sequences.
    Model: ``d_model``, ``num_heads``, ``num_layers`` (encoder and decoder each), ``d_ff``,
    ``positional`` ("sinusoidal", "learned", "none"), ``norm_first`` (True: pre-norm; False:
    the paper's post-norm).
    Optimisation: ``optimizer`` ("adam", "adamw" or "sgd" with ``momentum``), ``lr`` (peak),
    ``warmup`` steps (fewer than ``steps``), ``decay`` ("cosine", "linear", "inverse_sqrt"),
    ``weight_decay``, ``clip``
    (global gradient norm; 0 = off), ``batch_size``, ``bucket`` (batches of similar lengths),
    ``steps``.
    Stopping: ``target`` (validation exact match that stops training; None = never stop early),
    ``eval_every`` steps, ``time_budget`` seconds for the training loop (None, the default: no
    limit, so that runs are deterministic; a budget makes the stopping step machine-dependent).
    Run: ``seed`` (data, initial weights and batch order), ``threads`` (BLAS threads),
    ``dtype`` ("float32" or "float64").
    """

    task: str = "reverse"
    seed: int = 0
    min_len: int = 1
    max_len: int | None = None
    num_symbols: int = 10
    n_train: int = 40_000
    n_val: int = 500
    n_test: int = 1000
    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 2
    d_ff: int = 128
    positional: str = "sinusoidal"
    norm_first: bool = True
    optimizer: str = "adam"
    lr: float = 3e-3
    warmup: int = 100
    decay: str = "cosine"
    weight_decay: float = 0.0
    momentum: float = 0.9
    clip: float = 1.0
    batch_size: int = 64
    bucket: bool = True
    steps: int = 1000
    eval_every: int = 100
    target: float | None = 1.0
    time_budget: float | None = None
    threads: int = 1
    dtype: str = "float32"

    def __post_init__(self):
        self._check_choices()
        self._check_numbers()
        want = self.n_train + self.n_val + self.n_test
        capacity = D.num_sources(self.get_task())
        if want > capacity:
            raise ValueError(f"n_train + n_val + n_test = {want} exceeds the {capacity} distinct "
                             f"sources of task {self.task!r} with lengths {self.min_len}.."
                             f"{self.get_task().max_len}: ask for fewer sequences (n_train)")
        if self.n_val == 0 and self.target is not None:
            raise ValueError("early stopping (target) needs a validation set: n_val > 0, or "
                             "target=None")

    def _check_choices(self) -> None:
        for name, choices in (("task", D.TASKS), ("optimizer", ("adam", "adamw", "sgd")),
                              ("decay", ("cosine", "linear", "inverse_sqrt")),
                              ("positional", POSITIONAL), ("dtype", ("float32", "float64"))):
            value = getattr(self, name)
            if not isinstance(value, str) or value not in choices:
                raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
        for name in ("bucket", "norm_first"):
            value = getattr(self, name)
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{name} must be True or False, got {value!r}")
            self._set(name, bool(value))

    def _check_numbers(self) -> None:
        """Every number has the right type and range; ints and floats are stored as Python's
        (so that ``dataclasses.asdict`` is JSON-ready)."""
        for name in ("seed", "n_val", "n_test", "warmup"):
            self._set(name, v.integer(getattr(self, name), name, minimum=0))
        for name in ("min_len", "num_symbols", "n_train", "d_model", "num_heads", "num_layers",
                     "d_ff", "batch_size", "steps", "eval_every", "threads"):
            self._set(name, v.integer(getattr(self, name), name, minimum=1))
        if self.max_len is not None:
            self._set("max_len", v.integer(self.max_len, "max_len", minimum=self.min_len))
        for name in ("lr", "weight_decay", "momentum", "clip"):
            self._set(name, v.real(getattr(self, name), name, minimum=0))
        if self.target is not None:
            self._set("target", v.real(self.target, "target"))
            if not 0 < self.target <= 1:
                raise ValueError(f"target must be in (0, 1] or None, got {self.target!r}")
        if self.time_budget is not None:
            self._set("time_budget", v.real(self.time_budget, "time_budget", positive=True))
        if self.warmup >= self.steps:
            raise ValueError(f"warmup={self.warmup} must be less than steps={self.steps}: the "
                             f"learning rate would still be rising (or at its peak) at the last "
                             f"step, with no decay; lower warmup (--warmup) or raise steps "
                             f"(--steps)")

    def _set(self, name: str, value) -> None:
        object.__setattr__(self, name, value)  # the dataclass is frozen

    @classmethod
    def for_task(cls, task: str = "reverse", **overrides) -> TrainConfig:
        """The defaults for ``task`` (see :data:`TASK_DEFAULTS`), with ``overrides``."""
        if task not in D.TASKS:
            raise ValueError(f"task must be one of {D.TASKS}, got {task!r}")
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise TypeError(f"unknown training option(s) {sorted(unknown)}; the options are "
                            f"the fields of TrainConfig")
        return cls(**{"task": task, **TASK_DEFAULTS[task], **overrides})

    def get_task(self) -> D.Task:
        return D.get_task(self.task, self.min_len, self.max_len, self.num_symbols)


#: Per-task defaults (the rest: :class:`TrainConfig`'s). Measured on a 2-core machine: see the
#: README and ``python -m transformer_lab.train --task NAME``.
TASK_DEFAULTS: dict[str, dict] = {
    "copy": {},
    "reverse": {},
    "sort": {},
    "add": {"steps": 3000},
}


# --------------------------------------------------------------------------------------------
# Data, model, batches


def make_data(cfg: TrainConfig):
    """(task, train, val, test): three lists of (source, target) pairs sharing no source."""
    task = cfg.get_task()
    pool, test = D.make_splits(task, cfg.n_train + cfg.n_val, cfg.n_test, seed=cfg.seed)
    return task, pool[cfg.n_val:], pool[:cfg.n_val], test


def model_config(cfg: TrainConfig, task: D.Task) -> TransformerConfig:
    """The :class:`TransformerConfig` of a run: the task's vocabulary, the run's sizes, and a
    ``max_len`` covering the longest source and the longest decoder input."""
    return TransformerConfig(
        src_vocab_size=task.vocab_size, tgt_vocab_size=task.vocab_size, d_model=cfg.d_model,
        num_heads=cfg.num_heads, num_encoder_layers=cfg.num_layers,
        num_decoder_layers=cfg.num_layers, d_ff=cfg.d_ff,
        max_len=max(task.max_src_len, task.max_tgt_len - 1), positional=cfg.positional,
        norm_first=cfg.norm_first, pad_id=D.PAD, bos_id=D.BOS, eos_id=D.EOS,
        dtype=np.dtype(cfg.dtype).type)


def make_model(cfg: TrainConfig, task: D.Task | None = None) -> Transformer:
    """The run's model, initialised from ``cfg.seed``."""
    return Transformer(model_config(cfg, task or cfg.get_task()), seed=cfg.seed)


def batch_stream(pairs: Sequence[tuple], batch_size: int, seed, bucket: bool = True
                 ) -> Iterator[tuple]:
    """Endless padded (src, tgt) batches: epoch after epoch, reshuffled each time, full batches
    only (``drop_last``; a set smaller than one batch gives one smaller batch). With ``bucket``,
    each batch holds sequences of similar length (:func:`transformer_lab.data.bucketed_batches`):
    about half the work of random batches, whose shorter sequences are mostly padding."""
    rng = np.random.default_rng(seed)
    size = min(batch_size, len(pairs))
    while True:
        if bucket:
            yield from D.bucketed_batches(pairs, size, rng, drop_last=True)
        else:
            yield from D.iterate_batches(pairs, size, rng, drop_last=True)


def make_optimizer(cfg: TrainConfig, params):
    if cfg.optimizer == "sgd":
        return SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    return Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay,
                decoupled=cfg.optimizer == "adamw")


def make_schedule(cfg: TrainConfig) -> WarmupSchedule:
    warmup = min(cfg.warmup, cfg.steps)
    return WarmupSchedule(cfg.lr, warmup, cfg.steps, decay=cfg.decay)


def train_step(model: Transformer, opt, src, tgt, lr: float, clip: float) -> tuple[float, float]:
    """One step: loss and gradients, clip to global norm ``clip`` (0: no clipping), update.

    Args:
        model: the model, updated in place.
        opt: its optimiser (:mod:`transformer_lab.optim`), which checks ``lr``.
        src, tgt: a padded batch (B, S), (B, T).
        lr: the learning rate of this step.
        clip: largest global gradient norm, >= 0 (0: no clipping).

    Returns:
        (loss, gradient norm before clipping).
    """
    clip = v.real(clip, "clip", minimum=0)
    loss, grads = model.loss(src, tgt)
    norm = clip_grad_norm(grads, clip) if clip else optim.global_norm(grads)
    opt.lr = lr
    opt.step(grads)
    return loss, norm


# --------------------------------------------------------------------------------------------
# Evaluation


def evaluate(model: Transformer, pairs: Sequence[tuple], batch_size: int = 1000,
             max_len: int | None = None) -> dict:
    """Greedy-decode the sources of ``pairs`` and compare with their targets.

    Args:
        model: the model.
        pairs: (source, target) tuples of token ids (no special tokens).
        batch_size: sequences decoded together.
        max_len: most tokens generated per sequence (default: longest target + 1, for EOS).

    Returns:
        ``{"exact_match", "token_accuracy", "predictions"}`` (predictions: one token tuple per
        pair, without special tokens).
    """
    if len(pairs) == 0:
        raise ValueError("pairs must not be empty")
    if max_len is None:
        max_len = min(max(len(t) for _, t in pairs) + 1, model.config.max_len)
    preds: list[tuple] = []
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start:start + batch_size]
        out = model.greedy_decode(D.pad([s for s, _ in chunk]), max_len=max_len)
        preds += [D.strip(p) for p in out]
    targets = [t for _, t in pairs]
    return {"exact_match": D.exact_match(preds, targets),
            "token_accuracy": D.token_accuracy(preds, targets), "predictions": preds}


def teacher_forced_accuracy(model: Transformer, pairs: Sequence[tuple],
                            batch_size: int = 500) -> dict:
    """Exact match and token accuracy of the next-token predictions given the *true* prefix.

    One forward pass per batch instead of one per generated token. In exact arithmetic its
    exact match equals greedy decoding's (:func:`evaluate`): if the most likely token is right
    at every position given the right prefix, greedy decoding, which feeds back its own tokens,
    feeds back exactly the right prefix and produces the target -- and conversely. In floating
    point the two compute the same logits in different orders (one pass over the whole target
    against one pass per prefix, in batches padded differently), so a near-tie between the two
    most likely tokens can round differently and flip a sequence: rare, not impossible.
    (Token accuracy is higher than greedy decoding's: one early mistake does not derail the
    rest.) Used for early stopping.

    Returns:
        ``{"exact_match", "token_accuracy"}``.
    """
    if len(pairs) == 0:
        raise ValueError("pairs must not be empty")
    seqs = right = tokens = 0
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start:start + batch_size]
        src = D.pad([s for s, _ in chunk])
        tgt = D.pad([t for _, t in chunk], bos_eos=True)
        logits, _ = model.forward(src, tgt[:, :-1])
        keep = model.loss_mask(tgt)
        hit = (logits.argmax(axis=-1) == tgt[:, 1:]) & keep
        seqs += int((hit | ~keep).all(axis=1).sum())
        right += int(hit.sum())
        tokens += int(keep.sum())
    return {"exact_match": seqs / len(pairs), "token_accuracy": right / tokens}


# --------------------------------------------------------------------------------------------
# Progress


class Progress:
    """A ``\\r`` progress bar on a terminal; otherwise one plain line every ``log_every`` steps.

    A plain line holds the step, the loss and learning rate of that step, the latest validation
    scores (with the step they were measured at, when that was earlier) and the elapsed time.

    Args:
        total: number of steps.
        stream: where to write (default ``sys.stdout``; the command line passes
            ``sys.stderr``); mode "none": silent.
        mode: "auto" (bar if the stream is a terminal), "bar", "lines" or "none".
        log_every: steps between plain lines.

    For each step call :meth:`evaluated` first (if the step was evaluated), then
    :meth:`update`; at the end call :meth:`finish`, which writes the last step's line if the run
    stopped between two log steps.
    """

    WIDTH = 24

    def __init__(self, total: int, stream=None, mode: str = "auto", log_every: int = 100):
        if mode not in ("auto", "bar", "lines", "none"):
            raise ValueError(f'mode must be "auto", "bar", "lines" or "none", got {mode!r}')
        self.stream = sys.stdout if stream is None else stream
        if mode == "auto":
            isatty = getattr(self.stream, "isatty", None)
            mode = "bar" if isatty is not None and isatty() else "lines"
        self.mode, self.total, self.log_every = mode, total, max(1, log_every)
        self._last_draw = 0.0
        self._last_len = 0
        self._open_bar = False
        self._last_line = 0  # the step of the last plain line
        self._state = None  # (step, loss, lr, elapsed) of the last update
        self._val = None  # (step, exact, token) of the last evaluation
        self.val = ""

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def _line(self) -> None:
        step, loss, lr, elapsed = self._state
        text = f"step {step:>5}/{self.total}  loss {loss:.4f}  lr {lr:.2e}"
        if self._val is not None:
            at, exact, token = self._val
            text += f"  val exact {exact:.4f} token {token:.4f}"
            if at != step:
                text += f" (step {at})"
        self._write(f"{text}  {elapsed:6.1f} s\n")
        self._last_line = step

    def update(self, step: int, loss: float, lr: float, elapsed: float) -> None:
        """After ``step`` steps (1-based)."""
        self._state = (step, loss, lr, elapsed)
        if self.mode == "bar":
            now = time.perf_counter()
            if now - self._last_draw < 0.1 and step < self.total:
                return
            self._last_draw = now
            filled = int(self.WIDTH * step / self.total)
            bar = "#" * filled + "." * (self.WIDTH - filled)
            rate = step / elapsed if elapsed > 0 else 0.0
            eta = (self.total - step) / rate if rate > 0 else 0.0
            text = (f"[{bar}] {step}/{self.total} loss {loss:.4f} lr {lr:.1e}{self.val} "
                    f"{elapsed:.0f}s<{eta:.0f}s {rate:.0f} it/s")
            self._write("\r" + text + " " * max(0, self._last_len - len(text)))
            self._last_len = len(text)
            self._open_bar = True
        elif self.mode == "lines" and (step % self.log_every == 0 or step == self.total):
            self._line()

    def evaluated(self, step: int, exact: float, token: float) -> None:
        """The validation scores after ``step`` steps (shown from then on)."""
        self.val = f" val {exact:.3f}"
        self._val = (step, exact, token)

    def finish(self) -> None:
        """The run ended: in lines mode, write the last step's line unless it was written."""
        if self.mode == "lines" and self._state is not None \
                and self._state[0] != self._last_line:
            self._line()
        self.close()

    def message(self, text: str) -> None:
        if self.mode == "none":
            return
        self.close()
        self._write(text + "\n")

    def close(self) -> None:
        if self._open_bar:
            self._write("\n")
            self._open_bar = False


# --------------------------------------------------------------------------------------------
# Training


@dataclasses.dataclass
class History:
    """What happened, step by step: ``loss``, ``lr`` and ``grad_norm`` (one per step), and the
    validation evaluations (``eval_step``, ``val_exact``, ``val_token``)."""

    loss: list = dataclasses.field(default_factory=list)
    lr: list = dataclasses.field(default_factory=list)
    grad_norm: list = dataclasses.field(default_factory=list)
    eval_step: list = dataclasses.field(default_factory=list)
    val_exact: list = dataclasses.field(default_factory=list)
    val_token: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class TrainResult:
    """The result of :func:`train`.

    Attributes:
        config: the :class:`TrainConfig`.
        model: the trained :class:`Transformer`.
        task: the :class:`transformer_lab.data.Task`.
        train, val, test: the (source, target) pairs of the three splits.
        history: a :class:`History`.
        metrics: the JSON-ready summary the command line prints (see :func:`train`).
        test_predictions: the greedy decodings of ``test`` (token tuples).
    """

    config: TrainConfig
    model: Transformer
    task: D.Task
    train: list
    val: list
    test: list
    history: History
    metrics: dict
    test_predictions: list

    def examples(self, n: int = 8, start: int = 0) -> list[tuple[str, str, str, bool]]:
        """``n`` held-out examples as strings: (source, target, prediction, correct)."""
        out = []
        for (src, tgt), pred in zip(self.test[start:start + n],
                                    self.test_predictions[start:start + n], strict=True):
            out.append((D.detokenize(src, self.task), D.detokenize(tgt, self.task),
                        D.detokenize(pred, self.task), tuple(pred) == tuple(tgt)))
        return out


@contextmanager
def blas_threads(n: int | None):
    """Limit the BLAS thread pools (OpenBLAS, MKL, ...) to ``n`` threads inside the block
    (None: leave them as they are)."""
    if n is None:
        yield
        return
    with threadpool_limits(limits=n, user_api="blas"):
        yield


def train(task: str | TrainConfig = "reverse", *, progress: str = "auto",
          log_every: int | None = None, stream=None, checkpoint: str | None = None,
          model: Transformer | None = None,
          **options) -> TrainResult:
    """Train the course Transformer on a toy task; return the model, history and metrics.

    Args:
        task: a task name (its :data:`TASK_DEFAULTS` apply) or a whole :class:`TrainConfig`.
        progress: "auto" (a bar on a terminal, plain lines otherwise), "bar", "lines", "none".
        log_every: steps between plain progress lines (default: ``eval_every``, so that every
            line has fresh validation scores).
        stream: where progress goes (default ``sys.stdout``; the command line uses stderr).
        checkpoint: save the trained model there (``.npz``, :meth:`Transformer.save`).
        model: start from this model instead of a fresh one (its config must fit the task).
        **options: :class:`TrainConfig` fields, e.g. ``seed=1, steps=500, positional="none"``.

    Returns:
        A :class:`TrainResult`. Its ``metrics``: task, seed, exact_match and token_accuracy
        (greedy decoding of the held-out test set), val_exact_match, steps (taken),
        stopped ("target", "steps" or "time"), seconds (the whole run: data, training,
        evaluations), train_seconds (training steps only), tokens_per_s (non-padding source
        and target tokens per second of training step), step_ms (median), final_loss,
        params, threads.
    """
    t_start = time.perf_counter()
    if isinstance(task, TrainConfig):
        cfg = dataclasses.replace(task, **options) if options else task
    else:
        cfg = TrainConfig.for_task(task, **options)
    data_task, train_pairs, val_pairs, test_pairs = make_data(cfg)
    if model is None:
        model = make_model(cfg, data_task)
    elif model.config != model_config(cfg, data_task):
        raise ValueError("model's config does not fit the run's task and sizes; expected "
                         f"{model_config(cfg, data_task)}, got {model.config}")
    opt = make_optimizer(cfg, model.params)
    schedule = make_schedule(cfg)
    batches = batch_stream(train_pairs, cfg.batch_size, seed=[cfg.seed, 1], bucket=cfg.bucket)
    history = History()
    log_every = cfg.eval_every if log_every is None else v.integer(log_every, "log_every",
                                                                   minimum=1)
    bar = Progress(cfg.steps, stream, progress, log_every)
    tokens = 0
    step_seconds: list[float] = []
    stopped = "steps"
    with blas_threads(cfg.threads):
        t_loop = time.perf_counter()
        for step in range(cfg.steps):
            src, tgt = next(batches)
            lr = schedule(step)
            t0 = time.perf_counter()
            loss, norm = train_step(model, opt, src, tgt, lr, cfg.clip)
            step_seconds.append(time.perf_counter() - t0)
            if not math.isfinite(loss):
                raise FloatingPointError(f"the loss became {loss} at step {step + 1}; lower "
                                         f"the learning rate (lr={cfg.lr}) or clip gradients")
            tokens += int((src != D.PAD).sum() + (tgt != D.PAD).sum())
            history.loss.append(loss)
            history.lr.append(lr)
            history.grad_norm.append(norm)
            last = step + 1 == cfg.steps
            if cfg.n_val and ((step + 1) % cfg.eval_every == 0 or last):
                ev = teacher_forced_accuracy(model, val_pairs)
                history.eval_step.append(step + 1)
                history.val_exact.append(ev["exact_match"])
                history.val_token.append(ev["token_accuracy"])
                bar.evaluated(step + 1, ev["exact_match"], ev["token_accuracy"])
                if cfg.target is not None and ev["exact_match"] >= cfg.target and not last:
                    stopped = "target"
            bar.update(step + 1, loss, lr, time.perf_counter() - t_loop)
            if stopped == "target":
                break
            if cfg.time_budget is not None and time.perf_counter() - t_loop > cfg.time_budget \
                    and not last:
                stopped = "time"
                break
        steps_taken = len(history.loss)
        bar.finish()
        final = evaluate(model, test_pairs) if test_pairs else None
    seconds = time.perf_counter() - t_start
    train_seconds = sum(step_seconds)
    if stopped == "target":
        bar.message(f"stopped at step {steps_taken}: validation exact match "
                    f"{history.val_exact[-1]:.4f} >= target {cfg.target}")
    elif stopped == "time":
        bar.message(f"stopped at step {steps_taken}: time budget of {cfg.time_budget:g} s "
                    f"used up")
    metrics = {
        "task": cfg.task,
        "seed": cfg.seed,
        "exact_match": round(final["exact_match"], 4) if final else None,
        "token_accuracy": round(final["token_accuracy"], 4) if final else None,
        "val_exact_match": round(history.val_exact[-1], 4) if history.val_exact else None,
        "n_test": len(test_pairs),
        "steps": steps_taken,
        "stopped": stopped,
        "seconds": round(seconds, 2),
        "train_seconds": round(train_seconds, 2),
        "tokens_per_s": round(tokens / train_seconds) if train_seconds > 0 else None,
        "step_ms": round(1e3 * statistics.median(step_seconds), 2),
        "final_loss": round(float(np.mean(history.loss[-20:])), 4),
        "params": model.num_parameters(),
        "threads": cfg.threads,
    }
    if checkpoint:
        metrics["checkpoint"] = model.save(checkpoint, metadata={
            "train_config": dataclasses.asdict(cfg), "metrics": metrics})
    return TrainResult(cfg, model, data_task, train_pairs, val_pairs, test_pairs, history,
                       metrics, final["predictions"] if final else [])


# --------------------------------------------------------------------------------------------
# The same training in PyTorch, and step times


def numpy_loss_curve(model: Transformer, batches, cfg: TrainConfig) -> list[float]:
    """Losses of ``len(batches)`` training steps of ``model`` (changed in place) with the
    optimiser, schedule and clipping of ``cfg``."""
    opt = make_optimizer(cfg, model.params)
    schedule = make_schedule(cfg)
    return [train_step(model, opt, src, tgt, schedule(i), cfg.clip)[0]
            for i, (src, tgt) in enumerate(batches)]


def torch_loss_curve(twin, batches, cfg: TrainConfig) -> list[float]:
    """As :func:`numpy_loss_curve` for a torch model (``TorchTransformer`` or
    ``ReferenceTransformer``) with ``torch.optim`` and ``clip_grad_norm_``."""
    params = list(twin.parameters())
    opt = _torch_optimizer(cfg, params)
    schedule = make_schedule(cfg)
    losses = []
    for i, (src, tgt) in enumerate(batches):
        for group in opt.param_groups:
            group["lr"] = schedule(i)
        losses.append(_torch_train_step(twin, params, opt, src, tgt, cfg.clip))
    return losses


def _torch_optimizer(cfg: TrainConfig, params):
    """The ``torch.optim`` counterpart of :func:`make_optimizer`."""
    import torch

    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum,
                               weight_decay=cfg.weight_decay)
    cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    return cls(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def _torch_train_step(twin, params, opt, src, tgt, clip: float) -> float:
    """The torch counterpart of :func:`train_step` (the learning rate is set by the caller)."""
    import torch

    opt.zero_grad(set_to_none=True)
    loss = twin.loss(src, tgt)
    loss.backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(params, clip)
    opt.step()
    return loss.item()


def step_times(cfg: TrainConfig | None = None, repeats: int = 30, warmup: int = 5,
               threads: int = 1, torch_threads: int | None = None,
               reference: bool = True) -> dict:
    """Median seconds of one training step (loss, backward, clipping, Adam) on the same batch
    from the same weights: NumPy, the from-scratch ``TorchTransformer`` and (``reference``)
    the model around ``nn.Transformer``, eager CPU, timed alternately
    (:func:`transformer_lab.bench.median_times`).

    Args:
        cfg: sizes, batch size and task (default: the reverse defaults).
        threads: BLAS threads for NumPy; torch_threads: ``torch.set_num_threads`` for torch
            (default: the same number, so that the comparison is fair). Both are restored.

    Returns:
        ``{"numpy": s, "torch": s, "nn.Transformer": s, "threads": n, "torch_threads": m}``.
    """
    import torch

    from transformer_lab.torch_model import ReferenceTransformer, TorchTransformer

    cfg = cfg or TrainConfig.for_task("reverse")
    torch_threads = threads if torch_threads is None else torch_threads
    task = cfg.get_task()
    model = make_model(cfg, task)
    pairs = D.make_splits(task, cfg.batch_size, 0, seed=cfg.seed)[0]
    src, tgt = next(D.iterate_batches(pairs, cfg.batch_size))
    steps = {}
    opt = make_optimizer(cfg, model.params)
    steps["numpy"] = lambda: train_step(model, opt, src, tgt, 1e-4, cfg.clip)
    twins = {"torch": TorchTransformer.from_numpy(model)}
    if reference:
        twins["nn.Transformer"] = ReferenceTransformer.from_numpy(model)
    for name, twin in twins.items():
        params = list(twin.parameters())
        topt = _torch_optimizer(cfg, params)
        for group in topt.param_groups:
            group["lr"] = 1e-4  # as the NumPy step's

        def step(twin=twin, params=params, topt=topt):
            _torch_train_step(twin, params, topt, src, tgt, cfg.clip)

        steps[name] = step
    old_torch_threads = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    try:
        with blas_threads(threads):
            out = median_times(steps, repeats, warmup)
    finally:
        torch.set_num_threads(old_torch_threads)
    out.update(threads=threads, torch_threads=torch_threads)
    return out


# --------------------------------------------------------------------------------------------
# Command line


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
    g.add_argument("--task", choices=D.TASKS, default="reverse",
                   help="default: reverse (--task charlm trains notebook 09's GPT on text: "
                        "python -m transformer_lab.train --task charlm --help)")
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
    g.add_argument("--positional", choices=("sinusoidal", "learned", "none"),
                   help=f"positional encoding ({_default('positional')})")
    g.add_argument("--post-norm", dest="norm_first", action="store_const", const=False,
                   help="post-norm layers LN(x + f(x)), as in the paper (default: pre-norm, "
                        "x + f(LN(x)))")
    g.add_argument("--dtype", choices=("float32", "float64"), help=_default("dtype"))
    g = p.add_argument_group("optimisation")
    g.add_argument("--optimizer", choices=("adam", "adamw", "sgd"),
                   help=f"{_default('optimizer')}; sgd uses momentum "
                        f"{TrainConfig.momentum}")
    g.add_argument("--lr", type=float, help=f"peak learning rate ({_default('lr')})")
    g.add_argument("--warmup", type=int,
                   help=f"linear warm-up steps, fewer than --steps ({_default('warmup')})")
    g.add_argument("--decay", choices=("cosine", "linear", "inverse_sqrt"),
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
                   help="seconds for the training loop (default: none, also 0; a budget makes "
                        "the stopping step depend on the machine's speed, see \"stopped\")")
    g.add_argument("--threads", type=int,
                   help="BLAS threads for NumPy during training (default: 1; the model's "
                        "64 x 64 matrices are too small for more threads to pay off, and on a "
                        "busy machine more are often slower)")
    g.add_argument("--checkpoint", help="save the trained model to this .npz file")
    g.add_argument("--init", help="start from the parameters of this checkpoint")
    g.add_argument("--progress", choices=("auto", "bar", "lines", "none"), default="auto",
                   help="auto: a bar if stderr is a terminal, plain lines otherwise "
                        "(default: auto)")
    g.add_argument("--log-every", type=int,
                   help="steps between plain progress lines (default: --eval-every)")
    g.add_argument("--examples", type=int, default=0,
                   help="print this many held-out examples (source -> prediction) to stderr "
                        "(default: 0)")
    g.add_argument("--compare-torch", action="store_true",
                   help="also time one training step in NumPy and in PyTorch (eager CPU, "
                        "same threads) and add the ratios to the metrics")
    return p


_CONFIG_OPTIONS = ("min_len", "max_len", "num_symbols", "n_train", "n_val", "n_test",
                   "d_model", "num_heads", "num_layers", "d_ff", "positional", "norm_first",
                   "dtype", "optimizer", "lr", "warmup", "decay", "weight_decay", "clip",
                   "batch_size", "bucket", "steps", "eval_every", "threads")


def _charlm_requested(argv) -> bool:
    """Whether the command line asks for ``--task charlm`` (the GPT of notebook 09, trained by
    :mod:`transformer_lab.charlm`, which has its own options)."""
    argv = list(argv)
    return "--task=charlm" in argv or any(a == "--task" and b == "charlm"
                                          for a, b in zip(argv, argv[1:], strict=False))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if _charlm_requested(argv):
        from transformer_lab import charlm

        return charlm.main(argv)
    parser = _parser()
    args = parser.parse_args(argv)
    options = {k: getattr(args, k) for k in _CONFIG_OPTIONS if getattr(args, k) is not None}
    if args.target is not None:
        options["target"] = args.target or None
    if args.time_budget is not None:
        options["time_budget"] = args.time_budget or None
    try:
        cfg = TrainConfig.for_task(args.task, seed=args.seed, **options)
        model_config(cfg, cfg.get_task())  # checks the model's sizes before any work
        if args.log_every is not None:
            v.integer(args.log_every, "--log-every", minimum=1)
        init = None
        if args.init:
            init = make_model(cfg)
            init.load_params(args.init)
    except (ValueError, TypeError) as e:
        parser.error(str(e))
    log = sys.stderr  # progress and examples; stdout gets only the JSON line
    if args.progress != "none":
        print(f"training {cfg.task} (lengths {cfg.min_len}..{cfg.get_task().max_len}), seed "
              f"{cfg.seed}: d_model {cfg.d_model}, {cfg.num_heads} heads, {cfg.num_layers}+"
              f"{cfg.num_layers} {'pre' if cfg.norm_first else 'post'}-norm layers, batch "
              f"{cfg.batch_size}, up to {cfg.steps} steps ({cfg.warmup} warm-up), "
              f"{cfg.threads} BLAS thread(s)", file=log, flush=True)
    result = train(cfg, progress=args.progress, log_every=args.log_every, stream=log,
                   checkpoint=args.checkpoint, model=init)
    metrics = dict(result.metrics)
    if args.examples:
        for src, tgt, pred, ok in result.examples(args.examples):
            print(f"{src:>24} -> {pred:<24} {'ok' if ok else 'WRONG, expected ' + tgt}",
                  file=log)
    if args.compare_torch:
        t = step_times(cfg, threads=cfg.threads)
        metrics["step_ms_numpy"] = round(1e3 * t["numpy"], 2)
        metrics["step_ms_torch"] = round(1e3 * t["torch"], 2)
        metrics["step_ms_nn_transformer"] = round(1e3 * t["nn.Transformer"], 2)
        metrics["numpy_over_torch"] = round(t["numpy"] / t["torch"], 3)
        metrics["numpy_over_nn_transformer"] = round(t["numpy"] / t["nn.Transformer"], 3)
    print(json.dumps(metrics), file=sys.stdout, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
