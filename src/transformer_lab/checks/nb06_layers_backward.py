"""Checks of notebook 06_layers_backward: the backward passes of layer norm, log-softmax,
cross-entropy and the embedding, and the notebook's variant (RMSNorm's backward).

Every backward check runs the forward and the backward of your core and compares them with
PyTorch autograd on the same inputs, in their dtype (:func:`._torch_helpers.autograd`), as
notebook 05's do. The hints compute the classic wrong answers from the reference's pieces.
"""

from __future__ import annotations

import numpy as np

from transformer_lab.checks._torch_helpers import _t, autograd, torch
from transformer_lab.checks.framework import Case, Check, later_rng, normals
from transformer_lab.checks.nb05_attention_backward import _averaged, row_cases

# --------------------------------------------------------------------------------------------
# Layer normalisation


def _norm_case(rng, name, shape, gamma=True, beta=True, eps=1e-5, dtype=np.float64,
               constant_row=False, offset=0.5):
    x = rng.standard_normal(shape) * 2 + offset
    if constant_row:
        x.reshape(-1, shape[-1])[1] = 3.0
    g = 1 + 0.5 * rng.standard_normal(shape[-1]) if gamma else None
    b = rng.standard_normal(shape[-1]) if beta else None
    dout = rng.standard_normal(shape)
    return Case(name, tuple(None if a is None else a.astype(dtype) for a in (x, g, b, dout)),
                {"eps": eps})


def _torch_layer_norm(x, gamma, beta, dout, eps):
    params = {name: a for name, a in (("gamma", gamma), ("beta", beta)) if a is not None}
    out, dx, grads = autograd(lambda xt, p: torch.nn.functional.layer_norm(
        xt, (x.shape[-1],), p.get("gamma"), p.get("beta"), eps), dout, x, params)
    return out, {"dx": dx, "grads": grads}


def _row_mean(a):
    return a.mean(axis=-1, keepdims=True)


def _normalised(x, eps):
    """xhat = (x - mean) / sqrt(var + eps) and rstd = 1 / sqrt(var + eps) (..., 1) of x's rows,
    in float64."""
    xc = x.astype(np.float64) - _row_mean(x.astype(np.float64))
    rstd = 1 / np.sqrt(_row_mean(xc * xc) + eps)
    return xc * rstd, rstd


class _LayerNormCases:
    """The cases of both layer-norm checks (the forward and the backward see the same inputs)."""

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield _norm_case(rng, "a large eps = 0.5", (4, 3), eps=0.5)
        yield _norm_case(rng, "D = 2 (two features)", (3, 2))
        yield _norm_case(rng, "four axes, float32, no beta", (2, 2, 3, 5), beta=False,
                         dtype=np.float32)
    ### END HIDDEN TESTS

    def cases(self, rng):
        yield _norm_case(rng, "3-D input (B, T, D) = (2, 3, 6)", (2, 3, 6))
        yield _norm_case(rng, "one vector (D = 5)", (5,))
        yield _norm_case(rng, "no gamma, no beta (elementwise_affine=False)", (3, 4),
                         gamma=False, beta=False)
        yield _norm_case(rng, "gamma without beta (bias=False)", (3, 4), beta=False)
        yield _norm_case(rng, "a constant row (variance 0: xhat = 0, not NaN)", (3, 4),
                         constant_row=True)
        yield _norm_case(rng, "float32", (2, 3, 8), dtype=np.float32)
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        yield _norm_case(later, "eps = 0.1", (3, 5), eps=0.1)
        yield _norm_case(later, "beta without gamma", (2, 3, 4), gamma=False)
        yield _norm_case(later, "float32 rows near 300 (mean(x * x) - mean(x)**2 cancels: "
                         "subtract the mean first)", (4, 8), dtype=np.float32, offset=300.0)


#: check-layer-norm-forward's outputs: what the backward pass reads from the cache
XHAT, RSTD = "xhat in the cache", "rstd in the cache (1 / sqrt(var + eps), shape (..., 1))"


