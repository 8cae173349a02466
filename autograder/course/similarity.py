"""For the instructor: submissions whose answers equal the reference or each other.

``python -m autograder similarity SUBMISSIONS... --assignment KEY --out DIR`` reads the
submissions by `grade`'s folder rule (`autograder.course.submissions`: the same size bound, never
following a link) and writes DIR/similarity/KEY.txt, .json and .html. The report is for the
instructor alone: nothing of it reaches a feedback page. A flag is a reason to look at two
notebooks side by side, not a verdict: the reference is public by design, short answers
coincide by chance, and a learner who rewrites an answer by hand is not seen.

**Parts and answers.** The exercise's parts are the functions and classes that the learner
notebook's solution cells define (their stubs: ``softmax``, ``scaled_dot_product_attention``).
A submission's answer to a part is the definition of that name that the notebook leaves in
force (the last one, as the grader's worker loads it), together with the learner's own
top-level helpers and constants it uses, transitively. The code the notebook gives (its
set-up and import cells, the visible tests, the stubs' signatures and docstrings, their
``raise NotImplementedError()``) is not an answer: an answer equal to the stub is "not
answered" and compared with nothing, and the k-grams of the given code are removed from
every fingerprint set (below), so that everyone sharing the stubs makes no two learners alike.

**Normalisation and fingerprints** are `autograder.course.fingerprints`'s: comments,
docstrings, formatting and the learner's own names are gone before anything is compared.

**Exact matches** compare the normalised answers: a submission equal to the reference in a
part, and groups of learners whose answers are equal in every part they answered (equal in some
parts only: shared parts, below). Parts whose answers hold fewer than `MIN_TOKENS` tokens beyond
the stubs together (``padding_mask`` is one line that many write alike) do not flag a submission.

**Near-duplicates.** Each part's normalised token stream is cut into k-grams (`K` tokens),
hashed, and winnowed (the minimum of every window of `WINDOW` hashes is kept: Schleimer,
Wilkerson and Aiken, "Winnowing", SIGMOD 2003, the method of MOSS): any run of K + WINDOW - 1
equal tokens shares a fingerprint, whatever surrounds it, and reordered statements or helpers
keep their fingerprints. The k-grams of the given code are removed. Two submissions are
near-duplicates when the Jaccard similarity of their fingerprint sets (shared over all) is at
least `THRESHOLD`: symmetric, so an answer padded with unrelated code drops below it, and bounded
by 1 for identical sets. The threshold is calibrated in tests/course/test_similarity.py: independent
implementations of 03_qkv's parts (softmax through exp and sum, through logsumexp, through
torch.softmax; attention with einsum or matmul) score 0.055-0.088 as whole submissions and at most
0.23 in one part; the reference against itself with one of the chapter's typical mistakes scores
0.804-0.976 (03_qkv, 12 mistakes) and 0.643-0.991 (06_transformer, 26; the one below 0.7 is
still flagged by its parts equal to the reference). 0.7 sits far above the first and below
nearly all of the second.

**Shared parts** between learners, part by part, because a learner who copies four parts of five
and writes the fifth is neither identical nor, when the fifth is long, a near-duplicate (0.49-0.78
as whole submissions in the tests). Two learners share a part when their answers to it are equal
after normalisation, or near: the part's Jaccard similarity at least `THRESHOLD`, both answers
with `MIN_FINGERPRINTS`. A pair is flagged, with the parts it shares named, when those parts hold
at least `MIN_TOKENS` tokens beyond the stubs together (in a near part, the fewer of the two
answers'), leaving out a part where either answer is equal or near to the reference's: what they
share there is mostly the public reference, whose copies the reference section lists, and
counting it would pair every two learners who start from the reference (38 learners of
06_transformer, each the reference with another typical mistake, make 666 near-duplicate pairs
and no pair sharing parts). A part shorter than `MIN_TOKENS` never flags alone, and counts with
the other parts shared like them: `MIN_TOKENS` bounds how much code two learners may write alike
by chance, in one part or several, as it does for the exact matches (03_qkv's one-line masks
are written alike by many and hold 36 tokens together, below 40). Calibrated per part by the
same tests (``pytest -s tests/course/test_similarity.py -k "not_shared or share_no_parts"``
prints the numbers): independent implementations of a part score at most 0.231 against each
other (softmax 0.152, attention_numpy 0.169, scaled_dot_product_attention 0.086, padding_mask
0.231, causal_mask 0.136; the three implementations, and the reference with each typical
mistake against the two others), and no two such learners share a part; a part copied and
then edited by one of the typical mistakes scores 0.188-0.893 against the original (03_qkv, 17
parts, 11 at least 0.7) and 0.212-0.955 (06_transformer, 47 parts, 36). So the threshold
serves parts unchanged: an edited part below it is not shared, and the parts left as copied
are equal.

**Speed.** Each distinct cell is parsed once and each of its statements walked once (what
normalising needs is recorded then); normalising renames the parsed tree in place and undoes it
(no copies), and identical cells, statements and answers are normalised and fingerprinted once
per report. Parsing and ``ast.unparse`` are then most of the cost. Identical answers are grouped;
the distinct ones' fingerprints that occur in two or more of them form a 0/1 matrix whose product
with itself (NumPy) counts every pair's shared fingerprints at once, for whole submissions and
for each part's distinct answers; the tokens each pair shares are summed as matrices, part by
part. Only the `PAIRS_SHOWN` most similar pairs, and the `PAIRS_SHOWN` pairs sharing the most
tokens, become entries of the report; the rest are counted and grouped. 300 submissions take
a few seconds (benchmarks/similarity_bench.py; its output is in benchmarks/README.md).
"""

