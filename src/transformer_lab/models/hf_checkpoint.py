"""A checkpoint folder as Hugging Face ``transformers`` writes it -- ``config.json`` and
``model.safetensors``, or the shards a ``model.safetensors.index.json`` lists -- opened, its
tensors read, checked and converted to the dtype asked for. What the tensors mean is the
architecture's: GPT-2's in :mod:`.pretrained`, LLaMA's in :mod:`.llama`, each a :class:`Layout`
and the shapes its config asks for.

Tensors stored as float16, bfloat16, float32 or float64 are read. bfloat16, which NumPy has no
type for (and ``safetensors``' NumPy API refuses), is float32's upper 16 bits: it is read from
the file's bytes and widened exactly (:func:`bfloat16_tensor`). ``safetensors`` is imported when
a checkpoint is read, so the package imports without it. Every problem is a
:class:`~.checkpoints.CheckpointError` naming the file and what is wrong.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from transformer_lab import _validate as v
from transformer_lab.models.checkpoints import CheckpointError

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"  # a checkpoint saved in shards
LM_HEAD = "lm_head.weight"  # the untied output projection, stored without the model's prefix
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



# --------------------------------------------------------------------------------------------
# config.json's fields


def positive_integers(hf: Mapping, keys, source: str) -> None:
    """A CheckpointError naming ``source`` and the first of ``keys`` whose value in ``hf`` is
    not a positive integer."""
    for key in keys:
        value = hf[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{source}: {key} must be a positive integer, got {value!r}")


def small_positive(hf: Mapping, key: str, source: str) -> float:
    """``hf[key]``, a number in (0, 1) (a normalisation's epsilon), or a CheckpointError."""
    eps = hf[key]
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise CheckpointError(f"{source}: {key} must be a small positive number, got {eps!r}")
    return eps


# --------------------------------------------------------------------------------------------
# The folder and its tensors


def open_folder(folder, dtype) -> tuple[Path, Path, object]:
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
