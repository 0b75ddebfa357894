"""Grade students' notebooks and core modules with verdicts their code cannot reach.

    python -m transformer_lab.course.grade SUBMISSIONS                  # -> build/grades/
    python -m transformer_lab.course.grade SUBMISSIONS --out grades-week3 --timeout 120

What a run does, what it writes (grades.csv, totals.csv, skipped.csv, flags.csv, sandbox.csv,
feedback/) and what it guarantees: docs/instructors.md, "Grading". For each student and
notebook N, a probe package (:mod:`.probe_driver`) runs the student's code in a sandbox
(:mod:`.sandbox`) and returns plain data; the verdicts are computed here, and :mod:`.reports`
turns them into the files.
Submissions of another course version (:mod:`.versions`) are left out with the version that grades
them; a run with none of its own version is refused before anything is written.
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat

from transformer_lab import syllabus
from transformer_lab.checks import framework as F
from transformer_lab.course import untrusted, versions
from transformer_lab.course.assignment import (
    OWNER_FILE,
    Assignment,
    AssignmentError,
    check_apart,
    check_project,
    format_points,
    fresh_output_dir,
    nbgrader_meta,
    parse_notebook,
    solution_notebooks,
)
from transformer_lab.course.flags import Flag, python_source, scan_notebook_cells, scan_python
from transformer_lab.course.kernel_env import KERNEL_ENV, apply_kernel_env, with_pythonpath
from transformer_lab.course.kernel_run import format_size, one_line, run_notebook
from transformer_lab.course.package import (
    Package,
    PackageError,
    parse_package,
    statement_spans,
    top_level_definitions,
)
from transformer_lab.course.probe_driver import (
    CheckSpec,
    Overlay,
    ProbeLimits,
    ProbeReport,
    build_probe_package,
    reference_free,
    run_probe,
)
from transformer_lab.course.reports import (
    CheckResult,
    Graded,
    Outcome,
    add_summary,
    flag_rows,
    print_summary,
    write_reports,
)
from transformer_lab.course.sandbox import (
    Bubblewrap,
    NoSandbox,
    SandboxLimits,
    SandboxUnavailable,
    find_sandbox,
)
from transformer_lab.course.submissions import (
    Found,
    Skipped,
    StudentWork,
    find_submissions,
    handout_digests,
)
from transformer_lab.notebook import limit_threads

DEFAULT_TIMEOUT = 60
DEFAULT_CASE_TIMEOUT = 30
DEFAULT_PROBE_TIMEOUT = 600
#: The largest notebook the grader reads (the course's largest, executed, is under 2 MB).
MAX_NOTEBOOK_BYTES = 50_000_000
#: What stands for the temporary folders of a grading run in feedback and messages.
WORKDIR_MARK = "<grading folder>"


# --- reading a submitted notebook, restoring the instructor's checks ---------------------------

_VALID_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # nbformat's cell id pattern


def read_submission(path: Path):
    """Read a submitted notebook, giving cells without a (unique, valid) id a deterministic one.

    ``nbformat.read`` would repair missing or duplicate ids with random ones, so the same
    submission would give different feedback on each run: the ids are settled here first.
    """
    text = path.read_text(encoding="utf-8")
    try:
        json.loads(text)
    except json.JSONDecodeError as err:  # nbformat would quote the file's start only
        raise ValueError(f"it is not valid JSON at line {err.lineno}, column {err.colno} "
                         f"({err.msg}): cut short, or edited outside Jupyter? Open your copy "
                         "in JupyterLab, save it, and hand it in again") from None
    nb = nbformat.reader.reads(text)  # no conversion, no repair
    old = nb.get("nbformat") != 4
    if old:  # v3 or older: converted with random ids, given them all anew
        nb = nbformat.convert(nb, 4)
    _ensure_ids(nb, renew=old)
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


def _matcher(nb):
    """A function finding the student's cell for an instructor's cell: by id, then by nbgrader
    ``grade_id``, then (for cells without one) by identical source; each cell matched once."""
    used: set[int] = set()

    def find(cell):
        grade_id = nbgrader_meta(cell).get("grade_id")
        tests = [lambda c: c.get("id") == cell.get("id")]
        if grade_id:
            tests.append(lambda c: nbgrader_meta(c).get("grade_id") == grade_id)
        if cell.get("source", "").strip():
            tests.append(lambda c: c.get("cell_type") == cell.get("cell_type")
                         and c.get("source") == cell.get("source"))
        for test in tests:
            for c in nb.cells:
                if id(c) not in used and test(c):
                    used.add(id(c))
                    return c
        return None
    return find


def _position(nb, cell) -> int:
    return next(k for k, c in enumerate(nb.cells) if c is cell)


def restore_checks(submission, assignment: Assignment):
    """A copy of ``submission`` with the instructor's check cells put back.

    A check cell the student kept (found by id, then by nbgrader grade_id) is replaced where
    it is; one they deleted goes right after the cell that preceded it in the solution (found by
    id, grade_id or identical source), or -- when none of those is there -- after the
    notebook's first code cell: never above the notebook's first cell. Outputs and execution
    counts are cleared.
    """
    nb = copy.deepcopy(submission)
    _ensure_ids(nb)
    find = _matcher(nb)
    checks = {c.cell_id for c in assignment.checks}
    anchor = None  # the notebook's cell of the last instructor cell seen
    for cell in assignment.nb.cells:
        found = find(cell)
        if cell.id in checks:
            fresh = copy.deepcopy(cell)
            if found is not None:
                nb.cells[_position(nb, found)] = fresh
            elif anchor is not None:
                nb.cells.insert(_position(nb, anchor) + 1, fresh)
            else:
                code = [k for k, c in enumerate(nb.cells) if c.cell_type == "code"]
                nb.cells.insert(code[0] + 1 if code else min(1, len(nb.cells)), fresh)
            found = fresh
        if found is not None:
            anchor = found
    _ensure_ids(nb)  # an instructor's id the student had on another cell: theirs is renamed
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


def probe_cells(submission, assignment: Assignment) -> tuple[list[tuple[str, str]], list[str]]:
    """The cells the probe runs, in notebook order, as plain Python: the submission's first code
    cell and its exercise cells (found by id, then grade_id) in full, and of every other code
    cell that is not a check only its definitions (functions, classes, imports), so that an
    exercise may use a helper the notebook defined earlier -- less the imports whose names
    nothing else there uses (see :func:`without_unused_imports`); and notes on missing exercise
    cells."""
    chosen: dict[int, Any] = {}
    code = [c for c in submission.cells if c.cell_type == "code" and c.source.strip()]
    if code:
        chosen[id(code[0])] = code[0]
    notes = []
    for exercise in assignment.exercises:
        cell = _find_by_id(submission, exercise.cell_id)
        if cell is None:
            notes.append(f"the exercise cell `{exercise.cell_id}` is not in your notebook (it "
                         "was found neither by its id nor by its nbgrader grade_id)")
        else:
            chosen[id(cell)] = cell
    checks = {c.cell_id for c in assignment.checks}
    cells = []
    for c in code:
        if id(c) in chosen:
            cells.append((c.id, python_source(c.source)))
        elif c.get("id") not in checks and (defs := _definitions(python_source(c.source))):
            cells.append((c.id, defs))
    passed = {name for c in assignment.checks if c.call is not None for name in c.call.names}
    return without_unused_imports(cells, passed), notes


def _own_cell_errors(errors: list[tuple[str, str]], submission,
                     assignment: Assignment) -> list[tuple[str, str]]:
    """The probe's ``errors`` (cell id, error) of the cells the student wrote or changed. A
    course cell handed in as it was, run for its definitions alone, can fail for want of what
    the statements it lost set (``def f(d=D_HEAD)``, ``D_HEAD`` set earlier): not theirs."""
    course = {c.id: c.source for c in assignment.nb.cells if c.cell_type == "code"}
    theirs = {c.get("id"): c.source for c in submission.cells}
    return [(cid, err) for cid, err in errors
            if cid not in course or course[cid] != theirs.get(cid)]


def without_unused_imports(cells: list[tuple[str, str]],
                           names: set[str] = frozenset()) -> list[tuple[str, str]]:
    """``cells`` with each top-level import whose names no other statement of any of them uses
    (nor ``names``, those the check cells pass) turned into ``pass``, line numbers kept.

    A notebook imports torch and matplotlib for its explanations; the probe runs only what the
    exercises need, and importing those costs more than everything else it does (about 2.4 of
    3 s a notebook). ``from m import *`` and imports sharing a line are kept."""
    trees: dict[int, ast.Module] = {}
    used = set(names)
    for k, (_, source) in enumerate(cells):
        try:
            trees[k] = untrusted.parse(source)
        except SyntaxError:
            continue
        for node in trees[k].body:
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                used.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
                used.update(name for n in ast.walk(node)
                            if isinstance(n, (ast.Global, ast.Nonlocal)) for name in n.names)
    pruned = []
    for k, (cell_id, source) in enumerate(cells):
        lines = source.split("\n")
        body = trees[k].body if k in trees else []
        for i, node in enumerate(body):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            bound = {(a.asname or a.name.split(".")[0]) for a in node.names}
            alone = all(other.end_lineno < node.lineno or other.lineno > node.end_lineno
                        for j, other in enumerate(body) if j != i)
            if "*" in bound or bound & used or not alone or node.col_offset:
                continue
            lines[node.lineno - 1] = "pass"
            for line in range(node.lineno, node.end_lineno):
                lines[line] = ""
        pruned.append((cell_id, "\n".join(lines)))
    return pruned


_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)


def _definitions(source: str) -> str:
    """The functions, classes and imports of a cell's source ('' if none, or unparseable)."""
    try:
        tree = untrusted.parse(source)
    except SyntaxError:
        return ""
    return "\n\n".join(ast.get_source_segment(source, node) or "" for node in tree.body
                        if isinstance(node, _DEFINITIONS))


