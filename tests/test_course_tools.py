"""The maintainers' tools: executing notebooks into build/, the table, the site."""

import hashlib
import html
import os
import re
import shutil
import time
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


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """A package folder standing in for transformer_lab in the freshness checks, so that other
    people editing the real package while the tests run cannot make copies stale."""
    package = tmp_path / "src" / "fake_lab"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "data" / "vocab.json").write_text("[]")
    monkeypatch.setattr(execute, "PACKAGE_DIR", package)
    return package


def _set_mtime(path: Path, t: float) -> None:
    os.utime(path, (t, t))


def test_execute_writes_copies_leaves_sources_and_skips_fresh_ones(tmp_path, capsys,
                                                                   fake_package):
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


def test_copies_are_stale_after_any_change_to_the_package_or_the_figures(tmp_path,
                                                                         fake_package):
    (tmp_path / "notebooks").mkdir()
    notebook = _notebook(tmp_path / "notebooks" / "00_a.ipynb", "print(1)")
    copy = tmp_path / "build" / "00_a.ipynb"
    copy.parent.mkdir()
    copy.write_text(notebook.read_text())
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "figure.png").write_bytes(b"png")
    inputs = [notebook, *fake_package.parent.rglob("*"), fake_package.parent,
              tmp_path / "img", tmp_path / "img" / "figure.png"]
    t0 = time.time() - 1000

    def reset() -> None:
        for path in inputs:
            if path.exists():
                _set_mtime(path, t0)
        _set_mtime(copy, t0 + 10)

    reset()
    assert execute.is_up_to_date(notebook, copy)
    for changed in [notebook, fake_package / "__init__.py", fake_package / "data" / "vocab.json",
                    tmp_path / "img" / "figure.png"]:
        reset()
        _set_mtime(changed, t0 + 20)
        assert not execute.is_up_to_date(notebook, copy), f"{changed} changed unnoticed"
    for removed in [fake_package / "data" / "vocab.json", tmp_path / "img" / "figure.png"]:
        reset()
        removed.unlink()  # its folder's time changes
        assert not execute.is_up_to_date(notebook, copy), f"{removed} removed unnoticed"
    # bytecode caches, written whenever Python imports the package, do not count
    cache = fake_package / "__pycache__"
    cache.mkdir()
    (cache / "fake_lab.cpython-311.pyc").write_bytes(b"")
    reset()
    _set_mtime(cache / "fake_lab.cpython-311.pyc", t0 + 20)
    _set_mtime(cache, t0 + 20)
    assert execute.is_up_to_date(notebook, copy)
    assert not execute.is_up_to_date(notebook, tmp_path / "build" / "missing.ipynb")


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
    mathjax = "_static/mathjax/tex-chtml.js"
    assert mathjax in page and (out / mathjax).exists()
    assert r"\boxed{" in page  # LaTeX is handed to MathJax, not mangled
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        stray = _stray_dollars((out / "notebooks" / f"{nb.stem}.html").read_text())
        assert not stray, f"{nb.stem}: math the site did not read as math: {stray[:3]}"
    # the course's style and script reach every page: long code lines scroll, never wrap
    page = (out / "notebooks" / "16_long_context.html").read_text()
    assert "_static/course.css" in page and "_static/course.js" in page
    assert (out / "_static" / "course.css").read_text() == \
        (ROOT / "docs" / "_static" / "course.css").read_text()
    assert (out / "_static" / "course.js").exists()


def _stray_dollars(page: str) -> list[str]:
    """The text around each $ of a page's prose (code and math left out): a $$ block inside a
    list item's paragraph, or a formula broken before a line that starts with '+', renders in
    Jupyter but not on the site."""
    prose = re.sub(r"<(pre|code|script|style)\b.*?</\1>|<[^>]*class=\"math[^>]*>.*?</(span|div)>",
                   "", page, flags=re.S)
    text = html.unescape(re.sub(r"<[^>]+>", "", prose))
    return [text[max(0, m.start() - 40):m.start() + 40] for m in re.finditer(r"\$", text)]


def _css_rules(css: str) -> dict[str, dict[str, str]]:
    """selector -> its declarations, for a plain style sheet (no nested at-rules)."""
    rules: dict[str, dict[str, str]] = {}
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css):
        declarations = {}
        for declaration in body.split(";"):
            if ":" in declaration:
                name, value = declaration.split(":", 1)
                declarations[name.strip()] = " ".join(value.split())
        for selector in selectors.split(","):
            rules.setdefault(" ".join(selector.split()), {}).update(declarations)
    return rules


