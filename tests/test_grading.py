"""The grader (`make grade`): verdicts from what the student's functions return for the grader's
inputs, judged in the grader's own process.

On a synthetic notebook 01 with the real checks of notebook 01 (tests/course_helpers.py):
- a correct submission gets full marks, an untouched handout zero;
- every trick of issue 12 and more -- IPython hooks, exception handlers, output clearing, input
  transformers, rebinding the checking helpers, patching the framework, sys.modules, builtins,
  exiting after faking output, writing into the grader's output folder or the probe's results,
  calling a hidden reference, replaying the stored public answers, copying a later notebook's
  function -- scores 0 on stubs, and is listed in flags.csv;
- an endless loop costs its check only; magics and floods of output cost nothing;
- a notebooks-only submission gets its notebook exercises' points; a bug in one notebook's
  package function costs that notebook only;
- restored check cells go back by id, then grade_id, after the cell that preceded them;
- names are matched forgivingly; every file skipped is in skipped.csv, and a student whose files
  were all skipped still has rows;
- grading the same folder twice gives the same files.
The course's own notebooks are graded end to end once they have one-line check cells.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
from pathlib import Path

import nbformat
import pytest
from course_helpers import (
    ADDITIVE,
    COSINE,
    LOGSUMEXP,
    POINTS_01,
    SANDBOX_ARGS,
    SANDBOXED,
    SETUP,
    meta,
    notebook_01,
    once_per_session,
    read_csv,
    reference_core,
    solved_01,
    stubbed_core,
    student_01,
    student_folder,
    write,
)

from transformer_lab import syllabus
from transformer_lab.checks import framework as F
from transformer_lab.course import (
    assignment,
    flags,
    grade,
    probe_driver,
    reports,
    student,
    versions,
)
from transformer_lab.course.package import parse_package, student_code
from transformer_lab.course.submissions import (
    ZIP_REASON,
    find_submissions,
    match_flat,
    match_notebook,
)

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
FULL = sum(POINTS_01.values())


def run_grader(subs: Path, source: Path, out: Path, *options: str,
               project: Path = ROOT) -> str:
    console = io.StringIO()
    with contextlib.redirect_stdout(console):
        status = grade.main([str(subs), "--source", str(source), "--out", str(out),
                             "--project", str(project), *SANDBOX_ARGS, *options])
    (out.parent / f"{out.name}-console.txt").write_text(console.getvalue())
    assert status == 0, console.getvalue()
    return console.getvalue()


def points(grades: Path, student: str, notebook: str = "01_attention") -> dict[str, float]:
    return {r["check"]: float(r["points"]) for r in read_csv(grades / "grades.csv")
            if r["student"] == student and r["notebook"] == notebook}


def summary(grades: Path, who: str, notebook: str = "01_attention") -> str:
    nb = nbformat.read(grades / "feedback" / who / f"{notebook}.ipynb", as_version=4)
    assert nb.cells[0].id == reports.SUMMARY_CELL_ID
    return nb.cells[0].source


def flag_rows(grades: Path, who: str) -> list[dict]:
    return [r for r in read_csv(grades / "flags.csv") if r["student"] == who]


# --- the students -------------------------------------------------------------------------------

def _first_exercise(code: str, **kw):
    """The handout's notebook with ``code`` at the top of its first exercise cell (where issue
    12 put its tricks)."""
    return student_01(before={"exercise-logsumexp": code}, **kw)


TRICKS = {  # student: code put in the handout's notebook 01, whose exercises are all stubs
    "custom_exc": "get_ipython().set_custom_exc((BaseException,), lambda *a, **k: None)",
    "events": "from IPython.display import clear_output\n"
              "get_ipython().events.register('post_run_cell', lambda r: clear_output())",
    "transformer": "def _fake(lines):\n"
                   "    return [\"print('passed.')\\n\"] if any('check(' in l for l in lines) "
                   "else lines\nget_ipython().input_transformers_post.append(_fake)",
    "rebind_check": "check = lambda *a, **k: print(f'{a[0]} passed (3 cases).')",
    "patch_framework": "from transformer_lab.checks import framework\n"
                       "framework.run_case = lambda check, f, case: framework.Outcome(\n"
                       "    value=check.expected(*case.args, **case.kwargs))\n"
                       "framework.judge = lambda *a, **k: framework.Verdict(True)",
    "no_registry": "from transformer_lab.checks import framework\n"
                   "framework.register = lambda cls: cls",
    "sys_modules": "import sys, types\nfake = types.ModuleType('transformer_lab.checks')\n"
                   "fake.check = lambda *a, **k: print('passed')\n"
                   "sys.modules['transformer_lab.checks'] = fake\n"
                   "sys.modules['transformer_lab.checks.framework'] = fake",
    "builtins": "import builtins\n"
                "builtins.NotImplementedError = type('NotImplementedError', (Warning,), {})\n"
                "builtins.print = lambda *a, **k: None",
    "exit_after_faking": "import atexit, os\n"
                         "for c in ['check-softmax-forward', 'check-attention-forward']:\n"
                         "    print(f'{c} passed (5 cases).')\n"
                         "atexit.register(lambda: print('every check passed'))\nos._exit(0)",
    "fake_results": "import os, pathlib, sys\nout = pathlib.Path(sys.argv[1]) / 'out'\n"
                    "for i in range(5):\n    for j in range(12):\n"
                    "        (out / f'case-{i}-{j}.npz').write_bytes(b'PK passed')\n"
                    "(out / 'progress').write_text('done\\n')\nos._exit(0)",
}
HIDDEN_REFERENCE_NOTEBOOK = {
    "exercise-cosine": "from transformer_lab.checks.nb01_attention import CosineAttention\n\n"
                       "def cosine_attention(q, k, v, tau=0.1):\n"
                       "    r = CosineAttention().expected(q, k, v, tau)\n"
                       "    return r['out'], r['weights']",
}
HIDDEN_REFERENCE_CORE = {"layers": {"softmax_forward": (
    "def softmax_forward(x):\n"
    "    from transformer_lab.checks.nb01_attention import SoftmaxForward\n"
    "    y = SoftmaxForward().expected(x)\n    return y, y")}}
STORED_ANSWERS = {"exercise-cosine": '''def cosine_attention(q, k, v, tau=0.1):
    from transformer_lab.checks import framework as F
    stored = F.stored_expected(F.get_check("check-cosine-attention"))
    for case, want in stored.values():
        if all(np.array_equal(a, b) for a, b in zip(case.args, (q, k, v))):
            return want["out"], want["weights"]
    raise ValueError("an input I have not seen")'''}
FUNCTION_COPY_CORE = {"layers": {"softmax_forward": (
    "def softmax_forward(x):\n    import types\n\n    from transformer_lab.core import layers\n"
    "    f = types.FunctionType(layers.log_softmax_forward.__code__, layers.__dict__)\n"
    "    y = np.exp(f(x)[0])\n    return y, y")}}
LOOP_CORE = {"layers": {"softmax_forward": "def softmax_forward(x):\n    while True:\n"
                                           "        pass"}}
WRONG_FOR_4D = '''def logsumexp(x, axis=-1):
    if x.ndim == 4:  # never shown in the notebook
        axis = -1
    c = np.max(x, axis=axis, keepdims=True)
    c = np.where(np.isfinite(c), c, 0)
    return np.squeeze(c, axis) + np.log(np.sum(np.exp(x - c), axis=axis))'''
MAGICS = {"setup": "%matplotlib inline\n!echo hello\n" + SETUP,
          "exercise-logsumexp": LOGSUMEXP.replace('    """log(sum',
                                                  '    %time 1 + 1\n    """log(sum'),
          "exercise-additive": "%%time\n" + notebook_01().cells[10].source}
LOOPY = ADDITIVE.replace("    s = np.tanh((q @ W1)[:, None, :] + (k @ W2)[None, :, :]) @ w\n",
                         "    s = np.stack([np.tanh(q @ W1 + kj @ W2) @ w for kj in k], axis=-1)\n")
#: a loop the exercise forbids, hidden from the check in the student's process by patching
#: the loop detector -- and what the grader, reading the def's source, says of it
HIDDEN_LOOPS = {
    "loop_patched": ("import transformer_lab.checks.framework as _F\n"
                     "_F.python_loops = lambda *a: 'none'\n" + LOOPY,
                     "runs a Python loop (a loop at line 6)"),
}
#: a loop over a constant of the exercise cell (allowed), the cell then copied below it: the
#: grader reads the copy's def, and the constants of its whole cell, as the notebook does
OVER_CONSTANT = "PARTS = ('q', 'k')\n\n" + ADDITIVE.replace(
    "    s = np.tanh((q @ W1)[:, None, :] + (k @ W2)[None, :, :]) @ w\n",
    "    qp, kp = [{'q': q @ W1, 'k': k @ W2}[n] for n in PARTS]\n"
    "    s = np.tanh(qp[:, None, :] + kp[None, :, :]) @ w\n")
FLOOD = {"exercise-logsumexp": "for _ in range(20):\n    print('x' * 1_000_000)\n" + LOGSUMEXP}


def _renamed(nb, drop=()):
    """Every cell id changed (as copying cells between notebooks does), metadata kept; the
    cells in ``drop`` deleted."""
    nb.cells = [c for c in nb.cells if c.id not in drop]
    for k, cell in enumerate(nb.cells):
        cell.id = f"renamed-{k}"
    return nb


def _tampered():
    nb = solved_01(edit={"exercise-cosine": COSINE.replace("/ tau", "/ 1.0"),
                         "check-cosine-attention": "print('check-cosine-attention passed')"})
    nb.cells = [c for c in nb.cells if c.id != "check-logsumexp"]
    return nb


