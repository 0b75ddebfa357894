"""The GPT of :mod:`transformer_lab.models.gpt`, written again from scratch in PyTorch -- for
parity.

    from transformer_lab.reference.torch_gpt import TorchGPT
    twin = TorchGPT.from_numpy(model)        # the same weights, float32 or float64
    loss = twin.loss(ids)                    # a torch scalar; loss.backward()
    twin.numpy_grads()                       # name -> array, the keys of model.params

Nothing here calls the NumPy code, and the pieces are computed another way wherever PyTorch
offers one: ``F.layer_norm`` and ``F.rms_norm``, ``F.gelu``/``F.silu``,
``F.scaled_dot_product_attention(is_causal=True)`` (on keys and values repeated with
``repeat_interleave``), RoPE as a multiplication of complex numbers, ``F.cross_entropy``
on the shifted logits. The parameters have the NumPy model's names, shapes and layout
(``y = x @ W + b``), so weights and gradients compare name by name; the embedding table is one
parameter used twice (tied), and autograd adds its two gradients; an untied model's output
table is the parameter ``lm_head.W``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.models.config import parameter_shapes
from transformer_lab.models.gpt import GPT, GPTConfig, check_ids


def torch_dtype(config) -> torch.dtype:
    """The torch dtype of a model with ``config`` (a GPT's or an encoder-decoder's: float32 or
    float64)."""
    return torch.float64 if np.dtype(config.dtype) == np.float64 else torch.float32


class _Params(nn.Module):
    """A module holding named parameters of given shapes (zeros until loaded)."""

    def __init__(self, shapes: Mapping[str, tuple], dtype: torch.dtype):
        super().__init__()
        for name, shape in shapes.items():
            self.register_parameter(name, nn.Parameter(torch.zeros(shape, dtype=dtype)))


def _sub(shapes: Mapping[str, tuple], prefix: str) -> dict:
    return {k[len(prefix) + 1:]: s for k, s in shapes.items() if k.startswith(prefix + ".")}


class TorchBlock(nn.Module):
    def __init__(self, c: GPTConfig, shapes: Mapping[str, tuple], dtype: torch.dtype):
        super().__init__()
        self.c = c
        for part in ("norm1", "attn", "norm2", "mlp"):
            setattr(self, part, _Params(_sub(shapes, part), dtype))

    def attention(self, x, rope):
        return attention(x, dict(self.attn.named_parameters()), self.c.num_heads,
                         self.c.num_kv_heads, rope)

    def feed_forward(self, x):
        c, p = self.c, self.mlp
        if c.mlp == "swiglu":
            return (F.silu(x @ p.W_gate) * (x @ p.W_up)) @ p.W_down
        h = x @ p.W1 + (p.b1 if c.bias else 0)
        h = F.relu(h) if c.mlp == "relu" else F.gelu(
            h, approximate="tanh" if c.mlp == "gelu_tanh" else "none")
        return h @ p.W2 + (p.b2 if c.bias else 0)

    def forward(self, x, rope=None, drop=None):
        """drop: None, or the two dropout factors (keep mask times 1 / (1 - p)) of the
        attention's and the MLP's output, each (B, T, E)."""
        a, m = (1, 1) if drop is None else drop
        x = x + self.attention(_norm(x, self.norm1, self.c), rope) * a
        return x + self.feed_forward(_norm(x, self.norm2, self.c)) * m


def _norm(x, p, c: GPTConfig):
    """The config's normalisation of ``x`` over its features, with the parameters of ``p``."""
    if c.norm == "rms":
        return F.rms_norm(x, (c.d_model,), p.gamma, c.eps)
    return F.layer_norm(x, (c.d_model,), p.gamma, getattr(p, "beta", None), c.eps)


def attention(x, params: Mapping[str, torch.Tensor], H: int, Hkv: int, angles=None,
              causal: bool | torch.Tensor = True) -> torch.Tensor:
    """The GPT's self-attention of x (B, T, E): ``params`` W_qkv, W_o and, where present, b_qkv
    and b_o; H query heads, Hkv key/value heads; RoPE by ``angles`` (T, Dh / 2) unless None;
    ``causal``: True, False, or a (T, T) bool tensor, True where position i sees key j."""
    B, T, E = x.shape
    Dh = E // H
    qkv = x @ params["W_qkv"] + params.get("b_qkv", 0)
    q, k, v = (a.view(B, T, -1, Dh).transpose(1, 2)  # H heads of queries, Hkv of keys, values
               for a in qkv.split([E, Hkv * Dh, Hkv * Dh], dim=-1))
    if angles is not None:
        q, k = _rotate(q, angles), _rotate(k, angles)
    k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
    mask = causal if isinstance(causal, torch.Tensor) else None
    heads = F.scaled_dot_product_attention(q, k, v, mask, is_causal=causal is True)
    return heads.transpose(1, 2).reshape(B, T, E) @ params["W_o"] + params.get("b_o", 0)