def _find_by_id(nb, cell_id: str):
    """The code cell of ``nb`` whose id is ``cell_id``, else the one whose nbgrader grade_id is
    (an exercise cell's grade_id is its id: :func:`.assignment.parse_notebook` checks it)."""
    for test in (lambda c: c.get("id") == cell_id,
                 lambda c: nbgrader_meta(c).get("grade_id") == cell_id):
        for c in nb.cells:
            if c.cell_type == "code" and test(c):
                return c
    return None


# --- the grading run --------------------------------------------------------------------------

@dataclass
class Grader:
    """Everything one grading run shares."""

    assignments: dict[str, Assignment]
    instructor: Package
    handout_src: Path  # the handout's src/ (holding transformer_lab/)
    submissions: Path
    out: Path
    limits: ProbeLimits  # limits.cell: also each cell's time limit in the feedback run
    execute: bool = True
    sandbox: Bubblewrap | NoSandbox = field(default_factory=NoSandbox)
    hidden_apart: bool = False  # Options.hidden_apart
    cases: dict[str, list[F.Case]] = field(default_factory=dict)
    public: dict[str, int] = field(default_factory=dict)
    _expected: dict[tuple[str, str], Any] = field(default_factory=dict)
    #: held while computing the shared caches and while writing into ``out`` (the ledger)
    lock: threading.RLock = field(default_factory=threading.RLock)
    ledger: Ledger | None = None
    version: versions.CourseVersion = versions.CourseVersion(versions.UNKNOWN)
    #: (student, notebook) of the notebooks that record no course version
    unversioned: set[tuple[str, str]] = field(default_factory=set)

    def check_cases(self, check_id: str) -> list[F.Case]:
        """The grader's cases of a check: public and hidden, drawn with the grader's salt
        (``public[check_id]``: how many of them, the first ones, are public)."""
        with self.lock:
            if check_id not in self.cases:
                check = F.get_check(check_id)
                self.cases[check_id] = F.all_cases(check, salt="grader")
                self.public[check_id] = len(F.all_cases(check, salt="grader", hidden=False))
            return self.cases[check_id]

    def expected(self, check_id: str, case: F.Case):
        key = (check_id, case.name)
        with self.lock:
            if key in self._expected:
                return self._expected[key]
        want = F.get_check(check_id).expected(*copy.deepcopy(case.args),
                                              **copy.deepcopy(case.kwargs))
        with self.lock:
            return self._expected.setdefault(key, want)


