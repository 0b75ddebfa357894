"""transformer_lab.data: tasks, splits without overlap, padding, batches, metrics."""

import numpy as np
import pytest

from transformer_lab import data as D


@pytest.mark.parametrize("name", D.TASKS)
def test_tasks_produce_correct_pairs(name):
    task = D.get_task(name)
    rng = np.random.default_rng(0)
    for _ in range(200):
        src, tgt = task.sample(rng)
        assert all(3 <= t < task.vocab_size for t in src + tgt)
        assert len(src) <= task.max_src_len and len(tgt) + 2 <= task.max_tgt_len
        if name == "copy":
            assert tgt == src
        elif name == "reverse":
            assert tgt == src[::-1]
        elif name == "sort":
            assert tgt == tuple(sorted(src))
        else:
            text = "".join(task.vocab[t] for t in src)
            a, b = text.split("+")
            assert "".join(task.vocab[t] for t in tgt) == str(int(a) + int(b))


def test_splits_are_seeded_disjoint_and_sized():
    task = D.get_task("reverse", max_len=6)
    train, test = D.make_splits(task, 300, 50, seed=3)
    assert len(train) == 300 and len(test) == 50
    assert not {s for s, _ in train} & {s for s, _ in test}
    assert len({s for s, _ in train}) == 300
    assert D.make_splits(task, 300, 50, seed=3) == (train, test)
    assert D.make_splits(task, 300, 50, seed=4) != (train, test)


def test_splits_refuse_more_than_the_task_has():
    task = D.get_task("copy", min_len=1, max_len=1, num_symbols=3)
    with pytest.raises(ValueError, match="exceeds the 3 distinct sources"):
        D.make_splits(task, 3, 1)


def test_padding_and_batches():
    src = D.pad([(3, 4, 5), (6,)])
    np.testing.assert_array_equal(src, [[3, 4, 5], [6, 0, 0]])
    tgt = D.pad([(3, 4), ()], bos_eos=True)
    np.testing.assert_array_equal(tgt, [[1, 3, 4, 2], [1, 2, 0, 0]])
    pairs = [((3 + i % 5,) * (1 + i % 4), (4,)) for i in range(10)]
    batches = list(D.iterate_batches(pairs, 4, rng=np.random.default_rng(0)))
    assert [b[0].shape[0] for b in batches] == [4, 4, 2]
    assert len(list(D.iterate_batches(pairs, 4, drop_last=True))) == 2
    seen = sorted(tuple(D.strip(row)) for s, _ in batches for row in s)
    assert seen == sorted(s for s, _ in pairs)


def test_metrics_and_detokenize():
    task = D.get_task("add")
    assert D.detokenize([1, 4, 5, 2, 0], task) == "12"
    preds = [[1, 3, 4, 2], [3, 5, 2, 9]]
    tgts = [[1, 3, 4, 2, 0], [1, 3, 4, 2]]
    assert D.exact_match(preds, tgts) == 0.5
    assert D.token_accuracy(preds, tgts) == pytest.approx(5 / 6)  # 3/3 and 2/3 (</s> counts)


def test_data_rejects_bad_input():
    with pytest.raises(ValueError, match="name must be one of"):
        D.get_task("translate")
    with pytest.raises(ValueError, match="min_len must be at most max_len"):
        D.get_task("copy", min_len=5, max_len=2)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        next(D.iterate_batches([((3,), (3,))], 0))
    with pytest.raises(ValueError, match="length must be at least the longest"):
        D.pad([(3, 4)], length=1)
    with pytest.raises(ValueError, match="same length"):
        D.exact_match([[3]], [])
