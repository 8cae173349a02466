"""Diagrams for chapter 07 (efficient attention), drawn with matplotlib when the book builds.

- `causal_block_states`: which blocks of causal tiled attention are skipped, computed
  with the mask, or computed in full; the page quotes the skipped share from it.
- `tiled_attention_figure`: the tiling of tiled (flash) attention, query blocks down and
  key blocks across, with the running maximum, sum and output that one query block
  carries from key block to key block, next to the causal case where the blocks above
  the diagonal are skipped.
- `associativity_figure`: the two groupings of linear attention's product, one through a
  T x T matrix and one through a small d x d state, drawn to scale.

Every function returns a matplotlib figure; the page shows it. The cells, arrows, labels and
legends are the primitives of ``drawing``.
"""

import matplotlib.pyplot as plt
import numpy as np

from .drawing import arrow, box, canvas, cell_grid, frame, grid_axes, label, patch_legend

SKIPPED, MASKED, FULL = 0, 1, 2
STATE_COLOURS = {SKIPPED: "white", MASKED: "#9ecae1", FULL: "#3182bd"}
STATE_NAMES = {SKIPPED: "skipped", MASKED: "computed with the mask", FULL: "computed in full"}


def causal_block_states(n_blocks, block):
    """(n_blocks, n_blocks) array: SKIPPED, MASKED or FULL for each (query block, key block).

    A key block is skipped when its first key comes after the last query of the query
    block, computed in full when its last key is at or before the block's first query,
    and computed with the causal mask otherwise (the blocks that straddle the diagonal).
    """
    states = np.empty((n_blocks, n_blocks), dtype=int)
    for i in range(n_blocks):
        first_q, last_q = i * block, (i + 1) * block - 1
        for j in range(n_blocks):
            first_k, last_k = j * block, (j + 1) * block - 1
            if first_k > last_q:
                states[i, j] = SKIPPED
            elif last_k <= first_q:
                states[i, j] = FULL
            else:
                states[i, j] = MASKED
    return states


def draw_tiling(ax, n_q=4, n_k=5, row=1, current=2, pitch=1.45):
    """Query blocks down, key blocks across; query block `row` is at key block `current`."""
    def top(i):
        return i * pitch
    frame(ax, (-1.1, n_k + 1.5), (top(n_q - 1) + 1.45, -1.2))  # y grows downwards
    for j in range(n_k):                                   # key/value blocks along the top
        box(ax, j + 0.06, -1.0, 0.88, 0.8, f"$K_{j}V_{j}$", "#fdd0a2", edge="#a63603", rounding=None,
            fontsize=8, corner=True)
    for i in range(n_q):                                   # query blocks down the left
        box(ax, -1.0, top(i) + 0.06, 0.8, 0.88, f"$Q_{i}$", "#c7e9c0", edge="#006d2c", rounding=None,
            fontsize=9, corner=True)
    for i in range(n_q):
        for j in range(n_k):
            if i != row:
                fc, ec = "#f0f0f0", "#bdbdbd"
            elif j < current:
                fc, ec = "#9ecae1", "#08519c"
            elif j == current:
                fc, ec = "#3182bd", "#08306b"
            else:
                fc, ec = "white", "#08519c"
            box(ax, j + 0.06, top(i) + 0.06, 0.88, 0.88, color=fc, edge=ec, rounding=None, corner=True)
    y = top(row) + 0.5
    label(ax, current + 0.5, y, "$E$", fontsize=10, color="white")
    carried = dict(color="#cb181d", lw=1.4, head=12)
    for j in range(current):                               # the state carried so far
        arrow(ax, (j + 0.62, y), (j + 1.38, y), **carried)
    for j in range(current, n_k - 1):                      # still to come
        arrow(ax, (j + 0.62, y), (j + 1.38, y), **{**carried, "color": "#fc9272"})
    label(ax, current / 2, top(row) + 1.22, r"running $m$, $\ell$, $O$ carried from key block"
          " to key block", fontsize=7.5, ha="left", color="#cb181d")
    label(ax, current + 0.5, top(row) - 0.22, f"scores $E = Q_{row}K_{current}^\\top$: one block",
          fontsize=7.5, va="bottom", color="#08306b")
    arrow(ax, (n_k - 0.02, y), (n_k + 0.45, y), **carried)
    label(ax, n_k + 0.95, y, "out$_%d$\n$= O / \\ell$" % row, fontsize=8, color="#cb181d")
    label(ax, (n_k - 1) / 2, top(n_q - 1) + 1.2, "every other query block: the same pass, "
          "independently", fontsize=7.5, color="#636363")
    ax.set_title("tiled attention: one query block reads the key blocks in turn", fontsize=9)


