"""`make portability` (transformer_lab.course.portability): the kernel combinations it runs,
the variables it sets, and that a notebook whose stored output another kernel changes fails it."""

from __future__ import annotations

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from transformer_lab.course import portability as P

X86 = {"fpu", "pni", "avx", "avx2", "fma"}


def test_the_kernels_are_those_the_cpu_can_run_each_with_both_torch_choices():
    assert [str(c) for c in P.combinations(X86)] == [
        "Prescott/native", "Prescott/default", "Sandybridge/native", "Sandybridge/default",
        "Haswell/native", "Haswell/default"]
    assert "SkylakeX/default" in map(str, P.combinations(X86 | {"avx512f"}))
    assert [str(c) for c in P.combinations(None)] == ["native/native", "native/default"]


def test_make_test_adds_one_non_default_combination_where_the_cpu_has_it():
    assert str(P.ci_combination(X86)) == P.CI_COMBINATION == "Sandybridge/default"
    assert P.ci_combination(X86).env() == {"OPENBLAS_CORETYPE": "Sandybridge",
                                           "ATEN_CPU_CAPABILITY": "default"}
    for flags in (None, {"pni"}):  # no x86 flags, or no AVX: torch's default kernels only
        assert P.ci_combination(flags).env() == {"ATEN_CPU_CAPABILITY": "default"}


def test_a_combination_is_parsed_or_refused_with_the_form_it_needs():
    assert P.Combination.parse("Haswell/native").env() == {"OPENBLAS_CORETYPE": "Haswell"}
    for bad in ("Haswell", "Haswell/avx9", "/default"):
        with pytest.raises(ValueError, match="OPENBLAS_KERNEL/ATEN"):
            P.Combination.parse(bad)


def test_cpu_flags_are_read_from_cpuinfo(tmp_path, monkeypatch):
    monkeypatch.setattr(P.platform, "machine", lambda: "x86_64")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu pni avx\nbugs\t: x\n")
    assert P.cpu_flags(cpuinfo) == {"fpu", "pni", "avx"}
    monkeypatch.setattr(P.platform, "machine", lambda: "arm64")
    assert P.cpu_flags(cpuinfo) is None


def _project(tmp_path, stored: str):
    """A course folder with one notebook that prints 0.1 + 0.2 in full, stored as ``stored``."""
    (tmp_path / "tests").mkdir(parents=True)
    (tmp_path / "tests" / "nbval_sanitize.cfg").write_text("")
    cell = new_code_cell("print(repr(0.1 + 0.2))", execution_count=1,
                         outputs=[new_output("stream", name="stdout", text=stored + "\n")])
    (tmp_path / "notebooks").mkdir()
    nbformat.write(new_notebook(cells=[cell]), tmp_path / "notebooks" / "00_x.ipynb")
    return tmp_path


@pytest.mark.parametrize("stored, status", [("0.30000000000000004", 0), ("0.3", 1)])
def test_a_stored_output_that_comes_out_otherwise_fails_the_run(tmp_path, capsys, stored, status):
    project = _project(tmp_path / "course", stored)
    argv = ["--only", "native/default", "--runs", "solved", "--jobs", "1",
            "--project", str(project), "--logs", str(tmp_path / "logs")]
    assert P.main(argv) == status
    table = capsys.readouterr().out
    assert "native/default" in table and ("ok" if status == 0 else "FAILED") in table
    assert (tmp_path / "logs" / "native_default_solved.log").is_file()


def test_bad_arguments_name_what_is_expected(tmp_path, capsys):
    for argv, message in ((["--only", "Haswell"], "OPENBLAS_KERNEL/ATEN"),
                          (["--jobs", "0"], "--jobs must be at least 1"),
                          (["--project", str(tmp_path)], "holds no notebooks/ and tests/")):
        with pytest.raises(SystemExit):
            P.main(argv)
        assert message in capsys.readouterr().err
