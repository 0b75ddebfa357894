"""Checks of notebook 09_verification: the model's backward pass and loss, and the notebook's
variants (find the bug, label smoothing, positions of a left-padded batch).

The model's references are PyTorch's: ``nn.TransformerEncoder`` and ``nn.TransformerDecoder``
loaded with the case's parameters (notebook 08's :func:`torch_logits`), embeddings and output
projection as tensor operations, autograd for every gradient.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np

from transformer_lab.checks._torch_helpers import _t, autograd, torch
from transformer_lab.checks.framework import Case, Check, later_rng
from transformer_lab.checks.nb06_layers_backward import _cross_entropy
from transformer_lab.checks.nb07_blocks import tree_map
from transformer_lab.checks.nb08_transformer import (
    model_case,
    quiet_key_bias,
    torch_logits,
    torch_model_grads,
)

# --------------------------------------------------------------------------------------------
# The model's backward pass (§1) and loss (§2)


#: the model's cases: name -> the settings of :func:`model_case`
MODEL_CASES = {"pre-norm, padding": {},
               "post-norm, GELU, learned positions": {"norm_first": False, "activation": "gelu",
                                                      "learned": True},
               "float32, no embedding scale": {"dtype": np.float32, "scale_embeddings": False}}
LATER_MODEL_CASES = {"post-norm, eps = 0.1": {"norm_first": False, "eps": 0.1},
                     "pre-norm, eps = 0.1": {"eps": 0.1},
                     "no biases (params without 'b')": {"bias": False},
                     "two decoder layers, each reading the memory": {"n_dec": 2}}
### BEGIN HIDDEN TESTS
HIDDEN_MODEL_CASES = {"one head, no biases, B = 1": {"heads": 1, "bias": False, "b": 1},
                      "three encoder and two decoder layers, T = 1": {"n_enc": 3, "n_dec": 2,
                                                                       "t": 1, "pad": False}}
### END HIDDEN TESTS


def _model_cases(rng, settings, extra):
    """The model's cases of ``settings``, each with ``extra(rng, args)`` -- the upstream
    gradient, the labels -- drawn right after it."""
    for name, kw in settings.items():
        args = model_case(rng, **kw)
        yield Case(name, args + (extra(rng, args),))


def _dlogits(rng, args):
    params, _, tgt_in = args[:3]
    w = params["out_proj"]["W"]
    return rng.standard_normal(tgt_in.shape + (w.shape[1],)).astype(w.dtype)


def _labels(rng, args):
    params, _, tgt_in = args[:3]
    labels = rng.integers(0, params["out_proj"]["W"].shape[1], tgt_in.shape)
    if labels.size > 1:
        labels[-1, -1] = -1  # ignored: padding
    return labels


class TransformerBackward(Check, id="check-transformer-backward",
                          functions=("transformer_forward", "transformer_backward")):
    def cases(self, rng):
        yield from _model_cases(rng, MODEL_CASES, _dlogits)
        # the cases below were added later: the ones above stay as drawn
        yield from _model_cases(later_rng(rng), LATER_MODEL_CASES, _dlogits)

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield from _model_cases(rng, HIDDEN_MODEL_CASES, _dlogits)
    ### END HIDDEN TESTS

    def run(self, f, params, src, tgt_in, config, pe, src_pad, tgt_pad, dlogits):
        _, cache = f.transformer_forward(params, src, tgt_in, SimpleNamespace(**config), pe,
                                         src_pad, tgt_pad)
        grads = f.transformer_backward(dlogits, cache)
        return quiet_key_bias(grads, dlogits.dtype)

    def expected(self, params, src, tgt_in, config, pe, src_pad, tgt_pad, dlogits):
        _, logits, core, outer = torch_logits(params, src, tgt_in, config, pe, src_pad, tgt_pad)
        logits.backward(_t(dlogits))
        return torch_model_grads(params, core, outer)

    def mistakes(self, params, src, tgt_in, config, pe, src_pad, tgt_pad, dlogits):
        right = self.expected(params, src, tgt_in, config, pe, src_pad, tgt_pad, dlogits)
        cut = dict(right, **{k: tree_map(np.zeros_like, right[k])
                             for k in ("encoder", "src_embed", "src_pos") if k in right})
        return {"without sending the memory's gradient into the encoder (decoder_backward "
                "returns dmemory: run encoder_backward on it, then the source embedding's)":
                lambda: cut}


class TransformerLoss(Check, id="check-transformer-loss", functions=("transformer_loss",)):
    def cases(self, rng):
        yield from _model_cases(rng, MODEL_CASES, _labels)
        later = later_rng(rng)  # the case below was added later: the ones above stay as drawn
        args = model_case(later)
        labels = _labels(later, args)
        labels[labels == -1] = 0
        yield Case("padding marked 0 (ignore_index = 0)", args + (labels,), {"ignore_index": 0})

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield from _model_cases(rng, HIDDEN_MODEL_CASES, _labels)
    ### END HIDDEN TESTS

    def run(self, f, params, src, tgt_in, config, pe, src_pad, tgt_pad, labels, ignore_index=-1):
        loss, grads = f.transformer_loss(params, src, tgt_in, labels, SimpleNamespace(**config),
                                         pe, src_pad, tgt_pad, ignore_index)
        return {"loss": loss, "grads": quiet_key_bias(grads, params["out_proj"]["W"].dtype)}

    def expected(self, params, src, tgt_in, config, pe, src_pad, tgt_pad, labels, ignore_index=-1,
                 how="mean"):
        _, logits, core, outer = torch_logits(params, src, tgt_in, config, pe, src_pad, tgt_pad)
        loss = _cross_entropy(logits, labels, ignore_index, how)
        loss.backward()
        dtype = params["out_proj"]["W"].dtype  # the loss in the model's precision (tolerance)
        return {"loss": dtype.type(loss.item()), "grads": torch_model_grads(params, core, outer)}

    def mistakes(self, params, src, tgt_in, config, pe, src_pad, tgt_pad, labels, ignore_index=-1):
        case = (params, src, tgt_in, config, pe, src_pad, tgt_pad, labels, ignore_index)
        hints = {"dividing by every position, ignored ones included: the mean is over the "
                 "labels that count": lambda: self.expected(*case, how="mean over all"),
                 "with the sum over the labels instead of their mean":
                 lambda: self.expected(*case, how="sum")}
        if ignore_index == -1:  # the label -1, no longer ignored, picks the last class
            last = np.where(labels == -1, params["out_proj"]["W"].shape[1] - 1, labels)
            hints["calling cross_entropy_forward(logits, labels) without ignore_index: its "
                  "default is -100 (PyTorch's), the model marks padding with -1, so the padded "
                  "positions count (as the last class); pass ignore_index on"] = (
                lambda: self.expected(*case[:-2], last, -100))
        else:
            hints["writing in -1 instead of using the argument ignore_index"] = (
                lambda: self.expected(*case[:-1]))
        return hints


# --------------------------------------------------------------------------------------------
# Exercise 1: find the bugs (a torch function, compared with nn.MultiheadAttention)


def _mha_answer(case, attend):
    """out and dx of ``attend(mha, x, mask)`` on the case's (batch, length, e, heads, seed):
    an ``nn.MultiheadAttention`` (float64) with seeded weights, an input, a padding mask (B, T:
    True = padding) and an upstream gradient."""
    batch, length, e, heads, seed = case
    r = np.random.default_rng(seed)
    mha = torch.nn.MultiheadAttention(e, heads, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        for p in mha.parameters():
            p.copy_(torch.from_numpy(r.standard_normal(tuple(p.shape)) * 0.5))
    x = r.standard_normal((batch, length, e))
    lengths = r.integers(1, length + 1, batch)
    mask = _t(np.arange(length)[None, :] >= lengths[:, None])
    out, dx = autograd(lambda xt: attend(mha, xt, mask), r.standard_normal((batch, length, e)), x)
    return {"out": out, "dx": dx}


class FindTheBug(Check, id="check-find-the-bug", arguments=("self_attention",)):
    axes = {"out": "bte", "dx": "bte"}  # axis names, for messages

    def cases(self, rng):
        yield Case("B=2, T=5, E=12, 3 heads", (2, 5, 12, 3, 1))
        yield Case("B=3, T=4, E=8, 2 heads", (3, 4, 8, 2, 2))
        yield Case("one head (where the bugs hide)", (2, 3, 6, 1, 3))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("head width 1 (H = E = 8), T = 1", (4, 1, 8, 8, 4))
        yield Case("B=1, T=6, E=16, 4 heads", (1, 6, 16, 4, 5))

    def expected(self, *case):
        return _mha_answer(case, lambda mha, xt, mask: mha(xt, xt, xt, key_padding_mask=mask,
                                                           need_weights=False)[0])

    def mistakes(self, batch, length, e, heads, seed):
        def variant(scale_by_e, transpose_back, query_axis=False):
            dh = e // heads

            def attention(mha, xt, mask):
                qkv = (xt @ mha.in_proj_weight.T + mha.in_proj_bias).chunk(3, dim=-1)
                q, k, v = (a.reshape(batch, length, heads, dh).transpose(1, 2) for a in qkv)
                scores = q @ k.transpose(-2, -1) / np.sqrt(e if scale_by_e else dh)
                blocked = mask[:, None, :, None] if query_axis else mask[:, None, None, :]
                scores = scores.masked_fill(blocked, float("-inf"))
                ctx = torch.softmax(scores, dim=-1) @ v
                ctx = ctx.transpose(1, 2) if transpose_back else ctx
                return ctx.reshape(batch, length, e) @ mha.out_proj.weight.T + mha.out_proj.bias

            return _mha_answer((batch, length, e, heads, seed), attention)

        return {"with the scores still divided by sqrt(E) (the first bug): each head's scores "
                "are dot products of E/H numbers": lambda: variant(True, True),
                "with the heads merged by a reshape alone (the second bug): move the heads "
                "back next to the head width, (B, H, T, Dh) -> (B, T, H, Dh), before reshaping":
                lambda: variant(False, False),
                "with both bugs still in": lambda: variant(True, False),
                "with the padding mask on the query axis, mask[:, None, :, None]: a padded "
                "query's whole row of scores is -inf and its softmax NaN; the key padding "
                "mask blocks keys, the last axis of the scores: mask[:, None, None, :]":
                lambda: variant(False, True, query_axis=True)}
    ### END HIDDEN TESTS

    def run(self, f, *case):
        return _mha_answer(case, lambda mha, xt, mask: f.self_attention(
            xt, mha.in_proj_weight.T, mha.in_proj_bias, mha.out_proj.weight.T, mha.out_proj.bias,
            case[3], key_padding_mask=mask))


# --------------------------------------------------------------------------------------------
# Exercise 2: label-smoothed cross-entropy over the labels that are not padding


def _smoothed(logits, labels, pad_id, eps, how="mean"):
    """Loss and dlogits from torch's ``cross_entropy(label_smoothing=eps)`` (``how``: see
    :func:`.nb06_layers_backward._cross_entropy`)."""
    value, dlogits = autograd(lambda lt: _cross_entropy(lt, labels, pad_id, how, eps), None,
                              logits)
    return {"loss": float(value), "dlogits": dlogits}


class LabelSmoothing(Check, id="check-label-smoothing", arguments=("smoothed_loss",)):
    loop_free = {"smoothed_loss": "build q for every position at once (np.put_along_axis or "
                                  "a one-hot comparison), and weight the positions by a mask"}
    axes = {"dlogits": "btv"}  # axis names, for messages

    def cases(self, rng):
        for shape, eps, scale in [((2, 5, 7), 0.1, 3), ((3, 4, 5), 0.0, 3),
                                    ((1, 6, 11), 0.3, 3), ((2, 3, 6), 0.1, 1000)]:
            labels = rng.integers(1, shape[-1], shape[:2])
            labels[0, -1] = 0  # at least one padding position (pad_id 0)
            yield Case(f"logits {shape} of size ~{scale}, eps = {eps}",
                       (rng.standard_normal(shape) * scale, labels, 0, eps))
        later = later_rng(rng)  # the case below was added later: the ones above stay as drawn
        labels = later.integers(0, 5, (2, 4))
        labels[:, -1] = 3  # pad_id 3, and label 0 is a token like any other
        yield Case("pad_id 3 (the padding's id is an argument)",
                   (later.standard_normal((2, 4, 5)), labels, 3, 0.1))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        labels = rng.integers(1, 3, (4, 2))
        labels[1] = 0  # a whole sequence of padding
        yield Case("V = 3, a sequence of padding only, eps = 0.2",
                   (rng.standard_normal((4, 2, 3)), labels, 0, 0.2))
        yield Case("logits of size ~1000, eps = 0, pad_id 2",
                   (rng.standard_normal((2, 3, 6)) * 1000, np.array([[1, 2, 3], [2, 4, 5]]), 2,
                    0.0))

    def expected(self, logits, labels, pad_id, eps):
        return _smoothed(logits, labels, pad_id, eps)

    def mistakes(self, logits, labels, pad_id, eps):
        case = (logits, labels, pad_id, eps)
        found = {"with the mean over every position, padding included: the mean is over the "
                 "labels that are not pad_id": lambda: _smoothed(*case, how="mean over all")}
        if pad_id != 0:
            found["with 0 as the padding's id: it is the argument pad_id"] = (
                lambda: _smoothed(logits, labels, 0, eps))
        if eps > 0:
            v = logits.shape[-1]
            found["without the smoothing (q must be (1 - eps) onehot + eps / V)"] = (
                lambda: _smoothed(*case[:3], 0.0))
            found["with eps spread over the V - 1 other tokens: q = (1 - eps) onehot + "
                  "eps / V puts eps / V on every token, the label included"] = (
                lambda: _smoothed(*case[:3], eps * v / (v - 1)))
        return found
    ### END HIDDEN TESTS

    def run(self, f, logits, labels, pad_id, eps):
        loss, dlogits = f.smoothed_loss(logits, labels, pad_id, eps)
        return {"loss": loss, "dlogits": dlogits}


# --------------------------------------------------------------------------------------------
# Exercise 3: positional encodings of a batch padded on either side


def sinusoid_table(length: int, d_model: int) -> np.ndarray:
    """The sinusoidal encodings of positions 0 .. length - 1 (length, d_model), float64."""
    return sinusoids(np.arange(length), d_model)


def sinusoids(positions, d_model: int, mistake: str = "") -> np.ndarray:
    """The sinusoidal encodings of integer ``positions`` (...) -> (..., d_model), float64: sin
    at the even features, cos at the odd ones, frequencies 10000^(-2i/d_model) -- or, with
    ``mistake``, the exponent "i/d" for 2i/d, or sin and cos "swapped" or in two "halves"."""
    i = np.arange((d_model + 1) // 2) * (1 if mistake == "i/d" else 2)
    angles = np.asarray(positions)[..., None] * 10000.0 ** (-i / d_model)
    sin, cos = np.sin(angles), np.cos(angles)
    if mistake == "halves":
        return np.concatenate([sin, cos], axis=-1)[..., :d_model]
    out = np.empty(angles.shape[:-1] + (d_model,))
    even, odd = (cos, sin) if mistake == "swapped" else (sin, cos)
    out[..., 0::2], out[..., 1::2] = even, odd[..., :d_model // 2]
    return out


### BEGIN HIDDEN TESTS
#: padded_positional_encoding's mistakes: what each is -> the mistake of PaddedPositions.expected
PADDED_MISTAKES = {
    "each token's column as its position: count the positions from each sequence's first real "
    "token": "column",
    "the positions counted from 1: the first real token is at position 0 (cumsum - 1)":
    "from 1",
    "the padding not zeroed: its rows must be zeros": "not zeroed",
    "the padding not zeroed (its positions clipped at 0): its rows must be zeros": "clipped",
    "10000^(-i/d) for 10000^(-2i/d): the i-th pair of features, 2i and 2i + 1, has the "
    "exponent 2i/d (np.arange(0, d, 2) / d)": "i/d",
    "sin and cos swapped: sin at the even features, cos at the odd ones": "swapped",
    "all the sines, then all the cosines: they alternate, sin at the even features, cos at the "
    "odd ones": "halves"}
### END HIDDEN TESTS


class PaddedPositions(Check, id="check-padded-positions",
                      arguments=("padded_positional_encoding",)):
    loop_free = {"padded_positional_encoding": "each token's position is a cumulative sum "
                                               "of the real-token mask along the positions"}
    def cases(self, rng):
        ids = np.array([[0, 0, 5, 3, 8], [4, 4, 4, 4, 4], [0, 7, 7, 0, 0]])
        yield Case("padded left, not at all, on both sides; d_model 6", (ids, 0, 6))
        yield Case("the same, odd d_model 7", (ids, 0, 7))
        yield Case("a row of padding only", (np.array([[3, 4, 0], [0, 0, 0]]), 0, 4))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("long left padding, pad_id 9", (np.array([[9, 9, 9, 9, 1, 2, 3, 4]]), 9, 8))
        yield Case("one column", (np.array([[0], [5]]), 0, 3))

    def expected(self, ids, pad_id, d_model, mistake=""):
        """The encodings -- or, with ``mistake``, each token's "column" as its position,
        positions "from 1", the exponent "i/d" for 2i/d, sin and cos "swapped" or in two
        "halves", or the padding "not zeroed" (its positions as computed, or "clipped" at
        0)."""
        real = ids != pad_id
        positions = np.cumsum(real, axis=1) - (mistake != "from 1")
        if mistake == "column":
            positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
        if mistake == "clipped":
            positions = np.maximum(positions, 0)
        out = sinusoids(positions, d_model, mistake)
        if mistake not in ("not zeroed", "clipped"):
            out[~real] = 0
        return out

    def mistakes(self, ids, pad_id, d_model):
        return {f"with {wrong}": functools.partial(self.expected, ids, pad_id, d_model, mistake)
                for wrong, mistake in PADDED_MISTAKES.items()}
    ### END HIDDEN TESTS
