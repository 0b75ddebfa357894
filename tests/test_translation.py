"""Translation (notebook 12): the number data and its split, the label-smoothed loss against
PyTorch's, beam search (greedy at size 1, exhaustive when wide, the same with and without the
cache), the trainer's command line and the shipped checkpoint."""

import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from transformer_lab.core import layers as core_layers
from transformer_lab.core.translation import (
    beam_search,
    beam_step,
    label_smoothed_loss_backward,
    label_smoothed_loss_forward,
    length_penalty,
)
from transformer_lab.datasets import tasks as D
from transformer_lab.datasets.translation import (
    make_example,
    make_translation_data,
    rule_accuracy,
    to_words,
    vocabularies,
)
from transformer_lab.models.encoder_decoder import Transformer, TransformerConfig
from transformer_lab.train.translate import (
    CHECKPOINT,
    EARLY_CHECKPOINT,
    GERMAN_CHECKPOINT,
    TranslateConfig,
    held_out_examples,
    train_translation,
)

# --------------------------------------------------------------------------------------------
# Data


def _key(e):
    return (e.kind == "money", e.number)


def test_splits_share_no_number_and_follow_the_seed():
    data = make_translation_data(3000, 200, 300, seed=3)
    assert [len(data.train), len(data.val), len(data.test)] == [3000, 200, 300]
    keys = [{_key(e) for e in split} for split in (data.train, data.val, data.test)]
    assert not (keys[0] & keys[1] or keys[0] & keys[2] or keys[1] & keys[2])
    sources = [e.source for split in (data.train, data.val, data.test) for e in split]
    assert len(set(sources)) == len(sources)
    again = make_translation_data(3000, 200, 300, seed=3)
    assert again.test == data.test and again.train == data.train
    assert make_translation_data(3000, 200, 300, seed=4).test != data.test
    assert {e.kind for e in data.train} == {"cardinal", "ordinal", "year", "money"}


def test_pairs_are_characters_with_the_task_specials():
    data = make_translation_data(200, 10, 10, seed=0)
    src, tgt = data.pairs("test")[0]
    e = data.test[0]
    assert data.src_vocab.decode(src) == e.source and data.tgt_vocab.decode(tgt) == e.target
    assert len(src) == len(e.source) and min(src) >= 3 and min(tgt) >= 3
    assert data.tgt_vocab.tokens[:3] == D.SPECIALS
    assert data.tgt_vocab.decode([D.BOS, *tgt, D.EOS, D.PAD, 5]) == e.target
    assert vocabularies("fr") == (data.src_vocab, data.tgt_vocab)  # whatever the draw


@pytest.mark.parametrize("number, kind, target, rules", [
    (71, "cardinal", "soixante et onze", {"vigesimal", "et un"}),
    (80, "cardinal", "quatre-vingts", {"vigesimal", "quatre-vingts", "hyphen"}),
    (81, "cardinal", "quatre-vingt-un", {"vigesimal", "hyphen"}),
    (200, "cardinal", "deux cents", {"cents"}),
    (201, "cardinal", "deux cent un", set()),
    (21000, "cardinal", "vingt et un mille", {"et un", "thousands"}),
    (80, "ordinal", "quatre-vingtième", {"vigesimal", "hyphen"}),
    (300, "ordinal", "trois centième", set()),
    (1984, "year", "mille neuf cent quatre-vingt-quatre", {"vigesimal", "hyphen",
                                                            "thousands"}),
    (350, "money", "trois euros et cinquante centimes", set()),
])
def test_french_rules(number, kind, target, rules):
    e = make_example(number, kind, "fr")
    assert e.target == target and set(e.rules) == rules


def test_german_direction():
    e = make_example(42, "cardinal", "de")
    assert e.source == "forty-two" and e.target == "zweiundvierzig"
    assert set(e.rules) == {"units-before-tens", "one word"}
    data = make_translation_data(100, 10, 10, seed=0, lang="de")
    assert data.lang == "de" and "ü" in data.tgt_vocab.tokens


