"""A decoder-only language model (GPT) in NumPy, with its backward pass, sampling and a KV cache.

    from transformer_lab.models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=100), seed=0)          # the 2017 / GPT-2 block
    model = GPT(GPTConfig.modern(vocab_size=100), seed=0)   # RMSNorm, SwiGLU, RoPE, GQA
    loss, grads = model.loss(ids)                # ids (B, T): position t predicts ids[:, t+1]
    model.generate(prompt, 100, temperature=0.8, top_k=20, seed=0)   # prompt + 100 token ids

The checked boundary of ``transformer_lab.core.gpt``: parameters in one flat dict
``model.params`` (:func:`~.config.parameter_shapes`). How it runs on the core, its parameters
and its decoding: docs/maintainers.md, "Models and trainers".
"""

from __future__ import annotations

import math

import numpy as np

from transformer_lab import _validate as v
from transformer_lab import device
from transformer_lab.core import decoding as core_decoding
from transformer_lab.core import gpt as core_gpt
from transformer_lab.core import layers as core_layers
from transformer_lab.core import next_token as core_next_token
from transformer_lab.core import rope as core_rope
from transformer_lab.core import sampling as core_sampling
from transformer_lab.models import inputs
from transformer_lab.models.config import (
    GPTConfig,
    kv_cache_bytes,
    parameter_shapes,
)
from transformer_lab.models.shell import Model, ModelCache, nest


def _init_params(c: GPTConfig, seed: int) -> dict[str, np.ndarray]:
    """Deterministic initialisation from ``seed`` (the same values in float32 and float64 up to
    rounding), as GPT-2 does it in spirit: token, position and output tables normal(0, 0.02);
    linear maps uniform(+-1/sqrt(fan_in)) (``nn.Linear``, drawn by ``core.layers.init_uniform``),
    the two that write into the residual stream (``attn.W_o`` and the MLP's output) scaled by
    ``1/sqrt(2 N)`` so that the stream's variance does not grow with depth; biases 0; norm
    gains 1."""
    rng = np.random.default_rng(seed)
    residual_scale = 1 / math.sqrt(2 * c.num_layers)
    params = {}
    for name, shape in parameter_shapes(c).items():
        leaf = name.rsplit(".", 1)[-1]
        if name in ("embed.W", "pos.W", "lm_head.W"):
            value = rng.normal(0.0, 0.02, size=shape)
        elif leaf == "gamma":
            value = np.ones(shape)
        elif leaf.startswith("b"):
            value = np.zeros(shape)
        else:
            value = core_layers.init_uniform(shape[0], shape, rng)
            if leaf in ("W_o", "W2", "W_down"):
                value *= residual_scale
        params[name] = np.ascontiguousarray(value, dtype=c.dtype)
    return params


def check_ids(ids, name: str, config: GPTConfig, *, min_len: int = 1) -> np.ndarray:
    """``ids`` as a (B, T) integer array of token ids with ``min_len <= T <= max_len``."""
    return inputs.check_ids(ids, name, config.vocab_size, config.max_len, min_len, "GPTConfig")


# --------------------------------------------------------------------------------------------
# The model


