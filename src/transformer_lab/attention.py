"""Attention as forward/backward pairs: masks, scaled dot-product attention, multi-head attention.

Conventions (those of PyTorch, so that :mod:`transformer_lab.interop` can mirror it):

- Sequences are batch-first: queries ``(B, T, E)``, keys/values ``(B, S, E)``.
- A **boolean** mask is True where attention is **blocked**; a **float** mask is added to the
  scores (``-inf`` blocks). ``attn_mask`` is broadcast to the scores ``(..., T, S)``;
  ``key_padding_mask`` has shape ``(B, S)`` and blocks padded keys for every query of a sequence.
- A query row whose keys are **all** blocked attends to nothing: its attention weights are all
  zero, its output is zero (the output projection's bias in multi-head attention), and it gets
  and passes on zero gradient. This is the behaviour of ``F.scaled_dot_product_attention``;
  ``nn.MultiheadAttention`` returns NaN for such rows when ``need_weights=True`` (its default)
  and its output bias when ``need_weights=False``. No NaN ever reaches other rows.
- Attention weights handed out (``cache.weights``, per-head weights) are read-only: the
  backward pass reads the same buffer, so editing them in place raises instead of silently
  changing the gradients. Backward functions refuse a ``dout`` (or ``dweights``) that is not an
  array of the forward output's (weights') shape and dtype.

No Python loop runs over the batch, the heads or the positions.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from transformer_lab import _validate as v

# --------------------------------------------------------------------------------------------
# Masks


def causal_mask(length: int, source_length: int | None = None) -> np.ndarray:
    """Boolean mask that blocks attention to future positions.

    Args:
        length: number of queries T.
        source_length: number of keys S (default T).

    Returns:
        mask: bool array of shape (T, S), True where key j > query i (the future).
    """
    t = v.positive_int(length, "length")
    s = t if source_length is None else v.positive_int(source_length, "source_length")
    return np.triu(np.ones((t, s), dtype=bool), k=1)


def padding_mask(lengths, max_len: int | None = None) -> np.ndarray:
    """Boolean key padding mask from the valid length of every sequence of a batch.

    Args:
        lengths: integer array of shape (B,), each in [0, max_len].
        max_len: padded length S (default ``max(lengths)``).

    Returns:
        mask: bool array of shape (B, S), True at padding positions (``j >= lengths[b]``).
    """
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
    return np.arange(max_len)[None, :] >= lengths[:, None]


def _additive_mask(mask, name: str, dtype) -> np.ndarray:
    """A bool or float mask as a float mask to add to the scores (-inf where blocked)."""
    mask = np.asarray(mask)
    if mask.dtype == bool:
        out = np.zeros(mask.shape, dtype=dtype)
        out[mask] = -np.inf
        return out
    if mask.dtype in (np.float32, np.float64):
        if np.isnan(mask).any() or np.isposinf(mask).any():
            raise ValueError(f"{name} must not contain NaN or +inf (use -inf or True to block)")
        return mask.astype(dtype, copy=False)
    raise TypeError(f"{name} must be a bool mask (True = blocked) or a float mask added to the "
                    f"scores, got dtype {mask.dtype}")


def combine_masks(attn_mask, key_padding_mask, batch_shape: tuple, t: int, s: int, dtype):
    """Merge ``attn_mask`` and ``key_padding_mask`` into one additive mask, or None.

    Args:
        attn_mask: None, or bool/float, broadcastable to ``batch_shape + (T, S)``.
        key_padding_mask: None, or bool/float of shape (B, S) with B = batch_shape[0].
        batch_shape: the leading axes of the scores, e.g. (B,) or (B, H).

    Returns:
        None or a float array broadcastable to ``batch_shape + (T, S)``.
    """
    full = (*batch_shape, t, s)
    total = None
    if attn_mask is not None:
        total = _additive_mask(attn_mask, "attn_mask", dtype)
        try:
            fits = np.broadcast_shapes(total.shape, full) == full
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"attn_mask must be broadcastable to the attention scores of shape "
                             f"{full} (e.g. ({t}, {s})), got shape {total.shape}")
    if key_padding_mask is not None:
        kpm = _additive_mask(key_padding_mask, "key_padding_mask", dtype)
        if not batch_shape or kpm.shape != (batch_shape[0], s):
            raise ValueError(f"key_padding_mask must have shape (batch, source length) = "
                             f"({batch_shape[0] if batch_shape else '?'}, {s}), got {kpm.shape}")
        kpm = kpm.reshape(kpm.shape[0], *([1] * len(batch_shape)), s)  # (B, 1.., 1, S)
        total = kpm if total is None else total + kpm
    return total


def _masked_softmax(scores_t: np.ndarray, mask_t) -> np.ndarray:
    """Softmax over the **keys**, axis -2, of ``scores_t + mask_t``, in place in ``scores_t``.

    The scores are laid out keys-first, (..., S, T) -- the transpose of the usual (..., T, S) --
    because NumPy reduces over axis -2 vectorised across the contiguous query axis: about twice
    as fast as reducing each short row along the last axis (for the sum, einsum is faster still
    than ``sum``). A fully blocked query (a column of -inf) gives all zeros instead of NaN.
    A NaN or +inf score (from a NaN or infinite q or k) raises a ValueError: the check is one
    test over the column maxima, S times fewer numbers than the scores.
    """
    if mask_t is not None:
        scores_t += mask_t
    col_max = scores_t.max(axis=-2, keepdims=True)  # NaN if the column holds a NaN
    blocked = None
    if not np.isfinite(col_max).all():  # rare: fully blocked queries, or bad input
        if mask_t is not None:
            blocked = np.isneginf(col_max)  # every key of the query masked
            col_max[blocked] = 0  # exp(-inf - 0) = 0 instead of exp(nan)
        if not np.isfinite(col_max).all():
            raise ValueError("the attention scores q k^T * scale hold NaN or +inf (or, without "
                             "a mask, only -inf): q and k must be finite")
    scores_t -= col_max
    np.exp(scores_t, out=scores_t)
    total = np.einsum("...st->...t", scores_t)[..., None, :]  # >= 1 where not blocked
    if blocked is not None:
        total[blocked] = 1  # 0 / 1 = 0 for fully blocked queries
    scores_t /= total
    return scores_t


# --------------------------------------------------------------------------------------------
# Scaled dot-product attention


class AttentionCache(NamedTuple):
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    weights: np.ndarray
    scale: float


def scaled_dot_product_attention_forward(q, k, v_, attn_mask=None, key_padding_mask=None,
                                         scale: float | None = None):
    """``softmax(q k^T * scale + mask) v`` over any number of leading (batch, head) axes.

    Args:
        q: queries, shape (..., T, d_k).
        k: keys, shape (..., S, d_k).
        v_: values, shape (..., S, d_v).
        attn_mask: None, or bool (True = blocked) / float (added), broadcastable to (..., T, S).
        key_padding_mask: None, or bool / float of shape (B, S), B the first axis of q.
        scale: multiplies the scores, a finite positive number; default ``1 / sqrt(d_k)``.

    Returns:
        out: shape (..., T, d_v); cache (``cache.weights``, shape (..., T, S), read-only, are
        the attention weights).
    """
    q = v.float_array(q, "q", min_ndim=2)
    k = v.float_array(k, "k", min_ndim=2)
    v_ = v.float_array(v_, "v", min_ndim=2)
    v.same_dtype("q", q, "k", k)
    v.same_dtype("q", q, "v", v_)
    if not (q.shape[:-2] == k.shape[:-2] == v_.shape[:-2]):
        raise ValueError(f"q, k and v must have the same leading (batch, head) axes, got shapes "
                         f"{q.shape}, {k.shape}, {v_.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same last dimension d_k, got {q.shape[-1]} and "
                         f"{k.shape[-1]}")
    if k.shape[-2] != v_.shape[-2]:
        raise ValueError(f"k and v must have the same length S (axis -2), got {k.shape[-2]} and "
                         f"{v_.shape[-2]}")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    else:
        scale = v.real(scale, "scale", positive=True)
    t, s = q.shape[-2], k.shape[-2]
    mask = combine_masks(attn_mask, key_padding_mask, q.shape[:-2], t, s, q.dtype)
    # The scores are computed transposed, keys first: S^T = k q^T, shape (..., S, T), so that
    # the softmax reduces over axis -2 (see _masked_softmax). The weights handed out are a
    # transposed view, (..., T, S): the same numbers, no copy -- read-only, because the
    # backward pass reads them.
    # The scale multiplies q (T x d_k numbers) rather than the scores (S x T numbers).
    mask_t = None if mask is None else np.ascontiguousarray(np.swapaxes(mask, -1, -2))
    # A NaN or infinite q or k would warn here; _masked_softmax raises a ValueError instead.
    with np.errstate(invalid="ignore", over="ignore"):
        scores_t = np.matmul(k, np.swapaxes(q * q.dtype.type(scale), -1, -2))
        _masked_softmax(scores_t, mask_t)  # in place: scores_t now holds the weights, keys first
    scores_t.flags.writeable = False
    weights = np.swapaxes(scores_t, -1, -2)
    out = np.matmul(weights, v_)
    return out, AttentionCache(q, k, v_, weights, scale)


def scaled_dot_product_attention_backward(dout, cache: AttentionCache, dweights=None):
    """Gradients of :func:`scaled_dot_product_attention_forward`.

    With ``P`` the attention weights and ``dP = dout v^T``:
    ``dv = P^T dout``, ``dS = P * (dP - sum(dP * P))`` (softmax backward, zero where blocked),
    ``dq = scale * dS k``, ``dk = scale * dS^T q``.

    Args:
        dout: upstream gradient of the output, (..., T, d_v).
        cache: from the forward pass.
        dweights: optional upstream gradient of the attention weights themselves, (..., T, S),
            added to ``dP`` (for a loss that also uses the weights).

    Returns:
        dq: shape (..., T, d_k); dk: shape (..., S, d_k); dv: shape (..., S, d_v).
    """
    v.cache_of(cache, "scaled_dot_product_attention_backward", AttentionCache)
    q, k, v_, p, scale = cache
    v.grad_like(dout, "dout", (*q.shape[:-1], v_.shape[-1]), q.dtype)
    # Keys-first layout, as in the forward pass: p_t = P^T is (..., S, T), contiguous.
    p_t = np.swapaxes(p, -1, -2)
    dv = np.matmul(p_t, dout)
    dp_t = np.matmul(v_, np.swapaxes(dout, -1, -2))  # dP^T = v dout^T
    if dweights is not None:
        v.grad_like(dweights, "dweights", p.shape, p.dtype, what="the attention weights")
        dp_t += np.swapaxes(dweights, -1, -2)
    # softmax backward over the keys, in place: dS = P * (dP - sum_keys(dP * P)), times scale
    dp_t -= np.einsum("...st,...st->...t", dp_t, p_t)[..., None, :]
    dp_t *= p_t
    dp_t *= q.dtype.type(scale)
    dq = np.matmul(np.swapaxes(dp_t, -1, -2), k)
    dk = np.matmul(dp_t, q)
    return dq, dk, dv


# --------------------------------------------------------------------------------------------
# Multi-head attention


def split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """(B, T, E) -> (B, H, T, E/H): reshape the features into heads, move heads before time.

    ``num_heads`` must divide E. The result is a view of ``x`` where possible (no copy).
    """
    _check_ndim(x, 3, "(B, T, E)")
    return _split_heads(x, _check_heads(x.shape[2], num_heads, "x.shape[-1]"))


def _split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """:func:`split_heads` without the checks, for the forward and backward passes, whose
    arrays are (B, T, E) with H dividing E by construction."""
    b, t, e = x.shape
    return x.reshape(b, t, num_heads, e // num_heads).transpose(0, 2, 1, 3)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(B, H, T, Dh) -> (B, T, H*Dh): the inverse of :func:`split_heads` (concatenate heads)."""
    _check_ndim(x, 4, "(B, H, T, Dh)")
    b, h, t, dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, t, h * dh)