def test_data_arguments_are_checked():
    with pytest.raises(ValueError, match="lang must be one of"):
        make_translation_data(10, 1, 1, lang="es")
    with pytest.raises(TypeError, match="n_train must be an integer"):
        make_translation_data(10.0)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        vocabularies("fr")[1].encode("ñ")
    assert to_words(1234, "money", "en") == "twelve euro, thirty-four cents"


def test_rule_accuracy_counts_by_kind_and_rule():
    ex = [make_example(71, "cardinal"), make_example(80, "cardinal"), make_example(5, "year")]
    acc = rule_accuracy(ex, [True, False, True])
    assert acc["vigesimal"] == (1, 2) and acc["cardinal"] == (1, 2) and acc["year"] == (1, 1)


# --------------------------------------------------------------------------------------------
# Label smoothing


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothed_loss_matches_torch(eps):
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 5, 7))
    targets = rng.integers(0, 7, (3, 5))
    targets[0, 2] = targets[2, 4] = -1
    loss, cache = label_smoothed_loss_forward(logits, targets, eps, -1)
    dlogits = label_smoothed_loss_backward(1.0, cache)
    x = torch.tensor(logits, requires_grad=True)
    ref = torch.nn.functional.cross_entropy(x.reshape(-1, 7), torch.tensor(targets).reshape(-1),
                                            label_smoothing=eps, ignore_index=-1)
    ref.backward()
    assert abs(loss - ref.item()) < 1e-12
    assert np.abs(dlogits - x.grad.numpy()).max() < 1e-12
    if eps == 0:  # no smoothing: the cross-entropy of notebook 06
        assert abs(loss - core_layers.cross_entropy_forward(logits, targets, -1)[0]) < 1e-12
    half = label_smoothed_loss_backward(0.5, cache)
    assert np.allclose(half, dlogits / 2)


def test_label_smoothed_gradient_keeps_the_dtype():
    logits = np.zeros((2, 3, 5), np.float32)
    _, cache = label_smoothed_loss_forward(logits, np.ones((2, 3), int), 0.1, -1)
    assert label_smoothed_loss_backward(1.0, cache).dtype == np.float32


# --------------------------------------------------------------------------------------------
# Beam search


def _model(V=9, seed=1, max_len=12, forbid_specials=True):
    cfg = TransformerConfig(src_vocab_size=V, tgt_vocab_size=V, d_model=16, num_heads=2,
                            num_encoder_layers=1, num_decoder_layers=2, d_ff=32, max_len=max_len,
                            dtype=np.float64)
    model = Transformer(cfg, seed=seed)
    if forbid_specials:  # a trained model never emits padding or BOS
        model.params["out_proj.b"][:2] = -30.0
    return model


def test_length_penalty_is_gnmts():
    assert length_penalty(np.array([1, 7]), 0.6).tolist() == [1.0, 2.0 ** 0.6]
    assert length_penalty(np.array([4]), 0.0).tolist() == [1.0]


def test_beam_of_one_is_greedy():
    rng = np.random.default_rng(0)
    src = rng.integers(3, 9, (6, 5))
    for forbid in (False, True):  # uncached: padding masked as greedy masks it
        model = _model(forbid_specials=forbid)
        greedy = model.greedy_decode(src, max_len=10, padded=True)
        beam = model.beam_decode(src, beam_size=1, max_len=10, padded=True, cache=False)
        assert np.array_equal(greedy, beam)
    assert np.array_equal(greedy, model.beam_decode(src, beam_size=1, max_len=10, padded=True))


