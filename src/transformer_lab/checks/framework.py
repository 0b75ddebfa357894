"""What every exercise check is made of: cases, a run, an expected answer, a judgement.

A check is a subclass of :class:`Check`, registered under the id of the notebook cell that calls
it (``check-softmax-forward``). It splits testing into three parts, so that the grader can run
them in different processes:

- :meth:`Check.cases` (and :meth:`Check.hidden_cases`) make the inputs: :class:`Case` objects
  holding plain data only (arrays, numbers, strings, None, and lists, tuples and dicts of them).
- :meth:`Check.run` calls the student's functions on one case and returns plain data. It runs
  where the student's code lives: in the notebook's kernel, or in the grader's probe process.
- :meth:`Check.expected` computes the right answer without the student's code (with PyTorch,
  autograd or an independent reference); :func:`judge` compares, in the process that decides.

A notebook's check cell is one call of :func:`check`.
"""

from __future__ import annotations

import ast
import copy
import dis
import hashlib
import importlib
import inspect
import linecache
import math
import re
import sys
import sysconfig
import textwrap
import traceback
import types
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import reduce, wraps
from itertools import takewhile
from operator import getitem
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from transformer_lab import syllabus
from transformer_lab.gradient_check import rel_error
from transformer_lab.models.checkpoints import read_archive, write_archive

#: The folder of stored expected answers (written into the handout by ``make student`` for
#: checks whose reference implementation is hidden from students).
DATA_DIR = Path(__file__).resolve().parent / "data"

# --------------------------------------------------------------------------------------------
# Cases and checks


@dataclass
class Case:
    """One set of inputs. ``args``/``kwargs`` hold plain data only (see the module docstring)."""

    name: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


class CheckFailed(AssertionError):
    """A check found a wrong answer; the message says which case and how it differs."""

    def _render_traceback_(self) -> list[str]:
        """What IPython shows for it: the message alone, without the checks' own frames (it
        names the file and line where the student's code raised, when it did)."""
        return f"CheckFailed: {self}".splitlines()


class Check:
    """Base class of the course's checks. Subclasses set the class attributes and methods.

    Attributes:
        id: the id of the check cell, ``check-<something>``.
        notebook: the notebook it belongs to, ``NN_topic``; by default the name of the module
            that holds the check, ``nbNN_topic.py`` (see :func:`register`).
        functions: names of the core functions under test (found through
            :mod:`transformer_lab.syllabus`); ``run`` reads them as ``f.<name>``.
        arguments: names of the notebook functions the check cell passes to :func:`check`,
            in order; ``run`` reads them as ``f.<name>`` too.
        tol: largest relative error accepted, by dtype of the expected array (see
            :meth:`tolerance`).
        axes: the names of an output's axes, as its docstring writes them, for the messages
            (``[b=1, h=0, t=2, s=0]`` rather than ``[1, 0, 2, 0]``): output key (``"dquery"``;
            ``"output"`` for a whole output that is one array) -> one letter per axis, counted
            from the right (``"bhts"`` names the last four axes; an array with fewer axes takes
            the last letters, ``"ts"`` for a (T, S) array).
        loop_free: function -> what to write instead of a loop, for the notebook functions
            whose text asks for no Python loop: a case whose answer is right fails while the
            function's own code runs one (:func:`python_loops`; the grader reads it from the
            submitted source instead, what the student's process says cannot be trusted).
        stepwise: the functions of ``loop_free`` that decode step by step: their loop over
            the steps is allowed, the loops inside it are not (:func:`def_loops`).
        reaches: core functions that the cases run through the package rather than through
            the functions' own code (an optimiser's class, a model's loss), which a failure
            names when their own check fails too (:func:`depends_on`).
    """

    id: ClassVar[str] = ""
    notebook: ClassVar[str] = ""
    functions: ClassVar[tuple[str, ...]] = ()
    arguments: ClassVar[tuple[str, ...]] = ()
    tol: ClassVar[Mapping[str, float]] = {"float64": 1e-9, "float32": 2e-5, "float16": 2e-3}
    axes: ClassVar[Mapping[str, str]] = {}
    loop_free: ClassVar[Mapping[str, str]] = {}
    stepwise: ClassVar[tuple[str, ...]] = ()
    reaches: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **attributes):
        """``class Softmax(Check, id="check-softmax-forward", functions=(...)):`` sets those
        class attributes; a class given an ``id`` is registered (:func:`register`)."""
        super().__init_subclass__()
        for name, value in attributes.items():
            if name not in Check.__annotations__:
                raise TypeError(f"{cls.__name__}: a check has no attribute {name!r}")
            setattr(cls, name, value)
        if "id" in attributes:
            register(cls)

    def cases(self, rng: np.random.Generator) -> Iterable[Case]:
        """The cases a student sees run in the notebook."""
        raise NotImplementedError

    def hidden_cases(self, rng: np.random.Generator) -> Iterable[Case]:
        """Further cases, for grading only (the handout does not contain them)."""
        return ()

    def run(self, f, *args, **kwargs) -> Any:
        """Call the student's functions (``f.<name>``) on one case; return plain data. By
        default: the one function under test called on the case's arguments, its answer as it
        comes back."""
        names = (*self.functions, *self.arguments)
        if len(names) != 1:
            raise TypeError(f"{self.id} tests {len(names)} functions: it needs its own run")
        return getattr(f, names[0])(*args, **kwargs)

    def expected(self, *args, **kwargs) -> Any:
        """The right answer for one case, computed without the student's code."""
        raise NotImplementedError

    def mistakes(self, *args, **kwargs) -> Mapping[str, Callable[[], Any]]:
        """Common wrong answers for one case: description -> a function computing it (or a list
        of such pairs, where a description may come twice). When a wrong answer matches one of
        them, the failure message names the mistake."""
        return {}

    def tolerance(self, name: str, expected: np.ndarray) -> float:
        """The largest relative error accepted for the output ``name``."""
        return self.tol.get(expected.dtype.name, 1e-9)

    def axis_names(self, name: str, ndim: int) -> tuple[str, ...]:
        """The names of the axes of the output ``name`` (``"output['dquery']"``) with ``ndim``
        axes, from :attr:`axes` ('' for an axis without a name)."""
        keys = re.findall(r"\[['\"]?([^'\"\]]+)['\"]?\]", name)
        letters = self.axes.get(keys[-1] if keys else "output", "")
        letters = letters[-ndim:] if ndim else ""
        return ("",) * (ndim - len(letters)) + tuple(letters)

    @classmethod
    def has_reference(cls) -> bool:
        """Whether :meth:`expected` is available here (the handout strips hidden references)."""
        return cls.expected is not Check.expected


#: check id -> its class, filled by :func:`register` when the check modules are imported.
REGISTRY: dict[str, type[Check]] = {}


def register(cls: type[Check]) -> type[Check]:
    """Add a check to :data:`REGISTRY` under its id (a class given ``id=`` is added when it is
    defined). A check that does not set its ``notebook`` belongs to its module's: ``07_blocks``
    for one in ``nb07_blocks.py``."""
    module = cls.__module__.rpartition(".")[2]
    if "notebook" not in vars(cls) and re.fullmatch(r"nb\d\d_\w+", module):
        cls.notebook = module[2:]
    if not cls.id.startswith("check-") or not cls.notebook:
        raise ValueError(f"{cls.__name__}: a check needs an id 'check-...' and a notebook")
    old = REGISTRY.get(cls.id)
    if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"two checks have the id {cls.id!r}: {old.__module__}.{old.__qualname__} "
                         f"and {cls.__module__}.{cls.__qualname__}")
    REGISTRY[cls.id] = cls
    return cls


def load_checks() -> dict[str, type[Check]]:
    """Import every check module of this package (``nbNN_topic.py``); return the registry."""
    for path in sorted(Path(__file__).resolve().parent.glob("nb*.py")):
        importlib.import_module(f"transformer_lab.checks.{path.stem}")
    return REGISTRY


def get_check(check_id: str) -> Check:
    """A new instance of the check registered as ``check_id``."""
    load_checks()
    if check_id not in REGISTRY:
        raise KeyError(f"no check is registered as {check_id!r}")
    return REGISTRY[check_id]()


