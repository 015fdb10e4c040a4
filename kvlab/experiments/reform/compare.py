"""REFORM against the baselines at an equal cache budget, on the same long-input tasks (Tables 1, 5, 6a).

Every method answers from at most ``budget`` context entries per layer (plus the question and the answer
it generates):

=================  ===================================================================================
``reform``         compress (budget ``budget``), gather ``budget`` context tokens, recompute, answer
``truncation``     the first and last ``budget / 2`` context tokens, full attention (the paper's "drop the
                   middle")
``streamingllm``   :class:`kvlab.baselines.StreamingLLM` (``n_initial`` sinks + window), streamed in chunks
``h2o``            :class:`kvlab.baselines.H2O`, streamed in chunks; its scores add up the attention of every
                   query of every chunk (kvlab's H2O)
``tova``           :class:`kvlab.baselines.TOVA` (the entries the newest query attends to most), streamed in chunks
``compress_only``  REFORM's own recurrent compression through **all** layers, answering from the compressed
                   cache: no gather, no recompute (REFORM's "no gather, no recompute" ablation)
``infinipot``      InfiniPot (Kim et al., 2024) as :func:`infinipot_keep` reads it: recurrent compression through
                   all layers, each chunk scored by CaP (attention from a catalyst prompt) and NuC (novelty:
                   the token's surprisal), positions kept consecutive
``rag``            order-preserving RAG (OP-RAG, App. C.4): 128-token chunks, each encoded alone by the model
                   itself, mean-pooled hidden states of layer ``rag_layer`` (reading: "the model's own
                   hidden states" is the middle layer by default); the question encoded the same way; the most
                   similar chunks up to ``budget`` tokens, kept in input order
``rag_bm25``       the same OP-RAG with BM25 (``rank_bm25.BM25Okapi``, k1 = 1.5, b = 0.75) over the chunks' words
``reform_no_gather``  REFORM's compression, then the tokens the compressed cache holds (last layer below the exit)
                   recomputed instead of the gathered ones (Table 6a-style ablation; ``reform`` minus the search)
=================  ===================================================================================

Every eviction baseline keeps the same ``n_initial`` initial and ``n_recent`` recent entries, and the question
(REFORM App. C.3: "initial and recent 256 tokens for all baselines"): :func:`baseline_policy` wraps H2O and TOVA
in :class:`KeepInitialRecent`, which also keeps every token of the question (and answer prefix), so no method
can evict the question it must answer (StreamingLLM's window and InfiniPot's rule keep them by construction).

Each method gives a greedy answer of ``max_new_tokens`` tokens, generated as RULER does
(:func:`kvlab.eval.retrieval.greedy_answer`: no stop at a newline), its ``score`` (:func:`task_score`: RULER's
``string_match_all`` for multi-answer tasks, RepoEval's edit similarity for code; otherwise 1 when the first 16
characters of the reference answer occur in it: a short answer whole, the first two groups of a UUID;
``correct`` is ``score == 1``) and the teacher-forced NLL of the reference answer (nats/token), the proxy that
separates methods when a small model rarely answers exactly.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import asdict, dataclass
from typing import Any, Iterable

import torch
import torch.nn.functional as F

from kvlab.core import KVCache, LayerView, Policy, check_choice, check_int
from kvlab.eval.retrieval import greedy_answer
from kvlab.eval.tasks import task_score
from kvlab.reform.api import load_heads, reform_gather
from kvlab.reform.reference import (CompressedCache, decoder_of, query_states, rope_at, sliding_window_of, chunk_spans,
                                   forward_chunk, h2o_scores)

__all__ = ["METHODS", "MethodResult", "run_method", "compare", "summarise", "truncation_ids", "rag_ids", "bm25_ids",
           "infinipot_keep", "CATALYST_PROMPT", "KeepInitialRecent", "baseline_policy"]

METHODS = ("reform", "truncation", "streamingllm", "h2o", "tova", "compress_only", "infinipot", "rag", "rag_bm25",
           "reform_no_gather")


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
    score: float = 0.0
    example: str = ""  # a stable id of the task (kind, length, seed), set by the table runners


# --------------------------------------------------------------------------- answering from ids / caches


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


#: RULER's generation loop, shared by every retrieval harness of kvlab (no stop at a newline)
_greedy = greedy_answer


class _Discard:
    """An embeddings sink that keeps nothing (compress-only forwarding)."""

    def save(self, *args) -> None:
        pass

    def end_chunk(self) -> None:
        pass


class _Recurrent:
    """A compressed cache run through **every** layer: ``step(ids)`` appends tokens, returns the last logits."""

    def __init__(self, model, cache: CompressedCache, next_index: int, settings: dict):
        self.model, self.cache, self.next, self.settings = model, cache, next_index, settings

    def step(self, ids: torch.Tensor, compress: bool = False) -> torch.Tensor:
        inner = decoder_of(self.model)
        hs = forward_chunk(self.model, ids, self.cache, _Discard(), chunk_start=self.next, compress=compress,
                           **self.settings)
        self.next += ids.shape[1]
        return self.model.lm_head(inner.norm(hs[:, -1:]))[:, -1]

    def answer(self, tokenizer, query_ids, target, max_new_tokens: int) -> tuple[str, float]:
        """Greedy answer and teacher-forced NLL of ``target`` (token by token, the decoding path)."""
        logits = self.step(query_ids)
        saved = (copy.deepcopy(self.cache), self.next)
        nll = -float(torch.log_softmax(logits.float(), dim=-1)[0, target[0, 0]])
        for i in range(1, target.shape[1]):
            nll -= float(torch.log_softmax(self.step(target[:, i - 1:i]).float(), dim=-1)[0, target[0, i]])
        self.cache, self.next = saved
        return _greedy(tokenizer, logits, self.step, max_new_tokens), nll / target.shape[1]


@torch.no_grad()
def _answer_compressed(model, tokenizer, context_ids, query_ids, target, *, chunk_size, budget, n_initial,
                       n_recent, max_new_tokens) -> tuple[str, float, int]:
    """Recurrent compression through every layer, then answer from the compressed cache."""
    layers = len(decoder_of(model).layers)
    run = _Recurrent(model, CompressedCache(layers), 0,
                     dict(early_exit_layer=layers, budget=budget, n_initial=n_initial, n_recent=n_recent))
    for s, e in chunk_spans(context_ids.shape[1], chunk_size):
        run.step(context_ids[:, s:e], compress=True)
    held = run.cache.size
    text, nll = run.answer(tokenizer, query_ids, target, max_new_tokens)
    return text, nll, held


# --------------------------------------------------------------------------- eviction baselines


class KeepInitialRecent(Policy):
    """``inner`` (H2O, TOVA: a score-ranked policy) made to keep, in every layer, the ``n_initial`` oldest
    entries, the ``n_recent`` newest and every entry whose stream position is in ``question = (start, end)``.

    The protected entries' scores are raised to ``+inf`` in the view the inner policy ranks, so it keeps
    them and fills the rest of its budget by its own rule (REFORM App. C.3 gives every baseline the initial
    and recent tokens). The cached scores are not changed. Raises when the protected entries exceed the
    inner policy's budget."""

    def __init__(self, inner: Policy, n_initial: int, n_recent: int, question: tuple[int, int] | None = None):
        super().__init__(inner.positions)
        self.inner = inner
        self.n_initial = check_int("n_initial", n_initial, 0)
        self.n_recent = check_int("n_recent", n_recent, 0)
        if question is not None and not 0 <= question[0] <= question[1]:
            raise ValueError(f"question must be (start, end) stream positions with 0 <= start <= end, got {question}")
        self.question = None if question is None else (int(question[0]), int(question[1]))
        self.needs_scores = inner.needs_scores
        self.batch_rows = inner.batch_rows

    @property
    def budget(self) -> int | None:
        return self.inner.budget

    def check_model(self, num_layers: int) -> None:
        self.inner.check_model(num_layers)

    def check_vocab(self, vocab_size: int) -> None:
        self.inner.check_vocab(vocab_size)

    def keep(self, view: LayerView) -> torch.Tensor | None:
        n = view.size
        if self.inner.budget is not None and n <= self.inner.budget:
            return None
        index = torch.arange(n, device=view.positions.device)
        protected = (index < self.n_initial) | (index >= n - self.n_recent)
        if self.question is not None:
            protected = protected | ((view.positions >= self.question[0]) & (view.positions < self.question[1]))
        protected = protected.expand(view.positions.shape)
        count = int(protected.sum(dim=-1).max())
        if self.inner.budget is not None and count > self.inner.budget:
            raise ValueError(f"{count} protected entries (n_initial={self.n_initial}, n_recent={self.n_recent} and "
                             f"the question at positions {self.question}) exceed the budget "
                             f"({self.inner.budget}): raise budget or lower n_initial / n_recent")

        def lifted(scores):
            return None if scores is None else scores.masked_fill(protected, float("inf"))

        return self.inner.keep(dataclasses.replace(view, scores=lifted(view.scores),
                                                   last_scores=lifted(view.last_scores)))

    def __repr__(self) -> str:
        return (f"KeepInitialRecent({self.inner!r}, n_initial={self.n_initial}, n_recent={self.n_recent}, "
                f"question={self.question})")


