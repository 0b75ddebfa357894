"""transformer_lab.reference.interop: NumPy twins of torch modules -- outputs, input gradients and
every parameter gradient matched against torch autograd (float32 within 1e-5, float64 within 1e-10,
norm-based relative error), with causal and padding masks together; twins gradient-checked in
float64; torch's is_causal, fully masked rows and fast path documented by tests; bad input refused
with errors that name the argument."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

from transformer_lab import attention as A
from transformer_lab.gradient_check import check_gradients, rel_error
from transformer_lab.reference.interop import from_torch

pytestmark = [
    # nn.TransformerEncoder explains at construction why it will not use nested tensors
    pytest.mark.filterwarnings("ignore:enable_nested_tensor is True"),
    # torch deprecates a bool key padding mask next to a float attention mask (still supported)
    pytest.mark.filterwarnings("ignore:Support for mismatched"),
]

TOL = {np.float32: 1e-5, np.float64: 1e-10}
DTYPES = [np.float32, np.float64]
TORCH_DTYPE = {np.float32: torch.float32, np.float64: torch.float64}


@pytest.fixture
def rng():
    return np.random.default_rng(0)


# ------------------------------------------------------------------ helpers

def build(cls, dtype, *args, seed=0, **kwargs):
    """A torch module with every parameter random (no zero bias, no unit norm weight), so that
    each one's gradient is tested; dropout off unless asked for."""
    torch.manual_seed(seed)
    if cls in (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer, nn.Transformer):
        kwargs.setdefault("dropout", 0.0)
    if cls not in (nn.TransformerEncoder, nn.TransformerDecoder):  # these take built layers
        kwargs["dtype"] = TORCH_DTYPE[dtype]
    m = cls(*args, **kwargs)
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.normal_(0, 0.3)
            if "norm" in name and name.endswith("weight"):
                p.add_(1.0)
    return m


def seq(rng, b, t, e, batch_first, dtype):
    """A random sequence batch in torch's layout: (B, T, E) or (T, B, E)."""
    x = rng.standard_normal((b, t, e)).astype(dtype)
    return x if batch_first else np.ascontiguousarray(x.swapaxes(0, 1))


def masks(kind, lengths, t, s, dtype, heads=1):
    """(attention mask, key padding mask): causal (top-left) and padding, together.

    kind "bool": True = blocked; "float": 0 / -inf added to the scores; "3d": a bool
    (B * heads, T, S) attention mask with a different pattern per sequence and head."""
    causal = A.causal_mask(t, s)
    pad = A.padding_mask(np.asarray(lengths), s)
    if kind == "float":
        return (np.where(causal, -np.inf, 0).astype(dtype),
                np.where(pad, -np.inf, 0).astype(dtype))
    if kind == "3d":
        b = len(lengths)
        per = np.broadcast_to(causal, (b * heads, t, s)).copy()
        per[1::2, :, 0] = True  # every other (sequence, head) may not see key 0 ...
        per[1::2, :, -1] = False  # ... but the last key (unless padded)
        per[1::2, 0, 0] = False  # query 0 keeps a key
        return per, pad
    return causal, pad


def close(ours, theirs, dtype, what):
    theirs = theirs.detach().numpy() if isinstance(theirs, torch.Tensor) else theirs
    assert ours.shape == theirs.shape, f"{what}: shape {ours.shape}, torch {theirs.shape}"
    assert ours.dtype == dtype, f"{what}: dtype {ours.dtype}, expected {dtype}"
    err = rel_error(ours, theirs)
    assert err < TOL[dtype], f"{what}: relative error {err:.2e} above {TOL[dtype]:.0e}"


def to_torch(x):
    return torch.tensor(x) if isinstance(x, np.ndarray) else x


def parity(m, args, kwargs, dtype, rng, twin=None):
    """Run torch (autograd) and the twin on the same inputs and upstream gradient; compare the
    output, the gradient of every float array input and of every parameter."""
    twin = twin or from_torch(m)
    leaves = [torch.tensor(a, requires_grad=np.issubdtype(a.dtype, np.floating)) for a in args]
    for p in m.parameters():
        p.grad = None
    ref = m(*leaves, **{k: to_torch(x) for k, x in kwargs.items()})
    ref = ref[0] if isinstance(ref, tuple) else ref
    dout = rng.standard_normal(tuple(ref.shape)).astype(dtype)
    (ref * torch.tensor(dout)).sum().backward()

    out = twin.forward(*args, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    grads = twin.backward(dout)
    close(out, ref, dtype, "output")
    grads = grads if isinstance(grads, tuple) else (grads,)
    for i, (g, leaf) in enumerate(zip(grads, leaves, strict=True)):
        if leaf.requires_grad:
            close(g, leaf.grad, dtype, f"gradient of argument {i}")
        else:
            assert g is None
    names = [n for n, _ in m.named_parameters()]
    assert list(twin.grads) == names  # torch's names, in torch's order
    for name, p in m.named_parameters():
        # in_proj_bias is compared whole: its key part alone has a zero gradient in exact
        # arithmetic (softmax ignores a shift shared by a query's scores) -- rounding noise.
        close(twin.grads[name], p.grad, dtype, f"grad {name}")
    return twin, out, grads


# ------------------------------------------------------------------ Linear, Embedding, LayerNorm

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5,), (2, 3, 5)])
def test_linear_parity(rng, dtype, bias, shape):
    m = build(nn.Linear, dtype, 5, 3, bias=bias)
    parity(m, [rng.standard_normal(shape).astype(dtype)], {}, dtype, rng)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("padding_idx", [None, 2])
@pytest.mark.parametrize("scale_grad_by_freq", [False, True])
def test_embedding_parity(rng, dtype, padding_idx, scale_grad_by_freq):
    m = build(nn.Embedding, dtype, 7, 4, padding_idx=padding_idx,
              scale_grad_by_freq=scale_grad_by_freq)
    ids = np.array([[1, 2, 2, 6], [0, 2, 1, 1]])  # repeats and the padding id
    twin, _, grads = parity(m, [ids], {}, dtype, rng)
    assert grads == (None,)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine,bias", [(True, True), (True, False), (False, False)])
@pytest.mark.parametrize("shape,eps", [((6,), 1e-5), ((3, 6), 1e-3)])
def test_layer_norm_parity(rng, dtype, affine, bias, shape, eps):
    m = build(nn.LayerNorm, dtype, shape, eps=eps, elementwise_affine=affine, bias=bias)
    parity(m, [rng.standard_normal((2, *shape)).astype(dtype) * 3 + 1], {}, dtype, rng)


# ------------------------------------------------------------------ MultiheadAttention

