"""Checks of notebook 07_blocks: activations, the feed-forward network, residual connections,
dropout, initialisation, and the encoder and decoder layers.

Every reference is PyTorch (``torch.nn.functional`` and autograd, ``nn.TransformerEncoderLayer``
... ``nn.TransformerDecoder`` loaded with the case's parameters through ``interop.layout``), except
where there is nothing for PyTorch to compute: dropout's mask and the initialisers' draws come
from a ``np.random.Generator`` seeded by the case, and the expected answer replays the same draws.
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import ClassVar

import numpy as np

from transformer_lab.checks._torch_helpers import _np, _t, autograd, torch
from transformer_lab.checks.framework import Case, Check, later_rng, normals
from transformer_lab.checks.nb04_multihead_attention import torch_mask
from transformer_lab.reference.interop import layout


def _randn(rng, shape, dtype=np.float64, scale=1.0):
    return normals(rng, shape, dtype=dtype, scale=scale)[0]


# --------------------------------------------------------------------------------------------
# Parameters of random layers and stacks, and their torch twins


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
    """Attention parameters: W_qkv (packed) or W_q, W_k, W_v, then W_o; then their biases."""
    names, width = ("qkv", "o") if packed else ("q", "k", "v", "o"), {"qkv": 3 * e}
    p = {f"W_{n}": _randn(rng, (e, width.get(n, e)), dtype, 1 / math.sqrt(e)) for n in names}
    if bias:
        p.update({f"b_{n}": _randn(rng, (width.get(n, e),), dtype, 0.3) for n in names})
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


def stack_params(rng, n, e, f, decoder, final_norm=True, bias=True, dtype=np.float64):
    """An encoder or decoder stack's parameters (notebook 08): ``n`` layers and a final norm."""
    return {"layers": [layer_params(rng, e, f, decoder, bias, dtype) for _ in range(n)],
            "norm": norm_params(rng, e, bias, dtype) if final_norm else None}


