"""The twins: one class per supported torch module, each a thin boundary around the core.

A twin checks the arguments of ``forward`` / ``backward`` once, with the errors of the package
(the argument named, what was expected said), converts them (sequence layout, masks: see
:mod:`transformer_lab.reference.interop.arguments`; weights: see
:mod:`transformer_lab.reference.interop.layout`)
and calls :mod:`transformer_lab.core` -- through the core modules' attributes at call time, so
that an edited core (the student's, the grader's) is the one that runs. It computes none of the
core's math itself. What every twin does and where it differs from torch:
docs/maintainers.md, "Models and trainers".
"""

from __future__ import annotations

import numpy as np

from transformer_lab import _validate as v
from transformer_lab.attention import multihead_weights
from transformer_lab.core import blocks as core_blocks
from transformer_lab.core import layers as core_layers
from transformer_lab.core import multihead as core_multihead
from transformer_lab.reference.interop import arguments as args
from transformer_lab.reference.interop.layout import (
    _T,
    layer_from_torch,
    layer_to_torch,
    mha_from_torch,
    mha_to_torch,
    norm_from_torch,
    norm_to_torch,
    stack_from_torch,
    stack_to_torch,
)

__all__ = ["LinearTwin", "EmbeddingTwin", "LayerNormTwin", "MultiheadAttentionTwin",
           "TransformerEncoderLayerTwin", "TransformerDecoderLayerTwin", "TransformerEncoderTwin",
           "TransformerDecoderTwin", "TransformerTwin"]


# --------------------------------------------------------------------------------------------
# What every twin has: weights in, gradients out, checked inputs


class _Twin:
    """What every twin has: ``params`` (torch names, torch layout), ``grads``, ``dtype``."""

    def __init__(self, module):
        _refuse_dropout(module)
        self.params = {}
        for name, p in module.named_parameters():
            self.params[name] = p.detach().cpu().numpy().copy()
        dtypes = {a.dtype for a in self.params.values()}
        if len(dtypes) > 1 or not dtypes <= {np.dtype(np.float32), np.dtype(np.float64)}:
            raise TypeError(f"module parameters must all be float32 or all float64, got "
                            f"{sorted(str(d) for d in dtypes)} (use module.float() or "
                            "module.double())")
        # A module without parameters (LayerNorm without affine) takes float32 and float64.
        self.dtype = dtypes.pop() if dtypes else None
        self.grads: dict[str, np.ndarray] = {}
        self._cache = None

    def refresh(self, module) -> None:
        """Copy the current weights of ``module`` (the one this twin was built from, or one of
        the same structure: parameter names, shapes and dtype) into the twin.

        Everything is checked before anything is copied; for a module of another size or dtype
        build a new twin with ``from_torch(module)``.
        """
        new = {name: p.detach().cpu().numpy() for name, p in module.named_parameters()}
        if list(new) != list(self.params):
            raise ValueError(f"module must have the parameters of the twin {list(self.params)}, "
                             f"got {list(new)}")
        for name, value in new.items():
            mine = self.params[name]
            if value.shape != mine.shape:
                raise ValueError(f"module parameter {name!r} has shape {value.shape} but the "
                                 f"twin's has shape {mine.shape}: refresh needs a module of the "
                                 f"same sizes (build a new twin with from_torch(module))")
            if value.dtype != mine.dtype:
                raise TypeError(f"module parameter {name!r} is {value.dtype} but the twin is "
                                f"{mine.dtype}: refresh needs a module of the same dtype (build a "
                                f"new twin with from_torch(module))")
        _refuse_dropout(module)
        for name, value in new.items():
            np.copyto(self.params[name], value)

    def _last(self):
        if self._cache is None:
            raise ValueError(f"{type(self).__name__}.backward: no forward pass to differentiate "
                             "-- call twin.forward(...) first")
        return self._cache

    def _set_grads(self, grads: dict) -> None:
        """Store torch-layout gradients in the order of ``named_parameters()``."""
        self.grads = {name: np.ascontiguousarray(grads[name]) for name in self.params}

    def _input(self, x, name: str) -> np.ndarray:
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{name} must be a NumPy array, got {type(x).__name__}")
        if self.dtype is None:
            return v.float_array(x, name)
        if x.dtype != self.dtype:
            raise TypeError(f"{name} must have the module's dtype {self.dtype}, got {x.dtype} "
                            f"(convert it with {name}.astype(np.{self.dtype}))")
        return x

    def _dout(self, dout, shape: tuple, dtype=None) -> np.ndarray:
        """The upstream gradient of the last forward: a NumPy array of the output's shape and
        dtype (``dtype``: that of the forward's input, for twins without parameters)."""
        dtype = self.dtype if dtype is None else dtype
        return v.grad_like(dout, "dout", shape, dtype, what="the forward output")

    def _seq(self, x, name: str, width: int) -> np.ndarray:
        """A sequence argument, checked, as a batch-first (B, T, width) view."""
        return args.batch_first(self._input(x, name), name, width, self.batch_first)


