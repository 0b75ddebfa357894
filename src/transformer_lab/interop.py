"""NumPy twins of PyTorch modules: ``from_torch(module)``.

A *twin* computes exactly what its torch module computes -- forward and backward -- with the
functional pairs of :mod:`transformer_lab.layers`, :mod:`transformer_lab.attention` and
:mod:`transformer_lab.blocks`. It is a thin mapping, not a framework: it converts arguments
(sequence layout, masks, ``is_causal``), weights (torch layout to NumPy layout) and gradients
(back to torch layout), and calls the functional code.

Supported modules and options (everything that needs no randomness)::

    nn.Linear                  bias on/off
    nn.Embedding               padding_idx, scale_grad_by_freq, sparse (gradient given dense)
    nn.LayerNorm               elementwise_affine, bias, eps, any normalized_shape
    nn.MultiheadAttention      bias, kdim/vdim, batch_first
    nn.TransformerEncoderLayer / nn.TransformerDecoderLayer
                               bias, batch_first, norm_first, activation "relu"/"gelu"
                               (or F.relu, F.gelu, nn.ReLU(), nn.GELU(approximate=...)),
                               layer_norm_eps
    nn.TransformerEncoder / nn.TransformerDecoder   with or without a final LayerNorm
    nn.Transformer             including custom_encoder/custom_decoder of the two classes above
    dtypes                     float32 and float64

Usage::

    twin = from_torch(module.eval())          # or a module built with dropout=0.0
    out = twin.forward(src, tgt, tgt_mask=mask, src_key_padding_mask=pad)   # NumPy arrays
    dsrc, dtgt = twin.backward(dout)          # gradients of the array inputs, argument order
    twin.grads["encoder.layers.0.self_attn.in_proj_weight"]   # torch name, torch layout

The contract, and where a twin deliberately differs from torch:

- ``twin.forward`` takes the positional arguments and mask keywords of the module's
  ``forward`` (NumPy arrays for tensors; bool masks with True = blocked, or float masks added to
  the scores; ``attn_mask`` of shape (T, S) or (batch * num_heads, T, S); key padding masks
  (batch, S)); ``batch_first`` True or False, and unbatched (2-D) sequences, as torch accepts.
- ``twin.backward(dout)`` returns the gradients of the array inputs of the last forward -- one
  array, or a tuple in argument order -- and fills ``twin.grads``: torch parameter name
  (``module.named_parameters()``) -> gradient in torch's layout (e.g. Linear weights
  (out, in)). ``twin.grads`` holds the gradients of the last backward only, like torch's
  ``.grad`` after ``zero_grad()``; nothing accumulates. Integer inputs (token ids) get None.
- **Shared inputs.** ``MultiheadAttention`` twins return one gradient per argument even when the
  same array is passed as query, key and value (self-attention): torch accumulates the *sum* of
  the three into the shared leaf tensor, so ``sum(twin.backward(dout))`` is torch's
  ``x.grad``. Encoder/decoder layers and stacks return the gradient of ``src`` (and ``tgt``,
  ``memory``), already summed over every path, as torch does.
- **Fully masked query rows.** A query whose keys are all blocked attends to nothing: its
  attention weights are zero, its attention output is zero (the output projection's bias), and
  no NaN reaches any output or gradient (:mod:`transformer_lab.attention`). This is what torch
  computes on the path used by its Transformer layers (``need_weights=False``, i.e.
  ``F.scaled_dot_product_attention``); ``nn.MultiheadAttention`` with ``need_weights=True``
  returns NaN for such rows instead. Every other row is unaffected either way.
- **is_causal** follows torch 2.13: it is a hint that needs the mask too (an error without
  it). For ``nn.MultiheadAttention`` with ``need_weights=False``, and hence for the layers,
  ``is_causal=True`` without a key padding mask applies the causal mask (top-left aligned,
  key j > query i blocked) *instead of* the given mask -- as torch does; with a key padding
  mask, or with ``need_weights=True``, the given mask is used. ``None`` (the stacks' default)
  means "use the mask as given", which is what torch's detection amounts to.
- **Fast path.** Under ``torch.no_grad()`` in eval mode, torch may run its inference fast path
  (``torch._transformer_encoder_layer_fwd``; ``nn.TransformerEncoder`` additionally converts a
  padded batch to a nested tensor). Outputs at non-padded positions agree with the autograd
  path up to rounding, but ``nn.TransformerEncoder`` returns **zeros at padded positions** (the
  final norm, if any, then maps them to its bias) where the autograd path computes values
  there. Twins compute the autograd path: the one whose gradients they reproduce.
- **Dropout** is refused: a module in training mode with any dropout probability > 0 raises a
  ``ValueError`` -- call ``module.eval()`` or build it with ``dropout=0.0``.
- **A twin is a snapshot.** Weights are copied at construction; ``twin.params`` maps the torch
  names to these copies, in torch's layout (the NumPy-layout parameters used internally are
  views of them, so writing into ``twin.params[name]`` changes the twin). After the module's
  weights change, call ``twin.refresh(module)`` (or ``from_torch`` again).

**Layout conversion.** ``norm_from_torch`` / ``mha_from_torch`` / ``ff_from_torch`` /
``layer_from_torch`` / ``stack_from_torch`` and their ``*_to_torch`` inverses are the one mapping
between torch's parameter names and layouts and the parameter dicts of
:mod:`transformer_lab.attention` and :mod:`transformer_lab.blocks`; the twins and
:mod:`transformer_lab.torch_model` (the NumPy Transformer's weights in ``nn.Transformer``) use it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from transformer_lab import _validate as v
from transformer_lab import attention as att
from transformer_lab import blocks as B
from transformer_lab import layers as L

__all__ = ["from_torch", "LinearTwin", "EmbeddingTwin", "LayerNormTwin",
           "MultiheadAttentionTwin", "TransformerEncoderLayerTwin",
           "TransformerDecoderLayerTwin", "TransformerEncoderTwin", "TransformerDecoderTwin",
           "TransformerTwin", "norm_from_torch", "norm_to_torch", "mha_from_torch",
           "mha_to_torch", "ff_from_torch", "ff_to_torch", "layer_from_torch", "layer_to_torch",
           "stack_from_torch", "stack_to_torch"]


def from_torch(module):
    """A NumPy twin of a PyTorch module, built from a copy of its weights.

    Args:
        module: one of ``nn.Linear``, ``nn.Embedding``, ``nn.LayerNorm``,
            ``nn.MultiheadAttention``, ``nn.TransformerEncoderLayer``,
            ``nn.TransformerDecoderLayer``, ``nn.TransformerEncoder``,
            ``nn.TransformerDecoder``, ``nn.Transformer``; float32 or float64, on the CPU, not
            applying dropout.

    Returns:
        The twin (see the module docstring): ``forward(...)``, ``backward(dout)``, ``grads``,
        ``params``, ``refresh(module)``.

    Raises:
        TypeError: for another module type or dtype.
        ValueError: for a module that would apply dropout, or an option the twins do not
            support (e.g. ``add_bias_kv``).
    """
    from torch import nn

    # Most specific first: out_proj is a subclass of nn.Linear, for instance.
    for cls, twin in ((nn.Transformer, TransformerTwin),
                      (nn.TransformerEncoder, TransformerEncoderTwin),
                      (nn.TransformerDecoder, TransformerDecoderTwin),
                      (nn.TransformerEncoderLayer, TransformerEncoderLayerTwin),
                      (nn.TransformerDecoderLayer, TransformerDecoderLayerTwin),
                      (nn.MultiheadAttention, MultiheadAttentionTwin),
                      (nn.LayerNorm, LayerNormTwin),
                      (nn.Embedding, EmbeddingTwin),
                      (nn.Linear, LinearTwin)):
        if isinstance(module, cls):
            return twin(module)
    raise TypeError("module must be one of nn.Linear, nn.Embedding, nn.LayerNorm, "
                    "nn.MultiheadAttention, nn.TransformerEncoderLayer, "
                    "nn.TransformerDecoderLayer, nn.TransformerEncoder, nn.TransformerDecoder, "
                    f"nn.Transformer; got {type(module).__name__}")


# --------------------------------------------------------------------------------------------
# Shared helpers: weights in, gradients out, inputs, masks


class _Twin:
    """What every twin has: ``params`` (torch names, torch layout), ``grads``, ``dtype``."""

    def __init__(self, module):
        _refuse_dropout(module)
        self.params = {}
        for name, p in module.named_parameters():
            self.params[name] = p.detach().cpu().numpy().copy()
        dtypes = {a.dtype for a in self.params.values()}
        if len(dtypes) > 1 or not dtypes <= {np.dtype(np.float32), np.dtype(np.float64)}:
            raise TypeError(f"module parameters must all be float32 or all float64, got "
                            f"{sorted(str(d) for d in dtypes)} (use module.float() or "
                            "module.double())")
        # A module without parameters (LayerNorm without affine) takes float32 and float64.
        self.dtype = dtypes.pop() if dtypes else None
        self.grads: dict[str, np.ndarray] = {}
        self._cache = None

    def refresh(self, module) -> None:
        """Copy the current weights of ``module`` (the one this twin was built from, or one of
        the same structure: parameter names, shapes and dtype) into the twin.

        Everything is checked before anything is copied; for a module of another size or dtype
        build a new twin with ``from_torch(module)``.
        """
        new = {name: p.detach().cpu().numpy() for name, p in module.named_parameters()}
        if list(new) != list(self.params):
            raise ValueError(f"module must have the parameters of the twin {list(self.params)}, "
                             f"got {list(new)}")
        for name, value in new.items():
            mine = self.params[name]
            if value.shape != mine.shape:
                raise ValueError(f"module parameter {name!r} has shape {value.shape} but the "
                                 f"twin's has shape {mine.shape}: refresh needs a module of the "
                                 f"same sizes (build a new twin with from_torch(module))")
            if value.dtype != mine.dtype:
                raise TypeError(f"module parameter {name!r} is {value.dtype} but the twin is "
                                f"{mine.dtype}: refresh needs a module of the same dtype (build a "
                                f"new twin with from_torch(module))")
        _refuse_dropout(module)
        for name, value in new.items():
            np.copyto(self.params[name], value)

    def _last(self):
        if self._cache is None:
            raise ValueError(f"{type(self).__name__}.backward: no forward pass to differentiate "
                             "-- call twin.forward(...) first")
        return self._cache

    def _set_grads(self, grads: dict) -> None:
        """Store torch-layout gradients in the order of ``named_parameters()``."""
        self.grads = {name: np.ascontiguousarray(grads[name]) for name in self.params}

    def _input(self, x, name: str) -> np.ndarray:
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{name} must be a NumPy array, got {type(x).__name__}")
        if self.dtype is None:
            return v.float_array(x, name)
        if x.dtype != self.dtype:
            raise TypeError(f"{name} must have the module's dtype {self.dtype}, got {x.dtype} "
                            f"(convert it with {name}.astype(np.{self.dtype}))")
        return x


def _refuse_dropout(module) -> None:
    from torch import nn

    for name, sub in module.named_modules():
        p = (sub.p if isinstance(sub, nn.modules.dropout._DropoutNd)
             else sub.dropout if isinstance(sub, nn.MultiheadAttention) else 0.0)
        if sub.training and p > 0:
            where = f"{name} (p={p})" if name else f"p={p}"
            raise ValueError(f"module would apply dropout in training mode ({where}): a twin "
                             "computes no randomness -- call module.eval(), or build the module "
                             "with dropout=0.0")


def _dout(twin, dout, shape: tuple, dtype=None) -> np.ndarray:
    """The upstream gradient of a twin's last forward: a NumPy array of the output's shape and
    dtype (``dtype``: that of the forward's input, for twins without parameters)."""
    dtype = twin.dtype if dtype is None else dtype
    return v.grad_like(dout, "dout", shape, dtype, what="the forward output")


def _T(a: np.ndarray) -> np.ndarray:
    """torch (out, in) <-> NumPy (in, out): a view, no copy."""
    return a.T


def _seq(twin, x, name: str, width: int, batch_first: bool) -> np.ndarray:
    """A torch sequence input as a batch-first (B, T, width) array (a view where possible).

    Accepts (B, T, width) with batch_first, (T, B, width) without, and unbatched (T, width).
    """
    x = twin._input(x, name)
    layout = "(batch, length, features)" if batch_first else "(length, batch, features)"
    if x.ndim not in (2, 3):
        raise ValueError(f"{name} must have 3 dimensions {layout} (batch_first={batch_first}), "
                         f"or 2 (length, features) unbatched; got shape {x.shape}")
    if x.shape[-1] != width:
        raise ValueError(f"{name} must have {width} features in its last axis, got shape "
                         f"{x.shape}")
    if x.ndim == 2:
        return x[None]
    return x if batch_first else x.swapaxes(0, 1)


def _unseq(y: np.ndarray, batched: bool, batch_first: bool) -> np.ndarray:
    """The inverse of :func:`_seq` for outputs and gradients."""
    if not batched:
        return y[0]
    return y if batch_first else np.ascontiguousarray(y.swapaxes(0, 1))


def _same_rank(**xs) -> bool:
    """All sequence arguments batched (3-D) or all unbatched (2-D); returns batched."""
    ranks = {n: x.ndim for n, x in xs.items()}
    if len(set(ranks.values())) > 1:
        listing = ", ".join(f"{n} {r}-D" for n, r in ranks.items())
        raise ValueError(f"{' and '.join(ranks)} must all be batched (3-D) or all unbatched "
                         f"(2-D), got {listing}")
    return next(iter(ranks.values())) == 3


def _mask_array(mask, name: str):
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array, got {type(mask).__name__}")
    if mask.dtype != bool and mask.dtype not in (np.float32, np.float64):
        raise TypeError(f"{name} must be a bool mask (True = blocked) or a float32/float64 "
                        f"mask added to the scores, got dtype {mask.dtype}")
    return mask


def _attn_mask(mask, name: str, b: int, h: int, t: int, s: int, batched: bool):
    """A torch attention mask, (T, S) or (B*H, T, S) ((H, T, S) unbatched), for the
    functional code: (T, S) or (B, H, T, S)."""
    if mask is None:
        return None
    mask = _mask_array(mask, name)
    three = (b * h, t, s) if batched else (h, t, s)
    if mask.shape == (t, s):
        return mask
    if mask.shape == three:
        return mask.reshape(b, h, t, s)
    lead = "batch * num_heads" if batched else "num_heads"
    raise ValueError(f"{name} must have shape (target length, source length) = {(t, s)} or "
                     f"({lead}, T, S) = {three}, got {mask.shape}")


def _padding_mask(mask, name: str, b: int, s: int, batched: bool):
    if mask is None:
        return None
    mask = _mask_array(mask, name)
    want = (b, s) if batched else (s,)
    if mask.shape != want:
        what = "(batch, source length)" if batched else "(source length,) for unbatched input"
        raise ValueError(f"{name} must have shape {what} = {want}, got {mask.shape}")
    return mask.reshape(b, s)


def _causal(mask, is_causal, padding, t: int, s: int, mask_name: str, flag_name: str,
            override: bool = True):
    """The mask torch 2.13 applies given an ``is_causal`` hint (see the module docstring)."""
    if is_causal is True:
        if mask is None:
            raise ValueError(f"{flag_name}=True needs {mask_name} as well (torch requires the "
                             "causal mask with the hint; e.g. "
                             "nn.Transformer.generate_square_subsequent_mask(T))")
        if override and padding is None:
            return att.causal_mask(t, s)
    return mask


def _activation_name(act) -> str:
    import torch.nn.functional as F
    from torch import nn

    if act is F.relu or isinstance(act, nn.ReLU):
        return "relu"
    if act is F.gelu:
        return "gelu"
    if isinstance(act, nn.GELU):
        return "gelu" if act.approximate == "none" else "gelu_tanh"
    raise ValueError(f"activation must be relu or gelu (the string, F.relu/F.gelu, nn.ReLU or "
                     f"nn.GELU), got {act!r}")


# --------------------------------------------------------------------------------------------
# The layout conversion: torch parameter names and layouts <-> the functional code's dicts
#
# The one mapping between the parameters of nn.LayerNorm, nn.MultiheadAttention and the
# nn.Transformer layers and stacks (torch names; Linear weights (out, in)) and the parameter
# dicts of transformer_lab.attention / transformer_lab.blocks (NumPy layout, W of shape
# (in, out)). ``*_from_torch(P, prefix, ...)`` reads the torch-named arrays ``P[prefix + name]``
# and returns the functional dict, made of views of them (no copies); ``*_to_torch(p, prefix)``
# is the inverse and applies to parameters and to gradients alike. The twins use it for their
# weights and gradients; transformer_lab.torch_model uses it to move the NumPy Transformer's
# weights into nn.Transformer and nn.Transformer's gradients back.


def norm_from_torch(P: Mapping[str, np.ndarray], prefix: str) -> dict:
    """``weight``, ``bias`` (any normalized_shape) -> ``{"gamma", "beta"}`` (flattened views);
    a norm without affine parameters gives ``{}``."""
    p = {}
    if prefix + "weight" in P:
        p["gamma"] = P[prefix + "weight"].reshape(-1)
    if prefix + "bias" in P:
        p["beta"] = P[prefix + "bias"].reshape(-1)
    return p


def norm_to_torch(p: Mapping[str, np.ndarray], prefix: str, shape: tuple | None = None) -> dict:
    """``{"gamma", "beta"}`` -> ``weight``, ``bias`` (reshaped to ``shape``, the
    normalized_shape, when given)."""
    out = {}
    for key, name in (("gamma", "weight"), ("beta", "bias")):
        if key in p:
            out[prefix + name] = p[key] if shape is None else p[key].reshape(shape)
    return out


def mha_from_torch(P: Mapping[str, np.ndarray], prefix: str, e: int,
                   split: bool = False) -> dict:
    """``nn.MultiheadAttention`` weights -> the dict of :mod:`transformer_lab.attention`.

    ``in_proj_weight`` (3E, E) is ``W_qkv`` (E, 3E) transposed -- or, with ``split``, the three
    column blocks ``W_q, W_k, W_v`` (E, E) of it (the NumPy Transformer's cross-attention). With
    kdim/vdim != E torch has ``q_proj_weight``, ``k_proj_weight``, ``v_proj_weight`` instead.
    ``in_proj_bias`` (3E,) is ``b_qkv``, or ``b_q, b_k, b_v`` with separate weights. ``out_proj``
    is ``W_o`` (E, E), ``b_o``.
    """
    p = {}
    if prefix + "in_proj_weight" in P:
        W = _T(P[prefix + "in_proj_weight"])
        if split:
            p.update(W_q=W[:, :e], W_k=W[:, e:2 * e], W_v=W[:, 2 * e:])
        else:
            p["W_qkv"] = W
    else:
        p.update({f"W_{c}": _T(P[f"{prefix}{c}_proj_weight"]) for c in "qkv"})
    p["W_o"] = _T(P[prefix + "out_proj.weight"])
    if prefix + "in_proj_bias" in P:
        b = P[prefix + "in_proj_bias"]
        if "W_qkv" in p:
            p["b_qkv"] = b
        else:
            p.update(b_q=b[:e], b_k=b[e:2 * e], b_v=b[2 * e:])
        p["b_o"] = P[prefix + "out_proj.bias"]
    return p


def mha_to_torch(p: Mapping[str, np.ndarray], prefix: str, packed: bool = True) -> dict:
    """The inverse of :func:`mha_from_torch`.

    ``packed``: torch keeps one ``in_proj_weight`` (kdim = vdim = E, always so in the
    Transformer layers), built from ``W_qkv`` or from ``W_q, W_k, W_v``; otherwise
    ``q_proj_weight``, ``k_proj_weight``, ``v_proj_weight``.
    """
    out = {}
    if "W_qkv" in p:
        out[prefix + "in_proj_weight"] = _T(p["W_qkv"])
    elif packed:
        out[prefix + "in_proj_weight"] = np.concatenate([_T(p[f"W_{c}"]) for c in "qkv"])
    else:
        for c in "qkv":
            out[f"{prefix}{c}_proj_weight"] = _T(p[f"W_{c}"])
    out[prefix + "out_proj.weight"] = _T(p["W_o"])
    if "b_o" in p:
        out[prefix + "in_proj_bias"] = (p["b_qkv"] if "b_qkv" in p else
                                        np.concatenate([p["b_q"], p["b_k"], p["b_v"]]))
        out[prefix + "out_proj.bias"] = p["b_o"]
    return out


def ff_from_torch(P: Mapping[str, np.ndarray], prefix: str) -> dict:
    """``linear1``, ``linear2`` of a Transformer layer -> ``{"W1", "b1", "W2", "b2"}``."""
    p = {"W1": _T(P[prefix + "linear1.weight"]), "W2": _T(P[prefix + "linear2.weight"])}
    if prefix + "linear1.bias" in P:
        p["b1"] = P[prefix + "linear1.bias"]
    if prefix + "linear2.bias" in P:
        p["b2"] = P[prefix + "linear2.bias"]
    return p


def ff_to_torch(p: Mapping[str, np.ndarray], prefix: str) -> dict:
    """The inverse of :func:`ff_from_torch`."""
    out = {prefix + "linear1.weight": _T(p["W1"]), prefix + "linear2.weight": _T(p["W2"])}
    if "b1" in p:
        out[prefix + "linear1.bias"] = p["b1"]
    if "b2" in p:
        out[prefix + "linear2.bias"] = p["b2"]
    return out


_ATTN = {"self_attn": "self_attn.", "cross_attn": "multihead_attn."}


def layer_from_torch(P: Mapping[str, np.ndarray], prefix: str, e: int, decoder: bool,
                     split_cross: bool = False) -> dict:
    """An encoder/decoder layer -> ``{"self_attn", ["cross_attn",] "ff", "norm1", ...}``
    (``split_cross``: the cross-attention's input projections as ``W_q, W_k, W_v``)."""
    p = {"self_attn": mha_from_torch(P, prefix + "self_attn.", e), "ff": ff_from_torch(P, prefix)}
    if decoder:
        p["cross_attn"] = mha_from_torch(P, prefix + "multihead_attn.", e, split=split_cross)
    for norm in ("norm1", "norm2", "norm3")[:2 + decoder]:
        p[norm] = norm_from_torch(P, f"{prefix}{norm}.")
    return p


def layer_to_torch(p: Mapping[str, dict], prefix: str) -> dict:
    """The inverse of :func:`layer_from_torch`."""
    out = ff_to_torch(p["ff"], prefix)
    for key, name in _ATTN.items():
        if key in p:
            out.update(mha_to_torch(p[key], prefix + name))
    for norm in ("norm1", "norm2", "norm3"):
        if norm in p:
            out.update(norm_to_torch(p[norm], f"{prefix}{norm}."))
    return out


def stack_from_torch(P: Mapping[str, np.ndarray], prefix: str, num_layers: int, e: int,
                     decoder: bool, split_cross: bool = False, final_norm: bool = True) -> dict:
    """An ``nn.TransformerEncoder`` / ``nn.TransformerDecoder`` -> ``{"layers": [...],
    "norm": {"gamma", "beta"}}`` as :func:`transformer_lab.blocks.encoder_forward` takes it
    (``final_norm=False``: ``"norm": None``, the final norm left out)."""
    layers = [layer_from_torch(P, f"{prefix}layers.{i}.", e, decoder, split_cross)
              for i in range(num_layers)]
    return {"layers": layers, "norm": norm_from_torch(P, prefix + "norm.") if final_norm
            else None}


def stack_to_torch(p: Mapping, prefix: str) -> dict:
    """The inverse of :func:`stack_from_torch`."""
    out = {}
    for i, layer in enumerate(p["layers"]):
        out.update(layer_to_torch(layer, f"{prefix}layers.{i}."))
    if p.get("norm") is not None:
        out.update(norm_to_torch(p["norm"], prefix + "norm."))
    return out


def _layer_config(layer, where: str) -> dict:
    """num_heads, norm_first, activation, eps, batch_first of an encoder/decoder layer."""
    from torch import nn

    e = layer.self_attn.embed_dim
    h = layer.self_attn.num_heads
    if not isinstance(h, int) or h <= 0 or e % h:
        raise ValueError(f"num_heads of {where}: the model width {e} must be divisible by "
                         f"num_heads, got num_heads = {h}")
    norms = [m for n, m in layer.named_children() if n.startswith("norm")]
    eps = {m.eps for m in norms}
    if len(eps) != 1:
        raise ValueError(f"layer_norm_eps of {where}: its norms must share one eps, got "
                         f"{sorted(eps)}")
    attns = [layer.self_attn] + ([layer.multihead_attn] if hasattr(layer, "multihead_attn")
                                 else [])
    for m in attns:
        if not isinstance(m, nn.MultiheadAttention) or m.bias_k is not None or m.add_zero_attn:
            raise ValueError(f"{where}: attention with add_bias_kv or add_zero_attn is not "
                             "supported by the twins")
        if m.num_heads != h or not m._qkv_same_embed_dim:
            raise ValueError(f"{where}: the self- and cross-attention must have the same heads "
                             "and kdim = vdim = d_model, as torch builds them")
    return {"num_heads": h, "norm_first": bool(layer.norm_first),
            "activation": _activation_name(layer.activation), "eps": eps.pop(),
            "batch_first": bool(layer.self_attn.batch_first), "d_model": e}


def _stack_config(layers, where: str) -> dict:
    configs = [_layer_config(m, f"{where}.layers.{i}") for i, m in enumerate(layers)]
    if not configs:
        raise ValueError(f"{where} must have at least one layer")
    if any(c != configs[0] for c in configs):
        raise ValueError(f"{where}: every layer must have the same num_heads, norm_first, "
                         "activation, layer_norm_eps and batch_first")
    return configs[0]


def _final_norm(norm, where: str, e: int):
    """(eps,) of an optional final nn.LayerNorm(d_model) of a stack, or None."""
    from torch import nn

    if norm is None:
        return None
    if not isinstance(norm, nn.LayerNorm) or tuple(norm.normalized_shape) != (e,):
        raise ValueError(f"{where}.norm must be None or nn.LayerNorm({e}), got {norm!r}")
    return norm.eps


# --------------------------------------------------------------------------------------------
# Linear, Embedding, LayerNorm


class LinearTwin(_Twin):
    """Twin of ``nn.Linear(in_features, out_features, bias)``.

    ``forward(input)``: input (..., in_features) -> (..., out_features).
    ``backward(dout)`` -> dinput; ``grads``: ``weight`` (out, in), ``bias`` (out,).
    """

    def __init__(self, module):
        super().__init__(module)
        self.in_features, self.out_features = module.in_features, module.out_features

    def forward(self, input):
        x = self._input(input, "input")
        if x.ndim < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"input must have shape (..., in_features = {self.in_features}), "
                             f"got {x.shape}")
        out, self._cache = L.linear_forward(x, _T(self.params["weight"]), self.params.get("bias"))
        return out

    def backward(self, dout):
        cache = self._last()
        dout = _dout(self, dout, cache.shape)
        dx, g = L.linear_backward(dout, cache)
        self._set_grads({"weight": _T(g["W"]), **({"bias": g["b"]} if "b" in g else {})})
        return dx