MHA_CASES = {  # name: (B, T, S, E, H, kdim, vdim, bias, masks, need_weights, average)
    "bool masks": (3, 4, 5, 8, 2, None, None, True, "bool", True, True),
    "float masks, kdim/vdim": (2, 4, 3, 6, 3, 5, 3, True, "float", True, False),
    "3-D mask, no bias": (2, 3, 4, 4, 2, None, None, False, "3d", True, False),
    "need_weights=False": (2, 3, 4, 4, 2, 3, 2, True, "bool", False, True),
    "batch 1, length 1, one head": (1, 1, 1, 4, 1, None, None, True, "bool", True, True),
    "heads = width": (2, 3, 2, 4, 4, None, None, True, "float", True, False),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("case", list(MHA_CASES))
def test_mha_parity(rng, dtype, batch_first, case):
    b, t, s, e, h, kdim, vdim, bias, kind, need_weights, average = MHA_CASES[case]
    m = build(nn.MultiheadAttention, dtype, e, h, bias=bias, kdim=kdim, vdim=vdim,
              batch_first=batch_first)
    lengths = [s] + [max(1, s - 1 - i) for i in range(b - 1)]
    am, kpm = masks(kind, lengths, t, s, dtype, heads=h)
    args = [seq(rng, b, t, e, batch_first, dtype), seq(rng, b, s, kdim or e, batch_first, dtype),
            seq(rng, b, s, vdim or e, batch_first, dtype)]
    kw = dict(attn_mask=am, key_padding_mask=kpm, need_weights=need_weights,
              average_attn_weights=average)
    twin, out, _ = parity(m, args, kw, dtype, rng)
    ours_w = twin.forward(*args, **kw)[1]
    with torch.no_grad():
        ref_w = m(*(torch.tensor(a) for a in args), **{k: to_torch(x) for k, x in kw.items()})[1]
    if need_weights:
        close(ours_w, ref_w, dtype, "attention weights")
    else:
        assert ours_w is None and ref_w is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch_first", [True, False])
def test_mha_same_array_gives_three_gradients_summing_to_torchs(rng, dtype, batch_first):
    m = build(nn.MultiheadAttention, dtype, 8, 2, batch_first=batch_first)
    x = seq(rng, 3, 5, 8, batch_first, dtype)
    am, kpm = masks("bool", [5, 3, 4], 5, 5, dtype)
    xt = torch.tensor(x, requires_grad=True)
    ref, _ = m(xt, xt, xt, attn_mask=torch.tensor(am), key_padding_mask=torch.tensor(kpm))
    dout = rng.standard_normal(tuple(ref.shape)).astype(dtype)
    (ref * torch.tensor(dout)).sum().backward()
    twin = from_torch(m)
    out, _ = twin.forward(x, x, x, attn_mask=am, key_padding_mask=kpm)
    dq, dk, dv = twin.backward(dout)
    close(out, ref, dtype, "output")
    close(dq + dk + dv, xt.grad, dtype, "dq + dk + dv")
    assert rel_error(dq, dk) > 0.1 and rel_error(dk, dv) > 0.1  # three different gradients
    for name, p in m.named_parameters():
        close(twin.grads[name], p.grad, dtype, f"grad {name}")


def test_mha_gradient_of_the_returned_weights(rng):
    m = build(nn.MultiheadAttention, np.float64, 4, 2, kdim=3, vdim=5, batch_first=True)
    args = [rng.standard_normal(s) for s in ((2, 3, 4), (2, 4, 3), (2, 4, 5))]
    leaves = [torch.tensor(a, requires_grad=True) for a in args]
    for average in (True, False):
        for p in m.parameters():
            p.grad = None
        out, w = m(*leaves, average_attn_weights=average)
        dout, dw = rng.standard_normal(tuple(out.shape)), rng.standard_normal(tuple(w.shape))
        ((out * torch.tensor(dout)).sum() + (w * torch.tensor(dw)).sum()).backward()
        twin = from_torch(m)
        twin.forward(*args, average_attn_weights=average)
        grads = twin.backward(dout, dweights=dw)
        for g, leaf in zip(grads, leaves, strict=True):
            close(g, leaf.grad, np.float64, "input gradient")
            leaf.grad = None
        for name, p in m.named_parameters():
            close(twin.grads[name], p.grad, np.float64, f"grad {name}")


# ------------------------------------------------------------------ encoder and decoder layers

LAYER_CASES = {  # name: constructor options, mask kind
    "post-norm relu bias, bool masks": (dict(norm_first=False, activation="relu"), "bool"),
    "pre-norm gelu no bias eps, float masks": (
        dict(norm_first=True, activation="gelu", bias=False, layer_norm_eps=1e-3), "float"),
    "post-norm GELU(tanh) module, 3-D mask": (
        dict(norm_first=False, activation=nn.GELU(approximate="tanh")), "3d"),
    "pre-norm F.relu, bool masks": (dict(norm_first=True, activation=torch.relu), "bool"),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("case", list(LAYER_CASES))
def test_encoder_layer_parity(rng, dtype, batch_first, case):
    opts, kind = LAYER_CASES[case]
    if opts["activation"] is torch.relu:
        opts = {**opts, "activation": torch.nn.functional.relu}
    m = build(nn.TransformerEncoderLayer, dtype, 8, 2, 12, batch_first=batch_first, **opts)
    am, kpm = masks(kind, [5, 3, 4], 5, 5, dtype, heads=2)
    parity(m, [seq(rng, 3, 5, 8, batch_first, dtype)],
           dict(src_mask=am, src_key_padding_mask=kpm), dtype, rng)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("case", list(LAYER_CASES))
def test_decoder_layer_parity(rng, dtype, batch_first, case):
    opts, kind = LAYER_CASES[case]
    if opts["activation"] is torch.relu:
        opts = {**opts, "activation": torch.nn.functional.relu}
    m = build(nn.TransformerDecoderLayer, dtype, 8, 4, 12, batch_first=batch_first, **opts)
    tm, tkpm = masks(kind, [4, 2, 3], 4, 4, dtype, heads=4)
    mm, mkpm = masks(kind, [6, 6, 3], 4, 6, dtype, heads=4)  # source length 6, target 4
    parity(m, [seq(rng, 3, 4, 8, batch_first, dtype), seq(rng, 3, 6, 8, batch_first, dtype)],
           dict(tgt_mask=tm, memory_mask=mm, tgt_key_padding_mask=tkpm,
                memory_key_padding_mask=mkpm), dtype, rng)


# ------------------------------------------------------------------ stacks and nn.Transformer

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("norm_first,final_norm", [(False, None), (True, 1e-4)])
def test_encoder_stack_parity(rng, dtype, batch_first, norm_first, final_norm):
    layer = nn.TransformerEncoderLayer(8, 2, 12, dropout=0.0, batch_first=batch_first,
                                       norm_first=norm_first, dtype=TORCH_DTYPE[dtype])
    norm = None if final_norm is None else nn.LayerNorm(8, eps=final_norm,
                                                        dtype=TORCH_DTYPE[dtype])
    m = build(nn.TransformerEncoder, dtype, layer, 2, norm=norm)
    am, kpm = masks("bool", [5, 2, 4], 5, 5, dtype)
    parity(m, [seq(rng, 3, 5, 8, batch_first, dtype)],
           dict(mask=am, src_key_padding_mask=kpm), dtype, rng)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("norm_first,final_norm", [(False, 1e-5), (True, None)])
def test_decoder_stack_parity(rng, dtype, batch_first, norm_first, final_norm):
    layer = nn.TransformerDecoderLayer(8, 2, 12, dropout=0.0, batch_first=batch_first,
                                       norm_first=norm_first, activation="gelu",
                                       dtype=TORCH_DTYPE[dtype])
    norm = None if final_norm is None else nn.LayerNorm(8, eps=final_norm,
                                                        dtype=TORCH_DTYPE[dtype])
    m = build(nn.TransformerDecoder, dtype, layer, 2, norm=norm)
    tm, tkpm = masks("float", [3, 1, 2], 3, 3, dtype)
    _, mkpm = masks("float", [4, 4, 2], 3, 4, dtype)
    parity(m, [seq(rng, 3, 3, 8, batch_first, dtype), seq(rng, 3, 4, 8, batch_first, dtype)],
           dict(tgt_mask=tm, tgt_key_padding_mask=tkpm, memory_key_padding_mask=mkpm),
           dtype, rng)


TRANSFORMER_CASES = {
    "post-norm relu": dict(norm_first=False),
    "pre-norm gelu no bias": dict(norm_first=True, activation="gelu", bias=False,
                                  layer_norm_eps=1e-4),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("case", list(TRANSFORMER_CASES))
def test_transformer_parity(rng, dtype, batch_first, case):
    m = build(nn.Transformer, dtype, d_model=8, nhead=2, num_encoder_layers=2,
              num_decoder_layers=2, dim_feedforward=12, batch_first=batch_first,
              **TRANSFORMER_CASES[case])
    s, t = 6, 4  # source length != target length
    sm, skpm = masks("bool", [6, 3, 5], s, s, dtype)
    tm, tkpm = masks("bool", [4, 4, 2], t, t, dtype)
    mm, _ = masks("bool", [6, 3, 5], t, s, dtype)
    mm[:] = False
    mm[:, 1] = True  # hide one source position from the decoder
    parity(m, [seq(rng, 3, s, 8, batch_first, dtype), seq(rng, 3, t, 8, batch_first, dtype)],
           dict(src_mask=sm, tgt_mask=tm, memory_mask=mm, src_key_padding_mask=skpm,
                tgt_key_padding_mask=tkpm, memory_key_padding_mask=skpm), dtype, rng)


OPTION_GRID = [dict(bias=bias, norm_first=norm_first, activation=act, layer_norm_eps=eps)
               for bias in (True, False) for norm_first in (False, True)
               for act, eps in (("relu", 1e-5), ("gelu", 1e-3))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("opts", OPTION_GRID, ids=lambda o: "-".join(
    [("bias" if o["bias"] else "nobias"), ("pre" if o["norm_first"] else "post"),
     o["activation"]]))
@pytest.mark.parametrize("kind", ["encoder_layer", "decoder_layer", "transformer"])
def test_every_option_combination_matches_torch(rng, kind, opts, batch_first, dtype):
    """The full grid bias x norm_first x activation (with its eps) x batch_first x dtype, with
    causal and padding masks together, source length != target length."""
    s, t = 5, 4
    src_am, src_kpm = masks("bool", [5, 2, 4], s, s, dtype)
    tgt_am, tgt_kpm = masks("bool", [4, 4, 1], t, t, dtype)
    src, tgt = seq(rng, 3, s, 8, batch_first, dtype), seq(rng, 3, t, 8, batch_first, dtype)
    if kind == "encoder_layer":
        m = build(nn.TransformerEncoderLayer, dtype, 8, 2, 12, batch_first=batch_first, **opts)
        parity(m, [src], dict(src_mask=src_am, src_key_padding_mask=src_kpm), dtype, rng)
    elif kind == "decoder_layer":
        m = build(nn.TransformerDecoderLayer, dtype, 8, 2, 12, batch_first=batch_first, **opts)
        parity(m, [tgt, src], dict(tgt_mask=tgt_am, tgt_key_padding_mask=tgt_kpm,
                                   memory_key_padding_mask=src_kpm), dtype, rng)
    else:
        m = build(nn.Transformer, dtype, d_model=8, nhead=2, num_encoder_layers=1,
                  num_decoder_layers=1, dim_feedforward=12, batch_first=batch_first, **opts)
        parity(m, [src, tgt], dict(src_mask=src_am, tgt_mask=tgt_am,
                                   src_key_padding_mask=src_kpm, tgt_key_padding_mask=tgt_kpm,
                                   memory_key_padding_mask=src_kpm), dtype, rng)


def test_transformer_in_eval_mode_with_default_dropout(rng):
    m = nn.Transformer(8, 2, 1, 1, 16, dtype=torch.float64).eval()  # dropout=0.1, inactive
    src, tgt = rng.standard_normal((5, 2, 8)), rng.standard_normal((3, 2, 8))
    parity(m, [src, tgt], dict(tgt_mask=A.causal_mask(3), tgt_is_causal=True), np.float64, rng)


@pytest.mark.parametrize("dtype", DTYPES)
def test_unbatched_inputs(rng, dtype):
    """2-D sequences (length, features), as torch accepts them, with their 1-D padding masks."""
    m = build(nn.MultiheadAttention, dtype, 4, 2, kdim=3)
    kpm = np.array([False, False, True])
    parity(m, [rng.standard_normal((2, 4)).astype(dtype), rng.standard_normal((3, 3)).astype(dtype),
               rng.standard_normal((3, 4)).astype(dtype)],
           dict(key_padding_mask=kpm, attn_mask=np.zeros((2, 2, 3), bool)), dtype, rng)
    m = build(nn.Transformer, dtype, 4, 2, 1, 1, 6)
    src, tgt = rng.standard_normal((3, 4)).astype(dtype), rng.standard_normal((2, 4)).astype(dtype)
    parity(m, [src, tgt], dict(tgt_mask=A.causal_mask(2), src_key_padding_mask=kpm,
                memory_key_padding_mask=kpm), dtype, rng)


# ------------------------------------------------------------------ is_causal, as torch 2.13

def test_is_causal_hint_replaces_the_mask_only_without_padding(rng):
    """With need_weights=False (the layers), is_causal=True and no key padding mask, torch runs
    causal attention and ignores the mask's contents; with a padding mask it uses the mask."""
    m = build(nn.TransformerEncoderLayer, np.float64, 4, 2, 6, batch_first=True)
    x = rng.standard_normal((2, 4, 4))
    odd = np.zeros((4, 4), bool)
    odd[:, 2] = True  # not causal at all
    twin, out_hint, _ = parity(m, [x], dict(src_mask=odd, is_causal=True), np.float64, rng)
    out_causal = twin.forward(x, src_mask=A.causal_mask(4))
    out_odd = twin.forward(x, src_mask=odd)
    np.testing.assert_allclose(out_hint, out_causal, rtol=1e-12)
    assert rel_error(out_hint, out_odd) > 1e-3
    kpm = A.padding_mask(np.array([4, 3]), 4)
    _, out, _ = parity(m, [x], dict(src_mask=odd, src_key_padding_mask=kpm, is_causal=True),
                       np.float64, rng)
    np.testing.assert_allclose(out, twin.forward(x, src_mask=odd, src_key_padding_mask=kpm),
                               rtol=1e-12)
    # nn.MultiheadAttention with need_weights=True uses the mask, hint or not
    mha = build(nn.MultiheadAttention, np.float64, 4, 2, batch_first=True)
    parity(mha, [x, x, x], dict(attn_mask=odd, is_causal=True, need_weights=True), np.float64,
           rng)
    parity(mha, [x, x, x], dict(attn_mask=odd, is_causal=True, need_weights=False),
           np.float64, rng)


def test_causal_hints_of_stacks_and_memory(rng):
    m = build(nn.Transformer, np.float64, 4, 2, 1, 2, 6, batch_first=True)
    src, tgt = rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 3, 4))
    float_causal = nn.Transformer.generate_square_subsequent_mask(3, dtype=torch.float64)
    # None (detect): a causal mask given as a float mask, as torch's helper builds it
    parity(m, [src, tgt], dict(tgt_mask=float_causal.numpy(), tgt_is_causal=None),
           np.float64, rng)
    # memory_is_causal with a (T, S) memory mask, T != S: top-left causal, as torch
    parity(m, [src, tgt], dict(memory_mask=A.causal_mask(3, 5), memory_is_causal=True,
                               src_is_causal=True, src_mask=A.causal_mask(5)), np.float64, rng)


def test_is_causal_without_a_mask_is_refused(rng):
    twin = from_torch(build(nn.TransformerEncoderLayer, np.float64, 4, 2, 6))
    with pytest.raises(ValueError, match="is_causal=True needs src_mask"):
        twin.forward(rng.standard_normal((3, 2, 4)), is_causal=True)
    twin = from_torch(build(nn.Transformer, np.float64, 4, 2, 1, 1, 6))
    with pytest.raises(ValueError, match="tgt_is_causal=True needs tgt_mask"):
        twin.forward(rng.standard_normal((3, 2, 4)), rng.standard_normal((3, 2, 4)),
                     tgt_is_causal=True)
    with pytest.raises(ValueError, match="memory_is_causal=True needs memory_mask"):
        twin.forward(rng.standard_normal((3, 2, 4)), rng.standard_normal((3, 2, 4)),
                     memory_is_causal=True)


# ------------------------------------------------------------------ fully masked rows

def test_fully_masked_row_in_multihead_attention(rng):
    """torch returns NaN for a query whose keys are all masked (need_weights=True); the twin
    returns zero weights and the output bias there, never NaN, and matches torch on every other
    row. With need_weights=False torch returns zeros too: then everything matches, gradients
    included."""
    m = build(nn.MultiheadAttention, np.float64, 4, 2, batch_first=True)
    x = rng.standard_normal((2, 3, 4))
    am = np.zeros((3, 3), bool)
    am[1] = True  # query 1 sees nothing
    twin = from_torch(m)
    out, w = twin.forward(x, x, x, attn_mask=am)
    grads = twin.backward(np.ones_like(out))
    with torch.no_grad():
        ref, ref_w = (a.numpy() for a in m(*(torch.tensor(x),) * 3, attn_mask=torch.tensor(am)))
    assert np.isnan(ref[:, 1]).all() and np.isnan(ref_w[:, 1]).all()
    np.testing.assert_allclose(out[:, 1], np.broadcast_to(twin.params["out_proj.bias"], (2, 4)))
    assert np.all(w[:, 1] == 0)
    for a in (out, w, *grads, *twin.grads.values()):
        assert np.isfinite(a).all()
    keep = [0, 2]
    close(out[:, keep], ref[:, keep], np.float64, "other rows")
    close(w[:, keep], ref_w[:, keep], np.float64, "other rows' weights")
    parity(m, [x, x, x], dict(attn_mask=am, need_weights=False), np.float64, rng)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fully_padded_sequence_in_a_transformer(rng, dtype):
    """A whole source sequence padded: every encoder query of it sees nothing. Torch's layers
    (need_weights=False) also give zeros there: outputs and all gradients match, no NaN."""
    m = build(nn.Transformer, dtype, 4, 2, 1, 1, 6, batch_first=True)
    skpm = A.padding_mask(np.array([3, 0]), 3)
    src, tgt = (rng.standard_normal((2, n, 4)).astype(dtype) for n in (3, 2))
    kw = dict(src_key_padding_mask=skpm, tgt_mask=A.causal_mask(2), memory_key_padding_mask=skpm)
    twin, out, grads = parity(m, [src, tgt], kw, dtype, rng)
    for a in (out, *grads, *twin.grads.values()):
        assert np.isfinite(a).all()


# ------------------------------------------------------------------ torch's inference fast path

def test_encoder_fast_path_zeroes_padded_positions_the_twin_computes_autograd_path(rng):
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    m = nn.TransformerEncoder(layer, 2).eval()  # enable_nested_tensor=True by default
    x = rng.standard_normal((3, 5, 8)).astype(np.float32)
    kpm = A.padding_mask(np.array([5, 2, 4]), 5)
    with torch.no_grad():
        fast = m(torch.tensor(x), src_key_padding_mask=torch.tensor(kpm)).numpy()
    slow = m(torch.tensor(x, requires_grad=True), src_key_padding_mask=torch.tensor(kpm))
    slow = slow.detach().numpy()
    ours = from_torch(m).forward(x, src_key_padding_mask=kpm)
    close(ours, slow, np.float32, "twin vs autograd path")
    assert np.all(fast[kpm] == 0) and np.all(np.abs(ours[kpm]) > 0)
    assert rel_error(ours[~kpm], fast[~kpm]) < 1e-5  # real positions agree


# ------------------------------------------------------------------ gradient checks (float64)

GRADCHECK_CASES = {  # (B, S, T, E, H, batch_first)
    "batch 1, target length 1, one head": (1, 3, 1, 4, 1, False),
    "heads = width, S != T": (2, 2, 3, 4, 4, True),
}


@pytest.mark.parametrize("case", list(GRADCHECK_CASES))
def test_transformer_twin_gradcheck(rng, case):
    b, s, t, e, h, batch_first = GRADCHECK_CASES[case]
    m = build(nn.Transformer, np.float64, e, h, 1, 1, 5, batch_first=batch_first,
              norm_first=b == 1, activation="gelu")
    twin = from_torch(m)
    src, tgt = seq(rng, b, s, e, batch_first, np.float64), seq(rng, b, t, e, batch_first,
                                                               np.float64)
    kw = dict(tgt_mask=A.causal_mask(t), src_key_padding_mask=A.padding_mask(
        np.array([s] + [1] * (b - 1)), s), memory_key_padding_mask=A.padding_mask(
        np.array([s] + [1] * (b - 1)), s))
    out = twin.forward(src, tgt, **kw)
    dout = rng.standard_normal(out.shape)
    dsrc, dtgt = twin.backward(dout)
    check_gradients(lambda: twin.forward(src, tgt, **kw), {"src": src, "tgt": tgt, **twin.params},
                    {"src": dsrc, "tgt": dtgt, **twin.grads}, df=dout, verbose=False)


@pytest.mark.parametrize("h", [1, 4])
def test_mha_twin_gradcheck_with_kdim_vdim(rng, h):
    m = build(nn.MultiheadAttention, np.float64, 4, h, kdim=3, vdim=2)
    twin = from_torch(m)
    q, k, val = (rng.standard_normal(s) for s in ((2, 1, 4), (3, 1, 3), (3, 1, 2)))
    kpm = np.array([[False, False, True]])
    out, w = twin.forward(q, k, val, key_padding_mask=kpm)
    dout, dw = rng.standard_normal(out.shape), rng.standard_normal(w.shape)

    def loss():
        o, ww = twin.forward(q, k, val, key_padding_mask=kpm)
        return np.sum(o * dout) + np.sum(ww * dw)

    dq, dk, dv = twin.backward(dout, dweights=dw)
    check_gradients(loss, {"q": q, "k": k, "v": val, **twin.params},
                    {"q": dq, "k": dk, "v": dv, **twin.grads}, verbose=False)


def test_layer_norm_and_embedding_twins_gradcheck(rng):
    twin = from_torch(build(nn.LayerNorm, np.float64, (2, 3)))
    x = rng.standard_normal((4, 2, 3))
    dout = rng.standard_normal(x.shape)
    twin.forward(x)
    dx = twin.backward(dout)
    check_gradients(lambda: twin.forward(x), {"x": x, **twin.params}, {"x": dx, **twin.grads},
                    df=dout, verbose=False)
    twin = from_torch(build(nn.Embedding, np.float64, 5, 3, scale_grad_by_freq=True))
    ids = np.array([[0, 3, 3], [4, 3, 0]])
    dout = rng.standard_normal((2, 3, 3))
    twin.forward(ids)
    twin.backward(dout)
    counts = np.bincount(ids.ravel(), minlength=5)[ids][..., None]
    check_gradients(lambda: twin.forward(ids), twin.params, twin.grads, df=dout / counts,
                    verbose=False)


# ------------------------------------------------------------------ snapshot and refresh

def test_twin_is_a_snapshot_until_refreshed(rng):
    m = build(nn.Linear, np.float64, 3, 2)
    twin = from_torch(m)
    x = rng.standard_normal((4, 3))
    before = twin.forward(x)
    with torch.no_grad():
        m.weight.mul_(2)
    np.testing.assert_array_equal(twin.forward(x), before)
    twin.refresh(m)
    parity(m, [x], {}, np.float64, rng, twin=twin)
    twin.params["bias"][:] = 0  # params are the twin's own weights, in torch's layout
    np.testing.assert_allclose(twin.forward(x), x @ m.weight.detach().numpy().T)
    with pytest.raises(ValueError, match="module must have the parameters of the twin"):
        twin.refresh(nn.Linear(3, 2, bias=False, dtype=torch.float64))


def test_refresh_refuses_other_sizes_and_dtypes_and_copies_nothing(rng):
    m = build(nn.Linear, np.float32, 3, 2)
    twin = from_torch(m)
    before = {k: p.copy() for k, p in twin.params.items()}
    with pytest.raises(ValueError, match=r"module parameter 'weight' has shape \(4, 3\) but "
                                         r"the twin's has shape \(2, 3\).*from_torch\(module\)"):
        twin.refresh(nn.Linear(3, 4))
    with pytest.raises(TypeError, match="module parameter 'weight' is float64 but the twin is "
                                        "float32"):
        twin.refresh(build(nn.Linear, np.float64, 3, 2, seed=1))
    for name, p in twin.params.items():
        np.testing.assert_array_equal(p, before[name])
    layer = build(nn.TransformerEncoderLayer, np.float64, 4, 2, 6)
    twin = from_torch(layer)
    with pytest.raises(ValueError, match="'linear1.weight' has shape"):
        twin.refresh(build(nn.TransformerEncoderLayer, np.float64, 4, 2, 8))


@pytest.mark.parametrize("bias", [True, False])
def test_layout_conversion_round_trips_and_splits_the_cross_attention(rng, bias):
    from transformer_lab.reference import interop as I

    m = build(nn.TransformerDecoder, np.float64,
              build(nn.TransformerDecoderLayer, np.float64, 4, 2, 6, bias=bias), 2,
              norm=nn.LayerNorm(4, bias=bias, dtype=torch.float64))
    P = {k: p.detach().numpy() for k, p in m.named_parameters()}
    for split in (False, True):
        p = I.stack_from_torch(P, "", 2, 4, decoder=True, split_cross=split)
        cross = p["layers"][1]["cross_attn"]
        in_proj = P["layers.1.multihead_attn.in_proj_weight"]  # (3E, E) = [W_q^T; W_k^T; W_v^T]
        if split:
            assert set(cross) >= {"W_q", "W_k", "W_v"} and "W_qkv" not in cross
            np.testing.assert_array_equal(cross["W_k"], in_proj[4:8].T)
            assert np.shares_memory(cross["W_v"], in_proj)  # views, not copies
        else:
            np.testing.assert_array_equal(cross["W_qkv"], in_proj.T)
        assert ("b_o" in cross) == bias and ("beta" in p["norm"]) == bias
        back = I.stack_to_torch(p, "")
        assert set(back) == set(P)
        for name, value in P.items():
            np.testing.assert_array_equal(back[name], value, err_msg=name)


# ------------------------------------------------------------------ the twins run on the core

def _spy(monkeypatch, module, name, calls):
    """Replace ``module.name`` by a wrapper that records its calls and calls the original."""
    real = getattr(module, name)

    def wrapper(*args, **kwargs):
        calls.append(name)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)


def test_twins_run_on_the_core(rng, monkeypatch):
    """Every twin calls transformer_lab.core, looked up at call time: a core function replaced
    after the twin was built is the one that runs (the student's, the grader's)."""
    from transformer_lab.core import blocks as core_blocks
    from transformer_lab.core import layers as core_layers
    from transformer_lab.core import multihead as core_multihead

    calls = []
    for module, names in ((core_layers, ("linear_forward", "linear_backward",
                                         "embedding_forward", "embedding_backward",
                                         "layer_norm_forward", "layer_norm_backward")),
                          (core_multihead, ("multi_head_attention_forward",
                                            "multi_head_attention_backward")),
                          (core_blocks, ("encoder_layer_forward", "encoder_layer_backward",
                                         "decoder_layer_forward", "decoder_layer_backward",
                                         "encoder_forward", "encoder_backward",
                                         "decoder_forward", "decoder_backward"))):
        for name in names:
            _spy(monkeypatch, module, name, calls)

    def run(m, *args, **kwargs):
        calls.clear()
        twin = from_torch(m)
        out = twin.forward(*args, **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        twin.backward(np.ones_like(out, dtype=np.float64))
        return list(calls)

    x = rng.standard_normal((2, 3, 4))
    assert run(build(nn.Linear, np.float64, 4, 2), x[..., :4]) == \
        ["linear_forward", "linear_backward"]
    assert run(build(nn.Embedding, np.float64, 5, 4), np.array([[1, 2]])) == \
        ["embedding_forward", "embedding_backward"]
    assert run(build(nn.LayerNorm, np.float64, 4), x) == \
        ["layer_norm_forward", "layer_norm_backward"]
    assert run(build(nn.MultiheadAttention, np.float64, 4, 2), x, x, x) == \
        ["multi_head_attention_forward", "multi_head_attention_backward"]
    assert run(build(nn.TransformerEncoderLayer, np.float64, 4, 2, 6), x) == \
        ["encoder_layer_forward", "encoder_layer_backward"]
    assert run(build(nn.TransformerDecoderLayer, np.float64, 4, 2, 6), x, x) == \
        ["decoder_layer_forward", "decoder_layer_backward"]
    # a stack: the core's stack, whose layers are the core's layers; its final norm
    got = run(build(nn.Transformer, np.float64, 4, 2, 1, 1, 6), x, x)
    assert got == ["encoder_forward", "encoder_layer_forward", "layer_norm_forward",
                   "decoder_forward", "decoder_layer_forward", "layer_norm_forward",
                   "layer_norm_backward", "decoder_backward", "decoder_layer_backward",
                   "layer_norm_backward", "encoder_backward", "encoder_layer_backward"]


@pytest.mark.parametrize("module,name,make", [
    ("multihead", "multi_head_attention_forward",
     lambda: build(nn.MultiheadAttention, np.float64, 4, 2)),
    ("blocks", "encoder_layer_forward",
     lambda: build(nn.TransformerEncoderLayer, np.float64, 4, 2, 6)),
    ("blocks", "decoder_forward", lambda: build(nn.Transformer, np.float64, 4, 2, 1, 1, 6)),
])
def test_a_stub_in_the_core_stops_the_twin_with_its_message(rng, monkeypatch, module, name,
                                                             make):
    import importlib

    def stub(*args, **kwargs):
        raise NotImplementedError("stub message")

    twin = from_torch(make())
    monkeypatch.setattr(importlib.import_module(f"transformer_lab.core.{module}"), name, stub)
    x = rng.standard_normal((3, 2, 4))
    with pytest.raises(NotImplementedError, match="stub message"):
        twin.forward(x, x, x) if module == "multihead" else \
            twin.forward(x) if name.startswith("encoder") else twin.forward(x, x)


def test_twin_weights_are_views_of_torchs_layout_and_chosen_per_attention(rng):
    """No weight is copied for the core: the layers' self-attention takes the packed W_qkv, the
    cross-attention (and nn.MultiheadAttention, which returns one gradient per argument) W_q,
    W_k, W_v -- all views of in_proj_weight."""
    dec = from_torch(build(nn.TransformerDecoderLayer, np.float64, 4, 2, 6))
    in_self, in_cross = (dec.params[f"{a}.in_proj_weight"] for a in ("self_attn",
                                                                     "multihead_attn"))
    p = dec._core.params
    assert set(p["self_attn"]) == {"W_qkv", "b_qkv", "W_o", "b_o"}
    assert np.shares_memory(p["self_attn"]["W_qkv"], in_self)
    np.testing.assert_array_equal(p["self_attn"]["W_qkv"], in_self.T)
    assert set(p["cross_attn"]) == {"W_q", "W_k", "W_v", "b_q", "b_k", "b_v", "W_o", "b_o"}
    for i, c in enumerate("qkv"):
        assert np.shares_memory(p["cross_attn"][f"W_{c}"], in_cross)
        np.testing.assert_array_equal(p["cross_attn"][f"W_{c}"], in_cross[4 * i:4 * i + 4].T)
    mha = from_torch(build(nn.MultiheadAttention, np.float64, 4, 2))
    assert "W_qkv" not in mha._p and np.shares_memory(mha._p["W_k"], mha.params["in_proj_weight"])


def test_mixed_float_and_bool_masks_are_added(rng):
    """A float attention mask with a bool key padding mask (torch: deprecated, still supported):
    both become additive masks and are summed, as torch does."""
    m = build(nn.TransformerEncoderLayer, np.float64, 4, 2, 6, batch_first=True)
    am = rng.standard_normal((5, 5))  # a soft bias, not only 0 / -inf
    am[:, 3] = -np.inf
    kpm = A.padding_mask(np.array([5, 2]), 5)
    parity(m, [rng.standard_normal((2, 5, 4))], dict(src_mask=am, src_key_padding_mask=kpm),
           np.float64, rng)
    mha = build(nn.MultiheadAttention, np.float64, 4, 2, batch_first=True)
    x = rng.standard_normal((2, 5, 4))
    parity(mha, [x, x, x], dict(attn_mask=A.causal_mask(5),
                                key_padding_mask=np.where(kpm, -np.inf, 0.5)), np.float64, rng)


def test_returned_weights_per_head_are_read_only(rng):
    """The backward pass reads the weights again: handed out per head, they are read-only
    (averaged ones are a new array)."""
    twin = from_torch(build(nn.MultiheadAttention, np.float64, 4, 2, batch_first=True))
    x = rng.standard_normal((2, 3, 4))
    _, w = twin.forward(x, x, x, average_attn_weights=False)
    assert w.shape == (2, 2, 3, 3) and not w.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        w[0, 0, 0, 0] = 1.0
    _, w = twin.forward(x, x, x)
    assert w.shape == (2, 3, 3) and w.flags.writeable


# ------------------------------------------------------------------ bad input

def test_model_width_not_divisible_by_heads(rng):
    m = nn.MultiheadAttention(6, 2)
    m.num_heads = 4  # torch itself refuses to build this; a modified module must be refused too
    with pytest.raises(ValueError, match="num_heads: embed_dim = 6 must be divisible by "
                                         "num_heads, got num_heads = 4"):
        from_torch(m)
    layer = nn.TransformerEncoderLayer(6, 2, 8, dropout=0.0)
    layer.self_attn.num_heads = 4
    with pytest.raises(ValueError, match="the model width 6 must be divisible by num_heads"):
        from_torch(layer)


def test_masks_of_wrong_shape_or_dtype(rng):
    twin = from_torch(build(nn.TransformerEncoderLayer, np.float64, 4, 2, 6, batch_first=True))
    x = rng.standard_normal((3, 5, 4))
    with pytest.raises(ValueError, match=r"src_mask must have shape \(target length, source "
                                         r"length\) = \(5, 5\) or \(batch \* num_heads, T, S\) "
                                         r"= \(6, 5, 5\), got \(5, 4\)"):
        twin.forward(x, src_mask=np.zeros((5, 4), bool))
    with pytest.raises(ValueError, match=r"src_key_padding_mask must have shape \(batch, source "
                                         r"length\) = \(3, 5\), got \(5, 3\)"):
        twin.forward(x, src_key_padding_mask=np.zeros((5, 3), bool))
    with pytest.raises(TypeError, match="src_mask must be a bool mask .* got dtype int64"):
        twin.forward(x, src_mask=np.zeros((5, 5), np.int64))
    with pytest.raises(TypeError, match="src_key_padding_mask must be a NumPy array"):
        twin.forward(x, src_key_padding_mask=[[False] * 5] * 3)
    twin = from_torch(build(nn.Transformer, np.float64, 4, 2, 1, 1, 6))
    with pytest.raises(ValueError, match=r"memory_mask must have shape .* \(2, 3\)"):
        twin.forward(rng.standard_normal((3, 1, 4)), rng.standard_normal((2, 1, 4)),
                     memory_mask=np.zeros((3, 2), bool))
    mha = from_torch(build(nn.MultiheadAttention, np.float64, 4, 2))
    with pytest.raises(ValueError, match=r"attn_mask must have shape"):
        mha.forward(*(rng.standard_normal((3, 2, 4)),) * 3, attn_mask=np.zeros((2, 3, 3), bool))
    enc = from_torch(build(nn.TransformerEncoderLayer, np.float64, 4, 2, 6, batch_first=True))
    for bad in (np.nan, np.inf):
        mask = np.zeros((3, 3))
        mask[0, 1] = bad
        with pytest.raises(ValueError, match=r"attn_mask must not contain NaN or \+inf \(use "
                                             r"-inf or True to block\)"):
            mha.forward(*(rng.standard_normal((3, 2, 4)),) * 3, attn_mask=mask)
        pad = np.zeros((3, 5))
        pad[1, 2] = bad
        with pytest.raises(ValueError, match="src_key_padding_mask must not contain NaN"):
            enc.forward(x, src_key_padding_mask=pad)


def test_gradient_of_the_weights_of_wrong_shape_or_without_weights(rng):
    twin = from_torch(build(nn.MultiheadAttention, np.float64, 4, 2, batch_first=True))
    x = rng.standard_normal((2, 3, 4))
    out, w = twin.forward(x, x, x)
    with pytest.raises(ValueError, match=r"dweights must have shape \(2, 3, 3\) \(the averaged "
                                         r"attention weights\), got \(2, 2, 3, 3\)"):
        twin.backward(out, dweights=np.zeros((2, 2, 3, 3)))
    with pytest.raises(TypeError, match="dweights must have the module's dtype float64"):
        twin.backward(out, dweights=w.astype(np.float32))
    twin.forward(x, x, x, average_attn_weights=False)
    with pytest.raises(ValueError, match=r"dweights must have shape \(2, 2, 3, 3\) \(the "
                                         r"attention weights per head\)"):
        twin.backward(out, dweights=w)
    twin.forward(x[0], x[0], x[0])  # unbatched: the weights are (T, S)
    with pytest.raises(ValueError, match=r"dweights must have shape \(3, 3\)"):
        twin.backward(out[0], dweights=w)
    twin.forward(x, x, x, need_weights=False)
    with pytest.raises(ValueError, match=r"dweights: the last forward returned no weights "
                                         r"\(need_weights=False\)"):
        twin.backward(out, dweights=w)


def test_key_and_value_lengths_that_differ(rng):
    twin = from_torch(build(nn.MultiheadAttention, np.float64, 4, 2, batch_first=True))
    with pytest.raises(ValueError, match="key and value must have the same length S, got 3 "
                                         "and 2"):
        twin.forward(rng.standard_normal((1, 2, 4)), rng.standard_normal((1, 3, 4)),
                     rng.standard_normal((1, 2, 4)))
    with pytest.raises(ValueError, match="same batch size"):
        twin.forward(rng.standard_normal((1, 2, 4)), rng.standard_normal((2, 3, 4)),
                     rng.standard_normal((2, 3, 4)))


def test_wrong_rank_width_or_dtype(rng):
    twin = from_torch(build(nn.TransformerEncoderLayer, np.float32, 4, 2, 6))
    with pytest.raises(ValueError, match=r"src must have 3 dimensions \(length, batch, "
                                         r"features\) \(batch_first=False\), or 2"):
        twin.forward(np.zeros((2, 3, 1, 4), np.float32))
    with pytest.raises(ValueError, match=r"src must have 3 dimensions"):
        twin.forward(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="src must have 4 features in its last axis"):
        twin.forward(np.zeros((2, 3, 5), np.float32))
    with pytest.raises(TypeError, match="src must have the module's dtype float32, got float64"):
        twin.forward(np.zeros((2, 3, 4)))
    with pytest.raises(TypeError, match="src must be a NumPy array, got Tensor"):
        twin.forward(torch.zeros(2, 3, 4))
    mha = from_torch(build(nn.MultiheadAttention, np.float32, 4, 2, batch_first=True))
    with pytest.raises(ValueError, match="query and key and value must all be batched"):
        mha.forward(np.zeros((1, 2, 4), np.float32), np.zeros((2, 4), np.float32),
                    np.zeros((2, 4), np.float32))
    dec = from_torch(build(nn.TransformerDecoderLayer, np.float32, 4, 2, 6, batch_first=True))
    with pytest.raises(ValueError, match="tgt and memory must have the same batch size"):
        dec.forward(np.zeros((2, 3, 4), np.float32), np.zeros((1, 3, 4), np.float32))
    out = twin.forward(np.zeros((2, 3, 4), np.float32))
    with pytest.raises(ValueError, match=r"dout must have shape \(2, 3, 4\)"):
        twin.backward(np.zeros((3, 2, 4), np.float32))
    with pytest.raises(TypeError, match=r"dout must have the dtype of the forward output "
                                        r"\(float32\), got float64"):
        twin.backward(out.astype(np.float64))
    linear = from_torch(build(nn.Linear, np.float32, 4, 3))
    linear.forward(np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match=r"dout must have shape \(2, 3\)"):
        linear.backward(np.zeros((2, 4), np.float32))


def test_layer_norm_without_parameters_takes_the_forward_dtype_for_dout(rng):
    twin = from_torch(nn.LayerNorm(3, elementwise_affine=False))
    assert twin.dtype is None and twin.params == {}
    x32 = rng.standard_normal((2, 3)).astype(np.float32)
    out = twin.forward(x32)
    assert out.dtype == np.float32
    with pytest.raises(TypeError, match=r"dout must have the dtype of the forward output "
                                        r"\(float32\), got float64"):
        twin.backward(out.astype(np.float64))
    assert twin.backward(out).dtype == np.float32
    out64 = twin.forward(x32.astype(np.float64))  # float64 works too, then wants float64
    assert twin.backward(out64).dtype == np.float64


def test_token_ids_out_of_range_negative_or_not_integers(rng):
    twin = from_torch(build(nn.Embedding, np.float32, 5, 3))
    with pytest.raises(ValueError, match="input must be token ids below the vocabulary size 5, "
                                         "found 5"):
        twin.forward(np.array([[0, 5]]))
    with pytest.raises(ValueError, match="input must be non-negative token ids, found -1"):
        twin.forward(np.array([-1, 2]))
    with pytest.raises(TypeError, match="input must be an array of integer token ids, got "
                                        "dtype float64"):
        twin.forward(np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match="got dtype bool"):
        twin.forward(np.array([True]))


def test_backward_before_forward(rng):
    for m in (build(nn.Linear, np.float32, 2, 2), build(nn.Embedding, np.float32, 3, 2),
              build(nn.MultiheadAttention, np.float32, 4, 2),
              build(nn.Transformer, np.float32, 4, 2, 1, 1, 6)):
        with pytest.raises(ValueError, match=r"backward: no forward pass to differentiate -- "
                                             r"call twin.forward\(...\) first"):
            from_torch(m).backward(np.zeros((1, 2), np.float32))


def test_module_that_would_apply_dropout_is_refused():
    with pytest.raises(ValueError, match=r"module would apply dropout in training mode "
                                         r"\(encoder.layers.0.self_attn \(p=0.1\)\).*"
                                         r"module.eval\(\).*dropout=0.0"):
        from_torch(nn.Transformer(8, 2, 1, 1, 16))  # dropout=0.1, training mode
    with pytest.raises(ValueError, match=r"p=0.2.*module.eval\(\)"):
        from_torch(nn.MultiheadAttention(4, 2, dropout=0.2))
    from_torch(nn.MultiheadAttention(4, 2, dropout=0.2).eval())  # fine: no dropout applied
    from_torch(nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0))  # fine: p = 0


def test_unsupported_modules_and_options_are_refused():
    with pytest.raises(TypeError, match="module must be one of nn.Linear.*got Conv1d"):
        from_torch(nn.Conv1d(2, 2, 1))
    with pytest.raises(ValueError, match="add_bias_kv / add_zero_attn"):
        from_torch(nn.MultiheadAttention(4, 2, add_bias_kv=True))
    with pytest.raises(ValueError, match="max_norm"):
        from_torch(nn.Embedding(4, 2, max_norm=1.0))
    with pytest.raises(ValueError, match="activation must be relu or gelu"):
        from_torch(nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0, activation=torch.tanh))
    with pytest.raises(TypeError, match="float32 or all float64"):
        from_torch(nn.Linear(2, 2).half())


