"""transformer_lab.models.encoder_decoder: the whole model -- config checks, parameters in one dict,
the whole-model gradient check in float64, the loss over non-padding tokens, greedy decoding that
stops at EOS, attention maps, and clear errors for bad input."""

import json

import numpy as np
import pytest

from transformer_lab.gradient_check import check_gradients, check_parity
from transformer_lab.models.config import config_to_dict
from transformer_lab.models.encoder_decoder import CheckpointError, Transformer, TransformerConfig
from transformer_lab.models.inputs import IGNORE_INDEX, decoded_sequences, loss_labels

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


@pytest.mark.parametrize("field,value,error,message", [
    ("d_model", 6, ValueError, "d_model must be divisible by num_heads"),
    ("num_heads", 0, ValueError, "TransformerConfig.num_heads must be at least 1, got 0"),
    ("num_encoder_layers", 0, ValueError, "num_encoder_layers must be at least 1"),
    ("d_ff", 2.5, TypeError, "TransformerConfig.d_ff must be an integer, got 2.5"),
    ("activation", "tanh", ValueError, "activation must be one of"),
    ("positional", "rotary", ValueError, "positional must be one of"),
    ("eps", 0.0, ValueError, "TransformerConfig.eps must be positive, got 0.0"),
    ("eps", 1.5, ValueError, "eps must be a small positive number"),
    ("eps", float("nan"), ValueError, "TransformerConfig.eps must be finite"),
    ("eps", "1e-5", TypeError, "TransformerConfig.eps must be a number"),
    ("bos_id", 6, ValueError, "bos_id must be a target token id"),
    ("eos_id", 1, ValueError, "pad_id, bos_id and eos_id must be three different ids"),
    ("pad_id", -1, ValueError, "TransformerConfig.pad_id must be at least 0"),
    ("max_len", True, TypeError, "TransformerConfig.max_len must be an integer, got True"),
])
def test_config_rejects_bad_fields_naming_them(field, value, error, message):
    with pytest.raises(error, match=message):
        tiny(**{field: value, **({"num_heads": 4} if field == "d_model" else {})})


def test_config_stores_plain_python_numbers():
    cfg = tiny(d_model=np.int64(4), eps=np.float32(1e-5), bias=np.bool_(True), pad_id=np.int8(0))
    assert type(cfg.d_model) is int and type(cfg.eps) is float and cfg.bias is True
    assert cfg == tiny(eps=float(np.float32(1e-5)))
    json.dumps(config_to_dict(cfg))  # JSON-ready: would raise on NumPy scalars


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
    with pytest.raises(ValueError, match="seed must be at least 0, got -1"):
        Transformer(tiny(), seed=-1)
    with pytest.raises(TypeError, match="seed must be an integer, got 1.0"):
        Transformer(tiny(), seed=1.0)


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


def test_set_params_refuses_nan_and_non_numbers_and_copies_nothing():
    m = Transformer(tiny())
    before = {k: p.copy() for k, p in m.params.items()}
    good = np.ones_like(m.params["out_proj.W"])
    with pytest.raises(ValueError, match=r"new\['out_proj.b'\] contains NaN or infinity"):
        m.set_params({"out_proj.W": good, "out_proj.b": np.full(6, np.nan)})
    with pytest.raises(ValueError, match="contains NaN or infinity"):
        m.set_params({"out_proj.b": np.array([0, 0, np.inf, 0, 0, 0])})
    with pytest.raises(TypeError, match=r"new\['out_proj.b'\] must hold real numbers, got "
                                        r"dtype <U1"):
        m.set_params({"out_proj.b": np.array(list("abcdef"))})
    with pytest.raises(TypeError, match="must hold real numbers, got dtype bool"):
        m.set_params({"out_proj.b": np.ones(6, bool)})
    with pytest.raises(KeyError, match="unknown parameter 'out_proj.c'"):
        m.set_params({"out_proj.W": good, "out_proj.c": np.zeros(6)})
    assert all(np.array_equal(before[k], m.params[k]) for k in before)  # nothing copied
    m.set_params({"out_proj.W": good.astype(np.float64)})  # values are cast to the dtype
    assert m.params["out_proj.W"].dtype == np.float32 and np.all(m.params["out_proj.W"] == 1)


