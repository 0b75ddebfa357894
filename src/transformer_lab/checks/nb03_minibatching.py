"""Checks of notebook 03_minibatching: the linear layer and attention over any leading axes,
and the notebook's variants (RMS normalisation, the last valid token, a masked mean)."""

from __future__ import annotations

import math

import numpy as np

from transformer_lab.checks._torch_helpers import torch
from transformer_lab.checks.framework import Case, Check, later_rng, normals
from transformer_lab.checks.nb00_gradients import linear_case, torch_linear
from transformer_lab.checks.nb01_attention import _softmax
from transformer_lab.checks.nb02_masking import _answer, _MaskedAttention, _qkv


class LinearForwardBatched(Check, id="check-linear-forward-batched", functions=("linear_forward",)):
    loop_free = {"linear_forward": "flatten the leading axes, x.reshape(-1, D_in), and take one "
                                   "product"}

    def cases(self, rng):
        yield Case("a batch (B, T, D_in) = (2, 3, 4), D_out = 5", linear_case(rng, (2, 3), 4, 5))
        yield Case("two leading axes (2, 3, 4, D_in = 3)", linear_case(rng, (2, 3, 4), 3, 2))
        yield Case("a batch without bias", linear_case(rng, (3, 2), 4, 3, bias=False))
        yield Case("float32 batch", linear_case(rng, (2, 5), 6, 3, dtype=np.float32))
        yield Case("2-D input (N, D_in) still works", linear_case(rng, (5,), 3, 4))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("a single vector (D_in,)", linear_case(rng, (), 4, 3))
        yield Case("batch of 1, one token", linear_case(rng, (1, 1), 3, 2))
        yield Case("square shapes B = T = D_in = D_out = 4", linear_case(rng, (4, 4), 4, 4))
    ### END HIDDEN TESTS

    def run(self, f, x, W, b, dout):
        return f.linear_forward(x, W, b)[0]

    def expected(self, x, W, b, dout):
        return torch_linear(x, W, b, dout)[0]

    def mistakes(self, x, W, b, dout):
        flat = x.reshape(-1, x.shape[-1]) @ W + (0 if b is None else b)
        found = {"reshaping x to (N, D_in) without restoring the leading axes afterwards "
                 "(out must be (..., D_out): reshape(*x.shape[:-1], D_out))": lambda: flat}
        if W.shape[0] == W.shape[1]:
            found["with the weight transposed (x @ W.T): W is (D_in, D_out)"] = (
                lambda: x @ W.T + (0 if b is None else b))
        if x.ndim >= 3:  # the rows flattened in one order and unflattened in another
            lead, bias = (*x.shape[:-1], W.shape[1]), 0 if b is None else b
            found["flattening in Fortran order (order='F') and restoring in C order: the rows "
                  "come back shuffled; reshape both ways alike (the default)"] = (
                lambda: (x.reshape(-1, x.shape[-1], order="F") @ W + bias).reshape(lead))
            found["flattening x.T (on a batch, .T reverses every axis: the rows come out in "
                  "(t, b) order); x.reshape(-1, D_in) keeps them in order"] = (
                lambda: (x.T.reshape(x.shape[-1], -1).T @ W + bias).reshape(lead))
        return found


class LinearBackwardBatched(LinearForwardBatched, id="check-linear-backward-batched",
                            functions=("linear_forward", "linear_backward")):
    """The forward check's cases (the same inputs), the backward's answer."""
    loop_free = {**LinearForwardBatched.loop_free,
                 "linear_backward": "flatten the leading axes of x and dout, and take one "
                                    "product for dW"}

    def run(self, f, x, W, b, dout):
        out, cache = f.linear_forward(x, W, b)
        dx, grads = f.linear_backward(dout, cache)
        found = {"dx": dx, "dW": grads["W"]}
        if b is not None:
            found["db"] = grads["b"]
        return found

    def expected(self, x, W, b, dout):
        _, dx, dW, db = torch_linear(x, W, b, dout)
        return {"dx": dx, "dW": dW} if b is None else {"dx": dx, "dW": dW, "db": db}

    def mistakes(self, x, W, b, dout):
        right = self.expected(x, W, b, dout)
        found = {}
        if x.ndim >= 3:
            found["computing dW per sequence and not summing it over the leading axes "
                  "(dW = x_flat^T dout_flat sums over every token)"] = (
                lambda: {**right, "dW": np.swapaxes(x, -1, -2) @ dout})
            if b is not None:
                found["summing db over the first axis only (sum over every leading axis)"] = (
                    lambda: {**right, "db": dout.sum(axis=0)})
        if x.ndim >= 2:
            n = math.prod(x.shape[:-1])
            found["averaging dW and db over the tokens instead of summing them"] = (
                lambda: {k: (v / n if k != "dx" else v) for k, v in right.items()})
            found["leaving dx flat (N, D_in): reshape it back to x's shape"] = (
                lambda: {**right, "dx": right["dx"].reshape(-1, x.shape[-1])})
        return found


