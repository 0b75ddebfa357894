"""The one checkpoint format of the models: a NumPy ``.npz`` file with one array per parameter
and a JSON header, no pickle.

    model.save("model.npz", metadata={"step": 3})     # a Transformer or a GPT
    Transformer.load("model.npz")                     # a model built from the stored config
    model.load_params("model.npz")                    # into an existing model, checked

The header holds the format version (:data:`CHECKPOINT_FORMAT`), the model's kind
("transformer" or "gpt"; files written before the kind was stored are encoder-decoders), the
config (:func:`~transformer_lab.models.config.config_to_dict`), the parameter names in order
and the metadata. Reading checks all of it and raises :class:`CheckpointError` (a
``ValueError``) with what is wrong: a file that is not a checkpoint, a damaged header, a
checkpoint of the other model, parameters that do not fit the model (the message names the
tensor and both shapes), values that are not finite, or a config that differs in a field that
changes the function the parameters compute (``norm_first``, ``activation``, ``eps``, ...).

:func:`write_archive` and :func:`read_archive` -- arrays plus a JSON header in one ``.npz`` --
are the file layout itself; the checks store their answers with them too.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Mapping

import numpy as np

from transformer_lab import device
from transformer_lab.models.config import config_from_dict, config_to_dict

__all__ = ["CHECKPOINT_FORMAT", "CheckpointError", "save", "load", "load_params",
           "read_checkpoint", "write_archive", "read_archive"]

#: Version of the checkpoint layout written by :func:`save`.
CHECKPOINT_FORMAT = 1
#: The kind of a checkpoint whose header names none (written before the GPT had checkpoints).
DEFAULT_KIND = "transformer"


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read, or does not fit the model it is loaded into."""


# --------------------------------------------------------------------------------------------
# The file layout: arrays and a JSON header in one .npz


def npz_path(path) -> str:
    path = os.path.expanduser(path)
    return path if path.endswith(".npz") else path + ".npz"


def write_archive(path, header, arrays: Mapping[str, np.ndarray], compress: bool = False) -> None:
    """Write ``arrays`` and ``header`` (anything JSON holds; a TypeError names what it cannot)
    to one ``.npz`` file at ``path``."""
    try:
        header_json = json.dumps(header)
    except TypeError as e:
        raise TypeError(f"metadata must hold only what JSON can store: {e}") from None
    with open(path, "wb") as f:
        (np.savez_compressed if compress else np.savez)(
            f, __header__=np.array(header_json), **arrays)


def read_archive(path) -> tuple[object, dict[str, np.ndarray]]:
    """(header, name -> array) of a file written by :func:`write_archive`, or a CheckpointError
    saying why it cannot be read."""
    file = os.path.expanduser(path)
    try:
        with open(file, "rb") as f:
            magic = f.read(6)
        loaded = np.load(file, allow_pickle=False) \
            if magic.startswith(b"PK") else None  # a zip file, as .npz archives are
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e}") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        held = "holds a single array (a .npy file), not" if magic == b"\x93NUMPY" else "is not"
        raise CheckpointError(f"{path} is not a transformer_lab checkpoint: it {held} a .npz "
                              f"archive (save one with model.save)")
    try:
        with loaded as f:
            if "__header__" not in f.files:
                raise CheckpointError(f"{path} is not a transformer_lab checkpoint (no header; "
                                      f"save one with model.save)")
            header = json.loads(str(f["__header__"]))
            arrays = {k: f[k] for k in f.files if k != "__header__"}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"cannot read checkpoint {path}: {e}") from None
    return header, arrays


# --------------------------------------------------------------------------------------------
# Writing and loading models


def save(model, path, metadata: Mapping | None = None) -> str:
    """:meth:`~transformer_lab.models.shell.Model.save` (the parameters compressed)."""
    path = npz_path(path)
    header = {"format": CHECKPOINT_FORMAT, "kind": model.kind,
              "config": config_to_dict(model.config), "names": list(model.params),
              "metadata": dict(metadata or {})}
    write_archive(path, header, {f"params/{name}": device.to_host(p)
                                 for name, p in model.params.items()}, compress=True)
    return path


def load(cls: type, path):
    """:meth:`~transformer_lab.models.shell.Model.load` for a model class ``cls``."""
    header, _ = read_checkpoint(path)
    kind = header.get("kind", DEFAULT_KIND)
    if kind != cls.kind:
        raise CheckpointError(f"{path} holds a {kind!r} checkpoint, not a {cls.kind!r} one "
                              f"(load it with the model class it was saved from)")
    model = cls(stored_config(path, header), seed=0)
    model.metadata = load_params(model, path)
    return model


