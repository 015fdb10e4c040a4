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
    from kvlab.experiments import claims

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


# --- the book's executed copies (book/executed, made by benchmarks/gpu/book_notebooks.sh) -------------------------
from kvlab.notebooks import copies as nbtool  # noqa: E402

BOOK_SET = "# the book's size\nx: 5\n"


def _book_copy(tmp_path: pathlib.Path, source: pathlib.Path, which: str = "book") -> pathlib.Path:
    """What `python -m kvlab notebooks book` leaves: the executed notebook with its stamp (nothing run here)."""
    nb = nbformat.read(source, as_version=4)
    nb.cells.insert(2, nbformat.v4.new_code_cell("x = 5", metadata={"tags": ["injected-parameters"]}))
    nb.metadata["kvlab"] = {"book": {**nbtool.book_stamp(source), "set": which}}
    out = tmp_path / "copies" / source.name
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out)
    return out


@pytest.fixture
def book_source(tmp_path):
    source = _source(tmp_path)
    (source.parent / "params").mkdir()
    nbtool.book_set_path(source).write_text(BOOK_SET)
    return source


def test_a_current_book_copy_passes(tmp_path, book_source):
    _book_copy(tmp_path, book_source)
    assert nbtool.stale(book_source, tmp_path / "copies") == []


def _edit(path: pathlib.Path, index: int, text: str) -> None:
    nb = nbformat.read(path, as_version=4)
    nb.cells[index].source = text
    nbformat.write(nb, path)


@pytest.mark.parametrize("change, stale", [
    (lambda src: _edit(src, 2, "plt.plot([0, 2])"), "other code cells"),         # a code cell changed
    (lambda src: nbtool.book_set_path(src).write_text("x: 6\n"), "other parameters"),  # the book set changed
    (lambda src: _edit(src, 1, "x: int = 3  # a parameter"), None),               # only a default: not stale
    (lambda src: _edit(src, 0, "# 01 · Better prose"), None),                      # only prose: not stale
    (lambda src: nbtool.book_set_path(src).write_text("# reworded\nx: 5\n"), None),  # a comment of the set
])
def test_a_book_copy_goes_stale_when_its_code_or_its_set_changes(tmp_path, book_source, change, stale):
    _book_copy(tmp_path, book_source)
    change(book_source)
    problems = nbtool.stale(book_source, tmp_path / "copies")
    if stale is None:
        assert problems == []
    else:
        assert len(problems) == 1 and stale in problems[0]


def test_a_copy_of_the_ci_set_or_without_stamp_is_not_a_book_copy(tmp_path, book_source):
    copy = _book_copy(tmp_path, book_source, which="ci")
    assert "not the book set" in nbtool.stale(book_source, tmp_path / "copies")[0]
    nb = nbformat.read(copy, as_version=4)
    del nb.metadata["kvlab"]
    nbformat.write(nb, copy)
    assert "no metadata.kvlab.book" in nbtool.stale(book_source, tmp_path / "copies")[0]
    copy.unlink()
    assert "no executed copy" in nbtool.stale(book_source, tmp_path / "copies")[0]


BOOK_SETS = sorted((ROOT / "notebooks" / "params").glob("*.book.yaml"))


@pytest.mark.parametrize("book_set", BOOK_SETS, ids=[p.name.split(".")[0] for p in BOOK_SETS])
def test_each_book_set_fixes_every_parameter_its_notebook_declares(book_set):
    """A book set names every parameter (so the copy does not change when a default does) and nothing else;
    where and how it runs (device, threads) is left to the run."""
    import papermill
    import yaml

    source = ROOT / "notebooks" / (book_set.name.split(".")[0] + ".ipynb")
    declared = set(papermill.inspect_notebook(str(source)))
    given = set(yaml.safe_load(book_set.read_text()))
    assert given <= declared, f"{book_set.name} names {sorted(given - declared)}, which the notebook does not declare"
    missing = declared - given - nbtool.NEUTRAL
    assert not missing, f"{book_set.name} leaves {sorted(missing)} at the notebook's defaults: fix them in the set"


