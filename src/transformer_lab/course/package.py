"""The package's side of the exercises: solution regions in ``core/``, hidden tests in ``checks/``.

:func:`parse_package` checks the markers of ``transformer_lab/`` as strictly as
:mod:`.assignment` checks the notebooks' (the convention: docs/maintainers.md, "Writing
exercises") -- every problem with its file and line; marker words anywhere but in a core module,
a check module and the course tools are an error too. From it come the forms the tools need:

- the **handout** (:func:`write_handout_package`): core solution regions stubbed (the message:
  :func:`syllabus.stub_message`), hidden regions removed, the public answers stored for checks
  whose reference was hidden, the course tools left out, ``transformer_lab/_built.py`` added;
- the **probe package** of the grader (:func:`compose_core_module`, :func:`student_code`): the
  handout's core with chosen functions put back, the instructor's or a student's, taken out of a
  module's source by its syntax tree.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from transformer_lab import syllabus
from transformer_lab.course import untrusted, versions
from transformer_lab.course.assignment import (
    Region,
    assert_no_markers,
    find_regions,
    has_marker_words,
    raise_line,
    replace_regions,
)

#: Folders of the package the handout and the probe leave out: the instructors' tools.
TOOLS_DIR = "course"
#: Names no copy of the course's files takes, wherever they are: caches and build metadata.
IGNORE_NAMES = ("__pycache__", "*.pyc", "*.pyo", "*.egg-info", ".ipynb_checkpoints",
                ".pytest_cache", ".ruff_cache")
#: Class attributes and methods of a check that the handout needs (outside hidden regions).
_CHECK_PUBLIC = {"id", "notebook", "functions", "arguments", "tol", "run", "cases"}


@dataclass(frozen=True)
class FileProblem:
    """One thing wrong with the markers of a package file, and where (lines count from 1)."""

    path: str
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"{self.path}, line {self.line}" if self.line else self.path
        return f"{where}: {self.message}"


class PackageError(ValueError):
    """Raised with every :class:`FileProblem` found; the message lists them one per line."""

    def __init__(self, problems: list[FileProblem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


@dataclass
class CoreFunction:
    """A top-level function of a core module: its lines (0-based, inclusive, decorators
    included), its solution region and the first place that teaches it ("NN_topic §S")."""

    name: str
    start: int
    end: int
    region: Region
    place: str


@dataclass
class CoreModule:
    name: str  # "layers"
    path: Path
    source: str
    functions: dict[str, CoreFunction]

    def stubbed(self) -> str:
        """The module as the handout has it: each solution region replaced by its stub."""
        fns = sorted(self.functions.values(), key=lambda f: f.region.begin)
        return replace_regions(self.source, [f.region for f in fns],
                               [raise_line(f.region.indent,
                                           syllabus.stub_message(f.name, (self.name, f.place)))
                                for f in fns])

    def definition(self, name: str) -> str:
        """The instructor's whole definition of ``name`` (decorators included)."""
        fn = self.functions[name]
        return "\n".join(self.source.split("\n")[fn.start:fn.end + 1])


@dataclass
class CheckModule:
    name: str  # "nb01_attention"
    path: Path
    source: str
    hidden: list[Region]
    #: ids of the checks whose ``expected`` lies in a hidden region (the handout stores their
    #: public answers instead)
    hidden_references: list[str] = field(default_factory=list)

    def stripped(self) -> str:
        """The module as the handout has it: every hidden region removed."""
        return replace_regions(self.source, self.hidden)


@dataclass
class Package:
    """The parsed ``transformer_lab`` folder: its core modules and check modules by name."""

    core: dict[str, CoreModule]
    checks: dict[str, CheckModule]


def _label(path: Path, root: Path) -> str:
    """``path`` as the problems name it: relative to the folder holding ``src/`` if it can."""
    for base in (root.parent.parent, root.parent):
        try:
            return path.relative_to(base).as_posix()
        except ValueError:
            continue
    return str(path)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None  # a binary file (a figure, stored arrays): no markers to look for