def case_rng(check_id: str, salt: str = "notebook") -> np.random.Generator:
    """The generator a check's cases are drawn from: fixed by the check's id and ``salt``
    (the notebook and the grader use different salts, so the grader's inputs differ)."""
    digest = hashlib.sha256(f"{salt}:{check_id}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def later_rng(rng: np.random.Generator) -> np.random.Generator:
    """A generator for cases appended to a check after others: drawn from ``rng``'s seed (so
    from the check's id and salt), it leaves ``rng``'s own stream, and so the inputs of every
    case drawn from it, as they were. Each call gives the next one of a fixed sequence."""
    return np.random.default_rng(rng.bit_generator.seed_seq.spawn(1)[0])


def normals(rng: np.random.Generator, *shapes, dtype=np.float64, scale=1.0) -> tuple:
    """Arrays of ``shapes`` drawn in turn from ``rng``'s standard normal, times ``scale``, as
    ``dtype``: the inputs of most cases (``Case("x and dout", normals(rng, (3, 4), (3, 4)))``)."""
    return tuple((rng.standard_normal(shape) * scale).astype(dtype) for shape in shapes)


def all_cases(check: Check, salt: str = "notebook", hidden: bool = True) -> list[Case]:
    """The check's cases, public first, then (with ``hidden``) the hidden ones."""
    rng = case_rng(check.id, salt)
    cases = list(check.cases(rng))
    if hidden:
        cases += list(check.hidden_cases(rng))
    names = [c.name for c in cases]
    if len(set(names)) != len(names):
        raise ValueError(f"{check.id}: two cases have the same name in {names}")
    return cases


# --------------------------------------------------------------------------------------------
# The functions a run sees


class Functions:
    """``f`` of :meth:`Check.run`: ``f.name`` is the function under test of that name."""

    def __init__(self, check_id: str, functions: Mapping[str, Callable]):
        self._check_id = check_id
        self._functions = dict(functions)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._functions[name]
        except KeyError:
            raise AttributeError(f"{self._check_id} has no function {name!r}") from None


def core_function(name: str) -> Callable:
    """The core function ``name`` as the package holds it now (the student's version)."""
    module, _ = syllabus.where_taught(name)
    return getattr(importlib.import_module(f"transformer_lab.core.{module}"), name)


def functions_for(check: Check, given: tuple = (), named: Mapping | None = None) -> Functions:
    """The namespace for :meth:`Check.run`: the check's core functions, live from the package,
    and the notebook functions passed in (``given`` in the order of ``check.arguments``)."""
    named = dict(named or {})
    if len(given) > len(check.arguments):
        raise TypeError(f"{check.id} takes {len(check.arguments)} function(s) "
                        f"({', '.join(check.arguments) or 'none'}), got {len(given)}")
    named.update(zip(check.arguments, given, strict=False))
    missing = [n for n in check.arguments if n not in named]
    if missing:
        raise TypeError(f"{check.id} needs your function(s) {', '.join(missing)}: "
                        f"call check({check.id!r}, {', '.join(check.arguments)})")
    for name, fn in named.items():
        if not callable(fn):
            raise TypeError(f"{check.id}: {name} must be a function, got {type(fn).__name__}")
    wrap = {"_forward": _cache_read_only, "_backward": _cache_kept}
    core = {n: wrap.get(n[n.rfind("_"):], lambda fn: fn)(core_function(n))
            for n in check.functions}
    return Functions(check.id, {**core, **named})


def _cache_read_only(forward: Callable) -> Callable:
    """``forward``, the cache it returns made read-only where it is its own arrays (not its
    inputs, nor views of them): a backward pass that writes into its cache -- which a second
    backward on the same cache, or a caller holding the attention weights, would see changed --
    raises there (see :data:`READ_ONLY_HINT`). Raises :class:`NotAPair` where it returns
    anything but a pair (a check indexing an array ``out`` with ``[0]`` would report a shape)."""
    @wraps(forward)
    def wrapped(*args, **kwargs):
        result = forward(*args, **kwargs)
        if not (isinstance(result, tuple) and len(result) == 2):
            what = (f"an array of shape {result.shape}" if isinstance(result, np.ndarray) else
                    f"a tuple of {len(result)}" if isinstance(result, tuple) else
                    type(result).__name__)
            raise NotAPair(f"{forward.__name__} returned {what}, not the pair (out, cache) of "
                           f"a forward pass{_unpaired_returns(forward)}")
        inputs = list(_arrays((args, kwargs)))
        for a in _arrays(result[1]):
            if not any(np.may_share_memory(a, i) for i in inputs):
                a.flags.writeable = False
                _CACHED.append((a, _fingerprint(a)))  # what run_case compares after the run
        return result
    return wrapped


def _cache_kept(backward: Callable) -> Callable:
    """``backward``, raising :class:`CacheChanged` where it wrote into the arrays of its cache
    that the read-only rule leaves writable (the forward's inputs: RoPE's tables, a layer's
    weights), which the next layer or step reads again."""
    names = list(inspect.signature(backward).parameters)[1:]  # after dout: the cache, ...

    @wraps(backward)
    def wrapped(dout, *args, **kwargs):
        given = {**dict(zip(names, args, strict=False)), **kwargs}
        before = {name: [(a, _fingerprint(a)) for a in _arrays(value) if a.flags.writeable]
                  for name, value in given.items() if name != "out"}  # out: to be written
        result = backward(dout, *args, **kwargs)
        for name, arrays in before.items():
            if any(_fingerprint(a) != was for a, was in arrays):
                if name == names[0]:  # the cache, whatever the code calls it
                    raise CacheChanged(f"{backward.__name__} changed an array of its cache (an "
                                       f"input its forward pass was given and cached)")
                raise ArgumentChanged(f"{backward.__name__} changed its argument {name}, which "
                                      f"the caller still holds: compute into a new array")
        return result
    return wrapped


class NotAPair(Exception):
    """A forward pass returned something else than ``(out, cache)``."""


def _unpaired_returns(forward: Callable) -> str:
    """": every return must give it; the return at line N does not" for the ``return``
    statements of ``forward`` that give no pair (read from its source), or ''."""
    forward = inspect.unwrap(forward)
    node = _source_def(forward)
    if node is None:
        return ""
    bad = [n.lineno + forward.__code__.co_firstlineno - 1 for n in ast.walk(node)
           if isinstance(n, ast.Return) and not (isinstance(n.value, ast.Tuple)
                                                 and len(n.value.elts) == 2)]
    return "" if not bad else (f": every return must give it, and the return at line "
                               f"{', '.join(map(str, bad))} does not")


class CacheChanged(Exception):
    """A backward pass wrote into its cache."""


class ArgumentChanged(Exception):
    """A backward pass wrote into an argument other than its cache and ``out``."""


def _fingerprint(a: np.ndarray) -> bytes:
    """What tells whether ``a`` changed: a digest of its bytes, read without copying ``a`` (so
    that a check that measures memory, notebook 16's, measures no copy of it)."""
    digest = hashlib.blake2b()
    for block in _blocks(a):
        digest.update(block)
    return digest.digest()


def _blocks(a: np.ndarray) -> Iterator[np.ndarray]:
    """``a``'s elements as contiguous arrays: itself, or its rows (copied one at a time)."""
    if a.flags.c_contiguous:
        yield a
    elif a.ndim <= 1:
        yield a.copy()
    else:
        for row in a:
            yield from _blocks(row)


#: The arrays the forward passes of the running case cached, each with its fingerprint:
#: ufunc.at (np.add.at) writes into a read-only array, and the flag can be set back.
_CACHED: list[tuple[np.ndarray, object]] = []
#: The error of a case whose run changed a cached array without raising.
CACHE_CHANGED = ("CacheChanged: an array a forward pass cached changed during the run, without "
                 "an error (np.add.at writes even into a read-only array)")


def _arrays(obj) -> Iterator[np.ndarray]:
    """The NumPy arrays in ``obj``, through its tuples, lists and dicts."""
    if isinstance(obj, np.ndarray):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _arrays(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _arrays(x)


def python_loops(function: Callable, steps: bool = False) -> str:
    """"none", or where ``function``'s own code runs a Python loop that a longer sequence or a
    larger batch runs more often ("a loop at line 7", :func:`def_loops`) -- for the exercises
    whose text asks for broadcasting instead. Read from its source (as the grader reads the
    submitted one), or, where there is none, from the compiled code, where every loop counts
    (with ``steps``, where the loop over the steps cannot be told apart: none does)."""
    function = inspect.unwrap(function)  # not the checks' wrapper of a core backward pass
    node = _source_def(function)
    if node is not None:
        code = function.__code__
        try:  # the file or the notebook cell the def is in, as inspect read the def
            constants = module_constants(ast.parse("".join(
                linecache.getlines(code.co_filename, function.__globals__))))
        except (SyntaxError, ValueError):
            constants = frozenset()
        return def_loops(node, code.co_firstlineno, steps, constants)
    if steps:
        return "none"
    jumps = set(dis.hasjrel) | set(dis.hasjabs)
    lines: list[int] = []
    for code in _code_objects(function):
        for ins in dis.get_instructions(code):
            backward = (ins.opcode in jumps and isinstance(ins.argval, int)
                        and ins.argval <= ins.offset)
            if ins.opname == "FOR_ITER" or backward:
                line = getattr(getattr(ins, "positions", None), "lineno", None)
                lines.append(line if line is not None else code.co_firstlineno)
    return (f"a loop at line {min(lines)}, read from the compiled code: without the def's source "
            "(run by exec, or in a %%time cell) every loop counts, a fixed few too"
            if lines else "none")


def _source_def(function: Callable) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The def of ``function`` parsed from its source (its lines then count from the def's
    ``co_firstlineno``), or None where there is no such source."""
    try:
        node = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return None
    return node if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else None


def module_constants(tree: ast.Module) -> frozenset[str]:
    """The names that a module's (or a notebook cell's) top level binds once, each to a fixed
    few things (``HEADS = ("W_q", "W_k", "W_v")``), and that nothing in it rebinds (``global``)
    or changes (``HEADS.append``, ``HEADS[:] = ...``): a loop over one runs a fixed number of
    times."""
    return _fixed_names(tree, scope=True)


def _bindings(node: ast.AST, scope: bool = False) -> list[tuple[str, ast.AST]]:
    """(name, the node binding it) for each binding in ``node``, in source order and in every
    form: assignments and ``del``, loop and comprehension targets, parameters, imports (``from
    m import *`` names none), ``except ... as``, ``with ... as``, ``match`` captures, defs and
    classes. ``scope``: only those of ``node``'s own scope -- not those inside its defs,
    classes and lambdas, nor a comprehension's targets (a ``:=`` in one binds here)."""
    found: list[tuple[str, ast.AST]] = []
    todo = list(ast.iter_child_nodes(node))[::-1]
    while todo:
        n = todo.pop()
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store | ast.Del):
            found.append((n.id, n))
        elif isinstance(n, ast.arg):
            found.append((n.arg, n))
        elif isinstance(n, ast.alias):
            found += [((n.asname or n.name).split(".")[0], n)] if n.name != "*" else []
        elif isinstance(n, ast.MatchMapping) and n.rest:
            found.append((n.rest, n))
        elif getattr(n, "name", None) and isinstance(n, ast.ExceptHandler | ast.MatchAs |
                                                     ast.MatchStar | ast.FunctionDef |
                                                     ast.AsyncFunctionDef | ast.ClassDef):
            found.append((n.name, n))
        if scope and isinstance(n, ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
            found += [(w.target.id, w.target) for w in ast.walk(n) if isinstance(w, ast.NamedExpr)]
        elif not (scope and isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda |
                                       ast.ClassDef)):
            todo += list(ast.iter_child_nodes(n))[::-1]
    return found


def _changed_names(node: ast.AST) -> set[str]:
    """The names that ``node`` rebinds through ``global`` or whose value it changes in place
    (``names.append(...)``, ``names[:] = ...``, ``names.x = ...``)."""
    return {name for n in ast.walk(node) if isinstance(n, ast.Global) for name in n.names} | {
        n.func.value.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(
            n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) and n.func.attr in (
            "append", "extend", "insert", "update", "setdefault", "add", "__iadd__",
            "__ior__", "symmetric_difference_update")} | {
        n.value.id for n in ast.walk(node) if isinstance(n, ast.Subscript | ast.Attribute)
        and isinstance(n.ctx, ast.Store | ast.Del) and isinstance(n.value, ast.Name)}