class LayerNormForward(_LayerNormCases, Check, id="check-layer-norm-forward",
                       functions=("layer_norm_forward",)):
    loop_free = {"layer_norm_forward": "the mean and the variance over the last axis, with "
                                       "keepdims=True"}
    axes = {"out": "te", XHAT: "te"}  # axis names, for messages

    def run(self, f, x, gamma, beta, dout, eps=1e-5):
        out, cache = f.layer_norm_forward(x, gamma, beta, eps)
        try:
            xhat, rstd = cache[0], cache[1]
        except (TypeError, IndexError, KeyError):
            xhat = rstd = "not found: keep the given return line, out, (xhat, rstd, gamma, beta)"
        return {"out": out, XHAT: xhat, RSTD: rstd}

    def expected(self, x, gamma, beta, dout, eps=1e-5):
        xhat, rstd = _normalised(x, eps)
        return {"out": _torch_layer_norm(x, gamma, beta, dout, eps)[0],
                XHAT: xhat.astype(x.dtype), RSTD: rstd.astype(x.dtype)}

    def mistakes(self, x, gamma, beta, dout, eps=1e-5):
        d = x.shape[-1]
        want = self.expected(x, gamma, beta, dout, eps)

        def affine(xhat):
            out = xhat * gamma if gamma is not None else xhat
            return {"out": (out + beta if beta is not None else out).astype(x.dtype)}

        xc = x - x.mean(axis=-1, keepdims=True)
        var = (xc * xc).mean(axis=-1, keepdims=True)
        found = {"adding eps to the standard deviation instead of the variance":
                 lambda: affine(xc / (np.sqrt(var) + eps)),
                 "normalising over the first axis (axis=0) instead of the last":
                 lambda: affine((x - x.mean(axis=0)) / np.sqrt(x.var(axis=0) + eps)),
                 "without subtracting the mean (x where xc = x - mean belongs): that is "
                 "RMSNorm, notebook 15's":
                 lambda: affine(x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps))}
        if beta is not None and gamma is None:
            found["leaving beta out when gamma is None (each is optional on its own)"] = \
                lambda: {"out": (xc / np.sqrt(var + eps)).astype(x.dtype)}
        if d > 1:
            found["with the unbiased variance (dividing by D - 1, ddof=1): LayerNorm divides "
                  "by D"] = lambda: affine(xc / np.sqrt(var * d / (d - 1) + eps))
        found["with the standard deviation sqrt(var + eps) cached where its inverse, rstd, "
              "belongs"] = lambda: {**want, RSTD: 1 / want[RSTD]}
        if gamma is not None or beta is not None:
            found["with the cached xhat changed in place (out = xhat, then out *= gamma or out "
                  "+= beta): out = xhat * gamma makes a new array"] = (
                lambda: {**want, XHAT: want["out"]})
        return found


