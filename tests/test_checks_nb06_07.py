"""Notebook 06's and 07's checks: typical wrong implementations fail with the hint that names
the mistake, and the notebooks' variant exercises pass on their solutions."""

import math

import numpy as np
import pytest
import torch

from transformer_lab.checks import CheckFailed, check
from transformer_lab.core import blocks as CB
from transformer_lab.core import layers as CL
from transformer_lab.core import model as CM


def _fails(check_id, *functions):
    with pytest.raises(CheckFailed) as err:
        check(check_id, *functions)
    return str(err.value)


# --------------------------------------------------------------------------------------------
# Dropout, residuals, activations


def test_dropout_without_the_scale(monkeypatch):
    def no_scale(x, p, rng, train=True):
        if not train or p == 0:
            return x, None
        keep = rng.random(x.shape) >= p
        return x * keep, (keep, 1.0)
    monkeypatch.setattr(CL, "dropout_forward", no_scale)
    message = _fails("check-dropout")
    assert "case 'training, p = 0.1'" in message
    assert "without the 1/(1-p) scale on the kept entries" in message


def test_dropout_scaled_at_evaluation_time(monkeypatch):
    original = CL.dropout_forward

    def eval_scaled(x, p, rng, train=True):
        if not train:
            return x / (1 - p), ("eval", 1 / (1 - p))
        return original(x, p, rng, train)

    backward = CL.dropout_backward
    monkeypatch.setattr(CL, "dropout_forward", eval_scaled)
    monkeypatch.setattr(CL, "dropout_backward", lambda d, c: d * c[1] if c and isinstance(c[0], str)
                        else backward(d, c))
    message = _fails("check-dropout")
    assert "case 'evaluation (train=False): the identity'" in message
    assert "scaling in evaluation mode too" in message


def test_dropout_keeping_with_probability_p(monkeypatch):
    def inverse(x, p, rng, train=True):
        if not train or p == 0:
            return x, None
        keep = rng.random(x.shape) < p
        return x * keep / (1 - p), (keep, 1 / (1 - p))
    monkeypatch.setattr(CL, "dropout_forward", inverse)
    assert "keeping the entries where u < p" in _fails("check-dropout")


def test_residual_gradient_dropped(monkeypatch):
    original = CB.residual_backward

    def dropped(dout, cache, sublayer_backward):
        norm_first = cache[0]
        dx, g_norm, *rest = original(dout, cache, sublayer_backward)
        if norm_first:
            return dx - dout, g_norm, *rest
        ds, _ = CL.layer_norm_backward(dout, cache[1])
        return dx - ds, g_norm, *rest
    monkeypatch.setattr(CB, "residual_backward", dropped)
    message = _fails("check-residual")
    assert "case 'pre-norm, sublayer tanh(h W)'" in message
    assert "without the identity path in the backward pass" in message


def test_residual_norm_orders_swapped(monkeypatch):
    original = CB.residual_forward
    monkeypatch.setattr(CB, "residual_forward",
                        lambda x, sub, norm, norm_first, eps=1e-5:
                        original(x, sub, norm, not norm_first, eps))
    assert "pre-norm and post-norm swapped" in _fails("check-residual")


def test_gelu_tanh_instead_of_exact(monkeypatch):
    original = CL.gelu_forward
    monkeypatch.setattr(CL, "gelu_forward", lambda x, approximate="none": original(x, "tanh"))
    message = _fails("check-gelu")
    assert "case 'exact (erf), float64'" in message
    assert "with approximate='tanh' where 'none' is asked" in message


def test_gelu_derivative_without_the_product_rule(monkeypatch):
    def first_term_only(dout, cache):
        x, approximate, aux = cache
        return dout * aux if approximate == "none" else dout * 0.5 * (1 + aux)
    monkeypatch.setattr(CL, "gelu_backward", first_term_only)
    assert "only the first term of the derivative" in _fails("check-gelu")


def test_feed_forward_derivative_at_the_output(monkeypatch):
    original_backward = CL.activation_backward

    def at_output(dout, cache):
        activation, inner = cache
        if activation == "relu":
            return original_backward(dout, cache)
        x, approximate, _ = inner
        a = CL.gelu_forward(x, approximate)[0]
        return CL.gelu_backward(dout, CL.gelu_forward(a, approximate)[1])
    monkeypatch.setattr(CB, "activation_backward", at_output)  # as core.blocks calls it
    message = _fails("check-feed-forward")
    assert "case 'GELU, x (2, 3, 4), F = 6'" in message
    assert "derivative evaluated at its output" in message


# --------------------------------------------------------------------------------------------
# Initialisation, positions, embeddings, tied output


