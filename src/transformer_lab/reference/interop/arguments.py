"""torch's forward arguments as the core takes them: sequences and masks.

torch modules take sequences batch-first ``(B, T, E)``, sequence-first ``(T, B, E)``
(``batch_first=False``, the default) or unbatched ``(T, E)``; the core takes ``(B, T, E)``.
torch takes an ``attn_mask`` of shape (T, S) or (B * H, T, S) ((H, T, S) unbatched) and a
``key_padding_mask`` (B, S) ((S,) unbatched), each boolean (True = blocked) or float (added to
the scores), and an ``is_causal`` hint; the core takes **one** mask per attention,
broadcastable to (B, H, T, S), boolean or float. The functions here check the arguments (the
errors name the argument and say what was expected) and convert them; they compute nothing the
core computes.

How :func:`merge` merges two masks, and what a query whose keys are all blocked gets:
docs/maintainers.md, "Models and trainers".
"""

from __future__ import annotations

import numpy as np

from transformer_lab import _validate as v
from transformer_lab.attention import additive_mask
from transformer_lab.core import attention as core_attention

# --------------------------------------------------------------------------------------------
# Sequences


def batch_first(x: np.ndarray, name: str, width: int, is_batch_first: bool) -> np.ndarray:
    """A torch sequence input (already checked to be an array of the right dtype) as a
    batch-first (B, T, width) array: a view, no copy.

    Accepts (B, T, width) with batch_first, (T, B, width) without, and unbatched (T, width).
    """
    layout = "(batch, length, features)" if is_batch_first else "(length, batch, features)"
    if x.ndim not in (2, 3):
        raise ValueError(f"{name} must have 3 dimensions {layout} (batch_first="
                         f"{is_batch_first}), or 2 (length, features) unbatched; got shape "
                         f"{x.shape}")
    if x.shape[-1] != width:
        raise ValueError(f"{name} must have {width} features in its last axis, got shape "
                         f"{x.shape}")
    if x.ndim == 2:
        return x[None]
    return x if is_batch_first else x.swapaxes(0, 1)


def torch_layout(y: np.ndarray, batched: bool, is_batch_first: bool) -> np.ndarray:
    """The inverse of :func:`batch_first`, for outputs and gradients."""
    if not batched:
        return y[0]
    return y if is_batch_first else np.ascontiguousarray(y.swapaxes(0, 1))


def same_rank(**xs) -> bool:
    """All sequence arguments batched (3-D) or all unbatched (2-D); returns batched."""
    ranks = {n: x.ndim for n, x in xs.items()}
    if len(set(ranks.values())) > 1:
        listing = ", ".join(f"{n} {r}-D" for n, r in ranks.items())
        raise ValueError(f"{' and '.join(ranks)} must all be batched (3-D) or all unbatched "
                         f"(2-D), got {listing}")
    return next(iter(ranks.values())) == 3


# --------------------------------------------------------------------------------------------
# Masks


def _mask_array(mask, name: str) -> np.ndarray:
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array, got {type(mask).__name__}")
    return v.mask(mask, name)


def attn_mask(mask, name: str, b: int, h: int, t: int, s: int, batched: bool):
    """A torch attention mask, (T, S) or (B*H, T, S) ((H, T, S) unbatched), as the core takes
    it: (T, S) or (B, H, T, S) (a view), or None."""
    if mask is None:
        return None
    mask = _mask_array(mask, name)
    three = (b * h, t, s) if batched else (h, t, s)
    if mask.shape == (t, s):
        return mask
    if mask.shape == three:
        return mask.reshape(b, h, t, s)
    lead = "batch * num_heads" if batched else "num_heads"
    raise ValueError(f"{name} must have shape (target length, source length) = {(t, s)} or "
                     f"({lead}, T, S) = {three}, got {mask.shape}")


def padding_mask(mask, name: str, b: int, s: int, batched: bool):
    """A torch key padding mask, (B, S) ((S,) unbatched), as (B, S), or None."""
    if mask is None:
        return None
    mask = _mask_array(mask, name)
    want = (b, s) if batched else (s,)
    if mask.shape != want:
        what = "(batch, source length)" if batched else "(source length,) for unbatched input"
        raise ValueError(f"{name} must have shape {what} = {want}, got {mask.shape}")
    return mask.reshape(b, s)


def is_causal(mask, hint, padding, t: int, s: int, mask_name: str, flag_name: str,
              override: bool = True):
    """The attention mask torch 2.13 applies given an ``is_causal`` hint
    (docs/maintainers.md, "Models and trainers"): with ``hint`` True the mask must be given; it is
    replaced by the causal mask when ``override`` (torch's ``need_weights=False`` path) and
    there is no key padding mask."""
    if hint is True:
        if mask is None:
            raise ValueError(f"{flag_name}=True needs {mask_name} as well (torch requires the "
                             "causal mask with the hint; e.g. "
                             "nn.Transformer.generate_square_subsequent_mask(T))")
        if override and padding is None:
            return core_attention.causal_mask(t, s)
    return mask


def merge(attn: np.ndarray | None, padding: np.ndarray | None, dtype):
    """One mask for the core, broadcastable to (B, H, T, S), from an attention mask (T, S) or
    (B, H, T, S) and a key padding mask (B, S) (either may be None): boolean when both are
    boolean (their union), else float of ``dtype`` (their sum, True -> -inf); None for none."""
    if (attn is None or attn.dtype == bool) and (padding is None or padding.dtype == bool):
        return core_attention.merge_masks(attn, padding)
    attn = None if attn is None else additive_mask(attn, dtype)
    if padding is None:
        return attn
    padding = additive_mask(padding, dtype)[:, None, None, :]  # (B, 1, 1, S)
    return padding if attn is None else attn + padding
