"""kvlab.experiments.leaderboard: the tiny grid on a local Dask cluster of two workers, matched budgets, n/a cells, reruns."""
from __future__ import annotations

import csv
import json

import pytest

from kvlab.experiments import leaderboard as lb
from kvlab.experiments.sweep import task_key

TASKS = ("ppl", "passkey")  # two of the four tasks keep the run short; every method runs on both


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    out = tmp_path_factory.mktemp("leaderboard")
    first, rows = lb.run_leaderboard("tiny", out, workers=2, tasks=TASKS, progress=False)
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "cells").glob("*.json")}
    again, rows_again = lb.run_leaderboard("tiny", out, workers=2, tasks=TASKS, progress=False)
    return out, first, rows, again, rows_again, stamps


def test_every_cell_finishes_ok_or_says_why_not(board):
    out, first, rows, *_ = board
    assert not first.failed, first.summary()
    cells = lb.cell_tasks("tiny", tasks=TASKS)
    assert len(rows) == len(cells) == len(first.done)
    by = {(r["method"], r["task"], r["level"]): r for r in rows}
    for method in lb.METHODS:
        for task in TASKS:
            assert (method, task, 0) in by, f"no cell for {method} on {task}"
    for r in rows:
        assert r["status"] == "ok" or (r["status"].startswith("n/a: ") and len(r["status"]) > 20), r
        if r["status"] == "ok":
            metric = lb.MAIN_METRIC[r["task"]][0]
            assert r[metric] is not None and r[metric] == r[metric], r  # a number, not NaN
    assert by[("REFORM", "ppl", 0)]["status"].startswith("n/a: REFORM answers a question")
    assert by[("REFORM", "passkey", 0)]["status"] == "ok"
    for press in lb.PRESSES:
        status = by[(f"kvpress:{press}", "ppl", 0)]["status"]
        assert status.startswith("n/a: ") and "streaming" in status
    assert "n/a" in (out / "leaderboard.md").read_text()


def test_cache_methods_hold_the_budget_and_flop_methods_keep_their_share(board):
    _, _, rows, *_ = board
    checked = set()
    for r in rows:
        if r["status"] != "ok" or r["method"] == "Full":
            continue
        if r["kind"] == "kv":
            assert abs(r["mean_kv"] - r["kv_budget"]) <= lb.KV_TOLERANCE * r["kv_budget"], r
        else:
            assert abs(r["flop_fraction"] - r["flop_budget"]) <= 0.05, r
        checked.add(r["method"])
    assert checked >= {"StreamingLLM", "H2O", "TOVA", "SepLLM", "LaCache", "REFORM", "DHSA", "OrthoRank"}
    full = [r for r in rows if r["method"] == "Full" and r["task"] == "ppl"][0]
    assert full["mean_kv"] > max(lb.GRIDS["tiny"]["kv_budgets"])  # the budgets really evict


def test_records_carry_method_model_checksum_seed_and_version(board):
    out, _, rows, *_ = board
    sha = lb.model_checksum("smollm2-135m")
    assert len(sha) == 64
    rec = json.loads(next((out / "cells").glob("*-ppl-StreamingLLM-b1.json")).read_text())
    assert rec["params"]["model_sha256"] == sha and rec["params"]["seed"] == 0
    assert rec["result"]["kvlab"] == __import__("kvlab").__version__
    assert rec["result"]["method_params"]["cap"] >= 56  # a cap at least the mean KV it gives (level 1: 56)
    with open(out / "leaderboard.csv") as f:
        table = list(csv.DictReader(f))
    needed = {"method", "method_params", "model", "model_sha256", "seed", "kvlab", "mean_kv", "flop_fraction"}
    assert needed <= set(table[0])
    assert (out / "pareto.png").stat().st_size > 10_000
    # the key changes with the seed and with the model file
    task = lb.cell_tasks("tiny", tasks=("ppl",))[0]
    other = type(task)(task.name, task.target, {**task.params, "seed": 1})
    assert task_key(other) != task_key(task)