class EmbeddingTwin(_Twin):
    """Twin of ``nn.Embedding(num_embeddings, embedding_dim, padding_idx, ...)``.

    ``forward(input)``: integer ids of any shape S, each in [0, num_embeddings) -> (*S, D).
    ``backward(dout)`` -> None (ids have no gradient); ``grads``: ``weight`` (V, D), dense even
    for ``sparse=True``; zero in row ``padding_idx``; with ``scale_grad_by_freq`` each row's
    gradient is divided by the number of occurrences of its id in the batch, as torch does.
    ``max_norm`` (which rewrites the table during forward) is not supported.
    """

    def __init__(self, module):
        if module.max_norm is not None:
            raise ValueError("max_norm: the twin does not support nn.Embedding(max_norm=...), "
                             "which renormalises rows of the table in place during forward")
        super().__init__(module)
        self.padding_idx = module.padding_idx
        self.scale_grad_by_freq = bool(module.scale_grad_by_freq)

    def forward(self, input):
        weight = self.params["weight"]
        ids = v.token_ids(input, "input", weight.shape[0])
        out, self._cache = L.embedding_forward(ids, weight, self.padding_idx)
        return out

    def backward(self, dout):
        cache = self._last()
        dout = _dout(self, dout, (*cache.ids.shape, self.params["weight"].shape[1]))
        if self.scale_grad_by_freq:
            counts = np.bincount(cache.ids.reshape(-1), minlength=cache.vocab_size)
            dout = dout / counts[cache.ids][..., None].astype(dout.dtype)
        self._set_grads({"weight": L.embedding_backward(dout, cache)["W"]})
        return None


