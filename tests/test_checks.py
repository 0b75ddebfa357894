"""The exercise checks: every registered check is well formed and passes on the package's
(instructor's) core or, for a notebook's function, on the notebook's solution; wrong answers fail
with a message naming the case and, where the mistake is a common one, a hint; answers survive
the trip between processes."""

import functools
from pathlib import Path

import nbformat
import numpy as np
import pytest
from handout_tools import check_as_in_handout
from mutation_tools import exercise_cells, exercise_namespace

from transformer_lab import syllabus
from transformer_lab.checks import CheckFailed, check, load_checks
from transformer_lab.checks import framework as F
from transformer_lab.core import attention as CA
from transformer_lab.core import layers as CL

REGISTRY = load_checks()
NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def test_every_check_is_well_formed():
    core = {name for functions in syllabus.TAUGHT_IN.values() for name in functions}
    assert REGISTRY, "no checks registered"
    for check_id, cls in REGISTRY.items():
        chk = cls()
        assert check_id.startswith("check-") and cls.notebook[:2].isdigit()
        assert set(cls.functions) <= core, f"{check_id}: unknown core functions"
        assert cls.functions or cls.arguments, f"{check_id} tests nothing"
        public = F.all_cases(chk, hidden=False)
        assert public, f"{check_id} has no public case"
        for case in F.all_cases(chk):
            F.encode((case.args, case.kwargs), {})  # plain data only


def test_every_check_has_one_graded_cell_in_its_notebook_and_every_graded_cell_a_check():
    """The notebooks' graded cells and the registry name the same checks: a check without its
    cell (or with its cell's grading metadata lost) would never be graded, a cell without its
    check would fail."""
    cells = {}  # check id -> (notebook, its cells' sources)
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            grading = cell.metadata.get("nbgrader", {})
            if cell.cell_type == "code" and grading.get("grade"):
                assert cell.get("id") == grading.get("grade_id"), (path.name, cell.get("id"))
                assert grading.get("locked") and grading.get("points", 0) > 0, cell.get("id")
                cells.setdefault(cell.id, []).append((path.stem, cell.source))
            elif cell.get("id", "").startswith("check-"):
                pytest.fail(f"{path.name}: cell {cell.id} has no grading metadata")
    assert cells.keys() == REGISTRY.keys(), (sorted(cells.keys() - REGISTRY.keys()),
                                             sorted(REGISTRY.keys() - cells.keys()))
    for check_id, found in cells.items():
        assert len(found) == 1, f"{check_id}: {len(found)} graded cells"
        (notebook, source), = found
        assert notebook == REGISTRY[check_id].notebook, check_id
        assert source.startswith(f'check("{check_id}"'), (check_id, source)


@pytest.mark.parametrize("check_id", sorted(i for i, c in REGISTRY.items() if not c.arguments))
def test_core_checks_pass_on_the_reference(check_id, capsys):
    check(check_id)
    assert capsys.readouterr().out.startswith(f"{check_id} passed (")


@functools.cache
def _solutions(notebook: str) -> dict:
    """The names a notebook's solution defines, as the grader's probe runs them."""
    return exercise_namespace(notebook, exercise_cells(notebook)[0])


@pytest.mark.parametrize("check_id", sorted(i for i, c in REGISTRY.items() if c.arguments))
def test_notebook_checks_pass_on_the_notebooks_solutions(check_id, capsys):
    cls = REGISTRY[check_id]
    check(check_id, *(_solutions(cls.notebook)[name] for name in cls.arguments))
    assert capsys.readouterr().out.startswith(f"{check_id} passed (")


def _fails(check_id, *functions):
    with pytest.raises(CheckFailed) as err:
        check(check_id, *functions)
    return str(err.value)


def test_a_named_mistake_gets_its_hint(monkeypatch):
    original = CA.attention_forward
    monkeypatch.setattr(CA, "attention_forward",
                        lambda q, k, v, mask=None, scale=None: original(q, k, v, mask, 1.0))
    message = _fails("check-attention-forward")
    # the scale the cache holds is compared first: 1.0, and the hint names the mistake
    assert "case 'T = S = 4, d_k = d_v = 3'" in message and "expected 0.5774, got 1" in message
    assert "without dividing the scores by sqrt(d_k)" in message


def test_generic_hints(monkeypatch):
    original = CA.attention_forward
    def times(c):  # the output times c, the cache kept
        def forward(q, k, v, mask=None, scale=None):
            out, cache = original(q, k, v, mask, scale)
            return c * out, cache
        return forward
    monkeypatch.setattr(CA, "attention_forward", times(2))
    assert "2 times the expected one everywhere" in _fails("check-attention-forward")

    def promote(q, k, v, mask=None, scale=None):
        return original(*(a.astype(np.float64) for a in (q, k, v)))
    monkeypatch.setattr(CA, "attention_forward", promote)
    message = _fails("check-attention-forward")
    assert "expected a float32 array, got float64" in message and "d ** 0.5" in message

    monkeypatch.setattr(CA, "attention_forward", times(-1))
    assert "a sign error" in _fails("check-attention-forward")


