"""Where a student's code runs when the grader runs it: a bubblewrap sandbox of its own for
each run (one probe process, one feedback kernel). What it shows and bounds:
docs/instructors.md, "The sandbox"; time is the caller's to bound (it kills the sandbox).

:func:`find_sandbox` returns the sandbox to use, or raises :class:`SandboxUnavailable` with the
command that installs bubblewrap; :class:`NoSandbox` is what ``--no-sandbox`` runs with (the
same interface, no isolation), recorded per student in the grader's output.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

INSTALL_HINT = ("install bubblewrap: 'sudo apt-get install bubblewrap' (Debian, Ubuntu), "
                "'sudo dnf install bubblewrap' (Fedora), 'sudo pacman -S bubblewrap' (Arch); "
                "or grade without a sandbox, at your own risk, with --no-sandbox "
                "(make grade ... GRADE_ARGS=--no-sandbox)")
#: Files of /etc the programs in the sandbox may need (the dynamic loader's cache, fonts for
#: figures); the rest of /etc -- users, hosts, the machine's configuration -- stays outside.
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "fonts", "alternatives", "localtime",
             "mime.types")
#: Top-level folders bound read-only where they are folders (symbolic links where they are).
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
#: Where the sandbox's home and temporary files live, inside its private /tmp.
SANDBOX_HOME = "/tmp/home"


#: What one run of a student's code (a probe, a feedback kernel) may hold on the host's disk
#: in all: the files of its writable folders (their allocated blocks, at least 4 KiB a file or
#: folder) and the deleted files its processes hold open. The grader measures it about twice a
#: second and stops the run past it (a file is at most SandboxLimits.file_size; nothing else
#: bounds the sum, or the number of entries, whose walk the 4 KiB each bounds).
DISK_BYTES = 2**30
ENTRY_BYTES = 4096


def disk_bytes(folders, limit: int, pid: int | None = None) -> int:
    """The bytes a run holds on disk (:data:`DISK_BYTES`): under ``folders`` (links not
    followed), and in the deleted files that the process ``pid`` and its descendants hold
    open (each file once); counted until they pass ``limit``."""
    total, seen = 0, set()
    for folder in folders:
        for root, dirs, files in os.walk(folder):
            total += ENTRY_BYTES * len(dirs)
            for name in files:
                total += _allocated(os.path.join(root, name), follow=False, seen=seen)
                if total > limit:
                    return total
    for process in _descendants(pid) if pid else ():
        with contextlib.suppress(OSError), os.scandir(f"/proc/{process}/fd") as fds:
            for fd in fds:
                with contextlib.suppress(OSError):
                    if os.readlink(fd.path).endswith(" (deleted)"):
                        total += _allocated(fd.path, follow=True, seen=seen)
    return total


def _allocated(path: str, follow: bool, seen: set) -> int:
    """A regular file's size or its allocated blocks, whichever is more (a file allocated past
    its size, fallocate's KEEP_SIZE, holds its blocks), at least ENTRY_BYTES; 0 for a file
    counted already (``seen``: device and inode), anything else, or a file gone."""
    try:
        info = os.stat(path) if follow else os.lstat(path)
    except OSError:
        return 0
    if (info.st_dev, info.st_ino) in seen:
        return 0
    seen.add((info.st_dev, info.st_ino))
    if not stat.S_ISREG(info.st_mode):
        return ENTRY_BYTES
    return max(info.st_size, info.st_blocks * 512, ENTRY_BYTES)


def _descendants(pid: int) -> list[int]:
    """``pid`` and the processes it started, and theirs (read from /proc; [] without it)."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError), os.scandir("/proc") as entries:
        for entry in entries:
            if entry.name.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    text = Path(f"/proc/{entry.name}/stat").read_text()
                    parent = int(text.rsplit(")", 1)[1].split()[1])
                    children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing, or does not work on this machine; the message says what to do."""


def binary_size(nbytes: int) -> str:
    return f"{nbytes / 2**30:g} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:g} MiB"


@dataclass(frozen=True)
class SandboxLimits:
    """What one sandbox may use. memory: bytes of address space a process may map (and, with a
    control group, the memory of the whole sandbox); processes: processes and threads;
    file_size: the largest file it may write; tmp: the size of its private /tmp;
    open_files: file descriptors a process may hold."""

    memory: int = 4 * 2**30
    processes: int = 64
    file_size: int = 256 * 2**20
    tmp: int = 256 * 2**20
    open_files: int = 1024

    def describe(self) -> str:
        return (f"{binary_size(self.memory)} of memory, {self.processes} processes, files up "
                f"to {binary_size(self.file_size)} ({binary_size(DISK_BYTES)} in all), a "
                f"{binary_size(self.tmp)} /tmp")

    def prlimit_args(self) -> list[str]:
        return [f"--as={self.memory}", f"--nproc={self.processes}",
                f"--fsize={self.file_size}", f"--nofile={self.open_files}", "--core=0"]


@dataclass(frozen=True)
class Mounts:
    """What one run of a student's code sees besides the system and Python: folders bound
    read-only and writable (at the same paths as outside), the working folder, environment."""

    read_only: tuple[Path, ...] = ()
    writable: tuple[Path, ...] = ()
    cwd: Path | None = None
    env: tuple[tuple[str, str], ...] = ()


def installed_course() -> list[Path]:
    """Copies of the course's package installed into this Python (``pip install .`` rather than
    ``-e .`` puts the instructor's solution there): hidden in the sandbox."""
    import sysconfig

    found = set()
    for key in ("purelib", "platlib"):
        folder = Path(sysconfig.get_paths()[key]) / "transformer_lab"
        if folder.is_dir():
            found.add(folder.resolve())
    return sorted(found)


