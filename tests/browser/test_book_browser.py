"""The book, opened in headless Chromium: the index, a notebook page, a paper page and the results page render
(headings, figures decoded by the browser, tables laid out with a size), with screenshots in build/screenshots/."""

from __future__ import annotations

import pathlib

import pytest

pytest.importorskip("selenium", reason="selenium is in kvlab's dev extras (pip install -e '.[dev]')")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from browserkit import BOOK, ROOT, image_loaded, visible_box  # noqa: E402
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


@pytest.mark.parametrize("paper", ["sepllm", "lacache", "dhsa", "reform", "orthorank"])
def test_every_paper_page_opens_with_its_title_and_claims_table(book_url, browser, screenshots, paper):
    """Each paper's page: its title on screen and its claims table drawn with rows; a screenshot of the top of
    the page and one of the table (build/screenshots/, made again by every run; not tracked)."""
    h1 = _open(browser, f"{book_url}/papers/{paper}.html")
    visible_box(browser, h1)
    browser.execute_script("window.scrollTo(0, 0);")
    browser.save_screenshot(str(screenshots / f"book_paper_{paper}_top.png"))
    header = _check_table(browser, browser.find_element(By.CSS_SELECTOR, "article table"), min_rows=1)
    assert "verdict" in header
    browser.save_screenshot(str(screenshots / f"book_paper_{paper}_table.png"))


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
    from kvlab.notebooks.copies import stale

    return stale(ROOT / "notebooks" / f"{stem}.ipynb") == []


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


# --- what a reader must never see, on every page, as the browser shows it ---------------------------------------
# The same checks over the HTML files (no browser): book/readable.py, run by tests/test_book_pages.py.

import sys  # noqa: E402

sys.path.insert(0, str(ROOT / "book"))
import readable  # noqa: E402

# every page of the built book (before it is built: the index alone, and the `book` fixture skips it)
PAGES = [p.relative_to(BOOK).as_posix() for p in readable.pages(BOOK)] if BOOK.is_dir() else ["index.html"]

#: runs in the page once MathJax (if any) has typeset: the article's shown text (code inputs apart for the math
#: check), its tables' body rows, and each cell-output figure's natural and drawn widths
LOOK = """
const done = arguments[arguments.length - 1];
const ready = (window.MathJax && MathJax.startup && MathJax.startup.promise) ? MathJax.startup.promise
                                                                             : Promise.resolve();
ready.then(() => {
  const article = document.querySelector('article.bd-article') || document.body;
  const clone = article.cloneNode(true);
  clone.querySelectorAll('.cell_input, mjx-container, mjx-assistive-mml').forEach(e => e.remove());
  document.body.appendChild(clone); clone.style.position = 'absolute'; clone.style.left = '-99999px';
  const prose = clone.innerText; clone.remove();
  const tables = [...article.querySelectorAll('table')].map(t => ({
      rows: [...t.querySelectorAll('tr')].filter(r => !r.closest('thead') && r.offsetHeight > 0).length,
      width: t.getBoundingClientRect().width, scroll: t.scrollWidth, client: t.clientWidth,
      overflow: getComputedStyle(t).overflowX}));
  const pres = [...article.querySelectorAll('div.cell_output pre')].map(t => ({
      scroll: t.scrollWidth, client: t.clientWidth, overflow: getComputedStyle(t).overflowX}));
  const figures = [...article.querySelectorAll('div.cell_output img')].map(i => ({
      src: i.getAttribute('src'), loaded: i.complete && i.naturalWidth > 0, natural: i.naturalWidth,
      width: i.getBoundingClientRect().width}));
  done({text: article.innerText, prose: prose, tables: tables, pres: pres, figures: figures,
        column: article.getBoundingClientRect().width});
}).catch(e => done({error: String(e)}));
"""


def look(browser, book_url, page):
    browser.get(f"{book_url}/{page}")
    WebDriverWait(browser, 30).until(lambda d: d.execute_script("return document.readyState") == "complete")
    seen = browser.execute_async_script(LOOK)
    assert "error" not in seen, seen
    # images below the fold load lazily: scroll each into view and read it again
    if any(not f["loaded"] for f in seen["figures"]):
        for img in browser.find_elements(By.CSS_SELECTOR, "article div.cell_output img"):
            browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", img)
            try:
                WebDriverWait(browser, 10).until(lambda d: image_loaded(d, img))
            except Exception:  # noqa: BLE001 (reported below as not loaded)
                pass
        seen = browser.execute_async_script(LOOK)
    return seen


