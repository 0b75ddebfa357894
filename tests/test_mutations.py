"""Mutation test of the exercise checks: a check cell that prints "passed" must mean the function
is right.

Every mutant of the catalogue (``tests/mutants.py``: a realistic mistake, as a small edit of a
solution) must fail the public cases of each of its checks -- what the student's check cell runs
-- and the grader's cases. The mutation score, killed/total per notebook, is printed at the end
of a run of this file (``pytest tests/test_mutations.py``; with xdist, per worker), with the core
functions and exercises that have no mutant yet.
"""

from __future__ import annotations

import functools
from collections import defaultdict

import pytest
from mutants import CATALOGUE, Mutant
from mutation_tools import (
    exercise_cells,
    exercise_namespace,
    first_failure,
    fresh_core,
    mutated_core_source,
)

from transformer_lab import syllabus
from transformer_lab.checks import load_checks

REGISTRY = load_checks()
#: the notebooks whose every core function and exercise must have a mutant: the whole course
COVERED = sorted({c.notebook for c in REGISTRY.values()})
SALTS = {"public": ("notebook", False), "grader": ("grader", True)}


def _ids(catalogue: list[Mutant]) -> list[str]:
    seen: dict[str, int] = defaultdict(int)
    ids = []
    for m in catalogue:
        seen[m.where] += 1
        ids.append(f"{m.where}#{seen[m.where]}")
    return ids


IDS = dict(zip(_ids(CATALOGUE), CATALOGUE, strict=True))


def _functions(m: Mutant | None, where: str) -> tuple[dict, dict | None]:
    """(notebook functions, core modules) of the solution of ``where``, mutated by ``m``."""
    if "/" in where:
        notebook, cell = where.split("/")
        edit = (m.old, m.new) if m else (None, None)
        return exercise_namespace(notebook, cell, *edit), None
    if m is None:
        return {}, _solution_core()
    module, source = mutated_core_source(m.where, m.old, m.new)
    return {}, fresh_core({module: source})


@functools.cache
def _solution_core():
    return fresh_core()


def verdicts(m: Mutant) -> dict[str, dict[str, str | None]]:
    """``{"public"|"grader": {check id: the first failure's message, or None}}``."""
    named, core = _functions(m, m.where)
    return {kind: {c: first_failure(c, named, salt, hidden, core) for c in m.checks}
            for kind, (salt, hidden) in SALTS.items()}


# --------------------------------------------------------------------------------------------
# The score, printed at the end


RESULTS: dict[str, dict] = {}


@pytest.fixture(scope="module", autouse=True)
def score(request):
    yield
    if not RESULTS:
        return
    plugins = request.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter is None or capture is None:
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line("")
        for line in score_lines(RESULTS):
            reporter.write_line(line)


def _killed(result: dict, kind: str) -> bool:
    return all(msg is not None for msg in result[kind].values())


def score_lines(results: dict[str, dict]) -> list[str]:
    per: dict[str, list[str]] = defaultdict(list)
    for key in results:
        per[IDS[key].notebook].append(key)
    lines = ["Mutation score (mutants that fail every listed check's cases):",
             f"  {'notebook':<24} {'public cases':>13} {'grader cases':>13}"]
    for nb in sorted(per):
        keys = per[nb]
        pub = sum(_killed(results[k], "public") for k in keys)
        grd = sum(_killed(results[k], "grader") for k in keys)
        lines.append(f"  {nb:<24} {pub:>6}/{len(keys):<6} {grd:>6}/{len(keys):<6}")
    total = len(results)
    pub = sum(_killed(r, "public") for r in results.values())
    grd = sum(_killed(r, "grader") for r in results.values())
    lines.append(f"  {'all':<24} {pub:>6}/{total:<6} {grd:>6}/{total:<6}")
    for key, result in results.items():
        for kind in SALTS:
            alive = [c for c, msg in result[kind].items() if msg is None]
            if alive:
                lines.append(f"  survives the {kind} cases of {', '.join(alive)}: {key} "
                             f"({IDS[key].models})")
    missing = unmutated()
    if missing:
        lines.append("  no mutant yet: " + ", ".join(missing))
    return lines


def unmutated() -> list[str]:
    """The core functions and exercise cells of the whole course that no mutant edits."""
    mutated = {m.where for m in CATALOGUE}
    found = [name for functions in syllabus.TAUGHT_IN.values() for name in functions
             if name not in mutated]
    notebooks = sorted({c.notebook for c in REGISTRY.values()})
    found += [f"{nb}/{cell}" for nb in notebooks for cell in exercise_cells(nb)
              if f"{nb}/{cell}" not in mutated]
    return found


# --------------------------------------------------------------------------------------------
# The tests


def test_the_catalogue_names_known_checks_of_the_right_notebooks():
    for key, m in IDS.items():
        assert m.checks, key
        for check_id in m.checks:
            assert check_id in REGISTRY, f"{key}: no check {check_id!r}"
            # a check may test what its notebook or an earlier one teaches
            assert REGISTRY[check_id].notebook >= m.notebook, (key, check_id)


def _notebook_of(where: str) -> str:
    return where.split("/")[0] if "/" in where else syllabus.where_taught(where)[1].split(" §")[0]


def test_every_function_and_exercise_of_the_covered_notebooks_has_a_mutant():
    missing = [w for w in unmutated() if _notebook_of(w) in COVERED]
    assert not missing, f"no mutant for {missing}"


@pytest.mark.slow
@pytest.mark.parametrize("where", sorted({m.where for m in CATALOGUE}))
def test_the_solution_passes_the_checks_of_its_mutants(where):
    """The unmutated solution, run the same way, passes: a failure of a mutant is its own."""
    checks = sorted({c for m in CATALOGUE if m.where == where for c in m.checks})
    named, core = _functions(None, where)
    for check_id in checks:
        for kind, (salt, hidden) in SALTS.items():
            assert first_failure(check_id, named, salt, hidden, core) is None, (check_id, kind)


@pytest.mark.slow  # the whole catalogue: about 40 s on one core
@pytest.mark.parametrize("key", list(IDS))
def test_the_mutant_fails_the_public_and_the_graders_cases(key):
    m = IDS[key]
    RESULTS[key] = result = verdicts(m)
    alive = {kind: [c for c, msg in result[kind].items() if msg is None] for kind in SALTS}
    assert not alive["public"] and not alive["grader"], (
        f"{key} ({m.models}) passes the public cases of {alive['public']} and the grader's "
        f"cases of {alive['grader']}")