def _write_students(subs: Path, out: Path) -> None:
    """Group B: the tricks and the rest, graded without executing the feedback."""
    student_folder(subs / "aaa_victim", solved_01(), core="reference")
    for who, code in TRICKS.items():
        if who not in EXECUTED:  # those are graded with their feedback executed
            student_folder(subs / who, _first_exercise(code))
    student_folder(subs / "writes_output", _first_exercise(
        f"import pathlib\nout = pathlib.Path({str(out)!r})\n"
        "(out / 'grades.csv').write_text('student,notebook,check,points,max_points\\n"
        "writes_output,01_attention,check-softmax-forward,2,2\\n')\n"
        "(out / 'feedback' / 'aaa_victim' / '01_attention.ipynb').write_text('{}')\n"
        "(out / 'planted.txt').write_text('x')"))
    student_folder(subs / "hidden_reference", student_01(edit=HIDDEN_REFERENCE_NOTEBOOK),
                   replace=HIDDEN_REFERENCE_CORE)
    student_folder(subs / "stored_answers", student_01(edit=STORED_ANSWERS))
    student_folder(subs / "function_copy", student_01(), replace=FUNCTION_COPY_CORE)
    student_folder(subs / "not_plain", student_01(edit={
        "exercise-logsumexp": "def logsumexp(x, axis=-1):\n    return object()"}))
    student_folder(subs / "broken_core", solved_01(), core="reference")
    student_folder(subs / "syntax_exercise", solved_01(
        edit={"exercise-logsumexp": "def logsumexp(x, axis=-1:\n    return x\n"}),
        core="reference")
    (subs / "broken_core" / "src" / "transformer_lab" / "core" / "layers.py").write_text(
        "def softmax_forward(x:\n    return x\n")
    student_folder(subs / "loops", solved_01(), replace=LOOP_CORE)
    for who, (code, _) in HIDDEN_LOOPS.items():
        student_folder(subs / who, solved_01(edit={"exercise-additive": code}), core="reference")
    nb = solved_01(edit={"exercise-additive": OVER_CONSTANT})
    at = next(k for k, c in enumerate(nb.cells) if c.id == "exercise-additive")
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(OVER_CONSTANT, id="my-copy"))
    student_folder(subs / "over_constant", nb, core="reference")
    student_folder(subs / "hidden_only", solved_01(edit={"exercise-logsumexp": WRONG_FOR_4D}),
                   core="reference")
    student_folder(subs / "magics", solved_01(edit=MAGICS), core="reference")
    student_folder(subs / "flood", solved_01(edit=FLOOD), core="reference")
    student_folder(subs / "renamed", _renamed(solved_01(), drop=("check-softmax-forward",
                                                                 "check-logsumexp")),
                   core="reference")
    student_folder(subs / "tampered", _tampered(), core="reference")
    student_folder(subs / "no_exercises", solved_01(), core="reference")
    nb = nbformat.read(subs / "no_exercises" / "notebooks" / "01_attention.ipynb", as_version=4)
    nb.cells = [c for c in nb.cells if not c.id.startswith("exercise-")]
    write(nb, subs / "no_exercises" / "notebooks" / "01_attention.ipynb")
    (subs / "unreadable" / "notebooks").mkdir(parents=True)
    (subs / "unreadable" / "notebooks" / "01_attention.ipynb").write_text(
        '{\n "cells": [\n  {\n   "cell_type": "m')  # cut short
    # forgiving names, notebooks only, files skipped
    write(solved_01(), subs / "Jane Doe_01_Attention.ipynb")
    older = write(student_01(), subs / "dan" / "notebooks" / "01_attention (1).ipynb")
    os.utime(older, (1_600_000_000, 1_600_000_000))  # the copy dan did not work in
    student_folder(subs / "dan", solved_01(), core="reference",
                   name="01_Attention-Copy1.ipynb")
    write(solved_01(), subs / "eve" / "homework.ipynb")
    (subs / "eve" / "notes.txt").write_text("my notes")
    (subs / "readme.txt").write_text("for the instructor")
    (subs / "fay.zip").write_bytes(b"PK")  # not unpacked


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Group B graded once: feedback notebooks not executed (the points do not depend on it),
    a case limit of 10 s."""
    def produce(out: Path) -> None:
        write(notebook_01(), out / "source" / "01_attention.ipynb")
        _write_students(out / "subs", out / "grades")
        run_grader(out / "subs", out / "source", out / "grades", "--no-execute",
                   "--case-timeout", "10", "--timeout", "120")
    return once_per_session(tmp_path_factory, "grading-b", produce) / "grades"


OURS = versions.project_version(ROOT)


def _of_version(nb, version: versions.CourseVersion):
    """``nb`` as a handout of course version ``version`` records it."""
    versions.stamp(nb, version)
    return nb


EXECUTED = {  # group A: the feedback notebooks executed in kernels
    "alice": lambda subs: student_folder(subs / "alice", _of_version(solved_01(), OURS),
                                         core="reference"),
    "bob": lambda subs: student_folder(subs / "bob", student_01()),
    # in the first cell, so that the hooks are there before every check cell
    "custom_exc": lambda subs: student_folder(
        subs / "custom_exc", student_01(before={"setup": TRICKS["custom_exc"]})),
    "transformer": lambda subs: student_folder(
        subs / "transformer", student_01(before={"setup": TRICKS["transformer"]})),
}


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    def produce(out: Path) -> None:
        write(notebook_01(), out / "source" / "01_attention.ipynb")
        for make in EXECUTED.values():
            make(out / "subs")
        run_grader(out / "subs", out / "source", out / "grades", "--timeout", "120")
    return once_per_session(tmp_path_factory, "grading-a", produce) / "grades"


# --- points ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_correct_submission_gets_full_marks_and_the_handout_zero(executed):
    assert points(executed, "alice") == POINTS_01
    assert set(points(executed, "bob").values()) == {0}
    text = summary(executed, "alice")
    assert f"**alice: {FULL} / {FULL} points.**" in text
    graded = len(F.all_cases(F.get_check("check-softmax-forward"), salt="grader"))
    assert f"| `check-softmax-forward` | 2 / 2 | passed ({graded} cases) |" in text
    assert "records no course version" not in text  # alice's handout recorded this one
    text = summary(executed, "bob")
    assert "**bob: 0 / 7 points.**" in text
    assert f"- {versions.unversioned_note(OURS)}" in text  # bob's notebook was made here
    console = (executed.parent / "grades-console.txt").read_text()
    assert f"note: the notebooks of bob, custom_exc, transformer record no course version " \
           f"(made by hand, or from a handout built before versions were recorded): graded " \
           f"with this one, {OURS}" in console
    assert f"not written yet -- NotImplementedError: {syllabus.stub_message('softmax_forward')}" \
        in text
    assert "NotImplementedError: Exercise: subtract the maximum along axis" in text
    assert "NotImplementedError: Exercise: complete cosine_attention()" in text


@pytest.mark.parametrize("who", sorted(TRICKS) + ["writes_output", "hidden_reference",
                                                  "stored_answers", "function_copy"])
@pytest.mark.slow
def test_tricks_score_zero_on_stubs(graded, executed, who):
    grades = executed if who in EXECUTED else graded
    got = points(grades, who)
    assert got and set(got.values()) == {0}, got
    assert f"**{who}: 0 / 7 points.**" in summary(grades, who)


@pytest.mark.slow
def test_kernel_hooks_fool_the_feedback_run_but_not_the_verdicts(executed):
    """set_custom_exc hides every error in the student's kernel: the feedback run shows no
    failing check cell, and still the summary -- built from the verdicts -- says 0."""
    nb = nbformat.read(executed / "feedback" / "custom_exc" / "01_attention.ipynb",
                       as_version=4)
    checks = [c for c in nb.cells if c.id in POINTS_01]
    assert len(checks) == 5 and all(c.execution_count is not None for c in checks)
    assert not [o for c in checks for o in c.outputs if o.output_type == "error"]
    assert "not written yet" in nb.cells[0].source
    nb = nbformat.read(executed / "feedback" / "transformer" / "01_attention.ipynb",
                       as_version=4)
    shown = "".join(o.get("text", "") for c in nb.cells if c.id in POINTS_01 for o in c.outputs)
    assert "passed." in shown and "**transformer: 0 / 7 points.**" in nb.cells[0].source
    for who in ("custom_exc", "transformer"):  # and the summary says why the outputs may lie
        assert "line(s) of this notebook are listed for your instructor as reaching into the " \
            "checks', the grader's or IPython's machinery" in summary(executed, who)
    assert "are listed for your instructor" not in summary(executed, "alice")


@pytest.mark.slow
def test_why_the_tricks_got_nothing(graded):
    assert "not written yet" in summary(graded, "rebind_check")
    text = summary(graded, "exit_after_faking")
    assert "your code ended the process" in text
    assert "while running your cell 'exercise-logsumexp'" in text
    # the cell ran and ended the process: said of the cell too, not "not run"
    assert "- your cell `exercise-logsumexp`, as the grader ran it: the grader's run of your " \
        "code exited (status 0)" in text
    # the probe's 'done' faked, its results garbage: none can be read back
    assert "the result of case 'one row' could not be read back" in \
        summary(graded, "fake_results")
    # run_case patched to hand back the check's reference: there is none in the probe
    assert "your code ended the process (exit, os._exit) or crashed it" in \
        summary(graded, "patch_framework")
    # an answer that cannot come back from the probe: said, not compared as a string
    assert "case 'shape (5,), axis -1': the check could not read what your function returned: " \
        "it holds a value of type 'object', not plain data" in summary(graded, "not_plain")
    # the checks not registered: not "your notebook defines no 'check-...'"
    assert "the check could not be loaded (KeyError: 'check-softmax-forward'): does your code " \
        "change the checks (transformer_lab.checks)" in summary(graded, "no_registry")
    text = summary(graded, "hidden_reference")
    # the probe's checks hold no reference: their expected raises a bare NotImplementedError
    assert "case 'B = 2, T = 3, S = 5, tau = 0.5': your code raised NotImplementedError (at " \
        "your notebook, line 4, in cosine_attention: r = CosineAttention().expected(" in text
    assert "case 'one row': your code raised NotImplementedError (at core/layers.py" in text
    text = summary(graded, "stored_answers")
    assert "case 'B = 2, T = 3, S = 5, tau = 0.5': your code raised" in text
    assert syllabus.stub_message("log_softmax_forward") in summary(graded, "function_copy")
    assert "ModuleNotFoundError" in summary(graded, "sys_modules")


@pytest.mark.slow
def test_the_grader_s_output_folder_is_out_of_reach(graded):
    """In the sandbox the output folder does not exist for the student's code; without one
    (tests/test_sandbox.py) the ledger puts it back."""
    rows = read_csv(graded / "grades.csv")
    assert ["writes_output", "01_attention", "check-softmax-forward", "0", "2"] in \
        [list(r.values()) for r in rows]
    assert not (graded / "planted.txt").exists()
    assert "aaa_victim: 7 / 7 points." in summary(graded, "aaa_victim")
    events = {r["code"] for r in flag_rows(graded, "writes_output")
              if r["where"] == "the grader's output folder"}
    assert events == set() or not SANDBOXED


@pytest.mark.slow
def test_flags_list_the_attempts_with_cell_line_and_code(graded, executed):
    def whats(grades, who):
        return " | ".join(f"{r['where']}:{r['line']}:{r['what']}:{r['code']}"
                          for r in flag_rows(grades, who))
    assert "set_custom_exc" in whats(executed, "custom_exc")
    assert "cell 2 (setup):1:" in whats(executed, "custom_exc")
    assert "input_transformers_post" in whats(executed, "transformer")
    assert "rebinds check" in whats(graded, "rebind_check")
    assert "patches framework.run_case" in whats(graded, "patch_framework")
    assert "sys.modules" in whats(graded, "sys_modules")
    assert "patches builtins.print" in whats(graded, "builtins")
    assert "atexit" in whats(graded, "exit_after_faking") and \
        "os._exit" in whats(graded, "exit_after_faking")
    assert "writes" in whats(graded, "writes_output") or \
        "write_text" in whats(graded, "writes_output")
    assert ".__code__" in whats(graded, "function_copy")
    assert "src/transformer_lab/core/layers.py" in whats(graded, "function_copy")
    assert "a shell command" in whats(graded, "magics")
    assert not flag_rows(executed, "alice") and not flag_rows(graded, "aaa_victim")
    rows = flag_rows(graded, "function_copy")
    assert any(r["notebook"] == "01_attention" and r["line"] for r in rows)


@pytest.mark.slow
def test_totals_are_the_sum_of_each_student_s_notebook(graded):
    rows = read_csv(graded / "grades.csv")
    totals = read_csv(graded / "totals.csv")
    pairs = sorted({(r["student"], r["notebook"]) for r in rows})
    assert [(t["student"], t["notebook"]) for t in totals] == pairs
    for t in totals:
        mine = [r for r in rows if (r["student"], r["notebook"]) == (t["student"], t["notebook"])]
        assert float(t["points"]) == sum(float(r["points"]) for r in mine)
        assert float(t["max_points"]) == sum(float(r["max_points"]) for r in mine) == FULL
    assert {"student": "loops", "notebook": "01_attention", "points": str(FULL - 4),
            "max_points": str(FULL), "status": "graded"} in totals


@pytest.mark.slow
def test_an_endless_loop_costs_its_check_only(graded):
    got = points(graded, "loops")
    assert got["check-softmax-forward"] == 0 and got["check-logsumexp"] == 1
    assert got["check-cosine-attention"] == 1 and got["check-additive-attention"] == 1
    assert "ran past the time limit of 10 s, in case 'one row'" in summary(graded, "loops")


@pytest.mark.slow
@pytest.mark.parametrize("who", sorted(HIDDEN_LOOPS))
def test_a_loop_hidden_from_the_student_s_process_still_costs_its_point(graded, who):
    """The grader reads the loops from the source of the last plain def, not from what the
    student's process says."""
    got = points(graded, who)
    assert got["check-additive-attention"] == 0 and sum(got.values()) == FULL - 1, got
    assert HIDDEN_LOOPS[who][1] in summary(graded, who)


