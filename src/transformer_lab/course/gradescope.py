"""Gradescope's autograder for the course: ``make gradescope`` builds it, Gradescope runs it.

    python -m transformer_lab.course.gradescope build                  # -> build/gradescope/
    python -m transformer_lab.course.gradescope build --hidden-visibility after_due_date
    python -m transformer_lab.course.gradescope run --root /autograder  # on Gradescope

``build`` writes ``autograder.zip`` deterministically (:func:`zip_entries`: the scripts, the
build's :class:`Config`, the package recording its course version, the solution notebooks);
``run`` lays out ``$AUTOGRADER_ROOT/submission`` (folder, notebooks or one .zip, unpacked safely)
as one student's folder, grades it with :func:`transformer_lab.course.grade.grade` and writes
``results/results.json`` -- a score of 0 that says why when the grader cannot start. What the
student and the instructor see: docs/instructors.md, "On Gradescope".
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import io
import json
import os
import re
import shlex
import stat
import sys
import tempfile
import time
import traceback
import unicodedata
import zipfile
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

from transformer_lab.checks import framework as F
from transformer_lab.course import grade, reports, versions
from transformer_lab.course.assignment import (
    PROJECT_FILES,
    check_project,
    format_points,
    overlaps,
    solution_notebooks,
)
from transformer_lab.course.package import IGNORE_NAMES, PackageError, parse_package
from transformer_lab.course.student import TORCH_CPU_INDEX, HandoutError, torch_pin
from transformer_lab.course.submissions import is_hidden

ZIP_NAME = "autograder.zip"
CONFIG_NAME = "gradescope.json"
#: Gradescope's visibilities of a test, most visible first.
VISIBILITIES = ("visible", "after_due_date", "after_published", "hidden")
#: When a student sees a test of each visibility (said in the public-cases tests).
SHOWN = {"after_due_date": "after the due date", "after_published": "once grades are published",
         "hidden": "to your instructor only"}
#: Files of --project the autograder holds besides src/ (README.md: pyproject.toml's readme).
AUTOGRADER_FILES = (*PROJECT_FILES, "README.md")
#: Names left out of the zip wherever they are: caches, build metadata, hidden files.
_LEFT_OUT = (*IGNORE_NAMES, ".*")
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip can hold: the same for every build
VENV = "/autograder/venv"
#: What a submission may hold, unpacked: bytes and files.
MAX_SUBMISSION_BYTES = 200 * 2**20
MAX_SUBMISSION_FILES = 10_000
DEFAULT_STUDENT = "student"
PUBLIC_SUFFIX = " (public cases)"
NO_SANDBOX_NOTE = ("Graded WITHOUT a sandbox: your code ran unconfined in Gradescope's "
                   "container (see the summary).")


class BuildError(Exception):
    """The autograder cannot be built from these arguments; the message says why."""


class SubmissionError(Exception):
    """The submission cannot be laid out for grading; the message is for the student."""


@dataclass(frozen=True)
class Config:
    """The build's options, stored in the zip as ``gradescope.json``."""

    hidden_visibility: str = "visible"
    allow_no_sandbox: bool = False
    timeout: int = grade.DEFAULT_TIMEOUT  # seconds a cell, a case, a notebook's probe
    case_timeout: float = grade.DEFAULT_CASE_TIMEOUT
    probe_timeout: float = grade.DEFAULT_PROBE_TIMEOUT

    def __post_init__(self):
        if self.hidden_visibility not in VISIBILITIES:
            raise ValueError(f"hidden_visibility must be one of {', '.join(VISIBILITIES)}, "
                             f"got {self.hidden_visibility!r}")
        if not isinstance(self.allow_no_sandbox, bool):
            raise ValueError(f"allow_no_sandbox must be true or false, got "
                             f"{self.allow_no_sandbox!r}")
        for name in ("timeout", "case_timeout", "probe_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def read(cls, path: Path) -> Config:
        """The options in ``path``; the defaults (sandbox required, all visible) without it."""
        if not path.is_file():
            return cls()
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls(**{k: data[k] for k in ("hidden_visibility", "allow_no_sandbox", "timeout",
                                           "case_timeout", "probe_timeout") if k in data})


# --- building the zip -------------------------------------------------------------------------

SETUP_SH = """\
#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image: Python,
# bubblewrap (the grader's sandbox) and prlimit, and the course in a virtual environment.
# Written by transformer_lab.course.gradescope (make gradescope).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y python3 python3-venv python3-pip bubblewrap util-linux
python3 -m venv {venv}
# torch's CPU build first (the grader needs no GPU; the default wheel brings GBs of CUDA)
{venv}/bin/python -m pip install --disable-pip-version-check --no-cache-dir \\
    --index-url {index} {torch}
{venv}/bin/python -m pip install --disable-pip-version-check --no-cache-dir \\
    -r /autograder/source/requirements.txt -e /autograder/source
{venv}/bin/python -c "import transformer_lab.course.gradescope"
"""

RUN_AUTOGRADER = """\
#!/usr/bin/env bash
# Gradescope runs this for each submission: grade $AUTOGRADER_ROOT/submission (default
# /autograder) into $AUTOGRADER_ROOT/results/results.json, with $AUTOGRADER_PYTHON (default
# the virtual environment setup.sh made) on the package of this zip.
# Written by transformer_lab.course.gradescope (make gradescope).
set -euo pipefail
root="$(cd "${AUTOGRADER_ROOT:-/autograder}" >/dev/null && pwd)"
python="${AUTOGRADER_PYTHON:-$root/venv/bin/python}"
case "$python" in /*) ;; */*) python="$PWD/$python" ;; esac  # a relative path: from here
cd "$root"
PYTHONPATH="$root/source/src" PYTHONDONTWRITEBYTECODE=1 \\
    exec "$python" -m transformer_lab.course.gradescope run --root "$root"
"""


def setup_script(torch: str) -> str:
    """setup.sh, installing ``torch`` (``torch==<version>``) from PyTorch's CPU wheel index."""
    return SETUP_SH.format(index=TORCH_CPU_INDEX, torch=shlex.quote(torch), venv=VENV)


def _tree(folder: Path, prefix: str) -> dict[str, Path]:
    """zip name -> file, for every file below ``folder`` but caches and hidden ones."""
    found = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if any(fnmatch.fnmatch(part, p) for part in rel.parts for p in _LEFT_OUT) \
                or not path.is_file():
            continue
        found[f"{prefix}/{rel.as_posix()}"] = path
    return found


def _check_build_args(source: Path, project: Path, out: Path,
                      chosen: list[str] | None = None) -> list[Path]:
    """The solution notebooks (``chosen``: these only), once the arguments are known to be
    usable (or BuildError)."""
    try:
        check_project(project)
        torch_pin(project)  # setup.sh installs it first
        notebooks = solution_notebooks(source, chosen)
    except SystemExit as err:  # its message names --project or --source
        raise BuildError(str(err).removeprefix("error: ")) from None
    except HandoutError as err:
        raise BuildError(str(err)) from None
    if out.exists() and not out.is_dir():
        raise BuildError(f"--out must be a folder for {ZIP_NAME}; {str(out)!r} is a file")
    for name, given in (("--source", source), ("--project's src/", project / "src")):
        if overlaps(out, given):
            raise BuildError(f"--out {str(out)!r} and {name} {str(given)!r} overlap (the same "
                             f"folder, or one inside the other); the zip packs {name}, so it "
                             "must be written apart from it")
    # what would stop the grader on Gradescope: the package's markers, the notebooks' markers
    # and metadata, their check cells
    problems = []
    try:
        parse_package(project / "src" / "transformer_lab")
    except PackageError as err:
        problems.append(f"the package's markers: {err}")
    problems += [p for found in grade.load_solutions(notebooks)[1].values() for p in found]
    if problems:
        raise BuildError(f"the autograder could not grade these solutions, {len(problems)} "
                         "problem(s):\n" + "\n".join(problems))
    return notebooks


def zip_entries(notebooks: list[Path], project: Path,
                config: Config) -> dict[str, tuple[bytes, int]]:
    """zip name -> (content, mode), for everything the autograder holds."""
    entries = {"setup.sh": (setup_script(torch_pin(project)).encode(), 0o755),
               "run_autograder": (RUN_AUTOGRADER.encode(), 0o755),
               CONFIG_NAME: (config.to_json().encode(), 0o644)}
    files = {name: project / name for name in AUTOGRADER_FILES if (project / name).is_file()}
    files.update(_tree(project / "src", "src"))
    if (project / "img").is_dir():
        files.update(_tree(project / "img", "img"))
    files.update({f"notebooks/{path.name}": path for path in notebooks})
    for name, path in files.items():
        entries[name] = (path.read_bytes(), 0o644)
    package = project / "src" / "transformer_lab"
    entries[f"src/transformer_lab/{versions.BUILT}"] = (versions.built_module(
        versions.project_version(project).commit, package).encode(), 0o644)
    return entries


def write_zip(entries: dict[str, tuple[bytes, int]], dest: Path) -> None:
    """Write ``entries`` as a zip, deterministically: sorted, fixed time, Unix modes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name in sorted(entries):
            content, mode = entries[name]
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            info.create_system = 3  # Unix: the modes below are what unzip applies
            info.external_attr = (stat.S_IFREG | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, content, compresslevel=9)
    _replace(dest, buffer.getvalue())


def _replace(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` in one step, replacing whatever is there (a file, or a link
    planted there)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def build(source: Path, project: Path, out: Path, config: Config | None = None,
          notebooks: list[str] | None = None) -> Path:
    """Write ``out/autograder.zip`` (see the module's docstring) and return its path; raises
    :class:`BuildError` with the reason when the arguments cannot make one. ``notebooks``: the
    assignment's notebooks (default: every one of ``source``)."""
    config = config or Config()
    chosen = _check_build_args(source, project, out, notebooks)
    dest = out / ZIP_NAME
    write_zip(zip_entries(chosen, project, config), dest)
    return dest


# --- laying out a submission ------------------------------------------------------------------

class _Budget:
    """What may still be copied or unpacked of one submission."""

    def __init__(self):
        self.bytes, self.files = MAX_SUBMISSION_BYTES, MAX_SUBMISSION_FILES

    def take(self, nbytes: int, files: int = 0) -> None:
        self.bytes -= nbytes
        self.files -= files
        if self.bytes < 0 or self.files < 0:
            raise SubmissionError(
                f"your submission is too large to grade: at most "
                f"{MAX_SUBMISSION_BYTES // 2**20} MiB in {MAX_SUBMISSION_FILES} files "
                "(unpacked). Hand in the notebooks and src/transformer_lab/core/*.py only.")


def _write_files(files, dest: Path) -> list[tuple[str, str]]:
    """Write ``files`` -- (where, path relative to ``dest``, why it is left out or "", a function
    opening its content) -- into ``dest``, within one submission's budget; return (where,
    reason) for what was left out."""
    left_out = []
    budget = _Budget()
    for where, rel, why, open_ in files:
        if why:
            left_out.append((where, why))
            continue
        budget.take(0, files=1)
        target = dest / rel
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with open_() as src, target.open("xb") as out:
                while chunk := src.read(1 << 20):
                    budget.take(len(chunk))
                    out.write(chunk)
        except FileExistsError:
            left_out.append((where, "a second file of the same name: not unpacked"))
        except (OSError, ValueError, RuntimeError, NotImplementedError, EOFError,
                zipfile.BadZipFile, zlib.error) as err:  # encrypted, corrupt, odd names
            target.unlink(missing_ok=True)
            left_out.append((where, f"could not be unpacked ({err})"))
    return left_out


def copy_submission(submission: Path, dest: Path) -> list[tuple[str, str]]:
    """Copy the regular files of ``submission`` into ``dest``, never following a link; return
    (path, reason) for what was left out."""
    def files():
        for folder, dirs, names in os.walk(submission, followlinks=False):
            here = Path(folder)
            for name in sorted(dirs):
                rel = (here / name).relative_to(submission)
                if (here / name).is_symlink():
                    yield rel.as_posix(), rel, "a link: not followed, not graded", None
                if is_hidden(rel) or (here / name).is_symlink():
                    dirs.remove(name)
            for name in sorted(names):
                path = here / name
                rel = path.relative_to(submission)
                if is_hidden(rel):
                    continue
                mode = path.lstat().st_mode
                why = "" if stat.S_ISREG(mode) else \
                    f"{'a link' if stat.S_ISLNK(mode) else 'not a regular file'}: not followed, " \
                    "not graded"
                yield rel.as_posix(), rel, why, lambda path=path: path.open("rb")

    return _write_files(files(), dest)


def _member_path(name: str) -> PurePosixPath | None:
    """Where a zip member goes, relative to the folder; None when it would leave it."""
    name = name.replace("\\", "/")
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name) or "\0" in name:
        return None
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        return None
    return PurePosixPath(*parts)


def extract_submission(archive: Path, dest: Path) -> list[tuple[str, str]]:
    """Unpack the zip ``archive`` into ``dest`` safely -- no path leaving it, no links, the
    size bounded by what is actually unpacked; return (path, reason) for what was left out."""
    try:
        zf = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError) as err:
        raise SubmissionError(f"{archive.name} could not be read as a zip file ({err}); "
                              "hand in the zip of your course folder, or its files") from None

    def files():
        for info in zf.infolist():
            rel = _member_path(info.filename)
            if info.is_dir() or (rel is not None and is_hidden(rel)):
                continue
            why = "a path outside the zip's folder: not unpacked" if rel is None else \
                "a link: not unpacked, not graded" if stat.S_ISLNK(info.external_attr >> 16) \
                else ""
            yield f"{archive.name}: {info.filename}", rel, why, lambda info=info: zf.open(info)

    with zf:
        return _write_files(files(), dest)


