"""Grade students' notebooks against the solution notebooks: a grades table and feedback.

    python -m transformer_lab.course.grade SUBMISSIONS                  # -> build/grades/
    python -m transformer_lab.course.grade SUBMISSIONS --timeout 120 --out grades-week3

``SUBMISSIONS`` is a folder holding, in either layout (both may be mixed):

- ``SUBMISSIONS/<student>/<NN_topic>.ipynb`` -- one folder per student, or
- ``SUBMISSIONS/<student>_<NN_topic>.ipynb`` -- one file per student and notebook,

where ``<NN_topic>`` is the name of a solution notebook in ``--source`` (``00_gradients``).
For every submission the instructor's check cells (hidden tests included) are put back by cell
id -- in place of the student's copy, or where it was if the student deleted it -- and the
notebook runs top to bottom in its own fresh kernel, started in an empty temporary folder, with
a time limit per cell. A check earns its points when its cell runs without an error. A cell
over the time limit is interrupted and the notebook goes on; a kernel that dies, or ignores the
interrupt (and is then stopped), ends that submission only. Written to ``--out``:

- ``grades.csv`` -- one row per student, notebook and check: student, notebook, check, points,
  max_points (a notebook a student did not hand in gets 0 for each of its checks);
- ``feedback/<student>/<NN_topic>.ipynb`` -- the graded notebook as executed, with a summary
  cell on top: the score and, for each check, ok or the error that failed it.

Grading runs the students' code with your permissions: it is not a sandbox.
"""

from __future__ import annotations

import argparse
import copy
import csv
import logging
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from transformer_lab.course.assignment import (
    Assignment,
    AssignmentError,
    format_points,
    fresh_output_dir,
    load_assignments,
    solution_notebooks,
)
from transformer_lab.course.kernel_env import apply_kernel_env

DEFAULT_TIMEOUT = 60
CSV_COLUMNS = ("student", "notebook", "check", "points", "max_points")
SUMMARY_CELL_ID = "grading-feedback"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CELL_LINE = re.compile(r"Cell In\[\d+\], line (\d+)")


@dataclass
class Submission:
    student: str
    notebook: str  # the solution notebook's stem, e.g. "00_gradients"
    path: Path | None  # None: not handed in


@dataclass
class CheckResult:
    check: str
    points: float
    max_points: float
    message: str  # "ok", or why the check failed

    @property
    def passed(self) -> bool:
        return self.points == self.max_points


@dataclass
class Run:
    """What happened when a notebook was executed."""

    stopped_at: int | None = None  # index of the cell during which the kernel died / was stopped
    here: str = ""  # what happened, said of that cell
    later: str = ""  # said of the cells after it, which did not run
    status: str = "graded"  # or "kernel died", "kernel stopped", "could not run"
    seconds: float = 0.0


@dataclass
class Graded:
    submission: Submission
    results: list[CheckResult]
    status: str  # "graded", "not submitted", "unreadable", "kernel died", ...
    other_errors: list[str] = field(default_factory=list)
    feedback: Path | None = None
    seconds: float = 0.0

    @property
    def points(self) -> float:
        return sum(r.points for r in self.results)

    @property
    def max_points(self) -> float:
        return sum(r.max_points for r in self.results)


# --- finding the submissions ------------------------------------------------------------------

