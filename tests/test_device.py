"""The core on a device (issue 38), tested without a GPU: the core bound to the stand-in array
module of ``tests/standin.py`` (NumPy behind DeviceArray, which refuses to mix with host arrays,
as CuPy's arrays do). Every forward, backward, optimiser step, sampling step, ``GPT.generate``,
beam search and a few trainer steps keep their arrays on the "device" -- no plain NumPy array
leaks out -- and give the CPU's numbers. The stand-in computes with NumPy and draws NumPy's
random numbers, so "the CPU's numbers" means equal, not equal to rounding: any difference is a
different computation, not rounding. One difference is meant: on the device the global norm for
clipping is summed over the gradients laid end to end (one test, to a tolerance from float32's
eps and the size of the sum)."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import subprocess
import sys
import types

import numpy as np
import pytest
from standin import DeviceArray, HostArrayError, assert_on_device, host_arrays, standin

from transformer_lab import device
from transformer_lab.core import layers as core_layers
from transformer_lab.core import optim as core_optim
from transformer_lab.core import translation as core_translation
from transformer_lab.models.encoder_decoder import Transformer, TransformerConfig
from transformer_lab.models.gpt import GPT, GPTConfig
from transformer_lab.optim import SGD, Adam, AdamW, clip_grad_norm, global_norm
from transformer_lab.train.charlm import decay_groups


@pytest.fixture
def on_standin():
    with device.on(standin):
        yield
    assert device.name == "cpu" and core_layers.np is np


@pytest.fixture
def cuda_is_the_standin(monkeypatch):
    """``--device cuda`` binds the core to the stand-in (the trainers' own command lines)."""
    monkeypatch.setattr(device, "_cupy", lambda: (standin, standin.erf))
    yield
    device.use("cpu")


def on_cpu_and_device(run):
    """``run()`` on the CPU, then bound to the stand-in; both results."""
    cpu = run()
    with device.on(standin):
        dev = run()
    return cpu, dev


def assert_equal_values(cpu, dev, where="output"):
    """The same structure with the same values (dev on the device, cpu on the host)."""
    assert_on_device(dev, where)
    if isinstance(cpu, dict):
        assert cpu.keys() == dev.keys(), where
        for k in cpu:
            assert_equal_values(cpu[k], dev[k], f"{where}[{k!r}]")
    elif isinstance(cpu, (tuple, list)):
        assert len(cpu) == len(dev), where
        for i, (c, d) in enumerate(zip(cpu, dev, strict=True)):
            assert_equal_values(c, d, f"{where}[{i}]")
    elif isinstance(cpu, np.ndarray):
        np.testing.assert_array_equal(np.asarray(dev), cpu, err_msg=where)
    else:
        assert type(dev) is type(cpu) and dev == cpu, (where, cpu, dev)


GPT_CONFIGS = {
    "classic": dict(),
    "modern": dict(kind="modern"),  # RMSNorm, SwiGLU, RoPE, grouped-query attention
    "tiled": dict(attention_block_size=4),
    "exact-gelu-sinusoidal": dict(mlp="gelu", positional="sinusoidal"),  # erf, bound too
    "dropout": dict(dropout=0.2),
    "modern-untied": dict(kind="modern", tie_embeddings=False),  # lm_head.W
}


def gpt_config(kind="classic", **kw):
    make = GPTConfig.classic if kind == "classic" else GPTConfig.modern
    return make(13, **{"d_model": 16, "num_heads": 4, "num_layers": 2, "max_len": 12, **kw})


# --------------------------------------------------------------------------------------------
# The binding


def test_use_binds_every_core_module_and_back(on_standin):
    modules = device.core_modules()
    assert {m.__name__.rsplit(".", 1)[1] for m in modules} >= {
        "layers", "attention", "multihead", "gqa", "flash", "rope", "modern", "sampling",
        "optim", "translation", "model", "next_token"}
    assert all(m.np is standin for m in modules) and core_layers.erf is standin.erf
    assert device.xp is standin and device.generator(0).__class__ is standin.random.Generator
    device.use("cpu")
    assert all(m.np is np for m in modules) and device.xp is np
    from scipy.special import erf
    assert core_layers.erf is erf


def test_the_core_reaches_numpy_by_np_only():
    assert device.core_problems() == [] and device.core_problems(standin) == []


def line_of(module: str, text: str) -> int:
    """The number of the core's first line in ``core/{module}.py`` that holds ``text``."""
    source = (device._CORE / f"{module}.py").read_text().split("\n")
    return next(i for i, line in enumerate(source, 1) if text in line)


def test_a_name_the_devices_array_module_lacks_is_named_before_binding():
    class Older(type(standin)):  # as CuPy 13 lacks np.put_along_axis, CuPy's generators choice
        __version__ = "13.6.0"
        random = types.SimpleNamespace(Generator=type("Generator", (), {"uniform": None}))

        def __getattr__(self, attr):
            if attr == "partition":
                raise AttributeError(attr)
            return super().__getattr__(attr)

    with pytest.raises(device.DeviceError) as err:
        device.use(Older("older"))
    message = str(err.value)
    assert (f"core/sampling.py, line {line_of('sampling', 'np.partition(')}, in top_k_filter: "
            f"np.partition is not in older 13.6.0: write it with the functions it has") in message
    assert (f"core/layers.py, line {line_of('layers', 'rng.random(')}, in dropout_forward: "
            f"rng.random is not a method of older 13.6.0's random.Generator, which has "
            f"uniform") in message
    assert "rng.uniform" not in message
    assert device.name == "cpu" and core_layers.np is np  # nothing bound


def test_a_core_function_that_imports_numpy_by_another_name_is_named_before_binding(
        tmp_path, monkeypatch):
    core = tmp_path / "core"
    core.mkdir()
    for path in device._CORE.glob("*.py"):
        (core / path.name).write_text(path.read_text())
    source = (core / "layers.py").read_text().replace(
        "    out = np.maximum(x, 0)\n",
        "    from numpy import maximum\n    out = maximum(x, 0)\n")
    source = source.replace("    dW = np.zeros(shape, dtype=dout.dtype)",
                            "    dW = numpy.zeros(shape, dtype=dout.dtype)")
    source += ("\nNEG, DT = -np.inf, np.float32  # not arrays: no problem\nTABLE = np.arange(3)\n"
               "\n\ndef extra(x):\n    import numpy as np\n    return np.tanh(x)\n"
               "\n\ndef via_torch(x):\n    import torch\n    return torch.relu(x)\n")
    (core / "layers.py").write_text(source)
    monkeypatch.setattr(device, "_CORE", core)
    monkeypatch.setitem(sys.modules, "cupy", None)  # found without CuPy, before looking for it
    for where in (standin, "cuda"):
        with pytest.raises(device.DeviceError, match="the core cannot run") as err:
            device.use(where)
        message = str(err.value)
        line = source.split("\n").index("    from numpy import maximum") + 1
        assert f"core/layers.py, line {line}, in relu_forward: 'from numpy import ...' reaches " \
               f"the host's library" in message
        assert "in embedding_backward: 'numpy.' spelled out" in message
        assert "top level: np.arange(...) at import time makes a host array" in message
        assert "in extra: 'import numpy as np' reaches the host's library" in message
        assert "in via_torch: 'import torch' reaches the host's library" in message
        assert message.count("core/layers.py") == 6 and "CuPy" not in message
        assert device.name == "cpu" and core_layers.np is np  # nothing bound


def test_a_core_function_replaced_from_outside_the_core_is_named(monkeypatch):
    def relu_forward(x):  # a notebook's: its np is this module's, not the core's
        return np.maximum(x, 0), x > 0

    monkeypatch.setattr(core_layers, "relu_forward", relu_forward)
    with pytest.raises(device.DeviceError, match=r"core/layers.py: relu_forward was replaced "
                                                 r"by a function defined in .*test_device.py"):
        device.use(standin)


def test_without_cupy_cuda_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    with pytest.raises(device.DeviceError) as err:
        device.use("cuda")
    for words in ("which is not installed", "cupy-cuda12x", "cupy-cuda13x", "[ctk]", "Colab"):
        assert words in str(err.value)
    with pytest.raises(ValueError, match="device must be one of"):
        device.use("gpu")
    with pytest.raises(ValueError, match="an array module with erf"):
        device.use(np)


@pytest.mark.parametrize("cupy, says", [
    ("raise ImportError('libcudart.so.12: cannot open shared object file')",
     "CuPy, which does not import here (ImportError: libcudart.so.12: cannot open"),
    ("def arange(n):\n    raise RuntimeError('CuPy failed to load libnvrtc.so.12')",
     "CuPy failed here (RuntimeError: CuPy failed to load libnvrtc.so.12); where CUDA's "
     "libraries are missing, pip install 'cupy-cuda12x[ctk]'")])
def test_a_broken_cupy_or_gpu_is_named_with_what_cupy_said(cupy, says, tmp_path, monkeypatch):
    for package, text in (("cupy", cupy), ("cupyx", ""), ("cupyx/scipy", ""),
                          ("cupyx/scipy/special", "erf = None")):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(text + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in ("cupy", "cupyx", "cupyx.scipy", "cupyx.scipy.special"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(device.DeviceError, match=re.escape(says)):
        device.use("cuda")
    assert device.name == "cpu" and core_layers.np is np


@pytest.mark.parametrize("task", ["reverse", "charlm", "translate-fr"])
def test_the_trainers_refuse_cuda_without_cupy_before_any_work(task):
    code = ("import sys; sys.modules['cupy'] = None\n"
            "from transformer_lab.train.cli import main\n"
            f"main(['--task', '{task}', '--device', 'cuda'])\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and res.stdout == ""
    assert "cupy-cuda12x" in res.stderr and "Traceback" not in res.stderr
    assert "usage:" not in res.stderr  # not a mistake in the options: the sentence alone


def test_the_trainers_help_describes_the_device():
    from transformer_lab.train import charlm, cli, translate

    for parser in (cli._parser(), charlm._parser(), translate._parser()):
        text = " ".join(parser.format_help().split())
        assert "--device {cpu,cuda}" in text and "not reproduce a cpu run bit for bit" in text


def test_put_and_to_host(on_standin):
    a = np.arange(3.0)
    on = device.put(a)
    assert isinstance(on, DeviceArray) and device.put(on) is on and device.on_device(on)
    back = device.to_host(on)
    assert type(back) is np.ndarray and not device.on_device(back)
    assert device.to_host(2.0) == 2.0
    with pytest.raises(HostArrayError):
        on + a  # as CuPy: a host array does not mix with a device array


def test_a_model_left_on_the_device_comes_back_to_the_host_by_copy():
    """A trainer run with device="cuda" returns to the CPU with its model on the GPU: put,
    to_host and model.copy() (the hint of the parameters' check) bring such arrays home."""
    model = GPT(gpt_config(), seed=0)
    with device.on(standin):
        left = model.copy()
        on = device.put(np.arange(3.0))
    assert type(device.to_host(on)) is np.ndarray and type(device.put(on)) is np.ndarray
    home = left.copy()
    assert all(type(p) is np.ndarray for p in home.params.values())
    ids = np.arange(12).reshape(2, 6) % model.config.vocab_size
    assert home.loss(ids, compute_grads=False)[0] == model.loss(ids, compute_grads=False)[0]


# --------------------------------------------------------------------------------------------
# The GPT


@pytest.mark.parametrize("name", GPT_CONFIGS)
def test_gpt_forward_backward_and_loss_stay_on_the_device_with_the_cpus_numbers(name):
    config = gpt_config(**GPT_CONFIGS[name])
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (3, config.max_len))

    def run():
        model = GPT(config, seed=0)
        logits, cache = model.forward(ids)
        dlogits = device.put(np.random.default_rng(1).standard_normal(logits.shape)
                             .astype(logits.dtype))
        drop = device.generator(2) if config.dropout else None
        loss, grads = model.loss(ids, rng=drop)
        return {"params": model.params, "logits": logits, "loss": loss, "grads": grads,
                "backward": model.backward(dlogits, cache),
                "eval loss": model.loss(ids, compute_grads=False)[0]}

    cpu, dev = on_cpu_and_device(run)
    assert_equal_values(cpu, dev)
    assert type(dev["loss"]) is float


@pytest.mark.parametrize("optimizer", [
    lambda p: Adam(p, lr=1e-2), lambda p: AdamW(p, lr=1e-2, weight_decay=0.1),
    lambda p: SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)],
    ids=["adam", "adamw", "sgd"])
def test_optimiser_steps_update_the_parameters_on_the_device(optimizer):
    config = gpt_config("modern", dropout=0.1)
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (2, config.max_len))

    def run():
        model, rng = GPT(config, seed=0), device.generator(3)
        opt = optimizer(model.params)
        for _ in range(3):
            opt.step(model.loss(ids, rng=rng)[1])
        return model.params

    cpu, dev = on_cpu_and_device(run)
    assert_equal_values(cpu, dev)


def mixed_arrays(rng) -> dict:
    """Arrays on the device, in two dtypes -- float32: four arrays, among them a transposed view
    and an empty one (12 + 4 + 6 numbers); float64: a 0-d array alone -- drawn from ``rng``."""
    shapes = {"W": ((3, 4), np.float32), "s": ((), np.float64), "b": ((4,), np.float32),
              "T": ((2, 3), np.float32), "e": ((0,), np.float32)}
    arrays = {n: device.put(np.asarray(rng.standard_normal(s), dt))
              for n, (s, dt) in shapes.items()}
    return {**arrays, "T": arrays["T"].T}  # (3, 2), not contiguous


@pytest.mark.parametrize("optimizer", [
    lambda p: Adam(p, lr=1e-2, weight_decay=0.1), lambda p: AdamW(p, lr=1e-2, weight_decay=0.1),
    lambda p: SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)],
    ids=["adam", "adamw", "sgd"])
