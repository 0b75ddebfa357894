"""Translation (12_translation): the label-smoothed loss that trains the encoder-decoder, and
beam search that decodes it.

**Label smoothing** (§4), as ``torch.nn.functional.cross_entropy(logits, targets,
label_smoothing=eps, ignore_index=...)``: the target distribution is ``q = (1 - eps) onehot(y) +
eps / V`` -- the ``eps`` spread over all ``V`` classes, the target's included -- so that
``loss_i = (1 - eps) * (-log p_y) + eps * mean_c(-log p_c)``, averaged over the entries whose
target is not ``ignore_index``; its gradient is ``(softmax(logits) - q) / count``.

**Beam search** (§6) keeps the ``K`` best hypotheses of each of ``B`` sources, ``B x K`` rows
through the decoder at every step. A hypothesis's score is its summed log-probability divided by
GNMT's length penalty ``lp(|y|) = ((5 + |y|) / 6) ** alpha`` (Wu et al. 2016): the raw sum
favours short outputs (every token adds a negative term), the mean (``lp = |y|``) favours long
ones; ``alpha`` interpolates (0: the raw sum). A hypothesis that has emitted EOS is finished: it
stays in the beam with its score frozen (extended by one free padding token, never by a real
one) and competes with the live ones, while the others continue; the search ends when all are
finished or after ``max_len`` tokens.

**Decoding with a cache** (§8): run once per new token, the decoder recomputes nothing of the
earlier positions. The keys and values of its self-attention are kept in a cache, one
``(K, V)`` pair per layer, each (rows, H, L, Dh), filled in place; the keys and values of its
cross-attention depend on the memory only and are computed once. The cached step does not mask
padding in the prefix (the uncached decoder does): the two agree as long as a live hypothesis
never emits padding, as a trained model never does.

Shapes: ``B`` sources, ``K`` beam size, ``V`` vocabulary, ``t`` tokens so far, ``E`` width,
``H`` heads, ``Dh = E / H``, ``S`` source positions, ``L`` the positions a cache holds.
"""

from __future__ import annotations

import math

import numpy as np

from transformer_lab.core.attention import attention_forward, causal_mask, merge_masks
from transformer_lab.core.blocks import feed_forward_forward, residual_forward
from transformer_lab.core.layers import (
    layer_norm_forward,
    linear_forward,
    log_softmax_backward,
    log_softmax_forward,
)
from transformer_lab.core.model import embed_forward
from transformer_lab.core.multihead import merge_heads, split_heads

# --------------------------------------------------------------------------------------------
# Label smoothing (12_translation §4)


def label_smoothed_loss_forward(logits, targets, eps, ignore_index=-100):
    """Mean label-smoothed cross-entropy, as ``torch.nn.functional.cross_entropy(logits,
    targets, label_smoothing=eps, ignore_index=ignore_index)``.

    logits: (..., V); targets: integer ids (...); eps: in [0, 1]  ->  loss: a float.
    """
    ### BEGIN SOLUTION 12 §4
    logp, c_logp = log_softmax_forward(logits)  # (..., V)
    keep = targets != ignore_index  # (...)
    safe = np.where(keep, targets, 0)  # any valid id where ignored: its term is dropped
    nll = -np.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]  # (...)
    uniform = -logp.mean(axis=-1)  # cross-entropy with the uniform distribution, (...)
    weight = 1 / keep.sum()
    loss = float((((1 - eps) * nll + eps * uniform) * keep).sum() * weight)
    ### END SOLUTION
    return loss, (c_logp, safe, keep, weight, eps)


def label_smoothed_loss_backward(dloss, cache):
    """Gradient of :func:`label_smoothed_loss_forward`: ``(softmax(logits) - q) * w`` with
    ``q = (1 - eps) onehot(target) + eps / V``, ``w = 1 / count``, 0 on ignored entries.

    dloss: a float (1.0 for the final loss)  ->  dlogits: (..., V).
    """
    c_logp, safe, keep, weight, eps = cache
    ### BEGIN SOLUTION 12 §4
    w = dloss * weight * keep  # (...)
    uniform = (-w * eps / c_logp.shape[-1]).astype(c_logp.dtype)[..., None]  # every class
    target = (uniform - ((1 - eps) * w)[..., None]).astype(c_logp.dtype)  # and the target's
    onehot = np.arange(c_logp.shape[-1]) == safe[..., None]  # (..., V)
    dlogp = np.where(onehot, target, uniform)  # (..., V), the logits' dtype
    return log_softmax_backward(dlogp, c_logp)
    ### END SOLUTION