def find_submissions(folder: Path, notebooks: list[str]) -> tuple[list[Submission], list[str]]:
    """The submissions in ``folder`` (both layouts) and warnings about files that were skipped.

    Every student found gets a :class:`Submission` for every notebook anyone handed in; the
    ones this student did not hand in have ``path=None``.
    """
    if not folder.is_dir():
        raise SystemExit(f"error: SUBMISSIONS must be a folder of submissions "
                         f"(<student>/<NN_topic>.ipynb or <student>_<NN_topic>.ipynb); "
                         f"{str(folder)!r} is not a folder")
    found: dict[tuple[str, str], Path] = {}
    students: set[str] = set()
    warnings: list[str] = []

    def add(student: str, notebook: str, path: Path) -> None:
        if (student, notebook) in found:
            raise SystemExit(f"error: two submissions of {notebook} by {student}: "
                             f"{found[student, notebook]} and {path}; keep one")
        found[student, notebook] = path

    for entry in sorted(folder.iterdir()):
        if entry.name.startswith((".", "__")):  # .ipynb_checkpoints, __MACOSX from zip files
            continue
        if entry.is_dir():
            students.add(entry.name)
            for path in sorted(entry.glob("*.ipynb")):
                if path.name.startswith("."):
                    continue
                if path.stem in notebooks:
                    add(entry.name, path.stem, path)
                else:
                    warnings.append(f"skipped {path}: not named after a notebook "
                                    f"({', '.join(n + '.ipynb' for n in notebooks)})")
        elif entry.suffix == ".ipynb":
            match = [n for n in notebooks if entry.stem.endswith("_" + n)
                     and len(entry.stem) > len(n) + 1]
            if match:
                student = entry.stem[: -len(match[0]) - 1]
                students.add(student)
                add(student, match[0], entry)
            else:
                warnings.append(f"skipped {entry}: not named <student>_<NN_topic>.ipynb")
    if not found:
        raise SystemExit(f"error: no submissions in {str(folder)!r}; expected "
                         f"<student>/<NN_topic>.ipynb or <student>_<NN_topic>.ipynb with "
                         f"NN_topic one of {', '.join(notebooks)}")
    handed_in = sorted({nb for _, nb in found})
    submissions = [Submission(s, nb, found.get((s, nb))) for s in sorted(students)
                   for nb in handed_in]
    return submissions, warnings


# --- putting the instructor's checks back -----------------------------------------------------

def restore_checks(submission, assignment: Assignment):
    """A copy of ``submission`` with the instructor's check cells put back by cell id.

    A check cell the student kept (edited or not) is replaced where it is; one the student
    deleted is inserted after the nearest instructor cell before it that is still there.
    Outputs and execution counts are cleared.
    """
    nb = copy.deepcopy(submission)
    _ensure_ids(nb)
    checks = {c.cell_id for c in assignment.checks}
    anchor = -1  # index in nb of the last instructor cell seen
    for cell in assignment.nb.cells:
        index = _index_of(nb, cell.id)
        if cell.id in checks:
            fresh = copy.deepcopy(cell)
            if index is None:
                index = anchor + 1
                nb.cells.insert(index, fresh)
            else:
                nb.cells[index] = fresh
        if index is not None:
            anchor = index
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


def _index_of(nb, cell_id: str) -> int | None:
    return next((i for i, c in enumerate(nb.cells) if c.get("id") == cell_id), None)


def _ensure_ids(nb) -> None:
    """Give every cell a unique id (notebooks saved by old tools have none)."""
    from nbformat.corpus.words import generate_corpus_id

    nb.nbformat, nb.nbformat_minor = 4, max(nb.get("nbformat_minor", 5), 5)
    seen: set[str] = set()
    for cell in nb.cells:
        if not cell.get("id") or cell.id in seen:
            cell.id = generate_corpus_id()
        seen.add(cell.id)


# --- running a notebook -----------------------------------------------------------------------

class _Watchdog:
    """Stops the kernel when a cell outlives its time limit by ``grace`` seconds.

    nbclient interrupts a cell at the time limit; code that ignores the interrupt (a C loop, a
    SIGINT handler) would otherwise keep the grader waiting for ever.
    """

    def __init__(self, limit: float):
        self.limit = limit
        self.killed_cell: int | None = None
        self._km = None
        self._running: tuple[int, float] | None = None  # (cell index, start), set in one step
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def cell_started(self, client, cell_index: int) -> None:
        self._km = client.km
        self._running = (cell_index, time.monotonic())

    def cell_finished(self) -> None:
        self._running = None

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._done.wait(0.2):
            running = self._running
            if running is not None and time.monotonic() - running[1] > self.limit:
                self.killed_cell = running[0]
                self._kill()
                return

    def _kill(self) -> None:
        process = getattr(getattr(self._km, "provisioner", None), "process", None)
        try:
            process.kill()
        except Exception:  # already gone
            pass


