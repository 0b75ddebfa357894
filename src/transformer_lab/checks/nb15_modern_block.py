"""Checks of notebook 15_modern_block: RoPE, RMSNorm, SwiGLU, grouped-query attention, the
modern block and the modern model.

Expected answers come from PyTorch (functional ops and autograd) and, for whole blocks, from
:mod:`transformer_lab.reference.torch_gpt` -- the same model written again in PyTorch; none of
them calls the core.
"""

from __future__ import annotations

import functools

import numpy as np

from transformer_lab.checks._torch_helpers import _np, _t, autograd, torch
from transformer_lab.checks.framework import Case, Check, later_rng, normals
from transformer_lab.checks.nb13_gpt import (
    GPTModel,
    _attention_case,
    _attention_expected,
    _block_case,
    _BlockCheck,
    _head_rope,
    _model_case,
)
from transformer_lab.checks.nb14_decoding import CachedStep

# --------------------------------------------------------------------------------------------
# §1 RoPE


class RoPE(Check, id="check-rope", functions=("rope_tables", "rope_forward", "rope_backward")):
    axes = {"out": "td", "dx": "td"}  # axis names, for messages

    def cases(self, rng):
        yield Case("B = 2, heads = 3, T = 5, Dh = 6",
                   (np.arange(5), *normals(rng, (2, 3, 5, 6), (2, 3, 5, 6))))
        yield Case("positions 7..10 (a cached step)",
                   (np.arange(7, 11), *normals(rng, (1, 2, 4, 4), (1, 2, 4, 4))))
        yield Case("float32", (np.arange(3), *normals(rng, (2, 3, 8), (2, 3, 8), dtype=np.float32)))
        later = later_rng(rng)  # the case below was added later: the ones above stay as drawn
        yield Case("base 500 (the frequencies' base is an argument)",
                   (np.arange(6), *normals(later, (2, 6, 8), (2, 6, 8)), 500.0))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("Dh = 2, long positions", (np.arange(100, 103), *normals(rng, (3, 2), (3, 2))))
    ### END HIDDEN TESTS

    def run(self, f, positions, x, dout, base=None):
        cos, sin = f.rope_tables(positions, x.shape[-1], *([] if base is None else [base]))
        out, cache = f.rope_forward(x, cos.astype(x.dtype), sin.astype(x.dtype))
        return {"cos": np.asarray(cos, np.float64), "sin": np.asarray(sin, np.float64),
                "out": out, "dx": f.rope_backward(dout, cache)}

    def expected(self, positions, x, dout, base=None):
        from transformer_lab.reference.torch_gpt import _rotate  # here: it imports torch

        Dh, base = x.shape[-1], 10000.0 if base is None else base
        omega = base ** (-torch.arange(0, Dh, 2, dtype=torch.float64) / Dh)
        angles = torch.as_tensor(positions, dtype=torch.float64)[:, None] * omega
        out, dx = autograd(lambda tx: _rotate(tx, angles.to(tx.dtype)), dout, x)
        return {"cos": torch.cos(angles).numpy(), "sin": torch.sin(angles).numpy(), "out": out,
                "dx": dx}

    def mistakes(self, positions, x, dout, base=None):
        want = self.expected(positions, x, dout, base)
        c, s = want["cos"].astype(x.dtype), want["sin"].astype(x.dtype)
        other = _turned(x, c, -s)
        half = x.shape[-1] // 2
        halves = np.concatenate([x[..., :half] * c - x[..., half:] * s,
                                 x[..., :half] * s + x[..., half:] * c], axis=-1)
        hints = {"rotating by minus the angle (clockwise; RoPE, as RoFormer and LLaMA write it, "
                 "turns each pair counterclockwise by a = p omega_i: (x_2i cos a - x_2i+1 sin a, "
                 "x_2i sin a + x_2i+1 cos a))": lambda: {**want, "out": other},
                 "pairing feature i with feature i + Dh/2 (the 'rotate_half' layout) instead of "
                 "neighbours (2i, 2i + 1)": lambda: {**want, "out": halves},
                 "with cos and sin swapped: the pair turns as (x_2i cos a - x_2i+1 sin a, "
                 "x_2i sin a + x_2i+1 cos a)": lambda: {**want, "out": _turned(x, s, c)}}
        if base is not None:
            hints["writing in the base 10000 instead of using the argument base"] = (
                lambda: self.expected(positions, x, dout))
        hints["with a backward that rotates by +a, as the forward does: it rotates back, by -a "
              "(the transpose of the rotation)"] = lambda: {**want, "dx": _turned(dout, c, s)}
        i, b = np.arange(x.shape[-1] // 2), 10000.0 if base is None else base

        def tables(exponent):  # the tables of the frequencies base^exponent (a mistake)
            angles = np.asarray(positions, np.float64)[:, None] * b ** exponent
            return {**want, "cos": np.cos(angles), "sin": np.sin(angles)}

        for wrong, why, exponent in (
                ("-i / Dh", "the 2 left out", -i / x.shape[-1]),
                ("-4i / Dh", "the 2 counted twice: arange(0, Dh, 2) already steps by 2",
                 -4 * i / x.shape[-1]),
                ("+2i / Dh", "the sign left out", 2 * i / x.shape[-1])):
            hints[f"with omega_i = base^({wrong}), {why}; it is base^(-2i / Dh) for pair i"] = (
                lambda e=exponent: tables(e))
        hints["with the positions one too far (position p turns by p * omega_i: position 0 is "
              "not turned)"] = lambda: self.expected(np.asarray(positions) + 1, x, dout, base)
        return hints


def _turned(a, cos, sin):
    """Each pair (a_2i, a_2i+1) of a (..., T, Dh) turned counterclockwise by the angle whose
    cosine and sine (T, Dh / 2) are given (by minus the angle with -sin); in NumPy, for the
    checks' mistakes."""
    out, a0, a1 = np.empty_like(a), a[..., 0::2], a[..., 1::2]
    out[..., 0::2], out[..., 1::2] = a0 * cos - a1 * sin, a0 * sin + a1 * cos
    return out


# --------------------------------------------------------------------------------------------
# §2 RMSNorm


#: check-gpt-rms-norm's outputs of the block's norm, extended to kind "rms"
NORM_OUT, NORM_DX = "out of norm_forward(x, {'gamma': gamma}, 'rms', eps)", "dx of norm_backward"


class RMSNorm(Check, id="check-gpt-rms-norm", functions=("rms_norm_forward", "rms_norm_backward",
                                                         "norm_forward", "norm_backward")):
    axes = {"out": "te", "dx": "te", NORM_OUT: "te", NORM_DX: "te"}  # axis names, for messages

    def cases(self, rng):
        yield Case("(2, 3, 6)", (rng.standard_normal((2, 3, 6)) * 3, 1 + rng.standard_normal(6)
                                 * 0.3, rng.standard_normal((2, 3, 6))))
        yield Case("float32", (rng.standard_normal((4, 5)).astype(np.float32),
                               np.ones(5, np.float32), rng.standard_normal((4, 5))
                               .astype(np.float32)))
        later = later_rng(rng)  # the case below was added later: the ones above stay as drawn
        yield Case("eps = 0.01 for inputs of size 0.1 (eps is an argument)",
                   (later.standard_normal((3, 4)) * 0.1, 1 + later.standard_normal(4) * 0.3,
                    later.standard_normal((3, 4))), {"eps": 0.01})

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("tiny inputs (eps matters)", (rng.standard_normal((2, 4)) * 1e-4,
                                                 rng.standard_normal(4),
                                                 rng.standard_normal((2, 4))))
    ### END HIDDEN TESTS

    def run(self, f, x, gamma, dout, eps=None):
        given = [] if eps is None else [eps]
        out, cache = f.rms_norm_forward(x, gamma, *given)
        dx, grads = f.rms_norm_backward(dout, cache)
        block_out, block_cache = f.norm_forward(x, {"gamma": gamma}, "rms", *given)
        try:
            block_dx = f.norm_backward(dout, block_cache)[0]
        except (ValueError, TypeError) as err:
            if np.allclose(block_out, out):
                raise
            raise type(err)(f"{err} -- norm_backward met a cache that norm_forward(x, params, "
                            "'rms') did not make with rms_norm_forward: is norm_forward "
                            "extended to kind 'rms' too?") from err
        return {"out": out, "dx": dx, "dgamma": grads["gamma"], NORM_OUT: block_out,
                NORM_DX: block_dx}

    def expected(self, x, gamma, dout, eps=None, rms=True):
        """RMSNorm (eps by default 1e-5) -- or, a mistake, a layer norm without beta -- by
        autograd."""
        F = torch.nn.functional
        eps = 1e-5 if eps is None else eps

        def norm(tx, tg):
            return (F.rms_norm(tx, (x.shape[-1],), tg, eps) if rms
                    else F.layer_norm(tx, (x.shape[-1],), tg, None, eps))

        out, dx, dgamma = autograd(norm, dout, x, gamma)
        return {"out": out, "dx": dx, "dgamma": dgamma, NORM_OUT: out, NORM_DX: dx}

    def mistakes(self, x, gamma, dout, eps=None):
        tx, tg = _t(x), _t(gamma)
        e = 1e-5 if eps is None else eps
        eps_outside = _np(tg * tx / (tx.pow(2).mean(-1, keepdim=True).sqrt() + e))
        by_std = _np(tg * tx / (tx.var(-1, unbiased=False, keepdim=True) + e).sqrt())

        def layer_norm_in_the_block():  # rms_norm_* right, norm_forward not extended
            right, layer = self.expected(x, gamma, dout, eps), self.expected(x, gamma, dout, eps,
                                                                              rms=False)
            return {**right, NORM_OUT: layer["out"], NORM_DX: layer["dx"]}

        hints = {"with norm_forward still the layer norm where kind is 'rms': extend it, and "
                 "norm_backward, to call your rms_norm_forward / rms_norm_backward":
                 layer_norm_in_the_block,
                 "subtracting the mean first (that is a layer norm)":
                 lambda: self.expected(x, gamma, dout, eps, rms=False),
                 # the forward alone: a hint names the first output that differs
                 "with eps added outside the square root (x / (sqrt(mean(x^2)) + eps)); it "
                 "belongs inside: x / sqrt(mean(x^2) + eps)": lambda: {"out": eps_outside},
                 "dividing by the standard deviation, sqrt(var(x) + eps), instead of the root "
                 "mean square, sqrt(mean(x^2) + eps)": lambda: {"out": by_std}}
        if eps is not None:
            hints["writing in eps = 1e-5 instead of using the argument eps"] = (
                lambda: self.expected(x, gamma, dout))
        hints["with layer norm's -mean(g) term in the backward pass: RMSNorm subtracts no mean, "
              "dx = (g - x_hat * mean(g * x_hat)) / r"] = lambda: {"dx": _rms_dx(
                  x, gamma, dout, e, mean_g=True)}
        hints["without the path through r: dx = (g - x_hat * mean(g * x_hat)) / r, not g / r"] = \
            lambda: {"dx": _rms_dx(x, gamma, dout, e, through_r=False)}
        hints["without the factor 1 / r in front of dx: dx = (g - x_hat * mean(g * x_hat)) / r"] \
            = lambda: {"dx": _rms_dx(x, gamma, dout, e, over_r=False)}
        hints["without gamma in dx: the gradient that reaches x_hat is g = dout * gamma"] = \
            lambda: {"dx": _rms_dx(x, gamma, dout, e, scaled=False)}
        return hints


def _rms_dx(x, gamma, dout, eps, mean_g=False, through_r=True, over_r=True, scaled=True):
    """dx of RMSNorm with a mistake: layer norm's -mean(g) term too (``mean_g``), without the
    term of r's own gradient (``through_r`` False), without the 1 / r (``over_r`` False), or with
    dout for g = dout * gamma (``scaled`` False), in x's dtype."""
    x64, g = x.astype(np.float64), (dout * (gamma if scaled else 1)).astype(np.float64)
    r = np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps)
    x_hat = x64 / r
    dx = g - (g.mean(-1, keepdims=True) if mean_g else 0)
    if through_r:
        dx = dx - x_hat * (g * x_hat).mean(-1, keepdims=True)
    return (dx / r if over_r else dx).astype(x.dtype)


