"""Notebook 09's checks recognise the classic mistakes of its exercises (the reference passing
every check is tests/test_checks.py's job)."""

import numpy as np
import pytest

from transformer_lab import syllabus
from transformer_lab.checks import CheckFailed, check
from transformer_lab.core import decoding as D
from transformer_lab.core import gqa as Q
from transformer_lab.core import layers as L
from transformer_lab.core import modern as M
from transformer_lab.core import next_token as NT
from transformer_lab.core import rope as R
from transformer_lab.core import sampling as S


def _fails(check_id, *functions):
    with pytest.raises(CheckFailed) as err:
        check(check_id, *functions)
    return str(err.value)


def test_unshifted_loss(monkeypatch):
    def forward(logits, ids):
        loss, cache = L.cross_entropy_forward(logits, ids)
        return loss, cache

    monkeypatch.setattr(NT, "next_token_loss_forward", forward)
    monkeypatch.setattr(NT, "next_token_loss_backward", L.cross_entropy_backward)
    assert "without the shift" in _fails("check-next-token-loss")


def test_a_block_that_always_takes_the_exact_gelu(monkeypatch):
    from transformer_lab.core import gpt as G

    real = G.mlp_forward
    monkeypatch.setattr(G, "mlp_forward", lambda x, params, kind: real(x, params, "gelu"))
    assert "with the exact GELU where config.mlp asks for its tanh" in _fails("check-gpt-block")


def test_next_token_loss_that_scores_each_position_against_its_own_token(monkeypatch):
    def forward(logits, ids):  # logits[:, :-1] against ids[:, :-1]: the shift on one side only
        return L.cross_entropy_forward(logits[:, :-1], ids[:, :-1])

    def backward(dloss, cache):
        d = L.cross_entropy_backward(dloss, cache)
        return np.concatenate([d, np.zeros_like(d[:, :1])], axis=1)

    monkeypatch.setattr(NT, "next_token_loss_forward", forward)
    monkeypatch.setattr(NT, "next_token_loss_backward", backward)
    assert "scoring logits[:, :-1] against ids[:, :-1]" in _fails("check-next-token-loss")


def test_a_post_norm_gpt_block(monkeypatch):
    from transformer_lab.core import gpt as G

    real = G.residual_forward
    monkeypatch.setattr(G, "residual_forward", lambda x, sub, norm, norm_first, eps, normalize:
                        real(x, sub, norm, False, eps, normalize))
    assert "as post-norm, norm(x + sublayer(x))" in _fails("check-gpt-block")


def test_a_gpt_block_with_the_mlp_first(monkeypatch):
    from transformer_lab.core import gpt as G

    def forward(x, params, c, rope=None, rng=None):
        def norm(h, p, eps):
            return G.norm_forward(h, p, c.norm, eps)

        def attend(h):
            return G.causal_self_attention_forward(h, params["attn"], c.num_heads,
                                                   c.num_kv_heads, rope)

        x, c_mlp = G.residual_forward(x, lambda h: G.mlp_forward(h, params["mlp"], c.mlp),
                                      params["norm2"], True, c.eps, norm)
        out, c_attn = G.residual_forward(x, attend, params["norm1"], True, c.eps, norm)
        return out, (c_mlp, c_attn)

    def backward(dout, cache):
        c_mlp, c_attn = cache
        dx, g1, ga = G.residual_backward(dout, c_attn, G.causal_self_attention_backward,
                                         G.norm_backward)
        dx, g2, gm = G.residual_backward(dx, c_mlp, G.mlp_backward, G.norm_backward)
        return dx, {"norm1": g1, "attn": ga, "norm2": g2, "mlp": gm}

    monkeypatch.setattr(G, "gpt_block_forward", forward)
    monkeypatch.setattr(G, "gpt_block_backward", backward)
    assert "with the MLP before the attention" in _fails("check-gpt-block")


def test_a_gpt_with_the_2017_embedding_scale_or_without_positions(monkeypatch):
    from transformer_lab.core import gpt as G

    real = G.embed_forward
    monkeypatch.setattr(G, "embed_forward", lambda ids, table, positions:  # notebook 08's scale
                        real(ids, table, positions, np.sqrt(table.shape[1])))
    assert "with the embeddings scaled by sqrt(E)" in _fails("check-gpt-model")
    monkeypatch.setattr(G, "embed_forward", lambda ids, table, positions: real(ids, table, None))
    assert "without the positions" in _fails("check-gpt-model")


