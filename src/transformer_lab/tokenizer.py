"""A byte-level BPE tokenizer in GPT-2's format, on the core of notebook 11 (11_tokenization).

    from transformer_lab.tokenizer import BPETokenizer

    tok = BPETokenizer.train(text, vocab_size=1024)   # 256 bytes + 767 merges + <|endoftext|>
    ids = tok.encode("Return the sum.<|endoftext|>")  # a list of ints; a special token is one id
    tok.decode(ids)                                   # the text back
    tok.save("folder")                                # GPT-2's vocab.json and merges.txt
    BPETokenizer.load("folder")                       # also GPT-2's own files
    BPETokenizer.from_tokenizer_json("tokenizer.json")  # a byte-level BPE of `tokenizers`

The files are GPT-2's: ``vocab.json`` maps each token, written with GPT-2's printable stand-ins
for bytes (:func:`transformer_lab.core.bpe.bytes_to_unicode`: the space is ``Ġ``), to its id;
``merges.txt`` lists the merges in the order learned. Hugging Face ``tokenizers``'
``ByteLevelBPETokenizer(vocab.json, merges.txt)`` reads them and encodes as this class does
(``tests/test_tokenizer.py``) once told the special tokens (``add_special_tokens``): the two
files do not mark ``<|endoftext|>`` as special, so ``tokenizers`` alone cuts it into pieces.

``tokenizer.json``, the one file in which Hugging Face ``tokenizers`` saves a whole tokenizer
(and in which LLaMA-architecture checkpoints such as SmolLM2 ship theirs), is read by
:meth:`BPETokenizer.from_tokenizer_json` when it is a byte-level BPE.

Ids: the 256 bytes are 0..255, merge ``i`` is ``256 + i``, the special tokens follow. Files whose
ids are numbered otherwise (GPT-2's own: ``!`` is 0) load too: the ids read and written are the
file's. This class checks its arguments once and calls the core (``transformer_lab.core.bpe``,
looked up at call time: the student's own functions).
"""

from __future__ import annotations

import collections
import itertools
import json
import numbers
import re
from collections.abc import Mapping
from pathlib import Path

