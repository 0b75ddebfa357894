"""The handout runs on the student's code (issue 11.4), for whatever notebooks exist:

(i)   with the handout's stubs, each notebook runs up to the first stub it depends on and fails
      there with the stub's message, and its core checks fail with their functions' stubs;
(ii)  with a complete set of core functions dropped into the handout's package, every cell runs
      except the check cells of notebook-level exercises, which fail on their exercise's stub;
(iii) the trainer CLI on the handout's package: with the complete core it learns reversal
      (>= 0.99 held-out exact match); with the stubs it stops with a stub's message.

Notebooks not yet rewritten against the core (their check cells are not one-line check()
calls) cannot satisfy (i), and a notebook that fails on main itself cannot satisfy (ii): those
cases are marked xfail with the notebook named. The helpers are
in tests/handout_tools.py; a synthetic notebook on the real checks of notebook 01 shows that the
harness tells a notebook running on the core from one that does not.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from course_helpers import notebook_01, once_per_session, write
from handout_tools import (
    build_handout,
    execute_handout_notebook,
    first_error,
    handout_env,
    is_core_stub_error,
    is_exercise_stub_error,
    run_trainer,
)

from transformer_lab import syllabus

#: Every notebook executed twice on the handout, and the trainer: left out of `make test-quick`.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.fixture(scope="module")
def stub_handout(tmp_path_factory):
    return once_per_session(tmp_path_factory, "handout-stubs",
                            lambda out: build_handout(out / "h")) / "h"


@pytest.fixture(scope="module")
def complete_handout(tmp_path_factory):
    return once_per_session(tmp_path_factory, "handout-complete",
                            lambda out: build_handout(out / "h", complete_core=True)) / "h"


def check_stub_run(runs) -> None:
    """(i) on the runs of one notebook: the first failure is a stub's, and every core check
    fails with a core function's stub."""
    first = first_error(runs)
    assert first is not None, "the notebook ran to its end on the stubs"
    assert is_core_stub_error(first) or is_exercise_stub_error(first), \
        f"the first failing cell {first.cell_id!r}: {first.ename}: {first.evalue}"
    assert all(r.ran for r in runs[:runs.index(first)])
    core_checks = [r for r in runs if r.is_check and not r.check_takes_notebook_functions]
    for run in core_checks:
        assert run.failed and is_core_stub_error(run), \
            f"core check {run.cell_id!r} did not fail on a stub: {run.ename}: {run.evalue}"


def check_complete_run(runs) -> None:
    """(ii) on the runs of one notebook: only the check cells of notebook-level exercises fail,
    on their exercise's stub."""
    for run in runs:
        assert run.ran, f"cell {run.cell_id!r} did not run"
        if run.failed:
            assert (run.is_check and run.check_takes_notebook_functions
                    and is_exercise_stub_error(run)), \
                f"cell {run.cell_id!r} failed: {run.ename}: {run.evalue}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_with_the_stubs_each_notebook_stops_at_the_first_stub_it_needs(notebook, stub_handout):
    check_stub_run(execute_handout_notebook(stub_handout, notebook.name))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_with_a_complete_core_only_notebook_exercise_checks_fail(notebook, complete_handout):
    check_complete_run(execute_handout_notebook(complete_handout, notebook.name))


def test_the_harness_on_a_notebook_that_runs_on_the_core(tmp_path):
    """The synthetic notebook 01 (real checks; two core exercises, three notebook ones)."""
    write(notebook_01(), tmp_path / "source" / "01_attention.ipynb")
    stubs = build_handout(tmp_path / "stubs", source=tmp_path / "source")
    runs = execute_handout_notebook(stubs, "01_attention.ipynb")
    check_stub_run(runs)
    first = first_error(runs)
    assert first.cell_id == "check-softmax-forward" and first.ename == "CheckFailed"
    assert syllabus.stub_message("softmax_forward") in first.evalue
    complete = build_handout(tmp_path / "complete", complete_core=True,
                             source=tmp_path / "source")
    runs = execute_handout_notebook(complete, "01_attention.ipynb")
    check_complete_run(runs)
    assert [r.cell_id for r in runs if r.failed] == ["check-logsumexp", "check-cosine-attention",
                                                     "check-additive-attention"]
    assert runs[-1].cell_id == "end" and runs[-1].ran and not runs[-1].failed
    with pytest.raises(AssertionError):  # and the harness tells the two apart
        check_complete_run(execute_handout_notebook(stubs, "01_attention.ipynb"))


def test_the_trainer_on_the_handout_imports_the_handout_package(complete_handout):
    result = run_trainer(complete_handout, "--help")
    assert result.returncode == 0
    where = subprocess.run([sys.executable, "-c", "import transformer_lab.train as t; "
                            "print(t.__file__)"], cwd=complete_handout / "notebooks",
                           env=handout_env(complete_handout), capture_output=True, text=True,
                           timeout=300)
    assert where.stdout.strip().startswith(str((complete_handout / "src").resolve()))


def test_the_trainer_learns_reversal_on_a_complete_core(complete_handout):
    result = run_trainer(complete_handout, "--task", "reverse", "--seed", "0")
    assert result.returncode == 0, result.stderr[-2000:]
    metrics = json.loads(result.stdout.strip().splitlines()[-1])
    assert metrics["exact_match"] >= 0.99, metrics


def test_the_trainer_stops_at_a_stub_on_the_handout(stub_handout):
    result = run_trainer(stub_handout, "--task", "reverse", "--seed", "0", "--time-budget", "5")
    assert result.returncode != 0
    messages = [syllabus.stub_message(n) for f in syllabus.TAUGHT_IN.values() for n in f]
    last = result.stderr.strip().splitlines()[-1]  # one line, not a traceback
    assert last.startswith("python -m transformer_lab.train: stopped at a function not written "
                           "yet: ") and "Traceback" not in result.stderr
    assert any(m in last for m in messages), result.stderr[-2000:]
