"""The lab, opened in headless Chromium: `scripts/lab.sh` starts JupyterLab, notebook 05 opens, its explorer cell runs,
the ipywidgets sliders render, and moving one redraws the plot. Screenshot: build/screenshots/lab_widget.png.

JupyterLab is started by ``scripts/lab.sh`` itself (only told the address, a token, no browser) with its own
settings and workspace folders: autosave is off there, so running cells never writes into the committed notebook
(the test also checks the file is unchanged afterwards).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

pytest.importorskip("selenium", reason="selenium is in kvlab's dev extras (pip install -e '.[dev]')")
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from browserkit import ROOT, image_loaded, visible_box  # noqa: E402
from browserkit import book, book_url, browser, screenshots  # noqa: E402,F401 (fixtures)

NOTEBOOK = "notebooks/05_lacache_ladder.ipynb"
# The cells to run, found by their text: parameters, setup (imports, model), the explorer.
CELLS = ["model_name: str =", "kvlab.check_parameters(globals())", "def show_ladder("]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(book, tmp_path):
    """JupyterLab from scripts/lab.sh on 127.0.0.1, a free port and a token; yields its base URL and token."""
    port, token = _free_port(), secrets.token_hex(16)
    settings = tmp_path / "settings"
    for plugin, values in {"@jupyterlab/docmanager-extension/plugin": {"autosave": False},
                           "@jupyterlab/apputils-extension/notification": {"fetchNews": "false",
                                                                           "checkForUpdates": False}}.items():
        path = settings / (plugin + ".jupyterlab-settings")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(settings),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces")}
    env.pop("MPLBACKEND", None)  # as a student's lab: matplotlib's inline backend in the kernel
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(["bash", "scripts/lab.sh", "--no-browser", f"--port={port}", "--ServerApp.port_retries=0",
                             "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    notebook = ROOT / NOTEBOOK
    before = notebook.read_bytes()
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300  # lab.sh first runs setup.sh (idempotent: checks, installs nothing)
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"scripts/lab.sh did not serve JupyterLab on {base}:\n"
                            + (tmp_path / "lab.log").read_text()[-3000:])
            time.sleep(1)
        yield base, token
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the process group this fixture started: lab.sh's server and kernels
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        after = notebook.read_bytes()
        if after != before:
            notebook.write_bytes(before)
            pytest.fail(f"the lab wrote into {NOTEBOOK} (restored it); autosave should be off in this test")


def _cell(browser, marker: str):
    for cell in browser.find_elements(By.CSS_SELECTOR, ".jp-Notebook .jp-CodeCell"):
        text = cell.find_element(By.CSS_SELECTOR, ".jp-InputArea-editor").get_attribute("textContent")
        if marker in text:
            return cell
    raise AssertionError(f"no code cell containing {marker!r} in {NOTEBOOK}")


def _run(browser, cell, timeout: float):
    """Select the cell (command mode), run it with Shift+Enter, wait until its prompt shows an execution count."""
    prompt = cell.find_element(By.CSS_SELECTOR, ".jp-InputArea-prompt")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", cell)
    prompt.click()
    ActionChains(browser).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()
    WebDriverWait(browser, timeout).until(
        lambda d: re.fullmatch(r"\[\d+\]:", prompt.get_attribute("textContent").strip()),
        f"cell did not finish: prompt {prompt.get_attribute('textContent')!r}")
    outputs = [o.text for o in cell.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output")]
    assert not any("Traceback (most recent call last)" in o for o in outputs), outputs


def _plot(browser, cell):
    """The explorer's plot: the image inside the widget's output (the cell also draws a static row of pictures
    after it, which the slider does not change)."""
    imgs = cell.find_elements(By.CSS_SELECTOR, ".widget-output img")
    return imgs[-1] if imgs else None


def test_lab_widget_moves_the_plot(book, browser, lab, screenshots):
    base, token = lab
    try:
        _explore(browser, base, token, screenshots)
    except Exception:
        browser.save_screenshot(str(screenshots / "lab_widget_failed.png"))  # what the browser showed
        raise


def _explore(browser, base, token, screenshots):
    browser.get(f"{base}/lab/tree/{NOTEBOOK}?token={token}")
    WebDriverWait(browser, 120).until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, ".jp-Notebook .jp-CodeCell")) >= 10, "notebook 05 did not open")
    WebDriverWait(browser, 120).until(  # the kernel has started
        lambda d: d.find_elements(By.CSS_SELECTOR, ".jp-Notebook-ExecutionIndicator[data-status='idle']"),
        "the kernel did not start")

    for marker in CELLS:
        _run(browser, _cell(browser, marker), timeout=300)

    explorer = _cell(browser, CELLS[-1])
    sliders = [s for s in explorer.find_elements(By.CSS_SELECTOR, ".widget-slider") if s.is_displayed()]
    assert len(sliders) == 2, f"expected the span and overlap sliders, found {len(sliders)}"
    span = sliders[0]
    handle = span.find_element(By.CSS_SELECTOR, ".noUi-handle")
    readout = span.find_element(By.CSS_SELECTOR, ".widget-readout")
    visible_box(browser, span)
    visible_box(browser, handle)
    assert span.find_element(By.CSS_SELECTOR, ".widget-label").text.strip() == "span"
    WebDriverWait(browser, 60).until(lambda d: _plot(d, explorer) is not None and image_loaded(d, _plot(d, explorer)),
                                     "the explorer drew no plot")
    before_src, before_value = _plot(browser, explorer).get_attribute("src"), readout.text
    visible_box(browser, _plot(browser, explorer))

    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", span)
    # Move the span slider two steps to the right, as a keyboard user would (a drag's step depends on the width,
    # and a span too large for the overlap prints why instead of a plot).
    handle.click()
    ActionChains(browser).send_keys(Keys.ARROW_RIGHT).pause(0.2).send_keys(Keys.ARROW_RIGHT).perform()
    want = str(int(before_value) + 2)
    WebDriverWait(browser, 60).until(lambda d: readout.text == want, "the slider did not move two steps")

    def settled(d):
        """A new plot that stays the same for a second (each step redraws, replacing the <img>)."""
        img = _plot(d, explorer)
        if img is None or img.get_attribute("src") == before_src or not image_loaded(d, img):
            return False
        src = img.get_attribute("src")
        time.sleep(1.0)
        img = _plot(d, explorer)
        return img is not None and img.get_attribute("src") == src and image_loaded(d, img)

    WebDriverWait(browser, 120, ignored_exceptions=(StaleElementReferenceException,)).until(
        settled, "moving the slider did not redraw the plot")
    after = _plot(browser, explorer)
    visible_box(browser, after)
    assert int(readout.text) == int(before_value) + 2, (before_value, readout.text)
    browser.execute_script("arguments[0].scrollIntoView({block: 'start'});", explorer)
    time.sleep(0.5)  # let the scroll settle before the screenshot
    browser.save_screenshot(str(screenshots / "lab_widget.png"))