def def_loops(node: ast.FunctionDef | ast.AsyncFunctionDef, first_line: int = 1,
              steps: bool = False, constants: frozenset[str] = frozenset()) -> str:
    """"none", or "a loop at line N" for the first Python loop in the body of the def ``node``
    (functions it defines inside, and its default values, included): a ``while``, a call of
    ``np.apply_along_axis``, ``np.vectorize`` or ``np.frompyfunc``, or a ``for``, a
    comprehension, a ``map``, ``filter``, ``itertools.starmap`` or ``functools.reduce`` over
    anything but a fixed few things (:func:`_fixed_few`: ``for a in (q, k)``, ``for n in
    "qkv"``, ``for n in x.shape``, or over a name the def assigns once from one of those, or one
    of the ``constants`` of its module or cell (:func:`module_constants`) that the def does
    not bind itself), which
    a longer sequence or a larger batch would not run more often.
    ``first_line``: the def's line in its cell (N then counts in the cell). ``steps``: the
    decoder's loop over the steps (:func:`_step_loop`) is allowed; the loops inside it count.
    A decorated def is not read: what the decorator returns runs instead."""
    if node.decorator_list:
        return (f"it is decorated (@{ast.unparse(node.decorator_list[0])}), so the def's body "
                "is not what runs: write it as a plain def, which the rule reads for loops")
    if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in (
            "globals", "vars", "setattr") for n in ast.walk(node)):
        constants = frozenset()  # the def may rebind them
    bound = {name for name, _ in _bindings(node)}
    loops, fixed = [], _fixed_names(node, constants - bound)
    step = _step_loop(node, fixed) if steps else None
    for statement in [*node.body, *node.args.defaults, *filter(None, node.args.kw_defaults)]:
        for n in ast.walk(statement):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and \
                    n.func.id in ("exec", "eval"):
                return (f"it runs code from a string ({n.func.id}, line "
                        f"{n.lineno + first_line - 1}), whose loops the rule cannot read")
            over = ([n.iter] if isinstance(n, ast.For | ast.AsyncFor) else
                    [g.iter for g in n.generators] if isinstance(
                        n, ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp) else [])
            hidden = isinstance(n, ast.Call) and ast.unparse(n.func).split(".")[-1] in (
                "apply_along_axis", "vectorize", "frompyfunc")  # a Python loop inside NumPy
            called = ast.unparse(n.func) if isinstance(n, ast.Call) else ""
            called = called.split(".")[-1] if called.startswith(("itertools.", "functools.")) \
                else called  # not np.add.reduce: a ufunc's loop runs inside NumPy
            if called in ("map", "filter", "starmap", "reduce") and len(n.args) > 1:
                # over their iterables, as long as the shortest (reduce: over its second)
                over = [ast.Call(ast.Name("zip"), n.args[1:2] if called == "reduce" else
                                 n.args[1:], [])]
            if n is not step and (isinstance(n, ast.While) or hidden or
                                  not all(_fixed_few(o, fixed) for o in over)):
                loops.append((n.lineno, over))
    if not loops:
        return "none"
    line, over = min(loops, key=lambda loop: loop[0])
    outside = [o.id for o in over if isinstance(o, ast.Name) and o.id not in bound]
    return f"a loop at line {line + first_line - 1}" + (
        f" over `{outside[0]}`, which the def's own file or cell does not bind once to a fixed "
        "few things, such as a tuple (a constant of another cell or module is not read)"
        if outside else "")


def _step_loop(node: ast.FunctionDef | ast.AsyncFunctionDef, fixed: frozenset[str],
               nested: bool = False) -> ast.AST:
    """A decoder's loop over the steps: its first ``while``, or ``for`` over anything but a
    fixed few things, the shallowest first (inside a ``with``, an ``if`` or a ``try`` too); in
    a def it defines only where its own body has none (a closure that runs the steps); None if
    it has none."""
    skipped = ast.Lambda | ast.ClassDef if nested else \
        ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef
    todo = list(node.body)
    while todo:
        n = todo.pop(0)
        if isinstance(n, ast.While) or isinstance(n, ast.For) and not _fixed_few(n.iter, fixed):
            return n
        if not isinstance(n, skipped):
            todo.extend(ast.iter_child_nodes(n))
    return None if nested else _step_loop(node, fixed, nested=True)


def _fixed_names(node: ast.AST, known: frozenset[str] = frozenset(),
                 scope: bool = False) -> frozenset[str]:
    """``known`` (the module's constants a def reads) and the names that a def (with ``scope``,
    a module's top level) binds once, by assigning each a fixed few things (``names = ["q",
    "k", "v"]``, ``names = HEADS`` for a known one, or the starred name of ``*lead, d =
    x.shape``), in the order assigned, and does not change (:func:`_changed_names`): a loop
    over one runs a fixed number of times too."""
    bound = [name for name, _ in _bindings(node, scope)]
    changed = _changed_names(node)
    fixed: set[str] = set(known)
    for n in (node.body if scope else ast.walk(node)):
        if isinstance(n, ast.AnnAssign) and n.value is not None:
            n = ast.Assign([n.target], n.value)  # lead: tuple = x.shape[:-1]
        if not (isinstance(n, ast.Assign) and len(n.targets) == 1):
            continue
        target = n.targets[0]  # a name, or the starred one of an unpacking: *lead, d = x.shape
        target = next((t.value for t in target.elts if isinstance(t, ast.Starred)), None) \
            if isinstance(target, ast.Tuple | ast.List) else target
        if isinstance(target, ast.Name) and bound.count(target.id) == 1 and \
                target.id not in changed and _fixed_few(n.value, frozenset(fixed)):
            fixed.add(target.id)
    return frozenset(fixed)


def _fixed_few(it: ast.expr, names: frozenset[str] = frozenset()) -> bool:
    """Whether a loop over ``it`` runs a fixed number of times: over a literal tuple, list,
    set or dict (nothing unpacked into it; a dict's ``.items()``, ``.keys()`` or
    ``.values()``), a short string (``"qkv"``), one of ``names`` (:func:`_fixed_names`), an
    array's ``.shape`` or ``np.shape(x)`` (or a slice of it), ``range`` of small counts
    (:func:`_few`: ``2``, ``x.ndim - 2``, ``len(names)``), ``enumerate``, ``reversed``,
    ``tuple``, ``list`` or ``sorted`` of those, or ``zip`` with one of those."""
    if isinstance(it, ast.Tuple | ast.List | ast.Set):
        return not any(isinstance(e, ast.Starred) for e in it.elts)
    if isinstance(it, ast.Dict):
        return None not in it.keys  # None: a **mapping unpacked into it
    if isinstance(it, ast.Constant):
        return isinstance(it.value, str) and len(it.value) <= 16
    if isinstance(it, ast.Name):
        return it.id in names
    if isinstance(it, ast.Attribute):  # a name's .shape, not that of an object made here
        return it.attr == "shape" and isinstance(it.value, ast.Name | ast.Attribute)
    if isinstance(it, ast.Subscript):
        return isinstance(it.slice, ast.Slice) and _fixed_few(it.value, names)
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and not it.args:
        return it.func.attr in ("items", "keys", "values") and _fixed_few(it.func.value, names)
    if isinstance(it, ast.Call) and ast.unparse(it.func) in ("np.shape", "numpy.shape"):
        return len(it.args) == 1 and isinstance(it.args[0], ast.Name | ast.Attribute)
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.args:
        if it.func.id in ("enumerate", "reversed", "tuple", "list", "sorted"):
            return _fixed_few(it.args[0], names)
        if it.func.id == "zip":  # as long as its shortest argument
            return any(_fixed_few(a, names) for a in it.args)
        if it.func.id == "range" and len(it.args) <= 3:
            return all(_few(a, names) for a in it.args)
    return False


def _few(n: ast.expr, names: frozenset[str] = frozenset()) -> bool:
    """Whether ``n`` is a small count: a constant up to 16, an array's ``.ndim`` (or
    ``np.ndim(x)``), the ``len`` of a fixed few things (:func:`_fixed_few`), or a sum or
    difference of those (``x.ndim - 2``)."""
    if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add | ast.Sub):
        return _few(n.left, names) and _few(n.right, names)
    if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
        return _few(n.operand, names)
    if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "len":
        return len(n.args) == 1 and _fixed_few(n.args[0], names)
    if isinstance(n, ast.Call) and ast.unparse(n.func) in ("np.ndim", "numpy.ndim"):
        return len(n.args) == 1 and isinstance(n.args[0], ast.Name | ast.Attribute)
    return isinstance(n, ast.Constant) and type(n.value) is int and abs(n.value) <= 16 \
        or isinstance(n, ast.Attribute) and n.attr == "ndim" and \
        isinstance(n.value, ast.Name | ast.Attribute)


def _code_objects(function: Callable) -> Iterator:
    """The compiled code of ``function`` and of the functions it defines inside (none for an
    object without code: a builtin, a class)."""
    stack = [getattr(function, "__code__", None)]
    while stack:
        code = stack.pop()
        if code is not None:
            yield code
            stack += [c for c in code.co_consts if hasattr(c, "co_code")]


# --------------------------------------------------------------------------------------------
# Running one case where the student's code lives


@dataclass
class Outcome:
    """What a run gave back: ``value``, or the ``error`` it raised; and the inputs as they were
    after the run (to notice an input modified in place)."""

    value: Any = None
    error: str | None = None
    where: str = ""  # the student's line that raised, when it can be told
    after: tuple = ()
    after_kwargs: dict = field(default_factory=dict)


def run_case(check: Check, f: Functions, case: Case) -> Outcome:
    """Call ``check.run`` on a copy of the case's inputs; never raises for the student's errors
    (a stub's NotImplementedError included: it comes back as the outcome's error)."""
    args, kwargs = copy.deepcopy(case.args), copy.deepcopy(case.kwargs)
    _CACHED.clear()
    try:
        value = check.run(f, *args, **kwargs)
    except Exception as exc:  # the student's code: any error is a finding
        error = _error_text(exc)
        if _raised_reading(exc):
            error = f"{UNREADABLE} ({error})"
        where = _student_frame(exc if exc.__cause__ is None else exc.__cause__)
        return Outcome(error=error, where=where, after=args, after_kwargs=kwargs)
    finally:
        changed = any(_fingerprint(a) != was for a, was in _CACHED)
        _CACHED.clear()
    if changed:
        return Outcome(error=CACHE_CHANGED, after=args, after_kwargs=kwargs)
    return Outcome(value=value, after=args, after_kwargs=kwargs)


