"""The teacher's page (docs/guide/teaching.md) and the index of docs/ (docs/README.md) point at what exists.

The page names notebooks, lessons and parameter files, quotes measured run times from the committed timing files of
``benchmarks/results/notebook_times/``, gives papermill and kvlab commands and a 50-minute time plan per paper. This
test reads only text and JSON (no model, no notebook run): it fails when a named file is missing, a quoted time is not
the timing file's value as rounded on the page, a ``-p`` option is not a parameter of its notebook, a command names a
kvlab command, lesson command, asset or script that does not exist, a time plan does not add up to 50 minutes, or the
index leaves out a page of docs/guide/ or docs/papers/.
"""

from __future__ import annotations

import json
import re
import shlex
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "guide" / "teaching.md"
INDEX = ROOT / "docs" / "README.md"
TIMES = ROOT / "benchmarks" / "results" / "notebook_times"
MAX_WIDTH = 120
PAPERS = ("StreamingLLM", "SepLLM", "LaCache", "DHSA", "REFORM", "OrthoRank")

NOTEBOOK = re.compile(r"(?<!\w)notebooks/(\d\d_\w+)\.ipynb")
LESSON = re.compile(r"(?<![\w.])lessons/(\d\d_\w+?)(?:\.ipynb)?\b")
PARAMS = re.compile(r"(?<!\w)notebooks/params/(\d\d_[\w.-]+\.ya?ml)")
SECONDS = re.compile(r"\b(\d+(?:\.\d+)?) s\b")
CODE = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?\s*\)")


def page_text() -> str:
    return PAGE.read_text(encoding="utf-8")


def page_lines() -> list[str]:
    return page_text().splitlines()


# ------------------------------------------------------------------------------------------------ named files
def test_named_notebooks_lessons_and_parameter_files_exist():
    text = page_text()
    notebooks = set(NOTEBOOK.findall(text))
    lessons = set(LESSON.findall(text))
    params = set(PARAMS.findall(text))
    assert notebooks and lessons and params, "the page names no notebook, lesson or parameter file: is it the page?"
    missing = ([f"notebooks/{n}.ipynb" for n in sorted(notebooks) if not (ROOT / "notebooks" / f"{n}.ipynb").is_file()]
               + [f"lessons/{n}.ipynb" for n in sorted(lessons) if not (ROOT / "lessons" / f"{n}.ipynb").is_file()]
               + [f"notebooks/params/{p}" for p in sorted(params)
                  if not (ROOT / "notebooks" / "params" / p).is_file()])
    assert not missing, f"docs/guide/teaching.md names files that do not exist: {missing}"


def test_every_relative_link_of_the_two_pages_resolves():
    for page in (PAGE, INDEX):
        text = FENCE.sub("", page.read_text(encoding="utf-8"))
        targets = [t.split("#")[0] for t in LINK.findall(text) if "://" not in t and not t.startswith("#")]
        broken = [t for t in targets if not (page.parent / t).exists()]
        assert not broken, f"{page.relative_to(ROOT)}: links to missing files {broken}"


# ------------------------------------------------------------------------------------------------ quoted run times
@cache
def timing_file(name: str) -> dict:
    return json.loads((TIMES / name).read_text(encoding="utf-8"))


def timing_table() -> list[tuple[str, str, str]]:
    """``(notebook, timing file, quoted time)`` for every cell of the run-time table: the table whose header names a
    timing file (``*.json`` of benchmarks/results/notebook_times/) per column, and whose rows start with a notebook."""
    lines = page_lines()
    out = []
    for i, line in enumerate(lines):
        if not (line.startswith("|") and ".json`" in line):
            continue
        header = [c.strip() for c in line.strip().strip("|").split("|")]
        files = {j: m.group(1) for j, c in enumerate(header) if (m := re.search(r"`([\w.-]+\.json)`", c))}
        for row in lines[i + 2:]:
            if not row.startswith("|"):
                break
            cells = [c.strip() for c in row.strip().strip("|").split("|")]
            notebook = NOTEBOOK.search(cells[0])
            assert notebook, f"a row of the run-time table names no notebook: {row!r}"
            for j, name in files.items():
                out.append((f"{notebook.group(1)}.ipynb", name, cells[j]))
    return out


def test_the_page_has_a_run_time_table():
    rows = timing_table()
    assert rows, "docs/guide/teaching.md has no table whose header names a timing file"
    quoted = {nb for nb, _, _ in rows}
    taught = {f"{n}.ipynb" for n in NOTEBOOK.findall(page_text())}
    assert taught <= quoted, f"notebooks on the page without a measured time in its table: {sorted(taught - quoted)}"


