"""Toy sequence-to-sequence tasks, generated from a seed, with padding and batches.

Every task maps a source sequence of tokens to a target sequence:

- ``copy``     ``3 1 4 1 5`` -> ``3 1 4 1 5``
- ``reverse``  ``3 1 4 1 5`` -> ``5 1 4 1 3``
- ``sort``     ``3 1 4 1 5`` -> ``1 1 3 4 5``
- ``add``      ``4 7 + 2 8 5`` -> ``3 3 2`` (multi-digit addition; digits most significant first)

Token ids: 0 = ``<pad>``, 1 = ``<s>`` (begin), 2 = ``</s>`` (end), then the task's symbols. Targets
given to the model are ``<s> ... </s>`` padded with ``<pad>``; sources are padded only.

    task = get_task("reverse")
    train, test = make_splits(task, n_train=20000, n_test=500, seed=0)
    for src, tgt in iterate_batches(train, batch_size=64, rng=rng): ...
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from transformer_lab import _validate as v

PAD, BOS, EOS = 0, 1, 2
SPECIALS = ("<pad>", "<s>", "</s>")


@dataclass(frozen=True)
class Task:
    """A toy task: its name, vocabulary (specials first) and length range.

    Attributes:
        name: "copy", "reverse", "sort" or "add".
        vocab: token strings; index = token id; ``vocab[:3]`` are the special tokens.
        min_len, max_len: length range of the sources (for "add": digits per operand).
    """

    name: str
    vocab: tuple[str, ...]
    min_len: int
    max_len: int

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def max_src_len(self) -> int:
        """Longest source sequence the task produces."""
        return 2 * self.max_len + 1 if self.name == "add" else self.max_len

    @property
    def max_tgt_len(self) -> int:
        """Longest target including ``<s>`` and ``</s>``."""
        return (self.max_len + 1 if self.name == "add" else self.max_len) + 2

    def sample(self, rng: np.random.Generator) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """One (source, target) pair of token ids, without special tokens."""
        v.generator(rng, "rng")
        if self.name == "add":
            digits = {str(d): 3 + d for d in range(10)}
            plus = 13
            na, nb = rng.integers(self.min_len, self.max_len + 1, size=2)
            a = int(rng.integers(10 ** (na - 1) if na > 1 else 0, 10 ** na))
            b = int(rng.integers(10 ** (nb - 1) if nb > 1 else 0, 10 ** nb))
            src = [digits[c] for c in str(a)] + [plus] + [digits[c] for c in str(b)]
            return tuple(src), tuple(digits[c] for c in str(a + b))
        n = int(rng.integers(self.min_len, self.max_len + 1))
        src = rng.integers(len(SPECIALS), self.vocab_size, size=n).tolist()
        if self.name == "copy":
            tgt = src
        elif self.name == "reverse":
            tgt = src[::-1]
        else:
            tgt = sorted(src)
        return tuple(src), tuple(tgt)


TASKS = ("copy", "reverse", "sort", "add")


#: the longest sources a task makes: (symbols, digits per operand of "add")
LONGEST = (256, 18)


def get_task(name: str, min_len: int = 1, max_len: int | None = None,
             num_symbols: int = 10) -> Task:
    """The task ``name`` with sources of ``min_len``..``max_len`` symbols.

    Args:
        name: one of :data:`TASKS`.
        min_len, max_len: source length range (for "add": digits per operand; default 3;
            otherwise default 10).
        num_symbols: distinct symbols for copy/reverse/sort (ignored by "add": 10 digits + "+").
    """
    if name not in TASKS:
        raise ValueError(f"name must be one of {TASKS}, got {name!r}")
    if max_len is None:
        max_len = 3 if name == "add" else 10
    min_len = v.integer(min_len, "min_len", minimum=1)
    max_len = v.integer(max_len, "max_len", minimum=1)
    if max_len > LONGEST[name == "add"]:  # 18 digits: a sum of two fits in an int64
        raise ValueError(f"max_len must be at most {LONGEST[name == 'add']} for task {name!r}, "
                         f"got {max_len}")
    num_symbols = v.integer(num_symbols, "num_symbols", minimum=1)
    if min_len > max_len:
        raise ValueError(f"min_len must be at most max_len, got {min_len} > {max_len}")
    if name == "add":
        symbols = tuple(str(d) for d in range(10)) + ("+",)
    else:
        symbols = tuple(chr(ord("a") + i) if i < 26 else f"t{i}" for i in range(num_symbols))
    return Task(name, SPECIALS + symbols, min_len, max_len)


def make_splits(task: Task, n_train: int, n_test: int, seed: int = 0):
    """Distinct (source, target) pairs: a training set and a held-out set sharing no source.

    Sources are drawn until ``n_train + n_test`` distinct ones exist; then a random ``n_test``
    of them (chosen with the same seed) are held out and the rest, in random order, are the
    training set. Choosing the held-out sources at random among the distinct ones matters: the
    few short sources (a task with 10 symbols has only 10 of length 1) are drawn again and again
    early on, so "the first ``n_test`` drawn" would hold out nearly all of them and leave none to
    train on.

    Args:
        task: a :class:`Task` (from :func:`get_task`).
        n_train, n_test: sizes, integers >= 0.
        seed: an integer >= 0.

    Returns:
        train, test: lists of (source, target) tuples of token ids (no special tokens).
    """
    _check_task(task)
    n_train = v.integer(n_train, "n_train", minimum=0)
    n_test = v.integer(n_test, "n_test", minimum=0)
    rng = np.random.default_rng(v.integer(seed, "seed", minimum=0))
    want = n_train + n_test
    capacity = num_sources(task)
    if want > capacity:
        raise ValueError(f"n_train + n_test = {want} exceeds the {capacity} distinct sources of "
                         f"task {task.name!r} with lengths {task.min_len}..{task.max_len}")
    seen: dict[tuple, tuple] = {}
    attempts = 0
    while len(seen) < want:
        src, tgt = task.sample(rng)
        seen.setdefault(src, tgt)
        attempts += 1
        if attempts > 50 * want + 1000:
            raise ValueError(f"could not draw {want} distinct sources for task {task.name!r}; "
                             "use longer sequences or fewer examples")
    pairs = list(seen.items())
    order = rng.permutation(len(pairs))
    return [pairs[i] for i in order[n_test:]], [pairs[i] for i in order[:n_test]]


def _check_task(task) -> Task:
    if not isinstance(task, Task):
        raise TypeError(f"task must be a Task, e.g. get_task({task!r}) for a task name, "
                        f"got {type(task).__name__}")
    return task


def num_sources(task: Task) -> int:
    """How many distinct sources the task can produce (an upper bound for make_splits)."""
    if task.name == "add":
        numbers = sum(10 ** n - (10 ** (n - 1) if n > 1 else 0)
                      for n in range(task.min_len, task.max_len + 1))
        return numbers * numbers
    k = task.vocab_size - len(SPECIALS)
    return sum(k ** n for n in range(task.min_len, task.max_len + 1))


def pad(sequences: Sequence[Sequence[int]], bos_eos: bool = False,
        length: int | None = None) -> np.ndarray:
    """Pad token sequences into one (B, L) int64 array, ``<pad>`` after the end.

    Args:
        sequences: B sequences of token ids.
        bos_eos: wrap each sequence in ``<s> ... </s>`` first (for targets).
        length: L, an integer (default: the longest sequence).
    """
    if len(sequences) == 0:
        raise ValueError("sequences must contain at least one sequence")
    seqs = [([BOS, *s, EOS] if bos_eos else list(s)) for s in sequences]
    longest = max(map(len, seqs))
    length = longest if length is None else v.integer(length, "length", minimum=0)
    if length < longest:
        raise ValueError(f"length must be at least the longest sequence ({longest}), got {length}")
    out = np.full((len(seqs), length), PAD, dtype=np.int64)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return out


def iterate_batches(pairs: Sequence[tuple], batch_size: int, rng: np.random.Generator | None = None,
                    drop_last: bool = False) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Padded (source, target) batches over one pass of ``pairs``, shuffled when ``rng`` is given.

    The arguments are checked when the function is called (not at the first batch).

    Args:
        pairs: (source, target) pairs of token ids.
        batch_size: B, an integer >= 1.
        rng: a ``np.random.Generator`` that shuffles the pairs, or None (their order).
        drop_last: leave out the last batch when it has fewer than B pairs.

    Yields:
        src: (B, S) int64, padded; tgt: (B, T) int64, ``<s> ... </s>`` then padding.
    """
    batch_size = v.integer(batch_size, "batch_size", minimum=1)
    order = np.arange(len(pairs)) if rng is None else v.generator(rng).permutation(len(pairs))
    stop = len(pairs) - (len(pairs) % batch_size if drop_last else 0)
    return _batches(pairs, [order[i:i + batch_size] for i in range(0, stop, batch_size)])