class LayerNormTwin(_Twin):
    """Twin of ``nn.LayerNorm(normalized_shape, eps, elementwise_affine, bias)``.

    ``forward(input)``: input (..., *normalized_shape), normalised over the trailing
    ``normalized_shape`` axes. ``backward(dout)`` -> dinput; ``grads``: ``weight``, ``bias``
    of shape ``normalized_shape`` (when the module has them).
    """

    def __init__(self, module):
        super().__init__(module)
        self.normalized_shape = tuple(module.normalized_shape)
        self.eps = module.eps
        self._p = norm_from_torch(self.params, "")

    def forward(self, input):
        x = self._input(input, "input")
        k = len(self.normalized_shape)
        if x.ndim < k or x.shape[x.ndim - k:] != self.normalized_shape:
            raise ValueError(f"input must have shape (..., *normalized_shape) with "
                             f"normalized_shape = {self.normalized_shape}, got {x.shape}")
        # Normalising over several trailing axes is normalising over one axis of their product.
        x2 = x.reshape(*x.shape[:x.ndim - k], -1)
        out, cache = L.layer_norm_forward(x2, self._p.get("gamma"), self._p.get("beta"), self.eps)
        self._cache = (cache, x.shape, x.dtype)
        return out.reshape(x.shape)

    def backward(self, dout):
        cache, shape, dtype = self._last()
        dout = _dout(self, dout, shape, dtype)
        lead = shape[:len(shape) - len(self.normalized_shape)]
        dx, g = L.layer_norm_backward(dout.reshape(*lead, -1), cache)
        self._set_grads(norm_to_torch(g, "", self.normalized_shape))
        return dx.reshape(shape)