# ------------------------------------------------------------------ no loop over batch/heads/time

def _lines_executed(fn):
    """How many Python lines of transformer_lab run during fn(): NumPy's own loops are C code
    and do not count, so a Python loop over the batch, heads or positions would show up as a
    count that grows with them."""
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if "transformer_lab" not in frame.f_code.co_filename:
            return None
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count


def test_no_python_loop_over_batch_heads_or_positions(rng):
    def run(b, t, s, e, h):
        mha = build(nn.MultiheadAttention, np.float64, e, h, kdim=3, batch_first=True)
        dec = build(nn.TransformerDecoderLayer, np.float64, e, h, 2 * e, batch_first=True)
        twins = from_torch(mha), from_torch(dec)
        q, kv, mem = (rng.standard_normal((b, n, e)) for n in (t, s, s))
        kpm, am = A.padding_mask(np.full(b, s), s), A.causal_mask(t, s)

        def work():
            out, _ = twins[0].forward(q, kv[..., :3], kv, key_padding_mask=kpm, attn_mask=am)
            twins[0].backward(out)
            out = twins[1].forward(q, mem, tgt_mask=A.causal_mask(t), memory_key_padding_mask=kpm)
            twins[1].backward(out)

        work()
        return _lines_executed(work)

    small = run(b=1, t=1, s=2, e=4, h=1)
    assert small == run(b=5, t=7, s=3, e=12, h=6) == run(b=2, t=3, s=9, e=8, h=8)


