"""Tiled (FlashAttention-style) attention: equal to naive attention, never the full score matrix.

The reference is the course's naive attention, ``core.attention.attention_forward/backward``
with ``core.attention.causal_mask`` (query i sees keys j <= i), and torch's
``scaled_dot_product_attention`` for the causal convention.
"""

from __future__ import annotations

import inspect
import math
import tracemalloc

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from transformer_lab import flash as ea
from transformer_lab import syllabus
from transformer_lab.checks import CheckFailed, check
from transformer_lab.core import attention as core_attention
from transformer_lab.core import blocks as core_blocks
from transformer_lab.core import flash as core_flash
from transformer_lab.core import layers as core_layers
from transformer_lab.core import multihead as core_multihead
from transformer_lab.core import optim as core_optim
from transformer_lab.gradient_check import eval_numerical_gradient_array, rel_error

TOL = {np.float64: 1e-10, np.float32: 1e-5}


def _qkv(rng, lead, T, S, d=8, d_v=5, dtype=np.float64):
    q = rng.standard_normal((*lead, T, d)).astype(dtype)
    k = rng.standard_normal((*lead, S, d)).astype(dtype)
    v = rng.standard_normal((*lead, S, d_v)).astype(dtype)
    return q, k, v


def _naive(q, k, v, dout, causal):
    mask = core_attention.causal_mask(q.shape[-2], k.shape[-2]) if causal else None
    out, cache = core_attention.attention_forward(q, k, v, mask)
    return out, core_attention.attention_backward(dout, cache)


def _close(got, want, tol, name=""):
    """|got - want| <= tol * (1 + |want|), entry by entry; the dtype is the forward's."""
    assert got.shape == want.shape and got.dtype == want.dtype, name
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=name)


# --------------------------------------------------------------------------------------------
# Equal to naive attention


CASES = [  # (leading axes, T, S, block_size)
    ((), 16, 16, 4),  # lengths multiples of the block
    ((), 13, 13, 4),  # ... and not
    ((), 13, 5, 4),  # more queries than keys
    ((), 5, 13, 4),  # more keys than queries
    ((), 9, 7, 1),  # block size 1
    ((), 9, 7, 64),  # block larger than both lengths
    ((), 1, 1, 3),  # one query, one key
    ((2,), 11, 11, 3),  # a batch axis
    ((2, 3), 10, 7, 4),  # batch and heads
    ((2, 3), 7, 10, 8),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("lead,T,S,block", CASES)
def test_equal_to_naive_attention(lead, T, S, block, causal, dtype):
    rng = np.random.default_rng(T * 100 + S + block)
    q, k, v = _qkv(rng, lead, T, S, dtype=dtype)
    dout = rng.standard_normal((*lead, T, v.shape[-1])).astype(dtype)
    want_out, want_grads = _naive(q, k, v, dout, causal)
    out, cache = ea.flash_attention_forward(q, k, v, causal=causal, block_size=block)
    grads = ea.flash_attention_backward(dout, cache)
    _close(out, want_out, TOL[dtype])
    for name, got, want in zip("qkv", grads, want_grads, strict=True):
        _close(got, want, TOL[dtype], f"d{name}")


@pytest.mark.parametrize("T,S", [(6, 6), (7, 4), (4, 7)])
def test_causal_convention_is_torchs_is_causal(T, S):
    rng = np.random.default_rng(1)
    q, k, v = _qkv(rng, (2,), T, S)
    out, _ = ea.flash_attention_forward(q, k, v, causal=True, block_size=3)
    want = F.scaled_dot_product_attention(*map(torch.from_numpy, (q, k, v)), is_causal=True)
    _close(out, want.numpy(), 1e-10)


def test_every_block_size_gives_the_same_result():
    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng, (), 12, 12)
    dout = rng.standard_normal((12, 5))
    ref_out, ref_cache = ea.flash_attention_forward(q, k, v, causal=True, block_size=12)
    ref = ea.flash_attention_backward(dout, ref_cache)
    for block in (1, 2, 5, 7, 11, 13, 1000):
        out, cache = ea.flash_attention_forward(q, k, v, causal=True, block_size=block)
        _close(out, ref_out, 1e-12)
        for got, want in zip(ea.flash_attention_backward(dout, cache), ref, strict=True):
            _close(got, want, 1e-12)


