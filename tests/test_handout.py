"""The handout's package (`make student`): the reference implementation never ships.

- every core function of the handout is a stub raising NotImplementedError with its syllabus
  message, its signature, docstring and the lines outside its solution region kept;
- no marker words, hidden cases, caches, tests or course tools are in the handout; stored public
  answers are there exactly for the checks whose reference was hidden;
- the handout's package imports, a core check fails there with the stub's message, a variant
  check runs on the stored answers;
- the handout records its course version (package and every notebook) and carries the syllabus
  read from the solution core's markers, which its stubs no longer hold;
- markers in the package get the notebooks' strict parsing: every problem with file and line;
- setup_notebook() turns on autoreload for the core in IPython (tests/test_learn.py runs it in a
  kernel).
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from course_helpers import once_per_session, write
from handout_tools import build_handout, handout_env

import transformer_lab
from transformer_lab import syllabus
from transformer_lab.checks import framework as F
from transformer_lab.course import package as P
from transformer_lab.course import student, versions
from transformer_lab.course.assignment import has_marker_words, parse_notebook

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "transformer_lab"


@pytest.fixture(scope="module")
def handout(tmp_path_factory):
    return once_per_session(tmp_path_factory, "handout-package",
                            lambda out: build_handout(out / "student")) / "student"


def _functions(path: Path) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in ast.parse(path.read_text()).body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_core_function_in_the_handout_is_a_stub(handout):
    instructor = P.parse_package(PACKAGE)
    seen = set()
    for path in sorted((handout / "src/transformer_lab/core").glob("*.py")):
        if path.name == "__init__.py":
            continue
        module = instructor.core[path.stem]
        for name, node in _functions(path).items():
            seen.add(name)
            assert P.stub_of(node) == syllabus.stub_message(name), f"{path.name}: {name}"
            original = _functions(module.path)[name]
            assert ast.unparse(node.args) == ast.unparse(original.args), name  # signature
            assert ast.get_docstring(node) == ast.get_docstring(original), name
            # every line outside the solution region is kept, and none inside it
            lines = module.source.split("\n")
            fn = module.functions[name]
            outside = [line for k, line in enumerate(lines[fn.start:fn.end + 1], fn.start)
                       if not fn.region.begin <= k <= fn.region.end]
            stubbed = path.read_text().split("\n")
            inside = {line.strip() for line in lines[fn.region.begin:fn.region.end + 1]
                      if line.strip()} - {line.strip() for line in outside}
            assert all(line in stubbed for line in outside), name
            text = ast.get_source_segment(path.read_text(), node)
            assert not [line for line in inside if line in text.split("\n")
                        or line in {t.strip() for t in text.split("\n")}], name
    assert seen == {n for functions in syllabus.TAUGHT_IN.values() for n in functions}


def test_no_markers_hidden_cases_caches_tests_or_tools_in_the_handout(handout):
    files = [p for p in handout.rglob("*") if p.is_file()]
    for path in files:
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        assert not any(has_marker_words(line) for line in text.split("\n")), path
    assert not [p for p in handout.rglob("*") if p.name == "__pycache__"
                or p.suffix in (".pyc", ".pyo") or p.name.endswith(".egg-info")]
    for absent in ("tests", "conftest.py", "Makefile", ".ci", "src/transformer_lab/course"):
        assert not (handout / absent).exists(), absent
    # the hidden cases' names and the hidden references are gone from the check modules
    registry = F.load_checks()
    checks = (handout / "src/transformer_lab/checks")
    text = "\n".join(p.read_text() for p in checks.glob("nb*.py"))
    assert "def hidden_cases" not in text
    for check_id, cls in registry.items():
        public = {c.name for c in F.all_cases(cls(), hidden=False)}
        hidden = {c.name for c in cls().hidden_cases(F.case_rng(check_id))} - public
        for name in hidden:
            assert repr(name) not in text and f'"{name}"' not in text, (check_id, name)


def test_stored_answers_for_exactly_the_checks_whose_reference_is_hidden(handout):
    instructor = P.parse_package(PACKAGE)
    hidden = {i for m in instructor.checks.values() for i in m.hidden_references}
    assert "check-cosine-attention" in hidden and "check-softmax-forward" not in hidden
    stored = {p.stem for p in (handout / "src/transformer_lab/checks/data").glob("*.npz")}
    assert stored == hidden
    for check_id in hidden:  # the public cases only, with the notebook's inputs
        values = F.load_values(handout / f"src/transformer_lab/checks/data/{check_id}.npz")
        public = [c.name for c in F.all_cases(F.get_check(check_id), hidden=False)]
        assert list(values) == public


HANDOUT_SCRIPT = r'''
import numpy as np
import transformer_lab
from transformer_lab.checks import CheckFailed, check
from transformer_lab.checks import framework as F
print("package:", transformer_lab.__file__)
try:
    check("check-softmax-forward")
except CheckFailed as err:
    print("core check:", err)
try:
    from transformer_lab.core import layers
    layers.softmax_forward(np.zeros(3))
except NotImplementedError as err:
    print("stub:", err)
def cosine_attention(q, k, v, tau=0.1):
    qn = q / np.linalg.norm(q, axis=-1, keepdims=True)
    kn = k / np.linalg.norm(k, axis=-1, keepdims=True)
    s = qn @ np.swapaxes(kn, -1, -2) / tau
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return w @ v, w
check("check-cosine-attention", cosine_attention)
print("reference here:", F.get_check("check-cosine-attention").has_reference())
try:
    check("check-cosine-attention", lambda q, k, v, tau=0.1: cosine_attention(q, k, v, 1.0))
except CheckFailed as err:
    print("wrong answer:", str(err).splitlines()[1][:60])
'''


def test_the_handout_package_imports_and_its_checks_run(handout, tmp_path):
    result = subprocess.run([sys.executable, "-c", HANDOUT_SCRIPT], cwd=tmp_path,
                            env=handout_env(handout), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    package = (handout / "src" / "transformer_lab" / "__init__.py").resolve()
    assert f"package: {package}" in out
    message = syllabus.stub_message("softmax_forward")
    assert f"core check: check-softmax-forward: {message}" in out
    assert f"stub: {message}" in out
    public = len(F.all_cases(F.get_check("check-cosine-attention"), hidden=False))
    assert f"check-cosine-attention passed ({public} cases)." in out
    assert "reference here: False" in out  # the stored answers stood in
    assert "wrong answer: case 'B = 2, T = 3, S = 5, tau = 0.5': output['out']" in out


# --- the course version and the syllabus the handout carries -------------------------------------

def test_the_handout_records_its_course_version_in_its_package_and_every_notebook(handout):
    ours = versions.project_version(ROOT)
    assert ours.version == transformer_lab.__version__
    assert ours.commit == versions.git_commit(ROOT)  # "unknown" outside a git checkout
    assert versions.project_version(handout) == ours  # __version__ and _built.COMMIT
    notebooks = sorted((handout / "notebooks").glob("*.ipynb"))
    assert len(notebooks) == len(list((ROOT / "notebooks").glob("*.ipynb")))
    for path in notebooks:  # with the fingerprint of the checks that grade it
        solution = parse_notebook(nbformat.read(ROOT / "notebooks" / path.name, as_version=4),
                                  path.name)
        want = ours.of_notebook(ROOT / "src" / "transformer_lab", solution)
        recorded = nbformat.read(path, as_version=4).metadata[versions.METADATA_KEY]
        assert recorded == {"version": ours.version, "commit": ours.commit,
                            "checks": want.checks}, path.name
        assert versions.notebook_version(path, 10**8) == want
    for path in (ROOT / "notebooks").glob("*.ipynb"):  # the solutions stay as they are
        assert versions.METADATA_KEY not in nbformat.read(path, as_version=4).metadata


def test_the_commit_says_when_the_package_or_the_notebooks_changed_since(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "module.py").write_text("x = 1\n")
    (tmp_path / "notes.txt").write_text("a\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    commit = versions.git_commit(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{7}", commit)
    (tmp_path / "notes.txt").write_text("b\n")  # outside the package and the notebooks
    assert versions.git_commit(tmp_path) == commit
    (tmp_path / "src" / "module.py").write_text("x = 2\n")
    assert versions.git_commit(tmp_path) == commit + "+changes"
    git("checkout", "--", "src")
    (tmp_path / "src" / "new.py").write_text("")  # a new module: part of the build
    assert versions.git_commit(tmp_path) == commit + "+changes"


SYLLABUS_SCRIPT = ("import json\nfrom transformer_lab import syllabus\n"
                   "print(json.dumps([syllabus.__file__, syllabus.TAUGHT_IN, syllabus.CALLS]))")


def test_the_handout_s_syllabus_is_the_one_read_from_the_solution_core(handout, tmp_path):
    result = subprocess.run([sys.executable, "-c", SYLLABUS_SCRIPT], cwd=tmp_path,
                            env=handout_env(handout), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    where, taught_in, calls = json.loads(result.stdout)
    assert Path(where).is_relative_to(handout.resolve())
    assert taught_in == json.loads(json.dumps(syllabus.TAUGHT_IN))  # order included
    assert calls == json.loads(json.dumps(syllabus.CALLS))
    # the handout's stubbed core holds neither: without the record, nothing would be read
    assert syllabus.read_core(handout / "src" / "transformer_lab") == ({}, {})


@pytest.mark.parametrize("text, places", [
    ("05 §3", [(5, 3)]), (" 00 §6, 03 §3", [(0, 6), (3, 3)]), ("14 §2, §3", [(14, 2), (14, 3)]),
    ("", None), ("§3", None), ("5 §3", None), ("03 §3, 00 §6", None), ("03 §3, §3", None),
    (": write it", None)])
def test_the_places_on_a_solution_marker(text, places):
    if places is None:
        with pytest.raises(ValueError, match="expected the notebook number|teaching order"):
            syllabus.parse_places(text)
    else:
        assert syllabus.parse_places(text) == places


def test_every_place_on_a_solution_marker_is_a_section_of_its_notebook():
    """The stub tells the student 'notebook NN_topic, section S, shows how': S must be one of
    the notebook's numbered sections (## S. ...)."""
    sections = {}
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells
                         if c.cell_type == "markdown")
        sections[path.stem] = set(re.findall(r"^## (\d+)\. ", text, flags=re.M))
    for functions in syllabus.TAUGHT_IN.values():
        for name, places in functions.items():
            for place in places:
                notebook, _, section = place.partition(" §")
                assert section in sections.get(notebook, ()), f"{name}: {place} is no section"


