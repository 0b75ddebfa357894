"""The package laid out by role (issue 22): the map in ``__init__``'s docstring, no import
cycle, one model shell and one checkpoint format."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest

import transformer_lab
from transformer_lab.datasets import SHIPPED
from transformer_lab.models import checkpoints
from transformer_lab.models.checkpoints import CheckpointError
from transformer_lab.models.config import config_to_dict
from transformer_lab.models.encoder_decoder import Transformer, TransformerConfig
from transformer_lab.models.gpt import GPT, GPTConfig
from transformer_lab.models.shell import Model

PACKAGE = Path(transformer_lab.__file__).resolve().parent


# --------------------------------------------------------------------------------------------
# The layout


def test_every_top_level_module_and_package_is_on_the_map_in_the_docstring():
    """The rule that keeps the top level small: what it holds, the map names and says why."""
    modules = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    doc = transformer_lab.__doc__
    packages = sorted(p.name for p in PACKAGE.iterdir()
                      if (p / "__init__.py").exists())
    for name in [*packages, *modules]:
        assert name.lstrip("_") in doc, f"{name} is not on the map in __init__'s docstring"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imported(path: Path, name: str, top_level_only: bool = False) -> set[str]:
    """The module names ``path`` imports, resolving relative imports:
    everywhere in the file, or only at its top level (what runs when it is imported)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    roots = [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.ClassDef))] \
        if top_level_only else [tree]
    found: set[str] = set()
    for node in (sub for root in roots for sub in ast.walk(root)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            found |= {base, *(f"{base}.{a.name}" for a in node.names)}
    return found


def _package_imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The package modules ``path`` imports anywhere: at the top, inside functions (run later,
    but still a cycle to untangle) and under ``if TYPE_CHECKING``."""
    return {t for t in _imported(path, name) if t in known and t != name}


def test_the_package_has_no_import_cycle():
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: _package_imports(path, name, set(files))
             for name, path in files.items()}
    for name, deps in graph.items():  # a package's __init__ runs before its modules
        graph[name] = {d for d in deps if not name.startswith(d + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert "transformer_lab.models.encoder_decoder" in graph  # the walk saw the models


def test_the_cycle_test_finds_a_cycle(tmp_path, monkeypatch):
    """The test above can fail: the same walk on two modules that import each other."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from transformer_lab.layers import x\n")
    b.write_text("import transformer_lab.attention\n")
    known = {"transformer_lab.layers", "transformer_lab.attention"}
    assert _package_imports(a, "transformer_lab.attention", known) == {
        "transformer_lab.layers"}
    assert _package_imports(b, "transformer_lab.layers", known) == {
        "transformer_lab.attention"}


