"""Mutation testing of the hidden tests: the operators, a fixed sample of every exercise's mutants
(each must be killed by the real, sandboxed grader), and proof that the sample check fails when a
hidden check is weakened.

The full run is `python -m autograder mutants KEY` (minutes per exercise); here each exercise
grades a few mutants in one grading run (`GradingRun`, in this process).
"""

from __future__ import annotations

import dataclasses
import textwrap

import pytest

from autograder.core.assignments import all_assignments, get_assignment
from autograder.quality import mutants as mt

KEYS = [a.key for a in all_assignments()]
SAMPLE = 2  # mutants per exercise graded in CI


def changes(body: str, op: str, args: str = "x, mask, d") -> list[tuple[str, str]]:
    """(before, after) of every mutant the operator `op` makes of a one-function cell."""
    body = textwrap.indent(textwrap.dedent(body).strip("\n"), "    ")
    source = f"def f({args}):\n    ### BEGIN SOLUTION\n{body}\n    ### END SOLUTION\n"
    return [(m.before.strip(), m.after.strip()) for m in mt.cell_mutants("cell", source, operators=(op,))]


def afters(body: str, op: str) -> list[str]:
    return [after for _, after in changes(body, op)]


# --- (a) each operator makes exactly the change it promises -------------------------------------------

@pytest.mark.parametrize("op, body, expected", [
    ("dim", "return x.softmax(dim=-1)", ["return x.softmax(dim=-2)"]),
    ("dim", "return torch.softmax(x, -2)", ["return torch.softmax(x, -1)"]),
    ("dim", "return x.sum(0)", ["return x.sum(1)"]),
    ("dim", "return np.max(x, axis=1)", ["return np.max(x, axis=0)"]),
    ("dim", "return torch.cat([x, d], dim=-1)", ["return torch.cat([x, d], dim=-2)"]),
    ("dim", "return x.transpose(-2, -1)", ["return x.transpose(-3, -1)"]),
    ("dim", "return x.transpose(1, 2)", ["return x.transpose(0, 2)"]),
    ("keepdim", "return x.sum(-1, keepdim=True)", ["return x.sum(-1)"]),
    ("transpose", "return x @ d.transpose(-2, -1)", ["return x @ d"]),
    ("transpose", "return x @ d.mT", ["return x @ d"]),
    ("transpose", "return np.swapaxes(x, -1, -2)", ["return x"]),
    ("transpose", "return x.permute(0, 2, 1, 3)", ["return x.permute(0, 2, 3, 1)"]),
    ("scale", "return x / math.sqrt(d)", ["return x / d", "return x"]),
    ("scale", "return x * d ** -0.5", ["return x * d ** (-1.0)", "return x"]),
    ("mask", "return x.masked_fill(~mask, 0.0)", ["return x.masked_fill(mask, 0.0)"]),
    ("mask", "return x.masked_fill(mask, 0.0)", ["return x.masked_fill(~mask, 0.0)"]),
    ("mask", "return torch.where(mask, x, d)", ["return torch.where(~mask, x, d)"]),
    ("fill", "return x.masked_fill(~mask, float('-inf'))", ["return x.masked_fill(~mask, 0.0)"]),
    ("fill", "return x.masked_fill(~mask, torch.finfo(x.dtype).min)", ["return x.masked_fill(~mask, 0.0)"]),
    ("fill", "return x.masked_fill(~mask, 0.0)", ["return x.masked_fill(~mask, float('-inf'))"]),
    ("compare", "return x < d", ["return x <= d"]),
    ("compare", "return x >= d", ["return x > d"]),
    ("compare", "return x != d", ["return x == d"]),
    ("off_by_one", "return x[:, d - 1]", ["return x[:, d - 2]", "return x[:, d - 0]"]),
    ("off_by_one", "return x[-1]", ["return x[0]", "return x[-2]"]),
    ("off_by_one", "return [x for i in range(1, d)]", ["return [x for i in range(2, d)]",
                                                      "return [x for i in range(0, d)]"]),
    ("tri", "return mask.tril()", ["return mask.triu()"]),
    ("diagonal", "return mask.triu(diagonal=1)", ["return mask.triu(diagonal=2)", "return mask.triu(diagonal=0)"]),
    ("diagonal", "return torch.tril(mask)", ["return torch.tril(mask, diagonal=1)",
                                             "return torch.tril(mask, diagonal=-1)"]),
    ("swap_args", "return x @ d", ["return d @ x"]),
    ("swap_args", "return torch.cat([x, d], dim=-1)", ["return torch.cat([d, x], dim=-1)"]),
    ("swap_args", "return torch.einsum('bqd,bkd->bqk', x, d)",
     ["return torch.einsum('bqd,bkd->bqk', d, x)", "return torch.einsum('bqd,bkd->bkq', x, d)"]),
    ("swap_args", "return g(x, d)", ["return g(d, x)"]),
    ("swap_name", "return g(q, k, v)", ["return g(v, k, v)", "return g(q, q, v)", "return g(q, k, k)"]),
    ("drop_kwarg", "return g(x, mask=mask)", ["return g(x)"]),
    ("drop_term", "return x + d", ["return x", "return d"]),
    ("drop_term", "return x - d", ["return x"]),
    ("arith", "return x * d", ["return x / d"]),
    ("aug_assign", "x += d\nreturn x", ["x = d"]),
    ("float_const", "return x * 2.0", ["return x * 3.0"]),
    ("float_const", "return x + 0.0", ["return x + 1.0"]),
    ("max_min", "return x.max(-1)", ["return x.min(-1)"]),
    ("max_min", "return max(x, d)", ["return min(x, d)"]),
    ("exp", "return x.exp() / d", ["return x / d"]),
    ("exp", "return np.exp(x)", ["return x"]),
])
def test_operator_makes_exactly_its_change(op, body, expected):
    """Does each operator turn the snippet into exactly the promised mutants, and no others?"""
    if op == "swap_name":
        got = [a for _, a in changes(body, op, args="q, k, v")]
    else:
        got = afters(body, op)
    assert sorted(got) == sorted(expected)


