"""LLaMA-architecture checkpoints in the NumPy GPT (issue 41): ``GPT.from_pretrained(folder)``
reads a ``LlamaForCausalLM`` folder as ``transformers`` writes it, and computes its logits,
greedy continuations and gradients. Offline: every checkpoint here is a random
``LlamaForCausalLM`` of a small config, saved with ``save_pretrained``, or written by
:func:`transformer_lab.models.llama.save_llama`."""

from __future__ import annotations

import copy
import dataclasses

import hf_tools as H
import numpy as np
import pytest
import torch
from handout_tools import run_in_handout_package
from hf_tools import one_torch_thread  # noqa: F401 (an autouse fixture)
from transformers import LlamaConfig, LlamaForCausalLM

from transformer_lab import syllabus
from transformer_lab.models import llama
from transformer_lab.models.checkpoints import CheckpointError
from transformer_lab.models.config import parameter_shapes
from transformer_lab.models.gpt import GPT, GPTConfig
from transformer_lab.reference.torch_gpt import TorchGPT

#: Small LLaMA configs: untied with grouped-query attention; tied, every head its own, the
#: attention's biases and another RoPE base (transformers 5's rope_parameters); untied with
#: one key/value head (multi-query), saved in shards.
CONFIGS = {
    "gqa-untied": dict(vocab_size=61, hidden_size=16, intermediate_size=40, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                       tie_word_embeddings=False),
    "mha-tied-bias": dict(vocab_size=50, hidden_size=24, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=6,
                          max_position_embeddings=70, tie_word_embeddings=True,
                          attention_bias=True, rms_norm_eps=1e-5,
                          rope_parameters={"rope_type": "default", "rope_theta": 100000.0}),
    "mqa-untied-sharded": dict(vocab_size=97, hidden_size=32, intermediate_size=88,
                               num_hidden_layers=3, num_attention_heads=4,
                               num_key_value_heads=1, max_position_embeddings=80,
                               tie_word_embeddings=False),
}
SHARDED = "mqa-untied-sharded"


