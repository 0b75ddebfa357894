"""The classroom tools: student versions (`make student`) and grading (`make grade`).

What keeps them honest, for every notebook in notebooks/:
- grading the solution notebooks gives full marks, no cell failing; the untouched student
  versions get zero;
- a student version holds no line of any solution region or hidden test;
- a student version runs without errors up to its stubs;
and, on a tiny course made here: misplaced markers fail the build with notebook, cell and line;
edited, deleted or hidden checks are graded with the instructor's version; a crash or an endless
loop in one submission does not stop the others, nor leaves processes behind; a cell printing
for ever keeps a bounded output; notebooks saved without cell ids are graded right; the same
submission gives the same feedback byte for byte; output folders that are not the tools' own,
or that overlap what they read, are never emptied.

The slow parts (executing notebooks) run once per test session, also under pytest-xdist: the
first worker that needs them writes them to the session's temporary folder, the others wait and
read them.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import shutil
import time
import tracemalloc
from pathlib import Path

import nbformat
import pytest

from transformer_lab.course import assignment, grade, student

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
STUB = re.compile(r'^\s*raise NotImplementedError\((["\'])Exercise: .+\1\)$')
TINY_TIMEOUT = 2  # seconds per cell for the tiny course: its cells take microseconds


# --- running the slow parts once per session ----------------------------------------------------

@contextlib.contextmanager
def _exclusive(lock: Path, wait: float = 900):
    """Hold ``lock`` (a file created exclusively) for the duration; portable across systems."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            break
        except FileExistsError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{lock} held for more than {wait} s") from None
            time.sleep(0.2)
    try:
        yield
    finally:
        os.close(fd)
        lock.unlink()


def once_per_session(tmp_path_factory, name: str, produce) -> Path:
    """Run ``produce(folder)`` once per test session, shared by all xdist workers."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, shared by the workers
    out, done = root / name, root / f"{name}.done"
    with _exclusive(root / f"{name}.lock"):
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)
            produce(out)
            done.touch()
    return out


def read_grades(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def feedback(grades_dir: Path, who: str, notebook: str):
    return nbformat.read(grades_dir / "feedback" / who / f"{notebook}.ipynb", as_version=4)


def error_outputs(nb) -> list[tuple[str, object]]:
    return [(c.get("id"), o) for c in nb.cells if c.cell_type == "code"
            for o in c.get("outputs", []) if o.output_type == "error"]


# --- a tiny course, built here ------------------------------------------------------------------

def _meta(kind: str, cell_id: str, points: float = 0) -> dict:
    if kind == "exercise":
        return {"nbgrader": {"grade": False, "grade_id": cell_id, "locked": False,
                             "schema_version": 3, "solution": True}}
    return {"nbgrader": {"grade": True, "grade_id": cell_id, "locked": True, "points": points,
                         "schema_version": 3, "solution": False}}


def tiny_notebook(double_body="    return 2 * x", square_body="    return x * x",
                  drop=(), edit=None):
    """A course notebook with two exercises and their checks (2 and 3 points), no imports."""
    v4 = nbformat.v4
    cells = [
        v4.new_markdown_cell("# 00 · Tiny\n\nA tiny course.", id="intro"),
        v4.new_code_cell("import math\nprint('setup ok')", id="setup"),
        v4.new_code_cell('def double(x):\n    """Twice x."""\n    ### BEGIN SOLUTION\n'
                         + double_body + "\n    ### END SOLUTION",
                         id="exercise-double", metadata=_meta("exercise", "exercise-double")),
        v4.new_code_cell("assert double(2) == 4\n### BEGIN HIDDEN TESTS\n"
                         "assert double(-1.5) == -3.0, 'negative numbers'\n"
                         "### END HIDDEN TESTS\nprint('double ok')",
                         id="check-double", metadata=_meta("check", "check-double", 2)),
        v4.new_code_cell("def square(x):\n    ### BEGIN SOLUTION: multiply \"x\" by itself\n"
                         + square_body + "\n    ### END SOLUTION",
                         id="exercise-square", metadata=_meta("exercise", "exercise-square")),
        v4.new_code_cell("assert square(3) == 9, 'square(3) should be 9'\nprint('square ok')",
                         id="check-square", metadata=_meta("check", "check-square", 3)),
        v4.new_code_cell("print('the end')", id="end"),
    ]
    cells = [c for c in cells if c.id not in drop]
    for c in cells:
        c.source = (edit or {}).get(c.id, c.source)
    nb = v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


def write(nb, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def without_ids(nb) -> str:
    """``nb`` as older tools save it: nbformat 4.4, cells without ids (their metadata kept)."""
    saved = json.loads(nbformat.writes(nb))
    saved["nbformat_minor"] = 4
    for cell in saved["cells"]:
        del cell["id"]
    return json.dumps(saved, indent=1)


#: Submissions of the tiny course: (path under the submissions folder, notebook or text).
#: The broken ones come first (students are graded in name order) to show they stop no one.
TINY_SUBMISSIONS = {
    "a_crash/00_tiny.ipynb": tiny_notebook(square_body=(  # leaves a process behind, and dies
        "    return x * x\nimport os, subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        "open(os.environ['TINY_CHILD_PID_FILE'], 'w').write(str(child.pid))\nos._exit(1)")),
    "b_loop/00_tiny.ipynb": tiny_notebook(  # prints for ever: its output must stay bounded
        double_body="    while True:\n        print('still going', x)"),
    "c_deaf/00_tiny.ipynb": tiny_notebook(double_body=(
        "    import signal\n    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "    while True:\n        pass")),
    "d_tampered/00_tiny.ipynb": tiny_notebook(square_body="    return x * x + 1",
                                              drop=("check-double",),
                                              edit={"check-square": "print('square ok')"}),
    "e_hidden/00_tiny.ipynb": tiny_notebook(double_body="    return 2 * x if x > 0 else 0"),
    "f_unreadable/00_tiny.ipynb": "this is not a notebook",
    "g_flat_00_tiny.ipynb": tiny_notebook(),
    "h_nothing/notes.ipynb": tiny_notebook(),
    "i_old_format/00_tiny.ipynb": without_ids(tiny_notebook(drop=("check-square",))),
}
TINY_EXPECTED = {  # student: (check-double, check-square, status)
    "a_crash": (2, 0, "kernel died"),
    "b_loop": (0, 3, "graded"),
    "c_deaf": (0, 0, "kernel stopped"),
    "d_tampered": (2, 0, "graded"),
    "e_hidden": (0, 3, "graded"),
    "f_unreadable": (0, 0, "unreadable"),
    "g_flat": (2, 3, "graded"),
    "h_nothing": (0, 0, "not submitted"),
    "i_old_format": (2, 3, "graded"),
}


@pytest.fixture(scope="module")
def tiny_graded(tmp_path_factory):
    """The tiny course's submissions graded once, with a per-cell limit of TINY_TIMEOUT s."""
    def produce(out: Path) -> None:
        write(tiny_notebook(), out / "source" / "00_tiny.ipynb")
        for name, content in TINY_SUBMISSIONS.items():
            if isinstance(content, str):
                (out / "subs" / name).parent.mkdir(parents=True, exist_ok=True)
                (out / "subs" / name).write_text(content)
            else:
                write(content, out / "subs" / name)
        console = io.StringIO()
        os.environ["TINY_CHILD_PID_FILE"] = str(out / "child.pid")  # kernels inherit it
        try:
            with contextlib.redirect_stdout(console):
                status = grade.main([str(out / "subs"), "--source", str(out / "source"),
                                     "--out", str(out / "grades"),
                                     "--timeout", str(TINY_TIMEOUT)])
        finally:
            del os.environ["TINY_CHILD_PID_FILE"]
        (out / "console.txt").write_text(console.getvalue())
        assert status == 0

    return once_per_session(tmp_path_factory, "tiny-graded", produce) / "grades"


