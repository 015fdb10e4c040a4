"""The ledger says what it found (kvlab.experiments.claims): one rule for *excluded*, *smaller* apart from *agrees*,
*not measurable* where the instrument did not move, a claim decided only from a plan committed before its data
(kvlab.experiments.ledger_history), one claim row per paper cell, and the headline row's account of how it was won.

Synthetic rows point at per-example files under ``tmp_path``; the plan rule runs on a small git repository made
there."""

import json
import math
import re
import subprocess

import pytest

from kvlab.experiments import claims, gsm8k_stops, ledger_history


@pytest.fixture(scope="module")
def ledger():
    return {r["id"]: r for r in claims.load()}


def _row(**kw) -> dict:
    r = dict.fromkeys(claims.FIELDS, "")
    r.update({"id": "t-row", "paper": "LaCache", "item": "Table 5 (test)", "claim": "A vs B", "kind": "statistical",
              "paper_value": "A ahead", "model": "m", "differs": "none", "where": "here", "command": "none",
              "metric": "score", "method_a": "A", "method_b": "B", "direction": "a>b", "role": "claim",
              "paper_cell": "60 vs 40 (higher is better; Table 5)", "paper_effect": "0.2 (points as a share)"})
    r.update(kw)
    return r


def _file(tmp_path, a, b, metric="score", name="x.examples.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps({"example": f"e{i:03d}", "method": m, "metric": metric, "value": v,
                                        "config": {"device": "cpu"}}) + "\n"
                            for i in range(len(a)) for m, v in (("A", a[i]), ("B", b[i]))), encoding="utf-8")
    return str(path)


# ------------------------------------------------------------------------------------ one rule for "excluded"
QWEN_EXCLUDED = ("sepllm-qwen1.5b-gsm8k-flexible-vs-matched", "sepllm-qwen1.5b-gsm8k-strict-vs-streaming",
                 "sepllm-qwen1.5b-gsm8k-strict-vs-matched", "sepllm-qwen1.5b-mmlu-vs-streaming",
                 "sepllm-qwen1.5b-mmlu-vs-matched")


@pytest.mark.parametrize("row_id", QWEN_EXCLUDED)
def test_an_interval_inside_the_paper_effect_is_excluded_for_0_1_outcomes_too(ledger, row_id):
    r = ledger[row_id]
    bound = abs(claims.paper_effect(r))
    assert -bound < float(r["ci_low"]) and float(r["ci_high"]) < bound, row_id
    assert r["verdict"] == "excluded", (row_id, r["verdict"])


def test_excluded_has_no_second_rule_on_the_discordant_share(tmp_path):
    # 0/1 outcomes, 200 pairs, 30 discordant (15 each way): the discordant share (15 %, exact upper bound ~21 %) is
    # above a 10-point effect, but the interval of A - B (about +-5.5 points) lies inside +-10: excluded
    a = [1] * 15 + [0] * 15 + [1] * 85 + [0] * 85
    b = [0] * 15 + [1] * 15 + [1] * 85 + [0] * 85
    out = claims.recompute(_row(results_file=_file(tmp_path, a, b, metric="correct"), metric="correct",
                                paper_effect="0.10 (points as a share)"))
    assert max(abs(float(out["ci_low"])), abs(float(out["ci_high"]))) < 0.10
    assert out["verdict"] == "excluded"
    assert "discordant_bound" not in claims.derive_verdict.__code__.co_varnames


# --------------------------------------------------------------------------------------------- "smaller"
def test_smaller_when_the_interval_excludes_zero_and_the_paper_effect(tmp_path):
    a = [0.5 + 0.01 * (i % 5) for i in range(40)]
    b = [0.4] * 40                                 # A - B about +0.12, far from 0 and short of the paper's +0.5
    row = _row(results_file=_file(tmp_path, a, b), paper_effect="0.5 (points as a share)")
    assert claims.recompute(row)["verdict"] == "smaller"
    assert claims.recompute({**row, "paper_effect": "0.11 (points as a share)"})["verdict"] == "agrees"
    assert claims.recompute({**row, "paper_effect": "n/a: a figure"})["verdict"] == "agrees"
    # the paper's side for a lower-is-better metric: A - B below 0 but above the paper's -0.5
    low = _row(results_file=_file(tmp_path, b, a, name="y.examples.jsonl"), direction="a<b",
               paper_cell="40 vs 60 (lower is better; Table 5)", paper_effect="-0.5 (points as a share)")
    assert claims.recompute(low)["verdict"] == "smaller"


