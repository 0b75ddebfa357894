"""setup_notebook: the first call of every notebook."""

import random

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_info

from transformer_lab import setup_notebook


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


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        setup_notebook(seed=-1)
    with pytest.raises(ValueError, match="precision must be"):
        setup_notebook(precision=1.5)
    with pytest.raises(ValueError, match="threads must be a positive integer or None"):
        setup_notebook(threads=0)
