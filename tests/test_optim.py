"""transformer_lab.optim takes the same steps as torch.optim, clips like clip_grad_norm_."""

import numpy as np
import pytest
import torch

from transformer_lab.optim import SGD, Adam, AdamW, WarmupSchedule, clip_grad_norm

TOL = {np.float32: 1e-6, np.float64: 1e-12}


def run_both(make_ours, make_torch, dtype, steps=6, seed=0):
    rng = np.random.default_rng(seed)
    params = {"W": rng.standard_normal((3, 4)).astype(dtype), "b": rng.standard_normal(4).astype(dtype)}
    tparams = [torch.tensor(params["W"].copy(), requires_grad=True),
               torch.tensor(params["b"].copy(), requires_grad=True)]
    ours, theirs = make_ours(params), make_torch(tparams)
    for _ in range(steps):
        grads = {"W": rng.standard_normal((3, 4)).astype(dtype),
                 "b": rng.standard_normal(4).astype(dtype)}
        for tp, name in zip(tparams, ("W", "b")):
            tp.grad = torch.tensor(grads[name].copy())
        ours.step(grads)
        theirs.step()
    for tp, name in zip(tparams, ("W", "b")):
        np.testing.assert_allclose(params[name], tp.detach().numpy(), rtol=TOL[dtype],
                                   atol=TOL[dtype])
        assert params[name].dtype == dtype


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kw", [dict(), dict(momentum=0.9), dict(momentum=0.9, nesterov=True),
                                dict(momentum=0.8, dampening=0.1, weight_decay=0.01)])
def test_sgd_matches_torch(dtype, kw):
    run_both(lambda p: SGD(p, lr=0.1, **kw), lambda tp: torch.optim.SGD(tp, lr=0.1, **kw), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kw", [dict(), dict(weight_decay=0.1), dict(betas=(0.8, 0.99), eps=1e-6)])
def test_adam_matches_torch(dtype, kw):
    run_both(lambda p: Adam(p, lr=0.01, **kw), lambda tp: torch.optim.Adam(tp, lr=0.01, **kw),
             dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adamw_matches_torch(dtype):
    run_both(lambda p: AdamW(p, lr=0.01, weight_decay=0.1),
             lambda tp: torch.optim.AdamW(tp, lr=0.01, weight_decay=0.1), dtype)


def test_clip_grad_norm_matches_torch():
    rng = np.random.default_rng(1)
    for max_norm in (0.5, 100.0):
        grads = {"a": rng.standard_normal((3, 3)), "b": rng.standard_normal(5)}
        ts = [torch.zeros(3, 3, dtype=torch.float64, requires_grad=True),
              torch.zeros(5, dtype=torch.float64, requires_grad=True)]
        for t, g in zip(ts, grads.values()):
            t.grad = torch.tensor(g.copy())
        total = clip_grad_norm(grads, max_norm)
        ref = torch.nn.utils.clip_grad_norm_(ts, max_norm)
        assert total == pytest.approx(ref.item(), rel=1e-12)
        for t, g in zip(ts, grads.values()):
            np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-12)
        new_norm = np.sqrt(sum(np.sum(g * g) for g in grads.values()))
        assert new_norm <= max_norm + 1e-9


def test_warmup_schedule_shapes():
    s = WarmupSchedule(peak_lr=1.0, warmup_steps=10, total_steps=110)
    assert s(0) == pytest.approx(0.1) and s(9) == pytest.approx(1.0)
    assert s(60) == pytest.approx(0.5) and s(110) == pytest.approx(0.0) and s(500) == 0.0
    lin = WarmupSchedule(1.0, 10, 110, decay="linear", final_lr=0.1)
    assert lin(60) == pytest.approx(0.55)
    inv = WarmupSchedule(1.0, 16, 0, decay="inverse_sqrt")
    assert inv(63) == pytest.approx(0.5)
    lrs = [s(i) for i in range(110)]
    assert max(lrs) == pytest.approx(1.0) and np.all(np.diff(lrs[10:]) <= 1e-15)


def test_optimizers_reject_bad_input():
    p = {"W": np.zeros((2, 2))}
    with pytest.raises(ValueError, match="lr must be a non-negative number"):
        SGD(p, lr=-1)
    with pytest.raises(TypeError, match="params must be a non-empty dict"):
        Adam({}, lr=0.1)
    with pytest.raises(TypeError, match=r"params\['W'\] must be a float32 or float64"):
        Adam({"W": np.zeros(2, dtype=int)})
    with pytest.raises(ValueError, match="betas must be in"):
        Adam(p, betas=(1.0, 0.9))
    opt = Adam(p)
    with pytest.raises(ValueError, match="grads must have exactly the keys of params"):
        opt.step({"V": np.zeros((2, 2))})
    with pytest.raises(ValueError, match=r"grads\['W'\] must have shape \(2, 2\)"):
        opt.step({"W": np.zeros(2)})
    with pytest.raises(ValueError, match="contains NaN"):
        opt.step({"W": np.full((2, 2), np.nan)})
    with pytest.raises(ValueError, match="max_norm must be a positive"):
        clip_grad_norm({"W": np.ones(2)}, 0)
    with pytest.raises(ValueError, match="nesterov needs momentum"):
        SGD(p, lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="total_steps must be at least warmup_steps"):
        WarmupSchedule(1.0, 10, 5)
    with pytest.raises(ValueError, match="decay must be"):
        WarmupSchedule(1.0, 10, 50, decay="step")
