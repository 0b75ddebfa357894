"""A byte-level BPE tokenizer in GPT-2's format, on the core of notebook 11 (11_tokenization).

    from transformer_lab.tokenizer import BPETokenizer

    tok = BPETokenizer.train(text, vocab_size=1024)   # 256 bytes + 767 merges + <|endoftext|>
    ids = tok.encode("Return the sum.<|endoftext|>")  # a list of ints; a special token is one id
    tok.decode(ids)                                   # the text back
    tok.save("folder")                                # GPT-2's vocab.json and merges.txt
    BPETokenizer.load("folder")                       # also GPT-2's own files

The files are GPT-2's: ``vocab.json`` maps each token, written with GPT-2's printable stand-ins
for bytes (:func:`transformer_lab.core.bpe.bytes_to_unicode`: the space is ``Ġ``), to its id;
``merges.txt`` lists the merges in the order learned. Hugging Face ``tokenizers``'
``ByteLevelBPETokenizer(vocab.json, merges.txt)`` reads them and encodes as this class does
(``tests/test_tokenizer.py``).

Ids: the 256 bytes are 0..255, merge ``i`` is ``256 + i``, the special tokens follow. Files whose
ids are numbered otherwise (GPT-2's own: ``!`` is 0) load too: the ids read and written are the
file's. This class checks its arguments once and calls the core (``transformer_lab.core.bpe``,
looked up at call time: the student's own functions).
"""

from __future__ import annotations

import collections
import json
import numbers
import re
from pathlib import Path

from transformer_lab import _validate as v
from transformer_lab.core import bpe as core_bpe

#: The first line of a ``merges.txt`` as GPT-2 and ``tokenizers`` write it.
MERGES_HEADER = "#version: 0.2"