def test_only_the_course_tools_import_the_course_tools():
    """The handout leaves ``course/`` out: nothing else may import it (at any depth)."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    for name, path in files.items():
        if name.startswith("transformer_lab.course"):
            continue
        used = {d for d in _package_imports(path, name, set(files))
                if d.startswith("transformer_lab.course")}
        assert not used, f"{name} imports {sorted(used)}, which the handout leaves out"


# --------------------------------------------------------------------------------------------
# One model shell, one checkpoint format


def _models():
    return (Transformer(TransformerConfig(7, 9, d_model=8, num_heads=2, d_ff=12, max_len=8,
                                          num_encoder_layers=1, num_decoder_layers=1), seed=1),
            GPT(GPTConfig(11, d_model=8, num_heads=2, num_layers=1, max_len=8), seed=1))


def test_both_models_share_one_shell():
    for model in _models():
        assert isinstance(model, Model)
        for method in ("astype", "copy", "set_params", "num_parameters", "save", "load",
                       "load_params"):
            assert method in Model.__dict__ and method not in type(model).__dict__, method
        twin = model.astype(np.float64)
        assert all(p.dtype == np.float64 for p in twin.params.values())
        name = next(iter(model.params))
        with pytest.raises(ValueError, match=r"new\[.*\] contains NaN"):
            model.set_params({name: np.full(model.params[name].shape, np.nan)})
        wrong = model.copy()  # an array assigned in another dtype: refused at the next call
        wrong.params[name] = wrong.params[name].astype(np.float64)
        with pytest.raises(ValueError, match=rf"model.params\['{name}'\] must be a float32"):
            wrong._checked_params()
        del wrong.params[name]
        with pytest.raises(KeyError, match="model.params is missing"):
            wrong._checked_params()


@pytest.mark.parametrize("which", [0, 1])
def test_one_format_for_both_models(tmp_path, which):
    model = _models()[which]
    other = type(_models()[1 - which])
    path = model.save(tmp_path / "m", metadata={"step": 5})
    loaded = type(model).load(path)
    assert loaded.config == model.config and loaded.metadata == {"step": 5}
    assert all(np.array_equal(loaded.params[k], model.params[k]) for k in model.params)
    with np.load(path) as f:
        header = json.loads(str(f["__header__"]))
    assert header["format"] == checkpoints.CHECKPOINT_FORMAT and header["kind"] == model.kind
    with pytest.raises(CheckpointError, match=f"holds a '{model.kind}' checkpoint"):
        other.load(path)
    wrong = model.copy()
    wrong.params[next(iter(wrong.params))][...] = 0
    assert wrong.load_params(path) == {"step": 5}
    assert all(np.array_equal(wrong.params[k], model.params[k]) for k in model.params)
    (tmp_path / "bad.npz").write_bytes(b"not a zip")  # np.load took it for a pickle
    with pytest.raises(CheckpointError, match="bad.npz is not a transformer_lab checkpoint: it "
                                              "is not a .npz archive"):
        type(model).load(tmp_path / "bad.npz")


def test_checkpoints_of_earlier_versions_still_load(tmp_path):
    # the shipped GPT (notebook 09 reads it)
    shipped = GPT.load(SHIPPED / "charlm_gpt.npz")
    assert shipped.kind == "gpt" and shipped.num_parameters() > 0
    # an encoder-decoder checkpoint as Transformer.save wrote it: no "kind", not compressed
    model = _models()[0]
    header = {"format": 1, "config": config_to_dict(model.config),
              "names": list(model.params), "metadata": {"epoch": 2}}
    with open(tmp_path / "old.npz", "wb") as f:
        np.savez(f, __header__=np.array(json.dumps(header)),
                 **{f"params/{k}": p for k, p in model.params.items()})
    loaded = Transformer.load(tmp_path / "old.npz")
    assert loaded.metadata == {"epoch": 2}
    assert all(np.array_equal(loaded.params[k], model.params[k]) for k in model.params)
    with pytest.raises(CheckpointError, match="holds a 'transformer' checkpoint"):
        GPT.load(tmp_path / "old.npz")


def test_the_checks_and_the_configs_do_not_import_the_core():
    """The grader imports the checks before the student's core, and a core module that hangs
    or fails on import must cost only its own checks: the framework, the checkpoints and the
    configs import no core module, at any depth (ACTIVATIONS is a copy of the core's names)."""
    from transformer_lab.core import layers as core_layers
    from transformer_lab.models.config import ACTIVATIONS

    assert ACTIVATIONS == tuple(core_layers.ACTIVATIONS)
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    for start in ("transformer_lab.checks.framework", "transformer_lab.models.checkpoints"):
        seen, todo = set(), [start]
        while todo:
            name = todo.pop()
            if name not in seen and name in files:
                seen.add(name)
                todo.extend(_imports_when_imported(files[name], name, set(files)))
        assert not {n for n in seen if n.startswith("transformer_lab.core.")}, (start, seen)


def _imports_when_imported(path: Path, name: str, known: set[str]) -> set[str]:
    """The package modules ``path`` imports at its top level (not inside functions), each with
    the packages above it (importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__``)."""
    found = _imported(path, name, top_level_only=True)
    parents = {".".join(t.split(".")[:i]) for t in found for i in range(2, t.count(".") + 1)}
    return {t for t in found | parents if t in known and t != name}