def lay_out(submission: Path, dest: Path) -> list[tuple[str, str]]:
    """The student's folder ``dest`` from Gradescope's submission folder: its files, or those
    of its single .zip; return (path, reason) for what was left out."""
    if not submission.is_dir():
        raise SubmissionError("the autograder found no submission folder: nothing to grade")
    entries = [e for e in sorted(submission.iterdir()) if not is_hidden(Path(e.name))]
    dest.mkdir(parents=True)
    only = entries[0] if len(entries) == 1 else None
    if only is not None and only.suffix.lower() == ".zip" and not only.is_symlink() \
            and only.is_file():
        return extract_submission(only, dest)
    return copy_submission(submission, dest)


def student_name(metadata: Path) -> str:
    """A safe folder name for the student: the first user of Gradescope's
    ``submission_metadata.json`` in ASCII letters, digits and ``_``; else ``student``."""
    try:
        name = json.loads(metadata.read_text(encoding="utf-8"))["users"][0]["name"]
        ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    except (OSError, ValueError, KeyError, IndexError, TypeError):  # TypeError: not a string
        return DEFAULT_STUDENT
    safe = re.sub(r"[^A-Za-z0-9]+", "_", ascii_name).strip("_")[:64].strip("_")
    return safe or DEFAULT_STUDENT


