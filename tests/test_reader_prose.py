"""The text a student reads is written for the student.

Notebooks, assignments, the book's own pages, the guides, kvlab's paper notes, START.md and the README say
what a method does and what a run shows; where a number came from (which run, which machine, which day,
which command) belongs in the results READMEs under ``benchmarks/results/``. This test reads that text and
fails on the marks of a developer's diary (issue numbers, rounds, sessions, dates, scratch paths, the
paper text files only the developers have), on code lines wider than the book's 88 columns, and on
Markdown tables whose code spans hold a ``|`` (the pipe splits the column, so the table breaks).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 88

# (pattern, what it is): matched case-insensitively against every line a reader sees
DIARY = [
    (r"\bissues?\s*#?\d+", "an issue number"),
    (r"\bthe issue'?s\b", "the issue as a reference"),
    (r"\bround \d", "a work round"),
    (r"\bsessions?\b", "a work session"),
    (r"rerun_issue", "an issue's scratch folder"),
    (r"/tmp/", "a scratch path"),
    (r"\b20\d\d-[01]\d-[0-3]\d\b", "a date"),
    (r"\b\d{1,2} (jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]* 20\d\d\b", "a date"),
    (r"\b(jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]* \d{1,2},? 20\d\d\b", "a date"),
    (r"\b(sepllm|lacache|dhsa|reform|orthorank|streamingllm)[\w-]*\.txt\b", "a paper text file"),
    (r"lost in (the )?extraction", "the developers' paper text files"),
    (r"anonymous submission", "the developers' paper text files"),
]


# the first cell's run-time sentence, stamped by `python -m kvlab notebooks times stamp` with the date of its measurement
RUN_TIME = "**Run time** on one CPU core, one thread: "


def _notebook_cells(path: Path) -> list[tuple[str, str]]:
    return [(c["cell_type"], "".join(c["source"])) for c in json.loads(path.read_text())["cells"]]


def _without_run_time(src: str) -> str:
    return "\n\n".join(p for p in src.split("\n\n") if not p.startswith(RUN_TIME))


def reader_texts() -> dict[str, list[str]]:
    """Every file a reader meets, as lines (notebook cells flattened, markdown and code alike)."""
    files = sorted(
        [*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("lessons/*.ipynb"), *ROOT.glob("book/*.md"),
         *ROOT.glob("book/papers/*.md"), *ROOT.glob("docs/guide/*.md"), *ROOT.glob("docs/papers/*.md"),
         ROOT / "README.md", ROOT / "notebooks" / "START.md"])
    out = {}
    for path in files:
        if path.suffix == ".ipynb":
            lines = [line for _, src in _notebook_cells(path) for line in _without_run_time(src).splitlines()]
        else:
            lines = path.read_text().splitlines()
        out[str(path.relative_to(ROOT))] = lines
    return out


def diary_marks(lines: list[str]) -> list[str]:
    """``"line N: <what> in '<text>'"`` for each line with a mark of the developers' history."""
    found = []
    for n, line in enumerate(lines, 1):
        for pattern, what in DIARY:
            m = re.search(pattern, line, flags=re.IGNORECASE)
            if m:
                found.append(f"line {n}: {what} ({m.group(0)!r}) in {line.strip()[:100]!r}")
    return found


def broken_table_rows(lines: list[str]) -> list[str]:
    """Markdown table rows with a ``|`` inside a code span (it splits the column: write it as ``\\|``)."""
    bad = []
    for n, line in enumerate(lines, 1):
        if not line.lstrip().startswith("|"):
            continue
        for span in re.findall(r"(`+)(.+?)\1", line):
            if re.search(r"(?<!\\)\|", span[1]):
                bad.append(f"line {n}: {line.strip()[:100]!r}")
                break
    return bad


def wide_code_lines(path: Path) -> list[str]:
    return [f"cell {i}: {len(line)} columns: {line[:60]!r}..."
            for i, (kind, src) in enumerate(_notebook_cells(path)) if kind == "code"
            for line in src.splitlines() if len(line) > WIDTH]


TEXTS = reader_texts()


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_no_developer_diary_in_reader_text(name):
    marks = diary_marks(TEXTS[name])
    assert not marks, (f"{name} speaks of the project's history to the reader; say what the run shows and "
                       "move provenance (run, machine, date, command) to benchmarks/results/*/README.md:\n  "
                       + "\n  ".join(marks))


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_tables_keep_their_columns(name):
    bad = broken_table_rows(TEXTS[name])
    assert not bad, f"{name}: a '|' inside a code span splits the table column; escape it as '\\|':\n  " + \
        "\n  ".join(bad)


@pytest.mark.parametrize("path", sorted(ROOT.glob("notebooks/*.ipynb")), ids=lambda p: p.stem)
def test_notebook_code_fits_the_page(path):
    wide = wide_code_lines(path)
    assert not wide, (f"{path.name}: code lines wider than {WIDTH} columns scroll sideways in the book; "
                      "wrap them (e.g. ruff format --line-length 88) and shorten comments:\n  "
                      + "\n  ".join(wide))