@pytest.mark.parametrize("beam_size", [1, 2, 4, 7])
def test_cached_and_uncached_beams_agree(beam_size):
    rng = np.random.default_rng(beam_size)
    src = rng.integers(3, 9, (4, 6))
    src[1, 4:] = 0  # padding in a source
    model = _model(seed=beam_size)
    a, (seqs_a, scores_a) = model.beam_decode(src, beam_size, max_len=9, n_best=True,
                                              cache=False)
    b, (seqs_b, scores_b) = model.beam_decode(src, beam_size, max_len=9, n_best=True)
    assert np.array_equal(seqs_a, seqs_b) and np.allclose(scores_a, scores_b, atol=1e-12)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert np.all(np.diff(scores_b, axis=1) <= 0)  # best first


def _exhaustive(model, src, max_len, alpha):
    """Every output the search can produce (EOS at length L <= max_len, or max_len tokens
    without EOS), scored as the search scores it: summed log-probability / lp(L)."""
    V, eos = model.config.tgt_vocab_size, model.config.eos_id
    best = []
    for b in range(src.shape[0]):
        cands = []
        for L in range(1, max_len + 1):
            for body in itertools.product([t for t in range(V) if t != eos], repeat=L - 1):
                cands.append(body + (eos,))
                if L == max_len:
                    cands += [body + (t,) for t in range(V) if t != eos]
        width = max(map(len, cands))
        tgt = np.full((len(cands), width + 1), 0, dtype=np.int64)
        tgt[:, 0] = 1
        for i, c in enumerate(cands):
            tgt[i, 1:1 + len(c)] = c
        logits, _ = model.forward(np.repeat(src[b:b + 1], len(cands), 0), tgt[:, :-1],
                                  tgt_key_padding_mask=np.zeros((len(cands), width), bool))
        logp = core_layers.log_softmax_forward(logits)[0]
        picked = np.take_along_axis(logp, tgt[:, 1:, None], -1)[..., 0]
        lengths = np.array([len(c) for c in cands])
        total = np.where(np.arange(width) < lengths[:, None], picked, 0).sum(1)
        score = total / length_penalty(lengths, alpha)
        i = int(np.argmax(score))
        best.append((cands[i], score[i]))
    return best


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.5])
def test_a_wide_beam_finds_the_best_sequence(alpha):
    """V = 5 tokens and 4 steps: 5^4 hypotheses at most, all kept by a beam of 625."""
    rng = np.random.default_rng(1)
    model = _model(V=5, seed=2, forbid_specials=False)
    src = rng.integers(3, 5, (3, 4))
    found, (seqs, scores) = model.beam_decode(src, beam_size=625, max_len=4, alpha=alpha,
                                              n_best=True)
    for b, (cand, score) in enumerate(_exhaustive(model, src, 4, alpha)):
        assert tuple(found[b]) == cand
        assert abs(scores[b, 0] - score) < 1e-10


def garden_path_step(prefix, rows):
    """Tokens 0 pad, 1 BOS, 2 EOS, 3 "a", 4 "b": first "a" 0.6, "b" 0.4; after "a" anything
    (0.25 each but BOS); after "b", EOS 0.9; after those, EOS."""
    out = np.full((prefix.shape[0], 5), 1e-9)
    for i, p in enumerate(prefix):
        last = p[-1]
        if len(p) == 1:
            out[i, [3, 4]] = 0.6, 0.4
        elif last == 3:
            out[i, [0, 2, 3, 4]] = 0.25
        elif last == 4 and len(p) == 2:
            out[i, [2, 3]] = 0.9, 0.1
        else:
            out[i, 2] = 1.0
    return np.log(out)


def test_a_narrow_beam_can_miss_what_a_wide_one_finds():
    """Greedy takes "a" (0.6), then at best 0.25: 0.15 in all; beam 2 keeps "b" (0.4) and finds
    "b" EOS: 0.36."""
    greedy, g_scores = beam_search(garden_path_step, 1, 1, 3, 1, 2, 0, alpha=0.0)
    beam, b_scores = beam_search(garden_path_step, 1, 2, 3, 1, 2, 0, alpha=0.0)
    assert greedy[0, 0, 1] == 3 and np.exp(g_scores[0, 0]) == pytest.approx(0.15)
    assert beam[0, 0, 1:3].tolist() == [4, 2] and np.exp(b_scores[0, 0]) == pytest.approx(0.36)


