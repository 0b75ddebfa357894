"""The encoder-decoder's speed-only path (models/fast_blocks.py, issue 26) computes what the core
computes: every output and gradient of the layers and stacks equal to ``core.blocks``' (float64
to 1e-12, float32 to 1e-5) in both norm orders, with every activation, with and without biases
and gains, with boolean and float masks (causal, padding, both, values other than -inf, a query
whose keys are all blocked) and scores too large for the softmax without its shift; the twins,
and the encoder-decoder model with ``use_fast_path`` (the trainer's), compute with it, or with
the core when told to, where a core function was replaced or where the package leaves it out."""

import os
import subprocess
import sys

import numpy as np
import pytest
from handout_tools import run_in_handout_package

from transformer_lab.core import blocks as core_blocks
from transformer_lab.core import layers as core_layers
from transformer_lab.course import package as P
from transformer_lab.models import fast_blocks as FB

TOL = {np.float64: 1e-12, np.float32: 1e-5}
E, H, F = 12, 3, 20


def _norm(rng, dt, gamma=True, beta=True):
    return {"gamma": (1 + 0.3 * rng.standard_normal(E)).astype(dt) if gamma else None,
            **({"beta": (0.3 * rng.standard_normal(E)).astype(dt)} if beta else {})}


def _w(rng, dt, *shape, scale=0.4):
    return (scale * rng.standard_normal(shape)).astype(dt)


def layer_params(rng, dt, decoder, bias=True, gamma=True, scale=0.4):
    p = {"self_attn": {"W_qkv": _w(rng, dt, E, 3 * E, scale=scale), "W_o": _w(rng, dt, E, E)},
         "ff": {"W1": _w(rng, dt, E, F), "W2": _w(rng, dt, F, E)}}
    if bias:
        p["self_attn"].update(b_qkv=_w(rng, dt, 3 * E), b_o=_w(rng, dt, E))
        p["ff"].update(b1=_w(rng, dt, F), b2=_w(rng, dt, E))
    if decoder:
        ca = {k: _w(rng, dt, E, E, scale=scale) for k in ("W_q", "W_k", "W_v", "W_o")}
        if bias:
            ca.update({k: _w(rng, dt, E) for k in ("b_q", "b_k", "b_v", "b_o")})
        p["cross_attn"] = ca
    for n in ("norm1", "norm2", "norm3")[:2 + decoder]:
        p[n] = _norm(rng, dt, gamma, bias)
    return p


def masks(kind, rng, B, T, S, dt):
    """(self mask, cross mask) of a kind, broadcastable to (B, H, T, T) and (B, H, T, S)."""
    lengths = np.array([S, S - 2, 1])[:B]
    pad = np.arange(S)[None, :] >= lengths[:, None]  # (B, S)
    pad_t = np.arange(T)[None, :] >= np.array([T, T - 1, T - 3])[:B, None]
    causal = np.triu(np.ones((T, T), bool), 1)
    if kind == "none":
        return None, None
    if kind == "bool":
        return causal | pad_t[:, None, None, :], pad[:, None, None, :]
    if kind == "float-inf":  # additive, blocking only
        return (np.where(causal, -np.inf, 0).astype(dt),
                np.where(pad, -np.inf, 0).astype(dt)[:, None, None, :])
    if kind == "float-values":  # additive, with finite values (a bias on the scores)
        return ((np.where(causal, -np.inf, 0) + rng.standard_normal((T, T))).astype(dt),
                rng.standard_normal((B, H, T, S)).astype(dt))
    if kind == "all-blocked":  # the first query sees no key at all
        m = np.zeros((B, 1, T, S), bool)
        m[:, :, 0] = True
        t = np.zeros((B, 1, T, T), bool)
        t[0, :, 1] = True
        return t, m
    raise ValueError(kind)


