"""Running a notebook in a fresh kernel for the grader's feedback: time limits, bounded output
(:func:`run_notebook`). The points never come from here (see :mod:`.probe_driver`). Given a
sandbox (:mod:`.sandbox`), the kernel runs inside it (:class:`SandboxedKernelManager`); the
client that keeps the output runs here, out of its reach.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError

from transformer_lab.course.kernel_env import client_options
from transformer_lab.course.sandbox import (
    DISK_BYTES,
    Mounts,
    NoSandbox,
    binary_size,
    disk_bytes,
    kill_group,
)


@dataclass
class Run:
    """What happened when a notebook was executed."""

    later: str = ""  # said of the cells from the one that stopped the run on, which did not run
    status: str = "ran"  # or "kernel died", "kernel stopped", "time up", "could not run"
    interrupted: list[str] = field(default_factory=list)  # cells stopped at the time limit


@dataclass(frozen=True)
class OutputLimits:
    """How much of a submission's output grading keeps, in bytes (UTF-8 text, JSON for rich
    output). Whatever is over a limit is dropped as it arrives -- the grader's memory stays
    bounded however much a cell prints -- and the cell gets a note saying how much. Error
    outputs, which decide the checks, are always kept, their text shortened to ``error_text``.
    """

    printed_per_cell: int = 100_000  # stdout and stderr together
    rich_per_cell: int = 5_000_000  # figures, HTML, results of expressions
    per_notebook: int = 20_000_000  # everything kept in the notebook
    error_text: int = 20_000  # the message, and the traceback as a whole
    per_output: int = 100  # charged for every output kept, however short its text


_OUTPUT_MESSAGES = {"stream", "display_data", "execute_result", "update_display_data", "error"}


def _nbytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _head(text: str, limit: int) -> str:
    """The longest start of ``text`` whose UTF-8 encoding fits in ``limit`` bytes."""
    if len(text) * 4 <= limit:
        return text
    return text.encode("utf-8", "surrogatepass")[:max(limit, 0)].decode("utf-8", "ignore")


def format_size(nbytes: int) -> str:
    for unit, size in (("MB", 1e6), ("KB", 1e3)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes} bytes"


class TimeUp(Exception):
    """The notebook's time in all was spent before cell ``index`` could start."""

    def __init__(self, index: int):
        super().__init__(index)
        self.index = index


