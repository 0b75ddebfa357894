"""The same training in PyTorch, and step times: :func:`numpy_loss_curve` and
:func:`torch_loss_curve` (the same steps from the same weights on the same batches, with
``torch.optim`` and ``clip_grad_norm_``), :func:`step_times` (one training step timed in NumPy
and in PyTorch, alternately)."""

from __future__ import annotations

from transformer_lab.datasets import tasks as D
from transformer_lab.models.encoder_decoder import Transformer
from transformer_lab.tools import median_times
from transformer_lab.train.config import TrainConfig, make_model, make_optimizer, make_schedule
from transformer_lab.train.loop import blas_threads, train_step


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
    (:func:`transformer_lab.tools.median_times`).

    Args:
        cfg: sizes, batch size and task (default: the reverse defaults).
        threads: BLAS threads for NumPy; torch_threads: ``torch.set_num_threads`` for torch
            (default: the same number, so that the comparison is fair). Both are restored.

    Returns:
        ``{"numpy": s, "torch": s, "nn.Transformer": s, "threads": n, "torch_threads": m}``.
    """
    import torch

    from transformer_lab.reference.torch_transformer import ReferenceTransformer, TorchTransformer

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