def package_files(root: Path) -> list[Path]:
    """The files of the package folder ``root`` that the handout ships, sorted."""
    found = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and rel.parts[0] != TOOLS_DIR and not any(
                fnmatch.fnmatch(part, pat) for part in rel.parts for pat in IGNORE_NAMES):
            found.append(path)
    return found


def parse_package(root: Path) -> Package:
    """Check the markers of the package folder ``root`` (``src/transformer_lab``).

    Raises:
        PackageError: listing every problem (unbalanced, nested or malformed markers; a solution
            region outside ``core/``, outside a function's body or not at its top level; a core
            function without a region, or one whose region does not say where it is taught;
            hidden tests outside ``checks/nb*.py``, or hiding what the handout needs; marker
            words anywhere else), each with its file and line.
    """
    problems: list[FileProblem] = []
    core: dict[str, CoreModule] = {}
    checks: dict[str, CheckModule] = {}
    if not (root / "__init__.py").is_file():
        raise PackageError([FileProblem(str(root), None, "not a package folder (no __init__.py)")])
    notebooks = syllabus.notebook_names(root / "checks")
    for path in package_files(root):
        text = _read_text(path)
        if text is None:
            continue
        label = _label(path, root)
        rel = path.relative_to(root)

        def report(message: str, line: int | None = None, _label=label) -> None:
            problems.append(FileProblem(_label, line, message))

        if len(rel.parts) == 2 and rel.parts[0] == "core" and path.suffix == ".py" \
                and path.name != "__init__.py":
            module = _parse_core(path, text, report, notebooks)
            if module is not None:
                core[module.name] = module
        elif len(rel.parts) == 2 and rel.parts[0] == "checks" and path.suffix == ".py" \
                and path.name.startswith("nb"):
            module = _parse_checks(path, text, report)
            if module is not None:
                checks[module.name] = module
        else:
            for k, line in enumerate(text.split("\n"), 1):
                if has_marker_words(line):
                    report("marker words outside a core module (transformer_lab/core/*.py) and "
                           "a check module (transformer_lab/checks/nbNN_topic.py); nothing "
                           "else is stubbed or stripped, so rephrase the line", k)
    if problems:
        raise PackageError(problems)
    return Package(core, checks)


def statement_spans(tree: ast.Module, lines: list[str]) -> dict[int, tuple[int, int]]:
    """id(node) -> (first, last) line, 0-based and inclusive, of each top-level statement:
    from its first decorator to its last line, and on over the indented lines (comments, an
    END marker) that follow it before the next statement or the next line at column 0."""
    spans = {}
    body = tree.body
    for k, node in enumerate(body):
        start = first_line(node)
        limit = first_line(body[k + 1]) if k + 1 < len(body) else len(lines)
        last, j = node.end_lineno - 1, node.end_lineno
        while j < limit:
            if not lines[j].strip():
                j += 1
            elif lines[j][0] in " \t":
                last = j
                j += 1
            else:
                break
        spans[id(node)] = (start, last)
    return spans


def first_line(node: ast.stmt) -> int:
    """The first line (0-based) of a statement, its decorators included."""
    decorators = getattr(node, "decorator_list", None)
    return (decorators[0] if decorators else node).lineno - 1


