"""Checks of notebook 12_translation: the label-smoothed loss, beam search and the decoder with a
cache (``transformer_lab.core.translation``).

The loss is checked against ``torch.nn.functional.cross_entropy(..., label_smoothing=,
ignore_index=)`` and autograd; the decoder's cached steps against the PyTorch model written from
scratch (:class:`transformer_lab.reference.torch_transformer.TorchTransformer`) run over the
whole target at once. Beam search has no counterpart in PyTorch: its reference is the
definition, written again with Python lists (hidden; the handout stores its public answers).
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from transformer_lab.checks._torch_helpers import _np, _t, torch
from transformer_lab.checks.framework import Case, Check, later_rng
from transformer_lab.checks.nb06_layers_backward import _log_softmax
from transformer_lab.checks.nb09_verification import _smoothed
from transformer_lab.checks.nb10_training import _numpy_model, _twin
from transformer_lab.datasets.tasks import BOS, EOS, PAD
from transformer_lab.models.config import ACTIVATIONS

# --------------------------------------------------------------------------------------------
# §4 Label smoothing


def _smoothing_case(rng, shape, eps, ignored=0, dtype=np.float64, dloss=1.0, ignore_index=-1):
    logits = (rng.standard_normal(shape) * 2).astype(dtype)
    targets = rng.integers(0, shape[-1], shape[:-1])
    targets.flat[rng.choice(targets.size, ignored, replace=False)] = ignore_index
    return (logits, targets, eps, ignore_index, dloss)


class LabelSmoothedLoss(Check, id="check-label-smoothed-loss",
                        functions=("label_smoothed_loss_forward", "label_smoothed_loss_backward")):
    tol = {"float64": 1e-9, "float32": 1e-4}

    def cases(self, rng):
        yield Case("4 positions, V = 6, eps = 0.1", _smoothing_case(rng, (4, 6), 0.1))
        yield Case("(2, 5) positions, V = 7, eps = 0.2, three ignored",
                   _smoothing_case(rng, (2, 5, 7), 0.2, ignored=3))
        yield Case("eps = 0: plain cross-entropy", _smoothing_case(rng, (3, 5), 0.0, ignored=1))
        yield Case("float32, ignore_index = -100, dloss = 0.5",
                   _smoothing_case(rng, (3, 4, 9), 0.1, 2, np.float32, 0.5, -100))
        later = later_rng(rng)  # the case below was added later: the ones above stay as drawn
        yield Case("ignore_index = 0 (a padding id that is also a class)",
                   _smoothing_case(later, (2, 4, 6), 0.1, 3, ignore_index=0))
        far = _smoothing_case(later_rng(rng), (3, 6), 0.1, dtype=np.float32)
        far[0][:, 2] -= 120  # exp(-120) is 0 in float32
        yield Case("float32, logit 2 of every row 120 below the rest (its softmax is 0 and the "
                   "log of that -inf: log_softmax keeps it finite)", far)

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("eps = 0.5, V = 3", _smoothing_case(rng, (6, 3), 0.5, ignored=2))
        yield Case("one position counted of eight", _smoothing_case(rng, (2, 4, 5), 0.3, 7))
        yield Case("float32, (2, 3, 4) positions, V = 11",
                   _smoothing_case(rng, (2, 3, 4, 11), 0.15, 5, np.float32))
    ### END HIDDEN TESTS

    def run(self, f, logits, targets, eps, ignore_index, dloss):
        loss, cache = f.label_smoothed_loss_forward(logits, targets, eps, ignore_index)
        return {"loss": np.asarray(loss, logits.dtype),
                "dlogits": f.label_smoothed_loss_backward(dloss, cache)}

    def expected(self, logits, targets, eps, ignore_index, dloss):
        want = _smoothed(logits, targets, ignore_index, eps)  # torch's, as notebook 09's
        return {"loss": np.asarray(want["loss"], logits.dtype), "dlogits": want["dlogits"] * dloss}

    def mistakes(self, logits, targets, eps, ignore_index, dloss):
        V = logits.shape[-1]
        keep = targets != ignore_index

        def smoothed(on, off, counted, total=None, padded_on=None):
            """q: ``on`` at the target, ``off`` elsewhere (at an ignored position: at class 0,
            or ``padded_on``); each position weighs ``counted`` / (their sum or ``total``)."""
            logp = _log_softmax(logits)
            q = np.full(logits.shape, off)
            on_here = on if padded_on is None else np.where(keep, on, padded_on)[..., None]
            np.put_along_axis(q, np.where(keep, targets, 0)[..., None], on_here, -1)
            w = counted / (counted.sum() if total is None else total)
            return {"loss": np.asarray(-((q * logp).sum(-1) * w).sum(), logits.dtype),
                    "dlogits": ((np.exp(logp) * q.sum(-1, keepdims=True) - q)  # p - q, q right
                                * (w * dloss)[..., None]).astype(logits.dtype)}

        counted = smoothed(1 - eps + eps / V, eps / V, np.ones(keep.shape))
        found = {}
        if ignore_index >= 0:  # a padding id that is a class: named before the general case
            found["taking the padding to be the negative targets (targets >= 0): it is "
                  "targets == ignore_index, here a class id too"] = lambda: counted
        found.update({
            "with eps spread over the V - 1 other classes (torch spreads it over all V, the "
            "target included: q = (1 - eps) onehot + eps / V)":
            lambda: smoothed(1 - eps, eps / (V - 1), keep),
            "with no smoothing on the other classes: the target given 1 - eps + eps / V, the "
            "others 0 (the uniform part is on every class)":
            lambda: smoothed(1 - eps + eps / V, 0.0, keep),
            "with the ignored positions counted (mask them out and divide by the number kept)":
            lambda: counted})
        right = smoothed(1 - eps + eps / V, eps / V, keep)
        if dloss != 1:
            found["with a backward that ignores dloss: the gradient of the loss times dloss, the "
                  "gradient that comes from above"] = lambda: {
                      **right, "dlogits": (right["dlogits"] / dloss).astype(logits.dtype)}
        found["with the uniform part left out of the gradient: dlogits = p - q, and q has eps / V "
              "on every class"] = lambda: {**right, "dlogits": smoothed(1 - eps, 0.0, keep)[
                  "dlogits"]}
        found["with the target's eps / V left out of the gradient (q at the target is 1 - eps "
              "+ eps / V: the uniform part is on every class)"] = lambda: {
                  **right, "dlogits": smoothed(1 - eps, eps / V, keep)["dlogits"]}
        found["with a gradient at the ignored positions: their rows of dlogits are 0 (weigh "
              "them by the mask, as the loss does)"] = lambda: {
                  **right, "dlogits": smoothed(1 - eps + eps / V, eps / V, np.ones(keep.shape),
                                               total=keep.sum())["dlogits"]}
        found["summing -log p over the classes where their mean belongs (the uniform "
              "distribution puts 1 / V on each)"] = lambda: smoothed(1.0, eps, keep)
        found["with the target's weight 1 in the gradient where 1 - eps belongs (q = (1 - eps) "
              "onehot + eps / V)"] = lambda: {**right, "dlogits": smoothed(
                  1 + eps / V, eps / V, keep)["dlogits"]}
        if eps > 0:
            found["with the target's weight 1 where 1 - eps belongs (q = (1 - eps) onehot + "
                  "eps / V: the smoothing takes eps from the target)"] = lambda: smoothed(
                1 + eps / V, eps / V, keep)
        if not keep.all():
            found["dividing by every position, the ignored ones too (the mean is over the "
                  "positions kept: divide by their number)"] = lambda: smoothed(
                1 - eps + eps / V, eps / V, keep, total=keep.size)
            if eps > 0:
                found["with the smoothing term counted at the ignored positions too (mask "
                      "the whole loss of a position, both terms)"] = lambda: smoothed(
                    1 - eps + eps / V, eps / V, np.ones(keep.shape), keep.sum(), eps / V)
        return found


# --------------------------------------------------------------------------------------------
# §6 One step of beam search

#: check-beam-step's output of length_penalty itself
PENALTIES = "length_penalty(lengths 1 .. 8, alpha)"


### BEGIN HIDDEN TESTS
def _gnmt(n, alpha):
    return ((5 + n) / 6) ** alpha


def _reference_step(scores, lengths, finished, logp, alpha, eos, pad, lp=_gnmt, done="frozen",
                    pick="best", penalty=None, old_length=False):
    """The definition, with lists: every candidate (k, t), in the order k * V + t, ranked by
    score / lp(length), K kept. The mistakes: another ``lp`` (in the ranking; ``penalty``: in
    length_penalty itself, so in the search's final scores too); a finished hypothesis ``done``
    "extended" by every token, "copied" (every token at no cost), "growing" in length,
    "dropped", or continued by padding but "unflagged" (not finished); another ``pick``: the
    "first" K candidates unranked, the
    "worst" K, the parent and token of index k * V + t "swapped" (index % K, index // K) or
    its parent as "parent // K", or
    the lengths "ungathered" (hypothesis j's own, not its parent's) or the finished flags
    ("unflagged"), ties "reversed" (the last first); or ranked by the penalty of the
    ``old_length``, before this step's token."""
    B, K, V = logp.shape
    lp = penalty or lp
    out = [np.zeros((B, K), dtype) for dtype in (np.int64, np.int64, float, np.int64, bool)]
    for b in range(B):
        grown = [lengths[b, k] + (not finished[b, k] or done == "growing") for k in range(K)]
        cands = []
        for k, t in itertools.product(range(K), range(V)):
            s, n = scores[b, k], lengths[b, k]
            if not finished[b, k]:
                cands.append((s + logp[b, k, t], n + 1, k, t, t == eos))
            elif done == "extended":  # padding still free
                cands.append((s + (0 if t == pad else logp[b, k, t]), n, k, t, True))
            elif done == "copied":  # every token free
                cands.append((s, n, k, t, True))
            elif done in ("frozen", "growing", "unflagged") and t == pad:
                cands.append((s, grown[k], k, pad, done != "unflagged"))
            else:  # a finished hypothesis's other tokens (all of them, dropped): blocked
                cands.append((-np.inf, n, k, t, True))
        rank = [c[0] / lp(lengths[b, c[2]] if old_length else c[1], alpha) for c in cands]
        ascending = sorted(range(K * V), key=lambda i: rank[i])  # stable: ties keep their order
        order = {"first": range(K * V), "worst": ascending, "reversed": ascending[::-1]}.get(
            pick, sorted(range(K * V), key=lambda i: -rank[i]))
        for j, i in enumerate(order[:K]):
            s, n, k, t, fin = cands[i]
            if pick in ("swapped", "parent // K"):
                k, t = (i % K, i // K) if pick == "swapped" else (i // K, t)
                n, fin = grown[k], finished[b, k] or t == eos
            elif pick == "ungathered":
                n = grown[j]
            elif pick == "unflagged":
                fin = bool(finished[b, j]) or t == eos
            out[0][b, j], out[1][b, j], out[2][b, j], out[3][b, j], out[4][b, j] = k, t, s, n, fin
    return {PENALTIES: np.asarray((penalty or _gnmt)(np.arange(1, 9), alpha), float),
            **dict(zip(("parents", "tokens", "scores", "lengths", "finished"), out, strict=True))}



#: beam_step's mistakes: what each one is -> the variant of the definition that makes it
STEP_MISTAKES = {
    "with the exponent alpha forgotten (GNMT's penalty is ((5 + length) / 6) ** alpha)":
    {"penalty": lambda n, alpha: (5 + n) / 6},
    "with no length normalisation (rank by score / length_penalty(length, alpha))":
    {"lp": lambda n, alpha: 1.0},
    "ranking by the mean log-probability, score / length (rank by score / length_penalty"
    "(length, alpha))": {"lp": lambda n, alpha: n},
    "with the penalty of the lengths before the step (rank each candidate by the length it "
    "has with its token: length_penalty(new_lengths, alpha))": {"old_length": True},
    "with the penalty length ** alpha (GNMT's is ((5 + length) / 6) ** alpha)":
    {"penalty": lambda n, alpha: n ** alpha},
    "with // in the length penalty (integer division: its base is 1 up to length 6; divide "
    "with /)": {"penalty": lambda n, alpha: ((5 + n) // 6) ** alpha},
    "with a length one too long in the penalty, ((6 + length) / 6) ** alpha: GNMT's is 1 at "
    "one token, ((5 + length) / 6) ** alpha": {"penalty": lambda n, alpha: ((6 + n) / 6) ** alpha},
    "with finished hypotheses extended by real tokens (a finished hypothesis has one "
    "continuation: padding, at no cost)": {"done": "extended"},
    "with every token continuing a finished hypothesis at its score (np.where(finished, "
    "scores, ...) over all V): only padding may; the others are -inf, or the beam fills with "
    "copies of the finished one": {"done": "copied"},
    "with finished hypotheses growing in length (a finished hypothesis keeps its length)":
    {"done": "growing"},
    "with finished hypotheses dropped (a finished hypothesis stays in the beam, its score "
    "kept, continued by padding)": {"done": "dropped"},
    "with finished = (tokens == eos_id) alone: a hypothesis continued from a finished one, by "
    "padding, is finished too -- take the parents' flags (take_along_axis) or EOS":
    {"done": "unflagged"},
    "with the candidates not ranked: the first K kept (sort every candidate by score / "
    "length_penalty(length, alpha), best first)": {"pick": "first"},
    "keeping the worst K: an ascending sort (argsort the negated ranks)": {"pick": "worst"},
    "with tied candidates taken last first (argsort(rank)[::-1] reverses ties; "
    "argsort(-rank, kind=\"stable\") keeps the first)": {"pick": "reversed"},
    "with K where V belongs in the flat index (candidate k * V + t: the parent is index // V, "
    "the token index % V)": {"pick": "swapped"},
    "with the parent taken as index // K (candidate k * V + t: the parent is index // V, "
    "whatever K is)": {"pick": "parent // K"},
    "with the lengths not gathered by parent (a new hypothesis has its parent's length, "
    "take_along_axis(..., parents, axis=1))": {"pick": "ungathered"},
    "with the finished flags not gathered by parent (a new hypothesis is finished if its "
    "parent was, take_along_axis(finished, parents, axis=1), or if its token is EOS)":
    {"pick": "unflagged"},
}
### END HIDDEN TESTS


def _step_case(rng, B, K, V, alpha, n_finished=0, first=False):
    logp = _log_softmax(rng.standard_normal((B, K, V)) * 1.5)
    finished = np.zeros((B, K), bool)
    if first:
        scores = np.full((B, K), -np.inf)
        scores[:, 0] = 0.0
        lengths = np.zeros((B, K), np.int64)
    else:
        scores = -np.sort(rng.uniform(0.5, 4.0, (B, K)), axis=1)  # best first
        lengths = rng.integers(2, 9, (B, K))
        for b in range(B):
            finished[b, rng.choice(K, n_finished, replace=False)] = True
    return (scores, lengths, finished, logp, alpha, EOS, PAD)


def _tied_case(rng, K=3, V=8):
    """B = 1: hypotheses 0 and 1 alike (score, length, next tokens), whose tokens 3 .. 7 are
    equally likely: ten candidates tied for the K best."""
    logp = np.log(np.tile([0.05, 0.1, 0.1] + [0.15] * 5, (1, K, 1)))  # PAD, BOS, EOS, then ties
    logp[0, 2] = _log_softmax(rng.standard_normal(V))
    return (np.array([[-1.0, -1.0, -4.0]]), np.full((1, K), 3), np.zeros((1, K), bool), logp,
            0.6, EOS, PAD)


class BeamStep(Check, id="check-beam-step", functions=("length_penalty", "beam_step")):
    loop_free = {"beam_step": "one argsort over the (B, K * V) candidates of every source"}

    def cases(self, rng):
        yield Case("the first step: one live hypothesis, K = 3, V = 5",
                   _step_case(rng, 1, 3, 5, 0.6, first=True))
        yield Case("B = 2, K = 3, V = 6, one finished hypothesis each, alpha = 1",
                   _step_case(rng, 2, 3, 6, 1.0, n_finished=1))
        yield Case("B = 1, K = 4, V = 5, two finished, alpha = 2 (long outputs favoured)",
                   _step_case(rng, 1, 4, 5, 2.0, n_finished=2))
        yield Case("alpha = 0: summed log-probabilities, K = 2",
                   _step_case(rng, 2, 2, 5, 0.0, n_finished=1))
        yield Case("K = 1: greedy", _step_case(rng, 3, 1, 6, 0.6))
        yield Case("candidates tied at the cut of the K best: the first ones in the order "
                   "k * V + t are kept (a stable sort)", _tied_case(later_rng(rng)))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("B = 3, K = 5, V = 7, two finished, alpha = 0.8",
                   _step_case(rng, 3, 5, 7, 0.8, n_finished=2))
        yield Case("every hypothesis finished", _step_case(rng, 2, 3, 5, 0.6, n_finished=3))
        yield Case("the first step, B = 2, K = 4, V = 4", _step_case(rng, 2, 4, 4, 1.2,
                                                                      first=True))

    def expected(self, scores, lengths, finished, logp, alpha, eos, pad):
        return _reference_step(scores, lengths, finished, logp, alpha, eos, pad)

    def mistakes(self, scores, lengths, finished, logp, alpha, eos, pad):
        args = (scores, lengths, finished, logp, alpha, eos, pad)
        return {description: functools.partial(_reference_step, *args, **variant)
                for description, variant in STEP_MISTAKES.items()}
    ### END HIDDEN TESTS

    def run(self, f, scores, lengths, finished, logp, alpha, eos, pad):
        parents, tokens, new, lens, fin = f.beam_step(scores, lengths, finished, logp, alpha,
                                                      eos, pad)
        return {PENALTIES: np.asarray(f.length_penalty(np.arange(1, 9), alpha), float),
                "parents": np.asarray(parents), "tokens": np.asarray(tokens),
                "scores": np.asarray(new, float), "lengths": np.asarray(lens),
                "finished": np.asarray(fin)}


# --------------------------------------------------------------------------------------------
# §7 Beam search


def _search_case(rng, B, K, V, max_len, alpha, eos_bonus=0.5):
    """A source-dependent model of order two: log p(next | the two tokens before) (B, V, V, V),
    random, EOS made a little likelier."""
    logits = rng.standard_normal((B, V, V, V)) * 1.5
    logits[..., EOS] += eos_bonus
    return (_log_softmax(logits), K, max_len, alpha)


def _read(table, source, before, last, t):
    """log p(next | the token before the last, the last) of a prefix of ``t`` tokens: the
    table's row, read at ``before`` for an odd ``t`` and at ``V - 1 - before`` for an even one
    (so the model reads the prefix's length too)."""
    return table[source, before if t % 2 else table.shape[1] - 1 - before, last]


def _table_step(table, K):
    """The step of a model of order two that keeps the previous prefix as its "cache" and
    reorders it by ``rows`` (so a wrong ``rows`` gives wrong log-probabilities), and that reads
    the length of the prefix it is given (so does a prefix cut short)."""
    state = {"prev": None}

    def step(prefix, rows):
        prefix = np.asarray(prefix)
        before = np.full(prefix.shape[0], BOS) if state["prev"] is None \
            else state["prev"][np.asarray(rows)][:, -1]
        state["prev"] = prefix.copy()
        source = np.arange(prefix.shape[0]) // K
        return _read(table, source, before, prefix[:, -1], prefix.shape[-1])
    return step


### BEGIN HIDDEN TESTS
def _search(table, K, max_len, alpha, offset=True, gather=True, copies=False, stop=True,
            normalise=True, reorder=True, whole=True, layout="BK", bos=False, **step):
    """The search by its definition, step by step with :func:`_reference_step`, as
    ``beam_search`` runs it -- rows of prefixes, the table's "cache" read through ``rows`` --
    or with one of its mistakes (:data:`SEARCH_MISTAKES`; ``step``: a variant of beam_step,
    :data:`STEP_MISTAKES`)."""
    B = table.shape[0]
    seqs = [[(BOS,)] * K for _ in range(B)]
    scores, lengths, finished = np.zeros((B, K)), np.full((B, K), int(bos)), np.zeros((B, K), bool)
    if not copies:
        scores[:, 1:] = -np.inf
    before, rows = [BOS] * (B * K), range(B * K)
    for _ in range(max_len):
        prefix = [p for hs in seqs for p in hs]
        logp = np.stack([_read(table, i // K, before[r], p[-1], len(p) if whole else 1)
                         for i, (p, r) in enumerate(zip(prefix, rows, strict=True))])
        logp = logp.reshape(B, K, -1) if layout == "BK" else \
            logp.reshape(K, B, -1).transpose(1, 0, 2)
        out = _reference_step(scores, lengths, finished, logp, alpha, EOS, PAD, **step)
        parents, tokens = out["parents"], out["tokens"]
        scores, lengths, finished = out["scores"], out["lengths"], out["finished"]
        seqs = [[seqs[b][parents[b, j] if gather else j] + (int(tokens[b, j]),)
                 for j in range(K)] for b in range(B)]
        before = [p[-1] for p in prefix]  # the table's cache: the last call's prefixes
        if reorder:
            rows = (parents + K * np.arange(B)[:, None] * offset).reshape(-1)
        if stop and (finished[:, 0] if stop == "best" else finished).all():
            break
    return {"sequences": np.array(seqs, dtype=np.int64),
            "scores": scores / (step.get("penalty", _gnmt)(lengths, alpha) if normalise else 1)}


#: beam_search's mistakes: what each one is -> the variant of the search that makes it
SEARCH_MISTAKES = {
    "returning the summed log-probabilities: the scores returned are normalised, score / "
    "length_penalty(length, alpha)": {"normalise": False},
    "with rows = parents, the source's offset b * K forgotten (a new hypothesis continues row "
    "b * K + parent)": {"offset": False},
    "with rows left the identity: the model's cache must follow the hypotheses, each new one "
    "continuing its parent's row, b * K + parent": {"reorder": False},
    "with the prefixes not gathered by parent (a new hypothesis is its parent's prefix plus "
    "its token)": {"gather": False},
    "starting from K live copies of <s> (start from one: scores (0, -inf, ..., -inf))":
    {"copies": True},
    "never stopping early (stop when every hypothesis is finished)": {"stop": False},
    "counting <s> in the lengths (they start at 0: a hypothesis's length counts the tokens "
    "after <s>, EOS included)": {"bos": True},
    "stopping when the best hypothesis of each source is finished: one still running may yet "
    "overtake it (stop when every hypothesis is finished)": {"stop": "best"},
    "with logp read as (K, B, V): row b * K + k is hypothesis k of source b, so (B * K, V) "
    "reshapes to (B, K, V)": {"layout": "KB"},
    "passing step the last tokens only (prefix[:, -1:]): it takes the whole prefixes, (B * K, "
    "t), and a model with a cache still reads their length (the next position)": {"whole": False},
}
### END HIDDEN TESTS


class BeamSearch(Check, id="check-beam-search",
                 functions=("length_penalty", "beam_step", "beam_search")):
    def cases(self, rng):
        yield Case("B = 1, K = 2, V = 5, 4 steps", _search_case(rng, 1, 2, 5, 4, 0.6))
        yield Case("B = 2, K = 3, V = 6, 6 steps", _search_case(rng, 2, 3, 6, 6, 0.6))
        yield Case("K = 1 (greedy), B = 3", _search_case(rng, 3, 1, 5, 5, 0.6))
        yield Case("B = 2, K = 4, V = 5, EOS likely: hypotheses finish at different steps, "
                   "alpha = 1.5", _search_case(rng, 2, 4, 5, 7, 1.5, eos_bonus=1.5))
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        yield Case("B = 2, K = 2, V = 5, EOS very likely: every hypothesis finished before "
                   "max_len = 8", _search_case(later, 2, 2, 5, 8, 0.6, eos_bonus=3.0))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("B = 3, K = 5, V = 7, 6 steps", _search_case(rng, 3, 5, 7, 6, 0.8))
        yield Case("alpha = 0, EOS very likely", _search_case(rng, 2, 3, 5, 5, 0.0, 3.0))

    def expected(self, table, K, max_len, alpha):
        return _search(table, K, max_len, alpha)

    def mistakes(self, table, K, max_len, alpha):
        return {description: functools.partial(_search, table, K, max_len, alpha, **variant)
                for description, variant in {**SEARCH_MISTAKES, **STEP_MISTAKES}.items()}
    ### END HIDDEN TESTS

    def run(self, f, table, K, max_len, alpha):
        seqs, scores = f.beam_search(_table_step(table, K), table.shape[0], K, max_len, BOS,
                                     EOS, PAD, alpha)
        return {"sequences": np.asarray(seqs), "scores": np.asarray(scores, float)}


# --------------------------------------------------------------------------------------------
# §8 The decoder with a cache


def _decoder_case(rng, T=5, S=4, B=2, chunks=(1,) * 5, norm_first=True, src_pad=False,
                  dtype="float64", layers=2, **settings):
    from transformer_lab.models.config import config_to_dict
    from transformer_lab.models.encoder_decoder import Transformer, TransformerConfig

    config = TransformerConfig(src_vocab_size=7, tgt_vocab_size=9, d_model=8, num_heads=2,
                               num_encoder_layers=1, num_decoder_layers=layers, d_ff=12,
                               max_len=8, norm_first=norm_first, dtype=np.dtype(dtype).type,
                               **settings)  # settings: scale_embeddings, eps
    model = Transformer(config, seed=int(rng.integers(1000)))
    params = {k: (p + rng.normal(0, 0.2, p.shape)).astype(dtype)
              for k, p in model.params.items()}
    memory = rng.standard_normal((B, S, 8)).astype(dtype)
    pad = np.zeros((B, S), bool)
    pad[0, S - 2:] = src_pad  # the first source's last two positions are padding, or none
    tgt = rng.integers(3, 9, (B, T))
    tgt[:, 0] = BOS
    return ({**config_to_dict(config), "dtype": dtype}, params, memory, pad, tgt, list(chunks))


class DecoderStep(Check, id="check-decoder-step",
                  functions=("memory_keys_values", "cached_self_attention_step",
                             "decoder_layer_step", "transformer_decode_step")):
    tol = {"float64": 1e-9, "float32": 1e-4}

    def cases(self, rng):
        yield Case("one token at a time, 5 tokens, pre-norm", _decoder_case(rng))
        yield Case("post-norm, a padded source", _decoder_case(rng, norm_first=False,
                                                                src_pad=True))
        yield Case("new tokens 2, 1, 3 at a time", _decoder_case(rng, T=6, chunks=(2, 1, 3)))
        yield Case("float32, one layer", _decoder_case(rng, dtype="float32", layers=1))
        later = later_rng(rng)  # the case below was added later: the ones above stay as drawn
        yield Case("eps = 0.1, no embedding scale (the config says both)",
                   _decoder_case(later, scale_embeddings=False, eps=0.1))
        yield Case("learned positions, the exact GELU, no biases (the config says all three)",
                   _decoder_case(later, positional="learned", activation="gelu", bias=False))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("all 6 tokens at once", _decoder_case(rng, T=6, chunks=(6,)))
        yield Case("B = 3, S = 7, post-norm", _decoder_case(rng, S=7, B=3, norm_first=False,
                                                             src_pad=True))
    ### END HIDDEN TESTS

    def run(self, f, config, params, memory, pad, tgt, chunks):
        model = _numpy_model(config, params)
        c, nested = model.config, model._nested()
        layers, H = nested["decoder"]["layers"], c.num_heads
        memory_kvs = [f.memory_keys_values(memory, layer["cross_attn"], H) for layer in layers]
        shape = (tgt.shape[0], H, c.max_len, c.d_model // H)
        caches = [(np.zeros(shape, c.dtype), np.zeros(shape, c.dtype)) for _ in layers]
        length, logits = 0, []
        for n in chunks:
            out, length = f.transformer_decode_step(nested, tgt[:, length:length + n], c, caches,
                                                    length, memory_kvs, model.pe,
                                                    pad if pad.any() else None)
            logits.append(out)
        return {"memory_keys": memory_kvs[0][0], "memory_values": memory_kvs[0][1],
                WRITTEN: np.flatnonzero([K.any() for K, _ in caches]),
                "cached_keys": caches[0][0][:, :, :tgt.shape[1]],
                "logits": np.concatenate(logits, axis=1), "length": np.asarray(length)}

    def expected(self, config, params, memory, pad, tgt, chunks):
        return {**{out: _memory_heads(memory, params, config, n) for n, out in MEMORY.items()},
                WRITTEN: np.arange(config["num_decoder_layers"]),
                **_decoded(config, params, memory, pad, tgt, chunks),
                "length": np.asarray(tgt.shape[1])}

    def mistakes(self, config, params, memory, pad, tgt, chunks):
        biasless = {f"without the bias b_{n} (K_mem = memory W_k + b_k, V_mem = memory W_v + "
                    f"b_v, where the model has biases)": lambda n=n, out=out: {
                        out: _memory_heads(memory, params, config, n, bias=False)}
                    for n, out in MEMORY.items()}
        given = config["activation"]
        activations = {f"with the {name} activation where config.activation is {given!r} (pass "
                       "it on to feed_forward_forward)": functools.partial(
                           _decoded, {**config, "activation": name}, params, memory, pad, tgt,
                           chunks) for name in ACTIVATIONS if name != given}
        order = "pre-norm" if config["norm_first"] else "post-norm"
        activations[f"with the other norm order where config.norm_first is "
                    f"{config['norm_first']} ({order}): pass it on to the layers"] = \
            functools.partial(_decoded, {**config, "norm_first": not config["norm_first"]},
                              params, memory, pad, tgt, chunks)
        biasless["with the memory's keys and values swapped (memory_keys_values returns k, "
                 "then v: k = memory W_k, v = memory W_v)"] = lambda: {
                     "memory_keys": _memory_heads(memory, params, config, "v"),
                     "memory_values": _memory_heads(memory, params, config, "k")}
        return {**biasless, **activations, SHARED_CACHE: lambda: {WRITTEN: np.arange(1)},
                UNWRITTEN: lambda: {WRITTEN: np.arange(0)}, **{
            description: functools.partial(_decoded, config, params, memory, pad, tgt, chunks,
                                           mistake)
            for description, mistake in DECODER_MISTAKES.items()}}


#: the output of the layers whose cache a step wrote, and the mistake of one cache for all
WRITTEN = "the layers whose cache was written"
SHARED_CACHE = ("with one cache for every layer: layer i keeps its keys and values in caches[i] "
                "(zip the layers with the caches)")
UNWRITTEN = ("with no cache written: the step writes the new keys and values into the arrays it "
             "is given (K[:, :, length:end] = k); K = np.concatenate(...) makes a new array that "
             "the caller, and the next step, never see")


#: the check's outputs of the first decoder layer's memory keys and values
MEMORY = {"k": "memory_keys", "v": "memory_values"}


def _memory_heads(memory, params, config, n, bias=True):
    """The first decoder layer's memory keys (``n`` "k") or values ("v"), split into heads."""
    (B, S, E), H = memory.shape, config["num_heads"]
    cross = "decoder.layers.0.cross_attn."
    b = params.get(f"{cross}b_{n}", 0) if bias else 0
    return (memory @ params[f"{cross}W_{n}"] + b).reshape(B, S, H, E // H).transpose(0, 2, 1, 3)


def _decoded(config, params, memory, pad, tgt, chunks, mistake=""):
    """The PyTorch model over the whole target at once: the logits, and the keys of the first
    layer's self-attention (what its cache holds at the end) -- or what a cached step with one
    of :data:`DECODER_MISTAKES` gives."""
    twin = _twin(config, params)
    T = tgt.shape[1]
    ends = np.repeat(np.cumsum(chunks), chunks)  # the end of each position's step
    starts = ends - np.repeat(chunks, chunks)  # and its start, the cache's length then
    p, j = np.arange(T)[:, None], np.arange(T)[None, :]
    blocked = {"no mask": j >= ends[:, None], "offset mask": j > p - starts[:, None],
               "new only": (j > p) | (j < starts[:, None]), "diagonal": j >= p}.get(mistake,
                                                                                 j > p)
    with torch.no_grad():
        x = twin.embed(_t(tgt), "tgt")
        if mistake == "no scale" and twin.config.scale_embeddings:  # W[id], not sqrt(E) W[id]
            x = x - twin.tgt_embed(_t(tgt)) * (math.sqrt(twin.config.d_model) - 1)
        if mistake == "positions":  # each step's positions from 0
            x = x - twin.pe[:T] + twin.pe[p[:, 0] - starts]
        first = twin.decoder.layers[0]
        h = first.norm1(x) if twin.config.norm_first else x
        qkv = np.concatenate([_np(a) for a in first.self_attn.project(h, h)], axis=-1)
        keys = _cached_keys(qkv, config["num_heads"], mistake)
        kpm = _t(pad) if pad.any() and mistake != "source padding" else None
        for layer in twin.decoder.layers:
            x = layer(x, _t(memory), torch.from_numpy(blocked), None, kpm)
        logits = _np(twin.out_proj(x if mistake == "final norm" else twin.decoder.norm(x)))
    if mistake == "cache at 0":  # each step's keys written at 0, ..., t - 1
        cache = np.zeros_like(keys)
        for start, n in zip(np.cumsum([0, *chunks[:-1]]), chunks, strict=True):
            cache[:, :, :n] = keys[:, :, start:start + n]
        keys = cache
    return {"cached_keys": keys, "logits": logits}


def _cached_keys(qkv, H, mistake=""):
    """The keys (B, H, T, Dh) of the first layer's packed projection qkv (B, T, 3E) -- or, with
    ``mistake``, the queries or the values, cut in another order, or read as "interleaved" per
    head, (B, T, H, 3, Dh)."""
    B, T, E = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
    if mistake == "interleaved":
        return qkv.reshape(B, T, H, 3, E // H)[:, :, :, 1].transpose(0, 2, 1, 3)
    which = {"queries": 0, "values": 2}.get(mistake, 1)
    return qkv[..., which * E:(which + 1) * E].reshape(B, T, H, E // H).transpose(0, 2, 1, 3)


#: the decoder step's mistakes: what each one is -> the variant of :func:`_decoded` it gives
DECODER_MISTAKES = {
    "with the mask causal_mask(t, length + t) (new query i is position length + i: it sees the "
    "keys 0 .. length + i)": "offset mask",
    "without a causal mask among the new positions (new query i must not see the new ones "
    "after it)": "no mask",
    "attending to the new positions only (attend to every position so far, the cache's first "
    "length + t)": "new only",
    "with each step's positions counted from 0 (the new tokens are at positions length .. "
    "length + t - 1)": "positions",
    "without the embedding's scale sqrt(E) (transformer_decode scales the target's embedding; "
    "so must the step)": "no scale",
    "with the keys and values written at the start of the cache (write them at positions "
    "length .. length + t - 1)": "cache at 0",
    "without the decoder's final layer norm (params['decoder']['norm'], after the last layer)":
    "final norm",
    "with the source's padding not masked in the cross-attention (src_pad)": "source padding",
    "with >= where causal_mask has >: a position must see itself (key j is blocked only where "
    "j > i)":
    "diagonal",
    **{f"with the {part} cached as the keys: W_qkv's columns are the queries, then the keys, "
       "then the values (q, k, v = np.split(qkv, 3, axis=-1))": part
       for part in ("queries", "values")},
    "with q, k and v cut per head, (B, t, H, 3, Dh): W_qkv's columns are all the queries, then "
    "all the keys, then all the values (cut them in three, then split heads)": "interleaved",
}
