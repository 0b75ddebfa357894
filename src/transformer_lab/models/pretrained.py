"""The field's checkpoints in the NumPy GPT: a folder as Hugging Face ``transformers`` writes it
(``config.json`` and ``model.safetensors``, or its shards; read by :mod:`.hf_checkpoint`) read
into a :class:`~.config.GPTConfig` and the GPT's parameters by :func:`read_pretrained`, which
:meth:`transformer_lab.models.gpt.GPT.from_pretrained` calls: GPT-2 (``"gpt2"``, here) or a
LLaMA-architecture model (``"llama"``, :mod:`transformer_lab.models.llama`)::

    from transformer_lab.models.gpt import GPT
    model = GPT.from_pretrained("~/.cache/huggingface/hub/models--gpt2/snapshots/<hash>")
    logits, _ = model.forward(ids)          # GPT-2's logits, (B, T, 50257)

How GPT-2's config and tensors map onto the GPT, and what is refused: docs/maintainers.md,
"Models and trainers".
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from transformer_lab.models import llama
from transformer_lab.models.checkpoints import CheckpointError
from transformer_lab.models.config import GPTConfig, parameter_shapes
from transformer_lab.models.hf_checkpoint import (
    CONFIG_FILE,
    LM_HEAD,
    Layout,
    open_folder,
    positive_integers,
    read_tensors,
    small_positive,
)

__all__ = ["GPT2_DEFAULTS", "GPT2_ACTIVATIONS", "read_pretrained", "gpt2_config", "gpt2_names"]

#: ``transformers.GPT2Config``'s defaults for the fields read here (GPT-2 124M's sizes);
#: ``config.json`` files written by older versions leave some out (tests check these against
#: the installed ``transformers``).
GPT2_DEFAULTS = {
    "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
    "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
    "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False, "add_cross_attention": False,
    "tie_word_embeddings": True,
}

#: GPT-2's ``activation_function`` -> the GPT's ``mlp``. "gelu_new" and "gelu_pytorch_tanh"
#: are the same tanh approximation of GELU; "gelu" is the exact one.
GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                    "gelu": "gelu", "relu": "relu"}

BUFFERS = ("attn.bias", "attn.masked_bias")  # GPT-2's causal mask in older checkpoints

_SIZES = ("vocab_size", "n_embd", "n_head", "n_layer", "n_positions")
_LAYER = {"ln_1.weight": "norm1.gamma", "ln_1.bias": "norm1.beta",
          "attn.c_attn.weight": "attn.W_qkv", "attn.c_attn.bias": "attn.b_qkv",
          "attn.c_proj.weight": "attn.W_o", "attn.c_proj.bias": "attn.b_o",
          "ln_2.weight": "norm2.gamma", "ln_2.bias": "norm2.beta",
          "mlp.c_fc.weight": "mlp.W1", "mlp.c_fc.bias": "mlp.b1",
          "mlp.c_proj.weight": "mlp.W2", "mlp.c_proj.bias": "mlp.b2"}


def _gpt2_buffer(name: str) -> bool:
    return name.startswith("h.") and name.endswith(BUFFERS) and name.split(".")[1].isdigit()


GPT2 = Layout("GPT-2", "transformer.", "wte.weight", _gpt2_buffer)


def gpt2_names(num_layers: int, tie_embeddings: bool = True) -> dict[str, str]:
    """The GPT's parameter name -> GPT-2's tensor name (without the ``transformer.`` prefix),
    for a model of ``num_layers`` blocks, in the GPT's order of parameters."""
    names = {"embed.W": "wte.weight", "pos.W": "wpe.weight"}
    for i in range(num_layers):
        names.update({f"layers.{i}.{ours}": f"h.{i}.{theirs}" for theirs, ours in _LAYER.items()})
    names.update({"norm.gamma": "ln_f.weight", "norm.beta": "ln_f.bias"})
    if not tie_embeddings:
        names["lm_head.W"] = LM_HEAD
    return names


# --------------------------------------------------------------------------------------------
# GPT-2's config.json


def gpt2_config(hf_config: Mapping, dtype=np.float32, source: str = CONFIG_FILE) -> GPTConfig:
    """The :class:`GPTConfig` of a GPT-2 ``config.json`` (as a dict), or a CheckpointError
    naming ``source`` and the field that is wrong (missing fields: :data:`GPT2_DEFAULTS`)."""
    return _config(_checked_hf_config(hf_config, source), dtype)


def _config(hf: Mapping, dtype) -> GPTConfig:
    return GPTConfig(vocab_size=hf["vocab_size"], d_model=hf["n_embd"], num_heads=hf["n_head"],
                     num_layers=hf["n_layer"], d_ff=hf["n_inner"] or 4 * hf["n_embd"],
                     max_len=hf["n_positions"], norm="layer",
                     mlp=GPT2_ACTIVATIONS[hf["activation_function"]], positional="learned",
                     bias=True, tie_embeddings=bool(hf["tie_word_embeddings"]),
                     eps=hf["layer_norm_epsilon"], dtype=dtype)


