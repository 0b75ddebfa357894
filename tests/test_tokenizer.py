"""The byte-level BPE of notebook 11 (``transformer_lab.core.bpe``, ``transformer_lab.tokenizer``)
against Hugging Face ``tokenizers``: the same vocab.json and merges.txt give the same ids."""

from __future__ import annotations

import collections
import json
import re
import statistics
import time

import pytest
from threadpoolctl import threadpool_limits

from transformer_lab.core import bpe
from transformer_lab.datasets.corpus import load_corpus
from transformer_lab.tokenizer import BPETokenizer

tokenizers = pytest.importorskip("tokenizers")

#: Texts that exercise every branch of GPT-2's pattern and of UTF-8.
HARD_TEXTS = {
    "accents": "Café naïve résumé à la façon de Gödel; Ångström, Øre, Straße.",
    "cjk": "世界你好，这是一个测试。日本語のテキスト、한국어 텍스트",
    "emoji": "🌍👋 hi 🙂🙂 👩‍👩‍👧 family, flags 🇫🇷🇯🇵, ✔ done",
    "whitespace": "tabs\t\tand\tmore\n\n\nnewlines   runs of  spaces \n \t mixed\r\n crlf  ",
    "trailing space": "ends with a space ",
    "leading spaces": "   three before",
    "only spaces": "     ",
    "contractions": "I'm sure you'll see they've said it's DON'T, we'd, he'LL, o'clock 'tis",
    "digits": "12345 3.14159 x² 1e-10 0x1F ١٢٣ ½ 2026-11-26 -7",
    "code": "def f(x):\n    return x ** 2  # square\n\tif a!=b: pass",
    "empty": "",
}


@pytest.fixture(scope="module")
def corpus():
    c = load_corpus()
    train = "".join(t for t, val in zip(c.texts, c.is_val, strict=True) if not val)
    val_docs = [t for t, val in zip(c.texts, c.is_val, strict=True) if val]
    return train, val_docs


@pytest.fixture(scope="module")
def tok(corpus):
    """A small vocabulary (fast), trained on a part of the training text."""
    train, _ = corpus
    return BPETokenizer.train(train[:200_000], 600)


@pytest.fixture(scope="module")
def hf(tok, tmp_path_factory):
    folder = tok.save(tmp_path_factory.mktemp("bpe"))
    ours = tokenizers.ByteLevelBPETokenizer(str(folder / "vocab.json"),
                                            str(folder / "merges.txt"), add_prefix_space=False)
    ours.add_special_tokens(list(tok.special_tokens))
    return ours


# --------------------------------------------------------------------------------------------
# The core


def test_bytes_to_unicode_is_a_bijection_onto_printable_characters():
    m = bpe.bytes_to_unicode()
    assert sorted(m) == list(range(256))
    assert len(set(m.values())) == 256
    assert all(len(c) == 1 and c.isprintable() and not c.isspace() for c in m.values())
    assert m[ord(" ")] == "Ġ" and m[ord("\n")] == "Ċ" and m[ord("a")] == "a"
    assert set(m.values()) == set(tokenizers.pre_tokenizers.ByteLevel.alphabet())


@pytest.mark.parametrize("name", HARD_TEXTS)
def test_pretokenize_gives_the_pieces_of_gpt2_pattern_as_tokenizers_cuts_them(name):
    text = HARD_TEXTS[name]
    pre = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    want = [text[a:b] for _, (a, b) in pre.pre_tokenize_str(text)]
    assert bpe.pretokenize(text) == want
    assert "".join(bpe.pretokenize(text)) == text


def test_merge_pair_reads_left_to_right():
    assert bpe.merge_pair((97, 97, 97), (97, 97), 256) == (256, 97)
    assert bpe.merge_pair((97, 97, 97, 97), (97, 97), 256) == (256, 256)
    assert bpe.merge_pair((1, 2, 3, 1, 2), (1, 2), 300) == (300, 3, 300)
    assert bpe.merge_pair((5,), (5, 5), 256) == (5,)