def _error_text(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if len(text) > 500:
        text = text[:497] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _is_students(filename: str) -> bool:
    """Whether a frame's file is the student's code: their ``core/*.py`` or a notebook cell (an
    IPython cell file, or the ``<...>`` name a cell compiled by the grader gets), not a library
    (NumPy, Python's own modules) nor the rest of this package."""
    path = filename.replace("\\", "/")
    if "/transformer_lab/core/" in path:
        return True
    if "/transformer_lab/" in path or "/site-packages/" in path or "/dist-packages/" in path:
        return False
    paths = sysconfig.get_paths()
    folders = {paths.get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    folders |= {sys.prefix, sys.base_prefix, sys.exec_prefix}
    return not path.startswith(tuple(f.replace("\\", "/").rstrip("/") + "/" for f in folders if f))


def _frame_text(fr: traceback.FrameSummary) -> str:
    path = fr.filename.replace("\\", "/")
    if "/transformer_lab/core/" in path:
        where = "core/" + path.rsplit("/transformer_lab/core/", 1)[1]
    elif path.endswith(".py") and "ipykernel_" not in path:
        where = Path(path).name
    else:
        where = "your notebook"
    code = f": {fr.line.strip()}" if fr.line else ""
    return f"{where}, line {fr.lineno}, in {fr.name}{code}"


#: The error of a case whose function returned something its check could not read.
UNREADABLE = "the check could not read what your function returned"


def _raised_reading(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by a check's own code (int('t') on what came back), not
    deeper, in the student's code or a library it called, nor by a check explaining the
    student's error (``raise ... from err``)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and exc.__cause__ is None and re.search(r"transformer_lab/checks/nb\d\d_",
                                      frames[-1].filename.replace("\\", "/")) is not None


def _student_frame(exc: BaseException) -> str:
    """``file, line N, in f: code`` of the deepest frame that is the student's code (their
    ``core/*.py`` or notebook cell) and, when the error came from deeper (NumPy), of that
    innermost frame as well: "core/multihead.py, line 40, in merge_heads: ...; raised in
    _shape_base_impl.py, line 872, in split"; and, when that function was called by another
    of the student's, of the outermost one (the function under test): "...; called from
    core/multihead.py, line 62, in multi_head_attention_forward: ...", with the one between
    that called the deepest first, where there is one (it often made what failed)."""
    frames = [fr for fr in traceback.extract_tb(exc.__traceback__)
              if "transformer_lab/checks/" not in fr.filename.replace("\\", "/")]
    if not frames:
        return ""
    own = [fr for fr in frames if _is_students(fr.filename)]
    called = ""
    if len(own) > 1 and own[0].name != own[-1].name:  # the function under test passed it
        if len(own) > 2 and own[-2].name not in (own[0].name, own[-1].name):  # and its caller
            called = f"; called from {_frame_text(own[-2])}"
        called += f"; called from {_frame_text(own[0])}"
    if not own or own[-1] is frames[-1]:
        return _frame_text(frames[-1]) + called
    return f"{_frame_text(own[-1])}; raised in {_frame_text(frames[-1])}{called}"


# --------------------------------------------------------------------------------------------
# Judging: the student's outcome against the expected answer


@dataclass
class Verdict:
    passed: bool
    message: str = ""


def is_stub(error: str) -> bool:
    """Whether ``error`` (``"Type: message"``) is what a handout's stub raises: a core function's
    (:func:`syllabus.stub_message`) or an exercise cell's (``"Exercise: ..."``) -- not a
    NotImplementedError of the student's own."""
    message = error.removeprefix("NotImplementedError: ")
    return message != error and (message.startswith("Exercise: ")
                                 or " is yours to write: notebook " in message)


def judge(check: Check, case: Case, outcome: Outcome, want: Any,
          mistakes: Mapping[str, Any] | None = None,
          loops: Mapping[str, str] | None = None) -> Verdict:
    """Compare an outcome with the expected answer; the message teaches what went wrong (the
    mistakes it recognises: ``check.mistakes``, or the answers ``mistakes`` stored for them).
    ``loops``: for :attr:`Check.loop_free`'s functions, what :func:`python_loops` says of each
    ("none" passes)."""
    label = f"case {case.name!r}"
    if outcome.error is not None:
        if is_stub(outcome.error):
            return Verdict(False, f"{label}: not written yet -- {outcome.error}")
        if outcome.error.startswith("NotAPair: "):
            return Verdict(False, f"{label}: {outcome.error.removeprefix('NotAPair: ')}")
        hint = _error_hint(outcome, int(check.notebook[:2]))
        callee = re.match(r"core/\w+\.py, line \d+, in (\w+):", outcome.where or "")
        if callee and _taught_before(callee[1], check.notebook):
            hint = (f"{callee[1]} raised it, a function of an earlier notebook that its own "
                    "check tests: what reached it from your code (the last line in the list "
                    "above) is not what it takes -- an array of another shape, or the gradient "
                    "or the cache of another call" + (f". {hint[0].upper()}{hint[1:]}"
                                                      if hint else ""))
        if outcome.error.startswith(UNREADABLE):
            return Verdict(False, f"{label}: {outcome.error}\n  Hint: " + (
                hint or "does it return what its docstring's '->' says, the types of keys and "
                        "items too?"))
        where = f" (at {outcome.where})" if outcome.where else ""
        return Verdict(False, f"{label}: your code raised {outcome.error}{where}"
                              + (f"\n  Hint: {hint}" if hint else ""))
    changed = _modified_inputs(check, case, outcome)
    if changed:
        return Verdict(False, f"{label}: your function changed its input {changed} in place; "
                              "compute into a new array (e.g. y = x - m, not x -= m), and "
                              "copy an input you keep and later update in place (buf = "
                              "g.copy(), not buf = g)")
    problem = _difference(check, "output", outcome.value, want)
    if problem is None:
        return _loop_verdict(check, label, loops or {})
    hint = _hint(check, case, outcome.value, want, problem, mistakes)
    return Verdict(False, f"{label}: {problem.text}" + (f"\n  Hint: {hint}" if hint else ""))


def _loop_verdict(check: Check, label: str, loops: Mapping[str, str]) -> Verdict:
    """Passed, unless a function of ``check.loop_free`` runs a Python loop (``loops``)."""
    for name, found in loops.items():
        if found.startswith("a loop"):
            return Verdict(False, f"{label}: the answer is right, but `{name}` runs a Python "
                                  f"loop ({found}); the exercise asks for none over the data's "
                                  f"axes: {check.loop_free.get(name, 'broadcast')}")
        if found != "none":
            return Verdict(False, f"{label}: `{name}`: {found}")
    return Verdict(True)


def _taught_before(function: str, notebook: str) -> bool:
    """Whether the core function ``function`` is taught, and extended, before ``notebook``
    ("09_verification") only: a check of that notebook does not test it."""
    from transformer_lab import syllabus

    places = next((f[function] for f in syllabus.TAUGHT_IN.values() if function in f), ())
    return bool(places) and all(place.split(" §")[0] < notebook for place in places)


def _error_hint(outcome: Outcome, notebook: int = 16) -> str:
    """What an error of a few common kinds usually means, or '' -- naming only what the course
    has taught by ``notebook``, the check's (key/value heads in 15, tiles in 16)."""
    heads, tiles = notebook >= 15, notebook >= 16
    if "read-only" in outcome.error or outcome.error.startswith("CacheChanged"):
        return READ_ONLY_HINT
    undefined = re.match(r"NameError: name '(\w+)' is not defined", outcome.error)
    if undefined and not (outcome.where or "").startswith("core/"):
        return (f"is `{undefined[1]}` set in a cell other than the exercise's? " + OTHER_CELLS)
    empty = next((shape for shape in re.findall(r"\((\d[\w,]*)\)", outcome.error)
                  if "0" in shape.split(",")), None)
    if empty is not None:
        return (f"an array of shape ({empty}) has no entries along an axis: a slice that starts "
                "at or past the end of what it slices (rows length .. end of a table that holds "
                "the new positions' rows only, say) gives none")
    shapes = re.search(r"broadcast together with shapes \(([\d,]*)\) \(([\d,]*)\)",
                       outcome.error)
    if shapes:
        hint = _broadcast_hint(*sorted(_shapes(shapes), key=len))
        if hint:
            return hint
    remapped = re.search(r"remapped shapes \[original->remapped\]: \(([\d,]*)\)->\S* "
                         r"\(([\d,]*)\)->", outcome.error)
    if remapped:  # a @ b whose leading axes do not broadcast
        a, b = (shape[:-2] for shape in _shapes(remapped))
        return (f"the leading axes of a matrix product, {a} and {b}, do not match: " + (
            "query heads against key/value heads (H against Hkv: repeat_kv gives each "
            "key/value head to n_rep query heads, along axis 1), " if heads else
            "an array split into heads against one that is not, ") +
            "or one batch against another?")
    into = re.search(r"input array from shape \(([\d,]*)\) into shape \(([\d,]*)\)",
                     outcome.error)
    if into:
        block, room = _shapes(into)
        if len(block) == len(room) and all(r <= b for b, r in zip(block, room, strict=True)):
            return (f"a block {block} written into a slice {room} that has less room: a slice "
                    "that runs past the end of its array is cut short" + (
                        " (the last block is shorter where a length is not a multiple of the "
                        "block size: compute it for the slice's own length)" if tiles else "") +
                    (", or a cache of Hkv key/value heads given H of them (repeat them after "
                     "reading the cache)" if heads else "") +
                    (", or a block of every position where the shifted T - 1 belong (the loss "
                     "scores logits[:, :-1] against ids[:, 1:])" if notebook >= 13 else ""))
        if len(block) == len(room):
            axes = [i for i, (b, r) in enumerate(zip(block, room, strict=True)) if b != r]
            return (f"a block {block} written into a slice {room}: they differ along axis "
                    f"{axes[0]} -- does the slice cut the axis it means to? a[:, :, i:j] cuts "
                    "axis 2, a[:, i:j] axis 1, and an axis a slice leaves whole stays whole")
    where = re.search(r"where mask from shape \(([\d,]*)\) into shape \(([\d,]*)\)",
                      outcome.error)
    if where:
        mask, scores = _shapes(where)
        if len(mask) >= 2 and len(scores) >= 2 and mask[-1] != scores[-1]:
            if mask[-1] == scores[-2] and mask[-2] in (1, scores[-1]):
                return _swapped_hint(mask, scores)
            causes = ["a mask made for another sequence (the source's padding where the "
                      "target's belongs, or the reverse)"]
            if notebook >= 7:  # cross-attention
                causes.insert(0, "keys and values from another sequence (a cross-attention's "
                                 "come from the memory, its queries from the sequence updated)")
            if notebook >= 12:  # caches
                causes += ["the whole of a cache where its filled part belongs (K[:, :, "
                           ":length])", "a mask of the new positions alone", "a length past "
                           "what the cache holds (is it advanced once a step, not once a "
                           "layer?)"]
            if tiles:
                causes.insert(0, "a full block's mask on a shorter last tile (make it for the "
                                 "tile's own shape)")
            return (f"the mask {mask} covers {mask[-1]} keys and the scores {scores} have "
                    f"{scores[-1]}: the mask and the keys are made for different lengths -- "
                    + ", ".join(causes[:-1]) + (", or " if len(causes) > 1 else "")
                    + causes[-1])
    fixed = re.search(r"reshape\(\s*-1\s*,\s*\w+\.shape\[(\d)\]\s*\)",
                      _code_of(outcome.where or ""))  # x.reshape(-1, x.shape[1])
    if fixed:
        return (f"the line reshapes by .shape[{fixed[1]}], an axis counted from the left: the "
                f"last one of a {int(fixed[1]) + 1}-D array only -- with leading (batch) axes, "
                "count from the right (.shape[-1] is the features' axis of any array)")
    if "mismatch in its core dimension" in outcome.error and re.search(
            r"\w\.T\b", _code_of(outcome.where or "")):
        return ("the line has a .T: on a matrix it swaps the two axes, but on an array with "
                "leading (batch) axes it reverses every axis, (B, S, d) -> (d, S, B). "
                "np.swapaxes(a, -1, -2) swaps the last two only; a weight gradient sums over "
                "the leading axes once they are flattened (x.reshape(-1, D)); and a weight is "
                "laid out as its docstring says (W (D_in, D_out) multiplies as x @ W).")
    sizes = re.search(r"mismatch in its core dimension 0, .*\(size (\d+) is different from "
                      r"(\d+)\)", outcome.error)
    if sizes and re.search(r"\bW", _code_of(outcome.where or "").split("\n")[0]):  # x @ W
        return (f"a @ W multiplies a's last axis ({sizes[2]}) with W's first ({sizes[1]}): is W "
                "laid out the other way -- an embedding table (V, E) as the output projection "
                "multiplies transposed, x @ W.T -- or are the two factors swapped?")
    if sizes:  # a @ b of two activations
        causes = ["a transpose missing or in the wrong place (k^T is np.swapaxes(k, -1, -2))",
                  "an array not split into heads where the other is",
                  "one array where another belongs"]
        if heads:
            causes.append("heads split by two counts (H against Hkv)")
        if tiles:
            causes.append("slices of different lengths (a last tile is shorter where a length "
                          "is not a multiple of the block size: clip its end, min(start + "
                          "block_size, length))")
        return (f"the two factors of a matrix product disagree ({sizes[2]} against {sizes[1]}): "
                + ", ".join(causes[:-1]) + f", or {causes[-1]}?")
    if "zero-size array to reduction operation" in outcome.error:
        return "a maximum (or minimum) over no entries: an empty slice" + (
            " -- a tile of no keys, a causal range past the keys' end not clipped (min(end, S)), "
            "or a block start past the length" if tiles else "")
    if "only integer scalar arrays can be converted to a scalar index" in outcome.error:
        return ("a NumPy reduction given a second array where it takes the axis -- np.max(a, b) "
                "is the maximum of a along axis b: the elementwise maximum of two arrays is "
                "np.maximum(a, b)")
    if "array split does not result in an equal division" in outcome.error:
        return ("np.split(a, 3) cuts three equal parts along axis 0 unless given another: the "
                "packed q, k and v are the last axis's columns, np.split(qkv, 3, axis=-1)" + (
                    "; and with fewer key/value heads than query heads the keys and the values "
                    "are narrower than the queries (Hkv * Dh columns each): cut at the columns, "
                    "np.split(qkv, [E, E + kv], axis=-1)" if heads else ""))
    if "boolean index did not match" in outcome.error:
        return ("a mask that broadcasts -- (1, S), (B, 1, S) -- cannot index the scores "
                "(scores[mask] needs a mask of the scores' own shape): use np.where(mask, "
                "-np.inf, scores) or np.copyto(scores, -np.inf, where=mask)")
    if re.search(r"(too many|not enough) values to unpack|cannot unpack non-iterable",
                 outcome.error):
        if not outcome.where:  # in the check's own code: what the function returned
            return ("the check unpacks what your function returns as its docstring's '->' "
                    "says ((out, cache) for a forward pass): does it return that many values?")
        cache = re.search(r"= (cache|c_\w+)\b", outcome.where)  # cache, c_att, c_kernel...
        if cache and "NoneType" in outcome.error:
            return ("your backward unpacks a cache that is None: did your forward return one "
                    "(keep its given return line, with the cache of every call it makes)? Only "
                    "dropout returns cache None on purpose (in evaluation or at p = 0), and its "
                    "backward then returns dout as it is")
        if cache:
            return ("your backward unpacks a cache of another length than your forward "
                    "returned: do the two agree (and does the forward call what it was given)?")
        called = re.search(r"=\s*(?:\w+\.)*(\w+_forward)\(", outcome.where)
        if called:  # out, cache = f_forward(...) in the student's code
            return (f"{called[1]} returned what does not unpack into (out, cache): does it "
                    "return both, as its docstring's '->' says? (An array unpacks along its "
                    "first axis.)")
    return next((hint for pattern, hint in ERROR_HINTS if re.search(pattern, outcome.error)), "")


#: (a regex of an error, what it usually means), for errors that say nothing of shapes
ERROR_HINTS = [
    (r"index (\d+) is out of bounds for axis \d+ with size \1\b",
     "an index equal to the axis's size is one past its end: positions count from 0, so the "
     "last of n is n - 1 (the last real token of a sequence of length n is at n - 1)"),
    (r"codec can't decode",
     "bytes that end inside a character (a token may hold part of one) are not valid UTF-8 "
     "read strictly: decode with errors=\"replace\", which makes them U+FFFD"),
    (r"bytes must be in range\(0, 256\)",
     "bytes(ids) takes byte values 0 .. 255, but an id of 256 or more is a merged token: join "
     "the bytes each id stands for (vocab[i]), then decode"),
    (r"^KeyError: \(\d+, \d+\)",
     "a pair looked up in a dict that does not hold it: a pair that was never learned has no "
     "rank (test `pair in ranks`, or ranks.get(pair, math.inf))"),
    (r"^ZeroDivisionError",
     "a division by zero of Python numbers: an edge case whose answer the docstring gives (p = "
     "1 drops everything: no 1 / (1 - p)), or a count that starts at 0 where it starts at 1 "
     "(Adam's step t is 1 at the first update: 1 - beta1 ** t is 0 at t = 0)"),
    (r"can't multiply sequence by non-int|unsupported operand type\(s\) .*'str'|'str' object "
     r"has no attribute",
     "a string where an array belongs: looping over a dict gives its keys (loop over "
     ".values() or .items())"),
    (r"'NoneType' object has no attribute '(random|uniform|normal|standard_normal|"
     r"integers)'",
     "a draw from rng = None: without an rng a model evaluates, and dropout is the identity "
     "(dropout_forward(..., train=rng is not None))"),
    (r"truth value of an array with more than one element is ambiguous",
     "Python's if, and, or, min() and max() take an array as one truth value or number: "
     "elementwise, use np.where, &, |, np.minimum and np.maximum (np.min, np.max to reduce)"),
]


def _shapes(found: re.Match) -> list[tuple[int, ...]]:
    """The shapes an error's regex match found, "2,3" as (2, 3)."""
    return [tuple(int(n) for n in shape.split(",") if n) for shape in found.groups()]


def _broadcast_hint(a: tuple, b: tuple) -> str:
    """What two shapes that do not broadcast, ``a`` the one with fewer axes, usually mean."""
    if len(b) == len(a) + 1 and b[:-1] == a:  # (3, 5) against (3,): the last axis dropped
        return (f"an array of shape {a} -- a sum, mean or max over the last axis without "
                "keepdims=True, or one number per row such as the lengths -- broadcasts "
                f"against the last axis of {b}, not along its rows: keep the axis "
                "(keepdims=True), or add it as the last axis (v[..., None])")
    if len(a) == 2 and len(b) == 3 and a[1] == b[2]:  # (B, E) or (L, E) against (B, T, E)
        if a[0] == b[0]:
            return (f"one row per sequence {a} broadcasts against the positions of {b}, "
                    "not along them: keep the axis (keepdims=True) or add it (v[:, None])")
        return (f"{a[0]} rows {a} meet {b[1]} positions {b}: a table with a row per "
                "position holds one for every position up to its maximum length; add the "
                "rows of the positions there are (table[:T], or from length on in a "
                "cached step)")
    if len(a) == len(b) == 3 and a[0] == b[0] and a[2] == b[2]:  # (B, T, E), (B, S, E)
        return (f"sequences of {a[1]} and {b[1]} positions meet, {a} and {b}: where one is "
                "a cross-attention's output, it has its queries' length -- the queries "
                "come from the sequence being updated, the keys and values from the memory")
    for mask, scores in ((a, b), (b, a)):  # a padding mask (B, 1, 1, S) against the scores
        if len(mask) == len(scores) == 4 and mask[-2] == 1 and \
                mask[-1] == scores[-2] != scores[-1]:
            return _swapped_hint(mask, scores)
    return ""


def _code_of(where: str) -> str:
    """The code of the lines that :func:`_student_frame`'s text quotes, without comments."""
    parts = re.split(r"; (?:raised in|called from) ", where)
    return "\n".join(part.split(": ", 1)[-1].split("#", 1)[0] for part in parts)


def _swapped_hint(mask: tuple, scores: tuple) -> str:
    """A mask of ``mask[-1]`` keys met scores with as many queries: queries and keys swapped."""
    return (f"the mask {mask} has {mask[-1]} keys (its last axis), but the scores {scores} have "
            f"{scores[-2]} queries and {scores[-1]} keys: are the queries and the keys swapped? "
            "In cross-attention the queries come from the sequence being updated, the keys and "
            "values from the memory")


#: Said when the student's code writes into a read-only array: one a forward pass cached.
READ_ONLY_HINT = ("your backward pass writes into an array that its forward pass cached (the "
                  "checks make caches read-only, and compare the forward's inputs it cached "
                  "after the backward): whoever else holds it -- a caller's attention weights, "
                  "the next layer's RoPE tables, a second backward on the same cache -- would "
                  "see it changed; compute into a new array (dx = y * (...), not y *= ...)")


def _modified_inputs(check: Check, case: Case, outcome: Outcome) -> str:
    """The first input of ``case`` that the run changed, by the name the check's ``run`` (or,
    without one of its own, its ``expected``) gives it (``dout``, ``cache``...), or ''."""
    names: list[str] = []
    for method in (check.run, check.expected):  # a check without its own run names them there
        try:
            names = names or [p.name for p in inspect.signature(method).parameters.values()
                              if p.name not in ("self", "f") and p.kind is p.POSITIONAL_OR_KEYWORD]
        except (TypeError, ValueError):
            pass
    inputs = [(f"`{names[i]}`" if i < len(names) else f"(argument {i + 1})", before, after)
              for i, (before, after) in enumerate(zip(case.args, outcome.after, strict=False))]
    inputs += [(repr(k), v, outcome.after_kwargs.get(k)) for k, v in case.kwargs.items()]
    return next((label for label, before, after in inputs if not _same(before, after)), "")


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b, equal_nan=True)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(
            _same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return True  # numbers, strings, None cannot be changed in place


@dataclass
class Difference:
    name: str  # which output, e.g. "output['dW']"
    text: str
    got: Any = None
    want: Any = None


def _difference(check: Check, name: str, got, want) -> Difference | None:
    """The first way ``got`` differs from ``want`` (None when it does not)."""
    def differs(text: str) -> Difference:
        return Difference(name, name + text, got, want)
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return differs(f" must be a dict with keys {sorted(want)}, got {_kind(got)}")
        if set(got) != set(want):
            missing, extra = sorted(set(want) - set(got), key=str), sorted(set(got) - set(want),
                                                                           key=str)
            wrong = " and ".join(([f"lacks the keys {missing}"] if missing else [])
                                 + ([f"has keys not expected {extra}"] if extra else []))
            biases = [k for k in extra if isinstance(k, str) and f"W{k[1:]}" in want]
            why = (" (gradients of biases the parameters do not hold: does the forward pass "
                   f"give a bias of 0, params.get({biases[0]!r}, 0), where None belongs, "
                   f"params.get({biases[0]!r})?)") if biases and biases == extra else ""
            return differs(f" {wrong}: it must have exactly the keys "
                           f"{sorted(want, key=str)}, got {sorted(got, key=str)}{why}")
        parts = [(f"{name}[{key!r}]", got[key], want[key]) for key in want]
    elif isinstance(want, (tuple, list)):
        if not isinstance(got, (tuple, list)) or len(got) != len(want):
            return differs(f" must be a sequence of {len(want)} values, got {_kind(got)}"
                           + _where_apart(got, want))
        parts = [(f"{name}[{i}]", g, w) for i, (g, w) in enumerate(zip(got, want, strict=True))]
    if isinstance(want, (dict, tuple, list)):  # the first part that differs
        return next(filter(None, (_difference(check, *part) for part in parts)), None)
    if want is None or isinstance(want, (str, bool)):
        same = type(got) is type(want) and got == want
        return None if same else differs(f": expected {want!r}, got {_short(got)}")
    if isinstance(got, str):  # also a check's sentence saying what is missing ("None: set ...")
        return differs(f": expected {_kind(np.asarray(want))}, got {got}")
    if not isinstance(got, (np.ndarray, np.generic, int, float, bool)) and not np.isscalar(got):
        return differs(f" must be a NumPy array or a number like the expected one "
                       f"({_kind(np.asarray(want))}), got {_kind(got)}")
    return _array_difference(check, name, np.asarray(got), np.asarray(want),
                             typed=isinstance(want, np.ndarray))


def _array_difference(check: Check, name: str, got: np.ndarray, want: np.ndarray,
                      typed: bool) -> Difference | None:
    """:func:`_difference` of two arrays; ``typed``: the expected answer was an array (not a
    number), whose dtype a float answer must have."""
    def differs(text: str) -> Difference:
        return Difference(name, f"{name}: {text}", got, want)
    is_bool = want.dtype == bool or got.dtype == bool
    exact = is_bool or np.issubdtype(want.dtype, np.integer)  # masks, ids, counts: exactly
    if got.shape != want.shape:
        return differs(f"expected shape {want.shape}, got {'' if exact else 'shape '}{got.shape}")
    if exact:
        if is_bool and got.dtype != want.dtype:
            return differs(f"expected a {want.dtype} array, got {got.dtype}")
        if want.ndim == 0:
            return None if got == want else differs(f"expected {want}, got {got}")
        wrong = np.argwhere(got != want)
        if not wrong.size:
            return None
        first = tuple(wrong[0])
        return differs(f"{len(wrong)} of {want.size} entries differ, the first at "
                       f"{_index(first, check, name)}: expected {want[first]}, got {got[first]}"
                       f"{_both(got, want)}")
    if not np.issubdtype(got.dtype, np.floating) and not np.issubdtype(got.dtype, np.integer):
        return differs(f"expected numbers, got dtype {got.dtype}")
    if typed and want.ndim and got.dtype != want.dtype:
        return differs(f"expected a {want.dtype} array, got {got.dtype}")
    if not np.all(np.isfinite(got)):
        bad = np.argwhere(~np.isfinite(got))
        count = f"{len(bad)} entries are" if len(bad) > 1 else "1 entry is"
        at = _index(bad[0], check, name) if got.ndim else "the value"
        return differs(f"{count} NaN or infinite, the first at {at} (expected "
                       f"{_num(want[tuple(bad[0])])})")
    tol = check.tolerance(name, want)
    err = rel_error(got, want)
    if err <= tol:
        return None
    return differs(f"relative error {err:.1e} (tolerance {tol:.0e}); "
                   f"{_largest(got, want, check, name)}")


def _largest(got: np.ndarray, want: np.ndarray, check: Check, name: str) -> str:
    """Where the two differ most -- first, so that two arrays that print alike (a difference
    in the fifth digit) still show where and how much -- and, when small, the two in full."""
    if got.ndim == 0:
        return f"expected {_short(want)}, got {_short(got)}"
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    where = np.unravel_index(int(np.argmax(diff)), diff.shape)
    largest = (f"largest difference {_num(diff[where])} at {_index(where, check, name)}: "
               f"expected {_num(want[where])}, got {_num(got[where])}")
    if got.size <= 36 and got.ndim >= 2:
        return f"{largest}; the two in full:" + _both(got, want)
    if got.size <= 12:
        return f"{largest}; expected {_short(want)}, got {_short(got)}"
    return largest


def _both(got: np.ndarray, want: np.ndarray) -> str:
    """The two arrays in full, one under the other, indented ('' past 36 entries)."""
    if got.size > 36:
        return ""
    text = ""
    for label, a in (("expected", want), ("got", got)):
        shown = np.array2string(a.astype(int) if a.dtype == bool else a, precision=4,
                                suppress_small=True)
        text += f"\n  {label}:\n" + "\n".join("    " + line for line in shown.split("\n"))
    return text


def _index(ix, check: Check, name: str) -> str:
    """``[1, 0, 2]``, or with the axes' names where the check knows them: ``[b=1, h=0, t=2]``."""
    ix = [int(i) for i in ix]
    try:
        names = check.axis_names(name, len(ix))
    except Exception:  # a message must never break the verdict
        names = ("",) * len(ix)
    return "[" + ", ".join(f"{n}={i}" if n else str(i) for n, i in zip(names, ix,
                                                                      strict=True)) + "]"


def _num(x) -> str:
    return f"{float(x):.6g}"


def _short(x) -> str:
    if isinstance(x, np.ndarray) and x.size <= 12:
        return np.array2string(x, precision=4, suppress_small=True).replace("\n", "")
    if isinstance(x, np.ndarray):
        return _kind(x)
    text, room = repr(x), 200 if isinstance(x, str) else 80  # a check's sentence whole
    return text if len(text) <= room else text[:room - 3] + "..."


def _where_apart(got, want) -> str:
    """For two sequences of other lengths whose items are plain (token ids, pieces, merges):
    where they first differ, and a few items from there."""
    items = (str, bytes, int, float, tuple, np.integer)
    if not isinstance(got, (tuple, list)) or \
            not all(isinstance(x, items) for x in (*got, *want)):
        return ""
    i = next((k for k, (g, w) in enumerate(zip(got, want, strict=False)) if g != w),
             min(len(got), len(want)))

    def some(seq):
        shown = [_short(x.item() if isinstance(x, np.integer) else x) for x in seq[i:i + 4]]
        return "[" + ", ".join(shown + (["..."] if len(seq) > i + 4 else [])) + "]"
    return f"; from [{i}] on, expected {some(want)}, got {some(got)}"


def _kind(x) -> str:
    if isinstance(x, np.ndarray):
        return f"a {x.dtype} array of shape {x.shape}" if x.ndim else f"the number {_num(x)}"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)} values"
    if isinstance(x, dict):
        return f"a dict with keys {sorted(map(str, x))}"
    return f"{type(x).__name__} {_short(x)}"


