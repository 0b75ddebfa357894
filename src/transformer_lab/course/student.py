"""Write the student versions of the course notebooks, and what a student needs beside them.

    python -m transformer_lab.course.student                  # notebooks/ -> build/student/
    python -m transformer_lab.course.student --out handout    # somewhere else

In each notebook every ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` region becomes a stub
that raises ``NotImplementedError("Exercise: <hint>")``, every ``### BEGIN HIDDEN TESTS`` ...
``### END HIDDEN TESTS`` region is removed, outputs are cleared, and check cells are kept
(locked against editing and deletion, as nbgrader does). Beside the notebooks go the package
(``src/``, ``pyproject.toml``), ``requirements.txt``, ``img/`` and a README for students -- not
the instructors' tests. A misplaced or unbalanced marker stops the build before anything is
written, with the notebook, cell and line (see :mod:`transformer_lab.course.assignment`).
"""

from __future__ import annotations

import argparse
import copy
import re
import shutil
import sys
from pathlib import Path

import nbformat

from transformer_lab.course.assignment import (
    DEFAULT_HINT,
    Assignment,
    AssignmentError,
    Region,
    check_apart,
    fresh_output_dir,
    has_marker_words,
    load_assignments,
    solution_notebooks,
    source_lines,
)
from transformer_lab.course.standalone import has_guard

#: What the student tree holds besides the notebooks, relative to the project folder.
PROJECT_FILES = ("pyproject.toml", "requirements.txt")
PROJECT_DIRS = ("src", "img")
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".ipynb_checkpoints")
_DEF = re.compile(r"^(?P<indent>[ \t]*)(?:async\s+)?def\s+(?P<name>\w+)")


def stub(lines: list[str], region: Region) -> str:
    """The line that replaces ``region``: ``raise NotImplementedError("Exercise: <hint>")``."""
    message = f"Exercise: {region.hint or _default_hint(lines, region)}"
    literal = f'"{message}"' if '"' not in message and "\\" not in message else repr(message)
    return f"{region.indent}raise NotImplementedError({literal})"


def _default_hint(lines: list[str], region: Region) -> str:
    """``complete f()`` for a region in the body of ``def f``; a generic hint elsewhere."""
    for line in reversed(lines[:region.begin]):
        match = _DEF.match(line)
        if match and len(match["indent"]) < len(region.indent):
            return f"complete {match['name']}()"
    return DEFAULT_HINT


def replace_regions(source: str, regions: list[Region], with_stub: bool) -> str:
    """``source`` with each region (markers included) replaced by its stub, or removed."""
    lines = source.split("\n")
    out: list[str] = []
    start = 0
    for region in regions:
        out.extend(lines[start:region.begin])
        if with_stub:
            out.append(stub(lines, region))
        start = region.end + 1
    out.extend(lines[start:])
    return "\n".join(out)


def student_notebook(assignment: Assignment) -> nbformat.NotebookNode:
    """The student version of one checked solution notebook."""
    nb = copy.deepcopy(assignment.nb)
    exercises = {e.cell_id: e for e in assignment.exercises}
    checks = {c.cell_id: c for c in assignment.checks}
    for cell in nb.cells:
        if cell.get("id") in exercises:
            cell.source = replace_regions(cell.source, exercises[cell.id].regions, with_stub=True)
            cell.metadata["deletable"] = False  # nbgrader's LockCells does the same
        elif cell.get("id") in checks:
            cell.source = replace_regions(cell.source, checks[cell.id].hidden, with_stub=False)
            cell.metadata["deletable"] = False
            cell.metadata["editable"] = False
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
            for key in ("execution", "collapsed", "scrolled"):
                cell.metadata.pop(key, None)
    _assert_no_markers_left(nb, assignment.name)
    nbformat.validate(nb)
    return nb


def _assert_no_markers_left(nb, name: str) -> None:
    """A last guard: parse_notebook's checks leave no marker behind; fail loudly if one is."""
    for number, cell in enumerate(nb.cells, 1):
        for k, line in enumerate(source_lines(cell), 1):
            if has_marker_words(line):
                raise AssertionError(f"{name}, cell {number}, line {k}: a marker is left in the "
                                     "student version")


def title(nb) -> str:
    """The first Markdown heading of a notebook, without the ``#``."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in source_lines(cell):
                if line.startswith("# "):
                    return line[2:].strip()
    return ""


def student_readme(assignments: list[Assignment]) -> str:
    """The README of the student tree: setting up, working on exercises, handing them in."""
    rows = "\n".join(
        f"| `notebooks/{Path(a.name).name}` | {title(a.nb)} | {len(a.exercises)} "
        f"| {len(a.checks)} | {a.max_points:g} |"
        for a in assignments)
    guarded = (" A notebook opened without the package installed stops in its first cell and "
               "prints the line that installs it." if assignments and all(
                   has_guard(a.nb) for a in assignments) else "")
    return f"""# Transformers from Scratch -- your assignments

