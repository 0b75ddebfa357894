"""Helpers shared by the classroom tests: running slow parts once per session, cell metadata, and
a small synthetic course on the real checks of notebook 01.

The synthetic ``01_attention`` solution notebook has the real check cells of notebook 01 --
``check-softmax-forward`` and ``check-attention-forward`` (core functions, in the package) and
``check-logsumexp``, ``check-cosine-attention``, ``check-additive-attention`` (notebook
functions) -- with short solutions, and a first cell that imports only NumPy and ``check`` (the
probes and kernels of the tests start fast). The course's own notebooks are being rewritten; the
end-to-end tests run on them when they have one-line check cells.
"""

from __future__ import annotations

import contextlib
import csv
import os
import shutil
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "src" / "transformer_lab" / "core"
v4 = nbformat.v4


def _sandbox_problem() -> str:
    """Why the grader's sandbox cannot run here ('' when it can)."""
    from transformer_lab.course.sandbox import SandboxUnavailable, find_sandbox

    try:
        find_sandbox().close()
    except SandboxUnavailable as err:
        return str(err)
    return ""


#: Why the grader's sandbox (bubblewrap) cannot run on this machine; '' where it can. CI
#: (.ci/run installs bubblewrap) must have it: there the sandbox tests fail instead of skipping.
SANDBOX_PROBLEM = _sandbox_problem()
SANDBOXED = not SANDBOX_PROBLEM
#: What the grading tests pass the grader: nothing (the sandbox) where bubblewrap works; on a
#: machine without it, --no-sandbox, so that the rest of the grader is still tested.
SANDBOX_ARGS = [] if SANDBOXED else ["--no-sandbox"]


def require_sandbox() -> None:
    """Skip a test that needs the sandbox where there is none -- except in CI, where it fails."""
    import pytest

    if SANDBOXED:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI must have the grader's sandbox: {SANDBOX_PROBLEM}")
    pytest.skip(f"the grader's sandbox cannot run here: {SANDBOX_PROBLEM}")


@contextlib.contextmanager
def _exclusive(lock: Path, wait: float = 1800):
    """Hold ``lock`` (a file created exclusively) for the duration; portable across systems."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            break
        except FileExistsError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{lock} held for more than {wait} s") from None
            time.sleep(0.2)
    try:
        yield
    finally:
        os.close(fd)
        lock.unlink()


def once_per_session(tmp_path_factory, name: str, produce) -> Path:
    """Run ``produce(folder)`` once per test session, shared by all xdist workers."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, shared by the workers
    out, done = root / name, root / f"{name}.done"
    with _exclusive(root / f"{name}.lock"):
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)
            produce(out)
            done.touch()
    return out