# --------------------------------------------------------------------------------------------
# Hints: recognising common mistakes


def _hint(check: Check, case: Case, got, want, problem: Difference,
          stored: Mapping[str, Any] | None = None) -> str:
    """A sentence naming the likely mistake, or ''. A mistake is named when its answer is the
    one that came back and a wrong one here (a mistake that gives the right answer in this case
    tells nothing): the whole answer, else the first output that differs, by its name, for a
    mistake that gives only some outputs (a forward's, say; the entries of one list are one
    output: one entry's match tells nothing). Where two mistakes give that answer, the first
    two are named."""
    answers = _mistake_answers(check, case, stored)
    keys = list(takewhile(bool, (k for k, _ in re.findall(r"\[(?:'([^']*)'|(\d+))\]",
                                                               problem.name))))
    for path, pairs in ((), answers), (keys, dict(answers).items() if keys else ()):
        named = []
        for description, answer in pairs:
            try:
                with np.errstate(all="ignore"):
                    g, w, a = (reduce(getitem, path, x) for x in (got, want, answer))
                    name = "output" + "".join(f"[{k!r}]" for k in path)
                    if _matches(check, g, a, name) and not _matches(check, w, a, name):
                        named.append(description)
            except Exception:  # a mistake without that output, or a hint's own error
                continue
        if named:  # two mistakes may give the same answer in a case: both are named
            return f"this is what you get {' -- or '.join(named[:2])}."
    return _generic_hint(problem) or _eps_hint(check, case, problem, keys)