def judge_all(grader: Grader, assignment: Assignment, report: ProbeReport,
              defs: Defs | None = None) -> list[CheckResult]:
    """One result per check of the notebook, judged here from the probe's evidence; what a
    check reads from the code itself (:attr:`~.framework.Check.loop_free`), from ``defs``
    (:func:`last_defs`)."""
    results = []
    for check in assignment.checks:
        chk = F.get_check(check.cell_id)
        loops = {name: source_loops(defs or {}, name, name in chk.stepwise)
                 for name in chk.loop_free}
        cases = grader.check_cases(check.cell_id)
        message, judged, failed = "ok", 0, None
        for k, case in enumerate(cases):
            outcome = report.outcomes.get((check.cell_id, case.name))
            if outcome is None:
                message = report.missing.get(check.cell_id) or \
                    f"no result came back for case {case.name!r}"
                failed = k
                break
            try:
                want = grader.expected(check.cell_id, case)
            except Exception as exc:  # the reference failed: not the student's fault
                message = (f"not graded: the instructor's reference failed on case "
                           f"{case.name!r} ({type(exc).__name__}: {one_line(str(exc))})")
                break
            verdict = F.judge(chk, case, outcome, want, loops=loops)
            judged += 1
            if not verdict.passed:
                message = verdict.message
                failed = k
                break
        if message == "ok" and check.cell_id in report.missing:
            message = report.missing[check.cell_id]
        results.append(CheckResult(check.cell_id, check.points if message == "ok" else 0,
                                   check.points, message, judged,
                                   grader.public[check.cell_id], failed))
    name_culprits(results, grader.hidden_apart)
    return results


#: A function's name -> its def and the constants of the module or cell it is in.
Defs = dict[str, tuple[ast.FunctionDef, frozenset[str]]]


def last_defs(cells: list[tuple[str, str]], names) -> Defs:
    """The last plain top-level ``def`` of each of ``names`` in ``cells`` ((id, source), in the
    order they run), with the :func:`~.framework.module_constants` of its cell; a name without
    one is left out."""
    found: Defs = {}
    for _, source in cells:
        try:
            tree = untrusted.parse(source)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in names:
                found[node.name] = node, F.module_constants(tree)
    return found


def core_defs(work: StudentWork, names) -> Defs:
    """:func:`last_defs` of the core functions of ``names``, read from the student's core
    modules that hold them -- the files the probe takes them from."""
    wanted: dict[Path, set[str]] = {}
    for name in names:
        try:
            module, _ = syllabus.where_taught(name)
        except KeyError:  # a notebook function: last_defs finds it in the cells
            continue
        if module in (work.core_files or {}):
            wanted.setdefault(work.core_files[module], set()).add(name)
    found: Defs = {}
    for path, functions in wanted.items():
        try:
            found.update(last_defs([(path.name, path.read_text(encoding="utf-8"))], functions))
        except (OSError, UnicodeDecodeError):
            continue
    return found


def source_loops(defs: Defs, name: str, steps: bool = False) -> str:
    """What :func:`~.framework.python_loops` says of the function ``name``, read from the body
    of its def in ``defs`` (:func:`last_defs`, :func:`core_defs`), functions it defines inside
    included: "none", "a loop at line N" (of its cell or file), or that there is no such def.
    A loop in a function it calls is not seen, as in the notebook."""
    if name not in defs:
        return (f"no def {name} in the notebook's cells or your core modules (the grader reads "
                f"its loops from one)")
    node, constants = defs[name]
    return F.def_loops(node, steps=steps, constants=constants)


def name_culprits(results: list[CheckResult], public_only: bool = False) -> None:
    """Put first, in the message of each failed check, the checks of this notebook that test a
    core function it depends on and failed too: the likely culprit. (The functions earlier
    notebooks teach are the instructor's in the probe package: they are never the culprit.)
    ``public_only``: name only the checks that failed a public case (a hidden verdict may
    show later than the message)."""
    failed = {r.check for r in results if not r.passed and not (
        public_only and r.failed_case is not None and r.failed_case >= r.public)}
    for result in results:
        if result.passed:
            continue
        try:
            chk = F.get_check(result.check)
            culprits = [other for other in F.dependency_checks(chk)
                        if other.id in failed and other.id != result.check]
        except Exception:  # a check unknown to this version of the framework: say nothing
            continue
        lines = []
        for other in culprits:  # of several functions, the check failed, not each of them
            names = [f"`{n}`" for n in other.functions]
            lines.append(f"{names[0]} fails `{other.id}` too: fix it first, then this check."
                         if len(names) == 1 else
                         f"`{other.id}` fails too, the check of {', '.join(names[:-1])} and "
                         f"{names[-1]}, which this one runs: fix what it names first, then "
                         "this check.")
        if lines:
            result.message = "\n".join(lines) + "\n" + result.message


def not_graded(student: str, notebook: str, assignment: Assignment, reason: str,
               status: str) -> Graded:
    """0 points for every check of the notebook, with ``reason``."""
    return Graded(student, notebook, [CheckResult(c.cell_id, 0, c.points, reason)
                                      for c in assignment.checks], status)


