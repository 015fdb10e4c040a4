"""What a reader must never see on a page of the built book, checked over its HTML (no browser needed).

    python book/readable.py [build/book/html]     # one line per failing page and check; exit 1 if any

The same checks run in headless Chromium in ``tests/browser/test_book_browser.py`` (on the text the browser shows,
after MathJax ran, and on the figures as laid out); here they read the HTML files, so they run anywhere:

- ``raw table``: markdown table syntax (``|---|``, or ``|—|`` once smart quotes made a dash of it) in the text: a table printed as a paragraph, not rendered;
- ``raw math``: ``\\(`` or ``\\[`` outside the elements MathJax typesets (``span.math``, ``div.math``), or math on a
  page whose MathJax comes from another host or from a file the book does not hold (offline, the reader sees the
  LaTeX source);
- ``empty table``: a ``<table>`` without a body row;
- ``figure``: a figure of a cell output whose file is missing, not a PNG/JPEG/SVG the browser can decode, or a
  raster narrower than :data:`MIN_FIGURE_PX` (drawn too small to read at page width);
- ``scratch path``: a path of the machine that ran the notebook (``/tmp/``, ``.devw``, ``root/out``, a venv's or the
  system's ``site-packages``), which means nothing to a reader;
- ``widget text``: an interactive widget printed as its Python text (``interactive(children=(IntSlider(...``) or a
  progress bar frozen where the run left it (``  0%|``);
- ``nbval marker``: ``NBVAL_`` (a test-run marker) on a page for readers. The developers' guide (``guide/``), which
  explains the markers by name, is the one place they belong.

Code inputs count for every check but ``raw math`` (a regular expression may well hold ``\\(``).
"""

from __future__ import annotations

import html.parser
import pathlib
import re
import struct
import sys
import urllib.parse

#: a figure must be drawn at least this wide (pixels of the image itself): matplotlib's default 6.4-inch figure at
#: 100 dpi is 640 px; a smaller raster is either shown small or blown up (and blurred) to the column's width
MIN_FIGURE_PX = 600
#: a markdown table's rule row, as typed (``|---|``) or as Sphinx's smart quotes print it in a paragraph (``|—|``)
RAW_TABLE = re.compile(r"\|\s*:?(?:-{3,}|\u2014+)\s*:?\s*\|")
RAW_MATH = re.compile(r"\\\(|\\\[")
SCRATCH = re.compile(r"/tmp/|\.devw\b|\broot/out\b|site-packages|dist-packages|\.venv/lib/python|/usr/lib/python3"
                     r"|/opt/[\w.-]+/\.venv")
MARKER = re.compile(r"NBVAL_[A-Z]")
#: a widget printed as its Python text (``interactive(children=(IntSlider(...``) or a progress bar frozen mid-way
WIDGET = re.compile(r"\b[A-Za-z]+\(children=\(|\b\d{1,3}%\|")
CHECKS = ("raw table", "raw math", "empty table", "figure", "scratch path", "nbval marker", "widget text")
#: pages whose subject is the developers' process (they may name markers and paths on purpose)
DEVELOPER_PAGES = ("guide/",)


