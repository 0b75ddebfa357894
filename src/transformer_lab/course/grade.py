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
interrupt (and is then stopped), ends that submission only. Of what a cell outputs, grading
keeps the first 100 KB of printed text and 5 MB of figures and other output, 20 MB in all per
notebook (:class:`OutputLimits`); the rest is dropped as it arrives, with a note in the cell.
Cells saved without ids (by older tools) are matched by their nbgrader ``grade_id``, and the
ids given to the others are derived from the notebook, so feedback is the same on every run.
Written to ``--out`` (emptied first; it must be a folder these tools wrote, apart from the
submissions and the solutions):

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
import hashlib
import json
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError

from transformer_lab.course.assignment import (
    Assignment,
    AssignmentError,
    check_apart,
    format_points,
    fresh_output_dir,
    load_assignments,
    nbgrader_meta,
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


_VALID_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # nbformat's cell id pattern


def read_submission(path: Path):
    """Read a submitted notebook, giving cells without a (unique, valid) id a deterministic one.

    ``nbformat.read`` would repair missing or duplicate ids with random ones, so the same
    submission would give different feedback on each run: the ids are settled here first.
    """
    nb = nbformat.reader.reads(path.read_text(encoding="utf-8"))  # no conversion, no repair
    if nb.get("nbformat") == 4:
        _ensure_ids(nb)
        return nb
    nb = nbformat.convert(nb, 4)  # from v3 or older, with random ids: give them all anew
    _ensure_ids(nb, renew=True)
    return nb


def _ensure_ids(nb, renew: bool = False) -> None:
    """Give every cell a unique, valid id, deterministically (notebooks saved by older tools
    have none; a hand-edited one may repeat them).

    Of cells sharing an id, the one whose ``metadata.nbgrader.grade_id`` is that id keeps it,
    or else the first. A cell left without an id takes its grade_id when no cell has it -- old
    tools keep the metadata, and the instructor's cells are matched by id -- or else
    ``cell-<position>-<hash of its source>``. ``renew``: give every cell its id this way.
    """
    nb.nbformat, nb.nbformat_minor = 4, max(nb.get("nbformat_minor", 5), 5)

    def usable(cell) -> bool:
        return not renew and isinstance(cell.get("id"), str) and bool(_VALID_ID.match(cell.id))

    def owns(cell) -> bool:
        return nbgrader_meta(cell).get("grade_id") == cell.id

    keep: dict[str, int] = {}  # id -> index of the cell that keeps it
    for first_pass in (True, False):
        for k, cell in enumerate(nb.cells):
            if usable(cell) and owns(cell) == first_pass and cell.id not in keep:
                keep[cell.id] = k
    taken = set(keep)
    for k, cell in enumerate(nb.cells):  # after every kept id is known: none is taken twice
        if usable(cell) and keep.get(cell.id) == k:
            continue
        grade_id = nbgrader_meta(cell).get("grade_id")
        if isinstance(grade_id, str) and _VALID_ID.match(grade_id) and grade_id not in taken:
            new_id = grade_id
        else:
            digest = hashlib.sha1(str(cell.get("source", "")).encode("utf-8", "replace"))
            new_id = base = f"cell-{k + 1}-{digest.hexdigest()[:8]}"
            n = 1
            while new_id in taken:
                n += 1
                new_id = f"{base}-{n}"
        cell.id = new_id
        taken.add(new_id)


# --- running a notebook -----------------------------------------------------------------------

@dataclass(frozen=True)
class OutputLimits:
    """How much of a submission's output grading keeps, in bytes (UTF-8 text, JSON for rich
    output). Whatever is over a limit is dropped as it arrives -- the grader's memory stays
    bounded however much a cell prints -- and the cell gets a note saying how much. Error
    outputs, which decide the checks, are always kept, their text shortened to ``error_text``.
    """

    printed_per_cell: int = 100_000  # stdout and stderr together
    rich_per_cell: int = 5_000_000  # figures, HTML, results of expressions
    per_notebook: int = 20_000_000  # everything kept in the notebook
    error_text: int = 20_000  # the message, and the traceback as a whole
    per_output: int = 100  # charged for every output kept, however short its text


_OUTPUT_MESSAGES = {"stream", "display_data", "execute_result", "update_display_data", "error"}


def _nbytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _head(text: str, limit: int) -> str:
    """The longest start of ``text`` whose UTF-8 encoding fits in ``limit`` bytes."""
    if len(text) * 4 <= limit:
        return text
    return text.encode("utf-8", "surrogatepass")[:max(limit, 0)].decode("utf-8", "ignore")


def format_size(nbytes: int) -> str:
    for unit, size in (("MB", 1e6), ("KB", 1e3)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes} bytes"


class LimitedClient(NotebookClient):
    """An nbclient ``NotebookClient`` that keeps at most :class:`OutputLimits` of the output.

    nbclient appends each output message to the cell as it arrives; this client looks at every
    output message first (``process_message``) and keeps it, shortens it or drops it, and adds
    a note to a cell that lost output (``async_execute_cell``, also when the kernel dies).
    """

    def __init__(self, nb, limits: OutputLimits | None = None, **kw):
        super().__init__(nb, **kw)
        self.limits = limits or OutputLimits()
        self.notebook_bytes = 0  # kept so far in the notebook
        self._start_cell(None)

    def _start_cell(self, cell_index: int | None) -> None:
        self.cell_index = cell_index
        self.cell_printed = self.cell_rich = self.cell_dropped = 0  # bytes kept, dropped

    async def async_execute_cell(self, cell, cell_index, execution_count=None,
                                 store_history=True):
        self._start_cell(cell_index)
        try:
            return await super().async_execute_cell(cell, cell_index, execution_count,
                                                    store_history)
        finally:
            if self.cell_dropped:
                self._add_note(cell)

    def process_message(self, msg, cell, cell_index):
        if msg.get("msg_type") in _OUTPUT_MESSAGES:
            if cell_index != self.cell_index:
                self._start_cell(cell_index)
            msg = self._admit(msg)
            if msg is None:
                return None
        return super().process_message(msg, cell, cell_index)

    def _admit(self, msg):
        """``msg`` as it may be kept (text shortened), or None to drop it."""
        kind, content, limits = msg["msg_type"], msg["content"], self.limits
        if kind == "error":  # always kept: judge() reads it
            content = {**content, "ename": _head(str(content.get("ename", "")), 200),
                       "evalue": _head(str(content.get("evalue", "")), limits.error_text),
                       "traceback": self._short_traceback(content.get("traceback") or [])}
            self.notebook_bytes += limits.per_output + _nbytes(json.dumps(content))
            return {**msg, "content": content}
        notebook_room = limits.per_notebook - self.notebook_bytes - limits.per_output
        if kind == "stream":
            text = str(content.get("text", ""))
            size = _nbytes(text)
            room = min(limits.printed_per_cell - self.cell_printed - limits.per_output,
                       notebook_room)
            if size > room:
                kept = _head(text, room) if room > 0 else ""
                self.cell_dropped += size - _nbytes(kept)
                if not kept:
                    return None
                text, size = kept, _nbytes(kept)
                content = {**content, "text": text}
            self.cell_printed += limits.per_output + size
            self.notebook_bytes += limits.per_output + size
            return {**msg, "content": content}
        size = _nbytes(json.dumps(content.get("data", {}), default=str))
        room = min(limits.rich_per_cell - self.cell_rich - limits.per_output, notebook_room)
        if size > room:
            self.cell_dropped += size
            return None
        self.cell_rich += limits.per_output + size
        self.notebook_bytes += limits.per_output + size
        return msg

    def _short_traceback(self, lines: list) -> list[str]:
        kept, room = [], self.limits.error_text
        for line in map(str, lines):
            if _nbytes(line) > room:
                kept.append(_head(line, room) + "\n[traceback truncated]")
                break
            kept.append(line)
            room -= _nbytes(line)
        return kept

    def _add_note(self, cell) -> None:
        limits = self.limits
        note = nbformat.v4.new_output("stream", name="stderr", text=(
            f"[output truncated: {format_size(self.cell_dropped)} of this cell's output not "
            f"kept; grading keeps {format_size(limits.printed_per_cell)} of printed text and "
            f"{format_size(limits.rich_per_cell)} of figures and other output per cell, "
            f"{format_size(limits.per_notebook)} per notebook]\n"))
        streams = [k for k, o in enumerate(cell.outputs) if o.get("output_type") == "stream"]
        cell.outputs.insert(streams[-1] + 1 if streams else len(cell.outputs), note)


class _Watchdog:
    """Stops the kernel when a cell outlives its time limit by ``grace`` seconds, and stops
    what the kernel left running when the notebook is done.

    nbclient interrupts a cell at the time limit; code that ignores the interrupt (a C loop, a
    SIGINT handler) would otherwise keep the grader waiting for ever. Processes the student's
    code started (``subprocess``, ``multiprocessing``) share the kernel's process group and
    would outlive a kernel that crashed or was stopped: on leaving the ``with`` block the whole
    group is killed (on systems with process groups).
    """

    def __init__(self, limit: float):
        self.limit = limit
        self.killed_cell: int | None = None
        self._process = None  # the kernel's process, and its process group
        self._pgid: int | None = None
        self._running: tuple[int, float] | None = None  # (cell index, start), set in one step
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def cell_started(self, client, cell_index: int) -> None:
        provisioner = getattr(client.km, "provisioner", None)
        self._process = getattr(provisioner, "process", None) or self._process
        self._pgid = getattr(provisioner, "pgid", None) or self._pgid
        self._running = (cell_index, time.monotonic())

    def cell_finished(self) -> None:
        self._running = None

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()
        self._kill()  # whatever is left of the kernel's process group

    def _watch(self) -> None:
        while not self._done.wait(0.2):
            running = self._running
            if running is not None and time.monotonic() - running[1] > self.limit:
                self.killed_cell = running[0]
                self._kill()
                return

    def _kill(self) -> None:
        """Kill the kernel's process group (the kernel alone where there are none)."""
        own_group = os.getpgrp() if hasattr(os, "getpgrp") else None
        if self._pgid and self._pgid != own_group and hasattr(os, "killpg"):
            try:
                os.killpg(self._pgid, signal.SIGKILL)
                return
            except OSError:  # the group is gone already
                pass
        if self._process is not None:
            try:
                self._process.kill()
            except Exception:  # already gone
                pass


_QUIET_LOG = logging.getLogger("transformer_lab.course.grade.nbclient")
_QUIET_LOG.setLevel(logging.CRITICAL)  # timeouts and dead kernels are reported per submission


def run_notebook(nb, timeout: int, limits: OutputLimits | None = None) -> Run:
    """Execute ``nb`` in place in a fresh kernel; errors in cells are kept as outputs.

    A cell over ``timeout`` seconds is interrupted and execution goes on; one still running
    ``grace`` seconds later gets its kernel stopped. Output over ``limits`` is not kept (see
    :class:`OutputLimits`). Never raises: see the returned :class:`Run`.
    """
    grace = min(timeout, 10)
    watchdog = _Watchdog(timeout + grace)
    run, current = Run(), {"index": None}
    start = time.perf_counter()
    # A student's code may leave files behind it cannot delete: that must not cost the grade.
    workdirs = tempfile.TemporaryDirectory(prefix="grading-", ignore_cleanup_errors=True)
    with workdirs as workdir, watchdog:  # the watchdog's exit kills leftovers, then cleanup
        client = LimitedClient(
            nb, limits=limits, timeout=timeout, allow_errors=True, interrupt_on_timeout=True,
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
        nb = restore_checks(read_submission(submission.path), assignment)
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

    inputs = {"SUBMISSIONS": args.submissions, "--source": args.source}
    check_apart(args.out, "--out", inputs)  # --out is emptied: refuse it before reading
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
    fresh_output_dir(args.out, "--out", inputs)
    graded = grade_all(submissions, assignments, args.timeout, args.out)
    write_csv(graded, args.out / "grades.csv")
    print()
    print(format_table(graded))
    print(f"\ngrades: {args.out / 'grades.csv'}\nfeedback: {args.out / 'feedback'}/<student>/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