# --------------------------------------------------------------------------------------------
# Multi-head attention


class MultiheadAttentionTwin(_Twin):
    """Twin of ``nn.MultiheadAttention(embed_dim, num_heads, bias, kdim, vdim, batch_first)``.

    ``forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False)`` -> ``(out, weights or None)``:

    - query (B, T, E), key (B, S, kdim), value (B, S, vdim) with ``batch_first``; (T, B, E),
      (S, B, kdim), (S, B, vdim) without; (T, E), (S, kdim), (S, vdim) unbatched;
    - out like query; weights (B, T, S) averaged over heads, or (B, H, T, S) per head (always
      batch first, as torch; (T, S) / (H, T, S) unbatched); None with ``need_weights=False``.

    ``backward(dout, dweights=None)`` -> ``(dquery, dkey, dvalue)``, also when the same array was
    passed three times (torch's gradient of the shared tensor is their sum); ``dweights`` is an
    optional gradient of the returned weights. ``grads``: ``in_proj_weight`` (3E, E) or
    ``q_proj_weight``/``k_proj_weight``/``v_proj_weight``, ``in_proj_bias`` (3E,),
    ``out_proj.weight`` (E, E), ``out_proj.bias`` (E,).

    A query row whose keys are all masked gets zero weights and output ``out_proj.bias``
    (torch: NaN with ``need_weights=True``).
    """

    def __init__(self, module):
        if module.bias_k is not None or module.add_zero_attn:
            raise ValueError("add_bias_kv / add_zero_attn: the twin does not support these "
                             "options of nn.MultiheadAttention")
        super().__init__(module)
        self.embed_dim, self.kdim, self.vdim = module.embed_dim, module.kdim, module.vdim
        self.num_heads = module.num_heads
        if not isinstance(self.num_heads, int) or self.num_heads <= 0 or \
                self.embed_dim % self.num_heads:
            raise ValueError(f"num_heads: embed_dim = {self.embed_dim} must be divisible by "
                             f"num_heads, got num_heads = {self.num_heads}")
        self.batch_first = bool(module.batch_first)
        self._p = mha_from_torch(self.params, "", self.embed_dim)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        bf = self.batch_first
        q = _seq(self, query, "query", self.embed_dim, bf)
        k = _seq(self, key, "key", self.kdim, bf)
        val = _seq(self, value, "value", self.vdim, bf)
        batched = _same_rank(query=query, key=key, value=value)
        b, t, h = q.shape[0], q.shape[1], self.num_heads
        s = k.shape[1]  # batch sizes and key/value lengths are checked by the package
        kpm = _padding_mask(key_padding_mask, "key_padding_mask", b, s, batched)
        am = _attn_mask(attn_mask, "attn_mask", b, h, t, s, batched)
        am = _causal(am, is_causal, kpm, t, s, "attn_mask", "is_causal",
                     override=not need_weights)
        out, w, cache = att.multi_head_attention_forward(
            q, k, val, self._p, h, am, kpm, average_attn_weights=bool(average_attn_weights),
            need_weights=bool(need_weights))
        self._cache = (cache, batched, bool(need_weights), (query.shape, key.shape, value.shape))
        return _unseq(out, batched, bf), (None if w is None else w if batched else w[0])

    def backward(self, dout, dweights=None):
        cache, batched, need_weights, shapes = self._last()
        d = _seq(self, _dout(self, dout, shapes[0]), "dout", self.embed_dim, self.batch_first)
        if dweights is not None:
            if not need_weights:
                raise ValueError("dweights: the last forward returned no weights "
                                 "(need_weights=False)")
            dweights = self._input(dweights, "dweights")
            dweights = dweights if batched else dweights[None]
        dq, dk, dv, g = att.multi_head_attention_backward(d, cache, dweights)
        self._set_grads(mha_to_torch(g, "", packed="in_proj_weight" in self.params))
        return tuple(_unseq(x, batched, self.batch_first) for x in (dq, dk, dv))