# --- results.json -----------------------------------------------------------------------------

@functools.cache
def _has_hidden_cases(check_id: str) -> bool:
    """Whether the grader's cases of the check include hidden ones (True when unknown: then
    nothing of its verdict shows early)."""
    try:
        check = F.get_check(check_id)
        public = len(F.all_cases(check, salt="grader", hidden=False))
        return len(F.all_cases(check, salt="grader")) > public
    except Exception:
        return True


def public_verdict(graded: reports.Graded, result: reports.CheckResult) -> tuple[bool, str]:
    """(whether the check's public cases passed, the failure to show): a failure only when a
    public case failed, or when the public cases were not all judged (not a hidden verdict)."""
    if graded.status != "graded":
        return False, _not_graded(graded)  # the notebook was not graded at all
    failed = result.failed_case
    if failed is not None:
        return (True, "") if failed >= result.public else (False, result.message)
    if result.passed or result.cases >= result.public:
        return True, ""
    return False, result.message  # stopped before its public cases were all judged


def _not_graded(graded: reports.Graded) -> str:
    """What each check of a notebook that was not graded says: its one reason is said once, at
    the top of the results (:func:`summary`)."""
    return f"not graded ({graded.status}): why is said at the top of the results"


def check_tests(graded: reports.Graded, result: reports.CheckResult, config: Config,
                note: str = "") -> list[dict]:
    """The tests of one check: the scored one, and -- where its hidden cases are not visible
    yet -- a visible one of 0 points on its public cases first."""
    name = f"{graded.notebook} · {result.check}"
    suffix = f"\n\n{note}" if note else ""
    scored = {"name": name, "score": result.points, "max_score": result.max_points,
              "status": "passed" if result.passed else "failed",
              "output": (reports.passed(result.cases) if result.passed else result.message
                         if graded.status == "graded" else _not_graded(graded)) + suffix,
              "visibility": "visible"}
    if config.hidden_visibility == "visible" or not _has_hidden_cases(result.check):
        return [scored]
    scored["visibility"] = config.hidden_visibility
    passed, failure = public_verdict(graded, result)
    later = (f"The check's points count its hidden cases too; they show "
             f"{SHOWN[config.hidden_visibility]}.")
    text = f"{reports.passed(result.public, 'public ')}. {later}" if passed else \
        f"failed:\n{failure}\n\n{later}" if graded.status == "graded" else failure
    public = {"name": name + PUBLIC_SUFFIX, "score": 0, "max_score": 0,
              "status": "passed" if passed else "failed", "output": text + suffix,
              "visibility": "visible"}
    return [public, scored]


