"""Test helpers for the handout (`make student`): build it, complete its core, run its notebooks.

    handout = build_handout(tmp_path / "handout")                     # as students get it
    handout = build_handout(tmp_path / "complete", complete_core=True)  # + the reference core
    cells = execute_handout_notebook(handout, "01_attention.ipynb")
    first_error(cells)  # the first cell that failed, and how

Notebooks run in a fresh kernel started in the handout's ``notebooks/`` folder, with the
handout's ``src/`` first on ``PYTHONPATH``: the kernel imports the handout's package (the
student's core), never the project's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

from transformer_lab import syllabus
from transformer_lab.course import student

ROOT = Path(__file__).resolve().parents[1]
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def build_handout(dest: Path, complete_core: bool = False, source: Path | None = None,
                  project: Path | None = None) -> Path:
    """`make student` into ``dest``; with ``complete_core``, the project's own core modules are
    then dropped into the handout's package (a student who wrote every core function)."""
    project = project or ROOT
    status = student.main(["--source", str(source or project / "notebooks"), "--out", str(dest),
                           "--project", str(project)])
    assert status == 0, "make student failed"
    if complete_core:
        for path in sorted((project / "src" / "transformer_lab" / "core").glob("*.py")):
            shutil.copy(path, dest / "src" / "transformer_lab" / "core" / path.name)
    return dest


def handout_env(handout: Path) -> dict[str, str]:
    """This process's environment with the handout's ``src/`` first on ``PYTHONPATH``."""
    from transformer_lab.course.kernel_env import with_pythonpath

    return {**with_pythonpath(dict(os.environ), (handout / "src").resolve()),
            "PYTHONDONTWRITEBYTECODE": "1"}


@dataclass
class CellRun:
    """One code cell as executed: its id, whether it ran, its first error (None if none)."""

    cell_id: str
    ran: bool
    ename: str | None = None
    evalue: str | None = None
    is_check: bool = False
    check_takes_notebook_functions: bool = False  # a one-line check of a notebook exercise

    @property
    def failed(self) -> bool:
        return self.ename is not None


def execute_handout_notebook(handout: Path, name: str, timeout: int = 600,
                             stop_at_first_error: bool = False) -> list[CellRun]:
    """Run ``handout/notebooks/<name>`` top to bottom in a fresh kernel on the handout's
    package; the first error of each code cell. With ``stop_at_first_error`` the run stops at the
    first failing cell (the later cells come back with ``ran=False``)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    from transformer_lab.checks import framework as F
    from transformer_lab.course.assignment import is_check, parse_check_call
    from transformer_lab.course.kernel_env import client_options

    path = handout / "notebooks" / name
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, allow_errors=not stop_at_first_error,
                            **client_options(path.parent.resolve()))
    try:
        client.execute(env=handout_env(handout))
    except CellExecutionError:
        pass  # the failing cell keeps its error output
    registry = F.load_checks()
    runs = []
    for cell in nb.cells:
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        call = parse_check_call(cell.source) if is_check(cell) else None
        takes = bool(call and call.check_id in registry and registry[call.check_id].arguments)
        errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
        run = CellRun(cell.id, cell.get("execution_count") is not None, is_check=is_check(cell),
                      check_takes_notebook_functions=takes)
        if errors:
            run.ename = errors[0].ename
            run.evalue = _ANSI.sub("", errors[0].evalue)
        runs.append(run)
    return runs


def first_error(runs: list[CellRun]) -> CellRun | None:
    return next((r for r in runs if r.failed), None)


def stub_messages() -> dict[str, str]:
    """function -> the message of its stub in the handout."""
    return {name: syllabus.stub_message(name) for functions in syllabus.TAUGHT_IN.values()
            for name in functions}


def is_core_stub_error(run: CellRun) -> str | None:
    """The core function whose stub raised in ``run`` (NotImplementedError, or a check failing
    with the stub's message), or None."""
    if run.ename not in ("NotImplementedError", "CheckFailed"):
        return None
    return next((name for name, message in stub_messages().items()
                 if message in (run.evalue or "")), None)


def is_exercise_stub_error(run: CellRun) -> bool:
    """Whether ``run`` failed on a notebook exercise's stub (``Exercise: ...``)."""
    return run.ename in ("NotImplementedError", "CheckFailed") and \
        "Exercise: " in (run.evalue or "")


def run_trainer(handout: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m transformer_lab.train ARGS`` on the handout's package, from an empty folder."""
    cwd = handout / "trainer-run"
    cwd.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "transformer_lab.train", *args], cwd=cwd,
                          env=handout_env(handout), capture_output=True, text=True,
                          timeout=timeout)


def run_in_handout_package(tmp: Path, stub_core_module: str, script: str) -> str:
    """Run ``script`` (Python source) against the package as the handout copies it -- no course
    tools -- with the core module ``stub_core_module`` (e.g. "blocks")
    stubbed as ``make student`` stubs it; returns its stdout (a failure fails the test)."""
    from transformer_lab.course import package, versions

    source = ROOT / "src" / "transformer_lab"
    shutil.copytree(source.parent, tmp / "src", ignore=package._ignore(source))
    stubbed = package.parse_package(source).core[stub_core_module].stubbed()
    (tmp / "src" / "transformer_lab" / "core" / f"{stub_core_module}.py").write_text(stubbed)
    (tmp / "src" / "transformer_lab" / versions.BUILT).write_text(  # the handout's syllabus
        versions.built_module(versions.UNKNOWN, source))
    env = {**os.environ, "PYTHONPATH": str(tmp / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def check_as_in_handout(check_id: str, tmp_path: Path, monkeypatch):
    """Register the check ``check_id`` as the handout holds it: no reference, no hidden cases,
    no mistakes -- their answers for the public cases stored in ``tmp_path`` by
    ``store_expected``, as ``make student`` stores them. Returns the stripped class."""
    from transformer_lab.checks import framework as F

    cls = F.load_checks()[check_id]
    F.store_expected(cls(), tmp_path)

    class Stripped(cls):  # what the handout's module holds
        expected = F.Check.expected
        hidden_cases = F.Check.hidden_cases
        mistakes = F.Check.mistakes

    monkeypatch.setattr(F, "DATA_DIR", tmp_path)
    monkeypatch.setitem(F.REGISTRY, check_id, Stripped)
    assert not Stripped.has_reference()
    return Stripped
