"""requirements.txt installs from any folder and pins one version of each package for every
Python the course supports (3.10-3.13); the package's metadata agrees."""

import re
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]


def requirement_lines() -> list[str]:
    lines = []
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def test_requirements_name_no_path_so_they_install_from_any_folder():
    """pip resolves a path in a requirements file (`-e .`, `./x`, `-r other.txt`) against the
    current folder, not the file's: the file may hold only pinned names."""
    for line in requirement_lines():
        assert not line.startswith(("-", ".", "/", "file:")) and "@" not in line, \
            f"requirements.txt: {line!r} depends on the folder pip runs in"
        Requirement(line)  # valid PEP 508


@pytest.mark.parametrize("python", PYTHONS)
def test_exactly_one_pin_per_package_on_each_python(python):
    pins: dict[str, list[str]] = {}
    for line in requirement_lines():
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"python_version": python,
                                                      "python_full_version": python + ".0"}):
            assert re.fullmatch(r"==\d+(\.\d+)*", str(req.specifier)), f"{line!r}: not a pin"
            pins.setdefault(req.name.lower(), []).append(str(req.specifier))
    assert all(len(p) == 1 for p in pins.values()), {n: p for n, p in pins.items() if len(p) > 1}
    assert pins["torch"] == ["==2.13.0"]  # one torch for every Python (another spec pulls CUDA)
    assert {"numpy", "scipy", "matplotlib", "jupyterlab", "nbval", "sphinx"} <= set(pins)


def test_markers_only_split_at_python_3_11():
    for line in requirement_lines():
        if ";" in line:
            assert str(Marker(line.split(";", 1)[1])) in ('python_version >= "3.11"',
                                                          'python_version < "3.11"'), line


def test_package_metadata_agrees():
    pyproject = (ROOT / "pyproject.toml").read_text()  # (tomllib is 3.11+)
    assert re.findall(r'^requires-python = "(.*)"$', pyproject, flags=re.M) == [">=3.10"]
    readme = (ROOT / "README.md").read_text()
    assert "Python 3.10, 3.11, 3.12 or 3.13" in readme
    assert "3.10 or newer" not in readme and "OWNER/REPO" not in readme
