"""Checks of notebook 11_tokenization: GPT-2's byte-level BPE (``transformer_lab.core.bpe``).

Expected answers come from Hugging Face ``tokenizers`` where it has the piece: its ByteLevel
pre-tokenizer (GPT-2's byte map and pattern), its BPE model (encoding by merge rank, fed the
merges of the case) and its ByteLevel decoder. Counting pairs, merging and training have no
counterpart there with the course's ids and ties: their references are hidden (the handout
stores their public answers). ``tokenizers`` is imported on first use, where an expected answer
is computed; the cases and the runs need NumPy and the standard library only.
"""

from __future__ import annotations

import collections
import functools
import itertools
import numbers
import re
import string

from transformer_lab.checks._torch_helpers import LazyModule
from transformer_lab.checks.framework import Case, Check, later_rng

tokenizers = LazyModule("tokenizers")

#: Texts for the cases: every branch of GPT-2's pattern, and of UTF-8 (1 to 4 bytes).
TEXTS = {
    "plain words": "Return the sum of the array elements over the given axis.",
    "accents and CJK": "Café naïve résumé, Gödel; 世界你好。",
    "emoji": "hi 🌍👋 there 🙂",
    "runs of whitespace": "a  b\t\tc\n\n\nd   \n e ",
    "contractions": "I'm sure it's what they've said we'll do, isn't it? They're here; we'd go",
    "digits and symbols": "x = 3.14159 * 2**10 + 1e-5 -> 42!!",
}
#: Texts for further public cases of the pattern (added later: TEXTS' cases stay as they were).
MORE_TEXTS = {
    "uppercase contractions (GPT-2's are lowercase only)":
    "I'M SURE IT'S WHAT THEY'VE SAID, DON'T",
    "numbers beyond 0-9 (superscripts, fractions, other scripts)": "x²+1 = ½) ١٢٣ Ⅻ",
    "Devanagari (its vowel signs are marks, not letters)": "नमस्ते दुनिया, हिन्दी",
}
#: GPT-2's pattern (the hints of check-pretokenize vary it)
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


### BEGIN HIDDEN TESTS
HIDDEN_TEXTS = {
    "a trailing run of spaces": "end   ",
    "only whitespace": " \n\t ",
    "uppercase contractions and apostrophes": "DON'T 'tis o'clock rock'n'roll",
    "code": "def f(x):\n    return x ** 2  # square",
    "one emoji": "🌍",
}
### END HIDDEN TESTS


@functools.cache
def _gpt2_chars() -> tuple[str, ...]:
    """GPT-2's character for each byte, read from ``tokenizers``' ByteLevel pre-tokenizer: one
    character for each byte that valid UTF-8 uses; the 13 bytes it never uses (0xC0, 0xC1,
    0xF5..0xFF) are printable Latin-1 characters, which GPT-2 keeps as they are."""
    pre = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    # ASCII; a character for each lead byte of 2, 3 and 4 bytes; the 64 continuation bytes
    codes = [*range(0x80), *range(0x80, 0x800, 0x40), 0x800, *range(0x1000, 0x10000, 0x1000),
             0x10000, 0x40000, 0x80000, 0xC0000, 0x100000, *range(0x80, 0xC0)]
    found: dict[int, str] = {}
    for char in map(chr, codes):
        mapped = "".join(piece for piece, _ in pre.pre_tokenize_str(char))
        found.update(zip(char.encode("utf-8"), mapped, strict=True))
    return tuple(found.get(b, chr(b)) for b in range(256))


def _pieces(text: str) -> list[str]:
    """GPT-2's pieces of ``text``, as ``tokenizers`` cuts them (offsets into the text)."""
    pre = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return [text[a:b] for _, (a, b) in pre.pre_tokenize_str(text)]


def _merge(word, pair, new_id) -> tuple[int, ...]:
    """``merge_pair`` by ``str.replace`` (which reads left to right, without overlaps)."""
    text = "".join(map(chr, word))
    return tuple(map(ord, text.replace(chr(pair[0]) + chr(pair[1]), chr(new_id))))