def _hf_model(seed: int, **kw) -> LlamaForCausalLM:
    """A LLaMA of config ``kw`` whose every parameter is random (norm gains too), float32."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(bos_token_id=None, eos_token_id=None, **kw))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def saved(request, tmp_path_factory):
    """(the transformers model, its folder)."""
    model = _hf_model(sorted(CONFIGS).index(request.param), **CONFIGS[request.param])
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == SHARDED:
        model.save_pretrained(folder, max_shard_size="20KB")
        assert len(list(folder.glob("model-*.safetensors"))) > 1
        assert not (folder / "model.safetensors").exists()
    else:
        model.save_pretrained(folder)
    return model, folder


def _float64(model: LlamaForCausalLM) -> LlamaForCausalLM:
    """``model`` in float64 throughout: transformers computes its RoPE tables and its RMSNorm in
    float32 whatever the model's dtype (``model.double()`` keeps both); here both compute in
    float64 too, as the GPT does."""
    twin = copy.deepcopy(model).double()
    c = twin.config
    dim = c.hidden_size // c.num_attention_heads
    inv_freq = 1.0 / c.rope_parameters["rope_theta"] ** (
        torch.arange(0, dim, 2, dtype=torch.float64) / dim)

    def tables(x, position_ids):
        angles = position_ids[..., None].double() * inv_freq
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)

    def rms_norm(norm):
        return lambda h: norm.weight * h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True)
                                                        + norm.variance_epsilon)

    twin.model.rotary_emb.forward = tables
    for module in twin.modules():
        if type(module).__name__ == "LlamaRMSNorm":
            module.forward = rms_norm(module)
    return twin


# --------------------------------------------------------------------------------------------
# The config, the parameters, the logits, decoding and gradients against transformers


def test_the_config_and_every_parameter_map(saved):
    hf, folder = saved
    model = GPT.from_pretrained(folder)
    c, h = model.config, hf.config
    assert (c.vocab_size, c.d_model, c.num_heads, c.num_kv_heads, c.num_layers, c.d_ff,
            c.max_len, c.eps, c.rope_base, c.tie_embeddings, c.bias) == (
        h.vocab_size, h.hidden_size, h.num_attention_heads, h.num_key_value_heads,
        h.num_hidden_layers, h.intermediate_size, h.max_position_embeddings, h.rms_norm_eps,
        h.rope_parameters["rope_theta"], h.tie_word_embeddings, h.attention_bias)
    assert (c.norm, c.mlp, c.positional) == ("rms", "swiglu", "rope")
    assert list(model.params) == list(parameter_shapes(c))
    assert all(p.dtype == np.float32 and p.flags.c_contiguous for p in model.params.values())
    assert model.metadata["llama_config"]["model_type"] == "llama"
    # written back in transformers' names and layout, every tensor is the checkpoint's
    ours = {("" if k == "lm_head.weight" else "model.") + k: w
            for k, w in llama._llama_tensors(model.params, c).items()}
    theirs = {k: p.detach().numpy() for k, p in hf.state_dict().items()
              if k != "lm_head.weight" or not c.tie_embeddings}
    assert ours.keys() == theirs.keys()
    for name, w in theirs.items():
        np.testing.assert_array_equal(ours[name], w, err_msg=name)


def test_the_logits_match_transformers(saved):
    """Relative to the largest logit, at every position (64 to 80). float32: within 1e-5
    (measured 6.9e-7 to 2.0e-6 on these configs). float64: transformers computes its RoPE tables
    and its RMSNorm in float32 even in a float64 model, so the logits agree only as far as
    float32 angles and norms allow (measured 3.1e-7 to 6.3e-7; bound 2e-6); with those two
    computed in float64 too, within 1e-12 (measured 1.3e-15 to 3.5e-15)."""
    hf, folder = saved
    ids = H.random_ids(hf.config.vocab_size, (3, hf.config.max_position_embeddings))  # all
    ours = GPT.from_pretrained(folder).forward(ids)[0]
    assert ours.dtype == np.float32
    assert H.relative(ours, H.torch_logits(hf, ids)) < 1e-5
    ours64 = GPT.from_pretrained(folder, dtype=np.float64).forward(ids)[0]
    assert H.relative(ours64, H.torch_logits(copy.deepcopy(hf).double(), ids)) < 2e-6
    assert H.relative(ours64, H.torch_logits(_float64(hf), ids)) < 1e-12


def test_greedy_continuations_match_with_and_without_the_cache_and_transformers(saved):
    hf, folder = saved
    prompt = H.random_ids(hf.config.vocab_size, (2, 7), seed=1)
    theirs = H.greedy(hf, prompt, 50)
    assert theirs.shape == (2, 57)
    model = GPT.from_pretrained(folder)
    cached = model.generate(prompt, 50, temperature=0)
    np.testing.assert_array_equal(cached, model.generate(prompt, 50, temperature=0,
                                                         use_cache=False))
    np.testing.assert_array_equal(cached, theirs)
    assert len(np.unique(theirs[:, 7:])) > 1  # not one token repeated: the test can fail


def test_the_gradients_match_autograd_so_it_can_be_fine_tuned(saved):
    """float64: our gradients against autograd's through transformers' own model (in float64
    throughout, its gradients mapped onto the GPT's names and layout as the weights are) and
    through the PyTorch twin, TorchGPT."""
    hf, folder = saved
    ids = H.random_ids(hf.config.vocab_size, (2, 12), seed=2)
    model = GPT.from_pretrained(folder, dtype=np.float64)
    loss, grads = model.loss(ids)
    twin = _float64(hf)
    logits = twin(torch.as_tensor(ids)).logits
    theirs = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                               torch.as_tensor(ids[:, 1:]).reshape(-1))
    theirs.backward()
    assert abs(loss - theirs.item()) < 1e-12 * abs(loss)
    hf_grads = {k.removeprefix("model."): p.grad.numpy() for k, p in twin.named_parameters()}
    expected = llama.llama_params(hf_grads, model.config)
    torch_twin = TorchGPT.from_numpy(model)
    torch_twin.loss(ids).backward()
    for name, g in grads.items():
        scale = np.max(np.abs(expected[name]))
        assert np.max(np.abs(g - expected[name])) <= 1e-10 * scale, name
        assert np.max(np.abs(g - torch_twin.numpy_grads()[name])) <= 1e-10 * scale, name
    for name, g in grads.items():  # one SGD step lowers the loss: the model fine-tunes
        model.params[name] -= 0.1 * g
    assert model.loss(ids, compute_grads=False)[0] < loss


# --------------------------------------------------------------------------------------------
# Other ways a checkpoint is written


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """(the transformers model, its config.json as a dict, its tensors, the logits of IDS)."""
    hf = _hf_model(7, **CONFIGS["gqa-untied"])
    config, tensors = H.save_and_read(hf, tmp_path_factory.mktemp("small"))
    return hf, config, tensors, H.torch_logits(hf, IDS)


IDS = H.random_ids(61, (2, 9), seed=4)


def test_what_transformers_5_writes_and_what_the_hubs_snapshots_hold(small, tmp_path):
    """transformers 5.24 writes the RoPE base in ``rope_parameters``; the Hub's snapshots (saved
    by transformers 4) hold a top-level ``rope_theta`` and ``rope_scaling: null``, and may name
    no ``model_type`` but their ``architectures``; checkpoints of ``LlamaModel`` have no
    ``model.`` prefix."""
    hf, config, tensors, expected = small
    assert config["rope_parameters"] == {"rope_theta": 10000.0, "rope_type": "default"}
    assert "rope_theta" not in config and config["head_dim"] == 4
    old = {k: val for k, val in config.items() if k not in ("rope_parameters", "head_dim",
                                                            "model_type")}
    old.update(rope_theta=10000.0, rope_scaling=None, rope_interleaved=False, pretraining_tp=1)
    plain = {k.removeprefix("model."): w for k, w in tensors.items()}
    plain["layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(2, np.float32)  # a buffer
    model = GPT.from_pretrained(H.write_checkpoint(tmp_path / "hub", old, plain))
    assert H.relative(model.forward(IDS)[0], expected) < 1e-5
    theta = dict(config, rope_parameters={"rope_type": "default", "rope_theta": 5e5})
    folder = H.write_checkpoint(tmp_path / "theta", theta, tensors)
    assert GPT.from_pretrained(folder).config.rope_base == 5e5


def test_a_context_of_a_billion_positions_loads_and_computes_the_same(small, tmp_path):
    """RoPE's tables are made for the positions a call reads, not for
    ``max_position_embeddings`` up front (a table of 10^9 positions would not fit in memory)."""
    _, config, tensors, expected = small
    folder = H.write_checkpoint(tmp_path, dict(config, max_position_embeddings=10**9), tensors)
    model = GPT.from_pretrained(folder)
    assert model.config.max_len == 10**9
    assert H.relative(model.forward(IDS)[0], expected) < 1e-5


def test_bfloat16_weights_are_widened_exactly(small, tmp_path):
    """NumPy has no bfloat16 and safetensors' NumPy API refuses it: the loader reads its bytes."""
    from safetensors.torch import save_file

    _, config, tensors, _ = small
    folder = H.write_checkpoint(tmp_path, dict(config, dtype="bfloat16"), {})
    half = {k: torch.as_tensor(w).bfloat16() for k, w in tensors.items()}
    save_file(half, str(folder / "model.safetensors"), metadata={"format": "pt"})
    model = GPT.from_pretrained(folder)
    widened = {k: w.float().numpy() for k, w in half.items()}  # by torch
    reference = GPT.from_pretrained(H.write_checkpoint(tmp_path / "f32", config, widened))
    assert all(np.array_equal(model.params[k], p) for k, p in reference.params.items())
    assert not np.array_equal(model.params["embed.W"], tensors["model.embed_tokens.weight"])


