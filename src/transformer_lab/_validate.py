"""Input checks shared by the layers: clear errors that name the argument and what was expected.

Every public function of the package validates its inputs with these helpers, so that bad input
raises ``TypeError`` / ``ValueError`` before NumPy raises a broadcasting error or returns NaN.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import numpy as np

from transformer_lab import device


def float_array(x, name: str, *, ndim: int | None = None, min_ndim: int | None = None
                ) -> np.ndarray:
    """``x`` as a float32/float64 array (of the host or of the device), or a TypeError/ValueError
    naming ``name``."""
    if not isinstance(x, (np.ndarray, device.xp.ndarray)):
        raise TypeError(f"{name} must be a NumPy array, got {type(x).__name__}")
    if x.dtype not in (np.float32, np.float64):
        raise TypeError(f"{name} must be a float32 or float64 array, got dtype {x.dtype}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension{'s' * (ndim != 1)}, "
                         f"got shape {x.shape}")
    if min_ndim is not None and x.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimensions, got shape {x.shape}")
    return x


def on_device(x: np.ndarray, name: str, hint: str) -> None:
    """A ValueError naming ``name`` unless ``x`` lives on the device the core runs on."""
    if not device.on_device(x):
        raise ValueError(f"{name} is not on the device the core runs on ({device.name}): {hint}")


def same_dtype(name_a: str, a: np.ndarray, name_b: str, b: np.ndarray) -> None:
    if a.dtype != b.dtype:
        raise TypeError(f"{name_b} must have the dtype of {name_a} ({a.dtype}), got {b.dtype}")


def shape_is(x: np.ndarray, shape: tuple, name: str, what: str = "") -> None:
    if x.shape != tuple(shape):
        extra = f" ({what})" if what else ""
        raise ValueError(f"{name} must have shape {tuple(shape)}{extra}, got {x.shape}")


def param(p, name: str, shape: tuple, dtype, *, of: str = "x", what: str = "",
          ndim: int | None = None) -> np.ndarray:
    """A parameter: a float array (:func:`float_array`) of the dtype of ``of`` (``dtype``) and
    of ``shape`` (``what`` says where the shape comes from)."""
    p = float_array(p, name, ndim=ndim)
    if p.dtype != dtype:
        raise TypeError(f"{name} must have the dtype of {of} ({dtype}), got {p.dtype}")
    shape_is(p, shape, name, what)
    return p


def attention_inputs(q, k, v, d_k: str = "d_k") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``q`` (..., T, d_k), ``k`` (..., S, d_k), ``v`` (..., S, d_v): float arrays of q's dtype
    with the same leading (batch, head) axes; ``d_k`` is the width's name in the messages."""
    q = float_array(q, "q", min_ndim=2)
    k = float_array(k, "k", min_ndim=2)
    v = float_array(v, "v", min_ndim=2)
    same_dtype("q", q, "k", k)
    same_dtype("q", q, "v", v)
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(f"q, k and v must have the same leading (batch, head) axes, got shapes "
                         f"{q.shape}, {k.shape}, {v.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same last dimension {d_k}, got {q.shape[-1]} "
                         f"and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same length S (axis -2), got {k.shape[-2]} and "
                         f"{v.shape[-2]}")
    return q, k, v


def token_ids(ids, name: str, vocab_size: int) -> np.ndarray:
    """``ids`` as an integer array on the host with every value in [0, vocab_size)."""
    try:
        ids = np.asarray(device.to_host(ids))
    except ValueError:  # NumPy's "inhomogeneous shape"
        raise ValueError(f"{name} must be a rectangular array of token ids (rows of one "
                         f"length), got rows of different lengths (pad them to one length "
                         f"first, e.g. with transformer_lab.datasets.tasks.pad)") from None
    if ids.size == 0 and ids.dtype == np.float64:  # [] or [[]]: no ids, no dtype
        ids = ids.astype(np.int64)
    if ids.dtype == bool or not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"{name} must be an array of integer token ids, got dtype {ids.dtype}")
    if ids.size:
        lo, hi = ids.min(), ids.max()
        if lo < 0:
            raise ValueError(f"{name} must be non-negative token ids, found {lo}")
        if hi >= vocab_size:
            raise ValueError(f"{name} must be token ids below the vocabulary size {vocab_size}, "
                             f"found {hi}")
    return ids


