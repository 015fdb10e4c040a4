"""What the DHSA experiments measure: the notebooks (07, 08), ``python -m kvlab run dhsa-*`` and ``python -m kvlab bench dhsa``.

Paper: DHSA (arXiv:2510.24606), Sec. 3 and App. C-D. What is here:

* queries/keys of a layer (:func:`record_qk`), perplexity under prefill patterns (:func:`pattern_perplexity`:
  DHSA patterns must use the causal query (``causal_query=True``), :func:`position_nll` for the leak);
* needle-in-a-haystack under patterns (Fig. 2/6: :func:`needle_under_patterns`), and per example with raw
  answers and either protocol (:func:`needle_records`, records of :mod:`kvlab.experiments.records`;
  ``python -m kvlab run dhsa-needle --help`` runs the grid);
* the LongBench stand-in of Table 1 (:func:`qa_items`, :func:`qa_under_patterns`): single-document QA
  from SQuAD (one Wikipedia article, the question's paragraph inside), multi-document QA from HotpotQA
  (its ten paragraphs, more from other questions to fill the length), few-shot QA (SQuAD passage / question
  / answer demonstrations, then the question: LongBench's TriviaQA format); token F1 (LongBench's QA metric)
  and the teacher-forced answer NLL, a proxy that still separates methods when a small model's F1 is noise;
* the cost side (Tables 2-3, Fig. 7-10): :func:`prefill_cost` (latency and peak memory of one prefill) and
  :func:`decode_cost` (latency and memory per generated token), on CPU or CUDA; :func:`random_model`
  builds the random-weight model shapes the GPU benchmark uses.

Ours at small scale: SmolLM2-135M on CPU; the full-size parameters are in ``notebooks/params/08_*.full.yaml``
and ``python -m kvlab bench dhsa``.
"""
from __future__ import annotations

import math
import re
import statistics
import time
from contextlib import nullcontext

import torch

from kvlab.core import AttentionCall, AttentionPattern, attend, check_choice, check_int, use_pattern
from kvlab.eval.qa import QA_TASKS, QAItem, qa_f1, qa_items
from kvlab.experiments.records import read as read_records
from kvlab.experiments.records import record
from kvlab.experiments.records import write as write_records
from kvlab.kernels.benchmarking import synchronize

__all__ = ["QKRecorder", "record_qk", "pattern_perplexity", "position_nll", "boundary_leak",
           "fired_boundary_leak",
           "needle_under_patterns",
           "question_tail_tokens", "newline_ends", "needle_records",
           "boundary_records", "table2_rows", "table2_accuracy", "table2_markdown", "needle_methods", "records_grid", "needle_table", "write_examples",
           "read_examples",
           "qa_under_patterns", "qa_records",
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


def _check_causal(name, pattern):
    from kvlab.dhsa.pattern import DHSAPattern

    if isinstance(pattern, DHSAPattern) and pattern.budget is not None and pattern.chunking == "oracle":
        raise ValueError(
            f"pattern {name!r} takes its boundaries from the layer's whole attention map (chunking='oracle'), "
            "which reads every later token: teacher-forced perplexity would see the future (about 1.5 nats at "
            "earlier positions in notebook 07). Use chunking='predictor' or 'fixed' for perplexity, or pass "
            "causal=False to measure the leak on purpose")
    if isinstance(pattern, DHSAPattern) and pattern.budget is not None and not pattern.causal_query:
        raise ValueError(
            f"pattern {name!r} ranks keys with whole-chunk query vectors, which average the queries of *later* "
            "tokens of the chunk: under teacher forcing a position's prediction then depends on the tokens it "
            "predicts (a leak). Build it with causal_query=True for perplexity, or pass causal=False to measure "
            "the leak on purpose")


@torch.no_grad()
def position_nll(model, ids: torch.Tensor, pattern, layers) -> torch.Tensor:
    """``(seq - 1,)`` float64 teacher-forced NLL of every next token of ``ids`` ``(1, seq)`` with ``pattern`` in
    ``layers`` (``None``: dense) during one prefill: what perplexity averages, per position (the leak test)."""
    ids = ids.to(model.device)
    with use_pattern(model, pattern, layers) if pattern is not None else nullcontext():
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1].double()
    return torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")


