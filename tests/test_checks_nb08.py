"""Notebook 10's checks: the classic wrong optimiser steps, clipping and training steps fail with
the hint that names the mistake; the handout's form of the checks (hidden tests stripped, stored
answers for the hidden reference) runs on the solutions."""

import math
import re
import types
from pathlib import Path

import numpy as np
import pytest

from transformer_lab.checks import CheckFailed, check
from transformer_lab.checks import framework as F
from transformer_lab.core import optim as CO
from transformer_lab.core import training as CT

MODULE = Path(F.__file__).with_name("nb10_training.py")


def _fails(check_id, *functions):
    with pytest.raises(CheckFailed) as err:
        check(check_id, *functions)
    return str(err.value)


# -------------------------------------------------------------------------------- solutions


def noam_lr(steps, d_model, warmup):
    s = np.asarray(steps, dtype=np.float64)
    return d_model ** -0.5 * np.minimum(s ** -0.5, s * warmup ** -1.5)


def rmsprop_step(params, grads, state, lr=0.01, alpha=0.99, eps=1e-8, weight_decay=0.0,
                 momentum=0.0, centered=False, eps_inside=False):
    for name, p in params.items():
        g = grads[name] + weight_decay * p if weight_decay else grads[name]
        st = state.setdefault(name, {"v": np.zeros_like(p), "g": np.zeros_like(p),
                                     "b": np.zeros_like(p)})
        st["v"] = alpha * st["v"] + (1 - alpha) * g * g
        square = st["v"]
        if centered:
            st["g"] = alpha * st["g"] + (1 - alpha) * g
            square = st["v"] - st["g"] ** 2
        a = np.sqrt(square + eps) if eps_inside else np.sqrt(square) + eps
        if momentum > 0:
            st["b"] = momentum * st["b"] + g / a
            p -= lr * st["b"]
        else:
            p -= lr * g / a


