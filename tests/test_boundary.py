"""The public modules are a thin, checked boundary over transformer_lab.core: they check their
inputs once, at the entry point, and compute through the core functions they find on the core
modules at call time -- so an edited core (the student's, or a grader's overlay) is what runs."""

import inspect

import numpy as np
import pytest

from transformer_lab import _validate, syllabus
from transformer_lab import attention as A
from transformer_lab import blocks as B
from transformer_lab import layers as L
from transformer_lab.core import attention as core_attention
from transformer_lab.core import blocks as core_blocks
from transformer_lab.core import layers as core_layers
from transformer_lab.core import model as core_model
from transformer_lab.core import multihead as core_multihead
from transformer_lab.gradient_check import check_gradients
from transformer_lab.models.encoder_decoder import Transformer, TransformerConfig

PAD, BOS, EOS = 0, 1, 2
SRC = np.array([[3, 4, 5, 6, PAD], [4, 3, PAD, PAD, PAD], [5, 3, 3, 6, 4]])
TGT = np.array([[BOS, 3, 4, EOS, PAD, PAD], [BOS, 5, EOS, PAD, PAD, PAD], [BOS, 4, 5, 3, 5, EOS]])


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def tiny(**kw):
    base = dict(src_vocab_size=7, tgt_vocab_size=6, d_model=4, num_heads=2,
                num_encoder_layers=1, num_decoder_layers=2, d_ff=6, max_len=8)
    base.update(kw)
    return TransformerConfig(**base)


def flatten(tree, prefix=""):
    out = {}
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for k, val in items:
        if isinstance(val, (dict, list)):
            out.update(flatten(val, f"{prefix}{k}."))
        elif val is not None:
            out[f"{prefix}{k}"] = val
    return out


def randomize(tree, rng, scale=0.4):
    for name, arr in flatten(tree).items():
        arr[...] = rng.standard_normal(arr.shape) * scale + name.endswith("gamma")
    return tree


# ------------------------------------------------------------------ checks run once

VALIDATORS = [name for name in dir(_validate)
              if inspect.isfunction(getattr(_validate, name)) and not name.startswith("_")
              and getattr(getattr(_validate, name), "__module__", "") == _validate.__name__]


@pytest.fixture
def count_checks(monkeypatch):
    """Every helper of transformer_lab._validate, counting its calls: ``calls[name]``."""
    calls = {}
    for name in VALIDATORS:
        real = getattr(_validate, name)

        def counting(*args, _name=name, _real=real, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(_validate, name, counting)
    return calls


@pytest.mark.parametrize("norm_first", [False, True])
def test_a_decoder_layer_backward_runs_only_its_entry_points_checks(rng, count_checks,
                                                                    norm_first):
    """Before: 22 checks in one decoder-layer backward (every nested backward re-validated its
    cache and dout). Now the entry point checks its cache and dout, once each, and the core
    checks nothing."""
    p = randomize(B.decoder_layer_init(4, 2, 6, rng=rng, dtype=np.float64), rng)
    x, mem = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4))
    out, cache = B.decoder_layer_forward(x, mem, p, 2, A.causal_mask(3), norm_first=norm_first,
                                         memory_key_padding_mask=A.padding_mask([5, 3], 5))
    count_checks.clear()
    B.decoder_layer_backward(rng.standard_normal(out.shape), cache)
    assert count_checks == {"dout_of": 1, "cache_of": 1, "grad_like": 1}


def test_stack_and_model_backwards_check_once(rng, count_checks):
    enc = {"layers": [B.encoder_layer_init(4, 2, 6, rng=rng, dtype=np.float64) for _ in "abc"],
           "norm": B.layer_norm_init(4, dtype=np.float64)}
    out, cache = B.encoder_forward(rng.standard_normal((2, 3, 4)), enc, 2)
    count_checks.clear()
    B.encoder_backward(np.ones_like(out), cache)
    assert count_checks == {"dout_of": 1, "cache_of": 1, "grad_like": 1}
    m = Transformer(tiny(num_encoder_layers=3, num_decoder_layers=3))
    logits, cache = m.forward(SRC, TGT[:, :-1])
    count_checks.clear()
    m.backward(np.ones_like(logits), cache)
    assert count_checks == {"cache_of": 1, "grad_like": 1}