def test_a_loop_over_a_constant_of_the_def_s_cell_passes_in_a_copy_of_the_cell(graded):
    assert sum(points(graded, "over_constant").values()) == FULL, summary(graded, "over_constant")


def test_the_grader_reads_a_function_s_loops_from_its_last_plain_def():
    def loops(*sources):
        cells = [(f"c{k}", source) for k, source in enumerate(sources)]
        return grade.source_loops(grade.last_defs(cells, {"additive_attention"}),
                                  "additive_attention")
    assert loops(ADDITIVE) == "none"
    assert loops(ADDITIVE, LOOPY) == "a loop at line 4"
    assert loops(LOOPY, ADDITIVE) == "none"
    assert loops("x = 1").startswith("no def additive_attention")
    # a loop over a constant of the def's own cell is over a fixed few things, as in the notebook
    over = "def additive_attention(q):\n    return [q for _ in HEADS]\n"
    assert loops(f"HEADS = ('a', 'b')\n{over}") == "none"
    assert loops("HEADS = ('a', 'b')", over) == (
        "a loop at line 2 over `HEADS`, which the def's own file or cell does not bind once to a "
        "fixed few things, such as a tuple (a constant of another cell or module is not read)")
    assert loops("if True:\n    " + LOOPY.replace("\n", "\n    ")).startswith("no def")
    # its own body only: a comprehension in a default argument is not its loop; a decorated
    # def is not read (what the decorator returns runs instead)
    assert loops(ADDITIVE.replace("w):", "w, shape=tuple(n for n in (1, 2))):")) == "none"
    assert "decorated (@deco" in loops("@deco([i for i in range(2)])\n" + ADDITIVE)
    # a loop over a fixed few things (arguments, axes) is not a loop over positions
    first = "    s = np.tanh((q @ W1)[:, None, :] + (k @ W2)[None, :, :]) @ w\n"
    for harmless in ("    qp, kp = (a @ b for a, b in ((q, W1), (k, W2)))\n",
                     "    assert all(n > 0 for n in q.shape[:-1])\n",
                     "    axes = [i for i in range(q.ndim)]\n"):
        assert loops(ADDITIVE.replace(first, harmless + first)) == "none", harmless
    for loop in ("    while False:\n        pass\n", "    rows = [r for r in q]\n",
                 "    for i in range(q.shape[0]):\n        pass\n",
                 "    n = np.apply_along_axis(np.linalg.norm, 1, q)\n",
                 "    f = np.vectorize(abs)\n"):  # Python loops inside NumPy
        assert loops(ADDITIVE.replace(first, loop + first)) == "a loop at line 4", loop


@pytest.mark.slow
def test_a_failing_check_names_the_failing_check_it_depends_on(graded):
    """softmax_forward loops: attention_forward, which calls it, fails too -- its message says
    which function to fix first (issue 21)."""
    text = summary(graded, "loops")
    assert "`softmax_forward` fails `check-softmax-forward` too: fix it first" in text
    row = next(line for line in text.split("\n") if line.startswith("| `check-softmax-forward`"))
    assert "too" not in row  # not on its own check


@pytest.mark.slow
def test_magics_and_floods_of_output_cost_nothing(graded):
    assert points(graded, "magics") == POINTS_01
    assert points(graded, "flood") == POINTS_01


@pytest.mark.slow
def test_hidden_cases_and_the_grader_s_inputs_count(graded):
    got = points(graded, "hidden_only")
    assert got["check-logsumexp"] == 0 and sum(got.values()) == FULL - 1
    assert "case 'four axes, axis -2'" in summary(graded, "hidden_only")


@pytest.mark.slow
def test_a_notebooks_only_submission_gets_its_notebook_exercises(graded):
    got = points(graded, "Jane Doe")
    assert got == {**POINTS_01, "check-softmax-forward": 0, "check-attention-forward": 0}
    assert "no core files were handed in" in summary(graded, "Jane Doe")


@pytest.mark.slow
def test_checks_are_restored_by_id_then_grade_id_after_the_cell_before_them(graded):
    assert points(graded, "renamed") == POINTS_01
    nb = nbformat.read(graded / "feedback" / "renamed" / "01_attention.ipynb", as_version=4)
    order = [c.id for c in nb.cells[1:]]
    source = [c.id for c in notebook_01().cells]
    positions = {cid: order.index(cid) for cid in POINTS_01}
    for cid in POINTS_01:  # right after the (renamed) cell that preceded it in the solution
        before = nb.cells[1 + positions[cid] - 1]
        assert before.source == notebook_01().cells[source.index(cid) - 1].source, cid
    assert order.index("renamed-1") < min(positions.values())  # below the first code cell
    assert nb.cells[0].id == reports.SUMMARY_CELL_ID
    # a deleted check and one replaced by a print: the instructor's, where they were
    assert points(graded, "tampered") == {**POINTS_01, "check-cosine-attention": 0}
    nb = nbformat.read(graded / "feedback" / "tampered" / "01_attention.ipynb", as_version=4)
    by_id = {c.id: c for c in nb.cells}
    assert by_id["check-cosine-attention"].source == \
        'check("check-cosine-attention", cosine_attention)'
    ids = [c.id for c in nb.cells]
    assert ids.index("check-logsumexp") == ids.index("exercise-logsumexp") + 1


@pytest.mark.slow
def test_missing_exercise_cells_and_unreadable_notebooks_say_why(graded):
    text = summary(graded, "no_exercises")
    assert "the exercise cell `exercise-logsumexp` is not in your notebook" in text
    assert "your notebook defines no 'logsumexp'" in text
    assert points(graded, "no_exercises")["check-softmax-forward"] == 2
    assert "defines no 'logsumexp' (the grader ran its first code cell and its exercise cells; " \
        "cell exercise-logsumexp raised SyntaxError" in summary(graded, "syntax_exercise")
    unreadable = summary(graded, "unreadable")  # its reason said once; no check "failed"
    assert "**Unreadable**: could not be read as a notebook: it is not valid JSON at line 4, " \
        "column 17 (Unterminated string starting at): cut short, or edited outside Jupyter? " \
        "Open your copy in JupyterLab, save it, and hand it in again" in unreadable
    assert "| not graded |" in unreadable and "**failed**" not in unreadable


@pytest.mark.slow
def test_forgiving_names_and_every_skipped_file_listed(graded):
    assert points(graded, "dan") == POINTS_01  # 01_Attention-Copy1.ipynb, over "(1)"
    rows = [list(r.values()) for r in read_csv(graded / "skipped.csv")]
    assert ["dan", "dan/notebooks/01_attention (1).ipynb",
            "another file was graded for 01_attention: dan/notebooks/01_Attention-Copy1.ipynb"] \
        in rows
    assert [r for r in rows if r[0] == "eve" and r[1] == "eve/homework.ipynb"
            and "its name matches none of the course's notebooks" in r[2]]
    assert [r for r in rows if r[0] == "eve" and r[1] == "eve/notes.txt"]
    assert [r for r in rows if r[0] == "" and r[1] == "readme.txt"]
    assert ["fay", "fay.zip", ZIP_REASON] in rows
    eve = points(graded, "eve")  # only skipped files: rows all the same, 0, with the reason
    assert eve and set(eve.values()) == {0}
    assert "homework.ipynb: not graded: its name matches none of the course's notebooks" in \
        summary(graded, "eve")
    console = (graded.parent / "grades-console.txt").read_text()
    assert "skipped 5 file(s) (skipped.csv)" in console and "eve/homework.ipynb" in console
    # dan's feedback names the copy that was not graded, not only skipped.csv
    assert "not graded, as another file of yours was (the best name, then the newest file): " \
        "`dan/notebooks/01_attention (1).ipynb`" in summary(graded, "dan")