def mask(mask, name: str) -> np.ndarray:
    """An attention mask: bool (True = blocked), or float32/float64 added to the scores,
    without NaN or +inf."""
    mask = np.asarray(mask)
    if mask.dtype == bool:
        return mask
    if mask.dtype not in (np.float32, np.float64):
        raise TypeError(f"{name} must be a bool mask (True = blocked) or a float32/float64 "
                        f"mask added to the scores, got dtype {mask.dtype}")
    if np.isnan(mask).any() or np.isposinf(mask).any():
        raise ValueError(f"{name} must not contain NaN or +inf (use -inf or True to block)")
    return mask


def integer(value, name: str, *, minimum: int | None = None) -> int:
    """``value`` as a Python int (any integral type but bool), at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value!r}")
    return int(value)


def real(value, name: str, *, minimum: float | None = None, positive: bool = False) -> float:
    """``value`` as a finite Python float (any real type but bool), ``>= minimum`` / ``> 0``."""
    if type(value) is not float and (isinstance(value, bool)  # a float: the common, fast case
                                     or not isinstance(value, numbers.Real)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if positive and not value > 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value!r}")
    return value


def grad_like(dout, name: str, shape: tuple, dtype, what: str = "the forward output") -> np.ndarray:
    """An upstream gradient: an array (of the host or of the device) of the forward output's
    shape and dtype."""
    if not isinstance(dout, (np.ndarray, device.xp.ndarray)):
        raise TypeError(f"{name} must be a NumPy array, got {type(dout).__name__}")
    if dout.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} ({what}), got {dout.shape}")
    if dout.dtype != dtype:
        raise TypeError(f"{name} must have the dtype of {what} ({np.dtype(dtype)}), "
                        f"got {dout.dtype}")
    return dout


def float_dtype(dtype, name: str = "dtype") -> np.dtype:
    """``dtype`` (np.float32, np.float64, or their names) as a NumPy dtype, or a TypeError."""
    try:
        dt = None if dtype is None or isinstance(dtype, bool) else np.dtype(dtype)
    except (TypeError, ValueError):
        dt = None
    if dt not in (np.float32, np.float64):
        raise TypeError(f"{name} must be np.float32 or np.float64, got {dtype!r}")
    return dt


def generator(rng, name: str = "rng") -> np.random.Generator:
    """``rng`` if it is a ``np.random.Generator``, else a TypeError that says how to make one."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"{name} must be a NumPy random Generator, e.g. "
                        f"np.random.default_rng(0), got {rng!r}")
    return rng


def boolean(value, name: str) -> bool:
    """``value`` if it is True or False (Python or NumPy bool), else a TypeError."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


class Cache(NamedTuple):
    """What a checked forward function hands to its backward function."""

    core: object  # the core function's cache (None where the core has no backward)
    shape: tuple  # of the forward's output, the shape dout must have
    dtype: np.dtype  # of the output, the dtype dout must have
    forward: str  # the forward function that made it, e.g. "linear_forward"
    extra: object = None  # what the backward needs besides, e.g. softmax's axis


def cache_of(cache, name: str, expected) -> None:
    """A backward function called with something that is not its forward's cache: ``expected``
    is the cache's type, or the name of the forward function whose :class:`Cache` it must be."""
    if cache is None:
        raise ValueError(f"{name}: cache is None -- call the forward function first and pass "
                         "the cache it returned")
    if not isinstance(expected, str):
        if not isinstance(cache, expected):
            raise TypeError(f"{name}: cache must be the {expected.__name__} returned by the "
                            f"forward function, got {type(cache).__name__}")
    elif not (isinstance(cache, Cache) and cache.forward == expected):
        got = (f"the cache of {cache.forward}" if isinstance(cache, Cache)
               else type(cache).__name__)
        raise TypeError(f"{name}: cache must be the cache that {expected} returned, got {got}")


def dout_of(dout, cache, name: str) -> np.ndarray:
    """The checks of a backward function ``name`` (e.g. ``"linear_backward"``): ``cache`` is the
    :class:`Cache` of the matching forward function (``"linear_forward"``) and ``dout`` an array
    of its output's shape and dtype (:func:`grad_like`), which is returned."""
    cache_of(cache, name, name.replace("_backward", "_forward"))
    return grad_like(dout, "dout", cache.shape, cache.dtype)