def _random_merges(rng, text: str, n: int) -> list[tuple[int, int]]:
    """``n`` merges of pairs that occur in ``text``'s words, drawn at random (not by frequency,
    so that the order of the merges, not the text, decides an encoding); two merges never make
    the same bytes."""
    # rough words (not GPT-2's exact pieces: any that a merge may apply to)
    words = [tuple(p.encode("utf-8")) for p in re.findall(r" ?\w+| ?[^\w\s]+|\s+", text)]
    strings = [bytes([b]) for b in range(256)]  # each id's bytes
    merges: list[tuple[int, int]] = []
    while len(merges) < n:
        made = set(strings)
        pairs = sorted({p for w in words for p in zip(w, w[1:], strict=False)
                        if strings[p[0]] + strings[p[1]] not in made})
        if not pairs:
            break
        a, b = pairs[int(rng.integers(len(pairs)))]
        words = [_merge(w, (a, b), 256 + len(merges)) for w in words]  # the next id
        merges.append((a, b))
        strings.append(strings[a] + strings[b])
    return merges


def _hf_bpe(merges, byte_level: bool):
    """A ``tokenizers`` BPE model of ``merges``: on GPT-2's characters (``byte_level``, with its
    pre-tokenizer, a whole Tokenizer) or on the plain ids as characters (a bare model)."""
    tk = tokenizers
    strings = list(_gpt2_chars()) if byte_level else [chr(0x4E00 + i) for i in range(256)]
    for a, b in merges:  # each id's token: the 256 bytes, then the merges
        strings.append(strings[a] + strings[b])
    model = tk.models.BPE({s: i for i, s in enumerate(strings)},
                          [(strings[a], strings[b]) for a, b in merges])
    if not byte_level:
        return model
    tok = tk.Tokenizer(model)
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return tok


def _hf_ids(model, word) -> list[int]:
    """The ids of ``word`` (its bytes) by a bare model of :func:`_hf_bpe`."""
    return [t.id for t in model.tokenize("".join(chr(0x4E00 + b) for b in word))]


def _ranks(merges) -> dict:
    """Each merge's pair -> its rank, the order training learned it in."""
    return {tuple(p): r for r, p in enumerate(merges)}


def _pair_key(pair) -> str:
    return str(tuple(int(x) for x in pair))


def _as_words(word_list, byte=int) -> dict:
    return {tuple(map(byte, w)): n for w, n in word_list}


# --------------------------------------------------------------------------------------------
# Bytes and pieces (§2, §3)


class BytesToUnicode(Check, id="check-bytes-to-unicode", functions=("bytes_to_unicode",)):
    def cases(self, rng):
        yield Case("printable ASCII, bytes 33..126 (they keep their character)",
                   (list(range(33, 127)),))
        yield Case("the space, byte 32, and the newline, byte 10", ([32, 10],))
        yield Case("the control bytes 0..31 and 127", ([*range(32), 127],))
        yield Case("every byte, 0..255", (list(range(256)),))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("bytes 128..255", (list(range(128, 256)),))
        yield Case("the soft hyphen, byte 173, and its neighbours", ([172, 173, 174],))
    ### END HIDDEN TESTS

    def run(self, f, bytes_):
        mapping = f.bytes_to_unicode()
        if not isinstance(mapping, dict):
            raise TypeError(f"a {type(mapping).__name__} came back; bytes_to_unicode returns a "
                            "dict byte -> str")
        key = next((k for k in mapping if not isinstance(k, numbers.Integral)), None)
        if key is not None:
            raise TypeError(f"a dict with the key {key!r} came back; its keys are the bytes, "
                            "the ints 0..255")
        return [mapping.get(b, f"nothing for byte {b}") for b in bytes_]

    def expected(self, bytes_):
        return [_gpt2_chars()[b] for b in bytes_]

    def mistakes(self, bytes_):
        printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
        others = [b for b in range(256) if b not in printable]
        shifted = {b: chr(255 + n) for n, b in enumerate(others)}
        right = self.expected(bytes_)
        return {"treating the soft hyphen, byte 173, as printable (Latin-1 shows nothing for "
                "it: it is the last of the 68 to get a stand-in)":
                lambda: [chr(b) if b == 173 else c for b, c in zip(bytes_, right, strict=True)],
                "keeping every byte's own character, chr(b) (the space, the newline and the "
                "control bytes are not printable)": lambda: [chr(b) for b in bytes_],
                "giving a non-printable byte chr(256 + b) (they get 256, 257, ... in byte "
                "order: the n-th of them chr(256 + n))":
                lambda: [chr(256 + b) if b in others else chr(b) for b in bytes_],
                "counting the stand-ins from chr(255) (the first is chr(256), 'Ā')":
                lambda: [shifted.get(b, chr(b)) for b in bytes_]}


