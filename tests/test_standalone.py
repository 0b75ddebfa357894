"""Each notebook works when opened on its own: figures embedded, the first cell guarded."""

import base64
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from transformer_lab.course import figures, standalone

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_works_on_its_own(notebook):
    nb = nbformat.read(notebook, as_version=4)
    problems = standalone.standalone_problems(nb, ROOT / "img")
    assert not problems, f"{notebook.name}: run `make figures`: " + "; ".join(problems)


def _figure_cell(text: str):
    return nbformat.v4.new_markdown_cell(text)


def _notebook(*cells):
    nb = nbformat.v4.new_notebook(cells=list(cells))
    return nb


@pytest.fixture
def img(tmp_path):
    folder = tmp_path / "img"
    folder.mkdir()
    figures.draw("head_split_shapes.png", folder)
    (folder / "other.png").write_bytes(b"\x89PNG not really")
    return folder


def test_figures_become_attachments_equal_to_the_drawn_files(img):
    nb = _notebook(
        _figure_cell("Intro.\n\n![Splitting into heads, shown on\none sequence]"
                     "(../img/head_split_shapes.png)\n\nand ![x](../img/other.png) twice: "
                     "![y](../img/other.png)"),
        nbformat.v4.new_code_cell("x = '../img/in code is not a figure'"),
        _figure_cell("No figure here."))
    assert standalone.figure_problems(nb, img) == [
        f"cell 1 ({nb.cells[0].id}): refers to a file in img/, which a notebook opened on its "
        "own cannot find"]
    assert standalone.embed_figures(nb, img) == 1
    cell = nb.cells[0]
    assert "../img" not in cell.source
    assert "![Splitting into heads, shown on\none sequence](attachment:head_split_shapes.png)" \
        in cell.source
    assert cell.source.count("](attachment:other.png)") == 2
    assert sorted(cell.attachments) == ["head_split_shapes.png", "other.png"]
    for name, bundle in cell.attachments.items():
        assert base64.b64decode(bundle["image/png"]) == (img / name).read_bytes()
    assert "attachments" not in nb.cells[2]
    nbformat.validate(nb)
    assert standalone.figure_problems(nb, img) == []
    assert standalone.embed_figures(nb, img) == 0  # idempotent

    # a figure redrawn: the check names it, embedding again refreshes it
    (img / "other.png").write_bytes(b"\x89PNG redrawn")
    assert standalone.figure_problems(nb, img) == [
        f"cell 1 ({cell.id}): its attachment other.png differs from img/other.png"]
    assert standalone.embed_figures(nb, img) == 1
    assert base64.b64decode(cell.attachments["other.png"]["image/png"]) == b"\x89PNG redrawn"


def test_missing_figures_and_attachments_are_named(img):
    nb = _notebook(_figure_cell("![a](../img/nope.png)"))
    with pytest.raises(FileNotFoundError, match=r"cell 1 .* shows nope.png, which .* does not"):
        standalone.embed_figures(nb, img)
    nb = _notebook(_figure_cell("![a](attachment:gone.png)"))
    assert standalone.figure_problems(nb, img) == [
        f"cell 1 ({nb.cells[0].id}): shows attachment:gone.png but has no such attachment"]


def test_guard_cell_goes_first_once(img):
    nb = _notebook(_figure_cell("# Title"),
                   nbformat.v4.new_code_cell("import numpy as np\nrng = 1"),
                   nbformat.v4.new_code_cell("print(rng)"))
    assert not standalone.has_guard(nb)
    assert "package guard" in standalone.standalone_problems(nb, img)[0]
    assert standalone.add_guard(nb)
    guard = nb.cells[1]
    assert (guard.id, guard.source, guard.metadata["tags"]) == \
        ("package-guard", standalone.GUARD, ["remove-cell"])
    assert guard.metadata["jupyter"] == {"source_hidden": True}  # shown collapsed in Jupyter
    assert [c.source for c in nb.cells[2:]] == ["import numpy as np\nrng = 1", "print(rng)"]
    assert not standalone.add_guard(nb)  # idempotent
    guard.execution_count = 1
    del guard.metadata["jupyter"]  # a guard of before it was collapsed: only the metadata changes
    assert standalone.add_guard(nb) and guard.execution_count == 1
    assert guard.metadata["jupyter"] == {"source_hidden": True}
    assert standalone.standalone_problems(nb, img) == []
    nbformat.validate(nb)
    # an older guard, moved or edited, is updated and put first, never doubled
    guard.source = "old guard"
    nb.cells.append(nb.cells.pop(1))
    assert standalone.add_guard(nb)
    assert [c.get("id") for c in nb.cells].count("package-guard") == 1
    assert nb.cells[1].source == standalone.GUARD and standalone.has_guard(nb)


