"""Diagram for chapter 05: splitting the model width into heads and merging it back.

Hand-drawn with matplotlib when the book builds (the primitives of ``drawing``), so the book
keeps no image file. The cells carry the labels the chapter's code uses, entry ``10 t + j``
for token t's feature j, so the picture and the printed tensors can be read side by side.
"""

from __future__ import annotations

from .drawing import ATT, CTX, DEC, ENC, arrow, canvas, cell_grid, label

HEAD_COLOURS = (ENC, DEC, CTX, ATT)


def draw_table(ax, left, top, labels, colours, title):
    """A table of labelled cells whose top-left corner is (left, top), its title above it."""
    cell_grid(ax, left, top, colours, labels, edge="0.35")
    label(ax, left + len(labels[0]) / 2, top + 0.35, title, va="bottom")


def draw_row_names(ax, left, top, n_rows):
    """Name the rows of a table by token, to its left."""
    for r in range(n_rows):
        label(ax, left - 0.2, top - r - 0.5, f"token {r}", fontsize=7, ha="right", color="0.3")


def draw_step(ax, start, end, text):
    """An arrow between two tables, with the code that performs the step above it."""
    arrow(ax, start, end, color="0.2", lw=1.3, head=12, shrink=2)
    label(ax, (start[0] + end[0]) / 2, start[1] + 0.3, text, fontsize=7.5, va="bottom", family="monospace")


def split_and_merge_heads(n_tokens=3, d_model=8, n_heads=2):
    """The (T, D) features of a sequence, their split into H heads of (T, d_head), and the merge.

    Each head's block of features has its own colour; every head keeps all the tokens.
    Returns the figure.
    """
    if d_model % n_heads:
        raise ValueError(f"d_model = {d_model} is not divisible by n_heads = {n_heads}")
    if n_heads > len(HEAD_COLOURS):
        raise ValueError(f"at most {len(HEAD_COLOURS)} heads can be drawn, not {n_heads}")
    d_head = d_model // n_heads
    labels = [[f"{10 * t + j}" for j in range(d_model)] for t in range(n_tokens)]
    colours = [[HEAD_COLOURS[j // d_head] for j in range(d_model)] for _ in range(n_tokens)]

    gap = 5.0                                      # room for an arrow and its code
    heads_left = d_model + gap
    merged_left = heads_left + d_head + gap
    head_pitch = n_tokens + 1.6                    # one head below the other, title between
    height = n_heads * head_pitch - 1.6            # from the top of head 0 to the bottom of the last
    x_range = (-2.0, merged_left + d_model + 0.2)
    y_range = (-height - 0.8, 1.1)
    width = 9.5
    fig, ax = canvas(width, width * (y_range[1] - y_range[0]) / (x_range[1] - x_range[0]), x_range, y_range)

    top = -(height - n_tokens) / 2                 # the two (T, D) tables, centred vertically
    draw_table(ax, 0, top, labels, colours, "x: (B, T, D)")
    draw_row_names(ax, 0, top, n_tokens)
    for h in range(n_heads):
        block = slice(h * d_head, (h + 1) * d_head)
        draw_table(ax, heads_left, -h * head_pitch, [row[block] for row in labels],
                   [row[block] for row in colours], f"head {h}: (T, d_head)")
    draw_table(ax, merged_left, top, labels, colours, "merged: (B, T, D)")

    middle = top - n_tokens / 2
    draw_step(ax, (d_model + 0.3, middle), (heads_left - 0.3, middle),
              "view(B, T, H, d_head)\n.transpose(1, 2)")
    draw_step(ax, (heads_left + d_head + 0.3, middle), (merged_left - 0.3, middle),
              "transpose(1, 2)\n.reshape(B, T, D)")
    label(ax, heads_left + d_head / 2, -height - 0.45, "(B, H, T, d_head)", fontsize=8, color="0.3")
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.01, top=0.99)
    return fig
