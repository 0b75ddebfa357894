"""Transformer blocks as forward/backward pairs -- feed-forward, encoder and decoder layers,
stacks: the checked public entry points to ``transformer_lab.core.blocks``.

Parameters are the nested dicts that :mod:`transformer_lab.core.blocks` lists (a feed-forward
has both biases or none); attention parameter dicts are those of :mod:`transformer_lab.attention`,
packed (``W_qkv``) or separate (``W_q, W_k, W_v``); backward functions return the gradients in
the nested structure of the parameters given.

Each public function checks everything once -- the input, every parameter of every layer, the
masks -- then converts what the core takes differently (the two masks of an attention merged
into one; self-attention packed and cross-attention separate; a norm without ``gamma``) and
calls the core, which checks nothing. The ``*_init`` functions are deterministic: without an
``rng`` they draw from ``np.random.default_rng(0)``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from transformer_lab import _validate as v
from transformer_lab import attention as att
from transformer_lab import layers as L
from transformer_lab.core import blocks as core_blocks
from transformer_lab.core import layers as core_layers

# --------------------------------------------------------------------------------------------
# Parameter checks (no computation): every message names the parameter's path


_FF_KEYS = frozenset({"W1", "W2", "b1", "b2"})
_NORM_KEYS = frozenset({"gamma", "beta"})
_ENCODER_KEYS = ("self_attn", "ff", "norm1", "norm2")
_DECODER_KEYS = ("self_attn", "cross_attn", "ff", "norm1", "norm2", "norm3")


def _ff_params_fit(params, e: int, dtype) -> bool:
    """True when :func:`_check_ff_params` has nothing to say: the quick test of every call."""
    if not isinstance(params, dict) or not params.keys() <= _FF_KEYS:
        return False
    w1, b1, w2, b2 = params.get("W1"), params.get("b1"), params.get("W2"), params.get("b2")
    if not (isinstance(w1, np.ndarray) and w1.ndim == 2) or (b1 is None) != (b2 is None):
        return False
    f = w1.shape[1]
    return (_fits(w1, (e, f), dtype) and _fits(w2, (f, e), dtype)
            and (b1 is None or _fits(b1, (f,), dtype)) and (b2 is None or _fits(b2, (e,), dtype)))


def _fits(p, shape: tuple, dtype) -> bool:
    return type(p) is np.ndarray and p.shape == shape and p.dtype == dtype


def _check_ff_params(params, e: int, dtype, where: str) -> None:
    """``W1`` (E, F), ``W2`` (F, E), optional ``b1`` (F,) and ``b2`` (E,) (both or neither),
    all of x's dtype."""
    if _ff_params_fit(params, e, dtype):
        return
    if not isinstance(params, Mapping):
        raise TypeError(f"{where} must be a dict with W1 (E, F), W2 (F, E) and optionally "
                        f"b1 (F,), b2 (E,), got {type(params).__name__}")
    unknown = set(params) - _FF_KEYS
    if unknown:
        raise ValueError(f"{where} has unexpected entries {sorted(unknown)}; expected W1, W2 "
                         "and optionally b1, b2")
    for name in ("W1", "W2"):
        if name not in params:
            raise ValueError(f"{where} is missing {name!r}")
    f = v.float_array(params["W1"], f"{where}['W1']", ndim=2).shape[1]
    expected = {"W1": ((e, f), "(E, F), E = x.shape[-1]"),
                "W2": ((f, e), f"(F, E), F = {where}['W1'].shape[1]"),
                "b1": ((f,), "(F,)"), "b2": ((e,), "(E,)")}
    for name, (shape, what) in expected.items():
        if params.get(name) is not None:
            v.param(params[name], f"{where}[{name!r}]", shape, dtype, what=what)
    if (params.get("b1") is None) != (params.get("b2") is None):
        raise ValueError(f"{where} must have both biases b1 and b2, or neither")


def _check_norm(p, e: int, dtype, where: str) -> None:
    """A layer norm's parameters: a dict with optional ``gamma`` and ``beta`` (E,)."""
    if type(p) is dict and p.keys() <= _NORM_KEYS and all(_fits(a, (e,), dtype)
                                                          for a in p.values()):
        return  # the quick test of every call
    if not isinstance(p, Mapping) or not p.keys() <= _NORM_KEYS:
        raise ValueError(f"{where} must be a dict with (optional) entries 'gamma' and 'beta', "
                         f"got {sorted(p) if isinstance(p, Mapping) else type(p).__name__}")
    L.check_norm_params(p.get("gamma"), p.get("beta"), e, dtype, where)


