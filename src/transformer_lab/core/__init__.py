"""The core of the course: the Transformer's math in plain NumPy, written by you.

Every function here is an exercise of one of the notebooks (``transformer_lab.syllabus`` says
which, and the stub of an unwritten function names it). The rest of the package runs on these
functions: the ``Transformer`` model, the ``from_torch`` twins, the optimisers and the trainer
call them, so the model that learns in notebook 10 is your own code.

Conventions, the same in every module:

- ``op_forward(inputs..., params...) -> (out, cache)``: ``cache`` holds what the backward needs.
- ``op_backward(dout, cache) -> (d_inputs..., grads)``: the gradients of the forward's array
  inputs in order, then -- when the operation has parameters -- a dict ``grads`` keyed exactly
  like them (nested like them for a layer or a model).
- Shapes are given in every docstring, ``B`` batch, ``T`` queries / target length, ``S`` keys /
  source length, ``E`` model width, ``H`` heads, ``Dh = E / H``, ``V`` vocabulary.
- No input checks: the public entry points (``transformer_lab.layers`` and friends, the model,
  the twins, the optimisers, the trainer) check their arguments once, then call the core.
"""
