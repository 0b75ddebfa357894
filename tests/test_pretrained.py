"""GPT-2's checkpoints in the NumPy GPT (issue 24, item 4): ``GPT.from_pretrained(folder)`` reads
a folder as Hugging Face ``transformers`` writes it. Offline: every checkpoint here is a randomly
initialised ``GPT2LMHeadModel`` of a small config, saved with ``save_pretrained``."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from hf_tools import (  # noqa: F401 (one_torch_thread: an autouse fixture)
    greedy,
    one_torch_thread,
    random_ids,
    relative,
    save_and_read,
    torch_logits,
    write_checkpoint,
)
from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model

from transformer_lab.models import pretrained
from transformer_lab.models.checkpoints import CheckpointError
from transformer_lab.models.config import parameter_shapes
from transformer_lab.models.gpt import GPT

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results.md"

#: Small GPT-2 configs: depth, heads, width, MLP width, vocabulary, positions, eps, activation,
#: and dropout (> 0: the model is used in eval mode; 0: in training mode, which then computes
#: the same function).
CONFIGS = {
    "2x2-dropout-eval": dict(n_layer=2, n_head=2, n_embd=16, vocab_size=50, n_positions=64),
    "1x4-inner-no-dropout": dict(n_layer=1, n_head=4, n_embd=32, n_inner=40, vocab_size=97,
                                 n_positions=60, layer_norm_epsilon=1e-3, resid_pdrop=0.0,
                                 embd_pdrop=0.0, attn_pdrop=0.0),
    "3x3-pytorch-tanh": dict(n_layer=3, n_head=3, n_embd=24, n_inner=72, vocab_size=64,
                             n_positions=70, activation_function="gelu_pytorch_tanh"),
}


def _hf_model(seed: int, cls=GPT2LMHeadModel, **kw):
    """A GPT-2 of config ``kw`` whose every parameter is random (gains and biases too, so that
    a swapped weight and bias, or gain and shift, cannot go unnoticed), float32."""
    torch.manual_seed(seed)
    config = GPT2Config(bos_token_id=None, eos_token_id=None, **kw)
    model = cls(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model.eval() if config.resid_pdrop > 0 else model.train()


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def saved(request, tmp_path_factory):
    """(the transformers model, its folder)."""
    model = _hf_model(sorted(CONFIGS).index(request.param), **CONFIGS[request.param])
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    return model, folder


# --------------------------------------------------------------------------------------------
# Logits, decoding, gradients against transformers


def test_the_config_and_every_parameter_map(saved):
    hf, folder = saved
    model = GPT.from_pretrained(folder)
    c, h = model.config, hf.config
    assert (c.vocab_size, c.d_model, c.num_heads, c.num_layers, c.d_ff, c.max_len, c.eps) == (
        h.vocab_size, h.n_embd, h.n_head, h.n_layer, h.n_inner or 4 * h.n_embd, h.n_positions,
        h.layer_norm_epsilon)
    assert (c.norm, c.mlp, c.positional, c.bias, c.num_kv_heads) == (
        "layer", "gelu_tanh", "learned", True, h.n_head)
    assert {k: p.shape for k, p in model.params.items()} == parameter_shapes(c)
    assert list(model.params) == list(parameter_shapes(c))
    torch_params = dict(hf.transformer.named_parameters())
    for ours, theirs in pretrained.gpt2_names(c.num_layers).items():
        assert model.params[ours].dtype == np.float32 and model.params[ours].flags.c_contiguous
        np.testing.assert_array_equal(model.params[ours], torch_params[theirs].detach().numpy())
    assert model.metadata["gpt2_config"]["model_type"] == "gpt2"


def test_the_logits_match_transformers(saved):
    hf, folder = saved
    ids = random_ids(hf.config.vocab_size, (3, hf.config.n_positions))  # every position
    ours = GPT.from_pretrained(folder).forward(ids)[0]
    assert ours.dtype == np.float32
    assert relative(ours, torch_logits(hf, ids)) < 1e-5
    ours64 = GPT.from_pretrained(folder, dtype=np.float64).forward(ids)[0]
    assert ours64.dtype == np.float64
    assert relative(ours64, torch_logits(copy.deepcopy(hf).double(), ids)) < 1e-10


def test_greedy_continuations_match_with_and_without_the_cache_and_transformers(saved):
    hf, folder = saved
    prompt = random_ids(hf.config.vocab_size, (2, 7), seed=1)
    theirs = greedy(hf, prompt, 50)
    assert theirs.shape == (2, 57)
    for dtype in (np.float32, np.float64):
        model = GPT.from_pretrained(folder, dtype=dtype)
        cached = model.generate(prompt, 50, temperature=0)
        np.testing.assert_array_equal(cached, model.generate(prompt, 50, temperature=0,
                                                             use_cache=False))
        np.testing.assert_array_equal(cached, theirs)
    assert len(np.unique(theirs[:, 7:])) > 1  # not one token repeated: the test can fail
    sampled = model.generate(prompt, 50, temperature=1.0, top_k=10, seed=3)
    np.testing.assert_array_equal(sampled, model.generate(prompt, 50, temperature=1.0, top_k=10,
                                                          seed=3, use_cache=False))


def test_the_gradients_match_autograd_so_it_can_be_fine_tuned(saved):
    hf, folder = saved
    ids = random_ids(hf.config.vocab_size, (2, 12), seed=2)
    model = GPT.from_pretrained(folder, dtype=np.float64)
    loss, grads = model.loss(ids)
    twin = copy.deepcopy(hf).double()
    # the same shifted loss, in float64 (transformers' own, labels=ids, is computed in float32)
    logits = twin(torch.as_tensor(ids)).logits
    theirs = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                               torch.as_tensor(ids[:, 1:]).reshape(-1))
    theirs.backward()
    assert abs(loss - theirs.item()) < 1e-12 * abs(loss)
    with torch.no_grad():
        hf_loss = hf(torch.as_tensor(ids), labels=torch.as_tensor(ids)).loss.item()
    assert abs(GPT.from_pretrained(folder).loss(ids, compute_grads=False)[0] - hf_loss) < 1e-5
    torch_params = dict(twin.transformer.named_parameters())
    for ours, theirs in pretrained.gpt2_names(model.config.num_layers).items():
        expected = torch_params[theirs].grad.numpy()
        assert np.max(np.abs(grads[ours] - expected)) <= 1e-9 * np.max(np.abs(expected)), ours
    # one SGD step on the same batch lowers the loss: the loaded model fine-tunes
    for name, g in grads.items():
        model.params[name] -= 0.1 * g
    assert model.loss(ids, compute_grads=False)[0] < loss


# --------------------------------------------------------------------------------------------
# Other ways a checkpoint is written


def _tensors(model) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """(a transformers model, its config.json as a dict, its tensors with the prefix, the
    reference logits of ``IDS``)."""
    hf = _hf_model(7, **CONFIGS["2x2-dropout-eval"])
    config, tensors = save_and_read(hf, tmp_path_factory.mktemp("small"))
    return hf, config, tensors, torch_logits(hf, IDS)


IDS = random_ids(50, (2, 9), seed=4)


def test_a_checkpoint_without_the_prefix_with_mask_buffers_and_a_tied_lm_head(small, tmp_path):
    """As the Hub's GPT-2 files are: no ``transformer.`` prefix, the causal mask stored as
    ``h.N.attn.bias``, sometimes ``lm_head.weight`` (equal to ``wte.weight``)."""
    hf, config, tensors, expected = small
    plain = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    mask = np.tril(np.ones((64, 64), np.float32))[None, None]
    plain.update({f"h.{i}.attn.bias": mask for i in range(2)})
    plain["h.0.attn.masked_bias"] = np.array(-1e4, np.float32)
    plain["lm_head.weight"] = plain["wte.weight"].copy()
    model = GPT.from_pretrained(write_checkpoint(tmp_path / "hub", config, plain))
    assert relative(model.forward(IDS)[0], expected) < 1e-5


def test_a_gpt2_model_without_a_head_loads(tmp_path):
    body = _hf_model(8, GPT2Model, **CONFIGS["2x2-dropout-eval"])
    body.save_pretrained(tmp_path)
    with torch.no_grad():
        hidden = body(torch.as_tensor(IDS)).last_hidden_state
        expected = (hidden @ body.wte.weight.T).numpy()
    assert relative(GPT.from_pretrained(tmp_path).forward(IDS)[0], expected) < 1e-5


def test_a_sharded_checkpoint_and_a_minimal_config_load(small, tmp_path):
    hf, config, _, expected = small
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    assert not (tmp_path / "model.safetensors").exists()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    # a config.json like the Hub's GPT-2 (written before most fields existed): the rest are
    # transformers' defaults
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "n_ctx": 64, "n_embd": 16, "n_head": 2, "n_layer": 2,
         "n_positions": 64, "vocab_size": 50}))
    assert relative(GPT.from_pretrained(tmp_path).forward(IDS)[0], expected) < 1e-5


def test_float16_weights_are_converted(small, tmp_path):
    _, config, tensors, _ = small
    half = {k: v.astype(np.float16) for k, v in tensors.items()}
    model = GPT.from_pretrained(write_checkpoint(tmp_path, config, half), dtype="float64")
    assert model.config.dtype is np.float64
    np.testing.assert_array_equal(model.params["embed.W"],
                                  half["transformer.wte.weight"].astype(np.float64))


def test_the_defaults_are_transformers_and_a_loaded_model_saves_and_loads(small, tmp_path):
    reference = GPT2Config()
    for key, value in pretrained.GPT2_DEFAULTS.items():
        assert getattr(reference, key) == value, key
    _, config, tensors, _ = small
    model = GPT.from_pretrained(write_checkpoint(tmp_path / "ckpt", config, tensors))
    again = GPT.load(model.save(tmp_path / "gpt2.npz", metadata=model.metadata))
    assert again.config == model.config and again.metadata == model.metadata
    assert all(np.array_equal(again.params[k], p) for k, p in model.params.items())


# --------------------------------------------------------------------------------------------
# What is refused, and how


def _broken(small, tmp_path, config_change=None, tensors_change=None) -> Path:
    _, config, tensors, _ = small
    config, tensors = dict(config), dict(tensors)
    if config_change:
        config_change(config)
    if tensors_change:
        tensors_change(tensors)
    return write_checkpoint(tmp_path / "broken", config, tensors)


def _drop(key):
    return lambda d: d.pop(key)


BAD_CONFIGS = {
    "not-gpt2": ({"model_type": "bert"}, r"config.json: model_type is 'bert' .*the GPT reads "
                                         r"GPT-2 \('gpt2'\) and LLaMA-architecture \('llama'\)"),
    "no-model-type": ({"model_type": None}, "model_type is None"),
    "inverse-layer-idx": ({"scale_attn_by_inverse_layer_idx": True},
                          "scale_attn_by_inverse_layer_idx=True is not supported"),
    "unscaled": ({"scale_attn_weights": False}, "scale_attn_weights=False is not supported"),
    "cross-attention": ({"add_cross_attention": True}, "add_cross_attention=True is not"),
    "activation": ({"activation_function": "silu"}, "activation_function 'silu' is not "
                                                    "supported"),
    "heads": ({"n_head": 3}, "n_embd must be divisible by n_head, got n_embd=16 and n_head=3"),
    "layers": ({"n_layer": 0}, "n_layer must be a positive integer, got 0"),
    "inner": ({"n_inner": 2.5}, "n_inner must be a positive integer, got 2.5"),
    "eps": ({"layer_norm_epsilon": -1}, "layer_norm_epsilon must be a small positive number"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_a_config_the_gpt_cannot_compute_is_refused(small, tmp_path, case):
    change, message = BAD_CONFIGS[case]
    folder = _broken(small, tmp_path, lambda c: c.update(change))
    with pytest.raises(CheckpointError, match=message) as e:
        GPT.from_pretrained(folder)
    assert str(folder / "config.json") in str(e.value)


def _set(key, value):
    def change(d):
        d[key] = value
    return change


BAD_TENSORS = {
    "positions": (_set("transformer.wpe.weight", np.zeros((63, 16), np.float32)),
                  r"tensor 'transformer.wpe.weight' has shape \(63, 16\) but the config asks "
                  r"for \(64, 16\)"),
    "missing": (_drop("transformer.h.1.mlp.c_fc.bias"), r"missing \['h.1.mlp.c_fc.bias'\]"),
    "unexpected": (_set("transformer.h.0.attn.q_proj.weight", np.zeros(2, np.float32)),
                   r"unexpected \['transformer.h.0.attn.q_proj.weight'\]"),
    "mixed-prefix": (lambda d: d.update({"ln_f.bias": d.pop("transformer.ln_f.bias")}),
                     "mixes tensor names with and without the 'transformer.' prefix"),
    "untied-head": (_set("lm_head.weight", np.ones((50, 16), np.float32)),
                    "lm_head.weight differs from wte.weight"),
    "nan": (lambda d: d.update({"transformer.ln_f.weight": np.full(16, np.nan, np.float32)}),
            "tensor 'transformer.ln_f.weight' contains NaN or infinity"),
}


@pytest.mark.parametrize("case", sorted(BAD_TENSORS))
def test_tensors_that_do_not_fit_the_config_are_refused(small, tmp_path, case):
    change, message = BAD_TENSORS[case]
    folder = _broken(small, tmp_path, tensors_change=change)
    with pytest.raises(CheckpointError, match=message) as e:
        GPT.from_pretrained(folder)
    assert str(folder / "model.safetensors") in str(e.value)


def test_an_untied_gpt2_loads_its_lm_head(tmp_path):
    """``tie_word_embeddings: false``: the output projection is ``lm_head.weight``, the GPT's
    ``lm_head.W``, and the embeddings get no gradient from it."""
    hf = _hf_model(9, tie_word_embeddings=False, **CONFIGS["2x2-dropout-eval"])
    hf.save_pretrained(tmp_path)
    model = GPT.from_pretrained(tmp_path)
    assert not model.config.tie_embeddings and list(model.params)[-1] == "lm_head.W"
    np.testing.assert_array_equal(model.params["lm_head.W"], hf.lm_head.weight.detach().numpy())
    assert not np.array_equal(model.params["lm_head.W"], model.params["embed.W"])
    assert relative(model.forward(IDS)[0], torch_logits(hf, IDS)) < 1e-5
    (tmp_path / "config.json").write_text(json.dumps(dict(json.loads(
        (tmp_path / "config.json").read_text()), tie_word_embeddings=True)))
    with pytest.raises(CheckpointError, match="lm_head.weight differs from wte.weight"):
        GPT.from_pretrained(tmp_path)


def test_bfloat16_weights_are_widened_exactly(small, tmp_path):
    """NumPy has no bfloat16 (and safetensors' NumPy API refuses it): its bytes are read and
    widened to float32, exactly as torch widens them."""
    from safetensors.torch import save_file

    _, config, tensors, _ = small
    folder = write_checkpoint(tmp_path, config, {})
    half = {k: torch.as_tensor(v).bfloat16() for k, v in tensors.items()}
    save_file(half, str(folder / "model.safetensors"))
    model = GPT.from_pretrained(folder, dtype=np.float64)
    for ours, theirs in pretrained.gpt2_names(2).items():
        np.testing.assert_array_equal(model.params[ours],
                                      half["transformer." + theirs].double().numpy())


def test_missing_and_damaged_files_are_named(small, tmp_path):
    with pytest.raises(CheckpointError, match="no such folder"):
        GPT.from_pretrained(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="is a file, not a folder"):
        GPT.from_pretrained(tmp_path / "file")
    folder = _broken(small, tmp_path)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"model.safetensors: missing .*pytorch_model.bin"):
        GPT.from_pretrained(folder)
    (folder / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="model.safetensors: cannot read it as a "
                                              "safetensors file"):
        GPT.from_pretrained(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json: cannot read it as JSON"):
        GPT.from_pretrained(folder)
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json: missing"):
        GPT.from_pretrained(folder)
    with pytest.raises(TypeError, match="folder must be a path"):
        GPT.from_pretrained(None)
    with pytest.raises(TypeError, match="dtype must be np.float32 or np.float64"):
        GPT.from_pretrained(folder, dtype=np.int32)


# --------------------------------------------------------------------------------------------
# docs/results.md's figures for the real 124M GPT-2


def test_the_documented_figures_for_gpt2_124m_follow_from_its_shapes():
    """Computed from the shapes alone (nothing is allocated): the parameters, the memory in
    float32, the KV cache per token, the FLOPs per token, and the times docs/results.md derives from
    its measured rates."""
    c = pretrained.gpt2_config(dict(pretrained.GPT2_DEFAULTS, model_type="gpt2"))
    assert (c.vocab_size, c.d_model, c.num_heads, c.num_layers, c.d_ff, c.max_len) == (
        50257, 768, 12, 12, 3072, 1024)
    shapes = parameter_shapes(c)
    params = sum(int(np.prod(s)) for s in shapes.values())
    matmul = sum(int(np.prod(s)) for name, s in shapes.items()
                 if name.endswith(("W_qkv", "W_o", "W1", "W2"))) + c.vocab_size * c.d_model
    text = " ".join(RESULTS.read_text(encoding="utf-8").split())
    section = text[text.index("GPT-2's weights in the NumPy GPT"):]
    section = section[:section.index("## ")]

    def number(pattern: str) -> float:
        found = re.search(pattern, section)
        assert found, pattern
        return float(found.group(1).replace(",", ""))

    assert number(r"([\d,]+) parameters") == params == 124_439_808
    assert number(r"([\d.]+) MB in float32") == round(params * 4 / 1e6)
    assert number(r"([\d.]+) GB in float64") == round(params * 8 / 1e9, 1)
    assert number(r"KV cache ([\d,]+) bytes per token") == 2 * c.num_layers * c.d_model * 4
    assert number(r"12 blocks, (\d+) numbers of 4 bytes") == c.d_model
    kv = 2 * c.num_layers * c.d_model * 4
    assert number(r"([\d,]+) MB for 1,024 tokens") == round(kv * 1024 / 1e6)
    assert number(r"costs 2 x ([\d,]+) = ") == matmul
    assert number(r"= ([\d.]+) GFLOP in the matrix") == round(2 * matmul / 1e9, 3)
    attention = 4 * c.num_layers * c.d_model
    assert number(r"= ([\d,]+) t FLOP of attention") == attention
    assert number(r"([\d.]+) GFLOP at 1,024") == round(attention * 1024 / 1e9, 3)
    mask = c.max_len ** 2 * 4  # the causal mask the Hub's file stores per block, float32
    assert number(r"masks of ([\d.]+) MB") == round(mask / 1e6)
    assert number(r"GPT-2's ([\d.]+) MB `model.safetensors`") == round(
        (params * 4 + c.num_layers * mask) / 1e6)
    gflops, bandwidth = number(r"at ([\d.]+) GFLOP/s"), number(r"at ([\d.]+) GB/s")
    assert number(r"about ([\d.]+) ms per token of a prompt") == round(2 * matmul / gflops / 1e6)
    per_token = round(params * 4 / bandwidth / 1e6)
    assert number(r"about ([\d.]+) ms per generated token") == per_token
    assert number(r"about ([\d.]+) tokens per second") == round(1000 / per_token)
