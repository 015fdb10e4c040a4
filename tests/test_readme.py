"""The README is a front door (issue 26): at most 200 lines, every section it promises, a link to every guide page,
and no relative link in it or in the pages it sends readers to (docs/guide/, docs/results.md, docs/papers/) that
points at a missing file."""

from __future__ import annotations

import pathlib
import re
import urllib.parse

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "guide"
MAX_LINES = 200
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def relative_links(path: pathlib.Path) -> list[str]:
    """The relative link targets of a Markdown file (code blocks and inline code left out), without their #anchor."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)
    out = []
    for target in LINK.findall(text):
        parts = urllib.parse.urlsplit(target)
        if parts.scheme or parts.netloc or not parts.path:  # https://..., mailto:, or a #anchor in the same page
            continue
        out.append(urllib.parse.unquote(parts.path))
    return out


def broken_links(path: pathlib.Path) -> list[str]:
    return [f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {t}" for t in relative_links(path)
            if not (path.parent / t).exists()]


def pages() -> list[pathlib.Path]:
    return [README, ROOT / "docs" / "results.md", *sorted(GUIDE.glob("*.md")),
            *sorted((ROOT / "docs" / "papers").glob("*.md"))]


def test_readme_is_at_most_200_lines():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, (f"README.md has {n} lines, the front door holds at most {MAX_LINES}: move the detail "
                            "into a page of docs/guide/ and link it from the README's Guide list")


def test_readme_keeps_the_front_door_sections():
    headings = re.findall(r"^## (.+)$", FENCE.sub("", README.read_text(encoding="utf-8")), re.M)
    for wanted in ("Two commands", "Five lines of kvlab", "Tour of the notebooks", "Assignments (`lessons/`)",
                   "Results", "The book", "Guide", "Papers", "How to cite"):
        assert wanted in headings, f"README.md lost its section '## {wanted}' (has: {headings})"


def test_every_guide_page_is_linked_from_the_readme():
    linked = {(README.parent / t).resolve() for t in relative_links(README)}
    guide = sorted(GUIDE.glob("*.md"))
    assert guide, "docs/guide/ holds no page"
    missing = [p.name for p in guide if p.resolve() not in linked]
    assert not missing, f"README.md's Guide list does not link docs/guide/{missing}"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert page.is_file()
    assert broken_links(page) == []


def test_the_link_check_finds_a_broken_link(tmp_path):
    """The check above can fail: a page with a missing target, an anchor to a missing file, and links it must skip."""
    (tmp_path / "there.md").write_text("x")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md) [anchor ok](there.md#a) [web](https://arxiv.org/abs/1) [self](#top)\n"
                    "[gone](docs/gone.md) ![img](figs/none.png) [gone too](missing.md#section)\n"
                    "`[in code](code.md)`\n```\n[in a block](block.md)\n```\n")
    assert relative_links(page) == ["there.md", "there.md", "docs/gone.md", "figs/none.png", "missing.md"]
    assert [b.split(": ")[1] for b in broken_links(page)] == ["docs/gone.md", "figs/none.png", "missing.md"]


def test_the_book_takes_the_guide_pages(tmp_path):
    """book/build.py stages docs/guide/*.md under guide/ (book/index.md's Guide toctree), keeping links between guide
    pages and leaving links to files outside the book (the README) as text, which Sphinx -n would reject."""
    import sys

    sys.path.insert(0, str(ROOT / "book"))
    import build as book

    assert "guide/*" in (ROOT / "book" / "index.md").read_text(encoding="utf-8")
    (tmp_path / "other.md").write_text("# other")
    page = tmp_path / "page.md"
    page.write_text("[front](../../README.md) [other](other.md#x) [web](https://arxiv.org/abs/1) [a](#y) "
                    "[gone](gone.md) ![fig](fig.png)\n")
    assert book.guide_page(page) == ("front [other](other.md#x) [web](https://arxiv.org/abs/1) [a](#y) "
                                     "gone ![fig](fig.png)\n")
    staged = book.guide_page(GUIDE / "design.md")
    assert "../../README.md" not in staged and "the [README](" not in staged and "the README." in staged
