"""Checks of notebook 08_transformer: positions and embeddings, the encoder and decoder stacks,
the model's forward pass and the tied output projection.

Every reference is PyTorch: tensor operations and autograd, ``nn.TransformerEncoder`` and
``nn.TransformerDecoder`` loaded with the case's parameters (notebook 07's
:class:`~transformer_lab.checks.nb07_blocks._TwinCheck`). The helpers that build the model are
shared with notebook 09's checks.
"""

from __future__ import annotations

import math
from functools import partial
from types import SimpleNamespace

import numpy as np

from transformer_lab.checks._torch_helpers import _np, _t, autograd, torch
from transformer_lab.checks.framework import Case, Check, later_rng, normals
from transformer_lab.checks.nb07_blocks import (
    _decoder_masks,
    _named_grads,
    _randn,
    _twin_case,
    _TwinCheck,
    quiet_key_bias,
    stack_params,
    torch_stack,
    tree_map,
)
from transformer_lab.reference.interop import layout

# --------------------------------------------------------------------------------------------
# Positions and embeddings (§1)


class PositionalEncoding(Check, id="check-positional-encoding", functions=("positional_encoding",)):
    axes = {"output": "te"}  # axis names, for messages

    def cases(self, rng):
        yield Case("10 positions, d_model 8", (10, 8))
        yield Case("odd d_model 7 (one more sine than cosine column)", (6, 7))
        yield Case("base 100", (5, 4), {"base": 100.0})

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("one position, d_model 1", (1, 1))
        yield Case("64 positions, d_model 32", (64, 32))
    ### END HIDDEN TESTS

    def run(self, f, max_len, d_model, base=10000.0):
        return f.positional_encoding(max_len, d_model, base)

    def expected(self, max_len, d_model, base=10000.0, how="right"):
        pos = torch.arange(max_len, dtype=torch.float64)[:, None]
        i = torch.arange(0, d_model, 2, dtype=torch.float64) / (2 if how == "i/d" else 1)
        angles = pos * base ** (-i / d_model)
        pe = torch.zeros(max_len, d_model, dtype=torch.float64)
        first, second = (torch.cos, torch.sin) if how == "swapped" else (torch.sin, torch.cos)
        pe[:, 0::2] = first(angles)
        pe[:, 1::2] = second(angles[:, : d_model // 2])
        return pe.numpy()

    def mistakes(self, max_len, d_model, base=10000.0):
        right = self.expected(max_len, d_model, base)
        return {"with the frequencies base^(-i/d) instead of base^(-2i/d) (the exponent of "
                "column pair i is 2i/d)": lambda: self.expected(max_len, d_model, base, "i/d"),
                "with the sines in the first half and the cosines in the second instead of "
                "interleaved (sines in the even columns)":
                lambda: np.concatenate([right[:, 0::2], right[:, 1::2]], axis=1),
                "with cosines in the even columns and sines in the odd ones":
                lambda: self.expected(max_len, d_model, base, "swapped"),
                "with the base 10000 written in (use the base argument)":
                lambda: self.expected(max_len, d_model)}


class Embed(Check, id="check-embed", functions=("embed_forward", "embed_backward")):
    axes = {"x": "bte"}  # axis names, for messages

    @staticmethod
    def _case(rng, name, ids, vocab, max_len, e, scale, dtype=np.float64):
        """ids, a table (vocab, e), positions (max_len, e) or None, the scale, dx (B, T, e)."""
        ids, table = np.array(ids), _randn(rng, (vocab, e), dtype)
        positions = None if max_len is None else _randn(rng, (max_len, e), dtype)
        return Case(name, (ids, table, positions, scale, _randn(rng, (*ids.shape, e), dtype)))

    def cases(self, rng):
        yield self._case(rng, "scale sqrt(E), sinusoid-like table, repeated ids",  # within rows
                         [[3, 1, 3, 0], [2, 3, 3, 4]], 5, 7, 6, math.sqrt(6))  # and across
        yield self._case(rng, "learned positions L > T, scale 1", [[1, 1, 2]], 3, 5, 4, 1.0)
        yield self._case(rng, "no positions", [[0, 2], [2, 2], [1, 0]], 3, None, 5, 2.0)
        yield self._case(rng, "float32", [[4, 0, 4]], 6, 3, 4, 2.0, np.float32)

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield self._case(rng, "every id the same", np.full((3, 2), 1), 2, 4, 3, math.sqrt(3))
        yield self._case(rng, "T = L = 1", [[2], [0]], 3, 1, 2, 1.5)
    ### END HIDDEN TESTS

    def run(self, f, ids, table, positions, scale, dx):
        x, cache = f.embed_forward(ids, table, positions, scale)
        dtable, dpositions = f.embed_backward(dx, cache)
        return {"x": x, "dtable": dtable, "dpositions": dpositions}

    def expected(self, ids, table, positions, scale, dx, how="right"):
        def embed(W, P):
            pos = 0 if P is None else P[: ids.shape[1]]
            if how == "scale positions too":
                return (W[_t(ids)] + pos) * scale
            return W[_t(ids)] * (1.0 if how == "no scale" else scale) + pos

        x, dtable, dpositions = autograd(embed, dx, table, positions)
        return {"x": x, "dtable": dtable, "dpositions": dpositions}

    def mistakes(self, ids, table, positions, scale, dx):
        right = self.expected(ids, table, positions, scale, dx)

        def overwriting():
            dtable = np.zeros_like(table)
            dtable[ids] += dx * scale  # buffered: a repeated id keeps one occurrence
            return dict(right, dtable=dtable)

        found = {"with dtable[ids] += dx: for a repeated id NumPy keeps one of the additions; "
                 "np.add.at adds them all": overwriting,
                 "without the scale in the table's gradient (the forward multiplies the "
                 "looked-up rows by scale, so their gradient is scaled too)":
                 lambda: dict(right, dtable=right["dtable"] / scale),
                 "with the positions scaled too: scale multiplies the token embeddings only":
                 lambda: self.expected(ids, table, positions, scale, dx, "scale positions too"),
                 "without the scale in the forward pass": lambda: self.expected(
                     ids, table, positions, scale, dx, "no scale")}
        if positions is not None and ids.shape[0] > 1:
            first = np.zeros_like(positions)
            first[: ids.shape[1]] = dx[0]
            found["with the positions' gradient of the first sequence only: every sequence "
                  "adds its own (sum over the batch)"] = lambda: dict(right, dpositions=first)
            found["with the positions' gradient averaged over the batch (sum it: every "
                  "sequence adds its own)"] = lambda: dict(
                      right, dpositions=right["dpositions"] / ids.shape[0])
        if positions is not None:
            found["without the positions (x = scale * W[ids] + P[:T])"] = lambda: {
                "x": self.expected(ids, table, None, scale, dx)["x"]}
        return found


# --------------------------------------------------------------------------------------------
# Stacks (§2): compared with their torch twins as notebook 07's layers are


#: the mistake of a stack without its final norm (in the forward pass, or in the backward alone:
#: the gradients are then those of a stack without it)
FINAL_NORM = ("without the final layer norm (params['norm'], after the last layer), in the "
              "forward pass or in the backward")


class EncoderStack(_TwinCheck, id="check-encoder-stack",
                   functions=("encoder_forward", "encoder_backward")):
    axes = {"out": "bse", "dx": "bse"}  # axis names, for messages
    stack = True

    def cases(self, rng):
        pad = (np.arange(4)[None, :] >= np.array([4, 2])[:, None])[:, None, None, :]
        yield _twin_case(rng, "2 layers, pre-norm, final norm, padding mask", (2, 4, 6), 8, 2,
                         pad, layers=2, norm_first=True)
        yield _twin_case(rng, "3 layers, post-norm, no final norm", (2, 3, 4), 6, 2, None,
                         layers=3, final_norm=False, activation="gelu")
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        yield _twin_case(later, "2 layers, post-norm, final norm, eps = 0.1", (2, 3, 4), 6, 2,
                         None, layers=2, eps=0.1)
        yield _twin_case(later, "2 layers, pre-norm, no biases: norms without beta, the "
                         "final one too", (2, 3, 4), 6, 2, None, layers=2, norm_first=True,
                         bias=False)

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield _twin_case(rng, "1 layer, float32", (1, 3, 8), 8, 4, None, layers=1,
                         dtype=np.float32, norm_first=True)
    ### END HIDDEN TESTS

    def mistakes(self, x, params, *case, **keywords):
        right = self.expected(x, params, *case, **keywords)
        found = {"with the layers' gradients in reverse order (the backward pass meets the last "
                 "layer first: put its gradients at the end of the list)": _reversed(right)}
        if params["norm"] is not None:
            found[FINAL_NORM] = lambda: self.expected(
                x, dict(params, norm=None), *case, **keywords)
        heads, mask, dout = case
        if mask is not None:
            found["with the mask not passed to the layers"] = lambda: self.expected(
                x, params, heads, None, dout, **keywords)
        return found


class DecoderStack(_TwinCheck, id="check-decoder-stack",
                   functions=("decoder_forward", "decoder_backward")):
    axes = {"out": "bte", "dx": "bte", "dmemory": "bse"}  # axis names, for messages
    decoder = stack = True

    def cases(self, rng):
        yield _twin_case(rng, "2 layers, pre-norm, final norm, causal + padding masks",
                         (2, 3, 6), 8, 2, *_decoder_masks([3, 2], [4, 2], 3, 4), s=4, layers=2,
                         norm_first=True)
        yield _twin_case(rng, "3 layers, post-norm, no final norm, causal mask", (1, 4, 4), 6, 2,
                         np.triu(np.ones((4, 4), dtype=bool), 1), None, s=2, layers=3,
                         final_norm=False, activation="gelu")
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        yield _twin_case(later, "2 layers, post-norm, final norm, causal mask, eps = 0.1",
                         (2, 3, 4), 6, 2, np.triu(np.ones((3, 3), dtype=bool), 1), None, s=2,
                         layers=2, eps=0.1)
        yield _twin_case(later, "2 layers, pre-norm, no biases: norms without beta, the final "
                         "one too", (2, 3, 4), 6, 2, np.triu(np.ones((3, 3), dtype=bool), 1),
                         None, s=2, layers=2, norm_first=True, bias=False)

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield _twin_case(rng, "1 layer, float32", (2, 2, 8), 8, 4, None, None, s=3, layers=1,
                         dtype=np.float32, norm_first=True)
    ### END HIDDEN TESTS

    def mistakes(self, x, memory, params, *case, **keywords):
        right, per_layer = self._twin(x, memory, params, *case, **keywords)
        found = {"with the memory's gradient of one layer only: every decoder layer reads the "
                 "memory, so dmemory is the sum over the layers":
                 lambda: dict(right, dmemory=per_layer[0]),
                 "with the memory's gradient of the last layer only (the sum over the layers "
                 "is wanted)": lambda: dict(right, dmemory=per_layer[-1]),
                 "with the layers' gradients in reverse order": _reversed(right)}
        if params["norm"] is not None:
            found[FINAL_NORM] = lambda: self.expected(
                x, memory, dict(params, norm=None), *case, **keywords)
        heads, tgt_mask, memory_mask, dout = case
        for which, given, masks in (("target mask", tgt_mask, (None, memory_mask)),
                                    ("memory mask", memory_mask, (tgt_mask, None))):
            if given is not None:
                found[f"with the {which} not passed to the layers"] = partial(
                    self.expected, x, memory, params, heads, *masks, dout, **keywords)
        return found


def _reversed(right):
    """A stack's answer with the layers' gradients in reverse order (a mistake)."""
    return lambda: dict(right, grads=dict(right["grads"], layers=right["grads"]["layers"][::-1]))


# --------------------------------------------------------------------------------------------
# The model (§3), shared with notebook 09's checks


def model_case(rng, *, e=8, heads=2, f=12, n_enc=2, n_dec=1, vocab=(7, 6), b=2, s=5, t=4,
               norm_first=True, activation="relu", scale_embeddings=True, learned=False,
               pad=True, bias=True, dtype=np.float64, eps=1e-5):
    """Plain data for a model case: (params, src, tgt_in, config, pe, src_pad, tgt_pad)."""
    v_src, v_tgt = vocab
    params = {"src_embed": {"W": _randn(rng, (v_src, e), dtype, 1 / math.sqrt(e))},
              "tgt_embed": {"W": _randn(rng, (v_tgt, e), dtype, 1 / math.sqrt(e))},
              "encoder": stack_params(rng, n_enc, e, f, False, True, bias, dtype),
              "decoder": stack_params(rng, n_dec, e, f, True, True, bias, dtype),
              "out_proj": {"W": _randn(rng, (e, v_tgt), dtype, 1 / math.sqrt(e))}}
    if bias:
        params["out_proj"]["b"] = _randn(rng, (v_tgt,), dtype, 0.3)
    max_len = max(s, t) + 2
    if learned:
        params.update({f"{side}_pos": {"W": _randn(rng, (max_len, e), dtype, 0.7)}
                       for side in ("src", "tgt")})
    pe = None if learned else _randn(rng, (max_len, e), dtype, 0.7)  # any table: its rows added
    src = rng.integers(0, v_src, (b, s))
    tgt_in = rng.integers(0, v_tgt, (b, t))
    src_pad = tgt_pad = None
    if pad:
        src_pad = np.arange(s)[None, :] >= rng.integers(1, s + 1, b)[:, None]
        src_pad[0] = False  # one sequence unpadded
        tgt_pad = np.arange(t)[None, :] >= rng.integers(1, t + 1, b)[:, None]
    config = {"num_heads": heads, "norm_first": norm_first, "activation": activation,
              "eps": eps, "d_model": e, "scale_embeddings": scale_embeddings}
    return params, src, tgt_in, config, pe, src_pad, tgt_pad


def torch_logits(params, src, tgt_in, config, pe, src_pad, tgt_pad, how="right"):
    """(memory, logits, stacks, outer tensors) of the course model, in PyTorch: the stacks are
    :func:`torch_stack`'s (a ``ModuleDict``: ``encoder``, ``decoder``), the other parameters
    tensors that record their gradients. ``how`` names a mistake to reproduce ("no scale",
    "always scaled", "no positions", "no causal mask", "no memory padding mask", "no target
    padding mask", "no encoder padding mask")."""
    layer = (config["num_heads"], config["norm_first"], config["activation"], config["eps"])
    core = torch.nn.ModuleDict({side: torch_stack(params[side], *layer, side == "decoder")
                                for side in ("encoder", "decoder")})
    outer = {f"{k}.{n}": _t(v, grad=True)
             for k in ("src_embed", "tgt_embed", "src_pos", "tgt_pos", "out_proj") if k in params
             for n, v in params[k].items()}
    scaled = config["scale_embeddings"] and how != "no scale" or how == "always scaled"
    scale = math.sqrt(config["d_model"]) if scaled else 1.0

    def embed(ids, side):
        x = outer[f"{side}_embed.W"][_t(ids)] * scale
        table = outer.get(f"{side}_pos.W", _t(pe))
        if table is not None and how != "no positions":
            x = x + table[: ids.shape[1]]
        return x

    kpm_src = _t(src_pad)
    memory = core.encoder(embed(src, "src"), src_key_padding_mask=None
                          if how == "no encoder padding mask" else kpm_src)
    t = tgt_in.shape[1]
    causal = None if how == "no causal mask" else torch.ones(t, t, dtype=torch.bool).triu(1)
    y = core.decoder(embed(tgt_in, "tgt"), memory, tgt_mask=causal,
                     tgt_key_padding_mask=None if how == "no target padding mask"
                     else _t(tgt_pad),
                     memory_key_padding_mask=None if how == "no memory padding mask"
                     else kpm_src)
    logits = y @ outer["out_proj.W"] + outer.get("out_proj.b", 0)
    return memory, logits, core, outer


def torch_model_grads(params, core, outer):
    """The gradients of a :func:`torch_logits` run, nested like ``params``."""
    named = _named_grads([*core.named_parameters(), *outer.items()])
    e = params["out_proj"]["W"].shape[0]
    grads = {side: layout.stack_from_torch(named, f"{side}.", len(params[side]["layers"]), e,
                                           side == "decoder", split_cross=True)
             for side in ("encoder", "decoder")}
    for name in outer:  # "src_embed.W" -> grads["src_embed"]["W"]
        key, sub = name.split(".")
        grads.setdefault(key, {})[sub] = named[name]
    return quiet_key_bias(tree_map(np.array, grads), params["out_proj"]["W"].dtype)


class TransformerForward(Check, id="check-transformer-forward",
                         functions=("transformer_encode", "transformer_decode",
                                    "transformer_forward")):
    axes = {"memory (transformer_encode)": "bse", "logits (transformer_decode)": "btv",
            "logits (transformer_forward)": "btv"}  # axis names, for messages

    def cases(self, rng):
        yield Case("pre-norm, sinusoid-like table, padding", model_case(rng))
        yield Case("post-norm, GELU, learned positions",
                   model_case(rng, norm_first=False, activation="gelu", learned=True))
        yield Case("no embedding scale, no padding, S != T", model_case(
            rng, scale_embeddings=False, pad=False, s=3, t=6, n_enc=1, n_dec=2))
        yield Case("float32", model_case(rng, dtype=np.float32, e=8, heads=4))
        later = later_rng(rng)  # the cases below were added later: the ones above stay as drawn
        yield Case("post-norm, eps = 0.1", model_case(later, norm_first=False, eps=0.1))
        yield Case("pre-norm, eps = 0.1", model_case(later, eps=0.1))
        yield Case("no biases (params without 'b')", model_case(later, bias=False))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("one head, no biases, B = 1", model_case(rng, heads=1, bias=False, b=1))
        yield Case("T = 1 (the first decoding step)", model_case(rng, t=1, norm_first=False))
    ### END HIDDEN TESTS

    def run(self, f, params, src, tgt_in, config, pe, src_pad, tgt_pad):
        c = SimpleNamespace(**config)  # the core reads attributes; a case holds plain data
        memory, _ = f.transformer_encode(params, src, c, pe, src_pad)
        decoded, _ = f.transformer_decode(params, tgt_in, memory, c, pe, src_pad, tgt_pad)
        logits, _ = f.transformer_forward(params, src, tgt_in, c, pe, src_pad, tgt_pad)
        return {"memory (transformer_encode)": memory, "logits (transformer_decode)": decoded,
                "logits (transformer_forward)": logits}

    def expected(self, *case, how="right"):
        memory, logits, _, _ = torch_logits(*case, how)
        return {"memory (transformer_encode)": _np(memory),
                "logits (transformer_decode)": _np(logits),
                "logits (transformer_forward)": _np(logits)}

    def mistakes(self, params, src, tgt_in, config, pe, src_pad, tgt_pad):
        hows = {"without the positions (add the first T rows of the table: pe, or "
                "params['src_pos'] and params['tgt_pos'] where the positions are learned)":
                "no positions",
                "without the causal mask in the decoder's self-attention": "no causal mask",
                "without multiplying the token embeddings by sqrt(E) (config.scale_embeddings)":
                "no scale" if config["scale_embeddings"] else None,
                "with the embeddings scaled by sqrt(E) whatever config.scale_embeddings says":
                None if config["scale_embeddings"] else "always scaled",
                "with the source padding left out of the cross-attention's mask":
                "no memory padding mask" if src_pad is not None else None,
                "with the source padding left out of the encoder's self-attention mask":
                "no encoder padding mask" if src_pad is not None else None,
                "with the target padding left out of the decoder's self-attention mask "
                "(merge tgt_pad with the causal mask)":
                "no target padding mask" if tgt_pad is not None and tgt_pad.any() else None}
        case = (params, src, tgt_in, config, pe, src_pad, tgt_pad)
        return {text: partial(self.expected, *case, how=how) for text, how in hows.items() if how}


# --------------------------------------------------------------------------------------------
# Weight tying (§4)


class TiedOutput(Check, id="check-tied-output",
                 functions=("tied_output_forward", "tied_output_backward")):
    axes = {"logits": "btv", "dx": "bte"}  # axis names, for messages

    def cases(self, rng):
        yield Case("x (2, 3, 4), V = 6", normals(rng, (2, 3, 4), (6, 4), (2, 3, 6)))
        yield Case("one sequence (T, E)", normals(rng, (5, 3), (4, 3), (5, 4)))
        yield Case("float32", normals(rng, (2, 2, 5), (7, 5), (2, 2, 7), dtype=np.float32))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("V = E (a square table)", normals(rng, (2, 2, 4), (4, 4), (2, 2, 4)))
        yield Case("four axes", normals(rng, (2, 1, 3, 2), (5, 2), (2, 1, 3, 5)))
    ### END HIDDEN TESTS

    def run(self, f, x, W, dout):
        logits, cache = f.tied_output_forward(x, W)
        dx, grads = f.tied_output_backward(dout, cache)
        return {"logits": logits, "dx": dx, "grads": grads}

    def expected(self, x, W, dout):
        logits, dx, dW = autograd(lambda xt, Wt: xt @ Wt.T, dout, x, W)
        return {"logits": logits, "dx": dx, "grads": {"W": dW}}

    def mistakes(self, x, W, dout):
        right = self.expected(x, W, dout)
        return {"with the table's gradient transposed: the gradient of W.T is (E, V), the table "
                "W is (V, E)": lambda: dict(right, grads={"W": right["grads"]["W"].T})}