# --------------------------------------------------------------------------------------------
# §3 SwiGLU


def _swiglu_case(rng, shape, F, scale=0.5, dt=np.float64, x_scale=1.0) -> tuple:
    """x (..., E), the weights W_gate, W_up (E, F) and W_down (F, E), and dout."""
    E = shape[-1]
    return ((rng.standard_normal(shape) * x_scale).astype(dt),
            {k: (rng.standard_normal(s) * scale).astype(dt)
             for k, s in (("W_gate", (E, F)), ("W_up", (E, F)), ("W_down", (F, E)))},
            rng.standard_normal(shape).astype(dt))


def _sigmoid(a):
    return 0.5 * (1 + np.tanh(a / 2))


#: silu's derivative as students get it wrong, each a function of a
_WRONG_SILU_DERIVATIVES = {
    "sigmoid(a)": _sigmoid,
    "sigmoid(a) (1 - sigmoid(a)), the sigmoid's own derivative,":
        lambda a: _sigmoid(a) * (1 - _sigmoid(a)),
    "sigmoid(a) (1 + a)": lambda a: _sigmoid(a) * (1 + a),
    "sigmoid(a) (1 + a sigmoid(a))": lambda a: _sigmoid(a) * (1 + a * _sigmoid(a))}


def _swiglu_dx(x, params, dout, dsilu=None, up_path=True, crossed=False):
    """{"dx": ...} of SwiGLU with ``dsilu`` as silu's derivative (None: the right one),
    without the up projection's path (``up_path`` False), or with each path's factor the
    other's (``crossed``: da from dh * silu(a), du = dh * u), in float64, then x's dtype."""
    x64, dout64 = x.astype(np.float64), dout.astype(np.float64)
    W = {k: w.astype(np.float64) for k, w in params.items()}
    a, u = x64 @ W["W_gate"], x64 @ W["W_up"]
    dh = dout64 @ W["W_down"].T
    s = _sigmoid(a)
    gate, up = (a * s, u) if crossed else (u, a * s)  # what multiplies dh on each path
    da = dh * gate * (s * (1 + a * (1 - s)) if dsilu is None else dsilu(a))
    du = dh * up
    return {"dx": (da @ W["W_gate"].T + (du @ W["W_up"].T if up_path else 0)).astype(x.dtype)}