# --- the course's own notebooks, graded once ----------------------------------------------------

def tampered_00(solution):
    """00 solved, but mse_loss wrong for 1-D input (only a hidden test tries that), one check
    deleted and the other replaced by a print: grading must put both back."""
    nb = nbformat.read(solution, as_version=4)
    cells = {c.id: c for c in nb.cells}
    assert "    diff = P - Y" in cells["exercise-mse"].source, "00's mse_loss solution changed"
    cells["exercise-mse"].source = cells["exercise-mse"].source.replace(
        "    diff = P - Y", "    if P.ndim == 1:\n        return 0.0, np.zeros_like(P)\n"
                            "    diff = P - Y")
    cells["check-mse"].source = 'print("Exercise 2 passed.")'
    nb.cells = [c for c in nb.cells if c.id != "check-linear-backward"]
    return nb


def course_grades(notebook: Path, tmp_path_factory) -> Path:
    """Grades of one course notebook, computed once per session: its solution, its untouched
    student version and, for 00, a tampered copy. Each notebook is a separate unit, so that
    xdist workers grade different notebooks at the same time."""
    def produce(out: Path) -> None:
        parsed = assignment.parse_notebook(nbformat.read(notebook, as_version=4), notebook.name)
        (out / "subs" / "solution").mkdir(parents=True)
        shutil.copy(notebook, out / "subs" / "solution" / notebook.name)
        write(student.student_notebook(parsed), out / "subs" / "untouched" / notebook.name)
        if notebook.name == "00_gradients.ipynb":
            write(tampered_00(notebook), out / "subs" / "tampered" / notebook.name)
        # A generous time limit: these are the real notebooks, on a shared machine.
        assert grade.main([str(out / "subs"), "--source", str(ROOT / "notebooks"),
                           "--out", str(out / "grades"), "--timeout", "600"]) == 0

    return once_per_session(tmp_path_factory, f"graded-{notebook.stem}", produce) / "grades"


@pytest.fixture(scope="module")
def student_tree(tmp_path_factory):
    """`make student` into a temporary folder (cheap: nothing is executed)."""
    out = tmp_path_factory.mktemp("student") / "student"
    assert student.main(["--source", str(ROOT / "notebooks"), "--out", str(out),
                         "--project", str(ROOT)]) == 0
    return out


def solution_and_student(notebook: Path):
    """The parsed solution notebook and its student version (one notebook: a broken one
    fails its own tests only)."""
    parsed = assignment.parse_notebook(nbformat.read(notebook, as_version=4), notebook.name)
    return parsed, student.student_notebook(parsed)


