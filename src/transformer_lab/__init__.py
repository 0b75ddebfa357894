"""transformer_lab: the helper package of the course *Transformers from Scratch*.

The notebooks in ``notebooks/`` derive every piece of a Transformer; the student writes it into
the core, and the rest of the package builds on the core. Laid out by role:

- :mod:`~transformer_lab.core` -- **what the student writes**: plain NumPy functions in the
  notebooks' notation, ``op_forward(...) -> (out, cache)`` and ``op_backward(dout, cache)``,
  no input checks (like ``torch.nn.functional``);
- **the boundary**, beside it (like ``torch.nn``): :mod:`.layers`, :mod:`.attention`,
  :mod:`.blocks`, :mod:`.flash`, :mod:`.optim` check their arguments once (with
  :mod:`._validate`) and call the core; :mod:`.tokenizer` is GPT-2's byte-level BPE
  (``BPETokenizer``: train, encode, decode, GPT-2's ``vocab.json``/``merges.txt``) on the core's;
- :mod:`~transformer_lab.models` -- the encoder-decoder and the GPT, their configurations,
  input checks, shared parameter handling and one checkpoint format; GPT-2's and
  LLaMA-architecture checkpoints (``transformers``' ``config.json`` + ``model.safetensors``)
  read into the GPT (``models.pretrained``, ``models.llama``, ``GPT.from_pretrained``); they
  compute with the core and nothing else;
- :mod:`.device` -- where the core runs: NumPy on the CPU, or CuPy on an NVIDIA GPU
  (``device.use("cuda")``, the trainers' ``--device cuda``), the core's ``np`` bound in one
  place; the models, optimisers and trainers follow it;
- :mod:`~transformer_lab.reference` -- everything PyTorch: the reference models and
  ``from_torch`` twins;
- :mod:`~transformer_lab.datasets` -- the toy tasks, the text corpus, the translation data
  (English number expressions in French or German), the shipped files;
- :mod:`~transformer_lab.train` -- the training loops and the trainer's command line
  (``python -m transformer_lab.train --task ...``; ``--task translate-fr`` trains notebook 12's
  translator);
- :mod:`~transformer_lab.checks` -- the exercise checks (``check("check-...")``);
- **notebook helpers**: :func:`setup_notebook` (:mod:`.notebook`), :mod:`.gradient_check`
  (numerical gradients), :mod:`.tools` (timing, comparisons), :mod:`.plot`;
  :mod:`.syllabus` says which notebook teaches which core function (read from the core's
  solution markers; a handout or an autograder carries it, with the course version's commit it
  was built from, in :mod:`._built`, which the course's tools write);
- :mod:`~transformer_lab.course` -- the instructors' and maintainers' tools: notebook
  execution, site, handout, grading, benchmarks, figures (left out of the handout).
"""

from transformer_lab.notebook import setup_notebook

__all__ = ["setup_notebook"]
#: The course version (its one source: pyproject.toml reads it here); a handout and an
#: autograder record it with the commit they were built from (transformer_lab.course.versions).
__version__ = "0.2.0"
