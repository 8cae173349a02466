"""The drawing primitives of the book's diagrams, shared by every ``figures_*`` module.

A diagram is drawn in data coordinates on axes without a frame (``canvas``, ``frame``): boxes
with a label in the middle (``box``), arrows between points or boxes (``arrow``), free text
(``label``), tables of unit cells (``cell_grid``) with their rows and columns named on the
axes (``grid_axes``), and legends of coloured patches (``patch_legend``). The figure modules
compose these into the chapters' pictures; none of them draws a box or an arrow of its own.

Also here: the colours of the parts of an encoder-decoder, the same in the figures of every
chapter that draws one.
"""

from __future__ import annotations

from typing import NamedTuple

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch, Rectangle

# Encoder states, decoder states, context vectors, tokens, attention (and four heads' colours).
ENC, DEC, CTX, TOK, ATT = "#cfe2f3", "#fce5cd", "#d9ead3", "#ffffff", "#ead1dc"


class Box(NamedTuple):
    """A box drawn by ``box``: its centre (x, y), width and height, in data coordinates."""

    x: float
    y: float
    w: float
    h: float

    @property
    def centre(self) -> tuple[float, float]:
        return self.x, self.y

    @property
    def left(self) -> float:
        return self.x - self.w / 2

    @property
    def right(self) -> float:
        return self.x + self.w / 2

    @property
    def bottom(self) -> float:
        return self.y - self.h / 2

    @property
    def top(self) -> float:
        return self.y + self.h / 2


def frame(ax, x_range=None, y_range=None, equal=True, border=False):
    """Ready `ax` for a diagram: its limits (a range from high to low turns the axis over), one
    data unit the same length across and up (`equal`), no ticks, and no frame unless `border`."""
    if x_range is not None:
        ax.set_xlim(*x_range)
    if y_range is not None:
        ax.set_ylim(*y_range)
    if equal:
        ax.set_aspect("equal")
    if border:
        ax.set_xticks([])
        ax.set_yticks([])
    else:
        ax.axis("off")
    return ax


def canvas(width, height, x_range=None, y_range=None, equal=True):
    """A new figure of width x height inches holding one diagram's axes (``frame``); (fig, ax)."""
    fig, ax = plt.subplots(figsize=(width, height))
    frame(ax, x_range, y_range, equal)
    return fig, ax


def box(ax, x, y, w, h, text="", color="white", *, edge="black", lw=1.0, ls="-", rounding=0.08, pad=0.02,
        fontsize=10, corner=False, alpha=None, hatch=None, zorder=None, **text_kw) -> Box:
    """A w x h box centred on (x, y), or with its lower-left corner there (`corner`), with `text`
    in its middle (`text_kw` styles it). `color` None leaves it unfilled. Corners are rounded
    with radius `rounding`, the outline drawn `pad` outside the box; `rounding` None or 0 draws
    a plain rectangle, exactly w x h. Returns the ``Box``."""
    if corner:
        x, y = x + w / 2, y + h / 2
    style = dict(facecolor=color, fill=color is not None, edgecolor=edge, lw=lw, ls=ls, alpha=alpha, hatch=hatch)
    if zorder is not None:
        style["zorder"] = zorder
    if rounding:
        ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle=f"round,pad={pad},rounding_size={rounding}",
                                    **style))
    else:
        ax.add_patch(Rectangle((x - w / 2, y - h / 2), w, h, **style))
    if text:
        label(ax, x, y, text, fontsize=fontsize, **text_kw)
    return Box(x, y, w, h)


def arrow(ax, start, end, *, color="black", lw=1.2, ls="-", rad=0.0, shrink=0.0, head=10, style="-|>", **kw):
    """An arrow from `start` to `end`, points or boxes (a box stands for its centre), bent by `rad`
    (0: straight), stopping `shrink` points short of each end, its head `head` points long."""
    start = start.centre if isinstance(start, Box) else start
    end = end.centre if isinstance(end, Box) else end
    patch = FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=head, color=color, lw=lw, ls=ls,
                            shrinkA=shrink, shrinkB=shrink, connectionstyle=f"arc3,rad={rad}", **kw)
    ax.add_patch(patch)
    return patch


def label(ax, x, y, text, fontsize=9, ha="center", va="center", **kw):
    """Text at (x, y), centred on it unless `ha` and `va` say otherwise."""
    return ax.text(x, y, text, ha=ha, va=va, fontsize=fontsize, **kw)


def cell_grid(ax, left, top, colors, labels=None, *, edge="black", lw=0.8, fontsize=8, hatches=None):
    """A table of unit cells, row r and column c spanning [left + c, left + c + 1] across and
    [top - r - 1, top - r] up (row 0 on top): each filled with colors[r][c], with labels[r][c] and
    hatches[r][c] where given."""
    for r, row in enumerate(colors):
        for c, color in enumerate(row):
            box(ax, left + c, top - r - 1, 1, 1, labels[r][c] if labels else "", color, edge=edge, lw=lw,
                rounding=None, fontsize=fontsize, corner=True, hatch=hatches[r][c] if hatches else None)


def grid_axes(ax, row_names, col_names, xlabel, ylabel, *, fontsize=None, label_size=None, marks=True,
              lines=None):
    """Axes around a table of cells drawn by ``cell_grid`` from (0, 0): its limits, rows named
    down the left and columns along the bottom at their centres, and the axes' labels. Without
    `marks` the ticks have no marks; with `lines` (a colour) thin lines part the cells."""
    n_rows, n_cols = len(row_names), len(col_names)
    ax.set_xlim(0, n_cols)
    ax.set_ylim(-n_rows, 0)
    ax.set_aspect("equal")
    ax.set_xticks([c + 0.5 for c in range(n_cols)], col_names, fontsize=fontsize)
    ax.set_yticks([-r - 0.5 for r in range(n_rows)], row_names, fontsize=fontsize)
    if not marks:
        ax.tick_params(length=0)
    ax.set_xlabel(xlabel, fontsize=label_size)
    ax.set_ylabel(ylabel, fontsize=label_size)
    ax.grid(False)
    if lines is not None:
        for c in range(n_cols + 1):
            ax.axvline(c, color=lines, lw=0.6)
        for r in range(n_rows + 1):
            ax.axhline(-r, color=lines, lw=0.6)


def patch_legend(ax, entries, **kw):
    """A legend without a frame of (text, patch style) entries, each shown as a small patch drawn
    with that style (facecolor, edgecolor, hatch, ...); `kw` places it, as ``ax.legend``'s."""
    handles = [Patch(label=text, **style) for text, style in entries]
    return ax.legend(handles=handles, **{"frameon": False, **kw})
