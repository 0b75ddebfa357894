"""transformer_lab.layers: every backward gradient-checked in float64, every forward/backward
matched against PyTorch autograd in float32 and float64, every bad input refused clearly."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from transformer_lab import layers as L
from transformer_lab.gradient_check import check_gradients, rel_error

TOL = {np.float32: 1e-5, np.float64: 1e-10}
DTYPES = [np.float32, np.float64]


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def t(x, grad=True):
    """A torch leaf tensor sharing nothing with x."""
    return torch.tensor(x, requires_grad=grad)


def assert_close(ours, theirs, dtype, what):
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    assert ours.dtype == dtype, f"{what}: dtype {ours.dtype}, expected {dtype}"
    err = rel_error(ours, theirs)
    assert err < TOL[dtype], f"{what}: relative error {err:.2e} above {TOL[dtype]:.0e}"


# ------------------------------------------------------------------ gradient checks (float64)

@pytest.mark.parametrize("shape", [(1, 1, 3), (4, 5), (2, 3, 5), (7,)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_gradcheck(rng, shape, bias):
    p = {"x": rng.standard_normal(shape), "W": rng.standard_normal((shape[-1], 2))}
    if bias:
        p["b"] = rng.standard_normal(2)
    out, cache = L.linear_forward(p["x"], p["W"], p.get("b"))
    dout = rng.standard_normal(out.shape)
    dx, g = L.linear_backward(dout, cache)
    grads = {"x": dx, **g}
    assert set(g) == ({"W", "b"} if bias else {"W"})
    check_gradients(lambda: L.linear_forward(p["x"], p["W"], p.get("b"))[0], p, grads, df=dout,
                    verbose=False)


@pytest.mark.parametrize("name,fwd,bwd", [
    ("relu", L.relu_forward, L.relu_backward),
    ("gelu", lambda x: L.gelu_forward(x, "none"), L.gelu_backward),
    ("gelu_tanh", lambda x: L.gelu_forward(x, "tanh"), L.gelu_backward),
])
def test_activation_gradcheck(rng, name, fwd, bwd):
    x = rng.standard_normal((3, 4)) * 2
    x[np.abs(x) < 1e-3] = 0.5  # keep away from the kink of the ReLU
    dout = rng.standard_normal(x.shape)
    dx = bwd(dout, fwd(x)[1])
    p = {"x": x}
    check_gradients(lambda: fwd(p["x"])[0], p, {"x": dx}, df=dout, verbose=False)


@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (2, 3, 4)])
def test_softmax_and_log_softmax_gradcheck(rng, shape, axis):
    if axis >= len(shape):
        pytest.skip("axis out of range for this shape")
    p = {"x": rng.standard_normal(shape) * 3}
    dout = rng.standard_normal(shape)
    for fwd, bwd in [(L.softmax_forward, L.softmax_backward),
                     (L.log_softmax_forward, L.log_softmax_backward)]:
        y, cache = fwd(p["x"], axis)
        check_gradients(lambda fwd=fwd: fwd(p["x"], axis)[0], p, {"x": bwd(dout, cache)},
                        df=dout, verbose=False)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_gradcheck_with_ignored_targets(rng, reduction):
    p = {"logits": rng.standard_normal((2, 4, 5))}
    targets = rng.integers(0, 5, size=(2, 4))
    targets[0, 3] = targets[1, 1] = -100
    loss, cache = L.cross_entropy_forward(p["logits"], targets, reduction=reduction)
    dlogits = L.cross_entropy_backward(1.0, cache)
    assert np.all(dlogits[0, 3] == 0) and np.all(dlogits[1, 1] == 0)
    check_gradients(lambda: L.cross_entropy_forward(p["logits"], targets,
                                                    reduction=reduction)[0],
                    p, {"logits": dlogits}, verbose=False)


@pytest.mark.parametrize("affine", ["both", "gamma", "none"])
@pytest.mark.parametrize("shape", [(1, 1, 4), (3, 6), (2, 3, 5)])
def test_layer_norm_gradcheck(rng, shape, affine):
    d = shape[-1]
    p = {"x": rng.standard_normal(shape) * 2 + 1}
    if affine in ("both", "gamma"):
        p["gamma"] = rng.standard_normal(d)
    if affine == "both":
        p["beta"] = rng.standard_normal(d)

    def fwd():
        return L.layer_norm_forward(p["x"], p.get("gamma"), p.get("beta"), eps=1e-5)[0]

    dout = rng.standard_normal(shape)
    dx, g = L.layer_norm_backward(dout, L.layer_norm_forward(
        p["x"], p.get("gamma"), p.get("beta"))[1])
    assert set(g) == set(p) - {"x"}  # keyed like the parameters given
    grads = {"x": dx, **g}
    check_gradients(fwd, p, grads, df=dout, verbose=False)


def test_embedding_gradcheck_with_repeats_and_padding_idx(rng):
    p = {"W": rng.standard_normal((6, 3))}
    ids = np.array([[1, 1, 0], [5, 2, 1]])
    out, cache = L.embedding_forward(ids, p["W"])
    dout = rng.standard_normal(out.shape)
    check_gradients(lambda: L.embedding_forward(ids, p["W"])[0], p,
                    L.embedding_backward(dout, cache), df=dout, verbose=False)
    _, cache = L.embedding_forward(ids, p["W"], padding_idx=1)
    dW = L.embedding_backward(dout, cache)["W"]
    assert np.all(dW[1] == 0) and np.allclose(dW[5], dout[1, 0])


def test_positional_encoding_values():
    pe = L.positional_encoding(50, 8)
    pos = 7  # column 2i = 4 (i = 2) is sin(pos / 10000^(4/8)), column 5 its cosine
    assert pe[pos, 4] == pytest.approx(np.sin(pos / 10000 ** (4 / 8)))
    assert pe[pos, 5] == pytest.approx(np.cos(pos / 10000 ** (4 / 8)))
    assert np.array_equal(pe[0, 0::2], np.zeros(4)) and np.array_equal(pe[0, 1::2], np.ones(4))
    assert L.positional_encoding(3, 5).shape == (3, 5)  # odd width: 3 sines, 2 cosines
    assert L.positional_encoding(3, 4, dtype=np.float32).dtype == np.float32


# ------------------------------------------------------------------ PyTorch parity

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_torch(rng, dtype, bias):
    x = rng.standard_normal((2, 3, 4)).astype(dtype)
    lin = torch.nn.Linear(4, 5, bias=bias, dtype=torch.float64 if dtype == np.float64 else
                          torch.float32)
    W = lin.weight.detach().numpy().T.copy()
    b = lin.bias.detach().numpy().copy() if bias else None
    out, cache = L.linear_forward(x, W, b)
    xt = t(x)
    ref = lin(xt)
    dout = rng.standard_normal(out.shape).astype(dtype)
    ref.backward(torch.tensor(dout))
    dx, g = L.linear_backward(dout, cache)
    assert_close(out, ref, dtype, "out")
    assert_close(dx, xt.grad, dtype, "dx")
    assert_close(g["W"], lin.weight.grad.T, dtype, "dW")
    assert ("b" in g) == bias
    if bias:
        assert_close(g["b"], lin.bias.grad, dtype, "db")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["relu", "gelu", "gelu_tanh"])
def test_activations_match_torch(rng, dtype, name):
    x = (rng.standard_normal((4, 6)) * 3).astype(dtype)
    out, cache = L.activation_forward(x, name)
    xt = t(x)
    ref = F.relu(xt) if name == "relu" else F.gelu(xt, approximate="tanh" if name == "gelu_tanh"
                                                   else "none")
    dout = rng.standard_normal(x.shape).astype(dtype)
    ref.backward(torch.tensor(dout))
    assert_close(out, ref, dtype, "out")
    assert_close(L.activation_backward(dout, cache), xt.grad, dtype, "dx")


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_log_softmax_match_torch(rng, dtype):
    x = (rng.standard_normal((3, 7)) * 4).astype(dtype)
    dout = rng.standard_normal(x.shape).astype(dtype)
    for fwd, bwd, tf in [(L.softmax_forward, L.softmax_backward, F.softmax),
                         (L.log_softmax_forward, L.log_softmax_backward, F.log_softmax)]:
        out, cache = fwd(x)
        xt = t(x)
        ref = tf(xt, dim=-1)
        ref.backward(torch.tensor(dout))
        assert_close(out, ref, dtype, f"{tf.__name__} out")
        assert_close(bwd(dout, cache), xt.grad, dtype, f"{tf.__name__} dx")


def test_softmax_is_stable_for_huge_inputs():
    x = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, -1000.0, -1000.0]])
    y, _ = L.softmax_forward(x)
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y[0], np.exp([0, 1, 2]) / np.exp([0, 1, 2]).sum())
    np.testing.assert_allclose(y[1], [1 / 3] * 3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_matches_torch(rng, dtype, reduction):
    logits = rng.standard_normal((3, 4, 6)).astype(dtype)
    targets = rng.integers(0, 6, size=(3, 4))
    targets[2, 2:] = 0  # use padding id 0 as ignore_index
    loss, cache = L.cross_entropy_forward(logits, targets, ignore_index=0, reduction=reduction)
    lt = t(logits)
    ref = F.cross_entropy(lt.reshape(-1, 6), torch.tensor(targets.reshape(-1)), ignore_index=0,
                          reduction=reduction)
    ref.backward()
    assert abs(loss - ref.item()) <= TOL[dtype] * abs(ref.item())
    assert_close(L.cross_entropy_backward(1.0, cache), lt.grad, dtype, "dlogits")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine,bias", [(True, True), (True, False), (False, False)])
def test_layer_norm_matches_torch(rng, dtype, affine, bias):
    tdtype = torch.float64 if dtype == np.float64 else torch.float32
    ln = torch.nn.LayerNorm(8, eps=1e-6, elementwise_affine=affine, bias=bias, dtype=tdtype)
    with torch.no_grad():
        if affine:
            ln.weight.normal_()
        if bias:
            ln.bias.normal_()
    x = (rng.standard_normal((2, 5, 8)) * 3 + 1).astype(dtype)
    gamma = ln.weight.detach().numpy().copy() if affine else None
    beta = ln.bias.detach().numpy().copy() if bias else None
    out, cache = L.layer_norm_forward(x, gamma, beta, eps=1e-6)
    xt = t(x)
    ref = ln(xt)
    dout = rng.standard_normal(x.shape).astype(dtype)
    ref.backward(torch.tensor(dout))
    dx, g = L.layer_norm_backward(dout, cache)
    assert_close(out, ref, dtype, "out")
    assert_close(dx, xt.grad, dtype, "dx")
    assert set(g) == {name for name, given in (("gamma", affine), ("beta", bias)) if given}
    if affine:
        assert_close(g["gamma"], ln.weight.grad, dtype, "dgamma")
    if bias:
        assert_close(g["beta"], ln.bias.grad, dtype, "dbeta")


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_matches_torch(rng, dtype):
    tdtype = torch.float64 if dtype == np.float64 else torch.float32
    emb = torch.nn.Embedding(7, 4, padding_idx=0, dtype=tdtype)
    ids = rng.integers(0, 7, size=(3, 5))
    out, cache = L.embedding_forward(ids, emb.weight.detach().numpy().copy(), padding_idx=0)
    ref = emb(torch.tensor(ids))
    dout = rng.standard_normal(out.shape).astype(dtype)
    ref.backward(torch.tensor(dout))
    assert_close(out, ref, dtype, "out")
    assert_close(L.embedding_backward(dout, cache)["W"], emb.weight.grad, dtype, "dW")


# ------------------------------------------------------------------ bad input

def test_linear_rejects_bad_input(rng):
    x, W = rng.standard_normal((2, 3)), rng.standard_normal((3, 4))
    with pytest.raises(ValueError, match=r"W must have shape \(D_in, D_out\) with D_in"):
        L.linear_forward(x, W.T)
    with pytest.raises(ValueError, match=r"b must have shape \(4,\)"):
        L.linear_forward(x, W, np.zeros(3))
    with pytest.raises(TypeError, match="x must be a float32 or float64 array"):
        L.linear_forward(x.astype(int), W)
    with pytest.raises(TypeError, match="x must be a NumPy array"):
        L.linear_forward([[1.0, 2.0, 3.0]], W)
    with pytest.raises(TypeError, match="W must have the dtype of x"):
        L.linear_forward(x.astype(np.float32), W)
    with pytest.raises(ValueError, match="W must have 2 dimensions"):
        L.linear_forward(x, W[None])
    _, cache = L.linear_forward(x, W)
    with pytest.raises(ValueError, match=r"dout must have shape \(2, 4\)"):
        L.linear_backward(np.ones((2, 3)), cache)
    with pytest.raises(ValueError, match="call the forward function first"):
        L.linear_backward(np.ones((2, 4)), None)
    with pytest.raises(TypeError, match="linear_backward: cache must be the cache that "
                                        "linear_forward returned, got the cache of "
                                        "softmax_forward"):
        L.linear_backward(np.ones((2, 4)), L.softmax_forward(x)[1])


def test_token_ids_are_validated(rng):
    W = rng.standard_normal((5, 2))
    with pytest.raises(ValueError, match="below the vocabulary size 5, found 5"):
        L.embedding_forward(np.array([0, 5]), W)
    with pytest.raises(ValueError, match="non-negative token ids, found -1"):
        L.embedding_forward(np.array([0, -1]), W)
    with pytest.raises(TypeError, match="integer token ids, got dtype float64"):
        L.embedding_forward(np.array([0.0, 1.0]), W)
    with pytest.raises(TypeError, match="integer token ids, got dtype bool"):
        L.embedding_forward(np.array([True]), W)


def test_cross_entropy_rejects_bad_targets(rng):
    logits = rng.standard_normal((2, 3))
    with pytest.raises(ValueError, match=r"class ids in \[0, 3\) or ignore_index=-100, found 3"):
        L.cross_entropy_forward(logits, np.array([0, 3]))
    with pytest.raises(ValueError, match=r"targets must have shape \(2,\)"):
        L.cross_entropy_forward(logits, np.array([0, 1, 2]))
    with pytest.raises(TypeError, match="integer array of class ids"):
        L.cross_entropy_forward(logits, np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="every target equals ignore_index"):
        L.cross_entropy_forward(logits, np.array([-100, -100]))
    with pytest.raises(ValueError, match="reduction must be"):
        L.cross_entropy_forward(logits, np.array([0, 1]), reduction="none")


def test_other_layers_reject_bad_input(rng):
    x = rng.standard_normal((2, 4))
    with pytest.raises(ValueError, match=r"gamma must have shape \(4,\)"):
        L.layer_norm_forward(x, np.ones(3))
    with pytest.raises(ValueError, match="eps must be at least 0, got -1.0"):
        L.layer_norm_forward(x, eps=-1.0)
    with pytest.raises(ValueError, match='approximate must be "none" or "tanh"'):
        L.gelu_forward(x, "erf")
    with pytest.raises(ValueError, match="activation must be"):
        L.activation_forward(x, "swish")
    with pytest.raises(ValueError, match="axis must be an integer"):
        L.softmax_forward(x, axis=2)
    with pytest.raises(ValueError, match="max_len must be a positive integer"):
        L.positional_encoding(0, 4)


# ------------------------------------------------------------------ outputs, dout, NaN

def _pairs(rng, dtype):
    """(name, forward(x) -> (out, cache), backward, x) for every forward/backward pair."""
    x = (rng.standard_normal((2, 3, 4)) * 2).astype(dtype)
    W = rng.standard_normal((4, 5)).astype(dtype)
    g, b = rng.standard_normal(4).astype(dtype), rng.standard_normal(4).astype(dtype)
    ids = np.array([[0, 2, 2], [1, 0, 2]])
    return [
        ("linear", lambda x: L.linear_forward(x, W, b[:1].repeat(5)),
         lambda d, c: L.linear_backward(d, c)[0], x),
        ("relu", L.relu_forward, L.relu_backward, x),
        ("gelu", L.gelu_forward, L.gelu_backward, x),
        ("activation", lambda x: L.activation_forward(x, "gelu_tanh"), L.activation_backward, x),
        ("softmax", L.softmax_forward, L.softmax_backward, x),
        ("log_softmax", L.log_softmax_forward, L.log_softmax_backward, x),
        ("layer_norm", lambda x: L.layer_norm_forward(x, g, b),
         lambda d, c: L.layer_norm_backward(d, c)[0], x),
        ("layer_norm_no_affine", L.layer_norm_forward,
         lambda d, c: L.layer_norm_backward(d, c)[0], x),
        ("layer_norm_beta_only", lambda x: L.layer_norm_forward(x, None, b),
         lambda d, c: L.layer_norm_backward(d, c)[0], x),
        ("embedding", lambda W: L.embedding_forward(ids, W),
         lambda d, c: L.embedding_backward(d, c)["W"], x[0]),
    ]


@pytest.mark.parametrize("dtype", DTYPES)
def test_editing_an_output_in_place_does_not_change_the_gradients(rng, dtype):
    for name, fwd, bwd, x in _pairs(rng, dtype):
        out, cache = fwd(x)
        dout = rng.standard_normal(out.shape).astype(dtype)
        expected = bwd(dout, fwd(x)[1])
        if out.flags.writeable:
            out[...] = 7.0
        else:  # an output that is also the cache is read-only
            with pytest.raises(ValueError, match="read-only"):
                out[...] = 7.0
        np.testing.assert_array_equal(bwd(dout, cache), expected, err_msg=name)


def test_layer_norm_without_affine_returns_a_new_array(rng):
    out, cache = L.layer_norm_forward(rng.standard_normal((3, 4)))
    assert out.flags.writeable and not np.shares_memory(out, cache.xhat)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_backward_checks_dout(rng, dtype):
    other = np.float64 if dtype == np.float32 else np.float32
    for name, fwd, bwd, x in _pairs(rng, dtype):
        out, cache = fwd(x)
        with pytest.raises(TypeError, match="dout must be a NumPy array, got list"):
            bwd(out.tolist(), cache)
        with pytest.raises(TypeError, match=f"dout must have the dtype of the forward output "
                                            rf"\({np.dtype(dtype)}\), got {np.dtype(other)}"):
            bwd(np.ones(out.shape, other), cache)
        with pytest.raises(ValueError, match=r"dout must have shape"):
            bwd(np.ones(out.shape[1:], dtype), cache)
        assert bwd(np.ones(out.shape, dtype), cache).dtype == dtype, name


def test_backward_functions_refuse_a_foreign_cache(rng):
    x = rng.standard_normal((2, 3))
    _, soft = L.softmax_forward(x)
    for bwd in (L.relu_backward, L.gelu_backward, L.layer_norm_backward, L.embedding_backward,
                L.cross_entropy_backward):
        with pytest.raises(TypeError, match="cache must be the"):
            bwd(x, soft) if bwd is not L.cross_entropy_backward else bwd(1.0, soft)
        with pytest.raises(ValueError, match="call the forward function first"):
            bwd(x, None) if bwd is not L.cross_entropy_backward else bwd(1.0, None)
    with pytest.raises(TypeError, match="activation_backward: cache must be the"):
        L.activation_backward(x, ("swish", None))


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_backward_checks_dloss(rng, dtype):
    logits = rng.standard_normal((3, 4)).astype(dtype)
    _, cache = L.cross_entropy_forward(logits, np.array([0, 1, 3]))
    for bad, error, message in [("1", TypeError, "dloss must be a number, got '1'"),
                                (True, TypeError, "dloss must be a number, got True"),
                                (np.ones(1), TypeError, "dloss must be a number"),
                                (float("nan"), ValueError, "dloss must be finite"),
                                (np.inf, ValueError, "dloss must be finite")]:
        with pytest.raises(error, match=message):
            L.cross_entropy_backward(bad, cache)
    d1 = L.cross_entropy_backward(np.float32(2.0), cache)
    d2 = L.cross_entropy_backward(2, cache)
    assert d1.dtype == d2.dtype == dtype and np.array_equal(d1, d2)
    np.testing.assert_allclose(d1, 2 * L.cross_entropy_backward(1.0, cache), rtol=1e-6)


@pytest.mark.parametrize("fwd", [L.softmax_forward, L.log_softmax_forward])
@pytest.mark.parametrize("row,what", [([-np.inf, -np.inf, -np.inf], "only -inf"),
                                      ([0.0, np.inf, 1.0], r"\+inf"),
                                      ([0.0, np.nan, 1.0], "a NaN")])
@pytest.mark.parametrize("axis", [0, 1])
def test_softmax_refuses_rows_that_would_give_nan(fwd, row, what, axis):
    x = np.zeros((3, 3))
    x[1] = row
    x = x if axis == 1 else x.T.copy()
    with pytest.raises(ValueError, match=f"every slice along axis {axis}.*holds {what}"):
        fwd(x, axis)
    ok = np.zeros((3, 3))
    ok[1] = [-np.inf, 0.0, -np.inf]  # -inf entries are fine while a row has a finite one
    out, _ = fwd(ok if axis == 1 else ok.T.copy(), axis)
    assert not np.isnan(out).any()


def test_layer_norm_eps_zero_refuses_constant_rows_and_eps_is_a_real_number(rng):
    x = rng.standard_normal((3, 4))
    x[1] = 2.5  # variance 0
    with pytest.raises(ValueError, match=r"x has a row whose entries are all equal .* eps=0.0"):
        L.layer_norm_forward(x, eps=0)
    with pytest.raises(ValueError, match="x has a row .* eps=1e-50"):
        L.layer_norm_forward(x.astype(np.float32), eps=1e-50)  # 0 in float32
    out, _ = L.layer_norm_forward(x, eps=1e-5)
    assert np.isfinite(out).all() and np.all(out[1] == 0)
    np.testing.assert_allclose(L.layer_norm_forward(x[[0, 2]], eps=0)[0],
                               L.layer_norm_forward(x[[0, 2]], eps=0.0)[0])
    ref = L.layer_norm_forward(x, eps=1e-5)[0]
    np.testing.assert_array_equal(L.layer_norm_forward(x, eps=np.float64(1e-5))[0], ref)
    L.layer_norm_forward(x.astype(np.float32), eps=np.float32(1e-5))  # NumPy scalars are fine
    for bad, error, message in [(True, TypeError, "eps must be a number, got True"),
                                ("1e-5", TypeError, "eps must be a number"),
                                (float("nan"), ValueError, "eps must be finite"),
                                (-1e-5, ValueError, "eps must be at least 0")]:
        with pytest.raises(error, match=message):
            L.layer_norm_forward(x, eps=bad)


def test_positional_encoding_checks_base_and_dtype():
    for bad, error, message in [(0, ValueError, "base must be positive, got 0"),
                                (-10.0, ValueError, "base must be positive"),
                                (float("nan"), ValueError, "base must be finite"),
                                ("1e4", TypeError, "base must be a number")]:
        with pytest.raises(error, match=message):
            L.positional_encoding(4, 6, base=bad)
    for bad in (int, np.int64, "int32", np.float16, None, bool):
        with pytest.raises(TypeError, match="dtype must be np.float32 or np.float64"):
            L.positional_encoding(4, 6, dtype=bad)
    assert L.positional_encoding(4, 6, base=np.float32(100), dtype="float32").dtype == np.float32


def test_other_integer_arguments_are_checked(rng):
    x = rng.standard_normal((2, 3))
    with pytest.raises(TypeError, match="axis must be an integer, got 'a'"):
        L.softmax_forward(x, axis="a")
    assert L.softmax_forward(x, axis=np.int64(0))[1].extra == 0  # the axis, in [0, ndim)
    assert L.softmax_forward(x, axis=-2)[1].extra == 0
    with pytest.raises(TypeError, match="padding_idx must be an integer, got '1'"):
        L.embedding_forward(np.array([0, 1]), x, padding_idx="1")
    with pytest.raises(ValueError, match=r"padding_idx must be in \[0, 2\), got 2"):
        L.embedding_forward(np.array([0, 1]), x, padding_idx=2)
    with pytest.raises(TypeError, match="ignore_index must be an integer, got 'x'"):
        L.cross_entropy_forward(x, np.array([0, 1]), ignore_index="x")


# ------------------------------------------------------------------ embedding backward

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,vocab", [((4, 6), 5), ((64, 12), 14), ((3, 7), 1000),
                                         ((5,), 3), ((2, 0), 4)])
@pytest.mark.parametrize("padding_idx", [None, 1])
def test_embedding_backward_equals_add_at(rng, dtype, shape, vocab, padding_idx):
    W = rng.standard_normal((vocab, 8)).astype(dtype)
    ids = rng.integers(0, min(vocab, 6), size=shape)  # many repeats, some rows unused
    out, cache = L.embedding_forward(ids, W, padding_idx=padding_idx)
    dout = rng.standard_normal(out.shape).astype(dtype)
    ref = np.zeros((vocab, 8))
    np.add.at(ref, ids.reshape(-1), dout.reshape(-1, 8).astype(np.float64))
    if padding_idx is not None:
        ref[padding_idx] = 0
    dW = L.embedding_backward(dout, cache)["W"]
    assert dW.dtype == dtype and dW.shape == W.shape
    np.testing.assert_allclose(dW, ref, rtol=TOL[dtype], atol=10 * TOL[dtype])
    unused = np.setdiff1d(np.arange(vocab), ids)
    assert np.all(dW[unused] == 0)
