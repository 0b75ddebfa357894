"""The probe's driver, the grader's side of the probe (the side that runs in the sandbox:
:mod:`.probe_runner`); what the probe is and does: docs/instructors.md, "Grading", steps 1-3.

:func:`build_probe_package` writes the probe package of notebook N from the HANDOUT form of the
instructor's package (:func:`owner`: whose each core function is there), on which the feedback
notebook runs; :func:`reference_free` makes the probe's copy; :func:`run_probe` runs it, killing
it at its limits, and decodes the outcomes it wrote as plain data for the grader to judge.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from transformer_lab import syllabus
from transformer_lab.checks import framework as F
from transformer_lab.course import probe_runner as runner
from transformer_lab.course.kernel_env import KERNEL_ENV
from transformer_lab.course.package import (
    Package,
    StudentCode,
    compose_core_module,
    notebook_number,
    student_code,
    top_level_names,
    without_references,
)
from transformer_lab.course.sandbox import (
    DISK_BYTES,
    Mounts,
    NoSandbox,
    binary_size,
    disk_bytes,
    kill_group,
)

RUNNER = Path(runner.__file__).resolve()
#: Environment variables the probe keeps from the grader's; the rest is left out.
_KEPT_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TEMP", "TMP", "SYSTEMROOT",
             "USERPROFILE")
#: The largest outcome file read back (a student's function may return anything), and the
#: most read back from one probe in all (the grader holds them until it judges them).
MAX_OUTCOME_BYTES = 64 * 2**20
MAX_OUTCOMES_BYTES = 256 * 2**20
#: The most of the probe's progress file read (a line per cell and case).
MAX_PROGRESS_BYTES = 10_000_000


@dataclass(frozen=True)
class ProbeLimits:
    """Seconds: a notebook cell, one case of a check, the whole probe (restarts included)."""

    cell: float = 60
    case: float = 30
    total: float = 600


# --- the probe package ----------------------------------------------------------------------

@dataclass
class Overlay:
    """What went into a probe package: whose each core function is, and the problems."""

    students: list[str] = field(default_factory=list)  # the student's functions in it
    stubs: dict[str, str] = field(default_factory=dict)  # N's functions left stubs -> why


def owner(function: str, notebook: str) -> str:
    """Whose version of a core function the probe package of ``notebook`` holds: "student"
    (``notebook`` teaches it), "instructor" (an earlier notebook teaches it) or "stub"."""
    module, _ = syllabus.where_taught(function)
    places = [p.split(" §")[0] for p in syllabus.TAUGHT_IN[module][function]]
    if notebook in places:
        return "student"
    numbers = [n for n in map(notebook_number, places) if n is not None]
    here = notebook_number(notebook)
    if here is not None and numbers and min(numbers) < here:
        return "instructor"
    return "stub"


def student_functions(core_files: dict[str, Path] | None, module: str, wanted: list[str],
                      provided: set[str], core_label: str) -> StudentCode:
    """The student's definitions of the functions ``wanted`` of the core module ``module``
    (:func:`student_code`), from their file of that module."""
    label = f"{core_label}/{module}.py"
    path = (core_files or {}).get(module)
    if core_files is None:
        why = "no core files were handed in (src/transformer_lab/core/*.py)"
    elif path is None:
        why = f"{label} was not handed in"
    else:
        try:
            return student_code(path.read_text(encoding="utf-8"), wanted, provided, label)
        except (OSError, UnicodeDecodeError) as err:
            why = f"{label} could not be read ({type(err).__name__})"
    return StudentCode({}, [], dict.fromkeys(wanted, why))


def build_probe_package(handout_src: Path, instructor: Package, notebook: str,
                        core_files: dict[str, Path] | None, dest: Path,
                        core_label: str = "src/transformer_lab/core") -> Overlay:
    """Write the probe package of ``notebook`` into ``dest/transformer_lab``.

    handout_src: the handout's source folder (holding ``transformer_lab/``); instructor: the
    parsed instructor's package; core_files: the student's core modules by name (None: none
    handed in).
    """
    shutil.copytree(handout_src / "transformer_lab", dest / "transformer_lab")
    overlay = Overlay()
    taught = syllabus.notebook_functions(notebook)
    for module, core in instructor.core.items():
        stub_path = dest / "transformer_lab" / "core" / core.path.name
        stub = stub_path.read_text()
        definitions = {name: core.definition(name) for name in core.functions
                       if owner(name, notebook) == "instructor"}
        composed = None
        wanted = taught.get(module, [])
        if wanted:
            # the module's own names (its functions, and constants such as ACTIVATIONS, which
            # refer to them) come from the package, never from the student's file
            provided = set(core.functions) | top_level_names(stub)
            code = student_functions(core_files, module, wanted, provided, core_label)
            reasons = code.problems
            try:
                composed = compose_core_module(stub, {**definitions, **code.functions},
                                               code.extras)
            except SyntaxError as err:  # cannot happen with parsed parts; be safe
                reasons = {name: f"{core_label}/{module}.py: your code could not be put "
                                 f"together with the package ({err.msg})" for name in wanted}
            for name in wanted:
                if name in reasons:
                    overlay.stubs[name] = reasons[name]
                else:
                    overlay.students.append(name)
        stub_path.write_text(composed or compose_core_module(stub, definitions), encoding="utf-8")
    return overlay


def reference_free(dest: Path) -> None:
    """Turn the package in ``dest/transformer_lab`` (a copy of the handout form) into the
    probe's: no method of a check computes an answer, no stored answers."""
    checks = dest / "transformer_lab" / "checks"
    for path in sorted(checks.glob("nb*.py")):
        path.write_text(_without_references(path.read_text(encoding="utf-8")), encoding="utf-8")
    shutil.rmtree(checks / "data", ignore_errors=True)