def baseline_policy(method: str, budget: int, n_initial: int, n_recent: int,
                    question: tuple[int, int] | None = None) -> Policy:
    """The cache policy of an eviction baseline at ``budget`` entries per layer, with the same initial /
    recent entries for all (``streamingllm``: ``n_initial`` sinks + a window of the rest; ``h2o``: H2O with
    ``n_recent`` recent entries, plus the initial ones; ``tova``: TOVA plus both), the question (stream
    positions ``question = (start, end)``) kept."""
    from kvlab.baselines import H2O, TOVA, StreamingLLM

    check_choice("method", method, ("streamingllm", "h2o", "tova"))
    if n_initial + n_recent >= budget:
        raise ValueError(f"n_initial + n_recent ({n_initial} + {n_recent}) must be smaller than budget ({budget}) "
                         "to leave room for the entries a method chooses")
    asked = 0 if question is None else question[1] - question[0]
    if n_initial + n_recent + asked >= budget:
        raise ValueError(f"n_initial + n_recent + the question's {asked} tokens ({n_initial} + {n_recent} + {asked}) "
                         f"must be smaller than budget ({budget}): raise budget or lower n_initial / n_recent")
    if method == "streamingllm":
        return StreamingLLM(sink=n_initial, window=budget - n_initial)
    inner = H2O(budget, recent=n_recent) if method == "h2o" else TOVA(budget)
    return KeepInitialRecent(inner, n_initial, n_recent, question)


