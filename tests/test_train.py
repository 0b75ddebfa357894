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

from transformer_lab.datasets import tasks as D
from transformer_lab.models.encoder_decoder import CheckpointError, Transformer, TransformerConfig
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
    train_step,
)

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


def test_cli_progress_on_stderr_and_only_one_json_line_on_stdout():
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-m", "transformer_lab.train", "--task", "copy",
                           "--seed", "1", "--steps", "30", "--eval-every", "10",
                           "--target", "0", "--examples", "2", *TINY_ARGS],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # stdout is exactly one JSON line: `... > metrics.json` captures only the metrics
    assert proc.stdout.count("\n") == 1
    metrics = json.loads(proc.stdout)
    assert KEYS <= set(metrics)
    assert metrics["task"] == "copy" and metrics["seed"] == 1 and metrics["steps"] == 30
    assert 0 <= metrics["exact_match"] <= metrics["token_accuracy"] <= 1
    assert metrics["tokens_per_s"] > 0 and metrics["seconds"] > 0
    # stderr is not a terminal: a header, then one plain line per evaluation (the log interval
    # defaults to --eval-every) holding loss and validation scores, no carriage returns; then
    # the examples
    err = proc.stderr.splitlines()
    assert "\r" not in proc.stderr
    assert err[0].startswith("training copy") and "pre-norm" in err[0]
    steps = [ln for ln in err if ln.startswith("step")]
    assert [ln.split()[1] for ln in steps] == ["10/30", "20/30", "30/30"]
    assert all("loss" in ln and "val exact" in ln and "(step" not in ln for ln in steps)
    assert sum("->" in ln for ln in err) == 2


def test_progress_lines_follow_log_every_and_name_older_validations():
    out = io.StringIO()
    result = train("copy", seed=0, steps=25, target=None, progress="lines", log_every=10,
                   stream=out, **{**TINY, "eval_every": 20})
    lines = out.getvalue().splitlines()
    assert [ln.split()[1] for ln in lines] == ["10/25", "20/25", "25/25"]
    assert "val" not in lines[0]  # nothing evaluated yet
    assert "val exact" in lines[1] and "(step" not in lines[1]
    assert "val exact" in lines[2] and "(step" not in lines[2]  # evaluated at the last step
    assert result.history.eval_step == [20, 25]
    # a run stopped early by its target ends with the line of its last step
    out = io.StringIO()
    cfg = TrainConfig.for_task("copy", steps=400, **{**TINY, "max_len": 2, "n_train": 20,
                                                     "n_val": 5, "n_test": 5})
    result = train(cfg, target=0.5, progress="lines", log_every=1000, stream=out)
    last = out.getvalue().splitlines()
    assert result.metrics["stopped"] == "target"
    assert last[0].split()[1] == f"{result.metrics['steps']}/400" and "val exact" in last[0]


def test_warmup_must_be_shorter_than_the_run(capsys):
    with pytest.raises(ValueError, match=r"warmup=100 must be less than steps=50: the learning "
                                         r"rate would still be rising"):
        TrainConfig(steps=50)
    assert TrainConfig(steps=50, warmup=0).warmup == 0
    with pytest.raises(SystemExit):
        main(["--task", "copy", "--steps", "50"])
    assert "warmup=100 must be less than steps=50" in capsys.readouterr().err


def test_post_norm_option_reaches_the_model(capsys):
    cfg = TrainConfig.for_task("copy", norm_first=False, **TINY)
    assert make_model(cfg).config.norm_first is False
    result = train(cfg, steps=15, target=None, progress="none")
    assert result.model.config.norm_first is False
    # a post-norm model is accepted as the starting point of a post-norm run
    train(cfg, steps=12, target=None, progress="none", model=result.model)
    with pytest.raises(TypeError, match="norm_first must be True or False"):
        TrainConfig(norm_first="no")
    assert main(["--task", "copy", "--steps", "12", "--progress", "none", "--post-norm",
                 *TINY_ARGS]) == 0
    json.loads(capsys.readouterr().out)