def test_numerical_gradients():
    rng = np.random.default_rng(3)
    q, k, v = _qkv(rng, (2,), 5, 6, d=3, d_v=2)
    dout = rng.standard_normal((2, 5, 2))
    _, cache = ea.flash_attention_forward(q, k, v, causal=True, block_size=2)
    grads = ea.flash_attention_backward(dout, cache)
    inputs = {"q": q, "k": k, "v": v}
    for (name, x), analytic in zip(inputs.items(), grads, strict=True):
        def f(_, name=name, x=x):
            args = {**inputs, name: x}
            return core_flash.flash_attention_forward(args["q"], args["k"], args["v"], True, 2)[0]
        numeric = eval_numerical_gradient_array(f, x, dout)
        assert rel_error(analytic, numeric) < 1e-7, name


def test_large_scores_do_not_overflow():
    # scores of several hundred: exp overflows without the running maximum
    rng = np.random.default_rng(4)
    q, k, v = _qkv(rng, (), 10, 10, d=4)
    q *= 30
    k *= 30
    dout = rng.standard_normal((10, 5))
    want_out, want_grads = _naive(q, k, v, dout, causal=False)
    out, cache = ea.flash_attention_forward(q, k, v, block_size=3)
    assert np.isfinite(out).all()
    _close(out, want_out, 1e-10)
    for got, want in zip(ea.flash_attention_backward(dout, cache), want_grads, strict=True):
        _close(got, want, 1e-8 * max(1.0, np.abs(want).max()))


def test_row_logsumexp_is_the_log_of_each_rows_normaliser():
    rng = np.random.default_rng(5)
    q, k, v = _qkv(rng, (3,), 7, 9)
    _, cache = ea.flash_attention_forward(q, k, v, causal=True, block_size=4)
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    scores[..., core_attention.causal_mask(7, 9)] = -np.inf
    want = torch.logsumexp(torch.from_numpy(scores), dim=-1).numpy()
    _close(ea.row_logsumexp(cache), want, 1e-12)


def test_keys_no_query_sees_get_zero_gradient():
    rng = np.random.default_rng(6)
    q, k, v = _qkv(rng, (), 3, 8)  # causal: keys 3..7 are in every query's future
    _, cache = ea.flash_attention_forward(q, k, v, causal=True, block_size=2)
    _, dk, dv = ea.flash_attention_backward(rng.standard_normal((3, 5)), cache)
    assert not dk[3:].any() and not dv[3:].any()


def test_output_is_read_only_and_inputs_untouched():
    rng = np.random.default_rng(7)
    q, k, v = _qkv(rng, (), 5, 5)
    copies = [a.copy() for a in (q, k, v)]
    out, cache = ea.flash_attention_forward(q, k, v, causal=True, block_size=2)
    with pytest.raises(ValueError, match="read-only"):
        out += 1
    ea.flash_attention_backward(np.ones_like(out), cache)
    for a, b in zip((q, k, v), copies, strict=True):
        assert np.array_equal(a, b)


# --------------------------------------------------------------------------------------------
# Memory: never the full score matrix


