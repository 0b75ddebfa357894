"""nbval in strict mode really compares outputs: a changed output, notebook not refreshed, fails.

These tests run nbval in a subprocess, the way `make test-notebooks` does, on copies of notebooks
in a temporary folder.
"""

import itertools
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from transformer_lab.course.execute import execute_notebook, merge_streams

ROOT = Path(__file__).resolve().parents[1]
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"


def run_nbval(notebook: Path) -> subprocess.CompletedProcess:
    """Run strict nbval on one notebook, as `make test-notebooks` does; return the result."""
    cmd = [sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env",
           "--nbval-sanitize-with", str(SANITIZE), "-p", "no:cacheprovider",
           "--rootdir", str(notebook.parent), str(notebook)]
    return subprocess.run(cmd, cwd=notebook.parent, capture_output=True, text=True, timeout=300)


def write_executed(path: Path, sources: list[str]) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)
    execute_notebook(path, path, timeout=60)
    return path


def edit_cell(path: Path, old: str, new: str) -> int:
    """Change code in the stored notebook without refreshing its outputs; return the number
    nbval gives that cell (its position among the code cells, from 0)."""
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    hits = [k for k, c in enumerate(code) if old in c.source]
    assert len(hits) == 1, f"expected one cell containing {old!r}, found {len(hits)}"
    code[hits[0]].source = code[hits[0]].source.replace(old, new)
    nbformat.write(nb, path)
    return hits[0]


def test_unchanged_notebook_passes_and_changed_output_fails(tmp_path):
    nb = write_executed(tmp_path / "small.ipynb", ["x = 6 * 7", "print(x)", "print('done')"])
    assert run_nbval(nb).returncode == 0

    edit_cell(nb, "6 * 7", "6 * 8")  # the printed value changes; the stored output does not
    result = run_nbval(nb)
    assert result.returncode == 1, result.stdout
    assert "1 failed, 2 passed" in result.stdout
    assert "42" in result.stdout and "48" in result.stdout  # nbval shows both outputs


def test_sanitize_file_ignores_timings_and_addresses_only(tmp_path):
    nb = write_executed(tmp_path / "noise.ipynb", [
        "import time\nt0 = time.perf_counter(); time.sleep(0.01)\n"
        "print(f'took {time.perf_counter() - t0:.4f} s')",
        "print(object())",
        "print(f'rel. error {1e-12 * (1 + time.perf_counter() % 1):.2e}  ok')",
    ])
    assert run_nbval(nb).returncode == 0  # run-to-run differences are sanitized away


def test_real_course_notebook_fails_when_its_code_changes(tmp_path):
    """One changed line fails exactly its own cell, and every other cell of the stored
    notebook passes (so no separate run of the unchanged notebook is needed: that every
    course notebook passes as stored is what `make test-notebooks` checks)."""
    src = ROOT / "notebooks" / "00_gradients.ipynb"
    copy = tmp_path / src.name
    copy.write_text(src.read_text())
    code_cells = sum(c.cell_type == "code" for c in nbformat.read(src, as_version=4).cells)

    cell = edit_cell(copy, "a = np.array([1.0, 2.0, 3.0])", "a = np.array([1.0, 2.0, 4.0])")
    result = run_nbval(copy)
    assert result.returncode == 1
    assert f"1 failed, {code_cells - 1} passed" in result.stdout, result.stdout[-2000:]
    assert f"FAILED {src.name}::Cell {cell} " in result.stdout, result.stdout[-2000:]


@pytest.mark.parametrize("notebook", sorted((ROOT / "notebooks").glob("*.ipynb")),
                         ids=lambda p: p.name)
def test_course_notebooks_are_stored_executed_in_order(notebook):
    """nbval needs every code cell stored with its outputs, executed top to bottom once."""
    cells = json.loads(notebook.read_text())["cells"]
    counts = [c["execution_count"] for c in cells if c["cell_type"] == "code" and c["source"]]
    assert all(n is not None for n in counts), f"{notebook.name} has unexecuted code cells"
    assert counts == list(range(1, len(counts) + 1)), \
        f"{notebook.name} was not executed top to bottom in one fresh kernel: {counts}"
    errors = [o for c in cells if c["cell_type"] == "code" for o in c.get("outputs", [])
              if o["output_type"] == "error" and "NBVAL_RAISES_EXCEPTION" not in c["source"]]
    assert not errors, f"{notebook.name} is stored with error outputs"
    split = [c["id"] for c in cells for a, b in itertools.pairwise(c.get("outputs", []))
             if a["output_type"] == b["output_type"] == "stream" and a["name"] == b["name"]]
    assert not split, f"{notebook.name}: a print split over two outputs in {split} (refresh it)"


def test_execute_joins_a_print_the_kernel_split():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('a b')")])
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="a"),
                           nbformat.v4.new_output("stream", name="stdout", text=" b\n"),
                           nbformat.v4.new_output("stream", name="stderr", text="w\n"),
                           nbformat.v4.new_output("stream", name="stdout", text="c\n")]
    outputs = merge_streams(nb).cells[0].outputs
    assert [(o.name, o.text) for o in outputs] == [("stdout", "a b\n"), ("stderr", "w\n"),
                                                  ("stdout", "c\n")]