# --------------------------------------------------------------------------------------------
# Beam search (12_translation §6)


def length_penalty(lengths, alpha):
    """GNMT's length penalty ``((5 + |y|) / 6) ** alpha``, 1 at one token.

    lengths: integers (...); alpha: >= 0 (0: no normalisation)  ->  (...) floats.
    """
    ### BEGIN SOLUTION 12 §6
    return ((5.0 + lengths) / 6.0) ** alpha
    ### END SOLUTION


def beam_step(scores, lengths, finished, logp, alpha, eos_id, pad_id):
    """One step of beam search: every hypothesis times every next token, the ``K`` best of
    each source kept, best first.

    scores: (B, K) summed log-probabilities; lengths: (B, K) tokens so far, EOS included;
    finished: (B, K) bool, EOS emitted; logp: (B, K, V) log-probabilities of the next token
    ->  parents (B, K) (the hypothesis each new one extends), tokens (B, K), and the new scores,
    lengths and finished, all (B, K). A finished hypothesis has one continuation, ``pad_id``,
    with its score and length unchanged. Candidates are ranked by
    ``score / length_penalty(length, alpha)``.
    """
    ### BEGIN SOLUTION 12 §6
    B, K, V = logp.shape
    total = np.where(finished[..., None], -np.inf, scores[..., None] + logp)  # (B, K, V)
    total[..., pad_id] = np.where(finished, scores, total[..., pad_id])  # kept, not extended
    new_lengths = lengths + ~finished  # (B, K): a finished hypothesis does not grow
    rank = total / length_penalty(new_lengths, alpha)[..., None]  # (B, K, V)
    best = np.argsort(-rank.reshape(B, K * V), axis=1, kind="stable")[:, :K]  # (B, K)
    parents, tokens = best // V, best % V
    scores = np.take_along_axis(total.reshape(B, K * V), best, axis=1)
    lengths = np.take_along_axis(new_lengths, parents, axis=1)
    finished = np.take_along_axis(finished, parents, axis=1) | (tokens == eos_id)
    ### END SOLUTION
    return parents, tokens, scores, lengths, finished


def beam_search(step, batch, beam_size, max_len, bos_id, eos_id, pad_id, alpha=0.6):
    """Beam search for ``batch`` sources at once, ``batch * beam_size`` rows through the model.

    step: ``step(prefix, rows) -> logp``, prefix (B*K, t) token ids (row ``b * K + k`` is
    hypothesis ``k`` of source ``b``), rows (B*K,) the row of the previous call's prefix that
    each row extends (for a cache to reorder; the identity at the first call), logp (B*K, V)
    the log-probabilities of each row's next token; max_len: most tokens after BOS
    ->  sequences (B, K, 1 + steps) from BOS, best first (padding after EOS), and their
    scores (B, K), summed log-probability / length penalty.
    """
    B, K = batch, beam_size
    ### BEGIN SOLUTION 12 §7
    seqs = np.full((B, K, 1), bos_id, dtype=np.int64)
    scores = np.full((B, K), -np.inf)
    scores[:, 0] = 0.0  # one live hypothesis to start with, not K copies of it
    lengths = np.zeros((B, K), dtype=np.int64)
    finished = np.zeros((B, K), dtype=bool)
    rows = np.arange(B * K)
    for _ in range(max_len):
        logp = step(seqs.reshape(B * K, -1), rows).reshape(B, K, -1)  # (B, K, V)
        parents, tokens, scores, lengths, finished = beam_step(scores, lengths, finished, logp,
                                                               alpha, eos_id, pad_id)
        seqs = np.concatenate([np.take_along_axis(seqs, parents[..., None], axis=1),
                               tokens[..., None]], axis=2)  # (B, K, t + 1)
        rows = (parents + K * np.arange(B)[:, None]).reshape(-1)
        if finished.all():
            break
    ### END SOLUTION
    return seqs, scores / length_penalty(lengths, alpha)


# --------------------------------------------------------------------------------------------
# The decoder with a cache (12_translation §8)


def memory_keys_values(memory, params, num_heads):
    """The keys and values of one decoder layer's cross-attention. They depend on the memory
    only: a decoder run once per new token computes them once.

    memory: (B, S, E); params: the layer's ``cross_attn``  ->  k, v: (B, H, S, Dh).
    """
    ### BEGIN SOLUTION 12 §8
    k, _ = linear_forward(memory, params["W_k"], params.get("b_k"))  # (B, S, E)
    v, _ = linear_forward(memory, params["W_v"], params.get("b_v"))
    return split_heads(k, num_heads), split_heads(v, num_heads)
    ### END SOLUTION


