"""Checks of notebook 16_long_context: the online softmax and tiled attention, forward, one tile
of the backward pass, the backward pass, and the tiled self-attention of a model.

Expected answers come from PyTorch: ``torch.logsumexp``, ``torch.softmax`` and autograd
through ``F.scaled_dot_product_attention`` (whose ``is_causal`` is the course's causal mask,
query i sees keys j <= i, also when T != S).
"""

from __future__ import annotations

import math
import tracemalloc

import numpy as np

from transformer_lab import flash
from transformer_lab.checks._torch_helpers import autograd, torch
from transformer_lab.checks.framework import Case, Check, later_rng, normals
from transformer_lab.checks.nb13_gpt import (
    _attention_case,
    _attention_expected,
    _config,
    _first_block,
    _head_rope,
    _random_gpt,
)

# The framework refuses non-finite outputs, so a running maximum that is still -inf comes back
# as a boolean "is -inf" array next to its finite entries.
NEG_INF = "m_new is -inf"


def _update_answer(m_new, ell_new, p, alpha) -> dict:
    """What check-online-softmax-update compares: m_new split at -inf (:data:`NEG_INF`)."""
    m_new = np.asarray(m_new)
    finite = np.where(np.isneginf(m_new), 0, m_new)
    return {NEG_INF: np.isneginf(m_new), "m_new (where finite)": finite, "ell_new": ell_new,
            "p": p, "alpha": alpha}


def _update_case(name, prev, block) -> Case:
    """An update of the running (m, ell) after the scores ``prev`` (..., n) -- computed with
    torch -- by the scores ``block``."""
    t = torch.from_numpy(prev)
    m = t.amax(-1, keepdim=True)
    lse = torch.logsumexp(t, -1, keepdim=True)
    ell = torch.where(torch.isneginf(m), torch.zeros_like(m), torch.exp(lse - m))
    return Case(name, (m.numpy(), ell.numpy(), block))