def test_forward_checks_each_argument_once_however_deep(rng, monkeypatch):
    """A stack's forward checks x, the memory and the masks once -- not once per layer and
    sublayer, as nested checked calls would -- and each parameter once."""
    names = []
    real = _validate.float_array
    monkeypatch.setattr(_validate, "float_array",
                        lambda x, name, **kw: (names.append(name), real(x, name, **kw))[1])
    class Params(dict):  # not a plain dict: no quick test, every parameter checked in full
        pass

    def slow(layer):
        return {k: Params(p) for k, p in layer.items()}

    enc = {"layers": [slow(B.encoder_layer_init(4, 2, 6, rng=rng, dtype=np.float64))
                      for _ in "abc"], "norm": B.layer_norm_init(4, dtype=np.float64)}
    dec = {"layers": [slow(B.decoder_layer_init(4, 2, 6, rng=rng, dtype=np.float64))
                      for _ in "abc"], "norm": None}
    x, mem = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4))
    B.encoder_forward(x, enc, 2, A.causal_mask(3), A.padding_mask([3, 2], 3))
    assert [n for n in names if not n.startswith("params")] == ["x"]
    assert len(names) == len(set(names))  # no parameter checked twice
    assert "params['layers'][2]['self_attn']['W_qkv']" in names
    names.clear()
    B.decoder_forward(x, mem, dec, 2, A.causal_mask(3), None, A.padding_mask([3, 2], 3),
                      A.padding_mask([5, 4], 5))
    assert [n for n in names if not n.startswith("params")] == ["x", "memory"]
    assert len(names) == len(set(names))
    assert "params['layers'][2]['cross_attn']['W_k']" in names


@pytest.mark.parametrize("kind", ["encoder_layer", "decoder_layer", "encoder", "decoder", "model"])
def test_layers_and_the_model_call_the_core_not_the_checked_entry_points(rng, monkeypatch,
                                                                         kind):
    """Nothing inside a layer, a stack or the model goes through the public (checked)
    functions of layers, attention or blocks."""
    e_p = B.encoder_layer_init(4, 2, 6, rng=rng, dtype=np.float32)
    d_p = B.decoder_layer_init(4, 2, 6, rng=rng, dtype=np.float32)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    mem = rng.standard_normal((2, 5, 4)).astype(np.float32)
    args = {"encoder_layer": (x, e_p, 2), "decoder_layer": (x, mem, d_p, 2),
            "encoder": (x, {"layers": [e_p], "norm": B.layer_norm_init(4)}, 2),
            "decoder": (x, mem, {"layers": [d_p], "norm": None}, 2)}
    model = Transformer(tiny())

    def run():
        if kind == "model":
            model.loss(SRC, TGT)
            model.loss(SRC, TGT, compute_grads=False)
            model.greedy_decode(SRC, max_len=3)
            model.attention_maps(SRC, TGT[:, :-1])
        else:
            out, cache = getattr(B, f"{kind}_forward")(*args[kind])
            getattr(B, f"{kind}_backward")(np.ones_like(out), cache)

    def closed(*args, **kwargs):
        raise AssertionError("a public, checked function was called from inside")

    entry = {f"{kind}_forward", f"{kind}_backward"}
    closed_names = set()
    for module in (L, A, B):
        for name in dir(module):
            if name.endswith(("_forward", "_backward")) and not name.startswith("_") \
                    and name not in entry:
                monkeypatch.setattr(module, name, closed)
                closed_names.add(name)
    # the rule, not a count: the boundary's wrapper of every core function that the entry point
    # runs through is closed
    core = entry if kind != "model" else {"transformer_loss", "transformer_encode",
                                          "transformer_decode"}
    wrapped = {n for n in syllabus.dependencies(core) if n.endswith(("_forward", "_backward"))
               and any(hasattr(m, n) for m in (L, A, B))}
    assert {"linear_forward", "layer_norm_backward"} <= wrapped <= closed_names
    run()


# ------------------------------------------------------------------ the core, looked up live


