"""The ledger's outcomes (agrees, smaller, does not agree, excluded, floor, not measurable, inconclusive), its strict
coverage rule,
proxies, sensitivity rows, planned n, and block bootstrap for windows of one stream (kvlab.experiments.claims)."""

import json
import math

import numpy as np
import pytest

from kvlab.experiments import claims


# ------------------------------------------------------------------------------------------------ the rule
@pytest.mark.parametrize("low, high, direction, kw, expected", [
    (-0.002, 0.003, "a<b", {"paper_effect": -0.0115}, "excluded"),       # inside +-0.0115: the paper's size ruled out
    (-0.002, 0.003, "a<b", {"paper_effect": 0.0025}, "inconclusive"),    # reaches past +0.0025
    (-0.002, 0.003, "a<b", {}, "inconclusive"),                          # no paper number: nothing to rule out
    (-0.09, 0.08, "a>b", {"paper_effect": 0.40}, "excluded"),
    (-0.09, 0.08, "a>b", {"paper_effect": 0.40, "at_floor": True}, "floor"),
    (0.01, 0.08, "a>b", {"paper_effect": 0.40, "at_floor": True}, "smaller"),  # a difference shown is a difference
    (0.01, 0.45, "a>b", {"paper_effect": 0.40, "at_floor": True}, "agrees"),   # ... and reaches the paper's size
    (-0.09, 0.08, "a>b", {"paper_effect": 0.40, "planned_n": 20}, "inconclusive (topped up from the planned n = 20 "
                                                                    "to 30; not decided by the top-up)"),
    (0.01, 0.08, "a>b", {"planned_n": 40}, "agrees"),                     # stopped short for time: decided as it stands
    (-0.09, 0.08, "a>b", {"paper_effect": 0.40, "unmoved": True}, "not measurable"),  # the instrument did not move
    (-0.09, 0.08, "a>b", {"paper_effect": 0.40, "unmoved": True, "at_floor": True}, "floor"),
    (-0.05, 0.05, "a>b", {"paper_effect": 0.08, "systematic": 0.04}, "inconclusive"),   # widened past the effect
    (0.1, 0.3, "a>b", {"p_binary": 0.2, "paper_effect": 0.5}, "excluded"),  # an exact test that fails, inside +-0.5
])
def test_the_outcomes(low, high, direction, kw, expected):
    assert claims.derive_verdict(low, high, direction, 30, **kw) == expected


def test_excluded_needs_the_whole_interval_inside_and_is_symmetric():
    for sign in (1, -1):
        assert claims.derive_verdict(-0.01, 0.01, "a>b", 30, paper_effect=sign * 0.02) == "excluded"
        assert claims.derive_verdict(-0.02, 0.01, "a>b", 30, paper_effect=sign * 0.02) == "inconclusive"


@pytest.mark.parametrize("effect", [0.0, math.inf, math.nan])
def test_a_paper_effect_must_be_finite_and_non_zero(effect):
    with pytest.raises(ValueError, match="paper_effect"):
        claims.derive_verdict(-0.1, 0.1, "a>b", 30, paper_effect=effect)


# ------------------------------------------------------------------------------------------------ the columns
def _row(**kw):
    return {**dict.fromkeys(claims.FIELDS, ""), "id": "x", "metric": "correct", **kw}


@pytest.mark.parametrize("text, value", [
    ("-0.0115 (ln(8.62/8.72), nats per token)", -0.0115),
    ("0.399 ((84.6 - 44.7) / 100)", 0.399),
    ("n/a: a heat map, no number", None),
    ("", None),
])
def test_paper_effect_column(text, value):
    assert claims.paper_effect(_row(paper_effect=text)) == value


@pytest.mark.parametrize("text", ["-0.0115", "about 2 points", "0 (none)"])
def test_a_paper_effect_without_its_translation_or_zero_is_refused(text):
    with pytest.raises(ValueError, match="paper_effect"):
        claims.paper_effect(_row(paper_effect=text))


def test_a_floor_names_its_reason_and_is_for_scores_only():
    assert claims.stated_floor(_row(floor="0.25 (chance: four options)")) == 0.25
    with pytest.raises(ValueError, match="floor"):
        claims.stated_floor(_row(floor="0.25"))
    with pytest.raises(ValueError, match="higher is better"):
        claims.stated_floor(_row(floor="2.0 (a floor)", metric="answer_nll"))


