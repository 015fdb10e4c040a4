"""Notebook run times (issue 25): every numbered notebook states its time at the defaults and with its CI set in its
first cell, the statement follows the committed tables, every CI set fits in 1 min of one core, and
``python -m kvlab notebooks times`` measures what it says (tree CPU time, one core, a timeout that ends the kernel)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
from kvlab.notebooks import times as nt  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "notebook_times"
CI_TABLE = RESULTS / "ci_1thread.json"
DEFAULTS_TABLE = RESULTS / "defaults_cpu_1thread.json"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


# ------------------------------------------------------------------------------------ the committed statements
def _rows(path: pathlib.Path) -> dict:
    return {r["notebook"]: r for r in json.loads(path.read_text())["notebooks"]}


def test_every_ci_set_fits_one_minute_of_one_core():
    report = json.loads(CI_TABLE.read_text())
    assert report["set"] == "ci" and report["threads"] == 1
    rows = _rows(CI_TABLE)
    assert sorted(rows) == [nb.name for nb in NOTEBOOKS], "the CI table must hold every numbered notebook"
    for name, row in rows.items():
        assert row["status"] == "ok", f"{name}: {row['status']} {row.get('error')}"
        assert row["cpu_s"] <= 60, f"{name}: its CI set takes {row['cpu_s']} s of one core (target: 1 min)"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_first_cell_states_the_measured_run_times(nb):
    cell = nbformat.read(nb, as_version=4).cells[0]
    assert cell.cell_type == "markdown"
    found = nt.stated(cell.source)
    assert len(found) == 1, f"{nb.name}: the first cell must state its run time once ({nt.LINE}...)"
    kind, value, unit, note, ci_seconds, stem = found[0]
    assert stem == nb.stem
    ci, defaults = _rows(CI_TABLE)[nb.name], _rows(DEFAULTS_TABLE)[nb.name]
    assert (int(ci_seconds), "s") == nt.rounded(ci["cpu_s"])
    date = json.loads(DEFAULTS_TABLE.read_text())["date"].split()[0]
    # the whole sentence is what the tables give: a re-measured table needs `notebook_times.py stamp`
    expected = nt.run_time_line(nb.stem, ci, defaults, nt.declared(nb), date)
    assert expected in " ".join(cell.source.split()), f"{nb.name}: run `notebook_times.py stamp` ({expected})"


# ------------------------------------------------------------------------------------ the sentence
def test_rounding_of_stated_times():
    assert nt.rounded(2) == (5, "s") and nt.rounded(37) == (35, "s") and nt.rounded(118) == (120, "s")
    assert nt.rounded(121) == (2, "min") and nt.rounded(1500) == (25, "min")


def test_run_time_line_says_lower_bounds_as_such():
    ci = {"status": "ok", "cpu_s": 61.0}
    stopped = {"status": "timeout", "cpu_s": 490.0, "limit_s": 900.0, "parameters": {"device": "cpu"}}
    line = nt.run_time_line("10_x", ci, stopped, {"device": "auto"}, "2026-11-25")
    assert nt.RUN_TIME.search(line).groups()[:5] == ("more than", "8", "min", None, "60")
    # stopped at a 6 min limit with a little less CPU than wall (papermill starting): "more than 6 min"
    at_limit = {"status": "timeout", "cpu_s": 355.0, "wall_s": 361.0, "limit_s": 360.0, "parameters": {}}
    line = nt.run_time_line("10_x", ci, at_limit, {}, "2026-11-25")
    assert nt.RUN_TIME.search(line).groups()[:3] == ("more than", "6", "min")
    # an input dropped through a parameter: "at least", and the parameter named
    reduced = {"status": "ok", "cpu_s": 300.0, "parameters": {"device": "cpu", "other_models": []}}
    line = nt.run_time_line("11_x", ci, reduced, {"device": "auto", "other_models": ["a", "b"]}, "2026-11-25")
    kind, value, unit, note, _, _ = nt.RUN_TIME.search(line).groups()
    assert (kind, value, unit) == ("at least", "5", "min") and "other_models = []" in note
    plain = {"status": "ok", "cpu_s": 300.0, "parameters": {"device": "cpu", "num_threads": 1}}
    assert "about 5 min at the defaults," in nt.run_time_line("05_x", ci, plain, {"num_threads": 0}, "2026-11-25")


def test_run_time_line_refuses_what_it_cannot_state():
    done = {"status": "ok", "cpu_s": 100.0, "parameters": {}}
    with pytest.raises(ValueError, match="over the 2 min target: shrink notebooks/params/03_x.ci.yaml"):
        nt.run_time_line("03_x", {"status": "ok", "cpu_s": 131.0}, done, {}, "d")
    with pytest.raises(ValueError, match="did not run to the end"):
        nt.run_time_line("03_x", {"status": "failed", "cpu_s": 3.0}, done, {}, "d")
    with pytest.raises(ValueError, match="no time to state"):
        nt.run_time_line("03_x", {"status": "ok", "cpu_s": 30.0}, {"status": "failed", "error": "KeyError"}, {}, "d")


def test_first_cell_line_is_replaced_and_nothing_else_changes(tmp_path):
    path = tmp_path / NOTEBOOKS[0].name
    path.write_text(NOTEBOOKS[0].read_text())
    before = json.loads(path.read_text())
    assert nt.set_first_cell_line(path, nt.LINE + "about 1 s, first")
    assert nt.set_first_cell_line(path, nt.LINE + "about 2 s, second")
    assert not nt.set_first_cell_line(path, nt.LINE + "about 2 s, second")
    after = json.loads(path.read_text())
    assert after["cells"][1:] == before["cells"][1:] and after["metadata"] == before["metadata"]
    source = "".join(after["cells"][0]["source"])
    assert source.count(nt.LINE) == 1 and source.endswith("\n\n" + nt.LINE + "about 2 s, second")
    long = nt.LINE + "about 3 s, " + "word " * 40 + "`params/00_tour.ci.yaml`."
    nt.set_first_cell_line(path, long)
    source = "".join(json.loads(path.read_text())["cells"][0]["source"])
    last = source.split("\n\n")[-1]
    assert max(map(len, last.splitlines())) <= 118 and " ".join(last.split()) == " ".join(long.split())
    title = [p for p in "".join(before["cells"][0]["source"]).split("\n\n") if not p.startswith(nt.LINE)]
    assert source.startswith("\n\n".join(title).rstrip("\n") + "\n\n")


# ------------------------------------------------------------------------------------ the measuring script
def test_parse_cores():
    assert nt.parse_cores("0") == [0] and nt.parse_cores("2-4,7") == [2, 3, 4, 7]
    for bad, said in (("2-x", "core ids and ranges"), ("5-2", "runs backwards"), ("1,1", "names a core twice")):
        with pytest.raises(ValueError, match=said):
            nt.parse_cores(bad)


def test_plan_passes_only_declared_overrides():
    nb = ROOT / "notebooks" / "03_sepllm_streaming.ipynb"
    params, ignored = nt.plan(nb, "ci", {"device": "cpu", "grid": "tiny"})
    assert params == {**nt.ci_parameters(nb), "num_threads": 1, "device": "cpu"} and ignored == ["grid"]
    params, ignored = nt.plan(nb, "defaults", {})
    assert params == {"num_threads": 1} and ignored == []


def _notebook(path: pathlib.Path, *cells: str) -> pathlib.Path:
    nb = nbformat.v4.new_notebook()
    parameters = nbformat.v4.new_code_cell("num_threads: int = 0  # threads\nseconds: float = 0.1  # work")
    parameters.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# a test notebook"), parameters,
                *(nbformat.v4.new_code_cell(c) for c in cells)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_run_counts_the_kernels_cpu_pins_one_core_and_ends_a_stuck_kernel(tmp_path):
    psutil = pytest.importorskip("psutil")
    busy = _notebook(tmp_path / "98_busy.ipynb",
                     "import os, time\nprint(os.environ['KVLAB_THREADS'], sorted(os.sched_getaffinity(0)), num_threads)",
                     "t0 = time.process_time()\nwhile time.process_time() - t0 < seconds:\n    pass")
    stuck = _notebook(tmp_path / "99_stuck.ipynb", "import os, time\nprint('pid', os.getpid())",
                      "time.sleep(3600)  # never ends")
    cores = sorted(os.sched_getaffinity(0))
    out = tmp_path / "out"
    subprocess.run([sys.executable, "-m", "kvlab", "notebooks", "times", "run", "--set", "defaults",
                    "-p", "seconds", "1.5", "-p", "unknown_name", "1", "--cores", str(cores[-1]), "--timeout", "30",
                    "--out", str(out), "--name", "t", "--keep-notebooks", str(busy), str(stuck)],
                   check=True, capture_output=True, text=True, timeout=300)
    rows = _rows(out / "t.json")
    ok = rows["98_busy.ipynb"]
    assert ok["status"] == "ok" and ok["parameters"] == {"num_threads": 1, "seconds": 1.5}
    assert ok["overrides_not_declared"] == ["unknown_name"]
    assert ok["kernel_cpu_s"] >= 1.5 and ok["cpu_s"] >= ok["kernel_cpu_s"] - 0.2  # the tree holds the kernel
    printed = nbformat.read(out / "t_executed" / "98_busy.ipynb", as_version=4).cells[3].outputs[0]["text"]
    assert printed.split() == ["1", f"[{cores[-1]}]", "1"]  # KVLAB_THREADS, the one core, num_threads
    hung = rows["99_stuck.ipynb"]
    assert hung["status"] == "timeout" and hung["wall_s"] >= 30 and "time.sleep(3600)" in hung["last_cell"]
    stacks = hung["log_tail"].split("--- kernel stacks at the timeout ---")[1]  # where the kernel waited
    assert stacks.lstrip().startswith("Current thread") and "in <module>" in stacks
    text = nbformat.read(out / "t_executed" / "99_stuck.ipynb", as_version=4).cells[3].outputs[0]["text"]
    kernel = int(text.split()[1])
    assert not psutil.pid_exists(kernel) or psutil.Process(kernel).status() == psutil.STATUS_ZOMBIE
    assert "> 30" in (out / "t.md").read_text()


# ------------------------------------------------------------------------------------ defaults that the library accepts
def _run_statements(cell_source: str, names: set[str], namespace: dict) -> dict:
    """Execute only the top-level assignments of ``names`` in a notebook cell (the arithmetic on parameters)."""
    import ast

    tree = ast.parse(cell_source)
    wanted = [s for s in tree.body if isinstance(s, ast.Assign)
              and {t.id for t in s.targets if isinstance(t, ast.Name)} & names]
    exec(compile(ast.Module(wanted, type_ignores=[]), "<cell>", "exec"), namespace)
    return namespace


def test_notebook_09_defaults_pass_reforms_checks():
    """Round 1 of the default runs: 09 stopped in its compression picture, whose budget (budget // 4 = 512) equalled
    n_initial + n_recent (256 + 256). Each REFORM call of 09 at its defaults must pass ``_settings``' checks."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from kvlab.reform import api
    from kvlab.reform.reference import Head

    nb = ROOT / "notebooks" / "09_reform_mechanism.ipynb"
    defaults = nt.declared(nb)
    cells = [c.source for c in nbformat.read(nb, as_version=4).cells if c.cell_type == "code"]
    demo = next(s for s in cells if "small = dict(" in s)
    small = _run_statements(demo, {"demo_budget", "demo_keep", "small"}, dict(defaults))["small"]
    tiny = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                        num_attention_heads=4, num_key_value_heads=2)).eval()
    common = dict(early_exit_layer=None, heads=[Head("v", 1, 0)], pool=129, score_window=128)
    # the compression picture (Section 2) and the comparison at equal budget (Section 7)
    api._settings(tiny, defaults["demo_tokens"], 16, recompute_budget=defaults["budget"], **small, **common)
    keep = defaults["n_keep"]
    api._settings(tiny, defaults["kv_tokens"], 16, chunk_size=defaults["chunk_size"], budget=defaults["budget"],
                  recompute_budget=defaults["budget"], n_initial=keep, n_recent=keep, n_final=keep, **common)