def test_astype_keeps_the_subclass():
    class Mine(Transformer):
        pass

    m = Mine(tiny())
    assert type(m.astype(np.float64)) is Mine and type(m.copy()) is Mine


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
    ("hello", TGT, TypeError, "src must be an array of integer token ids, got dtype <U5"),
    ([[3, 4, 5], [4, 3]], TGT, ValueError, r"src must be a rectangular array of token ids "
                                           r"\(rows of one length\), got rows of different "
                                           r"lengths \(pad them"),
    (SRC, [[BOS, 3, EOS], [BOS, 5, 3, EOS]], ValueError, "tgt must be a rectangular"),
    (SRC[:, :0], TGT, ValueError, r"src must hold at least one sequence of at least 1 "
                                  r"token, got shape \(3, 0\)"),
])
def test_loss_rejects_bad_input_naming_the_argument(src, tgt, error, message):
    with pytest.raises(error, match=message):
        Transformer(tiny()).loss(src, tgt)


def test_a_rectangular_list_is_accepted_like_an_array():
    m = Transformer(tiny())
    assert m.loss(SRC.tolist(), TGT.tolist(), compute_grads=False)[0] == \
        m.loss(SRC, TGT, compute_grads=False)[0]


def test_loss_mask_and_loss_flags_are_checked():
    m = Transformer(tiny())
    with pytest.raises(ValueError, match=r"tgt must have 2 dimensions \(batch, length\), got "
                                         r"shape \(6,\)"):
        m.loss_mask(TGT[0])
    with pytest.raises(ValueError, match="tgt must start every sequence with bos_id=1"):
        m.loss_mask(TGT[:, 1:])
    for flag in ("no", 0, None):
        with pytest.raises(TypeError, match=f"compute_grads must be True or False, got "
                                            f"{flag!r}"):
            m.loss(SRC, TGT, compute_grads=flag)


def test_backward_checks_dlogits_against_the_forward():
    m = Transformer(tiny())
    logits, cache = m.forward(SRC, TGT[:, :-1])
    assert logits.shape == (3, 5, 6) and logits.dtype == np.float32
    with pytest.raises(TypeError, match=r"dlogits must have the dtype of the logits of the "
                                        r"forward pass \(float32\), got float64"):
        m.backward(np.ones((3, 5, 6)), cache)
    with pytest.raises(ValueError, match=r"dlogits must have shape \(3, 5, 6\) \(the logits "
                                         r"of the forward pass\), got \(3, 5, 7\)"):
        m.backward(np.ones((3, 5, 7), np.float32), cache)
    with pytest.raises(TypeError, match="dlogits must be a NumPy array, got list"):
        m.backward([[[0.0]]], cache)
    assert set(m.backward(np.ones((3, 5, 6), np.float32), cache)) == set(m.params)


def test_shared_label_and_decoding_helpers():
    cfg = tiny()
    tgt = np.array([[BOS, 3, EOS, 4, PAD], [BOS, 5, 3, 4, EOS]])
    assert np.array_equal(loss_labels(cfg, tgt), [[3, EOS, IGNORE_INDEX, IGNORE_INDEX],
                                                  [5, 3, 4, EOS]])
    with pytest.raises(ValueError, match="tgt has no token to predict"):
        loss_labels(cfg, np.array([[BOS, PAD, PAD]]))
    out = np.array([[BOS, 3, EOS, PAD], [BOS, 4, 4, 4], [BOS, EOS, PAD, PAD]])
    seqs = decoded_sequences(out, EOS, padded=False)
    assert [s.tolist() for s in seqs] == [[3, EOS], [4, 4, 4], [EOS]]
    seqs[0][0] = 9  # copies: the buffer is not changed
    assert out[0, 1] == 3 and decoded_sequences(out, EOS, padded=True) is out


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
    with pytest.raises(ValueError, match="max_len must be at least 1, got 0"):
        m.greedy_decode(SRC, max_len=0)
    with pytest.raises(TypeError, match="max_len must be an integer, got 2.0"):
        m.greedy_decode(SRC, max_len=2.0)
    with pytest.raises(TypeError, match="src_key_padding_mask must be a NumPy bool array"):
        m.forward(SRC, TGT[:, :-1], src_key_padding_mask=[[False] * 5] * 3)
    with pytest.raises(ValueError, match="call the forward function first"):
        m.backward(np.zeros((3, 5, 6), np.float32), None)
    # no positional table, no length limit
    Transformer(tiny(positional="none")).forward(np.ones((1, 20), int), np.ones((1, 12), int))


