"""The encoder-decoder Transformer of "Attention Is All You Need", in NumPy, with its backward pass.

    from transformer_lab.transformer import Transformer, TransformerConfig

    config = TransformerConfig(src_vocab_size=16, tgt_vocab_size=16, d_model=32, num_heads=4)
    model = Transformer(config, seed=0)
    loss, grads = model.loss(src, tgt)          # src (B, S), tgt (B, T) padded token ids
    for name, g in grads.items():               # plain SGD, in place
        model.params[name] -= 0.1 * g
    model.greedy_decode(src)                    # list of generated token-id arrays

The model is the composition of the pieces of :mod:`transformer_lab.layers`,
:mod:`transformer_lab.attention` and :mod:`transformer_lab.blocks`::

    src ids -> token embedding (* sqrt(d_model)) + positions -> N encoder layers -> norm = memory
    tgt ids -> token embedding (* sqrt(d_model)) + positions -> N decoder layers -> norm
            -> output projection -> logits (B, T, V)

**Parameters** live in ONE flat dict ``model.params``: dotted name -> array, e.g.
``"src_embed.W"``, ``"encoder.layers.0.self_attn.W_qkv"``, ``"encoder.norm.gamma"``,
``"decoder.layers.1.cross_attn.W_q"``, ``"out_proj.W"`` (all in NumPy layout, ``y = x @ W + b``).
The nested structures that :mod:`transformer_lab.blocks` takes are rebuilt from ``model.params``
at every call and hold the very same arrays (no copies), so an optimiser may update
``model.params[name]`` in place (``p -= lr * g``) or assign a new array of the same shape and
dtype; :meth:`Transformer.set_params` copies values in with checks. ``model.backward`` and
``model.loss`` return gradients in a dict with exactly the keys of ``model.params``.

**Padding.** Token ``config.pad_id`` marks padding. Source padding is masked out of the encoder's
self-attention and of the decoder's cross-attention (key padding masks). A target batch for
:meth:`Transformer.loss` holds sequences ``BOS y_1 ... y_n EOS`` padded on the right; the decoder
reads ``tgt[:, :-1]`` and predicts ``tgt[:, 1:]``, and the loss is the mean cross-entropy over
the predicted tokens up to and including each sequence's first EOS, skipping padding: whatever
follows a sequence's EOS changes neither the loss nor the gradients.

**Checkpoints.** ``model.save("model.npz")`` stores the config and every parameter (NumPy
``.npz``, no pickle); ``Transformer.load("model.npz")`` rebuilds the model, and
``model.load_params(path)`` copies the parameters into an existing model, refusing a file whose
names, shapes or dtypes differ (:class:`CheckpointError`, naming the tensor and both shapes) or
whose config differs in any other field (``norm_first``, ``activation``, ``eps``, ...).

**Input checks** are module functions (:func:`check_inputs`, :func:`check_loss_inputs`,
:func:`check_decode_length`, :func:`decoded_sequences`, ...), shared with the
PyTorch versions of the model in :mod:`transformer_lab.torch_model`: the three models accept the
same input and refuse bad input with the same messages.

Everything is vectorised over the batch, the heads and the positions. float32 by default;
``TransformerConfig(dtype=np.float64)`` (or :meth:`Transformer.astype`) for gradient checks.
"""

from __future__ import annotations

import dataclasses
import json
import math
import zipfile
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from transformer_lab import _validate as v
from transformer_lab import attention as att
from transformer_lab import blocks as B
from transformer_lab import layers as L

# check_parity compares two models' gradients tensor by tensor; it lives in gradient_check and
# is importable from here too (notebook 06 does: from transformer_lab.transformer import ...).
from transformer_lab.gradient_check import check_parity  # noqa: F401

ACTIVATIONS = ("relu", "gelu", "gelu_tanh")
POSITIONAL = ("sinusoidal", "learned", "none")

