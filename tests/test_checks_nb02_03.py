"""The checks of notebooks 02 (masking) and 03 (minibatching): typical wrong implementations fail
naming the case and the mistake (that every check passes on the solutions, test_checks.py
tests)."""

import math

import numpy as np
import pytest

from transformer_lab.checks import CheckFailed, check, load_checks
from transformer_lab.core import attention as CA
from transformer_lab.core import layers as CL

load_checks()


def _fails(check_id, *functions):
    with pytest.raises(CheckFailed) as err:
        check(check_id, *functions)
    return str(err.value)


def _plain_softmax(x):
    z = np.exp(x - x.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


# --------------------------------------------------------------------------------------------
# 02: core exercises


def test_causal_mask_mistakes(monkeypatch):
    monkeypatch.setattr(CA, "causal_mask", lambda T, S=None: np.tril(
        np.ones((T, T if S is None else S), bool)))
    message = _fails("check-causal-mask")
    assert "case 'T = 4 (S defaults to T)'" in message and "convention inverted" in message
    monkeypatch.setattr(CA, "causal_mask", lambda T, S=None: np.triu(
        np.ones((T, T if S is None else S), bool)))
    assert "blocking the diagonal too" in _fails("check-causal-mask")
    monkeypatch.setattr(CA, "causal_mask", lambda T, S=None: np.triu(np.ones((T, T), bool), 1))
    message = _fails("check-causal-mask")
    assert "'T = 3, S = 5" in message and "ignoring S" in message


def _masked_attention(how):
    def attention_forward(q, k, v, mask=None, scale=None):
        s = q @ k.T / math.sqrt(q.shape[-1])
        if mask is not None and mask.dtype == bool:
            s = {"add": lambda: s + mask, "invert": lambda: np.where(~mask, -np.inf, s),
                 "after": lambda: s, "-1e9": lambda: np.where(mask, -1e9, s),
                 }.get(how, lambda: np.where(mask, -np.inf, s))()
        elif mask is not None:
            s = np.where(mask != 0, -np.inf, s) if how == "float as bool" else s + mask
        with np.errstate(invalid="ignore"):
            w = _plain_softmax(s)
        if how == "after" and mask is not None and mask.dtype == bool:
            w = w * ~mask
        return w @ v, (q, k, v, w, 1 / math.sqrt(q.shape[-1]))  # the cache holds the weights
    return attention_forward


@pytest.mark.parametrize("how, hint", [
    ("add", "adding the boolean mask to the scores"),
    ("invert", "reading True as allowed"),
    ("after", "masking the weights after the softmax"),
    ("float as bool", "treating the float mask as a boolean"),
])
def test_attention_mask_mistakes(monkeypatch, how, hint):
    monkeypatch.setattr(CA, "attention_forward", _masked_attention(how))
    message = _fails("check-attention-mask")
    assert "case '" in message and hint in message


def test_attention_mask_passes_before_the_softmax_is_extended(monkeypatch):
    """Section 2's check must not need section 4: a plain softmax (NaN on a row of -inf) and a
    mask applied with np.where pass it."""
    monkeypatch.setattr(CA, "attention_forward", _masked_attention("right"))
    check("check-attention-mask")


def test_softmax_empty_rows_mistakes(monkeypatch):
    def plain(x, out=None):
        with np.errstate(invalid="ignore"):  # in a notebook: a RuntimeWarning and NaN
            y = _plain_softmax(x)
        return y, y
    monkeypatch.setattr(CL, "softmax_forward", plain)
    message = _fails("check-softmax-empty-rows")
    assert "case 'a row of -inf only'" in message and "-inf - (-inf) is NaN" in message

    def large_negative(x, out=None):
        y = _plain_softmax(np.where(np.isneginf(x), -1e9, x))
        return y, y
    monkeypatch.setattr(CL, "softmax_forward", large_negative)
    assert "nothing to attend to uniform weights instead of zeros (as replacing -inf by a large " \
        "negative number such as -1e9 does)" in _fails(
        "check-softmax-empty-rows")


def test_attention_empty_rows_mistakes(monkeypatch):
    monkeypatch.setattr(CA, "attention_forward", _masked_attention("-1e9"))
    message = _fails("check-attention-empty-rows")
    assert "case 'left padding" in message and "-1e9 in place of -inf" in message
    monkeypatch.setattr(CA, "attention_forward", _masked_attention("right"))
    assert "without section 4's guard" in _fails("check-attention-empty-rows")


def test_padding_mask_mistakes(monkeypatch):
    monkeypatch.setattr(CA, "padding_mask",
                        lambda lengths, S: np.arange(S)[None, :] > np.asarray(lengths)[:, None])
    message = _fails("check-padding-mask")
    assert "case 'lengths [6, 3, 2], S = 6'" in message and "with > instead of >=" in message
    monkeypatch.setattr(CA, "padding_mask",
                        lambda lengths, S: np.arange(S)[None, :] < np.asarray(lengths)[:, None])
    assert "convention inverted" in _fails("check-padding-mask")


# --------------------------------------------------------------------------------------------
# 02: variants, on wrong answers


def test_mask_variant_mistakes():
    def one_too_many(T, window):
        i, j = np.arange(T)[:, None], np.arange(T)[None, :]
        return (j > i) | (j < i - window)
    assert "seeing window + 1 positions" in _fails("check-sliding-window", one_too_many)
    assert "without the causal part" in _fails(
        "check-sliding-window", lambda T, w: np.tril(np.ones((T, T), bool), -w))
    assert "the plain causal mask" in _fails(
        "check-prefix-lm", lambda T, P: np.triu(np.ones((T, T), bool), 1))

    def keys_only(ql, kl, T, S):
        return np.broadcast_to((np.arange(S)[None, :] >= np.asarray(kl)[:, None])[:, None, :],
                               (len(kl), T, S))
    message = _fails("check-cross-mask", keys_only)
    assert "blocking the padded keys only" in message

    def swapped(ql, kl, T, S):  # valid queries counted by the key lengths, and the other way
        q_valid = np.arange(T)[None, :] < np.asarray(kl)[:, None]
        return ~(q_valid[:, :, None] & (np.arange(S)[None, :] < np.asarray(ql)[:, None])[:, None])
    assert "the query and key lengths swapped" in _fails("check-cross-mask", swapped)


# --------------------------------------------------------------------------------------------
# 03: core exercises


def test_linear_forward_without_restoring_the_leading_axes(monkeypatch):
    def flat(x, W, b=None):
        out = x.reshape(-1, x.shape[-1]) @ W + (0 if b is None else b)
        return out, (x, W, b)
    monkeypatch.setattr(CL, "linear_forward", flat)
    message = _fails("check-linear-forward-batched")
    assert "case 'a batch (B, T, D_in)" in message and "without restoring the leading" in message


def test_linear_backward_mistakes(monkeypatch):
    def per_sequence(dout, cache):
        x, W, b = cache
        grads = {"W": np.swapaxes(x, -1, -2) @ dout}
        if b is not None:
            grads["b"] = dout.reshape(-1, dout.shape[-1]).sum(axis=0)
        return dout @ W.T, grads
    monkeypatch.setattr(CL, "linear_backward", per_sequence)
    assert "not summing it over the leading axes" in _fails("check-linear-backward-batched")

    def first_axis(dout, cache):
        x, W, b = cache
        return dout @ W.T, {"W": x.reshape(-1, x.shape[-1]).T @ dout.reshape(-1, dout.shape[-1]),
                            "b": dout.sum(axis=0)}
    monkeypatch.setattr(CL, "linear_backward", first_axis)
    assert "summing db over the first axis only" in _fails("check-linear-backward-batched")


def test_attention_fixed_axis_bugs(monkeypatch):
    def k_transposed(q, k, v, mask=None, scale=None):
        return _plain_softmax(q @ k.T / math.sqrt(q.shape[-1])) @ v, None
    monkeypatch.setattr(CA, "attention_forward", k_transposed)
    message = _fails("check-attention-batched")
    assert "your code raised ValueError" in message and "k.T" in message

    def axis_one(q, k, v, mask=None, scale=None):
        s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[1])
        if mask is not None:
            s = np.where(mask, -np.inf, s)
        w = _plain_softmax(s)
        return w @ v, (q, k, v, w, 1 / np.sqrt(np.float64(q.shape[-1])))
    monkeypatch.setattr(CA, "attention_forward", axis_one)
    assert "1/sqrt(q.shape[1])" in _fails("check-attention-batched")


