"""Gradescope's autograder (`make gradescope`): the zip, and run_autograder on submissions.

The zip is built from a source folder holding the synthetic notebook 01 (tests/course_helpers.py)
and this repository as the project, unpacked into ``<tmp>/autograder/source`` and run with
``AUTOGRADER_ROOT=<tmp>/autograder`` and this Python, as Gradescope would run it:
- the zip follows Gradescope's format (two executable scripts at its root, the course beside
  them, no caches), is the same bytes on every build, and embeds a package index only when the
  building environment names one;
- a correct student gets full marks (the same total as `make grade`), the untouched handout 0;
- a hostile core -- reading the instructor's solution beside the submission or through
  /proc/*/cwd, writing results.json into the results folder -- earns nothing in the sandbox,
  and the results are the grader's;
- a zipped submission and one wrapped in a folder are graded; an unsafe zip is unpacked
  safely, links are never followed;
- --hidden-visibility hides each check with hidden cases and adds a visible test of its public
  cases that never tells a hidden verdict;
- without a sandbox nothing is graded, unless the zip allows it, and then every result says so;
- the zip records its course version; a submission of another version is not graded, and the
  results say which version grades it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from course_helpers import (
    POINTS_01,
    SANDBOX_ARGS,
    notebook_01,
    once_per_session,
    read_csv,
    require_sandbox,
    solved_01,
    student_01,
    student_folder,
    write,
)

from transformer_lab import syllabus
from transformer_lab.course import grade, reports, student, versions
from transformer_lab.course import gradescope as G
from transformer_lab.course.submissions import Found

ROOT = Path(__file__).resolve().parents[1]
FULL = sum(POINTS_01.values())
TESTS_01 = {f"01_attention · {check}" for check in POINTS_01}
CONFIGS = {"visible": G.Config(), "after_due_date": G.Config("after_due_date"),
           "no_sandbox_allowed": G.Config(allow_no_sandbox=True)}


# --- building -----------------------------------------------------------------------------------

def build_zip(folder: Path, config: G.Config) -> Path:
    """The autograder of the synthetic notebook 01, built into ``folder/zip``."""
    write(notebook_01(), folder / "notebooks" / "01_attention.ipynb")
    return G.build(folder / "notebooks", ROOT, folder / "zip", config)


def built(tmp_path_factory, kind: str) -> Path:
    """The zip of CONFIGS[kind], built once per session."""
    folder = once_per_session(tmp_path_factory, f"gradescope-zip-{kind}",
                              lambda out: build_zip(out, CONFIGS[kind]))
    return folder / "zip" / G.ZIP_NAME


def unpack(archive: Path, dest: Path) -> None:
    """Unpack as unzip does, modes included."""
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            path = Path(zf.extract(info, dest))
            path.chmod(info.external_attr >> 16 & 0o777)


def test_the_zip_follows_gradescope_s_format(tmp_path_factory):
    archive = built(tmp_path_factory, "visible")
    with zipfile.ZipFile(archive) as zf:
        infos = {i.filename: i for i in zf.infolist()}
        names = list(infos)
        setup = zf.read("setup.sh").decode()
        runner = zf.read("run_autograder").decode()
        config = json.loads(zf.read(G.CONFIG_NAME))
    assert names == sorted(names)
    for script in ("setup.sh", "run_autograder"):
        assert infos[script].external_attr >> 16 == stat.S_IFREG | 0o755
    assert infos["requirements.txt"].external_attr >> 16 == stat.S_IFREG | 0o644
    assert {i.date_time for i in infos.values()} == {(1980, 1, 1, 0, 0, 0)}
    for needed in ("requirements.txt", "pyproject.toml", "README.md",
                   "notebooks/01_attention.ipynb", "src/transformer_lab/__init__.py",
                   "src/transformer_lab/core/layers.py", "src/transformer_lab/course/grade.py",
                   "src/transformer_lab/course/gradescope.py"):
        assert needed in names
    assert [n for n in names if n.startswith("notebooks/")] == ["notebooks/01_attention.ipynb"]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")
                or ".egg-info" in n or n.startswith((".venv", "build/", "tests/"))]
    assert "apt-get install -y python3 python3-venv python3-pip bubblewrap util-linux" in setup
    # torch's CPU build first, at the pin of requirements.txt, then what it pins besides
    cpu = f"--index-url https://download.pytorch.org/whl/cpu {student.torch_pin(ROOT)}\n"
    assert cpu in setup and student.torch_pin(ROOT) == "torch==2.13.0"
    assert setup.index(cpu) < setup.index("-r /autograder/source/requirements.txt -e "
                                          "/autograder/source\n")
    assert "AUTOGRADER_ROOT:-/autograder" in runner and "AUTOGRADER_PYTHON" in runner
    assert config == {"allow_no_sandbox": False, "hidden_visibility": "visible", "timeout": 60,
                      "case_timeout": 30, "probe_timeout": 600}
    record: dict = {}  # the course version it grades, and the syllabus its grader reads
    exec(zipfile.ZipFile(archive).read(f"src/transformer_lab/{versions.BUILT}"), record)
    assert record["COMMIT"] == versions.project_version(ROOT).commit
    assert record["TAUGHT_IN"] == syllabus.TAUGHT_IN and record["CALLS"] == syllabus.CALLS


def test_the_same_inputs_give_the_same_bytes(tmp_path_factory, tmp_path):
    again = build_zip(tmp_path / "again", CONFIGS["visible"])
    assert again.read_bytes() == built(tmp_path_factory, "visible").read_bytes()
    other = build_zip(tmp_path / "other", CONFIGS["after_due_date"])
    assert other.read_bytes() != again.read_bytes()


def test_run_autograder_takes_relative_paths_as_the_docs_write_them(tmp_path):
    """docs/instructors.md: ``AUTOGRADER_ROOT=X AUTOGRADER_PYTHON=.venv/bin/python bash
    X/source/run_autograder``, relative to where it is run, although the script changes folder."""
    (tmp_path / "X" / "source").mkdir(parents=True)
    script = tmp_path / "X" / "source" / "run_autograder"
    script.write_text(G.RUN_AUTOGRADER)
    fake = tmp_path / "env" / "bin" / "python"  # writes where it ran and with what
    fake.parent.mkdir(parents=True)
    fake.write_text('#!/usr/bin/env bash\necho "$PWD $*" > "$PWD/ran"\n')
    fake.chmod(0o755)
    env = {**os.environ, "AUTOGRADER_ROOT": "X", "AUTOGRADER_PYTHON": "env/bin/python"}
    subprocess.run(["bash", "X/source/run_autograder"], cwd=tmp_path, env=env, check=True)
    root = str((tmp_path / "X").resolve())
    assert (tmp_path / "X" / "ran").read_text().split() == [
        root, "-m", "transformer_lab.course.gradescope", "run", "--root", root]


def test_bad_build_arguments_say_which_and_what_was_expected(tmp_path, capsys):
    source = tmp_path / "notebooks"
    write(notebook_01(), source / "01_attention.ipynb")
    with pytest.raises(G.BuildError, match="--project must be the course's folder"):
        G.build(source, tmp_path, tmp_path / "out")
    with pytest.raises(G.BuildError, match="--source must be the folder of solution notebooks"):
        G.build(tmp_path / "missing", ROOT, tmp_path / "out")
    with pytest.raises(G.BuildError, match="--out .* and --source .* overlap"):
        G.build(source, ROOT, source / "zip")
    (tmp_path / "file").write_text("")
    with pytest.raises(G.BuildError, match="--out must be a folder"):
        G.build(source, ROOT, tmp_path / "file")
    broken = tmp_path / "broken"
    write(notebook_01({"check-logsumexp": "check('check-logsumexp', logsumexp)\nprint(1)"}),
          broken / "01_attention.ipynb")
    with pytest.raises(G.BuildError, match="could not grade these solutions"):
        G.build(broken, ROOT, tmp_path / "out")
    with pytest.raises(SystemExit):
        G.main(["build", "--source", str(source), "--hidden-visibility", "later"])
    assert "argument --hidden-visibility: invalid choice: 'later'" in capsys.readouterr().err
    assert G.main(["build", "--source", str(source), "--case-timeout", "0"]) == 2
    assert "case_timeout must be a positive number of seconds, got 0.0" in \
        capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_time_limits_travel_in_the_zip_to_the_grader(tmp_path, monkeypatch):
    """Gradescope's run had no limits of its own: a submission that loops everywhere took up
    to 600 s a notebook (the instructor trial); the build's limits reach the grader's options."""
    config = G.Config(timeout=20, case_timeout=5, probe_timeout=120.5)
    (tmp_path / G.CONFIG_NAME).write_text(config.to_json())
    assert G.Config.read(tmp_path / G.CONFIG_NAME) == config
    seen = {}
    monkeypatch.setattr(G.grade, "grade", lambda submissions, out, options: seen.setdefault(
        "options", options))
    G._grade(tmp_path, tmp_path / "out", tmp_path, config)
    options = seen["options"]
    assert (options.timeout, options.case_timeout, options.probe_timeout) == (20, 5, 120.5)
    # a notebook of another course version: the advice names the command Gradescope's needs
    assert options.command == "make gradescope"


def test_make_gradescope_runs_the_build():
    done = subprocess.run(["make", "-n", "gradescope", "GRADESCOPE_ARGS=--allow-no-sandbox"],
                          cwd=ROOT, capture_output=True, text=True, check=True)
    command = " ".join(done.stdout.replace("\\\n", " ").split())
    assert ("-m transformer_lab.course.gradescope build --source notebooks --project . --out "
            "build/gradescope --allow-no-sandbox") in command


# --- running --------------------------------------------------------------------------------------

def autograde(archive: Path, root: Path, submit, name: str | None = None,
              path: str | None = None) -> dict:
    """Run the autograder of ``archive`` as Gradescope does, on what ``submit(folder)`` puts in
    the submission folder; its results (stdout in ``root/stdout``)."""
    unpack(archive, root / "source")
    (root / "submission").mkdir(parents=True)
    submit(root / "submission")
    if name is not None:
        (root / "submission_metadata.json").write_text(json.dumps({"users": [{"name": name}]}))
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "AUTOGRADER_PYTHON": sys.executable}
    if path is not None:
        env["PATH"] = path
    done = subprocess.run([shutil.which("bash"), str(root / "source" / "run_autograder")],
                          env=env, capture_output=True, text=True, timeout=600)
    (root / "stdout").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((root / "results" / "results.json").read_text())


def scenario(tmp_path_factory, key: str, kind: str, submit, **kw) -> tuple[dict, Path]:
    """autograde() once per session: (results, the autograder's root)."""
    archive = built(tmp_path_factory, kind)
    folder = once_per_session(tmp_path_factory, f"gradescope-{key}",
                              lambda out: autograde(archive, out / "autograder",
                                                    lambda sub: submit(sub, out / "autograder"),
                                                    **kw))
    root = folder / "autograder"
    return json.loads((root / "results" / "results.json").read_text()), root


def by_name(results: dict) -> dict[str, dict]:
    return {t["name"]: t for t in results["tests"]}


def no_bwrap_path(folder: Path) -> str:
    """A PATH without bubblewrap: the few tools the run needs, linked into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for tool in ("bash", "env"):
        (folder / tool).symlink_to(shutil.which(tool))
    return str(folder)


def hostile_core(root: Path) -> dict:
    """softmax_forward runs the instructor's solution, found beside the submission or through
    another process's working folder; attention_forward plants results in the results folder."""
    solution = "source/src/transformer_lab/core/layers.py"
    reader = f'''def softmax_forward(x, out=None):
    import glob
    paths = [{str(root / solution)!r}, "../{solution}", "/autograder/{solution}"]
    paths += glob.glob("/proc/*/cwd/{solution}") + glob.glob("/proc/*/cwd/../{solution}")
    for path in paths:
        try:
            with open(path) as f:
                code = f.read()
        except OSError:
            continue
        scope = {{"__name__": "solution"}}
        exec(compile(code, path, "exec"), scope)
        return scope["softmax_forward"](x, out)
    raise NotImplementedError("no solution in reach")'''
    writer = f'''def attention_forward(q, k, v, mask=None, scale=None):
    import json, os
    folder = {str(root / "results")!r}
    try:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "results.json"), "w") as f:
            json.dump({{"score": 100, "output": "planted", "tests": []}}, f)
        with open(os.path.join(folder, "planted.txt"), "w") as f:
            f.write("planted")
    except OSError:
        pass
    raise NotImplementedError("nothing here")'''
    return {"layers": {"softmax_forward": reader}, "attention": {"attention_forward": writer}}


def _correct(sub: Path, root: Path) -> None:
    student_folder(sub, solved_01(), core="reference")


@pytest.fixture(scope="module")
def correct(tmp_path_factory):
    """A correct student, graded on Gradescope and by `make grade` (grade.main)."""
    require_sandbox()
    results, root = scenario(tmp_path_factory, "correct", "visible", _correct,
                             name="Ada Lovelace")

    def by_make_grade(out: Path) -> None:
        _correct(out / "subs" / "ada", out)
        with contextlib.redirect_stdout(io.StringIO()):
            assert grade.main([str(out / "subs"), "--source", str(root / "source" / "notebooks"),
                               "--project", str(ROOT), "--out", str(out / "grades"),
                               "--no-execute", *SANDBOX_ARGS]) == 0
    grades = once_per_session(tmp_path_factory, "gradescope-make-grade", by_make_grade)
    return results, root, read_csv(grades / "grades" / "grades.csv")


@pytest.mark.slow
def test_a_correct_student_gets_full_marks_as_make_grade_gives(correct):
    results, root, rows = correct
    tests = by_name(results)
    assert set(tests) == TESTS_01
    for check, points in POINTS_01.items():
        test = tests[f"01_attention · {check}"]
        assert test["score"] == test["max_score"] == points, test
        assert test["output"].startswith("passed (") and test["visibility"] == "visible"
    assert results["score"] == FULL == sum(float(r["points"]) for r in rows)
    assert results["stdout_visibility"] == "hidden"
    assert isinstance(results["execution_time"], int)
    output = results["output"]
    assert output.startswith("Graded: 01_attention.")
    assert f"01_attention: {FULL} / {FULL} points" in output
    assert "your functions, from your core modules: `attention_forward`, `softmax_forward`" \
        in output
    assert "Your code ran in: bubblewrap" in output
    stdout = (root / "stdout").read_text()
    assert f"autograder: {root / 'source' / 'src' / 'transformer_lab'}," in stdout  # the zip's
    assert "Ada_Lovelace" in stdout


@pytest.mark.slow
def test_the_untouched_handout_gets_zero(tmp_path_factory):
    require_sandbox()
    results, _ = scenario(tmp_path_factory, "stub", "visible",
                          lambda sub, root: student_folder(sub, student_01()))
    tests = by_name(results)
    assert set(tests) == TESTS_01 and results["score"] == 0
    assert {t["score"] for t in tests.values()} == {0}
    assert "not written yet" in tests["01_attention · check-softmax-forward"]["output"]
    assert "NotImplementedError: Exercise" in tests["01_attention · check-logsumexp"]["output"]


@pytest.mark.slow
def test_a_hostile_core_earns_nothing_and_the_results_are_the_grader_s(tmp_path_factory):
    require_sandbox()
    results, root = scenario(
        tmp_path_factory, "hostile", "visible",
        lambda sub, root: student_folder(sub, student_01(), replace=hostile_core(root)))
    tests = by_name(results)
    assert set(tests) == TESTS_01 and results["score"] == 0
    assert "no solution in reach" in tests["01_attention · check-softmax-forward"]["output"]
    assert results["output"].startswith("Graded: 01_attention.")
    assert not (root / "results" / "planted.txt").exists()  # out of the sandbox's reach


@pytest.mark.slow
def test_a_submission_wrapped_in_a_folder(tmp_path_factory):
    require_sandbox()
    def wrapped(sub: Path, root: Path) -> None:
        student_folder(sub / "my course", solved_01(), core="reference")
        (sub / "my course" / "notes.txt").write_text("my notes")
    results, _ = scenario(tmp_path_factory, "wrapped", "visible", wrapped)
    assert results["score"] == FULL and set(by_name(results)) == TESTS_01
    assert "- my course/notes.txt: not graded: neither a notebook" in results["output"]


def _zipped(sub: Path, root: Path) -> None:
    """The course folder, zipped by the student, with entries no unpacking may follow."""
    folder = student_folder(root / "work" / "course", solved_01(), core="reference")
    with zipfile.ZipFile(sub / "course.zip", "w") as zf:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                zf.write(path, path.relative_to(folder.parent).as_posix())
        zf.writestr("../escaped.txt", "out")
        link = zipfile.ZipInfo("course/solution.py")
        link.create_system, link.external_attr = 3, (stat.S_IFLNK | 0o777) << 16
        zf.writestr(link, "/autograder/source/src/transformer_lab/core/layers.py")
    shutil.rmtree(root / "work")


@pytest.mark.slow
def test_a_zipped_submission_with_hidden_cases_after_the_due_date(tmp_path_factory):
    require_sandbox()
    results, root = scenario(tmp_path_factory, "zipped", "after_due_date", _zipped)
    tests = by_name(results)
    public = {n: t for n, t in tests.items() if n.endswith(G.PUBLIC_SUFFIX)}
    scored = {n: t for n, t in tests.items() if n not in public}
    assert set(scored) == TESTS_01, results  # every check of notebook 01 has hidden cases
    assert set(public) == {n + G.PUBLIC_SUFFIX for n in TESTS_01}
    assert results["score"] == FULL, results
    for name, test in scored.items():
        assert test["visibility"] == "after_due_date" and test["score"] == test["max_score"]
        shown = public[name + G.PUBLIC_SUFFIX]
        assert shown["visibility"] == "visible" and shown["max_score"] == shown["score"] == 0
        assert shown["status"] == "passed"
        assert shown["output"].startswith("passed (") and "after the due date" in shown["output"]
    output = results["output"]
    assert "points" not in output.split("Each check's points")[0]  # no total before the date
    assert "- course.zip: ../escaped.txt: a path outside the zip's folder" in output
    assert "- course.zip: course/solution.py: a link: not unpacked" in output
    assert not list(root.parent.rglob("escaped.txt"))


@pytest.mark.slow
def test_without_a_sandbox_nothing_is_graded_by_default(tmp_path_factory):
    results, root = scenario(tmp_path_factory, "no-sandbox-required", "visible",
                             lambda sub, root: student_folder(sub, solved_01(),
                                                              core="reference"),
                             path=no_bwrap_path(tmp_path_factory.mktemp("bin")))
    assert results["score"] == 0 and results["tests"] == []
    output = results["output"]
    assert "no sandbox to run your code in" in output
    assert "bubblewrap (bwrap) is not installed" in output
    assert "make gradescope GRADESCOPE_ARGS=--allow-no-sandbox" in output


@pytest.mark.slow
def test_allowed_without_a_sandbox_it_grades_and_says_so(tmp_path_factory):
    """The hostile core again, where the zip allows grading without a sandbox: its softmax
    does reach the solution (why the sandbox is the default), and still results.json is the
    grader's."""
    results, root = scenario(
        tmp_path_factory, "no-sandbox-allowed", "no_sandbox_allowed",
        lambda sub, root: student_folder(sub, student_01(), replace=hostile_core(root)),
        path=no_bwrap_path(tmp_path_factory.mktemp("bin")))
    tests = by_name(results)
    assert set(tests) == TESTS_01
    assert tests["01_attention · check-softmax-forward"]["score"] == 2
    assert results["score"] == 2
    assert "planted" not in json.dumps(results)
    assert all(t["output"].endswith(G.NO_SANDBOX_NOTE) for t in tests.values())
    assert "WARNING: your code ran WITHOUT a sandbox" in results["output"]
    assert "bubblewrap (bwrap) is not installed" in (root / "stdout").read_text()


def test_a_submission_of_another_course_version_is_not_graded_and_says_which_grades_it(
        tmp_path_factory):
    old = versions.CourseVersion("0.1.0", "abc1234")

    def submit(sub: Path, root: Path) -> None:
        nb = solved_01()
        versions.stamp(nb, old)
        student_folder(sub, nb, core="reference")
    results, root = scenario(tmp_path_factory, "old-version", "visible", submit)
    ours = versions.project_version(root / "source")
    assert ours == versions.project_version(ROOT)  # the zip's record: this checkout's commit
    assert results["score"] == 0 and results["tests"] == []
    assert results["output"] == (
        f"Your submission could not be graded: it was made from course version {old}, and "
        f"this autograder grades course version {ours}. None of your code ran; this is not "
        f"your fault -- please tell your instructor.\n\nFor the instructor: These submissions "
        f"were made from course version {old}; this is {ours}: grade them with that version "
        f"-- `git worktree add ../course-abc1234 abc1234`, then run `make gradescope` there. Then "
        f"upload that autograder (build/gradescope/autograder.zip) for this assignment.")


# --- the pieces, in this process ------------------------------------------------------------------

def test_the_student_s_folder_is_named_safely(tmp_path):
    metadata = tmp_path / "submission_metadata.json"
    assert G.student_name(metadata) == "student"
    for users, want in (([{"name": "Zoë O'Brien"}], "Zoe_O_Brien"),
                        ([{"name": "../../etc"}], "etc"), ([{"name": "__.x"}], "x"),
                        ([{"name": "  "}], "student"), ([], "student"), ([{"id": 3}], "student")):
        metadata.write_text(json.dumps({"users": users}))
        assert G.student_name(metadata) == want
    metadata.write_text("not json")
    assert G.student_name(metadata) == "student"


def test_a_zip_is_unpacked_safely(tmp_path):
    archive = tmp_path / "in" / "work.zip"
    archive.parent.mkdir()
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("work/notebooks/01_attention.ipynb", "{}")
        zf.writestr("work/notebooks/01_attention.ipynb", "{} again")
        zf.writestr("../up.txt", "x")
        zf.writestr("/abs.txt", "x")
        zf.writestr("C:/drive.txt", "x")
        zf.writestr("work/./inner/../../../up2.txt", "x")
        zf.writestr("__MACOSX/work/._x", "x")
        link = zipfile.ZipInfo("work/link")
        link.create_system, link.external_attr = 3, (stat.S_IFLNK | 0o777) << 16
        zf.writestr(link, "/etc/passwd")
    dest = tmp_path / "box" / "student"
    dest.mkdir(parents=True)
    left = dict(G.extract_submission(archive, dest))
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")
                  if p.is_file()) == ["box/student/work/notebooks/01_attention.ipynb",
                                      "in/work.zip"]
    assert left == {
        "work.zip: work/notebooks/01_attention.ipynb": "a second file of the same name: "
                                                       "not unpacked",
        "work.zip: ../up.txt": "a path outside the zip's folder: not unpacked",
        "work.zip: /abs.txt": "a path outside the zip's folder: not unpacked",
        "work.zip: C:/drive.txt": "a path outside the zip's folder: not unpacked",
        "work.zip: work/./inner/../../../up2.txt": "a path outside the zip's folder: not "
                                                   "unpacked",
        "work.zip: work/link": "a link: not unpacked, not graded"}


