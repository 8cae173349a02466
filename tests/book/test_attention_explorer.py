"""The explorable attention map's HTML, without a browser: what the page embeds and refuses.

tests/book/test_browser.py drives the same maps in Chromium on the built book.
"""
import base64
import json
from html.parser import HTMLParser

import numpy as np
import pytest
import torch

from coursebook.attention_explorer import MAX_MAPS, MAX_TOKENS, attention_explorer

TOKENS = ["the", "cat", "sat", "down"]


class Explorer(HTMLParser):
    """What the HTML holds: its elements (tag, attrs), the JSON text, and open tags left."""

    VOID = {"img", "br", "hr", "meta", "input", "link"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.elements, self.stack, self.json_text, self.in_json = [], [], "", False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.elements.append((tag, attrs))
        if tag not in self.VOID:
            self.stack.append(tag)
        self.in_json = tag == "script" and attrs.get("type") == "application/json"

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-1:]}"
        self.stack.pop()
        self.in_json = False

    def handle_data(self, data):
        if self.in_json:
            self.json_text += data


def parse(explorer):
    parser = Explorer()
    parser.feed(explorer._repr_mimebundle_()["text/html"])
    parser.close()
    assert not parser.stack, f"unclosed tags: {parser.stack}"
    return parser


def softmax_weights(*shape, seed=0):
    scores = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return torch.softmax(scores, dim=-1)


def test_html_is_one_explorer_with_data_and_a_static_image():
    """Is the HTML one div.attention-explorer holding a JSON script and an inline PNG that decodes?"""
    parser = parse(attention_explorer(softmax_weights(2, 3, 4, 4), TOKENS, TOKENS, title="demo"))
    tag, attrs = parser.elements[0]
    assert tag == "div" and attrs["class"] == "attention-explorer"
    scripts = [a for t, a in parser.elements if t == "script"]
    assert len(scripts) == 1 and scripts[0]["type"] == "application/json"
    images = [a for t, a in parser.elements if t == "img"]
    assert len(images) == 1 and images[0]["alt"]
    prefix = "data:image/png;base64,"
    assert images[0]["src"].startswith(prefix)
    assert base64.b64decode(images[0]["src"][len(prefix):]).startswith(b"\x89PNG\r\n\x1a\n")


def test_mimebundle_offers_html_and_png():
    bundle = attention_explorer(softmax_weights(4, 4), TOKENS, TOKENS)._repr_mimebundle_()
    assert {"text/html", "image/png", "text/plain"} <= set(bundle)
    assert base64.b64decode(bundle["image/png"]).startswith(b"\x89PNG")


@pytest.mark.parametrize("shape", [(4, 3), (2, 4, 3), (2, 3, 4, 3)])
def test_json_round_trips_the_weights(shape):
    """Does the embedded JSON give back the weights (4-D) within 5e-5, the tokens and the names?"""
    weights = softmax_weights(*shape).numpy()
    keys = ["a", "b", "c"]
    data = json.loads(parse(attention_explorer(weights, TOKENS, keys)).json_text)
    full = weights.reshape((1,) * (4 - weights.ndim) + weights.shape)
    embedded = np.array(data["weights"])
    assert embedded.shape == full.shape
    assert np.abs(embedded - full).max() <= 5e-5
    assert data["queries"] == TOKENS and data["keys"] == keys
    assert len(data["layers"]) == full.shape[0] and len(data["heads"]) == full.shape[1]


def test_names_and_title_are_embedded():
    explorer = attention_explorer(softmax_weights(2, 2, 4, 4), TOKENS, TOKENS, layer_names=["enc 1", "enc 2"],
                                  head_names=["h1", "h2"], title="Encoder")
    data = json.loads(parse(explorer).json_text)
    assert data["layers"] == ["enc 1", "enc 2"] and data["heads"] == ["h1", "h2"] and data["title"] == "Encoder"