import regex

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
        self._specials = {s: first + k for k, s in enumerate(specials)}  # internal ids
        self._ranks = {pair: rank for rank, pair in enumerate(self.merges)}
        self._vocab = core_bpe.token_bytes(self.merges) + [s.encode("utf-8") for s in specials]
        # the special tokens' splits, matched in turn (two for some tokenizer.json files)
        self._splits: list[re.Pattern] = [_alternation(specials)] if specials else []
        self._to_file: list[int] | None = None  # internal id -> file id, when they differ
        self._from_file: dict[int, int] | None = None
        self._digits: regex.Pattern | None = None  # splits the digits off before GPT-2's pattern

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
        pieces = _alternation(specials).split(text)[::2] if specials else [text]
        words: collections.Counter = collections.Counter()
        for piece in pieces:
            words.update(core_bpe.word_counts(piece))
        merges = core_bpe.train_bpe(dict(words), vocab_size - 256 - len(specials))
        return cls(merges, specials)

    # ----------------------------------------------------------------------------------------
    # Encoding and decoding

    @property
    def special_tokens(self) -> dict[str, int]:
        """Each special token -> its id (the file's, for a tokenizer read from files); a new
        dict each time: changing it changes nothing."""
        return {s: self._file_id(i) for s, i in self._specials.items()}

    def _file_id(self, i: int) -> int:
        return i if self._to_file is None else self._to_file[i]

    @property
    def vocab_size(self) -> int:
        """The number of ids, 0 to ``vocab_size - 1``: 256 bytes, the merges and the special
        tokens (the file's ids, for a tokenizer read from files)."""
        return self._file_size()

    def encode(self, text) -> list[int]:
        """The ids of ``text`` (a str); each special token in it is its one id. The segments
        between special tokens share one cache: a piece met before, in any segment, is looked
        up, not encoded again."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        parts = [(text, False)]  # (a segment, whether it is a special token)
        for split in self._splits:  # re.split puts the matched tokens at the odd places
            parts = [(piece, special or k % 2 == 1) for part, special in parts
                     for k, piece in enumerate([part] if special else split.split(part))]
        ids: list[int] = []
        cache: dict[str, list[int]] = {}  # piece -> its ids, for the whole text
        for part, special in parts:
            if special:
                ids.append(self._specials[part])
                continue
            for piece in self._pieces(part):
                if piece not in cache:
                    cache[piece] = core_bpe.encode_word(piece.encode("utf-8"), self._ranks)
                ids.extend(cache[piece])
        if self._to_file is not None:
            ids = [self._to_file[i] for i in ids]
        return [int(i) for i in ids]

    def _pieces(self, text: str) -> list[str]:
        """GPT-2's pieces of a segment (the core's ``pretokenize``); first cut at every digit
        (or run of digits) when this tokenizer's ``tokenizer.json`` splits them off."""
        if self._digits is None:
            return core_bpe.pretokenize(text)
        return [piece for chunk in self._digits.split(text) if chunk
                for piece in core_bpe.pretokenize(chunk)]

    def decode(self, ids) -> str:
        """The text of ``ids`` (a sequence of ints below :attr:`vocab_size`), special tokens
        included (``tokenizers``' ``decode`` leaves them out unless ``skip_special_tokens=False``);
        bytes that are not valid UTF-8 (a character cut in two) become U+FFFD."""
        if isinstance(ids, (str, bytes)):
            raise TypeError(f"ids must be a sequence of int token ids, got {type(ids).__name__}")
        if not hasattr(ids, "shape") and not isinstance(ids, (list, tuple)):
            ids = list(ids) if hasattr(ids, "__iter__") else ids  # a generator, a range
        ids = v.token_ids(ids, "ids", self._file_size())
        if ids.ndim == 0:
            raise ValueError(f"ids must be a sequence of token ids, got the single id {ids}: "
                             f"decode([id])")
        if ids.ndim != 1:
            raise ValueError(f"ids must be one sequence of token ids, got shape {ids.shape}: "
                             f"decode each row of a batch, [tok.decode(row) for row in ids]")
        ids = ids.tolist()
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

    def token_strings(self) -> list[str | None]:
        """Every token as ``vocab.json`` writes it (GPT-2's stand-ins for bytes), by id (the
        file's, for a tokenizer read from files; None for an id the file gives no token)."""
        strings: list[str | None] = [None] * self._file_size()
        for i, token in enumerate(self._strings()):
            strings[self._file_id(i)] = token
        return strings

    def _strings(self) -> list[str]:
        """Every token as ``vocab.json`` writes it, by internal id."""
        to_char = core_bpe.bytes_to_unicode()
        strings = ["".join(to_char[b] for b in token) for token in self._vocab[:256 + len(
            self.merges)]]
        return strings + list(self._specials)

    def save(self, folder) -> Path:
        """Write ``vocab.json`` and ``merges.txt`` into ``folder`` (made if missing)."""
        if self._digits is not None:
            raise ValueError("this tokenizer splits the digits off before GPT-2's pattern (its "
                             "tokenizer.json's pre_tokenizer), which GPT-2's vocab.json and "
                             "merges.txt cannot say: keep its tokenizer.json")
        folder = _path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        strings = self._strings()
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
        folder = _path(folder)
        if not folder.is_dir():
            raise FileNotFoundError(f"folder must be an existing folder holding vocab.json and "
                                    f"merges.txt, got {str(folder)!r}")
        for name in ("vocab.json", "merges.txt"):
            if not (folder / name).is_file():
                raise FileNotFoundError(f"folder {str(folder)!r} has no {name}")
        file_ids = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
        merges = []
        for n, line in enumerate((folder / "merges.txt").read_text(encoding="utf-8")
                                 .split("\n"), 1):
            if not line.strip() or (n == 1 and line.startswith("#version")):
                continue
            parts = line.split(" ")
            if len(parts) != 2:
                raise ValueError(f"merges.txt, line {n}: expected two tokens separated by a "
                                 f"space, got {line!r}")
            merges.append(tuple(parts))
        made = set(core_bpe.bytes_to_unicode().values()) | {a + b for a, b in merges}
        specials = sorted((s for s in file_ids if s not in made), key=file_ids.get)
        return cls._from_strings(file_ids, merges, specials, "merges.txt", "vocab.json")

    @classmethod
    def from_tokenizer_json(cls, path) -> BPETokenizer:
        r"""Read a byte-level BPE ``tokenizer.json`` as Hugging Face ``tokenizers`` writes it
        (``Tokenizer.save``; the file beside a checkpoint's weights). The ids are the file's:
        ``encode`` gives the ids of ``tokenizers.Tokenizer.from_file(path).encode(text).ids``
        (no BOS or EOS added), and ``decode`` the text, as a ByteLevel decoder does, whatever
        the file's decoder (null: ``tokenizers`` joins the tokens' stand-ins).

        Read: ``model.vocab``; ``model.merges``, as ``"a b"`` strings or ``["a", "b"]`` pairs;
        ``added_tokens``, matched in the text before anything else (the special tokens: those
        with ``normalized: false`` first, then the others in what is left, as ``tokenizers``
        does); the pre-tokenizer ``ByteLevel`` with GPT-2's pattern (``use_regex: true``,
        ``add_prefix_space: false``), alone or in a ``Sequence`` after a split of the digits
        (``Digits``, or ``Split`` on the regex ``\p{N}`` with ``behavior: Isolated``).

        Args:
            path: the file, or the folder that holds it as ``tokenizer.json`` (``~`` is
                expanded), e.g. a checkpoint's snapshot folder.

        Raises:
            FileNotFoundError: no such file.
            ValueError: naming the file and the field, for anything that would give other ids:
                another model (Unigram, WordPiece, ...), BPE options (``byte_fallback``,
                ``dropout``, ``ignore_merges``, a subword prefix or suffix), a normalizer,
                another pre-tokenizer or ``add_prefix_space: true``, a post-processor that
                adds tokens (one that adds none, as ``transformers`` saves it, is read),
                truncation or padding, added tokens that strip spaces or match whole words
                only, a vocabulary that lacks a byte.
        """
        path = _path(path, "path")
        path = path / "tokenizer.json" if path.is_dir() else path
        if not path.is_file():
            raise FileNotFoundError(f"path must be a tokenizer.json file (or its folder), got "
                                    f"{str(path)!r}")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: cannot read it as JSON: {e}") from None
        vocab, merges, added, first, digits = _tokenizer_json(data, str(path))
        to_char = core_bpe.bytes_to_unicode()
        lacking = [to_char[b] for b in range(256) if to_char[b] not in vocab]
        if lacking:
            raise ValueError(f"{path}: model.vocab has no token for the byte {lacking[0]!r} "
                             f"(and {len(lacking) - 1} more): tokenizers drops such bytes from "
                             f"a text, byte-level BPE here encodes every byte (train with "
                             f"initial_alphabet=ByteLevel.alphabet())")
        made = set(to_char.values()) | {a + b for a, b in merges} | set(added)
        unmade = [token for token in vocab if token not in made]
        if unmade:
            raise ValueError(f"{path}: model.vocab holds {unmade[0]!r}, which is neither a byte, "
                             f"a merge's result nor an added token (no encoding gives it)")
        specials = sorted(added, key=added.get)
        tok = cls._from_strings({**vocab, **added}, merges, specials, f"{path}: model.merges",
                                f"{path}: model.vocab")
        tok._digits = digits
        later = [token for token in added if token not in first]
        tok._splits = [_alternation(group) for group in (first, later) if group]
        return tok

    @classmethod
    def _from_strings(cls, file_ids: Mapping[str, int], merges: list[tuple[str, str]],
                      specials: list[str], merges_source: str,
                      vocab_source: str) -> BPETokenizer:
        """A tokenizer from tokens written as GPT-2 writes them (its stand-ins for bytes):
        ``file_ids`` token -> the file's id, ``merges`` pairs of tokens in order, ``specials``
        the special tokens. Two merges may make the same token (``a bc`` and ``ab c``): each
        gives it an id of its own here, and every merge of that token is learned for each of
        them, so that either way it is made, it merges on as the one token of the file."""
        to_char = core_bpe.bytes_to_unicode()
        made: dict[str, list[int]] = {to_char[b]: [b] for b in range(256)}  # token -> its ids
        for rank, (a, b) in enumerate(merges):
            if a not in made or b not in made:
                raise ValueError(f"{merges_source}: merge {rank + 1}, {a!r} {b!r}, joins a "
                                 f"token that neither a byte nor an earlier merge makes")
            made.setdefault(a + b, []).append(256 + rank)
        tokens = [to_char[b] for b in range(256)] + [a + b for a, b in merges] + list(specials)
        missing = [s for s in tokens if s not in file_ids]
        if missing:
            raise ValueError(f"{vocab_source} has no id for the token {missing[0]!r}")
        tok = cls([(made[a][0], made[b][0]) for a, b in merges], specials)
        for rank, (a, b) in enumerate(merges):  # the same merge for every id of its tokens
            for pair in itertools.product(made[a], made[b]):
                tok._ranks.setdefault(pair, rank)
        to_file = [int(file_ids[s]) for s in tokens]
        if to_file != list(range(len(to_file))):
            tok._to_file = to_file
            tok._from_file = {f: i for i, f in reversed(list(enumerate(to_file)))}
        return tok

    def __repr__(self) -> str:
        return (f"BPETokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)}, "
                f"special_tokens={list(self._specials)})")