def test_return_intermediate_and_outside_regions():
    """Does `return` of an intermediate pick a local the result is computed from, and is code outside
    the solution region left alone?"""
    source = ("def f(x):\n    y = x + 1.0\n    ### BEGIN SOLUTION\n    e = x.exp()\n"
              "    return e / e.sum(-1)\n    ### END SOLUTION\n")
    got = mt.cell_mutants("cell", source, operators=("return_intermediate", "float_const"))
    assert [(m.before.strip(), m.after.strip()) for m in got] == [("return e / e.sum(-1)", "return e")]


def test_error_messages_are_not_mutated():
    """Is the text of a raised error (an f-string included) left alone, and its condition mutated?"""
    got = changes('if d > 1:\n    raise ValueError(f"need {d - 1} < 1")\nreturn x', "off_by_one")
    assert got == [] and afters('if d > 1:\n    raise ValueError(f"{d - 1}")\nreturn x', "compare") == ["if d >= 1:"]


def test_rest_of_the_cell_is_byte_identical_and_ids_are_stable():
    """Does a mutant change only its node's text (comments, spacing and other lines kept), and does its
    id survive an edit elsewhere in the cell, and a reworded comment, a docstring or a reflowed line?"""
    body = "    s = q  @  k.mT / math.sqrt(d)   # (B, T, T) note: café\n    return s.softmax(dim=-1)\n"
    source = f"def f(q, k, d):\n    ### BEGIN SOLUTION\n{body}    ### END SOLUTION\n"
    ms = mt.cell_mutants("cell", source)
    dim = next(m for m in ms if m.operator == "dim")
    assert dim.source == source.replace("dim=-1", "dim=-2")
    scale = next(m for m in ms if m.operator == "scale" and m.after.strip().startswith("s = q  @  k.mT / d "))
    assert scale.after.endswith("# (B, T, T) note: café")
    edited = "# a comment added above\n" + source.replace("return s.softmax", "y = 1\n    return s.softmax")
    assert {m.id for m in ms} <= {m.id for m in mt.cell_mutants("cell", edited)}
    assert len({m.id for m in ms}) == len(ms)
    # a reworded comment on the mutated line, a docstring and a reflowed expression rename nothing
    reworded = source.replace("# (B, T, T) note: café", "# scores, (B, T, T)").replace(
        "def f(q, k, d):\n", 'def f(q, k, d):\n    """The attention weights."""\n').replace(
        "q  @  k.mT / math.sqrt(d)", "(q @ k.mT\n         / math.sqrt(d))")
    assert [m.id for m in mt.cell_mutants("cell", reworded)] == [m.id for m in ms]


def test_every_exercise_has_mutants_that_compile_and_notebooks_that_differ_in_one_cell():
    """Does every exercise give tensor-specific mutants, each a valid notebook changed in exactly one cell?"""
    from conftest import reference_notebook

    for key in KEYS:
        a = get_assignment(key)
        ms = mt.mutants_of(a)
        assert len(ms) >= 20 and len({m.id for m in ms}) == len(ms), key
        assert {"dim", "swap_args"} & {m.operator for m in ms}, key
        ref = reference_notebook(key)
        for m in mt.sample(ms, 3):
            nb = mt.mutant_notebook(a, m)
            diff = [i for i, (c, r) in enumerate(zip(nb.cells, ref.cells)) if c.source != r.source]
            assert len(diff) == 1 and nb.cells[diff[0]].metadata["nbgrader"]["grade_id"] == m.cell, (key, m.id)


