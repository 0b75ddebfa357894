"""The field's checkpoints in the NumPy GPT: a folder as Hugging Face ``transformers`` writes it
(``config.json`` and ``model.safetensors``, or the shards a ``model.safetensors.index.json``
lists) read into a :class:`~.config.GPTConfig` and the GPT's parameters.
:meth:`transformer_lab.models.gpt.GPT.from_pretrained` calls :func:`read_pretrained`, which
reads ``config.json``'s ``model_type`` (or, without one, its ``architectures``) and reads a GPT-2
checkpoint (``"gpt2"``: this module, below) or a LLaMA-architecture one (``"llama"``:
:mod:`transformer_lab.models.llama`, which says how LLaMA maps onto the GPT)::

    from transformer_lab.models.gpt import GPT
    model = GPT.from_pretrained("~/.cache/huggingface/hub/models--gpt2/snapshots/<hash>")
    logits, _ = model.forward(ids)          # GPT-2's logits, (B, T, 50257)

GPT-2 *is* the course's GPT with the 2017 block (``GPTConfig.classic``): pre-norm layer norms
with biases, learned positions, biases in every linear map, GELU in its tanh form, the output
projection tied to the token embeddings (or, with ``tie_word_embeddings: false``, an
``lm_head`` of its own). Its config maps onto the GPT's as

    vocab_size -> vocab_size, n_embd -> d_model, n_head -> num_heads, n_layer -> num_layers,
    n_inner -> d_ff (None: 4 n_embd), n_positions -> max_len, layer_norm_epsilon -> eps,
    activation_function "gelu_new" / "gelu_pytorch_tanh" -> mlp "gelu_tanh"
    ("gelu" -> "gelu", "relu" -> "relu"), tie_word_embeddings -> tie_embeddings

and its tensors (named with a ``transformer.`` prefix, as ``GPT2LMHeadModel`` saves them, or
without, as ``GPT2Model`` and the checkpoints on the Hub do) onto the GPT's parameters as

    wte.weight (V, E)                        embed.W (also the output projection: tied)
    wpe.weight (n_positions, E)              pos.W
    h.N.ln_1.weight, .bias                   layers.N.norm1.gamma, .beta
    h.N.attn.c_attn.weight (E, 3E), .bias    layers.N.attn.W_qkv, .b_qkv
    h.N.attn.c_proj.weight (E, E), .bias     layers.N.attn.W_o, .b_o
    h.N.ln_2.weight, .bias                   layers.N.norm2.gamma, .beta
    h.N.mlp.c_fc.weight (E, F), .bias        layers.N.mlp.W1, .b1
    h.N.mlp.c_proj.weight (F, E), .bias      layers.N.mlp.W2, .b2
    ln_f.weight, .bias                       norm.gamma, .beta
    lm_head.weight (V, E), untied only       lm_head.W

No weight is transposed: GPT-2's linear maps are ``Conv1D`` modules, which store their weight
as (in, out) and compute ``x @ W + b`` -- the GPT's layout (``nn.Linear`` would store
(out, in)). ``c_attn``'s columns are the queries, the keys and the values side by side, each
split into heads in order, as ``W_qkv``'s. The attention's causal-mask buffers that older
checkpoints store (``h.N.attn.bias``, ``h.N.attn.masked_bias``) are not parameters and are
skipped; an ``lm_head.weight`` stored beside tied embeddings must equal ``wte.weight``.

Anything else is refused with a :class:`~.checkpoints.CheckpointError` (a ``ValueError``)
naming the file and what is wrong: a missing folder or file, a config of another model
(``model_type``), options that compute another function (``scale_attn_weights=False``,
``scale_attn_by_inverse_layer_idx``, ``add_cross_attention``, another activation), missing,
unexpected or misshapen tensors, or values that are not finite. ``reorder_and_upcast_attn`` is
accepted: it only changes the order and precision of the attention's arithmetic in
mixed-precision training, not the function. Fields missing from ``config.json`` take
``transformers.GPT2Config``'s defaults (:data:`GPT2_DEFAULTS`), as ``transformers`` does.

Tensors stored as float16, bfloat16, float32 or float64 are converted to the dtype asked for:
bfloat16, which NumPy has no type for (and ``safetensors``' NumPy API refuses), is float32's
upper 16 bits, so it is read from the file's bytes and widened exactly (:func:`bfloat16_tensor`).
``safetensors`` (its NumPy API) is imported when a checkpoint is read, so the package imports
without it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from transformer_lab import _validate as v
from transformer_lab.models import llama
from transformer_lab.models.checkpoints import CheckpointError
from transformer_lab.models.config import GPTConfig

__all__ = ["GPT2_DEFAULTS", "GPT2_ACTIVATIONS", "read_pretrained", "gpt2_config", "gpt2_names",
           "bfloat16_tensor"]

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

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"  # a checkpoint saved in shards
LM_HEAD = "lm_head.weight"  # the untied output projection, stored without the model's prefix
BUFFERS = ("attn.bias", "attn.masked_bias")  # GPT-2's causal mask in older checkpoints

_SIZES = ("vocab_size", "n_embd", "n_head", "n_layer", "n_positions")
_LAYER = {"ln_1.weight": "norm1.gamma", "ln_1.bias": "norm1.beta",
          "attn.c_attn.weight": "attn.W_qkv", "attn.c_attn.bias": "attn.b_qkv",
          "attn.c_proj.weight": "attn.W_o", "attn.c_proj.bias": "attn.b_o",
          "ln_2.weight": "norm2.gamma", "ln_2.bias": "norm2.beta",
          "mlp.c_fc.weight": "mlp.W1", "mlp.c_fc.bias": "mlp.b1",
          "mlp.c_proj.weight": "mlp.W2", "mlp.c_proj.bias": "mlp.b2"}
_NUMPY_DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64}
_BF16 = "BF16"


@dataclasses.dataclass(frozen=True)
class Layout:
    """How one architecture's checkpoint is read: its name in messages, the prefix of its
    tensor names (``GPT2LMHeadModel``'s ``transformer.``, ``LlamaForCausalLM``'s ``model.``;
    checkpoints of the bare model have none), its token embedding table (which a tied
    ``lm_head.weight`` must equal), and which stored names are buffers, not parameters."""

    name: str
    prefix: str
    embedding: str
    is_buffer: Callable[[str], bool]


def _gpt2_buffer(name: str) -> bool:
    return name.startswith("h.") and name.endswith(BUFFERS) and name.split(".")[1].isdigit()


GPT2 = Layout("GPT-2", "transformer.", "wte.weight", _gpt2_buffer)
LLAMA = Layout("LLaMA", "model.", "embed_tokens.weight", llama.is_buffer)


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


def _gpt2_shapes(hf: Mapping) -> dict[str, tuple]:
    """GPT-2's tensor name -> the shape its config asks for."""
    E, F, V, L = hf["n_embd"], hf["n_inner"] or 4 * hf["n_embd"], hf["vocab_size"], \
        hf["n_positions"]
    layer = {"ln_1.weight": (E,), "ln_1.bias": (E,), "attn.c_attn.weight": (E, 3 * E),
             "attn.c_attn.bias": (3 * E,), "attn.c_proj.weight": (E, E),
             "attn.c_proj.bias": (E,), "ln_2.weight": (E,), "ln_2.bias": (E,),
             "mlp.c_fc.weight": (E, F), "mlp.c_fc.bias": (F,), "mlp.c_proj.weight": (F, E),
             "mlp.c_proj.bias": (E,)}
    shapes = {"wte.weight": (V, E), "wpe.weight": (L, E)}
    for i in range(hf["n_layer"]):
        shapes.update({f"h.{i}.{k}": s for k, s in layer.items()})
    shapes.update({"ln_f.weight": (E,), "ln_f.bias": (E,)})
    if not hf["tie_word_embeddings"]:
        shapes[LM_HEAD] = (V, E)
    return shapes


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
    for key in (*_SIZES, "n_inner"):
        value = hf[key]
        if key == "n_inner" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{source}: {key} must be a positive integer, got {value!r}")
    if hf["n_embd"] % hf["n_head"]:
        raise CheckpointError(f"{source}: n_embd must be divisible by n_head, got n_embd="
                              f"{hf['n_embd']} and n_head={hf['n_head']}")
    eps = hf["layer_norm_epsilon"]
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise CheckpointError(f"{source}: layer_norm_epsilon must be a small positive number, "
                              f"got {eps!r}")
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
        ``transformer_lab.models.gpt.parameter_shapes(config)``; ``{"gpt2_config": ...}`` or
        ``{"llama_config": ...}``, the ``config.json`` as read.

    Raises:
        CheckpointError: naming the file and what is wrong.
        TypeError: for a ``folder`` that is not a path or a ``dtype`` that is not float32/64.
    """
    root, config_path, hf_config = _open(folder, dtype)
    kind = _kind(hf_config, str(config_path))
    if kind == "llama":
        config, params = _read_llama(root, config_path, hf_config, dtype)
    else:
        config, params = _read_gpt2(root, config_path, hf_config, dtype)
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
    hf = _checked_hf_config(hf_config, str(config_path))
    config = _config(hf, dtype)
    tensors = read_tensors(root, _gpt2_shapes(hf), np.dtype(config.dtype), GPT2)
    names = gpt2_names(config.num_layers, config.tie_embeddings)
    return config, {ours: tensors[theirs] for ours, theirs in names.items()}


def _read_llama(root: Path, config_path: Path, hf_config, dtype):
    hf = llama.checked_llama_config(hf_config, str(config_path))
    config = llama.llama_config(hf, dtype)
    tensors = read_tensors(root, llama.llama_shapes(hf), np.dtype(config.dtype), LLAMA)
    return config, llama.llama_params(tensors, config)


def _open(folder, dtype) -> tuple[Path, Path, object]:
    """(the folder, its config.json, the JSON it holds), or the error naming what is wrong."""
    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"folder must be a path (str or os.PathLike), got "
                        f"{type(folder).__name__}")
    v.float_dtype(dtype, "dtype")
    root = Path(folder).expanduser()
    if not root.exists():
        raise CheckpointError(f"{folder}: no such folder (a transformers checkpoint folder "
                              f"holds {CONFIG_FILE} and {WEIGHTS_FILE})")
    if not root.is_dir():
        raise CheckpointError(f"{folder} is a file, not a folder: pass the folder that holds "
                              f"{CONFIG_FILE} and {WEIGHTS_FILE}")
    config_path = root / CONFIG_FILE
    if not config_path.is_file():
        raise CheckpointError(f"{config_path}: missing (a checkpoint folder as transformers' "
                              f"save_pretrained writes it holds {CONFIG_FILE} and "
                              f"{WEIGHTS_FILE})")
    try:
        return root, config_path, json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{config_path}: cannot read it as JSON: {e}") from None


def _weight_files(root: Path) -> list[Path]:
    """The safetensors files of the checkpoint: model.safetensors, or the index's shards."""
    single, index = root / WEIGHTS_FILE, root / INDEX_FILE
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError,
                AttributeError) as e:
            raise CheckpointError(f"{index}: not a safetensors index (it needs a "
                                  f"'weight_map' of tensor names to files): {e!r}") from None
        for shard in shards:
            if not (root / shard).is_file():
                raise CheckpointError(f"{index} lists {shard}, which is missing from {root}")
        return [root / shard for shard in shards]
    others = sorted(p.name for p in root.iterdir() if p.suffix in (".bin", ".h5", ".msgpack"))
    hint = (f"; it holds {', '.join(others)}, which need PyTorch's pickle or another framework "
            f"(save the model again with transformers' save_pretrained, which writes "
            f"safetensors)") if others else ""
    raise CheckpointError(f"{single}: missing (the weights are read from safetensors "
                          f"files){hint}")


