"""What a training run is made of: its configuration (:class:`TrainConfig`, the per-task
defaults), its data, its model, its batches, its optimiser and its learning-rate schedule.

Every field of :class:`TrainConfig` is checked when the config is made (the errors name the
field), so the training loop itself checks nothing again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from transformer_lab import _validate as v
from transformer_lab import device
from transformer_lab.datasets import tasks as D
from transformer_lab.models.config import POSITIONAL
from transformer_lab.models.encoder_decoder import Transformer, TransformerConfig
from transformer_lab.optim import DECAYS, SGD, Adam, WarmupSchedule

# --------------------------------------------------------------------------------------------
# Configuration


def run_command(argv) -> str:
    """The command line of a run, as its record stores it: an absolute path is shown relative to
    the current folder when it lies inside it, else by its name only (no path of this machine is
    stored)."""
    def shown(arg: str) -> str:
        path = Path(arg)
        if not path.is_absolute():
            return arg
        try:
            return str(path.relative_to(Path.cwd()))
        except ValueError:
            return path.name
    return " ".join(["python -m transformer_lab.train", *(shlex.quote(shown(a)) for a in argv)])


def config_from_args(parser, args, cls, **fixed):
    """The run configuration ``cls`` of the text trainers' command lines from the options
    ``args`` (one per field, but the ``fixed`` fields), checked with its device before any work:
    a wrong value is a usage error of ``parser``."""
    options = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
               if f.name not in fixed and hasattr(args, f.name)}
    try:
        config = cls(**options, **fixed)
        device.use(config.device)  # CuPy and a GPU for cuda, checked before any work
    except device.DeviceError as e:  # not a mistake in the options: the sentence alone
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    except (TypeError, ValueError) as e:
        parser.error(str(e))
    return config


def count(text: str) -> int:
    """The value of an option that counts what a run prints (``--examples``, ``--samples``): an
    integer, at least 0 (``type=count``: argparse names the option when it is not)."""
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {n}")
    return n


def check_outputs(parser, **paths: str | None) -> None:
    """Check, before a run starts, that it can write its output files when it ends (a typo
    must not cost the training): ``paths``, option name (``checkpoint``) -> the path given, or
    None. The file is not a folder, its folder exists and is writable, and a ``record`` file
    that exists holds a JSON object (the runs it adds to); else a usage error of ``parser``."""
    for name, path in paths.items():
        if path is None:
            continue
        file = Path(path).expanduser()  # as the run will write it (npz_path; the record)
        problem = ("is a folder" if file.is_dir() else
                   f"is in a folder that does not exist ({file.parent})"
                   if not file.parent.is_dir() else
                   "cannot be written here" if not os.access(
                       file if file.exists() else file.parent, os.W_OK) else "")
        if not problem and name == "record" and file.exists():
            try:
                runs = json.loads(file.read_text(encoding="utf-8"))
            except (OSError, ValueError):  # UnicodeDecodeError too
                runs = None
            problem = "" if isinstance(runs, dict) else "is not a JSON object of runs"
        if problem:
            parser.error(f"--{name} {path} {problem}")


def set_field(config, name: str, value) -> None:
    """Set a field of a frozen run configuration (while it checks itself)."""
    object.__setattr__(config, name, value)


def check_choices(config, **choices) -> None:
    """Each named field of a run configuration is one of its choices (else a ValueError)."""
    for name, allowed in choices.items():
        value = getattr(config, name)
        if not isinstance(value, str) or value not in allowed:
            raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")


def check_run_numbers(config, *, counts=(), positive=(), rates=()) -> None:
    """Check a frozen run configuration's numbers, and store them as Python's int and float (so
    that ``dataclasses.asdict`` is JSON-ready): ``counts`` are integers >= 0, ``positive``
    integers >= 1, ``rates`` reals >= 0; ``time_budget`` is None or positive, and ``warmup``
    is below ``steps``. The errors name the field."""
    for name in counts:
        set_field(config, name, v.integer(getattr(config, name), name, minimum=0))
    for name in positive:
        set_field(config, name, v.integer(getattr(config, name), name, minimum=1))
    for name in rates:
        set_field(config, name, v.real(getattr(config, name), name, minimum=0))
    if config.time_budget is not None:
        set_field(config, "time_budget", v.real(config.time_budget, "time_budget", positive=True))
    if config.warmup >= config.steps:
        raise ValueError(f"warmup={config.warmup} must be less than steps={config.steps}: the "
                         f"learning rate would still be rising (or at its peak) at the last "
                         f"step, with no decay; lower warmup (--warmup) or raise steps "
                         f"(--steps)")


#: The trainer's optimisers ("sgd" with TrainConfig.momentum) and dtypes.
OPTIMIZERS = ("adam", "adamw", "sgd")
DTYPES = ("float32", "float64")


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
    ``eval_every`` steps, ``time_budget`` seconds of training steps (None, the default: no
    limit, so that runs are deterministic; a budget makes the stopping step machine-dependent).
    Run: ``seed`` (data, initial weights and batch order), ``threads`` (BLAS threads),
    ``dtype`` ("float32" or "float64"), ``device`` ("cpu" or "cuda": where the core runs,
    :mod:`transformer_lab.device`).
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
    device: str = "cpu"

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
        check_choices(self, task=D.TASKS, optimizer=OPTIMIZERS, decay=DECAYS,
                      positional=POSITIONAL,
                      dtype=DTYPES, device=device.DEVICES)
        for name in ("bucket", "norm_first"):
            set_field(self, name, v.boolean(getattr(self, name), name))

    def _check_numbers(self) -> None:
        """Every number has the right type and range; ints and floats are stored as Python's
        (so that ``dataclasses.asdict`` is JSON-ready)."""
        check_run_numbers(self, counts=("seed", "n_val", "n_test", "warmup"),
                          positive=("min_len", "num_symbols", "n_train", "d_model", "num_heads",
                                    "num_layers", "d_ff", "batch_size", "steps", "eval_every",
                                    "threads"),
                          rates=("lr", "weight_decay", "momentum", "clip"))
        if self.max_len is not None:
            set_field(self, "max_len", v.integer(self.max_len, "max_len", minimum=self.min_len))
        if self.target is not None:
            set_field(self, "target", v.real(self.target, "target"))
            if not 0 < self.target <= 1:
                raise ValueError(f"target must be in (0, 1] or None, got {self.target!r}")

    @classmethod
    def for_task(cls, task: str = "reverse", **overrides) -> TrainConfig:
        """The defaults for ``task`` (see :data:`TASK_DEFAULTS`), with ``overrides``."""
        if task == "charlm":
            raise ValueError("task 'charlm' trains the GPT, with a loop and options of its own: "
                             "transformer_lab.train.charlm.train_charlm(CharLMConfig(...)), or "
                             "python -m transformer_lab.train --task charlm")
        if task not in D.TASKS:
            raise ValueError(f"task must be one of {D.TASKS}, got {task!r}")
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise TypeError(f"unknown training option(s) {sorted(unknown)}; the options are "
                            f"the fields of TrainConfig")
        return cls(**{"task": task, **TASK_DEFAULTS[task], **overrides})

    def get_task(self) -> D.Task:
        return D.get_task(self.task, self.min_len, self.max_len, self.num_symbols)


#: Per-task defaults (the rest: :class:`TrainConfig`'s). What they reach: docs/results.md, and
#: ``python -m transformer_lab.train --task NAME``.
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
    each batch holds sequences of similar length
    (:func:`transformer_lab.datasets.tasks.bucketed_batches`):
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
