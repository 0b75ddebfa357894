"""Write the handout: the student versions of the notebooks and the package with its core stubbed.

    python -m transformer_lab.course.student                  # notebooks/ -> build/student/
    python -m transformer_lab.course.student --out handout    # somewhere else

What it holds: docs/instructors.md, "Handing out"; the course version is recorded in it
(:mod:`.versions`). A misplaced or unbalanced marker stops the build before anything is
written (:mod:`.assignment`).
"""

from __future__ import annotations

import argparse
import copy
import re
import shutil
import sys
from pathlib import Path

import nbformat

from transformer_lab import syllabus
from transformer_lab.course.assignment import (
    DEFAULT_HINT,
    PROJECT_FILES,
    Assignment,
    AssignmentError,
    Region,
    assert_no_markers,
    check_apart,
    check_project,
    fresh_output_dir,
    load_assignments,
    raise_line,
    replace_regions,
    solution_notebooks,
    source_lines,
)
from transformer_lab.course.package import (
    IGNORE_NAMES,
    Package,
    PackageError,
    parse_package,
    write_handout_package,
)
from transformer_lab.course.standalone import has_guard
from transformer_lab.course.versions import BUILT, project_version, stamp

#: PyTorch's CPU wheel index: the README's set-up installs torch from it first.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def torch_pin(project: Path) -> str:
    """The line of ``project``'s requirements.txt that pins torch (``torch==<version>``): its one
    source, which the handout's README repeats."""
    for line in (project / "requirements.txt").read_text(encoding="utf-8").splitlines():
        if re.fullmatch(r"torch==[\w.+]+", line.strip()):
            return line.strip()
    raise HandoutError(f"{project / 'requirements.txt'} pins no torch (a line torch==<version>)")


#: What the student tree holds besides the notebooks, the package and PROJECT_FILES.
PROJECT_DIRS = ("img",)
_DEF = re.compile(r"^(?P<indent>[ \t]*)(?:async\s+)?def\s+(?P<name>\w+)")


def stub(lines: list[str], region: Region) -> str:
    """The line that replaces ``region``: ``raise NotImplementedError("Exercise: <hint>")``."""
    return raise_line(region.indent, f"Exercise: {region.hint or _default_hint(lines, region)}")


def _default_hint(lines: list[str], region: Region) -> str:
    """``complete f()`` for a region in the body of ``def f``; a generic hint elsewhere."""
    for line in reversed(lines[:region.begin]):
        match = _DEF.match(line)
        if match and len(match["indent"]) < len(region.indent):
            return f"complete {match['name']}()"
    return DEFAULT_HINT


def student_notebook(assignment: Assignment) -> nbformat.NotebookNode:
    """The student version of one checked solution notebook."""
    nb = copy.deepcopy(assignment.nb)
    exercises = {e.cell_id: e for e in assignment.exercises}
    checks = {c.cell_id for c in assignment.checks}
    for cell in nb.cells:
        if cell.get("id") in exercises:
            regions, lines = exercises[cell.id].regions, cell.source.split("\n")
            cell.source = replace_regions(cell.source, regions, [stub(lines, r) for r in regions])
            cell.metadata["deletable"] = False  # nbgrader's LockCells does the same
        elif cell.get("id") in checks:
            cell.metadata["deletable"] = False
            cell.metadata["editable"] = False
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            for key in ("execution", "collapsed", "scrolled"):
                cell.metadata.pop(key, None)
    for number, cell in enumerate(nb.cells, 1):  # a last guard: parse_notebook's checks
        assert_no_markers(source_lines(cell), f"{assignment.name}, cell {number}",
                          "student version")
    nbformat.validate(nb)
    return nb


def title(nb) -> str:
    """The first Markdown heading of a notebook, without the ``#``."""
    return next((line[2:].strip() for cell in nb.cells if cell.cell_type == "markdown"
                 for line in source_lines(cell) if line.startswith("# ")), "")


def _core_functions(notebook: str) -> list[str]:
    return [f"`{name}`" for names in syllabus.notebook_functions(notebook).values()
            for name in names]