# --------------------------------------------------------------------------------------------
# Encoder and decoder layers


class _LayerTwin(_Twin):
    """Common set-up of the layer and stack twins: configuration and sequence checks."""

    def _configure(self, cfg: dict) -> None:
        self.d_model, self.num_heads = cfg["d_model"], cfg["num_heads"]
        self.norm_first, self.activation = cfg["norm_first"], cfg["activation"]
        self.eps, self.batch_first = cfg["eps"], cfg["batch_first"]
        self._kw = {"norm_first": self.norm_first, "activation": self.activation,
                    "eps": self.eps}

    def _seqs(self, **xs):
        """Batch-first views of sequence arguments; checks ranks and batch sizes."""
        out = {n: _seq(self, x, n, self.d_model, self.batch_first) for n, x in xs.items()}
        batched = _same_rank(**xs)
        sizes = {n: x.shape[0] for n, x in out.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"{' and '.join(sizes)} must have the same batch size, got "
                             + ", ".join(f"{n} {s}" for n, s in sizes.items()))
        return (*out.values(), batched)

    def _self_masks(self, x, mask, padding, is_causal, names, batched, heads=None):
        """(attn mask, padding mask) of a self-attention over x, torch's is_causal applied.

        ``names``: the torch names of the mask, the padding mask and the is_causal flag."""
        b, t = x.shape[:2]
        kpm = _padding_mask(padding, names[1], b, t, batched)
        am = _attn_mask(mask, names[0], b, heads or self.num_heads, t, t, batched)
        return _causal(am, is_causal, kpm, t, t, names[0], names[2]), kpm

    def _cross_masks(self, x, mem, mask, padding, is_causal, batched, heads=None):
        b, t, s = x.shape[0], x.shape[1], mem.shape[1]
        kpm = _padding_mask(padding, "memory_key_padding_mask", b, s, batched)
        am = _attn_mask(mask, "memory_mask", b, heads or self.num_heads, t, s, batched)
        return _causal(am, is_causal, kpm, t, s, "memory_mask", "memory_is_causal"), kpm