class LayerNormBackward(_LayerNormCases, Check, id="check-layer-norm-backward",
                        functions=("layer_norm_forward", "layer_norm_backward")):
    loop_free = {"layer_norm_backward": "means over the last axis with keepdims=True; dgamma "
                                        "and dbeta sum over every axis but the last"}
    axes = {"dx": "te"}  # axis names, for messages
    tol = {"float64": 1e-9, "float32": 5e-5}

    def run(self, f, x, gamma, beta, dout, eps=1e-5):
        _, cache = f.layer_norm_forward(x, gamma, beta, eps)
        dx, grads = f.layer_norm_backward(dout, cache)
        return {"dx": dx, "grads": grads}

    def expected(self, x, gamma, beta, dout, eps=1e-5):
        return _torch_layer_norm(x, gamma, beta, dout, eps)[1]

    def mistakes(self, x, gamma, beta, dout, eps=1e-5):
        right = self.expected(x, gamma, beta, dout, eps)
        mean, rows, dtype = _row_mean, x.size // x.shape[-1], x.dtype
        xhat, rstd = _normalised(x, eps)  # the pieces, in float64, and g = dout * gamma
        g = (dout * gamma if gamma is not None else dout).astype(np.float64)
        d = dout.astype(np.float64)
        return {"dropping the term xhat * mean(g * xhat) (the path through the standard "
                "deviation)":
                lambda: {**right, "dx": (rstd * (g - mean(g))).astype(dtype)},
                "dropping the term mean(g) (the path through the mean)":
                lambda: {**right, "dx": (rstd * (g - xhat * mean(g * xhat))).astype(dtype)},
                "using dout where g = dout * gamma belongs":
                lambda: {**right, "dx": (rstd * (d - mean(d) - xhat * mean(d * xhat))
                                         ).astype(dtype)},
                "with mean(dout * xhat) where mean(g * xhat) belongs (g = dout * gamma, in "
                "both mean terms)":
                lambda: {**right, "dx": (rstd * (g - mean(g) - xhat * mean(d * xhat))
                                         ).astype(dtype)},
                "without the factor rstd = 1 / sqrt(var + eps) in front of dx":
                lambda: {**right, "dx": (g - mean(g) - xhat * mean(g * xhat)).astype(dtype)},
                "dividing by rstd where the sketch divides by sigma: the cache holds rstd = 1 / "
                "sigma, so dx = rstd * (g - mean(g) - xhat * mean(g * xhat))":
                lambda: {**right, "dx": ((g - mean(g) - xhat * mean(g * xhat)) / rstd
                                         ).astype(dtype)},
                "summing where layer norm's backward takes means: dx = rstd * (g - mean(g) - "
                "xhat * mean(g * xhat)), the means over the D features":
                lambda: {**right, "dx": (rstd * (g - mean(g) * x.shape[-1] - xhat * mean(
                    g * xhat) * x.shape[-1])).astype(dtype)},
                **({"with gamma twice in dgamma: dgamma = sum(dout * xhat), dout as it came, "
                    "not g = dout * gamma": lambda: {**right, "grads": {
                        **right["grads"], "gamma": (g * xhat).reshape(rows, -1).sum(axis=0
                                                                               ).astype(dtype)}}}
                   if gamma is not None else {}),
                "averaging dgamma and dbeta over the leading axes instead of summing them":
                lambda: _averaged(right, rows),
                "summing dgamma and dbeta over the features (the last axis) instead of over "
                "every leading axis": lambda: _summed(right, d, xhat, -1),
                "summing dgamma and dbeta over the first axis only (axis=0): they sum over "
                "every leading axis, e.g. .reshape(-1, D).sum(axis=0)":
                lambda: _summed(right, d, xhat, 0)}


def _summed(answer: dict, dout, xhat, axis: int) -> dict:
    """``answer`` with dgamma and dbeta (those it has) summed along ``axis`` of dout * xhat and
    dout: a mistaken reduction."""
    sums = {"gamma": (dout * xhat).sum(axis=axis), "beta": dout.sum(axis=axis)}
    return {**answer, "grads": {k: sums[k].astype(g.dtype) for k, g in answer["grads"].items()}}


# --------------------------------------------------------------------------------------------
# Log-softmax and cross-entropy


class LogSoftmax(Check, id="check-log-softmax",
                 functions=("log_softmax_forward", "log_softmax_backward")):
    loop_free = dict.fromkeys(("log_softmax_forward", "log_softmax_backward"),
                              "reductions over the last axis with keepdims=True")

    def cases(self, rng):
        yield from row_cases(rng)
        yield Case("huge logits (+-1000: exp would overflow)",
                   (rng.standard_normal((3, 6)) * 1000, rng.standard_normal((3, 6))))
        yield Case("float32", normals(rng, (2, 3, 7), (2, 3, 7), dtype=np.float32))
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        yield Case("rows near +1e4 and near -1e4 in one array (each row has its own maximum)",
                   (np.stack([later.standard_normal(5) + 1e4, later.standard_normal(5) - 1e4]),
                    later.standard_normal((2, 5))))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("four axes", normals(rng, (2, 2, 3, 4), (2, 2, 3, 4)))
        yield Case("one class (log-probability 0)", normals(rng, (3, 1), (3, 1)))
        yield Case("rows near -1e4", (rng.standard_normal((2, 5)) - 1e4,
                                      rng.standard_normal((2, 5))))
    ### END HIDDEN TESTS

    def run(self, f, x, dout):
        out, cache = f.log_softmax_forward(x)
        return {"out": out, "dx": f.log_softmax_backward(dout, cache)}

    def expected(self, x, dout):
        out, dx = autograd(lambda xt: torch.log_softmax(xt, dim=-1), dout, x)
        return {"out": out, "dx": dx}

    def mistakes(self, x, dout):
        right = self.expected(x, dout)
        p = np.exp(right["out"])
        return {"with the backward of softmax, y * (dout - sum(dout * y)), where log-softmax's "
                "is dout - softmax(x) * sum(dout)":
                lambda: {**right, "dx": p * (dout - (dout * p).sum(axis=-1, keepdims=True))},
                "forgetting the row sum: dout - softmax(x) * dout":
                lambda: {**right, "dx": dout - p * dout},
                "dropping sum(dout): dout - softmax(x) is right only where a row of dout sums to "
                "1; the backward is dout - softmax(x) * sum(dout), the sum over the row":
                lambda: {**right, "dx": dout - p},
                "with the row sum taken without keepdims=True (it broadcasts along the row)":
                lambda: {**right, "dx": dout - p * dout.sum(axis=-1)}}


