"""Translation data: English number expressions -> French (or German), written by ``num2words``.

The pairs show real phenomena of French (counting by twenties, agreement, ``et un``) and
German (units before tens): notebook 12, section 1.

Four kinds of expression: cardinals from 0 to a million, ordinals (1 to 9,999), years (1000 to
2099) and amounts of money in euros (1 to 999 euros and 1 to 99 cents). Two corrections to
``num2words`` 0.5.14's French ordinals: it writes ``quatre-vingtsième`` and ``deux centsième``
where French writes ``quatre-vingtième`` and ``deux centième`` (the plural s drops before the
suffix); :func:`to_words` fixes them.

**Split by number**: the training, validation and test sets share no number (an amount of money
counts as its number of cents), so a test number was never seen in training in any form.
**Tokens are characters**, with the ids of :mod:`transformer_lab.datasets.tasks`:
0 = ``<pad>``, 1 = ``<s>``, 2 = ``</s>``, then the characters in sorted order.

    data = make_translation_data(n_train=20000, n_val=500, n_test=1000, seed=0)
    data.test[0]                  # Example(kind='cardinal', number=..., source=..., target=...)
    src, tgt = data.pairs("test")[0]             # token ids, no specials
    data.tgt_vocab.decode(tgt)                   # the French string
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

import numpy as np
from num2words import num2words

from transformer_lab import _validate as v
from transformer_lab.datasets.tasks import BOS, EOS, PAD, SPECIALS

LANGUAGES = ("fr", "de")
KINDS = ("cardinal", "ordinal", "year", "money")
#: how often each kind is drawn
KIND_WEIGHTS = (0.5, 0.15, 0.15, 0.2)
#: the rules :func:`rules_of` tags, per target language (the error analysis counts by rule)
RULES = {
    "fr": ("vigesimal", "quatre-vingts", "cents", "et un", "hyphen", "thousands"),
    "de": ("units-before-tens", "one word", "thousands"),
}


@dataclass(frozen=True)
class Example:
    """One pair: its kind, the number (cents for money), the two strings and the rules that
    the target shows (:func:`rules_of`)."""

    kind: str
    number: int
    source: str
    target: str
    rules: tuple[str, ...]


@dataclass(frozen=True)
class Vocab:
    """A character vocabulary: ``tokens[i]`` is the string of id ``i``; the first three are
    ``<pad>``, ``<s>``, ``</s>``."""

    tokens: tuple[str, ...]

    @property
    def size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> tuple[int, ...]:
        """The ids of the characters of ``text`` (no specials)."""
        index = {t: i for i, t in enumerate(self.tokens)}
        missing = sorted(set(text) - set(index))
        if missing:
            raise ValueError(f"text has characters outside the vocabulary: {missing}")
        return tuple(index[ch] for ch in text)

    def decode(self, ids: Sequence[int]) -> str:
        """The string of ``ids`` up to the first ``</s>``, without ``<s>`` and ``<pad>``."""
        out = []
        for i in (int(i) for i in ids):
            if i == EOS:
                break
            if i not in (PAD, BOS):
                out.append(self.tokens[i])
        return "".join(out)


def build_vocab(texts: Sequence[str]) -> Vocab:
    """The specials, then every character of ``texts``, sorted."""
    return Vocab(SPECIALS + tuple(sorted(set("".join(texts)))))


#: numbers whose words hold every character a language's number words use
_COVERING = ([(n, "cardinal") for n in (*range(101), 200, 1000, 2000, 10**6)]
             + [(n, "ordinal") for n in (*range(1, 101), 200, 1000)]
             + [(n, "year") for n in (1000, 1984, 2000, 2024)]
             + [(n, "money") for n in (101, 201, 150, 1234)])


@functools.cache
def vocabularies(lang: str = "fr") -> tuple[Vocab, Vocab]:
    """(English, ``lang``) character vocabularies: fixed for a language (the characters of a
    covering set of numbers), whatever the data drawn, so that a checkpoint fits any split."""
    if lang not in LANGUAGES:
        raise ValueError(f"lang must be one of {LANGUAGES}, got {lang!r}")
    return (build_vocab([to_words(n, k, "en") for n, k in _COVERING]),
            build_vocab([to_words(n, k, lang) for n, k in _COVERING]))


@functools.lru_cache(maxsize=200_000)
def to_words(number: int, kind: str, lang: str) -> str:
    """``number`` in words in language ``lang`` ("en", "fr", "de"), as a ``kind`` (for
    "money", ``number`` is in cents)."""
    if kind == "money":
        amount = Decimal(number) / 100
        return num2words(amount, lang=lang, to="currency", currency="EUR")
    text = num2words(number, lang=lang, to={"cardinal": "cardinal", "ordinal": "ordinal",
                                             "year": "year"}[kind])
    if lang == "fr" and kind == "ordinal":  # num2words 0.5.14 keeps a plural s before -ième
        text = text.replace("vingtsième", "vingtième").replace("centsième", "centième")
    return text


def rules_of(target: str, number: int, kind: str, lang: str) -> tuple[str, ...]:
    """The rules of ``lang`` that ``target`` shows (see :data:`RULES`)."""
    found = []
    if lang == "fr":
        if re.search(r"soixante-dix|soixante et onze|soixante-douze|soixante-treize|"
                     r"soixante-quatorze|soixante-quinze|soixante-seize|quatre-vingt", target):
            found.append("vigesimal")
        if re.search(r"quatre-vingts\b", target):
            found.append("quatre-vingts")
        if re.search(r"cents\b", target):
            found.append("cents")
        if re.search(r"\bet (un|onze)", target):
            found.append("et un")
        if "-" in target:
            found.append("hyphen")
    else:
        if re.search(r"und(zwanzig|dreißig|vierzig|fünfzig|sechzig|siebzig|achtzig|neunzig)",
                     target):
            found.append("units-before-tens")
        if any(len(word) > 12 for word in target.split()):
            found.append("one word")
    if kind != "money" and number >= 1000 or kind == "money" and number >= 100_000:
        found.append("thousands")
    return tuple(found)


def _draw(kind: str, rng: np.random.Generator) -> int:
    """A number for ``kind``: its number of digits uniform first (so that short numbers are not
    swamped by the many long ones), then the number uniform among those."""
    if kind == "year":
        return int(rng.integers(1000, 2100))
    if kind == "money":
        euros = _digits_uniform(rng, 1, 3)
        return 100 * max(euros, 1) + int(rng.integers(1, 100))
    if kind == "ordinal":
        return max(1, _digits_uniform(rng, 1, 4))
    if rng.random() < 0.002:
        return 1_000_000
    return _digits_uniform(rng, 1, 6)


def _digits_uniform(rng, lo: int, hi: int) -> int:
    n = int(rng.integers(lo, hi + 1))
    return int(rng.integers(0 if n == 1 else 10 ** (n - 1), 10 ** n))


def make_example(number: int, kind: str, lang: str = "fr") -> Example:
    """The :class:`Example` of one number."""
    source = to_words(number, kind, "en")
    target = to_words(number, kind, lang)
    return Example(kind, number, source, target, rules_of(target, number, kind, lang))


@dataclass
class TranslationData:
    """The three splits, the two vocabularies and how they were made."""

    lang: str
    seed: int
    train: list
    val: list
    test: list
    src_vocab: Vocab
    tgt_vocab: Vocab

    def split(self, name: str) -> list:
        if name not in ("train", "val", "test"):
            raise ValueError(f'name must be "train", "val" or "test", got {name!r}')
        return getattr(self, name)

    def pairs(self, name: str) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """(source ids, target ids) of a split, without specials: what
        :func:`transformer_lab.datasets.tasks.iterate_batches` pads into batches."""
        return [(self.src_vocab.encode(e.source), self.tgt_vocab.encode(e.target))
                for e in self.split(name)]

    @property
    def max_src_len(self) -> int:
        return max(len(e.source) for s in (self.train, self.val, self.test) for e in s)

    @property
    def max_tgt_len(self) -> int:
        """Longest target with ``<s>`` and ``</s>``."""
        return 2 + max(len(e.target) for s in (self.train, self.val, self.test) for e in s)


#: the most examples a data set draws (its splits share no number)
MOST_EXAMPLES = 200_000


def make_translation_data(n_train: int = 20_000, n_val: int = 500, n_test: int = 1000,
                          seed: int = 0, lang: str = "fr") -> TranslationData:
    """English -> ``lang`` number expressions, split by number (see the module docstring).

    Examples are drawn (kind by :data:`KIND_WEIGHTS`, then the number) until ``n_train + n_val
    + n_test`` distinct sources exist; the distinct numbers are shuffled and dealt, every
    example of a number together (1984 as a cardinal and as a year), to the test set while it
    has room for them, else to the validation set while it has room, else to training.

    Args:
        n_train, n_val, n_test: sizes, integers (n_train >= 1).
        seed: an integer >= 0; the same seed gives the same splits.
        lang: "fr" or "de".
    """
    n_train = v.integer(n_train, "n_train", minimum=1)
    n_val = v.integer(n_val, "n_val", minimum=0)
    n_test = v.integer(n_test, "n_test", minimum=0)
    seed = v.integer(seed, "seed", minimum=0)
    if lang not in LANGUAGES:
        raise ValueError(f"lang must be one of {LANGUAGES}, got {lang!r}")
    want = n_train + n_val + n_test
    if want > MOST_EXAMPLES:
        raise ValueError(f"n_train + n_val + n_test must be at most {MOST_EXAMPLES}, got {want}")
    rng = np.random.default_rng(seed)
    drawn: dict[str, Example] = {}  # source -> example
    while len(drawn) < want:
        for k in rng.choice(len(KINDS), size=want, p=KIND_WEIGHTS):
            kind = KINDS[k]
            e = make_example(_draw(kind, rng), kind, lang)
            drawn.setdefault(e.source, e)
            if len(drawn) == want:
                break
    by_key: dict[tuple[bool, int], list] = {}
    for source in sorted(drawn):
        e = drawn[source]
        by_key.setdefault((e.kind == "money", e.number), []).append(e)
    keys = sorted(by_key)
    splits: list[list] = [[], [], []]  # test, validation, training
    room = [n_test, n_val, want]
    for i in rng.permutation(len(keys)):
        group = by_key[keys[i]]
        which = next(j for j in range(3) if len(splits[j]) + len(group) <= room[j])
        splits[which].extend(group)
    test, val, train = splits
    order = rng.permutation(len(train))
    train = [train[i] for i in order]
    src_vocab, tgt_vocab = vocabularies(lang)
    return TranslationData(lang, seed, train, val, test, src_vocab, tgt_vocab)


def rule_accuracy(examples: Sequence[Example], correct: Sequence[bool]) -> dict[str, tuple]:
    """Per rule and per kind: (right, total) over ``examples`` (``correct[i]``: was example
    ``i`` translated exactly right)."""
    if len(examples) != len(correct):
        raise ValueError(f"examples and correct must have the same length, got "
                         f"{len(examples)} and {len(correct)}")
    counts: dict[str, list] = {}
    for e, ok in zip(examples, correct, strict=True):
        for tag in (e.kind, *e.rules):
            c = counts.setdefault(tag, [0, 0])
            c[0] += bool(ok)
            c[1] += 1
    return {tag: tuple(c) for tag, c in counts.items()}
