"""The claims ledger's rules against bad input: each case below once gave a silent wrong verdict, lost a field or
raised an error that named neither the file, the line, the row nor the column (kvlab.experiments.claims, kvlab.eval.stats).

Synthetic rows point at per-example files written under ``tmp_path`` (an absolute path in ``results_file``)."""

import json
import math
import signal

import numpy as np
import pytest

from kvlab.experiments import claims
from kvlab.eval import paired_bootstrap, proportion_interval


CPU = {"device": "cpu"}


def _row(**kw) -> dict:
    r = {k: "" for k in claims.FIELDS}
    r.update({"id": "t-row", "paper": "LaCache", "item": "Table 5 (test)", "claim": "A vs B", "kind": "statistical",
              "paper_value": "A ahead", "model": "m", "differs": "none", "where": "here", "command": "none",
              "metric": "score", "method_a": "A", "method_b": "B", "direction": "a>b", "role": "claim",
              "paper_cell": "60 vs 40 (higher is better; Table 5)"})
    r.update(kw)
    return r


def _write(path, records):
    """Records in the one schema (kvlab.experiments.records): a record without config gets one naming its device."""
    path.write_text("".join(json.dumps({**r, "config": r.get("config", CPU)}) + "\n" for r in records),
                    encoding="utf-8")
    return str(path)


def _pairs(n, a_values, b_values, metric="score"):
    out = []
    for i in range(n):
        out.append({"example": f"e{i}", "method": "A", "metric": metric, "value": a_values[i], "config": CPU})
        out.append({"example": f"e{i}", "method": "B", "metric": metric, "value": b_values[i], "config": CPU})
    return out