def test_a_residual_that_ignores_the_norm_it_is_given(monkeypatch):
    from transformer_lab.core import blocks as Bk
    from transformer_lab.core import gpt as G

    real_forward, real_backward = Bk.residual_forward, Bk.residual_backward
    for module in Bk, G:  # gpt.py imports them by name
        monkeypatch.setattr(module, "residual_backward", lambda dout, cache, sub, normalize=None:
                            real_backward(dout, cache, sub))
    assert "the cache of the norm given as normalize" in _fails("check-residual-normalize")
    # the block, which fails in the layer norm's backward, names the residual first
    assert _fails("check-gpt-block").split("\n")[1].startswith(
        "`check-residual-normalize`, the check of `residual_forward` and `residual_backward` "
        "(notebook 13 §3), fails; fix what it names")
    monkeypatch.setattr(Bk, "residual_forward", lambda x, sub, norm, norm_first, eps, normalize:
                        real_forward(x, sub, norm, norm_first, eps))
    assert "with the layer norm where a norm is given" in _fails("check-residual-normalize")


def test_next_token_loss_backward_that_ignores_dloss(monkeypatch):
    real = NT.next_token_loss_backward
    monkeypatch.setattr(NT, "next_token_loss_backward", lambda dloss, cache: real(1.0, cache))
    message = _fails("check-next-token-loss")
    assert "dloss = 0.5" in message and "ignoring dloss" in message


def test_rope_rotated_the_other_way(monkeypatch):
    def forward(x, cos, sin):
        out = np.empty_like(x)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out[..., 0::2], out[..., 1::2] = x0 * cos + x1 * sin, x1 * cos - x0 * sin  # clockwise
        return out, (cos, sin)

    monkeypatch.setattr(R, "rope_forward", forward)
    assert "rotating by minus the angle" in _fails("check-rope")


def test_top_p_one_token_short(monkeypatch):
    def top_p(logits, p):
        probs = L.softmax_forward(logits)[0]
        order = np.argsort(-logits, axis=-1, kind="stable")
        cum = np.cumsum(np.take_along_axis(probs, order, -1), -1)
        keep = np.empty(logits.shape, bool)
        np.put_along_axis(keep, order, cum < p, -1)
        return np.where(keep, logits, -np.inf)

    monkeypatch.setattr(S, "top_p_filter", top_p)
    assert "one token too few" in _fails("check-top-p-filter")


def test_cache_written_at_zero(monkeypatch):
    def append(K, V, length, k, v):
        t = k.shape[2]
        K[:, :, :t], V[:, :, :t] = k, v
        return K[:, :, :length + t], V[:, :, :length + t], length + t

    monkeypatch.setattr(D, "kv_cache_append", append)
    assert "writing every piece at position 0" in _fails("check-kv-cache-append")


def test_attention_without_the_causal_mask(monkeypatch):
    monkeypatch.setattr(Q, "causal_mask", lambda T: np.zeros((T, T), bool))
    assert "without the causal mask" in _fails("check-causal-self-attention")


def test_sampling_that_ignores_the_temperature(monkeypatch):
    original = S.sample_next

    def sample(logits, rng, temperature=1.0, top_k=None, top_p=None):
        return original(logits, rng, 1.0 if temperature else 0, top_k, top_p)

    monkeypatch.setattr(S, "sample_next", sample)
    assert "'temperature 0.5, top-k 4'" in _fails("check-sample-next")


def test_stub_message_names_notebook_14(monkeypatch):
    message = syllabus.stub_message("kv_cache_append")
    assert "14_decoding" in message and "section 2" in message

    def stub(*args):
        raise NotImplementedError(message)

    monkeypatch.setattr(D, "kv_cache_append", stub)
    assert _fails("check-kv-cache-append") == f"check-kv-cache-append: {message}"


def test_a_stub_that_makes_the_cases_fails_in_one_line(monkeypatch):
    """A student ahead of notebook 07: the check's model is initialised by init_uniform."""
    from transformer_lab.core import layers

    message = syllabus.stub_message("init_uniform")

    def stub(*args):
        raise NotImplementedError(message)

    monkeypatch.setattr(layers, "init_uniform", stub)
    assert _fails("check-gpt-block") == ("check-gpt-block did not run: it makes its cases with "
                                         f"a function not written yet -- {message}")


def test_min_p_variant():
    absolute = _fails("check-min-p-filter", lambda z, p: np.where(  # p_min, not p_min * max
        L.softmax_forward(z)[0] >= p, z, -np.inf))
    assert "output['kept']" in absolute and "entries differ" in absolute
    with pytest.raises(TypeError, match="needs your function"):
        check("check-min-p-filter")


def test_rms_norm_backward_with_layer_norms_mean_term(monkeypatch):
    def backward(dout, cache):
        x_hat, rstd, gamma = cache
        g = dout * gamma
        dx = rstd * (g - g.mean(-1, keepdims=True) - x_hat * (g * x_hat).mean(-1, keepdims=True))
        return dx, {"gamma": (dout * x_hat).reshape(-1, x_hat.shape[-1]).sum(0)}

    monkeypatch.setattr(M, "rms_norm_backward", backward)
    assert "with layer norm's -mean(g) term in the backward pass" in _fails("check-gpt-rms-norm")


def test_norm_forward_not_extended_to_rms(monkeypatch):
    from transformer_lab.core import gpt as G

    real = G.norm_forward
    monkeypatch.setattr(G, "norm_forward", lambda x, p, kind, eps=1e-5: real(x, p, "layer", eps))
    assert "with norm_forward still the layer norm" in _fails("check-gpt-rms-norm")


