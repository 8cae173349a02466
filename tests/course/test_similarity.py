"""The similarity report: what it flags (copies of the reference or of each other, disguised), what it
does not (independent implementations), hostile notebooks, and the command line."""

from __future__ import annotations

import ast
import json
import re

import pytest

from autograder.core.assignments import get_assignment
from autograder.course.similarity import (MIN_TOKENS, THRESHOLD, Exercise, compare, exercise_for, jaccard,
                                          parse_notebook, report_html)
from chapters.ch03_qkv import MISTAKES
from conftest import run_cli

KEY = "03_qkv"
PARTS = {"softmax": ("softmax",), "attention_numpy": ("attention_numpy",),
         "scaled_dot_product_attention": ("scaled_dot_product_attention",), "masks": ("padding_mask", "causal_mask")}


@pytest.fixture(scope="module")
def exercise() -> Exercise:
    return exercise_for(KEY)


def reference_answers() -> dict[str, str]:
    """grade_id -> the reference's code of that solution cell (from solutions/ch03_qkv.py)."""
    text = get_assignment(KEY).solutions.read_text()
    defs = {n.name: ast.get_source_segment(text, n) for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)}
    return {gid: "\n\n\n".join(defs[n] for n in names) for gid, names in PARTS.items()}


def notebook(answers: dict[str, str], extra: tuple[str, ...] = (), name: str = "learner.ipynb"):
    """The learner notebook with its solution cells replaced by `answers` (grade_id -> code) and
    `extra` cells of the learner's own appended, as the report reads it."""
    nb = json.loads(get_assignment(KEY).notebook.read_text())
    for cell in nb["cells"]:
        gid = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell["source"] = answers[gid]
    nb["cells"] += [{"cell_type": "code", "metadata": {}, "source": src, "outputs": [], "execution_count": None}
                    for src in extra]
    return parse_notebook(json.dumps(nb).encode(), name)


def disguise(code: str, names: dict[str, str]) -> str:
    """A copy as a copier makes it: locals renamed, comments and docstrings reworded, reformatted."""
    for old, new in names.items():
        code = re.sub(rf"\b{old}\b", new, code)
    code = re.sub(r"#.*", "# my own reasoning here", code)
    code = re.sub(r'"""[^"]*"""', '"""I wrote this myself."""', code)
    return code.replace(" / ", "/").replace(", ", ",").replace(" @ ", "@")


RENAMES = {"scores": "s", "weights": "attn", "shifted": "z", "e": "ex", "d_k": "dim"}