class AttentionBatched(_MaskedAttention, id="check-attention-batched"):
    loop_free = {"attention_forward": "@ broadcasts the leading axes: q @ np.swapaxes(k, -1, "
                                      "-2) on the whole batch"}

    def cases(self, rng):
        yield Case("a batch (B, T, d_k) = (3, 4, 6), S = 5, d_v = 2",
                   _qkv(rng, 4, 5, 6, 2, lead=(3,)))
        yield Case("batch and head axes (B, H, T, d_k) = (2, 3, 4, 5)",
                   _qkv(rng, 4, 6, 5, 2, lead=(2, 3)))
        pad = np.arange(5)[None, :] >= np.array([5, 3, 1])[:, None]
        yield Case("a padding mask (B, 1, S) broadcast over the queries",
                   (*_qkv(rng, 5, 5, 4, 3, lead=(3,)), pad[:, None, :]))
        yield Case("a causal mask (T, S) shared by batch and heads",
                   (*_qkv(rng, 4, 4, 3, 5, lead=(2, 2)), np.triu(np.ones((4, 4), bool), 1)))
        yield Case("float32 batch with a padding mask",
                   (*_qkv(rng, 5, 5, 8, 2, np.float32, lead=(3,)), pad[:, None, :]))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("batch of 1", _qkv(rng, 3, 4, 2, 2, lead=(1,)))
        yield Case("square shapes B = T = S = d_k = 4", _qkv(rng, 4, 4, 4, 4, lead=(4,)))
        yield Case("three leading axes", _qkv(rng, 2, 3, 4, 2, lead=(2, 1, 3)))
        penalty = -np.abs(np.arange(3)[:, None] - np.arange(3)[None, :]) * rng.uniform(0, 1, (
            2, 1, 1, 1))
        yield Case("a float mask (B, 1, T, S), added",
                   (*_qkv(rng, 3, 3, 2, 3, lead=(2, 2)), penalty))
        blocked = np.zeros((2, 3, 4), bool)
        blocked[1, 0] = True
        yield Case("a fully blocked row in a batch", (*_qkv(rng, 3, 4, 3, 2, lead=(2,)), blocked))
        yield Case("a bool mask per head (B, H, T, S)",
                   (*_qkv(rng, 4, 5, 3, 2, lead=(2, 3)), rng.random((2, 3, 4, 5)) < 0.3))
    ### END HIDDEN TESTS

    def mistakes(self, q, k, v, mask=None):
        # (on a single sequence, q (T, d_k), both give the right answer: no hint)
        def attend(scale, axis=-1):
            s = q @ np.swapaxes(k, -1, -2) * scale
            if mask is not None:
                s = np.where(mask, -np.inf, s) if mask.dtype == bool else s + mask
            return _answer(_softmax(s, axis), v)

        return {**super().mistakes(q, k, v, mask),
                "scaling by 1/sqrt(q.shape[1]) -- on a batch that is T, not d_k "
                "(count axes from the right: q.shape[-1])":
                lambda: attend(1 / math.sqrt(q.shape[1])),
                "with the softmax over axis 1 -- on a batch that is not the keys' axis "
                "(use the last axis)": lambda: attend(1 / math.sqrt(q.shape[-1]), axis=1)}


# --------------------------------------------------------------------------------------------
# Variant exercises


class RmsNorm(Check, id="check-rms-norm", arguments=("rms_norm",)):
    loop_free = {"rms_norm": "reduce over the last axis with keepdims=True"}

    def cases(self, rng):
        for shape in [(7,), (4, 7), (3, 4, 7), (2, 3, 4, 7)]:
            yield Case(f"x of shape {shape}", normals(rng, shape, shape[-1]))
        yield Case("x of shape (7, 7): as many tokens as features", normals(rng, (7, 7), 7))
        yield Case("x of shape (3, 7, 7)", normals(rng, (3, 7, 7), 7))
        yield Case("float32 batch", normals(rng, (2, 3, 5), 5, dtype=np.float32))
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        yield Case("eps = 0.1 given by keyword", normals(later, (3, 4), 4), {"eps": 0.1})

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("eps = 0.5 given by keyword", (rng.standard_normal((2, 3, 5)), np.ones(5)),
                   {"eps": 0.5})
        yield Case("D = 1", normals(rng, (3, 2, 1), 1))
        yield Case("(5, 5, 5): every axis the same size", normals(rng, (5, 5, 5), 5))

    def mistakes(self, x, gamma, eps=1e-5):
        ms = np.mean(x * x, axis=-1, keepdims=True)
        return {"without keepdims=True: the mean square of each token must stay a (..., 1) "
                "column to divide its own row": lambda: x / np.sqrt(ms[..., 0] + eps) * gamma,
                "adding eps outside the square root": lambda: x / (np.sqrt(ms) + eps) * gamma,
                "with the mean over the first axis instead of the last":
                lambda: x / np.sqrt(np.mean(x * x, axis=0, keepdims=True) + eps) * gamma,
                "without the gain gamma (multiply by it last)": lambda: x / np.sqrt(ms + eps),
                "subtracting the mean first: that is a layer norm; RMSNorm divides x as it is "
                "by its root mean square": lambda: (x - x.mean(-1, keepdims=True)) / np.sqrt(
                    x.var(-1, keepdims=True) + eps) * gamma,
                "dividing by the standard deviation (the variance subtracts the mean) where the "
                "root mean square, mean(x * x), belongs": lambda: x / np.sqrt(
                    x.var(-1, keepdims=True) + eps) * gamma}
    ### END HIDDEN TESTS

    def run(self, f, x, gamma, eps=1e-5):
        return f.rms_norm(x, gamma, eps=eps)

    def expected(self, x, gamma, eps=1e-5):
        return torch.nn.functional.rms_norm(torch.from_numpy(x), (x.shape[-1],),
                                            torch.from_numpy(gamma), eps=eps).numpy()


