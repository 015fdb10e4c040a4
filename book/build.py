"""Build the kvlab book: the numbered notebooks as nbval executed them, the assignments' student versions, a page
per paper and a results page from the claims ledger, as one HTML site (``bash scripts/book.sh``).

    python book/build.py [--executed build/executed] [--lessons build/lessons] [--out build/book] [-j N]
    # -> build/book/html/index.html

Steps, each failing with a list of what is wrong:

1. **Executed notebooks.** ``scripts/test.sh`` runs the notebooks once, through nbval, and the plugin of
   :mod:`kvlab.notebooks.tolerant_checks` saves each as executed (``KVLAB_EXECUTED_DIR=build/executed``). Every ``notebooks/NN_name.ipynb`` needs its copy
   there: saved by nbval, every code cell passed (or skipped on purpose), no error output, the same cells as the
   notebook in git (else the copy is stale), and at least one figure where the notebook draws one.
2. **Student versions** of the assignments: ``python -m kvlab lessons make --out build/lessons`` when missing or
   older than the master.
   The pages of notebooks 01, 03, 05, 06, 07, 10, 12 and 15 show instead their **book copies**, ``book/executed/``:
   executed at the book parameter set (``notebooks/params/NN_name.book.yaml``, large enough for the phenomenon)
   by ``benchmarks/gpu/book_notebooks.sh`` and stamped with a hash of the notebook's code cells and of the set. A
   missing or stale copy (``python -m kvlab notebooks stale``) leaves the CI-executed page, and the page says so.
3. **Sources** staged in ``OUT/src``: ``book/`` (index, paper pages, with the claims tables and any paper notes of
   ``docs/papers/`` filled in), the notebooks, the lessons, the guide pages of ``docs/guide/`` (links to files
   outside the book left as text), and ``results.md`` generated from the ledger (:mod:`kvlab.experiments.claims`).
4. **Sphinx** (``-W --keep-going -n``): a broken cross-reference, a missing image or a document outside the table
   of contents is an error. Nothing is executed (``nb_execution_mode = "off"`` in ``book/conf.py``).
5. **The site checked as a browser would load it**: every local link and image of every page resolves to a file
   (and a link's ``#anchor`` to an id in it), and every notebook page shows as many images as its executed copy
   holds figures.
6. **What a reader must not see** (``book/readable.py``): markdown table or LaTeX source left as text, an empty
   table, a figure under 600 px, a machine's path, a test marker. Printed per page, not fatal here: the browser
   checks (``tests/browser/test_book_browser.py``) fail on them.

On the way to the page, each notebook loses what the test run left on it (:func:`_for_reader`): nbval's markers,
progress bars, library noise and machine paths in stderr, interactive widgets (a note points to the lab) and
superseded rows of the claims ledger's tables.
"""

from __future__ import annotations

import argparse
import html.parser
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import warnings

ROOT = pathlib.Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
NOTEBOOKS = ROOT / "notebooks"
LESSONS = ROOT / "lessons"
# A cell that draws: matplotlib calls or kvlab.viz helpers (all of which plot with matplotlib).
DRAWS = re.compile(r"\bplt\.|\bviz\.[a-z_]+\(|\.plot\(|\.imshow\(")
RUN_NOTEBOOKS = ("run the notebooks through nbval, saving what they print: `bash scripts/test.sh` does, or "
                 "`python -m kvlab notebooks prepare --out build/notebooks && env -u MPLBACKEND "
                 "KVLAB_EXECUTED_DIR=build/executed python -m pytest build/notebooks --nbval-lax --nbval-current-env`")
BOOK_COPIES = BOOK / "executed"


def _nbtool():
    """:mod:`kvlab.notebooks.copies` (the book copies' stamps and staleness check)."""
    from kvlab.notebooks import copies

    return copies


def choose_pages(executed: pathlib.Path, notebooks: list[pathlib.Path],
                 copies: pathlib.Path = BOOK_COPIES) -> dict[str, tuple[pathlib.Path, str]]:
    """For each notebook, the executed notebook its page shows and which it is: ``"book"`` (its current book
    copy in ``copies``) or ``"ci"`` (the nbval run's copy in ``executed``). A stale book copy is named on stderr."""
    tool = _nbtool()
    pages = {}
    for nb in notebooks:
        kind = "ci"
        if (copies / nb.name).is_file():
            problems = tool.stale(nb, copies)
            if problems:
                print("book: not using a book copy: " + "; ".join(problems), file=sys.stderr)
            else:
                kind = "book"
        pages[nb.name] = (copies / nb.name if kind == "book" else executed / nb.name, kind)
    return pages