#: Pre-tokenizers of ``tokenizer.json`` that split the digits off before GPT-2's pattern, and
#: the pattern that cuts the same way (the digits kept, as pieces of their own).
_DIGIT_SPLITS = [
    ({"type": "Digits", "individual_digits": True}, r"(\p{N})"),
    ({"type": "Digits", "individual_digits": False}, r"(\p{N}+)"),
    ({"type": "Split", "pattern": {"Regex": r"\p{N}"}, "behavior": "Isolated", "invert": False},
     r"(\p{N})"),
]
#: The fields of ``model`` that must hold these values for a byte-level BPE (missing: as
#: ``tokenizers`` reads them).
_BPE_FIELDS = {"dropout": (None,), "byte_fallback": (False,), "ignore_merges": (False,),
               "continuing_subword_prefix": (None, ""), "end_of_word_suffix": (None, "")}
_ADDED_FIELDS = ("single_word", "lstrip", "rstrip")


def _tokenizer_json(data, source: str):
    """(vocab token -> id, merges as pairs of tokens, added token -> id, the added tokens
    matched first (``normalized: false``), the digits' split pattern or None) of a
    ``tokenizer.json``'s data, or a ValueError naming ``source`` and the field it cannot read
    exactly."""
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise ValueError(f"{source}: not a tokenizers tokenizer.json (no 'model' object)")
    model = data["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"{source}: model.type is {model.get('type')!r}; only byte-level BPE "
                         f"('BPE') is read (not SentencePiece's Unigram, WordPiece, WordLevel)")
    for field, allowed in _BPE_FIELDS.items():
        if model.get(field, allowed[0]) not in allowed:
            raise ValueError(f"{source}: model.{field}={model[field]!r} is not supported "
                             f"(expected {allowed[0]!r})")
    for field in ("normalizer", "truncation", "padding"):
        if data.get(field) is not None:
            raise ValueError(f"{source}: {field} {_kind(data[field])} is not supported "
                             f"(expected null: it changes the text or the ids)")
    for field in ("post_processor", "decoder"):
        if data.get(field) is not None and _kind(data[field]) != repr("ByteLevel") \
                and not (field == "post_processor" and _adds_nothing(data[field])):
            adds = _template_adds(data[field]) if field == "post_processor" else ""
            raise ValueError(f"{source}: {field} {_kind(data[field])}{adds} is not supported "
                             f"(expected null or ByteLevel"
                             f"{', or a template of $A alone' if adds else ''})")
    digits = _pre_tokenizer(data.get("pre_tokenizer"), source)
    vocab, merges = model.get("vocab"), model.get("merges")
    if not isinstance(vocab, dict) or not isinstance(merges, list):
        raise ValueError(f"{source}: model.vocab must be an object and model.merges a list")
    pairs = []
    for n, merge in enumerate(merges):
        pair = merge.split(" ") if isinstance(merge, str) else merge
        if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(t, str)
                                                                   for t in pair):
            raise ValueError(f"{source}: model.merges[{n}] must be 'a b' or ['a', 'b'], got "
                             f"{merge!r}")
        pairs.append(tuple(pair))
    added, first = {}, []
    for token in data.get("added_tokens") or []:
        if not isinstance(token, dict) or not isinstance(token.get("content"), str) or \
                not isinstance(token.get("id"), int):
            raise ValueError(f"{source}: added_tokens must hold objects with a 'content' "
                             f"string and an 'id', got {token!r}")
        for field in _ADDED_FIELDS:
            if token.get(field):
                raise ValueError(f"{source}: the added token {token.get('content')!r} has "
                                 f"{field}=true, which is not supported")
        added[token["content"]] = token["id"]
        if not token.get("normalized", not token.get("special", False)):
            first.append(token["content"])
    return vocab, pairs, added, first, digits


