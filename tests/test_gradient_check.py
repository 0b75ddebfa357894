"""Tests for transformer_lab.gradient_check."""

import numpy as np
import pytest

from transformer_lab.gradient_check import (
    GradientCheckError,
    check_gradients,
    check_parity,
    compare,
    eval_numerical_gradient,
    eval_numerical_gradient_array,
    rel_error,
)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def test_numerical_gradient_of_quadratic_matches_closed_form(rng):
    A = rng.standard_normal((4, 4))
    x = rng.standard_normal(4)

    def f(v):
        return v @ A @ v

    num = eval_numerical_gradient(f, x)
    assert rel_error(num, (A + A.T) @ x) < 1e-9


def test_numerical_gradient_restores_its_input(rng):
    x = rng.standard_normal((3, 2))
    before = x.copy()
    eval_numerical_gradient(lambda v: np.sum(np.sin(v)), x)
    np.testing.assert_array_equal(x, before)


def test_numerical_gradient_of_array_function_with_upstream(rng):
    x = rng.standard_normal((3, 5))
    W = rng.standard_normal((5, 2))
    dout = rng.standard_normal((3, 2))
    num = eval_numerical_gradient_array(lambda v: v @ W, x, dout)
    assert rel_error(num, dout @ W.T) < 1e-9


def test_numerical_gradient_rejects_float32_and_lists():
    with pytest.raises(TypeError, match="x must be a float64 array"):
        eval_numerical_gradient(np.sum, np.ones(3, dtype=np.float32))
    with pytest.raises(TypeError, match="x must be a NumPy array"):
        eval_numerical_gradient(np.sum, [1.0, 2.0])


def test_numerical_gradient_rejects_bad_step_and_non_scalar_f():
    with pytest.raises(ValueError, match="h must be a positive"):
        eval_numerical_gradient(np.sum, np.ones(3), h=0.0)
    with pytest.raises(ValueError, match="f must return a scalar"):
        eval_numerical_gradient(lambda v: v * 2, np.ones(3))


def test_numerical_gradient_array_rejects_wrong_upstream_shape():
    with pytest.raises(ValueError, match="df must have the shape of f"):
        eval_numerical_gradient_array(lambda v: v * 2, np.ones(3), np.ones(4))


def test_rel_error_values():
    a = np.array([1.0, 2.0, 3.0])
    assert rel_error(a, a) == 0.0
    assert rel_error(a, -a) == pytest.approx(1.0)
    assert rel_error(np.zeros(3), np.zeros(3)) == 0.0
    assert rel_error(a, a * (1 + 1e-9)) == pytest.approx(0.5e-9, rel=1e-3)


def test_rel_error_rejects_shape_mismatch_and_nan():
    with pytest.raises(ValueError, match="same shape"):
        rel_error(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="finite"):
        rel_error(np.array([np.nan]), np.array([1.0]))


def _linear_problem(rng):
    params = {"x": rng.standard_normal((4, 3)), "W": rng.standard_normal((3, 2)),
              "b": rng.standard_normal(2)}
    dout = rng.standard_normal((4, 2))

    def loss():
        return np.sum((params["x"] @ params["W"] + params["b"]) * dout)

    grads = {"x": dout @ params["W"].T, "W": params["x"].T @ dout, "b": dout.sum(axis=0)}
    return params, grads, loss


def test_check_gradients_passes_and_prints_aligned_table(rng, capsys):
    params, grads, loss = _linear_problem(rng)
    errors = check_gradients(loss, params, grads)
    assert set(errors) == {"x", "W", "b"}
    assert all(e < 1e-9 for e in errors.values())
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["tensor", "shape", "rel.", "error", "check"]
    rows = lines[2:]
    assert [r.split()[0] for r in rows] == ["x", "W", "b"]
    assert all(r.rstrip().endswith("ok") for r in rows)
    # aligned: the error column starts at the same offset on every row
    assert len({r.index("e-") for r in rows}) == 1


def test_check_gradients_catches_a_wrong_gradient(rng, capsys):
    params, grads, loss = _linear_problem(rng)
    grads["W"] = grads["W"] * 1.01  # a 1 % error, as from a wrong scale factor
    with pytest.raises(GradientCheckError, match=r"1 of 3 tensors.*W \("):
        check_gradients(loss, params, grads)
    out = capsys.readouterr().out
    w_row = next(line for line in out.splitlines() if line.startswith("W "))
    assert "FAIL" in w_row


def test_check_gradients_catches_a_transposed_gradient(rng):
    params = {"A": rng.standard_normal((3, 3))}
    v = rng.standard_normal(3)

    def loss():
        return v @ params["A"] @ v + np.sum(params["A"] * np.arange(9).reshape(3, 3))

    wrong = {"A": (np.outer(v, v) + np.arange(9).reshape(3, 3)).T}
    with pytest.raises(GradientCheckError):
        check_gradients(loss, params, wrong, verbose=False)


def test_check_gradients_array_valued_with_upstream(rng):
    params = {"x": rng.standard_normal((2, 3))}
    dout = rng.standard_normal((2, 3))
    errors = check_gradients(lambda: np.tanh(params["x"]), params,
                             {"x": dout * (1 - np.tanh(params["x"]) ** 2)}, df=dout,
                             verbose=False)
    assert errors["x"] < 1e-9


