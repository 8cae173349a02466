"""The learners' release (`release --learners DIR --repository URL`): the course without what it hides.

The unit tests plant what must never reach learners (a reference module under another name, a
hidden test, a master's marker, solution code re-indented, re-wrapped, renamed or commented, in a
notebook's cell or a page's code) and ask whether `verify` finds it, and whether the notebooks and
pages the course shows on purpose pass. The end-to-end test releases the course from the real
build, `_build/html` (in CI the book is built first; here it is skipped when there is none), and
searches every file it wrote.
"""
import ast
import json
import re
import shutil
import subprocess
import sys
import textwrap

import nbformat
import pytest
import yaml

from autograder import cli
from autograder.core.assignments import ROOT, all_assignments
from autograder.course import learners_release as lr
from autograder.course import release_search as rs

REPO = "https://github.com/example-school/attention-learners"


@pytest.fixture(scope="module")
def forbidden():
    return rs.forbidden_content()


@pytest.fixture(scope="module")
def notebooks():
    return lr.learners_notebooks(REPO, "main")


def release(argv):
    return cli.main(["release", "--learners", *argv])


def test_the_learners_notebooks_offer_visible_tests_only(notebooks):
    """Does each learners' notebook drop check() and the course's install, and keep every graded part?"""
    assert set(notebooks) == {a.key for a in all_assignments()}
    for key, text in notebooks.items():
        nb = nbformat.reads(text, as_version=4)
        course = nbformat.read(ROOT / "exercises" / f"{key}.ipynb", as_version=4)
        assert "check()" not in text and "attention-course" not in text, key
        assert "hidden tests" in text, key
        first_code = next(c for c in nb.cells if c.cell_type == "code")
        assert first_code.id == "course-setup" and f"{REPO[len('https://github.com/'):]}/main/.binder" in first_code.source
        graded = lambda n: [c.metadata["nbgrader"]["grade_id"] for c in n.cells if c.metadata.get("nbgrader", {}).get("grade")]
        assert graded(nb) == graded(course), key


def test_verify_passes_the_learners_notebooks(tmp_path, notebooks, forbidden):
    """Do the notebooks we hand out pass the check that guards the release (no false alarm)?"""
    (tmp_path / "exercises").mkdir()
    for key, text in notebooks.items():
        (tmp_path / "exercises" / f"{key}.ipynb").write_text(text)
    assert rs.verify(tmp_path, forbidden) == []


@pytest.mark.parametrize("plant", ["copy", "reindented", "html", "hidden", "marker", "folder"])
def test_verify_finds_what_must_stay_hidden(tmp_path, forbidden, plant):
    """Is a planted reference module, hidden test or master found, whatever its name and layout?"""
    module = (ROOT / "solutions" / "ch03_qkv.py").read_text()
    hidden = (ROOT / "autograder" / "hidden" / "test_03_qkv.py").read_text()
    target, text = {
        "copy": ("site/_static/notes.py", module),
        "reindented": ("notes.txt", "\n".join("\t" + line.replace(" = ", "=") for line in module.splitlines())),
        "html": ("site/page.html", "<pre>" + "".join(f"<span>{line.replace('<', '&lt;')}</span>\n"
                                                      for line in module.splitlines()) + "</pre>"),
        "hidden": ("exercises/more_tests.py", hidden),
        "marker": ("README.md", "x = 1\n### BEGIN SOLUTION\ny = 2\n"),
        "folder": ("solutions/anything.txt", "harmless words\n"),
    }[plant]
    path = tmp_path / target
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    problems = rs.verify(tmp_path, forbidden)
    assert problems and all(p.startswith(target) for p in problems), problems


# --- solution code in disguise -----------------------------------------------------------------

