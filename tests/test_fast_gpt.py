"""The GPT's speed-only path (models/fast_gpt.py, issue 26) computes what the core computes: the
loss, the logits and every gradient equal to the core's (float64 to 1e-12, float32 to 1e-5) for
every configuration it takes; the model falls back to the core for the others and when told to;
the handout leaves the module out, and there the GPT trains on the student's core."""

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
from handout_tools import run_in_handout_package

from transformer_lab.core import gpt as core_gpt
from transformer_lab.course import package as P
from transformer_lab.gradient_check import rel_error
from transformer_lab.models import fast_gpt as FG
from transformer_lab.models import gpt as model_gpt
from transformer_lab.models.gpt import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "transformer_lab"


def config(kind="classic", **kw):
    make = GPTConfig.classic if kind == "classic" else GPTConfig.modern
    base = dict(d_model=16, num_heads=4, num_layers=2, max_len=12, dtype=np.float64)
    return make(13, **{**base, **kw})


#: Every norm, feed-forward network, position scheme; grouped and shared key/value heads; with
#: and without biases.
CONFIGS = {
    "classic": lambda: config(),
    "modern-gqa": lambda: config("modern"),
    "modern-mqa": lambda: config("modern", num_kv_heads=1),
    "sinusoidal-gelu-nobias": lambda: config(positional="sinusoidal", mlp="gelu", bias=False),
    "rope-relu-layernorm-gqa": lambda: config(positional="rope", mlp="relu", num_kv_heads=2),
    "rms-swiglu-none": lambda: config("modern", positional="none", num_kv_heads=4),
    "classic-gqa": lambda: config(num_kv_heads=2),
    "layernorm-swiglu-bias": lambda: config(mlp="swiglu"),
    "rms-gelu-learned-bias": lambda: config(norm="rms", positional="learned", bias=True),
    "modern-bias-rope-mha": lambda: config("modern", bias=True, num_kv_heads=4),
}
TOL = {np.float64: 1e-12, np.float32: 1e-5}


def perturbed(model, rng, scale=0.1):
    for p in model.params.values():
        p += rng.normal(0, scale, p.shape).astype(p.dtype)
    return model


def both_paths(model, ids, dlogits):
    """(loss, grads, logits, backward's grads) of the core and of the fast path."""
    out = []
    for fast in (False, True):
        model.use_fast_path = fast
        assert (model._fast() is not None) == fast
        loss, grads = model.loss(ids)
        logits, cache = model.forward(ids)
        out.append((loss, grads, logits, model.backward(dlogits, cache),
                    model.loss(ids, compute_grads=False)[0]))
    del model.use_fast_path
    return out


def assert_equal_paths(model, ids, rng, tol=None):
    dt = model.config.dtype
    tol = TOL[dt] if tol is None else tol
    dlogits = rng.standard_normal((*ids.shape, model.config.vocab_size)).astype(dt)
    core, fast = both_paths(model, ids, dlogits)
    assert abs(fast[0] - core[0]) <= tol * abs(core[0])
    assert fast[4] == pytest.approx(core[4], rel=tol)
    assert rel_error(fast[2], core[2]) < tol
    assert fast[2].dtype == dt
    for k in (1, 3):
        assert list(fast[k]) == list(model.params)
        for name in model.params:
            assert fast[k][name].dtype == dt and fast[k][name].shape == model.params[name].shape
            assert rel_error(fast[k][name], core[k][name]) < tol, (name, k)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fast_path_equals_the_core(name, dtype, monkeypatch):
    """Small blocks of queries and small chunks of rows, so that every loop runs several
    times (and its last round is a short one)."""
    monkeypatch.setattr(FG, "_BLOCK", 5)
    monkeypatch.setattr(FG, "_CHUNK_BYTES", 64)
    rng = np.random.default_rng(0)
    model = perturbed(GPT(dataclasses.replace(CONFIGS[name](), dtype=dtype), seed=1), rng)
    assert_equal_paths(model, rng.integers(0, 13, (3, 12)), rng)


