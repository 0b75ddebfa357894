"""Checks of notebook 01_attention: the softmax and attention (core), and the notebook's variants
(log-sum-exp, cosine attention, additive attention).

The core checks take what notebook 01 asks for: the softmax over the last axis (rows whose
entries are all -inf are notebook 02's), attention for one sequence, q (T, d_k), without a mask
(masks: notebook 02; leading batch and head axes: notebook 03). References are PyTorch; the hints
are computed with PyTorch too, so they show no NumPy answer. The variants' references would show
their answers: they, and the hints built like them, sit in the hidden regions.
"""

from __future__ import annotations

import math

import numpy as np

from transformer_lab.checks._torch_helpers import _t, torch
from transformer_lab.checks.framework import Case, Check, later_rng, normals


def _softmax(x, dim=-1):
    """PyTorch's softmax of a NumPy array, as a NumPy array."""
    return torch.softmax(_t(x), dim=dim).numpy()


# --------------------------------------------------------------------------------------------
# Section 3: the softmax


class SoftmaxForward(Check, id="check-softmax-forward", functions=("softmax_forward",)):
    def cases(self, rng):
        yield Case("one row", (rng.standard_normal(5),))
        yield Case("a square matrix (4, 4)", (rng.standard_normal((4, 4)) * 3,))
        yield Case("a batch of rows (3, 4)", (rng.standard_normal((3, 4)),))
        yield Case("huge scores (about 1000)", (rng.standard_normal((2, 6)) * 1000,))
        yield Case("-inf entries", (np.array([[0.0, -np.inf, 1.0], [-np.inf, 2.0, 0.5]]),))
        yield Case("float32, three axes", (rng.standard_normal((2, 3, 5)).astype(np.float32),))
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        yield Case("rows near +1e4 and near -1e4 in one array (each row has its own maximum)",
                   (np.stack([later.standard_normal(5) + 1e4, later.standard_normal(5) - 1e4,
                              later.standard_normal(5)]),))
        yield Case("out= given (attention passes its scores): y returned, in it or not",
                   (later.standard_normal((3, 4)),), {"into": True})

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("one entry per row", (rng.standard_normal((4, 1)),))
        yield Case("rows far apart (+1e4 and -1e4)", (np.stack([rng.standard_normal(7) + 1e4,
                                                                rng.standard_normal(7) - 1e4]),))
        yield Case("four axes", (rng.standard_normal((2, 2, 3, 4)),))
        yield Case("float32 scores near 100 (exp overflows float32)",
                   ((rng.standard_normal((3, 5)) + 100).astype(np.float32),))
        yield Case("a square matrix (5, 5) of equal rows", (np.tile(rng.standard_normal(5),
                                                                    (5, 1)),))
    ### END HIDDEN TESTS

    def run(self, f, x, into=False):
        return f.softmax_forward(x, **({"out": np.full_like(x, np.nan)} if into else {}))[0]

    def expected(self, x, into=False):
        return _softmax(x, -1)

    def mistakes(self, x, into=False):
        if into:
            return {"returning out without writing y into it (here it held NaN): return the y "
                    "you computed, or write it into out first": lambda: np.full_like(x, np.nan)}
        t = _t(x)
        found = {}
        if x.ndim >= 2:
            found["normalising over the first axis (axis=0) instead of the last (axis=-1)"] = \
                lambda: _softmax(x, 0)
            found["normalising over the whole array (a sum without an axis): each row must "
                  "sum to one"] = lambda: torch.softmax(t.reshape(-1), 0).reshape(t.shape).numpy()
            found["subtracting the maximum of the whole array instead of each row's: a row far "
                  "below the maximum underflows to 0/0"] = \
                lambda: (torch.exp(t - t.max()) / torch.exp(t - t.max()).sum(-1, True)).numpy()
            z = torch.exp(t - t.max(0, keepdim=True).values)
            found["subtracting the maximum over the first axis (axis=0): each row subtracts "
                  "its own maximum, x.max(axis=-1, keepdims=True)"] = \
                lambda: (z / z.sum(-1, True)).numpy()
            e = torch.exp(t - t.max(-1, keepdim=True).values)
            found["summing over the first axis (axis=0): each row is divided by its own sum, "
                  "along the last axis"] = lambda: (e / e.sum(0, True)).numpy()
            found["dividing by the sum of the whole array (e.sum() without an axis): each row "
                  "is divided by its own sum, e.sum(axis=-1, keepdims=True)"] = \
                lambda: (e / e.sum()).numpy()
        if x.ndim >= 2 and x.shape[-1] == x.shape[-2]:
            found["without keepdims=True: x.max(axis=-1) has lost the last axis and broadcasts "
                  "along the wrong one (keep it: x.max(axis=-1, keepdims=True))"] = \
                lambda: _no_keepdims(t).numpy()
            found["taking the maximum without keepdims=True: x.max(axis=-1) has lost the last axis "
                  "and broadcasts along the wrong one (x.max(axis=-1, keepdims=True))"] = \
                lambda: _no_keepdims(t, in_sum=False).numpy()
            found["taking the sum without keepdims=True: the row sums have lost the last axis and "
                  "broadcast along the wrong one (sum(axis=-1, keepdims=True))"] = \
                lambda: _no_keepdims(t, in_max=False).numpy()
        return found


