"""requirements.txt (what a student runs) and requirements-dev.txt (what maintainers add: the
tests, the site builder) install from any folder and pin one version of each package for every
Python the course supports (3.10-3.13); every import of what a student runs is installed by
requirements.txt; the package's metadata agrees."""

import ast
import inspect
import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
FILES = ["requirements.txt", "requirements-dev.txt"]
#: The site builder's modules (`make site`): the only code whose imports may need
#: requirements-dev.txt.
SITE_BUILDER = {"transformer_lab/course/site.py", "transformer_lab/course/sphinx_attachments.py"}


def requirement_lines(name: str = "requirements.txt") -> list[str]:
    lines = []
    for line in (ROOT / name).read_text().splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def pins(name: str, python: str = "3.11") -> dict[str, list[str]]:
    """package -> its pins in file ``name`` on ``python``."""
    found: dict[str, list[str]] = {}
    for line in requirement_lines(name):
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"python_version": python,
                                                      "python_full_version": python + ".0"}):
            found.setdefault(canonicalize_name(req.name), []).append(str(req.specifier))
    return found


@pytest.mark.parametrize("name", FILES)
def test_requirements_name_no_path_so_they_install_from_any_folder(name):
    """pip resolves a path in a requirements file (`-e .`, `./x`, `-r other.txt`) against the
    current folder, not the file's: the file may hold only pinned names."""
    for line in requirement_lines(name):
        assert not line.startswith(("-", ".", "/", "file:")) and "@" not in line, \
            f"{name}: {line!r} depends on the folder pip runs in"
        Requirement(line)  # valid PEP 508


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("python", PYTHONS)
def test_exactly_one_pin_per_package_on_each_python(python, name):
    found = pins(name, python)
    for package, specs in found.items():
        assert all(re.fullmatch(r"==\d+(\.\d+)*", s) for s in specs), f"{package}: not a pin"
    assert all(len(p) == 1 for p in found.values()), \
        {n: p for n, p in found.items() if len(p) > 1}


def test_every_file_that_names_the_torch_pin_names_the_requirements_one():
    """The pin lives in requirements.txt; the commands and texts that repeat it (README, docs,
    the [torch] extra, the handout's README) must follow it when it moves."""
    (pin,) = pins("requirements.txt", PYTHONS[0])["torch"]
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True,
                           text=True, check=True).stdout.split("\0") \
        if (ROOT / ".git").exists() else []
    named = {}
    for name in files:
        text_file = Path(name).suffix in (".md", ".txt", ".toml", ".py", ".ipynb", ".cfg") or \
            name in ("Makefile", ".ci/run")
        if text_file and (ROOT / name).is_file():
            for found in re.findall(r"torch(==[\w.+]+)", (ROOT / name).read_text("utf-8")):
                named.setdefault(found.rstrip("."), []).append(name)
    assert set(named) <= {pin}, {spec: where for spec, where in named.items() if spec != pin}


@pytest.mark.parametrize("python", PYTHONS)
def test_the_student_file_holds_what_a_student_runs_and_the_dev_file_the_rest(python):
    student, dev = set(pins("requirements.txt", python)), set(pins("requirements-dev.txt", python))
    assert pins("requirements.txt", python)["torch"] == ["==2.13.0"]  # another spec pulls CUDA
    assert {"numpy", "scipy", "torch", "matplotlib", "threadpoolctl", "jupyterlab",
            "ipykernel"} <= student
    assert {"pytest", "nbval", "pytest-xdist", "sphinx", "myst-nb", "sphinx-book-theme",
            "sphinx-mathjax-offline"} <= dev
    assert not student & dev, "a package is pinned in both files"
    assert not {n for n in student if n.startswith(("sphinx", "myst", "pytest", "nbval"))}


@pytest.mark.parametrize("name", FILES)
def test_markers_only_split_at_python_3_11(name):
    for line in requirement_lines(name):
        if ";" in line:
            assert str(Marker(line.split(";", 1)[1])) in ('python_version >= "3.11"',
                                                          'python_version < "3.11"'), line


def test_make_installs_both_files_and_make_learn_the_students_alone():
    """`make` and `make test` on a fresh clone get the tests and the site builder (and reinstall
    when either file changes); `make learn` and `make lab` need requirements.txt only."""
    makefile = (ROOT / "Makefile").read_text()
    rules = {m["target"]: (m["deps"].split(), m["recipe"]) for m in re.finditer(
        r"^(?P<target>\$\(\w+\)|[a-z-]+):(?P<deps>[^#\n]*)(?:#[^\n]*)?\n(?P<recipe>(?:\t.*\n)*)",
        makefile, flags=re.M)}
    deps, recipe = rules["$(STAMP)"]
    assert {"requirements.txt", "requirements-dev.txt", "pyproject.toml"} <= set(deps)
    assert "-r requirements.txt -r requirements-dev.txt -e ." in recipe
    deps, recipe = rules["$(STUDENT_STAMP)"]
    assert {"requirements.txt", "pyproject.toml"} <= set(deps)
    assert "-r requirements.txt -e ." in recipe and "requirements-dev" not in recipe
    for target in ("learn", "lab"):
        assert rules[target][0] == ["$(STUDENT_STAMP)"], target
    for target in ("all", "test", "test-package", "test-notebooks", "site"):
        needs = rules[target][0]
        assert "$(STAMP)" in needs or {"notebooks", "test-package"} & set(needs), target