def test_on_the_device_the_parameters_laid_end_to_end_take_the_cpus_steps(optimizer,
                                                                         monkeypatch):
    """On the CPU the core updates one parameter array at a time; on the device, one flat array
    per dtype (:func:`mixed_arrays`; the float64 0-d array alone, updated in place): the same
    steps, bit for bit, one core call per dtype."""
    calls = []

    def spy(*args, _real, **kwargs):
        calls.append(_real.__name__)
        return _real(*args, **kwargs)

    def run():
        rng = np.random.default_rng(0)
        params = mixed_arrays(rng)
        opt = optimizer(params)
        with monkeypatch.context() as patch:  # (once bound: the device refuses a replaced core)
            for name in ("adam_step", "sgd_step"):
                patch.setattr(core_optim, name,
                              functools.partial(spy, _real=getattr(core_optim, name)))
            for _ in range(3):
                opt.step(mixed_arrays(rng))
        return params

    cpu, dev = on_cpu_and_device(run)
    assert_equal_values(cpu, dev)
    assert len(calls) == 3 * 5 + 3 * 2  # on the CPU, 5 arrays a step; on the device, 2 dtypes


def test_on_the_device_clipping_scales_the_gradients_laid_end_to_end(monkeypatch):
    """The core's clip_grad_norm clips one gradient array at a time on the CPU, and on the device
    each dtype's laid end to end (:func:`mixed_arrays`; the float64 0-d array alone, scaled in
    place), then copied back: the same gradients, up to the order in which the float32 squares
    are summed. Two float32 sums of the same n squares (>= 0) differ by at most 2 n u relative
    (u = eps / 2), n eps; the square root halves that; the scale and each product round once
    more in float32: n eps / 2 + 2 eps, within n eps + eps (n >= 2)."""
    eps = float(np.finfo(np.float32).eps)
    tol = (12 + 4 + 6) * eps  # n: the float32 squares
    calls = []

    def spy(grads, max_norm, _real=core_optim.clip_grad_norm):
        calls.append(len(grads))
        return _real(grads, max_norm)

    def run(max_norm):
        grads = mixed_arrays(np.random.default_rng(0))
        given = dict(grads)
        with monkeypatch.context() as patch:  # (once bound: the device refuses a replaced core)
            patch.setattr(core_optim, "clip_grad_norm", spy)
            total = clip_grad_norm(grads, max_norm)
        assert all(grads[name] is g for name, g in given.items())  # scaled in place
        return total, grads

    for max_norm, scaled in ((1.0, True), (1e3, False)):
        calls.clear()
        (cpu_total, cpu), (dev_total, dev) = on_cpu_and_device(functools.partial(run, max_norm))
        assert calls == [5, 2]  # on the CPU, 5 arrays; on the device, 2 dtypes
        assert type(dev_total) is float and dev_total == pytest.approx(cpu_total, rel=tol)
        assert_on_device(dev)
        assert (cpu_total > max_norm) is scaled
        for name, g in cpu.items():
            np.testing.assert_allclose(np.asarray(dev[name]), g, rtol=tol + eps, err_msg=name)
        if scaled:  # to max_norm (the core's 1e-6 below it)
            assert core_optim.global_norm(cpu) == pytest.approx(max_norm, rel=tol)
        else:  # every gradient as drawn, bit for bit
            assert_equal_values(cpu, dev)