def student_readme(assignments: list[Assignment], torch: str) -> str:
    """The README of the handout: setting up (``torch``: :func:`torch_pin`), writing core
    functions and notebook exercises, handing in."""
    rows = "\n".join(
        f"| `notebooks/{Path(a.name).name}` | {title(a.nb)} "
        f"| {', '.join(_core_functions(Path(a.name).stem)) or '--'} | {len(a.exercises)} "
        f"| {len(a.checks)} | {a.max_points:g} |"
        for a in assignments)
    example = Path(assignments[0].name).name if assignments else "00_topic.ipynb"
    guarded = (" A notebook opened without the package installed stops in its first cell and "
               "prints the line that installs it." if assignments and all(
                   has_guard(a.nb) for a in assignments) else "")
    return f"""# Transformers from Scratch -- your assignments

You build a Transformer in NumPy, one notebook at a time, checking every step against PyTorch
and against numerical gradients. You write the functions of the package `transformer_lab` -- its
core, in `src/transformer_lab/core/` -- and the notebooks, the model and the trainer run on
them: at the end, the model that learns is your own code.

| notebook | topic | core functions you write | notebook exercises | checks | points |
|---|---|---|---|---|---|
{rows}

## Set up (once)

(A workspace that the course's `make learn` built is set up already: reopen it with `make learn`
in the course folder -- `make learn WORKSPACE=...` if you built it elsewhere -- and skip this
section.)

You need Python 3.10, 3.11, 3.12 or 3.13. In this folder (there is no Makefile here: these
four commands are the whole set-up):

```bash
python3 -m venv .venv
.venv/bin/pip install --index-url {TORCH_CPU_INDEX} {torch}
.venv/bin/pip install -r requirements.txt -e .    # Windows: .venv\\Scripts\\pip
.venv/bin/jupyter lab            # in this folder: notebooks/ and src/ both in its file browser
```

(As root, in a container, add `--allow-root` to the last line.) The second line installs
PyTorch's CPU build, all the course needs, from PyTorch's CPU wheel index; without it, pip on
Linux would download several GB of CUDA libraries. `requirements.txt` pins the same
`{torch}`, so the third line keeps it and adds what the notebooks, JupyterLab and the
package need; `-e .` installs this folder's package, editable: the notebooks import *your*
`src/transformer_lab`, so what you write there is what they run. From another folder, name this
one instead of `.`: `pip install -r <this folder>/requirements.txt -e <this folder>`.{guarded}

The commands here call the environment's programs by their path (`.venv/bin/python`); with the
environment activated (`source .venv/bin/activate`; Windows: `.venv\\Scripts\\activate`),
`python` and `jupyter lab` alone do the same.

## Writing a core function

When a notebook has derived a piece of the Transformer, a cell tells you to write it into the
package, for example "write `softmax_forward` in `src/transformer_lab/core/layers.py`":

1. open the file (JupyterLab's file browser, or your editor) and find the function. Its
   docstring gives the shapes; its body is one line,
   `raise NotImplementedError("softmax_forward() ... is yours to write: ...")`;
2. replace that line with your code. Keep the function's name and arguments and what it returns
   (`op_forward(...) -> (out, cache)`, `op_backward(dout, cache) -> (gradients..., grads)`, as
   the module's docstring says); lines before and after the stub (unpacking the cache, the
   `return`) are part of the convention: use their names;
3. save the file and run the check cell below the instructions, `check("check-softmax-forward")`.
   The notebook picks up your change without a restart: `setup_notebook()`, in every
   notebook's second code cell, turns on IPython's autoreload for the core modules.

Later notebooks, the model (`transformer_lab.models.encoder_decoder`) and the trainer call your
functions: one you have not written yet stops them with its stub's message, which names the
notebook and section that teach it. Once you have written the functions of notebooks 00 to 10,
your Transformer learns to reverse sequences from the command line, in this folder:

```bash
.venv/bin/python -m transformer_lab.train --task reverse --seed 0
```

(In a workspace that the course's `make learn` built, there is no `.venv` here: the environment
is the course folder's, and it holds the course's finished package too. Run the trainer from the
course folder as `PYTHONPATH="$PWD/workspace/src" .venv/bin/python -m transformer_lab.train
...`, with your workspace's folder for `$PWD/workspace` if you built it elsewhere: without that
`PYTHONPATH`, Python imports the finished package, not yours.)

## Notebook exercises

Some exercises are a function in a notebook cell: where your code goes, the cell holds a line
`raise NotImplementedError("Exercise: ...")` with a hint. Replace that line with your code, keep
the function's name and arguments. For grading, the notebook's first code cell, the functions,
classes and imports of its other cells and its exercise cells are run: a helper your function
uses must be a function (or an import), not a variable set in another cell (the check notes
one). The check cell after it passes your function in: `check("check-logsumexp", logsumexp)`.

## Checks

Check cells are one line and locked: do not edit, delete or move them. One prints
`check-... passed (N cases).`, or names the case that failed, shows what was expected against
what came back, and, where it recognises it, the mistake behind it. Grading runs your functions
again, outside your notebook, on other inputs as well (hidden cases): a function that passes only
the cases shown here loses the points. Run every notebook top to bottom in a fresh kernel
(Kernel > Restart Kernel and Run All Cells) before handing it in.

## Handing in

Hand in this folder as you worked in it, without `.venv/` (zip it, or as your instructor tells
you): the notebooks (`notebooks/{example}` ...) and your package's core,
`src/transformer_lab/core/*.py`, under their own names. Each notebook is graded with your core
functions for that notebook and the reference for the earlier notebooks' (stubs for the later
notebooks', which its checks do not call), so a mistake in one notebook's functions costs that
notebook's points only -- and in each notebook that extends the same function (the table above
lists them per notebook).
"""


