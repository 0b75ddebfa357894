"""The decoder-only language model (GPT), built from the pieces of notebooks 00-10 (13_gpt).

    ids (B, T) -> token embedding (+ positions) -> N pre-norm blocks -> norm -> x @ W_out^T
               -> logits (B, T, V): position t predicts the token at t + 1

A block is ``x = x + attn(norm1(x))``, then ``x = x + mlp(norm2(x))`` (``core.blocks``'
residual sublayers), with a causal self-attention (``core.gqa``). Two kinds of block, chosen by
the attributes of ``config``:

- the 2017 / GPT-2 block: ``norm="layer"`` (layer norm), ``mlp="gelu_tanh"`` (the
  feed-forward network of ``core.blocks`` with GELU, GPT-2's tanh form), absolute positions
  added to the embeddings, every key and value head its own (``num_kv_heads == num_heads``);
- the modern (LLaMA-style) block: ``norm="rms"`` (RMSNorm), ``mlp="swiglu"`` (``core.modern``),
  rotary position embeddings (RoPE, ``core.rope``) applied to the queries and keys,
  grouped-query attention (``num_kv_heads`` key/value heads shared by
  ``num_heads / num_kv_heads`` query heads each).

The GPT's other pieces have modules of their own: the loss ``core.next_token``, decoding with a
KV cache ``core.decoding``, sampling ``core.sampling``.

``config`` is anything with the attributes ``num_heads``, ``num_kv_heads``, ``norm``, ``mlp``,
``eps``, ``dropout`` (the blocks' dropout probability, used when training with an ``rng``) and
``attention_block_size`` (None: naive attention; an int: notebook 16's tiled
attention with blocks of that size) -- a ``transformer_lab.models.gpt.GPTConfig``. Parameters
are nested dicts:

- attention ``{"W_qkv": (E, (H + 2 Hkv) Dh), "W_o": (E, E)}`` (+ ``b_qkv``, ``b_o``): the query,
  key and value projections side by side, ``E = H Dh`` query columns then ``Hkv Dh`` key and
  ``Hkv Dh`` value columns (with ``Hkv = H`` this is ``core.multihead``'s packed layout);
- norm ``{"gamma"}`` (+ ``"beta"`` for a layer norm with bias); MLP ``{"W1", "b1", "W2",
  "b2"}`` (as ``core.blocks.feed_forward_forward``); SwiGLU ``{"W_gate", "W_up", "W_down"}``;
- block ``{"norm1", "attn", "norm2", "mlp"}``; model ``{"embed": {"W": (V, E)}, "layers":
  [block, ...], "norm": <norm>}`` plus ``{"pos": {"W": (L, E)}}`` for learned positions. The
  output projection ``W_out`` is the embedding table itself (tied, GPT-2's): its gradient is the
  sum of the two uses; or, when ``params`` has ``{"lm_head": {"W": (V, E)}}``, a table of its
  own (untied, as in most LLaMA-architecture models).

Shapes: ``B`` batch, ``T`` positions, ``E`` width, ``H`` query heads, ``Hkv`` key/value heads,
``Dh = E / H``, ``F`` hidden width of the MLP, ``V`` vocabulary.
"""

from __future__ import annotations

import numpy as np  # noqa: F401 (the functions here compose others: np is yours to use)

from transformer_lab.core.blocks import (
    feed_forward_backward,
    feed_forward_forward,
    residual_backward,
    residual_forward,
)
from transformer_lab.core.gqa import causal_self_attention_backward, causal_self_attention_forward
from transformer_lab.core.layers import (
    dropout_backward,
    dropout_forward,
    layer_norm_backward,
    layer_norm_forward,
    tied_output_backward,
    tied_output_forward,
)
from transformer_lab.core.model import embed_backward, embed_forward
from transformer_lab.core.modern import (
    rms_norm_backward,
    rms_norm_forward,
    swiglu_backward,
    swiglu_forward,
)
from transformer_lab.core.next_token import next_token_loss_backward, next_token_loss_forward