MASTER = "exercises/source/03_qkv.md"
MODULE = "solutions/ch03_qkv.py"
# The answer of 03's attention_numpy as its master writes it (no page or later notebook shows it)...
ANSWER = """\
    d_k = q.shape[-1]
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(d_k)  # (..., Lq, Lk)
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = softmax(scores, axis=-1)  # (..., Lq, Lk)
    return weights @ v, weights  # (..., Lq, d_v), (..., Lq, Lk)
"""
# ... and as a copier might hand it on: re-laid out, renamed, commented, or all at once.
DISGUISED = {
    "reindented": """\
def attention_numpy(q,k,v,mask = None):
\td_k=q.shape[ -1 ]
\tscores=q@np.swapaxes( k,-1,-2 )/np.sqrt( d_k )
\tif mask is not None :
\t\tscores=np.where( mask,scores,-np.inf )
\tweights=softmax( scores,axis=-1 )
\treturn weights@v , weights
""",
    "rewrapped": """\
def attention_numpy(q, k, v, mask=None):
    d_k = q.shape[
        -1
    ]
    scores = (
        q
        @ np.swapaxes(
            k,
            -1,
            -2,
        )
        / np.sqrt(d_k)
    )
    if mask is not None:
        scores = np.where(mask,
                          scores,
                          -np.inf)
    weights = softmax(scores,
                      axis=-1)
    return (weights @ v,
            weights)
""",
    "renamed": """\
def attend(query, key, value, allowed=None):
    width = query.shape[-1]
    logits = query @ np.swapaxes(key, -1, -2) / np.sqrt(width)
    if allowed is not None:
        logits = np.where(allowed, logits, -np.inf)
    probs = softmax(logits, axis=-1)
    return probs @ value, probs
""",
    "commented": """\
def attention_numpy(q, k, v, mask=None):
    d_k = q.shape[-1]  # the width of a key
    # every query against every key, scaled
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(d_k)
    if mask is not None:  # masked keys get no weight
        scores = np.where(mask, scores, -np.inf)
    weights = softmax(scores, axis=-1)  # rows sum to one
    return weights @ v, weights
""",
    "all at once": """\
def attend(query, key, value, allowed=None):
  # scores first
  width = query.shape[-1]
  logits = (query @ np.swapaxes(key, -1, -2)
            / np.sqrt(width))   # (..., Lq, Lk)
  if allowed is not None:
    logits = np.where(allowed, logits, -np.inf)
  probs = softmax(logits,
                  axis=-1)
  return (probs @ value, probs)
""",
    "in a comment": """\
# An answer, for later:
#     d_k = q.shape[-1]
#     scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(d_k)
#     if mask is not None:
#         scores = np.where(mask, scores, -np.inf)
""",
}


def _notebook_with(notebooks, code: str, output: bool = False) -> str:
    """Exercise 03's learners' notebook with one more code cell, holding the code or printing it."""
    nb = nbformat.reads(notebooks["03_qkv"], as_version=4)
    cell = nbformat.v4.new_code_cell("print(notes)" if output else code)
    if output:
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=code)]
    nb.cells.append(cell)
    return nbformat.writes(nb)


def _page_with(code: str) -> str:
    """A built page showing code as Sphinx does: highlighted by Pygments, in spans, escaped."""
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer

    return ("<html><body><main><h1>Notes</h1><p>Here is what we found &amp; kept.</p>"
            + highlight(code, PythonLexer(), HtmlFormatter()) + "</main></body></html>")


PLACES = {
    "notebook": ("exercises/03_qkv.ipynb", lambda notebooks, code: _notebook_with(notebooks, code)),
    "output": ("site/exercises/03_qkv.ipynb", lambda notebooks, code: _notebook_with(notebooks, code, output=True)),
    "html": ("site/book/03_qkv.html", lambda notebooks, code: _page_with(code)),
    "json": ("site/_static/cells.json", lambda notebooks, code: json.dumps({"cells": [{"source": code}]})),
}


def _plant(tmp_path, notebooks, where: str, code: str) -> str:
    """Code in a learners' notebook's new cell or its output, on a built page, or in a string of a JSON file."""
    target, text = PLACES[where]
    path = tmp_path / target
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text(notebooks, code))
    return target


def test_the_disguised_answer_is_the_masters():
    """Are the planted cases still copies of the master (the master's answer, as `ANSWER` writes it)?"""
    assert ANSWER in (ROOT / MASTER).read_text()


