"""Execute the course notebooks in order, each in a fresh kernel, and report a table.

    python -m transformer_lab.course.execute                 # notebooks/ -> build/notebooks/
    python -m transformer_lab.course.execute --in-place      # refresh stored outputs (maintainers)
    python -m transformer_lab.course.execute notebooks/01_attention.ipynb --in-place

Without ``--in-place`` the executed copies go to ``--output-dir`` and the notebooks in
``notebooks/`` are left untouched. A copy newer than its notebook, than every file of the
package (data files included) and than every figure in ``img/`` is reported as "up to date" and
not executed again (``--force`` re-executes).
Exit status 1 when any notebook fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from transformer_lab.course.kernel_env import apply_kernel_env, client_options
from transformer_lab.course.kernel_run import one_line

PACKAGE_DIR = Path(__file__).resolve().parents[1]


@dataclass
class Result:
    notebook: str
    status: str  # "ok", "up to date", "FAILED"
    seconds: float
    error: str = ""


def find_notebooks(paths: list[str], default_dir: Path) -> list[Path]:
    """The notebooks named in ``paths`` (files or folders), or all of ``default_dir``, sorted."""
    if not paths:
        paths = [str(default_dir)]
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found.extend(sorted(q for q in p.glob("*.ipynb")))
        elif p.suffix == ".ipynb" and p.is_file():
            found.append(p)
        else:
            raise SystemExit(f"error: {p} is neither a notebook (.ipynb) nor a folder of them")
    if not found:
        raise SystemExit(f"error: no notebooks found in {', '.join(paths)}")
    return found


def _tree_mtimes(root: Path) -> list[float]:
    """Modification times of ``root`` and of every file and folder under it, bytecode caches
    left out (a folder's time changes when an entry is added, removed or renamed)."""
    if not root.is_dir():
        return []
    times = [root.stat().st_mtime]
    for path in root.rglob("*"):
        if "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo"):
            continue
        try:
            times.append(path.stat().st_mtime)
        except OSError:  # removed since it was listed (an editor's temporary file)
            times.append(time.time())  # a change all the same
    return times


def is_up_to_date(notebook: Path, copy: Path) -> bool:
    """Whether ``copy`` (an executed copy of ``notebook``) is newer than all it depends on: the
    notebook, every file of the package (not only ``*.py``: data files count too) and the
    figures in ``img/`` beside the notebooks' folder (the notebooks show ``../img/*.png``)."""
    img = notebook.resolve().parent.parent / "img"
    return copy.exists() and copy.stat().st_mtime > max(
        [notebook.stat().st_mtime, *_tree_mtimes(PACKAGE_DIR), *_tree_mtimes(img)])


def execute_notebook(src: Path, dest: Path, timeout: int, keep_failed: bool = False) -> None:
    """Run ``src`` top to bottom in a fresh kernel started in its folder; write it to ``dest``.

    When a cell fails the exception propagates; with ``keep_failed`` the notebook is written to
    ``dest`` first, executed up to and including the failing cell, so it can be inspected.
    """
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(src, as_version=4)
    client = NotebookClient(nb, timeout=timeout, **client_options(src.parent.resolve()))
    try:
        client.execute()
    except Exception:
        if keep_failed:
            dest.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, dest)
            os.utime(dest, (0, 0))  # older than any source: never taken for an up-to-date copy
        raise
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(merge_streams(nb), dest)


def merge_streams(nb):
    """``nb`` with each run of stream outputs of one name (stdout, stderr) in a cell joined into
    one: how the kernel split a print between messages varies from run to run, so the stored
    outputs would change with no change in what they say."""
    for cell in nb.cells:
        merged = []
        for output in cell.get("outputs", []):
            last = merged[-1] if merged else None
            if output.output_type == "stream" and last is not None and \
                    last.output_type == "stream" and last.name == output.name:
                last.text += output.text
            else:
                merged.append(output)
        if cell.cell_type == "code":
            cell.outputs = merged
    return nb


def run(notebooks: list[Path], out_dir: Path | None, timeout: int, force: bool) -> list[Result]:
    apply_kernel_env()
    results = []
    n = len(notebooks)
    for k, src in enumerate(notebooks, 1):
        dest = src if out_dir is None else out_dir / src.name
        prefix = f"[{k}/{n}] {src.name}"
        if out_dir is not None and not force and is_up_to_date(src, dest):
            print(f"{prefix} ... up to date", flush=True)
            results.append(Result(src.name, "up to date", 0.0))
            continue
        print(f"{prefix} ... ", end="", flush=True)
        start = time.perf_counter()
        try:
            # A failed copy is kept in the output folder to be inspected; never in place.
            execute_notebook(src, dest, timeout, keep_failed=out_dir is not None)
        except Exception as exc:  # report and go on with the next notebook
            seconds = time.perf_counter() - start
            # the last line of the message (a CellExecutionError's is the exception's)
            lines = [one_line(line) for line in str(exc).splitlines()]
            error = next((line for line in reversed(lines) if line), type(exc).__name__)
            if out_dir is not None:
                error += f" (executed up to the failing cell in {dest})"
            results.append(Result(src.name, "FAILED", seconds, error))
            print(f"FAILED after {seconds:.1f} s: {results[-1].error}", flush=True)
            continue
        seconds = time.perf_counter() - start
        results.append(Result(src.name, "ok", seconds))
        print(f"ok ({seconds:.1f} s)", flush=True)
    return results


def format_table(results: list[Result]) -> str:
    w = max(len("notebook"), *(len(r.notebook) for r in results))
    rule = f"{'-' * w}  {'-' * 10}  {'-' * 7}"
    lines = [f"{'notebook':<{w}}  {'status':<10}  {'seconds':>7}", rule]
    for r in results:
        secs = f"{r.seconds:7.1f}" if r.status != "up to date" else f"{'-':>7}"
        lines.append(f"{r.notebook:<{w}}  {r.status:<10}  {secs}")
    total = sum(r.seconds for r in results)
    return "\n".join([*lines, rule, f"{'total':<{w}}  {'':<10}  {total:7.1f}"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*",
                        help="notebooks or folders (default: the notebooks/ folder)")
    parser.add_argument("--notebook-dir", default="notebooks", type=Path,
                        help="folder searched when no notebooks are named (default: notebooks)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--output-dir", default="build/notebooks", type=Path,
                       help="where executed copies go (default: build/notebooks)")
    where.add_argument("--in-place", action="store_true",
                       help="overwrite the notebooks with their executed versions")
    parser.add_argument("--timeout", type=int, default=600,
                        help="seconds a single cell may run (default: 600)")
    parser.add_argument("--force", action="store_true",
                        help="execute even notebooks whose executed copy is up to date")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error(f"--timeout must be a positive number of seconds, got {args.timeout}")

    notebooks = find_notebooks(args.notebooks, args.notebook_dir)
    results = run(notebooks, None if args.in_place else args.output_dir, args.timeout, args.force)
    print()
    print(format_table(results))
    failed = [r for r in results if r.status == "FAILED"]
    for r in failed:
        print(f"\n{r.notebook}: {r.error}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