def _parse_core(path: Path, text: str, report, notebooks: dict[int, str]) -> CoreModule | None:
    """The core module at ``path``; ``notebooks``: number -> ``NN_topic``, the notebooks a
    solution marker may name."""
    name = path.stem
    lines, regions, tree = _regions_and_tree(
        path, text, report, "SOLUTION", "hidden tests belong in a check module "
        "(transformer_lab/checks/nbNN_topic.py), not in the core")
    if tree is None:
        return None
    functions: dict[str, CoreFunction] = {}
    spans = statement_spans(tree, lines)
    nodes = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            report(f"class {node.name} in the core: only functions can be exercises (a class's "
                   "code would ship in the handout)", node.lineno)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            nodes.append(node)
    for region in regions:
        owner = next((n for n in nodes if n.lineno - 1 < region.begin
                      and region.end <= spans[id(n)][1]), None)
        if owner is None:
            report("a solution region in the core must sit inside a function's body",
                   region.begin + 1)
            continue
        first = lines[owner.body[0].lineno - 1]  # the body's first line, and its indent
        if region.indent != first[:len(first) - len(first.lstrip())]:
            report(f"the solution region of {owner.name}() must sit at the top level of its body "
                   "(indented like its first line), so that the stub replaces all of it",
                   region.begin + 1)
            continue
        if owner.name in functions:
            report(f"{owner.name}() has a second solution region; a core function has one",
                   region.begin + 1)
            continue
        place = _first_place(owner.name, lines[region.begin], region, notebooks, report)
        if place is not None:
            functions[owner.name] = CoreFunction(owner.name, *spans[id(owner)], region, place)
    for node in nodes:
        if node.name not in functions and not any(node.lineno - 1 < r.begin
                                                  and r.end <= spans[id(node)][1]
                                                  for r in regions):
            report(f"core function {node.name}() has no solution region: its code would ship "
                   "in the handout", node.lineno)
    module = CoreModule(name, path, text, functions)
    if len(functions) == len(nodes):
        try:
            compile(module.stubbed(), str(path), "exec")
        except SyntaxError as err:  # a region that leaves no valid code behind
            report(f"the stubbed module does not parse: {err.msg}", err.lineno)
    return module


def _first_place(name: str, marker: str, region: Region, notebooks: dict[int, str],
                 report) -> str | None:
    """The first place ("NN_topic §S") that ``marker``, the line opening ``name``'s region,
    names (read as :mod:`transformer_lab.syllabus` reads it), or None (reported) when it names
    none, or a notebook without a check module."""
    try:
        places = syllabus.marked_places([marker])
    except ValueError as err:
        report(f"the solution marker of {name}() must name where it is taught, as "
               f"'### BEGIN SOLUTION 05 §3' (notebook number and section; for a function later "
               f"notebooks extend, every place: '00 §6, 03 §3'): {err}", region.begin + 1)
        return None
    unknown = sorted({nb for nb, _ in places if nb not in notebooks})
    if unknown:
        report(f"the solution marker of {name}() names notebook "
               f"{', '.join(f'{nb:02d}' for nb in unknown)}, which has no check module "
               "(transformer_lab/checks/nbNN_topic.py, whose name gives the notebook's)",
               region.begin + 1)
        return None
    notebook, section = places[0]
    return f"{notebooks[notebook]} §{section}"


def _closes_within(lines: list[str], cls: ast.ClassDef, region: Region) -> bool:
    """Whether the region ends in the class body: before its last line, or right after it
    with only blank lines between (the END marker is indented as its BEGIN, in the body)."""
    return (region.end <= cls.end_lineno - 1
            or all(not line.strip() for line in lines[cls.end_lineno:region.end]))


def _regions_and_tree(path: Path, text: str, report, kind: str, misplaced: str):
    """(lines, the ``kind`` regions, the syntax tree: None, reported, where it does not parse)
    of a module's ``text``; a region of the other kind is reported as ``misplaced``."""
    lines = text.split("\n")
    other = "HIDDEN TESTS" if kind == "SOLUTION" else "SOLUTION"
    for region in find_regions(lines, other, report):
        report(misplaced, region.begin + 1)
    regions = find_regions(lines, kind, report)
    try:
        return lines, regions, ast.parse(text, str(path))
    except SyntaxError as err:
        report(f"does not parse: {err.msg}", err.lineno)
        return lines, regions, None


