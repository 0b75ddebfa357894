"""Everything PyTorch: the reference models (:mod:`.torch_transformer`, :mod:`.torch_gpt`) the
NumPy models are checked against, and :mod:`.interop` (``from_torch``: NumPy twins of
``torch.nn`` modules)."""