@torch.no_grad()
def boundary_leak(model, ids: torch.Tensor, pattern, layers, position: int, *, skip: int = 0) -> float:
    """How far the future reaches back under teacher forcing: replace the token at ``position`` of ``ids``
    ``(1, seq)`` by another one and return the largest change of the NLL at positions ``skip .. position - 2``
    (those predicted before the changed token is seen). 0 for a causal pattern (dense attention, fixed chunks
    with ``causal_query``); a predicted boundary that reads the changed key moves it."""
    if not 0 < position < ids.shape[1]:
        raise ValueError(f"position must be in 1 .. {ids.shape[1] - 1} (a token of ids), got {position}")
    other = ids.clone()
    other[0, position] = (int(ids[0, position]) + 1) % model.config.vocab_size
    moved = (position_nll(model, other, pattern, layers) - position_nll(model, ids, pattern, layers))
    return float(moved[skip:max(skip, position - 1)].abs().max()) if position - 1 > skip else 0.0


@torch.no_grad()
def fired_boundary_leak(model, ids: torch.Tensor, pattern, layers, *, skip: int = 0, count: int = 4,
                        ahead: int = 2) -> dict:
    """:func:`boundary_leak` where the predictor fires: the token ``ahead`` positions after each of up to ``count``
    predicted boundaries past ``skip`` (the boundary at ``t`` reads the keys up to ``t + w``, so that token can move
    it and with it the chunks of the positions before it). One prefill finds the boundaries at the layer they are
    taken from (``pattern.boundaries``), spread over the scored stretch.

    Returns ``{"positions": the changed tokens, "leaks": the leak at each (nats), "max": the largest}``."""
    n = ids.shape[1]
    position_nll(model, ids, pattern, layers)  # one prefill: the pattern records its boundaries
    first = min(pattern.boundaries)
    ends = [int(e) for e in pattern.boundaries[first][0][1:-1] if skip + 2 <= int(e) + ahead - 1 < n]
    if not ends:
        return {"positions": [], "leaks": [], "max": 0.0}
    pick = [ends[round(i * (len(ends) - 1) / max(count - 1, 1))] for i in range(min(count, len(ends)))]
    positions = sorted({e - 1 + ahead for e in pick})  # chunk end e - 1, the changed token `ahead` after it
    leaks = [boundary_leak(model, ids, pattern, layers, p, skip=skip) for p in positions]
    return {"positions": positions, "leaks": leaks, "max": max(leaks)}


@torch.no_grad()
def pattern_perplexity(model, ids: torch.Tensor, patterns: dict, layers, *, skip: int = 0,
                       causal: bool = True) -> dict[str, float]:
    """Teacher-forced perplexity of ``ids`` ``(1, seq)`` when each pattern computes attention in ``layers``
    during one prefill forward pass (``None``: dense). Tokens at positions ``< skip`` are not scored
    (e.g. those whose queries fit the budget and are dense anyway).

    ``causal`` (default): a sparse :class:`~kvlab.dhsa.pattern.DHSAPattern` must build its query chunk
    vectors causally (``causal_query=True``), else ValueError: the whole-chunk query vector averages later
    queries of the chunk, so the kept set of position ``i`` depends on tokens after ``i`` and teacher-forced
    perplexity sees the future. Oracle boundaries (the whole attention map) are refused too. Predicted boundaries
    are not made causal: a boundary at ``t`` reads the keys up to ``t + w`` (``w = 4``), so a later token can
    still move an earlier position's chunks; :func:`boundary_leak` measures what that leaves, and a perplexity
    table should print it beside each row."""
    out = {}
    for name, pattern in patterns.items():
        if causal:
            _check_causal(name, pattern)
        nll = position_nll(model, ids, pattern, layers)[skip:]
        out[name] = math.exp(float(nll.mean()))
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


def question_tail_tokens(tokenizer, prompt: str, marker: str = "\n\nQuestion:") -> int:
    """Tokens of ``prompt`` from the last ``marker`` on (the question / instruction the authors keep dense at
    prefill); ValueError if the marker is absent."""
    at = prompt.rfind(marker)
    if at < 0:
        raise ValueError(f"the prompt has no {marker!r}: cannot find its question; pass dense_tail as an int")
    total = len(tokenizer(prompt).input_ids)
    return total - len(tokenizer(prompt[:at]).input_ids)


