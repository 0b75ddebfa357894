"""Checks of notebook 04_multihead_attention: heads, multi-head attention with separate and
packed projections, the merged mask, and the notebook's grouped-query variants.

The references are PyTorch's: ``nn.MultiheadAttention`` for the layers (our ``(in, out)``
weights copied in transposed, notebook 01 section 8), tensor ``view``/``transpose`` for the
heads, ``F.scaled_dot_product_attention(enable_gqa=True)`` and PyTorch's FLOP counter for the
grouped-query exercises. The hints compute the classic wrong answers with PyTorch as well,
but for the heads' and the mask's, which are NumPy reshapes and broadcasts of the input.
"""

from __future__ import annotations

import functools
import math
import numbers

import numpy as np

from transformer_lab.checks._torch_helpers import _t, torch
from transformer_lab.checks.framework import Case, Check, later_rng, normals
from transformer_lab.reference.interop import layout

# --------------------------------------------------------------------------------------------
# Inputs shared by the checks (plain data: the cases hold arrays, never modules)


def mha_case_params(rng, e, kdim=None, vdim=None, bias=True, packed=False, dtype=np.float64):
    """Random parameters of multi-head attention in the core's layout (biases not zero, so that
    a wrong bias shows). ``bias``: True (all), False (none), "in" (the input projections' only)
    or "out" (``b_o`` only)."""
    kdim, vdim = kdim or e, vdim or e
    scale = 1 / math.sqrt(e)
    if packed:
        p = {"W_qkv": rng.standard_normal((e, 3 * e)) * scale}
    else:
        p = {"W_q": rng.standard_normal((e, e)) * scale,
             "W_k": rng.standard_normal((kdim, e)) / math.sqrt(kdim),
             "W_v": rng.standard_normal((vdim, e)) / math.sqrt(vdim)}
    p["W_o"] = rng.standard_normal((e, e)) * scale
    if bias and bias != "out":
        for name in ("qkv",) if packed else "qkv":  # b_qkv: the three biases side by side
            p[f"b_{name}"] = 0.1 * rng.standard_normal(len(name) * e)
    if bias and bias != "in":
        p["b_o"] = 0.1 * rng.standard_normal(e)
    return {k: v.astype(dtype) for k, v in p.items()}


def mha_case(rng, name, b, t, s, e, h, kdim=None, vdim=None, bias=True, dtype=np.float64,
             mask=None, self_attention=False, packed=False, backward=False, dweights=False):
    """A case of multi-head attention: query (B, T, E), key and value (B, S, kdim | vdim) -- the
    query itself, for self-attention -- or, ``packed``, x (B, T, E) alone (packed projections,
    S = T); the parameters, the number of heads; for a backward pass (notebook 05) dout and,
    with ``dweights``, a gradient of the weights (B, H, T, S) after them."""
    query = rng.standard_normal((b, t, e))
    key, value = ((query, query) if self_attention or packed
                  else normals(rng, (b, s, kdim or e), (b, s, vdim or e)))
    params = mha_case_params(rng, e, kdim, vdim, bias, packed, dtype)
    arrays = tuple(a.astype(dtype) for a in ((query,) if packed else (query, key, value)))
    if not backward:
        return Case(name, (*arrays, params, h), {"mask": mask})
    dout = rng.standard_normal((b, t, e)).astype(dtype)
    dw = rng.standard_normal((b, h, t, s)).astype(dtype) if dweights else None
    if self_attention:
        arrays = (arrays[0],) * 3
    return Case(name, (*arrays, params, h, dout), {"mask": mask, "dweights": dw})


def self_attention_case(rng, name, b, t, e, h, **options):
    """:func:`mha_case` of self-attention with packed projections: x (B, T, E), the parameters,
    the number of heads (and dout, dweights for a backward pass)."""
    return mha_case(rng, name, b, t, t, e, h, packed=True, **options)


def blocked_rows_mask(rng, b, t, s):
    """A bool mask (B, 1, T, S), True = blocked: random, and query 0 of sequence 0 sees no key
    at all (a fully blocked row)."""
    mask = rng.random((b, 1, t, s)) < 0.3
    mask[0, 0, 0] = True
    return mask


# --------------------------------------------------------------------------------------------
# PyTorch references (and the classic mistakes, written in PyTorch too)


