"""Checks of notebook 02_masking: the causal and padding masks, masked attention, the softmax of a
row with nothing to attend to, and the notebook's mask variants.

Masks follow the course's convention: a boolean mask is True where attention is **blocked**.
PyTorch's ``F.scaled_dot_product_attention`` reads a boolean mask the other way round
(True = allowed), so the references below pass it ``~mask``.
"""

from __future__ import annotations

import math

import numpy as np

from transformer_lab.checks._torch_helpers import torch
from transformer_lab.checks.framework import Case, Check, later_rng, normals
from transformer_lab.checks.nb01_attention import (  # _softmax: a row of only -inf gives NaN
    _cached,
    _softmax,
)


def _scores(q, k):
    return q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])


def _qkv(rng, t, s, d_k, d_v, dtype=np.float64, lead=()):
    """q (*lead, t, d_k), k (*lead, s, d_k), v (*lead, s, d_v), drawn in that order."""
    return normals(rng, (*lead, t, d_k), (*lead, s, d_k), (*lead, s, d_v), dtype=dtype)


def _some_blocked(rng, t, s):
    """A random (t, s) mask, True = blocked, with at least one allowed key in every row."""
    mask = rng.random((t, s)) < 0.4
    mask[np.arange(t), rng.integers(s, size=t)] = False
    return mask


# --------------------------------------------------------------------------------------------
# Core exercises


#: How the masks are made without a loop (the notebook's text asks for none).
POSITIONS = "compare a column of query positions with a row of key positions (broadcasting)"


class CausalMask(Check, id="check-causal-mask", functions=("causal_mask",)):
    loop_free = {"causal_mask": POSITIONS}

    def cases(self, rng):
        yield Case("T = 4 (S defaults to T)", (4,))
        yield Case("T = 1", (1,))
        yield Case("T = 3, S = 5 (more keys than queries)", (3, 5))
        yield Case("T = 5, S = 2 (fewer keys than queries)", (5, 2))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("T = 7", (7,))
        yield Case("T = 2, S = 6", (2, 6))
        yield Case("T = 6, S = 1", (6, 1))
    ### END HIDDEN TESTS

    def run(self, f, T, S=None):
        return f.causal_mask(T) if S is None else f.causal_mask(T, S)

    def expected(self, T, S=None):
        # PyTorch's causal convention (F.scaled_dot_product_attention(is_causal=True)):
        # the allowed pairs are the lower triangle, aligned at the top left when S != T
        allowed = torch.ones(T, T if S is None else S, dtype=torch.bool).tril()
        return (~allowed).numpy()

    def mistakes(self, T, S=None):
        want = self.expected(T, S)
        diagonal = np.eye(*want.shape, dtype=bool)
        return {"with True = allowed (the convention inverted: True must mean blocked)":
                lambda: ~want,
                "blocking the diagonal too (block j > i: a query may attend to itself)":
                lambda: want | diagonal,
                "blocking the past instead of the future (the transposed triangle)":
                lambda: ~(want | diagonal),
                "ignoring S (the mask is (T, S), one column per key)":
                lambda: self.expected(T),
                "with the triangle aligned at the bottom right (j > i + S - T): the course, "
                "as PyTorch's is_causal, aligns it at the top left, query i seeing keys 0 .. i":
                lambda: np.arange(want.shape[1])[None, :] > np.arange(T)[:, None]
                + want.shape[1] - T}


WEIGHTS = "weights (the softmax's cache)"


def _answer(weights, v) -> dict:
    """What the masked-attention checks compare: the output ``weights @ v``, and the weights,
    which the cache holds for the backward pass."""
    return {"output": weights @ v, WEIGHTS: weights}


