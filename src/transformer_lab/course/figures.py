"""The static figures in ``img/``, drawn by code so that anyone can redraw them.

    python -m transformer_lab.course.figures            # redraw every figure into img/
    python -m transformer_lab.course.figures --out DIR  # somewhere else (the tests compare bytes)

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

#: The matplotlib that drew the committed img/ (requirements.txt's pin for Python 3.11 and
#: newer). Other versions draw the same figures with other bytes (Python 3.10 gets 3.10.x).
MATPLOTLIB_OF_IMG = "3.11.2"

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


def _equations(ax, rows: list[tuple[str, list]], title_y: float,
               step: float | None = None) -> float:
    """Draw each (title, terms) row of ``rows`` under the last, ``step`` apart (or as tall as its
    tallest matrix, and room for the shape labels); return the y below the last."""
    y = 0.0
    for title, terms in rows:
        ax.text(-0.1, y - title_y, title, ha="right", va="center", fontsize=10, style="italic")
        _equation(ax, y, terms)
        y -= step or max(term[0] for term in terms if not isinstance(term, str)) * 0.35 + 0.75
    return y


def _frame(ax, xlim: tuple[float, float], ylim: tuple[float, float]) -> None:
    """The shape diagrams' axes: these limits, equal scales, no frame."""
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_aspect("equal")
    ax.axis("off")


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
    y = _equations(ax, rows, 0.5, step=2.4)
    _frame(ax, (-2.3, 6.6), (y + 0.5, 0.4))
    fig.suptitle("Shapes decide the backward pass of a matrix product", fontsize=11)


def draw_qkv_projections(fig) -> None:
    """Self-attention as shapes: three projections of X, the scores Z, the weighted average.
    (Z, the course's letter for scores: S is the number of keys. Here Z = Q K^T before the
    scale, and the weights A = softmax(Z / sqrt(d_k)); notebook 05 folds the scale into Z.)"""
    weight = "#55A868"  # weights in green, activations in the forward colour
    t, d, dk, dv = 4, 5, 3, 3
    x = (t, d, "X", FORWARD)
    ax = fig.add_subplot(1, 1, 1)
    rows = [
        ("queries", [x, "@", (d, dk, "W_Q", weight), "=", (t, dk, "Q", FORWARD)]),
        ("keys", [x, "@", (d, dk, "W_K", weight), "=", (t, dk, "K", FORWARD)]),
        ("values", [x, "@", (d, dv, "W_V", weight), "=", (t, dv, "V", FORWARD)]),
        ("scores", [(t, dk, "Q", FORWARD), "@", (dk, t, "Kᵀ", FORWARD), "=", (t, t, "Z", FORWARD)]),
        ("output", [(t, t, "A", FORWARD), "@", (t, dv, "V", FORWARD), "=",
                    (t, dv, "out", FORWARD)]),
    ]
    y = _equations(ax, rows, 0.7)
    ax.text(0.2, y - 0.1, "A = softmax(Z / √dₖ), row by row:  every row of A sums to 1",
            ha="left", va="center", fontsize=10)
    _frame(ax, (-1.6, 7.0), (y - 0.4, 0.3))
    ax.set_title("Self-attention in shapes (T = 4 tokens, d_model = 5, dₖ = dᵥ = 3)", fontsize=11)


def _stacked_matrices(ax, x: float, y: float, depth: int, rows: int, cols: int, label: str,
                      color: str, shape: str, cell: float = 0.3, shift: float = 0.18) -> float:
    """Draw ``depth`` rows x cols matrices stacked front to back (a 3-D array, batch axis in
    depth) with the front one's top-left corner at (x, y); write ``shape`` below; return the
    right edge of the front matrix."""
    w, h = cols * cell, rows * cell
    for k in reversed(range(depth)):
        x0, y0 = x + k * shift, y + k * shift
        ax.add_patch(Rectangle((x0, y0 - h), w, h, facecolor="white", edgecolor=color, lw=1.2,
                               zorder=2 * (depth - k)))
        ax.add_patch(Rectangle((x0, y0 - h), w, h, facecolor=color, alpha=0.25 if k == 0 else 0.12,
                               edgecolor=color, lw=1.2, zorder=2 * (depth - k) + 1))
        if k == 0:
            for r in range(1, rows):
                ax.plot([x0, x0 + w], [y0 - r * cell] * 2, color=color, lw=0.4, alpha=0.6,
                        zorder=2 * depth + 2)
            for c in range(1, cols):
                ax.plot([x0 + c * cell] * 2, [y0, y0 - h], color=color, lw=0.4, alpha=0.6,
                        zorder=2 * depth + 2)
    ax.text(x + w / 2, y - h / 2, label, ha="center", va="center", fontsize=12, weight="bold",
            zorder=3 * depth + 5)
    ax.text(x + w / 2, y - h - 0.12, shape, ha="center", va="top", fontsize=9)
    return x + w


