"""The book's site as readers get it: every chapter one click from its exercise.

A chapter `book/KEY.md` whose exercise `exercises/KEY.ipynb` exists gets, under its
title, a box with the notebook's download (copied into the site, so it works offline)
and links that open it in Colab, on Binder and on a JupyterHub. The theme's launch
buttons on that page open the exercise too: the chapter's own source is a MyST
markdown file, which Colab cannot open and which needs the whole course to run.

Every address comes from `_config.yml`: `repository: url/branch` and
`launch_buttons: colab_url/binderhub_url/jupyterhub_url`, so a fork changes one line.

Explorable attention maps (coursebook/attention_explorer.py writes them into the pages)
come alive with static/attention-explorer.js and its stylesheet, both served from the
site itself, so they work offline.

The learners' release (`python -m autograder release --learners`) builds the book with
`course_learners_release: true` among Sphinx's settings; this sets the tag
`learners_release`, so a page keeps text that only holds where the hidden tests exist
(`check()`, the instructors' commands) inside ```{only} not learners_release``` blocks.

The pages import `coursebook` (the experiments, figures and claims beside the references),
a folder of the checkout that the course's install does not carry (it is no part of the wheel
that learners install). Their kernels run in book/, so the build puts the checkout's root
first on the kernels' PYTHONPATH (`put_course_on_kernel_path`): `coursebook` and `solutions`
then come from the checkout that is being built.

Two fixes for the theme, found by tests/book/test_browser.py: long inline code may break on a
phone (static/course.css), and a script that sphinx-thebe adds twice (a console error,
"THEBE_JS_URL has already been declared") is written once.
"""
import html
import os
import shutil
from pathlib import Path
from urllib.parse import quote, urlencode

from docutils import nodes

GITHUB = "https://github.com/"
# The checkout this extension belongs to (book/_ext/ is two levels down), links followed: a
# staged copy of the book (the learners' release) links to the same files.
COURSE_ROOT = Path(__file__).resolve().parents[2]


def exercise_key(app, docname):
    """The chapter key of `book/KEY`, if that chapter has an exercise notebook."""
    if not docname.startswith("book/"):
        return None
    key = docname[len("book/"):]
    if (Path(app.srcdir) / "exercises" / f"{key}.ipynb").is_file():
        return key
    return None


def launch_links(app, key):
    """(label, url) of each configured place that runs the exercise, in a fixed order."""
    opts = app.config.html_theme_options
    repo = opts.get("repository_url", "").rstrip("/")
    branch = opts.get("repository_branch", "") or "main"
    launch = opts.get("launch_buttons", {}) or {}
    path = f"exercises/{key}.ipynb"
    if not repo.startswith(GITHUB):
        return []
    org_repo = repo[len(GITHUB):]
    links = []
    if launch.get("colab_url"):
        links.append(("Colab", f"{launch['colab_url'].rstrip('/')}/github/{org_repo}/blob/{branch}/{path}"))
    if launch.get("binderhub_url"):
        links.append(("Binder", f"{launch['binderhub_url'].rstrip('/')}/v2/gh/{org_repo}/{branch}"
                                f"?labpath={quote(path)}"))
    if launch.get("jupyterhub_url"):
        # nbgitpuller clones the course into the learner's hub home, then opens the notebook.
        query = urlencode({"repo": repo, "branch": branch,
                           "urlpath": f"lab/tree/{org_repo.split('/')[-1]}/{path}"})
        links.append(("JupyterHub", f"{launch['jupyterhub_url'].rstrip('/')}/hub/user-redirect/git-pull?{query}"))
    links.append(("GitHub", f"{repo}/blob/{branch}/{path}"))
    return links


def add_exercise_box(app, doctree, docname):
    key = exercise_key(app, docname)
    if key is None or app.builder.format != "html":
        return
    items = [f'<a class="reference internal exercise-download" href="../exercises/{key}.ipynb" '
             f'download="{key}.ipynb"><code>{key}.ipynb</code></a> (download)']
    for label, url in launch_links(app, key):
        verb = "view on" if label == "GitHub" else "open in"
        items.append(f'<a class="reference external exercise-launch" href="{html.escape(url)}">'
                     f'{verb} {label}</a>')
    box = ('<div class="admonition tip exercise-links">'
           '<p class="admonition-title">Exercise for this chapter</p>'
           f'<p>{" · ".join(items)}</p></div>')
    section = next(iter(doctree.findall(nodes.section)), None)
    parent = section if section is not None else doctree
    # Right under the title, so a learner sees it before scrolling.
    at = 1 if section is not None and section.children and isinstance(section[0], nodes.title) else 0
    parent.insert(at, nodes.raw("", box, format="html"))


def retarget_launch_buttons(app, pagename, templatename, context, doctree):
    """Point the theme's launch buttons at the exercise; drop them on pages without one."""
    buttons = context.get("header_buttons")
    if not buttons:
        return
    key = exercise_key(app, pagename)
    urls = dict(launch_links(app, key)) if key else {}
    keep = []
    for group in buttons:
        if group.get("label") != "launch-buttons":
            keep.append(group)
            continue
        launch = [dict(b, url=urls[b["text"]], tooltip=f"Open the exercise {key}.ipynb in {b['text']}")
                  for b in group.get("buttons", []) if b.get("text") in urls]
        if launch:
            keep.append(dict(group, buttons=launch))
    buttons[:] = keep


def drop_duplicate_scripts(app, pagename, templatename, context, doctree):
    seen, unique = set(), []
    for script in context.get("script_files", []):
        # An inline script is registered once with filename None and once with ''.
        key = (str(getattr(script, "filename", script) or ""), repr(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def add_static(app):
    app.config.html_static_path.append(str(Path(__file__).parent / "static"))


def copy_notebooks(app, exc):
    if exc is not None or app.builder.format != "html":
        return
    # Only the exercises of chapters in the book: a draft chapter's notebook stays out.
    out = Path(app.outdir) / "exercises"
    out.mkdir(exist_ok=True)
    for docname in sorted(app.env.found_docs):
        key = exercise_key(app, docname)
        if key is not None:
            shutil.copy2(Path(app.srcdir) / "exercises" / f"{key}.ipynb", out / f"{key}.ipynb")


def tag_learners_release(app, config):
    if config.course_learners_release:
        app.tags.add("learners_release")


def put_course_on_kernel_path():
    """Put the checkout's root first on PYTHONPATH, which the kernels that execute the pages inherit."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(COURSE_ROOT)]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(COURSE_ROOT), *paths])


def setup(app):
    put_course_on_kernel_path()
    app.add_config_value("course_learners_release", False, "env")
    app.connect("config-inited", tag_learners_release)
    app.connect("builder-inited", add_static)
    app.add_css_file("course.css")
    app.add_css_file("attention-explorer.css")
    app.add_js_file("attention-explorer.js", loading_method="defer")
    app.connect("html-page-context", drop_duplicate_scripts, priority=599)
    app.connect("doctree-resolved", add_exercise_box)
    # After sphinx-book-theme's own launch buttons (priority 501).
    app.connect("html-page-context", retarget_launch_buttons, priority=600)
    app.connect("build-finished", copy_notebooks)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