def _activation(name):
    """The torch function of the core's activation ``name``."""
    F = torch.nn.functional
    return {"relu": F.relu, "gelu": F.gelu,
            "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}[name]


def _load(module, state):
    module.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
    return module


def torch_layer(params, num_heads, norm_first, activation, eps, decoder):
    """``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer`` holding ``params``."""
    ff = params["ff"]
    (e, f), dtype = ff["W1"].shape, ff["W1"].dtype
    cls = torch.nn.TransformerDecoderLayer if decoder else torch.nn.TransformerEncoderLayer
    layer = cls(e, num_heads, f, dropout=0.0, activation=_activation(activation),
                layer_norm_eps=eps, batch_first=True, norm_first=norm_first, bias="b1" in ff,
                dtype=getattr(torch, dtype.name))
    return _load(layer, layout.layer_to_torch(params, ""))


def torch_stack(params, num_heads, norm_first, activation, eps, decoder):
    """``nn.TransformerEncoder`` / ``nn.TransformerDecoder`` holding ``params``."""
    layers = params["layers"]
    one = torch_layer(layers[0], num_heads, norm_first, activation, eps, decoder)
    norm = None if params["norm"] is None else copy.deepcopy(one.norm1)  # loaded below
    cls, extra = ((torch.nn.TransformerDecoder, {}) if decoder
                  else (torch.nn.TransformerEncoder, {"enable_nested_tensor": False}))
    with warnings.catch_warnings():  # "enable_nested_tensor is True, but ..." and friends
        warnings.simplefilter("ignore")
        stack = cls(one, len(layers), norm=norm, **extra)
    return _load(stack, layout.stack_to_torch(params, ""))


def _named_grads(named) -> dict:
    """name -> gradient of each (name, tensor) of ``named`` (zeros where none reached it)."""
    return {n: (np.zeros(tuple(p.shape)) if p.grad is None else _np(p.grad)) for n, p in named}


def quiet_key_bias(grads, dtype):
    """The cross-attention's key bias gets an exact gradient of zero (softmax ignores what is
    added to a whole row of scores), and so do its query and key weights when there is one
    key (S = 1: every weight is 1, whatever the scores); computed, they are rounding noise in
    torch and in NumPy alike, and which noise depends on the machine's kernels. Set such noise
    (an array whose every entry is below ``atol``) to zero on both sides, so that two noises
    are not compared; a gradient that is not noise stays as it is (and fails)."""
    atol = 1e-10 if np.dtype(dtype) == np.float64 else 1e-4
    items = grads.items() if isinstance(grads, dict) else \
        enumerate(grads) if isinstance(grads, (list, tuple)) else ()
    for key, value in items:
        if key != "cross_attn" or not isinstance(value, dict):
            quiet_key_bias(value, dtype)
            continue
        for name in ("b_k", "W_q", "b_q", "W_k"):
            g = value.get(name)
            if isinstance(g, np.ndarray) and g.size and np.all(np.abs(g) < atol):
                value[name] = np.zeros_like(g)
    return grads


def tree_map(fn, tree):
    """``fn`` applied to every array of nested dicts/lists of arrays (None stays None)."""
    if isinstance(tree, dict):
        return {k: tree_map(fn, v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [tree_map(fn, v) for v in tree]
    return None if tree is None else fn(tree)


# --------------------------------------------------------------------------------------------
# Activations (§1)


class Gelu(Check, id="check-gelu", functions=("gelu_forward", "gelu_backward")):
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
        yield Case("four axes, exact", normals(rng, (2, 2, 3, 2), (2, 2, 3, 2)))
    ### END HIDDEN TESTS

    def run(self, f, x, dout, approximate="none"):
        out, cache = f.gelu_forward(x, approximate)
        return {"out": out, "dx": f.gelu_backward(dout, cache)}

    def expected(self, x, dout, approximate="none"):
        out, dx = autograd(_activation("gelu" if approximate == "none" else "gelu_tanh"), dout, x)
        return {"out": out, "dx": dx}

    def mistakes(self, x, dout, approximate="none"):
        other = "tanh" if approximate == "none" else "none"
        right = self.expected(x, dout, approximate)
        xt = _t(x.astype(np.float64))
        gelu = _activation("gelu" if approximate == "none" else "gelu_tanh")
        first_term = gelu(xt) / xt  # Phi(x) = gelu(x) / x, or (1 + t)/2 = gelu_tanh(x) / x
        found = {f"with approximate={other!r} where {approximate!r} is asked (the exact GELU "
                "uses erf, the approximation tanh)": lambda: self.expected(x, dout, other),
                "with only the first term of the derivative (Phi(x), or (1 + t)/2): the product "
                "rule on x * Phi(x) gives a second term, x * Phi'(x)":
                lambda: {"out": right["out"], "dx": dout * _np(first_term)}}
        if approximate == "none":
            found["with erf(x / 2) where erf(x / sqrt(2)) belongs"] = lambda: {
                "out": _np(0.5 * xt * (1 + torch.erf(xt / 2))).astype(x.dtype)}
        if approximate == "tanh":
            u = math.sqrt(2 / math.pi) * (xt + 0.044715 * xt ** 2)
            found["with x^2 where x^3 belongs in tanh(sqrt(2/pi) (x + 0.044715 x^3))"] = \
                lambda: {"out": _np(0.5 * xt * (1 + torch.tanh(u))).astype(x.dtype)}
            found.update({
                "with the inner derivative 1 + 0.044715 x^2: the derivative of x + 0.044715 x^3 "
                "is 1 + 3 * 0.044715 x^2": lambda: {
                    "out": right["out"], "dx": _tanh_gelu_dx(x, dout, cube=1.0)},
                "with tanh' = 1 - t where it is 1 - t^2": lambda: {
                    "out": right["out"], "dx": _tanh_gelu_dx(x, dout, square=False)}})
        return found


def _tanh_gelu_dx(x, dout, cube=3.0, square=True):
    """dout times the tanh GELU's derivative 0.5 (1 + t) + 0.5 x tanh'(u) u', written with
    ``cube`` in u' = sqrt(2/pi) (1 + cube * 0.044715 x^2) and tanh' = 1 - t^2 (1 - t unless
    ``square``): the right one, or a mistake. In NumPy, float64, returned in x's dtype."""
    x64, k = x.astype(np.float64), math.sqrt(2 / math.pi)
    t = np.tanh(k * (x64 + 0.044715 * x64 ** 3))
    inner = k * (1 + cube * 0.044715 * x64 ** 2)
    dx = 0.5 * (1 + t) + 0.5 * x64 * (1 - (t * t if square else t)) * inner
    return (dout * dx).astype(x.dtype)


class Activation(Check, id="check-activation",
                 functions=("activation_forward", "activation_backward")):
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
        yield Case("'gelu_tanh', three axes", (*normals(rng, (2, 3, 2), (2, 3, 2)), "gelu_tanh"))
    ### END HIDDEN TESTS

    def run(self, f, x, dout, activation):
        out, cache = f.activation_forward(x, activation)
        return {"out": out, "dx": f.activation_backward(dout, cache)}

    def expected(self, x, dout, activation):
        out, dx = autograd(_activation(activation), dout, x)
        return {"out": out, "dx": dx}

    def mistakes(self, x, dout, activation):
        if activation == "relu":
            return {}
        other = "gelu_tanh" if activation == "gelu" else "gelu"
        return {f"with {other!r} where {activation!r} is asked (\"gelu\" is the exact, erf "
                "form; \"gelu_tanh\" its tanh approximation)":
                lambda: self.expected(x, dout, other)}


# --------------------------------------------------------------------------------------------
# The feed-forward network (§2)


class FeedForward(Check, id="check-feed-forward",
                  functions=("feed_forward_forward", "feed_forward_backward")):
    axes = {"out": "te", "dx": "te"}  # axis names, for messages

    @staticmethod
    def _case(rng, name, shape, f, activation, bias=True, dtype=np.float64):
        """x of ``shape``, the parameters (width ``f``), dout like x, the activation."""
        x = _randn(rng, shape, dtype)
        return Case(name, (x, ff_params(rng, shape[-1], f, bias, dtype),
                           _randn(rng, shape, dtype), activation))

    def cases(self, rng):
        yield self._case(rng, "ReLU, x (2, 3, 4), F = 6", (2, 3, 4), 6, "relu")
        yield self._case(rng, "GELU, x (2, 3, 4), F = 6", (2, 3, 4), 6, "gelu")
        yield self._case(rng, "GELU (tanh), no biases", (3, 2, 5), 3, "gelu_tanh", bias=False)
        yield self._case(rng, "ReLU, float32", (2, 4, 3), 8, "relu", dtype=np.float32)
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        for name, dropped in (("b1 only (no b2)", "b2"), ("b2 only (no b1)", "b1")):
            params = ff_params(later, 4, 5)
            del params[dropped]
            yield Case(f"ReLU, {name}", (later.standard_normal((2, 3, 4)), params,
                                         later.standard_normal((2, 3, 4)), "relu"))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield self._case(rng, "one sequence (T, E), GELU", (5, 4), 7, "gelu")
        yield self._case(rng, "four axes, F = 1", (2, 2, 2, 3), 1, "relu")
    ### END HIDDEN TESTS

    def run(self, f, x, params, dout, activation):
        out, cache = f.feed_forward_forward(x, params, activation)
        dx, grads = f.feed_forward_backward(dout, cache)
        return {"out": out, "dx": dx, "grads": grads}

    def expected(self, x, params, dout, activation, at_output=False, skip_backward=False):
        def ff(xt, p):
            act = _activation(activation)
            h = xt @ p["W1"] + (p["b1"] if "b1" in p else 0)
            a = _derivative_at_output(h, act) if at_output else act(h)
            if skip_backward:  # act(h) forward, the identity backward
                a = a.detach() + (h - h.detach())
            return a @ p["W2"] + (p["b2"] if "b2" in p else 0)

        out, dx, grads = autograd(ff, dout, x, params)
        return {"out": out, "dx": dx, "grads": grads}

    def mistakes(self, x, params, dout, activation):
        def swapped():  # each layer's weight gradient under the other's name
            right = self.expected(x, params, dout, activation)
            grads = right["grads"]
            return {**right, "grads": {**grads, "W1": grads["W2"], "W2": grads["W1"]}}

        found = {"with the activation's backward skipped (dh = da: multiply by act'(h))":
                 lambda: self.expected(x, params, dout, activation, skip_backward=True),
                 "with the two weights' gradients under each other's names (dW1 = x^T dh, of "
                 "the first layer; dW2 = a^T dout)": swapped}
        if "b2" in params:
            found["without the second bias b2"] = lambda: {"out": self.expected(
                x, {k: p for k, p in params.items() if k != "b2"}, dout, activation)["out"]}
        if activation == "relu":
            return found
        return {**found,
                "with the activation's derivative evaluated at its output a = act(h) instead of "
                "its input h (keep h in the cache)":
                lambda: self.expected(x, params, dout, activation, at_output=True),
                "with ReLU whatever the activation argument says (pass it on to "
                "activation_forward)": lambda: self.expected(x, params, dout, "relu")}


def _derivative_at_output(h, act):
    """``act(h)`` whose backward pass multiplies by ``act'(a)``, the derivative at the output
    ``a = act(h)`` -- the wrong point -- instead of ``act'(h)``: a mistake of FeedForward."""
    a = act(h)
    at_a = h + (a - h).detach()  # the value a, with the gradient of h
    return a.detach() + (act(at_a) - act(at_a).detach())


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
        return dpre @ W.T, {"W": h.reshape(-1, W.shape[0]).T @ dpre.reshape(-1, W.shape[1])}

    return forward, backward


class Residual(Check, id="check-residual", functions=("residual_forward", "residual_backward")):
    axes = {"out": "bte", "dx": "bte"}  # axis names, for messages

    @staticmethod
    def _case(rng, name, shape, norm_first, scale=0.8, beta=True, dtype=np.float64, **keywords):
        """x of ``shape``, the sublayer's W (entries of size ``scale``), the norm's parameters,
        dout like x, norm_first; the keywords (eps)."""
        e = shape[-1]
        x, W = _randn(rng, shape, dtype), _randn(rng, (e, e), dtype, scale)
        return Case(name, (x, W, norm_params(rng, e, beta, dtype), _randn(rng, shape, dtype),
                           norm_first), keywords)

    def cases(self, rng):
        for norm_first, name in ((True, "pre-norm"), (False, "post-norm")):
            yield self._case(rng, f"{name}, sublayer tanh(h W)", (2, 3, 4), norm_first)
        yield self._case(rng, "post-norm, a norm without beta, eps = 0.1", (3, 2, 5), False,
                         beta=False, eps=0.1)
        yield self._case(rng, "pre-norm, float32", (2, 4, 3), True, dtype=np.float32)
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        yield self._case(later, "pre-norm, eps = 0.1", (2, 3, 4), True, eps=0.1)

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield self._case(rng, "pre-norm, B = 1, T = 1", (1, 1, 6), True)
        yield self._case(rng, "post-norm, wide E = 16", (2, 2, 16), False, scale=0.3)
    ### END HIDDEN TESTS

    def run(self, f, x, W, norm, dout, norm_first, eps=1e-5):
        forward, backward = _tanh_sublayer(W)
        out, cache = f.residual_forward(x, forward, norm, norm_first, eps)
        dx, g_norm, *rest = f.residual_backward(dout, cache, backward)
        return {"out": out, "dx": dx, "norm grads": g_norm, "sublayer grads": list(rest)}

    @staticmethod
    def norm(u, g, eps):
        """The residual's norm of ``u`` with the parameters ``g``, in PyTorch: layer norm."""
        return torch.nn.functional.layer_norm(u, (u.shape[-1],), g["gamma"], g.get("beta"), eps)

    def expected(self, x, W, norm, dout, norm_first, eps=1e-5, how="right"):
        def residual(xt, Wt, g):
            def ln(u):
                return self.norm(u, g, eps)

            skip = xt.detach() if how == "no identity path" else xt  # dx: through f only
            if how == "no residual":
                return torch.tanh(ln(xt) @ Wt) if norm_first else ln(torch.tanh(xt @ Wt))
            if how == "sublayer only":  # x + LN(f(x)): the norm on the sublayer's output
                return xt + ln(torch.tanh(xt @ Wt))
            if norm_first:
                return skip + torch.tanh(ln(xt) @ Wt)
            return ln(skip + torch.tanh(xt @ Wt))

        out, dx, dW, dnorm = autograd(residual, dout, x, W, norm)
        return {"out": out, "dx": dx, "norm grads": dnorm, "sublayer grads": [{"W": dW}]}

    def mistakes(self, x, W, norm, dout, norm_first, eps=1e-5):
        case = (x, W, norm, dout)
        found = {"with pre-norm and post-norm swapped (norm_first=True is x + f(norm(x)))":
                 lambda: self.expected(*case, not norm_first, eps),
                 "without the identity path in the backward pass: the gradient that reaches the "
                 "sum x + f(...) flows to x directly as well as through f -- add it to dx":
                 lambda: self.expected(*case, norm_first, eps, "no identity path"),
                 "with the norm on the sublayer's output only, x + norm(f(x))":
                 lambda: self.expected(*case, norm_first, eps, "sublayer only"),
                 "without the residual connection: the sublayer's output is added to its input "
                 "x, x + f(norm(x)) or norm(x + f(x))":
                 lambda: self.expected(*case, norm_first, eps, "no residual")}
        if norm_first:
            found["with the backward passes in the forward's order: pre-norm's sublayer comes "
                  "after the norm, so its backward comes first, on dout, and the norm's "
                  "backward takes what it returns"] = lambda: self._reversed(*case, eps)
        else:
            found["with dout given to the sublayer's backward: post-norm's sublayer feeds the "
                  "norm, so it gets ds, the gradient the norm's backward returns"] = (
                lambda: self._dout_to_sublayer(*case, eps))
            found["with dout added to dx where ds belongs: post-norm's identity path starts "
                  "after the norm, so it carries ds"] = lambda: self._dout_on_identity(*case, eps)
        return found

    def _norm_backward(self, up, u, norm, eps):
        """The norm's backward at its input ``u`` for the upstream ``up``: (du, grads)."""
        _, du, grads = autograd(lambda ut, g: self.norm(ut, g, eps), up, u, norm)
        return du, grads

    def _reversed(self, x, W, norm, dout, eps):
        """Pre-norm with the norm's backward first, on dout, and the sublayer's on its result."""
        right = self.expected(x, W, norm, dout, True, eps)
        forward, backward = _tanh_sublayer(W)
        dn, g_norm = self._norm_backward(dout, x, norm, eps)
        h = _np(self.norm(_t(x), {k: _t(a) for k, a in norm.items()}, eps))
        dh, g_sub = backward(dn, forward(h)[1])
        return {**right, "dx": dout + dh, "norm grads": g_norm, "sublayer grads": [g_sub]}

    def _dout_to_sublayer(self, x, W, norm, dout, eps):
        """Post-norm with the sublayer's backward given dout instead of ds."""
        right = self.expected(x, W, norm, dout, False, eps)
        forward, backward = _tanh_sublayer(W)
        y, cache = forward(x)
        ds, _ = self._norm_backward(dout, x + y, norm, eps)
        dh, g_sub = backward(dout, cache)
        return {**right, "dx": ds + dh, "sublayer grads": [g_sub]}

    def _dout_on_identity(self, x, W, norm, dout, eps):
        """Post-norm with dout, not ds, added to dx for the identity path."""
        right = self.expected(x, W, norm, dout, False, eps)
        ds, _ = self._norm_backward(dout, x + _tanh_sublayer(W)[0](x)[0], norm, eps)
        return {**right, "dx": right["dx"] - ds + dout}


# --------------------------------------------------------------------------------------------
# Dropout (§4)


class Dropout(Check, id="check-dropout", functions=("dropout_forward", "dropout_backward")):
    def cases(self, rng):
        yield Case("training, p = 0.1", (*normals(rng, (4, 6), (4, 6)), 0.1, 11, True))
        yield Case("training, p = 0.5, float32",
                   (*normals(rng, (3, 5, 2), (3, 5, 2), dtype=np.float32), 0.5, 12, True))
        yield Case("evaluation (train=False): the identity",
                   (*normals(rng, (3, 4), (3, 4)), 0.3, 13, False))
        yield Case("training with p = 0: the identity",
                   (*normals(rng, (2, 5), (2, 5)), 0.0, 14, True))
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        yield Case("training with p = 1: every entry dropped (zeros, as PyTorch)",
                   (later.standard_normal((3, 4)), later.standard_normal((3, 4)), 1.0, 18, True))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("training, p = 0.9", (*normals(rng, (5, 7), (5, 7)), 0.9, 15, True))
        yield Case("training, one entry", (np.array([1.5]), np.array([2.0]), 0.25, 16, True))
        yield Case("evaluation, float32", (_randn(rng, (2, 3), np.float32),
                                           _randn(rng, (2, 3), np.float32), 0.5, 17, False))
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        yield Case("training with p = 1, float32",
                   (*normals(later, (2, 5), (2, 5), dtype=np.float32), 1.0, 19, True))
    ### END HIDDEN TESTS

    IDENTITY = "x itself returned, cache None, nothing drawn (the identity: train=False or p = 0)"

    def run(self, f, x, dout, p, seed, train):
        rng = np.random.default_rng(seed)
        out, cache = f.dropout_forward(x, p, rng, train)
        found = {"out": out, "dx": f.dropout_backward(dout, cache)}
        if not train or p == 0:
            untouched = rng.bit_generator.state == np.random.default_rng(seed).bit_generator.state
            found[self.IDENTITY] = out is x and cache is None and untouched
        return found

    def expected(self, x, dout, p, seed, train, keep_if="u >= p", scale=None, eval_scale=1.0):
        # torch's F.dropout draws its own mask; what it computes with a mask is
        # where(keep, x / (1 - p), 0): the same formula, on the mask of the case's generator
        keep, k = True, eval_scale  # evaluation, or p = 0: the identity
        if train and p > 0:  # p = 1 drops every entry (F.dropout(x, 1.0) is all zeros)
            u = np.random.default_rng(seed).random(x.shape)
            keep = {"u >= p": u >= p, "u < p": u < p, "u < 1 - p": u < 1 - p}[keep_if] & (p < 1)
            k = 1.0 if p == 1 else 1 / (1 - p) if scale is None else scale
        found = {"out": (x * keep * k).astype(x.dtype), "dx": (dout * keep * k).astype(x.dtype)}
        return {**found, self.IDENTITY: True} if not train or p == 0 else found

    def _new(self, answer: dict) -> dict:
        """``answer`` as an evaluation run gives it with a new array, not x itself."""
        return {**answer, self.IDENTITY: False}

    def mistakes(self, x, dout, p, seed, train):
        found = {}
        if not train or p == 0:
            found["returning a new array or a cache, or drawing from rng, where dropout is the "
                  "identity: return x itself and cache None, and draw nothing (the backward then "
                  "returns dout as it is)"] = \
                lambda: {**self.expected(x, dout, p, seed, train), self.IDENTITY: False}
        if train and p == 1:
            found["returning cache None at p = 1: the backward then passes dout through, but "
                  "every entry was dropped, so its gradient is 0 (cache a mask of False)"] = \
                lambda: {"out": np.zeros_like(x), "dx": dout}
        if not train:  # each answer then is a new array: not x itself
            return {**found, "dropping in evaluation mode too (train=False is the identity: "
                    "no mask, no scale)": lambda: self._new(self.expected(x, dout, p, seed, True)),
                    "scaling in evaluation mode too: there dropout is the identity, the "
                    "1/(1-p) belongs to training": lambda: self._new(self.expected(
                        x, dout, p, seed, train, eval_scale=1 / (1 - p))),
                    "multiplying by (1 - p) in evaluation mode (the old, non-inverted dropout; "
                    "with inverted dropout evaluation does nothing)": lambda: self._new(
                        self.expected(x, dout, p, seed, train, eval_scale=1 - p))}
        return {**found, "without the 1/(1-p) scale on the kept entries (then the expected "
                "output is (1-p) x, not x)": lambda: self.expected(x, dout, p, seed, train,
                                                                    scale=1.0),
                "drawing the mask another way (u < 1 - p): right in distribution, but the check "
                "replays u = rng.random(x.shape) and keeps u >= p, as the text says":
                lambda: self.expected(x, dout, p, seed, train, "u < 1 - p"),
                "scaling by (1 - p) instead of 1/(1 - p)":
                lambda: self.expected(x, dout, p, seed, train, scale=1 - p),
                "scaling by p instead of 1/(1 - p)":
                lambda: self.expected(x, dout, p, seed, train, scale=p),
                "scaling by 1/p instead of 1/(1 - p): p is the probability of dropping, 1 - p "
                "of keeping": lambda: self.expected(x, dout, p, seed, train, scale=1 / p),
                "keeping the entries where u < p: that keeps each one with probability p; keep "
                "them where u >= p": lambda: self.expected(x, dout, p, seed, train, "u < p"),
                "with a backward that inverts the mask (~keep): the gradient flows to the "
                "entries the forward kept": lambda: {
                    **self.expected(x, dout, p, seed, train),
                    "dx": self.expected(x, dout, p, seed, train, "u < p")["dx"]},
                "with a backward that ignores the mask (dout * scale): a dropped entry gets no "
                "gradient": lambda: {**self.expected(x, dout, p, seed, train),
                                     "dx": (dout / (1 - p)).astype(x.dtype)}}


# --------------------------------------------------------------------------------------------
# Initialisation (§5)


class Init(Check, id="check-init", functions=("init_uniform", "init_xavier")):
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

    def expected(self, kind, a, b, seed, how="right"):
        rng = np.random.default_rng(seed)
        shape = b if kind == "uniform" else (a, b)
        right = 1 / math.sqrt(a) if kind == "uniform" else math.sqrt(6 / (a + b))
        std = 1 / math.sqrt(a) if kind == "uniform" else math.sqrt(2 / (a + b))
        bound = {"right": right, "half": right, "1/fan_in": 1 / a, "std": std, "normal": std,
                 "fan_in": math.sqrt(6 / (2 * a)), "transposed": right,
                 "6/fan_in": math.sqrt(6 / a),
                 "last axis": 1 / math.sqrt(shape[-1])}[how]  # the fan-out, for init_uniform
        if how == "transposed":  # drawn as (fan_out, fan_in), then turned
            W = rng.uniform(-bound, bound, size=shape[::-1]).T
        else:
            W = (rng.standard_normal(shape) * bound if how == "normal"
                 else rng.uniform(0 if how == "half" else -bound, bound, size=shape))
        return {"W": W, "next draw": rng.random()}

    def mistakes(self, kind, a, b, seed):
        def wrong(how):
            return lambda: self.expected(kind, a, b, seed, how)

        found = {"drawing from a normal distribution: both initialisers are uniform, "
                 "rng.uniform(-bound, bound, size=shape)": wrong("normal"),
                 "drawing from [0, bound) instead of (-bound, bound)": wrong("half")}
        if kind == "uniform":
            found["with the bound 1/fan_in instead of 1/sqrt(fan_in)"] = wrong("1/fan_in")
            if b[-1] != a:
                found["with the bound from the shape (its last axis, the fan-out) instead of "
                      "the fan_in argument: the bound is 1/sqrt(fan_in)"] = wrong("last axis")
        else:
            found["with the bound sqrt(2/(fan_in + fan_out)): that is Xavier's standard "
                  "deviation; a uniform distribution with that variance reaches sqrt(3) times "
                  "further, sqrt(6/(fan_in + fan_out))"] = wrong("std")
            found["with fan_in in place of fan_out (sqrt(6/(2 fan_in)))"] = wrong("fan_in")
            found["with the bound sqrt(6/fan_in): Xavier's takes both fans, sqrt(6/(fan_in + "
                  "fan_out))"] = wrong("6/fan_in")
            found["drawing a (fan_out, fan_in) array and transposing it: as likely a W, but the "
                  "check replays the generator, so draw the (fan_in, fan_out) shape itself"] = \
                wrong("transposed")
        return found


# --------------------------------------------------------------------------------------------
# Encoder and decoder layers (§6, §7) -- and notebook 08's stacks -- against their torch twins


def _twin_case(rng, name, shape, f, heads, *masks, s=None, layers=None, final_norm=True,
               bias=True, dtype=np.float64, norm_first=False, activation="relu", eps=1e-5):
    """A case of a :class:`_TwinCheck`: x of ``shape`` (B, T, E), a decoder's memory (B, ``s``,
    E), the parameters of a layer with a feed-forward width ``f`` (or of a stack of ``layers``
    layers), ``heads``, the masks (an encoder's one, a decoder's two), dout like x, and the
    layer's keywords; the arrays drawn in that order."""
    b, _, e = shape
    decoder = s is not None
    x = _randn(rng, shape, dtype)
    memory = (_randn(rng, (b, s, e), dtype),) if decoder else ()
    params = (layer_params(rng, e, f, decoder, bias, dtype) if layers is None
              else stack_params(rng, layers, e, f, decoder, final_norm, bias, dtype))
    return Case(name, (x, *memory, params, heads, *masks, _randn(rng, shape, dtype)),
                {"norm_first": norm_first, "activation": activation, "eps": eps})


def _decoder_masks(t_lengths, s_lengths, t, s):
    """A decoder's masks: causal and target padding (B, 1, T, T), memory padding (B, 1, 1, S)."""
    causal = np.triu(np.ones((t, t), dtype=bool), 1)
    tgt_pad = np.arange(t)[None, :] >= np.array(t_lengths)[:, None]  # (B, T)
    src_pad = np.arange(s)[None, :] >= np.array(s_lengths)[:, None]  # (B, S)
    return causal | tgt_pad[:, None, None, :], src_pad[:, None, None, :]


class _TwinCheck(Check):
    """An encoder or decoder layer -- or stack, notebook 08's -- forward and backward, against
    its PyTorch twin under autograd: ``nn.TransformerEncoderLayer`` ... ``nn.TransformerDecoder``
    holding the case's parameters (:func:`torch_layer`, :func:`torch_stack`).

    Its cases are :func:`_twin_case`'s. Compared, at the framework's tolerance for the dtype:
    out, dx, a decoder's dmemory, and the parameters' gradients in the core's layout (the
    cross-attention's that are zero in exact arithmetic: :func:`quiet_key_bias`)."""

    decoder: ClassVar[bool] = False
    stack: ClassVar[bool] = False

    def run(self, f, *case, norm_first=False, activation="relu", eps=1e-5):
        *inputs, dout = case
        forward, backward = (getattr(f, name) for name in self.functions)
        out, cache = forward(*inputs, norm_first, activation, eps)
        if not self.decoder:
            dx, grads = backward(dout, cache)
            return {"out": out, "dx": dx, "grads": grads}
        dx, dmemory, grads = backward(dout, cache)
        return {"out": out, "dx": dx, "dmemory": dmemory,
                "grads": quiet_key_bias(grads, inputs[0].dtype)}

    def expected(self, *case, **keywords):
        return self._twin(*case, **keywords)[0]

    def _twin(self, x, *case, norm_first=False, activation="relu", eps=1e-5):
        """The twin's answer, and the memory's gradient through each of its reads: a decoder
        layer reads it as the cross-attention's keys and as its values (a leaf each, to tell
        them apart), a decoder stack in each of its layers (a leaf each)."""
        *inputs, dout = case
        memory = inputs.pop(0) if self.decoder else None
        params, heads, *masks = inputs
        twin = (torch_stack if self.stack else torch_layer)(params, heads, norm_first,
                                                            activation, eps, self.decoder)
        b, t, e = x.shape
        xt, reads = _t(x, grad=True), []
        for layer in (twin.layers if self.stack else [twin]) if self.decoder else ():
            leaves = [_t(memory, grad=True) for _ in range(1 if self.stack else 2)]
            attend = layer.multihead_attn.forward
            layer.multihead_attn.forward = (lambda q, k, v, _a=attend, _k=leaves[0],
                                            _v=leaves[-1], **kw: _a(q, _k, _v, **kw))
            reads += leaves
        lengths = (t,) if memory is None else (t, memory.shape[1])
        out = twin(xt, *reads[:1], *(torch_mask(m, b, heads, t, s)
                                     for m, s in zip(masks, lengths, strict=True)))
        out.backward(_t(dout))
        named = _named_grads(twin.named_parameters())
        grads = (layout.stack_from_torch(named, "", len(params["layers"]), e, self.decoder, True,
                                         params["norm"] is not None) if self.stack
                 else layout.layer_from_torch(named, "", e, self.decoder, True))
        grads = tree_map(np.array, grads)  # copies: views of torch's memory become arrays
        if not self.decoder:
            return {"out": _np(out), "dx": _np(xt.grad), "grads": grads}, []
        parts = [_np(leaf.grad) for leaf in reads]
        return {"out": _np(out), "dx": _np(xt.grad), "dmemory": np.sum(parts, axis=0),
                "grads": quiet_key_bias(grads, x.dtype)}, parts

    def _swapped(self, case, keywords):
        """The answer of the other norm order (a mistake)."""
        return lambda: self.expected(*case, **dict(keywords,
                                                    norm_first=not keywords["norm_first"]))


class EncoderLayer(_TwinCheck, id="check-encoder-layer",
                   functions=("encoder_layer_forward", "encoder_layer_backward")):
    axes = {"out": "bte", "dx": "bte"}  # axis names, for messages

    def cases(self, rng):
        pad = np.array([[False] * 5, [False] * 3 + [True] * 2])[:, None, None, :]  # (B,1,1,S)
        yield _twin_case(rng, "post-norm, ReLU, padding mask, E = 8, H = 2", (2, 5, 8), 12, 2,
                         pad)
        yield _twin_case(rng, "pre-norm, GELU, no mask, E = 6, H = 3", (3, 4, 6), 10, 3, None,
                         norm_first=True, activation="gelu")
        yield _twin_case(rng, "pre-norm, float32, no biases", (2, 3, 8), 16, 4, None,
                         bias=False, dtype=np.float32, norm_first=True)
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        for norm_first, name in ((False, "post-norm"), (True, "pre-norm")):
            yield _twin_case(later, f"{name}, eps = 0.1", (2, 3, 4), 6, 2, None,
                             norm_first=norm_first, eps=0.1)

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield _twin_case(rng, "post-norm, one head, T = 1", (2, 1, 4), 6, 1, None,
                         activation="gelu_tanh", eps=1e-3)
        yield _twin_case(rng, "pre-norm, H = E (head width 1), causal mask", (1, 4, 4), 5, 4,
                         np.triu(np.ones((4, 4), dtype=bool), 1), norm_first=True)
    ### END HIDDEN TESTS

    def mistakes(self, x, params, num_heads, mask, dout, **keywords):
        found = {"with pre-norm and post-norm swapped (norm_first=True: x + f(norm(x)))":
                 self._swapped((x, params, num_heads, mask, dout), keywords)}
        if mask is not None:
            found["with the mask left out of the self-attention"] = lambda: self.expected(
                x, params, num_heads, None, dout, **keywords)
        if keywords.get("activation", "relu") != "relu":
            found["with ReLU whatever the activation argument says (pass it on to the "
                  "feed-forward)"] = lambda: self.expected(
                x, params, num_heads, mask, dout, **{**keywords, "activation": "relu"})
        return found


class DecoderLayer(_TwinCheck, id="check-decoder-layer",
                   functions=("decoder_layer_forward", "decoder_layer_backward")):
    axes = {"out": "bte", "dx": "bte", "dmemory": "bse"}  # axis names, for messages
    decoder = True

    def cases(self, rng):
        yield _twin_case(rng, "post-norm, causal + padding masks, T = 4, S = 5", (2, 4, 8), 12, 2,
                         *_decoder_masks([4, 2], [5, 3], 4, 5), s=5)
        yield _twin_case(rng, "pre-norm, GELU, T = 3, S = 4, H = 3", (3, 3, 6), 10, 3,
                         *_decoder_masks([3, 3, 1], [2, 4, 4], 3, 4), s=4, norm_first=True,
                         activation="gelu")
        yield _twin_case(rng, "pre-norm, float32, causal mask only", (2, 3, 8), 16, 2,
                         np.triu(np.ones((3, 3), dtype=bool), 1), None, s=2, dtype=np.float32,
                         norm_first=True)
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        for norm_first, name in ((False, "post-norm"), (True, "pre-norm")):
            yield _twin_case(later, f"{name}, eps = 0.1", (2, 3, 4), 6, 2,
                             *_decoder_masks([3, 2], [4, 3], 3, 4), s=4, norm_first=norm_first,
                             eps=0.1)

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield _twin_case(rng, "post-norm, T = 1, S = 1, one head, no biases", (2, 1, 4), 6, 1,
                         None, None, s=1, bias=False, activation="gelu_tanh")
        yield _twin_case(rng, "pre-norm, S = 7 > T = 5", (1, 5, 4), 8, 2,
                         *_decoder_masks([5], [2], 5, 7), s=7, norm_first=True)
    ### END HIDDEN TESTS

    def mistakes(self, *case, **keywords):
        right, (dkey, dvalue) = self._twin(*case, **keywords)
        return {"with the memory's gradient from the keys only: the memory is the keys AND the "
                "values of the cross-attention, dmemory = dkey + dvalue":
                lambda: dict(right, dmemory=dkey),
                "with the memory's gradient from the values only: dmemory = dkey + dvalue":
                lambda: dict(right, dmemory=dvalue),
                "with pre-norm and post-norm swapped": self._swapped(case, keywords),
                **{f"with the {which} left out of the {where}": (
                    lambda k=k: self._twin(*case[:k], None, *case[k + 1:], **keywords)[0])
                   for k, which, where in ((4, "target mask", "self-attention"),
                                           (5, "memory mask", "cross-attention"))
                   if case[k] is not None}}
