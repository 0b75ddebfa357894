"""The checks of notebooks 04 and 05: typical wrong implementations fail with the hint that
names their mistake, and the PyTorch references the checks use agree with PyTorch's own
modules."""

import math

import numpy as np
import pytest
from handout_tools import check_as_in_handout

from transformer_lab.checks import CheckFailed, check
from transformer_lab.checks import nb05_attention_backward as N5
from transformer_lab.core import attention as CA
from transformer_lab.core import layers as CL
from transformer_lab.core import multihead as CM


def _fails(check_id, *functions):
    with pytest.raises(CheckFailed) as err:
        check(check_id, *functions)
    return str(err.value)


# --------------------------------------------------------------------------------------------
# Notebook 04


def test_split_without_the_axis_swap(monkeypatch):
    def no_swap(x, num_heads):
        b, t, e = x.shape
        return x.reshape(b, num_heads, t, e // num_heads)
    monkeypatch.setattr(CM, "split_heads", no_swap)
    message = _fails("check-split-heads")
    assert "case 'B = 2, T = 3, E = 8, 2 heads'" in message
    assert "without swapping the time and head axes" in message


def test_merge_with_interleaved_heads(monkeypatch):
    monkeypatch.setattr(CM, "merge_heads", lambda x: x.transpose(0, 2, 3, 1).reshape(
        x.shape[0], x.shape[2], -1))
    assert "the heads interleaved" in _fails("check-merge-heads")


def test_mha_forward_without_the_scale(monkeypatch):
    original = CM.attention_forward
    monkeypatch.setattr(CM, "attention_forward",
                        lambda q, k, v, mask=None, scale=None: original(q, k, v, mask, 1.0))
    message = _fails("check-mha-forward")
    assert "case 'one head (h = 1), S != T'" in message
    assert "without the scale 1/sqrt(d_h)" in message


def test_mha_forward_scaled_by_the_model_width(monkeypatch):
    original = CM.attention_forward
    width = {}

    def by_e(q, k, v, mask=None, scale=None):
        return original(q, k, v, mask, 1 / math.sqrt(width["E"]))

    def forward(query, key, value, params, num_heads, mask=None):
        width["E"] = query.shape[-1]
        return CM.__dict__["_saved"](query, key, value, params, num_heads, mask)

    monkeypatch.setitem(CM.__dict__, "_saved", CM.multi_head_attention_forward)
    monkeypatch.setattr(CM, "attention_forward", by_e)
    monkeypatch.setattr(CM, "multi_head_attention_forward", forward)
    message = _fails("check-mha-forward")
    assert "case '2 heads, self-attention (query = key = value)'" in message  # h = 1 passes
    assert "1/sqrt(E) instead of 1/sqrt(d_h)" in message


def test_merge_masks_with_and_and_on_the_query_axis(monkeypatch):
    def with_and(attn_mask=None, key_padding_mask=None):
        if attn_mask is None or key_padding_mask is None:
            return CA.__dict__["_saved"](attn_mask, key_padding_mask)
        return attn_mask & key_padding_mask[:, None, None, :]

    def on_queries(attn_mask=None, key_padding_mask=None):
        if attn_mask is None or key_padding_mask is None:
            return CA.__dict__["_saved"](attn_mask, key_padding_mask)
        return attn_mask | key_padding_mask[:, None, :, None]

    monkeypatch.setitem(CA.__dict__, "_saved", CA.merge_masks)
    monkeypatch.setattr(CA, "merge_masks", with_and)
    message = _fails("check-merge-masks")
    assert "entries differ" in message and "combining the masks with &" in message
    monkeypatch.setattr(CA, "merge_masks", on_queries)
    assert "blocking the padded queries" in _fails("check-merge-masks")
    monkeypatch.setattr(CA, "merge_masks", lambda a=None, k=None: None if k is None else k.T)
    assert "does not broadcast to the scores" in _fails("check-merge-masks")


def test_self_attention_cut_per_head(monkeypatch):
    def per_head(x, params, num_heads, mask=None):
        e = x.shape[-1]
        perm = np.arange(3 * e).reshape(3, num_heads, e // num_heads).transpose(1, 0, 2).ravel()
        inv = np.argsort(perm)  # read W_qkv's columns as if they were [q_i | k_i | v_i] per head
        p = dict(params, W_qkv=params["W_qkv"][:, inv])
        if "b_qkv" in params:
            p["b_qkv"] = params["b_qkv"][inv]
        return CM.__dict__["_saved"](x, p, num_heads, mask)

    monkeypatch.setitem(CM.__dict__, "_saved", CM.self_attention_forward)
    monkeypatch.setattr(CM, "self_attention_forward", per_head)
    message = _fails("check-self-attention-forward")
    assert "case '2 heads'" in message and "[q_i | k_i | v_i]" in message


def _gqa(x, W_q, W_k, W_v, W_o, num_heads, num_kv_heads, repeat=np.repeat):
    b, t, e = x.shape
    h, g, d = num_heads, num_kv_heads, e // num_heads
    q = (x @ W_q).reshape(b, t, h, d).transpose(0, 2, 1, 3)
    k = (x @ W_k).reshape(b, t, g, d).transpose(0, 2, 1, 3)
    v = (x @ W_v).reshape(b, t, g, d).transpose(0, 2, 1, 3)
    if repeat is np.repeat:
        k, v = np.repeat(k, h // g, axis=1), np.repeat(v, h // g, axis=1)
    else:
        k, v = np.tile(k, (1, h // g, 1, 1)), np.tile(v, (1, h // g, 1, 1))
    out, _ = CA.attention_forward(q, k, v)
    return out.transpose(0, 2, 1, 3).reshape(b, t, e) @ W_o


def test_the_grouped_query_variants_name_their_mistakes():
    message = _fails("check-gqa", lambda *a: _gqa(*a, repeat=np.tile))
    assert "case 'h = 4, g = 2: two groups of two query heads'" in message
    assert "consecutive query heads" in message and "np.tile" in message
    message = _fails("check-gqa-cost", lambda E, h, g, T: (4 * E * E + 4 * E,
                                                           8 * T * E * E + 4 * T * T * E))
    assert "multi-query, g = 1" in message and "multi-head formulas" in message


# --------------------------------------------------------------------------------------------
# Notebook 05


def test_softmax_backward_mistakes(monkeypatch):
    monkeypatch.setattr(CL, "softmax_backward", lambda dout, y, out=None: dout * y * (1 - y))
    assert "only the diagonal of the Jacobian" in _fails("check-softmax-backward")
    monkeypatch.setattr(CL, "softmax_backward",
                        lambda dout, y, out=None: y * (dout - (dout * y).sum(axis=-1)))
    message = _fails("check-softmax-backward")  # 1-D passes; (3, 5) cannot broadcast
    assert "case 'a batch of rows (3, 5)'" in message and "your code raised ValueError" in message


def test_attention_backward_without_the_scale(monkeypatch):
    original = CA.attention_backward

    def no_scale(dout, cache, dweights=None):
        q, k, v, weights, scale = cache
        return original(dout, (q, k, v, weights, 1.0), dweights)
    monkeypatch.setattr(CA, "attention_backward", no_scale)
    message = _fails("check-attention-backward")
    assert "output['dq']" in message and "without the scale in dq and dk" in message


def test_attention_backward_ignoring_dweights(monkeypatch):
    original = CA.attention_backward
    monkeypatch.setattr(CA, "attention_backward",
                        lambda dout, cache, dweights=None: original(dout, cache))
    message = _fails("check-attention-backward")
    assert "dweights: a loss on the attention weights too" in message
    assert "ignoring dweights" in message


def test_mha_backward_averaged_over_the_batch(monkeypatch):
    original = CM.multi_head_attention_backward

    def averaged(dout, cache, dweights=None):
        dq, dk, dv, grads = original(dout, cache, dweights)
        return dq, dk, dv, {k: g / dout.shape[0] for k, g in grads.items()}
    monkeypatch.setattr(CM, "multi_head_attention_backward", averaged)
    message = _fails("check-mha-backward")
    assert "averaging the parameter gradients over the batch instead of summing" in message


def test_a_wrong_key_bias_gradient_is_not_hidden_as_noise(monkeypatch):
    original = CM.multi_head_attention_backward

    def wrong_bk(dout, cache, dweights=None):
        dq, dk, dv, grads = original(dout, cache, dweights)
        if "b_k" in grads:
            grads["b_k"] = grads["b_q"].copy()
        return dq, dk, dv, grads
    monkeypatch.setattr(CM, "multi_head_attention_backward", wrong_bk)
    assert "output['grads']['b_k']" in _fails("check-mha-backward")


def test_self_attention_backward_without_the_key_path(monkeypatch):
    original = CM.self_attention_backward

    def no_key_path(dout, cache, dweights=None):
        dx, grads = original(dout, cache, dweights)
        c_qkv, c_att, c_o, num_heads = cache
        dheads, _ = CL.linear_backward(dout, c_o)
        _, dk, _ = CA.attention_backward(CM.split_heads(dheads, num_heads), c_att, dweights)
        w = c_qkv[1]
        e = w.shape[0]
        return dx - CM.merge_heads(dk) @ w[:, e:2 * e].T, grads
    monkeypatch.setattr(CM, "self_attention_backward", no_key_path)
    message = _fails("check-self-attention-backward")
    assert "output['dx']" in message and "forgetting the key path" in message


def test_layer_norm_mistakes(monkeypatch):
    original = CL.layer_norm_backward

    def averaged(dout, cache):
        dx, grads = original(dout, cache)
        rows = dout.size // dout.shape[-1]
        return dx, {k: g / rows for k, g in grads.items()}
    monkeypatch.setattr(CL, "layer_norm_backward", averaged)
    assert "averaging dgamma and dbeta" in _fails("check-layer-norm-backward")

    def unbiased(x, gamma=None, beta=None, eps=1e-5):
        d = x.shape[-1]
        xc = x - x.mean(axis=-1, keepdims=True)
        xhat = xc / np.sqrt((xc * xc).sum(axis=-1, keepdims=True) / (d - 1) + eps)
        out = xhat * gamma if gamma is not None else xhat
        return (out + beta if beta is not None else out), None
    monkeypatch.setattr(CL, "layer_norm_forward", unbiased)
    assert "unbiased variance" in _fails("check-layer-norm-forward")


def test_log_softmax_backward_with_softmax_formula(monkeypatch):
    def softmax_formula(dout, out):
        p = np.exp(out)
        return p * (dout - (dout * p).sum(axis=-1, keepdims=True))
    monkeypatch.setattr(CL, "log_softmax_backward", softmax_formula)
    assert "with the backward of softmax" in _fails("check-log-softmax")


def test_cross_entropy_mean_over_all_tokens(monkeypatch):
    original = CL.cross_entropy_forward

    def over_all(logits, targets, ignore_index=-100, reduction="mean"):
        loss, (c_logp, safe, keep, weight) = original(logits, targets, ignore_index, "sum")
        if reduction == "mean":
            weight = 1 / targets.size
            loss *= weight
        return loss, (c_logp, safe, keep, weight)
    monkeypatch.setattr(CL, "cross_entropy_forward", over_all)
    message = _fails("check-cross-entropy")
    assert "case 'a batch (B, T, V) = (2, 4, 6) with padded targets (-100)'" in message
    assert "dividing by all tokens, padding included" in message


def test_embedding_backward_with_fancy_index_add(monkeypatch):
    def fancy(dout, cache):
        ids, shape = cache
        dW = np.zeros(shape, dtype=dout.dtype)
        dW[ids] += dout
        return {"W": dW}
    monkeypatch.setattr(CL, "embedding_backward", fancy)
    message = _fails("check-embedding")
    assert "case 'a repeated id: token 2 three times'" in message
    assert "dW[ids] += dout" in message and "np.add.at" in message


def _softmax_temperature_backward(dy, x, y, tau):
    dz = y * (dy - (dy * y).sum(axis=-1, keepdims=True))
    return dz / tau, float(-(dz * x).sum() / tau ** 2)


def _score_bias_attention_backward(dO, Q, K, V, P, scale):
    sw = np.swapaxes
    dP = dO @ sw(V, -1, -2)
    dZ = P * (dP - (dP * P).sum(axis=-1, keepdims=True))
    return (scale * dZ @ K, scale * sw(dZ, -1, -2) @ Q, sw(P, -1, -2) @ dO,
            dZ.reshape(-1, *dZ.shape[-2:]).sum(axis=0))


def test_the_backward_variants_name_their_mistakes():
    def wrong_sign(dy, x, y, tau):
        dx, dtau = _softmax_temperature_backward(dy, x, y, tau)
        return dx, -dtau
    assert "has a minus" in _fails("check-softmax-temperature", wrong_sign)

    def averaged_dA(*args):
        dQ, dK, dV, dA = _score_bias_attention_backward(*args)
        n = int(np.prod(args[1].shape[:-2]))
        return dQ, dK, dV, dA / n
    message = _fails("check-score-bias-attention", averaged_dA)
    assert "case 'a batch: leading axes (2,)'" in message and "averaging dA" in message

    def layer_norm_like(dy, x, gamma, eps=1e-6):
        r = np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
        xhat, g = x / r, dy * gamma
        dx = (g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1,
                                                                         keepdims=True)) / r
        return dx, (dy * xhat).reshape(-1, x.shape[-1]).sum(axis=0)
    assert "RMSNorm subtracts no mean" in _fails("check-rms-norm-backward", layer_norm_like)


def test_the_torch_reference_of_the_backward_checks_is_nn_multihead_attention():
    """The checks' PyTorch graph of multi-head attention gives nn.MultiheadAttention's gradients
    (masks and a fully blocked row included)."""
    import torch

    from transformer_lab.checks.nb04_multihead_attention import blocked_rows_mask, mha_case_params
    from transformer_lab.tools import torch_mha

    rng = np.random.default_rng(0)
    b, t, s, e, h = 2, 3, 4, 8, 2
    params = mha_case_params(rng, e)
    query, key, value = (rng.standard_normal((b, n, e)) for n in (t, s, s))
    dout = rng.standard_normal((b, t, e))
    mask = blocked_rows_mask(rng, b, t, s)
    ours, _ = N5.torch_mha_backward(query, key, value, params, h, dout, mask)

    mha = torch_mha(params, h)
    leaves = [torch.tensor(a, requires_grad=True) for a in (query, key, value)]
    full = torch.from_numpy(np.broadcast_to(mask, (b, h, t, s)).reshape(b * h, t, s).copy())
    out, _ = mha(*leaves, attn_mask=full, need_weights=False)
    out.backward(torch.from_numpy(dout))
    for name, leaf in zip(("dquery", "dkey", "dvalue"), leaves, strict=True):
        np.testing.assert_allclose(ours[name], leaf.grad.numpy(), rtol=1e-10, atol=1e-12)
    w_in = mha.in_proj_weight.grad.numpy()
    for i, n in enumerate("qkv"):
        np.testing.assert_allclose(ours["grads"][f"W_{n}"], w_in[i * e:(i + 1) * e].T,
                                   rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ours["grads"]["W_o"], mha.out_proj.weight.grad.numpy().T,
                               rtol=1e-10, atol=1e-12)


def test_merge_masks_runs_on_stored_answers_in_the_handout(tmp_path, monkeypatch):
    """Its reference is hidden (it would show the answer): the handout checks the public cases
    against answers stored by make student, None for 'no mask at all' included."""
    cls = check_as_in_handout("check-merge-masks", tmp_path, monkeypatch)
    check(cls.id)
    monkeypatch.setattr(CA, "merge_masks", lambda a=None, k=None: a)
    assert "case 'causal (T, T) and padding (B, T), T = S = 4'" in _fails(cls.id)