def test_a_zip_bomb_stops_at_the_size_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(G, "MAX_SUBMISSION_BYTES", 2**20)
    archive = tmp_path / "submission" / "bomb.zip"
    archive.parent.mkdir()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("zeros.bin", bytes(4 * 2**20))
    assert archive.stat().st_size < 2**16
    with pytest.raises(G.SubmissionError, match="too large to grade: at most 1 MiB"):
        G.lay_out(archive.parent, tmp_path / "out" / "student")
    with pytest.raises(G.SubmissionError, match="could not be read as a zip file"):
        archive.write_bytes(b"not a zip")
        G.lay_out(archive.parent, tmp_path / "again" / "student")


def test_links_in_a_submission_are_never_followed(tmp_path):
    sub = tmp_path / "submission"
    core = sub / "src" / "transformer_lab" / "core"
    core.mkdir(parents=True)
    (core / "layers.py").symlink_to(ROOT / "src" / "transformer_lab" / "core" / "layers.py")
    (sub / "src" / "solutions").symlink_to(ROOT / "src")
    (sub / "notes.txt").write_text("mine")
    (sub / ".git").mkdir()
    (sub / ".git" / "config").write_text("")
    dest = tmp_path / "subs" / "student"
    left = G.lay_out(sub, dest)
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == \
        ["notes.txt"]
    assert left == [("src/solutions", "a link: not followed, not graded"),
                    ("src/transformer_lab/core/layers.py", "a link: not followed, not graded")]