def _refuse_dropout(module) -> None:
    from torch import nn

    for name, sub in module.named_modules():
        p = (sub.p if isinstance(sub, nn.modules.dropout._DropoutNd)
             else sub.dropout if isinstance(sub, nn.MultiheadAttention) else 0.0)
        if sub.training and p > 0:
            where = f"{name} (p={p})" if name else f"p={p}"
            raise ValueError(f"module would apply dropout in training mode ({where}): a twin "
                             "computes no randomness -- call module.eval(), or build the module "
                             "with dropout=0.0")


# --------------------------------------------------------------------------------------------
# Reading a module's configuration


def _activation_name(act) -> str:
    """The core's name of a Transformer layer's activation ("relu", "gelu", "gelu_tanh")."""
    import torch.nn.functional as F
    from torch import nn

    if act is F.relu or isinstance(act, nn.ReLU):
        return "relu"
    if act is F.gelu:
        return "gelu"
    if isinstance(act, nn.GELU):
        return "gelu" if act.approximate == "none" else "gelu_tanh"
    raise ValueError(f"activation must be relu or gelu (the string, F.relu/F.gelu, nn.ReLU or "
                     f"nn.GELU), got {act!r}")


def _layer_config(layer, where: str) -> dict:
    """num_heads, norm_first, activation, eps, batch_first of an encoder/decoder layer."""
    from torch import nn

    e = layer.self_attn.embed_dim
    h = layer.self_attn.num_heads
    if not isinstance(h, int) or h <= 0 or e % h:
        raise ValueError(f"num_heads of {where}: the model width {e} must be divisible by "
                         f"num_heads, got num_heads = {h}")
    norms = [m for n, m in layer.named_children() if n.startswith("norm")]
    eps = {m.eps for m in norms}
    if len(eps) != 1:
        raise ValueError(f"layer_norm_eps of {where}: its norms must share one eps, got "
                         f"{sorted(eps)}")
    attns = [layer.self_attn] + ([layer.multihead_attn] if hasattr(layer, "multihead_attn")
                                 else [])
    for m in attns:
        if not isinstance(m, nn.MultiheadAttention) or m.bias_k is not None or m.add_zero_attn:
            raise ValueError(f"{where}: attention with add_bias_kv or add_zero_attn is not "
                             "supported by the twins")
        if m.num_heads != h or not m._qkv_same_embed_dim:
            raise ValueError(f"{where}: the self- and cross-attention must have the same heads "
                             "and kdim = vdim = d_model, as torch builds them")
    return {"num_heads": h, "norm_first": bool(layer.norm_first),
            "activation": _activation_name(layer.activation), "eps": eps.pop(),
            "batch_first": bool(layer.self_attn.batch_first), "d_model": e}


def _stack_config(layers, where: str) -> dict:
    configs = [_layer_config(m, f"{where}.layers.{i}") for i, m in enumerate(layers)]
    if not configs:
        raise ValueError(f"{where} must have at least one layer")
    if any(c != configs[0] for c in configs):
        raise ValueError(f"{where}: every layer must have the same num_heads, norm_first, "
                         "activation, layer_norm_eps and batch_first")
    return configs[0]