def test_clipping_refuses_gradients_off_the_device(on_standin):
    grads = {"W": device.put(np.ones((2, 2))), "b": np.ones(2)}
    for clip in (lambda: clip_grad_norm(grads, 1.0), lambda: global_norm(grads)):
        with pytest.raises(ValueError, match=r"grads\['b'\] is not on the device"):
            clip()


def test_on_the_device_a_failing_step_changes_nothing(on_standin):
    """Every gradient, of every dtype's flat array, is checked before any is updated."""
    rng = np.random.default_rng(0)
    params = {"W": device.put(rng.standard_normal((3, 4)).astype(np.float32)),
              "b": device.put(rng.standard_normal(4))}  # two groups: float32, then float64
    opt = AdamW(params, lr=0.1)
    opt.step({n: device.put(rng.standard_normal(p.shape).astype(p.dtype))
              for n, p in params.items()})
    before = [a.copy() for a in (*params.values(), *opt.m, *opt.v)]
    with pytest.raises(FloatingPointError, match=r"grads\['b'\] contains NaN"):
        opt.step({"W": device.put(np.ones((3, 4), np.float32)),
                  "b": device.put(np.array([0, np.nan, 0, 0]))})
    for a, b in zip((*params.values(), *opt.m, *opt.v), before, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert opt.steps == 1


def test_a_training_step_waits_for_the_device_once_per_look_not_once_per_array(on_standin):
    model = GPT(gpt_config(num_layers=4), seed=0)  # 52 arrays
    decayed, kept = decay_groups(model.params)
    opts = [AdamW(decayed, lr=1e-3, weight_decay=0.1), Adam(kept, lr=1e-3)]
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 12))
    standin.waits = 0
    loss, grads = model.loss(ids)  # as the trainer's step: the loss, a Python float
    clip_grad_norm(grads, 1.0)  # the global norm
    for opt in opts:  # each checks every gradient is finite
        opt.step({name: grads[name] for name in opt.params})
    assert standin.waits == 4, f"{standin.waits} transfers to the host in one step"


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("sampling", [dict(temperature=0), dict(temperature=0.8, top_k=5),
                                      dict(temperature=1.2, top_p=0.9)],
                         ids=["greedy", "top-k", "top-p"])