def _checked_hf_config(hf_config, source: str) -> dict:
    if not isinstance(hf_config, Mapping):
        raise CheckpointError(f"{source} must hold a JSON object (a GPT-2 config), got "
                              f"{type(hf_config).__name__}")
    if hf_config.get("model_type") != "gpt2":
        raise CheckpointError(f"{source} is not a GPT-2 config: model_type is "
                              f"{hf_config.get('model_type')!r}, expected 'gpt2'")
    hf = {**GPT2_DEFAULTS, **{k: hf_config[k] for k in GPT2_DEFAULTS if k in hf_config}}
    positive_integers(hf, _SIZES + (("n_inner",) if hf["n_inner"] is not None else ()), source)
    if hf["n_embd"] % hf["n_head"]:
        raise CheckpointError(f"{source}: n_embd must be divisible by n_head, got n_embd="
                              f"{hf['n_embd']} and n_head={hf['n_head']}")
    small_positive(hf, "layer_norm_epsilon", source)
    if hf["activation_function"] not in GPT2_ACTIVATIONS:
        raise CheckpointError(f"{source}: activation_function {hf['activation_function']!r} is "
                              f"not supported (the GPT computes {sorted(GPT2_ACTIVATIONS)})")
    refused = {"scale_attn_weights": (False, "the GPT always scales the attention scores by "
                                             "1/sqrt(head width)"),
               "scale_attn_by_inverse_layer_idx": (True, "the GPT does not divide the scores "
                                                         "of block i by i + 1"),
               "add_cross_attention": (True, "the GPT has no cross-attention")}
    for key, (bad, why) in refused.items():
        if bool(hf[key]) == bad:
            raise CheckpointError(f"{source}: {key}={hf[key]!r} is not supported: {why}")
    return hf


# --------------------------------------------------------------------------------------------
# The folder


def read_pretrained(folder, dtype=np.float32) -> tuple[GPTConfig, dict[str, np.ndarray], dict]:
    """Read a ``transformers`` checkpoint folder of GPT-2 or of the LLaMA architecture, by its
    ``config.json``'s ``model_type`` ("gpt2", "llama"; without one, by its ``architectures``).

    Args:
        folder: the folder (``~`` is expanded), e.g. a snapshot in the Hugging Face cache.
        dtype: np.float32 (default) or np.float64: the config's dtype and the parameters'.

    Returns:
        (config, params, metadata): the :class:`GPTConfig`; the GPT's parameters (name -> a
        new C-contiguous array in ``dtype``), the names and shapes of
        ``transformer_lab.models.config.parameter_shapes(config)``; ``{"gpt2_config": ...}`` or
        ``{"llama_config": ...}``, the ``config.json`` as read.

    Raises:
        CheckpointError: naming the file and what is wrong.
        TypeError: for a ``folder`` that is not a path or a ``dtype`` that is not float32/64.
    """
    root, config_path, hf_config = open_folder(folder, dtype)
    kind = _kind(hf_config, str(config_path))
    read = llama.read_llama if kind == "llama" else _read_gpt2
    config, params = read(root, config_path, hf_config, dtype)
    return config, params, {f"{kind}_config": hf_config}


#: ``config.json``'s ``model_type`` -> what is read; and, for a config without one, the
#: ``architectures`` of each.
MODEL_TYPES = {"gpt2": ("GPT2LMHeadModel", "GPT2Model"),
               "llama": ("LlamaForCausalLM", "LlamaModel")}


def _kind(hf_config, source: str) -> str:
    if not isinstance(hf_config, Mapping):
        raise CheckpointError(f"{source} must hold a JSON object (a transformers config), got "
                              f"{type(hf_config).__name__}")
    kind = hf_config.get("model_type")
    if kind is None:
        architectures = hf_config.get("architectures") or []
        kind = next((k for k, names in MODEL_TYPES.items()
                     if any(a in names for a in architectures)), None)
    if kind not in MODEL_TYPES:
        raise CheckpointError(f"{source}: model_type is {hf_config.get('model_type')!r} "
                              f"(architectures {hf_config.get('architectures')!r}); the GPT reads "
                              f"GPT-2 ('gpt2') and LLaMA-architecture ('llama') checkpoints")
    return kind


def _read_gpt2(root: Path, config_path: Path, hf_config, dtype):
    """(config, params) of a GPT-2 folder whose config.json is ``hf_config``."""
    hf = _checked_hf_config(hf_config, str(config_path))
    config = _config(hf, dtype)
    names = gpt2_names(config.num_layers, config.tie_embeddings)
    shapes = parameter_shapes(config)  # GPT-2's tensors are the GPT's parameters, untransposed
    tensors = read_tensors(root, {theirs: shapes[ours] for ours, theirs in names.items()},
                           np.dtype(config.dtype), GPT2)
    return config, {ours: tensors[theirs] for ours, theirs in names.items()}


