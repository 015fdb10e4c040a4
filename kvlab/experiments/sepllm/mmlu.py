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

__all__ = ["MMLUPrompt", "mmlu_prompts", "mmlu_accuracy", "mmlu_scores"]

LETTERS = ("A", "B", "C", "D")


@dataclass(frozen=True)
class MMLUPrompt:
    subject: str
    text: str
    gold: int  # index of the correct letter
    shots_chars: int = 0  # text[:shots_chars]: the header and exemplars the subject's prompts share
    index: int = -1  # the question's place among its subject's records


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
        for i, r in enumerate(items[shots:shots + questions], start=shots):
            out.append(MMLUPrompt(name, head + exemplars + _format(r, False), LETTERS.index(r["correct_answer"].strip()),
                                  len(head + exemplars), i))
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


@torch.no_grad()
def mmlu_scores(model, tokenizer, prompts: list[MMLUPrompt], pattern=None, layers=None) -> list[dict]:
    """Per-question records of ``model`` under ``pattern``, the shared exemplars prefilled once per subject.

    The header and exemplars (``text[:shots_chars]``, ending in a blank line) go through the model once into a
    :class:`~kvlab.core.KVCache` under ``pattern``; each question is then one forward pass of its own tokens on a
    copy of that cache, under the same pattern: the same attention as one pass over the whole prompt (the
    boundary is a blank line, where the tokenizer does not merge). Returns ``[{"subject", "index", "gold", "pred",
    "correct", "r_kv", "letter_logprobs"}]`` in the order of ``prompts``; ``r_kv`` is the pattern's kept share of the
    causal entries of the whole prompt."""
    import copy

    from kvlab.baselines import Full
    from kvlab.core import KVCache
    from kvlab.sepllm.pattern import kv_ratio

    if not prompts:
        raise ValueError("prompts is empty: make some with mmlu_prompts(...)")
    device = next(model.parameters()).device
    letter_ids = [tokenizer(" " + x, add_special_tokens=False).input_ids[-1] for x in LETTERS]
    out, prefix_text, prefix, prefix_ids = [], None, None, None
    for p in prompts:
        shared = p.text[:p.shots_chars]
        if shared != prefix_text:
            prefix_text = shared
            prefix_ids = tokenizer(shared, return_tensors="pt").input_ids.to(device)
            prefix = KVCache(model, Full())
            with use_pattern(model, pattern, layers):
                model(input_ids=prefix_ids, past_key_values=prefix, use_cache=True)
        ids = tokenizer(p.text[p.shots_chars:], add_special_tokens=False, return_tensors="pt").input_ids.to(device)
        cache = copy.deepcopy(prefix)
        with use_pattern(model, pattern, layers):
            logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[0, -1].float()
        logprobs = torch.log_softmax(logits, dim=-1)[letter_ids]
        pred = int(torch.argmax(logprobs))
        whole = torch.cat([prefix_ids, ids], dim=1).cpu()
        out.append({"subject": p.subject, "index": p.index, "gold": p.gold, "pred": pred, "correct": pred == p.gold,
                    "r_kv": 1.0 if pattern is None else kv_ratio(pattern, whole),
                    "letter_logprobs": [round(float(x), 4) for x in logprobs]})
    return out
