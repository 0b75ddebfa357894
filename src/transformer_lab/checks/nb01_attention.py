"""Checks of notebook 01_attention: the softmax, attention, and the notebook's variants."""

from __future__ import annotations

import math

import numpy as np

from transformer_lab.checks.framework import Case, Check, register


def _torch():
    import torch

    return torch


@register
class SoftmaxForward(Check):
    id = "check-softmax-forward"
    notebook = "01_attention"
    functions = ("softmax_forward",)

    def cases(self, rng):
        yield Case("one row", (rng.standard_normal(5),))
        yield Case("a batch of rows", (rng.standard_normal((3, 4)),))
        yield Case("huge scores", (rng.standard_normal((2, 6)) * 1000,))
        yield Case("-inf entries", (np.array([[0.0, -np.inf, 1.0], [-np.inf, 2.0, 0.5]]),))
        yield Case("float32", (rng.standard_normal((2, 3, 5)).astype(np.float32),))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("one entry per row", (rng.standard_normal((4, 1)),))
        yield Case("rows far apart", (np.stack([rng.standard_normal(7) + 1e4,
                                                rng.standard_normal(7) - 1e4]),))
        yield Case("four axes", (rng.standard_normal((2, 2, 3, 4)),))
    ### END HIDDEN TESTS

    def run(self, f, x):
        return f.softmax_forward(x)[0]

    def expected(self, x):
        torch = _torch()
        return torch.softmax(torch.from_numpy(x), dim=-1).numpy()

    def mistakes(self, x):
        return {"normalising over the first axis instead of the last (axis=0)":
                lambda: _np_softmax(x, axis=0)}


def _np_softmax(x, axis=-1):
    z = np.exp(x - x.max(axis=axis, keepdims=True))
    return z / z.sum(axis=axis, keepdims=True)


@register
class AttentionForward(Check):
    id = "check-attention-forward"
    notebook = "01_attention"
    functions = ("attention_forward",)

    def cases(self, rng):
        yield Case("T = S = 4, d_k = d_v = 3", tuple(rng.standard_normal((4, 3)) for _ in range(3)))
        yield Case("T = 2, S = 5, d_k = 4, d_v = 6", (rng.standard_normal((2, 4)),
                                                      rng.standard_normal((5, 4)),
                                                      rng.standard_normal((5, 6))))
        yield Case("float32", tuple(rng.standard_normal((3, 8)).astype(np.float32)
                                    for _ in range(3)))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("one query, one key", tuple(rng.standard_normal((1, 2)) for _ in range(3)))
        yield Case("large d_k = 64", (rng.standard_normal((3, 64)), rng.standard_normal((5, 64)),
                                      rng.standard_normal((5, 2))))
    ### END HIDDEN TESTS

    def run(self, f, q, k, v):
        out, cache = f.attention_forward(q, k, v)
        return out

    def expected(self, q, k, v):
        torch = _torch()
        t = [torch.from_numpy(a) for a in (q, k, v)]
        return torch.nn.functional.scaled_dot_product_attention(*t).numpy()

    def mistakes(self, q, k, v):
        d = q.shape[-1]
        return {"without dividing the scores by sqrt(d_k)":
                lambda: _np_softmax(q @ k.T) @ v,
                "dividing the scores by d_k instead of sqrt(d_k)":
                lambda: _np_softmax(q @ k.T / d) @ v,
                "with the softmax over the queries (axis 0) instead of the keys":
                lambda: _np_softmax(q @ k.T / math.sqrt(d), axis=0) @ v}