def summary(outcome: reports.Outcome, config: Config, course: list[str],
            left_out: list[tuple[str, str]], sandbox_note: str = "") -> str:
    """The results' top-level output: what was graded, the notes, the files left out, where
    the code ran. Points only where every verdict is visible."""
    graded = [g.notebook for g in outcome.graded]
    lines = []
    if graded:
        missing = [n for n in course if n not in graded]
        lines.append("Graded: " + ", ".join(graded) + ". Only the notebooks you hand in are "
                     "graded" + (f"; not in your submission: {', '.join(missing)}."
                                 if missing else "."))
    else:
        lines.append("Nothing was graded: no notebook of the course was found in your "
                     "submission. Hand in your course folder (notebooks/NN_topic.ipynb and "
                     "src/transformer_lab/core/*.py), or its zip, or the notebooks, named as "
                     "in the course: " + ", ".join(f"{n}.ipynb" for n in course) + ".")
    show_points = config.hidden_visibility == "visible"
    for g in outcome.graded:
        head = g.notebook
        if show_points:
            head += f": {format_points(g.points)} / {format_points(g.max_points)} points"
        if g.status != "graded":  # its one reason, said here only
            head += f" ({g.status}): {g.results[0].message}" if g.results else f" ({g.status})"
        lines += ["", head, *reports.note_lines(g)]
    if not show_points and graded:
        lines += ["", "Each check's points count hidden cases too: they show "
                      f"{SHOWN[config.hidden_visibility]}. The tests marked "
                      f"'{PUBLIC_SUFFIX.strip()}' say how your code did on the public cases."]
    not_graded = left_out + [(s.path.split("/", 1)[1] if s.student and "/" in s.path else s.path,
                              s.reason) for s in outcome.found.skipped]
    if not_graded:
        lines += ["", "Files not graded:"] + [f"- {path}: {why}" for path, why in not_graded]
    if graded:
        lines += ["", sandbox_note or f"Your code ran in: {outcome.sandbox}."]
    return "\n".join(lines)