def _safe_open():
    try:
        from safetensors import SafetensorError, safe_open
    except ImportError:
        raise ImportError("GPT.from_pretrained reads model.safetensors with the safetensors "
                          "package: pip install safetensors (pinned in requirements.txt)") \
            from None
    return safe_open, SafetensorError


def read_tensors(root: Path, shapes: Mapping[str, tuple], dtype: np.dtype,
                 layout: Layout) -> dict[str, np.ndarray]:
    """The checkpoint's tensors in ``root`` (model.safetensors or its shards): tensor name
    (without ``layout.prefix``) -> array in ``dtype``, every one of ``shapes``, checked. An
    ``lm_head.weight`` that ``shapes`` does not ask for (tied embeddings) must equal the
    embedding table."""
    safe_open, SafetensorError = _safe_open()
    files = _weight_files(root)
    found: dict[str, tuple[Path, str]] = {}  # name without prefix -> (file, stored name)
    unexpected, tied_head = [], None
    for path in files:
        try:
            with safe_open(str(path), framework="np") as f:
                keys = list(f.keys())  # noqa: SIM118 (a safetensors handle, not a dict)
        except (OSError, SafetensorError) as e:
            raise CheckpointError(f"{path}: cannot read it as a safetensors file: {e}") from None
        for key in keys:
            name = key.removeprefix(layout.prefix)
            if key == LM_HEAD and LM_HEAD not in shapes:
                tied_head = (path, key)
            elif name in shapes and name not in found:
                found[name] = (path, key)
            elif not layout.is_buffer(name):
                unexpected.append(key)
    where = files[0] if len(files) == 1 else root
    missing = [n for n in shapes if n not in found]
    if missing or unexpected:
        raise CheckpointError(
            f"{where} does not hold {layout.name}'s tensors for its {CONFIG_FILE}: missing "
            f"{missing[:5]}{' ...' if len(missing) > 5 else ''}, unexpected "
            f"{unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")
    prefixes = {key.startswith(layout.prefix) for name, (_, key) in found.items()
                if name != LM_HEAD}
    if len(prefixes) > 1:
        raise CheckpointError(f"{where} mixes tensor names with and without the "
                              f"'{layout.prefix}' prefix")
    if tied_head is not None:
        found["tied " + LM_HEAD] = tied_head
    tensors = {}
    for path in files:  # each file opened once
        try:
            with safe_open(str(path), framework="np") as f:
                for name, (_, key) in ((n, pk) for n, pk in found.items() if pk[0] == path):
                    shape = shapes[layout.embedding if name == "tied " + LM_HEAD else name]
                    tensors[name] = _tensor(f, path, key, shape, dtype)
        except (OSError, SafetensorError) as e:
            raise CheckpointError(f"{path}: cannot read it as a safetensors file: {e}") from None
    if tied_head is not None and not np.array_equal(tensors.pop("tied " + LM_HEAD),
                                                    tensors[layout.embedding]):
        raise CheckpointError(f"{tied_head[0]}: {LM_HEAD} differs from {layout.embedding}: "
                              f"{CONFIG_FILE} ties the output projection to the token "
                              f"embeddings (tie_word_embeddings), so an lm_head of its own "
                              f"cannot load")
    return tensors


