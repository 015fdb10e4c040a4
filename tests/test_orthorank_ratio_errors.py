"""A perplexity ratio of per-window NLLs that would overflow ``exp`` is a clear error, not an OverflowError."""
import pytest

from kvlab.experiments.orthorank.studies import paired_ppl_ratio


def test_ratio_of_huge_nll_differences_is_a_clear_error():
    with pytest.raises(ValueError, match="overflows a float: pass mean NLLs per predicted token"):
        paired_ppl_ratio([800.0, 801.0, 799.0], [2.0, 2.1, 1.9], resamples=200)


def test_ratio_of_ordinary_nlls_is_computed():
    r = paired_ppl_ratio([2.1, 2.2, 2.0, 2.3], [2.0, 2.1, 1.9, 2.2], resamples=200)
    assert r["n"] == 4 and 1.10 < r["ratio"] < 1.11
