"""The learners' release (`release --learners DIR --repository URL`): the course without what it hides.

The unit tests plant what must never reach learners (a reference module under another name, a
hidden test, a master's marker) and ask whether `verify` finds it. The end-to-end test releases
the course from the real build, `_build/html` (in CI the book is built first; here it is skipped
when there is none), and searches every file it wrote.
"""
import json
import re
import shutil
import subprocess
import sys

import nbformat
import pytest
import yaml

from autograder import cli
from autograder import learners_release as lr
from autograder.assignments import ROOT, all_assignments

REPO = "https://github.com/example-school/attention-learners"


@pytest.fixture(scope="module")
def forbidden():
    return lr.forbidden_content()


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
    assert lr.verify(tmp_path, forbidden) == []


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
    problems = lr.verify(tmp_path, forbidden)
    assert problems and all(p.startswith(target) for p in problems), problems


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
    assert lr.verify(dest, forbidden) == []
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