@pytest.mark.parametrize("where", list(PLACES))
@pytest.mark.parametrize("disguise", list(DISGUISED))
def test_verify_finds_solution_code_in_disguise(tmp_path, notebooks, forbidden, disguise, where):
    """Is an answer of a master found re-indented, re-wrapped, renamed or commented, in a notebook's
    cell or output, a built page or a JSON file, with a sentence naming the file and the master (and
    its reference module)?"""
    target = _plant(tmp_path, notebooks, where, DISGUISED[disguise])
    problems = rs.verify(tmp_path, forbidden)
    assert problems and all(p.startswith(target) for p in problems), problems
    assert any(f"solution code from {MASTER}" in p and MODULE in p for p in problems), problems


@pytest.mark.parametrize("where", ["notebook", "html"])
def test_one_line_of_a_master_rewrapped_is_found(tmp_path, notebooks, forbidden, where):
    """Is a single statement of a master, wrapped over lines in brackets of its own, found?"""
    line = "scores = np.where(mask, scores, -np.inf)"
    assert line in ANSWER
    target = _plant(tmp_path, notebooks, where, "masked = np.where(\n    keep,\n    masked,\n    -np.inf,\n)\n")
    problems = rs.verify(tmp_path, forbidden)
    assert len(problems) == 1 and problems[0].startswith(f"{target} holds solution code from {MASTER}"), problems


def test_a_hidden_test_in_disguise_is_found(tmp_path, notebooks, forbidden):
    """Is a hidden test's function, its names renamed and its layout rewritten, found as the hidden test?"""
    test = "autograder/hidden/test_03_qkv.py"
    tree = ast.parse((ROOT / test).read_text())
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_"))
    code = _renamed(ast.unparse(function))
    target = _plant(tmp_path, notebooks, "notebook", code)
    problems = rs.verify(tmp_path, forbidden)
    assert problems and all(p.startswith(target) for p in problems), problems
    assert any(f"of the hidden test {test}" in p for p in problems), problems


def test_the_public_code_passes(tmp_path, notebooks, forbidden):
    """Do the book's own code cells, shown on a page as Sphinx shows them, and the learners'
    notebooks pass (the renamed comparison flags no code the course shows on purpose)?"""
    for page in sorted((ROOT / "book").glob("[0-9]*.md")):
        cells = re.findall(r"^```\{code-cell\}[^\n]*\n(.*?)^```", page.read_text(), flags=re.M | re.S)
        code = "\n".join(re.sub(r"^:\w+:.*\n", "", c, flags=re.M) for c in cells)
        (tmp_path / "site" / "book").mkdir(parents=True, exist_ok=True)
        (tmp_path / "site" / "book" / f"{page.stem}.html").write_text(_page_with(code))
    (tmp_path / "exercises").mkdir()
    for key, text in notebooks.items():
        (tmp_path / "exercises" / f"{key}.ipynb").write_text(text)
    assert rs.verify(tmp_path, forbidden) == []


def _renamed(code: str) -> str:
    """Code with its arguments and local variables renamed, re-laid out by `ast.unparse` (no comments,
    quotes and parentheses its own), indented by three spaces and broken after every comma in brackets."""
    tree = ast.parse(textwrap.dedent(code))
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    names |= {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)} - {"self"}
    new = {name: f"renamed_{i}" for i, name in enumerate(sorted(names))}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in new:
            node.id = new[node.id]
        elif isinstance(node, ast.arg) and node.arg in new:
            node.arg = new[node.arg]
    out, depth = [], 0
    for ch in ast.unparse(tree):
        depth += (ch in "([{") - (ch in ")]}")
        out.append(ch + ("\n" + "   " * (depth + 1) if ch == "," and depth > 0 else ""))
    return textwrap.indent("".join(out), "   ")