def _rotate(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """RoPE with complex numbers: the pair (x_2i, x_2i+1) is x_2i + i x_2i+1, and its rotation by
    +a (counterclockwise, as RoFormer and LLaMA turn it) is the multiplication by exp(i a)."""
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    turned = z * torch.polar(torch.ones_like(angles), angles)
    return torch.view_as_real(turned).reshape(x.shape)


class TorchGPT(nn.Module):
    """The decoder-only model of :class:`transformer_lab.models.gpt.GPT` in PyTorch (see the module
    docstring). Parameters are zeros until :meth:`load_numpy_params`; ``from_numpy`` does both."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = c = config
        dtype = torch_dtype(c)
        shapes = parameter_shapes(c)
        self.embed = _Params(_sub(shapes, "embed"), dtype)
        if c.positional == "learned":
            self.pos = _Params(_sub(shapes, "pos"), dtype)
        self.layers = nn.ModuleList(TorchBlock(c, _sub(shapes, f"layers.{i}"), dtype)
                                    for i in range(c.num_layers))
        self.norm = _Params(_sub(shapes, "norm"), dtype)
        if not c.tie_embeddings:
            self.lm_head = _Params(_sub(shapes, "lm_head"), dtype)
        positions = torch.arange(c.max_len, dtype=torch.float64)[:, None]
        if c.positional == "sinusoidal":
            omega = 10000.0 ** (-torch.arange(0, c.d_model, 2, dtype=torch.float64) / c.d_model)
            pe = torch.zeros(c.max_len, c.d_model, dtype=torch.float64)
            pe[:, 0::2] = torch.sin(positions * omega)
            pe[:, 1::2] = torch.cos(positions * omega)[:, :c.d_model // 2]
            self.register_buffer("pe", pe.to(dtype), persistent=False)
        if c.positional == "rope":
            Dh = c.head_dim
            omega = c.rope_base ** (-torch.arange(0, Dh, 2, dtype=torch.float64) / Dh)
            self.register_buffer("angles", (positions * omega).to(dtype), persistent=False)

    def forward(self, ids, drop=None) -> torch.Tensor:
        """Logits (B, T, V) of ids (B, T) (NumPy or CPU torch integers, moved to the parameters'
        device); drop: None, or per block the two dropout factors of :meth:`TorchBlock.forward`."""
        c = self.config
        ids = torch.as_tensor(check_ids(np.asarray(ids), "ids", c), device=self.embed.W.device)
        T = ids.shape[1]
        x = self.embed.W[ids]
        if c.positional == "learned":
            x = x + self.pos.W[:T]
        elif c.positional == "sinusoidal":
            x = x + self.pe[:T]
        rope = self.angles[:T] if c.positional == "rope" else None
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, None if drop is None else drop[i])
        x = _norm(x, self.norm, c)
        head = self.embed if c.tie_embeddings else self.lm_head  # tied, or a table of its own
        return x @ head.W.T

    def loss(self, ids, drop=None) -> torch.Tensor:
        """Mean cross-entropy of logits[:, t] against ids[:, t + 1] (drop: as :meth:`forward`)."""
        logits = self.forward(ids, drop)
        targets = torch.as_tensor(np.asarray(ids), device=logits.device)[:, 1:]
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                               targets.reshape(-1))

    # ------------------------------------------------------------------ NumPy weights

    def load_numpy_params(self, params: Mapping[str, np.ndarray]) -> None:
        own = dict(self.named_parameters())
        if set(own) != set(params):
            raise ValueError(f"parameter names differ: only here {sorted(set(own) - set(params))}"
                             f", only there {sorted(set(params) - set(own))}")
        with torch.no_grad():
            for name, p in own.items():
                p.copy_(torch.as_tensor(np.asarray(params[name])))

    @classmethod
    def from_numpy(cls, model: GPT) -> TorchGPT:
        twin = cls(model.config)
        twin.load_numpy_params(model.params)
        return twin

    def numpy_params(self) -> dict[str, np.ndarray]:
        return {n: p.detach().numpy().copy() for n, p in self.named_parameters()}

    def numpy_grads(self) -> dict[str, np.ndarray]:
        """name -> gradient of the last backward (zeros where none flowed)."""
        return {n: (p.grad.numpy().copy() if p.grad is not None
                    else np.zeros(tuple(p.shape), dtype=p.detach().numpy().dtype))
                for n, p in self.named_parameters()}


__all__ = ["TorchGPT", "TorchBlock"]