@register
class LogSumExp(Check):
    id = "check-logsumexp"
    notebook = "01_attention"
    arguments = ("logsumexp",)

    def cases(self, rng):
        for shape, axis in [((5,), -1), ((3, 4), 0), ((3, 4), 1), ((2, 3, 4), 1)]:
            yield Case(f"shape {shape}, axis {axis}", (rng.standard_normal(shape) * 5,),
                       {"axis": axis})
        yield Case("scores near +1e4", (rng.standard_normal((3, 6)) + 1e4,))
        yield Case("scores near -1e4", (rng.standard_normal((3, 6)) - 1e4,))
        yield Case("-inf entries", (np.array([[0.0, -np.inf, 1.0], [-np.inf, 2.0, -np.inf]]),))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        x = np.stack([rng.standard_normal(6) + 1e4, rng.standard_normal(6) - 1e4])
        yield Case("one slice near +1e4, one near -1e4", (x,))
        yield Case("the same along axis 0", (x.T.copy(),), {"axis": 0})
        yield Case("four axes, axis -2", (rng.standard_normal((2, 2, 3, 4)),), {"axis": -2})
    ### END HIDDEN TESTS

    def run(self, f, x, axis=-1):
        return f.logsumexp(x, axis=axis)

    def expected(self, x, axis=-1):
        torch = _torch()
        return torch.logsumexp(torch.from_numpy(x), dim=axis).numpy()

    def mistakes(self, x, axis=-1):
        return {"subtracting the maximum of the whole array instead of each slice's":
                lambda: x.max() + np.log(np.exp(x - x.max()).sum(axis=axis)),
                "keeping the reduced axis (keepdims=True) in the result":
                lambda: np.expand_dims(self.expected(x, axis), axis)}


@register
class CosineAttention(Check):
    id = "check-cosine-attention"
    notebook = "01_attention"
    arguments = ("cosine_attention",)

    def cases(self, rng):
        yield Case("B = 2, T = 3, S = 5, tau = 0.5",
                   (rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)),
                    rng.standard_normal((2, 5, 6))), {"tau": 0.5})
        yield Case("tau = 1e6 (almost uniform weights)",
                   tuple(rng.standard_normal((1, 4, 3)) for _ in range(3)), {"tau": 1e6})
        yield Case("tau = 1e-4 (sharp, must stay finite)",
                   tuple(rng.standard_normal((1, 4, 3)) for _ in range(3)), {"tau": 1e-4})

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        q, k, v = (rng.standard_normal(s) for s in [(3, 2, 5), (3, 4, 5), (3, 4, 2)])
        yield Case("queries and keys of very different lengths",
                   (q * rng.uniform(0.1, 10, (3, 2, 1)), k * rng.uniform(0.1, 10, (3, 4, 1)), v),
                   {"tau": 0.2})
        yield Case("one query, one key", tuple(rng.standard_normal((1, 1, 2)) for _ in range(3)),
                   {"tau": 0.1})

    def expected(self, q, k, v, tau=0.1):
        torch = _torch()
        q, k, v = (torch.from_numpy(a) for a in (q, k, v))
        qn = q / q.norm(dim=-1, keepdim=True)
        kn = k / k.norm(dim=-1, keepdim=True)
        w = torch.softmax(qn @ kn.transpose(-1, -2) / tau, dim=-1)
        return {"out": (w @ v).numpy(), "weights": w.numpy()}
    ### END HIDDEN TESTS

    def run(self, f, q, k, v, tau=0.1):
        out, weights = f.cosine_attention(q, k, v, tau=tau)
        return {"out": out, "weights": weights}


@register
class AdditiveAttention(Check):
    id = "check-additive-attention"
    notebook = "01_attention"
    arguments = ("additive_attention",)

    def cases(self, rng):
        t, s, dq, dk, dv, h = 4, 6, 3, 5, 2, 7
        yield Case("T = 4, S = 6, d_q = 3, d_k = 5, h = 7",
                   tuple(rng.standard_normal(sh) for sh in
                         [(t, dq), (s, dk), (s, dv), (dq, h), (dk, h), (h,)]))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("one query", tuple(rng.standard_normal(sh) for sh in
                                      [(1, 2), (3, 4), (3, 5), (2, 6), (4, 6), (6,)]))
        yield Case("h = 1", tuple(rng.standard_normal(sh) for sh in
                                  [(3, 2), (4, 2), (4, 2), (2, 1), (2, 1), (1,)]))

    def expected(self, q, k, v, W1, W2, w):
        torch = _torch()
        q, k, v, W1, W2, w = (torch.from_numpy(a) for a in (q, k, v, W1, W2, w))
        scores = torch.stack([torch.stack([w @ torch.tanh(q[i] @ W1 + k[j] @ W2)
                                           for j in range(k.shape[0])])
                              for i in range(q.shape[0])])
        weights = torch.softmax(scores, dim=-1)
        return {"out": (weights @ v).numpy(), "weights": weights.numpy()}
    ### END HIDDEN TESTS

    def run(self, f, q, k, v, W1, W2, w):
        out, weights = f.additive_attention(q, k, v, W1, W2, w)
        return {"out": out, "weights": weights}
