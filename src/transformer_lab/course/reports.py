"""What a grading run found (:class:`Graded`, :class:`Outcome`), and the reports made from it,
the same bytes for the same records: ``grades.csv``, ``totals.csv``, ``skipped.csv``,
``flags.csv`` and ``sandbox.csv`` (:func:`write_reports`), the feedback's summary cell
(:func:`add_summary`), the table and summary printed at the end (:func:`format_table`,
:func:`print_summary`).
:mod:`.grade` grades; this module only turns its records into text and files.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from transformer_lab.course.assignment import format_points
from transformer_lab.course.flags import Flag
from transformer_lab.course.kernel_run import Run
from transformer_lab.course.submissions import Found

CSV_COLUMNS = ("student", "notebook", "check", "points", "max_points")
TOTALS_COLUMNS = ("student", "notebook", "points", "max_points", "status")
SKIPPED_COLUMNS = ("student", "file", "reason")
FLAG_COLUMNS = ("student", "notebook", "where", "line", "what", "code")
SANDBOX_COLUMNS = ("student", "sandbox")
SUMMARY_CELL_ID = "grading-feedback"


@dataclass
class CheckResult:
    check: str
    points: float
    max_points: float
    message: str  # "ok", or why the check failed (the framework's verdict, or the reason)
    cases: int = 0  # cases judged
    public: int = 0  # how many of the check's cases are the public ones (the first ones)
    failed_case: int | None = None  # the index of the case that failed, if one did

    @property
    def passed(self) -> bool:
        return self.message == "ok"


@dataclass
class Graded:
    student: str
    notebook: str
    results: list[CheckResult]
    status: str  # "graded", "not submitted", "other version", "unreadable", "grading error"
    notes: list[str] = field(default_factory=list)  # what was graded, what stayed a stub
    cells: list[tuple[str, str | None]] = field(default_factory=list)  # the probe's cells
    flags: list[Flag] = field(default_factory=list)
    run: Run | None = None
    seconds: float = 0.0
    timing: dict[str, float] = field(default_factory=dict)  # seconds by part (grade._Clock)

    @property
    def points(self) -> float:
        return sum(r.points for r in self.results)

    @property
    def max_points(self) -> float:
        return sum(r.max_points for r in self.results)


@dataclass
class Outcome:
    """What a grading run found: a Graded per (student, notebook), the students found, the
    flags' rows, what the students' code ran in, notes on the whole run."""

    graded: list[Graded]
    found: Found
    flags: list[list]
    sandbox: str
    notes: list[str] = field(default_factory=list)


# --- feedback ---------------------------------------------------------------------------------

def summary_markdown(graded: Graded, timeout: int, executed: bool = True,
                     sandbox: str = "") -> str:
    """The feedback notebook's first cell, from the verdicts: the score, each check, the
    failures in full, what code was graded, and where (``sandbox``: what it ran in)."""
    lines = [f"# Grading feedback: {graded.notebook}", "",
             f"**{graded.student}: {format_points(graded.points)} / "
             f"{format_points(graded.max_points)} points.**", "",
             "| check | points | result |", "|---|---|---|"]
    if graded.status != "graded" and graded.results:  # one reason for every check: said once
        lines[3:3] = [f"**{graded.status.capitalize()}**: {graded.results[0].message}", ""]
    for r in graded.results:
        first = r.message.split("\n", 1)[0] + (" (see below)" if "\n" in r.message else "")
        result = (passed(r.cases) if r.passed else
                  "**failed**: " + _table_text(first) if graded.status == "graded" else
                  "not graded")
        lines.append(f"| `{r.check}` | {format_points(r.points)} / {format_points(r.max_points)} "
                     f"| {result} |")
    for r in graded.results:
        if not r.passed and "\n" in r.message and graded.status == "graded":
            text = r.message.replace("```", "'''")
            lines += ["", f"**`{r.check}`**", "", "```text", text, "```"]
    if graded.status == "graded":
        lines += ["", "**What was graded.** The grader ran your notebook's first code cell, "
                      "the functions, classes and imports of its other cells, and its exercise "
                      "cells, then called your functions on its own inputs (the "
                      "cases your check cells run, with numbers of the grader's own, and "
                      "hidden ones) in a process of its own, and compared "
                      "what they returned with the reference there."]
        lines += note_lines(graded, _table_text)
        lines += ["", ("Below: your notebook run top to bottom in a fresh kernel on the same "
                       f"code, with the instructor's check cells and a time limit of {timeout} s "
                       "per cell. It is there for you to see what your notebook does: the "
                       "points above do not come from its outputs.") if executed else
                  ("Below: your notebook with the instructor's check cells, not run in this "
                   "grading (the points above never come from a notebook's outputs).")]
        if executed and graded.flags:
            lines.append(f"({len(graded.flags)} line(s) of this notebook are listed for your "
                         "instructor as reaching into the checks', the grader's or IPython's "
                         "machinery, patching modules or the like (flags.csv): where such code "
                         "ran, the outputs below may not say what the checks found.)")
        if graded.run is not None and graded.run.status in ("kernel died", "kernel stopped"):
            lines.append(f"(That run's kernel {graded.run.status.split()[-1]}: "
                         f"{_table_text(graded.run.later)}.)")
        elif graded.run is not None and graded.run.status == "time up":
            lines.append(f"(That run stopped: {_table_text(graded.run.later)}.)")
        if graded.run is not None and graded.run.interrupted:
            cells = ", ".join(f"`{c}`" for c in graded.run.interrupted)
            one = len(graded.run.interrupted) == 1
            lines.append(f"(In that run, {cells} ran past the time limit of {timeout} s per "
                         f"cell and {'was' if one else 'were'} stopped; a later cell that uses "
                         f"what {'it' if one else 'they'} compute{'s' if one else ''} fails too, "
                         "which costs no points.)")
        if sandbox:
            lines += ["", f"Your code ran in: {sandbox}."]
    return "\n".join(lines)


def note_lines(graded: Graded, text=str) -> list[str]:
    """The notes on what was graded, and the error of each of the student's cells as the grader
    ran it, a "- " line each (``text``: how a note or error is written)."""
    return [f"- {text(n)}" for n in graded.notes] + [
        f"- your cell `{cid}`, as the grader ran it: {text(err)}" for cid, err in graded.cells
        if err]


def passed(cases: int, kind: str = "") -> str:
    """``passed (N cases)``, ``passed (1 public case)``: what a passed check says."""
    return f"passed ({cases} {kind}case{'s' * (cases != 1)})"


def _table_text(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def add_summary(nb, graded: Graded, timeout: int, executed: bool = True,
                sandbox: str = "") -> None:
    """Put the summary cell (:func:`summary_markdown`) on top of the feedback notebook ``nb``,
    in place of any summary cell it had."""
    summary = nbformat.v4.new_markdown_cell(
        summary_markdown(graded, timeout, executed, sandbox), id=SUMMARY_CELL_ID)
    nb.cells = [c for c in nb.cells if c.get("id") != SUMMARY_CELL_ID]
    nb.cells.insert(0, summary)


# --- the CSV files ----------------------------------------------------------------------------

def _write_rows(path: Path, header, rows) -> None:
    """A CSV file; names that are not UTF-8 (a file name's undecodable bytes) are written as
    backslash escapes, and a text that a spreadsheet would run as a formula (a student's folder
    named ``=HYPERLINK(...)``) gets a leading ``'``, which spreadsheets read as "text"."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([_as_text(v) for v in row] for row in rows)
    path.write_text(buffer.getvalue(), encoding="utf-8", errors="backslashreplace")


def _as_text(value):
    """``value``, with a ``'`` before a string that starts as a formula may (=, +, -, @, a tab
    or a carriage return)."""
    return "'" + value if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t",
                                                                    "\r") else value