def _batches(pairs, batches) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(src, tgt) padded, for each array of indices into ``pairs``."""
    for idx in batches:
        chunk = [pairs[i] for i in idx]
        yield pad([s for s, _ in chunk]), pad([t for _, t in chunk], bos_eos=True)


def bucketed_batches(pairs: Sequence[tuple], batch_size: int, rng: np.random.Generator,
                     pool: int = 16, drop_last: bool = False
                     ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Like :func:`iterate_batches` (one shuffled pass), but each batch holds sequences of
    similar length, so that little of it is padding.

    The shuffled pairs are taken ``pool * batch_size`` at a time; each such pool is sorted by
    source length (then target length), cut into batches, and its batches are yielded in a
    random order. Every pair still appears exactly once per pass.

    Args:
        pairs, batch_size, drop_last: as for :func:`iterate_batches`.
        rng: a ``np.random.Generator`` (required).
        pool: batches per sorted pool, an integer >= 1.
    """
    batch_size = v.integer(batch_size, "batch_size", minimum=1)
    pool = v.integer(pool, "pool", minimum=1)
    rng = v.generator(rng, "rng")
    order = rng.permutation(len(pairs))
    stop = len(pairs) - (len(pairs) % batch_size if drop_last else 0)
    return _batches(pairs, _bucketed_order(pairs, order[:stop], batch_size, pool, rng))


