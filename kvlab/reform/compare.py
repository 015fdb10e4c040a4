"""REFORM against the baselines at an equal cache budget, on the same long-input tasks (Tables 1, 5, 6a).

Every method answers from at most ``budget`` context entries per layer (plus the question and the answer
it generates):

=================  ===================================================================================
``reform``         compress (budget ``budget``), gather ``budget`` context tokens, recompute, answer
``truncation``     the first and last ``budget / 2`` context tokens, full attention (the paper's "drop the
                   middle")
``streamingllm``   :class:`kvlab.baselines.StreamingLLM` (``n_initial`` sinks + window), streamed in chunks
``h2o``            :class:`kvlab.baselines.H2O` (``n_recent`` recent), streamed in chunks; its scores add up
                   the attention of every query of every chunk (kvlab's H2O)
``compress_only``  REFORM's own recurrent compression through **all** layers, answering from the compressed
                   cache: no gather, no recompute (an InfiniPot-like recurrent baseline and REFORM's "no
                   gather / no recompute" ablation; InfiniPot's CaP and NuC scores are not implemented: it
                   uses the H2O scores of the last queries of each chunk)
``rag``            order-preserving RAG (OP-RAG, App. C.4): 128-token chunks, each encoded alone by the model
                   itself, mean-pooled hidden states of layer ``rag_layer`` (reading: "the model's own
                   hidden states" is the middle layer by default); the question encoded the same way; the most
                   similar chunks up to ``budget`` tokens, kept in input order
=================  ===================================================================================

Each method gives a greedy answer (``correct``: the first 16 characters of the reference answer occur in
it: a short answer whole, the first two groups of a UUID, which needs more tokens than a short generation
holds) and the
teacher-forced NLL of the reference answer (nats/token), the proxy that separates methods when a small
model rarely answers exactly.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass
from typing import Any, Iterable

import torch
import torch.nn.functional as F

from kvlab.core import KVCache, check_choice, check_int
from kvlab.reform.api import load_heads, reform_gather
from kvlab.reform.reference import CompressedCache, _decoder, chunk_spans, forward_chunk

__all__ = ["METHODS", "MethodResult", "run_method", "compare", "summarise", "truncation_ids", "rag_ids"]

METHODS = ("reform", "truncation", "streamingllm", "h2o", "compress_only", "rag")


@dataclass
class MethodResult:
    method: str
    task: str
    text: str
    answer: str
    correct: bool
    answer_nll: float
    seconds: float
    context_tokens: int
    extra: dict[str, Any]


# --------------------------------------------------------------------------- answering from ids / caches


def _is_correct(text: str, answer: str) -> bool:
    """The reference answer's first 16 characters (all of a short answer; two groups of a UUID, which takes
    more tokens than a short generation holds) occur in the generated text, case aside."""
    return answer.strip()[:16].lower() in text.lower()


@torch.no_grad()
def _answer_with_cache(model, tokenizer, ids: torch.Tensor, target: torch.Tensor, cache, chunk_size: int,
                       max_new_tokens: int) -> tuple[str, float]:
    """Stream ``ids`` through ``cache`` (a KVCache, or None for a plain prompt); greedy answer and NLL."""
    logits = None
    kwargs = {} if cache is None else {"past_key_values": cache}
    if cache is None:
        out = model(input_ids=ids, use_cache=True)
        logits, cache = out.logits[:, -1], out.past_key_values
        kwargs = {"past_key_values": cache}
    else:
        for s, e in chunk_spans(ids.shape[1], chunk_size):
            logits = model(input_ids=ids[:, s:e], use_cache=True, **kwargs).logits[:, -1]
    forked = copy.deepcopy(cache)
    nll = -float(torch.log_softmax(logits.float(), dim=-1)[0, target[0, 0]])
    if target.shape[1] > 1:
        out = model(input_ids=target[:, :-1], past_key_values=forked, use_cache=True).logits[0].float()
        nll += float(F.cross_entropy(out, target[0, 1:], reduction="sum"))
    nll /= target.shape[1]
    return _greedy(tokenizer, logits, lambda t: model(input_ids=t, use_cache=True, **kwargs).logits[:, -1],
                   max_new_tokens), nll


def _greedy(tokenizer, logits, step, max_new_tokens: int) -> str:
    generated = []
    token = logits.argmax(dim=-1, keepdim=True)
    eos = getattr(tokenizer, "eos_token_id", None)
    for _ in range(max_new_tokens):
        if eos is not None and int(token) == eos:
            break
        generated.append(int(token))
        if "\n" in tokenizer.decode(generated).lstrip():
            break
        token = step(token).argmax(dim=-1, keepdim=True)
    return tokenizer.decode(generated, skip_special_tokens=True)


class _Discard:
    """An embeddings sink that keeps nothing (compress-only forwarding)."""

    def save(self, *args) -> None:
        pass

    def end_chunk(self) -> None:
        pass


@torch.no_grad()
def _answer_compressed(model, tokenizer, context_ids, query_ids, target, *, chunk_size, budget, n_initial,
                       n_recent, max_new_tokens) -> tuple[str, float, int]:
    """Recurrent compression through every layer, then answer from the compressed cache."""
    inner = _decoder(model)
    layers = len(inner.layers)
    cache = CompressedCache(layers)
    settings = dict(early_exit_layer=layers, budget=budget, n_initial=n_initial, n_recent=n_recent)

    state = {"cache": cache, "next": 0}  # the cache in use and the input index of the next token

    def run(ids, compress=False):
        hs = forward_chunk(model, ids, state["cache"], _Discard(), chunk_start=state["next"], compress=compress,
                           **settings)
        state["next"] += ids.shape[1]
        return model.lm_head(inner.norm(hs[:, -1:]))[:, -1]

    for s, e in chunk_spans(context_ids.shape[1], chunk_size):
        run(context_ids[:, s:e], compress=True)
    held = cache.size
    logits = run(query_ids)
    saved = copy.deepcopy(state)
    nll = -float(torch.log_softmax(logits.float(), dim=-1)[0, target[0, 0]])
    for i in range(1, target.shape[1]):  # token by token, the decoding path
        nll -= float(torch.log_softmax(run(target[:, i - 1:i]).float(), dim=-1)[0, target[0, i]])
    nll /= target.shape[1]
    state.update(saved)
    text = _greedy(tokenizer, logits, run, max_new_tokens)
    return text, nll, held


# --------------------------------------------------------------------------- what each method reads


def truncation_ids(context_ids: torch.Tensor, budget: int) -> torch.Tensor:
    """The first ``ceil(budget/2)`` and last ``floor(budget/2)`` context tokens (drop the middle)."""
    n = context_ids.shape[1]
    if n <= budget:
        return context_ids
    head = budget - budget // 2
    return torch.cat([context_ids[:, :head], context_ids[:, n - budget // 2:]], dim=1)


@torch.no_grad()
def _mean_pooled(model, ids: torch.Tensor, layer: int, batch: int = 16) -> torch.Tensor:
    """``(rows, hidden)`` mean of layer ``layer``'s hidden states over each row's tokens (rows of equal length)."""
    out = []
    for s in range(0, ids.shape[0], batch):
        hs = model(input_ids=ids[s:s + batch], output_hidden_states=True, use_cache=False).hidden_states[layer]
        out.append(hs.float().mean(dim=1))
    return torch.cat(out)


@torch.no_grad()
def rag_ids(model, context_ids: torch.Tensor, query_ids: torch.Tensor, budget: int, *, chunk: int = 128,
            layer: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """OP-RAG with the model as its own dense retriever: ``(selected context ids (1, m), chosen chunk indices)``.

    Chunks of ``chunk`` tokens are encoded independently (mean of ``hidden_states[layer]``), the question
    too; cosine similarity; the best chunks until ``budget`` tokens; input order preserved (OP-RAG)."""
    n = context_ids.shape[1]
    layer = _decoder(model).config.num_hidden_layers // 2 if layer is None else layer
    full = n // chunk
    rows = []
    if full:
        rows.append(_mean_pooled(model, context_ids[0, :full * chunk].view(full, chunk), layer))
    if n % chunk:
        rows.append(_mean_pooled(model, context_ids[:, full * chunk:], layer))
    emb = F.normalize(torch.cat(rows), dim=-1)
    q = F.normalize(_mean_pooled(model, query_ids, layer), dim=-1)
    order = (emb @ q[0]).argsort(descending=True)
    spans = chunk_spans(n, chunk)
    chosen, total = [], 0
    for i in order.tolist():
        size = spans[i][1] - spans[i][0]
        if total + size > budget:
            continue
        chosen.append(i)
        total += size
    chosen.sort()
    ids = torch.cat([context_ids[:, spans[i][0]:spans[i][1]] for i in chosen], dim=1)
    return ids, torch.tensor(chosen)


# --------------------------------------------------------------------------- the harness


@torch.no_grad()
def run_method(method: str, model, tokenizer, task, *, budget: int, chunk_size: int, n_initial: int = 16,
               n_recent: int = 64, n_final: int = 64, heads: Any = None, early_exit_layer: int | None = None,
               max_new_tokens: int = 24, rag_layer: int | None = None, pool: int = 129) -> MethodResult:
    """Answer one :class:`kvlab.reform.tasks.LongTask` with ``method`` at cache budget ``budget``."""
    check_choice("method", method, METHODS)
    check_int("budget", budget, 1)
    check_int("chunk_size", chunk_size, 1)
    device = next(model.parameters()).device
    context_ids = tokenizer(task.context, return_tensors="pt").input_ids.to(device)
    query_ids = tokenizer(task.query + task.answer_prefix, return_tensors="pt",
                          add_special_tokens=False).input_ids.to(device)
    question_ids = tokenizer(task.query, return_tensors="pt", add_special_tokens=False).input_ids.to(device)
    target = tokenizer(task.answer, return_tensors="pt", add_special_tokens=False).input_ids.to(device)
    begin = time.perf_counter()
    extra: dict[str, Any] = {}
    if method == "reform":
        out = reform_gather(model, tokenizer, task.context, task.query, answer_prefix=task.answer_prefix,
                            chunk_size=chunk_size, budget=budget, early_exit_layer=early_exit_layer, heads=heads,
                            recompute_budget=budget, n_initial=n_initial, n_recent=n_recent, n_final=n_final,
                            pool=pool, progress=False)
        text, nll = _answer_with_cache(model, tokenizer, out.input_ids, target, None, chunk_size, max_new_tokens)
        gold = task.gold_tokens(tokenizer)
        extra = {"gathered": int(out.gathered.numel()),
                 "evidence_recall": float(gold[out.gathered].sum() / gold.sum().clamp(min=1)),
                 "cache_peak_bytes": out.stats["cache_peak_bytes"]}
    elif method == "truncation":
        ids = torch.cat([truncation_ids(context_ids, budget), query_ids], dim=1)
        text, nll = _answer_with_cache(model, tokenizer, ids, target, None, chunk_size, max_new_tokens)
    elif method in ("streamingllm", "h2o"):
        from kvlab.baselines import H2O, StreamingLLM

        policy = (StreamingLLM(sink=n_initial, window=budget - n_initial) if method == "streamingllm"
                  else H2O(budget, recent=n_recent))
        ids = torch.cat([context_ids, query_ids], dim=1)
        text, nll = _answer_with_cache(model, tokenizer, ids, target, KVCache(model, policy), chunk_size,
                                       max_new_tokens)
    elif method == "compress_only":
        text, nll, held = _answer_compressed(model, tokenizer, context_ids, query_ids, target, chunk_size=chunk_size,
                                             budget=budget, n_initial=n_initial, n_recent=n_recent,
                                             max_new_tokens=max_new_tokens)
        extra = {"held": held}
    else:  # rag
        ids, chosen = rag_ids(model, context_ids, question_ids, budget, layer=rag_layer)
        text, nll = _answer_with_cache(model, tokenizer, torch.cat([ids, query_ids], dim=1), target, None,
                                       chunk_size, max_new_tokens)
        extra = {"chunks": len(chosen)}
    return MethodResult(method, task.kind, text, task.answer, _is_correct(text, task.answer), nll,
                        time.perf_counter() - begin, int(context_ids.shape[1]), extra)


def compare(model, tokenizer, tasks: Iterable, methods: Iterable[str] = METHODS, *, progress: bool = False,
            **settings) -> list[MethodResult]:
    """Every method on every task (same settings); see :func:`run_method` for ``settings``."""
    tasks, methods = list(tasks), list(methods)
    for m in methods:
        check_choice("methods", m, METHODS)
    if settings.get("heads") is not None or "reform" in methods:
        settings["heads"] = load_heads(settings.get("heads"), model)
    pairs = [(t, m) for t in tasks for m in methods]
    if progress:
        from tqdm.auto import tqdm

        pairs = tqdm(pairs, desc="methods x tasks")
    return [run_method(m, model, tokenizer, t, **settings) for t, m in pairs]


def summarise(results: Iterable[MethodResult]) -> dict[str, dict[str, float]]:
    """Per method: accuracy (%), mean answer NLL, mean seconds, examples."""
    table: dict[str, dict[str, float]] = {}
    for r in results:
        row = table.setdefault(r.method, {"accuracy": 0.0, "answer_nll": 0.0, "seconds": 0.0, "examples": 0})
        row["accuracy"] += 100.0 * r.correct
        row["answer_nll"] += r.answer_nll
        row["seconds"] += r.seconds
        row["examples"] += 1
    for row in table.values():
        for k in ("accuracy", "answer_nll", "seconds"):
            row[k] = round(row[k] / row["examples"], 3)
    return table


def as_dicts(results: Iterable[MethodResult]) -> list[dict[str, Any]]:
    return [asdict(r) for r in results]