def grade_submission(grader: Grader, work: StudentWork, notebook: str,
                     found: Found) -> Graded:
    """Grade one student's notebook; never raises for bad student work."""
    assignment = grader.assignments[notebook]
    path = work.notebooks.get(notebook)

    def refused(reason: str, status: str, feedback: bool = True) -> Graded:
        graded = not_graded(work.name, notebook, assignment, reason, status)
        if feedback:
            write_feedback(nbformat.v4.new_notebook(), graded, grader)
        return graded

    if path is None and (work.name, notebook) in found.other_version:
        return refused(found.other_version[work.name, notebook], "other version")
    if path is None:  # the files of theirs not graded, but those this run leaves out on purpose
        skipped = [s for s in found.skipped_of(work.name) if not s.deliberate]
        files = "; ".join(f"{s.path}: {s.reason}" for s in skipped[:5]) + \
            ("; ..." if len(skipped) > 5 else "")
        return refused("no file handed in is this notebook"
                       + (f" (files skipped: {files})" if skipped else ""),
                       "not submitted", feedback=bool(skipped))
    try:
        if path.stat().st_size > MAX_NOTEBOOK_BYTES:
            raise ValueError(f"it is {format_size(path.stat().st_size)}; the grader reads "
                             f"notebooks of at most {format_size(MAX_NOTEBOOK_BYTES)} (clear "
                             "its outputs: Edit > Clear Outputs of All Cells, then save)")
        submission = read_submission(path)
    except Exception as exc:  # not a notebook, broken JSON, too big ...
        return refused("could not be read as a notebook: "
                       f"{one_line(str(exc)) or type(exc).__name__}", "unreadable")
    clock = _Clock()
    with tempfile.TemporaryDirectory(prefix="grading-", ignore_cleanup_errors=True) as tmp:
        tmp = Path(tmp)
        overlay = build_probe_package(grader.handout_src, grader.instructor, notebook,
                                      work.core_files, tmp / "feedback",
                                      work.core_label(grader.submissions))
        shutil.copytree(tmp / "feedback", tmp / "probe")
        reference_free(tmp / "probe")
        cells, notes = probe_cells(submission, assignment)
        specs = [CheckSpec(c.cell_id, c.call.args, dict(c.call.kwargs),
                           grader.check_cases(c.cell_id),
                           grader.public[c.cell_id] if grader.hidden_apart else None)
                 for c in assignment.checks]
        loop_free = {name for c in assignment.checks for name in F.get_check(c.cell_id).loop_free}
        whole = {c.id: c.source for c in submission.cells if c.cell_type == "code"}
        defs = {**core_defs(work, loop_free),  # a def's constants are read from its whole cell
                **last_defs([(i, python_source(whole[i])) for i, _ in cells], loop_free)}
        clock.lap("package")
        report = run_probe(tmp / "probe", cells, specs, grader.limits, grader.sandbox)
        clock.lap("probe")
        results = judge_all(grader, assignment, report, defs)
        _name_the_stubs(results, overlay)
        clock.lap("judge")
        if (work.name, notebook) in grader.unversioned:
            notes.append(versions.unversioned_note(grader.version))
        notes += _other_files(found, work.name, notebook)
        graded = Graded(work.name, notebook, results, "graded",
                        notes=_overlay_notes(overlay, notebook) + notes,
                        cells=_own_cell_errors(report.cells, submission, assignment))
        graded.flags = _flags_of_own_code(submission, assignment)
        nb = restore_checks(submission, assignment)
        if grader.execute:
            package = (tmp / "feedback").resolve()
            # in a sandbox, the sandbox's environment; either way, the package
            env = {**KERNEL_ENV, "PYTHONIOENCODING": "utf-8"} if grader.sandbox.isolated \
                else dict(os.environ)
            env = {**with_pythonpath(env, package), "PYTHONDONTWRITEBYTECODE": "1"}
            clock.lap("other")
            graded.run = run_notebook(nb, grader.limits.cell, env=env, sandbox=grader.sandbox,
                                      read_only=(package,), total=grader.limits.total)
            clock.lap("feedback")
        _sanitize(graded, nb, tmp)
    write_feedback(nb, graded, grader)
    clock.lap("other")
    graded.seconds, graded.timing = sum(clock.laps.values()), clock.laps
    return graded


class _Clock:
    """Seconds spent in each part of grading a notebook, for the progress lines."""

    def __init__(self):
        self.laps: dict[str, float] = {}
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = self.laps.get(name, 0.0) + now - self.last
        self.last = now


def _flags_of_own_code(submission, assignment: Assignment) -> list[Flag]:
    """The flags of the student's code cells, but those of the cells the course wrote, handed
    in unchanged (the package guard's importlib, say): scanned, for the names they import, and
    not reported."""
    given = {c.get("id"): c.source for c in assignment.nb.cells if c.cell_type == "code"}
    cells = [(f"cell {k + 1} ({c.get('id')})", c.source, given.get(c.get("id")) == c.source)
             for k, c in enumerate(submission.cells) if c.cell_type == "code"]
    unchanged = {where for where, _, same in cells if same}
    return [f for f in scan_notebook_cells([(where, source) for where, source, _ in cells])
            if f.where not in unchanged]


def _name_the_stubs(results: list[CheckResult], overlay: Overlay) -> None:
    """A check stopped by a function that stayed a stub because of the student's file (it does
    not parse, it lacks the function) says so, not "not written yet"."""
    for result in results:
        for name, why in overlay.stubs.items():
            stub = f"not written yet -- NotImplementedError: {name}() in "
            if stub in result.message:
                result.message = result.message.replace(
                    stub, f"`{name}` stayed a stub: {why} -- NotImplementedError: {name}() in ")


def _other_files(found: Found, student: str, notebook: str) -> list[str]:
    """The note naming the student's other files for ``notebook``, which were not graded."""
    others = [s.path for s in found.skipped_of(student)
              if s.reason.startswith(f"another file was graded for {notebook}:")]
    if not others:
        return []
    return [f"not graded, as another file of yours was (the best name, then the newest file): "
            f"{', '.join(f'`{p}`' for p in others)}; to have one of them graded, hand it in "
            f"alone or under the notebook's own name"]