def _graded(status="graded", **result) -> tuple[reports.Graded, reports.CheckResult]:
    r = reports.CheckResult(**{"check": "check-softmax-forward", "points": 0, "max_points": 2,
                             "message": "case 'x': expected 1, got 2", "cases": 7, "public": 6,
                             "failed_case": 6, **result})
    return reports.Graded("student", "01_attention", [r], status), r


@pytest.mark.parametrize("visibility", ["after_due_date", "after_published", "hidden"])
def test_the_public_cases_test_never_tells_a_hidden_verdict(visibility):
    config = G.Config(visibility)
    g, r = _graded()  # failed on case 6, the first hidden one
    public, scored = G.check_tests(g, r, config)
    assert scored == {"name": "01_attention · check-softmax-forward", "score": 0,
                      "max_score": 2, "status": "failed",
                      "output": "case 'x': expected 1, got 2", "visibility": visibility}
    assert public["name"] == scored["name"] + G.PUBLIC_SUFFIX
    assert (public["score"], public["max_score"], public["status"], public["visibility"]) == \
        (0, 0, "passed", "visible")
    assert public["output"].startswith("passed (6 public cases).")
    assert "expected" not in public["output"] and G.SHOWN[visibility] in public["output"]
    g, r = _graded(failed_case=2)  # a public case failed: the student sees why
    public, _ = G.check_tests(g, r, config)
    assert public["status"] == "failed" and "case 'x': expected 1, got 2" in public["output"]
    g, r = _graded(status="unreadable", message="could not be read as a notebook",
                   failed_case=None, public=0, cases=0)
    public, scored = G.check_tests(g, r, config)  # the reason is in the summary, said once
    assert public["status"] == "failed" and "could not be read" not in public["output"]
    assert public["output"] == scored["output"] == \
        "not graded (unreadable): why is said at the top of the results"
    summary = G.summary(reports.Outcome([g], Found({}, []), [], ""), config, ["01_attention"],
                        [])
    assert "01_attention (unreadable): could not be read as a notebook" in summary
    g, r = _graded(points=2, message="ok", cases=11, failed_case=None)
    public, scored = G.check_tests(g, r, config)
    assert public["status"] == "passed" and scored["output"] == "passed (11 cases)"
    # visible: one test per check, as it is
    assert G.check_tests(g, r, G.Config()) == [{**scored, "visibility": "visible"}]