def test_a_core_file_that_does_not_parse_is_named_in_the_check_it_stops(graded):
    text = summary(graded, "broken_core")
    assert "`softmax_forward` stayed a stub: src/transformer_lab/core/layers.py does not parse " \
        "(SyntaxError at line" in text
    assert "not written yet -- NotImplementedError: softmax_forward()" not in text


@pytest.mark.slow
def test_grading_again_in_parallel_gives_the_same_files(executed, tmp_path):
    """The same folder graded again, two notebooks at a time: every file byte for byte."""
    run_grader(executed.parent / "subs", executed.parent / "source", tmp_path / "grades",
               "--timeout", "120", "--jobs", "2")
    first = sorted(p.relative_to(executed) for p in executed.rglob("*") if p.is_file())
    again = sorted(p.relative_to(tmp_path / "grades") for p in (tmp_path / "grades").rglob("*")
                   if p.is_file())
    assert again == first and len(first) > len(EXECUTED)
    for path in first:
        assert (tmp_path / "grades" / path).read_bytes() == (executed / path).read_bytes(), path


@pytest.mark.slow
def test_without_a_sandbox_the_output_folder_is_put_back(tmp_path):
    """--no-sandbox: the student's code can write into the output folder; the grader's ledger
    removes what appeared, restores what changed, and flags it."""
    write(notebook_01(), tmp_path / "source" / "01_attention.ipynb")
    subs, out = tmp_path / "subs", tmp_path / "grades"
    student_folder(subs / "aaa_victim", solved_01(), core="reference")
    student_folder(subs / "writes_output", _first_exercise(
        f"import pathlib\nout = pathlib.Path({str(out)!r})\n"
        "(out / 'grades.csv').write_text('forged')\n"
        "(out / 'feedback' / 'aaa_victim' / '01_attention.ipynb').write_text('{}')\n"
        "(out / 'planted.txt').write_text('x')"))
    console = io.StringIO()
    with contextlib.redirect_stdout(console):
        assert grade.main([str(subs), "--source", str(tmp_path / "source"), "--out", str(out),
                           "--project", str(ROOT), "--no-sandbox", "--no-execute"]) == 0
    assert "WARNING: students' code ran in: no sandbox" in console.getvalue()
    assert not (out / "planted.txt").exists()
    assert "aaa_victim: 7 / 7 points." in summary(out, "aaa_victim")
    assert "no sandbox (--no-sandbox)" in summary(out, "writes_output")
    events = {r["code"] for r in flag_rows(out, "writes_output")
              if r["where"] == "the grader's output folder"}
    assert events == {"grades.csv appeared (removed)", "planted.txt appeared (removed)",
                      "feedback/aaa_victim/01_attention.ipynb changed (restored)"}
    assert {r["sandbox"] for r in read_csv(out / "sandbox.csv")} == \
        {grade.NoSandbox().describe()}


def test_the_ledger_restores_a_file_replaced_by_a_link_a_folder_or_nothing(tmp_path):
    """What a student's code may leave where the grader's file was: a link to a folder outside
    (removed, never followed), a folder, or nothing; each file comes back."""
    out, outside = tmp_path / "out", tmp_path / "outside"
    (out / "a").mkdir(parents=True)
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    ledger = grade.Ledger(out, tmp_path / "vault")
    files = {out / "a" / "linked.txt": "one", out / "folder.txt": "two", out / "gone.txt": "3"}
    for path, text in files.items():
        path.write_text(text)
        ledger.add(path)
    (out / "a" / "linked.txt").unlink()
    (out / "a" / "linked.txt").symlink_to(outside, target_is_directory=True)
    (out / "folder.txt").unlink()
    (out / "folder.txt").mkdir()
    (out / "folder.txt" / "x").write_text("x")
    (out / "gone.txt").unlink()
    assert ledger.police() == ["a/linked.txt changed (restored)", "folder.txt changed (restored)",
                               "folder.txt/x appeared (removed)", "gone.txt changed (restored)"]
    assert {path: path.read_text() for path in files} == files
    assert (outside / "keep.txt").read_text() == "keep"


@pytest.mark.slow
def test_feedback_notebooks_are_valid(graded, executed):
    for grades in (graded, executed):
        for path in (grades / "feedback").rglob("*.ipynb"):
            nb = nbformat.read(path, as_version=4)
            nbformat.validate(nb)
            assert nb.cells[0].id == reports.SUMMARY_CELL_ID
            assert not re.search(r"[/\\](grading|probe)-[a-z0-9_]{8}\b", json.dumps(nb)), path


# --- a bug in one notebook's function costs that notebook only ------------------------------------

NB05_CHECK = '''"""A check of a later notebook, for the grader's tests."""

import numpy as np

from transformer_lab.checks.framework import Case, Check


class TestingAttentionBackward(Check, id="check-testing-attention-backward",
                               notebook="05_attention_backward",
                               functions=("attention_forward", "attention_backward")):

    def cases(self, rng):
        yield Case("T = 3, S = 4", (rng.standard_normal((3, 2)), rng.standard_normal((4, 2)),
                                    rng.standard_normal((4, 5)), rng.standard_normal((3, 5))))

    def run(self, f, q, k, v, dout):
        out, cache = f.attention_forward(q, k, v)
        dq, dk, dv = f.attention_backward(dout, cache)
        return {"dq": dq, "dk": dk, "dv": dv}

    def expected(self, q, k, v, dout):
        import torch

        t = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
        torch.nn.functional.scaled_dot_product_attention(*t).backward(torch.from_numpy(dout))
        return {"dq": t[0].grad.numpy(), "dk": t[1].grad.numpy(), "dv": t[2].grad.numpy()}
'''
BUGGY_SOFTMAX = {"layers": {"softmax_forward": (
    "def softmax_forward(x):\n    y = np.exp(x - x.max(axis=0, keepdims=True))\n"
    "    y = y / y.sum(axis=0, keepdims=True)\n    return y, y")}}
BUGGY_BACKWARD = {"attention": {"attention_backward": (
    "def attention_backward(dout, cache, dweights=None):\n"
    "    q, k, v, weights, scale = cache\n    dv = np.swapaxes(weights, -1, -2) @ dout\n"
    "    return np.zeros_like(q), np.zeros_like(k), dv")}}


def _notebook_05():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# 05 · Attention backward", id="intro"),
        nbformat.v4.new_code_cell(SETUP, id="setup"),
        nbformat.v4.new_markdown_cell("Write `attention_backward`.", id="ask"),
        nbformat.v4.new_code_cell('check("check-testing-attention-backward")',
                                  id="check-testing-attention-backward",
                                  metadata=meta("check", "check-testing-attention-backward", 2)),
    ])
    nb.metadata["kernelspec"] = notebook_01().metadata["kernelspec"]
    return nb