def _check_layer_params(params, keys, e: int, dtype, where: str) -> None:
    """A layer's parameter dict: exactly ``keys``, each entry checked."""
    if not isinstance(params, Mapping):
        raise TypeError(f"{where} must be a dict with the entries {list(keys)}, got "
                        f"{type(params).__name__}")
    if params.keys() != set(keys):
        missing = [k for k in keys if k not in params]
        unknown = sorted(set(params) - set(keys))
        raise ValueError(f"{where} must have the entries {list(keys)}: missing {missing}, "
                         f"unexpected {unknown}")
    for key in ("self_attn", "cross_attn"):
        if key in params:
            att.check_params(params[key], e, e, e, dtype, f"{where}[{key!r}]")
    _check_ff_params(params["ff"], e, dtype, f"{where}['ff']")
    for norm in ("norm1", "norm2", "norm3"):
        if norm in params:
            _check_norm(params[norm], e, dtype, f"{where}[{norm!r}]")


def _check_options(x, num_heads, norm_first, activation, eps):
    """x (B, T, E); heads dividing E; norm_first a bool; a known activation; eps >= 0."""
    x = v.float_array(x, "x", ndim=3)
    h = att._check_heads(x.shape[2], num_heads, "x.shape[-1]")
    norm_first = v.boolean(norm_first, "norm_first")
    L.check_activation(activation)
    eps = v.real(eps, "eps", minimum=0)
    return x, h, norm_first, eps


def _check_memory(memory, x):
    """The decoder's memory: (B, S, E) with the batch size, width and dtype of x."""
    memory = v.float_array(memory, "memory", ndim=3)
    v.same_dtype("x", x, "memory", memory)
    b, _, e = x.shape
    if memory.shape[0] != b or memory.shape[2] != e:
        raise ValueError(f"memory must have shape (B, S, E) = ({b}, S, {e}) (the batch size and "
                         f"width of x), got {memory.shape}")
    return memory


def _check_stack(params, keys, e: int, dtype) -> None:
    if not isinstance(params, Mapping) or not isinstance(params.get("layers"), (list, tuple)) \
            or not params["layers"]:
        raise ValueError('params must be a dict {"layers": [layer params, ...] (at least one), '
                         '"norm": <layer norm params> or None}')
    for i, layer in enumerate(params["layers"]):
        _check_layer_params(layer, keys, e, dtype, f"params['layers'][{i}]")
    if params.get("norm") is not None:
        _check_norm(params["norm"], e, dtype, "params['norm']")


def _check_finite_norms(out: np.ndarray, eps: float) -> None:
    """With an eps that may be 0 in the dtype, a row of equal entries normalises to 0/0."""
    if eps < 1e-30 and not np.isfinite(out).all():
        raise ValueError(f"a layer norm got a row whose entries are all equal (variance 0) and "
                         f"eps={eps} adds nothing to it: its normalisation is 0/0 = NaN; use "
                         "eps > 0 (PyTorch's default is 1e-5)")


# --------------------------------------------------------------------------------------------
# Conversions between the parameters given and the ones the core takes (no copies of arrays
# except when separate self-attention projections are packed), and back for the gradients


def _norm_to_core(p):
    return p if "gamma" in p else {"gamma": None, **p}


def _layer_to_core(params: Mapping) -> tuple[Mapping, tuple]:
    """The core's layer params (self-attention packed, cross-attention separate, every norm
    with a ``gamma``), and what was converted, for :func:`_layer_grads`."""
    converted = []
    core = params
    if "W_qkv" not in params["self_attn"]:
        core = {**core, "self_attn": att.to_packed(params["self_attn"])}
        converted.append("self_attn")
    cross = params.get("cross_attn")
    if cross is not None and "W_qkv" in cross:
        e = cross["W_o"].shape[0]
        core = {**core, "cross_attn": att.to_separate(cross, e)}
        converted.append("cross_attn")
    for norm in ("norm1", "norm2", "norm3"):
        if norm in params and "gamma" not in params[norm]:
            core = {**core, norm: _norm_to_core(params[norm])}
    return core, tuple(converted)


