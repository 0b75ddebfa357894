"""Plots the notebooks share: attention heatmaps with token labels, masks, loss curves.

Every function draws into a matplotlib ``Axes`` (a new figure when none is given) and returns
what it drew into, so a notebook cell can add to it and end with ``plt.show()``.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np

from transformer_lab import _validate as v


def _labels(labels, n: int, name: str):
    if labels is None:
        return [str(i) for i in range(n)]
    labels = [str(x) for x in labels]
    if len(labels) != n:
        raise ValueError(f"{name} must have one label per row/column ({n}), got {len(labels)}")
    return labels


def attention_heatmap(weights, query_labels: Sequence | None = None,
                      key_labels: Sequence | None = None, ax=None, title: str | None = None,
                      annotate: bool | None = None, vmax: float | None = 1.0, cmap="viridis",
                      colorbar: bool = True):
    """Heatmap of one attention matrix: rows are queries, columns are keys.

    Args:
        weights: array of shape (T, S), e.g. attention weights (rows sum to one).
        query_labels: T row labels (tokens), default positions.
        key_labels: S column labels, default positions.
        ax: matplotlib Axes to draw into (default: a new figure).
        title: axes title.
        annotate: write the values into the cells (default: when the matrix is at most 10x10).
        vmax: top of the colour scale (None: the largest weight).
        colorbar: draw a colour bar beside the axes.

    Returns:
        The Axes.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 2:
        raise ValueError(f"weights must be a 2-D (queries, keys) array, got shape {w.shape}")
    t, s = w.shape
    ylab = _labels(query_labels, t, "query_labels")
    xlab = _labels(key_labels, s, "key_labels")
    if ax is None:
        _, ax = plt.subplots(figsize=(0.45 * s + 1.8, 0.45 * t + 1.2))
    im = ax.imshow(w, cmap=cmap, vmin=0.0, vmax=vmax, aspect="auto")
    ax.set_xticks(range(s), xlab, rotation=90 if max(map(len, xlab), default=0) > 2 else 0)
    ax.set_yticks(range(t), ylab)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title)
    if annotate if annotate is not None else (t <= 10 and s <= 10):
        top = vmax if vmax is not None else (w.max() if w.size else 1.0)
        for i in range(t):
            for j in range(s):
                ax.text(j, i, f"{w[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="black" if w[i, j] > 0.6 * top else "white")
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return ax


def attention_heads(weights, query_labels=None, key_labels=None, ncols: int = 2,
                    title: str | None = None, vmax: float | None = 1.0):
    """One heatmap per head, in a grid, each as large as :func:`attention_heatmap` draws a
    single matrix (cells of 0.45 inch, tick labels at full size), with one shared colour bar:
    readable on a screen and on the site, where a wide figure is scaled down to the column.

    Args:
        weights: array of shape (H, T, S).
        query_labels, key_labels: as for :func:`attention_heatmap`.
        ncols: heads per row of the grid (default 2: four heads make a 2 x 2 grid).
        title: the figure's title.
        vmax: top of the shared colour scale (None: the largest weight of any head).

    Returns:
        The Figure.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 3:
        raise ValueError(f"weights must be a (heads, queries, keys) array, got shape {w.shape}")
    h, t, s = w.shape
    ncols = min(v.positive_int(ncols, "ncols"), h)
    nrows = -(-h // ncols)
    top = vmax if vmax is not None else (float(w.max()) if w.size else 1.0)
    fig, axes = plt.subplots(nrows, ncols, figsize=(ncols * (0.45 * s + 1.3) + 0.8,
                                                    nrows * (0.45 * t + 1.2) + 0.4),
                             squeeze=False, layout="constrained")
    for k, ax in enumerate(axes.flat):
        if k < h:
            attention_heatmap(w[k], query_labels, key_labels, ax=ax, title=f"head {k}",
                              annotate=False, vmax=top, colorbar=False)
        else:
            ax.axis("off")
    fig.colorbar(axes.flat[0].images[0], ax=axes, shrink=min(1.0, 0.9 / nrows + 0.3),
                 label="attention weight")
    if title:
        fig.suptitle(title)
    return fig


def mask_heatmap(mask, query_labels=None, key_labels=None, ax=None, title: str | None = None):
    """Show a boolean mask (True = blocked, dark) or an additive float mask (-inf = blocked)."""
    m = np.asarray(mask)
    if m.ndim != 2:
        raise ValueError(f"mask must be a 2-D (queries, keys) array, got shape {m.shape}")
    blocked = m if m.dtype == bool else np.isneginf(m)
    t, s = m.shape
    if ax is None:
        _, ax = plt.subplots(figsize=(0.4 * s + 1.5, 0.4 * t + 1.0))
    ax.imshow(~blocked, cmap="gray", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(s), _labels(key_labels, s, "key_labels"))
    ax.set_yticks(range(t), _labels(query_labels, t, "query_labels"))
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    ax.set_title(title or "white = may attend, black = blocked")
    return ax


def loss_curves(curves: dict[str, Sequence[float]], ax=None, xlabel: str = "step",
                ylabel: str = "loss", log: bool = True, title: str | None = None):
    """Plot one or more curves (name -> values per step) on shared axes."""
    if not curves:
        raise ValueError("curves must contain at least one named sequence of values")
    if ax is None:
        _, ax = plt.subplots()
    for name, values in curves.items():
        ax.plot(np.arange(1, len(values) + 1), values, label=name)
    if log:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    if len(curves) > 1:
        ax.legend()
    return ax
