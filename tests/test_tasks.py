"""transformer_lab.datasets.tasks: tasks, splits without overlap, padding, batches, metrics."""

import numpy as np
import pytest

from transformer_lab.datasets import tasks as D


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


def test_held_out_sources_are_a_random_subset_not_the_first_drawn():
    # only 10 sources of length 1 and 100 of length 2 exist: they are drawn early and often.
    # Holding out the first sources drawn would hold out nearly all of them; a random subset
    # leaves most of them to train on.
    task = D.get_task("reverse", max_len=10)
    train, test = D.make_splits(task, 20000, 1000, seed=0)
    short_train = sum(len(s) <= 2 for s, _ in train)
    short_test = sum(len(s) <= 2 for s, _ in test)
    assert short_train > 10 * short_test
    lengths = np.bincount([len(s) for s, _ in test], minlength=11)
    assert lengths[1:3].sum() < 0.02 * len(test) and lengths[10] > 0.1 * len(test)


def test_bucketed_batches_cover_every_pair_once_with_little_padding():
    task = D.get_task("copy", max_len=10)
    pairs, _ = D.make_splits(task, 1000, 0, seed=1)
    rng = np.random.default_rng(0)
    batches = list(D.bucketed_batches(pairs, 32, rng, pool=8))
    assert [b[0].shape[0] for b in batches].count(32) == 31 and len(batches) == 32
    seen = sorted(D.strip(row) for src, _ in batches for row in src)
    assert seen == sorted(s for s, _ in pairs)
    targets = sorted(D.strip(row) for _, tgt in batches for row in tgt)
    assert targets == sorted(t for _, t in pairs)
    bucketed = np.mean([np.mean(src == D.PAD) for src, _ in batches])
    plain = np.mean([np.mean(src == D.PAD)
                     for src, _ in D.iterate_batches(pairs, 32, np.random.default_rng(0))])
    assert bucketed < 0.3 * plain
    assert len(list(D.bucketed_batches(pairs, 32, rng, drop_last=True))) == 31
    again = list(D.bucketed_batches(pairs, 32, np.random.default_rng(0), pool=8))
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(batches, again, strict=True))  # seeded
    with pytest.raises(ValueError, match="pool must be at least 1, got 0"):
        next(D.bucketed_batches(pairs, 32, rng, pool=0))


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
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        next(D.iterate_batches([((3,), (3,))], 0))
    with pytest.raises(ValueError, match="length must be at least the longest"):
        D.pad([(3, 4)], length=1)
    with pytest.raises(ValueError, match="same length"):
        D.exact_match([[3]], [])


def test_splits_check_task_and_seed():
    task = D.get_task("copy", max_len=3)
    with pytest.raises(TypeError, match=r"task must be a Task, e.g. get_task\('copy'\)"):
        D.make_splits("copy", 10, 2)
    for bad, error, message in [(-1, ValueError, "seed must be at least 0, got -1"),
                                ("x", TypeError, "seed must be an integer, got 'x'"),
                                (None, TypeError, "seed must be an integer"),
                                (1.0, TypeError, "seed must be an integer")]:
        with pytest.raises(error, match=message):
            D.make_splits(task, 10, 2, seed=bad)
    with pytest.raises(TypeError, match="n_train must be an integer"):
        D.make_splits(task, 10.0, 2)
    assert D.make_splits(task, 10, 2, seed=np.int64(3)) == D.make_splits(task, 10, 2, seed=3)
    with pytest.raises(TypeError, match="rng must be a NumPy random Generator"):
        task.sample(0)


def test_batches_check_their_arguments_when_called():
    pairs = [((3, 4), (4, 3)), ((5,), (5,))]
    with pytest.raises(TypeError, match=r"rng must be a NumPy random Generator, e.g. "
                                        r"np.random.default_rng\(0\), got 0"):
        D.iterate_batches(pairs, 2, rng=0)  # at the call, before the first batch
    with pytest.raises(TypeError, match="rng must be a NumPy random Generator, .* got None"):
        D.bucketed_batches(pairs, 2, None)
    with pytest.raises(TypeError, match="batch_size must be an integer"):
        D.bucketed_batches(pairs, 2.0, np.random.default_rng(0))
    with pytest.raises(TypeError, match="pool must be an integer"):
        D.bucketed_batches(pairs, 2, np.random.default_rng(0), pool="4")
    src, tgt = next(D.iterate_batches(pairs, np.int64(2)))
    assert src.shape == (2, 2) and tgt.shape == (2, 4)


def test_pad_and_detokenize_check_their_arguments():
    with pytest.raises(TypeError, match="length must be an integer, got 2.0"):
        D.pad([(3, 4)], length=2.0)
    assert D.pad([(3, 4)], length=np.int64(3)).tolist() == [[3, 4, 0]]
    task = D.get_task("reverse")  # 13 tokens
    with pytest.raises(ValueError, match=r"ids must be token ids of task 'reverse', in "
                                         r"\[0, 13\), found 99"):
        D.detokenize([1, 3, 99, 2], task)
    with pytest.raises(ValueError, match=r"found -1"):
        D.detokenize([3, -1], task)
    assert D.detokenize([1, 3, 4, 2, 99], task) == "a b"  # nothing after </s> is read
    with pytest.raises(TypeError, match="task must be a Task"):
        D.detokenize([3], "reverse")
    with pytest.raises(TypeError, match="max_len must be an integer"):
        D.get_task("copy", max_len=5.0)
    assert D.get_task("copy", min_len=np.int64(2), max_len=np.int32(4)).max_len == 4