class Pretokenize(Check, id="check-pretokenize", functions=("pretokenize",)):
    def cases(self, rng):
        return [Case(name, (text,)) for name, text in {**TEXTS, **MORE_TEXTS}.items()]

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        return [Case(name, (text,)) for name, text in HIDDEN_TEXTS.items()]
    ### END HIDDEN TESTS

    def run(self, f, text):
        return list(f.pretokenize(text))

    def expected(self, text):
        return _pieces(text)

    def mistakes(self, text):
        import regex  # the package's dependency for \p{L}; imported where a hint is computed

        contractions = GPT2_PATTERN[:GPT2_PATTERN.index("| ?")]
        wrong = {
            "without the optional space before letters, digits and symbols (' ?': a word "
            "keeps the space before it)": GPT2_PATTERN.replace(" ?", ""),
            "without \\s+(?!\\S), or with it after \\s+, which then takes every run first "
            "(alternatives are tried left to right; a run of spaces before a word leaves its "
            "last space to the word: 'a   b' is 'a', '  ', ' b')":
            GPT2_PATTERN.replace(r"|\s+(?!\S)", ""),
            "with \\d for the digits (\\d has the decimal digits only: ², ½ and Ⅻ are \\p{N} "
            "too)": GPT2_PATTERN.replace(r"\p{N}", r"\d"),
            "with [^\\W\\d_] for the letters (it takes marks too: Devanagari's vowel signs are "
            "\\p{M}, not \\p{L})":
            GPT2_PATTERN.replace(r"\p{L}+", r"[^\W\d_]+"),
            "matching the contractions in any case (GPT-2's are lowercase only: in \"DON'T\", "
            "' and T are pieces of their own)":
            f"(?i:{contractions})" + GPT2_PATTERN[len(contractions):],
            "without all seven contractions ('s 't 're 've 'm 'll 'd: in \"they're\" the "
            "piece is 're, one piece)": GPT2_PATTERN.replace("'re|", "").replace("'d|", ""),
            "without any contractions ('s 't 're 've 'm 'll 'd)":
            GPT2_PATTERN[len(contractions) + 1:]}
        found = {d: functools.partial(regex.findall, p, text) for d, p in wrong.items()}
        return {**found, "splitting on whitespace (text.split() loses the spaces: the pieces "
                         "must join back into the text)": lambda: text.split()}


class WordCounts(Check, id="check-word-counts", functions=("word_counts",)):
    def cases(self, rng):
        yield Case("a word three times, at the start and after spaces", ("the cat the the",))
        yield Case("accents: two bytes a character", ("Café café naïve",))
        yield Case("contractions and whitespace", (TEXTS["contractions"] + "\n\n  ",))
        yield Case("emoji: four bytes a character", (TEXTS["emoji"],))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("the empty text", ("",))
        yield Case("CJK", ("世界 世界 你好",))
    ### END HIDDEN TESTS

    def run(self, f, text):
        counts = f.word_counts(text)
        if not isinstance(counts, dict):
            raise TypeError(f"a {type(counts).__name__} came back; word_counts returns a dict "
                            "word -> count")
        for word in counts:
            if not isinstance(word, tuple) or not all(isinstance(b, numbers.Integral)
                                                      for b in word):
                raise TypeError(f"a dict with the key {word!r} came back; each key is a "
                                "piece's UTF-8 bytes as a tuple of ints, "
                                "tuple(piece.encode('utf-8'))")
        return {str(list(map(int, word))): int(n) for word, n in counts.items()}

    def expected(self, text, whole=False, to_ids=lambda piece: piece.encode("utf-8")):
        """How often each piece occurs, keyed by its ids written as a list (mistakes:
        ``whole``, the text as one piece; ``to_ids``, other ids than its UTF-8 bytes)."""
        pieces = [text] if whole else _pieces(text)
        return dict(collections.Counter(str(list(to_ids(p))) for p in pieces))

    def mistakes(self, text):
        return {"with the characters' code points (ord) instead of the UTF-8 bytes "
                "(piece.encode('utf-8'))":
                lambda: self.expected(text, to_ids=lambda p: map(ord, p)),
                "counting the whole text as one word (cut it into pieces with pretokenize "
                "first: merges never cross two pieces)": lambda: self.expected(text, whole=True)}


