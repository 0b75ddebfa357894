"""What the check modules share to talk to PyTorch: the lazy import and the two conversions.

    from transformer_lab.checks._torch_helpers import _np, _t, _torch

PyTorch is imported on first use only (:func:`_torch`): the check modules are imported in the
student's kernel and in the grader's probe process, where no check computes an expected answer.
A case builder or torch reference that belongs to one notebook stays in that notebook's module.
"""

from __future__ import annotations

import numpy as np

__all__ = ["_np", "_t", "_torch"]


def _torch():
    """The ``torch`` module, imported on first use."""
    import torch

    return torch


def _t(a, grad: bool = False):
    """A torch tensor holding a copy of ``a`` (an array, a number or a nested list; None stays
    None), in ``a``'s dtype, a leaf that records its gradient when ``grad``."""
    if a is None:
        return None
    return _torch().tensor(np.asarray(a), requires_grad=grad)


def _np(t):
    """A NumPy copy of the tensor ``t``, detached from its graph (None stays None)."""
    return None if t is None else t.detach().numpy().copy()