COPIES = sorted(nbtool.BOOK_COPIES.glob("*.ipynb"))


@pytest.mark.parametrize("copy", COPIES, ids=[p.stem[:2] for p in COPIES])
def test_every_committed_book_copy_is_current(copy):
    """Each copy in book/executed was executed from its notebook's current code cells and book set; a stale one
    is made again with benchmarks/gpu/book_notebooks.sh (a GPU host)."""
    assert nbtool.stale(ROOT / "notebooks" / copy.name) == []


def test_every_notebook_with_a_book_set_has_its_copy_or_waits_in_the_open():
    """The book shows full-size results for every notebook that declares a book set (01, 03, 05, 06, 07, 10, 12,
    15). A set without a committed copy is named in book/executed/WAITING.md with why, and its page says that it
    shows the test run and why: never a page left at the CI run in silence."""
    import importlib.util

    sets = sorted(p.name.split(".")[0] for p in (ROOT / "notebooks" / "params").glob("*.book.yaml"))
    assert sets, "no book parameter sets found"
    missing = [s for s in sets if not (nbtool.BOOK_COPIES / f"{s}.ipynb").is_file()]
    waiting_file = nbtool.BOOK_COPIES / "WAITING.md"
    waiting = {line.split("|")[1].strip() for line in waiting_file.read_text().splitlines()
               if line.startswith("| ") and not line.startswith("| notebook")} if waiting_file.is_file() else set()
    unexplained = [s for s in missing if s not in waiting]
    assert not unexplained, f"book sets without an executed copy and not in book/executed/WAITING.md: {unexplained} " \
                            "(make them with benchmarks/gpu/book_notebooks.sh)"
    assert not waiting - set(missing), f"WAITING.md names copies that are here: {sorted(waiting - set(missing))}"
    spec = importlib.util.spec_from_file_location("book_build", ROOT / "book" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    for stem in missing:
        note = build.page_note(ROOT / "notebooks" / f"{stem}.ipynb", "ci")
        assert "waits to be executed again" in note and "WAITING.md" in note, note


def test_book_copies_stay_small():
    total = sum(p.stat().st_size for p in COPIES)
    assert total < 10e6, f"book/executed holds {total / 1e6:.1f} MB: keep figures as PNG and outputs short"


def _with_figures(path: pathlib.Path, n: int) -> None:
    nb = nbformat.read(path, as_version=4)
    nb.cells[-1].outputs = [nbformat.v4.new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure>"})
                            for _ in range(n)]
    nbformat.write(nb, path)


def test_the_book_shows_a_current_book_copy_and_says_which_set_made_each_page(tmp_path, book_source):
    executed = _executed(tmp_path, book_source).parent
    copy = _book_copy(tmp_path, book_source)
    _with_figures(copy, 3)
    pages = book.choose_pages(executed, [book_source], copy.parent)
    assert pages[book_source.name] == (copy, "book")
    src = tmp_path / "src"
    book.stage(src, executed, [book_source], [], pages)
    staged = nbformat.read(src / "notebooks" / book_source.name, as_version=4)
    assert "book parameter set, `params/01_a.book.yaml`" in staged.cells[1].source
    assert sum(1 for o in staged.cells[-1].outputs if "image/png" in o.get("data", {})) == 3
    # a site that shows only the CI copy's one figure on that page falls short of the book copy's three
    html = _site(tmp_path, '<h1 id="intro">kvlab</h1>', NOTEBOOK_PAGE)
    assert book.check_site(html, executed, [book_source], pages) == [
        "notebooks/01_a.html: 1 figures rendered, the executed notebook has 3"]
    assert book.check_site(html, executed, [book_source]) == []  # the CI copy's one figure


def test_a_stale_book_copy_leaves_the_ci_page_and_the_page_says_so(tmp_path, book_source, capsys):
    executed = _executed(tmp_path, book_source).parent
    copy = _book_copy(tmp_path, book_source)
    nbtool.book_set_path(book_source).write_text("x: 7\n")
    pages = book.choose_pages(executed, [book_source], copy.parent)
    assert pages[book_source.name] == (executed / book_source.name, "ci")
    assert "other parameters" in capsys.readouterr().err
    book.stage(tmp_path / "src", executed, [book_source], [], pages)
    staged = nbformat.read(tmp_path / "src" / "notebooks" / book_source.name, as_version=4)
    assert "small test parameters, `params/01_a.ci.yaml`" in staged.cells[1].source
    assert "full-size copy (`params/01_a.book.yaml`)" in staged.cells[1].source
    assert "waits to be executed again on a GPU" in staged.cells[1].source


def test_the_book_leaves_out_library_noise_but_keeps_warnings(tmp_path):
    """Loading bars and transformers' tokenizer notice say nothing about the notebook; a warning does (without
    the machine's path of the file that raised it)."""
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("x = 1")
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stderr", text=(
            "[transformers] Ignoring clean_up_tokenization_spaces=True for BPE tokenizer TokenizersBackend.\n"
            "Loading weights:   0%|   | 0/272\rLoading weights: 100%|###| 272/272\n")),
        nbformat.v4.new_output("stream", name="stderr", text=(
            "Loading weights: 100%|###| 272/272\n/tmp/x.py:3: UserWarning: SepLLM without separators\n")),
        nbformat.v4.new_output("stream", name="stdout", text="Loading weights is printed by the notebook\n"),
    ]
    nb.cells = [cell]
    path = tmp_path / "n.ipynb"
    nbformat.write(nb, path)
    outs = nbformat.reads(book._with_note(path, "note"), as_version=4).cells[1].outputs
    assert [o["name"] for o in outs] == ["stderr", "stdout"]
    assert outs[0]["text"] == "UserWarning: SepLLM without separators\n"
    assert outs[1]["text"] == "Loading weights is printed by the notebook\n"


