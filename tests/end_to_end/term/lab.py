"""What a person does in Chromium during a term: logs in at the hub, works in JupyterLab with
nbgrader's Assignments panel, grades by hand in formgrader, reads a page.

Every wait is for an event the page shows (an element, a response), never for a guessed delay;
the timeouts only end a broken run.
"""

from __future__ import annotations

import re
from urllib.parse import quote, urljoin

SPAWN_MS = 180_000  # a login that starts the user's server, on a busy 2-core machine
ACTION_MS = 60_000  # one click's answer (a fetch, a submit, a save)
RUN_MS = 240_000  # a notebook run from its first cell to its check() report


class Lab:
    """One user's JupyterLab, reached through the hub, in a browser context of its own."""

    def __init__(self, browser, hub, user: str):
        self.hub, self.user = hub, user
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.context.set_default_timeout(ACTION_MS)
        self.page = self.context.new_page()
        self.base = f"{hub.url}/user/{user}"

    # --- the hub ---------------------------------------------------------------------------
    def start_login(self, then: str = "lab") -> None:
        """Log in at the hub's login page; the hub starts the server, and opens its page `then`
        (JupyterLab, the spawner's default, or e.g. formgrader, through the hub's spawn page and its
        next=). `finish_login` awaits it."""
        self.then = then
        login = f"{self.hub.url}/hub/login"
        if then != "lab":
            spawn = f"/hub/spawn/{self.user}?next={quote(f'/user/{self.user}/{then}', safe='')}"
            login += f"?next={quote(spawn, safe='')}"
        page = self.page
        page.goto(login)
        page.fill("#username_input", self.user)
        page.fill("#password_input", self.hub.password)
        page.click("#login_submit")

    def finish_login(self) -> None:
        """Wait for the spawn to end in the page asked for."""
        self.page.wait_for_url(re.compile(rf"^{re.escape(self.base)}/{self.then}"), timeout=SPAWN_MS)
        if self.then == "lab":
            self.wait_for_lab()
        else:
            self.page.wait_for_load_state("load", timeout=SPAWN_MS)

    def wait_for_lab(self) -> None:
        self.page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=SPAWN_MS)
        self.page.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").wait_for(timeout=SPAWN_MS)

    # --- nbgrader's Assignments panel ----------------------------------------------------------
    def menu(self, menu: str, item: str) -> None:
        self.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(rf"^{menu}$")).click()
        self.page.locator(".lm-Menu-itemLabel", has_text=re.compile(rf"^{re.escape(item)}$")).click()

    def assignments(self) -> None:
        """Open (or bring forward) the Assignments panel and wait until its lists are loaded."""
        self.menu("Nbgrader", "Assignment List")
        panel = self.page.locator("#nbgrader-assignment-list")
        panel.wait_for()
        for which in ("released", "fetched", "submitted"):
            panel.locator(f"#{which}_assignments_list_loading").wait_for(state="hidden")

    def _row(self, which: str, key: str):
        return self.page.locator(f"#{which}_assignments_list > .list_item").filter(
            has=self.page.locator(".item_name", has_text=re.compile(rf"^\s*{key}\s*$")))

    def fetch(self, key: str) -> None:
        self._row("released", key).get_by_role("button", name="Fetch").click()
        self._row("fetched", key).wait_for()

    def submissions(self, key: str) -> list[str]:
        """The timestamps the panel lists under `key` in "Submitted assignments" (and a note each)."""
        row = self._row("submitted", key)
        if not row.count():
            return []
        return [t.strip() for t in row.locator(".nested_list_item .item_name").all_inner_texts()]

    def submit(self, key: str) -> str:
        """Press Submit beside `key`; the new submission's line in "Submitted assignments"."""
        before = len(self.submissions(key))
        self._row("fetched", key).get_by_role("button", name="Submit").click()
        self.page.wait_for_function(
            """([key, n]) => [...document.querySelectorAll('#submitted_assignments_list > .list_item')]
                 .filter(r => r.querySelector('.item_name')?.innerText.trim().startsWith(key))
                 .some(r => r.querySelectorAll('.nested_list_item').length > n)""", arg=[key, before],
            timeout=ACTION_MS)
        return self.submissions(key)[-1]

    def fetch_feedback(self, key: str) -> None:
        """Press Fetch Feedback beside `key` (the panel brought forward) and wait for its "(view feedback)" link."""
        self.assignments()
        row = self._row("submitted", key)
        row.get_by_role("button", name="Fetch Feedback").click()
        self._row("submitted", key).locator("a", has_text="view feedback").first.wait_for()

    def view_feedback(self, key: str) -> str:
        """Follow the panel's "(view feedback)" link (the file browser goes to the feedback's folder),
        open KEY.html there, and read it in JupyterLab's HTML viewer."""
        self._row("submitted", key).locator("a", has_text="view feedback").first.click()
        item = self.page.locator(".jp-DirListing-item", has_text=f"{key}.html")
        item.dblclick()
        frame = self.page.frame_locator(".jp-HTMLViewer:visible iframe")
        frame.locator("body", has_text="Score:").wait_for()
        return frame.locator("body").inner_text()

    def open_from_panel(self, key: str) -> None:
        """Open the assignment's notebook from the panel (the assignment's name, then the notebook)."""
        row = self._row("fetched", key)
        row.locator("a.assignment-notebooks-link").click()
        row.locator(".nested_list_item a", has_text=key).click()
        self.page.locator(".jp-NotebookPanel:visible .jp-Cell").first.wait_for()

    # --- a notebook ----------------------------------------------------------------------------
    def _cell(self, text: str):
        return self.page.locator(".jp-NotebookPanel:visible .jp-CodeCell").filter(has_text=text).first

    def replace_cell(self, containing: str, source: str) -> None:
        """Click into the code cell that shows `containing`, select all of it and type `source` in
        its place (as inserted text: what a paste does, free of the editor's auto-indent)."""
        cell = self._cell(containing)
        cell.scroll_into_view_if_needed()
        editor = cell.locator(".cm-content")
        editor.click()
        self.page.keyboard.press("Control+a")
        self.page.keyboard.insert_text(source)
        self._cell(source.splitlines()[0]).wait_for()
        self.page.keyboard.press("Escape")  # command mode

    def add_cell_at_end(self, source: str) -> None:
        """A new code cell below the last one, with `source` typed in it."""
        last = self.page.locator(".jp-NotebookPanel:visible .jp-Cell").last
        last.scroll_into_view_if_needed()
        last.locator(".jp-InputPrompt").click()  # select the cell, command mode
        self.page.keyboard.press("b")
        self.page.keyboard.press("Enter")  # edit mode in the new cell
        self.page.keyboard.insert_text(source)
        self.page.keyboard.press("Escape")

    def run_all(self) -> None:
        """Run ▸ Run All Cells, then wait until every code cell has run (or a cell's error stopped the run)."""
        self.menu("Run", "Run All Cells")
        self.page.wait_for_function(
            """() => {
                const cells = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell')];
                const prompts = cells.map(c => c.querySelector('.jp-InputPrompt')?.innerText || '');
                if (prompts.some(p => p.includes('*'))) return false;
                const failed = cells.some(c => c.querySelector('[data-mime-type="application/vnd.jupyter.stderr"]'));
                return cells.length > 0 && (failed || prompts.every(p => /\\[\\d+\\]/.test(p)));
            }""", timeout=RUN_MS, polling=500)

    def output_of(self, containing: str) -> str:
        """The output of the last code cell that shows `containing`."""
        cells = self.page.locator(".jp-NotebookPanel:visible .jp-CodeCell").filter(has_text=containing)
        return cells.last.locator(".jp-OutputArea").inner_text()

    def save(self) -> None:
        """Ctrl+S, waiting for the server's answer to the save."""
        with self.page.expect_response(lambda r: r.request.method == "PUT" and "/api/contents/" in r.url
                                       and r.ok):
            self.page.keyboard.press("Control+s")