def torch_mha_forward(query, key, value, params, num_heads, mask=None):
    """``nn.MultiheadAttention(batch_first=True)`` in eval mode holding ``params`` (separate or
    packed ``W_qkv``, any key/value widths, every bias or none), loaded through
    ``interop.layout``, run with the boolean mask (True = blocked) as :func:`torch_mask`; the
    output as a NumPy array of the inputs' dtype. A fully blocked query row gets the output bias
    (PyTorch with need_weights=False)."""
    (b, t, e), s = query.shape, key.shape[1]
    mha = torch.nn.MultiheadAttention(e, num_heads, bias="b_o" in params, batch_first=True,
                                      kdim=key.shape[-1], vdim=value.shape[-1],
                                      dtype=getattr(torch, query.dtype.name)).eval()
    state = layout.mha_to_torch(params, "", packed=mha._qkv_same_embed_dim)
    mha.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
    with torch.no_grad():
        out, _ = mha(_t(query), _t(key), _t(value), attn_mask=torch_mask(mask, b, num_heads, t, s),
                     need_weights=False)
    return out.numpy()


def torch_mask(mask, b, h, t, s):
    """The core's merged bool mask (broadcastable to (B, H, T, S)) as torch's 3-D attn_mask."""
    if mask is None:
        return None
    return _t(np.broadcast_to(mask, (b, h, t, s)).reshape(b * h, t, s))


def torch_softmax_rows(scores, mask=None):
    """Softmax over the last axis of a torch tensor, with the core's conventions: a bool mask
    (True = blocked) puts -inf, a float mask is added; a row with no finite entry gets zeros
    (and passes no gradient)."""
    if mask is not None:
        m = torch.from_numpy(np.asarray(mask))
        scores = scores.masked_fill(m, -math.inf) if m.dtype == torch.bool else scores + m
    blocked = torch.isneginf(scores).all(dim=-1, keepdim=True)  # rows with nothing to attend
    scores = scores.masked_fill(blocked, 0.0)
    return torch.softmax(scores, dim=-1) * (~blocked)


def torch_heads(query, key, value, params, num_heads, mask=None, scale=None, split="heads",
                project_out=True, transpose_weights=False):
    """Multi-head attention written out in PyTorch on tensors (``params`` in the core's layout:
    separate projections, or packed ``W_qkv`` applied to ``query``), with knobs that reproduce
    classic mistakes: ``scale`` (default 1/sqrt(d_h)), ``split`` ("heads": reshape (B, T, H,
    d_h) then swap; "no swap": reshape straight to (B, H, T, d_h); "interleaved": W_qkv cut per
    head as [q_i | k_i | v_i]), ``project_out`` (False: no W_o), ``transpose_weights`` (x @
    W.T). Returns the output, the weights (B, H, T, S) and the projections (q, k, v), or (qkv,)."""
    e = query.shape[-1]
    h, d_h = num_heads, e // num_heads

    def lin(x, name):
        w = params[f"W_{name}"]
        y = x @ (w.T if transpose_weights else w)
        return y + params[f"b_{name}"] if f"b_{name}" in params else y

    def heads(x, width=d_h):
        b, n, _ = x.shape
        if split == "no swap":
            return x.reshape(b, h, n, width)
        return x.reshape(b, n, h, width).transpose(1, 2)

    if "W_qkv" in params:
        projected = (lin(query, "qkv"),)
        if split == "interleaved":  # each head's [q_i | k_i | v_i] side by side
            q, k, v = heads(projected[0], 3 * d_h).split(d_h, dim=-1)
        else:
            q, k, v = (heads(x) for x in projected[0].split(e, dim=-1))
    else:
        projected = lin(query, "q"), lin(key, "k"), lin(value, "v")
        q, k, v = (heads(x) for x in projected)
    scores = (q / math.sqrt(d_h) if scale is None else q * scale) @ k.transpose(-1, -2)
    weights = torch_softmax_rows(scores, mask)
    o = weights @ v  # (B, H, T, d_h)
    merged = (o if split == "no swap" else o.transpose(1, 2)).reshape(query.shape)
    return (lin(merged, "o") if project_out else merged), weights, projected


def torch_heads_forward(query, key, value, params, num_heads, mask=None, part=0, **knobs):
    """:func:`torch_heads` on NumPy inputs, its output (``part`` 1: its weights) as a NumPy
    array."""
    tensors = {name: _t(a) for name, a in params.items()}
    out = torch_heads(_t(query), _t(key), _t(value), tensors, num_heads, mask, **knobs)[part]
    return out.numpy()


# --------------------------------------------------------------------------------------------
# Heads


#: The output of check-split-heads that says whether the heads share x's memory.
VIEW = "a view of x (the text: no copy that is not needed)"