def load_params(model, path) -> dict:
    """:meth:`~transformer_lab.models.shell.Model.load_params`: the stored parameters copied
    into ``model`` after every check; the stored metadata returned."""
    header, arrays = read_checkpoint(path)
    kind = header.get("kind", DEFAULT_KIND)
    if kind != model.kind:
        raise CheckpointError(f"{path} holds a {kind!r} checkpoint; this model is a "
                              f"{model.kind!r}")
    stored = stored_config(path, header)
    diffs = config_differences(stored, model.config)
    check_arrays(path, model.params, arrays, diffs)
    diffs.pop("dtype", None)  # a dtype difference is refused above, tensor by tensor
    if diffs:
        raise CheckpointError(
            f"{path} does not fit this model: the checkpoint's config differs in "
            f"{', '.join(diffs.values())}; its parameters have the right names and shapes "
            f"but would compute a different function here (load it with "
            f"{type(model).__name__}.load(path), which builds the model from the stored "
            f"config)")
    for name, p in model.params.items():
        p[...] = device.put(arrays[name])
    return header["metadata"]


# --------------------------------------------------------------------------------------------
# Reading and checking


def read_checkpoint(path) -> tuple[dict, dict[str, np.ndarray]]:
    """(header, name -> array) of a checkpoint file, or a CheckpointError saying what is wrong.

    The header is checked: a dict with this format version, a known "kind" (if any), a
    "config" dict, "names" (a list of strings, exactly the stored parameters) and a "metadata"
    dict.
    """
    header, stored = read_archive(path)
    arrays = {k[len("params/"):]: a for k, a in stored.items() if k.startswith("params/")}
    _check_header(path, header, arrays)
    return header, {name: arrays[name] for name in header["names"]}  # in the saved order


def _check_header(path, header, arrays: Mapping[str, np.ndarray]) -> None:
    if not isinstance(header, dict) or header.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path}: unknown checkpoint format "
                              f"{header.get('format') if isinstance(header, dict) else header!r}"
                              f" (this version reads format {CHECKPOINT_FORMAT})")
    if header.get("kind", DEFAULT_KIND) not in ("transformer", "gpt"):
        raise CheckpointError(f"{path}: damaged header: unknown model kind "
                              f"{header.get('kind')!r} (expected 'transformer' or 'gpt')")
    for key, kind in (("config", dict), ("names", list), ("metadata", dict)):
        if not isinstance(header.get(key), kind):
            raise CheckpointError(f"{path}: damaged header: {key!r} must be a {kind.__name__}, "
                                  f"got {header.get(key)!r}")
    names = header["names"]
    if not all(isinstance(n, str) for n in names) or sorted(names) != sorted(arrays):
        raise CheckpointError(f"{path}: damaged checkpoint: the header lists the parameters "
                              f"{names!r} but the file holds {sorted(arrays)}")


def stored_config(path, header: Mapping):
    """The config of a checkpoint's header, or a CheckpointError."""
    try:
        return config_from_dict(header["config"], header.get("kind", DEFAULT_KIND))
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: the stored configuration is not valid: {e}") from None


def config_differences(stored, config) -> dict[str, str]:
    """Field -> 'field=stored (model: ours)' for every field in which two configs differ."""
    theirs, ours = config_to_dict(stored), config_to_dict(config)
    return {k: f"{k}={theirs[k]!r} (model: {ours[k]!r})" for k in ours if theirs[k] != ours[k]}


def check_arrays(path, params: Mapping[str, np.ndarray], arrays: Mapping[str, np.ndarray],
                 diffs: Mapping[str, str]) -> None:
    """Names, shapes, dtypes and finiteness of the stored parameters ``arrays`` against a
    model's ``params``, or CheckpointError (``diffs``: the config differences, for the hint)."""
    missing = [n for n in params if n not in arrays]
    extra = [n for n in arrays if n not in params]
    hint = f"; the checkpoint's config differs in {', '.join(diffs.values())}" if diffs else ""
    if missing or extra:
        raise CheckpointError(
            f"{path} does not fit this model: missing parameters {missing[:5]}"
            f"{' ...' if len(missing) > 5 else ''}, unexpected parameters {extra[:5]}"
            f"{' ...' if len(extra) > 5 else ''}{hint}")
    for name, p in params.items():
        stored = arrays[name]
        if stored.shape != p.shape:
            raise CheckpointError(
                f"{path} does not fit this model: parameter {name!r} has shape "
                f"{stored.shape} in the checkpoint but {p.shape} in the model{hint}")
        if stored.dtype != p.dtype:
            raise CheckpointError(
                f"{path} does not fit this model: parameter {name!r} is {stored.dtype} in "
                f"the checkpoint but {p.dtype} in the model (convert the model with "
                f"model.astype(np.{stored.dtype}) first, or load with the model class's load)")
        if not np.all(np.isfinite(stored)):
            raise CheckpointError(f"{path}: parameter {name!r} contains NaN or infinity")