def _silu_of_product(x, params):
    """SwiGLU's output with silu applied to the product of the two paths, a mistake."""
    x64, W = x.astype(np.float64), {k: v.astype(np.float64) for k, v in params.items()}
    h = (x64 @ W["W_gate"]) * (x64 @ W["W_up"])
    return ((h * _sigmoid(h)) @ W["W_down"]).astype(x.dtype)


def _swiglu_out(x, params, silu, up=lambda u: u):
    """SwiGLU's output with ``silu`` in place of a sigmoid(a), and ``up`` applied to the up
    projection u, in float64, then x's dtype."""
    x64 = x.astype(np.float64)
    W = {k: w.astype(np.float64) for k, w in params.items()}
    return ((silu(x64 @ W["W_gate"]) * up(x64 @ W["W_up"])) @ W["W_down"]).astype(x.dtype)


#: check-swiglu's outputs of the block's MLP, extended to kind "swiglu"
MLP_OUT, MLP_DX = "out of mlp_forward(x, params, 'swiglu')", "dx of mlp_backward"
SILU = "silu_forward(x)'s out"


class SwiGLU(Check, id="check-swiglu",
             functions=("silu_forward", "silu_backward", "swiglu_forward", "swiglu_backward",
                        "mlp_forward", "mlp_backward")):
    axes = {"out": "te", "dx": "te", MLP_OUT: "te", MLP_DX: "te"}  # axis names, for messages

    def cases(self, rng):
        yield Case("E = 4, F = 6", _swiglu_case(rng, (2, 3, 4), 6))
        yield Case("float32, pre-activations past 89, where exp overflows in float32",
                   _swiglu_case(rng, (5, 3), 2, dt=np.float32, x_scale=200.0))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("large pre-activations (no overflow)",
                   _swiglu_case(rng, (2, 3), 4, scale=1.0, x_scale=100.0))
    ### END HIDDEN TESTS

    def run(self, f, x, params, dout):
        out, cache = f.swiglu_forward(x, params)
        dx, grads = f.swiglu_backward(dout, cache)
        try:
            block_out, block_cache = f.mlp_forward(x, params, "swiglu")
        except KeyError as err:  # SwiGLU's parameters met another network's code
            raise KeyError(f"{err}: mlp_forward(x, params, 'swiglu') looked for a parameter "
                           "SwiGLU does not have -- is it extended to kind 'swiglu' (W_gate, "
                           "W_up, W_down; your swiglu_forward)?") from err
        found = {"out": out, "dx": dx, **{f"d{k}": g for k, g in grads.items()},
                 MLP_OUT: block_out, MLP_DX: f.mlp_backward(dout, block_cache)[0]}
        return {**found, SILU: f.silu_forward(x)[0]}  # last: an x changed in place is told

    def mistakes(self, x, params, dout):
        found = {"with the gate and the up projection swapped (silu goes on x W_gate)":
                 lambda: self.expected(x, params, dout, gate="W_up", up="W_gate"),
                 "with the gradients of W_gate and W_up under each other's keys": lambda: {
                     **(right := self.expected(x, params, dout)), "dW_gate": right["dW_up"],
                     "dW_up": right["dW_gate"]}}
        for wrong, derivative in _WRONG_SILU_DERIVATIVES.items():
            found[f"with {wrong} as silu's derivative; d(a sigmoid(a))/da is "
                  "sigmoid(a) (1 + a (1 - sigmoid(a)))"] = (
                lambda d=derivative: _swiglu_dx(x, params, dout, d))
        found.update({  # the forward's: the first output that differs is named
            "with sigmoid(2a) for sigmoid(a) in silu (tanh(a / 2) = 2 sigmoid(a) - 1)":
            lambda: {"out": _swiglu_out(x, params, lambda a: a * _sigmoid(2 * a))},
            "with the gate's input a where silu(a) belongs (a * u, not silu(a) * u)":
            lambda: {"out": _swiglu_out(x, params, lambda a: a)},
            "with sigmoid(a) where silu(a) = a * sigmoid(a) belongs":
            lambda: {"out": _swiglu_out(x, params, _sigmoid)},
            "with silu of the product, silu(a * u): only the gate goes through silu, "
            "silu(a) * u": lambda: {"out": _silu_of_product(x, params)},
            "with silu on the up projection too: only the gate goes through silu, "
            "silu(a) * u with u = x W_up as it is":
            lambda: {"out": _swiglu_out(x, params, lambda a: a * _sigmoid(a),
                                        lambda u: u * _sigmoid(u))},
            "without the up projection's path in dx (dx = da W_gate^T + du W_up^T)":
            lambda: {"dx": _swiglu_dx(x, params, dout, None, up_path=False)["dx"]},
            "with the two paths' factors crossed: the gate's input gets dh * u (through silu's "
            "derivative), the up projection's dh * silu(a)":
            lambda: {"dx": _swiglu_dx(x, params, dout, crossed=True)["dx"]}})
        return found

    def expected(self, x, params, dout, gate="W_gate", up="W_up"):
        silu = torch.nn.functional.silu
        out, dx, grads = autograd(lambda tx, p: (silu(tx @ p[gate]) * (tx @ p[up])) @ p["W_down"],
                                  dout, x, params)
        return {"out": out, "dx": dx, **{f"d{k}": g for k, g in grads.items()}, MLP_OUT: out,
                MLP_DX: dx, SILU: silu(torch.as_tensor(x)).numpy()}