def page_note(nb_path: pathlib.Path, kind: str) -> str:
    """The line a notebook's page opens with (under its title): which parameters made what the page shows."""
    stem = nb_path.stem
    if kind == "book":
        return (f"*This page shows the notebook executed with its book parameter set, `params/{stem}.book.yaml`: "
                "the figures and tables at the size the text describes.*")
    has_book = (nb_path.parent / "params" / f"{stem}.book.yaml").is_file()
    if has_book:  # a book set without a current copy: say which copy this is and why
        return (f"*This page shows the notebook executed with its small test parameters, `params/{stem}.ci.yaml`: "
                f"its full-size copy (`params/{stem}.book.yaml`) was made before the notebook's current code and "
                "waits to be executed again on a GPU (`benchmarks/gpu/book_notebooks.sh`; `book/executed/WAITING.md` "
                "says what changed), so its figures and numbers here are the small run's.*")
    return (f"*This page shows the notebook executed with its small test parameters, `params/{stem}.ci.yaml`, "
            f"so its figures are small: run it with its defaults to see the full-size picture.*")


PLACEHOLDER = re.compile(r"\{\{ *(claims: *(?P<paper>[A-Za-z]+)|notes) *\}\}")


class BookError(Exception):
    """What stops the build: a list of problems, printed one per line."""

    def __init__(self, title: str, problems: list[str]):
        super().__init__(title + "\n" + "\n".join(f"  - {p}" for p in problems))


# --- 1. executed notebooks --------------------------------------------------------------------------------------

def _read(path: pathlib.Path):
    import nbformat

    with warnings.catch_warnings():  # notebooks saved by older tools lack cell ids; nbformat adds them on read
        warnings.simplefilter("ignore")
        return nbformat.read(path, as_version=4)


def _cells(nb) -> list[tuple[str, str]]:
    """(type, source) of the cells a reader wrote: papermill's injected parameter cell left out."""
    return [(c.cell_type, c.source) for c in nb.cells if "injected-parameters" not in c.metadata.get("tags", [])]


def _raises_on_purpose(cell) -> bool:
    """A cell nbval lets raise (``raises-exception`` tag or ``# NBVAL_RAISES_EXCEPTION``): its error is the lesson."""
    return ("raises-exception" in cell.metadata.get("tags", [])
            or cell.source.lstrip().startswith("# NBVAL_RAISES_EXCEPTION"))


def _images(nb) -> int:
    return sum(1 for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
               if o.get("output_type") in ("display_data", "execute_result") and
               any(k.startswith("image/") for k in o.get("data", {})))


def check_executed(executed: pathlib.Path, notebooks: list[pathlib.Path]) -> list[str]:
    """Problems with the executed copies of ``notebooks`` in ``executed`` (empty: all good)."""
    import nbformat

    problems = []
    for source_path in notebooks:
        path = executed / source_path.name
        if not path.is_file():
            problems.append(f"{source_path.name}: no executed copy at {path}")
            continue
        nb = _read(path)
        if nb.metadata.get("kvlab", {}).get("executed_by") != "nbval":
            problems.append(f"{path}: not saved by the nbval run (no metadata.kvlab.executed_by)")
            continue
        source = _read(source_path)
        if _cells(nb) != _cells(source):
            problems.append(f"{path}: its cells differ from {source_path} (a stale copy)")
        for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
            status = cell.metadata.get("kvlab", {}).get("nbval", "not run")
            errors = [o for o in cell.outputs if o.output_type == "error" and not _raises_on_purpose(cell)]
            if status not in ("passed", "skipped") or errors:
                what = f"{errors[0].ename}: {errors[0].evalue}" if errors else f"nbval: {status}"
                problems.append(f"{path.name}: code cell {i} did not run through ({what})")
        if any(c.cell_type == "code" and DRAWS.search(c.source) for c in source.cells) and _images(nb) == 0:
            problems.append(f"{path.name}: the notebook draws figures but its executed copy holds none (were the "
                            "notebooks run with MPLBACKEND=Agg? the kernel needs matplotlib's inline backend)")
    return problems


