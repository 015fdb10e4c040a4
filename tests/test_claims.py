"""The claims ledger (benchmarks/claims.csv) and the statistics behind its verdicts (kvlab.eval.stats).

Properties are checked on seeded random inputs over small grids (the hypothesis-drawn properties of the policies,
mechanisms and record format are in tests/test_properties.py; see docs/guide/sweeps-and-tools.md)."""

import math
import shutil
import subprocess
import sys

import numpy as np
import pytest

from kvlab.experiments import claims, ledger_cli
from kvlab.eval import mcnemar_exact, paired_bootstrap, proportion_interval, sign_test

ROOT = claims.ROOT


# ------------------------------------------------------------------------------------------------ statistics
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("n", [5, 40, 300])
def test_interval_contains_the_estimate_and_is_the_mean_difference(seed, n):
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=n), rng.normal(0.3, 2.0, size=n)
    iv = paired_bootstrap(a, b, resamples=2000, seed=seed)
    assert iv.low <= iv.estimate <= iv.high
    assert iv.estimate == pytest.approx(float(np.mean(a - b)), abs=1e-12)
    assert iv.n == n


def test_interval_shrinks_with_n():
    rng = np.random.default_rng(1)
    widths = []
    for n in (25, 100, 400, 1600):
        d = rng.normal(0.1, 1.0, size=n)
        iv = paired_bootstrap(d, np.zeros(n), resamples=4000)
        widths.append(iv.high - iv.low)
    assert all(w2 < w1 for w1, w2 in zip(widths, widths[1:]))
    assert widths[-1] / widths[0] == pytest.approx(math.sqrt(25 / 1600), rel=0.3)  # ~ 1/sqrt(n)


@pytest.mark.parametrize("c", [0.0, 0.25, -3.0])
def test_a_constant_difference_gives_a_degenerate_interval(c):
    a = np.linspace(0, 1, 37)
    iv = paired_bootstrap(a + c, a)
    assert iv.low == iv.estimate == iv.high == pytest.approx(c)
    assert not iv.excludes(c)


@pytest.mark.parametrize("seed", range(4))
def test_swapping_the_methods_mirrors_the_interval(seed):
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, 2, 60).astype(float), rng.integers(0, 2, 60).astype(float)
    ab, ba = paired_bootstrap(a, b, seed=seed), paired_bootstrap(b, a, seed=seed)
    assert (ba.estimate, ba.low, ba.high) == pytest.approx((-ab.estimate, -ab.high, -ab.low), abs=1e-12)
    assert sign_test(a, b).p == sign_test(b, a).p


def test_bootstrap_matches_the_normal_approximation_for_large_n():
    rng = np.random.default_rng(7)
    n = 5000
    d = rng.exponential(1.0, size=n) - 1.0  # skewed, but the mean of 5000 is near normal
    iv = paired_bootstrap(d, np.zeros(n))
    se = d.std(ddof=1) / math.sqrt(n)
    assert iv.low == pytest.approx(d.mean() - 1.96 * se, abs=0.1 * se)
    assert iv.high == pytest.approx(d.mean() + 1.96 * se, abs=0.1 * se)


def test_bootstrap_is_deterministic_for_a_seed():
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=50), rng.normal(size=50)
    assert paired_bootstrap(a, b, seed=5) == paired_bootstrap(a, b, seed=5)


def test_proportion_intervals_known_values():
    # Wilson 3/20: 0.0524-0.3604; Clopper-Pearson 3/20: 0.0321-0.3789 (standard tables)
    w = proportion_interval(3, 20)
    assert (w.low, w.high) == pytest.approx((0.05237, 0.36040), abs=1e-4)
    e = proportion_interval(3, 20, method="exact")
    assert (e.low, e.high) == pytest.approx((0.03207, 0.37893), abs=1e-4)
    assert proportion_interval(0, 10, method="exact").low == 0.0
    assert proportion_interval(10, 10, method="exact").high == 1.0
    # the exact interval is at least as wide as Wilson's
    for k in range(0, 31, 5):
        w, e = proportion_interval(k, 30), proportion_interval(k, 30, method="exact")
        assert e.low <= w.low + 1e-12 and e.high >= w.high - 1e-12


