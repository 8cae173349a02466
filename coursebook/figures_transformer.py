"""Diagrams for chapter 06, the Transformer, drawn with matplotlib when the book builds.

Three pictures the prose would otherwise have to carry in words: the encoder-decoder as a
whole, one decoder layer with the shape of every tensor that flows through it, and the
KV cache growing by one key and one value per generated token. Each function returns a
matplotlib figure; the page shows it, so the book keeps no image files. The boxes, arrows and
labels are the primitives of ``drawing``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from .drawing import arrow, box, canvas, label, patch_legend

__all__ = ["encoder_decoder", "decoder_layer_shapes", "kv_cache_growth"]

# One colour per kind of part, the same in every figure of the chapter.
EMBED = "#fff2cc"
ATTN = "#cfe2f3"
CROSS = "#d9d2e9"
FFN = "#d9ead3"
NORM = "#f4cccc"
PLAIN = "#ffffff"
FRAME = "#f3f3f3"
SHAPE = "#444444"


# A part of the model: a rounded box whose arrows touch its edges.
PART = dict(lw=0.9, rounding=0.08, pad=0.0)
LINK = dict(lw=1.1, head=9)


def _skip(ax, x_main, y_branch, x_side, y_to, x_into, color="#666666"):
    """A residual path: leaves the main line at y_branch, runs up at x_side, enters a box at y_to."""
    ax.plot([x_main, x_side, x_side], [y_branch, y_branch, y_to], color=color, lw=1.0)
    ax.plot([x_main], [y_branch], "o", color=color, ms=3)
    arrow(ax, (x_side, y_to), (x_into, y_to), **{**LINK, "color": color, "lw": 1.0})


def _sublayer(ax, x, y, w, text, color, x_side, y_from):
    """A sublayer box with its Add & Norm above it and the residual path around both.

    y_from is the top of whatever feeds the sublayer; returns the top of the Add & Norm.
    """
    part = box(ax, x, y, w, 0.55, text, color, **PART)
    arrow(ax, (x, y_from), (x, part.bottom), **LINK)
    norm = box(ax, x, part.top + 0.45, w * 0.62, 0.38, "Add & Norm", NORM, fontsize=9, **PART)
    arrow(ax, (x, part.top), (x, norm.bottom), **LINK)
    _skip(ax, x, (y_from + part.bottom) / 2, x_side, norm.y, norm.right if x_side > x else norm.left)
    return norm.top


def encoder_decoder():
    """The encoder-decoder Transformer (post-LN, as in the original), with our module names."""
    fig, ax = canvas(6.6, 7.6, (-0.9, 9.1), (-1.3, 10.3))
    enc_x, dec_x, w = 2.0, 6.5, 3.0

    # Inputs, embeddings and positions.
    box(ax, enc_x, 0.0, w, 0.5, "src (B, S): source tokens", PLAIN, fontsize=9, **PART)
    box(ax, dec_x, 0.0, w + 0.4, 0.6, "tgt_in (B, T): the target\nshifted right, SOS y1 ... y(T-1)", PLAIN,
        fontsize=9, **PART)
    for x, name in ((enc_x, "src_embed"), (dec_x, "tgt_embed")):
        box(ax, x, 1.05, w, 0.5, f"{name} x $\\sqrt{{D}}$", EMBED, fontsize=9, **PART)
        arrow(ax, (x, 0.28), (x, 0.8), **LINK)
        ax.add_patch(plt.Circle((x, 1.85), 0.2, facecolor=PLAIN, edgecolor="black", lw=0.9))
        label(ax, x, 1.85, "+", fontsize=11)
        arrow(ax, (x, 1.3), (x, 1.65), **LINK)
        label(ax, x + 0.3, 1.85, "positions", ha="left")
    label(ax, enc_x, -0.75, "encoder: reads the whole\nsource at once")
    label(ax, dec_x, -0.75, "decoder: each position reads the\ntokens before it and the memory")

    # Encoder layer, repeated N times.
    box(ax, enc_x, 2.3 + 3.6 / 2, w + 0.7, 3.6, color=FRAME, edge="#999999", lw=0.9, rounding=0.15, pad=0.0)
    label(ax, enc_x - w / 2 - 0.45, 4.1, "N x", fontsize=10, ha="right", weight="bold")
    label(ax, enc_x, 5.7, "encoder layer", style="italic")
    top = _sublayer(ax, enc_x, 2.95, w, "multi-head self-attention\n(every source token)", ATTN,
                    enc_x - w / 2 - 0.18, 2.05)
    top = _sublayer(ax, enc_x, 4.35, w * 0.8, "feed-forward", FFN, enc_x - w / 2 - 0.18, top)
    box(ax, enc_x, 6.5, w, 0.5, "memory  (B, S, D)", PLAIN, fontsize=9, **PART)
    arrow(ax, (enc_x, top), (enc_x, 6.25), **LINK)

    # Decoder layer, repeated N times.
    box(ax, dec_x, 2.3 + 5.0 / 2, w + 0.7, 5.0, color=FRAME, edge="#999999", lw=0.9, rounding=0.15, pad=0.0)
    label(ax, dec_x + w / 2 + 0.45, 4.8, "x N", fontsize=10, ha="left", weight="bold")
    label(ax, dec_x, 7.1, "decoder layer", style="italic")
    top = _sublayer(ax, dec_x, 2.95, w, "masked multi-head\nself-attention (causal)", ATTN,
                    dec_x + w / 2 + 0.18, 2.05)
    cross_y = top + 0.5
    top = _sublayer(ax, dec_x, cross_y, w, "cross-attention\nQ: decoder; K, V: memory", CROSS,
                    dec_x + w / 2 + 0.18, top)
    top = _sublayer(ax, dec_x, top + 0.5, w * 0.8, "feed-forward", FFN, dec_x + w / 2 + 0.18, top)

    # The memory enters every decoder layer's cross-attention.
    arrow(ax, (enc_x + w / 2, 6.5), (dec_x - w / 2, cross_y), **{**LINK, "color": "tab:purple", "lw": 1.4},
          rad=-0.3)
    label(ax, (enc_x + dec_x) / 2, 6.25, "K, V", va="baseline", color="tab:purple")

    # Output layer.
    box(ax, dec_x, 7.95, w, 0.45, "linear (out): D to |V|", EMBED, fontsize=9, **PART)
    arrow(ax, (dec_x, top), (dec_x, 7.725), **LINK)
    box(ax, dec_x, 8.75, w, 0.45, "softmax", PLAIN, fontsize=9, **PART)
    arrow(ax, (dec_x, 8.175), (dec_x, 8.525), **LINK)
    box(ax, dec_x, 9.6, w, 0.6, "next-token probabilities\n(B, T, V)", PLAIN, fontsize=9, **PART)
    arrow(ax, (dec_x, 8.975), (dec_x, 9.3), **LINK)
    fig.tight_layout()
    return fig


def decoder_layer_shapes():
    """One post-LN decoder layer, every step with the shape of the tensor it produces."""
    fig, ax = canvas(6.2, 8.8, (-0.6, 9.4), (-0.5, 13.9))
    x, w, sx = 2.2, 4.0, 4.5
    steps = [
        # (y, label, colour, shape of the result)
        (0.0, "x: the layer's input", PLAIN, "(B, T, D)"),
        (1.1, "q, k, v = x W_q, x W_k, x W_v", ATTN, "(B, T, D) each"),
        (2.1, "split_heads", ATTN, "(B, H, T, d_head)"),
        (3.1, "scores q k^T / sqrt(d_head),\ntgt_mask, softmax", ATTN, "weights (B, H, T, T)"),
        (4.1, "weights @ v, merge_heads, W_o", ATTN, "(B, T, D)"),
        (5.0, "add x, norm1", NORM, "(B, T, D)"),
        (6.1, "q from x;  k, v from memory", CROSS, "q (B, H, T, d_head)\nk, v (B, H, S, d_head)"),
        (7.2, "scores, src_mask, softmax", CROSS, "weights (B, H, T, S)"),
        (8.2, "weights @ v, merge_heads, W_o", CROSS, "(B, T, D)"),
        (9.1, "add, norm2", NORM, "(B, T, D)"),
        (10.2, "linear1, ReLU", FFN, "(B, T, d_ff)"),
        (11.2, "linear2", FFN, "(B, T, D)"),
        (12.1, "add, norm3: the layer's output", NORM, "(B, T, D)"),
    ]
    parts = [box(ax, x, y, w, 0.55 if "\n" not in text else 0.75, text, color, fontsize=9, **PART)
             for y, text, color, _ in steps]
    for part, nxt, (y, _, _, shape) in zip(parts, parts[1:] + [None], steps):
        label(ax, sx, y, shape, ha="left", family="monospace", color=SHAPE)
        if nxt is not None:
            arrow(ax, (x, part.top), (x, nxt.bottom), **LINK)
    # The three sublayers, each closed by its residual addition and LayerNorm.
    for y0, y1, name in ((0.75, 5.35, "masked self-attention"), (5.65, 9.4, "cross-attention"),
                         (9.75, 12.45, "feed-forward")):
        box(ax, x - w / 2 - 0.45, y0, w + 0.6, y1 - y0, color=None, edge="#999999", ls="--", lw=0.8, rounding=None,
            corner=True)
        label(ax, x - w / 2 - 0.55, (y0 + y1) / 2, name, rotation=90, ha="right", style="italic")
    # Residual paths, on the left: each sublayer's input is added to its output.
    xl = x - w / 2 - 0.22
    for y_from, y_to in ((0.55, 5.0), (5.5, 9.1), (9.6, 12.1)):
        _skip(ax, x, y_from, xl, y_to, x - w / 2)
    label(ax, xl - 0.05, 0.55, "residual", fontsize=8, ha="right", color="#666666")
    # The memory, an input of the cross-attention only.
    memory = box(ax, 7.85, 4.6, 2.9, 0.7, "memory from\nthe encoder (B, S, D)", PLAIN, fontsize=9, **PART)
    arrow(ax, (memory.x, memory.top), (x + w / 2 - 0.4, parts[6].bottom), **{**LINK, "color": "tab:purple", "lw": 1.2},
          rad=0.15)
    label(ax, x, 13.3, "masks: tgt_mask (B, 1, T, T), causal and padding;\n"
          "src_mask (B, 1, 1, S), the source's padding", va="baseline")
    fig.tight_layout()
    return fig


def kv_cache_growth(tokens=("SOS", "7", "11", "7"), n_layers=2):
    """Four steps of cached greedy decoding: one new key and value join the cache per step."""
    n = len(tokens)
    x_range, y_range = (-2.4, n * 0.8 + 3.2), (-1.25 * n + 0.1, 1.2)
    fig, ax = canvas(6.6, 6.6 * (y_range[1] - y_range[0]) / (x_range[1] - x_range[0]) + 0.4, x_range, y_range)
    cell = 0.7
    label(ax, -2.3, 0.85, "step t: input", ha="left", va="baseline", weight="bold")
    label(ax, 0.0, 0.85, "cached keys (top) and values (bottom) of one layer", ha="left", va="baseline",
          weight="bold")
    for t, tok in enumerate(tokens):
        y = -1.25 * t
        label(ax, -2.3, y, f"t = {t}:", ha="left")
        box(ax, -0.95, y, 0.9, 0.5, tok, PLAIN, fontsize=9, **PART)
        for j in range(t + 1):
            face = "#f6b26b" if j == t else "#d9d9d9"
            for row, letter in ((0.21, "k"), (-0.21, "v")):
                box(ax, j * 0.8 + 0.05 + cell / 2, y + row, cell, cell * 0.56, f"{letter}{j}", face, lw=0.7,
                    rounding=None, fontsize=8)
        arrow(ax, (-0.5, y), (0.02, y), **{**LINK, "lw": 0.9})
        right = (t + 1) * 0.8 + 0.25
        label(ax, right, y + 0.14, f"cache (B, H, {t + 1}, d_head)", fontsize=8, ha="left", family="monospace",
              color=SHAPE)
        label(ax, right, y - 0.2, f"1 query attends to {t + 1} key{'s' if t else ''}", fontsize=8, ha="left",
              color=SHAPE)
    patch_legend(ax, [("computed at this step (the new token only)", dict(facecolor="#f6b26b", edgecolor="black")),
                      ("read back from the cache", dict(facecolor="#d9d9d9", edgecolor="black"))],
                 loc="lower left", bbox_to_anchor=(0.0, -0.02), fontsize=8, ncol=2)
    ax.set_title(f"Each of the {n_layers} decoder layers keeps such a cache", fontsize=9)
    fig.tight_layout()
    return fig
