"""Diagrams for chapter 02, drawn with matplotlib when the book builds.

``shifted_alignment`` draws what the chapter first says in words: a decoder with
attention that reverses its input, over a left-to-right encoder, reads the encoder state
one column to the right of the mirrored position, and why that state is the one to read.
Hand-written, with the primitives of ``drawing``; the page shows the figure.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from .drawing import DEC, ENC, TOK, arrow, box, frame, grid_axes, label, patch_legend

WANTED, KNOWN, READ = "tab:orange", "tab:green", "tab:blue"


def draw_alignment_grid(ax, length):
    """The attention map in outline: mirrored cells dashed, the cells read filled.

    Cell (t, j), decoder step t and encoder position j, spans [j, j + 1] across and
    [-t - 1, -t] up (``drawing.cell_grid``'s layout): step 0 on top.
    """
    for t in range(length):
        mirrored = length - 1 - t
        read = mirrored if t == 0 else mirrored + 1
        row = -t - 0.5
        box(ax, mirrored + 0.5, row, 1, 1, color=None, edge=WANTED, lw=1.6, ls="--", rounding=None)
        box(ax, read + 0.5, row, 0.9, 0.9, color=READ, alpha=0.75, edge="none", rounding=None)
        if t > 0:  # one column to the right of the mirrored cell
            arrow(ax, (mirrored + 0.35, row), (read + 0.45, row), shrink=2, zorder=3)
    grid_axes(ax, [f"t = {t}" for t in range(length)], [f"$h_{j}$" for j in range(length)],
              "encoder position j", "decoder step t", lines="#dddddd")
    patch_legend(ax, [("mirrored: $x_{S-1-t}$ is written", dict(fill=False, edgecolor=WANTED, ls="--", lw=1.6)),
                      ("largest weight", dict(facecolor=READ, alpha=0.75))],
                 loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=8, ncol=2)
    ax.set_title("Where the weights sit", fontsize=10)


def draw_one_step(ax, length, step):
    """One decoder step over the encoder: the wanted token, the known one, the state read."""
    wanted, known = length - 1 - step, length - step
    frame(ax, (-0.9, 1.2 * length - 0.2), (-2.0, 2.75))
    xs = [1.2 * j for j in range(length)]
    for j, x in enumerate(xs):
        colour = {wanted: WANTED, known: KNOWN}.get(j, "black")
        box(ax, x, -0.6, 0.8, 0.45, f"$x_{j}$", TOK, fontsize=9, edge=colour, lw=2.2 if colour != "black" else 0.8)
        arrow(ax, (x, -0.37), (x, 0.05), lw=0.8, shrink=1)
        box(ax, x, 0.35, 0.8, 0.55, f"$h_{j}$", ENC, fontsize=9, edge=READ if j == known else "grey",
            lw=2.6 if j == known else 0.8)
    for a, b in zip(xs, xs[1:]):
        arrow(ax, (a + 0.4, 0.35), (b - 0.4, 0.35), lw=0.8)
    # What the state read has seen: x_0 ... x_known, the known token last.
    ax.plot([xs[0] - 0.4, xs[known] + 0.4], [-1.05, -1.05], color=READ, lw=1.5)
    label(ax, (xs[0] + xs[known]) / 2, -1.35, f"$h_{known}$ has read $x_0, \\dots, x_{known}$", fontsize=8,
          va="top", color=READ)
    box(ax, xs[known], 2.25, 2.6, 0.5, f"step t = {step}: write $x_{wanted}$", DEC, fontsize=8)
    arrow(ax, (xs[known], 0.65), (xs[known], 2.0), color=READ, lw=2.0, shrink=1)
    label(ax, xs[wanted] - 0.3, 1.35, f"wanted:\n$x_{{S-1-t}} = x_{wanted}$", fontsize=8, ha="right", color=WANTED)
    arrow(ax, (xs[wanted] - 0.3, 1.1), (xs[wanted] - 0.1, -0.35), color=WANTED, ls="--", lw=1.0, rad=0.3, shrink=1)
    label(ax, xs[known] + 0.5, 1.2, f"read $h_{{S-t}} = h_{known}$:\nits newest token, $x_{known}$, was\n"
          f"written at step {step - 1}", fontsize=8, ha="left", color=READ)
    ax.set_title(f"Step t = {step} of a reversal of S = {length} tokens", fontsize=10)


def shifted_alignment(length=6, step=2):
    """Chapter 02's "one column to the right", drawn: the map in outline, and one step."""
    if not 0 < step < length:
        raise ValueError("step must be a later step, 0 < step < length")
    fig, (grid, one) = plt.subplots(2, 1, figsize=(6.4, 7.6), gridspec_kw={"height_ratios": [1.15, 1]})
    draw_alignment_grid(grid, length)
    draw_one_step(one, length, step)
    fig.tight_layout()
    return fig
