"""`make figures` redraws img/ byte for byte."""

import re
from pathlib import Path

import matplotlib
import pytest

from transformer_lab.course import figures

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(matplotlib.__version__ != figures.MATPLOTLIB_OF_IMG,
                    reason=f"img/ was drawn by matplotlib {figures.MATPLOTLIB_OF_IMG}; this "
                           f"is {matplotlib.__version__}, whose bytes differ")
@pytest.mark.parametrize("name", sorted(figures.FIGURES))
def test_committed_figure_is_what_the_code_draws(name, tmp_path):
    committed = ROOT / "img" / name
    assert committed.exists(), f"img/{name} is missing: run `make figures`"
    drawn = figures.draw(name, tmp_path)
    assert drawn.read_bytes() == committed.read_bytes(), \
        f"img/{name} differs from what transformer_lab.course.figures draws: run `make figures`"


def test_every_image_in_img_is_drawn_by_code():
    assert {p.name for p in (ROOT / "img").glob("*.png")} == set(figures.FIGURES)


def test_unknown_figure_is_refused(tmp_path):
    with pytest.raises(ValueError, match="name must be one of"):
        figures.draw("nope.png", tmp_path)


def test_img_was_drawn_by_the_matplotlib_requirements_txt_pins():
    pins = re.findall(r"^matplotlib==(\S+); python_version >= \"3.11\"$",
                      (ROOT / "requirements.txt").read_text(), flags=re.M)
    assert pins == [figures.MATPLOTLIB_OF_IMG]