def results_json(outcome: reports.Outcome, config: Config, course: list[str],
                 left_out: list[tuple[str, str]], sandboxed: bool = True) -> dict:
    """Gradescope's results for ``outcome`` (``sandboxed``: whether the code ran in one)."""
    note = "" if sandboxed else NO_SANDBOX_NOTE
    sandbox_note = "" if sandboxed else (
        "WARNING: your code ran WITHOUT a sandbox, unconfined in Gradescope's container: the "
        "autograder was built to allow it (--allow-no-sandbox), and bubblewrap could not make "
        "a sandbox here (why: in the autograder's output, for your instructor).")
    tests = [t for g in outcome.graded for r in g.results for t in check_tests(g, r, config,
                                                                                 note)]
    score = sum(r.points for g in outcome.graded for r in g.results)
    return {"score": score, "output": summary(outcome, config, course, left_out, sandbox_note),
            "stdout_visibility": "hidden", "tests": tests}


def failure(message: str) -> dict:
    """Results that grade nothing and say why."""
    return {"score": 0, "output": message, "stdout_visibility": "hidden", "tests": []}


# --- a run on Gradescope ----------------------------------------------------------------------

def _no_sandbox_results(problem: str) -> dict:
    return failure(
        "Your submission could not be graded: the autograder found no sandbox to run your "
        "code in, and it runs students' code only in one. None of your code ran; this is "
        "not your fault -- please tell your instructor.\n\n"
        f"For the instructor: {problem}\nInside Gradescope's container bubblewrap may be "
        "unable to make the namespaces it needs. To grade there without a sandbox -- each "
        "student's code then runs as root in the container, where it can read the solutions "
        "and rewrite its own results, and every result says so -- rebuild the autograder with "
        "`make gradescope GRADESCOPE_ARGS=--allow-no-sandbox` and upload it again.")