@pytest.mark.parametrize("notebook, name, quoted", timing_table(), ids=lambda v: str(v))
def test_quoted_time_is_the_committed_measurement(notebook, name, quoted):
    assert (TIMES / name).is_file(), f"the table quotes {name}, which benchmarks/results/notebook_times/ lacks"
    m = re.fullmatch(r"(\d+(?:\.(\d+))?) s", quoted)
    assert m, f"{notebook} in {name}: write the time as 'N s' or 'N.N s', got {quoted!r}"
    rows = {r["notebook"]: r for r in timing_file(name)["notebooks"]}
    assert notebook in rows, f"{name} has no row for {notebook}"
    row = rows[notebook]
    assert row["status"] == "ok", f"{name}: {notebook} did not finish ({row['status']}): its time is a lower bound"
    digits = len(m.group(2) or "")
    expected = f"{round(row['cpu_s'], digits):.{digits}f}"
    assert m.group(1) == expected, (f"{notebook}: the page quotes {quoted} from {name}, whose cpu_s is "
                                    f"{row['cpu_s']} ({expected} s as rounded on the page)")


def test_a_one_thread_measurement_is_said_to_be_one():
    names = {name for _, name, _ in timing_table()}
    one_thread = [n for n in sorted(names) if timing_file(n).get("threads") == 1]
    if one_thread:
        assert "one thread" in page_text(), f"{one_thread} record one thread: the page must say so"


def test_every_quoted_time_in_seconds_is_in_the_checked_table():
    """A time in seconds outside the run-time table would go unchecked: the page keeps them all in the table."""
    table_rows = {i for i, line in enumerate(page_lines()) if line.startswith("| `notebooks/")}
    loose = [f"line {i + 1}: {line.strip()[:80]!r}" for i, line in enumerate(page_lines())
             if i not in table_rows and SECONDS.search(line)]
    assert not loose, "times in seconds outside the run-time table:\n  " + "\n  ".join(loose)


# ------------------------------------------------------------------------------------------------ commands
def commands() -> list[list[str]]:
    """Every shell command of the page's code blocks (continuation lines joined, comments dropped), split."""
    out = []
    for block in FENCE.findall(page_text()):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#")[0].strip()
            if line:
                out.append(shlex.split(line))
    return out


def notebook_parameters(path: Path) -> set[str]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    return set(re.findall(r"^(\w+)\s*:", "".join(cell["source"]), re.M))


def papermill_calls() -> list[list[str]]:
    """The papermill calls of the code blocks and the inline commands (``-p other_tokenizer ""``)."""
    calls = [c for c in commands() if c and c[0].endswith("papermill")]
    assert calls, "the page gives no papermill command"
    return calls


def test_papermill_commands_run_existing_notebooks_with_their_parameters():
    for call in papermill_calls():
        assert len(call) >= 3 and NOTEBOOK.fullmatch(call[1]), f"papermill's first argument is a notebook: {call}"
        assert call[2].startswith("build/"), f"write executed copies under build/ (git-ignored): {call}"
        params = notebook_parameters(ROOT / call[1])
        for flag, value in zip(call, call[1:]):
            if flag == "-p":
                assert value in params, f"{call[1]} has no parameter {value!r} (has {sorted(params)})"
            if flag == "-f":
                assert (ROOT / value).is_file(), f"no parameter file {value}"
                stem = Path(call[1]).stem
                assert Path(value).name.startswith(stem + "."), f"{value} is not {call[1]}'s parameter file"
            if flag == "--cwd":
                assert value == "notebooks", "the notebooks read ../benchmarks/results: run them with --cwd notebooks"


def test_inline_papermill_options_are_parameters_of_the_notebook_they_follow():
    """Options written in the prose (`-p NAME VALUE`) name a parameter of the section's notebooks."""
    for section in sections().values():
        for span in CODE.findall(section):
            for name in re.findall(r"(?:^|\s)-p (\w+)", span):
                notebooks = NOTEBOOK.findall(section)
                assert any(name in notebook_parameters(ROOT / "notebooks" / f"{n}.ipynb") for n in notebooks), (
                    f"`{span}`: no notebook of its section ({notebooks}) has a parameter {name!r}")


def kvlab_commands() -> set[str]:
    usage = re.search(r'USAGE = """(.*?)"""', (ROOT / "kvlab" / "__main__.py").read_text(), re.S).group(1)
    return set(re.findall(r"^  (\S+)", usage, re.M))


def lesson_commands() -> set[str]:
    return set(re.findall(r'add_parser\("(\w+)"', (ROOT / "kvlab" / "classroom" / "cli.py").read_text()))