def _layer_grads(grads: dict, converted: tuple) -> dict:
    """The core's gradients of a layer in the layout of the params given."""
    if "self_attn" in converted:
        g = grads["self_attn"]
        grads["self_attn"] = att.grads_to_separate(g, g["W_o"].shape[0])
    if "cross_attn" in converted:
        grads["cross_attn"] = att.to_packed(grads["cross_attn"])
    return grads


def _stack_to_core(params: Mapping) -> tuple[dict, tuple]:
    layers, converted = zip(*(_layer_to_core(p) for p in params["layers"]), strict=True)
    norm = params.get("norm")
    return ({"layers": list(layers), "norm": None if norm is None else _norm_to_core(norm)},
            converted)


def _stack_grads(grads: dict, converted: tuple) -> dict:
    for g, c in zip(grads["layers"], converted, strict=True):
        _layer_grads(g, c)
    return grads


# --------------------------------------------------------------------------------------------
# Accessors: what callers outside the core read from the core's block caches


def layer_attention_weights(core_cache) -> list[np.ndarray]:
    """The per-head attention weights (B, H, T, S) in the cache of ``core.blocks``'
    ``encoder_layer_forward`` ([self-attention]) or ``decoder_layer_forward`` ([self-attention,
    cross-attention]). A layer's cache holds one residual cache ``(norm_first, norm cache,
    sublayer cache)`` per sublayer, the feed-forward last."""
    return [att.multihead_weights(residual[2]) for residual in core_cache[:-1]]


def stack_layer_caches(core_cache) -> list:
    """The layer caches in the cache of ``core.blocks.encoder_forward`` / ``decoder_forward``."""
    return core_cache[0]


# --------------------------------------------------------------------------------------------
# Feed-forward


def feed_forward_forward(x: np.ndarray, params: dict, activation: str = "relu"):
    """Checked :func:`transformer_lab.core.blocks.feed_forward_forward` (shapes there)."""
    x = v.float_array(x, "x", min_ndim=1)
    _check_ff_params(params, x.shape[-1], x.dtype, "params")
    L.check_activation(activation)
    out, cache = core_blocks.feed_forward_forward(x, params, activation)
    return out, v.Cache(cache, out.shape, x.dtype, "feed_forward_forward")


def feed_forward_backward(dout: np.ndarray, cache: v.Cache):
    """Checked :func:`transformer_lab.core.blocks.feed_forward_backward`."""
    dout = v.dout_of(dout, cache, "feed_forward_backward")
    return core_blocks.feed_forward_backward(dout, cache.core)


# --------------------------------------------------------------------------------------------
# Encoder and decoder layers


class LayerCache(v.Cache):
    """A :class:`~transformer_lab._validate.Cache` of ``"encoder_layer_forward"`` or
    ``"decoder_layer_forward"``; ``extra``: the attention parameters converted for the core
    (see :func:`_layer_to_core`)."""

    @property
    def attention_weights(self):
        """The self-attention's weights per head, (B, H, T, T); of a decoder layer, a pair:
        those and the cross-attention's, (B, H, T, S)."""
        weights = tuple(layer_attention_weights(self.core))
        return weights if self.forward == "decoder_layer_forward" else weights[0]


def encoder_layer_forward(x, params: dict, num_heads: int, attn_mask=None,
                          key_padding_mask=None, norm_first: bool = False,
                          activation: str = "relu", eps: float = 1e-5):
    """Checked :func:`transformer_lab.core.blocks.encoder_layer_forward` (shapes there); the
    masks are merged by :func:`transformer_lab.attention.combine_masks`."""
    return _forward("encoder_layer_forward", x, None, params, num_heads,
                    [(attn_mask, key_padding_mask)], norm_first, activation, eps)


def encoder_layer_backward(dout, cache: LayerCache):
    """Checked :func:`transformer_lab.core.blocks.encoder_layer_backward` (grads nested like
    the params given)."""
    dout = v.dout_of(dout, cache, "encoder_layer_backward")
    dx, grads = core_blocks.encoder_layer_backward(dout, cache.core)
    return dx, _layer_grads(grads, cache.extra)