def test_a_tied_checkpoint_may_store_its_head_but_not_another_one(small, tmp_path):
    _, config, tensors, _ = small
    tied = dict(config, tie_word_embeddings=True)
    same = dict(tensors, **{"lm_head.weight": tensors["model.embed_tokens.weight"].copy()})
    assert GPT.from_pretrained(H.write_checkpoint(tmp_path / "same", tied, same)).config \
        .tie_embeddings
    with pytest.raises(CheckpointError, match="lm_head.weight differs from embed_tokens.weight"):
        GPT.from_pretrained(H.write_checkpoint(tmp_path / "other", tied, tensors))


def test_the_defaults_are_transformers():
    reference = LlamaConfig()
    for key, value in llama.LLAMA_DEFAULTS.items():
        if key in ("num_key_value_heads", "head_dim"):  # None: resolved from the heads
            assert getattr(reference, key) == {"num_key_value_heads": 32, "head_dim": 128}[key]
        elif key == "rope_theta":
            assert reference.rope_parameters == {"rope_theta": value, "rope_type": "default"}
        elif key not in ("rope_parameters", "rope_scaling", "sliding_window"):
            assert getattr(reference, key) == value, key
    assert not hasattr(reference, "sliding_window")


# --------------------------------------------------------------------------------------------
# What is refused, and how