@pytest.mark.parametrize("row_id", ["sepllm-t3-flops", "sepllm-t9-mmlu", "sepllm-qwen1.5b-gsm8k-flexible-vs-streaming"])
def test_the_paper_size_ruled_out_reads_smaller(ledger, row_id):
    r = ledger[row_id]
    effect = claims.paper_effect(r)
    assert (float(r["ci_high"]) < effect) if effect > 0 else (float(r["ci_low"]) > effect)
    assert r["verdict"] == "smaller"


def test_every_agrees_row_reaches_the_paper_effect(ledger):
    for r in ledger.values():
        effect = claims.paper_effect(r) if r["kind"] == "statistical" else None
        if r["verdict"] == "agrees" and effect is not None:
            sys_ = float(r["systematic"] or 0)
            reaches = float(r["ci_high"]) + sys_ >= effect if effect > 0 else float(r["ci_low"]) - sys_ <= effect
            assert reaches, r["id"]


# ------------------------------------------------------------------------------------------ "not measurable"
def test_identical_values_on_every_example_are_not_measurable(tmp_path):
    same = [3.5e9 + (i % 3) for i in range(30)]
    row = _row(results_file=_file(tmp_path, same, same, metric="peak_memory_bytes"), direction="a<b",
               metric="peak_memory_bytes",
               paper_cell="16.99 vs 15.18 (lower is better; Table 3)", paper_effect="4.2e8 (bytes)")
    assert claims.recompute(row)["verdict"] == "not measurable"
    moved = list(same)
    moved[0] += 1
    row = {**row, "results_file": _file(tmp_path, same, moved, metric="peak_memory_bytes", name="m.examples.jsonl")}
    assert claims.recompute(row)["verdict"] == "excluded"


def test_the_memory_row_whose_instrument_did_not_move(ledger):
    assert ledger["dhsa-t3-memory-32k"]["verdict"] == "not measurable"
    assert not claims.decided_late(ledger["dhsa-t3-memory-32k"])


def test_counts_keep_smaller_and_not_measurable_apart(ledger):
    s = claims.summary(list(ledger.values()))["all"]
    counted = [r for r in ledger.values() if claims._counted_claim(r)]
    assert s["smaller"] == sum(r["verdict"] == "smaller" for r in counted) > 0
    assert s["not measurable"] == sum(r["verdict"] == "not measurable" for r in counted) > 0
    assert s["agrees"] == sum(r["verdict"] == "agrees" for r in counted)
    text = claims.counts_text(list(ledger.values()))
    assert "smaller" in text.splitlines()[0] and "not measurable" in text.splitlines()[0]
    words = str(claims.outcomes())
    assert "**smaller**" in words and "**not measurable**" in words


# ------------------------------------------------------------------------------------ a plan is a commit
def _git(root, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"})


def _ledger_text(rows):
    import csv
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=claims.FIELDS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def test_a_plan_is_a_commit_before_the_data(tmp_path):
    root = tmp_path / "repo"
    (root / "benchmarks" / "results").mkdir(parents=True)
    _git(root, "init", "-q")
    ledger = root / "benchmarks" / "claims.csv"
    planned = _row(id="planned", planned_n="40", results_file="benchmarks/results/p.examples.jsonl.gz")
    late = _row(id="late", results_file="benchmarks/results/q.examples.jsonl.gz")
    none = _row(id="none", results_file="benchmarks/results/p.examples.jsonl.gz")
    ledger.write_text(_ledger_text([planned, late]), encoding="utf-8")    # 1: the plan, no results
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "plan")
    (root / "benchmarks" / "results" / "p.examples.jsonl.gz").write_bytes(b"data")
    (root / "benchmarks" / "results" / "q.json").write_text("{}")       # 2: the data (q's summary beside it)
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "data")
    late = {**late, "planned_n": "40"}
    (root / "benchmarks" / "results" / "q.examples.jsonl.gz").write_bytes(b"data")
    ledger.write_text(_ledger_text([planned, late, none]), encoding="utf-8")  # 3: late's plan after its data
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "more")
    h = ledger_history.History(root)
    assert ledger_history.plan_order(planned, h) == "before"
    assert ledger_history.plan_order(late, h) == "with or after"      # q.json came before the plan
    assert ledger_history.plan_order(none, h) == "no plan"
    assert ledger_history.plan_order({**planned, "planned_n": "80"}, h) == "unknown"  # a plan not yet committed
    assert ledger_history.plan_order({**planned, "metric": "other"}, h) == "unknown"  # the comparison is the plan too
    _git(root, "mv", "benchmarks/results/p.examples.jsonl.gz", "benchmarks/results/moved.examples.jsonl.gz")
    _git(root, "commit", "-q", "-m", "move")
    moved = {**planned, "results_file": "benchmarks/results/moved.examples.jsonl.gz"}
    assert ledger_history.History(root).data_commit(moved) == h.data_commit(planned)  # followed through the rename