class _MaskedAttention(Check):
    """attention_forward with a mask -- its output, and the weights its cache holds for the
    backward pass -- against PyTorch's scaled dot-product attention given the same mask (bool
    True = blocked, or float added; a query whose keys are all blocked gets a zero output and
    zero weights, as in the course)."""

    functions = ("attention_forward",)
    axes = {"output": "bhtd", WEIGHTS: "bhts"}  # axis names, for messages

    def run(self, f, q, k, v, mask=None):
        out, cache = f.attention_forward(q, k, v, mask)
        return {"output": out, WEIGHTS: _cached(cache, "weights")}

    def expected(self, q, k, v, mask=None):
        t = [torch.from_numpy(a) for a in (q, k, v)]
        scores = t[0] @ t[1].transpose(-1, -2) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(torch.from_numpy(mask), -math.inf) \
                if mask.dtype == bool else scores + torch.from_numpy(mask)
            mask = torch.from_numpy(~mask if mask.dtype == bool else mask)
        return {"output": torch.nn.functional.scaled_dot_product_attention(
                    *t, attn_mask=mask).numpy(),
                WEIGHTS: torch.softmax(scores, -1).nan_to_num(nan=0.0).numpy()}

    def mistakes(self, q, k, v, mask=None):
        if mask is None:
            return {}
        right = self.expected(q, k, v, mask)
        return {"with the weights before the mask in the cache (the softmax of the unmasked "
                "scores): the backward pass reads the cache, so it must hold the weights that "
                "made the output": lambda: {**right, WEIGHTS: _softmax(_scores(q, k))}}


class AttentionMask(_MaskedAttention, id="check-attention-mask"):
    def cases(self, rng):
        q, k, v = _qkv(rng, 4, 4, 3, 3)
        yield Case("causal bool mask, T = S = 4", (q, k, v, np.triu(np.ones((4, 4), bool), 1)))
        yield Case("bool mask (T, S) with T = 3, S = 5",
                   (*_qkv(rng, 3, 5, 4, 2), _some_blocked(rng, 3, 5)))
        yield Case("a (1, S) key mask broadcast over the queries",
                   (*_qkv(rng, 4, 6, 3, 2), np.array([[False, True, False, False, True, True]])))
        penalty = -0.5 * np.abs(np.arange(4)[:, None] - np.arange(5)[None, :])  # (T, S)
        penalty[_some_blocked(rng, 4, 5)] = -np.inf
        yield Case("float mask (-inf and finite penalties), added to the scores",
                   (*_qkv(rng, 4, 5, 3, 2), penalty))
        yield Case("float32 with a bool mask",
                   (*_qkv(rng, 5, 4, 8, 3, np.float32), _some_blocked(rng, 5, 4)))
        later = later_rng(rng)  # the case below was added later: the ones above stay as drawn
        penalty = later.uniform(-2, 0, (3, 4)).astype(np.float32)
        penalty[_some_blocked(later, 3, 4)] = -np.inf
        yield Case("float32 with a float32 float mask (the result stays float32)",
                   (*_qkv(later, 3, 4, 2, 5, np.float32), penalty))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        penalty = rng.uniform(-2, 0, (3, 4)).astype(np.float32)
        penalty[_some_blocked(rng, 3, 4)] = -np.inf
        yield Case("float32 with a float mask", (*_qkv(rng, 3, 4, 2, 5, np.float32), penalty))
        yield Case("one query, two keys, one blocked",
                   (*_qkv(rng, 1, 2, 3, 2), np.array([[True, False]])))
        one_key = np.ones((4, 6), bool)
        one_key[np.arange(4), rng.integers(6, size=4)] = False
        yield Case("every query allowed exactly one key", (*_qkv(rng, 4, 6, 2, 3), one_key))
        yield Case("an all-False mask (nothing blocked)",
                   (*_qkv(rng, 3, 3, 4, 4), np.zeros((3, 3), bool)))
    ### END HIDDEN TESTS

    def mistakes(self, q, k, v, mask):
        s = _scores(q, k)
        found = super().mistakes(q, k, v, mask)
        if mask.dtype != bool:
            return {**found, "treating the float mask as a boolean (a float mask is added to "
                    "the scores)": lambda: _answer(_softmax(np.where(mask != 0, -np.inf, s)), v),
                    "ignoring the mask": lambda: _answer(_softmax(s), v),
                    "adding the float mask before the scale, (q k^T + mask) / sqrt(d_k): the "
                    "mask is added to the scaled scores, as given":
                    lambda: _answer(_softmax(s + mask / math.sqrt(q.shape[-1])), v)}
        return {**found, "adding the boolean mask to the scores (True counts as 1 and blocks "
                "nothing: set the blocked scores to -inf)": lambda: _answer(_softmax(s + mask), v),
                "reading True as allowed (the mask convention inverted: True = blocked)":
                lambda: _answer(np.nan_to_num(_softmax(np.where(~mask, -np.inf, s))), v),
                "reading True as allowed (the mask convention inverted: True = blocked); the "
                "rows it blocks entirely give NaN":
                lambda: _answer(_softmax(np.where(~mask, -np.inf, s)), v),
                "masking the weights after the softmax (block the scores before it, so that "
                "the allowed weights still sum to one)": lambda: _answer(_softmax(s) * ~mask, v),
                "ignoring the mask": lambda: _answer(_softmax(s), v)}