def python_dirs() -> list[Path]:
    """The folders this Python runs from: the virtual environment and the interpreter's own
    installation (where a virtual environment's ``bin/python`` links to)."""
    dirs = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                        sys.base_exec_prefix)}
    dirs.add(Path(sys.executable).resolve().parent.parent)
    # a folder inside another one is bound with it
    return sorted(d for d in dirs if not any(o != d and d.is_relative_to(o) for o in dirs))


def _in_bound_folder(program: str) -> str:
    """``program`` (Python: the virtual environment's ``bin/python``) in its folder's resolved
    path, which the sandbox binds (:func:`python_dirs`) -- a course folder reached through a
    link is not there -- the file itself not resolved, so that Python still finds the
    environment beside it."""
    path = Path(program)
    return str(path.parent.resolve() / path.name) if path.is_absolute() else program


class NoSandbox:
    """``--no-sandbox``: the student's code runs as the grader's user, with its permissions."""

    name = "none"
    isolated = False

    def describe(self) -> str:
        return "no sandbox (--no-sandbox): the students' code ran with your permissions"

    def command(self, argv: list[str], mounts: Mounts) -> list[str]:
        return list(argv)

    def environment(self, mounts: Mounts) -> dict[str, str]:
        return dict(mounts.env)

    def release(self, argv: list[str]) -> None:
        pass

    def close(self) -> None:
        pass


