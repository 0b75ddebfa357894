"""Where the core runs: NumPy on the CPU (the default), or CuPy on an NVIDIA GPU.

    from transformer_lab import device
    device.use("cuda")      # the core -- yours, or the solution -- computes with CuPy from now on
    model = GPT(config)     # its parameters live on the GPU, and so do its outputs
    device.to_host(model.generate(prompt, 50, seed=0))    # a NumPy array again

or ``python -m transformer_lab.train --task charlm --device cuda`` (any task).

The core is written against ``np`` alone (``import numpy as np``, arrays made with ``np.``
functions or from their inputs), and the exact GELU reaches SciPy's error function by the name
``erf``. :func:`use` binds these two names in every core module to CuPy's (``cupy``,
``cupyx.scipy.special.erf``), so the same functions run on the GPU; ``use("cpu")`` binds them
back. It reads the core's source and refuses (:class:`DeviceError`, naming the function
and the line) what the binding would not reach -- ``from numpy import zeros``, ``numpy.zeros``,
a core function replaced by one defined elsewhere: it would make host arrays among the GPU's --
and each ``np.<name>`` that the installed CuPy lacks (CuPy 13 has no ``put_along_axis``), and
each ``rng.<method>`` that CuPy's generators lack (``choice``, ``normal``; the name ``rng`` is
the core's for its generators).

The models put their parameters on the device (:func:`put`) when they are made or loaded, take
ids and gradients from the host or the device and return arrays of the device; the optimisers
update the parameters where they live; checkpoints are written from host copies
(:func:`to_host`). Random draws (dropout, sampling) come from the device's generator
(:func:`generator`), seeded as on the CPU: a GPU run is repeatable, but CuPy draws other numbers
than NumPy and sums in another order, so it does not reproduce the CPU's run bit for bit. Arrays
left on a device after ``use("cpu")`` come back through :func:`put` and :func:`to_host`
(``model.copy()``). CuPy is an optional extra (:data:`INSTALL`), imported by ``use("cuda")``
only.
"""

from __future__ import annotations

import ast
import importlib
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy

#: The devices by name (:func:`use` also takes an array module standing in for one: the tests').
DEVICES = ("cpu", "cuda")
#: What to install for device "cuda" (the course's ``gpu`` extra is the first wheel).
INSTALL = ("pip install the CuPy wheel for this machine's CUDA, cupy-cuda12x for CUDA 12 or "
           "cupy-cuda13x for CUDA 13 (nvidia-smi shows the version; 'cupy-cuda12x[ctk]' brings "
           "CUDA's libraries too, where no CUDA toolkit is installed), or, on Colab, choose a GPU "
           "runtime (Runtime > Change runtime type)")
#: What the trainers' ``--device`` means (their ``--help``).
HELP = ("where the core runs: cpu (NumPy, the default) or cuda (CuPy on an NVIDIA GPU: pip install "
        "cupy-cuda12x, or cupy-cuda13x); a cuda run draws its random numbers with CuPy's "
        "generator and sums in another order, so it does not reproduce a cpu run bit for bit")
_LIBRARIES = ("numpy", "scipy", "cupy", "cupyx", "torch")
_CORE = Path(__file__).parent / "core"

xp = numpy  # the array module the core runs on now
name = "cpu"  # and the device's name
_used: list = []  # the array modules other than NumPy it has run on (their arrays' way home)


class DeviceError(RuntimeError):
    """The core cannot run on the device asked for: no CuPy, no GPU, or a core function that
    reaches NumPy by another name than ``np``."""


def use(device) -> None:
    """Run the core on ``device``: "cpu", "cuda", or an array module standing in for a device
    (NumPy's namespace and ``erf``: the tests'). Raises DeviceError, binding nothing, when it
    cannot: for "cuda", first for a core function that reaches NumPy by another name (no GPU
    needed to find it), then for CuPy and the GPU, then for what the installed CuPy lacks."""
    global xp, name
    if device == "cpu":
        from scipy.special import erf
        module = numpy
    elif device == "cuda":
        _refuse(core_problems())
        module, erf = _cupy()
    elif isinstance(device, str) or not (hasattr(device, "ndarray") and hasattr(device, "erf")):
        raise ValueError(f"device must be one of {DEVICES} (or an array module with erf), got "
                         f"{device!r}")
    else:
        module, erf = device, device.erf
    if module is not numpy:
        _refuse(core_problems(module))
        if module not in _used:
            _used.append(module)
    for core_module in core_modules():
        for attr, value in (("np", module), ("erf", erf)):
            if attr in vars(core_module):
                setattr(core_module, attr, value)
    xp, name = module, device if isinstance(device, str) else module.__name__


@contextmanager
def on(device):
    """The core on ``device`` inside the block, where it ran before after it."""
    before = name if name in DEVICES else xp
    use(device)
    try:
        yield
    finally:
        use(before)


def put(a):
    """``a`` on the device: an array of the device as it is, anything else (a host array, an
    array of a device the core has left) copied there."""
    return a if xp is not numpy and isinstance(a, xp.ndarray) else xp.asarray(to_host(a))


def to_host(a):
    """``a`` on the host: an array of a device (the core's now, or one it has left) copied into
    a NumPy array, anything else as it is."""
    module = next((m for m in _used if isinstance(a, m.ndarray)), None)
    return module.asnumpy(a) if module else a


def on_device(a) -> bool:
    """Whether ``a`` is an array of the device the core runs on."""
    return isinstance(a, xp.ndarray)