# --- 2. student versions of the lessons -------------------------------------------------------------------------

def student_versions(out: pathlib.Path) -> list[pathlib.Path]:
    """The student notebook of every lesson, made with `python -m kvlab lessons make` where missing or stale."""
    masters = sorted(LESSONS.glob("[0-9][0-9]_*.ipynb"))
    wanted = {m: out / m.stem / "student" / m.name for m in masters}
    stale = [m for m, s in wanted.items() if not s.is_file() or s.stat().st_mtime < m.stat().st_mtime]
    if stale:
        print(f"book: making the student versions of {len(stale)} lesson(s) into {out}", flush=True)
        subprocess.run([sys.executable, "-m", "kvlab", "lessons", "make", "--out", str(out),
                        *[m.stem for m in stale]], check=True, cwd=ROOT)
    missing = [str(s) for s in wanted.values() if not s.is_file()]
    if missing:
        raise BookError("`kvlab lessons make` did not write these student versions:", missing)
    return list(wanted.values())


# --- 3. sources ---------------------------------------------------------------------------------------------------

def _sync(src: pathlib.Path, dst: pathlib.Path) -> None:
    """Copy when the content differs (keeping Sphinx's incremental build for unchanged pages)."""
    if dst.is_file() and dst.read_bytes() == src.read_bytes():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)


def _write(dst: pathlib.Path, text: str) -> None:
    if dst.is_file() and dst.read_text(encoding="utf-8") == text:
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(text, encoding="utf-8")


def _code(text: str) -> str:
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _commands(rows: list[dict]) -> str:
    lines = []
    for r in rows:
        if r.get("command"):
            where = r.get("where") or r.get("results_file") or "tests"
            lines.append(f"- {_code(r['id'])} ({where}): {_code(r['command'])}")
    return "\n".join(lines)


def claims_section(paper: str, commands: bool = True) -> str:
    """One paper's rows of the ledger as kvlab.experiments.claims renders them, and (``commands``) the commands behind them."""
    from kvlab.experiments import claims

    rows = [r for r in claims.load() if r["paper"].lower() == paper.lower()]
    if not rows:
        raise BookError("the claims ledger has no rows for a paper page:", [f"{paper} (benchmarks/claims.csv)"])
    text = str(claims.table(paper))
    if commands and _commands(rows):
        text += "\n\nThe command behind each row (from `benchmarks/claims.csv`):\n\n" + _commands(rows)
    elif not commands:
        text += (f"\n\nThe command behind each row, and the other papers: [results](../results.md#{_slug(paper)}).")
    return text


def results_page() -> str:
    """The results page: the verdict rule, the counts per paper, then every paper's rows of the ledger."""
    from collections import Counter

    from kvlab.experiments import claims

    rows = claims.load()
    counts = claims.counts(rows)
    buckets = list(claims.BUCKETS)
    # the model most rows ran on, named as the ledger names it (SmolLM2-135M-Instruct), never typed here
    model = Counter(r["model"].split(",")[0].strip() for r in rows).most_common(1)[0][0]
    out = ["# Results: where each paper's claims hold at our scale", "",
           "Generated from the claims ledger `benchmarks/claims.csv` by `kvlab.experiments.claims` (`python -m kvlab claims` "
           f"recomputes it): one row per claim of a paper that kvlab tests, mostly on {model}. A "
           "statistical row is a paired difference `A - B` over the same examples, with a 95 % paired-bootstrap "
           "interval. " + str(claims.outcomes()) + " *exact* rows are identities checked by the named tests; "
           "*summary* rows hold only a committed mean.", "",
           "| paper | " + " | ".join(buckets) + " |", "|---|" + "---|" * len(buckets)]
    for paper, c in counts.items():
        out.append(f"| [{paper}](#{_slug(paper)}) | " + " | ".join(str(c.get(b, 0)) for b in buckets) + " |")
    for paper in counts:
        out += ["", f"## {paper}", ""]
        page = BOOK / "papers" / f"{paper.lower()}.md"
        if page.is_file():
            out += [f"The method, its notebooks and assignment: [{paper}](papers/{paper.lower()}.md).", ""]
        out.append(claims_section(paper))
    return "\n".join(out) + "\n"


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def _paper_notes(name: str, src: pathlib.Path, claim=None) -> str:
    """Links to kvlab's own notes on the paper (``docs/papers/*name*.md``), copied into the book under the page
    (each copy first ``claim``-ed under the output rule)."""
    folder = ROOT / "docs" / "papers"
    notes = sorted(folder.glob(f"*{name}*.md")) if folder.is_dir() else []
    if not notes:
        return ""
    for note in notes:
        if claim is not None:
            claim(src / "papers" / "notes" / note.name)
        _sync(note, src / "papers" / "notes" / note.name)
    links = "\n".join(f"- [](notes/{note.stem}.md)" for note in notes)
    toc = "\n".join(f"notes/{note.stem}" for note in notes)
    return (f"**kvlab's reading notes on the paper** (`docs/papers/`):\n\n{links}\n\n"
            f"```{{toctree}}\n:hidden:\n\n{toc}\n```")