def test_masked_entries_and_empty_rows_are_accepted():
    """Are a causal mask's zeros, and a query row that sees no key at all, valid weights?"""
    scores = torch.randn(4, 4).masked_fill(~torch.tril(torch.ones(4, 4, dtype=torch.bool)), float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    weights[3] = 0.0
    data = json.loads(parse(attention_explorer(weights, TOKENS, TOKENS)).json_text)
    assert data["weights"][0][0][0][1:] == [0.0, 0.0, 0.0] and data["weights"][0][0][3] == [0.0] * 4


def test_a_token_cannot_close_the_script():
    """Is `</script><script>alert(1)</script>` escaped in the JSON and in the HTML, yet intact once parsed?"""
    evil = "</script><script>alert(1)</script>"
    tokens = [evil, "a & b", '"quoted"', "<b>bold</b>"]
    explorer = attention_explorer(softmax_weights(4, 4), tokens, tokens, title=evil,
                                  layer_names=[evil], head_names=["<i>"])
    html = explorer._repr_mimebundle_()["text/html"]
    assert html.count("<script") == 1 and html.count("</script>") == 1
    assert "alert(1)</" not in html and "<b>" not in html and "<i>" not in html
    parser = parse(explorer)
    assert [t for t, _ in parser.elements].count("script") == 1
    data = json.loads(parser.json_text)
    assert data["queries"] == tokens and data["title"] == evil and data["layers"] == [evil]


def test_a_dollar_sign_is_drawn_as_written():
    """Does a token with `$` (mathtext to matplotlib) still give a static image?"""
    tokens = ["$", "$x$", "a$b", "c"]
    assert attention_explorer(softmax_weights(4, 4), tokens, tokens).png().startswith(b"\x89PNG")


@pytest.mark.parametrize("weights, queries, keys, message", [
    (softmax_weights(4, 4), TOKENS[:3], TOKENS, "query_tokens: 3 tokens for 4 positions"),
    (softmax_weights(4, 3), TOKENS, TOKENS, "key_tokens: 4 tokens for 3 positions"),
    (softmax_weights(4, 4), ["the", "cat", 3, "down"], TOKENS, "query_tokens must be strings"),
    (softmax_weights(4, 4) * 0.5, TOKENS, TOKENS, "rows must sum to 1"),
    (softmax_weights(4, 4).masked_fill(torch.eye(4, dtype=torch.bool), float("nan")), TOKENS, TOKENS,
     "NaN or infinite"),
    (torch.full((4, 4), float("inf")), TOKENS, TOKENS, "NaN or infinite"),
    (torch.tensor([[2.0, -1.0], [0.5, 0.5]]), TOKENS[:2], TOKENS[:2], "must lie in [0, 1]"),
    (softmax_weights(MAX_TOKENS + 1, 4), ["t"] * (MAX_TOKENS + 1), TOKENS, "too large"),
    (softmax_weights(4, MAX_TOKENS + 1), TOKENS, ["t"] * (MAX_TOKENS + 1), "too large"),
    (softmax_weights(7, 7, 2, 2), TOKENS[:2], TOKENS[:2], "too many maps"),
    (softmax_weights(2, 1, 1, 2, 2), TOKENS[:2], TOKENS[:2], "must have shape"),
    (softmax_weights(4), TOKENS, TOKENS, "must have shape"),
    (np.zeros((0, 4)), [], TOKENS, "empty"),
])
def test_bad_input_raises_a_clear_value_error(weights, queries, keys, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        attention_explorer(weights, queries, keys)


def test_bad_names_raise_value_error():
    with pytest.raises(ValueError, match="head_names: 1 names for 2 heads"):
        attention_explorer(softmax_weights(2, 4, 4), TOKENS, TOKENS, head_names=["only one"])
    with pytest.raises(ValueError, match="title must be a string"):
        attention_explorer(softmax_weights(4, 4), TOKENS, TOKENS, title=None)


def test_limits_are_those_the_chapters_rely_on():
    assert MAX_TOKENS == 40 and MAX_MAPS == 48
    assert attention_explorer(softmax_weights(6, 8, 3, 3), TOKENS[:3], TOKENS[:3]).weights.shape == (6, 8, 3, 3)


def test_tiny_negative_weights_are_written_as_zero():
    weights = np.array([[1.0 + 5e-7, -5e-7], [0.5, 0.5]])
    data = json.loads(parse(attention_explorer(weights, TOKENS[:2], TOKENS[:2])).json_text)
    assert data["weights"][0][0][0] == [1.0, 0.0] and "-0" not in json.dumps(data["weights"])