def sample_decode(model, src, temperature, rng, max_len, use_temperature=True, pad=True):
    c = model.config
    out = np.full((src.shape[0], 1), c.bos_id, dtype=np.int64)
    done = np.zeros(src.shape[0], dtype=bool)
    for _ in range(max_len):
        logits, _ = model.forward(src, out)
        z = logits[:, -1].astype(np.float64) / (temperature if use_temperature else 1.0)
        p = np.exp(z - z.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        u = rng.random(src.shape[0])[:, None]
        nxt = np.minimum((np.cumsum(p, axis=-1) < u).sum(axis=-1), p.shape[-1] - 1)
        if pad:
            nxt = np.where(done, c.pad_id, nxt)
        out = np.concatenate([out, nxt[:, None]], axis=1)
        done |= nxt == c.eos_id
        if done.all():
            break
    return out


# -------------------------------------------------------------------------------- SGD


def _sgd(first="g", nesterov_ok=True, in_place=True, copy_first=True):
    def sgd_step(p, g, buf, lr, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False):
        if weight_decay:
            g = g + weight_decay * p
        if momentum:
            if buf is None:
                buf = (g.copy() if copy_first else g) if first == "g" else (1 - dampening) * g
            else:
                buf *= momentum
                buf += (1 - dampening) * g
            g = g + momentum * buf if nesterov and nesterov_ok else buf
        if in_place:
            p -= lr * g
        else:
            p = p - lr * g
        return buf
    return sgd_step


@pytest.mark.parametrize("wrong,case,words", [
    (_sgd(first="zero"), "dampening 0.5", "starting the momentum buffer at zero"),
    (_sgd(nesterov_ok=False), "Nesterov", "ignoring nesterov"),
    (_sgd(in_place=False), "plain SGD", "instead of p in place"),
])
def test_sgd_mistakes_get_their_hint(monkeypatch, wrong, case, words):
    monkeypatch.setattr(CO, "sgd_step", wrong)
    message = _fails("check-sgd-step")
    assert case in message.split("\n")[1] and words in message, message
    assert "expected" in message


def test_sgd_buffer_that_aliases_the_gradient_is_noticed(monkeypatch):
    monkeypatch.setattr(CO, "sgd_step", _sgd(copy_first=False))
    message = _fails("check-sgd-step")
    assert "momentum 0.9, later steps" in message and "changed its input" in message


# -------------------------------------------------------------------------------- Adam


def _adam(correction=0, eps_inside=False, decay="torch", state_in_place=True, python_t=True):
    def adam_step(p, g, m, v, t, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
                  decoupled=False):
        if weight_decay and (decoupled if decay == "torch" else decay == "decoupled"):
            p *= 1 - lr * weight_decay
        elif weight_decay:
            g = g + weight_decay * p
        m_new = beta1 * m + (1 - beta1) * g
        v_new = beta2 * v + (1 - beta2) * g * g
        if state_in_place:
            m[...], v[...] = m_new, v_new
        c1 = c2 = 1.0
        if correction is not None:
            tc = t + correction if python_t else np.float64(t + correction)
            c1, c2 = 1 - beta1 ** tc, 1 - beta2 ** tc
        step = lr / c1
        denom = np.sqrt(v_new / c2 + eps) if eps_inside else np.sqrt(v_new) / np.sqrt(c2) + eps
        p -= step * m_new / denom
    return adam_step


@pytest.mark.parametrize("wrong,case,words", [
    (_adam(correction=None), "the first step", "without the bias correction"),
    (_adam(correction=-1, python_t=False), "the first step", "bias correction of step t - 1"),
    (_adam(correction=1), "the first step", "bias correction of step t + 1"),
    (_adam(eps_inside=True), "later steps", "eps inside the square root"),
    (_adam(decay="gradient"), "AdamW", "adding AdamW's weight decay to the gradient"),
    (_adam(decay="decoupled"), "Adam with weight decay", "decoupling the weight decay for Adam"),
    (_adam(state_in_place=False), "the first step", "instead of m and v in place"),
])
def test_adam_mistakes_get_their_hint(monkeypatch, wrong, case, words):
    monkeypatch.setattr(CO, "adam_step", wrong)
    with np.errstate(divide="ignore", invalid="ignore"):  # t - 1: 1 - beta ** 0 = 0 at t = 1
        message = _fails("check-adam-step")
    assert case in message.split("\n")[1] and words in message, message


def test_adam_t_minus_1_with_python_floats_names_the_line(monkeypatch):
    monkeypatch.setattr(CO, "adam_step", _adam(correction=-1))
    message = _fails("check-adam-step")
    assert "ZeroDivisionError" in message and "step = lr / c1" in message


# -------------------------------------------------------------------------------- clipping


def test_global_norm_mistake(monkeypatch):
    monkeypatch.setattr(CO, "global_norm",
                        lambda grads: sum(float(np.linalg.norm(g)) for g in grads.values()))
    message = _fails("check-global-norm")
    assert "arrays of different shapes" in message and "adding up the arrays' norms" in message


def _clip(per_array=False, cap=True, plus=1e-6, after=False, in_place=True):
    def clip_grad_norm(grads, max_norm):
        total = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
        for g in grads.values():
            n = math.sqrt(float((g * g).sum())) if per_array else total
            scale = max_norm / (n + plus)
            if cap:
                scale = min(scale, 1.0)
            if in_place:
                g *= g.dtype.type(scale)
        if after:
            return math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
        return total
    return clip_grad_norm


@pytest.mark.parametrize("wrong,case,words", [
    (_clip(per_array=True), "above the threshold", "clipping each gradient on its own"),
    (_clip(cap=False), "below the threshold", "scaling gradients below the threshold up"),
    (_clip(after=True), "above the threshold", "the norm after clipping instead of before"),
    (_clip(plus=0.0), "above the threshold", "without torch's + 1e-6"),
    (_clip(in_place=False), "above the threshold", "the caller's gradient arrays are not scaled"),
])
def test_clipping_mistakes_get_their_hint(monkeypatch, wrong, case, words):
    monkeypatch.setattr(CO, "clip_grad_norm", wrong)
    message = _fails("check-clip-grad-norm")
    assert case in message.split("\n")[1] and words in message, message


# -------------------------------------------------------------------------------- train_step


def _train_step(order="right", norm_after=False, clip_zero=False):
    def train_step(model, optimizer, src, tgt, lr, clip):
        loss, grads = model.loss(src, tgt)
        if order == "lr after":
            norm = CO.clip_grad_norm(grads, clip) if clip else CO.global_norm(grads)
            optimizer.step(grads)
            optimizer.lr = lr
            return loss, norm
        if order == "clip after":
            optimizer.lr = lr
            norm = CO.global_norm(grads)
            optimizer.step(grads)
            if clip:
                CO.clip_grad_norm(grads, clip)
            return loss, norm
        norm = CO.clip_grad_norm(grads, clip) if clip or clip_zero else CO.global_norm(grads)
        if norm_after:
            norm = CO.global_norm(grads)
        if order != "no lr":
            optimizer.lr = lr
        optimizer.step(grads)
        return loss, norm
    return train_step


@pytest.mark.parametrize("wrong,case,words", [
    (_train_step(order="clip after"), "clip 0.01", "updating with the unclipped gradients"),
    (_train_step(order="no lr"), "clip 0.01", "not handing the learning rate to the optimiser"),
    (_train_step(order="lr after"), "clip 0.01", "setting the learning rate after"),
    (_train_step(norm_after=True), "clip 0.01", "returning the norm after clipping"),
    (_train_step(clip_zero=True), "clip = 0", "clipping to norm 0 when clip = 0"),
])
def test_train_step_mistakes_get_their_hint(monkeypatch, wrong, case, words):
    monkeypatch.setattr(CT, "train_step", wrong)
    message = _fails("check-train-step")
    assert case in message.split("\n")[1] and words in message, message


# -------------------------------------------------------------------------------- variants


def test_rmsprop_failure_names_case_parameter_and_mistake():
    message = _fails("check-rmsprop", lambda *a, **k: rmsprop_step(*a, **k, eps_inside=True))
    # the first case whose answer moves: eps inside the root matters where v is small
    assert "case '" in message and "after each step']" in message
    assert "eps inside the square root" in message and "expected" in message

    def forgetful(params, grads, state, **kw):
        rmsprop_step(params, grads, {}, **kw)  # a fresh state every call
    message = _fails("check-rmsprop", forgetful)
    assert "case 'plain" in message and "output['W after each step']" in message
    assert "without keeping the running averages in state" in message

    def not_in_place(params, grads, state, **kw):
        copies = {k: p.copy() for k, p in params.items()}
        rmsprop_step(copies, grads, state, **kw)
        params.update(copies)
    assert "params updated in place" in _fails("check-rmsprop", not_in_place)


def test_noam_mistake_gets_its_hint():
    def wrong(steps, d_model, warmup):
        s = np.asarray(steps, dtype=np.float64)
        return d_model ** -0.5 * np.minimum(s ** -0.5, s * warmup ** -0.5)
    assert "warmup ** -0.5 in the warm-up branch" in _fails("check-noam-schedule", wrong)


def test_sampling_mistakes_fail_in_the_case_that_tests_them():
    message = _fails("check-sample-decode", lambda *a: sample_decode(*a, use_temperature=False))
    assert "case 'temperature 1e-6 is greedy decoding (" in message

    def greedy_for_tiny_temperatures(model, src, temperature, rng, max_len):
        if temperature < 1e-3:
            return sample_decode(model, src, temperature, rng, max_len)
        return sample_decode(model, src, temperature, rng, max_len, use_temperature=False)
    message = _fails("check-sample-decode", greedy_for_tiny_temperatures)
    assert "first-token frequencies at temperature 0.7" in message
    message = _fails("check-sample-decode", lambda *a: sample_decode(*a, pad=False))
    assert "is greedy decoding (softmax(logits / 1e-6) puts every draw on the likeliest " \
           "token)': output['row 0: <s>, the tokens, </s>, then <pad>']: 4 of 7 entries " \
           "differ, the first at [3]: expected 0, got 6" in message
    assert "expected:\n    [1 6 2 0 0 0 0]\n  got:\n    [1 6 2 6 6 6 6]" in message, message
    assert "the tokens drawn on after </s>" in message


# -------------------------------------------------------------------------------- the handout


def _strip_hidden(text: str) -> str:
    return re.sub(r"\n[ \t]*### BEGIN HIDDEN TESTS\n.*?### END HIDDEN TESTS[^\n]*", "", text,
                  flags=re.S)


def test_the_handouts_form_of_the_checks_runs_on_the_solutions(tmp_path, monkeypatch, capsys):
    """With the hidden tests stripped (make student), the public cases run; the hidden
    reference of the schedule is replaced by its stored answers."""
    full = F.load_checks()
    F.store_expected(full["check-noam-schedule"](), tmp_path)
    monkeypatch.setattr(F, "DATA_DIR", tmp_path)
    monkeypatch.setattr(F, "REGISTRY", {})
    handout = types.ModuleType("nb10_training")  # the handout keeps the module's name
    exec(compile(_strip_hidden(MODULE.read_text()), "nb10_training.py", "exec"),
         handout.__dict__)
    stripped = F.REGISTRY
    assert set(stripped) == {c for c, k in full.items() if k.notebook == "10_training"}
    assert not stripped["check-noam-schedule"].has_reference()
    assert all(stripped[c].has_reference() for c in stripped if c != "check-noam-schedule")
    for cid in ("check-sgd-step", "check-adam-step", "check-global-norm",
                "check-clip-grad-norm", "check-train-step"):
        check(cid)
    check("check-noam-schedule", noam_lr)
    check("check-rmsprop", rmsprop_step)
    check("check-sample-decode", sample_decode)
    assert capsys.readouterr().out.count(" passed (") == 8
    # the handout's RMSprop still names the mistakes torch can show
    message = _fails("check-rmsprop", lambda p, g, s, **kw: rmsprop_step(p, g, {}, **kw))
    assert "without keeping the running averages in state" in message
