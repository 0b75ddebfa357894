"""The training loop: :func:`train_step` (the core's step, checked) and :func:`train` (a whole
run: data, model, steps, early stopping, metrics).

The step that changes the model is ``transformer_lab.core.training.train_step`` -- the one the
student writes in notebook 10 -- looked up at call time, so that the model trains on whatever
``transformer_lab.core`` holds (the student's code in the handout).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from contextlib import contextmanager

import numpy as np
from threadpoolctl import threadpool_limits

from transformer_lab import _validate as v
from transformer_lab import device
from transformer_lab.core import training as core_training
from transformer_lab.datasets import tasks as D
from transformer_lab.models.encoder_decoder import Transformer
from transformer_lab.train.config import (
    TrainConfig,
    batch_stream,
    make_data,
    make_model,
    make_optimizer,
    make_schedule,
    model_config,
)
from transformer_lab.train.evaluation import evaluate, teacher_forced_accuracy
from transformer_lab.train.progress import Progress

# --------------------------------------------------------------------------------------------
# One step


def train_step(model: Transformer, opt, src, tgt, lr: float, clip: float) -> tuple[float, float]:
    """``transformer_lab.core.training.train_step`` (its docstring says the arguments), with
    ``clip >= 0`` checked first (the optimiser, :mod:`transformer_lab.optim`, checks ``lr``)."""
    clip = v.real(clip, "clip", minimum=0)
    return core_training.train_step(model, opt, src, tgt, lr, clip)


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
        task: the :class:`transformer_lab.datasets.tasks.Task`.
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


def diverging(i: int, step, *args):
    """``step(*args)``, step ``i`` of a run, which returns its loss (or a tuple, the loss
    first): a FloatingPointError naming the step when the loss is not finite, or when the
    optimiser found gradients that are not. NumPy's overflow warnings are not shown: what
    overflows ends as one of the two, which the run reports in one line."""
    try:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            out = step(*args)
    except FloatingPointError as e:
        raise FloatingPointError(f"step {i + 1}: {e}") from None
    loss = out[0] if isinstance(out, tuple) else out
    if not math.isfinite(loss):
        raise FloatingPointError(f"step {i + 1}: the loss became {loss}: the training diverged "
                                 "(lower the learning rate, or clip gradients)")
    return out


def run_steps(steps: int, step, evaluate, eval_every: int, time_budget: float | None):
    """The loop of the text trainers (:mod:`.charlm`, :mod:`.translate`): ``step(i)`` for
    ``i = 0, 1, ...`` (one training step; it returns the loss) up to ``steps`` times, and
    ``evaluate(n, loss, seconds)`` after every ``eval_every``-th step, the last one, and the
    one that uses up ``time_budget`` seconds of training steps (None: no limit), which ends
    the run. Returns ``(stopped, step_seconds, cpu_seconds)``: "steps" or "time", the seconds
    of each step, and the CPU time of the steps (evaluations not counted)."""
    step_seconds, seconds, eval_cpu, stopped = [], 0.0, 0.0, "steps"
    cpu0 = time.process_time()
    for i in range(steps):
        t0 = time.perf_counter()
        loss = diverging(i, step, i)
        step_seconds.append(time.perf_counter() - t0)
        seconds += step_seconds[-1]
        last = i + 1 == steps
        over = time_budget is not None and seconds >= time_budget
        if (i + 1) % eval_every == 0 or last or over:
            e0 = time.process_time()
            evaluate(i + 1, loss, seconds)
            eval_cpu += time.process_time() - e0
        if over and not last:
            stopped = "time"
            break
    return stopped, step_seconds, time.process_time() - cpu0 - eval_cpu


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
        A :class:`TrainResult`; its ``metrics`` are the JSON line's, each key described in
        :data:`~transformer_lab.train.cli.METRICS_HELP`.
    """
    t_start = time.perf_counter()
    if isinstance(task, TrainConfig):
        cfg = dataclasses.replace(task, **options) if options else task
    else:
        cfg = TrainConfig.for_task(task, **options)
    with device.on(cfg.device):  # the core, the model and its optimiser on cfg.device
        return _train(cfg, t_start, progress, log_every, stream, checkpoint, model)


def _train(cfg: TrainConfig, t_start: float, progress, log_every, stream, checkpoint,
           model) -> TrainResult:
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
    train_time, stopped = 0.0, "steps"
    with blas_threads(cfg.threads):
        t_loop = time.perf_counter()
        for step in range(cfg.steps):
            src, tgt = next(batches)
            lr = schedule(step)
            t0 = time.perf_counter()
            # the core's step; cfg.clip and the schedule's lr are checked already
            loss, norm = diverging(step, core_training.train_step, model, opt, src, tgt, lr,
                                   cfg.clip)
            step_seconds.append(time.perf_counter() - t0)
            train_time += step_seconds[-1]
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
            if cfg.time_budget is not None and train_time >= cfg.time_budget \
                    and not last:  # seconds of training steps, as in run_steps
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
        "device": cfg.device,
    }
    if checkpoint:
        metrics["checkpoint"] = model.save(checkpoint, metadata={
            "train_config": dataclasses.asdict(cfg), "metrics": metrics})
    return TrainResult(cfg, model, data_task, train_pairs, val_pairs, test_pairs, history,
                       metrics, final["predictions"] if final else [])
