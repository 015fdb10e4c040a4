"""The Table 8 driver: one record per text and method, scored after the cache fills, equal to single runs."""

import pytest
import torch

from kvlab.eval.streaming import streaming_perplexity
from kvlab.policies import StreamingLLM


@pytest.fixture
def id_tokenizer():
    from conftest import IdTokenizer

    return IdTokenizer()


class _Driver:
    """The streaming tables' record maker with the configuration and device every record carries."""

    @staticmethod
    def records(*args, **kwargs):
        from kvlab.experiments.sepllm.streaming import window_nll_records

        return window_nll_records(*args, config={"model": "tiny"}, device="cpu", **kwargs)


@pytest.fixture(scope="module")
def driver():
    return _Driver()


def test_records_pair_every_text_and_match_a_single_run(driver, tiny_llama, id_tokenizer):
    torch.manual_seed(0)
    rows = [torch.randint(0, 96, (1, 40)) for _ in range(3)]
    methods = {"strm-insertion": StreamingLLM(sink=2, cache_size=12, positions="insertion"),
               "strm-shift": StreamingLLM(sink=2, cache_size=12)}
    recs = driver.records(tiny_llama, id_tokenizer, rows, methods, skip=12, prefix="t")
    assert [(r["example"], r["method"]) for r in recs] == [(f"t{i:03d}", m) for m in methods for i in range(3)]
    assert all(r["metric"] == "window_nll" and r["tokens_scored"] == 39 - 12 for r in recs)
    assert all(r["config"]["device"] == "cpu" and r["config"]["model"] == "tiny" for r in recs)
    single = streaming_perplexity(tiny_llama, id_tokenizer, rows[1], methods["strm-insertion"], max_tokens=None,
                                  progress=False)
    assert recs[1]["value"] == pytest.approx(float(single.nll[12:].mean()), rel=1e-5)
    assert recs[1]["value"] != pytest.approx(recs[4]["value"])  # the shift changes what is scored


def test_records_refuse_rows_of_different_lengths_and_a_skip_past_the_end(driver, tiny_llama, id_tokenizer):
    pol = {"s": StreamingLLM(sink=2, cache_size=12)}
    with pytest.raises(ValueError, match="one length"):
        rows = [torch.zeros(1, 20, dtype=torch.long), torch.zeros(1, 21, dtype=torch.long)]
        driver.records(tiny_llama, id_tokenizer, rows, pol, skip=0, prefix="t")
    with pytest.raises(ValueError, match="skip=30"):
        driver.records(tiny_llama, id_tokenizer, [torch.zeros(1, 20, dtype=torch.long)], pol, skip=30, prefix="t")