def test_every_answer_that_is_found_is_found_renamed(tmp_path, forbidden):
    """Is every answer of every master that a release may not hold as written also found with its
    names renamed and its layout rewritten, and reported as that master's?"""
    from nbgrader import utils as nbgrader_utils

    from autograder.authoring import generate as gen
    tried = 0
    for a in all_assignments():
        master = str(a.master.relative_to(ROOT))
        for cell in gen.read_master(a).cells:
            if cell.cell_type != "code" or not nbgrader_utils.is_solution(cell):
                continue
            code = re.sub(r"^\s*### (BEGIN|END) SOLUTION\n", "", cell.source + "\n", flags=re.M)
            if not any(master in m.unit.sources for m in forbidden.find(code)):
                continue  # public: a later notebook hands it out, or it is too short to tell anything
            tried += 1
            page = tmp_path / f"{a.key}-{tried}.html"
            page.write_text(_page_with(_renamed(code)))
            problems = rs.verify(tmp_path, forbidden)
            page.unlink()
            assert any(f"solution code from {master}" in p for p in problems), (a.key, cell.metadata["nbgrader"])
    assert tried >= 35


def test_every_line_the_line_check_found_is_still_found(forbidden):
    """Is every line of a master's answers that the line-by-line check found (over MIN_LINE characters
    without whitespace) still found alone and re-indented, unless it is that long only with its comment
    (comments no longer count), or the public course shows its code, names aside?"""
    from nbgrader import utils as nbgrader_utils

    from autograder.authoring import generate as gen
    lines = []
    for a in all_assignments():
        for cell in gen.read_master(a).cells:
            if cell.cell_type == "code" and nbgrader_utils.is_solution(cell):
                inside = False
                for line in cell.source.splitlines():
                    if "### BEGIN SOLUTION" in line or "### END SOLUTION" in line:
                        inside = "BEGIN" in line
                    elif inside and len(re.sub(r"\s+|#.*", "", line)) > rs.MIN_LINE:
                        lines.append(line.strip())
    assert len(lines) > 200
    missed = [line for line in lines if not any(m.unit.sources[0].startswith("exercises/source/")
                                                for m in forbidden.find(f"\t  {line}"))]
    shown = rs.Forbidden(forbidden.kept)
    for i, line in enumerate(missed):
        shown.add_code(line, str(i))
    shown.index([])
    public = {s for text in rs._public_texts() for m in shown.find(text) for s in m.unit.sources}
    assert [line for i, line in enumerate(missed) if str(i) not in public] == []


def test_a_folder_with_foreign_files_is_refused(tmp_path, capsys):
    """Is a folder holding someone's files refused before anything is built, and left as it was?"""
    (tmp_path / "thesis.tex").write_text("mine")
    assert release([str(tmp_path), "--repository", REPO]) == 2
    err = capsys.readouterr().err
    assert "thesis.tex" in err and "earlier learners' release" in err and "Traceback" not in err
    assert [p.name for p in tmp_path.iterdir()] == ["thesis.tex"]


def test_an_earlier_release_or_a_fresh_clone_is_accepted(tmp_path):
    """Is an earlier release (its marker) or a clone with only .git taken as a destination?"""
    (tmp_path / ".git").mkdir()
    lr.check_destination(tmp_path)
    (tmp_path / "site").mkdir()
    (tmp_path / lr.MARKER).write_text(json.dumps({"kind": lr.KIND}))
    lr.check_destination(tmp_path)


@pytest.mark.parametrize("url", ["https://gitlab.com/a/b", "github.com/a/b", "https://github.com/a", ""])
def test_the_repository_must_be_on_github(tmp_path, capsys, url):
    assert release([str(tmp_path / "out"), "--repository", url]) == 2
    assert "https://github.com/OWNER/NAME" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_staged_book_drops_the_instructors_part_and_points_at_the_learners():
    config, toc = (yaml.safe_load(t) for t in lr.staged_config(REPO, "spring"))
    assert config["repository"]["url"] == REPO and config["repository"]["branch"] == "spring"
    files = [c["file"] for part in toc["parts"] for c in part["chapters"]]
    assert "book/03_qkv" in files
    assert not [f for f in files if f.startswith("book/instructors") or f in ("book/grading-security", "book/checking")]


def test_the_binder_list_installs_the_stack_without_the_course():
    text = lr.binder_requirements()
    assert "torch==" in text and "numpy==" in text
    assert "-e ." not in text and "attention-course" not in text


