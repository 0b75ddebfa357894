"""What the classroom tools share: the markers, nbgrader's cell metadata, and their checks.

The solution notebooks are the source of every assignment (the package's side is
:mod:`.package`'s, hidden tests included: none in notebooks). An **exercise** cell
(``metadata.nbgrader.solution: true``) holds regions between ``### BEGIN SOLUTION[: hint]`` and
``### END SOLUTION`` that the student version stubs; a **check** cell (``grade: true`` with
``points``) is one line, ``check("<its id>", ...)`` (:func:`parse_check_call`); legacy check
cells (asserts) are handed out but ``make grade`` refuses them. ``grade_id`` equals the cell id.
The convention: docs/maintainers.md, "Writing exercises". :func:`parse_notebook` checks all of
it and reports every problem with its notebook, cell and line, so that a misplaced marker never
ships a solution. Also here: the output folders the tools may empty (:func:`fresh_output_dir`).
"""

from __future__ import annotations

import ast
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import nbformat

from transformer_lab.course import untrusted

BEGIN_SOLUTION = "### BEGIN SOLUTION"
END_SOLUTION = "### END SOLUTION"

#: nbgrader recognises a marker by these words anywhere in a line (in any cell type), so any
#: line that contains them, in any letter case, must be a well-formed marker in the right cell.
_MARKER_WORDS = re.compile(r"(BEGIN|END)\s+(SOLUTION|HIDDEN\s+TESTS)", re.IGNORECASE)
_MARKER_LINE = re.compile(
    r"^(?P<indent>[ \t]*)### (?P<kind>BEGIN SOLUTION|END SOLUTION|BEGIN HIDDEN TESTS"
    r"|END HIDDEN TESTS)(?P<rest>.*)$")
_GRADE_ID = re.compile(r"^[a-zA-Z0-9_-]+$")  # nbgrader's grade_id pattern, minus the empty id
SCHEMA_VERSION = 3
DEFAULT_HINT = "write this code"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a notebook's markers or metadata, and where (cells count from 1)."""

    notebook: str
    cell_number: int
    cell_id: str
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"{self.notebook}, cell {self.cell_number} (id {self.cell_id!r})"
        if self.line is not None:
            where += f", line {self.line}"
        return f"{where}: {self.message}"


class AssignmentError(ValueError):
    """Raised with every :class:`Problem` found; the message lists them one per line."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


@dataclass(frozen=True)
class Region:
    """Lines ``begin``..``end`` (0-based, both marker lines included) of a cell's source."""

    begin: int
    end: int
    indent: str
    hint: str = ""


@dataclass
class Exercise:
    cell_id: str
    regions: list[Region]


@dataclass(frozen=True)
class CheckCall:
    """What a one-line check cell calls: ``check("<check_id>", f, ..., name=g)``, with the names
    of the notebook functions it passes."""

    check_id: str
    args: tuple[str, ...] = ()
    kwargs: tuple[tuple[str, str], ...] = ()

    @property
    def names(self) -> list[str]:
        """Every notebook name the call passes, in order."""
        return [*self.args, *(value for _, value in self.kwargs)]


def parse_check_call(source: str) -> CheckCall | None:
    """The call of a one-line check cell, ``check("check-logsumexp", logsumexp)``; None when
    the cell holds anything else (a legacy check cell of asserts, for one)."""
    try:
        tree = untrusted.parse(source)
    except SyntaxError:
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr):
        return None
    call = tree.body[0].value
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
            and call.func.id == "check" and call.args
            and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)
            and all(isinstance(a, ast.Name) for a in call.args[1:])
            and all(k.arg is not None and isinstance(k.value, ast.Name)
                    for k in call.keywords)):
        return None
    return CheckCall(call.args[0].value, tuple(a.id for a in call.args[1:]),
                     tuple((k.arg, k.value.id) for k in call.keywords))


@dataclass
class Check:
    cell_id: str
    points: float
    call: CheckCall | None = None  # None: a legacy check cell (asserts), which make grade refuses


