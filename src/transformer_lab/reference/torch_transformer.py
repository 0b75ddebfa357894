"""The course Transformer as PyTorch modules written from scratch, and the same model around
``nn.Transformer``: references for :mod:`transformer_lab.models.encoder_decoder`.

Two ``nn.Module`` versions of :class:`transformer_lab.models.encoder_decoder.Transformer`:

- :class:`TorchTransformer` -- written from tensor operations and autograd only (no
  ``nn.MultiheadAttention``, ``nn.Transformer*``, ``nn.LayerNorm`` or ``nn.Linear`` inside).
  Its parameters carry **the NumPy model's names and layouts** (``W`` of shape (in, out),
  ``y = x @ W + b``), so ``dict(model.named_parameters())`` has exactly the keys of the NumPy
  model's ``params``, and weights and gradients move between the two by name, unchanged.
- :class:`ReferenceTransformer` -- the same embeddings and output projection around PyTorch's own
  ``nn.Transformer`` (``batch_first=True``, ``dropout=0``) as the encoder-decoder core.

Both start from the NumPy model's weights, so that the three models compute the same function::

    model = Transformer(config, seed=0)                  # NumPy
    twin = TorchTransformer.from_numpy(model)            # same weights, PyTorch from scratch
    ref = ReferenceTransformer.from_numpy(model)         # same weights, nn.Transformer core
    loss = twin.loss(src, tgt); loss.backward()
    twin.numpy_grads()                                   # name -> gradient, NumPy layout
    twin.export_to(model)                                # copy the torch weights back (in place)

``TorchTransformer(config, seed)`` initialises exactly like ``Transformer(config, seed)`` (it
loads the NumPy model's initial weights), so a NumPy and a torch model made from the same
config and seed start equal -- to train both on the same batches and compare loss curves.
"""

from __future__ import annotations

import abc
import math
import warnings
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from transformer_lab import _validate as v
from transformer_lab import layers as L
from transformer_lab.models import encoder_decoder as T
from transformer_lab.models import inputs
from transformer_lab.models.encoder_decoder import Transformer, TransformerConfig, parameter_names
from transformer_lab.reference.interop import stack_from_torch, stack_to_torch
from transformer_lab.reference.torch_gpt import torch_dtype

__all__ = ["LayerNorm", "FeedForward", "MultiHeadAttention", "EncoderLayer", "DecoderLayer",
           "Encoder", "Decoder", "Embedding", "Linear", "TorchTransformer",
           "ReferenceTransformer"]


def _param(shape, dtype, fill=0.0) -> nn.Parameter:
    return nn.Parameter(torch.full(shape, fill, dtype=dtype))


# --------------------------------------------------------------------------------------------
# Building blocks, from tensor operations only


class LayerNorm(nn.Module):
    """``(x - mean) / sqrt(var + eps) * gamma + beta`` over the last axis (biased variance)."""

    def __init__(self, d: int, eps: float = 1e-5, bias: bool = True, dtype=torch.float32):
        super().__init__()
        self.eps = eps
        self.gamma = _param((d,), dtype, 1.0)
        self.beta = _param((d,), dtype) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=-1, keepdim=True)
        var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
        x_hat = (x - mean) / torch.sqrt(var + self.eps)
        out = x_hat * self.gamma
        return out + self.beta if self.beta is not None else out


class Linear(nn.Module):
    """``x @ W + b`` with ``W`` of shape (in, out): the NumPy layout (nn.Linear stores W^T)."""

    def __init__(self, d_in: int, d_out: int, bias: bool = True, dtype=torch.float32):
        super().__init__()
        self.W = _param((d_in, d_out), dtype)
        self.b = _param((d_out,), dtype) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x @ self.W
        return out + self.b if self.b is not None else out


class Embedding(nn.Module):
    """A table ``W`` (V, D) looked up by indexing: ``W[ids]``."""

    def __init__(self, num: int, d: int, dtype=torch.float32):
        super().__init__()
        self.W = _param((num, d), dtype)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.W[ids]


