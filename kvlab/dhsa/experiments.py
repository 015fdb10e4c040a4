"""Experiments of the DHSA notebooks (07, 08) and of ``python -m kvlab bench dhsa prefill|decode``.

Paper: DHSA (arXiv:2508.02124), Sec. 3 and App. C-D. What is here:

* queries/keys of a layer (:func:`record_qk`), perplexity under prefill patterns (:func:`pattern_perplexity`);
* needle-in-a-haystack under patterns (Fig. 2/6: :func:`needle_under_patterns`);
* the LongBench stand-in of Table 1 (:func:`qa_items`, :func:`qa_under_patterns`): single-document QA
  from SQuAD (one Wikipedia article, the question's paragraph inside), multi-document QA from HotpotQA
  (its ten paragraphs, more from other questions to fill the length), few-shot QA (SQuAD passage / question
  / answer demonstrations, then the question: LongBench's TriviaQA format); token F1 (LongBench's QA metric)
  and the teacher-forced answer NLL, a proxy that still separates methods when a small model's F1 is noise;
* the cost side (Tables 2-3, Fig. 7-10): :func:`prefill_cost` (latency and peak memory of one prefill) and
  :func:`decode_cost` (latency and memory per generated token), on CPU or CUDA; :func:`random_model`
  builds the random-weight model shapes the GPU benchmark uses.

Ours at small scale: SmolLM2-135M on CPU; the full-size parameters are in ``notebooks/08_*.full.yaml``
and ``python -m kvlab bench dhsa``.
"""
from __future__ import annotations

import ast
import math
import random
import re
import statistics
import time
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from kvlab.core import AttentionCall, AttentionPattern, attend, check_choice, check_int, use_pattern

__all__ = ["QKRecorder", "record_qk", "pattern_perplexity", "needle_under_patterns",
           "QA_TASKS", "QAItem", "qa_items", "qa_f1", "qa_under_patterns",
           "peak_bytes", "prefill_cost", "decode_cost", "random_model", "MODEL_SHAPES"]


class QKRecorder(AttentionPattern):
    """Dense attention that keeps each layer's queries and keys (RoPE applied, as patterns see them)."""

    def __init__(self):
        self.q: dict[int, torch.Tensor] = {}
        self.k: dict[int, torch.Tensor] = {}
        self.scaling: dict[int, float] = {}

    def __call__(self, query, key, value, call: AttentionCall) -> torch.Tensor:
        self.q[call.layer_idx], self.k[call.layer_idx] = query.detach(), key.detach()
        self.scaling[call.layer_idx] = call.scaling
        out, _ = attend(query, key, value, call.causal_mask(), call.scaling)
        return out


@torch.no_grad()
def record_qk(model, ids: torch.Tensor, layers) -> QKRecorder:
    """One forward pass of ``ids`` ``(1, seq)``; returns the recorder with ``q[layer]``, ``k[layer]``."""
    rec = QKRecorder()
    with use_pattern(model, rec, layers):
        model(input_ids=ids.to(model.device), use_cache=False, logits_to_keep=1)  # no logits needed
    return rec


@torch.no_grad()
def pattern_perplexity(model, ids: torch.Tensor, patterns: dict, layers, *, skip: int = 0) -> dict[str, float]:
    """Teacher-forced perplexity of ``ids`` ``(1, seq)`` when each pattern computes attention in ``layers``
    during one prefill forward pass (``None``: dense). Tokens at positions ``< skip`` are not scored
    (e.g. those whose queries fit the budget and are dense anyway)."""
    out = {}
    ids = ids.to(model.device)
    for name, pattern in patterns.items():
        with use_pattern(model, pattern, layers):
            logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits[skip:], ids[0, 1 + skip:], reduction="mean")
        out[name] = math.exp(float(nll))
    return out


def needle_under_patterns(model, tokenizer, patterns: dict, layers, lengths, depths, *, max_new_tokens: int = 16):
    """:func:`kvlab.eval.needle_in_haystack` with a full cache while each pattern computes attention in
    ``layers``: the prompt is one prefill (sparse), the answer is decoded with the decode rule of App. A
    (:class:`~kvlab.dhsa.pattern.DHSAPattern`). Returns ``{name: RetrievalResult}`` (accuracy = needle
    word recall; ``answer_nll`` = teacher-forced NLL of the answer)."""
    from kvlab.baselines import Full
    from kvlab.eval import needle_in_haystack

    chunk = max(lengths) * 2  # the whole prompt in one prefill
    results = {}
    for name, pattern in patterns.items():
        with use_pattern(model, pattern, layers):
            results[name] = needle_in_haystack(model, tokenizer, Full(), lengths=list(lengths), depths=list(depths),
                                               chunk_size=chunk, progress=False)
    return results


# ================================================================================================
# Table 1 stand-in: single-doc (SQuAD), multi-doc (HotpotQA), few-shot (SQuAD demonstrations)
# ================================================================================================
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


@torch.no_grad()
def qa_under_patterns(model, tokenizer, patterns: dict, layers, items: list[QAItem], *,
                      max_new_tokens: int = 16) -> dict[str, dict[str, dict[str, float]]]:
    """Each pattern computes attention in ``layers`` (None: dense) with the full cache: the prompt is one
    prefill, the answer is decoded greedily (App. A under a DHSA pattern). Returns
    ``{pattern: {task: {"f1", "nll", "n"}}}`` with the mean token F1 and the mean teacher-forced NLL
    (nats/token) of the first gold answer, the proxy."""
    from kvlab.baselines import Full
    from kvlab.eval import ask

    out = {}
    for name, pattern in patterns.items():
        per: dict[str, list] = {}
        for it in items:
            with use_pattern(model, pattern, layers) if pattern is not None else nullcontext():
                said, nll = ask(model, tokenizer, it.prompt, " " + it.answers[0], Full(),
                                chunk_size=it.tokens + 8, max_new_tokens=max_new_tokens)
            per.setdefault(it.task, []).append((qa_f1(said, it.answers), nll))
        out[name] = {t: {"f1": sum(f for f, _ in v) / len(v), "nll": sum(x for _, x in v) / len(v), "n": len(v)}
                     for t, v in per.items()}
    return out