class TransformerEncoderLayerTwin(_LayerTwin):
    """Twin of ``nn.TransformerEncoderLayer`` (any bias, batch_first, norm_first, activation,
    layer_norm_eps).

    ``forward(src, src_mask=None, src_key_padding_mask=None, is_causal=False)`` -> out, the
    shape of src ((B, T, E) batch-first, (T, B, E) otherwise, or (T, E)).
    ``backward(dout)`` -> dsrc. ``grads``: ``self_attn.in_proj_weight``, ...,
    ``linear1.weight``, ..., ``norm2.bias`` (the names of ``named_parameters()``).
    """

    def __init__(self, module):
        super().__init__(module)
        self._configure(_layer_config(module, "the layer"))
        self._p = layer_from_torch(self.params, "", self.d_model, decoder=False)

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        x, batched = self._seqs(src=src)
        am, kpm = self._self_masks(x, src_mask, src_key_padding_mask, is_causal,
                                   ("src_mask", "src_key_padding_mask", "is_causal"), batched)
        out, cache = B.encoder_layer_forward(x, self._p, self.num_heads, am, kpm, **self._kw)
        self._cache = (cache, batched, src.shape)
        return _unseq(out, batched, self.batch_first)

    def backward(self, dout):
        cache, batched, shape = self._last()
        d = _seq(self, _dout(self, dout, shape), "dout", self.d_model, self.batch_first)
        dx, g = B.encoder_layer_backward(d, cache)
        self._set_grads(layer_to_torch(g, ""))
        return _unseq(dx, batched, self.batch_first)