_ACTIVATIONS = {
    "relu": torch.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


class FeedForward(nn.Module):
    """``act(x W1 + b1) W2 + b2``, applied to every position."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", bias: bool = True,
                 dtype=torch.float32):
        super().__init__()
        self.activation = activation
        self.W1 = _param((d_model, d_ff), dtype)
        self.b1 = _param((d_ff,), dtype) if bias else None
        self.W2 = _param((d_ff, d_model), dtype)
        self.b2 = _param((d_model,), dtype) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x @ self.W1
        if self.b1 is not None:
            h = h + self.b1
        out = _ACTIVATIONS[self.activation](h) @ self.W2
        return out + self.b2 if self.b2 is not None else out


class MultiHeadAttention(nn.Module):
    """Multi-head attention; packed ``W_qkv`` (E, 3E) for self-attention, ``W_q, W_k, W_v``
    for cross-attention, ``W_o`` for the output; biases ``b_*`` optional.

    ``forward(query, memory=None, attn_mask=None, key_padding_mask=None)``: self-attention when
    ``memory`` is None, else cross-attention from ``query`` to ``memory``. Boolean masks are
    True where attention is **blocked** (``attn_mask`` (T, S), ``key_padding_mask`` (B, S)).
    A query whose keys are all blocked gets zero weights (like the NumPy package). The weights
    of the last call are kept in ``self.last_weights`` (B, H, T, S), detached.
    """

    def __init__(self, d_model: int, num_heads: int, packed: bool, bias: bool = True,
                 dtype=torch.float32):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.packed = packed
        if packed:
            self.W_qkv = _param((d_model, 3 * d_model), dtype)
        else:
            self.W_q = _param((d_model, d_model), dtype)
            self.W_k = _param((d_model, d_model), dtype)
            self.W_v = _param((d_model, d_model), dtype)
        self.W_o = _param((d_model, d_model), dtype)
        if bias:
            if packed:
                self.b_qkv = _param((3 * d_model,), dtype)
            else:
                self.b_q = _param((d_model,), dtype)
                self.b_k = _param((d_model,), dtype)
                self.b_v = _param((d_model,), dtype)
            self.b_o = _param((d_model,), dtype)
        self.bias = bias
        self.last_weights = None

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, E) -> (B, h, T, E/h): h chunks of the features, heads before time."""
        b, t, e = x.shape
        return x.view(b, t, self.num_heads, e // self.num_heads).transpose(1, 2)

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, T, Dh) -> (B, T, H*Dh): the inverse of :meth:`split_heads`."""
        b, h, t, dh = x.shape
        return x.transpose(1, 2).reshape(b, t, h * dh)

    def project(self, query, memory):
        if self.packed:
            qkv = query @ self.W_qkv
            if self.bias:
                qkv = qkv + self.b_qkv
            return qkv.chunk(3, dim=-1)
        q, k, v_ = query @ self.W_q, memory @ self.W_k, memory @ self.W_v
        if self.bias:
            q, k, v_ = q + self.b_q, k + self.b_k, v_ + self.b_v
        return q, k, v_

    def attend(self, q, k, v_, blocked):
        """Scaled dot-product attention over (B, h, T, d_h) tensors; ``blocked`` broadcasts to
        (B, h, T, S) or is None."""
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if blocked is None:
            weights = torch.softmax(scores, dim=-1)
        else:
            scores = scores.masked_fill(blocked, float("-inf"))
            empty = blocked.all(dim=-1, keepdim=True)  # queries with nothing to attend to
            if empty.any():
                scores = scores.masked_fill(empty, 0.0)
                weights = torch.softmax(scores, dim=-1).masked_fill(empty, 0.0)
            else:
                weights = torch.softmax(scores, dim=-1)
        self.last_weights = weights.detach()
        return weights @ v_

    def forward(self, query, memory=None, attn_mask=None, key_padding_mask=None):
        if self.packed != (memory is None):
            raise ValueError("packed attention is self-attention (memory=None); cross-attention "
                             "needs separate W_q, W_k, W_v")
        q, k, v_ = self.project(query, query if memory is None else memory)
        blocked = None
        if attn_mask is not None:
            blocked = attn_mask[None, None]
        if key_padding_mask is not None:
            kpm = key_padding_mask[:, None, None, :]
            blocked = kpm if blocked is None else blocked | kpm
        ctx = self.attend(self.split_heads(q), self.split_heads(k), self.split_heads(v_), blocked)
        out = self.merge_heads(ctx) @ self.W_o
        return out + self.b_o if self.bias else out


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward, each with a residual connection and a layer norm."""

    def __init__(self, c: TransformerConfig, dtype):
        super().__init__()
        self.norm_first = c.norm_first
        self.self_attn = MultiHeadAttention(c.d_model, c.num_heads, True, c.bias, dtype)
        self.ff = FeedForward(c.d_model, c.d_ff, c.activation, c.bias, dtype)
        self.norm1 = LayerNorm(c.d_model, c.eps, c.bias, dtype)
        self.norm2 = LayerNorm(c.d_model, c.eps, c.bias, dtype)

    def forward(self, x, key_padding_mask=None):
        def sa(h):
            return self.self_attn(h, key_padding_mask=key_padding_mask)

        if self.norm_first:  # pre-norm: x + f(norm(x))
            x = x + sa(self.norm1(x))
            return x + self.ff(self.norm2(x))
        x = self.norm1(x + sa(x))  # post-norm: norm(x + f(x))
        return self.norm2(x + self.ff(x))


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the memory, feed-forward; residual + norm each."""

    def __init__(self, c: TransformerConfig, dtype):
        super().__init__()
        self.norm_first = c.norm_first
        self.self_attn = MultiHeadAttention(c.d_model, c.num_heads, True, c.bias, dtype)
        self.cross_attn = MultiHeadAttention(c.d_model, c.num_heads, False, c.bias, dtype)
        self.ff = FeedForward(c.d_model, c.d_ff, c.activation, c.bias, dtype)
        self.norm1 = LayerNorm(c.d_model, c.eps, c.bias, dtype)
        self.norm2 = LayerNorm(c.d_model, c.eps, c.bias, dtype)
        self.norm3 = LayerNorm(c.d_model, c.eps, c.bias, dtype)

    def forward(self, y, memory, tgt_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None):
        def sa(h):
            return self.self_attn(h, attn_mask=tgt_mask, key_padding_mask=tgt_key_padding_mask)

        def ca(h):
            return self.cross_attn(h, memory, key_padding_mask=memory_key_padding_mask)

        if self.norm_first:
            y = y + sa(self.norm1(y))
            y = y + ca(self.norm2(y))
            return y + self.ff(self.norm3(y))
        y = self.norm1(y + sa(y))
        y = self.norm2(y + ca(y))
        return self.norm3(y + self.ff(y))


class Encoder(nn.Module):
    def __init__(self, c: TransformerConfig, dtype):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(c, dtype) for _ in range(c.num_encoder_layers))
        self.norm = LayerNorm(c.d_model, c.eps, c.bias, dtype)

    def forward(self, x, key_padding_mask=None):
        for layer in self.layers:
            x = layer(x, key_padding_mask)
        return self.norm(x)


class Decoder(nn.Module):
    def __init__(self, c: TransformerConfig, dtype):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(c, dtype) for _ in range(c.num_decoder_layers))
        self.norm = LayerNorm(c.d_model, c.eps, c.bias, dtype)

    def forward(self, y, memory, tgt_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None):
        for layer in self.layers:
            y = layer(y, memory, tgt_mask, tgt_key_padding_mask, memory_key_padding_mask)
        return self.norm(y)


# --------------------------------------------------------------------------------------------
# What both torch models share: embeddings, output projection, loss, decoding, weight transfer


def _to_numpy(x):
    """A torch tensor as a NumPy array (other inputs unchanged, for the shared checks)."""
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x


class _Seq2Seq(nn.Module, abc.ABC):
    """Embeddings, output projection and everything around the encoder-decoder core.

    Inputs are checked by the very functions the NumPy model uses
    (:func:`transformer_lab.models.encoder_decoder.check_inputs`, ...): same rules, same messages.
    Subclasses provide the core (:meth:`core`) and the mapping between their parameters and the
    NumPy model's names and layouts (:meth:`_numpy_layout`, :meth:`_torch_layout`).
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
        c = self.config = config
        dt = self.torch_dtype = torch_dtype(c)
        self.src_embed = Embedding(c.src_vocab_size, c.d_model, dt)
        self.tgt_embed = Embedding(c.tgt_vocab_size, c.d_model, dt)
        if c.positional == "learned":
            self.src_pos = Embedding(c.max_len, c.d_model, dt)
            self.tgt_pos = Embedding(c.max_len, c.d_model, dt)
        pe = (L.positional_encoding(c.max_len, c.d_model, dtype=c.dtype)
              if c.positional == "sinusoidal" else None)
        self.register_buffer("pe", None if pe is None else torch.from_numpy(pe),
                             persistent=False)

    # -- the parts a subclass provides -------------------------------------------------------

    @abc.abstractmethod
    def core(self, x_src: torch.Tensor, x_tgt: torch.Tensor, src_kpm: torch.Tensor,
             tgt_kpm: torch.Tensor) -> torch.Tensor:
        """Embedded source (B, S, E) and decoder input (B, T, E), key padding masks (B, S) and
        (B, T) (True = padding) -> the final decoder states (B, T, E), causal."""

    @abc.abstractmethod
    def _numpy_layout(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Arrays named and laid out like ``self.named_parameters()`` -> the NumPy model's names
        and layouts (views where possible)."""

    @abc.abstractmethod
    def _torch_layout(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The inverse of :meth:`_numpy_layout`."""

    # -- forward, loss, decoding ------------------------------------------------------------

    def embed(self, ids: torch.Tensor, side: str) -> torch.Tensor:
        x = getattr(self, f"{side}_embed")(ids)
        if self.config.scale_embeddings:
            x = x * math.sqrt(self.config.d_model)
        t = ids.shape[1]
        if self.pe is not None:
            x = x + self.pe[:t]
        elif self.config.positional == "learned":
            x = x + getattr(self, f"{side}_pos").W[:t]
        return x

    def forward(self, src, tgt_in, src_key_padding_mask=None, tgt_key_padding_mask=None):
        """Logits (B, T, tgt_vocab_size), as :meth:`Transformer.forward` (ids and masks as NumPy
        arrays or tensors)."""
        src, tgt_in, src_kpm, tgt_kpm = (
            torch.from_numpy(np.ascontiguousarray(a)) for a in inputs.check_inputs(
                self.config, _to_numpy(src), _to_numpy(tgt_in),
                _to_numpy(src_key_padding_mask), _to_numpy(tgt_key_padding_mask)))
        y = self.core(self.embed(src.long(), "src"), self.embed(tgt_in.long(), "tgt"), src_kpm,
                      tgt_kpm)
        return self.out_proj(y)

    def loss(self, src, tgt) -> torch.Tensor:
        """Mean cross-entropy over the labels ``tgt[:, 1:]`` up to each first EOS, padding
        skipped: the same loss as :meth:`Transformer.loss` (call ``.backward()`` on it)."""
        src, tgt, labels = inputs.check_loss_inputs(self.config, _to_numpy(src), _to_numpy(tgt))
        labels = torch.from_numpy(labels).long()
        logits = self(src, tgt[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                               ignore_index=inputs.IGNORE_INDEX)

    @torch.no_grad()
    def greedy_decode(self, src, max_len: int | None = None, padded: bool = False):
        """Greedy decoding, as :meth:`Transformer.greedy_decode` (same arguments and results)."""
        c = self.config
        src = inputs.check_ids(_to_numpy(src), "src", c.src_vocab_size, inputs.length_limit(c))
        max_len = inputs.check_decode_length(c, max_len)
        b = src.shape[0]
        out = torch.full((b, max_len + 1), c.pad_id, dtype=torch.long)
        out[:, 0] = c.bos_id
        done = torch.zeros(b, dtype=torch.bool)
        steps = 0
        for t in range(max_len):
            logits = self(src, out[:, :t + 1])[:, -1]
            nxt = torch.where(done, c.pad_id, logits.argmax(dim=-1))
            out[:, t + 1] = nxt
            done |= nxt == c.eos_id
            steps = t + 1
            if bool(done.all()):
                break
        return inputs.decoded_sequences(out[:, :steps + 1].numpy(), c.eos_id, padded)

    # -- weights and gradients in the NumPy model's names and layouts ------------------------

    def _arrays(self, grads: bool = False) -> dict[str, np.ndarray]:
        """``named_parameters()`` (or their ``.grad``, zeros where None) as NumPy arrays that
        share memory with the tensors."""
        out = {}
        for name, p in self.named_parameters():
            t = p if not grads else p.grad if p.grad is not None else torch.zeros_like(p)
            out[name] = t.detach().numpy()
        return out

    def _numpy_copies(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """NumPy names and layouts, C-contiguous copies, in the NumPy model's order."""
        views = self._numpy_layout(arrays)
        return {name: np.array(views[name], order="C") for name in parameter_names(self.config)}

    def numpy_params(self) -> dict[str, np.ndarray]:
        """The parameters as a NumPy model's ``params`` dict (copies, NumPy names/layouts)."""
        return self._numpy_copies(self._arrays())

    def numpy_grads(self) -> dict[str, np.ndarray]:
        """The gradients of the last ``backward()`` under the NumPy model's names and layouts
        (zeros where a parameter got no gradient)."""
        return self._numpy_copies(self._arrays(grads=True))

    def load_numpy_params(self, params: Mapping[str, np.ndarray]) -> None:
        """Copy every parameter from a NumPy model's ``params`` dict.

        Refuses (nothing copied) other names, a value that is not a NumPy array of the model's
        dtype and of the parameter's shape, or one that holds NaN or infinity.
        """
        expected = self._numpy_layout(self._arrays())  # names and shapes, NumPy layout
        missing, extra = set(expected) - set(params), set(params) - set(expected)
        if missing or extra:
            raise ValueError(f"params must have exactly the model's parameter names; missing "
                             f"{sorted(missing)}, unexpected {sorted(extra)}")
        dtype = np.dtype(self.config.dtype)
        for name, want in expected.items():
            value = params[name]
            if not isinstance(value, np.ndarray) or value.dtype != dtype:
                got = value.dtype if isinstance(value, np.ndarray) else type(value).__name__
                raise TypeError(f"params[{name!r}] must be a NumPy array of the model's dtype "
                                f"{dtype}, got {got}")
            v.shape_is(value, want.shape, f"params[{name!r}]")
            if not np.all(np.isfinite(value)):
                raise ValueError(f"params[{name!r}] contains NaN or infinity")
        arrays = self._torch_layout(params)
        with torch.no_grad():
            for name, p in self.named_parameters():
                p.copy_(torch.from_numpy(np.ascontiguousarray(arrays[name])))

    def export_to(self, model: Transformer) -> None:
        """Copy these weights into a NumPy model, in place."""
        model.set_params(self.numpy_params())

    @classmethod
    def from_numpy(cls, model: Transformer):
        """A torch model with the config and the current weights of a NumPy model."""
        if not isinstance(model, Transformer):
            raise TypeError(f"model must be a transformer_lab.models.encoder_decoder.Transformer, "
                            f"got {type(model).__name__}")
        twin = cls(model.config, seed=None)
        twin.load_numpy_params(model.params)
        return twin

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def _causal_mask(t: int) -> torch.Tensor:
    """(T, T) bool, True above the diagonal: the future, blocked."""
    return torch.ones(t, t, dtype=torch.bool).triu(1)


class TorchTransformer(_Seq2Seq):
    """The course Transformer from scratch in PyTorch; parameter names are the NumPy model's.

    Args:
        config: a :class:`TransformerConfig` (its dtype picks float32/float64).
        seed: initialise like ``Transformer(config, seed)`` (None: leave zeros, for loading).
    """

    def __init__(self, config: TransformerConfig, seed: int | None = 0):
        super().__init__(config)
        c, dt = config, self.torch_dtype
        self.encoder = Encoder(c, dt)
        self.decoder = Decoder(c, dt)
        self.out_proj = Linear(c.d_model, c.tgt_vocab_size, c.bias, dt)
        if seed is not None:
            self.load_numpy_params(Transformer(config, seed).params)

    def core(self, x_src, x_tgt, src_kpm, tgt_kpm):
        memory = self.encoder(x_src, src_kpm)
        return self.decoder(x_tgt, memory, _causal_mask(x_tgt.shape[1]), tgt_kpm, src_kpm)

    def _numpy_layout(self, arrays):
        return dict(arrays)  # the same names and layouts by construction

    def _torch_layout(self, arrays):
        return dict(arrays)

    @torch.no_grad()
    def attention_maps(self, src, tgt_in) -> dict[str, np.ndarray]:
        """As :meth:`Transformer.attention_maps`: name -> (B, H, T, S) NumPy arrays."""
        self(src, tgt_in)
        maps = {}
        for name, module in self.named_modules():
            if isinstance(module, MultiHeadAttention):
                maps[name] = module.last_weights.numpy().copy()
        return maps


# --------------------------------------------------------------------------------------------
# The same model around nn.Transformer. The encoder-decoder weights move between the NumPy
# model (flat names, NumPy layout) and nn.Transformer (torch names and layout) through the
# layout conversion of transformer_lab.reference.interop, the one the twins use.


def _core_to_torch(config: TransformerConfig, params: Mapping[str, np.ndarray]
                   ) -> dict[str, np.ndarray]:
    """The NumPy model's encoder/decoder parameters (or gradients) -> nn.Transformer's names
    and layouts."""
    encoder, decoder = T.nest_params(params)
    return {**stack_to_torch(encoder, "encoder."), **stack_to_torch(decoder, "decoder.")}


def _core_to_numpy(config: TransformerConfig, state: Mapping[str, np.ndarray]
                   ) -> dict[str, np.ndarray]:
    """nn.Transformer's parameters (or gradients) -> the NumPy model's names and layouts."""
    e = config.d_model
    encoder = stack_from_torch(state, "encoder.", config.num_encoder_layers, e, decoder=False)
    decoder = stack_from_torch(state, "decoder.", config.num_decoder_layers, e, decoder=True,
                               split_cross=True)
    return T.flatten_params(encoder, decoder)


class ReferenceTransformer(_Seq2Seq):
    """The course model with PyTorch's ``nn.Transformer`` as its encoder-decoder core.

    Embeddings, positions and output projection are those of :class:`TorchTransformer`
    (parameters ``src_embed.W``, ..., ``out_proj.W``); the layers are ``self.transformer``, an
    ``nn.Transformer(batch_first=True, dropout=0.0)`` with the config's sizes, ``norm_first``,
    ``bias``, ``layer_norm_eps`` and activation. Use :meth:`from_numpy` to start from a NumPy
    model's weights and :meth:`numpy_grads` to read gradients under the NumPy names.
    (A source sequence that is all padding gives NaN here -- ``nn.MultiheadAttention``'s
    behaviour for a query with no key to attend to -- where the other two models give zeros.)
    """

    def __init__(self, config: TransformerConfig, seed: int | None = 0):
        super().__init__(config)
        self.transformer = self.make_core(config)
        self.out_proj = Linear(config.d_model, config.tgt_vocab_size, config.bias,
                               self.torch_dtype)
        if seed is not None:
            self.load_numpy_params(Transformer(config, seed).params)

    @staticmethod
    def make_core(c: TransformerConfig) -> nn.Transformer:
        """An ``nn.Transformer`` with the config's sizes (its weights are random)."""
        activation = {"relu": "relu", "gelu": "gelu",
                      "gelu_tanh": _ACTIVATIONS["gelu_tanh"]}[c.activation]
        with warnings.catch_warnings():  # "enable_nested_tensor is True, but ..." for pre-norm
            warnings.simplefilter("ignore")
            return nn.Transformer(c.d_model, c.num_heads, c.num_encoder_layers,
                                  c.num_decoder_layers, c.d_ff, dropout=0.0,
                                  activation=activation, layer_norm_eps=c.eps, batch_first=True,
                                  norm_first=c.norm_first, bias=c.bias,
                                  dtype=torch_dtype(c))

    def core(self, x_src, x_tgt, src_kpm, tgt_kpm):
        return self.transformer(x_src, x_tgt, tgt_mask=_causal_mask(x_tgt.shape[1]),
                                src_key_padding_mask=src_kpm, tgt_key_padding_mask=tgt_kpm,
                                memory_key_padding_mask=src_kpm)

    _CORE = "transformer."

    def _numpy_layout(self, arrays):
        core = {k[len(self._CORE):]: a for k, a in arrays.items() if k.startswith(self._CORE)}
        outer = {k: a for k, a in arrays.items() if not k.startswith(self._CORE)}
        return {**outer, **_core_to_numpy(self.config, core)}

    def _torch_layout(self, arrays):
        outer = {k: a for k, a in arrays.items() if not k.startswith(("encoder.", "decoder."))}
        core = _core_to_torch(self.config, arrays)
        return {**outer, **{self._CORE + k: a for k, a in core.items()}}