def flag_rows(graded: list[Graded], core: dict[str, list[tuple[str, Flag]]]) -> list[list]:
    """The rows of ``flags.csv``: the flags of every graded notebook, and ``core``'s (student ->
    (notebook, flag) in the student's core modules, in the order of the students) for the
    notebooks graded here and for none ("": code no grading runs), sorted."""
    flags = [(g.student, g.notebook, f) for g in graded for f in g.flags]
    here = {g.notebook for g in graded}
    flags += [(student, nb, f) for student, found in core.items() for nb, f in found
              if not nb or nb in here]
    return sorted(([s, nb, f.where, f.line, f.what, f.code] for s, nb, f in flags),
                  key=lambda r: r[:5])


def write_reports(out: Path, graded: list[Graded], found: Found, flags: list[list],
                  sandbox: str) -> None:
    """``grades.csv`` (a row per check), ``totals.csv`` (a row per notebook, with its status:
    graded, not submitted, other version, unreadable, grading error), ``skipped.csv``,
    ``flags.csv`` (rows from :func:`flag_rows`) and ``sandbox.csv`` (``sandbox``: what every
    student's code ran in) in ``out``."""
    _write_rows(out / "grades.csv", CSV_COLUMNS,
                [[g.student, g.notebook, r.check, format_points(r.points),
                  format_points(r.max_points)] for g in graded for r in g.results])
    _write_rows(out / "totals.csv", TOTALS_COLUMNS,
                [[g.student, g.notebook, format_points(g.points), format_points(g.max_points),
                  g.status] for g in graded])
    _write_rows(out / "skipped.csv", SKIPPED_COLUMNS,
                [[s.student, s.path, s.reason] for s in found.skipped])
    _write_rows(out / "flags.csv", FLAG_COLUMNS, flags)
    _write_rows(out / "sandbox.csv", SANDBOX_COLUMNS,
                [[student, sandbox] for student in sorted(found.students)])