def reader_problems(seen: dict, page: str) -> dict[str, list[str]]:
    """The checks of book/readable.py on what the browser shows (:data:`LOOK`)."""
    found = {}

    def hits(pattern, text):
        return [" ".join(text[max(0, m.start() - 40):m.end() + 40].split()) for m in pattern.finditer(text)][:3]

    found["raw table"] = hits(readable.RAW_TABLE, seen["text"])
    found["raw math"] = hits(readable.RAW_MATH, seen["prose"])
    found["widget text"] = hits(readable.WIDGET, seen["prose"])
    found["empty table"] = [f"table {i + 1}: no row shown" for i, t in enumerate(seen["tables"]) if t["rows"] == 0]
    found["clipped table"] = [f"table {i + 1}: {t['scroll']} px of content in {t['client']} px, overflow "
                              f"{t['overflow']}" for i, t in enumerate(seen["tables"])
                              if t["scroll"] > t["client"] + 1 and t["overflow"] not in ("auto", "scroll")]
    found["clipped table"] += [f"printed output {i + 1}: {t['scroll']} px of text in {t['client']} px, overflow "
                               f"{t['overflow']}" for i, t in enumerate(seen["pres"])
                               if t["scroll"] > t["client"] + 1 and t["overflow"] not in ("auto", "scroll")]
    figures = []
    for f in seen["figures"]:
        if not f["loaded"]:
            figures.append(f"{f['src']}: not loaded")
        elif f["natural"] < readable.MIN_FIGURE_PX or f["width"] < readable.MIN_FIGURE_PX - 1:
            figures.append(f"{f['src']}: drawn {f['width']:.0f} px wide (natural {f['natural']} px)")
    found["figure"] = figures
    if not page.startswith(readable.DEVELOPER_PAGES):
        found["scratch path"] = hits(readable.SCRATCH, seen["text"])
        found["nbval marker"] = hits(readable.MARKER, seen["text"])
    return {k: v for k, v in found.items() if v}


@pytest.mark.parametrize("page", PAGES)
def test_what_a_reader_sees(book_url, browser, page):
    """On every page: tables rendered (no ``|---|`` text, every table with rows shown, a wide table or printed
    output scrolls instead of being cut),
    math typeset (no ``\\(`` left), every figure loaded and drawn at least 600 px wide (a figure's own pixels,
    never blown up past them), no widget or progress bar printed as text, no path of the machine that ran it, no
    test marker."""
    problems = reader_problems(look(browser, book_url, page), page)
    assert not problems, f"{page}: {problems}"


def test_what_a_reader_sees_in_the_html(book):
    """The same checks over the HTML files (book/readable.py), for a machine without Chromium: no raw table or
    math, no empty table, every figure a decodable image at least 600 px wide, no machine path, no test marker."""
    found = readable.check_book(book)
    assert not found, "\n".join(f"{page}: {check}: {'; '.join(what)}" for page, problems in found.items()
                                for check, what in problems.items())


CLAIMS_PAGES = ["papers/sepllm.html", "papers/lacache.html", "papers/dhsa.html", "papers/reform.html",
                "papers/orthorank.html", "results.html", "notebooks/10_reform_experiments.html"]


@pytest.mark.parametrize("page", CLAIMS_PAGES)
def test_claims_tables_fit_the_column_at_1280_px(book_url, browser, page):
    """At a 1280 px window every claims table (a header with "verdict") fits its column: the verdict is on screen
    without scrolling sideways (long text wraps in its cell instead)."""
    size = browser.get_window_size()
    browser.set_window_size(1280, 1000)
    try:
        _open(browser, f"{book_url}/{page}")
        wide = browser.execute_script("""
            const out = [];
            for (const t of document.querySelectorAll('article table')) {
              const head = [...t.querySelectorAll('th')].map(th => th.textContent.trim());
              if (!head.includes('verdict')) continue;
              const col = t.closest('article').getBoundingClientRect().width;
              const w = Math.max(t.scrollWidth, t.getBoundingClientRect().width);
              if (w > col + 1 || t.scrollWidth > t.clientWidth + 1) out.push([head.join('|'), Math.round(w), Math.round(col)]);
            }
            return out;""")
        assert not wide, f"{page}: claims tables wider than the column (header, width, column px): {wide}"
    finally:
        browser.set_window_size(size["width"], size["height"])