def _doubling(monkeypatch, module, name, calls):
    """Replace ``module.name`` by the real function with its first result doubled."""
    real = getattr(module, name)

    def doubled(*args, **kwargs):
        calls.append(name)
        res = real(*args, **kwargs)
        return (res[0] * 2, *res[1:]) if isinstance(res, tuple) else res * 2

    monkeypatch.setattr(module, name, doubled)


def test_layers_compute_with_the_core_functions_of_the_moment(rng, monkeypatch):
    x = rng.standard_normal((2, 3))
    W = rng.standard_normal((3, 4))
    expected = {"linear": L.linear_forward(x, W)[0], "softmax": L.softmax_forward(x, 0)[0],
                "layer_norm": L.layer_norm_forward(x)[0], "relu": L.relu_forward(x)[0],
                "embedding": L.embedding_forward(np.array([1, 0]), W)[0],
                "pe": L.positional_encoding(3, 4)}
    calls = []
    for name in ("linear_forward", "softmax_forward", "layer_norm_forward", "relu_forward",
                 "embedding_forward", "positional_encoding"):
        _doubling(monkeypatch, core_layers, name, calls)
    got = {"linear": L.linear_forward(x, W)[0], "softmax": L.softmax_forward(x, 0)[0],
           "layer_norm": L.layer_norm_forward(x)[0], "relu": L.relu_forward(x)[0],
           "embedding": L.embedding_forward(np.array([1, 0]), W)[0],
           "pe": L.positional_encoding(3, 4)}
    for k in expected:
        np.testing.assert_array_equal(got[k], 2 * expected[k], err_msg=k)
    assert len(calls) == 6


def test_attention_and_blocks_compute_with_the_core_functions_of_the_moment(rng, monkeypatch):
    q = rng.standard_normal((2, 3, 4))
    params = A.mha_init(4, 2, packed=True, rng=rng, dtype=np.float64)
    layer = B.encoder_layer_init(4, 2, 6, rng=rng, dtype=np.float64)
    cases = [
        (core_attention, "attention_forward",
         lambda: A.scaled_dot_product_attention_forward(q, q, q)[0]),
        (core_multihead, "self_attention_forward", lambda: A.self_attention_forward(q, params,
                                                                                     2)[0]),
        (core_multihead, "multi_head_attention_forward",
         lambda: A.multi_head_attention_forward(q, q, q, params, 2)[0]),
        (core_blocks, "feed_forward_forward", lambda: B.feed_forward_forward(q, layer["ff"])[0]),
        (core_blocks, "encoder_layer_forward", lambda: B.encoder_layer_forward(q, layer, 2)[0]),
        (core_blocks, "encoder_forward",
         lambda: B.encoder_forward(q, {"layers": [layer], "norm": None}, 2)[0]),
    ]
    for module, name, call in cases:
        expected = call()
        calls = []
        with monkeypatch.context() as patch:
            _doubling(patch, module, name, calls)
            np.testing.assert_array_equal(call(), 2 * expected, err_msg=name)
        assert calls == [name]


def test_the_model_computes_with_the_core_model_of_the_moment(monkeypatch):
    m = Transformer(tiny(dtype=np.float64))
    logits, cache = m.forward(SRC, TGT[:, :-1])
    loss, grads = m.loss(SRC, TGT)
    calls = []
    with monkeypatch.context() as patch:
        _doubling(patch, core_model, "transformer_forward", calls)
        np.testing.assert_array_equal(m.forward(SRC, TGT[:, :-1])[0], 2 * logits)
    real_loss = core_model.transformer_loss

    def loss_plus_one(*args, **kwargs):
        calls.append("transformer_loss")
        value, g = real_loss(*args, **kwargs)
        return value + 1, g

    monkeypatch.setattr(core_model, "transformer_loss", loss_plus_one)
    assert m.loss(SRC, TGT)[0] == pytest.approx(loss + 1, abs=1e-12)
    real_backward = core_model.transformer_backward
    monkeypatch.setattr(core_model, "transformer_backward",
                        lambda *a: (calls.append("transformer_backward"), real_backward(*a))[1])
    np.testing.assert_array_equal(m.backward(np.ones_like(logits), cache)["out_proj.b"],
                                  np.full(6, 15.0))  # B * T positions, each gradient 1
    assert calls == ["transformer_forward", "transformer_loss", "transformer_backward"]


