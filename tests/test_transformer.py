"""transformer_lab.transformer: the whole model -- config checks, parameters in one dict, the
whole-model gradient check in float64, the loss over non-padding tokens, greedy decoding that
stops at EOS, attention maps, and clear errors for bad input."""

import dataclasses

import numpy as np
import pytest

from transformer_lab.gradient_check import check_gradients, rel_error
from transformer_lab.transformer import Transformer, TransformerConfig, check_parity

PAD, BOS, EOS = 0, 1, 2


def tiny(**kw):
    base = dict(src_vocab_size=7, tgt_vocab_size=6, d_model=4, num_heads=2,
                num_encoder_layers=1, num_decoder_layers=2, d_ff=6, max_len=8)
    base.update(kw)
    return TransformerConfig(**base)


def randomized(model, seed=1, scale=0.3):
    """Perturb every parameter (so no bias is zero and no gain is one), in place."""
    rng = np.random.default_rng(seed)
    for p in model.params.values():
        p += (rng.standard_normal(p.shape) * scale).astype(p.dtype)
    return model


# a padded batch: sources of lengths 4, 2, 5; targets BOS ... EOS then padding
SRC = np.array([[3, 4, 5, 6, PAD], [4, 3, PAD, PAD, PAD], [5, 3, 3, 6, 4]])
TGT = np.array([[BOS, 3, 4, EOS, PAD, PAD], [BOS, 5, EOS, PAD, PAD, PAD], [BOS, 4, 5, 3, 5, EOS]])


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize("field,value,message", [
    ("d_model", 6, "d_model must be divisible by num_heads"),
    ("num_heads", 0, "num_heads must be an integer >= 1"),
    ("num_encoder_layers", 0, "num_encoder_layers must be an integer >= 1"),
    ("d_ff", 2.5, "d_ff must be an integer"),
    ("activation", "tanh", "activation must be one of"),
    ("positional", "rotary", "positional must be one of"),
    ("eps", 0.0, "eps must be a small positive number"),
    ("bos_id", 6, "bos_id must be a target token id"),
    ("eos_id", 1, "pad_id, bos_id and eos_id must be three different ids"),
    ("pad_id", -1, "pad_id must be an integer >= 0"),
    ("max_len", True, "max_len must be an integer"),
])
def test_config_rejects_bad_fields_naming_them(field, value, message):
    with pytest.raises(ValueError, match=message):
        tiny(**{field: value, **({"num_heads": 4} if field == "d_model" else {})})


def test_config_types():
    with pytest.raises(TypeError, match="dtype must be np.float32 or np.float64"):
        tiny(dtype=np.int32)
    with pytest.raises(TypeError, match="norm_first must be True or False"):
        tiny(norm_first="yes")
    with pytest.raises(ValueError, match="pad_id must be a source token id"):
        tiny(src_vocab_size=1, pad_id=3, bos_id=1, eos_id=2)
    assert tiny(dtype="float64").dtype is np.float64
    with pytest.raises(TypeError, match="config must be a TransformerConfig"):
        Transformer({"d_model": 4})


# ----------------------------------------------------------------------------- parameters


def test_params_flat_dict_names_shapes_dtypes_and_seed():
    m = Transformer(tiny())
    p = m.params
    assert list(p)[:2] == ["src_embed.W", "tgt_embed.W"] and list(p)[-2:] == ["out_proj.W",
                                                                               "out_proj.b"]
    assert p["encoder.layers.0.self_attn.W_qkv"].shape == (4, 12)
    assert p["decoder.layers.1.cross_attn.W_k"].shape == (4, 4)
    assert p["encoder.norm.gamma"].shape == (4,) and p["out_proj.W"].shape == (4, 6)
    assert all(a.dtype == np.float32 for a in p.values())  # float32 by default
    assert m.num_parameters() == sum(a.size for a in p.values())
    # deterministic from the seed; the float64 model starts from the same values
    again, other = Transformer(tiny(), seed=0), Transformer(tiny(), seed=1)
    assert all(np.array_equal(p[k], again.params[k]) for k in p)
    assert not np.array_equal(p["src_embed.W"], other.params["src_embed.W"])
    m64 = Transformer(tiny(dtype=np.float64))
    assert all(a.dtype == np.float64 for a in m64.params.values())
    assert all(np.allclose(p[k], m64.params[k], atol=1e-7) for k in p)
    # learned positions add one table per side; bias=False removes every bias and beta
    assert {"src_pos.W", "tgt_pos.W"} <= set(Transformer(tiny(positional="learned")).params)
    nob = Transformer(tiny(bias=False)).params
    assert not [k for k in nob if k.split(".")[-1].startswith(("b", "beta"))]