def _final_norm(norm, where: str, e: int):
    """The eps of an optional final nn.LayerNorm(d_model) of a stack, or None."""
    from torch import nn

    if norm is None:
        return None
    if not isinstance(norm, nn.LayerNorm) or tuple(norm.normalized_shape) != (e,):
        raise ValueError(f"{where}.norm must be None or nn.LayerNorm({e}), got {norm!r}")
    return norm.eps


# --------------------------------------------------------------------------------------------
# Linear, Embedding, LayerNorm


class LinearTwin(_Twin):
    """Twin of ``nn.Linear(in_features, out_features, bias)``.

    ``forward(input)``: input (..., in_features) -> (..., out_features).
    ``backward(dout)`` -> dinput; ``grads``: ``weight`` (out, in), ``bias`` (out,).
    """

    def __init__(self, module):
        super().__init__(module)
        self.in_features, self.out_features = module.in_features, module.out_features

    def forward(self, input):
        x = self._input(input, "input")
        if x.ndim < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"input must have shape (..., in_features = {self.in_features}), "
                             f"got {x.shape}")
        out, cache = core_layers.linear_forward(x, _T(self.params["weight"]),
                                                self.params.get("bias"))
        self._cache = (cache, x.shape)
        return out

    def backward(self, dout):
        cache, shape = self._last()
        dout = self._dout(dout, (*shape[:-1], self.out_features))
        dx, g = core_layers.linear_backward(dout, cache)
        self._set_grads({"weight": _T(g["W"]), **({"bias": g["b"]} if "b" in g else {})})
        return dx


class EmbeddingTwin(_Twin):
    """Twin of ``nn.Embedding(num_embeddings, embedding_dim, padding_idx, ...)``.

    ``forward(input)``: integer ids of any shape S, each in [0, num_embeddings) -> (*S, D).
    ``backward(dout)`` -> None (ids have no gradient); ``grads``: ``weight`` (V, D), dense even
    for ``sparse=True``; zero in row ``padding_idx``; with ``scale_grad_by_freq`` each row's
    gradient is divided by the number of occurrences of its id in the batch, as torch does.
    ``max_norm`` (which rewrites the table during forward) is not supported.
    """

    def __init__(self, module):
        if module.max_norm is not None:
            raise ValueError("max_norm: the twin does not support nn.Embedding(max_norm=...), "
                             "which renormalises rows of the table in place during forward")
        super().__init__(module)
        self.padding_idx = module.padding_idx
        self.scale_grad_by_freq = bool(module.scale_grad_by_freq)

    def forward(self, input):
        weight = self.params["weight"]
        ids = v.token_ids(input, "input", weight.shape[0])
        out, cache = core_layers.embedding_forward(ids, weight)
        self._cache = (cache, ids)
        return out

    def backward(self, dout):
        cache, ids = self._last()
        vocab, width = self.params["weight"].shape
        dout = self._dout(dout, (*ids.shape, width))
        if self.scale_grad_by_freq:  # torch's option: divide by the id's count in the batch
            counts = np.bincount(ids.reshape(-1), minlength=vocab)
            dout = dout / counts[ids][..., None].astype(dout.dtype)
        dW = core_layers.embedding_backward(dout, cache)["W"]
        if self.padding_idx is not None:  # torch's option: the padding row never learns
            dW[self.padding_idx] = 0
        self._set_grads({"weight": dW})
        return None


