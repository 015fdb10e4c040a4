"""Choosing REFORM's embedding heads by Mean Normalized Rank (App. C.2, C.6, D.6; Fig. 2, Tables 2 and 7).

For every Q, K and V head of every layer (and, for Table 2, attention scores and whole hidden states) we
ask: if the context tokens were ranked by how similar they are to the question, how far down would the
evidence tokens sit? That is the Mean Normalized Rank (MNR, lower is better). The states come from
recurrent chunked forwarding with a small heavy-hitter budget (the paper: 256), exactly as REFORM will
compute them on long inputs (:func:`kvlab.reform.reference.forward_chunk`, all layers, no early exit).

Pseudocode of one example::

    states <- recurrent chunked forwarding of context + question, every layer's input and output saved
    for each layer, each kind in (q, k, v), each head:
        e <- L2-normalised head states of every token
        s[t] <- max over question tokens u of e[t] . e[u]            (cosine)
        MNR <- mean over evidence tokens of rank(mean-pool_20(s))[t] / n     (App. C.2)
    attention (Table 2): s[t] <- max_u q_h[u] . k_g(h)[t] (pre-RoPE);  hidden states: cosine of layer outputs

Choice (App. C.6): two heads with the best MNR on key-value retrieval ("pattern matching") and two with
the best MNR on multi-hop QA, from layers below 70% of the depth, all distinct; the early-exit layer is one
above the highest. reading: the paper states the 70% cap for the pattern-matching heads; every head it lists
lies below 70% (e.g. Mistral-NeMo: layers 15-27 of 40), so we cap both.

Command::

    python -m kvlab.reform.heads --model smollm2-135m --out heads.json [--samples 20 --tokens 2048]

writes the chosen heads and the MNR grids (Fig. 2) and Best-3 table (Tables 2/7) to a small JSON file that
``reform_generate(..., heads="heads.json")`` reads.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterable

import torch
import torch.nn.functional as F

from kvlab.core import check_float, check_int
from kvlab.reform.reference import (HEAD_KINDS, CompressedCache, Head, StateRecorder, decoder_of, chunk_spans,
                                    forward_chunk, head_states, mean_normalised_rank)

__all__ = ["SCORE_KINDS", "MNRResult", "collect_states", "retrieval_scores", "task_mnr", "mnr_over_tasks",
           "choose_heads", "best3_table", "choose_heads_for_model", "worst_heads", "main"]

#: What Table 2 compares: attention scores, hidden states, and cosine of Q, K, V heads.
SCORE_KINDS = ("attention", "hidden", "q", "k", "v")


@dataclass
class MNRResult:
    """MNR in percent, averaged over examples: ``grids[kind]`` is ``(layers, heads)`` (``hidden``: one column)."""

    grids: dict[str, torch.Tensor]
    examples: int

    def to_json(self) -> dict[str, Any]:
        return {"examples": self.examples, "grids": {k: [[round(float(x), 3) for x in row] for row in v]
                                                     for k, v in self.grids.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "MNRResult":
        return cls({k: torch.tensor(v) for k, v in data["grids"].items()}, int(data["examples"]))


@torch.no_grad()
def collect_states(model, context_ids: torch.Tensor, query_ids: torch.Tensor, *, chunk_size: int, budget: int,
                   n_initial: int, n_recent: int, score_window: int = 128) -> StateRecorder:
    """Recurrent chunked forwarding through **all** layers, every layer's normalised input and output saved."""
    layers = len(decoder_of(model).layers)
    cache, rec = CompressedCache(layers), StateRecorder(device=context_ids.device)
    n = context_ids.shape[1]
    chunks = [(context_ids[:, s:e], s) for s, e in chunk_spans(n, chunk_size)] + [(query_ids, n)]
    for i, (ids, start) in enumerate(chunks):
        forward_chunk(model, ids, cache, rec, early_exit_layer=layers, budget=budget, n_initial=n_initial,
                      n_recent=n_recent, score_window=score_window, chunk_start=start, compress=i < len(chunks) - 1)
    return rec


