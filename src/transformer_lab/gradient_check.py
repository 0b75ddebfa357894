"""Numerical gradients and the checks that compare them with hand-written backward passes.

Every backward pass in the course is verified twice: against a central-difference numerical
gradient (this module) and against PyTorch autograd (:func:`compare` for one array,
:func:`check_parity` for a whole dict of gradients).

The central difference of a function ``f`` at ``x`` along coordinate ``i`` is::

    df/dx_i  ~=  (f(x + h e_i) - f(x - h e_i)) / (2 h)

with truncation error O(h^2). In float64 with ``h = 1e-5`` this is accurate to about 1e-10
relative, which is why every check runs in float64.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

#: Default step of the central difference.
DEFAULT_H = 1e-5
#: Default tolerance on the relative error of a float64 gradient check.
DEFAULT_TOL = 1e-7
#: Below this in every entry, analytic and numerical gradients are both zero up to rounding.
DEFAULT_ZERO_ATOL = 1e-8


class GradientCheckError(AssertionError):
    """Raised when an analytic gradient disagrees with the numerical one."""


def _as_float64_array(x, name: str) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array, got {type(x).__name__}")
    if x.dtype != np.float64:
        raise TypeError(
            f"{name} must be a float64 array, got dtype {x.dtype}: numerical gradients in lower "
            "precision are dominated by rounding error (use x.astype(np.float64))"
        )
    return x


def _check_h(h) -> float:
    if not np.isscalar(h) or not np.isfinite(h) or h <= 0:
        raise ValueError(f"h must be a positive finite number, got {h!r}")
    return float(h)


def eval_numerical_gradient(f: Callable[[np.ndarray], float], x: np.ndarray,
                            h: float = DEFAULT_H) -> np.ndarray:
    """Central-difference gradient of a scalar function.

    ``x`` is perturbed in place, one entry at a time, and restored afterwards, so ``f`` may
    read ``x`` through a closure instead of its argument.

    Args:
        f: function of ``x`` returning a scalar (a Python float or an array of size 1).
        x: float64 array of any shape ``S``, the point at which to differentiate.
        h: step of the central difference.

    Returns:
        grad: float64 array of shape ``S``, ``grad[i] ~= df/dx[i]``.
    """
    return _central_difference(lambda: _scalar(f(x)), _as_float64_array(x, "x"), _check_h(h),
                               lambda f_plus, f_minus: f_plus - f_minus)


def eval_numerical_gradient_array(f: Callable[[np.ndarray], np.ndarray], x: np.ndarray,
                                  df: np.ndarray, h: float = DEFAULT_H) -> np.ndarray:
    """Central-difference gradient of an array-valued function, given an upstream gradient.

    Computes ``dx[i] = sum_j df[j] * d f(x)[j] / d x[i]``: the gradient that a backward pass
    receiving ``df`` must return. It is the gradient of the scalar ``sum(f(x) * df)``.

    Args:
        f: function of ``x`` returning an array of shape ``T``.
        x: float64 array of shape ``S`` (perturbed in place and restored).
        df: upstream gradient, array of shape ``T``.
        h: step of the central difference.

    Returns:
        dx: float64 array of shape ``S``.
    """
    x = _as_float64_array(x, "x")
    df = np.asarray(df, dtype=np.float64)

    def difference(f_plus, f_minus):
        if f_plus.shape != df.shape:
            raise ValueError(
                f"df must have the shape of f(x): f(x) has shape {f_plus.shape}, "
                f"df has shape {df.shape}"
            )
        return np.sum((f_plus - f_minus) * df)

    return _central_difference(lambda: np.array(f(x), dtype=np.float64, copy=True), x,
                               _check_h(h), difference)


def _central_difference(value, x: np.ndarray, h: float, difference) -> np.ndarray:
    """``grad[i] = difference(value() at x + h e_i, value() at x - h e_i) / (2 h)`` for every
    entry ``i`` of ``x``, which is perturbed in place and restored."""
    grad = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"], op_flags=["readwrite"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + h
        f_plus = value()
        x[i] = old - h
        f_minus = value()
        x[i] = old
        grad[i] = difference(f_plus, f_minus) / (2 * h)
    return grad


def rel_error(a, b) -> float:
    """Relative error between two arrays of the same shape, one number for the whole tensor.

    ``||a - b|| / max(||a|| + ||b||, tiny)`` with the Euclidean norm over all entries. Unlike an
    entry-wise ratio it does not blow up on entries that are zero up to rounding; it is 0 for
    equal arrays and 1 when ``a = -b`` or when exactly one of them is zero.

    Args:
        a, b: array-likes (NumPy arrays, torch tensors, numbers) of the same shape.

    Returns:
        The relative error, a Python float in [0, 1].
    """
    a, b = _to_numpy(a, "a"), _to_numpy(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"a and b must have the same shape, got {a.shape} and {b.shape}")
    a, b = a.astype(np.float64), b.astype(np.float64)
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("a and b must be finite: found NaN or infinity")
    denom = np.linalg.norm(a) + np.linalg.norm(b)
    if denom == 0.0:
        return 0.0
    return float(np.linalg.norm(a - b) / max(denom, np.finfo(np.float64).tiny))


def check_gradients(
    f: Callable[[], float | np.ndarray],
    params: Mapping[str, np.ndarray],
    grads: Mapping[str, np.ndarray],
    *,
    df: np.ndarray | None = None,
    tol: float = DEFAULT_TOL,
    h: float = DEFAULT_H,
    zero_atol: float = DEFAULT_ZERO_ATOL,
    verbose: bool = True,
) -> dict[str, float]:
    """Compare analytic gradients with numerical ones, one row per tensor, and raise on failure.

    ``f`` takes no arguments and computes its output from the arrays in ``params``; each array
    is perturbed in place while its numerical gradient is taken, then restored.

    Args:
        f: ``f() -> scalar`` (a loss), or ``f() -> array`` when ``df`` is given.
        params: name -> float64 array that ``f`` reads.
        grads: name -> analytic gradient, same shape as ``params[name]``; every name must be a
            key of ``params`` (a parameter may be left out to skip it).
        df: upstream gradient of ``f()``'s output, for array-valued ``f``.
        tol: largest relative error (see :func:`rel_error`) that passes.
        h: step of the central difference.
        zero_atol: a tensor whose analytic and numerical gradients are both below this in every
            entry has a zero gradient (e.g. a key bias, which softmax ignores): the relative
            error of two rounding noises means nothing, so it passes and its row says so.
        verbose: print the table (name, shape, relative error, ok/FAIL).

    Returns:
        name -> relative error, for every tensor in ``grads``.

    Raises:
        GradientCheckError: when any relative error exceeds ``tol``; the message lists them.
        ValueError / TypeError: when a name is unknown or a shape or dtype is wrong.
    """
    if not grads:
        raise ValueError("grads must name at least one tensor to check")
    _check_tol(tol)
    for name, g in grads.items():
        if name not in params:
            raise ValueError(f"grads[{name!r}] has no matching entry in params "
                             f"(params has {sorted(params)})")
        p = _as_float64_array(params[name], f"params[{name!r}]")
        g = _to_numpy(g, f"grads[{name!r}]")
        if g.shape != p.shape:
            raise ValueError(f"grads[{name!r}] must have the shape of params[{name!r}], "
                             f"{p.shape}; got {g.shape}")

    errors: dict[str, float] = {}
    zero: set[str] = set()
    for name, g in grads.items():
        x = params[name]
        if df is None:
            num = eval_numerical_gradient(lambda _: f(), x, h)
        else:
            num = eval_numerical_gradient_array(lambda _: f(), x, df, h)
        _record(errors, zero, name, _to_numpy(g, name), num, zero_atol)

    failed = _report(errors, {n: params[n].shape for n in grads}, tol, zero, verbose)
    if failed:
        raise GradientCheckError(
            f"gradient check failed for {len(failed)} of {len(errors)} tensors, relative error "
            f"above tol={tol:.0e}: {_listing(failed)}"
        )
    return errors


def check_parity(ours: Mapping, reference: Mapping, *, tol: float,
                 zero_atol: float | None = None, verbose: bool = True) -> dict[str, float]:
    """Compare two dicts of arrays with the same keys, one relative error per tensor.

    For our gradients (or weights) against a reference's -- PyTorch's, or the same model's in
    another dtype: ``ours`` and ``reference`` map the same names to arrays (NumPy arrays or
    torch tensors) of the same shapes. Prints the table of :func:`check_gradients` (when
    ``verbose``) and raises ``AssertionError`` naming every tensor above ``tol`` (1e-10 for
    float64, 1e-5 for float32). ``zero_atol`` as for :func:`check_gradients` (default 1e-12
    when both are float64, else 1e-6). Returns name -> relative error (0.0 for zero tensors),
    in the order of ``ours``.
    """
    _check_tol(tol)
    if set(ours) != set(reference):
        raise ValueError(f"ours and reference must have the same names; only in ours: "
                         f"{sorted(set(ours) - set(reference))}, only in reference: "
                         f"{sorted(set(reference) - set(ours))}")
    errors: dict[str, float] = {}
    zero: set[str] = set()
    shapes: dict[str, tuple] = {}
    for name in ours:
        a, b = _to_numpy(ours[name], name), _to_numpy(reference[name], name)
        if a.shape != b.shape:
            raise ValueError(f"{name}: ours has shape {a.shape}, reference {b.shape}")
        shapes[name] = a.shape
        atol = zero_atol
        if atol is None:
            atol = 1e-12 if a.dtype == np.float64 and b.dtype == np.float64 else 1e-6
        _record(errors, zero, name, a, b, atol)
    failed = _report(errors, shapes, tol, zero, verbose)
    if failed:
        raise AssertionError(f"{len(failed)} of {len(errors)} tensors differ by more than "
                             f"tol={tol:g}: {_listing(failed)}")
    return errors


def _check_tol(tol) -> None:
    if not np.isscalar(tol) or not tol > 0:
        raise ValueError(f"tol must be a positive number, got {tol!r}")


def _record(errors: dict, zero: set, name: str, a: np.ndarray, b: np.ndarray, atol: float):
    """``errors[name] = rel_error(a, b)``, or 0.0 and ``name`` added to ``zero`` when both are
    zero up to ``atol`` in every entry."""
    if max(np.max(np.abs(a), initial=0.0), np.max(np.abs(b), initial=0.0)) <= atol:
        zero.add(name)
        errors[name] = 0.0
    else:
        errors[name] = rel_error(a, b)


def _report(errors: Mapping[str, float], shapes: Mapping[str, tuple], tol: float,
            zero: set[str], verbose: bool) -> dict[str, float]:
    """Print the table (when verbose); return the tensors above ``tol``."""
    if verbose:
        print(format_check_table(errors, shapes, tol, zero))
    return {n: e for n, e in errors.items() if not e <= tol}


def _listing(failed: Mapping[str, float]) -> str:
    return ", ".join(f"{n} ({e:.2e})" for n, e in failed.items())


def format_check_table(errors: Mapping[str, float], shapes: Mapping[str, tuple],
                       tol: float, zero: set[str] = frozenset()) -> str:
    """Format relative errors as an aligned table: name, shape, relative error, ok/FAIL.

    Names in ``zero`` are tensors whose gradient is zero; their row says so."""
    names = list(errors)
    shape_txt = {n: str(tuple(shapes[n])) for n in names}
    w_name = max(6, *(len(n) for n in names))
    w_shape = max(5, *(len(s) for s in shape_txt.values()))
    lines = [f"{'tensor':<{w_name}}  {'shape':<{w_shape}}  {'rel. error':>10}  check",
             f"{'-' * w_name}  {'-' * w_shape}  {'-' * 10}  -----"]
    for n in names:
        if n in zero:
            lines.append(f"{n:<{w_name}}  {shape_txt[n]:<{w_shape}}  {'-':>10}  ok (zero gradient)")
            continue
        status = "ok" if errors[n] <= tol else f"FAIL (tol {tol:.0e})"
        lines.append(f"{n:<{w_name}}  {shape_txt[n]:<{w_shape}}  {errors[n]:>10.2e}  {status}")
    return "\n".join(lines)


def compare(name: str, ours, reference, *, rtol: float = 1e-5, atol: float = 1e-8,
            raise_on_mismatch: bool = True) -> bool:
    """Print one line comparing our array with a reference (e.g. a torch gradient).

    The line says whether the two are bit-for-bit equal, whether they agree within
    ``rtol``/``atol`` (``np.allclose``) and their largest absolute difference -- the one-line
    check of Karpathy's "backprop ninja" exercise. ``ours`` and ``reference``: arrays of the
    same shape (NumPy arrays or torch tensors); ``name`` starts the line. Returns whether they
    agree; with ``raise_on_mismatch``, an ``AssertionError`` when they do not.
    """
    a, b = _to_numpy(ours, "ours"), _to_numpy(reference, "reference")
    if a.shape != b.shape:
        raise ValueError(f"{name}: ours has shape {a.shape} but reference has shape {b.shape}")
    exact = bool(np.array_equal(a, b))
    close = bool(np.allclose(a, b, rtol=rtol, atol=atol))
    maxdiff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
    print(f"{name:<15} | exact: {exact!s:<5} | allclose: {close!s:<5} | max diff: {maxdiff:.1e}")
    if raise_on_mismatch and not close:
        raise AssertionError(f"{name}: differs from the reference by up to {maxdiff:.3e} "
                             f"(rtol={rtol:g}, atol={atol:g})")
    return close


def _to_numpy(x, name: str) -> np.ndarray:
    """NumPy view of an array-like, accepting torch tensors without importing torch."""
    if hasattr(x, "detach") and hasattr(x, "numpy"):
        x = x.detach().cpu().numpy()
    try:
        return np.asarray(x)
    except Exception as e:  # pragma: no cover - exotic inputs
        raise TypeError(f"{name} must be array-like, got {type(x).__name__}") from e


def _scalar(value) -> float:
    arr = np.asarray(value)
    if arr.size != 1:
        raise ValueError(
            f"f must return a scalar, got an array of shape {arr.shape}; "
            "for array-valued functions use eval_numerical_gradient_array with an upstream df"
        )
    return float(arr.reshape(()))
