"""The course Transformer as PyTorch modules written from scratch, and the same model around
``nn.Transformer``: references for :mod:`transformer_lab.transformer`.

Two ``nn.Module`` versions of :class:`transformer_lab.transformer.Transformer`:

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

import math
import warnings
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from transformer_lab import _validate as v
from transformer_lab import layers as L
from transformer_lab.transformer import Transformer, TransformerConfig, parameter_names

__all__ = ["LayerNorm", "FeedForward", "MultiHeadAttention", "EncoderLayer", "DecoderLayer",
           "Encoder", "Decoder", "Embedding", "Linear", "TorchTransformer",
           "ReferenceTransformer", "nn_transformer_state", "nn_transformer_grads"]


def _torch_dtype(dtype) -> torch.dtype:
    return torch.float64 if np.dtype(dtype) == np.float64 else torch.float32


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
        """(B, T, E) -> (B, H, T, E/H): H chunks of the features, heads before time."""
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
        """Scaled dot-product attention over (B, H, T, Dh) tensors; ``blocked`` broadcasts to
        (B, H, T, S) or is None."""
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


class _Seq2Seq(nn.Module):
    """Embeddings, output projection and everything around the encoder-decoder core."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
        c = self.config = config
        dt = self.torch_dtype = _torch_dtype(c.dtype)
        self.src_embed = Embedding(c.src_vocab_size, c.d_model, dt)
        self.tgt_embed = Embedding(c.tgt_vocab_size, c.d_model, dt)
        if c.positional == "learned":
            self.src_pos = Embedding(c.max_len, c.d_model, dt)
            self.tgt_pos = Embedding(c.max_len, c.d_model, dt)
        pe = (L.positional_encoding(c.max_len, c.d_model, dtype=c.dtype)
              if c.positional == "sinusoidal" else None)
        self.register_buffer("pe", None if pe is None else torch.from_numpy(pe),
                             persistent=False)

    # -- helpers ---------------------------------------------------------------------------

    def _ids(self, ids, name: str, vocab: int) -> torch.Tensor:
        if isinstance(ids, torch.Tensor):
            ids = ids.detach().cpu().numpy()
        ids = np.asarray(ids)
        if ids.ndim != 2:
            raise ValueError(f"{name} must have 2 dimensions (batch, length), got shape "
                             f"{ids.shape}")
        return torch.from_numpy(np.ascontiguousarray(v.token_ids(ids, name, vocab))).long()

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

    def core(self, x_src, x_tgt, src_kpm, tgt_kpm):  # pragma: no cover - overridden
        raise NotImplementedError

    def forward(self, src, tgt_in, src_key_padding_mask=None, tgt_key_padding_mask=None):
        """Logits (B, T, tgt_vocab_size), as :meth:`Transformer.forward`."""
        c = self.config
        src = self._ids(src, "src", c.src_vocab_size)
        tgt_in = self._ids(tgt_in, "tgt_in", c.tgt_vocab_size)
        src_kpm = src == c.pad_id if src_key_padding_mask is None else \
            torch.as_tensor(src_key_padding_mask, dtype=torch.bool)
        tgt_kpm = tgt_in == c.pad_id if tgt_key_padding_mask is None else \
            torch.as_tensor(tgt_key_padding_mask, dtype=torch.bool)
        y = self.core(self.embed(src, "src"), self.embed(tgt_in, "tgt"), src_kpm, tgt_kpm)
        return self.out_proj(y)

    def loss(self, src, tgt) -> torch.Tensor:
        """Mean cross-entropy over the labels ``tgt[:, 1:]`` up to each first EOS, padding
        skipped: the same loss as :meth:`Transformer.loss` (call ``.backward()`` on it)."""
        c = self.config
        tgt_np = self._ids(tgt, "tgt", c.tgt_vocab_size).numpy()
        if tgt_np.shape[1] < 2 or (tgt_np[:, 0] != c.bos_id).any():
            raise ValueError(f"tgt must have at least 2 columns and start with bos_id={c.bos_id}")
        labels = tgt_np[:, 1:]
        is_eos = labels == c.eos_id
        keep = (labels != c.pad_id) & ~((np.cumsum(is_eos, axis=1) - is_eos) > 0)
        labels = torch.from_numpy(np.where(keep, labels, -1))
        logits = self(src, tgt_np[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                               ignore_index=-1)

    @torch.no_grad()
    def greedy_decode(self, src, max_len: int | None = None, padded: bool = False):
        """Greedy decoding, as :meth:`Transformer.greedy_decode` (same arguments and results)."""
        c = self.config
        max_len = c.max_len if max_len is None else v.positive_int(max_len, "max_len")
        src = self._ids(src, "src", c.src_vocab_size)
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
        out = out[:, :steps + 1].numpy()
        if padded:
            return out
        ends = (out[:, 1:] == c.eos_id)
        lengths = np.where(ends.any(axis=1), ends.argmax(axis=1) + 1, steps)
        return [out[i, 1:1 + lengths[i]].copy() for i in range(b)]

    # -- weights and gradients in the NumPy model's names and layouts ------------------------

    def _to_torch_layout(self) -> dict:
        """numpy name -> (torch parameter, function numpy array -> tensor for it, inverse)."""
        raise NotImplementedError  # pragma: no cover

    def load_numpy_params(self, params: Mapping[str, np.ndarray]) -> None:
        """Copy every parameter from a NumPy model's ``params`` dict (names must match)."""
        mapping = self._to_torch_layout()
        missing = set(mapping) - set(params)
        extra = set(params) - set(mapping)
        if missing or extra:
            raise ValueError(f"params must have exactly the model's parameter names; missing "
                             f"{sorted(missing)}, unexpected {sorted(extra)}")
        with torch.no_grad():
            for name, (param, to_torch, _) in mapping.items():
                value = to_torch(torch.from_numpy(np.asarray(params[name])))
                if value.shape != param.shape:
                    raise ValueError(f"params[{name!r}] has shape {tuple(value.shape)} after "
                                     f"conversion, expected {tuple(param.shape)}")
                param.copy_(value)

    def numpy_params(self) -> dict[str, np.ndarray]:
        """The parameters as a NumPy model's ``params`` dict (copies, NumPy names/layouts)."""
        return {name: from_torch(param.detach()).numpy().copy()
                for name, (param, _, from_torch) in self._to_torch_layout().items()}

    def numpy_grads(self) -> dict[str, np.ndarray]:
        """The gradients of the last ``backward()`` under the NumPy model's names and layouts
        (zeros where a parameter got no gradient)."""
        out = {}
        for name, (param, _, from_torch) in self._to_torch_layout().items():
            g = param.grad if param.grad is not None else torch.zeros_like(param)
            out[name] = from_torch(g.detach()).numpy().copy()
        return out

    def export_to(self, model: Transformer) -> None:
        """Copy these weights into a NumPy model, in place."""
        model.set_params(self.numpy_params())

    @classmethod
    def from_numpy(cls, model: Transformer):
        """A torch model with the config and the current weights of a NumPy model."""
        if not isinstance(model, Transformer):
            raise TypeError(f"model must be a transformer_lab.transformer.Transformer, got "
                            f"{type(model).__name__}")
        twin = cls(model.config, seed=None)
        twin.load_numpy_params(model.params)
        return twin

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def _identity(t):
    return t


def _transpose(t):
    return t.T


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
        t = x_tgt.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        memory = self.encoder(x_src, src_kpm)
        return self.decoder(x_tgt, memory, causal, tgt_kpm, src_kpm)

    def _to_torch_layout(self):
        return {name: (p, _identity, _identity) for name, p in self.named_parameters()}

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
# The same model around nn.Transformer


def _core_names(c: TransformerConfig) -> dict[str, tuple[str, str]]:
    """NumPy name -> (nn.Transformer parameter name, conversion), for the encoder-decoder core.

    Conversions: "T" (transpose: nn.Linear stores (out, in)), "=" (same), and for the
    cross-attention input projections, which nn.MultiheadAttention packs into one
    ``in_proj_weight`` (3E, E) = [W_q^T; W_k^T; W_v^T]: "q", "k", "v" (a third of it).
    """
    names = {}

    def attn(np_prefix, t_prefix, packed):
        if packed:
            names[f"{np_prefix}.W_qkv"] = (f"{t_prefix}.in_proj_weight", "T")
        else:
            for part in "qkv":
                names[f"{np_prefix}.W_{part}"] = (f"{t_prefix}.in_proj_weight", part)
        names[f"{np_prefix}.W_o"] = (f"{t_prefix}.out_proj.weight", "T")
        if c.bias:
            if packed:
                names[f"{np_prefix}.b_qkv"] = (f"{t_prefix}.in_proj_bias", "=")
            else:
                for part in "qkv":
                    names[f"{np_prefix}.b_{part}"] = (f"{t_prefix}.in_proj_bias", part)
            names[f"{np_prefix}.b_o"] = (f"{t_prefix}.out_proj.bias", "=")

    def ff_norms(np_prefix, t_prefix, n_norms):
        names[f"{np_prefix}.ff.W1"] = (f"{t_prefix}.linear1.weight", "T")
        names[f"{np_prefix}.ff.W2"] = (f"{t_prefix}.linear2.weight", "T")
        if c.bias:
            names[f"{np_prefix}.ff.b1"] = (f"{t_prefix}.linear1.bias", "=")
            names[f"{np_prefix}.ff.b2"] = (f"{t_prefix}.linear2.bias", "=")
        for k in range(1, n_norms + 1):
            norm(f"{np_prefix}.norm{k}", f"{t_prefix}.norm{k}")

    def norm(np_prefix, t_prefix):
        names[f"{np_prefix}.gamma"] = (f"{t_prefix}.weight", "=")
        if c.bias:
            names[f"{np_prefix}.beta"] = (f"{t_prefix}.bias", "=")

    for i in range(c.num_encoder_layers):
        p = f"encoder.layers.{i}"
        attn(f"{p}.self_attn", f"{p}.self_attn", True)
        ff_norms(p, p, 2)
    norm("encoder.norm", "encoder.norm")
    for i in range(c.num_decoder_layers):
        p = f"decoder.layers.{i}"
        attn(f"{p}.self_attn", f"{p}.self_attn", True)
        attn(f"{p}.cross_attn", f"{p}.multihead_attn", False)
        ff_norms(p, p, 3)
    norm("decoder.norm", "decoder.norm")
    return names


def _part(t: torch.Tensor, part: str) -> torch.Tensor:
    e = t.shape[0] // 3
    return t[{"q": 0, "k": 1, "v": 2}[part] * e:][:e]


def nn_transformer_state(model: Transformer) -> dict[str, torch.Tensor]:
    """The NumPy model's encoder-decoder weights as an ``nn.Transformer`` state dict.

    Load with ``core.load_state_dict(nn_transformer_state(model))`` into an ``nn.Transformer``
    made with the model's sizes, ``batch_first=True``, ``norm_first``, ``bias`` and
    ``layer_norm_eps`` (see :meth:`ReferenceTransformer.make_core`).
    """
    c, params = model.config, model.params
    state: dict[str, torch.Tensor] = {}
    pieces: dict[str, dict[str, torch.Tensor]] = {}
    for np_name, (t_name, conv) in _core_names(c).items():
        value = torch.from_numpy(np.ascontiguousarray(params[np_name]))
        if conv == "T":
            state[t_name] = value.T.contiguous()
        elif conv == "=":
            state[t_name] = value.clone()
        else:  # cross-attention: q, k, v stacked into in_proj_weight / in_proj_bias
            pieces.setdefault(t_name, {})[conv] = value.T if value.ndim == 2 else value
    for t_name, parts in pieces.items():
        state[t_name] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0).contiguous()
    return state


