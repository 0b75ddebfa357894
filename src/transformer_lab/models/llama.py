"""LLaMA-architecture checkpoints in the NumPy GPT (the modern block): :func:`read_llama`
(which :func:`~.pretrained.read_pretrained` calls for ``model_type: llama``),
:func:`llama_figures` (a model's figures from its config alone) and :func:`save_llama` (a
writer of such folders without ``transformers``)::

    from transformer_lab.models.gpt import GPT
    model = GPT.from_pretrained("~/.cache/huggingface/hub/models--HuggingFaceTB--SmolLM2-135M/"
                                "snapshots/<hash>")

How the config and tensors map onto the GPT (RoPE's pairs reordered once, by
:func:`half_split_to_pairs`) and which options are refused: docs/maintainers.md, "Models and
trainers".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from transformer_lab import device
from transformer_lab.models.checkpoints import CheckpointError
from transformer_lab.models.config import GPTConfig, kv_cache_bytes, parameter_shapes
from transformer_lab.models.hf_checkpoint import (
    CONFIG_FILE,
    LM_HEAD,
    WEIGHTS_FILE,
    Layout,
    positive_integers,
    read_tensors,
    small_positive,
)

__all__ = ["LLAMA_DEFAULTS", "read_llama", "checked_llama_config", "llama_config",
           "llama_shapes", "llama_params", "half_split_to_pairs", "pairs_to_half_split",
           "llama_figures", "save_llama"]

PREFIX = "model."

#: ``transformers.LlamaConfig``'s defaults for the fields read here (LLaMA 7B's sizes; tests
#: check them against the installed ``transformers``).
LLAMA_DEFAULTS = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": None,
    "head_dim": None, "hidden_act": "silu", "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
    "mlp_bias": False, "rope_theta": 10000.0, "rope_parameters": None, "rope_scaling": None,
    "sliding_window": None,
}
_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "max_position_embeddings")
_ACTIVATIONS = ("silu", "swish")  # the same function in transformers' ACT2FN
_ROPE_KEYS = ("rope_type", "type", "rope_theta")  # what a default RoPE's parameters may hold
_LAYER = {"input_layernorm.weight": "norm1.gamma", "post_attention_layernorm.weight":
          "norm2.gamma", "mlp.gate_proj.weight": "mlp.W_gate", "mlp.up_proj.weight": "mlp.W_up",
          "mlp.down_proj.weight": "mlp.W_down", "self_attn.o_proj.weight": "attn.W_o",
          "self_attn.o_proj.bias": "attn.b_o"}
_QKV = ("q_proj", "k_proj", "v_proj")


def _is_buffer(name: str) -> bool:
    """Whether a stored tensor name (without the prefix) is a buffer, not a parameter: the
    rotary frequencies old checkpoints store."""
    return name.startswith("layers.") and name.endswith("self_attn.rotary_emb.inv_freq")


LLAMA = Layout("LLaMA", PREFIX, "embed_tokens.weight", _is_buffer)


def read_llama(root: Path, config_path: Path, hf_config, dtype) -> tuple[GPTConfig, dict]:
    """(config, params) of a LLaMA checkpoint folder ``root`` whose config.json, at
    ``config_path``, holds ``hf_config``: the GPT's config and parameters in ``dtype``."""
    hf = checked_llama_config(hf_config, str(config_path))
    config = llama_config(hf, dtype)
    tensors = read_tensors(root, llama_shapes(hf), np.dtype(config.dtype), LLAMA)
    return config, llama_params(tensors, config)


# --------------------------------------------------------------------------------------------
# config.json