def _scores(q, k, causal):
    """q k^T / sqrt(d) of torch tensors, the future (key j > query i) -inf where ``causal``."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if not causal:
        return scores
    future = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
    return scores.masked_fill(future, -torch.inf)


def _attention(scores, v) -> dict:
    """The attention's output and the rows' logsumexp, from torch scores and values."""
    return {"out": (torch.softmax(scores, -1) @ v).numpy(),
            "lse": torch.logsumexp(scores, -1).numpy()}


# --------------------------------------------------------------------------------------------
# §2 The online softmax


class OnlineSoftmaxUpdate(Check, id="check-online-softmax-update",
                          functions=("online_softmax_update",)):
    def cases(self, rng):
        x = rng.standard_normal((3, 10)) * 3
        nothing = np.full((3, 1), -np.inf)  # nothing seen: m = -inf, ell = 0
        yield _update_case("the first block (nothing seen yet)", nothing, x[:, :4])
        yield _update_case("a second block", x[:, :4], x[:, 4:])
        late = np.linspace(-5.0, 900.0, 12).reshape(2, 6)  # exp(900) overflows
        yield _update_case("the maximum arrives late (scores of hundreds)", late[:1], late[1:])
        block = rng.standard_normal((3, 4))
        block[1] = -np.inf
        yield _update_case("a fully masked block after visible scores", x[:, :4], block)
        yield _update_case("a fully masked block with nothing seen yet",
                           np.full((3, 2), -np.inf), block)
        yield _update_case("float32, leading axes (2, 3)",
                           rng.standard_normal((2, 3, 5)).astype(np.float32),
                           rng.standard_normal((2, 3, 4)).astype(np.float32) * 2)

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield _update_case("a block of one score", rng.standard_normal((4, 3)),
                           rng.standard_normal((4, 1)))
        prev = rng.standard_normal((2, 2, 3, 5))
        yield _update_case("four axes, scores below the running maximum", prev, prev[..., :2] - 10)
        prev = rng.standard_normal((3, 5)).astype(np.float32)
        block = rng.standard_normal((3, 5)).astype(np.float32)
        block[0, :] = -np.inf
        yield _update_case("float32 with a masked row", prev, block)
    ### END HIDDEN TESTS

    def run(self, f, m, ell, scores):
        m_new, ell_new, p, alpha = f.online_softmax_update(m, ell, scores)
        return _update_answer(m_new, ell_new, p, alpha)

    def expected(self, m, ell, scores, running=True):
        """The update (``running`` False, a mistake: m_new the block's maximum alone)."""
        m, ell, s = (torch.from_numpy(a) for a in (m, ell, scores))
        m_new = torch.maximum(m, s.amax(-1, keepdim=True)) if running else s.amax(-1, keepdim=True)
        shift = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
        alpha, p = torch.exp(m - shift), torch.exp(s - shift)
        ell_new = alpha * ell + p.sum(-1, keepdim=True)
        return _update_answer(*(a.numpy() for a in (m_new, ell_new, p, alpha)))

    def mistakes(self, m, ell, scores):
        want = self.expected(m, ell, scores)
        with np.errstate(all="ignore"):
            inverted = np.exp(np.where(want[NEG_INF], 0, want["m_new (where finite)"]) - m)
            stale = np.exp(scores - np.where(np.isneginf(m), 0, m))
        return {"rescaling by exp(m_new - m) instead of exp(m - m_new)":
                lambda: {**want, "alpha": inverted},
                "not rescaling the running sum (ell + sum p instead of alpha * ell + sum p)":
                lambda: {**want, "ell_new": ell + want["p"].sum(-1, keepdims=True)},
                "taking p = exp(scores - m) with the old maximum":
                lambda: {**want, "p": stale},
                "with the block's maximum alone as m_new: it is the larger of the running "
                "maximum m and the block's": lambda: self.expected(m, ell, scores, False)}


# --------------------------------------------------------------------------------------------
# §3 Tiled attention, forward


def _qkv(rng, lead, T, S, dtype=np.float64, d=8, d_v=5):
    return normals(rng, (*lead, T, d), (*lead, S, d), (*lead, S, d_v), dtype=dtype)


MEMORY = "peak extra memory below T * S * itemsize / 10"


def _measured(fn, q, k):
    """The answer of a memory case, {:data:`MEMORY`: whether ``fn()`` allocated at its peak
    less than a tenth of one (T, S) score matrix of q and k beyond what was allocated before};
    and fn's result."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = fn()
        peak = tracemalloc.get_traced_memory()[1] - before
        return {MEMORY: bool(peak < q.shape[-2] * k.shape[-2] * q.itemsize / 10)}, result
    finally:
        tracemalloc.stop()


#: the hint of a memory case that fails (its answer: :data:`MEMORY` False)
MEMORY_HINT = {"with more than a tenth of a (T, S) array alive at once: the score matrix formed "
               "whole, or a (T, S) mask or temporary; only one tile may live at a time":
               lambda: {MEMORY: False}}

#: a memory case whose one block holds the whole sequence: its tile is the whole (T, T) score
#: matrix, so the peak exceeds a tenth of one (in the other memory cases, blocks of T / 16 keep it
#: below) -- unless block_size is not passed on
WHOLE_TILE = ("T = 1024, one block of 1024: its one tile is a whole (T, T) score matrix, more "
              "memory than a tenth of one (block_size is passed on)")
BLOCK_SIZE_HINT = {"with block_size not passed on (a default block size instead?): one block "
                   "of T is a whole (T, T) tile, yet the run stayed below a tenth of one":
                   lambda: {MEMORY: True}}


def _memory_case(rng, backward=False):
    """The tiled attention of a long sequence, whose peak memory is measured (:data:`MEMORY`);
    with dout after q, k, v for the backward pass."""
    q, k, v = _qkv(rng, (), 1024, 1024, d=16, d_v=16)
    dout = (rng.standard_normal((1024, 16)),) if backward else ()
    return Case("T = S = 1024: memory below a tenth of one (T, S) score matrix",
                (q, k, v, *dout, True, 64), {"measure_memory": True})


def _tiled_case(rng, name, lead, T, S, causal, block, dtype=np.float64, scale=1.0,
                dout=False):
    """q (times ``scale``), k, v -- and with ``dout`` the upstream gradient -- causal, block."""
    q, k, v = _qkv(rng, lead, T, S, dtype)
    grad = (rng.standard_normal((*lead, T, v.shape[-1])).astype(dtype),) if dout else ()
    return Case(name, (q * dtype(scale), k, v, *grad, causal, block))


def _far_below_case(rng) -> Case:
    """A row whose every score is below -1000, where exp(score) is 0 in float64: its output is
    still the average its softmax gives, if the running maximum starts at -inf (from 0, every
    p and the running sum are 0, and the row is 0 / 0)."""
    q, k, v = _qkv(rng, (), 7, 9)
    k += 3.0  # every key near (3, ..., 3)
    q[2] = -150.0  # row 2's scores: about -150 * 3 * 8 / sqrt(8), near -1270
    return Case("row 2's scores all below -1000 (exp gives 0: the running maximum starts at "
                "-inf, not 0)", (q, k, v, False, 4))


#: the public cases of the tiled attention: name, leading axes, T, S, causal, block (, dtype)
TILED_CASES = [("T = S = 9, blocks of 4", (), 9, 9, False, 4),
               ("causal, T = S = 9, blocks of 4", (), 9, 9, True, 4),
               ("causal, T = S = 8, lengths a multiple of the block", (), 8, 8, True, 4),
               ("causal, T = 7 < S = 12, a batch of 2", (2,), 7, 12, True, 3),
               ("causal, T = 12 > S = 7, a batch of 2", (2,), 12, 7, True, 5),
               ("causal, blocks of 1", (), 5, 5, True, 1),
               ("a block larger than both lengths, batch and heads (2, 3)", (2, 3), 5, 6, False,
                64),
               ("float32, causal, T = S = 13", (3,), 13, 13, True, 4, np.float32)]


class FlashAttentionForward(Check, id="check-flash-forward",
                            functions=("flash_attention_forward",)):
    axes = {"out": "td", "lse": "t"}  # axis names, for messages

    def cases(self, rng):
        for spec in TILED_CASES:
            yield _tiled_case(rng, *spec)
        yield _far_below_case(later_rng(rng))  # added later: the others stay as drawn
        yield _memory_case(rng)

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield _tiled_case(rng, "causal, T = 6 < S = 17, blocks of 5", (), 6, 17, True, 5)
        yield _tiled_case(rng, "float32, T = 17 > S = 6", (2,), 17, 6, False, 4, np.float32)
        yield _tiled_case(rng, "scores of hundreds", (), 10, 10, False, 3, scale=60.0)
        yield _tiled_case(rng, "one query, one key", (), 1, 1, True, 2)
    ### END HIDDEN TESTS

    def run(self, f, q, k, v, causal, block_size, measure_memory=False):
        memory, (out, cache) = _measured(
            lambda: f.flash_attention_forward(q, k, v, causal, block_size), q, k)
        return memory if measure_memory else {"out": out, "lse": flash.row_logsumexp(cache)}

    def expected(self, q, k, v, causal, block_size, measure_memory=False):
        if measure_memory:
            return {MEMORY: True}
        q, k, v = (torch.from_numpy(a) for a in (q, k, v))
        return _attention(_scores(q, k, causal), v)

    def mistakes(self, q, k, v, causal, block_size, measure_memory=False):
        if measure_memory:
            return MEMORY_HINT
        qt, kt, vt = (torch.from_numpy(a) for a in (q, k, v))
        scaled = _scores(qt, kt, False)
        diagonal = torch.ones(scaled.shape[-2:], dtype=torch.bool).triu(0)
        found = {"without scaling the scores by 1 / sqrt(d)":
                 lambda: _attention(_scores(qt, kt, causal) * math.sqrt(q.shape[-1]), vt),
                 "with the output accumulator not rescaled: acc = alpha * acc + p @ v_j, as the "
                 "running sum is, since each tile's p is relative to the maximum so far":
                 lambda: _not_rescaled(_scores(qt, kt, causal), vt, block_size),
                 "with lse = m + ell, the log forgotten: lse = m + log(ell)":
                 lambda: _lse_without_log(_scores(qt, kt, causal), vt),
                 "with lse = log(ell), m forgotten: ell sums exp(s - m), so lse = m + log(ell)":
                 lambda: _lse_without_log(_scores(qt, kt, causal), vt, log=True)}
        if causal:
            found["skipping the diagonal tile (keys j up to the query block's start only): "
                  "it holds each query's own key and its block's earlier ones"] = (
                lambda: _attention(_scores(qt, kt, True).masked_fill(
                    _from_own_block(*scaled.shape[-2:], block_size), -torch.inf), vt))
            found["ignoring causal (every tile computed, no mask)"] = (
                lambda: _attention(scaled, vt))
            found["with the diagonal tile not masked: the later tiles are skipped, but within "
                  "the diagonal one a query must not see the keys after it (j > i)"] = (
                lambda: _attention(scaled.masked_fill(
                    _past_own_block(*scaled.shape[-2:], block_size), -torch.inf), vt))
            if scaled.shape[-2] > 1:
                found["masking the diagonal too (a query must see its own key, j <= i)"] = (
                    lambda: _attention(scaled.masked_fill(diagonal, -torch.inf), vt))
            found["visiting the future tiles too, masked on the diagonal tile only (causal: "
                  "the keys past the query block's end are skipped)"] = (
                lambda: _attention(scaled.masked_fill(
                    diagonal.triu(1) & ~_past_own_block(*scaled.shape[-2:], block_size),
                    -torch.inf), vt))
        return found


def _lse_without_log(scores, v, log=False) -> dict:
    """out, and each row's m + ell (max and sum of exp(s - m)) where its logsumexp belongs,
    or with ``log`` its log(ell), m forgotten."""
    right = _attention(scores, v)
    m = scores.amax(-1).numpy()
    return {**right, "lse": right["lse"] - m if log else m + np.exp(right["lse"] - m)}


def _not_rescaled(scores, v, block_size) -> dict:
    """out and lse of the tiled forward whose output accumulator is not rescaled by alpha (a
    mistake): each key block's exp(s - m) @ v_j with the running maximum m after that block,
    their sum divided by the right running sum."""
    m = torch.full(scores.shape[:-1] + (1,), -torch.inf, dtype=scores.dtype)
    acc = 0
    for j in range(0, scores.shape[-1], block_size):
        s_j = scores[..., j:j + block_size]
        m = torch.maximum(m, s_j.amax(-1, keepdim=True))
        p = torch.exp(s_j - torch.where(torch.isneginf(m), 0, m))
        acc = acc + p @ v[..., j:j + block_size, :]
    lse = torch.logsumexp(scores, -1)
    return {"out": (acc / torch.exp(lse - m[..., 0])[..., None]).numpy(), "lse": lse.numpy()}


def _past_own_block(T, S, block_size):
    """(T, S) True where key j is past the end of query i's block (the tiles a causal pass
    skips)."""
    ends = torch.arange(T)[:, None] // block_size * block_size + block_size
    return torch.arange(S)[None, :] >= ends


def _from_own_block(T, S, block_size):
    """(T, S) True where key j is at or past the start of query i's block."""
    starts = torch.arange(T)[:, None] // block_size * block_size
    return torch.arange(S)[None, :] >= starts