def test_finished_hypotheses_stay_with_their_score():
    """A finished hypothesis is extended by padding only, its score and length unchanged."""
    scores = np.array([[-1.0, -2.0]])
    lengths = np.array([[3, 2]])
    finished = np.array([[True, False]])
    logp = np.log(np.full((1, 2, 4), 0.25))
    parents, tokens, new, lens, fin = beam_step(scores, lengths, finished, logp, 0.0, 2, 0)
    assert parents[0, 0] == 0 and tokens[0, 0] == 0 and new[0, 0] == -1.0 and lens[0, 0] == 3
    assert fin[0, 0] and parents[0, 1] == 1 and lens[0, 1] == 3
    assert new[0, 1] == pytest.approx(-2.0 + np.log(0.25))


def test_beam_search_core_takes_any_step():
    """A step that ignores the prefix: the best sequences are the best tokens, once each."""
    logp = np.log(np.array([0.05, 0.05, 0.1, 0.5, 0.3]))

    def step(prefix, rows):
        return np.broadcast_to(logp, (prefix.shape[0], 5))

    seqs, scores = beam_search(step, 2, 3, 1, 1, 2, 0, alpha=0.0)
    assert seqs.shape == (2, 3, 2) and seqs[0, :, 1].tolist() == [3, 4, 2]
    assert np.allclose(scores[0], np.log([0.5, 0.3, 0.1]))


def test_beam_decode_checks_its_arguments():
    model = _model()
    src = np.full((1, 3), 4)
    with pytest.raises(ValueError, match="beam_size must be at least 1"):
        model.beam_decode(src, beam_size=0)
    with pytest.raises(TypeError, match="beam_size must be an integer"):
        model.beam_decode(src, beam_size=2.0)
    with pytest.raises(ValueError, match="alpha must be at least 0"):
        model.beam_decode(src, alpha=-1)
    with pytest.raises(ValueError, match="max_len must be at most"):
        model.beam_decode(src, max_len=100)
    with pytest.raises(TypeError, match="cache must be True or False"):
        model.beam_decode(src, cache=1)


# --------------------------------------------------------------------------------------------
# The trainer

TINY = dict(n_train=300, n_val=20, n_test=20, d_model=16, num_heads=2, num_layers=1, d_ff=32,
            steps=6, warmup=2, eval_every=3, batch_size=16)
TINY_ARGS = [x for k, val in TINY.items() for x in ("--" + k.replace("_", "-"), str(val))]


def test_training_is_deterministic_and_reports_the_metrics():
    a = train_translation(TranslateConfig(**TINY))
    b = train_translation(TranslateConfig(**TINY))
    assert a.history["loss"] == b.history["loss"]
    assert set(a.metrics) >= {"exact_match", "beam_exact_match", "bleu", "chrf", "seconds",
                              "train_seconds", "cpu_seconds"}
    with pytest.raises(ValueError, match="label_smoothing must be less than 1"):
        TranslateConfig(label_smoothing=1.0)
    with pytest.raises(ValueError, match="batch_size must be at most n_train = 10, got 16"):
        TranslateConfig(n_train=10, batch_size=16)  # no full batch: training could never step
    with pytest.raises(ValueError, match="beam_size must be at most 64, got 65: the evaluation "
                                         "decodes 200 test sentences at a time"):
        TranslateConfig(beam_size=65)  # refused before training, not after it


def _run(args, env=None):
    return subprocess.run([sys.executable, "-m", "transformer_lab.train", *args],
                          capture_output=True, text=True, timeout=300, env=env)