def _padded_batch(rng, b, t, d, full_first=True):
    H = rng.standard_normal((b, t, d))
    lengths = rng.integers(1, t + 1, size=b)
    if full_first:
        lengths[0] = t
    return H, lengths


class LastToken(Check, id="check-last-token", arguments=("last_valid_token",)):
    loop_free = {"last_valid_token": "index two axes at once with two integer arrays"}

    def cases(self, rng):
        yield Case("H (3, 5, 4), lengths [5, 2, 1]",
                   (rng.standard_normal((3, 5, 4)), np.array([5, 2, 1])))
        yield Case("one sequence, no padding", _padded_batch(rng, 1, 4, 6))
        yield Case("H (6, 2, 2)", _padded_batch(rng, 6, 2, 2))
        yield Case("H (4, 4, 4): every axis the same size", _padded_batch(rng, 4, 4, 4))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("every sequence of length 1", (rng.standard_normal((3, 4, 2)),
                                                  np.ones(3, dtype=int)))

    def expected(self, H, lengths):
        return np.stack([H[b, n - 1] for b, n in enumerate(lengths)])

    def mistakes(self, H, lengths):
        lengths = np.asarray(lengths)
        return {"taking row lengths[b] instead of lengths[b] - 1 (positions count from 0)":
                lambda: H[np.arange(len(H)), np.minimum(lengths, H.shape[1] - 1)],
                "taking the last position T - 1 of every sequence (padding included)":
                lambda: H[:, -1],
                "indexing every sequence at all B positions (as H[:, lengths - 1] does), "
                "(B, B, D): pair each position with its own row, H[np.arange(B), lengths - 1]":
                lambda: H[:, lengths - 1]}
    ### END HIDDEN TESTS


class MaskedMean(Check, id="check-masked-mean", arguments=("masked_mean",)):
    loop_free = {"masked_mean": "weight by the mask and sum over the positions"}

    @staticmethod
    def _case(rng, b, t, d, last_one=True):
        H, lengths = _padded_batch(rng, b, t, d, full_first=False)
        if last_one:
            lengths[-1] = 1
        H[np.arange(t)[None, :] >= lengths[:, None]] = 1e3  # padding must not leak in
        return H, lengths

    def cases(self, rng):
        yield Case("H (3, 5, 4), padding holds 1e3", self._case(rng, 3, 5, 4))
        yield Case("one sequence of length 1", self._case(rng, 1, 4, 6))
        yield Case("H (5, 3, 3)", self._case(rng, 5, 3, 3))
        yield Case("no padding: the plain mean over time",
                   (rng.standard_normal((2, 3, 4)), np.array([3, 3])))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("H (4, 4, 4) with padding: every axis the same size",
                   self._case(rng, 4, 4, 4, False))

    def expected(self, H, lengths):
        return np.stack([H[b, :n].mean(axis=0) for b, n in enumerate(lengths)])

    def mistakes(self, H, lengths):
        lengths = np.asarray(lengths)
        valid = np.arange(H.shape[1])[None, :] < lengths[:, None]
        total = (H * valid[:, :, None]).sum(axis=1)
        return {"averaging over all T positions (the padding too)": lambda: H.mean(axis=1),
                "dividing the masked sum by T instead of each sequence's length":
                lambda: total / H.shape[1],
                "summing without dividing by the lengths": lambda: total,
                "with the padding summed in too (the mask not applied), divided by the lengths":
                lambda: H.sum(axis=1) / lengths[:, None],
                "with the mask inverted: the padding summed, the tokens left out":
                lambda: (H * ~valid[:, :, None]).sum(axis=1) / lengths[:, None],
                "with <= where < belongs: position `length` is the first padding (positions "
                "count from 0)": lambda: (H * (valid | (np.arange(H.shape[1])[None, :] ==
                                                        lengths[:, None]))[:, :, None]
                                          ).sum(axis=1) / lengths[:, None]}
    ### END HIDDEN TESTS
