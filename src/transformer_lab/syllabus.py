"""Which notebook teaches each function of :mod:`transformer_lab.core`, read from the core.

The line that opens a core function's solution region names where it is taught (``05 §3``; a
function that later notebooks extend lists every place in teaching order: docs/maintainers.md,
"Writing exercises"); a notebook's full name is its check module's.

``make student`` names the first place in the stub it leaves in the handout; ``make grade``
grades a notebook with the student's own version of the functions that list it, and the
instructor's version of every other core function; a failing check names a wrong function that
its functions call (:data:`CALLS`) as the culprit.

:data:`TAUGHT_IN` and :data:`CALLS` are read from the core's source (its syntax tree) when this
module is imported. A handout's core is stubbed, its markers and calls gone: the handout carries
both tables, read from the solution core when it was built, in ``transformer_lab/_built.py``,
and this module takes them from there.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

#: The line that opens a solution region, and the places after it (the words are split so that
#: this module holds no marker itself).
_OPENING = re.compile(r"^[ \t]*### BEGIN[ ]SOLUTION(?P<places>.*)$")
_PLACE = re.compile(r"^(?:(?P<notebook>\d{2}) )?§(?P<section>\d+)$")
_CHECK_MODULE = re.compile(r"^nb(?P<number>\d{2})_(?P<topic>\w+)\.py$")


def parse_places(text: str) -> list[tuple[int, int]]:
    """``[(0, 6), (3, 3)]`` for the places ``"00 §6, 03 §3"`` after a region's opening marker
    (``"15 §2, §3"``: a section without a number is in the notebook named before it). Raises
    ValueError saying what is expected."""
    places: list[tuple[int, int]] = []
    for item in text.split(","):
        match = _PLACE.match(item.strip())
        if match is None or (match["notebook"] is None and not places):
            raise ValueError(f"expected the notebook number and section that teach the "
                             f"function, as '05 §3' (several in teaching order: '00 §6, 03 §3'),"
                             f" got {text.strip()!r}")
        notebook = int(match["notebook"]) if match["notebook"] else places[-1][0]
        places.append((notebook, int(match["section"])))
    if places != sorted(set(places)):
        raise ValueError(f"the places must be in teaching order, each once, got {text.strip()!r}")
    return places


def marked_places(lines: list[str]) -> list[tuple[int, int]] | None:
    """The places on the first line of ``lines`` (a function's) that opens a solution region;
    None when none does. Raises ValueError for places that do not parse."""
    for line in lines:
        match = _OPENING.match(line)
        if match:
            return parse_places(match["places"])
    return None


def notebook_names(checks: Path) -> dict[int, str]:
    """notebook number -> ``NN_topic``, from the check modules in the folder ``checks``."""
    found = {}
    for path in sorted(checks.glob("nb*.py")):
        match = _CHECK_MODULE.match(path.name)
        if match:
            found[int(match["number"])] = f"{match['number']}_{match['topic']}"
    return found


def read_core(package: Path) -> tuple[dict[str, dict[str, tuple[str, ...]]],
                                      dict[str, tuple[str, ...]]]:
    """(:data:`TAUGHT_IN`, :data:`CALLS`) of the package folder ``package``, read from the
    markers and the syntax trees of its ``core/*.py``. A function whose marker is missing or
    does not parse is left out (``make student`` and ``make test`` report it)."""
    names = notebook_names(package / "checks")
    places: dict[str, dict[str, list[tuple[int, int]]]] = {}
    nodes: dict[str, ast.FunctionDef] = {}
    for path in sorted((package / "core").glob("*.py")):
        source = path.read_text(encoding="utf-8")
        lines = source.split("\n")
        for node in ast.parse(source).body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            try:
                found = marked_places(lines[node.lineno - 1:node.end_lineno])
            except ValueError:
                continue
            if found:
                places.setdefault(path.stem, {})[node.name] = found
                nodes[node.name] = node
    # modules in the order of the first notebook teaching them, functions in source order
    modules = sorted(places, key=lambda m: (min(p[0] for p in places[m].values()), m))
    taught_in = {m: {name: tuple(f"{names.get(nb, f'{nb:02d}')} §{section}"
                                 for nb, section in found)
                     for name, found in places[m].items()} for m in modules}
    order = teaching_order(taught_in)
    calls = {}
    for name in order:
        used = {n.id for n in ast.walk(nodes[name]) if isinstance(n, ast.Name)
                and n.id in nodes and n.id != name}
        if used:
            calls[name] = tuple(sorted(used, key=order.index))
    return taught_in, calls


def teaching_order(taught_in: dict[str, dict[str, tuple[str, ...]]]) -> list[str]:
    """Every core function of ``taught_in``, by the notebook and section that teach it first."""
    def first(pair):
        notebook, _, section = pair[1][0].partition(" §")
        return notebook, int(section)

    listed = [(name, where) for functions in taught_in.values()
              for name, where in functions.items()]
    return [name for name, _ in sorted(listed, key=first)]


try:  # a handout (or an autograder): the tables its build read from the solution core
    from transformer_lab._built import CALLS, TAUGHT_IN
except ModuleNotFoundError:  # the course's source: read them from the core
    TAUGHT_IN, CALLS = read_core(Path(__file__).resolve().parent)

#: core module (under transformer_lab.core) -> function -> the notebooks, "NN_topic §section"
TAUGHT_IN: dict[str, dict[str, tuple[str, ...]]]
#: core function -> the core functions its solution calls (or passes on as an argument), in
#: teaching order. A failing check names a wrong function among these (the culprit), so that
#: the student fixes the function that is wrong rather than the one that calls it.
CALLS: dict[str, tuple[str, ...]]
_ORDER = {name: k for k, name in enumerate(teaching_order(TAUGHT_IN))}


def dependencies(functions) -> list[str]:
    """The core functions that ``functions`` call, directly or through each other (themselves
    left out), in teaching order."""
    found: set[str] = set()
    todo = list(functions)
    while todo:
        for callee in CALLS.get(todo.pop(), ()):
            if callee not in found:
                found.add(callee)
                todo.append(callee)
    return sorted(found - set(functions), key=_ORDER.__getitem__)


def where_taught(function: str) -> tuple[str, str]:
    """(core module, first "NN_topic §section") of a core function, or a KeyError."""
    for module, functions in TAUGHT_IN.items():
        if function in functions:
            return module, functions[function][0]
    raise KeyError(f"{function!r} is not a function of transformer_lab.core")


def notebook_functions(notebook: str) -> dict[str, list[str]]:
    """core module -> the functions that ``notebook`` ("06_layers_backward") teaches or extends."""
    found: dict[str, list[str]] = {}
    for module, functions in TAUGHT_IN.items():
        for name, places in functions.items():
            if any(place.split(" §")[0] == notebook for place in places):
                found.setdefault(module, []).append(name)
    return found


def stub_message(function: str, where: tuple[str, str] | None = None) -> str:
    """What the handout's stub of a core function says when it is called (the later notebooks
    that extend it too); ``where``: its (core module, first place), by default
    :func:`where_taught`'s."""
    module, place = where or where_taught(function)
    notebook, _, section = place.partition(" §")
    later = TAUGHT_IN.get(module, {}).get(function, ())[1:]
    extended = f" ({' and '.join(later)} extend{'s' * (len(later) == 1)} it)" if later else ""
    return (f"{function}() in transformer_lab/core/{module}.py is yours to write: notebook "
            f"{notebook}, section {section}, shows how{extended}")