def run_here(root: Path, config: G.Config) -> dict:
    """G.run() in this process on ``root/submission``, with the synthetic notebook 01."""
    write(notebook_01(), root / "source" / "notebooks" / "01_attention.ipynb")
    shutil.copytree(ROOT / "src", root / "source" / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in G.PROJECT_FILES:
        shutil.copy(ROOT / name, root / "source" / name)
    (root / "source" / G.CONFIG_NAME).write_text(config.to_json())
    with contextlib.redirect_stdout(io.StringIO()):
        assert G.run(root) == 0
    return json.loads((root / "results" / "results.json").read_text())


def test_a_submission_without_notebooks_says_what_to_hand_in(tmp_path):
    root = tmp_path / "autograder"
    (root / "submission" / "work").mkdir(parents=True)
    (root / "submission" / "work" / "notes.txt").write_text("my notes")
    results = run_here(root, G.Config(allow_no_sandbox=True))  # nothing runs: any machine
    assert results["score"] == 0 and results["tests"] == []
    assert results["output"].startswith("Nothing was graded: no notebook of the course was "
                                        "found in your submission.")
    assert "named as in the course: 01_attention.ipynb." in results["output"]
    assert "- work/notes.txt: not graded: neither a notebook" in results["output"]


def test_a_missing_sandbox_in_process(tmp_path, monkeypatch):
    """run() on a monkeypatched grade.find_sandbox: the results say why, exit status 0."""
    def unavailable(limits=None):
        raise grade.SandboxUnavailable("bubblewrap is installed but could not make a sandbox here")
    monkeypatch.setattr(grade, "find_sandbox", unavailable)
    root = tmp_path / "autograder"
    student_folder(root / "submission", student_01())
    results = run_here(root, G.Config())
    assert results["score"] == 0 and results["tests"] == []
    assert "could not make a sandbox here" in results["output"]
    assert "--allow-no-sandbox" in results["output"]