def draw_batched_matmul_shapes(fig) -> None:
    """Batched matrix products in shapes: a weight broadcast over the batch, a batched product
    pairing sequence b with sequence b, and the reshape trick (one tall matrix, one product)."""
    weight = "#55A868"
    b, t, d, e, s = 3, 4, 3, 5, 4
    ax = fig.add_subplot(1, 1, 1)

    def op(x, y, text):
        ax.text(x + 0.25, y, text, ha="center", va="center", fontsize=16)
        return x + 0.5

    # Row 1: (B,T,D) @ (D,E) -> (B,T,E); row 2: (B,T,D) @ (B,D,S) -> (B,T,S)
    for y, title, operands, note, note_x in (
            (0.0, "weight broadcast\nover the batch",
             [(b, t, d, "X", FORWARD, "(B, T, D)"), (1, d, e, "W", weight, "(D, E)"),
              (b, t, e, "Y", FORWARD, "(B, T, E)")], "the same W for\nevery sequence b", 3.3),
            (-2.5, "batched product:\nb pairs with b",
             [(b, t, d, "Q", FORWARD, "(B, T, D)"), (b, d, s, "Kᵀ", FORWARD, "(B, D, S)"),
              (b, t, s, "scores", FORWARD, "(B, T, S)")], "B independent\nmatrix products", 2.0)):
        ax.text(-0.2, y - 0.6, title, ha="right", va="center", fontsize=9.5, style="italic")
        x = 0.0
        for sign, (depth, *matrix) in zip("@=", operands[:2], strict=True):
            x = _stacked_matrices(ax, x, y, depth, *matrix)
            x = op(x + 0.05 + (depth - 1) * 0.18, y - t * 0.15, sign)
        _stacked_matrices(ax, x, y, *operands[2])
        ax.text(x + note_x, y - 0.45, note, ha="left", va="center", fontsize=9)

    # Row 3: the reshape trick: (B*T, D) @ (D, E)
    y = -5.0
    ax.text(-0.2, y - 1.6, "reshape trick:\nX.reshape(-1, D) @ W\none big product", ha="right",
            va="center", fontsize=9.5, style="italic")
    cell = 0.3

    def tall(x, cols, label, shape):  # the B sequences one under the other: a (B*T, .) matrix
        for k in range(b):
            _stacked_matrices(ax, x, y - k * t * cell, 1, t, cols, "", FORWARD, "")
        ax.text(x + cols * cell / 2, y - b * t * cell / 2, label, ha="center", va="center",
                fontsize=12, weight="bold", zorder=20)
        ax.text(x + cols * cell / 2, y - b * t * cell - 0.12, shape, ha="center", va="top",
                fontsize=9)

    tall(0.0, d, "X", "(B·T, D)")
    x = op(0.0 + d * cell + 0.05, y - b * t * cell / 2, "@")
    x = _stacked_matrices(ax, x, y, 1, d, e, "W", weight, "(D, E)")
    x = op(x + 0.05, y - b * t * cell / 2, "=")
    tall(x, e, "Y", "(B·T, E)")
    _frame(ax, (-2.6, 8.4), (y - b * t * cell - 0.6, 0.9))
    fig.suptitle("Batched matrix products: the last two axes multiply, leading axes broadcast",
                 fontsize=11)