# --------------------------------------------------------------------------------------------
# Counting and merging pairs (§4)


class PairCounts(Check, id="check-pair-counts", functions=("pair_counts",)):
    def cases(self, rng):
        yield Case("one word, once", ([[[104, 101, 108, 108, 111], 1]],))
        yield Case("words counted 3 and 2 times", ([[[104, 105], 3], [[104, 105, 33], 2]],))
        yield Case("two words: no pair across them", ([[[97, 98], 1], [[99, 100], 4]],))
        yield Case("'aaaa' five times: the pair (97, 97) occurs 3 times in it",
                   ([[[97, 97, 97, 97], 5], [[98], 7]],))
        yield Case("ids of merges (256 and up)", ([[[256, 257, 256], 2], [[257, 256], 1]],))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("no words", ([],))
        yield Case("words of one id only", ([[[5], 3], [[6], 1]],))
        words = [[rng.integers(97, 100, size=int(rng.integers(1, 6))).tolist(),
                  int(rng.integers(1, 9))] for _ in range(12)]
        yield Case("twelve random words", ([[list(w), n] for w, n in _as_words(words).items()],))

    def expected(self, words):
        return {_pair_key(pair): n for pair, n in _pair_counts(words).items()}

    def mistakes(self, words):
        joined = [i for word, n in words for i in word]
        return {"counting each pair once per word (weight it by the word's count)":
                lambda: self.expected([[w, 1] for w, _ in words]),
                "counting the pairs across two words (count within each word only)":
                lambda: self.expected([[joined, 1]]) if len(words) > 1 else {},
                "counting each pair once in a word however often it occurs there (a set): "
                "'aaaa' holds (a, a) three times": lambda: {
                    _pair_key(pair): n for pair, n in _pair_counts(
                        [[pair, n] for word, n in words
                         for pair in set(zip(word, word[1:], strict=False))]).items()},
                "pairing each id with the one two places on (zip(word, word[2:])): a pair is two "
                "neighbours, zip(word, word[1:])": lambda: {
                    _pair_key(pair): n for pair, n in _pair_counts(
                        [[word[::2], n] for word, n in words] +
                        [[word[1::2], n] for word, n in words]).items()}}
    ### END HIDDEN TESTS

    def run(self, f, words):
        return {_pair_key(pair): int(n) for pair, n in f.pair_counts(_as_words(words)).items()}


class MergePair(Check, id="check-merge-pair", functions=("merge_pair",)):
    def cases(self, rng):
        yield Case("'aaa': the first two merge, the third stays", ((97, 97, 97), (97, 97), 256))
        yield Case("'aaaa': two merges", ((97, 97, 97, 97), (97, 97), 256))
        yield Case("the pair twice, apart", ((1, 2, 3, 1, 2), (1, 2), 300))
        yield Case("the pair at the end", ((5, 6, 7), (6, 7), 261))
        yield Case("the pair absent (b, a only)", ((98, 97, 98), (97, 97), 256))
        yield Case("one id", ((97,), (97, 97), 256))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("'aaaaa'", ((97,) * 5, (97, 97), 400))
        yield Case("the empty word", ((), (1, 2), 256))
        yield Case("ids of earlier merges", ((256, 300, 256, 300, 300), (256, 300), 301))
    ### END HIDDEN TESTS

    def run(self, f, word, pair, new_id):
        merged = f.merge_pair(tuple(word), tuple(pair), new_id)
        return {"ids": [int(i) for i in merged], "type": type(merged).__name__}

    def expected(self, word, pair, new_id):
        return {"ids": list(_merge(word, pair, new_id)), "type": "tuple"}

    def mistakes(self, word, pair, new_id):
        no_skip = [new_id if p == tuple(pair) else p[0]
                   for p in itertools.zip_longest(word, word[1:])]  # (id, next id or None)
        return {"moving on by one id after a merge, so the pair's second id is read again (in "
                "'aaa' only the first two merge: move on past both)":
                lambda: {"ids": no_skip, "type": "tuple"},
                "returning a list (a word is a tuple: it is a key of the words' dict, which a "
                "list cannot be)": lambda: {**self.expected(word, pair, new_id), "type": "list"},
                "merging from the right (in 'aaa' the first two merge: read left to right)":
                lambda: {"ids": list(_merge(word[::-1], pair[::-1], new_id)[::-1]),
                         "type": "tuple"},
                "merging the first occurrence only (every occurrence merges)":
                lambda: {"ids": list(_merge_first(word, pair, new_id)), "type": "tuple"},
                "dropping the last id when no merge takes it (a loop while i < len(word) - 1 "
                "never reaches it: copy it too)": lambda: {
                    "ids": _merge_short(word, pair, new_id), "type": "tuple"}}