@pytest.mark.parametrize("tie", [True, False])
def test_generate_and_sampling_stay_on_the_device(use_cache, sampling, tie):
    config = gpt_config("modern", max_len=16, tie_embeddings=tie)

    def run():
        model = GPT(config, seed=0)
        return model.generate(np.array([[1, 2, 3], [4, 5, 6]]), 8, seed=0, use_cache=use_cache,
                              return_logits=True, **sampling)

    cpu, dev = on_cpu_and_device(run)
    assert_equal_values(cpu, dev)  # the stand-in draws NumPy's numbers: the same tokens


def test_a_checkpoint_goes_through_the_host(tmp_path):
    host_model = GPT(gpt_config(), seed=0)
    device.use(standin)
    with pytest.raises(ValueError, match=r"model.params\['embed.W'\] is not on the device the "
                                         r"core runs on \(standin\).*model.copy\(\)"):
        host_model.forward(np.zeros((1, 3), dtype=np.int64))
    model = host_model.copy()
    path = model.save(tmp_path / "m.npz")
    with np.load(path) as f:
        assert all(type(f[k]) is np.ndarray for k in f.files)
    loaded = GPT.load(path)
    assert_on_device(loaded.params)
    loaded.load_params(path)
    loaded.set_params({"norm.gamma": np.full(16, 2.0)})
    assert_on_device(loaded.params)
    device.use("cpu")