class LayerNormTwin(_Twin):
    """Twin of ``nn.LayerNorm(normalized_shape, eps, elementwise_affine, bias)``.

    ``forward(input)``: input (..., *normalized_shape), normalised over the trailing
    ``normalized_shape`` axes. ``backward(dout)`` -> dinput; ``grads``: ``weight``, ``bias``
    of shape ``normalized_shape`` (when the module has them).
    """

    def __init__(self, module):
        super().__init__(module)
        self.normalized_shape = tuple(module.normalized_shape)
        self.eps = module.eps
        self._p = norm_from_torch(self.params, "")

    def forward(self, input):
        x = self._input(input, "input")
        k = len(self.normalized_shape)
        if x.ndim < k or x.shape[x.ndim - k:] != self.normalized_shape:
            raise ValueError(f"input must have shape (..., *normalized_shape) with "
                             f"normalized_shape = {self.normalized_shape}, got {x.shape}")
        # Normalising over several trailing axes is normalising over one axis of their product.
        x2 = x.reshape(*x.shape[:x.ndim - k], -1)
        out, cache = core_layers.layer_norm_forward(x2, self._p.get("gamma"),
                                                    self._p.get("beta"), self.eps)
        self._cache = (cache, x.shape, x.dtype)
        return out.reshape(x.shape)

    def backward(self, dout):
        cache, shape, dtype = self._last()
        dout = self._dout(dout, shape, dtype)
        lead = shape[:len(shape) - len(self.normalized_shape)]
        dx, g = core_layers.layer_norm_backward(dout.reshape(*lead, -1), cache)
        self._set_grads(norm_to_torch(g, "", self.normalized_shape))
        return dx.reshape(shape)


# --------------------------------------------------------------------------------------------
# Multi-head attention


class MultiheadAttentionTwin(_Twin):
    """Twin of ``nn.MultiheadAttention(embed_dim, num_heads, bias, kdim, vdim, batch_first)``.

    ``forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False)`` -> ``(out, weights or None)``:

    - query (B, T, E), key (B, S, kdim), value (B, S, vdim) with ``batch_first``; (T, B, E),
      (S, B, kdim), (S, B, vdim) without; (T, E), (S, kdim), (S, vdim) unbatched;
    - out like query; weights (B, T, S) averaged over heads, or (B, H, T, S) per head (always
      batch first, as torch; (T, S) / (H, T, S) unbatched; read-only); None with
      ``need_weights=False``.

    ``backward(dout, dweights=None)`` -> ``(dquery, dkey, dvalue)``, also when the same array was
    passed three times (torch's gradient of the shared tensor is their sum); ``dweights`` is an
    optional gradient of the returned weights. ``grads``: ``in_proj_weight`` (3E, E) or
    ``q_proj_weight``/``k_proj_weight``/``v_proj_weight``, ``in_proj_bias`` (3E,),
    ``out_proj.weight`` (E, E), ``out_proj.bias`` (E,).

    Runs ``core.multihead.multi_head_attention_forward`` with ``W_q, W_k, W_v`` as views of
    ``in_proj_weight`` (one gradient per argument needs the three projections apart). A query
    row whose keys are all masked gets zero weights and output ``out_proj.bias`` (torch: NaN
    with ``need_weights=True``).
    """

    def __init__(self, module):
        if module.bias_k is not None or module.add_zero_attn:
            raise ValueError("add_bias_kv / add_zero_attn: the twin does not support these "
                             "options of nn.MultiheadAttention")
        super().__init__(module)
        self.embed_dim, self.kdim, self.vdim = module.embed_dim, module.kdim, module.vdim
        self.num_heads = module.num_heads
        if not isinstance(self.num_heads, int) or self.num_heads <= 0 or \
                self.embed_dim % self.num_heads:
            raise ValueError(f"num_heads: embed_dim = {self.embed_dim} must be divisible by "
                             f"num_heads, got num_heads = {self.num_heads}")
        self.batch_first = bool(module.batch_first)
        self._p = mha_from_torch(self.params, "", self.embed_dim, split=True)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        q = self._seq(query, "query", self.embed_dim)
        k = self._seq(key, "key", self.kdim)
        val = self._seq(value, "value", self.vdim)
        batched = args.same_rank(query=query, key=key, value=value)
        (b, t, _), s, h = q.shape, k.shape[1], self.num_heads
        if k.shape[0] != b or val.shape[0] != b:
            raise ValueError(f"query, key and value must have the same batch size, got "
                             f"{b}, {k.shape[0]}, {val.shape[0]}")
        if val.shape[1] != s:
            raise ValueError(f"key and value must have the same length S, got {s} and "
                             f"{val.shape[1]}")
        need_weights, average = bool(need_weights), bool(average_attn_weights)
        kpm = args.padding_mask(key_padding_mask, "key_padding_mask", b, s, batched)
        am = args.attn_mask(attn_mask, "attn_mask", b, h, t, s, batched)
        am = args.is_causal(am, is_causal, kpm, t, s, "attn_mask", "is_causal",
                            override=not need_weights)
        out, cache = core_multihead.multi_head_attention_forward(
            q, k, val, self._p, h, args.merge(am, kpm, self.dtype))
        weights = None
        if need_weights:
            weights = multihead_weights(cache)  # (B, H, T, S)
            if average:
                weights = weights.mean(axis=1)
            else:  # the backward pass reads these again: handed out read-only
                weights = weights.view()
                weights.flags.writeable = False
            weights = weights if batched else weights[0]
        self._cache = (cache, batched, need_weights, average,
                       (query.shape, key.shape, value.shape))
        return args.torch_layout(out, batched, self.batch_first), weights

    def backward(self, dout, dweights=None):
        cache, batched, need_weights, average, shapes = self._last()
        d = self._seq(self._dout(dout, shapes[0]), "dout", self.embed_dim)
        if dweights is not None:
            dweights = self._dweights(dweights, cache, batched, need_weights, average)
        dq, dk, dv, g = core_multihead.multi_head_attention_backward(d, cache, dweights)
        self._set_grads(mha_to_torch(g, "", packed="in_proj_weight" in self.params))
        return tuple(args.torch_layout(x, batched, self.batch_first) for x in (dq, dk, dv))

    def _dweights(self, dweights, cache, batched: bool, need_weights: bool, average: bool):
        """The gradient of the returned weights, checked, as the gradient of the per-head
        weights (B, H, T, S) that the core's backward takes."""
        if not need_weights:
            raise ValueError("dweights: the last forward returned no weights "
                             "(need_weights=False)")
        full = multihead_weights(cache).shape  # (B, H, T, S)
        shape = full[:1] + full[2:] if average else full
        what = "the averaged attention weights" if average else "the attention weights per head"
        dweights = v.grad_like(self._input(dweights, "dweights"), "dweights",
                               shape if batched else shape[1:], self.dtype, what=what)
        dweights = dweights if batched else dweights[None]
        if average:  # the mean over the heads passes 1/H of the gradient to each head
            dweights = np.broadcast_to(dweights[:, None] / self.num_heads, full)
        return dweights


