"""Diagrams for chapter 04 (self-attention and positional encoding), drawn when the book builds.

- `rope_rotation_figure`: one pair of features of a query and of a key, rotated by RoPE
  at two pairs of positions the same distance apart. The angle between the rotated
  vectors, hence their dot product, is the same in both: it depends on the distance
  only.

Every function returns a matplotlib figure; the page shows it. The arrows, labels and axes are
the primitives of ``drawing``.
"""

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Arc

from .drawing import arrow, frame, label


def rotate(vector, angle):
    """A 2-vector turned counter-clockwise by `angle` radians."""
    c, s = np.cos(angle), np.sin(angle)
    return np.array([c * vector[0] - s * vector[1], s * vector[0] + c * vector[1]])


def draw_pair(ax, q, k, m, n, theta):
    """q rotated by m*theta and k by n*theta, with the originals dashed."""
    q_rot, k_rot = rotate(q, m * theta), rotate(k, n * theta)
    for vec, colour, name in ((q, "#31a354", "q"), (k, "#e6550d", "k")):
        arrow(ax, (0, 0), vec, color=colour, lw=1, ls="--", alpha=0.5, shrink=2, zorder=3)
        label(ax, *(vec * 1.12), name, color=colour, alpha=0.6)
    for vec, colour, name in ((q_rot, "#31a354", f"$R_{{{m}}}q$"), (k_rot, "#e6550d", f"$R_{{{n}}}k$")):
        arrow(ax, (0, 0), vec, color=colour, lw=2, shrink=2, zorder=3)
        label(ax, *(vec * 1.22), name, fontsize=10, color=colour)
    a_q, a_k = np.degrees(np.arctan2(q_rot[1], q_rot[0])), np.degrees(np.arctan2(k_rot[1], k_rot[0]))
    turn = (a_k - a_q + 180) % 360 - 180               # the smaller angle from q to k
    lo, hi = (a_q, a_q + turn) if turn >= 0 else (a_k, a_k - turn)
    ax.add_patch(Arc((0, 0), 0.7, 0.7, theta1=lo, theta2=hi, color="black", lw=1))
    ax.add_patch(plt.Circle((0, 0), 1.0, fill=False, color="#d9d9d9", lw=0.8))
    frame(ax, (-1.45, 1.45), (-1.45, 1.45), border=True)
    score = float(q_rot @ k_rot)
    ax.set_title(f"query at m = {m}, key at n = {n}\nscore of the pair {score:.3f}", fontsize=9)
    return score


def rope_rotation_figure(theta=0.45, positions=((1, 3), (5, 7))):
    """Two panels: the same q and k at two pairs of positions with the same distance n - m."""
    q = np.array([0.95, 0.15])
    k = np.array([0.55, 0.75])
    fig, axes = plt.subplots(1, len(positions), figsize=(3.3 * len(positions), 3.6))
    scores = [draw_pair(ax, q, k, m, n, theta) for ax, (m, n) in zip(axes, positions)]
    fig.suptitle(r"one pair of features, turned by $m\theta$ (query) and $n\theta$ (key)",
                 fontsize=10)
    fig.tight_layout()
    return fig, scores