@pytest.mark.parametrize("kind", ["classic", "modern"])
def test_fast_path_equals_the_core_at_its_own_block_size(kind):
    """Lengths past one block of queries (_BLOCK = 64), a shorter sequence than max_len, rows
    in several chunks."""
    rng = np.random.default_rng(1)
    c = config(kind, d_model=32, num_heads=4, max_len=80, dtype=np.float32)
    model = perturbed(GPT(c, seed=2), rng)
    assert FG._BLOCK == 64
    assert_equal_paths(model, rng.integers(0, 13, (5, 70)), rng)


@pytest.mark.parametrize("scale, shifted", [(1.0, False), (40.0, True)])
@pytest.mark.parametrize("kind", ["classic", "modern"])
def test_the_softmax_shifts_the_scores_only_when_they_could_overflow(kind, scale, shifted,
                                                                     monkeypatch):
    """Scores bounded by +-_EXP_SAFE (Cauchy-Schwarz on the queries' and keys' norms) go to exp
    as they are; larger ones (the query and key weights scaled up: scores in the hundreds, whose
    exponentials overflow float32) are shifted by their maximum first. Either way the fast path
    computes the core's numbers (float64), and float32 stays finite."""
    seen = []
    bounded = FG._scores_bounded
    monkeypatch.setattr(FG, "_scores_bounded", lambda *a: seen.append(bounded(*a)) or seen[-1])
    for dtype in (np.float64, np.float32):
        rng = np.random.default_rng(3)
        model = perturbed(GPT(config(kind, dtype=dtype), seed=4), rng, scale=0.3)
        c = model.config
        for i in range(c.num_layers):  # the query and key columns
            model.params[f"layers.{i}.attn.W_qkv"][:, :c.d_model + c.num_kv_heads * c.head_dim] \
                *= scale
        ids = rng.integers(0, 13, (3, 12))
        seen.clear()
        if dtype == np.float64:  # scores in the hundreds: their gradients lose digits
            assert_equal_paths(model, ids, rng, tol=1e-9)
        else:
            loss, grads = model.loss(ids)
            assert np.isfinite(loss) and all(np.isfinite(g).all() for g in grads.values())
        assert seen and any(not b for b in seen) == shifted


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gemm_add_adds_in_place_even_where_blas_returns_a_copy(dtype, monkeypatch):
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(s).astype(dtype) for s in ((5, 3), (3, 4), (5, 4)))
    expected = c + a @ b
    for left, right in ((a, b), (np.asfortranarray(a), np.ascontiguousarray(b.T).T)):
        got = c.copy()
        assert FG._gemm_add(left, right, got) is got
        np.testing.assert_allclose(got, expected, rtol=1e-5)
    real = FG.blas.sgemm if dtype == np.float32 else FG.blas.dgemm
    monkeypatch.setattr(FG.blas, "sgemm" if dtype == np.float32 else "dgemm",
                        lambda *args, c, **kw: real(*args, c=c.copy(order="F"), **kw))
    got = c.copy()
    FG._gemm_add(a, b, got)  # a SciPy that copied c would have left it unchanged
    np.testing.assert_allclose(got, expected, rtol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rank1_add_updates_in_place_even_where_blas_returns_a_copy(dtype, monkeypatch):
    rng = np.random.default_rng(1)
    u, v, a = (rng.standard_normal(s).astype(dtype) for s in ((5,), (4,), (5, 4)))
    expected = a + np.outer(u, v)
    got = a.copy()
    assert FG._rank1_add(u, v, got) is got
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    name = "sger" if dtype == np.float32 else "dger"
    real = getattr(FG.blas, name)
    monkeypatch.setattr(FG.blas, name,
                        lambda *args, a, **kw: real(*args, a=a.copy(order="F"), **kw))
    got = a.copy()
    FG._rank1_add(u, v, got)  # a SciPy that copied a would have left it unchanged
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_a_training_run_is_the_same_on_both_paths():
    """Adam steps from the same weights: the losses agree at every step (float64)."""
    from transformer_lab.optim import Adam

    ids = np.random.default_rng(3).integers(0, 13, (4, 12))
    losses = {}
    for fast in (False, True):
        model = GPT(config(), seed=0)
        model.use_fast_path = fast
        optimizer, losses[fast] = Adam(model.params, lr=0.01), []
        for _ in range(5):
            loss, grads = model.loss(ids)
            optimizer.step(grads)
            losses[fast].append(loss)
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-12)