def test_init_bound_one_over_fan_in(monkeypatch):
    monkeypatch.setattr(CL, "init_uniform",
                        lambda fan_in, shape, rng: rng.uniform(-1 / fan_in, 1 / fan_in, shape))
    assert "bound 1/fan_in instead of 1/sqrt(fan_in)" in _fails("check-init")


def test_init_xavier_with_its_standard_deviation_as_bound(monkeypatch):
    def std_bound(fan_in, fan_out, rng):
        b = math.sqrt(2 / (fan_in + fan_out))
        return rng.uniform(-b, b, (fan_in, fan_out))
    monkeypatch.setattr(CL, "init_xavier", std_bound)
    message = _fails("check-init")
    assert "case 'init_xavier, (3, 7)'" in message and "Xavier's standard deviation" in message


def test_positional_encoding_in_halves(monkeypatch):
    original = CL.positional_encoding

    def halves(max_len, d_model, base=10000.0):
        pe = original(max_len, d_model, base)
        return np.concatenate([pe[:, 0::2], pe[:, 1::2]], axis=1)  # sines, then cosines
    monkeypatch.setattr(CL, "positional_encoding", halves)
    assert "sines in the first half" in _fails("check-positional-encoding")


def test_embedding_gradient_overwrites_repeated_ids(monkeypatch):
    def buffered(dx, cache):
        (ids, shape), scale, positions_shape = cache
        dtable = np.zeros(shape, dx.dtype)
        dtable[ids] += dx * scale
        dpositions = None
        if positions_shape is not None:
            dpositions = np.zeros(positions_shape, dx.dtype)
            dpositions[: dx.shape[1]] = dx.sum(axis=0)
        return dtable, dpositions
    monkeypatch.setattr(CM, "embed_backward", buffered)
    message = _fails("check-embed")
    assert "case 'scale sqrt(E), sinusoid-like table, repeated ids'" in message
    assert "np.add.at adds them all" in message


def test_embedding_gradient_without_the_scale(monkeypatch):
    original = CM.embed_backward

    def unscaled(dx, cache):
        dtable, dpositions = original(dx, cache)
        return dtable / cache[1], dpositions
    monkeypatch.setattr(CM, "embed_backward", unscaled)
    assert "without the scale in the table's gradient" in _fails("check-embed")


def test_tied_output_gradient_transposed(monkeypatch):
    original = CL.tied_output_backward

    def transposed(dout, cache):
        dx, grads = original(dout, cache)
        return dx, {"W": grads["W"].T}
    monkeypatch.setattr(CL, "tied_output_backward", transposed)
    assert "the table's gradient transposed" in _fails("check-tied-output")


# --------------------------------------------------------------------------------------------
# Layers, stacks, the model


def test_decoder_layer_memory_gradient_from_the_keys_only(monkeypatch):
    original = CB.residual_backward
    calls = []

    def keys_only(dout, cache, sublayer_backward):
        result = original(dout, cache, sublayer_backward)
        if len(result) == 5:  # the cross-attention: dx, g_norm, dkey, dvalue, g
            calls.append(1)
            dx, g_norm, dkey, dvalue, g = result
            return dx, g_norm, dkey, np.zeros_like(dvalue), g
        return result
    monkeypatch.setattr(CB, "residual_backward", keys_only)
    message = _fails("check-decoder-layer")
    assert calls and "memory's gradient from the keys only" in message


def test_decoder_stack_memory_gradient_of_the_last_layer_only(monkeypatch):
    original = CB.decoder_layer_backward
    seen = []

    def last_only(dout, cache):
        dx, dmemory, grads = original(dout, cache)
        seen.append(dmemory)
        return dx, (dmemory if len(seen) == 1 else np.zeros_like(dmemory)), grads
    monkeypatch.setattr(CB, "decoder_layer_backward", last_only)
    assert "memory's gradient of the last layer only" in _fails("check-decoder-stack")


def test_model_without_the_embedding_scale(monkeypatch):
    original = CM.embed_forward
    monkeypatch.setattr(CM, "embed_forward", lambda ids, table, positions=None, scale=1.0:
                        original(ids, table, positions, 1.0))
    message = _fails("check-transformer-forward")
    assert "without multiplying the token embeddings by sqrt(E)" in message


def test_model_backward_that_stops_at_the_memory(monkeypatch):
    original = CM.encoder_backward

    def nothing_into_the_encoder(dout, cache):
        return original(np.zeros_like(dout), cache)
    monkeypatch.setattr(CM, "encoder_backward", nothing_into_the_encoder)
    assert "without sending the memory's gradient into the encoder" in _fails(
        "check-transformer-backward")


