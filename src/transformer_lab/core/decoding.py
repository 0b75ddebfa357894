"""Decoding with a KV cache (14_decoding §2): the GPT's forward pass for new positions only, reading
the keys and values of the earlier ones from a cache, one per layer, filled in place.
Inference: no backward.

Shapes: ``B`` batch, ``t`` new positions, ``E`` width, ``H`` query heads, ``Hkv`` key/value
heads, ``Dh = E / H``, ``V`` vocabulary, ``S_max`` the positions a cache holds.
"""

from __future__ import annotations

import numpy as np  # noqa: F401 (the functions here compose others: np is yours to use)

from transformer_lab.core.attention import attention_forward, causal_mask
from transformer_lab.core.blocks import residual_forward
from transformer_lab.core.gpt import mlp_forward, norm_forward
from transformer_lab.core.gqa import repeat_kv_forward
from transformer_lab.core.layers import tied_output_forward
from transformer_lab.core.model import embed_forward
from transformer_lab.core.multihead import self_attention_forward
from transformer_lab.core.rope import rope_forward

# --------------------------------------------------------------------------------------------
# The KV cache (14_decoding §2)


def kv_cache_append(K, V, length, k, v):
    """Write the keys and values of new positions into a layer's cache.

    K, V: (B, Hkv, S_max, Dh), allocated once, the first ``length`` positions filled;
    k, v: (B, Hkv, t, Dh), positions ``length .. length + t - 1``
    ->  the filled part of the cache, K[:, :, :length + t] and V[...] (views), and length + t.
    """
    ### BEGIN SOLUTION 14 §2
    end = length + k.shape[2]
    K[:, :, length:end] = k
    V[:, :, length:end] = v
    return K[:, :, :end], V[:, :, :end], end
    ### END SOLUTION


def causal_self_attention_step(x, params, num_heads, num_kv_heads, K, V, length, rope=None):
    """:func:`core.gqa.causal_self_attention_forward` for ``t`` new positions
    ``length .. length + t - 1`` only, reading the keys and values of the earlier positions from
    the cache (and adding theirs): notebook 04's packed self-attention with a kernel that attends
    to the cache.

    x: (B, t, E); K, V: this layer's cache; rope: None or (cos, sin) (t, Dh/2) of the new
    positions  ->  out: (B, t, E), the new length.
    """
    ### BEGIN SOLUTION 14 §2, 15 §4
    n_rep = num_heads // (num_kv_heads or num_heads)  # query heads per key/value head

    def attend(q, k, v):  # the new positions: q (B, H, t, Dh); k, v (B, Hkv, t, Dh)
        if rope is not None:
            q, _ = rope_forward(q, *rope)
            k, _ = rope_forward(k, *rope)
        keys, values, end = kv_cache_append(K, V, length, k, v)  # (B, Hkv, end, Dh)
        if n_rep > 1:  # shared key/value heads (notebook 15 §4)
            keys, _ = repeat_kv_forward(keys, n_rep)  # (B, H, end, Dh)
            values, _ = repeat_kv_forward(values, n_rep)
        mask = causal_mask(end)[length:]  # (t, end): new position i is position length + i
        return attention_forward(q, keys, values, mask)  # (B, H, t, Dh)

    out, _ = self_attention_forward(x, params, num_heads, attend=attend,
                                    num_kv_heads=num_kv_heads)  # (B, t, E)
    ### END SOLUTION
    return out, length + x.shape[1]


def gpt_block_step(x, params, config, K, V, length, rope=None):
    """:func:`core.gpt.gpt_block_forward` for ``t`` new positions, with this layer's cache:
    the same residual sublayers and norm, :func:`causal_self_attention_step` as the attention.

    x: (B, t, E); K, V: this layer's cache; rope: as for :func:`causal_self_attention_step`
    ->  out: (B, t, E), the new length.
    """
    c = config
    ### BEGIN SOLUTION 14 §2
    def norm(h, p, eps):  # the block's norm: layer norm or RMSNorm
        return norm_forward(h, p, c.norm, eps)

    def attend(h):  # the cache's step returns the new length where a cache would be
        return causal_self_attention_step(h, params["attn"], c.num_heads, c.num_kv_heads, K, V,
                                          length, rope)

    def mlp(h):
        return mlp_forward(h, params["mlp"], c.mlp)

    x, _ = residual_forward(x, attend, params["norm1"], True, c.eps, norm)  # (B, t, E)
    out, _ = residual_forward(x, mlp, params["norm2"], True, c.eps, norm)  # (B, t, E)
    ### END SOLUTION
    return out, length + x.shape[1]


def gpt_step(params, ids, config, kv_caches, length, pe=None, rope=None):
    """Logits of ``t`` new tokens at positions ``length .. length + t - 1``, given the caches
    of the earlier ones (filled in place).

    ids: (B, t); kv_caches: one ``(K, V)`` per layer, each (B, Hkv, S_max, Dh); pe: as for
    :func:`core.gpt.gpt_forward`; rope: None or (cos, sin) (t, Dh/2) of the new positions
    ->  logits (B, t, V), the new length.
    """
    c = config
    ### BEGIN SOLUTION 14 §2
    positions = params["pos"]["W"] if "pos" in params else pe
    if positions is not None:
        positions = positions[length:]  # the rows of the new positions
    x, _ = embed_forward(ids, params["embed"]["W"], positions)  # (B, t, E)
    for layer, (K, V) in zip(params["layers"], kv_caches, strict=True):
        x, end = gpt_block_step(x, layer, c, K, V, length, rope)  # (B, t, E)
    x, _ = norm_forward(x, params["norm"], c.norm, c.eps)
    logits, _ = tied_output_forward(x, params.get("lm_head", params["embed"])["W"])  # (B, t, V)
    ### END SOLUTION
    return logits, end