def newline_ends(tokenizer, ids) -> list[int]:
    """Offsets just after every token of ``ids`` (a list or ``(1, seq)`` tensor) whose text holds a newline: the
    explicit boundaries App. B adds to the predicted ones (``DHSAPattern(newlines=True)``)."""
    ids = ids[0].tolist() if isinstance(ids, torch.Tensor) else list(ids)
    pieces = tokenizer.convert_ids_to_tokens(ids)
    text = [tokenizer.convert_tokens_to_string([p]) for p in pieces]
    return [i + 1 for i, t in enumerate(text) if "\n" in t]


def _rotated_haystack(text: str, trial: int, trials: int) -> str:
    """The haystack started at the ``trial``-th of ``trials`` paragraph breaks spread over ``text`` (trial 0: as is)."""
    if trial == 0:
        return text
    breaks = [m.end() for m in re.finditer(r"\n\n", text)]
    if not breaks:
        return text
    at = breaks[(trial * len(breaks)) // trials]
    return text[at:] + "\n\n" + text[:at]


def needle_records(model, tokenizer, methods: dict, layers, lengths, depths, *, trials: int = 1,
                   max_new_tokens: int = 32, model_name: str = "", haystack: str | None = None,
                   progress: bool = False, sink=None, max_seconds: float | None = None,
                   show: int = 5, first_trial: int = 0, last_trial: int | None = None, skip=()) -> list[dict]:
    """Needle-in-a-haystack (Fig. 2/6), one record per (prompt, method) for the claims ledger.

    Prompts: :func:`kvlab.datasets.niah_prompt` for every length x depth x trial; trial ``t`` starts the Paul
    Graham haystack at a different paragraph, so each (length, depth) cell has ``trials`` different
    haystacks. Each method (``{name: pattern or None}``, installed in ``layers``) prefills the prompt in one
    piece with a full cache and decodes greedily (:func:`kvlab.eval.ask`, which also scores the
    teacher-forced answer NLL). A pattern with ``dense_tail="question"`` gets the prompt's question length
    (:func:`question_tail_tokens`) before its prefill: the authors' protocol.

    Returns records ``{"example", "method", "metric", "value", "output", "target", "config"}``: metric
    ``"needle_recall"`` (share of the needle's words in the answer, kvlab's needle score) and ``"answer_nll"``
    (nats per answer token), ``example`` = ``"niah/<model>/L<length>/d<depth>/t<trial>"``. ``sink(records)``,
    if given, receives each prompt's records as they are made (a long run keeps what it finished).

    Prompts run trial by trial (every length x depth of trial 0, then of trial 1, ...), so a run stopped by
    ``max_seconds`` (no new prompt starts after it) has the same number of haystacks in every cell, give or
    take one; ``first_trial`` resumes such a run (trials ``first_trial .. trials - 1``, the same haystacks as in
    the full run) and ``last_trial`` ends one before ``trials`` (a shard of the grid, its haystacks unchanged).
    With ``progress``, the raw answers of the first ``show`` trials of each cell are printed (look at them before
    trusting a score). Examples in ``skip`` (an earlier run's, resumed) are not run again.
    """
    from kvlab import datasets

    check_int("trials", trials, 1)
    text = haystack if haystack is not None else datasets.load_text("paul-graham")
    out: list[dict] = []
    device = _device(model)
    check_int("first_trial", first_trial, 0)
    end = trials if last_trial is None else min(last_trial, trials)  # a shard: trials first_trial .. end - 1
    cells = [(n, d, t) for t in range(first_trial, end) for n in lengths for d in depths]
    t_start = time.perf_counter()
    for i, (n, depth, trial) in enumerate(cells):
        if max_seconds is not None and time.perf_counter() - t_start > max_seconds:
            if progress:
                print(f"stopped after {i} of {len(cells)} prompts: max_seconds={max_seconds} reached", flush=True)
            break
        example = f"niah/{model_name}/L{n}/d{depth:.2f}/t{trial}"
        if example in skip:
            continue
        p = datasets.niah_prompt(tokenizer, _rotated_haystack(text, trial, trials), n, depth)
        base = {"model": model_name, "length": n, "depth": depth, "trial": trial}
        out += _needle_prompt(model, tokenizer, methods, layers, p, example, base, max_new_tokens, device)
        if sink is not None:
            sink(out[-2 * len(methods):])
        if progress:
            _show(out[-2 * len(methods)::2], f"[{i + 1}/{len(cells)}] {example} "
                  f"({time.perf_counter() - t_start:.0f} s)", trial < first_trial + show)
    return out


def _needle_prompt(model, tokenizer, methods: dict, layers, p, example: str, base: dict, max_new_tokens: int,
                   device: str) -> list[dict]:
    """One needle prompt ``p`` under every method: the answer, its needle recall and answer NLL, two records each."""
    from kvlab.baselines import Full
    from kvlab.eval import ask
    from kvlab.eval.retrieval import needle_score

    tail = question_tail_tokens(tokenizer, p.prompt)
    n_tok = len(tokenizer(p.prompt).input_ids)
    ends = None
    out = []
    for name, pattern in methods.items():
        if getattr(pattern, "dense_tail", None) == "question":
            pattern.question_tokens = tail
        if getattr(pattern, "newlines", False):
            if ends is None:
                ends = newline_ends(tokenizer, tokenizer(p.prompt).input_ids)
            pattern.newline_ends = ends
        t0 = time.perf_counter()
        with use_pattern(model, pattern, layers) if pattern is not None else nullcontext():
            said, nll = ask(model, tokenizer, p.prompt, p.answer, Full(), chunk_size=n_tok + 8,
                            max_new_tokens=max_new_tokens)
        config = base | {"prompt_tokens": n_tok, "question_tokens": tail,
                         "pattern": repr(pattern) if pattern is not None else "dense",
                         "seconds": round(time.perf_counter() - t0, 3)} | _pattern_settings(pattern)
        for metric, value in (("needle_recall", needle_score(said, p.answer)), ("answer_nll", nll)):
            out.append(record(example, name, metric, float(value), config=config, device=device, output=said,
                              target=p.answer))
    return out


def _pattern_settings(pattern) -> dict:
    """Every setting of a DHSA pattern and its statistics of the last prefill (floats rounded); {} otherwise."""
    if pattern is None or not hasattr(pattern, "settings"):
        return {}
    return pattern.settings() | {k: round(v, 2) if isinstance(v, float) else v for k, v in pattern.stats().items()}


def _show(recs: list[dict], head: str, raw: bool) -> None:
    print(head + ": " + ", ".join(f"{r['method']} {r['value']:.2f}" for r in recs), flush=True)
    if raw:
        for r in recs:
            print(f"    {r['method']:24s} said {r['output'][:80]!r}", flush=True)


def _device(model) -> str:
    """The ``device`` of a record: ``"cpu"`` or ``"cuda (NVIDIA H200)"``."""
    dev = next(model.parameters()).device
    return f"cuda ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else dev.type


def _prepare(pattern, tokenizer, prompt: str, ids) -> None:
    """Per-prompt inputs of a pattern: the question length (authors' dense tail) and the newline offsets."""
    if getattr(pattern, "dense_tail", None) == "question":
        pattern.question_tokens = question_tail_tokens(tokenizer, prompt)
    if getattr(pattern, "newlines", False):
        pattern.newline_ends = newline_ends(tokenizer, ids)


def boundary_records(model, tokenizer, methods: dict, layers, length: int, depths, *, trials: int = 1,
                     model_name: str = "", haystack: str | None = None, sink=None, skip=()) -> list[dict]:
    """How good each method's chunks are on needle prompts, one prefill per (prompt, method), per-example records
    for the ledger: ``"attention_recall"`` (share of the dense attention mass the kept set holds, mean over the
    DHSA layers and queries: :func:`kvlab.dhsa.boundary_predictor.attention_recall`), ``"chunks"`` (chunks per layer) and
    ``"chunk_len"`` (mean tokens per chunk). ``methods``: ``{name: DHSAPattern}`` (``record=True`` is set here;
    it computes each layer's dense attention map, so keep ``length`` to a few thousand tokens). ``sink(records)``
    receives each prompt's records as they are made."""
    from kvlab import datasets

    text = haystack if haystack is not None else datasets.load_text("paul-graham")
    out = []
    device = _device(model)
    for trial in range(trials):
        for depth in depths:
            example = f"niah/{model_name}/L{length}/d{depth:.2f}/t{trial}"
            if example in skip:
                continue
            p = datasets.niah_prompt(tokenizer, _rotated_haystack(text, trial, trials), length, depth)
            ids = tokenizer(p.prompt, return_tensors="pt").input_ids
            for name, pattern in methods.items():
                pattern.record = True
                pattern.recall.clear()
                pattern.boundaries.clear()
                _prepare(pattern, tokenizer, p.prompt, ids)
                with torch.no_grad(), use_pattern(model, pattern, layers):
                    model(input_ids=ids.to(model.device), use_cache=False, logits_to_keep=1)
                counts = [len(b[0]) - 1 for b in pattern.boundaries.values()]
                n = ids.shape[1]
                config = {"model": model_name, "length": length, "depth": depth, "trial": trial, "prompt_tokens": n,
                          "pattern": repr(pattern), "nms_window": pattern.nms_window}
                for metric, value in (("attention_recall", statistics.mean(pattern.recall.values())),
                                      ("chunks", statistics.mean(counts)),
                                      ("chunk_len", n / statistics.mean(counts))):
                    out.append(record(example, name, metric, float(value), config=config, device=device))
            if sink is not None:
                sink(out[-3 * len(methods):])
    return out


def table2_rows(model, tokenizer, methods: dict, layers, prompt: str, *, repeats: int = 3):
    """Table 2's cost columns: latency (median of ``repeats``) and peak memory of one prefill of ``prompt`` per
    method (``{name: pattern or None}``, None = the model's own attention), :func:`prefill_cost`. Yields one row
    ``{"method", "ms", "peak_bytes", "tokens"}`` per method as it is measured."""
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    for name, pattern in methods.items():
        if pattern is not None:
            _prepare(pattern, tokenizer, prompt, ids)
        c = prefill_cost(model, ids, pattern, layers, repeats=repeats)
        yield {"method": name, "ms": c["ms"], "peak_bytes": c["peak_bytes"], "tokens": ids.shape[1]}


def records_grid(records: list[dict], method: str, metric: str = "needle_recall"):
    """``(lengths, depths, grid)``: the mean of ``metric`` over trials per (length, depth) for one method
    (a heat map of Fig. 2/6)."""
    cells: dict = {}
    for r in records:
        if r["method"] == method and r["metric"] == metric:
            cells.setdefault((r["config"]["length"], r["config"]["depth"]), []).append(r["value"])
    lengths = sorted({k[0] for k in cells})
    depths = sorted({k[1] for k in cells})
    grid = torch.tensor([[statistics.mean(cells[(n, d)]) if (n, d) in cells else float("nan") for d in depths]
                         for n in lengths])
    return lengths, depths, grid


def needle_table(records: list[dict], metric: str = "needle_recall") -> str:
    """A text table of needle records: one line per (model, length, method), the mean of ``metric`` per depth,
    over all depths, the number of prompts and the median seconds per prompt (where recorded)."""
    cells: dict = {}
    for r in records:
        if r["metric"] == metric:
            c = r["config"]
            cells.setdefault((c["model"], c["length"], r["method"]), {}).setdefault(c["depth"], []).append(r)
    if not cells:
        raise ValueError(f"no {metric!r} records")
    depths = sorted({d for v in cells.values() for d in v})
    w = max(len(k[2]) for k in cells)
    head = f"{'model':14s} {'tokens':>6s} {'method':{w}s} " + " ".join(f"{f'd={d:g}':>6s}" for d in depths)
    lines = [head + f" {'all':>6s} {'n':>4s} {'s/prompt':>8s}"]
    for (model, n, method), by in cells.items():
        every = [r for v in by.values() for r in v]
        sec = [r["config"]["seconds"] for r in every if "seconds" in r["config"]]
        lines.append(f"{model:14s} {n:6d} {method:{w}s} " + " ".join(
            f"{statistics.mean(x['value'] for x in by[d]):6.2f}" if d in by else f"{'-':>6s}" for d in depths)
            + f" {statistics.mean(x['value'] for x in every):6.2f} {len(every):4d} "
            + (f"{statistics.median(sec):8.2f}" if sec else f"{'-':>8s}"))
    return "\n".join(lines)


def write_examples(path, recs: list[dict]):
    """Write records (:mod:`kvlab.experiments.records`: ``*.examples.jsonl.gz``; a name ending in
    ``.examples.jsonl`` gets the ``.gz``); returns the path written."""
    from pathlib import Path

    path = Path(path)
    if path.name.endswith(".examples.jsonl"):
        path = path.with_name(path.name + ".gz")
    return write_records(path, recs)


def read_examples(path) -> list[dict]:
    """Records of a ``*.examples.jsonl(.gz)`` file, checked (:func:`kvlab.experiments.records.read`)."""
    return read_records(path)


# ================================================================================================
# Table 1 stand-in: the QA items come from kvlab.eval.qa (shared with REFORM and the leaderboard)
# ================================================================================================
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


def qa_records(model, tokenizer, methods: dict, layers, items: list[QAItem], *, model_name: str = "",
               max_new_tokens: int = 16, sink=None, skip=()) -> list[dict]:
    """The LongBench stand-in (Table 1) one record per (question, method): metrics ``"f1"`` (token F1 against the
    gold answers) and ``"answer_nll"`` (teacher-forced NLL of the first gold answer, nats per token), ``example`` =
    ``"qa/<model>/<task>/<i>"``, ``config`` with every setting of the pattern. A pattern with
    ``dense_tail="question"`` gets the instruction + question's length (the authors' dense instruction tokens).
    ``sink(records)`` receives each question's records as they are made."""
    from kvlab.baselines import Full
    from kvlab.eval import ask

    out = []
    device = _device(model)
    for i, it in enumerate(items):
        if f"qa/{model_name}/{it.task}/{i}" in skip:
            continue
        marker = "\n\nAnswer the question" if "\n\nAnswer the question" in it.prompt else "\nQuestion:"
        tail = question_tail_tokens(tokenizer, it.prompt, marker=marker)  # instruction + question (few-shot: question)
        recs = []
        for name, pattern in methods.items():
            if getattr(pattern, "dense_tail", None) == "question":
                pattern.question_tokens = tail
            t0 = time.perf_counter()
            with use_pattern(model, pattern, layers) if pattern is not None else nullcontext():
                said, nll = ask(model, tokenizer, it.prompt, " " + it.answers[0], Full(), chunk_size=it.tokens + 8,
                                max_new_tokens=max_new_tokens)
            config = {"model": model_name, "task": it.task, "prompt_tokens": it.tokens, "question_tokens": tail,
                      "pattern": repr(pattern) if pattern is not None else "dense",
                      "seconds": round(time.perf_counter() - t0, 3)}
            config |= _pattern_settings(pattern)
            for metric, value in (("f1", qa_f1(said, it.answers)), ("answer_nll", nll)):
                recs.append(record(f"qa/{model_name}/{it.task}/{i}", name, metric, float(value), config=config,
                                   device=device, output=said, target=it.answers[0]))
        out += recs
        if sink is not None:
            sink(recs)
    return out


# ================================================================================================
# Cost: prefill latency / peak memory (Tables 2-3), decode latency / memory per token (Fig. 7-10)
# ================================================================================================
MODEL_SHAPES = {  # random-weight Gemma3 text models of the released shapes (config.json), and tiny ones;
    # "gemma2-2b-global": Gemma2-2b's dimensions with every layer global (the paper's Gemma2 setting, where DHSA runs
    # in every layer; Gemma2's own local layers alternate with global ones), built as a Gemma3 text model
    "gemma3-270m": dict(hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
                        num_key_value_heads=1, head_dim=256, sliding_window=512),
    "gemma3-1b": dict(hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
                      num_key_value_heads=1, head_dim=256, sliding_window=512),
    "gemma2-2b-global": dict(hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
                             num_key_value_heads=4, head_dim=256, sliding_window=4096, global_every=1),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                 num_key_value_heads=1, head_dim=16, sliding_window=32),
    "tiny-global": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, sliding_window=32, global_every=1),
}


