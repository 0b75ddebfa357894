"""Checks of notebook 05_attention_backward: the backward passes of softmax, attention,
multi-head and self-attention, and the notebook's variants (softmax with a temperature, attention
with a score bias).

Every backward check runs the forward and the backward of your core, and compares with PyTorch
autograd on the same inputs: the forward built from torch operations in the inputs' dtype,
``.backward(dout)``, the gradients read from ``.grad``. A query whose keys are all blocked gets
zero weights, zero output and zero gradient, as in the core. The hints compute the classic wrong
answers from the same PyTorch graph (its intermediate gradients kept with ``retain_grad``).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from transformer_lab.checks._torch_helpers import _np, _t, autograd, torch
from transformer_lab.checks.framework import Case, Check, later_rng, normals
from transformer_lab.checks.nb04_multihead_attention import (
    blocked_rows_mask,
    mha_case,
    self_attention_case,
    torch_heads,
    torch_softmax_rows,
)


def torch_attention(q, k, v, dout, mask=None, scale=None, dweights=None):
    """Autograd of ``softmax(q k^T * scale + mask) v`` (with ``dweights`` a loss term
    ``sum(P * dweights)``): the gradients dq, dk, dv, and the intermediates P, dP, dS."""
    qt, kt, vt = _t(q, True), _t(k, True), _t(v, True)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (qt * scale) @ kt.transpose(-1, -2)
    scores.retain_grad()
    weights = torch_softmax_rows(scores, mask)
    weights.retain_grad()
    out = weights @ vt
    extra = 0 if dweights is None else (weights * _t(dweights)).sum()  # a loss on P too
    ((out * _t(dout)).sum() + extra).backward()
    grads = {"dq": _np(qt.grad), "dk": _np(kt.grad), "dv": _np(vt.grad)}
    return grads, {"P": _np(weights), "dP": _np(weights.grad), "dS": _np(scores.grad),
                   "scale": scale}


def torch_mha_backward(query, key, value, params, num_heads, dout, mask=None, dweights=None):
    """Autograd of :func:`~.nb04_multihead_attention.torch_heads` (separate projections, or
    packed ``W_qkv`` with ``query`` the input x). Returns the answer in the layout of the core's
    backward (the key bias's gradient snapped: :func:`snap_key_bias`) and the gradients of the
    projections: dQ, dK, dV (B, T|S, E), or dQKV."""
    leaves = {name: _t(a, True) for name, a in params.items()}
    packed = "W_qkv" in params
    inputs = [_t(a, True) for a in ((query,) if packed else (query, key, value))]
    out, weights, projected = torch_heads(*(inputs * 3 if packed else inputs), leaves, num_heads,
                                          mask)
    for a in projected:
        a.retain_grad()
    extra = 0 if dweights is None else (weights * _t(dweights)).sum()  # a loss on P too
    ((out * _t(dout)).sum() + extra).backward()
    grads = {name: _np(leaf.grad) for name, leaf in leaves.items()}
    middle = {name: _np(a.grad) for name, a in zip(("dQKV",) if packed else ("dQ", "dK", "dV"),
                                                   projected, strict=True)}
    names = ("dx",) if packed else ("dquery", "dkey", "dvalue")
    answer = {name: _np(a.grad) for name, a in zip(names, inputs, strict=True)}
    return snap_key_bias({**answer, "grads": grads}), middle


def snap_key_bias(answer):
    """``answer`` with the gradient of the key bias (``b_k``, or the middle third of ``b_qkv``)
    set to exactly 0 where it is rounding noise: it is 0 in exact arithmetic (notebook 05,
    section 3), and a relative error between two rounding noises means nothing. Entries above
    ``sqrt(machine epsilon)`` times the largest weight gradient are kept (a wrong gradient is
    not rounding noise)."""
    grads = answer.get("grads") if isinstance(answer, dict) else None
    if not isinstance(grads, dict):
        return answer
    key = "b_k" if "b_k" in grads else "b_qkv"
    g = grads.get(key)
    weights = [w for name, w in grads.items() if name.startswith("W_")
               and isinstance(w, np.ndarray) and np.issubdtype(w.dtype, np.floating)]
    if not isinstance(g, np.ndarray) or not np.issubdtype(g.dtype, np.floating) or not weights:
        return answer
    scale = max(float(np.abs(w).max()) for w in weights)
    noise = math.sqrt(np.finfo(g.dtype).eps) * scale
    g = g.copy()
    part = g if key == "b_k" else g[g.shape[0] // 3: 2 * g.shape[0] // 3]  # a view of g
    part[np.abs(part) <= noise] = 0
    return {**answer, "grads": {**grads, key: g}}


def _averaged(answer, rows):
    """``answer`` with its parameter gradients divided by ``rows`` (a mean instead of a sum)."""
    return {**answer, "grads": {k: g / g.dtype.type(rows) for k, g in answer["grads"].items()}}


# --------------------------------------------------------------------------------------------
# Softmax


def row_cases(rng):
    """The first cases of a backward pass along rows (softmax, log-softmax): (x, dout) of one
    row, a batch of rows, and square rows (where a row sum that drops its axis broadcasts
    along the wrong one)."""
    yield Case("one row", (rng.standard_normal(5), rng.standard_normal(5)))
    yield Case("a batch of rows (3, 5)", normals(rng, (3, 5), (3, 5)))
    yield Case("square rows (4, 4): the row sum must keep its axis", normals(rng, (4, 4), (4, 4)))


class SoftmaxBackward(Check, id="check-softmax-backward",
                      functions=("softmax_forward", "softmax_backward")):
    loop_free = {"softmax_backward": "dx = y * (dout - sum(dout * y)), the sum along the last "
                                     "axis with keepdims=True"}

    def cases(self, rng):
        yield from row_cases(rng)
        x = rng.standard_normal((3, 4))
        x[0, 1] = x[2, 0] = x[2, 3] = -np.inf
        yield Case("-inf entries (blocked: zero weight, zero gradient)",
                   (x, rng.standard_normal((3, 4))))
        x = rng.standard_normal((3, 4))
        x[1] = -np.inf
        yield Case("a fully blocked row (all -inf: zero weights, zero gradient)",
                   (x, rng.standard_normal((3, 4))))
        yield Case("float32", normals(rng, (2, 3, 6), (2, 3, 6), dtype=np.float32))
        later = later_rng(rng)  # the case below was added later: the ones above stay as drawn
        yield Case("out=dout: dx written over dout (as attention_backward calls it)",
                   normals(later, (3, 5), (3, 5)), {"in_place": True})

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("four axes", normals(rng, (2, 2, 3, 4), (2, 2, 3, 4)))
        yield Case("huge scores", (rng.standard_normal((3, 7)) * 1000,
                                   rng.standard_normal((3, 7))))
        yield Case("one entry per row", normals(rng, (4, 1), (4, 1)))
    ### END HIDDEN TESTS

    def run(self, f, x, dout, in_place=False):
        _, cache = f.softmax_forward(x)
        if not in_place:
            return f.softmax_backward(dout, cache)
        given = dout.copy()  # the caller's dout: softmax_backward may write over it
        return f.softmax_backward(given, cache, out=given)

    def expected(self, x, dout, in_place=False):
        return autograd(torch_softmax_rows, dout, x)[1]

    def mistakes(self, x, dout, in_place=False):
        y = _np(torch_softmax_rows(_t(x)))
        overwritten = {"with dout overwritten before the row sum read it (out may be dout "
                       "itself: take sum(dout * y) first, then write into out)":
                       lambda: y * dout - y * (dout * y * y).sum(axis=-1, keepdims=True)}
        return {**(overwritten if in_place else {}),
                "with the row sum sum(dout * y) taken without keepdims=True (so it broadcasts "
                "along the row instead of down the rows)":
                lambda: y * (dout - (dout * y).sum(axis=-1)),
                "summing over the first axis (axis=0) instead of along each row (axis=-1)":
                lambda: y * (dout - (dout * y).sum(axis=0, keepdims=True)),
                "summing over the whole array instead of along each row (axis=-1)":
                lambda: y * (dout - (dout * y).sum()),
                "keeping only the diagonal of the Jacobian, dout * y * (1 - y)":
                lambda: dout * y * (1 - y),
                "forgetting the factor y outside the bracket, dout - sum(dout * y)":
                lambda: dout - (dout * y).sum(axis=-1, keepdims=True),
                "with sum(dout) where sum(dout * y) belongs: dx = y * (dout - sum(dout * y))":
                lambda: y * (dout - dout.sum(axis=-1, keepdims=True))}


# --------------------------------------------------------------------------------------------
# Scaled dot-product attention


class AttentionBackward(Check, id="check-attention-backward",
                        functions=("attention_forward", "attention_backward")):
    loop_free = {"attention_backward": "batched matrix products over every leading axis "
                                       "(np.swapaxes(a, -1, -2) for a transpose) and one "
                                       "softmax_backward"}
    axes = {"dq": "bhtd", "dk": "bhsd", "dv": "bhsd"}  # axis names, for messages
    tol = {"float64": 1e-9, "float32": 5e-5}

    @staticmethod
    def _case(rng, name, lead, t, s, d_k, d_v, dtype=np.float64, mask=None, scale=None,
              dweights=False):
        q_k_v_dout = normals(rng, (*lead, t, d_k), (*lead, s, d_k), (*lead, s, d_v),
                             (*lead, t, d_v), dtype=dtype)
        dw = rng.standard_normal((*lead, t, s)).astype(dtype) if dweights else None
        return Case(name, q_k_v_dout, {"mask": mask, "scale": scale, "dweights": dw})

    def cases(self, rng):
        yield self._case(rng, "one sequence, T = S = 4, d_k = d_v = 3", (), 4, 4, 3, 3)
        yield self._case(rng, "S != T and d_v != d_k (T = 2, S = 5, d_k = 4, d_v = 6)", (), 2, 5,
                         4, 6)
        yield self._case(rng, "leading axes (B = 2, H = 3)", (2, 3), 4, 5, 2, 3)
        yield self._case(rng, "a causal mask (T, T)", (2,), 4, 4, 3, 3,
                         mask=np.triu(np.ones((4, 4), dtype=bool), 1))
        yield self._case(rng, "a (B, 1, T, S) mask with a fully blocked row", (2, 2), 4, 5, 3, 3,
                         mask=blocked_rows_mask(rng, 2, 4, 5))
        yield self._case(rng, "float32, leading axes (2, 2)", (2, 2), 3, 4, 4, 2,
                         dtype=np.float32)
        yield self._case(rng, "dweights: a loss on the attention weights too", (2,), 3, 4, 3, 2,
                         dweights=True)
        later = later_rng(rng)  # the case below was added later: the ones above stay as drawn
        yield self._case(later, "a given scale = 0.3, S != T", (2,), 3, 4, 4, 3, scale=0.3)

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield self._case(rng, "one query, one key", (), 1, 1, 2, 3)
        yield self._case(rng, "a given scale = 0.3", (2,), 3, 3, 4, 4, scale=0.3)
        mask = np.where(rng.random((3, 4)) < 0.4, -np.inf, rng.standard_normal((3, 4)))
        mask[1] = -np.inf
        yield self._case(rng, "a float mask, one row all -inf", (2,), 3, 4, 2, 2, mask=mask)
        yield self._case(rng, "float32, dweights and a fully blocked row", (2, 2), 4, 5, 3, 3,
                         dtype=np.float32, mask=blocked_rows_mask(rng, 2, 4, 5), dweights=True)
    ### END HIDDEN TESTS

    def run(self, f, q, k, v, dout, mask=None, scale=None, dweights=None):
        _, cache = f.attention_forward(q, k, v, mask, scale)
        dq, dk, dv = f.attention_backward(dout, cache, dweights)
        return {"dq": dq, "dk": dk, "dv": dv}

    def expected(self, q, k, v, dout, mask=None, scale=None, dweights=None):
        return torch_attention(q, k, v, dout, mask, scale, dweights)[0]

    def mistakes(self, q, k, v, dout, mask=None, scale=None, dweights=None):
        right, mid = torch_attention(q, k, v, dout, mask, scale, dweights)
        P, dP, dS, c = (mid[name] for name in ("P", "dP", "dS", "scale"))
        sw = np.swapaxes
        found = {"without the scale in dq and dk (the scores are q k^T * scale)":
                 lambda: {**right, "dq": right["dq"] / c, "dk": right["dk"] / c},
                 "without the scale in dk (dq has it: the scores are q k^T * scale)":
                 lambda: {**right, "dk": right["dk"] / c},
                 "without the scale in dq (dk has it: the scores are q k^T * scale)":
                 lambda: {**right, "dq": right["dq"] / c},
                 "skipping the softmax backward (using dP where dS belongs)":
                 lambda: {**right, "dq": dP @ k * c, "dk": sw(dP, -1, -2) @ q * c},
                 "with dS = P * dP, the softmax backward without its row sum: dS = P * (dP - "
                 "sum(dP * P)) (softmax_backward)": lambda: {
                     **right, "dq": (P * dP) @ k * c, "dk": sw(P * dP, -1, -2) @ q * c}}
        if dweights is not None:  # dP holds dweights: what the softmax backward of the rest is
            plain = dP - dweights
            late = P * (plain - (plain * P).sum(axis=-1, keepdims=True)) + dweights
            found["adding dweights after the softmax backward: it joins dP = dout v^T, before"] = (
                lambda: {**right, "dq": late @ k * c, "dk": sw(late, -1, -2) @ q * c})
        if q.shape[-2] == k.shape[-2]:
            found["with dq and dk swapped: dq = dS k * scale, dk = dS^T q * scale"] = (
                lambda: {**right, "dq": sw(dS, -1, -2) @ q * c, "dk": dS @ k * c})
        if scale is not None:
            found["with 1 / sqrt(d_k) in dq and dk instead of the scale the forward used (the "
                  "cache's)"] = lambda: {**right, "dq": right["dq"] / c / math.sqrt(q.shape[-1]),
                                         "dk": right["dk"] / c / math.sqrt(q.shape[-1])}
        if dweights is not None:
            found["ignoring dweights (add it to dP = dout v^T before the softmax backward)"] = (
                lambda: torch_attention(q, k, v, dout, mask, scale)[0])
        if q.shape[-2] == k.shape[-2]:
            found["with dk = dS q instead of dS^T q (dS not transposed)"] = (
                lambda: {**right, "dk": dS @ q * c})
            found["with dv = P dout instead of P^T dout (P not transposed)"] = (
                lambda: {**right, "dv": P @ dout})
        return found


# --------------------------------------------------------------------------------------------
# Multi-head attention and self-attention

#: the cases of notebook 04's layers, with dout (and dweights) for the backward pass
_mha_case = functools.partial(mha_case, backward=True)
_self_attention_case = functools.partial(self_attention_case, backward=True)


class MultiHeadAttentionBackward(Check, id="check-mha-backward",
                                 functions=("multi_head_attention_forward",
                                            "multi_head_attention_backward")):
    loop_free = {"multi_head_attention_backward": "one attention_backward call on the (B, H, "
                                                  "T, Dh) heads that split_heads gives"}
    axes = {"dquery": "bte", "dkey": "bse", "dvalue": "bse"}  # axis names, for messages
    tol = {"float64": 1e-9, "float32": 5e-5}

    def cases(self, rng):
        yield _mha_case(rng, "one head (h = 1), S != T", 2, 3, 5, 8, 1)
        yield _mha_case(rng, "2 heads, query = key = value (three input gradients)", 2, 4, 4, 8, 2,
                        self_attention=True)
        yield _mha_case(rng, "4 heads, key and value widths 5 and 6 (kdim, vdim)", 2, 3, 4, 8, 4,
                        kdim=5, vdim=6)
        yield _mha_case(rng, "heads = width (8 heads of d_h = 1)", 2, 3, 5, 8, 8)
        yield _mha_case(rng, "no biases, 2 heads", 2, 3, 5, 8, 2, bias=False)
        yield _mha_case(rng, "a (B, 1, T, S) mask with a fully blocked row, 2 heads", 2, 4, 5, 8, 2,
                        mask=blocked_rows_mask(rng, 2, 4, 5))
        yield _mha_case(rng, "float32, 4 heads", 2, 3, 5, 8, 4, dtype=np.float32)
        yield _mha_case(rng, "dweights per head (B, H, T, S), 2 heads", 2, 3, 4, 8, 2,
                        dweights=True)
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        yield _mha_case(later, "the input biases b_q, b_k, b_v without b_o, 2 heads", 2, 3, 4, 8, 2,
                        bias="in")
        yield _mha_case(later, "b_o without the input biases, 2 heads", 2, 3, 4, 8, 2, bias="out")

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield _mha_case(rng, "batch of 1, one query (T = 1), 2 heads", 1, 1, 3, 4, 2)
        yield _mha_case(rng, "6 heads, E = 24, kdim = vdim = 10, a blocked row", 3, 4, 6, 24, 6,
                        kdim=10, vdim=10, mask=blocked_rows_mask(rng, 3, 4, 6))
        yield _mha_case(rng, "float32, dweights and a causal mask", 2, 5, 5, 8, 4, dtype=np.float32,
                        dweights=True, mask=np.triu(np.ones((5, 5), dtype=bool), 1))
    ### END HIDDEN TESTS

    def run(self, f, query, key, value, params, num_heads, dout, mask=None, dweights=None):
        _, cache = f.multi_head_attention_forward(query, key, value, params, num_heads, mask)
        dquery, dkey, dvalue, grads = f.multi_head_attention_backward(dout, cache, dweights)
        return snap_key_bias({"dquery": dquery, "dkey": dkey, "dvalue": dvalue, "grads": grads})

    def expected(self, query, key, value, params, num_heads, dout, mask=None, dweights=None):
        return torch_mha_backward(query, key, value, params, num_heads, dout, mask, dweights)[0]

    def mistakes(self, query, key, value, params, num_heads, dout, mask=None, dweights=None):
        right, mid = torch_mha_backward(query, key, value, params, num_heads, dout, mask,
                                        dweights)
        b, t = dout.shape[:2]
        found = {"averaging the parameter gradients over the batch instead of summing them "
                 "(every sequence uses the same weights: their contributions add)":
                 lambda: _averaged(right, b),
                 "averaging the parameter gradients over the B * T rows instead of summing them":
                 lambda: _averaged(right, b * t)}
        if params["W_q"].shape[0] == params["W_q"].shape[1]:
            found["with dquery = dQ W_q instead of dQ W_q^T (the weight not transposed)"] = (
                lambda: {**right, "dquery": mid["dQ"] @ params["W_q"]})
        if dweights is not None:
            found["ignoring dweights (pass it on to attention_backward)"] = (
                lambda: self.expected(query, key, value, params, num_heads, dout, mask))
        return found


class SelfAttentionBackward(Check, id="check-self-attention-backward",
                            functions=("self_attention_forward", "self_attention_backward")):
    axes = {"dx": "bte"}  # axis names, for messages
    tol = {"float64": 1e-9, "float32": 5e-5}

    def cases(self, rng):
        yield _self_attention_case(rng, "one head (h = 1)", 2, 4, 8, 1)
        yield _self_attention_case(rng, "2 heads", 2, 5, 8, 2)
        yield _self_attention_case(rng, "heads = width (8 heads of d_h = 1)", 2, 3, 8, 8)
        yield _self_attention_case(rng, "no biases, 4 heads", 2, 3, 8, 4, bias=False)
        yield _self_attention_case(rng, "a causal (T, T) mask, 2 heads", 2, 4, 8, 2,
                                   mask=np.triu(np.ones((4, 4), dtype=bool), 1))
        yield _self_attention_case(rng, "a (B, 1, T, T) mask with a fully blocked row, 4 heads", 2,
                                   4, 8, 4, mask=blocked_rows_mask(rng, 2, 4, 4))
        yield _self_attention_case(rng, "float32, 4 heads", 2, 5, 8, 4, dtype=np.float32)
        yield _self_attention_case(rng, "dweights per head (B, H, T, T), 2 heads", 2, 3, 8, 2,
                                   dweights=True)
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        yield _self_attention_case(later, "b_qkv without b_o, 2 heads", 2, 3, 8, 2, bias="in")
        yield _self_attention_case(later, "b_o without b_qkv, 2 heads", 2, 3, 8, 2, bias="out")

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield _self_attention_case(rng, "batch of 1, length 1, 2 heads", 1, 1, 4, 2)
        yield _self_attention_case(rng, "float32, 6 heads, E = 24, a fully blocked row", 3, 5, 24,
                                   6, dtype=np.float32, mask=blocked_rows_mask(rng, 3, 5, 5),
                                   dweights=True)
    ### END HIDDEN TESTS

    def run(self, f, x, params, num_heads, dout, mask=None, dweights=None):
        _, cache = f.self_attention_forward(x, params, num_heads, mask)
        dx, grads = f.self_attention_backward(dout, cache, dweights)
        return snap_key_bias({"dx": dx, "grads": grads})

    def expected(self, x, params, num_heads, dout, mask=None, dweights=None):
        return torch_mha_backward(x, x, x, params, num_heads, dout, mask, dweights)[0]

    def mistakes(self, x, params, num_heads, dout, mask=None, dweights=None):
        right, mid = torch_mha_backward(x, x, x, params, num_heads, dout, mask, dweights)
        thirds = np.split(mid["dQKV"], 3, axis=-1), np.split(params["W_qkv"], 3, axis=1)
        path = {n: d @ w.T for n, d, w in zip("qkv", *thirds, strict=True)}  # dx through q, k, v
        b, t = dout.shape[:2]
        found = {"forgetting the key path of the input gradient (dx = dQ W_q^T + dV W_v^T: x "
                 "feeds the keys too)":
                 lambda: {**right, "dx": path["q"] + path["v"]},
                 "keeping only the query path of the input gradient (dx = dQ W_q^T; x also "
                 "feeds the keys and the values)":
                 lambda: {**right, "dx": path["q"]},
                 "averaging the parameter gradients over the batch instead of summing them":
                 lambda: _averaged(right, b),
                 "averaging the parameter gradients over the B * T rows instead of summing them":
                 lambda: _averaged(right, b * t)}
        if dweights is not None:
            found["ignoring dweights (pass it on to attention_backward)"] = (
                lambda: self.expected(x, params, num_heads, dout, mask))
        return found


# --------------------------------------------------------------------------------------------
# Variant exercises


class SoftmaxTemperatureBackward(Check, id="check-softmax-temperature",
                                 arguments=("softmax_temperature_backward",)):
    @staticmethod
    def _case(rng, name, shape, tau):
        x = rng.standard_normal(shape)
        y = _np(torch_softmax_rows(_t(x / tau)))
        return Case(name, (rng.standard_normal(shape), x, y, tau))

    def cases(self, rng):
        yield self._case(rng, "one row, tau = 0.5", (5,), 0.5)
        yield self._case(rng, "rows (3, 4), tau = 2", (3, 4), 2.0)
        yield self._case(rng, "three axes (2, 3, 6), tau = 0.7", (2, 3, 6), 0.7)

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield self._case(rng, "tau = 1: the plain softmax backward", (4, 3), 1.0)
        yield self._case(rng, "a sharp tau = 0.05", (3, 5), 0.05)
    ### END HIDDEN TESTS

    def run(self, f, dy, x, y, tau):
        dx, dtau = f.softmax_temperature_backward(dy, x, y, tau)
        return {"dx": dx, "dtau": dtau, "dtau is a float": isinstance(dtau, float)}

    def expected(self, dy, x, y, tau):
        softmax = torch.softmax
        _, dx, dtau = autograd(lambda xt, taut: softmax(xt / taut, dim=-1), dy, x, np.float64(tau))
        return {"dx": dx, "dtau": float(dtau), "dtau is a float": True}

    def mistakes(self, dy, x, y, tau):
        right = self.expected(dy, x, y, tau)
        return {"forgetting the factor 1/tau in dx (dx = dz)":
                lambda: {**right, "dx": right["dx"] * tau},
                "with dtau = +sum(dz * x) / tau^2: d(x / tau)/dtau = -x / tau^2 has a minus":
                lambda: {**right, "dtau": -right["dtau"]}}


class ScoreBiasAttentionBackward(Check, id="check-score-bias-attention",
                                 arguments=("score_bias_attention_backward",)):
    loop_free = {"score_bias_attention_backward": "sum dA over the leading axes with one "
                                                  "reshape and .sum(axis=0)"}

    @staticmethod
    def _case(rng, name, lead, t=3, s=4, d_k=2, d_v=3, zero_bias=False, scale=None):
        q, k, v = normals(rng, (*lead, t, d_k), (*lead, s, d_k), (*lead, s, d_v))
        a = np.zeros((t, s)) if zero_bias else rng.standard_normal((t, s))
        scale = 1 / math.sqrt(d_k) if scale is None else scale
        p = _np(torch_softmax_rows(_t(q @ np.swapaxes(k, -1, -2) * scale + a)))
        return Case(name, (rng.standard_normal((*lead, t, d_v)), q, k, v, p, scale),
                    {"A": a})

    def cases(self, rng):
        yield self._case(rng, "one sequence, no leading axes", ())
        yield self._case(rng, "a batch: leading axes (2,)", (2,))
        yield self._case(rng, "batch and heads: leading axes (2, 3)", (2, 3))
        yield self._case(later_rng(rng), "scale = 1 (T5's: not 1/sqrt(d_k))", (2,), scale=1.0)

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield self._case(rng, "A = 0: plain attention, leading axes (2, 2)", (2, 2),
                         zero_bias=True)
        yield self._case(rng, "T = S = 1", (3,), t=1, s=1)
    ### END HIDDEN TESTS

    def run(self, f, dO, Q, K, V, P, scale, A=None):
        dQ, dK, dV, dA = f.score_bias_attention_backward(dO, Q, K, V, P, scale)
        return {"dQ": dQ, "dK": dK, "dV": dV, "dA": dA}

    def expected(self, dO, Q, K, V, P, scale, A=None):
        softmax = torch.softmax
        _, *grads = autograd(lambda q, k, v, a: softmax((q @ k.transpose(-1, -2)) * scale + a,
                                                        dim=-1) @ v, dO, Q, K, V, A)
        return dict(zip(("dQ", "dK", "dV", "dA"), grads, strict=True))

    def mistakes(self, dO, Q, K, V, P, scale, A=None):
        right = self.expected(dO, Q, K, V, P, scale, A)
        n = math.prod(Q.shape[:-2])
        ratio = 1 / math.sqrt(Q.shape[-1]) / scale  # 1/sqrt(d_k) where scale belongs
        return {"with 1/sqrt(d_k) in dQ and dK where the scale given belongs (T5's is 1)":
                lambda: {**right, "dQ": right["dQ"] * ratio, "dK": right["dK"] * ratio},
                "averaging dA over the leading axes instead of summing (A is shared by every "
                "sequence and head: their gradients add)":
                lambda: {**right, "dA": right["dA"] / n},
                "using dP (before the softmax backward) for dA":
                lambda: {**right, "dA": (dO @ np.swapaxes(V, -1, -2)).reshape(
                    -1, *P.shape[-2:]).sum(axis=0)}}