def test_the_checks_catch_what_they_name():
    """The detectors themselves: each mark is found, and ordinary prose passes."""
    assert diary_marks(["Tables (issue 28)"]) and diary_marks(["the re-run in rerun_issue23/"])
    assert diary_marks(["this session's measurement"]) and diary_marks(["measured on 2026-11-25"])
    assert diary_marks(["see sepllm.txt, where the equations were lost in extraction"])
    assert diary_marks(["round 2 of the fixes"]) and diary_marks(["written to /tmp/x"])
    assert not diary_marks(["SepLLM keeps separators; Table 8 of the paper uses 324 entries."])
    assert broken_table_rows(["| `a | b` | 1 |"]) and not broken_table_rows(["| `a \\| b` | 1 |"])
    assert not broken_table_rows(["| `a` or `b` | 1 |", "text with `x | y` outside a table"])


# ------------------------------------------------------------------------------------ what the static book shows
@pytest.mark.parametrize("path", sorted(ROOT.glob("notebooks/*.ipynb")), ids=lambda p: p.stem)
def test_widgets_have_a_static_picture(path):
    """A slider needs a running kernel: the static book shows a widget cell's plainly drawn grid of plots instead,
    so every cell that makes a widget also draws one (``plt.subplots``)."""
    cells = [src for kind, src in _notebook_cells(path) if kind == "code"]
    widget = [src.splitlines()[0] for src in cells
              if re.search(r"\binteract\(|viz\.interactive_\w+\(", src) and "plt.subplots(" not in src]
    assert not widget, f"{path.name}: widget cells without a plain picture beside them: {widget}"


@pytest.mark.parametrize("path", sorted(ROOT.glob("notebooks/*.ipynb")), ids=lambda p: p.stem)
def test_test_markers_live_in_cell_tags(path):
    """nbval's markers (``nbval-check-output``, ``nbval-ignore-output``, ``nbval-skip``) are cell tags, where a
    reader of the notebook in the lab never sees them, not ``# NBVAL_*`` lines of the code
    (``python -m kvlab notebooks markers`` moves them)."""
    shown = [f"cell {i}" for i, (kind, src) in enumerate(_notebook_cells(path)) if kind == "code" and "NBVAL_" in src]
    assert not shown, f"{path.name}: an NBVAL marker in the code of {shown}: run `python -m kvlab notebooks markers`"


def test_leaderboard_legends_stay_off_the_points():
    """Notebook 15's Pareto plot: the method legend sits beside the grid, never over an axes' points."""
    import matplotlib

    matplotlib.use("Agg")
    from kvlab.experiments import leaderboard as lb

    rows = []
    for task in ("ppl", "passkey"):
        metric = lb.MAIN_METRIC[task][0]
        for i, method in enumerate(("StreamingLLM", "H2O", "SepLLM", "LaCache", "TOVA")):
            for level, kv in enumerate((40, 56)):
                rows.append({"model": "m", "task": task, "method": method, "kind": "kv", "status": "ok",
                             "level": level, "mean_kv": kv + i, "flop_fraction": None, metric: 10 + i + level})
    fig = lb.pareto_plot(rows)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert legends, "the plot names its methods in a legend"
    for ax in fig.axes:
        box = ax.get_window_extent(renderer)
        for legend in legends:
            assert not legend.get_window_extent(renderer).overlaps(box), "a legend covers an axes' points"


# ------------------------------------------------------------------------------------ what the text points at
@pytest.mark.parametrize("name", sorted(TEXTS))
def test_named_lessons_exist(name):
    """A lesson named in the text (``lessons/01_streaming_llm``) is one the course has."""
    named = {m for line in TEXTS[name] for m in re.findall(r"lessons/(\d\d_\w+)", line)}
    missing = sorted(n for n in named if not (ROOT / "lessons" / f"{n}.ipynb").is_file())
    assert not missing, f"{name} names lessons that do not exist: {missing} (have: " + \
        ", ".join(sorted(p.stem for p in ROOT.glob("lessons/*.ipynb"))) + ")"


def test_leaderboard_defaults_never_write_into_committed_results():
    """Running notebook 15 with its defaults (or its full set) writes under build/, never over
    benchmarks/results/ (the committed runs the text quotes)."""
    params = next(src for kind, src in _notebook_cells(ROOT / "notebooks" / "15_leaderboard.ipynb")
                  if kind == "code" and re.search(r"^out: str = ", src, re.M))
    out = re.search(r'^out: str = "([^"]*)"', params, re.M).group(1)
    assert out.startswith("../build/"), f"notebook 15's default out is {out!r}: put it under ../build/"
    full = (ROOT / "notebooks" / "params" / "15_leaderboard.full.yaml").read_text()
    assert re.search(r"^out: \.\./build/", full, re.M), "15_leaderboard.full.yaml must write under ../build/"