def test_merge_keeps_the_row_that_tells_most(tmp_path):
    def report(name, rows):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"set": "defaults", "date": "2026-11-25 01:00 UTC", "command": name, "jobs": 1,
                                    "overrides": {}, "threads": 1, "machine": {"host": name},
                                    "notebooks": [{"notebook": n, "status": s, "cpu_s": c, "wall_s": c, "limit_s": 900}
                                                  for n, s, c in rows]}))
        return path

    a = report("a", [("01", "ok", 10.0), ("02", "timeout", 400.0), ("03", "timeout", 500.0), ("04", "failed", 1.0)])
    b = report("b", [("01", "ok", 12.0), ("02", "failed", 3.0), ("03", "timeout", 450.0), ("04", "timeout", 90.0)])
    rows = {r["notebook"]: r for r in nt.merge([a, b], tmp_path / "m")["notebooks"]}
    assert (rows["01"]["run"]["file"], rows["01"]["cpu_s"]) == ("b.json", 12.0)  # the later finished run
    assert rows["02"]["run"]["file"] == "a.json"  # a failure does not hide a stopped run
    assert rows["03"]["cpu_s"] == 500.0  # of two stopped runs, the one that got further
    assert rows["04"]["status"] == "timeout"
    assert "`a.json`" in (tmp_path / "m.md").read_text()
