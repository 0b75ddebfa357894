"""transformer_lab.reference.torch_transformer: the course model from scratch in PyTorch and around
nn.Transformer, asserted equal to the NumPy model -- logits, loss and every parameter gradient
(float64 1e-10, float32 1e-5) -- for both norm orders, with and without biases, relu/gelu, padded
batches."""

import numpy as np
import pytest
import torch
import torch.nn as nn

from transformer_lab.gradient_check import check_parity, rel_error
from transformer_lab.models.encoder_decoder import Transformer, TransformerConfig
from transformer_lab.reference.torch_transformer import (
    MultiHeadAttention,
    ReferenceTransformer,
    TorchTransformer,
    _Seq2Seq,
)

PAD, BOS, EOS = 0, 1, 2
SRC = np.array([[3, 4, 5, 6, PAD, PAD], [4, 3, PAD, PAD, PAD, PAD], [5, 3, 3, 6, 4, 8]])
TGT = np.array([[BOS, 3, 4, EOS, PAD], [BOS, 5, EOS, PAD, PAD], [BOS, 4, 5, 3, EOS]])


def config(**kw):
    base = dict(src_vocab_size=9, tgt_vocab_size=7, d_model=12, num_heads=3,
                num_encoder_layers=2, num_decoder_layers=2, d_ff=10, max_len=8,
                dtype=np.float64)
    base.update(kw)
    return TransformerConfig(**base)


def numpy_model(cfg, seed=0):
    m = Transformer(cfg, seed=seed)
    rng = np.random.default_rng(seed + 1)
    for p in m.params.values():  # no zero biases, no unit gains: every parameter matters
        p += (rng.standard_normal(p.shape) * 0.3).astype(p.dtype)
    return m


def run_torch(model_cls, m):
    twin = model_cls.from_numpy(m)
    loss = twin.loss(SRC, TGT)
    loss.backward()
    logits = twin(SRC, TGT[:, :-1]).detach().numpy()
    return twin, loss.item(), logits, twin.numpy_grads()


CASES = [
    dict(norm_first=True, bias=True, activation="relu"),
    dict(norm_first=False, bias=True, activation="relu"),
    dict(norm_first=True, bias=False, activation="gelu"),
    dict(norm_first=False, bias=False, activation="gelu", positional="learned"),
    dict(norm_first=True, bias=True, activation="gelu_tanh", scale_embeddings=False),
]


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: "-".join(f"{v}" for v in kw.values()))
@pytest.mark.parametrize("model_cls", [TorchTransformer, ReferenceTransformer])
def test_parity_float64(model_cls, kw):
    m = numpy_model(config(**kw))
    loss, grads = m.loss(SRC, TGT)
    logits, _ = m.forward(SRC, TGT[:, :-1])
    _, tloss, tlogits, tgrads = run_torch(model_cls, m)
    assert abs(loss - tloss) <= 1e-10 * abs(loss)
    assert rel_error(logits, tlogits) < 1e-10
    assert list(tgrads) == list(grads)  # the same names, in the same order
    check_parity(grads, tgrads, tol=1e-10, verbose=False)


@pytest.mark.parametrize("model_cls", [TorchTransformer, ReferenceTransformer])
def test_parity_float32(model_cls):
    m = numpy_model(config(dtype=np.float32, norm_first=False))
    loss, grads = m.loss(SRC, TGT)
    logits, _ = m.forward(SRC, TGT[:, :-1])
    assert logits.dtype == np.float32
    twin, tloss, tlogits, tgrads = run_torch(model_cls, m)
    assert next(twin.parameters()).dtype == torch.float32
    assert abs(loss - tloss) <= 1e-5 * abs(loss)
    assert rel_error(logits, tlogits) < 1e-5
    check_parity(grads, tgrads, tol=1e-5, verbose=False)


def test_same_seed_same_start_and_weights_round_trip():
    cfg = config(positional="learned")
    m = Transformer(cfg, seed=3)
    twin = TorchTransformer(cfg, seed=3)
    assert dict(twin.named_parameters()).keys() == m.params.keys()
    assert all(np.array_equal(p, m.params[k]) for k, p in twin.numpy_params().items())
    assert twin.num_parameters() == m.num_parameters()
    # export back, in place
    with torch.no_grad():
        twin.out_proj.W.mul_(2.0)
    twin.export_to(m)
    assert np.array_equal(m.params["out_proj.W"], 2 * Transformer(cfg, seed=3).params["out_proj.W"])
    ref = ReferenceTransformer(cfg, seed=3)
    assert all(np.array_equal(p, Transformer(cfg, seed=3).params[k])
               for k, p in ref.numpy_params().items())


def test_from_scratch_means_no_torch_layers():
    twin = TorchTransformer(config())
    forbidden = (nn.MultiheadAttention, nn.Transformer, nn.TransformerEncoder,
                 nn.TransformerDecoder, nn.TransformerEncoderLayer, nn.TransformerDecoderLayer,
                 nn.LayerNorm, nn.Linear)
    assert not [m for m in twin.modules() if isinstance(m, forbidden)]
    assert sum(isinstance(m, MultiHeadAttention) for m in twin.modules()) == 2 + 2 * 2


