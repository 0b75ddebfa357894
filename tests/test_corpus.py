"""The character corpus (NumPy's docstrings): deterministic, split by document with
near-duplicates together, tokenised reversibly; the n-gram baselines are distributions."""

import numpy as np
import pytest

from transformer_lab.datasets import corpus as C


@pytest.fixture(scope="module")
def corpus():
    return C.load_corpus()


def test_reading_is_deterministic_and_independent_of_other_imports():
    first = C.read_docstrings()
    import scipy.signal  # noqa: F401 -- SciPy edits numpy.sinc's docstring in this process

    assert C.read_docstrings() == first
    assert list(first) == sorted(first) and len(set(first.values())) == len(first)
    assert all(len(t) >= C.MIN_DOC_CHARS for t in first.values())


LIKE = ("like : array_like, optional\n        Reference object to allow the creation of arrays\n"
        "        which are not NumPy arrays.")


def test_text_numpy_pastes_is_dedented_as_before_python_313():
    # as Python 3.13 leaves them after cleandoc: the pasted parts keep the source's indentation
    body = "Sum.\n\nParameters\n----------\na : array_like\n    The input.\n"
    pasted = body + "\n    Notes\n    -----\n    An alias of `sum`.\n\n    >>> 1\n    1\n    "
    assert C._undo_pasted_indent(pasted) == body + "\nNotes\n-----\nAn alias of `sum`.\n\n>>> 1\n1"
    with_like = f"Ones.\n\nParameters\n----------\n{LIKE}\ndtype : dtype\n    The type."
    assert C._undo_pasted_indent(with_like) == with_like.replace("\n        ", "\n    ")


@pytest.mark.parametrize("doc", [
    # as Python 3.12 and earlier read them (and 3.13 reads everything NumPy does not paste into)
    "Sum.\n\nParameters\n----------\na : array_like\n    The input.\n\nNotes\n-----\nAn alias.",
    f"Ones.\n\nParameters\n----------\n{LIKE.replace('        ', '    ')}",
    # a description of 8 spaces that is not the pasted one; an indented docstring under a signature
    "See also\n--------\nrfft2 : The forward FFT of real input,\n"
    "        of which this is the inverse.",
    "copy(self)\na.copy()\n\n    Copy.\n\n    Parameters\n    ----------\n    order : str",
    "A data-type scalar.\n    ",
])
def test_other_docstrings_are_left_as_they_are(doc):
    assert C._undo_pasted_indent(doc) == doc


def test_split_by_document_with_groups_on_one_side(corpus):
    assert len(corpus.names) == len(corpus.texts) == corpus.is_val.size == corpus.groups.size
    for g in np.unique(corpus.groups):
        assert len(set(corpus.is_val[corpus.groups == g].tolist())) == 1
    s = corpus.stats()
    assert 0.05 < s["val_chars"] / (s["train_chars"] + s["val_chars"]) < 0.15
    assert s["train_documents"] + s["val_documents"] == s["documents"]
    # near-duplicates really are grouped: the polynomial families share a group
    names = corpus.names
    group = corpus.groups[names.index("numpy.polynomial.legendre.legadd")]
    assert corpus.groups[names.index("numpy.polynomial.chebyshev.chebadd")] == group


def test_streams_are_the_documents_in_order(corpus):
    train_texts = [t for t, v in zip(corpus.texts, corpus.is_val, strict=True) if not v]
    expected = np.concatenate([np.r_[corpus.encode(t), C.BOUNDARY] for t in train_texts])
    assert np.array_equal(corpus.train_ids, expected)
    assert corpus.val_ids[-1] == C.BOUNDARY and (corpus.val_ids == C.BOUNDARY).sum() == \
        corpus.is_val.sum()
    assert corpus.vocab[:2] == ("<boundary>", "<unknown>") and corpus.vocab_size == len(
        set(corpus.vocab))


def test_encode_decode(corpus):
    text = "Return the sum of `a` along axis 0.\n>>> np.sum([1, 2])"
    assert corpus.decode(corpus.encode(text)) == text
    assert corpus.decode(corpus.encode("\u00e9\t")) == "\u00bf\u00bf"
    assert corpus.decode([0]) == "\u00a7"


def test_near_duplicate_groups():
    base = "The quick brown fox jumps over the lazy dog, then sleeps in the sun. " * 2
    other = "Completely unrelated text about matrices, determinants and eigenvalues here."
    boiler = "Parameters\n----------\nx : array_like\n    Input array, any shape at all.\n"
    texts = [base, base.replace("fox", "cat"), other, other + " And more words follow it."]
    texts += [f"Function number {i} does a thing of its own. " + boiler for i in range(25)]
    groups = C.near_duplicate_groups(texts)
    assert groups[0] == groups[1] and groups[2] == groups[3] and groups[0] != groups[2]
    assert len(set(groups[4:].tolist())) == 25  # shared boilerplate links nothing


@pytest.mark.parametrize("smoothing,orders", [("laplace", (1, 2, 3)),
                                              ("kneser-ney", (1, 2, 3, 4))])
def test_ngram_models_are_distributions(smoothing, orders):
    rng = np.random.default_rng(0)
    V = 6
    train = rng.integers(0, V, 3000) * (rng.random(3000) < 0.7)  # skewed, with repeats
    for order in orders:
        for context in ([1, 2, 3], [5, 5, 5], [0, 4, 1]):
            context = context[-(order - 1):] if order > 1 else [3]  # unigram: any token
            total = 0.0
            for w in range(V):
                val = np.array([*context, w])
                p = C.ngram_probabilities(train, val, order, V, smoothing)
                total += p[-1] if p.size else 0
            assert abs(total - 1) < 1e-12, (smoothing, order, context, total)


def test_bigram_laplace_by_hand():
    train = np.array([0, 1, 1, 2, 1, 1, 0])
    val = np.array([1, 1, 2])
    p = C.ngram_probabilities(train, val, 2, 3, "laplace")
    # the padded training stream starts with one boundary: pairs (0,0),(0,1),(1,1),(1,2),...
    pairs = list(zip(np.r_[0, train][:-1], np.r_[0, train][1:], strict=True))
    def by_hand(a, b):
        return (pairs.count((a, b)) + 1) / (sum(x == a for x, _ in pairs) + 3)
    assert np.allclose(p, [by_hand(1, 1), by_hand(1, 2)])


def test_all_orders_at_once_equal_one_order_at_a_time(corpus):
    at_once = C.kneser_ney_bits_per_char(corpus, 5)
    assert at_once == [C.ngram_bits_per_char(corpus, n) for n in range(1, 6)]


def test_baselines_on_the_corpus(corpus):
    bits = [C.ngram_bits_per_char(corpus, 1, "laplace"),
            C.ngram_bits_per_char(corpus, 2, "laplace"),
            C.ngram_bits_per_char(corpus, 3), C.ngram_bits_per_char(corpus, 4)]
    assert 4.5 < bits[0] < 5.5 and all(a > b for a, b in zip(bits, bits[1:], strict=False))
    with pytest.raises(ValueError, match="smoothing"):
        C.ngram_probabilities(corpus.train_ids, corpus.val_ids, 2, corpus.vocab_size, "witten")