def nn_transformer_grads(core: nn.Transformer, config: TransformerConfig
                         ) -> dict[str, np.ndarray]:
    """The gradients of an ``nn.Transformer`` core under the NumPy model's names and layouts."""
    tparams = dict(core.named_parameters())
    out = {}
    for np_name, (t_name, conv) in _core_names(config).items():
        g = tparams[t_name].grad
        g = torch.zeros_like(tparams[t_name]) if g is None else g.detach()
        if conv == "T":
            g = g.T
        elif conv != "=":
            g = _part(g, conv)
            g = g.T if g.ndim == 2 else g
        out[np_name] = g.numpy().copy()
    return out


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
                                  dtype=_torch_dtype(c.dtype))

    def core(self, x_src, x_tgt, src_kpm, tgt_kpm):
        t = x_tgt.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        return self.transformer(x_src, x_tgt, tgt_mask=causal, src_key_padding_mask=src_kpm,
                                tgt_key_padding_mask=tgt_kpm, memory_key_padding_mask=src_kpm)

    def _to_torch_layout(self):
        mapping = {name: (p, _identity, _identity) for name, p in self.named_parameters()
                   if not name.startswith("transformer.")}
        tparams = dict(self.transformer.named_parameters())
        for np_name, (t_name, conv) in _core_names(self.config).items():
            mapping[np_name] = (tparams[t_name], *_CONVERSIONS[conv])
        return {name: mapping[name] for name in parameter_names(self.config)}

    def load_numpy_params(self, params: Mapping[str, np.ndarray]) -> None:
        outer = {k: p for k, p in params.items() if not _is_core(k)}
        super_mapping = {name: (p, _identity, _identity) for name, p in self.named_parameters()
                         if not name.startswith("transformer.")}
        core_names = _core_names(self.config)
        missing = (set(super_mapping) | set(core_names)) - set(params)
        extra = set(params) - set(super_mapping) - set(core_names)
        if missing or extra:
            raise ValueError(f"params must have exactly the model's parameter names; missing "
                             f"{sorted(missing)}, unexpected {sorted(extra)}")
        with torch.no_grad():
            for name, value in outer.items():
                super_mapping[name][0].copy_(torch.from_numpy(np.asarray(value)))
            fake = _ParamsView(self.config, params)
            self.transformer.load_state_dict(nn_transformer_state(fake))


def _is_core(name: str) -> bool:
    return name.startswith(("encoder.", "decoder."))


class _ParamsView:
    """Just enough of a Transformer (config and params) for :func:`nn_transformer_state`."""

    def __init__(self, config, params):
        self.config, self.params = config, params


# from torch's layout to NumPy's (the load direction goes through nn_transformer_state)
_CONVERSIONS = {
    "T": (_transpose, _transpose),
    "=": (_identity, _identity),
    "q": (None, lambda t: _part(t, "q").T if t.ndim == 2 else _part(t, "q")),
    "k": (None, lambda t: _part(t, "k").T if t.ndim == 2 else _part(t, "k")),
    "v": (None, lambda t: _part(t, "v").T if t.ndim == 2 else _part(t, "v")),
}
