"""The classroom tools: the handout's notebooks (`make student`), the markers, and the kernel runs
of the grader's feedback (`make grade`).

What keeps them honest, for every notebook in notebooks/:
- a student version holds no line of any solution region;
- a student version keeps everything else, its check cells locked;
and, on a tiny course made here: misplaced markers fail the build with notebook, cell and line;
a crash or an endless loop in a kernel stops only that notebook's run and leaves no process
behind; a cell printing for ever keeps a bounded output; notebooks saved without cell ids get
deterministic ones; output folders that are not the tools' own, or that overlap what they read,
are never emptied. The grader itself: tests/test_grading.py; the package's handout:
tests/test_handout.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
import tracemalloc
from pathlib import Path

import nbformat
import pytest
from course_helpers import meta as _meta
from course_helpers import write

from transformer_lab.course import assignment, grade, kernel_run, student, versions

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
STUB = re.compile(r'^\s*raise NotImplementedError\((["\'])Exercise: .+\1\)$')


# --- a tiny course, built here ------------------------------------------------------------------

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
        v4.new_code_cell("assert double(2) == 4\nprint('double ok')",
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


def without_ids(nb) -> str:
    """``nb`` as older tools save it: nbformat 4.4, cells without ids (their metadata kept)."""
    saved = json.loads(nbformat.writes(nb))
    saved["nbformat_minor"] = 4
    for cell in saved["cells"]:
        del cell["id"]
    return json.dumps(saved, indent=1)


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
    """Per cell id, the line numbers (0-based) of its solution regions, markers included --
    found the way nbgrader finds them, independently of the tools' parser."""
    removed = {}
    for cell in parsed.nb.cells:
        inside, lines = False, set()
        for i, line in enumerate(cell.source.split("\n")):
            if "BEGIN SOLUTION" in line:
                inside = True
            if inside:
                lines.add(i)
            if "END SOLUTION" in line:
                inside = False
        removed[cell.id] = lines
    return removed


# --- student versions ---------------------------------------------------------------------------

@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_student_version_holds_no_solution_line(notebook):
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
    version = versions.project_version(ROOT)
    for nb in NOTEBOOKS:  # `make student` writes what student_notebook() makes, and its version
        written = nbformat.read(student_tree / "notebooks" / nb.name, as_version=4)
        solution, student = solution_and_student(nb)
        assert written.metadata.pop(versions.METADATA_KEY) == version.of_notebook(
            ROOT / "src" / "transformer_lab", solution).metadata()
        assert written == student
    for absent in ["tests", "conftest.py", "Makefile", ".ci", "src/transformer_lab/course"]:
        assert not (student_tree / absent).exists(), f"{absent} must not go to students"
    assert not list(student_tree.rglob("__pycache__"))
    readme = (student_tree / "README.md").read_text()
    assert "NotImplementedError" in readme and "requirements.txt" in readme
    assert "src/transformer_lab/core/" in readme and "autoreload" in readme
    assert "Hand in this folder" in readme and "without `.venv/`" in readme  # the core too
    for nb in NOTEBOOKS:
        assert f"notebooks/{nb.name}" in readme


def test_the_handout_installs_what_a_student_runs_and_torchs_cpu_build(student_tree):
    """The handout's requirements.txt is the course's student file: no site builder, no test
    tools (requirements-dev.txt, which stays with the maintainers); its README installs torch
    from PyTorch's CPU wheel index first and runs the trainer with the environment's Python."""
    requirements = (student_tree / "requirements.txt").read_text()
    assert requirements == (ROOT / "requirements.txt").read_text()
    names = {re.split(r"[=;<> ]", line, maxsplit=1)[0].lower()
             for line in requirements.splitlines() if line and not line.startswith("#")}
    assert {"numpy", "torch", "jupyterlab", "ipykernel", "matplotlib"} <= names
    assert not {n for n in names if n.startswith(("sphinx", "myst", "pytest", "nbval"))}
    assert not (student_tree / "requirements-dev.txt").exists()
    readme = (student_tree / "README.md").read_text()
    install_torch = f".venv/bin/pip install --index-url {student.TORCH_CPU_INDEX} " \
                    f"{student.torch_pin(ROOT)}"
    assert install_torch in readme
    assert readme.index(install_torch) < readme.index(".venv/bin/pip install -r requirements.txt")
    assert ".venv/bin/python -m transformer_lab.train --task reverse" in readme
    assert "site builder" not in readme and "Get Started" not in readme