def decoder_layer_forward(x, memory, params: dict, num_heads: int, tgt_mask=None,
                          memory_mask=None, tgt_key_padding_mask=None,
                          memory_key_padding_mask=None, norm_first: bool = False,
                          activation: str = "relu", eps: float = 1e-5):
    """Checked :func:`transformer_lab.core.blocks.decoder_layer_forward` (shapes there); the
    self-attention's masks are ``tgt_*`` (T, T) and (B, T), the cross-attention's ``memory_*``
    (T, S) and (B, S)."""
    return _forward("decoder_layer_forward", x, memory, params, num_heads,
                    [(tgt_mask, tgt_key_padding_mask), (memory_mask, memory_key_padding_mask)],
                    norm_first, activation, eps)


def decoder_layer_backward(dout, cache: LayerCache):
    """Checked :func:`transformer_lab.core.blocks.decoder_layer_backward`."""
    dout = v.dout_of(dout, cache, "decoder_layer_backward")
    dx, dmemory, grads = core_blocks.decoder_layer_backward(dout, cache.core)
    return dx, dmemory, _layer_grads(grads, cache.extra)


# --------------------------------------------------------------------------------------------
# Stacks of layers (nn.TransformerEncoder / nn.TransformerDecoder)


class StackCache(v.Cache):
    """A :class:`~transformer_lab._validate.Cache` of ``"encoder_forward"`` or
    ``"decoder_forward"``; ``extra``: per layer, as :class:`LayerCache`'s."""

    @property
    def norm(self) -> L.LayerNormCache | None:
        """The final norm's cache (``.xhat``, ``.rstd``), or None without a final norm."""
        c = self.core[1]  # core.layers.layer_norm_forward's cache, or None
        return (None if c is None
                else L.LayerNormCache(c, self.shape, self.dtype, "layer_norm_forward"))

    @property
    def attention_weights(self) -> list:
        """Per layer, the attention weights per head (see the layer caches')."""
        return [layer_attention_weights(c) for c in stack_layer_caches(self.core)]


def encoder_forward(x, params: dict, num_heads: int, mask=None, key_padding_mask=None,
                    norm_first: bool = False, activation: str = "relu", eps: float = 1e-5):
    """Checked :func:`transformer_lab.core.blocks.encoder_forward` (shapes there)."""
    return _forward("encoder_forward", x, None, params, num_heads, [(mask, key_padding_mask)],
                    norm_first, activation, eps)


def encoder_backward(dout, cache: StackCache):
    """Checked :func:`transformer_lab.core.blocks.encoder_backward`."""
    dout = v.dout_of(dout, cache, "encoder_backward")
    dx, grads = core_blocks.encoder_backward(dout, cache.core)
    return dx, _stack_grads(grads, cache.extra)


def decoder_forward(x, memory, params: dict, num_heads: int, tgt_mask=None, memory_mask=None,
                    tgt_key_padding_mask=None, memory_key_padding_mask=None,
                    norm_first: bool = False, activation: str = "relu", eps: float = 1e-5):
    """Checked :func:`transformer_lab.core.blocks.decoder_forward` (shapes there)."""
    return _forward("decoder_forward", x, memory, params, num_heads,
                    [(tgt_mask, tgt_key_padding_mask), (memory_mask, memory_key_padding_mask)],
                    norm_first, activation, eps)


def _forward(forward: str, x, memory, params, num_heads, masks: list, norm_first, activation,
             eps):
    """The four forwards above: every check once (the decoder's ``memory``, None for an
    encoder), each attention's ``(attn_mask, key_padding_mask)`` in ``masks`` merged, the
    parameters converted for the core, then the core's function ``forward``."""
    x, h, norm_first, eps = _check_options(x, num_heads, norm_first, activation, eps)
    inputs = (x,) if memory is None else (x, _check_memory(memory, x))
    b, t, e = x.shape
    layer_keys = _ENCODER_KEYS if memory is None else _DECODER_KEYS
    stack = forward in ("encoder_forward", "decoder_forward")
    if stack:
        _check_stack(params, layer_keys, e, x.dtype)
    else:
        _check_layer_params(params, layer_keys, e, x.dtype, "params")
    merged = [att.combine_masks(mask, key_padding_mask, (b, h), t, source.shape[1], x.dtype)
              for (mask, key_padding_mask), source in zip(masks, inputs, strict=True)]
    core_params, converted = (_stack_to_core if stack else _layer_to_core)(params)
    out, cache = getattr(core_blocks, forward)(*inputs, core_params, h, *merged, norm_first,
                                               activation, eps)
    _check_finite_norms(out, eps)
    return out, (StackCache if stack else LayerCache)(cache, out.shape, x.dtype, forward,
                                                      converted)


