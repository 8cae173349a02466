"""Diagram for chapter 03: scaled dot-product attention as a computation graph.

Drawn with matplotlib when the book builds, in the spirit of Figure 2 of the original
Transformer paper but our own drawing: five steps from Q, K and V to the output, with
the shape of every tensor that flows between them. The boxes and arrows are the
primitives of ``drawing``.
"""

from __future__ import annotations

from .drawing import arrow, box, canvas, label

# One step of the graph: a rounded box, its outline drawn a little outside it.
STEP = dict(rounding=0.08, pad=0.08, edge="0.3", lw=1.2, fontsize=11)
GAP = 0.08  # between a box's outline and an arrow's end
FLOW = dict(color="0.2", lw=1.3, shrink=2)


def attention_graph():
    """MatMul, Scale, Mask, SoftMax, MatMul: the formula as boxes and arrows. Returns the figure."""
    fig, ax = canvas(6.2, 5.8, (0, 10.2), (-0.4, 11), equal=False)
    q_box = box(ax, 2.0, 0.8, 1.0, 0.8, "Q", "white", **STEP)
    k_box = box(ax, 4.0, 0.8, 1.0, 0.8, "K", "white", **STEP)
    v_box = box(ax, 9.2, 0.8, 1.0, 0.8, "V", "white", **STEP)
    scores_box = box(ax, 3.0, 2.6, 2.6, 0.8, "MatMul", "#c9e4f6", **STEP)
    scale_box = box(ax, 3.0, 4.2, 2.6, 0.8, "Scale", "#f7e3b5", **STEP)
    mask_box = box(ax, 3.0, 5.8, 2.6, 0.8, "Mask (opt.)", "#eecfe3", **STEP)
    softmax_box = box(ax, 3.0, 7.4, 2.6, 0.8, "SoftMax", "#cdebc5", **STEP)
    output_box = box(ax, 5.0, 9.2, 2.6, 0.8, "MatMul", "#c9e4f6", **STEP)
    for start, end in [(q_box, scores_box), (k_box, scores_box), (scores_box, scale_box),
                       (scale_box, mask_box), (mask_box, softmax_box), (softmax_box, output_box)]:
        # From the top of one box to the bottom of the next.
        arrow(ax, (start.x, start.top + GAP), (end.x, end.bottom - GAP), **FLOW)
    # V rises to the right of the notes and enters the second MatMul from the side.
    ax.plot([9.2, 9.2], [0.8 + 0.48, 9.2], color="0.2", lw=1.3)
    arrow(ax, (9.2, 9.2), (output_box.right + GAP, 9.2), **FLOW)
    arrow(ax, (output_box.x, output_box.y + 0.3 + GAP), (5.0, 10.6 - 0.3 - GAP), **FLOW)  # to the output's line
    label(ax, 5.0, 10.6, "output  (B, T, d_v)", fontsize=10)
    notes = [(scores_box, r"$QK^\top$: scores (B, T, S)"), (scale_box, r"$\div \sqrt{d_k}$"),
             (mask_box, "forbidden scores → very negative"),
             (softmax_box, "along the keys: each row sums to 1")]
    for step, text in notes:
        label(ax, step.x + 1.55, step.y, text, ha="left", color="0.25")
    label(ax, 5.0 - 1.55, 9.2, r"weights $\times\, V$", ha="right", color="0.25")
    for step, shape in [(q_box, "(B, T, d_k)"), (k_box, "(B, S, d_k)"), (v_box, "(B, S, d_v)")]:
        label(ax, step.x, -0.05, shape, fontsize=8, color="0.3")
    ax.set_title("Scaled dot-product attention as a computation graph", fontsize=11)
    fig.tight_layout()
    return fig