def _close(a, b, tol, where="out"):
    """a equals b (nested dicts, lists and arrays) to tol relative to b's largest entry."""
    if isinstance(a, dict):
        assert list(a) == list(b), (where, list(a), list(b))
        scale = max((np.abs(x).max() for x in b.values() if isinstance(x, np.ndarray)),
                    default=0.0)
        for k in a:
            if k == "b_k" or k.endswith(".b_k"):  # zero (the softmax ignores a shift shared
                # by a query's scores): both are rounding noise, small beside the other gradients
                eps = np.finfo(a[k].dtype).eps
                assert max(np.abs(a[k]).max(), np.abs(b[k]).max()) < 1e3 * eps * scale, where
                continue
            _close(a[k], b[k], tol, f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, tol, f"{where}[{i}]")
    elif a is None:
        assert b is None, where
    else:
        assert a.shape == b.shape and a.dtype == b.dtype, (where, a.shape, b.shape, a.dtype,
                                                            b.dtype)
        err = np.abs(a - b).max() / np.abs(b).max()
        assert err < tol, (where, err)


CASES = [
    dict(norm_first=False, activation="relu", mask="bool"),
    dict(norm_first=True, activation="relu", mask="bool"),
    dict(norm_first=False, activation="gelu", mask="float-inf", bias=False),
    dict(norm_first=True, activation="gelu_tanh", mask="float-values"),
    dict(norm_first=False, activation="gelu_tanh", mask="none", gamma=False, bias=False),
    dict(norm_first=True, activation="gelu", mask="all-blocked", gamma=False),
    # scores too large to go without the shift (and rounding amplified: tolerance x 10)
    dict(norm_first=False, activation="relu", mask="bool", scale=1.5),
    dict(norm_first=True, activation="relu", mask="none", scale=1.5, eps=1e-3),
]


def _ids(case):
    return "-".join(f"{k}={v}" for k, v in case.items())


@pytest.mark.parametrize("dt", [np.float64, np.float32])
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_encoder_layer_equals_the_core(case, dt):
    rng = np.random.default_rng(0)
    case = dict(case)
    B, T = 3, 5
    tol = TOL[dt] * (10 if "scale" in case else 1)
    p = layer_params(rng, dt, False, case.pop("bias", True), case.pop("gamma", True),
                     case.pop("scale", 0.4))
    sm, _ = masks(case.pop("mask"), rng, B, T, T, dt)
    x, dout = (rng.standard_normal((B, T, E)).astype(dt) for _ in range(2))
    outs = []
    for blocks in (core_blocks, FB):
        y, cache = blocks.encoder_layer_forward(x, p, H, sm, **case)
        dx, g = blocks.encoder_layer_backward(dout, cache)
        outs.append((y, dx, g))
    _close(outs[1], outs[0], tol)


@pytest.mark.parametrize("dt", [np.float64, np.float32])
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_decoder_layer_equals_the_core(case, dt):
    rng = np.random.default_rng(1)
    case = dict(case)
    B, T, S = 3, 5, 7
    tol = TOL[dt] * (10 if "scale" in case else 1)
    p = layer_params(rng, dt, True, case.pop("bias", True), case.pop("gamma", True),
                     case.pop("scale", 0.4))
    tm, mm = masks(case.pop("mask"), rng, B, T, S, dt)
    x, dout = (rng.standard_normal((B, T, E)).astype(dt) for _ in range(2))
    mem = rng.standard_normal((B, S, E)).astype(dt)
    outs = []
    for blocks in (core_blocks, FB):
        y, cache = blocks.decoder_layer_forward(x, mem, p, H, tm, mm, **case)
        outs.append((y, *blocks.decoder_layer_backward(dout, cache)))
    _close(outs[1], outs[0], tol)


