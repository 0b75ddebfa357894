"""Where the core runs: NumPy on the CPU (the default), or CuPy on an NVIDIA GPU.

    from transformer_lab import device
    device.use("cuda")      # the core -- yours, or the solution -- computes with CuPy from now on
    model = GPT(config)     # its parameters are put on the GPU, and so are its outputs
    device.to_host(model.generate(prompt, 50, seed=0))    # a NumPy array again
    device.use("cpu")

or ``python -m transformer_lab.train --task charlm --device cuda`` (any task).

**How.** The core is written against ``np`` alone: each module of :mod:`transformer_lab.core`
imports ``numpy as np`` and makes its arrays with ``np.`` functions or from its inputs, and the
exact GELU reaches SciPy's error function by the name ``erf``. :func:`use` binds these two names
in every core module to CuPy's (``cupy``, ``cupyx.scipy.special.erf``), so the same functions run
on the GPU, and ``use("cpu")`` binds them back. Before it binds, it reads the core's source and
refuses a function that reaches NumPy or SciPy by another name (``from numpy import zeros``,
``numpy.zeros``, ``import scipy``) or a core function replaced by one defined elsewhere: they
would make host arrays in the middle of the GPU's (:class:`DeviceError`, naming the function and
the line).

**What follows it.** The models put their parameters on the device when they are made or loaded
(:func:`put`), take token ids and gradients from the host or the device, and return arrays on
the device; the optimisers update the parameters where they live; checkpoints are written from
host copies (:func:`to_host`); the trainers take ``--device`` and report Python floats.

**Random draws** on the GPU (dropout's masks, sampling) come from CuPy's generator
(:func:`generator`), seeded as on the CPU: a run is repeatable on its device, but CuPy draws other
numbers than NumPy and sums in another order, so a GPU run does not reproduce the CPU's bit for
bit. The initial parameters are drawn on the host: the same on both.

CuPy is an optional extra (``pip install -e .[gpu]``); nothing imports it before ``use("cuda")``.
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
#: What the trainers' ``--device`` means (their ``--help``).
HELP = ("where the core runs: cpu (NumPy, the default) or cuda (CuPy on an NVIDIA GPU: pip "
        "install -e .[gpu]); a cuda run draws its random numbers with CuPy's generator and sums "
        "in another order, so it does not reproduce a cpu run bit for bit")
#: The names by which the core reaches its array library.
NAMES = ("np", "erf")
_LIBRARIES = ("numpy", "scipy", "cupy", "cupyx")
_CORE = Path(__file__).parent / "core"

xp = numpy  # the array module the core runs on now
name = "cpu"  # and the device's name


class DeviceError(RuntimeError):
    """The core cannot run on the device asked for: no CuPy, no GPU, or a core function that
    reaches NumPy by another name than ``np``."""


def use(device) -> None:
    """Run the core on ``device``: "cpu" (NumPy), "cuda" (CuPy, an NVIDIA GPU), or an array
    module standing in for a device (NumPy's namespace and ``erf``; the tests'). Raises
    DeviceError, binding nothing, when it cannot."""
    global xp, name
    module, erf = _library(device)
    if module is not numpy:
        problems = core_problems()
        if problems:
            raise DeviceError("the core cannot run on the device: " + "; ".join(problems))
    for core_module in core_modules():
        for attr, value in zip(NAMES, (module, erf), strict=True):
            if attr in vars(core_module):
                setattr(core_module, attr, value)
    xp, name = module, device if isinstance(device, str) else module.__name__


@contextmanager
def on(device):
    """``with device.on("cuda"): ...`` -- the core on ``device`` inside the block, on the device
    it ran on before after it."""
    before = xp if name not in DEVICES else name
    use(device)
    try:
        yield
    finally:
        use(before)


def put(a):
    """``a`` on the device: an array of the device as it is, anything else (a NumPy array, a
    list) copied there."""
    return a if isinstance(a, xp.ndarray) else xp.asarray(a)


def to_host(a):
    """``a`` on the host: an array of the device copied into a NumPy array; anything else (a host
    array, a number) as it is."""
    return xp.asnumpy(a) if xp is not numpy and isinstance(a, xp.ndarray) else a


def generator(seed=None):
    """A random generator of the device, seeded with ``seed`` (what ``np.random.default_rng``
    takes): NumPy's on the CPU, CuPy's on the GPU (other numbers than NumPy's)."""
    return xp.random.default_rng(seed)


def is_array(a) -> bool:
    """Whether ``a`` is an array, of the host or of the device."""
    return isinstance(a, (numpy.ndarray, xp.ndarray))


def on_device(a) -> bool:
    """Whether ``a`` is an array of the device the core runs on."""
    return isinstance(a, xp.ndarray)


def _library(device):
    """(array module, its erf) of ``device``."""
    if device == "cpu":
        from scipy.special import erf
        return numpy, erf
    if device == "cuda":
        return _cupy()
    if isinstance(device, str) or not hasattr(device, "ndarray"):
        raise ValueError(f"device must be one of {DEVICES} (or an array module), got {device!r}")
    return device, device.erf


def _cupy():
    try:
        cupy = importlib.import_module("cupy")
        special = importlib.import_module("cupyx.scipy.special")
    except ImportError:
        raise DeviceError(
            "device 'cuda' runs the core with CuPy, which is not installed: pip install the CuPy "
            "wheel for this machine's CUDA -- cupy-cuda12x for CUDA 12, cupy-cuda13x for CUDA 13 "
            "(nvidia-smi shows the version; pip install -e .[gpu] gives cupy-cuda12x) -- or, on "
            "Colab, choose a GPU runtime (Runtime > Change runtime type) first") from None
    try:
        cupy.arange(3).sum().item()  # a first kernel: the driver, the GPU and CuPy's compiler
    except Exception as e:  # CUDARuntimeError, CompileException, ...: CuPy says what
        raise DeviceError(f"device 'cuda' needs an NVIDIA GPU that CuPy can use, and CuPy "
                          f"failed on this machine ({type(e).__name__}: {e}); on a machine "
                          f"without one, use device 'cpu'") from None
    return cupy, special.erf


# --------------------------------------------------------------------------------------------
# The core's modules, and what would keep one of them on the host


def core_modules() -> list:
    """The modules of :mod:`transformer_lab.core` that compute with ``np`` (imported)."""
    return [importlib.import_module(f"transformer_lab.core.{path.stem}")
            for path in sorted(_CORE.glob("*.py")) if "import numpy as np" in path.read_text()]


def core_problems() -> list[str]:
    """Everything in the core that binding ``np`` and ``erf`` would not reach, one message
    each: ``"core/layers.py, line 88, in gelu_forward: ..."``."""
    problems = []
    for path in sorted(_CORE.glob("*.py")):
        tree = ast.parse(path.read_text())
        problems += [f"core/{path.name}, line {line}, in {where}: {what}"
                     for line, where, what in _source_problems(tree)]
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


def _source_problems(tree: ast.Module):
    """(line, function, message) for each use of an array library that is not ``np`` or
    ``erf`` imported at the top of the module, and each use of those at import time."""
    top = "the module's top level"

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
                        where == top and alias.name == "numpy" and alias.asname == "np"):
                    yield line, where, (f"'import {alias.name}' reaches an array library by "
                                        f"another name than np; write np.<function>")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in _LIBRARIES:
            if not (where == top and node.module == "scipy.special"
                    and [(a.name, a.asname) for a in node.names] == [("erf", None)]):
                yield line, where, (f"'from {node.module} import ...' reaches an array library "
                                    f"by another name than np; write np.<function>")
        elif isinstance(node, ast.Name) and node.id in _LIBRARIES:
            yield line, where, f"'{node.id}.' spelled out; write np.<function>"
        elif isinstance(node, ast.Name) and node.id in NAMES and where == top:
            yield line, where, (f"{node.id} used at import time makes a host array; make it "
                                f"inside a function")
