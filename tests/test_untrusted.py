"""The grader parses students' code in its own process: code built to break the parser must
cost that student a parse, never the process (Python 3.10's parser crashes on deep nesting)."""

import ast
import subprocess
import sys

import pytest

from transformer_lab.course import flags, grade, untrusted
from transformer_lab.course.package import compose_core_module, student_code

#: one expression 200,000 operations deep: a segmentation fault for Python 3.10's ast.parse on
#: an 8 MiB stack, a RecursionError for 3.11 and later
DEEP = "_z = " + "1+" * 200_000 + "1\n"


def test_a_normal_source_parses_as_ast_parse_does():
    source = "def f(x):\n    return x + 1\n"
    assert ast.dump(untrusted.parse(source)) == ast.dump(ast.parse(source))
    with pytest.raises(SyntaxError) as err:
        untrusted.parse("def f(:\n", "student.py")
    assert err.value.lineno == 1 and not isinstance(err.value, untrusted.Unparseable)


def test_deep_code_never_ends_the_process():
    """In a process of its own, so that a crash is this test's failure and nothing else's."""
    script = ("from transformer_lab.course import untrusted\n"
              "source = '_z = ' + '1+' * 200_000 + '1\\n'\n"
              "for step in (untrusted.parse, untrusted.check_compiles):\n"
              "    try:\n"
              "        step(source)\n"
              "        print('parsed')\n"
              "    except SyntaxError as err:\n"
              "        print('refused', type(err).__name__)\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    # 3.10's compiler (unlike its parser) guards its depth, as 3.11's parser does
    parsed = "parsed" if sys.version_info < (3, 11) else "refused Unparseable"
    assert run.stdout.split("\n")[:2] == [parsed, "refused Unparseable"], run.stdout


@pytest.fixture
def guarded(monkeypatch):
    """The Python 3.10 path (a thread with a large stack), on any version."""
    monkeypatch.setattr(untrusted, "_GUARDED", True)


def test_the_thread_path_parses_compiles_and_raises_as_the_parser_does(guarded, monkeypatch):
    assert isinstance(untrusted.parse("x = 1\n"), ast.Module)
    untrusted.check_compiles("x = 1\n")
    with pytest.raises(SyntaxError) as err:
        untrusted.check_compiles("x = (\n", "m.py")
    assert not isinstance(err.value, untrusted.Unparseable)

    def recurse(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(untrusted.ast, "parse", recurse)
    with pytest.raises(untrusted.Unparseable, match="too deeply nested") as err:
        untrusted.parse("x = 1\n", "m.py")
    assert err.value.filename == "m.py"


def test_on_python_310_a_source_longer_than_the_limit_is_not_parsed(guarded, monkeypatch):
    monkeypatch.setattr(untrusted, "MAX_CHARS_310", 100)
    untrusted.parse("x = 1\n" * 16)
    with pytest.raises(untrusted.Unparseable, match="more than the 100"):
        untrusted.parse("x = 1\n" * 17, "core/layers.py")


def test_the_graders_readers_of_student_code_take_deep_code_as_unparseable():
    cells = [("cell 1", "import numpy as np\n"), ("cell 2", DEEP)]
    assert flags.scan_python(DEEP, "cell 2") == []
    assert flags.scan_notebook_cells(cells) == []
    assert grade.without_unused_imports(cells)[1] == cells[1]
    code = student_code(DEEP, ["softmax"], [], "core/layers.py")
    assert code.functions == {} and "softmax" in code.problems
    deep_softmax = {"softmax": "def softmax(x):\n    return " + DEEP[5:]}
    if sys.version_info >= (3, 11):  # (3.10 parses it, in the thread with the large stack)
        assert code.problems["softmax"].startswith("core/layers.py does not parse (too deeply")
    with pytest.raises(untrusted.Unparseable):
        compose_core_module("def softmax(x):\n    pass\n", deep_softmax)


def test_where_no_thread_gets_the_large_stack_the_parser_runs_as_it_is(guarded, monkeypatch):
    def refuse(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(untrusted.threading.Thread, "start", refuse)
    assert isinstance(untrusted.parse("x = 1\n"), ast.Module)
    with pytest.raises(SyntaxError):
        untrusted.parse("x = (\n")


def test_a_cell_with_a_very_long_line_is_not_given_to_ipythons_transformer(monkeypatch):
    """(On Python 3.12.1, IPython's transformer takes memory in the square of a line's length.)"""
    from IPython.core import inputtransformer2

    seen = []
    real = inputtransformer2.TransformerManager.transform_cell
    monkeypatch.setattr(inputtransformer2.TransformerManager, "transform_cell",
                        lambda self, source: seen.append(source) or real(self, source))
    short = "%time x = 1\ny = 2"
    assert flags.python_source(short) == "pass\ny = 2" and seen == [short]
    long = "x = [" + "1, " * 2_000 + "]\n%time y = 1"
    assert flags.python_source(long) == long and seen == [short]