def test_pairs_are_counted_within_words_only():
    words = {(104, 105): 3, (105, 104): 2}  # "hi" x3, "ih" x2: never (105, 105) across them
    assert bpe.pair_counts(words) == {(104, 105): 3, (105, 104): 2}


def _naive_train(words, num_merges):
    """Recount every pair after every merge (the definition; slow)."""
    words = dict(words)
    merges = []
    for new_id in range(256, 256 + num_merges):
        counts = bpe.pair_counts(words)
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        merges.append(best)
        merged = collections.Counter()
        for w, n in words.items():
            merged[bpe.merge_pair(w, best, new_id)] += n
        words = dict(merged)
    return merges


def test_incremental_training_learns_the_merges_of_the_naive_recount(corpus):
    train, _ = corpus
    words = bpe.word_counts(train[:30_000])
    assert bpe.train_bpe(words, 120) == _naive_train(words, 120)
    tiny = {tuple(b"aaaa"): 5, tuple(b"aaa"): 2, tuple(b"ab"): 1}  # overlapping pairs
    assert bpe.train_bpe(tiny, 10) == _naive_train(tiny, 10)


def test_training_stops_when_no_pair_is_left():
    assert bpe.train_bpe({tuple(b"ab"): 3}, 5) == [(97, 98)]
    assert bpe.train_bpe({}, 5) == []


# --------------------------------------------------------------------------------------------
# Against tokenizers


def test_the_same_ids_as_tokenizers_on_the_whole_validation_text(tok, hf, corpus):
    _, val_docs = corpus
    text = "".join(val_docs)
    assert tok.encode(text) == hf.encode(text).ids


@pytest.mark.parametrize("name", HARD_TEXTS)
def test_the_same_ids_as_tokenizers_on_hard_texts(tok, hf, name):
    text = HARD_TEXTS[name]
    ids = tok.encode(text)
    assert ids == hf.encode(text).ids
    assert tok.decode(ids) == text


def test_special_tokens_are_one_id_each_as_in_tokenizers(tok, hf):
    eot = tok.special_tokens["<|endoftext|>"]
    assert eot == tok.vocab_size - 1 == 600 - 1
    text = "first document.<|endoftext|>second one <|endoftext|><|endoftext|> third"
    ids = tok.encode(text)
    assert ids.count(eot) == 3
    assert ids == hf.encode(text).ids
    assert tok.decode(ids) == text
    assert tok.encode("<|endoftext|>") == [eot]


def test_decode_inverts_encode_on_every_document(tok, corpus):
    _, val_docs = corpus
    train, _ = corpus
    for doc in val_docs + [train[:50_000]]:
        assert tok.decode(tok.encode(doc)) == doc


def test_decode_takes_one_sequence(tok):
    batch = [tok.encode("one two")] * 2  # a batch of generate's, say
    assert tok.decode(batch[0]) == "one two" and tok.decode([]) == ""
    assert tok.decode(iter(batch[0])) == tok.decode(tuple(batch[0])) == "one two"
    with pytest.raises(ValueError, match=r"got the single id \d+: decode\(\[id\]\)"):
        tok.decode(batch[0][0] + 0 * len(batch))  # an int, not a list

    with pytest.raises(ValueError, match=r"one sequence of token ids, got shape \(2, \d+\): "
                                         "decode each row"):
        tok.decode(batch)


def test_a_character_cut_in_two_decodes_to_the_replacement_character(tok):
    ids = tok.encode("é")
    assert ids == [0xC3, 0xA9]  # no merge makes é from this corpus's 600 tokens
    assert tok.decode(ids[:1]) == "\ufffd"


