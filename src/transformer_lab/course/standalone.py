"""Make every notebook work when opened on its own: figures embedded, the first cell guarded.

    python -m transformer_lab.course.standalone notebooks            # apply (make figures)
    python -m transformer_lab.course.standalone --check notebooks    # report, change nothing

A notebook opened on its own (Colab, downloaded, handed in) has no ``../img/`` beside it and
maybe no course package. :func:`embed_figures` turns every ``![alt](../img/NAME.png)`` into an
attachment holding ``img/NAME.png`` (refreshed when there already); :func:`add_guard` makes the
first code cell :data:`GUARD`, which stops the notebook with the line that installs the package
where it cannot be imported, and prints nothing where it can. Applying is idempotent, and
stored outputs stay valid (docs/maintainers.md, "Everyday work").
"""

from __future__ import annotations

import argparse
import base64
import re
import sys
from pathlib import Path

import nbformat

#: A Markdown image whose target is a figure of the course's ``img/`` folder, relative to the
#: notebooks' folder; ``alt`` may span lines.
IMG_REFERENCE = re.compile(r"!\[(?P<alt>[^\]]*)\]\(\.\./img/(?P<name>[\w.-]+)\)")
#: A Markdown image whose target is a cell attachment.
ATTACHMENT_REFERENCE = re.compile(r"!\[(?P<alt>[^\]]*)\]\(attachment:(?P<name>[\w.-]+)\)")
MIME = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg",
        ".jpeg": "image/jpeg", ".gif": "image/gif"}

#: The source of every notebook's first code cell. Standard library only: it runs before
#: anything is imported, in whatever Python the kernel has. Where the package is installed it
#: does nothing (and prints nothing).
GUARD = '''\
# transformer_lab is the course's package: if this kernel lacks it, stop and say how to install it
import importlib.util, pathlib
if importlib.util.find_spec("transformer_lab") is None:
    _cwd = pathlib.Path.cwd()  # the course folder: here, above, or one folder down
    _found = [p for p in [_cwd, *_cwd.parents, *sorted(_cwd.iterdir())]
              if (p / "src" / "transformer_lab").is_dir() and (p / "pyproject.toml").is_file()]
    raise ModuleNotFoundError(
        "transformer_lab, the course's package, is not installed in this kernel's Python. " + (
            f'Install it from the course folder: run\\n\\n    %pip install -e "{_found[0]}"\\n\\n'
            "in a cell, then restart the kernel (Kernel > Restart Kernel; on Colab, Runtime > "
            "Restart session) and run the notebook again." if _found else
            "It comes with the course files (the folder, or its .zip, that holds pyproject.toml "
            "and src/): put that folder beside this notebook (on Colab: upload the .zip in the "
            "Files panel and run  !unzip -q '*.zip'  in a cell), then run this cell again: it "
            "will print the line that installs the package."))
'''
#: The guard cell's id, the same in every notebook, and the tag that keeps it off the site
#: (myst-nb's ``remove-cell``: readers of the site have the package; the cell is for Jupyter).
GUARD_ID = "package-guard"
GUARD_TAG = "remove-cell"
#: The cell metadata that shows the guard's source collapsed in JupyterLab and Notebook 7.
GUARD_HIDDEN = {"source_hidden": True}


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _encoded(path: Path) -> dict[str, str]:
    mime = MIME.get(path.suffix.lower())
    if mime is None:
        raise ValueError(f"{path.name}: figures must be one of {', '.join(sorted(MIME))}")
    data = path.read_bytes()
    text = data.decode() if mime == "image/svg+xml" else base64.b64encode(data).decode("ascii")
    return {mime: text}


def _decoded(bundle: dict) -> bytes | None:
    for mime, text in bundle.items():
        if mime == "image/svg+xml":
            return text.encode() if isinstance(text, str) else "".join(text).encode()
        if mime in MIME.values():
            return base64.b64decode(text if isinstance(text, str) else "".join(text))
    return None


def embed_figures(nb, img_dir: Path) -> int:
    """Turn every ``../img/NAME`` image of ``nb``'s Markdown cells into an attachment holding
    ``img_dir/NAME`` and refresh attachments already there from ``img_dir``; return how many
    cells changed. Raises FileNotFoundError, naming the cell, for a figure ``img_dir`` lacks."""
    changed = 0
    for number, cell in enumerate(nb.cells, 1):
        if cell.cell_type != "markdown":
            continue
        source = _source(cell)
        names = [m["name"] for m in IMG_REFERENCE.finditer(source)]
        names += [m["name"] for m in ATTACHMENT_REFERENCE.finditer(source)]
        if not names:
            continue
        attachments = {}
        for name in dict.fromkeys(names):
            path = img_dir / name
            if path.is_file():
                attachments[name] = _encoded(path)
            elif name in cell.get("attachments", {}):  # an attachment with no file: keep it
                attachments[name] = cell.attachments[name]
            else:
                raise FileNotFoundError(f"cell {number} ({cell.get('id', '?')}) shows {name}, "
                                        f"which {img_dir} does not hold")
        new_source = IMG_REFERENCE.sub(lambda m: f"![{m['alt']}](attachment:{m['name']})",
                                       source)
        if new_source != source or attachments != cell.get("attachments"):
            cell.source = new_source
            cell.attachments = attachments
            changed += 1
    return changed


