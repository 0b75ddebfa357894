"""What the encoder-decoder and the GPT share: one flat dict of parameters (nested as the core
takes them by :func:`nest`, and back by :func:`flatten`), checked copies in and out, dtype
conversion, and checkpoints (:mod:`.checkpoints`).

A model class sets :attr:`Model.kind` (the checkpoint header's name for it) and
:attr:`Model.config_class`, writes ``_init_params(config, seed)`` and, where it keeps more than
the parameters (tables, templates), extends ``_setup``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar, NamedTuple

import numpy as np

from transformer_lab import _validate as v
from transformer_lab import device
from transformer_lab.models import checkpoints


def nest(flat: Mapping[str, np.ndarray]) -> dict:
    """``{"layers.0.attn.W_o": a}`` -> ``{"layers": [{"attn": {"W_o": a}}]}`` (the same arrays);
    a model's parameters (or gradients) as the core (``core.gpt``, ``core.model``) takes them."""
    root: dict = {}
    for name, value in flat.items():
        parts = name.split(".")
        node = root
        for part, nxt in zip(parts[:-1], parts[1:], strict=True):
            if nxt.isdigit():
                node = node.setdefault(part, [])
            elif part.isdigit():
                while len(node) <= int(part):
                    node.append({})
                node = node[int(part)]
            else:
                node = node.setdefault(part, {})
        node[parts[-1]] = value
    return root


def flatten(nested, prefix: str = "", out: dict | None = None) -> dict:
    """The inverse of :func:`nest`: dotted name -> array (the same arrays)."""
    out = {} if out is None else out
    items = nested.items() if isinstance(nested, dict) else enumerate(nested)
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, (dict, list)):
            flatten(value, name + ".", out)
        else:
            out[name] = value
    return out


class ModelCache(NamedTuple):
    """What a model's ``forward`` hands to its ``backward``: the core's cache, and the shape and
    dtype of the logits it was made for."""

    core: tuple
    shape: tuple
    dtype: np.dtype


class Model:
    """Base of :class:`~transformer_lab.models.encoder_decoder.Transformer` and
    :class:`~transformer_lab.models.gpt.GPT`.

    Args:
        config: an instance of the model's config class.
        seed: the initial parameters are a deterministic function of ``(config, seed)`` (and
            do not depend on ``config.dtype`` beyond rounding).

    Attributes:
        config: the configuration.
        params: name -> array, every parameter, on the device the core runs on when the model
            was made or loaded (:mod:`transformer_lab.device`).
        metadata: what the checkpoint a model was loaded from stored with it (else ``{}``).
    """

    kind: ClassVar[str] = ""
    config_class: ClassVar[type] = object

    def __init__(self, config, seed: int = 0):
        if not isinstance(config, self.config_class):
            raise TypeError(f"config must be a {self.config_class.__name__}, got "
                            f"{type(config).__name__}")
        self._setup(config, self._init_params(config, v.integer(seed, "seed", minimum=0)))

    @staticmethod
    def _init_params(config, seed: int) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def _setup(self, config, params: dict[str, np.ndarray]) -> None:
        self.config = config
        self.params: dict[str, np.ndarray] = {k: device.put(p) for k, p in params.items()}
        self._shapes = {k: p.shape for k, p in params.items()}
        self.metadata: dict = {}

    # ---------------------------------------------------------------------------- parameters

    def num_parameters(self) -> int:
        """Number of trainable scalars (a tied table counts once; a fixed sinusoidal table is
        not a parameter)."""
        return int(sum(p.size for p in self.params.values()))

    def set_params(self, new: Mapping[str, np.ndarray]) -> None:
        """Copy values into the parameter arrays, in place (any subset of the names).

        Every value is checked before anything is copied: a known name, the parameter's shape,
        real numbers (converted to the model's dtype), all finite.
        """
        checked = {name: self._checked_value(name, value) for name, value in new.items()}
        for name, value in checked.items():
            self.params[name][...] = device.put(value)

    def _checked_value(self, name: str, value) -> np.ndarray:
        if name not in self.params:
            raise KeyError(f"set_params: unknown parameter {name!r}")
        value = np.asarray(device.to_host(value))
        if value.dtype == bool or not np.issubdtype(value.dtype, np.number) or \
                np.issubdtype(value.dtype, np.complexfloating):
            raise TypeError(f"new[{name!r}] must hold real numbers, got dtype {value.dtype}")
        v.shape_is(value, self._shapes[name], f"new[{name!r}]")
        if not np.all(np.isfinite(value)):
            raise ValueError(f"new[{name!r}] contains NaN or infinity")
        return value

    def _checked_params(self) -> dict[str, np.ndarray]:
        """``self.params``, after checking that an optimiser or a user who assigned arrays left
        every parameter there, in its shape and the model's dtype, on the device the core runs on
        (a KeyError or ValueError naming it otherwise)."""
        dt = self.config.dtype
        for name, shape in self._shapes.items():
            p = self.params.get(name)
            if p is None:
                raise KeyError(f"model.params is missing {name!r}")
            if p.shape != shape or p.dtype != dt:
                raise ValueError(f"model.params[{name!r}] must be a {np.dtype(dt)} array of "
                                 f"shape {shape}, got {p.dtype} {p.shape}")
            v.on_device(p, f"model.params[{name!r}]", "make or load the model after "
                        "transformer_lab.device.use(...), or copy it there with model.copy()")
        return self.params

    def _flat(self, grads) -> dict[str, np.ndarray]:
        """The core's nested gradients under the names of ``self.params``, in their order."""
        flat = flatten(grads)
        return {k: flat[k] for k in self.params}

    def _checked_dlogits(self, dlogits, cache: ModelCache) -> np.ndarray:
        """``dlogits`` checked against the logits of the forward pass that made ``cache``, on the
        device."""
        v.cache_of(cache, f"{type(self).__name__}.backward", ModelCache)
        return device.put(v.grad_like(dlogits, "dlogits", cache.shape, cache.dtype,
                                      what="the logits of the forward pass"))

    def astype(self, dtype):
        """A copy of the model with its config and parameters in ``dtype`` (e.g. np.float64), on
        the device the core runs on now."""
        config = dataclasses.replace(self.config, dtype=dtype)
        twin = type(self).__new__(type(self))
        twin._setup(config, {k: p.astype(config.dtype) for k, p in self.params.items()})
        twin.metadata = dict(self.metadata)
        return twin

    def copy(self):
        """An independent copy (same config, parameters copied)."""
        return self.astype(self.config.dtype)

    # ---------------------------------------------------------------------------- checkpoints

    def save(self, path, metadata: Mapping | None = None) -> str:
        """Save the configuration, every parameter and ``metadata`` (anything JSON can hold, e.g.
        the training step) to a checkpoint (:mod:`.checkpoints`; ``.npz`` is appended to
        ``path`` if missing) -> the path written."""
        return checkpoints.save(self, path, metadata)

    @classmethod
    def load(cls, path):
        """A model with the configuration and parameters stored by :meth:`save` (the stored
        metadata in ``model.metadata``)."""
        return checkpoints.load(cls, path)

    def load_params(self, path) -> dict:
        """Copy the parameters stored by :meth:`save` into this model, in place, and return the
        metadata stored with them; nothing is copied from a file that does not fit this model
        (a :class:`~.checkpoints.CheckpointError` says why, :mod:`.checkpoints`), its config
        included: one that differs in any field but ``dtype`` would compute another function."""
        return checkpoints.load_params(self, path)
