"""The built book as a reader gets it, in a real Chromium, with the network cut off.

Every page of `_build/html` is opened from disk (file://, as a reader opens
`_build/html/index.html`) with every request outside the site refused, at desktop and at
phone width. One pass over the site collects what each test asserts; screenshots go to
`_build/screenshots/{desktop,phone}/` for a person to look at.

The site is built first when it is missing (`make test` builds it anyway, see the
Makefile). Without a Chromium (Debian's `chromium`, or $CHROMIUM) the tests are skipped,
except under CI, where a missing browser is a failure.
"""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}


def find_chromium():
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def toc_files():
    """(caption, file) of every page in _toc.yml, in order, the root first."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [(None, toc["root"])]
    for part in toc.get("parts", []):
        for chapter in part.get("chapters", []):
            files.append((part.get("caption"), chapter["file"]))
    return files


def chapter_files():
    return [f for caption, f in toc_files() if caption == "Chapters"]


def page_name(html_path):
    return html_path.relative_to(SITE).as_posix()


# JavaScript run in each page once it has loaded and MathJax has finished.
INSPECT = r"""
async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
  }
  const maths = [...document.querySelectorAll('.math')];
  // Prose only: code cells and their outputs legitimately show TeX source.
  const prose = document.querySelector('main') || document.body;
  const clone = prose.cloneNode(true);
  clone.querySelectorAll('pre, code, .highlight, .cell_output, script, style, mjx-container, mjx-assistive-mml')
       .forEach(e => e.remove());
  const images = [...document.querySelectorAll('img')].map(img => ({
    src: img.getAttribute('src'), complete: img.complete,
    width: img.naturalWidth, height: img.naturalHeight}));
  const links = [...document.querySelectorAll('a[href]')].map(a => ({
    href: a.href, text: a.textContent.trim(), cls: a.className}));
  const sidebar = [...document.querySelectorAll('.bd-sidebar-primary nav a[href]')].map(a => ({
    href: a.href, text: a.textContent.trim()}));
  return {
    math: maths.length,
    typeset: maths.filter(m => m.querySelector('mjx-container')).length,
    merror: document.querySelectorAll('mjx-merror').length,
    mathjax_version: window.MathJax && MathJax.version,
    text: clone.innerText,
    images, links, sidebar,
  };
}
"""

RAW_TEX = re.compile(r"\\\(|\\\)|\\\[|\\\]|\$\$|\\(?:frac|sum|sqrt|alpha|top|mathrm|operatorname|cdot|dots)\b")


@pytest.fixture(scope="session")
def site():
    """Path to the built site; builds the book when it is not there yet."""
    if not (SITE / "index.html").is_file():
        jupyter_book = Path(sys.executable).with_name("jupyter-book")
        subprocess.run([str(jupyter_book), "build", str(ROOT), "-W", "-n", "--keep-going"], cwd=ROOT, check=True)
    return SITE


@pytest.fixture(scope="session")
def browser():
    chromium = find_chromium()
    if chromium is None:
        if os.environ.get("CI"):
            pytest.fail("no Chromium installed: .ci/run installs Debian's chromium")
        pytest.skip("no Chromium installed (apt-get install chromium, or set $CHROMIUM)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium,
            # No background traffic to outside hosts: the page's own requests are the test.
            args=["--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--disable-quic"])
        yield browser
        browser.close()


def visit(browser, url, viewport, shot=None):
    """Open url with only file:// requests allowed; what the page shows and what went wrong."""
    context = browser.new_context(viewport=viewport, device_scale_factor=1)
    page = context.new_page()
    errors, failed, outside = [], [], []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("requestfailed", lambda r: failed.append(f"{r.url} ({r.failure})"))

    def only_local(route):
        if route.request.url.startswith(("file://", "data:", "blob:")):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", only_local)
    page.goto(url, wait_until="load")
    found = page.evaluate(INSPECT)
    found["overflow"] = page.evaluate(
        "() => document.documentElement.scrollWidth - document.documentElement.clientWidth")
    if shot is not None:
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot), full_page=True)
    context.close()
    # A refused outside request shows up as a failed one too; it is reported as outside.
    failed = [f for f in failed if not any(f.startswith(o) for o in outside)]
    found.update(errors=errors, failed=failed, outside=outside)
    return found


@pytest.fixture(scope="session")
def pages(site, browser):
    """Every page of the site, at desktop and phone width: {name: {"desktop": ..., "phone": ...}}."""
    result = {}
    for path in sorted(site.rglob("*.html")):
        name = page_name(path)
        if name.startswith(("_", "exercises/")) or name == "index.html":
            continue  # assets, and the redirect to the first page (test_index_opens_the_book)
        shot = name.removesuffix(".html").replace("/", "_") + ".png"
        result[name] = {
            "desktop": visit(browser, path.as_uri(), DESKTOP, SHOTS / "desktop" / shot),
            "phone": visit(browser, path.as_uri(), PHONE, SHOTS / "phone" / shot),
        }
    return result


def local_target(href):
    """The file a file:// link points at, or None for other links."""
    url = urlparse(href)
    return Path(unquote(url.path)) if url.scheme == "file" else None