from __future__ import annotations

import gc
import html
import json
import os
import sys
from pathlib import Path

from ..core.limits import DEFAULT, Limits
from ..core.logs import log
from ..core.notebook import NotebookError, ParsedNotebook, read_notebook
from ..core.notebook import parse_notebook as read_learner_notebook
from ..core.text import safe
from ..core.usage import UsageError, known_assignment
from .fingerprints import K, WINDOW, Answers, Exercise, NotCompared, kgrams, winnow

THRESHOLD = 0.7
"""Jaccard similarity from which two submissions (or one and the reference), or two answers to one part,
are near-duplicates; calibrated by tests/course/test_similarity.py (independent implementations below
0.5, disguised copies above 0.8)."""
MIN_TOKENS = 40
"""Answer tokens (beyond the stubs) that exact matches, and the parts two learners share, need to flag a
submission or a pair: the two one-line masks of 03_qkv hold 36 together and are written alike by many;
its softmax alone holds 44."""
MIN_FINGERPRINTS = 8
"""Fingerprints (after the given code's are removed) a submission, or an answer to a part, needs to be
a near-duplicate: below that, a Jaccard similarity says nothing."""
PAIRS_SHOWN = 500
"""Near-duplicate pairs, and pairs sharing parts, listed in the report; the rest are counted (their groups
are all listed)."""
NAME_CHARS = 120


# --- comparison -----------------------------------------------------------------------------

def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


def _shared_counts(sets: list[set]):
    """The number of fingerprints each pair of `sets` shares, as a NumPy matrix: the fingerprints
    held by two or more sets are the columns of a 0/1 matrix M, and M @ M.T counts them."""
    import numpy as np

    seen, common = set(), set()
    for s in sets:
        common |= s & seen
        seen |= s
    column = {h: i for i, h in enumerate(common)}
    m = np.zeros((len(sets), max(len(column), 1)), dtype=np.float32)
    for i, s in enumerate(sets):
        cols = [column[h] for h in s if h in column]
        m[i, cols] = 1.0
    return m @ m.T, np.array([len(s) for s in sets], dtype=np.float64)


def _similarities(sets: list[set]):
    """Jaccard similarity of every pair of `sets` (a NumPy matrix)."""
    import numpy as np

    shared, sizes = _shared_counts(sets)
    union = sizes[:, None] + sizes[None, :] - shared
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, shared / union, 0.0), sizes