# --------------------------------------------------------------------------------------------
# The pre-norm block (13_gpt §3; RMSNorm and SwiGLU: 15_modern_block §2, §3)


def norm_forward(x, params, kind, eps=1e-5):
    """The block's normalisation: ``kind`` "layer" (layer norm, ``params`` gamma and optional
    beta) or "rms" (RMSNorm, gamma).  x: (..., E)  ->  out: (..., E)."""
    ### BEGIN SOLUTION 13 §3, 15 §2
    if kind == "rms":
        out, cache = rms_norm_forward(x, params["gamma"], eps)
    else:
        out, cache = layer_norm_forward(x, params["gamma"], params.get("beta"), eps)
    ### END SOLUTION
    return out, (kind, cache)


def norm_backward(dout, cache):
    """Gradients of :func:`norm_forward`: dx (..., E), grads (the keys of params)."""
    kind, inner = cache
    ### BEGIN SOLUTION 13 §3, 15 §2
    if kind == "rms":
        return rms_norm_backward(dout, inner)
    return layer_norm_backward(dout, inner)
    ### END SOLUTION


def mlp_forward(x, params, kind):
    """The block's feed-forward network: ``kind`` "swiglu", or an activation of
    ``core.layers.ACTIVATIONS`` ("gelu_tanh", "gelu", "relu") for ``core.blocks``' network.
    x: (..., E)  ->  out: (..., E)."""
    ### BEGIN SOLUTION 13 §3, 15 §3
    if kind == "swiglu":
        out, cache = swiglu_forward(x, params)
    else:
        out, cache = feed_forward_forward(x, params, kind)
    ### END SOLUTION
    return out, (kind, cache)


def mlp_backward(dout, cache):
    """Gradients of :func:`mlp_forward`: dx (..., E), grads (the keys of params)."""
    kind, inner = cache
    ### BEGIN SOLUTION 13 §3, 15 §3
    if kind == "swiglu":
        return swiglu_backward(dout, inner)
    return feed_forward_backward(dout, inner)
    ### END SOLUTION


def gpt_block_forward(x, params, config, rope=None, rng=None):
    """One pre-norm block: ``x = x + attn(norm1(x))``, then ``out = x + mlp(norm2(x))`` -- two
    of notebook 07's residual sublayers, with the block's norm. With ``rng``, training with
    dropout: each sublayer's output is dropped with probability ``config.dropout`` before the
    residual sum (notebook 07 §4); without, no dropout.

    x: (B, T, E); params: norm1, attn, norm2, mlp; rope: None or (cos, sin) (T, Dh/2);
    rng: None or a ``np.random.Generator``  ->  out: (B, T, E).
    """
    c = config
    ### BEGIN SOLUTION 13 §3
    def norm(h, p, eps):  # the block's norm: layer norm or RMSNorm
        return norm_forward(h, p, c.norm, eps)

    def dropped(sublayer):  # the sublayer, then dropout on its output (identity without rng)
        def run(h):
            out, cache = sublayer(h)
            out, c_drop = dropout_forward(out, c.dropout, rng, train=rng is not None)
            return out, (cache, c_drop)
        return run

    def attend(h):
        return causal_self_attention_forward(h, params["attn"], c.num_heads, c.num_kv_heads,
                                             rope, c.attention_block_size)

    def mlp(h):
        return mlp_forward(h, params["mlp"], c.mlp)

    x, c_attn = residual_forward(x, dropped(attend), params["norm1"], True, c.eps, norm)
    out, c_mlp = residual_forward(x, dropped(mlp), params["norm2"], True, c.eps, norm)
    ### END SOLUTION
    return out, (c_attn, c_mlp)


