"""SepLLM's ablations as paired experiments (kvlab.experiments.sepllm.ablations): Table 16's separator sets, Table 17's
FixLLM, Table 9's head-wise baseline with its window matched to SepLLM's r.KV, the per-problem records and the
pair statistics, and the needle figures' policies."""

from __future__ import annotations

import pytest
import torch

from kvlab.core import kv_ratio
from kvlab.eval.stats import paired_bootstrap
from kvlab.experiments.sepllm.ablations import (compare_on_gsm8k, fixed_interval_methods, headwise_methods, needle_policies,
                                      pair_statistics, separator_choice_methods)
from kvlab.experiments.sepllm.gsm8k_matched import problem_ids
from kvlab.sepllm.pattern import FixLLMPattern, HeadwisePattern, SepLLMPattern, StreamingPattern

pytestmark = pytest.mark.usefixtures("one_thread")


class CharTokenizer:
    """One id per character (``ord % 90 + 2``), a 92-id vocabulary that decodes back (ASCII below 90)."""

    bos_token_id = eos_token_id = None
    all_special_ids: list[int] = []
    name_or_path = None

    def __call__(self, text, return_tensors=None, add_special_tokens=True):
        ids = [ord(c) % 90 + 2 for c in text]
        return type("Encoding", (), {"input_ids": torch.tensor([ids]) if return_tensors == "pt" else ids})()

    def __len__(self):
        return 92

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i - 2) if i >= 2 else "?" for i in ids)

    def batch_decode(self, rows):
        return [self.decode(r) for r in rows]


TOK = CharTokenizer()
EXEMPLARS = [{"question": "a b, c; d.", "target": "c d: e! The answer is 1."},
             {"question": "e f? g.", "target": "g h. The answer is 2."}]


def _problem(words: int, answer: int = 3) -> dict:
    marks = ".,?;:!"
    body = " ".join("ab" if i % 4 else f"cd{marks[i % 6]}" for i in range(words))
    return {"question": f"how {body}?", "answer": f"x {body}\n#### {answer}"}


SEQS = [problem_ids(TOK, _problem(w), EXEMPLARS) for w in (20, 30)]


def _mean_kv(pattern):
    return sum(kv_ratio(pattern, s) for s in SEQS) / len(SEQS)


def test_separator_sets_shrink_and_the_matched_window_reaches_nine_separators():
    methods, pairs = separator_choice_methods(TOK, SEQS, init=2, neighbors=16)
    nine, four, two, none, matched = methods.values()
    assert isinstance(none, StreamingPattern) and isinstance(matched, StreamingPattern)
    assert set(two.separators.tolist()) < set(four.separators.tolist()) < set(nine.separators.tolist())
    assert TOK(";").input_ids[0] in four.separators.tolist() and TOK(":").input_ids[0] not in four.separators
    kv = [_mean_kv(p) for p in (nine, four, two, none)]
    assert kv == sorted(kv, reverse=True) and kv[0] > kv[-1]
    assert _mean_kv(matched) >= kv[0] > _mean_kv(StreamingPattern(2, matched.neighbors - 1))
    names = list(methods)
    assert pairs[0] == (names[0], names[1]) and pairs[3] == (names[0], names[4])
    with pytest.raises(ValueError, match="sequences"):
        separator_choice_methods(TOK, [], init=2, neighbors=16)


def test_fixllm_rows_keep_one_key_per_interval():
    methods, pairs = fixed_interval_methods(TOK, init=2, neighbors=16, intervals=(4, 5))
    fix = [p for p in methods.values() if isinstance(p, FixLLMPattern)]
    assert [p.interval for p in fix] == [4, 5] and all(p.neighbors == 16 and p.init == 2 for p in fix)
    assert all(a == "SepLLM (n=16)" for a, _ in pairs) and len(pairs) == 2
    with pytest.raises(ValueError, match="interval"):
        fixed_interval_methods(TOK, intervals=(1,))


