"""The GPT of notebook 09: every core backward gradient-checked (float64, below 1e-7), the model
equal to a from-scratch PyTorch version (float64 1e-10, float32 1e-5), cached decoding equal to
recomputing the prefix, the sampling filters, and every bad input refused clearly."""

import dataclasses

import numpy as np
import pytest
import torch

from transformer_lab.core import decoding as D
from transformer_lab.core import gpt as G
from transformer_lab.core import gqa as Q
from transformer_lab.core import layers as core_layers
from transformer_lab.core import modern as M
from transformer_lab.core import multihead as core_multihead
from transformer_lab.core import next_token as NT
from transformer_lab.core import rope as R
from transformer_lab.core import sampling as S
from transformer_lab.core.attention import causal_mask
from transformer_lab.gradient_check import check_gradients, check_parity, rel_error
from transformer_lab.models.config import parameter_shapes
from transformer_lab.models.gpt import GPT, GPTConfig
from transformer_lab.models.shell import flatten, nest
from transformer_lab.reference.torch_gpt import TorchGPT


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def gradcheck(forward, backward, inputs, rng, h=1e-5):
    """Check backward(dout, cache) against numerical gradients of sum(forward(...) * dout).

    inputs: name -> float64 array (perturbed in place); backward returns the gradients in the
    order of ``inputs`` (dict entries: a grads dict, checked for its keys in ``inputs``)."""
    out, cache = forward(*inputs.values())
    dout = rng.standard_normal(np.shape(out)) if np.ndim(out) else 1.0
    got = backward(dout, cache)
    got = got if isinstance(got, tuple) else (got,)
    grads = {}
    for name, g in zip(inputs, [x for x in got if not isinstance(x, dict)], strict=False):
        grads[name] = g
    for g in got:
        if isinstance(g, dict):
            grads.update({k: v for k, v in g.items() if k in inputs})

    def f():
        return forward(*inputs.values())[0]

    check_gradients(f, inputs, grads, df=dout if np.ndim(out) else None, verbose=False, h=h)


def small_config(kind="classic", **kw):
    make = GPTConfig.classic if kind == "classic" else GPTConfig.modern
    base = dict(d_model=16, num_heads=4, num_layers=2, max_len=10, dtype=np.float64)
    return make(13, **{**base, **kw})


def perturbed(model, rng, scale=0.1):
    """Move every parameter off its initial value (gains away from 1, biases away from 0)."""
    for p in model.params.values():
        p += rng.normal(0, scale, p.shape).astype(p.dtype)
    return model


CONFIGS = {
    "classic": lambda: small_config("classic"),
    "modern-gqa": lambda: small_config("modern"),
    "modern-mqa": lambda: small_config("modern", num_kv_heads=1),
    "sinusoidal-gelu-nobias": lambda: small_config("classic", positional="sinusoidal",
                                                   mlp="gelu", bias=False),
    "rope-relu-layernorm": lambda: small_config("classic", positional="rope", mlp="relu",
                                                num_kv_heads=2),
    "rms-swiglu-none": lambda: small_config("modern", positional="none", num_kv_heads=4),
    "modern-untied": lambda: small_config("modern", tie_embeddings=False),  # lm_head.W
}


# ------------------------------------------------------------------ core gradient checks


@pytest.mark.parametrize("block_size", [1, 3, 64])
@pytest.mark.parametrize("config", ["classic", "modern-gqa", "modern-mqa"])
def test_tiled_attention_flag_gives_the_same_training(rng, config, block_size):
    """attention_block_size switches the model to notebook 10's tiled attention: the same
    logits and gradients, and the same losses over Adam steps (float64)."""
    from transformer_lab.optim import Adam

    naive_config = CONFIGS[config]()
    tiled_config = dataclasses.replace(naive_config, attention_block_size=block_size)
    ids = rng.integers(0, naive_config.vocab_size, (3, naive_config.max_len))
    losses = {}
    for name, c in (("naive", naive_config), ("tiled", tiled_config)):
        model = perturbed(GPT(c, seed=0), np.random.default_rng(1))
        optimizer, losses[name] = Adam(model.params, lr=0.01), []
        for _ in range(5):
            loss, grads = model.loss(ids)
            optimizer.step(grads)
            losses[name].append(loss)
        losses[name + " logits"] = model.forward(ids)[0]
    np.testing.assert_allclose(losses["tiled"], losses["naive"], rtol=1e-12)
    np.testing.assert_allclose(losses["tiled logits"], losses["naive logits"], rtol=1e-9,
                               atol=1e-12)
    assert "tiled attention (blocks of" in repr(GPT(tiled_config, seed=0))