def _write(tmp_path, recs):
    path = tmp_path / "x.examples.jsonl"
    path.write_text("".join(json.dumps({**r, "config": {"device": "cpu"}}) + "\n" for r in recs))  # records' schema
    return path


def _stat_row(path, **kw):
    return _row(**{"kind": "statistical", "results_file": str(path), "method_a": "A", "method_b": "B",
                   "direction": "a>b", **kw})


def test_floor_when_every_method_is_at_chance(tmp_path, monkeypatch):
    monkeypatch.setattr(claims, "ROOT", tmp_path)
    rng = np.random.default_rng(0)
    a = np.zeros(200, dtype=bool)
    a[rng.permutation(200)[:50]] = True  # 25 % right: chance on four options
    b = a.copy()
    flip = np.concatenate([np.flatnonzero(a)[:5], np.flatnonzero(~a)[:5]])
    b[flip] = ~b[flip]  # the same questions right for both but 10 of 200 (5 each way): 5 % discordant
    recs = [{"example": f"q{i:03d}", "method": m, "metric": "correct", "value": int(v)}
            for i in range(200) for m, v in (("A", a[i]), ("B", b[i]))]
    path = _write(tmp_path, recs)
    row = _stat_row(path.name, floor="0.25 (chance: four options)", paper_effect="0.3 (points)")
    out = claims.recompute(row)
    assert out["verdict"] == "floor", out
    # the same outcomes, well above a floor of 0.05: no floor, and a 30-point effect is ruled out ...
    assert claims.recompute({**row, "floor": "0.05 (a floor)"})["verdict"] == "excluded"
    # ... and a 6-point one too: one rule for every kind of outcome, the interval inside +-0.06 (no second rule on
    # the share of discordant pairs)
    out = claims.recompute({**row, "floor": "", "paper_effect": "0.06 (points)"})
    assert max(abs(float(out["ci_low"])), abs(float(out["ci_high"]))) < 0.06 and out["verdict"] == "excluded"
    # ... but not a 3-point one, which the interval reaches
    assert claims.recompute({**row, "floor": "", "paper_effect": "0.03 (points)"})["verdict"] == "inconclusive"


def test_blocks_count_runs_of_windows_and_must_divide_n(tmp_path, monkeypatch):
    monkeypatch.setattr(claims, "ROOT", tmp_path)
    rng = np.random.default_rng(1)
    drift = np.repeat(rng.normal(0, 0.05, 16), 4)  # 64 windows whose differences drift in runs of 4
    recs = [{"example": f"w{i:03d}", "method": m, "metric": "window_nll", "value": v}
            for i in range(64) for m, v in (("A", 3.0 + drift[i] + 0.01 * rng.normal()), ("B", 3.0))]
    path = _write(tmp_path, recs)
    row = _stat_row(path.name, metric="window_nll", direction="a<b")
    single = claims.recompute(row)
    blocked = claims.recompute({**row, "block": "4"})
    assert single["n"] == "64" and blocked["n"] == "16"
    assert float(blocked["estimate"]) == pytest.approx(float(single["estimate"]))
    width = lambda o: float(o["ci_high"]) - float(o["ci_low"])  # noqa: E731
    assert width(blocked) > 1.5 * width(single)  # dependent windows: the single-window interval is too narrow
    with pytest.raises(ValueError, match="blocks of 5"):
        claims.recompute({**row, "block": "5"})


def test_top_up_is_not_decided_by_the_top_up(tmp_path, monkeypatch):
    monkeypatch.setattr(claims, "ROOT", tmp_path)
    recs = [{"example": f"q{i:03d}", "method": m, "metric": "score", "value": v}
            for i in range(25) for m, v in (("A", 0.9), ("B", 0.1 + 0.01 * (i % 3)))]
    path = _write(tmp_path, recs)
    row = _stat_row(path.name, metric="score")
    assert claims.recompute(row)["verdict"] == "agrees"
    assert claims.recompute({**row, "planned_n": "20"})["verdict"].startswith("inconclusive (topped up")


# ------------------------------------------------------------------------------------------------ the ledger
@pytest.fixture(scope="module")
def rows():
    return claims.load()