# ================================================================================================
# Cost: prefill latency / peak memory (Tables 2-3), decode latency / memory per token (Fig. 7-10)
# ================================================================================================
MODEL_SHAPES = {  # random-weight Gemma3 text models of the released shapes (config.json), and a tiny one
    "gemma3-270m": dict(hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
                        num_key_value_heads=1, head_dim=256, sliding_window=512),
    "gemma3-1b": dict(hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
                      num_key_value_heads=1, head_dim=256, sliding_window=512),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                 num_key_value_heads=1, head_dim=16, sliding_window=32),
}


def random_model(shape: str, *, attn_implementation: str = "sdpa", device=None, dtype=None, seed: int = 0):
    """A Gemma3 text model of ``shape`` (:data:`MODEL_SHAPES`; local layers with global every sixth, as
    Gemma3) with random weights, kvlab attached, in eval mode; ``attn_implementation`` ``"sdpa" | "eager"``
    is what dense attention runs."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from kvlab.core import attach

    check_choice("shape", shape, tuple(MODEL_SHAPES))
    check_choice("attn_implementation", attn_implementation, ("sdpa", "eager"))
    dims = MODEL_SHAPES[shape]
    layers = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(dims["num_hidden_layers"])]
    cfg = Gemma3TextConfig(vocab_size=32000 if shape != "tiny" else 96, max_position_embeddings=131072,
                           layer_types=layers, **dims)
    cfg._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    return attach(Gemma3ForCausalLM(cfg).to(device, dtype).eval())


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_bytes(fn, device) -> int:
    """Most bytes allocated at once while ``fn()`` runs, above what was allocated before it.

    CUDA: the allocator's peak statistic. CPU: the allocation and free events of ``torch.profiler`` summed
    in time order (torch's CPU allocations only; slow, so measured in a separate call from the timing).
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    current = peak = 0
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        current += e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage
        peak = max(peak, current)
    return peak


@torch.no_grad()
def prefill_cost(model, ids: torch.Tensor, pattern=None, layers=None, *, repeats: int = 3,
                 memory: bool = True) -> dict:
    """Latency (median of ``repeats`` after a warm-up) and peak memory of one prefill of ``ids`` ``(1, n)``
    with ``pattern`` in ``layers`` (None: the model's own dense attention, SDPA or eager).

    Returns ``{"ms", "peak_bytes"}``; ``peak_bytes`` is above the weights and inputs (None if not measured).
    The KV cache is not kept (``use_cache=False``) and only the last position's logits are computed, so the
    numbers are attention + MLP of the prefill, as Tables 2-3 time it.
    """
    check_int("repeats", repeats, 1)
    device = next(model.parameters()).device
    ids = ids.to(device)

    def run():
        with use_pattern(model, pattern, layers) if pattern is not None else nullcontext():
            model(input_ids=ids, use_cache=False, logits_to_keep=1)

    run()  # warm-up (compilation, allocator)
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        run()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return {"ms": statistics.median(times), "peak_bytes": peak_bytes(run, device) if memory else None}


@torch.no_grad()
def decode_cost(model, ids: torch.Tensor, policy, pattern=None, layers=None, *, steps: int = 16) -> dict:
    """Greedy decoding of ``steps`` tokens after a one-piece prefill of ``ids`` ``(1, n)``, timed per token.

    ``policy``: the KV policy of the cache (``Full``, ``StreamingLLM``, ``H2O``, ``DHSADecode``);
    ``pattern`` in ``layers``: the attention of prefill and decode (a DHSA pattern applies App. A's
    decode rule to each new token). Returns ``{"prefill_ms", "step_ms": [...], "cache_bytes": [...],
    "peak_bytes": [...] | None}`` per generated token: wall time, bytes the cache holds after the step, and
    (CUDA) the most bytes allocated during the step above what was allocated before decoding.
    """
    from kvlab.core import KVCache

    check_int("steps", steps, 1)
    device = next(model.parameters()).device
    ids = ids.to(device)
    cuda = device.type == "cuda"
    out = {"step_ms": [], "cache_bytes": [], "peak_bytes": [] if cuda else None}
    with use_pattern(model, pattern, layers) if pattern is not None else nullcontext():
        cache = KVCache(model, policy)
        _sync(device)
        t0 = time.perf_counter()
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        _sync(device)
        out["prefill_ms"] = (time.perf_counter() - t0) * 1e3
        base = torch.cuda.memory_allocated(device) if cuda else 0
        for _ in range(steps):
            token = logits[:, -1].argmax(-1, keepdim=True)
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            t0 = time.perf_counter()
            logits = model(input_ids=token, past_key_values=cache, use_cache=True).logits
            _sync(device)
            out["step_ms"].append((time.perf_counter() - t0) * 1e3)
            out["cache_bytes"].append(cache.trace.nbytes[-1])
            if cuda:
                out["peak_bytes"].append(torch.cuda.max_memory_allocated(device) - base)
    return out
