"""The grader's sandbox (course/sandbox.py): a student's code sees Python, its own files and its own
processes, nothing else, and runs under limits.

First the sandbox alone: what a command in it can see, reach and use. Then a class graded as a
hostile class would be (issue 20): core functions that read the solution off disk (by its path,
through /proc/<pid>/cwd, through the grader's command line), copy a classmate's submission,
read $HOME, write outside their folder, connect to a listener on 127.0.0.1, leave a process
behind, fork without end or allocate far past the memory limit -- each earns nothing from it and
leaves no trace, while an honest classmate gets full marks. The same tricks graded with
--no-sandbox do get the solution: the tests would notice a sandbox that let them through.
On a machine without bubblewrap these tests skip, except in CI (.ci/run installs it), where
they fail.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from course_helpers import (
    POINTS_01,
    notebook_01,
    once_per_session,
    read_csv,
    require_sandbox,
    solved_01,
    student_01,
    student_folder,
    write,
)

from transformer_lab.course import grade, reports, sandbox, student

ROOT = Path(__file__).resolve().parents[1]
FULL = sum(POINTS_01.values())


@pytest.fixture(scope="module")
def box():
    require_sandbox()
    found = sandbox.find_sandbox()
    yield found
    found.close()


def run_in(box, code: str, mounts: sandbox.Mounts | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess:
    argv = box.command([sys.executable, "-c", code], mounts or sandbox.Mounts())
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    finally:
        box.release(argv)


class Listener:
    """A TCP listener on 127.0.0.1 that hands whoever connects ``payload`` and counts them.

    Its port is below Linux's ephemeral range (32768-60999), from which bind(0) hands out ports:
    Jupyter picks its kernels' ports so, and a kernel's client (ZeroMQ) reconnects to a port its
    kernel has left, which bind(0) may hand out again. A run of the hostile class with a port
    from bind(0), notebooks executing in the other test worker, counted 12 connections while
    every trick earned nothing (so none had connected)."""

    def __init__(self, payload: bytes = b"hello"):
        self.payload, self.connections = payload, 0
        self.sock = socket.socket()
        for port in random.Random().sample(range(20000, 32768), 100):
            try:
                self.sock.bind(("127.0.0.1", port))
                break
            except OSError:
                continue
        else:
            raise RuntimeError("no free port in 20000-32767 on 127.0.0.1")
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            with conn:
                conn.sendall(self.payload)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.sock.close()


def processes_with(marker: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                found.append(proc.name)
        except OSError:
            continue
    return found


# --- the sandbox alone ----------------------------------------------------------------------------

def test_only_python_and_its_own_folders_are_there(box, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "given.txt").write_text("given")
    code = f"""
import os, sys
print(open({str(mine / 'given.txt')!r}).read())
for path in [{str(ROOT)!r}, {str(ROOT / 'src')!r}, {str(tmp_path / 'secret.txt')!r},
             {os.path.expanduser('~')!r} + '/.bashrc', '/etc/passwd', '/etc/hostname']:
    print(path, os.path.exists(path) and (os.path.isfile(path) or sorted(os.listdir(path))))
print('home', os.environ['HOME'], os.listdir(os.environ['HOME']))
print('pids', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))
print(os.getcwd())
"""
    (tmp_path / "secret.txt").write_text("secret")
    done = run_in(box, code, sandbox.Mounts(read_only=(mine,), cwd=mine))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "given"
    seen = dict(line.split(" ", 1) for line in lines[1:7])
    # the course folder shows only the virtual environment if that lives in it, nothing else
    assert seen[str(ROOT)] in ("False", "['.venv']"), seen
    assert all(seen[path] == "False" for path in list(seen)[1:]), seen
    assert lines[7] == "home /tmp/home []"
    assert lines[8] in ("pids [1, 2]", "pids [1, 2, 3]")  # bubblewrap's init, python (, prlimit)
    assert lines[9] == str(mine)


def test_a_python_reached_through_a_link_runs_in_the_sandbox(box, tmp_path):
    """A course folder (its .venv) reached through a symbolic link: the sandbox binds the
    resolved folders, and runs Python from there, in its environment still."""
    link = tmp_path / "linked-env"
    link.symlink_to(Path(sys.prefix).resolve(), target_is_directory=True)
    argv = box.command([str(link / "bin" / Path(sys.executable).name), "-c",
                        "import sys, numpy; print(sys.prefix)"], sandbox.Mounts())
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
    finally:
        box.release(argv)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(Path(sys.prefix).resolve())


def test_what_is_read_only_cannot_be_written(box, tmp_path):
    """Only the writable mounts and /tmp take files: not the sandbox's root (a tmpfs of its
    own, half the memory, that no limit bounds) nor the folders made in it for the mounts."""
    ro, rw = tmp_path / "ro", tmp_path / "rw"
    ro.mkdir()
    rw.mkdir()
    # a folder made on the root for Python's mount (under /tmp it is in the sandbox's /tmp)
    prefix = Path(sys.prefix).resolve().parent
    mount_point = [] if prefix.is_relative_to("/tmp") else [str(prefix / "x")]
    code = f"""