def test_no_history_is_said_never_taken_for_a_plan(tmp_path):
    with pytest.raises(RuntimeError, match="no git history"):
        ledger_history.History(tmp_path)


def test_the_ledger_plan_column_is_what_git_history_gives(ledger):
    orders = claims.plan_orders(list(ledger.values()))
    if not orders:
        pytest.skip("no usable git history in this checkout (a shallow clone)")
    wrong = [f"{i}: {ledger[i]['plan']!r}, history {o!r}" for i, o in orders.items()
             if o != "unknown" and ledger[i]["plan"] != o]
    assert not wrong, "run python -m kvlab claims --update:\n" + "\n".join(wrong)
    for row_id in ("reform-c-t6a-worst-heads", "reform-c-t5-bm25", "reform-c-t4-code", "orthorank-f7-rise-gemma3"):
        assert ledger[row_id]["plan"] == "with or after" and not claims.decided_strictly(ledger[row_id]), row_id
    # re-planned in the ledger before their re-runs on fresh data (their first runs' plans came with the data)
    for row_id in ("lacache-fig3-ladder-vs-best-random", "sepllm-t10-iteration-ms-rerun", "dhsa-t2-latency-8k-rerun"):
        assert ledger[row_id]["plan"] in ("", "before"), row_id


def test_a_decided_item_needs_a_plan_before_its_data():
    rows = [_row(id="r1", n="40", ci_low="0.1", ci_high="0.3", verdict="agrees", plan="before"),
            _row(id="r2", item="Table 4 (x)", n="40", ci_low="0.1", ci_high="0.3", verdict="agrees",
                 plan="with or after", paper_cell="61 vs 40 (higher is better; Table 4)")]
    s = claims.summary(rows)["LaCache"]
    assert (s["tested"], s["decided n>=30"], s["plan late"]) == (2, 1, 1)
    with pytest.raises(ValueError, match="plan is one of"):
        claims.validate([_row(plan="soon")])


# ------------------------------------------------------------------------------------ one cell, one claim
def test_two_claim_rows_of_one_paper_cell_are_refused():
    one = _row(id="smollm", item="Table 1 (vs SLEB, 10%)", paper="OrthoRank", metric="nll", direction="a<b",
               paper_cell="11.27 vs 12.47 (lower is better; Table 1, Llama3-8B)", results_file="",
               paper_effect="-0.1 (nats)")
    two = {**one, "id": "gemma", "item": "Table 1 (vs SLEB, 10%, Gemma3)",
           "paper_cell": "11.27 vs 12.47 (lower is better; Table 1, Llama3-8B C4 ppl)"}
    problems = claims._one_claim_per_cell([one, two])
    assert len(problems) == 1 and "gemma and smollm are two claim rows of one paper cell" in problems[0]
    assert claims._one_claim_per_cell([one, {**two, "role": "sensitivity"}]) == []
    assert claims._one_claim_per_cell([one, {**two, "paper_cell": "14.95 vs 16.49 (lower is better; Table 1)"}]) == []


def test_the_ledger_has_one_claim_row_per_paper_cell(ledger):
    assert claims._one_claim_per_cell(list(ledger.values())) == []
    for row_id in ("sepllm-gsm8k-vs-streaming", "sepllm-mmlu", "orthorank-t1-gemma-sleb-10",
                   "orthorank-t1-gemma-sleb-20"):
        assert ledger[row_id]["role"] == "sensitivity", row_id