def _ce_case(rng, name, shape, n_classes, ignore=(), ignore_index=-100, reduction="mean",
             dloss=1.0, dtype=np.float64, scale=1.0):
    logits = (rng.standard_normal((*shape, n_classes)) * scale).astype(dtype)
    classes = np.array([c for c in range(n_classes) if c != ignore_index])
    targets = classes[rng.integers(0, len(classes), size=shape)]  # real targets: never padding
    for ix in ignore:
        targets[ix] = ignore_index
    return Case(name, (logits, targets), {"ignore_index": ignore_index, "reduction": reduction,
                                          "dloss": dloss})


def _cross_entropy(logits, labels, ignore_index, how="mean", smoothing=0.0):
    """torch's cross-entropy of ``logits`` (..., V) and ``labels`` (...) over the labels that
    are not ``ignore_index``: their mean, their sum (``how="sum"``) or, a mistake, their sum
    divided by every position, ignored ones included (``how="mean over all"``)."""
    every = how == "mean over all"
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), _t(np.asarray(labels, np.int64).reshape(-1)),
        ignore_index=ignore_index, label_smoothing=smoothing, reduction="sum" if every else how)
    return loss / np.size(labels) if every else loss


#: check-cross-entropy's output that says whether the loss came back as a Python float
FLOAT = "the loss is a Python float (float(...), not a NumPy array or float32)"


def _log_softmax(x):
    """log softmax over the last axis, in float64 (NumPy: the checks' hints of this module and
    notebook 12's cases)."""
    z = x.astype(np.float64)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