# Independent implementations: the same parts written another way (the false-positive side).
LOGSUMEXP = {
    "softmax": "def softmax(x, axis=-1):\n    m = x.max(axis=axis, keepdims=True)\n"
               "    lse = m + np.log(np.exp(x - m).sum(axis=axis, keepdims=True))\n    return np.exp(x - lse)\n",
    "attention_numpy": "def attention_numpy(q, k, v, mask=None):\n"
                       "    logits = np.einsum('...qd,...kd->...qk', q, k) * q.shape[-1] ** -0.5\n"
                       "    if mask is not None:\n        logits = np.where(mask, logits, -np.inf)\n"
                       "    p = softmax(logits)\n    return np.einsum('...qk,...kd->...qd', p, v), p\n",
    "scaled_dot_product_attention":
        "def scaled_dot_product_attention(q, k, v, mask=None, dropout_p=0.0):\n"
        "    logits = torch.einsum('...qd,...kd->...qk', q, k) * q.shape[-1] ** -0.5\n"
        "    if mask is None:\n        p = logits.softmax(-1)\n    else:\n"
        "        logits = torch.where(mask, logits, torch.full_like(logits, torch.finfo(logits.dtype).min))\n"
        "        p = torch.where(mask, logits.softmax(-1), torch.zeros_like(logits))\n"
        "    p = F.dropout(p, dropout_p) if dropout_p else p\n"
        "    return torch.einsum('...qk,...kd->...qd', p, v), p\n",
    "masks": "def padding_mask(tokens, pad_id=0):\n    return tokens.ne(pad_id).unsqueeze(1).unsqueeze(2)\n\n\n"
             "def causal_mask(size, device=None):\n    i = torch.arange(size, device=device)\n"
             "    return i[:, None] >= i[None, :]\n",
}
THROUGH_TORCH = {
    "softmax": "def softmax(x, axis=-1):\n    return torch.softmax(torch.from_numpy(np.asarray(x)), dim=axis).numpy()\n",
    "attention_numpy": "def attention_numpy(q, k, v, mask=None):\n    out = []\n"
                       "    a = np.matmul(q, np.moveaxis(k, -1, -2))\n    a = a / math.sqrt(k.shape[-1])\n"
                       "    if mask is not None:\n        a[..., ~np.broadcast_to(mask, a.shape)] = -np.inf\n"
                       "    w = softmax(a)\n    return np.matmul(w, v), w\n",
    "scaled_dot_product_attention":
        "def scaled_dot_product_attention(q, k, v, mask=None, dropout_p=0.0):\n"
        "    a = torch.matmul(q, k.mT).div(q.shape[-1] ** 0.5)\n"
        "    if mask is not None:\n        a = a.masked_fill(mask.logical_not(), float('-inf'))\n"
        "    w = torch.nan_to_num(torch.softmax(a, -1), nan=0.0)\n"
        "    if dropout_p > 0:\n        w = F.dropout(w, dropout_p, training=True)\n    return torch.matmul(w, v), w\n",
    "masks": "def padding_mask(tokens, pad_id=0):\n    return (tokens != pad_id).view(tokens.shape[0], 1, 1, -1)\n\n\n"
             "def causal_mask(size, device=None):\n    return ~torch.triu(torch.ones(size, size, device=device), 1).bool()\n",
}


def with_mistake(answers: dict[str, str], edits) -> dict[str, str]:
    out = dict(answers)
    for old, new in edits:
        hits = [gid for gid, src in out.items() if old in src]
        assert hits, old
        out = {gid: src.replace(old, new) for gid, src in out.items()}
    return out


def test_independent_implementations_stay_below_half(exercise):
    """Are three implementations written independently, part by part, far below the threshold?"""
    subs = [exercise.answers(notebook(a), who) for who, a in
            (("ref", reference_answers()), ("lse", LOGSUMEXP), ("torch", THROUGH_TORCH))]
    worst = 0.0
    for i in range(3):
        for j in range(i + 1, 3):
            worst = max(worst, jaccard(subs[i].all_fingerprints(), subs[j].all_fingerprints()))
            for part in subs[i].fingerprints:
                assert jaccard(subs[i].fingerprints[part], subs[j].fingerprints[part]) < 0.5, (i, j, part)
    assert worst < 0.5
    report = compare(exercise, subs[1:])
    assert report["reference"] == [] and report["identical"] == [] and report["near_pairs"] == []