# --------------------------------------------------------------------------------------------
# Encoder and decoder layers


class _LayerTwin(_Twin):
    """Common set-up of the layer and stack twins: configuration, sequences, masks, and the
    backward pass through ``self._core`` (a :class:`_Layer` or a :class:`_Stack`)."""

    def _configure(self, core) -> None:
        self._core, cfg = core, core.cfg
        self.d_model, self.num_heads = cfg["d_model"], cfg["num_heads"]
        self.norm_first, self.activation = cfg["norm_first"], cfg["activation"]
        self.eps, self.batch_first = cfg["eps"], cfg["batch_first"]

    def _seqs(self, **xs):
        """Batch-first views of sequence arguments; checks ranks and batch sizes."""
        out = {n: self._seq(x, n, self.d_model) for n, x in xs.items()}
        batched = args.same_rank(**xs)
        sizes = {n: x.shape[0] for n, x in out.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"{' and '.join(sizes)} must have the same batch size, got "
                             + ", ".join(f"{n} {s}" for n, s in sizes.items()))
        return (*out.values(), batched)

    def _mask(self, mask, padding, hint, names, b, t, s, batched, heads=None):
        """The one mask of an attention over keys of length ``s``, torch's is_causal applied
        (``names``: the torch names of the mask, the padding mask and the is_causal flag)."""
        kpm = args.padding_mask(padding, names[1], b, s, batched)
        am = args.attn_mask(mask, names[0], b, heads or self.num_heads, t, s, batched)
        am = args.is_causal(am, hint, kpm, t, s, names[0], names[2])
        return args.merge(am, kpm, self.dtype)

    def _self_mask(self, x, mask, padding, hint, names, batched, heads=None):
        b, t = x.shape[:2]
        return self._mask(mask, padding, hint, names, b, t, t, batched, heads)

    def _cross_mask(self, x, mem, mask, padding, hint, batched, heads=None):
        return self._mask(mask, padding, hint, ("memory_mask", "memory_key_padding_mask",
                                                "memory_is_causal"),
                          x.shape[0], x.shape[1], mem.shape[1], batched, heads)

    def _encode(self, src, mask, padding, hint, names):
        """The forward of an encoder layer or stack (``names``: of its mask arguments)."""
        x, batched = self._seqs(src=src)
        out, cache = self._core.forward(x, self._self_mask(x, mask, padding, hint, names,
                                                           batched))
        return self._done(out, cache, batched, src.shape)

    def _decode(self, tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
                memory_key_padding_mask, tgt_is_causal, memory_is_causal):
        """The forward of a decoder layer or stack."""
        x, mem, batched = self._seqs(tgt=tgt, memory=memory)
        tm = self._self_mask(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal,
                             ("tgt_mask", "tgt_key_padding_mask", "tgt_is_causal"), batched)
        mm = self._cross_mask(x, mem, memory_mask, memory_key_padding_mask, memory_is_causal,
                              batched)
        out, cache = self._core.forward(x, tm, mm, memory=mem)
        return self._done(out, cache, batched, tgt.shape)

    def _done(self, out, cache, batched: bool, shape: tuple):
        self._cache = (cache, batched, shape)
        return args.torch_layout(out, batched, self.batch_first)

    def _grads(self, dout, cache):
        return self._core.backward(dout, cache)

    def backward(self, dout):
        cache, batched, shape = self._last()
        d = self._seq(self._dout(dout, shape), "dout", self.d_model)
        dx, dy, grads = self._grads(d, cache)
        self._set_grads(grads)
        dx = args.torch_layout(dx, batched, self.batch_first)
        return dx if dy is None else (dx, args.torch_layout(dy, batched, self.batch_first))