#: :func:`without_references`, once per check module and grading run (every probe package has
#: the same check modules; parsing them took 2.4 of the 3.1 s of a student's 11 probe packages).
_without_references = functools.lru_cache(maxsize=64)(without_references)


# --- running the probe ----------------------------------------------------------------------

@dataclass
class CheckSpec:
    """One check for the probe: its id, the notebook names its check cell passes, its cases,
    of which the first ``public`` are public (None: all)."""

    check_id: str
    args: tuple[str, ...]
    kwargs: dict[str, str]
    cases: list[F.Case]
    public: int | None = None


@dataclass
class ProbeReport:
    """What came back: outcomes by (check id, case name), why evidence is missing per check,
    the first error of each cell the probe ran."""

    outcomes: dict[tuple[str, str], F.Outcome] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    cells: list[tuple[str, str | None]] = field(default_factory=list)
    read_bytes: int = 0  # of outcome files read back, every run of the probe together


def probe_env(sandboxed: bool = False) -> dict[str, str]:
    """The probe's environment: reproducibility, one thread, and -- outside a sandbox, which
    has its own -- a few of the grader's variables."""
    env = {} if sandboxed else {k: v for k, v in os.environ.items() if k in _KEPT_ENV}
    env.update(KERNEL_ENV)
    env.update(PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               MKL_NUM_THREADS="1", MPLBACKEND="Agg", PYTHONIOENCODING="utf-8")
    return env


def run_probe(package_root: Path, cells: list[tuple[str, str]], checks: list[CheckSpec],
              limits: ProbeLimits | None = None, sandbox=None) -> ProbeReport:
    """Run the probe on ``package_root`` (the folder holding the probe's ``transformer_lab``):
    ``cells`` (id, source) first, then every case of ``checks``, in ``sandbox`` (see
    :mod:`.sandbox`; None: none), which shows it the package read-only and its request and
    results folders. Never raises for what the student's code does.

    Where a check says how many of its cases are public, the hidden ones run in another process:
    the code that runs on the public cases never sees the hidden ones' inputs (whose verdicts,
    on Gradescope, may show later than the public ones')."""
    limits = limits or ProbeLimits()
    sandbox = sandbox or NoSandbox()
    report = ProbeReport()
    deadline = time.monotonic() + limits.total
    public = [dataclasses.replace(c, cases=c.cases[:c.public]) for c in checks]
    cells = _probe(package_root, cells, public, limits, deadline, report, sandbox)
    hidden = [dataclasses.replace(c, cases=c.cases[c.public:]) for c in checks
              if c.public is not None and c.cases[c.public:] and c.check_id not in report.missing]
    if hidden:  # the cells again, in a process of its own (their errors: the first run's)
        _probe(package_root, cells, hidden, limits, deadline, report, sandbox)
    for spec in checks:
        if spec.check_id in report.missing:
            continue
        lost = [c.name for c in spec.cases if (spec.check_id, c.name) not in report.outcomes]
        if lost:
            report.missing[spec.check_id] = (f"no result came back for case {lost[0]!r}: the "
                                             "grader's run of your code ended before it")
    return report