def test_updates_in_place_or_by_assignment_reach_the_model():
    m = Transformer(tiny())
    before, _ = m.forward(SRC, TGT[:, :-1])
    m.params["encoder.layers.0.ff.W1"] *= 2.0  # in place, as an optimiser does
    after, _ = m.forward(SRC, TGT[:, :-1])
    assert not np.allclose(before, after)
    m.params["out_proj.W"] = np.zeros_like(m.params["out_proj.W"])  # a new array
    m.params["out_proj.b"][...] = 0
    assert np.all(m.forward(SRC, TGT[:, :-1])[0] == 0)
    m.set_params({"out_proj.b": np.arange(6, dtype=np.float32)})
    assert np.array_equal(m.forward(SRC, TGT[:, :-1])[0][0, 0], np.arange(6))
    with pytest.raises(ValueError, match="must have shape"):
        m.set_params({"out_proj.b": np.zeros(5)})
    m.params["out_proj.b"] = np.zeros(6)  # wrong dtype
    with pytest.raises(ValueError, match=r"model.params\['out_proj.b'\] must be a float32"):
        m.forward(SRC, TGT[:, :-1])


def test_astype_and_copy_are_independent():
    m = Transformer(tiny())
    m64, twin = m.astype(np.float64), m.copy()
    assert m64.config.dtype is np.float64 and m64.params["src_embed.W"].dtype == np.float64
    twin.params["src_embed.W"] += 1
    assert not np.array_equal(twin.params["src_embed.W"], m.params["src_embed.W"])
    l32, _ = m.loss(SRC, TGT, compute_grads=False)
    l64, _ = m64.loss(SRC, TGT, compute_grads=False)
    assert abs(l32 - l64) < 1e-5


# ----------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("kw", [
    dict(norm_first=True, activation="gelu"),
    dict(norm_first=False, activation="gelu_tanh", positional="learned"),
    dict(norm_first=True, activation="gelu", bias=False, scale_embeddings=False,
         positional="none"),
])
def test_whole_model_gradient_check_float64(kw):
    m = randomized(Transformer(tiny(dtype=np.float64, **kw)))
    loss, grads = m.loss(SRC, TGT)
    assert set(grads) == set(m.params) and list(grads) == list(m.params)
    assert all(grads[k].shape == m.params[k].shape and grads[k].dtype == np.float64
               for k in grads)
    errors = check_gradients(lambda: m.loss(SRC, TGT, compute_grads=False)[0], m.params, grads,
                             tol=1e-6, verbose=False)
    assert max(errors.values()) < 1e-6


def test_float32_gradients_close_to_float64():
    m = randomized(Transformer(tiny(dtype=np.float64)))
    m32 = m.astype(np.float32)
    l64, g64 = m.loss(SRC, TGT)
    l32, g32 = m32.loss(SRC, TGT)
    assert isinstance(l32, float) and abs(l32 - l64) < 1e-5
    assert all(g32[k].dtype == np.float32 for k in g32)
    check_parity(g32, g64, tol=1e-4, verbose=False)


# ----------------------------------------------------------------------------- loss


def test_loss_is_the_mean_over_tokens_up_to_eos():
    m = randomized(Transformer(tiny(dtype=np.float64)))
    logits, _ = m.forward(SRC, TGT[:, :-1])
    labels = TGT[:, 1:]
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    keep = np.array([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], bool)
    assert np.array_equal(m.loss_mask(TGT), keep)
    expected = -np.take_along_axis(logp, labels[..., None], -1)[..., 0][keep].mean()
    assert abs(m.loss(SRC, TGT)[0] - expected) < 1e-12