def _version_results(err: grade.VersionError) -> dict:
    theirs = sorted({str(v) for v in err.others.values()})
    return failure(
        f"Your submission could not be graded: it was made from course version "
        f"{', '.join(theirs)}, and this autograder grades course version {err.ours}. None of "
        "your code ran; this is not your fault -- please tell your instructor.\n\n"
        f"For the instructor: {err.sentence('make gradescope')} Then upload that autograder "
        "(build/gradescope/autograder.zip) for this assignment.")


def _grade(submissions: Path, out: Path, source: Path,
           config: Config) -> tuple[reports.Outcome, bool]:
    """(the outcome, whether the code ran in a sandbox): graded in the sandbox, or -- where
    none can be made and the build allows it -- without one; else grade.NoSandboxError."""
    def run(sandbox: bool) -> reports.Outcome:
        options = grade.Options(source=source / "notebooks", project=source, execute=False,
                                jobs=1, sandbox=sandbox, timeout=config.timeout,
                                case_timeout=config.case_timeout,
                                probe_timeout=config.probe_timeout, command="make gradescope",
                                hidden_apart=config.hidden_visibility != "visible")
        try:
            return grade.grade(submissions, out, options)
        except SystemExit as err:  # the grader's checks of its folders end with SystemExit
            raise grade.GradingError(str(err).removeprefix("error: ")) from None

    try:
        return run(True), True
    except grade.NoSandboxError as err:
        if not config.allow_no_sandbox:
            raise
        print(f"WARNING: grading without a sandbox: {err.reason}")
    return run(False), False


def autograde(root: Path, config: Config) -> dict:
    """Grade ``root/submission``; the results (see the module's docstring)."""
    source = root / "source"
    course = [p.stem for p in sorted((source / "notebooks").glob("*.ipynb"))]
    with tempfile.TemporaryDirectory(prefix="gradescope-") as tmp:
        submissions = Path(tmp) / "submissions"
        try:
            left_out = lay_out(root / "submission",
                               submissions / student_name(root / "submission_metadata.json"))
            outcome, sandboxed = _grade(submissions, Path(tmp) / "grades", source, config)
        except SubmissionError as err:
            return failure(f"Your submission could not be graded: {err}")
        except grade.NoSandboxError as err:
            print(f"no sandbox: {err.reason}")
            return _no_sandbox_results(err.reason)
        except grade.VersionError as err:
            print(f"error: {err.sentence('make gradescope')}")
            return _version_results(err)
        except grade.GradingError as err:
            print(f"error: {err}")
            return failure(f"Your submission could not be graded: {err}")
        _report(outcome)
        return results_json(outcome, config, course, left_out, sandboxed)


def _report(outcome: reports.Outcome) -> None:
    """What the instructor sees in Gradescope's stdout: the table, the flags, the sandbox."""
    if outcome.graded:
        print("\n" + reports.format_table(outcome.graded))
    for row in outcome.flags:
        print("flag: " + " | ".join(str(x) for x in row))
    print(f"students' code ran in: {outcome.sandbox}")


