"""Round two, class 7 (tests/attacks/property_only.py): no points for properties without the work.

Each submission keeps the reference's masks and replaces attention by something that has
the properties the chapter teaches (rows sum to one, masked weights are zero, no look-ahead)
but ignores q or k. It must earn exactly the points of its honest parts.
"""

from __future__ import annotations

import pytest

HONEST_PARTS = ("padding_mask", "causal_mask")


@pytest.mark.parametrize("name", ["property_uniform_weights", "property_first_allowed_key"])
def test_properties_without_the_work_earn_nothing(batch, name):
    """Do weights that never look at q or k earn only the (reference) mask parts?"""
    r = batch["by"][name]
    assert r["status"] == "graded" and not any(c["grader_error"] for c in r["checks"])
    honest = sum(r["parts"][p]["max_score"] for p in HONEST_PARTS)
    assert r["score"] == honest, [(c["name"], c["hint"]) for c in r["checks"] if c["passed"]
                                  and c["part"] not in HONEST_PARTS]


def test_attention_that_ignores_the_queries_loses_the_pytorch_part(batch):
    """Does attention computed from the keys alone lose every check of the PyTorch part?"""
    r = batch["by"]["property_ignores_queries"]
    assert r["status"] == "graded"
    assert r["parts"]["scaled_dot_product_attention"]["score"] == 0
    assert r["score"] == r["max_score"] - r["parts"]["scaled_dot_product_attention"]["max_score"]