def test_the_reference_core_is_a_plain_nn_transformer_holding_the_numpy_weights():
    cfg = config(norm_first=True)
    m = numpy_model(cfg)
    ref = ReferenceTransformer.from_numpy(m)
    core = ref.transformer
    assert type(core) is nn.Transformer
    rng = np.random.default_rng(0)
    src, tgt = rng.standard_normal((2, 5, 12)), rng.standard_normal((2, 4, 12))
    causal = torch.ones(4, 4, dtype=torch.bool).triu(1)
    out = core(torch.from_numpy(src), torch.from_numpy(tgt), tgt_mask=causal)
    out.sum().backward()
    from transformer_lab import blocks as B
    from transformer_lab.attention import causal_mask
    from transformer_lab.models.encoder_decoder import nest_params
    enc, dec = nest_params(m.params)
    mem, _ = B.encoder_forward(src, enc, 3, norm_first=True)
    ours, _ = B.decoder_forward(tgt, mem, dec, 3, tgt_mask=causal_mask(4), norm_first=True)
    assert rel_error(ours, out.detach().numpy()) < 1e-10
    grads = ref.numpy_grads()  # the core's, under the NumPy names (the rest did not run: zeros)
    core_names = {k for k in m.params if k.startswith(("encoder.", "decoder."))}
    assert not any(np.any(grads[k]) for k in set(m.params) - core_names)
    assert all(np.abs(grads[k]).max() > 1e-6 for k in core_names
               if not k.endswith("cross_attn.b_k"))  # zero in exact arithmetic


def test_greedy_decode_and_attention_maps_match_numpy():
    m = numpy_model(config())
    m.params["out_proj.b"][EOS] += 1.5
    twin = TorchTransformer.from_numpy(m)
    ours, theirs = m.greedy_decode(SRC), twin.greedy_decode(SRC)
    assert all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))
    assert np.array_equal(m.greedy_decode(SRC, padded=True), twin.greedy_decode(SRC, padded=True))
    maps, tmaps = m.attention_maps(SRC, TGT[:, :-1]), twin.attention_maps(SRC, TGT[:, :-1])
    assert list(maps) == list(tmaps)
    for k in maps:
        assert rel_error(maps[k], tmaps[k]) < 1e-10


def test_an_all_padding_source_gives_zeros_not_nan():
    m = numpy_model(config())
    src = SRC.copy()
    src[1] = PAD  # nothing to attend to in the encoder and in the cross-attention
    loss, grads = m.loss(src, TGT)
    twin = TorchTransformer.from_numpy(m)
    tloss = twin.loss(src, TGT)
    tloss.backward()
    assert np.isfinite(loss) and abs(loss - tloss.item()) < 1e-10
    check_parity(grads, twin.numpy_grads(), tol=1e-10, verbose=False)


def test_bad_input():
    twin = TorchTransformer(config())
    with pytest.raises(ValueError, match="src must be token ids below the vocabulary size 9"):
        twin(SRC + 9, TGT[:, :-1])
    with pytest.raises(ValueError, match="tgt must start every sequence with bos_id=1"):
        twin.loss(SRC, TGT[:, 1:])
    with pytest.raises(ValueError, match="tgt must have at least 2 columns"):
        twin.loss(SRC, TGT[:, :1])
    with pytest.raises(TypeError, match="model must be a transformer_lab.models.encoder_"):
        TorchTransformer.from_numpy(twin)
    with pytest.raises(ValueError, match="missing"):
        twin.load_numpy_params({"src_embed.W": np.zeros((9, 12))})


# The three models check their input with the same functions: the same errors, word for word.
BAD_FORWARD = [
    ((SRC[:2], TGT[:1, :-1]), {}, ValueError,
     "src and tgt_in must have the same batch size, got 2 and 1"),
    ((np.full((3, 9), 3), TGT[:, :-1]), {}, ValueError,
     "src has 9 positions but the positional encoding covers max_len=8"),
    ((SRC, np.full((3, 9), 3)), {}, ValueError,
     "tgt_in has 9 positions but the positional encoding covers max_len=8"),
    ((SRC, TGT[:, :-1]), dict(src_key_padding_mask=np.zeros((3, 5), bool)), ValueError,
     r"src_key_padding_mask must have shape \(3, 6\) \(the shape of the token ids\), got "
     r"\(3, 5\)"),
    ((SRC, TGT[:, :-1]), dict(tgt_key_padding_mask=np.zeros((3, 4))), TypeError,
     "tgt_key_padding_mask must be a bool array"),
    ((SRC[:, :0], TGT[:, :-1]), {}, ValueError, "src must hold at least one sequence"),
    ((np.zeros((0, 3), int), TGT[:0, :-1]), {}, ValueError, "src must hold at least one"),
    ((SRC[0], TGT[:, :-1]), {}, ValueError, r"src must have 2 dimensions \(batch, length\)"),
    (([[3, 4], [5]], TGT[:, :-1]), {}, ValueError, "src must be a rectangular"),
]