class GPT(Model):
    """The decoder-only language model, as NumPy forward/backward passes: ``GPT(config, seed)``
    with a :class:`GPTConfig` (arguments and attributes: :class:`~.shell.Model`), and

    Attributes:
        pe: the fixed sinusoidal table (max_len, E) for ``positional="sinusoidal"``, else None.
    """

    kind = "gpt"
    config_class = GPTConfig

    _init_params = staticmethod(_init_params)  # the initial parameters from (config, seed)

    def _setup(self, config: GPTConfig, params: dict[str, np.ndarray]) -> None:
        super()._setup(config, params)
        self.pe = None
        if config.positional == "sinusoidal":
            self.pe = core_layers.positional_encoding(config.max_len,
                                                      config.d_model).astype(config.dtype)

    @classmethod
    def from_pretrained(cls, folder, dtype=np.float32) -> GPT:
        """A GPT holding a GPT-2 or a LLaMA-architecture checkpoint: a ``transformers`` folder
        (``~`` expanded; e.g. a snapshot folder of its cache) read by
        :func:`~.pretrained.read_pretrained`, in ``dtype`` (np.float32, or np.float64 for
        gradient checks). ``forward(ids)[0]`` are the checkpoint's logits; ``loss`` and
        ``backward`` fine-tune it; ``model.metadata["gpt2_config"]`` (or ``["llama_config"]``)
        is its config.json. A :class:`~.checkpoints.CheckpointError` names the file and what is
        wrong.
        """
        from transformer_lab.models import pretrained

        config, params, metadata = pretrained.read_pretrained(folder, dtype)
        model = cls.__new__(cls)  # no random initialisation to overwrite
        model._setup(config, {name: params[name] for name in parameter_shapes(config)})
        model.metadata = metadata
        return model

    # ---------------------------------------------------------------------------- parameters

    def nested_params(self) -> dict:
        """``self.params`` checked (names, shapes, dtype) and nested as the core takes them (the
        same arrays, no copies)."""
        return nest(self._checked_params())

    def _rope(self, start: int, stop: int):
        """RoPE's (cos, sin) tables of positions start..stop-1, made when asked: a LLaMA config's
        ``max_position_embeddings`` can be far more positions than a run reads."""
        c = self.config
        if c.positional != "rope":
            return None
        cos, sin = core_rope.rope_tables(np.arange(start, stop), c.head_dim, c.rope_base)
        return cos.astype(c.dtype), sin.astype(c.dtype)

    # ---------------------------------------------------------------------------- forward

    def forward(self, ids):
        """(logits (B, T, V), cache for :meth:`backward`) of token ids (B, T), 1 <= T <= max_len:
        ``logits[:, t]`` predicts ``ids[:, t + 1]``."""
        ids = device.put(check_ids(ids, "ids", self.config))
        logits, cache = core_gpt.gpt_forward(self.nested_params(), ids, self.config, self.pe,
                                             self._rope(0, ids.shape[1]))
        return logits, ModelCache(cache, logits.shape, logits.dtype)

    __call__ = forward

    def backward(self, dlogits, cache: ModelCache) -> dict[str, np.ndarray]:
        """The gradients of every parameter (the keys and shapes of ``model.params``) given the
        gradient of the logits (B, T, V)."""
        return self._flat(core_gpt.gpt_backward(self._checked_dlogits(dlogits, cache), cache.core))

    def loss(self, ids, compute_grads: bool = True, rng=None):
        """(loss, grads): the mean cross-entropy in nats (a Python float) of the B (T - 1)
        next-token predictions of ``ids`` (B, T), 2 <= T <= max_len, and its gradients (None
        with ``compute_grads=False``). ``rng``, a generator of the device the core runs on
        (``transformer_lab.device.generator(seed)``), trains with the config's ``dropout``;
        None: no dropout, as in evaluation."""
        compute_grads = v.boolean(compute_grads, "compute_grads")
        ids = device.put(check_ids(ids, "ids", self.config, min_len=2))
        if rng is not None and not isinstance(rng, device.xp.random.Generator):
            raise TypeError(f"rng must be None or a random generator of the device the core "
                            f"runs on, {device.name} (transformer_lab.device.generator(seed); "
                            f"on the CPU np.random.default_rng(seed)), got {type(rng).__name__}")
        rng = rng if self.config.dropout > 0 else None
        if compute_grads:
            loss, grads = core_gpt.gpt_loss(self.nested_params(), ids, self.config, self.pe,
                                            self._rope(0, ids.shape[1]), rng)
            return loss, self._flat(grads)
        logits, _ = core_gpt.gpt_forward(self.nested_params(), ids, self.config, self.pe,
                                         self._rope(0, ids.shape[1]), rng)
        return core_next_token.next_token_loss_forward(logits, ids)[0], None

    # ---------------------------------------------------------------------------- generation

    def kv_cache_bytes(self, batch: int, length: int) -> int:
        """:func:`~.config.kv_cache_bytes` of this model."""
        return kv_cache_bytes(self.config, batch, length)

    def new_kv_cache(self, batch: int, length: int) -> list:
        """One empty ``(K, V)`` pair per layer, each (batch, Hkv, length, Dh)."""
        c = self.config
        shape = (batch, c.num_kv_heads, length, c.head_dim)
        zeros = device.xp.zeros
        return [(zeros(shape, c.dtype), zeros(shape, c.dtype)) for _ in range(c.num_layers)]

    def generate(self, ids, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 use_cache: bool = True, return_logits: bool = False):
        """Continue ``ids`` by ``max_new_tokens`` tokens, one at a time.

        At each step the logits of the last position are divided by ``temperature``, filtered
        to the ``top_k`` most likely tokens and/or to the smallest set holding probability
        ``top_p``, and one token is drawn (:func:`transformer_lab.core.sampling.sample_next`);
        ``temperature=0`` is greedy decoding (the most likely token; no draw, top_k and top_p
        unused).

        Args:
            ids: the prompt, (B, T) or (T,) token ids, T >= 1, T + max_new_tokens <= max_len.
            max_new_tokens: tokens to add, >= 0.
            temperature: 0, or at least the model dtype's eps (smaller ones overflow).
            top_k: None (no filter) or an integer in 1..vocab_size.
            top_p: None (no filter) or a number in (0, 1].
            seed: of the draws (None: fresh entropy); the same seed gives the same tokens (on
                one device: :func:`transformer_lab.device.generator`).
            use_cache: keep the keys and values of past positions (True) or recompute the
                whole prefix at every step (False); the same tokens either way.
            return_logits: also return the logits each new token was drawn from.

        Returns:
            ids: int64 array of the device, the prompt followed by the new tokens,
            (B, T + max_new_tokens) (or (T + max_new_tokens,) for a 1-D prompt); with
            ``return_logits`` also the logits, (B, max_new_tokens, V) (or (max_new_tokens, V)),
            before temperature and filtering.
        """
        c = self.config
        ids = v.token_ids(ids, "ids", c.vocab_size)
        one = ids.ndim == 1
        prompt = check_ids(ids[None] if one else ids, "ids", c)
        steps = v.integer(max_new_tokens, "max_new_tokens", minimum=0)
        if prompt.shape[1] + steps > c.max_len:
            raise ValueError(f"the prompt has {prompt.shape[1]} tokens and max_new_tokens="
                             f"{steps}: {prompt.shape[1] + steps} in all exceeds "
                             f"max_len={c.max_len} (GPTConfig.max_len)")
        temperature = v.real(temperature, "temperature", minimum=0)
        if 0 < temperature < np.finfo(c.dtype).eps:
            raise ValueError(f"temperature must be 0 (greedy) or at least {c.dtype.__name__}'s "
                             f"eps {np.finfo(c.dtype).eps:.3g} (smaller ones can overflow "
                             f"logits / temperature), got {temperature!r}")
        if top_k is not None:
            top_k = v.integer(top_k, "top_k", minimum=1)
            if top_k > c.vocab_size:
                raise ValueError(f"top_k must be at most the vocabulary size {c.vocab_size}, "
                                 f"got {top_k}")
        if top_p is not None:
            top_p = v.real(top_p, "top_p")
            if not 0 < top_p <= 1:
                raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        if seed is not None:
            seed = v.integer(seed, "seed", minimum=0)
        use_cache = v.boolean(use_cache, "use_cache")
        return_logits = v.boolean(return_logits, "return_logits")

        out, logits = self._decode(prompt, steps, temperature, top_k, top_p,
                                   device.generator(seed), use_cache)
        if one:
            out, logits = out[0], logits[0]
        return (out, logits) if return_logits else out

    def _decode(self, prompt, steps, temperature, top_k, top_p, rng, use_cache):
        """The decoding loop, on checked arguments: (ids (B, T + steps), logits (B, steps, V))."""
        c, xp = self.config, device.xp
        B, T = prompt.shape
        params = self.nested_params()
        out = xp.zeros((B, T + steps), dtype=np.int64)
        out[:, :T] = device.put(prompt)
        all_logits = xp.zeros((B, steps, c.vocab_size), dtype=c.dtype)
        caches = self.new_kv_cache(B, T + steps) if use_cache else None
        length = 0
        for i in range(steps):
            end = T + i
            if use_cache:  # the prompt at once (prefill), then one new token per step
                logits, length = core_decoding.gpt_step(params, out[:, length:end], c, caches,
                                                        length, self.pe, self._rope(length, end))
            else:  # the whole prefix, every step
                logits, _ = core_gpt.gpt_forward(params, out[:, :end], c, self.pe,
                                                 self._rope(0, end))
            last = logits[:, -1]  # (B, V)
            all_logits[:, i] = last
            out[:, end] = core_sampling.sample_next(last, rng, temperature, top_k, top_p)
        return out, all_logits

    def __repr__(self) -> str:
        c = self.config
        kv = f", {c.num_kv_heads} kv heads" if c.num_kv_heads != c.num_heads else ""
        head = "" if c.tie_embeddings else ", untied head"
        tiled = (f", tiled attention (blocks of {c.attention_block_size})"
                 if c.attention_block_size is not None else "")
        return (f"GPT(d_model={c.d_model}, heads={c.num_heads}{kv}, layers={c.num_layers}, "
                f"d_ff={c.d_ff}, norm={c.norm}, mlp={c.mlp}, positions={c.positional}{tiled}, "
                f"vocab={c.vocab_size}{head}, {np.dtype(c.dtype).name}, "
                f"{self.num_parameters():,} parameters)")