# ------------------------------------------------------------------------------------ the headline row
def test_the_headline_row_says_how_it_was_won(ledger):
    r = ledger["sepllm-qwen1.5b-gsm8k-flexible-vs-streaming"]
    text = gsm8k_stops.how_won_text(str(claims.ROOT / r["results_file"]), r["method_a"], r["method_b"],
                                    also=("Vanilla",))
    assert text in r["note"]                                      # the counts are the records', not typed
    strict = ledger["sepllm-qwen1.5b-gsm8k-strict-vs-streaming"]
    assert f"{100 * float(strict['estimate']):+.2f} [{100 * float(strict['ci_low']):+.2f}, " in r["note"]
    assert "lm-eval" in r["note"] and "max_new_tokens" in r["note"]


def test_how_won_counts_run_ons(tmp_path):
    recs = []
    for i, (fa, fb, sb, stop_b) in enumerate([(1, 0, 1, "max_new_tokens"), (1, 0, 0, "Q:"), (0, 0, 0, "Q:"),
                                              (1, 1, 1, "<|endoftext|>")]):
        for m, flex, strict, stop in (("A", fa, fa, "<|endoftext|>"), ("B", fb, sb, stop_b)):
            recs.append({"example": f"p{i}", "method": m, "metric": "flexible_match", "value": flex, "stop": stop,
                         "config": {"device": "cpu"}})
            recs.append({"example": f"p{i}", "method": m, "metric": "strict_match", "value": strict,
                         "config": {"device": "cpu"}})
    path = tmp_path / "g.examples.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    w = gsm8k_stops.how_won(str(path), "A", "B")
    assert (w["problems"], w["wins"], w["run_on_wins"]) == (4, 2, 1)
    assert w["max_new_tokens"] == {"A": 0, "B": 1}


# ------------------------------------------------------------------------------------ the smaller fixes
def test_streaming_windows_are_blocked_and_the_floor_rows_state_their_floor(ledger):
    assert claims.block_size(ledger["sepllm-t7-ppl"]) == 2
    assert ledger["sepllm-t7-ppl"]["verdict"] == "inconclusive (n < 20)"  # 10 blocks of 2 windows
    small = [r for r in ledger.values() if r["id"].startswith("sepllm-qwen0.5b-") and r["role"] == "sensitivity"]
    assert len(small) == 11 and all(claims.stated_floor(r) in (0.20, 0.35) for r in small)


def test_reform_table_6b_is_its_own_item(ledger):
    assert claims.items_of("Table 6b (256K time and memory)", "REFORM") == ["Table 6b"]
    assert claims.items_of("Table 6b (256K time and memory)") == ["Table 6"]
    assert "Table 6b" in claims.untested_items(list(ledger.values()))["REFORM"]


# ------------------------------------------------------------------------------------ bad input at every door
def test_the_same_method_twice_is_refused_at_every_entry(tmp_path):
    row = _row(results_file=_file(tmp_path, [1] * 25, [0] * 25), method_b="A")
    with pytest.raises(ValueError, match="method_a and method_b are both 'A'"):
        claims.recompute(row)
    with pytest.raises(ValueError, match="method_a and method_b are both 'A'"):
        claims.validate([row])
    path = tmp_path / "claims.csv"
    claims.save([row], path)
    with pytest.raises(ValueError, match="method_a and method_b are both 'A'"):
        claims.update(path, run_exact=False)


@pytest.mark.parametrize("column, value", [("ci_low", "Infinity"), ("estimate", "-inf"), ("p_value", "NaN"),
                                           ("paper_effect", "Infinity (points)"), ("floor", "inf (chance)")])
def test_a_non_finite_number_in_the_ledger_names_file_line_and_column(tmp_path, column, value):
    path = tmp_path / "claims.csv"
    claims.save([_row(id="first"), _row(id="second", **{column: value})], path)
    with pytest.raises(ValueError, match=rf"claims.csv, line 3 \(id 'second'\): column {column} holds "
                                         rf"'{re.escape(value)}', not a finite number"):
        claims.load(path)
    assert not math.isfinite(float(value.split()[0]))
