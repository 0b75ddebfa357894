"""Attention for long sequences: tiled (FlashAttention-style) forward and backward passes.

    out, cache = flash_attention_forward(q, k, v, causal=False, block_size=64)
    dq, dk, dv = flash_attention_backward(dout, cache)

The same result as scaled dot-product attention, without ever forming the ``(T, S)`` scores:
:mod:`transformer_lab.core.flash` (the student's own; notebook ``16_long_context`` derives it)
says how, and states its causal convention -- query ``i`` sees the keys ``j <= i``, aligned at
the top left also when ``T != S`` (``torch``'s ``is_causal``): no query is left with nothing to
attend to, and the keys ``j >= T`` of a causal call with ``S > T`` get zero gradient. (Attention
with an arbitrary mask, where a query may see no key at all and gets zeros, is ``attention``'s.)
This module checks the arguments once and calls the core.
"""

from __future__ import annotations

import numbers

import numpy as np

from transformer_lab import _validate as check
from transformer_lab.core import flash as core_flash

__all__ = ["flash_attention_backward", "flash_attention_forward", "row_logsumexp"]


def _finite(x: np.ndarray, name: str) -> None:
    if not np.isfinite(x).all():
        raise ValueError(f"{name} must be finite (no NaN or inf)")


def flash_attention_forward(q, k, v, causal=False, block_size=64):
    """Checked :func:`transformer_lab.core.flash.flash_attention_forward` (shapes there).

    q (..., T, d), k (..., S, d), v (..., S, d_v): finite, one dtype, T, S, d >= 1;
    ``block_size`` may exceed T or S. The output is read-only.
    """
    q, k, v = check.attention_inputs(q, k, v, "d (head_dim)")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.shape[-2] < 1 or x.shape[-1] < 1:
            raise ValueError(f"{name} must have at least one position and one feature "
                             f"(axes -2 and -1), got shape {x.shape}")
        _finite(x, name)
    causal = check.boolean(causal, "causal")
    if isinstance(block_size, bool) or not isinstance(block_size, numbers.Integral):
        raise TypeError(f"block_size must be a positive integer, got {block_size!r}")
    if block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    out, cache = core_flash.flash_attention_forward(q, k, v, causal, int(block_size))
    out.flags.writeable = False
    return out, check.Cache(cache, out.shape, out.dtype, "flash_attention_forward")


def flash_attention_backward(dout, cache):
    """Checked :func:`transformer_lab.core.flash.flash_attention_backward` (``dout``
    finite)."""
    dout = check.dout_of(dout, cache, "flash_attention_backward")
    _finite(dout, "dout")
    return core_flash.flash_attention_backward(dout, cache.core)


def row_logsumexp(cache) -> np.ndarray:
    """Each query's ``log sum_j exp(q_i k_j / sqrt(d))`` (over the keys it sees), shape (..., T):
    the one number per row that the forward pass keeps for the backward pass.

    cache: what :func:`flash_attention_forward` returned, or the cache of the core's
    ``core.flash.flash_attention_forward`` (the exercise's checks read it this way)."""
    if isinstance(cache, check.Cache) and cache.forward == "flash_attention_forward":
        cache = cache.core
    elif not isinstance(cache, tuple) or len(cache) != 7:
        raise TypeError(f"row_logsumexp: cache must be the cache that flash_attention_forward "
                        f"returned, got {type(cache).__name__}")
    return cache[4]  # the core's cache: (q, k, v, out, lse, causal, block_size)