def _peak_extra(fn):
    """Bytes allocated at the peak of ``fn()`` above what was allocated before it."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_never_allocates_a_score_matrix(causal):
    T = S = 1024
    rng = np.random.default_rng(8)
    q, k, v = _qkv(rng, (), T, S, d=16, d_v=16)
    dout = rng.standard_normal((T, 16))
    score_matrix = T * S * q.itemsize  # 8 MiB
    forward = {}
    fwd = _peak_extra(lambda: forward.update(r=ea.flash_attention_forward(q, k, v, causal, 64)))
    bwd = _peak_extra(lambda: ea.flash_attention_backward(dout, forward["r"][1]))
    assert fwd < score_matrix / 10, fwd
    assert bwd < score_matrix / 10, bwd
    naive = _peak_extra(lambda: _naive(q, k, v, dout, causal))
    assert naive > score_matrix  # the measurement does see NumPy's allocations


def test_the_cores_naive_attention_holds_one_score_matrix_at_its_peak():
    """The course's softmax works in place (out=scores, and dP into dZ): the naive forward and
    backward each hold one T x T array at their peak, plus O(T d). Notebook 16 prints this for
    the student's own functions and asserts only at least one, which any correct code holds."""
    T, d = 2048, 16  # O(T d) is then 3 % of a score matrix (1.03 measured, backward)
    rng = np.random.default_rng(9)
    q, k, v, dout = (rng.standard_normal((T, d), dtype=np.float32) for _ in range(4))
    score_matrix = T * T * 4
    forward = {}
    fwd = _peak_extra(lambda: forward.update(r=core_attention.attention_forward(q, k, v)))
    bwd = _peak_extra(lambda: core_attention.attention_backward(dout, forward["r"][1]))
    assert score_matrix <= fwd < 1.1 * score_matrix, fwd / score_matrix
    assert score_matrix <= bwd < 1.1 * score_matrix, bwd / score_matrix


# --------------------------------------------------------------------------------------------
# Bad input