# --------------------------------------------------------------------------------------------
# §4 Tiled attention, backward


def _tile_case(rng, name, lead, b_q, S, blocks, causal=False, dtype=np.float64):
    """A query block against all the keys, with the rows' lse and D = rowsum(dO * O) (torch)."""
    q_i, k, v = _qkv(rng, lead, b_q, S)
    dout_i = rng.standard_normal((*lead, b_q, v.shape[-1]))
    qt, kt, vt = (torch.from_numpy(a) for a in (q_i, k, v))
    answer = _attention(_scores(qt, kt, causal), vt)
    D = (dout_i * answer["out"]).sum(-1)
    args = [a.astype(dtype) for a in (q_i, k, v, dout_i, answer["lse"], D)]
    return Case(name, (*args, 1 / math.sqrt(q_i.shape[-1]), blocks, causal))


#: check-flash-backward-tile's outputs
TILE_GRADS = ("dq_i (the sum of the tiles' parts)", "dk (the tiles' parts, side by side)",
              "dv (the tiles' parts, side by side)")


class FlashAttentionBackwardTile(Check, id="check-flash-backward-tile",
                                 functions=("flash_attention_backward_tile",)):
    def cases(self, rng):
        yield _tile_case(rng, "4 queries, key blocks 0:4, 4:8, 8:9, a batch of 2", (2,), 4, 9,
                         [(0, 4), (4, 8), (8, 9)])
        yield _tile_case(rng, "one tile", (), 3, 3, [(0, 3)])
        yield _tile_case(rng, "a diagonal tile, masked (causal)", (), 5, 5, [(0, 5)], causal=True)
        yield _tile_case(rng, "float32, key blocks 0:3, 3:6", (2,), 3, 6, [(0, 3), (3, 6)],
                         dtype=np.float32)

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield _tile_case(rng, "one query, key blocks of 1", (), 1, 3, [(0, 1), (1, 2), (2, 3)])
        yield _tile_case(rng, "float32 diagonal tile, heads (2, 2)", (2, 2), 4, 4, [(0, 4)],
                         causal=True, dtype=np.float32)
    ### END HIDDEN TESTS

    def run(self, f, q_i, k, v, dout_i, lse_i, D_i, scale, blocks, causal):
        dq, dks, dvs = 0, [], []
        for start, stop in blocks:
            mask = np.triu(np.ones((q_i.shape[-2], stop - start), dtype=bool), 1) if causal \
                else None
            k_j, v_j = k[..., start:stop, :], v[..., start:stop, :]
            dq_t, dk_t, dv_t = f.flash_attention_backward_tile(q_i, k_j, v_j, dout_i, lse_i, D_i,
                                                               scale, mask)
            for name, got, like in (("dq_i", dq_t, q_i), ("dk_j", dk_t, k_j), ("dv_j", dv_t, v_j)):
                if np.shape(got) != like.shape:  # before they are added up or put side by side
                    raise ValueError(f"{name} of the tile of keys {start}..{stop - 1} has shape "
                                     f"{np.shape(got)}: it must have {name[1:]}'s, {like.shape}")
            dq = dq + np.asarray(dq_t)
            dks.append(np.asarray(dk_t))
            dvs.append(np.asarray(dv_t))
        return dict(zip(TILE_GRADS, (dq, np.concatenate(dks, axis=-2),
                                     np.concatenate(dvs, axis=-2)), strict=True))

    def expected(self, q_i, k, v, dout_i, lse_i, D_i, scale, blocks, causal):
        return dict(zip(TILE_GRADS, _torch_grads(q_i, k, v, dout_i, causal), strict=True))

    def mistakes(self, q_i, k, v, dout_i, lse_i, D_i, scale, blocks, causal):
        def tile(masked=causal, D=D_i):  # the tile's formulas over all the keys at once
            q, k64, v64, dout = _float64(q_i, k, v, dout_i)
            s = q @ np.swapaxes(k64, -1, -2) * scale
            if masked:
                s = np.where(np.triu(np.ones(s.shape[-2:], bool), 1), -np.inf, s)
            p = np.exp(s - lse_i[..., None])
            dz = p * (dout @ np.swapaxes(v64, -1, -2) - D[..., None])
            grads = (dz @ k64 * scale, np.swapaxes(dz, -1, -2) @ q * scale,
                     np.swapaxes(p, -1, -2) @ dout)
            return dict(zip(TILE_GRADS, (g.astype(q_i.dtype) for g in grads), strict=True))

        return {"with D scaled: dZ = P * (dP - D) takes D = rowsum(dO * O) as it is given; the "
                "scale belongs to the scores and to dq and dk": lambda: tile(D=D_i * scale),
                **({"with the tile's mask left out: the weights P it recomputes are 0 where the "
                    "forward masked the scores (np.copyto(s, -np.inf, where=mask) before the "
                    "exp)": lambda: tile(masked=False)} if causal else {})}