def draw_head_split_shapes(fig) -> None:
    """Splitting E features into h heads of d_h = E/h: (B,T,E) -> reshape (B,T,h,d_h) ->
    transpose (B,h,T,d_h), drawn for one sequence of the batch, one colour per head."""
    heads = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"]
    t, h, dh = 5, 4, 2
    cell = 0.3
    ax = fig.add_subplot(1, 1, 1)

    def block(x, y, rows, cols, color, label="", alpha=0.3):
        w, hh = cols * cell, rows * cell
        ax.add_patch(Rectangle((x, y - hh), w, hh, facecolor=color, alpha=alpha, edgecolor=color,
                               lw=1.2))
        for r in range(1, rows):
            ax.plot([x, x + w], [y - r * cell] * 2, color=color, lw=0.4, alpha=0.7)
        for c in range(1, cols):
            ax.plot([x + c * cell] * 2, [y, y - hh], color=color, lw=0.4, alpha=0.7)
        if label:
            ax.text(x + w / 2, y - hh / 2, label, ha="center", va="center", fontsize=9,
                    weight="bold")

    top = 0.0
    # Panel 1: (T, E), the columns coloured by the head they will belong to.
    x = 0.0
    for k in range(h):
        block(x + k * dh * cell, top, t, dh, heads[k])
    ax.text(x + h * dh * cell / 2, top + 0.35, "(B, T, E)", ha="center", fontsize=10,
            weight="bold")
    ax.text(x + h * dh * cell / 2, top - t * cell - 0.2, "E = h · dₕ features\n"
            "(one sequence shown)", ha="center", va="top", fontsize=8.5)
    ax.annotate("", xy=(x + h * dh * cell + 1.05, top - t * cell / 2),
                xytext=(x + h * dh * cell + 0.15, top - t * cell / 2),
                arrowprops={"arrowstyle": "->", "lw": 1.3})
    ax.text(x + h * dh * cell + 0.6, top - t * cell / 2 + 0.15, "reshape", ha="center",
            va="bottom", fontsize=9)

    # Panel 2: (T, h, d_h): the same memory, the feature axis cut into h groups.
    x = h * dh * cell + 1.2
    gap = 0.12
    for k in range(h):
        block(x + k * (dh * cell + gap), top, t, dh, heads[k], f"{k}")
    w2 = h * dh * cell + (h - 1) * gap
    ax.text(x + w2 / 2, top + 0.35, "(B, T, h, dₕ)", ha="center", fontsize=10, weight="bold")
    ax.text(x + w2 / 2, top - t * cell - 0.2, "no data moves:\na view of the same array",
            ha="center", va="top", fontsize=8.5)
    ax.annotate("", xy=(x + w2 + 1.35, top - t * cell / 2), xytext=(x + w2 + 0.15,
                top - t * cell / 2), arrowprops={"arrowstyle": "->", "lw": 1.3})
    ax.text(x + w2 + 0.75, top - t * cell / 2 + 0.15, "swap axes\n1 and 2", ha="center",
            va="bottom", fontsize=9)

    # Panel 3: (h, T, d_h): one (T, d_h) matrix per head, stacked along the head axis.
    x = x + w2 + 1.5
    shift = 0.28
    for k in reversed(range(h)):
        x0, y0 = x + k * shift, top + k * shift
        ax.add_patch(Rectangle((x0, y0 - t * cell), dh * cell, t * cell, facecolor="white",
                               edgecolor=heads[k], lw=1.2))
        block(x0, y0, t, dh, heads[k], alpha=0.35)
        ax.text(x + (h - 1) * shift + dh * cell + 0.12, y0 - 0.14, f"head {k}", ha="left",
                va="center", fontsize=8, color=heads[k], weight="bold")
    ax.text(x + dh * cell / 2 + (h - 1) * shift / 2, top + 0.35 + (h - 1) * shift,
            "(B, h, T, dₕ)", ha="center", fontsize=10, weight="bold")
    ax.text(x + dh * cell / 2 + 0.4, top - t * cell - 0.2, "h independent\n(T, dₕ) matrices:\n"
            "attention runs\nper (b, head)", ha="center", va="top", fontsize=8.5)
    _frame(ax, (-0.3, x + dh * cell + h * shift + 1.2),
           (top - t * cell - 1.4, top + 0.6 + h * shift))
    fig.suptitle("Splitting into heads: reshape, then move the head axis before time",
                 fontsize=11)