class LimitedClient(NotebookClient):
    """An nbclient ``NotebookClient`` that keeps at most :class:`OutputLimits` of the output:
    it sees every output message before nbclient appends it (``process_message``), and adds the
    note to a cell that lost output (``async_execute_cell``, also when the kernel dies), or
    that it interrupted at the time limit (whose output is a bare KeyboardInterrupt)."""

    def __init__(self, nb, limits: OutputLimits | None = None, sandbox=None,
                 mounts: Mounts | None = None, **kw):
        super().__init__(nb, **kw)
        self.limits = limits or OutputLimits()
        self.sandbox, self.mounts = sandbox, mounts
        self.sandboxed_km: SandboxedKernelManager | None = None
        self.notebook_bytes = 0  # kept so far in the notebook
        self.total: float | None = None  # seconds the cells may run in all
        self.deadline: float | None = None  # then: the time after which no cell starts
        self.interrupted: list[str] = []  # the ids of the cells interrupted at the time limit
        self._start_cell(None)

    def create_kernel_manager(self):
        if self.sandbox is None or not self.sandbox.isolated:
            return super().create_kernel_manager()
        self.km = self.sandboxed_km = SandboxedKernelManager(
            kernel_name=self.kernel_name, config=self.config, sandbox=self.sandbox,
            mounts=self.mounts)
        return self.km

    def _start_cell(self, cell_index: int | None) -> None:
        self.cell_index = cell_index
        self.cell_printed = self.cell_rich = self.cell_dropped = 0  # bytes kept, dropped
        self.cell_interrupted = False

    async def _async_handle_timeout(self, timeout, cell=None):
        self.cell_interrupted = True
        return await super()._async_handle_timeout(timeout, cell)

    async def async_execute_cell(self, cell, cell_index, execution_count=None,
                                 store_history=True):
        if self.total is not None:  # counted from the first cell: not the kernel's start
            now = time.perf_counter()
            self.deadline = self.deadline or now + self.total
            if now > self.deadline:
                raise TimeUp(cell_index)
        self._start_cell(cell_index)
        try:
            return await super().async_execute_cell(cell, cell_index, execution_count,
                                                    store_history)
        finally:
            if self.cell_dropped:
                self._add_note(cell)
            if self.cell_interrupted:
                self.interrupted.append(cell.get("id") or f"cell {cell_index + 1}")
                cell.outputs.append(nbformat.v4.new_output("stream", name="stderr", text=(
                    f"[interrupted: this cell ran past the time limit of {self.timeout} s "
                    "per cell]\n")))

    def process_message(self, msg, cell, cell_index):
        if msg.get("msg_type") in _OUTPUT_MESSAGES:
            if cell_index != self.cell_index:
                self._start_cell(cell_index)
            msg = self._admit(msg)
            if msg is None:
                return None
        return super().process_message(msg, cell, cell_index)

    def _admit(self, msg):
        """``msg`` as it may be kept (text shortened), or None to drop it."""
        kind, content, limits = msg["msg_type"], msg["content"], self.limits
        if kind == "error":  # always kept: judge() reads it
            content = {**content, "ename": _head(str(content.get("ename", "")), 200),
                       "evalue": _head(str(content.get("evalue", "")), limits.error_text),
                       "traceback": self._short_traceback(content.get("traceback") or [])}
            self.notebook_bytes += limits.per_output + _nbytes(json.dumps(content))
            return {**msg, "content": content}
        notebook_room = limits.per_notebook - self.notebook_bytes - limits.per_output
        if kind == "stream":
            text = str(content.get("text", ""))
            size = _nbytes(text)
            room = min(limits.printed_per_cell - self.cell_printed - limits.per_output,
                       notebook_room)
            if size > room:
                kept = _head(text, room) if room > 0 else ""
                self.cell_dropped += size - _nbytes(kept)
                if not kept:
                    return None
                size, content = _nbytes(kept), {**content, "text": kept}
            self.cell_printed += limits.per_output + size
        else:
            size = _nbytes(json.dumps(content.get("data", {}), default=str))
            if size > min(limits.rich_per_cell - self.cell_rich - limits.per_output,
                          notebook_room):
                self.cell_dropped += size
                return None
            self.cell_rich += limits.per_output + size
        self.notebook_bytes += limits.per_output + size
        return {**msg, "content": content}

    def _short_traceback(self, lines: list) -> list[str]:
        kept, room = [], self.limits.error_text
        for line in map(str, lines):
            if _nbytes(line) > room:
                kept.append(_head(line, room) + "\n[traceback truncated]")
                break
            kept.append(line)
            room -= _nbytes(line)
        return kept

    def _add_note(self, cell) -> None:
        limits = self.limits
        note = nbformat.v4.new_output("stream", name="stderr", text=(
            f"[output truncated: {format_size(self.cell_dropped)} of this cell's output not "
            f"kept; grading keeps {format_size(limits.printed_per_cell)} of printed text and "
            f"{format_size(limits.rich_per_cell)} of figures and other output per cell, "
            f"{format_size(limits.per_notebook)} per notebook]\n"))
        streams = [k for k, o in enumerate(cell.outputs) if o.get("output_type") == "stream"]
        cell.outputs.insert(streams[-1] + 1 if streams else len(cell.outputs), note)


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager whose kernel runs in a sandbox (:mod:`.sandbox`).

    The sandbox has no network, so the kernel talks to this process over Unix sockets in a
    folder both see (ZeroMQ's ``ipc`` transport); it is interrupted by a message on its control
    channel, as a signal to the sandbox would not reach it. ``mounts`` says what else the
    kernel sees; its connection folder is added to it, writable.
    """

    def __init__(self, sandbox, mounts: Mounts, **kw):
        self._sandbox, self._mounts = sandbox, mounts
        self._folder = tempfile.TemporaryDirectory(prefix="grading-kernel-",
                                                   ignore_cleanup_errors=True)
        folder = Path(self._folder.name)
        kw.setdefault("transport", "ipc")
        kw.setdefault("connection_file", str(folder / "kernel.json"))
        kw.setdefault("ip", str(folder / "ipc"))
        super().__init__(**kw)
        self._commands: list[list[str]] = []

    @property
    def kernel_spec(self):
        spec = super().kernel_spec
        if spec is not None:
            spec.interrupt_mode = "message"
        return spec

    def format_kernel_cmd(self, extra_arguments=None):
        argv = super().format_kernel_cmd(extra_arguments)
        folder = Path(self._folder.name)
        # JPY_PARENT_PID=1: the kernel does not watch its parent (in the sandbox, bubblewrap's
        # init, pid 1, is its parent) and prints no banner
        mounts = Mounts(read_only=self._mounts.read_only,
                        writable=(*self._mounts.writable, folder), cwd=self._mounts.cwd,
                        env=(*self._mounts.env, ("JPY_PARENT_PID", "1")))
        command = self._sandbox.command(argv, mounts)
        self._commands.append(command)
        return command

    def release(self) -> None:
        """After the kernel has ended: free what its sandboxes held."""
        for command in self._commands:
            self._sandbox.release(command)
        self._commands = []
        self._folder.cleanup()


class _Watchdog:
    """Stops the kernel when a cell outlives its time limit by ``grace`` seconds or its
    ``folders`` come to hold more than DISK_BYTES, and stops what the kernel left running when
    the notebook is done.

    nbclient interrupts a cell at the time limit; code that ignores the interrupt (a C loop, a
    SIGINT handler) would otherwise keep the grader waiting for ever. Processes the student's
    code started (``subprocess``, ``multiprocessing``) share the kernel's process group and
    would outlive a kernel that crashed or was stopped: on leaving the ``with`` block the whole
    group is killed (on systems with process groups).
    """

    def __init__(self, limit: float):
        self.limit = limit
        self.folders: tuple[Path, ...] = ()
        self.killed_cell: int | None = None
        self.over_disk = False  # the kernel was stopped for the files it wrote
        self._process = None  # the kernel's process, and its process group
        self._pgid: int | None = None
        self._running: tuple[int, float] | None = None  # (cell index, start), set in one step
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def cell_started(self, client, cell_index: int) -> None:
        provisioner = getattr(client.km, "provisioner", None)
        self._process = getattr(provisioner, "process", None) or self._process
        self._pgid = getattr(provisioner, "pgid", None) or self._pgid
        self._running = (cell_index, time.monotonic())

    def cell_finished(self) -> None:
        self._running = None

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()
        kill_group(self._pgid, self._process)  # whatever is left of the kernel's group

    def _watch(self) -> None:
        ticks = 0
        while not self._done.wait(0.2):
            running, ticks = self._running, ticks + 1
            if running is None:
                continue
            over_time = time.monotonic() - running[1] > self.limit
            pid = getattr(self._process, "pid", None)
            self.over_disk = not over_time and ticks % 2 == 0 and \
                disk_bytes(self.folders, DISK_BYTES, pid) > DISK_BYTES
            if over_time or self.over_disk:
                self.killed_cell = running[0]
                kill_group(self._pgid, self._process)
                return


_QUIET_LOG = logging.getLogger("transformer_lab.course.kernel_run.nbclient")
_QUIET_LOG.setLevel(logging.CRITICAL)  # timeouts and dead kernels are reported per submission


def run_notebook(nb, timeout: int, env: dict[str, str] | None = None, sandbox=None,
                 read_only: tuple[Path, ...] = (), total: float | None = None) -> Run:
    """Execute ``nb`` in place in a fresh kernel; errors in cells are kept as outputs.

    A cell over ``timeout`` seconds is interrupted and execution goes on; one still running
    ``grace`` seconds later gets its kernel stopped (the time limit again, at least 5 s -- a
    kernel that was flooding its output needs a moment to answer, more on a busy machine --
    and at most 10 s). Output over :class:`OutputLimits` is not kept. ``env``: the kernel's
    environment (default: this process's). The kernel starts in an empty temporary folder.
    ``sandbox`` (see :mod:`.sandbox`): the kernel runs in it, seeing ``read_only`` and its folder
    besides Python, with ``env`` alone as its environment. Never raises: see the returned
    :class:`Run`. ``total``: seconds the cells may run in all; no cell starts after them.
    """
    sandbox = sandbox or NoSandbox()
    grace = min(max(timeout, 5), 10)
    watchdog = _Watchdog(timeout + grace)
    run, current = Run(), {"index": None}
    # A student's code may leave files behind it cannot delete: that must not cost the grade.
    workdirs = tempfile.TemporaryDirectory(prefix="grading-", ignore_cleanup_errors=True)
    with workdirs as workdir, watchdog:  # the watchdog's exit kills leftovers, then cleanup
        watchdog.folders = (Path(workdir),)
        mounts = Mounts(read_only=tuple(read_only), writable=(Path(workdir),),
                        cwd=Path(workdir), env=tuple((env or {}).items()))
        client = LimitedClient(
            nb, sandbox=sandbox, mounts=mounts, timeout=timeout, allow_errors=True,
            interrupt_on_timeout=True, log=_QUIET_LOG, **client_options(workdir))
        client.on_cell_start = lambda cell, cell_index: current.update(index=cell_index)
        client.on_cell_execute = lambda cell, cell_index: watchdog.cell_started(client,
                                                                                  cell_index)
        client.on_cell_executed = lambda **_: watchdog.cell_finished()
        client.total = total
        try:
            if sandbox.isolated:  # the kernel's environment is the sandbox's, from mounts --
                # bubblewrap itself too (its init's /proc/1/environ is readable inside); what
                # the kernel writes to its own stdout and stderr (not the notebook's) is dropped
                client.execute(env=sandbox.environment(mounts), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
            else:
                client.execute(**({"env": env} if env is not None else {}))
        except DeadKernelError:
            _stopped(run, nb, current["index"], timeout,
                     stopped_by_us=watchdog.killed_cell is not None, disk=watchdog.over_disk)
        except TimeUp as up:
            run.status = "time up"
            run.later = (f"the cells had run their {total:g} s in all before cell "
                         f"{up.index + 1}, which did not run, nor the ones after it")
        except Exception as exc:  # e.g. the kernel could not start
            run.status = "could not run"
            run.later = f"not run: {one_line(str(exc)) or type(exc).__name__}"
        finally:
            if client.sandboxed_km is not None:
                client.sandboxed_km.release()
    run.interrupted = client.interrupted
    return run


def _stopped(run: Run, nb, index: int | None, timeout: int, stopped_by_us: bool,
             disk: bool = False) -> None:
    """Record in ``run`` that the kernel died, or was stopped (``disk``: for the files it
    wrote), while running cell ``index``."""
    where = "before the first cell" if index is None else \
        f"while running cell {index + 1} (id {nb.cells[index].get('id')!r})"
    if stopped_by_us and disk:
        run.status = "kernel stopped"
        run.later = (f"not run: the kernel was stopped {where}, over the files' limit "
                     f"({binary_size(DISK_BYTES)})")
    elif stopped_by_us:
        run.status = "kernel stopped"
        run.later = (f"not run: the kernel was stopped {where}, which ran past the time limit "
                     f"of {timeout} s and ignored the interrupt")
    else:
        run.status = "kernel died"
        run.later = f"not run: the kernel died {where}"


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def one_line(text: str, limit: int = 200) -> str:
    """``text`` without ANSI colours, on one line, at most ``limit`` characters."""
    text = " ".join(_ANSI.sub("", text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