def test_independent_parts_are_not_shared(exercise):
    """Is no pair of learners who write each part independently flagged as sharing parts: three who take
    each part from another of the three implementations, and each of the two others against the reference
    with one of the chapter's typical mistakes? Prints the per-part calibration (pytest -s): independent
    implementations of a part against each other, and a part copied and edited by a typical mistake
    against the original."""
    impls = {"ref": reference_answers(), "lse": LOGSUMEXP, "torch": THROUGH_TORCH}
    whole = [exercise.answers(notebook(a), who) for who, a in impls.items()]
    cells = list(PARTS)
    square = [exercise.answers(notebook({g: list(impls.values())[(k + n) % 3][g] for n, g in enumerate(cells)}),
                               f"mixed{k}") for k in range(3)]
    report = compare(exercise, square)
    assert report["shared_pairs"] == [] and report["shared_pairs_total"] == 0 and report["shared_groups"] == []
    independent = {p: 0.0 for p in exercise.parts}
    for i in range(3):
        for j in range(i + 1, 3):
            for p in exercise.parts:
                independent[p] = max(independent[p], jaccard(whole[i].fingerprints[p], whole[j].fingerprints[p]))
    edited, mistaken = [], []
    for name, mistake in MISTAKES.items():
        if not mistake.edits:
            continue
        sub = exercise.answers(notebook(with_mistake(reference_answers(), mistake.edits)), name)
        mistaken.append(sub)
        report = compare(exercise, [sub, *whole[1:]])
        assert report["shared_pairs"] == [] and report["identical"] == [] and report["near_pairs"] == [], name
        for p in exercise.parts:
            for other in whole[1:]:
                independent[p] = max(independent[p], jaccard(sub.fingerprints[p], other.fingerprints[p]))
            if sub.text[p] != exercise.reference.text[p]:
                edited.append(jaccard(sub.fingerprints[p], exercise.reference.fingerprints[p]))
    assert max(independent.values()) < 0.5
    print(f"\nindependent, per part, at most: {', '.join(f'{p} {v:.3f}' for p, v in independent.items())}"
          f"\nedited by a typical mistake, the part against the original: {min(edited):.3f}-{max(edited):.3f} "
          f"({len(edited)} parts, {sum(v >= THRESHOLD for v in edited)} at least {THRESHOLD})")
    assert sorted(edited)[1] > max(independent.values())  # all above the independent ones but one short mask
    # learners who each make another mistake in the reference share nothing beyond the reference
    report = compare(exercise, mistaken)
    assert report["near_pairs_total"] > 0 and report["shared_pairs_total"] == 0


COPIED = {"m": "top", "lse": "log_norm", "logits": "s", "p": "probs", "i": "idx", "a": "sc", "w": "wts"}


def copy_of(answers: dict[str, str], written_apart: str, instead: dict[str, str]) -> dict[str, str]:
    """A learner's copy of another's answers, renamed and re-commented, but for the cell `written_apart`,
    taken from `instead`."""
    copy = {gid: disguise(src, COPIED).replace("):\n", "):\n    # worked this out myself\n", 1)
            for gid, src in answers.items()}
    return dict(copy, **{written_apart: instead[written_apart]})


@pytest.mark.parametrize("written_apart", list(PARTS))
@pytest.mark.parametrize("own", ["lse", "torch"])
def test_copies_of_all_parts_but_one_are_flagged_per_part(exercise, own, written_apart):
    """Is a learner who copies another's answers but for one cell flagged as sharing exactly the parts copied,
    whatever the whole submissions' similarity (0.49-0.78 here, below the threshold for half of them)?"""
    mine, other = (LOGSUMEXP, THROUGH_TORCH) if own == "lse" else (THROUGH_TORCH, LOGSUMEXP)
    a = exercise.answers(notebook(mine), "a")
    b = exercise.answers(notebook(copy_of(mine, written_apart, other)), "b")
    report = compare(exercise, [a, b])
    assert report["identical"] == []
    [pair] = report["shared_pairs"]
    assert pair["students"] == ["a", "b"] and pair["answered"] == 5 and pair["near_parts"] == []
    assert pair["parts"] == [p for p in exercise.parts if p not in PARTS[written_apart]]
    assert pair["tokens"] == sum(a.tokens[p] for p in pair["parts"]) and report["shared_groups"] == [["a", "b"]]


def test_a_short_part_shared_alone_is_not_flagged(exercise):
    """Are two learners who share only one short part (a mask of 26 tokens), or only the reference's two masks,
    not flagged, while the part is still compared (named when a longer one is shared too)?"""
    lse_causal = LOGSUMEXP["masks"].split("\n\n\n")[1]
    torch_padding = THROUGH_TORCH["masks"].split("\n\n\n")[0]
    a = exercise.answers(notebook(LOGSUMEXP), "a")
    b = exercise.answers(notebook(dict(THROUGH_TORCH, masks=torch_padding + "\n\n\n" + lse_causal)), "b")
    assert a.text["causal_mask"] == b.text["causal_mask"] and a.tokens["causal_mask"] < MIN_TOKENS
    report = compare(exercise, [a, b])
    assert report["shared_pairs"] == [] and report["shared_pairs_total"] == 0
    masks = reference_answers()["masks"]
    c, d = (exercise.answers(notebook(dict(impl, masks=masks)), w)
            for w, impl in (("c", LOGSUMEXP), ("d", THROUGH_TORCH)))
    assert compare(exercise, [c, d])["shared_pairs"] == []
    e = exercise.answers(notebook(dict(THROUGH_TORCH, masks=torch_padding + "\n\n\n" + lse_causal,
                                       softmax=LOGSUMEXP["softmax"])), "e")
    [pair] = compare(exercise, [a, e])["shared_pairs"]
    assert pair["parts"] == ["softmax", "causal_mask"]
    assert pair["tokens"] == a.tokens["softmax"] + a.tokens["causal_mask"]