@pytest.mark.parametrize("dt", [np.float64, np.float32])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("final_norm", [False, True])
def test_stacks_equal_the_core(norm_first, final_norm, dt):
    rng = np.random.default_rng(2)
    B, T, S = 3, 5, 7
    enc = {"layers": [layer_params(rng, dt, False) for _ in range(2)],
           "norm": _norm(rng, dt) if final_norm else None}
    dec = {"layers": [layer_params(rng, dt, True) for _ in range(3)],
           "norm": _norm(rng, dt) if final_norm else None}
    tm, mm = masks("bool", rng, B, T, S, dt)
    sm = masks("bool", rng, B, S, S, dt)[1]
    src, tgt, dout = (rng.standard_normal((B, n, E)).astype(dt) for n in (S, T, T))
    outs = []
    for blocks in (core_blocks, FB):
        mem, c_enc = blocks.encoder_forward(src, enc, H, sm, norm_first, "relu")
        y, c_dec = blocks.decoder_forward(tgt, mem, dec, H, tm, mm, norm_first, "relu")
        dtgt, dmem, g_dec = blocks.decoder_backward(dout, c_dec)
        dsrc, g_enc = blocks.encoder_backward(dmem, c_enc)
        outs.append((mem, y, dtgt, dmem, g_dec, dsrc, g_enc))
    _close(outs[1], outs[0], 3 * TOL[dt])  # five layers' rounding


@pytest.mark.parametrize("dt", [np.float64, np.float32])
def test_layer_norm_equals_the_core(dt):
    rng = np.random.default_rng(3)
    x, dout = (rng.standard_normal((4, 3, E)).astype(dt) for _ in range(2))
    for gamma, beta in ((True, True), (True, False), (False, False)):
        n = _norm(rng, dt, gamma, beta)
        outs = []
        for f, b in ((core_layers.layer_norm_forward, core_layers.layer_norm_backward),
                     (FB.layer_norm_forward, FB.layer_norm_backward)):
            y, c = f(x, n["gamma"], n.get("beta"), 1e-5)
            outs.append((y, *b(dout, c)))
        _close(outs[1], outs[0], TOL[dt])


def test_the_cases_take_both_softmaxes(monkeypatch):
    """The small weights' scores are bounded (the softmax without its shift), the large ones'
    are not (with it): the cases above test both."""
    seen = []
    bounded = FB._scores_bounded
    monkeypatch.setattr(FB, "_scores_bounded", lambda *a: seen.append(bounded(*a)) or seen[-1])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, E))
    for scale in (0.4, 1.5):
        FB.encoder_layer_forward(x, layer_params(rng, np.float64, False, scale=scale), H)
    assert seen == [True, False]


# ------------------------------------------------------------------ the twins choose the path


def _twin_run(twin, *xs):
    out = twin.forward(*xs)
    # (a gradient of ones would give a post-norm layer's input none: the norm takes it away)
    dout = np.random.default_rng(5).standard_normal(out.shape)
    return out, twin.backward(dout), dict(twin.grads)


@pytest.mark.parametrize("make", ["encoder_layer", "transformer"])
def test_twins_compute_with_the_fast_path_and_the_core_gives_the_same(make):
    from torch import nn

    from transformer_lab.reference.interop import from_torch, twins

    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 6, 8))
    if make == "encoder_layer":
        m = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        xs = (x,)
    else:
        m = nn.Transformer(8, 2, 2, 2, 16, dropout=0.0, batch_first=True)
        xs = (x, x[:, :4])
    tw = from_torch(m.double())
    assert twins._fast_path(tw) is FB
    fast = _twin_run(tw, *xs)
    tw.use_fast_path = False
    assert twins._fast_path(tw) is None
    _close(fast, _twin_run(tw, *xs), 1e-12)


def test_a_replaced_core_function_turns_the_fast_path_off(monkeypatch):
    """The twins compute with the core as it is: once a core function is replaced (a student's,
    the grader's), the fast path no longer stands in for it."""
    from torch import nn

    from transformer_lab.core import attention as core_attention
    from transformer_lab.reference.interop import from_torch, twins

    tw = from_torch(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True))
    assert twins._fast_path(tw) is FB
    monkeypatch.setattr(core_attention, "attention_forward", lambda *a, **k: None)
    assert twins._fast_path(tw) is None