# ------------------------------------------------------------------ the benchmark runs

def test_bench_quick_prints_a_table_with_ratios():
    res = subprocess.run([sys.executable, "-m", "transformer_lab.course.bench", "--quick",
                          "--threads", "1"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    rows = [line for line in res.stdout.splitlines() if "Transformer" in line and "x" in line]
    assert len(rows) >= 2, res.stdout
    assert "numpy/torch" in res.stdout
    # --threads sets NumPy's BLAS (threadpoolctl) and torch alike
    assert "(1 BLAS threads), torch" in res.stdout and "(1 threads)" in res.stdout


def test_median_times_alternate_the_order_and_skip_the_warmup():
    from transformer_lab.tools import median_times

    calls = []
    times = median_times({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                         repeats=3, warmup=2)
    assert calls == ["a", "b", "b", "a"] * 2 + ["a", "b"]  # warm-up rounds included
    assert set(times) == {"a", "b"} and all(t >= 0 for t in times.values())
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        median_times({"a": lambda: None}, repeats=0, warmup=0)


def test_bench_checks_the_twin_in_float64_before_timing(monkeypatch):
    """At this size float32 input gradients differ by more than 1e-4 on a ReLU kink; the check
    runs in float64, where the twin equals torch to 1e-10 -- and a broken twin is refused."""
    from transformer_lab.course import bench
    from transformer_lab.reference import interop

    assert bench.measure("transformer", 128, 64, 64, 8, 2, repeats=1, warmup=0)[0] > 0

    real = interop.TransformerEncoderLayerTwin.backward
    monkeypatch.setattr(interop.TransformerEncoderLayerTwin, "backward",
                        lambda self, dout: real(self, dout) * 1.001)
    with pytest.raises(AssertionError, match="gradient of input 0 differs from torch's"):
        bench.measure("encoder_layer", 16, 2, 4, 2, 1, repeats=1, warmup=0)


def test_bench_refuses_to_time_a_twin_that_differs_from_torch(rng):
    from transformer_lab.course.bench import check_twin

    out = rng.standard_normal((2, 3, 4)).astype(np.float32)
    grads = [rng.standard_normal((2, 3, 4)).astype(np.float32)]
    assert check_twin(out, out * (1 + 1e-12), grads, [grads[0].copy()]) < 1e-10
    with pytest.raises(AssertionError, match=r"the NumPy twin's gradient of input 0 differs "
                                             r"from torch's \(relative error 1.00e\+00 >= "
                                             r"1e-10\)"):
        check_twin(out, out, grads, [-grads[0]])
    with pytest.raises(AssertionError, match="twin's output differs"):
        check_twin(out, out[:, ::-1], grads, grads)
