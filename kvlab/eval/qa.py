"""Long-document question answering built from real corpora, shared by every method's experiments.

A LongBench stand-in (the QA tasks of DHSA's Table 1, REFORM's Table 3, the leaderboard's QA cells):
single-document QA from SQuAD (one Wikipedia article, the question's paragraph inside), multi-document QA
from HotpotQA (its ten paragraphs, more from other questions to fill the length), few-shot QA (SQuAD passage /
question / answer demonstrations, then the question: LongBench's TriviaQA format). :func:`qa_f1` is token F1,
LongBench's QA metric.
"""
from __future__ import annotations

import ast
import random
import re
from collections import Counter
from dataclasses import dataclass

from kvlab.core import check_choice, check_int

__all__ = ["QA_TASKS", "QAItem", "qa_items", "qa_f1"]


QA_TASKS = ("single-doc", "multi-doc", "few-shot")
_QA_TAIL = "\n\nAnswer the question with a short phrase from the text.\nQuestion: {q}\nAnswer:"


@dataclass
class QAItem:
    task: str
    prompt: str
    answers: list[str]
    tokens: int  # prompt length in tokens


def _ntok(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False).input_ids)


def _fill(tokenizer, parts: list[str], keep: int, room: int) -> list[str]:
    """Drop parts (never ``keep``), farthest from it first, until the joined text fits ``room`` tokens."""
    sizes = [_ntok(tokenizer, p) + 2 for p in parts]
    lo, hi = keep, keep + 1
    total = sizes[keep]
    while True:  # grow a window around the kept part, alternating sides
        grew = False
        if hi < len(parts) and total + sizes[hi] <= room:
            total += sizes[hi]
            hi += 1
            grew = True
        if lo > 0 and total + sizes[lo - 1] <= room:
            total += sizes[lo - 1]
            lo -= 1
            grew = True
        if not grew:
            return parts[lo:hi]


def _answers(a) -> list[str]:
    a = ast.literal_eval(a) if isinstance(a, str) and a.startswith("[") else a
    return [x for x in ([a] if isinstance(a, str) else list(a)) if x]


def qa_items(tokenizer, task: str, n: int, context_tokens: int, *, seed: int = 0) -> list[QAItem]:
    """``n`` prompts of about ``context_tokens`` tokens (at most) for one task of :data:`QA_TASKS`.

    * ``"single-doc"``: a SQuAD question; the document is its Wikipedia article's paragraphs in order,
      a window around the question's paragraph (LongBench's NarrativeQA / Qasper stand-in);
    * ``"multi-doc"``: a HotpotQA question (two supporting paragraphs among ten), more paragraphs of other
      questions added as distractors when the ten are short, shuffled (HotpotQA / 2WikiMQA stand-in);
    * ``"few-shot"``: SQuAD passage / question / answer demonstrations from other articles, then the question's
      passage and question (LongBench's TriviaQA few-shot format).
    """
    from kvlab.datasets import load_records

    check_choice("task", task, QA_TASKS)
    check_int("n", n, 1)
    check_int("context_tokens", context_tokens, 64)
    rng = random.Random(seed)
    items = []
    if task == "multi-doc":
        recs = load_records("hotpotqa")
        picks = rng.sample(range(len(recs)), n)
        for i in picks:
            r = recs[i]
            paras = [f"{t}: {''.join(sents)}" for t, sents in r["context"]]
            gold = {t for t, _ in r["supporting_facts"]}
            gold_paras = [p for (t, _), p in zip(r["context"], paras) if t in gold]
            others = [p for (t, _), p in zip(r["context"], paras) if t not in gold]
            while True:  # extra distractors from other questions until the length is reached
                j = rng.randrange(len(recs))
                others += [f"{t}: {''.join(s)}" for t, s in recs[j]["context"]]
                if sum(_ntok(tokenizer, p) + 2 for p in gold_paras + others) > context_tokens:
                    break
            tail = _QA_TAIL.format(q=r["question"])
            room = context_tokens - _ntok(tokenizer, tail) - 8
            body = list(gold_paras)
            used = sum(_ntok(tokenizer, p) + 2 for p in body)
            for p in others:
                c = _ntok(tokenizer, p) + 2
                if used + c <= room:
                    body.append(p)
                    used += c
            rng.shuffle(body)
            prompt = "Passages:\n\n" + "\n\n".join(body) + tail
            items.append(QAItem(task, prompt, _answers(r["answer"]), _ntok(tokenizer, prompt)))
        return items
    recs = [r for r in load_records("squad") if not r["is_impossible"] and _answers(r["answers"])]
    picks = rng.sample(range(len(recs)), n)
    for i in picks:
        r = recs[i]
        tail = _QA_TAIL.format(q=r["question"])
        if task == "single-doc":
            article = list(dict.fromkeys(x["context"] for x in recs if x["title"] == r["title"]))
            room = context_tokens - _ntok(tokenizer, tail) - 8
            body = _fill(tokenizer, article, article.index(r["context"]), room)
            prompt = "Document:\n\n" + "\n\n".join(body) + tail
        else:
            query = f"Passage: {r['context']}\nQuestion: {r['question']}\nAnswer:"
            room = context_tokens - _ntok(tokenizer, query) - 8
            demos, used = [], 0
            for j in rng.sample(range(len(recs)), len(recs)):
                d = recs[j]
                if d["title"] == r["title"]:
                    continue
                text = f"Passage: {d['context']}\nQuestion: {d['question']}\nAnswer: {_answers(d['answers'])[0]}"
                c = _ntok(tokenizer, text) + 2
                if used + c > room:
                    break
                demos.append(text)
                used += c
            prompt = "\n\n".join(demos + [query])
        items.append(QAItem(task, prompt, _answers(r["answers"]), _ntok(tokenizer, prompt)))
    return items


def _normalise(text: str) -> list[str]:
    text = re.sub(r"\b(a|an|the)\b", " ", re.sub(r"[^a-z0-9 ]", " ", text.lower()))
    return text.split()


def qa_f1(prediction: str, answers: list[str]) -> float:
    """Token F1 of the prediction's first line against the best gold answer (SQuAD / LongBench QA metric)."""
    pred = _normalise(prediction.strip().split("\n")[0])
    best = 0.0
    for a in answers:
        gold = _normalise(a)
        common = sum((Counter(pred) & Counter(gold)).values())
        if common:
            p, r = common / len(pred), common / len(gold)
            best = max(best, 2 * p * r / (p + r))
    return best
