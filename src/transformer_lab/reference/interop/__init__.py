"""NumPy twins of PyTorch modules: ``from_torch(module)``.

A *twin* computes exactly what its torch module computes -- forward and backward -- with the
functions of :mod:`transformer_lab.core`, the code the course's student writes. It is a thin
boundary, not a framework: it checks its arguments once, converts them (sequence layout, masks,
``is_causal``), weights (torch layout to NumPy layout) and gradients (back to torch layout), and
calls the core (``python -m transformer_lab.course.bench`` times the layer and stack twins
against torch).

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
  no NaN reaches any output or gradient (``core.layers.softmax_forward``). This is what torch
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
- **Masks.** The core takes one mask per attention: a twin merges ``attn_mask`` and
  ``key_padding_mask`` into it -- their union when both are boolean, else their sum as additive
  float masks (True -> -inf), as torch does. A float mask holding NaN or +inf is refused.

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
    """A NumPy twin of a PyTorch module, built from a copy of its weights.

    Args:
        module: one of the modules the module docstring lists; float32 or float64, on the CPU,
            not applying dropout.

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
