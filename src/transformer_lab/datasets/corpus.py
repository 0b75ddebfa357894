"""A character-level corpus that every installation of the course already has: the docstrings
of the installed NumPy -- real English and code, about two million characters, read at run time,
nothing downloaded -- and the n-gram baselines a language model must beat on it.

    from transformer_lab.datasets.corpus import load_corpus, ngram_bits_per_char

    corpus = load_corpus()                  # deterministic for a given NumPy (pinned: 2.4.6)
    corpus.train_ids, corpus.val_ids        # int64 token streams, documents separated by 0
    corpus.decode(corpus.val_ids[:200])     # back to text
    ngram_bits_per_char(corpus, 5)          # a smoothed 5-gram's validation bits per character

Its documents, its split (by document, near-duplicates together), its tokens and bits per
character: docs/maintainers.md, "Models and trainers".
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import json
import math
import subprocess
import sys
import zlib

import numpy as np

#: The NumPy namespaces whose public objects are read (sorted walk, each object once).
MODULES = ("numpy", "numpy.char", "numpy.dtypes", "numpy.exceptions", "numpy.fft", "numpy.lib",
           "numpy.lib.recfunctions", "numpy.lib.scimath", "numpy.lib.stride_tricks",
           "numpy.linalg", "numpy.ma", "numpy.polynomial", "numpy.polynomial.chebyshev",
           "numpy.polynomial.hermite", "numpy.polynomial.hermite_e",
           "numpy.polynomial.laguerre", "numpy.polynomial.legendre",
           "numpy.polynomial.polynomial", "numpy.random", "numpy.rec", "numpy.strings",
           "numpy.testing")
#: Token ids of the end of a document and of a character outside the vocabulary.
BOUNDARY, UNKNOWN = 0, 1
#: How the boundary and an unknown character are shown by :meth:`Corpus.decode`.
BOUNDARY_TEXT, UNKNOWN_TEXT = "\u00a7", "\u00bf"
#: The tokens: boundary, unknown, the newline and printable ASCII (" " .. "~").
VOCAB = ("<boundary>", "<unknown>", "\n", *map(chr, range(32, 127)))
#: Near-duplicate detection: substring length, shared fraction, boilerplate threshold.
SHINGLE, NEAR_DUPLICATE_SHARE, BOILERPLATE_DOCS = 32, 0.2, 20
#: A group goes to validation when crc32(its first name) % VAL_MODULUS == 0 (about 1 in 10).
VAL_MODULUS = 10
#: Documents shorter than this (in characters) are left out: "See `numpy.sum`." and the like.
MIN_DOC_CHARS = 20


@dataclasses.dataclass(frozen=True)
class Corpus:
    """The documents, their split, the vocabulary and the two token streams.

    Attributes:
        names, texts: the documents, in name order.
        is_val: bool per document, True for validation.
        groups: the near-duplicate group of each document (an integer id).
        vocab: the token strings, index = id (``vocab[0]`` the boundary, ``vocab[1]`` unknown).
        train_ids, val_ids: int64 token streams.
        numpy_version: the NumPy whose docstrings these are.
    """

    names: tuple[str, ...]
    texts: tuple[str, ...]
    is_val: np.ndarray
    groups: np.ndarray
    vocab: tuple[str, ...]
    train_ids: np.ndarray
    val_ids: np.ndarray
    numpy_version: str

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @functools.cached_property
    def _index(self) -> dict[str, int]:
        return {ch: i for i, ch in enumerate(self.vocab) if i > UNKNOWN}

    def encode(self, text: str) -> np.ndarray:
        """Token ids (int64) of ``text``; characters outside the vocabulary become UNKNOWN."""
        index = self._index
        return np.array([index.get(ch, UNKNOWN) for ch in text], dtype=np.int64)

    def decode(self, ids) -> str:
        """The text of token ids (the boundary shown as ``§``, unknown characters as ``¿``)."""
        shown = (BOUNDARY_TEXT, UNKNOWN_TEXT) + self.vocab[2:]
        return "".join(shown[i] for i in np.asarray(ids).reshape(-1).tolist())

    def stats(self) -> dict:
        """Counts of documents, groups, characters and tokens per split (a JSON-ready dict)."""
        val = self.is_val
        chars = np.array([len(t) for t in self.texts])
        return {"numpy": self.numpy_version, "documents": len(self.texts),
                "train_documents": int((~val).sum()), "val_documents": int(val.sum()),
                "groups": int(len(np.unique(self.groups))),
                "grouped_documents": int((np.bincount(self.groups)[self.groups] > 1).sum()),
                "train_chars": int(chars[~val].sum()), "val_chars": int(chars[val].sum()),
                "train_tokens": int(self.train_ids.size), "val_tokens": int(self.val_ids.size),
                "vocab_size": self.vocab_size,
                "unknown_tokens": int((self.train_ids == UNKNOWN).sum()
                                      + (self.val_ids == UNKNOWN).sum())}


# --------------------------------------------------------------------------------------------
# Reading the docstrings


def _undo_pasted_indent(doc: str) -> str:
    """``doc`` (cleaned by ``inspect.cleandoc``) as every Python reads it.

    Python 3.13 dedents docstrings when it compiles them. NumPy pastes text into some of its
    docstrings afterwards, indented for the source: a section appended at the end
    (``"\\n    Notes\\n    -----\\n    ..."``) and the description of the ``like`` parameter
    (8 spaces deep). Before 3.13 ``cleandoc`` removes that indentation with the docstring's own;
    from 3.13 on it stays. Both are taken back here, so a given NumPy gives the same corpus on
    every Python (checked on NumPy 2.4.6: 14 docstrings differ between 3.11 and 3.13 without
    this, none with it; no docstring of 3.11 or 3.12, nor of NumPy 2.2.6 on 3.10, is changed).
    """
    import re

    lines = doc.split("\n")

    def indent(line):
        return len(line) - len(line.lstrip(" "))

    def header(i, k):  # a section header indented by k, and its underline
        return lines[i].strip() and indent(lines[i]) == k \
            and re.fullmatch(" " * k + "-{3,}", lines[i + 1])

    for i in range(1, len(lines) - 1):  # an indented section after one that is not
        k = indent(lines[i])
        if k and header(i, k) and any(header(j, 0) for j in range(i)) \
                and all(indent(line) >= k for line in lines[i:] if line.strip()):
            lines[i:] = [line[k:] for line in lines[i:]]
            while not lines[-1]:  # the pasted text's last line: its indentation alone
                lines.pop()
            break
    for i, line in enumerate(lines[:-1]):  # the ``like`` parameter pasted 8 spaces deep
        if line == "like : array_like, optional" and indent(lines[i + 1]) == 8:
            j = i + 1
            while j < len(lines) and lines[j].strip() and indent(lines[j]) >= 8:
                lines[j] = lines[j][4:]
                j += 1
    return "\n".join(lines)


def _collect(modules) -> dict:
    """name -> cleaned docstring (see :func:`read_docstrings`); self-contained, so that it can
    run in a fresh interpreter."""
    import importlib
    import inspect
    import warnings

    def numpy_owned(obj):
        module = getattr(obj, "__module__", None)
        return isinstance(module, str) and (module == "numpy" or module.startswith("numpy."))

    found, seen_objects, seen_texts = {}, set(), set()

    def add(name, obj):
        doc = getattr(obj, "__doc__", None)
        if isinstance(doc, str):
            doc = _undo_pasted_indent(inspect.cleandoc(doc))
            if len(doc) >= MIN_DOC_CHARS and doc not in seen_texts:
                seen_texts.add(doc)
                found[name] = doc

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated aliases warn when touched
        for module_name in modules:
            module = importlib.import_module(module_name)
            if id(module) not in seen_objects:
                seen_objects.add(id(module))
                add(module_name, module)
            for attr in sorted(dir(module)):
                obj = getattr(module, attr, None) if not attr.startswith("_") else None
                if obj is None or inspect.ismodule(obj) or not numpy_owned(obj) \
                        or id(obj) in seen_objects:
                    continue
                seen_objects.add(id(obj))
                add(f"{module_name}.{attr}", obj)
                if inspect.isclass(obj):
                    for member, value in sorted(vars(obj).items()):
                        if member.startswith("_") or id(value) in seen_objects:
                            continue
                        if callable(value) or inspect.isdatadescriptor(value) or \
                                inspect.ismethoddescriptor(value):
                            seen_objects.add(id(value))
                            add(f"{module_name}.{attr}.{member}", value)
    return dict(sorted(found.items()))


def read_docstrings(modules=MODULES) -> dict[str, str]:
    """name -> cleaned docstring of every public NumPy object of ``modules`` (see the module
    docstring), in name order, exact duplicates kept once (under the name seen first).

    Read in a fresh interpreter (``python -I``) that imports NumPy and nothing else: other
    libraries edit NumPy's docstrings when they are imported (SciPy appends a section to
    ``numpy.sinc``'s), which would make the corpus depend on what the caller imported before.
    """
    code = (f"import json, sys\nMIN_DOC_CHARS = {MIN_DOC_CHARS}\n"
            f"{inspect.getsource(_undo_pasted_indent)}\n{inspect.getsource(_collect)}\n"
            f"json.dump(_collect({list(modules)!r}), sys.stdout)")
    done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                          encoding="utf-8", check=False)
    if done.returncode:
        raise RuntimeError(f"reading NumPy's docstrings failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


# --------------------------------------------------------------------------------------------
# Near-duplicate groups


def near_duplicate_groups(texts, shingle: int = SHINGLE, share: float = NEAR_DUPLICATE_SHARE,
                          boilerplate: int = BOILERPLATE_DOCS) -> np.ndarray:
    """Group id of each text: connected components of the near-duplicate relation
    (docs/maintainers.md, "Models and trainers"). -> int64 (n,), ids numbered in order of first
    appearance."""
    n = len(texts)
    keys, doc_of = [], []
    for i, text in enumerate(texts):
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
        if codes.size < shingle:
            continue
        h = np.zeros(codes.size - shingle + 1, dtype=np.uint64)
        for j in range(shingle):  # a polynomial hash of every substring, wrapping modulo 2^64
            h = h * np.uint64(1_000_003) + codes[j:codes.size - shingle + 1 + j]
        keys.append(np.unique(h >> np.uint64(16)))  # 48 bits of hash, each substring once
        doc_of.append(np.full(keys[-1].size, i, dtype=np.uint64))
    if not keys:
        return np.arange(n, dtype=np.int64)
    per_doc = np.zeros(n, dtype=np.int64)
    per_doc[[int(d[0]) for d in doc_of]] = [k.size for k in keys]
    key = np.sort((np.concatenate(keys) << np.uint64(16)) | np.concatenate(doc_of))
    hashes, docs = key >> np.uint64(16), (key & np.uint64(0xFFFF)).astype(np.int64)
    starts = np.flatnonzero(np.r_[True, hashes[1:] != hashes[:-1]])
    counts = np.diff(np.r_[starts, key.size])
    firsts, seconds = [], []
    for c in range(2, boilerplate + 1):  # substrings shared by c documents: their c(c-1)/2 pairs
        rows = docs[starts[counts == c][:, None] + np.arange(c)]  # (groups, c)
        for a, b in itertools.combinations(range(c), 2):
            firsts.append(rows[:, a])
            seconds.append(rows[:, b])
    pairs, shared = np.unique(np.concatenate(firsts) * n + np.concatenate(seconds),
                              return_counts=True)
    a, b = pairs // n, pairs % n
    linked = shared >= share * np.minimum(per_doc[a], per_doc[b])
    parent = list(range(n))

    def root(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for x, y in zip(a[linked].tolist(), b[linked].tolist(), strict=True):
        parent[root(x)] = root(y)
    roots = [root(i) for i in range(n)]
    number = {r: k for k, r in enumerate(dict.fromkeys(roots))}
    return np.array([number[r] for r in roots], dtype=np.int64)


# --------------------------------------------------------------------------------------------
# The corpus


def _stream(texts, index) -> np.ndarray:
    """The token stream of some documents: each text's ids, then the boundary."""
    parts = []
    for text in texts:
        parts.append(np.array([index.get(ch, UNKNOWN) for ch in text], dtype=np.int64))
        parts.append(np.array([BOUNDARY], dtype=np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


@functools.lru_cache(maxsize=2)
def load_corpus(val_modulus: int = VAL_MODULUS) -> Corpus:
    """Read, group, split and tokenise the corpus (about two seconds; cached per process)."""
    docs = read_docstrings()
    names, texts = tuple(docs), tuple(docs.values())
    groups = near_duplicate_groups(texts)
    first_name: dict[int, str] = {}
    for name, g in zip(names, groups.tolist(), strict=True):
        first_name.setdefault(g, name)  # names are sorted: the first is the smallest
    is_val = np.array([zlib.crc32(first_name[g].encode()) % val_modulus == 0
                       for g in groups.tolist()])
    train_texts = [t for t, val in zip(texts, is_val, strict=True) if not val]
    vocab = VOCAB
    index = {ch: i for i, ch in enumerate(vocab) if i > UNKNOWN}
    return Corpus(names=names, texts=texts, is_val=is_val, groups=groups, vocab=vocab,
                  train_ids=_stream(train_texts, index),
                  val_ids=_stream([t for t, val in zip(texts, is_val, strict=True) if val], index),
                  numpy_version=np.__version__)


# --------------------------------------------------------------------------------------------
# n-gram baselines


def _ngram_keys(ids: np.ndarray, n: int, base: int) -> np.ndarray:
    """The n-grams ending at positions n-1 .. len-1 of ``ids``, each as one integer."""
    keys = np.zeros(ids.size - n + 1, dtype=np.int64)
    for j in range(n):
        keys = keys * base + ids[j:ids.size - n + 1 + j]
    return keys


def _padded_streams(train_ids, val_ids, order: int, base: int):
    """The two streams after ``order - 1`` boundaries (a stream starts after a boundary), and
    the positions of ``val_ids[1:]`` in the padded validation stream."""
    if order * math.log2(base) > 62:
        raise ValueError(f"order {order} is too high to index {base}-token n-grams")
    pad = np.full(order - 1, BOUNDARY, dtype=np.int64)
    val = np.concatenate([pad, np.asarray(val_ids, dtype=np.int64)])
    return (np.concatenate([pad, np.asarray(train_ids, dtype=np.int64)]), val,
            np.arange(order, val.size))


def _lookup(sorted_keys: np.ndarray, values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """values[i] where sorted_keys[i] == query, 0 where a query is absent."""
    if sorted_keys.size == 0:
        return np.zeros(queries.shape)
    i = np.minimum(np.searchsorted(sorted_keys, queries), sorted_keys.size - 1)
    return np.where(sorted_keys[i] == queries, values[i], 0)


def ngram_probabilities(train_ids, val_ids, order: int, vocab_size: int,
                        smoothing: str = "kneser-ney"):
    """The probability an n-gram model trained on ``train_ids`` gives to every token of
    ``val_ids`` but the first, from the ``order - 1`` tokens before it (fewer at the start).

    smoothing "laplace": add-one, ``(c(h w) + 1) / (c(h) + V)``. smoothing "kneser-ney":
    interpolated Kneser-Ney (Chen & Goodman, 1998), ``P(w|h) = max(c(h w) - D, 0) / c(h) +
    D N(h) / c(h) P(w|h')`` with ``h'`` the context without its oldest token, ``N(h)`` the
    number of distinct tokens seen after ``h``, raw counts at the highest order and
    continuation counts (the number of distinct tokens seen *before* ``h' w``) below it, the
    uniform distribution at the bottom, a context never seen backing off entirely; the
    discount ``D = n1 / (n1 + 2 n2)`` per order (``n1``, ``n2``: n-grams seen once, twice).

    Returns:
        float64 (len(val_ids) - 1,), each in (0, 1].
    """
    base = vocab_size
    train, val, targets = _padded_streams(train_ids, val_ids, order, base)
    if smoothing == "laplace":
        u, c = np.unique(_ngram_keys(train, order, base), return_counts=True)
        queries = _ngram_keys(val, order, base)[targets - order + 1]  # the n-grams ending there
        c_hw = _lookup(u, c, queries)
        if order == 1:
            return (c_hw + 1) / (train.size + base)
        uc = np.unique(u // base)
        c_h = np.bincount(np.searchsorted(uc, u // base), weights=c)
        return (c_hw + 1) / (_lookup(uc, c_h, queries // base) + base)
    if smoothing != "kneser-ney":
        raise ValueError(f'smoothing must be "laplace" or "kneser-ney", got {smoothing!r}')
    prob = np.full(targets.size, 1.0 / base)
    raw_ids = train  # level n counts its n-grams after n - 1 boundaries, its (n+1)-grams after n
    for n in range(1, order + 1):
        queries = _ngram_keys(val, n, base)[targets - n + 1]
        if n == order:  # raw counts of the n-grams (the stream after n - 1 boundaries)
            counts = np.unique(_ngram_keys(raw_ids[order - n:], n, base), return_counts=True)
        else:  # continuation counts: distinct tokens seen before each n-gram
            longer = np.unique(_ngram_keys(raw_ids[order - 1 - n:], n + 1, base))  # n pads
            counts = np.unique(longer % base ** n, return_counts=True)
        prob = _kneser_ney_level(*counts, queries, prob, base)
    return prob


def kneser_ney_bits_per_char(corpus: Corpus, max_order: int) -> list[float]:
    """Validation bits per character of the Kneser-Ney models of every order 1 .. max_order,
    the same numbers as :func:`ngram_bits_per_char` but in one pass: the order-n model is the
    interpolation, with raw counts, of level n on the continuation-count model of order n - 1,
    which the next order reuses. About the cost of the highest order alone."""
    base = corpus.vocab_size
    train, val, targets = _padded_streams(corpus.train_ids, corpus.val_ids, max_order, base)
    lower = np.full(targets.size, 1.0 / base)  # the continuation model of order n - 1
    raw = np.unique(_ngram_keys(train[max_order - 1:], 1, base), return_counts=True)
    bits = []
    for n in range(1, max_order + 1):
        # the order-n n-grams, which the padding before the stream also starts
        longer = np.unique(_ngram_keys(train[max_order - 1 - n:], n + 1, base),
                           return_counts=True) if n < max_order else None
        queries = _ngram_keys(val, n, base)[targets - n + 1]
        top = _kneser_ney_level(*raw, queries, lower, base)
        bits.append(float(-np.log2(top).mean()))
        if longer is not None:
            continuation = np.unique(longer[0] % base ** n, return_counts=True)
            lower = _kneser_ney_level(*continuation, queries, lower, base)
            raw = longer
    return bits


def _kneser_ney_level(u, c, queries, lower, base):
    """One level of interpolated Kneser-Ney: sorted n-gram keys ``u`` with counts ``c`` (raw or
    continuation), the queried n-grams, the lower order's probabilities of them."""
    contexts = u // base
    uc, followers = np.unique(contexts, return_counts=True)  # N(h)
    totals = np.bincount(np.searchsorted(uc, contexts), weights=c)  # c(h)
    n1, n2 = np.sum(c == 1), np.sum(c == 2)
    d = n1 / (n1 + 2 * n2) if n1 + n2 else 0.5
    c_hw = _lookup(u, c, queries)
    c_h = _lookup(uc, totals, queries // base)
    n_h = _lookup(uc, followers, queries // base)
    seen = c_h > 0
    return np.where(seen, (np.maximum(c_hw - d, 0) + d * n_h * lower) / np.where(seen, c_h, 1),
                    lower)


def ngram_bits_per_char(corpus: Corpus, order: int, smoothing: str = "kneser-ney") -> float:
    """Validation bits per character of an n-gram model of the training stream."""
    p = ngram_probabilities(corpus.train_ids, corpus.val_ids, order, corpus.vocab_size,
                            smoothing)
    return float(-np.log2(p).mean())