def test_tokens_after_eos_and_padding_change_nothing():
    m = randomized(Transformer(tiny(dtype=np.float64)))
    loss, grads = m.loss(SRC, TGT)
    tgt = TGT.copy()
    tgt[0, 4:] = [3, 5]  # after EOS: real tokens instead of padding
    tgt[1, 3] = EOS  # a second EOS
    src = SRC.copy()
    loss2, grads2 = m.loss(src, tgt)
    assert loss2 == pytest.approx(loss, abs=1e-14)
    check_parity(grads2, grads, tol=1e-12, verbose=False)
    # padding in the source is masked: what a padded position holds is irrelevant
    src[1, 2:] = PAD
    assert m.loss(src, tgt, compute_grads=False)[0] == pytest.approx(loss, abs=1e-14)
    # ...but a real source token matters
    src[1, 2] = 5
    assert abs(m.loss(src, tgt, compute_grads=False)[0] - loss) > 1e-6
    # and one more padding column changes nothing at all
    wide_src = np.pad(SRC, ((0, 0), (0, 2)))
    wide_tgt = np.pad(TGT, ((0, 0), (0, 1)))
    assert m.loss(wide_src, wide_tgt, compute_grads=False)[0] == pytest.approx(loss, abs=1e-12)


# ----------------------------------------------------------------------------- decoding


def forced(token, **kw):
    """A model whose output is always ``token``: zero output weights, a large output bias."""
    m = Transformer(tiny(**kw))
    m.params["out_proj.W"][...] = 0
    m.params["out_proj.b"][...] = 0
    m.params["out_proj.b"][token] = 10
    return m


def test_greedy_decode_stops_at_eos():
    out = forced(EOS).greedy_decode(SRC)
    assert len(out) == 3 and all(np.array_equal(o, [EOS]) for o in out)
    assert np.array_equal(forced(EOS).greedy_decode(SRC, padded=True), [[BOS, EOS]] * 3)
    # never EOS: every sequence runs to max_len (default: config.max_len)
    out = forced(4).greedy_decode(SRC)
    assert all(np.array_equal(o, [4] * 8) for o in out)
    assert all(len(o) == 3 for o in forced(4).greedy_decode(SRC, max_len=3))


def test_greedy_decode_batch_equals_one_by_one_and_pads_after_eos():
    m = randomized(Transformer(tiny(dtype=np.float64)), seed=0, scale=0.8)
    m.params["out_proj.b"][EOS] += 2.0  # EOS likely, but not at the same step for everyone
    src = np.array([[3, 4, 5, 6, 5], [4, 3, PAD, PAD, PAD], [5, 3, 3, PAD, PAD],
                    [6, 6, 6, 6, PAD]])
    batch = m.greedy_decode(src)
    padded = m.greedy_decode(src, padded=True)
    lengths = [len(o) for o in batch]
    assert len(set(lengths)) > 1, "the test wants sequences that stop at different steps"
    for i, out in enumerate(batch):
        alone = m.greedy_decode(src[i:i + 1][:, src[i] != PAD])[0]  # no padding at all
        assert np.array_equal(out, alone)
        assert EOS not in out[:-1]
        assert padded[i, 0] == BOS and np.array_equal(padded[i, 1:1 + len(out)], out)
        assert np.all(padded[i, 1 + len(out):] == PAD)


# ----------------------------------------------------------------------------- attention maps


