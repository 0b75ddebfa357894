"""The static figures in ``img/``, drawn by code so that anyone can redraw them.

    python -m transformer_lab.figures            # redraw every figure into img/
    python -m transformer_lab.figures --out DIR  # somewhere else (the tests compare bytes)

Each figure is one function ``draw_<name>(ax_or_fig)`` registered in :data:`FIGURES`. PNG files
are written without a timestamp or software tag, so redrawing gives the same bytes as long as
matplotlib and FreeType are the same versions (``make figures``; ``tests/test_figures.py``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # figures are files; never open a window

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

# Colours used for "forward" tensors and "gradient" tensors in every shape diagram.
FORWARD = "#4C72B0"
GRADIENT = "#DD8452"


def _matrix(ax, x: float, y: float, rows: int, cols: int, label: str, color: str,
            cell: float = 0.35) -> float:
    """Draw a rows x cols matrix with its top-left corner at (x, y); return its right edge."""
    w, h = cols * cell, rows * cell
    ax.add_patch(Rectangle((x, y - h), w, h, facecolor=color, alpha=0.25, edgecolor=color, lw=1.5))
    for r in range(1, rows):
        ax.plot([x, x + w], [y - r * cell] * 2, color=color, lw=0.4, alpha=0.6)
    for c in range(1, cols):
        ax.plot([x + c * cell] * 2, [y, y - h], color=color, lw=0.4, alpha=0.6)
    ax.text(x + w / 2, y - h / 2, label, ha="center", va="center", fontsize=12, weight="bold")
    ax.text(x + w / 2, y - h - 0.12, f"({rows}×{cols})", ha="center", va="top", fontsize=9)
    return x + w


def _equation(ax, y: float, terms: list[tuple], gap: float = 0.45) -> None:
    """Draw ``terms`` left to right; a term is an operator string or (rows, cols, label, color)."""
    x = 0.2
    for term in terms:
        if isinstance(term, str):
            ax.text(x + gap / 2, y - 0.5, term, ha="center", va="center", fontsize=16)
            x += gap
        else:
            x = _matrix(ax, x, y, *term)
            x += 0.1


def draw_matmul_gradient_shapes(fig) -> None:
    """Forward C = A B and the two backward products, drawn as matrices of their shapes."""
    n, k, m = 4, 3, 5
    ax = fig.add_subplot(1, 1, 1)
    rows = [
        ("forward", [(n, k, "A", FORWARD), "@", (k, m, "B", FORWARD), "=", (n, m, "C", FORWARD)]),
        ("backward to A", [(n, k, "dA", GRADIENT), "=", (n, m, "dC", GRADIENT), "@",
                           (m, k, "Bᵀ", FORWARD)]),
        ("backward to B", [(k, m, "dB", GRADIENT), "=", (k, n, "Aᵀ", FORWARD), "@",
                           (n, m, "dC", GRADIENT)]),
    ]
    y = 0.0
    for title, terms in rows:
        ax.text(-0.1, y - 0.5, title, ha="right", va="center", fontsize=10, style="italic")
        _equation(ax, y, terms)
        y -= 2.4
    ax.set_xlim(-2.3, 6.6)
    ax.set_ylim(y + 0.5, 0.4)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.suptitle("Shapes decide the backward pass of a matrix product", fontsize=11)


#: file name -> (drawing function, figure size in inches)
FIGURES: dict[str, tuple[Callable, tuple[float, float]]] = {
    "matmul_gradient_shapes.png": (draw_matmul_gradient_shapes, (7.5, 5.6)),
}


def draw(name: str, out_dir: Path) -> Path:
    """Draw the figure ``name`` (a key of :data:`FIGURES`) into ``out_dir``; return its path."""
    if name not in FIGURES:
        raise ValueError(f"name must be one of {sorted(FIGURES)}, got {name!r}")
    func, size = FIGURES[name]
    with plt.rc_context({"font.family": "DejaVu Sans", "svg.hashsalt": "transformer-lab"}):
        fig = plt.figure(figsize=size, dpi=100)
        func(fig)
        path = Path(out_dir) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100, metadata={"Software": None}, facecolor="white",
                    bbox_inches="tight", pad_inches=0.15)
        plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Redraw the course figures.")
    parser.add_argument("--out", type=Path, default=Path("img"), help="output folder (img)")
    parser.add_argument("names", nargs="*", help=f"figures to draw (default: all of {len(FIGURES)})")
    args = parser.parse_args(argv)
    for name in args.names or sorted(FIGURES):
        print(draw(name, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