def test_tiled_attention_flag_survives_a_checkpoint(tmp_path):
    model = GPT(small_config(attention_block_size=4), seed=0)
    model.save(tmp_path / "m.npz")
    assert GPT.load(tmp_path / "m.npz").config.attention_block_size == 4


def test_next_token_loss_gradcheck_and_shift(rng):
    logits = rng.standard_normal((2, 5, 7))
    ids = rng.integers(0, 7, (2, 5))
    gradcheck(lambda x: NT.next_token_loss_forward(x, ids), NT.next_token_loss_backward,
              {"logits": logits}, rng)
    loss, cache = NT.next_token_loss_forward(logits, ids)
    expected = torch.nn.functional.cross_entropy(torch.tensor(logits[:, :-1]).reshape(-1, 7),
                                                 torch.tensor(ids[:, 1:]).reshape(-1))
    assert abs(loss - expected.item()) < 1e-12
    d = NT.next_token_loss_backward(1.0, cache)
    assert d.shape == logits.shape and np.all(d[:, -1] == 0)


def test_rope_gradcheck_and_inverse(rng):
    cos, sin = R.rope_tables(np.arange(5), 6)
    x = rng.standard_normal((2, 3, 5, 6))
    gradcheck(lambda a: R.rope_forward(a, cos, sin), R.rope_backward, {"x": x}, rng)
    out, cache = R.rope_forward(x, cos, sin)
    assert np.allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1))  # a rotation
    assert np.allclose(R.rope_backward(out, cache), x)  # R^T undoes R


def test_rope_relative_position_property(rng):
    """<R(p) q, R(s) k> depends only on s - p."""
    q, k = rng.standard_normal(8), rng.standard_normal(8)
    cos, sin = R.rope_tables(np.arange(40), 8)
    rot = R.rope_forward(np.stack([q] * 40), cos, sin)[0], R.rope_forward(np.stack([k] * 40),
                                                                           cos, sin)[0]
    for offset in (0, 1, 7):
        dots = [rot[0][p] @ rot[1][p + offset] for p in range(40 - offset)]
        assert np.allclose(dots, dots[0], atol=1e-12)


def test_rope_turns_counterclockwise_as_roformer_and_llama():
    """Rotating (1, 0) by p*omega gives (cos, sin), the sinusoidal table's pair (sin, cos) with
    its entries swapped; any pair turns by +p*omega, as the complex number x_2i + i x_2i+1
    multiplied by exp(i p omega) (RoFormer's eq. 13, LLaMA's ``apply_rotary_emb``)."""
    cos, sin = R.rope_tables(np.arange(12), 8)
    e = np.tile([1.0, 0.0], 4)
    table = core_layers.positional_encoding(12, 8)
    swapped = table.reshape(12, 4, 2)[..., ::-1].reshape(12, 8)
    assert np.allclose(R.rope_forward(np.stack([e] * 12), cos, sin)[0], swapped, atol=1e-12)
    x = np.random.default_rng(0).standard_normal((3, 12, 8))
    z = (x[..., 0::2] + 1j * x[..., 1::2]) * np.exp(1j * np.arctan2(sin, cos))
    out = R.rope_forward(x, cos, sin)[0]
    np.testing.assert_allclose(out[..., 0::2] + 1j * out[..., 1::2], z, atol=1e-12)


def test_rms_norm_gradcheck(rng):
    x = rng.standard_normal((2, 3, 6))
    gamma = 1 + 0.3 * rng.standard_normal(6)
    gradcheck(lambda a, g: M.rms_norm_forward(a, g), M.rms_norm_backward,
              {"x": x, "gamma": gamma}, rng)
    out = M.rms_norm_forward(x, gamma)[0]
    expected = torch.nn.functional.rms_norm(torch.tensor(x), (6,), torch.tensor(gamma), 1e-5)
    assert rel_error(out, expected) < 1e-12