def removed_lines(parsed) -> dict[str, set[int]]:
    """Per cell id, the line numbers (0-based) of its solution and hidden-test regions, markers
    included -- found the way nbgrader finds them, independently of the tools' parser."""
    removed = {}
    for cell in parsed.nb.cells:
        inside, lines = False, set()
        for i, line in enumerate(cell.source.split("\n")):
            if "BEGIN SOLUTION" in line or "BEGIN HIDDEN TESTS" in line:
                inside = True
            if inside:
                lines.add(i)
            if "END SOLUTION" in line or "END HIDDEN TESTS" in line:
                inside = False
        removed[cell.id] = lines
    return removed


# --- student versions ---------------------------------------------------------------------------

@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_student_version_holds_no_solution_line_or_hidden_test(notebook):
    parsed, stud = solution_and_student(notebook)
    removed = removed_lines(parsed)
    secret, public = set(), set()  # lines inside regions; lines the solution shows outside them
    for cell in parsed.nb.cells:
        inside = removed.get(cell.id, set())
        for i, line in enumerate(cell.source.split("\n")):
            (secret if i in inside else public).add(line.strip())
    secret -= public | {""}
    shown = {line.strip() for cell in stud.cells for line in cell.source.split("\n")}
    assert not secret & shown, f"{notebook.name} student version leaks {secret & shown}"
    assert not any(assignment.has_marker_words(line) for line in shown)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_student_version_keeps_everything_else(notebook):
    parsed, stud = solution_and_student(notebook)
    assert [c.id for c in stud.cells] == [c.id for c in parsed.nb.cells]
    exercises = {e.cell_id: e for e in parsed.exercises}
    checks = {c.cell_id: c for c in parsed.checks}
    removed = removed_lines(parsed)
    for sol_cell, stud_cell in zip(parsed.nb.cells, stud.cells, strict=True):
        if stud_cell.cell_type == "code":
            assert stud_cell.outputs == [] and stud_cell.execution_count is None
        sol_lines, stud_lines = sol_cell.source.split("\n"), stud_cell.source.split("\n")
        kept = [line for i, line in enumerate(sol_lines)
                if i not in removed.get(sol_cell.id, set())]
        if sol_cell.id in exercises:
            regions = exercises[sol_cell.id].regions
            stubs = [line for line in stud_lines if STUB.match(line)]
            assert len(stubs) == len(regions), f"{sol_cell.id}: one stub per solution region"
            for region, stub in zip(regions, stubs, strict=True):
                assert stub.startswith(region.indent + "raise")  # indented like the region
            assert [line for line in stud_lines if not STUB.match(line)] == kept
            assert stud_cell.metadata["deletable"] is False
        elif sol_cell.id in checks:
            assert stud_lines == kept
            assert stud_cell.metadata["editable"] is False
            assert stud_cell.metadata["deletable"] is False
        else:
            assert stud_cell.source == sol_cell.source
        assert stud_cell.metadata.get("nbgrader") == sol_cell.metadata.get("nbgrader")


def test_student_tree_holds_the_package_and_files_but_not_the_instructors_tests(student_tree):
    for path in ["README.md", "requirements.txt", "pyproject.toml",
                 "src/transformer_lab/__init__.py", "src/transformer_lab/gradient_check.py"]:
        assert (student_tree / path).is_file(), f"{path} missing from the student tree"
    assert sorted(p.name for p in (student_tree / "img").iterdir()) == \
        sorted(p.name for p in (ROOT / "img").iterdir())
    assert sorted(p.name for p in (student_tree / "notebooks").iterdir()) == \
        [p.name for p in NOTEBOOKS]
    for nb in NOTEBOOKS:  # `make student` writes what student_notebook() makes
        assert nbformat.read(student_tree / "notebooks" / nb.name, as_version=4) == \
            solution_and_student(nb)[1]
    for absent in ["tests", "conftest.py", "Makefile", ".ci"]:
        assert not (student_tree / absent).exists(), f"{absent} must not go to students"
    assert not list(student_tree.rglob("__pycache__"))
    readme = (student_tree / "README.md").read_text()
    assert "NotImplementedError" in readme and "requirements.txt" in readme
    for nb in NOTEBOOKS:
        assert f"notebooks/{nb.name}" in readme


@pytest.mark.skipif(not (ROOT / "notebooks" / "00_gradients.ipynb").exists(), reason="no 00")
def test_student_version_of_00_has_the_stubs_with_hints():
    cells = {c.id: c for c in solution_and_student(ROOT / "notebooks" / "00_gradients.ipynb")[1]
             .cells}
    source = cells["exercise-linear-backward"].source
    assert source.startswith("def linear_backward(dY, X, W):\n    \"\"\"Gradients of Y = X @ W")
    assert '    raise NotImplementedError("Exercise: flatten the leading axes' in source
    assert source.endswith("\n    return dX, dW, db")
    assert "dY @ W.T" not in source
    assert "### BEGIN HIDDEN" not in cells["check-mse"].source
    assert "4 / 3" not in cells["check-mse"].source  # the hidden test's worked example
    assert cells["check-mse"].metadata["nbgrader"]["points"] == 2