class _Layer:
    """One encoder or decoder layer inside a twin, run as :class:`_Stack` runs a stack."""

    def __init__(self, module, P: dict, decoder: bool):
        self.cfg, self.decoder = _layer_config(module, "the layer"), decoder
        self.params = layer_from_torch(P, "", self.cfg["d_model"], decoder, split_cross=decoder)
        self.kw = {k: self.cfg[k] for k in ("norm_first", "activation", "eps")}

    def forward(self, x, *masks, memory=None):
        h = self.cfg["num_heads"]
        if self.decoder:
            return core_blocks.decoder_layer_forward(x, memory, self.params, h, *masks,
                                                     **self.kw)
        return core_blocks.encoder_layer_forward(x, self.params, h, *masks, **self.kw)

    def backward(self, dout, cache):
        """Returns dx, dmemory (decoders; None for encoders) and torch-named grads."""
        if self.decoder:
            dx, dmem, g = core_blocks.decoder_layer_backward(dout, cache)
        else:
            (dx, g), dmem = core_blocks.encoder_layer_backward(dout, cache), None
        return dx, dmem, layer_to_torch(g, "")


class TransformerEncoderLayerTwin(_LayerTwin):
    """Twin of ``nn.TransformerEncoderLayer`` (any bias, batch_first, norm_first, activation,
    layer_norm_eps).

    ``forward(src, src_mask=None, src_key_padding_mask=None, is_causal=False)`` -> out, the
    shape of src ((B, T, E) batch-first, (T, B, E) otherwise, or (T, E)).
    ``backward(dout)`` -> dsrc. ``grads``: ``self_attn.in_proj_weight``, ...,
    ``linear1.weight``, ..., ``norm2.bias`` (the names of ``named_parameters()``).
    Runs ``core.blocks.encoder_layer_forward`` (self-attention with packed ``W_qkv``).
    """

    def __init__(self, module):
        super().__init__(module)
        self._configure(_Layer(module, self.params, decoder=False))

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        return self._encode(src, src_mask, src_key_padding_mask, is_causal,
                            ("src_mask", "src_key_padding_mask", "is_causal"))


