"""Applying a mutant of the mutation catalogue (``tests/mutants.py``) and running checks on it.

A mutant is a small textual edit of one solution: the body of a core function between its
solution markers, or a notebook exercise's solution cell. It runs the way a student's code
runs:

- a core mutant: every module of ``transformer_lab.core`` is executed afresh from its source,
  the mutated one with the edit, so that the mutated function is also what the other core
  functions call (``transformer_encode`` calls the mutated ``encoder_forward``); the check then
  finds its core functions there (``framework.core_function`` looks there for the duration), and
  its references (PyTorch, the package's own modules) are left as they are;
- an exercise mutant: like the grader's probe, the notebook's first code cell, the definitions
  (functions, classes, imports) of its other cells and the exercise cell, with the edit, are
  executed in a fresh namespace; the check gets the exercise's function from there.

The check's cases are then run and judged as the check cell (``framework.check``) and the grader
judge them: the public cases (salt "notebook"), and the grader's cases (salt "grader", public and
hidden).
"""

from __future__ import annotations

import ast
import copy
import functools
import linecache
import sys
import types
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import nbformat

from transformer_lab import syllabus
from transformer_lab.checks import framework as F
from transformer_lab.checks import load_checks

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "src" / "transformer_lab" / "core"
NOTEBOOKS = ROOT / "notebooks"
BEGIN, END = "### BEGIN " + "SOLUTION", "### END " + "SOLUTION"  # not a marker line here


def _core_order() -> tuple[str, ...]:
    """The core modules in an order where every module comes after the ones it imports."""
    imports = {}
    for path in sorted(CORE.glob("*.py")):
        if path.stem != "__init__":
            imports[path.stem] = {node.module.rpartition(".")[2]
                                  for node in ast.walk(ast.parse(path.read_text()))
                                  if isinstance(node, ast.ImportFrom) and node.module
                                  and node.module.startswith("transformer_lab.core.")}
    order: list[str] = []

    def visit(module: str) -> None:
        if module not in order:
            for needed in sorted(imports[module]):
                visit(needed)
            order.append(module)

    for module in imports:
        visit(module)
    return tuple(order)


CORE_ORDER = _core_order()


class MutantError(AssertionError):
    """A catalogue entry that does not apply (its snippet is missing or not unique)."""


def replace_once(text: str, old: str, new: str, where: str) -> str:
    count = text.count(old)
    if count != 1:
        raise MutantError(f"{where}: the snippet occurs {count} times, not once:\n{old}")
    return text.replace(old, new)


def solution_region(lines: list[str], start: int, end: int, where: str) -> tuple[int, int]:
    """(first, last) line indexes strictly inside the solution markers within lines[start:end]."""
    marks = [i for i in range(start, end) if lines[i].strip().startswith((BEGIN, END))]
    if len(marks) != 2:
        raise MutantError(f"{where}: expected one solution region, found {len(marks)} markers")
    return marks[0] + 1, marks[1]


def edit_region(source: str, start: int, end: int, old: str, new: str, where: str) -> str:
    """``source`` with ``old`` replaced by ``new`` inside the solution region of its lines
    start..end (0-based, end excluded)."""
    lines = source.split("\n")
    first, last = solution_region(lines, start, end, where)
    body = "".join(line + "\n" for line in lines[first:last])
    lines[first:last] = replace_once(body, old, new, where).split("\n")[:-1]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Core mutants


def function_lines(source: str, name: str, where: str) -> tuple[int, int]:
    """The 0-based lines of a top-level function, up to the next top-level statement (a
    trailing comment such as a closing marker included)."""
    body = ast.parse(source).body
    for k, node in enumerate(body):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            end = body[k + 1].lineno - 1 if k + 1 < len(body) else len(source.split("\n"))
            return node.lineno - 1, end
    raise MutantError(f"{where}: no top-level function {name!r}")


def mutated_core_source(function: str, old: str, new: str) -> tuple[str, str]:
    """(core module, its source with the edit in ``function``'s solution region)."""
    module, _ = syllabus.where_taught(function)
    source = (CORE / f"{module}.py").read_text()
    start, end = function_lines(source, function, function)
    return module, edit_region(source, start, end, old, new, function)


def fresh_core(mutated: dict[str, str] | None = None) -> dict[str, types.ModuleType]:
    """Every core module executed afresh (``mutated``: module -> the source to use instead of
    its file), each importing the fresh copies of the ones before it."""
    mutated = mutated or {}
    fresh: dict[str, types.ModuleType] = {}
    names = [f"transformer_lab.core.{m}" for m in CORE_ORDER]
    saved = {n: sys.modules.get(n) for n in names}
    try:
        for module in CORE_ORDER:
            path = CORE / f"{module}.py"
            name = f"transformer_lab.core.{module}"
            mod = types.ModuleType(name)
            mod.__file__ = str(path)
            sys.modules[name] = mod  # the modules after it import this one
            code = compile(mutated.get(module, path.read_text()), str(path), "exec")
            exec(code, mod.__dict__)  # noqa: S102 -- the course's own source
            if module in mutated:
                mod._mutated_source = mutated[module]  # what core_from shows inspect
            fresh[module] = mod
    finally:
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod
    return fresh