@pytest.fixture
def good_file(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.integers(0, 2, 40).tolist()
    return _write(tmp_path / "x.examples.jsonl", _pairs(40, a, [0] * 40))


# ------------------------------------------------------------------------------------- systematic (silent 1)
@pytest.mark.parametrize("value", ["-0.6", "nan", "inf", "-inf"])
def test_systematic_must_be_finite_and_non_negative(good_file, value):
    row = _row(results_file=good_file, systematic=value)
    with pytest.raises(ValueError, match=r"t-row.*systematic.*finite number >= 0"):
        claims.recompute(row)
    with pytest.raises(ValueError, match=r"t-row.*systematic"):
        claims.validate([row])


def test_derive_verdict_refuses_a_negative_systematic():
    with pytest.raises(ValueError, match="systematic must be a finite number >= 0"):
        claims.derive_verdict(-0.1, 0.3, "a>b", 30, systematic=-0.6)


def test_systematic_with_a_decimal_comma_names_row_and_column(good_file):
    with pytest.raises(ValueError, match=r"claim t-row: column systematic .*decimal point.*'0,5'"):
        claims.recompute(_row(results_file=good_file, systematic="0,5"))


# ------------------------------------------------------------------------------- constant method_b (silent 2)
@pytest.mark.parametrize("constant", ["=nan", "=-inf", "=inf"])
def test_a_non_finite_constant_is_refused(good_file, constant):
    with pytest.raises(ValueError, match=r"t-row: column method_b's constant must be finite"):
        claims.recompute(_row(results_file=good_file, method_b=constant))


@pytest.mark.parametrize("constant", ["=1.5", "=-0.25"])
def test_a_constant_outside_0_1_for_a_0_1_metric_is_refused(good_file, constant):
    with pytest.raises(ValueError, match=r"t-row: .*0/1 outcome.*\[0, 1\]"):
        claims.recompute(_row(results_file=good_file, method_b=constant))


def test_a_constant_inside_0_1_still_works(good_file):
    out = claims.recompute(_row(results_file=good_file, method_b="=0.25"))
    assert out["n"] == "40" and math.isfinite(float(out["ci_low"]))


# ----------------------------------------------------------------------------------- duplicates (silent 3)
def test_duplicate_records_in_one_file_raise_and_are_named(tmp_path):
    recs = _pairs(25, [1] * 25, [0] * 25)
    recs.append({"example": "e3", "method": "A", "metric": "score", "value": 0})
    f = _write(tmp_path / "dup.examples.jsonl", recs)
    with pytest.raises(ValueError, match=r"t-row: 1 duplicate records.*'e3' / 'A' at .*dup.examples.jsonl:7 and "
                                         r".*dup.examples.jsonl:51"):
        claims.recompute(_row(results_file=f))


def test_duplicate_records_across_joined_files_raise(tmp_path):
    f1 = _write(tmp_path / "one.examples.jsonl", _pairs(25, [1] * 25, [0] * 25))
    f2 = _write(tmp_path / "two.examples.jsonl", [{"example": "e0", "method": "B", "metric": "score", "value": 1}])
    with pytest.raises(ValueError, match=r"duplicate records.*'e0' / 'B' at .*one.examples.jsonl:2 and "
                                         r".*two.examples.jsonl:1"):
        claims.recompute(_row(results_file=f"{f1};{f2}"))


def test_the_same_example_under_another_metric_is_no_duplicate(tmp_path):
    recs = _pairs(25, [1] * 25, [0] * 25) + _pairs(25, [0.5] * 25, [0.7] * 25, metric="answer_nll")
    out = claims.recompute(_row(results_file=_write(tmp_path / "m.examples.jsonl", recs)))
    assert out["n"] == "25"


# ------------------------------------------------------------------------------ exact rows (silent 4)
@pytest.fixture
def test_tree(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_fake.py").write_text('''
def helper():
    """An example in a docstring:

def test_ghost():
    pass
"""


def test_passes():
    assert 1 + 1 == 2


def test_fails():
    assert 1 + 1 == 3
''', encoding="utf-8")
    return tmp_path


def test_a_test_named_only_inside_a_docstring_is_not_a_test(test_tree):
    row = _row(kind="exact", test="tests/test_fake.py::test_passes;tests/test_fake.py::test_ghost")
    with pytest.raises(ValueError, match=r"t-row: pytest collects no test \['tests/test_fake.py::test_ghost'\]"):
        claims.exact_columns(row, root=test_tree)


def test_an_exact_row_with_a_failing_test_does_not_agree(test_tree):
    row = _row(kind="exact", test="tests/test_fake.py::test_passes;tests/test_fake.py::test_fails")
    assert claims.exact_columns(row, root=test_tree) == {"n": "2", "estimate": "1", "verdict": "does not agree"}
    row = _row(kind="exact", test="tests/test_fake.py::test_passes")
    assert claims.exact_columns(row, root=test_tree) == {"n": "1", "estimate": "1", "verdict": "agrees"}


# ------------------------------------------------------------------------------------ stats (item 9, timing)
def test_paired_bootstrap_refuses_an_overflowing_difference():
    with pytest.raises(ValueError, match=r"a - b .*not finite"):
        paired_bootstrap([1e308, 1e308, 0], [-1e308, -1e308, 0])


def test_exact_proportion_interval_for_a_million_trials_is_fast_and_right():
    def too_slow(*_):
        raise TimeoutError("proportion_interval(10**6, 10**6, method='exact') took more than 30 s")
    old = signal.signal(signal.SIGALRM, too_slow)
    signal.alarm(30)
    try:
        iv = proportion_interval(10**6, 10**6, method="exact")
        iv0 = proportion_interval(0, 10**6, method="exact")
        mid = proportion_interval(500_000, 10**6, method="exact")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert iv.high == 1.0 and iv.low == pytest.approx(0.025 ** (1 / 10**6), rel=1e-9)  # P(all succeed) = 2.5 %
    assert iv0.low == 0.0 and iv0.high == pytest.approx(1 - 0.025 ** (1 / 10**6), rel=1e-6)
    assert mid.low == pytest.approx(0.5 - 1.96 * 0.0005, abs=2e-5) and mid.high == pytest.approx(1 - mid.low)


# ------------------------------------------------------------------------------------------ unclear errors
def test_a_truncated_line_names_the_file_and_its_line(tmp_path):
    f = tmp_path / "cut.examples.jsonl"
    lines = [json.dumps(r) for r in _pairs(25, [1] * 25, [0] * 25)]
    lines[2] = lines[2][:20]
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"cut.examples.jsonl:3: not a JSON record.*truncated"):
        claims.recompute(_row(results_file=str(f)))


def test_a_bad_filter_regex_names_the_row(good_file):
    with pytest.raises(ValueError, match=r"claim t-row: column filter is not a valid regular expression"):
        claims.recompute(_row(results_file=good_file, filter="^ruler-(single"))


@pytest.mark.parametrize("record", [{"example": "e0", "method": "A", "value": 1},
                                    {"example": "e0", "method": "A", "metric": None, "value": 1}])
def test_a_record_without_metric_names_file_and_line(tmp_path, record):
    f = _write(tmp_path / "nometric.examples.jsonl", _pairs(25, [1] * 25, [0] * 25) + [record])
    with pytest.raises(ValueError, match=r"nometric.examples.jsonl:51: record has no 'metric' \(or it is null\)"):
        claims.recompute(_row(results_file=f))


# ------------------------------------------------------------------------------------- data loss 1 (--update)
def test_update_refuses_a_row_with_extra_fields(tmp_path):
    path = tmp_path / "claims.csv"
    claims.save([_row(command="python bench.py --sizes 124")], path)
    text = path.read_text(encoding="utf-8").replace("--sizes 124", "--sizes 1,2,4")  # typed by hand, unquoted
    path.write_text(text, encoding="utf-8")
    n = len(claims.FIELDS)
    expected = rf"line 2 \(id 't-row'\): {n + 2} fields where the header has {n}; the extra .*quoted"
    with pytest.raises(ValueError, match=expected):
        claims.update(path)
    assert path.read_text(encoding="utf-8") == text  # nothing rewritten


def test_load_refuses_a_row_with_missing_fields(tmp_path):
    path = tmp_path / "claims.csv"
    claims.save([_row()], path)
    lines = path.read_text(encoding="utf-8").splitlines()
    path.write_text(lines[0] + "\n" + ",".join(lines[1].split(",")[:5]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 2 .*missing fields"):
        claims.load(path)


# -------------------------------------------------------------------------- the paper's cell and direction
def test_a_direction_that_contradicts_the_paper_cell_fails():
    rows = claims.load()
    claims.validate(rows)
    single = next(r for r in rows if r["id"] == "lacache-t5-ruler-single")
    assert single["direction"] == "a<b"  # the paper has LaCache 43 behind StreamingLLM 49 on single_2
    single["direction"] = "a>b"
    with pytest.raises(ValueError, match=r"lacache-t5-ruler-single\): direction a>b contradicts the paper's cell"):
        claims.validate(rows)


@pytest.mark.parametrize("cell, metric, expected", [
    ("43 vs 49 (higher is better; Table 5)", "string_match_all", "a<b"),
    ("43 vs 49 (higher is better; Table 5)", "answer_nll", "a>b"),      # an NLL proxy flips the direction
    ("8.43 vs 8.88 (lower is better; Table 2)", "window_nll", "a<b"),
    ("8.43 vs 8.88 (lower is better)", "score", "a>b"),
    ("A better, no number (Fig. 8)", "correct", "a>b"),
    ("B better, no number (Fig. 8)", "answer_nll", "a>b"),
    ("A matches B (Fig. 2)", "needle_recall", "a>b"),
])
def test_paper_direction_reads_the_cell(cell, metric, expected):
    assert claims.paper_direction(_row(paper_cell=cell, metric=metric)) == expected


@pytest.mark.parametrize("cell", ["LaCache ahead", "43 > 49", "49 vs 49 (higher is better)"])
def test_a_malformed_paper_cell_names_the_row(cell):
    with pytest.raises(ValueError, match=r"claim t-row: column paper_cell"):
        claims.paper_direction(_row(paper_cell=cell))


def test_every_statistical_claim_has_a_paper_cell_that_gives_its_direction():
    for r in claims.load():
        if r["kind"] == "statistical" and r["role"] == "claim":
            assert claims.paper_direction(r) == r["direction"], r["id"]


# ---------------------------------------------------------------- exact tests on the discordant pairs
def test_a_fractional_row_with_few_discordant_pairs_is_not_decided_by_the_bootstrap(tmp_path):
    # 7 pairs favour A by a lot, 2 favour B a little, 31 tie: the bootstrap interval excludes 0, the sign test
    # on the 9 discordant pairs (p = 0.18) does not
    a = [0.9] * 7 + [0.4] * 2 + [0.5] * 31
    b = [0.1] * 7 + [0.5] * 2 + [0.5] * 31
    f = _write(tmp_path / "frac.examples.jsonl", _pairs(40, a, b))
    out = claims.recompute(_row(results_file=f))
    assert float(out["ci_low"]) > 0
    assert out["verdict"] == "inconclusive (sign test p = 0.18)"


def test_every_decided_fractional_or_binary_row_passes_its_exact_test():
    """A decided row whose outcomes lie in [0, 1] has an exact test (sign test / McNemar) on its discordant pairs
    in the ledger, and that test is below 0.05."""
    checked = 0
    for r in claims.load():
        if r["kind"] != "statistical" or r["verdict"] not in ("agrees", "does not agree"):
            continue
        _, a, b, _ = claims._paired(r)
        bounded = np.all((a >= 0) & (a <= 1)) and np.all((np.asarray(b) >= 0) & (np.asarray(b) <= 1))
        if not bounded or np.isscalar(b):
            continue
        checked += 1
        assert r["p_value"], f"{r['id']}: decided without an exact test on its discordant pairs"
        assert float(r["p_value"]) < 0.05, f"{r['id']}: decided with exact p = {r['p_value']}"
    assert checked >= 5


def test_random_heads_ablation_is_no_longer_decided_by_the_bootstrap_alone():
    row = next(r for r in claims.load() if r["id"] == "reform-r23-t6a-random-heads")
    assert row["superseded"]  # pooled into reform-c-t6a-random-heads: the rule is checked on its own prompts
    assert claims.recompute({**row, "superseded": ""})["verdict"].startswith("inconclusive (sign test p = 0.18")


def test_a_summary_row_replaced_by_per_example_rows_is_superseded_and_not_counted():
    rows = claims.load()
    row = next(r for r in rows if r["id"] == "reform-t2-heads")
    assert row["kind"] == "summary" and row["superseded"] and row["verdict"] == claims.SUPERSEDED
    claims.validate(rows)
    stale = [dict(r) for r in rows]
    next(r for r in stale if r["id"] == "reform-t2-heads")["verdict"] = claims.NO_DATA
    with pytest.raises(ValueError, match="reform-t2-heads.*summary row's verdict is 'superseded'"):
        claims.validate(stale)
    exact = [dict(r) for r in rows]
    target = next(r for r in exact if r["kind"] == "exact")
    target["superseded"] = "some fix"
    with pytest.raises(ValueError, match="only a statistical or summary row is marked superseded"):
        claims.validate(exact)


# ------------------------------------------------------------------ empty generations and teacher-forced metrics
@pytest.mark.parametrize("metric, flagged", [("f1", True), ("answer_nll", False)])
def test_empty_generations_flag_generated_scores_but_not_teacher_forced_ones(tmp_path, metric, flagged):
    """A fifth of the answers empty: a score read from the generation (F1) must not be decided on them; the
    gold answer's NLL is scored whatever the model generated, so its row is decided as usual."""
    rng = np.random.default_rng(1)
    a = (rng.normal(0.0, 0.1, 40) + (0.5 if metric == "f1" else -0.5)).tolist()
    recs = _pairs(40, a, [0.0] * 40, metric=metric)
    for i, r in enumerate(recs):
        r["output"] = "" if i % 5 == 0 else " an answer"
    row = _row(results_file=_write(tmp_path / "g.examples.jsonl", recs), metric=metric,
               direction="a>b" if metric == "f1" else "a<b")
    out = claims.recompute(row)
    assert ("answers ':' or empty" in out["verdict"]) is flagged, out["verdict"]
    if not flagged:
        assert out["verdict"] == "agrees"