class _Part:
    """One part across the distinct submissions `reps`: which distinct answer each gives (-1: none),
    which pairs of distinct answers are near (the part's Jaccard similarity at least THRESHOLD, both
    with MIN_FINGERPRINTS), which answers are equal or near to the reference's, and their tokens."""

    def __init__(self, part: str, reps: list[Answers], ref: Answers | None):
        import numpy as np

        texts: dict[str, int] = {}
        sets: list = []
        self.part, self.ids = part, np.full(len(reps), -1)
        for i, r in enumerate(reps):
            t = r.text.get(part)
            if t is not None:
                self.ids[i] = texts.setdefault(t, len(texts))
                if self.ids[i] == len(sets):
                    sets.append(r.fingerprints.get(part, set()))
        k = None
        if ref is not None and part in ref.text:  # the reference's answer: one of them, or one more row
            k = texts.get(ref.text[part])
            if k is None:
                k = len(sets)
                sets.append(ref.fingerprints.get(part, set()))
        sim, sizes = _similarities(sets or [set()])
        big = sizes >= MIN_FINGERPRINTS
        self.shared = (sim >= THRESHOLD) & big[:, None] & big[None, :]
        np.fill_diagonal(self.shared, True)  # equal answers are shared, however short
        like = self.shared[:, k] if k is not None else np.zeros(len(self.shared), dtype=bool)
        self.reference = (self.ids >= 0) & like[np.maximum(self.ids, 0)]
        self.tokens = np.array([r.tokens.get(part, 0) for r in reps], dtype=np.int64)

    def counted(self):
        """The tokens each pair of distinct submissions shares in this part (a NumPy matrix): the
        fewer of their two answers' where they share it, none where either is equal or near to the
        reference's (then what they share is mostly the reference's)."""
        import numpy as np

        at = np.maximum(self.ids, 0)
        answered = self.ids >= 0
        own = ~(self.reference[:, None] | self.reference[None, :])
        shared = self.shared[at][:, at] & answered[:, None] & answered[None, :] & own
        return np.where(shared, np.minimum.outer(self.tokens, self.tokens), 0)

    def relation(self, i: int, j: int) -> str:
        """How distinct submissions i and j relate in this part: "equal", "near" or "" (neither, or unanswered)."""
        a, b = int(self.ids[i]), int(self.ids[j])
        if a < 0 or b < 0:
            return ""
        return "equal" if a == b else "near" if self.shared[a, b] else ""


def _components(n: int, rows, cols) -> list[list[int]]:
    """The connected components of more than one of n nodes joined by the edges (rows[k], cols[k])."""
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, j in zip(rows, cols):
        parent[find(int(i))] = find(int(j))
    found: dict[int, list[int]] = {}
    for i in range(n):
        found.setdefault(find(i), []).append(i)
    return [g for g in found.values() if len(g) > 1]


def _pairs(members: list[list[Answers]], flagged, score, entry, key) -> tuple[list, int, list]:
    """The pairs of learners behind the flagged pairs of distinct submissions (a NumPy 0/1 upper
    triangle): the first PAIRS_SHOWN by `score` (higher first) as `entry(i, j)` with their names,
    sorted by `key`, the number of them all, and their groups (connected components)."""
    import numpy as np

    reps = [ms[0] for ms in members]
    rows, cols = np.nonzero(flagged)
    counts = np.array([len(ms) for ms in members])
    total = int((counts[rows] * counts[cols]).sum())
    order = sorted(range(len(rows)), key=lambda n: (-score[rows[n], cols[n]], reps[rows[n]].who, reps[cols[n]].who))
    listed = []
    for n in order:
        if len(listed) >= PAIRS_SHOWN:
            break
        i, j = int(rows[n]), int(cols[n])
        found = entry(i, j)
        for a in members[i]:
            for b in members[j]:
                listed.append({"students": sorted((a.who, b.who)), **found})
    listed.sort(key=key)
    groups = [sorted(a.who for i in g for a in members[i]) for g in _components(len(reps), rows, cols)]
    return listed[:PAIRS_SHOWN], total, sorted(groups, key=lambda g: (-len(g), g))