# --- printed at the end -----------------------------------------------------------------------

def format_table(graded: list[Graded]) -> str:
    if not graded:
        return "no notebook was graded: none handed in is named after one graded here"
    w_student = max(len("student"), *(len(g.student) for g in graded))
    w_nb = max(len("notebook"), *(len(g.notebook) for g in graded))
    header = f"{'student':<{w_student}}  {'notebook':<{w_nb}}  {'points':>9}  status"
    lines = [header, "-" * (len(header) + 8)]
    for g in graded:
        score = f"{format_points(g.points)}/{format_points(g.max_points)}"
        lines.append(f"{g.student:<{w_student}}  {g.notebook:<{w_nb}}  {score:>9}  {g.status}")
    return "\n".join(lines)


#: the skipped files the console lists (all of them are in skipped.csv)
SKIPPED_SHOWN = 30


def print_summary(outcome: Outcome, out: Path, sandboxed: bool = True) -> None:
    """The end of a grading run on the command line: the table, the files skipped, the flags,
    what the students' code ran in (a warning when ``sandboxed`` is False), where the files
    are."""
    graded, found, flags = outcome.graded, outcome.found, outcome.flags
    print()
    print(format_table(graded))
    if found.skipped:
        print(f"\nskipped {len(found.skipped)} file(s) (skipped.csv):")
        unchosen = [s for s in found.skipped if s.reason.endswith("(--notebooks)")]
        rest = [s for s in found.skipped if s not in unchosen]
        if unchosen:
            print(f"  {len(unchosen)} notebook(s) of other assignments, not graded (--notebooks)")
        for s in rest[:SKIPPED_SHOWN]:
            print(f"  {s.student or '-'}: {s.path}: {s.reason}")
        if len(rest) > SKIPPED_SHOWN:
            print(f"  ... and {len(rest) - SKIPPED_SHOWN} more")
    if flags:
        students = sorted({r[0] for r in flags})
        print(f"\n{len(flags)} line(s) of code worth a look, from {', '.join(students)} "
              "(flags.csv)")
    for note in outcome.notes:
        print(f"\nnote: {note}")
    warning = "" if sandboxed else "WARNING: "
    print(f"\n{warning}students' code ran in: {outcome.sandbox}")
    print(f"\ngrades: {out / 'grades.csv'}\nfeedback: {out / 'feedback'}/<student>/")
