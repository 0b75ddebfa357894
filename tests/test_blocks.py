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
    with pytest.raises(TypeError, match="cache must be the cache that decoder_layer_forward "
                                        "returned, got the cache of encoder_layer_forward"):
        B.decoder_layer_backward(np.zeros((1, 2, 4)), cache)


# ------------------------------------------------------------------ messages, dout, caches, init

def _layer_case(rng, kind, norm_first, dtype=np.float64):
    """(forward() -> (out, cache), backward(dout, cache) -> dx, out shape) of one layer/stack."""
    x = rng.standard_normal((2, 3, 4)).astype(dtype)
    mem = rng.standard_normal((2, 5, 4)).astype(dtype)
    if kind == "ff":
        p = B.feed_forward_init(4, 6, rng=rng, dtype=dtype)
        return (lambda: B.feed_forward_forward(x, p),
                lambda d, c: B.feed_forward_backward(d, c)[0])
    if kind == "encoder_layer":
        p = randomize(B.encoder_layer_init(4, 2, 6, rng=rng, dtype=dtype), rng)
        return (lambda: B.encoder_layer_forward(x, p, 2, norm_first=norm_first),
                lambda d, c: B.encoder_layer_backward(d, c)[0])
    if kind == "decoder_layer":
        p = randomize(B.decoder_layer_init(4, 2, 6, rng=rng, dtype=dtype), rng)
        return (lambda: B.decoder_layer_forward(x, mem, p, 2, att.causal_mask(3),
                                                norm_first=norm_first),
                lambda d, c: B.decoder_layer_backward(d, c)[:2])
    layers = [randomize(B.encoder_layer_init(4, 2, 6, rng=rng, dtype=dtype), rng) for _ in "ab"]
    p = {"layers": layers, "norm": B.layer_norm_init(4, dtype=dtype)}
    if kind == "encoder":
        return (lambda: B.encoder_forward(x, p, 2, norm_first=norm_first),
                lambda d, c: B.encoder_backward(d, c)[0])
    layers = [randomize(B.decoder_layer_init(4, 2, 6, rng=rng, dtype=dtype), rng) for _ in "ab"]
    p = {"layers": layers, "norm": None}
    return (lambda: B.decoder_forward(x, mem, p, 2, att.causal_mask(3), norm_first=norm_first),
            lambda d, c: B.decoder_backward(d, c)[:2])