@dataclass
class Assignment:
    """The exercises and checks of one solution notebook, in notebook order."""

    name: str
    nb: nbformat.NotebookNode
    exercises: list[Exercise]
    checks: list[Check]

    @property
    def max_points(self) -> float:
        return sum(c.points for c in self.checks)

    @property
    def legacy_checks(self) -> list[Check]:
        """Check cells that are not one-line ``check(...)`` calls (asserts in the cell)."""
        return [c for c in self.checks if c.call is None]


def nbgrader_meta(cell) -> dict:
    """The cell's ``metadata.nbgrader`` (an empty dict when there is none)."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return meta if isinstance(meta, dict) else {}


def is_check(cell) -> bool:
    return bool(nbgrader_meta(cell).get("grade"))


def has_marker_words(line: str) -> bool:
    """Whether nbgrader (or these tools) could take ``line`` for a marker."""
    return _MARKER_WORDS.search(line) is not None


def assert_no_markers(lines: list[str], where: str, what: str) -> None:
    """A last guard on what is handed out: AssertionError for a line that holds marker words,
    left in ``what`` (the checks before it should leave none)."""
    for k, line in enumerate(lines, 1):
        if has_marker_words(line):
            raise AssertionError(f"{where}, line {k}: a marker is left in the {what}")


def source_lines(cell) -> list[str]:
    return cell.source.split("\n")


def format_points(points: float) -> str:
    """``2`` for 2.0, ``0.5`` for 0.5: points as people write them."""
    return f"{points:g}"


def parse_notebook(nb, name: str) -> Assignment:
    """Check the markers and nbgrader metadata of ``nb``; return its exercises and checks.

    Raises:
        AssignmentError: listing every problem (unbalanced or nested markers, a marker outside
            a cell with the matching metadata or in a markdown cell, a malformed marker,
            metadata that does not follow the convention), each with notebook, cell and line.
    """
    problems: list[Problem] = []
    exercises: list[Exercise] = []
    checks: list[Check] = []
    for number, cell in enumerate(nb.cells, 1):
        def report(message: str, line: int | None = None, _n=number, _cell=cell) -> None:
            problems.append(Problem(name, _n, _cell.get("id", "?"), line, message))

        _check_metadata(cell, report)
        for k, line in enumerate(source_lines(cell), 1):
            words = _MARKER_WORDS.search(line)
            if words and words[2].upper().startswith("HIDDEN"):
                report("hidden tests belong in a check module (transformer_lab/checks/"
                       "nbNN_topic.py), not in a notebook (nbgrader would take this line for a "
                       "marker too)", k)
            elif words and cell.cell_type != "code":
                report(f"marker words in a {cell.cell_type} cell; solution regions belong in "
                       "code cells (nbgrader would take this line for a marker too: rephrase "
                       "it)", k)
        if cell.cell_type != "code":
            continue
        solutions = find_regions(source_lines(cell), "SOLUTION", report)
        if nbgrader_meta(cell).get("solution"):  # an exercise cell
            if not solutions:
                report(f"an exercise cell (nbgrader solution: true) needs a {BEGIN_SOLUTION} / "
                       f"{END_SOLUTION} region")
            exercises.append(Exercise(cell.id, solutions))
        elif solutions:
            report(f"{BEGIN_SOLUTION} in a cell that is not an exercise cell: add the exercise "
                   "metadata (nbgrader solution: true) or remove the marker",
                   solutions[0].begin + 1)
        if is_check(cell):
            checks.append(Check(cell.id, nbgrader_meta(cell).get("points", 0),
                                parse_check_call(cell.source)))
    if problems:
        raise AssignmentError(problems)
    return Assignment(name, nb, exercises, checks)


def _check_metadata(cell, report) -> None:
    """Report where ``metadata.nbgrader`` departs from the course's use of nbgrader's schema."""
    if "nbgrader" not in cell.get("metadata", {}):
        return
    meta = cell.metadata.nbgrader
    if not isinstance(meta, dict):
        report("metadata.nbgrader must be a mapping")
        return
    if meta.get("schema_version") != SCHEMA_VERSION:
        report(f"metadata.nbgrader.schema_version must be {SCHEMA_VERSION}, "
               f"got {meta.get('schema_version')!r}")
    for key in ("grade", "solution", "locked"):
        if not isinstance(meta.get(key), bool):
            report(f"metadata.nbgrader.{key} must be true or false, got {meta.get(key)!r}")
    grade, solution = meta.get("grade") is True, meta.get("solution") is True
    if grade or solution or meta.get("locked") is True:
        grade_id = meta.get("grade_id")
        if grade_id != cell.get("id"):
            report(f"metadata.nbgrader.grade_id must equal the cell id {cell.get('id')!r}, "
                   f"got {grade_id!r}")
        elif not isinstance(grade_id, str) or not _GRADE_ID.match(grade_id):
            report(f"metadata.nbgrader.grade_id must be letters, digits, '_' and '-', "
                   f"got {grade_id!r}")
    if grade and solution:
        report("a cell cannot be both an exercise (solution: true) and a check (grade: true): "
               "manually graded answers are not supported")
    if (grade or solution) and cell.cell_type != "code":
        report(f"exercise and check cells must be code cells, this one is {cell.cell_type}")
    points = meta.get("points")
    if grade and (isinstance(points, bool) or not isinstance(points, (int, float))
                  or not points > 0):
        report(f"a check cell needs metadata.nbgrader.points, a number above 0, got {points!r}")


def find_regions(lines: list[str], kind: str, report) -> list[Region]:
    """The balanced ``### BEGIN <kind>`` ... ``### END <kind>`` regions of ``lines`` (a cell's or
    a file's); ``report(message, line)`` gets every malformed, unbalanced or nested marker, with
    its line number counted from 1. ``kind``: "SOLUTION" or "HIDDEN TESTS"."""
    regions: list[Region] = []
    open_at: int | None = None
    open_indent, hint = "", ""
    for i, line in enumerate(lines):
        words = [m for m in _MARKER_WORDS.finditer(line)
                 if " ".join(m.group(2).upper().split()) == kind]
        if not words:
            continue
        marker = _MARKER_LINE.match(line)
        begin = words[0].group(1).upper() == "BEGIN"
        if not marker or not _well_formed(marker) or len(_MARKER_WORDS.findall(line)) > 1:
            expected = f"### BEGIN {kind}" if begin else f"### END {kind}"
            report(f"malformed marker {line.strip()!r}: a marker is a line of its own, "
                   f"exactly {expected!r}"
                   + (" (optionally followed by ': <hint>')" if expected == BEGIN_SOLUTION
                      else ""), i + 1)
            continue
        if begin and open_at is not None:
            report(f"### BEGIN {kind} inside the region opened at line {open_at + 1}: "
                   "regions cannot be nested", i + 1)
        elif begin:
            open_at, open_indent, hint = i, marker["indent"], _hint(marker["rest"])
        elif open_at is None:
            report(f"### END {kind} without a ### BEGIN {kind} before it", i + 1)
        elif marker["indent"] != open_indent:
            report(f"### END {kind} is indented differently from its ### BEGIN {kind} "
                   f"(line {open_at + 1}): the region must sit in one block of code", i + 1)
            open_at = None
        else:
            regions.append(Region(open_at, i, open_indent, hint))
            open_at = None
    if open_at is not None:
        report(f"### BEGIN {kind} has no ### END {kind}", open_at + 1)
    return regions


def replace_regions(source: str, regions: list[Region], stubs: list[str] | None = None) -> str:
    """``source`` with each region (markers included) replaced by the line ``stubs[k]``, or
    removed when there are no ``stubs``."""
    lines = source.split("\n")
    out: list[str] = []
    start = 0
    for k, region in enumerate(regions):
        out.extend(lines[start:region.begin])
        if stubs is not None:
            out.append(stubs[k])
        start = region.end + 1
    out.extend(lines[start:])
    return "\n".join(out)


def raise_line(indent: str, message: str) -> str:
    """``raise NotImplementedError("<message>")`` at ``indent``, the message as a literal."""
    literal = f'"{message}"' if '"' not in message and "\\" not in message else repr(message)
    return f"{indent}raise NotImplementedError({literal})"


def _well_formed(marker: re.Match) -> bool:
    """Only BEGIN SOLUTION takes text after the marker (the hint, after ':' or a space)."""
    rest = marker["rest"]
    if marker["kind"] == "BEGIN SOLUTION":
        return rest.strip() == "" or rest[0] in ": "
    return rest.strip() == ""


def _hint(rest: str) -> str:
    return rest.strip().lstrip(":").strip()


def load_assignments(notebooks: list[Path]) -> list[Assignment]:
    """Read and check every notebook; raise one :class:`AssignmentError` for all of them."""
    assignments, problems = [], []
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        try:
            assignments.append(parse_notebook(nb, str(path)))
        except AssignmentError as err:
            problems.extend(err.problems)
    if problems:
        raise AssignmentError(problems)
    return assignments


def solution_notebooks(source: Path, chosen: list[str] | None = None) -> list[Path]:
    """The ``NN_topic.ipynb`` notebooks of the folder ``source``, sorted; with ``chosen``
    (--notebooks: names, ``06_layers_backward`` or ``06``), those only."""
    if not source.is_dir():
        raise SystemExit(f"error: --source must be the folder of solution notebooks, "
                         f"{str(source)!r} is not a folder")
    found = sorted(source.glob("*.ipynb"))
    if not found:
        raise SystemExit(f"error: --source {str(source)!r} holds no notebooks (*.ipynb)")
    if not chosen:
        return found

    def named(path: Path, name: str) -> bool:
        return name in (path.stem, path.stem.split("_")[0])

    unknown = [name for name in chosen if not any(named(p, name) for p in found)]
    if unknown:
        raise SystemExit(f"error: --notebooks names {', '.join(map(repr, unknown))}, not a "
                         f"notebook of --source {str(source)!r} ("
                         + ", ".join(p.stem for p in found) + ")")
    return [p for p in found if any(named(p, name) for name in chosen)]


#: Written into every folder the course tools fill, so that they only ever empty their own.
OWNER_FILE = ".written-by-transformer-lab"


#: What a handout and an autograder copy of the course's folder besides src/ and img/.
PROJECT_FILES = ("pyproject.toml", "requirements.txt")


def check_project(project: Path) -> None:
    """Refuse a --project that is not the course's folder, naming what it lacks."""
    missing = [name for name in ("src/transformer_lab/__init__.py", *PROJECT_FILES)
               if not (project / name).is_file()]
    if missing:
        raise SystemExit(f"error: --project must be the course's folder; {str(project)!r} lacks "
                         f"{', '.join(missing)}")