def test_a_host_generator_is_refused_on_the_device(on_standin):
    model = GPT(gpt_config(dropout=0.1), seed=0)
    with pytest.raises(TypeError, match=r"transformer_lab.device.generator\(seed\)"):
        model.loss(np.zeros((1, 3), dtype=np.int64), rng=np.random.default_rng(0))


# --------------------------------------------------------------------------------------------
# The encoder-decoder and beam search


def encoder_decoder():
    config = TransformerConfig(src_vocab_size=11, tgt_vocab_size=12, d_model=16, num_heads=4,
                               num_encoder_layers=2, num_decoder_layers=2, d_ff=32, max_len=12)
    return Transformer(config, seed=0)


def test_encoder_decoder_and_its_decoders_stay_on_the_device():
    rng = np.random.default_rng(0)
    src = rng.integers(3, 11, (3, 7))
    src[0, 5:] = 0  # padding
    tgt = np.concatenate([np.full((3, 1), 1), rng.integers(3, 12, (3, 5)), np.full((3, 1), 2)],
                         axis=1)

    def run():
        model = encoder_decoder()
        logits, cache = model.forward(src, tgt[:, :-1])
        loss, grads = model.loss(src, tgt)
        beams = {f"cache={c}": model.beam_decode(src, beam_size=3, max_len=6, n_best=True,
                                                 cache=c) for c in (True, False)}
        return {"logits": logits, "backward": model.backward(logits * 0.5, cache), "loss": loss,
                "grads": grads, "greedy": model.greedy_decode(src, max_len=6),
                "padded": model.greedy_decode(src, max_len=6, padded=True), **beams}

    cpu, dev = on_cpu_and_device(run)
    assert_equal_values(cpu, dev)