class SoftmaxEmptyRows(Check, id="check-softmax-empty-rows", functions=("softmax_forward",)):
    def cases(self, rng):
        yield Case("a row of -inf only", (np.full((1, 5), -np.inf),))
        x = rng.standard_normal((4, 6))
        x[0, [1, 4]] = x[[1, 3]] = -np.inf
        yield Case("rows of -inf among ordinary rows", (x,))
        x = rng.standard_normal((3, 4)).astype(np.float32)
        x[2] = x[0, 0] = -np.inf
        yield Case("float32, one row of -inf", (x,))
        x = rng.standard_normal((2, 3, 4))
        x[0, 1] = x[1, 2] = -np.inf
        yield Case("three axes, a row of -inf in each block", (x,))
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        x = np.stack([later.standard_normal(4) + 1e4, np.full(4, -np.inf),
                      later.standard_normal(4) - 1e4])
        x[2, 1] = -np.inf
        yield Case("a row of -inf between rows near +1e4 and near -1e4", (x,))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("every row -inf", (np.full((3, 2), -np.inf),))
        yield Case("one entry per row, one of them -inf", (np.array([[0.3], [-np.inf], [2.0]]),))
        x = np.stack([rng.standard_normal(5) + 1e4, np.full(5, -np.inf)])
        yield Case("scores near 1e4 beside a row of -inf", (x,))
    ### END HIDDEN TESTS

    def run(self, f, x):
        return f.softmax_forward(x)[0]

    def expected(self, x):
        # torch's softmax gives NaN exactly on the rows of only -inf; the course gives zeros
        return torch.softmax(torch.from_numpy(x), dim=-1).nan_to_num(nan=0.0).numpy()

    def mistakes(self, x):
        # a missing guard of either kind gives the same NaN row: name both, blame neither
        return {"with a guard missing for a row of -inf only. It needs two: its maximum is -inf, "
                "and -inf - (-inf) is NaN (subtract 0 there instead); and its exponentials are "
                "all 0, and 0 / 0 is NaN (divide by 1 where the sum is 0). Check that your "
                "softmax_forward has both":
                lambda: _softmax(x),
                "giving a row with nothing to attend to uniform weights instead of zeros (as "
                "replacing -inf by a large negative number such as -1e9 does)":
                lambda: _softmax(np.where(np.isneginf(x), -1e9, x))}


class AttentionEmptyRows(_MaskedAttention, id="check-attention-empty-rows"):
    def cases(self, rng):
        left_padded = np.triu(np.ones((6, 6), bool), 1)
        left_padded[:, :2] = True  # keys 0, 1 are padding: queries 0 and 1 see nothing
        yield Case("left padding with the causal mask (rows 0 and 1 fully blocked)",
                   (*_qkv(rng, 6, 6, 4, 3), left_padded))
        mask = _some_blocked(rng, 3, 5)
        mask[1] = True
        yield Case("one fully blocked row, T = 3, S = 5", (*_qkv(rng, 3, 5, 2, 4), mask))
        penalty = np.zeros((4, 4))
        penalty[2] = penalty[0, 3] = -np.inf
        yield Case("float mask with a row of -inf", (*_qkv(rng, 4, 4, 3, 2), penalty))
        mask = _some_blocked(rng, 4, 3)
        mask[0] = True
        yield Case("float32, one fully blocked row", (*_qkv(rng, 4, 3, 5, 2, np.float32), mask))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("every row fully blocked", (*_qkv(rng, 3, 4, 2, 2), np.ones((3, 4), bool)))
        yield Case("one query, no key allowed", (*_qkv(rng, 1, 3, 2, 5), np.ones((1, 3), bool)))
    ### END HIDDEN TESTS

    def mistakes(self, q, k, v, mask):
        s = _scores(q, k)
        blocked = mask if mask.dtype == bool else np.isneginf(mask)
        found = {**super().mistakes(q, k, v, mask),
                 "with NaN where a fully blocked row's zeros belong: 0 / 0, a division by the "
                 "row's sum of zero weights -- in a softmax without section 4's guards, or in "
                 "a renormalisation after it. Call softmax_forward, which must pass "
                 "check-softmax-empty-rows (fix it there when it does not), and keep its "
                 "weights as they come":
                 lambda: _answer(_softmax(np.where(blocked, -np.inf, s)), v)}
        if mask.dtype == bool:
            found["letting a fully blocked query attend uniformly to its blocked keys, as "
                  "replacing its scores by a large negative number such as -1e9 in place of -inf "
                  "does"] = lambda: _answer(_softmax(np.where(mask, -1e9, s)), v)
            found["letting a fully blocked query attend to its blocked keys as if unmasked "
                  "(uniformly in float32), as adding a large negative number such as -1e9 in "
                  "place of -inf does"] = lambda: _answer(_softmax(s - 1e9 * mask), v)
        return found


