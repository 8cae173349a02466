"""Diagrams for chapter 07 (efficient attention), drawn with matplotlib when the book builds.

- `causal_block_states`: which blocks of causal tiled attention are skipped, computed
  with the mask, or computed in full; the page quotes the skipped share from it.
- `tiled_attention_figure`: the tiling of tiled (flash) attention, query blocks down and
  key blocks across, with the running maximum, sum and output that one query block
  carries from key block to key block, next to the causal case where the blocks above
  the diagonal are skipped.
- `associativity_figure`: the two groupings of linear attention's product, one through a
  T x T matrix and one through a small d x d state, drawn to scale.

Every function returns a matplotlib figure; the page shows it.
"""

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

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


def arrow(ax, start, end, colour="black", width=1.4, style="-|>"):
    """A straight arrow from start to end in data coordinates."""
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12,
                                 color=colour, lw=width, shrinkA=0, shrinkB=0))


def draw_tiling(ax, n_q=4, n_k=5, row=1, current=2, pitch=1.45):
    """Query blocks down, key blocks across; query block `row` is at key block `current`."""
    def top(i):
        return i * pitch
    ax.set_xlim(-1.1, n_k + 1.5)
    ax.set_ylim(top(n_q - 1) + 1.45, -1.2)
    ax.set_aspect("equal")
    ax.axis("off")
    for j in range(n_k):                                   # key/value blocks along the top
        ax.add_patch(Rectangle((j + 0.06, -1.0), 0.88, 0.8, fc="#fdd0a2", ec="#a63603"))
        ax.text(j + 0.5, -0.6, f"$K_{j}V_{j}$", ha="center", va="center", fontsize=8)
    for i in range(n_q):                                   # query blocks down the left
        ax.add_patch(Rectangle((-1.0, top(i) + 0.06), 0.8, 0.88, fc="#c7e9c0", ec="#006d2c"))
        ax.text(-0.6, top(i) + 0.5, f"$Q_{i}$", ha="center", va="center", fontsize=9)
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
            ax.add_patch(Rectangle((j + 0.06, top(i) + 0.06), 0.88, 0.88, fc=fc, ec=ec, lw=1))
    y = top(row) + 0.5
    ax.text(current + 0.5, y, "$E$", ha="center", va="center", fontsize=10, color="white")
    for j in range(current):                               # the state carried so far
        arrow(ax, (j + 0.62, y), (j + 1.38, y), colour="#cb181d")
    for j in range(current, n_k - 1):                      # still to come
        arrow(ax, (j + 0.62, y), (j + 1.38, y), colour="#fc9272", style="-|>")
    ax.text(current / 2, top(row) + 1.22, r"running $m$, $\ell$, $O$ carried from key block"
            " to key block", ha="left", va="center", fontsize=7.5, color="#cb181d")
    ax.text(current + 0.5, top(row) - 0.22, f"scores $E = Q_{row}K_{current}^\\top$: one block",
            ha="center", va="bottom", fontsize=7.5, color="#08306b")
    arrow(ax, (n_k - 0.02, y), (n_k + 0.45, y), colour="#cb181d")
    ax.text(n_k + 0.95, y, "out$_%d$\n$= O / \\ell$" % row, ha="center", va="center",
            fontsize=8, color="#cb181d")
    ax.text((n_k - 1) / 2, top(n_q - 1) + 1.2, "every other query block: the same pass, "
            "independently", ha="center", va="center", fontsize=7.5, color="#636363")
    ax.set_title("tiled attention: one query block reads the key blocks in turn", fontsize=9)


def draw_causal(ax, n_blocks=8, block=8):
    """The causal case: blocks above the diagonal skipped, diagonal blocks masked."""
    states = causal_block_states(n_blocks, block)
    for i in range(n_blocks):
        for j in range(n_blocks):
            ax.add_patch(Rectangle((j, i), 1, 1, fc=STATE_COLOURS[states[i, j]], ec="#969696",
                                   lw=0.6, hatch="//" if states[i, j] == SKIPPED else None))
    ax.set_xlim(0, n_blocks)
    ax.set_ylim(n_blocks, 0)
    ax.set_aspect("equal")
    ax.set_xticks(np.arange(n_blocks) + 0.5, [str(j) for j in range(n_blocks)], fontsize=7)
    ax.set_yticks(np.arange(n_blocks) + 0.5, [str(i) for i in range(n_blocks)], fontsize=7)
    ax.tick_params(length=0)
    ax.set_xlabel("key block", fontsize=8)
    ax.set_ylabel("query block", fontsize=8)
    ax.set_title(f"causal: {n_blocks} x {n_blocks} blocks of {block}", fontsize=9)
    handles = [Patch(fc=STATE_COLOURS[s], ec="#969696", hatch="//" if s == SKIPPED else None,
                     label=STATE_NAMES[s]) for s in (FULL, MASKED, SKIPPED)]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize=7,
              frameon=False, ncol=1, handlelength=1.5)


