"""Test helpers for checkpoints as ``transformers`` writes them (``tests/test_pretrained.py``,
``tests/test_llama.py``): random token ids, a model's logits and greedy continuation, the
relative gap between two arrays of logits, a folder saved or written, and one torch thread.
Importing it skips the importing test module when ``transformers`` is not installed, and keeps
``transformers`` quiet (no warnings or progress bars on save and load: the output stays clean).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import numpy as safetensors_numpy

transformers = pytest.importorskip("transformers", reason="the reference checkpoints are built "
                                   "with transformers (requirements-dev.txt)")
transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny models: torch's threads only contend with each other (and with other processes)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def random_ids(vocab: int, shape, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, shape)


def torch_logits(model, ids) -> np.ndarray:
    """A ``transformers`` causal LM's logits of ``ids``, as NumPy."""
    with torch.no_grad():
        return model(torch.as_tensor(ids)).logits.numpy()


def relative(a, b) -> float:
    """The largest gap between ``a`` and ``b``, relative to the largest magnitude of ``b``."""
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def write_checkpoint(folder: Path, config: dict, tensors: dict[str, np.ndarray]) -> Path:
    """A checkpoint folder: ``config.json`` and ``model.safetensors`` (NumPy's safetensors)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    safetensors_numpy.save_file(tensors, str(folder / "model.safetensors"))
    return folder


def save_and_read(model, folder: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """Save a ``transformers`` model into ``folder`` (``save_pretrained``): its config.json as a
    dict and its tensors, as stored."""
    model.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    return config, safetensors_numpy.load_file(str(folder / "model.safetensors"))


def greedy(model, prompt: np.ndarray, steps: int) -> np.ndarray:
    """``transformers``' greedy continuation of ``prompt`` (B, T) by ``steps`` tokens."""
    with torch.no_grad():
        return model.generate(torch.as_tensor(prompt), attention_mask=torch.ones(
            prompt.shape, dtype=torch.long), max_new_tokens=steps, do_sample=False,
            pad_token_id=0).numpy()