class CrossEntropy(Check, id="check-cross-entropy",
                   functions=("cross_entropy_forward", "cross_entropy_backward")):
    loop_free = dict.fromkeys(("cross_entropy_forward", "cross_entropy_backward"),
                              "each position's target picked with np.take_along_axis, a "
                              "one-hot made by comparison (np.arange(C) == targets[..., None])")
    axes = {"dlogits": "tv"}  # axis names, for messages

    def cases(self, rng):
        yield _ce_case(rng, "4 tokens, 5 classes, no padding", (4,), 5)
        yield _ce_case(rng, "a batch (B, T, V) = (2, 4, 6) with padded targets (-100)", (2, 4),
                       6, ignore=[(0, 3), (1, 2), (1, 3)])
        yield _ce_case(rng, "ignore_index = 0 (the padding token id)", (2, 5), 4,
                       ignore=[(0, 4), (1, 1), (1, 3), (1, 4)], ignore_index=0)
        yield _ce_case(rng, "reduction = 'sum' with padding", (2, 3), 5,
                       ignore=[(1, 2)], reduction="sum")
        yield _ce_case(rng, "an upstream gradient dloss = 0.5", (3, 2), 4, ignore=[(2, 1)],
                       dloss=0.5)
        yield _ce_case(rng, "one real token, the rest padding", (2, 3), 5,
                       ignore=[(0, 0), (0, 1), (0, 2), (1, 0), (1, 2)])
        yield _ce_case(rng, "float32 logits", (2, 4), 6, ignore=[(1, 3)], dtype=np.float32)

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield _ce_case(rng, "huge logits (+-1000)", (2, 3), 4, ignore=[(0, 2)], scale=1000.0)
        yield _ce_case(rng, "two classes, ignore_index = 1", (6,), 2, ignore=[(1,), (4,)],
                       ignore_index=1)
        yield _ce_case(rng, "float32, sum, dloss = 2", (3, 3), 7, ignore=[(0, 1)],
                       reduction="sum", dloss=2.0, dtype=np.float32)
    ### END HIDDEN TESTS

    def run(self, f, logits, targets, ignore_index=-100, reduction="mean", dloss=1.0):
        loss, cache = f.cross_entropy_forward(logits, targets, ignore_index, reduction)
        return {"loss": loss, "dlogits": f.cross_entropy_backward(dloss, cache),
                FLOAT: isinstance(loss, float)}

    def expected(self, logits, targets, ignore_index=-100, reduction="mean", dloss=1.0,
                 count_all=False, keep_padding=False):
        how = "mean over all" if count_all else reduction
        loss, dlogits = autograd(lambda lt: _cross_entropy(
            lt, targets, -100 if keep_padding else ignore_index, how), dloss, logits)
        return {"loss": loss[()] if logits.dtype == np.float32 else float(loss),
                "dlogits": dlogits, FLOAT: True}

    def mistakes(self, logits, targets, ignore_index=-100, reduction="mean", dloss=1.0):
        args = (logits, targets, ignore_index, reduction, dloss)
        right = self.expected(*args)
        real = int((np.asarray(targets) != ignore_index).sum())
        found = {}
        if reduction == "mean" and real < np.size(targets):
            found["dividing by all tokens, padding included, instead of by the real tokens "
                  "only (the mean is over the tokens that count)"] = (
                lambda: self.expected(*args, count_all=True))
        if 0 <= ignore_index < logits.shape[-1]:
            found["not ignoring the padded targets (they get a loss and a gradient)"] = (
                lambda: self.expected(*args, keep_padding=True))
        if reduction == "mean" and real > 1:
            found["forgetting the 1 / (number of real tokens) of the mean in the backward "
                  "(p - y without dividing)"] = (
                lambda: {**right, "dlogits": right["dlogits"] * logits.dtype.type(real)})
        if dloss != 1.0:
            found["ignoring the upstream gradient dloss (multiply the gradient by it)"] = (
                lambda: {**right, "dlogits": right["dlogits"] / logits.dtype.type(dloss)})
        if reduction == "sum":
            found["with reduction ignored: always the mean"] = \
                lambda: self.expected(logits, targets, ignore_index, "mean", dloss)
        if real < np.size(targets):  # the padded positions, read as the class id 0
            keep = np.asarray(targets) != ignore_index
            logp = _log_softmax(logits)
            onehot = np.arange(logits.shape[-1]) == np.where(keep, targets, 0)[..., None]
            weight = 1 / real if reduction == "mean" else 1.0
            padded = (np.exp(logp) - onehot) * (~keep)[..., None] * weight * dloss
            found["with the padded positions' loss counted (multiply each term by the mask "
                  "before the sum)"] = lambda: {**right, "loss": type(right["loss"])(
                      right["loss"] - (logp * onehot).sum(-1)[~keep].sum() * weight)}
            found["with the padded positions given a gradient (w is 0 where the target is "
                  "ignored)"] = lambda: {**right, "dlogits": (right["dlogits"] + padded).astype(
                      logits.dtype)}
        return found


# --------------------------------------------------------------------------------------------
# Embedding