def test_bad_input_errors():
    rng = np.random.default_rng(9)
    q, k, v = _qkv(rng, (2,), 4, 5)
    fwd = ea.flash_attention_forward
    cases = [
        (lambda: fwd(q.tolist(), k, v), TypeError, "q must be a NumPy array, got list"),
        (lambda: fwd(q.astype(int), k, v), TypeError, "q must be a float32 or float64 array"),
        (lambda: fwd(q, k.astype(np.float32), v), TypeError,
         r"k must have the dtype of q \(float64\), got float32"),
        (lambda: fwd(q[0, 0], k, v), ValueError, "q must have at least 2 dimensions"),
        (lambda: fwd(q, k[0], v), ValueError, "same leading .batch, head. axes"),
        (lambda: fwd(q, k[..., :3], v), ValueError,
         "q and k must have the same last dimension d .head_dim., got 8 and 3"),
        (lambda: fwd(q, k, v[:, :4]), ValueError, "k and v must have the same length S"),
        (lambda: fwd(q[:, :0], k, v), ValueError, "q must have at least one position"),
        (lambda: fwd(q, k[:, :0], v[:, :0]), ValueError, "k must have at least one position"),
        (lambda: fwd(np.full_like(q, np.nan), k, v), ValueError, "q must be finite"),
        (lambda: fwd(q, k, v, causal=1), TypeError, "causal must be True or False, got 1"),
        (lambda: fwd(q, k, v, causal="yes"), TypeError, "causal must be True or False"),
        (lambda: fwd(q, k, v, block_size=0), ValueError,
         "block_size must be a positive integer, got 0"),
        (lambda: fwd(q, k, v, block_size=-3), ValueError, "block_size must be a positive"),
        (lambda: fwd(q, k, v, block_size=2.0), TypeError,
         "block_size must be a positive integer, got 2.0"),
        (lambda: fwd(q, k, v, block_size=True), TypeError, "block_size must be a positive"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()
    assert fwd(q, k, v, causal=np.bool_(True), block_size=np.int64(2))[0].shape == (2, 4, 5)

    out, cache = fwd(q, k, v)
    bwd = ea.flash_attention_backward
    with pytest.raises(ValueError, match="call the forward function first"):
        bwd(np.ones_like(out), None)
    with pytest.raises(TypeError, match="cache must be the cache that flash_attention_forward "
                                        "returned, got tuple"):
        bwd(np.ones_like(out), cache.core)
    with pytest.raises(ValueError, match=r"dout must have shape \(2, 4, 5\)"):
        bwd(np.ones((2, 4, 4)), cache)
    with pytest.raises(TypeError, match="dout must have the dtype of the forward output"):
        bwd(np.ones(out.shape, dtype=np.float32), cache)
    with pytest.raises(TypeError, match="dout must be a NumPy array"):
        bwd(out.tolist(), cache)
    with pytest.raises(ValueError, match="dout must be finite"):
        bwd(np.full(out.shape, np.inf), cache)


# --------------------------------------------------------------------------------------------
# The core functions: exercises of notebook 16


def test_every_core_function_is_registered_and_marked():
    functions = {name for name, f in inspect.getmembers(core_flash, inspect.isfunction)
                 if f.__module__ == core_flash.__name__}
    assert functions == set(syllabus.TAUGHT_IN["flash"])
    for name in functions:
        source = inspect.getsource(getattr(core_flash, name))
        assert source.count("### BEGIN SOLUTION") == source.count("### END SOLUTION") == 1, name
        assert syllabus.where_taught(name)[1].startswith("16_long_context §")


def test_online_softmax_update_late_maximum_and_masked_blocks():
    rng = np.random.default_rng(10)
    x = rng.standard_normal((4, 12)) * 3
    x[0] = np.linspace(0, 900, 12)  # the maximum arrives last, exp(900) overflows
    x[1, :4] = -np.inf  # a fully masked first block
    x[2, 4:8] = -np.inf  # ... a fully masked middle block
    x[3] = -np.inf  # a fully masked row
    m, ell = np.full((4, 1), -np.inf), np.zeros((4, 1))
    for j in range(0, 12, 4):
        m, ell, p, alpha = core_flash.online_softmax_update(m, ell, x[:, j:j + 4])
        assert np.isfinite(p).all() and np.isfinite(alpha).all()
    y, _ = core_layers.softmax_forward(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        online = np.where(ell > 0, np.exp(x - np.where(np.isneginf(m), 0, m)) / ell, 0)
    np.testing.assert_allclose(online, y, rtol=1e-13, atol=1e-300)
    assert np.isneginf(m[3, 0]) and ell[3, 0] == 0
    lse = torch.logsumexp(torch.from_numpy(x[:3]), dim=-1).numpy()
    np.testing.assert_allclose((m[:3] + np.log(ell[:3]))[:, 0], lse, rtol=1e-13)


def test_backward_tile_is_its_share_of_torchs_gradients():
    rng = np.random.default_rng(11)
    q_i, k, v = _qkv(rng, (2,), 4, 9)  # one block of 4 queries, keys in blocks 0:4, 4:8, 8:9
    dout = rng.standard_normal((2, 4, 5))
    qt, kt, vt = (torch.tensor(a, requires_grad=True) for a in (q_i, k, v))
    scores = qt @ kt.transpose(-1, -2) / math.sqrt(8)
    out = torch.softmax(scores, dim=-1) @ vt
    out.backward(torch.from_numpy(dout))
    lse = torch.logsumexp(scores, dim=-1).detach().numpy()
    D = (dout * out.detach().numpy()).sum(-1)
    dq = 0
    for cols in (slice(0, 4), slice(4, 8), slice(8, 9)):
        dq_t, dk_t, dv_t = core_flash.flash_attention_backward_tile(
            q_i, k[:, cols], v[:, cols], dout, lse, D, 1 / math.sqrt(8))
        _close(dk_t, kt.grad.numpy()[:, cols], 1e-12)
        _close(dv_t, vt.grad.numpy()[:, cols], 1e-12)
        dq = dq + dq_t
    _close(dq, qt.grad.numpy(), 1e-12)


# --------------------------------------------------------------------------------------------
# In the model: the same self-attention, the same training


def _attention_params(rng, E, dtype):
    return {"W_qkv": rng.standard_normal((E, 3 * E)).astype(dtype) / math.sqrt(E),
            "b_qkv": rng.standard_normal(3 * E).astype(dtype) * 0.1,
            "W_o": rng.standard_normal((E, E)).astype(dtype) / math.sqrt(E),
            "b_o": rng.standard_normal(E).astype(dtype) * 0.1}


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_flash_self_attention_equals_the_cores_causal_self_attention(dtype):
    rng = np.random.default_rng(12)
    B, T, E, H = 2, 11, 12, 3
    x = rng.standard_normal((B, T, E)).astype(dtype)
    params = _attention_params(rng, E, dtype)
    dout = rng.standard_normal((B, T, E)).astype(dtype)
    want, c_want = core_multihead.self_attention_forward(x, params, H,
                                                         core_attention.causal_mask(T))
    got, c_got = core_flash.flash_self_attention_forward(x, params, H, True, 4)
    _close(got, want, TOL[dtype])
    dx_want, g_want = core_multihead.self_attention_backward(dout, c_want)
    dx_got, g_got = core_flash.flash_self_attention_backward(dout, c_got)
    _close(dx_got, dx_want, TOL[dtype])
    assert g_got.keys() == g_want.keys()
    for name in g_want:
        _close(g_got[name], g_want[name], TOL[dtype] * 10)


def tiny_causal_lm(flash, dtype, steps=5, block_size=3):
    """A one-block causal language model from core functions: embedding + positions, a pre-norm
    residual self-attention sublayer, the output projection, cross-entropy; Adam. ``flash``
    selects the tiled attention -- the flag a model would carry. -> the loss of every step."""
    rng = np.random.default_rng(13)
    V, E, H, B, T = 11, 12, 3, 4, 10
    params = {"embed": rng.standard_normal((V, E)).astype(dtype),
              "attn": _attention_params(rng, E, dtype),
              "norm": {"gamma": np.ones(E, dtype), "beta": np.zeros(E, dtype)},
              "out": {"W": rng.standard_normal((E, V)).astype(dtype) / math.sqrt(E),
                      "b": np.zeros(V, dtype)}}
    pe = core_layers.positional_encoding(T, E).astype(dtype)
    ids = rng.integers(0, V, size=(B, T + 1))
    flat = lambda tree: [tree] if isinstance(tree, np.ndarray) else [  # noqa: E731
        a for key in sorted(tree) for a in flat(tree[key])]
    state = [(np.zeros_like(p), np.zeros_like(p)) for p in flat(params)]
    losses = []
    for t in range(1, steps + 1):
        x, c_embed = core_layers.embedding_forward(ids[:, :-1], params["embed"])
        x = x + pe

        def attend(h):
            if flash:
                return core_flash.flash_self_attention_forward(h, params["attn"], H, True,
                                                               block_size)
            return core_multihead.self_attention_forward(h, params["attn"], H,
                                                         core_attention.causal_mask(T))

        y, c_res = core_blocks.residual_forward(x, attend, params["norm"], norm_first=True)
        logits, c_out = core_layers.linear_forward(y, params["out"]["W"], params["out"]["b"])
        loss, c_loss = core_layers.cross_entropy_forward(logits, ids[:, 1:])
        dy, g_out = core_layers.linear_backward(core_layers.cross_entropy_backward(1.0, c_loss),
                                                c_out)
        backward = (core_flash.flash_self_attention_backward if flash
                    else core_multihead.self_attention_backward)
        dx, g_norm, g_attn = core_blocks.residual_backward(dy, c_res, backward)
        grads = {"embed": core_layers.embedding_backward(dx, c_embed)["W"], "attn": g_attn,
                 "norm": g_norm, "out": g_out}
        for p, g, (m, v) in zip(flat(params), flat(grads), state, strict=True):
            core_optim.adam_step(p, g, m, v, t, lr=1e-2)
        losses.append(loss)
    return np.array(losses)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_training_with_flash_attention_gives_the_same_losses(dtype):
    naive = tiny_causal_lm(False, dtype)
    assert naive[-1] < naive[0]  # it learns
    for block_size in (1, 3, 64):
        np.testing.assert_allclose(tiny_causal_lm(True, dtype, block_size=block_size), naive,
                                   rtol=TOL[dtype])



# --------------------------------------------------------------------------------------------
# The notebook's checks: they pass on the reference, and catch the classic mistakes


def _check_fails(check_id):
    with pytest.raises(CheckFailed) as err:
        check(check_id)
    return str(err.value)


def test_online_softmax_check_names_the_classic_mistakes(monkeypatch):
    original = core_flash.online_softmax_update

    def inverted(m, ell, scores):
        m_new, ell_new, p, alpha = original(m, ell, scores)
        with np.errstate(all="ignore"):
            return m_new, ell_new, p, np.where(alpha > 0, 1 / alpha, 0)

    def not_rescaled(m, ell, scores):
        m_new, _, p, alpha = original(m, ell, scores)
        return m_new, ell + p.sum(-1, keepdims=True), p, alpha

    def nan_when_nothing_seen(m, ell, scores):
        m_new = np.maximum(m, scores.max(axis=-1, keepdims=True))
        with np.errstate(invalid="ignore"):
            p, alpha = np.exp(scores - m_new), np.exp(m - m_new)
        return m_new, alpha * ell + p.sum(-1, keepdims=True), p, alpha

    monkeypatch.setattr(core_flash, "online_softmax_update", inverted)
    assert "exp(m_new - m) instead of exp(m - m_new)" in _check_fails(
        "check-online-softmax-update")
    monkeypatch.setattr(core_flash, "online_softmax_update", not_rescaled)
    assert "not rescaling the running sum" in _check_fails("check-online-softmax-update")
    monkeypatch.setattr(core_flash, "online_softmax_update", nan_when_nothing_seen)
    assert "NaN or infinite" in _check_fails("check-online-softmax-update")


def test_forward_check_catches_a_full_score_matrix_and_a_blocked_diagonal(monkeypatch):
    def naive(q, k, v, causal=False, block_size=64):
        mask = core_attention.causal_mask(q.shape[-2], k.shape[-2]) if causal else None
        out, _ = core_attention.attention_forward(q, k, v, mask)
        scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
        if causal:
            scores[..., mask] = -np.inf
        lse = torch.logsumexp(torch.from_numpy(scores), -1).numpy()
        return out, (q, k, v, out, lse, causal, block_size)

    monkeypatch.setattr(core_flash, "flash_attention_forward", naive)
    message = _check_fails("check-flash-forward")
    assert "memory below a tenth" in message and "expected True, got False" in message
    assert "the score matrix formed whole" in message

    original = core_flash.flash_attention_forward
    monkeypatch.setattr(core_attention, "causal_mask",
                        lambda T, S=None: np.arange(T if S is None else S)[None] >=
                        np.arange(T)[:, None])
    monkeypatch.setattr(core_flash, "causal_mask", core_attention.causal_mask)
    monkeypatch.setattr(core_flash, "flash_attention_forward", original)
    with np.errstate(all="ignore"):
        message = _check_fails("check-flash-forward")
    assert "causal" in message


def test_backward_checks_catch_a_row_term_from_one_tile(monkeypatch):
    original = core_flash.flash_attention_backward_tile

    def tile_D(q_i, k_j, v_j, dout_i, lse_i, D_i, scale, mask=None):
        s = q_i @ np.swapaxes(k_j, -1, -2) * scale
        if mask is not None:
            s = np.where(mask, -np.inf, s)
        p = np.exp(s - lse_i[..., None])
        own_D = np.einsum("...ij,...ij->...i", dout_i @ np.swapaxes(v_j, -1, -2), p)
        return original(q_i, k_j, v_j, dout_i, lse_i, own_D, scale, mask)

    monkeypatch.setattr(core_flash, "flash_attention_backward_tile", tile_D)
    assert "relative error" in _check_fails("check-flash-backward-tile")
    assert "relative error" in _check_fails("check-flash-backward")
    monkeypatch.setattr(core_flash, "flash_attention_backward_tile", original)
    check("check-flash-backward")