def test_a_copied_part_edited_is_near_and_the_reference_is_not_counted(exercise):
    """Is a copied part with one statement added shared as near, and are parts that both learners hand in
    like the reference named but not counted?"""
    ref = reference_answers()
    mine = dict(LOGSUMEXP, softmax=ref["softmax"], masks=ref["masks"])
    edited = copy_of(mine, "masks", mine)
    edited["scaled_dot_product_attention"] = edited["scaled_dot_product_attention"].replace(
        "    return", "    probs = probs.contiguous()\n    return")
    a, b = exercise.answers(notebook(mine), "a"), exercise.answers(notebook(edited), "b")
    [pair] = compare(exercise, [a, b])["shared_pairs"]
    assert pair["near_parts"] == ["scaled_dot_product_attention"]
    assert pair["reference_parts"] == ["softmax", "padding_mask", "causal_mask"]
    assert pair["parts"] == exercise.parts
    assert pair["tokens"] == a.tokens["attention_numpy"] + min(a.tokens["scaled_dot_product_attention"],
                                                                b.tokens["scaled_dot_product_attention"])
    # the reference's parts alone: both flagged against the reference, not as a pair
    ref_two = {"softmax": ref["softmax"], "attention_numpy": ref["attention_numpy"]}
    only_ref = [exercise.answers(notebook(dict(impl, **ref_two)), w) for w, impl in (("c", LOGSUMEXP), ("d", THROUGH_TORCH))]
    report = compare(exercise, only_ref)
    assert report["shared_pairs"] == [] and {r["student"] for r in report["reference"]} == {"c", "d"}


@pytest.mark.parametrize("mistake", [m for m in MISTAKES if MISTAKES[m].edits])
def test_disguised_copies_of_a_mistake_are_flagged(exercise, mistake):
    """Is a renamed, re-commented, reformatted copy of a learner's answer (the reference with one of
    the chapter's typical mistakes) identical after normalisation, and a near-duplicate of the reference?"""
    original = with_mistake(reference_answers(), MISTAKES[mistake].edits)
    copy = {gid: disguise(src, RENAMES) for gid, src in original.items()}
    a, b = exercise.answers(notebook(original), "a"), exercise.answers(notebook(copy), "b")
    assert a.text == b.text
    assert jaccard(a.all_fingerprints(), exercise.reference.all_fingerprints()) > 0.8
    report = compare(exercise, [a, b])
    assert report["identical"][0]["students"] == ["a", "b"]
    assert {r["student"] for r in report["reference"]} == {"a", "b"}