def _merge_short(word, pair, new_id) -> list[int]:
    """``merge_pair`` by a loop ``while i < len(word) - 1`` (a mistake: an id left at the end
    is dropped)."""
    out, i = [], 0
    while i < len(word) - 1:
        merged = tuple(word[i:i + 2]) == tuple(pair)
        out.append(new_id if merged else word[i])
        i += 2 if merged else 1
    return out


def _merge_first(word, pair, new_id) -> tuple[int, ...]:
    """``merge_pair`` of the pair's first occurrence only (a mistake)."""
    i = next((i for i in range(len(word) - 1) if tuple(word[i:i + 2]) == tuple(pair)), None)
    return tuple(word) if i is None else (*word[:i], new_id, *word[i + 2:])


# --------------------------------------------------------------------------------------------
# Training (§5)


def _words_of(rng, n_words: int, alphabet: str, max_len: int) -> list:
    words: collections.Counter = collections.Counter()
    for _ in range(n_words):
        text = "".join(rng.choice(list(alphabet), size=int(rng.integers(1, max_len + 1))))
        words[tuple(text.encode("utf-8"))] += int(rng.integers(1, 20))
    return [[list(w), n] for w, n in words.items()]


### BEGIN HIDDEN TESTS
def _pair_counts(words) -> dict[tuple[int, int], int]:
    """Pair -> how often it occurs in ``words`` ((word, n) pairs: each word n times)."""
    counts: dict[tuple[int, int], int] = {}
    for word, n in words:
        for pair in zip(word, word[1:], strict=False):
            counts[pair] = counts.get(pair, 0) + n
    return counts


def _naive_train(words, num_merges, larger_first=False, first_id=256):
    """The definition of training: recount every pair after every merge (mistakes: ties to the
    ``larger_first`` pair, new ids from ``first_id``)."""
    words = {tuple(w): n for w, n in words}
    merges = []
    for new_id in range(first_id, first_id + num_merges):
        counts = _pair_counts(words.items())
        if not counts:
            break
        order = sorted(counts, reverse=larger_first)
        best = max(order, key=counts.get)  # the first of the most frequent
        merges.append(list(best))
        words = {_merge(w, best, new_id): n for w, n in words.items()}  # still distinct
    return merges


def _stale_train(words, num_merges):
    """The mistake of counting once: the pairs ranked by their counts before any merge."""
    counts = _pair_counts(words)
    return [list(p) for p in sorted(counts, key=lambda p: (-counts[p], p))[:num_merges]]
### END HIDDEN TESTS