KINDS = ["ff", "encoder_layer", "decoder_layer", "encoder", "decoder"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("norm_first", [False, True])
def test_editing_an_output_in_place_does_not_change_the_gradients(rng, kind, norm_first):
    fwd, bwd = _layer_case(rng, kind, norm_first)
    out, cache = fwd()
    dout = rng.standard_normal(out.shape)
    expected = bwd(dout, fwd()[1])
    out[...] = 0
    got = bwd(dout, cache)
    for a, b in zip(got if isinstance(got, tuple) else (got,),
                    expected if isinstance(expected, tuple) else (expected,), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_backward_checks_dout(rng, kind, dtype):
    other = np.float64 if dtype == np.float32 else np.float32
    fwd, bwd = _layer_case(rng, kind, False, dtype)
    out, cache = fwd()
    with pytest.raises(TypeError, match="dout must be a NumPy array, got list"):
        bwd(out.tolist(), cache)
    with pytest.raises(TypeError, match=rf"dout must have the dtype of the forward output "
                                        rf"\({np.dtype(dtype)}\), got {np.dtype(other)}"):
        bwd(out.astype(other), cache)
    with pytest.raises(ValueError, match=r"dout must have shape \(2, 3, 4\)"):
        bwd(out[:1], cache)


@pytest.mark.parametrize("kind", KINDS[1:])
def test_caches_hold_no_functions(rng, kind):
    """The backward passes are written out: a cache holds arrays and caches, no closures."""
    _, cache = _layer_case(rng, kind, True)[0]()

    def walk(node):
        assert not callable(node), f"a cache holds {node!r}"
        if isinstance(node, (tuple, list)):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            for item in node.values():
                walk(item)

    walk(cache)


def test_decoder_names_the_memory_in_its_errors(rng):
    p = B.decoder_layer_init(4, 2, 6, rng=rng, dtype=np.float32)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    mem = rng.standard_normal((2, 5, 4)).astype(np.float32)
    with pytest.raises(TypeError, match=r"memory must have the dtype of x \(float32\), got "
                                        "float64"):
        B.decoder_layer_forward(x, mem.astype(np.float64), p, 2)
    with pytest.raises(ValueError, match=r"memory must have shape \(B, S, E\) = \(2, S, 4\) .* "
                                         r"got \(2, 5, 3\)"):
        B.decoder_layer_forward(x, mem[..., :3], p, 2)
    with pytest.raises(ValueError, match=r"memory must have shape .* got \(1, 5, 4\)"):
        B.decoder_forward(x, mem[:1], {"layers": [p], "norm": None}, 2)
    with pytest.raises(ValueError, match="memory must have 3 dimensions"):
        B.decoder_layer_forward(x, mem[0], p, 2)
    with pytest.raises(TypeError, match="memory must be a NumPy array"):
        B.decoder_layer_forward(x, mem.tolist(), p, 2)


def test_feed_forward_names_its_parameters_in_its_errors(rng):
    p = B.feed_forward_init(4, 6, rng=rng, dtype=np.float64)
    x = rng.standard_normal((2, 3, 4))
    with pytest.raises(ValueError, match=r"params\['W2'\] must have shape \(6, 4\) \(\(F, E\), "
                                         r"F = params\['W1'\]\.shape\[1\]\), got \(4, 6\)"):
        B.feed_forward_forward(x, {**p, "W2": p["W2"].T.copy()})
    with pytest.raises(ValueError, match=r"params\['W1'\] must have shape \(3, 6\) \(\(E, F\), "
                                         r"E = x.shape\[-1\]\), got \(4, 6\)"):
        B.feed_forward_forward(x[..., :3], p)
    with pytest.raises(ValueError, match=r"params\['b1'\] must have shape \(6,\)"):
        B.feed_forward_forward(x, {**p, "b1": p["b2"]})
    with pytest.raises(TypeError, match=r"params\['b2'\] must have the dtype of x \(float64\)"):
        B.feed_forward_forward(x, {**p, "b2": p["b2"].astype(np.float32)})
    with pytest.raises(ValueError, match="params is missing 'W1'"):
        B.feed_forward_forward(x, {"W2": p["W2"]})
    with pytest.raises(ValueError, match=r"params has unexpected entries \['W3'\]"):
        B.feed_forward_forward(x, {**p, "W3": p["W2"]})
    with pytest.raises(ValueError, match="activation must be"):
        B.feed_forward_forward(x, p, "tanh")
    # inside a layer, the path to the parameter
    layer = B.encoder_layer_init(4, 2, 6, rng=rng, dtype=np.float64)
    layer["ff"]["W2"] = layer["ff"]["W2"][:5]
    with pytest.raises(ValueError, match=r"params\['ff'\]\['W2'\] must have shape \(6, 4\)"):
        B.encoder_layer_forward(x, layer, 2)


def test_layers_check_their_parameter_dicts(rng):
    p = B.encoder_layer_init(4, 2, 6, rng=rng, dtype=np.float64)
    x = rng.standard_normal((1, 2, 4))
    with pytest.raises(ValueError, match=r"missing \['norm2'\], unexpected \[\]"):
        B.encoder_layer_forward(x, {k: a for k, a in p.items() if k != "norm2"}, 2)
    with pytest.raises(ValueError, match=r"unexpected \['cross_attn'\]"):
        B.encoder_layer_forward(x, {**p, "cross_attn": p["self_attn"]}, 2)
    with pytest.raises(TypeError, match="params must be a dict"):
        B.encoder_layer_forward(x, [p], 2)
    with pytest.raises(ValueError, match=r"params\['norm1'\] must be a dict with \(optional\) "
                                         "entries 'gamma' and 'beta'"):
        B.encoder_layer_forward(x, {**p, "norm1": {"weight": np.ones(4)}}, 2)
    with pytest.raises(TypeError, match="norm_first must be True or False, got 'yes'"):
        B.encoder_layer_forward(x, p, 2, norm_first="yes")
    with pytest.raises(ValueError, match="eps must be at least 0"):
        B.encoder_layer_forward(x, p, 2, eps=-1.0)
    with pytest.raises(ValueError, match=r'params must be a dict \{"layers"'):
        B.encoder_forward(x, {"layers": [], "norm": None}, 2)
    with pytest.raises(TypeError, match="got the cache of encoder_forward"):
        B.decoder_backward(x, B.encoder_forward(x, {"layers": [p]}, 2)[1])


@pytest.mark.parametrize("init", [
    lambda **kw: B.feed_forward_init(4, 6, **kw),
    lambda **kw: B.encoder_layer_init(4, 2, 6, **kw),
    lambda **kw: B.decoder_layer_init(4, 2, 6, **kw),
])
def test_inits_are_deterministic_and_check_their_arguments(init):
    a, b = flatten(init()), flatten(init())
    seeded = flatten(init(rng=np.random.default_rng(0)))
    other = flatten(init(rng=np.random.default_rng(1)))
    assert all(np.array_equal(a[n], b[n]) and np.array_equal(a[n], seeded[n]) for n in a)
    assert not all(np.array_equal(a[n], other[n]) for n in a)
    with pytest.raises(TypeError, match="rng must be a NumPy random Generator"):
        init(rng=0)
    with pytest.raises(TypeError, match="dtype must be np.float32 or np.float64"):
        init(dtype=int)
    assert all(arr.dtype == np.float64 for arr in flatten(init(dtype="float64")).values())
