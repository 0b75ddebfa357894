"""Checks of notebook 13_gpt: the shifted loss, the GPT's causal self-attention, block and model.

Expected answers come from PyTorch (functional ops and autograd) and, for whole blocks and
models, from :mod:`transformer_lab.reference.torch_gpt` -- the same model written again in PyTorch;
none of them calls the core.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re

import numpy as np

from transformer_lab.checks._torch_helpers import _np, _t, autograd, torch
from transformer_lab.checks.framework import Case, Check, later_rng
from transformer_lab.checks.nb07_blocks import Residual, _tanh_sublayer
from transformer_lab.checks.nb09_verification import sinusoid_table


def _config(d: dict):
    from transformer_lab.models.gpt import GPTConfig

    return GPTConfig(**{**d, "dtype": np.dtype(d.get("dtype", "float64")).type})


def _random_gpt(rng, make: str, vocab: int, **kw) -> tuple[dict, dict]:
    """The config ``GPTConfig.<make>(vocab, **kw)`` as plain data, and random parameters for it
    (name -> array), off their initial values."""
    from transformer_lab.models.config import config_to_dict
    from transformer_lab.models.gpt import GPT, GPTConfig

    model = GPT(getattr(GPTConfig, make)(vocab, **kw), seed=int(rng.integers(1000)))
    dt = model.config.dtype
    flat = {k: (p + rng.normal(0, 0.2, p.shape)).astype(dt) for k, p in model.params.items()}
    return config_to_dict(model.config), flat


# --------------------------------------------------------------------------------------------
# §2 The next-token loss


class NextTokenLoss(Check, id="check-next-token-loss",
                    functions=("next_token_loss_forward", "next_token_loss_backward")):
    axes = {"dlogits": "btv"}  # axis names, for messages

    def cases(self, rng):
        yield Case("B = 2, T = 5, V = 7", (rng.standard_normal((2, 5, 7)),
                                           rng.integers(0, 7, (2, 5)), 1.0))
        yield Case("float32", (rng.standard_normal((3, 4, 6)).astype(np.float32),
                               rng.integers(0, 6, (3, 4)), 1.0))
        yield Case("one sequence of two tokens", (rng.standard_normal((1, 2, 5)),
                                                  rng.integers(0, 5, (1, 2)), 1.0))
        yield Case("dloss = 0.5", (rng.standard_normal((2, 3, 4)), rng.integers(0, 4, (2, 3)),
                                   0.5))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("a repeated token", (rng.standard_normal((2, 6, 3)) * 4,
                                        np.full((2, 6), 2), 1.0))
        yield Case("large logits, dloss = 3", (rng.standard_normal((1, 5, 9)) * 300,
                                               rng.integers(0, 9, (1, 5)), 3.0))
    ### END HIDDEN TESTS

    def run(self, f, logits, ids, dloss):
        loss, cache = f.next_token_loss_forward(logits, ids)
        return {"loss": np.asarray(loss, dtype=logits.dtype),
                "dlogits": f.next_token_loss_backward(dloss, cache)}

    def expected(self, logits, ids, dloss, scored=slice(None, -1), target=slice(1, None)):
        """The mean cross-entropy of the logits at the positions ``scored`` against the tokens at
        ``target`` (by default the next token: logits[:, :-1] against ids[:, 1:]; other slices
        are mistakes) in the logits' dtype, and its gradient times ``dloss``, by autograd."""
        def loss(x):
            return torch.nn.functional.cross_entropy(x[:, scored].reshape(-1, x.shape[-1]),
                                                     _t(ids[:, target]).reshape(-1))

        value, dlogits = autograd(loss, np.array(dloss, dtype=logits.dtype), logits)
        return {"loss": np.asarray(value, dtype=logits.dtype), "dlogits": dlogits}

    def mistakes(self, logits, ids, dloss):
        every, first, rest = slice(None), slice(None, -1), slice(1, None)
        return {"without the shift (each position scored against its own token)":
                lambda: self.expected(logits, ids, dloss, every, every),
                "shifting the wrong way (logits[:, 1:] against ids[:, :-1])":
                lambda: self.expected(logits, ids, dloss, rest, first),
                "scoring logits[:, :-1] against ids[:, :-1], each position's own token (the "
                "targets are ids[:, 1:])":
                lambda: self.expected(logits, ids, dloss, first, first),
                "ignoring dloss (the gradient of the loss itself, as if dloss were 1)":
                lambda: self.expected(logits, ids, 1.0),
                "with np.roll(ids, -1): the last position scored against the first token (it "
                "has no next token: drop it)":
                lambda: self.expected(logits, np.roll(ids, -1, axis=1), dloss, every, every),
                "dividing by B * T instead of the B * (T - 1) positions scored":
                lambda: _scaled(self.expected(logits, ids, dloss), 1 - 1 / ids.shape[1]),
                "with the gradient put at positions 1 .. T - 1 (the logits scored are "
                "0 .. T - 2: dlogits[:, :-1])": lambda: _moved(self.expected(logits, ids, dloss))}