def _overlay_notes(overlay: Overlay, notebook: str) -> list[str]:
    notes = []
    if overlay.students:
        notes.append("your functions, from your core modules: "
                     + ", ".join(f"`{n}`" for n in overlay.students))
    for name, why in overlay.stubs.items():
        notes.append(f"`{name}` stayed a stub: {why}")
    if syllabus.notebook_functions(notebook):
        notes.append("every other core function: the reference for the ones earlier notebooks "
                     "teach, a stub for the ones later notebooks teach")
    return notes


def _sanitize(graded: Graded, nb, tmp: Path) -> None:
    """Replace the run's temporary folders by a fixed mark in messages and outputs, so that the
    same submission gives the same files on every run."""
    paths = sorted({str(tmp), str(tmp.resolve())}, key=len, reverse=True)
    pattern = re.compile("|".join(re.escape(p) for p in paths)
                         + r"|(?:[A-Za-z]:)?(?:[/\\][^\s'\"/\\]+)*[/\\]"
                           r"(?:probe|grading|ipykernel)[-_][a-z0-9_]{2,}")

    def clean(text):
        return pattern.sub(WORKDIR_MARK, text) if isinstance(text, str) else text

    for result in graded.results:
        result.message = clean(result.message)
    graded.notes = [clean(n) for n in graded.notes]
    graded.cells = [(cid, clean(err)) for cid, err in graded.cells]
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            for key in ("text", "evalue"):
                if key in output:
                    output[key] = clean(output[key])
            if "traceback" in output:
                output["traceback"] = [clean(t) for t in output["traceback"]]
            for key, value in output.get("data", {}).items():
                if key.startswith("text/"):
                    output["data"][key] = clean(value)


# --- feedback (what it says: .reports) --------------------------------------------------------

def write_feedback(nb, graded: Graded, grader: Grader) -> None:
    """Write ``nb`` with the summary cell on top to ``feedback/<student>/<notebook>.ipynb``
    (:mod:`.reports` makes the summary)."""
    add_summary(nb, graded, grader.limits.cell, grader.execute, grader.sandbox.describe())
    dest = grader.out / "feedback" / graded.student / f"{graded.notebook}.ipynb"
    with grader.lock:  # what the grader writes into out is known to its ledger at once
        dest.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, dest)
        if grader.ledger is not None:
            grader.ledger.add(dest)


# --- flags in the submitted core --------------------------------------------------------------

def core_flags(work: StudentWork, submissions: Path) -> list[tuple[str, Flag]]:
    """(notebook, flag) for the student's core modules: a row for each notebook whose grading
    runs the statement holding the line (:func:`_graded_in`; "" where none does)."""
    found = []
    base = work.folder or submissions
    for module, path in sorted((work.core_files or {}).items()):
        try:
            source = path.read_text(encoding="utf-8")
            tree = untrusted.parse(source)
            scanned = scan_python(source, path.relative_to(base).as_posix(), core=True)
        except Exception:  # unreadable, or built to break the parser (too deep, too big)
            continue
        spans = statement_spans(tree, source.split("\n"))
        notebooks = _graded_in(tree, syllabus.TAUGHT_IN.get(module, {}))
        for flag in scanned:
            owner = next((n for n in tree.body
                          if spans[id(n)][0] <= flag.line - 1 <= spans[id(n)][1]), None)
            found += [(nb, flag) for nb in sorted(notebooks.get(id(owner), ()))] or [("", flag)]
    return found


def _graded_in(tree: ast.Module, taught: dict[str, tuple[str, ...]]) -> dict[int, set[str]]:
    """id of a top-level statement of a core module -> the notebooks whose grading runs it, as
    the probe composes the module (:func:`~.package.student_code`): for a function the module
    teaches, every notebook that teaches or extends it (``taught``: its places); for a helper,
    a class or a constant, those of what uses it; for an import, those of every function the
    module teaches. Other module-level code is left out of the probe: none."""
    places = {name: {p.split(" §")[0] for p in where} for name, where in taught.items()}
    bound = top_level_definitions(tree)  # name -> the statement binding it last
    found = {id(bound[name]): set(nbs) for name, nbs in places.items() if name in bound}
    todo = [bound[name] for name in places if name in bound]
    while todo:  # what they use, and what that uses
        node = todo.pop()
        for used in ast.walk(node):
            if isinstance(used, ast.Name) and used.id in bound and used.id not in places and \
                    not found[id(node)] <= found.setdefault(id(bound[used.id]), set()):
                found[id(bound[used.id])] |= found[id(node)]
                todo.append(bound[used.id])
    every = set().union(*places.values())
    found.update({id(n): every for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)})
    return found


# --- the output folder ------------------------------------------------------------------------

class Ledger:
    """The files the grader wrote to its output folder, with a copy of each in ``vault``: after a
    student's code has run, a file that appeared is removed and one that changed is restored,
    and both are reported."""

    def __init__(self, out: Path, vault: Path):
        self.out, self.vault = out, vault
        self.known: dict[Path, tuple[int, int]] = {}
        self.add(out / OWNER_FILE)

    def add(self, path: Path | None) -> None:
        if path is None or not path.is_file():
            return
        copy = self.vault / path.relative_to(self.out)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, copy)
        self.known[path] = self._stat(path)

    @staticmethod
    def _stat(path: Path) -> tuple[int, int] | None:
        try:
            st = path.lstat()
        except OSError:
            return None
        return (st.st_size, st.st_mtime_ns) if not path.is_symlink() else None

    def police(self) -> list[str]:
        """Undo what is not the grader's in the output folder; say what, one line each."""
        events = []
        for path in sorted(self.out.rglob("*"), reverse=True):
            if path.is_dir() and not path.is_symlink():
                if not any(path.iterdir()) and not any(k.is_relative_to(path)
                                                       for k in self.known):
                    path.rmdir()
                continue
            if path not in self.known:
                events.append(f"{path.relative_to(self.out).as_posix()} appeared (removed)")
                path.unlink()
        for path, stat in sorted(self.known.items()):
            if self._stat(path) != stat:
                events.append(f"{path.relative_to(self.out).as_posix()} changed (restored)")
                if path.is_symlink():  # to a folder too: rmtree refuses a link
                    path.unlink()
                elif path.is_dir():
                    shutil.rmtree(path)
                path.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.vault / path.relative_to(self.out), path)
                self.known[path] = self._stat(path)
        return sorted(events)


