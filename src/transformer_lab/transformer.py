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
names, shapes or dtypes differ (:class:`CheckpointError`, naming the tensor and both shapes).

Everything is vectorised over the batch, the heads and the positions. float32 by default;
``TransformerConfig(dtype=np.float64)`` (or :meth:`Transformer.astype`) for gradient checks.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from transformer_lab import _validate as v
from transformer_lab import attention as att
from transformer_lab import blocks as B
from transformer_lab import layers as L

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
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "num_heads",
                     "num_encoder_layers", "num_decoder_layers", "d_ff", "max_len"):
            _config_int(getattr(self, name), name, minimum=1)
        if self.d_model % self.num_heads:
            raise ValueError(f"TransformerConfig.d_model must be divisible by num_heads, got "
                             f"d_model={self.d_model} and num_heads={self.num_heads}")
        for name in ("norm_first", "scale_embeddings", "bias"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise TypeError(f"TransformerConfig.{name} must be True or False, got "
                                f"{getattr(self, name)!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"TransformerConfig.activation must be one of {ACTIVATIONS}, got "
                             f"{self.activation!r}")
        if self.positional not in POSITIONAL:
            raise ValueError(f"TransformerConfig.positional must be one of {POSITIONAL}, got "
                             f"{self.positional!r}")
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)) or \
                not 0 < self.eps < 1:
            raise ValueError(f"TransformerConfig.eps must be a small positive number, got "
                             f"{self.eps!r}")
        for name in ("pad_id", "bos_id", "eos_id"):
            _config_int(getattr(self, name), name, minimum=0)
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
        object.__setattr__(self, "dtype", dtype.type)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


def _config_int(value, name: str, minimum: int) -> None:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or \
            value < minimum:
        raise ValueError(f"TransformerConfig.{name} must be an integer >= {minimum}, got "
                         f"{value!r}")


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
# The model


class EmbedCache(NamedTuple):
    ids: np.ndarray  # (B, T)