GUIDE_LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")


def guide_page(page: pathlib.Path) -> str:
    """A page of ``docs/guide/`` for the book: links to other guide pages kept, links to files outside the book
    (``../../README.md``) left as their text, since the book holds no copy of them."""
    def unlink(m: re.Match) -> str:
        target = urllib.parse.urlsplit(m[2])
        if target.scheme or target.netloc or not target.path:  # the web, or an anchor in the same page
            return m[0]
        other = page.parent / target.path
        in_guide = other.parent == page.parent and other.suffix == ".md" and other.is_file()
        return m[0] if in_guide else m[1]

    return GUIDE_LINK.sub(unlink, page.read_text(encoding="utf-8"))


#: stderr lines that libraries print on a machine's first run (loading bars, a tokenizer notice); they say nothing
#: about the notebook, so the book leaves them out. Any tqdm progress bar ("  40%|####  | 8/20") goes too: a page
#: shows a bar frozen where the run left it.
LIBRARY_NOISE = re.compile(r"^\s*(\[transformers\] Ignoring clean_up_tokenization_spaces|Loading weights|"
                           r"Converting and de-quantizing GGUF tensors|Writing model shards|sha256 \S+:\s+\d+%)")
PROGRESS_BAR = re.compile(r"\d{1,3}%\|")
#: a Python warning as ``warnings`` prints it: ``/path/file.py:12: UserWarning: message``, then (usually) the
#: source line, indented by two spaces. The path is the machine's (a kernel's /tmp file, a venv), never the reader's.
WARNING = re.compile(r"^(?P<path>[^\s:][^:\n]*\.py):\d+: (?P<what>\w*Warning: .*)$")
#: a warning raised inside an installed library (its path is in a venv or the system's Python), about the
#: library's set-up on the machine that ran the notebook ("IProgress not found"): not about the notebook
LIBRARY_PATH = re.compile(r"(site|dist)-packages|/lib/python3")
#: a code cell's first lines that only tell nbval how to compare it (``# NBVAL_CHECK_OUTPUT``, ``# NBVAL_SKIP``...)
NBVAL_MARKERS = re.compile(r"\A(?:[ \t]*# ?NBVAL_[A-Z_]+[ \t]*(?:\n|\Z))+")
#: ipywidgets: a progress bar (tqdm.auto in a kernel with widgets) or an interactive explorer
WIDGET = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = ("*An interactive explorer (sliders) stands here in the notebook: open the notebook in the lab "
               "(`bash scripts/lab.sh`) to use it.*")
#: a row of a claims-ledger table (markdown) whose verdict is ``superseded``: a run made before a fix, kept in the
#: ledger for the record only; :func:`kvlab.experiments.claims.table` leaves such rows out, and the build does the
#: same for a copy executed before it did
SUPERSEDED_ROW = re.compile(r"^\|\s*superseded[^|]*\|.*$|^\|.*\|\s*superseded[^|]*\|\s*$")  # verdict first or last