def gpt_block_backward(dout, cache):
    """Gradients of :func:`gpt_block_forward`: two residual sublayers, backwards.
    dout: (B, T, E)  ->  dx (B, T, E), grads (nested like params)."""
    c_attn, c_mlp = cache
    ### BEGIN SOLUTION 13 §3
    def dropped(sublayer_backward):  # dropout's backward first: its output came last
        def run(dout, cache):
            inner, c_drop = cache
            return sublayer_backward(dropout_backward(dout, c_drop), inner)
        return run

    dx, g_norm2, g_mlp = residual_backward(dout, c_mlp, dropped(mlp_backward), norm_backward)
    dx, g_norm1, g_attn = residual_backward(dx, c_attn, dropped(causal_self_attention_backward),
                                            norm_backward)
    ### END SOLUTION
    return dx, {"norm1": g_norm1, "attn": g_attn, "norm2": g_norm2, "mlp": g_mlp}


# --------------------------------------------------------------------------------------------
# The model, with tied (or untied) input and output embeddings (13_gpt §3)


def gpt_forward(params, ids, config, pe=None, rope=None, rng=None):
    """Logits of the next token at every position.

    ids: (B, T) token ids; pe: None or a fixed table of absolute positions (L >= T, E) added to
    the embeddings (used when ``params`` has no learned ``"pos"``); rope: None or (cos, sin)
    (T, Dh/2); rng: None, or a ``np.random.Generator`` for the blocks' dropout (training)
    ->  logits: (B, T, V) = norm(blocks(embed(ids))) @ W_out^T, ``W_out`` the table of
    ``params["lm_head"]`` (untied) if there is one, else the embedding table (tied).
    """
    ### BEGIN SOLUTION 13 §3
    positions = params["pos"]["W"] if "pos" in params else pe
    x, c_embed = embed_forward(ids, params["embed"]["W"], positions)  # (B, T, E)
    c_layers = []
    for layer in params["layers"]:
        x, c_layer = gpt_block_forward(x, layer, config, rope, rng)
        c_layers.append(c_layer)
    x, c_norm = norm_forward(x, params["norm"], config.norm, config.eps)
    W_out = params.get("lm_head", params["embed"])["W"]  # untied, or the embeddings (tied)
    logits, c_out = tied_output_forward(x, W_out)  # x @ W_out^T: (B, T, V)
    ### END SOLUTION
    return logits, (c_embed, c_layers, c_norm, c_out, "pos" in params, "lm_head" in params)


def gpt_backward(dlogits, cache):
    """Gradients of every parameter from the gradient of the logits (B, T, V), nested like
    ``params``. A tied table ``W_emb`` is used twice, so its gradient is the sum of the
    embedding's and the output projection's; an untied head's gradient is its own."""
    c_embed, c_layers, c_norm, c_out, learned, untied = cache
    ### BEGIN SOLUTION 13 §3
    dx, g_out = tied_output_backward(dlogits, c_out)  # g_out["W"]: (V, E), the output table's
    dx, g_norm = norm_backward(dx, c_norm)
    g_layers = []
    for c_layer in reversed(c_layers):
        dx, g = gpt_block_backward(dx, c_layer)
        g_layers.insert(0, g)
    d_table, d_pos = embed_backward(dx, c_embed)
    grads = {"embed": {"W": d_table}, "layers": g_layers, "norm": g_norm}
    if untied:
        grads["lm_head"] = g_out
    else:
        d_table += g_out["W"]  # tied: the two uses of the table add up
    if learned:
        grads["pos"] = {"W": d_pos}
    ### END SOLUTION
    return grads


def gpt_loss(params, ids, config, pe=None, rope=None, rng=None):
    """The next-token loss of a batch and its gradients (``rng``: training with dropout, as
    :func:`gpt_forward`).

    ids: (B, T)  ->  loss (a float, :func:`next_token_loss_forward`), grads (nested like params).
    """
    ### BEGIN SOLUTION 13 §3
    logits, cache = gpt_forward(params, ids, config, pe, rope, rng)
    loss, c_loss = next_token_loss_forward(logits, ids)
    grads = gpt_backward(next_token_loss_backward(1.0, c_loss), cache)
    ### END SOLUTION
    return loss, grads
