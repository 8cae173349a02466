"""The built book as a reader gets it, in a real Chromium, with the network cut off.

Every page of `_build/html` is opened from disk (file://, as a reader opens
`_build/html/index.html`) with every request outside the site refused, at desktop and at
phone width. One pass over the site collects what each test asserts. With
BOOK_SCREENSHOTS=1 (`make screenshots`), that pass also saves a full-page screenshot of
each page at each width in `_build/screenshots/{desktop,phone}/` for a person to look at:
no test reads them, and they double the pass's time, so `make test` takes none.

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

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots" if os.environ.get("BOOK_SCREENSHOTS", "0") not in ("", "0") else None
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
  // What is cut off, or too wide for its line: see test_nothing_is_clipped for the definition.
  const cuts = v => v === 'hidden' || v === 'clip';
  const scrolls = v => v === 'auto' || v === 'scroll';
  const named = el => {
    let text = el.textContent;
    const item = el.matches('mjx-container') && window.MathJax && MathJax.startup && MathJax.startup.document
      && MathJax.startup.document.getMathItemsWithin(el)[0];
    if (item) text = item.math;  // the formula's TeX, not its rendered glyphs
    return el.tagName.toLowerCase() + ': ' + text.replace(/\s+/g, ' ').trim().slice(0, 70);
  };
  const box = el => el.tagName.toLowerCase() + [...el.classList].map(c => '.' + c).join('');
  const clipped = [];
  for (const el of prose.querySelectorAll('mjx-container[display="true"], table, .cell_output > *, .cell_output pre')) {
    if (!el.checkVisibility() || el.getBoundingClientRect().width === 0) continue;
    const own = getComputedStyle(el).overflowX, rect = el.getBoundingClientRect();
    const kind = el.matches('mjx-container') ? 'math' : el.matches('table') ? 'table' : 'output';
    if (el.scrollWidth > el.clientWidth + 1 && !scrolls(own) && cuts(own)) {
      clipped.push({what: named(el), kind, cut: true, by: 'itself (overflow-x: ' + own + ')',
                    content: el.scrollWidth, shown: el.clientWidth});
      continue;
    }
    if (kind === 'math' && el.scrollWidth > el.clientWidth + 1) {
      clipped.push({what: named(el), kind, cut: false, by: 'itself (overflow-x: ' + own + ')',
                    content: el.scrollWidth, shown: el.clientWidth});
    }
    // The part of the page el shows: its own box, or more where its content spills out.
    let left = rect.left;
    let right = scrolls(own) || cuts(own) ? rect.right : Math.max(rect.right, rect.left + el.clientLeft + el.scrollWidth);
    const content = Math.round(right - left);
    for (let a = el.parentElement; a; a = a.parentElement) {
      const page = a === document.documentElement;
      const over = page ? 'the window' : getComputedStyle(a).overflowX;
      if (over === 'visible') continue;
      const r = a.getBoundingClientRect();
      const inner = page ? 0 : r.left + a.clientLeft;
      if (left >= inner - 1 && right <= inner + a.clientWidth + 1) continue;
      if (scrolls(over)) { left = r.left; right = r.right; continue; }  // reached by scrolling a
      clipped.push({what: named(el), kind, cut: true, by: page ? over : box(a) + ' (overflow-x: ' + over + ')',
                    content, shown: a.clientWidth});
      break;
    }
  }
  return {
    math: maths.length,
    typeset: maths.filter(m => m.querySelector('mjx-container')).length,
    merror: document.querySelectorAll('mjx-merror').length,
    mathjax_version: window.MathJax && MathJax.version,
    text: clone.innerText,
    images, links, sidebar, clipped,
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
        result[name] = {width: visit(browser, path.as_uri(), size, SHOTS / width / shot if SHOTS else None)
                        for width, size in (("desktop", DESKTOP), ("phone", PHONE))}
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


def test_nothing_is_clipped(pages):
    """At 1280 px and at 390 px, is every display equation, table and code-cell output shown whole?

    Each one (MathJax's display output, `mjx-container[display=true]`; each `table`; each
    child of a `.cell_output` and each `pre` in it) that the reader can see is clipped when
    - its content is wider than its box (scrollWidth > clientWidth) and its own computed
      overflow-x is `hidden` or `clip`; or
    - the part of the page it shows (its box, or, with overflow-x `visible`, its box widened
      to its scrollWidth) reaches beyond the visible box (clientWidth, inside the borders) of
      its nearest ancestor whose overflow-x is not `visible`, and that ancestor is `hidden` or
      `clip` rather than `auto` or `scroll`. A scrolling ancestor is fine: what it hides is
      reached by scrolling it, and the check goes on upwards with that ancestor's own box;
      the window counts as a clipping ancestor, for pages do not scroll sideways; or
    - it is a display equation, at 1280 px, wider than its line (scrollWidth > clientWidth
      of the theme's formula box, overflow-x `auto`). The box scrolls, but a reader with
      overlay scrollbars (macOS, and the headless browser of these tests) is shown no
      scrollbar, only a formula cut at the column's edge: on a desktop every formula fits.
      On a phone a formula may scroll sideways in its box.
    One pixel of rounding is allowed everywhere.
    """
    found = [f"{name} ({width}): {c['what']} -- cut by {c['by']}: {c['content']} px in {c['shown']} px"
             for name, both in pages.items() for width, seen in both.items()
             for c in seen["clipped"] if c["cut"] or width == "desktop"]
    assert not found, "\n".join(found)


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


# The explorable attention maps (coursebook/attention_explorer.py, static/attention-explorer.js).
EXPLORER_CHAPTERS = ["book/04_self_attention", "book/05_multi_head", "book/06_transformer"]

# What each explorer of the page embeds and shows: its data, its selects, its bars.
READ_EXPLORERS = r"""
() => [...document.querySelectorAll('div.attention-explorer')].map(root => {
  const value = cls => { const s = root.querySelector('select.' + cls); return s ? Number(s.value) : null; };
  return {
    data: JSON.parse(root.querySelector('script.attention-explorer-data').textContent),
    interactive: !!root.querySelector('.ae-widget'),
    labelled: [...root.querySelectorAll('select')].every(s => s.labels.length === 1 && s.labels[0].textContent.trim()),
    layer: value('ae-layer'), head: value('ae-head'), query: value('ae-query'),
    bars: [...root.querySelectorAll('.ae-bar')].map(b => ({
      key: Number(b.dataset.key), weight: Number(b.dataset.weight),
      label: b.querySelector('.ae-key').textContent, shown: b.querySelector('.ae-value').textContent})),
    cells: root.querySelectorAll('.ae-grid .ae-cell').length,
  };
})
"""

# Contrast (WCAG) of the explorer's text against what is behind it, in the page's theme.
CONTRAST = r"""
() => {
  const rgb = c => (c.match(/[\d.]+/g) || []).map(Number);
  const lum = c => { const v = rgb(c).slice(0, 3).map(x => { x /= 255; return x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4; });
                     return 0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2]; };
  const behind = e => { for (; e; e = e.parentElement) { const c = getComputedStyle(e).backgroundColor, a = rgb(c);
                        if (a.length === 3 || a[3] > 0.5) return c; } return 'rgb(255, 255, 255)'; };
  const worst = {};
  for (const sel of ['.ae-key', '.ae-value', '.ae-caption', '.ae-control label', '.ae-control select', '.ae-grid text']) {
    for (const e of document.querySelectorAll(sel)) {
      const fg = sel === '.ae-grid text' ? getComputedStyle(e).fill : getComputedStyle(e).color;
      const [a, b] = [lum(fg), lum(behind(sel === '.ae-grid text' ? e.closest('svg') : e))];
      const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
      worst[sel] = Math.min(worst[sel] ?? 99, ratio);
    }
  }
  return worst;
}
"""


def open_page(browser, path, viewport=DESKTOP, javascript=True):
    """A page of the site, opened offline; returns (context, page, errors)."""
    context = browser.new_context(viewport=viewport, java_script_enabled=javascript)
    page = context.new_page()
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(("file://", "data:")) else r.abort())
    page.goto(path.as_uri(), wait_until="load")
    return context, page, errors


def check_bars(name, shown, layer, head, query):
    """Do the bars show the embedded weights of (layer, head, query), labelled with the key tokens?"""
    data = shown["data"]
    expected = data["weights"][layer][head][query]
    assert (shown["layer"], shown["head"], shown["query"]) == (layer, head, query), name
    assert [b["key"] for b in shown["bars"]] == list(range(len(data["keys"]))), name
    assert [b["label"] for b in shown["bars"]] == data["keys"], f"{name}: bar labels are not the key tokens"
    for bar, weight in zip(shown["bars"], expected):
        assert abs(bar["weight"] - weight) <= 1e-4, f"{name}: key {bar['key']} shows {bar['weight']}, not {weight}"
        assert abs(float(bar["shown"]) - weight) <= 1e-4, f"{name}: key {bar['key']} reads {bar['shown']}, not {weight}"
    return [b["weight"] for b in shown["bars"]]


def test_chapters_have_attention_explorers(site):
    """Do chapters 04, 05 and 06 each hold at least one explorable attention map?"""
    counts = {c: (site / f"{c}.html").read_text(encoding="utf-8").count('<div class="attention-explorer">')
              for c in EXPLORER_CHAPTERS}
    assert all(counts.values()), counts


@pytest.mark.parametrize("chapter", EXPLORER_CHAPTERS)
def test_attention_explorer_shows_the_chosen_weights(site, browser, chapter):
    """Choosing another layer, head and query (select, hover, click): do the bars change and equal the page's data?"""
    context, page, errors = open_page(browser, site / f"{chapter}.html")
    roots = page.locator("div.attention-explorer")
    count = roots.count()
    assert count, f"{chapter}: no attention explorer"
    page.wait_for_function(f"document.querySelectorAll('div.attention-explorer .ae-widget').length === {count}",
                           timeout=10_000)
    for i in range(count):
        name = f"{chapter} explorer {i}"
        shown = page.evaluate(READ_EXPLORERS)[i]
        data = shown["data"]
        n_layers, n_heads, n_queries = len(data["layers"]), len(data["heads"]), len(data["queries"])
        assert shown["interactive"] and shown["labelled"], name
        assert shown["cells"] == n_queries * len(data["keys"]), f"{name}: the map is not drawn whole"
        assert n_layers * n_heads * n_queries > 1, f"{name}: nothing to choose"
        before = check_bars(name, shown, 0, 0, 0)
        root = roots.nth(i)
        layer, head, query = n_layers - 1, n_heads - 1, n_queries - 1
        if n_layers > 1:
            root.locator("select.ae-layer").select_option(str(layer))
        if n_heads > 1:
            root.locator("select.ae-head").select_option(str(head))
        root.locator("select.ae-query").select_option(str(query))
        after = check_bars(name, page.evaluate(READ_EXPLORERS)[i], layer, head, query)
        if data["weights"][layer][head][query] != data["weights"][0][0][0]:
            assert after != before, f"{name}: the bars did not change"
        # Hovering a row of the map previews that query; clicking it chooses it.
        target = 0 if n_queries > 1 else query
        root.locator(f'.ae-row[data-query="{target}"] .ae-cell').first.hover()
        hovered = page.evaluate(READ_EXPLORERS)[i]
        for bar, weight in zip(hovered["bars"], data["weights"][layer][head][target]):
            assert abs(bar["weight"] - weight) <= 1e-4, f"{name}: hovering query {target} shows other weights"
        root.locator(f'.ae-row[data-query="{target}"] .ae-cell').first.click()
        check_bars(name, page.evaluate(READ_EXPLORERS)[i], layer, head, target)
    context.close()
    assert not errors, f"{chapter}: {errors}"