def _adds_nothing(post) -> bool:
    """Whether a post-processor is a ``TemplateProcessing`` that gives one text's ids as they are
    (``single`` is ``$A`` alone), as ``transformers``' ``save_pretrained`` writes one."""
    return (isinstance(post, dict) and post.get("type") == "TemplateProcessing"
            and post.get("single") == [{"Sequence": {"id": "A", "type_id": 0}}])


def _template_adds(post) -> str:
    """`` that adds '<s>' to every text``: what a TemplateProcessing's ``single`` puts around
    the text (encode gives a text's ids alone), or ''."""
    if not isinstance(post, dict) or post.get("type") != "TemplateProcessing" \
            or not isinstance(post.get("single"), list):
        return ""
    single = post["single"]
    tokens = [step["SpecialToken"].get("id") for step in single
              if isinstance(step, dict) and isinstance(step.get("SpecialToken"), dict)]
    return f" that adds {', '.join(map(repr, tokens))} to every text" if tokens else ""


def _pre_tokenizer(pre, source: str):
    """The digits' split pattern (compiled) of a supported pre-tokenizer, None for GPT-2's
    pattern alone; a ValueError naming the pre-tokenizer otherwise."""
    steps = pre.get("pretokenizers") if isinstance(pre, dict) and \
        pre.get("type") == "Sequence" else [pre]
    if not isinstance(steps, list) or not 1 <= len(steps) <= 2:
        raise ValueError(f"{source}: pre_tokenizer {_kind(pre)} is not supported")
    *split, byte_level = steps
    if not isinstance(byte_level, dict) or byte_level.get("type") != "ByteLevel":
        raise ValueError(f"{source}: pre_tokenizer {_kind(pre)} is not supported (expected "
                         f"ByteLevel with GPT-2's pattern, optionally after the digits' split)")
    pattern = next((p for step, p in _DIGIT_SPLITS if step == split[0]), None) if split \
        else None
    if split and pattern is None:  # named first: its ByteLevel's use_regex=False follows from it
        raise ValueError(f"{source}: the pre-tokenizer {json.dumps(split[0])} before ByteLevel "
                         f"is not supported (expected Digits, or a Split on \\p{{N}} with "
                         f"behavior Isolated)")
    for field, want in (("use_regex", True), ("add_prefix_space", False)):
        if byte_level.get(field, want) != want:
            raise ValueError(f"{source}: the ByteLevel pre-tokenizer's {field}="
                             f"{byte_level[field]!r} is not supported (expected {want!r})")
    return None if pattern is None else regex.compile(pattern)


def _alternation(tokens) -> re.Pattern:
    """The pattern that cuts a text at each of ``tokens``, kept at the odd places of its
    ``split``: the leftmost, and the longest of those that start there."""
    return re.compile("(" + "|".join(map(re.escape, sorted(tokens, key=len, reverse=True))) + ")")


def _kind(value) -> str:
    """A tokenizer.json component in a message: its type, or the value itself."""
    return repr(value.get("type", value)) if isinstance(value, dict) else repr(value)


def _path(value, name: str = "folder") -> Path:
    if not isinstance(value, (str, Path)):
        raise TypeError(f"{name} must be a str or a Path, got {type(value).__name__}")
    return Path(value).expanduser()


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