def _reader_page(tmp_path, cells) -> list:
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    path = tmp_path / "n.ipynb"
    nbformat.write(nb, path)
    return nbformat.reads(book._with_note(path, "note"), as_version=4).cells[1:]


def test_the_book_takes_the_test_run_off_the_page(tmp_path):
    """nbval's markers, progress bars, a library's warning about its own set-up and the machine's paths in a
    warning leave the page; a widget leaves a note; a superseded ledger row goes; everything else stays."""
    widget = "application/vnd.jupyter.widget-view+json"
    table = ("| item | claim | verdict |\n|---|---|---|\n| Table 1 | a | superseded |\n| Table 1 | b | agrees |\n"
             "| Table 2 | c | superseded (run before a fix) |\n\nVerdicts: **agrees**: ...")
    cells = [
        nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\n# NBVAL_SKIP\nx = 1\n# NBVAL_CHECK_OUTPUT stays inside"),
        nbformat.v4.new_code_cell("  # NBVAL_CHECK_OUTPUT\nprint(x)"),
        nbformat.v4.new_code_cell("run()"),
        nbformat.v4.new_code_cell("claims.table('x')"),
    ]
    cells[2].outputs = [
        nbformat.v4.new_output("display_data", data={widget: {"model_id": "a"},
                                                     "text/plain": "  0%|          | 0/20 [00:00<?, ?it/s]"}),
        nbformat.v4.new_output("display_data", data={widget: {"model_id": "b"},
                                                     "text/plain": "interactive(children=(IntSlider(value=4),))"}),
        nbformat.v4.new_output("stream", name="stderr", text=(
            "/opt/torch/.venv/lib/python3.12/site-packages/tqdm/auto.py:21: TqdmWarning: IProgress not found.\n"
            "  from .autonotebook import tqdm as notebook_tqdm\n"
            "\rscoring:  40%|####      | 8/20 [00:01<00:02]\n"
            "/tmp/ipykernel_4983/682856442.py:22: UserWarning: SepLLM(sep=0) keeps no separator\n"
            "  SepLLMStreaming(a, s, w, c, sep=0)\n"
            "a line of the notebook's own\n")),
        nbformat.v4.new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure>"}),
    ]
    cells[2].outputs.append(nbformat.v4.new_output("display_data", data={  # a widget whose view was dropped
        "text/plain": "interactive(children=(IntSlider(value=0, description='layer', max=29),))"}))
    cells[2].outputs.append(nbformat.v4.new_output("display_data", data={  # a tqdm bar whose view was dropped
        "text/plain": "Loading weights:   0%|          | 0/272 [00:00<?, ?it/s]"}))
    cells[3].outputs = [nbformat.v4.new_output("execute_result", data={"text/markdown": table, "text/plain": "x"})]
    out = _reader_page(tmp_path, cells)
    assert out[0].source == "x = 1\n# NBVAL_CHECK_OUTPUT stays inside"
    assert out[1].source == "print(x)"
    kinds = [(o.output_type, sorted(o.get("data", {}))) for o in out[2].outputs]
    assert kinds == [("display_data", ["text/markdown"]), ("stream", []), ("display_data", ["image/png", "text/plain"]),
                     ("display_data", ["text/markdown"])]
    assert "open the notebook in the lab" in out[2].outputs[0].data["text/markdown"]
    assert out[2].outputs[1].text == "UserWarning: SepLLM(sep=0) keeps no separator\na line of the notebook's own\n"
    md = out[3].outputs[0].data["text/markdown"]
    assert "superseded" not in md and "| Table 1 | b | agrees |" in md and md.endswith("**agrees**: ...")