# --- end to end, from the book's build ----------------------------------------------------------


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    if not (ROOT / "_build" / "html" / "index.html").exists():
        pytest.skip("no book build in _build/html: run `make book` first (CI builds it before the tests)")
    dest = tmp_path_factory.mktemp("learners")
    proc = subprocess.run([sys.executable, "-m", "autograder", "release", "--learners", str(dest),
                           "--repository", REPO, "--branch", "spring"],
                          capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dest, proc.stdout


@pytest.mark.slow
def test_the_release_holds_nothing_that_is_hidden(released, forbidden):
    """Does every file of a real release pass the search, and do none of the course's hidden files lie there?"""
    dest, _ = released
    files = [p for p in dest.rglob("*") if p.is_file()]
    assert len(files) > 50
    assert rs.verify(dest, forbidden) == []
    names = {"/".join(p.relative_to(dest).parts) for p in files}
    assert not [n for n in names if re.search(r"(^|/)(solutions|hidden|source)/|instructors/|grading-security", n)]
    assert json.loads((dest / lr.MARKER).read_text())["files"] == sorted(names - {lr.MARKER})


@pytest.mark.slow
def test_the_release_site_points_at_the_learners_repository(released):
    """Do the repository button, the launch buttons and every exercise link lead to the learners' repository?"""
    dest, _ = released
    page = (dest / "site" / "book" / "03_qkv.html").read_text()
    links = set(re.findall(r'href="(https://[^"]+)"', page))
    launch = {u for u in links if "colab." in u or "mybinder." in u}
    owner_name = REPO[len("https://github.com/"):]
    assert len(launch) >= 2 and all(owner_name in u for u in launch), launch
    assert REPO in links and f"{REPO}/blob/spring/exercises/03_qkv.ipynb" in links
    assert f"colab.research.google.com/github/{owner_name}/blob/spring/exercises/03_qkv.ipynb" in page
    assert f"mybinder.org/v2/gh/{owner_name}/spring" in page
    assert "attention-course/attention-course" not in "".join(p.read_text(errors="ignore") for p in (dest / "site").rglob("*.html"))


@pytest.mark.slow
def test_the_release_site_does_not_offer_check(released):
    """Does the learners' home page drop `check()` and the instructors' command (which hold only where the hidden
    tests are), while the course's own build keeps them?"""
    dest, _ = released
    page = "book/intro.html"
    ours, theirs = (ROOT / "_build" / "html" / page).read_text(), (dest / "site" / page).read_text()
    for words in ("Check your notebook before you hand it in", "Instructors grade a set of submitted notebooks"):
        assert words in ours and words not in theirs, words
    assert "your instructor grades with hidden ones" in theirs and "grades with hidden ones" not in ours


@pytest.mark.slow
def test_every_exercise_notebook_is_released_and_opens(released):
    dest, _ = released
    for a in all_assignments():
        for path in (dest / "exercises" / f"{a.key}.ipynb", dest / "site" / "exercises" / f"{a.key}.ipynb"):
            nb = nbformat.read(path, as_version=4)
            nbformat.validate(nb)
            assert "check()" not in path.read_text()
    pages = yaml.safe_load((dest / ".github" / "workflows" / "pages.yml").read_text())
    assert pages["jobs"]["deploy"]["steps"][1]["with"]["path"] == "site"


@pytest.mark.slow
def test_a_second_release_replaces_the_first_and_keeps_git(released, tmp_path):
    """Is an earlier release replaced (its stale files gone, .git kept) when released into again?"""
    dest, _ = released
    copy = tmp_path / "clone"
    shutil.copytree(dest, copy)
    (copy / ".git").mkdir()
    (copy / ".git" / "HEAD").write_text("ref: refs/heads/spring\n")
    (copy / "site" / "stale.html").write_text("old")
    fresh = tmp_path / "fresh"
    shutil.copytree(dest, fresh)
    lr.replace_into(copy, fresh)  # the files of a new release, moved in
    assert (copy / ".git" / "HEAD").exists() and not (copy / "site" / "stale.html").exists()
