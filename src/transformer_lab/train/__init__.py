"""Train the course Transformer (NumPy) on a toy task, or the GPT on text (``--task charlm``,
:mod:`~transformer_lab.train.charlm`): ``python -m transformer_lab.train``.

    python -m transformer_lab.train --task reverse --seed 0
    python -m transformer_lab.train --task add --steps 4000 --checkpoint add.npz

or, from Python (notebook 10)::

    from transformer_lab.train import train
    result = train("reverse", seed=0)         # TrainConfig fields as keywords
    result.metrics["exact_match"]             # held-out exact match
    result.history.loss                       # one value per step
    result.model.greedy_decode(src)

What one run does:

1. **Data** (:mod:`transformer_lab.datasets.tasks`): ``n_train + n_val + n_test`` distinct
   source sequences of the task, drawn from ``seed``, split into a training set, a validation
   set and a held-out test set that share no source sequence.
2. **Model**: :class:`transformer_lab.models.encoder_decoder.Transformer` with ``num_layers``
   encoder and decoder layers (pre-norm; ``norm_first=False``, ``--post-norm``: the paper's
   post-norm), initialised from ``seed``.
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
same seed gives the same losses, the same stopping step, the same model, on the same machine
and libraries (another CPU's BLAS kernel rounds in the last bits, and over hundreds of steps a
float32 run then takes another path: assert what every run reaches, not its trajectory). A
``time_budget`` (``--time-budget SECONDS``) makes the stopping step depend on the machine's
speed; the metrics say why a run stopped (``"stopped"``: ``"target"``, ``"steps"`` or
``"time"``), so a run cut short by the clock is visible in its JSON line.

The command line writes its progress to **stderr** -- a bar on a terminal (``\\r``-updated),
otherwise one plain line every ``--log-every`` steps (default: every evaluation) with the loss,
the learning rate and the latest validation scores -- and exactly one JSON line of metrics to
**stdout**, so that ``python -m transformer_lab.train ... > metrics.json`` captures only the JSON
(``--help`` describes every key).

**Defaults**: :class:`TrainConfig`, :data:`TASK_DEFAULTS` (``--help`` prints them); what they
reach: ``docs/results.md``.

**Runs on the core.** Every training step is ``transformer_lab.core.training.train_step`` (the
student writes it in notebook 10), which calls the model's loss and backward and the
optimiser's ``step`` -- ``transformer_lab.core.optim`` does the arithmetic of the update. With
a core function that is still a stub, training stops at once with the stub's message.

The package, by concern: :mod:`~transformer_lab.train.config` (the run's configuration, data,
model, optimiser and schedule), :mod:`~transformer_lab.train.loop` (the training step and loop),
:mod:`~transformer_lab.train.evaluation` (greedy and teacher-forced scores),
:mod:`~transformer_lab.train.progress` (the progress bar or lines),
:mod:`~transformer_lab.train.compare` (the same training in PyTorch, step times),
:mod:`~transformer_lab.train.cli` (the command line; ``__main__`` runs it; it hands
``--task charlm`` to :mod:`~transformer_lab.train.charlm`, the GPT's own training loop on the
text corpus, :func:`~transformer_lab.train.charlm.train_charlm`).
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