def test_a_float64_answer_off_in_the_seventh_digit_suggests_float32_or_eps(monkeypatch):
    real = M.rms_norm_forward
    monkeypatch.setattr(M, "rms_norm_forward", lambda x, gamma, eps=1e-5: real(x, gamma, 0.0))
    message = _fails("check-gpt-rms-norm")
    assert "relative error 5" in message and "e-07" in message
    assert "close, but not to float64's tolerance: usually a float32 step" in message


@pytest.mark.parametrize("wrong", ["sigmoid", "sigmoid-derivative", "one-plus-a"])
def test_silu_derivatives_students_write(monkeypatch, wrong):
    def sigmoid(a):
        return 0.5 * (1 + np.tanh(a / 2))

    derivative = {"sigmoid": sigmoid, "sigmoid-derivative": lambda a: sigmoid(a) * (1 - sigmoid(a)),
                  "one-plus-a": lambda a: sigmoid(a) * (1 + a)}[wrong]
    monkeypatch.setattr(M, "silu_backward", lambda dout, cache: dout * derivative(cache[0]))
    assert "as silu's derivative; d(a sigmoid(a))/da is" in _fails("check-swiglu")


def test_the_gpt_attention_that_ignores_block_size_uses_the_memory_of_the_scores(monkeypatch):
    real = Q.causal_self_attention_forward
    monkeypatch.setattr(Q, "causal_self_attention_forward",
                        lambda x, params, H, Hkv=None, rope=None, block_size=None:
                        real(x, params, H, Hkv, rope))
    message = _fails("check-gpt-tiled-attention")
    assert "memory below a tenth of one (T, T) score matrix" in message
    assert "expected True, got False" in message
    assert "with more than a tenth of a (T, S) array alive at once" in message


def test_key_value_heads_given_out_in_tile_order(monkeypatch):
    def tile(x, n_rep):  # head j gets head j % Hkv, not j // n_rep
        return np.tile(x, (1, n_rep, 1, 1)), n_rep

    def untile(dout, n_rep):
        B, H, S, Dh = dout.shape
        return dout.reshape(B, n_rep, H // n_rep, S, Dh).sum(axis=1)

    monkeypatch.setattr(Q, "repeat_kv_forward", tile)
    monkeypatch.setattr(Q, "repeat_kv_backward", untile)
    assert "with the key/value heads given out in tile order" in _fails(
        "check-grouped-query-attention")


def test_rope_backward_that_rotates_forward(monkeypatch):
    monkeypatch.setattr(R, "rope_backward", lambda dout, cache: R.rope_forward(dout, *cache)[0])
    assert "a backward that rotates by +a, as the forward does" in _fails("check-rope")


@pytest.mark.parametrize(("step", "says"), [(1, "base^(-i / Dh), the 2 left out"),
                                            (4, "base^(-4i / Dh), the 2 counted twice"),
                                            (-2, "base^(+2i / Dh), the sign left out")])
def test_rope_frequencies_students_get_wrong(monkeypatch, step, says):
    def tables(positions, head_dim, base=10000.0):
        angles = np.asarray(positions, np.float64)[:, None] * base ** (
            -step * np.arange(head_dim // 2) / head_dim)
        return np.cos(angles), np.sin(angles)

    monkeypatch.setattr(R, "rope_tables", tables)
    assert says in _fails("check-rope")


def test_rms_norm_that_divides_by_the_standard_deviation(monkeypatch):
    real = M.rms_norm_forward

    def forward(x, gamma, eps=1e-5):
        out, cache = real(x, gamma, eps)
        r = np.sqrt(x.var(-1, keepdims=True) + eps)
        return x / r * gamma, cache

    monkeypatch.setattr(M, "rms_norm_forward", forward)
    assert "dividing by the standard deviation" in _fails("check-gpt-rms-norm")


def test_a_residual_whose_forward_alone_ignores_the_norm(monkeypatch):
    from transformer_lab.core import blocks as Bk

    real = Bk.residual_forward
    monkeypatch.setattr(Bk, "residual_forward", lambda x, sub, norm, norm_first, eps, normalize:
                        real(x, sub, norm, norm_first, eps))
    assert "normalize_backward was given a cache that normalize did not make: does your " \
        "residual_forward call normalize" in _fails("check-residual-normalize")


def test_mlp_forward_not_extended_to_swiglu(monkeypatch):
    from transformer_lab.core import blocks as Bk
    from transformer_lab.core import gpt as G

    def forward(x, params, kind):
        out, cache = Bk.feed_forward_forward(x, params, kind)
        return out, (kind, cache)

    monkeypatch.setattr(G, "mlp_forward", forward)
    assert "looked for a parameter SwiGLU does not have -- is it extended to kind 'swiglu'" in \
        _fails("check-swiglu")