def test_help_shows_defaults_and_describes_every_metric(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps to the terminal width
    assert "TASK_DEFAULTS" not in text and "see the docstring" not in text
    for expected in ("(default: 64)", "(default: 4)", "(default: 2)", "(default: 128)",
                     "(default: 40000)", "default: 1000; add: 3000", "--post-norm",
                     "BLAS threads"):
        assert expected in text, expected
    metrics = train("copy", seed=0, steps=12, target=None, progress="none", **TINY).metrics
    epilog = text[text.index("stdout gets one line"):]
    for key in metrics:
        assert f"{key}:" in epilog or f"{key}," in epilog, key


def test_the_reverse_task_needs_the_functions_of_notebooks_00_to_10(monkeypatch, capsys):
    """As the workspace's README says (course/student.py): every core function first taught
    after notebook 10 a stub, the reverse task trains, evaluates and prints its JSON line."""
    import importlib

    from transformer_lab import device, syllabus

    later = {f for functions in syllabus.TAUGHT_IN.values() for f, where in functions.items()
             if int(where[0][:2]) > 10}
    assert {"beam_search", "gpt_forward", "train_bpe"} <= later

    def stub(*args, **kwargs):
        raise NotImplementedError("taught after notebook 10")

    for path in device._CORE.glob("*.py"):
        module = importlib.import_module(f"transformer_lab.core.{path.stem}")
        for name in later & set(vars(module)):
            monkeypatch.setattr(module, name, stub)
    assert main(["--task", "reverse", "--steps", "20", "--warmup", "5", "--progress", "none"]) == 0
    assert "exact_match" in json.loads(capsys.readouterr().out)


def test_cli_in_process_checkpoint_init_examples_and_errors(tmp_path, capsys):
    path = tmp_path / "copy.npz"
    assert main(["--task", "copy", "--steps", "20", "--progress", "none", "--examples", "2",
                 "--checkpoint", str(path), *TINY_ARGS]) == 0
    captured = capsys.readouterr()
    out, err = captured.out.strip().splitlines(), captured.err.strip().splitlines()
    assert len(out) == 1 and len(err) == 2 and "->" in err[0]  # examples on stderr
    metrics = json.loads(out[-1])
    assert metrics["checkpoint"] == str(path) and path.exists()
    # start again from the checkpoint
    assert main(["--task", "copy", "--steps", "5", "--progress", "none", "--init", str(path),
                 *TINY_ARGS, "--warmup", "2"]) == 0
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


def test_output_files_are_checked_before_the_run_and_a_diverging_run_says_so(tmp_path, capsys):
    """An unwritable --checkpoint or --record was found when the run ended: its training and its
    JSON line were lost. A run whose gradients became NaN, or whose arrays did not fit in memory,
    ended in a traceback."""
    (tmp_path / "runs.json").write_text("not JSON")
    for task, option, path, problem in (
            ("copy", "--checkpoint", tmp_path / "no" / "m.npz", "is in a folder that does not "
                                                               "exist"),
            ("copy", "--checkpoint", tmp_path, "is a folder"),
            ("translate-fr", "--checkpoint", tmp_path, "is a folder"),
            ("charlm", "--record", tmp_path / "runs.json", "is not a JSON object of runs")):
        with pytest.raises(SystemExit):
            main(["--task", task, option, str(path)])
        assert f"error: {option} {path} {problem}" in capsys.readouterr().err
    assert main(["--task", "copy", "--lr", "1e9", "--progress", "none", *TINY_ARGS]) == 1
    err = capsys.readouterr().err
    assert "contains NaN or infinity: the training diverged" in err
    assert "Traceback" not in err
    assert main(["--task", "copy", "--d-model", "1000000", "--heads", "1"]) == 1
    assert "error: out of memory (Unable to allocate" in capsys.readouterr().err
    for task, option in (("copy", "--examples"), ("translate-fr", "--examples"),
                         ("charlm", "--samples")):
        with pytest.raises(SystemExit):
            main(["--task", task, option, "-1"])
        assert f"argument {option}: must be at least 0, got -1" in capsys.readouterr().err


def test_a_checkpoint_under_home_is_checked_where_it_will_be_written(tmp_path, monkeypatch):
    """--checkpoint=~/m.npz (no shell expands a ~ after =): the model is saved under the home
    folder, but the check before the run read "~" as a folder that does not exist."""
    monkeypatch.setenv("HOME", str(tmp_path))
    result = subprocess.run([sys.executable, "-m", "transformer_lab.train", "--task", "copy",
                             "--checkpoint=~/m.npz", "--progress", "none", "--steps", "20",
                             *TINY_ARGS], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["checkpoint"] == str(tmp_path / "m.npz")
    assert (tmp_path / "m.npz").exists()
    with pytest.raises(ValueError, match="max_len must be at most 18 for task 'add'"):
        D.get_task("add", max_len=19)  # 10 ** 19 overflows the int64 its sums are drawn in


def test_progress_bar_on_a_terminal_and_lines_otherwise():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    tty = Terminal()
    bar = Progress(50, tty, "auto", log_every=10)
    for step in range(1, 51):
        if step == 50:
            bar.evaluated(50, 0.5, 0.75)
        bar.update(step, 1.0 / step, 1e-3, 0.01 * step)
    bar.finish()
    text = tty.getvalue()
    assert bar.mode == "bar" and text.startswith("\r[") and "50/50" in text and "val 0.500" in text
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


@pytest.mark.parametrize("field,value,error,message", [
    ("target", "0.9", TypeError, "target must be a number, got '0.9'"),
    ("target", True, TypeError, "target must be a number, got True"),
    ("target", float("nan"), ValueError, "target must be finite"),
    ("time_budget", "55", TypeError, "time_budget must be a number, got '55'"),
    ("time_budget", 0, ValueError, "time_budget must be positive, got 0.0"),
    ("time_budget", float("inf"), ValueError, "time_budget must be finite"),
    ("lr", -1e-3, ValueError, "lr must be at least 0"),
    ("lr", float("nan"), ValueError, "lr must be finite"),
    ("clip", "1", TypeError, "clip must be a number"),
    ("seed", np.int64(-1), ValueError, "seed must be at least 0"),
])
def test_config_checks_types_and_ranges_of_numbers(field, value, error, message):
    with pytest.raises(error, match=message):
        TrainConfig(**{field: value})


def test_config_numbers_are_plain_python_numbers_and_runs_are_deterministic_by_default():
    cfg = TrainConfig(seed=np.int64(3), lr=np.float32(0.5), time_budget=np.float64(2))
    assert type(cfg.seed) is int and type(cfg.lr) is float and type(cfg.time_budget) is float
    json.dumps(dataclasses.asdict(cfg))  # stored with checkpoints: must be JSON-ready
    # no time budget unless asked for: the stopping step does not depend on the machine
    assert TrainConfig().time_budget is None and TrainConfig.for_task("add").time_budget is None


def test_train_step_reports_the_global_norm_with_and_without_clipping():
    from transformer_lab.optim import Adam

    cfg = TrainConfig.for_task("copy", **TINY)
    task, tr, _, _ = make_data(cfg)
    src, tgt = next(batch_stream(tr, 16, seed=0))
    for clip in (0, 0.01):
        model = make_model(cfg, task)
        _, grads = model.copy().loss(src, tgt)
        expected = float(np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads.values())))
        before = {k: p.copy() for k, p in model.params.items()}
        loss, norm = train_step(model, Adam(model.params, lr=1e-3), src, tgt, 1e-3, clip)
        assert norm == pytest.approx(expected, rel=1e-5) and norm > 0.01
        assert not np.array_equal(before["out_proj.W"], model.params["out_proj.W"])
    before = {k: p.copy() for k, p in model.params.items()}
    with pytest.raises(ValueError, match="clip must be at least 0"):
        train_step(model, Adam(model.params, lr=1e-3), src, tgt, 1e-3, -1.0)
    with pytest.raises(ValueError, match="lr must be at least 0, got -0.001"):  # the optimiser's
        train_step(model, Adam(model.params, lr=1e-3), src, tgt, -1e-3, 1.0)
    assert all(np.array_equal(before[k], model.params[k]) for k in before)


