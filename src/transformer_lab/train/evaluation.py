"""Scoring a model on (source, target) pairs: greedy decoding (:func:`evaluate`, the held-out
metrics) and teacher forcing (:func:`teacher_forced_accuracy`, early stopping)."""

from __future__ import annotations

from collections.abc import Sequence

from transformer_lab import device
from transformer_lab.datasets import tasks as D
from transformer_lab.models.encoder_decoder import Transformer


def evaluate(model: Transformer, pairs: Sequence[tuple], batch_size: int = 1000,
             max_len: int | None = None) -> dict:
    """Greedy-decode the sources of ``pairs`` ((source, target) token ids, no special tokens),
    ``batch_size`` at a time, at most ``max_len`` tokens each (default: longest target + 1, for
    EOS) -> ``{"exact_match", "token_accuracy", "predictions"}`` (one token tuple per pair,
    without special tokens)."""
    if len(pairs) == 0:
        raise ValueError("pairs must not be empty")
    if max_len is None:
        max_len = min(max(len(t) for _, t in pairs) + 1, model.config.max_len)
    preds: list[tuple] = []
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start:start + batch_size]
        out = model.greedy_decode(D.pad([s for s, _ in chunk]), max_len=max_len, padded=True)
        preds += [D.strip(p) for p in device.to_host(out)]
    targets = [t for _, t in pairs]
    return {"exact_match": D.exact_match(preds, targets),
            "token_accuracy": D.token_accuracy(preds, targets), "predictions": preds}


def teacher_forced_accuracy(model: Transformer, pairs: Sequence[tuple],
                            batch_size: int = 500) -> dict:
    """Exact match and token accuracy of the next-token predictions given the *true* prefix.

    One forward pass per batch instead of one per generated token. In exact arithmetic its
    exact match equals greedy decoding's (:func:`evaluate`): if the most likely token is right
    at every position given the right prefix, greedy decoding, which feeds back its own tokens,
    feeds back exactly the right prefix and produces the target -- and conversely. In floating
    point the two compute the same logits in different orders (one pass over the whole target
    against one pass per prefix, in batches padded differently), so a near-tie between the two
    most likely tokens can round differently and flip a sequence: rare, not impossible.
    (Token accuracy is higher than greedy decoding's: one early mistake does not derail the
    rest.) Used for early stopping.

    Returns:
        ``{"exact_match", "token_accuracy"}``.
    """
    if len(pairs) == 0:
        raise ValueError("pairs must not be empty")
    seqs = right = tokens = 0
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start:start + batch_size]
        src = D.pad([s for s, _ in chunk])
        tgt = D.pad([t for _, t in chunk], bos_eos=True)
        logits, _ = model.forward(src, tgt[:, :-1])
        keep = model.loss_mask(tgt)
        hit = (device.to_host(logits.argmax(axis=-1)) == tgt[:, 1:]) & keep
        seqs += int((hit | ~keep).all(axis=1).sum())
        right += int(hit.sum())
        tokens += int(keep.sum())
    return {"exact_match": seqs / len(pairs), "token_accuracy": right / tokens}
