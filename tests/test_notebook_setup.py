"""setup_notebook: the first call of every notebook."""

import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_info

from transformer_lab import setup_notebook

ROOT = Path(__file__).resolve().parents[1]


def test_seeds_every_generator_reproducibly():
    draws = []
    for _ in range(2):
        rng = setup_notebook(seed=3)
        draws.append((rng.standard_normal(), np.random.rand(), random.random(),
                      torch.rand(1).item()))
    assert draws[0] == draws[1]
    assert setup_notebook(seed=4).standard_normal() != draws[0][0]


def test_threads_and_printing(capsys):
    setup_notebook(seed=0, precision=2, threads=1)
    assert torch.get_num_threads() == 1
    assert all(p["num_threads"] == 1 for p in threadpool_info() if p["user_api"] == "blas")
    print(np.array([1 / 3]))
    assert capsys.readouterr().out.strip() == "[0.33]"
    setup_notebook()  # back to the defaults for the other tests in this process


def test_the_thread_limit_covers_the_blas_the_gpt_loads_after_it():
    # a notebook's first cell limits the threads; the GPT (whose core imports SciPy) comes
    # later: in a fresh process, every BLAS library then still has one thread
    code = ("from transformer_lab import setup_notebook\n"
            "setup_notebook(threads=1)\n"
            "import transformer_lab.models.gpt\n"
            "from threadpoolctl import threadpool_info\n"
            "blas = [p for p in threadpool_info() if p['user_api'] == 'blas']\n"
            "print(len(blas), sorted({p['num_threads'] for p in blas}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert int(out[0]) >= 1 and out[1:] == ["[1]"]


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        setup_notebook(seed=-1)
    with pytest.raises(ValueError, match="precision must be"):
        setup_notebook(precision=1.5)
    with pytest.raises(ValueError, match="threads must be a positive integer or None"):
        setup_notebook(threads=0)


def test_a_notebook_whose_folder_holds_another_package_stops(tmp_path):
    """A workspace's notebook opened by a kernel outside `make learn` imported the course's
    finished package: every check passed on the stubs the student had not written."""
    from transformer_lab.notebook import OtherPackageError, check_package_folder

    check_package_folder(ROOT / "notebooks")  # the course's notebooks: its package, imported
    check_package_folder(tmp_path)  # no package above: nothing to say
    (tmp_path / "workspace" / "src" / "transformer_lab").mkdir(parents=True)
    with pytest.raises(OtherPackageError, match="PYTHONPATH to .*workspace/src before"):
        check_package_folder(tmp_path / "workspace" / "notebooks")