def _probe(package_root: Path, cells, checks: list[CheckSpec], limits: ProbeLimits,
           deadline: float, report: ProbeReport, sandbox) -> list:
    """Run ``checks`` in probe processes until they are done, into ``report``: one process,
    and another for those left after a case that stopped it, or after a cell that did
    without that cell (the checks of what it defines lose their evidence, the others keep
    theirs), within the ``deadline``. Returns the cells the last process ran."""
    todo = [i for i, c in enumerate(checks) if c.cases]
    ended = {}  # a cell that stopped its run -> why (later runs do without it)
    while todo:
        with tempfile.TemporaryDirectory(prefix="probe-", ignore_cleanup_errors=True) as tmp:
            stopped, cell_errors = _one_run(Path(tmp), package_root, cells, checks, todo,
                                            limits, deadline, report, sandbox)
        report.cells = report.cells or cell_errors  # the first run's (the same cells each run)
        if stopped is None:  # the probe finished (or said why not): no second chance
            break
        todo = [i for i in todo if checks[i].check_id not in report.missing
                and not all((checks[i].check_id, c.name) in report.outcomes
                            for c in checks[i].cases)]
        kind, index, reason = stopped
        if kind == "cell" and index is not None and time.monotonic() < deadline:
            try:
                defined = top_level_names(cells[index][1])
            except SyntaxError:  # a cell that does not parse defines nothing
                defined = set()
            for i in todo:
                if defined & {*checks[i].args, *checks[i].kwargs.values()}:
                    report.missing.setdefault(checks[i].check_id, reason)
            todo = [i for i in todo if checks[i].check_id not in report.missing]
            ended[cells[index][0]] = reason
            cells = [*cells[:index], *cells[index + 1:]]
            continue
        if kind == "case":  # the others get another run, within the total limit
            report.missing.setdefault(checks[index].check_id, reason)
            todo = [i for i in todo if i != index]
            if time.monotonic() < deadline:
                continue
            reason = (f"not run: the grader's run of your code reached its total limit of "
                      f"{limits.total:g} s")
        for i in todo:  # what is left cannot run: the total limit passed
            report.missing.setdefault(checks[i].check_id, reason)
        break
    report.cells = [(cid, ended.get(cid, error)) for cid, error in report.cells]
    return cells