def generator(seed=None):
    """The device's random generator (NumPy's or CuPy's ``random.default_rng(seed)``)."""
    return xp.random.default_rng(seed)


def _refuse(problems: list[str]) -> None:
    if problems:
        raise DeviceError("the core cannot run on the device: " + "; ".join(problems))


def _cupy():
    try:
        cupy = importlib.import_module("cupy")
        special = importlib.import_module("cupyx.scipy.special")
    except ImportError as e:  # not installed, or installed but broken (CuPy says why)
        state = "which is not installed" if getattr(e, "name", None) in ("cupy", "cupyx") else \
            f"which does not import here ({type(e).__name__}: {e})"
        raise DeviceError(f"device 'cuda' runs the core with CuPy, {state}: {INSTALL}") from None
    try:
        cupy.arange(3).sum().item()  # a first kernel: the driver, the GPU and CuPy's compiler
    except Exception as e:  # CUDARuntimeError, CompileException, ...: CuPy says what
        raise DeviceError(f"device 'cuda' needs an NVIDIA GPU that CuPy can use; CuPy failed "
                          f"here ({type(e).__name__}: {e}); where CUDA's libraries are missing, "
                          f"pip install 'cupy-cuda12x[ctk]' (or cupy-cuda13x[ctk]); else use "
                          f"device 'cpu'") from None
    return cupy, special.erf


def core_modules() -> list:
    """The modules of :mod:`transformer_lab.core` that compute with ``np`` (imported)."""
    return [importlib.import_module(f"transformer_lab.core.{path.stem}")
            for path in sorted(_CORE.glob("*.py")) if "import numpy as np" in path.read_text()]


def core_problems(xp=numpy) -> list[str]:
    """What binding ``np`` and ``erf`` to array module ``xp``'s would not reach, or not find,
    one message each: ``"core/layers.py, line 88, in gelu_forward: ..."``."""
    problems = []
    for path in sorted(_CORE.glob("*.py")):
        tree = ast.parse(path.read_text())
        problems += [f"core/{path.name}, line {line}, in {where}: {what}"
                     for line, where, what in _source_problems(tree, xp)]
        module = sys.modules.get(f"transformer_lab.core.{path.stem}")  # replaced only if imported
        for node in tree.body if module else ():
            fn = getattr(module, getattr(node, "name", ""), None)
            if isinstance(node, ast.FunctionDef) and getattr(fn, "__globals__", vars(module)) \
                    is not vars(module):
                code = fn.__code__
                problems.append(f"core/{path.name}: {node.name} was replaced by a function "
                                f"defined in {code.co_filename}, line {code.co_firstlineno}, "
                                f"whose np is not the core's; write it into core/{path.name}")
    return problems


def _source_problems(tree: ast.Module, xp):
    """(line, function, message) for each use of an array library other than ``np`` and
    ``erf`` imported at the top of the module, each call of those at import time, and each
    ``np.<name>`` (``np.linalg.<name>``, ...) or ``rng.<method>`` that ``xp`` lacks."""
    top = "the module's top level"
    missing = set()
    host = "reaches the host's library, which the switch does not rebind: use the module's np"

    def walk(node, where):
        for child in ast.iter_child_nodes(node):
            yield child, where
            named = isinstance(child, (ast.FunctionDef, ast.ClassDef)) and where == top
            yield from walk(child, child.name if named else where)

    for node, where in walk(tree, top):
        line = getattr(node, "lineno", None)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in _LIBRARIES and not (
                        where == top and (alias.name, alias.asname) == ("numpy", "np")):
                    yield line, where, f"'{ast.unparse(node)}' {host}"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in _LIBRARIES:
            if not (where == top and node.module == "scipy.special"
                    and [(a.name, a.asname) for a in node.names] == [("erf", None)]):
                yield line, where, f"'from {node.module} import ...' {host}"
        elif isinstance(node, ast.Name) and node.id in _LIBRARIES:
            yield line, where, f"'{node.id}.' spelled out: write np.<function>"
        elif where == top and isinstance(node, ast.Call) and \
                (call := ast.unparse(node.func)).split(".")[0] in ("np", "erf"):
            yield line, where, f"{call}(...) at import time makes a host array"
        elif (lack := _lacks(xp, node)) and (line, lack) not in missing:
            missing.add((line, lack))
            library = f"{xp.__name__} {getattr(xp, '__version__', '')}".strip()
            if lack.startswith("np."):
                yield line, where, (f"{lack} is not in {library}: write it with the functions "
                                    f"it has, or install a newer version")
            else:
                has = ", ".join(m for m in dir(xp.random.Generator) if not m.startswith("_"))
                yield line, where, (f"{lack} is not a method of {library}'s random.Generator, "
                                    f"which has {has}")


def _lacks(xp, node) -> str | None:
    """``"np.put_along_axis"`` when ``node`` is that name, or one under it, and ``xp`` lacks
    it; ``"rng.choice"`` when ``xp``'s generators lack that method; else None."""
    path = []
    while isinstance(node, ast.Attribute):
        path.insert(0, node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id == "rng" and path:  # a generator, by its name
        return None if hasattr(xp.random.Generator, path[0]) else f"rng.{path[0]}"
    if not (isinstance(node, ast.Name) and node.id == "np"):
        return None
    for i, attr in enumerate(path):
        if not hasattr(xp, attr):  # (np.newaxis is None: a value, not a miss)
            return "np." + ".".join(path[:i + 1])
        xp = getattr(xp, attr)
    return None
