"""Byte-level BPE, GPT-2's tokenizer (11_tokenization): text -> its UTF-8 bytes, cut into pieces
by GPT-2's pattern -> within each piece, pairs of tokens merged in the order training learned them.

Notation: a *word* is a tuple of token ids, at first the UTF-8 bytes (0..255) of one piece of
text; a *pair* ``(a, b)`` two ids side by side in a word; ``merges`` the pairs training learned,
in order, merge ``i`` making the new id ``256 + i``; ``ranks`` the dict ``{pair: i}``; ``vocab``
the bytes of every id (``vocab[id]``).
"""

from __future__ import annotations

import collections
import itertools
import math

import regex

# --------------------------------------------------------------------------------------------
# Bytes and pieces (11_tokenization §2, §3)


def bytes_to_unicode():
    """GPT-2's printable stand-in for each byte, so that ``vocab.json`` and ``merges.txt`` can
    write any token as text: the 188 bytes that print as themselves in Latin-1 (``!`` .. ``~``,
    ``¡`` .. ``¬``, ``®`` .. ``ÿ``) keep their character; the other 68, in byte order, get the
    characters 256, 257, ... (``Ā``, ``ā``, ...: the space, byte 32, becomes ``Ġ``).

    -> dict: byte (0..255) -> a string of one character.
    """
    ### BEGIN SOLUTION 11 §2
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping
    ### END SOLUTION


def pretokenize(text):
    """Cut ``text`` into GPT-2's pieces: contractions (``'s``, ``'t``, ``'re``, ``'ve``, ``'m``,
    ``'ll``, ``'d``), letters, digits, other symbols -- each run with at most one space before
    it -- and whitespace (a run of it before a non-space leaves that run's last space to the
    next piece). A merge never crosses two pieces.

    text: str -> list of str (joined, they give ``text`` back).
    """
    ### BEGIN SOLUTION 11 §3
    pattern = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    return regex.findall(pattern, text)
    ### END SOLUTION


def word_counts(text):
    """How often each piece of ``text`` occurs, as its word (the tuple of its UTF-8 bytes).

    text: str -> dict: word -> count.
    """
    ### BEGIN SOLUTION 11 §3
    counts = collections.Counter(tuple(piece.encode("utf-8")) for piece in pretokenize(text))
    return dict(counts)
    ### END SOLUTION


# --------------------------------------------------------------------------------------------
# Training: merge the most frequent pair, again and again (11_tokenization §4, §5)


def pair_counts(words):
    """How often each pair occurs: every two ids side by side within a word, counted as often as
    the word occurs (never across two words).

    words: dict word -> count  ->  dict pair -> count.
    """
    ### BEGIN SOLUTION 11 §4
    counts = collections.defaultdict(int)
    for word, count in words.items():
        for pair in itertools.pairwise(word):
            counts[pair] += count
    return dict(counts)
    ### END SOLUTION


def merge_pair(word, pair, new_id):
    """``word`` with every occurrence of ``pair`` replaced by ``new_id``, read left to right (in
    ``(a, a, a)`` the first two merge, the third stays).

    word: tuple of ids; pair: (a, b); new_id: int  ->  tuple of ids.
    """
    ### BEGIN SOLUTION 11 §4
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)
    ### END SOLUTION


def train_bpe(words, num_merges):
    """Learn up to ``num_merges`` merges: each time the most frequent pair (of two as frequent,
    the smaller ``(a, b)``) becomes the next id, 256, 257, ..., in every word. The pair counts
    are updated, not recounted: only the words that contain the merged pair change, so only
    their pairs are taken out (before the merge) and put back (after). Stops early when no pair
    is left.

    words: dict word -> count  ->  merges: list of pairs, in the order learned.
    """
    ### BEGIN SOLUTION 11 §5
    words = [(tuple(word), count) for word, count in words.items()]
    counts = pair_counts(dict(words))
    where = collections.defaultdict(set)  # pair -> the indices of the words that contain it
    for i, (word, _) in enumerate(words):
        for pair in itertools.pairwise(word):
            where[pair].add(i)
    merges = []
    for new_id in range(256, 256 + num_merges):
        if not counts:
            break
        top = max(counts.values())
        best = min(pair for pair, count in counts.items() if count == top)
        merges.append(best)
        for i in sorted(where.pop(best)):
            word, count = words[i]
            merged = merge_pair(word, best, new_id)
            for pair, n in pair_counts({word: count}).items():  # out, before the merge
                counts[pair] -= n
                if counts[pair] == 0:
                    del counts[pair]
            for pair, n in pair_counts({merged: count}).items():  # back in, after it
                counts[pair] = counts.get(pair, 0) + n
                where[pair].add(i)
            words[i] = (merged, count)
    return merges
    ### END SOLUTION


# --------------------------------------------------------------------------------------------
# Encoding and decoding (11_tokenization §6, §7)


def token_bytes(merges):
    """The bytes of every id: ids 0..255 are one byte each, id ``256 + i`` the bytes of the two
    tokens merge ``i`` joins.

    merges: list of pairs  ->  vocab: list of bytes, ``vocab[id]``.
    """
    ### BEGIN SOLUTION 11 §6
    vocab = [bytes([b]) for b in range(256)]
    for a, b in merges:
        vocab.append(vocab[a] + vocab[b])
    return vocab
    ### END SOLUTION


def encode_word(word, ranks):
    """The ids of one piece: of the pairs in the word, merge the one learned first (the lowest
    rank) into ``256 + rank``, again and again, until no pair of the word was learned.

    word: the piece's bytes (or a sequence of ids); ranks: dict pair -> rank  ->  list of ids.
    """
    ### BEGIN SOLUTION 11 §6
    word = tuple(word)
    while len(word) > 1:
        pair = min(itertools.pairwise(word), key=lambda p: ranks.get(p, math.inf))
        if pair not in ranks:
            break
        word = merge_pair(word, pair, 256 + ranks[pair])
    return list(word)
    ### END SOLUTION


def bpe_encode(text, ranks):
    """The ids of ``text``: each piece (:func:`pretokenize`) encoded on its own, as its UTF-8
    bytes; a piece seen before is looked up, not encoded again.

    text: str; ranks: dict pair -> rank  ->  list of ids.
    """
    ### BEGIN SOLUTION 11 §6
    ids, seen = [], {}
    for piece in pretokenize(text):
        if piece not in seen:
            seen[piece] = encode_word(piece.encode("utf-8"), ranks)
        ids.extend(seen[piece])
    return ids
    ### END SOLUTION


def bpe_decode(ids, vocab):
    """The text of ``ids``: their bytes joined, read as UTF-8 (bytes that are not valid UTF-8,
    a character cut in two, become U+FFFD, the replacement character).

    ids: sequence of ints; vocab: list of bytes (:func:`token_bytes`)  ->  str.
    """
    ### BEGIN SOLUTION 11 §7
    return b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")
    ### END SOLUTION