def _one_run(tmp: Path, package_root: Path, cells, checks: list[CheckSpec], todo: list[int],
             limits: ProbeLimits, deadline: float, report: ProbeReport, sandbox):
    """One probe process over the checks ``todo``; returns (what it stopped during, or None
    when it ended by itself; the cells' errors)."""
    out, cwd, inputs = tmp / "out", tmp / "work", tmp / "in"  # in: what the probe reads
    for folder in (out, cwd, inputs):
        folder.mkdir()
    arrays: dict[str, np.ndarray] = {}
    request = {"package": str(package_root.resolve()),
               "cells": [{"id": cid, "source": src} for cid, src in cells],
               "checks": [F.encode({"index": i, "id": checks[i].check_id,
                                    "module": _module_of(checks[i]),
                                    "args": list(checks[i].args), "kwargs": checks[i].kwargs,
                                    "cases": [{"name": c.name, "args": list(c.args),
                                               "kwargs": c.kwargs} for c in checks[i].cases]},
                                   arrays) for i in todo]}
    shutil.copyfile(RUNNER, inputs / RUNNER.name)
    (inputs / "request.json").write_text(json.dumps(request), encoding="utf-8")
    with open(inputs / "request.npz", "wb") as f:
        np.savez(f, **arrays)
    env = probe_env(sandbox.isolated)
    mounts = Mounts(read_only=(package_root.resolve(), inputs), writable=(out, cwd), cwd=cwd,
                    env=tuple(env.items()))
    argv = sandbox.command([sys.executable, "-s", str(inputs / RUNNER.name), str(tmp)], mounts)
    # what the student's code prints is not kept: the cells' errors come back in files
    proc = subprocess.Popen(argv, cwd=cwd, env=sandbox.environment(mounts),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    progress = out / runner.PROGRESS
    current, since, seen, measured, furthest = None, time.monotonic(), 0, 0.0, (-1,)
    stopped = None
    try:
        while proc.poll() is None:
            time.sleep(0.05)
            now = time.monotonic()
            if now - measured > 0.5:
                measured = now
                if disk_bytes((out, cwd), DISK_BYTES, proc.pid) > DISK_BYTES:
                    stopped = _stop(_unit(current, cells, checks),
                                    f"held more than {binary_size(DISK_BYTES)} of files: the "
                                    "grader stopped it")
                    break
            text = read_regular(progress, seen, MAX_PROGRESS_BYTES) or b""
            if b"\n" in text:
                lines = text[:text.rindex(b"\n")].decode("utf-8", "replace").split("\n")
                seen += text.rindex(b"\n") + 1
                # the clock restarts on a step further on only: the student's code writes
                # into this file too, and a line again (or garbage) must not restart it
                step = max(lines, key=lambda line: _step(line, cells, checks))
                if _step(step, cells, checks) > furthest:
                    current, since, furthest = step, now, _step(step, cells, checks)
            unit = _unit(current, cells, checks)
            # a cell's limit for the cells and the start; a case's for the cases and the
            # moments between ("setup done", "done": the runner moves on at once)
            limit = limits.cell if (unit[0] == "cell" if unit else current is None) \
                else limits.case
            over = (f"the grader's run of your code reached its total limit of "
                    f"{limits.total:g} s" if now >= deadline else
                    f"ran past the time limit of {limit:g} s" if now - since > limit
                    else None)  # between the steps too: "setup done" or "done" written early
            if over:
                stopped = _stop(unit, over + _during(unit, cells, checks))
                break
    finally:
        kill_group(proc.pid, proc)  # its own session: its group's id is its pid
        proc.wait()
        sandbox.release(argv)
    lines = (read_regular(progress, 0, MAX_PROGRESS_BYTES) or b"").decode(
        "utf-8", "replace").split("\n")
    last = next((line for line in reversed(lines) if line.strip()), None)
    if stopped is None and last != runner.DONE:
        unit = _unit(last, cells, checks)
        fatal = _read_json(out / runner.FATAL)
        why = fatal.get("error") if isinstance(fatal, dict) else None
        code = proc.returncode
        how = f"was killed by signal {-code}" if code and code < 0 else f"exited (status {code})"
        stopped = _stop(unit, why or f"the grader's run of your code {how}"
                                     f"{_during(unit, cells, checks)} -- your code ended the "
                                     "process (exit, os._exit) or crashed it")
    cell_errors = _read_cells(out, cells)
    _collect(out, checks, todo, report)
    return stopped, cell_errors


def _module_of(spec: CheckSpec) -> str:
    """The check's module, transformer_lab.checks.nbNN_topic ("": the probe imports them all)."""
    try:
        return type(F.get_check(spec.check_id)).__module__
    except KeyError:
        return ""


def _step(line: str, cells, checks) -> tuple:
    """How far the probe is at a progress line: cells, then each check's import and cases in
    order, then the end; (-1,) for a line the runner does not write."""
    if line == runner.SETUP:
        return (1,)
    if line == runner.DONE:
        return (3,)
    unit = _unit(line, cells, checks)
    if unit is None:
        return (-1,)
    return (0, unit[1]) if unit[0] == "cell" else (2, unit[1], -1 if unit[2] is None
                                                   else unit[2])


def _stop(unit, reason: str) -> tuple[str, int | None, str]:
    """(kind, index, reason): "case" and the check's index, or "cell" and the cell's."""
    return (unit[0], unit[1], reason) if unit else ("cell", None, reason)


def _unit(line: str | None, cells, checks):
    """("cell", k) or ("case", check index, case index) from a progress line."""
    if not line:
        return None
    parts = line.split()
    with contextlib.suppress(ValueError):
        if parts[0] == "cell" and len(parts) == 2 and 0 <= int(parts[1]) < len(cells):
            return ("cell", int(parts[1]))
        if parts[0] == "case" and len(parts) == 3:
            i, j = int(parts[1]), int(parts[2])
            if 0 <= i < len(checks) and 0 <= j < len(checks[i].cases):
                return ("case", i, j)
        if parts[0] == "prepare" and len(parts) == 2 and 0 <= int(parts[1]) < len(checks):
            return ("case", int(parts[1]), None)
    return None


def _during(unit, cells, checks) -> str:
    if not unit:
        return ""
    if unit[0] == "cell":
        return f", while running your cell {cells[unit[1]][0]!r}"
    if unit[2] is None:
        return f", while importing the functions {checks[unit[1]].check_id} tests"
    return f", in case {checks[unit[1]].cases[unit[2]].name!r}"


def read_regular(path: Path, offset: int = 0, limit: int = 10_000_000) -> bytes | None:
    """At most ``limit`` bytes from ``offset`` of ``path`` if it is a regular file -- never
    through a link, never from a pipe or a device (the student's code wrote the folder: a
    link to /dev/zero or a FIFO there must not hang or flood the grader); None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) |
                     getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        os.lseek(fd, offset, os.SEEK_SET)
        chunks, left = [], limit
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_json(path: Path):
    data = read_regular(path, 0, 10_000_001)
    if data is None or len(data) > 10_000_000:
        return None
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError:
        return None


def _plain_npz(path: Path) -> bool:
    """Whether ``path`` is a regular file holding an npz as :func:`framework.save_values`
    writes it: members stored, not compressed (no zip bomb), at most MAX_OUTCOME_BYTES."""
    import zipfile

    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_OUTCOME_BYTES:
            return False
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
        return all(m.compress_type == zipfile.ZIP_STORED for m in members) and \
            sum(m.file_size for m in members) <= MAX_OUTCOME_BYTES
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


def _read_cells(out: Path, cells) -> list[tuple[str, str | None]]:
    found = _read_json(out / runner.CELLS)
    ids = [cid for cid, _ in cells]
    errors = {}
    if isinstance(found, list):
        for entry in found:
            if isinstance(entry, dict) and entry.get("id") in ids:
                error = entry.get("error")
                errors[entry["id"]] = str(error)[:500] if error is not None else None
    return [(cid, errors.get(cid, "not run")) for cid in ids]


def _collect(out: Path, checks: list[CheckSpec], todo: list[int], report: ProbeReport) -> None:
    """Decode the outcomes the probe wrote; garbage counts as no evidence."""
    for i in todo:
        spec = checks[i]
        problem = _read_json(out / runner.check_file(i))
        if isinstance(problem, dict) and isinstance(problem.get("error"), str):
            report.missing.setdefault(spec.check_id, problem["error"][:500])
            continue
        for j, case in enumerate(spec.cases):
            path = out / runner.case_file(i, j)
            if not path.exists() and not path.is_symlink() or \
                    (spec.check_id, case.name) in report.outcomes:
                continue
            with contextlib.suppress(OSError):
                report.read_bytes += os.lstat(path).st_size
            if report.read_bytes > MAX_OUTCOMES_BYTES:
                report.missing.setdefault(spec.check_id, (
                    f"the result of case {case.name!r} was not read back: your functions' "
                    f"results took more than {binary_size(MAX_OUTCOMES_BYTES)} in all"))
                continue
            outcome = _read_outcome(path, spec.check_id, case.name)
            if outcome is None:
                report.missing.setdefault(spec.check_id, f"the result of case {case.name!r} "
                                                         "could not be read back")
            else:
                report.outcomes[spec.check_id, case.name] = outcome


def _read_outcome(path: Path, check_id: str, case_name: str) -> F.Outcome | None:
    try:
        if not _plain_npz(path):
            return None
        record = F.load_values(path)["outcome"]
        if record["check"] != check_id or record["case"] != case_name:
            return None
        value, error = record["value"], record["error"]
        if error is not None and not isinstance(error, str):
            return None
        if record.get("unplain"):  # read by the check, but not sent back: an error of its own
            value, error = None, f"{F.UNREADABLE}: {record['unplain']}"
        return F.Outcome(value=value, error=error, where=str(record.get("where") or ""),
                         after=tuple(record.get("after") or ()),
                         after_kwargs=dict(record.get("after_kwargs") or {}))
    except Exception:  # anything the student's process wrote that is not what we wrote
        return None