class Formgrader:
    """The instructor's formgrader, opened through the hub (their server's /formgrader)."""

    def __init__(self, lab: Lab):
        self.lab = lab
        self.page = lab.page  # logged in with then="formgrader": the hub opened formgrader

    def open(self, path: str = "") -> None:
        self.page.goto(f"{self.lab.base}/formgrader/{path.lstrip('/')}")

    def submissions_table(self, key: str) -> dict[str, dict]:
        """Manage Assignments ▸ KEY's submissions: student id -> {name, status, score} as shown."""
        self.open(f"manage_submissions/{key}")
        rows = self.page.locator("table tbody tr")
        # the page's own mark that it has fetched every submission and drawn the table
        self.page.wait_for_function("() => window.models !== undefined && models.loaded === true")
        out = {}
        for cells in (r.locator("td").all_inner_texts() for r in rows.all()):
            if len(cells) >= 5:
                out[cells[1].strip()] = {"name": cells[0].strip(), "status": cells[3].strip(),
                                         "score": cells[4].strip()}
        return out

    def grade_by_hand(self, key: str, student_shown: re.Pattern, grade_id: str, score: float, answer_id: str,
                      comment: str) -> str:
        """Manual Grading ▸ KEY ▸ KEY ▸ the learner's submission: type a score in `grade_id`'s box and a
        comment under the answer `answer_id`, each saved when the box is left. The page's text."""
        page = self.page
        self.open(f"gradebook/{key}/{key}")
        # the row's link to the submission (the one that shows the learner's name, hidden until the eye
        # is pressed; the other says "Submission #N"): followed
        link = page.locator("a[href*='/formgrader/submissions/']", has_text=student_shown).first
        link.wait_for(state="attached")
        page.goto(urljoin(page.url, link.get_attribute("href")))
        box = page.locator(f"input.score#{grade_id}")
        box.wait_for()
        # the page binds its boxes once it has loaded the grades and comments: typed earlier, a score is lost
        page.wait_for_function("() => window.formgrader && formgrader.grades && formgrader.grades.loaded"
                               " && formgrader.comments && formgrader.comments.loaded")
        with page.expect_response(lambda r: "/formgrader/api/grade/" in r.url and r.request.method == "PUT"
                                  and r.ok):
            box.fill(str(score))
            box.press("Tab")
        note = page.locator(f"textarea#{answer_id}-comment")
        with page.expect_response(lambda r: "/formgrader/api/comment/" in r.url and r.request.method == "PUT"
                                  and r.ok):
            note.fill(comment)
            note.press("Tab")
        return page.locator("body").inner_text()