def test_strict_rule_reproduces_its_definition():
    base = _row(kind="statistical", role="claim", n="20", ci_low="-1", ci_high="1", verdict="agrees",
                item="Table 5 (x)", plan="before")
    assert claims.strict_row(base)
    assert not claims.strict_row({**base, "n": "19"})
    assert not claims.strict_row({**base, "role": "check"})
    assert not claims.strict_row({**base, "role": "sensitivity"})
    assert not claims.strict_row({**base, "proxy_of": "y"})
    assert not claims.strict_row({**base, "superseded": "a fix"})
    assert not claims.strict_row({**base, "kind": "summary"})
    assert not claims.strict_row({**base, "item": "Tables 5-7 (a range over three)"})
    assert claims.strict_row({**base, "item": "Figs. 8-9 (one experiment, two figures)"})
    assert not claims.decided_strictly(base)                      # n < 30
    assert claims.decided_strictly({**base, "n": "30"})
    assert claims.decided_strictly({**base, "n": "30", "verdict": "excluded"})
    assert claims.decided_strictly({**base, "n": "30", "verdict": "smaller"})
    assert not claims.decided_strictly({**base, "n": "30", "verdict": "floor"})
    assert not claims.decided_strictly({**base, "n": "30", "verdict": "not measurable"})
    # a plan written with or after the data, or none: a finding to re-run, not a decided claim
    for plan in ("with or after", "no plan", "unknown", ""):
        assert not claims.decided_strictly({**base, "n": "30", "plan": plan}), plan
        assert claims.decided_late({**base, "n": "30", "plan": plan}), plan


def test_every_statistical_row_states_the_paper_effect(rows):
    for r in rows:
        if r["kind"] == "statistical":
            assert r["paper_effect"].strip(), f"{r['id']}: column paper_effect is empty"
            claims.paper_effect(r)  # parses


def test_a_paper_effect_points_the_way_the_paper_does(rows):
    for r in rows:
        if r["kind"] == "statistical" and r["role"] == "claim" and claims.paper_effect(r) is not None:
            assert (claims.paper_effect(r) > 0) == (r["direction"] == "a>b"), r["id"]


def test_one_paper_cell_one_claim_row(rows):
    seen = {}
    for r in rows:
        if claims.strict_row(r) or (claims._counted_claim(r) and r["kind"] == "statistical"):
            key = (r["paper"], r["paper_cell"])
            assert key not in seen, f"{r['id']} and {seen[key]} are two claim rows of one paper cell {key[1]!r}"
            seen[key] = r["id"]


def test_no_decided_row_is_an_unmarked_proxy(rows):
    """A claim row's metric is the paper's quantity: answer NLL against an accuracy cell is a proxy."""
    for r in rows:
        if claims._counted_claim(r) and r["kind"] == "statistical" and r["verdict"] in claims.DECIDED:
            assert "n/a: the paper reports" not in r["paper_effect"], f"{r['id']} measures another quantity"


def test_the_inventory_lists_sepllm_fig2_not_the_fig7_diagram():
    assert "Fig. 2" in claims.INVENTORY["SepLLM"] and "Fig. 7" not in claims.INVENTORY["SepLLM"]


def test_notebook_tables_explain_the_five_words_and_hide_superseded_rows(rows):
    text = str(claims.table("dhsa"))
    for word, _ in claims.OUTCOMES:
        assert f"**{word}**" in text
    for r in rows:
        if r["paper"] == "DHSA" and r["superseded"]:
            assert r["claim"] not in text, r["id"]


def test_counts_print_strict_coverage_per_paper(rows):
    text = claims.counts_text(rows)
    assert "coverage" in text and "decided n>=30" in text
    s = claims.summary(rows)
    assert sum(s[p]["tested"] for p in ("SepLLM", "LaCache", "DHSA", "REFORM", "OrthoRank")) == s["all"]["tested"]


def test_the_n_column_shows_blocks_and_the_plan():
    assert claims._n_cell(_row(n="32", block="2")) == "32 blocks of 2"
    assert claims._n_cell(_row(n="20", planned_n="30")) == "20 of 30 planned"
    assert claims._n_cell(_row(n="20", planned_n="20")) == "20"
    assert claims._n_cell(_row(planned_n="30")) == "30 planned"  # a row not run yet