def test_equivalent_marks_need_a_reason_and_stale_ones_are_reported(tmp_path, monkeypatch):
    """Is a mark without a one-line reason refused, and a mark for a mutant that no longer exists reported?"""
    a = get_assignment("03_qkv")
    path = tmp_path / "03_qkv.equivalent.toml"
    monkeypatch.setattr(mt, "equivalent_file", lambda assignment: path)
    for bad in ('reason = ""', 'reason = "a"\ngap = "b"', 'why = "a"', 'reason = """two\nlines"""'):
        path.write_text(f'[softmax-dim-00000000]\n{bad}\n')
        with pytest.raises(ValueError, match="reason"):
            mt.read_marks(a)
    ms = mt.mutants_of(a)[:2]
    path.write_text(f'[{ms[0].id}]\nreason = "cannot change the output"\n[gone-dim-12345678]\nreason = "old"\n'
                    f'[{ms[1].id}]\ngap = "a check with another input would kill it"\n')
    marks, gaps = mt.read_marks(a)
    records = {m.id: {"status": "graded", "score": 26.0, "max_score": 26.0, "checks": [],
                      "parts": {"softmax": {"score": 3.0, "max_score": 3.0}}} for m in ms}
    rep = mt.report("03_qkv", ms, records, marks, gaps=gaps)
    assert rep["stale_marks"] == ["gone-dim-12345678"]
    assert (rep["equivalent"], rep["survived"], rep["score"]) == (1, 1, 0.0)  # a known gap still counts
    text = mt.format_report(rep)
    assert "stale marks" in text and ms[1].before.strip() in text and "cannot change the output" in text
    assert "known gap: a check with another input" in text
    assert ms[1].id not in {m.id for m in mt.sample(ms, 2, exclude=set(marks) | set(gaps))}


def test_committed_marks_are_valid_and_not_stale():
    """Does every committed mark (equivalent or known gap) name an existing mutant, with its one line?"""
    for key in KEYS:
        a = get_assignment(key)
        marks, gaps = mt.read_marks(a)
        assert not (set(marks) | set(gaps)) - {m.id for m in mt.mutants_of(a)}, key


# --- (b) a fixed sample of every exercise's mutants is killed by the real grader ----------------------

def problems(rep: dict) -> list[str]:
    """What the CI check fails on: every sampled mutant that was not killed."""
    return [f"{r['id']}: {r['status']}: {r['before'].strip()} -> {r['after'].strip()}"
            for r in rep["results"] if r["status"] != mt.KILLED]


def ci_sample(key: str) -> list[mt.Mutant]:
    """The exercise's CI sample: fixed by the ids, marked-equivalent mutants and known gaps left out."""
    equivalent, gaps = mt.read_marks(get_assignment(key))
    return mt.sample(mt.mutants_of(get_assignment(key)), SAMPLE, exclude=set(equivalent) | set(gaps))


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    """key -> report of its CI sample, each exercise in one sandboxed, warm grading run of this process
    (`mutants.grade_batch`: the run of `grade`), one exercise after the other."""

    def one(key):
        chosen = ci_sample(key)
        records = mt.grade_batch(get_assignment(key), chosen, tmp_path_factory.mktemp(f"mutants{key}"),
                                 jobs=1, sandbox=True, warm=True)
        return mt.report(key, chosen, records, mt.read_equivalent(get_assignment(key)))

    return {key: one(key) for key in KEYS}


@pytest.mark.slow
@pytest.mark.parametrize("key", KEYS)
def test_sampled_mutants_are_killed(key, sampled):
    """Does the sandboxed grader take points from each of a fixed sample of the exercise's mutants?"""
    rep = sampled[key]
    assert rep["mutants"] == SAMPLE and problems(rep) == [], mt.format_report(rep)


# --- (c) the check fails when a hidden check is weakened ------------------------------------------------

@pytest.mark.slow
def test_weakened_hidden_check_lets_a_sampled_mutant_survive(tmp_path):
    """With the checks that kill a sampled mutant reduced to `return`, does the sample check report it?"""
    from autograder.grading.grader import Grader

    key = "03_qkv"
    a = get_assignment(key)
    mutant = ci_sample(key)[0]
    grader = Grader(a)  # unsandboxed: these notebooks are the reference, changed by us
    records = mt.grade_in_process(grader, [mutant], tmp_path / "intact")
    assert problems(mt.report(key, [mutant], records, {})) == []
    killers = {c["name"] for c in records[mutant.id]["checks"] if not c["passed"]}
    assert killers

    def weakened(**kw):
        return

    grader.checks = [dataclasses.replace(c, fn=weakened, params=()) if c.name in killers else c
                     for c in grader.checks]
    after = mt.report(key, [mutant], mt.grade_in_process(grader, [mutant], tmp_path / "weak"), {})
    assert problems(after) and mutant.id in problems(after)[0] and "survived" in problems(after)[0]
    assert "survivors" in mt.format_report(after)
