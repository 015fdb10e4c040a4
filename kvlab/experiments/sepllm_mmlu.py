"""MMLU k-shot under a prefill mask, scored by the log-likelihood of the answer letter (SepLLM Tables 1, 9, 17).

The paper runs lm-evaluation-harness's MMLU 5-shot. kvlab's MMLU asset is the test split only (no dev split
for exemplars), so the first ``shots`` questions of a subject are its exemplars and are never scored. Each
prompt is one forward pass under the method's mask; the prediction is the letter ``A``-``D`` whose token gets
the highest logit after ``"Answer:"`` (lm-eval's "choice log-likelihood" for single-token choices)::

    prompt = header(subject) + shots x (question, choices, "Answer: X") + (question, choices, "Answer:")
    pred   = argmax_{x in A..D} logits[last][" " + x]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlab.core import check_int, use_pattern

__all__ = ["MMLUPrompt", "mmlu_prompts", "mmlu_accuracy"]

LETTERS = ("A", "B", "C", "D")


@dataclass(frozen=True)
class MMLUPrompt:
    subject: str
    text: str
    gold: int  # index of the correct letter


def _format(record: dict, with_answer: bool) -> str:
    choices = "".join(f"{x}. {record['answer_' + x.lower()]}\n" for x in LETTERS)
    answer = f" {record['correct_answer'].strip()}\n\n" if with_answer else ""
    return f"{record['question'].strip()}\n{choices}Answer:{answer}"


def mmlu_prompts(subjects: int = 4, questions: int = 15, shots: int = 5, records: list[dict] | None = None
                 ) -> list[MMLUPrompt]:
    """``questions`` scored prompts for each of ``subjects`` subjects spread over the alphabetical list of
    MMLU's 57 (every ``57 // subjects``-th), each with the subject's first ``shots`` questions as exemplars."""
    check_int("subjects", subjects, 1, 57)
    check_int("questions", questions, 1)
    check_int("shots", shots, 0)
    if records is None:
        from kvlab.datasets import load_records

        records = load_records("mmlu")
    by_subject: dict[str, list[dict]] = {}
    for r in records:
        by_subject.setdefault(r["topic"], []).append(r)
    names = sorted(by_subject)
    chosen = names[:: max(1, len(names) // subjects)][:subjects]
    out = []
    for name in chosen:
        items = by_subject[name]
        head = f"The following are multiple choice questions (with answers) about {name}.\n\n"
        exemplars = "".join(_format(r, True) for r in items[:shots])
        for r in items[shots:shots + questions]:
            out.append(MMLUPrompt(name, head + exemplars + _format(r, False), LETTERS.index(r["correct_answer"].strip())))
    return out


@torch.no_grad()
def mmlu_accuracy(model, tokenizer, prompts: list[MMLUPrompt], pattern=None) -> tuple[float, float, list[int]]:
    """``(accuracy, mean r.KV, predictions)`` of ``model`` under ``pattern`` (None: full attention).

    r.KV is the pattern's kept share of the causal entries (:func:`kvlab.sepllm.kv_ratio`), averaged over
    prompts."""
    from kvlab.sepllm.pattern import kv_ratio

    if not prompts:
        raise ValueError("prompts is empty: make some with mmlu_prompts(...)")
    device = next(model.parameters()).device
    letter_ids = [tokenizer(" " + x, add_special_tokens=False).input_ids[-1] for x in LETTERS]
    preds, kv = [], []
    for p in prompts:
        ids = tokenizer(p.text, return_tensors="pt").input_ids.to(device)
        with use_pattern(model, pattern):
            logits = model(input_ids=ids, use_cache=False).logits[0, -1]
        preds.append(int(torch.argmax(logits[letter_ids])))
        kv.append(1.0 if pattern is None else kv_ratio(pattern, ids.cpu()))
    acc = sum(int(a == p.gold) for a, p in zip(preds, prompts)) / len(prompts)
    return acc, sum(kv) / len(kv), preds