for path in [{str(ro / 'x')!r}, {str(rw / 'x')!r}, '/tmp/x', {sys.prefix!r} + '/x',
             '/usr/x', '/x', *{mount_point!r}]:
    try:
        open(path, 'w').write('x')
        print('wrote', path)
    except OSError as err:
        print('refused', path, err.errno)
"""
    done = run_in(box, code, sandbox.Mounts(read_only=(ro,), writable=(rw,)))
    wrote = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("wrote")]
    assert wrote == [str(rw / "x"), "/tmp/x"], done.stdout + done.stderr
    assert (rw / "x").exists() and not (ro / "x").exists() and not Path(sys.prefix, "x").exists()


def test_no_network(box):
    with Listener() as listener:
        code = f"""
import socket
for address in [('127.0.0.1', {listener.port}), ('localhost', {listener.port})]:
    try:
        socket.create_connection(address, timeout=5)
        print('connected')
    except OSError as err:
        print('refused', type(err).__name__)
"""
        done = run_in(box, code)
    assert done.stdout.split("\n")[:2] == ["refused ConnectionRefusedError"] * 2 or \
        "connected" not in done.stdout, done.stdout + done.stderr
    assert listener.connections == 0


def test_limits_on_memory_processes_and_files(box):
    code = """
import os, numpy as np
try:
    np.ones(2 * 2**30 // 8 * 4)  # 8 GiB
    print('allocated')
except MemoryError:
    print('memory refused')
children = 0
try:
    for _ in range(500):
        if os.fork() == 0:
            import time; time.sleep(5); os._exit(0)
        children += 1
except OSError:
    pass
print('forked', children)
try:
    with open('/tmp/big', 'wb') as f:
        f.write(b'x' * (300 * 2**20))
    print('wrote 300 MiB')
except OSError as err:
    print('write refused', err.errno)
"""
    done = run_in(box, code)
    lines = done.stdout.splitlines()
    assert lines[0] == "memory refused", done.stdout + done.stderr
    forked = int(lines[1].split()[1])
    assert forked < box.limits.processes, forked
    assert lines[2].startswith("write refused"), lines


def test_nothing_is_left_running(box):
    marker = f"left-behind-{uuid.uuid4().hex}"
    code = f"""
import subprocess, sys
subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', {marker!r}],
                 start_new_session=True)