# --- the whole run ----------------------------------------------------------------------------

def check_cell_problems(assignment: Assignment) -> list[str]:
    """Why the grader cannot grade a solution notebook's check cells (empty when it can)."""
    registry = F.load_checks()
    stem = Path(assignment.name).stem
    problems = []
    for check in assignment.checks:
        call = check.call
        chk = registry.get(call.check_id) if call is not None else None
        if call is None:
            why = ("not a one-line check(...) call; the grader decides points only from check "
                   "classes (docs/maintainers.md, 'Writing exercises')")
        elif call.check_id != check.cell_id:
            why = (f"calls check({call.check_id!r}); a check cell's id is the id of the check "
                   "it calls")
        elif chk is None:
            why = (f"no check class is registered as {call.check_id!r} "
                   "(transformer_lab/checks/nbNN_topic.py)")
        elif chk.notebook != stem:
            why = f"the check belongs to notebook {chk.notebook}"
        elif len(call.names) != len(chk.arguments):
            why = f"passes {len(call.names)} function(s), the check takes {len(chk.arguments)}"
        else:
            continue
        problems.append(f"{assignment.name}, check cell {check.cell_id!r}: {why}")
    return problems


def load_solutions(paths: list[Path]) -> tuple[dict[str, Assignment], dict[str, list[str]]]:
    """The solution notebooks the grader can grade (name -> assignment), and what stops it on
    each (name -> problems: its markers and metadata, else its check cells)."""
    good, problems = {}, {}
    for path in paths:
        try:
            good[path.stem] = parse_notebook(nbformat.read(path, as_version=4), str(path))
            problems[path.stem] = check_cell_problems(good[path.stem])
        except AssignmentError as err:
            problems[path.stem] = [str(err)]
        except Exception as err:  # not a notebook at all
            problems[path.stem] = [f"{path}: could not be read as a notebook ({err})"]
    return good, problems


def grade_all(grader: Grader, found: Found, notebooks: list[str], vault: Path,
              jobs: int = 1) -> list[Graded]:
    """Grade every student's every notebook, ``jobs`` at a time; a broken one never stops the
    others. The results come in the order of (student, notebook), whatever ``jobs`` is."""
    grader.ledger = Ledger(grader.out, vault)
    pairs = [(s, nb) for s in sorted(found.students) for nb in notebooks]

    def one(pair: tuple[str, str]) -> Graded:
        student, notebook = pair
        try:
            g = grade_submission(grader, found.students[student], notebook, found)
        except Exception as exc:  # a bug here must not cost the other students their grades
            reason = f"not graded: {type(exc).__name__}: {one_line(str(exc))}"
            g = not_graded(student, notebook, grader.assignments[notebook], reason,
                           "grading error")
        with grader.lock:
            events = grader.ledger.police()
        # with a sandbox, a student's code never sees the output folder; without one, and with
        # more than one job, a change may be another student's, graded at the same time
        where = "while this notebook was graded" + (
            " (or another graded at the same time)" if jobs > 1 else "")
        for event in events:
            g.flags.append(Flag("the grader's output folder", 0,
                                f"the grader's output folder changed {where}", event))
        return g

    results: dict[tuple[str, str], Graded] = {}
    with ThreadPoolExecutor(max_workers=max(jobs, 1), thread_name_prefix="grade") as pool:
        futures = {pool.submit(one, pair): pair for pair in pairs}
        try:
            for done, future in enumerate(as_completed(futures), 1):
                g = results[futures[future]] = future.result()
                parts = ", ".join(f"{name} {seconds:.1f}" for name, seconds in g.timing.items())
                print(f"[{done}/{len(pairs)}] {g.student} / {g.notebook}: "
                      f"{format_points(g.points)}/{format_points(g.max_points)} points, "
                      f"{g.status}" + (f" ({g.seconds:.1f} s: {parts})" if g.seconds else ""),
                      flush=True)
        except BaseException:  # Ctrl+C: what has not started yet is not graded
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return [results[pair] for pair in pairs]


@dataclass
class Options:
    """How a grading run goes (the command line's options)."""

    source: Path = Path("notebooks")
    project: Path = Path(".")
    timeout: int = DEFAULT_TIMEOUT
    case_timeout: float = DEFAULT_CASE_TIMEOUT
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT
    execute: bool = True
    jobs: int = 1
    sandbox: bool = True
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    notebooks: tuple[str, ...] = ()  # --notebooks: these only (empty: every one)
    #: the hidden cases in a probe process of their own, where their verdicts show later than
    #: the public ones' (Gradescope's --hidden-visibility): code run on a public case then
    #: cannot read their inputs and show them in a public failure (the probes take ~1.6x)
    hidden_apart: bool = False
    #: what the instructor runs in another course version's folder, to grade its notebooks
    command: str = "make grade"


class GradingError(Exception):
    """The run cannot start (bad solutions, no sandbox, ...); the message says why."""


class VersionError(GradingError):
    """The submissions were made from another course version: ``others`` ((student,
    notebook) -> the version it records, :func:`recorded_versions`) and ``ours`` say which;
    :meth:`sentence` what to do."""

    def __init__(self, others: dict[tuple[str, str], versions.CourseVersion],
                 ours: versions.CourseVersion):
        self.others, self.ours = others, ours
        super().__init__(self.sentence())

    def sentence(self, command: str = "make grade") -> str:
        """The refusal, telling the instructor to run ``command`` with the right version."""
        return versions.mismatch(self.others, self.ours, command)

    @property
    def several(self) -> bool:
        """Whether the submissions come from more than one other version (or commit)."""
        return len({(v.version, v.commit) for v in self.others.values()}) > 1