def test_proportion_interval_matches_the_normal_approximation_for_large_n():
    n, k = 100_000, 30_000
    p = k / n
    half = 1.959964 * math.sqrt(p * (1 - p) / n)
    for method in ("wilson", "exact"):
        iv = proportion_interval(k, n, method=method)
        assert (iv.low, iv.high) == pytest.approx((p - half, p + half), abs=0.02 * half)


def test_sign_and_mcnemar_tests_known_values():
    t = sign_test([1, 1, 1, 1, 0], [0, 0, 0, 0, 0])
    assert (t.wins, t.losses, t.ties, t.p) == (4, 0, 1, 0.125)  # 2 * (1/2)^4
    t = mcnemar_exact([1] * 10 + [0] * 2 + [1] * 5, [0] * 10 + [1] * 2 + [1] * 5)
    assert t.p == pytest.approx(2 * sum(math.comb(12, i) for i in range(3)) / 2 ** 12)
    assert sign_test([1, 2], [1, 2]).p == 1.0
    with pytest.raises(ValueError, match="0/1"):
        mcnemar_exact([0.5], [1])


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="pair up"):
        paired_bootstrap([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="finite"):
        paired_bootstrap([1, float("nan")], [1, 2])
    with pytest.raises(ValueError, match="confidence"):
        paired_bootstrap([1, 2], [1, 2], confidence=95)
    with pytest.raises(ValueError, match="successes"):
        proportion_interval(5, 3)
    with pytest.raises(ValueError, match="method"):
        proportion_interval(1, 3, method="normal")


# ------------------------------------------------------------------------------------------------ the rule
@pytest.mark.parametrize("low, high, direction, n, kw, expected", [
    (0.1, 0.3, "a>b", 30, {}, "agrees"),
    (0.1, 0.3, "a<b", 30, {}, "does not agree"),
    (-0.3, -0.1, "a<b", 30, {}, "agrees"),
    (-0.1, 0.3, "a>b", 30, {}, "inconclusive"),
    (0.0, 0.3, "a>b", 30, {}, "inconclusive"),                      # touching 0 is not excluding it
    (0.1, 0.3, "a>b", 19, {}, "inconclusive (n < 20)"),
    (0.1, 0.3, "a>b", 30, {"p_binary": 0.2}, "inconclusive (McNemar p = 0.2)"),
    (0.1, 0.3, "a>b", 30, {"suspect": 3}, "inconclusive (3 answers ':' or empty)"),
    (0.1, 0.3, "a>b", 30, {"systematic": 0.2}, "inconclusive"),
])
def test_derive_verdict(low, high, direction, n, kw, expected):
    assert claims.derive_verdict(low, high, direction, n, **kw) == expected


# ------------------------------------------------------------------------------------------------ the ledger
@pytest.fixture(scope="module")
def rows():
    rows = claims.load()
    claims.validate(rows)
    return rows


def test_ledger_covers_every_paper_and_kind(rows):
    assert {r["paper"] for r in rows} >= {"SepLLM", "LaCache", "DHSA", "REFORM", "OrthoRank"}
    assert {r["kind"] for r in rows} >= {"statistical", "exact", "summary", "not run", "not testable"}


def test_every_statistical_row_recomputes_from_its_examples_file(rows):
    """The verdict rule over the whole ledger: the stored numbers and verdict are what the file gives."""
    mismatches = []
    for r in rows:
        if r["kind"] != "statistical":
            continue
        new = claims.recompute(r)
        for k in ("n", "our_value", "verdict", "p_value"):
            if new[k] != r[k]:
                mismatches.append(f"{r['id']}.{k}: ledger {r[k]!r}, recomputed {new[k]!r}")
        for k in ("estimate", "ci_low", "ci_high"):
            if not math.isclose(float(new[k]), float(r[k]), rel_tol=1e-6, abs_tol=1e-9):
                mismatches.append(f"{r['id']}.{k}: ledger {r[k]}, recomputed {new[k]}")
    assert not mismatches, "run python -m kvlab claims --update:\n" + "\n".join(mismatches)


def test_no_decided_verdict_rests_on_an_interval_that_includes_zero(rows):
    for r in rows:
        if r["verdict"] in ("agrees", "does not agree") and r["kind"] != "exact":
            assert r["kind"] == "statistical", f"{r['id']}: only statistical or exact rows decide"
            sys_ = float(r["systematic"] or 0)
            low, high = float(r["ci_low"]) - sys_, float(r["ci_high"]) + sys_
            assert not (low <= 0 <= high), f"{r['id']}: {r['verdict']} with interval [{low}, {high}]"
            assert int(r["n"]) >= claims.MIN_N, f"{r['id']}: {r['verdict']} with n = {r['n']}"
            side = low > 0
            assert (side == (r["direction"] == "a>b")) == (r["verdict"] == "agrees"), r["id"]


def _copy_ledger(tmp_path, rows, edit):
    rows = [dict(r) for r in rows]
    edit(rows)
    path = tmp_path / "claims.csv"
    claims.save(rows, path)
    return claims.load(path)


def test_validate_fails_on_a_missing_results_file(tmp_path, rows):
    def edit(rs):
        next(r for r in rs if r["kind"] == "statistical")["results_file"] = "benchmarks/results/nope.examples.jsonl"
    with pytest.raises(ValueError, match="nope.examples.jsonl does not exist"):
        claims.validate(_copy_ledger(tmp_path, rows, edit))


def test_validate_fails_on_an_exact_row_whose_test_does_not_exist(tmp_path, rows):
    def edit(rs):
        next(r for r in rs if r["kind"] == "exact")["test"] = "tests/test_lacache.py::test_that_was_never_written"
    row = next(r for r in _copy_ledger(tmp_path, rows, edit) if r["kind"] == "exact")
    with pytest.raises(ValueError, match="collects no test.*test_that_was_never_written"):
        claims.exact_columns(row)


def test_a_typed_verdict_that_the_data_does_not_give_is_caught(rows):
    r = dict(next(r for r in rows if r["kind"] == "statistical" and r["verdict"] == "inconclusive"))
    r["verdict"] = "agrees"
    assert claims.recompute(r)["verdict"] != r["verdict"]


def test_every_exact_row_records_what_pytest_gives(rows):
    """An exact row's n, passed count and verdict are what running its named tests with pytest gives."""
    for r in rows:
        if r["kind"] == "exact":
            got = claims.exact_columns(r)
            assert {k: r[k] for k in got} == got, f"{r['id']}: run python -m kvlab claims --update"


def test_readme_block_is_generated_from_the_ledger(rows):
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    _, block, _ = claims._split_readme(text)
    assert block == claims.readme_block(rows), "run python -m kvlab claims --write-readme"


def test_results_page_is_generated_from_the_ledger(rows):
    page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert page == claims.results_page(rows), "run python -m kvlab claims --write-readme"
    assert "generated by `python -m kvlab claims --write-readme`" in page.splitlines()[2]
    counts, every = page.split("## Every row")
    assert claims.counts_text(rows, fmt="markdown") in counts
    table = [line for line in every.splitlines() if line.startswith("| ") and not line.startswith("| paper |")]
    assert len(table) == len(rows)  # every row of the ledger, in order, each proxy just after its score row
    ordered = claims._beside(rows)
    assert sorted(r["id"] for r in ordered) == sorted(r["id"] for r in rows)
    assert all(line.startswith(f"| {r['paper']} | {claims._md_cell(r['item'])} |") for line, r in zip(table, ordered))
    for i, r in enumerate(ordered):
        if r["proxy_of"]:
            assert ordered[i - 1]["id"] == r["proxy_of"] or ordered[i - 1]["proxy_of"] == r["proxy_of"], r["id"]


def test_readme_shows_a_few_columns_of_the_full_counts(rows):
    """The README's table has the few columns of README_COLUMNS, each equal to the full table's."""
    def cells(text):
        lines = [ln for ln in text.splitlines() if ln.startswith("| ")]
        names = [c.strip() for c in lines[0].strip("|").split("|")]
        return names, {ln.strip("|").split("|")[0].strip(" *"): dict(zip(names, (c.strip(" *") for c in
                                                                            ln.strip("|").split("|"))))
                       for ln in lines[1:]}
    names, small = cells(claims.readme_block(rows))
    _, full = cells(claims.counts_text(rows, fmt="markdown"))
    assert names == ["paper", *claims.README_COLUMNS] and len(names) <= 11
    assert small == {p: {k: v for k, v in row.items() if k in names} for p, row in full.items()}


def test_readme_counts_add_up_to_the_ledger(rows):
    """The full counts table (results page; the README shows a few of its columns) counts each paper claim once, in the bucket its verdict names; checks, sensitivity rows,
    proxies and superseded rows apart; items by the strict rule against the inventory."""
    lines = claims.counts_text(rows, fmt="markdown").splitlines()  # every column (the results page's table)
    head = next(line for line in lines if line.startswith("| paper |"))
    names = [c.strip() for c in head.strip("|").split("|")][1:]
    cells = {}
    for line in lines:
        if line.startswith("| ") and not line.startswith("| paper"):
            parts = [c.strip(" *") for c in line.strip().strip("|").split("|")]
            cells[parts[0]] = dict(zip(names, parts[1:]))
    assert set(cells) == {"SepLLM", "LaCache", "DHSA", "REFORM", "OrthoRank", "kvpress", "all"}
    for paper, c in cells.items():
        mine = [r for r in rows if paper == "all" or r["paper"] == paper]
        claim_rows = [r for r in mine if r["role"] == "claim" and not r["proxy_of"] and not r["superseded"]
                      and r["kind"] != "not testable"]
        for word in ("agrees", "smaller", "does not agree", "excluded", "floor", "not measurable"):
            assert int(c[word]) == sum(r["verdict"] == word for r in claim_rows), (paper, word)
        assert int(c["inconclusive"]) == sum(r["verdict"].startswith("inconclusive") for r in claim_rows), paper
        assert int(c["not run"]) == sum(r["verdict"].startswith("not run") for r in claim_rows), paper
        assert int(c["claims tested"]) == sum(r["kind"] in ("statistical", "exact", "summary")
                                              for r in claim_rows), paper
        superseded = [r for r in mine if r["superseded"]]
        proxies = [r for r in mine if r["proxy_of"] and not r["superseded"]]
        live = [r for r in mine if not r["proxy_of"] and not r["superseded"]]
        checks = [r for r in live if r["role"] == "check"]
        sensitivity = [r for r in live if r["role"] == "sensitivity"]
        assert int(c["checks"]) == len(checks), paper
        assert int(c["sensitivity"]) == len(sensitivity), paper
        assert int(c["proxies"]) == len(proxies), paper
        assert int(c["superseded"]) == len(superseded), paper
        # every row lands in exactly one of: counted claim, check, sensitivity, proxy, superseded, not testable
        not_testable = [r for r in mine if r["kind"] == "not testable"]
        assert len(mine) == (len(claim_rows) + len(checks) + len(sensitivity) + len(proxies) + len(superseded)
                             + len(not_testable)), paper
        inventory = [i for p, items in claims.INVENTORY.items() if paper in ("all", p) for i in items]
        assert int(c["items"]) == len(inventory), paper
        assert int(c["testable"]) == int(c["items"]) - int(c["not testable"]), paper
    for paper, items in claims.INVENTORY.items():
        strict = [r for r in rows if r["paper"] == paper and r["role"] == "claim" and not r["proxy_of"]
                  and not r["superseded"] and r["kind"] == "statistical" and int(r["n"]) >= claims.MIN_N
                  and len(claims.items_of(r["item"])) <= 2]
        tested = {i for r in strict for i in claims.items_of(r["item"], paper)} & set(items)
        decided = {i for r in strict if int(r["n"]) >= 30 and r["plan"] == "before"
                   and r["verdict"] in ("agrees", "smaller", "does not agree", "excluded")
                   for i in claims.items_of(r["item"], paper)} & set(items)
        assert int(cells[paper]["tested"]) == len(tested), paper
        assert int(cells[paper]["decided n>=30"]) == len(decided), paper


@pytest.mark.parametrize("item, expected", [
    ("Tables 2-3, Figs. 5-6 (training)", ["Table 2", "Table 3", "Fig. 5", "Fig. 6"]),
    ("Table 6a (ablation: kernel 5)", ["Table 6"]),
    ("Tables 1, 4, 6b (vs InfLLM)", ["Table 1", "Table 4", "Table 6"]),
    ("Fig. 2/6 (needle, App. A)", ["Fig. 2", "Fig. 6"]),
    ("Table 1 (RULER, 8K)", ["Table 1"]),
    ("Tables 5-7 (streaming PPL, c=324)", ["Table 5", "Table 6", "Table 7"]),
    ("Sec. 3 (mask = policy)", []),
])
def test_items_of_reads_the_item_column(item, expected):
    assert claims.items_of(item) == expected


def test_every_row_names_items_of_its_paper(rows):
    """An item cell that names a table or figure names one the paper has (no 'Table 18' for a 17-table paper)."""
    for r in rows:
        unknown = set(claims.items_of(r["item"], r["paper"])) - set(claims.INVENTORY[r["paper"]])
        assert not unknown, f"{r['id']}: {sorted(unknown)} is not in {r['paper']}'s inventory"


def test_write_readme_writes_both_and_a_stale_one_is_named(tmp_path, rows):
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n<!-- claims:begin -->\nold\n<!-- claims:end -->\n\ntail\n", encoding="utf-8")
    results = tmp_path / "docs" / "results.md"
    assert claims.stale_pages(rows, readme, results) == ["README.md claims block", "docs/results.md"]
    assert claims.write_readme(readme, results) is True
    assert readme.read_text(encoding="utf-8") == "# x\n\n" + claims.readme_block(rows) + "\n\ntail\n"
    assert results.read_text(encoding="utf-8") == claims.results_page(rows)
    assert claims.write_readme(readme, results) is False  # idempotent
    assert claims.stale_pages(rows, readme, results) == []
    results.write_text(claims.results_page(rows).replace("agrees", "agreed", 1), encoding="utf-8")
    assert claims.stale_pages(rows, readme, results) == ["docs/results.md"]
    claims.write_readme(readme, results)
    readme.write_text(readme.read_text(encoding="utf-8").replace("| SepLLM | ", "| SepLLM | 9", 1), encoding="utf-8")
    assert claims.stale_pages(rows, readme, results) == ["README.md claims block"]


def test_examples_files_match_their_sources():
    r = subprocess.run([sys.executable, "-m", "kvlab", "run", "quality-claims-examples", "--check"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def test_notebook_table_and_counts(rows):
    one = claims.table("sepllm", items=["Table 1"])
    assert "Table 1 (" in one and "Table 12" not in one and "Table 15" not in one
    t = claims.table("lacache", items=["Table 5"])
    assert t.splitlines()[0].startswith("| verdict | this run | paper | 95 % CI of A - B | n | item | claim |")
    body = [line for line in t.splitlines()[2:] if line.startswith("|")]
    assert body and all("Table 5" in line for line in body)
    assert t.splitlines()[-1] == claims.outcomes()  # the five verdict words, explained under the table
    assert "Table 5" in claims.table("lacache", items=["Table 5"], legend=False).splitlines()[-1]
    assert t._repr_markdown_() == str(t)
    text = claims.table("REFORM", fmt="text")
    assert text.splitlines()[0].split()[0] == "verdict" and "item" in text.splitlines()[0]
    # a long cell wraps onto more lines in its column, never cut: every word of every claim is printed
    words = set(text.split())
    live = [r for r in claims.load() if r["paper"] == "REFORM" and not r["superseded"].strip()]
    assert any(len(r["claim"]) > 40 for r in live)
    assert all(set(r["claim"].split()) <= words for r in live if all(len(w) <= 40 for w in r["claim"].split()))
    c = claims.counts(rows)
    assert sum(sum(v.values()) for v in c.values()) == sum(claims._counted_claim(r) for r in rows)
    with pytest.raises(ValueError, match="no live claims match"):
        claims.table("nosuchpaper")


def test_cli_counts_and_check(capsys):
    assert ledger_cli.main(["--counts", "--check", "--skip-exact"]) == 0  # exact rows: test_every_exact_row_records...
    out = capsys.readouterr().out
    assert "agrees" in out and "LaCache" in out and "coverage" in out and "stale" not in out