def test_student_version_of_00_has_the_stub_with_its_hint_and_keeps_the_checks():
    cells = {c.id: c for c in solution_and_student(ROOT / "notebooks" / "00_gradients.ipynb")[1]
             .cells}
    source = cells["exercise-mse"].source
    assert source.startswith('def mse_loss(P, Y):\n    """Mean squared error over all entries')
    assert ('    raise NotImplementedError("Exercise: an elementwise square, then a mean '
            '(sections 4 and 5)")') in source
    assert source.endswith("\n    return loss, dP")
    assert "np.mean(diff ** 2)" not in source and "2 * diff" not in source
    assert cells["check-mse"].source == 'check("check-mse", mse_loss)'
    assert cells["check-mse"].metadata["nbgrader"]["points"] == 2
    assert cells["check-linear-backward"].source == 'check("check-linear-backward")'


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
    "hidden tests in a notebook": (_edit_source("check-double", "assert double(2) == 4\n"
                                                "### BEGIN HIDDEN TESTS\nassert True\n"
                                                "### END HIDDEN TESTS"),
                                   4, "check-double", 2, "belong in a check module"),
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
                       "--out", str(tmp_path / "grades"), "--project", str(ROOT)]) == 1
    assert where in capsys.readouterr().err


def test_every_problem_is_reported_at_once():
    nb = tiny_notebook(edit={"intro": "# BEGIN SOLUTION",
                             "exercise-square": "def square(x):\n    ### END SOLUTION"})
    with pytest.raises(assignment.AssignmentError) as err:
        assignment.parse_notebook(nb, "00_tiny.ipynb")
    assert len(err.value.problems) == 3  # markdown marker, stray END, no region left


# --- the feedback run's kernel: time limits, crashes, leftovers ---------------------------------

KERNEL_TIMEOUT = 2  # seconds per cell: these cells take microseconds, or run for ever


def _code_notebook(*sources):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source, id=f"c{k}")
                                         for k, source in enumerate(sources)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