def checked_llama_config(hf_config, source: str = CONFIG_FILE) -> dict:
    """The fields of a LLaMA ``config.json`` (as a dict) that the GPT reads, defaults filled in
    (:data:`LLAMA_DEFAULTS`, ``num_key_value_heads`` and ``head_dim`` resolved, the RoPE base
    as ``rope_theta``), or a CheckpointError naming ``source`` and the option."""
    if not isinstance(hf_config, Mapping):
        raise CheckpointError(f"{source} must hold a JSON object (a LLaMA config), got "
                              f"{type(hf_config).__name__}")
    if hf_config.get("model_type", "llama") != "llama":
        raise CheckpointError(f"{source} is not a LLaMA config: model_type is "
                              f"{hf_config.get('model_type')!r}, expected 'llama'")
    hf = {**LLAMA_DEFAULTS, **{k: hf_config[k] for k in LLAMA_DEFAULTS if k in hf_config}}
    if hf["num_key_value_heads"] is None:
        hf["num_key_value_heads"] = hf["num_attention_heads"]
    positive_integers(hf, (*_SIZES, "num_key_value_heads"), source)
    E, H, Hkv = hf["hidden_size"], hf["num_attention_heads"], hf["num_key_value_heads"]
    if E % H or (E // H) % 2:
        raise CheckpointError(f"{source}: hidden_size must be num_attention_heads times an even "
                              f"head width, got hidden_size={E} and num_attention_heads={H}")
    if H % Hkv:
        raise CheckpointError(f"{source}: num_key_value_heads must divide num_attention_heads, "
                              f"got {Hkv} and {H}")
    if hf["head_dim"] not in (None, E // H):
        raise CheckpointError(f"{source}: head_dim={hf['head_dim']!r} is not supported: the "
                              f"GPT's heads are hidden_size / num_attention_heads = {E // H} "
                              f"wide")
    small_positive(hf, "rms_norm_eps", source)
    if hf["hidden_act"] not in _ACTIVATIONS:
        raise CheckpointError(f"{source}: hidden_act={hf['hidden_act']!r} is not supported: the "
                              f"GPT's SwiGLU gates with SiLU ('silu')")
    refused = {"mlp_bias": "the GPT's SwiGLU has no biases",
               "sliding_window": "the GPT's attention sees every earlier position"}
    for key, why in refused.items():
        if hf[key] not in (None, False):
            raise CheckpointError(f"{source}: {key}={hf[key]!r} is not supported: {why}")
    for key in ("attention_bias", "tie_word_embeddings"):
        if not isinstance(hf[key], bool):
            raise CheckpointError(f"{source}: {key} must be true or false, got {hf[key]!r}")
    hf["rope_theta"] = _rope_theta(hf, source)
    return hf


def _rope_theta(hf: Mapping, source: str) -> float:
    """The RoPE base of a config whose RoPE is the default one: ``rope_parameters``'
    ``rope_theta`` (transformers 5), else the top-level ``rope_theta`` (earlier configs, the
    Hub's snapshots)."""
    theta = hf["rope_theta"]
    for key in ("rope_scaling", "rope_parameters"):
        rope = hf[key]
        if rope is None:
            continue
        if not isinstance(rope, Mapping):
            raise CheckpointError(f"{source}: {key} must be an object or null, got {rope!r}")
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind != "default":
            raise CheckpointError(f"{source}: {key} with rope_type {kind!r} is not supported: "
                                  f"the GPT's RoPE is the default one (rope_type 'default')")
        others = sorted(set(rope) - set(_ROPE_KEYS))
        if others:
            raise CheckpointError(f"{source}: {key} {others[0]!r} is not supported: the GPT's "
                                  f"RoPE is the default one (only rope_theta)")
        theta = rope.get("rope_theta", theta)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 1:
        raise CheckpointError(f"{source}: rope_theta must be a number above 1, got {theta!r}")
    return float(theta)


def llama_config(hf: Mapping, dtype=np.float32) -> GPTConfig:
    """The :class:`GPTConfig` of a checked LLaMA config (:func:`checked_llama_config`)."""
    return GPTConfig(vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
                     num_heads=hf["num_attention_heads"],
                     num_kv_heads=hf["num_key_value_heads"],
                     num_layers=hf["num_hidden_layers"], d_ff=hf["intermediate_size"],
                     max_len=hf["max_position_embeddings"], norm="rms", mlp="swiglu",
                     positional="rope", bias=hf["attention_bias"],
                     tie_embeddings=hf["tie_word_embeddings"], eps=hf["rms_norm_eps"],
                     rope_base=hf["rope_theta"], dtype=dtype)


# --------------------------------------------------------------------------------------------
# The tensors


def llama_shapes(hf: Mapping) -> dict[str, tuple]:
    """LLaMA's tensor name (without the ``model.`` prefix) -> the shape a checked config
    (:func:`checked_llama_config`) asks for."""
    V, E, F = hf["vocab_size"], hf["hidden_size"], hf["intermediate_size"]
    kv = hf["num_key_value_heads"] * (E // hf["num_attention_heads"])
    layer = {"input_layernorm.weight": (E,), "self_attn.q_proj.weight": (E, E),
             "self_attn.k_proj.weight": (kv, E), "self_attn.v_proj.weight": (kv, E),
             "self_attn.o_proj.weight": (E, E), "post_attention_layernorm.weight": (E,),
             "mlp.gate_proj.weight": (F, E), "mlp.up_proj.weight": (F, E),
             "mlp.down_proj.weight": (E, F)}
    if hf["attention_bias"]:
        layer.update({"self_attn.q_proj.bias": (E,), "self_attn.k_proj.bias": (kv,),
                      "self_attn.v_proj.bias": (kv,), "self_attn.o_proj.bias": (E,)})
    shapes = {"embed_tokens.weight": (V, E)}
    for i in range(hf["num_hidden_layers"]):
        shapes.update({f"layers.{i}.{name}": shape for name, shape in layer.items()})
    shapes["norm.weight"] = (E,)
    if not hf["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (V, E)
    return shapes


def half_split_to_pairs(w: np.ndarray, heads: int) -> np.ndarray:
    """Reorder the last axis, ``heads`` heads of ``Dh`` features each, from ``transformers``'
    RoPE layout (feature ``j`` turns with ``j + Dh/2``) to the core's (``2i`` with ``2i + 1``):
    in each head, the new feature ``2i`` is the old ``i`` and the new ``2i + 1`` the old
    ``i + Dh/2``.  w: (..., heads * Dh)  ->  (..., heads * Dh), a new array."""
    shape = w.shape
    return w.reshape(*shape[:-1], heads, 2, -1).swapaxes(-1, -2).reshape(shape).copy()


def pairs_to_half_split(w: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of :func:`half_split_to_pairs`: the core's layout back to ``transformers'``."""
    shape = w.shape
    return w.reshape(*shape[:-1], heads, -1, 2).swapaxes(-1, -2).reshape(shape).copy()


def llama_params(tensors: Mapping[str, np.ndarray], config: GPTConfig) -> dict[str, np.ndarray]:
    """The GPT's parameters (``parameter_shapes(config)``'s names, in order) from LLaMA's
    tensors (names without the prefix, shapes of :func:`llama_shapes`)."""
    c = config
    params = {"embed.W": tensors["embed_tokens.weight"], "norm.gamma": tensors["norm.weight"]}
    if not c.tie_embeddings:
        params["lm_head.W"] = tensors["lm_head.weight"]
    for i in range(c.num_layers):
        t = f"layers.{i}."
        layer = {ours: tensors[t + theirs] for theirs, ours in _LAYER.items()
                 if t + theirs in tensors}
        heads = (c.num_heads, c.num_kv_heads, None)  # queries and keys reordered, values not
        W = [tensors[f"{t}self_attn.{n}.weight"].T for n in _QKV]  # (E, out) each
        layer["attn.W_qkv"] = _qkv(W, heads)
        if c.bias:
            layer["attn.b_qkv"] = _qkv([tensors[f"{t}self_attn.{n}.bias"] for n in _QKV], heads)
        for name in ("attn.W_o", "mlp.W_gate", "mlp.W_up", "mlp.W_down"):
            layer[name] = np.ascontiguousarray(layer[name].T)
        params.update({t + name: w for name, w in layer.items()})
    return {name: params[name] for name in parameter_shapes(c)}


def _qkv(parts, heads) -> np.ndarray:
    """The query, key and value columns (or biases) side by side, the queries' and keys'
    features in the core's RoPE pairs."""
    return np.concatenate([w if h is None else half_split_to_pairs(w, h)
                           for w, h in zip(parts, heads, strict=True)], axis=-1)


# --------------------------------------------------------------------------------------------
# Figures from the config alone


def llama_figures(hf_config: Mapping) -> dict[str, int | float]:
    """What a LLaMA-architecture model needs, from its ``config.json`` (as a dict) alone,
    nothing allocated: ``parameters`` (a tied table counted once), ``megabytes_float32`` (its
    parameters in float32, 10^6 bytes), ``kv_cache_bytes_per_token`` (keys and values of every
    block for one more token, float32: 2 x layers x kv heads x head width x 4).

    Raises:
        CheckpointError: for a config the GPT cannot compute (which: docs/maintainers.md,
            "Models and trainers").
    """
    hf = checked_llama_config(hf_config)
    parameters = sum(int(np.prod(s)) for s in llama_shapes(hf).values())
    return {"parameters": parameters, "megabytes_float32": parameters * 4 / 1e6,
            "kv_cache_bytes_per_token": kv_cache_bytes(llama_config(hf), 1, 1)}


# --------------------------------------------------------------------------------------------
# Writing a checkpoint folder without transformers


def save_llama(model, folder) -> Path:
    """Write ``model`` as a LLaMA-architecture checkpoint folder, as ``transformers``'
    ``LlamaForCausalLM.save_pretrained`` would: ``config.json`` and ``model.safetensors``
    (float32, ``transformers``' names and (out, in) layout, the queries' and keys' features in
    its half-split RoPE order), written with ``safetensors.numpy`` -- no ``transformers``
    needed. ``GPT.from_pretrained(folder)`` reads it back to the same parameters (up to
    float32), and ``transformers`` loads it too.

        save_llama(GPT(GPTConfig.modern(100, d_model=64, tie_embeddings=False), seed=0), "tiny")

    Args:
        model: a GPT with the modern block (``norm="rms"``, ``mlp="swiglu"``,
            ``positional="rope"``), anything with its ``config`` and ``params``.
        folder: made if missing; its ``config.json`` and ``model.safetensors`` are replaced.

    Returns:
        The folder, a Path.
    """
    from safetensors import numpy as safetensors_numpy

    c = model.config
    for field, value in (("norm", "rms"), ("mlp", "swiglu"), ("positional", "rope")):
        if getattr(c, field) != value:
            raise ValueError(f"model.config.{field} must be {value!r} for a LLaMA checkpoint "
                             f"(GPTConfig.modern), got {getattr(c, field)!r}")
    folder = Path(folder).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    hf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
          "vocab_size": c.vocab_size, "hidden_size": c.d_model,
          "intermediate_size": c.d_ff, "num_hidden_layers": c.num_layers,
          "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
          "hidden_act": "silu", "max_position_embeddings": c.max_len, "rms_norm_eps": c.eps,
          "rope_theta": c.rope_base, "attention_bias": c.bias, "mlp_bias": False,
          "tie_word_embeddings": c.tie_embeddings, "torch_dtype": "float32"}
    (folder / CONFIG_FILE).write_text(json.dumps(hf, indent=2) + "\n", encoding="utf-8")
    params = {k: np.asarray(device.to_host(p), dtype=np.float32) for k, p in model.params.items()}
    tensors = {(name if name == LM_HEAD else PREFIX + name): np.ascontiguousarray(w)
               for name, w in _llama_tensors(params, c).items()}
    safetensors_numpy.save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    return folder


def _llama_tensors(params: Mapping[str, np.ndarray], c: GPTConfig) -> dict[str, np.ndarray]:
    """The inverse of :func:`llama_params`: LLaMA's tensors (names without the prefix)."""
    E, kv = c.d_model, c.num_kv_heads * c.head_dim
    tensors = {"embed_tokens.weight": params["embed.W"]}
    for i in range(c.num_layers):
        t, p = f"layers.{i}.", f"layers.{i}."
        tensors.update({t + theirs: params[p + ours] for theirs, ours in _LAYER.items()
                        if p + ours in params})
        for name in ("self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                     "mlp.down_proj.weight"):
            tensors[t + name] = tensors[t + name].T
        for kind, suffix in (("W_qkv", "weight"), ("b_qkv", "bias")):
            if p + "attn." + kind not in params:
                continue
            q, k, val = np.split(params[p + "attn." + kind], [E, E + kv], axis=-1)
            parts = (pairs_to_half_split(q, c.num_heads),
                     pairs_to_half_split(k, c.num_kv_heads), val)
            for n, w in zip(_QKV, parts, strict=True):
                tensors[f"{t}self_attn.{n}.{suffix}"] = w.T
    tensors["norm.weight"] = params["norm.gamma"]
    if not c.tie_embeddings:
        tensors["lm_head.weight"] = params["lm_head.W"]
    return tensors
