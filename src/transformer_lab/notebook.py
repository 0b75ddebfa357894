"""The one setup call every notebook makes first.

Usage, in the code cell after a notebook's package guard::

    from transformer_lab import setup_notebook
    rng = setup_notebook(seed=0)
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import numpy as np

#: Print precision used by every notebook: enough digits to read, few enough to be stable.
PRINT_PRECISION = 4


def setup_notebook(seed: int = 0, precision: int = PRINT_PRECISION,
                   threads: int | None = 1) -> np.random.Generator:
    """Seed every random number generator and fix printing, threads, warnings and plot defaults.

    Seeds Python's :mod:`random`, NumPy's legacy global generator and torch (when it is
    installed); sets the NumPy and torch print precision; limits NumPy's BLAS and torch to
    ``threads`` threads; turns off warnings that would make stored notebook outputs depend on
    library versions; sets matplotlib defaults that look the same in JupyterLab, in the HTML site
    and in nbval runs. In IPython (a notebook's kernel), it also turns on IPython's autoreload
    for the modules of :mod:`transformer_lab.core`: a function you edit in
    ``src/transformer_lab/core/*.py`` is picked up by the next cell you run, no restart needed.

    Why one thread by default: the course's matrices are small, where a second BLAS thread costs
    more in synchronisation than it saves -- and on a busy machine a multi-threaded OpenBLAS
    product can take 10-100 times longer than a single-threaded one, which makes timings
    meaningless. NumPy and torch get the same number of threads, so comparisons are fair.

    Args:
        seed: non-negative integer seed shared by all generators.
        precision: number of digits printed after the decimal point.
        threads: threads for NumPy's BLAS and for torch; None leaves the libraries' defaults.

    Returns:
        A fresh ``np.random.Generator`` seeded with ``seed``; notebooks draw their data from it.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if isinstance(precision, bool) or not isinstance(precision, (int, np.integer)) or precision < 0:
        raise ValueError(f"precision must be a non-negative integer, got {precision!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
    seed = int(seed)
    check_package_folder(Path.cwd())

    random.seed(seed)
    np.random.seed(seed)
    np.set_printoptions(precision=precision, suppress=True, linewidth=100)

    _quiet_warnings()
    if threads is not None:
        limit_threads(threads)
    _setup_torch(seed, precision)
    _setup_matplotlib()
    autoreload_core()
    return np.random.default_rng(seed)


class OtherPackageError(RuntimeError):
    """The kernel imported another copy of transformer_lab than the notebook's folder holds."""


def check_package_folder(notebooks: Path) -> None:
    """Stop when the course folder above ``notebooks`` (a notebook's folder: its kernel's
    working folder) holds a package of its own, ``src/transformer_lab`` -- in a workspace, the
    one you write -- and the kernel imported another: every check would test that other one.
    A kernel started outside ``make learn`` (VS Code, a JupyterLab of its own) imports the
    package installed in its environment, the course's finished one."""
    import transformer_lab

    here = notebooks.resolve().parent / "src" / "transformer_lab"
    loaded = Path(transformer_lab.__file__).resolve().parent
    if here.is_dir() and not here.samefile(loaded):  # (not by name: macOS ignores case)
        raise OtherPackageError(
            f"this notebook's folder has its own package, {here} (in a workspace: the one you "
            f"write), but this kernel imported transformer_lab from {loaded}, so every check "
            f"would test that one. Open the notebooks with `make learn` in the course folder "
            f"(its kernels import the workspace's src/ first); elsewhere, set the environment "
            f"variable PYTHONPATH to {here.parent} before starting Jupyter, then restart the "
            f"kernel.")


def core_modules() -> list[str]:
    """The modules of :mod:`transformer_lab.core`, ``transformer_lab.core.layers`` ..."""
    import pkgutil

    from transformer_lab import core

    return sorted(f"{core.__name__}.{m.name}" for m in pkgutil.iter_modules(core.__path__))


def autoreload_core() -> bool:
    """In IPython, reload the core modules before a cell runs whenever their files changed.

    Loads IPython's ``autoreload`` extension and marks the core modules with ``%aimport``, in
    mode 1 (only the marked modules are watched; a mode already set higher is kept), each module
    reloaded whole, so that errors and the loop rule read the lines of its file. Returns
    whether it did so (False outside IPython, printing nothing either way).
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or not hasattr(shell, "extension_manager"):
        return False
    try:
        if "autoreload" not in shell.extension_manager.loaded:
            shell.extension_manager.load_extension("autoreload")
        magics = shell.magics_manager.registry.get("AutoreloadMagics")
        reloader = getattr(magics, "_reloader", None)
        if reloader is None or not (reloader.enabled and reloader.check_all):
            shell.run_line_magic("autoreload", "1")
        if getattr(reloader, "deduper_reloader", None) is not None:  # IPython 9's
            reloader.deduper_reloader.enabled = False  # which patches one function at a time,
            # whose line numbers then count from its def: a whole module's reload keeps them
        for module in core_modules():
            shell.run_line_magic("aimport", module)
    except Exception:  # an IPython without the extension: the notebook works, just no reload
        return False
    return True


_blas_limit = None  # keeps the threadpoolctl limit alive for the whole session


def limit_threads(threads: int) -> None:
    """Use ``threads`` threads in NumPy's BLAS (via threadpoolctl) and in torch, from now on."""
    global _blas_limit
    # SciPy's own BLAS (which SciPy may load later) loaded now: a limit covers only the
    # libraries already loaded
    import scipy.linalg  # noqa: F401
    from threadpoolctl import threadpool_limits

    _blas_limit = threadpool_limits(limits=threads, user_api="blas")
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(threads)


def _quiet_warnings() -> None:
    """Hide warnings that depend on library versions, keep the ones a student must see."""
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=PendingDeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    # Overflow in a naive softmax is *shown* by the notebooks on purpose: keep RuntimeWarning.
    warnings.filterwarnings("default", category=RuntimeWarning)


def _setup_torch(seed: int, precision: int) -> None:
    try:
        import torch
    except ImportError:  # the package works without torch; only the PyTorch checks need it
        return
    torch.manual_seed(seed)
    torch.set_printoptions(precision=precision, sci_mode=False)
    # Deterministic CPU kernels: the same outputs every run.
    torch.use_deterministic_algorithms(True)


def _setup_matplotlib() -> None:
    import matplotlib as mpl

    mpl.rcParams.update(
        {
            "figure.figsize": (6.4, 4.0),
            "figure.dpi": 100,
            "savefig.dpi": 100,
            "font.size": 10,
            "image.cmap": "viridis",
            # A fixed salt: SVG files drawn twice are byte-for-byte the same.
            "svg.hashsalt": "transformer-lab",
        }
    )