print('started')
"""
    done = run_in(box, code)
    assert done.stdout.strip() == "started", done.stderr
    time.sleep(0.5)
    assert processes_with(marker) == []


def test_without_bubblewrap_the_grader_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("sh", "prlimit"):
        if shutil.which(tool):
            (bare / tool).symlink_to(shutil.which(tool))
    monkeypatch.setenv("PATH", str(bare))
    with pytest.raises(sandbox.SandboxUnavailable, match="apt-get install bubblewrap"):
        sandbox.find_sandbox()
    write(notebook_01(), tmp_path / "source" / "01_attention.ipynb")
    write(solved_01(), tmp_path / "subs" / "ann" / "notebooks" / "01_attention.ipynb")
    status = grade.main([str(tmp_path / "subs"), "--source", str(tmp_path / "source"),
                         "--out", str(tmp_path / "grades"), "--project", str(ROOT)])
    err = capsys.readouterr().err
    assert status == 1
    assert "bubblewrap (bwrap) is not installed" in err and "--no-sandbox" in err, err
    assert not (tmp_path / "grades").exists()


# --- a hostile class ------------------------------------------------------------------------------

def _stealing(find: str) -> str:
    """A ``softmax_forward`` that runs the instructor's solution if ``find`` (code setting
    ``candidates``, paths of core modules) turns it up, and raises otherwise."""
    body = "\n".join("    " + line for line in find.strip().split("\n"))
    return f'''def softmax_forward(x, out=None):
    import os, glob
    candidates = []
{body}
    for path in candidates:
        try:
            text = open(path).read()
        except OSError:
            continue
        namespace = {{"__name__": "stolen"}}
        try:
            exec(compile(text, path, "exec"), namespace)
            return namespace["softmax_forward"](x, out)
        except Exception:
            continue
    raise RuntimeError("found no solution")'''


def _tricks(course: Path, subs: Path, home: Path, port: int, marker: str) -> dict[str, str]:
    layers = "src/transformer_lab/core/layers.py"
    return {
        # the instructor's course folder, by its path (as a student could guess it)
        "knows_the_path": _stealing(f"candidates = [{str(course / layers)!r}]"),
        # ... through the grader's working folder, or any process's
        "proc_cwd": _stealing(f"""
for link in glob.glob('/proc/*/cwd') + glob.glob('/proc/*/root'):
    try:
        candidates.append(os.path.join(os.readlink(link), {layers!r}))
    except OSError:
        pass"""),
        # ... through the grader's command line: --project, and the submissions folder
        "proc_cmdline": _stealing(f"""
for path in glob.glob('/proc/*/cmdline'):
    try:
        words = open(path, 'rb').read().split(b'\\0')
    except OSError:
        continue
    for word in words:
        folder = word.decode(errors='replace')
        candidates.append(os.path.join(folder, {layers!r}))
        candidates += glob.glob(os.path.join(folder, '*', {layers!r}))"""),
        # ... walking up from its own file and working folder
        "parent_folders": _stealing(f"""