def test_save_load_round_trip_and_gpt2_files(tok, tmp_path):
    tok.save(tmp_path)
    vocab = json.loads((tmp_path / "vocab.json").read_text(encoding="utf-8"))
    assert len(vocab) == tok.vocab_size and vocab["Ġ"] == 32 and vocab["<|endoftext|>"] == 599
    lines = (tmp_path / "merges.txt").read_text(encoding="utf-8").split("\n")
    assert lines[0] == "#version: 0.2" and len([x for x in lines[1:] if x]) == len(tok.merges)
    back = BPETokenizer.load(tmp_path)
    assert back.merges == tok.merges and back.special_tokens == tok.special_tokens
    text = HARD_TEXTS["whitespace"] + "<|endoftext|>" + HARD_TEXTS["emoji"]
    assert back.encode(text) == tok.encode(text)


def test_files_with_gpt2s_own_numbering_load_and_encode_like_tokenizers(tok, tmp_path):
    """GPT-2's vocab.json numbers the bytes in bytes_to_unicode's order ("!" is 0): such files
    load, and the ids read and written are the file's."""
    tok.save(tmp_path)
    vocab = json.loads((tmp_path / "vocab.json").read_text(encoding="utf-8"))
    order = sorted(vocab, key=lambda s: (vocab[s] >= 256, -vocab[s] if vocab[s] >= 256 else 0,
                                         s))  # bytes first, then merges reversed
    renumbered = {s: i for i, s in enumerate(order)}
    (tmp_path / "vocab.json").write_text(json.dumps(renumbered), encoding="utf-8")
    loaded = BPETokenizer.load(tmp_path)
    hf = tokenizers.ByteLevelBPETokenizer(str(tmp_path / "vocab.json"),
                                          str(tmp_path / "merges.txt"))
    text = HARD_TEXTS["contractions"] + HARD_TEXTS["accents"]
    assert loaded.encode(text) == hf.encode(text).ids != tok.encode(text)
    assert loaded.decode(loaded.encode(text)) == text
    again = loaded.save(tmp_path / "again")
    assert json.loads((again / "vocab.json").read_text(encoding="utf-8")) == renumbered


# --------------------------------------------------------------------------------------------
# Argument checks


def test_clear_errors(tok, tmp_path):
    with pytest.raises(ValueError, match=r"vocab_size must be at least 256 \+ 1"):
        BPETokenizer.train("abc", 256)
    with pytest.raises(ValueError, match=r"vocab_size must be at least 256 \+ 0"):
        BPETokenizer.train("abc", 255, special_tokens=())
    with pytest.raises(TypeError, match="vocab_size must be an integer"):
        BPETokenizer.train("abc", 300.0)
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        BPETokenizer.train(b"abc", 300)
    with pytest.raises(TypeError, match="text must be a str, got list"):
        tok.encode(["abc"])
    with pytest.raises(ValueError, match="ids must be token ids below the vocabulary size 600"):
        tok.decode([1, 600])
    with pytest.raises(ValueError, match="ids must be non-negative"):
        tok.decode([-1])
    with pytest.raises(TypeError, match="ids must be an array of integer token ids"):
        tok.decode([1.5])
    with pytest.raises(TypeError, match="ids must be a sequence of int token ids, got str"):
        tok.decode("abc")
    with pytest.raises(FileNotFoundError, match="folder must be an existing folder"):
        BPETokenizer.load(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="has no vocab.json"):
        BPETokenizer.load(tmp_path)
    with pytest.raises(TypeError, match="special_tokens must be a tuple or list of str"):
        BPETokenizer.train("abc", 300, special_tokens="<|endoftext|>")
    with pytest.raises(ValueError, match=r"merges\[0\] must join ids below 256"):
        BPETokenizer([(97, 256)])
    assert tok.decode([]) == "" and tok.encode("") == []


# --------------------------------------------------------------------------------------------
# Speed (measured and printed; the bounds are generous: CI runs tests in parallel)