def _no_keepdims(t, in_max=True, in_sum=True):
    """The softmax with each row's max, or sum, or both, broadcast along the wrong axis (a
    square x)."""
    m = t.max(-1).values[..., None, :] if in_max else t.max(-1, keepdim=True).values
    z = (t - m).exp()
    return z / (z.sum(-1)[..., None, :] if in_sum else z.sum(-1, keepdim=True))


# --------------------------------------------------------------------------------------------
# Section 6: attention


class AttentionForward(Check, id="check-attention-forward", functions=("attention_forward",)):
    axes = {"out": "bhtd", "weights": "bhts"}  # axis names, for messages
    loop_free = {"attention_forward": "every query's scores in one product, q @ k.T, and one "
                                      "softmax_forward over the keys' axis"}

    def cases(self, rng):
        yield Case("T = S = 4, d_k = d_v = 3", normals(rng, *[(4, 3)] * 3))
        yield Case("T = 2, S = 5, d_k = 4, d_v = 6", normals(rng, (2, 4), (5, 4), (5, 6)))
        yield Case("float32, d_k = 8", normals(rng, *[(3, 8)] * 3, dtype=np.float32))
        yield Case("scale = 0.3 given (d_k = 4)", normals(rng, *[(3, 4)] * 3), {"scale": 0.3})
        later = later_rng(rng)  # the case below was added later: the ones above stay as drawn
        yield Case("scores in the thousands (exp overflows: your softmax_forward subtracts "
                   "the max)", tuple(later.standard_normal((3, 4)) * s for s in (60, 60, 1)))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("one query, one key", normals(rng, *[(1, 2)] * 3))
        yield Case("large d_k = 64, T = 3, S = 5", normals(rng, (3, 64), (5, 64), (5, 2)))
        yield Case("large scores (q and k of size 30)",
                   tuple(rng.standard_normal((4, 4)) * s for s in (30, 30, 1)))
        yield Case("float32, T = 6, S = 2, d_k = 16, scale = 0.1",
                   normals(rng, (6, 16), (2, 16), (2, 3), dtype=np.float32), {"scale": 0.1})
    ### END HIDDEN TESTS

    def run(self, f, q, k, v, scale=None):
        out, cache = f.attention_forward(q, k, v, scale=scale)
        return {"scale in the cache": _cached(cache, "scale"), "out": out,
                "weights (the softmax's cache)": _cached(cache, "weights"),
                "q, k, v in the cache": _cached(cache, "q, k, v")}

    def expected(self, q, k, v, scale=None):
        return self._reference(q, k, v, 1 / math.sqrt(q.shape[-1]) if scale is None else scale)

    def _reference(self, q, k, v, scale, dim=-1, cached=None):
        """PyTorch's attention with the scores multiplied by ``scale`` and the softmax over
        ``dim``, and the scale the cache holds (default: ``scale``)."""
        qt, kt, vt = _t(q), _t(k), _t(v)
        weights = torch.softmax(qt @ kt.transpose(-1, -2) * scale, dim=dim)
        return {"scale in the cache": scale if cached is None else cached,
                "out": (weights @ vt).numpy(), "weights (the softmax's cache)": weights.numpy(),
                "q, k, v in the cache": [q, k, v]}

    def tolerance(self, name, expected):
        if name == "output['scale in the cache']":
            return 1e-6  # a scale stored as a float32 number is right too
        return super().tolerance(name, expected)

    def mistakes(self, q, k, v, scale=None):
        d = q.shape[-1]
        want = 1 / math.sqrt(d) if scale is None else scale
        applied = {"with the softmax over the queries (axis 0) instead of the keys (the last "
                   "axis)": (want, 0)}
        if scale is None:
            applied.update({
                "without dividing the scores by sqrt(d_k)": (1.0, -1),
                "dividing the scores by d_k instead of sqrt(d_k)": (1 / d, -1),
                "multiplying the scores by sqrt(d_k) instead of dividing": (math.sqrt(d), -1)})
            if v.shape[-1] != d:
                applied["dividing by sqrt(d_v), the values' width: d_k is q.shape[-1]"] = (
                    1 / math.sqrt(v.shape[-1]), -1)
            lengths = {}  # sqrt of the number of queries or of keys: which one, where they differ
            for n, name in ((q.shape[-2], "T, the number of queries"),
                            (k.shape[-2], "S, the number of keys")):
                if n != d:
                    lengths[n] = "T or S, the number of queries or keys" if n in lengths else name
            for n, name in lengths.items():
                applied[f"dividing by sqrt({name}): d_k is q.shape[-1]"] = (1 / math.sqrt(n), -1)
        else:
            applied.update({
                "ignoring the scale argument (1/sqrt(d_k) is only the default, for scale=None)":
                (1 / math.sqrt(d), -1),
                "dividing by the scale instead of multiplying by it": (1 / scale, -1)})
        # One mistake, two ways to fill the cache: with the right scale, or with the factor
        # actually applied; the hint names the mistake either way.
        found = []  # pairs: a description may come twice
        for description, (factor, dim) in applied.items():
            for cached in dict.fromkeys((want, factor)):
                found.append((description, lambda f=factor, dm=dim, c=cached:
                              self._reference(q, k, v, f, dm, c)))
        scores = q @ np.swapaxes(k, -1, -2) * want
        found.append(("with the scores in the cache where the softmax's cache belongs (c_softmax, "
                      "the weights: the backward pass multiplies by them)",
                      lambda: {**self._reference(q, k, v, want),
                               "weights (the softmax's cache)": scores}))
        found.append(("with a softmax that does not subtract the row's maximum: exp overflows "
                      "(call softmax_forward, which does, and keep its cache)",
                      lambda: {**self._reference(q, k, v, want),
                               "out": _overflowing(scores) @ v}))
        found.append(("caching the scaled q (q * scale): the backward pass multiplies by the "
                      "scale itself, so the cache must hold q as given (keep the given return "
                      "line, and compute the scaled q into a new name)",
                      lambda: {**self._reference(q, k, v, want),
                               "q, k, v in the cache": [q * want, k, v]}))
        if scale is None:
            found.append(("caching sqrt(d_k), the number you divided by: the cache must hold "
                          "the factor the scores were multiplied by, 1/sqrt(d_k) (the backward "
                          "pass multiplies by it)",
                          lambda: self._reference(q, k, v, want, cached=math.sqrt(d))))
        return found