@pytest.fixture(scope="module")
def kernel_runs(tmp_path_factory):
    """Three notebooks run as the grader runs feedback notebooks: one whose cell leaves a
    process behind and kills its kernel, one printing for ever, one ignoring the interrupt."""
    pid_file = tmp_path_factory.mktemp("kernel") / "child.pid"
    notebooks = {
        "crash": _code_notebook(
            "print('before')",
            "import os, subprocess, sys\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(child.pid))\nos._exit(1)",
            "print('after')"),
        "loop": _code_notebook("while True:\n    print('still going', 2)", "print('after')"),
        "deaf": _code_notebook("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                               "while True:\n    pass", "print('after')"),
    }
    runs = {name: (nb, kernel_run.run_notebook(nb, KERNEL_TIMEOUT))
            for name, nb in notebooks.items()}
    return runs, pid_file


def test_a_crash_or_a_deaf_kernel_stops_only_that_run(kernel_runs):
    runs, _ = kernel_runs
    nb, run = runs["crash"]
    assert run.status == "kernel died"
    assert run.later == "not run: the kernel died while running cell 2 (id 'c1')"
    assert nb.cells[0].outputs[0].text == "before\n" and nb.cells[2].execution_count is None
    nb, run = runs["deaf"]
    assert run.status == "kernel stopped" and "ignored the interrupt" in run.later
    nb, run = runs["loop"]  # interrupted at the limit, and the notebook went on
    assert run.status == "ran" and nb.cells[1].outputs[0].text == "after\n"
    assert [o.ename for o in nb.cells[0].outputs if o.output_type == "error"] == \
        ["KeyboardInterrupt"]
    assert nb.cells[0].outputs[-1].text.startswith(  # said why, not the bare interrupt alone
        "[interrupted: this cell ran past the time limit of ")
    assert run.interrupted == ["c0"]  # for the feedback's summary, which names it
    assert runs["crash"][1].interrupted == []


def test_the_feedback_summary_names_the_cells_interrupted_at_the_time_limit():
    """A correct but slow student's feedback showed a dozen NameErrors after two training cells
    that had stopped at the limit, and its summary said nothing of them (an instructor's
    trial)."""
    from transformer_lab.course.reports import CheckResult, Graded, summary_markdown

    run = kernel_run.Run(interrupted=["training-25", "training-38"])
    graded = Graded("dave", "10_training", [CheckResult("check-sgd-step", 2, 2, "ok", 5)],
                    "graded", run=run)
    assert "(In that run, `training-25`, `training-38` ran past the time limit of 60 s per " \
           "cell and were stopped; a later cell that uses what they compute fails too" \
        in summary_markdown(graded, 60)
    one = dataclasses.replace(graded, run=kernel_run.Run(interrupted=["my-experiment"]))
    assert "`my-experiment` ran past the time limit of 60 s per cell and was stopped; a later " \
           "cell that uses what it computes fails too" in summary_markdown(one, 60)
    assert "In that run" not in summary_markdown(dataclasses.replace(graded, run=None), 60)


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_processes_left_by_a_crashed_kernel_are_stopped(kernel_runs):
    child = int(kernel_runs[1].read_text())
    deadline = time.monotonic() + 5  # a killed process takes a moment to go
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _running(os.getpid()) and not _running(child)


def test_a_cell_that_prints_for_ever_keeps_a_bounded_output(kernel_runs):
    nb, _ = kernel_runs[0]["loop"]
    limits = kernel_run.OutputLimits()
    assert len(nbformat.writes(nb)) < 3 * limits.printed_per_cell
    streams = [o for o in nb.cells[0].outputs if o.output_type == "stream"]
    printed = "".join(o.text for o in streams[:-2])  # then the two notes: truncated, stopped
    assert printed.startswith("still going 2\nstill going 2\n")
    assert 0.9 * limits.printed_per_cell < len(printed.encode()) <= limits.printed_per_cell
    assert re.fullmatch(r"\[output truncated: \d+\.\d (KB|MB) of this cell's output not kept; "
                        r"grading keeps 100\.0 KB of printed text .*\]\n", streams[-2].text)
    assert streams[-1].text.startswith("[interrupted: this cell ran past the time limit")


def _message(kind: str, **content) -> dict:
    return {"msg_type": kind, "header": {"msg_type": kind}, "parent_header": {"msg_id": "run"},
            "metadata": {}, "content": content}


def test_output_kept_while_a_cell_runs_is_bounded():
    """Output over the limits is dropped as it arrives, not after the cell: the grader's memory
    stays bounded however long a cell prints. Messages are fed to the client as the kernel
    would send them (no kernel needed)."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("spam()"),
                                         nbformat.v4.new_code_cell("more()")])
    limits = kernel_run.OutputLimits(printed_per_cell=10_000, rich_per_cell=50_000,
                                per_notebook=70_000, error_text=1_000)
    client = kernel_run.LimitedClient(nb, limits=limits)
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


# --- arguments ----------------------------------------------------------------------------------

def test_bad_arguments_say_what_was_expected(tmp_path):
    write(tiny_notebook(), tmp_path / "src" / "00_tiny.ipynb")
    source = ["--source", str(tmp_path / "src"), "--project", str(ROOT)]
    with pytest.raises(SystemExit, match="SUBMISSIONS must be a folder"):
        grade.main([str(tmp_path / "missing"), *source])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no submissions in"):
        grade.main([str(tmp_path / "empty"), *source])
    (tmp_path / "zips").mkdir()  # an LMS's download, not unpacked
    (tmp_path / "zips" / "ann.zip").write_bytes(b"PK")
    with pytest.raises(SystemExit, match=r"it holds 1 zip file\(s\) \(ann.zip\): not graded: "
                                         r"the grader does not unpack zips; unzip each"):
        grade.main([str(tmp_path / "zips"), *source])
    write(tiny_notebook(), tmp_path / "subs" / "ann" / "00_tiny.ipynb")
    for option in ("--timeout", "--case-timeout", "--probe-timeout"):
        with pytest.raises(SystemExit):
            grade.main([str(tmp_path / "subs"), *source, option, "0"])
    with pytest.raises(SystemExit, match="--project must be the course's folder; .* lacks "
                       "src/transformer_lab/__init__.py, pyproject.toml, requirements.txt"):
        grade.main([str(tmp_path / "subs"), "--source", str(tmp_path / "src"),
                    "--project", str(tmp_path)])
    with pytest.raises(SystemExit, match="--source must be the folder of solution notebooks"):
        grade.main([str(tmp_path / "subs"), "--source", str(tmp_path / "nope"),
                    "--project", str(ROOT)])
    with pytest.raises(SystemExit, match="holds no notebooks"):
        student.main(["--source", str(tmp_path / "empty"), "--project", str(ROOT)])
    with pytest.raises(SystemExit, match="--project must be the course's folder"):
        student.main([*source[:2], "--project", str(tmp_path)])  # no src/, pyproject.toml, ...


def test_legacy_check_cells_are_refused_by_the_grader(tmp_path, capsys):
    """A check cell of asserts decides in the student's kernel: the grader refuses to grade it,
    naming the cell (make student still builds the handout, with a note)."""
    write(tiny_notebook(), tmp_path / "src" / "00_tiny.ipynb")
    write(tiny_notebook(), tmp_path / "subs" / "ann" / "00_tiny.ipynb")
    assert grade.main([str(tmp_path / "subs"), "--source", str(tmp_path / "src"),
                       "--out", str(tmp_path / "grades"), "--project", str(ROOT)]) == 1
    err = capsys.readouterr().err
    assert "check cell 'check-double': not a one-line check(...) call" in err
    assert not (tmp_path / "grades").exists()
    assert student.main(["--source", str(tmp_path / "src"), "--out", str(tmp_path / "out"),
                         "--project", str(ROOT)]) == 0
    assert "00_tiny: check-double, check-square" in capsys.readouterr().out


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
    project = ["--project", str(ROOT)]
    for subs, out in [(ours, ours), (ours / "ann", ours), (ours, ours / "ann" / "new")]:
        with pytest.raises(SystemExit, match="overlap"):
            grade.main([str(subs), *source, *project, "--out", str(out)])
        assert submitted.exists()
    with pytest.raises(SystemExit, match="overlap"):
        grade.main([str(ours), *source, *project, "--out", str(tmp_path / "src")])
    with pytest.raises(SystemExit, match="overlap"):  # the instructor's package
        grade.main([str(ours), *source, *project, "--out", str(ROOT / "src" / "grades")])
    with pytest.raises(SystemExit, match="overlap"):
        student.main([*source, "--out", str(tmp_path / "src" / "student"),
                      "--project", str(ROOT)])
    with pytest.raises(SystemExit, match="overlap"):
        student.main([*source, "--out", str(ROOT / "img" / "student"), "--project", str(ROOT)])
    assert (tmp_path / "src" / "00_tiny.ipynb").exists()
    assert not (ROOT / "img" / "student").exists()


def test_a_notebook_of_many_slow_cells_stops_at_its_time_in_all():
    """Each cell under the cell limit, together over the notebook's limit: the feedback run
    stops there, and no cell starts after it (a student's 30 cells of sleep(10**6) took half an
    hour at the cell limit alone)."""
    nb = _code_notebook(*["import time\ntime.sleep(2)"] * 4, "print('last')")
    run = kernel_run.run_notebook(nb, 3, total=3.0)
    assert run.status == "time up"
    assert "had run their 3 s in all before cell 3, which did not run" in run.later
    assert [c.execution_count is not None for c in nb.cells] == [True, True, False, False, False]