def test_stub_hint_defaults_to_the_function_and_is_valid_python(tmp_path):
    nb = tiny_notebook()
    nb.cells.insert(2, nbformat.v4.new_code_cell(
        "### BEGIN SOLUTION\nanswer = 42\n### END SOLUTION", id="exercise-top",
        metadata=_meta("exercise", "exercise-top")))
    write(nb, tmp_path / "src" / "00_tiny.ipynb")
    out = tmp_path / "out"
    assert student.main(["--source", str(tmp_path / "src"), "--out", str(out),
                         "--project", str(ROOT)]) == 0
    cells = {c.id: c for c in nbformat.read(out / "notebooks" / "00_tiny.ipynb",
                                            as_version=4).cells}
    assert cells["exercise-top"].source == 'raise NotImplementedError("Exercise: write this code")'
    assert cells["exercise-double"].source.split("\n")[-1] == \
        '    raise NotImplementedError("Exercise: complete double()")'
    assert cells["exercise-square"].source.split("\n")[-1] == \
        "    raise NotImplementedError('Exercise: multiply \"x\" by itself')"
    for cell in cells.values():
        if cell.cell_type == "code":
            compile(cell.source, cell.id, "exec")


# --- misplaced markers and metadata fail the build ----------------------------------------------

def _edit_source(cell_id: str, source: str):
    def change(nb):
        next(c for c in nb.cells if c.id == cell_id).source = source
    return change


def _drop_metadata(cell_id: str, key: str):
    def change(nb):
        next(c for c in nb.cells if c.id == cell_id).metadata["nbgrader"].pop(key)
    return change


def _set_metadata(cell_id: str, key: str, value):
    def change(nb):
        next(c for c in nb.cells if c.id == cell_id).metadata["nbgrader"][key] = value
    return change


def _add_cell(cell):
    def change(nb):
        nb.cells.insert(2, cell)
    return change


BAD_NOTEBOOKS = {  # name: (change, cell number, cell id, line or None, words in the message)
    "END before BEGIN": (_edit_source("exercise-double", "def double(x):\n    ### END SOLUTION\n"
                                      "    ### BEGIN SOLUTION\n    return 2 * x"),
                         3, "exercise-double", 2, "without a ### BEGIN SOLUTION"),
    "nested BEGIN": (_edit_source("exercise-double", "def double(x):\n    ### BEGIN SOLUTION\n"
                                  "    ### BEGIN SOLUTION\n    return 2 * x\n"
                                  "    ### END SOLUTION"),
                     3, "exercise-double", 3, "cannot be nested"),
    "missing END": (_edit_source("exercise-double", "def double(x):\n    ### BEGIN SOLUTION\n"
                                 "    return 2 * x"),
                    3, "exercise-double", 2, "has no ### END SOLUTION"),
    "END indented elsewhere": (_edit_source("exercise-double",
                                            "def double(x):\n    ### BEGIN SOLUTION\n"
                                            "    return 2 * x\n### END SOLUTION"),
                               3, "exercise-double", 4, "indented differently"),
    "malformed marker": (_edit_source("exercise-double", "def double(x):\n    ### BEGIN SOLUTION"
                                      "\n    return 2 * x\n    ### END SOLUTION here"),
                         3, "exercise-double", 4, "malformed marker"),
    "lower-case marker": (_edit_source("exercise-double", "def double(x):\n    # begin solution"
                                       "\n    return 2 * x\n    ### END SOLUTION"),
                          3, "exercise-double", 2, "malformed marker"),
    "marker in markdown": (_edit_source("intro", "# 00\n\nWrite between `### BEGIN SOLUTION`"),
                           1, "intro", 3, "markdown cell"),
    "region outside an exercise cell": (_edit_source("setup", "x = 1\n### BEGIN SOLUTION\n"
                                                     "y = 2\n### END SOLUTION"),
                                        2, "setup", 2, "not an exercise cell"),
    "hidden tests outside a check cell": (_edit_source("setup", "### BEGIN HIDDEN TESTS\n"
                                                       "assert True\n### END HIDDEN TESTS"),
                                          2, "setup", 1, "not a check cell"),
    "hidden tests unbalanced": (_edit_source("check-double", "assert double(2) == 4\n"
                                             "### END HIDDEN TESTS"),
                                4, "check-double", 2, "without a ### BEGIN HIDDEN TESTS"),
    "exercise cell without a region": (_edit_source("exercise-double", "def double(x):\n"
                                                    "    return 2 * x"),
                                       3, "exercise-double", None, "needs a ### BEGIN SOLUTION"),
    "check without points": (_drop_metadata("check-double", "points"),
                             4, "check-double", None, "needs metadata.nbgrader.points"),
    "grade_id is not the cell id": (_set_metadata("check-double", "grade_id", "other"),
                                    4, "check-double", None, "must equal the cell id"),
    "old metadata schema": (_set_metadata("check-double", "schema_version", 2),
                            4, "check-double", None, "schema_version must be 3"),
    "markdown exercise cell": (_add_cell(nbformat.v4.new_markdown_cell(
        "Explain.", id="answer", metadata=_meta("exercise", "answer"))),
        3, "answer", None, "must be code cells"),
}