def _tensor(f, path: Path, key: str, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """One tensor of the open file ``f``, checked (stored type, shape, finite) and converted
    to ``dtype``."""
    sl = f.get_slice(key)
    stored = sl.get_dtype()
    if stored not in _NUMPY_DTYPES and stored != _BF16:
        raise CheckpointError(f"{path}: tensor {key!r} is stored as {stored}; only F16, BF16, "
                              f"F32 and F64 are read")
    got = tuple(sl.get_shape())
    if got != shape:
        raise CheckpointError(f"{path}: tensor {key!r} has shape {got} but the config asks "
                              f"for {shape}")
    value = bfloat16_tensor(path, key) if stored == _BF16 else f.get_tensor(key)
    value = np.ascontiguousarray(value, dtype=dtype)
    if not np.all(np.isfinite(value)):
        raise CheckpointError(f"{path}: tensor {key!r} contains NaN or infinity")
    return value


def bfloat16_tensor(path, key: str) -> np.ndarray:
    """The bfloat16 tensor ``key`` of the safetensors file ``path`` as float32, exactly.

    A safetensors file is an 8-byte little-endian header length, the JSON header (each
    tensor's ``dtype``, ``shape`` and ``data_offsets`` into the data after the header), then
    the data. A bfloat16 number is the upper 16 bits of the float32 with the same sign,
    exponent and leading 7 bits of mantissa: shifted up by 16 bits, each stored 16-bit word is
    that float32's bit pattern.
    """
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        entry = json.loads(f.read(size))[key]
        begin, end = entry["data_offsets"]
        f.seek(8 + size + begin)
        halves = np.frombuffer(f.read(end - begin), dtype="<u2")
    return (halves.astype("<u4") << 16).view("<f4").reshape(entry["shape"])