def test_a_stubbed_core_stops_the_model_with_its_message(monkeypatch):
    """With a stub for the core's loss (as the handout has), the model stops with the stub's
    message: the boundary computes nothing of its own."""
    def stub(*args, **kwargs):
        raise NotImplementedError("transformer_loss: write it in notebook 06")

    monkeypatch.setattr(core_model, "transformer_loss", stub)
    with pytest.raises(NotImplementedError, match="transformer_loss: write it"):
        Transformer(tiny()).loss(SRC, TGT)


# ------------------------------------------------------------------ conversions


@pytest.mark.parametrize("norm_first", [False, True])
def test_layers_take_either_attention_layout_and_give_grads_in_it(rng, norm_first):
    """The core takes packed self-attention and separate cross-attention projections; a layer
    given the other layout converts, and returns the gradients in the layout it was given."""
    p = randomize(B.decoder_layer_init(4, 2, 5, packed=False, rng=rng, dtype=np.float64), rng)
    p["cross_attn"] = A.to_packed(p["cross_attn"])  # packed cross-attention, separate self
    p["norm2"].pop("gamma")  # and a norm without a scale
    x, mem = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4))
    kw = dict(tgt_mask=A.causal_mask(3), memory_key_padding_mask=A.padding_mask([5, 2], 5),
              norm_first=norm_first)
    out, cache = B.decoder_layer_forward(x, mem, p, 2, **kw)
    dout = rng.standard_normal(out.shape)
    dx, dmem, grads = B.decoder_layer_backward(dout, cache)
    assert {k: set(g) for k, g in grads.items()} == {k: set(q) for k, q in p.items()}
    assert all(grads["self_attn"][k].flags.c_contiguous for k in grads["self_attn"])
    check_gradients(lambda: B.decoder_layer_forward(x, mem, p, 2, **kw)[0],
                    {"x": x, "mem": mem, **flatten(p)},
                    {"x": dx, "mem": dmem, **flatten(grads)}, df=dout, verbose=False)