def _stderr_for_reader(text: str) -> str:
    """stderr as a reader should see it: :data:`LIBRARY_NOISE` left out, a warning from a library's own files left
    out, and any other warning shown as ``UserWarning: message`` without the machine's path and source line."""
    out, skip_source = [], False
    for line in re.split(r"(?<=[\n\r])", text):
        bare = line.rstrip("\r\n")
        if skip_source and line.startswith("  "):
            skip_source = False
            continue
        skip_source = False
        if LIBRARY_NOISE.match(bare) or PROGRESS_BAR.search(bare) or line == "\r":
            continue
        m = WARNING.match(bare)
        if m:
            skip_source = True
            if LIBRARY_PATH.search(m["path"]):
                continue
            line = m["what"] + line[len(bare):]
        out.append(line)
    return "".join(out)


#: a widget's text form, all that is left of it once its view is dropped (``python -m kvlab notebooks book`` slims the book
#: copies so): ``interactive(children=(IntSlider(...``, ``HBox(children=(HTML(value=''), FloatProgress(...``; a
#: tqdm bar's is its bar (``Loading weights:   0%|          | 0/272``)
WIDGET_TEXT = re.compile(r"^\s*[A-Z]?[A-Za-z]*\(children=\(")


#: a markdown table's rule row (``|---|:--:|``): where a cell prints a table it read as markdown (a results file's
#: ``table``), the book shows that table rendered, not as its source text
TABLE_RULE = re.compile(r"^\|(?:\s*:?-+:?\s*\|)+\s*$")


def _printed_tables(out) -> list:
    """A stdout output as outputs in which each markdown table it prints (a ``|`` header row, a rule row, then
    ``|`` rows) becomes a markdown display, rendered as a table; the text around each table stays as printed."""
    import nbformat

    lines = out["text"].splitlines(keepends=True)
    pieces, text, i = [], [], 0
    while i < len(lines):
        if (lines[i].startswith("|") and i + 1 < len(lines) and TABLE_RULE.match(lines[i + 1].rstrip("\n"))):
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            if text:
                pieces.append(nbformat.v4.new_output("stream", name="stdout", text="".join(text)))
                text = []
            pieces.append(nbformat.v4.new_output("display_data", data={"text/markdown": "".join(lines[i:j])}))
            i = j
            continue
        text.append(lines[i])
        i += 1
    if not pieces:
        return [out]
    if "".join(text).strip():
        pieces.append(nbformat.v4.new_output("stream", name="stdout", text="".join(text)))
    return pieces


def _widget_kind(out) -> str | None:
    """``"progress"``, ``"explorer"`` (another widget) or None, for a display output ``out``: a widget's view, or
    the text form of one without its view."""
    data = out.get("data", {})
    plain = data.get("text/plain", "")
    plain = "".join(plain) if isinstance(plain, list) else plain
    text_form = set(data) == {"text/plain"} and (WIDGET_TEXT.match(plain) or PROGRESS_BAR.search(plain))
    if WIDGET not in data and not text_form:
        return None
    return "progress" if PROGRESS_BAR.search(plain) or re.search(r"FloatProgress|IntProgress", plain) else "explorer"


def _for_reader(nb) -> list[str]:
    """What the developers' process leaves on a page, taken off it (in place): nbval's markers on the first lines
    of code cells, library noise and machine paths in stderr (:func:`_stderr_for_reader`), progress bars,
    interactive widgets (a note says where to use them: the lab), and superseded rows of ledger tables; and a
    markdown table a cell prints as text is shown rendered (:func:`_printed_tables`).
    Returns what it changed, one phrase each, for the build's log."""
    import nbformat

    changed = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        stripped = NBVAL_MARKERS.sub("", cell.source)
        if stripped != cell.source:
            cell.source = stripped
            changed.append("nbval marker")
        kept = []
        for out in cell.get("outputs", []):
            kind = out.get("output_type")
            if kind == "stream" and out.get("name") == "stderr":
                text = _stderr_for_reader(out["text"])
                if text != out["text"]:
                    changed.append("stderr")
                out["text"] = text
                if not text.strip():
                    continue
            elif kind == "stream" and out.get("name") == "stdout" and "|" in out["text"]:
                pieces = _printed_tables(out)
                if len(pieces) > 1 or pieces[0] is not out:
                    changed.append("printed table rendered")
                kept += pieces
                continue
            elif kind in ("display_data", "execute_result"):
                widget = _widget_kind(out)
                if widget == "progress":
                    changed.append("progress bar")
                    continue
                if widget == "explorer":
                    changed.append("widget")
                    out = nbformat.v4.new_output("display_data", data={"text/markdown": WIDGET_NOTE})
                md = out.get("data", {}).get("text/markdown")
                if md is not None:
                    md = "".join(md) if isinstance(md, list) else md
                    rows = md.split("\n")
                    live = [r for r in rows if not SUPERSEDED_ROW.match(r)]
                    if len(live) != len(rows):
                        changed.append("superseded rows")
                        out["data"]["text/markdown"] = "\n".join(live)
            kept.append(out)
        cell.outputs = kept
    return changed


