"""A notebook is a sitting (issue 40): at most 4,000 words of Markdown and at most 20 functions
written, new or extended.

Counted by rule, not by hand: the words are the whitespace-separated words of the Markdown
cells' source; the functions are the core functions whose solution marker names the notebook
(:func:`transformer_lab.syllabus.notebook_functions`: taught there or extended there) and the
solution regions of the notebook's own code cells (its notebook-level exercises).

    python tests/test_pace.py      # the table
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from transformer_lab import syllabus

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MAX_WORDS = 4000
MAX_FUNCTIONS = 20
_REGION = re.compile(r"^[ \t]*### BEGIN SOLUTION", re.M)


def pace(path: Path) -> dict[str, int]:
    """The Markdown words, the core functions and the notebook exercises of one notebook."""
    nb = nbformat.read(path, as_version=4)
    words = sum(len(c.source.split()) for c in nb.cells if c.cell_type == "markdown")
    core = sum(len(fs) for fs in syllabus.notebook_functions(path.stem).values())
    exercises = sum(len(_REGION.findall(c.source)) for c in nb.cells if c.cell_type == "code")
    return {"words": words, "core": core, "exercises": exercises, "functions": core + exercises}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_notebook_is_a_sitting(path):
    p = pace(path)
    assert p["words"] <= MAX_WORDS, f"{path.stem}: {p['words']} words of Markdown"
    assert p["functions"] <= MAX_FUNCTIONS, \
        f"{path.stem}: {p['functions']} functions written ({p['core']} core, {p['exercises']} here)"


def test_the_counts_see_the_core_and_the_exercises():
    assert pace(ROOT / "notebooks" / "01_attention.ipynb")["exercises"] > 0
    assert pace(ROOT / "notebooks" / "13_gpt.ipynb")["core"] > 0


if __name__ == "__main__":
    print(f"{'notebook':<26}{'words':>7}{'core':>6}{'here':>6}{'functions':>11}")
    for path in NOTEBOOKS:
        p = pace(path)
        print(f"{path.stem:<26}{p['words']:>7}{p['core']:>6}{p['exercises']:>6}{p['functions']:>11}")