def test_binder_installs_what_a_student_runs_with_torchs_cpu_build():
    lines = requirement_lines("binder/requirements.txt")
    assert "-r ../requirements.txt" in lines and not any("dev" in line for line in lines)
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines


# --- every import of what a student runs is installed by requirements.txt ----------------------

def _third_party_imports(source: str) -> set[str]:
    """The top-level modules ``source`` imports (at any depth: lazy imports too), but the
    standard library's and the course's own."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m != "transformer_lab"}


def _closure(roots: set[str]) -> set[str]:
    """The installed distributions ``roots`` pull in (themselves too), extras left out."""
    seen, todo = set(), list(roots)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        for line in metadata.requires(name) or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _providers() -> dict[str, set[str]]:
    """top-level module -> the distributions that install it: from their top_level.txt, or
    else from the files they installed (Python 3.10's packages_distributions reads only
    top_level.txt, which NumPy's wheels, among others, do not have)."""
    found: dict[str, set[str]] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue
        tops = (dist.read_text("top_level.txt") or "").split() or \
            {_top_level(path) for path in dist.files or ()}
        for module in tops:
            if module and "." not in module:
                found.setdefault(module, set()).add(canonicalize_name(name))
    return found


def _top_level(path) -> str | None:
    """The importable top-level name an installed file gives ('numpy' for numpy/linalg.py,
    'six' for six.py), None for other files (metadata, scripts' folders, caches)."""
    parts = path.parts
    if len(parts) > 1:
        return None if parts[0].endswith((".dist-info", ".egg-info", ".data")) or \
            parts[0] in ("..", "__pycache__") else parts[0]
    return inspect.getmodulename(parts[0]) if parts else None


def _student_code() -> dict[str, str]:
    """What a student (or the autograder, or `make learn`) runs: every module of the package
    but the site builder's, and the notebooks' code cells."""
    code = {str(p.relative_to(ROOT / "src")): p.read_text()
            for p in sorted((ROOT / "src" / "transformer_lab").rglob("*.py"))}
    code = {name: text for name, text in code.items() if name not in SITE_BUILDER}
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        source = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        # IPython's magics and shell lines are not Python
        code[nb.name] = "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                                  for line in source.splitlines())
    return code


def test_every_import_of_what_a_student_runs_is_installed_by_requirements_txt():
    """An import of a package only requirements-dev.txt installs (the tests, the site builder)
    would break the handout, `make learn` and Gradescope's autograder, which install
    requirements.txt alone."""
    missing = _not_installed(_closure(set(pins("requirements.txt"))))
    assert not missing, f"imported by what a student runs, not installed by requirements.txt " \
                        f"(move the pin from requirements-dev.txt): {missing}"


def _not_installed(installed: set[str]) -> dict[str, list[str]]:
    """The modules what a student runs imports that none of the distributions ``installed``
    provides, each with the files that import it."""
    providers = _providers()
    missing: dict[str, list[str]] = {}
    for name, source in _student_code().items():
        for module in _third_party_imports(source):
            if not providers.get(module, set()) & installed:
                missing.setdefault(module, []).append(name)
    return missing


def test_the_site_builder_imports_what_requirements_dev_txt_installs():
    installed = _closure(set(pins("requirements.txt")) | set(pins("requirements-dev.txt")))
    providers = _providers()
    for name in sorted(SITE_BUILDER):
        for module in _third_party_imports((ROOT / "src" / name).read_text()):
            assert providers.get(module, set()) & installed, (name, module)
    assert "sphinx" not in _closure(set(pins("requirements.txt")))


def test_package_metadata_agrees():
    pyproject = (ROOT / "pyproject.toml").read_text()  # (tomllib is 3.11+)
    assert re.findall(r'^requires-python = "(.*)"$', pyproject, flags=re.M) == [">=3.10"]
    readme = (ROOT / "README.md").read_text()
    assert "Python 3.10, 3.11, 3.12 or 3.13" in readme
    assert "3.10 or newer" not in readme and "OWNER/REPO" not in readme


# --- `pip install -e .` alone (Colab: its own NumPy and PyTorch) ----------------------------

def _declared() -> dict[str, Requirement]:
    """The package's dependencies in pyproject.toml: what `pip install -e .` installs."""
    pyproject = (ROOT / "pyproject.toml").read_text()  # (tomllib is 3.11+)
    listed = re.search(r"^dependencies = \[(.*?)\]", pyproject, flags=re.M | re.S)[1]
    return {canonicalize_name(r.name): r for r in map(Requirement, re.findall(r'"([^"]+)"',
                                                                              listed))}


@pytest.mark.parametrize("python", PYTHONS)
def test_the_packages_floors_admit_the_pins(python):
    """Each dependency's floor admits the release requirements.txt pins (the floors are the
    oldest releases that ran every notebook: pyproject.toml's comment)."""
    pinned = pins("requirements.txt", python)
    for name, req in _declared().items():
        assert name in pinned, f"{name}: declared by the package, not pinned"
        assert req.specifier.contains(pinned[name][0].removeprefix("==")), (name, python)


def test_pip_install_e_alone_installs_what_a_notebook_imports():
    """On Colab the first cell says `%pip install -e <course>`: the package's dependencies, with
    Colab's own PyTorch (the [torch] extra) and Jupyter. Notebook 12 once imported sacrebleu and
    num2words, which only requirements.txt named."""
    missing = _not_installed(_closure(set(_declared()) | {"torch", "ipykernel"}))
    assert not missing, f"imported by what a student runs, not installed by `pip install -e .` " \
                        f"(add it to pyproject.toml's dependencies): {missing}"
