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


def client_options(folder) -> dict:
    """nbclient's ``NotebookClient`` options for a kernel started in ``folder``: no wall-clock
    times in the stored metadata, and only errors of the kernel's own log (not the notebook's
    output), which would warn about unencrypted TCP on localhost at every start."""
    return {"kernel_name": "python3", "resources": {"metadata": {"path": str(folder)}},
            "record_timing": False, "extra_arguments": ["--IPKernelApp.log_level=ERROR"]}


def apply_kernel_env() -> None:
    """Set :data:`KERNEL_ENV` in this process, so that kernels it starts inherit it."""
    os.environ.update(KERNEL_ENV)


def with_pythonpath(env: dict[str, str], folder) -> dict[str, str]:
    """``env`` with ``folder`` first on its ``PYTHONPATH``."""
    rest = [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []
    return {**env, "PYTHONPATH": os.pathsep.join([str(folder), *rest])}
