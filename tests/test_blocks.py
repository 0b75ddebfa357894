"""transformer_lab.blocks: feed-forward, encoder/decoder layers and stacks, gradient-checked in
float64 for both norm orders, both activations, with and without biases and masks."""

import numpy as np
import pytest

from transformer_lab import attention as att
from transformer_lab import blocks as B
from transformer_lab.gradient_check import check_gradients


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def flatten(tree, prefix=""):
    """{"a": {"b": arr}} -> {"a.b": arr}; lists index by position. Arrays are shared, not copied."""
    out = {}
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for k, val in items:
        name = f"{prefix}{k}"
        if isinstance(val, (dict, list)):
            out.update(flatten(val, name + "."))
        elif val is not None:
            out[name] = val
    return out


def randomize(tree, rng, scale=0.4):
    """Fill every array in place with random values (norm scales around 1), so that no bias or
    norm parameter is trivially zero or one."""
    for name, arr in flatten(tree).items():
        arr[...] = rng.standard_normal(arr.shape) * scale + name.endswith("gamma")
    return tree


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("bias", [True, False])
def test_feed_forward_gradcheck(rng, activation, bias):
    p = randomize(B.feed_forward_init(4, 7, bias=bias, rng=rng, dtype=np.float64), rng)
    x = rng.standard_normal((2, 3, 4))
    out, cache = B.feed_forward_forward(x, p, activation)
    dout = rng.standard_normal(out.shape)
    dx, grads = B.feed_forward_backward(dout, cache)
    assert set(grads) == set(p)
    check_gradients(lambda: B.feed_forward_forward(x, p, activation)[0], {"x": x, **p},
                    {"x": dx, **grads}, df=dout, verbose=False)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation,bias", [("relu", True), ("gelu", False)])
@pytest.mark.parametrize("heads", [1, 4])
def test_encoder_layer_gradcheck(rng, norm_first, activation, bias, heads):
    p = randomize(B.encoder_layer_init(4, heads, 6, bias=bias, rng=rng, dtype=np.float64), rng)
    x = rng.standard_normal((2, 3, 4))
    kpm = att.padding_mask(np.array([3, 2]), 3)
    kw = dict(attn_mask=att.causal_mask(3), key_padding_mask=kpm, norm_first=norm_first,
              activation=activation)
    out, cache = B.encoder_layer_forward(x, p, heads, **kw)
    dout = rng.standard_normal(out.shape)
    dx, grads = B.encoder_layer_backward(dout, cache)
    flat = flatten(p)
    check_gradients(lambda: B.encoder_layer_forward(x, p, heads, **kw)[0], {"x": x, **flat},
                    {"x": dx, **flatten(grads)}, df=dout, verbose=False)
    assert set(flatten(grads)) == set(flat)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation,bias", [("relu", True), ("gelu_tanh", False)])
def test_decoder_layer_gradcheck(rng, norm_first, activation, bias):
    p = randomize(B.decoder_layer_init(4, 2, 5, bias=bias, rng=rng, dtype=np.float64), rng)
    x = rng.standard_normal((2, 3, 4))
    mem = rng.standard_normal((2, 5, 4))  # source length != target length
    kw = dict(tgt_mask=att.causal_mask(3), tgt_key_padding_mask=att.padding_mask(
        np.array([3, 1]), 3), memory_key_padding_mask=att.padding_mask(np.array([5, 4]), 5),
        norm_first=norm_first, activation=activation)
    out, cache = B.decoder_layer_forward(x, mem, p, 2, **kw)
    dout = rng.standard_normal(out.shape)
    dx, dmem, grads = B.decoder_layer_backward(dout, cache)
    check_gradients(lambda: B.decoder_layer_forward(x, mem, p, 2, **kw)[0],
                    {"x": x, "mem": mem, **flatten(p)},
                    {"x": dx, "mem": dmem, **flatten(grads)}, df=dout, verbose=False)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_decoder_stacks_gradcheck(rng, norm_first):
    enc = {"layers": [randomize(B.encoder_layer_init(4, 2, 6, rng=rng, dtype=np.float64), rng)
                      for _ in range(2)],
           "norm": randomize(B.layer_norm_init(4, dtype=np.float64), rng)}
    dec = {"layers": [randomize(B.decoder_layer_init(4, 2, 6, rng=rng, dtype=np.float64), rng)
                      for _ in range(2)],
           "norm": randomize(B.layer_norm_init(4, dtype=np.float64), rng)}
    src, tgt = rng.standard_normal((1, 4, 4)), rng.standard_normal((1, 2, 4))

    def fwd():
        mem, _ = B.encoder_forward(src, enc, 2, norm_first=norm_first)
        return B.decoder_forward(tgt, mem, dec, 2, tgt_mask=att.causal_mask(2),
                                 norm_first=norm_first)[0]

    mem, ec = B.encoder_forward(src, enc, 2, norm_first=norm_first)
    out, dc = B.decoder_forward(tgt, mem, dec, 2, tgt_mask=att.causal_mask(2),
                                norm_first=norm_first)
    dout = rng.standard_normal(out.shape)
    dtgt, dmem, gdec = B.decoder_backward(dout, dc)
    dsrc, genc = B.encoder_backward(dmem, ec)
    check_gradients(fwd, {"src": src, "tgt": tgt, **flatten(enc, "enc."), **flatten(dec, "dec.")},
                    {"src": dsrc, "tgt": dtgt, **flatten(genc, "enc."), **flatten(gdec, "dec.")},
                    df=dout, verbose=False)


def test_blocks_reject_bad_input(rng):
    p = B.encoder_layer_init(4, 2, 6, rng=rng, dtype=np.float64)
    with pytest.raises(ValueError, match="activation must be"):
        B.encoder_layer_forward(rng.standard_normal((1, 2, 4)), p, 2, activation="tanh")
    with pytest.raises(ValueError, match="x must have 3 dimensions"):
        B.encoder_layer_forward(rng.standard_normal((2, 4)), p, 2)
    with pytest.raises(ValueError, match="call the forward function first"):
        B.encoder_layer_backward(np.zeros((1, 2, 4)), None)
    _, cache = B.encoder_layer_forward(rng.standard_normal((1, 2, 4)), p, 2)
    with pytest.raises(ValueError, match="cache comes from encoder_layer_forward"):
        B.decoder_layer_backward(np.zeros((1, 2, 4)), cache)
