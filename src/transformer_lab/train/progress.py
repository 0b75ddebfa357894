"""Progress of a training run: a bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
import time


def progress_line(step: int, total: int, loss: float, lr: float, seconds: float,
                  scores: str = "") -> str:
    """A plain progress line of every trainer: the step, its loss and learning rate, the latest
    validation ``scores`` and the elapsed time."""
    text = f"step {step:>5}/{total}  loss {loss:.4f}  lr {lr:.2e}"
    return f"{text}  {scores}  {seconds:6.1f} s" if scores else f"{text}  {seconds:6.1f} s"


class Progress:
    """A ``\\r`` progress bar on a terminal; otherwise one plain line every ``log_every`` steps.

    A plain line holds the step, the loss and learning rate of that step, the latest validation
    scores (with the step they were measured at, when that was earlier) and the elapsed time.

    Args:
        total: number of steps.
        stream: where to write (default ``sys.stdout``; the command line passes
            ``sys.stderr``); mode "none": silent.
        mode: "auto" (bar if the stream is a terminal), "bar", "lines" or "none".
        log_every: steps between plain lines.

    For each step call :meth:`evaluated` first (if the step was evaluated), then
    :meth:`update`; at the end call :meth:`finish`, which writes the last step's line if the run
    stopped between two log steps.
    """

    WIDTH = 24

    def __init__(self, total: int, stream=None, mode: str = "auto", log_every: int = 100):
        if mode not in ("auto", "bar", "lines", "none"):
            raise ValueError(f'mode must be "auto", "bar", "lines" or "none", got {mode!r}')
        self.stream = sys.stdout if stream is None else stream
        if mode == "auto":
            isatty = getattr(self.stream, "isatty", None)
            mode = "bar" if isatty is not None and isatty() else "lines"
        self.mode, self.total, self.log_every = mode, total, max(1, log_every)
        self._last_draw = 0.0
        self._last_len = 0
        self._open_bar = False
        self._last_line = 0  # the step of the last plain line
        self._state = None  # (step, loss, lr, elapsed) of the last update
        self._val = None  # (step, exact, token) of the last evaluation
        self.val = ""

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def _line(self) -> None:
        step, loss, lr, elapsed = self._state
        scores = ""
        if self._val is not None:
            at, exact, token = self._val
            scores = f"val exact {exact:.4f} token {token:.4f}"
            if at != step:
                scores += f" (step {at})"
        self._write(progress_line(step, self.total, loss, lr, elapsed, scores) + "\n")
        self._last_line = step

    def update(self, step: int, loss: float, lr: float, elapsed: float) -> None:
        """After ``step`` steps (1-based)."""
        self._state = (step, loss, lr, elapsed)
        if self.mode == "bar":
            now = time.perf_counter()
            if now - self._last_draw < 0.1 and step < self.total:
                return
            self._last_draw = now
            filled = int(self.WIDTH * step / self.total)
            bar = "#" * filled + "." * (self.WIDTH - filled)
            rate = step / elapsed if elapsed > 0 else 0.0
            eta = (self.total - step) / rate if rate > 0 else 0.0
            text = (f"[{bar}] {step}/{self.total} loss {loss:.4f} lr {lr:.1e}{self.val} "
                    f"{elapsed:.0f}s<{eta:.0f}s {rate:.0f} it/s")
            self._write("\r" + text + " " * max(0, self._last_len - len(text)))
            self._last_len = len(text)
            self._open_bar = True
        elif self.mode == "lines" and (step % self.log_every == 0 or step == self.total):
            self._line()

    def evaluated(self, step: int, exact: float, token: float) -> None:
        """The validation scores after ``step`` steps (shown from then on)."""
        self.val = f" val {exact:.3f}"
        self._val = (step, exact, token)

    def finish(self) -> None:
        """The run ended: in lines mode, write the last step's line unless it was written."""
        if self.mode == "lines" and self._state is not None \
                and self._state[0] != self._last_line:
            self._line()
        self.close()

    def message(self, text: str) -> None:
        if self.mode == "none":
            return
        self.close()
        self._write(text + "\n")

    def close(self) -> None:
        if self._open_bar:
            self._write("\n")
            self._open_bar = False