def _overflowing(scores):
    """The softmax over the last axis of ``scores`` without subtracting the maximum (inf / inf
    is NaN where exp overflows)."""
    with np.errstate(all="ignore"):
        e = np.exp(scores)
        return e / e.sum(axis=-1, keepdims=True)


def _cached(cache, what: str):
    """The attention weights or the scale in the cache of attention_forward (read through the
    package's accessor), or its q, k and v, or a sentence saying what is wrong with the cache."""
    from transformer_lab.attention import AttentionCache

    try:
        value = list(cache[:3]) if what == "q, k, v" else \
            getattr(AttentionCache(cache, (), None, "attention_forward"), what)
    except (TypeError, IndexError, KeyError, AttributeError):
        return ("not found: keep the given return line, out, (q, k, v, c_softmax, scale)")
    if value is None:
        return ("None: set it to the factor you multiplied the scores by" if what == "scale"
                else "None: set c_softmax to your softmax_forward's cache")
    return value


# --------------------------------------------------------------------------------------------
# Exercises: notebook functions


class LogSumExp(Check, id="check-logsumexp", arguments=("logsumexp",)):
    loop_free = {"logsumexp": "reduce along the axis with max and sum, keepdims=True"}

    def cases(self, rng):
        for shape, axis in [((5,), -1), ((3, 4), 0), ((3, 4), 1), ((2, 3, 4), 1)]:
            yield Case(f"shape {shape}, axis {axis}", (rng.standard_normal(shape) * 5,),
                       {"axis": axis})
        yield Case("scores near +1e4", (rng.standard_normal((3, 6)) + 1e4,))
        yield Case("scores near -1e4", (rng.standard_normal((3, 6)) - 1e4,))
        yield Case("-inf entries", (np.array([[0.0, -np.inf, 1.0], [-np.inf, 2.0, -np.inf]]),))
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        x = np.stack([later.standard_normal(5) + 1e4, later.standard_normal(5) - 1e4])
        yield Case("slices near +1e4 and near -1e4 in one array", (x,))
        yield Case("the same along axis 0, with a slice near 0", (np.concatenate(
            [x, later.standard_normal((1, 5))]).T.copy(),), {"axis": 0})
        yield Case("shape (3, 1, 4), axis -1 (an axis of length 1 that is not reduced)",
                   (later.standard_normal((3, 1, 4)) * 5,))
        yield Case("-inf entries in a slice near -1000",
                   (np.array([[-1000.0, -np.inf, -1001.5], [2.0, -np.inf, -np.inf]]),))
        yield Case("float32 near 100 (exp overflows float32; the result stays float32)",
                   ((later.standard_normal((2, 5)) + 100).astype(np.float32),))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        x = np.stack([rng.standard_normal(6) + 1e4, rng.standard_normal(6) - 1e4])
        yield Case("one slice near +1e4, one near -1e4", (x,))
        yield Case("the same along axis 0", (x.T.copy(),), {"axis": 0})
        yield Case("four axes, axis -2", (rng.standard_normal((2, 2, 3, 4)),), {"axis": -2})
        yield Case("one entry per slice", (rng.standard_normal((3, 1)) * 100,))
        yield Case("float32 near 100 (exp overflows float32)",
                   ((rng.standard_normal((2, 5)) + 100).astype(np.float32),))
    ### END HIDDEN TESTS

    def run(self, f, x, axis=-1):
        return f.logsumexp(x, axis=axis)

    def expected(self, x, axis=-1):
        return torch.logsumexp(_t(x), dim=axis).numpy()

    def mistakes(self, x, axis=-1):
        t = _t(x)
        return {"subtracting the maximum of the whole array instead of each slice's":
                lambda: (t.max() + torch.log(torch.exp(t - t.max()).sum(axis))).numpy(),
                "keeping the reduced axis (keepdims=True) in the result":
                lambda: np.expand_dims(self.expected(x, axis), axis),
                "without adding the maximum back after the log":
                lambda: (torch.logsumexp(t, axis) - t.max(axis).values).numpy(),
                "without subtracting the maximum first: exp overflows to inf (or underflows "
                "to 0, whose log is -inf) far from 0": lambda: self._naive(x, axis),
                "squeezing every axis of length 1 (m.squeeze()) instead of the reduced one "
                "only (np.squeeze(m, axis))": lambda: self._squeezed(x, axis),
                "squeezing every axis of length 1 (np.squeeze(out)) instead of the reduced one "
                "only (np.squeeze(out, axis))": lambda: np.squeeze(self.expected(x, axis))}

    @staticmethod
    def _naive(x, axis):
        with np.errstate(all="ignore"):
            return np.log(np.exp(x).sum(axis=axis))

    @staticmethod
    def _squeezed(x, axis):
        m = x.max(axis=axis, keepdims=True)
        with np.errstate(all="ignore"):
            return np.log(np.exp(x - m).sum(axis=axis)) + m.squeeze()


