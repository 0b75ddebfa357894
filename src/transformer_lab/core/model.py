"""The encoder-decoder Transformer, end to end: embeddings, the two stacks, the output
projection, the loss and every gradient.

    src ids -> embedding * sqrt(E) + positions -> encoder stack = memory
    tgt ids -> embedding * sqrt(E) + positions -> decoder stack (reads memory) -> logits

``params`` is nested: ``{"src_embed": {"W"}, "tgt_embed": {"W"}, "encoder": <stack>,
"decoder": <stack>, "out_proj": {"W", "b"}}`` (stacks as in ``core.blocks``), plus
``{"src_pos": {"W"}, "tgt_pos": {"W"}}`` when the positions are learned. ``config`` is anything
with the attributes ``num_heads``, ``norm_first``, ``activation``, ``eps``, ``d_model`` and
``scale_embeddings`` (a ``TransformerConfig``).
"""

from __future__ import annotations

import math

import numpy as np

from transformer_lab.core.attention import causal_mask, merge_masks
from transformer_lab.core.blocks import (
    decoder_backward,
    decoder_forward,
    encoder_backward,
    encoder_forward,
)
from transformer_lab.core.layers import (
    cross_entropy_backward,
    cross_entropy_forward,
    embedding_backward,
    embedding_forward,
    linear_backward,
    linear_forward,
)

# --------------------------------------------------------------------------------------------
# Embeddings with positions (08_transformer)


def embed_forward(ids, table, positions=None, scale=1.0):
    """Token embeddings, scaled, plus positions.

    ids: (B, T); table: (V, E); positions: None or (L, E) with L >= T (a fixed sinusoidal
    table, or a learned one); scale: a number  ->  x: (B, T, E).
    """
    ### BEGIN SOLUTION 08 §1
    x, c_embed = embedding_forward(ids, table)  # (B, T, E), a new array
    x *= scale
    if positions is not None:
        x += positions[: ids.shape[1]]  # (T, E) broadcast over the batch
    ### END SOLUTION
    return x, (c_embed, scale, None if positions is None else positions.shape)


def embed_backward(dx, cache):
    """Gradients of :func:`embed_forward`.

    dx: (B, T, E)  ->  dtable: (V, E), dpositions: (L, E) or None. The table's gradient is
    scaled once, V x E numbers instead of B x T x E; a position's gradient sums over the batch.
    """
    c_embed, scale, positions_shape = cache
    ### BEGIN SOLUTION 08 §1
    dtable = embedding_backward(dx, c_embed)["W"]
    dtable *= scale
    dpositions = None
    if positions_shape is not None:
        dpositions = np.zeros(positions_shape, dtype=dx.dtype)
        dpositions[: dx.shape[1]] = dx.sum(axis=0)
    ### END SOLUTION
    return dtable, dpositions


# --------------------------------------------------------------------------------------------
# The model (08_transformer; its backward pass and loss: 09_verification)


def transformer_encode(params, src, config, pe=None, src_pad=None):
    """The encoder side: source embeddings, positions and the encoder stack.

    src: (B, S) token ids; pe: the positional table (L, E), or None (learned positions in
    ``params["src_pos"]``, or none); src_pad: (B, S) bool, True at padding, or None
    ->  memory: (B, S, E).
    """
    c = config
    ### BEGIN SOLUTION 08 §3
    scale = math.sqrt(c.d_model) if c.scale_embeddings else 1.0
    positions = params["src_pos"]["W"] if "src_pos" in params else pe
    x, c_embed = embed_forward(src, params["src_embed"]["W"], positions, scale)
    memory, c_stack = encoder_forward(x, params["encoder"], c.num_heads,
                                      merge_masks(None, src_pad),  # (B, 1, 1, S) or None
                                      c.norm_first, c.activation, c.eps)
    ### END SOLUTION
    return memory, (c_embed, c_stack)


def transformer_decode(params, tgt_in, memory, config, pe=None, src_pad=None, tgt_pad=None):
    """The decoder side: target embeddings, positions, the decoder stack reading the memory,
    and the output projection.

    tgt_in: (B, T) token ids; memory: (B, S, E); src_pad: (B, S), tgt_pad: (B, T) bool or None
    ->  logits: (B, T, V).
    """
    c = config
    ### BEGIN SOLUTION 08 §3
    scale = math.sqrt(c.d_model) if c.scale_embeddings else 1.0
    positions = params["tgt_pos"]["W"] if "tgt_pos" in params else pe
    y, c_embed = embed_forward(tgt_in, params["tgt_embed"]["W"], positions, scale)
    tgt_mask = merge_masks(causal_mask(tgt_in.shape[1]), tgt_pad)  # (B, 1, T, T) or (T, T)
    y, c_stack = decoder_forward(y, memory, params["decoder"], c.num_heads, tgt_mask,
                                 merge_masks(None, src_pad), c.norm_first, c.activation, c.eps)
    logits, c_out = linear_forward(y, params["out_proj"]["W"], params["out_proj"].get("b"))
    ### END SOLUTION
    return logits, (c_embed, c_stack, c_out)


def transformer_forward(params, src, tgt_in, config, pe=None, src_pad=None, tgt_pad=None):
    """Logits for every position of the decoder input: encode, then decode.

    src: (B, S), tgt_in: (B, T) token ids; pe, src_pad, tgt_pad: as for the two halves
    ->  logits: (B, T, V).
    """
    ### BEGIN SOLUTION 08 §3
    memory, c_encode = transformer_encode(params, src, config, pe, src_pad)
    logits, c_decode = transformer_decode(params, tgt_in, memory, config, pe, src_pad, tgt_pad)
    ### END SOLUTION
    return logits, (c_encode, c_decode, "src_pos" in params)


def transformer_backward(dlogits, cache):
    """Gradients of every parameter from the gradient of the logits (B, T, V); nested like
    ``params``. The memory feeds every decoder layer: its gradient flows into the encoder."""
    (c_src, c_enc), (c_tgt, c_dec, c_out), learned = cache
    ### BEGIN SOLUTION 09 §1
    dy, g_out = linear_backward(dlogits, c_out)
    dy, dmemory, g_dec = decoder_backward(dy, c_dec)
    d_tgt_table, d_tgt_pos = embed_backward(dy, c_tgt)
    dx, g_enc = encoder_backward(dmemory, c_enc)
    d_src_table, d_src_pos = embed_backward(dx, c_src)
    grads = {"src_embed": {"W": d_src_table}, "tgt_embed": {"W": d_tgt_table},
             "encoder": g_enc, "decoder": g_dec, "out_proj": g_out}
    if learned:
        grads.update(src_pos={"W": d_src_pos}, tgt_pos={"W": d_tgt_pos})
    ### END SOLUTION
    return grads


def transformer_loss(params, src, tgt_in, labels, config, pe=None, src_pad=None, tgt_pad=None,
                     ignore_index=-1):
    """Mean cross-entropy of the next-token predictions and its gradients.

    labels: (B, T), the token each position must predict (``tgt[:, 1:]``), ``ignore_index``
    where nothing counts (padding)  ->  loss (a float), grads (nested like params).
    """
    ### BEGIN SOLUTION 09 §2
    logits, cache = transformer_forward(params, src, tgt_in, config, pe, src_pad, tgt_pad)
    loss, c_loss = cross_entropy_forward(logits, labels, ignore_index)
    grads = transformer_backward(cross_entropy_backward(1.0, c_loss), cache)
    ### END SOLUTION
    return loss, grads
