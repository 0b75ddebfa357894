"""The notebooks' shared helpers: the MultiheadAttention bridge round-trips, agree() raises."""

import numpy as np
import pytest
import torch

from transformer_lab.core import multihead as M
from transformer_lab.tools import agree, best_time, errors_summary, mha_params, perturb, torch_mha


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_torch_mha_and_mha_params_are_inverse(packed, bias):
    torch.manual_seed(0)
    module = torch.nn.MultiheadAttention(8, 2, bias=bias, batch_first=True, dtype=torch.float64)
    p = mha_params(module, packed=packed)
    again = torch_mha(p, 2)
    for a, b in zip(module.state_dict().values(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    x = np.random.default_rng(0).standard_normal((2, 3, 8))
    ours = (M.self_attention_forward(x, p, 2)[0] if packed
            else M.multi_head_attention_forward(x, x, x, p, 2)[0])
    xt = torch.from_numpy(x)
    theirs = module(xt, xt, xt, need_weights=False)[0].detach().numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)


def test_agree_prints_or_raises(capsys):
    assert agree("same", np.ones(3), np.ones(3), 1e-12) == 0.0
    assert "same" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="relative error"):
        agree("different", np.ones(3), np.zeros(3), 1e-3)
    assert best_time(lambda: None, repeats=2, number=3) >= 0


def test_perturb_moves_every_array_of_a_nested_structure_in_place():
    params = {"a": np.zeros(3), "layers": [{"W": np.ones((2, 2)), "b": None}]}
    arrays = [params["a"], params["layers"][0]["W"]]
    before = [a.copy() for a in arrays]
    assert perturb(params, np.random.default_rng(0), scale=0.5) is params
    assert all(np.all(a != b) for a, b in zip(arrays, before, strict=True))
    assert params["layers"][0]["b"] is None


def test_errors_summary_names_the_count_and_the_largest():
    assert errors_summary({"W": 1e-9, "b": 3e-8}) == (
        "2 tensors ok, largest relative error 3.0e-08")