def asset_ids() -> set[str]:
    registry = json.loads((ROOT / "kvlab" / "assets" / "registry.json").read_text())
    assets = registry["assets"]
    return set(assets) if isinstance(assets, dict) else {a["id"] for a in assets}


def test_kvlab_commands_lessons_and_assets_exist():
    known, lesson_cmds, assets = kvlab_commands(), lesson_commands(), asset_ids()
    inline = [shlex.split(s) for s in CODE.findall(page_text()) if s.startswith((".venv/bin/python -m kvlab", "bash "))]
    calls = [c for c in commands() + inline if c[:3] == [".venv/bin/python", "-m", "kvlab"]]
    assert calls, "the page gives no kvlab command"
    for call in calls:
        assert call[3] in known, f"python -m kvlab has no command {call[3]!r} (has {sorted(known)})"
        if call[3] == "lessons":
            assert call[4] in lesson_cmds, f"kvlab lessons has no {call[4]!r} (has {sorted(lesson_cmds)})"
            if call[4] == "grade":
                assert list((ROOT / "lessons").glob(f"{call[5]}_*.ipynb")), f"no lesson {call[5]}"
        if call[3] == "fetch":
            ids = [a for a in call[4:] if not a.startswith("-")]
            assert set(ids) <= assets, f"unknown assets {sorted(set(ids) - assets)}"
    for call in commands() + inline:
        if call[0] == "bash":
            assert (ROOT / call[1]).is_file(), f"no script {call[1]}"


# ------------------------------------------------------------------------------------------------ one class a paper
def sections() -> dict[str, str]:
    """``{## heading: its text}`` of the sections that hold a class: those with discussion questions."""
    parts = re.split(r"^## (.+)$", page_text(), flags=re.M)
    found = {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}
    return {h: body for h, body in found.items() if "### Discussion questions" in body}


def test_every_paper_has_a_class():
    heads = list(sections())
    for paper in PAPERS:
        assert any(paper in h for h in heads), f"no class section for {paper} (sections: {heads})"


@pytest.mark.parametrize("heading", list(sections()))
def test_each_class_names_its_material_plans_fifty_minutes_and_asks_three_to_five_questions(heading):
    body = sections()[heading]
    assert NOTEBOOK.search(body), f"{heading}: names no notebook"
    assert LESSON.search(body), f"{heading}: names no lesson"
    plan = body.split("### Time plan", 1)[1].split("###", 1)[0] if "### Time plan" in body else ""
    minutes = [int(m) for m in re.findall(r"^- \*\*(\d+) min\*\*", plan, re.M)]
    assert sum(minutes) == 50, f"{heading}: the time plan adds up to {sum(minutes)} min, not 50 ({minutes})"
    questions = re.findall(r"^\d+\. ", body.split("### Discussion questions", 1)[1], re.M)
    assert 3 <= len(questions) <= 5, f"{heading}: {len(questions)} discussion questions, not 3-5"


# ------------------------------------------------------------------------------------------------ the pages' form
@pytest.mark.parametrize("page", [PAGE, INDEX], ids=lambda p: str(p.relative_to(ROOT)))
def test_lines_fit_in_120_columns(page):
    wide = [f"line {n}: {len(line)}" for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
            if len(line) > MAX_WIDTH]
    assert not wide, f"{page.relative_to(ROOT)} has lines over {MAX_WIDTH} characters: {wide}"


def test_the_index_lists_every_page_of_the_guide_and_the_papers_and_the_results():
    linked = {(INDEX.parent / t.split("#")[0]).resolve() for t in LINK.findall(INDEX.read_text(encoding="utf-8"))}
    pages = [*sorted((ROOT / "docs" / "guide").glob("*.md")), *sorted((ROOT / "docs" / "papers").glob("*.md")),
             ROOT / "docs" / "results.md"]
    missing = [str(p.relative_to(ROOT)) for p in pages if p.resolve() not in linked]
    assert not missing, f"docs/README.md does not link {missing}"
    assert PAGE.resolve() in linked


def test_the_checks_can_fail(tmp_path):
    """The parsers find what they look for, so a broken page cannot pass by being unread."""
    assert NOTEBOOK.findall("see notebooks/03_x.ipynb and ../../notebooks/05_y.ipynb, not build/class/03.ipynb") == [
        "03_x", "05_y"]
    assert LESSON.findall("`lessons/02_sepllm.ipynb`, build/lessons/02_sepllm/student/") == ["02_sepllm", "02_sepllm"]
    assert PARAMS.findall("-f notebooks/params/01_attention_sinks.ci.yaml") == ["01_attention_sinks.ci.yaml"]
    assert SECONDS.search("takes 253.7 s") and not SECONDS.search("a = 4, s = 16") and not SECONDS.search("10 min")