def _check_ndim(x, ndim: int, shape: str) -> None:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"x must be a NumPy array of shape {shape}, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"x must be a NumPy array of shape {shape}, got shape {x.shape}")


class MHACache(NamedTuple):
    inputs: tuple  # (query, key, value) as projected from; a single (x,) for self-attention
    packed: bool
    has_bias: bool
    num_heads: int
    attention: AttentionCache
    context: np.ndarray  # (B, T, E): the heads concatenated, before the output projection
    average_attn_weights: bool


def mha_init(embed_dim: int, num_heads: int, kdim: int | None = None, vdim: int | None = None,
             bias: bool = True, packed: bool = False, rng: np.random.Generator | None = None,
             dtype=np.float32) -> dict[str, np.ndarray]:
    """Parameters for multi-head attention, Xavier-uniform weights and zero biases like PyTorch.

    Args:
        embed_dim: E; num_heads: H, must divide E.
        kdim, vdim: widths of the keys and values (default E, as PyTorch's None).
        bias: with the biases; packed: one ``W_qkv`` instead of ``W_q, W_k, W_v``.
        rng: a ``np.random.Generator``; default ``np.random.default_rng(0)``, so that two calls
            without one return the same parameters.
        dtype: np.float32 or np.float64.

    Returns a dict with ``W_q`` (E, E), ``W_k`` (kdim, E), ``W_v`` (vdim, E), ``W_o`` (E, E) and,
    with ``bias``, ``b_q``, ``b_k``, ``b_v``, ``b_o`` (E,). With ``packed`` (needs
    kdim = vdim = E), ``W_qkv`` (E, 3E) and ``b_qkv`` (3E,) replace the three input projections:
    the layout of PyTorch's ``in_proj_weight``, transposed.
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

    def xavier(fan_in, fan_out):
        a = math.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-a, a, size=(fan_in, fan_out)).astype(dtype)

    if packed:
        p = {"W_qkv": xavier(e, 3 * e)}
    else:
        p = {"W_q": xavier(e, e), "W_k": xavier(kdim, e), "W_v": xavier(vdim, e)}
    p["W_o"] = xavier(e, e)
    if bias:
        if packed:
            p["b_qkv"] = np.zeros(3 * e, dtype)
        else:
            p.update(b_q=np.zeros(e, dtype), b_k=np.zeros(e, dtype), b_v=np.zeros(e, dtype))
        p["b_o"] = np.zeros(e, dtype)
    return p


def _check_params(params, e: int, kdim: int, vdim: int, dtype) -> tuple[bool, bool]:
    """Validate a parameter dict; return (packed, has_bias)."""
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays, got {type(params).__name__}")
    packed = "W_qkv" in params
    if packed:
        if kdim != e or vdim != e:
            raise ValueError(f"packed projections (W_qkv) need key and value width = query width "
                             f"{e}, got {kdim} and {vdim}")
        weights = {"W_qkv": (e, 3 * e), "W_o": (e, e)}
        biases = {"b_qkv": (3 * e,), "b_o": (e,)}
    else:
        weights = {"W_q": (e, e), "W_k": (kdim, e), "W_v": (vdim, e), "W_o": (e, e)}
        biases = {"b_q": (e,), "b_k": (e,), "b_v": (e,), "b_o": (e,)}
    present = [name for name in biases if name in params]
    if present and len(present) != len(biases):
        raise ValueError(f"params must have all of the biases {sorted(biases)} or none, "
                         f"got {sorted(present)}")
    expected = {**weights, **(biases if present else {})}
    unknown = set(params) - set(expected)
    if unknown:
        raise ValueError(f"params has unexpected entries {sorted(unknown)}; expected "
                         f"{sorted(expected)}")
    for name, shape in expected.items():
        if name not in params:
            raise ValueError(f"params is missing {name!r} of shape {shape}")
        arr = v.float_array(params[name], f"params[{name!r}]")
        if arr.dtype != dtype:
            raise TypeError(f"params[{name!r}] must have the dtype of the query ({dtype}), "
                            f"got {arr.dtype}")
        v.shape_is(arr, shape, f"params[{name!r}]")
    return packed, bool(present)


def _check_heads(e: int, num_heads, width: str = "query.shape[-1]") -> int:
    h = v.positive_int(num_heads, "num_heads")
    if e % h:
        raise ValueError(f"the model width ({width} = {e}) must be divisible by "
                         f"num_heads = {h}")
    return h


def _input_projections(params, e: int, packed: bool):
    """(W_q, W_k, W_v, b_q, b_k, b_v); views into W_qkv / b_qkv when packed, biases maybe None."""
    if packed:
        w, bias = params["W_qkv"], params.get("b_qkv")
        ws = (w[:, :e], w[:, e:2 * e], w[:, 2 * e:])
        bs = (None,) * 3 if bias is None else (bias[:e], bias[e:2 * e], bias[2 * e:])
        return (*ws, *bs)
    return (params["W_q"], params["W_k"], params["W_v"],
            params.get("b_q"), params.get("b_k"), params.get("b_v"))


def _affine(x2d: np.ndarray, W: np.ndarray, b) -> np.ndarray:
    out = x2d @ W
    if b is not None:
        out += b
    return out


def _heads_forward(q2, k2, v2, shape_q, s, params, h, attn_mask, key_padding_mask, average,
                   need_weights=True):
    """From projected (B*T, E), (B*S, E), (B*S, E) to the output and the attention weights
    (None with ``need_weights=False``: the layers never look at them)."""
    b, t, e = shape_q
    qh = _split_heads(q2.reshape(b, t, e), h)
    kh = _split_heads(k2.reshape(b, s, e), h)
    vh = _split_heads(v2.reshape(b, s, e), h)
    ctx_h, att = scaled_dot_product_attention_forward(qh, kh, vh, attn_mask, key_padding_mask)
    ctx = merge_heads(ctx_h)
    out = _affine(ctx.reshape(-1, e), params["W_o"], params.get("b_o")).reshape(b, t, e)
    weights = None if not need_weights else att.weights.mean(axis=1) if average else att.weights
    return out, weights, att, ctx


def _heads_backward(dout, cache: MHACache, params, dweights):
    """Gradients through the output projection and the heads: dq, dk, dv per head,
    (B, H, ., Dh), and the gradients of W_o, b_o."""
    b, t, e = cache.context.shape
    v.grad_like(dout, "dout", (b, t, e), cache.context.dtype)
    ctx2 = cache.context.reshape(-1, e)
    dout2 = dout.reshape(-1, e)
    grads = {"W_o": ctx2.T @ dout2}
    if cache.has_bias:
        grads["b_o"] = dout2.sum(axis=0)
    dctx = (dout2 @ params["W_o"].T).reshape(b, t, e)
    weights = cache.attention.weights  # (B, H, T, S)
    if dweights is not None and cache.average_attn_weights:
        v.grad_like(dweights, "dweights", weights.shape[:1] + weights.shape[2:], weights.dtype,
                    what="the averaged attention weights")
        dweights = np.broadcast_to(dweights[:, None] / cache.num_heads, weights.shape)
    elif dweights is not None:
        v.grad_like(dweights, "dweights", weights.shape, weights.dtype,
                    what="the attention weights per head")
    dqh, dkh, dvh = scaled_dot_product_attention_backward(
        _split_heads(dctx, cache.num_heads), cache.attention, dweights)
    return dqh, dkh, dvh, grads


def _merge_side_by_side(*heads: np.ndarray) -> np.ndarray:
    """(B, H, T, Dh) arrays -> one (B*T, n*E) array ``[x_1 | x_2 | ...]``, heads merged.

    The copy that :func:`merge_heads` makes anyway, made into one buffer: the packed
    projection's gradients then need no ``np.concatenate`` (another full copy).
    """
    b, h, t, dh = heads[0].shape
    out = np.empty((b, t, len(heads), h, dh), dtype=heads[0].dtype)
    for i, x in enumerate(heads):  # over the 2 or 3 arrays, not over the batch or heads
        out[:, :, i] = x.transpose(0, 2, 1, 3)
    return out.reshape(b * t, len(heads) * h * dh)


def _input_grads(grads, packed, has_bias, xs, dq2, dk2, dv2):
    """Weight and bias gradients of the input projections, in the layout of params."""
    gw = [x.reshape(-1, x.shape[-1]).T @ d for x, d in zip(xs, (dq2, dk2, dv2), strict=True)]
    if packed:
        grads["W_qkv"] = np.concatenate(gw, axis=1)
        if has_bias:
            grads["b_qkv"] = np.concatenate([dq2.sum(0), dk2.sum(0), dv2.sum(0)])
    else:
        grads.update(W_q=gw[0], W_k=gw[1], W_v=gw[2])
        if has_bias:
            grads.update(b_q=dq2.sum(0), b_k=dk2.sum(0), b_v=dv2.sum(0))
    return grads


def multi_head_attention_forward(query, key, value, params: dict, num_heads: int,
                                 attn_mask=None, key_padding_mask=None,
                                 average_attn_weights: bool = True, need_weights: bool = True):
    """Multi-head attention, as ``nn.MultiheadAttention(batch_first=True)`` without dropout.

    ``Q = query W_q + b_q``, ``K = key W_k + b_k``, ``V = value W_v + b_v``; each is split into
    ``num_heads`` heads of width ``Dh = E / num_heads``; every head runs scaled dot-product
    attention (scale ``1/sqrt(Dh)``); the heads are concatenated and projected by ``W_o, b_o``.
    Used for cross-attention (decoder queries, encoder memory as keys and values); for
    self-attention :func:`self_attention_forward` saves work.

    Args:
        query: (B, T, E).
        key: (B, S, kdim).
        value: (B, S, vdim).
        params: see :func:`mha_init`: separate ``W_q, W_k, W_v`` or packed ``W_qkv``,
            ``W_o`` and optional biases.
        num_heads: H, must divide E.
        attn_mask: None, or bool/float of shape (T, S) or broadcastable to (B, H, T, S).
        key_padding_mask: None, or bool/float of shape (B, S).
        average_attn_weights: return the weights averaged over heads, (B, T, S), instead of
            per head, (B, H, T, S) (read-only: the backward pass reads them).
        need_weights: False returns None for the weights (saves averaging them; as PyTorch's).

    Returns:
        out: (B, T, E); weights: (B, T, S) or (B, H, T, S), or None; cache.
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
    packed, has_bias = _check_params(params, e, key.shape[2], value.shape[2], query.dtype)
    wq, wk, wv, bq, bk, bv = _input_projections(params, e, packed)
    q2 = _affine(query.reshape(-1, e), wq, bq)
    k2 = _affine(key.reshape(-1, key.shape[2]), wk, bk)
    v2 = _affine(value.reshape(-1, value.shape[2]), wv, bv)
    out, weights, att, ctx = _heads_forward(q2, k2, v2, query.shape, key.shape[1], params, h,
                                            attn_mask, key_padding_mask, average, need_weights)
    cache = MHACache((query, key, value), packed, has_bias, h, att, ctx, average)
    return out, weights, cache


def multi_head_attention_backward(dout, cache: MHACache, params: dict, dweights=None):
    """Gradients of :func:`multi_head_attention_forward`.

    Args:
        dout: upstream gradient of the output, (B, T, E).
        cache: from the forward pass.
        params: the parameter dict of the forward pass.
        dweights: optional upstream gradient of the returned attention weights (same shape).

    Returns:
        dquery (B, T, E), dkey (B, S, kdim), dvalue (B, S, vdim), and grads: a dict with the
        keys of ``params``, each of the shape of its parameter.
    """
    v.cache_of(cache, "multi_head_attention_backward", MHACache)
    if len(cache.inputs) != 3:
        raise ValueError("multi_head_attention_backward: cache comes from self_attention_forward;"
                         " use self_attention_backward")
    query, key, value = cache.inputs
    dqh, dkh, dvh, grads = _heads_backward(dout, cache, params, dweights)
    e = query.shape[2]
    dq2, dk2, dv2 = (merge_heads(d).reshape(-1, e) for d in (dqh, dkh, dvh))
    wq, wk, wv, _, _, _ = _input_projections(params, e, cache.packed)
    _input_grads(grads, cache.packed, cache.has_bias, (query, key, value), dq2, dk2, dv2)
    dquery = (dq2 @ wq.T).reshape(query.shape)
    dkey = (dk2 @ wk.T).reshape(key.shape)
    dvalue = (dv2 @ wv.T).reshape(value.shape)
    return dquery, dkey, dvalue, grads


def self_attention_forward(x, params: dict, num_heads: int, attn_mask=None,
                           key_padding_mask=None, average_attn_weights: bool = True,
                           need_weights: bool = True):
    """Multi-head self-attention: :func:`multi_head_attention_forward` with query = key = value.

    With packed parameters (``W_qkv``) the three projections are one matrix product.

    Args:
        x: (B, T, E).
        params, num_heads, attn_mask, key_padding_mask, average_attn_weights, need_weights: as
            for :func:`multi_head_attention_forward` (masks are (T, T) and (B, T)).

    Returns:
        out: (B, T, E); weights: (B, T, T) or (B, H, T, T), or None; cache.
    """
    average = v.boolean(average_attn_weights, "average_attn_weights")
    need_weights = v.boolean(need_weights, "need_weights")
    x = v.float_array(x, "x", ndim=3)
    b, t, e = x.shape
    h = _check_heads(e, num_heads)
    packed, has_bias = _check_params(params, e, e, e, x.dtype)
    x2 = x.reshape(-1, e)
    if packed:
        qkv = _affine(x2, params["W_qkv"], params.get("b_qkv"))
        q2, k2, v2 = qkv[:, :e], qkv[:, e:2 * e], qkv[:, 2 * e:]
    else:
        q2 = _affine(x2, params["W_q"], params.get("b_q"))
        k2 = _affine(x2, params["W_k"], params.get("b_k"))
        v2 = _affine(x2, params["W_v"], params.get("b_v"))
    out, weights, att, ctx = _heads_forward(q2, k2, v2, x.shape, t, params, h, attn_mask,
                                            key_padding_mask, average, need_weights)
    return out, weights, MHACache((x,), packed, has_bias, h, att, ctx, average)


def self_attention_backward(dout, cache: MHACache, params: dict, dweights=None):
    """Gradients of :func:`self_attention_forward`.

    ``x`` feeds the queries, the keys and the values, so its gradient is the sum of the three
    paths: ``dx = dQ W_q^T + dK W_k^T + dV W_v^T`` (one product ``dQKV W_qkv^T`` when packed).

    Returns:
        dx (B, T, E) and grads, a dict with the keys of ``params``.
    """
    v.cache_of(cache, "self_attention_backward", MHACache)
    if len(cache.inputs) != 1:
        raise ValueError("self_attention_backward: cache comes from multi_head_attention_forward;"
                         " use multi_head_attention_backward")
    (x,) = cache.inputs
    dqh, dkh, dvh, grads = _heads_backward(dout, cache, params, dweights)
    e = x.shape[2]
    x2 = x.reshape(-1, e)
    dqkv = _merge_side_by_side(dqh, dkh, dvh)  # (B*T, 3E): [dQ | dK | dV]
    if cache.packed:
        grads["W_qkv"] = x2.T @ dqkv
        if cache.has_bias:
            grads["b_qkv"] = dqkv.sum(axis=0)
        dx = dqkv @ params["W_qkv"].T
    else:
        dq2, dk2, dv2 = dqkv[:, :e], dqkv[:, e:2 * e], dqkv[:, 2 * e:]
        _input_grads(grads, False, cache.has_bias, (x, x, x), dq2, dk2, dv2)
        dx = dq2 @ params["W_q"].T + dk2 @ params["W_k"].T + dv2 @ params["W_v"].T
    return dx.reshape(x.shape), grads
