"""Diagrams for chapter 02, drawn with matplotlib when the book builds.

``shifted_alignment`` draws what the chapter first says in words: a decoder with
attention that reverses its input, over a left-to-right encoder, reads the encoder state
one column to the right of the mirrored position, and why that state is the one to read.
Hand-written, with the primitives of ``figures_seq2seq``; the page shows the figure.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from .figures_seq2seq import DEC, ENC, TOK, arrow, box

WANTED, KNOWN, READ = "tab:orange", "tab:green", "tab:blue"


def draw_alignment_grid(ax, length):
    """The attention map in outline: mirrored cells dashed, the cells read filled."""
    for t in range(length):
        mirrored = length - 1 - t
        read = mirrored if t == 0 else mirrored + 1
        ax.add_patch(Rectangle((mirrored - 0.5, t - 0.5), 1, 1, fill=False, edgecolor=WANTED, lw=1.6, ls="--"))
        ax.add_patch(Rectangle((read - 0.45, t - 0.45), 0.9, 0.9, facecolor=READ, alpha=0.75, edgecolor="none"))
        if t > 0:  # one column to the right of the mirrored cell
            ax.annotate("", xy=(read - 0.05, t), xytext=(mirrored - 0.15, t),
                        arrowprops=dict(arrowstyle="-|>", color="black", lw=1.2))
    ax.set_xlim(-0.5, length - 0.5)
    ax.set_ylim(length - 0.5, -0.5)
    ax.set_xticks(range(length), [f"$h_{j}$" for j in range(length)])
    ax.set_yticks(range(length), [f"t = {t}" for t in range(length)])
    ax.set_xlabel("encoder position j")
    ax.set_ylabel("decoder step t")
    ax.set_aspect("equal")
    ax.grid(False)
    for j in range(length + 1):
        ax.axvline(j - 0.5, color="#dddddd", lw=0.6)
        ax.axhline(j - 0.5, color="#dddddd", lw=0.6)
    handles = [Rectangle((0, 0), 1, 1, fill=False, edgecolor=WANTED, ls="--", lw=1.6),
               Rectangle((0, 0), 1, 1, facecolor=READ, alpha=0.75)]
    ax.legend(handles, ["mirrored: $x_{S-1-t}$ is written", "largest weight"],
              loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=8, ncol=2, frameon=False)
    ax.set_title("Where the weights sit", fontsize=10)


def draw_one_step(ax, length, step):
    """One decoder step over the encoder: the wanted token, the known one, the state read."""
    wanted, known = length - 1 - step, length - step
    ax.set_xlim(-0.9, 1.2 * length - 0.2)
    ax.set_ylim(-2.0, 2.75)
    ax.set_aspect("equal")
    ax.axis("off")
    xs = [1.2 * j for j in range(length)]
    for j, x in enumerate(xs):
        colour = {wanted: WANTED, known: KNOWN}.get(j, "black")
        box(ax, x, -0.6, f"$x_{j}$", TOK, w=0.8, h=0.45, fontsize=9, edge=colour, lw=2.2 if colour != "black" else 0.8)
        arrow(ax, (x, -0.37), (x, 0.05), lw=0.8, shrink=1)
        box(ax, x, 0.35, f"$h_{j}$", ENC, w=0.8, h=0.55, fontsize=9, edge=READ if j == known else "grey",
            lw=2.6 if j == known else 0.8)
    for a, b in zip(xs, xs[1:]):
        arrow(ax, (a + 0.4, 0.35), (b - 0.4, 0.35), lw=0.8, shrink=0)
    # What the state read has seen: x_0 ... x_known, the known token last.
    ax.plot([xs[0] - 0.4, xs[known] + 0.4], [-1.05, -1.05], color=READ, lw=1.5)
    ax.text((xs[0] + xs[known]) / 2, -1.35, f"$h_{known}$ has read $x_0, \\dots, x_{known}$", ha="center",
            va="top", fontsize=8, color=READ)
    box(ax, xs[known], 2.25, f"step t = {step}: write $x_{wanted}$", DEC, w=2.6, h=0.5, fontsize=8)
    arrow(ax, (xs[known], 0.65), (xs[known], 2.0), color=READ, lw=2.0, shrink=1)
    ax.text(xs[wanted] - 0.3, 1.35, f"wanted:\n$x_{{S-1-t}} = x_{wanted}$", ha="right", va="center",
            fontsize=8, color=WANTED)
    arrow(ax, (xs[wanted] - 0.3, 1.1), (xs[wanted] - 0.1, -0.35), color=WANTED, ls="--", lw=1.0, rad=0.3, shrink=1)
    ax.text(xs[known] + 0.5, 1.2, f"read $h_{{S-t}} = h_{known}$:\nits newest token, $x_{known}$, was\n"
            f"written at step {step - 1}", ha="left", va="center", fontsize=8, color=READ)
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