def draw_transformer_architecture(fig) -> None:
    """The encoder-decoder as the course builds it (pre-norm), bottom to top, with shapes."""
    from matplotlib.patches import FancyBboxPatch

    ax = fig.add_subplot(1, 1, 1)
    enc_c, dec_c = "#4C72B0", "#DD8452"

    def box(xc, y, w, h, text, color, alpha=0.18, size=9.5, weight="normal"):
        ax.add_patch(FancyBboxPatch((xc - w / 2, y), w, h,
                                    boxstyle="round,pad=0.02,rounding_size=0.12",
                                    facecolor=color, alpha=alpha, edgecolor=color, lw=1.4))
        ax.text(xc, y + h / 2, text, ha="center", va="center", fontsize=size, weight=weight)

    def arrow(x0, y0, x1, y1, color="black"):
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                    arrowprops=dict(arrowstyle="-|>", color=color, lw=1.3, shrinkA=0, shrinkB=0))

    w = 4.2

    def column_start(x, ids, axis, color, layer_height):
        """The token ids, their embedding, and the dashed frame of the stacked layers."""
        box(x, 0.0, w, 0.55, f"{ids}: token ids  (B, {axis})", "gray", 0.12)
        arrow(x, 0.55, x, 0.85)
        box(x, 0.85, w, 0.75, f"token embedding × √E\n+ positional encoding   (B, {axis}, E)",
            color)
        arrow(x, 1.6, x, 2.0)
        ax.add_patch(FancyBboxPatch((x - w / 2 - 0.15, 2.0), w + 0.3, layer_height,
                                    boxstyle="round,pad=0.02,rounding_size=0.15",
                                    facecolor="none", edgecolor=color, lw=1.6, ls="--"))

    def column_end(x, name, color, top):
        """The name of the layer under the top ``top`` of its frame, then the final LN."""
        ax.text(x, top - 0.25, name, ha="center", va="center", fontsize=9, style="italic",
                color=color)
        arrow(x, top, x, top + 0.35)
        box(x, top + 0.35, w, 0.55, "LN", color)

    # encoder, left column
    xe = 2.3
    column_start(xe, "src", "S", enc_c, 2.6)
    box(xe, 2.25, w - 0.3, 0.85, "x + SelfAttention(LN(x))\nkeys: no source padding", enc_c)
    arrow(xe, 3.1, xe, 3.45)
    box(xe, 3.45, w - 0.3, 0.7, "x + FFN(LN(x))", enc_c)
    ax.text(xe - w / 2 - 0.3, 3.3, "N ×", ha="right", va="center", fontsize=12, weight="bold",
            color=enc_c)
    column_end(xe, "encoder layer", enc_c, 4.6)
    arrow(xe, 5.5, xe, 5.85)
    box(xe, 5.85, w, 0.6, "memory  (B, S, E)", enc_c, 0.35, weight="bold")

    # decoder, right column
    xd = 8.1
    column_start(xd, "tgt[:, :-1]", "T", dec_c, 3.65)
    box(xd, 2.25, w - 0.3, 0.85, "z + SelfAttention(LN(z))\ncausal mask + target padding",
        dec_c)
    arrow(xd, 3.1, xd, 3.35)
    box(xd, 3.35, w - 0.3, 0.85, "z + CrossAttention(LN(z), memory)\nkeys: no source padding",
        dec_c)
    arrow(xd, 4.2, xd, 4.45)
    box(xd, 4.45, w - 0.3, 0.7, "z + FFN(LN(z))", dec_c)
    ax.text(xd + w / 2 + 0.3, 3.8, "× N", ha="left", va="center", fontsize=12, weight="bold",
            color=dec_c)
    column_end(xd, "decoder layer", dec_c, 5.65)
    arrow(xd, 6.55, xd, 6.9)
    box(xd, 6.9, w, 0.75, "output projection  W_out, b_out\nlogits  (B, T, V_tgt)", dec_c)
    arrow(xd, 7.65, xd, 8.0)
    box(xd, 8.0, w, 0.75, "loss: cross-entropy with labels tgt[:, 1:]\n(padding skipped)",
        "gray", 0.12)

    # the memory feeds the cross-attention of every decoder layer
    xm = (xe + xd) / 2
    ax.plot([xe + w / 2, xm, xm], [6.15, 6.15, 3.775], color=enc_c, lw=1.6)
    arrow(xm, 3.775, xd - (w - 0.3) / 2, 3.775, enc_c)
    ax.text(xm + 0.1, 5.0, "memory to\nevery\ndecoder\nlayer", ha="left", va="center", fontsize=8,
            color=enc_c)
    ax.text(0.2, 8.1, "Drawn pre-norm: x + f(LN(x))\n(norm_first=True, our default).\n"
            "Post-norm (the paper): LN(x + f(x)).\nz: the decoder's stream.", ha="left",
            va="center", fontsize=9, linespacing=1.4)
    ax.set_xlim(-0.5, 10.9)
    ax.set_ylim(-0.2, 9.0)
    ax.axis("off")
    fig.suptitle("The encoder-decoder Transformer, as notebooks 07 and 08 build it", fontsize=11)


#: file name -> (drawing function, figure size in inches)
FIGURES: dict[str, tuple[Callable, tuple[float, float]]] = {
    "transformer_architecture.png": (draw_transformer_architecture, (9.0, 7.5)),
    "batched_matmul_shapes.png": (draw_batched_matmul_shapes, (8.0, 7.0)),
    "head_split_shapes.png": (draw_head_split_shapes, (8.5, 3.4)),
    "qkv_projections.png": (draw_qkv_projections, (6.5, 9.0)),
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
    parser.add_argument("names", nargs="*",
                        help=f"figures to draw (default: all of {len(FIGURES)})")
    args = parser.parse_args(argv)
    for name in args.names or sorted(FIGURES):
        print(draw(name, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
