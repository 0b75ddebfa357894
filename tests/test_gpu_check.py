"""``python -m transformer_lab.course.gpu_check`` gets one run on a real GPU: here its parts run on
the CPU, with ``cuda`` bound to the stand-in array module (tests/standin.py) and torch on the
CPU, at tiny sizes -- every part to the end, the record written, errors recorded, not raised."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from standin import standin

from transformer_lab import device
from transformer_lab.course import gpu_check


@pytest.fixture
def cuda_is_the_standin(monkeypatch):
    monkeypatch.setattr(device, "_cupy", lambda: (standin, standin.erf))
    yield
    device.use("cpu")


def small_corpus():
    from transformer_lab.datasets.corpus import load_corpus

    rng = np.random.default_rng(0)
    return dataclasses.replace(load_corpus(), train_ids=rng.integers(2, 98, 5000),
                               val_ids=rng.integers(2, 98, 700))


def test_every_part_runs_and_is_recorded(cuda_is_the_standin, tmp_path, capsys):
    record = gpu_check.run(tmp_path, budget=2.0, quick=True, torch_device="cpu",
                           corpus=small_corpus())
    assert json.loads((tmp_path / "gpu_record.json").read_text())["quick"] is True
    assert "error" in record["machine"]  # no CuPy here: recorded, and the run went on
    assert record["device"] == "cuda"
    parity = [part for name, part in record.items() if name.startswith("parity")]
    assert [p["kind"] for p in parity] == ["classic", "modern", "tiled"]
    # the stand-in computes with NumPy: the same numbers, not merely close ones
    assert all(p["pass"] and p["worst_error"] == 0.0 for p in parity)
    # one float32 sum of n squares against per-array sums: within n eps (tests/test_device.py)
    assert all(p["global_norm_error"] <= p["parameters"] * np.finfo(np.float32).eps
               for p in parity)
    assert all(np.shape(p["sampled"]) == (2, 12) for p in parity)  # 4 prompt + 8 sampled
    assert len(parity[0]["errors"]) == len(gpu_check.GPT(gpu_check.gpt_config(
        "classic", 32, 1, 32)).params) + 1
    timing = record["timing"]
    assert set(timing["median_seconds"]) == {"core step", "torch step", "core forward+backward",
                                             "torch forward+backward"}
    assert timing["core_over_torch_step"] > 0 and len(timing["seconds"]["core step"]) == 3
    own = timing["core step by function"]  # each core function's own seconds in a step
    assert {"linear_forward", "linear_backward", "adam_step", "outside the core"} <= set(own)
    assert list(own.values()) == sorted(own.values(), reverse=True) and min(own.values()) > 0
    training = record["training"]
    assert training["config"]["device"] == "cuda" and training["metrics"]["steps"] >= 1
    # all the steps the probe planned, or fewer when the budget ran out (a busy machine)
    assert (training["metrics"]["stopped"], training["metrics"]["steps"]) == (
        "steps", training["config"]["steps"]) or training["metrics"]["stopped"] == "time"
    assert training["shipped_checkpoint_val_bits_per_char_here"] > 0
    assert isinstance(training["beats_shipped"], bool)
    out = capsys.readouterr().out
    assert "parity tiled d32: worst" in out and "global norm" in out and "core/torch step" in out
    assert "bits/char" in out
    assert device.name == "cpu"


def test_parts_runs_only_the_parts_named(cuda_is_the_standin, tmp_path, capsys):
    record = gpu_check.run(tmp_path, budget=1.0, quick=True, torch_device="cpu",
                           parts=("timing",))
    assert set(record) == {"command", "quick", "device", "machine", "timing", "part_seconds"}
    assert record["timing"]["core_over_torch_step"] > 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("machine: ") and out[1].startswith("timing: ") and len(out) == 2


def test_by_function_charges_each_core_function_its_own_time():
    from transformer_lab.core import layers

    def step():  # 20 ms outside the core, a linear layer's forward inside it
        time.sleep(0.02)
        layers.linear_forward(np.ones((2, 3)), np.ones((3, 4)), np.zeros(4))

    syncs = []
    own = gpu_check.by_function(step, lambda: syncs.append(1), repeats=2)
    assert set(own) == {"outside the core", "linear_forward"}
    assert 0.02 <= own["outside the core"] < 0.2 and own["linear_forward"] < 0.02
    assert len(syncs) == 2 * 2  # at the start and the end of each call


def test_training_runs_train_s_steps_when_the_budget_holds_more(cuda_is_the_standin):
    tiny = dict(d_model=32, num_layers=1, warmup=2, eval_every=50, steps=8)
    result = gpu_check.training(1000.0, tiny, small_corpus())
    assert result["metrics"]["steps"] == 8 and result["metrics"]["stopped"] == "steps"
    assert result["config"]["dropout"] == gpu_check.TRAIN["dropout"] > 0


def test_the_full_sizes_are_the_issue_s():
    assert gpu_check.gpt_config("classic", 384, 6, 256).num_heads == 6
    assert gpu_check.gpt_config("modern", 96, 2, 128).num_kv_heads == 2
    assert gpu_check.gpt_config("tiled", 96, 2, 128).attention_block_size == 64
    assert gpu_check.timing.__defaults__[:4] == (384, 6, 256, 64)
    assert gpu_check.TRAIN["batch_size"] == 64 and gpu_check.PARITY_TOL == 1e-5


def test_the_command_needs_no_other_package_and_records_what_fails(tmp_path):
    """As the GPU image may have it: no regex, safetensors, sacrebleu, matplotlib, nbformat; here
    no CUDA for torch either (part 2 records its error) and cuda is the stand-in."""
    tests = Path(__file__).parent
    code = ("import sys\n"
            "for name in ('regex', 'safetensors', 'sacrebleu', 'matplotlib', 'nbformat', "
            "'nbclient'):\n"
            "    sys.modules[name] = None\n"
            f"sys.path.insert(0, {str(tests)!r})\n"
            "from standin import standin\n"
            "from transformer_lab import device\n"
            "device._cupy = lambda: (standin, standin.erf)\n"
            "from transformer_lab.course import gpu_check\n"
            f"sys.exit(gpu_check.main(['--out', {str(tmp_path)!r}, '--quick', "
            "'--budget', '1']))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert res.returncode == 0, res.stderr
    record = json.loads((tmp_path / "gpu_record.json").read_text())
    assert all(record[f"parity {k} d32"]["pass"] for k in gpu_check.KINDS)
    assert "error" in record["timing"]  # torch without CUDA
    assert record["training"]["metrics"]["device"] == "cuda"
    assert "training: " in res.stdout and "gpu_check: training done in" in res.stderr