class TrainBPE(Check, id="check-train-bpe", functions=("train_bpe",)):
    def cases(self, rng):
        yield Case("'hug' 10, 'pug' 5, 'pun' 12, 'bun' 4, 'hugs' 5: 4 merges",
                   ([[list(b"hug"), 10], [list(b"pug"), 5], [list(b"pun"), 12],
                     [list(b"bun"), 4], [list(b"hugs"), 5]], 4))
        yield Case("ties: two pairs as frequent, the smaller (a, b) first",
                   ([[list(b"cd"), 3], [list(b"ab"), 3], [list(b"xy"), 1]], 3))
        yield Case("overlapping pairs: 'aaaa' 5 times, 'aaa' twice", (
            [[list(b"aaaa"), 5], [list(b"aaa"), 2]], 4))
        yield Case("more merges asked than pairs left: stops early",
                   ([[list(b"abc"), 2], [list(b"d"), 9]], 10))
        yield Case("40 random words over 'abcde', 30 merges", (_words_of(rng, 40, "abcde", 8), 30))
        yield Case("words with accents (two bytes a character), 12 merges",
                   (_words_of(rng, 30, "aéèbç", 5), 12))
        yield Case("10,000 random words over the 26 letters, 40 merges, the look-ups counted "
                   "(few words contain each pair)",
                   (_words_of(later_rng(rng), 10_000, string.ascii_lowercase, 8), 40),
                   {"count_work": True})  # added later: the cases drawn after stay as they were

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("no merges asked", ([[list(b"ab"), 2]], 0))
        yield Case("no words", ([], 3))
        yield Case("200 random words over 'abcdefg', 80 merges",
                   (_words_of(rng, 200, "abcdefg", 10), 80))

    def expected(self, words, num_merges, count_work=False, train=_naive_train):
        """The merges, and the work (``train``, a mistake: another way of training)."""
        merges = train(words, num_merges)
        work = {_WORK: _work(words, merges)} if count_work else {}
        return {"merges": merges, **work, _KEPT: "unchanged"}

    def mistakes(self, words, num_merges, count_work=False):
        larger = functools.partial(_naive_train, larger_first=True)
        return {"breaking a tie by the larger pair, or by the pair counted first (max(counts, "
                "key=counts.get) keeps the first of equal counts): of two as frequent, take "
                "the smaller (a, b)": lambda: self.expected(words, num_merges, count_work, larger),
                "with the new ids from 257 (merge r makes id 256 + r: the first is 256)":
                lambda: self.expected(words, num_merges, count_work,
                                      functools.partial(_naive_train, first_id=257)),
                "with the counts of the words as they were before the merges (update the "
                "counts after each merge: the merged words' pairs out, their new pairs in)":
                lambda: self.expected(words, num_merges, count_work, _stale_train)}
    ### END HIDDEN TESTS

    def run(self, f, words, num_merges, count_work=False):
        given = _as_words(words, _Byte if count_work else int)
        _Byte.hashes = 0
        merges = [[int(a), int(b)] for a, b in f.train_bpe(given, num_merges)]
        work = {_WORK: _work(words, merges, _Byte.hashes)} if count_work else {}
        return {"merges": merges, **work,
                _KEPT: "unchanged" if given == _as_words(words) else "changed"}


class _Byte(int):
    """A byte id that counts how often it is hashed: every look-up of a pair in a dict or a
    set hashes the pair's two ids, however the counting is written (counting that makes new
    ints of the ids, int(b) or an array, or that sorts the pairs instead, is not counted)."""

    __slots__ = ()
    hashes = 0

    def __hash__(self):
        _Byte.hashes += 1
        return int.__hash__(self)


#: check-train-bpe's output that counts the look-ups of train_bpe (the case that counts them)
_WORK = "byte ids hashed (a look-up of a pair in a dict or a set hashes its two ids)"
#: and the one that says whether the words given came back as they were
_KEPT = "the words given (train_bpe must leave the caller's dict as it was: work on a copy)"


def _work(words, merges, hashes=None) -> str:
    """What a recount costs: one look-up of every pair of every word after every merge, in
    hashes of the given ids (a merged id is a plain int); with ``hashes``, what training cost
    when it is as much or more. Updating the counts costs a fraction of it."""
    words, recount = [tuple(w) for w, _ in words], 0
    for new_id, pair in enumerate(merges, 256):
        recount += sum((a < 256) + (b < 256) for w in words for a, b in itertools.pairwise(w))
        words = [_merge(w, tuple(pair), new_id) for w in words]
    if hashes is None or hashes < recount:
        return f"fewer than a recount's {recount:,} (one look-up of each pair of every word " \
               "after every merge)"
    return (f"{hashes:,}: {hashes / recount:.2g} times a recount's {recount:,}, the work of a "
            "recount after every merge (update the counts: only the words with the merged pair "
            "change)")


# --------------------------------------------------------------------------------------------
# Encoding and decoding (§6, §7)


