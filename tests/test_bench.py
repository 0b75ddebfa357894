"""`python -m transformer_lab.course.bench`: interleaved rounds, the spread of the ratio, one thread
and CPU time by default, progress and the time elapsed on stderr. (The twin-parity check and the
table's rows are tested in test_interop.py.)"""

import math
import subprocess
import sys

import pytest

from transformer_lab.course import bench
from transformer_lab.tools import round_robin_times


def test_paired_rounds_alternate_the_order_and_skip_the_warmup():
    calls = []
    a, b = bench.paired_times(lambda: calls.append("a"), lambda: calls.append("b"),
                              repeats=4, warmup=1)
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b"]
    assert len(a) == len(b) == 4 and all(t >= 0 for t in a + b)
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        bench.paired_times(lambda: None, lambda: None, repeats=0, warmup=0)


def test_paired_times_read_the_given_clock():
    ticks = iter(range(100))
    a, b = bench.paired_times(lambda: None, lambda: None, repeats=2, warmup=1,
                              clock=lambda: next(ticks))
    assert a == b == [1, 1]


def test_summary_is_the_median_of_per_round_ratios_and_their_middle_half():
    torch_times = [1.0, 2.0, 1.0, 10.0, 1.0]   # round 4: the machine was busy for both
    numpy_times = [0.5, 1.0, 0.6, 5.0, 0.4]
    t = bench.summarize(torch_times, numpy_times)
    assert (t.torch, t.numpy) == (1.0, 0.6)
    assert t.ratio == 0.5  # ratios 0.5 0.5 0.6 0.5 0.4
    assert (t.ratio_q1, t.ratio_q3) == (0.5, 0.5)
    assert bench.quartiles([2.0]) == (2.0, 2.0)
    assert bench.quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 4.0)


def test_a_busy_machine_moves_the_medians_but_not_the_paired_ratio():
    """Numbers shaped like a run under load: stretches of rounds 5x slower for both sides, and
    one round where only torch was hit. The ratio of the two sides' medians is far off; the
    median of the per-round ratios stays at the true 0.8."""
    slow = [1, 1, 5, 5, 5, 1, 5, 5, 1, 1, 5]
    torch_times = [10.0 * s for s in slow]
    numpy_times = [8.0 * s for s in slow]
    numpy_times[2] = 8.0
    t = bench.summarize(torch_times, numpy_times)
    assert t.numpy / t.torch == pytest.approx(0.16)
    assert t.ratio == pytest.approx(0.8) and t.ratio_q1 == pytest.approx(0.8)


def test_format_seconds():
    assert [bench.format_seconds(s) for s in (0.4, 42, 190, 3725)] == \
        ["0 s", "42 s", "3 min 10 s", "1 h 02 min"]


def test_bench_reports_progress_on_stderr_and_uses_one_thread_by_default():
    res = subprocess.run([sys.executable, "-m", "transformer_lab.course.bench", "--quick"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    err = res.stderr
    assert "bench: 2 sizes, each 3 timed rounds after 1 warm-up\n" in err
    assert "[1/2] TransformerEncoderLayer, d_model 32, batch 4, length 8 ..." in err
    assert "[2/2] Transformer (1+1)" in err and "elapsed" in err and "in all" in err
    out = res.stdout
    assert "(1 BLAS threads), torch" in out and "(1 threads)" in out
    assert "interleaved rounds" in out and "middle half" in out
    assert "CPU time of this process" in out  # the default clock with one thread
    rows = [line for line in out.splitlines() if line.startswith("Transformer")]
    assert len(rows) == 4  # two table rows and two summary lines
    assert all(line.rstrip().endswith("x") for line in rows[:2])


# ------------------------------------------------------------------ the GPT (--model gpt)


def test_round_robin_rounds_reverse_the_order_and_skip_the_warmup():
    calls = []
    times = round_robin_times({k: (lambda k=k: calls.append(k)) for k in "abc"},
                              repeats=2, warmup=1)
    assert "".join(calls) == "abccbaabc"
    assert sorted(times) == ["a", "b", "c"] and all(len(t) == 2 for t in times.values())


def test_gpt_step_flops_count_every_matrix_product():
    c = bench.gpt_config("classic", 96, 4, 4, 128)
    n, e, f, v = 8 * 128, 96, 384, bench.GPT_VOCAB
    per_layer = 2 * n * e * 3 * e + 2 * n * e * e + 4 * n * 128 * e + 2 * 2 * n * e * f
    assert bench.gpt_step_flops(c, 8, 128) == 3 * (4 * per_layer + 2 * n * e * v)
    modern = bench.gpt_config("modern", 96, 4, 4, 128)
    assert modern.num_kv_heads == 2 and modern.mlp == "swiglu"
    assert 0 < bench.gpt_step_flops(modern, 8, 128) < bench.gpt_step_flops(c, 8, 128)


def test_the_gpt_benchmark_refuses_a_twin_that_computes_something_else(monkeypatch):
    from transformer_lab.models.gpt import GPT

    real = GPT.loss
    monkeypatch.setattr(GPT, "loss", lambda self, ids: (real(self, ids)[0] * 1.001,
                                                        real(self, ids)[1]))
    with pytest.raises(AssertionError, match="differs from its PyTorch twin"):
        bench.measure_gpt("classic", 16, 2, 8, 2, 1, repeats=1, warmup=0)


def test_bench_gpt_times_the_training_step_against_the_torch_twin():
    res = subprocess.run([sys.executable, "-m", "transformer_lab.course.bench", "--model", "gpt",
                          "--quick"], capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    err, out = res.stderr, res.stdout
    assert "bench: 2 sizes, each 3 timed rounds after 1 warm-up\n" in err
    assert "[1/2] GPT classic, d_model 32, batch 4, length 16 ..." in err
    assert "[2/2] GPT modern" in err and "in all" in err
    assert "(1 BLAS threads), torch" in out and "(1 threads)" in out
    assert "the GPT's training step" in out
    rows = [line.split() for line in out.splitlines() if line.startswith(("classic", "modern"))]
    assert [r[:2] for r in rows] == [["classic", "32"], ["modern", "32"]]
    assert rows[1][2] == "2/1"  # grouped-query: 2 query heads share 1 key/value head
    assert all(r[7].endswith("x") and float(r[-1]) > 0 and float(r[-2]) > 0 for r in rows)
    assert out.splitlines()[1].split()[-4:] == ["numpy", "GF/s", "torch", "GF/s"]
    summary = next(line for line in out.splitlines() if line.startswith("GPT: numpy/torch"))
    medians = [float(r[7][:-1]) for r in rows]
    geo = float(summary.split("geometric mean ")[1].split("x")[0])
    assert abs(geo - math.exp(sum(map(math.log, medians)) / 2)) <= 0.01
    assert f"range {min(medians):.2f}x - {max(medians):.2f}x over 2 sizes" in summary