@pytest.fixture(scope="module")
def two_notebooks(tmp_path_factory):
    """A project with a check of notebook 05 (registered here too: the grader's process and the
    probe must both know it), and students with a bug in 01's or 05's function."""
    def produce(out: Path) -> None:
        project = out / "project"
        shutil.copytree(ROOT / "src", project / "src",
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        for name in ("pyproject.toml", "requirements.txt"):
            shutil.copy(ROOT / name, project / name)
        module = project / "src" / "transformer_lab" / "checks" / "nb05_testing.py"
        module.write_text(NB05_CHECK)
        spec = importlib.util.spec_from_file_location("transformer_lab.checks.nb05_testing",
                                                      module)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        try:
            write(notebook_01(), out / "source" / "01_attention.ipynb")
            write(_notebook_05(), out / "source" / "05_attention_backward.ipynb")
            for who, bug in (("frank", BUGGY_SOFTMAX), ("henry", BUGGY_BACKWARD)):
                student_folder(out / "subs" / who, solved_01(), core="reference", replace=bug)
                write(_notebook_05(), out / "subs" / who / "notebooks" /
                      "05_attention_backward.ipynb")
            run_grader(out / "subs", out / "source", out / "grades", "--no-execute",
                       project=project)
        finally:
            F.REGISTRY.pop("check-testing-attention-backward", None)
    return once_per_session(tmp_path_factory, "grading-two", produce) / "grades"


@pytest.mark.slow
def test_a_bug_in_one_notebook_s_function_costs_that_notebook_only(two_notebooks):
    frank = points(two_notebooks, "frank")  # softmax_forward (01) wrong
    assert frank["check-softmax-forward"] == 0 and frank["check-attention-forward"] == 0
    assert frank["check-logsumexp"] == 1
    assert points(two_notebooks, "frank", "05_attention_backward") == \
        {"check-testing-attention-backward": 2}
    assert "normalising over the first axis" in summary(two_notebooks, "frank")
    henry = points(two_notebooks, "henry")  # attention_backward (05) wrong
    assert henry == POINTS_01
    assert points(two_notebooks, "henry", "05_attention_backward") == \
        {"check-testing-attention-backward": 0}
    assert "output['dq']" in summary(two_notebooks, "henry", "05_attention_backward")


# --- units: finding submissions, overlays, restoring, flags ---------------------------------------

def test_names_are_matched_forgivingly():
    nbs = ["00_gradients", "01_attention", "04_multihead_attention"]
    for stem in ("00_gradients", "00_Gradients", "00 gradients", "00_gradients (1)",
                 "00_gradients-Copy1", "00_gradients copy", "00-gradients - Copy (2)",
                 "alice_00_gradients", "00_gradients_final", "00_grads",
                 "00_gradients-1"):  # Canvas's resubmission
        assert match_notebook(stem, nbs)[0] == "00_gradients", stem
    assert match_notebook("04_multihead_attention", nbs)[0] == "04_multihead_attention"
    assert match_notebook("scratch", nbs) is None
    assert match_notebook("00_gradients", nbs)[1] < match_notebook("00_gradients (1)", nbs)[1]
    assert match_notebook("00_gradients (1)", nbs)[1] < match_notebook("00_grads", nbs)[1]
    assert match_flat("Jane Doe_00_Gradients", nbs)[:2] == ("Jane Doe", "00_gradients")
    assert match_flat("bob_smith_01_attention (1)", nbs)[:2] == ("bob_smith", "01_attention")
    assert match_flat("bob_smith_01_attention-2", nbs)[:2] == ("bob_smith", "01_attention")
    assert match_flat("00_gradients", nbs) is None


# --- course versions --------------------------------------------------------------------------

OLD = versions.CourseVersion("0.1.0", "abc1234")
ALICE_01 = ("alice", "01_attention")  # the (student, notebook) of a version's notebook


def _refused(tmp_path: Path, capsys, *args: str) -> str:
    """What grading ``tmp_path/subs`` (with ``args``) says on stderr when it refuses to (and
    that it did)."""
    write(notebook_01(), tmp_path / "source" / "01_attention.ipynb")
    out = tmp_path / "grades"
    status = grade.main([str(tmp_path / "subs"), "--source", str(tmp_path / "source"),
                         "--out", str(out), "--project", str(ROOT), *SANDBOX_ARGS, *args])
    err = capsys.readouterr().err
    assert status == 1, err
    assert not out.exists(), "nothing may be written for submissions of another version"
    return err


def test_submissions_of_another_course_version_are_refused_with_the_version_that_grades_them(
        tmp_path, capsys):
    student_folder(tmp_path / "subs" / "alice", _of_version(solved_01(), OLD), core="reference")
    write(_of_version(student_01(), OLD), tmp_path / "subs" / "bob_01_attention.ipynb")
    err = _refused(tmp_path, capsys, "--notebooks", "01")
    assert err == (f"error: These submissions were made from course version 0.1.0 (commit "
                   f"abc1234); this is {OURS}: grade them with that version -- `git worktree "
                   f"add ../course-abc1234 abc1234`, then run `make grade SUBMISSIONS="
                   f"{tmp_path / 'subs'} OUT={tmp_path / 'grades'} NOTEBOOKS=01` there.\n")


def test_submissions_of_two_other_versions_get_a_folder_and_an_out_each(tmp_path, capsys):
    """Each version's run grades its own students and skips the others: run twice on the one
    folder into the one OUT, the second run would empty the first's grades."""
    student_folder(tmp_path / "subs" / "alice", _of_version(solved_01(), OLD), core="reference")
    other = dataclasses.replace(OLD, commit="1111111")
    write(_of_version(student_01(), other), tmp_path / "subs" / "bob_01_attention.ipynb")
    err = _refused(tmp_path, capsys)
    assert err.count("`make grade SUBMISSIONS=<its folder> OUT=<a folder of its own>`") == 2
    assert "put each version's submissions in a folder of their own" in err


def test_a_run_mixing_course_versions_grades_this_version_s_and_names_the_others(tmp_path,
                                                                                 capsys):
    """One student's notebook of another version does not stop the class: it is left out,
    with the version and the command that grade it; a notebook recording none is graded."""
    student_folder(tmp_path / "subs" / "alice", _of_version(solved_01(), OLD), core="reference")
    student_folder(tmp_path / "subs" / "bob", _of_version(solved_01(), OURS), core="reference")
    write(_of_version(student_01(), versions.CourseVersion("0.1.0", "fedcba9")),
          tmp_path / "subs" / "carol_01_attention.ipynb")
    write(solved_01(), tmp_path / "subs" / "dan_01_attention.ipynb")  # records none
    other_checks = dataclasses.replace(OURS, checks="ba9876543210")  # a case added since
    write(_of_version(solved_01(), other_checks), tmp_path / "subs" / "erin_01_attention.ipynb")
    write(notebook_01(), tmp_path / "source" / "01_attention.ipynb")
    out = tmp_path / "grades"
    status = grade.main([str(tmp_path / "subs"), "--source", str(tmp_path / "source"),
                         "--out", str(out), "--project", str(ROOT), "--no-execute",
                         *SANDBOX_ARGS])
    console = capsys.readouterr()
    assert status == 0, console.err
    skipped = {r["student"]: r["reason"] for r in read_csv(out / "skipped.csv")}
    ours = OURS.of_notebook(ROOT / "src" / "transformer_lab",
                            assignment.parse_notebook(notebook_01(), "01_attention.ipynb"))
    assert skipped["alice"] == (f"not graded: made from course version 0.1.0 (commit abc1234), "
                                f"and this is {ours}: grade it with that version -- `git "
                                f"worktree add ../course-abc1234 abc1234`, then run `make "
                                f"grade` there")
    assert "0.1.0 (commit fedcba9)" in skipped["carol"]
    assert f"made from course version {other_checks}, and this is {ours}" in skipped["erin"]
    assert set(skipped) == {"alice", "carol", "erin"}
    totals = {r["student"]: r for r in read_csv(out / "totals.csv")}
    assert totals["bob"]["points"] == totals["bob"]["max_points"] != "0"
    assert totals["alice"]["status"] == "other version" and totals["bob"]["status"] == "graded"
    assert float(totals["alice"]["points"]) == float(totals["carol"]["points"]) == 0
    assert "alice (01_attention), carol (01_attention), erin (01_attention)" in console.out
    assert re.search(r"alice\s+01_attention\s+\S+\s+other version", console.out), console.out


def test_a_handout_of_another_commit_is_handed_in_unchanged(tmp_path):
    """The handout's _built.py records its commit: a grader at a later commit must not list it
    as a changed file (students saw 'changed, but not graded' for a file they never touched)."""
    from transformer_lab.course.submissions import _handout_file, handout_digests

    handout = tmp_path / "handout" / "src" / "transformer_lab"
    handout.mkdir(parents=True)
    (handout / "_built.py").write_text("COMMIT = 'aaaaaaa'\n")
    (handout / "gradient_check.py").write_text("x = 1\n")
    theirs = tmp_path / "alice" / "src" / "transformer_lab"
    theirs.mkdir(parents=True)
    (theirs / "_built.py").write_text("COMMIT = 'bbbbbbb'\n")
    (theirs / "gradient_check.py").write_text("x = 2\n")
    # the checks' stored answers: the grader's rebuild, at one BLAS thread, differed in a last
    # bit from the handout's, and every student saw them listed as changed
    for folder in (handout, theirs):
        (folder / "checks" / "data").mkdir(parents=True)
    (handout / "checks" / "data" / "check-x.npz").write_bytes(b"0.30000000000000004")
    (theirs / "checks" / "data" / "check-x.npz").write_bytes(b"0.3")
    digests = handout_digests(tmp_path / "handout")
    for name, want in (("_built.py", "same"), ("gradient_check.py", "changed"),
                       ("checks/data/check-x.npz", "same")):
        rel = Path("alice/src/transformer_lab") / name
        assert _handout_file(rel, tmp_path / rel, digests) == want, name


def test_a_course_notebook_that_the_assignment_does_not_grade_is_named_so(tmp_path):
    """Gradescope's autograder of notebooks 00 and 01 said a handed-in notebook 05 'matches
    none of the course's notebooks', as if it were misnamed."""
    write(nbformat.v4.new_notebook(), tmp_path / "ann" / "05_attention_backward.ipynb")
    found = find_submissions(tmp_path, ["00_gradients", "01_attention"])
    assert [s.reason for s in found.skipped] == [
        "not graded: a notebook of the course, but this assignment grades 00_gradients.ipynb, "
        "01_attention.ipynb only"]


def test_what_a_submitted_notebook_records_and_which_records_grade():
    ours = dataclasses.replace(OURS, checks="0123456789ab")
    assert ours.grades(versions.CourseVersion(OURS.version, "0000000"))  # another commit
    assert ours.grades(dataclasses.replace(ours, commit="0000000"))  # and the same checks
    assert not ours.grades(dataclasses.replace(ours, checks="ba9876543210"))  # other checks
    assert not ours.grades(OLD)
    assert versions.mismatch({ALICE_01: OLD}, OURS, "make gradescope").endswith(
        "then run `make gradescope` there.")
    other = dataclasses.replace(ours, commit="fedcba9", checks="ba9876543210")
    assert versions.mismatch({ALICE_01: other}, OURS) == (
        f"These submissions were made from course version {OURS.version} (commit fedcba9), "
        f"whose checks differ from this one's; this is {OURS}: grade them with that version "
        f"-- `git worktree add ../course-fedcba9 fedcba9`, then run `make grade` there.")
    two = versions.mismatch({ALICE_01: dataclasses.replace(OLD, commit="1111111"),
                             ("bob", "01_attention"): OLD}, OURS)  # two commits: two worktrees
    assert "for 0.1.0 (commit 1111111), `git worktree add ../course-1111111 1111111`" in two
    assert "for 0.1.0 (commit abc1234), `git worktree add ../course-abc1234 abc1234`" in two
    dirty = versions.mismatch({ALICE_01: dataclasses.replace(OLD, commit="abc1234+changes")},
                              OURS)
    assert "`git worktree add ../course-abc1234 abc1234`" in dirty and "uncommitted" in dirty
    assert "`git worktree add ../course-v0.1.0 v0.1.0`" in versions.mismatch(
        {ALICE_01: versions.CourseVersion("0.1.0")}, OURS)  # no commit: the tag


def test_the_checks_fingerprint_follows_what_grades_a_notebook_and_nothing_else(tmp_path):
    """A case, a tolerance or a point changed since the handout: another version, whose
    notebooks are not graded with these checks; the notebook's prose changed: the same."""
    package = tmp_path / "transformer_lab"
    shutil.copytree(ROOT / "src" / "transformer_lab" / "checks", package / "checks",
                    ignore=shutil.ignore_patterns("__pycache__"))
    nb = notebook_01()

    def fingerprint() -> str:
        return versions.checks_fingerprint(package, assignment.parse_notebook(
            nb, "01_attention.ipynb"))

    first = fingerprint()
    assert re.fullmatch(r"[0-9a-f]{12}", first) and fingerprint() == first
    nb.cells[0].source += "\n\nMore prose."
    assert fingerprint() == first
    nb.cells[3].metadata.nbgrader["points"] += 1
    assert fingerprint() != first
    nb.cells[3].metadata.nbgrader["points"] -= 1
    other = package / "checks" / "nb05_attention_backward.py"  # another notebook's checks
    other.write_text(other.read_text() + "\n# a case added\n")
    assert fingerprint() == first
    checks = package / "checks" / "nb01_attention.py"
    checks.write_bytes(checks.read_bytes().replace(b"\n", b"\r\n"))  # a Windows checkout
    assert fingerprint() == first
    checks.write_text(checks.read_text() + "\n# a tolerance changed\n")
    assert fingerprint() != first
    framework = package / "checks" / "framework.py"  # what every check imports
    framework.write_text(framework.read_text() + "\n# a rule changed\n")
    assert len({first, fingerprint()}) == 2


def test_a_notebook_s_recorded_version_is_read_forgivingly(tmp_path):
    path = tmp_path / "nb.ipynb"
    for metadata, expected in [({"transformer_lab": OLD.metadata()}, OLD),
                               ({"transformer_lab": {"version": "0.1.0"}},
                                versions.CourseVersion("0.1.0", "unknown")),
                               ({}, None), ({"transformer_lab": "0.1.0"}, None),
                               ({"transformer_lab": {"version": 1}}, None),
                               # not a version, nor a commit: never pasted into a command
                               ({"transformer_lab": {"version": "0.2.0 "}}, None),
                               ({"transformer_lab": {"version": "1\n$(id)"}}, None),
                               ({"transformer_lab": {"version": "9.9.9",
                                                     "commit": "deadbee; curl x | sh #"}},
                                versions.CourseVersion("9.9.9", "unknown"))]:
        path.write_text(json.dumps({"cells": [], "metadata": metadata}))
        assert versions.notebook_version(path, 10**6) == expected, metadata
    path.write_text("not a notebook")
    assert versions.notebook_version(path, 10**6) is None
    path.write_text('{"cells": [' * 100_000)  # json's parser recurses: it must not end grading
    assert versions.notebook_version(path, 10**7) is None
    path.write_text(json.dumps({"cells": [], "metadata": {"transformer_lab": OLD.metadata()}}))
    assert versions.notebook_version(path, 10) is None  # too big: the grader reports it


def test_find_submissions_in_every_layout(tmp_path):
    nbs = ["00_tiny", "01_other"]
    empty = nbformat.v4.new_notebook()
    write(empty, tmp_path / "ann" / "notebooks" / "00_tiny.ipynb")
    write(empty, tmp_path / "ann" / "scratch.ipynb")
    (tmp_path / "ann" / "src" / "transformer_lab" / "core").mkdir(parents=True)
    for module in ("layers", "attention", "helpers"):
        (tmp_path / "ann" / "src" / "transformer_lab" / "core" / f"{module}.py").write_text("")
    (tmp_path / "ann" / "old" / "core").mkdir(parents=True)
    (tmp_path / "ann" / "old" / "core" / "layers.py").write_text("")
    write(empty, tmp_path / "bob_smith_00_tiny.ipynb")
    write(empty, tmp_path / "carl" / "01_other.ipynb")
    write(empty, tmp_path / "carl_00_tiny.ipynb")  # flat and folder layouts mixed
    write(empty, tmp_path / "ann" / ".ipynb_checkpoints" / "00_tiny-checkpoint.ipynb")
    write(empty, tmp_path / "__MACOSX" / "ann" / "._00_tiny.ipynb")
    # the README of a handout of more notebooks than this run grades: not "changed"
    (tmp_path / "ann" / "README.md").write_text("the handout's README, of every notebook")
    found = find_submissions(tmp_path, nbs, {"README.md": hashlib.sha1(
        b"the handout's README").hexdigest()})
    ann = found.students["ann"]
    assert ann.notebooks == {"00_tiny": tmp_path / "ann" / "notebooks" / "00_tiny.ipynb"}
    assert ann.core_dir == tmp_path / "ann" / "src" / "transformer_lab" / "core"
    assert sorted(ann.core_files) == ["attention", "layers"]
    assert found.students["bob_smith"].notebooks == {"00_tiny": tmp_path /
                                                     "bob_smith_00_tiny.ipynb"}
    assert found.students["bob_smith"].core_files is None
    assert sorted(found.students["carl"].notebooks) == ["00_tiny", "01_other"]
    skipped = {(s.student, s.path): s.reason for s in found.skipped}
    assert set(skipped) == {("ann", "ann/scratch.ipynb"),
                            ("ann", "ann/src/transformer_lab/core/helpers.py"),
                            ("ann", "ann/old/core/layers.py")}
    assert "another core folder was graded" in skipped["ann", "ann/old/core/layers.py"]


def test_no_file_takes_the_place_of_another_student_s(tmp_path):
    """Two folders whose names differ only by spaces stay two students, and a top-level file
    named after a student never replaces the notebook in that student's folder, however new."""
    nbs = ["00_tiny"]
    empty = nbformat.v4.new_notebook()
    for name in ("dan", "dan ", " eve", "eve "):
        write(empty, tmp_path / name / "00_tiny.ipynb")
    write(empty, tmp_path / "fay" / "00_tiny.ipynb")
    write(empty, tmp_path / "fay_00_tiny.ipynb")
    os.utime(tmp_path / "fay" / "00_tiny.ipynb", (1, 1))  # the top-level file is newer
    found = find_submissions(tmp_path, nbs)
    assert sorted(found.students) == [" eve", "dan", "dan ", "eve ", "fay"]
    for name in ("dan", "dan ", " eve", "eve "):
        assert found.students[name].notebooks == {"00_tiny": tmp_path / name / "00_tiny.ipynb"}
    assert found.students["fay"].notebooks == {"00_tiny": tmp_path / "fay" / "00_tiny.ipynb"}
    assert [(s.student, s.path) for s in found.skipped] == [("fay", "fay_00_tiny.ipynb")]


def test_whose_function_the_probe_package_holds():
    owner = probe_driver.owner
    assert owner("softmax_forward", "01_attention") == "student"
    assert owner("softmax_forward", "02_masking") == "student"  # taught by several
    assert owner("softmax_forward", "05_backward") == "instructor"
    assert owner("log_softmax_forward", "01_attention") == "stub"  # taught later
    assert owner("linear_forward", "03_minibatching") == "student"
    assert owner("causal_mask", "01_attention") == "stub"


def test_student_code_takes_the_functions_their_imports_and_helpers():
    source = '''from __future__ import annotations
import math
import numpy as np
from transformer_lab.core.layers import softmax_forward as linear_forward

SCALE = 2.0
UNUSED = 3


def _helper(x):
    return x * SCALE


def softmax_forward(x):
    y = np.exp(_helper(x))
    return y, y


def relu_forward(x):
    raise NotImplementedError("mine")
'''
    code = student_code(source, ["softmax_forward", "gelu_forward"],
                        {"softmax_forward", "relu_forward", "linear_forward", "gelu_forward"},
                        "core/layers.py")
    assert list(code.functions) == ["softmax_forward"]
    assert code.problems == {"gelu_forward": "gelu_forward() is not defined in core/layers.py"}
    assert code.extras == ["import math", "import numpy as np", "SCALE = 2.0",
                           "def _helper(x):\n    return x * SCALE"]
    # an import naming a provided function and others: the others stay
    mixed = student_code("from transformer_lab.core.layers import linear_forward, softmax_forward"
                         " as sm, relu_forward\n\n\ndef gelu_forward(x):\n    return sm(x)",
                         ["gelu_forward"], {"relu_forward", "gelu_forward"}, "core/layers.py")
    assert mixed.extras == ["from transformer_lab.core.layers import linear_forward, "
                            "softmax_forward as sm"]
    broken = student_code("def softmax_forward(x):\n    return (", ["softmax_forward"], set(),
                          "core/layers.py")
    assert "does not parse (SyntaxError at line 2" in broken.problems["softmax_forward"]


def test_restored_checks_never_go_above_the_first_cell():
    parsed = assignment.parse_notebook(notebook_01(), "01_attention.ipynb")
    nb = _renamed(solved_01())
    for cell in nb.cells:  # nothing to match but the nbgrader ids of the exercises
        cell.source += "\n# edited"
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade") is not True]
    restored = grade.restore_checks(nb, parsed)
    ids = [c.id for c in restored.cells]
    first_code = next(k for k, c in enumerate(restored.cells) if c.cell_type == "code")
    assert ids.index("check-softmax-forward") == first_code + 1
    assert ids.index("check-logsumexp") == ids.index("renamed-6") + 1  # after its exercise
    assert len(set(ids)) == len(ids)


def test_probe_cells_are_the_first_code_cell_and_the_exercises_without_magics():
    parsed = assignment.parse_notebook(notebook_01(), "01_attention.ipynb")
    cells, notes = grade.probe_cells(solved_01(edit=MAGICS), parsed)
    assert [c for c, _ in cells] == ["setup", "exercise-logsumexp", "exercise-cosine",
                                     "exercise-additive"]
    assert not notes
    setup = dict(cells)["setup"].split("\n")
    # the magics, and the import of check (no check cell runs in the probe), at their places
    assert setup == ["pass", "pass", "import numpy as np", "", "pass"]
    lse = dict(cells)["exercise-logsumexp"].split("\n")
    assert lse[1] == "    pass"  # the %time line, at its place
    assert dict(cells)["exercise-additive"].startswith("\ndef additive_attention")
    for _, source in cells:
        compile(source, "cell", "exec")


def test_the_probe_leaves_out_imports_nothing_uses():
    cells = [("a", "import torch\nimport numpy as np\nfrom math import (\n    sqrt,\n    pi)\n"
                   "import os; x = 1\ndef f(x):\n    import json\n    return np.sqrt(x) + pi"),
             ("b", "from m import *\nimport a.b.c\nimport matplotlib.pyplot as plt\n"
                   "if True:\n    import sys\nprint(a)"),
             ("c", "import helper as h\nimport broken(")]
    got = dict(grade.without_unused_imports(cells, {"h"}))
    assert got["a"].split("\n") == ["pass", "import numpy as np", "from math import (",
                                    "    sqrt,", "    pi)", "import os; x = 1",
                                    "def f(x):", "    import json",
                                    "    return np.sqrt(x) + pi"]
    assert got["b"].split("\n")[:3] == ["from m import *", "import a.b.c", "pass"]
    assert "    import sys" in got["b"]  # not at the top level: kept
    assert got["c"] == cells[2][1]  # unparseable: as it was


def test_flags_on_code():
    found = flags.scan_notebook_cells([
        ("cell 1", "import os\nfrom transformer_lab.checks import check\n!ls\n%%capture"),
        ("cell 2", "check = print\nx = open('/etc/x', 'w')\ny = open('local.txt', 'w')\n"
                   "ip = get_ipython()\nimport inspect\ns = inspect.getsource(check)\n"
                   "m[np.isneginf(m)] = 0\nos.system('ls')\nimport subprocess"),
        ("cell 3", "import tracemalloc\ntracemalloc.stop()"),
        ("cell 4", "from transformer_lab import checks\nimport transformer_lab.checks as c\n"
                   "y.flags.writeable = True\ny.setflags(write=True)\nc.framework._CACHED.clear()\n"
                   "y.flags['W'] = 1"),
        ("cell 5", "import transformer_lab as T\nT.checks.framework.core_function"),
    ])
    got = {(f.where, f.line): f.what for f in found}
    assert "shell command" in got["cell 1", 3] and "%%capture" in got["cell 1", 4]
    assert got["cell 2", 1] == "rebinds check, a name an import binds"
    assert got["cell 2", 2] == "writes a file outside the working folder"
    assert ("cell 2", 3) not in got and ("cell 2", 7) not in got
    assert "get_ipython" in got["cell 2", 4] and "getsource" in got["cell 2", 6]
    assert "os.system" in got["cell 2", 8] and "subprocess" in got["cell 2", 9]
    assert "the memory measurement some checks make" in got["cell 3", 1]
    assert all("internals" in got["cell 4", k] for k in (1, 2, 5))
    assert all("writable again" in got["cell 4", k] for k in (3, 4, 6))
    assert "uses .checks: the checks' or the grader's internals" in got["cell 5", 2]
    for module in parse_package(ROOT / "src" / "transformer_lab").core.values():
        clean = flags.scan_python(module.source, module.name)
        assert not clean, clean  # the reference core raises no flag


def test_flags_read_aliases_and_the_path_a_copy_writes():
    """The instructor trial's hostile core started processes and wrote files unflagged:
    through an alias, a from-import, os.posix_spawn, shutil.copy's destination, np.save."""
    source = ("import os as _os\nfrom os import posix_spawn\nfrom subprocess import run as r\n"
              "import shutil\nimport numpy as np\n"
              "def f():\n    _os.fork()\n    posix_spawn('/bin/sh', [], {})\n    r(['ls'])\n"
              "    shutil.copy('/etc/passwd', 'here.txt')\n    shutil.copy('a', '/tmp/b')\n"
              "    np.save('/tmp/c.npy', 1)\n    np.save('c.npy', 1)\n")
    got = {f.line: f.what for f in flags.scan_python(source, "core/layers.py", core=True)}
    assert "os.fork: starts other processes" in got[7]
    assert "os.posix_spawn: starts other processes" in got[8]
    assert "subprocess.run: starts other processes" in got[9]
    assert 10 not in got and 13 not in got  # written inside the working folder
    assert "changes files outside the working folder" in got[11] and \
        "changes files outside the working folder" in got[12]


# --- the course's own notebooks, end to end ------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_course_s_notebooks_solution_full_marks_handout_zero(notebook, tmp_path_factory):
    def produce(out: Path) -> None:
        parsed = assignment.parse_notebook(nbformat.read(notebook, as_version=4), notebook.name)
        student_folder(out / "subs" / "solution", nbformat.read(notebook, as_version=4),
                       core="reference", name=notebook.name)
        student_folder(out / "subs" / "untouched", student.student_notebook(parsed),
                       core="stubs", name=notebook.name)
        # points only (the feedback run is tested above; the notebook runs in D's tests)
        run_grader(out / "subs", ROOT / "notebooks", out / "grades", "--timeout", "600",
                   "--no-execute")
    grades = once_per_session(tmp_path_factory, f"course-{notebook.stem}", produce) / "grades"
    rows = [r for r in read_csv(grades / "grades.csv") if r["notebook"] == notebook.stem]
    solution = {r["check"]: (r["points"], r["max_points"]) for r in rows
                if r["student"] == "solution"}
    assert solution and all(p == m for p, m in solution.values()), summary(
        grades, "solution", notebook.stem)
    assert all(float(r["points"]) == 0 for r in rows if r["student"] == "untouched")
    # the course's own cells, handed in as they were, are not blamed (notebook 16's
    # `def tile_bytes(b, d=D_HEAD)` failed, run without the cell that sets D_HEAD)
    assert "as the grader ran it" not in summary(grades, "solution", notebook.stem)


def test_the_loops_of_a_core_function_are_read_from_the_student_s_core_file(tmp_path):
    """check-split-heads asks for no loop over heads: the grader reads split_heads's loops from
    the file the probe takes it from (it read notebook cells only, and the solution failed)."""
    from transformer_lab.course.submissions import StudentWork

    core = reference_core(tmp_path / "core", {"multihead": {"split_heads": (
        "def split_heads(x, num_heads):\n"
        "    d = x.shape[-1] // num_heads\n"
        "    return np.stack([x[..., i * d:(i + 1) * d] for i in range(num_heads)], axis=1)\n")}})
    work = StudentWork("alice", core_dir=core, core_files={"multihead": core / "multihead.py"})
    defs = grade.core_defs(work, {"split_heads", "merge_heads", "logsumexp"})
    assert set(defs) == {"split_heads", "merge_heads"}  # logsumexp: a notebook function
    line = (core / "multihead.py").read_text().splitlines().index(
        "    return np.stack([x[..., i * d:(i + 1) * d] for i in range(num_heads)], axis=1)") + 1
    assert grade.source_loops(defs, "split_heads") == f"a loop at line {line}"
    assert grade.source_loops(defs, "merge_heads") == "none"
    assert grade.core_defs(StudentWork("bob"), {"split_heads"}) == {}  # no core handed in


def test_stubbed_and_reference_core_helpers(tmp_path):
    """The tests' students: the handout's stubs and the reference, as files."""
    stubs = stubbed_core(tmp_path / "stubs")
    ref = reference_core(tmp_path / "ref")
    assert "is yours to write" in (stubs / "layers.py").read_text()
    assert (ref / "layers.py").read_text() == (ROOT / "src/transformer_lab/core/layers.py") \
        .read_text()


def _probe_logsumexp(tmp_path: Path, cell: str, cases=None, public=None, limits=None):
    """The probe's report of check-logsumexp on the ``logsumexp`` that ``cell`` defines, over
    ``cases`` (default: the first public one), in the handout's package made reference-free
    as the probe's (``tmp_path/probe``)."""
    from transformer_lab.course.package import parse_package, write_handout_package

    write_handout_package(ROOT / "src", tmp_path / "handout", parse_package(
        ROOT / "src" / "transformer_lab"))
    shutil.copytree(tmp_path / "handout", tmp_path / "probe")
    probe_driver.reference_free(tmp_path / "probe")
    if cases is None:
        cases = F.all_cases(F.get_check("check-logsumexp"), hidden=False)[:1]
    spec = probe_driver.CheckSpec("check-logsumexp", ("logsumexp",), {}, cases, public)
    return probe_driver.run_probe(tmp_path / "probe", [("setup", cell)], [spec], limits)


def test_the_probe_imports_the_probe_package_never_the_instructor_s(tmp_path):
    """The probe's student code sees the probe package first on sys.path, no other copy of
    transformer_lab (the instructor's editable install included), and no reference answers."""
    cell = ("import sys, transformer_lab\n"
            "from transformer_lab.checks.nb01_attention import SoftmaxForward\n"
            "seen = (transformer_lab.__file__, [p for p in sys.path if p and\n"
            "        __import__('os').path.isdir(__import__('os').path.join(p, "
            "'transformer_lab'))], hasattr(SoftmaxForward, 'expected') and\n"
            "        SoftmaxForward.expected is not SoftmaxForward.__mro__[1].expected)\n"
            "def logsumexp(x, axis=-1):\n    return [seen[0], seen[1], seen[2]]")
    report = _probe_logsumexp(tmp_path, cell)
    assert report.cells == [("setup", None)], report
    outcome = next(iter(report.outcomes.values()))
    package_file, folders, has_reference = outcome.value
    assert package_file == str(tmp_path / "probe" / "transformer_lab" / "__init__.py")
    assert folders == [str(tmp_path / "probe")] and has_reference is False


def test_code_run_on_a_public_case_cannot_read_the_hidden_cases(tmp_path):
    """The hidden cases run in a probe process of their own: a function that reads the probe's
    request returns, on a public case, only the public cases' names (on Gradescope a public
    failure's message shows before the due date; the hidden ones' after)."""
    cell = ("import os, sys\n"
            "def logsumexp(x, axis=-1):\n"
            "    with open(os.path.join(sys.argv[1], 'in', 'request.json')) as f:\n"
            "        return f.read()")
    cases = F.all_cases(F.get_check("check-logsumexp"))
    public = len(F.all_cases(F.get_check("check-logsumexp"), hidden=False))
    assert len(cases) > public
    report = _probe_logsumexp(tmp_path, cell, cases, public)
    names = [c.name for c in cases]
    for k, name in enumerate(names):
        request = report.outcomes["check-logsumexp", name].value
        seen = [n for n in names if json.dumps(n) in request]
        assert seen == (names[:public] if k < public else names[public:]), (name, seen)


def test_a_function_that_writes_the_probe_s_progress_lines_still_times_out(tmp_path):
    """The student's code can write into the probe's progress file: a line again, one of an
    earlier step, or garbage, does not restart the case's clock."""
    cell = ("import os, sys, time\n"
            "def logsumexp(x, axis=-1):\n"
            "    with open(os.path.join(sys.argv[1], 'out', 'progress'), 'a') as f:\n"
            "        for line in ['case 0 0', 'cell 0', 'setup done', 'done', 'junk'] * 1000:\n"
            "            f.write(line + '\\n'); f.flush(); time.sleep(0.1)")
    report = _probe_logsumexp(tmp_path, cell,
                              limits=probe_driver.ProbeLimits(cell=30, case=2, total=60))
    assert "ran past the time limit of 2 s" in report.missing["check-logsumexp"], report


def test_the_probe_package_has_the_solution_core_s_syllabus(tmp_path):
    """The probe's core is stubs, the instructor's functions and the student's: its syllabus is
    the one the handout carries, read from the solution core."""
    import subprocess
    import sys

    from transformer_lab.course.package import write_handout_package

    instructor = parse_package(ROOT / "src" / "transformer_lab")
    write_handout_package(ROOT / "src", tmp_path / "handout", instructor)
    core = reference_core(tmp_path / "core")
    probe_driver.build_probe_package(tmp_path / "handout", instructor, "04_multihead_attention",
                                     {p.stem: p for p in core.glob("*.py")}, tmp_path / "probe")
    probe_driver.reference_free(tmp_path / "probe")
    script = ("import json\nfrom transformer_lab import syllabus\n"
              "print(json.dumps([syllabus.__file__, syllabus.TAUGHT_IN, syllabus.CALLS]))")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(tmp_path / "probe")})
    assert run.returncode == 0, run.stderr
    where, taught_in, calls = json.loads(run.stdout)
    assert Path(where).is_relative_to(tmp_path / "probe")
    assert taught_in == json.loads(json.dumps(syllabus.TAUGHT_IN))
    assert calls == json.loads(json.dumps(syllabus.CALLS))