def _with_note(path: pathlib.Path, note: str) -> str:
    """The executed notebook at ``path`` with ``note`` as a markdown cell after its title cell, as JSON text;
    what the developers' process left on it taken off (:func:`_for_reader`)."""
    import nbformat

    from collections import Counter

    nb = _read(path)
    taken = Counter(_for_reader(nb))
    if taken:
        print(f"book: {path.name}: off the page: " + ", ".join(f"{what} x{n}" for what, n in sorted(taken.items())))
    cell = nbformat.v4.new_markdown_cell(note)
    cell.metadata["kvlab"] = {"page_note": True}
    nb.cells.insert(1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0, cell)
    return nbformat.writes(nb)


def _without_markers(path: pathlib.Path) -> str:
    """The notebook at ``path`` as JSON text, nbval's markers taken off the first lines of its code cells."""
    import nbformat

    nb = _read(path)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = NBVAL_MARKERS.sub("", cell.source)
    return nbformat.writes(nb)


def stage(src: pathlib.Path, executed: pathlib.Path, notebooks: list[pathlib.Path],
          students: list[pathlib.Path], pages: dict[str, tuple[pathlib.Path, str]] | None = None,
          claim=None) -> None:
    """Write the book's sources into ``src`` (only what changed, so Sphinx rebuilds only those pages); each
    notebook page from ``pages`` (:func:`choose_pages`; default: the nbval copies in ``executed``). ``claim``
    (the output folder's :meth:`~kvlab.outputs.OutputFolder.claim`) records each file before it is written."""
    claim = claim or (lambda path: path)
    keep = set()

    def put(dst: pathlib.Path, text: str) -> None:
        claim(dst)
        _write(dst, text)
        keep.add(dst)

    put(src / "index.md", (BOOK / "index.md").read_text(encoding="utf-8"))
    for page in sorted((BOOK / "papers").glob("*.md")):
        def fill(m: re.Match) -> str:
            if m["paper"]:
                return claims_section(m["paper"], commands=False)
            return _paper_notes(page.stem, src, claim)

        put(src / "papers" / page.name, PLACEHOLDER.sub(fill, page.read_text(encoding="utf-8")))
    notes = ROOT / "docs" / "papers"
    keep |= {src / "papers" / "notes" / n.name for n in (sorted(notes.glob("*.md")) if notes.is_dir() else [])
             if (src / "papers" / "notes" / n.name).is_file()}
    put(src / "results.md", results_page())
    for page in sorted((ROOT / "docs" / "guide").glob("*.md")):
        put(src / "guide" / page.name, guide_page(page))
    for nb in notebooks:
        path, kind = (pages or {}).get(nb.name, (executed / nb.name, "ci"))
        put(src / "notebooks" / nb.name, _with_note(path, page_note(nb, kind)))
    for student in students:  # the student versions, without any test-run marker a master's cell may carry
        put(src / "lessons" / student.name, _without_markers(student))
    # a page removed from the course leaves the book too; only files an earlier build wrote (its list of them)
    # are ever deleted, never anything else found in src
    written = claim(src / BOOK_FILES)
    before = written.read_text(encoding="utf-8").splitlines() if written.is_file() else []
    for rel in before:
        old = src / rel
        if rel and old not in keep and old.is_file() and old.resolve().is_relative_to(src.resolve()):
            old.unlink()
    written.write_text("".join(f"{p.relative_to(src).as_posix()}\n" for p in sorted(keep)), encoding="utf-8")