def test_headwise_rows_match_sepllm_r_kv_with_the_smallest_window():
    methods, pairs = headwise_methods(TOK, SEQS, 4, (2, 3, 4), init=2, neighbors=16)
    target = _mean_kv(methods["SepLLM (n=16)"])
    rows = {k: v for k, v in methods.items() if isinstance(v, HeadwisePattern)}
    assert rows and len(pairs) == len(rows)
    for p in rows.values():
        smaller = HeadwisePattern(p.window_heads, 4, p.neighbors - 1)
        assert _mean_kv(p) >= target > _mean_kv(smaller) and p.init == 0
    # with one sliding head of four, the three full heads alone keep more than SepLLM: no window matches
    few, _ = headwise_methods(TOK, SEQS, 4, (1,), init=2, neighbors=16)
    assert "skipped" in few and "H_s=1/4" in few["skipped"][0] and len(few) == 2
    with pytest.raises(ValueError, match="window_heads"):
        headwise_methods(TOK, SEQS, 4, (5,), init=2, neighbors=16)


def test_pair_statistics_count_the_winner_by_direction():
    a, b = [1.0, 2.0, 3.0, 4.0], [2.0, 2.5, 2.0, 5.0]
    lower = pair_statistics(a, b)
    assert (lower["a_better"], lower["b_better"], lower["ties"]) == (3, 1, 0)
    assert lower["mean_diff"] == pytest.approx(paired_bootstrap(a, b).estimate)
    higher = pair_statistics(a, b, lower_is_better=False)
    assert (higher["a_better"], higher["b_better"]) == (1, 3)


def test_compare_on_gsm8k_records_every_method_and_problem(tiny_llama):
    from kvlab.eval.gsm8k import gsm8k_answer_nll

    selected = [(3, _problem(20)), (8, _problem(30))]
    methods = {"Vanilla": None, "SepLLM": SepLLMPattern([TOK(".").input_ids[0]], 2, 16),
               "Headwise": HeadwisePattern(3, 4, 12)}
    out = compare_on_gsm8k(tiny_llama, TOK, selected, EXEMPLARS, methods, [("SepLLM", "Headwise")],
                           config={"table": "9"})
    nll = {m: [r["value"] for r in out["examples"] if r["method"] == m and r["metric"] == "answer_nll"]
           for m in methods}
    assert all(len(v) == 2 for v in nll.values())
    assert {r["example"] for r in out["examples"]} == {"gsm8k-test-0003", "gsm8k-test-0008"}
    direct = gsm8k_answer_nll(tiny_llama, TOK, [p for _, p in selected], EXEMPLARS, pattern=methods["Headwise"],
                              progress=False)
    assert nll["Headwise"] == pytest.approx(direct.answer_nll)
    assert nll["Headwise"] != pytest.approx(nll["Vanilla"])  # the pattern changes what the model sees
    (pair,) = out["pairs"]
    assert pair["mean_diff"] == pytest.approx(paired_bootstrap(nll["SepLLM"], nll["Headwise"]).estimate)
    assert out["examples"][0]["config"] == {"table": "9", "problems": 2, "device": "cpu"}
    with pytest.raises(ValueError, match="not in methods"):
        compare_on_gsm8k(tiny_llama, TOK, selected, EXEMPLARS, methods, [("SepLLM", "FixLLM")])


def test_needle_policies_compare_like_with_like():
    from kvlab.policies import StreamingLLM
    from kvlab.sepllm.policy import SepLLM, SepLLMStreaming

    streaming = [make() for make in needle_policies(TOK, "streaming").values()]
    assert isinstance(streaming[0], SepLLMStreaming) and isinstance(streaming[1], StreamingLLM)
    basic = [make() for make in needle_policies(TOK, "basic").values()]
    assert all(isinstance(p, SepLLM) for p in basic)
    assert len(basic[0].separators) > 0 and len(basic[1].separators) == 0
    # Figs. 10-11: n = 2048, 32 initial tokens, the first and last two layers full; one change (the separators)
    wide = [make() for make in needle_policies(TOK, "n2048").values()]
    assert [(p.init, p.neighbors, tuple(p.full_layers)) for p in wide] == [(32, 2048, (0, 1, -2, -1))] * 2
    assert len(wide[0].separators) > 0 and len(wide[1].separators) == 0
    with pytest.raises(ValueError, match="design"):
        needle_policies(TOK, "fancy")
