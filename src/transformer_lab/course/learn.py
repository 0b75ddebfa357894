"""The learner's route: a workspace of your own with the exercises, and JupyterLab on it.

    python -m transformer_lab.course.learn                       # ./workspace, then JupyterLab
    python -m transformer_lab.course.learn --workspace ~/my-tfs  # somewhere else
    python -m transformer_lab.course.learn -- --no-browser       # options for JupyterLab
    make learn                                                   # the same (WORKSPACE=...)

The first time, the handout (what ``make student`` writes) is built into the workspace; from
then on the folder is the learner's: never written again, never emptied by a course tool. The
kernels JupyterLab starts import the workspace's ``src/`` first. docs/learning.md says more.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from transformer_lab.course.assignment import OWNER_FILE
from transformer_lab.course.kernel_env import with_pythonpath

DEFAULT_WORKSPACE = Path("workspace")


def is_workspace(path: Path) -> bool:
    """Whether ``path`` looks like a workspace this command built (notebooks and package)."""
    return (path / "notebooks").is_dir() and (path / "src" / "transformer_lab" /
                                              "__init__.py").is_file()


def build_workspace(workspace: Path, source: Path, project: Path) -> int:
    """Write the handout into ``workspace``, which must not exist yet, and print its table
    (what each notebook asks of you); 0 when it worked.

    It is built in a sibling folder first and renamed into place, so that an interrupted build
    never leaves a half workspace behind; the tools' mark is removed, so that no course tool
    ever empties it. What is printed names ``workspace``, never that sibling.
    """
    from transformer_lab.course import student

    building = workspace.parent / f".{workspace.name}.building"
    if building.exists():  # left by an interrupted build: ours to remove
        if not (building / OWNER_FILE).exists():
            raise SystemExit(f"error: {building} is in the way and was not written by this "
                             "command; move it away")
        shutil.rmtree(building)
    try:
        assignments = student.build(source, building, project)
    except student.HandoutError as err:
        shutil.rmtree(building, ignore_errors=True)
        print(f"error: {err}", file=sys.stderr)
        return 1
    (building / OWNER_FILE).unlink()
    building.rename(workspace)
    print(student.report(assignments))
    return 0


def lab_command(workspace: Path, lab_args: list[str] | None = None,
                environ: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The JupyterLab command line and environment for ``workspace``: rooted there, with the
    workspace's ``src/`` first on ``PYTHONPATH`` (so kernels import its package), and
    ``--allow-root`` when run as root (JupyterLab refuses to start as root without it)."""
    workspace = workspace.resolve()
    env = with_pythonpath(dict(os.environ if environ is None else environ), workspace / "src")
    argv = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={workspace}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-root")
    return argv + list(lab_args or []), env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="Arguments after -- go to JupyterLab.")
    parser.add_argument("--workspace", type=Path, default=DEFAULT_WORKSPACE,
                        help="your folder: built the first time, never overwritten "
                             f"(default: {DEFAULT_WORKSPACE})")
    parser.add_argument("--source", type=Path, default=Path("notebooks"),
                        help="the course's solution notebooks (default: notebooks)")
    parser.add_argument("--project", type=Path, default=Path("."),
                        help="the course's folder, holding src/ (default: the current folder)")
    parser.add_argument("--no-lab", action="store_true",
                        help="build the workspace if needed, print the JupyterLab command, and "
                             "stop there")
    args, lab_args = parser.parse_known_args(argv)
    lab_args = [a for a in lab_args if a != "--"]
    workspace = args.workspace.expanduser()  # zsh leaves the ~ of WORKSPACE=~/x to us
    if workspace.exists():
        if not is_workspace(workspace):
            parser.error(f"{str(workspace)!r} exists but is not a workspace (no notebooks/ and "
                         "src/transformer_lab/): name another folder with --workspace")
        print(f"Your workspace: {workspace} (kept as it is; to start over, move it away or "
              "delete it, and run this again).")
    else:
        print(f"Building your workspace in {workspace} (once: it is never overwritten) ...")
        status = build_workspace(workspace, args.source, args.project)
        if status != 0:
            return status
        print(f"\nYour workspace: {workspace}/ -- the notebooks in {workspace / 'notebooks'}/;\n"
              f"write the core functions in {workspace / 'src' / 'transformer_lab' / 'core'}/"
              f"*.py as the notebooks ask, and the notebooks run on them "
              f"({workspace / 'README.md'} says more).")
    command, env = lab_command(workspace, lab_args)
    if args.no_lab:
        print(f"PYTHONPATH={shlex.quote(env['PYTHONPATH'])} " + shlex.join(command))
        return 0
    try:
        return subprocess.call(command, env=env, cwd=workspace)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