def _models():
    m = numpy_model(config())
    return {"numpy": m, "torch": TorchTransformer.from_numpy(m),
            "nn.Transformer": ReferenceTransformer.from_numpy(m)}


@pytest.mark.parametrize("args,kwargs,error,message", BAD_FORWARD)
def test_forward_refuses_bad_input_like_the_numpy_model(args, kwargs, error, message):
    for model in _models().values():
        with pytest.raises(error, match=message):
            model.forward(*args, **kwargs)


def test_forward_takes_tensors_and_masks_like_the_numpy_model():
    models = _models()
    kpm = SRC == PAD
    kpm[2, -1] = True  # a padding mask other than the default
    logits, _ = models["numpy"].forward(SRC, TGT[:, :-1], src_key_padding_mask=kpm)
    for name in ("torch", "nn.Transformer"):
        theirs = models[name](torch.from_numpy(SRC), torch.from_numpy(TGT[:, :-1]),
                              src_key_padding_mask=torch.from_numpy(kpm))
        assert rel_error(logits, theirs) < 1e-10, name
    with pytest.raises(TypeError, match="src_key_padding_mask must be a bool array"):
        models["torch"](SRC, TGT[:, :-1], src_key_padding_mask=torch.zeros(3, 6))


def test_greedy_decode_and_loss_refuse_bad_input_like_the_numpy_model():
    for model in _models().values():
        with pytest.raises(ValueError, match="max_len must be at most TransformerConfig.max_len"
                                             "=8"):
            model.greedy_decode(SRC, max_len=20)
        with pytest.raises(ValueError, match="max_len must be at least 1"):
            model.greedy_decode(SRC, max_len=0)
        with pytest.raises(ValueError, match="src must hold at least one sequence"):
            model.greedy_decode(SRC[:0])
        with pytest.raises(ValueError, match="src and tgt must have the same batch size, got "
                                             "2 and 3"):
            model.loss(SRC[:2], TGT)
        with pytest.raises(ValueError, match="tgt has no token to predict"):
            model.loss(SRC, np.array([[BOS, PAD]] * 3))
        with pytest.raises(ValueError, match="tgt has 10 positions: the decoder reads 9"):
            model.loss(SRC, np.pad(TGT, ((0, 0), (0, 5))))


@pytest.mark.parametrize("model_cls", [TorchTransformer, ReferenceTransformer])
def test_load_numpy_params_checks_every_value_before_copying(model_cls):
    m = numpy_model(config())
    twin = model_cls(config())
    before = {k: p.detach().clone() for k, p in twin.named_parameters()}

    def refused(error, message, **replace):
        with pytest.raises(error, match=message):
            twin.load_numpy_params({**m.params, **replace})
        assert all(torch.equal(before[k], p) for k, p in twin.named_parameters())

    # Tensor.copy_ would broadcast these; the check refuses them
    refused(ValueError, r"params\['out_proj.b'\] must have shape \(7,\), got \(1,\)",
            **{"out_proj.b": np.zeros(1)})
    refused(ValueError, r"params\['decoder.layers.1.cross_attn.b_k'\] must have shape \(12,\)",
            **{"decoder.layers.1.cross_attn.b_k": np.zeros(1)})
    refused(ValueError, r"params\['encoder.layers.0.self_attn.W_qkv'\] must have shape "
                        r"\(12, 36\), got \(36, 12\)",
            **{"encoder.layers.0.self_attn.W_qkv": m.params["encoder.layers.0.self_attn.W_qkv"].T})
    refused(TypeError, r"params\['out_proj.W'\] must be a NumPy array of the model's dtype "
                       r"float64, got float32",
            **{"out_proj.W": m.params["out_proj.W"].astype(np.float32)})
    refused(TypeError, r"params\['out_proj.W'\] must be a NumPy array .* got list",
            **{"out_proj.W": m.params["out_proj.W"].tolist()})
    refused(ValueError, r"params\['encoder.norm.gamma'\] contains NaN or infinity",
            **{"encoder.norm.gamma": np.full(12, np.nan)})
    twin.load_numpy_params(m.params)
    assert all(np.array_equal(p, m.params[k]) for k, p in twin.numpy_params().items())


def test_numpy_params_are_copies_in_the_numpy_layout():
    m = numpy_model(config())
    ref = ReferenceTransformer.from_numpy(m)
    params = ref.numpy_params()
    assert list(params) == list(m.params)
    assert all(p.flags.c_contiguous and not np.shares_memory(p, m.params[k])
               for k, p in params.items())
    params["decoder.layers.0.cross_attn.W_k"][...] = 0  # a copy: the model is not changed
    in_proj = ref.transformer.decoder.layers[0].multihead_attn.in_proj_weight
    assert torch.count_nonzero(in_proj[12:24]) == in_proj[12:24].numel()


def test_the_base_class_is_abstract():
    with pytest.raises(TypeError, match="abstract"):
        _Seq2Seq(config())
