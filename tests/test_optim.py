"""transformer_lab.optim takes the same steps as torch.optim, clips like clip_grad_norm_."""

import numpy as np
import pytest
import torch

from transformer_lab.optim import SGD, Adam, AdamW, WarmupSchedule, clip_grad_norm, global_norm

TOL = {np.float32: 1e-6, np.float64: 1e-12}


def run_both(make_ours, make_torch, dtype, steps=6, seed=0):
    rng = np.random.default_rng(seed)
    params = {"W": rng.standard_normal((3, 4)).astype(dtype),
              "b": rng.standard_normal(4).astype(dtype)}
    tparams = [torch.tensor(params["W"].copy(), requires_grad=True),
               torch.tensor(params["b"].copy(), requires_grad=True)]
    ours, theirs = make_ours(params), make_torch(tparams)
    for _ in range(steps):
        grads = {"W": rng.standard_normal((3, 4)).astype(dtype),
                 "b": rng.standard_normal(4).astype(dtype)}
        for tp, name in zip(tparams, ("W", "b"), strict=True):
            tp.grad = torch.tensor(grads[name].copy())
        ours.step(grads)
        theirs.step()
    for tp, name in zip(tparams, ("W", "b"), strict=True):
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
        for t, g in zip(ts, grads.values(), strict=True):
            t.grad = torch.tensor(g.copy())
        total = clip_grad_norm(grads, max_norm)
        ref = torch.nn.utils.clip_grad_norm_(ts, max_norm)
        assert total == pytest.approx(ref.item(), rel=1e-12)
        for t, g in zip(ts, grads.values(), strict=True):
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
    with pytest.raises(ValueError, match="lr must be at least 0, got -1"):
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
    with pytest.raises(FloatingPointError, match="contains NaN"):
        opt.step({"W": np.full((2, 2), np.nan)})
    for shared in ({"W": p["W"], "V": p["W"]}, {"W": p["W"], "row": p["W"][0]}):
        with pytest.raises(ValueError, match=r"params\['W'\] and params\['(V|row)'\] share "
                                             r"memory"):  # one step each, not two
            Adam(shared)
    Adam({"W": p["W"][0], "V": p["W"][1]})  # two rows of one array: no memory in common
    grown = dict(p)
    opt = SGD(grown, lr=0.1)
    grown["b"] = np.zeros(2)
    with pytest.raises(ValueError, match="params has gained or lost names since the optimiser "
                                         "was made"):
        opt.step({"W": np.zeros((2, 2)), "b": np.zeros(2)})
    with pytest.raises(ValueError, match="max_norm must be positive, got 0"):
        clip_grad_norm({"W": np.ones(2)}, 0)
    with pytest.raises(ValueError, match="nesterov needs momentum"):
        SGD(p, lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="total_steps must be at least warmup_steps"):
        WarmupSchedule(1.0, 10, 5)
    with pytest.raises(ValueError, match="decay must be"):
        WarmupSchedule(1.0, 10, 50, decay="step")


# ------------------------------------------------------------------ atomic steps, lr, numbers

def _state(opt):
    """Everything a step may change, copied."""
    arrays = {f"param.{n}": p for n, p in opt.params.items()}
    for attr in ("m", "v", "buffers"):
        arrays.update({f"{attr}.{i}": a for i, a in enumerate(getattr(opt, attr, []))
                       if a is not None})  # one array per group (see optim._groups)
    return {n: a.copy() for n, a in arrays.items()}, opt.steps


@pytest.mark.parametrize("make", [
    lambda p: SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01),
    lambda p: Adam(p, lr=0.1, weight_decay=0.01),
    lambda p: AdamW(p, lr=0.1),
])
@pytest.mark.parametrize("bad", ["nan", "inf", "shape", "dtype", "list"])
def test_a_failing_step_changes_nothing(make, bad):
    rng = np.random.default_rng(0)
    params = {"W": rng.standard_normal((3, 4)), "b": rng.standard_normal(4)}
    opt = make(params)
    opt.step({"W": rng.standard_normal((3, 4)), "b": rng.standard_normal(4)})  # state exists
    before, steps = _state(opt)
    b = {"nan": np.array([0.1, np.nan, 0.2, 0.3]), "inf": np.array([0.1, 0.2, np.inf, 0.3]),
         "shape": np.zeros(3), "dtype": np.zeros(4, np.float32), "list": [0.1, 0.2, 0.3, 0.4]}[bad]
    with pytest.raises((ValueError, TypeError, FloatingPointError), match=r"grads\['b'\]"):
        opt.step({"W": rng.standard_normal((3, 4)), "b": b})  # W comes first and is fine
    after, steps_after = _state(opt)
    assert steps_after == steps == 1 and after.keys() == before.keys()
    for name in before:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)