@pytest.mark.parametrize("case", BAD_NOTEBOOKS, ids=str)
def test_misplaced_markers_fail_the_build_with_notebook_cell_and_line(case, tmp_path, capsys):
    change, number, cell_id, line, words = BAD_NOTEBOOKS[case]
    nb = tiny_notebook()
    change(nb)
    write(nb, tmp_path / "src" / "00_tiny.ipynb")
    out = tmp_path / "out"
    status = student.main(["--source", str(tmp_path / "src"), "--out", str(out),
                           "--project", str(ROOT)])
    err = capsys.readouterr().err
    assert status == 1
    where = f"00_tiny.ipynb, cell {number} (id '{cell_id}')"
    where += f", line {line}:" if line else ":"
    assert where in err and words in err, err
    assert not out.exists(), "nothing may be written when a marker is wrong"
    # grading refuses the same solution notebook
    write(tiny_notebook(), tmp_path / "subs" / "ann" / "00_tiny.ipynb")
    assert grade.main([str(tmp_path / "subs"), "--source", str(tmp_path / "src"),
                       "--out", str(tmp_path / "grades")]) == 1
    assert where in capsys.readouterr().err


def test_every_problem_is_reported_at_once():
    nb = tiny_notebook(edit={"intro": "# BEGIN SOLUTION",
                             "exercise-square": "def square(x):\n    ### END SOLUTION"})
    with pytest.raises(assignment.AssignmentError) as err:
        assignment.parse_notebook(nb, "00_tiny.ipynb")
    assert len(err.value.problems) == 3  # markdown marker, stray END, no region left


# --- the grader on the tiny course --------------------------------------------------------------

def console_statuses(grades_dir: Path) -> dict[str, str]:
    """student -> status, from the table `make grade` prints at the end."""
    console = (grades_dir.parent / "console.txt").read_text()
    rows = re.findall(r"^(\S+)\s+00_tiny\s+\S+/\S+\s{2}(.+)$", console, re.MULTILINE)
    return dict(rows)


def test_tiny_course_grades(tiny_graded):
    rows = read_grades(tiny_graded / "grades.csv")
    assert list(rows[0]) == ["student", "notebook", "check", "points", "max_points"]
    got = {(r["student"], r["check"]): (float(r["points"]), float(r["max_points"]))
           for r in rows}
    assert len(rows) == 2 * len(TINY_EXPECTED)
    for who, (double, square, _) in TINY_EXPECTED.items():
        assert got[who, "check-double"] == (double, 2), who
        assert got[who, "check-square"] == (square, 3), who
    assert {r["notebook"] for r in rows} == {"00_tiny"}
    assert console_statuses(tiny_graded) == {who: status for who, (_, _, status)
                                             in TINY_EXPECTED.items()}


def test_crash_and_endless_loops_stop_only_their_own_submission(tiny_graded):
    crash = feedback(tiny_graded, "a_crash", "00_tiny")
    assert "kernel died while running cell 5 (id 'exercise-square')" in crash.cells[0].source
    loop = feedback(tiny_graded, "b_loop", "00_tiny")
    assert "time limit of 2 s per cell (interrupted)" in loop.cells[0].source
    deaf = feedback(tiny_graded, "c_deaf", "00_tiny")
    assert "ignored the interrupt: the kernel was stopped" in deaf.cells[0].source
    # the submissions graded after them ran normally
    assert "**g_flat: 5 / 5 points.**" in feedback(tiny_graded, "g_flat", "00_tiny").cells[0].source


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_processes_left_by_a_crashed_kernel_are_stopped(tiny_graded):
    child = int((tiny_graded.parent / "child.pid").read_text())
    deadline = time.monotonic() + 5  # a killed process takes a moment to go
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _running(os.getpid()) and not _running(child)


def test_a_cell_that_prints_for_ever_keeps_a_bounded_output(tiny_graded):
    path = tiny_graded / "feedback" / "b_loop" / "00_tiny.ipynb"
    limits = grade.OutputLimits()
    # a few MB were printed; the file stores the text kept line by line, as JSON strings
    assert path.stat().st_size < 3 * limits.printed_per_cell
    cell = next(c for c in nbformat.read(path, as_version=4).cells if c.id == "check-double")
    streams = [o for o in cell.outputs if o.output_type == "stream"]
    printed = "".join(o.text for o in streams[:-1])
    assert printed.startswith("still going 2\nstill going 2\n")
    assert 0.9 * limits.printed_per_cell < len(printed.encode()) <= limits.printed_per_cell
    assert re.fullmatch(r"\[output truncated: \d+\.\d (KB|MB) of this cell's output not kept; "
                        r"grading keeps 100\.0 KB of printed text .*\]\n", streams[-1].text)
    assert [o.ename for o in cell.outputs if o.output_type == "error"] == ["KeyboardInterrupt"]


def _message(kind: str, **content) -> dict:
    return {"msg_type": kind, "header": {"msg_type": kind}, "parent_header": {"msg_id": "run"},
            "metadata": {}, "content": content}