class TransformerDecoderLayerTwin(_LayerTwin):
    """Twin of ``nn.TransformerDecoderLayer``.

    ``forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False)`` -> out, the
    shape of tgt; memory (B, S, E) / (S, B, E) / (S, E).
    ``backward(dout)`` -> ``(dtgt, dmemory)``. ``grads``: torch names (``self_attn.*``,
    ``multihead_attn.*``, ``linear1.*``, ``linear2.*``, ``norm1.*`` .. ``norm3.*``).
    Runs ``core.blocks.decoder_layer_forward`` (self-attention with packed ``W_qkv``,
    cross-attention with ``W_q, W_k, W_v``: views of ``in_proj_weight``).
    """

    def __init__(self, module):
        super().__init__(module)
        self._configure(_Layer(module, self.params, decoder=True))

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        return self._decode(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
                            memory_key_padding_mask, tgt_is_causal, memory_is_causal)


# --------------------------------------------------------------------------------------------
# Stacks and the whole Transformer


class _Stack:
    """An encoder or decoder stack inside a twin: layer params, final norm, forward/backward.

    Shared by the stack twins and the Transformer twin (where it sits under ``encoder.`` /
    ``decoder.``). The final norm is applied here, with ``core.layers.layer_norm_forward`` and
    its own eps, so a stack whose final ``nn.LayerNorm`` has an eps different from its layers'
    is handled exactly.
    """

    def __init__(self, module, P: dict, prefix: str, where: str, decoder: bool):
        self.cfg = _stack_config(module.layers, where)
        e = self.cfg["d_model"]
        self.prefix, self.decoder = prefix, decoder
        self.params = stack_from_torch(P, prefix, len(module.layers), e, decoder,
                                       split_cross=True, final_norm=False)
        self.norm_eps = _final_norm(module.norm, where, e)
        self.norm = None if self.norm_eps is None else norm_from_torch(P, prefix + "norm.")
        self.kw = {k: self.cfg[k] for k in ("norm_first", "activation", "eps")}

    def forward(self, x, *masks, memory=None):
        """x: (B, T, E); masks: the encoder's one mask, or the decoder's (tgt, memory) masks."""
        h = self.cfg["num_heads"]
        if self.decoder:
            out, cache = core_blocks.decoder_forward(x, memory, self.params, h, *masks,
                                                     **self.kw)
        else:
            out, cache = core_blocks.encoder_forward(x, self.params, h, *masks, **self.kw)
        ncache = None
        if self.norm is not None:
            out, ncache = core_layers.layer_norm_forward(out, self.norm.get("gamma"),
                                                         self.norm.get("beta"), self.norm_eps)
        return out, (cache, ncache)

    def backward(self, dout, caches):
        """Returns dx, dmemory (decoders; None for encoders) and torch-named grads."""
        cache, ncache = caches
        norm_grads = None
        if ncache is not None:
            dout, norm_grads = core_layers.layer_norm_backward(dout, ncache)
        if self.decoder:
            dx, dmem, g = core_blocks.decoder_backward(dout, cache)
        else:
            (dx, g), dmem = core_blocks.encoder_backward(dout, cache), None
        grads = stack_to_torch({"layers": g["layers"], "norm": norm_grads}, self.prefix)
        return dx, dmem, grads


