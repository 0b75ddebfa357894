"""Root pytest configuration, shared by the package tests and by nbval over notebooks/.

- Kernels started by nbval inherit this process's environment, so the variables that make
  notebook outputs reproducible (transformer_lab.course.kernel_env) are set here, before any
  kernel starts -- also when pytest is run directly rather than through `make test`.
- nbval opens --nbval-sanitize-with relative to the current directory; we resolve it against
  the project root, and use tests/nbval_sanitize.cfg when --nbval is given without one.
"""

from pathlib import Path

from transformer_lab.course.kernel_env import apply_kernel_env

ROOT = Path(__file__).resolve().parent
SANITIZE_FILE = ROOT / "tests" / "nbval_sanitize.cfg"

apply_kernel_env()


def pytest_configure(config):
    option = config.option
    if not getattr(option, "nbval", False):
        return
    given = getattr(option, "nbval_sanitize_with", None)
    if given is None:
        option.nbval_sanitize_with = str(SANITIZE_FILE)
    elif not Path(given).is_absolute() and not Path(given).exists():
        option.nbval_sanitize_with = str(ROOT / given)
