"""MMLU with the subject's exemplars prefilled once (kvlab.experiments.sepllm.mmlu.mmlu_scores): the same predictions, letter
log-likelihoods and r.KV as one forward pass over each whole prompt (mmlu_accuracy), with and without a pattern."""

from __future__ import annotations

import pytest
import torch

from kvlab.experiments.sepllm.mmlu import mmlu_accuracy, mmlu_prompts, mmlu_scores
from kvlab.sepllm.pattern import SepLLMPattern, StreamingPattern
from test_sepllm_mechanism import SEPS, CharTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

RECORDS = [dict(question=f"q{s}{i} what is {i} and {s}?", answer_a="x", answer_b="yy", answer_c="z z", answer_d="w",
                correct_answer="ABCD"[(i + s) % 4], topic=f"subject {s}") for s in range(3) for i in range(7)]


@pytest.mark.parametrize("pattern", [None, SepLLMPattern(SEPS, 2, 12), StreamingPattern(2, 12)], ids=repr)
def test_shared_prefix_equals_whole_prompt(tiny_llama, pattern):
    tok = CharTokenizer()
    prompts = mmlu_prompts(subjects=3, questions=3, shots=3, records=RECORDS)
    assert all(p.text[:p.shots_chars].endswith("\n\n") for p in prompts)
    assert [p.index for p in prompts[:3]] == [3, 4, 5]
    acc, kv, preds = mmlu_accuracy(tiny_llama, tok, prompts, pattern)
    rows = mmlu_scores(tiny_llama, tok, prompts, pattern)
    assert [r["pred"] for r in rows] == preds
    assert sum(r["correct"] for r in rows) / len(rows) == pytest.approx(acc)
    assert sum(r["r_kv"] for r in rows) / len(rows) == pytest.approx(kv)
    if pattern is not None:
        assert kv < 1.0
    # the letter log-likelihoods of one whole-prompt pass, question by question
    letters = [tok(" " + x).input_ids[-1] for x in "ABCD"]
    for p, r in zip(prompts, rows):
        ids = tok(p.text, return_tensors="pt").input_ids
        from kvlab.core import use_pattern

        with torch.no_grad(), use_pattern(tiny_llama, pattern):
            logits = tiny_llama(input_ids=ids, use_cache=False).logits[0, -1].float()
        want = torch.log_softmax(logits, dim=-1)[letters]
        torch.testing.assert_close(torch.tensor(r["letter_logprobs"]), want, atol=1e-4, rtol=0)