#: the eps a norm takes by default (the course's and PyTorch's, LLaMA's configs'), which a
#: forgotten eps leaves
DEFAULT_EPS = (1e-5, 1e-6)


def _eps_hint(check: Check, case: Case, problem: Difference, keys: list[str]) -> str:
    """For a case that gives ``eps`` (a keyword, or a config's entry): whether the answer is off
    in the direction of the one with a default eps (cosine over 0.5; of two, the one nearer the
    answer) -- an eps not passed on, to one norm or to them all."""
    given = _given_eps(case)
    got, want = problem.got, problem.want
    if given is None or given[0] in DEFAULT_EPS or not isinstance(got, np.ndarray) \
            or not isinstance(want, np.ndarray) or got.shape != want.shape \
            or not np.issubdtype(got.dtype, np.floating) or not np.all(np.isfinite(got)):
        return ""
    eps, inputs = given
    found = {}  # default -> how far the answer is from the one with it
    for default in DEFAULT_EPS:
        try:
            args, kwargs = copy.deepcopy(inputs(default))
            other = np.asarray(reduce(getitem, keys, check.expected(*args, **kwargs)))
            wrong, towards = (got - want).ravel(), (other - want).ravel()
            if float(wrong @ towards) > 0.5 * np.linalg.norm(wrong) * np.linalg.norm(towards):
                found[default] = float(np.linalg.norm(got - other))
        except Exception:  # a check whose expected takes no eps, or a hint's own error
            continue
    if not found:
        return ""
    return (f"the case gives eps = {eps:g}, and your answer is off in the direction of the one "
            f"with eps = {min(found, key=found.get):g}: is eps passed on to every norm (a "
            "default written in, or eps left out of a call)?")


def _given_eps(case: Case) -> tuple[float, Callable[[float], tuple]] | None:
    """(the eps a case gives, eps -> the case's (args, kwargs) with that eps instead), or None:
    eps as a keyword, or as the entry of a config dict among the arguments."""
    if isinstance(case.kwargs.get("eps"), float):
        return case.kwargs["eps"], lambda e: (case.args, {**case.kwargs, "eps": e})
    for i, a in enumerate(case.args):
        if isinstance(a, dict) and isinstance(a.get("eps"), float):
            return a["eps"], lambda e, i=i: (
                (*case.args[:i], {**case.args[i], "eps": e}, *case.args[i + 1:]), case.kwargs)
    return None