@torch.no_grad()
def retrieval_scores(model, rec: StateRecorder, n_context: int, query_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Score of every context token for every candidate: ``{kind: (layers, heads, n_context)}``.

    q/k/v: cosine to the question tokens, max over them; attention: pre-RoPE ``q . k`` of a query head with
    its KV group's key head, max over question tokens; hidden: cosine of layer outputs (one "head").
    """
    layers = decoder_of(model).layers
    out: dict[str, list[torch.Tensor]] = {k: [] for k in SCORE_KINDS}
    sel = query_mask.to(rec.input(0).device)
    for idx, layer in enumerate(layers):
        x = rec.input(idx)[None].to(next(layer.parameters()).dtype)
        states = {kind: head_states(layer, x, kind)[0].float() for kind in HEAD_KINDS}  # (h, n, d)
        for kind in HEAD_KINDS:
            e = F.normalize(states[kind], dim=-1)
            sim = torch.einsum("hnd,hqd->hnq", e[:, :n_context], e[:, n_context:][:, sel])
            out[kind].append(sim.max(dim=-1).values)
        q, k = states["q"], states["k"]
        k = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0)
        dots = torch.einsum("hnd,hqd->hnq", k[:, :n_context], q[:, n_context:][:, sel])
        out["attention"].append(dots.max(dim=-1).values)
        h = F.normalize(rec.output(idx).float(), dim=-1)
        out["hidden"].append((h[:n_context] @ h[n_context:][sel].T).max(dim=-1).values[None])
    return {k: torch.stack(v).cpu() for k, v in out.items()}


def _query_mask(tokenizer, query_ids: torch.Tensor) -> torch.Tensor:
    special = set(getattr(tokenizer, "all_special_ids", []))
    return torch.tensor([int(t) not in special for t in query_ids[0]])


@torch.no_grad()
def task_mnr(model, tokenizer, task, *, chunk_size: int = 1024, budget: int = 256, n_initial: int = 16,
             n_recent: int = 64, neighbours: int = 20) -> dict[str, torch.Tensor]:
    """MNR (percent) of every candidate on one :class:`kvlab.eval.tasks.LongTask`: ``{kind: (layers, heads)}``.

    The question (``task.query``) is the similarity query; the answer prefix is left out (App. C.6)."""
    device = next(model.parameters()).device
    context_ids = tokenizer(task.context, return_tensors="pt").input_ids.to(device)
    query_ids = tokenizer(task.query, return_tensors="pt", add_special_tokens=False).input_ids.to(device)
    gold = task.gold_tokens(tokenizer)
    if gold.numel() != context_ids.shape[1]:
        raise RuntimeError("the evidence labels and the context tokens disagree in length")
    rec = collect_states(model, context_ids, query_ids, chunk_size=chunk_size, budget=budget, n_initial=n_initial,
                         n_recent=n_recent)
    scores = retrieval_scores(model, rec, context_ids.shape[1], _query_mask(tokenizer, query_ids))
    return {kind: torch.tensor([[mean_normalised_rank(s[l, h], gold, neighbours) for h in range(s.shape[1])]
                                for l in range(s.shape[0])]) for kind, s in scores.items()}


def mnr_over_tasks(model, tokenizer, tasks: Iterable, *, progress: bool = False, **settings) -> MNRResult:
    """Mean over ``tasks`` of :func:`task_mnr`."""
    tasks = list(tasks)
    if not tasks:
        raise ValueError("tasks must hold at least one example")
    iterator = tasks
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(tasks, desc=f"MNR ({tasks[0].kind})", unit="example")
    total: dict[str, torch.Tensor] = {}
    for task in iterator:
        for kind, grid in task_mnr(model, tokenizer, task, **settings).items():
            total[kind] = grid if kind not in total else total[kind] + grid
    return MNRResult({k: v / len(tasks) for k, v in total.items()}, len(tasks))


def _ranked(result: MNRResult, kinds: Iterable[str], max_layer: int) -> list[tuple[float, Head]]:
    items = []
    for kind in kinds:
        grid = result.grids[kind]
        for layer in range(min(max_layer + 1, grid.shape[0])):
            for head in range(grid.shape[1]):
                items.append((float(grid[layer, head]), Head(kind, layer, head)))
    return sorted(items, key=lambda t: (t[0], t[1]))


def choose_heads(pattern: MNRResult, multihop: MNRResult, *, n_pattern: int = 2, n_multihop: int = 2,
                 max_depth: float = 0.7) -> list[Head]:
    """The paper's choice (App. C.6): the ``n_pattern`` best Q/K/V heads on key-value retrieval and the
    ``n_multihop`` best on multi-hop QA, from layers below ``max_depth`` of the depth, all distinct."""
    check_float("max_depth", max_depth, 0.0, 1.0, low_open=True)
    layers = pattern.grids["v"].shape[0]
    max_layer = max(0, int(max_depth * layers) - (1 if (max_depth * layers).is_integer() else 0))
    chosen: list[Head] = []
    for result, count in ((pattern, n_pattern), (multihop, n_multihop)):
        for _, head in _ranked(result, HEAD_KINDS, max_layer):
            if count == 0:
                break
            if head not in chosen:
                chosen.append(head)
                count -= 1
    return chosen


def best3_table(result: MNRResult) -> dict[str, list[float]]:
    """Tables 2/7: for each kind the three lowest MNR and their mean (``[top1, top2, top3, avg]``)."""
    table = {}
    for kind in SCORE_KINDS:
        best = result.grids[kind].flatten().sort().values[:3].tolist()
        table[kind] = [round(x, 2) for x in best] + [round(sum(best) / len(best), 2)]
    return table


def choose_heads_for_model(model, tokenizer, *, samples: int = 8, tokens: int = 2048, seed: int = 0,
                           chunk_size: int = 1024, budget: int = 256, n_initial: int = 16, n_recent: int = 64,
                           max_depth: float = 0.7, progress: bool = False,
                           tasks: tuple | None = None) -> dict[str, Any]:
    """Build both synthetic sets (or take ``tasks = (kv_tasks, multihop_tasks)``), measure MNR, choose heads;
    returns the heads-file content (a dict)."""
    from kvlab.reform.api import model_signature
    from kvlab.eval.tasks import kv_task, multihop_task

    samples = check_int("samples", samples, 1)
    tokens = check_int("tokens", tokens, 256)
    settings = dict(chunk_size=check_int("chunk_size", chunk_size, 1), budget=check_int("budget", budget, 1),
                    n_initial=n_initial, n_recent=n_recent)
    if budget <= n_initial + n_recent:
        raise ValueError(f"budget ({budget}) must be larger than n_initial + n_recent ({n_initial + n_recent})")
    begin = time.perf_counter()
    if tasks is None:
        tasks = ([kv_task(tokenizer, tokens, seed=seed + i) for i in range(samples)],
                 [multihop_task(tokenizer, tokens, seed=seed + i) for i in range(samples)])
    kv, qa = tasks
    pattern = mnr_over_tasks(model, tokenizer, kv, progress=progress, **settings)
    multihop = mnr_over_tasks(model, tokenizer, qa, progress=progress, **settings)
    heads = choose_heads(pattern, multihop, max_depth=max_depth)
    return {
        "signature": model_signature(model),
        "heads": [str(h) for h in heads],
        "early_exit_layer": max(h.layer for h in heads) + 1,
        "selection": {"pattern_matching": [str(h) for h in heads[:2]], "multihop_qa": [str(h) for h in heads[2:]],
                      "max_depth": max_depth},
        "settings": {"samples": [len(kv), len(qa)], "tokens": tokens, "seed": seed, **settings, "neighbours": 20},
        "table": {"pattern_matching": best3_table(pattern), "multihop_qa": best3_table(multihop)},
        "mnr": {"pattern_matching": pattern.to_json(), "multihop_qa": multihop.to_json()},
        "seconds": round(time.perf_counter() - begin, 1),
        "device": torch.cuda.get_device_name() if next(model.parameters()).is_cuda else "cpu",
    }


def worst_heads(data: dict[str, Any], count: int = 4, max_depth: float = 0.7) -> list[Head]:
    """The ``count`` Q/K/V heads below ``max_depth`` with the highest MNR summed over both sets (App. D.4's
    "worst heads" ablation), from a heads-file dict."""
    grids = [MNRResult.from_json(data["mnr"][t]) for t in ("pattern_matching", "multihop_qa")]
    layers = grids[0].grids["v"].shape[0]
    items = []
    for kind in HEAD_KINDS:
        total = grids[0].grids[kind] + grids[1].grids[kind]
        for layer in range(int(max_depth * layers)):
            for head in range(total.shape[1]):
                items.append((-float(total[layer, head]), Head(kind, layer, head)))
    return [h for _, h in sorted(items)[:count]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvlab.reform.heads",
                                     description="Choose REFORM's embedding heads by Mean Normalized Rank "
                                                 "(App. C.2) and write them to a JSON file.")
    parser.add_argument("--model", default="smollm2-135m", help="kvlab model id or path (default smollm2-135m)")
    parser.add_argument("--out", required=True, help="JSON file to write (heads, MNR grids, Best-3 table)")
    parser.add_argument("--samples", type=int, default=8, help="examples per synthetic set (paper: 500)")
    parser.add_argument("--tokens", type=int, default=2048, help="tokens per example (paper: 8k)")
    parser.add_argument("--chunk-size", type=int, default=1024, help="tokens per chunk of recurrent forwarding")
    parser.add_argument("--budget", type=int, default=256, help="heavy-hitter budget (paper: 256)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: the model loader's)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from kvlab.models import load_model

    model, tokenizer = load_model(args.model, device=args.device, dtype=args.dtype)
    data = choose_heads_for_model(model, tokenizer, samples=args.samples, tokens=args.tokens, seed=args.seed,
                                  chunk_size=args.chunk_size, budget=args.budget, progress=True)
    data = {"model": args.model, **data, "command": "python -m kvlab.reform.heads " + " ".join(
        sys.argv[1:] if argv is None else argv)}
    with open(args.out, "w") as f:
        json.dump(data, f, indent=1)
    print(f"heads {data['heads']} (early exit at layer {data['early_exit_layer']}) -> {args.out}")
    for task, table in data["table"].items():
        print(f"Best-3 MNR, {task}: " + "; ".join(f"{k} {v}" for k, v in table.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