def run(root: Path) -> int:
    """Grade ``root/submission`` into ``root/results/results.json``, always writing it; the
    exit status is 0 unless the autograder itself failed."""
    start = time.monotonic()
    import transformer_lab

    print(f"autograder: {Path(transformer_lab.__file__).parent}, {sys.executable}")
    status = 0
    try:
        results = autograde(root, Config.read(root / "source" / CONFIG_NAME))
    except Exception as exc:  # a bug here: the student still learns that it was not them
        traceback.print_exc(file=sys.stdout)
        results = failure(f"The autograder failed ({type(exc).__name__}: {exc}); this is not "
                          "your fault -- please tell your instructor.")
        status = 1
    results["execution_time"] = round(time.monotonic() - start)
    _replace(root / "results" / "results.json",
             (json.dumps(results, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
    print(f"score: {format_points(results['score'])}; results: "
          f"{root / 'results' / 'results.json'}")
    return status


# --- the command line -------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    b = commands.add_parser("build", help=f"write {ZIP_NAME}, Gradescope's autograder")
    b.add_argument("--source", type=Path, default=Path("notebooks"),
                   help="folder of the solution notebooks to grade (default: notebooks)")
    b.add_argument("--project", type=Path, default=Path("."),
                   help="the course's folder: src/, requirements.txt, pyproject.toml "
                        "(default: the current folder)")
    b.add_argument("--out", type=Path, default=Path("build/gradescope"),
                   help=f"folder to write {ZIP_NAME} into (default: build/gradescope)")
    b.add_argument("--notebooks", nargs="+", metavar="NN_topic",
                   help="the assignment's notebooks (01_attention or 01); the students' other "
                        "notebooks are listed as not graded (default: every notebook)")
    b.add_argument("--hidden-visibility", choices=VISIBILITIES, default="visible",
                   help="when students see the tests of checks with hidden cases; with "
                        "anything but 'visible' each such check also gets a visible test of "
                        "its public cases (default: visible)")
    b.add_argument("--allow-no-sandbox", action="store_true",
                   help="where bubblewrap cannot make a sandbox in Gradescope's container, "
                        "grade WITHOUT one (the students' code runs as root there, where it can "
                        "read the solutions and rewrite its results; every result says so) "
                        "instead of grading nothing")
    grade.add_time_limits(b, feedback=False)  # the autograder executes no feedback notebook
    r = commands.add_parser("run", help="grade a submission (what run_autograder does)")
    r.add_argument("--root", type=Path, default=Path("/autograder"),
                   help="Gradescope's folder: source/, submission/, results/ "
                        "(default: /autograder)")
    args = parser.parse_args(argv)
    if args.command == "run":
        os.environ.pop("PYTHONPATH", None)  # run_autograder's, for this process only
        return run(args.root)
    try:
        config = Config(args.hidden_visibility, args.allow_no_sandbox, args.timeout,
                        args.case_timeout, args.probe_timeout)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        dest = build(args.source, args.project, args.out, config, notebooks=args.notebooks)
    except BuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    _describe_build(dest, config, versions.project_version(args.project))
    return 0


def _describe_build(dest: Path, config: Config, version: versions.CourseVersion) -> None:
    with zipfile.ZipFile(dest) as zf:
        names = zf.namelist()
    notebooks = [PurePosixPath(n).stem for n in names if n.startswith("notebooks/")]
    print(f"wrote {dest} ({len(names)} files, {dest.stat().st_size / 2**20:.1f} MiB)")
    print(f"  course version: {version} (it grades this version's submissions only)")
    print(f"  notebooks: {', '.join(notebooks)}")
    print(f"  checks with hidden cases: {config.hidden_visibility}"
          + ("" if config.hidden_visibility == "visible" else
             ", with a visible test of their public cases"))
    print("  sandbox: " + ("bubblewrap where it works, else NONE (--allow-no-sandbox)"
                           if config.allow_no_sandbox else "bubblewrap, required"))
    print(f"  time limits: {config.timeout} s a cell, {config.case_timeout:g} s a case, "
          f"{config.probe_timeout:g} s a notebook's probe: a submission whose code never ends "
          f"may take about {len(notebooks)} x {config.probe_timeout:g} s; set the assignment's "
          "autograder timeout on Gradescope above that, or lower these limits")
    print("Upload it as the assignment's autograder on Gradescope.")


if __name__ == "__main__":
    sys.exit(main())
