"""The book, opened in headless Chromium: the index, a notebook page, a paper page and the results page render
(headings, figures decoded by the browser, tables laid out with a size), with screenshots in build/screenshots/."""

from __future__ import annotations

import pathlib

import pytest

pytest.importorskip("selenium", reason="selenium is in kvlab's dev extras (pip install -e '.[dev]')")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from browserkit import ROOT, image_loaded, visible_box  # noqa: E402
from browserkit import book, book_url, browser, screenshots  # noqa: E402,F401 (fixtures)

NOTEBOOK = "05_lacache_ladder"  # a notebook with figures and the widget explorer
PAPER = "lacache"


def _open(browser, url: str):
    browser.get(url)
    WebDriverWait(browser, 30).until(lambda d: d.execute_script("return document.readyState") == "complete")
    return browser.find_element(By.CSS_SELECTOR, "article.bd-article h1")


def test_index(book_url, browser, screenshots):
    h1 = _open(browser, f"{book_url}/index.html")
    visible_box(browser, h1)
    assert "kvlab" in h1.text
    # The table of contents in the sidebar: every numbered notebook and every paper page, shown.
    nav = browser.find_element(By.CSS_SELECTOR, "nav.bd-docs-nav")
    visible_box(browser, nav)
    hrefs = [a.get_attribute("href") for a in nav.find_elements(By.TAG_NAME, "a") if a.is_displayed()]
    numbered = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    for stem in numbered:
        assert any(h.endswith(f"/notebooks/{stem}.html") for h in hrefs), f"{stem} is not in the shown contents"
    for paper in ("streamingllm", "sepllm", "lacache", "dhsa", "reform", "orthorank"):
        assert any(h.endswith(f"/papers/{paper}.html") for h in hrefs), f"paper page {paper} not in the contents"
    browser.save_screenshot(str(screenshots / "book_index.png"))


def test_notebook_page(book_url, browser, screenshots):
    h1 = _open(browser, f"{book_url}/notebooks/{NOTEBOOK}.html")
    visible_box(browser, h1)
    assert "LaCache" in h1.text
    assert len([h for h in browser.find_elements(By.CSS_SELECTOR, "article h2") if h.is_displayed()]) >= 3
    figures = browser.find_elements(By.CSS_SELECTOR, "div.cell_output img")
    assert figures, "no figure in the cell outputs"
    for img in figures:
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", img)
        WebDriverWait(browser, 20).until(lambda d: image_loaded(d, img), f"figure {img.get_attribute('src')}")
        box = visible_box(browser, img)
        assert box["width"] > 100 and box["height"] > 50, f"figure drawn too small: {box}"
    # Printed results (a checked cell's table) are shown as text outputs.
    outputs = [o for o in browser.find_elements(By.CSS_SELECTOR, "div.cell_output pre") if o.is_displayed()]
    assert any("reach k=1" in o.text for o in outputs), "the coverage table of section 2 is not shown"
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", figures[0])
    browser.save_screenshot(str(screenshots / f"book_notebook_{NOTEBOOK}.png"))


def _check_table(browser, table, min_rows: int) -> list[str]:
    browser.execute_script("arguments[0].scrollIntoView({block: 'start'});", table)
    box = visible_box(browser, table)
    assert box["height"] > 20 * min_rows, f"table drawn too small: {box}"
    rows = table.find_elements(By.CSS_SELECTOR, "tbody tr")
    assert len(rows) >= min_rows
    for row in rows[:min_rows]:
        visible_box(browser, row)
    return [h.text for h in table.find_elements(By.CSS_SELECTOR, "thead th")]


def test_paper_page(book_url, browser, screenshots):
    h1 = _open(browser, f"{book_url}/papers/{PAPER}.html")
    visible_box(browser, h1)
    assert "LaCache" in h1.text
    links = [a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, "article a") if a.is_displayed()]
    assert any(h.endswith(f"/notebooks/{NOTEBOOK}.html") for h in links)
    assert any(h.endswith("/lessons/03_lacache.html") for h in links)
    browser.save_screenshot(str(screenshots / f"book_paper_{PAPER}.png"))
    header = _check_table(browser, browser.find_element(By.CSS_SELECTOR, "article table"), min_rows=3)
    assert "verdict" in header and "paper" in header
    browser.save_screenshot(str(screenshots / f"book_paper_{PAPER}_claims.png"))


def test_results_page(book_url, browser, screenshots):
    from kvlab.experiments import claims

    h1 = _open(browser, f"{book_url}/results.html")
    visible_box(browser, h1)
    tables = browser.find_elements(By.CSS_SELECTOR, "article table")
    papers = list(claims.counts())
    assert len(tables) == 1 + len(papers), "a summary table and one table per paper of the ledger"
    header = _check_table(browser, tables[0], min_rows=len(papers))
    assert header[:2] == ["paper", "agrees"]
    for table in tables[1:]:
        assert "verdict" in _check_table(browser, table, min_rows=1)
    browser.execute_script("window.scrollTo(0, 0);")
    browser.save_screenshot(str(screenshots / "book_results.png"))


@pytest.mark.parametrize("page", ["index.html", f"notebooks/{NOTEBOOK}.html", "results.html"])
def test_no_console_errors(book_url, browser, page):
    """The page's files load and its scripts run without errors (a missing theme file shows up here).

    Not counted: the favicon the browser asks for on its own (the book has none), and messages the theme's
    scripts log themselves ("Got invalid theme mode" on a first visit)."""
    browser.get_log("browser")  # drop what earlier pages logged
    _open(browser, f"{book_url}/{page}")
    logs = browser.get_log("browser")
    errors = [e for e in logs if e["level"] == "SEVERE" and e["source"] in ("network", "javascript")
              and "/favicon.ico" not in e["message"]]
    assert not errors, errors



# The pages the book shows at full size: each opens with the line naming the parameter set that made it (its book
# set where book/executed holds a current copy, else the CI set), and its figures load at a readable size.
BOOK_PAGES = sorted(p.name.split(".")[0] for p in (ROOT / "notebooks" / "params").glob("*.book.yaml"))


def _book_copy_is_current(stem: str) -> bool:
    import importlib.util

    spec = importlib.util.spec_from_file_location("kvlab_notebooks_tool", ROOT / "scripts" / "notebooks.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool.stale(ROOT / "notebooks" / f"{stem}.ipynb") == []


@pytest.mark.parametrize("stem", BOOK_PAGES)
def test_full_size_pages(book_url, browser, screenshots, stem):
    h1 = _open(browser, f"{book_url}/notebooks/{stem}.html")
    visible_box(browser, h1)
    want = "book parameter set" if _book_copy_is_current(stem) else "small test parameters"
    notes = [p for p in browser.find_elements(By.CSS_SELECTOR, "article p") if want in p.text]
    assert notes, f"{stem}: the page does not say it shows the {want}"
    visible_box(browser, notes[0])
    figures = browser.find_elements(By.CSS_SELECTOR, "div.cell_output img")
    assert figures, f"{stem}: no figure in the cell outputs"
    for img in figures:
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", img)
        WebDriverWait(browser, 20).until(lambda d: image_loaded(d, img), f"figure {img.get_attribute('src')}")
        box = visible_box(browser, img)
        assert box["width"] > 100 and box["height"] > 50, f"{stem}: figure drawn too small: {box}"
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", figures[0])
    browser.save_screenshot(str(screenshots / f"book_full_{stem}.png"))