class ModelCache(NamedTuple):
    src: EmbedCache
    tgt: EmbedCache
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
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self._setup(config, _init_params(config, int(seed)))

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
        """Copy values into the parameter arrays, in place (any subset of the names)."""
        for name, value in new.items():
            if name not in self.params:
                raise KeyError(f"set_params: unknown parameter {name!r}")
            value = np.asarray(value)
            v.shape_is(value, self._shapes[name], f"new[{name!r}]")
            self.params[name][...] = value

    def astype(self, dtype) -> Transformer:
        """A copy of the model with its config and parameters in ``dtype`` (e.g. np.float64)."""
        config = dataclasses.replace(self.config, dtype=dtype)
        twin = Transformer.__new__(Transformer)
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

    # ---------------------------------------------------------------------------- inputs

    def _ids(self, ids, name: str, vocab: int, check_length: bool = True) -> np.ndarray:
        if isinstance(ids, (list, tuple)):
            ids = np.asarray(ids)
        if not isinstance(ids, np.ndarray):
            raise TypeError(f"{name} must be a NumPy array of token ids, got "
                            f"{type(ids).__name__}")
        if ids.ndim != 2:
            raise ValueError(f"{name} must have 2 dimensions (batch, length), got shape "
                             f"{ids.shape}")
        if ids.shape[0] == 0 or ids.shape[1] == 0:
            raise ValueError(f"{name} must hold at least one sequence of at least one token, "
                             f"got shape {ids.shape}")
        ids = v.token_ids(ids, name, vocab)
        if check_length and self.config.positional != "none" and \
                ids.shape[1] > self.config.max_len:
            raise ValueError(f"{name} has {ids.shape[1]} positions but the positional encoding "
                             f"covers max_len={self.config.max_len} (TransformerConfig.max_len)")
        return ids

    def _padding(self, mask, ids: np.ndarray, name: str) -> np.ndarray:
        if mask is None:
            return ids == self.config.pad_id
        mask = np.asarray(mask)
        if mask.dtype != bool:
            raise TypeError(f"{name} must be a bool array (True = padding), got dtype "
                            f"{mask.dtype}")
        v.shape_is(mask, ids.shape, name, "the shape of the token ids")
        return mask

    @staticmethod
    def _same_batch(src, tgt, tgt_name):
        if src.shape[0] != tgt.shape[0]:
            raise ValueError(f"src and {tgt_name} must have the same batch size, got "
                             f"{src.shape[0]} and {tgt.shape[0]}")

    # ---------------------------------------------------------------------------- forward

    def _embed(self, ids: np.ndarray, side: str) -> np.ndarray:
        x = self.params[f"{side}_embed.W"][ids]  # (B, T, E), a new array
        if self._scale is not None:
            x *= self._scale
        t = ids.shape[1]
        if self.pe is not None:
            x += self.pe[:t]
        elif self.config.positional == "learned":
            x += self.params[f"{side}_pos.W"][:t]
        return x

    def _encode(self, src, src_kpm, enc):
        c = self.config
        x = self._embed(src, "src")
        return B.encoder_forward(x, enc, c.num_heads, None, src_kpm, c.norm_first,
                                 c.activation, c.eps)

    def _decode(self, tgt_in, memory, src_kpm, tgt_kpm, dec):
        c = self.config
        y = self._embed(tgt_in, "tgt")
        return B.decoder_forward(y, memory, dec, c.num_heads, att.causal_mask(tgt_in.shape[1]),
                                 None, tgt_kpm, src_kpm, c.norm_first, c.activation, c.eps)

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
        src = self._ids(src, "src", self.config.src_vocab_size)
        tgt_in = self._ids(tgt_in, "tgt_in", self.config.tgt_vocab_size)
        self._same_batch(src, tgt_in, "tgt_in")
        src_kpm = self._padding(src_key_padding_mask, src, "src_key_padding_mask")
        tgt_kpm = self._padding(tgt_key_padding_mask, tgt_in, "tgt_key_padding_mask")
        enc, dec = self._nested()
        memory, enc_cache = self._encode(src, src_kpm, enc)
        y, dec_cache = self._decode(tgt_in, memory, src_kpm, tgt_kpm, dec)
        logits, out_cache = L.linear_forward(y, self.params["out_proj.W"],
                                             self.params.get("out_proj.b"))
        return logits, ModelCache(EmbedCache(src), EmbedCache(tgt_in), enc_cache, dec_cache,
                                  out_cache)

    __call__ = forward

    # ---------------------------------------------------------------------------- backward

    def _embed_backward(self, dx: np.ndarray, ids: np.ndarray, side: str, grads: dict) -> None:
        table = self.params[f"{side}_embed.W"]
        d = dx.shape[-1]
        flat_ids = ids.reshape(-1)
        order = np.argsort(flat_ids, kind="stable")
        sorted_ids = flat_ids[order]
        present, starts = np.unique(sorted_ids, return_index=True)
        dW = np.zeros(table.shape, dtype=dx.dtype)
        dW[present] = np.add.reduceat(dx.reshape(-1, d)[order], starts, axis=0)
        if self._scale is not None:
            dW *= self._scale
        grads[f"{side}_embed.W"] = dW
        if self.config.positional == "learned":
            dpos = np.zeros(self._shapes[f"{side}_pos.W"], dtype=dx.dtype)
            dpos[:ids.shape[1]] = dx.sum(axis=0)
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
        dlogits = v.float_array(dlogits, "dlogits", ndim=3)
        dy, dW, db = L.linear_backward(dlogits, cache.out)
        dtgt, dmemory, gdec = B.decoder_backward(dy, cache.decoder)
        dsrc, genc = B.encoder_backward(dmemory, cache.encoder)
        grads: dict[str, np.ndarray] = {}
        self._embed_backward(dsrc, cache.src.ids, "src", grads)
        self._embed_backward(dtgt, cache.tgt.ids, "tgt", grads)
        _flatten_grads(self._enc_t, genc, grads)
        _flatten_grads(self._dec_t, gdec, grads)
        grads["out_proj.W"] = dW
        if db is not None:
            grads["out_proj.b"] = db
        return {k: grads[k] for k in self.params}

    # ---------------------------------------------------------------------------- loss

    def _check_tgt(self, tgt) -> np.ndarray:
        tgt = self._ids(tgt, "tgt", self.config.tgt_vocab_size, check_length=False)
        if tgt.shape[1] < 2:
            raise ValueError(f"tgt must have at least 2 columns (BOS and one token to "
                             f"predict), got shape {tgt.shape}")
        if tgt.shape[1] - 1 > self.config.max_len and self.config.positional != "none":
            raise ValueError(f"tgt has {tgt.shape[1]} positions: the decoder reads "
                             f"{tgt.shape[1] - 1} of them but the positional encoding covers "
                             f"max_len={self.config.max_len} (TransformerConfig.max_len)")
        bad = np.flatnonzero(tgt[:, 0] != self.config.bos_id)
        if bad.size:
            raise ValueError(f"tgt must start every sequence with bos_id={self.config.bos_id}; "
                             f"sequence {bad[0]} starts with {tgt[bad[0], 0]}")
        return tgt

    def loss_mask(self, tgt) -> np.ndarray:
        """(B, T-1) bool: which labels ``tgt[:, 1:]`` count in the loss.

        A label counts when it is not padding and comes no later than the first EOS of its
        sequence.
        """
        labels = np.asarray(tgt)[:, 1:]
        is_eos = labels == self.config.eos_id
        after_eos = (np.cumsum(is_eos, axis=1) - is_eos) > 0
        return (labels != self.config.pad_id) & ~after_eos

    def loss(self, src, tgt, compute_grads: bool = True):
        """Mean cross-entropy of the next-token predictions, and its gradients.

        Args:
            src: source token ids (B, S), padded with ``pad_id``.
            tgt: target token ids (B, T): ``BOS y_1 ... y_n EOS`` then padding. The decoder
                reads ``tgt[:, :-1]``; the labels are ``tgt[:, 1:]``, counted up to and
                including each sequence's first EOS (see :meth:`loss_mask`).
            compute_grads: False to skip the backward pass (evaluation).

        Returns:
            loss: a Python float, the mean over the counted labels;
            grads: name -> array with the keys of ``params`` (None without compute_grads).
        """
        tgt = self._check_tgt(tgt)
        src = self._ids(src, "src", self.config.src_vocab_size)
        self._same_batch(src, tgt, "tgt")
        keep = self.loss_mask(tgt)
        if not keep.any():
            raise ValueError("tgt has no token to predict: every label is padding")
        labels = np.where(keep, tgt[:, 1:], -1)
        logits, cache = self.forward(src, tgt[:, :-1])
        loss, ce_cache = L.cross_entropy_forward(logits, labels, ignore_index=-1)
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
        src = self._ids(src, "src", c.src_vocab_size)
        if max_len is None:
            max_len = c.max_len
        max_len = v.positive_int(max_len, "max_len")
        if max_len > c.max_len and c.positional != "none":
            raise ValueError(f"max_len must be at most TransformerConfig.max_len="
                             f"{c.max_len} (the positional encoding's length), got {max_len}")
        enc, dec = self._nested()
        src_kpm = src == c.pad_id
        memory, _ = self._encode(src, src_kpm, enc)
        b = src.shape[0]
        out = np.full((b, max_len + 1), c.pad_id, dtype=np.int64)
        out[:, 0] = c.bos_id
        done = np.zeros(b, dtype=bool)
        W, bias = self.params["out_proj.W"], self.params.get("out_proj.b")
        steps = 0
        for t in range(max_len):
            prefix = out[:, :t + 1]
            y, _ = self._decode(prefix, memory, src_kpm, prefix == c.pad_id, dec)
            logits = y[:, -1] @ W
            if bias is not None:
                logits += bias
            nxt = np.where(done, c.pad_id, logits.argmax(axis=-1))
            out[:, t + 1] = nxt
            done |= nxt == c.eos_id
            steps = t + 1
            if done.all():
                break
        out = out[:, :steps + 1]
        if padded:
            return out
        lengths = np.where(done, np.argmax(out[:, 1:] == c.eos_id, axis=1) + 1, steps)
        return [out[i, 1:1 + lengths[i]].copy() for i in range(b)]

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
        try:
            config = config_from_dict(header["config"])
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{path}: the stored configuration is not valid: {e}") from None
        model = cls(config, seed=0)
        model.load_params(path)
        return model

    def load_params(self, path) -> dict:
        """Copy the parameters stored by :meth:`save` into this model, in place.

        Refuses (:class:`CheckpointError`, nothing copied) a file whose parameter names, shapes
        or dtypes differ from this model's, naming the tensor and both shapes.

        Returns:
            The metadata stored with the parameters.
        """
        header, arrays = _read_checkpoint(path)
        names = header.get("names", [])
        missing = [n for n in self.params if n not in arrays]
        extra = [n for n in names if n not in self.params]
        hint = _config_hint(header.get("config"), self.config)
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
        for name, p in self.params.items():
            p[...] = arrays[name]
        return header.get("metadata", {})

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
    """(header, name -> array) of a checkpoint file, or a CheckpointError saying what is wrong."""
    try:
        with np.load(path, allow_pickle=False) as f:
            files = set(f.files)
            if "__header__" not in files:
                raise CheckpointError(f"{path} is not a transformer_lab checkpoint (no header; "
                                      f"save one with Transformer.save)")
            header = json.loads(str(f["__header__"]))
            arrays = {k[len("params/"):]: f[k] for k in files if k.startswith("params/")}
    except (OSError, ValueError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"cannot read checkpoint {path}: {e}") from None
    if not isinstance(header, dict) or header.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path}: unknown checkpoint format "
                              f"{header.get('format') if isinstance(header, dict) else header!r}"
                              f" (this version reads format {CHECKPOINT_FORMAT})")
    return header, arrays