def figure_problems(nb, img_dir: Path) -> list[str]:
    """What keeps ``nb``'s figures from showing when it is opened on its own, one line each:
    a reference to ``../img`` (or any ``img/`` path), an image attachment missing, or one that
    differs from the file in ``img_dir`` (``make figures`` fixes each)."""
    problems = []
    for number, cell in enumerate(nb.cells, 1):
        if cell.cell_type != "markdown":
            continue
        where = f"cell {number} ({cell.get('id', '?')})"
        source = _source(cell)
        if re.search(r"\.\./img/|\(img/|src=[\"']?img/", source):
            problems.append(f"{where}: refers to a file in img/, which a notebook opened on "
                            "its own cannot find")
        attachments = cell.get("attachments", {})
        for name in dict.fromkeys(m["name"] for m in ATTACHMENT_REFERENCE.finditer(source)):
            if name not in attachments:
                problems.append(f"{where}: shows attachment:{name} but has no such attachment")
            elif (img_dir / name).is_file() and \
                    _decoded(attachments[name]) != (img_dir / name).read_bytes():
                problems.append(f"{where}: its attachment {name} differs from img/{name}")
    return problems


def _first_code_cell(nb):
    return next((c for c in nb.cells if c.cell_type == "code"), None)


def has_guard(nb) -> bool:
    """Whether the first code cell of ``nb`` is the guard cell (:func:`add_guard`), up to date."""
    first = _first_code_cell(nb)
    return (first is not None and first.get("id") == GUARD_ID and _source(first) == GUARD
            and GUARD_TAG in first.metadata.get("tags", [])
            and first.metadata.get("jupyter", {}).get("source_hidden") is True)


def add_guard(nb) -> bool:
    """Make the first code cell of ``nb`` the guard cell: :data:`GUARD`, cell id
    :data:`GUARD_ID`, tagged :data:`GUARD_TAG` (the site leaves it out; Jupyter runs it and
    shows its source collapsed, :data:`GUARD_HIDDEN`). An existing guard cell is updated and
    moved first. Return whether ``nb`` changed."""
    if has_guard(nb):
        return False
    old = [c for c in nb.cells if c.get("id") == GUARD_ID]
    cell = old[0] if old else nbformat.v4.new_code_cell(GUARD)
    if old:
        nb.cells.remove(cell)
    cell.id = GUARD_ID
    if _source(cell) != GUARD:  # new code: its stored output and count no longer hold
        cell.source = GUARD
        cell.outputs, cell.execution_count = [], None
    tags = cell.metadata.setdefault("tags", [])
    if GUARD_TAG not in tags:
        tags.append(GUARD_TAG)
    cell.metadata.setdefault("jupyter", {}).update(GUARD_HIDDEN)
    first = _first_code_cell(nb)
    nb.cells.insert(nb.cells.index(first) if first is not None else len(nb.cells), cell)
    return True


def standalone_problems(nb, img_dir: Path) -> list[str]:
    """Everything that keeps ``nb`` from working on its own (:func:`figure_problems`, and a
    first code cell without :data:`GUARD`)."""
    problems = figure_problems(nb, img_dir)
    if not has_guard(nb):
        problems.append("its first code cell is not the package guard cell "
                        f"(id {GUARD_ID!r}, transformer_lab.course.standalone.GUARD)")
    return problems


def make_standalone(path: Path, img_dir: Path) -> bool:
    """Embed the figures of the notebook at ``path`` and guard its first cell, in place;
    return whether the file changed (an unchanged notebook is not rewritten)."""
    nb = nbformat.read(path, as_version=4)
    changed = bool(embed_figures(nb, img_dir)) | add_guard(nb)
    if changed:
        nbformat.validate(nb)
        nbformat.write(nb, path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=["notebooks"],
                        help="notebooks or folders of them (default: notebooks)")
    parser.add_argument("--img", type=Path, default=Path("img"),
                        help="the figures the notebooks show (default: img)")
    parser.add_argument("--check", action="store_true",
                        help="report what keeps each notebook from working on its own; change "
                             "nothing; exit status 1 if anything does")
    args = parser.parse_args(argv)
    from transformer_lab.course.execute import find_notebooks

    notebooks = find_notebooks(args.paths, Path("notebooks"))
    failed = 0
    for path in notebooks:
        if args.check:
            problems = standalone_problems(nbformat.read(path, as_version=4), args.img)
            failed += bool(problems)
            print(f"{path}: " + ("ok" if not problems else "\n  " + "\n  ".join(problems)))
        else:
            print(f"{path}: {'updated' if make_standalone(path, args.img) else 'up to date'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
