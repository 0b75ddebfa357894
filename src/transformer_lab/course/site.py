"""Build the static HTML course site from the executed notebooks.

    python -m transformer_lab.course.site    # build/notebooks/*.ipynb -> build/html/index.html

The site source is assembled in ``build/site/`` (Sphinx configuration and landing page from
``docs/``, executed notebooks from ``build/notebooks/``, figures from ``img/``) and rendered by
Sphinx with myst-nb, without executing anything and without a network.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path


def assemble(docs: Path, executed: Path, img: Path, src: Path) -> list[Path]:
    """Copy the site's sources into ``src`` (emptied first); return the notebooks copied."""
    notebooks = sorted(executed.glob("*.ipynb"))
    if not notebooks:
        raise SystemExit(f"error: no executed notebooks in {executed}; run `make` first")
    if src.exists():
        shutil.rmtree(src)
    shutil.copytree(docs, src)
    (src / "notebooks").mkdir()
    for nb in notebooks:
        shutil.copy2(nb, src / "notebooks" / nb.name)
    if img.is_dir():
        shutil.copytree(img, src / "img")
    return notebooks


def build(src: Path, out: Path) -> int:
    from sphinx.cmd.build import build_main

    return build_main(["-b", "html", "-q", str(src), str(out)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=Path, default=Path("docs"))
    parser.add_argument("--executed", type=Path, default=Path("build/notebooks"))
    parser.add_argument("--img", type=Path, default=Path("img"))
    parser.add_argument("--src", type=Path, default=Path("build/site"))
    parser.add_argument("--out", type=Path, default=Path("build/html"))
    args = parser.parse_args(argv)

    notebooks = assemble(args.docs, args.executed, args.img, args.src)
    print(f"building the site from {len(notebooks)} executed notebooks ...", flush=True)
    status = build(args.src, args.out)
    if status == 0:
        print(f"site: {args.out / 'index.html'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