You build a Transformer in NumPy, one notebook at a time, checking every step against PyTorch
and against numerical gradients.

| notebook | topic | exercises | checks | points |
|---|---|---|---|---|
{rows}

## Set up (once)

You need Python 3.10, 3.11, 3.12 or 3.13. In this folder (there is no Makefile here: these
three commands are the whole set-up):

```bash
python3 -m venv .venv
.venv/bin/pip install -r requirements.txt -e .    # Windows: .venv\\Scripts\\pip
.venv/bin/jupyter lab notebooks                   # as root (a container): add --allow-root
```

`-e .` installs the course package from `src/` so that your edits to it take effect (restart
the kernel after editing). From another folder, name this one instead of `.`:
`pip install -r <this folder>/requirements.txt -e <this folder>`.{guarded}

`requirements.txt` pins a CPU build of PyTorch. On Linux, pip would otherwise download several
GB of CUDA libraries: point pip at PyTorch's CPU-only wheel index first (its address is on the
"Get Started" page of pytorch.org, Compute Platform: CPU) with
`export PIP_EXTRA_INDEX_URL=<that address>`.

## Working on an exercise

- Each exercise is a cell with a function to complete. Where your code goes, the cell holds a
  line `raise NotImplementedError("Exercise: ...")` with a hint: replace that line with your
  code, keep the function's name and arguments.
- The cell after each exercise checks it (an `assert` fails, or a gradient check prints `FAIL`).
  Check cells are locked: do not edit, delete or rename them -- for grading, the instructor's
  own check cells are put back in place of yours, and they include further, hidden tests.
- Run every notebook top to bottom in a fresh kernel (Kernel > Restart Kernel and Run All Cells)
  before handing it in: that is how it is graded, each cell with a time limit.

## Handing in

Hand in the notebook files themselves, under their own names (for example
`{Path(assignments[0].name).name if assignments else "00_topic.ipynb"}`), as your instructor
tells you.
"""


def write_student_tree(assignments: list[Assignment], project: Path, out: Path) -> list[Path]:
    """Write the student versions and the project files into ``out``; return the notebooks."""
    written = []
    (out / "notebooks").mkdir(parents=True, exist_ok=True)
    for assignment in assignments:
        dest = out / "notebooks" / Path(assignment.name).name
        nbformat.write(student_notebook(assignment), dest)
        written.append(dest)
    for name in PROJECT_FILES:
        shutil.copy2(project / name, out / name)
    for name in PROJECT_DIRS:
        if (project / name).is_dir():
            shutil.copytree(project / name, out / name, ignore=_IGNORE)
    (out / "README.md").write_text(student_readme(assignments))
    return written


def format_table(assignments: list[Assignment]) -> str:
    width = max(len("notebook"), *(len(Path(a.name).name) for a in assignments))
    lines = [f"{'notebook':<{width}}  exercises  checks  points", "-" * (width + 27)]
    for a in assignments:
        lines.append(f"{Path(a.name).name:<{width}}  {len(a.exercises):>9}  {len(a.checks):>6}  "
                     f"{a.max_points:>6g}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=Path("notebooks"),
                        help="folder of solution notebooks (default: notebooks)")
    parser.add_argument("--out", type=Path, default=Path("build/student"),
                        help="folder to write the student tree to, emptied first "
                             "(default: build/student)")
    parser.add_argument("--project", type=Path, default=Path("."),
                        help="folder holding src/, pyproject.toml, requirements.txt and img/ "
                             "(default: the current folder)")
    args = parser.parse_args(argv)
    missing = [n for n in (*PROJECT_FILES, "src") if not (args.project / n).exists()]
    if missing:
        parser.error(f"--project must be the course's folder; {str(args.project)!r} lacks "
                     f"{', '.join(missing)}")

    inputs = {"--source": args.source,
              **{f"--project's {name}/": args.project / name for name in PROJECT_DIRS}}
    check_apart(args.out, "--out", inputs)  # --out is emptied: refuse it before reading
    try:
        assignments = load_assignments(solution_notebooks(args.source))
    except AssignmentError as err:
        print(f"error: cannot make student versions, {len(err.problems)} problem(s) with the "
              f"markers or metadata:\n{err}", file=sys.stderr)
        return 1
    fresh_output_dir(args.out, "--out", inputs)
    write_student_tree(assignments, args.project, args.out)
    print(format_table(assignments))
    print(f"\nstudent versions and course files: {args.out}/ (notebooks in {args.out}/notebooks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