def test_loss_averaged_over_every_position(monkeypatch):
    original = CM.cross_entropy_forward

    def over_all(logits, targets, ignore_index=-100, reduction="mean"):
        loss, cache = original(logits, targets, ignore_index, "sum")
        c_logp, safe, keep, _ = cache
        return loss / targets.size, (c_logp, safe, keep, 1 / targets.size)
    monkeypatch.setattr(CM, "cross_entropy_forward", over_all)
    assert "dividing by every position, ignored ones included" in _fails(
        "check-transformer-loss")


def test_a_stub_names_its_notebook_section(monkeypatch):
    from transformer_lab import syllabus

    message = syllabus.stub_message("tied_output_forward")

    def stub(x, W):
        raise NotImplementedError(message)
    monkeypatch.setattr(CL, "tied_output_forward", stub)
    assert _fails("check-tied-output") == f"check-tied-output: {message}"
    assert "notebook 08_transformer, section 4" in message


# --------------------------------------------------------------------------------------------
# The variants of notebook 09, with their bugs


def self_attention(x, W_qkv, b_qkv, W_o, b_o, num_heads, key_padding_mask=None,
                   bugs=()):
    batch, length, e = x.shape
    head_dim = e // num_heads
    q, k, v = (x @ W_qkv + b_qkv).chunk(3, dim=-1)
    q, k, v = (t.reshape(batch, length, num_heads, head_dim).transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(e if "scale" in bugs else head_dim)
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    context = torch.softmax(scores, dim=-1) @ v
    if "merge" not in bugs:
        context = context.transpose(1, 2)
    return context.reshape(batch, length, e) @ W_o + b_o


def smoothed_loss(logits, labels, pad_id, alpha, over_all=False):
    V = logits.shape[-1]
    z = logits - logits.max(axis=-1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    q = np.full(logits.shape, alpha / V)
    np.put_along_axis(q, labels[..., None], 1 - alpha + alpha / V, axis=-1)
    keep = labels != pad_id
    count = labels.size if over_all else keep.sum()
    loss = float(-(q * log_p).sum(axis=-1)[keep].sum() / count)
    return loss, (np.exp(log_p) - q) * (keep / count)[..., None]


def padded_positional_encoding(ids, pad_id, d_model, from_column=False):
    real = ids != pad_id
    positions = np.cumsum(real, axis=1) - 1
    if from_column:
        positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
    omega = 10000.0 ** (-np.arange(0, d_model, 2) / d_model)
    angles = np.maximum(positions, 0)[..., None] * omega
    out = np.empty(ids.shape + (d_model,))
    out[..., 0::2] = np.sin(angles)
    out[..., 1::2] = np.cos(angles[..., : d_model // 2])
    out[~real] = 0.0
    return out


def test_variants_name_their_mistakes():
    message = _fails("check-find-the-bug",
                     lambda *a, **k: self_attention(*a, **k, bugs=("scale",)))
    assert "case 'B=2, T=5, E=12, 3 heads'" in message and "divided by sqrt(E)" in message
    assert "merged by a reshape alone" in _fails(
        "check-find-the-bug", lambda *a, **k: self_attention(*a, **k, bugs=("merge",)))
    assert "padding included" in _fails(
        "check-label-smoothing", lambda *a: smoothed_loss(*a, over_all=True))
    assert "count the positions from each sequence's first real token" in _fails(
        "check-padded-positions", lambda *a: padded_positional_encoding(*a, from_column=True))


def test_find_the_bug_passes_with_one_head_even_with_both_bugs():
    """The notebook's point: with one head both bugs vanish -- the check's other cases catch
    them."""
    both = lambda *a, **k: self_attention(*a, **k, bugs=("scale", "merge"))  # noqa: E731
    message = _fails("check-find-the-bug", both)
    assert "case 'B=2, T=5, E=12, 3 heads'" in message and "with both bugs still in" in message


def test_a_cache_changed_without_an_error_is_named(monkeypatch):
    """np.add.at writes even into the read-only cache: the checks compare it after the run."""
    right = CL.cross_entropy_backward

    def backward(dloss, cache):
        dlogits = right(dloss, cache)
        c_logp = cache[0].reshape(-1, cache[0].shape[-1])
        np.add.at(c_logp, (np.arange(len(c_logp)), 0), -1.0)  # p - onehot, into the cache
        return dlogits
    monkeypatch.setattr(CL, "cross_entropy_backward", backward)
    message = _fails("check-cross-entropy")
    assert "CacheChanged" in message and "writes into an array that its forward" in message
