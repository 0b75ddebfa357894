"""Run the notebooks under every BLAS kernel this CPU can run: ``make portability``.

    python -m transformer_lab.course.portability                  # the whole matrix
    python -m transformer_lab.course.portability --only Sandybridge/default   # one combination
    python -m transformer_lab.course.portability --ci             # what `make test` adds
    python -m transformer_lab.course.portability --list           # the combinations, not run

For every combination of ``OPENBLAS_CORETYPE`` (the kernels this CPU has the instructions for)
and ``ATEN_CPU_CAPABILITY`` (PyTorch's native choice or ``default``), each in a fresh process, it
runs :data:`RUNS` (:func:`commands`), prints a table and exits with status 1 when any run fails;
``make test`` runs the solved notebooks under :data:`CI_COMBINATION` only. What the runs are
and why: docs/maintainers.md, "Every CPU".
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from transformer_lab.course.kernel_env import apply_kernel_env

#: OpenBLAS's x86-64 kernels the matrix runs, with the CPU flag each needs (/proc/cpuinfo
#: calls SSE3 "pni").
OPENBLAS_KERNELS = {"Prescott": "pni", "Sandybridge": "avx", "Haswell": "avx2",
                    "SkylakeX": "avx512f"}
#: PyTorch's kernel choices: "native" leaves ATEN_CPU_CAPABILITY unset.
ATEN_CAPABILITIES = ("native", "default")
#: The combination ``make test`` adds to the native one.
CI_COMBINATION = "Sandybridge/default"
RUNS = ("solved", "handout")


@dataclass(frozen=True)
class Combination:
    """A choice of kernels: OpenBLAS's (or "native": its own choice) and PyTorch's."""

    openblas: str
    aten: str

    @classmethod
    def parse(cls, text: str) -> Combination:
        openblas, sep, aten = text.partition("/")
        if not sep or not openblas or aten not in ATEN_CAPABILITIES:
            raise ValueError(f"a combination is OPENBLAS_KERNEL/ATEN, ATEN one of "
                             f"{', '.join(ATEN_CAPABILITIES)} (e.g. {CI_COMBINATION}), "
                             f"got {text!r}")
        return cls(openblas, aten)

    def __str__(self) -> str:
        return f"{self.openblas}/{self.aten}"

    def env(self) -> dict[str, str]:
        """The variables to set (the others are removed: a kernel chosen outside stays out)."""
        chosen = {"OPENBLAS_CORETYPE": self.openblas, "ATEN_CPU_CAPABILITY": self.aten}
        return {name: value for name, value in chosen.items() if value != "native"}


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str] | None:
    """The x86 CPU's feature flags, or None where they cannot be read (not Linux on x86-64)."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not cpuinfo.is_file():
        return None
    for line in cpuinfo.read_text(errors="replace").splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return None


def combinations(flags: set[str] | None) -> list[Combination]:
    """Every OpenBLAS kernel the CPU can run (only OpenBLAS's own choice where the flags are
    unknown) with each of PyTorch's choices."""
    kernels = ["native"] if flags is None else [
        kernel for kernel, flag in OPENBLAS_KERNELS.items() if flag in flags]
    return [Combination(k, a) for k in kernels for a in ATEN_CAPABILITIES]


def ci_combination(flags: set[str] | None) -> Combination:
    """:data:`CI_COMBINATION`, or PyTorch's ``default`` alone where OpenBLAS's Sandybridge
    kernel cannot be chosen (not x86-64, or no AVX)."""
    wanted = Combination.parse(CI_COMBINATION)
    usable = flags is not None and OPENBLAS_KERNELS[wanted.openblas] in flags
    return wanted if usable else Combination("native", wanted.aten)


def commands(project: Path, jobs: int) -> dict[str, list[str]]:
    """The pytest command of each run, from the project folder."""
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(jobs)]
    return {
        "solved": pytest + ["--nbval", "--nbval-current-env", "--nbval-sanitize-with",
                            str(project / "tests" / "nbval_sanitize.cfg"), "--dist",
                            "loadscope", str(project / "notebooks")],
        "handout": pytest + [str(project / "tests" / "test_handout_notebooks.py"), "-k",
                             "complete_core_only"],
    }


def run(combination: Combination, name: str, command: list[str], project: Path,
        log_dir: Path) -> tuple[bool, float, str]:
    """Run one command under ``combination``: (passed, seconds, pytest's last line); its
    output goes to a log file."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_CORETYPE", "ATEN_CPU_CAPABILITY")} | combination.env()
    log = log_dir / f"{combination.openblas}_{combination.aten}_{name}.log"
    start = time.monotonic()
    with log.open("w") as out:
        status = subprocess.run(command, cwd=project, env=env, stdout=out,
                                stderr=subprocess.STDOUT).returncode
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return status == 0, time.monotonic() - start, (lines[-1] if lines else "") + f"  ({log})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m transformer_lab.course.portability",
        description="Execute every notebook (solved, and the handout on the solved core) under "
                    "each OpenBLAS kernel this CPU can run and each of PyTorch's kernel choices; "
                    "fail if an assertion fails or a stored output differs.")
    parser.add_argument("--only", action="append", metavar="KERNEL/ATEN",
                        help=f"run this combination only (repeatable), e.g. {CI_COMBINATION}; "
                             "ATEN is 'native' or 'default'")
    parser.add_argument("--ci", action="store_true",
                        help=f"the solved notebooks under {CI_COMBINATION} only (make test)")
    parser.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS),
                        help="which runs (default: both)")
    parser.add_argument("--jobs", type=int, default=2, help="pytest-xdist workers (default 2)")
    parser.add_argument("--project", type=Path, default=Path("."),
                        help="the course folder (default: the current one)")
    parser.add_argument("--logs", type=Path, default=Path("build/portability"),
                        help="folder of the runs' logs (default build/portability)")
    parser.add_argument("--list", action="store_true", help="print the combinations and stop")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    try:
        chosen = ([Combination.parse(c) for c in args.only] if args.only
                  else [ci_combination(cpu_flags())] if args.ci else combinations(cpu_flags()))
    except ValueError as err:
        parser.error(f"--only: {err}")
    runs = ["solved"] if args.ci else args.runs
    project = args.project.resolve()
    if not (project / "notebooks").is_dir() or not (project / "tests").is_dir():
        parser.error(f"--project {args.project} holds no notebooks/ and tests/: run this from "
                     "the course folder")
    if cpu_flags() is None and not args.only and not args.ci:
        print("note: OpenBLAS's kernels are chosen here only on x86-64 Linux; this runs "
              "OpenBLAS's own choice with each of PyTorch's", file=sys.stderr)
    if args.list:
        print("\n".join(map(str, chosen)))
        return 0

    apply_kernel_env()
    args.logs.mkdir(parents=True, exist_ok=True)
    rows, failed = [], False
    for combination in chosen:
        for name, command in commands(project, args.jobs).items():
            if name not in runs:
                continue
            print(f"==> {combination} {name}", file=sys.stderr, flush=True)
            passed, seconds, last = run(combination, name, command, project, args.logs.resolve())
            failed |= not passed
            rows.append((str(combination), name, "ok" if passed else "FAILED",
                         f"{seconds:.0f}", last))
            print(f"    {rows[-1][2]} in {seconds:.0f} s: {last}", file=sys.stderr, flush=True)
    header = ("OPENBLAS/ATEN", "run", "status", "seconds", "pytest")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths, strict=True))
              + "  " + row[4])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