def test_training_speed_and_encoding_speed_against_tokenizers(corpus, tok, hf, capsys):
    train, val_docs = corpus
    with threadpool_limits(1):
        start = time.perf_counter()
        big = BPETokenizer.train(train[:1_000_000], 1024)
        seconds = time.perf_counter() - start
        assert big.vocab_size == 1024
        assert seconds < 60, f"training on 1 M characters to 1,024 tokens took {seconds:.1f} s"
        text = "".join(val_docs)
        ours, theirs = [], []
        for _ in range(3):  # interleaved
            start = time.perf_counter()
            tok.encode(text)
            ours.append(time.perf_counter() - start)
            start = time.perf_counter()
            hf.encode(text)
            theirs.append(time.perf_counter() - start)
    with capsys.disabled():
        print(f"\nBPE: 1 M characters -> 1,024 tokens in {seconds:.1f} s; encoding "
              f"{len(text):,} characters: ours {statistics.median(ours):.3f} s, tokenizers "
              f"{statistics.median(theirs):.3f} s (medians of 3)")


# --------------------------------------------------------------------------------------------
# The GPT on BPE tokens: python -m transformer_lab.train --task charlm --tokenizer bpe


def test_bpe_streams_hold_the_validation_characters_of_the_character_streams():
    from transformer_lab.train.charlm import CharLMConfig, token_streams

    c = load_corpus()
    char, sub = (token_streams(CharLMConfig(tokenizer=t, bpe_vocab_size=300), c)
                 for t in ("char", "bpe"))
    assert sub.vocab_size == 300 and sub.val_ids.size < char.val_ids.size
    first = int(sub.token_chars[sub.val_ids[0]])
    assert sub.chars(sub.val_ids) + first == char.chars(char.val_ids) + 1 == c.val_ids.size
    eot = sub.tokenizer.special_tokens["<|endoftext|>"]
    assert (sub.val_ids == eot).sum() == (c.val_ids == 0).sum()  # one end per document