def test_rerun_skips_every_finished_cell(board):
    out, first, rows, again, rows_again, stamps = board
    assert not again.done and not again.failed
    assert sorted(again.skipped) == sorted(first.done)
    assert {p.name: p.stat().st_mtime_ns for p in (out / "cells").glob("*.json")} == stamps
    assert rows_again == rows


@pytest.mark.parametrize("kv, flops, rule", [
    ([8], [0.5], r"ints in \[16, tokens // 2\)"),
    ([100], [0.5], r"ints in \[16, tokens // 2\) = \[16, 80\)"),
    ([40], [1.5], r"kept fractions in \(0, 1\)"),
    ([40, 56], [0.5], "equal length"),
])
def test_bad_budgets_raise_naming_the_constraint(kv, flops, rule):
    with pytest.raises(ValueError, match=rule):
        lb.check_budgets(kv, flops, 160)
    with pytest.raises(ValueError, match=rule):
        lb.cell_tasks({**lb.GRIDS["tiny"], "kv_budgets": kv, "flop_budgets": flops})


def test_unreachable_mean_kv_raises():
    import torch

    from kvlab.models import load_tokenizer

    ids = torch.arange(100, 164)[None]
    with pytest.raises(ValueError, match="a full cache holds"):
        lb.match_cache("StreamingLLM", 50, ids, 16, 2, load_tokenizer())
    cap, _, mean = lb.match_cache("StreamingLLM", 20, ids, 16, 2, load_tokenizer())
    assert abs(mean - 20) <= lb.KV_TOLERANCE * 20 and cap > 20  # the cap sits above the mean: the cache fills up
    with pytest.raises(ValueError, match="no cap gives mean KV within 5% of 16"):  # LaCache's ladder needs >= 41
        lb.match_cache("LaCache", 16, ids, 16, 30, load_tokenizer())


def test_sepllm_separators_above_every_id_of_the_text_are_in_the_vocabulary():
    """A separator may have a larger id than every token of the text (Gemma3: 255,968 against WikiText's
    236,832): the cap search checks the separators against the tokenizer's vocabulary, not the text's largest id."""
    import torch

    from kvlab.models import load_tokenizer
    from kvlab.sepllm import separator_ids

    tok = load_tokenizer()
    ids = torch.arange(0, 200)[None] % 7  # ids 0-6: below every separator id
    assert min(separator_ids(tok)) > int(ids.max())
    cap, _, mean = lb.match_cache("SepLLM", 40, ids, 16, 2, tok)
    assert abs(mean - 40) <= lb.KV_TOLERANCE * 40 and cap >= 40


def test_a_full_cache_that_cannot_run_raises_its_own_error(monkeypatch):
    """The cap search reads a ValueError of a small cap as "below every budget"; the full cache's own error is
    the method's and is raised as it is (it used to read "a full cache holds -inf entries")."""
    import torch

    from kvlab.models import load_tokenizer

    def refuse(*args, **kwargs):
        raise ValueError("separator id 255968 is outside the model's vocabulary")

    monkeypatch.setattr(lb, "held_trace", refuse)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        lb.match_cache("SepLLM", 40, torch.arange(0, 200)[None], 16, 2, load_tokenizer())


