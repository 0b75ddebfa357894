"""Checks of notebook 07_blocks: activations, the feed-forward network, residual connections,
dropout, initialisation, and the encoder and decoder layers.

Every reference is PyTorch (``torch.nn.functional`` and autograd, ``nn.TransformerEncoderLayer``
... ``nn.Transformer`` loaded with the case's parameters through ``interop.layout``), except
where there is nothing for PyTorch to compute: dropout's mask and the initialisers' draws come
from a ``np.random.Generator`` seeded by the case, and the expected answer replays the same draws.
The helpers that build the torch models are shared with notebook 07's checks.
"""

from __future__ import annotations

import math

import numpy as np

from transformer_lab.checks._torch_helpers import _np, _t, _torch
from transformer_lab.checks.framework import Case, Check, later_rng, register
from transformer_lab.reference.interop import layout


def _randn(rng, shape, dtype=np.float64, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


# --------------------------------------------------------------------------------------------
# Parameters of random layers, and their torch twins


def ff_params(rng, e, f, bias=True, dtype=np.float64):
    """Feed-forward parameters with every entry non-trivial (no zero bias)."""
    p = {"W1": _randn(rng, (e, f), dtype, 1 / math.sqrt(e)),
         "W2": _randn(rng, (f, e), dtype, 1 / math.sqrt(f))}
    if bias:
        p.update(b1=_randn(rng, (f,), dtype, 0.3), b2=_randn(rng, (e,), dtype, 0.3))
    return p


def norm_params(rng, e, bias=True, dtype=np.float64):
    p = {"gamma": (1 + 0.3 * rng.standard_normal(e)).astype(dtype)}
    if bias:
        p["beta"] = _randn(rng, (e,), dtype, 0.3)
    return p


def attn_params(rng, e, packed, bias=True, dtype=np.float64):
    s = 1 / math.sqrt(e)
    p = ({"W_qkv": _randn(rng, (e, 3 * e), dtype, s)} if packed else
         {"W_q": _randn(rng, (e, e), dtype, s), "W_k": _randn(rng, (e, e), dtype, s),
          "W_v": _randn(rng, (e, e), dtype, s)})
    p["W_o"] = _randn(rng, (e, e), dtype, s)
    if bias:
        if packed:
            p["b_qkv"] = _randn(rng, (3 * e,), dtype, 0.3)
        else:
            p.update(b_q=_randn(rng, (e,), dtype, 0.3), b_k=_randn(rng, (e,), dtype, 0.3),
                     b_v=_randn(rng, (e,), dtype, 0.3))
        p["b_o"] = _randn(rng, (e,), dtype, 0.3)
    return p


def layer_params(rng, e, f, decoder, bias=True, dtype=np.float64):
    """An encoder or decoder layer's parameters as ``core.blocks`` takes them (self-attention
    packed, cross-attention separate)."""
    p = {"self_attn": attn_params(rng, e, True, bias, dtype)}
    if decoder:
        p["cross_attn"] = attn_params(rng, e, False, bias, dtype)
    p["ff"] = ff_params(rng, e, f, bias, dtype)
    for norm in ("norm1", "norm2", "norm3")[:2 + decoder]:
        p[norm] = norm_params(rng, e, bias, dtype)
    return p


def _torch_activation(name):
    import torch.nn.functional as F

    return {"relu": "relu", "gelu": "gelu",
            "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}[name]


def _dims(layer_p):
    e, f = layer_p["ff"]["W1"].shape
    return e, f, "b1" in layer_p["ff"], layer_p["ff"]["W1"].dtype


def _load(module, state):
    torch = _torch()
    module.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
    return module


def torch_layer(params, num_heads, norm_first, activation, eps, decoder):
    """``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer`` holding ``params``."""
    torch = _torch()
    e, f, bias, dtype = _dims(params)
    cls = torch.nn.TransformerDecoderLayer if decoder else torch.nn.TransformerEncoderLayer
    layer = cls(e, num_heads, f, dropout=0.0, activation=_torch_activation(activation),
                layer_norm_eps=eps, batch_first=True, norm_first=norm_first, bias=bias,
                dtype=getattr(torch, np.dtype(dtype).name))
    return _load(layer, layout.layer_to_torch(params, ""))


def torch_mask(mask, b, h, t, s):
    """The core's merged bool mask (broadcastable to (B, H, T, S)) as torch's 3-D attn_mask."""
    if mask is None:
        return None
    return _t(np.broadcast_to(mask, (b, h, t, s)).reshape(b * h, t, s))


def _named_grads(module) -> dict:
    return {n: (np.zeros(tuple(p.shape)) if p.grad is None else _np(p.grad))
            for n, p in module.named_parameters()}


def quiet_key_bias(grads, dtype):
    """The cross-attention's key bias gets an exact gradient of zero (softmax ignores what is
    added to a whole row of scores), and so do its query and key weights when there is one
    key (S = 1: every weight is 1, whatever the scores); computed, they are rounding noise in
    torch and in NumPy alike, and which noise depends on the machine's kernels. Set such noise
    (an array whose every entry is below ``atol``) to zero on both sides, so that two noises
    are not compared; a gradient that is not noise stays as it is (and fails)."""
    atol = 1e-10 if np.dtype(dtype) == np.float64 else 1e-4
    if isinstance(grads, dict):
        for key, value in grads.items():
            if key == "cross_attn" and isinstance(value, dict):
                for name in ("b_k", "W_q", "b_q", "W_k"):
                    g = value.get(name)
                    if isinstance(g, np.ndarray) and g.size and np.all(np.abs(g) < atol):
                        value[name] = np.zeros_like(g)
            else:
                quiet_key_bias(value, dtype)
    elif isinstance(grads, (list, tuple)):
        for value in grads:
            quiet_key_bias(value, dtype)
    return grads


def _copy(tree):
    """Plain copies of nested dicts/lists of arrays (views of torch's memory become arrays)."""
    if isinstance(tree, dict):
        return {k: _copy(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_copy(v) for v in tree]
    return None if tree is None else np.array(tree)


# --------------------------------------------------------------------------------------------
# Activations (§1)


@register
class Gelu(Check):
    id = "check-gelu"
    functions = ("gelu_forward", "gelu_backward")

    def cases(self, rng):
        x, dout = _randn(rng, (3, 5), scale=2), rng.standard_normal((3, 5))
        yield Case("exact (erf), float64", (x, dout), {"approximate": "none"})
        yield Case("tanh approximation, float64", (x, dout), {"approximate": "tanh"})
        yield Case("exact, float32 stays float32",
                   (_randn(rng, (2, 3, 4), np.float32, 2), _randn(rng, (2, 3, 4), np.float32)),
                   {"approximate": "none"})
        yield Case("tanh, float32 stays float32",
                   (_randn(rng, (4, 3), np.float32, 2), _randn(rng, (4, 3), np.float32)),
                   {"approximate": "tanh"})

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("large |x| (tails)", (np.array([-12.0, -6.0, 6.0, 12.0]), np.ones(4)),
                   {"approximate": "none"})
        yield Case("one entry, tanh", (np.array([0.7]), np.array([1.5])),
                   {"approximate": "tanh"})
        yield Case("four axes, exact", (rng.standard_normal((2, 2, 3, 2)),
                                        rng.standard_normal((2, 2, 3, 2))))
    ### END HIDDEN TESTS

    def run(self, f, x, dout, approximate="none"):
        out, cache = f.gelu_forward(x, approximate)
        return {"out": out, "dx": f.gelu_backward(dout, cache)}

    def expected(self, x, dout, approximate="none"):
        torch = _torch()
        xt = _t(x, grad=True)
        y = torch.nn.functional.gelu(xt, approximate=approximate)
        y.backward(_t(dout))
        return {"out": _np(y), "dx": _np(xt.grad)}

    def mistakes(self, x, dout, approximate="none"):
        torch = _torch()
        other = "tanh" if approximate == "none" else "none"
        right = self.expected(x, dout, approximate)
        xt = _t(x.astype(np.float64))
        if approximate == "none":
            first_term = 0.5 * (1 + torch.erf(xt / math.sqrt(2)))  # Phi(x)
        else:
            first_term = 0.5 * (1 + torch.tanh(math.sqrt(2 / math.pi)
                                                * (xt + 0.044715 * xt ** 3)))
        return {f"with approximate={other!r} where {approximate!r} is asked (the exact GELU "
                "uses erf, the approximation tanh)": lambda: self.expected(x, dout, other),
                "with only the first term of the derivative (Phi(x), or (1 + t)/2): the product "
                "rule on x * Phi(x) gives a second term, x * Phi'(x)":
                lambda: {"out": right["out"], "dx": dout * _np(first_term)}}


@register
class Activation(Check):
    id = "check-activation"
    functions = ("activation_forward", "activation_backward")

    def cases(self, rng):
        for name in ("relu", "gelu", "gelu_tanh"):
            yield Case(f"{name!r}", (_randn(rng, (3, 4), scale=2), rng.standard_normal((3, 4)),
                                     name))
        yield Case("'gelu', float32", (_randn(rng, (2, 5), np.float32, 2),
                                       _randn(rng, (2, 5), np.float32), "gelu"))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("'relu' at exactly 0 (gradient 0, as torch)",
                   (np.array([-1.0, 0.0, 2.0]), np.ones(3), "relu"))
        yield Case("'gelu_tanh', three axes", (rng.standard_normal((2, 3, 2)),
                                               rng.standard_normal((2, 3, 2)), "gelu_tanh"))
    ### END HIDDEN TESTS

    def run(self, f, x, dout, activation):
        out, cache = f.activation_forward(x, activation)
        return {"out": out, "dx": f.activation_backward(dout, cache)}

    def expected(self, x, dout, activation):
        torch = _torch()
        xt = _t(x, grad=True)
        y = {"relu": torch.relu, "gelu": torch.nn.functional.gelu,
             "gelu_tanh": _torch_activation("gelu_tanh")}[activation](xt)
        y.backward(_t(dout))
        return {"out": _np(y), "dx": _np(xt.grad)}

    def mistakes(self, x, dout, activation):
        if activation == "relu":
            return {}
        other = "gelu_tanh" if activation == "gelu" else "gelu"
        return {f"with {other!r} where {activation!r} is asked (\"gelu\" is the exact, erf "
                "form; \"gelu_tanh\" its tanh approximation)":
                lambda: self.expected(x, dout, other)}


# --------------------------------------------------------------------------------------------
# The feed-forward network (§2)


@register
class FeedForward(Check):
    id = "check-feed-forward"
    axes = {"out": "te", "dx": "te"}  # axis names, for messages
    functions = ("feed_forward_forward", "feed_forward_backward")

    def cases(self, rng):
        yield Case("ReLU, x (2, 3, 4), F = 6",
                   (rng.standard_normal((2, 3, 4)), ff_params(rng, 4, 6),
                    rng.standard_normal((2, 3, 4)), "relu"))
        yield Case("GELU, x (2, 3, 4), F = 6",
                   (rng.standard_normal((2, 3, 4)), ff_params(rng, 4, 6),
                    rng.standard_normal((2, 3, 4)), "gelu"))
        yield Case("GELU (tanh), no biases",
                   (rng.standard_normal((3, 2, 5)), ff_params(rng, 5, 3, bias=False),
                    rng.standard_normal((3, 2, 5)), "gelu_tanh"))
        yield Case("ReLU, float32", (_randn(rng, (2, 4, 3), np.float32),
                                     ff_params(rng, 3, 8, dtype=np.float32),
                                     _randn(rng, (2, 4, 3), np.float32), "relu"))
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        for name, dropped in (("b1 only (no b2)", "b2"), ("b2 only (no b1)", "b1")):
            params = ff_params(later, 4, 5)
            del params[dropped]
            yield Case(f"ReLU, {name}", (later.standard_normal((2, 3, 4)), params,
                                         later.standard_normal((2, 3, 4)), "relu"))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("one sequence (T, E), GELU", (rng.standard_normal((5, 4)), ff_params(rng, 4, 7),
                                                 rng.standard_normal((5, 4)), "gelu"))
        yield Case("four axes, F = 1", (rng.standard_normal((2, 2, 2, 3)), ff_params(rng, 3, 1),
                                        rng.standard_normal((2, 2, 2, 3)), "relu"))
    ### END HIDDEN TESTS

    def run(self, f, x, params, dout, activation):
        out, cache = f.feed_forward_forward(x, params, activation)
        dx, grads = f.feed_forward_backward(dout, cache)
        return {"out": out, "dx": dx, "grads": grads}

    def expected(self, x, params, dout, activation, at_output=False):
        torch = _torch()
        xt = _t(x, grad=True)
        p = {k: _t(v, grad=True) for k, v in params.items()}
        h = xt @ p["W1"] + (p["b1"] if "b1" in p else 0)
        act = {"relu": torch.relu, "gelu": torch.nn.functional.gelu,
               "gelu_tanh": _torch_activation("gelu_tanh")}[activation]
        a = _derivative_at_output(h, act) if at_output else act(h)
        out = a @ p["W2"] + (p["b2"] if "b2" in p else 0)
        out.backward(_t(dout))
        return {"out": _np(out), "dx": _np(xt.grad),
                "grads": {k: _np(v.grad) for k, v in p.items()}}

    def mistakes(self, x, params, dout, activation):
        if activation == "relu":
            return {}
        return {"with the activation's derivative evaluated at its output a = act(h) instead of "
                "its input h (keep h in the cache)":
                lambda: self.expected(x, params, dout, activation, at_output=True)}


def _derivative_at_output(h, act):
    """``act(h)`` whose backward pass multiplies by ``act'(a)``, the derivative at the output
    ``a = act(h)`` -- the wrong point -- instead of ``act'(h)``: a mistake of FeedForward."""
    torch = _torch()

    class WrongPoint(torch.autograd.Function):
        @staticmethod
        def forward(ctx, h_):
            a = act(h_)
            ctx.save_for_backward(a)
            return a

        @staticmethod
        def backward(ctx, g):
            (a,) = ctx.saved_tensors
            with torch.enable_grad():
                at = a.detach().requires_grad_(True)
                (local,) = torch.autograd.grad(act(at).sum(), at)
            return g * local

    return WrongPoint.apply(h)


# --------------------------------------------------------------------------------------------
# Residual connections (§3)


def _tanh_sublayer(W):
    """A sublayer ``h -> tanh(h @ W)`` as ``(forward, backward)`` in the core's convention:
    forward ``h -> (out, cache)``, backward ``(dout, cache) -> (dh, {"W": dW})``."""

    def forward(h):
        y = np.tanh(h @ W)
        return y, (h, y)

    def backward(dy, cache):
        h, y = cache
        dpre = dy * (1 - y * y)
        e = h.shape[-1]
        return dpre @ W.T, {"W": h.reshape(-1, e).T @ dpre.reshape(-1, W.shape[1])}

    return forward, backward


@register
class Residual(Check):
    id = "check-residual"
    axes = {"out": "bte", "dx": "bte"}  # axis names, for messages
    functions = ("residual_forward", "residual_backward")

    def cases(self, rng):
        for norm_first, name in ((True, "pre-norm"), (False, "post-norm")):
            yield Case(f"{name}, sublayer tanh(h W)",
                       (rng.standard_normal((2, 3, 4)), _randn(rng, (4, 4), scale=0.8),
                        norm_params(rng, 4), rng.standard_normal((2, 3, 4)), norm_first))
        yield Case("post-norm, a norm without beta, eps = 0.1",
                   (rng.standard_normal((3, 2, 5)), _randn(rng, (5, 5), scale=0.8),
                    norm_params(rng, 5, bias=False), rng.standard_normal((3, 2, 5)), False),
                   {"eps": 0.1})
        yield Case("pre-norm, float32", (_randn(rng, (2, 4, 3), np.float32),
                                         _randn(rng, (3, 3), np.float32, 0.8),
                                         norm_params(rng, 3, dtype=np.float32),
                                         _randn(rng, (2, 4, 3), np.float32), True))
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        yield Case("pre-norm, eps = 0.1", (later.standard_normal((2, 3, 4)),
                                           _randn(later, (4, 4), scale=0.8), norm_params(later, 4),
                                           later.standard_normal((2, 3, 4)), True), {"eps": 0.1})

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("pre-norm, B = 1, T = 1", (rng.standard_normal((1, 1, 6)),
                                              _randn(rng, (6, 6), scale=0.8),
                                              norm_params(rng, 6), rng.standard_normal((1, 1, 6)),
                                              True))
        yield Case("post-norm, wide E = 16", (rng.standard_normal((2, 2, 16)),
                                              _randn(rng, (16, 16), scale=0.3),
                                              norm_params(rng, 16), rng.standard_normal((2, 2, 16)),
                                              False))
    ### END HIDDEN TESTS

    def run(self, f, x, W, norm, dout, norm_first, eps=1e-5):
        forward, backward = _tanh_sublayer(W)
        out, cache = f.residual_forward(x, forward, norm, norm_first, eps)
        dx, g_norm, *rest = f.residual_backward(dout, cache, backward)
        return {"out": out, "dx": dx, "norm grads": g_norm, "sublayer grads": list(rest)}

    def _torch_run(self, x, W, norm, dout, norm_first, eps, where="right"):
        torch = _torch()
        xt, Wt = _t(x, grad=True), _t(W, grad=True)
        g = {k: _t(v, grad=True) for k, v in norm.items()}

        def ln(u):
            return torch.nn.functional.layer_norm(u, (u.shape[-1],), g["gamma"], g.get("beta"),
                                                  eps)

        def sub(u):
            return torch.tanh(u @ Wt)

        s = None
        if where == "sublayer only":  # x + LN(f(x)): the norm on the sublayer's output
            out = xt + ln(sub(xt))
        elif norm_first:
            out = xt + sub(ln(xt))
        else:
            s = xt + sub(xt)
            s.retain_grad()
            out = ln(s)
        out.backward(_t(dout))
        result = {"out": _np(out), "dx": _np(xt.grad), "norm grads": {k: _np(v.grad)
                                                                       for k, v in g.items()},
                  "sublayer grads": [{"W": _np(Wt.grad)}]}
        return result, (dout if norm_first else _np(s.grad) if s is not None else None)

    def expected(self, x, W, norm, dout, norm_first, eps=1e-5):
        return self._torch_run(x, W, norm, dout, norm_first, eps)[0]

    def mistakes(self, x, W, norm, dout, norm_first, eps=1e-5):
        right, identity_grad = self._torch_run(x, W, norm, dout, norm_first, eps)
        dropped = dict(right, dx=right["dx"] - identity_grad)
        return {"with pre-norm and post-norm swapped (norm_first=True is x + f(norm(x)))":
                lambda: self.expected(x, W, norm, dout, not norm_first, eps),
                "without the identity path in the backward pass: the gradient that reaches the "
                "sum x + f(...) flows to x directly as well as through f -- add it to dx":
                lambda: dropped,
                "with the norm on the sublayer's output only, x + norm(f(x))":
                lambda: self._torch_run(x, W, norm, dout, norm_first, eps, "sublayer only")[0]}


# --------------------------------------------------------------------------------------------
# Dropout (§4)


@register
class Dropout(Check):
    id = "check-dropout"
    functions = ("dropout_forward", "dropout_backward")

    def cases(self, rng):
        yield Case("training, p = 0.1", (rng.standard_normal((4, 6)), rng.standard_normal((4, 6)),
                                         0.1, 11, True))
        yield Case("training, p = 0.5, float32",
                   (_randn(rng, (3, 5, 2), np.float32), _randn(rng, (3, 5, 2), np.float32),
                    0.5, 12, True))
        yield Case("evaluation (train=False): the identity",
                   (rng.standard_normal((3, 4)), rng.standard_normal((3, 4)), 0.3, 13, False))
        yield Case("training with p = 0: the identity",
                   (rng.standard_normal((2, 5)), rng.standard_normal((2, 5)), 0.0, 14, True))
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        yield Case("training with p = 1: every entry dropped (zeros, as PyTorch)",
                   (later.standard_normal((3, 4)), later.standard_normal((3, 4)), 1.0, 18, True))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("training, p = 0.9", (rng.standard_normal((5, 7)), rng.standard_normal((5, 7)),
                                         0.9, 15, True))
        yield Case("training, one entry", (np.array([1.5]), np.array([2.0]), 0.25, 16, True))
        yield Case("evaluation, float32", (_randn(rng, (2, 3), np.float32),
                                           _randn(rng, (2, 3), np.float32), 0.5, 17, False))
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        yield Case("training with p = 1, float32", (_randn(later, (2, 5), np.float32),
                                                    _randn(later, (2, 5), np.float32), 1.0, 19,
                                                    True))
    ### END HIDDEN TESTS

    def run(self, f, x, dout, p, seed, train):
        out, cache = f.dropout_forward(x, p, np.random.default_rng(seed), train)
        return {"out": out, "dx": f.dropout_backward(dout, cache)}

    def _answer(self, x, dout, p, seed, train, keep_if="u >= p", scale="1/(1-p)",
                eval_scale=None):
        if not train or p == 0:
            s = 1.0 if eval_scale is None else eval_scale
            return {"out": (x * s).astype(x.dtype), "dx": (dout * s).astype(x.dtype)}
        u = np.random.default_rng(seed).random(x.shape)
        keep = u >= p if keep_if == "u >= p" else u < p
        if p == 1:  # every entry dropped: PyTorch's F.dropout(x, 1.0) is all zeros
            keep, scale = np.zeros(x.shape, dtype=bool), "1"
        k = {"1/(1-p)": lambda: 1 / (1 - p), "1": lambda: 1.0, "1-p": lambda: 1 - p}[scale]()
        return {"out": (x * keep * k).astype(x.dtype), "dx": (dout * keep * k).astype(x.dtype)}

    def expected(self, x, dout, p, seed, train):
        # torch's F.dropout draws its own mask; what it computes with a mask is
        # where(keep, x / (1 - p), 0): the same formula, on the mask of the case's generator
        return self._answer(x, dout, p, seed, train)

    def mistakes(self, x, dout, p, seed, train):
        if not train:
            return {"scaling in evaluation mode too: there dropout is the identity, the "
                    "1/(1-p) belongs to training": lambda: self._answer(
                        x, dout, p, seed, train, eval_scale=1 / (1 - p)),
                    "multiplying by (1 - p) in evaluation mode (the old, non-inverted dropout; "
                    "with inverted dropout evaluation does nothing)": lambda: self._answer(
                        x, dout, p, seed, train, eval_scale=1 - p)}
        return {"without the 1/(1-p) scale on the kept entries (then the expected output is "
                "(1-p) x, not x)": lambda: self._answer(x, dout, p, seed, train, scale="1"),
                "scaling by (1 - p) instead of 1/(1 - p)":
                lambda: self._answer(x, dout, p, seed, train, scale="1-p"),
                "keeping the entries where u < p: that keeps each one with probability p; keep "
                "them where u >= p": lambda: self._answer(x, dout, p, seed, train, "u < p")}


# --------------------------------------------------------------------------------------------
# Initialisation (§5)


@register
class Init(Check):
    id = "check-init"
    functions = ("init_uniform", "init_xavier")

    def cases(self, rng):
        yield Case("init_uniform, fan_in 4, shape (4, 6)", ("uniform", 4, (4, 6), 21))
        yield Case("init_uniform, a bias: fan_in 8, shape (5,)", ("uniform", 8, (5,), 22))
        yield Case("init_xavier, (3, 7)", ("xavier", 3, 7, 23))
        yield Case("init_xavier, (16, 48) as W_qkv", ("xavier", 16, 48, 24))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("init_uniform, fan_in 1", ("uniform", 1, (1, 3), 25))
        yield Case("init_uniform, three axes", ("uniform", 6, (2, 3, 4), 26))
        yield Case("init_xavier, (1, 1)", ("xavier", 1, 1, 27))
    ### END HIDDEN TESTS

    def run(self, f, kind, a, b, seed):
        rng = np.random.default_rng(seed)
        W = f.init_uniform(a, b, rng) if kind == "uniform" else f.init_xavier(a, b, rng)
        return {"W": W, "next draw": rng.random()}  # one call of rng.uniform, nothing more

    def _draw(self, kind, a, b, seed, how="right"):
        rng = np.random.default_rng(seed)
        shape = b if kind == "uniform" else (a, b)
        if kind == "uniform":
            bound = {"right": 1 / math.sqrt(a), "1/fan_in": 1 / a}.get(how)
        else:
            bound = {"right": math.sqrt(6 / (a + b)), "std": math.sqrt(2 / (a + b)),
                     "fan_in": math.sqrt(6 / (2 * a))}.get(how)
        if how == "normal":
            scale = 1 / math.sqrt(a) if kind == "uniform" else math.sqrt(2 / (a + b))
            W = rng.standard_normal(shape) * scale
        elif how == "half":
            W = rng.uniform(0, 1 / math.sqrt(a) if kind == "uniform" else math.sqrt(6 / (a + b)),
                            size=shape)
        else:
            W = rng.uniform(-bound, bound, size=shape)
        return {"W": W, "next draw": rng.random()}

    def expected(self, kind, a, b, seed):
        return self._draw(kind, a, b, seed)

    def mistakes(self, kind, a, b, seed):
        found = {"drawing from a normal distribution: both initialisers are uniform, "
                 "rng.uniform(-bound, bound, size=shape)": lambda: self._draw(kind, a, b, seed,
                                                                               "normal"),
                 "drawing from [0, bound) instead of (-bound, bound)":
                 lambda: self._draw(kind, a, b, seed, "half")}
        if kind == "uniform":
            found["with the bound 1/fan_in instead of 1/sqrt(fan_in)"] = lambda: self._draw(
                kind, a, b, seed, "1/fan_in")
        else:
            found["with the bound sqrt(2/(fan_in + fan_out)): that is Xavier's standard "
                  "deviation; a uniform distribution with that variance reaches sqrt(3) times "
                  "further, sqrt(6/(fan_in + fan_out))"] = lambda: self._draw(kind, a, b, seed,
                                                                                "std")
            found["with fan_in in place of fan_out (sqrt(6/(2 fan_in)))"] = lambda: self._draw(
                kind, a, b, seed, "fan_in")
        return found


# --------------------------------------------------------------------------------------------
# Encoder and decoder layers (§6, §7)


def _layer_kwargs(norm_first, activation, eps):
    return {"norm_first": norm_first, "activation": activation, "eps": eps}


@register
class EncoderLayer(Check):
    id = "check-encoder-layer"
    axes = {"out": "bte", "dx": "bte"}  # axis names, for messages
    functions = ("encoder_layer_forward", "encoder_layer_backward")

    def cases(self, rng):
        pad = np.array([[False] * 5, [False] * 3 + [True] * 2])[:, None, None, :]  # (B,1,1,S)
        yield Case("post-norm, ReLU, padding mask, E = 8, H = 2",
                   (rng.standard_normal((2, 5, 8)), layer_params(rng, 8, 12, False), 2, pad,
                    rng.standard_normal((2, 5, 8))), _layer_kwargs(False, "relu", 1e-5))
        yield Case("pre-norm, GELU, no mask, E = 6, H = 3",
                   (rng.standard_normal((3, 4, 6)), layer_params(rng, 6, 10, False), 3, None,
                    rng.standard_normal((3, 4, 6))), _layer_kwargs(True, "gelu", 1e-5))
        yield Case("pre-norm, float32, no biases",
                   (_randn(rng, (2, 3, 8), np.float32),
                    layer_params(rng, 8, 16, False, bias=False, dtype=np.float32), 4, None,
                    _randn(rng, (2, 3, 8), np.float32)), _layer_kwargs(True, "relu", 1e-5))
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        for norm_first, name in ((False, "post-norm"), (True, "pre-norm")):
            yield Case(f"{name}, eps = 0.1", (later.standard_normal((2, 3, 4)),
                                              layer_params(later, 4, 6, False), 2, None,
                                              later.standard_normal((2, 3, 4))),
                       _layer_kwargs(norm_first, "relu", 0.1))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("post-norm, one head, T = 1", (rng.standard_normal((2, 1, 4)),
                                                  layer_params(rng, 4, 6, False), 1, None,
                                                  rng.standard_normal((2, 1, 4))),
                   _layer_kwargs(False, "gelu_tanh", 1e-3))
        yield Case("pre-norm, H = E (head width 1), causal mask",
                   (rng.standard_normal((1, 4, 4)), layer_params(rng, 4, 5, False), 4,
                    np.triu(np.ones((4, 4), dtype=bool), 1), rng.standard_normal((1, 4, 4))),
                   _layer_kwargs(True, "relu", 1e-5))
    ### END HIDDEN TESTS

    def run(self, f, x, params, num_heads, mask, dout, norm_first=False, activation="relu",
            eps=1e-5):
        out, cache = f.encoder_layer_forward(x, params, num_heads, mask, norm_first, activation,
                                             eps)
        dx, grads = f.encoder_layer_backward(dout, cache)
        return {"out": out, "dx": dx, "grads": grads}

    def expected(self, x, params, num_heads, mask, dout, norm_first=False, activation="relu",
                 eps=1e-5):
        layer = torch_layer(params, num_heads, norm_first, activation, eps, decoder=False)
        b, t, _ = x.shape
        xt = _t(x, grad=True)
        out = layer(xt, src_mask=torch_mask(mask, b, num_heads, t, t))
        out.backward(_t(dout))
        e = x.shape[-1]
        grads = _copy(layout.layer_from_torch(_named_grads(layer), "", e, decoder=False))
        return {"out": _np(out), "dx": _np(xt.grad), "grads": grads}

    def mistakes(self, x, params, num_heads, mask, dout, norm_first=False, activation="relu",
                 eps=1e-5):
        found = {"with pre-norm and post-norm swapped (norm_first=True: x + f(norm(x)))":
                 lambda: self.expected(x, params, num_heads, None if mask is None else mask,
                                       dout, not norm_first, activation, eps)}
        if mask is not None:
            found["with the mask left out of the self-attention"] = lambda: self.expected(
                x, params, num_heads, None, dout, norm_first, activation, eps)
        return found


@register
class DecoderLayer(Check):
    id = "check-decoder-layer"
    axes = {"out": "bte", "dx": "bte", "dmemory": "bse"}  # axis names, for messages
    functions = ("decoder_layer_forward", "decoder_layer_backward")

    @staticmethod
    def _masks(t_lengths, s_lengths, t, s):
        causal = np.triu(np.ones((t, t), dtype=bool), 1)
        tgt_pad = np.arange(t)[None, :] >= np.array(t_lengths)[:, None]  # (B, T)
        src_pad = np.arange(s)[None, :] >= np.array(s_lengths)[:, None]  # (B, S)
        return causal | tgt_pad[:, None, None, :], src_pad[:, None, None, :]

    def cases(self, rng):
        tgt_mask, mem_mask = self._masks([4, 2], [5, 3], 4, 5)
        yield Case("post-norm, causal + padding masks, T = 4, S = 5",
                   (rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 5, 8)),
                    layer_params(rng, 8, 12, True), 2, tgt_mask, mem_mask,
                    rng.standard_normal((2, 4, 8))), _layer_kwargs(False, "relu", 1e-5))
        tgt_mask, mem_mask = self._masks([3, 3, 1], [2, 4, 4], 3, 4)
        yield Case("pre-norm, GELU, T = 3, S = 4, H = 3",
                   (rng.standard_normal((3, 3, 6)), rng.standard_normal((3, 4, 6)),
                    layer_params(rng, 6, 10, True), 3, tgt_mask, mem_mask,
                    rng.standard_normal((3, 3, 6))), _layer_kwargs(True, "gelu", 1e-5))
        yield Case("pre-norm, float32, causal mask only",
                   (_randn(rng, (2, 3, 8), np.float32), _randn(rng, (2, 2, 8), np.float32),
                    layer_params(rng, 8, 16, True, dtype=np.float32), 2,
                    np.triu(np.ones((3, 3), dtype=bool), 1), None,
                    _randn(rng, (2, 3, 8), np.float32)), _layer_kwargs(True, "relu", 1e-5))
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        tgt_mask, mem_mask = self._masks([3, 2], [4, 3], 3, 4)
        for norm_first, name in ((False, "post-norm"), (True, "pre-norm")):
            yield Case(f"{name}, eps = 0.1", (later.standard_normal((2, 3, 4)),
                                              later.standard_normal((2, 4, 4)),
                                              layer_params(later, 4, 6, True), 2, tgt_mask,
                                              mem_mask, later.standard_normal((2, 3, 4))),
                       _layer_kwargs(norm_first, "relu", 0.1))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("post-norm, T = 1, S = 1, one head, no biases",
                   (rng.standard_normal((2, 1, 4)), rng.standard_normal((2, 1, 4)),
                    layer_params(rng, 4, 6, True, bias=False), 1, None, None,
                    rng.standard_normal((2, 1, 4))), _layer_kwargs(False, "gelu_tanh", 1e-5))
        tgt_mask, mem_mask = self._masks([5], [2], 5, 7)
        yield Case("pre-norm, S = 7 > T = 5", (rng.standard_normal((1, 5, 4)),
                                               rng.standard_normal((1, 7, 4)),
                                               layer_params(rng, 4, 8, True), 2, tgt_mask,
                                               mem_mask, rng.standard_normal((1, 5, 4))),
                   _layer_kwargs(True, "relu", 1e-5))
    ### END HIDDEN TESTS

    def run(self, f, x, memory, params, num_heads, tgt_mask, memory_mask, dout,
            norm_first=False, activation="relu", eps=1e-5):
        out, cache = f.decoder_layer_forward(x, memory, params, num_heads, tgt_mask,
                                             memory_mask, norm_first, activation, eps)
        dx, dmemory, grads = f.decoder_layer_backward(dout, cache)
        return {"out": out, "dx": dx, "dmemory": dmemory,
                "grads": quiet_key_bias(grads, x.dtype)}

    def _torch_run(self, x, memory, params, num_heads, tgt_mask, memory_mask, dout,
                   norm_first, activation, eps):
        layer = torch_layer(params, num_heads, norm_first, activation, eps, decoder=True)
        b, t, e = x.shape
        s = memory.shape[1]
        xt, mk, mv = _t(x, grad=True), _t(memory, grad=True), _t(memory, grad=True)
        attend = layer.multihead_attn.forward
        # the memory as keys (mk) and as values (mv), to tell their gradients apart
        layer.multihead_attn.forward = lambda q, k, v, **kw: attend(q, mk, mv, **kw)
        out = layer(xt, mk, tgt_mask=torch_mask(tgt_mask, b, num_heads, t, t),
                    memory_mask=torch_mask(memory_mask, b, num_heads, t, s))
        out.backward(_t(dout))
        grads = _copy(layout.layer_from_torch(_named_grads(layer), "", e, decoder=True,
                                              split_cross=True))
        right = {"out": _np(out), "dx": _np(xt.grad), "dmemory": _np(mk.grad) + _np(mv.grad),
                 "grads": quiet_key_bias(grads, x.dtype)}
        return right, _np(mk.grad), _np(mv.grad)

    def expected(self, x, memory, params, num_heads, tgt_mask, memory_mask, dout,
                 norm_first=False, activation="relu", eps=1e-5):
        return self._torch_run(x, memory, params, num_heads, tgt_mask, memory_mask, dout,
                               norm_first, activation, eps)[0]

    def mistakes(self, x, memory, params, num_heads, tgt_mask, memory_mask, dout,
                 norm_first=False, activation="relu", eps=1e-5):
        right, dkey, dvalue = self._torch_run(x, memory, params, num_heads, tgt_mask,
                                              memory_mask, dout, norm_first, activation, eps)
        return {"with the memory's gradient from the keys only: the memory is the keys AND the "
                "values of the cross-attention, dmemory = dkey + dvalue":
                lambda: dict(right, dmemory=dkey),
                "with the memory's gradient from the values only: dmemory = dkey + dvalue":
                lambda: dict(right, dmemory=dvalue),
                "with pre-norm and post-norm swapped": lambda: self.expected(
                    x, memory, params, num_heads, tgt_mask, memory_mask, dout, not norm_first,
                    activation, eps)}