def recorded_versions(found: Found, ours: dict[str, versions.CourseVersion]) -> tuple[
        set[tuple[str, str]], dict[tuple[str, str], versions.CourseVersion], int]:
    """(the (student, notebook) pairs of the notebooks that record no course version, those
    that ``ours`` -- notebook -> this grader's version of it, for the notebooks graded -- does
    not grade -> the version they record, and how many record one)."""
    unversioned, others, versioned = set(), {}, 0
    for student, work in sorted(found.students.items()):
        for notebook, path in sorted(work.notebooks.items()):
            if notebook not in ours:  # not graded in this run (--notebooks)
                continue
            version = versions.notebook_version(path, MAX_NOTEBOOK_BYTES)
            if version is None:
                if _readable(path):  # an unreadable file gets its own verdict, not this note
                    unversioned.add((student, notebook))
                continue
            versioned += 1
            if not ours[notebook].grades(version):
                others[student, notebook] = version
    return unversioned, others, versioned


def _readable(path: Path) -> bool:
    """Whether ``path`` holds a notebook's JSON that the grader reads (of at most
    :data:`MAX_NOTEBOOK_BYTES`)."""
    try:
        return path.stat().st_size <= MAX_NOTEBOOK_BYTES and isinstance(
            json.loads(path.read_text(encoding="utf-8")), dict)
    except (OSError, ValueError, RecursionError):
        return False


class NoSandboxError(GradingError):
    """The run cannot start because no sandbox can be made here; ``reason`` says why."""

    def __init__(self, reason: str):
        super().__init__(f"no sandbox to run the students' code in: {reason}")
        self.reason = reason


def grade(submissions: Path, out: Path, options: Options) -> Outcome:
    """Grade ``submissions`` into ``out`` (see the module's docstring); raises
    :class:`GradingError` when it cannot start (:class:`VersionError` for submissions of
    another course version), before writing anything."""
    check_project(options.project)
    src = options.project / "src"
    inputs = {"SUBMISSIONS": submissions, "--source": options.source,
              "--project's src/": src}
    check_apart(out, "--out", inputs)  # --out is emptied: refuse it before reading
    course = {path.stem: path for path in solution_notebooks(options.source)}
    sources = {path.stem: path
               for path in solution_notebooks(options.source, list(options.notebooks))}
    try:
        instructor = parse_package(src / "transformer_lab")
    except PackageError as err:
        raise GradingError(f"the package has {len(err.problems)} problem(s) with its "
                           f"markers:\n{err}") from None
    assignments, problems = load_solutions(list(course.values()))
    ours = versions.project_version(options.project)
    of_notebook = {n: ours.of_notebook(src / "transformer_lab", assignments[n]) for n in sources
                   if n in assignments}
    first = find_submissions(submissions, sorted(course))
    unversioned, others, versioned = recorded_versions(first, of_notebook)
    if others and len(others) == versioned and not unversioned:  # all of another version
        raise VersionError(others, ours)
    handed_in = sorted({nb for w in first.students.values() for nb in w.notebooks}
                       & set(sources))
    errors = [p for n in handed_in for p in problems[n]]
    if errors:  # only the notebooks handed in need to be right
        raise GradingError(f"the solution notebooks cannot be graded, {len(errors)} "
                           "problem(s):\n" + "\n".join(errors))
    try:
        sandbox = find_sandbox(options.limits) if options.sandbox else NoSandbox()
    except SandboxUnavailable as err:
        raise NoSandboxError(str(err)) from None
    apply_kernel_env()
    # the references judge small arrays: one BLAS thread is faster, and steady on a busy machine
    # (with two, judging a student's 11 notebooks took from 2 to 12 s)
    limit_threads(1)
    try:
        with tempfile.TemporaryDirectory(prefix="grading-handout-") as tmp:
            from transformer_lab.course.student import write_student_tree

            handout = Path(tmp) / "handout"
            write_student_tree(list(assignments.values()), options.project, handout,
                               instructor)
            found = find_submissions(submissions, sorted(course), handout_digests(handout))
            _leave_out(found, set(sources), submissions)
            other_version = _leave_out_other_versions(found, of_notebook, others, submissions,
                                                      options.command)
            fresh_output_dir(out, "--out", inputs)
            grader = Grader({n: assignments[n] for n in handed_in}, instructor,
                            handout / "src", submissions, out,
                            ProbeLimits(options.timeout, options.case_timeout,
                                        options.probe_timeout),
                            execute=options.execute, sandbox=sandbox, version=ours,
                            hidden_apart=options.hidden_apart,
                            unversioned=unversioned)
            graded = grade_all(grader, found, handed_in, Path(tmp) / "vault", options.jobs)
    finally:
        sandbox.close()
    flags = flag_rows(graded, {student: core_flags(found.students[student], submissions)
                               for student in sorted(found.students)})
    write_reports(out, graded, found, flags, sandbox.describe())
    notes = [f"the notebooks of {', '.join(sorted({s for s, _ in unversioned}))} record no "
             f"course version (made by hand, or from a handout built before versions were "
             f"recorded): graded with this one, {ours}"] if unversioned else []
    if other_version:
        notes.append(f"not graded, made from another course version (skipped.csv says which "
                     f"and how to grade them): {other_version}")
    return Outcome(graded, found, flags, sandbox.describe(), notes)


def _leave_out(found: Found, chosen: set[str], submissions: Path) -> None:
    """Move the notebooks that this run does not grade (``--notebooks``) to the skipped files,
    saying so."""
    for work in found.students.values():
        for notebook in sorted(set(work.notebooks) - chosen):
            path = work.notebooks.pop(notebook)
            found.skipped.append(Skipped(work.name, path.relative_to(submissions).as_posix(),
                                         f"not graded: this run grades "
                                         f"{', '.join(sorted(chosen))} only (--notebooks)",
                                         deliberate=True))
    found.skipped.sort(key=lambda s: (s.student, s.path))


