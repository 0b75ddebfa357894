"""The input checks and conventions of the Transformer models, shared by the NumPy model
(:mod:`transformer_lab.models.encoder_decoder`) and its PyTorch versions
(:mod:`transformer_lab.reference.torch_transformer`),
so that all of them accept and refuse exactly the same input with the same messages.

- :func:`check_ids`, :func:`check_padding_mask`, :func:`check_inputs`: a batch of token ids and
  its key padding masks;
- :func:`check_target`, :func:`label_mask`, :func:`loss_labels`, :func:`check_loss_inputs`: a
  target batch ``BOS y_1 ... y_n EOS`` + padding and the labels of the loss (:data:`IGNORE_INDEX`
  where a position does not count);
- :func:`check_decode_length`, :func:`decoded_sequences`: greedy decoding's length and result.

Everything here is importable from :mod:`transformer_lab.models.encoder_decoder` too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from transformer_lab import _validate as v
from transformer_lab import device

if TYPE_CHECKING:
    from transformer_lab.models.config import TransformerConfig

__all__ = ["IGNORE_INDEX", "length_limit", "check_ids", "check_padding_mask", "check_inputs",
           "check_target", "label_mask", "loss_labels", "check_loss_inputs",
           "check_decode_length", "decoded_sequences"]

#: Label of a position that does not count in the loss (padding, or after the first EOS).
IGNORE_INDEX = -1


def length_limit(config: TransformerConfig) -> int | None:
    """Longest sequence the model reads: ``config.max_len``, or None without a positional table."""
    return None if config.positional == "none" else config.max_len


def check_ids(ids, name: str, vocab_size: int, max_len: int | None = None, min_len: int = 1,
              config: str = "TransformerConfig") -> np.ndarray:
    """A batch of token ids, or a clear error naming ``name``.

    Args:
        ids: (B, T) integer token ids: a NumPy (or CuPy) array or a rectangular list of lists.
        name: the argument's name, for the messages.
        vocab_size: every id must be in [0, vocab_size).
        max_len: the longest T allowed (None: any); min_len: the shortest.
        config: the class whose ``max_len`` limits T, for the message.

    Returns:
        ids: (B, T) integer NumPy array (on the host), B >= 1, T >= min_len.
    """
    ids = v.token_ids(ids, name, vocab_size)
    if ids.ndim != 2:
        raise ValueError(f"{name} must have 2 dimensions (batch, length), got shape {ids.shape}")
    if ids.shape[0] == 0 or ids.shape[1] < min_len:
        raise ValueError(f"{name} must hold at least one sequence of at least {min_len} "
                         f"token{'s' * (min_len != 1)}, got shape {ids.shape}")
    if max_len is not None and ids.shape[1] > max_len:
        raise ValueError(f"{name} has {ids.shape[1]} positions but the positional encoding "
                         f"covers max_len={max_len} ({config}.max_len)")
    return ids


def check_padding_mask(mask, ids: np.ndarray, name: str, pad_id: int) -> np.ndarray:
    """A key padding mask (B, T) bool, True = padding, of the shape of ``ids``; None gives
    ``ids == pad_id``."""
    if mask is None:
        return ids == pad_id
    mask = device.to_host(mask)
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"{name} must be a NumPy bool array (True = padding), got "
                        f"{type(mask).__name__}")
    if mask.dtype != bool:
        raise TypeError(f"{name} must be a bool array (True = padding), got dtype {mask.dtype}")
    v.shape_is(mask, ids.shape, name, "the shape of the token ids")
    return mask


def _same_batch(src: np.ndarray, tgt: np.ndarray, tgt_name: str) -> None:
    if src.shape[0] != tgt.shape[0]:
        raise ValueError(f"src and {tgt_name} must have the same batch size, got "
                         f"{src.shape[0]} and {tgt.shape[0]}")


def check_inputs(config: TransformerConfig, src, tgt_in, src_key_padding_mask=None,
                 tgt_key_padding_mask=None) -> tuple[np.ndarray, ...]:
    """The arguments of a forward pass, checked: (src (B, S), tgt_in (B, T), src padding mask
    (B, S), tgt padding mask (B, T)), the masks defaulting to ``ids == pad_id``."""
    limit = length_limit(config)
    src = check_ids(src, "src", config.src_vocab_size, limit)
    tgt_in = check_ids(tgt_in, "tgt_in", config.tgt_vocab_size, limit)
    _same_batch(src, tgt_in, "tgt_in")
    src_kpm = check_padding_mask(src_key_padding_mask, src, "src_key_padding_mask",
                                 config.pad_id)
    tgt_kpm = check_padding_mask(tgt_key_padding_mask, tgt_in, "tgt_key_padding_mask",
                                 config.pad_id)
    return src, tgt_in, src_kpm, tgt_kpm


def check_target(config: TransformerConfig, tgt) -> np.ndarray:
    """A target batch (B, T): ``BOS y_1 ... y_n EOS`` then padding; the decoder reads T - 1."""
    tgt = check_ids(tgt, "tgt", config.tgt_vocab_size)
    if tgt.shape[1] < 2:
        raise ValueError(f"tgt must have at least 2 columns (BOS and one token to predict), "
                         f"got shape {tgt.shape}")
    limit = length_limit(config)
    if limit is not None and tgt.shape[1] - 1 > limit:
        raise ValueError(f"tgt has {tgt.shape[1]} positions: the decoder reads "
                         f"{tgt.shape[1] - 1} of them but the positional encoding covers "
                         f"max_len={limit} (TransformerConfig.max_len)")
    bad = np.flatnonzero(tgt[:, 0] != config.bos_id)
    if bad.size:
        raise ValueError(f"tgt must start every sequence with bos_id={config.bos_id}; "
                         f"sequence {bad[0]} starts with {tgt[bad[0], 0]}")
    return tgt


def label_mask(config: TransformerConfig, tgt: np.ndarray) -> np.ndarray:
    """(B, T-1) bool: which labels ``tgt[:, 1:]`` of a checked target batch count in the loss --
    those that are not padding and come no later than the first EOS of their sequence."""
    labels = tgt[:, 1:]
    is_eos = labels == config.eos_id
    after_eos = (np.cumsum(is_eos, axis=1) - is_eos) > 0
    return (labels != config.pad_id) & ~after_eos


def loss_labels(config: TransformerConfig, tgt: np.ndarray) -> np.ndarray:
    """(B, T-1) int labels of a checked target batch: ``tgt[:, 1:]``, with
    :data:`IGNORE_INDEX` where :func:`label_mask` is False."""
    keep = label_mask(config, tgt)
    if not keep.any():
        raise ValueError("tgt has no token to predict: every label is padding")
    return np.where(keep, tgt[:, 1:], IGNORE_INDEX)


def check_loss_inputs(config: TransformerConfig, src, tgt) -> tuple[np.ndarray, ...]:
    """The arguments of a loss, checked: (src (B, S), tgt (B, T), labels (B, T-1) as
    :func:`loss_labels` gives them)."""
    tgt = check_target(config, tgt)
    src = check_ids(src, "src", config.src_vocab_size, length_limit(config))
    _same_batch(src, tgt, "tgt")
    return src, tgt, loss_labels(config, tgt)


def check_decode_length(config: TransformerConfig, max_len) -> int:
    """The number of tokens greedy decoding may generate: ``max_len`` (default
    ``config.max_len``), at most the positional table's length."""
    if max_len is None:
        return config.max_len
    max_len = v.integer(max_len, "max_len", minimum=1)
    limit = length_limit(config)
    if limit is not None and max_len > limit:
        raise ValueError(f"max_len must be at most TransformerConfig.max_len={limit} (the "
                         f"positional encoding's length), got {max_len}")
    return max_len


def decoded_sequences(out: np.ndarray, eos_id: int, padded: bool):
    """What greedy decoding returns, from its buffer.

    Args:
        out: (B, 1 + steps) int64: BOS, then the generated tokens, padding after each EOS.
        eos_id: the end token.
        padded: return ``out`` itself.

    Returns:
        ``out``, or a list of B arrays: each sequence's tokens after BOS, up to and including
        its first EOS (all ``steps`` tokens when it has none).
    """
    if padded:
        return out
    ends = out[:, 1:] == eos_id
    lengths = np.where(ends.any(axis=1), ends.argmax(axis=1) + 1, out.shape[1] - 1)
    return [out[i, 1:1 + n].copy() for i, n in enumerate(lengths.tolist())]