def test_a_core_module_that_hangs_on_import_costs_its_checks_only(tmp_path):
    """Code the student's module runs when imported is timed like a case."""
    from transformer_lab.course.package import parse_package, write_handout_package

    instructor = parse_package(ROOT / "src" / "transformer_lab")
    write_handout_package(ROOT / "src", tmp_path / "handout", instructor)
    core = reference_core(tmp_path / "core", {"layers": {"softmax_forward": (
        "def softmax_forward(x, _=WAIT):\n    y = np.exp(x - x.max(-1, keepdims=True))\n"
        "    return y / y.sum(-1, keepdims=True), None")}})
    source = (core / "layers.py").read_text()
    (core / "layers.py").write_text(source + "\n\ndef _forever():\n    while True:\n"
                                             "        pass\n\n\nWAIT = _forever()\n")
    probe_driver.build_probe_package(tmp_path / "handout", instructor, "01_attention",
                                     {p.stem: p for p in core.glob("*.py")}, tmp_path / "probe")
    probe_driver.reference_free(tmp_path / "probe")
    specs = [probe_driver.CheckSpec(i, (), {}, F.all_cases(F.get_check(i), hidden=False)[:1])
             for i in ("check-softmax-forward", "check-logsumexp")]
    cell = "import numpy as np\ndef logsumexp(x, axis=-1):\n    return 0"
    specs[1] = probe_driver.CheckSpec("check-logsumexp", ("logsumexp",), {}, specs[1].cases)
    report = probe_driver.run_probe(tmp_path / "probe", [("setup", cell)], specs,
                                    probe_driver.ProbeLimits(cell=30, case=3, total=120))
    assert "ran past the time limit of 3 s, while importing the functions " \
           "check-softmax-forward tests" in report.missing["check-softmax-forward"]
    assert ("check-logsumexp", specs[1].cases[0].name) in report.outcomes  # run after a restart