class TransformerEncoderTwin(_LayerTwin):
    """Twin of ``nn.TransformerEncoder(encoder_layer, num_layers, norm)``.

    ``forward(src, mask=None, src_key_padding_mask=None, is_causal=None)`` -> out, the shape of
    src. ``backward(dout)`` -> dsrc. ``grads``: ``layers.0.self_attn.in_proj_weight``, ...,
    ``norm.weight``, ``norm.bias``. Computes torch's autograd path, not its no-grad nested-tensor
    fast path (docs/maintainers.md, "Models and trainers"). Runs
    ``core.blocks.encoder_forward``.
    """

    def __init__(self, module):
        super().__init__(module)
        self._configure(_Stack(module, self.params, "", "the encoder", decoder=False))

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        return self._encode(src, mask, src_key_padding_mask, is_causal,
                            ("mask", "src_key_padding_mask", "is_causal"))


class TransformerDecoderTwin(_LayerTwin):
    """Twin of ``nn.TransformerDecoder(decoder_layer, num_layers, norm)``.

    ``forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False)`` -> out.
    ``backward(dout)`` -> ``(dtgt, dmemory)``. ``grads``: ``layers.0.*``, ``norm.*``.
    Runs ``core.blocks.decoder_forward``.
    """

    def __init__(self, module):
        super().__init__(module)
        self._configure(_Stack(module, self.params, "", "the decoder", decoder=True))

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False):
        return self._decode(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
                            memory_key_padding_mask, tgt_is_causal, memory_is_causal)


class TransformerTwin(_LayerTwin):
    """Twin of ``nn.Transformer`` (encoder stack + final norm, decoder stack + final norm).

    ``forward(src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
    src_key_padding_mask=None, tgt_key_padding_mask=None, memory_key_padding_mask=None,
    src_is_causal=None, tgt_is_causal=None, memory_is_causal=False)`` -> out, the shape of tgt.
    src (B, S, E) / (S, B, E) / (S, E), tgt (B, T, E) / (T, B, E) / (T, E).
    ``backward(dout)`` -> ``(dsrc, dtgt)``. ``grads``: ``encoder.layers.0.self_attn.*``, ...,
    ``decoder.norm.bias`` (the names of ``named_parameters()``).
    """

    def __init__(self, module):
        from torch import nn

        if not isinstance(module.encoder, nn.TransformerEncoder) or \
                not isinstance(module.decoder, nn.TransformerDecoder):
            raise ValueError("custom_encoder/custom_decoder must be an nn.TransformerEncoder / "
                             "nn.TransformerDecoder for the twin")
        super().__init__(module)
        self._enc = _Stack(module.encoder, self.params, "encoder.", "the encoder", False)
        self._dec = _Stack(module.decoder, self.params, "decoder.", "the decoder", True)
        if self._enc.cfg["batch_first"] != self._dec.cfg["batch_first"] or \
                self._enc.cfg["d_model"] != self._dec.cfg["d_model"]:
            raise ValueError("the encoder and decoder must have the same d_model and "
                             "batch_first")
        self._configure(self._enc)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
                src_key_padding_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
                memory_is_causal=False):
        x, y, batched = self._seqs(src=src, tgt=tgt)
        sm = self._self_mask(x, src_mask, src_key_padding_mask, src_is_causal,
                             ("src_mask", "src_key_padding_mask", "src_is_causal"), batched)
        # 3-D masks are (batch * num_heads, ., .): the decoder's with the decoder's heads
        h = self._dec.cfg["num_heads"]
        tm = self._self_mask(y, tgt_mask, tgt_key_padding_mask, tgt_is_causal,
                             ("tgt_mask", "tgt_key_padding_mask", "tgt_is_causal"), batched,
                             heads=h)
        mm = self._cross_mask(y, x, memory_mask, memory_key_padding_mask, memory_is_causal,
                              batched, heads=h)
        memory, ecache = self._enc.forward(x, sm)
        out, dcache = self._dec.forward(y, tm, mm, memory=memory)
        return self._done(out, (ecache, dcache), batched, tgt.shape)

    def _grads(self, dout, cache):  # -> dsrc, dtgt, grads
        ecache, dcache = cache
        dtgt, dmem, grads = self._dec.backward(dout, dcache)
        dsrc, _, egrads = self._enc.backward(dmem, ecache)
        return dsrc, dtgt, {**grads, **egrads}
