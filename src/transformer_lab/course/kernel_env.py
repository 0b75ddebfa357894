"""The environment every notebook kernel runs in, shared by `make`, `make refresh` and nbval.

Stored notebook outputs are compared digit for digit by nbval, so the kernels that produce
them (``python -m transformer_lab.course.execute``) and the kernels that check them
(``pytest --nbval``, see ``conftest.py``) must see the same environment.
"""

import os

#: Variables set before any kernel starts. PYTHONHASHSEED fixes the order of printed sets;
#: PYTHONWARNINGS hides version-dependent warnings (nbval compares stderr too).
KERNEL_ENV = {
    "PYTHONHASHSEED": "0",
    "PYTHONWARNINGS": "ignore",
}


def apply_kernel_env() -> None:
    """Set :data:`KERNEL_ENV` in this process, so that kernels it starts inherit it."""
    os.environ.update(KERNEL_ENV)


def with_pythonpath(env: dict[str, str], folder) -> dict[str, str]:
    """``env`` with ``folder`` first on its ``PYTHONPATH``."""
    rest = [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []
    return {**env, "PYTHONPATH": os.pathsep.join([str(folder), *rest])}