def test_a_cell_that_hangs_costs_the_checks_of_what_it_defines_only(tmp_path):
    """An exercise cell that never ends once zeroed the whole notebook, core checks included
    (an instructor's trial): the probe runs again without it, and only the checks of the
    names it defines lose their evidence."""
    from transformer_lab.course.package import parse_package, write_handout_package

    instructor = parse_package(ROOT / "src" / "transformer_lab")
    write_handout_package(ROOT / "src", tmp_path / "handout", instructor)
    core = reference_core(tmp_path / "core", {})
    probe_driver.build_probe_package(tmp_path / "handout", instructor, "01_attention",
                                     {p.stem: p for p in core.glob("*.py")}, tmp_path / "probe")
    probe_driver.reference_free(tmp_path / "probe")
    specs = [probe_driver.CheckSpec("check-softmax-forward", (), {}, F.all_cases(
        F.get_check("check-softmax-forward"), hidden=False)[:1]),
             probe_driver.CheckSpec("check-logsumexp", ("logsumexp",), {}, F.all_cases(
                 F.get_check("check-logsumexp"), hidden=False)[:1])]
    cells = [("setup", "import numpy as np"),
             ("exercise-logsumexp", "def logsumexp(x, axis=-1):\n    return 0\nwhile True:\n"
                                    "    pass"),
             ("later", "after = 1")]
    report = probe_driver.run_probe(tmp_path / "probe", cells, specs,
                                    probe_driver.ProbeLimits(cell=3, case=10, total=120))
    assert "ran past the time limit of 3 s, while running your cell 'exercise-logsumexp'" \
        in report.missing["check-logsumexp"]
    assert "check-softmax-forward" not in report.missing
    outcome = report.outcomes[("check-softmax-forward", specs[0].cases[0].name)]
    assert outcome.error is None