def write_student_tree(assignments: list[Assignment], project: Path, out: Path,
                       package: Package | None = None) -> list[Path]:
    """Write the student versions, the handout's package and the project files into ``out``,
    each recording ``project``'s course version; return the notebooks. ``package``: the parsed
    ``project/src/transformer_lab``."""
    version = project_version(project)
    written = []
    (out / "notebooks").mkdir(parents=True, exist_ok=True)
    for assignment in assignments:
        dest = out / "notebooks" / Path(assignment.name).name
        nb = student_notebook(assignment)
        stamp(nb, version.of_notebook(project / "src" / "transformer_lab", assignment))
        nbformat.write(nb, dest)
        written.append(dest)
    for name in PROJECT_FILES:
        shutil.copy2(project / name, out / name)
    for name in PROJECT_DIRS:
        if (project / name).is_dir():
            shutil.copytree(project / name, out / name,
                            ignore=shutil.ignore_patterns(*IGNORE_NAMES))
    write_handout_package(project / "src", out / "src", package, version.commit)
    (out / "README.md").write_text(student_readme(assignments, torch_pin(project)))
    return written


#: What each count of :func:`format_table` counts, printed under it.
TABLE_LEGEND = ("core functions: the functions of src/transformer_lab/core/ that the notebook "
                "asks you to write;\nnotebook exercises: what you complete in the notebook's own "
                "cells;\nchecks: its check cells, which grading runs again; "
                "points: what they are worth.")


def format_table(assignments: list[Assignment]) -> str:
    """A row per notebook: the core functions it asks for, its notebook exercises, checks and
    points; a total; and what each column counts."""
    width = max(len("notebook"), len("total"), *(len(Path(a.name).name) for a in assignments))
    header = f"{'notebook':<{width}}  core functions  notebook exercises  checks  points"
    rows = [(Path(a.name).name, len(_core_functions(Path(a.name).stem)), len(a.exercises),
             len(a.checks), a.max_points) for a in assignments]
    rows.append(("total", *(sum(r[k] for r in rows) for k in range(1, 5))))
    lines = [header, "-" * len(header)]
    for k, (name, functions, exercises, checks, points) in enumerate(rows):
        if k == len(rows) - 1:
            lines.append("-" * len(header))
        lines.append(f"{name:<{width}}  {functions:>14}  {exercises:>18}  {checks:>6}  "
                     f"{points:>6g}")
    return "\n".join(lines) + "\n\n" + TABLE_LEGEND


def report(assignments: list[Assignment]) -> str:
    """What a build prints: :func:`format_table`, and the check cells make grade cannot grade."""
    legacy = [f"{Path(a.name).stem}: {', '.join(c.cell_id for c in a.legacy_checks)}"
              for a in assignments if a.legacy_checks]
    note = ("\n\nnote: check cells that are not one-line check(...) calls, which make grade "
            "cannot grade (docs/maintainers.md, 'Writing exercises'):\n  " + "\n  ".join(legacy)
            if legacy else "")
    return format_table(assignments) + note


class HandoutError(Exception):
    """The handout cannot be built: the message says why (the problems, one per line)."""


def build(source: Path, out: Path, project: Path) -> list[Assignment]:
    """Check the markers of the notebooks in ``source`` and of ``project``'s package, then write
    the handout into ``out`` (emptied first; nothing is written when a check fails); the
    assignments. Raises :class:`HandoutError`, or SystemExit for a ``project`` that is not the
    course's folder or an ``out`` that may not be emptied."""
    check_project(project)
    if (project / "src" / "transformer_lab" / BUILT).is_file():
        raise HandoutError(f"{str(project)!r} is a handout (a workspace, or what make student "
                           f"writes: its src/transformer_lab/{BUILT} records the course it was "
                           "built from), not the course's folder: run this in the course's "
                           "folder, or name that folder with --project")
    inputs = {"--source": source,
              **{f"--project's {name}/": project / name for name in (*PROJECT_DIRS, "src")}}
    check_apart(out, "--out", inputs)  # --out is emptied: refuse it before reading
    try:
        assignments = load_assignments(solution_notebooks(source))
    except AssignmentError as err:
        raise HandoutError(f"cannot make student versions, {len(err.problems)} problem(s) with "
                           f"the markers or metadata:\n{err}") from err
    try:
        package = parse_package(project / "src" / "transformer_lab")
    except PackageError as err:
        raise HandoutError(f"cannot make the handout's package, {len(err.problems)} problem(s) "
                           f"with the markers in the package:\n{err}") from err
    fresh_output_dir(out, "--out", inputs)
    write_student_tree(assignments, project, out, package)
    return assignments


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
    try:
        assignments = build(args.source, args.out, args.project)
    except HandoutError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(report(assignments))
    print(f"\nthe handout: {args.out}/ (notebooks in {args.out}/notebooks, the package with its "
          f"core stubbed in {args.out}/src), course version {project_version(args.project)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