def test_every_toc_page_is_built(site):
    """Is there a page in the site for every entry of _toc.yml?"""
    missing = [f for _, f in toc_files() if not (site / f"{f}.html").is_file()]
    assert not missing


def test_pages_load_without_errors(pages):
    """Does every page load with no console error, no failed local request and nothing from outside?"""
    problems = {f"{name} ({width})": {k: seen[k] for k in ("errors", "failed", "outside") if seen[k]}
                for name, both in pages.items() for width, seen in both.items()
                if seen["errors"] or seen["failed"] or seen["outside"]}
    assert not problems


def test_every_formula_is_typeset_offline(pages):
    """Is every formula typeset by the local MathJax, with no TeX error and no raw TeX left in the text?"""
    with_math = {name: both["desktop"] for name, both in pages.items() if both["desktop"]["math"]}
    assert "book/03_qkv.html" in with_math and "book/notation.html" in with_math
    for name, seen in with_math.items():
        assert seen["mathjax_version"], f"{name}: MathJax did not load"
        assert seen["typeset"] == seen["math"], f"{name}: {seen['math'] - seen['typeset']} formulas not typeset"
        assert seen["merror"] == 0, f"{name}: {seen['merror']} formulas with a TeX error"
    for name, both in pages.items():
        raw = RAW_TEX.findall(both["desktop"]["text"])
        assert not raw, f"{name}: raw TeX in the text: {raw[:5]}"


def test_every_image_loads(pages):
    """Does every image load, with a non-zero size?"""
    total = 0
    for name, both in pages.items():
        for img in both["desktop"]["images"]:
            total += 1
            assert img["complete"] and img["width"] > 0 and img["height"] > 0, f"{name}: {img['src']} did not load"
    # The chapters draw figures: a site without images has lost them.
    assert total >= len(chapter_files())


def test_no_page_scrolls_sideways_on_a_phone(pages):
    """At 390 px, is every page as wide as the screen (wide tables and code scroll inside their box)?"""
    wide = {name: both["phone"]["overflow"] for name, both in pages.items() if both["phone"]["overflow"] > 1}
    assert not wide


def test_sidebar_lists_every_toc_entry(pages):
    """Does the sidebar of the home page link every page of _toc.yml, under a title?"""
    sidebar = pages[f"{toc_files()[0][1]}.html"]["desktop"]["sidebar"]
    targets = {local_target(a["href"]).resolve(): a["text"] for a in sidebar if local_target(a["href"])}
    for _, f in toc_files()[1:]:
        page = (SITE / f"{f}.html").resolve()
        assert page in targets, f"{f} is not in the sidebar"
        assert targets[page], f"{f} has an empty title in the sidebar"


def test_index_opens_the_book(site, browser):
    """Does _build/html/index.html, the file a reader opens, lead to the book's first page?"""
    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    page.goto((site / "index.html").as_uri())
    page.wait_for_url(f"**/{toc_files()[0][1]}.html", timeout=10_000)
    title = page.title()
    context.close()
    assert title.startswith("Attention and Transformers")


def test_search_finds_the_softmax_chapter(site, browser):
    """Does the search page, asked for "softmax", list chapter 03?"""
    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file://") else r.abort())
    page.goto((site / "search.html").as_uri() + "?q=softmax", wait_until="load")
    page.wait_for_selector("#search-results ul.search li a", timeout=20_000)
    hits = page.eval_on_selector_all("#search-results ul.search li a", "as => as.map(a => a.href)")
    context.close()
    assert any(h.split("#")[0].endswith("book/03_qkv.html") for h in hits), hits


@pytest.mark.parametrize("chapter", chapter_files())
def test_chapter_links_its_exercise(pages, chapter):
    """Does the chapter page offer its exercise notebook for download and in Colab, and itself as .ipynb and .md?"""
    key = chapter.split("/")[-1]
    assert (ROOT / "exercises" / f"{key}.ipynb").is_file(), f"chapter {key} has no exercise notebook"
    links = pages[f"{chapter}.html"]["desktop"]["links"]
    downloads = [a for a in links if "exercise-download" in a["cls"]]
    assert downloads, f"{chapter}: no download link to its exercise"
    notebook = local_target(downloads[0]["href"])
    assert notebook is not None and notebook.name == f"{key}.ipynb" and notebook.is_file()
    assert json.loads(notebook.read_text())["nbformat"] == 4
    assert notebook.read_bytes() == (ROOT / "exercises" / f"{key}.ipynb").read_bytes()
    # The header's download button: the page itself, as a notebook and as its source.
    for suffix in (".ipynb", ".md"):
        source = [local_target(a["href"]) for a in links if a["href"].endswith(f"_sources/{chapter}{suffix}")]
        assert source and source[0].is_file(), f"{chapter}: no download of the page as {suffix}"
    colab = [a["href"] for a in links if a["href"].startswith("https://colab.research.google.com/github/")]
    assert any(h.endswith(f"/exercises/{key}.ipynb") for h in colab), f"{chapter}: no Colab link to its exercise"