def test_attention_batched_float32_promotion(monkeypatch):
    def promotes(q, k, v, mask=None, scale=None):
        s = q @ np.swapaxes(k, -1, -2) / np.sqrt(np.float64(q.shape[-1]))
        if mask is not None:
            s = np.where(mask, -np.inf, s)
        w = _plain_softmax(s)
        return w @ v, (q, k, v, w, 1 / np.sqrt(np.float64(q.shape[-1])))
    monkeypatch.setattr(CA, "attention_forward", promotes)
    message = _fails("check-attention-batched")
    assert "case 'float32 batch with a padding mask'" in message
    assert "expected a float32 array, got float64" in message


# --------------------------------------------------------------------------------------------
# 03: variants, on wrong answers


def test_minibatching_variant_mistakes():
    def no_keepdims(x, gamma, eps=1e-6):
        return x / np.sqrt(np.mean(x * x, axis=-1) + eps) * gamma
    message = _fails("check-rms-norm", no_keepdims)
    assert "without keepdims=True" in message or "your code raised ValueError" in message
    assert "one past" not in message

    def off_by_one(H, lengths):
        return H[np.arange(len(H)), np.minimum(lengths, H.shape[1] - 1)]
    assert "instead of lengths[b] - 1" in _fails("check-last-token", off_by_one)
    assert "averaging over all T positions" in _fails(
        "check-masked-mean", lambda H, lengths: H.mean(axis=1))