def _mistake_answers(check: Check, case: Case, stored: Mapping[str, Any] | None = None) -> list:
    """(description, answer) of each of the check's mistakes in one case that gives one without
    an error, in order; ``stored``: the answers :func:`store_expected` kept for them."""
    if stored is not None:
        return list(stored.items())
    try:
        mistakes = check.mistakes(*case.args, **case.kwargs)
    except Exception:  # a hint must never break the verdict
        return []
    found = []
    for description, wrong in mistakes.items() if isinstance(mistakes, Mapping) else mistakes:
        try:
            with np.errstate(all="ignore"):
                found.append((description, wrong()))
        except Exception:
            continue
    return found


def _matches(check: Check, got, wrong, name: str = "output") -> bool:
    """Whether ``got`` is ``wrong`` within the check's tolerance for the output ``name``
    (``"output['frequencies']"``), non-finite entries included."""
    if isinstance(wrong, dict):
        return (isinstance(got, dict) and got.keys() == wrong.keys()
                and all(_matches(check, got[k], wrong[k], f"{name}[{k!r}]") for k in wrong))
    if isinstance(wrong, (tuple, list)):
        return (isinstance(got, (tuple, list)) and len(got) == len(wrong)
                and all(_matches(check, g, w, f"{name}[{i}]")
                        for i, (g, w) in enumerate(zip(got, wrong, strict=True))))
    if wrong is None or isinstance(wrong, str):
        return got == wrong
    try:
        g, w = np.asarray(got), np.asarray(wrong)
        if g.shape != w.shape:
            return False
        if not (np.issubdtype(g.dtype, np.floating) and np.issubdtype(w.dtype, np.floating)):
            return bool(np.array_equal(g, w))
        finite = np.isfinite(w)
        if not np.array_equal(finite, np.isfinite(g)) or not np.array_equal(
                g[~finite], w[~finite], equal_nan=True):
            return False
        return rel_error(g[finite], w[finite]) <= check.tolerance(name, w)
    except (TypeError, ValueError):
        return False


def _generic_hint(problem: Difference) -> str:
    got, want = problem.got, problem.want
    if not isinstance(got, np.ndarray) or not isinstance(want, np.ndarray):
        return ""
    if got.shape != want.shape:
        squeezed = [tuple(s for s in a.shape if s != 1) for a in (got, want)]
        return next((text for wrong, text in (
            (squeezed[0] == squeezed[1],
             "an axis of length 1 too many or too few: keepdims=True where you reduce?"),
            (got.size == want.size, "the right number of entries in the wrong shape: a reshape "
                                    "or transpose that does not match the expected layout?"),
            (got.ndim == want.ndim and sorted(got.shape) == sorted(want.shape),
             "the axes are in another order: a transposed result or weight?"),
            (got.ndim > want.ndim and got.shape[got.ndim - want.ndim:] == want.shape,
             f"the leading axes {got.shape[:got.ndim - want.ndim]} are still there: a weight's "
             "or a bias's gradient sums over them, the batch (and the positions), as the "
             "weight is shared by every row")) if wrong), "")
    if got.dtype != want.dtype and np.issubdtype(got.dtype, np.floating):
        if want.dtype == np.float32 and got.dtype == np.float64:
            return ("a float32 input came back as float64: something float64 met it and "
                    "promoted it -- a bool or integer array times a Python float (mask * 0.5 "
                    "is float64: write mask.astype(x.dtype) * 0.5), a float64 array (np.ones, "
                    "np.zeros without dtype=, np.where(mask, -np.inf, 0.0)), a NumPy float64 "
                    "scalar (x / np.sqrt(d): use d ** 0.5, a Python float) or a NumPy integer "
                    "one (x / mask.sum(): use int(mask.sum())); cast with .astype(x.dtype) "
                    "where it is made")
        return ""
    if want.dtype == bool and got.dtype != bool:
        return (f"a boolean mask is expected, and yours is {got.dtype}: comparisons (<, >=, ==) "
                f"give bool arrays; keep them bool (no .astype(int))")
    if not np.all(np.isfinite(got)):
        return ("NaN or inf appears where exp overflows (subtract the maximum first), where "
                "exp underflows to 0 and then divides or is logged (0/0, log 0: a row with "
                "nothing to attend to? a softmax whose log is taken?), where -inf - (-inf) does "
                "(a maximum of -inf only, subtracted from -inf scores: shift by 0 there), or "
                "where 0 * inf does (a factor that is infinite for an edge case)")
    if not np.all(np.isfinite(want)):  # (rel_error takes finite arrays)
        return ""
    tiny = np.finfo(got.dtype).tiny if np.issubdtype(got.dtype, np.floating) else 0
    if np.any((got != 0) & (np.abs(got) < tiny) & (np.abs(want) >= tiny)):
        return ("some entries are numbers no computation here makes (subnormal, such as "
                "1e-312): memory never written, np.empty's leftovers. Does a loop stop before "
                "the last, shorter block (range(0, T - b + 1, b))? range(0, T, b) visits every one")
    g, w = got.astype(np.float64).ravel(), want.astype(np.float64).ravel()
    floating = np.issubdtype(want.dtype, np.floating)  # ids, counts, masks have no sign or scale
    if floating and rel_error(g, -w) < 1e-6:
        return "your answer is the negative of the expected one: a sign error?"
    if got.ndim >= 2 and got.shape[-1] == got.shape[-2] and rel_error(
            np.swapaxes(got, -1, -2), want) < 1e-6:
        return "your answer is the transpose of the expected one (the last two axes swapped)"
    if not floating:
        return ""
    if want.dtype == np.float64 and rel_error(g, w) < 1e-4:
        return ("close, but not to float64's tolerance: usually a float32 step on the way (an "
                "array or table made in float32), or a small constant such as eps missing or "
                "of another value")
    ww = float(w @ w)
    if ww > 0:
        c = float(g @ w) / ww
        # one number is always some factor times another: for one, only a plain factor (2,
        # 1/5, sqrt(8)) points at a missing or extra one
        plain = w.size > 1 or (c != 0 and any(abs(x - round(x)) < 1e-6 * x for x in (
            abs(c), 1 / abs(c), c * c, 1 / (c * c))))
        if plain and c != 0 and abs(c - 1) > 1e-3 and rel_error(g, c * w) < 1e-6:
            return (f"your answer is {c:.4g} times the expected one everywhere: a missing or "
                    "extra factor -- a mean where a sum belongs (or the reverse), the 2 of a "
                    "square's derivative, or a scale such as attention's 1/sqrt(d_k)?")
    return ""


# --------------------------------------------------------------------------------------------
# Plain data: encoding for the grader's probe and for stored answers