def test_the_core_beam_search_and_label_smoothing_stay_on_the_device():
    logp = np.log(np.random.default_rng(0).dirichlet(np.ones(6), size=(2 * 3, 5)))

    def run():
        table = device.put(logp)

        def step(prefix, rows):
            return table[:, prefix.shape[1] - 1]
        seqs, scores = core_translation.beam_search(step, 2, 3, 4, 1, 2, 0, 0.6)
        labels = device.put(np.array([[3, 4, -100], [5, -100, -100]]))
        loss, cache = core_translation.label_smoothed_loss_forward(table[:2, :3], labels, 0.1)
        return seqs, scores, loss, core_translation.label_smoothed_loss_backward(1.0, cache)

    cpu, dev = on_cpu_and_device(run)
    assert_equal_values(cpu, dev)


# --------------------------------------------------------------------------------------------
# The trainers, through their command lines, with --device cuda bound to the stand-in


def _json_line(capsys) -> dict:
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    return json.loads(out[0])


def test_the_toy_task_trainer_on_the_device(cuda_is_the_standin, capsys):
    from transformer_lab.train import train
    from transformer_lab.train.cli import main

    args = ["--task", "reverse", "--steps", "6", "--warmup", "2", "--eval-every", "3",
            "--n-train", "200", "--n-val", "20", "--n-test", "20", "--progress", "none"]
    main([*args, "--device", "cuda"])
    dev = _json_line(capsys)
    main(args)
    cpu = _json_line(capsys)
    assert dev.pop("device") == "cuda" and cpu.pop("device") == "cpu"
    for key in ("seconds", "train_seconds", "tokens_per_s", "step_ms"):
        dev.pop(key), cpu.pop(key)
    assert dev == cpu

    with device.on("cuda"):
        result = train("reverse", steps=3, warmup=1, n_train=100, n_val=10, n_test=10,
                       progress="none", device="cuda")
    assert_on_device(result.model.params)
    assert all(type(x) is float for x in result.history.loss + result.history.grad_norm)