def test_the_syllabus_is_read_from_the_core_alone(tmp_path):
    """A new core function is in TAUGHT_IN and CALLS once its marker says where it is taught:
    nothing else lists it."""
    package = tmp_path / "transformer_lab"
    shutil.copytree(PACKAGE / "core", package / "core")
    shutil.copytree(PACKAGE / "checks", package / "checks")
    with open(package / "core" / "layers.py", "a") as f:
        f.write('\n\ndef relu_squared_forward(x):\n    """max(x, 0)^2."""\n'
                "    ### BEGIN SOLUTION 00 §4, 07 §1\n    y, cache = relu_forward(x)\n"
                "    return y * y, cache\n    ### END SOLUTION\n")
    taught_in, calls = syllabus.read_core(package)
    assert taught_in["layers"]["relu_squared_forward"] == ("00_gradients §4", "07_blocks §1")
    assert calls["relu_squared_forward"] == ("relu_forward",)
    assert {m: {f: p for f, p in fs.items() if f != "relu_squared_forward"}
            for m, fs in taught_in.items()} == syllabus.TAUGHT_IN
    assert list(taught_in) == list(syllabus.TAUGHT_IN)  # modules by the notebook teaching them


# --- strict markers in the package ---------------------------------------------------------------

def _project(tmp_path: Path) -> Path:
    """A copy of the project a handout is made from, with a one-notebook course."""
    project = tmp_path / "project"
    shutil.copytree(ROOT / "src", project / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "requirements.txt"):
        shutil.copy(ROOT / name, project / name)
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 00 · Tiny",
                                                                       id="intro")])
    write(nb, project / "notebooks" / "00_tiny.ipynb")
    return project