def test_charlm_trains_on_bpe_tokens_and_reports_bits_per_character(tmp_path):
    import subprocess
    import sys

    args = ["--d-model", "16", "--num-heads", "2", "--num-layers", "1", "--context", "16",
            "--batch-size", "4", "--steps", "6", "--warmup", "2", "--eval-every", "3",
            "--eval-tokens", "200", "--samples", "1", "--tokenizer", "bpe",
            "--bpe-vocab-size", "300", "--checkpoint", str(tmp_path / "m.npz")]
    proc = subprocess.run([sys.executable, "-m", "transformer_lab.train", "--task", "charlm",
                           *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    m = json.loads(proc.stdout.strip())
    assert m["tokenizer"] == "bpe" and m["vocab_size"] == 300
    assert m["val_bits_per_char"] == pytest.approx(m["val_bits_per_token"]
                                                   / m["val_chars_per_token"])
    assert m["val_perplexity_per_token"] == pytest.approx(2 ** m["val_bits_per_token"])
    assert 1.2 < m["val_chars_per_token"] < 2.5
    assert BPETokenizer.load(tmp_path / "m-tokenizer").vocab_size == 300


# --------------------------------------------------------------------------------------------
# One cache for the segments between special tokens


def test_the_segments_between_special_tokens_share_one_cache(tok, corpus, monkeypatch):
    """Each distinct piece is encoded once per text, whichever segment it is in: a text of
    documents joined by <|endoftext|> costs what the same text without them costs. (Measured,
    one thread, 5 MiB of the corpus's documents joined by <|endoftext|>, 3,847 segments, a
    2,000-token BPE of tokenizers: 3.1 s with a cache per segment, 0.71 s with one cache, 0.71 s
    for the same text without the special tokens; medians of 3, interleaved.)"""
    _, val_docs = corpus
    calls = []
    real = bpe.encode_word
    monkeypatch.setattr(bpe, "encode_word", lambda word, ranks: calls.append(1) or
                        real(word, ranks))
    doc = val_docs[0]
    once = tok.encode(doc)
    n = len(calls)
    assert n == len(set(bpe.pretokenize(doc)))
    calls.clear()
    assert tok.encode("<|endoftext|>".join([doc] * 3)) == (once + [tok.special_tokens[
        "<|endoftext|>"]]) * 2 + once
    assert len(calls) == n


# --------------------------------------------------------------------------------------------
# tokenizer.json, as tokenizers writes it


#: The pre-tokenizers tokenizers writes for byte-level BPE: GPT-2's pattern alone, or after the
#: digits are split off (each digit: SmolLM's Digits and the equivalent Split; runs of digits).
PRE_TOKENIZERS = {
    "bytelevel": [],
    "split-digits": [lambda: tokenizers.pre_tokenizers.Split(tokenizers.Regex(r"\p{N}"),
                                                             behavior="isolated")],
    "digits": [lambda: tokenizers.pre_tokenizers.Digits(individual_digits=True)],
    "digit-runs": [lambda: tokenizers.pre_tokenizers.Digits(individual_digits=False)],
}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@pytest.fixture(scope="module", params=sorted(PRE_TOKENIZERS))
def saved_json(request, corpus, tmp_path_factory):
    """(tokenizers' Tokenizer, the path of its tokenizer.json): a byte-level BPE of 1,000
    tokens trained by tokenizers on 300,000 characters of the training text."""
    train, _ = corpus
    pre = tokenizers.pre_tokenizers
    model = tokenizers.Tokenizer(tokenizers.models.BPE())
    steps = [make() for make in PRE_TOKENIZERS[request.param]]
    byte_level = pre.ByteLevel(add_prefix_space=False, use_regex=True)
    model.pre_tokenizer = pre.Sequence([*steps, byte_level]) if steps else byte_level
    model.decoder = tokenizers.decoders.ByteLevel()
    model.post_processor = tokenizers.processors.ByteLevel(trim_offsets=False)
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=1000, special_tokens=SPECIALS,
                                             initial_alphabet=pre.ByteLevel.alphabet(),
                                             show_progress=False)
    model.train_from_iterator([train[i:i + 10_000] for i in range(0, 300_000, 10_000)], trainer)
    path = tmp_path_factory.mktemp(request.param) / "tokenizer.json"
    model.save(str(path))
    return model, path


def test_tokenizer_json_gives_the_ids_of_tokenizers_on_the_corpus(saved_json, corpus):
    hf_tok, path = saved_json
    ours = BPETokenizer.from_tokenizer_json(path)
    _, val_docs = corpus
    text = "<|endoftext|>".join(val_docs)
    ids = ours.encode(text)
    assert ids == hf_tok.encode(text).ids
    assert ours.decode(ids) == text
    assert ours.vocab_size == hf_tok.get_vocab_size() == 1000
    assert [ours.encode(s) for s in SPECIALS] == [[hf_tok.token_to_id(s)] for s in SPECIALS]
    # the file's ids, where it numbers its special tokens first (0, 1, 2 here), as SmolLM2's
    assert ours.special_tokens == {s: hf_tok.token_to_id(s) for s in SPECIALS}
    assert ours.token_strings() == [hf_tok.id_to_token(i) for i in range(1000)]


@pytest.mark.parametrize("name", sorted(HARD_TEXTS))
def test_tokenizer_json_gives_the_ids_of_tokenizers_on_hard_texts(saved_json, name):
    hf_tok, path = saved_json
    ours = BPETokenizer.from_tokenizer_json(path.parent)  # the folder does too
    text = HARD_TEXTS[name]
    for variant in (text, f"<|im_start|>{text}<|im_end|>\n", text.replace(" ", "<|endoftext|>")):
        assert ours.encode(variant) == hf_tok.encode(variant).ids, variant
        assert ours.decode(ours.encode(variant)) == variant


def test_merges_written_as_strings_read_as_pairs(saved_json, tmp_path):
    """tokenizers 0.20 and later write each merge as ["a", "b"]; earlier files as "a b"."""
    hf_tok, path = saved_json
    data = json.loads(path.read_text(encoding="utf-8"))
    assert all(isinstance(m, list) for m in data["model"]["merges"])
    data["model"]["merges"] = [" ".join(m) for m in data["model"]["merges"]]
    (tmp_path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    old = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    text = HARD_TEXTS["digits"] + HARD_TEXTS["code"]
    assert BPETokenizer.from_tokenizer_json(tmp_path).encode(text) == old.encode(text).ids \
        == hf_tok.encode(text).ids


def test_a_byte_level_tokenizer_json_saves_as_gpt2_files(saved_json, tmp_path):
    hf_tok, path = saved_json
    ours = BPETokenizer.from_tokenizer_json(path)
    text = HARD_TEXTS["contractions"] + "<|endoftext|>" + HARD_TEXTS["accents"] + " 2026"
    if ours._digits is not None:
        with pytest.raises(ValueError, match="splits the digits off"):
            ours.save(tmp_path)
        return
    again = BPETokenizer.load(ours.save(tmp_path))
    assert again.encode(text) == ours.encode(text) == hf_tok.encode(text).ids


def _tiny_json(merges, vocab_extra=(), **changes) -> dict:
    """A byte-level BPE tokenizer.json with the given merges (tokens of a..z)."""
    to_char = bpe.bytes_to_unicode()
    vocab = {to_char[b]: b for b in range(256)}
    for token in [a + b for a, b in merges] + list(vocab_extra):
        vocab.setdefault(token, len(vocab))
    data = {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": len(vocab), "content": "<|endoftext|>", "single_word": False,
                              "lstrip": False, "rstrip": False, "normalized": False,
                              "special": True}],
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                              "trim_offsets": True, "use_regex": True},
            "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True,
                                                "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": [list(m) for m in merges]}}
    for key, value in changes.items():
        where, _, field = key.rpartition("__")
        (data[where] if where else data)[field] = value
    return data


