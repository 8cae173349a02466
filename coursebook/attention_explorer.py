"""Attention maps a reader can explore in the page, with a static heat map as fallback.

`attention_explorer(weights, query_tokens, key_tokens)` returns an object that Jupyter
and the book display. Its HTML is one `<div class="attention-explorer">` holding

- the data as JSON in a `<script type="application/json">` (weights rounded to four
  decimals, the tokens and the names of layers and heads), written so that no token can
  close the script element;
- a heat map drawn with matplotlib, inlined as a PNG `data:` URI: what a reader without
  JavaScript sees.

The book's script `book/_ext/static/attention-explorer.js` (bundled into the site, no
network) turns each such div into controls: choose the layer, the head and the query
position, and read that query's weights over the keys, with the key tokens as labels.
"""

from __future__ import annotations

import base64
import html
import io
import json

import numpy as np

MAX_TOKENS = 40
MAX_MAPS = 48
ROW_SUM_TOLERANCE = 1e-3
DECIMALS = 4


def as_weights(weights):
    """The weights as a float64 array of shape (n_layers, n_heads, T_q, T_k)."""
    if hasattr(weights, "detach"):
        weights = weights.detach().cpu().double().numpy()
    array = np.asarray(weights, dtype=np.float64)
    if array.ndim == 2:
        array = array[None, None]
    elif array.ndim == 3:
        array = array[None]
    elif array.ndim != 4:
        raise ValueError(
            "attention weights must have shape (T_q, T_k), (n_heads, T_q, T_k) or "
            f"(n_layers, n_heads, T_q, T_k); got {tuple(array.shape)}")
    return array


def check_strings(values, count, what, counted):
    """`values` as a list of str, exactly `count` of them (`counted` names what they label)."""
    values = list(values)
    for value in values:
        if not isinstance(value, str):
            raise ValueError(f"{what} must be strings; got {type(value).__name__} {value!r}")
    if len(values) != count:
        unit = "tokens" if counted == "positions" else "names"
        raise ValueError(f"{what}: {len(values)} {unit} for {count} {counted} of the weights")
    return values


def check_tokens(tokens, length, what):
    """The tokens as a list of str, `length` of them."""
    return check_strings(tokens, length, what, "positions")


def check_names(names, count, what, default):
    """The names of the layers or heads: given (str, `count` of them), or `default i`."""
    if names is None:
        return [f"{default} {i}" for i in range(count)]
    return check_strings(names, count, what, f"{default}s")


def check_weights(array):
    """Raise ValueError unless every map is finite, in [0, 1], small enough, rows summing to 1.

    A row may also be all zero (a query that sees no key, e.g. padding).
    """
    n_layers, n_heads, t_q, t_k = array.shape
    if min(array.shape) == 0:
        raise ValueError(f"attention weights are empty: shape {tuple(array.shape)}")
    if t_q > MAX_TOKENS or t_k > MAX_TOKENS:
        raise ValueError(f"attention map too large to explore: T_q = {t_q}, T_k = {t_k} "
                         f"(at most {MAX_TOKENS} each)")
    if n_layers * n_heads > MAX_MAPS:
        raise ValueError(f"too many maps to explore: {n_layers} layers x {n_heads} heads "
                         f"(at most {MAX_MAPS} in all)")
    if not np.all(np.isfinite(array)):
        raise ValueError("attention weights contain NaN or infinite values")
    if array.min() < -1e-6 or array.max() > 1 + 1e-6:
        raise ValueError(f"attention weights must lie in [0, 1]; got values in "
                         f"[{array.min():.4g}, {array.max():.4g}]")
    sums = array.sum(axis=-1)
    bad = (np.abs(sums - 1) > ROW_SUM_TOLERANCE) & (np.abs(sums) > ROW_SUM_TOLERANCE)
    if bad.any():
        layer, head, query = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"attention rows must sum to 1 (or be all zero where masked): layer {layer}, "
                         f"head {head}, query {query} sums to {sums[layer, head, query]:.6g}")


def script_json(data):
    """JSON that is safe inside a <script> element: no `<`, `>` or `&` left as such."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return (text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def short_label(token, width=12):
    """A token as an axis label: cut to `width` characters, as the page's script does."""
    label = token if len(token) <= width else token[:width - 1] + "\u2026"
    return mpl_text(label)


def mpl_text(text):
    """Text that matplotlib shows as written: a `$` would otherwise start mathtext."""
    return text.replace("$", r"\$")