def _edit(path: str, old: str, new: str):
    def change(project: Path) -> None:
        file = project / "src" / "transformer_lab" / path
        text = file.read_text()
        assert old in text, (path, old)
        file.write_text(text.replace(old, new, 1))
    return change


#: check-softmax-forward's run method, as its module writes it
#: The last lines of nb01_attention.py's last class.
ADDITIVE_RUN_END = ("        out, weights = f.additive_attention(Q, K, V, W1, W2, w)\n"
                    "        return {\"out\": out, \"weights\": weights}\n")
SOFTMAX_RUN = ("    def run(self, f, x, into=False):\n"
               "        return f.softmax_forward(x, **({\"out\": np.full_like(x, np.nan)} if into "
               "else {}))[0]\n")

_SOFTMAX = '''    ### BEGIN SOLUTION 01 §3, 02 §4
    m = x.max(axis=-1, keepdims=True)  # (..., 1)'''
_CAUSAL_END = '''    return np.arange(S)[None, :] > np.arange(T)[:, None]
    ### END SOLUTION'''
BAD_PACKAGES = {  # name: (change, file, line or None, words in the message)
    "missing END": (_edit("core/training.py", "    ### END SOLUTION\n", ""),
                    "core/training.py", None, "has no ### END SOLUTION"),
    "BEGIN before the END of another": (
        _edit("core/attention.py", _CAUSAL_END,
              "    return np.arange(S)[None, :] > np.arange(T)[:, None]"),
        "core/attention.py", 36, "regions cannot be nested"),
    "nested BEGIN": (_edit("core/layers.py", _SOFTMAX, _SOFTMAX.replace(
        "    ### BEGIN SOLUTION", "    ### BEGIN SOLUTION\n    ### BEGIN SOLUTION")),
        "core/layers.py", None, "cannot be nested"),
    "END without BEGIN": (_edit("core/attention.py", "    ### BEGIN SOLUTION 02 §1\n    S = T",
                                "    S = T"),
                          "core/attention.py", None, "without a ### BEGIN SOLUTION"),
    "malformed": (_edit("core/layers.py", _SOFTMAX, _SOFTMAX.replace("### BEGIN SOLUTION",
                                                                      "# begin solution")),
                  "core/layers.py", None, "malformed marker"),
    "a hint in the core": (_edit("core/layers.py", _SOFTMAX,
                                 _SOFTMAX.replace("SOLUTION 01 §3, 02 §4",
                                                  "SOLUTION: subtract the max")),
                           "core/layers.py", None, "softmax_forward() must name where it is "
                                                   "taught"),
    "places out of order": (_edit("core/layers.py", _SOFTMAX, _SOFTMAX.replace(
        "SOLUTION 01 §3, 02 §4", "SOLUTION 02 §4, 01 §3")),
        "core/layers.py", None, "in teaching order"),
    "a notebook without a check module": (_edit("core/layers.py", _SOFTMAX, _SOFTMAX.replace(
        "SOLUTION 01 §3, 02 §4", "SOLUTION 01 §3, 42 §4")),
        "core/layers.py", None, "names notebook 42, which has no check module"),
    "region at module level": (_edit("core/attention.py", "import numpy as np\n",
                                     "import numpy as np\n### BEGIN SOLUTION\nX = 1\n"
                                     "### END SOLUTION\n"),
                               "core/attention.py", None, "inside a function's body"),
    "region not at the body's top level": (
        _edit("core/attention.py", "    ### BEGIN SOLUTION 02 §1\n    S = T if S is None else S\n"
              "    return np.arange(S)[None, :] > np.arange(T)[:, None]\n    ### END SOLUTION",
              "    if True:\n        ### BEGIN SOLUTION 02 §1\n        S = T if S is None else S\n"
              "        ### END SOLUTION\n"
              "    return np.arange(S)[None, :] > np.arange(T)[:, None]"),
        "core/attention.py", None, "top level of its body"),
    "a function without a region": (
        _edit("core/attention.py", "def causal_mask(",
              "def shortcut(T):\n    return T\n\n\ndef causal_mask("),
        "core/attention.py", None, "shortcut() has no solution region"),
    "a function whose marker names no notebook": (
        _edit("core/attention.py", "def causal_mask(",
              "def helper(T):\n    ### BEGIN SOLUTION\n    return T\n    ### END SOLUTION\n\n\n"
              "def causal_mask("),
        "core/attention.py", None, "helper() must name where it is taught"),
    "marker words in a boundary module": (_edit("layers.py", '"""', '"""# BEGIN SOLUTION\n'),
                                          "transformer_lab/layers.py", 1, "marker words outside"),
    "hidden tests in the core": (_edit("core/attention.py", "import numpy as np\n",
                                       "import numpy as np\n### BEGIN HIDDEN TESTS\nX = 1\n"
                                       "### END HIDDEN TESTS\n"),
                                 "core/attention.py", None, "hidden tests belong in a check"),
    "a solution region in a check module": (
        _edit("checks/nb01_attention.py", "def _softmax(x, dim=-1):\n",
              "def _softmax(x, dim=-1):\n    ### BEGIN SOLUTION\n    pass\n    ### END SOLUTION\n"),
        "checks/nb01_attention.py", None, "solution regions belong in the core"),
    "run() hidden": (_edit("checks/nb01_attention.py", SOFTMAX_RUN,
                           f"    ### BEGIN HIDDEN TESTS\n{SOFTMAX_RUN}    ### END HIDDEN TESTS\n"),
                     "checks/nb01_attention.py", None, "SoftmaxForward.run is hidden"),
    "a class statement hidden": (
        _edit("checks/nb01_attention.py", "class SoftmaxForward(Check,",
              "### BEGIN HIDDEN TESTS\nclass Extra(Check, id='check-x'):\n    pass\n"
              "### END HIDDEN TESTS\n\n\nclass SoftmaxForward(Check,"),
        "checks/nb01_attention.py", None, "holds the class statement of Extra"),
    "a method cut in two": (
        _edit("checks/nb01_attention.py", SOFTMAX_RUN.split("\n")[0],
              SOFTMAX_RUN.split("\n")[0] + "\n        ### BEGIN HIDDEN TESTS\n        x = x\n"
              "        ### END HIDDEN TESTS"),
        "checks/nb01_attention.py", None, "cuts a statement of SoftmaxForward in two"),
    "a region that leaves its class": (  # a module-level statement before its END marker
        _edit("checks/nb01_attention.py", ADDITIVE_RUN_END,
              ADDITIVE_RUN_END + "    ### BEGIN HIDDEN TESTS\n"
              "    def extra_hidden(self):\n        return 1\n\n\nX = 1\n"
              "    ### END HIDDEN TESTS\n"),
        "checks/nb01_attention.py", None, "cuts a statement in two"),
}


