"""The learner's route (`make learn`): a workspace built once and never overwritten, JupyterLab on
it, and kernels that import the workspace's package -- the student's core -- with autoreload."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import time
from pathlib import Path

import nbformat
import pytest
from course_helpers import write

from transformer_lab import syllabus
from transformer_lab.course import assignment, learn, student
from transformer_lab.course.kernel_run import run_notebook

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A workspace built by the learner's command from a one-notebook course."""
    base = tmp_path_factory.mktemp("learn")
    source = base / "course"
    write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 00 · Tiny",
                                                                        id="intro")]),
          source / "00_tiny.ipynb")
    ws = base / "my work"  # a space in the path, as people's folders have
    assert learn.main(["--workspace", str(ws), "--source", str(source), "--project", str(ROOT),
                       "--no-lab"]) == 0
    return ws


def test_the_workspace_is_built_once_and_never_overwritten(workspace, capsys):
    assert learn.is_workspace(workspace)
    assert not (workspace / assignment.OWNER_FILE).exists()  # no tool may empty it
    assert not list(workspace.parent.glob(".*.building"))
    layers = workspace / "src" / "transformer_lab" / "core" / "layers.py"
    mine = layers.read_text() + "\n# my own work\n"
    layers.write_text(mine)
    (workspace / "notebooks" / "scratch.ipynb").write_text("{}")
    assert learn.main(["--workspace", str(workspace), "--source", "nowhere", "--project",
                       str(ROOT), "--no-lab"]) == 0
    out = capsys.readouterr().out
    assert "kept as it is" in out and "to start over" in out
    command = out.strip().splitlines()[-1]  # pasted into a shell, the space stays in its path
    assert shlex.split(command)[0] == f"PYTHONPATH={workspace.resolve() / 'src'}" or \
        shlex.split(command)[0].startswith(f"PYTHONPATH={workspace.resolve() / 'src'}{os.pathsep}")
    assert layers.read_text() == mine and (workspace / "notebooks" / "scratch.ipynb").exists()
    with pytest.raises(SystemExit, match="not empty and was not written by this tool"):
        student.main(["--source", str(ROOT / "notebooks"), "--out", str(workspace),
                      "--project", str(ROOT)])
    assert layers.read_text() == mine


def test_what_the_build_prints_names_the_workspace_and_what_each_count_counts(tmp_path, capsys,
                                                                              monkeypatch):
    """The learner reads the folder they will use (never the temporary `.workspace.building`)
    and what each column of the table counts."""
    source = tmp_path / "course"
    write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 00 · Tiny",
                                                                        id="intro")]),
          source / "00_tiny.ipynb")
    monkeypatch.chdir(tmp_path)
    assert learn.main(["--source", str(source), "--project", str(ROOT), "--no-lab"]) == 0
    out = capsys.readouterr().out
    assert ".building" not in out
    assert "Your workspace: workspace/" in out
    assert f"write the core functions in {Path('workspace/src/transformer_lab/core')}/*.py" in out
    header = next(line for line in out.splitlines() if line.startswith("notebook "))
    assert header.split() == ["notebook", "core", "functions", "notebook", "exercises",
                              "checks", "points"]
    for column in ("core functions:", "notebook exercises:", "checks:", "points:"):
        assert column in out, column  # the legend under the table
    assert learn.is_workspace(tmp_path / "workspace")


def test_the_table_counts_each_notebooks_core_functions_from_the_syllabus():
    table = student.format_table(assignment.load_assignments(
        [ROOT / "notebooks" / "00_gradients.ipynb"]))
    row = next(line for line in table.splitlines() if line.startswith("00_gradients.ipynb"))
    functions = sum(len(v) for v in syllabus.notebook_functions("00_gradients").values())
    assert row.split()[1] == str(functions) and functions > 0
    assert table.splitlines()[-5].startswith("total")


def test_a_folder_that_is_not_a_workspace_is_refused(tmp_path):
    (tmp_path / "thesis").mkdir()
    (tmp_path / "thesis" / "thesis.tex").write_text("keep me")
    with pytest.raises(SystemExit):
        learn.main(["--workspace", str(tmp_path / "thesis"), "--no-lab"])
    assert (tmp_path / "thesis" / "thesis.tex").read_text() == "keep me"