for start in (os.path.abspath(__file__), os.getcwd()):
    folder = start
    while folder != os.path.dirname(folder):
        folder = os.path.dirname(folder)
        candidates.append(os.path.join(folder, {layers!r}))
        candidates += glob.glob(os.path.join(folder, '*', '*', {layers!r}))"""),
        # a classmate's submission, by its path
        "copies_classmate": _stealing(f"candidates = [{str(subs / 'honest' / layers)!r}]"),
        # a copy the instructor keeps in $HOME
        "reads_home": _stealing(f"candidates = [{str(home / 'layers.py')!r}]"),
        # the solution handed over by a server on this machine
        "connects": f'''def softmax_forward(x, out=None):
    import socket
    with socket.create_connection(("127.0.0.1", {port}), timeout=5) as s:
        text = b"".join(iter(lambda: s.recv(65536), b"")).decode()
    namespace = {{"__name__": "stolen"}}
    exec(text, namespace)
    return namespace["softmax_forward"](x, out)''',
        "writes_outside": f'''def softmax_forward(x, out=None):
    import os
    for folder in [{str(course)!r}, {str(home)!r}, {str(subs / 'honest')!r}, os.getcwd()]:
        try:
            with open(os.path.join(folder, "planted-{marker}.txt"), "w") as f:
                f.write("planted")
        except OSError:
            pass
    raise RuntimeError("wrote what it could")''',
        "leaves_process": f'''def softmax_forward(x, out=None):
    import subprocess, sys
    code = ("import time, pathlib; time.sleep(3); "
            "pathlib.Path({str(course)!r}, 'late-{marker}.txt').write_text('late')")
    subprocess.Popen([sys.executable, "-c", code, "{marker}"], start_new_session=True,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    raise RuntimeError("left a process behind")''',
        "forks": f'''def softmax_forward(x, out=None):
    import os
    for _ in range(1000):  # until the sandbox says no
        try:
            if os.fork() == 0:
                os.execvp("sleep", ["sleep", "30", "{marker}"])
        except OSError:
            break
    raise RuntimeError("forked")''',
        "allocates": '''def softmax_forward(x, out=None):
    import numpy as np
    hoard = [np.ones(2**27) for _ in range(400)]  # 400 GiB, 1 GiB at a time
    return hoard''',
    }


HOSTILE_NOTEBOOK = '''import os, socket
for path in [{layers!r}, {home!r}]:
    try:
        print("READ", open(path).read()[:200])
    except OSError as err:
        print("cannot read", type(err).__name__)
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=5)
    print("CONNECTED")
except OSError as err:
    print("no connection", type(err).__name__)
'''


def _hostile_class(out: Path, sandboxed: bool, who=None) -> dict:
    """The class, graded (with the sandbox, or with --no-sandbox): the output folder, the
    course folder, the listener's count, the marker of the planted files and processes."""
    course, subs, home = out / "course", out / "subs", out / "home"
    shutil.copytree(ROOT / "src", course / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in student.PROJECT_FILES:
        shutil.copyfile(ROOT / name, course / name)
    home.mkdir(parents=True)
    shutil.copyfile(course / "src/transformer_lab/core/layers.py", home / "layers.py")
    write(notebook_01(), out / "source" / "01_attention.ipynb")
    marker = f"marker-{uuid.uuid4().hex[:12]}"
    solution = (course / "src/transformer_lab/core/layers.py").read_bytes()
    with Listener(solution) as listener:
        tricks = _tricks(course, subs, home, listener.port, marker)
        student_folder(subs / "honest", solved_01(), core="reference")
        for name, code in tricks.items():
            if who is None or name in who:
                student_folder(subs / name, student_01(), replace={"layers": {
                    "softmax_forward": code}})
        if who is None:  # a notebook that looks around in its feedback run
            nb = student_01(before={"setup": HOSTILE_NOTEBOOK.format(
                layers=str(course / "src/transformer_lab/core/layers.py"),
                home=str(home / "layers.py"), port=listener.port)})
            student_folder(subs / "nosy_notebook", nb)
        # the control needs no feedback run: its points are what it is about
        options = ["--jobs", "2"] + (["--memory", "2"] if sandboxed else
                                     ["--no-sandbox", "--no-execute"])
        # as `make grade` runs it: in the course folder, a process of its own
        done = subprocess.run(
            [sys.executable, "-m", "transformer_lab.course.grade", str(subs),
             "--source", str(out / "source"), "--out", str(out / "grades"),
             "--case-timeout", "20", "--timeout", "60", *options],
            cwd=course, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout + done.stderr
        time.sleep(4)  # what a left process would do, it has done by now
        connections = listener.connections
    (out / "console.txt").write_text(done.stdout)
    (out / "facts.txt").write_text(f"{connections}\n{marker}\n")


def _facts(out: Path) -> tuple[int, str]:
    connections, marker = (out / "facts.txt").read_text().split()
    return int(connections), marker


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    require_sandbox()
    return once_per_session(tmp_path_factory, "hostile-class",
                            lambda out: _hostile_class(out, sandboxed=True))


def _points(out: Path, student: str) -> dict[str, float]:
    return {r["check"]: float(r["points"]) for r in read_csv(out / "grades" / "grades.csv")
            if r["student"] == student}


@pytest.mark.slow
def test_the_honest_student_gets_full_marks_in_the_sandbox(hostile):
    assert sum(_points(hostile, "honest").values()) == FULL
    rows = read_csv(hostile / "grades" / "sandbox.csv")
    assert {r["sandbox"].split(":")[0] for r in rows} == {f"bubblewrap {sandbox_version()}"}
    assert "students' code ran in: bubblewrap" in (hostile / "console.txt").read_text()


def sandbox_version() -> str:
    return subprocess.run(["bwrap", "--version"], capture_output=True,
                          text=True).stdout.split()[-1]


TRICK_NAMES = list(_tricks(Path("/c"), Path("/s"), Path("/h"), 1, "m"))


@pytest.mark.slow
@pytest.mark.parametrize("who", TRICK_NAMES)
def test_every_trick_earns_nothing(hostile, who):
    got = _points(hostile, who)
    assert got["check-softmax-forward"] == 0, who
    # the rest of the student's notebook was still graded (the handout's stubs: 0 there too)
    assert set(got) == set(POINTS_01)


@pytest.mark.slow
def test_the_tricks_leave_no_trace(hostile):
    connections, marker = _facts(hostile)
    assert connections == 0
    for root in (hostile / "course", hostile / "home", hostile / "subs", hostile / "grades"):
        planted = [p for p in root.rglob("*") if marker in p.name]
        assert planted == [], planted
    assert processes_with(marker) == []


@pytest.mark.slow
def test_the_feedback_run_is_sandboxed_too(hostile):
    import nbformat

    nb = nbformat.read(hostile / "grades" / "feedback" / "nosy_notebook" / "01_attention.ipynb",
                       as_version=4)
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                      for o in c.outputs)
    assert printed.count("cannot read FileNotFoundError") == 2, printed
    assert "no connection ConnectionRefusedError" in printed
    assert "READ" not in printed and "CONNECTED" not in printed


@pytest.mark.slow
def test_memory_and_process_hogs_cost_their_check_only(hostile):
    for who in ("allocates", "forks"):
        text = (hostile / "grades" / "feedback" / who / "01_attention.ipynb").read_text()
        assert "check-softmax-forward" in text
    summary = (hostile / "grades" / "feedback" / "allocates" / "01_attention.ipynb").read_text()
    assert "MemoryError" in summary or "killed by signal" in summary


@pytest.mark.slow
def test_without_the_sandbox_the_same_tricks_get_the_solution(tmp_path_factory):
    """The control: the tests above would notice a sandbox that let the tricks through."""
    stealing = ("knows_the_path", "proc_cwd", "proc_cmdline", "copies_classmate", "reads_home",
                "connects")
    out = once_per_session(tmp_path_factory, "hostile-control",
                           lambda out: _hostile_class(out, sandboxed=False, who=stealing))
    for who in stealing:
        assert _points(out, who)["check-softmax-forward"] == POINTS_01["check-softmax-forward"]
    rows = read_csv(out / "grades" / "sandbox.csv")
    assert {r["sandbox"] for r in rows} == {grade.NoSandbox().describe()}
    assert "WARNING: students' code ran in: no sandbox" in (out / "console.txt").read_text()


def test_an_installed_copy_of_the_course_is_hidden(box, tmp_path, monkeypatch):
    """`pip install .` (not -e) puts the instructor's solution into site-packages: the sandbox
    shows an empty folder there."""
    import sysconfig

    site = tmp_path / "site-packages"
    (site / "transformer_lab" / "core").mkdir(parents=True)
    (site / "transformer_lab" / "core" / "layers.py").write_text("SOLUTION = 1\n")
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"purelib": str(site),
                                                         "platlib": str(site)})
    assert sandbox.installed_course() == [(site / "transformer_lab").resolve()]
    hiding = sandbox.Bubblewrap(box.bwrap, box.prlimit, box.limits)
    try:
        hiding.python.append(site)  # as if it were this Python's
        done = run_in(hiding, f"import os; print(os.listdir({str(site)!r}), "
                              f"os.listdir({str(site / 'transformer_lab')!r}))")
    finally:
        hiding.close()
    assert done.stdout.strip() == "['transformer_lab'] []", done.stdout + done.stderr