def test_cli_prints_one_json_line(tmp_path):
    path = tmp_path / "m.npz"
    proc = _run(["--task", "translate-fr", "--seed", "1", *TINY_ARGS, "--checkpoint", str(path),
                 "--examples", "2"])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1
    metrics = json.loads(lines[0])
    for key in ("exact_match", "beam_exact_match", "bleu", "chrf", "seconds"):
        assert isinstance(metrics[key], (int, float)), key
    assert metrics["task"] == "translate-fr" and "step " in proc.stderr
    assert metrics["checkpoint"] == str(path)
    model = Transformer.load(path)
    record = model.metadata
    assert record["command"].startswith("python -m transformer_lab.train --task translate-fr")
    assert str(tmp_path) not in record["command"] and len(record["test"]) == 20


@pytest.mark.parametrize("module,name", [("translation", "label_smoothed_loss_forward"),
                                         ("training", "train_step")])
def test_cli_stops_at_the_first_stub(tmp_path, module, name):
    (tmp_path / "sitecustomize.py").write_text(
        f"import transformer_lab.core.{module} as m\n\n"
        "def stub(*args, **kwargs):\n"
        "    raise NotImplementedError('stub message')\n\n"
        f"m.{name} = stub\n")
    path = os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": path}
    proc = _run(["--task", "translate-fr", *TINY_ARGS], env)
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr.rstrip().endswith("not written yet: stub message"), proc.stderr
    assert "step " not in proc.stderr


def test_cli_refuses_bad_options():
    proc = _run(["--task", "translate-fr", "--steps", "5", "--warmup", "9"])
    assert proc.returncode == 2 and "warmup=9 must be less than steps=5" in proc.stderr


def test_cli_help_describes_every_option_with_its_default(capsys):
    from transformer_lab.train.cli import main
    from transformer_lab.train.translate import _parser

    actions = [a for a in _parser()._actions if a.dest != "help"]
    assert len(actions) > 20 and all(len((a.help or "").split()) > 2 for a in actions), [
        a.dest for a in actions if len((a.help or "").split()) <= 2]
    with pytest.raises(SystemExit):
        main(["--task", "translate-fr", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps to the terminal width
    assert text.count("(default: ") == len(actions)
    for expected in ("(default: 40000)", "(default: 0.6)", "label-smoothed loss", "BLAS"):
        assert expected in text, expected


# --------------------------------------------------------------------------------------------
# The shipped checkpoint


def test_shipped_checkpoint_is_small_and_recorded():
    assert CHECKPOINT.stat().st_size < 5e6
    model = Transformer.load(CHECKPOINT)
    record = model.metadata
    assert record["command"].startswith("python -m transformer_lab.train --task translate-fr")
    assert record["metrics"]["exact_match"] >= 0.9
    config = TranslateConfig(**record["config"])
    data = make_translation_data(config.n_train, config.n_val, config.n_test, config.seed,
                                 config.lang)
    assert [[e.kind, e.number] for e in data.test] == record["test"]


def test_the_other_shipped_checkpoints():
    """Notebook 12's undertrained checkpoint (the same data, 300 steps) and its German one."""
    sizes = sum(p.stat().st_size for p in (CHECKPOINT, EARLY_CHECKPOINT, GERMAN_CHECKPOINT))
    assert sizes < 5e6
    early, german = Transformer.load(EARLY_CHECKPOINT), Transformer.load(GERMAN_CHECKPOINT)
    assert early.metadata["test"] == Transformer.load(CHECKPOINT).metadata["test"]
    assert early.metadata["metrics"]["steps"] == 300
    assert early.metadata["metrics"]["beam_exact_match"] > early.metadata["metrics"]["exact_match"]
    assert german.metadata["config"]["lang"] == "de"
    assert german.metadata["metrics"]["exact_match"] >= 0.9
    assert held_out_examples(german)[0].target == make_example(
        *reversed(german.metadata["test"][0]), "de").target