def random_model(shape: str, *, attn_implementation: str = "sdpa", device=None, dtype=None, seed: int = 0):
    """A Gemma3 text model of ``shape`` (:data:`MODEL_SHAPES`; local layers with global every sixth, as
    Gemma3, or every layer global where the shape says ``global_every=1``) with random weights, kvlab attached, in eval mode; ``attn_implementation`` ``"sdpa" | "eager"``
    is what dense attention runs."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from kvlab.core import attach

    check_choice("shape", shape, tuple(MODEL_SHAPES))
    check_choice("attn_implementation", attn_implementation, ("sdpa", "eager"))
    dims = dict(MODEL_SHAPES[shape])
    every = dims.pop("global_every", 6)
    layers = ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(dims["num_hidden_layers"])]
    cfg = Gemma3TextConfig(vocab_size=96 if shape.startswith("tiny") else 32000, max_position_embeddings=131072,
                           layer_types=layers, **dims)
    cfg._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    return attach(Gemma3ForCausalLM(cfg).to(device, dtype).eval())


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
        synchronize(device)
        t0 = time.perf_counter()
        run()
        synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return {"ms": statistics.median(times), "peak_bytes": peak_bytes(run, device) if memory else None}


@torch.no_grad()
def decode_cost(model, ids: torch.Tensor, policy, pattern=None, layers=None, *, steps: int = 16) -> dict:
    """Greedy decoding of ``steps`` tokens after a one-piece prefill of ``ids`` ``(1, n)``, timed per token.

    ``policy``: the KV policy of the cache (``Full``, ``StreamingLLM``, ``H2O``, ``DHSADecode``);
    ``pattern`` in ``layers``: the attention of prefill and decode (a DHSA pattern applies App. A's
    decode rule to each new token). Returns ``{"prefill_ms", "step_ms": [...], "cache_bytes": [...],
    "peak_bytes": [...] | None}`` per generated token: wall time, bytes the cache holds after the step, and
    (CUDA) the most bytes allocated during the step above what was allocated before decoding; on CUDA also
    ``"prefill_peak_bytes"`` (the allocator's peak during the prefill, everything allocated included) and
    ``"decode_base_bytes"`` (what was allocated when decoding began: the weights and the filled cache).
    """
    from kvlab.core import KVCache

    check_int("steps", steps, 1)
    device = next(model.parameters()).device
    ids = ids.to(device)
    cuda = device.type == "cuda"
    out = {"step_ms": [], "cache_bytes": [], "peak_bytes": [] if cuda else None}
    with use_pattern(model, pattern, layers) if pattern is not None else nullcontext():
        cache = KVCache(model, policy)
        synchronize(device)
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        synchronize(device)
        out["prefill_ms"] = (time.perf_counter() - t0) * 1e3
        base = torch.cuda.memory_allocated(device) if cuda else 0
        if cuda:
            out["prefill_peak_bytes"], out["decode_base_bytes"] = torch.cuda.max_memory_allocated(device), base
        for _ in range(steps):
            token = logits[:, -1].argmax(-1, keepdim=True)
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            t0 = time.perf_counter()
            logits = model(input_ids=token, past_key_values=cache, use_cache=True).logits
            synchronize(device)
            out["step_ms"].append((time.perf_counter() - t0) * 1e3)
            out["cache_bytes"].append(cache.trace.nbytes[-1])
            if cuda:
                out["peak_bytes"].append(torch.cuda.max_memory_allocated(device) - base)
    return out


# ================================================================================================
# Command line: the needle grid under both protocols, per-example records
# ================================================================================================
def needle_methods(budgets, *, predictor=None, chunk_size: int = 32, initial: int = 4,
                   authors_initial: int = 128, authors_local: int = 128, query_block: int = 128,
                   protocols=("app_a", "authors"), baselines=("dense", "block-sparse"), backend: str = "sdpa",
                   nms_window: int = 8, suffix: str = "", newlines: bool = False) -> dict:
    """The methods of the needle grid, each with its control under the same protocol:

    * ``"dense"``;
    * ``"app_a"`` (the text, :class:`~kvlab.dhsa.pattern.DHSAPattern`'s default): ``"DHSA app_a {budget}"``
      and, with ``"block-sparse"`` in ``baselines``, ``"block-sparse {budget}"`` (fixed chunks, mean pooling);
    * ``"authors"`` (:func:`~kvlab.dhsa.pattern.authors_pattern`: fixed query blocks of ``query_block``,
      ``authors_initial`` + ``authors_local`` always-kept keys, heads shared, dense question and decode):
      ``"DHSA authors {budget}"`` with the chunks as predicted (no cut, as their code) and, with
      ``"block-sparse"``, ``"block-sparse authors {budget}"``: the same protocol with fixed key chunks of
      ``query_block`` tokens (one change: the chunking).

    DHSA uses ``predictor``'s chunks (the oracle's when None); under the text they are cut at
    ``max_len = min(2 chunk_size, budget - initial)`` (a query keeps its own chunk). ``nms_window``: App. B's NMS distance (0: none); ``suffix`` is
    appended to the DHSA method names (an ablation's label, e.g. ``" nms64"``); ``newlines``: DHSA also cuts
    after every newline token (App. B)."""
    from kvlab.dhsa.pattern import DHSAPattern, authors_pattern, block_sparse_pattern

    out = {"dense": None} if "dense" in baselines else {}
    chunking = "predictor" if predictor is not None else "oracle"
    for nb in budgets:
        for proto in protocols:
            if proto == "app_a":
                if "block-sparse" in baselines:
                    out[f"block-sparse {nb}"] = block_sparse_pattern(nb, chunk_size, initial=initial,
                                                                     backend=backend)
                out[f"DHSA app_a {nb}{suffix}"] = DHSAPattern(
                    nb, name=f"DHSA app_a {nb}{suffix}", chunking=chunking, predictor=predictor,
                    chunk_size=chunk_size, initial=initial, max_len=max(1, min(2 * chunk_size, nb - initial)),
                    backend=backend, nms_window=nms_window, newlines=newlines)
            elif proto == "authors":
                kw = dict(chunk_size=query_block, initial=authors_initial, local=authors_local,
                          query_block=query_block)
                if "block-sparse" in baselines:
                    out[f"block-sparse authors {nb}"] = authors_pattern(
                        nb, chunking="fixed", name=f"block-sparse authors {nb}", **kw)
                out[f"DHSA authors {nb}{suffix}"] = authors_pattern(
                    nb, chunking=chunking, predictor=predictor, name=f"DHSA authors {nb}{suffix}",
                    max_len=0, nms_window=nms_window, newlines=newlines, **kw)
            else:
                raise ValueError(f"protocols are 'app_a' and 'authors', got {proto!r}")
    return out


def _accuracy(records: list[dict], method: str, metric: str = "needle_recall"):
    """(mean, n, low, high): the mean of ``metric`` of ``method`` with its 95 % bootstrap interval."""
    from kvlab.eval.stats import paired_bootstrap

    v = [r["value"] for r in records if r["method"] == method and r["metric"] == metric]
    if not v:
        return None, 0, None, None
    iv = paired_bootstrap(v)
    return iv.estimate, len(v), iv.low, iv.high


def table2_accuracy(table: dict, records: list[dict]) -> dict:
    """``table`` (a ``table2`` JSON) with its accuracy columns recomputed from ``records`` (e.g. the needle
    grid's files once all are in)."""
    rows = []
    for r in table["rows"]:
        acc, k, low, high = _accuracy(records, r["accuracy_of"])
        rows.append(r | {"needle_recall": acc, "n": k, "ci_low": low, "ci_high": high})
    return table | {"rows": rows}


def table2_markdown(meta: dict, rows: list[dict]) -> str:
    """The Markdown of a ``table2`` run: method [backend] | ms | peak GiB | needle recall | n | 95 % CI."""
    lines = [f"# DHSA Table 2 analogue: {meta['model']}, {rows[0]['tokens']} tokens, {meta['device']}", "",
             f"`{meta['command']}`", "",
             "Latency: median of one prefill (no cache, last logits only); peak memory above the weights; needle "
             "recall of the same method and budget (mean over the needle file's prompts, 95 % bootstrap interval). "
             "Backends keep the same keys (tests), so the accuracy column is the method's whatever its backend.", "",
             "| method [backend] | ms | peak GiB | needle recall | n | 95 % CI |", "|---|---|---|---|---|---|"]
    for r in rows:
        acc = "-" if r["needle_recall"] is None else f"{r['needle_recall']:.3f}"
        ci = "-" if r["ci_low"] is None else f"[{r['ci_low']:.2f}, {r['ci_high']:.2f}]"
        lines.append(f"| {r['method']} | {r['ms']:.1f} | {(r['peak_bytes'] or 0) / 2**30:.2f} | {acc} | {r['n']} | "
                     f"{ci} |")
    return "\n".join(lines) + "\n"