class SplitHeads(Check, id="check-split-heads", functions=("split_heads",)):
    axes = {"output": "bhtd"}  # axis names, for messages
    loop_free = {"split_heads": "one reshape, then one transpose"}

    def cases(self, rng):
        yield Case("B = 2, T = 3, E = 8, 2 heads", (rng.standard_normal((2, 3, 8)), 2))
        yield Case("one head (h = 1)", (rng.standard_normal((2, 4, 6)), 1))
        yield Case("heads = width (h = E = 6, d_h = 1)", (rng.standard_normal((2, 3, 6)), 6))
        yield Case("batch of 1, length 1", (rng.standard_normal((1, 1, 8)), 4))
        yield Case("float32, 3 heads", (rng.standard_normal((2, 5, 12)).astype(np.float32), 3))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("T = 7, E = 24, 4 heads", (rng.standard_normal((3, 7, 24)), 4))
        yield Case("a non-contiguous input (a transposed array)",
                   (np.ascontiguousarray(rng.standard_normal((6, 2, 4))).transpose(1, 0, 2), 2))
    ### END HIDDEN TESTS

    def run(self, f, x, num_heads):
        out = f.split_heads(x, num_heads)
        # of a contiguous x, which a reshape and a transpose never copy (others may need one)
        return {"output": np.array(out),
                VIEW: bool(np.shares_memory(out, x) or not x.flags.c_contiguous)}

    def expected(self, x, num_heads):
        b, t, e = x.shape
        heads = torch.from_numpy(x).reshape(b, t, num_heads, e // num_heads).transpose(1, 2)
        return {"output": heads.contiguous().numpy(), VIEW: True}

    def mistakes(self, x, num_heads):
        b, t, e = x.shape
        h, d = num_heads, e // num_heads
        right = self.expected(x, num_heads)
        return {"reshaping straight to (B, H, T, d_h), without swapping the time and head axes":
                lambda: {"output": x.reshape(b, h, t, d)},
                "cutting the features as (d_h, H) instead of (H, d_h): head i then gets "
                "features i, i + H, i + 2H, ... instead of its block of d_h neighbours":
                lambda: {"output": x.reshape(b, t, d, h).transpose(0, 3, 1, 2)},
                "copying the heads (np.ascontiguousarray, .copy(), np.stack): a reshape and a "
                "transpose give a view of x, and nothing here needs more":
                lambda: {**right, VIEW: False}}


class MergeHeads(Check, id="check-merge-heads", functions=("merge_heads",)):
    axes = {"output": "bte"}  # axis names, for messages
    loop_free = {"merge_heads": "one transpose, then one reshape"}

    def cases(self, rng):
        yield Case("B = 2, 2 heads, T = 3, d_h = 4", (rng.standard_normal((2, 2, 3, 4)),))
        yield Case("one head (h = 1)", (rng.standard_normal((2, 1, 4, 6)),))
        yield Case("heads = width (d_h = 1)", (rng.standard_normal((2, 6, 3, 1)),))
        yield Case("batch of 1, length 1", (rng.standard_normal((1, 4, 1, 2)),))
        yield Case("float32, 3 heads", (rng.standard_normal((2, 3, 5, 4)).astype(np.float32),))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("4 heads, T = 7, d_h = 6", (rng.standard_normal((3, 4, 7, 6)),))
    ### END HIDDEN TESTS

    def run(self, f, x):
        return np.array(f.merge_heads(x))

    def expected(self, x):
        b, h, t, d = x.shape
        return torch.from_numpy(x).transpose(1, 2).reshape(b, t, h * d).numpy()

    def mistakes(self, x):
        b, h, t, d = x.shape
        return {"reshaping to (B, T, E) without first swapping the head and time axes back":
                lambda: x.reshape(b, t, h * d),
                "ordering the features as (d_h, H) instead of (H, d_h): the heads interleaved "
                "instead of side by side":
                lambda: x.transpose(0, 2, 3, 1).reshape(b, t, h * d)}


# --------------------------------------------------------------------------------------------
# Multi-head attention, separate projections


class _LayerForward(Check):
    """The forward checks of multi-head attention and self-attention: the output, against
    :func:`torch_mha_forward` on the case's inputs as :meth:`_inputs` gives them."""

    axes = {"output": "bte"}  # axis names, for messages

    def _inputs(self, *args):
        """query, key, value, params, num_heads of a case's positional arguments."""
        return args

    def expected(self, *args, mask=None):
        return torch_mha_forward(*self._inputs(*args), mask)

    def mistakes(self, *args, mask=None):
        query, key, value, params, num_heads = self._inputs(*args)
        inputs = (query, key, value, params, num_heads, mask)
        found = {"without the scale 1/sqrt(d_h) on the scores":
                 lambda: torch_heads_forward(*inputs, scale=1.0),
                 "splitting the features by a reshape straight to (B, H, T, d_h), without "
                 "swapping the time and head axes":
                 lambda: torch_heads_forward(*inputs, split="no swap"),
                 "without the output projection W_o, b_o":
                 lambda: torch_heads_forward(*inputs, project_out=False)}
        if num_heads > 1:
            found["scaling the scores by 1/sqrt(E) instead of 1/sqrt(d_h) = 1/sqrt(E/H)"] = (
                lambda: torch_heads_forward(*inputs, scale=1 / math.sqrt(query.shape[-1])))
        if mask is not None:
            found["without the mask (pass mask on to attention)"] = \
                lambda: torch_heads_forward(*inputs[:5])
        for bias in ("b_o", "b_qkv"):
            if bias in params:
                found[f"without the bias {bias}"] = functools.partial(
                    torch_heads_forward, query, key, value,
                    {k: p for k, p in params.items() if k != bias}, num_heads, mask)
        if all(w.shape[0] == w.shape[1] for k, w in params.items() if k.startswith("W_")):
            found["with every weight transposed (x @ W.T: PyTorch's (out, in) layout, not "
                  "ours)"] = lambda: torch_heads_forward(*inputs, transpose_weights=True)
        given = dict(zip("qkv", (query, key, value), strict=True))
        for wrong, (weights, sources) in PROJECTION_MISTAKES.items():
            found[wrong] = functools.partial(torch_heads_forward, *(given[c] for c in sources),
                                             _projections(params, weights), num_heads, mask)
        return found


#: mistakes of which projection makes q, k and v: what each is -> the weights and the inputs
#: (of query, key, value) that q, k and v come from
PROJECTION_MISTAKES = {
    "with the keys and the values swapped (k = key W_k, v = value W_v; in W_qkv: the queries' "
    "columns, then the keys', then the values')": ("qvk", "qvk"),
    "with W_q for the keys too (k = key W_k)": ("qqv", "qkv"),
    "with the queries and the keys swapped (q = query W_q, k = key W_k; in W_qkv the "
    "queries' columns come first)": ("kqv", "kqv")}


def _projections(params, order: str) -> dict:
    """``params`` whose q, k and v projections are those named by ``order`` ("qvk": the values'
    for the keys and the keys' for the values), W_qkv's column blocks or W_q, W_k, W_v (and
    their biases)."""
    if "W_qkv" not in params:
        return {**params, **{f"{kind}_{new}": params[f"{kind}_{old}"]
                             for new, old in zip("qkv", order, strict=True) for kind in "Wb"
                             if f"{kind}_{old}" in params}}
    blocks = {k: dict(zip("qkv", np.split(params[k], 3, axis=-1), strict=True))
              for k in ("W_qkv", "b_qkv") if k in params}
    return {**params, **{k: np.concatenate([b[c] for c in order], axis=-1)
                         for k, b in blocks.items()}}


#: The outputs of check-mha-forward that read the cache: the attention weights, and what the
#: three input projections' caches hold with the number of heads.
CACHED = "c_att's weights (the cache's 4th entry)"
CACHED_INPUTS = "the cache's c_q, c_k, c_v inputs and num_heads"


def _cached_inputs(cache):
    """[the input of c_q, of c_k, of c_v, num_heads] of multi_head_attention_forward's cache, or
    a sentence saying what is wrong with it."""
    try:
        return [cache[0][0], cache[1][0], cache[2][0], cache[5]]
    except (TypeError, IndexError, KeyError):
        return ("not found: keep the given return line, out, (c_q, c_k, c_v, c_att, c_o, "
                "num_heads), with the caches of your three linear_forward calls")


def _cached_weights(cache):
    """The attention weights in the cache of multi_head_attention_forward, read through the
    package's accessor of attention_forward's cache, or a sentence saying what is wrong."""
    from transformer_lab.attention import AttentionCache

    try:
        return AttentionCache(cache[3], (), None, "attention_forward").weights
    except (TypeError, IndexError, KeyError, AttributeError):
        return ("not found: keep the given return line, out, (c_q, c_k, c_v, c_att, c_o, "
                "num_heads), with c_att the cache of your one attention_forward call: the "
                "backward pass (notebook 05) reads the weights from it")


class MultiHeadAttentionForward(_LayerForward, id="check-mha-forward",
                                functions=("multi_head_attention_forward",)):
    axes = {"output": "bte", CACHED: "bhts"}  # axis names, for messages
    loop_free = {"multi_head_attention_forward": "one attention_forward call on the (B, H, T, "
                                                 "d_h) heads that split_heads gives"}

    def cases(self, rng):
        yield mha_case(rng, "one head (h = 1), S != T", 2, 3, 5, 8, 1)
        yield mha_case(rng, "2 heads, self-attention (query = key = value)", 2, 4, 4, 8, 2,
                       self_attention=True)
        yield mha_case(rng, "4 heads, key and value widths 5 and 6 (kdim, vdim)", 2, 3, 4, 8, 4,
                       kdim=5, vdim=6)
        yield mha_case(rng, "heads = width (8 heads of d_h = 1)", 2, 3, 5, 8, 8)
        yield mha_case(rng, "float32, 4 heads", 2, 3, 5, 8, 4, dtype=np.float32)
        yield mha_case(rng, "no biases, 2 heads", 2, 3, 5, 8, 2, bias=False)
        yield mha_case(rng, "a (B, 1, T, S) mask with a fully blocked row, 2 heads", 2, 4, 5, 8, 2,
                       mask=blocked_rows_mask(rng, 2, 4, 5))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield mha_case(rng, "batch of 1, one query (T = 1), 2 heads", 1, 1, 3, 4, 2)
        t = 5
        causal = np.triu(np.ones((t, t), dtype=bool), 1)
        yield mha_case(rng, "float32, 8 heads, a causal (T, T) mask", 2, t, t, 16, 8,
                       dtype=np.float32, mask=causal, self_attention=True)
        yield mha_case(rng, "6 heads of width 4 (E = 24), kdim = vdim = 10", 3, 4, 6, 24, 6,
                       kdim=10, vdim=10)
    ### END HIDDEN TESTS

    def run(self, f, query, key, value, params, num_heads, mask=None):
        out, cache = f.multi_head_attention_forward(query, key, value, params, num_heads, mask)
        return {"output": out, CACHED: _cached_weights(cache), CACHED_INPUTS: _cached_inputs(cache)}

    def expected(self, query, key, value, params, num_heads, mask=None):
        return {"output": super().expected(query, key, value, params, num_heads, mask=mask),
                CACHED: torch_heads_forward(query, key, value, params, num_heads, mask, part=1),
                CACHED_INPUTS: [query, key, value, num_heads]}

    def mistakes(self, query, key, value, params, num_heads, mask=None):
        found = super().mistakes(query, key, value, params, num_heads, mask=mask)
        if key.shape == value.shape:
            found["projecting the values from key instead of value (a copy-paste?)"] = \
                lambda: torch_heads_forward(query, key, key, params, num_heads, mask)
        return {description: lambda answer=answer: {"output": answer()}  # the output's mistakes
                for description, answer in found.items()}


# --------------------------------------------------------------------------------------------
# One mask for every head


class MergeMasks(Check, id="check-merge-masks", functions=("merge_masks",)):
    axes = {"output": "bhts"}  # axis names, for messages

    @staticmethod
    def _case(rng, name, b, h, t, s, lengths=None, attn="causal"):
        attn_mask = None
        if attn == "causal":
            attn_mask = np.arange(s)[None, :] > np.arange(t)[:, None]  # (T, S)
        elif attn == "random":
            attn_mask = rng.random((t, s)) < 0.3
        kpm = None if lengths is None else np.arange(s)[None, :] >= np.asarray(lengths)[:, None]
        return Case(name, (attn_mask, kpm), {"scores_shape": (b, h, t, s)})

    def cases(self, rng):
        yield self._case(rng, "causal (T, T) and padding (B, T), T = S = 4", 2, 2, 4, 4,
                         lengths=[4, 2])
        yield self._case(rng, "S != T: a (T, S) mask and padding (B, S)", 2, 3, 3, 5,
                         lengths=[5, 3], attn="random")
        yield self._case(rng, "a sequence of length 0: every key padded, fully blocked rows", 2, 2,
                         3, 3, lengths=[3, 0])
        yield self._case(rng, "only a padding mask (attn_mask None)", 3, 2, 2, 4,
                         lengths=[4, 1, 2], attn=None)
        yield self._case(rng, "only an attention mask (key_padding_mask None)", 2, 2, 3, 3,
                         attn="causal")
        yield self._case(rng, "no mask at all (both None: None)", 2, 2, 3, 3, attn=None)

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield self._case(rng, "batch of 1, one query (T = 1), S = 4", 1, 4, 1, 4, lengths=[2],
                         attn="random")
        yield self._case(rng, "4 sequences, T = 5, S = 7", 4, 3, 5, 7, lengths=[7, 1, 4, 0],
                         attn="random")

    def expected(self, attn_mask, key_padding_mask, scores_shape):
        if attn_mask is None and key_padding_mask is None:
            return None
        full = torch.zeros(scores_shape, dtype=torch.bool)
        if attn_mask is not None:
            full = full | torch.from_numpy(attn_mask)
        if key_padding_mask is not None:
            full = full | torch.from_numpy(key_padding_mask)[:, None, None, :]
        return full.numpy()

    def mistakes(self, attn_mask, key_padding_mask, scores_shape):
        if key_padding_mask is None:
            return {}
        b, s = key_padding_mask.shape
        am = np.broadcast_to(False if attn_mask is None else attn_mask, scores_shape)
        found = {"with the padding mask inverted (~key_padding_mask): True already marks a "
                 "padded key, the one to block": lambda: am | ~key_padding_mask[:, None, None, :]}
        if attn_mask is None:
            return found
        found["combining the masks with & (blocked only where both block) instead of | "
              "(blocked where either blocks)"] = lambda: am & key_padding_mask[:, None, None, :]
        if scores_shape[1] == b:  # (B, 1, S) broadcasts to (B, H, T, S) only when B == H
            found["with the padding mask as (B, 1, S), which lines b up with the heads axis: "
                  "make it (B, 1, 1, S), key_padding_mask[:, None, None, :]"] = (
                lambda: am | np.broadcast_to(key_padding_mask[:, None, :], scores_shape))
        if scores_shape[2] == s:
            found["blocking the padded queries (key_padding_mask[:, None, :, None]) instead "
                  "of the padded keys (the last axis)"] = (
                lambda: am | np.broadcast_to(key_padding_mask[:, None, :, None], scores_shape))
        return found
    ### END HIDDEN TESTS

    def run(self, f, attn_mask, key_padding_mask, scores_shape):
        mask = f.merge_masks(attn_mask, key_padding_mask)
        if mask is None or (attn_mask is None and key_padding_mask is None):
            return mask  # None is right here: what came back instead, as it is
        mask = np.asarray(mask)
        try:
            full = np.broadcast_to(mask, scores_shape)
        except ValueError:
            raise ValueError(f"merge_masks returned a mask of shape {mask.shape}, which does not "
                             f"broadcast to the scores (B, H, T, S) = {tuple(scores_shape)}: "
                             "a padding mask (B, S) must become (B, 1, 1, S)") from None
        return np.array(full)


# --------------------------------------------------------------------------------------------
# Self-attention, packed projections


class SelfAttentionForward(_LayerForward, id="check-self-attention-forward",
                           functions=("self_attention_forward",)):
    loop_free = {"self_attention_forward": "one product with W_qkv, cut into q, k and v at "
                                           "the columns, then split_heads on each"}

    def cases(self, rng):
        yield self_attention_case(rng, "one head (h = 1)", 2, 4, 8, 1)
        yield self_attention_case(rng, "2 heads", 2, 5, 8, 2)
        yield self_attention_case(rng, "heads = width (8 heads of d_h = 1)", 2, 3, 8, 8)
        yield self_attention_case(rng, "float32, 4 heads", 2, 5, 8, 4, dtype=np.float32)
        yield self_attention_case(rng, "no biases, 4 heads", 2, 3, 8, 4, bias=False)
        t = 4
        yield self_attention_case(rng, "a causal (T, T) mask, 2 heads", 2, t, 8, 2,
                                  mask=np.triu(np.ones((t, t), dtype=bool), 1))
        yield self_attention_case(rng, "a (B, 1, T, T) mask with a fully blocked row, 4 heads", 2,
                                  t, 8, 4, mask=blocked_rows_mask(rng, 2, t, t))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield self_attention_case(rng, "batch of 1, length 1, 2 heads", 1, 1, 4, 2)
        yield self_attention_case(rng, "float32, 6 heads, E = 24, a fully blocked row", 3, 5, 24, 6,
                                  dtype=np.float32, mask=blocked_rows_mask(rng, 3, 5, 5))
    ### END HIDDEN TESTS

    def run(self, f, x, params, num_heads, mask=None):
        return f.self_attention_forward(x, params, num_heads, mask)[0]

    def _inputs(self, x, params, num_heads):
        return x, x, x, params, num_heads

    def mistakes(self, x, params, num_heads, mask=None):
        found = super().mistakes(x, params, num_heads, mask=mask)
        found["cutting the packed projection per head as [q_i | k_i | v_i] (another library's "
              "layout) instead of [Q | K | V] side by side, as in_proj_weight stacks them"] = (
            lambda: torch_heads_forward(x, x, x, params, num_heads, mask, split="interleaved"))
        found["with the keys as values: the third of the packed projection is V (a copy-paste "
              "of k?)"] = lambda: torch_heads_forward(x, x, x, _keys_as_values(params),
                                                       num_heads, mask)
        return found


def _keys_as_values(params):
    """Packed projections whose V third is a copy of their K third."""
    E = params["W_qkv"].shape[0]
    out = dict(params)
    for name in ("W_qkv", "b_qkv"):
        if name in params:
            p = params[name].copy()
            p[..., 2 * E:] = p[..., E:2 * E]
            out[name] = p
    return out


# --------------------------------------------------------------------------------------------
# Variant exercises: grouped-query attention and its cost


class GroupedQueryAttention(Check, id="check-gqa", arguments=("grouped_query_attention",)):
    loop_free = {"grouped_query_attention": "repeat the key/value heads (np.repeat on the head "
                                            "axis), then attend with all heads at once"}
    @staticmethod
    def _case(rng, name, b, t, e, h, g, dtype=np.float64):
        x = rng.standard_normal((b, t, e))
        w_q, w_o = rng.standard_normal((2, e, e)) / math.sqrt(e)
        w_k, w_v = rng.standard_normal((2, e, g * (e // h))) / math.sqrt(e)
        return Case(name, tuple(a.astype(dtype) for a in (x, w_q, w_k, w_v, w_o)) + (h, g))

    def cases(self, rng):
        yield self._case(rng, "g = h = 4: plain multi-head attention", 2, 5, 8, 4, 4)
        yield self._case(rng, "h = 4, g = 2: two groups of two query heads", 2, 5, 8, 4, 2)
        yield self._case(rng, "g = 1: multi-query attention (one key/value head)", 2, 5, 8, 4, 1)
        yield self._case(rng, "h = 6, g = 3, E = 24", 2, 5, 24, 6, 3)
        yield self._case(rng, "h = 8, g = 2, E = 16", 2, 5, 16, 8, 2)
        yield self._case(later_rng(rng), "float32 stays float32, h = 4, g = 2", 2, 6, 8, 4, 2,
                         dtype=np.float32)

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield self._case(rng, "float32, h = 4, g = 2", 2, 6, 8, 4, 2, dtype=np.float32)
        yield self._case(rng, "batch of 1, length 1, h = 2, g = 1", 1, 1, 4, 2, 1)
        yield self._case(rng, "h = 6, g = 2, d_h = 1", 2, 3, 6, 6, 2)
    ### END HIDDEN TESTS

    def expected(self, x, W_q, W_k, W_v, W_o, num_heads, num_kv_heads, scale=None,
                 groups="consecutive", project_out=True):
        F = torch.nn.functional
        b, t, e = x.shape
        h, g, d_h = num_heads, num_kv_heads, e // num_heads
        xt = torch.from_numpy(x)

        def heads(w, n):  # (B, T, n d_h) -> (B, n, T, d_h)
            return (xt @ torch.from_numpy(w)).reshape(b, t, n, d_h).transpose(1, 2)

        q, k, v = heads(W_q, h), heads(W_k, g), heads(W_v, g)
        if groups == "consecutive":  # PyTorch's grouped-query attention
            o = F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
        else:  # key/value head j serves query heads j, j + g, j + 2g, ...
            o = F.scaled_dot_product_attention(q, k.repeat(1, h // g, 1, 1),
                                               v.repeat(1, h // g, 1, 1), scale=scale)
        merged = o.transpose(1, 2).reshape(b, t, e)
        return (merged @ torch.from_numpy(W_o) if project_out else merged).numpy()

    def mistakes(self, x, W_q, W_k, W_v, W_o, num_heads, num_kv_heads):
        args = (x, W_q, W_k, W_v, W_o, num_heads, num_kv_heads)
        return {"pairing key/value head j with query heads j, j + g, j + 2g, ... (np.tile, or "
                "np.repeat over the wrong axis) instead of with the h/g consecutive query heads "
                "of its group (np.repeat(k, h // g, axis=1))":
                lambda: self.expected(*args, groups="tiled"),
                "without the scale 1/sqrt(d_h) on the scores":
                lambda: self.expected(*args, scale=1.0),
                "scaling the scores by 1/sqrt(E) instead of 1/sqrt(d_h)":
                lambda: self.expected(*args, scale=1 / math.sqrt(x.shape[-1])),
                "without the output projection W_o":
                lambda: self.expected(*args, project_out=False)}


#: The output of check-gqa-cost that holds the kinds of the two counts.
TYPES = "types (the docstring: two Python ints)"


def _kind(count) -> str:
    """"int" for an integer (NumPy's too), else the name of the type."""
    integer = isinstance(count, numbers.Integral) and not isinstance(count, bool)
    return "int" if integer else type(count).__name__


class GroupedQueryAttentionCost(Check, id="check-gqa-cost", arguments=("gqa_cost",)):
    def cases(self, rng):
        yield Case("g = h: must be 4E^2 + 4E and 8TE^2 + 4T^2E (E = 16, h = g = 4, T = 5)",
                   (16, 4, 4, 5))
        yield Case("multi-query, g = 1 (E = 16, h = 4, T = 5)", (16, 4, 1, 5))
        yield Case("E = 64, h = 8, g = 2, T = 33", (64, 8, 2, 33))
        yield Case("long sequence: E = 256, h = 8, g = 1, T = 50", (256, 8, 1, 50))
        yield Case("E = 256, h = 16, g = 4, T = 7", (256, 16, 4, 7))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("E = 96, h = 12, g = 3, T = 20", (96, 12, 3, 20))
        yield Case("T = 1: E = 32, h = 4, g = 2", (32, 4, 2, 1))
    ### END HIDDEN TESTS

    def run(self, f, E, num_heads, num_kv_heads, T):
        params, flops = f.gqa_cost(E, num_heads, num_kv_heads, T)
        return {"params": params, "flops": flops, TYPES: [_kind(params), _kind(flops)]}

    def expected(self, E, num_heads, num_kv_heads, T):
        """Parameters and matrix-product FLOPs of a PyTorch grouped-query self-attention layer
        with biases, counted by PyTorch (``FlopCounterMode``) on one sequence of length T."""
        from torch.utils.flop_counter import FlopCounterMode

        nn = torch.nn
        h, g, d_h = num_heads, num_kv_heads, E // num_heads
        q_proj, o_proj = nn.Linear(E, E), nn.Linear(E, E)
        k_proj, v_proj = nn.Linear(E, g * d_h), nn.Linear(E, g * d_h)
        n_params = sum(p.numel() for m in (q_proj, k_proj, v_proj, o_proj) for p in m.parameters())
        x = torch.zeros(1, T, E)
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            q = q_proj(x).view(1, T, h, d_h).transpose(1, 2)
            k, v = (p(x).view(1, T, g, d_h).transpose(1, 2).repeat_interleave(h // g, dim=1)
                    for p in (k_proj, v_proj))
            w = torch.softmax(q @ k.transpose(-1, -2) / d_h ** 0.5, dim=-1)
            o_proj((w @ v).transpose(1, 2).reshape(1, T, E))
        return {"params": int(n_params), "flops": int(counter.get_total_flops()),
                TYPES: ["int", "int"]}

    def mistakes(self, E, num_heads, num_kv_heads, T):
        right = self.expected(E, num_heads, num_kv_heads, T)
        kv = num_kv_heads * (E // num_heads)
        return {"dividing with / (a float in Python 3) where counts want // (ints stay ints)":
                lambda: {**right, TYPES: ["float", "float"]},
                "using the multi-head formulas (K and V at full width E)":
                lambda: {"params": 4 * E * E + 4 * E, "flops": 8 * T * E * E + 4 * T * T * E},
                "leaving out the biases":
                lambda: {"params": right["params"] - 2 * E - 2 * kv, "flops": right["flops"]},
                "computing the scores and weighted sums for the g key/value heads only (every "
                "one of the h query heads has its own scores)":
                lambda: {"params": right["params"], "flops": right["flops"] - 4 * T * T * E
                         + 4 * T * T * kv},
                "counting a multiply-add as one operation (an (m, k) @ (k, n) product costs "
                "2mkn)":
                lambda: {"params": right["params"], "flops": right["flops"] // 2}}