@pytest.mark.parametrize("case", BAD_PACKAGES, ids=str)
def test_misplaced_markers_in_the_package_fail_the_build_with_file_and_line(case, tmp_path,
                                                                           capsys):
    change, path, line, words = BAD_PACKAGES[case]
    project = _project(tmp_path)
    change(project)
    out = tmp_path / "out"
    status = student.main(["--source", str(project / "notebooks"), "--out", str(out),
                           "--project", str(project)])
    err = capsys.readouterr().err
    assert status == 1, err
    reported = [text for text in err.splitlines() if path in text and words in text]
    assert reported, err
    assert re.search(re.escape(path) + r", line \d+: ", reported[0]), reported[0]
    if line is not None:
        assert f"{path}, line {line}:" in reported[0], reported[0]
    assert not out.exists(), "nothing may be written when a marker is wrong"


def test_a_hidden_region_may_close_a_class_body(tmp_path):
    """Its END marker, indented as the body, follows the class's last statement (as in
    notebook 13's dropout check): the handout builds, without the hidden cases."""
    project = _project(tmp_path)
    last = ADDITIVE_RUN_END  # the module's last class ends here
    _edit("checks/nb01_attention.py", last,
          last + "\n    ### BEGIN HIDDEN TESTS\n    def extra_hidden(self):\n        return 1\n"
          "    ### END HIDDEN TESTS\n")(project)
    module = P.parse_package(project / "src" / "transformer_lab").checks["nb01_attention"]
    assert "extra_hidden" in module.source and "extra_hidden" not in module.stripped()
    compile(module.stripped(), "nb01_attention.py", "exec")


def test_the_stubbed_package_and_its_forms_parse():
    instructor = P.parse_package(PACKAGE)
    for module in instructor.core.values():
        compile(module.stubbed(), module.name, "exec")
    for module in instructor.checks.values():
        stripped = module.stripped()
        assert "HIDDEN TESTS" not in stripped
        free = P.without_references(stripped)
        tree = ast.parse(free)
        methods = {n.name for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body
                   if isinstance(n, ast.FunctionDef)}
        assert "run" in methods and not methods & set(P.REFERENCE_METHODS)


def test_setup_notebook_turns_on_autoreload_only_in_ipython():
    from transformer_lab.notebook import autoreload_core, core_modules

    assert autoreload_core() is False  # plain Python: nothing to do, nothing printed
    assert core_modules() == sorted(f"transformer_lab.core.{m}" for m in syllabus.TAUGHT_IN)