class TransformerDecoderLayerTwin(_LayerTwin):
    """Twin of ``nn.TransformerDecoderLayer``.

    ``forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False)`` -> out, the
    shape of tgt; memory (B, S, E) / (S, B, E) / (S, E).
    ``backward(dout)`` -> ``(dtgt, dmemory)``. ``grads``: torch names (``self_attn.*``,
    ``multihead_attn.*``, ``linear1.*``, ``linear2.*``, ``norm1.*`` .. ``norm3.*``).
    """

    def __init__(self, module):
        super().__init__(module)
        self._configure(_layer_config(module, "the layer"))
        self._p = layer_from_torch(self.params, "", self.d_model, decoder=True)

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        x, mem, batched = self._seqs(tgt=tgt, memory=memory)
        am, kpm = self._self_masks(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal,
                                   ("tgt_mask", "tgt_key_padding_mask", "tgt_is_causal"),
                                   batched)
        mm, mkpm = self._cross_masks(x, mem, memory_mask, memory_key_padding_mask,
                                     memory_is_causal, batched)
        out, cache = B.decoder_layer_forward(x, mem, self._p, self.num_heads, am, mm, kpm, mkpm,
                                             **self._kw)
        self._cache = (cache, batched, tgt.shape)
        return _unseq(out, batched, self.batch_first)

    def backward(self, dout):
        cache, batched, shape = self._last()
        d = _seq(self, _dout(self, dout, shape), "dout", self.d_model, self.batch_first)
        dx, dmem, g = B.decoder_layer_backward(d, cache)
        self._set_grads(layer_to_torch(g, ""))
        return _unseq(dx, batched, self.batch_first), _unseq(dmem, batched, self.batch_first)


# --------------------------------------------------------------------------------------------
# Stacks and the whole Transformer


class _Stack:
    """An encoder or decoder stack inside a twin: layer params, final norm, forward/backward.

    Shared by the stack twins and the Transformer twin (where it sits under ``encoder.`` /
    ``decoder.``). The final norm is applied here with its own eps, so a stack whose final
    ``nn.LayerNorm`` has an eps different from its layers' is handled exactly.
    """

    def __init__(self, module, P: dict, prefix: str, where: str, decoder: bool):
        self.cfg = _stack_config(module.layers, where)
        e = self.cfg["d_model"]
        self.prefix, self.decoder = prefix, decoder
        self.params = stack_from_torch(P, prefix, len(module.layers), e, decoder,
                                       final_norm=False)
        self.norm_eps = _final_norm(module.norm, where, e)
        self.norm = None if self.norm_eps is None else norm_from_torch(P, prefix + "norm.")
        self.kw = {"norm_first": self.cfg["norm_first"], "activation": self.cfg["activation"],
                   "eps": self.cfg["eps"]}

    def forward(self, x, *args):
        h = self.cfg["num_heads"]
        if self.decoder:
            out, cache = B.decoder_forward(x, args[0], self.params, h, *args[1:], **self.kw)
        else:
            out, cache = B.encoder_forward(x, self.params, h, *args, **self.kw)
        ncache = None
        if self.norm is not None:
            out, ncache = L.layer_norm_forward(out, self.norm.get("gamma"),
                                               self.norm.get("beta"), self.norm_eps)
        return out, (cache, ncache)

    def backward(self, dout, caches):
        """Returns dx, dmemory (decoders; None for encoders) and torch-named grads."""
        cache, ncache = caches
        norm_grads = None
        if ncache is not None:
            dout, norm_grads = L.layer_norm_backward(dout, ncache)
        if self.decoder:
            dx, dmem, g = B.decoder_backward(dout, cache)
        else:
            (dx, g), dmem = B.encoder_backward(dout, cache), None
        grads = stack_to_torch({"layers": g["layers"], "norm": norm_grads}, self.prefix)
        return dx, dmem, grads