def test_two_merges_that_make_the_same_token_merge_on_as_one(tmp_path):
    """``ab c`` and ``a bc`` both make ``abc``: tokenizers gives it one id, and merges it on
    (``abc d``) whichever merge made it -- here the second, as ``b c`` comes before ``a b``."""
    merges = [("b", "c"), ("a", "b"), ("ab", "c"), ("a", "bc"), ("abc", "d"), ("c", "d")]
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(_tiny_json(merges)), encoding="utf-8")
    hf_tok = tokenizers.Tokenizer.from_file(str(path))
    ours = BPETokenizer.from_tokenizer_json(path)
    for text in ("abcd", "abc", "bcd xabcd", "aabcd", "abcabcd cd<|endoftext|>abcd"):
        assert ours.encode(text) == hf_tok.encode(text).ids, text
    assert ours.encode("abcd") == [hf_tok.token_to_id("abcd")]


def _tiny_tokenizer(tmp_path, merges):
    """tokenizers' Tokenizer of :func:`_tiny_json` (``merges``), and where to save it."""
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(_tiny_json(merges)), encoding="utf-8")
    return tokenizers.Tokenizer.from_file(str(path)), path


def test_added_tokens_are_matched_as_tokenizers_matches_them(tmp_path):
    """The added tokens with ``normalized: false`` (the special ones) first, the others in what
    is left: ``bcd`` before ``abcd``. One already in the vocabulary (``ab``) keeps its id, and
    vocab_size counts it once."""
    hf_tok, path = _tiny_tokenizer(tmp_path, [("a", "b"), ("c", "d")])
    hf_tok.add_tokens(["abcd", "ab", "x<s"])
    hf_tok.add_special_tokens(["bcd", "<s>"])
    hf_tok.save(str(path))
    ours = BPETokenizer.from_tokenizer_json(path)
    for text in ("abcd", "zabcde", "x<s>", "abcd<s>x<s", "ab abc", "cd abcdabcd"):
        assert ours.encode(text) == hf_tok.encode(text).ids, text
    assert ours.vocab_size == hf_tok.get_vocab_size()
    assert ours.decode([ours.vocab_size - 1]) == hf_tok.id_to_token(ours.vocab_size - 1)