def _scaled(answer: dict, factor: float) -> dict:
    return {k: (a * factor).astype(a.dtype) for k, a in answer.items()}


def _moved(answer: dict) -> dict:
    """The gradient of the positions 0 .. T - 2 written at 1 .. T - 1."""
    d = np.zeros_like(answer["dlogits"])
    d[:, 1:] = answer["dlogits"][:, :-1]
    return {**answer, "dlogits": d}


# --------------------------------------------------------------------------------------------
# §3 The GPT's attention, block and model


def _attention_params(rng, E, H, Hkv, bias, dtype=np.float64):
    width = E + 2 * Hkv * (E // H)
    p = {"W_qkv": rng.standard_normal((E, width)) / math.sqrt(E),
         "W_o": rng.standard_normal((E, E)) / math.sqrt(E)}
    if bias:
        p.update(b_qkv=rng.standard_normal(width) * 0.1, b_o=rng.standard_normal(E) * 0.1)
    return {k: v.astype(dtype) for k, v in p.items()}


def _attention_case(rng, B, T, E, H, Hkv, bias, dt=np.float64) -> tuple:
    """x (B, T, E), the attention's parameters (:func:`_attention_params`) and dout."""
    return (rng.standard_normal((B, T, E)).astype(dt), _attention_params(rng, E, H, Hkv, bias, dt),
            rng.standard_normal((B, T, E)).astype(dt))


def _attention_expected(x, params, dout, H, Hkv, angles=None, causal=True):
    """The attention of reference.torch_gpt (the model's twin), forward and backward."""
    from transformer_lab.reference.torch_gpt import attention  # here: it imports torch

    out, dx, grads = autograd(lambda tx, tp: attention(tx, tp, H, Hkv, _t(angles), causal),
                              dout, x, params)
    return {"out": out, "dx": dx, **{f"d{k}": g for k, g in grads.items()}}


class CausalSelfAttention(Check, id="check-causal-self-attention",
                          functions=("self_attention_forward", "self_attention_backward",
                                     "causal_self_attention_forward",
                                     "causal_self_attention_backward")):
    axes = {"out": "bte", "dx": "bte"}  # axis names, for messages

    def cases(self, rng):
        for name, (B, T, E, H, bias, dt) in {
                "B = 2, T = 5, E = 8, two heads, biases": (2, 5, 8, 2, True, np.float64),
                "one head, no biases": (1, 4, 6, 1, False, np.float64),
                "float32": (2, 6, 8, 4, True, np.float32)}.items():
            yield Case(name, (*_attention_case(rng, B, T, E, H, H, bias, dt), H))
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        for name, dropped in (("b_qkv only (no b_o)", "b_o"), ("b_o only (no b_qkv)", "b_qkv")):
            params = _attention_params(later, 6, 2, 2, True, np.float64)
            del params[dropped]
            yield Case(name, (later.standard_normal((2, 4, 6)), params,
                              later.standard_normal((2, 4, 6)), 2))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("one position", (*_attention_case(rng, 3, 1, 4, 2, 2, True), 2))
        yield Case("as many heads as features", (*_attention_case(rng, 1, 3, 4, 4, 4, True), 4))
    ### END HIDDEN TESTS

    def run(self, f, x, params, dout, H):
        out, cache = f.causal_self_attention_forward(x, params, H)
        dx, grads = f.causal_self_attention_backward(dout, cache)
        return {"out": out, "dx": dx, **{f"d{k}": g for k, g in grads.items()}}

    def expected(self, x, params, dout, H):
        return _attention_expected(x, params, dout, H, H)

    def mistakes(self, x, params, dout, H):
        return {"without the causal mask (every position sees the future): is the mask passed to "
                "attention_forward in your kernel -- and does your self_attention_forward call the "
                "kernel it is given (attend), rather than its own attention?":
                lambda: _attention_expected(x, params, dout, H, H, causal=False),
                "with the mask the wrong way round, blocking the past: the causal mask blocks "
                "key j > query i, np.triu(..., k=1), the future": lambda: _attention_expected(
                    x, params, dout, H, H, causal=torch.as_tensor(
                        np.triu(np.ones((x.shape[1],) * 2, dtype=bool))))}


@dataclasses.dataclass
class StandInNormCache:
    """The cache of the check's stand-in norm: a backward that hands it to another norm's
    backward (unpacks or indexes it) fails saying whose cache it is."""

    h: np.ndarray
    gamma: np.ndarray
    eps: float

    def __iter__(self):
        raise TypeError("this is the cache of the norm given as normalize: hand it to "
                        "normalize_backward, not to the layer norm's backward")

    def __getitem__(self, key):
        self.__iter__()


def _stand_in_norm(h, norm, eps):
    """The check's stand-in norm ``h gamma / (1 + eps) + beta``: a norm of its own, so that
    check-residual-normalize tests how the residual passes its norm on, not a norm."""
    return h * norm["gamma"] / (1 + eps) + norm["beta"], StandInNormCache(h, norm["gamma"], eps)


def _stand_in_norm_backward(dout, cache):
    if not isinstance(cache, StandInNormCache):
        raise TypeError("normalize_backward was given a cache that normalize did not make: does "
                        "your residual_forward call normalize(h, norm, eps) when it is given?")
    rows = dout.reshape(-1, dout.shape[-1])
    scale = 1 + cache.eps
    return (dout * cache.gamma / scale,
            {"gamma": (rows * cache.h.reshape(rows.shape)).sum(0) / scale, "beta": rows.sum(0)})


class ResidualNormalize(Residual, id="check-residual-normalize"):
    """Notebook 07's residual sublayer with the norm it is given: ``normalize(h, norm, eps)``
    in the forward, ``normalize_backward(dh, cache)`` in the backward."""

    def cases(self, rng):
        for norm_first, name in ((True, "pre-norm"), (False, "post-norm")):
            yield self._case(rng, f"{name}, the stand-in norm h gamma / (1 + eps) + beta, "
                                  "eps = 0.5", (2, 3, 4), norm_first, eps=0.5)

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield self._case(rng, "pre-norm, float32, eps = 2", (2, 2, 3), True, dtype=np.float32,
                         eps=2.0)
    ### END HIDDEN TESTS

    @staticmethod
    def norm(u, g, eps):  # the stand-in norm, in PyTorch for the expected answer
        return _stand_in_norm(u, g, eps)[0]

    def run(self, f, x, W, norm, dout, norm_first, eps=1e-5):
        forward, backward = _tanh_sublayer(W)
        out, cache = f.residual_forward(x, forward, norm, norm_first, eps, _stand_in_norm)
        dx, g_norm, *rest = f.residual_backward(dout, cache, backward, _stand_in_norm_backward)
        return {"out": out, "dx": dx, "norm grads": g_norm, "sublayer grads": list(rest)}

    def mistakes(self, x, W, norm, dout, norm_first, eps=1e-5):
        return {**super().mistakes(x, W, norm, dout, norm_first, eps),
                "with the layer norm where a norm is given: call normalize(h, norm, eps) when "
                "it is not None, and normalize_backward in the backward pass":
                lambda: Residual().expected(x, W, norm, dout, norm_first, eps)}


def _first_block(flat: dict) -> dict:
    """The parameters of a GPT's first block (name -> array), named within the block."""
    return {k[len("layers.0."):]: v for k, v in flat.items() if k.startswith("layers.0.")}


def _block_case(rng, kind, dt=np.float64, T=5, B=2, **change):
    config, flat = _random_gpt(rng, kind, 11, d_model=8, num_heads=2 if kind == "classic" else 4,
                               num_layers=1, d_ff=12, max_len=T, dtype=dt, **change)
    block = _first_block(flat)
    return (rng.standard_normal((B, T, 8)).astype(dt), block,
            rng.standard_normal((B, T, 8)).astype(dt), config)


def _rope_angles(T, Dh, base=10000.0):
    """RoPE's angles p omega_i of positions 0 .. T - 1 (T, Dh / 2), omega_i = base^(-2i/Dh)."""
    omega = base ** (-np.arange(0, Dh, 2) / Dh)
    return np.arange(T)[:, None] * omega


def _head_rope(x, H, rope):
    """For x (B, T, E) split into H heads, with RoPE when ``rope``: the angles (T, Dh / 2) and
    their (cos, sin) tables, in x's dtype; (None, None) without RoPE."""
    if not rope:
        return None, None
    a = _rope_angles(x.shape[1], x.shape[-1] // H)
    return a.astype(x.dtype), (np.cos(a).astype(x.dtype), np.sin(a).astype(x.dtype))


def _rope(c, T):
    """RoPE's (cos, sin) tables (T, Dh / 2) in config ``c``'s dtype; None without RoPE."""
    if c.positional != "rope":
        return None
    angles = _rope_angles(T, c.head_dim, c.rope_base)
    return np.cos(angles).astype(c.dtype), np.sin(angles).astype(c.dtype)


class _BlockCheck(Check):
    """A block of a given kind, forward and backward, against reference.torch_gpt's TorchBlock."""

    functions = ("norm_forward", "norm_backward", "mlp_forward", "mlp_backward",
                 "gpt_block_forward", "gpt_block_backward")
    axes = {"out": "bte", "dx": "bte"}  # axis names, for messages

    def run(self, f, x, block, dout, config):
        from transformer_lab.models.shell import flatten, nest

        c = _config(config)
        out, cache = f.gpt_block_forward(x, nest(block), c, _rope(c, x.shape[1]))
        dx, grads = f.gpt_block_backward(dout, cache)
        return {"out": out, "dx": dx, **{f"d.{k}": g for k, g in flatten(grads).items()}}

    @staticmethod
    def _torch_block(x, block, config):
        """reference.torch_gpt's block of ``config`` holding the parameters ``block``, and its
        RoPE angles for x's length (None without RoPE)."""
        from transformer_lab.models.config import parameter_shapes
        from transformer_lab.reference.torch_gpt import TorchBlock, _sub, torch_dtype

        c = _config(config)
        torch_block = TorchBlock(c, _sub(parameter_shapes(c), "layers.0"), torch_dtype(c))
        with torch.no_grad():
            for name, p in torch_block.named_parameters():
                p.copy_(_t(block[name]))
        angles = _t(_rope_angles(x.shape[1], c.head_dim, c.rope_base).astype(c.dtype)) \
            if c.positional == "rope" else None
        return torch_block, angles

    def expected(self, x, block, dout, config):
        torch_block, angles = self._torch_block(x, block, config)
        out, dx = autograd(lambda tx: torch_block(tx, angles), dout, x)
        return {"out": out, "dx": dx,
                **{f"d.{n}": _np(p.grad) for n, p in torch_block.named_parameters()}}

    def _wrong_out(self, x, block, config, order):
        """The output of a block wired as ``order`` says: "post-norm", "one norm" (norm1 before
        both sublayers) or "MLP first" (each sublayer with its own norm)."""
        from transformer_lab.reference.torch_gpt import _norm

        b, angles = self._torch_block(x, block, config)
        c = b.c
        attend, mlp = (lambda h: b.attention(h, angles)), b.feed_forward
        first, second = (mlp, attend) if order == "MLP first" else (attend, mlp)
        norms = {"MLP first": (b.norm2, b.norm1), "one norm": (b.norm1, b.norm1)}.get(
            order, (b.norm1, b.norm2))
        with torch.no_grad():
            h = _t(x)
            for sublayer, norm in zip((first, second), norms, strict=True):
                h = (_norm(h + sublayer(h), norm, c) if order == "post-norm"
                     else h + sublayer(_norm(h, norm, c)))
        return _np(h)

    def mistakes(self, x, block, dout, config):
        wiring = {"post-norm": "as post-norm, norm(x + sublayer(x)): the GPT's blocks are "
                               "pre-norm, x + sublayer(norm(x))",
                  "one norm": "with norm1 before both sublayers (the MLP's is norm2)",
                  "MLP first": "with the MLP before the attention (attention comes first)"}
        found = {text: (lambda order=order: {"out": self._wrong_out(x, block, config, order)})
                 for order, text in wiring.items()}
        if config["mlp"] == "gelu_tanh":
            found["with the exact GELU where config.mlp asks for its tanh approximation (does "
                  "your block pass config.mlp on to mlp_forward)"] = lambda: self.expected(
                      x, block, dout, {**config, "mlp": "gelu"})
        return found


class GPTBlock(_BlockCheck, id="check-gpt-block"):
    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("one position, one sequence", _block_case(rng, "classic", T=1, B=1))
    ### END HIDDEN TESTS

    def cases(self, rng):
        yield Case("the 2017 / GPT-2 block, float64", _block_case(rng, "classic"))
        yield Case("float32", _block_case(rng, "classic", np.float32))
        yield Case("eps = 0.1 in both norms (config.eps)",
                   _block_case(later_rng(rng), "classic", eps=0.1))
        yield Case("the exact GELU in the MLP (config.mlp = 'gelu')",
                   _block_case(later_rng(rng), "classic", mlp="gelu"))
        yield Case("config.dropout = 0.1 and no rng: evaluation, no dropout",
                   _block_case(later_rng(rng), "classic", dropout=0.1))


def _model_case(rng, dt=np.float64, make="classic", **kw):
    config, flat = _random_gpt(rng, make, 9, d_model=8, num_heads=2, num_layers=2, d_ff=12,
                               max_len=6, dtype=dt, **kw)
    return flat, rng.integers(0, 9, (2, 6)), config


def _pe(c):
    """The sinusoidal table (max_len, E) in config ``c``'s dtype; None without it."""
    if c.positional != "sinusoidal":
        return None
    return sinusoid_table(c.max_len, c.d_model).astype(c.dtype)


class GPTModel(Check, id="check-gpt-model", functions=("gpt_forward", "gpt_backward", "gpt_loss")):
    axes = {"logits": "btv"}  # axis names, for messages

    def cases(self, rng):
        yield Case("two layers, learned positions, float64", _model_case(rng))
        yield Case("configured with dropout 0.1 but evaluated (no rng): no dropout",
                   _model_case(rng, dropout=0.1))
        yield Case("float32", _model_case(rng, np.float32))
        yield Case("an output table of its own (untied: params['lm_head']['W'])",
                   _model_case(later_rng(rng), tie_embeddings=False))
        yield Case("a fixed sinusoidal table (pe) instead of learned positions",
                   _model_case(later_rng(rng), positional="sinusoidal"))
        yield Case("eps = 0.1 in every norm (config.eps)", _model_case(later_rng(rng), eps=0.1))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("sinusoidal positions, no biases", _model_case(rng, positional="sinusoidal",
                                                                  bias=False))
    ### END HIDDEN TESTS

    def run(self, f, flat, ids, config, seed=None):
        from transformer_lab.models.shell import flatten, nest

        c, params = _config(config), nest(flat)

        def train():  # with dropout: each call draws the same masks from a fresh generator
            return () if seed is None else (np.random.default_rng(seed),)

        rope = _rope(c, ids.shape[1])
        logits, _ = f.gpt_forward(params, ids, c, _pe(c), rope, *train())
        loss, grads = f.gpt_loss(params, ids, c, _pe(c), rope, *train())
        return {"logits": logits, "loss": np.asarray(loss, dtype=c.dtype),
                **{f"d.{k}": g for k, g in flatten(grads).items()}}

    def expected(self, flat, ids, config, seed=None):
        from transformer_lab.reference.torch_gpt import TorchGPT

        c = _config(config)
        twin = TorchGPT(c)
        twin.load_numpy_params(flat)
        drop = None
        if seed is not None:  # the masks the core draws: per block, the attention's, the MLP's
            r, shape = np.random.default_rng(seed), (*ids.shape, c.d_model)
            drop = [[_t(((r.random(shape) >= c.dropout) / (1 - c.dropout)).astype(c.dtype))
                     for _ in range(2)] for _ in range(c.num_layers)]
        logits = twin(ids, drop)
        loss = twin.loss(ids, drop)
        loss.backward()
        return {"logits": _np(logits), "loss": np.asarray(loss.item(), dtype=c.dtype),
                **{f"d.{k}": g for k, g in twin.numpy_grads().items()}}

    @staticmethod
    def _wrong_logits(flat, ids, config, delta):
        """The twin's logits with ``delta`` (B, T, E) added to what enters the first block."""
        from transformer_lab.reference.torch_gpt import TorchGPT

        twin = TorchGPT(_config(config))
        twin.load_numpy_params(flat)
        twin.layers[0].register_forward_pre_hook(lambda _, args: (args[0] + _t(delta), *args[1:]))
        with torch.no_grad():
            return _np(twin(ids))

    def mistakes(self, flat, ids, config, seed=None):
        if seed is not None:
            return {"without dropout while training (the generator not used, or not passed on "
                    "to the blocks)": lambda: self.expected(flat, ids, config)}
        c, table = _config(config), flat["embed.W"]
        right = functools.cache(lambda: self.expected(flat, ids, config))  # two hints' base
        found = {"with the embeddings scaled by sqrt(E), as the 2017 Transformer does (notebook "
                 "08): a GPT adds them to the positions unscaled": lambda: {
                     "logits": self._wrong_logits(flat, ids, config,
                                                  (math.sqrt(c.d_model) - 1) * table[ids])}}
        positions = flat["pos.W"] if "pos.W" in flat else _pe(c)
        if positions is not None:
            found["without the positions (params['pos'], or the table pe when the model has no "
                  "'pos')"] = lambda: {"logits": self._wrong_logits(
                      flat, ids, config, -positions[:ids.shape[1]])}
        if c.num_layers > 1:
            def reversed_layers():  # layer i's gradients under layer L - 1 - i's names
                last = c.num_layers - 1
                return {k: right()[re.sub(r"^d\.layers\.(\d+)\.",
                                          lambda m: f"d.layers.{last - int(m[1])}.", k)]
                        for k in right()}

            found["with the layers' gradients in reverse order (the backward pass meets the "
                  "last layer first: put its gradients at the front, insert(0, g))"] = \
                reversed_layers
        if "lm_head.W" in flat:
            def tied():  # the embedding table as the output projection
                return self.expected({k: p for k, p in flat.items() if k != "lm_head.W"}, ids,
                                     {**config, "tie_embeddings": True})

            found["with the embedding table as the output projection: this model has one of "
                  "its own, params['lm_head']['W'] (untied)"] = tied
            return found

        @functools.cache
        def apart():  # the right answer, and the table's two uses apart: an untied copy's
            return right(), self.expected({**flat, "lm_head.W": flat["embed.W"]}, ids,
                                          {**config, "tie_embeddings": False})

        def one_use(key):  # the table's gradient from one of its uses only
            return lambda: {**apart()[0], "d.embed.W": apart()[1][key]}

        found["with the table's gradient from the output projection only (a tied table gets "
              "the sum of both uses)"] = one_use("d.lm_head.W")
        found["with the table's gradient from the lookup only: the output projection's share "
              "is forgotten (a tied table gets the sum of both uses: add it, +=)"] = \
            one_use("d.embed.W")
        return found


class GPTDropout(GPTModel, id="check-gpt-dropout",
                 functions=("gpt_block_forward", "gpt_block_backward", "gpt_forward",
                            "gpt_backward", "gpt_loss")):
    """The model trained with dropout: the masks the core draws from the generator (per block,
    the attention's, then the MLP's, each ``rng.random((B, T, E)) >= p``) replayed in
    PyTorch."""

    def cases(self, rng):
        yield Case("training with dropout 0.3 (rng given: layer 0's masks, attention then MLP, "
                   "then layer 1's)", (*_model_case(rng, dropout=0.3), 5))
        yield Case("dropout 0.5, float32", (*_model_case(rng, np.float32, dropout=0.5), 8))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("dropout 0.1, sinusoidal positions, no biases",
                   (*_model_case(rng, dropout=0.1, positional="sinusoidal", bias=False), 13))
    ### END HIDDEN TESTS
