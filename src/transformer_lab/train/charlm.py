"""Train the GPT as a character-level language model of NumPy's docstrings (notebook 13).

    python -m transformer_lab.train --task charlm --seed 0

or, from Python::

    from transformer_lab.train.charlm import CharLMConfig, train_charlm
    result = train_charlm(CharLMConfig(seed=0))
    result.metrics["val_bits_per_char"]
    result.model.generate(...)

What a run does and measures: docs/maintainers.md, "Models and trainers"; the commands that made
the shipped files, and what they cost and reached: docs/results.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from transformer_lab import _validate as v
from transformer_lab import device
from transformer_lab.core import layers as core_layers
from transformer_lab.datasets import SHIPPED
from transformer_lab.datasets.corpus import Corpus, load_corpus
from transformer_lab.models.gpt import GPT, GPTConfig
from transformer_lab.optim import Adam, WarmupSchedule, clip_grad_norm
from transformer_lab.train.config import (
    DTYPES,
    check_choices,
    check_outputs,
    check_run_numbers,
    config_from_args,
    count,
    run_command,
    set_field,
)
from transformer_lab.train.loop import blas_threads, run_steps
from transformer_lab.train.progress import progress_line

BLOCKS = ("classic", "modern")
TOKENIZERS = ("char", "bpe")
#: Files the notebook reads: the trained model and the record of the block comparison.
CHECKPOINT = SHIPPED / "charlm_gpt.npz"
BLOCKS_RECORD = SHIPPED / "charlm_blocks.json"
#: Dropout and weight decay against neither, on the checkpoint's run (notebook 13 §4):
#: ``--record REGULARISATION_RECORD --record-name NAME --steps 7000`` with ``--dropout``,
#: ``--weight-decay`` or both.
REGULARISATION_RECORD = SHIPPED / "charlm_regularisation.json"


#: What each field of :class:`CharLMConfig` sets (its option's --help)
OPTION_HELP = {
    "seed": "the seed of the weights, the batches and dropout's masks",
    "block": "classic: layer norm, GELU, learned positions; modern: RMSNorm, SwiGLU, RoPE, "
             "grouped-query attention",
    "d_model": "the model's width", "num_heads": "attention heads",
    "num_kv_heads": "key/value heads, dividing num_heads (None: the block's default)",
    "num_layers": "blocks",
    "d_ff": "the feed-forward network's hidden width (None: the block's default)",
    "context": "tokens per training window; also the model's max_len",
    "batch_size": "windows per step", "steps": "training steps",
    "lr": "the peak learning rate, after the warm-up", "warmup": "steps of linear warm-up",
    "final_lr": "the learning rate at the last step, at most lr (a cosine decay to it)",
    "clip": "the largest global gradient norm (0: no clipping)",
    "weight_decay": "AdamW's decay when > 0, of the matrices and tables only (biases and norm "
                    "gains are not decayed: decay_groups)",
    "dropout": "of every sublayer's output, in training (its masks from a generator of their "
               "own: the batches stay those of the run without dropout)",
    "eval_every": "steps between evaluations",
    "eval_tokens": "validation tokens each evaluation scores (the last one: all of them)",
    "threads": "BLAS threads",
    "time_budget": "seconds of training steps after which the run stops (None: no limit)",
    "dtype": "the parameters' and activations' dtype",
    "tokenizer": "char: the corpus's 98 characters; bpe: notebook 11's byte-level BPE, trained "
                 "on the training documents (--bpe-vocab-size tokens); val_bits_per_char "
                 "counts the characters either way",
    "bpe_vocab_size": "tokens of the BPE tokenizer (with --tokenizer bpe), at least 257",
    "device": device.HELP,
}


@dataclasses.dataclass(frozen=True)
class CharLMConfig:
    """Everything a character-level training run depends on (defaults: the committed
    checkpoint's run): each field is described in :data:`OPTION_HELP`, which ``python -m
    transformer_lab.train --task charlm --help`` prints. The tokens: "char", the corpus's 98
    characters, or "bpe", notebook 11's byte-level BPE trained on the training documents to
    ``bpe_vocab_size`` tokens (one of them ``<|endoftext|>``, which ends every document as the
    boundary does); ``context`` counts tokens either way, and bits per character stay
    comparable (:class:`TokenStreams`).
    """

    seed: int = 0
    block: str = "classic"
    d_model: int = 96
    num_heads: int = 4
    num_kv_heads: int | None = None
    num_layers: int = 4
    d_ff: int | None = None
    context: int = 128
    batch_size: int = 8
    steps: int = 10000
    lr: float = 3e-3
    final_lr: float = 3e-4
    warmup: int = 100
    clip: float = 1.0
    weight_decay: float = 0.0
    dropout: float = 0.0
    eval_every: int = 500
    eval_tokens: int = 16384
    threads: int = 1
    time_budget: float | None = None
    dtype: str = "float32"
    tokenizer: str = "char"
    bpe_vocab_size: int = 1024
    device: str = "cpu"

    def __post_init__(self):
        check_choices(self, block=BLOCKS, dtype=DTYPES, tokenizer=TOKENIZERS,
                      device=device.DEVICES)
        set_field(self, "bpe_vocab_size",
                  v.integer(self.bpe_vocab_size, "bpe_vocab_size", minimum=257))
        check_run_numbers(self, counts=("seed", "warmup"),
                          positive=("d_model", "num_heads", "num_layers", "batch_size", "steps",
                                    "eval_every", "threads"),
                          rates=("lr", "final_lr", "clip", "weight_decay", "dropout"))
        for name in ("context", "eval_tokens"):  # a window, a loss: two tokens at least
            set_field(self, name, v.integer(getattr(self, name), name, minimum=2))
        if not (self.lr > 0 and self.final_lr <= self.lr):
            raise ValueError(f"lr must be positive and final_lr at most lr, got lr={self.lr}, "
                             f"final_lr={self.final_lr}")
        for name in ("num_kv_heads", "d_ff"):
            if getattr(self, name) is not None:
                set_field(self, name, v.integer(getattr(self, name), name, minimum=1))
        self.model_config(vocab_size=2)  # the model's own checks (heads dividing d_model, ...)

    def model_config(self, vocab_size: int) -> GPTConfig:
        """The :class:`GPTConfig` of this run for a vocabulary of ``vocab_size`` tokens."""
        make = GPTConfig.classic if self.block == "classic" else GPTConfig.modern
        sizes = {"d_model": self.d_model, "num_heads": self.num_heads,
                 "num_layers": self.num_layers, "max_len": self.context,
                 "dropout": self.dropout, "dtype": np.dtype(self.dtype).type}
        if self.num_kv_heads is not None:
            sizes["num_kv_heads"] = self.num_kv_heads
        if self.d_ff is not None:
            sizes["d_ff"] = self.d_ff
        return make(vocab_size, **sizes)


@dataclasses.dataclass
class CharLMHistory:
    """Per step: ``loss`` (training, nats), ``lr``; per evaluation: ``val_steps``,
    ``val_bits_per_char`` (on the evaluation subset), ``val_seconds`` (elapsed at that step)."""

    loss: list = dataclasses.field(default_factory=list)
    lr: list = dataclasses.field(default_factory=list)
    val_steps: list = dataclasses.field(default_factory=list)
    val_bits_per_char: list = dataclasses.field(default_factory=list)
    val_seconds: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class CharLMResult:
    model: GPT
    history: CharLMHistory
    metrics: dict
    config: CharLMConfig
    tokenizer: object = None  # the BPETokenizer of a run with tokenizer="bpe"


def random_windows(ids: np.ndarray, batch_size: int, context: int,
                   rng: np.random.Generator) -> np.ndarray:
    """``batch_size`` windows of ``context`` consecutive tokens at random starts: (B, context)."""
    starts = rng.integers(0, ids.size - context + 1, size=batch_size)
    return ids[starts[:, None] + np.arange(context)]


def bits_per_char(model: GPT, ids: np.ndarray, stride: int | None = None,
                  batch_size: int = 64) -> float:
    """Mean ``-log2 p`` of every token of ``ids`` but the first, each predicted once, in
    windows of ``max_len`` tokens that slide by ``stride`` (default ``max_len // 2``).

    The first window scores all its predictions; every later one only its last ``stride``, so
    each of those tokens is predicted from at least ``max_len - stride`` tokens before it
    (the usual sliding-window evaluation: with ``stride = max_len - 1`` the windows merely
    touch, and the tokens at the start of each see almost no context).
    """
    ids = np.asarray(ids, dtype=np.int64)
    T = model.config.max_len
    stride = T // 2 if stride is None else v.integer(stride, "stride", minimum=1)
    if ids.size < 2:
        raise ValueError("ids must hold at least two tokens")
    if stride > T - 1:
        raise ValueError(f"stride must be at most max_len - 1 = {T - 1}, got {stride}")
    T = min(T, ids.size)
    starts = list(range(0, ids.size - T + 1, stride))
    scored = [T - 1] + [stride] * (len(starts) - 1)   # predictions each window scores, last ones
    done = starts[-1] + T - 1                          # tokens 1 .. done are predicted
    if done < ids.size - 1:                            # the tail: one more window, at the end
        starts.append(ids.size - T)
        scored.append(ids.size - 1 - done)
    starts, scored = np.array(starts), np.array(scored)
    total = 0.0
    for i in range(0, starts.size, batch_size):
        batch = ids[starts[i:i + batch_size, None] + np.arange(T)]       # (b, T)
        logits, _ = model.forward(batch)                                  # (b, T, V)
        keep = np.arange(T - 1) >= T - 1 - scored[i:i + batch_size, None]  # the last n of each
        targets = device.put(np.where(keep, batch[:, 1:], -1))  # (b, T-1); -1: scored already
        total += core_layers.cross_entropy_forward(logits[:, :-1].astype(np.float64), targets,
                                                   ignore_index=-1, reduction="sum")[0]
    return total / (ids.size - 1) / math.log(2)


@dataclasses.dataclass(frozen=True)
class TokenStreams:
    """A run's tokens: the training and validation streams (documents in name order, each ended
    by the boundary or ``<|endoftext|>``), the vocabulary size, and -- for BPE -- how many
    characters each token id holds (``token_chars``; a character split between tokens counts
    in the token that holds its first byte, the end of a document counts one, as the boundary
    does). Bits per character are the bits of the tokens predicted divided by the characters
    they hold: comparable across tokenizers on the same validation text."""

    vocab_size: int
    train_ids: np.ndarray
    val_ids: np.ndarray
    token_chars: np.ndarray | None = None  # None: one character per token
    tokenizer: object = None

    def chars(self, ids: np.ndarray) -> int:
        """The characters held by the tokens of ``ids`` that are predicted (all but the first)."""
        if self.token_chars is None:
            return ids.size - 1
        return int(self.token_chars[ids[1:]].sum())


def token_streams(c: CharLMConfig, corpus: Corpus) -> TokenStreams:
    """The corpus's character streams, or (``c.tokenizer == "bpe"``) a BPE tokenizer trained on
    the training documents and both splits encoded with it."""
    if c.tokenizer == "char":
        return TokenStreams(corpus.vocab_size, corpus.train_ids, corpus.val_ids)
    from transformer_lab.core import bpe as core_bpe
    from transformer_lab.tokenizer import BPETokenizer

    eot = "<|endoftext|>"
    docs = {split: [t for t, val in zip(corpus.texts, corpus.is_val, strict=True)
                    if val == split] for split in (False, True)}
    tok = BPETokenizer.train(eot.join(docs[False]), c.bpe_vocab_size, special_tokens=(eot,))
    lead = [sum((b & 0xC0) != 0x80 for b in token) for token in core_bpe.token_bytes(tok.merges)]
    streams = [np.array(tok.encode("".join(d + eot for d in docs[split])), dtype=np.int64)
               for split in (False, True)]
    return TokenStreams(tok.vocab_size, *streams, np.array(lead + [1], dtype=np.int64), tok)


def train_charlm(config: CharLMConfig | None = None, corpus: Corpus | None = None,
                 progress: Callable[[dict], None] | None = None, **overrides) -> CharLMResult:
    """Train a GPT on the corpus (what a run does: docs/maintainers.md, "Models and trainers").

    Args:
        config: the run (default ``CharLMConfig()``), with ``overrides`` as fields.
        corpus: default :func:`load_corpus`.
        progress: called with a dict after every evaluation and at the end (``step``,
            ``steps``, ``loss``, ``lr``, ``val_bits_per_char``, ``seconds``).

    Returns:
        the model, its history, the metrics (``--help`` describes them).
    """
    start = time.perf_counter()
    config = dataclasses.replace(config or CharLMConfig(), **overrides)
    corpus = corpus or load_corpus()
    with blas_threads(config.threads), device.on(config.device):
        result = _train(config, corpus, progress)
    result.metrics["seconds"] = time.perf_counter() - start
    return result


def decay_groups(params: dict[str, np.ndarray]) -> tuple[dict, dict]:
    """The usual groups of AdamW (GPT-2's, nanoGPT's): the parameters weight decay shrinks --
    the matrices of the linear maps and the embedding tables, 2 axes -- and those it leaves
    alone -- biases and norm gains, 1 axis, which set scales and offsets rather than store
    what was learnt."""
    decayed = {name: p for name, p in params.items() if p.ndim >= 2}
    return decayed, {name: p for name, p in params.items() if p.ndim < 2}


def _train(c: CharLMConfig, corpus: Corpus, progress) -> CharLMResult:
    data = token_streams(c, corpus)

    def bits_per_char_of(ids) -> tuple[float, float]:  # (per character, per token)
        per_token = bits_per_char(model, ids)
        return per_token * (ids.size - 1) / data.chars(ids), per_token

    model = GPT(c.model_config(data.vocab_size), seed=c.seed)
    rng = np.random.default_rng(c.seed)
    drop_rng = device.generator([c.seed, 1])  # dropout's masks: the batches stay the same
    schedule = WarmupSchedule(c.lr, c.warmup, c.steps, final_lr=c.final_lr)
    decayed, kept = decay_groups(model.params)
    optimizers = [Adam(decayed, lr=c.lr, weight_decay=c.weight_decay, decoupled=True),
                  Adam(kept, lr=c.lr, decoupled=True)]
    history = CharLMHistory()
    val_subset = data.val_ids[:c.eval_tokens]
    train_ids = data.train_ids

    def take_step(i):
        batch = random_windows(train_ids, c.batch_size, c.context, rng)
        loss, grads = model.loss(batch, rng=drop_rng)
        if c.clip:
            clip_grad_norm(grads, c.clip)
        history.lr.append(schedule(i))
        for opt in optimizers:
            opt.lr = history.lr[-1]
            opt.step({name: grads[name] for name in opt.params})
        history.loss.append(loss)
        return loss

    def evaluate(n, loss, seconds):
        bpc = bits_per_char_of(val_subset)[0]
        history.val_steps.append(n)
        history.val_bits_per_char.append(bpc)
        history.val_seconds.append(seconds)
        if progress is not None:
            progress({"step": n, "steps": c.steps, "loss": loss, "lr": history.lr[-1],
                      "val_bits_per_char": bpc, "seconds": seconds})

    stopped, step_seconds, cpu = run_steps(c.steps, take_step, evaluate, c.eval_every,
                                           c.time_budget)
    steps, elapsed = len(history.loss), sum(step_seconds)
    tokens = steps * c.batch_size * c.context
    val_bpc, val_bpt = bits_per_char_of(data.val_ids)
    metrics = {
        "task": "charlm", "block": c.block, "seed": c.seed, "steps": steps, "stopped": stopped,
        "val_bits_per_char": val_bpc,
        "train_bits_per_char": bits_per_char_of(train_ids[:data.val_ids.size])[0],
        "tokenizer": c.tokenizer, "vocab_size": data.vocab_size,
        "val_bits_per_token": val_bpt,  # its perplexity None: too large for a float
        "val_perplexity_per_token": 2.0 ** val_bpt if val_bpt < 1024 else None,
        "val_chars_per_token": data.chars(data.val_ids) / (data.val_ids.size - 1),
        "seconds": None,  # the whole run, set by train_charlm
        "train_seconds": elapsed, "cpu_seconds": cpu,
        "tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0,
        "tokens": tokens, "parameters": model.num_parameters(), "threads": c.threads,
        "device": c.device, "final_loss": history.loss[-1],
    }
    return CharLMResult(model, history, metrics, c, data.tokenizer)


# --------------------------------------------------------------------------------------------
# Command line: python -m transformer_lab.train --task charlm ...


def _parser():
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m transformer_lab.train --task charlm",
        description="Train the GPT of notebook 13 on the characters of NumPy's docstrings. "
                    "Progress goes to stderr; stdout gets exactly one JSON line of metrics: "
                    "val_bits_per_char (whole validation stream), train_bits_per_char (as "
                    "many training tokens), seconds (wall-clock, the whole run), "
                    "train_seconds and cpu_seconds (wall-clock and CPU time of the training "
                    "steps), tokens_per_s (per second of training step), steps, stopped "
                    "('steps' or 'time'), parameters, block, seed, threads, device, task, tokens "
                    "(trained on), final_loss (the last step's, nats); tokenizer, vocab_size, "
                    "val_bits_per_token, val_perplexity_per_token, val_chars_per_token (per "
                    "token of the tokenizer: a character, or a BPE token); checkpoint (with "
                    "--checkpoint, the path saved).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--task", choices=["charlm"], default="charlm")
    choices = {"block": BLOCKS, "dtype": DTYPES, "tokenizer": TOKENIZERS,
               "device": device.DEVICES}
    for f in dataclasses.fields(CharLMConfig):  # in the fields' order
        kind = {"choices": choices[f.name]} if f.name in choices else {
            "type": float if "float" in f.type else int}
        p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=f.default,
                       help=OPTION_HELP[f.name], **kind)
    p.add_argument("--checkpoint", help="save the trained model (.npz) here, with its history "
                                        "(with --tokenizer bpe, its tokenizer beside it: "
                                        "<name>-tokenizer/vocab.json and merges.txt)")
    p.add_argument("--record", help="add this run's metrics and history to a JSON file, under "
                                    "the name of its block (the notebook's block comparison) "
                                    "or --record-name")
    p.add_argument("--record-name", help="the name of this run in the --record file (None: "
                                         "its block)")
    p.add_argument("--samples", type=count, default=1,
                   help="samples printed to stderr at the end, up to 200 characters each: "
                        "the first greedy, the others at temperature 0.8")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def _history(h: CharLMHistory) -> dict:
    return {"loss": [round(x, 5) for x in h.loss], "lr": [float(f"{x:.4g}") for x in h.lr],
            "val_steps": h.val_steps, "val_bits_per_char": h.val_bits_per_char,
            "val_seconds": [round(x, 2) for x in h.val_seconds]}


def main(argv=None) -> int:
    start = time.perf_counter()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(argv)
    config = config_from_args(parser, args, CharLMConfig)
    check_outputs(parser, checkpoint=args.checkpoint, record=args.record)
    log = sys.stderr

    def progress(d):
        if not args.quiet:
            print(progress_line(d["step"], d["steps"], d["loss"], d["lr"], d["seconds"],
                                f"val {d['val_bits_per_char']:.4f} bits/char"),
                  file=log, flush=True)

    corpus = load_corpus()
    if not args.quiet:
        print(f"charlm: NumPy {corpus.numpy_version} docstrings, {corpus.train_ids.size:,} "
              f"training and {corpus.val_ids.size:,} validation tokens, vocabulary "
              f"{corpus.vocab_size}; {config.block} block, d_model {config.d_model}, "
              f"{config.num_layers} layers, context {config.context}, batch "
              f"{config.batch_size}, {config.steps} steps, {config.threads} thread(s), device "
              f"{config.device}", file=log, flush=True)
        if config.tokenizer == "bpe":
            print(f"tokenizer: byte-level BPE of {config.bpe_vocab_size} tokens, trained on the "
                  "training documents; context and batch count BPE tokens", file=log, flush=True)
    result = train_charlm(config, corpus, progress)
    metrics = result.metrics
    tok = result.tokenizer
    metrics["seconds"] = time.perf_counter() - start  # the whole run, reading the corpus too
    record = {"command": run_command(argv), "metrics": metrics,
              "config": dataclasses.asdict(config), "history": _history(result.history),
              "corpus": corpus.stats()}
    saved = None
    if args.checkpoint:
        saved = result.model.save(args.checkpoint, metadata=record)
        if tok is not None:  # its tokenizer beside it: GPT-2's vocab.json and merges.txt
            tok.save(str(Path(args.checkpoint).with_suffix("")) + "-tokenizer")
    if args.record:
        path = Path(args.record).expanduser()
        runs = json.loads(path.read_text()) if path.exists() else {}
        runs[args.record_name or config.block] = record
        path.write_text("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(r)}"
                                             for k, r in runs.items()) + "\n}\n")
    if saved:  # as the other tasks' lines have it (not in the record: the run's own)
        metrics["checkpoint"] = saved
    prompt = corpus.encode("Return ") if tok is None else np.array(tok.encode("Return "))
    prompt = prompt[-(config.context // 2):]  # its end, in a short context: room to generate
    length = min(200, config.context - prompt.size)
    try:  # after the run is saved: sampling needs notebook 14's functions too
        for i in range(args.samples):  # the first greedy
            temperature = 0.8 if i else 0
            out = device.to_host(result.model.generate(prompt, length, temperature, seed=i))
            text = corpus.decode(out) if tok is None else tok.decode(np.ravel(out).tolist())
            print(f"--- sample {i} ---\n{text}", file=log, flush=True)
    except NotImplementedError as e:  # a stub of the handout's
        print(f"--- no samples: {e}", file=log, flush=True)
    print(json.dumps(metrics), file=sys.stdout, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