class PaddingMask(Check, id="check-padding-mask", functions=("padding_mask",)):
    loop_free = {"padding_mask": "compare a row of key positions with a column of lengths "
                                 "(broadcasting)"}

    def cases(self, rng):
        yield Case("lengths [6, 3, 2], S = 6", (np.array([6, 3, 2]), 6))
        yield Case("S longer than every sequence", (np.array([2, 4]), 7))
        yield Case("a length of 0 (only padding)", (np.array([3, 0, 1]), 4))
        yield Case("one sequence, no padding", (np.array([5]), 5))
        yield Case("lengths given as a list", ([2, 5, 0, 1], 5))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("int32 lengths", (np.array([1, 2, 3], dtype=np.int32), 3))
        yield Case("S = 1", (np.array([1, 0, 1]), 1))
        yield Case("a list of one length 0", ([0], 2))
    ### END HIDDEN TESTS

    def expected(self, lengths, S):
        from torch.nn.utils.rnn import pad_sequence

        # PyTorch pads a list of sequences to a batch; True marks the real tokens
        real = pad_sequence([torch.ones(int(n), dtype=torch.bool) for n in lengths],
                            batch_first=True)
        full = torch.zeros(len(lengths), S, dtype=torch.bool)
        full[:, :real.shape[1]] = real
        return (~full).numpy()

    def mistakes(self, lengths, S):
        want = self.expected(lengths, S)
        first_pad = np.arange(S)[None, :] > np.asarray(lengths)[:, None]
        return {"with > instead of >= (position lengths[b] is already padding: positions "
                "count from 0)": lambda: first_pad,
                "with True = a real token (the convention inverted: True must mean padding)":
                lambda: ~want,
                "as an (S, B) array (one row per sequence: (B, S))": lambda: want.T}


# --------------------------------------------------------------------------------------------
# Variant exercises: each mask's reference is hidden (it would show the answer)


#: What the mask exercises do instead of a Python loop (their text asks for none).
class SlidingWindow(Check, id="check-sliding-window", arguments=("sliding_window_mask",)):
    loop_free = {"sliding_window_mask": POSITIONS}

    def cases(self, rng):
        yield Case("window 1: each query sees only itself", (5, 1))
        yield Case("T = 6, window 3", (6, 3))
        yield Case("window = T: the causal mask", (5, 5))
        yield Case("window larger than T", (4, 10))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("T = 1, window 1", (1, 1))
        yield Case("T = 7, window 2", (7, 2))
        yield Case("T = 8, window 7", (8, 7))

    def expected(self, T, window):
        ones = torch.ones(T, T, dtype=torch.bool)
        allowed = ones.tril() & ~ones.tril(-window)  # i - window < j <= i
        return (~allowed).numpy()

    def mistakes(self, T, window):
        return {"seeing window + 1 positions (j >= i - window allowed: itself and window - 1 "
                "before it)": lambda: self.expected(T, window + 1),
                "without the causal part (the future must stay blocked)":  # blocks j <= i - window
                lambda: torch.ones(T, T, dtype=torch.bool).tril(-window).numpy(),
                "with True = allowed (True must mean blocked)":
                lambda: ~self.expected(T, window),
                "seeing window - 1 positions (a window holds the query and the window - 1 "
                "before it: i - window < j <= i)": lambda: self.expected(T, window - 1)}
    ### END HIDDEN TESTS