def _parse_checks(path: Path, text: str, report) -> CheckModule | None:
    lines, hidden, tree = _regions_and_tree(
        path, text, report, "HIDDEN TESTS", "solution regions belong in the core "
        "(transformer_lab/core/*.py) or in a notebook's exercise cell, not in a check module")
    if tree is None:
        return None
    module = CheckModule(path.stem, path, text, hidden)

    def inside(node, region: Region) -> bool:
        return region.begin < node.lineno - 1 and node.end_lineno - 1 < region.end

    def cut(node, region: Region) -> bool:
        start, end = first_line(node), node.end_lineno - 1
        return not (end < region.begin or start > region.end
                    or (region.begin < start and end < region.end))

    for region in hidden:
        for node in tree.body:
            # a region may close the class body: its END marker then follows the last line
            holds_region = (isinstance(node, ast.ClassDef) and node.lineno - 1 < region.begin
                            and region.begin < node.end_lineno - 1
                            and _closes_within(lines, node, region))
            if holds_region:
                for stmt in node.body:
                    if cut(stmt, region) and not inside(stmt, region):
                        report(f"the hidden region cuts a statement of {node.name} in two (it "
                               "must hold whole methods or assignments)", region.begin + 1)
                    elif inside(stmt, region) and _names_of(stmt) & _CHECK_PUBLIC:
                        what = ", ".join(sorted(_names_of(stmt) & _CHECK_PUBLIC))
                        report(f"{node.name}.{what} is hidden, but the handout (and the "
                               "grader's probe) runs it: keep it outside the hidden region",
                               stmt.lineno)
            elif inside(node, region) and isinstance(node, ast.ClassDef):
                report(f"the hidden region holds the class statement of {node.name}: the "
                       "handout needs the class (hide its hidden_cases and expected only)",
                       node.lineno)
            elif cut(node, region) and not inside(node, region):
                report("the hidden region cuts a statement in two (it must hold whole "
                       "statements at the module's or a class body's top level)",
                       region.begin + 1)
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        expected = [n for n in cls.body if isinstance(n, ast.FunctionDef)
                    and n.name == "expected"]
        if expected and any(inside(expected[0], r) for r in hidden):
            check_id = next((k.value.value for k in cls.keywords  # class X(Check, id="...")
                             if k.arg == "id" and isinstance(k.value, ast.Constant)), None)
            if check_id is None:
                report(f"{cls.name}.expected is hidden, but the class has no literal "
                       "id='check-...' to store its public answers under", cls.lineno)
            else:
                module.hidden_references.append(check_id)
    try:
        compile(module.stripped(), str(path), "exec")
    except SyntaxError as err:
        report(f"without its hidden regions the module does not parse: {err.msg} (line "
               f"{err.lineno} of the stripped module)", None)
    return module