def compare(exercise: Exercise, subs: list[Answers]) -> dict:
    """The report's content: reference matches, identical groups, near-duplicate pairs and pairs sharing parts."""
    ref = exercise.reference
    parts = exercise.parts
    # submissions equal to the reference, part by part
    reference = []
    for a in subs:
        equal = [p for p in parts if ref is not None and p in a.text and a.text[p] == ref.text.get(p)]
        tokens = sum(a.tokens[p] for p in equal)
        sim = jaccard(a.all_fingerprints(), ref.all_fingerprints()) if ref is not None else 0.0
        big = len(a.all_fingerprints()) >= MIN_FINGERPRINTS
        if (equal and tokens >= MIN_TOKENS) or (big and sim >= THRESHOLD):
            reference.append({"student": a.who, "equal_parts": equal,
                              "answered_parts": [p for p in parts if p in a.text],
                              "identical": bool(a.text) and a.text == {p: ref.text[p] for p in a.text if p in ref.text}
                              and len(equal) == len(a.text),
                              "similarity": round(sim, 3)})
    # identical answers: groups by the whole normalised answer
    groups: dict[tuple, list[Answers]] = {}
    for a in subs:
        if a.text:
            groups.setdefault(a.key, []).append(a)
    identical = []
    for key, members in groups.items():
        tokens = sum(members[0].tokens.values())
        if len(members) > 1 and tokens >= MIN_TOKENS:
            identical.append({"students": sorted(m.who for m in members), "parts": [p for p in parts
                              if p in members[0].text], "tokens": tokens,
                              "equals_reference": ref is not None and members[0].text
                              == {p: ref.text[p] for p in members[0].text if p in ref.text}
                              and all(p in ref.text for p in members[0].text)})
    identical.sort(key=lambda g: (-len(g["students"]), g["students"]))
    out = {"reference": sorted(reference, key=lambda r: r["student"]), "identical": identical,
           "near_pairs": [], "near_pairs_total": 0, "near_groups": [],
           "shared_pairs": [], "shared_pairs_total": 0, "shared_groups": []}
    # pairs among the distinct answers (identical ones are one member): every pair is counted and
    # grouped, the first PAIRS_SHOWN are listed
    members = list(groups.values())
    reps = [ms[0] for ms in members]
    if len(reps) < 2:
        return out
    import numpy as np

    by_part = [_Part(p, reps, ref) for p in parts]
    # near-duplicates: the whole submissions' Jaccard similarity, most similar first
    sim, sizes = _similarities([r.all_fingerprints() for r in reps])
    big = sizes >= MIN_FINGERPRINTS
    near = np.triu((sim >= THRESHOLD) & big[:, None] & big[None, :], 1)
    out["near_pairs"], out["near_pairs_total"], out["near_groups"] = _pairs(
        members, near, sim, lambda i, j: {"similarity": round(float(sim[i, j]), 3),
                                          "parts": [x.part for x in by_part if x.relation(i, j)]},
        lambda p: (-p["similarity"], p["students"]))
    # shared parts: the tokens of the parts two learners share (the reference's aside), most first
    counted = sum(x.counted() for x in by_part)

    def shared(i: int, j: int) -> dict:
        how = [(x, x.relation(i, j)) for x in by_part]
        return {"parts": [x.part for x, r in how if r], "near_parts": [x.part for x, r in how if r == "near"],
                "reference_parts": [x.part for x, r in how if r and (x.reference[i] or x.reference[j])],
                "answered": sum(1 for x in by_part if x.ids[i] >= 0 and x.ids[j] >= 0),
                "tokens": int(counted[i, j])}

    out["shared_pairs"], out["shared_pairs_total"], out["shared_groups"] = _pairs(
        members, np.triu(counted >= MIN_TOKENS, 1), counted, shared, lambda p: (-p["tokens"], p["students"]))
    return out


# --- reading --------------------------------------------------------------------------------