class CosineAttention(Check, id="check-cosine-attention", arguments=("cosine_attention",)):
    loop_free = {"cosine_attention": "normalise the rows, then one matrix product"}

    def cases(self, rng):
        yield Case("B = 2, T = 3, S = 5, tau = 0.5", normals(rng, (2, 3, 4), (2, 5, 4), (2, 5, 6)),
                   {"tau": 0.5})
        yield Case("tau = 1e6 (almost uniform weights)", normals(rng, *[(1, 4, 3)] * 3),
                   {"tau": 1e6})
        yield Case("tau = 1e-4 (sharp, must stay finite)", normals(rng, *[(1, 4, 3)] * 3),
                   {"tau": 1e-4})
        yield Case("the default tau, B = 3, T = S = 2", normals(rng, *[(3, 2, 5)] * 3))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        q, k, v = (rng.standard_normal(s) for s in [(3, 2, 5), (3, 4, 5), (3, 4, 2)])
        yield Case("queries and keys of very different lengths",
                   (q * rng.uniform(0.1, 10, (3, 2, 1)), k * rng.uniform(0.1, 10, (3, 4, 1)), v),
                   {"tau": 0.2})
        yield Case("one query, one key", normals(rng, *[(1, 1, 2)] * 3), {"tau": 0.1})
        yield Case("B = 4 = S = d_k (a square batch)", normals(rng, *[(4, 4, 4)] * 3), {"tau": 0.3})

    def expected(self, q, k, v, tau=0.1, norm_dim=-1, softmax_dim=-1, normalise_k=True):
        q, k, v = (torch.from_numpy(a) for a in (q, k, v))
        qn = q / q.norm(dim=norm_dim, keepdim=True)
        kn = k / k.norm(dim=norm_dim, keepdim=True) if normalise_k else k
        w = torch.softmax(qn @ kn.transpose(-1, -2) / tau, dim=softmax_dim)
        return {"out": (w @ v).numpy(), "weights": w.numpy()}

    def mistakes(self, q, k, v, tau=0.1):
        return {"normalising q and k along the wrong axis (the sequence axis, -2, instead of "
                "the features, -1)": lambda: self.expected(q, k, v, tau, norm_dim=-2),
                "with the softmax over the queries (axis -2) instead of the keys (axis -1)":
                lambda: self.expected(q, k, v, tau, softmax_dim=-2),
                "multiplying the cosines by tau instead of dividing":
                lambda: self.expected(q, k, v, 1 / tau),
                "normalising only the queries (the keys need unit length too)":
                lambda: self.expected(q, k, v, tau, normalise_k=False),
                "without the temperature tau (divide the cosines by it)":
                lambda: self.expected(q, k, v, 1.0)}
    ### END HIDDEN TESTS

    def run(self, f, Q, K, V, tau=0.1):  # the notebook's names, for the messages
        out, weights = f.cosine_attention(Q, K, V, tau=tau)
        return {"out": out, "weights": weights}


