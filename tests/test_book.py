"""The book's own checks (book/build.py): what makes `bash scripts/book.sh` refuse executed notebooks or a built site.

The book itself is built by scripts/test.sh after the notebooks run, and opened in a browser by tests/browser/;
these tests feed each check a small case it must reject, and one it must accept.
"""

from __future__ import annotations

import pathlib
import sys

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "book"))
import build as book  # noqa: E402

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="


def _source(tmp_path: pathlib.Path, draws: bool = True) -> pathlib.Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 01 · A notebook"),
                nbformat.v4.new_code_cell("x: int = 1  # a parameter", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("plt.plot([0, 1])" if draws else "print(x)")]
    path = tmp_path / "notebooks" / "01_a.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def _executed(tmp_path: pathlib.Path, source: pathlib.Path, *, status="passed", error=False, figure=True,
              edit: str | None = None) -> pathlib.Path:
    """The copy the nbval run would save: papermill's injected cell, outputs, each cell's outcome."""
    nb = nbformat.read(source, as_version=4)
    nb.cells.insert(2, nbformat.v4.new_code_cell("x = 2", metadata={"tags": ["injected-parameters"]}))
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        cell.metadata["kvlab"] = {"nbval": "passed"}
        cell.execution_count = i + 1
    last = nb.cells[-1]
    last.metadata["kvlab"]["nbval"] = status
    if figure:
        last.outputs.append(nbformat.v4.new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure>"}))
    if error:
        last.outputs.append(nbformat.v4.new_output("error", ename="ValueError", evalue="bad", traceback=[]))
    if edit is not None:
        last.source = edit
    nb.metadata["kvlab"] = {"executed_by": "nbval"}
    out = tmp_path / "executed" / source.name
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out)
    return out


def test_a_good_executed_copy_passes(tmp_path):
    source = _source(tmp_path)
    _executed(tmp_path, source)
    assert book.check_executed(tmp_path / "executed", [source]) == []


@pytest.mark.parametrize("case, expected", [
    ({"status": "failed"}, "did not run through (nbval: failed)"),
    ({"error": True}, "did not run through (ValueError: bad)"),
    ({"status": "not run"}, "did not run through (nbval: not run)"),
    ({"figure": False}, "draws figures but its executed copy holds none"),
    ({"edit": "plt.plot([1, 0])"}, "a stale copy"),
])
def test_executed_copies_that_cannot_make_the_book(tmp_path, case, expected):
    source = _source(tmp_path)
    _executed(tmp_path, source, **case)
    problems = book.check_executed(tmp_path / "executed", [source])
    assert len(problems) == 1 and expected in problems[0], problems


def test_an_error_shown_on_purpose_is_accepted(tmp_path):
    """A cell tagged raises-exception (nbval lets it raise) keeps its error output in the book."""
    source = _source(tmp_path)
    nb = nbformat.read(source, as_version=4)
    nb.cells[-1].metadata["tags"] = ["raises-exception"]
    nbformat.write(nb, source)
    _executed(tmp_path, source, error=True)
    assert book.check_executed(tmp_path / "executed", [source]) == []


def test_missing_or_foreign_copies(tmp_path):
    source = _source(tmp_path, draws=False)
    assert "no executed copy" in book.check_executed(tmp_path / "executed", [source])[0]
    (tmp_path / "executed").mkdir()
    nbformat.write(nbformat.read(source, as_version=4), tmp_path / "executed" / source.name)  # not from nbval
    assert "not saved by the nbval run" in book.check_executed(tmp_path / "executed", [source])[0]


def _site(tmp_path: pathlib.Path, index: str, notebook_page: str) -> pathlib.Path:
    html = tmp_path / "html"
    (html / "notebooks").mkdir(parents=True)
    (html / "_images").mkdir()
    (html / "_images" / "fig.png").write_bytes(b"\x89PNG")
    (html / "index.html").write_text(index)
    (html / "notebooks" / "01_a.html").write_text(notebook_page)
    return html


NOTEBOOK_PAGE = ('<html><body><h1 id="top">A</h1><div class="cell_output docutils container">'
                 '<div><img src="../_images/fig.png"></div></div><a href="../index.html#intro">back</a></body></html>')


def test_a_good_site_passes(tmp_path):
    source = _source(tmp_path)
    executed = _executed(tmp_path, source).parent
    html = _site(tmp_path, '<html><body><h1 id="intro">kvlab</h1><a href="notebooks/01_a.html#top">01</a>'
                           '<a href="https://arxiv.org/abs/1">paper</a><link href="_images/fig.png?v=1"></body></html>',
                 NOTEBOOK_PAGE)
    assert book.check_site(html, executed, [source]) == []


@pytest.mark.parametrize("index, notebook_page, expected", [
    ('<a href="notebooks/02_missing.html">x</a>', NOTEBOOK_PAGE, "broken link notebooks/02_missing.html"),
    ('<img src="_images/gone.png">', NOTEBOOK_PAGE, "broken link _images/gone.png"),
    ('<a href="notebooks/01_a.html#nowhere">x</a>', NOTEBOOK_PAGE, "names an anchor"),
    ('<p>index</p>', NOTEBOOK_PAGE.replace('<img src="../_images/fig.png">', ""), "0 figures rendered"),
])
def test_sites_with_broken_pieces(tmp_path, index, notebook_page, expected):
    source = _source(tmp_path)
    executed = _executed(tmp_path, source).parent
    html = _site(tmp_path, f'<html><body><h1 id="intro">kvlab</h1>{index}</body></html>', notebook_page)
    problems = book.check_site(html, executed, [source])
    assert len(problems) == 1 and expected in problems[0], problems


def test_an_image_outside_the_outputs_is_not_a_figure(tmp_path):
    """Only images inside a cell's output block count as the notebook's figures (a logo elsewhere does not)."""
    source = _source(tmp_path)
    executed = _executed(tmp_path, source).parent
    page = ('<html><body><img src="../_images/fig.png"><div class="cell_output docutils container"><div><pre>text'
            '</pre></div></div></body></html>')
    html = _site(tmp_path, "<html><body></body></html>", page)
    assert "0 figures rendered, the executed notebook has 1" in book.check_site(html, executed, [source])[0]


def test_results_page_is_generated_from_the_ledger():
    from kvlab import claims

    page = book.results_page()
    rows = claims.load()
    for paper in claims.counts(rows):
        assert f"\n## {paper}\n" in page
        assert str(claims.table(paper)) in page
    some = rows[0]
    assert some["command"] in page  # the command behind a row is on the page


def test_results_page_names_the_default_model_as_the_ledger_does():
    """The header said "SmolLM2-135M"; the ledger's model (and kvlab's default) is SmolLM2-135M-Instruct."""
    header = book.results_page().split("\n| paper |")[0]
    assert "mostly on SmolLM2-135M-Instruct." in header, header
