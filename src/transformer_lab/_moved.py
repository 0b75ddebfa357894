"""Modules that moved, still importable under their old names.

The package was laid out by role (issue 22): ``transformer_lab.transformer`` became
``transformer_lab.models.encoder_decoder`` and so on. Notebooks and scripts written before
then -- handouts already in students' hands among them -- import the old names; this module
makes each old name an alias of the new module (the same module object, so ``isinstance`` and
module state agree), without a file per old name at the top level.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys

#: old module name -> new module name.
MOVED = {
    "transformer_lab.transformer": "transformer_lab.models.encoder_decoder",
    "transformer_lab.gpt": "transformer_lab.models.gpt",
    "transformer_lab.checkpoints": "transformer_lab.models.checkpoints",
    "transformer_lab.model_inputs": "transformer_lab.models.inputs",
    "transformer_lab.torch_model": "transformer_lab.reference.torch_transformer",
    "transformer_lab.gpt_torch": "transformer_lab.reference.torch_gpt",
    "transformer_lab.interop": "transformer_lab.reference.interop",
    "transformer_lab.interop.arguments": "transformer_lab.reference.interop.arguments",
    "transformer_lab.interop.layout": "transformer_lab.reference.interop.layout",
    "transformer_lab.interop.twins": "transformer_lab.reference.interop.twins",
    "transformer_lab.data": "transformer_lab.datasets.tasks",
    "transformer_lab.corpus": "transformer_lab.datasets.corpus",
    "transformer_lab.charlm": "transformer_lab.train.charlm",
    "transformer_lab.bench": "transformer_lab.course.bench",
    "transformer_lab.figures": "transformer_lab.course.figures",
    "transformer_lab.efficient_attention": "transformer_lab.flash",
}


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module that now holds its code."""

    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        """Nothing to run: the module was executed under its new name. The import system has
        just set its ``__spec__`` to the old name's; give it back its own."""
        module.__spec__ = self._own_spec

    def get_code(self, fullname):
        """The new module's code, for ``python -m <old name>`` (runpy asks the loader)."""
        return importlib.import_module(self.target).__spec__.loader.get_code(self.target)


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the old names of :data:`MOVED`; every other name is left to the usual finders."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(MOVED[fullname]))


def moved_functions(module: str, into: tuple[str, ...]):
    """A module-level ``__getattr__`` for ``module``, a module whose functions moved into the
    sibling modules ``into``: ``module.<name>`` finds the function in the module that holds it
    now, at call time (so an edited module takes effect). Notebooks written before the move
    call ``core_gpt.rope_tables``; private and dunder names are not looked up."""
    package = module.rpartition(".")[0]

    def __getattr__(name: str):
        if not name.startswith("_"):
            for part in into:
                found = getattr(importlib.import_module(f"{package}.{part}"), name, None)
                if callable(found):
                    return found
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


def install() -> None:
    """Put the finder first on ``sys.meta_path``, once (first: a moved package's old
    submodule names must not be found again, as new copies, through the package's path)."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
