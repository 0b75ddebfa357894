"""The layout conversion: torch parameter names and layouts <-> the core's parameter dicts.

The one mapping between the parameters of ``nn.LayerNorm``, ``nn.MultiheadAttention`` and the
``nn.Transformer`` layers and stacks (torch names; Linear weights (out, in)) and the parameter
dicts of :mod:`transformer_lab.core` (NumPy layout, ``W`` of shape (in, out); see
``core.multihead`` and ``core.blocks``). ``*_from_torch(P, prefix, ...)`` reads the torch-named
arrays ``P[prefix + name]`` and returns the core's dict, made of views of them (no copies);
``*_to_torch(p, prefix)`` is the inverse and applies to parameters and to gradients alike.

The twins (:mod:`transformer_lab.reference.interop.twins`) use it for their weights and gradients;
:mod:`transformer_lab.reference.torch_transformer` to move the NumPy Transformer's weights into
``nn.Transformer`` and ``nn.Transformer``'s gradients back.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = ["norm_from_torch", "norm_to_torch", "mha_from_torch", "mha_to_torch",
           "ff_from_torch", "ff_to_torch", "layer_from_torch", "layer_to_torch",
           "stack_from_torch", "stack_to_torch"]


def _T(a: np.ndarray) -> np.ndarray:
    """torch (out, in) <-> NumPy (in, out): a view, no copy."""
    return a.T


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
        if p.get(key) is not None:
            out[prefix + name] = p[key] if shape is None else p[key].reshape(shape)
    return out


def mha_from_torch(P: Mapping[str, np.ndarray], prefix: str, e: int,
                   split: bool = False) -> dict:
    """``nn.MultiheadAttention`` weights -> the parameter dict of ``core.multihead``.

    ``in_proj_weight`` (3E, E) is ``W_qkv`` (E, 3E) transposed, for
    ``self_attention_forward`` -- or, with ``split``, the three column blocks ``W_q, W_k, W_v``
    (E, E) of it, for ``multi_head_attention_forward`` (cross-attention, or queries, keys and
    values that are different arrays). With kdim/vdim != E torch has ``q_proj_weight``,
    ``k_proj_weight``, ``v_proj_weight`` instead. ``in_proj_bias`` (3E,) is ``b_qkv``, or
    ``b_q, b_k, b_v`` with separate weights. ``out_proj`` is ``W_o`` (E, E), ``b_o``. Every
    array is a view of torch's.
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
    (``split_cross``: the cross-attention's input projections as ``W_q, W_k, W_v``, as
    ``core.blocks.decoder_layer_forward`` takes them)."""
    p = {"self_attn": mha_from_torch(P, prefix + "self_attn.", e), "ff": ff_from_torch(P, prefix)}
    if decoder:
        p["cross_attn"] = mha_from_torch(P, prefix + "multihead_attn.", e, split=split_cross)
    for norm in ("norm1", "norm2", "norm3")[:2 + decoder]:
        # a norm without affine parameters: gamma None (the core's blocks read the key)
        p[norm] = {"gamma": None, **norm_from_torch(P, f"{prefix}{norm}.")}
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
    "norm": {"gamma", "beta"}}`` as ``core.blocks.encoder_forward`` takes it
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
