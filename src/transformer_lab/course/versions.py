"""Course versions: what a handout and an autograder record, and what the grader makes of them.

A course version is ``transformer_lab.__version__`` and the git commit the project was built
from ("unknown" outside a git checkout; ``+changes`` after it when the package or the
notebooks differed from it), recorded in a built package's ``_built.py`` and in a
handout notebook's ``metadata.transformer_lab`` -- there with the fingerprint of what grades
that notebook (:func:`checks_fingerprint`); what the grader makes of it: docs/instructors.md,
"Versions".
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import pprint
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from transformer_lab import syllabus

#: The key of a handout notebook's metadata that holds its course version.
METADATA_KEY = "transformer_lab"
#: The module a built copy of the package (handout, autograder) gets: the commit it was built
#: from and the syllabus (:mod:`transformer_lab.syllabus` reads it there).
BUILT = "_built.py"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class CourseVersion:
    """A version number, a commit and -- of one notebook -- the fingerprint of its checks."""

    version: str
    commit: str = UNKNOWN
    checks: str = UNKNOWN

    def __str__(self) -> str:
        checks = "" if self.checks == UNKNOWN else f", checks {self.checks}"
        return f"{self.version} (commit {self.commit}{checks})"

    def metadata(self) -> dict[str, str]:
        """What a handout notebook's ``metadata.transformer_lab`` holds."""
        checks = {} if self.checks == UNKNOWN else {"checks": self.checks}
        return {"version": self.version, "commit": self.commit, **checks}

    def of_notebook(self, package: Path, assignment) -> CourseVersion:
        """This version, with the fingerprint of the checks of the solution notebook
        ``assignment`` (an :class:`~.assignment.Assignment`) in the package folder
        ``package``."""
        return dataclasses.replace(self, checks=checks_fingerprint(package, assignment))

    def grades(self, other: CourseVersion) -> bool:
        """Whether a notebook of version ``other`` is graded as its handout's checks said:
        the same version number, and the same checks where both know them."""
        return other.version == self.version and (
            UNKNOWN in (self.checks, other.checks) or other.checks == self.checks)


def checks_fingerprint(package: Path, assignment) -> str:
    """What grades a notebook, in 12 hex digits: the code of its checks -- its module
    ``checks/nb<NN_topic>.py`` of the package folder ``package``, hidden cases included, with
    ``checks/__init__.py`` and the checks modules they import (the framework, ...), read with
    ``\\n`` line ends -- and the notebook's check cells (id, points, call). A handout notebook
    records it: a grader whose checks of that notebook differ -- a case, a tolerance, a point
    changed since the handout was built -- grades it as another version."""
    digest = hashlib.sha256()
    for path in _checks_modules(package / "checks", f"nb{Path(assignment.name).stem}"):
        digest.update(path.name.encode() + b"\0" + path.read_bytes().replace(b"\r\n", b"\n"))
    digest.update(repr([(c.cell_id, c.points, c.call) for c in assignment.checks]).encode())
    return digest.hexdigest()[:12]


def _checks_modules(checks: Path, module: str) -> list[Path]:
    """``checks/__init__.py``, ``checks/<module>.py`` and the modules of ``checks`` that they
    import, directly or not, sorted."""
    found, todo = set(), ["__init__", module]
    while todo:
        path = checks / f"{todo.pop()}.py"
        if path in found or not path.is_file():
            continue
        found.add(path)
        for node in ast.walk(ast.parse(path.read_bytes())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "transformer_lab.checks"):
                rest = node.module.removeprefix("transformer_lab.checks").lstrip(".")
                todo += [rest.split(".")[0]] if rest else [a.name for a in node.names]
    return sorted(found)