# --- 4. sphinx ----------------------------------------------------------------------------------------------------

def sphinx(src: pathlib.Path, out: pathlib.Path, jobs: str) -> None:
    html = out / "html"
    doctrees = out / "doctrees"
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-n", "-q", "-j", jobs,
           "-c", str(BOOK), "-d", str(doctrees), str(src), str(html)]
    print("book: " + " ".join(cmd[2:]), flush=True)
    if subprocess.run(cmd, cwd=ROOT).returncode != 0:
        # Sphinx reads a page again only when it changed: forget what it read, so that the next build reports
        # the same warnings instead of passing on an unchanged page.
        shutil.rmtree(doctrees, ignore_errors=True)
        raise BookError("sphinx-build failed (warnings are errors: see the lines above)", [])


# --- 5. the built site --------------------------------------------------------------------------------------------

class _Page(html.parser.HTMLParser):
    """The links, sources, ids of one page, and how many images sit inside notebook cell outputs."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self):
        super().__init__()
        self.urls: list[str] = []
        self.ids: set[str] = set()
        self.output_images = 0
        self._depth = 0
        self._output_depth: list[int] = []  # depths of the open myst-nb ``cell_output`` blocks

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        for key in ("href", "src"):
            if a.get(key) and tag in ("a", "img", "script", "link", "iframe", "source"):
                self.urls.append(a[key])
        if tag == "img" and self._output_depth:
            self.output_images += 1
        if tag in self.VOID:
            return
        self._depth += 1
        if tag == "div" and "cell_output" in (a.get("class") or "").split():
            self._output_depth.append(self._depth)

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if self._output_depth and self._output_depth[-1] == self._depth:
            self._output_depth.pop()
        self._depth -= 1


def _local(url: str) -> bool:
    parts = urllib.parse.urlsplit(url)
    return not parts.scheme and not parts.netloc and not url.startswith("//")


def check_site(html: pathlib.Path, executed: pathlib.Path, notebooks: list[pathlib.Path],
               pages_shown: dict[str, tuple[pathlib.Path, str]] | None = None) -> list[str]:
    """Every local link, script, stylesheet and image of every page resolves; notebook pages keep their figures
    (those of the executed notebook each page shows: ``pages_shown``, default the copies in ``executed``)."""
    import nbformat

    html = html.resolve()
    problems = []
    # Theme templates under _static are not pages.
    pages = {p: _parse(p) for p in html.rglob("*.html") if "_static" not in p.relative_to(html).parts}
    for page, parsed in pages.items():
        for url in parsed.urls:
            if not _local(url) or url.startswith(("mailto:", "javascript:", "data:")):
                continue
            parts = urllib.parse.urlsplit(url)
            path, anchor = parts.path, parts.fragment
            target = (page.parent / urllib.parse.unquote(path)).resolve() if path else page
            if target.is_dir():
                target = target / "index.html"
            rel = page.relative_to(html)
            if not target.is_file():
                problems.append(f"{rel}: broken link {url}")
            elif anchor and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if urllib.parse.unquote(anchor) not in ids:
                    problems.append(f"{rel}: link {url} names an anchor that {target.name} does not have")
    for nb_path in notebooks:
        page = html / "notebooks" / (nb_path.stem + ".html")
        if not page.is_file():
            problems.append(f"no page for {nb_path.name} ({page})")
            continue
        shown = (pages_shown or {}).get(nb_path.name, (executed / nb_path.name, "ci"))[0]
        want = _images(_read(shown))
        found = pages[page].output_images
        if found < want:
            problems.append(f"{page.relative_to(html)}: {found} figures rendered, the executed notebook has {want}")
    return problems


def _parse(page: pathlib.Path) -> _Page:
    parsed = _Page()
    parsed.feed(page.read_text(encoding="utf-8"))
    return parsed


# --- main -------------------------------------------------------------------------------------------------------

BOOK_FILES = ".kvlab-book-files"  # in OUT/src: the pages a build staged there, one path a line


def _built_here(out: pathlib.Path):
    """Whether a file found in ``out`` (a folder without a manifest yet) is one an earlier build wrote: a page
    the list of staged pages names (``src/.kvlab-book-files``), or a file of Sphinx's own output folders, which
    Sphinx marks (``html/.buildinfo``, ``doctrees/environment.pickle``). Anything else, whatever its folder, is
    someone else's."""
    listed = out / "src" / BOOK_FILES
    staged = set(listed.read_text(encoding="utf-8").splitlines()) if listed.is_file() else set()
    sphinx_html = (out / "html" / ".buildinfo").is_file() and (out / "html" / ".buildinfo").read_text(
        encoding="utf-8", errors="replace").startswith("# Sphinx build info")
    sphinx_doctrees = (out / "doctrees" / "environment.pickle").is_file()

    def recognise(path: pathlib.Path) -> bool:
        rel = path.relative_to(out).parts
        if rel[0] == "src":
            return "/".join(rel[1:]) in staged | {BOOK_FILES}
        return (rel[0] == "html" and sphinx_html) or (rel[0] == "doctrees" and sphinx_doctrees)

    return recognise