def cached_self_attention_step(x, params, num_heads, K, V, length):
    """Causal self-attention (packed ``W_qkv``) of ``t`` new positions ``length .. length + t -
    1``: their keys and values are written into the cache, then they attend to every position
    so far.

    x: (B, t, E); K, V: (B, H, L, Dh), the first ``length`` positions filled  ->  out (B, t, E).
    """
    ### BEGIN SOLUTION 12 §8
    qkv, _ = linear_forward(x, params["W_qkv"], params.get("b_qkv"))  # (B, t, 3E)
    q, k, v = (split_heads(a, num_heads) for a in np.split(qkv, 3, axis=-1))  # (B, H, t, Dh)
    end = length + x.shape[1]
    K[:, :, length:end] = k
    V[:, :, length:end] = v
    mask = causal_mask(end)[length:]  # (t, end): new position i is position length + i
    heads, _ = attention_forward(q, K[:, :, :end], V[:, :, :end], mask)  # (B, H, t, Dh)
    out, _ = linear_forward(merge_heads(heads), params["W_o"], params.get("b_o"))
    ### END SOLUTION
    return out


def decoder_layer_step(x, params, config, cache, length, memory_kv, memory_mask=None):
    """``core.blocks.decoder_layer_forward`` for ``t`` new positions: self-attention through the
    layer's cache, cross-attention to the memory's precomputed keys and values, feed-forward.

    x: (B, t, E); config: the model's (it reads ``num_heads``, ``norm_first``, ``activation``
    and ``eps``); cache: this layer's (K, V); memory_kv: from :func:`memory_keys_values`;
    memory_mask: broadcastable to (B, H, t, S) or None  ->  out: (B, t, E).
    """
    c, p = config, params
    ### BEGIN SOLUTION 12 §8
    def attend(h):  # residual_forward takes (out, cache)
        return cached_self_attention_step(h, p["self_attn"], c.num_heads, *cache, length), None

    def cross(h):
        q, _ = linear_forward(h, p["cross_attn"]["W_q"], p["cross_attn"].get("b_q"))
        heads, _ = attention_forward(split_heads(q, c.num_heads), *memory_kv, memory_mask)
        return linear_forward(merge_heads(heads), p["cross_attn"]["W_o"],
                              p["cross_attn"].get("b_o"))

    def feed(h):
        return feed_forward_forward(h, p["ff"], c.activation)

    x, _ = residual_forward(x, attend, p["norm1"], c.norm_first, c.eps)
    x, _ = residual_forward(x, cross, p["norm2"], c.norm_first, c.eps)
    x, _ = residual_forward(x, feed, p["norm3"], c.norm_first, c.eps)
    ### END SOLUTION
    return x


def transformer_decode_step(params, ids, config, caches, length, memory_kvs, pe=None,
                            src_pad=None):
    """``core.model.transformer_decode`` for ``t`` new tokens at positions ``length .. length +
    t - 1``, with the caches of the earlier ones (filled in place).

    ids: (B, t); caches: one (K, V) per decoder layer; memory_kvs: one (k, v) per layer
    (:func:`memory_keys_values`); pe, src_pad: as for ``transformer_decode``
    ->  logits (B, t, V), the new length.
    """
    c = config
    ### BEGIN SOLUTION 12 §8
    scale = math.sqrt(c.d_model) if c.scale_embeddings else 1.0
    positions = params["tgt_pos"]["W"] if "tgt_pos" in params else pe
    if positions is not None:
        positions = positions[length:]  # the rows of the new positions
    y, _ = embed_forward(ids, params["tgt_embed"]["W"], positions, scale)  # (B, t, E)
    mask = merge_masks(None, src_pad)  # (B, 1, 1, S) or None
    for layer, cache, memory_kv in zip(params["decoder"]["layers"], caches, memory_kvs,
                                       strict=True):
        y = decoder_layer_step(y, layer, c, cache, length, memory_kv, mask)
    norm = params["decoder"]["norm"]
    if norm is not None:
        y, _ = layer_norm_forward(y, norm["gamma"], norm.get("beta"), c.eps)
    logits, _ = linear_forward(y, params["out_proj"]["W"], params["out_proj"].get("b"))
    ### END SOLUTION
    return logits, length + ids.shape[1]