def tiled_attention_figure(n_blocks=8, block=8):
    """Left: the tiling and the carried state; right: the causal blocks skipped."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4.6),
                                      gridspec_kw={"width_ratios": [1.6, 1]})
    draw_tiling(left)
    draw_causal(right, n_blocks, block)
    fig.tight_layout()
    return fig


def matrix(ax, x, y, width, height, label, colour):
    """A matrix drawn as a rectangle whose sides are its shape, labelled in the middle."""
    ax.add_patch(Rectangle((x, y), width, height, fc=colour, ec="black", lw=0.8))
    ax.text(x + width / 2, y + height / 2, label, ha="center", va="center", fontsize=9)
    return x + width


def associativity_figure(T=10, d=2.4):
    """(phi(Q) phi(K)^T) V through a T x T matrix, and phi(Q) (phi(K)^T V) through d x d."""
    fig, ax = plt.subplots(figsize=(8.4, 4.6))
    ax.set_aspect("equal")
    ax.axis("off")
    gap = 1.8
    colours = {"q": "#c7e9c0", "k": "#fdd0a2", "v": "#dadaeb", "big": "#fc9272",
               "small": "#9ecae1"}

    def sign(x, y, text):
        ax.text(x + gap / 2, y, text, ha="center", va="center", fontsize=12)
        return x + gap

    # Top row: phi(Q) phi(K)^T first, a T x T matrix, then times V.
    top = T + 3.5
    x = matrix(ax, 0, top - T, d, T, r"$\phi(Q)$" + "\nT x d", colours["q"])
    x = sign(x, top - T / 2, r"$\times$")
    x = matrix(ax, x, top - d, T, d, r"$\phi(K)^\top$   d x T", colours["k"])
    x = sign(x, top - T / 2, "=")
    x = matrix(ax, x, top - T, T, T, "T x T\nweights\n(grows like $T^2$)", colours["big"])
    x = sign(x, top - T / 2, r"$\times$")
    x = matrix(ax, x, top - T, d, T, "$V$\nT x d", colours["v"])
    right_end = x
    ax.text(0, top + 0.9, r"quadratic order: $(\phi(Q)\,\phi(K)^\top)\,V$, cost $O(T^2 d)$",
            fontsize=9, ha="left")

    # Bottom row: phi(K)^T V first, a d x d state, then phi(Q) times it.
    bottom = -1.5
    x = matrix(ax, 0, bottom - d, T, d, r"$\phi(K)^\top$   d x T", colours["k"])
    x = sign(x, bottom - T / 2, r"$\times$")
    x = matrix(ax, x, bottom - T, d, T, "$V$\nT x d", colours["v"])
    x = sign(x, bottom - T / 2, "=")
    x = matrix(ax, x, bottom - d, d, d, "d x d", colours["small"])
    ax.text(x - d / 2, bottom - d - 0.7, "state $U$", ha="center", va="top", fontsize=8)
    ax.text(x + 1.7, bottom - T / 2, "then", ha="center", va="center", fontsize=9)
    x += 3.4
    x = matrix(ax, x, bottom - T, d, T, r"$\phi(Q)$" + "\nT x d", colours["q"])
    x = sign(x, bottom - T / 2, r"$\times$")
    x = matrix(ax, x, bottom - d, d, d, "$U$", colours["small"])
    ax.text(0, bottom + 0.9, r"linear order: $\phi(Q)\,(\phi(K)^\top V)$, cost $O(T d^2)$",
            fontsize=9, ha="left")
    ax.set_xlim(-0.3, right_end + 0.3)
    ax.set_ylim(bottom - T - 0.5, top + 1.8)
    fig.tight_layout()
    return fig