@pytest.mark.parametrize("kind", ["classic", "modern"])
def test_training_with_dropout_draws_what_the_core_draws(kind):
    """GPT.loss(ids, rng=...) with the config's dropout: the same masks from the same
    generator, so the same loss and gradients, and the generator left in the same state."""
    rng = np.random.default_rng(6)
    model = perturbed(GPT(config(kind, dropout=0.3), seed=0), rng)
    ids = rng.integers(0, 13, (3, 12))
    results = {}
    for fast in (False, True):
        model.use_fast_path = fast
        gen = np.random.default_rng(7)
        results[fast] = (*model.loss(ids, rng=gen), gen.random())
    (loss, grads, after), (fast_loss, fast_grads, fast_after) = results[False], results[True]
    assert fast_after == after and abs(fast_loss - loss) < 1e-12 * loss
    assert all(rel_error(fast_grads[k], grads[k]) < 1e-12 for k in grads)
    assert model.loss(ids)[0] != loss  # without a generator: no dropout


def test_float32_stays_float32_and_results_do_not_share_the_pool():
    rng = np.random.default_rng(4)
    model = perturbed(GPT(config(dtype=np.float32), seed=0), rng)
    ids = rng.integers(0, 13, (2, 12))
    loss, grads = model.loss(ids)
    kept = {k: g.copy() for k, g in grads.items()}
    for g in grads.values():  # the caller owns its gradients: scribbling on them changes
        g[...] = np.nan       # nothing in the next step
    loss2, grads2 = model.loss(ids)
    assert loss2 == loss and all(np.array_equal(grads2[k], kept[k]) for k in kept)
    assert all(g.dtype == np.float32 for g in grads2.values())
    pool = FG._POOLS[-1]
    assert not pool.used and pool.free  # kept for the next step, all handed back
    shared = {id(a) for stack in pool.free.values() for a in stack}
    assert not shared & {id(g) for g in grads2.values()}
    kept = {id(a) for stack in pool.free.values() for a in stack}
    model.loss(rng.integers(0, 13, (2, 12)))  # the same shapes: the same arrays again
    assert {id(a) for stack in FG._POOLS[-1].free.values() for a in stack} == kept
    model.loss(rng.integers(0, 13, (3, 7)))  # other shapes: only this step's arrays are kept
    assert not any(key[0][0] == 24 for key in FG._POOLS[-1].free)
    FG.clear_pools()
    assert not FG._POOLS


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["classic", "modern"])
def test_the_steps_arrays_and_its_weight_gradients_start_on_a_cache_line(kind, dtype):
    """NumPy's arrays start 16 to 48 bytes past a multiple of 64 here; the fast path's own start
    on one (elementwise passes over them ran twice as fast), its weights' gradients too."""
    rng = np.random.default_rng(5)
    model = perturbed(GPT(config(kind, dtype=dtype, d_model=24, num_heads=2), seed=0), rng)
    model.use_fast_path = True
    FG.clear_pools()
    loss, grads = model.loss(rng.integers(0, 13, (3, 12)))
    pooled = [a for stack in FG._POOLS[-1].free.values() for a in stack]
    matrices = [g for g in grads.values() if g.ndim == 2]
    assert len(pooled) > 20 and len(matrices) >= 4 * model.config.num_layers + 1
    for a in pooled + matrices:  # (RoPE's rotations are complex arrays of the pool)
        assert a.ctypes.data % FG._ALIGN == 0 and a.flags.c_contiguous
    assert all(g.dtype == dtype for g in matrices)
    assert not any(np.shares_memory(g, a) for g in matrices for a in pooled)
    for shape in [(0, 5), (3, 0), (), (7,), (2, 3, 5)]:
        a = FG._empty(shape, dtype)
        assert a.shape == shape and a.dtype == dtype and a.flags.writeable
        assert a.size == 0 or a.ctypes.data % FG._ALIGN == 0