def test_the_page_checks_fail_on_what_a_reader_must_not_see(tmp_path):
    """book/readable.py: each check finds its problem on a page that has it, and nothing on a clean page."""
    import readable

    def page(body: str, head: str = "") -> pathlib.Path:
        path = tmp_path / "html" / "notebooks" / "p.html"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"<html><head>{head}</head><body><article class='bd-article'>{body}</article></body></html>")
        return path

    def found(body: str, head: str = "") -> set[str]:
        return set(readable.check_page(page(body, head), tmp_path / "html"))

    images = tmp_path / "html" / "_images"
    images.mkdir(parents=True)
    import struct
    import zlib

    def png(width: int) -> str:
        raw = b"".join(b"\0" + b"\0" * width for _ in range(2))
        chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))  # noqa: E731
        data = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, 2, 8, 0, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
        (images / f"w{width}.png").write_bytes(data)
        return f"../_images/w{width}.png"

    local_mathjax = "<script src='../_static/mathjax/tex-chtml.js'></script>"
    (tmp_path / "html" / "_static" / "mathjax").mkdir(parents=True)
    (tmp_path / "html" / "_static" / "mathjax" / "tex-chtml.js").write_text("//")
    clean = (f"<p>a table:</p><table><thead><tr><th>a</th></tr></thead><tbody><tr><td>1</td></tr></tbody></table>"
             f"<span class='math'>\\(x^2\\)</span><div class='cell_input'><pre>re.compile(r'\\(')</pre></div>"
             f"<div class='cell_output'><img src='{png(640)}'></div><p>build/leaderboard</p>")
    assert found(clean, local_mathjax) == set()
    assert found("<p>| a | b |\n|—|—|\n| 1 | 2 |</p>") == {"raw table"}
    assert found("<pre>| a |\n|---|</pre>") == {"raw table"}
    assert found("<p>idf: \\(\\mathrm{idf}\\)</p>", local_mathjax) == {"raw math"}
    assert found("<span class='math'>\\(x\\)</span>",
                 "<script src='https://cdn.example.org/mathjax/tex-chtml.js'></script>") == {"raw math"}
    assert found("<span class='math'>\\(x\\)</span>",
                 "<script src='../_static/mathjax/tex-svg.js'></script>") == {"raw math"}
    assert found("<table><thead><tr><th>a</th></tr></thead><tbody></tbody></table>") == {"empty table"}
    assert found(f"<div class='cell_output'><img src='{png(545)}'></div>") == {"figure"}
    assert found("<div class='cell_output'><img src='../_images/none.png'></div>") == {"figure"}
    for scratch in ("/tmp/ipykernel_1/2.py:3", "--tasks .devw/c/x.json", "--out /root/out/t.json",
                    "/opt/torch/.venv/lib/python3.12/site-packages/tqdm/auto.py", "/usr/lib/python3/dist-packages/x"):
        assert found(f"<pre>{scratch}</pre>") == {"scratch path"}, scratch
    assert found("<div class='cell_input'><pre># NBVAL_CHECK_OUTPUT\nprint(1)</pre></div>") == {"nbval marker"}
    assert found("<div class='cell_output'><pre>interactive(children=(IntSlider(value=0, description='layer'"
                 "</pre></div>") == {"widget text"}
    assert found("<pre>scoring:   0%|          | 0/20 [00:00&lt;?, ?it/s]</pre>") == {"widget text"}
    guide = tmp_path / "html" / "guide" / "checks.html"
    guide.parent.mkdir(parents=True)
    guide.write_text("<html><body><article><p>mark a cell # NBVAL_CHECK_OUTPUT; /tmp/</p></article></body></html>")
    assert readable.check_page(guide, tmp_path / "html") == {}


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")), ids=lambda p: p.stem[:2])
def test_markers_move_into_tags_and_the_stamps_stay(path):
    """``python -m kvlab notebooks markers`` takes every ``# NBVAL_*`` first line off a notebook's code cells (a student
    in the lab sees none) into tags nbval reads the same way; the checked cells stay the same cells and the code
    stamp of the book copies does not change."""
    nb = nbformat.read(path, as_version=4)
    before = (nbtool.code_hash(nb), [c.id for c in nbtool._checked(nb)])
    has = sum(c.source.lstrip().startswith("# NBVAL_") for c in nb.cells if c.cell_type == "code")
    assert nbtool.markers_to_tags(nb) >= has
    assert not [c.id for c in nb.cells if c.cell_type == "code" and c.source.lstrip().startswith("# NBVAL_")]
    assert (nbtool.code_hash(nb), [c.id for c in nbtool._checked(nb)]) == before
    assert nbtool.markers_to_tags(nb) == 0  # a second run finds nothing left


def test_a_markdown_table_printed_as_text_is_shown_rendered(tmp_path):
    """A cell that prints a results file's markdown table: the book shows the table as a table (a markdown
    display), the lines around it as printed; printed text without a table stays one output."""
    cell = nbformat.v4.new_code_cell("print(rec['table'])")
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text=(
            "NVIDIA H200 2026-11-21\n| N | method |\n|---|:--:|\n| 4096 | sdpa |\n| 8192 | flex |\n\nafter\n")),
        nbformat.v4.new_output("stream", name="stdout", text="a | b, no table\n|x|\n"),
    ]
    out = _reader_page(tmp_path, [cell])[0].outputs
    assert [(o.output_type, o.get("name")) for o in out] == [("stream", "stdout"), ("display_data", None),
                                                              ("stream", "stdout"), ("stream", "stdout")]
    assert out[0].text == "NVIDIA H200 2026-11-21\n"
    assert out[1].data["text/markdown"] == "| N | method |\n|---|:--:|\n| 4096 | sdpa |\n| 8192 | flex |\n"
    assert out[2].text == "\nafter\n" and out[3].text == "a | b, no table\n|x|\n"