def _output_folder(out: pathlib.Path):
    """``out`` under kvlab's output rule (:mod:`kvlab.outputs`): new, or holding only what an earlier build wrote
    (the pages it staged in ``src``, Sphinx's ``html`` and ``doctrees``); a file of anyone else's there, in any of
    those folders too, stops the build before it starts. Each staged page is claimed before it is written; Sphinx's
    two folders are the book's whole."""
    from kvlab.outputs import OutputFolder, OutputRefused

    try:
        folder = OutputFolder(out, "python book/build.py", recognise=_built_here(out))
        folder.claim("html/", "doctrees/")
    except OutputRefused as err:
        raise BookError(str(err), []) from None
    return folder


def build(executed: pathlib.Path, lessons_out: pathlib.Path, out: pathlib.Path, jobs: str = "auto",
          copies: pathlib.Path = BOOK_COPIES) -> pathlib.Path:
    start = time.monotonic()
    folder = _output_folder(out)
    notebooks = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    problems = check_executed(executed, notebooks)
    if problems:
        raise BookError(f"the executed notebooks in {executed} cannot make the book; {RUN_NOTEBOOKS}:", problems)
    pages = choose_pages(executed, notebooks, copies)
    students = student_versions(lessons_out)
    stage(out / "src", executed, notebooks, students, pages, claim=folder.claim)
    sphinx(out / "src", out, jobs)
    problems = check_site(out / "html", executed, notebooks, pages)
    if problems:
        raise BookError(f"the built book in {out / 'html'} has broken pieces:", problems)
    # 6. what a reader must not see (book/readable.py; tests/browser checks it in Chromium and fails on it)
    import readable

    found = readable.check_book(out / "html")
    for page, what in found.items():
        print(f"book: {page}: " + "; ".join(f"{check}: {', '.join(v)}" for check, v in what.items()), file=sys.stderr)
    index = out / "html" / "index.html"
    book = sorted(name[:2] for name, (_, kind) in pages.items() if kind == "book")
    print(f"book: {index} ({len(notebooks)} notebooks, book copies of {book or 'none'}, {len(students)} "
          f"assignments; {time.monotonic() - start:.0f} s)")
    return index


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--executed", type=pathlib.Path, default=ROOT / "build" / "executed",
                   help="the notebooks as nbval executed them (default: build/executed)")
    p.add_argument("--copies", type=pathlib.Path, default=BOOK_COPIES,
                   help="the book copies, executed at the book parameter sets (default: book/executed)")
    p.add_argument("--lessons", type=pathlib.Path, default=ROOT / "build" / "lessons",
                   help="where `kvlab lessons make` writes the student versions (default: build/lessons)")
    p.add_argument("--out", type=pathlib.Path, default=ROOT / "build" / "book",
                   help="the book's sources, doctrees and html (default: build/book)")
    p.add_argument("-j", "--jobs", default=os.environ.get("KVLAB_BOOK_JOBS", "auto"),
                   help="sphinx-build processes (default: auto, one per core)")
    args = p.parse_args(argv)
    try:
        build(args.executed.resolve(), args.lessons.resolve(), args.out.resolve(), args.jobs, args.copies.resolve())
    except BookError as err:
        print(f"book: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