def test_site_style_scrolls_long_code_lines_and_equations_and_wraps_names_in_text():
    """A wrapped code line continued at column 0, where it read as a line of code of its own;
    a long equation, or a guide's code block, scrolled with no sign that it went on; a long
    name in code widened a phone's page (text, headings) or the page's contents past the
    sidebar (cut off), and `--help` broke into "-" and "-help" at a line's end. \\text{a\\_b}
    showed its backslash, the search field sat twice on every page, and "Next" led from the
    first guide through the maintainers' pages before notebook 00."""
    rules = _css_rules((ROOT / "docs" / "_static" / "course.css").read_text())
    for pre in ("div.highlight pre", "div.cell_output pre"):
        assert rules[pre]["white-space"] == "pre", pre
    for wide in ("div.highlight pre", "div.cell_output pre", 'mjx-container[display="true"]'):
        assert rules[wide]["overflow-x"] == "auto", wide
        assert "local" in rules[wide]["background"] and "scroll" in rules[wide]["background"]
    assert all(r.get("white-space") != "pre-wrap" for r in rules.values())
    for name in ("article.bd-article code.literal span.pre",
                 ".bd-sidebar-secondary nav.page-toc code span.pre"):
        assert rules[name]["white-space"] == "normal"
    assert rules["article.bd-article code.literal span.pre"]["overflow-wrap"] == "break-word"
    assert rules[".bd-sidebar-secondary nav.page-toc code span.pre"]["overflow-wrap"] == \
        "anywhere"  # a flex column: only "anywhere" lowers its width below the longest name
    assert rules[".bd-sidebar-secondary nav.page-toc ul.nav"]["flex-wrap"] == "nowrap"
    conf = (ROOT / "docs" / "conf.py").read_text()
    assert 'html_css_files = ["course.css"]' in conf and 'html_js_files = ["course.js"]' in conf
    assert '"[tex]/textmacros"' in conf and '"navbar_persistent": []' in conf
    index = (ROOT / "docs" / "index.md").read_text()
    assert index.index(":caption: Notebooks") < index.index(":caption: Guides")


def test_failed_copy_is_kept_for_inspection_but_never_up_to_date(tmp_path, capsys):
    bad = _notebook(tmp_path / "00_bad.ipynb", "print('before')\n1 / 0")
    out = tmp_path / "out"
    assert execute.main([str(bad), "--output-dir", str(out)]) == 1
    kept = nbformat.read(out / "00_bad.ipynb", as_version=4)
    assert kept.cells[0].outputs[0].text == "before\n"
    assert execute.main([str(bad), "--output-dir", str(out)]) == 1  # executed again, not skipped
    assert "up to date" not in capsys.readouterr().out


def _tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` and a hash of its content."""
    return {str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def site_project(tmp_path, monkeypatch):
    """A checkout as the site tool sees it, as the current folder: docs/, build/notebooks/,
    img/ and a folder of someone's own."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    (tmp_path / "build" / "notebooks").mkdir(parents=True)
    _notebook(tmp_path / "build" / "notebooks" / "00_a.ipynb", "print(1)")
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "figure.png").write_bytes(b"png")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("keep me")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("args, words", [
    (["--src", "."], "overlap"),  # holds the checkout
    (["--src", "docs"], "overlap"),
    (["--src", "docs/site"], "overlap"),
    (["--src", "build"], "overlap"),  # holds the executed notebooks
    (["--src", "build/notebooks"], "overlap"),
    (["--src", "img"], "overlap"),
    (["--src", "build/html"], "overlap"),  # the output
    (["--src", "/"], "overlap"),
    (["--src", "mine"], "not empty and was not written by this tool"),
    (["--src", "img/figure.png"], "overlap"),
    (["--out", "."], "overlap"),
    (["--out", "docs"], "overlap"),
    (["--out", "build/notebooks/html"], "overlap"),
    (["--out", "img"], "overlap"),
    (["--out", "build/site"], "overlap"),  # the site source, emptied first
    (["--out", "mine"], "not empty and was not written by this tool"),
], ids=" ".join)
def test_site_refuses_folders_it_must_not_empty_or_write_into(site_project, args, words):
    before = _tree(site_project)
    with pytest.raises(SystemExit, match=words):
        site.main(args)
    assert _tree(site_project) == before  # nothing deleted, nothing written


def test_site_source_is_rewritten_only_when_it_is_ours(site_project):
    src = site_project / "build" / "site"
    args = (Path("docs"), Path("build/notebooks"), Path("img"), src)
    assert site.assemble(*args) == [Path("build/notebooks/00_a.ipynb")]
    assert (src / "conf.py").exists() and (src / "notebooks" / "00_a.ipynb").exists()
    assert (src / "img" / "figure.png").exists()
    (src / "stale.md").write_text("from an earlier run")
    site.assemble(*args)  # ours: emptied and rewritten
    assert not (src / "stale.md").exists()
    # a site source the tools did not mark is refused
    (src / site.OWNER_FILE).unlink()
    (src / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="not written by this tool"):
        site.assemble(*args)
    assert (src / "notes.txt").read_text() == "mine"
    # an HTML folder Sphinx wrote is accepted as output, and marked
    html = site_project / "build" / "html"
    html.mkdir()
    (html / site.SPHINX_BUILDINFO).write_text("# Sphinx build info version 1\n")
    (html / "index.html").write_text("<html></html>")
    site.check_out(html, {})
    (html / site.SPHINX_BUILDINFO).unlink()
    with pytest.raises(SystemExit, match="not written by this tool"):
        site.check_out(html, {})