@pytest.mark.parametrize("chapter", EXPLORER_CHAPTERS)
def test_attention_explorer_falls_back_to_its_image_without_javascript(site, browser, chapter):
    """With JavaScript off, does every explorer show its static heat map, loaded, and no controls?"""
    context, page, _ = open_page(browser, site / f"{chapter}.html", javascript=False)
    images = page.locator("div.attention-explorer img.attention-explorer-image")
    assert images.count() == page.locator("div.attention-explorer").count() > 0, chapter
    for i in range(images.count()):
        image = images.nth(i)
        image.scroll_into_view_if_needed()
        assert image.is_visible(), f"{chapter}: static image {i} is hidden"
        size = image.evaluate("img => [img.complete, img.naturalWidth, img.naturalHeight]")
        assert size[0] and size[1] > 0 and size[2] > 0, f"{chapter}: static image {i} did not load"
    assert page.locator("div.attention-explorer select").count() == 0
    context.close()


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_attention_explorer_is_readable_in_both_themes_and_on_a_phone(site, browser, theme):
    """In the light and the dark theme, at phone width, is the explorer's text readable (contrast >= 4.5) and no wider than the screen?"""
    for chapter in EXPLORER_CHAPTERS:
        context, page, errors = open_page(browser, site / f"{chapter}.html", viewport=PHONE)
        if not page.locator("div.attention-explorer").count():
            context.close()
            continue
        page.evaluate(f"() => {{ document.documentElement.dataset.theme = '{theme}'; }}")
        page.wait_for_selector("div.attention-explorer .ae-widget", timeout=10_000)
        worst = page.evaluate(CONTRAST)
        overflow = page.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")
        context.close()
        assert worst and all(r >= 4.5 for r in worst.values()), f"{chapter} ({theme}): {worst}"
        assert overflow <= 1, f"{chapter} ({theme}): {overflow} px sideways"
        assert not errors, f"{chapter}: {errors}"
