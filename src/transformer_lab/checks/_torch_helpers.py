"""What the check modules share to talk to PyTorch: the lazily imported module, the two
conversions, and autograd on NumPy inputs.

    from transformer_lab.checks._torch_helpers import _np, _t, autograd, torch

PyTorch is imported on first use only (:class:`LazyModule`): the check modules are imported in
the student's kernel and in the grader's probe process, where no check computes an expected
answer. A case builder or torch reference that belongs to one notebook stays in that notebook's
module.
"""

from __future__ import annotations

import importlib

import numpy as np

__all__ = ["LazyModule", "_np", "_t", "autograd", "torch"]


class LazyModule:
    """A module imported where one of its names is first used: ``torch.softmax(...)`` imports
    torch then, not when the check modules are imported."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        return getattr(importlib.import_module(self._name), attr)


torch = LazyModule("torch")


def _t(a, grad: bool = False):
    """A torch tensor holding a copy of ``a`` (an array, a number or a nested list; None stays
    None), in ``a``'s dtype, a leaf that records its gradient when ``grad``."""
    return None if a is None else torch.tensor(np.asarray(a), requires_grad=grad)


def _np(t):
    """A NumPy copy of the tensor ``t``, detached from its graph (None stays None)."""
    return None if t is None else t.detach().numpy().copy()


def autograd(fn, dout, *inputs):
    """What the reference of a forward and backward pass computes: ``fn`` run on leaves that
    hold copies of ``inputs`` (each an array, a dict of arrays -- a layer's parameters -- or
    None, which stays None), its output back-propagated from ``dout`` (None: the output is a
    scalar loss). Returns the output and the gradient of each input, in the input's form, as
    NumPy arrays: ``out, dx, grads = autograd(layer, dout, x, params)``."""
    leaves = [_each(lambda a: _t(a, grad=True), a) for a in inputs]
    out = fn(*leaves)
    out.backward(None if dout is None else _t(dout))
    grads = (_each(lambda t: None if t is None else _np(t.grad), leaf) for leaf in leaves)
    return (_np(out), *grads)


def _each(fn, a):
    """``fn(a)``, or for a dict (a layer's parameters) the dict of ``fn`` of each value."""
    return {k: _each(fn, v) for k, v in a.items()} if isinstance(a, dict) else fn(a)