def decoder_backward(dout, cache: StackCache):
    """Checked :func:`transformer_lab.core.blocks.decoder_backward`."""
    dout = v.dout_of(dout, cache, "decoder_backward")
    dx, dmemory, grads = core_blocks.decoder_backward(dout, cache.core)
    return dx, dmemory, _stack_grads(grads, cache.extra)


# --------------------------------------------------------------------------------------------
# Initialisation (deterministic: rng defaults to np.random.default_rng(0))


def layer_norm_init(d: int, bias: bool = True, dtype=np.float32) -> dict:
    """``{"gamma": ones, "beta": zeros}`` (no beta without bias), like ``nn.LayerNorm``."""
    d = v.positive_int(d, "d")
    dtype = v.float_dtype(dtype, "dtype")
    p = {"gamma": np.ones(d, dtype)}
    if v.boolean(bias, "bias"):
        p["beta"] = np.zeros(d, dtype)
    return p


def _rng(rng) -> np.random.Generator:
    return np.random.default_rng(0) if rng is None else v.generator(rng, "rng")


def feed_forward_init(d_model: int, d_ff: int, bias: bool = True, rng=None,
                      dtype=np.float32) -> dict:
    """Feed-forward parameters, uniform(+-1/sqrt(fan_in)) like ``nn.Linear``
    (``core.layers.init_uniform``).

    ``rng``: a ``np.random.Generator``; default ``np.random.default_rng(0)`` (two calls without
    one give the same parameters).
    """
    d_model = v.positive_int(d_model, "d_model")
    d_ff = v.positive_int(d_ff, "d_ff")
    dtype = v.float_dtype(dtype, "dtype")
    rng = _rng(rng)

    def uniform(fan_in, shape):
        return core_layers.init_uniform(fan_in, shape, rng).astype(dtype)

    p = {"W1": uniform(d_model, (d_model, d_ff)), "W2": uniform(d_ff, (d_ff, d_model))}
    if v.boolean(bias, "bias"):
        p["b1"] = uniform(d_model, (d_ff,))
        p["b2"] = uniform(d_ff, (d_model,))
    return p


def encoder_layer_init(d_model: int, num_heads: int, d_ff: int, bias: bool = True, rng=None,
                       dtype=np.float32, packed: bool = True) -> dict:
    """Parameters of one encoder layer (self-attention packed by default, as PyTorch stores it).

    ``rng``: default ``np.random.default_rng(0)``.
    """
    rng = _rng(rng)
    return {"self_attn": att.mha_init(d_model, num_heads, bias=bias, packed=packed, rng=rng,
                                      dtype=dtype),
            "ff": feed_forward_init(d_model, d_ff, bias, rng, dtype),
            "norm1": layer_norm_init(d_model, bias, dtype),
            "norm2": layer_norm_init(d_model, bias, dtype)}


def decoder_layer_init(d_model: int, num_heads: int, d_ff: int, bias: bool = True, rng=None,
                       dtype=np.float32, packed: bool = True) -> dict:
    """Parameters of one decoder layer. ``rng``: default ``np.random.default_rng(0)``."""
    rng = _rng(rng)
    return {"self_attn": att.mha_init(d_model, num_heads, bias=bias, packed=packed, rng=rng,
                                      dtype=dtype),
            "cross_attn": att.mha_init(d_model, num_heads, bias=bias, packed=False, rng=rng,
                                       dtype=dtype),
            "ff": feed_forward_init(d_model, d_ff, bias, rng, dtype),
            "norm1": layer_norm_init(d_model, bias, dtype),
            "norm2": layer_norm_init(d_model, bias, dtype),
            "norm3": layer_norm_init(d_model, bias, dtype)}