def overlaps(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are the same folder or one holds the other."""
    a, b = a.resolve(), b.resolve()
    return a == b or a in b.parents or b in a.parents


def check_apart(path: Path, option: str, inputs: dict[str, Path]) -> None:
    """Refuse an output folder ``path`` that is, holds or lies inside one of the ``inputs``
    (option or description -> path): emptying it would delete what the tool reads."""
    for name, given in inputs.items():
        if overlaps(path, given):
            raise SystemExit(f"error: {option} {str(path)!r} and {name} {str(given)!r} overlap "
                             "(the same folder, or one inside the other); the output folder is "
                             "emptied on each run, so it must lie apart from what is read")


def is_ours(path: Path) -> bool:
    """Whether ``path`` is a folder one of these tools wrote (it holds :data:`OWNER_FILE`)."""
    return (path / OWNER_FILE).is_file()


def fresh_output_dir(path: Path, option: str, inputs: dict[str, Path] | None = None) -> None:
    """Empty ``path`` for new output, refusing a non-empty folder these tools did not write and
    one that overlaps any of ``inputs`` (option -> path; see :func:`check_apart`)."""
    check_apart(path, option, inputs or {})
    if path.exists() or path.is_symlink():
        if path.is_symlink() or not path.is_dir():
            raise SystemExit(f"error: {option} must be a folder, {str(path)!r} is "
                             f"{'a link' if path.is_symlink() else 'a file'}")
        if any(path.iterdir()) and not is_ours(path):
            raise SystemExit(f"error: {option} {str(path)!r} is not empty and was not written "
                             "by this tool; name a new folder or empty it yourself")
        shutil.rmtree(path)
    path.mkdir(parents=True)
    (path / OWNER_FILE).write_text("This folder is emptied and rewritten by the course's tools "
                                   "(transformer_lab.course).\n")