@pytest.mark.parametrize("attn_kind", ["bool", "float"])
@pytest.mark.parametrize("pad_kind", ["bool", "float"])
def test_bool_and_float_masks_merge_into_one(rng, attn_kind, pad_kind):
    """Any mix of bool / float attn_mask and key_padding_mask blocks the same keys."""
    x = rng.standard_normal((2, 4, 4))
    params = A.mha_init(4, 2, packed=True, rng=rng, dtype=np.float64)
    causal, pad = A.causal_mask(4), A.padding_mask([4, 2], 4)
    ref, ref_w, _ = A.self_attention_forward(x, params, 2, causal, pad)
    am = causal if attn_kind == "bool" else np.where(causal, -np.inf, 0.0)
    kpm = pad if pad_kind == "bool" else np.where(pad, -np.inf, 0.0)
    out, w, _ = A.self_attention_forward(x, params, 2, am, kpm)
    np.testing.assert_allclose(out, ref, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(w, ref_w, rtol=1e-13, atol=1e-15)
    # three-dimensional scores (no head axis): the padding mask broadcasts over the queries
    q = rng.standard_normal((2, 4, 3))
    o1, c1 = A.scaled_dot_product_attention_forward(q, q, q, am, kpm)
    o2, c2 = A.scaled_dot_product_attention_forward(q, q, q, causal | pad[:, None, :])
    np.testing.assert_allclose(o1, o2, rtol=1e-13, atol=1e-15)
    assert np.all(c1.weights[1, :, 2:] == 0)


def test_fully_masked_queries_give_zeros_through_a_layer(rng):
    """A source that is all padding: its queries attend to nothing -- zeros, no NaN, in the
    layer's output and every gradient."""
    p = randomize(B.encoder_layer_init(4, 2, 6, rng=rng, dtype=np.float64), rng)
    x = rng.standard_normal((2, 3, 4))
    pad = A.padding_mask([3, 0], 3)
    out, cache = B.encoder_layer_forward(x, p, 2, key_padding_mask=pad, norm_first=True)
    dx, grads = B.encoder_layer_backward(rng.standard_normal(out.shape), cache)
    assert np.isfinite(out).all() and np.isfinite(dx).all()
    assert all(np.isfinite(g).all() for g in flatten(grads).values())
    assert np.all(cache.attention_weights[1] == 0)


def test_embedding_padding_idx_and_softmax_axis_are_converted_here(rng):
    W = rng.standard_normal((5, 3))
    ids = np.array([[1, 2, 1], [4, 1, 0]])
    out, cache = L.embedding_forward(ids, W, padding_idx=1)
    dout = rng.standard_normal(out.shape)
    core_dW = core_layers.embedding_backward(dout, core_layers.embedding_forward(ids, W)[1])["W"]
    dW = L.embedding_backward(dout, cache)["W"]
    assert np.all(dW[1] == 0)
    np.testing.assert_array_equal(np.delete(dW, 1, 0), np.delete(core_dW, 1, 0))
    x = rng.standard_normal((3, 4, 5))
    y, c = L.softmax_forward(x, axis=1)
    np.testing.assert_allclose(y.sum(axis=1), 1, rtol=1e-14)
    assert not y.flags.writeable and c.extra == 1  # the axis
    dy = rng.standard_normal(y.shape)
    dx = L.softmax_backward(dy, c)
    np.testing.assert_allclose(np.moveaxis(dx, 1, -1), core_layers.softmax_backward(
        np.moveaxis(dy, 1, -1), core_layers.softmax_forward(np.moveaxis(x, 1, -1))[1]),
        rtol=1e-13, atol=1e-15)


def test_checks_the_core_cannot_make_are_made_here(rng):
    """The core requires both feed-forward biases or neither; the old calling convention of
    the multi-head backward (with the params) is refused clearly."""
    p = B.feed_forward_init(4, 6, rng=rng, dtype=np.float64)
    del p["b2"]
    with pytest.raises(ValueError, match=r"params must have both biases b1 and b2, or neither"):
        B.feed_forward_forward(rng.standard_normal((2, 4)), p)
    params = A.mha_init(4, 2, rng=rng, dtype=np.float64)
    q = rng.standard_normal((2, 3, 4))
    _, _, cache = A.multi_head_attention_forward(q, q, q, params, 2)
    with pytest.raises(TypeError, match=r"multi_head_attention_backward\(dout, cache, "
                                        r"dweights=None\) takes no parameter dict"):
        A.multi_head_attention_backward(q, cache, params)


# ------------------------------------------------------------------ the model's modules


def test_initial_parameters_are_todays():
    """The initial parameters of (config, seed) are those of the model before the core existed
    (the trainer's results depend on them): a few values and a checksum."""
    m = Transformer(tiny(), seed=0)
    expected = {
        "src_embed.W": [0.06286510825157166, -0.06605242937803268, 0.3202113211154938],
        "encoder.layers.0.self_attn.W_qkv": [0.4610971212387085, -0.5406415462493896,
                                             -0.20071479678153992],
        "encoder.layers.0.ff.b1": [0.2756911814212799, -0.19114263355731964,
                                   -0.23016321659088135],
        "decoder.layers.1.cross_attn.W_v": [0.7561546564102173, -0.19455397129058838,
                                            -0.5806134939193726],
        "out_proj.W": [-0.21912893652915955, 0.23070599138736725, 0.06819231063127518],
    }
    for name, values in expected.items():
        np.testing.assert_allclose(m.params[name].ravel()[:3], values, rtol=1e-7, err_msg=name)
    total = sum(float(np.abs(p.astype(np.float64)).sum()) for p in m.params.values())
    assert total == pytest.approx(223.7627347551752, rel=1e-9)


def test_model_nested_params_are_the_flat_arrays():
    m = Transformer(tiny(positional="learned"))
    nested = m._nested()
    assert nested["encoder"]["layers"][0]["self_attn"]["W_qkv"] is \
        m.params["encoder.layers.0.self_attn.W_qkv"]
    assert nested["src_pos"]["W"] is m.params["src_pos.W"]
    assert nested["out_proj"]["b"] is m.params["out_proj.b"]
