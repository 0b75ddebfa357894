"""The models' configurations: :class:`TransformerConfig` (the encoder-decoder) and
:class:`GPTConfig` (the GPT), frozen dataclasses checked when made, the GPT's parameters a config
asks for (:func:`parameter_shapes`), and their JSON form (:func:`config_to_dict`,
:func:`config_from_dict`) that checkpoints store.

They live apart from the models so that the models' helpers (input checks, checkpoints) can
import them without importing the models.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from transformer_lab import _validate as v

#: The feed-forward networks' activations, by name: the keys of ``core.layers.ACTIVATIONS``
#: (not imported from there: the configs, and the checkpoints and checks that read them, must
#: not import a student's core; ``tests/test_layout.py`` checks that the two agree).
ACTIVATIONS = ("relu", "gelu", "gelu_tanh")
POSITIONAL = ("sinusoidal", "learned", "none")  # the encoder-decoder's


class _ModelConfig:
    """What both configs have: a setter for their checks, and the head width."""

    def _set(self, name: str, value) -> None:
        object.__setattr__(self, name, value)  # the dataclass is frozen

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


@dataclasses.dataclass(frozen=True)
class TransformerConfig(_ModelConfig):
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
            self._set(name, v.boolean(getattr(self, name), f"TransformerConfig.{name}"))
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
        self._set("dtype", v.float_dtype(self.dtype, "TransformerConfig.dtype").type)


NORMS = ("layer", "rms")
MLPS = (*ACTIVATIONS, "swiglu")  # the GPT's feed-forward networks
GPT_POSITIONAL = ("learned", "sinusoidal", "rope", "none")

@dataclasses.dataclass(frozen=True)
class GPTConfig(_ModelConfig):
    """Hyperparameters of :class:`GPT`, checked when the config is made.

    Attributes:
        vocab_size: number of token ids V.
        d_model: width E, divisible by ``num_heads``.
        num_heads: query heads H.
        num_kv_heads: key/value heads Hkv, dividing H (None: H, ordinary multi-head attention;
            fewer: grouped-query attention; 1: multi-query attention).
        num_layers: blocks N.
        d_ff: hidden width F of the MLP (None: 4 E, ``round(8 E / 3)`` rounded up to
            a multiple of 8 for SwiGLU, which has three matrices instead of two).
        max_len: longest sequence (prompt + generated tokens) the model reads.
        norm: "layer" (layer norm) or "rms" (RMSNorm).
        mlp: "gelu_tanh" (the feed-forward network with GPT-2's tanh approximation of GELU,
            the default: a third of the time of the exact "gelu" here), "gelu", "relu", or
            "swiglu".
        positional: "learned" (a trained table, GPT-2), "sinusoidal" (the 2017 table), "rope"
            (rotary embeddings of the queries and keys) or "none".
        bias: biases in the linear maps and layer norms.
        tie_embeddings: the output projection is the token embedding table (True, the default:
            GPT-2's) or a table of its own, the parameter ``lm_head.W`` (V, E) (False: untied,
            as most LLaMA-architecture models).
        dropout: the probability with which training drops each entry of every sublayer's
            output, before the residual sum (notebook 07 §4; GPT-2 used 0.1); 0 (default): no
            dropout. Only training with a generator drops anything (``GPT.loss(ids, rng=...)``):
            evaluation and generation never do.
        eps: of every normalisation.
        rope_base: the base of RoPE's frequencies, ``omega_i = base^(-2i / Dh)``.
        attention_block_size: None (default): attention forms the (T, T) scores; an int: the
            tiled attention of notebook 16 (``core.flash``) with blocks of that many positions,
            for the forward and backward passes of training (decoding with the KV cache reads
            one query at a time and is unchanged). The same results, to rounding.
        dtype: np.float32 (default) or np.float64 (gradient checks).
    """

    vocab_size: int
    d_model: int = 128
    num_heads: int = 4
    num_kv_heads: int | None = None
    num_layers: int = 4
    d_ff: int | None = None
    max_len: int = 256
    norm: str = "layer"
    mlp: str = "gelu_tanh"
    positional: str = "learned"
    bias: bool = True
    tie_embeddings: bool = True
    eps: float = 1e-5
    rope_base: float = 10000.0
    dropout: float = 0.0
    attention_block_size: int | None = None
    dtype: type = np.float32

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "num_heads", "num_layers", "max_len"):
            self._set(name, v.integer(getattr(self, name), f"GPTConfig.{name}", minimum=1))
        kv = self.num_heads if self.num_kv_heads is None else self.num_kv_heads
        self._set("num_kv_heads", v.integer(kv, "GPTConfig.num_kv_heads", minimum=1))
        if self.d_model % self.num_heads:
            raise ValueError(f"GPTConfig.d_model must be divisible by num_heads, got d_model="
                             f"{self.d_model} and num_heads={self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"GPTConfig.num_kv_heads must divide num_heads, got num_kv_heads="
                             f"{self.num_kv_heads} and num_heads={self.num_heads}")
        for name, choices in (("norm", NORMS), ("mlp", MLPS), ("positional", GPT_POSITIONAL)):
            if getattr(self, name) not in choices:
                raise ValueError(f"GPTConfig.{name} must be one of {choices}, got "
                                 f"{getattr(self, name)!r}")
        if self.positional == "rope" and self.head_dim % 2:
            raise ValueError(f"GPTConfig: RoPE rotates pairs of features, so the head width "
                             f"d_model / num_heads must be even, got {self.head_dim}")
        if self.d_ff is None:
            d_ff = 4 * self.d_model if self.mlp != "swiglu" else -(-8 * self.d_model // 3 // 8) * 8
            self._set("d_ff", d_ff)
        self._set("d_ff", v.integer(self.d_ff, "GPTConfig.d_ff", minimum=1))
        self._set("bias", v.boolean(self.bias, "GPTConfig.bias"))
        self._set("tie_embeddings", v.boolean(self.tie_embeddings, "GPTConfig.tie_embeddings"))
        self._set("eps", v.real(self.eps, "GPTConfig.eps", positive=True))
        dropout = v.real(self.dropout, "GPTConfig.dropout")
        if not 0 <= dropout < 1:
            raise ValueError(f"GPTConfig.dropout must be a probability in [0, 1), got "
                             f"{self.dropout!r}")
        self._set("dropout", dropout)
        self._set("rope_base", v.real(self.rope_base, "GPTConfig.rope_base", positive=True))
        if self.attention_block_size is not None:
            self._set("attention_block_size", v.integer(
                self.attention_block_size, "GPTConfig.attention_block_size", minimum=1))
        self._set("dtype", v.float_dtype(self.dtype, "GPTConfig.dtype").type)

    @classmethod
    def classic(cls, vocab_size: int, **overrides) -> GPTConfig:
        """The 2017 / GPT-2 block: layer norm, GELU MLP (tanh form), learned positions, biases,
        H = Hkv."""
        return cls(vocab_size, **{"norm": "layer", "mlp": "gelu_tanh", "positional": "learned",
                                  "bias": True, **overrides})

    @classmethod
    def modern(cls, vocab_size: int, **overrides) -> GPTConfig:
        """The LLaMA-style block: RMSNorm, SwiGLU, RoPE, grouped-query attention (half as many
        key/value heads as query heads, when H is even), no biases."""
        heads = overrides.get("num_heads", cls.num_heads)
        return cls(vocab_size, **{"norm": "rms", "mlp": "swiglu", "positional": "rope",
                                  "bias": False, "num_kv_heads": max(heads // 2, 1)
                                  if heads % 2 == 0 else heads, **overrides})


def kv_cache_bytes(config: GPTConfig, batch: int, length: int) -> int:
    """Bytes of the KV cache of a GPT with ``config`` for ``batch`` sequences of ``length``
    positions: 2 (keys and values) x N layers x B x Hkv x length x Dh x bytes per number."""
    c = config
    return (2 * c.num_layers * v.integer(batch, "batch", minimum=0) * c.num_kv_heads
            * v.integer(length, "length", minimum=0) * c.head_dim * np.dtype(c.dtype).itemsize)


def _norm_shapes(prefix: str, c: GPTConfig) -> dict:
    keys = ("gamma", "beta") if c.norm == "layer" and c.bias else ("gamma",)
    return {f"{prefix}.{k}": (c.d_model,) for k in keys}


def parameter_shapes(c: GPTConfig) -> dict[str, tuple]:
    """Name -> shape of every parameter of a GPT with config ``c``, in order."""
    E, F = c.d_model, c.d_ff
    qkv = E + 2 * c.num_kv_heads * c.head_dim
    shapes = {"embed.W": (c.vocab_size, E)}
    if c.positional == "learned":
        shapes["pos.W"] = (c.max_len, E)
    for i in range(c.num_layers):
        p = f"layers.{i}"
        shapes.update(_norm_shapes(f"{p}.norm1", c))
        shapes[f"{p}.attn.W_qkv"] = (E, qkv)
        shapes[f"{p}.attn.W_o"] = (E, E)
        if c.bias:
            shapes[f"{p}.attn.b_qkv"] = (qkv,)
            shapes[f"{p}.attn.b_o"] = (E,)
        shapes.update(_norm_shapes(f"{p}.norm2", c))
        if c.mlp == "swiglu":
            shapes.update({f"{p}.mlp.W_gate": (E, F), f"{p}.mlp.W_up": (E, F),
                           f"{p}.mlp.W_down": (F, E)})
        else:
            shapes.update({f"{p}.mlp.W1": (E, F), f"{p}.mlp.W2": (F, E)})
            if c.bias:
                shapes.update({f"{p}.mlp.b1": (F,), f"{p}.mlp.b2": (E,)})
    shapes.update(_norm_shapes("norm", c))
    if not c.tie_embeddings:
        shapes["lm_head.W"] = (c.vocab_size, E)
    return shapes


#: The config classes by the "kind" a checkpoint's header names.
CONFIGS = {"transformer": TransformerConfig, "gpt": GPTConfig}


def config_to_dict(config: TransformerConfig | GPTConfig) -> dict:
    """The config as a JSON-ready dict (the dtype by name: "float32" / "float64")."""
    d = dataclasses.asdict(config)
    d["dtype"] = np.dtype(config.dtype).name
    return d


def config_from_dict(d: Mapping, kind: str = "transformer") -> TransformerConfig | GPTConfig:
    """Inverse of :func:`config_to_dict`, for a config of ``kind`` ("transformer", "gpt")."""
    d = dict(d)
    d["dtype"] = np.dtype(d.get("dtype", "float32")).type
    return CONFIGS[kind](**d)