def _leave_out_other_versions(found: Found, ours: dict[str, versions.CourseVersion],
                              others: dict[tuple[str, str], versions.CourseVersion],
                              submissions: Path, command: str) -> str:
    """Move the notebooks of another course version (``others``, :func:`recorded_versions`)
    to the skipped files, each with the version that grades it (``ours``: notebook -> this
    grader's version of it, and ``command`` the one to run there); return whose they were ("" if
    none)."""
    for (student, notebook), version in others.items():
        path = found.students[student].notebooks.pop(notebook)
        how = versions.checkout(version, command)
        reason = (f"not graded: made from course version {version}, and this is "
                  f"{ours[notebook]}: grade it with that version -- {how}")
        found.skipped.append(Skipped(student, path.relative_to(submissions).as_posix(), reason))
        found.other_version[student, notebook] = reason
    found.skipped.sort(key=lambda s: (s.student, s.path))
    return ", ".join(f"{student} ({notebook})" for student, notebook in others)


def _gigabytes(text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of GiB, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of GiB, got {text}")
    return int(value * 2**30)


def add_time_limits(parser: argparse.ArgumentParser, feedback: bool = True) -> None:
    """The options --timeout, --case-timeout and --probe-timeout, in seconds, on ``parser``
    (``feedback``: the run executes the feedback notebooks too, which the cell's and the probe's
    limits bound as well)."""
    cell, probe = (", in the probe and in the feedback run", ", and its feedback run too") \
        if feedback else ("", "")
    for option, kind, default, what in (
            ("--timeout", int, DEFAULT_TIMEOUT, f"a notebook cell may run{cell}"),
            ("--case-timeout", float, DEFAULT_CASE_TIMEOUT, "one case of a check may run"),
            ("--probe-timeout", float, DEFAULT_PROBE_TIMEOUT,
             f"the probe of one notebook may run in all{probe}")):
        parser.add_argument(option, type=kind, default=default,
                            help=f"seconds {what} (default: {default})")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("submissions", type=Path,
                        help="folder of submissions: <student>/... (notebooks and "
                             "src/transformer_lab/core/*.py) or <student>_<NN_topic>.ipynb")
    parser.add_argument("--source", type=Path, default=Path("notebooks"),
                        help="folder of the solution notebooks (default: notebooks)")
    parser.add_argument("--project", type=Path, default=Path("."),
                        help="folder holding the instructor's src/ (default: the current folder)")
    parser.add_argument("--out", type=Path, default=Path("build/grades"),
                        help="folder for grades.csv, totals.csv, skipped.csv, flags.csv, "
                             "sandbox.csv and feedback/, emptied first (default: build/grades)")
    add_time_limits(parser)
    parser.add_argument("--notebooks", nargs="+", default=(), metavar="NN_topic",
                        help="grade these notebooks only (01_attention or 01), the files of "
                             "the others listed as skipped (default: every notebook)")
    parser.add_argument("--no-execute", action="store_true",
                        help="do not execute the feedback notebooks (faster; the grades do not "
                             "change)")
    parser.add_argument("--jobs", "-j", type=int, default=1,
                        help="notebooks graded at once (default: 1); the files written are "
                             "the same for every number")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="run the students' code WITHOUT a sandbox, with your permissions "
                             "(only where bubblewrap cannot run; said in every output)")
    limits = SandboxLimits()
    parser.add_argument("--memory", type=_gigabytes, default=limits.memory,
                        help=f"GiB of memory a student's sandbox may use (default: "
                             f"{limits.memory / 2**30:g})")
    parser.add_argument("--processes", type=int, default=limits.processes,
                        help=f"processes and threads a student's sandbox may run (default: "
                             f"{limits.processes})")
    return parser


def _options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Options:
    """The options of the parsed command line ``args``; ``parser.error`` on a bad value."""
    for name in ("timeout", "case_timeout", "probe_timeout"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be a positive number of seconds, "
                         f"got {getattr(args, name)}")
    for name, least in (("jobs", 1), ("processes", 8)):
        if getattr(args, name) < least:
            parser.error(f"--{name} must be a whole number of at least {least}, "
                         f"got {getattr(args, name)}")
    return Options(args.source, args.project, args.timeout, args.case_timeout,
                   args.probe_timeout, execute=not args.no_execute, jobs=args.jobs,
                   sandbox=not args.no_sandbox,
                   limits=SandboxLimits(memory=args.memory, processes=args.processes),
                   notebooks=tuple(args.notebooks))


def _grade_command(args: argparse.Namespace, several: bool) -> str:
    """The ``make grade`` line that grades these submissions, into the same folder, from
    another version's folder (its paths made absolute); of ``several`` versions, each gets a
    folder of its own, and an OUT of its own (a run empties its OUT)."""
    folders = ["SUBMISSIONS=<its folder>", "OUT=<a folder of its own>"] if several else [
        f"SUBMISSIONS={shlex.quote(str(Path(args.submissions).resolve()))}",
        f"OUT={shlex.quote(str(Path(args.out).resolve()))}"]
    words = ["make grade", *folders]
    if args.notebooks:
        words.append(f"NOTEBOOKS={shlex.quote(' '.join(args.notebooks))}")
    return " ".join(words)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    # a student's folder name need not be UTF-8: print its bytes as escapes, never fail
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")
    options = _options(parser, args)
    try:
        outcome = grade(args.submissions, args.out, options)
    except VersionError as err:  # the command to run in the other version's folder, in full
        print(f"error: {err.sentence(_grade_command(args, err.several))}", file=sys.stderr)
        return 1
    except GradingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print_summary(outcome, args.out, sandboxed=options.sandbox)
    return 0


if __name__ == "__main__":
    sys.exit(main())