def test_an_older_bubblewrap_without_the_newer_options_still_sandboxes(box):
    """Ubuntu 22.04's bubblewrap (0.6) has neither --disable-userns nor --size: the sandbox does
    without them (and says so), the rest holds."""
    old = sandbox.Bubblewrap(box.bwrap, box.prlimit, box.limits, "0.6.1", options=frozenset())
    try:
        argv = old.command(["true"], sandbox.Mounts())
        assert "--disable-userns" not in argv and "--size" not in argv
        assert "a private /tmp" in old.describe()
        done = run_in(old, "import os; print(sorted(int(p) for p in os.listdir('/proc') "
                           "if p.isdigit())[:2])")
        assert done.stdout.strip() == "[1, 2]", done.stdout + done.stderr
    finally:
        old.close()


# --- what the red team found (issue 20's fresh-eyes trial) -----------------------------------

def test_links_in_submissions_are_never_followed(tmp_path):
    """A link to the solution or to a classmate's work is listed in skipped.csv, not graded."""
    from transformer_lab.course.submissions import LINK_REASON, find_submissions

    subs = tmp_path / "subs"
    honest = student_folder(subs / "honest", solved_01(), core="reference")
    cheat = subs / "cheat"
    (cheat / "notebooks").mkdir(parents=True)
    (cheat / "notebooks" / "01_attention.ipynb").symlink_to(
        honest / "notebooks" / "01_attention.ipynb")
    (cheat / "src" / "transformer_lab" / "core").mkdir(parents=True)
    (cheat / "src" / "transformer_lab" / "core" / "layers.py").symlink_to(
        ROOT / "src" / "transformer_lab" / "core" / "layers.py")
    (subs / "twin").symlink_to(honest)
    found = find_submissions(subs, ["01_attention"])
    assert set(found.students) == {"honest", "cheat"}
    assert found.students["cheat"].notebooks == {} and not found.students["cheat"].core_files
    skipped = {s.path: s.reason for s in found.skipped}
    assert skipped == {"cheat/notebooks/01_attention.ipynb": LINK_REASON,
                       "cheat/src/transformer_lab/core/layers.py": LINK_REASON,
                       "twin": LINK_REASON}


