"""Checks of notebook 14_decoding: sampling and the KV cache.

Expected answers come from PyTorch (functional ops and autograd) and, for the cached step of the
model, from :mod:`transformer_lab.reference.torch_gpt` -- the same model written again in PyTorch;
none of them calls the core.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from transformer_lab.checks._torch_helpers import _np, _t, torch
from transformer_lab.checks.framework import Case, Check, later_rng
from transformer_lab.checks.nb01_attention import _overflowing
from transformer_lab.checks.nb12_translation import SHARED_CACHE, WRITTEN
from transformer_lab.checks.nb13_gpt import _config, _model_case, _pe, _rope

# --------------------------------------------------------------------------------------------
# §1 Sampling


#: a filter's output that says whether every logit it cut became -inf
CUT = "the cut logits are -inf (a finite one, 0 or -1e9, keeps a probability; NaN spoils them all)"


def _kept(kept, logits, cut=True) -> dict:
    """Which logits a filter keeps, their values (0 where cut), and whether it made every cut
    one -inf."""
    return {"kept": kept, "values": np.where(kept, logits, 0), CUT: cut}


class _FilterCheck(Check):
    """A filter of logits, ``filter(logits, parameter)``: compares which logits it keeps (those
    it left as they were), their values, and that the others became -inf."""

    def run(self, f, logits, parameter):
        filtered = super().run(f, logits, parameter)
        if np.shape(filtered) != np.shape(logits):
            return filtered  # the comparison says what came back
        kept = np.asarray(filtered == logits)
        if not kept.any() and np.all((filtered >= 0) & (filtered <= 1)):  # probabilities?
            return {**_kept(kept, filtered, False),
                    "kept": "no logit left as it was, and every value in [0, 1]: probabilities? "
                            "A filter returns logits, the kept ones as given, the others -inf"}
        return _kept(kept, filtered, bool(np.all(np.isneginf(filtered[~kept]))))


class TopKFilter(_FilterCheck, id="check-top-k-filter", functions=("top_k_filter",)):
    def cases(self, rng):
        x = rng.standard_normal((3, 10))
        yield Case("k = 3", (x, 3))
        yield Case("k = 1 (greedy)", (x, 1))
        yield Case("k = V (keep everything)", (x, 10))
        yield Case("float32, three axes", (rng.standard_normal((2, 2, 6)).astype(np.float32), 2))
        ties = np.array([[1.0, 2.0, 2.0, 0.0], [3.0, 2.0, 0.5, 2.0]])
        yield Case("ties with the k-th largest are kept: k = 1 (row 0 keeps both 2s)", (ties, 1))
        yield Case("ties, k = 2 (row 1 keeps the 3 and both 2s)", (ties, 2))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("one row, k = V - 1", (rng.standard_normal((1, 5)) * 10, 4))
    ### END HIDDEN TESTS

    def expected(self, logits, k):
        kth = torch.topk(_t(logits), k, dim=-1).values[..., -1:]
        return _kept((_t(logits) >= kth).numpy(), logits)

    def mistakes(self, logits, k):
        kth = np.sort(logits, axis=-1)[..., -k:-k + 1 or None]  # the k-th largest
        found = {}
        if k < logits.shape[-1]:
            index_k = np.sort(logits, axis=-1)[..., k:k + 1]  # the (k + 1)-th smallest
            found["with np.sort(logits)[..., k], the (k + 1)-th smallest: a sort is ascending, "
                  "so the k-th largest is at index -k"] = lambda: _kept(logits >= index_k, logits)
        return {**found, "keeping the k smallest logits instead of the k largest":
                lambda: _kept(self.expected(-logits, k)["kept"], logits),
                "with > where >= belongs: the k-th largest itself cut (k - 1 kept)":
                lambda: _kept(logits > kth, logits),
                "keeping exactly k (an argsort's last k): the logits tied with the k-th largest "
                "are kept too": lambda: _kept(_argsort_top(logits, k), logits)}


def _argsort_top(logits, k):
    """Exactly k kept: the last k of a stable ascending argsort (ties: the later ones)."""
    kept = np.zeros(logits.shape, bool)
    np.put_along_axis(kept, np.argsort(logits, axis=-1, kind="stable")[..., -k:], True, -1)
    return kept


def _top_p_reference(logits, p):
    x = _t(logits).to(torch.float64)
    probs = torch.softmax(x, dim=-1)
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    keep_sorted = (torch.cumsum(sorted_p, dim=-1) - sorted_p) < p
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted).numpy()


class TopPFilter(_FilterCheck, id="check-top-p-filter", functions=("top_p_filter",)):
    def cases(self, rng):
        x = rng.standard_normal((4, 8)) * 2
        yield Case("p = 0.9", (x, 0.9))
        yield Case("p = 0.5", (x, 0.5))
        yield Case("p = 1 (keep everything)", (x, 1.0))
        yield Case("p = 0.01 (the most likely token only)", (x, 0.01))
        yield Case("float32 logits near 100, p = 0.9 (exp overflows without the max)", (
            np.array([[100.0, 99.0, 95.0, 0.0], [0.0, -1.0, 2.0, 90.0]], np.float32), 0.9))
        yield Case("tied tokens at the cut, p = 0.6: of tokens 1 and 2 (equally likely), the "
                   "lower id ranks first, so only it is kept", (np.array([[2.0, 1.0, 1.0, 0.0]]),
                                                               0.6))
        yield Case("probabilities 1/2, 1/4, 1/4 and p = 0.5: the first token alone reaches p, "
                   "so it alone is kept", (np.array([[0.0, -np.log(2), -np.log(2)]]), 0.5))
        later = later_rng(rng)  # the case below was added later: the ones above stay as drawn
        yield Case("2 rows of 64 tokens in four tied groups, p = 0.6: of the tied ones at the "
                   "cut, the lower ids are kept (a sort that is not stable may take others)",
                   (later.integers(-1, 3, (2, 64)).astype(np.float64), 0.6))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("float32 with three axes, p = 0.7", (
            rng.standard_normal((2, 3, 7)).astype(np.float32) * 3, 0.7))
        yield Case("a peaked row", (np.array([[8.0, 1.0, 0.5, 0.0, -1.0]]), 0.95))
        yield Case("24 tokens in four tied groups, p = 0.6: of the tied ones at the cut, the "
                   "lower ids are kept", (np.array([[
                       0.0, 1, 2, 2, -1, -1, 0, 0, 1, -1, -1, 2, -1, 2, 0, 1, -1, 1, 1, 1, 2, 1,
                       0, 0]]), 0.6))
    ### END HIDDEN TESTS

    def expected(self, logits, p):
        return _kept(_top_p_reference(logits, p), logits)

    def mistakes(self, logits, p):
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        order = np.argsort(-probs, axis=-1, kind="stable")

        def kept(ranking, reach=True):
            """Top-p's decisions, the tokens summed in the order ``ranking`` (token ids, most
            probable first), each put back at its id; without ``reach`` the kept mass stays
            below p (one token short)."""
            ranked_p = np.take_along_axis(probs, ranking, -1)
            keep = np.zeros(logits.shape, bool)
            np.put_along_axis(keep, ranking,
                              np.cumsum(ranked_p, -1) - (ranked_p if reach else 0) < p, axis=-1)
            return keep

        ranked = np.take_along_axis(kept(order), order, -1)  # the decisions in rank order
        overflowed = _top_p_reference(logits, p) & ~np.isnan(_overflowing(logits)).any(
            -1, keepdims=True)  # NaN probabilities: no token kept in their row
        return {"keeping the tokens whose cumulative mass is below p (one token too few: the "
                "kept set must reach p)": lambda: _kept(kept(order, reach=False), logits),
                "with a softmax that does not subtract the row's maximum: exp overflows to inf, "
                "and inf / inf is NaN": lambda: _kept(overflowed, logits),
                "leaving the decision in rank order: put it back at each token's own id "
                "(np.put_along_axis with the sort's order)": lambda: _kept(ranked, logits),
                "taking the decisions back with take_along_axis(kept_sorted, order): order maps "
                "a rank to its token, so reading it as the way back shuffles them again; put "
                "them back with np.put_along_axis(..., order, ...) or read at the inverse, "
                "np.argsort(order)": lambda: _kept(np.take_along_axis(ranked, order, -1), logits),
                "ranking tied tokens highest id first (argsort(probs)[..., ::-1] reverses ties; "
                "argsort(-probs, kind=\"stable\") keeps the lower id first)":
                lambda: _kept(kept(np.argsort(probs, axis=-1, kind="stable")[..., ::-1]), logits),
                "with a sort that is not stable (np.argsort's default orders tied tokens as it "
                "likes; kind=\"stable\" keeps the lower id first)":
                lambda: _kept(kept(np.argsort(-probs, axis=-1)), logits),  # ties in any order
                "with the mass summed in the vocabulary's order: sort the tokens by probability "
                "first (most probable first), then sum": lambda: _kept(
                    kept(np.broadcast_to(np.arange(probs.shape[-1]), probs.shape)), logits)}


#: check-sample-next's output that says whether the caller's logits are as they were
UNCHANGED = "the logits given left as they were (not divided in place: logits /= t)"
#: check-sample-next's output that says what came back for 40,000 rows
SHAPE = "the tokens' shape (one per row) and kind"


def _kind_of(tokens) -> str:
    return "integers" if np.issubdtype(tokens.dtype, np.integer) else f"{tokens.dtype} numbers"


class SampleNext(Check, id="check-sample-next", functions=("sample_next",)):
    DRAWS = 40000

    def cases(self, rng):
        row = rng.standard_normal(8) * 1.5
        yield Case("temperature 0: greedy", (rng.standard_normal((4, 8)),),
                   {"temperature": 0.0})
        yield Case("temperature 1", (row,), {"temperature": 1.0})
        yield Case("temperature 0.5, top-k 4", (row,), {"temperature": 0.5, "top_k": 4})
        yield Case("temperature 2, top-p 0.8", (row,), {"temperature": 2.0, "top_p": 0.8})
        yield Case("temperature 2, top-k 3 (the cut tokens hold much of the mass)", (row,),
                   {"temperature": 2.0, "top_k": 3})
        yield Case("temperature 2, top-k 4, then top-p 0.5 of what top-k kept", (row,),
                   {"temperature": 2.0, "top_k": 4, "top_p": 0.5})
        later = later_rng(rng)  # the case below was added later: the ones above stay as drawn
        yield Case("the draws themselves, 64 rows: one rng.random((B, 1)), inverted through each "
                   "row's cumulative distribution", (later.standard_normal((64, 6)) * 1.5,),
                   {"temperature": 1.5, "top_k": 5, "exact": True})

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        row = rng.standard_normal(6) * 2
        yield Case("top-k 3 and top-p 0.6", (row,), {"temperature": 1.0, "top_k": 3,
                                                     "top_p": 0.6})
        yield Case("greedy, float32", (rng.standard_normal((3, 5)).astype(np.float32),),
                   {"temperature": 0.0})
    ### END HIDDEN TESTS

    def tolerance(self, name, expected):
        return 0.03 if "frequencies" in name else super().tolerance(name, expected)

    def run(self, f, logits, temperature=1.0, top_k=None, top_p=None, exact=False):
        kw = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
        if temperature == 0:
            return np.asarray(f.sample_next(logits, np.random.default_rng(0), **kw),
                              dtype=np.int64)
        if exact:
            tokens = np.asarray(f.sample_next(logits, np.random.default_rng(3), **kw))
            return {"tokens": tokens}
        given = np.broadcast_to(logits, (self.DRAWS, logits.size))
        rows = given.copy()
        first = np.asarray(f.sample_next(rows, np.random.default_rng(1), **kw))
        kept = bool(np.array_equal(rows, given))
        again = np.asarray(f.sample_next(given.copy(), np.random.default_rng(1), **kw))
        shape = f"{first.shape}, {_kind_of(first)}"
        if first.shape != (self.DRAWS,) or not np.issubdtype(first.dtype, np.integer):
            first = np.zeros(self.DRAWS, np.int64)  # no frequencies: the shape is the answer
        return {SHAPE: shape,
                "frequencies": np.bincount(first, minlength=logits.size) / self.DRAWS,
                "reproducible with the same seed": bool(np.array_equal(first, again)),
                UNCHANGED: kept}

    def expected(self, logits, temperature=1.0, top_k=None, top_p=None, exact=False,
                 order="top-k first", divide_first=True):
        """The draws' distribution (``order`` and ``divide_first``: the filters' order, and
        whether the temperature comes before them; other settings are mistakes)."""
        if temperature == 0:
            return torch.argmax(_t(logits), dim=-1).numpy().astype(np.int64)
        z = _t(logits).to(torch.float64)
        z = z / temperature if divide_first else z
        for step in (("k", "p") if order == "top-k first" else ("p", "k")):
            if step == "k" and top_k is not None:
                z = torch.where(z < torch.topk(z, top_k).values[..., -1:], -torch.inf, z)
            if step == "p" and top_p is not None:
                z = torch.where(torch.as_tensor(_top_p_reference(z.numpy(), top_p)), z,
                                -torch.inf)
        probs = torch.softmax(z if divide_first else z / temperature, dim=-1).numpy()
        if exact:  # the notebook's draw, row by row: the first token whose cdf exceeds u
            cdf = np.cumsum(probs, axis=-1)
            u = np.random.default_rng(3).random((len(probs), 1)) * cdf[:, -1:]
            return {"tokens": (cdf <= u).sum(axis=-1)}
        return {SHAPE: f"{(self.DRAWS,)}, integers", "frequencies": probs,
                "reproducible with the same seed": True, UNCHANGED: True}

    def mistakes(self, logits, temperature=1.0, top_k=None, top_p=None, exact=False):
        if not exact and temperature != 0:
            args = (logits, temperature, top_k, top_p)
            found = {}
            if top_k is not None and top_p is not None:  # first: it may equal "ignoring top_k"
                found["with top-p before top-k (top-k first, then top-p of what it kept)"] = \
                    functools.partial(self.expected, *args, order="top-p first")
            if temperature != 1:
                found["multiplying the logits by the temperature (divide them: a low "
                      "temperature sharpens)"] = lambda: self.expected(
                    logits, 1 / temperature, top_k, top_p)
                found["with the temperature after the filters (divide first: top-p keeps "
                      "another set of tokens then)"] = functools.partial(
                    self.expected, *args, divide_first=False)
                found["ignoring the temperature"] = lambda: self.expected(logits, 1.0, top_k,
                                                                           top_p)
            if top_k is not None:
                found["ignoring top_k (no top-k filter)"] = lambda: self.expected(
                    logits, temperature, None, top_p)
            if top_p is not None:
                found["ignoring top_p (no top-p filter)"] = lambda: self.expected(
                    logits, temperature, top_k, None)

            def one_draw():  # the first uniform of run's rng, the same for every row
                right = self.expected(*args)
                cdf = np.cumsum(right["frequencies"])
                token = int((cdf <= np.random.default_rng(1).random() * cdf[-1]).sum())
                return {**right, "frequencies": np.eye(logits.size)[token]}
            found["with one uniform for the whole batch: every row draws the same token; draw "
                  "one per row, rng.random((B, 1))"] = one_draw
            return found
        if temperature == 0:
            def divided():
                with np.errstate(divide="ignore", invalid="ignore"):
                    return np.argmax(logits / 0.0, axis=-1).astype(np.int64)
            return {"dividing by the temperature before the greedy branch: logits / 0 are "
                    "+-inf (NaN at 0), and argmax picks the first of them; at temperature 0 "
                    "take the argmax of the logits as they are": divided,
                    "with no greedy branch: at temperature 0, logits / 0 are +-inf, their "
                    "softmax is NaN and every row draws token 0; return the argmax of the "
                    "logits there": lambda: np.zeros(len(logits), np.int64)}
        return {}


class MinPFilter(_FilterCheck, id="check-min-p-filter", arguments=("min_p_filter",)):
    def cases(self, rng):
        x = rng.standard_normal((3, 9)) * 2
        yield Case("p_min = 0.1", (x, 0.1))
        yield Case("p_min = 0.5", (x, 0.5))
        yield Case("p_min = 1 (the most likely token only)", (x, 1.0))
        yield Case("float32, three axes", (rng.standard_normal((2, 2, 5)).astype(np.float32),
                                           0.2))
        yield Case("float32 logits near 100, p_min = 0.1 (exp overflows without the max)", (
            np.array([[100.0, 99.0, 97.0, 0.0], [0.0, -1.0, 2.0, 90.0]], np.float32), 0.1))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("p_min = 0 (keep everything)", (rng.standard_normal((2, 4)), 0.0))
        yield Case("huge logits", (rng.standard_normal((2, 6)) * 500, 0.3))

    def expected(self, logits, p_min):
        probs = torch.softmax(_t(logits).to(torch.float64), dim=-1)
        return _kept((probs >= p_min * probs.max(dim=-1, keepdim=True).values).numpy(), logits)

    def mistakes(self, logits, p_min):
        probs = torch.softmax(_t(logits).to(torch.float64), dim=-1)
        top = probs.max(dim=-1, keepdim=True).values
        return {"with > where >= belongs (at p_min = 1 the most likely token must stay)":
                lambda: _kept((probs > p_min * top).numpy(), logits),
                "with p_min as an absolute threshold (probs >= p_min): it is relative, p_min "
                "times the largest probability": lambda: _kept((probs >= p_min).numpy(), logits),
                "comparing the logits, not the probabilities (logits >= p_min * max logit): "
                "the rule holds for probabilities, or in logs, logits >= max + log(p_min)":
                lambda: _kept(logits >= p_min * logits.max(axis=-1, keepdims=True), logits),
                "with the largest probability of the whole batch, not of each row (max over the "
                "last axis, keepdims=True)":
                lambda: _kept((probs >= p_min * probs.max()).numpy(), logits)}
    ### END HIDDEN TESTS


# --------------------------------------------------------------------------------------------
# §2 The KV cache


class KVCacheAppend(Check, id="check-kv-cache-append", functions=("kv_cache_append",)):
    axes = {"K": "bhsd", "V": "bhsd", "keys": "bhsd", "values": "bhsd"}  # axis names, for messages

    def cases(self, rng):
        yield Case("a prompt of 3, then 1, then 2 positions",
                   ((2, 2, 7, 3), [rng.standard_normal((2, 2, t, 3)) for t in (3, 1, 2)]))
        yield Case("one position at a time, float32",
                   ((1, 1, 4, 2), [rng.standard_normal((1, 1, 1, 2)).astype(np.float32)
                                   for _ in range(4)]))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("the whole cache at once", ((1, 3, 5, 2), [rng.standard_normal((1, 3, 5, 2))]))
    ### END HIDDEN TESTS

    def run(self, f, shape, pieces):
        dt = pieces[0].dtype
        K, V = np.zeros(shape, dt), np.zeros(shape, dt)
        length, lengths = 0, []
        for piece in pieces:
            keys, values, length = f.kv_cache_append(K, V, length, piece, _values(piece))
            lengths.append(length)
        return {"keys": np.array(keys), "values": np.array(values),
                "lengths": np.asarray(lengths, dtype=np.int64), "K": K, "V": V,
                "the returned keys are a view of the cache": bool(np.shares_memory(keys, K))}

    def expected(self, shape, pieces, at_zero=False, late=0, swapped=False):
        """The cache after the pieces (mistakes: ``at_zero``, each written at position 0;
        ``late``, each written that many slots after the first free one; ``swapped``, the keys
        written into V and the values into K)."""
        K, V, length = np.zeros(shape, pieces[0].dtype), np.zeros(shape, pieces[0].dtype), 0
        for p in pieces:
            start = 0 if at_zero else length + late
            K[:, :, start:start + p.shape[2]], V[:, :, start:start + p.shape[2]] = \
                (_values(p), p) if swapped else (p, _values(p))
            length += p.shape[2]
        return {"keys": K[:, :, :length].copy(), "values": V[:, :, :length].copy(),
                "lengths": np.cumsum([p.shape[2] for p in pieces]).astype(np.int64),
                "K": K, "V": V, "the returned keys are a view of the cache": True}

    def mistakes(self, shape, pieces):
        found = {"writing every piece at position 0 (the length tells where the free slots "
                 "start)": lambda: self.expected(shape, pieces, at_zero=True),
                 "with the keys and the values swapped (k_new goes into K, v_new into V)":
                 lambda: self.expected(shape, pieces, swapped=True)}
        if sum(p.shape[2] for p in pieces) < shape[2]:  # room for the shift
            found["writing each piece one slot late, at length + 1 (positions count from 0: "
                  "the first free slot is length itself)"] = lambda: self.expected(
                shape, pieces, late=1)
        return found


def _values(keys):
    """The values written with ``keys`` in check-kv-cache-append: positive, and no multiple of
    the keys (so that keys and values swapped are told from a sign error)."""
    return 1 + keys * keys


def _post_norm_block(block, x, rope, drop=None):
    """The twin's ``block`` on ``x`` with post-norm residuals (no dropout), a mistake in a GPT's
    block."""
    from transformer_lab.reference.torch_gpt import _norm

    x = _norm(x + block.attention(x, rope), block.norm1, block.c)
    return _norm(x + block.feed_forward(x), block.norm2, block.c)


class CachedStep(Check, id="check-gpt-step",
                 functions=("causal_self_attention_step", "gpt_block_step", "gpt_step")):
    axes = {"logits": "btv"}  # axis names, for messages

    def cases(self, rng):
        yield Case("a prompt of 3, then one token at a time", (*_model_case(rng), (3, 1, 1, 1)))
        yield Case("chunks of 2", (*_model_case(rng), (2, 2, 2)))
        yield Case("an output table of its own (untied: params['lm_head']['W']), chunks of 3",
                   (*_model_case(later_rng(rng), tie_embeddings=False), (3, 3)))
        yield Case("a fixed sinusoidal table (pe), chunks of 2",
                   (*_model_case(later_rng(rng), positional="sinusoidal"), (2, 2, 2)))
        yield Case("eps = 0.1 (the config's, for every norm)",
                   (*_model_case(later_rng(rng), eps=0.1), (3, 3)))
        yield Case("float32, a prompt of 2, then chunks of 2 and 1",
                   (*_model_case(later_rng(rng), np.float32), (2, 2, 1, 1)))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("float32, one token at a time", (*_model_case(rng, np.float32),
                                                    (1, 1, 1, 1, 1, 1)))
    ### END HIDDEN TESTS

    def run(self, f, flat, ids, config, chunks):
        from transformer_lab.models.shell import nest

        c = _config(config)
        B, T = ids.shape
        shape = (B, c.num_kv_heads, T, c.head_dim)
        caches = [(np.zeros(shape, c.dtype), np.zeros(shape, c.dtype))
                  for _ in range(c.num_layers)]
        params, pieces, lengths, rope = nest(flat), [], [], _rope(c, T)
        for start, end in itertools.pairwise((0, *np.cumsum(chunks))):  # the rows of each step
            logits, length = f.gpt_step(params, ids[:, start:end], c, caches, start, _pe(c),
                                        rope and tuple(r[start:end] for r in rope))
            pieces.append(logits)
            lengths.append(length)
        return {"the length each step returned": np.asarray(lengths, dtype=np.int64),
                WRITTEN: np.flatnonzero([K.any() for K, _ in caches]),
                "logits": np.concatenate(pieces, axis=1)}

    def expected(self, flat, ids, config, chunks):
        from transformer_lab.reference.torch_gpt import TorchGPT

        twin = TorchGPT(_config(config))
        twin.load_numpy_params(flat)
        return {"the length each step returned": np.cumsum(chunks).astype(np.int64),
                WRITTEN: np.arange(twin.config.num_layers), "logits": _np(twin(ids))}

    @staticmethod
    def _masked(flat, ids, config, visible):
        """The twin's logits with each block's attention seeing where ``visible`` (T, T) is
        True instead of causally: how the whole sequence sees a cached step's wrong mask."""
        from transformer_lab.reference.torch_gpt import TorchGPT, attention

        c, mask = _config(config), torch.as_tensor(visible)
        twin = TorchGPT(c)
        twin.load_numpy_params(flat)

        def masked(attn):  # a block's attention, seeing where ``visible`` says
            return lambda x, rope: attention(x, dict(attn.named_parameters()), c.num_heads,
                                             c.num_kv_heads, rope, mask)

        for block in twin.layers:
            block.attention = masked(block.attn)
        with torch.no_grad():
            return _np(twin(ids))

    def mistakes(self, flat, ids, config, chunks):
        from transformer_lab.checks.nb13_gpt import GPTModel
        from transformer_lab.reference.torch_gpt import TorchGPT

        c, T = _config(config), ids.shape[1]
        key = np.arange(T)  # a position, as a key
        rows = np.concatenate([np.arange(t) for t in chunks])  # each token's row in its step
        start = key - rows  # where each token's step starts
        end = start + np.repeat(chunks, chunks)  # and ends
        head = flat.get("lm_head.W", flat["embed.W"])

        def unnormed():  # the last block's output, projected without the final norm
            twin, seen = TorchGPT(c), []
            twin.load_numpy_params(flat)
            twin.layers[-1].register_forward_hook(lambda _m, _a, out: seen.append(out))
            with torch.no_grad():
                twin(ids)
            return {"logits": _np(seen[0]) @ head.T}

        def seeing(visible):  # the logits with new position i seeing key j where visible[i, j]
            return lambda: {"logits": self._masked(flat, ids, config, visible)}

        def post_norm():  # each block's residuals norm(x + f(x)), the encoder-decoder's other way
            twin = TorchGPT(c)
            twin.load_numpy_params(flat)
            for b in twin.layers:
                b.forward = functools.partial(_post_norm_block, b)
            with torch.no_grad():
                return {"logits": _np(twin(ids))}

        found = {
            SHARED_CACHE: lambda: {WRITTEN: np.arange(1)},
            "with post-norm residuals, norm(x + f(x)): the GPT's blocks are pre-norm, x + "
            "f(norm(x)) (norm_first=True)": post_norm,
            "without the final norm (params['norm']) before the output projection, which "
            "gpt_forward applies": unnormed,
            "with each step's tokens attending to each other only: the earlier positions' keys "
            "and values are in the cache (attend to all that kv_cache_append returns)":
            seeing((key >= start[:, None]) & (key <= key[:, None])),
            "with the mask's first t rows, causal_mask(end)[:t]: new token i is at position "
            "length + i, so its row is length + i (causal_mask(end)[length:])":
            seeing(key <= rows[:, None]),
            "without the mask: a step of several tokens sees its own later tokens (the mask is "
            "(t, end), rows length .. end - 1 of causal_mask(end))":
            seeing(key < end[:, None])}
        positions = flat["pos.W"] if "pos.W" in flat else _pe(c)
        if positions is not None:
            found["with each step's positions from row 0 of the table: the new tokens are at "
                  "positions length .. length + t - 1 (slice the table's rows from length)"] = \
                lambda: {"logits": GPTModel._wrong_logits(flat, ids, config,
                                                          positions[rows] - positions[:T])}
        return found