def test_run_in_a_workspace_it_says_that_is_not_the_course(workspace, tmp_path, capsys):
    """``learn`` run inside a workspace (--project . is then a handout): said in one sentence,
    not as the markers' problems of the student's notebooks."""
    assert learn.main(["--workspace", str(tmp_path / "again"), "--source",
                       str(workspace / "notebooks"), "--project", str(workspace),
                       "--no-lab"]) == 1
    err = capsys.readouterr().err
    assert f"error: {str(workspace)!r} is a handout" in err and "--project" in err
    assert "problem(s)" not in err and not (tmp_path / "again").exists()


def test_the_lab_command_roots_jupyterlab_in_the_workspace_for_root_and_others(workspace):
    argv, env = learn.lab_command(workspace, ["--no-browser"], {"PYTHONPATH": "/elsewhere"})
    assert argv[1:3] == ["-m", "jupyterlab"] and argv[-1] == "--no-browser"
    assert f"--ServerApp.root_dir={workspace.resolve()}" in argv
    assert ("--allow-root" in argv) == (os.geteuid() == 0)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(workspace.resolve() / "src"),
                                                   "/elsewhere"]


def test_a_kernel_started_that_way_imports_the_workspace_package_and_reloads_it(workspace):
    """What the learner's kernels do: import the workspace's transformer_lab (not the
    project's), and pick up an edited core function at the next cell (setup_notebook turns
    autoreload on)."""
    _, env = learn.lab_command(workspace)
    layers = workspace / "src" / "transformer_lab" / "core" / "layers.py"
    source = layers.read_text()
    stub = f'    raise NotImplementedError("{syllabus.stub_message("relu_forward")}")'
    assert stub in source
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s, id=f"c{k}") for k, s in
                                         enumerate([
        "import numpy as np\nimport transformer_lab\nfrom transformer_lab import setup_notebook\n"
        "from transformer_lab.core import layers\nrng = setup_notebook()\n"
        "print(transformer_lab.__file__)",
        "try:\n    layers.relu_forward(np.array([-1.0, 2.0]))\n"
        "except NotImplementedError as err:\n    print('stub:', err)",
        # the learner writes the function and saves the file (a later time than the import's)
        f"import os, pathlib\np = pathlib.Path({str(layers)!r})\n"
        f"p.write_text(p.read_text().replace({stub!r}, '    out = np.maximum(x, 0)'))\n"
        "t = os.stat(p).st_mtime + 5\nos.utime(p, (t, t))",
        "print('relu:', layers.relu_forward(np.array([-1.0, 2.0]))[0])",
        "print('def at line', layers.relu_forward.__code__.co_firstlineno)",
    ])])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    try:
        run = run_notebook(nb, 120, env=env)
    finally:
        layers.write_text(source)
    assert run.status == "ran"
    printed = ["".join(o.get("text", "") for o in c.outputs) for c in nb.cells]
    errors = [o for c in nb.cells for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    assert printed[0].strip() == str((workspace / "src" / "transformer_lab" /
                                      "__init__.py").resolve())
    assert printed[1].startswith("stub: relu_forward() in transformer_lab/core/layers.py")
    assert printed[3].strip() == "relu: [0. 2.]"
    # reloaded whole, not one function at a time: its lines are the file's (an error's line,
    # the loop rule's source)
    line = source.splitlines().index("def relu_forward(x):") + 1
    assert printed[4].strip() == f"def at line {line}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_jupyterlab_starts_on_the_workspace(workspace, tmp_path):
    """The real command starts (as root too: --allow-root), serving the workspace."""
    port = _free_port()
    argv, env = learn.lab_command(workspace, ["--no-browser", f"--ServerApp.port={port}",
                                              "--ServerApp.port_retries=0",
                                              "--ServerApp.ip=127.0.0.1"])
    env["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")
    env["JUPYTER_CONFIG_DIR"] = str(tmp_path / "config")
    log = tmp_path / "lab.log"
    with log.open("w") as f:
        proc = subprocess.Popen(argv, cwd=workspace, env=env, stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if f"127.0.0.1:{port}/lab" in log.read_text():
                break
            time.sleep(0.3)
        text = log.read_text()
        assert proc.poll() is None, text
        assert f"127.0.0.1:{port}/lab" in text, text
        assert "Running as root is not recommended" not in text or "--allow-root" in argv
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