def _probe(tmp_path, cell: str, box):
    """The probe of one case of check-logsumexp after ``cell``, in the sandbox."""
    from transformer_lab.checks import framework as F
    from transformer_lab.course import probe_driver
    from transformer_lab.course.package import parse_package, write_handout_package

    write_handout_package(ROOT / "src", tmp_path / "handout", parse_package(
        ROOT / "src" / "transformer_lab"))
    shutil.copytree(tmp_path / "handout", tmp_path / "probe")
    probe_driver.reference_free(tmp_path / "probe")
    spec = probe_driver.CheckSpec("check-logsumexp", ("logsumexp",), {},
                                  F.all_cases(F.get_check("check-logsumexp"), hidden=False)[:2])
    start = time.monotonic()
    report = probe_driver.run_probe(tmp_path / "probe", [("setup", cell)], [spec],
                                    probe_driver.ProbeLimits(cell=20, case=10, total=60), box)
    return report, time.monotonic() - start


OUT = "import os, sys, time\nout = os.path.join(sys.argv[1], 'out')\n"


@pytest.mark.parametrize("trick", ["progress_from_dev_zero", "results_are_fifos",
                                   "results_are_zip_bombs"])
def test_what_the_probe_leaves_in_its_results_cannot_flood_or_hang_the_grader(
        box, tmp_path, trick):
    import resource

    cell = OUT + {
        # the progress file the grader polls becomes an endless stream
        "progress_from_dev_zero": "os.remove(os.path.join(out, 'progress'))\n"
                                  "os.symlink('/dev/zero', os.path.join(out, 'progress'))\n"
                                  "time.sleep(3)\n",
        # the results become pipes nobody writes to, then the probe ends
        "results_are_fifos": "for j in range(2):\n"
                             "    os.mkfifo(os.path.join(out, f'case-0-{j}.npz'))\n"
                             "os._exit(0)\n",
        # the results: 1 GiB of zeros, deflated into a few MB each
        "results_are_zip_bombs": "import zipfile\n"
                                 "for j in range(2):\n"
                                 "    path = os.path.join(out, f'case-0-{j}.npz')\n"
                                 "    with zipfile.ZipFile(path, 'w', zipfile.ZIP_DEFLATED) as z:\n"
                                 "        with z.open('outcome.npy', 'w', force_zip64=True) as f:\n"
                                 "            for _ in range(1024):\n"
                                 "                f.write(bytes(2**20))\n"
                                 "os._exit(0)\n",
    }[trick] + "def logsumexp(x, axis=-1):\n    return 0\n"
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    report, seconds = _probe(tmp_path, cell, box)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before  # KiB
    assert seconds < 60 and grown < 500_000, (seconds, grown)
    if trick != "progress_from_dev_zero":  # (that probe goes on, and its answers count)
        assert not report.outcomes  # nothing read back counts as an answer
        assert "check-logsumexp" in report.missing


