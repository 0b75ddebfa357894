"""A notebook is a sitting (issue 40): at most 4,000 words of Markdown and at most 20 functions
written, new or extended.

Counted by rule, not by hand: the words are the whitespace-separated words of the Markdown
cells' source; the functions are the core functions whose solution marker names the notebook
(:func:`transformer_lab.syllabus.notebook_functions`: taught there or extended there) and the
solution regions of the notebook's own code cells (its notebook-level exercises).

    python tests/test_pace.py      # the table, with the README's time of each notebook
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


def readme_time(path: Path) -> str:
    """The README's rule for a notebook's time: its Markdown at 100 words a minute, plus 10 to 20
    minutes per function written, each end to the nearest half hour."""
    p = pace(path)
    low, high = (round((p["words"] / 100 + k * p["functions"]) / 30) / 2 for k in (10, 20))
    return f"{low:g} h" if low == high else f"{low:g}–{high:g} h"


def test_the_readme_times_follow_the_readme_s_rule():
    rows = {line.split("|")[1].strip(): line.rstrip(" |").rpartition("|")[2].strip()
            for line in (ROOT / "README.md").read_text().splitlines()
            if re.match(r"\| \d\d \|", line)}
    assert rows == {path.stem[:2]: readme_time(path) for path in NOTEBOOKS}


def test_the_counts_see_the_core_and_the_exercises():
    assert pace(ROOT / "notebooks" / "01_attention.ipynb")["exercises"] > 0
    assert pace(ROOT / "notebooks" / "13_gpt.ipynb")["core"] > 0


if __name__ == "__main__":
    print(f"{'notebook':<26}{'words':>7}{'core':>6}{'here':>6}{'functions':>11}  README time")
    for path in NOTEBOOKS:
        p = pace(path)
        print(f"{path.stem:<26}{p['words']:>7}{p['core']:>6}{p['exercises']:>6}{p['functions']:>11}"
              f"  {readme_time(path)}")