class TokenBytes(Check, id="check-token-bytes", functions=("token_bytes",)):
    def cases(self, rng):
        yield Case("no merges: the 256 bytes", ([],))
        yield Case("'th', 'the', ' the'", ([[116, 104], [256, 101], [32, 257]],))
        yield Case("a merge of two merges", ([[97, 98], [99, 100], [256, 257]],))
        yield Case("12 random merges of a text", (_random_merges(rng, TEXTS["plain words"], 12),))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("a merge of a byte with itself", ([[0, 0], [256, 256]],))

    def expected(self, merges):
        def of(i):
            return bytes([i]) if i < 256 else of(merges[i - 256][0]) + of(merges[i - 256][1])

        return [repr(of(i)) for i in range(256 + len(merges))]

    def mistakes(self, merges):
        def reversed_join(i):
            return bytes([i]) if i < 256 else (reversed_join(merges[i - 256][1]) +
                                               reversed_join(merges[i - 256][0]))

        return {"with bytes(b) for a byte (that is b zero bytes: bytes([b]) is the one byte b)":
                lambda: [repr(bytes(b)) for b in range(256)] + self.expected(merges)[256:],
                "joining a merge's two tokens in the other order (merge (a, b) is a's bytes, "
                "then b's)": lambda: [repr(reversed_join(i))
                                      for i in range(256 + len(merges))]}
    ### END HIDDEN TESTS

    def run(self, f, merges):
        vocab = f.token_bytes([tuple(p) for p in merges])
        if not isinstance(vocab, list):
            raise TypeError(f"a {type(vocab).__name__} came back; token_bytes returns a list: "
                            "item i, token i's bytes")
        other = next((t for t in vocab if not isinstance(t, bytes | bytearray)), None)
        if other is not None:
            raise TypeError(f"a list holding {other!r} ({type(other).__name__}) came back; each "
                            "item is a token's bytes: bytes([b]) for byte b, a merge's two "
                            "tokens' bytes joined")
        return [repr(bytes(t)) for t in vocab]  # b'th': shown as Python writes bytes


class EncodeWord(Check, id="check-encode-word", functions=("encode_word",)):
    def cases(self, rng):
        the = [[116, 104], [256, 101], [32, 257]]
        yield Case("' the' with 'th', 'the', ' the'", (list(b" the"), the))
        yield Case("' then': ' the' and 'n'", (list(b" then"), the))
        yield Case("the later merge comes first in the word: ranks decide, not places",
                   (list(b"abc"), [[98, 99], [97, 98], [97, 257]]))
        yield Case("'aaaa' with (a, a) then (aa, aa)", (list(b"aaaa"), [[97, 97], [256, 256]]))
        yield Case("no merge applies", (list(b"xyz"), the))
        merges = _random_merges(rng, TEXTS["plain words"], 40)
        for word in ("elements", " array", " given"):
            yield Case(f"{word!r} with 40 random merges", (list(word.encode()), merges))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("one byte", ([97], [[97, 97]]))
        yield Case("no merges", (list(b"abc"), []))
        merges = _random_merges(rng, TEXTS["accents and CJK"], 30)
        yield Case("'résumé' with 30 random merges", (list(" résumé,".encode()), merges))
    ### END HIDDEN TESTS

    def run(self, f, word, merges):
        return [int(i) for i in f.encode_word(bytes(word), _ranks(merges))]

    def expected(self, word, merges):
        return _hf_ids(_hf_bpe(merges, byte_level=False), word)

    def mistakes(self, word, merges):
        def by_rank(pick, first_id):  # ``pick`` (min, right; max) of the ranks first
            ranks, w = _ranks(merges), tuple(word)
            while pairs := [p for p in zip(w, w[1:], strict=False) if p in ranks]:
                pair = pick(pairs, key=ranks.get)
                w = _merge(w, pair, first_id + ranks[pair])
            return list(w)

        # the first pair of the word that is a merge, left to right; the highest rank
        left, latest = by_rank(lambda pairs, key: pairs[0], 256), by_rank(max, 256)
        both = ", or the latest learned pair first" if left == latest else ""  # agreeing: name both
        first = (f"merging the first learned pair found reading the word left to right{both} "
                 "(merge the pair of the lowest rank in the whole word first)")
        found = {first: lambda: left}
        if not both:
            found["merging the latest learned pair first, the highest rank (merge the pair of "
                  "the lowest rank first: the merges replay in the order training learned "
                  "them)"] = lambda: latest
        found["with the rank itself as the new id (merge r makes id 256 + r)"] = (
            lambda: by_rank(min, 0))
        found["with rank 0 for the pairs never learned (ranks.get(pair, 0) makes them the "
              "first: a pair not learned is never merged, ranks.get(pair, math.inf))"] = (
            lambda: _encode_unlearned_first(word, _ranks(merges)))
        return found