#: Ways to hold disk space past DISK_BYTES (8 MiB in these tests), each then waiting to be
#: caught: many files; blocks allocated past a file's size (fallocate's KEEP_SIZE: size 0);
#: deleted files held open; empty folders, or empty files (4 KiB each).
FILL_DISK = {
    "files": "for k in range(400):\n    open(f'junk-{k}', 'wb').write(bytes(2**20))\n"
             "    time.sleep(0.01)\n",
    "allocated": "import ctypes\nfd = os.open('big', os.O_CREAT | os.O_WRONLY)\n"
                 "ctypes.CDLL(None).fallocate(fd, 1, ctypes.c_long(0), ctypes.c_long(64 << 20))\n"
                 "assert os.stat('big').st_size == 0\n",
    "deleted": "held = []\nfor k in range(20):\n    f = open(f'gone-{k}', 'wb')\n"
               "    f.write(bytes(2**20)); f.flush(); os.remove(f'gone-{k}'); held.append(f)\n",
    "folders": "for k in range(5000):\n    os.mkdir(f'd{k}')\n",
    "empty files": "for k in range(5000):\n    open(f'e{k}', 'w').close()\n",
}


@pytest.mark.parametrize("how", sorted(FILL_DISK))
def test_a_probe_that_fills_the_disk_is_stopped(box, tmp_path, monkeypatch, how):
    """Each file is bounded (prlimit's fsize), their number is not: the grader measures what
    the probe holds as it runs and stops it past DISK_BYTES."""
    from transformer_lab.course import probe_driver

    monkeypatch.setattr(probe_driver, "DISK_BYTES", 8 * 2**20)
    cell = ("import os, time\n" + FILL_DISK[how] + "time.sleep(8)\n"
            "def logsumexp(x, axis=-1):\n    return 0\n")
    report, seconds = _probe(tmp_path, cell, box)
    assert seconds < 8, seconds
    assert "held more than 8 MiB of files: the grader stopped it" in str(report), report
    assert not report.outcomes


def test_dev_and_dev_shm_hold_little(box):
    """/dev/shm is memory the address-space limit does not count: bounded like /tmp (or
    read-only); the rest of /dev is read-only."""
    done = run_in(box, "import os\n"
                       "try:\n    open('/dev/made', 'w')\nexcept OSError as e:\n"
                       "    print('dev', e.errno)\n"
                       "n = 0\ntry:\n    with open('/dev/shm/x', 'wb') as f:\n"
                       "        while n < 2**30:\n            f.write(bytes(2**20)); n += 2**20\n"
                       "except OSError as e:\n    print('shm', e.errno, n <= 256 * 2**20)\n"
                       "open(os.devnull, 'w').write('fine')\nprint('null ok')")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    assert lines[0] == "dev 30" and lines[1].startswith("shm ") and lines[1].endswith(" True")
    assert lines[2] == "null ok"


def test_a_feedback_kernel_that_fills_the_disk_is_stopped(box, monkeypatch):
    import nbformat

    from transformer_lab.course import kernel_run

    monkeypatch.setattr(kernel_run, "DISK_BYTES", 8 * 2**20)
    v4 = nbformat.v4
    nb = v4.new_notebook(cells=[v4.new_code_cell(
        "import time\nfor k in range(400):\n    open(f'junk-{k}', 'wb').write(bytes(2**20))\n"
        "    time.sleep(0.01)"), v4.new_code_cell("print('after')")])
    start = time.monotonic()
    run = kernel_run.run_notebook(nb, timeout=30, sandbox=box)
    assert time.monotonic() - start < 30
    assert run.status == "kernel stopped", run
    assert run.later == ("not run: the kernel was stopped while running cell 1 (id "
                         f"{nb.cells[0].id!r}), over the files' limit (8 MiB)")


