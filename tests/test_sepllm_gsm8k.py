"""SepLLM's GSM8K comparison at matched r.KV (kvlab.experiments.sepllm.gsm8k_matched): the window matched on the sample's mean
r.KV, the choice of problems long enough for the window to bind, and the per-problem records."""

from __future__ import annotations

import torch
import pytest

from kvlab.core import kv_ratio
from kvlab.experiments.sepllm.gsm8k_matched import long_problems, matched_gsm8k, matched_window, problem_ids
from kvlab.sepllm.pattern import SepLLMPattern, StreamingPattern

pytestmark = pytest.mark.usefixtures("one_thread")


class ByteTokenizer:
    """One id per character (``ord % 90 + 2``); no special tokens."""

    bos_token_id = eos_token_id = None

    def __call__(self, text, return_tensors=None, add_special_tokens=True):
        ids = [ord(c) % 90 + 2 for c in text]
        return type("Encoding", (), {"input_ids": torch.tensor([ids]) if return_tensors == "pt" else ids})()

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i - 2) if i >= 2 else "?" for i in ids)


TOK = ByteTokenizer()
SEPS = [TOK(".").input_ids[0], TOK(",").input_ids[0], TOK("\n").input_ids[0]]
EXEMPLARS = [{"question": "a b, c.", "target": "c d. The answer is 1."},
             {"question": "e f.", "target": "g. The answer is 2."}]


def _problem(words: int, answer: int = 3) -> dict:
    body = " ".join("ab" if i % 5 else "cd." for i in range(words))
    return {"question": f"how {body}?", "answer": f"x {body}\n#### {answer}"}


def test_matched_window_reaches_the_mean_r_kv_with_the_smallest_window():
    g = torch.Generator().manual_seed(0)
    sequences = [torch.randint(2, 90, (1, t), generator=g) for t in (90, 140, 200)]
    sep = SepLLMPattern(SEPS + [10, 11, 12], 3, 16)
    target = sum(kv_ratio(sep, s) for s in sequences) / 3
    n = matched_window(lambda k: StreamingPattern(3, k), target, sequences)
    mean = lambda k: sum(kv_ratio(StreamingPattern(3, k), s) for s in sequences) / 3  # noqa: E731
    assert mean(n) >= target > mean(n - 1) and n > 16
    with pytest.raises(ValueError, match="sequences"):
        matched_window(lambda k: StreamingPattern(3, k), target, [])


def test_long_problems_keeps_the_long_ones_in_order():
    problems = [_problem(3), _problem(30), _problem(2), _problem(40)]
    chosen = long_problems(TOK, problems, 100)
    assert [i for i, _ in chosen] == [1, 3]
    assert [i for i, _ in long_problems(TOK, problems, 100, n=1)] == [1]
    with pytest.raises(ValueError, match="lower min_tokens"):
        long_problems(TOK, problems, 10_000)


def test_matched_gsm8k_records_per_problem(tiny_llama):
    selected = [(7, _problem(12)), (9, _problem(15))]
    out = matched_gsm8k(tiny_llama, TOK, selected, EXEMPLARS, SEPS, init=2, neighbors=16, generate=1,
                        max_new_tokens=3)
    names = list(out["methods"])
    assert names[:3] == ["Vanilla", "SepLLM (n=16)", "StrmLLM (n=16)"] and "r.KV matched" in names[3]
    sep_kv, matched_kv = out["methods"]["SepLLM (n=16)"]["mean_r_kv"], out["methods"][names[3]]["mean_r_kv"]
    assert matched_kv >= sep_kv > out["methods"]["StrmLLM (n=16)"]["mean_r_kv"]
    nll = [r for r in out["examples"] if r["metric"] == "answer_nll"]
    assert len(nll) == 4 * 2 and {r["example"] for r in nll} == {"gsm8k-test-0007", "gsm8k-test-0009"}
    vanilla_kv = [r["value"] for r in out["examples"] if r["metric"] == "r_kv" and r["method"] == "Vanilla"]
    assert vanilla_kv == [1.0, 1.0]
    sep_records = [r["value"] for r in nll if r["method"] == "SepLLM (n=16)"]
    seq = problem_ids(TOK, selected[0][1], EXEMPLARS)
    assert seq.shape[1] > 16 and sep_records[0] > 0
    pairs = {(p["b"], p["metric"]) for p in out["pairs"]}
    assert pairs == {("Vanilla", "answer_nll"), ("StrmLLM (n=16)", "answer_nll"), (names[3], "answer_nll"),
                     (names[3], "flexible_match")}
    gen = [r for r in out["examples"] if r["metric"] == "flexible_match"]
    assert len(gen) == 2 and all("output" in r and r["target"] == "3" for r in gen)
