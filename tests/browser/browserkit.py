"""Helpers of the browser checks: what "rendered" means to a test, in one place."""

from __future__ import annotations

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


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
