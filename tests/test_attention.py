"""transformer_lab.attention: masks, scaled dot-product attention and multi-head attention --
gradient-checked in float64, matched against PyTorch, and refusing bad input clearly."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from transformer_lab import attention as A
from transformer_lab.gradient_check import check_gradients, rel_error

TOL = {np.float32: 1e-5, np.float64: 1e-10}
DTYPES = [np.float32, np.float64]


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def close(ours, theirs, dtype, what):
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    err = rel_error(ours, theirs)
    assert err < TOL[dtype], f"{what}: relative error {err:.2e} above {TOL[dtype]:.0e}"


# ------------------------------------------------------------------ masks

def test_causal_and_padding_masks():
    np.testing.assert_array_equal(A.causal_mask(3), [[0, 1, 1], [0, 0, 1], [0, 0, 0]])
    assert A.causal_mask(2, 4).shape == (2, 4)
    np.testing.assert_array_equal(A.padding_mask(np.array([2, 0, 3])),
                                  [[0, 0, 1], [1, 1, 1], [0, 0, 0]])
    assert A.padding_mask(np.array([1]), max_len=4).tolist() == [[False, True, True, True]]
    with pytest.raises(ValueError, match="length must be a positive integer"):
        A.causal_mask(0)
    with pytest.raises(ValueError, match="lengths must be at most max_len=2"):
        A.padding_mask(np.array([3]), max_len=2)
    with pytest.raises(ValueError, match="lengths must be non-negative"):
        A.padding_mask(np.array([-1]))
    with pytest.raises(TypeError, match="lengths must be a 1-D integer array"):
        A.padding_mask(np.array([1.5]))


# ------------------------------------------------------------------ scaled dot-product attention

SDPA_SHAPES = [  # (leading axes, T, S, d_k, d_v)
    ((1,), 1, 1, 2, 3),
    ((2,), 4, 6, 3, 2),
    ((2, 3), 5, 5, 4, 4),
    ((1, 1), 3, 2, 1, 1),
]


def _masks(rng, lead, t, s, kind):
    if kind == "none":
        return None, None
    kpm = np.zeros((lead[0], s), dtype=bool)
    kpm[:, s - 1:] = s > 1  # pad the last key when there is more than one
    if kind == "bool":
        return np.triu(np.ones((t, s), dtype=bool), k=1 + max(0, s - t)), kpm
    add = rng.standard_normal((t, s))
    return add, np.where(kpm, -np.inf, 0.0)


@pytest.mark.parametrize("lead,t,s,dk,dv", SDPA_SHAPES)
@pytest.mark.parametrize("mask_kind", ["none", "bool", "float"])
def test_sdpa_gradcheck(rng, lead, t, s, dk, dv, mask_kind):
    p = {"q": rng.standard_normal((*lead, t, dk)), "k": rng.standard_normal((*lead, s, dk)),
         "v": rng.standard_normal((*lead, s, dv))}
    am, kpm = _masks(rng, lead, t, s, mask_kind)

    def fwd():
        return A.scaled_dot_product_attention_forward(p["q"], p["k"], p["v"], am, kpm)[0]

    out, cache = A.scaled_dot_product_attention_forward(p["q"], p["k"], p["v"], am, kpm)
    dout = rng.standard_normal(out.shape)
    dq, dk_, dv_ = A.scaled_dot_product_attention_backward(dout, cache)
    check_gradients(fwd, p, {"q": dq, "k": dk_, "v": dv_}, df=dout, verbose=False)


def test_sdpa_gradcheck_with_weights_gradient(rng):
    p = {"q": rng.standard_normal((2, 3, 4)), "k": rng.standard_normal((2, 5, 4)),
         "v": rng.standard_normal((2, 5, 3))}
    out, cache = A.scaled_dot_product_attention_forward(p["q"], p["k"], p["v"])
    dout, dw = rng.standard_normal(out.shape), rng.standard_normal(cache.weights.shape)

    def loss():
        o, c = A.scaled_dot_product_attention_forward(p["q"], p["k"], p["v"])
        return np.sum(o * dout) + np.sum(c.weights * dw)

    dq, dk, dv = A.scaled_dot_product_attention_backward(dout, cache, dweights=dw)
    check_gradients(loss, p, {"q": dq, "k": dk, "v": dv}, verbose=False)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_kind", ["none", "bool", "float"])
def test_sdpa_matches_torch(rng, dtype, mask_kind):
    q = rng.standard_normal((2, 3, 4, 8)).astype(dtype)
    k = rng.standard_normal((2, 3, 6, 8)).astype(dtype)
    v = rng.standard_normal((2, 3, 6, 5)).astype(dtype)
    am, kpm = _masks(rng, (2, 3), 4, 6, mask_kind)
    out, cache = A.scaled_dot_product_attention_forward(q, k, v, am, kpm)
    # torch: a bool mask is True where attention is *allowed*; a float mask is added.
    if mask_kind == "none":
        tmask = None
    elif mask_kind == "bool":
        tmask = torch.tensor(~(am[None, None] | kpm[:, None, None, :]))
    else:
        tmask = torch.tensor((am[None, None] + kpm[:, None, None, :]).astype(dtype))
    qt, kt, vt = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    ref = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=tmask)
    dout = rng.standard_normal(out.shape).astype(dtype)
    ref.backward(torch.tensor(dout))
    grads = A.scaled_dot_product_attention_backward(dout, cache)
    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
    close(out, ref, dtype, "out")
    for name, g, tg in zip("qkv", grads, (qt, kt, vt), strict=True):
        close(g, tg.grad, dtype, f"d{name}")


def test_fully_masked_row_gives_zeros_and_no_nan_anywhere(rng):
    q, k, v = (rng.standard_normal((2, 3, 4)) for _ in range(3))
    am = np.zeros((3, 3), dtype=bool)
    am[1] = True  # query 1 may attend to nothing
    out, cache = A.scaled_dot_product_attention_forward(q, k, v, am)
    dout = rng.standard_normal(out.shape)
    dq, dk, dv = A.scaled_dot_product_attention_backward(dout, cache)
    assert all(np.isfinite(a).all() for a in (out, cache.weights, dq, dk, dv))
    assert np.all(out[:, 1] == 0) and np.all(cache.weights[:, 1] == 0) and np.all(dq[:, 1] == 0)
    # the other rows are exactly what attention over them alone computes
    keep = [0, 2]
    out2, cache2 = A.scaled_dot_product_attention_forward(q[:, keep], k, v)
    np.testing.assert_allclose(out[:, keep], out2, rtol=1e-13)
    dq2, dk2, dv2 = A.scaled_dot_product_attention_backward(dout[:, keep], cache2)
    np.testing.assert_allclose(dk, dk2, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(dv, dv2, rtol=1e-12, atol=1e-15)
    # the same as torch's F.scaled_dot_product_attention, which also returns zeros there
    ref = F.scaled_dot_product_attention(*(torch.tensor(a) for a in (q, k, v)),
                                         attn_mask=torch.tensor(~am))
    close(out, ref, np.float64, "out")
    # and with a key padding mask that pads a whole sequence
    kpm = np.array([[False, False, False], [True, True, True]])
    out, cache = A.scaled_dot_product_attention_forward(q, k, v, key_padding_mask=kpm)
    assert np.all(out[1] == 0) and np.isfinite(out).all()


def test_large_negative_float_mask_is_not_the_same_as_blocking(rng):
    """A row masked with -1e9 everywhere is shifted by a constant: softmax ignores the mask and
    the row attends exactly as if unmasked -- to the keys it was meant not to see."""
    q, k, v = (rng.standard_normal((1, 2, 3)) for _ in range(3))
    am = np.array([[0.0, 0.0], [-1e9, -1e9]])
    _, cache = A.scaled_dot_product_attention_forward(q, k, v, am)
    _, unmasked = A.scaled_dot_product_attention_forward(q, k, v)
    np.testing.assert_allclose(cache.weights[0, 1], unmasked.weights[0, 1], rtol=1e-6)
    assert np.all(cache.weights[0, 1] > 0)


# ------------------------------------------------------------------ multi-head attention

def torch_mha(e, h, kdim=None, vdim=None, bias=True, dtype=np.float64, seed=0):
    torch.manual_seed(seed)
    m = torch.nn.MultiheadAttention(e, h, bias=bias, kdim=kdim, vdim=vdim, batch_first=True,
                                    dtype=torch.float64 if dtype == np.float64 else torch.float32)
    with torch.no_grad():
        for prm in m.parameters():
            prm.normal_(0, 0.5)
    return m


def params_of(m, packed):
    """Our parameter dict (NumPy layout: transposed weights) from an nn.MultiheadAttention."""
    def arr(x):
        return x.detach().numpy().copy()
    e = m.embed_dim
    p = {}
    if m._qkv_same_embed_dim:
        w = arr(m.in_proj_weight)
        if packed:
            p["W_qkv"] = w.T.copy()
        else:
            p.update(W_q=w[:e].T.copy(), W_k=w[e:2 * e].T.copy(), W_v=w[2 * e:].T.copy())
    else:
        p.update(W_q=arr(m.q_proj_weight).T.copy(), W_k=arr(m.k_proj_weight).T.copy(),
                 W_v=arr(m.v_proj_weight).T.copy())
    p["W_o"] = arr(m.out_proj.weight).T.copy()
    if m.in_proj_bias is not None:
        b = arr(m.in_proj_bias)
        if packed:
            p["b_qkv"] = b
        else:
            p.update(b_q=b[:e], b_k=b[e:2 * e], b_v=b[2 * e:])
        p["b_o"] = arr(m.out_proj.bias)
    return p


def compare_param_grads(grads, m, packed, dtype):
    """Every parameter gradient against torch's. The key bias gets a zero gradient in exact
    arithmetic (softmax ignores a shift shared by a query's scores), so alone it is rounding
    noise; it is compared as part of the packed in-projection bias, as torch stores it."""
    ref = torch_grads_in_our_layout(m, packed)
    if "b_k" in ref:
        ref["b_qkv"] = np.concatenate([ref.pop(n) for n in ("b_q", "b_k", "b_v")])
        grads = {**grads, "b_qkv": np.concatenate([grads[n] for n in ("b_q", "b_k", "b_v")])}
    for name, tg in ref.items():
        assert grads[name].dtype == dtype
        close(grads[name], tg, dtype, f"d{name}")


def torch_grads_in_our_layout(m, packed):
    e = m.embed_dim
    g = {}
    if m._qkv_same_embed_dim:
        w = m.in_proj_weight.grad.numpy()
        if packed:
            g["W_qkv"] = w.T
        else:
            g.update(W_q=w[:e].T, W_k=w[e:2 * e].T, W_v=w[2 * e:].T)
    else:
        g.update(W_q=m.q_proj_weight.grad.numpy().T, W_k=m.k_proj_weight.grad.numpy().T,
                 W_v=m.v_proj_weight.grad.numpy().T)
    g["W_o"] = m.out_proj.weight.grad.numpy().T
    if m.in_proj_bias is not None:
        b = m.in_proj_bias.grad.numpy()
        if packed:
            g["b_qkv"] = b
        else:
            g.update(b_q=b[:e], b_k=b[e:2 * e], b_v=b[2 * e:])
        g["b_o"] = m.out_proj.bias.grad.numpy()
    return g


MHA_CASES = [  # (B, T, S, E, H, kdim, vdim)
    (1, 1, 1, 4, 1, None, None),
    (2, 3, 5, 4, 4, None, None),   # as many heads as dimensions
    (2, 4, 3, 6, 2, 5, 3),         # kdim, vdim different from E; S != T
    (3, 2, 2, 8, 2, None, None),
]


@pytest.mark.parametrize("b,t,s,e,h,kdim,vdim,packed", [
    (*case, packed) for case in MHA_CASES for packed in (True, False)
    if not (packed and (case[5] or case[6]))  # packed projections need kdim = vdim = E
])
@pytest.mark.parametrize("bias", [True, False])
def test_mha_gradcheck(rng, b, t, s, e, h, kdim, vdim, bias, packed):
    params = A.mha_init(e, h, kdim, vdim, bias=bias, packed=packed, rng=rng, dtype=np.float64)
    for name in params:
        params[name] = rng.standard_normal(params[name].shape)
    p = {"query": rng.standard_normal((b, t, e)),
         "key": rng.standard_normal((b, s, kdim or e)),
         "value": rng.standard_normal((b, s, vdim or e)), **params}
    kpm = np.zeros((b, s), dtype=bool)
    kpm[0, -1] = s > 1
    am = np.triu(np.ones((t, s), dtype=bool), k=1 + max(0, s - t))

    def fwd():
        prm = {n: p[n] for n in params}
        return A.multi_head_attention_forward(p["query"], p["key"], p["value"], prm, h,
                                              attn_mask=am, key_padding_mask=kpm)[0]

    out, _, cache = A.multi_head_attention_forward(p["query"], p["key"], p["value"], params, h,
                                                   attn_mask=am, key_padding_mask=kpm)
    dout = rng.standard_normal(out.shape)
    dq, dk, dv, grads = A.multi_head_attention_backward(dout, cache)
    assert set(grads) == set(params)
    check_gradients(fwd, p, {"query": dq, "key": dk, "value": dv, **grads}, df=dout,
                    verbose=False)


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("h", [1, 2, 6])
def test_self_attention_gradcheck_and_equals_mha(rng, packed, h):
    e = 6
    params = A.mha_init(e, h, packed=packed, rng=rng, dtype=np.float64)
    for name in params:
        params[name] = rng.standard_normal(params[name].shape) * 0.5
    p = {"x": rng.standard_normal((2, 4, e)), **params}
    am = A.causal_mask(4)

    def fwd():
        return A.self_attention_forward(p["x"], {n: p[n] for n in params}, h, attn_mask=am)[0]

    out, w, cache = A.self_attention_forward(p["x"], params, h, attn_mask=am)
    out2, w2, cache2 = A.multi_head_attention_forward(p["x"], p["x"], p["x"], params, h,
                                                      attn_mask=am)
    np.testing.assert_allclose(out, out2, rtol=1e-12)
    dout = rng.standard_normal(out.shape)
    dx, grads = A.self_attention_backward(dout, cache)
    dq, dk, dv, grads2 = A.multi_head_attention_backward(dout, cache2)
    np.testing.assert_allclose(dx, dq + dk + dv, rtol=1e-10, atol=1e-12)  # three paths
    for n in params:
        np.testing.assert_allclose(grads[n], grads2[n], rtol=1e-10, atol=1e-12)
    check_gradients(fwd, p, {"x": dx, **grads}, df=dout, verbose=False)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b,t,s,e,h,kdim,vdim", MHA_CASES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("average", [True, False])
def test_mha_matches_torch(rng, dtype, b, t, s, e, h, kdim, vdim, bias, average):
    m = torch_mha(e, h, kdim, vdim, bias, dtype)
    packed = m._qkv_same_embed_dim
    params = params_of(m, packed)
    q = rng.standard_normal((b, t, e)).astype(dtype)
    k = rng.standard_normal((b, s, kdim or e)).astype(dtype)
    v = rng.standard_normal((b, s, vdim or e)).astype(dtype)
    kpm = np.zeros((b, s), dtype=bool)
    kpm[0, -1] = s > 1
    am = np.triu(np.ones((t, s), dtype=bool), k=1 + max(0, s - t))
    out, w, cache = A.multi_head_attention_forward(q, k, v, params, h, am, kpm,
                                                   average_attn_weights=average)
    qt, kt, vt = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    ref, ref_w = m(qt, kt, vt, attn_mask=torch.tensor(am), key_padding_mask=torch.tensor(kpm),
                   need_weights=True, average_attn_weights=average)
    dout = rng.standard_normal(out.shape).astype(dtype)
    ref.backward(torch.tensor(dout))
    dq, dk, dv, grads = A.multi_head_attention_backward(dout, cache)
    close(out, ref, dtype, "out")
    close(w, ref_w, dtype, "weights")
    for name, g, tg in zip(("query", "key", "value"), (dq, dk, dv), (qt, kt, vt), strict=True):
        close(g, tg.grad, dtype, f"d{name}")
    compare_param_grads(grads, m, packed, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_self_attention_packed_matches_torch_self_attention(rng, dtype):
    m = torch_mha(8, 2, dtype=dtype)
    params = params_of(m, packed=True)
    x = rng.standard_normal((3, 5, 8)).astype(dtype)
    kpm = A.padding_mask(np.array([5, 2, 4]), 5)
    out, _, cache = A.self_attention_forward(x, params, 2, A.causal_mask(5), kpm)
    xt = torch.tensor(x, requires_grad=True)
    ref, _ = m(xt, xt, xt, attn_mask=torch.tensor(A.causal_mask(5)),
               key_padding_mask=torch.tensor(kpm))
    dout = rng.standard_normal(out.shape).astype(dtype)
    ref.backward(torch.tensor(dout))
    dx, grads = A.self_attention_backward(dout, cache)
    close(out, ref, dtype, "out")
    close(dx, xt.grad, dtype, "dx")
    compare_param_grads(grads, m, True, dtype)


def test_mha_weights_gradient(rng):
    params = A.mha_init(4, 2, rng=rng, dtype=np.float64)
    p = {"q": rng.standard_normal((2, 3, 4)), "kv": rng.standard_normal((2, 5, 4)), **params}
    for average in (True, False):
        out, w, cache = A.multi_head_attention_forward(p["q"], p["kv"], p["kv"], params, 2,
                                                       average_attn_weights=average)
        dout, dw = rng.standard_normal(out.shape), rng.standard_normal(w.shape)

        def loss(average=average, dout=dout, dw=dw):
            o, ww, _ = A.multi_head_attention_forward(p["q"], p["kv"], p["kv"],
                                                      {n: p[n] for n in params}, 2,
                                                      average_attn_weights=average)
            return np.sum(o * dout) + np.sum(ww * dw)

        dq, dk, dv, grads = A.multi_head_attention_backward(dout, cache, dweights=dw)
        check_gradients(loss, p, {"q": dq, "kv": dk + dv, **grads}, verbose=False)


def test_mha_fully_masked_row_is_bias_and_does_not_leak(rng):
    params = A.mha_init(4, 2, rng=rng, dtype=np.float64)
    params["b_o"] = rng.standard_normal(4)
    x = rng.standard_normal((2, 3, 4))
    am = np.zeros((3, 3), dtype=bool)
    am[0] = True
    out, w, cache = A.self_attention_forward(x, params, 2, attn_mask=am)
    dx, grads = A.self_attention_backward(np.ones_like(out), cache)
    assert np.allclose(out[:, 0], params["b_o"]) and np.all(w[:, 0] == 0)
    assert np.isfinite(dx).all() and all(np.isfinite(g).all() for g in grads.values())


# ------------------------------------------------------------------ bad input

def test_attention_rejects_bad_input(rng):
    q, k, v = (rng.standard_normal((2, 3, 4)) for _ in range(3))
    params = A.mha_init(4, 2, rng=rng, dtype=np.float64)
    with pytest.raises(ValueError, match="must be divisible by num_heads = 3"):
        A.multi_head_attention_forward(q, k, v, params, 3)
    with pytest.raises(ValueError, match="embed_dim must be divisible by num_heads"):
        A.mha_init(6, 4)
    with pytest.raises(ValueError, match=r"attn_mask must be broadcastable .* got shape \(3, 4\)"):
        A.multi_head_attention_forward(q, k, v, params, 2, attn_mask=np.zeros((3, 4), bool))
    with pytest.raises(TypeError, match="attn_mask must be a bool mask .* got dtype int64"):
        A.multi_head_attention_forward(q, k, v, params, 2, attn_mask=np.zeros((3, 3), int))
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape .* \(2, 3\), got "
                                         r"\(3, 2\)"):
        A.multi_head_attention_forward(q, k, v, params, 2, key_padding_mask=np.zeros((3, 2), bool))
    with pytest.raises(ValueError, match="must not contain NaN"):
        A.scaled_dot_product_attention_forward(q, k, v, np.full((3, 3), np.nan))
    with pytest.raises(ValueError, match="key and value must have the same length S, got 3 and 2"):
        A.multi_head_attention_forward(q, k, v[:, :2], params, 2)
    with pytest.raises(ValueError, match="k and v must have the same length S"):
        A.scaled_dot_product_attention_forward(q, k, v[:, :2])
    with pytest.raises(ValueError, match="query must have 3 dimensions"):
        A.multi_head_attention_forward(q[0], k, v, params, 2)
    with pytest.raises(ValueError, match="same batch size"):
        A.multi_head_attention_forward(q, k[:1], v[:1], params, 2)
    with pytest.raises(ValueError, match="q and k must have the same last dimension"):
        A.scaled_dot_product_attention_forward(q, k[..., :2], v)
    with pytest.raises(TypeError, match="params\\['W_q'\\] must have the dtype of the query"):
        A.multi_head_attention_forward(q, k, v, {**params, "W_q": params["W_q"].astype(np.float32)},
                                       2)
    with pytest.raises(ValueError, match="params is missing 'W_o'"):
        A.multi_head_attention_forward(q, k, v, {n: a for n, a in params.items() if n != "W_o"}, 2)
    with pytest.raises(ValueError, match="all of the biases"):
        A.multi_head_attention_forward(q, k, v, {n: a for n, a in params.items() if n != "b_k"}, 2)
    with pytest.raises(ValueError, match="call the forward function first"):
        A.multi_head_attention_backward(q, None)
    _, _, cache = A.self_attention_forward(q, params, 2)
    with pytest.raises(TypeError, match="cache must be the cache that multi_head_attention_forward"
                                        " returned, got the cache of self_attention_forward"):
        A.multi_head_attention_backward(q, cache)
    with pytest.raises(ValueError, match=r"dout must have shape \(2, 3, 4\)"):
        A.self_attention_backward(q[:, :2], cache)


# ------------------------------------------------------------------ outputs, dout, NaN, init

def test_per_head_weights_are_read_only_and_editing_them_cannot_change_gradients(rng):
    params = A.mha_init(4, 2, rng=rng, dtype=np.float64)
    q, kv = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4))
    dout = rng.standard_normal((2, 3, 4))
    out, w, cache = A.multi_head_attention_forward(q, kv, kv, params, 2,
                                                   average_attn_weights=False)
    expected = A.multi_head_attention_backward(dout, A.multi_head_attention_forward(
        q, kv, kv, params, 2, average_attn_weights=False)[2])
    assert w.shape == (2, 2, 3, 5) and not w.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        w[...] = 0
    with pytest.raises(ValueError, match="read-only"):
        cache.weights[:, :, 0] = 0
    got = A.multi_head_attention_backward(dout, cache)
    for a, b in zip(got[:3], expected[:3], strict=True):
        np.testing.assert_array_equal(a, b)
    # averaged weights are a new array, the caller's to edit
    _, w_avg, cache = A.self_attention_forward(q, params, 2)
    w_avg[...] = 0
    assert cache.weights.sum() > 0
    # scaled dot-product attention: the same buffer
    _, c = A.scaled_dot_product_attention_forward(q, kv, kv)
    with pytest.raises(ValueError, match="read-only"):
        c.weights[0] = 0


def test_need_weights_false_returns_no_weights(rng):
    params = A.mha_init(4, 2, rng=rng, dtype=np.float64)
    x = rng.standard_normal((2, 3, 4))
    out, w, _ = A.self_attention_forward(x, params, 2, need_weights=False)
    out2, w2, _ = A.multi_head_attention_forward(x, x, x, params, 2, need_weights=False)
    assert w is None and w2 is None
    np.testing.assert_allclose(out, A.self_attention_forward(x, params, 2)[0], rtol=1e-14)
    np.testing.assert_allclose(out2, out, rtol=1e-12)
    with pytest.raises(TypeError, match="need_weights must be True or False, got 'no'"):
        A.self_attention_forward(x, params, 2, need_weights="no")


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_backwards_check_dout_and_dweights(rng, dtype):
    other = np.float64 if dtype == np.float32 else np.float32
    q, k, v = (rng.standard_normal((2, 3, 4)).astype(dtype) for _ in range(3))
    params = A.mha_init(4, 2, rng=rng, dtype=dtype)
    _, sd = A.scaled_dot_product_attention_forward(q, k, v)
    _, w, mha = A.multi_head_attention_forward(q, k, v, params, 2)
    _, wh, mha_h = A.multi_head_attention_forward(q, k, v, params, 2, average_attn_weights=False)
    _, _, sa = A.self_attention_forward(q, params, 2)
    backwards = [lambda d, dw=None: A.scaled_dot_product_attention_backward(d, sd, dw),
                 lambda d, dw=None: A.multi_head_attention_backward(d, mha, dw),
                 lambda d, dw=None: A.multi_head_attention_backward(d, mha_h, dw),
                 lambda d, dw=None: A.self_attention_backward(d, sa, dw)]
    weights = [sd.weights, w, wh, w]
    for bwd, wt in zip(backwards, weights, strict=True):
        with pytest.raises(TypeError, match="dout must be a NumPy array, got list"):
            bwd(q.tolist())
        with pytest.raises(TypeError, match=rf"dout must have the dtype of the forward output "
                                            rf"\({np.dtype(dtype)}\), got {np.dtype(other)}"):
            bwd(q.astype(other))
        with pytest.raises(ValueError, match=r"dout must have shape \(2, 3, 4\)"):
            bwd(q[:, :2])
        with pytest.raises(TypeError, match="dweights must be a NumPy array"):
            bwd(q, wt.tolist())
        with pytest.raises(TypeError, match=rf"dweights must have the dtype of the .*weights.* "
                                            rf"\({np.dtype(dtype)}\), got {np.dtype(other)}"):
            bwd(q, np.ones(wt.shape, other))
        with pytest.raises(ValueError, match=rf"dweights must have shape {re_shape(wt.shape)}"):
            bwd(q, np.ones(wt.shape[:-1], dtype))
        assert bwd(q, np.ones(wt.shape, dtype))[0].dtype == dtype


def re_shape(shape):
    return str(tuple(shape)).replace("(", r"\(").replace(")", r"\)")


def test_scale_must_be_a_finite_positive_number(rng):
    q, k, v = (rng.standard_normal((2, 3, 4)) for _ in range(3))
    for bad, error, message in [("a", TypeError, "scale must be a number, got 'a'"),
                                (float("nan"), ValueError, "scale must be finite"),
                                (np.inf, ValueError, "scale must be finite"),
                                (0.0, ValueError, "scale must be positive"),
                                (-0.5, ValueError, "scale must be positive"),
                                (True, TypeError, "scale must be a number")]:
        with pytest.raises(error, match=message):
            A.scaled_dot_product_attention_forward(q, k, v, scale=bad)
    out, cache = A.scaled_dot_product_attention_forward(q, k, v, scale=np.float32(0.5))
    assert cache.scale == 0.5 and type(cache.scale) is float
    assert A.scaled_dot_product_attention_forward(q, k, v)[1].scale == 1 / np.sqrt(4)
    np.testing.assert_array_equal(out, A.scaled_dot_product_attention_forward(q, k, v,
                                                                              scale=0.5)[0])


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("where", ["q", "k"])
@pytest.mark.parametrize("masked", [False, True])
def test_nan_or_infinite_queries_or_keys_raise_instead_of_nan(rng, bad, where, masked):
    q, k, v = (np.abs(rng.standard_normal((2, 3, 4))) + 0.1 for _ in range(3))
    (q if where == "q" else k)[1, 2, 0] = bad  # a NaN or +inf score (q and k are positive)
    am = A.causal_mask(3) if masked else None
    with pytest.raises(ValueError, match="q and k must be finite"):
        A.scaled_dot_product_attention_forward(q, k, v, attn_mask=am)
    # a -inf score is a key with weight 0, as a mask would make it: no NaN anywhere
    k[1, 2, 0] = -np.inf
    q[1, 2, 0] = 1.0
    out, cache = A.scaled_dot_product_attention_forward(q, k, v, attn_mask=am)
    assert np.isfinite(out).all() and np.all(cache.weights[1, :, 2] == 0)


def test_split_and_merge_heads_check_their_input(rng):
    x = rng.standard_normal((2, 3, 4))
    with pytest.raises(ValueError, match=r"x.shape\[-1\] = 4\) must be divisible by "
                                         "num_heads = 3"):
        A.split_heads(x, 3)
    with pytest.raises(ValueError, match="num_heads must be a positive integer"):
        A.split_heads(x, 0)
    with pytest.raises(ValueError, match=r"x must be a NumPy array of shape \(B, T, E\), "
                                         r"got shape \(3, 4\)"):
        A.split_heads(x[0], 2)
    with pytest.raises(TypeError, match=r"x must be a NumPy array .* got list"):
        A.split_heads(x.tolist(), 2)
    with pytest.raises(ValueError, match=r"shape \(B, H, T, Dh\), got shape \(2, 3, 4\)"):
        A.merge_heads(x)
    assert np.array_equal(A.merge_heads(A.split_heads(x, 2)), x)


def test_padding_mask_checks_max_len():
    with pytest.raises(TypeError, match="max_len must be an integer, got '3'"):
        A.padding_mask(np.array([1, 2]), max_len="3")
    with pytest.raises(ValueError, match="max_len must be at least 0, got -1"):
        A.padding_mask(np.array([0]), max_len=-1)
    assert A.padding_mask(np.array([1]), max_len=np.int64(2)).tolist() == [[False, True]]


def test_mha_init_checks_its_arguments_and_is_deterministic(rng):
    for kw, error, message in [(dict(kdim=-1), ValueError, "kdim must be at least 1, got -1"),
                               (dict(kdim=0), ValueError, "kdim must be at least 1, got 0"),
                               (dict(vdim=0), ValueError, "vdim must be at least 1, got 0"),
                               (dict(kdim="3"), TypeError, "kdim must be an integer"),
                               (dict(dtype=int), TypeError, "dtype must be np.float32 or "
                                                            "np.float64"),
                               (dict(dtype=np.float16), TypeError, "dtype must be"),
                               (dict(rng=0), TypeError, "rng must be a NumPy random Generator")]:
        with pytest.raises(error, match=message):
            A.mha_init(4, 2, **kw)
    p = A.mha_init(4, 2, kdim=np.int64(3), vdim=5)
    assert p["W_k"].shape == (3, 4) and p["W_v"].shape == (5, 4)
    a, b = A.mha_init(4, 2), A.mha_init(4, 2)  # default rng: np.random.default_rng(0)
    assert all(np.array_equal(a[n], b[n]) for n in a)
    seeded = A.mha_init(4, 2, rng=np.random.default_rng(0))
    assert all(np.array_equal(a[n], seeded[n]) for n in a)
    other = A.mha_init(4, 2, rng=np.random.default_rng(1))
    assert not np.array_equal(a["W_q"], other["W_q"])