def test_an_input_changed_in_place_fails(monkeypatch):
    original = CL.softmax_forward

    def in_place(x):
        x -= x.max(axis=-1, keepdims=True)
        return original(x)
    monkeypatch.setattr(CL, "softmax_forward", in_place)
    assert "changed its input `x` in place" in _fails("check-softmax-forward")


def test_a_stub_fails_with_its_message(monkeypatch):
    message = syllabus.stub_message("softmax_forward")

    def stub(x):
        raise NotImplementedError(message)
    monkeypatch.setattr(CL, "softmax_forward", stub)
    assert _fails("check-softmax-forward") == f"check-softmax-forward: {message}"


def test_a_notimplementederror_of_the_students_own_is_an_error_not_a_stub(monkeypatch):
    """Only a stub's message is "not written yet"; the student's own raise is reported as an
    error, with its line, and the rest of the cases are not skipped as unwritten."""
    def partial(x):
        raise NotImplementedError("only 2-D inputs for now")
    monkeypatch.setattr(CL, "softmax_forward", partial)
    message = _fails("check-softmax-forward")
    assert "your code raised NotImplementedError: only 2-D inputs for now" in message
    assert "not written yet" not in message
    assert F.is_stub(f"NotImplementedError: {syllabus.stub_message('softmax_forward')}")
    assert F.is_stub("NotImplementedError: Exercise: complete f()")
    assert not F.is_stub("ValueError: Exercise: complete f()")


def test_errors_in_the_students_code_are_reported_with_the_line(monkeypatch):
    def broken(x):
        return x @ np.ones((2, 2)), None
    monkeypatch.setattr(CL, "softmax_forward", broken)
    message = _fails("check-softmax-forward")
    assert "your code raised ValueError" in message
    assert "return x @ np.ones((2, 2)), None" in message


def test_notebook_functions_and_a_named_mistake():
    def whole_array_max(x, axis=-1):
        c = x.max()
        with np.errstate(divide="ignore"):
            return c + np.log(np.exp(x - c).sum(axis=axis))
    message = _fails("check-logsumexp", whole_array_max)
    assert "maximum of the whole array instead of each slice's" in message
    with pytest.raises(TypeError, match="needs your function"):
        check("check-logsumexp")


def test_a_check_belongs_to_its_modules_notebook_and_runs_its_one_function(monkeypatch):
    monkeypatch.setattr(F, "REGISTRY", {})
    here = {"id": "check-x", "functions": ("padding_mask",),
            "__module__": "transformer_lab.checks.nb99_topic"}
    assert F.register(type("X", (F.Check,), here)).notebook == "99_topic"
    said = F.register(type("Y", (F.Check,), {**here, "id": "check-y", "notebook": "98_other"}))
    assert said.notebook == "98_other"
    with pytest.raises(ValueError, match="needs an id 'check-...' and a notebook"):
        F.register(type("Z", (F.Check,), {**here, "id": "check-z", "__module__": __name__}))
    f = F.functions_for(said())
    np.testing.assert_array_equal(said().run(f, np.array([1, 2]), 2), [[False, True], [False] * 2])
    two = type("W", (F.Check,), {**here, "functions": ("padding_mask", "causal_mask")})
    with pytest.raises(TypeError, match="needs its own run"):
        two().run(F.functions_for(two()), 1)


def test_plain_data_survives_encoding():
    value = {"a": np.arange(6.0).reshape(2, 3), "b": (1, 2.5, None, "s", [np.float32(3)]),
             "c": float("-inf"), "d": np.array([True, False])}
    arrays = {}
    back = F.decode(F.encode(value, arrays), arrays)
    assert back.keys() == value.keys() and isinstance(back["b"], tuple)
    np.testing.assert_array_equal(back["a"], value["a"])
    assert back["b"][4][0].dtype == np.float32 and back["c"] == float("-inf")
    with pytest.raises(TypeError, match="not plain data"):
        F.encode(object(), {})


def test_stored_answers_stand_in_for_a_hidden_reference(tmp_path, monkeypatch):
    """The handout has no reference for a variant exercise: its public cases and answers are
    stored by make student, and the same check runs on them."""
    cls = check_as_in_handout("check-cosine-attention", tmp_path, monkeypatch)

    def cosine_attention(q, k, v, tau=0.1):
        qn = q / np.linalg.norm(q, axis=-1, keepdims=True)
        kn = k / np.linalg.norm(k, axis=-1, keepdims=True)
        w, _ = CL.softmax_forward(qn @ np.swapaxes(kn, -1, -2) / tau)
        return w @ v, w

    check(cls.id, cosine_attention)
    assert "relative error" in _fails(cls.id, lambda q, k, v, tau=0.1: cosine_attention(q, k, v, 1))