def _literal(path: Path, name: str) -> str | None:
    """The string that the module at ``path`` assigns to ``name`` at its top level, or None."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name
                                                for t in node.targets) \
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return node.value.value
    return None


def git_commit(project: Path) -> str:
    """The short commit of ``project`` when it is the top of a git checkout, else "unknown";
    with ``+changes`` when the package or the notebooks differ from that commit, new files not
    ignored by git included (a handout built from them is not that commit's)."""
    def git(*args) -> subprocess.CompletedProcess:  # takes no lock: a build runs beside git
        return subprocess.run(["git", "--no-optional-locks", "-C", str(project), *args],
                              capture_output=True, text=True, timeout=30)

    try:
        run = git("rev-parse", "--show-toplevel", "--short=7", "HEAD")
        lines = run.stdout.split()
        if run.returncode != 0 or len(lines) != 2 or \
                Path(lines[0]).resolve() != project.resolve():
            return UNKNOWN
        changed = git("status", "--porcelain", "--", "src", "notebooks")  # new files too
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN
    return lines[1] + ("+changes" if changed.returncode != 0 or changed.stdout.strip() else "")


def project_version(project: Path) -> CourseVersion:
    """The course version of the course's folder ``project``: its package's ``__version__``,
    and the commit its package records (an autograder's) or else its git checkout's."""
    package = project / "src" / "transformer_lab"
    version = _literal(package / "__init__.py", "__version__") or UNKNOWN
    commit = _literal(package / BUILT, "COMMIT") if (package / BUILT).is_file() else None
    return CourseVersion(version, commit or git_commit(project))


_BUILT_DOC = '''"""What this copy of transformer_lab was built from; written by the course's tools
(make student, make gradescope), never by hand: the course's source has no such module.

COMMIT: the git commit of the course it was built from (its version: transformer_lab.__version__).
TAUGHT_IN, CALLS: transformer_lab.syllabus's tables, read from the solution core's markers and
code when this was built (a handout's stubbed core holds neither).
"""
'''


def built_module(commit: str, package: Path) -> str:
    """The source of ``_built.py`` for a copy of the package folder ``package`` built at
    ``commit``: the commit, and the syllabus read from ``package``'s solution core."""
    taught_in, calls = syllabus.read_core(package)

    def table(value) -> str:
        return pprint.pformat(value, width=100, sort_dicts=False)

    return (f"{_BUILT_DOC}\nCOMMIT = {commit!r}\n\nTAUGHT_IN = {table(taught_in)}\n\n"
            f"CALLS = {table(calls)}\n")


def stamp(nb, version: CourseVersion) -> None:
    """Record ``version`` in the notebook ``nb``'s metadata."""
    nb.metadata[METADATA_KEY] = version.metadata()


def notebook_version(path: Path, max_bytes: int) -> CourseVersion | None:
    """The course version a submitted notebook records, or None: none recorded, or a file that
    is not a notebook (of at most ``max_bytes``; the grader reports such a file itself)."""
    try:
        if path.stat().st_size > max_bytes:
            return None
        meta = json.loads(path.read_text(encoding="utf-8")).get("metadata", {})
        record = meta.get(METADATA_KEY)
    except (OSError, ValueError, AttributeError, RecursionError):  # RecursionError: JSON
        return None                                                  # nested too deep
    if not isinstance(record, dict) or not isinstance(record.get("version"), str) or \
            not re.fullmatch(r"\d+(\.\d+)*\w*", record["version"]):
        return None  # none, or not a version: the refusal's command must not carry it
    commit, checks = record.get("commit"), record.get("checks")
    ok = isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{7,40}(\+changes)?", commit)
    checks_ok = isinstance(checks, str) and re.fullmatch(r"[0-9a-f]{12}", checks)
    return CourseVersion(record["version"], commit if ok else UNKNOWN,
                         checks if checks_ok else UNKNOWN)


def _described(version: CourseVersion, ours: CourseVersion) -> str:
    other_checks = ", whose checks differ from this one's" if version.version == ours.version \
        else ""
    return f"{version.version} (commit {version.commit}){other_checks}"


def checkout(version: CourseVersion, command: str) -> str:
    """How to get the course that notebooks of ``version`` were built from and run ``command``
    there: a worktree at the commit they record or, where they record none, at the tag
    ``v<version>`` (docs/instructors.md: tag what you hand out)."""
    commit = version.commit.removesuffix("+changes")
    where, folder = (f"v{version.version}", f"course-v{version.version}") if commit == UNKNOWN \
        else (commit, f"course-{commit}")
    how = f"`git worktree add ../{folder} {where}`, then run `{command}` there"
    if version.commit.endswith("+changes"):
        how += (" (its handout was built from uncommitted changes to that commit, which the "
                "worktree lacks)")
    return how


def mismatch(others: Mapping[tuple[str, str], CourseVersion], ours: CourseVersion,
             command: str = "make grade") -> str:
    """The sentence refusing to grade notebooks that ``ours`` does not grade
    (:meth:`CourseVersion.grades`): the version and commit of each, and how to grade them.

    others: (student, notebook) -> the course version that notebook records; command: what the
    instructor runs in the other version's folder."""
    groups: dict[tuple[str, str], tuple[CourseVersion, set[str]]] = {}
    for (student, _), v in others.items():
        groups.setdefault((v.version, v.commit), (v, set()))[1].add(student)
    if len(groups) == 1:
        ((version, _),) = groups.values()
        return (f"These submissions were made from course version {_described(version, ours)}; "
                f"this is {ours}: grade them with that version -- "
                f"{checkout(version, command)}.")
    ordered = [groups[key] for key in sorted(groups)]
    parts = "; ".join(f"{_described(v, ours)}: {', '.join(sorted(students))}"
                      for v, students in ordered)
    how = "; ".join(f"for {v.version} (commit {v.commit}), {checkout(v, command)}"
                    for v, _ in ordered)
    return (f"These submissions were made from {len(groups)} course versions -- {parts} -- "
            f"and this is {ours}: put each version's submissions in a folder of their own and "
            f"grade each with its version ({how}).")


def unversioned_note(ours: CourseVersion) -> str:
    """What the feedback of a notebook that records no course version says."""
    return (f"this notebook records no course version (it was made by hand, or from a handout "
            f"built before versions were recorded): it was graded with course version {ours}")