class Bubblewrap:
    """Runs commands in bubblewrap with :class:`SandboxLimits` (see the module's docstring)."""

    name = "bubblewrap"
    isolated = True

    def __init__(self, bwrap: str, prlimit: str, limits: SandboxLimits | None = None,
                 version: str = "", options: frozenset[str] | None = None):
        self.bwrap, self.prlimit = bwrap, prlimit
        self.limits = limits or SandboxLimits()
        self.version = version
        # bubblewrap before 0.8 (Ubuntu 22.04: 0.6) lacks these; what it offers is used
        self.options = options if options is not None else _options(bwrap)
        self.python = python_dirs()
        self.hidden = installed_course()
        self.cgroups = _ControlGroups.make(self.limits)

    def describe(self) -> str:
        groups = (" (memory and processes of each sandbox bounded by a control group)"
                  if self.cgroups else "")
        limits = self.limits.describe()
        if "--size" not in self.options:
            limits = limits.replace(f"a {binary_size(self.limits.tmp)} /tmp", "a private /tmp")
        return (f"bubblewrap {self.version}".rstrip() + ": each student's code in a sandbox "
                f"of its own, no network, no other processes, no files but Python's and its "
                f"own; {limits}{groups}")

    def command(self, argv: list[str], mounts: Mounts) -> list[str]:
        """``argv`` run in a new sandbox showing ``mounts``."""
        args = [self.bwrap, "--unshare-all", "--unshare-user"]
        if "--disable-userns" in self.options:
            args += ["--disable-userns"]
        args += ["--die-with-parent", "--new-session", "--cap-drop", "ALL",
                 "--hostname", "sandbox", "--proc", "/proc", "--dev", "/dev"]
        if "--size" in self.options:
            args += ["--size", str(self.limits.tmp)]
        args += ["--tmpfs", "/tmp", "--dir", SANDBOX_HOME]
        # /dev/shm bounded (or read-only, where bubblewrap cannot bound it), the rest of /dev
        # read-only: both are memory, which the address-space limit does not count
        if "--size" in self.options:
            args += ["--size", str(self.limits.tmp), "--tmpfs", "/dev/shm"]
        else:
            args += ["--tmpfs", "/dev/shm", "--remount-ro", "/dev/shm"]
        args += ["--remount-ro", "/dev"]
        for name in SYSTEM_DIRS:
            path = Path("/") / name
            if path.is_symlink():
                args += ["--symlink", os.readlink(path), str(path)]
            elif path.is_dir():
                args += ["--ro-bind", str(path), str(path)]
        for name in ETC_FILES:
            if (Path("/etc") / name).exists():
                args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        for path in self.python:
            args += ["--ro-bind", str(path), str(path)]
        for path in self.hidden:  # an empty folder over an installed copy of the solution
            args += ["--tmpfs", str(path), "--remount-ro", str(path)]
        for path in mounts.read_only:
            args += ["--ro-bind", str(Path(path).resolve()), str(path)]
        for path in mounts.writable:
            args += ["--bind", str(Path(path).resolve()), str(path)]
        # the root, bubblewrap's own tmpfs, unbounded: read-only once every mount is made
        args += ["--remount-ro", "/", "--clearenv"]
        for key, value in self.environment(mounts).items():
            args += ["--setenv", key, value]
        if mounts.cwd is not None:
            args += ["--chdir", str(mounts.cwd)]
        args += [self.prlimit, *self.limits.prlimit_args(), "--", _in_bound_folder(argv[0]),
                 *argv[1:]]
        if self.cgroups:
            return self.cgroups.enter(args)
        return args

    def environment(self, mounts: Mounts) -> dict[str, str]:
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": SANDBOX_HOME, "TMPDIR": "/tmp",
               "LANG": "C.UTF-8", "MPLCONFIGDIR": f"{SANDBOX_HOME}/.matplotlib",
               "IPYTHONDIR": f"{SANDBOX_HOME}/.ipython",
               "JUPYTER_RUNTIME_DIR": f"{SANDBOX_HOME}/.jupyter-runtime",
               "JUPYTER_PLATFORM_DIRS": "1"}
        env.update(mounts.env)
        return env

    def release(self, argv: list[str]) -> None:
        """After a run of :meth:`command`'s ``argv`` has ended: drop its control group."""
        if self.cgroups:
            self.cgroups.release(argv)

    def close(self) -> None:
        if self.cgroups:
            self.cgroups.close()


class _ControlGroups:
    """A control group per sandbox, under the grader's own, bounding memory and processes.

    Made only where this process may write the cgroup file system (root on most Linux
    machines, containers included); elsewhere :meth:`make` returns None and the limits of
    ``prlimit`` are what bounds a sandbox.
    """

    _counter = itertools.count()
    _instances = itertools.count()

    def __init__(self, parents: dict[str, Path], limits: SandboxLimits):
        self.parents, self.limits = parents, limits  # controller -> our folder under it
        self.live: dict[tuple[str, ...], dict[str, Path]] = {}  # command -> its group

    @classmethod
    def make(cls, limits: SandboxLimits) -> _ControlGroups | None:
        if os.name != "posix" or os.geteuid() != 0:
            return None
        parents = {}
        for controller in ("memory", "pids"):
            base = _own_cgroup(controller)
            if base is None:
                return None
            # one folder per sandbox object: closing one never removes another's groups
            folder = base / f"transformer-lab-grading-{os.getpid()}-{next(cls._instances)}"
            try:
                folder.mkdir(exist_ok=True)
            except OSError:
                return None
            parents[controller] = folder
        groups = cls(parents, limits)
        try:
            groups._remove(groups._new())
        except OSError:
            groups.close()
            return None
        return groups

    def _new(self) -> dict[str, Path]:
        k = next(self._counter)
        group = {controller: parent / f"sandbox-{k}" for controller, parent in self.parents.items()}
        for folder in group.values():
            folder.mkdir()
        mem, pids = group["memory"], group["pids"]
        if (mem / "memory.max").exists():  # cgroup v2
            (mem / "memory.max").write_text(str(self.limits.memory))
            if (mem / "memory.swap.max").exists():
                (mem / "memory.swap.max").write_text("0")
        else:
            (mem / "memory.limit_in_bytes").write_text(str(self.limits.memory))
        (pids / "pids.max").write_text(str(self.limits.processes))
        return group

    def enter(self, args: list[str]) -> list[str]:
        """``args`` started inside a new group: a shell writes its pid there, then execs."""
        group = self._new()
        procs = sorted({str(folder / "cgroup.procs") for folder in group.values()})
        script = "".join(f'echo $$ > "{p}" && ' for p in procs) + 'exec "$@"'
        argv = ["/bin/sh", "-c", script, "sandbox", *args]
        self.live[tuple(argv)] = group
        return argv

    def release(self, argv: list[str]) -> None:
        group = self.live.pop(tuple(argv), None)
        if group is not None:
            self._remove(group)

    def _remove(self, group: dict[str, Path]) -> None:
        for folder in group.values():
            _rmdir_when_empty(folder)

    def close(self) -> None:
        for parent in self.parents.values():
            for folder in sorted(parent.glob("sandbox-*")):
                _rmdir_when_empty(folder)
            _rmdir_when_empty(parent)