class TransformerEncoderTwin(_LayerTwin):
    """Twin of ``nn.TransformerEncoder(encoder_layer, num_layers, norm)``.

    ``forward(src, mask=None, src_key_padding_mask=None, is_causal=None)`` -> out, the shape of
    src. ``backward(dout)`` -> dsrc. ``grads``: ``layers.0.self_attn.in_proj_weight``, ...,
    ``norm.weight``, ``norm.bias``. Computes torch's autograd path, not its no-grad nested-tensor
    fast path (see the module docstring).
    """

    def __init__(self, module):
        super().__init__(module)
        self._stack = _Stack(module, self.params, "", "the encoder", decoder=False)
        self._configure(self._stack.cfg)

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        x, batched = self._seqs(src=src)
        am, kpm = self._self_masks(x, mask, src_key_padding_mask, is_causal,
                                   ("mask", "src_key_padding_mask", "is_causal"), batched)
        out, cache = self._stack.forward(x, am, kpm)
        self._cache = (cache, batched, src.shape)
        return _unseq(out, batched, self.batch_first)

    def backward(self, dout):
        cache, batched, shape = self._last()
        d = _seq(self, _dout(self, dout, shape), "dout", self.d_model, self.batch_first)
        dx, _, grads = self._stack.backward(d, cache)
        self._set_grads(grads)
        return _unseq(dx, batched, self.batch_first)


class TransformerDecoderTwin(_LayerTwin):
    """Twin of ``nn.TransformerDecoder(decoder_layer, num_layers, norm)``.

    ``forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False)`` -> out.
    ``backward(dout)`` -> ``(dtgt, dmemory)``. ``grads``: ``layers.0.*``, ``norm.*``.
    """

    def __init__(self, module):
        super().__init__(module)
        self._stack = _Stack(module, self.params, "", "the decoder", decoder=True)
        self._configure(self._stack.cfg)

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False):
        x, mem, batched = self._seqs(tgt=tgt, memory=memory)
        am, kpm = self._self_masks(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal,
                                   ("tgt_mask", "tgt_key_padding_mask", "tgt_is_causal"),
                                   batched)
        mm, mkpm = self._cross_masks(x, mem, memory_mask, memory_key_padding_mask,
                                     memory_is_causal, batched)
        out, cache = self._stack.forward(x, mem, am, mm, kpm, mkpm)
        self._cache = (cache, batched, tgt.shape)
        return _unseq(out, batched, self.batch_first)

    def backward(self, dout):
        cache, batched, shape = self._last()
        d = _seq(self, _dout(self, dout, shape), "dout", self.d_model, self.batch_first)
        dx, dmem, grads = self._stack.backward(d, cache)
        self._set_grads(grads)
        return _unseq(dx, batched, self.batch_first), _unseq(dmem, batched, self.batch_first)


class TransformerTwin(_LayerTwin):
    """Twin of ``nn.Transformer`` (encoder stack + final norm, decoder stack + final norm).

    ``forward(src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
    src_key_padding_mask=None, tgt_key_padding_mask=None, memory_key_padding_mask=None,
    src_is_causal=None, tgt_is_causal=None, memory_is_causal=False)`` -> out, the shape of tgt.
    src (B, S, E) / (S, B, E) / (S, E), tgt (B, T, E) / (T, B, E) / (T, E).
    ``backward(dout)`` -> ``(dsrc, dtgt)``. ``grads``: ``encoder.layers.0.self_attn.*``, ...,
    ``decoder.norm.bias`` (the names of ``named_parameters()``).
    """

    def __init__(self, module):
        from torch import nn

        if not isinstance(module.encoder, nn.TransformerEncoder) or \
                not isinstance(module.decoder, nn.TransformerDecoder):
            raise ValueError("custom_encoder/custom_decoder must be an nn.TransformerEncoder / "
                             "nn.TransformerDecoder for the twin")
        super().__init__(module)
        self._enc = _Stack(module.encoder, self.params, "encoder.", "the encoder", False)
        self._dec = _Stack(module.decoder, self.params, "decoder.", "the decoder", True)
        if self._enc.cfg["batch_first"] != self._dec.cfg["batch_first"] or \
                self._enc.cfg["d_model"] != self._dec.cfg["d_model"]:
            raise ValueError("the encoder and decoder must have the same d_model and "
                             "batch_first")
        self._configure(self._enc.cfg)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
                src_key_padding_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
                memory_is_causal=False):
        x, y, batched = self._seqs(src=src, tgt=tgt)
        am, kpm = self._self_masks(x, src_mask, src_key_padding_mask, src_is_causal,
                                   ("src_mask", "src_key_padding_mask", "src_is_causal"),
                                   batched)
        # 3-D masks are (batch * num_heads, ., .): the decoder's with the decoder's heads
        h = self._dec.cfg["num_heads"]
        tm, tkpm = self._self_masks(y, tgt_mask, tgt_key_padding_mask, tgt_is_causal,
                                    ("tgt_mask", "tgt_key_padding_mask", "tgt_is_causal"),
                                    batched, heads=h)
        mm, mkpm = self._cross_masks(y, x, memory_mask, memory_key_padding_mask,
                                     memory_is_causal, batched, heads=h)
        memory, ecache = self._enc.forward(x, am, kpm)
        out, dcache = self._dec.forward(y, memory, tm, mm, tkpm, mkpm)
        self._cache = (ecache, dcache, batched, tgt.shape)
        return _unseq(out, batched, self.batch_first)

    def backward(self, dout):
        ecache, dcache, batched, shape = self._last()
        d = _seq(self, _dout(self, dout, shape), "dout", self.d_model, self.batch_first)
        dtgt, dmem, grads = self._dec.backward(d, dcache)
        dsrc, _, egrads = self._enc.backward(dmem, ecache)
        self._set_grads({**grads, **egrads})
        return _unseq(dsrc, batched, self.batch_first), _unseq(dtgt, batched, self.batch_first)