def test_cli_applies_and_checks(img, tmp_path, capsys):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    path = folder / "00_x.ipynb"
    nbformat.write(_notebook(_figure_cell("![a](../img/other.png)"),
                             nbformat.v4.new_code_cell("x = 1")), path)
    assert standalone.main(["--check", "--img", str(img), str(folder)]) == 1
    assert "refers to a file in img/" in capsys.readouterr().out
    assert standalone.main(["--img", str(img), str(folder)]) == 0
    assert "updated" in capsys.readouterr().out
    before = path.read_bytes()
    assert standalone.main(["--img", str(img), str(folder)]) == 0
    assert "up to date" in capsys.readouterr().out and path.read_bytes() == before
    assert standalone.main(["--check", "--img", str(img), str(folder)]) == 0


def _run_guard(cwd: Path, with_site: bool) -> subprocess.CompletedProcess:
    """The guard as a notebook's first lines would run it: without site-packages (-S), the
    course package cannot be imported; with them (this environment), it can."""
    flags = ["-I"] if with_site else ["-I", "-S"]
    return subprocess.run([sys.executable, *flags, "-c", standalone.GUARD + "print('on')"],
                          cwd=cwd, capture_output=True, text=True, timeout=60)


def test_guard_is_silent_when_the_package_is_installed(tmp_path):
    res = _run_guard(tmp_path, with_site=True)
    assert res.returncode == 0 and res.stdout == "on\n" and res.stderr == ""


def _course_folder(root: Path) -> Path:
    (root / "src" / "transformer_lab").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'transformer-lab'\n")
    (root / "notebooks").mkdir()
    return root


def test_guard_names_the_install_line_for_the_course_folder(tmp_path):
    course = _course_folder(tmp_path / "my course")
    for cwd in [course / "notebooks", course, tmp_path]:  # below, in, above (one folder down)
        res = _run_guard(cwd, with_site=False)
        assert res.returncode == 1 and "on" not in res.stdout
        message = res.stderr.strip().splitlines()
        assert message[-5:] == [
            "ModuleNotFoundError: transformer_lab, the course's package, is not installed in "
            "this kernel's Python. Install it from the course folder: run",
            "",
            f'    %pip install -e "{course}"',
            "",
            "in a cell, then restart the kernel (Kernel > Restart Kernel; on Colab, Runtime > "
            "Restart session) and run the notebook again."]


def test_guard_without_a_course_folder_says_where_the_package_comes_from(tmp_path):
    (tmp_path / "src").mkdir()  # not a course folder: no src/transformer_lab, no pyproject
    res = _run_guard(tmp_path, with_site=False)
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: transformer_lab, the course's package, is not "
                           "installed in this kernel's Python. It comes with the course files")
    assert "!unzip -q '*.zip'" in last and "run this cell again" in last


def test_site_shows_attachments_and_offers_the_notebook_with_them(img, tmp_path):
    """myst-nb does not render attachments: the site's extension writes them out as files;
    the notebook the site offers for download keeps them."""
    from transformer_lab.course import site

    nb = _notebook(_figure_cell("# A page\n\n![the heads](../img/head_split_shapes.png)"),
                   nbformat.v4.new_code_cell("x = 1"))
    standalone.embed_figures(nb, img)
    executed = tmp_path / "executed"
    executed.mkdir()
    nbformat.write(nb, executed / "00_x.ipynb")
    out = tmp_path / "html"
    assert site.main(["--docs", str(ROOT / "docs"), "--executed", str(executed),
                      "--img", str(tmp_path / "no-img"), "--src", str(tmp_path / "src"),
                      "--out", str(out)]) == 0
    page = (out / "notebooks" / "00_x.html").read_text()
    assert 'alt="the heads" src="../_images/head_split_shapes.png"' in page
    assert (out / "_images" / "head_split_shapes.png").read_bytes() == \
        (img / "head_split_shapes.png").read_bytes()
    offered = nbformat.read(out / "_sources" / "notebooks" / "00_x.ipynb", as_version=4)
    assert standalone.figure_problems(offered, img) == []
    assert "attachment:head_split_shapes.png" in offered.cells[0].source