_QUIET_LOG = logging.getLogger("transformer_lab.course.grade.nbclient")
_QUIET_LOG.setLevel(logging.CRITICAL)  # timeouts and dead kernels are reported per submission


def run_notebook(nb, timeout: int) -> Run:
    """Execute ``nb`` in place in a fresh kernel; errors in cells are kept as outputs.

    A cell over ``timeout`` seconds is interrupted and execution goes on; one still running
    ``grace`` seconds later gets its kernel stopped. Never raises: see the returned :class:`Run`.
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    grace = min(timeout, 10)
    watchdog = _Watchdog(timeout + grace)
    run, current = Run(), {"index": None}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="grading-") as workdir, watchdog:
        client = NotebookClient(
            nb, timeout=timeout, allow_errors=True, interrupt_on_timeout=True,
            kernel_name="python3", record_timing=False,
            resources={"metadata": {"path": workdir}},  # the kernel's working folder
            extra_arguments=["--IPKernelApp.log_level=ERROR"], log=_QUIET_LOG)
        client.on_cell_start = lambda cell, cell_index: current.update(index=cell_index)
        client.on_cell_execute = lambda cell, cell_index: watchdog.cell_started(client,
                                                                                  cell_index)
        client.on_cell_executed = lambda **_: watchdog.cell_finished()
        try:
            client.execute()
        except DeadKernelError:
            _stopped(run, nb, current["index"], timeout,
                     stopped_by_us=watchdog.killed_cell is not None)
        except Exception as exc:  # e.g. the kernel could not start
            run.status = "could not run"
            run.here = run.later = f"not run: {_one_line(str(exc)) or type(exc).__name__}"
    run.seconds = time.perf_counter() - start
    return run


def _stopped(run: Run, nb, index: int | None, timeout: int, stopped_by_us: bool) -> None:
    """Record in ``run`` that the kernel died, or was stopped, while running cell ``index``."""
    run.stopped_at = index
    where = "before the first cell" if index is None else \
        f"while running cell {index + 1} (id {nb.cells[index].get('id')!r})"
    if stopped_by_us:
        run.status = "kernel stopped"
        run.here = (f"ran past the time limit of {timeout} s and ignored the interrupt: "
                    "the kernel was stopped")
        run.later = f"not run: the kernel was stopped {where}, over the time limit"
    else:
        run.status = "kernel died"
        run.here = "the kernel died (crashed or exited) while running this cell"
        run.later = f"not run: the kernel died {where}"


# --- judging the checks -----------------------------------------------------------------------

def judge(nb, assignment: Assignment, run: Run, timeout: int) -> list[CheckResult]:
    """One result per instructor check, from the executed notebook ``nb``."""
    results = []
    for check in assignment.checks:
        index = _index_of(nb, check.cell_id)
        cell = nb.cells[index]
        if run.stopped_at == index:
            message = run.here
        elif cell.execution_count is None:
            message = run.later or "not run"
        else:
            message = _error_message(cell, timeout) or "ok"
        results.append(CheckResult(check.cell_id, check.points if message == "ok" else 0,
                                   check.points, message))
    return results


def _error_message(cell, timeout: int) -> str:
    """``ename: evalue (line N: <code>)`` for the first error output of ``cell``; "" if none."""
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    if not errors:
        return ""
    error = errors[0]
    if error.get("ename") == "KeyboardInterrupt":
        return f"did not finish within the time limit of {timeout} s per cell (interrupted)"
    message = error.get("ename", "Error")
    if _one_line(error.get("evalue", "")):
        message += f": {_one_line(error.get('evalue', ''))}"
    line = _failing_line(cell, error)
    return f"{message} ({line})" if line else message


def _failing_line(cell, error) -> str:
    """``line N: <code>`` of the cell's own frame in the traceback, if it names one."""
    traceback = _ANSI.sub("", "\n".join(error.get("traceback", [])))
    match = _CELL_LINE.search(traceback)
    if not match:
        return ""
    number = int(match.group(1))
    lines = cell.source.split("\n")
    code = lines[number - 1].strip() if 0 < number <= len(lines) else ""
    code = code.replace("`", "'")
    return f"line {number}: `{code}`" if code else f"line {number}"


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(_ANSI.sub("", text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def other_errors(nb, assignment: Assignment, run: Run, timeout: int) -> list[str]:
    """Errors in cells that are not checks (an exercise that does not even run, for one)."""
    checks = {c.cell_id for c in assignment.checks}
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or cell.get("id") in checks:
            continue
        if index == run.stopped_at:
            found.append(f"cell {index + 1} (id {cell.get('id')!r}): {run.here}")
        elif message := _error_message(cell, timeout):
            found.append(f"cell {index + 1} (id {cell.get('id')!r}): {message}")
    return found


# --- grading one submission -------------------------------------------------------------------

def grade_submission(submission: Submission, assignment: Assignment, timeout: int,
                     feedback_dir: Path) -> Graded:
    """Grade one submission and write its feedback notebook; never raises for bad student work."""
    if submission.path is None:
        results = [CheckResult(c.cell_id, 0, c.points, "not submitted") for c in assignment.checks]
        return Graded(submission, results, "not submitted")
    try:
        nb = restore_checks(nbformat.read(submission.path, as_version=4), assignment)
    except Exception as exc:  # not a notebook, broken JSON, ...
        reason = f"could not be read as a notebook: {_one_line(str(exc)) or type(exc).__name__}"
        results = [CheckResult(c.cell_id, 0, c.points, reason) for c in assignment.checks]
        graded = Graded(submission, results, "unreadable")
        graded.feedback = write_feedback(nbformat.v4.new_notebook(), graded, timeout,
                                         feedback_dir)
        return graded
    run = run_notebook(nb, timeout)
    graded = Graded(submission, judge(nb, assignment, run, timeout), run.status,
                    other_errors(nb, assignment, run, timeout), seconds=run.seconds)
    graded.feedback = write_feedback(nb, graded, timeout, feedback_dir)
    return graded


def summary_markdown(graded: Graded, timeout: int) -> str:
    """The feedback notebook's first cell: score, then each check, ok or why it failed."""
    s = graded.submission
    lines = [f"# Grading feedback: {s.notebook}", "",
             f"**{s.student}: {format_points(graded.points)} / "
             f"{format_points(graded.max_points)} points.**", "",
             "| check | points | result |", "|---|---|---|"]
    for r in graded.results:
        result = "ok" if r.passed else f"**failed**: {r.message}"
        lines.append(f"| `{r.check}` | {format_points(r.points)} / {format_points(r.max_points)} "
                     f"| {_table_text(result)} |")
    if graded.other_errors:
        lines += ["", "Other cells that did not run cleanly:", ""]
        lines += [f"- {_table_text(e)}" for e in graded.other_errors]
    lines += ["", f"Below: your notebook as graded, run top to bottom in a fresh kernel with a "
                  f"time limit of {timeout} s per cell. Its check cells are the instructor's, "
                  "hidden tests included, whatever the submitted notebook held in their place."]
    return "\n".join(lines)


def _table_text(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def write_feedback(nb, graded: Graded, timeout: int, feedback_dir: Path) -> Path:
    """Write ``nb`` with the summary cell on top to ``feedback/<student>/<notebook>.ipynb``."""
    summary = nbformat.v4.new_markdown_cell(summary_markdown(graded, timeout),
                                            id=SUMMARY_CELL_ID)
    nb.cells = [c for c in nb.cells if c.get("id") != SUMMARY_CELL_ID]
    nb.cells.insert(0, summary)
    dest = feedback_dir / graded.submission.student / f"{graded.submission.notebook}.ipynb"
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest)
    return dest


# --- the whole run ----------------------------------------------------------------------------

def write_csv(graded: list[Graded], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        for g in graded:
            for r in g.results:
                writer.writerow([g.submission.student, g.submission.notebook, r.check,
                                 format_points(r.points), format_points(r.max_points)])


def format_table(graded: list[Graded]) -> str:
    w_student = max(len("student"), *(len(g.submission.student) for g in graded))
    w_nb = max(len("notebook"), *(len(g.submission.notebook) for g in graded))
    header = f"{'student':<{w_student}}  {'notebook':<{w_nb}}  {'points':>9}  status"
    lines = [header, "-" * (len(header) + 8)]
    for g in graded:
        score = f"{format_points(g.points)}/{format_points(g.max_points)}"
        lines.append(f"{g.submission.student:<{w_student}}  {g.submission.notebook:<{w_nb}}  "
                     f"{score:>9}  {g.status}")
    return "\n".join(lines)


def grade_all(submissions: list[Submission], assignments: dict[str, Assignment], timeout: int,
              out: Path) -> list[Graded]:
    """Grade every submission in turn; a broken one never stops the others."""
    apply_kernel_env()
    graded = []
    for k, submission in enumerate(submissions, 1):
        print(f"[{k}/{len(submissions)}] {submission.student} / {submission.notebook} ... ",
              end="", flush=True)
        assignment = assignments[submission.notebook]
        try:
            g = grade_submission(submission, assignment, timeout, out / "feedback")
        except Exception as exc:  # a bug here must not cost the other students their grades
            reason = f"not graded: {type(exc).__name__}: {_one_line(str(exc))}"
            g = Graded(submission, [CheckResult(c.cell_id, 0, c.points, reason)
                                    for c in assignment.checks], "grading error")
        graded.append(g)
        print(f"{format_points(g.points)}/{format_points(g.max_points)} points, {g.status}"
              + (f" ({g.seconds:.1f} s)" if g.seconds else ""), flush=True)
    return graded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("submissions", type=Path,
                        help="folder of submissions: <student>/<NN_topic>.ipynb or "
                             "<student>_<NN_topic>.ipynb")
    parser.add_argument("--source", type=Path, default=Path("notebooks"),
                        help="folder of the solution notebooks (default: notebooks)")
    parser.add_argument("--out", type=Path, default=Path("build/grades"),
                        help="folder for grades.csv and feedback/, emptied first "
                             "(default: build/grades)")
    parser.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT,
                        help=f"seconds a single cell may run (default: {DEFAULT_TIMEOUT})")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error(f"--timeout must be a positive number of seconds, got {args.timeout}")

    sources = {path.stem: path for path in solution_notebooks(args.source)}
    submissions, warnings = find_submissions(args.submissions, sorted(sources))
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    handed_in = sorted({s.notebook for s in submissions})
    try:  # only the notebooks handed in need to be right
        assignments = {Path(a.name).stem: a
                       for a in load_assignments([sources[n] for n in handed_in])}
    except AssignmentError as err:
        print(f"error: the solution notebooks have {len(err.problems)} problem(s) with their "
              f"markers or metadata:\n{err}", file=sys.stderr)
        return 1
    fresh_output_dir(args.out, "--out")
    graded = grade_all(submissions, assignments, args.timeout, args.out)
    write_csv(graded, args.out / "grades.csv")
    print()
    print(format_table(graded))
    print(f"\ngrades: {args.out / 'grades.csv'}\nfeedback: {args.out / 'feedback'}/<student>/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