def test_reordered_helpers_and_a_second_edit_are_near_duplicates(exercise):
    """A copy whose helper is renamed and moved, with one more statement, is a near-duplicate (not identical)
    in the part concerned only; the reference is flagged as identical for the untouched one."""
    ref = reference_answers()
    fill = "scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)"
    one = dict(ref, scaled_dot_product_attention=ref["scaled_dot_product_attention"].replace(
        fill, "scores = scores.masked_fill(~mask, lowest(scores))"))
    other = dict(one, scaled_dot_product_attention=disguise(one["scaled_dot_product_attention"].replace(
        "lowest", "_fill_value"), RENAMES).replace("return", "attn = attn.contiguous()\n    return"))
    helper = "def lowest(t):\n    return torch.finfo(t.dtype).min\n"
    a = exercise.answers(notebook(one, extra=(helper,)), "a")
    b = exercise.answers(notebook(dict(other, softmax=helper.replace("lowest", "_fill_value") + "\n\n" + ref["softmax"])),
                         "b")
    assert a.text["scaled_dot_product_attention"] != b.text["scaled_dot_product_attention"]
    report = compare(exercise, [a, b])
    assert report["identical"] == []
    [pair] = report["near_pairs"]
    assert pair["students"] == ["a", "b"] and pair["similarity"] >= THRESHOLD
    assert "scaled_dot_product_attention" not in pair["parts"] or pair["similarity"] < 1
    assert set(pair["parts"]) >= {"softmax", "attention_numpy", "causal_mask"}


def test_stub_and_given_code_make_no_match(exercise):
    """Do two untouched notebooks, or two that only copy the visible tests into a cell, match nothing?"""
    visible = "x = np.array([[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]])\np = softmax(x)\nassert p.shape == x.shape\n"
    untouched = [exercise.answers(notebook({}, extra=(visible,), name=f"{w}.ipynb"), w) for w in "ab"]
    assert all(not a.text for a in untouched)
    half = {"softmax": reference_answers()["softmax"]}
    subs = [exercise.answers(notebook(half), w) for w in "ab"]
    report = compare(exercise, subs)
    # the softmax alone is 44 tokens beyond the stub: equal to the reference, flagged
    assert report["identical"][0]["parts"] == ["softmax"]
    only_masks = [exercise.answers(notebook({"masks": reference_answers()["masks"]}), w) for w in "ab"]
    assert compare(exercise, only_masks)["reference"] == []  # one-liners coincide by chance


def test_hostile_cells_become_notes(exercise):
    """Does code that does not parse, or nests too deeply, give a note and tokens, never a crash?"""
    ref = reference_answers()
    broken = dict(ref, softmax=ref["softmax"] + "\n    return (((")
    a = exercise.answers(notebook(broken, extra=("x = " + "-" * 100_000 + "1",)), "a")
    assert any("softmax" in n and "compared as tokens" in n for n in a.notes)
    assert any("nested too deeply" in n for n in a.notes)
    assert a.fingerprints["softmax"]
    from autograder.course.similarity import NotCompared
    deep = exercise.answers(notebook(dict(ref, softmax="def softmax(x, axis=-1):\n    return " + "x+" * 50_000 + "x\n")),
                            "b")
    assert any("softmax" in n and "nested too deeply; compared as tokens" in n for n in deep.notes)
    with pytest.raises(NotCompared, match="not valid notebook JSON"):
        parse_notebook(b'{"cells": [', "c.ipynb")
    with pytest.raises(NotCompared, match="more than"):
        exercise.answers(notebook(dict(ref, softmax="x = 1\n" * 40_000)), "d")


