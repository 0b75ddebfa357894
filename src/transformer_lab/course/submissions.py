"""Finding the submissions in a folder: what each student handed in, and every file skipped
with the reason (``skipped.csv``). The layouts and how names are matched: docs/instructors.md,
"Submissions".
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePath

from transformer_lab import syllabus

# copies: "(1)", "-Copy1", " copy 2", and "-1", which Canvas appends to a resubmission
_COPY = re.compile(r"(?:\s*\(\d+\)|-\d+|\s*-\s*copy\s*\d*|[\s_]+copy(?:\s*\d+)?)$",
                   re.IGNORECASE)
_SEPARATORS = r"[\s_\-.]+"


@dataclass
class Skipped:
    student: str  # "" when the file names no student
    path: str  # relative to the submissions folder
    reason: str
    deliberate: bool = False  # left out by the run's choice (--notebooks), not for the file


@dataclass
class StudentWork:
    """What one student handed in."""

    name: str
    notebooks: dict[str, Path] = field(default_factory=dict)  # "00_gradients" -> file
    core_dir: Path | None = None  # the folder their core modules were taken from
    core_files: dict[str, Path] | None = None  # "layers" -> file; None: no core folder
    folder: Path | None = None  # their folder (None: flat files only)

    def core_label(self, submissions: Path) -> str:
        if self.core_dir is None:
            return "src/transformer_lab/core"
        base = self.folder or submissions
        return self.core_dir.relative_to(base).as_posix()


@dataclass
class Found:
    students: dict[str, StudentWork]
    skipped: list[Skipped]
    #: (student, notebook) -> why it was left out as of another course version
    other_version: dict[tuple[str, str], str] = field(default_factory=dict)

    def skipped_of(self, student: str) -> list[Skipped]:
        return [s for s in self.skipped if s.student == student]


def strip_copies(stem: str) -> str:
    """``00_gradients`` from ``00_gradients (1)``, ``00_gradients-Copy1``, ``... copy 2``."""
    previous = None
    while previous != stem:
        previous, stem = stem, _COPY.sub("", stem).rstrip()
    return stem


def normalize(text: str) -> str:
    """Lower case, copies' suffixes off, runs of spaces, hyphens, dots and underscores as
    one ``_``."""
    return re.sub(_SEPARATORS, "_", strip_copies(text.strip()).lower()).strip("_")


def _number(text: str) -> int | None:
    match = re.match(r"(\d+)(?:_|$)", text)
    return int(match.group(1)) if match else None


def match_notebook(stem: str, notebooks: list[str]) -> tuple[str, tuple] | None:
    """The notebook a file in a student's folder is, and how well its name matches (lower is
    better): exactly, containing the name, or by its number alone; copies come after
    originals."""
    name = normalize(stem)
    copied = strip_copies(stem.strip()) != stem.strip()
    keys = sorted(notebooks, key=len, reverse=True)
    for nb in keys:
        if name == normalize(nb):
            return nb, (0, copied)
    for nb in keys:
        key = normalize(nb)
        if name.endswith("_" + key) or name.startswith(key + "_") or f"_{key}_" in name:
            return nb, (1, copied)
    number = _number(name)
    same = [nb for nb in notebooks if _number(normalize(nb)) == number]
    if number is not None and len(same) == 1:
        return same[0], (2, copied)
    return None


def match_flat(stem: str, notebooks: list[str]) -> tuple[str, str, tuple] | None:
    """(student, notebook, quality) of a top-level ``<student>_<NN_topic>`` file name."""
    base = strip_copies(stem.strip())
    copied = base != stem.strip()
    for nb in sorted(notebooks, key=len, reverse=True):
        parts = re.split(_SEPARATORS, nb)
        pattern = _SEPARATORS + _SEPARATORS.join(map(re.escape, parts)) + "$"
        match = re.search(pattern, base, re.IGNORECASE)
        if match and match.start() > 0:
            student = base[:match.start()].strip(" _-.")
            if student:
                return student, nb, (0, copied)
    return None


def is_hidden(rel: PurePath) -> bool:
    """Whether the grader ignores ``rel``: hidden files and folders (``.git``, ``__MACOSX``)."""
    return any(part.startswith((".", "__")) or part == "Thumbs.db" for part in rel.parts)


def _digest(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


def handout_digests(handout: Path) -> dict[str, str]:
    """relative path -> content hash, of every file of a handout folder."""
    return {p.relative_to(handout).as_posix(): _digest(p) for p in sorted(handout.rglob("*"))
            if p.is_file()}


def _handout_file(rel: Path, path: Path, digests: dict[str, str]) -> str | None:
    """"same" when ``rel`` ends with a handout path and has its content, "changed" when it
    ends with one but differs, None otherwise. Some handout files are "same" whatever they
    hold: README.md lists the notebooks handed out, which a run grading some of them cannot
    know, the package's _built.py records the commit the handout was built from, which a
    grader at a later commit does not share, and the checks' stored answers
    (:data:`ANY_CONTENT_UNDER`) may differ in their last bits."""
    parts = rel.parts
    for k in range(len(parts)):
        key = "/".join(parts[k:])
        if key in digests:
            return "same" if key in ANY_CONTENT or key.startswith(ANY_CONTENT_UNDER) or \
                _digest(path) == digests[key] else "changed"
    return None


#: The handout's files that are left out as handed out whatever they hold (:func:`_handout_file`).
ANY_CONTENT = ("README.md", "src/transformer_lab/_built.py")
#: ... and the folders: the answers the handout's checks store, computed with the machine's
#: BLAS, whose last bits the grader's rebuild of the handout need not share.
ANY_CONTENT_UNDER = ("src/transformer_lab/checks/data/",)

#: Every notebook of the course, an assignment's or not ("00_gradients", ...).
COURSE_NOTEBOOKS = sorted(syllabus.notebook_names(Path(syllabus.__file__).parent /
                                                  "checks").values())


#: Why a link in a submission is not graded: it could point at the solution, or at a classmate.
LINK_REASON = ("a link: not graded (links are never followed; hand in the file itself, "
               "not a link to it)")


#: Why a zip is not graded.
ZIP_REASON = ("not graded: the grader does not unpack zips; unzip each into a folder named for "
              "its student (unzip -d <student> <student>.zip)")


def find_submissions(folder: Path, notebooks: list[str],
                     handout: dict[str, str] | None = None) -> Found:
    """Every student's work in ``folder`` and every file skipped, with the reason.

    notebooks: the solution notebooks' names ("00_gradients"); handout: the handout's files
    (:func:`handout_digests`), which are ignored when a student hands them in unchanged.
    """
    if not folder.is_dir():
        raise SystemExit(f"error: SUBMISSIONS must be a folder of submissions "
                         f"(<student>/... or <student>_<NN_topic>.ipynb); "
                         f"{str(folder)!r} is not a folder")
    handout = handout or {}
    students: dict[str, StudentWork] = {}
    skipped: list[Skipped] = []
    candidates: dict[tuple[str, str], list[tuple[tuple, float, str, Path]]] = {}

    def skip(student: str, path: Path, reason: str) -> None:
        skipped.append(Skipped(student, path.relative_to(folder).as_posix(), reason))

    def candidate(student: str, nb: str, quality: tuple, path: Path) -> None:
        flat = path.parent == folder  # a student's own folder comes before a top-level file
        key = (-path.stat().st_mtime_ns,)
        candidates.setdefault((student, nb), []).append(((flat, *quality), key, str(path),
                                                         path))

    entries = sorted(folder.iterdir())
    trimmed = [e.name.strip() for e in entries if e.is_dir() and not e.is_symlink()]
    for entry in entries:
        rel = entry.relative_to(folder)
        if is_hidden(rel):
            continue
        if entry.is_symlink():
            skip("", entry, LINK_REASON)
            continue
        if entry.is_dir():
            # a name as written where trimming its spaces would merge two folders
            name = entry.name.strip() if trimmed.count(entry.name.strip()) == 1 else entry.name
            work = students.setdefault(name, StudentWork(name))
            work.folder = entry
            _scan_student(entry, folder, work, notebooks, handout, skip, candidate)
        elif entry.suffix.lower() == ".ipynb":
            match = match_flat(entry.stem, notebooks)
            if match is None:
                skip("", entry, f"not named <student>_<NN_topic>.ipynb with NN_topic one of "
                                f"{', '.join(notebooks)}")
                continue
            student, nb, quality = match
            students.setdefault(student, StudentWork(student))
            candidate(student, nb, quality, entry)
        elif entry.suffix.lower() == ".zip":
            skip(entry.stem, entry, ZIP_REASON)
        else:
            skip("", entry, "not graded: a file at the top of the submissions folder must be "
                            "a notebook named <student>_<NN_topic>.ipynb")
    for (student, nb), found in sorted(candidates.items()):
        found.sort()
        students[student].notebooks[nb] = found[0][3]
        for *_, path in found[1:]:
            skip(student, path, f"another file was graded for {nb}: "
                                f"{found[0][3].relative_to(folder).as_posix()}")
    if not students:
        zips = [s.path for s in skipped if s.reason == ZIP_REASON]
        raise SystemExit(f"error: no submissions in {str(folder)!r}; expected <student>/... "
                         f"folders or <student>_<NN_topic>.ipynb files with NN_topic one of "
                         f"{', '.join(notebooks)}" + (
                             f"; it holds {len(zips)} zip file(s) ({', '.join(zips[:3])}"
                             f"{', ...' if len(zips) > 3 else ''}): {ZIP_REASON}" if zips
                             else ""))
    skipped.sort(key=lambda s: (s.student, s.path))
    return Found(students, skipped)


def _scan_student(root: Path, folder: Path, work: StudentWork, notebooks, handout, skip,
                  candidate) -> None:
    files = []
    for p in sorted(root.rglob("*")):  # rglob does not enter linked folders
        if is_hidden(p.relative_to(root)):
            continue
        if p.is_symlink():
            skip(work.name, p, LINK_REASON)
        elif p.is_file():
            files.append(p)
    core_dirs = {path.parent for path in files if path.suffix == ".py"
                 and path.parent.name == "core"}
    chosen = None
    if core_dirs:
        def rank(d: Path):
            rel = d.relative_to(root).as_posix()
            return (not rel.endswith("transformer_lab/core"),
                    not rel.endswith("src/transformer_lab/core"), len(d.parts), rel)
        chosen = min(core_dirs, key=rank)
        work.core_dir = chosen
        work.core_files = {}
    modules = set(syllabus.TAUGHT_IN)
    for path in files:
        rel = path.relative_to(root)
        if path.suffix.lower() == ".ipynb":
            match = match_notebook(path.stem, notebooks)
            names = ", ".join(n + ".ipynb" for n in notebooks)
            if match is None and match_notebook(path.stem, COURSE_NOTEBOOKS):
                skip(work.name, path, f"not graded: a notebook of the course, but this "
                                      f"assignment grades {names} only")
            elif match is None:
                skip(work.name, path, f"not graded: its name matches none of the course's "
                                      f"notebooks ({names})")
            else:
                candidate(work.name, *match, path)
            continue
        if path.parent in core_dirs:
            if path.parent != chosen:
                skip(work.name, path, "another core folder was graded: "
                                      f"{chosen.relative_to(folder).as_posix()}")
                continue
            if path.stem in modules:
                work.core_files[path.stem] = path
            else:
                skip(work.name, path, "not a core module of the course ("
                     + ", ".join(f"{m}.py" for m in sorted(modules)) + "): not graded; put "
                     "helpers in the module whose functions use them")
            continue
        state = _handout_file(rel, path, handout)
        if state == "same":
            continue
        if state == "changed":
            skip(work.name, path, "changed, but not graded: only the notebooks and the core "
                                  "modules (src/transformer_lab/core/*.py) are")
        elif path.suffix.lower() == ".zip":
            skip(work.name, path, ZIP_REASON)
        else:
            skip(work.name, path, "not graded: neither a notebook of the course nor a core "
                                  "module in a folder named core/")