def _encode_unlearned_first(word, ranks) -> list[int]:
    """encode_word with the pairs never learned ranked 0 (a mistake): it stops at the first
    round whose lowest-ranked pair is one of them."""
    w = tuple(word)
    while len(w) > 1:
        pair = min(zip(w, w[1:], strict=False), key=lambda p: ranks.get(p, 0))
        if pair not in ranks:
            break
        w = _merge(w, pair, 256 + ranks[pair])
    return list(w)


class BPEEncode(Check, id="check-bpe-encode", functions=("bpe_encode",)):
    def cases(self, rng):
        merges = _random_merges(rng, "".join(TEXTS.values()), 80)
        for name, text in TEXTS.items():
            yield Case(f"{name}, 80 random merges", (text, merges))
        yield Case("a piece that occurs twice", ("the the the", [[116, 104], [256, 101]]))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        merges = _random_merges(rng, "".join(HIDDEN_TEXTS.values()), 50)
        for name, text in HIDDEN_TEXTS.items():
            yield Case(f"{name}, 50 random merges", (text, merges))
        yield Case("the empty text", ("", merges))
    ### END HIDDEN TESTS

    def run(self, f, text, merges):
        return [int(i) for i in f.bpe_encode(text, _ranks(merges))]

    def expected(self, text, merges):
        return _hf_bpe(merges, byte_level=True).encode(text).ids if text else []

    def mistakes(self, text, merges):
        model = _hf_bpe(merges, byte_level=False)

        def words(pieces):
            return [i for p in pieces for i in _hf_ids(model, p)]

        return {"encoding the whole text as one word, or pieces other than pretokenize's "
                "(encode each piece of pretokenize(text) on its own)":
                lambda: words([text.encode("utf-8")] if text else []),
                "with the characters' code points (ord) instead of the UTF-8 bytes":
                lambda: words([[ord(c) for c in p] for p in _pieces(text)])
                if all(ord(c) < 256 for c in text) else None}


class BPEDecode(Check, id="check-bpe-decode", functions=("bpe_decode",)):
    def cases(self, rng):
        vocab = [bytes([b]).hex() for b in range(256)] + ["c3a9", "20e4b896", "f09f8c8d"]
        yield Case("bytes and merges", ([72, 105, 256, 33], vocab))
        yield Case("a character cut in two tokens (c3 | a9): joined first, then decoded",
                   ([99, 97, 102, 0xC3, 0xA9], vocab))
        yield Case("CJK and emoji", ([257, 258, 10], vocab))
        yield Case("a character cut short (c3 at the end): U+FFFD", ([97, 0xC3], vocab))
        yield Case("an emoji's first two bytes, then a space", ([0xF0, 0x9F, 32], vocab))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        vocab = [bytes([b]).hex() for b in range(256)] + ["e4b8", "96"]
        yield Case("no ids", ([], vocab))
        yield Case("a CJK character across two merges", ([256, 257, 32], vocab))
        yield Case("a lone continuation byte", ([0x96, 97], vocab))
    ### END HIDDEN TESTS

    def run(self, f, ids, vocab):
        return f.bpe_decode(list(ids), [bytes.fromhex(t) for t in vocab])

    def expected(self, ids, vocab):
        chars = _gpt2_chars()
        tokens = ["".join(chars[b] for b in bytes.fromhex(vocab[i])) for i in ids]
        return tokenizers.decoders.ByteLevel().decode(tokens)

    def mistakes(self, ids, vocab):
        tokens = [bytes.fromhex(vocab[i]) for i in ids]
        return {"decoding each token on its own (a character cut between two tokens becomes "
                "two U+FFFD: join the bytes first, then decode)":
                lambda: "".join(t.decode("utf-8", errors="replace") for t in tokens),
                "with errors='ignore' (a cut character must show, as U+FFFD)":
                lambda: b"".join(tokens).decode("utf-8", errors="ignore"),
                "decoding as Latin-1 (one character a byte): the bytes are UTF-8":
                lambda: b"".join(tokens).decode("latin-1"),
                "with GPT-2's stand-in characters (bytes_to_unicode's: they spell tokens in "
                "vocab.json): decode the bytes themselves": lambda: "".join(
                    _gpt2_chars()[b] for b in b"".join(tokens))}