class _Text(html.parser.HTMLParser):
    """The text of a page's article, code inputs apart; its tables, figures and scripts."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
    SKIP = {"script", "style", "head", "template", "noscript"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []          # everything shown in the article
        self.prose: list[str] = []         # the same without code inputs and typeset math
        self.tables: list[int] = []        # body rows of each table
        self.output_images: list[str] = []
        self.scripts: list[str] = []
        self._stack: list[tuple[str, set[str]]] = []
        self._article = 0
        self._tbody_rows = None

    def _inside(self, cls: str) -> bool:
        return any(cls in classes for _, classes in self._stack)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script" and a.get("src"):
            self.scripts.append(a["src"])
        classes = set((a.get("class") or "").split())
        if tag == "article":
            self._article += 1
        if tag == "table" and self._article:
            self.tables.append(0)
        if tag == "tr" and self.tables and self._inside_tag("table") and not self._inside_tag("thead"):
            self.tables[-1] += 1
        if tag == "img" and self._article and self._inside("cell_output"):
            self.output_images.append(a.get("src", ""))
        if tag not in self.VOID:
            self._stack.append((tag, classes))

    def _inside_tag(self, tag: str) -> bool:
        return any(t == tag for t, _ in self._stack)

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        while self._stack:
            t, _ = self._stack.pop()
            if t == "article":
                self._article -= 1
            if t == tag:
                break

    def handle_data(self, data):
        if not self._article or any(t in self.SKIP for t, _ in self._stack):
            return
        self.text.append(data)
        if not (self._inside("cell_input") or self._inside("math")):
            self.prose.append(data)


def _image_width(path: pathlib.Path) -> int | None:
    """The pixel width of a PNG or JPEG (None: not one of those, or unreadable)."""
    try:
        head = path.read_bytes()[:64 * 1024]
    except OSError:
        return None
    if head[:8] == b"\x89PNG\r\n\x1a\n" and len(head) >= 24:
        return struct.unpack(">I", head[16:20])[0]
    if head[:2] == b"\xff\xd8":
        i = 2
        while i + 9 < len(head):
            if head[i] != 0xFF:
                return None
            marker, size = head[i + 1], struct.unpack(">H", head[i + 2:i + 4])[0]
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                return struct.unpack(">H", head[i + 7:i + 9])[0]
            i += 2 + size
    return None


def check_page(page: pathlib.Path, html_root: pathlib.Path) -> dict[str, list[str]]:
    """The problems of one page, by check (:data:`CHECKS`): a short excerpt or name for each."""
    parsed = _Text()
    parsed.feed(page.read_text(encoding="utf-8"))
    rel = page.relative_to(html_root).as_posix()
    text, prose = "".join(parsed.text), "".join(parsed.prose)
    found: dict[str, list[str]] = {c: [] for c in CHECKS}

    def excerpts(pattern: re.Pattern, where: str, limit: int = 3) -> list[str]:
        return [" ".join(where[max(0, m.start() - 40):m.end() + 40].split()) for m in pattern.finditer(where)][:limit]

    found["raw table"] = excerpts(RAW_TABLE, text)
    found["widget text"] = excerpts(WIDGET, prose)
    found["raw math"] = excerpts(RAW_MATH, prose)
    has_math = bool(RAW_MATH.search(text))
    if has_math:
        mathjax = [s for s in parsed.scripts if "mathjax" in s.lower() or "tex-" in s.lower()]
        if not mathjax:
            found["raw math"].append("math on the page but no MathJax script")
        for src in mathjax:
            parts = urllib.parse.urlsplit(src)
            if parts.scheme or parts.netloc or src.startswith("//"):
                found["raw math"].append(f"MathJax from another host: {src}")
            elif not (page.parent / urllib.parse.unquote(parts.path)).is_file():
                found["raw math"].append(f"MathJax file missing: {src}")
    found["empty table"] = [f"table {i + 1} has no body row" for i, n in enumerate(parsed.tables) if n == 0]
    for src in parsed.output_images:
        if src.startswith("data:"):
            continue
        path = page.parent / urllib.parse.unquote(urllib.parse.urlsplit(src).path)
        if not path.is_file():
            found["figure"].append(f"{src}: missing")
        elif path.suffix.lower() != ".svg":
            width = _image_width(path)
            if width is None:
                found["figure"].append(f"{src}: not a PNG or JPEG")
            elif width < MIN_FIGURE_PX:
                found["figure"].append(f"{src}: {width} px wide (< {MIN_FIGURE_PX})")
    if not rel.startswith(DEVELOPER_PAGES):
        found["scratch path"] = excerpts(SCRATCH, text)
        found["nbval marker"] = excerpts(MARKER, text)
    return {c: v for c, v in found.items() if v}


def pages(html_root: pathlib.Path) -> list[pathlib.Path]:
    """The book's pages (Sphinx's generated index and search pages left out: they hold no content)."""
    skip = {"genindex.html", "search.html", "py-modindex.html"}
    return sorted(p for p in html_root.rglob("*.html")
                  if "_static" not in p.relative_to(html_root).parts and p.name not in skip
                  and "_sources" not in p.relative_to(html_root).parts)


def check_book(html_root: pathlib.Path) -> dict[str, dict[str, list[str]]]:
    """``{page: {check: problems}}`` for every page with a problem."""
    out = {}
    for page in pages(html_root):
        problems = check_page(page, html_root)
        if problems:
            out[page.relative_to(html_root).as_posix()] = problems
    return out


def summary(found: dict[str, dict[str, list[str]]]) -> dict[str, int]:
    """How many pages fail each check."""
    return {c: sum(1 for p in found.values() if c in p) for c in CHECKS}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    root = pathlib.Path(argv[0] if argv else pathlib.Path(__file__).resolve().parent.parent / "build" / "book" / "html")
    found = check_book(root)
    for page, problems in found.items():
        for check, what in problems.items():
            print(f"{page}: {check}: {'; '.join(what)}")
    print("pages failing each check (of %d): %s" % (len(pages(root)),
          ", ".join(f"{c} {n}" for c, n in summary(found).items())))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
