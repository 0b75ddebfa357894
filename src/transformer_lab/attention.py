"""Attention as forward/backward pairs -- masks, scaled dot-product attention, multi-head
attention: the checked public entry points to ``transformer_lab.core.attention`` and
``transformer_lab.core.multihead``.

Conventions (those of PyTorch, so that :mod:`transformer_lab.reference.interop` can mirror it):

- Sequences are batch-first: queries ``(B, T, E)``, keys/values ``(B, S, E)``.
- Masks are the core's (:mod:`transformer_lab.core.attention`: True or ``-inf`` blocks).
  ``attn_mask`` is broadcast to the scores ``(..., T, S)``; ``key_padding_mask`` has shape
  ``(B, S)`` and blocks padded keys for every query of a sequence. The two are merged here into
  the one mask the core takes (:func:`combine_masks`).
- A query row whose keys are **all** blocked attends to nothing, as in the core (in multi-head
  attention its output is the output projection's bias). This is the behaviour of
  ``F.scaled_dot_product_attention``; ``nn.MultiheadAttention`` returns NaN for such rows when
  ``need_weights=True`` (its default) and its output bias when ``need_weights=False``. No NaN
  ever reaches other rows.
- Attention weights handed out (``cache.weights``, per-head weights) are read-only: the
  backward pass reads the same buffer, so editing them in place raises instead of silently
  changing the gradients.
- Backward functions take ``(dout, cache[, dweights])`` and return the input gradients, then
  ``grads`` keyed like the parameters (:mod:`transformer_lab.layers`' convention).

Parameters may come packed (``W_qkv``, as PyTorch stores self-attention) or separate
(``W_q, W_k, W_v``) for either kind of attention; the core takes packed ones for
self-attention and separate ones for cross-attention, and this module converts (views where it
can) and returns the gradients in the layout of the parameters given.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from transformer_lab import _validate as v
from transformer_lab.core import attention as core_attention
from transformer_lab.core import layers as core_layers
from transformer_lab.core import multihead as core_multihead

# --------------------------------------------------------------------------------------------
# Masks


def causal_mask(length: int, source_length: int | None = None) -> np.ndarray:
    """Checked :func:`transformer_lab.core.attention.causal_mask`: T = ``length``, S =
    ``source_length``."""
    t = v.positive_int(length, "length")
    s = t if source_length is None else v.positive_int(source_length, "source_length")
    return core_attention.causal_mask(t, s)


def padding_mask(lengths, max_len: int | None = None) -> np.ndarray:
    """Checked :func:`transformer_lab.core.attention.padding_mask`: S = ``max_len``, default
    ``max(lengths)``."""
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or lengths.dtype == bool or not np.issubdtype(lengths.dtype, np.integer):
        raise TypeError(f"lengths must be a 1-D integer array, got dtype {lengths.dtype} and "
                        f"shape {lengths.shape}")
    if lengths.size and lengths.min() < 0:
        raise ValueError(f"lengths must be non-negative, found {lengths.min()}")
    if max_len is None:
        max_len = int(lengths.max()) if lengths.size else 0
    else:
        max_len = v.integer(max_len, "max_len", minimum=0)
    if lengths.size and lengths.max() > max_len:
        raise ValueError(f"lengths must be at most max_len={max_len}, found {lengths.max()}")
    return core_attention.padding_mask(lengths, max_len)


def additive_mask(mask: np.ndarray, dtype) -> np.ndarray:
    """A checked mask as a float mask of ``dtype`` to add to the scores (-inf where blocked)."""
    if mask.dtype != bool:
        return mask.astype(dtype, copy=False)
    out = np.zeros(mask.shape, dtype=dtype)
    out[mask] = -np.inf
    return out


def combine_masks(attn_mask, key_padding_mask, batch_shape: tuple, t: int, s: int, dtype):
    """Check ``attn_mask`` (broadcastable to ``batch_shape + (T, S)``, ``batch_shape`` e.g.
    (B,) or (B, H)) and ``key_padding_mask`` ((B, S)) and merge them into the one mask the
    core's attention takes, or None.

    Two boolean masks stay boolean (for the scores of multi-head attention, ``(B, H, T, S)``,
    through ``core.attention.merge_masks``); when either is a float mask, both are added as
    float masks of ``dtype`` (``-inf`` where a boolean mask blocks).
    """
    full = (*batch_shape, t, s)
    am = kpm = None
    if attn_mask is not None:
        am = v.mask(attn_mask, "attn_mask")
        try:
            fits = am.shape in (full[-2:], full) or np.broadcast_shapes(am.shape, full) == full
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"attn_mask must be broadcastable to the attention scores of shape "
                             f"{full} (e.g. ({t}, {s})), got shape {am.shape}")
    if key_padding_mask is not None:
        kpm = v.mask(key_padding_mask, "key_padding_mask")
        if not batch_shape or kpm.shape != (batch_shape[0], s):
            raise ValueError(f"key_padding_mask must have shape (batch, source length) = "
                             f"({batch_shape[0] if batch_shape else '?'}, {s}), got {kpm.shape}")
    if kpm is None:
        return am if am is None or am.dtype == bool else additive_mask(am, dtype)
    if (am is None or am.dtype == bool) and kpm.dtype == bool and len(batch_shape) == 2:
        return core_attention.merge_masks(am, kpm)  # (B, 1, T, S) or (B, 1, 1, S)
    kpm = kpm.reshape(kpm.shape[0], *([1] * len(batch_shape)), s)  # (B, 1.., 1, S)
    if am is None:
        return kpm
    if am.dtype == bool and kpm.dtype == bool:
        return am | kpm
    return additive_mask(am, dtype) + additive_mask(kpm, dtype)


# --------------------------------------------------------------------------------------------
# Accessors: what callers outside the core read from the core's attention caches


def attention_weights(core_cache) -> np.ndarray:
    """The attention weights (..., T, S) in the cache of ``core.attention.attention_forward``."""
    return core_cache[3]


def multihead_weights(core_cache) -> np.ndarray:
    """The per-head weights (B, H, T, S) in the cache of ``core.multihead``'s
    ``multi_head_attention_forward`` or ``self_attention_forward``."""
    return attention_weights(core_cache[-3])


def _check_scores(out: np.ndarray, weights: np.ndarray) -> None:
    """Make the weights read-only (the backward pass reads them); a ValueError if the scores
    held NaN or +inf (a NaN or infinite q or k).

    The softmax of such a row is NaN, and so is the row of the output it multiplies: one sum
    over the output finds it, and only then are the weights searched.
    """
    weights.flags.writeable = False
    if not np.isfinite(np.add.reduce(out, axis=None)) and np.isnan(weights).any():
        raise ValueError("the attention scores q k^T * scale hold NaN or +inf: q and k must be "
                         "finite")


# --------------------------------------------------------------------------------------------
# Scaled dot-product attention


class AttentionCache(v.Cache):
    """A :class:`~transformer_lab._validate.Cache` of ``"scaled_dot_product_attention_forward"``
    (``core``: ``core.attention.attention_forward``'s cache)."""

    @property
    def weights(self) -> np.ndarray:
        """The attention weights (..., T, S), read-only."""
        return attention_weights(self.core)

    @property
    def scale(self) -> float:
        """The factor the scores were multiplied by."""
        return self.core[4]


def scaled_dot_product_attention_forward(q, k, v_, attn_mask=None, key_padding_mask=None,
                                         scale: float | None = None):
    """Checked :func:`transformer_lab.core.attention.attention_forward` (shapes there).

    The two masks are merged by :func:`combine_masks`; ``scale`` must be finite and positive;
    ``cache.weights`` are the attention weights, read-only.
    """
    q, k, v_ = v.attention_inputs(q, k, v_)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else v.real(scale, "scale",
                                                                      positive=True)
    mask = combine_masks(attn_mask, key_padding_mask, q.shape[:-2], q.shape[-2], k.shape[-2],
                         q.dtype)
    # A NaN or infinite q or k would warn inside; _check_scores raises a ValueError instead.
    with np.errstate(invalid="ignore", over="ignore"):
        out, cache = core_attention.attention_forward(q, k, v_, mask, scale)
    _check_scores(out, attention_weights(cache))
    return out, AttentionCache(cache, out.shape, q.dtype, "scaled_dot_product_attention_forward")


def scaled_dot_product_attention_backward(dout, cache: AttentionCache, dweights=None):
    """Checked :func:`transformer_lab.core.attention.attention_backward` (shapes there)."""
    dout = v.dout_of(dout, cache, "scaled_dot_product_attention_backward")
    if dweights is not None:
        w = cache.weights
        v.grad_like(dweights, "dweights", w.shape, w.dtype, what="the attention weights")
    return core_attention.attention_backward(dout, cache.core, dweights)


# --------------------------------------------------------------------------------------------
# Heads


def split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """Checked :func:`transformer_lab.core.multihead.split_heads` (``num_heads`` must divide E).
    """
    _check_ndim(x, 3, "(B, T, E)")
    return core_multihead.split_heads(x, _check_heads(x.shape[2], num_heads, "x.shape[-1]"))


def merge_heads(x: np.ndarray) -> np.ndarray:
    """Checked :func:`transformer_lab.core.multihead.merge_heads`."""
    _check_ndim(x, 4, "(B, H, T, Dh)")
    return core_multihead.merge_heads(x)


def _check_ndim(x, ndim: int, shape: str) -> None:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"x must be a NumPy array of shape {shape}, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"x must be a NumPy array of shape {shape}, got shape {x.shape}")


def _check_heads(e: int, num_heads, width: str = "query.shape[-1]") -> int:
    h = v.positive_int(num_heads, "num_heads")
    if e % h:
        raise ValueError(f"the model width ({width} = {e}) must be divisible by "
                         f"num_heads = {h}")
    return h


# --------------------------------------------------------------------------------------------
# Parameters: initialisation, checks, packed <-> separate projections


def mha_init(embed_dim: int, num_heads: int, kdim: int | None = None, vdim: int | None = None,
             bias: bool = True, packed: bool = False, rng: np.random.Generator | None = None,
             dtype=np.float32) -> dict[str, np.ndarray]:
    """Parameters for multi-head attention in the layout of :mod:`transformer_lab.core.multihead`
    (E = ``embed_dim``, ``kdim`` and ``vdim`` default E; ``packed`` needs kdim = vdim = E):
    Xavier-uniform weights (``core.layers.init_xavier``, drawn in the order of the keys) and
    zero biases, like PyTorch. ``rng``: default ``np.random.default_rng(0)``, so that two calls
    without one return the same parameters.
    """
    e = v.positive_int(embed_dim, "embed_dim")
    h = v.positive_int(num_heads, "num_heads")
    if e % h:
        raise ValueError(f"embed_dim must be divisible by num_heads, got {e} and {h}")
    kdim = e if kdim is None else v.integer(kdim, "kdim", minimum=1)
    vdim = e if vdim is None else v.integer(vdim, "vdim", minimum=1)
    if packed and (kdim != e or vdim != e):
        raise ValueError("packed projections need kdim == vdim == embed_dim")
    dtype = v.float_dtype(dtype, "dtype")
    rng = np.random.default_rng(0) if rng is None else v.generator(rng, "rng")

    return {name: (core_layers.init_xavier(*shape, rng).astype(dtype) if name[0] == "W"
                   else np.zeros(shape, dtype))
            for name, shape in _expected_params(packed, e, kdim, vdim, bias).items()}


def check_params(params, e: int, kdim: int, vdim: int, dtype, where: str = "params"
                 ) -> tuple[bool, bool]:
    """Validate an attention parameter dict (``where``: its name in the messages); return
    (packed, has_bias)."""
    if type(params) is dict:  # the quick test of every call; the messages below otherwise
        packed = "W_qkv" in params
        bias = len(params) > (2 if packed else 4)
        expected = _expected_params(packed, e, kdim, vdim, bias)
        if params.keys() == expected.keys():
            for k, shape in expected.items():
                a = params[k]
                if not (type(a) is np.ndarray and a.shape == shape and a.dtype == dtype):
                    break
            else:
                return packed, bias
    if not isinstance(params, Mapping):
        raise TypeError(f"{where} must be a dict of arrays, got {type(params).__name__}")
    packed = "W_qkv" in params
    if packed and (kdim != e or vdim != e):
        raise ValueError(f"packed projections (W_qkv) need key and value width = query width "
                         f"{e}, got {kdim} and {vdim}")
    biases = [name for name in _expected_params(packed, e, kdim, vdim, True) if name[0] == "b"]
    present = [name for name in biases if name in params]
    if present and len(present) != len(biases):
        raise ValueError(f"{where} must have all of the biases {sorted(biases)} or none, "
                         f"got {sorted(present)}")
    expected = _expected_params(packed, e, kdim, vdim, bool(present))
    unknown = set(params) - set(expected)
    if unknown:
        raise ValueError(f"{where} has unexpected entries {sorted(unknown)}; expected "
                         f"{sorted(expected)}")
    for name, shape in expected.items():
        if name not in params:
            raise ValueError(f"{where} is missing {name!r} of shape {shape}")
        v.param(params[name], f"{where}[{name!r}]", shape, dtype, of="the query")
    return packed, bool(present)


def _expected_params(packed: bool, e: int, kdim: int, vdim: int, bias: bool) -> dict:
    if packed:
        shapes = {"W_qkv": (e, 3 * e), "W_o": (e, e)}
        return {**shapes, "b_qkv": (3 * e,), "b_o": (e,)} if bias else shapes
    shapes = {"W_q": (e, e), "W_k": (kdim, e), "W_v": (vdim, e), "W_o": (e, e)}
    return {**shapes, "b_q": (e,), "b_k": (e,), "b_v": (e,), "b_o": (e,)} if bias else shapes


def to_separate(params: Mapping, e: int) -> dict:
    """Packed parameters (``W_qkv``, ``b_qkv``) as separate ones (``W_q, W_k, W_v``, ``b_*``):
    views of the packed arrays, no copies."""
    w = params["W_qkv"]
    out = {"W_q": w[:, :e], "W_k": w[:, e:2 * e], "W_v": w[:, 2 * e:], "W_o": params["W_o"]}
    if "b_qkv" in params:
        b = params["b_qkv"]
        out.update(b_q=b[:e], b_k=b[e:2 * e], b_v=b[2 * e:], b_o=params["b_o"])
    return out


def to_packed(params: Mapping) -> dict:
    """Separate parameters (``W_q, W_k, W_v``, ``b_*``) packed side by side (``W_qkv``,
    ``b_qkv``): new arrays."""
    out = {"W_qkv": np.concatenate([params["W_q"], params["W_k"], params["W_v"]], axis=1),
           "W_o": params["W_o"]}
    if "b_q" in params:
        out["b_qkv"] = np.concatenate([params["b_q"], params["b_k"], params["b_v"]])
        out["b_o"] = params["b_o"]
    return out


def grads_to_separate(grads: Mapping, e: int) -> dict:
    """Gradients of packed projections in the layout of separate parameters (new,
    contiguous arrays)."""
    return {k: np.ascontiguousarray(g) for k, g in to_separate(grads, e).items()}


# --------------------------------------------------------------------------------------------
# Multi-head attention


class MHACache(v.Cache):
    """A :class:`~transformer_lab._validate.Cache` of ``"multi_head_attention_forward"`` or
    ``"self_attention_forward"``; ``extra``: ``(convert, num_heads, average_attn_weights)``,
    ``convert`` when the parameters came in the other layout than the core's."""

    @property
    def weights(self) -> np.ndarray:
        """The attention weights per head, (B, H, T, S), read-only."""
        return multihead_weights(self.core)


def _attend(forward: str, inputs: tuple, core_params, h: int, mask, convert: bool,
            average: bool, need_weights: bool):
    """The two forwards below, once checked: the core's ``forward``, its per-head weights
    checked by :func:`_check_scores`, then ``(out, weights or None, cache)``."""
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf inputs: _check_scores raises
        out, cache = getattr(core_multihead, forward)(*inputs, core_params, h, mask)
    weights = multihead_weights(cache)
    _check_scores(out, weights)
    if need_weights and average:
        weights = weights.mean(axis=1)
    return (out, weights if need_weights else None,
            MHACache(cache, out.shape, out.dtype, forward, (convert, h, average)))


def multi_head_attention_forward(query, key, value, params: dict, num_heads: int,
                                 attn_mask=None, key_padding_mask=None,
                                 average_attn_weights: bool = True, need_weights: bool = True):
    """Checked :func:`transformer_lab.core.multihead.multi_head_attention_forward` (shapes
    there), as ``nn.MultiheadAttention(batch_first=True)`` without dropout: cross-attention
    (for self-attention :func:`self_attention_forward` saves work).

    ``params``: as :func:`mha_init` makes them, separate or packed. The masks are merged by
    :func:`combine_masks`. Returns ``(out, weights, cache)``: the weights averaged over heads,
    (B, T, S), with ``average_attn_weights``, else per head, (B, H, T, S) (read-only), or None
    with ``need_weights=False`` (as PyTorch's).
    """
    average = v.boolean(average_attn_weights, "average_attn_weights")
    need_weights = v.boolean(need_weights, "need_weights")
    query = v.float_array(query, "query", ndim=3)
    key = v.float_array(key, "key", ndim=3)
    value = v.float_array(value, "value", ndim=3)
    v.same_dtype("query", query, "key", key)
    v.same_dtype("query", query, "value", value)
    b, t, e = query.shape
    h = _check_heads(e, num_heads)
    if key.shape[0] != b or value.shape[0] != b:
        raise ValueError(f"query, key and value must have the same batch size, got "
                         f"{b}, {key.shape[0]}, {value.shape[0]}")
    if key.shape[1] != value.shape[1]:
        raise ValueError(f"key and value must have the same length S, got {key.shape[1]} and "
                         f"{value.shape[1]}")
    packed, _ = check_params(params, e, key.shape[2], value.shape[2], query.dtype)
    mask = combine_masks(attn_mask, key_padding_mask, (b, h), t, key.shape[1], query.dtype)
    core_params = to_separate(params, e) if packed else params
    return _attend("multi_head_attention_forward", (query, key, value), core_params, h, mask,
                   packed, average, need_weights)


def _check_mha_backward(dout, cache, name: str, dweights):
    """The checks of the two backward functions; returns dweights per head (or None)."""
    v.dout_of(dout, cache, name)
    if isinstance(dweights, Mapping):
        raise TypeError(f"{name}(dout, cache, dweights=None) takes no parameter dict (the cache "
                        "holds what the backward pass needs); got a dict for dweights")
    if dweights is None:
        return None
    weights = cache.weights  # (B, H, T, S)
    _, num_heads, average = cache.extra
    if average:
        v.grad_like(dweights, "dweights", weights.shape[:1] + weights.shape[2:], weights.dtype,
                    what="the averaged attention weights")
        return np.broadcast_to(dweights[:, None] / num_heads, weights.shape)
    return v.grad_like(dweights, "dweights", weights.shape, weights.dtype,
                       what="the attention weights per head")


def multi_head_attention_backward(dout, cache: MHACache, dweights=None):
    """Checked :func:`transformer_lab.core.multihead.multi_head_attention_backward` (shapes
    there); ``dweights`` has the shape of the weights the forward returned."""
    dweights = _check_mha_backward(dout, cache, "multi_head_attention_backward", dweights)
    dq, dk, dv, grads = core_multihead.multi_head_attention_backward(dout, cache.core, dweights)
    return dq, dk, dv, to_packed(grads) if cache.extra[0] else grads


def self_attention_forward(x, params: dict, num_heads: int, attn_mask=None,
                           key_padding_mask=None, average_attn_weights: bool = True,
                           need_weights: bool = True):
    """Checked :func:`transformer_lab.core.multihead.self_attention_forward` (shapes there):
    :func:`multi_head_attention_forward` with query = key = value (S = T); separate
    ``W_q, W_k, W_v`` are packed for the call, and their gradients come back separate."""
    average = v.boolean(average_attn_weights, "average_attn_weights")
    need_weights = v.boolean(need_weights, "need_weights")
    x = v.float_array(x, "x", ndim=3)
    b, t, e = x.shape
    h = _check_heads(e, num_heads)
    packed, _ = check_params(params, e, e, e, x.dtype)
    mask = combine_masks(attn_mask, key_padding_mask, (b, h), t, t, x.dtype)
    core_params = params if packed else to_packed(params)
    return _attend("self_attention_forward", (x,), core_params, h, mask, not packed, average,
                   need_weights)


def self_attention_backward(dout, cache: MHACache, dweights=None):
    """Checked :func:`transformer_lab.core.multihead.self_attention_backward` (shapes there)."""
    dweights = _check_mha_backward(dout, cache, "self_attention_backward", dweights)
    dx, grads = core_multihead.self_attention_backward(dout, cache.core, dweights)
    return dx, grads_to_separate(grads, dx.shape[2]) if cache.extra[0] else grads