# --------------------------------------------------------------------------------------------
# Exercise mutants


@functools.cache
def notebook(name: str):
    return nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)


def exercise_cells(name: str) -> list[str]:
    """The ids of the notebook's exercise cells (nbgrader solution cells)."""
    return [c.id for c in notebook(name).cells
            if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")]


def _definitions(source: str) -> str:
    try:
        tree = ast.parse(source)
    except SyntaxError:  # IPython syntax: nothing to define
        return ""
    kinds = (ast.FunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)
    return "\n\n".join(ast.get_source_segment(source, n) or "" for n in tree.body
                       if isinstance(n, kinds))


def exercise_namespace(name: str, cell_id: str, old: str | None = None,
                       new: str | None = None) -> dict:
    """What the grader's probe runs of notebook ``name``, with the edit in the exercise cell
    ``cell_id``: the first code cell, the other cells' definitions, the exercise cells."""
    nb = notebook(name)
    checks = set(load_checks())
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    exercises = set(exercise_cells(name))
    if cell_id not in exercises:
        raise MutantError(f"{name}: no exercise cell {cell_id!r}")
    namespace: dict = {"__name__": "__main__"}
    for k, cell in enumerate(code):
        if cell.id in checks:
            continue
        source = cell.source
        if cell.id == cell_id and old is not None:
            lines = source.split("\n")
            source = edit_region(source, 0, len(lines), old, new, f"{name}/{cell_id}")
        if k and cell.id not in exercises:
            source = _definitions(source)
        filename = f"<{name}/{cell.id}>"  # its source readable, as IPython keeps a cell's
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102
    return namespace


# --------------------------------------------------------------------------------------------
# Running a check as the check cell and the grader do


@contextmanager
def core_from(modules: dict[str, types.ModuleType] | None):
    """``framework.core_function`` finds the core functions in ``modules`` meanwhile, and
    ``inspect.getsource`` (the loop rule's reader) reads a mutated module's source, not its
    file's."""
    if modules is None:
        yield
        return
    original, saved = F.core_function, {}

    def core_function(name: str) -> Callable:
        module, _ = syllabus.where_taught(name)
        return getattr(modules[module], name)

    for mod in modules.values():
        source = getattr(mod, "_mutated_source", None)
        if source is not None:  # an entry without a time: linecache.checkcache keeps it
            saved[mod.__file__] = linecache.cache.get(mod.__file__)
            linecache.cache[mod.__file__] = (len(source), None, source.splitlines(True),
                                             mod.__file__)
    F.core_function = core_function
    try:
        yield
    finally:
        F.core_function = original
        for path, entry in saved.items():
            if entry is None:
                linecache.cache.pop(path, None)
            else:
                linecache.cache[path] = entry


@functools.cache
def cases(check_id: str, salt: str, hidden: bool) -> tuple[F.Case, ...]:
    return tuple(F.all_cases(F.get_check(check_id), salt=salt, hidden=hidden))


_EXPECTED: dict[tuple[str, str, str], object] = {}


def expected(check_id: str, salt: str, case: F.Case):
    """The check's answer for a case, computed once (as the grader does, on copies)."""
    key = (check_id, salt, case.name)
    if key not in _EXPECTED:
        chk = F.get_check(check_id)
        _EXPECTED[key] = chk.expected(*copy.deepcopy(case.args), **copy.deepcopy(case.kwargs))
    return _EXPECTED[key]


def first_failure(check_id: str, named: dict[str, Callable], salt: str, hidden: bool,
                  core: dict[str, types.ModuleType] | None = None) -> str | None:
    """The message of the first case of the check that fails (None: every case passes), with
    the notebook functions ``named`` and the core functions of ``core``."""
    chk = F.get_check(check_id)
    chk.mistakes = lambda *a, **k: {}  # no hints: only the verdict matters here
    with core_from(core):
        f = F.functions_for(chk, named={n: named[n] for n in chk.arguments})
        loops = {name: F.python_loops(getattr(f, name), name in chk.stepwise)  # as graded
                 for name in chk.loop_free}
    for case in cases(check_id, salt, hidden):
        with warnings.catch_warnings():  # in a notebook a warning is printed, not raised
            warnings.simplefilter("ignore")
            outcome = F.run_case(chk, f, case)
        verdict = F.judge(chk, case, outcome, expected(check_id, salt, case), loops=loops)
        if not verdict.passed:
            return verdict.message
    return None