def heat_map_png(weights, query_tokens, key_tokens, title):
    """A PNG of one attention map: keys across, queries down, long tokens cut short."""
    from matplotlib.figure import Figure

    t_q, t_k = weights.shape
    side = 0.42 if max(t_q, t_k) <= 12 else 0.28 if max(t_q, t_k) <= 24 else 0.2
    fig = Figure(figsize=(max(3.2, 1.6 + side * t_k), max(2.6, 1.4 + side * t_q)), dpi=100)
    ax = fig.add_subplot()
    image = ax.imshow(weights, cmap="viridis", vmin=0.0, vmax=max(float(weights.max()), 1e-9),
                      aspect="auto")
    fontsize = 8 if max(t_q, t_k) <= 16 else 6
    ax.set_xticks(range(t_k), [short_label(t) for t in key_tokens], rotation=90, fontsize=fontsize)
    ax.set_yticks(range(t_q), [short_label(t) for t in query_tokens], fontsize=fontsize)
    ax.set_xlabel("key", fontsize=9)
    ax.set_ylabel("query", fontsize=9)
    if title:
        ax.set_title(mpl_text(title), fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


class AttentionExplorer:
    """Attention maps of several layers and heads, displayed as an explorable widget."""

    def __init__(self, weights, query_tokens, key_tokens, layer_names, head_names, title):
        self.weights = weights
        self.query_tokens = query_tokens
        self.key_tokens = key_tokens
        self.layer_names = layer_names
        self.head_names = head_names
        self.title = title
        self._png = None

    def data(self):
        """What the page embeds: names, tokens and weights rounded to four decimals."""
        # Clipped, and + 0.0 so that a tiny negative weight is written 0, not -0.
        rounded = np.clip(np.round(self.weights, DECIMALS), 0.0, 1.0) + 0.0
        return {
            "title": self.title,
            "layers": self.layer_names,
            "heads": self.head_names,
            "queries": self.query_tokens,
            "keys": self.key_tokens,
            "weights": [[[[float(w) for w in row] for row in head] for head in layer]
                        for layer in rounded],
        }

    def png(self):
        """The static heat map of layer 0, head 0."""
        if self._png is None:
            caption = self.static_caption()
            self._png = heat_map_png(self.weights[0, 0], self.query_tokens, self.key_tokens, caption)
        return self._png

    def static_caption(self):
        """What the static image shows: the title, and which layer and head when there are several."""
        parts = [self.title] if self.title else []
        if len(self.layer_names) > 1:
            parts.append(self.layer_names[0])
        if len(self.head_names) > 1 or len(self.layer_names) > 1:
            parts.append(self.head_names[0])
        return ", ".join(parts)

    def html(self):
        png = base64.b64encode(self.png()).decode("ascii")
        caption = self.static_caption() or "attention weights"
        alt = (f"Heat map of attention weights ({caption}): {len(self.query_tokens)} queries "
               f"down, {len(self.key_tokens)} keys across")
        note = ("Static view: " + caption + "." if len(self.layer_names) * len(self.head_names) > 1
                else "")
        title = f'<p class="attention-explorer-title">{html.escape(self.title)}</p>' if self.title else ""
        return (
            '<div class="attention-explorer">'
            f"{title}"
            f'<script type="application/json" class="attention-explorer-data">{script_json(self.data())}</script>'
            '<div class="attention-explorer-static">'
            f'<img class="attention-explorer-image" src="data:image/png;base64,{png}" '
            f'alt="{html.escape(alt)}">'
            + (f'<p class="attention-explorer-note">{html.escape(note)}</p>' if note else "")
            + "</div></div>"
        )

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {
            "text/html": self.html(),
            "image/png": base64.b64encode(self.png()).decode("ascii"),
            "text/plain": repr(self),
        }

    def __repr__(self):
        n_layers, n_heads, t_q, t_k = self.weights.shape
        return (f"<attention explorer{': ' + self.title if self.title else ''}: "
                f"{n_layers} layer(s) x {n_heads} head(s), {t_q} queries x {t_k} keys>")


def attention_explorer(weights, query_tokens, key_tokens, *, layer_names=None, head_names=None,
                       title=""):
    """An explorable attention map: choose a layer, a head and a query, read its weights.

    weights: torch tensor or numpy array of shape (n_layers, n_heads, T_q, T_k),
    (n_heads, T_q, T_k) or (T_q, T_k); each row sums to 1 (masked entries 0, or a row all
    zero). query_tokens, key_tokens: lists of str, T_q and T_k of them. At most 40 tokens
    each way and 48 maps in all. Raises ValueError on anything else.
    """
    array = as_weights(weights)
    check_weights(array)
    n_layers, n_heads, t_q, t_k = array.shape
    queries = check_tokens(query_tokens, t_q, "query_tokens")
    keys = check_tokens(key_tokens, t_k, "key_tokens")
    layers = check_names(layer_names, n_layers, "layer_names", "layer")
    heads = check_names(head_names, n_heads, "head_names", "head")
    if not isinstance(title, str):
        raise ValueError(f"title must be a string; got {type(title).__name__}")
    return AttentionExplorer(array, queries, keys, layers, heads, title)