def test_command_line_report(tmp_path):
    """Does the command read a folder by grade's rule and write the three files, escaping learner text?"""
    subs = tmp_path / "submitted"
    subs.mkdir()
    ref = reference_answers()
    copies = {"alice": ref, "bob": {g: disguise(s, RENAMES) for g, s in ref.items()}, "carol": LOGSUMEXP}
    for who, answers in copies.items():
        nb = json.loads(get_assignment(KEY).notebook.read_text())
        for cell in nb["cells"]:
            gid = cell["metadata"].get("nbgrader", {}).get("grade_id")
            cell["source"] = answers.get(gid, cell["source"])
        (subs / who).mkdir()
        (subs / who / f"{KEY}.ipynb").write_text(json.dumps(nb))
    (subs / "dave.ipynb").write_text("{not json")
    (subs / "<script>x.ipynb").write_text("{}")
    # valid JSON that Python refuses to read (an integer of 5,000 digits): erin's loss only, with a sentence
    erin = json.loads(get_assignment(KEY).notebook.read_text())
    erin["metadata"]["x"] = "@@"
    (subs / "erin.ipynb").write_text(json.dumps(erin).replace('"@@"', "9" * 5000))
    out = tmp_path / "grading"
    proc = run_cli("similarity", str(subs), "--assignment", KEY, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "3 submissions compared" in proc.stdout and "1 groups of identical answers (2 submissions)" in proc.stdout
    report = json.loads((out / "similarity" / f"{KEY}.json").read_text())
    assert report["identical"][0]["students"] == ["alice", "bob"] and report["identical"][0]["equals_reference"]
    assert {r["student"] for r in report["reference"]} == {"alice", "bob"}
    reasons = " ".join(n["reason"] for n in report["not_compared"])
    assert "dave" in json.dumps(report["not_compared"]) and "not valid notebook JSON" in reasons
    assert {"student": "erin", "reason": "erin.ipynb holds a number of thousands of digits, which Python refuses "
            "to read; no notebook Jupyter writes has one"} in report["not_compared"]
    page = (out / "similarity" / f"{KEY}.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "not compared" in (out / "similarity" / f"{KEY}.txt").read_text()
    assert not (out / "feedback").exists()


def test_html_escapes_every_field():
    """Is a learner's text in any field of the report escaped in the page?"""
    evil = "<img src=x onerror=alert(1)>"
    report = {"assignment": KEY, "compared": 1, "not_compared_total": 1, "reference": [], "identical": [],
              "near_pairs": [], "near_pairs_total": 0, "near_groups": [[evil]], "reference_available": True,
              "shared_pairs": [{"students": [evil, evil], "parts": [evil], "near_parts": [evil],
                                "reference_parts": [], "answered": 1, "tokens": 50}],
              "shared_pairs_total": 1, "shared_groups": [[evil]],
              "notes": [{"student": evil, "note": evil}], "not_compared": [{"student": evil, "reason": evil}]}
    page = report_html(report)
    assert "<img" not in page and page.count("&lt;img") == 9


def test_helpers_of_several_statements_are_followed_and_renamed(exercise):
    """Is a softmax that leans on two helpers and a constant, spread over cells in another order with
    other names, identical to the original, and different once a helper's body changes?"""
    softmax = "def softmax(x, axis=-1):\n    return _normalise(_shifted_exp(x, axis), axis)\n"
    helpers = ("EPS = 0.0\n",
               "def _shifted_exp(x, axis):\n    top = x.max(axis=axis, keepdims=True)\n    return np.exp(x - top) + EPS\n",
               "def _normalise(e, axis):\n    return e / e.sum(axis=axis, keepdims=True)\n")
    renames = {"_shifted_exp": "expo", "_normalise": "scale_rows", "EPS": "TINY", "top": "m"}
    copy = [disguise(src, renames) for src in helpers]
    a = exercise.answers(notebook({"softmax": softmax}, extra=helpers), "a")
    b = exercise.answers(notebook({"softmax": disguise(softmax, renames)}, extra=tuple(reversed(copy))), "b")
    assert a.text["softmax"] == b.text["softmax"]
    assert a.text["softmax"].count("\n") >= 5 and "h0" in a.text["softmax"] and "g" in a.text["softmax"]
    changed = exercise.answers(notebook({"softmax": softmax}, extra=helpers[:2] + (
        "def _normalise(e, axis):\n    return e / np.sum(e, axis, keepdims=True)\n",)), "c")
    assert changed.text["softmax"] != a.text["softmax"]
    # a learner's helper that is never used by an answer is not part of it
    idle = exercise.answers(notebook({"softmax": softmax}, extra=helpers + ("def unused():\n    return 1\n",)), "d")
    assert idle.text == a.text


@pytest.fixture(scope="module")
def transformer():
    from autograder.authoring.generate import read_master

    key = "06_transformer"
    answers = {c.metadata["nbgrader"]["grade_id"]: c.source for c in read_master(get_assignment(key)).cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    return exercise_for(key), answers


def transformer_notebook(answers: dict[str, str], name: str):
    nb = json.loads(get_assignment("06_transformer").notebook.read_text())
    for cell in nb["cells"]:
        cell["source"] = answers.get(cell["metadata"].get("nbgrader", {}).get("grade_id"), cell["source"])
    return parse_notebook(json.dumps(nb).encode(), name)


def test_class_parts_of_chapter_06(transformer):
    """Are the classes of 06_transformer compared method by method: a copy with renamed locals and
    new comments identical to the reference, and one typical mistake a near-duplicate, not identical?"""
    from chapters.ch06_transformer import MISTAKES as MISTAKES_06

    exercise, answers = transformer
    assert {"LayerNorm", "EncoderLayer", "Transformer"} <= set(exercise.parts)
    stored = {n.id for src in answers.values() for n in ast.walk(ast.parse(src))
              if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    # locals only: never a name also written as an attribute or a keyword
    stored = {n for n in stored if not any(re.search(rf"\.{n}\b|\b{n}=(?!=)", src) for src in answers.values())}
    assert len(stored) >= 5
    copy = {gid: disguise(src, {n: f"my_{n}" for n in stored}) for gid, src in answers.items()}
    a = exercise.answers(transformer_notebook(copy, "a.ipynb"), "a")
    assert set(a.text) == set(exercise.parts) and a.text == exercise.reference.text
    mistake = next(m for m in MISTAKES_06.values() if m.edits)
    b = exercise.answers(transformer_notebook(with_mistake(answers, mistake.edits), "b.ipynb"), "b")
    report = compare(exercise, [a, b])
    assert report["identical"] == []
    [pair] = report["near_pairs"]
    assert THRESHOLD <= pair["similarity"] < 1
    assert {r["student"]: r["identical"] for r in report["reference"]} == {"a": True, "b": False}


def test_typical_mistakes_of_chapter_06_share_no_parts(transformer):
    """Are 06_transformer's learners who each hand in the reference with another typical mistake near-duplicates
    of each other but never flagged as sharing parts (what they share is the reference's)? Prints the per-part
    similarity of each edited part to the original (pytest -s)."""
    from chapters.ch06_transformer import MISTAKES as MISTAKES_06

    exercise, answers = transformer
    subs = [exercise.answers(transformer_notebook(with_mistake(answers, m.edits), f"{name}.ipynb"), name)
            for name, m in MISTAKES_06.items() if m.edits]
    edited = [jaccard(s.fingerprints[p], exercise.reference.fingerprints[p]) for s in subs for p in exercise.parts
              if s.text.get(p) != exercise.reference.text.get(p)]
    report = compare(exercise, subs)
    print(f"\n06_transformer, edited by a typical mistake, the part against the original: {min(edited):.3f}-"
          f"{max(edited):.3f} ({len(edited)} parts, {sum(v >= THRESHOLD for v in edited)} at least {THRESHOLD}); "
          f"{len(subs)} learners: {report['near_pairs_total']} near-duplicate pairs, "
          f"{report['shared_pairs_total']} pairs sharing parts")
    assert report["near_pairs_total"] > len(subs) and report["shared_pairs_total"] == 0


def test_a_tree_too_deep_to_rewrite_is_not_compared(exercise):
    """Does an answer that parses but is too deep for ast.unparse make the submission "not compared"
    (one sentence), while the tree stays usable for the next learner?"""
    from autograder.course.similarity import NotCompared

    deep = "def softmax(x, axis=-1):\n    return " + "x+" * 800 + "x\n"
    ast.parse(deep)  # it parses: only the rewriting is too deep
    with pytest.raises(NotCompared, match="answer to softmax is nested too deeply to be compared"):
        exercise.answers(notebook({"softmax": deep}), "a")
    assert exercise.answers(notebook(reference_answers()), "b").text == exercise.reference.text


def write_submissions(subs, answers_of: dict[str, dict[str, str]]) -> None:
    """SUBS/WHO.ipynb for each learner: the learner notebook with their answers in its answer cells."""
    subs.mkdir(exist_ok=True)
    for who, answers in answers_of.items():
        nb = json.loads(get_assignment(KEY).notebook.read_text())
        for cell in nb["cells"]:
            cell["source"] = answers.get(cell["metadata"].get("nbgrader", {}).get("grade_id"), cell["source"])
        (subs / f"{who}.ipynb").write_text(json.dumps(nb))


def test_command_line_json(tmp_path):
    """Does --json print the report itself (the same as the file), and is the count of pairs kept
    beyond the pairs listed?"""
    subs = tmp_path / "submitted"
    ref = reference_answers()
    write_submissions(subs, {"ann": ref, "ben": {g: disguise(s, RENAMES) for g, s in ref.items()}})
    out = tmp_path / "grading"
    proc = run_cli("similarity", str(subs), "--assignment", KEY, "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    assert printed == json.loads((out / "similarity" / f"{KEY}.json").read_text())
    assert printed["compared"] == 2 and printed["identical"][0]["students"] == ["ann", "ben"]
    assert printed["near_pairs_total"] == len(printed["near_pairs"])


def test_command_line_flags_a_learner_sharing_four_parts_of_five(tmp_path):
    """Is a learner who copies another's answers word for word in four parts of five
    (names changed, comments added) and writes the fifth apart flagged, with the four parts named, in the
    JSON, text and HTML reports and on --json's stdout, though neither identical nor a near-duplicate?"""
    subs = tmp_path / "submitted"
    # cy writes every part apart from both: the reference's attention with torch's others
    cy = dict(THROUGH_TORCH, scaled_dot_product_attention=reference_answers()["scaled_dot_product_attention"])
    write_submissions(subs, {"ann": LOGSUMEXP, "ben": copy_of(LOGSUMEXP, "scaled_dot_product_attention",
                                                               THROUGH_TORCH), "cy": cy})
    out = tmp_path / "grading"
    proc = run_cli("similarity", str(subs), "--assignment", KEY, "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    assert printed == json.loads((out / "similarity" / f"{KEY}.json").read_text())
    assert printed["compared"] == 3 and printed["identical"] == [] and printed["near_pairs"] == []
    four = ["softmax", "attention_numpy", "padding_mask", "causal_mask"]
    [pair] = printed["shared_pairs"]
    assert pair["students"] == ["ann", "ben"] and pair["parts"] == four and pair["answered"] == 5
    assert pair["near_parts"] == [] and pair["reference_parts"] == [] and pair["tokens"] >= 3 * MIN_TOKENS
    assert printed["shared_pairs_total"] == 1 and printed["shared_groups"] == [["ann", "ben"]]
    text = (out / "similarity" / f"{KEY}.txt").read_text()
    assert f"ann ~ ben: 4 of 5 parts shared: {', '.join(four)}; {pair['tokens']} tokens" in text
    assert "1 pairs sharing parts" in text
    page = (out / "similarity" / f"{KEY}.html").read_text()
    assert f"<td>ann</td><td>ben</td><td>{', '.join(four)}</td><td>5</td><td>{pair['tokens']}</td>" in page
    assert [r["student"] for r in printed["reference"]] == ["cy"]  # equal to the reference in one part


def test_one_learner_that_breaks_the_comparison_costs_only_their_place_in_it(tmp_path, monkeypatch):
    """Does any exception while one learner's notebook is read and normalised leave that learner out of the
    report, with the reason, and the others compared as before?"""
    from autograder.course.similarity import Exercise, similarity_report

    subs = tmp_path / "submitted"
    ref = reference_answers()
    write_submissions(subs, {who: ref for who in ("alice", "bob", "mallory")})
    real = Exercise.answers

    def answers(self, nb, who, *args, **kwargs):
        if who == "mallory":
            raise OverflowError("a learner's value")
        return real(self, nb, who, *args, **kwargs)

    monkeypatch.setattr(Exercise, "answers", answers)
    report = similarity_report([str(subs)], KEY)
    assert report["compared"] == 2 and report["identical"][0]["students"] == ["alice", "bob"]
    assert report["not_compared"] == [{"student": "mallory",
                                       "reason": "it could not be read and compared (OverflowError)"}]
