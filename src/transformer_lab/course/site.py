"""Build the static HTML course site from the executed notebooks.

    python -m transformer_lab.course.site    # build/notebooks/*.ipynb -> build/html/index.html

The site source is assembled in ``--src`` (``build/site/``: Sphinx configuration and landing page
from ``docs/``, the executed notebooks, ``img/``) and rendered by Sphinx with myst-nb, executing
nothing; :mod:`.sphinx_attachments` shows the figures notebooks carry as attachments. ``--src``
is emptied on each run and ``--out`` updated by Sphinx: each must be new, empty or written by
these tools (or, ``--out``, by Sphinx), and apart from the inputs; anything else is refused
before a file is touched.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from transformer_lab.course.assignment import OWNER_FILE, check_apart, fresh_output_dir, is_ours

#: What Sphinx writes into every HTML output folder.
SPHINX_BUILDINFO = ".buildinfo"


def assemble(docs: Path, executed: Path, img: Path, src: Path) -> list[Path]:
    """Copy the site's sources into ``src`` (emptied first); return the notebooks copied.

    Refuses (SystemExit) an ``src`` that overlaps ``docs``, ``executed`` or ``img``, or that is
    a non-empty folder this tool did not write, before anything is deleted or copied.
    """
    if not docs.is_dir():
        raise SystemExit(f"error: --docs must be the folder of the Sphinx configuration, "
                         f"{str(docs)!r} is not a folder")
    notebooks = sorted(executed.glob("*.ipynb"))
    if not notebooks:
        raise SystemExit(f"error: no executed notebooks in {executed}; run `make` first")
    fresh_output_dir(src, "--src", {"--docs": docs, "--executed": executed, "--img": img})
    shutil.copytree(docs, src, dirs_exist_ok=True)
    (src / "notebooks").mkdir(exist_ok=True)
    for nb in notebooks:
        shutil.copy2(nb, src / "notebooks" / nb.name)
    if img.is_dir():
        shutil.copytree(img, src / "img")
    return notebooks


def check_out(out: Path, inputs: dict[str, Path]) -> None:
    """Refuse an HTML output folder that overlaps an input, or that is a non-empty folder
    neither Sphinx nor this tool wrote. Writes nothing."""
    check_apart(out, "--out", inputs)
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise SystemExit(f"error: --out must be a folder, {str(out)!r} is not")
    if out.is_dir() and any(out.iterdir()) and not is_ours(out) \
            and not (out / SPHINX_BUILDINFO).is_file():
        raise SystemExit(f"error: --out {str(out)!r} is not empty and was not written by this "
                         "tool; name a new folder or empty it yourself")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=Path, default=Path("docs"),
                        help="Sphinx configuration and landing page (default: docs)")
    parser.add_argument("--executed", type=Path, default=Path("build/notebooks"),
                        help="the executed notebooks (default: build/notebooks)")
    parser.add_argument("--img", type=Path, default=Path("img"),
                        help="the figures the notebooks show (default: img)")
    parser.add_argument("--src", type=Path, default=Path("build/site"),
                        help="where the site source is assembled, emptied first "
                             "(default: build/site)")
    parser.add_argument("--out", type=Path, default=Path("build/html"),
                        help="the HTML site (default: build/html)")
    args = parser.parse_args(argv)

    inputs = {"--docs": args.docs, "--executed": args.executed, "--img": args.img}
    check_out(args.out, {**inputs, "--src": args.src})  # before --src is emptied
    notebooks = assemble(args.docs, args.executed, args.img, args.src)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / OWNER_FILE).write_text("This folder is rewritten by the course's tools "
                                       "(transformer_lab.course.site).\n")
    print(f"building the site from {len(notebooks)} executed notebooks ...", flush=True)
    from sphinx.cmd.build import build_main

    status = build_main(["-b", "html", "-q", str(args.src), str(args.out)])
    if status == 0:
        print(f"site: {args.out / 'index.html'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
