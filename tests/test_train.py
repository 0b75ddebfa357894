"""transformer_lab.train: the command line (JSON line, progress modes), checkpoints (round trip,
clear refusals), training that lowers the loss, early stopping, and NumPy and PyTorch following
the same loss curve from the same weights on the same batches."""

import dataclasses
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from transformer_lab import data as D
from transformer_lab.train import (
    Progress,
    TrainConfig,
    batch_stream,
    evaluate,
    main,
    make_data,
    make_model,
    numpy_loss_curve,
    step_times,
    teacher_forced_accuracy,
    torch_loss_curve,
    train,
)
from transformer_lab.transformer import CheckpointError, Transformer, TransformerConfig

# a model and data small enough to train in about a second
TINY = dict(max_len=4, num_symbols=5, n_train=600, n_val=40, n_test=40, d_model=16,
            num_heads=2, num_layers=1, d_ff=32, batch_size=16, eval_every=20, warmup=10,
            time_budget=None)
TINY_ARGS = ["--max-len", "4", "--num-symbols", "5", "--n-train", "600", "--n-val", "40",
             "--n-test", "40", "--d-model", "16", "--heads", "2", "--layers", "1", "--d-ff", "32",
             "--batch-size", "16", "--warmup", "10"]
KEYS = {"task", "seed", "exact_match", "token_accuracy", "steps", "seconds", "tokens_per_s",
        "params", "threads", "stopped"}


@pytest.fixture(scope="module")
def copy_run():
    """A short copy run: 150 steps, no early stopping."""
    return train("copy", seed=0, steps=150, target=None, progress="none", **TINY)


# ----------------------------------------------------------------------------- command line


def test_cli_plain_lines_and_one_json_line_at_the_end():
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-m", "transformer_lab.train", "--task", "copy",
                           "--seed", "1", "--steps", "30", "--eval-every", "10",
                           "--log-every", "10", "--target", "0", *TINY_ARGS],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    metrics = json.loads(lines[-1])
    assert KEYS <= set(metrics)
    assert metrics["task"] == "copy" and metrics["seed"] == 1 and metrics["steps"] == 30
    assert 0 <= metrics["exact_match"] <= metrics["token_accuracy"] <= 1
    assert metrics["tokens_per_s"] > 0 and metrics["seconds"] > 0
    # not a terminal: plain lines every 10 steps, no carriage returns
    assert "\r" not in proc.stdout
    assert [ln.split()[1] for ln in lines if ln.startswith("step") and "loss" in ln] == \
        ["10/30", "20/30", "30/30"]
    assert sum("validation exact match" in ln for ln in lines) == 3
    assert all(not ln.startswith("{") for ln in lines[:-1])