def _names_of(node: ast.AST) -> set[str]:
    """The names a class-body statement defines."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else \
        [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
    return {t.id for t in targets if isinstance(t, ast.Name)}


# --- the handout's package ------------------------------------------------------------------

def _ignore(root: Path):
    """``shutil.copytree``'s ignore: caches, build leftovers and the tools' folder."""
    patterns = shutil.ignore_patterns(*IGNORE_NAMES)

    def ignore(folder: str, names: list[str]) -> set[str]:
        skipped = set(patterns(folder, names))
        if Path(folder).resolve() == root.resolve() and TOOLS_DIR in names:
            skipped.add(TOOLS_DIR)
        return skipped
    return ignore


def write_handout_package(src: Path, dest: Path, package: Package | None = None,
                          commit: str = versions.UNKNOWN) -> Package:
    """Copy the source folder ``src`` (holding ``transformer_lab/``) to ``dest`` in its handout
    form; return the parsed instructor's package.

    Core solution regions become stubs, hidden regions go, and the public answers of every
    check whose ``expected`` was hidden are stored in ``transformer_lab/checks/data/`` (computed
    here, with the checks this process has loaded). Caches and the course tools are left out;
    ``transformer_lab/_built.py`` records ``commit``, the commit it was built from, and the
    syllabus read from the solution core.
    """
    from transformer_lab.checks import framework

    root = src / "transformer_lab"
    package = package or parse_package(root)
    shutil.copytree(src, dest, ignore=_ignore(root))
    out = dest / "transformer_lab"
    for module in package.core.values():
        (out / "core" / module.path.name).write_text(module.stubbed(), encoding="utf-8")
    (out / versions.BUILT).write_text(versions.built_module(commit, root), encoding="utf-8")
    registry = framework.load_checks()
    for module in package.checks.values():
        (out / "checks" / module.path.name).write_text(module.stripped(), encoding="utf-8")
        for check_id in module.hidden_references:
            if check_id not in registry:
                raise PackageError([FileProblem(_label(module.path, root), None,
                                                f"{check_id} is not registered in this process: "
                                                "run the tools from the project they hand out")])
            framework.store_expected(registry[check_id](), out / "checks" / "data")
    assert_handout_package(out)
    return package


def assert_handout_package(root: Path) -> None:
    """A last guard on a written handout package: no marker words, every core function a stub
    (its body, after the docstring, starts by raising NotImplementedError)."""
    for path in sorted(root.rglob("*")):
        text = _read_text(path) if path.is_file() else None
        if text is not None:
            assert_no_markers(text.split("\n"), str(path), "handout")
    for path in sorted((root / "core").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    stub_of(node) is None:
                raise AssertionError(f"{path}: {node.name}() is not a stub in the handout")


def stub_of(node: ast.FunctionDef) -> str | None:
    """The message of the ``raise NotImplementedError("...")`` that stubs ``node``'s body, or
    None when the body computes something before it (only assignments from the arguments, as
    ``q, k, v = cache``, may come first)."""
    for stmt in node.body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # the docstring
        if isinstance(stmt, ast.Raise):
            call = stmt.exc
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                    and call.func.id == "NotImplementedError" and len(call.args) == 1
                    and isinstance(call.args[0], ast.Constant)):
                return call.args[0].value
            return None
        if isinstance(stmt, ast.Assign) and all(
                isinstance(n, (ast.Name, ast.Tuple, ast.Store, ast.Load))
                for part in (*stmt.targets, stmt.value) for n in ast.walk(part)):
            continue  # unpacking a cache: `q, k, v = cache`
        return None
    return None


#: Methods of a check that compute answers; the grader's probe package holds none of them.
REFERENCE_METHODS = ("expected", "mistakes")


def without_references(source: str) -> str:
    """A check module's source (handout form) without the methods that compute answers
    (:data:`REFERENCE_METHODS`) in any class: what the grader's probe package holds, so that no
    code in the probe can produce an expected answer."""
    tree = ast.parse(source)
    lines = source.split("\n")
    drop: set[int] = set()
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        kept, first = 0, None
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    node.name in REFERENCE_METHODS:
                start = first_line(node)
                drop.update(range(start, node.end_lineno))
                first = start if first is None else first
            else:
                kept += 1
        if not kept and first is not None:  # a class left empty: give it a body
            drop.discard(first)
            lines[first] = re.match(r"[ \t]*", lines[first]).group(0) + "pass"
    out = "\n".join(line for k, line in enumerate(lines) if k not in drop)
    compile(out, "<check module without references>", "exec")
    return out


# --- taking functions out of a module, putting them into another -----------------------------

def top_level_functions(source: str) -> dict[str, tuple[int, int]]:
    """name -> (first, last) line, 0-based and inclusive, decorators included, of the module's
    top-level functions (a name defined twice: its last definition, as Python keeps it)."""
    tree = ast.parse(source)
    extents = statement_spans(tree, source.split("\n"))
    return {node.name: extents[id(node)] for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def top_level_names(source: str) -> set[str]:
    """Every name a module binds at its top level: functions, classes, imports, constants."""
    tree = ast.parse(source)
    return set(top_level_definitions(tree)).union(*(
        _bound_by(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))))


def top_level_definitions(tree: ast.Module) -> dict[str, ast.AST]:
    """Each name a module's top level defines or assigns (functions, classes, constants;
    imports aside) -> the statement that binds it last."""
    defined: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            defined.update(dict.fromkeys(_assigned(node), node))
    return defined


def _assigned(node: ast.Assign | ast.AnnAssign) -> list[str]:
    """The names an assignment's targets hold (a tuple's, a subscript's too)."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def compose_core_module(stub_source: str, definitions: dict[str, str],
                        extras: Iterable[str] = ()) -> str:
    """``stub_source`` (a handout core module) with the top-level functions named in
    ``definitions`` replaced by those texts, and ``extras`` (a student's imports and helpers)
    put before the first function. Raises SyntaxError when the result does not parse."""
    lines = stub_source.split("\n")
    spans = top_level_functions(stub_source)
    starts = {first: (name, last) for name, (first, last) in spans.items()}
    first_def = min(starts) if starts else len(lines)
    extras = list(extras)
    out: list[str] = []
    i = 0
    while i < len(lines):
        if i == first_def and extras:
            out += ["# --- from the submitted module: imports and helpers its functions use ---",
                    *"\n\n".join(extras).split("\n"), "", ""]
        if i in starts and starts[i][0] in definitions:
            name, last = starts[i]
            out.extend(definitions[name].split("\n"))
            i = last + 1
            continue
        out.append(lines[i])
        i += 1
    composed = "\n".join(out)
    untrusted.check_compiles(composed, "<composed core module>")
    return composed