# --------------------------------------------------------------------------------------------
# §4 Grouped-query attention and the modern block


class GroupedQueryAttention(Check, id="check-grouped-query-attention",
                            functions=("repeat_kv_forward", "repeat_kv_backward",
                                       "self_attention_forward", "self_attention_backward",
                                       "causal_self_attention_forward",
                                       "causal_self_attention_backward", "rope_forward",
                                       "rope_backward", "causal_self_attention_step")):
    axes = {"out": "bte", "dx": "bte"}  # axis names, for messages
    STEP = "out of the cached step (causal_self_attention_step: 2 positions, then 1 at a time)"

    def cases(self, rng):
        for name, (B, T, E, H, Hkv, rope) in {
                "4 query heads sharing 2 key/value heads": (3, 5, 8, 4, 2, False),
                "one key/value head (multi-query), RoPE": (1, 4, 8, 4, 1, True),
                "2 key/value heads, RoPE": (2, 6, 24, 6, 2, True)}.items():
            yield Case(name, (*_attention_case(rng, B, T, E, H, Hkv, False), H, Hkv, rope))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("float32, biases, RoPE",
                   (*_attention_case(rng, 2, 3, 16, 4, 2, True, np.float32), 4, 2, True))
    ### END HIDDEN TESTS

    def run(self, f, x, params, dout, H, Hkv, rope):
        _, tables = _head_rope(x, H, rope)
        out, cache = f.causal_self_attention_forward(x, params, H, Hkv, tables)
        dx, grads = f.causal_self_attention_backward(dout, cache)
        return {"out": out, self.STEP: self._cached(f, x, params, H, Hkv, tables), "dx": dx,
                **{f"d{k}": g for k, g in grads.items()}}

    @staticmethod
    def _cached(f, x, params, H, Hkv, tables):
        """The cached step over the same positions: a prompt of 2, then one position at a time,
        each with the rows of the RoPE tables of its positions."""
        B, T, E = x.shape
        K = np.zeros((B, Hkv, T, E // H), x.dtype)
        V = np.zeros_like(K)
        pieces, length = [], 0
        for size in [min(2, T)] + [1] * (T - min(2, T)):
            end = length + size
            rope = None if tables is None else (tables[0][length:end], tables[1][length:end])
            out, length = f.causal_self_attention_step(x[:, length:end], params, H, Hkv, K, V,
                                                       length, rope)
            pieces.append(out)
        return np.concatenate(pieces, axis=1)

    def expected(self, x, params, dout, H, Hkv, rope):
        want = _attention_expected(x, params, dout, H, Hkv, _head_rope(x, H, rope)[0])
        return {"out": want["out"], self.STEP: want["out"],
                **{k: g for k, g in want.items() if k != "out"}}

    def mistakes(self, x, params, dout, H, Hkv, rope):
        angles, _ = _head_rope(x, H, rope)

        def tiled():  # the model whose H key/value heads are the shared ones in tile order
            copies = _kv_heads_in_order(params, x.shape[-1], H, np.tile(np.arange(Hkv), H // Hkv))
            return {"out": _attention_expected(x, copies, dout, H, H, angles)["out"]}

        hints = {"with the key/value heads given out in tile order (np.tile: query head h gets "
                 "h % Hkv); each serves n_rep neighbouring query heads, h // n_rep (np.repeat "
                 "on the head axis)": tiled}
        if H > Hkv:
            n = H // Hkv  # query heads per key/value head

            def shared(how):  # the gradients with the shared heads' made ``how`` from the H
                return lambda: _kv_gradient_shared(x, params, dout, H, Hkv, angles, how)

            hints["with repeat_kv_backward averaging the gradients of the query heads a key/value "
                  "head serves: it is used n_rep times, so its gradient is their sum"] = shared(
                lambda kv: kv.reshape(*kv.shape[:3], Hkv, n, -1).mean(axis=4))
            hints["with repeat_kv_backward summing the query heads' gradients in tile order "
                  "(reshape (B, n_rep, Hkv, ...)): key/value head g served the neighbouring "
                  "heads g * n_rep .. g * n_rep + n_rep - 1, reshape (B, Hkv, n_rep, ...)"] = \
                shared(lambda kv: kv.reshape(*kv.shape[:3], n, Hkv, -1).sum(axis=3))
            hints["with repeat_kv_backward keeping one query head's gradient of each key/value "
                  "head (dout[:, ::n_rep]): it served n_rep query heads, so its gradient is the "
                  "sum of theirs"] = shared(lambda kv: kv.reshape(*kv.shape[:3], Hkv, n, -1)[
                      ..., 0, :])
        if rope:
            E, Dh = x.shape[-1], x.shape[-1] // H
            hints["with RoPE turning the values too: it turns the queries and keys only, so "
                  "that their product depends on the positions' difference"] = (
                lambda: {"out": _attention_expected(
                    x, _heads_turned(x, params, H, Hkv, E + Hkv * Dh), dout, H, Hkv,
                    angles)["out"]})

            @functools.cache
            def unturned_keys():  # the attention whose keys RoPE leaves as they are (two hints')
                return _attention_expected(x, _heads_turned(x, params, H, Hkv, E, -1), dout, H,
                                           Hkv, angles)["out"]

            hints["with RoPE turning the queries only: the keys are turned by the same angles, "
                  "so that q . k depends on the positions' difference"] = (
                lambda: {"out": unturned_keys()})
            hints["with the cached step writing its keys into the cache before RoPE turns them: "
                  "the cache holds turned keys (turn, then append)"] = (
                lambda: {self.STEP: unturned_keys()})
            hints["without RoPE's backward for the keys: their gradient is turned back by "
                  "rope_backward, as the queries' is"] = (
                lambda: _projection_gradient(x, params, dout, H, Hkv, angles,
                                             _keys_turned(x, H, Hkv)))
            hints["with the cached step not turning its new queries and keys by the rows of the "
                  "RoPE tables it is given"] = (
                lambda: {self.STEP: _attention_expected(x, params, dout, H, Hkv)["out"]})
        return hints


def _projection_gradient(x, params, dout, H, Hkv, angles, change, W=None) -> dict:
    """dx and the gradients of W_qkv (and b_qkv) of the attention whose gradient at the
    projections q, k, v is changed by ``change`` (a mistake), through W (W_qkv unless given):
    the reference's gradient at them is its gradient of a bias of one row per position."""
    W = params["W_qkv"] if W is None else W
    want = _attention_expected(x, {**params, "b_qkv": _bias_per_position(x, params)}, dout, H,
                               Hkv, angles)
    dqkv = change(want["db_qkv"])  # (B, T, E + 2 Hkv Dh)
    found = {"dx": dqkv @ W.T, "dW_qkv": np.einsum("bte,btc->ec", x, dqkv)}
    if "b_qkv" in params:
        found["db_qkv"] = dqkv.sum(axis=(0, 1))
    return found


def _keys_turned(x, H, Hkv):
    """The gradient at the projections with its keys' columns turned by RoPE's angles, where
    rope_backward turns them back."""
    B, T, E = x.shape
    Dh = E // H
    _, (cos, sin) = _head_rope(x, H, True)

    def change(dqkv):
        keys = dqkv[..., E:E + Hkv * Dh].reshape(B, T, Hkv, Dh).swapaxes(1, 2)
        turned = _turned(keys, cos, sin).swapaxes(1, 2).reshape(B, T, Hkv * Dh)
        return np.concatenate([dqkv[..., :E], turned, dqkv[..., E + Hkv * Dh:]], axis=-1)
    return change


def _kv_gradient_shared(x, params, dout, H, Hkv, angles, shared) -> dict:
    """The gradients when repeat_kv_backward makes the shared heads' gradient out of the H
    query heads' by ``shared``, (B, T, 2, H, Dh) -> (B, T, 2, Hkv, Dh), a mistake: the
    reference with H key/value heads, copies of the shared ones, gives each copy's gradient."""
    E = x.shape[-1]
    copies = _kv_heads_in_order(params, E, H, np.repeat(np.arange(Hkv), H // Hkv))

    def change(dqkv):  # (B, T, E + 2 H Dh) -> (B, T, E + 2 Hkv Dh)
        B, T = dqkv.shape[:2]
        kv = shared(dqkv[..., E:].reshape(B, T, 2, H, E // H))
        return np.concatenate([dqkv[..., :E], kv.reshape(B, T, -1)], axis=-1)
    return _projection_gradient(x, copies, dout, H, H, angles, change, params["W_qkv"])


def _bias_per_position(x, params):
    """The attention's b_qkv as one row per position of x (B, T, E + 2 Hkv Dh): the reference's
    gradient of it is the gradient at the projections q, k, v, and a row may be set apart."""
    return np.zeros((*x.shape[:2], params["W_qkv"].shape[1]), x.dtype) + params.get("b_qkv", 0)


def _heads_turned(x, params, H, Hkv, start, sign=1) -> dict:
    """Parameters whose Hkv heads at column ``start`` of the projection (the keys' at E, the
    values' at E + Hkv Dh) come out turned by ``sign`` times RoPE's angles (mistakes: +1 turns
    the values too; -1, which the reference's own turn undoes, leaves the keys unturned): those
    columns of W_qkv are zero, and a bias of one row per position holds the turned heads."""
    B, T, E = x.shape
    Dh = E // H
    cols = slice(start, start + Hkv * Dh)
    bias = _bias_per_position(x, params)
    a = bias[..., cols] + x @ params["W_qkv"][:, cols]
    _, (cos, sin) = _head_rope(x, H, True)
    heads = _turned(a.reshape(B, T, Hkv, Dh).swapaxes(1, 2), cos, sign * sin)  # (B, Hkv, T, Dh)
    bias[..., cols] = heads.swapaxes(1, 2).reshape(B, T, Hkv * Dh)
    W = params["W_qkv"].copy()
    W[:, cols] = 0
    return {**params, "W_qkv": W, "b_qkv": bias}


def _kv_heads_in_order(params, E, H, heads):
    """The attention's parameters with H key/value heads of their own, copies of the shared
    ones: head h is shared head ``heads[h]``."""
    Dh = E // H

    def columns(start):  # the columns of the key (or value) heads, in that order
        return np.concatenate([start + g * Dh + np.arange(Dh) for g in heads])

    Hkv = max(heads) + 1
    order = np.concatenate([np.arange(E), columns(E), columns(E + Hkv * Dh)])
    copies = {**params, "W_qkv": params["W_qkv"][:, order]}
    if "b_qkv" in params:
        copies["b_qkv"] = params["b_qkv"][order]
    return copies


class ModernBlock(_BlockCheck, id="check-modern-block"):
    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("the modern block in float32", _block_case(rng, "modern", np.float32))
    ### END HIDDEN TESTS

    def cases(self, rng):
        for name, change in (("the 2017 block with RMSNorm alone", {"norm": "rms"}),
                             ("the 2017 block with SwiGLU alone", {"mlp": "swiglu"}),
                             ("the 2017 block with RoPE alone", {"positional": "rope"}),
                             ("the 2017 block with 1 key/value head for 2 query heads alone",
                              {"num_kv_heads": 1})):
            yield Case(name, _block_case(rng, "classic", **change))
        yield Case("all four: RMSNorm, SwiGLU, RoPE, 2 key/value heads for 4 query heads",
                   _block_case(rng, "modern"))


class ModernGPT(GPTModel, id="check-modern-gpt",
                functions=(*GPTModel.functions, *CachedStep.functions)):
    """The whole model with RoPE, and its cached step, against TorchGPT."""

    STEP = "logits of the cached step (gpt_step: 4 positions, then 1 at a time)"
    axes = {"logits": "btv", STEP: "btv"}  # axis names, for messages

    def cases(self, rng):
        yield Case("two modern layers: RMSNorm, SwiGLU, RoPE, 1 key/value head for 2 query heads",
                   _model_case(rng, make="modern"))
        yield Case("float32, an output table of its own",
                   _model_case(rng, np.float32, "modern", tie_embeddings=False))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("RoPE in the 2017 block", _model_case(rng, positional="rope"))
    ### END HIDDEN TESTS

    def run(self, f, flat, ids, config):
        step = CachedStep().run(f, flat, ids, config, (4, 1, 1))["logits"]
        return {**super().run(f, flat, ids, config), self.STEP: step}

    def expected(self, flat, ids, config):
        want = super().expected(flat, ids, config)
        return {**want, self.STEP: want["logits"]}

    def mistakes(self, flat, ids, config):
        return {**super().mistakes(flat, ids, config),
                "with rope=None in the blocks: gpt_forward, gpt_loss and gpt_step must pass RoPE's "
                "tables on to every block": lambda: self.expected(flat, ids,
                                                                  {**config, "positional": "none"})}