class BPETokenizer:
    """Byte-level BPE: ``merges`` (pairs of ids, in the order learned; merge ``i`` makes id
    ``256 + i``) and ``special_tokens`` (strings, each one id after the merges', matched in the
    text before anything else)."""

    def __init__(self, merges, special_tokens=("<|endoftext|>",)):
        self.merges = _check_merges(merges)
        specials = _check_specials(special_tokens)
        first = 256 + len(self.merges)
        self.special_tokens = {s: first + k for k, s in enumerate(specials)}
        self._ranks = {pair: rank for rank, pair in enumerate(self.merges)}
        self._vocab = core_bpe.token_bytes(self.merges) + [s.encode("utf-8") for s in specials]
        by_length = sorted(specials, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(map(re.escape, by_length)) + ")") \
            if specials else None
        self._to_file: list[int] | None = None  # internal id -> file id, when they differ
        self._from_file: dict[int, int] | None = None

    # ----------------------------------------------------------------------------------------
    # Training

    @classmethod
    def train(cls, text, vocab_size, special_tokens=("<|endoftext|>",)) -> BPETokenizer:
        """Learn ``vocab_size - 256 - len(special_tokens)`` merges from ``text`` (fewer when no
        pair is left); the special tokens found in ``text`` are cut out before counting."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        specials = _check_specials(special_tokens)
        vocab_size = v.integer(vocab_size, "vocab_size")
        if vocab_size < 256 + len(specials):
            raise ValueError(f"vocab_size must be at least 256 + {len(specials)} (the 256 bytes "
                             f"and the special tokens), got {vocab_size}")
        pieces = [text]
        if specials:
            pattern = "|".join(map(re.escape, sorted(specials, key=len, reverse=True)))
            pieces = re.split(pattern, text)
        words: collections.Counter = collections.Counter()
        for piece in pieces:
            words.update(core_bpe.word_counts(piece))
        merges = core_bpe.train_bpe(dict(words), vocab_size - 256 - len(specials))
        return cls(merges, specials)

    # ----------------------------------------------------------------------------------------
    # Encoding and decoding

    @property
    def vocab_size(self) -> int:
        """The number of ids: 256 bytes, the merges and the special tokens."""
        return len(self._vocab)

    def encode(self, text) -> list[int]:
        """The ids of ``text`` (a str); each special token in it is its one id."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        parts = self._split.split(text) if self._split is not None else [text]
        ids: list[int] = []
        for k, part in enumerate(parts):
            if k % 2:  # re.split puts the matched special tokens at the odd places
                ids.append(self.special_tokens[part])
            elif part:
                ids.extend(core_bpe.bpe_encode(part, self._ranks))
        if self._to_file is not None:
            ids = [self._to_file[i] for i in ids]
        return [int(i) for i in ids]

    def decode(self, ids) -> str:
        """The text of ``ids`` (a sequence of ints below :attr:`vocab_size`); bytes that are
        not valid UTF-8 (a character cut in two) become U+FFFD."""
        if isinstance(ids, (str, bytes)):
            raise TypeError(f"ids must be a sequence of int token ids, got {type(ids).__name__}")
        ids = list(ids)
        if ids:
            ids = v.token_ids(ids, "ids", self._file_size()).tolist()
        if self._from_file is not None:
            unknown = [i for i in ids if i not in self._from_file]
            if unknown:
                raise ValueError(f"ids must be ids of this tokenizer's vocab.json, found "
                                 f"{unknown[0]}")
            ids = [self._from_file[i] for i in ids]
        return core_bpe.bpe_decode(ids, self._vocab)

    def _file_size(self) -> int:
        return len(self._vocab) if self._to_file is None else max(self._to_file) + 1

    # ----------------------------------------------------------------------------------------
    # GPT-2's files

    def token_strings(self) -> list[str]:
        """Every token as ``vocab.json`` writes it (GPT-2's stand-ins for bytes), by id."""
        to_char = core_bpe.bytes_to_unicode()
        strings = ["".join(to_char[b] for b in token) for token in self._vocab[:256 + len(
            self.merges)]]
        return strings + list(self.special_tokens)

    def save(self, folder) -> Path:
        """Write ``vocab.json`` and ``merges.txt`` into ``folder`` (made if missing)."""
        folder = _folder(folder)
        folder.mkdir(parents=True, exist_ok=True)
        strings = self.token_strings()
        if len(set(strings)) != len(strings):
            twice = next(s for s, n in collections.Counter(strings).items() if n > 1)
            raise ValueError(f"two merges make the same token {twice!r}: GPT-2's vocab.json "
                             "can hold each token once")
        ids = self._to_file or list(range(len(strings)))
        vocab = {s: ids[i] for i, s in enumerate(strings)}
        (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False) + "\n",
                                           encoding="utf-8")
        lines = [MERGES_HEADER] + [f"{strings[a]} {strings[b]}" for a, b in self.merges]
        (folder / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        return folder

    @classmethod
    def load(cls, folder) -> BPETokenizer:
        """Read ``vocab.json`` and ``merges.txt`` from ``folder``: what :meth:`save` writes, or
        GPT-2's own files (the tokens of vocab.json that no merge makes are special tokens)."""
        folder = _folder(folder)
        if not folder.is_dir():
            raise FileNotFoundError(f"folder must be an existing folder holding vocab.json and "
                                    f"merges.txt, got {str(folder)!r}")
        for name in ("vocab.json", "merges.txt"):
            if not (folder / name).is_file():
                raise FileNotFoundError(f"folder {str(folder)!r} has no {name}")
        file_ids = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
        to_char = core_bpe.bytes_to_unicode()
        internal = {to_char[b]: b for b in range(256)}  # token string -> internal id
        strings = [to_char[b] for b in range(256)]
        merges = []
        for n, line in enumerate((folder / "merges.txt").read_text(encoding="utf-8")
                                 .split("\n"), 1):
            if not line.strip() or (n == 1 and line.startswith("#version")):
                continue
            parts = line.split(" ")
            if len(parts) != 2 or any(p not in internal for p in parts):
                raise ValueError(f"merges.txt, line {n}: expected two known tokens separated "
                                 f"by a space, got {line!r}")
            merges.append((internal[parts[0]], internal[parts[1]]))
            internal.setdefault(parts[0] + parts[1], 256 + len(merges) - 1)
            strings.append(parts[0] + parts[1])
        missing = [s for s in strings if s not in file_ids]
        if missing:
            raise ValueError(f"vocab.json has no id for the token {missing[0]!r}")
        specials = sorted((s for s in file_ids if s not in internal), key=file_ids.get)
        tok = cls(merges, specials)
        to_file = [int(file_ids[s]) for s in strings + specials]
        if to_file != list(range(len(to_file))):
            tok._to_file = to_file
            tok._from_file = {f: i for i, f in enumerate(to_file)}
        return tok

    def __repr__(self) -> str:
        return (f"BPETokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)}, "
                f"special_tokens={list(self.special_tokens)})")


def _folder(folder) -> Path:
    if not isinstance(folder, (str, Path)):
        raise TypeError(f"folder must be a str or a Path, got {type(folder).__name__}")
    return Path(folder)


def _check_specials(special_tokens) -> tuple[str, ...]:
    if isinstance(special_tokens, str) or not isinstance(special_tokens, (tuple, list)):
        raise TypeError("special_tokens must be a tuple or list of str, got "
                        f"{type(special_tokens).__name__}")
    if not all(isinstance(s, str) and s for s in special_tokens):
        raise TypeError(f"special_tokens must be non-empty strings, got {special_tokens!r}")
    if len(set(special_tokens)) != len(special_tokens):
        raise ValueError(f"special_tokens must be distinct, got {special_tokens!r}")
    return tuple(special_tokens)


def _check_merges(merges) -> list[tuple[int, int]]:
    checked = []
    for i, pair in enumerate(merges):
        if (not isinstance(pair, (tuple, list)) or len(pair) != 2
                or not all(isinstance(x, numbers.Integral) and not isinstance(x, bool)
                           for x in pair)):
            raise TypeError(f"merges must be pairs of int ids, got {pair!r} at {i}")
        if not all(0 <= x < 256 + i for x in pair):
            raise ValueError(f"merges[{i}] must join ids below {256 + i} (the bytes and the "
                             f"earlier merges), got {tuple(pair)}")
        checked.append((int(pair[0]), int(pair[1])))
    return checked