BAD_CONFIGS = {
    "llama3-rope": ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0,
                                         "rope_theta": 5e5}},
                    "rope_parameters with rope_type 'llama3' is not supported"),
    "linear-scaling": ({"rope_scaling": {"type": "linear", "factor": 2.0}},
                       "rope_scaling with rope_type 'linear' is not supported"),
    "partial-rotary": ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                            "partial_rotary_factor": 0.5}},
                       "rope_parameters 'partial_rotary_factor' is not supported"),
    "sliding-window": ({"sliding_window": 16}, "sliding_window=16 is not supported"),
    "head-dim": ({"head_dim": 8}, "head_dim=8 is not supported"),
    "activation": ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported"),
    "mlp-bias": ({"mlp_bias": True}, "mlp_bias=True is not supported"),
    "kv-heads": ({"num_key_value_heads": 3}, "num_key_value_heads must divide"),
    "layers": ({"num_hidden_layers": 0}, "num_hidden_layers must be a positive integer"),
    "eps": ({"rms_norm_eps": 0}, "rms_norm_eps must be a small positive number"),
    "theta": ({"rope_parameters": {"rope_type": "default", "rope_theta": "big"}},
              "rope_theta must be a number above 1"),
    "tie": ({"tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false"),
    "mistral": ({"model_type": "mistral"}, r"model_type is 'mistral'.*'gpt2'.*'llama'"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_an_option_the_gpt_cannot_compute_is_refused_by_name(small, tmp_path, case):
    change, message = BAD_CONFIGS[case]
    _, config, tensors, _ = small
    folder = H.write_checkpoint(tmp_path / "broken", {**config, **change}, tensors)
    with pytest.raises(CheckpointError, match=message) as e:
        GPT.from_pretrained(folder)
    assert str(folder / "config.json") in str(e.value)


def test_tensors_that_do_not_fit_the_config_are_refused(small, tmp_path):
    _, config, tensors, _ = small
    missing = {k: w for k, w in tensors.items() if k != "lm_head.weight"}
    with pytest.raises(CheckpointError, match=r"LLaMA's tensors .* missing \['lm_head.weight'\]"):
        GPT.from_pretrained(H.write_checkpoint(tmp_path / "a", config, missing))
    wrong = dict(tensors, **{"model.layers.1.self_attn.k_proj.weight": np.zeros((16, 16),
                                                                               np.float32)})
    with pytest.raises(CheckpointError, match=r"'model.layers.1.self_attn.k_proj.weight' has "
                                              r"shape \(16, 16\) but the config asks for "
                                              r"\(8, 16\)"):
        GPT.from_pretrained(H.write_checkpoint(tmp_path / "b", config, wrong))


# --------------------------------------------------------------------------------------------
# Figures from the config alone, and checkpoints written without transformers


def test_the_figures_follow_from_the_config_alone():
    """The parameters of a random LlamaForCausalLM, counted by torch, and the KV cache of the
    GPT that loads it. SmolLM2-135M's published config (hidden 576, intermediate 1536, 30
    layers, 9 heads, 3 key/value heads, vocabulary 49,152, tied): 134,515,008 parameters,
    538.06 MB in float32, 46,080 bytes of KV cache per token (2 x 30 x 3 x 64 x 4)."""
    for kw in CONFIGS.values():
        config = LlamaConfig(**kw).to_dict()
        figures = llama.llama_figures(config)
        model = LlamaForCausalLM(LlamaConfig(**kw))
        assert figures["parameters"] == sum(p.numel() for p in model.parameters())
        assert figures["megabytes_float32"] == figures["parameters"] * 4 / 1e6
        c = llama.llama_config(llama.checked_llama_config(config))
        assert figures["parameters"] == sum(int(np.prod(s)) for s in parameter_shapes(c).values())
        assert figures["kv_cache_bytes_per_token"] == GPT(c, seed=0).kv_cache_bytes(1, 1)
    smollm2 = {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
               "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
               "vocab_size": 49152, "tie_word_embeddings": True, "max_position_embeddings": 8192,
               "rms_norm_eps": 1e-5, "rope_theta": 100000, "rope_scaling": None}
    assert llama.llama_figures(smollm2) == {"parameters": 134_515_008,
                                            "megabytes_float32": 538.060032,
                                            "kv_cache_bytes_per_token": 46_080}


@pytest.mark.parametrize("tie", [True, False])
def test_save_llama_writes_what_transformers_and_the_gpt_read(tmp_path, tie):
    rng = np.random.default_rng(0)
    model = GPT(GPTConfig.modern(61, d_model=32, num_heads=4, num_kv_heads=2, num_layers=2,
                                 max_len=40, rope_base=5e5, bias=not tie, tie_embeddings=tie),
                seed=3)
    for p in model.params.values():
        p += rng.normal(0, 0.1, p.shape).astype(p.dtype)
    folder = llama.save_llama(model, tmp_path / "tiny")
    loaded = GPT.from_pretrained(folder)
    assert loaded.config == model.config
    assert all(np.array_equal(loaded.params[k], p) for k, p in model.params.items())
    hf = LlamaForCausalLM.from_pretrained(folder).eval()
    assert hf.config.rope_parameters["rope_theta"] == 5e5 and hf.config.attention_bias == (not tie)
    ids = H.random_ids(61, (2, 40), seed=5)
    assert H.relative(model.forward(ids)[0], H.torch_logits(hf, ids)) < 1e-5
    with pytest.raises(ValueError, match="model.config.norm must be 'rms'"):
        llama.save_llama(GPT(GPTConfig.classic(10, d_model=8, num_layers=1)), tmp_path / "x")


def test_the_rope_pairs_reorder_and_back():
    w = np.arange(2 * 3 * 8).reshape(2, 24)  # 3 heads of 8 features
    pairs = llama.half_split_to_pairs(w, 3)
    np.testing.assert_array_equal(pairs[0, :8], [0, 4, 1, 5, 2, 6, 3, 7])
    np.testing.assert_array_equal(pairs[1, 16:], [40, 44, 41, 45, 42, 46, 43, 47])
    np.testing.assert_array_equal(llama.pairs_to_half_split(pairs, 3), w)


# --------------------------------------------------------------------------------------------
# The student's core runs a loaded checkpoint


def test_on_the_handout_a_llama_checkpoint_runs_the_students_core(tmp_path):
    """On the handout's package with ``core/modern.py`` stubbed, a LLaMA checkpoint written
    without transformers loads, and its forward stops at the student's first stub, RMSNorm."""
    script = (
        "from transformer_lab.models.gpt import GPT, GPTConfig\n"
        "from transformer_lab.models.llama import save_llama\n"
        "import numpy as np\n"
        "folder = save_llama(GPT(GPTConfig.modern(50, d_model=16, num_layers=1,\n"
        "                        tie_embeddings=False), seed=0), 'ckpt')\n"
        "model = GPT.from_pretrained(folder)\n"
        "print('loaded', model.config.tie_embeddings)\n"
        "try:\n"
        "    model.forward(np.zeros((1, 3), dtype=np.int64))\n"
        "except NotImplementedError as e:\n"
        "    print('stub:', e)\n")
    out = run_in_handout_package(tmp_path, "modern", script)
    assert "loaded False" in out
    assert f"stub: {syllabus.stub_message('rms_norm_forward')}" in out


def test_a_loaded_checkpoint_keeps_its_parameters_on_the_device(tmp_path):
    from standin import assert_on_device, standin

    from transformer_lab import device

    model = GPT(dataclasses.replace(GPTConfig.modern(30, d_model=16, num_layers=1, max_len=12),
                                    tie_embeddings=False), seed=0)
    folder = llama.save_llama(model, tmp_path / "ckpt")
    cpu = GPT.from_pretrained(folder).generate([[1, 2, 3]], 6, temperature=0)
    with device.on(standin):
        loaded = GPT.from_pretrained(folder)
        assert_on_device(loaded.params)
        out = loaded.generate([[1, 2, 3]], 6, temperature=0)
        assert_on_device({"ids": out})
    np.testing.assert_array_equal(np.asarray(out), cpu)