def test_silu_and_swiglu_gradcheck(rng):
    x = rng.standard_normal((3, 4)) * 3
    gradcheck(M.silu_forward, M.silu_backward, {"x": x}, rng)
    big = np.array([-1000.0, -50.0, 0.0, 50.0, 1000.0], dtype=np.float32)
    with np.errstate(all="raise"):  # no overflow for huge inputs
        assert np.allclose(M.silu_forward(big)[0], torch.nn.functional.silu(torch.tensor(big)))
    p = {"x": rng.standard_normal((2, 3, 4)), "W_gate": rng.standard_normal((4, 5)),
         "W_up": rng.standard_normal((4, 5)), "W_down": rng.standard_normal((5, 4))}

    def forward(x, W_gate, W_up, W_down):
        return M.swiglu_forward(x, {"W_gate": W_gate, "W_up": W_up, "W_down": W_down})

    gradcheck(forward, M.swiglu_backward, p, rng)


def test_repeat_kv_gradcheck_and_layout(rng):
    x = rng.standard_normal((2, 2, 3, 4))
    gradcheck(lambda a: Q.repeat_kv_forward(a, 3), Q.repeat_kv_backward, {"x": x}, rng)
    out, _ = Q.repeat_kv_forward(x, 3)
    assert out.shape == (2, 6, 3, 4)
    for h in range(6):
        assert np.array_equal(out[:, h], x[:, h // 3])
    assert Q.repeat_kv_forward(x, 1)[0] is x


@pytest.mark.parametrize("heads,kv_heads,rope", [(4, 4, False), (4, 2, True), (4, 1, True),
                                                 (2, 2, True)])
@pytest.mark.parametrize("bias", [True, False])
def test_causal_self_attention_gradcheck(rng, heads, kv_heads, rope, bias):
    E, T, Dh = 8, 5, 8 // heads
    width = E + 2 * kv_heads * Dh
    p = {"x": rng.standard_normal((2, T, E)), "W_qkv": rng.standard_normal((E, width)) * 0.5,
         "W_o": rng.standard_normal((E, E)) * 0.5}
    if bias:
        p.update(b_qkv=rng.standard_normal(width), b_o=rng.standard_normal(E))
    tables = R.rope_tables(np.arange(T), Dh) if rope else None

    def forward(x, *weights):
        params = dict(zip([k for k in p if k != "x"], weights, strict=True))
        return Q.causal_self_attention_forward(x, params, heads, kv_heads, tables)

    gradcheck(forward, Q.causal_self_attention_backward, p, rng)


def test_causal_self_attention_is_notebook_04s_with_a_causal_mask(rng):
    x = rng.standard_normal((2, 6, 8))
    params = {"W_qkv": rng.standard_normal((8, 24)), "W_o": rng.standard_normal((8, 8)),
              "b_qkv": rng.standard_normal(24), "b_o": rng.standard_normal(8)}
    ours, _ = Q.causal_self_attention_forward(x, params, 2)
    theirs, _ = core_multihead.self_attention_forward(x, params, 2, causal_mask(6))
    assert np.allclose(ours, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_norm_dispatch_gradcheck(rng, kind):
    x = rng.standard_normal((2, 3, 5))
    gamma, beta = 1 + 0.2 * rng.standard_normal(5), rng.standard_normal(5)

    def forward(a, g, b):
        return G.norm_forward(a, {"gamma": g, "beta": b} if kind == "layer" else {"gamma": g},
                              kind)

    gradcheck(forward, G.norm_backward, {"x": x, "gamma": gamma, "beta": beta}, rng)


@pytest.mark.parametrize("config", ["classic", "modern-gqa", "rope-relu-layernorm"])
def test_block_gradcheck(rng, config):
    c = dataclasses.replace(CONFIGS[config](), d_model=8, d_ff=12)
    model = perturbed(GPT(c, seed=1), rng)
    block = model.nested_params()["layers"][0]
    flat = flatten(block)
    x = rng.standard_normal((2, 6, c.d_model))
    rope = model._rope(0, 6)
    names = list(flat)
    inputs = {"x": x, **flat}

    def forward(x, *values):
        return G.gpt_block_forward(x, nest(dict(zip(names, values, strict=True))), c, rope)

    def backward(dout, cache):
        dx, grads = G.gpt_block_backward(dout, cache)
        return dx, flatten(grads)

    gradcheck(forward, backward, inputs, rng, h=1e-6)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_model_gradcheck(rng, config):
    tiny = dict(d_model=8, d_ff=12, max_len=7, vocab_size=11)  # every parameter, a few seconds
    c = dataclasses.replace(CONFIGS[config](), **tiny)
    model = perturbed(GPT(c, seed=2), rng)
    ids = rng.integers(0, 11, (2, 7))
    _, grads = model.loss(ids)
    assert list(grads) == list(model.params)
    check_gradients(lambda: model.loss(ids, compute_grads=False)[0], model.params, grads,
                    h=1e-6, verbose=False)


def test_tied_embedding_gradient_is_the_sum_of_its_two_uses(rng):
    """Untied in torch (two copies of the table), the two gradients add up to ours."""
    model = perturbed(GPT(small_config(), seed=0), rng)
    ids = rng.integers(0, 13, (2, 6))
    logits, cache = model.forward(ids)
    dlogits = rng.standard_normal(logits.shape)
    ours = model.backward(dlogits, cache)["embed.W"]
    twin = TorchGPT.from_numpy(model)
    table_in = twin.embed.W.detach().clone().requires_grad_(True)
    table_out = twin.embed.W.detach().clone().requires_grad_(True)
    x = table_in[torch.as_tensor(ids)] + twin.pos.W[:6]
    for layer in twin.layers:
        x = layer(x)
    x = torch.nn.functional.layer_norm(x, (16,), twin.norm.gamma, twin.norm.beta, 1e-5)
    (x @ table_out.T * torch.as_tensor(dlogits)).sum().backward()
    assert table_in.grad.abs().max() > 1e-3 and table_out.grad.abs().max() > 1e-3
    assert rel_error(ours, table_in.grad + table_out.grad) < 1e-10
    assert rel_error(ours, table_out.grad) > 1e-3  # the input's share is not negligible


# ------------------------------------------------------------------ parity with PyTorch


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_parity_with_torch_float64(rng, config):
    model = perturbed(GPT(CONFIGS[config](), seed=3), rng)
    ids = rng.integers(0, 13, (3, 10))
    twin = TorchGPT.from_numpy(model)
    logits, _ = model.forward(ids)
    assert rel_error(logits, twin(ids)) < 1e-10
    loss, grads = model.loss(ids)
    tloss = twin.loss(ids)
    tloss.backward()
    assert abs(loss - tloss.item()) < 1e-10 * abs(loss)
    check_parity(grads, twin.numpy_grads(), tol=1e-10, verbose=False)


@pytest.mark.parametrize("config", ["classic", "modern-gqa", "modern-untied"])
def test_parity_with_torch_float32(rng, config):
    c = dataclasses.replace(CONFIGS[config](), dtype=np.float32)
    model = perturbed(GPT(c, seed=4), rng)
    ids = rng.integers(0, 13, (3, 10))
    twin = TorchGPT.from_numpy(model)
    loss, grads = model.loss(ids)
    assert all(g.dtype == np.float32 for g in grads.values())
    tloss = twin.loss(ids)
    tloss.backward()
    assert abs(loss - tloss.item()) < 1e-5 * abs(loss)
    check_parity(grads, twin.numpy_grads(), tol=1e-5, verbose=False)


# ------------------------------------------------------------------ KV cache


def test_kv_cache_append(rng):
    K, V = np.zeros((2, 1, 6, 3)), np.zeros((2, 1, 6, 3))
    k, v = rng.standard_normal((2, 1, 2, 3)), rng.standard_normal((2, 1, 2, 3))
    keys, values, length = D.kv_cache_append(K, V, 0, k, v)
    assert length == 2 and keys.shape == (2, 1, 2, 3) and np.array_equal(values, v)
    k2, v2 = rng.standard_normal((2, 1, 1, 3)), rng.standard_normal((2, 1, 1, 3))
    keys, values, length = D.kv_cache_append(K, V, length, k2, v2)
    assert length == 3 and np.array_equal(keys, np.concatenate([k, k2], axis=2))
    assert np.shares_memory(keys, K) and np.all(K[:, :, 3:] == 0)


@pytest.mark.parametrize("config", ["classic", "modern-gqa", "sinusoidal-gelu-nobias",
                                    "modern-untied"])
def test_cached_step_equals_full_forward(rng, config):
    model = perturbed(GPT(CONFIGS[config](), seed=5), rng)
    ids = rng.integers(0, 13, (2, 10))
    full, _ = model.forward(ids)
    caches = model.new_kv_cache(2, 10)
    params, length, pieces = model.nested_params(), 0, []
    for a, b in ((0, 4), (4, 5), (5, 8), (8, 9), (9, 10)):  # a prompt, then chunks and steps
        logits, length = D.gpt_step(params, ids[:, a:b], model.config, caches, length, model.pe,
                                    model._rope(a, b))
        pieces.append(logits)
    assert length == 10
    assert np.allclose(np.concatenate(pieces, axis=1), full, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("config", ["classic", "modern-gqa", "modern-untied"])
@pytest.mark.parametrize("sampling", [dict(temperature=0), dict(temperature=1.0, seed=3),
                                      dict(temperature=0.7, top_k=5, top_p=0.9, seed=1)])
def test_generate_with_and_without_cache(rng, config, sampling):
    model = perturbed(GPT(CONFIGS[config](), seed=6), rng, scale=0.5)
    prompt = rng.integers(0, 13, (3, 3))
    a, la = model.generate(prompt, 7, use_cache=True, return_logits=True, **sampling)
    b, lb = model.generate(prompt, 7, use_cache=False, return_logits=True, **sampling)
    assert np.array_equal(a, b) and a.shape == (3, 10) and a.dtype == np.int64
    assert np.array_equal(a[:, :3], prompt)
    assert np.allclose(la, lb, rtol=1e-12, atol=1e-12)
    if sampling["temperature"] == 0:
        assert np.array_equal(a[:, 3:], la.argmax(axis=-1))


def test_generate_float32_cache_and_one_dimensional_prompt(rng):
    model = perturbed(GPT(dataclasses.replace(small_config("modern"), dtype=np.float32),
                          seed=0), rng, scale=0.5)
    a, la = model.generate([1, 2, 3], 6, temperature=0.9, seed=4, return_logits=True)
    b, lb = model.generate(np.array([1, 2, 3]), 6, temperature=0.9, seed=4, use_cache=False,
                           return_logits=True)
    assert a.shape == (9,) and la.shape == (6, 13) and np.array_equal(a, b)
    assert np.allclose(la, lb, rtol=1e-5, atol=1e-5)
    assert model.kv_cache_bytes(1, 9) == 2 * 2 * 1 * 2 * 9 * 4 * 4  # 2 N B Hkv T Dh bytes


def test_generate_is_reproducible_with_a_seed(rng):
    model = perturbed(GPT(small_config(), seed=0), rng, scale=0.5)
    prompt = rng.integers(0, 13, (2, 2))
    first = model.generate(prompt, 8, temperature=1.5, seed=11)
    assert np.array_equal(first, model.generate(prompt, 8, temperature=1.5, seed=11))
    others = [model.generate(prompt, 8, temperature=1.5, seed=s) for s in range(12, 16)]
    assert any(not np.array_equal(first, o) for o in others)
    assert np.array_equal(model.generate(prompt, 0), prompt)


# ------------------------------------------------------------------ sampling filters


def test_top_k_keeps_k(rng):
    logits = rng.standard_normal((4, 20))
    for k in (1, 3, 20):
        kept = np.isfinite(S.top_k_filter(logits, k))
        assert np.all(kept.sum(axis=1) == k)
        top = np.argsort(-logits, axis=1)[:, :k]
        assert np.all(np.take_along_axis(kept, top, axis=1))
        assert np.array_equal(S.top_k_filter(logits, k)[kept], logits[kept])


def test_top_p_keeps_the_smallest_set_with_mass_p(rng):
    logits = rng.standard_normal((50, 12)) * 2
    probs = core_layers.softmax_forward(logits)[0]
    for p in (0.05, 0.3, 0.5, 0.9, 0.999, 1.0):
        kept = np.isfinite(S.top_p_filter(logits, p))
        for row, keep in zip(probs, kept, strict=True):
            order = np.argsort(-row)
            n = int(np.searchsorted(np.cumsum(row[order]), p - 1e-12)) + 1  # smallest prefix
            n = min(n, row.size)
            assert keep.sum() == n, (p, keep.sum(), n)
            assert np.all(keep[order[:n]])
            assert row[keep].sum() >= min(p, 1.0) - 1e-9


def test_sample_next(rng):
    logits = np.log(np.array([[0.1, 0.6, 0.3], [0.5, 0.25, 0.25]]))
    assert np.array_equal(S.sample_next(logits, rng, temperature=0), [1, 0])
    draws = np.array([S.sample_next(logits, rng) for _ in range(20000)])
    freq0 = np.bincount(draws[:, 0], minlength=3) / 20000
    assert np.allclose(freq0, [0.1, 0.6, 0.3], atol=0.015)
    top1 = np.array([S.sample_next(logits, rng, top_k=1) for _ in range(50)])
    assert np.all(top1 == [1, 0])
    nucleus = np.array([S.sample_next(logits, rng, top_p=0.7) for _ in range(2000)])[:, 0]
    assert set(nucleus.tolist()) == {1, 2}  # 0.6 < 0.7 <= 0.6 + 0.3
    a = [S.sample_next(logits, np.random.default_rng(5), temperature=2.0) for _ in range(3)]
    assert all(np.array_equal(a[0], x) for x in a)


# ------------------------------------------------------------------ the boundary


def test_parameter_names_and_shapes():
    c = small_config("modern")
    shapes = parameter_shapes(c)
    assert "pos.W" not in shapes and "layers.1.mlp.W_gate" in shapes
    assert shapes["layers.0.attn.W_qkv"] == (16, 16 + 2 * 2 * 4)
    assert list(GPT(c).params) == list(shapes)
    classic = parameter_shapes(small_config("classic"))
    assert {"pos.W", "layers.0.norm1.beta", "layers.0.attn.b_qkv", "layers.0.mlp.b2"} <= \
        set(classic)
    untied = small_config("modern", tie_embeddings=False)
    assert list(parameter_shapes(untied))[-1] == "lm_head.W"
    assert parameter_shapes(untied) == {**shapes, "lm_head.W": (13, 16)}
    assert GPT(untied).num_parameters() == GPT(c).num_parameters() + 13 * 16
    assert "untied head" in repr(GPT(untied)) and "untied" not in repr(GPT(c))
    assert nest({"a.0.b": 1, "a.1.b": 2, "c": 3}) == {"a": [{"b": 1}, {"b": 2}], "c": 3}
    assert flatten(nest({"a.0.b": 1, "a.1.b": 2, "c": 3})) == {"a.0.b": 1, "a.1.b": 2, "c": 3}


def test_init_is_deterministic_and_dtype_independent():
    a, b = GPT(small_config(), seed=3), GPT(small_config(), seed=3)
    assert all(np.array_equal(a.params[k], b.params[k]) for k in a.params)
    f32 = GPT(dataclasses.replace(small_config(), dtype=np.float32), seed=3)
    assert all(np.allclose(a.params[k], f32.params[k], atol=1e-7) for k in a.params)
    assert not np.array_equal(GPT(small_config(), seed=4).params["embed.W"], a.params["embed.W"])


@pytest.mark.parametrize("tie", [True, False])
def test_checkpoint_roundtrip(tmp_path, rng, tie):
    model = perturbed(GPT(dataclasses.replace(small_config("modern"), dtype=np.float32,
                                              tie_embeddings=tie)), rng)
    path = model.save(tmp_path / "m", metadata={"step": 3})
    loaded = GPT.load(path)
    assert loaded.config == model.config and loaded.metadata == {"step": 3}
    assert all(np.array_equal(loaded.params[k], model.params[k]) for k in model.params)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(d_model=10, num_heads=4), ValueError, "d_model must be divisible by num_heads"),
    (dict(num_heads=4, num_kv_heads=3), ValueError, "num_kv_heads must divide num_heads"),
    (dict(norm="batch"), ValueError, "GPTConfig.norm must be one of"),
    (dict(mlp="tanh"), ValueError, "GPTConfig.mlp must be one of"),
    (dict(positional="alibi"), ValueError, "GPTConfig.positional must be one of"),
    (dict(d_model=12, num_heads=4, positional="rope"), ValueError, "must be even"),
    (dict(vocab_size=0), ValueError, "GPTConfig.vocab_size must be at least 1"),
    (dict(dtype=np.int32), TypeError, "GPTConfig.dtype"),
    (dict(bias=1), TypeError, "GPTConfig.bias must be True or False"),
    (dict(tie_embeddings="no"), TypeError, "GPTConfig.tie_embeddings must be True or False"),
    (dict(attention_block_size=0), ValueError, "GPTConfig.attention_block_size must be at least 1"),
    (dict(attention_block_size=2.5), TypeError, "GPTConfig.attention_block_size"),
])
def test_config_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        GPTConfig(**{"vocab_size": 10, **kwargs})


def test_bad_inputs_of_the_model(rng):
    model = GPT(small_config(), seed=0)
    ok = rng.integers(0, 13, (2, 5))
    cases = [
        (lambda: GPT("config"), TypeError, "config must be a GPTConfig"),
        (lambda: GPT(small_config(), seed=-1), ValueError, "seed must be at least 0"),
        (lambda: model.forward(ok.astype(float)), TypeError, "ids must be an array of integer"),
        (lambda: model.forward(ok[0]), ValueError, r"ids must have 2 dimensions \(batch, length\)"),
        (lambda: model.forward(np.zeros((2, 11), int)), ValueError, "max_len=10"),
        (lambda: model.forward(ok + 13), ValueError, "below the vocabulary size 13"),
        (lambda: model.forward(ok - 13), ValueError, "non-negative"),
        (lambda: model.forward(np.zeros((0, 3), int)), ValueError, "at least one sequence"),
        (lambda: model.loss(ok[:, :1]), ValueError, "at least 2 tokens"),
        (lambda: model.loss(ok, compute_grads="yes"), TypeError, "compute_grads must be True"),
        (lambda: model.backward(np.zeros((2, 5, 13)), None), ValueError,
         "GPT.backward: cache is None -- call the forward function first"),
        (lambda: model.backward(np.zeros((2, 5, 13)), (1, 2)), TypeError,
         "cache must be the ModelCache returned by the forward"),
        (lambda: model.backward(np.zeros((2, 4, 13)), model.forward(ok)[1]), ValueError,
         "dlogits must have shape"),
        (lambda: model.set_params({"nope": 1}), KeyError, "unknown parameter"),
    ]
    for call, error, match in cases:
        with pytest.raises(error, match=match):
            call()


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(max_new_tokens=-1), ValueError, "max_new_tokens must be at least 0"),
    (dict(max_new_tokens=2.5), TypeError, "max_new_tokens must be an integer"),
    (dict(max_new_tokens=8), ValueError, "exceeds max_len=10"),
    (dict(temperature=-0.5), ValueError, "temperature must be at least 0"),
    (dict(temperature="hot"), TypeError, "temperature must be a number"),
    (dict(top_k=0), ValueError, "top_k must be at least 1"),
    (dict(top_k=14), ValueError, "top_k must be at most the vocabulary size 13"),
    (dict(top_p=0.0), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(seed=-2), ValueError, "seed must be at least 0"),
    (dict(use_cache=1), TypeError, "use_cache must be True or False"),
    (dict(ids=np.zeros((1, 0), int)), ValueError, "at least 1 token"),
    (dict(ids=[]), ValueError, "at least 1 token"),
    (dict(ids=[[1, 2], [3]]), ValueError, "rectangular array of token ids"),
    (dict(temperature=1e-38), ValueError, r"temperature must be 0 \(greedy\) or at least "
                                          r"float64's eps 2.22e-16 \(smaller ones can overflow"),
])
def test_bad_inputs_of_generate(kwargs, error, match):
    model = GPT(small_config(), seed=0)
    args = {"ids": np.array([[1, 2, 3]]), "max_new_tokens": 2, **kwargs}
    with pytest.raises(error, match=match):
        model.generate(**args)