def test_lr_is_checked_whenever_it_is_set():
    opt = Adam({"W": np.zeros((2, 2))}, lr=0.1)
    for bad, error, message in [(float("nan"), ValueError, "lr must be finite"),
                                (-0.1, ValueError, "lr must be at least 0"),
                                ("0.1", TypeError, "lr must be a number"),
                                (None, TypeError, "lr must be a number"),
                                (True, TypeError, "lr must be a number")]:
        with pytest.raises(error, match=message):
            opt.lr = bad
        assert opt.lr == 0.1
    opt.lr = np.float32(0.5)
    assert opt.lr == 0.5 and type(opt.lr) is float
    with pytest.raises(ValueError, match="lr must be finite"):
        SGD({"W": np.zeros(2)}, lr=np.inf)


def test_numpy_scalars_are_accepted_and_give_the_same_steps():
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal((2, 3)).astype(np.float32) * 3 for _ in range(3)]
    results = []
    for num in (float, np.float32, np.float64):
        p = {"W": np.ones((2, 3), np.float32)}
        opt = Adam(p, lr=num(0.01), betas=(num(0.9), num(0.99)), eps=num(1e-8),
                   weight_decay=num(0.0))
        for g in grads:
            g = {"W": g.copy()}
            clip_grad_norm(g, max_norm=num(1.0))
            opt.step(g)
        results.append(p["W"])
    np.testing.assert_allclose(results[1], results[0], rtol=1e-6)
    np.testing.assert_array_equal(results[2], results[0])
    s = WarmupSchedule(np.float32(1.0), np.int64(10), np.int64(110))
    assert s(np.int64(9)) == pytest.approx(1.0) and s(np.int32(0)) == pytest.approx(0.1)


def test_global_norm_is_the_norm_of_everything_and_clip_uses_it():
    rng = np.random.default_rng(0)
    grads = {"a": rng.standard_normal((3, 4)), "b": rng.standard_normal(5).astype(np.float32)}
    flat = np.concatenate([g.ravel().astype(np.float64) for g in grads.values()])
    assert global_norm(grads) == pytest.approx(np.linalg.norm(flat), rel=1e-6)
    assert isinstance(global_norm(grads), float)
    total = global_norm(grads)
    assert clip_grad_norm(grads, max_norm=0.5 * total) == total
    assert global_norm(grads) == pytest.approx(0.5 * total, rel=1e-5)
    with pytest.raises(ValueError, match="grads must be a non-empty dict"):
        global_norm({})
    with pytest.raises(TypeError, match=r"grads\['a'\] must be a NumPy array, got list"):
        global_norm({"a": [1.0, 2.0]})
    with pytest.raises(TypeError, match="max_norm must be a number"):
        clip_grad_norm(grads, "1")


def test_clipping_refuses_a_core_that_replaces_the_gradients(monkeypatch):
    """The core's clip_grad_norm must scale the arrays it is given: the caller's gradients are
    those arrays (or, on a GPU, copied back from them), not the entries of its dict."""
    from transformer_lab.core import optim as core_optim

    def replaces(grads, max_norm):
        for name, g in grads.items():
            grads[name] = g * 0.5
        return 1.0

    monkeypatch.setattr(core_optim, "clip_grad_norm", replaces)
    grads = {"a": np.ones(3)}
    with pytest.raises(ValueError, match="replaced the gradients in its dict instead of scaling"):
        clip_grad_norm(grads, 1.0)
    np.testing.assert_array_equal(grads["a"], np.ones(3))


def test_schedules_and_betas_refuse_bad_numbers():
    s = WarmupSchedule(1.0, 10, 100)
    with pytest.raises(ValueError, match="step must be at least 0, got -5"):
        s(-5)
    with pytest.raises(TypeError, match="step must be an integer, got 2.5"):
        s(2.5)
    with pytest.raises(TypeError, match="warmup_steps must be an integer"):
        WarmupSchedule(1.0, 10.0, 100)
    with pytest.raises(ValueError, match="total_steps must be at least 0"):
        WarmupSchedule(1.0, 0, -1, decay="inverse_sqrt")
    with pytest.raises(ValueError, match="peak_lr must be finite"):
        WarmupSchedule(float("nan"), 10, 100)
    p = {"W": np.zeros(2)}
    with pytest.raises(ValueError, match=r"betas must be a pair \(beta1, beta2\), got 3 values"):
        Adam(p, betas=(0.9, 0.99, 0.999))
    with pytest.raises(TypeError, match="betas must be a pair"):
        Adam(p, betas=0.9)
    with pytest.raises(TypeError, match=r"betas\[1\] must be a number"):
        Adam(p, betas=(0.9, "0.99"))
    with pytest.raises(ValueError, match=r"betas\[0\] must be finite"):
        Adam(p, betas=(float("nan"), 0.99))
    with pytest.raises(ValueError, match="momentum must be at least 0"):
        SGD(p, lr=0.1, momentum=-0.9)
    with pytest.raises(TypeError, match="nesterov must be True or False"):
        SGD(p, lr=0.1, momentum=0.9, nesterov="yes")