def test_the_results_read_back_are_bounded_in_all(box, tmp_path, monkeypatch):
    """Each result file is at most MAX_OUTCOME_BYTES, and all of one probe's together at most
    MAX_OUTCOMES_BYTES (here 1 MiB): the grader holds them until it judges them."""
    from transformer_lab.course import probe_driver

    monkeypatch.setattr(probe_driver, "MAX_OUTCOMES_BYTES", 2**20)
    cell = "import numpy as np\ndef logsumexp(x, axis=-1):\n    return np.ones(200_000)\n"
    report, _ = _probe(tmp_path, cell, box)
    assert not report.outcomes
    assert "your functions' results took more than 1 MiB in all" in \
        report.missing["check-logsumexp"]


def test_the_grader_s_environment_stays_outside(box, tmp_path, monkeypatch):
    """The feedback kernel's bubblewrap starts with the sandbox's environment: its init's
    /proc/1/environ shows none of the grader's variables."""
    import nbformat

    from transformer_lab.course.kernel_run import run_notebook

    monkeypatch.setenv("GRADER_SECRET", "hunter2")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import os\nfor pid in os.listdir('/proc'):\n    if pid.isdigit():\n"
        "        print(open(f'/proc/{pid}/environ').read())\nprint(dict(os.environ))")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    run = run_notebook(nb, 60, sandbox=box, env={"PYTHONHASHSEED": "0"})
    printed = "".join(o.get("text", "") for o in nb.cells[0].outputs)
    assert run.status == "ran" and "HOME" in printed, printed
    assert "hunter2" not in printed and "GRADER_SECRET" not in printed


def test_a_core_flag_is_filed_under_each_notebook_whose_grading_runs_its_function(tmp_path):
    """attention_forward is the student's in 01, 02 and 03 (it is extended there): a patch in
    it is a row for each; a helper's file write, for the notebooks of the function calling it;
    an import, for every notebook of the module's functions; other module-level code (the probe
    packages leave it out), for none."""
    from transformer_lab.course.submissions import StudentWork

    core = tmp_path / "s" / "core"
    core.mkdir(parents=True)
    (core / "attention.py").write_text(
        "import numpy as np\nsetattr(np, 'allclose', None)\n"
        "import transformer_lab.checks.framework as _fw\n\n\n"
        "def _spy(x):\n    open('/tmp/spy', 'w').write(str(x))\n\n\n"
        "def causal_mask(T, S=None):\n    _spy(T)\n    return None\n\n\n"
        "def attention_forward(q, k, v, mask=None, scale=None):\n"
        "    setattr(np, 'allclose', lambda *a: True)\n    return q, None\n")
    work = StudentWork("s", core_dir=core, core_files={"attention": core / "attention.py"},
                       folder=tmp_path / "s")
    rows = {(nb, flag.line) for nb, flag in grade.core_flags(work, tmp_path)}
    from transformer_lab import syllabus

    every = {place.split(" §")[0] for places in syllabus.TAUGHT_IN["attention"].values()
             for place in places}
    assert rows == {("", 2), ("02_masking", 7), ("01_attention", 16), ("02_masking", 16),
                    ("03_minibatching", 16)} | {(nb, 3) for nb in every}, rows


def test_a_file_built_to_break_the_parser_or_the_csv_costs_nothing_else(tmp_path):
    """A core module the parser cannot take (too deep) and a folder name that is not UTF-8:
    the run's files are still written."""
    from transformer_lab.course.submissions import StudentWork

    core = tmp_path / "s" / "core"
    core.mkdir(parents=True)
    (core / "layers.py").write_text("_z = " + "1+" * 200_000 + "1\n")
    work = StudentWork("s", core_dir=core, core_files={"layers": core / "layers.py"},
                       folder=tmp_path / "s")
    assert grade.core_flags(work, tmp_path) == []
    name = os.fsdecode(b"bad\xffname")
    reports._write_rows(tmp_path / "x.csv", ("student", "sandbox"), [[name, "none"]])
    assert (tmp_path / "x.csv").read_text() == "student,sandbox\nbad\\udcffname,none\n"


def test_closing_one_sandbox_leaves_another_working(box):
    """Each sandbox object has control groups of its own (a grading run closes its own when it
    ends, while another, in the same process, goes on)."""
    other = sandbox.find_sandbox()
    other.close()
    done = run_in(box, "print('still here')")
    assert done.stdout.strip() == "still here", done.stderr
