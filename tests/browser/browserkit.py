"""Fixtures and helpers of the browser checks: headless Chromium from the system's packages, driven by Selenium.

Nothing is downloaded at run time: Selenium is pointed at the installed ``chromium`` and ``chromedriver``
(Debian: ``apt-get install chromium chromium-driver``; ``scripts/test.sh`` installs them where it runs as root with
apt) and told to stay offline (``SE_OFFLINE``), so Selenium Manager never fetches a browser or a driver. Without a
browser, or before the book is built (``bash scripts/book.sh``, which ``scripts/test.sh`` runs after the notebooks),
the tests here are skipped with the reason.

Screenshots go to ``build/screenshots/`` (``KVLAB_SCREENSHOTS`` to move them).

Not a ``conftest.py``: the unit tests import ``tests/conftest.py`` as ``conftest``, and a second one here would take
its name. The test modules import these fixtures by name.
"""

from __future__ import annotations

import functools
import http.server
import os
import pathlib
import shutil
import threading

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# the built book (KVLAB_BOOK_HTML to check another build, e.g. one made from an older commit)
BOOK = pathlib.Path(os.environ.get("KVLAB_BOOK_HTML", ROOT / "build" / "book" / "html"))
SCREENSHOTS = pathlib.Path(os.environ.get("KVLAB_SCREENSHOTS", ROOT / "build" / "screenshots"))
INSTALL = "install Chromium and its driver from the system's packages: apt-get install chromium chromium-driver"


def find_browser() -> tuple[str, str] | None:
    """(browser, driver) executables installed on this machine, or None."""
    browser = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)),
                   None)
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.fixture(scope="session")
def book() -> pathlib.Path:
    if not (BOOK / "index.html").is_file():
        pytest.skip(f"the book is not built ({BOOK / 'index.html'} is missing): the browser checks run after "
                    "`bash scripts/book.sh` (scripts/test.sh builds it after the notebooks)")
    return BOOK


@pytest.fixture(scope="session")
def browser():
    found = find_browser()
    if found is None:
        pytest.skip(f"no Chromium + chromedriver on this machine: {INSTALL}")
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not download anything
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = found[0]
    # Offline, as a reader without network: every host but this machine fails to resolve, so a page that needs a
    # CDN (MathJax, a font) shows here what it shows offline.
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000",
                "--hide-scrollbars", "--no-first-run", "--disable-extensions",
                "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(found[1]), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture(scope="session")
def book_url(book):
    """The book served over HTTP on 127.0.0.1 (as a reader's browser would load it, not from file://)."""
    handler = functools.partial(_QuietHandler, directory=str(book))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="session")
def screenshots() -> pathlib.Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS


# --- what "rendered" means ----------------------------------------------------------------------------------------

def visible_box(driver, element) -> dict:
    """The element's laid-out box; asserts that the browser shows it (displayed, with a non-zero size)."""
    box = driver.execute_script(
        "const r = arguments[0].getBoundingClientRect(); const s = getComputedStyle(arguments[0]);"
        "return {width: r.width, height: r.height, display: s.display, visibility: s.visibility,"
        "        opacity: s.opacity};", element)
    assert element.is_displayed(), f"<{element.tag_name}> is in the page but not displayed: {box}"
    assert box["width"] > 0 and box["height"] > 0, f"<{element.tag_name}> has no size: {box}"
    assert box["visibility"] == "visible" and float(box["opacity"]) > 0, box
    return box


def image_loaded(driver, img) -> bool:
    """The browser fetched and decoded the image (a broken or missing file has naturalWidth 0)."""
    return driver.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0;", img)