HANDOUT_TWIN = r'''
import numpy as np
from torch import nn
from transformer_lab.reference.interop import from_torch, twins
print("fast path:", twins._fast_blocks)
twin = from_torch(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True))
try:
    twin.forward(np.zeros((2, 3, 8), np.float32))
except NotImplementedError as err:
    print("core:", err)
'''


def test_in_the_handout_the_twins_run_the_students_core(tmp_path):
    """A package as the handout has it -- without the speed-only module, the core's
    ``encoder_layer_forward`` a stub -- imports, and a twin stops at the stub."""
    from transformer_lab import syllabus

    assert "models/fast_blocks.py" in P.SPEED_ONLY
    out = run_in_handout_package(tmp_path, "blocks", HANDOUT_TWIN)
    assert "fast path: None" in out
    assert f"core: {syllabus.stub_message('encoder_layer_forward')}" in out


@pytest.mark.parametrize("dt", [np.float64, np.float32])
def test_saturated_softmax_keeps_the_cores_accuracy(dt):
    """Large inputs saturate the softmax (one key takes nearly all of a query's weight): the
    row sums of P dP are taken from P and dP, as the core does -- the shortcut dO . O lost
    0.14 relative in float32 and 3e-10 in float64 here."""
    rng = np.random.default_rng(6)
    B, T = 2, 5
    p = layer_params(rng, dt, False)
    x = (1000 * rng.standard_normal((B, T, E))).astype(dt)
    dout = rng.standard_normal((B, T, E)).astype(dt)
    outs = []
    for blocks in (core_blocks, FB):
        y, cache = blocks.encoder_layer_forward(x, p, H)
        outs.append((y, *blocks.encoder_layer_backward(dout, cache)))
    _close(outs[1], outs[0], {np.float64: 1e-12, np.float32: 1e-4}[dt])


@pytest.mark.parametrize("shape", [(), (5,), (1, 5), (1, 1, 1, 5)])
def test_masks_of_any_rank_that_broadcasts(shape):
    """A mask of fewer dimensions than (T, S) broadcasts as the core's does."""
    rng = np.random.default_rng(7)
    B, T = 2, 5
    p = layer_params(rng, np.float64, False)
    x = rng.standard_normal((B, T, E))
    mask = rng.standard_normal(shape)
    outs = []
    for blocks in (core_blocks, FB):
        y, cache = blocks.encoder_layer_forward(x, p, H, mask)
        outs.append((y, *blocks.encoder_layer_backward(x, cache)))
    _close(outs[1], outs[0], 1e-12)


@pytest.mark.parametrize("fast", [True, False])
def test_twins_take_an_empty_batch_and_norms_without_affine_parameters(fast):
    """An empty batch gives an empty output and zero gradients (the core computes it); a layer
    whose norms have no parameters computes what torch computes, on either path."""
    import torch
    from torch import nn

    from transformer_lab.reference.interop import from_torch

    m = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True).double()
    tw = from_torch(m)
    tw.use_fast_path = fast
    out = tw.forward(np.zeros((0, 3, 8)), np.zeros((0, 4, 8)))
    dx, dmem = tw.backward(np.zeros((0, 3, 8)))
    assert out.shape == dx.shape == (0, 3, 8) and dmem.shape == (0, 4, 8)
    assert all(not g.any() for g in tw.grads.values())

    m.norm1 = nn.LayerNorm(8, elementwise_affine=False).double()
    m.norm3 = nn.LayerNorm(8, bias=False).double()
    tw = from_torch(m)
    tw.use_fast_path = fast
    rng = np.random.default_rng(8)
    x, mem = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 4, 8))
    dout = rng.standard_normal((2, 3, 8))
    xt, mt = torch.tensor(x, requires_grad=True), torch.tensor(mem, requires_grad=True)
    yt = m(xt, mt)
    yt.backward(torch.tensor(dout))
    _close((tw.forward(x, mem), *tw.backward(dout)),
           (yt.detach().numpy(), xt.grad.numpy(), mt.grad.numpy()), 1e-12)
    assert sorted(tw.grads) == sorted(n for n, _ in m.named_parameters())
    assert "norm1.weight" not in tw.grads and "norm3.bias" not in tw.grads