def test_a_post_processor_that_adds_nothing_is_read_and_one_that_adds_is_refused(tmp_path):
    """``transformers``' save_pretrained writes a TemplateProcessing of ``$A`` alone."""
    hf_tok, path = _tiny_tokenizer(tmp_path, [("a", "b")])
    processors = tokenizers.processors
    hf_tok.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B")
    hf_tok.save(str(path))
    assert BPETokenizer.from_tokenizer_json(path).encode("ab c") == hf_tok.encode("ab c").ids
    eos = ("<|endoftext|>", hf_tok.token_to_id("<|endoftext|>"))
    hf_tok.post_processor = processors.TemplateProcessing(single="$A <|endoftext|>",
                                                          special_tokens=[eos])
    hf_tok.save(str(path))
    with pytest.raises(ValueError, match=re.escape("post_processor 'TemplateProcessing' that "
                                                   "adds '<|endoftext|>' to every text is not "
                                                   "supported (expected null or ByteLevel, or "
                                                   "a template of $A alone)")):
        BPETokenizer.from_tokenizer_json(path)


BAD_JSON = {
    "unigram": ({"model__type": "Unigram"}, "model.type is 'Unigram'"),
    "wordpiece": ({"model__type": "WordPiece"}, "model.type is 'WordPiece'"),
    "byte-fallback": ({"model__byte_fallback": True}, "model.byte_fallback=True is not supported"),
    "ignore-merges": ({"model__ignore_merges": True}, "model.ignore_merges=True is not"),
    "dropout": ({"model__dropout": 0.1}, "model.dropout=0.1 is not supported"),
    "suffix": ({"model__end_of_word_suffix": "</w>"}, "model.end_of_word_suffix='</w>'"),
    "normalizer": ({"normalizer": {"type": "NFC"}}, "normalizer 'NFC' is not supported"),
    "prefix-space": ({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True,
                                        "use_regex": True}},
                     "ByteLevel pre-tokenizer's add_prefix_space=True is not supported"),
    "no-regex": ({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                                    "use_regex": False}}, "use_regex=False is not supported"),
    "metaspace": ({"pre_tokenizer": {"type": "Metaspace", "replacement": "▁"}},
                  "pre_tokenizer 'Metaspace' is not supported"),
    "other-split": ({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\s+"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}]}},
        r"the pre-tokenizer .*Split.* before ByteLevel is not supported"),
    "llama3-split": ({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"(?i:'s|'t|'re)|\p{L}+|\p{N}{1,3}"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}},
        r"the pre-tokenizer .*Split.* before ByteLevel is not supported"),  # not use_regex's
    "template": ({"post_processor": {"type": "TemplateProcessing", "single": []}},
                 "post_processor 'TemplateProcessing' is not supported"),
    "padding": ({"padding": {"strategy": "BatchLongest"}}, "padding .* is not supported"),
    "lstrip": ({"added_tokens": [{"id": 300, "content": "<x>", "lstrip": True}]},
               "the added token '<x>' has lstrip=true"),
}


@pytest.mark.parametrize("case", sorted(BAD_JSON))
def test_a_tokenizer_json_that_would_give_other_ids_is_refused_by_name(tmp_path, case):
    changes, message = BAD_JSON[case]
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(_tiny_json([("a", "b")], **changes)), encoding="utf-8")
    with pytest.raises(ValueError, match=message) as e:
        BPETokenizer.from_tokenizer_json(path)
    assert str(path) in str(e.value)


def test_a_vocabulary_without_a_byte_or_with_an_unmade_token_is_refused(tmp_path):
    path = tmp_path / "tokenizer.json"
    data = _tiny_json([("a", "b")])
    del data["model"]["vocab"]["Ā"]
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match="model.vocab has no token for the byte 'Ā'"):
        BPETokenizer.from_tokenizer_json(path)
    path.write_text(json.dumps(_tiny_json([("a", "b")], vocab_extra=["xyz"])), encoding="utf-8")
    with pytest.raises(ValueError, match="model.vocab holds 'xyz', which is neither a byte"):
        BPETokenizer.from_tokenizer_json(path)
    with pytest.raises(FileNotFoundError, match="path must be a tokenizer.json file"):
        BPETokenizer.from_tokenizer_json(tmp_path / "missing.json")
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="cannot read it as JSON"):
        BPETokenizer.from_tokenizer_json(path)