class PrefixLM(Check, id="check-prefix-lm", arguments=("prefix_lm_mask",)):
    loop_free = {"prefix_lm_mask": POSITIONS}

    def cases(self, rng):
        yield Case("no prefix (P = 0): the causal mask", (5, 0))
        yield Case("T = 5, prefix of 2", (5, 2))
        yield Case("a prefix of 1: still the causal mask", (5, 1))
        yield Case("the whole sequence is the prefix: nothing blocked", (6, 6))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("T = 1, P = 0", (1, 0))
        yield Case("T = 1, P = 1", (1, 1))
        yield Case("T = 7, prefix of 3", (7, 3))

    def expected(self, T, prefix_len):
        allowed = torch.ones(T, T, dtype=torch.bool).tril()
        allowed[:, :prefix_len] = True
        return (~allowed).numpy()

    def mistakes(self, T, prefix_len):
        rows_open = self.expected(T, 0)  # the causal mask
        rows_open[:prefix_len] = False
        return {"using the plain causal mask (the prefix keys are visible to every query)":
                lambda: self.expected(T, 0),
                "making the prefix one position too long (j <= P instead of j < P)":
                lambda: self.expected(T, min(prefix_len + 1, T)),
                "opening the prefix queries' rows to the whole sequence (they must not see past "
                "the prefix)": lambda: rows_open,
                "with True = allowed (True must mean blocked)":
                lambda: ~self.expected(T, prefix_len),
                "with | where & belongs (blocked: a future key and past the prefix)":
                lambda: self.expected(T, 0) | (np.arange(T)[None, :] >= prefix_len)}
    ### END HIDDEN TESTS


class CrossMask(Check, id="check-cross-mask", arguments=("cross_attention_mask",)):
    loop_free = {"cross_attention_mask": "compare the positions with the lengths by broadcasting"}

    def cases(self, rng):
        yield Case("B = 3, T = 4, S = 5, different lengths",
                   (np.array([3, 1, 4]), np.array([5, 2, 1]), 4, 5))
        yield Case("no padding at all", (np.array([3, 3]), np.array([2, 2]), 3, 2))
        yield Case("more queries than keys (T = 6, S = 3)",
                   (np.array([6, 2]), np.array([1, 3]), 6, 3))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("one sequence, one query, one key", (np.array([1]), np.array([1]), 1, 1))
        yield Case("a sequence with no valid query",
                   (np.array([0, 2, 3]), np.array([4, 4, 1]), 3, 4))

    def expected(self, query_lengths, key_lengths, T, S):
        q_valid = torch.arange(T)[None, :] < torch.as_tensor(query_lengths)[:, None]  # (B, T)
        k_valid = torch.arange(S)[None, :] < torch.as_tensor(key_lengths)[:, None]  # (B, S)
        return (~(q_valid[:, :, None] & k_valid[:, None, :])).numpy()

    def mistakes(self, query_lengths, key_lengths, T, S):
        q_pad = (torch.arange(T)[None, :] >= torch.as_tensor(query_lengths)[:, None]).numpy()
        k_pad = (torch.arange(S)[None, :] >= torch.as_tensor(key_lengths)[:, None]).numpy()
        return {"blocking the padded keys only (the padded queries' rows must be blocked too)":
                 lambda: k_pad[:, None, :].repeat(T, axis=1),
                 "blocking the padded queries only (the padded keys must be blocked too)":
                 lambda: q_pad[:, :, None].repeat(S, axis=2),
                 "with True = allowed (True must mean blocked)":
                 lambda: ~self.expected(query_lengths, key_lengths, T, S),
                 "with the query and key lengths swapped":
                 lambda: self.expected(key_lengths, query_lengths, T, S),
                 "with the key lengths used for the queries too":
                 lambda: self.expected(key_lengths, key_lengths, T, S),
                 "with & where | belongs (a pair is blocked when its query or its key is "
                 "padding)": lambda: q_pad[:, :, None] & k_pad[:, None, :],
                 "with > where >= belongs: position `length` is the first padding (positions "
                 "count from 0)": lambda: (
                     (np.arange(T)[None, :] > np.asarray(query_lengths)[:, None])[:, :, None]
                     | (np.arange(S)[None, :] > np.asarray(key_lengths)[:, None])[:, None, :])}
    ### END HIDDEN TESTS