def _config_hint(stored, config: TransformerConfig) -> str:
    """'; the checkpoint's config differs in d_ff=128 (model: 256), ...' or ''."""
    if not isinstance(stored, Mapping):
        return ""
    ours = config_to_dict(config)
    diffs = [f"{k}={stored[k]!r} (model: {ours[k]!r})" for k in ours
             if k in stored and stored[k] != ours[k]]
    return f"; the checkpoint's config differs in {', '.join(diffs)}" if diffs else ""


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


# --------------------------------------------------------------------------------------------
# Comparing two models' parameters or gradients, tensor by tensor


def check_parity(ours: Mapping, reference: Mapping, *, tol: float,
                 zero_atol: float | None = None, verbose: bool = True) -> dict[str, float]:
    """Compare two dicts of arrays with the same keys, one relative error per tensor.

    Prints a table like :func:`transformer_lab.gradient_check.check_gradients` (name, shape,
    relative error, ok) and raises ``AssertionError`` naming every tensor above ``tol``. A
    tensor that is zero up to rounding in both (every entry at most ``zero_atol``; default 1e-12
    in float64, 1e-6 in float32) passes as "ok (zero gradient)": e.g. the gradient of an
    attention key bias, which the softmax ignores -- the relative error of two rounding noises
    means nothing.

    Args:
        ours, reference: name -> array (NumPy arrays or torch tensors), the same names/shapes.
        tol: largest relative error that passes (1e-10 for float64, 1e-5 for float32).
        zero_atol: see above.
        verbose: print the table.

    Returns:
        name -> relative error.
    """
    from transformer_lab.gradient_check import _to_numpy, format_check_table, rel_error

    if set(ours) != set(reference):
        raise ValueError(f"ours and reference must have the same names; only in ours: "
                         f"{sorted(set(ours) - set(reference))}, only in reference: "
                         f"{sorted(set(reference) - set(ours))}")
    errors, zero, shapes = {}, set(), {}
    for name in ours:
        a, b = _to_numpy(ours[name], name), _to_numpy(reference[name], name)
        if a.shape != b.shape:
            raise ValueError(f"{name}: ours has shape {a.shape}, reference {b.shape}")
        shapes[name] = a.shape
        atol = zero_atol
        if atol is None:
            atol = 1e-12 if a.dtype == np.float64 and b.dtype == np.float64 else 1e-6
        if a.size == 0 or max(np.abs(a).max(), np.abs(b).max()) <= atol:
            errors[name] = 0.0
            zero.add(name)
        else:
            errors[name] = rel_error(a, b)
    if verbose:
        print(format_check_table(errors, shapes, tol, zero))
    failed = {n: e for n, e in errors.items() if not e <= tol}
    if failed:
        raise AssertionError(f"{len(failed)} of {len(errors)} tensors differ by more than "
                             f"tol={tol:g}: " + ", ".join(f"{n} ({e:.2e})"
                                                        for n, e in failed.items()))
    return errors