def test_a_csv_cell_that_starts_as_a_formula_is_written_as_text(tmp_path):
    path = tmp_path / "grades.csv"
    reports._write_rows(path, ["student", "points", "note"],
                        [["=HYPERLINK(\"http://x\")", 3.5, "@SUM(A1)"], ["bob", -1, "ok"]])
    assert path.read_text().splitlines() == [
        "student,points,note", "\"'=HYPERLINK(\"\"http://x\"\")\",3.5,'@SUM(A1)", "bob,-1,ok"]


def test_an_assignment_s_notebooks_chosen_by_number_or_name(tmp_path):
    for name in ("01_attention", "02_masking", "06_layers_backward"):
        (tmp_path / f"{name}.ipynb").write_text("{}")
    chosen = assignment.solution_notebooks(tmp_path, ["01", "06_layers_backward"])
    assert [p.stem for p in chosen] == ["01_attention", "06_layers_backward"]
    with pytest.raises(SystemExit, match=r"--notebooks names '07', not a notebook of --source"):
        assignment.solution_notebooks(tmp_path, ["01", "07"])


def test_the_notebooks_a_run_does_not_grade_are_listed_as_skipped(tmp_path):
    from transformer_lab.course.submissions import Found, StudentWork

    work = StudentWork("alice", {nb: tmp_path / "alice" / "notebooks" / f"{nb}.ipynb"
                                 for nb in ("01_attention", "02_masking")})
    found = Found({"alice": work}, [])
    grade._leave_out(found, {"01_attention"}, tmp_path)
    assert list(work.notebooks) == ["01_attention"]
    assert [(s.student, s.path, s.reason) for s in found.skipped] == [
        ("alice", "alice/notebooks/02_masking.ipynb",
         "not graded: this run grades 01_attention only (--notebooks)")]


def test_flags_leave_out_the_cells_the_course_wrote_handed_in_unchanged():
    """A fresh-eyes instructor found 340 of 393 flags in the handout's own code (the package
    guard's importlib, notebook 09's inspect.getsource): only the student's code is flagged."""
    import copy

    path = ROOT / "notebooks" / "09_verification.ipynb"
    course = assignment.parse_notebook(nbformat.read(path, as_version=4), path.stem)
    submission = copy.deepcopy(course.nb)
    every_cell = flags.scan_notebook_cells([(c.id, c.source) for c in submission.cells
                                            if c.cell_type == "code"])
    assert every_cell  # the course's own code has lines a scan flags
    assert grade._flags_of_own_code(submission, course) == []
    cell = next(c for c in submission.cells if c.cell_type == "code" and c.id != "package-guard")
    cell.source += "\nimport os\nos._exit(0)"
    found = grade._flags_of_own_code(submission, course)
    assert found and {f.where for f in found} == {
        f"cell {submission.cells.index(cell) + 1} ({cell.id})"}


def test_the_functions_a_notebook_s_check_tests_are_the_student_s_when_graded():
    """Every core function a check of notebook N tests is the student's in N's probe package,
    where N teaches it, or the reference of an earlier notebook: never a later notebook's stub.
    The GPT's attention is notebook 16's too (its tiled branch): graded there, it is the
    student's, so check-gpt-tiled-attention sees their block_size."""
    assert probe_driver.owner("causal_self_attention_forward", "16_long_context") == "student"
    F.load_checks()
    for chk in F.REGISTRY.values():
        for name in chk.functions:
            assert probe_driver.owner(name, chk.notebook) != "stub", (chk.id, name)


def test_flags_csv_lists_core_code_of_the_notebooks_graded_here_only():
    """A core function that only notebook 03 runs is not flagged in a run grading 00 and 01
    (an instructor's trial found 03's rows in such a run); code no grading runs still is."""
    flag = reports.Flag("src/transformer_lab/core/layers.py", 3, "ends the process", "os._exit(0)")
    graded = [reports.Graded("ann", nb, [], "graded") for nb in ("00_gradients", "01_attention")]
    rows = reports.flag_rows(graded, {"ann": [("01_attention", flag), ("03_minibatching", flag),
                                              ("", flag)]})
    assert [r[:2] for r in rows] == [["ann", ""], ["ann", "01_attention"]]


def test_the_console_counts_the_other_assignments_notebooks_and_lists_at_most_30_files(
        tmp_path, capsys, monkeypatch):
    from transformer_lab.course.submissions import Found, Skipped

    monkeypatch.setattr(reports, "format_table", lambda graded: "(the table)")

    skipped = [Skipped(f"s{k}", f"s{k}/notebooks/02_masking.ipynb",
                       "not graded: this run grades 01_attention only (--notebooks)")
               for k in range(50)]
    skipped += [Skipped(f"s{k:02d}", f"s{k:02d}/notes.txt", "not graded: ...") for k in range(40)]
    reports.print_summary(reports.Outcome([], Found({}, skipped), [], "bubblewrap", []),
                          tmp_path)
    out = capsys.readouterr().out
    assert "skipped 90 file(s) (skipped.csv):\n  50 notebook(s) of other assignments, not " \
        "graded (--notebooks)\n  s00: s00/notes.txt" in out
    assert "s29/notes.txt" in out and "s30/notes.txt" not in out and "... and 10 more" in out


def test_a_folder_without_a_notebook_to_grade_says_so(tmp_path, capsys):
    (tmp_path / "subs" / "zed").mkdir(parents=True)
    (tmp_path / "subs" / "zed" / "notes.txt").write_text("my notes")
    write(solved_01(), tmp_path / "subs" / "amy" / "notebooks" / "01_attention.ipynb")
    argv = [str(tmp_path / "subs"), "--source", str(ROOT / "notebooks"), "--project", str(ROOT),
            "--out", str(tmp_path / "grades"), "--no-execute", "--notebooks", "02"]
    assert grade.main(argv) == 0  # amy's notebook is not one of this run's: nothing to grade
    assert "no notebook was graded: none handed in is named after one graded here" in \
        capsys.readouterr().out
    assert (tmp_path / "grades" / "skipped.csv").read_text().count("\n") == 3  # header + 2


def test_a_culprit_that_failed_a_hidden_case_only_is_named_where_hidden_verdicts_show():
    """Where hidden verdicts show later (Gradescope), a public failure's message names only the
    checks that failed a public case: naming one that failed a hidden case alone tells the
    student a hidden verdict early."""
    def results():
        return [reports.CheckResult("check-softmax-forward", 0, 2, "wrong", 9, 8, 8),
                reports.CheckResult("check-attention-forward", 0, 2, "raised", 0, 6, 0)]
    shown, hidden = results(), results()
    grade.name_culprits(shown)
    grade.name_culprits(hidden, public_only=True)
    assert "`softmax_forward` fails `check-softmax-forward` too" in shown[1].message
    assert hidden[1].message == "raised"


def test_a_culprit_check_of_several_functions_is_named_as_a_check():
    """A failed check of four functions is named as the check that failed, not as four
    functions that each fail (an instructor's trial: a wrong mask in one of them blamed the
    three right ones too)."""
    results = [reports.CheckResult("check-causal-self-attention", 0, 2, "wrong", 0, 5, 0),
               reports.CheckResult("check-gpt-block", 0, 2, "wrong", 0, 5, 0)]
    grade.name_culprits(results)
    assert results[1].message.startswith(
        "`check-causal-self-attention` fails too, the check of `self_attention_forward`, "
        "`self_attention_backward`, `causal_self_attention_forward` and "
        "`causal_self_attention_backward`, which this one runs: fix what it names first")
