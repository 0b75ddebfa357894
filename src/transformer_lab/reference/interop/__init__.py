"""NumPy twins of PyTorch modules: ``from_torch(module)``.

A *twin* computes exactly what its torch module computes -- forward and backward -- with the
functions of :mod:`transformer_lab.core`. The modules and options it supports, and its
contract: docs/maintainers.md, "PyTorch twins".

Usage::

    twin = from_torch(module.eval())          # or a module built with dropout=0.0
    out = twin.forward(src, tgt, tgt_mask=mask, src_key_padding_mask=pad)   # NumPy arrays
    dsrc, dtgt = twin.backward(dout)          # gradients of the array inputs, argument order
    twin.grads["encoder.layers.0.self_attn.in_proj_weight"]   # torch name, torch layout

The package, by concern: :mod:`.layout` (torch's parameter names and layouts <-> the core's
parameter dicts, ``*_from_torch`` / ``*_to_torch``), :mod:`.arguments` (torch's sequence layouts
and masks, checked and converted), :mod:`.twins` (the twin classes); here, :func:`from_torch`.
"""

from __future__ import annotations

from transformer_lab.reference.interop.layout import (
    ff_from_torch,
    ff_to_torch,
    layer_from_torch,
    layer_to_torch,
    mha_from_torch,
    mha_to_torch,
    norm_from_torch,
    norm_to_torch,
    stack_from_torch,
    stack_to_torch,
)
from transformer_lab.reference.interop.twins import (
    EmbeddingTwin,
    LayerNormTwin,
    LinearTwin,
    MultiheadAttentionTwin,
    TransformerDecoderLayerTwin,
    TransformerDecoderTwin,
    TransformerEncoderLayerTwin,
    TransformerEncoderTwin,
    TransformerTwin,
)

__all__ = ["from_torch", "LinearTwin", "EmbeddingTwin", "LayerNormTwin",
           "MultiheadAttentionTwin", "TransformerEncoderLayerTwin",
           "TransformerDecoderLayerTwin", "TransformerEncoderTwin", "TransformerDecoderTwin",
           "TransformerTwin", "norm_from_torch", "norm_to_torch", "mha_from_torch",
           "mha_to_torch", "ff_from_torch", "ff_to_torch", "layer_from_torch", "layer_to_torch",
           "stack_from_torch", "stack_to_torch"]


def from_torch(module):
    """A NumPy twin (see the module docstring) of a PyTorch module it lists, float32 or float64,
    on the CPU, built from a copy of its weights. A TypeError for another module type or dtype,
    a ValueError for a module that would apply dropout or an option the twins do not support
    (e.g. ``add_bias_kv``)."""
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