@dataclass
class StudentCode:
    """What a student's core module gives the probe package."""

    functions: dict[str, str]  # name -> the student's whole definition
    extras: list[str]  # the imports, helper functions, classes and constants they use
    problems: dict[str, str]  # name -> why it stays a stub


def student_code(source: str, wanted: Iterable[str], provided: Iterable[str],
                 label: str) -> StudentCode:
    """The definitions of the functions ``wanted`` in a student's module ``source``, with the
    student's imports and the top-level helpers, classes and constants they use (transitively).

    ``provided``: the names the composed module defines itself (the module's core functions);
    they are never taken from the student's file as helpers, and the names of an import of the
    student's that would rebind one of them are left out of it (its other names are kept).
    ``label`` names the file in the problems.
    """
    wanted, provided = list(wanted), set(provided)
    try:
        tree = untrusted.parse(source, label)
    except SyntaxError as err:
        reason = f"{label} does not parse (SyntaxError at line {err.lineno}: {err.msg})" \
            if err.lineno else f"{label} does not parse ({err.msg})"
        return StudentCode({}, [], {name: reason for name in wanted})
    lines = source.split("\n")
    extents = statement_spans(tree, lines)

    def text(node) -> str:
        start, last = extents[id(node)]
        return "\n".join(lines[start:last + 1])

    defined = top_level_definitions(tree)  # top-level name -> the statement binding it last
    imports = [node for node in tree.body if isinstance(node, ast.Import) or isinstance(
        node, ast.ImportFrom) and node.module != "__future__"]
    functions, problems = {}, {}
    for name in wanted:
        node = defined.get(name)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions[name] = text(node)
        else:
            problems[name] = f"{name}() is not defined in {label}"
    # helpers: what the wanted functions use, and what that uses, defined at the top level
    needed: set[int] = set()
    todo = [defined[name] for name in functions]  # each node goes in once
    while todo:
        for used in ast.walk(todo.pop()):
            if isinstance(used, ast.Name) and used.id in defined and used.id not in provided:
                helper = defined[used.id]
                if id(helper) not in needed and used.id not in functions:
                    needed.add(id(helper))
                    todo.append(helper)
    extras = [(n.lineno, text(n) if not _bound_by(n) & provided else _import_without(n, provided))
              for n in imports]
    extras += [(n.lineno, text(n)) for n in tree.body if id(n) in needed]
    extras.sort(key=lambda pair: pair[0])
    return StudentCode(functions, [t for _, t in extras if t], problems)


def _import_without(node: ast.Import | ast.ImportFrom, names: set[str]) -> str:
    """The import ``node`` without the names in ``names`` ("" when none is left): a student's
    ``from transformer_lab.core.layers import linear_forward, tied_output_forward`` keeps
    ``linear_forward`` where the composed module defines ``tied_output_forward`` itself."""
    kept = [a for a in node.names if (a.asname or a.name).split(".")[0] not in names]
    if not kept:
        return ""
    aliases = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in kept)
    if isinstance(node, ast.Import):
        return f"import {aliases}"
    return f"from {'.' * node.level}{node.module or ''} import {aliases}"


def _bound_by(node: ast.Import | ast.ImportFrom) -> set[str]:
    return {(alias.asname or alias.name).split(".")[0] for alias in node.names}


def notebook_number(notebook: str) -> int | None:
    """``5`` for "05_attention_backward" (None when the name does not start with a number)."""
    match = re.match(r"(\d+)", notebook)
    return int(match.group(1)) if match else None
