"""transformer_lab: the helper package of the course *Transformers from Scratch*.

The notebooks in ``notebooks/`` build every piece of a Transformer step by step; this
package holds the finished versions they import later on:

- :mod:`transformer_lab.gradient_check` -- numerical gradients and the checks that compare
  them with hand-written backward passes;
- :mod:`transformer_lab.notebook` -- :func:`setup_notebook`, the first call of every notebook.
"""

from transformer_lab.notebook import setup_notebook

__all__ = ["setup_notebook"]
__version__ = "0.1.0"
