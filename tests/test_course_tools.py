"""The maintainers' tools: executing notebooks into build/, the table, the site."""

import os
from pathlib import Path

import nbformat
import pytest

from transformer_lab.course import execute, site

ROOT = Path(__file__).resolve().parents[1]


def _notebook(path: Path, source: str) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)
    return path


def test_execute_writes_copies_leaves_sources_and_skips_fresh_ones(tmp_path, capsys):
    src_dir, out_dir = tmp_path / "notebooks", tmp_path / "build"
    src_dir.mkdir()
    a = _notebook(src_dir / "00_a.ipynb", "print(sum(range(4)))")
    b = _notebook(src_dir / "01_b.ipynb", "import os\nprint(os.environ['PYTHONHASHSEED'])")
    before = a.read_text()

    status = execute.main([str(src_dir), "--output-dir", str(out_dir)])
    out = capsys.readouterr().out
    assert status == 0
    assert a.read_text() == before  # the student's tree stays clean
    assert "[1/2] 00_a.ipynb ... ok" in out and "[2/2] 01_b.ipynb ... ok" in out
    executed = nbformat.read(out_dir / "00_a.ipynb", as_version=4)
    assert executed.cells[0].outputs[0].text == "6\n"
    # kernels run with the reproducibility environment
    assert nbformat.read(out_dir / "01_b.ipynb", as_version=4).cells[0].outputs[0].text == "0\n"
    table = out.split("\n\n")[-1].splitlines()
    assert table[0].split() == ["notebook", "status", "seconds"]
    assert table[2].split()[:2] == ["00_a.ipynb", "ok"]

    # nothing changed: nothing is executed again
    assert execute.main([str(src_dir), "--output-dir", str(out_dir)]) == 0
    assert capsys.readouterr().out.count("up to date") == 4  # 2 progress lines + 2 table rows

    # a touched notebook is executed again, the other one is not
    os.utime(b, (b.stat().st_mtime + 10, b.stat().st_mtime + 10))
    os.utime(out_dir / "00_a.ipynb", (b.stat().st_mtime + 20,) * 2)
    execute.main([str(src_dir), "--output-dir", str(out_dir)])
    out = capsys.readouterr().out
    assert "00_a.ipynb ... up to date" in out and "01_b.ipynb ... ok" in out


def test_execute_reports_a_failing_notebook_and_goes_on(tmp_path, capsys):
    bad = _notebook(tmp_path / "00_bad.ipynb", "raise ValueError('broken on purpose')")
    good = _notebook(tmp_path / "01_good.ipynb", "print('fine')")
    status = execute.main([str(bad), str(good), "--output-dir", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert status == 1
    assert "00_bad.ipynb ... FAILED" in captured.out
    assert "01_good.ipynb ... ok" in captured.out
    assert "ValueError: broken on purpose" in captured.err


def test_execute_rejects_bad_arguments(tmp_path):
    with pytest.raises(SystemExit, match="neither a notebook"):
        execute.main([str(tmp_path / "missing.ipynb")])
    with pytest.raises(SystemExit, match="no notebooks found"):
        execute.main([str(tmp_path)])
    with pytest.raises(SystemExit):
        execute.main(["--timeout", "0", str(tmp_path)])


def test_site_renders_every_notebook_with_math_offline(tmp_path):
    # The stored notebooks are executed, so they can stand in for build/notebooks here.
    out = tmp_path / "html"
    status = site.main(["--docs", str(ROOT / "docs"), "--executed", str(ROOT / "notebooks"),
                        "--img", str(ROOT / "img"), "--src", str(tmp_path / "src"),
                        "--out", str(out)])
    assert status == 0
    index = (out / "index.html").read_text()
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        page = out / "notebooks" / f"{nb.stem}.html"
        assert page.exists(), f"{nb.name} missing from the site"
        assert f"notebooks/{nb.stem}.html" in index, f"{nb.name} not linked from the landing page"
    page = (out / "notebooks" / "00_gradients.html").read_text()
    assert "_static/mathjax/tex-chtml.js" in page and (out / "_static/mathjax/tex-chtml.js").exists()
    assert r"\boxed{" in page  # LaTeX is handed to MathJax, not mangled


def test_failed_copy_is_kept_for_inspection_but_never_up_to_date(tmp_path, capsys):
    bad = _notebook(tmp_path / "00_bad.ipynb", "print('before')\n1 / 0")
    out = tmp_path / "out"
    assert execute.main([str(bad), "--output-dir", str(out)]) == 1
    kept = nbformat.read(out / "00_bad.ipynb", as_version=4)
    assert kept.cells[0].outputs[0].text == "before\n"
    assert execute.main([str(bad), "--output-dir", str(out)]) == 1  # executed again, not skipped
    assert "up to date" not in capsys.readouterr().out