def test_output_kept_while_a_cell_runs_is_bounded():
    """Output over the limits is dropped as it arrives, not after the cell: the grader's memory
    stays bounded however long a cell prints. Messages are fed to the client as the kernel
    would send them (no kernel needed)."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("spam()"),
                                         nbformat.v4.new_code_cell("more()")])
    limits = grade.OutputLimits(printed_per_cell=10_000, rich_per_cell=50_000,
                                per_notebook=70_000, error_text=1_000)
    client = grade.LimitedClient(nb, limits=limits)
    client.clear_before_next_output = False  # set when a cell starts
    first, second = nb.cells

    tracemalloc.start()
    for i in range(2_000):  # 20 MB printed, each message a new string
        client.process_message(_message("stream", name="stdout", text=f"{i:09d}" + "x" * 9_991),
                               first, 0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2_000_000, f"{peak / 1e6:.1f} MB held while 20 MB were printed"
    printed = "".join(o.text for o in first.outputs)
    assert printed.startswith("000000000xxx") and len(printed) <= limits.printed_per_cell
    assert client.cell_dropped == 20_000_000 - len(printed)

    figure = {"image/png": "A" * 20_000, "text/plain": "<Figure>"}
    for _ in range(10):
        client.process_message(_message("display_data", data=figure, metadata={}), first, 0)
    assert sum(o.output_type == "display_data" for o in first.outputs) == 2  # 50 KB a cell

    for _ in range(10):  # the next cell: what is left of the notebook's 70 KB
        client.process_message(_message("display_data", data=figure, metadata={}), second, 1)
    assert sum(o.output_type == "display_data" for o in second.outputs) == 0  # 60 KB kept
    client.process_message(_message("stream", name="stdout", text="y" * 20_000), second, 1)
    assert 0 < len(second.outputs[0].text) < 10_000

    # errors decide the checks: always kept, shortened
    client.process_message(_message("error", ename="ValueError", evalue="v" * 5_000,
                                    traceback=["t" * 600] * 4), second, 1)
    error = second.outputs[-1]
    assert error.output_type == "error" and error.ename == "ValueError"
    assert len(error.evalue) == 1_000 and len("".join(error.traceback)) < 1_100
    assert error.traceback[-1].endswith("[traceback truncated]")


def test_instructor_checks_are_put_back_even_when_deleted_or_edited(tiny_graded):
    nb = feedback(tiny_graded, "d_tampered", "00_tiny")
    source = tiny_notebook()
    ids = [c.id for c in nb.cells]
    assert ids[0] == grade.SUMMARY_CELL_ID
    assert ids[1:] == [c.id for c in source.cells]  # the deleted check is back in its place
    by_id = {c.id: c for c in nb.cells}
    for cell_id in ("check-double", "check-square"):
        assert by_id[cell_id].source == next(c for c in source.cells if c.id == cell_id).source
    assert "AssertionError: square(3) should be 9 (line 1: `assert square(3) == 9" in \
        nb.cells[0].source


def test_notebooks_saved_without_cell_ids_are_matched_by_grade_id(tiny_graded):
    """Older tools save notebooks without cell ids (nbformat 4.4) but keep the cell metadata:
    the checks are still found, and a deleted one goes back after its exercise."""
    nb = feedback(tiny_graded, "i_old_format", "00_tiny")
    source = tiny_notebook()
    ids = [c.id for c in nb.cells]
    graded = {"exercise-double", "check-double", "exercise-square", "check-square"}
    assert [i for i in ids if i in graded] == [c.id for c in source.cells if c.id in graded]
    assert ids.index("check-square") == ids.index("exercise-square") + 1
    assert len(ids) == len(source.cells) + 1 and len(set(ids)) == len(ids)
    assert "**i_old_format: 5 / 5 points.**" in nb.cells[0].source


def test_feedback_is_the_same_on_every_run(tiny_graded, tmp_path):
    """Grading a submission again gives the same feedback, byte for byte: no random cell ids
    (the notebook saved without ids gets deterministic ones), no timings."""
    subs = tiny_graded.parent / "subs"
    for who in ("e_hidden", "i_old_format"):
        shutil.copytree(subs / who, tmp_path / "subs" / who)
    assert grade.main([str(tmp_path / "subs"), "--source", str(tiny_graded.parent / "source"),
                       "--out", str(tmp_path / "grades"),
                       "--timeout", str(TINY_TIMEOUT)]) == 0
    for who in ("e_hidden", "i_old_format"):
        again = tmp_path / "grades" / "feedback" / who / "00_tiny.ipynb"
        first = tiny_graded / "feedback" / who / "00_tiny.ipynb"
        assert again.read_bytes() == first.read_bytes(), who
    rows = [r for r in read_grades(tiny_graded / "grades.csv")
            if r["student"] in ("e_hidden", "i_old_format")]
    assert read_grades(tmp_path / "grades" / "grades.csv") == rows


def test_missing_and_repeated_cell_ids_get_deterministic_ones(tmp_path):
    nb = tiny_notebook()
    saved = json.loads(nbformat.writes(nb))
    cells = saved["cells"]
    del cells[0]["id"]  # intro: no id, no grade_id
    cells[1]["id"] = "exercise-double"  # setup repeats a later id; the exercise keeps it
    del cells[3]["id"]  # check-double: its grade_id is free, so it is the id
    cells[5]["id"] = "has space"  # check-square: invalid, and its grade_id ...
    cells[6]["id"] = "check-square"  # ... is taken by a later cell
    path = tmp_path / "sub.ipynb"
    path.write_text(json.dumps(saved))
    ids = [c.id for c in grade.read_submission(path).cells]
    assert ids == [ids[0], ids[1], "exercise-double", "check-double", "exercise-square",
                   ids[5], "check-square"]
    assert re.fullmatch(r"cell-1-[0-9a-f]{8}", ids[0])
    assert re.fullmatch(r"cell-2-[0-9a-f]{8}", ids[1])
    assert re.fullmatch(r"cell-6-[0-9a-f]{8}", ids[5])
    assert [c.id for c in grade.read_submission(path).cells] == ids  # the same every time
    # a new id never takes one a cell already has
    taken = ids[0]
    cells[6]["id"] = taken
    path.write_text(json.dumps(saved))
    again = [c.id for c in grade.read_submission(path).cells]
    assert again[6] == taken and again[0] == taken + "-2"
    # notebooks older than v4 are converted with random ids by nbformat: given anew
    v3 = nbformat.v3.new_notebook(worksheets=[nbformat.v3.new_worksheet(cells=[
        nbformat.v3.new_code_cell(input="x = 1"), nbformat.v3.new_code_cell(input="x = 1")])])
    old = tmp_path / "v3.ipynb"
    old.write_text(nbformat.v3.writes_json(v3))
    ids = [c.id for c in grade.read_submission(old).cells]
    assert ids == [c.id for c in grade.read_submission(old).cells]
    assert re.fullmatch(r"cell-1-[0-9a-f]{8}", ids[0]) and ids[1].startswith("cell-2-")


def test_hidden_tests_count(tiny_graded):
    summary = feedback(tiny_graded, "e_hidden", "00_tiny").cells[0].source
    assert "| `check-double` | 0 / 2 | **failed**: AssertionError: negative numbers (line 3:" \
        in summary
    assert "| `check-square` | 3 / 3 | ok |" in summary


def test_unreadable_and_missing_submissions(tiny_graded):
    summary = feedback(tiny_graded, "f_unreadable", "00_tiny").cells[0].source
    assert "could not be read as a notebook" in summary
    assert not (tiny_graded / "feedback" / "h_nothing").exists()  # nothing handed in


def test_feedback_notebooks_are_valid_and_executed(tiny_graded):
    written = {p.parent.name: p for p in (tiny_graded / "feedback").rglob("*.ipynb")}
    assert sorted(written) == sorted(w for w, (_, _, status) in TINY_EXPECTED.items()
                                     if status != "not submitted")
    for who, path in written.items():
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        assert nb.cells[0].cell_type == "markdown" and nb.cells[0].id == grade.SUMMARY_CELL_ID
        if TINY_EXPECTED[who][2] == "graded":  # ran to the end: every code cell executed
            assert all(c.execution_count is not None for c in nb.cells if c.cell_type == "code")
            assert nb.cells[-1].outputs[0].text == "the end\n"


# --- the grader on the course's notebooks -------------------------------------------------------

@pytest.mark.slow  # grades the whole notebook: left out of `make test-quick`
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_solution_notebooks_get_full_marks(notebook, tmp_path_factory):
    """End to end, as `make grade` grades a student: the whole solution notebook runs in a
    fresh kernel in an empty folder (not in notebooks/, where nbval runs it), with a time
    limit. Every check gets its points, and no cell fails."""
    grades = course_grades(notebook, tmp_path_factory)
    parsed = assignment.parse_notebook(nbformat.read(notebook, as_version=4), notebook.name)
    rows = {r["check"]: r for r in read_grades(grades / "grades.csv")
            if r["student"] == "solution"}
    assert sorted(rows) == sorted(c.cell_id for c in parsed.checks)
    for check in parsed.checks:
        row = rows[check.cell_id]
        assert float(row["points"]) == float(row["max_points"]) == check.points, \
            f"{notebook.name} {check.cell_id}: the solution loses points; see " \
            f"{grades / 'feedback' / 'solution' / notebook.name}"
    nb = feedback(grades, "solution", notebook.stem)
    assert all(c.execution_count is not None for c in nb.cells
               if c.cell_type == "code" and c.source.strip()), "the notebook did not run to its end"
    assert not error_outputs(nb), f"{notebook.name}: cells fail when graded: {error_outputs(nb)}"


@pytest.mark.slow  # grades the whole notebook: left out of `make test-quick`
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_untouched_student_versions_get_zero(notebook, tmp_path_factory):
    grades = course_grades(notebook, tmp_path_factory)
    rows = [r for r in read_grades(grades / "grades.csv") if r["student"] == "untouched"]
    parsed = assignment.parse_notebook(nbformat.read(notebook, as_version=4), notebook.name)
    assert sorted(r["check"] for r in rows) == sorted(c.cell_id for c in parsed.checks)
    passing = [r["check"] for r in rows if float(r["points"]) != 0]
    assert not passing, f"{notebook.name}: checks that pass with the exercise undone: {passing}"


@pytest.mark.slow  # grades the whole notebook: left out of `make test-quick`
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_student_versions_run_cleanly_up_to_their_stubs(notebook, tmp_path_factory):
    """Executed (with the instructor's checks), a student version raises only its stubs'
    NotImplementedError: every cell that does not depend on an exercise runs cleanly."""
    nb = feedback(course_grades(notebook, tmp_path_factory), "untouched", notebook.stem)
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    assert all(c.execution_count is not None for c in code), "the notebook did not run to its end"
    for cell_id, error in error_outputs(nb):
        assert error.ename == "NotImplementedError" and error.evalue.startswith("Exercise: "), \
            f"{notebook.name}, cell {cell_id}: {error.ename}: {error.evalue}"


@pytest.mark.slow
@pytest.mark.skipif(not (ROOT / "notebooks" / "00_gradients.ipynb").exists(), reason="no 00")
def test_hidden_tests_of_00_catch_what_the_visible_checks_miss(tmp_path_factory):
    grades = course_grades(ROOT / "notebooks" / "00_gradients.ipynb", tmp_path_factory)
    rows = {r["check"]: float(r["points"]) for r in read_grades(grades / "grades.csv")
            if r["student"] == "tampered"}
    assert rows == {"check-linear-backward": 3, "check-mse": 0}
    summary = feedback(grades, "tampered", "00_gradients").cells[0].source
    assert "**tampered: 3 / 5 points.**" in summary
    assert "| `check-mse` | 0 / 2 | **failed**: AssertionError (line" in summary


# --- arguments ----------------------------------------------------------------------------------

def test_find_submissions_in_both_layouts(tmp_path):
    write(tiny_notebook(), tmp_path / "ann" / "00_tiny.ipynb")
    write(tiny_notebook(), tmp_path / "ann" / "scratch.ipynb")
    write(tiny_notebook(), tmp_path / "bob_smith_00_tiny.ipynb")
    write(tiny_notebook(), tmp_path / "carl" / "01_other.ipynb")
    write(tiny_notebook(), tmp_path / "ann" / ".ipynb_checkpoints" / "00_tiny-checkpoint.ipynb")
    write(tiny_notebook(), tmp_path / "__MACOSX" / "ann" / "._00_tiny.ipynb")
    found, warnings = grade.find_submissions(tmp_path, ["00_tiny", "01_other"])
    got = {(s.student, s.notebook): s.path for s in found}
    assert got == {("ann", "00_tiny"): tmp_path / "ann" / "00_tiny.ipynb",
                   ("ann", "01_other"): None,
                   ("bob_smith", "00_tiny"): tmp_path / "bob_smith_00_tiny.ipynb",
                   ("bob_smith", "01_other"): None,
                   ("carl", "00_tiny"): None,
                   ("carl", "01_other"): tmp_path / "carl" / "01_other.ipynb"}
    assert len(warnings) == 1 and "scratch.ipynb" in warnings[0]


def test_bad_arguments_say_what_was_expected(tmp_path):
    write(tiny_notebook(), tmp_path / "src" / "00_tiny.ipynb")
    source = ["--source", str(tmp_path / "src")]
    with pytest.raises(SystemExit, match="SUBMISSIONS must be a folder"):
        grade.main([str(tmp_path / "missing"), *source])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no submissions in"):
        grade.main([str(tmp_path / "empty"), *source])
    write(tiny_notebook(), tmp_path / "subs" / "ann" / "00_tiny.ipynb")
    write(tiny_notebook(), tmp_path / "subs" / "ann_00_tiny.ipynb")
    with pytest.raises(SystemExit, match="two submissions of 00_tiny by ann"):
        grade.main([str(tmp_path / "subs"), *source])
    with pytest.raises(SystemExit):
        grade.main([str(tmp_path / "subs"), *source, "--timeout", "0"])
    with pytest.raises(SystemExit, match="--source must be the folder of solution notebooks"):
        grade.main([str(tmp_path / "subs"), "--source", str(tmp_path / "nope")])
    with pytest.raises(SystemExit, match="holds no notebooks"):
        student.main(["--source", str(tmp_path / "empty"), "--project", str(ROOT)])
    with pytest.raises(SystemExit):
        student.main([*source, "--project", str(tmp_path)])  # no src/, pyproject.toml, ...


def test_output_folders_that_are_not_ours_are_never_emptied(tmp_path):
    write(tiny_notebook(), tmp_path / "src" / "00_tiny.ipynb")
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("keep me")
    with pytest.raises(SystemExit, match="not empty and was not written by this tool"):
        student.main(["--source", str(tmp_path / "src"), "--out", str(precious),
                      "--project", str(ROOT)])
    assert (precious / "thesis.tex").read_text() == "keep me"
    out = tmp_path / "out"  # our own output is rewritten without complaint
    for _ in range(2):
        assert student.main(["--source", str(tmp_path / "src"), "--out", str(out),
                             "--project", str(ROOT)]) == 0


def test_output_folders_that_overlap_the_inputs_are_refused(tmp_path):
    """Even a folder these tools wrote is not emptied when it holds what they read."""
    write(tiny_notebook(), tmp_path / "src" / "00_tiny.ipynb")
    source = ["--source", str(tmp_path / "src")]
    ours = tmp_path / "grades"  # say, last week's grades, which now hold submissions
    assignment.fresh_output_dir(ours, "--out")
    submitted = write(tiny_notebook(), ours / "ann" / "00_tiny.ipynb")
    for subs, out in [(ours, ours), (ours / "ann", ours), (ours, ours / "ann" / "new")]:
        with pytest.raises(SystemExit, match="overlap"):
            grade.main([str(subs), *source, "--out", str(out)])
        assert submitted.exists()
    with pytest.raises(SystemExit, match="overlap"):
        grade.main([str(ours), *source, "--out", str(tmp_path / "src")])
    with pytest.raises(SystemExit, match="overlap"):
        student.main([*source, "--out", str(tmp_path / "src" / "student"),
                      "--project", str(ROOT)])
    with pytest.raises(SystemExit, match="overlap"):
        student.main([*source, "--out", str(ROOT / "img" / "student"), "--project", str(ROOT)])
    assert (tmp_path / "src" / "00_tiny.ipynb").exists()
    assert not (ROOT / "img" / "student").exists()
