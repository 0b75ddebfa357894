"""Parsing and compiling code a student wrote, in the grader's own process, without letting it
end that process.

The grader reads every submission's syntax in its own process (the flags, the functions a core
module defines, the imports a notebook uses), where a crash costs every student's grades.
Python 3.10's parser has no guard against depth: one expression nested about 120,000 deep
(``1+1+...+1``, 240 kB on one line) overflows the C stack of a thread with the usual 8 MiB,
and the process dies of a segmentation fault. Python 3.11 and later raise RecursionError.

Here both end in :class:`Unparseable`, a SyntaxError, so that a caller's ``except SyntaxError``
covers them. On 3.10 the parser runs in a thread whose stack (:data:`STACK_BYTES` of address
space, used only as deep as a parse goes) holds the deepest expression of the longest source
that is parsed there (:data:`MAX_CHARS_310`); a longer source is not parsed on 3.10. Where no
thread with such a stack can start (a memory limit), the parser runs as it is.
"""

from __future__ import annotations

import ast
import sys
import threading
from collections.abc import Callable

#: The stack of the thread that parses on Python 3.10: 4 MB of ``1+1+...`` (two million
#: levels) parse in about 7 s there and need a good deal less than this.
STACK_BYTES = 512 << 20
#: The longest source parsed on Python 3.10 (characters); a core module is about 16 kB.
MAX_CHARS_310 = 4_000_000

_GUARDED = sys.version_info < (3, 11)
_LOCK = threading.Lock()  # threading.stack_size is the whole process's setting


class Unparseable(SyntaxError):
    """Code nested too deep (or, on Python 3.10, too long) for the grader to parse safely."""


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse(source, filename)``; raises SyntaxError (:class:`Unparseable` where the
    parser would overflow its stack) and never ends the process."""
    return _guarded(lambda: ast.parse(source, filename), source, filename)


def check_compiles(source: str, filename: str = "<unknown>") -> None:
    """``compile(source, filename, "exec")``, as :func:`parse` guards it: raises SyntaxError
    where it does not compile."""
    _guarded(lambda: compile(source, filename, "exec"), source, filename)


def _unparseable(why: str, filename: str) -> Unparseable:
    err = Unparseable(why)
    err.filename = filename
    return err


def _guarded(work: Callable[[], object], source: str, filename: str):
    if _GUARDED and len(source) > MAX_CHARS_310:
        raise _unparseable(f"{len(source):,} characters, more than the {MAX_CHARS_310:,} the "
                           "grader parses on Python 3.10", filename)
    result: dict[str, object] = {}

    def run() -> None:
        try:
            result["value"] = work()
        except BaseException as err:  # raised below, in the calling thread
            result["error"] = err

    thread = None
    if _GUARDED:
        with _LOCK:
            previous = threading.stack_size(STACK_BYTES)
            try:
                thread = threading.Thread(target=run, name="untrusted-parse")
                thread.start()
            except RuntimeError:  # no such stack here (a memory limit): the parser as it is
                thread = None
            finally:
                threading.stack_size(previous)
    if thread is None:
        run()
    else:
        thread.join()
    if "error" in result:
        err = result["error"]
        if isinstance(err, (RecursionError, MemoryError)):
            raise _unparseable(f"too deeply nested to parse ({err})", filename) from None
        raise err
    return result["value"]