def test_the_core_computes_what_the_fast_path_does_not_cover(monkeypatch):
    calls = []
    real = core_gpt.gpt_loss

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(core_gpt, "gpt_loss", counted)
    ids = np.zeros((2, 12), dtype=int)
    GPT(config(), seed=0).loss(ids)
    assert calls == []  # the fast path
    tiled = GPT(config(attention_block_size=4), seed=0)
    assert not FG.supports(tiled.config) and tiled._fast() is None
    tiled.loss(ids)
    assert calls == [1]
    off = GPT(config(), seed=0)
    off.use_fast_path = False
    off.loss(ids)
    assert calls == [1, 1]


def test_a_cache_goes_back_to_the_path_that_made_it():
    rng = np.random.default_rng(5)
    model = perturbed(GPT(config(), seed=0), rng)
    ids = rng.integers(0, 13, (2, 12))
    logits, cache = model.forward(ids)
    assert isinstance(cache.core, FG.FastCache)
    model.use_fast_path = False  # switched between forward and backward: still consistent
    grads = model.backward(np.ones_like(logits), cache)
    _, core_cache = model.forward(ids)
    assert not isinstance(core_cache.core, FG.FastCache)
    core_grads = model.backward(np.ones_like(logits), core_cache)
    assert all(rel_error(grads[k], core_grads[k]) < 1e-12 for k in grads)


# ------------------------------------------------------------------ the handout


def test_the_handout_leaves_the_fast_path_out(tmp_path):
    """The handout's package is copied with package._ignore: the speed-only module stays behind,
    the model that imports it stays, and a package that kept it is refused."""
    shutil.copytree(PACKAGE.parent, tmp_path / "src", ignore=P._ignore(PACKAGE))
    out = tmp_path / "src" / "transformer_lab"
    assert "models/fast_gpt.py" in P.SPEED_ONLY
    assert not (out / "models" / "fast_gpt.py").exists()
    assert (out / "models" / "gpt.py").exists() and not (out / "course").exists()
    (out / "models" / "fast_gpt.py").write_text("")
    with pytest.raises(AssertionError, match="speed-only module"):
        P.assert_handout_package(out)


HANDOUT_GPT = r'''
import numpy as np
from transformer_lab.models import gpt
print("fast path:", gpt._fast_gpt)
model = gpt.GPT(gpt.GPTConfig(11, d_model=8, num_heads=2, num_layers=1, max_len=4), seed=0)
print("chosen:", model._fast())
try:
    model.loss(np.zeros((2, 4), dtype=int))
except NotImplementedError as err:
    print("core:", err)
'''


def test_in_the_handout_the_gpt_trains_on_the_students_core(tmp_path):
    """A package as the handout has it -- without the speed-only module, with the core's
    ``gpt_loss`` a stub -- imports, and its GPT's loss stops at the stub: the model computes
    with the student's core, not with code the student did not write."""
    from transformer_lab import syllabus

    out = run_in_handout_package(tmp_path, "gpt", HANDOUT_GPT)
    assert "fast path: None" in out and "chosen: None" in out
    assert f"core: {syllabus.stub_message('gpt_loss')}" in out
    assert model_gpt._fast_gpt is FG  # here, in the instructors' package, it is there