def _torch_grads(q, k, v, dout, causal):
    """dq, dk, dv of softmax(q k^T / sqrt(d) + causal mask) v, by torch autograd in float64;
    returned in the inputs' dtype."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    _, *grads = autograd(lambda *qkv: sdpa(*qkv, is_causal=causal), *_float64(dout, q, k, v))
    return tuple(g.astype(q.dtype) for g in grads)


def _float64(*arrays):
    return tuple(a.astype(np.float64) for a in arrays)


class FlashAttentionBackward(Check, id="check-flash-backward",
                             functions=("flash_attention_forward", "flash_attention_backward")):
    axes = {"dq": "td", "dk": "sd", "dv": "sd"}  # axis names, for messages

    def cases(self, rng):
        for spec in TILED_CASES[:2] + TILED_CASES[3:]:  # all but the multiple of the block
            yield _tiled_case(rng, *spec, dout=True)
        yield _memory_case(rng, backward=True)

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield _tiled_case(rng, "causal, T = 6 < S = 17, blocks of 5", (), 6, 17, True, 5,
                          dout=True)
        yield _tiled_case(rng, "float32, T = 17 > S = 6", (2,), 17, 6, False, 4, np.float32,
                          dout=True)
        yield _tiled_case(rng, "a block larger than the length, causal", (), 3, 3, True, 7,
                          dout=True)
    ### END HIDDEN TESTS

    def run(self, f, q, k, v, dout, causal, block_size, measure_memory=False):
        out, cache = f.flash_attention_forward(q, k, v, causal, block_size)
        memory, (dq, dk, dv) = _measured(lambda: f.flash_attention_backward(dout, cache), q, k)
        return memory if measure_memory else {"dq": dq, "dk": dk, "dv": dv}

    def expected(self, q, k, v, dout, causal, block_size, measure_memory=False):
        if measure_memory:
            return {MEMORY: True}
        return dict(zip(("dq", "dk", "dv"), _torch_grads(q, k, v, dout, causal), strict=True))

    def mistakes(self, q, k, v, dout, causal, block_size, measure_memory=False):
        if measure_memory:
            return MEMORY_HINT
        return {"without D (as if D were 0): dS = P * (dP - D), D = rowsum(dO * O) per row":
                lambda: _grads_with_dS(q, k, v, dout, causal, lambda P, dP, D, dO: P * dP),
                "with D = rowsum(dO), the output O forgotten: D = rowsum(dO * O)":
                lambda: _grads_with_dS(q, k, v, dout, causal, lambda P, dP, D, dO: P * (
                    dP - dO.sum(-1, keepdim=True))),
                "with D scaled by 1 / sqrt(d): D = rowsum(dO * O) as it is; the scale belongs "
                "to the scores and to dq and dk": lambda: _grads_with_dS(
                    q, k, v, dout, causal, lambda P, dP, D, dO: P * (dP - D / math.sqrt(
                        q.shape[-1]))),
                "with a tile's part of dq, dk or dv assigned (=) instead of added (+=): each "
                "query row's dq sums over its key tiles, each key's dk and dv over the query "
                "tiles": lambda: _grads_assigned(q, k, v, dout, causal, block_size),
                **({} if causal else {  # (causal: what the masked entries get depends on how)
                    "with dS = P * dP - D, the brackets forgotten: dS = P * (dP - D)":
                    lambda: _grads_with_dS(q, k, v, dout, False,
                                           lambda P, dP, D, dO: P * dP - D)}),
                **({"visiting the future tiles too (causal: the keys past the query block's "
                    "end are skipped, as in the forward; P there is not 0 unmasked)":
                    lambda: _grads_with_dS(q, k, v, dout, True,
                                           lambda P, dP, D, dO: P * (dP - D),
                                           _past_own_block(q.shape[-2], k.shape[-2],
                                                           block_size))} if causal else {})}


def _grads_with_dS(q, k, v, dout, causal, dS_of, unmasked=None) -> dict:
    """dq, dk, dv of the backward pass with ``dS_of(P, dP, D, dO)`` in place of
    dS = P * (dP - D) (a mistake) -- with ``unmasked`` (T, S), causal but with P = exp(s - lse)
    computed unmasked there too (the causal lse: the future tiles visited). In the inputs'
    dtype."""
    qt, kt, vt, dout_t = (torch.from_numpy(a) for a in _float64(q, k, v, dout))
    P = torch.softmax(_scores(qt, kt, causal), -1)
    D = (dout_t * (P @ vt)).sum(-1, keepdim=True)  # rowsum(dO * O), O the forward's
    if unmasked is not None:
        lse = torch.logsumexp(_scores(qt, kt, True), -1, keepdim=True)
        P = torch.where(unmasked, torch.exp(_scores(qt, kt, False) - lse), P)
    dS = dS_of(P, dout_t @ vt.transpose(-1, -2), D, dout_t) / math.sqrt(q.shape[-1])
    return {"dq": (dS @ kt).numpy().astype(q.dtype),
            "dk": (dS.transpose(-1, -2) @ qt).numpy().astype(q.dtype),
            "dv": (P.transpose(-1, -2) @ dout_t).numpy().astype(q.dtype)}


def _grads_assigned(q, k, v, dout, causal, block_size) -> dict:
    """dq, dk, dv of the tiled backward that assigns each tile's part instead of adding it (a
    mistake): a query block keeps its last key tile's part, a key block the last query tile's
    (the last query block, which visits every key block that any visits). In the inputs'
    dtype."""
    qt, kt, vt, dout_t = (torch.from_numpy(a) for a in _float64(q, k, v, dout))
    P = torch.softmax(_scores(qt, kt, causal), -1)
    dS = P * (dout_t @ vt.transpose(-1, -2) - (dout_t * (P @ vt)).sum(-1, keepdim=True))
    dS = dS / math.sqrt(q.shape[-1])
    T, S = q.shape[-2], k.shape[-2]
    dq, dk, dv = (torch.zeros_like(a) for a in (qt, kt, vt))
    for i in range(0, T, block_size):
        stop = min(S, i + block_size) if causal else S
        j = (stop - 1) // block_size * block_size  # the last key tile of query block i
        dq[..., i:i + block_size, :] = dS[..., i:i + block_size, j:stop] @ kt[..., j:stop, :]
    rows = slice((T - 1) // block_size * block_size, T)  # the last query block
    last = min(S, rows.start + block_size) if causal else S  # the keys it visits
    dk[..., :last, :] = dS[..., rows, :last].transpose(-1, -2) @ qt[..., rows, :]
    dv[..., :last, :] = P[..., rows, :last].transpose(-1, -2) @ dout_t[..., rows, :]
    return {"dq": dq.numpy().astype(q.dtype), "dk": dk.numpy().astype(q.dtype),
            "dv": dv.numpy().astype(q.dtype)}


# --------------------------------------------------------------------------------------------
# §6 In the model


def _self_attention_case(rng, name, B, T, E, H, block, dtype=np.float64):
    params = {"W_qkv": rng.standard_normal((E, 3 * E)) / math.sqrt(E),
              "b_qkv": rng.standard_normal(3 * E) * 0.1,
              "W_o": rng.standard_normal((E, E)) / math.sqrt(E),
              "b_o": rng.standard_normal(E) * 0.1}
    params = {n: a.astype(dtype) for n, a in params.items()}
    x, dout = normals(rng, (B, T, E), (B, T, E), dtype=dtype)
    return Case(name, (x, params, H, dout, block))


class FlashSelfAttention(Check, id="check-flash-self-attention",
                         functions=("flash_self_attention_forward",
                                    "flash_self_attention_backward")):
    axes = {"out": "bte", "dx": "bte"}  # axis names, for messages

    def cases(self, rng):
        yield _self_attention_case(rng, "B = 2, T = 11, E = 12, 3 heads, blocks of 4",
                                   2, 11, 12, 3, 4)
        yield _self_attention_case(rng, "one head, blocks of 1", 1, 5, 4, 1, 1)
        yield _self_attention_case(rng, "float32", 2, 6, 8, 2, 4, np.float32)
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        for name, dropped in (("b_qkv only (no b_o)", "b_o"), ("b_o only (no b_qkv)", "b_qkv")):
            case = _self_attention_case(later, f"{name}, blocks of 2", 2, 5, 6, 2, 2)
            del case.args[1][dropped]
            yield case
        case = _self_attention_case(later, "unmasked (causal=False), blocks of 3", 2, 7, 8, 2, 3)
        yield Case(case.name, case.args, {"causal": False})
        case = _self_attention_case(later, "T = 2048, blocks of 128, forward and backward: "
                                    "memory below a tenth of one (T, T) score matrix",
                                    1, 2048, 4, 1, 128)
        yield Case(case.name, case.args, {"measure_memory": True})
        case = _self_attention_case(later, WHOLE_TILE, 1, 1024, 4, 1, 1024)
        yield Case(case.name, case.args, {"measure_memory": True})

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield _self_attention_case(rng, "heads = E, a block larger than T", 2, 3, 4, 4, 16)
    ### END HIDDEN TESTS

    def run(self, f, x, params, num_heads, dout, block_size, causal=True, measure_memory=False):
        def forward_backward():
            out, cache = f.flash_self_attention_forward(x, params, num_heads, causal,
                                                        block_size)
            return out, *f.flash_self_attention_backward(dout, cache)

        memory, (out, dx, grads) = _measured(forward_backward, x, x)
        return memory if measure_memory else {"out": out, "dx": dx, "grads": grads}

    def expected(self, x, params, num_heads, dout, block_size, causal=True,
                 measure_memory=False):
        """Notebook 13's self-attention (causal, or not) by autograd in float64, in x's
        dtype."""
        if measure_memory:
            return {MEMORY: block_size < x.shape[1]}  # (WHOLE_TILE)
        p64 = dict(zip(params, _float64(*params.values()), strict=True))
        want = _attention_expected(*_float64(x), p64, *_float64(dout), num_heads, num_heads,
                                   causal=causal)
        want = {k: a.astype(x.dtype) for k, a in want.items()}
        return {"out": want["out"], "dx": want["dx"], "grads": {n: want[f"d{n}"] for n in params}}

    def mistakes(self, x, params, num_heads, dout, block_size, causal=True,
                 measure_memory=False):
        if measure_memory:
            return {"with the whole (T, T) score matrix: the self-attention must compute its "
                    "heads with flash_attention_forward and _backward, in tiles of block_size":
                    lambda: {MEMORY: False}, **BLOCK_SIZE_HINT}
        return {f"with causal={not causal} where causal={causal} is given (pass causal on to "
                "flash_attention_forward)": lambda: self.expected(
                    x, params, num_heads, dout, block_size, not causal)}


def _gpt_attention_case(rng, name, B, T, E, H, Hkv, rope, block, dtype=np.float64,
                        measure_memory=False):
    """x, the GPT attention's parameters, dout (:func:`nb13_gpt._attention_case`), the heads,
    RoPE or not, the block size."""
    return Case(name, (*_attention_case(rng, B, T, E, H, Hkv, True, dtype), H, Hkv, rope, block),
                {"measure_memory": True} if measure_memory else {})


class GPTTiledAttention(Check, id="check-gpt-tiled-attention",
                        functions=("causal_self_attention_forward",
                                   "causal_self_attention_backward", "gpt_block_forward",
                                   "gpt_block_backward")):
    """The GPT's causal self-attention given a ``block_size``: the answer of the naive kernel,
    in the memory of the tiles (the branch that notebook 13 left for this one)."""

    axes = {"out": "bte", "dx": "bte"}  # axis names, for messages

    def cases(self, rng):
        yield _gpt_attention_case(rng, "B = 2, T = 7, E = 8, 2 heads, blocks of 3",
                                  2, 7, 8, 2, 2, False, 3)
        yield _gpt_attention_case(rng, "RoPE, 4 query heads sharing 2 key/value heads, blocks "
                                  "of 2", 2, 5, 8, 4, 2, True, 2)
        yield _gpt_attention_case(rng, "T = 2048, blocks of 128, forward and backward: memory "
                                  "below a tenth of one (T, T) score matrix", 1, 2048, 4, 1, 1,
                                  False, 128, measure_memory=True)
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        yield _through_block_case(later)
        yield _gpt_attention_case(later, WHOLE_TILE, 1, 1024, 4, 1, 1, False, 1024,
                                  measure_memory=True)

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield _gpt_attention_case(rng, "float32, RoPE, one key/value head, a block larger than "
                                  "T", 2, 3, 8, 4, 1, True, 16, np.float32)
    ### END HIDDEN TESTS

    def run(self, f, x, params, dout, H, Hkv, rope, block_size, measure_memory=False,
            block_config=None):
        if block_config is not None:  # through notebook 13's block, your gpt_block_forward
            from transformer_lab.models.shell import nest

            def block_forward_backward():
                out, cache = f.gpt_block_forward(x, nest(params), _config(block_config))
                return out, f.gpt_block_backward(dout, cache)

            return _measured(block_forward_backward, x, x)[0]
        _, tables = _head_rope(x, H, rope)

        def forward_backward():
            out, cache = f.causal_self_attention_forward(x, params, H, Hkv, tables, block_size)
            return out, *f.causal_self_attention_backward(dout, cache)

        memory, (out, dx, grads) = _measured(forward_backward, x, x)
        return memory if measure_memory else {"out": out, "dx": dx,
                                              **{f"d{k}": g for k, g in grads.items()}}

    def expected(self, x, params, dout, H, Hkv, rope, block_size, measure_memory=False,
                 block_config=None):
        if measure_memory:
            return {MEMORY: block_size < x.shape[1]}  # (WHOLE_TILE)
        return _attention_expected(x, params, dout, H, Hkv, _head_rope(x, H, rope)[0])

    def mistakes(self, x, params, dout, H, Hkv, rope, block_size, measure_memory=False,
                 block_config=None):
        if block_config is not None:
            return {"with the whole (T, T) score matrix in the block, though the attention "
                    "alone is tiled: gpt_block_forward (core/gpt.py, notebook 13) must pass "
                    "config.attention_block_size on to causal_self_attention_forward":
                    lambda: {MEMORY: False}}
        return {**MEMORY_HINT, **BLOCK_SIZE_HINT} if measure_memory else {}


def _through_block_case(rng, T=2048, block=128) -> Case:
    """A classic GPT block (one head, E = 2) with ``attention_block_size=block`` at length T,
    x, its parameters and dout: the memory of its forward and backward
    (:meth:`GPTTiledAttention.run`); the solution's peak is a third of the limit."""
    config, flat = _random_gpt(rng, "classic", 11, d_model=2, num_heads=1, num_layers=1,
                               d_ff=4, max_len=T, attention_block_size=block)
    params = _first_block(flat)
    x, dout = normals(rng, (1, T, 2), (1, T, 2))
    return Case(f"through your gpt_block_forward and _backward with attention_block_size="
                f"{block}, T = {T}: memory below a tenth of one (T, T) score matrix",
                (x, params, dout, 1, 1, False, block),
                {"measure_memory": True, "block_config": config})

