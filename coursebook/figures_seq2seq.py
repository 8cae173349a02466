"""Diagrams for chapters 01 and 02, drawn with matplotlib when the book builds.

Hand-written, not generated. Each function returns a matplotlib figure; the pages call
them and show the result, so the book keeps no image files. The boxes, arrows and labels
are the primitives of ``drawing``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from .drawing import CTX, DEC, ENC, TOK, arrow, box, canvas, frame, label, patch_legend


def unrolled_encoder_decoder(source=("3", "8", "5", "4"), target=("4", "5", "8", "3")):
    """The plain encoder-decoder unrolled in time: one context vector between the two."""
    n_src, n_tgt = len(source), len(target)
    fig, ax = canvas(9.5, 3.4, (-0.8, n_src * 1.5 + n_tgt * 1.5 + 1.2), (-1.4, 2.6))
    enc = [box(ax, 1.5 * j, 0.6, 1.0, 0.8, f"GRU\n$h_{j + 1}$", ENC) for j in range(n_src)]
    for j, tok in enumerate(source):
        box(ax, 1.5 * j, -0.8, 1.1, 0.45, f"$x_{j + 1}$ = {tok}", TOK, fontsize=9)
        arrow(ax, (1.5 * j, -0.55), (1.5 * j, 0.2), shrink=1)
    for a, b in zip(enc, enc[1:]):
        arrow(ax, a, b, shrink=14)
    cx = 1.5 * n_src
    box(ax, cx, 0.6, 1.0, 0.6, "$c = h_S$", CTX)
    arrow(ax, enc[-1], (cx, 0.6), shrink=14)
    x0 = cx + 1.5
    dec = [box(ax, x0 + 1.5 * t, 0.6, 1.0, 0.8, f"GRU\n$s_{t + 1}$", DEC) for t in range(n_tgt)]
    arrow(ax, (cx, 0.6), dec[0], shrink=14)
    for a, b in zip(dec, dec[1:]):
        arrow(ax, a, b, shrink=14)
    inputs = ["SOS", *target[:-1]]
    for t in range(n_tgt):
        x = x0 + 1.5 * t
        box(ax, x, -0.8, 0.9, 0.45, f"{inputs[t]}", TOK, fontsize=9)
        arrow(ax, (x, -0.55), (x, 0.2), shrink=1)
        box(ax, x, 2.1, 1.1, 0.45, f"$y_{t + 1}$ = {target[t]}", TOK, fontsize=9)
        arrow(ax, (x, 1.0), (x, 1.85), shrink=1)
        # The same context enters every decoder step.
        arrow(ax, (cx, 0.9), (x - 0.35, 1.0), color="tab:green", ls="--", lw=0.9, rad=-0.25, shrink=2)
    label(ax, 1.5 * (n_src - 1) / 2, -1.35, "encoder: reads the source", va="baseline")
    label(ax, x0 + 1.5 * (n_tgt - 1) / 2, -1.35, "decoder: writes the target, one token per step", va="baseline")
    label(ax, cx, 1.3, "context", fontsize=8, va="baseline", color="tab:green")
    fig.tight_layout()
    return fig


def teacher_forcing_vs_free_running(target=("4", "5", "8", "3"), forced=("4", "6", "8", "3"),
                                    free=("4", "6", "2", "9")):
    """Where each decoder input comes from in training (true tokens) and at inference (own outputs).

    The outputs are made up: one mistake at step 2 in both, which free running feeds back.
    """
    n = len(target)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.0))
    titles = ("Teacher forcing (training)", "Free running (inference)")
    for ax, title, outputs, is_free in zip(axes, titles, (forced, free), (False, True)):
        frame(ax, (-0.9, 1.5 * n - 0.4), (-1.3, 2.5))
        ax.set_title(title, fontsize=11)
        for t in range(n):
            x = 1.5 * t
            box(ax, x, 0.5, 0.9, 0.6, f"$s_{t + 1}$", DEC)
            if t:
                arrow(ax, (x - 1.5, 0.5), (x, 0.5), shrink=14)
            out = outputs[t]
            wrong = out != target[t]
            box(ax, x, 1.9, 0.7, 0.45, f"{out}", TOK, edge="tab:red" if wrong else "black", lw=2.0 if wrong else 1.0)
            arrow(ax, (x, 0.8), (x, 1.65), shrink=1)
            if t == 0:
                feed, color = "SOS", "black"
            elif is_free:
                feed, color = outputs[t - 1], "tab:red" if outputs[t - 1] != target[t - 1] else "black"
            else:
                feed, color = target[t - 1], "tab:blue"
            box(ax, x, -0.9, 0.7, 0.45, feed, TOK, edge=color)
            arrow(ax, (x, -0.65), (x, 0.2), shrink=1)
            if t and is_free:
                arrow(ax, (x - 1.5 + 0.35, 1.9), (x - 0.3, -0.8), color="tab:red", ls=":", lw=0.9, shrink=3)
        if not is_free:
            label(ax, 1.5 * (n - 1) / 2, 2.4, f"inputs: SOS + the true target {' '.join(target[:-1])}",
                  fontsize=8, va="baseline", color="tab:blue")
        else:
            label(ax, 1.5 * (n - 1) / 2, 2.4, "inputs: SOS + the model's own previous outputs",
                  fontsize=8, va="baseline", color="tab:red")
    label(axes[0], -0.85, 1.9, "output", fontsize=8, ha="right")
    label(axes[0], -0.85, -0.9, "input", fontsize=8, ha="right")
    fig.tight_layout()
    return fig


def beam_tree(levels, beam_size, greedy_path=(), n_show=4, token_names=None):
    """A beam-search tree drawn from a recorded search.

    ``levels`` lists, for each step, the candidates as (prefix tuple, log P(prefix), status)
    sorted best first, status one of "kept", "finished", "dropped". Only the best
    ``n_show`` candidates of each step are drawn; the rest are counted.
    """
    name = (lambda tok: token_names.get(tok, str(tok))) if token_names else str
    n_steps = len(levels)
    fig, ax = canvas(10, 0.95 * n_show + 1.3, (-1.9, 2.6 * n_steps + 0.2), (-n_show - 0.2, 1.1))
    pos = {(): (-1.2, -(n_show - 1) / 2)}
    box(ax, *pos[()], 0.8, 0.45, "SOS", TOK, fontsize=9)
    colors = {"kept": "#9fc5e8", "finished": "#b6d7a8", "dropped": "#eeeeee"}
    for step, cands in enumerate(levels):
        x = 2.6 * step + 0.9
        label(ax, x, 0.75, f"step {step + 1}", va="baseline")
        for rank, (prefix, score, status) in enumerate(cands[:n_show]):
            y = -rank
            pos[prefix] = (x, y)
            on_greedy = tuple(greedy_path[:len(prefix)]) == prefix
            box(ax, x, y, 1.7, 0.7, f"{' '.join(name(t) for t in prefix)}\n{score:.2f}", colors[status], fontsize=8,
                edge="tab:orange" if on_greedy else "grey", lw=2.2 if on_greedy else 0.8)
            parent = pos.get(prefix[:-1])
            if parent is not None:
                arrow(ax, (parent[0] + 0.85 if prefix[:-1] else parent[0] + 0.4, parent[1]), (x - 0.85, y),
                      color="grey" if status == "dropped" else "black", lw=0.8, shrink=1)
        if len(cands) > n_show:
            label(ax, x, -n_show + 0.35, f"+ {len(cands) - n_show} more, dropped", fontsize=8, va="baseline",
                  color="grey")
    patch_legend(ax, [(f"kept (best {beam_size} unfinished)", dict(facecolor=colors["kept"], edgecolor="grey")),
                      ("finished (ends in EOS or at the length limit)",
                       dict(facecolor=colors["finished"], edgecolor="grey")),
                      ("dropped", dict(facecolor=colors["dropped"], edgecolor="grey")),
                      ("greedy path", dict(facecolor="white", edgecolor="tab:orange", lw=2))],
                 loc="lower left", fontsize=7, ncol=4, bbox_to_anchor=(0.0, -0.08))
    ax.set_title(f"Beam search with k = {beam_size}: each box is a prefix and its log-probability",
                 fontsize=10)
    fig.tight_layout()
    return fig


def attention_decoder_step(n_src=5):
    """One step of a decoder with attention (Bahdanau et al.): score, softmax, weighted sum, GRU."""
    fig, ax = canvas(9.5, 4.4, (-1.3, 11.2), (-1.4, 4.5))
    xs = [1.3 * j for j in range(n_src)]
    for j, x in enumerate(xs):
        box(ax, x, -0.2, 0.8, 0.55, f"$h_{j + 1}$", ENC)
    for a, b in zip(xs, xs[1:]):
        arrow(ax, (a + 0.4, -0.1), (b - 0.4, -0.1), lw=0.8)
        arrow(ax, (b - 0.4, -0.3), (a + 0.4, -0.3), lw=0.8)
    label(ax, xs[-1] / 2, -1.0, "encoder states $h_j$ (the keys and the values)", va="baseline")
    # Made-up weights for the picture; the line width of each link is its weight.
    weights = [0.05, 0.1, 0.6, 0.2, 0.05][:n_src]
    cx, cy = xs[-1] / 2, 2.6
    for x, w in zip(xs, weights):
        ax.plot([x, cx], [0.1, cy - 0.3], color="tab:purple", lw=0.5 + 8 * w, alpha=0.6, solid_capstyle="round")
        lx, ly = x + 0.4 * (cx - x), 0.1 + 0.4 * (cy - 0.4)
        label(ax, lx + 0.25, ly, f"{w:.2f}", fontsize=7, color="tab:purple")
    label(ax, xs[0] - 0.6, 1.2, r"$\alpha_{tj}$", fontsize=11, va="baseline", color="tab:purple")
    box(ax, cx, cy, 2.4, 0.6, r"$C_t = \sum_j \alpha_{tj} h_j$", CTX, fontsize=9)
    sx = 8.6
    box(ax, sx, -0.2, 0.9, 0.55, "$s_{t-1}$", DEC)
    arrow(ax, (sx - 0.45, -0.2), (xs[-1] + 0.4, -0.2), color="tab:purple", lw=1.4)
    label(ax, (sx + xs[-1]) / 2, 0.35, "score every $h_j$:\n$e_{tj} = s_{t-1}^\\top W_a h_j$,\nsoftmax over $j$",
          fontsize=8, va="baseline", color="tab:purple")
    box(ax, sx, cy, 1.0, 0.8, "GRU\n$s_t$", DEC)
    arrow(ax, (sx, 0.08), (sx, cy - 0.4))
    arrow(ax, (cx + 1.2, cy), (sx - 0.5, cy))
    box(ax, 10.4, 1.5, 0.8, 0.45, "$y_{t-1}$", TOK, fontsize=9)
    arrow(ax, (10.4, 1.73), (sx + 0.5, cy - 0.1))
    box(ax, sx, 4.0, 3.0, 0.5, r"softmax$(W_o[s_t; C_t]) \to y_t$", TOK, fontsize=9)
    arrow(ax, (sx, cy + 0.4), (sx, 3.75))
    arrow(ax, (cx, cy + 0.3), (sx - 1.5, 4.0), color="tab:green", ls="--", lw=0.9, rad=-0.2)
    fig.tight_layout()
    return fig


def beam_levels(log_prob, vocab_size, beam_size, max_len, eos):
    """Replay a beam search step by step, for ``beam_tree``.

    ``log_prob(prefixes)`` returns log P(prefix | source) for a list of equal-length
    prefixes. The rules are those of exercise 01's ``beam_search``: the best
    ``beam_size`` extensions are kept, and those that end in EOS or reach ``max_len``
    leave the beam as finished. Returns the levels and the finished outputs, best first.
    """
    live, levels, finished = [()], [], []
    for step in range(max_len):
        prefixes = [p + (tok,) for p in live for tok in range(vocab_size)]
        scores = log_prob(prefixes)
        ranked = sorted(zip(prefixes, scores), key=lambda pair: pair[1], reverse=True)
        level, live = [], []
        for rank, (prefix, score) in enumerate(ranked):
            if rank >= beam_size:
                level.append((prefix, score, "dropped"))
            elif prefix[-1] == eos or step == max_len - 1:
                level.append((prefix, score, "finished"))
                finished.append((list(prefix), score))
            else:
                level.append((prefix, score, "kept"))
                live.append(prefix)
        levels.append(level)
        if not live:
            break
    return levels, sorted(finished, key=lambda pair: pair[1], reverse=True)
