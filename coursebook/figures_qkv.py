"""Diagram for chapter 03: scaled dot-product attention as a computation graph.

Drawn with matplotlib when the book builds, in the spirit of Figure 2 of the original
Transformer paper but our own drawing: five steps from Q, K and V to the output, with
the shape of every tensor that flows between them.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch


def graph_box(ax, x, y, text, colour, w=2.6, h=0.8):
    """Draw one rounded box centred at (x, y) and return its centre."""
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.08",
                                fc=colour, ec="0.3", lw=1.2))
    ax.text(x, y, text, ha="center", va="center", fontsize=11)
    return x, y


def graph_arrow(ax, start, end, h=0.8):
    """Arrow from the top of the box at `start` to the bottom of the box at `end`."""
    ax.annotate("", xy=(end[0], end[1] - h / 2 - 0.08), xytext=(start[0], start[1] + h / 2 + 0.08),
                arrowprops=dict(arrowstyle="-|>", color="0.2", lw=1.3))


def attention_graph():
    """MatMul, Scale, Mask, SoftMax, MatMul: the formula as boxes and arrows. Returns the figure."""
    fig, ax = plt.subplots(figsize=(6.2, 5.8))
    ax.set_xlim(0, 10.2)
    ax.set_ylim(-0.4, 11)
    ax.axis("off")
    q_box = graph_box(ax, 2.0, 0.8, "Q", "white", w=1.0)
    k_box = graph_box(ax, 4.0, 0.8, "K", "white", w=1.0)
    v_box = graph_box(ax, 9.2, 0.8, "V", "white", w=1.0)
    scores_box = graph_box(ax, 3.0, 2.6, "MatMul", "#c9e4f6")
    scale_box = graph_box(ax, 3.0, 4.2, "Scale", "#f7e3b5")
    mask_box = graph_box(ax, 3.0, 5.8, "Mask (opt.)", "#eecfe3")
    softmax_box = graph_box(ax, 3.0, 7.4, "SoftMax", "#cdebc5")
    output_box = graph_box(ax, 5.0, 9.2, "MatMul", "#c9e4f6")
    for start, end in [(q_box, scores_box), (k_box, scores_box), (scores_box, scale_box),
                       (scale_box, mask_box), (mask_box, softmax_box), (softmax_box, output_box)]:
        graph_arrow(ax, start, end)
    # V rises to the right of the notes and enters the second MatMul from the side.
    ax.plot([9.2, 9.2], [0.8 + 0.48, 9.2], color="0.2", lw=1.3)
    ax.annotate("", xy=(5.0 + 1.3 + 0.08, 9.2), xytext=(9.2, 9.2),
                arrowprops=dict(arrowstyle="-|>", color="0.2", lw=1.3))
    graph_arrow(ax, output_box, (5.0, 10.6), h=0.6)
    ax.text(5.0, 10.6, "output  (B, T, d_v)", ha="center", va="center", fontsize=10)
    notes = [(scores_box, r"$QK^\top$: scores (B, T, S)"), (scale_box, r"$\div \sqrt{d_k}$"),
             (mask_box, "forbidden scores → very negative"),
             (softmax_box, "along the keys: each row sums to 1")]
    for (x, y), text in notes:
        ax.text(x + 1.55, y, text, ha="left", va="center", fontsize=9, color="0.25")
    ax.text(5.0 - 1.55, 9.2, r"weights $\times\, V$", ha="right", va="center", fontsize=9, color="0.25")
    for (x, _), shape in [(q_box, "(B, T, d_k)"), (k_box, "(B, S, d_k)"), (v_box, "(B, S, d_v)")]:
        ax.text(x, -0.05, shape, ha="center", va="center", fontsize=8, color="0.3")
    ax.set_title("Scaled dot-product attention as a computation graph", fontsize=11)
    fig.tight_layout()
    return fig