def read_csv(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def write(nb, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def meta(kind: str, cell_id: str, points: float = 0) -> dict:
    """nbgrader's metadata of an exercise or a check cell, as the course writes it."""
    if kind == "exercise":
        return {"nbgrader": {"grade": False, "grade_id": cell_id, "locked": False,
                             "schema_version": 3, "solution": True}}
    return {"nbgrader": {"grade": True, "grade_id": cell_id, "locked": True, "points": points,
                         "schema_version": 3, "solution": False}}


def _kernelspec(nb):
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


# --- the synthetic notebook 01 ---------------------------------------------------------------

SETUP = "import numpy as np\n\nfrom transformer_lab.checks import check"
LOGSUMEXP = '''def logsumexp(x, axis=-1):
    """log(sum(exp(x))) along ``axis``, without overflow."""
    ### BEGIN SOLUTION: subtract the maximum along axis, add it back after the log
    c = np.max(x, axis=axis, keepdims=True)
    c = np.where(np.isfinite(c), c, 0)
    return np.squeeze(c, axis) + np.log(np.sum(np.exp(x - c), axis=axis))
    ### END SOLUTION'''
COSINE = '''def cosine_attention(q, k, v, tau=0.1):
    """Attention on cosine similarities divided by tau -> (out, weights)."""
    ### BEGIN SOLUTION
    qn = q / np.linalg.norm(q, axis=-1, keepdims=True)
    kn = k / np.linalg.norm(k, axis=-1, keepdims=True)
    s = qn @ np.swapaxes(kn, -1, -2) / tau
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return w @ v, w
    ### END SOLUTION'''
ADDITIVE = '''def additive_attention(q, k, v, W1, W2, w):
    """Bahdanau's attention: scores w . tanh(q W1 + k W2) -> (out, weights)."""
    ### BEGIN SOLUTION
    s = np.tanh((q @ W1)[:, None, :] + (k @ W2)[None, :, :]) @ w
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    return a @ v, a
    ### END SOLUTION'''
POINTS_01 = {"check-softmax-forward": 2, "check-attention-forward": 2, "check-logsumexp": 1,
             "check-cosine-attention": 1, "check-additive-attention": 1}


def notebook_01(edit: dict[str, str] | None = None, drop=()):
    """The synthetic solution notebook 01 (``edit``: cell id -> new source)."""
    cells = [
        v4.new_markdown_cell("# 01 · Attention\n\nA short notebook on the real checks.",
                             id="intro"),
        v4.new_code_cell(SETUP, id="setup"),
        v4.new_markdown_cell("Write `softmax_forward` in `src/transformer_lab/core/layers.py`; "
                             "its docstring gives the shapes.", id="ask-softmax"),
        v4.new_code_cell('check("check-softmax-forward")', id="check-softmax-forward",
                         metadata=meta("check", "check-softmax-forward", 2)),
        v4.new_markdown_cell("Write `attention_forward` in "
                             "`src/transformer_lab/core/attention.py`.", id="ask-attention"),
        v4.new_code_cell('check("check-attention-forward")', id="check-attention-forward",
                         metadata=meta("check", "check-attention-forward", 2)),
        v4.new_code_cell(LOGSUMEXP, id="exercise-logsumexp",
                         metadata=meta("exercise", "exercise-logsumexp")),
        v4.new_code_cell('check("check-logsumexp", logsumexp)', id="check-logsumexp",
                         metadata=meta("check", "check-logsumexp", 1)),
        v4.new_code_cell(COSINE, id="exercise-cosine", metadata=meta("exercise",
                                                                     "exercise-cosine")),
        v4.new_code_cell('check("check-cosine-attention", cosine_attention)',
                         id="check-cosine-attention",
                         metadata=meta("check", "check-cosine-attention", 1)),
        v4.new_code_cell(ADDITIVE, id="exercise-additive",
                         metadata=meta("exercise", "exercise-additive")),
        v4.new_code_cell('check("check-additive-attention", additive_attention)',
                         id="check-additive-attention",
                         metadata=meta("check", "check-additive-attention", 1)),
        v4.new_code_cell("print('the end')", id="end"),
    ]
    cells = [c for c in cells if c.id not in drop]
    for cell in cells:
        cell.source = (edit or {}).get(cell.id, cell.source)
    return _kernelspec(v4.new_notebook(cells=cells))


def student_01(edit: dict[str, str] | None = None, before: dict[str, str] | None = None):
    """The handout's notebook 01 (stubs), with cells replaced (``edit``) or code put in front
    of a cell's source (``before``)."""
    from transformer_lab.course import assignment, student

    parsed = assignment.parse_notebook(notebook_01(), "01_attention.ipynb")
    nb = student.student_notebook(parsed)
    for cell in nb.cells:
        if cell.id in (before or {}):
            cell.source = before[cell.id] + "\n" + cell.source
        if cell.id in (edit or {}):
            cell.source = edit[cell.id]
    return nb


def solved_01(edit: dict[str, str] | None = None):
    """A student's notebook 01 with every exercise solved (the solution, markers and all)."""
    return notebook_01(edit)


def reference_core(dest: Path, replace: dict[str, dict[str, str]] | None = None) -> Path:
    """The instructor's core modules copied into ``dest`` (a student who wrote them all);
    ``replace``: module -> function -> a new definition."""
    from transformer_lab.course.package import top_level_functions

    dest.mkdir(parents=True, exist_ok=True)
    for path in sorted(CORE.glob("*.py")):
        source = path.read_text()
        for name, definition in (replace or {}).get(path.stem, {}).items():
            first, last = top_level_functions(source)[name]
            lines = source.split("\n")
            source = "\n".join(lines[:first] + definition.split("\n") + lines[last + 1:])
        (dest / path.name).write_text(source)
    return dest


def stubbed_core(dest: Path, replace: dict[str, dict[str, str]] | None = None) -> Path:
    """The handout's core modules in ``dest`` (a student who wrote none), with functions
    replaced (``replace``: module -> function -> definition)."""
    from transformer_lab.course.package import parse_package, top_level_functions

    dest.mkdir(parents=True, exist_ok=True)
    package = parse_package(ROOT / "src" / "transformer_lab")
    for module in package.core.values():
        source = module.stubbed()
        for name, definition in (replace or {}).get(module.name, {}).items():
            first, last = top_level_functions(source)[name]
            lines = source.split("\n")
            source = "\n".join(lines[:first] + definition.split("\n") + lines[last + 1:])
        (dest / module.path.name).write_text(source)
    return dest


def student_folder(root: Path, notebook, core: str = "stubs",
                   replace: dict[str, dict[str, str]] | None = None,
                   name: str = "01_attention.ipynb") -> Path:
    """A student's handout folder: ``notebooks/<name>`` and ``src/transformer_lab/core/``
    (``core``: "stubs", "reference" or None for no package)."""
    write(notebook, root / "notebooks" / name)
    if core == "stubs":
        stubbed_core(root / "src" / "transformer_lab" / "core", replace)
    elif core == "reference":
        reference_core(root / "src" / "transformer_lab" / "core", replace)
    return root
