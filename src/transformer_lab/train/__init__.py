"""Train the course Transformer (NumPy) on a toy task, the GPT on text (``--task charlm``,
:mod:`~transformer_lab.train.charlm`) or the translator (``--task translate-fr``,
:mod:`~transformer_lab.train.translate`): ``python -m transformer_lab.train --help``.

    from transformer_lab.train import train
    result = train("reverse", seed=0)         # TrainConfig fields as keywords
    result.metrics["exact_match"]             # held-out exact match
    result.history.loss                       # one value per step
    result.model.greedy_decode(src)

What a run does (every step is the core's ``train_step``), its threads, its determinism and the
package's modules: docs/maintainers.md, "Models and trainers"; what the defaults reach:
docs/results.md.
"""

from __future__ import annotations

from transformer_lab.train.cli import METRICS_HELP, main
from transformer_lab.train.compare import numpy_loss_curve, step_times, torch_loss_curve
from transformer_lab.train.config import (
    TASK_DEFAULTS,
    TrainConfig,
    batch_stream,
    make_data,
    make_model,
    make_optimizer,
    make_schedule,
    model_config,
)
from transformer_lab.train.evaluation import evaluate, teacher_forced_accuracy
from transformer_lab.train.loop import History, TrainResult, blas_threads, train, train_step
from transformer_lab.train.progress import Progress

__all__ = ["TrainConfig", "TrainResult", "History", "train", "evaluate", "make_model",
           "make_data", "batch_stream", "train_step", "torch_loss_curve", "numpy_loss_curve",
           "step_times", "teacher_forced_accuracy", "blas_threads", "main", "Progress",
           "TASK_DEFAULTS", "METRICS_HELP", "model_config", "make_optimizer", "make_schedule"]