class AdditiveAttention(Check, id="check-additive-attention", arguments=("additive_attention",)):
    def cases(self, rng):
        yield Case("T = 4, S = 6, d_q = 3, d_k = 5, h = 7",
                   normals(rng, (4, 3), (6, 5), (6, 2), (3, 7), (5, 7), (7,)))
        yield Case("T = S = 3, d_q = d_k = h = 2",
                   normals(rng, (3, 2), (3, 2), (3, 4), (2, 2), (2, 2), (2,)))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("one query", normals(rng, (1, 2), (3, 4), (3, 5), (2, 6), (4, 6), (6,)))
        yield Case("h = 1", normals(rng, (3, 2), (4, 2), (4, 2), (2, 1), (2, 1), (1,)))
        yield Case("large weights (tanh saturates)", tuple(
            rng.standard_normal(sh) * s for sh, s in
            [((5, 3), 10), ((4, 3), 10), ((4, 2), 1), ((3, 6), 1), ((3, 6), 1), ((6,), 5)]))

    def expected(self, q, k, v, W1, W2, w, dim=-1, swap=False, act=True, late=False, scale=1.0):
        q, k, v, W1, W2, w = (torch.from_numpy(a) for a in (q, k, v, W1, W2, w))
        a, b = (q @ W2, k @ W1) if swap else (q @ W1, k @ W2)
        hidden = a[:, None, :] + b[None, :, :]  # (T, S, h)
        scores = (torch.tanh(hidden @ w) if late else
                  (torch.tanh(hidden) if act else hidden) @ w) * scale
        weights = torch.softmax(scores, dim=dim)
        return {"out": (weights @ v).numpy(), "weights": weights.numpy()}

    def mistakes(self, q, k, v, W1, W2, w):
        return {"with the softmax over the queries (axis 0) instead of the keys":
                lambda: self.expected(q, k, v, W1, W2, w, dim=0),
                "without the tanh": lambda: self.expected(q, k, v, W1, W2, w, act=False),
                "with W1 and W2 swapped (q goes through W1, k through W2)":
                lambda: self.expected(q, k, v, W1, W2, w, swap=True),
                "with the tanh taken after the product with w, tanh(h @ w): it acts on the "
                "hidden units first, then w sums them, tanh(h) @ w":
                lambda: self.expected(q, k, v, W1, W2, w, late=True),
                "dividing the scores by sqrt(h): additive attention has no scale (that is "
                "dot-product attention's)":
                lambda: self.expected(q, k, v, W1, W2, w, scale=1 / math.sqrt(w.shape[0]))}
    ### END HIDDEN TESTS

    loop_free = {"additive_attention": "broadcast (T, 1, h) against (1, S, h)"}

    def run(self, f, Q, K, V, W1, W2, w):  # the notebook's names, for the messages
        out, weights = f.additive_attention(Q, K, V, W1, W2, w)
        return {"out": out, "weights": weights}