def _bucketed_order(pairs, order, batch_size, pool, rng) -> Iterator[np.ndarray]:
    """The index arrays of :func:`bucketed_batches`' batches, pool after pool."""
    chunk = pool * batch_size
    for start in range(0, len(order), chunk):
        idx = order[start:start + chunk]
        keys = np.array([(len(pairs[i][0]), len(pairs[i][1])) for i in idx]).reshape(-1, 2)
        idx = idx[np.lexsort((keys[:, 1], keys[:, 0]))]
        batches = [idx[b:b + batch_size] for b in range(0, len(idx), batch_size)]
        for k in rng.permutation(len(batches)):
            yield batches[k]


def strip(ids: Sequence[int]) -> tuple[int, ...]:
    """Token ids up to the first ``</s>``, without ``<s>`` and ``<pad>``."""
    out = []
    for t in (int(i) for i in ids):
        if t == EOS:
            break
        if t not in (PAD, BOS):
            out.append(t)
    return tuple(out)


def detokenize(ids: Sequence[int], task: Task) -> str:
    """Readable string of a sequence (specials dropped, stops at ``</s>``).

    Raises:
        ValueError: for an id outside the task's vocabulary ``[0, task.vocab_size)``.
    """
    _check_task(task)
    tokens = strip(ids)
    bad = [t for t in tokens if not 0 <= t < task.vocab_size]
    if bad:
        raise ValueError(f"ids must be token ids of task {task.name!r}, in [0, "
                         f"{task.vocab_size}), found {bad[0]}")
    sep = "" if task.name == "add" else " "
    return sep.join(task.vocab[t] for t in tokens)


def exact_match(predictions: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]) -> float:
    """Fraction of predictions equal to their target (both compared after :func:`strip`)."""
    _same_count(predictions, targets)
    same = [strip(p) == strip(t) for p, t in zip(predictions, targets, strict=True)]
    return float(np.mean(same))


def token_accuracy(predictions: Sequence[Sequence[int]],
                   targets: Sequence[Sequence[int]]) -> float:
    """Fraction of target tokens (``</s>`` included) predicted at the right position."""
    _same_count(predictions, targets)
    right = total = 0
    for p, t in zip(predictions, targets, strict=True):
        p, t = (*strip(p), EOS), (*strip(t), EOS)
        right += sum(a == b for a, b in zip(p, t, strict=False))  # lengths may differ
        total += len(t)
    return right / total


def _same_count(predictions, targets) -> None:
    if len(predictions) != len(targets):
        raise ValueError(f"predictions and targets must have the same length, got "
                         f"{len(predictions)} and {len(targets)}")
    if len(targets) == 0:
        raise ValueError("targets must not be empty")