def parse_notebook(raw: bytes, name: str, limits: Limits = DEFAULT) -> ParsedNotebook:
    """A notebook from the bytes `read_claim` read, by the grader's own reader (`notebook.parse_notebook`):
    what `grade` refuses to read is not compared either (NotCompared, with the reader's reason)."""
    try:
        return read_learner_notebook(raw, name, limits)
    except NotebookError as exc:
        raise NotCompared(str(exc)) from None


def reference_cells(assignment) -> list[dict] | None:
    """The reference's definitions: the generated reference module (solutions/chKEY.py) as one cell,
    else the master's code cells with its answers; None where neither can be read."""
    try:
        return [{"index": 1, "type": "code", "source": assignment.solutions.read_text(encoding="utf-8"),
                 "metadata": {}}]
    except OSError:
        pass
    try:
        from ..authoring.generate import read_master

        return [{"index": i + 1, "type": c.cell_type, "source": c.source, "metadata": dict(c.metadata)}
                for i, c in enumerate(read_master(assignment).cells)]
    except Exception:  # noqa: BLE001 - no reference: the report says so
        return None


def exercise_for(key: str) -> Exercise:
    assignment = known_assignment(key)
    return Exercise(read_notebook(assignment.notebook), reference_cells(assignment))


def similarity_report(paths: list[str], key: str, out: Path | None = None, limits: Limits = DEFAULT) -> dict:
    """Read the submissions in `paths` by `grade`'s folder rule and compare them (the JSON report)."""
    from .submissions import find_submissions, read_claim

    exercise = exercise_for(key)
    scan = find_submissions(paths, key, limits, out=out)
    subs, not_compared = [], []
    for r in scan.rejected:
        not_compared.append({"student": r.student, "reason": f"{r.path} {r.reason}"})
    # The cyclic garbage collector would scan the parsed cells kept for the whole report again and
    # again (a third of the time, measured); parsed trees and notebooks hold no cycles, so reference
    # counting frees them alone.
    collecting = gc.isenabled()
    gc.disable()
    try:
        for found in scan.found:
            who = safe(found.student, NAME_CHARS)
            if found.claim is None or found.problem:
                not_compared.append({"student": who, "reason": safe(found.problem, limits.error_chars)})
                continue
            try:
                got = read_claim(found.claim, limits.notebook_bytes)
                if got.data is None:
                    not_compared.append({"student": who, "reason": f"{safe(str(found.claim.path), limits.path_chars)} "
                                         f"{got.problem}"})
                    continue
                nb = parse_notebook(got.data, str(found.claim.path), limits)
                answers = exercise.answers(nb, who)
            except NotCompared as exc:
                not_compared.append({"student": who, "reason": safe(str(exc), limits.error_chars)})
                continue
            except Exception as exc:  # noqa: BLE001 - one learner's bytes never cost the class its report
                log.warning("similarity: %s not compared", who, exc_info=True)
                not_compared.append({"student": who, "reason": f"it could not be read and compared "
                                     f"({type(exc).__name__})"})
                continue
            if not answers.text:
                not_compared.append({"student": who, "reason": "it answers no part (every answer is the stub as given)"})
                continue
            answers.path = safe(str(found.claim.path), limits.path_chars)
            subs.append(answers)
    finally:
        if collecting:
            gc.enable()
    found = compare(exercise, subs)
    return {
        "assignment": key, "compared": len(subs), "parts": exercise.parts,
        "method": {"k": K, "window": WINDOW, "threshold": THRESHOLD, "min_tokens": MIN_TOKENS,
                   "min_fingerprints": MIN_FINGERPRINTS,
                   "measure": "Jaccard similarity of winnowed k-gram fingerprints of the normalised answers",
                   "shared_parts": "a part is shared when the two answers are equal, or near (its Jaccard similarity "
                                   "at least the threshold); a pair is listed when its shared parts, less those where "
                                   "an answer is equal or near to the reference's, hold at least min_tokens tokens"},
        "reference_available": exercise.reference is not None,
        **found,
        "notes": [{"student": a.who, "note": safe(n, limits.note_chars)} for a in subs for n in a.notes],
        "not_compared": not_compared,
        "not_compared_total": len(not_compared) + max(scan.rejected_total - len(scan.rejected), 0),
    }