def test_the_charlm_trainer_on_the_device(cuda_is_the_standin, capsys, monkeypatch, tmp_path):
    from transformer_lab.datasets import corpus
    from transformer_lab.train import charlm

    rng = np.random.default_rng(0)
    small = dataclasses.replace(corpus.load_corpus(), train_ids=rng.integers(2, 98, 3000),
                                val_ids=rng.integers(2, 98, 600))
    monkeypatch.setattr(charlm, "load_corpus", lambda: small)
    args = ["--steps", "3", "--warmup", "1", "--eval-every", "2", "--d-model", "16",
            "--num-layers", "1",
            "--context", "16", "--batch-size", "2", "--eval-tokens", "64", "--dropout", "0.1",
            "--quiet", "--samples", "2",
            "--clip", "0"]  # the device sums the global norm in another order (tested above)
    charlm.main([*args, "--device", "cuda", "--checkpoint", str(tmp_path / "gpu.npz")])
    dev = _json_line(capsys)
    charlm.main(args)
    cpu = _json_line(capsys)
    for key in ("seconds", "train_seconds", "cpu_seconds", "tokens_per_s"):
        dev.pop(key), cpu.pop(key)
    assert (dev.pop("device"), cpu.pop("device")) == ("cuda", "cpu")
    assert dev.pop("checkpoint") == str(tmp_path / "gpu.npz")
    assert dev == cpu  # dropout's draws: NumPy's generator behind the stand-in
    assert GPT.load(tmp_path / "gpu.npz").metadata["config"]["device"] == "cuda"


def test_the_translation_trainer_on_the_device(cuda_is_the_standin):
    from transformer_lab.train.translate import TranslateConfig, train_translation

    config = TranslateConfig(n_train=200, n_val=10, n_test=10, steps=3, warmup=1, eval_every=2,
                             d_model=16, num_layers=1, d_ff=32, beam_size=2)
    dev = train_translation(config, device="cuda")
    cpu = train_translation(config)
    assert_on_device(dev.model.params)
    assert dev.history == cpu.history
    for key in ("exact_match", "beam_exact_match", "bleu", "chrf", "final_loss"):
        assert dev.metrics[key] == cpu.metrics[key]


# --------------------------------------------------------------------------------------------
# The leak check catches a leak


def test_a_core_function_that_returns_a_host_array_is_caught(monkeypatch, on_standin):
    """The stand-in tests would fail if one core function returned a host array: the next
    operation that meets it raises, and an output that is one is named."""
    model = GPT(gpt_config(), seed=0)
    ids = np.zeros((1, 4), dtype=np.int64)
    real = core_layers.layer_norm_forward

    def leaking(*args, **kwargs):
        out, cache = real(*args, **kwargs)
        return np.asarray(out), cache  # a plain NumPy array: a host copy

    monkeypatch.setattr("transformer_lab.core.gpt.layer_norm_forward", leaking)
    with pytest.raises(HostArrayError, match="a host \\(NumPy\\) array"):
        model.loss(ids)

    monkeypatch.undo()
    real_tied = core_layers.tied_output_forward
    monkeypatch.setattr("transformer_lab.core.gpt.tied_output_forward",
                        lambda x, W: (np.asarray(real_tied(x, W)[0]), real_tied(x, W)[1]))
    logits, _ = model.forward(ids)
    assert host_arrays(logits, "logits") == ["logits: float32(1, 4, 13)"]
    with pytest.raises(AssertionError, match="host arrays leaked"):
        assert_on_device({"logits": logits})