def draw_causal(ax, n_blocks=8, block=8):
    """The causal case: blocks above the diagonal skipped, diagonal blocks masked."""
    states = causal_block_states(n_blocks, block)
    cell_grid(ax, 0, 0, [[STATE_COLOURS[s] for s in row] for row in states], edge="#969696", lw=0.6,
              hatches=[["//" if s == SKIPPED else None for s in row] for row in states])
    names = [str(i) for i in range(n_blocks)]
    grid_axes(ax, names, names, "key block", "query block", fontsize=7, label_size=8, marks=False)
    ax.set_title(f"causal: {n_blocks} x {n_blocks} blocks of {block}", fontsize=9)
    patch_legend(ax, [(STATE_NAMES[s], dict(fc=STATE_COLOURS[s], ec="#969696", hatch="//" if s == SKIPPED else None))
                      for s in (FULL, MASKED, SKIPPED)],
                 loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize=7, ncol=1, handlelength=1.5)


def tiled_attention_figure(n_blocks=8, block=8):
    """Left: the tiling and the carried state; right: the causal blocks skipped."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4.6),
                                      gridspec_kw={"width_ratios": [1.6, 1]})
    draw_tiling(left)
    draw_causal(right, n_blocks, block)
    fig.tight_layout()
    return fig


def associativity_figure(T=10, d=2.4):
    """(phi(Q) phi(K)^T) V through a T x T matrix, and phi(Q) (phi(K)^T V) through d x d."""
    fig, ax = canvas(8.4, 4.6)
    gap = 1.8
    colours = {"q": "#c7e9c0", "k": "#fdd0a2", "v": "#dadaeb", "big": "#fc9272",
               "small": "#9ecae1"}

    def matrix(x, y, width, height, text, colour):
        """A matrix drawn as a rectangle whose sides are its shape, from (x, y); its right edge."""
        return box(ax, x, y, width, height, text, colour, lw=0.8, rounding=None, fontsize=9, corner=True).right

    def sign(x, y, text):
        label(ax, x + gap / 2, y, text, fontsize=12)
        return x + gap

    # Top row: phi(Q) phi(K)^T first, a T x T matrix, then times V.
    top = T + 3.5
    x = matrix(0, top - T, d, T, r"$\phi(Q)$" + "\nT x d", colours["q"])
    x = sign(x, top - T / 2, r"$\times$")
    x = matrix(x, top - d, T, d, r"$\phi(K)^\top$   d x T", colours["k"])
    x = sign(x, top - T / 2, "=")
    x = matrix(x, top - T, T, T, "T x T\nweights\n(grows like $T^2$)", colours["big"])
    x = sign(x, top - T / 2, r"$\times$")
    x = matrix(x, top - T, d, T, "$V$\nT x d", colours["v"])
    right_end = x
    label(ax, 0, top + 0.9, r"quadratic order: $(\phi(Q)\,\phi(K)^\top)\,V$, cost $O(T^2 d)$", ha="left",
          va="baseline")

    # Bottom row: phi(K)^T V first, a d x d state, then phi(Q) times it.
    bottom = -1.5
    x = matrix(0, bottom - d, T, d, r"$\phi(K)^\top$   d x T", colours["k"])
    x = sign(x, bottom - T / 2, r"$\times$")
    x = matrix(x, bottom - T, d, T, "$V$\nT x d", colours["v"])
    x = sign(x, bottom - T / 2, "=")
    x = matrix(x, bottom - d, d, d, "d x d", colours["small"])
    label(ax, x - d / 2, bottom - d - 0.7, "state $U$", fontsize=8, va="top")
    label(ax, x + 1.7, bottom - T / 2, "then")
    x += 3.4
    x = matrix(x, bottom - T, d, T, r"$\phi(Q)$" + "\nT x d", colours["q"])
    x = sign(x, bottom - T / 2, r"$\times$")
    x = matrix(x, bottom - d, d, d, "$U$", colours["small"])
    label(ax, 0, bottom + 0.9, r"linear order: $\phi(Q)\,(\phi(K)^\top V)$, cost $O(T d^2)$", ha="left",
          va="baseline")
    frame(ax, (-0.3, right_end + 0.3), (bottom - T - 0.5, top + 1.8))
    fig.tight_layout()
    return fig