# --------------------------------------------------------------------------------------------
# Configuration


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyperparameters of :class:`Transformer`. Every field is checked when the config is made.

    Attributes:
        src_vocab_size, tgt_vocab_size: number of source / target token ids.
        d_model: model width E (divisible by ``num_heads``).
        num_heads: attention heads H of every attention layer.
        num_encoder_layers, num_decoder_layers: depth of the two stacks (at least 1 each).
        d_ff: hidden width of the feed-forward networks.
        max_len: longest source sequence and longest decoder input the positional encoding
            covers (and the default number of tokens :meth:`Transformer.greedy_decode` makes).
        norm_first: pre-norm ``x + f(norm(x))`` (True, trains more easily) or post-norm
            ``norm(x + f(x))`` (False, the paper's). Both stacks end with a layer norm, like
            ``nn.Transformer``.
        activation: of the feed-forward networks, "relu", "gelu" (exact) or "gelu_tanh".
        eps: of every layer norm.
        positional: "sinusoidal" (fixed table), "learned" (one trained table per side,
            ``src_pos.W`` and ``tgt_pos.W``) or "none".
        pad_id, bos_id, eos_id: special token ids (pad_id must be a source and a target id;
            bos_id and eos_id target ids; all three different).
        dtype: float32 (default) or float64 (gradient checks).
        scale_embeddings: multiply token embeddings by sqrt(d_model), as the paper does.
        bias: biases in every linear map and layer norm (False: none anywhere, like
            ``nn.Transformer(bias=False)``).
    """

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 32
    num_heads: int = 4
    num_encoder_layers: int = 2
    num_decoder_layers: int = 2
    d_ff: int = 64
    max_len: int = 64
    norm_first: bool = True
    activation: str = "relu"
    eps: float = 1e-5
    positional: str = "sinusoidal"
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    dtype: type = np.float32
    scale_embeddings: bool = True
    bias: bool = True

    def __post_init__(self):
        # Numbers are stored as plain Python ints/floats/bools (np.int64(4) becomes 4), so that
        # equal configs compare equal and config_to_dict is JSON-ready.
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "num_heads",
                     "num_encoder_layers", "num_decoder_layers", "d_ff", "max_len"):
            self._set(name, v.integer(getattr(self, name), f"TransformerConfig.{name}",
                                      minimum=1))
        if self.d_model % self.num_heads:
            raise ValueError(f"TransformerConfig.d_model must be divisible by num_heads, got "
                             f"d_model={self.d_model} and num_heads={self.num_heads}")
        for name in ("norm_first", "scale_embeddings", "bias"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise TypeError(f"TransformerConfig.{name} must be True or False, got "
                                f"{getattr(self, name)!r}")
            self._set(name, bool(getattr(self, name)))
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"TransformerConfig.activation must be one of {ACTIVATIONS}, got "
                             f"{self.activation!r}")
        if self.positional not in POSITIONAL:
            raise ValueError(f"TransformerConfig.positional must be one of {POSITIONAL}, got "
                             f"{self.positional!r}")
        self._set("eps", v.real(self.eps, "TransformerConfig.eps", positive=True))
        if not self.eps < 1:
            raise ValueError(f"TransformerConfig.eps must be a small positive number (below 1), "
                             f"got {self.eps!r}")
        for name in ("pad_id", "bos_id", "eos_id"):
            self._set(name, v.integer(getattr(self, name), f"TransformerConfig.{name}",
                                      minimum=0))
            if getattr(self, name) >= self.tgt_vocab_size:
                raise ValueError(f"TransformerConfig.{name} must be a target token id, below "
                                 f"tgt_vocab_size={self.tgt_vocab_size}, got "
                                 f"{getattr(self, name)}")
        if self.pad_id >= self.src_vocab_size:
            raise ValueError(f"TransformerConfig.pad_id must be a source token id too, below "
                             f"src_vocab_size={self.src_vocab_size}, got {self.pad_id}")
        if len({self.pad_id, self.bos_id, self.eos_id}) != 3:
            raise ValueError(f"TransformerConfig.pad_id, bos_id and eos_id must be three "
                             f"different ids, got {self.pad_id}, {self.bos_id}, {self.eos_id}")
        try:
            dtype = np.dtype(self.dtype)
        except TypeError:
            dtype = None
        if dtype not in (np.float32, np.float64):
            raise TypeError(f"TransformerConfig.dtype must be np.float32 or np.float64, got "
                            f"{self.dtype!r}")
        self._set("dtype", dtype.type)

    def _set(self, name: str, value) -> None:
        object.__setattr__(self, name, value)  # the dataclass is frozen

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


# --------------------------------------------------------------------------------------------
# Parameter names: one flat dict, and templates that give the nested structures of blocks.py


def _attention_names(prefix: str, packed: bool, bias: bool) -> dict:
    keys = ["W_qkv"] if packed else ["W_q", "W_k", "W_v"]
    keys.append("W_o")
    if bias:
        keys += ["b_qkv"] if packed else ["b_q", "b_k", "b_v"]
        keys.append("b_o")
    return {k: f"{prefix}.{k}" for k in keys}


def _ff_names(prefix: str, bias: bool) -> dict:
    keys = ["W1", "b1", "W2", "b2"] if bias else ["W1", "W2"]
    return {k: f"{prefix}.{k}" for k in keys}


def _norm_names(prefix: str, bias: bool) -> dict:
    return {k: f"{prefix}.{k}" for k in (("gamma", "beta") if bias else ("gamma",))}


def _templates(c: TransformerConfig) -> tuple[dict, dict]:
    """Nested dicts of parameter *names*, shaped like the params of blocks.encoder_forward /
    blocks.decoder_forward."""
    enc = {"layers": [], "norm": _norm_names("encoder.norm", c.bias)}
    for i in range(c.num_encoder_layers):
        p = f"encoder.layers.{i}"
        enc["layers"].append({"self_attn": _attention_names(f"{p}.self_attn", True, c.bias),
                              "ff": _ff_names(f"{p}.ff", c.bias),
                              "norm1": _norm_names(f"{p}.norm1", c.bias),
                              "norm2": _norm_names(f"{p}.norm2", c.bias)})
    dec = {"layers": [], "norm": _norm_names("decoder.norm", c.bias)}
    for i in range(c.num_decoder_layers):
        p = f"decoder.layers.{i}"
        dec["layers"].append({"self_attn": _attention_names(f"{p}.self_attn", True, c.bias),
                              "cross_attn": _attention_names(f"{p}.cross_attn", False, c.bias),
                              "ff": _ff_names(f"{p}.ff", c.bias),
                              "norm1": _norm_names(f"{p}.norm1", c.bias),
                              "norm2": _norm_names(f"{p}.norm2", c.bias),
                              "norm3": _norm_names(f"{p}.norm3", c.bias)})
    return enc, dec


def parameter_names(config: TransformerConfig) -> list[str]:
    """The names of :attr:`Transformer.params`, in order, for a config."""
    names = ["src_embed.W", "tgt_embed.W"]
    if config.positional == "learned":
        names += ["src_pos.W", "tgt_pos.W"]
    flat: dict = {}
    for template in _templates(config):
        _flatten_grads(template, template, flat)
    names += list(flat)
    names += ["out_proj.W", "out_proj.b"] if config.bias else ["out_proj.W"]
    return names


def nest_params(config: TransformerConfig, flat: Mapping[str, np.ndarray]) -> tuple[dict, dict]:
    """The encoder's and the decoder's parameters (or gradients) as :mod:`transformer_lab.blocks`
    takes them, from a flat dict with the names of :func:`parameter_names`.

    ``flat["encoder.layers.0.ff.W1"]`` becomes ``encoder["layers"][0]["ff"]["W1"]`` (the same
    array object, no copy); ``"decoder.norm.gamma"`` becomes ``decoder["norm"]["gamma"]``.
    Embeddings and the output projection are not part of either.

    Returns:
        (encoder, decoder): ``{"layers": [layer dicts], "norm": {"gamma", "beta"}}`` each.
    """
    enc_t, dec_t = _templates(config)
    return _resolve(enc_t, flat), _resolve(dec_t, flat)


def flatten_params(config: TransformerConfig, encoder: dict, decoder: dict) -> dict:
    """The inverse of :func:`nest_params`: dotted name -> array (the same array objects)."""
    out: dict = {}
    for template, nested in zip(_templates(config), (encoder, decoder), strict=True):
        _flatten_grads(template, nested, out)
    return out


def _resolve(template, params):
    """The template with every name replaced by ``params[name]`` (the same array object)."""
    if isinstance(template, str):
        return params[template]
    if isinstance(template, dict):
        return {k: _resolve(t, params) for k, t in template.items()}
    return [_resolve(t, params) for t in template]


def _flatten_grads(template, grads, out: dict) -> None:
    """Walk the template and the nested grads of blocks.py together; fill ``out[name]``."""
    if isinstance(template, str):
        out[template] = grads
    elif isinstance(template, dict):
        for k, t in template.items():
            _flatten_grads(t, grads[k], out)
    else:
        for t, g in zip(template, grads, strict=True):
            _flatten_grads(t, g, out)


def _init_params(c: TransformerConfig, seed: int) -> dict[str, np.ndarray]:
    """Deterministic initialisation from ``seed``, in the spirit of PyTorch's.

    Attention: Xavier-uniform weights and zero biases (``nn.MultiheadAttention``); feed-forward
    and output projection: uniform(+-1/sqrt(fan_in)) (``nn.Linear``), output bias zero; layer
    norms: gamma = 1, beta = 0; token embeddings: normal with standard deviation
    1/sqrt(d_model) when they are scaled by sqrt(d_model) (so that the scaled embedding has unit
    variance), 1 otherwise (``nn.Embedding``); learned positions: normal(0, 1/sqrt(2)), the
    variance of a sinusoidal entry. The same seed gives the same values in float32 and float64.
    """
    rng = np.random.default_rng(seed)
    dt, d = c.dtype, c.d_model
    emb_std = 1.0 / math.sqrt(d) if c.scale_embeddings else 1.0
    params: dict[str, np.ndarray] = {
        "src_embed.W": (rng.standard_normal((c.src_vocab_size, d)) * emb_std).astype(dt),
        "tgt_embed.W": (rng.standard_normal((c.tgt_vocab_size, d)) * emb_std).astype(dt),
    }
    if c.positional == "learned":
        for side in ("src", "tgt"):
            params[f"{side}_pos.W"] = (rng.standard_normal((c.max_len, d))
                                       / math.sqrt(2.0)).astype(dt)
    nested_enc = {"layers": [B.encoder_layer_init(d, c.num_heads, c.d_ff, c.bias, rng, dt)
                             for _ in range(c.num_encoder_layers)],
                  "norm": B.layer_norm_init(d, c.bias, dt)}
    nested_dec = {"layers": [B.decoder_layer_init(d, c.num_heads, c.d_ff, c.bias, rng, dt)
                             for _ in range(c.num_decoder_layers)],
                  "norm": B.layer_norm_init(d, c.bias, dt)}
    enc_t, dec_t = _templates(c)
    _flatten_grads(enc_t, nested_enc, params)
    _flatten_grads(dec_t, nested_dec, params)
    a = 1.0 / math.sqrt(d)
    params["out_proj.W"] = rng.uniform(-a, a, size=(d, c.tgt_vocab_size)).astype(dt)
    if c.bias:
        params["out_proj.b"] = np.zeros(c.tgt_vocab_size, dt)
    return {k: np.ascontiguousarray(params[k]) for k in parameter_names(c)}


# --------------------------------------------------------------------------------------------
# Inputs, labels and decoded sequences: the checks and conventions shared with the PyTorch
# versions of the model (transformer_lab.torch_model), so that all of them accept and refuse
# exactly the same input with the same messages.

#: Label of a position that does not count in the loss (padding, or after the first EOS).
IGNORE_INDEX = -1


def length_limit(config: TransformerConfig) -> int | None:
    """Longest sequence the model reads: ``config.max_len``, or None without a positional table."""
    return None if config.positional == "none" else config.max_len


def check_ids(ids, name: str, vocab_size: int, max_len: int | None = None) -> np.ndarray:
    """A batch of token ids, or a clear error naming ``name``.

    Args:
        ids: (B, T) integer token ids: a NumPy array or a rectangular list of lists.
        name: the argument's name, for the messages.
        vocab_size: every id must be in [0, vocab_size).
        max_len: the longest T allowed (None: any).

    Returns:
        ids: (B, T) integer NumPy array, B >= 1, T >= 1.
    """
    if isinstance(ids, (list, tuple)):
        try:
            ids = np.asarray(ids)
        except ValueError:  # NumPy: "setting an array element with a sequence ..."
            raise ValueError(f"{name} must be a rectangular (batch, length) array of token ids; "
                             f"got a list of sequences of different lengths (pad them to one "
                             f"length first, e.g. with transformer_lab.data.pad)") from None
    if not isinstance(ids, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array of token ids, got {type(ids).__name__}")
    if ids.ndim != 2:
        raise ValueError(f"{name} must have 2 dimensions (batch, length), got shape {ids.shape}")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(f"{name} must hold at least one sequence of at least one token, "
                         f"got shape {ids.shape}")
    ids = v.token_ids(ids, name, vocab_size)
    if max_len is not None and ids.shape[1] > max_len:
        raise ValueError(f"{name} has {ids.shape[1]} positions but the positional encoding "
                         f"covers max_len={max_len} (TransformerConfig.max_len)")
    return ids


def check_padding_mask(mask, ids: np.ndarray, name: str, pad_id: int) -> np.ndarray:
    """A key padding mask (B, T) bool, True = padding, of the shape of ``ids``; None gives
    ``ids == pad_id``."""
    if mask is None:
        return ids == pad_id
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"{name} must be a NumPy bool array (True = padding), got "
                        f"{type(mask).__name__}")
    if mask.dtype != bool:
        raise TypeError(f"{name} must be a bool array (True = padding), got dtype {mask.dtype}")
    v.shape_is(mask, ids.shape, name, "the shape of the token ids")
    return mask


def _same_batch(src: np.ndarray, tgt: np.ndarray, tgt_name: str) -> None:
    if src.shape[0] != tgt.shape[0]:
        raise ValueError(f"src and {tgt_name} must have the same batch size, got "
                         f"{src.shape[0]} and {tgt.shape[0]}")


def check_inputs(config: TransformerConfig, src, tgt_in, src_key_padding_mask=None,
                 tgt_key_padding_mask=None) -> tuple[np.ndarray, ...]:
    """The arguments of a forward pass, checked: (src (B, S), tgt_in (B, T), src padding mask
    (B, S), tgt padding mask (B, T)), the masks defaulting to ``ids == pad_id``."""
    limit = length_limit(config)
    src = check_ids(src, "src", config.src_vocab_size, limit)
    tgt_in = check_ids(tgt_in, "tgt_in", config.tgt_vocab_size, limit)
    _same_batch(src, tgt_in, "tgt_in")
    src_kpm = check_padding_mask(src_key_padding_mask, src, "src_key_padding_mask",
                                 config.pad_id)
    tgt_kpm = check_padding_mask(tgt_key_padding_mask, tgt_in, "tgt_key_padding_mask",
                                 config.pad_id)
    return src, tgt_in, src_kpm, tgt_kpm


def check_target(config: TransformerConfig, tgt) -> np.ndarray:
    """A target batch (B, T): ``BOS y_1 ... y_n EOS`` then padding; the decoder reads T - 1."""
    tgt = check_ids(tgt, "tgt", config.tgt_vocab_size)
    if tgt.shape[1] < 2:
        raise ValueError(f"tgt must have at least 2 columns (BOS and one token to predict), "
                         f"got shape {tgt.shape}")
    limit = length_limit(config)
    if limit is not None and tgt.shape[1] - 1 > limit:
        raise ValueError(f"tgt has {tgt.shape[1]} positions: the decoder reads "
                         f"{tgt.shape[1] - 1} of them but the positional encoding covers "
                         f"max_len={limit} (TransformerConfig.max_len)")
    bad = np.flatnonzero(tgt[:, 0] != config.bos_id)
    if bad.size:
        raise ValueError(f"tgt must start every sequence with bos_id={config.bos_id}; "
                         f"sequence {bad[0]} starts with {tgt[bad[0], 0]}")
    return tgt


def label_mask(config: TransformerConfig, tgt: np.ndarray) -> np.ndarray:
    """(B, T-1) bool: which labels ``tgt[:, 1:]`` of a checked target batch count in the loss --
    those that are not padding and come no later than the first EOS of their sequence."""
    labels = tgt[:, 1:]
    is_eos = labels == config.eos_id
    after_eos = (np.cumsum(is_eos, axis=1) - is_eos) > 0
    return (labels != config.pad_id) & ~after_eos


def loss_labels(config: TransformerConfig, tgt: np.ndarray) -> np.ndarray:
    """(B, T-1) int labels of a checked target batch: ``tgt[:, 1:]``, with
    :data:`IGNORE_INDEX` where :func:`label_mask` is False."""
    keep = label_mask(config, tgt)
    if not keep.any():
        raise ValueError("tgt has no token to predict: every label is padding")
    return np.where(keep, tgt[:, 1:], IGNORE_INDEX)


def check_loss_inputs(config: TransformerConfig, src, tgt) -> tuple[np.ndarray, ...]:
    """The arguments of a loss, checked: (src (B, S), tgt (B, T), labels (B, T-1) as
    :func:`loss_labels` gives them)."""
    tgt = check_target(config, tgt)
    src = check_ids(src, "src", config.src_vocab_size, length_limit(config))
    _same_batch(src, tgt, "tgt")
    return src, tgt, loss_labels(config, tgt)


def check_decode_length(config: TransformerConfig, max_len) -> int:
    """The number of tokens greedy decoding may generate: ``max_len`` (default
    ``config.max_len``), at most the positional table's length."""
    if max_len is None:
        return config.max_len
    max_len = v.integer(max_len, "max_len", minimum=1)
    limit = length_limit(config)
    if limit is not None and max_len > limit:
        raise ValueError(f"max_len must be at most TransformerConfig.max_len={limit} (the "
                         f"positional encoding's length), got {max_len}")
    return max_len


def decoded_sequences(out: np.ndarray, eos_id: int, padded: bool):
    """What greedy decoding returns, from its buffer.

    Args:
        out: (B, 1 + steps) int64: BOS, then the generated tokens, padding after each EOS.
        eos_id: the end token.
        padded: return ``out`` itself.

    Returns:
        ``out``, or a list of B arrays: each sequence's tokens after BOS, up to and including
        its first EOS (all ``steps`` tokens when it has none).
    """
    if padded:
        return out
    ends = out[:, 1:] == eos_id
    lengths = np.where(ends.any(axis=1), ends.argmax(axis=1) + 1, out.shape[1] - 1)
    return [out[i, 1:1 + n].copy() for i, n in enumerate(lengths)]


# --------------------------------------------------------------------------------------------
# The model


class ModelCache(NamedTuple):
    src: L.EmbeddingCache
    tgt: L.EmbeddingCache
    encoder: B.StackCache
    decoder: B.StackCache
    out: L.LinearCache


class Transformer:
    """The encoder-decoder Transformer, as NumPy forward/backward passes.

    Args:
        config: a :class:`TransformerConfig`.
        seed: the initial parameters are a deterministic function of ``(config, seed)``
            (and do not depend on ``config.dtype`` beyond rounding).

    Attributes:
        config: the configuration.
        params: name -> array, every parameter (see the module docstring).
        pe: the sinusoidal table (max_len, d_model) added to the embeddings, or None.
    """

    def __init__(self, config: TransformerConfig, seed: int = 0):
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
        self._setup(config, _init_params(config, v.integer(seed, "seed", minimum=0)))

    def _setup(self, config: TransformerConfig, params: dict[str, np.ndarray]) -> None:
        self.config = config
        self.params: dict[str, np.ndarray] = params
        self._shapes = {k: p.shape for k, p in params.items()}
        self._enc_t, self._dec_t = _templates(config)
        self.pe = (L.positional_encoding(config.max_len, config.d_model, dtype=config.dtype)
                   if config.positional == "sinusoidal" else None)
        self._scale = config.dtype(math.sqrt(config.d_model)) if config.scale_embeddings else None

    # ---------------------------------------------------------------------------- parameters

    def num_parameters(self) -> int:
        """Number of trainable scalars (the sinusoidal table is not a parameter)."""
        return int(sum(p.size for p in self.params.values()))

    def set_params(self, new: Mapping[str, np.ndarray]) -> None:
        """Copy values into the parameter arrays, in place (any subset of the names).

        Every value is checked before anything is copied: a known name, the parameter's shape,
        real numbers (converted to the model's dtype), all finite.
        """
        checked = {name: self._checked_value(name, value) for name, value in new.items()}
        for name, value in checked.items():
            self.params[name][...] = value

    def _checked_value(self, name: str, value) -> np.ndarray:
        if name not in self.params:
            raise KeyError(f"set_params: unknown parameter {name!r}")
        value = np.asarray(value)
        if value.dtype == bool or not np.issubdtype(value.dtype, np.number) or \
                np.issubdtype(value.dtype, np.complexfloating):
            raise TypeError(f"new[{name!r}] must hold real numbers, got dtype {value.dtype}")
        v.shape_is(value, self._shapes[name], f"new[{name!r}]")
        if not np.all(np.isfinite(value)):
            raise ValueError(f"new[{name!r}] contains NaN or infinity")
        return value

    def astype(self, dtype) -> Transformer:
        """A copy of the model with its config and parameters in ``dtype`` (e.g. np.float64)."""
        config = dataclasses.replace(self.config, dtype=dtype)
        twin = type(self).__new__(type(self))
        twin._setup(config, {k: p.astype(config.dtype) for k, p in self.params.items()})
        return twin

    def copy(self) -> Transformer:
        """An independent copy (same config, parameters copied)."""
        return self.astype(self.config.dtype)

    def _nested(self):
        """The encoder and decoder parameters as blocks.py wants them, from self.params."""
        params = self.params
        dt = self.config.dtype
        for name, shape in self._shapes.items():
            p = params.get(name)
            if p is None:
                raise KeyError(f"model.params is missing {name!r}")
            if p.shape != shape or p.dtype != dt:
                raise ValueError(f"model.params[{name!r}] must be a {np.dtype(dt)} array of "
                                 f"shape {shape}, got {p.dtype} {p.shape}")
        return _resolve(self._enc_t, params), _resolve(self._dec_t, params)

    # ---------------------------------------------------------------------------- forward

    def _embed(self, ids: np.ndarray, side: str) -> tuple[np.ndarray, L.EmbeddingCache]:
        """(B, T) ids -> (B, T, E) scaled token embeddings + positions; the lookup's cache."""
        x, cache = L.embedding_forward(ids, self.params[f"{side}_embed.W"])  # x: a new array
        if self._scale is not None:
            x *= self._scale
        t = ids.shape[1]
        if self.pe is not None:
            x += self.pe[:t]
        elif self.config.positional == "learned":
            x += self.params[f"{side}_pos.W"][:t]
        return x, cache

    def _encode(self, src, src_kpm, enc):
        """memory (B, S, E), encoder stack cache, embedding cache."""
        c = self.config
        x, embed_cache = self._embed(src, "src")
        memory, cache = B.encoder_forward(x, enc, c.num_heads, None, src_kpm, c.norm_first,
                                          c.activation, c.eps)
        return memory, cache, embed_cache

    def _decode(self, tgt_in, memory, src_kpm, tgt_kpm, dec):
        """decoder output (B, T, E) before the projection, decoder cache, embedding cache."""
        c = self.config
        y, embed_cache = self._embed(tgt_in, "tgt")
        y, cache = B.decoder_forward(y, memory, dec, c.num_heads,
                                     att.causal_mask(tgt_in.shape[1]), None, tgt_kpm, src_kpm,
                                     c.norm_first, c.activation, c.eps)
        return y, cache, embed_cache

    def forward(self, src, tgt_in, src_key_padding_mask=None, tgt_key_padding_mask=None):
        """Logits for every position of the decoder input.

        Args:
            src: source token ids, (B, S) integers.
            tgt_in: decoder input token ids, (B, T) (a target batch without its last column).
            src_key_padding_mask: (B, S) bool, True = padding; default ``src == pad_id``.
            tgt_key_padding_mask: (B, T) bool; default ``tgt_in == pad_id``. (The decoder's
                self-attention is causal as well.)

        Returns:
            logits: (B, T, tgt_vocab_size) in the model's dtype; cache for :meth:`backward`.
        """
        src, tgt_in, src_kpm, tgt_kpm = check_inputs(self.config, src, tgt_in,
                                                     src_key_padding_mask, tgt_key_padding_mask)
        enc, dec = self._nested()
        memory, enc_cache, src_cache = self._encode(src, src_kpm, enc)
        y, dec_cache, tgt_cache = self._decode(tgt_in, memory, src_kpm, tgt_kpm, dec)
        logits, out_cache = L.linear_forward(y, self.params["out_proj.W"],
                                             self.params.get("out_proj.b"))
        return logits, ModelCache(src_cache, tgt_cache, enc_cache, dec_cache, out_cache)

    __call__ = forward

    # ---------------------------------------------------------------------------- backward

    def _embed_backward(self, dx: np.ndarray, cache: L.EmbeddingCache, side: str,
                        grads: dict) -> None:
        """dx (B, T, E), the gradient of :meth:`_embed`'s output -> the table's gradient (and
        the learned positions'), into ``grads``."""
        dW = L.embedding_backward(dx, cache)
        if self._scale is not None:
            dW *= self._scale  # V x E multiplications instead of B x T x E
        grads[f"{side}_embed.W"] = dW
        if self.config.positional == "learned":
            dpos = np.zeros(self._shapes[f"{side}_pos.W"], dtype=dx.dtype)
            dpos[:dx.shape[1]] = dx.sum(axis=0)
            grads[f"{side}_pos.W"] = dpos

    def backward(self, dlogits: np.ndarray, cache: ModelCache) -> dict[str, np.ndarray]:
        """Gradients of every parameter, given the gradient of the logits.

        Args:
            dlogits: (B, T, tgt_vocab_size), the gradient of a scalar loss w.r.t. the logits.
            cache: from :meth:`forward`.

        Returns:
            grads: name -> array, exactly the keys (and shapes) of ``model.params``.
        """
        v.cache_of(cache, "Transformer.backward", ModelCache)
        logits_shape = (*cache.tgt.ids.shape, self.config.tgt_vocab_size)
        dlogits = v.grad_like(dlogits, "dlogits", logits_shape, cache.out.W.dtype,
                              what="the logits of the forward pass")
        dy, dW, db = L.linear_backward(dlogits, cache.out)
        dtgt, dmemory, gdec = B.decoder_backward(dy, cache.decoder)
        dsrc, genc = B.encoder_backward(dmemory, cache.encoder)
        grads: dict[str, np.ndarray] = {}
        self._embed_backward(dsrc, cache.src, "src", grads)
        self._embed_backward(dtgt, cache.tgt, "tgt", grads)
        _flatten_grads(self._enc_t, genc, grads)
        _flatten_grads(self._dec_t, gdec, grads)
        grads["out_proj.W"] = dW
        if db is not None:
            grads["out_proj.b"] = db
        return {k: grads[k] for k in self.params}

    # ---------------------------------------------------------------------------- loss

    def loss_mask(self, tgt) -> np.ndarray:
        """(B, T-1) bool: which labels ``tgt[:, 1:]`` count in the loss.

        Args:
            tgt: (B, T) target batch, as for :meth:`loss`.

        A label counts when it is not padding and comes no later than the first EOS of its
        sequence.
        """
        return label_mask(self.config, check_target(self.config, tgt))

    def loss(self, src, tgt, compute_grads: bool = True):
        """Mean cross-entropy of the next-token predictions, and its gradients.

        Args:
            src: source token ids (B, S), padded with ``pad_id``.
            tgt: target token ids (B, T): ``BOS y_1 ... y_n EOS`` then padding. The decoder
                reads ``tgt[:, :-1]``; the labels are ``tgt[:, 1:]``, counted up to and
                including each sequence's first EOS (see :meth:`loss_mask`).
            compute_grads: False to skip the backward pass (evaluation); True or False.

        Returns:
            loss: a Python float, the mean over the counted labels;
            grads: name -> array with the keys of ``params`` (None without compute_grads).
        """
        if not isinstance(compute_grads, (bool, np.bool_)):
            raise TypeError(f"compute_grads must be True or False, got {compute_grads!r}")
        src, tgt, labels = check_loss_inputs(self.config, src, tgt)
        logits, cache = self.forward(src, tgt[:, :-1])
        loss, ce_cache = L.cross_entropy_forward(logits, labels, ignore_index=IGNORE_INDEX)
        if not compute_grads:
            return loss, None
        return loss, self.backward(L.cross_entropy_backward(1.0, ce_cache), cache)

    # ---------------------------------------------------------------------------- inference

    def greedy_decode(self, src, max_len: int | None = None, padded: bool = False):
        """Greedy decoding of a batch: start from BOS, append the most likely token, repeat.

        All sequences of the batch are decoded together, step by step; a sequence stops at its
        first EOS (later steps give it padding), and decoding stops when every sequence has
        stopped or after ``max_len`` tokens. The encoder runs once; the decoder is recomputed
        over the prefix at every step.

        Args:
            src: source token ids (B, S).
            max_len: most tokens to generate per sequence, EOS included (default and maximum:
                ``config.max_len``).
            padded: return one (B, 1 + longest) array in the target format (BOS, tokens, EOS,
                padding) instead of a list.

        Returns:
            a list of B int64 arrays, the generated tokens of each sequence (without BOS,
            ending with EOS unless the sequence hit ``max_len``); or the padded array.
        """
        c = self.config
        src = check_ids(src, "src", c.src_vocab_size, length_limit(c))
        max_len = check_decode_length(c, max_len)
        enc, dec = self._nested()
        src_kpm = src == c.pad_id
        memory, _, _ = self._encode(src, src_kpm, enc)
        b = src.shape[0]
        out = np.full((b, max_len + 1), c.pad_id, dtype=np.int64)
        out[:, 0] = c.bos_id
        done = np.zeros(b, dtype=bool)
        W, bias = self.params["out_proj.W"], self.params.get("out_proj.b")
        steps = 0
        for t in range(max_len):
            prefix = out[:, :t + 1]
            y, _, _ = self._decode(prefix, memory, src_kpm, prefix == c.pad_id, dec)
            logits = y[:, -1] @ W
            if bias is not None:
                logits += bias
            nxt = np.where(done, c.pad_id, logits.argmax(axis=-1))
            out[:, t + 1] = nxt
            done |= nxt == c.eos_id
            steps = t + 1
            if done.all():
                break
        return decoded_sequences(out[:, :steps + 1], c.eos_id, padded)

    def attention_maps(self, src, tgt_in, src_key_padding_mask=None,
                       tgt_key_padding_mask=None) -> dict[str, np.ndarray]:
        """The attention weights of every attention layer, per head, for plotting.

        Returns:
            ``{"encoder.layers.i.self_attn": (B, H, S, S), "decoder.layers.i.self_attn":
            (B, H, T, T), "decoder.layers.i.cross_attn": (B, H, T, S)}`` (rows: queries).
        """
        _, cache = self.forward(src, tgt_in, src_key_padding_mask, tgt_key_padding_mask)
        maps = {}
        for i, layer in enumerate(cache.encoder.layers):
            (self_attn,) = _attention_caches(layer)
            maps[f"encoder.layers.{i}.self_attn"] = self_attn.attention.weights
        for i, layer in enumerate(cache.decoder.layers):
            self_attn, cross_attn = _attention_caches(layer)
            maps[f"decoder.layers.{i}.self_attn"] = self_attn.attention.weights
            maps[f"decoder.layers.{i}.cross_attn"] = cross_attn.attention.weights
        return maps

    # ---------------------------------------------------------------------------- checkpoints

    def save(self, path, metadata: Mapping | None = None) -> str:
        """Save the configuration and every parameter to a NumPy ``.npz`` file.

        The file holds one array per parameter (``params/<name>``) and a JSON header (format
        version, the config, the parameter names, and ``metadata`` -- anything JSON can hold,
        e.g. the training step or the task). ``.npz`` is appended to ``path`` if missing.

        Returns:
            The path written.
        """
        path = _npz_path(path)
        header = {"format": CHECKPOINT_FORMAT, "config": config_to_dict(self.config),
                  "names": list(self.params), "metadata": dict(metadata or {})}
        try:
            header_json = json.dumps(header)
        except TypeError as e:
            raise TypeError(f"metadata must hold only what JSON can store: {e}") from None
        arrays = {f"params/{name}": p for name, p in self.params.items()}
        with open(path, "wb") as f:
            np.savez(f, __header__=np.array(header_json), **arrays)
        return path

    @classmethod
    def load(cls, path) -> Transformer:
        """A model with the configuration and parameters stored by :meth:`save`."""
        header, _ = _read_checkpoint(path)
        model = cls(_stored_config(path, header), seed=0)
        model.load_params(path)
        return model

    def load_params(self, path) -> dict:
        """Copy the parameters stored by :meth:`save` into this model, in place.

        Refuses (:class:`CheckpointError`, nothing copied) a file that does not fit this model:
        other parameter names, shapes or dtypes (the message names the tensor and both shapes),
        values that are not finite, or a configuration that differs in any other field
        (``norm_first``, ``activation``, ``positional``, ``eps``, ``max_len``, the special
        token ids, ...): such parameters would load but compute a different function.

        Returns:
            The metadata stored with the parameters.
        """
        header, arrays = _read_checkpoint(path)
        stored = _stored_config(path, header)
        diffs = _config_differences(stored, self.config)
        self._check_checkpoint_arrays(path, arrays, diffs)
        diffs.pop("dtype", None)  # a dtype difference is refused above, tensor by tensor
        if diffs:
            raise CheckpointError(
                f"{path} does not fit this model: the checkpoint's config differs in "
                f"{', '.join(diffs.values())}; its parameters have the right names and shapes "
                f"but would compute a different function here (load it with "
                f"Transformer.load(path), which builds the model from the stored config)")
        for name, p in self.params.items():
            p[...] = arrays[name]
        return header["metadata"]

    def _check_checkpoint_arrays(self, path, arrays: Mapping[str, np.ndarray],
                                 diffs: Mapping[str, str]) -> None:
        """Names, shapes, dtypes and finiteness of the stored parameters, or CheckpointError."""
        missing = [n for n in self.params if n not in arrays]
        extra = [n for n in arrays if n not in self.params]
        hint = f"; the checkpoint's config differs in {', '.join(diffs.values())}" if diffs \
            else ""
        if missing or extra:
            raise CheckpointError(
                f"{path} does not fit this model: missing parameters {missing[:5]}"
                f"{' ...' if len(missing) > 5 else ''}, unexpected parameters {extra[:5]}"
                f"{' ...' if len(extra) > 5 else ''}{hint}")
        for name, p in self.params.items():
            stored = arrays[name]
            if stored.shape != p.shape:
                raise CheckpointError(
                    f"{path} does not fit this model: parameter {name!r} has shape "
                    f"{stored.shape} in the checkpoint but {p.shape} in the model{hint}")
            if stored.dtype != p.dtype:
                raise CheckpointError(
                    f"{path} does not fit this model: parameter {name!r} is {stored.dtype} in "
                    f"the checkpoint but {p.dtype} in the model (convert the model with "
                    f"model.astype(np.{stored.dtype}) first, or load with Transformer.load)")
            if not np.all(np.isfinite(stored)):
                raise CheckpointError(f"{path}: parameter {name!r} contains NaN or infinity")

    def __repr__(self) -> str:
        c = self.config
        return (f"Transformer(d_model={c.d_model}, heads={c.num_heads}, layers="
                f"{c.num_encoder_layers}+{c.num_decoder_layers}, d_ff={c.d_ff}, vocab="
                f"{c.src_vocab_size}->{c.tgt_vocab_size}, "
                f"{'pre' if c.norm_first else 'post'}-norm, {np.dtype(c.dtype).name}, "
                f"{self.num_parameters():,} parameters)")


# --------------------------------------------------------------------------------------------
# Checkpoints: a .npz with one array per parameter and a JSON header

#: Version of the checkpoint layout written by :meth:`Transformer.save`.
CHECKPOINT_FORMAT = 1


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read, or does not fit the model it is loaded into."""


def config_to_dict(config: TransformerConfig) -> dict:
    """The config as a JSON-ready dict (the dtype by name: "float32" / "float64")."""
    d = dataclasses.asdict(config)
    d["dtype"] = np.dtype(config.dtype).name
    return d


def config_from_dict(d: Mapping) -> TransformerConfig:
    """Inverse of :func:`config_to_dict`."""
    d = dict(d)
    d["dtype"] = np.dtype(d.get("dtype", "float32")).type
    return TransformerConfig(**d)


def _npz_path(path) -> str:
    path = str(path)
    return path if path.endswith(".npz") else path + ".npz"


def _read_checkpoint(path) -> tuple[dict, dict[str, np.ndarray]]:
    """(header, name -> array) of a checkpoint file, or a CheckpointError saying what is wrong.

    The header is checked: a dict with this format version, a "config" dict, "names" (a list
    of strings, exactly the stored parameters) and a "metadata" dict.
    """
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e}") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise CheckpointError(f"{path} is not a transformer_lab checkpoint: it holds a single "
                              f"array (a .npy file), not a .npz archive (save one with "
                              f"Transformer.save)")
    try:
        with loaded as f:
            files = set(f.files)
            if "__header__" not in files:
                raise CheckpointError(f"{path} is not a transformer_lab checkpoint (no header; "
                                      f"save one with Transformer.save)")
            header = json.loads(str(f["__header__"]))
            arrays = {k[len("params/"):]: f[k] for k in files if k.startswith("params/")}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"cannot read checkpoint {path}: {e}") from None
    _check_header(path, header, arrays)
    return header, {name: arrays[name] for name in header["names"]}  # in the saved order


def _check_header(path, header, arrays: Mapping[str, np.ndarray]) -> None:
    if not isinstance(header, dict) or header.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path}: unknown checkpoint format "
                              f"{header.get('format') if isinstance(header, dict) else header!r}"
                              f" (this version reads format {CHECKPOINT_FORMAT})")
    for key, kind in (("config", dict), ("names", list), ("metadata", dict)):
        if not isinstance(header.get(key), kind):
            raise CheckpointError(f"{path}: damaged header: {key!r} must be a {kind.__name__}, "
                                  f"got {header.get(key)!r}")
    names = header["names"]
    if not all(isinstance(n, str) for n in names) or sorted(names) != sorted(arrays):
        raise CheckpointError(f"{path}: damaged checkpoint: the header lists the parameters "
                              f"{names!r} but the file holds {sorted(arrays)}")


def _stored_config(path, header: Mapping) -> TransformerConfig:
    try:
        return config_from_dict(header["config"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: the stored configuration is not valid: {e}") from None


def _config_differences(stored: TransformerConfig, config: TransformerConfig) -> dict[str, str]:
    """Field -> 'field=stored (model: ours)' for every field in which two configs differ."""
    theirs, ours = config_to_dict(stored), config_to_dict(config)
    return {k: f"{k}={theirs[k]!r} (model: {ours[k]!r})" for k in ours if theirs[k] != ours[k]}


def _attention_caches(cache) -> list:
    """The multi-head attention caches inside one layer's cache, in order of computation."""
    found = []

    def walk(node):
        if isinstance(node, att.MHACache):
            found.append(node)
        elif isinstance(node, (tuple, list)):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            for item in node.values():
                walk(item)

    walk(cache)
    return found