# --------------------------------------------------------------------------- InfiniPot

#: reading: InfiniPot's catalyst prompt is a short generic instruction appended to the pot when it is full, whose
#: attention to the cached tokens scores them (CaP); its exact wording is not in the REFORM paper: ours.
CATALYST_PROMPT = "\n\nSummarise the text above: its key facts, names and numbers."


class _LastInputs:
    """An embeddings sink keeping each layer's normalised input of the last ``w`` tokens (the catalyst's)."""

    def __init__(self, w: int):
        self.w, self.normed = w, {}

    def save(self, layer_idx: int, layer, normed: torch.Tensor, output=None) -> None:
        self.normed[layer_idx] = normed[:, -self.w:]

    def end_chunk(self) -> None:
        pass


def infinipot_keep(cap: torch.Tensor, nuc: torch.Tensor, budget: int, n_initial: int, n_recent: int) -> torch.Tensor:
    """Entries one layer keeps (ascending, ``min(n, budget)``): initial and recent, then CaP, then NuC.

    cap ``(n,)``: attention from the catalyst prompt; nuc ``(n,)``: the token's surprisal ``-log p(x_t | x_<t)``.
    reading: half of the room between the initial and recent entries goes to the highest CaP, the other half to
    the highest NuC among the rest (InfiniPot combines both scores; how it splits them is not given in the REFORM
    paper, which only names them)."""
    n = cap.numel()
    if n <= budget:
        return torch.arange(n, device=cap.device)
    heavy = budget - n_initial - n_recent
    by_cap = cap[n_initial:n - n_recent].topk(heavy // 2).indices
    novelty = nuc[n_initial:n - n_recent].to(cap.device).clone()
    novelty[by_cap] = float("-inf")
    by_nuc = novelty.topk(heavy - heavy // 2).indices
    middle = torch.cat([by_cap, by_nuc]).sort().values + n_initial
    return torch.cat([torch.arange(n_initial, device=cap.device), middle,
                      torch.arange(n - n_recent, n, device=cap.device)])


@torch.no_grad()
def _answer_infinipot(model, tokenizer, context_ids, query_ids, target, *, chunk_size, budget, n_initial, n_recent,
                      max_new_tokens) -> tuple[str, float, int]:
    """InfiniPot: each chunk (with the catalyst prompt after it) through every layer; CaP from the catalyst's
    queries (summed over heads and catalyst tokens, as :func:`h2o_scores`), NuC from the chunk's own logits;
    the catalyst's entries dropped, then :func:`infinipot_keep` per layer, positions made consecutive."""
    inner = decoder_of(model)
    layers = len(inner.layers)
    device = context_ids.device
    catalyst = tokenizer(CATALYST_PROMPT, return_tensors="pt", add_special_tokens=False).input_ids.to(device)
    w = catalyst.shape[1]
    cache = CompressedCache(layers)
    nuc = torch.zeros(context_ids.shape[1])
    last = None  # log-probabilities after the previous chunk's last token
    for s, e in chunk_spans(context_ids.shape[1], chunk_size):
        ids = context_ids[:, s:e]
        sink = _LastInputs(w)
        hs = forward_chunk(model, torch.cat([ids, catalyst], dim=1), cache, sink, early_exit_layer=layers,
                           budget=None, n_initial=n_initial, n_recent=n_recent, chunk_start=s, compress=False)
        logp = torch.log_softmax(model.lm_head(inner.norm(hs[:, :e - s])).float(), dim=-1)[0]
        nuc[s + 1:e] = -logp[:-1].gather(1, ids[0, 1:, None]).squeeze(1).cpu()
        if last is not None:
            nuc[s] = -float(last[ids[0, 0]])
        last = logp[-1]
        m = cache.size
        positions = torch.arange(m - w, m, device=device)
        keep = {}
        for l in range(layers):
            layer = inner.layers[l]
            cos, sin = rope_at(model, l, hs, positions[None])
            q = query_states(layer, sink.normed[l], cos, sin)
            cap = h2o_scores(q, cache.keys[l], layer.self_attn.scaling, positions, torch.arange(m, device=device),
                             sliding_window_of(model, l))[0, :m - w]
            cache.keys[l], cache.values[l] = cache.keys[l][:, :, :m - w], cache.values[l][:, :, :m - w]
            cache.origin[l] = cache.origin[l][:m - w]
            if m - w > budget:
                keep[l] = infinipot_keep(cap, nuc[cache.origin[l]], budget, n_initial, n_recent)
        if keep:
            cache.compress(model, keep)
    held = cache.size
    run = _Recurrent(model, cache, context_ids.shape[1],
                     dict(early_exit_layer=layers, budget=budget, n_initial=n_initial, n_recent=n_recent))
    text, nll = run.answer(tokenizer, query_ids, target, max_new_tokens)
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
    layer = decoder_of(model).config.num_hidden_layers // 2 if layer is None else layer
    full = n // chunk
    rows = []
    if full:
        rows.append(_mean_pooled(model, context_ids[0, :full * chunk].view(full, chunk), layer))
    if n % chunk:
        rows.append(_mean_pooled(model, context_ids[:, full * chunk:], layer))
    emb = F.normalize(torch.cat(rows), dim=-1)
    q = F.normalize(_mean_pooled(model, query_ids, layer), dim=-1)
    return _select_chunks(context_ids, (emb @ q[0]).argsort(descending=True), chunk, budget)


def _select_chunks(context_ids: torch.Tensor, order: torch.Tensor, chunk: int, budget: int):
    """The best chunks (``order``: best first) that fit in ``budget`` tokens, in input order (OP-RAG)."""
    spans = chunk_spans(context_ids.shape[1], chunk)
    chosen, total = [], 0
    for i in order.tolist():
        size = spans[i][1] - spans[i][0]
        if total + size > budget:
            continue
        chosen.append(i)
        total += size
    if not chosen:
        raise ValueError(f"budget ({budget}) is smaller than every retrieval chunk (up to {chunk} tokens): OP-RAG "
                         f"keeps whole chunks; raise budget to >= {chunk} or lower the chunk size")
    chosen.sort()
    ids = torch.cat([context_ids[:, spans[i][0]:spans[i][1]] for i in chosen], dim=1)
    return ids, torch.tensor(chosen)


def bm25_ids(tokenizer, context_ids: torch.Tensor, question: str, budget: int, *,
             chunk: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """OP-RAG with BM25 (the paper's sparse retriever, App. C.4): ``(selected context ids, chosen chunks)``.

    Each ``chunk``-token piece is decoded and split into lower-case words; ``rank_bm25.BM25Okapi`` (k1 = 1.5,
    b = 0.75, the standard Okapi formula) scores them against the question's words; best chunks up to
    ``budget`` tokens, input order kept."""
    import re

    from rank_bm25 import BM25Okapi

    def words(text: str) -> list[str]:
        return re.findall(r"\w+", text.lower()) or [""]

    docs = [words(tokenizer.decode(context_ids[0, s:e])) for s, e in chunk_spans(context_ids.shape[1], chunk)]
    scores = torch.tensor(BM25Okapi(docs).get_scores(words(question)))
    return _select_chunks(context_ids, torch.sort(scores, descending=True, stable=True).indices, chunk, budget)


# --------------------------------------------------------------------------- the harness


@torch.no_grad()
def run_method(method: str, model, tokenizer, task, *, budget: int, chunk_size: int, n_initial: int = 16,
               n_recent: int = 64, n_final: int = 64, heads: Any = None, early_exit_layer: int | None = None,
               max_new_tokens: int = 24, rag_layer: int | None = None, pool: int = 129) -> MethodResult:
    """Answer one :class:`kvlab.eval.tasks.LongTask` with ``method`` at cache budget ``budget``."""
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
    if method in ("reform", "reform_no_gather"):
        out = reform_gather(model, tokenizer, task.context, task.query, answer_prefix=task.answer_prefix,
                            chunk_size=chunk_size, budget=budget, early_exit_layer=early_exit_layer, heads=heads,
                            recompute_budget=budget, n_initial=n_initial, n_recent=n_recent, n_final=n_final,
                            pool=pool, progress=False)
        picked = out.gathered
        ids = out.input_ids
        if method == "reform_no_gather":  # what compression kept at the last layer below the exit, recomputed
            held = out.trace.cache.origin[out.settings["early_exit_layer"] - 1]
            picked = held[held < context_ids.shape[1]].sort().values  # the query's entries follow anyway
            ids = torch.cat([context_ids[:, picked.to(device)], query_ids], dim=1)
        text, nll = _answer_with_cache(model, tokenizer, ids, target, None, chunk_size, max_new_tokens)
        gold = task.gold_tokens(tokenizer)
        extra = {"gathered": int(picked.numel()),
                 "evidence_recall": float(gold[picked].sum() / gold.sum().clamp(min=1)),
                 "cache_peak_bytes": out.stats["cache_peak_bytes"]}
    elif method == "truncation":
        ids = torch.cat([truncation_ids(context_ids, budget), query_ids], dim=1)
        text, nll = _answer_with_cache(model, tokenizer, ids, target, None, chunk_size, max_new_tokens)
    elif method in ("streamingllm", "h2o", "tova"):
        start = int(context_ids.shape[1])
        policy = baseline_policy(method, budget, n_initial, n_recent, question=(start, start + query_ids.shape[1]))
        ids = torch.cat([context_ids, query_ids], dim=1)
        text, nll = _answer_with_cache(model, tokenizer, ids, target, KVCache(model, policy), chunk_size,
                                       max_new_tokens)
    elif method == "compress_only":
        text, nll, held = _answer_compressed(model, tokenizer, context_ids, query_ids, target, chunk_size=chunk_size,
                                             budget=budget, n_initial=n_initial, n_recent=n_recent,
                                             max_new_tokens=max_new_tokens)
        extra = {"held": held}
    elif method == "infinipot":
        text, nll, held = _answer_infinipot(model, tokenizer, context_ids, query_ids, target, chunk_size=chunk_size,
                                            budget=budget, n_initial=n_initial, n_recent=n_recent,
                                            max_new_tokens=max_new_tokens)
        extra = {"held": held}
    else:  # rag, rag_bm25
        ids, chosen = (rag_ids(model, context_ids, question_ids, budget, layer=rag_layer) if method == "rag"
                       else bm25_ids(tokenizer, context_ids, task.query, budget))
        text, nll = _answer_with_cache(model, tokenizer, torch.cat([ids, query_ids], dim=1), target, None,
                                       chunk_size, max_new_tokens)
        extra = {"chunks": len(chosen)}
    score = task_score(text, task)
    return MethodResult(method, task.kind, text, task.answer, score == 1.0, nll, time.perf_counter() - begin,
                        int(context_ids.shape[1]), extra, score)


def compare(model, tokenizer, tasks: Iterable, methods: Iterable[str] = METHODS, *, progress: bool = False,
            **settings) -> list[MethodResult]:
    """Every method on every task (same settings); see :func:`run_method` for ``settings``."""
    tasks, methods = list(tasks), list(methods)
    for m in methods:
        check_choice("methods", m, METHODS)
    if settings.get("heads") is not None or any(m.startswith("reform") for m in methods):
        settings["heads"] = load_heads(settings.get("heads"), model)
    pairs = [(t, m) for t in tasks for m in methods]
    if progress:
        from tqdm.auto import tqdm

        pairs = tqdm(pairs, desc="methods x tasks")
    return [run_method(m, model, tokenizer, t, **settings) for t, m in pairs]


def summarise(results: Iterable[MethodResult]) -> dict[str, dict[str, float]]:
    """Per method: accuracy (%: the mean :func:`task_score`), mean answer NLL, mean seconds, examples."""
    table: dict[str, dict[str, float]] = {}
    for r in results:
        row = table.setdefault(r.method, {"accuracy": 0.0, "answer_nll": 0.0, "seconds": 0.0, "examples": 0})
        row["accuracy"] += 100.0 * r.score
        row["answer_nll"] += r.answer_nll
        row["seconds"] += r.seconds
        row["examples"] += 1
    for row in table.values():
        for k in ("accuracy", "answer_nll", "seconds"):
            row[k] = round(row[k] / row["examples"], 3)
    return table


def as_dicts(results: Iterable[MethodResult]) -> list[dict[str, Any]]:
    return [asdict(r) for r in results]