def test_training_runs_on_the_core(monkeypatch):
    """Every step of a run is transformer_lab.core.training.train_step, and the optimisers'
    updates are core.optim's, looked up at call time: a replaced core function is the one
    that runs."""
    from transformer_lab.core import optim as core_optim
    from transformer_lab.core import training as core_training
    from transformer_lab.optim import SGD, Adam

    calls = []
    for module, name in ((core_training, "train_step"), (core_optim, "adam_step"),
                         (core_optim, "sgd_step"), (core_optim, "global_norm"),
                         (core_optim, "clip_grad_norm")):
        real = getattr(module, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    result = train("copy", seed=0, steps=3, target=None, progress="none", **{**TINY, "warmup": 1})
    assert calls.count("train_step") == 3 == len(result.history.loss)
    assert calls.count("adam_step") == 3 * len(result.model.params)
    # the public step checks, then calls the core's; so do the optimisers and the clipping
    cfg = TrainConfig.for_task("copy", **TINY)
    task, tr, _, _ = make_data(cfg)
    src, tgt = next(batch_stream(tr, 16, seed=0))
    model = make_model(cfg, task)
    calls.clear()
    train_step(model, SGD(model.params, lr=0.1, momentum=0.9), src, tgt, 0.1, 0.0)
    assert calls[0] == "train_step" and calls.count("sgd_step") == len(model.params)
    from transformer_lab.optim import clip_grad_norm, global_norm

    calls.clear()
    grads = {"a": np.ones(3)}
    global_norm(grads)
    clip_grad_norm(grads, 1.0)
    Adam({"a": np.ones(3)}).step(grads)
    assert calls[:2] == ["global_norm", "clip_grad_norm"] and calls[-1] == "adam_step"


@pytest.mark.parametrize("module,name", [("training", "train_step"), ("optim", "adam_step")])
def test_cli_stops_with_the_message_of_a_core_stub(tmp_path, module, name):
    """With a core function that raises NotImplementedError (the handout's stubs do),
    ``python -m transformer_lab.train`` stops at once with its message and prints no metrics:
    the trainer really runs on the core."""
    (tmp_path / "sitecustomize.py").write_text(
        f"import transformer_lab.core.{module} as m\n\n"
        "def stub(*args, **kwargs):\n"
        "    raise NotImplementedError('stub message')\n\n"
        f"m.{name} = stub\n")
    path = os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": path}
    proc = subprocess.run([sys.executable, "-m", "transformer_lab.train", "--task", "reverse",
                           "--seed", "0", "--steps", "30", *TINY_ARGS],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr.strip().splitlines()[-1] == (  # one line, not a traceback
        "python -m transformer_lab.train: stopped at a function not written yet: stub message")
    assert "Traceback" not in proc.stderr
    assert "step " not in proc.stderr  # stopped at the first step


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
    with pytest.raises(ValueError, match="task 'charlm' trains the GPT.*train_charlm"):
        TrainConfig.for_task("charlm")
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        TrainConfig(batch_size=0)
    with pytest.raises(TypeError, match="steps must be an integer, got 10.0"):
        TrainConfig(steps=10.0)
    with pytest.raises(ValueError, match="max_len must be at least 3, got 2"):
        TrainConfig(min_len=3, max_len=2)
    with pytest.raises(ValueError, match="target must be in"):
        TrainConfig(target=1.5)
    with pytest.raises(ValueError, match="needs a validation set"):
        TrainConfig(n_val=0)
    with pytest.raises(ValueError, match="exceeds the 156 distinct sources of task 'copy'"):
        TrainConfig(task="copy", max_len=2, num_symbols=12)
    with pytest.raises(TypeError, match="unknown training option"):
        TrainConfig.for_task("copy", epochs=3)
    assert TrainConfig.for_task("add").steps == 3000
    with pytest.raises(ValueError, match=r"decay must be one of \('cosine', 'linear', "
                                         r"'inverse_sqrt'\), got 'step'"):
        TrainConfig(decay="step")
    with pytest.raises(ValueError, match="positional must be one of"):
        TrainConfig(positional="rotary")
    with pytest.raises(TypeError, match="bucket must be True or False, got 'no'"):
        TrainConfig(bucket="no")
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


# float32 with Adam: the curves drift apart by a few 1e-6 relative over 12 steps (Adam divides
# each gradient by its own size, so rounding differences in tiny gradients become steps of about
# lr); 1e-4 leaves a margin of more than ten for other CPUs and BLAS libraries.
@pytest.mark.parametrize("dtype,tol,weight_atol", [("float64", 1e-10, 1e-8),
                                                    ("float32", 1e-4, 1e-3)])
def test_numpy_and_torch_follow_the_same_loss_curve(dtype, tol, weight_atol):
    from transformer_lab.reference.torch_transformer import ReferenceTransformer, TorchTransformer

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
        np.testing.assert_allclose(model.params[name], p, rtol=0, atol=weight_atol,
                                   err_msg=name)


def test_step_times_reports_all_three():
    cfg = TrainConfig.for_task("copy", **TINY)
    t = step_times(cfg, repeats=2, warmup=1)
    assert set(t) == {"numpy", "torch", "nn.Transformer", "threads", "torch_threads"}
    assert all(t[k] > 0 for k in ("numpy", "torch", "nn.Transformer"))
    assert t["threads"] == t["torch_threads"] == 1