def test_a_kvpress_cell_run_in_the_peer_environment_replaces_its_na_twin(tmp_path):
    """Cells of kvpress presses made where kvpress is missing are named apart and give way to the same cell run
    in .venv-peers (records written by kvlab.experiments.sweep's own writer, as that environment does)."""
    import kvlab
    from kvlab.experiments.sweep import Task, _write_atomic

    cells = lb.cell_tasks("tiny", methods=("kvpress:KnormPress",), tasks=("passkey",))
    (tmp_path / "cells").mkdir()
    here = {"status": "n/a: kvpress is not importable here", "kvlab": kvlab.__version__}
    for t in cells:
        assert t.params["kvpress"] == lb._kvpress_version()
        peer = {"status": "ok", "kvlab": kvlab.__version__, "accuracy": 1.0, "answer_nll": 0.5,
                "mean_kv": float(t.params["kv_budget"])}
        for task, result in [(t, here), (Task(t.name + "-peer", t.target, {**t.params, "kvpress": "0.5.5"}), peer)]:
            _write_atomic(tmp_path / "cells" / f"{task.name}.json",
                          dict(name=task.name, key=task_key(task), target=task.target, params=task.params,
                               wall_seconds=1.0, result=result))
    rows = lb.collect(tmp_path, cells)
    assert len(rows) == len(cells) and all(r["status"] == "ok" for r in rows)
    assert len(lb.collect(tmp_path)) == 2 * len(cells)  # without a grid: every record


def test_a_kvpress_na_cell_from_the_peer_environment_is_kept(tmp_path):
    """A press on the streaming-loss task is n/a in both environments; the peer environment's record is the one
    shown (its reason names the method, not a missing package), once per cell."""
    import kvlab
    from kvlab.experiments.sweep import Task, _write_atomic

    cells = lb.cell_tasks("tiny", methods=("kvpress:KnormPress",), tasks=("ppl",))
    (tmp_path / "cells").mkdir()
    for t in cells:
        here = {"status": "n/a: kvpress is not importable here", "kvlab": kvlab.__version__}
        peer = {"status": "n/a: kvpress compresses once after a prefill", "kvlab": kvlab.__version__}
        for task, result in [(t, here), (Task(t.name + "-peer", t.target, {**t.params, "kvpress": "0.5.5"}), peer)]:
            _write_atomic(tmp_path / "cells" / f"{task.name}.json",
                          dict(name=task.name, key=task_key(task), target=task.target, params=task.params,
                               wall_seconds=1.0, result=result))
    rows = lb.collect(tmp_path, cells)
    assert len(rows) == len(cells) and all("compresses once" in r["status"] for r in rows)


def test_one_list_of_cache_methods_holds_every_method_the_cells_hold_to_a_kv_budget():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(lb))
    defined = [t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) for t in node.targets
               if isinstance(t, ast.Name) and t.id == "CACHE_METHODS"]
    assert defined == ["CACHE_METHODS"]  # one definition
    assert "REFORM" in lb.CACHE_METHODS and all(f"kvpress:{p}" in lb.CACHE_METHODS for p in lb.PRESSES)
    assert lb.METHODS == ("Full",) + lb.CACHE_METHODS + lb.FLOP_METHODS
    ctx = lb._CellContext(None, None, "smollm2-135m", 64, 0.5, 16, 4)
    for method in lb.CACHE_METHODS:  # what the cells run: none of them is a FLOP runner
        assert not isinstance(lb._runner(method, ctx), lb._FlopRunner), method
    assert set(lb.cache_policies()) == set(lb.MATCHED_POLICIES) < set(lb.CACHE_METHODS)
    with pytest.raises(ValueError, match="its own rule"):
        lb.match_cache("REFORM", 64, None, 16, 30, None)


def test_a_users_leaderboard_md_is_left_untouched_and_the_command_names_the_fix(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    mine = out / "leaderboard.md"
    mine.write_text("my own leaderboard notes\n")
    with pytest.raises(lb.OutputRefused if hasattr(lb, "OutputRefused") else ValueError,
                       match="leaderboard.md was not written by kvlab"):
        lb.run_leaderboard("tiny", out, tasks=["ppl"], methods=["Full"], run=False, progress=False)
    assert lb.main(["--tasks", "ppl", "--methods", "Full", "--report-only", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "leaderboard.md was not written by kvlab" in err and "give another output folder" in err
    assert mine.read_text() == "my own leaderboard notes\n"
    assert sorted(p.name for p in out.iterdir()) == ["leaderboard.md"]