class Embedding(Check, id="check-embedding", functions=("embedding_forward", "embedding_backward")):
    axes = {"out": "te"}  # axis names, for messages
    loop_free = {"embedding_backward": "np.add.at adds every row of dout at its id at once"}

    @staticmethod
    def _case(rng, name, ids, vocab, d, dtype=np.float64):
        ids = np.asarray(ids, dtype=np.int64)
        return Case(name, (ids, *normals(rng, (vocab, d), (*ids.shape, d), dtype=dtype)))

    def cases(self, rng):
        yield self._case(rng, "distinct ids (1-D)", [3, 0, 4], 6, 4)
        yield self._case(rng, "a repeated id: token 2 three times", [2, 5, 2, 2, 1], 6, 3)
        yield self._case(rng, "a batch (B, T) of ids with repeats", [[1, 4, 4, 0], [4, 2, 1, 1]],
                         5, 3)
        yield self._case(rng, "unused rows of a large table get zero gradient", [7, 1], 12, 2)
        yield self._case(rng, "float32 table", [[0, 3, 3], [1, 0, 3]], 4, 5, dtype=np.float32)

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield self._case(rng, "one id (a 0-d array)", 2, 4, 3)
        yield self._case(rng, "every id the same", [[1, 1, 1], [1, 1, 1]], 3, 2)
        yield self._case(rng, "three axes of ids", rng.integers(0, 5, size=(2, 3, 4)), 5, 3)
    ### END HIDDEN TESTS

    def run(self, f, ids, W, dout):
        out, cache = f.embedding_forward(ids, W)
        return {"out": out, "grads": f.embedding_backward(dout, cache)}

    def expected(self, ids, W, dout):
        embedding, ids_t = torch.nn.functional.embedding, torch.from_numpy(np.asarray(ids))
        out, dW = autograd(lambda wt: embedding(ids_t, wt), dout, W)
        return {"out": out, "grads": {"W": dW}}

    def mistakes(self, ids, W, dout):
        right = self.expected(ids, W, dout)

        def fancy_index_add():
            dW = np.zeros_like(W)
            dW[ids] += dout  # a repeated id: only one of its updates survives
            return {**right, "grads": {"W": dW}}

        return {"with dW[ids] += dout: for a repeated id, fancy-index assignment keeps one "
                "of its gradients instead of adding them all (np.add.at adds every one)":
                fancy_index_add}


class RMSNormBackward(Check, id="check-rms-norm-backward", arguments=("rms_norm_backward",)):
    loop_free = {"rms_norm_backward": "reduce over the last axis with keepdims=True, and sum "
                                      "dgamma over the flattened leading axes"}

    @staticmethod
    def _case(rng, name, shape, eps=1e-5):
        return Case(name, normals(rng, shape, shape, shape[-1]), {"eps": eps})

    def cases(self, rng):
        yield self._case(rng, "one vector (D = 5)", (5,))
        yield self._case(rng, "rows (3, 4)", (3, 4))
        yield self._case(rng, "three axes (2, 3, 6)", (2, 3, 6))
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        yield self._case(later, "eps = 0.1 given", (3, 4), eps=0.1)

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield self._case(rng, "a large eps = 0.5", (4, 3), eps=0.5)
        yield self._case(rng, "four axes (2, 2, 3, 4)", (2, 2, 3, 4))
    ### END HIDDEN TESTS

    def run(self, f, dy, x, gamma, eps=1e-5):
        dx, dgamma = f.rms_norm_backward(dy, x, gamma, eps)
        return {"dx": dx, "dgamma": dgamma}

    def expected(self, dy, x, gamma, eps=1e-5):
        rms_norm = torch.nn.functional.rms_norm
        _, dx, dgamma = autograd(lambda xt, gt: rms_norm(xt, (x.shape[-1],), gt, eps=eps), dy, x,
                                 gamma)
        return {"dx": dx, "dgamma": dgamma}

    def mistakes(self, dy, x, gamma, eps=1e-5):
        right = self.expected(dy, x, gamma, eps)
        r = np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
        xhat, g = x / r, dy * gamma
        rows, mean = x.size // x.shape[-1], _row_mean
        return {"subtracting mean(g) as layer norm does (RMSNorm subtracts no mean)":
                lambda: {**right, "dx": (g - mean(g) - xhat * mean(g * xhat)) / r},
                "dropping the term xhat * mean(g * xhat) (the path through r)":
                lambda: {**right, "dx": g / r},
                "averaging dgamma over the leading axes instead of summing":
                lambda: {**right, "dgamma": right["dgamma"] / rows}}