def test_attention_maps_per_layer_and_head():
    m = randomized(Transformer(tiny(dtype=np.float64)))
    maps = m.attention_maps(SRC, TGT[:, :-1])
    assert list(maps) == ["encoder.layers.0.self_attn", "decoder.layers.0.self_attn",
                          "decoder.layers.0.cross_attn", "decoder.layers.1.self_attn",
                          "decoder.layers.1.cross_attn"]
    assert maps["encoder.layers.0.self_attn"].shape == (3, 2, 5, 5)
    assert maps["decoder.layers.1.cross_attn"].shape == (3, 2, 5, 5)
    for w in maps.values():
        assert np.allclose(w.sum(-1), 1)
    dec = maps["decoder.layers.0.self_attn"]
    assert np.all(np.triu(np.ones((5, 5)), 1) * dec == 0)  # causal
    assert np.all(maps["decoder.layers.1.cross_attn"][1, :, :, 2:] == 0)  # source padding


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("src,tgt,error,message", [
    (SRC + 10, TGT, ValueError, "src must be token ids below the vocabulary size 7, found 16"),
    (SRC, np.where(TGT == 3, -1, TGT), ValueError, "tgt must be non-negative token ids"),
    (SRC.astype(float), TGT, TypeError, "src must be an array of integer token ids"),
    (SRC, TGT > 0, TypeError, "tgt must be an array of integer token ids"),
    (SRC[:2], TGT, ValueError, "src and tgt must have the same batch size, got 2 and 3"),
    (np.ones((3, 9), int), TGT, ValueError, "src has 9 positions but the positional"),
    (SRC, np.pad(TGT, ((0, 0), (0, 4))), ValueError, "tgt has 10 positions: the decoder reads 9"),
    (SRC, TGT[:, 1:], ValueError, "tgt must start every sequence with bos_id=1"),
    (SRC[0], TGT, ValueError, r"src must have 2 dimensions \(batch, length\)"),
    (SRC, TGT[:, :1], ValueError, "tgt must have at least 2 columns"),
    (SRC, np.array([[BOS, PAD]] * 3), ValueError, "tgt has no token to predict"),
    ("hello", TGT, TypeError, "src must be a NumPy array of token ids"),
])
def test_loss_rejects_bad_input_naming_the_argument(src, tgt, error, message):
    with pytest.raises(error, match=message):
        Transformer(tiny()).loss(src, tgt)


def test_forward_and_decode_reject_bad_input():
    m = Transformer(tiny())
    with pytest.raises(ValueError, match="tgt_in must be token ids below the vocabulary size 6"):
        m.forward(SRC, TGT[:, :-1] + 6)
    with pytest.raises(ValueError, match="src and tgt_in must have the same batch size"):
        m.forward(SRC, TGT[:2, :-1])
    with pytest.raises(ValueError, match="src_key_padding_mask must have shape"):
        m.forward(SRC, TGT[:, :-1], src_key_padding_mask=np.zeros((3, 4), bool))
    with pytest.raises(TypeError, match="src_key_padding_mask must be a bool array"):
        m.forward(SRC, TGT[:, :-1], src_key_padding_mask=np.zeros((3, 5)))
    with pytest.raises(ValueError, match="max_len must be at most TransformerConfig.max_len=8"):
        m.greedy_decode(SRC, max_len=9)
    with pytest.raises(ValueError, match="max_len must be a positive integer"):
        m.greedy_decode(SRC, max_len=0)
    with pytest.raises(ValueError, match="call the forward function first"):
        m.backward(np.zeros((3, 5, 6), np.float32), None)
    # no positional table, no length limit
    Transformer(tiny(positional="none")).forward(np.ones((1, 20), int), np.ones((1, 12), int))


def test_check_parity_reports_and_raises(capsys):
    a = {"w": np.ones(3), "z": np.zeros(2)}
    b = {"w": np.ones(3) * (1 + 1e-12), "z": np.full(2, 1e-17)}
    errors = check_parity(a, b, tol=1e-10)
    out = capsys.readouterr().out
    assert "ok (zero gradient)" in out and errors["w"] < 1e-10
    with pytest.raises(AssertionError, match=r"1 of 2 tensors differ by more than tol=1e-10: w"):
        check_parity(a, {**b, "w": np.ones(3) * 1.01}, tol=1e-10, verbose=False)
    with pytest.raises(ValueError, match="same names"):
        check_parity(a, {"w": a["w"]}, tol=1e-10)
    assert rel_error(a["w"], b["w"]) < 1e-10
    assert dataclasses.is_dataclass(tiny())
