"""The MLflow UI in a real browser: Debian's ``chromium``, headless, driven by Playwright.

What a person does with a sweep in the UI, as steps a test can assert on and the screenshot command
can photograph: open the experiment's runs table (MLflow's "machine learning" view), expand the
sweep's parent run, show a metric as a column, select runs and press Compare, add the metric to
the compare view's plot, and open a run's artifacts. Selectors are those of MLflow 3.17's UI (the
version ``pyproject.toml`` pins).

Playwright's own browser download is not used: it drives the system's chromium
(``apt-get install chromium``), with a fresh profile and none of chromium's background traffic.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from bagpipe.harness.track.ui import run_page, runs_page

if TYPE_CHECKING:
    from playwright.sync_api import Locator, Page

CHROMIUM = "chromium"
#: No sandbox (root in CI), no GPU, and nothing that reaches out to the network on its own.
CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]
#: A page of the UI takes tens of seconds to settle on two busy cores.
TIMEOUT_MS = 180_000
_EXPAND = 'button[data-component-id$="runnamecellrenderer.tsx_46"]'
_ASSISTANT_CLOSE = '[data-component-id="mlflow.assistant.chat_panel.close"]'


def browser_missing() -> str | None:
    """Why the browser cannot be driven here (None: it can)."""
    if shutil.which(CHROMIUM) is None:
        return f"no {CHROMIUM} on PATH (apt-get install chromium)"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed"
    return None


@contextlib.contextmanager
def browser_page(width: int = 1600, height: int = 1000) -> Iterator[Page]:
    """A page of a fresh headless chromium (Playwright gives it a new profile each time)."""
    from playwright.sync_api import sync_playwright

    executable = shutil.which(CHROMIUM)
    assert executable is not None, browser_missing()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True,
                                             args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(TIMEOUT_MS)
            yield page
        finally:
            browser.close()


class ExperimentUI:
    """One experiment of an MLflow server, as a person uses it in ``page``."""

    def __init__(self, page: Page, server_url: str, experiment_id: str) -> None:
        self.page = page
        self.server_url = server_url
        self.experiment_id = experiment_id

    def open_runs(self, any_run: str) -> None:
        """The runs table, once ``any_run`` (a top-level run's name) shows, with every parent run
        expanded (a sweep's runs are its children) and the assistant's side panel closed."""
        page = self.page
        page.goto(runs_page(self.server_url, self.experiment_id))
        page.get_by_text(any_run).first.wait_for()
        assistant = page.locator(_ASSISTANT_CLOSE)
        if assistant.count():
            assistant.first.click()
        expanders = page.locator(_EXPAND)
        for index in range(expanders.count()):
            expanders.nth(index).click()

    def show_column(self, metric: str) -> None:
        """Add ``metric`` to the table's columns (the "Columns" menu, searched by name)."""
        page = self.page
        # exact: a wide table also has a "Show more columns (N total)" button
        page.get_by_role("button", name="Columns", exact=True).click()
        page.get_by_placeholder("Search columns").fill(metric)
        page.get_by_text(metric, exact=True).first.click()
        page.keyboard.press("Escape")
        self.column_header(metric).wait_for()

    def column_header(self, name: str) -> Locator:
        """The runs table's header cell of column ``name``."""
        return self.page.locator(f'[data-testid="sort-header-{name}"]').locator("visible=true")

    def select(self, run_names: Sequence[str]) -> None:
        """Tick the rows of these runs."""
        rows = self.page.locator(".ag-pinned-left-cols-container .ag-row")
        for name in run_names:
            link = self.page.get_by_role("link", name=name, exact=True)
            rows.filter(has=link).locator("input.ag-checkbox-input").first.check()

    def compare(self, metric: str) -> None:
        """Press Compare, then add ``metric`` to the parallel-coordinates plot (it shows the
        first metrics by name otherwise)."""
        page = self.page
        page.get_by_role("button", name="Compare").click()
        page.wait_for_url(re.compile("compare-runs"))
        page.get_by_text("Parallel Coordinates Plot").first.wait_for()
        metrics = page.get_by_role("combobox").nth(1)
        metrics.click()
        metrics.fill(metric)
        page.keyboard.press("Enter")
        page.keyboard.press("Escape")
        self.plot_label(metric).first.wait_for()

    def plot_label(self, text: str) -> Locator:
        """Labels and ticks of the compare view's plot that read ``text``."""
        return self.page.locator("svg text").filter(has_text=re.compile(rf"^{re.escape(text)}$"))

    def open_artifacts(self, run_id: str) -> None:
        """A run's artifacts tab."""
        self.page.goto(run_page(self.server_url, self.experiment_id, run_id, "artifacts"))
        self.page.get_by_text("Select a file to preview").first.wait_for()

    def shown(self, text: str) -> Locator:
        """The visible elements reading exactly ``text`` (wait on ``.first``)."""
        return self.page.get_by_text(text, exact=True).locator("visible=true")

    def screenshot(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(path))
        return path