def test_check_gradients_rejects_unknown_names_and_wrong_shapes(rng):
    params, grads, loss = _linear_problem(rng)
    with pytest.raises(ValueError, match=r"grads\['V'\] has no matching entry"):
        check_gradients(loss, params, {"V": grads["W"]})
    with pytest.raises(ValueError, match=r"grads\['W'\] must have the shape"):
        check_gradients(loss, params, {"W": grads["W"].T})
    with pytest.raises(ValueError, match="at least one"):
        check_gradients(loss, params, {})
    with pytest.raises(ValueError, match="tol must be"):
        check_gradients(loss, params, grads, tol=-1)


def test_compare_prints_and_raises(capsys):
    a = np.array([1.0, 2.0])
    assert compare("same", a, a.copy())
    assert compare("close", a, a + 1e-12)
    out = capsys.readouterr().out.splitlines()
    assert out[0].split("|")[1].strip() == "exact: True"
    assert out[1].split("|")[1].strip() == "exact: False"
    assert "allclose: True" in out[1]
    with pytest.raises(AssertionError, match="far: differs from the reference"):
        compare("far", a, a + 1.0)
    assert not compare("far", a, a + 1.0, raise_on_mismatch=False)
    with pytest.raises(ValueError, match="shape"):
        compare("shape", a, np.ones(3))


def test_compare_accepts_torch_tensors():
    torch = pytest.importorskip("torch")
    t = torch.arange(3.0, requires_grad=True)
    assert compare("tensor", t.detach().numpy(), t)


def test_check_gradients_zero_gradient_passes_and_says_so(rng, capsys):
    """A parameter the output ignores (softmax is shift-invariant) has a zero gradient."""
    params = {"x": rng.standard_normal(4), "c": np.array([0.3])}
    dout = rng.standard_normal(4)

    def softmax_shifted():
        z = params["x"] + params["c"]
        e = np.exp(z - z.max())
        return e / e.sum()

    y = softmax_shifted()
    dx = y * (dout - np.dot(dout, y))
    errors = check_gradients(softmax_shifted, params, {"x": dx, "c": np.array([dx.sum()])},
                             df=dout)
    assert errors["c"] == 0.0
    c_row = capsys.readouterr().out.splitlines()[-1]
    assert c_row.split() == ["c", "(1,)", "-", "ok", "(zero", "gradient)"]
    # a gradient that is wrongly non-zero still fails
    with pytest.raises(GradientCheckError, match="c"):
        check_gradients(softmax_shifted, params, {"c": np.array([1e-3])}, df=dout)


def test_check_parity_prints_the_table_and_passes_zero_tensors(capsys):
    a = {"w": np.ones(3), "z": np.zeros(2)}
    b = {"w": np.ones(3) * (1 + 1e-12), "z": np.full(2, 1e-17)}
    errors = check_parity(a, b, tol=1e-10)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["tensor", "shape", "rel.", "error", "check"]
    assert lines[2].split()[:2] == ["w", "(3,)"] and lines[2].split()[-1] == "ok"
    assert lines[3].split() == ["z", "(2,)", "-", "ok", "(zero", "gradient)"]
    assert list(errors) == ["w", "z"] and 0 < errors["w"] < 1e-10 and errors["z"] == 0.0
    # float32 noise counts as zero below 1e-6 unless both are float64
    assert check_parity({"z": np.full(2, 1e-7, np.float32)}, {"z": np.zeros(2)}, tol=1e-10,
                        verbose=False) == {"z": 0.0}
    with pytest.raises(AssertionError, match="1 of 1 tensors"):
        check_parity({"z": np.full(2, 1e-7)}, {"z": np.zeros(2)}, tol=1e-10, verbose=False)


def test_check_parity_raises_naming_every_tensor_above_tol():
    a = {"w": np.ones(3), "v": np.arange(4.0), "z": np.zeros(2)}
    b = {"w": np.ones(3) * 1.01, "v": -np.arange(4.0), "z": np.zeros(2)}
    with pytest.raises(AssertionError, match=r"2 of 3 tensors differ by more than tol=1e-10: "
                                             r"w \(4\.98e-03\), v \(1\.00e\+00\)"):
        check_parity(a, b, tol=1e-10, verbose=False)


def test_check_parity_accepts_torch_tensors_and_refuses_mismatches():
    torch = pytest.importorskip("torch")
    t = torch.arange(3.0, dtype=torch.float64, requires_grad=True)
    assert check_parity({"t": t}, {"t": t.detach().numpy()}, tol=1e-12,
                        verbose=False) == {"t": 0.0}
    with pytest.raises(ValueError, match=r"same names; only in ours: \['v'\], only in "
                                         r"reference: \[\]"):
        check_parity({"t": np.ones(2), "v": np.ones(2)}, {"t": np.ones(2)}, tol=1e-10)
    with pytest.raises(ValueError, match=r"t: ours has shape \(2,\), reference \(3,\)"):
        check_parity({"t": np.ones(2)}, {"t": np.ones(3)}, tol=1e-10)
    with pytest.raises(ValueError, match="tol must be a positive number"):
        check_parity({"t": np.ones(2)}, {"t": np.ones(2)}, tol=0)
    with pytest.raises(ValueError, match="must be finite"):
        check_parity({"t": np.array([np.nan, 1.0])}, {"t": np.ones(2)}, tol=1e-10)
