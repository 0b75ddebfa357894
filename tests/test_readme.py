"""The README starts a learner and names only what exists; docs/ holds the rest and is in the site.

Every file a link in the README or in docs/*.md points to exists, every `make` target they name
is the Makefile's, every `transformer_lab...` module they name is importable, and the README's
table lists exactly the notebooks in notebooks/."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from transformer_lab.course.student import torch_pin

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDES = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *GUIDES]


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _prose(path: Path) -> str:
    """The page without its code: what a reader follows as a link."""
    text = re.sub(r"^```.*?^```", "", _text(path), flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def test_the_readme_is_short_and_starts_a_learner_at_once():
    lines = _text(README).splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the rest belongs in docs/"
    start = "\n".join(lines[:30])
    assert "make learn" in start and torch_pin(ROOT) in start


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_to_a_file_points_to_one_that_exists(page):
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page)):
        if re.match(r"[a-z]+://", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{page.name} links to {target}, which does not exist"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_make_target_named_is_the_makefiles(page):
    targets = set(re.findall(r"^([a-z][a-z-]*):", _text(ROOT / "Makefile"), flags=re.M))
    for target in re.findall(r"`make ([a-z][a-z-]*)", _text(page)):
        assert target in targets, f"{page.name} names `make {target}`, not a Makefile target"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_module_named_exists(page):
    for dotted in set(re.findall(r"\btransformer_lab(?:\.[a-z_][a-z0-9_]*)+", _text(page))):
        parts = dotted.split(".")
        # the longest importable prefix; what follows it must be an attribute of that module
        for n in range(len(parts), 0, -1):
            try:
                if importlib.util.find_spec(".".join(parts[:n])) is not None:
                    break
            except ModuleNotFoundError:  # a name inside a module, not a submodule
                continue
        obj = importlib.import_module(".".join(parts[:n]))
        for attr in parts[n:]:
            assert hasattr(obj, attr), f"{page.name} names {dotted}, which does not exist"
            obj = getattr(obj, attr)


def test_the_readmes_table_lists_every_notebook_and_no_other():
    named = re.findall(r"^\| \d\d \| \[`(\d\d_\w+)`\]\(notebooks/\1\.ipynb\)", _text(README),
                       flags=re.M)
    assert named == sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))


def test_the_guides_are_in_the_site():
    index = _text(ROOT / "docs" / "index.md")
    for guide in GUIDES:
        if guide.name != "index.md":
            assert re.search(rf"^{guide.stem}$", index, flags=re.M), \
                f"docs/index.md's table of contents leaves out {guide.name}"