def test_cli_in_process_checkpoint_init_examples_and_errors(tmp_path, capsys):
    path = tmp_path / "copy.npz"
    assert main(["--task", "copy", "--steps", "20", "--progress", "none", "--examples", "2",
                 "--checkpoint", str(path), *TINY_ARGS]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 3 and "->" in out[0]  # two examples, then the JSON line
    metrics = json.loads(out[-1])
    assert metrics["checkpoint"] == str(path) and path.exists()
    # start again from the checkpoint
    assert main(["--task", "copy", "--steps", "5", "--progress", "none", "--init", str(path),
                 *TINY_ARGS]) == 0
    json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # a checkpoint of another size is refused with the tensor named
    with pytest.raises(SystemExit):
        main(["--task", "copy", "--init", str(path), "--d-ff", "8",
              *[a for a in TINY_ARGS if a not in ("--d-ff", "32")]])
    assert "has shape (16, 32) in the checkpoint but (16, 8) in the model" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--task", "copy", "--heads", "3"])
    assert "d_model must be divisible by num_heads" in capsys.readouterr().err


def test_progress_bar_on_a_terminal_and_lines_otherwise():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    tty = Terminal()
    bar = Progress(50, tty, "auto", log_every=10)
    for step in range(1, 51):
        bar.update(step, 1.0 / step, 1e-3, 0.01 * step)
    bar.evaluated(50, 0.5, 0.75)
    bar.close()
    text = tty.getvalue()
    assert bar.mode == "bar" and text.startswith("\r[") and "50/50" in text
    assert text.endswith("\n") and text.count("\n") == 1
    plain = io.StringIO()
    bar = Progress(50, plain, "auto", log_every=25)
    for step in range(1, 51):
        bar.update(step, 1.0, 1e-3, 0.1)
    assert bar.mode == "lines" and plain.getvalue().count("\n") == 2
    assert "\r" not in plain.getvalue()
    silent = io.StringIO()
    bar = Progress(5, silent, "none")
    bar.update(5, 1.0, 1e-3, 0.1)
    bar.message("done")
    assert silent.getvalue() == ""


# ----------------------------------------------------------------------------- training


def test_short_run_lowers_the_loss_and_reports_metrics(copy_run):
    h = copy_run.history
    assert len(h.loss) == len(h.lr) == len(h.grad_norm) == 150
    assert np.mean(h.loss[-10:]) < 0.6 * h.loss[0]
    assert h.eval_step == [20, 40, 60, 80, 100, 120, 140, 150]
    m = copy_run.metrics
    assert m["stopped"] == "steps" and m["steps"] == 150
    assert m["params"] == copy_run.model.num_parameters()
    assert 0 <= m["exact_match"] <= m["token_accuracy"] <= 1
    ex = copy_run.examples(3)
    assert len(ex) == 3 and all(isinstance(s, str) for s, _, _, _ in ex)
    # the lr schedule: warm-up then cosine decay to zero at the last step
    assert h.lr[9] == pytest.approx(copy_run.config.lr) and h.lr[-1] < 1e-3 * h.lr[9]


def test_runs_are_deterministic():
    kw = dict(seed=3, steps=15, target=None, progress="none", **TINY)
    a, b = train("reverse", **kw), train("reverse", **kw)
    assert a.history.loss == b.history.loss
    assert all(np.array_equal(a.model.params[k], b.model.params[k]) for k in a.model.params)
    assert train("reverse", **{**kw, "seed": 4}).history.loss != a.history.loss


def test_teacher_forced_exact_match_equals_greedy_decoding(copy_run):
    for pairs in (copy_run.val, copy_run.test):
        greedy = evaluate(copy_run.model, pairs)
        forced = teacher_forced_accuracy(copy_run.model, pairs, batch_size=7)
        assert forced["exact_match"] == greedy["exact_match"]
        assert forced["token_accuracy"] >= greedy["token_accuracy"] - 1e-12


def test_early_stopping_on_target_and_time_budget():
    cfg = TrainConfig.for_task("copy", steps=400, **{**TINY, "max_len": 2, "n_train": 20,
                                                     "n_val": 5, "n_test": 5})
    result = train(cfg, target=0.5, progress="none")
    assert result.metrics["stopped"] == "target"
    assert result.history.val_exact[-1] >= 0.5 and result.metrics["steps"] < 400
    result = train(cfg, target=None, time_budget=1e-3, progress="none")
    assert result.metrics["stopped"] == "time" and result.metrics["steps"] == 1


def test_splits_are_disjoint_and_batches_bucketed():
    cfg = TrainConfig.for_task("reverse", n_train=2000, n_val=100, n_test=100)
    task, tr, va, te = make_data(cfg)
    sources = [{s for s, _ in split} for split in (tr, va, te)]
    assert [len(s) for s in sources] == [2000, 100, 100]
    assert not (sources[0] & sources[1] or sources[0] & sources[2] or sources[1] & sources[2])
    stream = batch_stream(tr, 64, seed=0)
    pad = [np.mean(src == D.PAD) for src, _ in (next(stream) for _ in range(31))]
    plain = batch_stream(tr, 64, seed=0, bucket=False)
    pad_plain = [np.mean(src == D.PAD) for src, _ in (next(plain) for _ in range(31))]
    assert np.mean(pad) < 0.2 * np.mean(pad_plain)


def test_config_checks():
    with pytest.raises(ValueError, match="task must be one of"):
        TrainConfig(task="translate")
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        TrainConfig(batch_size=0)
    with pytest.raises(ValueError, match="target must be in"):
        TrainConfig(target=1.5)
    with pytest.raises(ValueError, match="needs a validation set"):
        TrainConfig(n_val=0)
    with pytest.raises(ValueError, match="exceeds the 156 distinct sources of task 'copy'"):
        TrainConfig(task="copy", max_len=2, num_symbols=12)
    with pytest.raises(TypeError, match="unknown training option"):
        TrainConfig.for_task("copy", epochs=3)
    assert TrainConfig.for_task("add").steps == 3000
    with pytest.raises(ValueError, match="config does not fit"):
        train("copy", model=Transformer(TransformerConfig(9, 9)), progress="none", **TINY)


# ----------------------------------------------------------------------------- checkpoints


def test_checkpoint_round_trip(tmp_path, copy_run):
    model = copy_run.model
    path = model.save(tmp_path / "model", metadata={"step": 150, "task": "copy"})
    assert path.endswith("model.npz")
    loaded = Transformer.load(path)
    assert loaded.config == model.config
    assert list(loaded.params) == list(model.params)
    for name, p in model.params.items():
        assert np.array_equal(loaded.params[name], p) and loaded.params[name].dtype == p.dtype
    src = D.pad([s for s, _ in copy_run.test[:10]])
    assert [list(x) for x in loaded.greedy_decode(src)] == \
        [list(x) for x in model.greedy_decode(src)]
    fresh = make_model(copy_run.config)
    assert fresh.load_params(path) == {"step": 150, "task": "copy"}
    assert all(np.array_equal(fresh.params[k], model.params[k]) for k in model.params)
    f64 = Transformer.load(model.astype(np.float64).save(tmp_path / "f64.npz"))
    assert f64.config.dtype == np.float64


def test_checkpoint_refusals_name_the_tensor_and_both_shapes(tmp_path, copy_run):
    path = copy_run.model.save(tmp_path / "model.npz")
    config = copy_run.model.config
    wider = Transformer(dataclasses.replace(config, d_ff=24))
    before = {k: p.copy() for k, p in wider.params.items()}
    with pytest.raises(CheckpointError, match=r"parameter 'encoder.layers.0.ff.W1' has shape "
                                              r"\(16, 32\) in the checkpoint but \(16, 24\) in "
                                              r"the model; the checkpoint's config differs in "
                                              r"d_ff=32 \(model: 24\)"):
        wider.load_params(path)
    assert all(np.array_equal(before[k], wider.params[k]) for k in before)  # nothing copied
    with pytest.raises(CheckpointError, match="missing parameters .*'encoder.layers.1"):
        Transformer(dataclasses.replace(config, num_encoder_layers=2)).load_params(path)
    with pytest.raises(CheckpointError, match="unexpected parameters .*'src_pos.W'"):
        Transformer(config).load_params(
            Transformer(dataclasses.replace(config, positional="learned")).save(
                tmp_path / "learned.npz"))
    with pytest.raises(CheckpointError, match="is float32 in the checkpoint but float64"):
        Transformer(dataclasses.replace(config, dtype=np.float64)).load_params(path)
    np.savez(tmp_path / "other.npz", a=np.zeros(3))
    with pytest.raises(CheckpointError, match="not a transformer_lab checkpoint"):
        Transformer.load(tmp_path / "other.npz")
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        Transformer.load(tmp_path / "missing.npz")
    with pytest.raises(TypeError, match="metadata must hold only what JSON can store"):
        copy_run.model.save(tmp_path / "bad.npz", metadata={"x": object()})


# ----------------------------------------------------------------------------- PyTorch


@pytest.mark.parametrize("dtype,tol", [("float64", 1e-10), ("float32", 1e-5)])
def test_numpy_and_torch_follow_the_same_loss_curve(dtype, tol):
    from transformer_lab.torch_model import ReferenceTransformer, TorchTransformer

    cfg = TrainConfig.for_task("reverse", dtype=dtype, steps=12, warmup=4, lr=3e-3,
                               **{k: v for k, v in TINY.items() if k != "warmup"})
    task, tr, _, _ = make_data(cfg)
    model = make_model(cfg, task)
    stream = batch_stream(tr, cfg.batch_size, seed=0)
    batches = [next(stream) for _ in range(cfg.steps)]
    twins = [TorchTransformer.from_numpy(model), ReferenceTransformer.from_numpy(model)]
    ours = np.array(numpy_loss_curve(model, batches, cfg))
    assert ours[-1] < ours[0]  # it learns
    for twin in twins:
        theirs = np.array(torch_loss_curve(twin, batches, cfg))
        assert np.max(np.abs(ours - theirs) / np.abs(theirs)) < tol
    # ... and ends with the same weights. (In float32 the key biases drift apart: their
    # gradient is zero up to rounding -- the softmax ignores them -- and Adam divides that
    # rounding noise by its own size, taking steps of random sign. They change no output.)
    for name, p in twins[0].numpy_params().items():
        if dtype == "float32" and (name.endswith(".b_k") or name.endswith(".b_qkv")):
            continue
        np.testing.assert_allclose(model.params[name], p, rtol=0, atol=100 * tol,
                                   err_msg=name)


def test_step_times_reports_all_three():
    cfg = TrainConfig.for_task("copy", **TINY)
    t = step_times(cfg, repeats=2, warmup=1)
    assert set(t) == {"numpy", "torch", "nn.Transformer", "threads", "torch_threads"}
    assert all(t[k] > 0 for k in ("numpy", "torch", "nn.Transformer"))
    assert t["threads"] == t["torch_threads"] == 1