# --- the report -----------------------------------------------------------------------------

def summary(report: dict) -> str:
    ident = report["identical"]
    return (f"similarity {report['assignment']}: {report['compared']} submissions compared"
            f" ({report['not_compared_total']} not compared): {len(report['reference'])} equal or near to the "
            f"reference, {len(ident)} groups of identical answers ({sum(len(g['students']) for g in ident)} "
            f"submissions), {report['near_pairs_total']} near-duplicate pairs (Jaccard >= {THRESHOLD}), "
            f"{report['shared_pairs_total']} pairs sharing parts")


def _shared(pair: dict) -> str:
    """A pair's shared parts, each marked when near (not equal) or like the reference (not counted)."""
    def marks(p: str) -> str:
        got = [m for m, where in (("near", "near_parts"), ("like the reference", "reference_parts"))
               if p in pair[where]]
        return f" ({', '.join(got)})" if got else ""

    return ", ".join(p + marks(p) for p in pair["parts"])


def _parts(parts: list[str]) -> str:
    return ", ".join(parts) if parts else "none"


def report_text(report: dict) -> str:
    lines = [summary(report), "",
             "For the instructor only. A flag is a reason to look at the notebooks, not a verdict: the "
             "reference is public, and short answers coincide by chance.", ""]
    if not report["reference_available"]:
        lines.append("The reference could not be read: nothing was compared with it.")
    lines.append("Equal or near to the reference:")
    for r in report["reference"]:
        what = "identical in every answered part" if r["identical"] else f"equal in {_parts(r['equal_parts'])}"
        lines.append(f"  {r['student']}: {what}; similarity {r['similarity']:.2f}")
    lines.append("Identical answers (groups):")
    for g in report["identical"]:
        ref = " (= the reference)" if g["equals_reference"] else ""
        lines.append(f"  {', '.join(g['students'])}: parts {_parts(g['parts'])}, {g['tokens']} tokens{ref}")
    lines.append("Near-duplicates (pairs):")
    for p in report["near_pairs"]:
        lines.append(f"  {p['students'][0]} ~ {p['students'][1]}: similarity {p['similarity']:.2f}, "
                     f"parts {_parts(p['parts'])}")
    if report["near_pairs_total"] > len(report["near_pairs"]):
        lines.append(f"  … {report['near_pairs_total'] - len(report['near_pairs']):,} more pairs (see the groups)")
    lines.append("Near-duplicate groups:")
    for g in report["near_groups"]:
        lines.append(f"  {', '.join(g)}")
    lines.append("Shared parts (pairs; tokens beyond the stubs, in the parts not like the reference):")
    for p in report["shared_pairs"]:
        lines.append(f"  {p['students'][0]} ~ {p['students'][1]}: {len(p['parts'])} of {p['answered']} parts "
                     f"shared: {_shared(p)}; {p['tokens']} tokens")
    if report["shared_pairs_total"] > len(report["shared_pairs"]):
        more = report["shared_pairs_total"] - len(report["shared_pairs"])
        lines.append(f"  … {more:,} more pairs (see the groups)")
    lines.append("Groups sharing parts:")
    for g in report["shared_groups"]:
        lines.append(f"  {', '.join(g)}")
    for n in report["notes"]:
        lines.append(f"note: {n['student']}: {n['note']}")
    for n in report["not_compared"]:
        lines.append(f"not compared: {n['student'] or '-'}: {n['reason']}")
    return "\n".join(safe(line, 4000) for line in lines) + "\n"