REPLACED_FIRST = r'''
import numpy as np
from transformer_lab.core import blocks
real = blocks.encoder_layer_forward
calls = []
def mine(*args, **kwargs):
    calls.append(1)
    return real(*args, **kwargs)
blocks.encoder_layer_forward = mine  # before the twins' module is imported
from torch import nn
from transformer_lab.reference.interop import from_torch, twins
tw = from_torch(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True))
print("fast path:", twins._fast_path(tw))
tw.forward(np.zeros((1, 3, 8), np.float32))
print("replaced function called:", bool(calls))
'''


def test_a_core_function_replaced_before_the_twins_are_imported_still_runs(tmp_path):
    """The fast path stands in for the package's own core only, whenever a function was
    replaced: one replaced before the twins' module is imported is the one that runs too."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run([sys.executable, "-c", REPLACED_FIRST], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "fast path: None" in result.stdout
    assert "replaced function called: True" in result.stdout


# --------------------------------------------------------------------------------------------
# The encoder-decoder model (models.encoder_decoder.Transformer): use_fast_path


MODEL_CASES = [
    dict(norm_first=True),
    dict(norm_first=False, activation="gelu"),
    dict(norm_first=True, positional="learned", bias=False),
    dict(norm_first=False, scale_embeddings=False, num_decoder_layers=1),
]


def _model(dt, **kw):
    from transformer_lab.models.encoder_decoder import Transformer, TransformerConfig

    cfg = dict(src_vocab_size=11, tgt_vocab_size=13, d_model=E, num_heads=H,
               num_encoder_layers=2, num_decoder_layers=2, d_ff=F, max_len=12, dtype=dt)
    model = Transformer(TransformerConfig(**{**cfg, **kw}), seed=0)
    rng = np.random.default_rng(3)
    for p in model.params.values():  # away from the initial values (zero biases, unit gains)
        p += (0.2 * rng.standard_normal(p.shape)).astype(dt)
    c = model.config
    src, tgt = rng.integers(4, 11, (3, 7)), rng.integers(4, 13, (3, 9))
    tgt[:, 0] = c.bos_id
    src[1, 4:], tgt[1, 6:] = c.pad_id, c.pad_id  # padding in both
    tgt[2, 5] = c.eos_id
    return model, src, tgt


@pytest.mark.parametrize("dt", [np.float64, np.float32])
@pytest.mark.parametrize("case", MODEL_CASES, ids=_ids)
def test_the_model_computes_with_the_fast_path_what_the_core_does(case, dt):
    """``use_fast_path = True``: the stacks by fast_blocks, and the same logits, loss and
    gradients as the core (False, the default)."""
    model, src, tgt = _model(dt, **case)
    assert model.use_fast_path is False
    dlogits = np.random.default_rng(4).standard_normal((3, 8, 13)).astype(dt)
    runs = {}
    for fast in (False, True):
        model.use_fast_path = fast
        logits, cache = model.forward(src, tgt[:, :-1])
        assert isinstance(cache.core, FB.TransformerCache) is fast
        loss, grads = model.loss(src, tgt)
        runs[fast] = (logits, model.backward(dlogits, cache), np.array(loss), grads,
                      np.array(model.loss(src, tgt, compute_grads=False)[0]))
    fast, core = runs[True], runs[False]
    _close(fast[0], core[0], TOL[dt])
    for i in (1, 3):
        assert list(fast[i]) == list(model.params)
        _close(fast[i], core[i], TOL[dt], "grads")
    _close(fast[2], core[2], TOL[dt], "loss")
    _close(fast[4], core[4], TOL[dt], "loss without gradients")


def test_the_trainers_models_take_the_fast_path():
    """The trainer's runs (``python -m transformer_lab.train``) train with the fast path; a
    model built directly computes with the core."""
    from transformer_lab.train import TrainConfig, make_model

    model = make_model(TrainConfig.for_task("reverse", seed=0))
    assert model.use_fast_path is True
    src = np.array([[5, 6, 7, 3]])
    assert isinstance(model.forward(src, src)[1].core, FB.TransformerCache)
    assert model.copy().use_fast_path is True and model.astype(np.float64).use_fast_path is True
    assert _model(np.float32)[0].use_fast_path is False


def test_a_replaced_core_function_runs_in_the_model(monkeypatch):
    """The model stands the fast path in for the package's own core only: once a function of
    the core modules it covers is replaced, the replacement computes (here, in the decoder's
    stack)."""
    from transformer_lab.core import model as core_model

    model, src, tgt = _model(np.float64)
    model.use_fast_path = True
    assert isinstance(model.forward(src, tgt)[1].core, FB.TransformerCache)
    calls = []

    def decoder_forward(*args, **kw):
        calls.append(1)
        return core_blocks.decoder_forward(*args, **kw)

    monkeypatch.setattr(core_model, "decoder_forward", decoder_forward)
    logits, cache = model.forward(src, tgt)
    assert calls and not isinstance(cache.core, FB.TransformerCache)
    assert list(model.backward(np.ones_like(logits), cache)) == list(model.params)


def test_attention_maps_come_from_the_core_with_the_fast_path_on():
    model, src, tgt = _model(np.float64, norm_first=True)
    model.use_fast_path = True
    maps = model.attention_maps(src, tgt)
    model.use_fast_path = False
    for name, weights in model.attention_maps(src, tgt).items():
        np.testing.assert_array_equal(maps[name], weights)
    assert maps["decoder.layers.1.cross_attn"].shape == (3, H, 9, 7)


HANDOUT_MODEL = r'''
import numpy as np
from transformer_lab.models import encoder_decoder
from transformer_lab.models.encoder_decoder import Transformer, TransformerConfig
print("fast path:", encoder_decoder._fast_blocks)
model = Transformer(TransformerConfig(src_vocab_size=8, tgt_vocab_size=8, d_model=8,
                                      num_heads=2), seed=0)
model.use_fast_path = True
try:
    model.loss(np.array([[4, 5, 6]]), np.array([[1, 4, 5, 2]]))
except NotImplementedError as err:
    print("core:", err)
'''


def test_in_the_handout_the_model_runs_the_students_core(tmp_path):
    """Without the speed-only module (the handout), a model told to take the fast path computes
    with the core: here it stops at the stub of ``encoder_forward``."""
    from transformer_lab import syllabus

    out = run_in_handout_package(tmp_path, "blocks", HANDOUT_MODEL)
    assert "fast path: None" in out
    assert f"core: {syllabus.stub_message('encoder_forward')}" in out


def test_each_of_the_models_passes_computes_with_the_path_it_is_told(monkeypatch):
    """forward, loss (with and without gradients) and backward call fast_blocks' functions with
    the fast path on, and none of them with it off; backward follows the forward pass that made
    its cache, whatever the switch says by then."""
    model, src, tgt = _model(np.float64)
    calls = []
    for name in ("transformer_forward", "transformer_backward", "transformer_loss"):
        real = getattr(FB, name)
        monkeypatch.setattr(FB, name, lambda *a, _real=real, _name=name, **k:
                            calls.append(_name) or _real(*a, **k))
    model.use_fast_path = True
    model.loss(src, tgt)
    assert calls[0] == "transformer_loss"
    del calls[:]
    model.loss(src, tgt, compute_grads=False)
    logits, cache = model.forward(src, tgt[:, :-1])
    assert calls == ["transformer_forward", "transformer_forward"]
    model.use_fast_path = False
    fast_grads = model.backward(np.ones_like(logits), cache)  # the fast pass's cache
    assert calls[-1] == "transformer_backward"
    del calls[:]
    model.loss(src, tgt)
    logits, core_cache = model.forward(src, tgt[:, :-1])
    model.use_fast_path = True
    core_grads = model.backward(np.ones_like(logits), core_cache)  # the core's cache
    assert calls == []
    _close(fast_grads, core_grads, TOL[np.float64], "grads")
