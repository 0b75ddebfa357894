"""The encoder-decoder Transformer of "Attention Is All You Need", in NumPy, with its backward pass.

    from transformer_lab.models.encoder_decoder import Transformer, TransformerConfig

    config = TransformerConfig(src_vocab_size=16, tgt_vocab_size=16, d_model=32, num_heads=4)
    model = Transformer(config, seed=0)
    loss, grads = model.loss(src, tgt)          # src (B, S), tgt (B, T) padded token ids
    for name, g in grads.items():               # plain SGD, in place
        model.params[name] -= 0.1 * g
    model.greedy_decode(src)                    # list of generated token-id arrays

The checked boundary of ``transformer_lab.core.model``: parameters in one flat dict
``model.params`` (:func:`parameter_names`), nested for the core at every call. How it runs on
the core, its parameters and its padding: docs/maintainers.md, "Models and trainers".
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from transformer_lab import _validate as v
from transformer_lab import blocks as B
from transformer_lab import device
from transformer_lab import layers as L
from transformer_lab.core import layers as core_layers
from transformer_lab.core import model as core_model
from transformer_lab.core import translation as core_translation
from transformer_lab.models.checkpoints import CheckpointError  # noqa: F401  (Transformer.load's, importable with it)
from transformer_lab.models.config import TransformerConfig
from transformer_lab.models.inputs import (
    IGNORE_INDEX,
    check_decode_length,
    check_ids,
    check_inputs,
    check_loss_inputs,
    check_target,
    decoded_sequences,
    label_mask,
    length_limit,
)
from transformer_lab.models.shell import Model, ModelCache, flatten, nest

# --------------------------------------------------------------------------------------------
# Parameter names: one flat dict, nested for the core by shell.nest (and back by shell.flatten)


def _attention_names(prefix: str, packed: bool, bias: bool) -> list[str]:
    keys = ["W_qkv"] if packed else ["W_q", "W_k", "W_v"]
    keys.append("W_o")
    if bias:
        keys += ["b_qkv"] if packed else ["b_q", "b_k", "b_v"]
        keys.append("b_o")
    return [f"{prefix}.{k}" for k in keys]


def parameter_names(config: TransformerConfig) -> list[str]:
    """The names of :attr:`Transformer.params`, in order, for a config: the order of the
    core's nested encoder and decoder stacks (``core.blocks.encoder_forward`` /
    ``decoder_forward``), flattened, between the embeddings and the output projection."""
    c = config
    names = ["src_embed.W", "tgt_embed.W"]
    if c.positional == "learned":
        names += ["src_pos.W", "tgt_pos.W"]
    norm = ("gamma", "beta") if c.bias else ("gamma",)
    for side, num_layers, attentions in (("encoder", c.num_encoder_layers, ("self_attn",)),
                                         ("decoder", c.num_decoder_layers,
                                          ("self_attn", "cross_attn"))):
        for i in range(num_layers):
            p = f"{side}.layers.{i}"
            for a in attentions:
                names += _attention_names(f"{p}.{a}", a == "self_attn", c.bias)
            names += [f"{p}.ff.{k}" for k in (("W1", "b1", "W2", "b2") if c.bias else ("W1", "W2"))]
            names += [f"{p}.norm{j}.{k}" for j in range(1, len(attentions) + 2) for k in norm]
        names += [f"{side}.norm.{k}" for k in norm]
    names += ["out_proj.W", "out_proj.b"] if c.bias else ["out_proj.W"]
    return names


def nest_params(flat: Mapping[str, np.ndarray]) -> tuple[dict, dict]:
    """(encoder, decoder): the parameters (or gradients) of the two stacks as the core
    (``core.model``, ``core.blocks``) takes them, nested by :func:`~.shell.nest` from a flat dict
    with the names of :func:`parameter_names` (the same arrays; embeddings and the output
    projection are in neither)."""
    nested = nest(flat)
    return nested["encoder"], nested["decoder"]


def flatten_params(encoder: dict, decoder: dict) -> dict:
    """The inverse of :func:`nest_params`: dotted name -> array (the same array objects)."""
    return flatten({"encoder": encoder, "decoder": decoder})


def _init_params(c: TransformerConfig, seed: int) -> dict[str, np.ndarray]:
    """Deterministic initialisation from ``seed``, in the spirit of PyTorch's.

    Attention: Xavier-uniform weights and zero biases (``nn.MultiheadAttention``); feed-forward
    and output projection: uniform(+-1/sqrt(fan_in)) (``nn.Linear``), output bias zero; layer
    norms: gamma = 1, beta = 0; token embeddings: normal with standard deviation
    1/sqrt(d_model) when they are scaled by sqrt(d_model) (so that the scaled embedding has unit
    variance), 1 otherwise (``nn.Embedding``); learned positions: normal(0, 1/sqrt(2)), the
    variance of a sinusoidal entry. The uniform draws are ``core.layers.init_uniform`` and
    ``init_xavier``'s. The same seed gives the same values in float32 and float64.
    """
    rng = np.random.default_rng(seed)
    dt, d = c.dtype, c.d_model
    emb_std = 1.0 / math.sqrt(d) if c.scale_embeddings else 1.0
    params: dict[str, np.ndarray] = {
        "src_embed.W": (rng.standard_normal((c.src_vocab_size, d)) * emb_std).astype(dt),
        "tgt_embed.W": (rng.standard_normal((c.tgt_vocab_size, d)) * emb_std).astype(dt),
    }
    if c.positional == "learned":
        for side in ("src", "tgt"):
            params[f"{side}_pos.W"] = (rng.standard_normal((c.max_len, d))
                                       / math.sqrt(2.0)).astype(dt)
    nested_enc = {"layers": [B.encoder_layer_init(d, c.num_heads, c.d_ff, c.bias, rng, dt)
                             for _ in range(c.num_encoder_layers)],
                  "norm": B.layer_norm_init(d, c.bias, dt)}
    nested_dec = {"layers": [B.decoder_layer_init(d, c.num_heads, c.d_ff, c.bias, rng, dt)
                             for _ in range(c.num_decoder_layers)],
                  "norm": B.layer_norm_init(d, c.bias, dt)}
    params.update(flatten_params(nested_enc, nested_dec))
    params["out_proj.W"] = core_layers.init_uniform(d, (d, c.tgt_vocab_size), rng).astype(dt)
    if c.bias:
        params["out_proj.b"] = np.zeros(c.tgt_vocab_size, dt)
    return {k: np.ascontiguousarray(params[k]) for k in parameter_names(c)}


# --------------------------------------------------------------------------------------------
# The model


class Transformer(Model):
    """The encoder-decoder Transformer, as NumPy forward/backward passes on the course's core:
    ``Transformer(config, seed)`` with a :class:`TransformerConfig` (arguments and attributes:
    :class:`~.shell.Model`), and

    Attributes:
        pe: the sinusoidal table (max_len, d_model) added to the embeddings, or None.
    """

    kind = "transformer"
    config_class = TransformerConfig

    _init_params = staticmethod(_init_params)  # the initial parameters from (config, seed)

    def _setup(self, config: TransformerConfig, params: dict[str, np.ndarray]) -> None:
        super()._setup(config, params)
        self.pe = (L.positional_encoding(config.max_len, config.d_model, dtype=config.dtype)
                   if config.positional == "sinusoidal" else None)

    # ---------------------------------------------------------------------------- parameters

    def _nested(self) -> dict:
        """``self.params`` checked (names, shapes, dtype) and nested as ``core.model`` takes
        them: the same arrays, no copies."""
        return nest(self._checked_params())

    # ---------------------------------------------------------------------------- forward

    def _core_args(self, src, tgt_in, src_kpm, tgt_kpm):
        """The arguments of ``core.model.transformer_forward`` after ``params``, on the device: a
        padding mask without padding is None (no masking to do)."""
        put = device.put
        return (put(src), put(tgt_in), self.config, self.pe,
                put(src_kpm) if src_kpm.any() else None, put(tgt_kpm) if tgt_kpm.any() else None)

    def forward(self, src, tgt_in, src_key_padding_mask=None, tgt_key_padding_mask=None):
        """(logits (B, T, tgt_vocab_size), cache for :meth:`backward`) of source ids ``src``
        (B, S) and decoder input ids ``tgt_in`` (B, T: a target batch without its last column);
        the key padding masks, True = padding, default to ``ids == pad_id`` (the decoder's
        self-attention is causal as well)."""
        args = self._core_args(*check_inputs(self.config, src, tgt_in, src_key_padding_mask,
                                             tgt_key_padding_mask))
        logits, cache = core_model.transformer_forward(self._nested(), *args)
        return logits, ModelCache(cache, logits.shape, logits.dtype)

    __call__ = forward

    # ---------------------------------------------------------------------------- backward

    def backward(self, dlogits: np.ndarray, cache: ModelCache) -> dict[str, np.ndarray]:
        """The gradients of every parameter (the keys and shapes of ``model.params``) given
        ``dlogits``, the gradient of a scalar loss w.r.t. the logits of :meth:`forward`."""
        dlogits = self._checked_dlogits(dlogits, cache)
        return self._flat(core_model.transformer_backward(dlogits, cache.core))

    # ---------------------------------------------------------------------------- loss

    def loss_mask(self, tgt) -> np.ndarray:
        """(B, T-1) bool: which labels ``tgt[:, 1:]`` of a target batch (B, T) count in the
        loss (:func:`~.inputs.label_mask`)."""
        return label_mask(self.config, check_target(self.config, tgt))

    def loss(self, src, tgt, compute_grads: bool = True):
        """(loss, grads): the mean cross-entropy (a Python float) of the next-token predictions
        of source ids ``src`` (B, S) and a target batch ``tgt`` (B, T) -- the decoder reads
        ``tgt[:, :-1]``, the labels are those of :meth:`loss_mask` -- and its gradients (keys of
        ``params``; None with ``compute_grads=False``, for evaluation)."""
        compute_grads = v.boolean(compute_grads, "compute_grads")
        src, tgt, labels = check_loss_inputs(self.config, src, tgt)
        tgt_in = tgt[:, :-1]
        src, tgt_in, config, pe, src_pad, tgt_pad = self._core_args(
            src, tgt_in, src == self.config.pad_id, tgt_in == self.config.pad_id)
        params = self._nested()
        if compute_grads:
            loss, grads = core_model.transformer_loss(params, src, tgt_in, device.put(labels),
                                                      config, pe, src_pad, tgt_pad, IGNORE_INDEX)
            return loss, self._flat(grads)
        # evaluation: the loss's forward half, without the backward pass
        logits, _ = core_model.transformer_forward(params, src, tgt_in, config, pe, src_pad,
                                                   tgt_pad)
        return core_layers.cross_entropy_forward(logits, device.put(labels), IGNORE_INDEX)[0], \
            None

    # ---------------------------------------------------------------------------- inference

    def greedy_decode(self, src, max_len: int | None = None, padded: bool = False):
        """Greedy decoding of source ids ``src`` (B, S): from BOS, append the most likely token,
        all sequences together, each stopping at its first EOS (later steps give it padding),
        until all have stopped or after ``max_len`` tokens, EOS included (default and maximum:
        ``config.max_len``). The encoder runs once (``core.model.transformer_encode``), the
        decoder (``core.model.transformer_decode``) over the whole prefix at every step.

        Returns a list of B int64 arrays of the device, each sequence's tokens after BOS (ending
        with EOS unless it hit ``max_len``), or with ``padded`` one (B, 1 + longest) array in
        the target format (:func:`~.inputs.decoded_sequences`).
        """
        c, xp = self.config, device.xp
        src = check_ids(src, "src", c.src_vocab_size, length_limit(c))
        max_len = check_decode_length(c, max_len)
        params, memory, src_pad = self._encode(src)
        b = src.shape[0]
        out = xp.full((b, max_len + 1), c.pad_id, dtype=np.int64)
        out[:, 0] = c.bos_id
        done = xp.zeros(b, dtype=bool)
        steps = 0
        for t in range(max_len):
            logits = self._last_logits(params, out[:, :t + 1], memory, src_pad)
            nxt = xp.where(done, c.pad_id, logits.argmax(axis=-1))
            out[:, t + 1] = nxt
            done |= nxt == c.eos_id
            steps = t + 1
            if done.all():
                break
        return decoded_sequences(out[:, :steps + 1], c.eos_id, padded)

    def _encode(self, src):
        """(params, memory, source padding mask or None) for checked source ids: the encoder
        (``core.model.transformer_encode``) run once, on the device."""
        params = self._nested()
        src_pad = src == self.config.pad_id
        src, src_pad = device.put(src), device.put(src_pad) if src_pad.any() else None
        memory, _ = core_model.transformer_encode(params, src, self.config, self.pe, src_pad)
        return params, memory, src_pad

    def _last_logits(self, params, prefix, memory, src_pad):
        """The decoder's logits at the last position of ``prefix`` (B, t), run over the whole
        prefix (``core.model.transformer_decode``, its padding masked)."""
        tgt_pad = prefix == self.config.pad_id
        logits, _ = core_model.transformer_decode(params, prefix, memory, self.config, self.pe,
                                                  src_pad, tgt_pad if tgt_pad.any() else None)
        return logits[:, -1]

    def beam_decode(self, src, beam_size: int = 4, max_len: int | None = None,
                    alpha: float = 0.6, padded: bool = False, n_best: bool = False,
                    cache: bool = True):
        """Beam search (``core.translation.beam_search``, notebook 12): the ``beam_size`` best
        hypotheses of each source, ranked by summed log-probability over GNMT's length penalty
        ``((5 + |y|) / 6) ** alpha``; the best one is returned.

        The encoder runs once; every step runs the decoder for the B x beam_size hypotheses:
        for their newest token only, with a cache of the keys and values of the earlier ones
        reordered after each step (``core.translation.transformer_decode_step``), or, with
        ``cache=False``, over their whole prefixes (``core.model.transformer_decode``, padding
        masked as :meth:`greedy_decode` masks it). ``beam_size=1`` is greedy decoding.

        ``src``, ``max_len`` and ``padded`` as for :meth:`greedy_decode`, which this returns
        for the best hypothesis of each source; ``alpha >= 0`` (0: summed log-probability);
        ``n_best``: also return ``(sequences (B, beam_size, 1 + steps), scores (B,
        beam_size))``, best first; ``cache``: the same sequences, unless a live hypothesis emits
        padding, which only the uncached decoder masks.
        """
        c = self.config
        src = check_ids(src, "src", c.src_vocab_size, length_limit(c))
        beam_size = v.integer(beam_size, "beam_size", minimum=1)
        max_len = check_decode_length(c, max_len)
        alpha = v.real(alpha, "alpha", minimum=0)
        padded = v.boolean(padded, "padded")
        n_best = v.boolean(n_best, "n_best")
        step = (self._cached_beam_step if v.boolean(cache, "cache") else self._beam_step)(
            src, beam_size)
        seqs, scores = core_translation.beam_search(step, src.shape[0], beam_size, max_len,
                                                    c.bos_id, c.eos_id, c.pad_id, alpha)
        best = decoded_sequences(seqs[:, 0], c.eos_id, padded)
        return (best, (seqs, scores)) if n_best else best

    def _beam_step(self, src, beam_size: int):
        """The ``step(prefix, rows) -> logp`` of ``core.translation.beam_search`` for ``src``:
        the encoder's memory computed once and repeated ``beam_size`` times (row ``b * K + k``
        reads source ``b``), the decoder run over the whole prefix at each step."""
        params, memory, src_pad = self._encode(src)
        memory = memory.repeat(beam_size, axis=0)  # (B*K, S, E)
        src_pad = None if src_pad is None else src_pad.repeat(beam_size, axis=0)

        def step(prefix, rows):  # no cache: ``rows`` is not needed
            logits = self._last_logits(params, prefix, memory, src_pad)
            return core_layers.log_softmax_forward(logits)[0]  # (B*K, V)
        return step

    def _cached_beam_step(self, src, beam_size: int):
        """:meth:`_beam_step` with the decoder's caches: each step reorders the caches by
        ``rows`` (each hypothesis takes its parent's) and runs the decoder for the new token."""
        c, zeros = self.config, device.xp.zeros
        params, memory, src_pad = self._encode(src)
        src_pad = None if src_pad is None else src_pad.repeat(beam_size, axis=0)
        memory_kvs = [tuple(a.repeat(beam_size, axis=0) for a in
                            core_translation.memory_keys_values(memory, layer["cross_attn"],
                                                                c.num_heads))
                      for layer in params["decoder"]["layers"]]
        rows_total = src.shape[0] * beam_size
        shape = (rows_total, c.num_heads, c.max_len, c.d_model // c.num_heads)
        caches = [(zeros(shape, c.dtype), zeros(shape, c.dtype))
                  for _ in params["decoder"]["layers"]]
        state = {"length": 0}

        def step(prefix, rows):
            n = state["length"]
            for K, V in caches:  # each hypothesis continues its parent's cache
                K[:, :, :n] = K[rows, :, :n]
                V[:, :, :n] = V[rows, :, :n]
            logits, state["length"] = core_translation.transformer_decode_step(
                params, prefix[:, n:], c, caches, n, memory_kvs, self.pe, src_pad)
            return core_layers.log_softmax_forward(logits[:, -1])[0]  # (B*K, V)
        return step

    def attention_maps(self, src, tgt_in, src_key_padding_mask=None,
                       tgt_key_padding_mask=None) -> dict[str, np.ndarray]:
        """The attention weights of every attention layer, per head, for plotting:
        ``{"encoder.layers.i.self_attn": (B, H, S, S), "decoder.layers.i.self_attn":
        (B, H, T, T), "decoder.layers.i.cross_attn": (B, H, T, S)}`` (rows: queries)."""
        _, cache = self.forward(src, tgt_in, src_key_padding_mask, tgt_key_padding_mask)
        # the stacks' caches, which hold the weights, in core.model.transformer_forward's cache:
        # ((c_embed, c_stack), (c_embed, c_stack, c_out), learned)
        (_, enc), (_, dec, _), _ = cache.core
        maps = {}
        for i, layer in enumerate(B.stack_layer_caches(enc)):
            (maps[f"encoder.layers.{i}.self_attn"],) = B.layer_attention_weights(layer)
        for i, layer in enumerate(B.stack_layer_caches(dec)):
            (maps[f"decoder.layers.{i}.self_attn"],
             maps[f"decoder.layers.{i}.cross_attn"]) = B.layer_attention_weights(layer)
        return maps

    def __repr__(self) -> str:
        c = self.config
        return (f"Transformer(d_model={c.d_model}, heads={c.num_heads}, layers="
                f"{c.num_encoder_layers}+{c.num_decoder_layers}, d_ff={c.d_ff}, vocab="
                f"{c.src_vocab_size}->{c.tgt_vocab_size}, "
                f"{'pre' if c.norm_first else 'post'}-norm, {np.dtype(c.dtype).name}, "
                f"{self.num_parameters():,} parameters)")