def kill_group(pgid: int | None, process) -> None:
    """Kill the process group ``pgid`` (never this process's own), or, where that cannot be
    done, ``process`` alone; either may be gone already."""
    own_group = os.getpgrp() if hasattr(os, "getpgrp") else None
    if pgid and pgid != own_group and hasattr(os, "killpg"):
        with contextlib.suppress(OSError):  # the group is gone already
            os.killpg(pgid, signal.SIGKILL)
            return
    if process is not None:
        with contextlib.suppress(Exception):  # already gone
            process.kill()


def _rmdir_when_empty(folder: Path) -> None:
    """Remove a control group once its processes have gone (they are being killed)."""
    for _ in range(50):
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            with contextlib.suppress(OSError):
                for pid in (folder / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        os.kill(int(pid), 9)
            time.sleep(0.02)


def _own_cgroup(controller: str) -> Path | None:
    """The folder of this process's control group for ``controller`` (v1 or v2), if writable."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            root = _mount_point(mounts, "cgroup", controller)
        elif hierarchy == "0" and controllers == "":
            root = _mount_point(mounts, "cgroup2", controller)
            if root is not None:
                enabled = (root / path.lstrip("/") / "cgroup.controllers")
                try:
                    if controller not in enabled.read_text().split():
                        continue
                except OSError:
                    continue
        else:
            continue
        if root is not None:
            folder = root / path.lstrip("/")
            if folder.is_dir() and os.access(folder, os.W_OK):
                return folder
    return None


def _mount_point(mounts: list[str], fstype: str, controller: str) -> Path | None:
    for line in mounts:
        left, _, right = line.partition(" - ")
        fields, extra = left.split(), right.split()
        if not extra or extra[0] != fstype:
            continue
        if fstype == "cgroup" and controller not in extra[-1].split(","):
            continue
        return Path(fields[4])
    return None


def _options(bwrap: str) -> frozenset[str]:
    """The options of this bubblewrap that the sandbox uses where they exist."""
    try:
        text = subprocess.run([bwrap, "--help"], capture_output=True, text=True,
                              timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(o for o in ("--disable-userns", "--size") if o in text.split())


def find_sandbox(limits: SandboxLimits | None = None) -> Bubblewrap:
    """The sandbox the grader runs students' code in; raises :class:`SandboxUnavailable` where
    bubblewrap is missing or cannot make a sandbox here (the message says why and what to do).
    """
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailable(f"the grader's sandbox, bubblewrap, runs on Linux only (this is "
                                 f"{sys.platform}); grade on Linux, or use --no-sandbox")
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(f"bubblewrap (bwrap) is not installed: {INSTALL_HINT}")
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        raise SandboxUnavailable("prlimit (package util-linux) is not installed; the sandbox "
                                 "needs it to set its limits")
    try:
        version = subprocess.run([bwrap, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout.split()[-1]
    except (OSError, subprocess.SubprocessError, IndexError):
        version = ""
    sandbox = Bubblewrap(bwrap, prlimit, limits, version)
    problem = _try(sandbox)
    if problem:
        sandbox.close()
        raise SandboxUnavailable(f"bubblewrap is installed but could not make a sandbox here: "
                                 f"{problem.rstrip('.')}. Unprivileged user namespaces may be "
                                 "turned off (sysctl kernel.unprivileged_userns_clone=1, or on "
                                 "Ubuntu 24.04 an AppArmor profile for bwrap), or this is a "
                                 "container that forbids them; grade elsewhere, or use "
                                 "--no-sandbox")
    return sandbox


def _try(sandbox: Bubblewrap) -> str:
    """Why ``sandbox`` cannot run this Python ('' when it can)."""
    with tempfile.TemporaryDirectory(prefix="sandbox-check-") as tmp:
        argv = sandbox.command([sys.executable, "-I", "-S", "-c", "print('ok')"],
                               Mounts(writable=(Path(tmp),), cwd=Path(tmp)))
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as err:
            return str(err)
        finally:
            sandbox.release(argv)
    if done.returncode == 0 and done.stdout.strip() == "ok":
        return ""
    return " ".join((done.stderr or done.stdout or f"exit status {done.returncode}").split())[:300]