def encode(value, arrays: dict[str, np.ndarray]) -> Any:
    """A JSON-ready form of plain data; arrays go into ``arrays`` under generated keys."""
    if isinstance(value, np.ndarray):
        key = f"a{len(arrays)}"
        arrays[key] = value
        return {"__array__": key}
    if isinstance(value, np.generic):
        return {"__scalar__": value.dtype.str, "value": value.item()}
    if isinstance(value, float) and not math.isfinite(value):
        return {"__float__": repr(value)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tuple):
        return {"__tuple__": [encode(v, arrays) for v in value]}
    if isinstance(value, list):
        return [encode(v, arrays) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("dict keys must be strings")
        return {"__dict__": {k: encode(v, arrays) for k, v in value.items()}}
    raise TypeError(f"it holds a value of type {type(value).__name__!r}, not plain data (arrays, "
                    "numbers, strings, None, and lists, tuples and dicts of them)")


def decode(value, arrays: Mapping[str, np.ndarray]) -> Any:
    """The inverse of :func:`encode`."""
    if isinstance(value, list):
        return [decode(v, arrays) for v in value]
    if isinstance(value, dict):
        if "__array__" in value:
            return np.array(arrays[value["__array__"]])
        if "__scalar__" in value:
            return np.dtype(value["__scalar__"]).type(value["value"])
        if "__float__" in value:
            return float(value["__float__"])
        if "__tuple__" in value:
            return tuple(decode(v, arrays) for v in value["__tuple__"])
        if "__dict__" in value:
            return {k: decode(v, arrays) for k, v in value["__dict__"].items()}
        raise ValueError(f"not an encoded value: {value!r}")
    return value


def save_values(path: Path, values: Mapping[str, Any]) -> None:
    """Store named plain data in one ``.npz`` (arrays) with a JSON header; no pickle."""
    arrays: dict[str, np.ndarray] = {}
    header = {name: encode(v, arrays) for name, v in values.items()}
    write_archive(path, header, arrays)


def load_values(path: Path) -> dict[str, Any]:
    """Read what :func:`save_values` stored."""
    header, arrays = read_archive(path)
    return {name: decode(v, arrays) for name, v in header.items()}


def stored_expected(check: Check) -> dict[str, tuple[Case, Any]]:
    """case name -> (case, expected) stored for a check whose reference is not here."""
    path = DATA_DIR / f"{check.id}.npz"
    if not path.exists():
        raise FileNotFoundError(f"{check.id}: neither its reference nor its stored answers "
                                f"({path.name}) are here")
    stored = load_values(path)
    return {name: (Case(name, tuple(entry["args"]), entry["kwargs"]), entry["expected"])
            for name, entry in stored.items()}


def _wrong_answers(check: Check, case: Case, want: Any) -> dict[str, Any]:
    """The answers of the check's mistakes in one case that differ from ``want`` (plain data)."""
    found = {}
    for description, answer in _mistake_answers(check, case):
        try:
            encode(answer, {})
        except Exception:
            continue
        if answer is not None and not _matches(check, want, answer):
            found[description] = answer
    return found


def store_expected(check: Check, folder: Path) -> Path:
    """Write the public cases of ``check`` and their expected answers to ``folder`` (used by
    ``make student`` for checks whose reference the handout does not contain)."""
    folder.mkdir(parents=True, exist_ok=True)
    entries = {}
    for case in all_cases(check, hidden=False):
        want = check.expected(*case.args, **case.kwargs)
        entries[case.name] = {"args": list(case.args), "kwargs": case.kwargs, "expected": want,
                              "mistakes": _wrong_answers(check, case, want)}
    path = folder / f"{check.id}.npz"
    save_values(path, entries)
    return path


# --------------------------------------------------------------------------------------------
# The culprit: a function the checked one calls, wrong in its own check


def _verdicts(chk: Check, f: Functions, hidden=False) -> Iterator[tuple[Outcome, Verdict | None]]:
    """The outcome of each case of ``chk`` in turn (the public ones, then with ``hidden`` the
    hidden ones) and its verdict against the expected answer: computed where the reference is
    here, else the answer ``make student`` stored (the handout), with its mistakes' answers.
    Stops after a stub's NotImplementedError, whose verdict is None (not written yet)."""
    if chk.has_reference():
        cases, hints = [(c, None) for c in all_cases(chk, hidden=hidden)], {}
    else:  # the handout names the mistakes by their answers, stored with the right ones
        cases = list(stored_expected(chk).values())
        hints = {name: entry.get("mistakes", {})
                 for name, entry in load_values(DATA_DIR / f"{chk.id}.npz").items()}
    loops = {name: python_loops(getattr(f, name), name in chk.stepwise) for name in chk.loop_free}
    for case, stored in cases:
        outcome = run_case(chk, f, case)
        if outcome.error is not None and is_stub(outcome.error):
            yield outcome, None
            return
        want = chk.expected(*case.args, **case.kwargs) if chk.has_reference() else stored
        yield outcome, judge(chk, case, outcome, want, hints.get(case.name), loops)


def depends_on(chk: Check, f: Functions | None = None) -> set[str]:
    """The core functions that ``chk``'s functions call (:data:`syllabus.CALLS`), directly or
    not, without its own; for a notebook function, the core functions its code names too
    (in the functions it defines inside as well); and those its cases reach through the
    package (:attr:`Check.reaches`), with theirs."""
    known = {n for functions in syllabus.TAUGHT_IN.values() for n in functions}
    own = set(chk.functions)
    used = {n for name in (chk.arguments if f is not None else ())
            for code in _code_objects(getattr(f, name)) for n in code.co_names if n in known} - own
    used |= set(chk.reaches)
    return (set(syllabus.dependencies([*chk.functions, *used])) | used) - own


def _teaching_order(chk) -> tuple[str, int]:
    """(notebook, line of the check's class in its module): checks of one notebook are written
    in the order of its cells."""
    try:
        line = inspect.getsourcelines(chk if isinstance(chk, type) else type(chk))[1]
    except (OSError, TypeError):
        line = 0
    return chk.notebook, line


def dependency_checks(chk: Check, f: Functions | None = None) -> list[type[Check]]:
    """The checks of core functions that ``chk`` depends on, in teaching order: a check that
    comes before it (an earlier notebook, or earlier in this one) and tests functions of
    :func:`depends_on` -- besides some of ``chk``'s own (check-gpt-rms-norm tests norm_forward
    with rms_norm_forward), and fewer others than those (check-rope tests rope_tables, which a
    block is given the output of, with rope_forward and rope_backward, which it calls) --
    never a later section's check, which the student has not reached."""
    needed, own = depends_on(chk, f), set(chk.functions)
    here = _teaching_order(chk)
    return [other for other in load_checks().values()
            if other.id != chk.id and not other.arguments and _mostly(other, needed, own)
            and _teaching_order(other) < here]


def _mostly(other: type[Check], needed: set[str], own: set[str]) -> bool:
    """Whether ``other`` tests more of the functions ``needed`` than of the rest (``own``
    aside)."""
    tested = set(other.functions)
    return len(tested & needed) > len(tested - needed - own)


def _listed(words: list[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    return " and ".join(filter(None, [", ".join(words[:-1]), words[-1]]))


def _place(function: str, notebook: str) -> str:
    """"notebook 04 §2": where ``function`` is taught for ``notebook``'s checks (every section of
    that notebook that teaches or extends it: "notebook 15 §2, §3")."""
    places = next(fs[function] for fs in syllabus.TAUGHT_IN.values() if function in fs)
    nb = max((p.split(" §")[0] for p in places if p.split(" §")[0] <= notebook),
             default=places[0].split(" §")[0])
    sections = [p.partition(" §")[2] for p in places if p.split(" §")[0] == nb]
    return f"notebook {nb[:2]} " + ", ".join(f"§{s}" for s in sections)


def _first_failure(chk: Check) -> str | None:
    """The verdict's message of the first public case of ``chk`` that fails (None: they pass,
    or a function is not written yet)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return next((verdict and verdict.message for _, verdict in _verdicts(
            chk, functions_for(chk)) if verdict is None or not verdict.passed), None)


def culprit(chk: Check, f: Functions | None = None) -> str:
    """When ``chk`` failed: a paragraph naming the first function it depends on (in teaching
    order) that fails its own check, or ''. Runs the public cases of those checks, so it is
    called only after a failure; never raises."""
    try:
        for other_cls in dependency_checks(chk, f):
            other = other_cls()
            try:
                failure = _first_failure(other)
            except Exception:  # a stored answer missing, a reference unavailable: say nothing
                continue
            if failure is None:
                continue
            names = list(other.functions)
            message, _, hint = failure.partition("\n  Hint: ")  # judge's verdict, its hint last
            first = message.split("\n", 1)[0].removesuffix("; the two in full:")
            first += f" Hint: {hint}" if hint else ""
            places: dict[str, list[str]] = {}  # each function with where it is taught
            for n in names:
                places.setdefault(_place(n, other.notebook), []).append(f"`{n}`")
            culprits = _listed([f"{_listed(ns)} ({p})" for p, ns in places.items()])
            lead = (f"{culprits} fails `{other.id}`; fix it" if len(names) == 1 else
                    f"`{other.id}`, the check of {culprits}, fails; fix what it names")
            return f"{lead}, then run this check again.\n  ({other.id}: {first})\n"
        return ""
    except Exception:  # finding the culprit must never hide the verdict
        return ""


# --------------------------------------------------------------------------------------------
# The notebook's entry point


def check(check_id: str, *functions: Callable, **named: Callable) -> None:
    """Run the check ``check_id`` on your code; print one line when every case passes.

    ``check("check-softmax-forward")`` tests core functions of the package (your
    ``transformer_lab/core/*.py``); ``check("check-logsumexp", logsumexp)`` tests the
    function(s) you defined in the notebook. Raises :class:`CheckFailed` naming the first case
    that fails, what was expected and what came back -- after, where a core function that the
    checked one calls fails its own check, that function (:func:`culprit`; the check cell only:
    the grader judges each check on its own).
    """
    try:  # the checks, then the core modules they test (imported when first used)
        chk = get_check(check_id)
        f = functions_for(chk, functions, named)
        _compile_core(chk.functions)
    except SyntaxError as e:  # a core module of the student's that does not parse
        raise CheckFailed(f"{check_id} did not run: {e.filename}, line {e.lineno}, does not "
                          f"parse ({type(e).__name__}: {e.msg}); fix it, save, and run the "
                          "check again") from None
    try:
        note = "".join(_outside_note(n, getattr(f, n)) for n in chk.arguments)
    except Exception:  # a note must never stop the check
        note = ""
    try:
        for outcome, verdict in _verdicts(chk, f, hidden=True):
            if verdict is None:
                raise CheckFailed(f"{check_id}: {outcome.error.split(': ', 1)[-1]}")
            if not verdict.passed:
                # a function this one calls, wrong in its own check, comes first: fix that one
                raise CheckFailed(f"{check_id} failed.\n{culprit(chk, f)}{verdict.message}"
                                  f"{note}")
    except NotImplementedError as err:  # a stub the check's own code called: its cases'
        if not is_stub(f"NotImplementedError: {err}"):  # model, initialised by notebook 07's
            raise
        raise CheckFailed(f"{check_id} did not run: it makes its cases with a function not "
                          f"written yet -- {err}") from None
    public = len(list(chk.cases(case_rng(chk.id))))  # the handout stores their answers only
    print(f"{check_id} passed ({public} case{'s' * (public != 1)}).{_torch_note(chk)}{note}")


def _compile_core(functions: Iterable[str]) -> None:
    """Compile, as saved now, the core modules of ``functions`` and of the core functions they
    call: a SyntaxError where one does not. Autoreload keeps a module whose edit does not parse
    as it was, so the check would otherwise pass or fail the version from before the edit."""
    names = [*functions, *syllabus.dependencies(functions)]
    for module in sorted({syllabus.where_taught(name)[0] for name in names}):
        path = Path(importlib.import_module(f"transformer_lab.core.{module}").__file__)
        compile(path.read_text(encoding="utf-8"), str(path), "exec", dont_inherit=True)


#: What the grader runs of a notebook, which a notebook function must not count on more of.
OTHER_CELLS = ("The grader runs your exercise cells, but of the other cells only their "
               "functions, classes and imports (a variable or a lambda set there is left out): "
               "set it in the exercise's cell or inside the function")


def _outside_note(name: str, function: Callable) -> str:
    """A line naming the globals that the notebook function ``function`` reads -- in its body,
    its def's defaults, annotations and decorators, or a notebook function it calls -- and
    that the grader leaves out: bound last by an assignment in a cell that is no exercise cell
    (none defines a function a check takes), or ''. Read from IPython's cells (``In``); ''
    where there are none."""
    cells = getattr(function, "__globals__", {}).get("In")
    if not isinstance(function, types.FunctionType) or not isinstance(cells, list):
        return ""
    exercises = {a for chk in load_checks().values() for a in chk.arguments}
    kept: dict[str, bool] = {}  # name -> whether its last binding reaches the grader
    defs: dict[str, ast.AST] = {}  # name -> its last def
    for tree in map(_parsed, cells):
        exercise = any(getattr(n, "name", None) in exercises for n in tree.body)
        for bound, node in _bindings(tree, scope=True):
            kept[bound] = exercise or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef |
                                                 ast.ClassDef | ast.alias)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                defs[bound] = node
    reads: set[str] = set()
    seen, todo = [], [function]
    while todo:  # the function, and the notebook's functions it reaches by a global name
        f = todo.pop()
        if f in seen:
            continue
        seen.append(f)
        names = {ins.argval for c in _code_objects(f) for ins in dis.get_instructions(c)
                 if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
        reads |= names
        todo += [g for n in names if isinstance(g := f.__globals__.get(n), types.FunctionType)
                 and g.__module__ == f.__module__]
        node = defs.get(f.__name__)
        if node is not None:  # evaluated when its cell runs: the def's own line
            outer = [*node.args.defaults, *node.args.kw_defaults, *node.decorator_list,
                     node.returns, *(a.annotation for a in ast.walk(node.args)
                                     if isinstance(a, ast.arg))]
            reads |= {n.id for part in filter(None, outer) for n in ast.walk(part)
                      if isinstance(n, ast.Name)}
    outside = sorted(n for n in reads if kept.get(n) is False)
    if not outside:
        return ""
    names = ", ".join(f"`{n}`" for n in outside)
    return (f"\nNote: `{name}` reads {names} (itself, or a function it calls), set in another "
            f"cell. {OTHER_CELLS}, or the grader finds it undefined.")


def _parsed(source) -> ast.Module:
    try:
        return ast.parse(source if isinstance(source, str) else "")
    except SyntaxError:
        return ast.Module(body=[], type_ignores=[])


def _torch_note(chk: Check) -> str:
    """A line naming the core functions of ``chk`` whose code uses torch, or ''."""
    names = [f"`{n}`" for n in chk.functions
             if any("torch" in code.co_names for code in _code_objects(core_function(n)))]
    return (f"\nNote: {', '.join(names)} use{'s' * (len(names) == 1)} torch; the course writes "
            "the core in NumPy (the models run it on CuPy too), and the grader flags it."
            if names else "")