# ----------------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("change", [
    dict(norm_first=False), dict(activation="gelu"), dict(positional="none"),
    dict(scale_embeddings=False), dict(eps=1e-6), dict(eos_id=3), dict(max_len=7),
])
def test_load_params_refuses_a_config_that_computes_another_function(tmp_path, change):
    """Same names, shapes and dtypes, but another function: refused, nothing copied."""
    saved = randomized(Transformer(tiny()))
    path = saved.save(tmp_path / "model.npz")
    other = Transformer(tiny(**change))
    assert {k: p.shape for k, p in other.params.items()} == \
        {k: p.shape for k, p in saved.params.items()}
    before = {k: p.copy() for k, p in other.params.items()}
    field, value = next(iter(change.items()))
    stored = getattr(saved.config, field)
    with pytest.raises(CheckpointError, match=rf"the checkpoint's config differs in "
                                              rf"{field}={stored!r} \(model: {value!r}\); its "
                                              rf"parameters have the right names and shapes but "
                                              rf"would compute a different function"):
        other.load_params(path)
    assert all(np.array_equal(before[k], other.params[k]) for k in before)
    loaded = Transformer.load(path)  # the way to get it: the stored config
    assert loaded.config == saved.config
    assert loaded.loss(SRC, TGT, compute_grads=False) == saved.loss(SRC, TGT, compute_grads=False)


def test_load_params_accepts_its_own_config(tmp_path):
    saved = randomized(Transformer(tiny(norm_first=False, activation="gelu")))
    path = saved.save(tmp_path / "model.npz", metadata={"step": 3})
    fresh = Transformer(tiny(norm_first=False, activation="gelu"), seed=5)
    assert fresh.load_params(path) == {"step": 3}
    assert all(np.array_equal(fresh.params[k], saved.params[k]) for k in saved.params)


def _write_checkpoint(path, header, arrays):
    np.savez(path, __header__=np.array(json.dumps(header)),
             **{f"params/{k}": a for k, a in arrays.items()})
    return path


@pytest.mark.parametrize("edit,message", [
    (lambda h, a: h.update(names=5), r"damaged header: 'names' must be a list, got 5"),
    (lambda h, a: h.update(config="tiny"), r"damaged header: 'config' must be a dict"),
    (lambda h, a: h.pop("metadata"), r"damaged header: 'metadata' must be a dict, got None"),
    (lambda h, a: h.update(names=h["names"][:-1]), r"damaged checkpoint: the header lists the "
                                                   r"parameters"),
    (lambda h, a: h.update(format=2), r"unknown checkpoint format 2"),
    (lambda h, a: h["config"].update(d_model="four"), r"the stored configuration is not valid"),
    (lambda h, a: h["config"].update(depth=3), r"the stored configuration is not valid"),
    (lambda h, a: a["out_proj.b"].__setitem__(0, np.nan), r"parameter 'out_proj.b' contains "
                                                          r"NaN or infinity"),
])
def test_damaged_checkpoints_give_clear_errors(tmp_path, edit, message):
    model = Transformer(tiny())
    header = {"format": 1, "config": config_to_dict(model.config), "names": list(model.params),
              "metadata": {}}
    arrays = {k: p.copy() for k, p in model.params.items()}
    edit(header, arrays)
    path = _write_checkpoint(tmp_path / "bad.npz", header, arrays)
    with pytest.raises(CheckpointError, match=message):
        Transformer.load(path)
    with pytest.raises(CheckpointError, match=message):
        Transformer(tiny()).load_params(path)


def test_files_that_are_not_checkpoints(tmp_path):
    np.save(tmp_path / "array.npy", np.zeros(3))
    with pytest.raises(CheckpointError, match=r"array.npy is not a transformer_lab checkpoint: "
                                              r"it holds a single array \(a .npy file\)"):
        Transformer.load(tmp_path / "array.npy")
    (tmp_path / "text.npz").write_text("not a zip file")
    with pytest.raises(CheckpointError, match="is not a transformer_lab checkpoint"):
        Transformer.load(tmp_path / "text.npz")
    np.savez(tmp_path / "header.npz", __header__=np.array("{not json"))
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        Transformer.load(tmp_path / "header.npz")
