"""A stand-in for a GPU's array library, on the CPU: NumPy behind a thin wrapper, so that the
tests can bind the core to a "device" (``transformer_lab.device.use(standin)``) on a machine
without CuPy or a GPU.

Its arrays are :class:`DeviceArray`, an ndarray subclass that behaves as CuPy's arrays do where
it matters for a leak: an operation that mixes one with a host (plain NumPy) array raises
:class:`HostArrayError` (CuPy raises TypeError), reductions give 0-d device arrays, not Python
or NumPy scalars, and ``asnumpy`` copies one back to the host. The module exposes NumPy's
namespace: its functions return DeviceArray (those that take arrays refuse host ones, except the
transfers ``asarray``/``array``), its types and constants are NumPy's; ``random.default_rng``
gives NumPy's generator with its draws on the device -- the same numbers as NumPy's, so a run on
the stand-in equals the CPU's exactly; ``erf`` is SciPy's. ``standin.waits`` counts the
transfers to the host (``bool``, ``float``, ``int``, ``format``, ``item``, ``tolist`` of a
device array, ``asnumpy``) and the operations whose output's size depends on the data (a boolean
mask as an index, ``nonzero``, ``unique``, ...): on a GPU, each makes the host wait for the
device.
"""

from __future__ import annotations

import functools
import sys
import types

import numpy as np
import scipy.special


class HostArrayError(TypeError):
    """A host array met a device array."""


class DeviceArray(np.ndarray):
    """An array of the stand-in device (see the module docstring)."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        _refuse_host(f"np.{ufunc.__name__}", inputs, kwargs)
        out = kwargs.get("out")
        result = getattr(ufunc, method)(*_host(inputs), **_host(kwargs))
        if out is not None:
            return out[0] if len(out) == 1 else out
        return None if method == "at" else _device(result)

    def __array_function__(self, func, types, args, kwargs):
        _refuse_host(f"np.{func.__name__}", args, kwargs)
        return _device(func(*_host(args), **_host(kwargs)))

    def __getitem__(self, key):
        _refuse_host("indexing", key)
        keys = key if isinstance(key, tuple) else (key,)
        standin.waits += any(isinstance(k, DeviceArray) and k.dtype == bool for k in keys)
        return _device(np.ndarray.__getitem__(self.view(np.ndarray), _host(key)))

    def __setitem__(self, key, value):
        _refuse_host("assignment", key, value)
        np.ndarray.__setitem__(self.view(np.ndarray), _host(key), _host(value))


def _waits(method: str):
    """``DeviceArray.method``, counted in ``standin.waits``: a number or a copy for the host,
    for which, on a GPU, the host waits until the device has done all it was given."""
    def wait(self, *args):
        standin.waits += 1
        return getattr(np.ndarray, method)(self.view(np.ndarray), *args)
    return wait


for _method in ("__bool__", "__float__", "__int__", "__index__", "__format__", "item", "tolist"):
    setattr(DeviceArray, _method, _waits(_method))


def _refuse_host(what: str, *objects) -> None:
    for obj in objects:
        if isinstance(obj, (tuple, list)):
            _refuse_host(what, *obj)
        elif isinstance(obj, dict):
            _refuse_host(what, *obj.values())
        elif isinstance(obj, np.ndarray) and not isinstance(obj, DeviceArray):
            raise HostArrayError(f"{what}: a host (NumPy) array {obj.dtype}{obj.shape} among "
                                 f"device arrays")


def _host(obj):
    """DeviceArrays (inside tuples, lists, dicts) as plain views of the same memory."""
    if isinstance(obj, DeviceArray):
        return obj.view(np.ndarray)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_host(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _host(o) for k, o in obj.items()}
    return obj


def _device(obj):
    """Arrays and NumPy scalars (inside tuples and lists) as DeviceArrays."""
    if isinstance(obj, np.ndarray):
        return obj if isinstance(obj, DeviceArray) else obj.view(DeviceArray)
    if isinstance(obj, np.generic):
        return np.asarray(obj).view(DeviceArray)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_device(o) for o in obj)
    return obj


#: Functions whose output's size depends on the data: the host must see it (a wait).
_SIZED_BY_DATA = ("nonzero", "flatnonzero", "argwhere", "unique")


def _function(fn, transfer: bool, waits: bool = False):
    @functools.wraps(fn)
    def on_device(*args, **kwargs):
        if not transfer:
            _refuse_host(f"np.{fn.__name__}", args, kwargs)
        standin.waits += waits
        return _device(fn(*_host(args), **_host(kwargs)))
    return on_device


class Generator:
    """NumPy's generator (``np.random.default_rng(seed)``), its draws on the device; its methods
    are the class's, as CuPy's are (``device.use`` looks them up there)."""

    def __init__(self, seed=None):
        self._rng = np.random.default_rng(seed)


for _name in dir(np.random.Generator):
    if not _name.startswith("_"):
        setattr(Generator, _name, lambda self, *args, _name=_name, **kwargs: _function(
            getattr(self._rng, _name), transfer=True)(*args, **kwargs))


class _StandIn(types.ModuleType):
    ndarray = DeviceArray
    random = types.SimpleNamespace(default_rng=Generator, Generator=Generator)
    erf = scipy.special.erf

    waits = 0

    def asnumpy(self, a):
        self.waits += isinstance(a, DeviceArray)
        return np.array(_host(a))

    def __getattr__(self, attr):
        value = getattr(np, attr)
        if callable(value) and not isinstance(value, (type, np.ufunc)):
            value = _function(value, transfer=attr in ("asarray", "array"),
                              waits=attr in _SIZED_BY_DATA)
        setattr(self, attr, value)
        return value


standin = _StandIn("standin")
sys.modules.setdefault("standin", standin)


def host_arrays(obj, where: str = "output") -> list[str]:
    """Where ``obj`` (arrays, numbers, tuples, lists, dicts, NamedTuples) holds a plain NumPy
    array: a leak from the device. [] when none."""
    if isinstance(obj, np.ndarray):
        return [] if isinstance(obj, DeviceArray) else [f"{where}: {obj.dtype}{obj.shape}"]
    if isinstance(obj, dict):
        return [leak for k, o in obj.items() for leak in host_arrays(o, f"{where}[{k!r}]")]
    if isinstance(obj, (tuple, list)):
        return [leak for i, o in enumerate(obj) for leak in host_arrays(o, f"{where}[{i}]")]
    return []


def assert_on_device(obj, where: str = "output") -> None:
    """AssertionError naming every plain NumPy array in ``obj``."""
    leaks = host_arrays(obj, where)
    assert not leaks, "host arrays leaked from the device: " + "; ".join(leaks)