def report_html(report: dict) -> str:
    """The report as a page; every learner text is `safe` and HTML-escaped."""
    def e(x) -> str:
        return html.escape(safe(str(x), 4000))

    def table(head, rows) -> str:
        if not rows:
            return "<p>None.</p>"
        out = ["<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>"]
        out += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows]
        return "\n".join(out) + "</table>"

    r = report
    body = [f"<h1>Similar submissions: {e(r['assignment'])}</h1>", f"<p>{e(summary(r))}</p>",
            "<p>For the instructor only. A flag is a reason to look at the notebooks, not a verdict: the reference "
            "is public, and short answers coincide by chance.</p>",
            "<h2>Equal or near to the reference</h2>",
            table(("student", "equal parts", "identical", "similarity"),
                  [(x["student"], _parts(x["equal_parts"]), "yes" if x["identical"] else "no",
                    f"{x['similarity']:.2f}") for x in r["reference"]]),
            "<h2>Identical answers</h2>",
            table(("students", "parts", "tokens", "equal to the reference"),
                  [(", ".join(g["students"]), _parts(g["parts"]), g["tokens"], "yes" if g["equals_reference"] else "no")
                   for g in r["identical"]]),
            "<h2>Near-duplicates</h2>",
            table(("student", "student", "similarity", "parts"),
                  [(p["students"][0], p["students"][1], f"{p['similarity']:.2f}", _parts(p["parts"]))
                   for p in r["near_pairs"]]),
            (f"<p>… {r['near_pairs_total'] - len(r['near_pairs']):,} more pairs (see the groups)</p>"
             if r["near_pairs_total"] > len(r["near_pairs"]) else ""),
            "<h2>Near-duplicate groups</h2>", table(("students",), [(", ".join(g),) for g in r["near_groups"]]),
            "<h2>Shared parts</h2>",
            table(("student", "student", "parts shared", "of parts both answered", "tokens"),
                  [(p["students"][0], p["students"][1], _shared(p), p["answered"], p["tokens"])
                   for p in r["shared_pairs"]]),
            (f"<p>… {r['shared_pairs_total'] - len(r['shared_pairs']):,} more pairs (see the groups)</p>"
             if r["shared_pairs_total"] > len(r["shared_pairs"]) else ""),
            "<h2>Groups sharing parts</h2>", table(("students",), [(", ".join(g),) for g in r["shared_groups"]]),
            "<h2>Notes and submissions not compared</h2>",
            table(("student", "note"), [(n["student"], n["note"]) for n in r["notes"]]
                  + [(n["student"] or "-", "not compared: " + n["reason"]) for n in r["not_compared"]])]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
            f"<title>Similar submissions: {e(r['assignment'])}</title>"
            "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}td,th{border:1px solid #ccc;"
            "padding:.2em .5em;text-align:left}table{border-collapse:collapse}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def write_report(report: dict, out: Path) -> Path:
    """DIR/similarity/KEY.{txt,json,html}; returns the HTML page's path."""
    folder = Path(out) / "similarity"
    folder.mkdir(parents=True, exist_ok=True)
    key = report["assignment"]
    (folder / f"{key}.json").write_text(json.dumps(report, indent=1, ensure_ascii=True) + "\n", encoding="utf-8")
    (folder / f"{key}.txt").write_text(report_text(report), encoding="utf-8")
    page = folder / f"{key}.html"
    page.write_text(report_html(report), encoding="utf-8")
    return page


def similarity_command(args) -> int:
    out = Path(args.out)
    known_assignment(args.assignment)
    missing = [p for p in args.submissions if not os.path.lexists(p)]
    if missing:
        raise UsageError(f"{safe(missing[0], 300)} does not exist")
    report = similarity_report(args.submissions, args.assignment, out=out)
    if not report["compared"] and not report["not_compared_total"]:  # as `grade`: nothing found is a usage error
        given = " ".join(safe(p, 300) for p in args.submissions)
        raise UsageError(f"no notebooks to compare found in {given}")
    try:
        page = write_report(report, out)
    except OSError as exc:
        raise UsageError(f"cannot write the report into {safe(str(out), 300)}: {exc.strerror}") from None
    if args.json:
        json.dump(report, sys.stdout, indent=1, ensure_ascii=True)
        print()
    else:
        print(summary(report) + f"; report: {page}")
    return 0


__all__ = ["K", "WINDOW", "THRESHOLD", "MIN_TOKENS", "Exercise", "Answers", "NotCompared", "compare",
           "exercise_for", "parse_notebook", "similarity_report", "write_report", "similarity_command",
           "report_text", "report_html", "jaccard", "kgrams", "winnow"]
