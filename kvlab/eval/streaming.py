"""Streaming perplexity: decode a text token by token through a KV policy.

This is how StreamingLLM (Sec. 4.1), SepLLM (Sec. 4.5, Tables 4-8) and LaCache (Sec. 4.2, Tables 1-2)
measure language modelling under a bounded cache: token ``t`` is fed alone, attends to whatever the
policy kept of tokens ``0..t-1`` plus itself, and its logits score token ``t + 1``.
"""

from __future__ import annotations

import math
import numbers
import time
import warnings
from dataclasses import dataclass

import torch

from kvlab.core import KVCache, Policy, check_choice, check_int, check_token_ids
from kvlab.eval.fast import decode_static, static_reason

__all__ = ["ENGINES", "LongStreamResult", "StreamingResult", "chunked_perplexity", "decode_stepwise",
           "long_stream_deviation", "long_stream_perplexity", "parallel_nll", "ppl_at_lengths", "segment_rows",
           "stream_ids", "streaming_perplexity", "streaming_perplexity_batch"]

#: How a streaming run decodes: "static" (kvlab.eval.fast, CUDA graphs on a GPU), "compiled" (the static engine
#: with the layers compiled by torch.compile first: ~1.8x faster per token on a GPU, about a minute of compiling
#: the first time per model shape and policy kind), "hooks" (the model's own forward through a KVCache),
#: "auto" (static when the model and policy allow it, else hooks with a warning).
ENGINES = ("auto", "static", "compiled", "hooks")


@dataclass
class StreamingResult:
    """What one streaming run measured.

    nll: ``(T - 1,)`` negative log-likelihood (nats) of tokens ``1..T-1``.
    kv_trace_per_layer: ``(T, layers)`` entries each layer held after each step.
    peak_memory: most bytes of keys and values the cache held after a step (what a policy saves; the static
    engine allocates ``capacity`` slots but counts the entries held, as the hooks engine does);
    peak_device_memory: ``torch.cuda.max_memory_allocated`` on CUDA (all tensors), None on CPU.
    engine: which engine decoded ("static", "compiled" or "hooks", see :data:`ENGINES`).
    """

    policy: str
    nll: torch.Tensor
    kv_trace_per_layer: torch.Tensor
    seconds: float
    peak_memory: int
    peak_device_memory: int | None
    engine: str = "hooks"

    @property
    def ppl(self) -> float:
        return math.exp(float(self.nll.double().mean()))

    @property
    def kv_trace(self) -> torch.Tensor:
        """``(T,)`` entries held after each step, averaged over layers."""
        return self.kv_trace_per_layer.double().mean(dim=1)

    @property
    def mean_kv(self) -> float:
        """Mean runtime KV size over the run (the papers' "r.KV"): entries held per layer, averaged over
        steps and layers."""
        return float(self.kv_trace.mean())

    def ppl_curve(self, every: int = 256) -> torch.Tensor:
        """Perplexity of consecutive blocks of ``every`` tokens: how quality evolves along the stream (a last
        block shorter than ``every`` is left out). ``every`` is an int in ``[1, scored tokens]``."""
        every = check_int("every", every, 1)
        if every > self.nll.numel():
            raise ValueError(f"every must be <= {self.nll.numel()} (the tokens this run scored), got {every}: "
                             "no block of that size fits; pass a smaller every")
        usable = (self.nll.numel() // every) * every
        return self.nll[:usable].double().view(-1, every).mean(dim=1).exp()

    def __repr__(self) -> str:
        return (f"StreamingResult({self.policy}: ppl={self.ppl:.3f}, mean_kv={self.mean_kv:.1f}, "
                f"tokens={self.nll.numel() + 1}, seconds={self.seconds:.1f}, engine={self.engine})")


def _vocab_size(model) -> int | None:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return getattr(config, "vocab_size", None)


def check_policy(policy) -> None:
    if not isinstance(policy, Policy):
        raise TypeError(f"policy must be a kvlab Policy (e.g. kvlab.policies.Full() or StreamingLLM(4, 252)), "
                        f"got {type(policy).__name__}")


def stream_ids(model, tokenizer, text: str | torch.Tensor, max_tokens: int | None) -> torch.Tensor:
    """The ``(1, T)`` token ids of one stream, checked: ``text`` is a string (tokenized) or token ids of shape
    ``(T,)`` or ``(1, T)`` within the model's vocabulary; ``max_tokens`` is None (all) or an int >= 2.

    The evaluators score one stream: for several texts, call them once per text (``(B, T)`` with ``B > 1``
    raises instead of silently mixing rows).
    """
    if max_tokens is not None:
        check_int("max_tokens", max_tokens, 2)
    if isinstance(text, torch.Tensor):
        ids = check_token_ids("text", text, _vocab_size(model))
        ids = ids.reshape(1, -1) if ids.dim() == 1 else ids
        if ids.shape[0] != 1:
            raise ValueError(f"text holds {ids.shape[0]} rows of token ids, but this evaluator scores one stream: "
                             "call it once per row (e.g. [f(model, tok, row, ...) for row in ids])")
    elif isinstance(text, str):
        # Tokenizing a whole book takes seconds; a prefix of ~8 characters per token is plenty.
        prefix = text if max_tokens is None else text[: 8 * max_tokens]
        ids = tokenizer(prefix, return_tensors="pt").input_ids
        if max_tokens is not None and ids.shape[1] < max_tokens and len(prefix) < len(text):
            ids = tokenizer(text, return_tensors="pt").input_ids
    else:
        raise TypeError(f"text must be a str or a tensor of token ids, got {type(text).__name__}; "
                        "load a corpus with kvlab.datasets.load_text(...)")
    if max_tokens is not None:
        ids = ids[:, :max_tokens]
    if ids.shape[1] < 2:
        raise ValueError(f"need at least 2 tokens to measure perplexity, got {ids.shape[1]}")
    return ids


def choose_engine(model, policy: Policy, engine: str, caller: str = "streaming_perplexity") -> str:
    """``"static"``, ``"compiled"`` or ``"hooks"`` for ``engine`` in :data:`ENGINES`: ``"static"`` and
    ``"compiled"`` raise when the fast engine cannot run, ``"auto"`` falls back to the hooks engine with a
    one-line warning naming the reason."""
    check_choice("engine", engine, ENGINES)
    if engine == "hooks":
        return engine
    reason = static_reason(model, policy)
    if reason is None:
        return "compiled" if engine == "compiled" else "static"
    if engine in ("static", "compiled"):
        raise NotImplementedError(f"engine={engine!r} cannot run {type(policy).__name__}: {reason}; "
                                  "use engine='hooks' (or 'auto')")
    warnings.warn(f"{caller}: {type(policy).__name__} runs on the slower hooks engine: {reason}", stacklevel=3)
    return "hooks"


def _static_results(model, ids, policy, progress, device, engine="static") -> list[StreamingResult]:
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    run = decode_static(model, ids, policy, progress=progress, compile=engine == "compiled")
    peak_device = torch.cuda.max_memory_allocated(device) if cuda else None
    out = []
    for b in range(ids.shape[0]):
        trace = run["trace"][:, b]
        out.append(StreamingResult(policy=repr(policy), nll=run["nll"][b], kv_trace_per_layer=trace,
                                   seconds=run["seconds"],
                                   peak_memory=int(trace.sum(dim=1).max()) * run["entry_bytes"],
                                   peak_device_memory=peak_device, engine=engine))
    return out


@torch.no_grad()
def streaming_perplexity(model, tokenizer, text: str | torch.Tensor, policy: Policy, max_tokens: int | None = 4096,
                         *, progress: bool = True, engine: str = "auto") -> StreamingResult:
    """Decode ``text`` (a string or token ids) token by token through ``policy``; returns a
    :class:`StreamingResult` with per-token NLL, perplexity, KV trace, time and memory.

    ``engine`` (:data:`ENGINES`): ``"auto"`` (default) decodes with the static engine
    (:mod:`kvlab.eval.fast`: fixed-capacity cache, CUDA graph on a GPU) when the model and policy allow it and
    otherwise warns and uses ``"hooks"``, the model's own forward through a :class:`~kvlab.core.KVCache`.
    Both give the same NLL (tested to 1e-5 relative in fp32); ``result.engine`` says which one ran.

    Pseudocode::

        cache = KVCache(model, policy)
        for t in 0..T-2:
            logits = model(tokens[t], past_key_values=cache)   # attends to kept entries + itself
            nll[t] = -log softmax(logits)[tokens[t + 1]]
            # the cache's policy compacts every layer here
    """
    from tqdm.auto import tqdm

    check_policy(policy)
    engine = choose_engine(model, policy, engine)
    device = next(model.parameters()).device
    ids = stream_ids(model, tokenizer, text, max_tokens).to(device)
    if engine != "hooks":
        return _static_results(model, ids, policy, progress, device, engine)[0]
    cache = KVCache(model, policy)
    n = ids.shape[1]
    nll = torch.empty(n - 1, dtype=torch.float64, device=device)  # filled on the device: no sync per step
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for t in tqdm(range(n - 1), desc=f"stream {type(policy).__name__}", disable=not progress, mininterval=1.0):
        logits = model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits[:, -1]
        nll[t] = torch.nn.functional.cross_entropy(logits.float(), ids[:, t + 1], reduction="sum")
    if cuda:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    return StreamingResult(
        policy=repr(policy),
        nll=nll.cpu(),
        kv_trace_per_layer=torch.tensor(cache.trace.per_layer[:n - 1]),
        seconds=seconds,
        peak_memory=max(cache.trace.nbytes, default=0),
        peak_device_memory=torch.cuda.max_memory_allocated(device) if cuda else None,
    )


@torch.no_grad()
def streaming_perplexity_batch(model, tokenizer, texts, policy: Policy, max_tokens: int | None = 4096, *,
                               progress: bool = True, compile: bool = False,
                               truncate: bool = False) -> list[StreamingResult]:
    """:func:`streaming_perplexity` of several texts at once, one batch row each, on the static engine.

    Every row is fed one token per step and keeps its own entries: the rows' caches may hold different
    counts (SepLLM's separators differ per text). The texts must give the same number of tokens (after
    ``max_tokens``); texts of different lengths raise ValueError listing them, unless ``truncate=True``
    cuts every text to the shortest one (each result then scores only that many tokens).
    ``compile``: the layers compiled first (``engine="compiled"`` of :func:`streaming_perplexity`). Each
    result equals a single run of its text (tested); ``seconds`` is the time of the whole batch.
    """
    check_policy(policy)
    engine = choose_engine(model, policy, "compiled" if compile else "static", "streaming_perplexity_batch")
    texts = list(texts)
    if not texts:
        raise ValueError("texts is empty: pass at least one text (a string or token ids)")
    device = next(model.parameters()).device
    if not isinstance(truncate, bool):
        raise TypeError(f"truncate must be True or False, got {type(truncate).__name__} {truncate!r}")
    rows = [stream_ids(model, tokenizer, text, max_tokens) for text in texts]
    lengths = [row.shape[1] for row in rows]
    n = min(lengths)
    if n != max(lengths) and not truncate:
        raise ValueError(f"texts have different lengths in tokens ({lengths}); a batch feeds every row the same "
                         f"number of tokens, so each would be scored on its first {n} only: pass texts of equal "
                         "length (e.g. max_tokens=N with every text at least N tokens long), call "
                         "streaming_perplexity once per text, or pass truncate=True to cut every text to the shortest")
    ids = torch.cat([row[:, :n] for row in rows]).to(device)
    return _static_results(model, ids, policy, progress, device, engine)


@torch.no_grad()
def parallel_nll(model, tokenizer, text: str | torch.Tensor, max_tokens: int | None = 4096) -> torch.Tensor:
    """NLL of tokens ``1..T-1`` from one ordinary causal forward pass: the oracle for ``Full()``."""
    device = next(model.parameters()).device
    ids = stream_ids(model, tokenizer, text, max_tokens).to(device)
    logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
    return torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none").double().cpu()


@torch.no_grad()
def decode_stepwise(model, ids: torch.Tensor, policy: Policy) -> tuple[torch.Tensor, KVCache]:
    """Feed ``ids`` ``(batch, T)`` one token at a time through ``policy``; returns the logits
    ``(batch, T, vocab)`` of every step and the cache as it is after the last step.

    The building block of the property tests: a policy decoded token by token against the prefill pattern
    (or the plain forward pass) that should give the same logits.
    """
    check_policy(policy)
    ids = check_token_ids("ids", ids, _vocab_size(model))
    ids = ids.reshape(1, -1) if ids.dim() == 1 else ids
    cache = KVCache(model, policy)
    steps = [model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits
             for t in range(ids.shape[1])]
    return torch.cat(steps, dim=1), cache


@torch.no_grad()
def chunked_perplexity(model, tokenizer, text, policy, max_tokens: int | None = 4096, *, chunk_size: int = 16,
                       progress: bool = False):
    """Streaming perplexity with ``chunk_size`` tokens per forward step; returns a
    :class:`kvlab.eval.StreamingResult`.

    Each token attends to what the policy kept after the previous chunk plus the earlier tokens of its own
    chunk, so a bounded policy briefly holds up to ``budget + chunk_size - 1`` entries; the policy compacts
    after every chunk. This is the paper's PG19 protocol (Sec. 4.2, windows of 256 tokens) and costs far
    less on a CPU, where one step of a small model is bound by reading the weights, not by the tokens.
    ``chunk_size=1`` is :func:`kvlab.eval.streaming_perplexity` (token by token, the paper's Wikitext-2
    protocol). ``kv_trace_per_layer`` repeats each chunk's sizes for its tokens.

    Pseudocode::

        for each chunk c of tokens[0 : T-1]:
            logits = model(c, past_key_values=cache)      # the policy compacts after the chunk
            nll[c] = -log softmax(logits)[next tokens]
    """
    check_int("chunk_size", chunk_size, 1)
    check_policy(policy)
    device = next(model.parameters()).device
    ids = stream_ids(model, tokenizer, text, max_tokens).to(device)
    n = ids.shape[1]
    cache = KVCache(model, policy)
    nll = torch.empty(n - 1, dtype=torch.float64)
    trace = []
    starts = range(0, n - 1, chunk_size)
    if progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc=f"chunks {type(policy).__name__}", mininterval=5.0)
    begin = time.perf_counter()
    for start in starts:
        end = min(start + chunk_size, n - 1)
        logits = model(input_ids=ids[:, start:end], past_key_values=cache, use_cache=True).logits[0]
        nll[start:end] = torch.nn.functional.cross_entropy(logits.float(), ids[0, start + 1:end + 1],
                                                           reduction="none").double().cpu()
        trace.extend([cache.trace.per_layer[-1]] * (end - start))
    seconds = time.perf_counter() - begin
    return StreamingResult(policy=repr(policy), nll=nll, kv_trace_per_layer=torch.tensor(trace), seconds=seconds,
                           peak_memory=max(cache.trace.nbytes, default=0), peak_device_memory=None)


def ppl_at_lengths(result, lengths) -> dict[int, float]:
    """Perplexity over the first ``N`` tokens for each ``N`` in ``lengths`` (the paper's "decoding length",
    Tables 1-2): ``exp(mean(nll[:N-1]))``; lengths beyond the run are left out. A length must be an integer of at
    least 2 (one scored token after the first): 0, 1, negative or fractional lengths are refused by name."""
    if isinstance(lengths, (int, str)):
        raise ValueError(f"lengths must be a list of token counts, e.g. [1024, 4096], got {lengths!r}")
    lengths = list(lengths)
    bad = [n for n in lengths if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 2]
    if bad:
        raise ValueError(f"lengths must be integers >= 2 (perplexity over the first N tokens scores N - 1 of them): "
                         f"got {bad[0]!r} in {lengths!r}; drop it or pass a length of at least 2")
    out = {}
    for length in lengths:
        if 2 <= length <= result.nll.numel() + 1:
            out[int(length)] = math.exp(float(result.nll[:length - 1].mean()))
    return out


# ------------------------------------------------------------------------------------------------------------
# Very long streams (SepLLM Table 4, LaCache Figs. 5-6): one stream cut into segments decoded side by side


@dataclass
class LongStreamResult:
    """What :func:`long_stream_perplexity` measured, in stream order.

    nll: ``(T - 1,)`` NLL (nats) of tokens ``1..T-1``; kv_trace: ``(T - 1,)`` entries held per layer (mean over
    layers) after the step that scored each token. ``segments``, ``warmup``, ``sink``: the plan
    (:func:`segment_rows`); ``seconds``: decode time of the whole batch; ``deviation``:
    :func:`long_stream_deviation` on a prefix of the stream, when it was asked for (``check_tokens``).
    """

    policy: str
    nll: torch.Tensor
    kv_trace: torch.Tensor
    segments: int
    warmup: int
    sink: int
    seconds: float
    report_every: int = 65536
    deviation: dict | None = None

    @property
    def tokens(self) -> int:
        return self.nll.numel() + 1

    @property
    def ppl(self) -> float:
        return math.exp(float(self.nll.double().mean()))

    @property
    def mean_kv(self) -> float:
        """Entries held per layer, averaged over the scored steps and layers (warm-up steps left out)."""
        return float(self.kv_trace.double().mean())

    def _ends(self, every: int | None) -> list[int]:
        every = check_int("every", every or self.report_every, 2)
        return [*range(every, self.tokens, every), self.tokens]

    def cumulative_ppl(self, every: int | None = None) -> dict[int, float]:
        """``{N: exp(mean NLL of the first N tokens)}`` for ``N = every, 2 every, ..., T``: SepLLM Table 4's
        "average perplexity" at 1M, 1.5M, ... tokens (the official script's ``exp(mean(nlls))`` over every token
        scored so far)."""
        return ppl_at_lengths(self, self._ends(every))

    def window_ppl(self, every: int | None = None) -> dict[int, float]:
        """``{N: perplexity of the tokens in (N - every, N]}``: how quality moves along the stream."""
        out, previous = {}, 1
        for end in self._ends(every):
            out[end] = math.exp(float(self.nll[previous - 1:end - 1].double().mean()))
            previous = end
        return out

    def summary(self) -> dict:
        """A JSON-ready record of the run (perplexities at every ``report_every`` tokens)."""
        return dict(policy=self.policy, tokens=self.tokens, ppl=self.ppl, mean_kv=self.mean_kv,
                    segments=self.segments, segment_tokens=(self.tokens - 1) // self.segments, warmup=self.warmup,
                    sink=self.sink, seconds=self.seconds, report_every=self.report_every,
                    cumulative_ppl=self.cumulative_ppl(), window_ppl=self.window_ppl(), deviation=self.deviation)

    def __repr__(self) -> str:
        return (f"LongStreamResult({self.policy}: ppl={self.ppl:.3f}, mean_kv={self.mean_kv:.1f}, "
                f"tokens={self.tokens}, segments={self.segments}, warmup={self.warmup}, seconds={self.seconds:.1f})")


def _long_stream_ids(model, ids, policy: Policy, segments: int, warmup: int, sink: int) -> torch.Tensor:
    """The checked stream ``(T,)`` of :func:`long_stream_perplexity`; bad arguments raise ValueError."""
    check_policy(policy)
    for name, value, low, fix in (("segments", segments, 1, "1 is one sequential pass"),
                                  ("warmup", warmup, 0, "0 starts each segment cold after the sinks"),
                                  ("sink", sink, 0, "give the policy's number of initial tokens, e.g. 4")):
        if isinstance(value, int) and not isinstance(value, bool) and value < low:
            raise ValueError(f"{name} must be >= {low} ({fix}), got {value}")
        check_int(name, value, low)
    ids = stream_ids(model, None, ids, None)[0]
    if ids.numel() - 1 < segments:
        raise ValueError(f"a stream of {ids.numel()} tokens is too short for {segments} segments (each scores at least "
                         f"one token): pass segments <= {ids.numel() - 1}, or a longer stream")
    reason = static_reason(model, policy)
    if reason is not None:
        raise ValueError(f"long_stream_perplexity decodes on the static engine, which cannot run "
                         f"{type(policy).__name__}: {reason}; score the stream sequentially with "
                         "streaming_perplexity(..., engine='hooks') instead")
    if segments > 1 and policy.positions == "original":
        raise ValueError(f"{type(policy).__name__} uses positions='original': a segment would restart the stream "
                         "positions and see other rotations than one sequential pass; use positions='cache' (or "
                         "'insertion'), or segments=1")
    return ids


def segment_rows(ids: torch.Tensor, segments: int, warmup: int, sink: int) -> tuple[torch.Tensor, list[tuple]]:
    """Cut the stream ``ids`` ``(T,)`` into ``segments`` rows to decode side by side.

    Segment ``r`` scores the targets ``[b_r, b_{r+1})`` with ``b_r = 1 + r (T - 1) // segments`` (every token
    ``1..T-1`` exactly once). Its row is the stream's first ``sink`` tokens, then the ``warmup`` tokens before
    the segment (decoded, not scored), then the segment::

        row_r = ids[:sink] + ids[b_r - 1 - warmup : b_{r+1}]     # or ids[:b_{r+1}] when that reaches the sinks

    A row whose warm-up reaches back to the sinks is the stream's prefix (exact); rows are padded on the right
    with their last token to one length ``R`` (padding is never scored). Returns ``(rows (segments, R) long,
    spans)`` with ``spans[r] = (b_r, b_{r+1}, row length)``: the row's last ``b_{r+1} - b_r`` NLL entries are
    the segment's; a row is exact iff its length equals ``b_{r+1}``.
    """
    n = ids.numel()
    bounds = [1 + r * (n - 1) // segments for r in range(segments + 1)]
    rows, spans = [], []
    for first, end in zip(bounds, bounds[1:]):
        start = first - 1 - warmup
        rows.append(ids[:end] if start <= sink else torch.cat([ids[:sink], ids[start:end]]))
        spans.append((first, end, rows[-1].numel()))
    width = max(row.numel() for row in rows)
    return torch.stack([torch.cat([row, row[-1:].expand(width - row.numel())]) for row in rows]), spans


@torch.no_grad()
def long_stream_perplexity(model, ids: torch.Tensor, policy: Policy, *, segments: int, warmup: int, sink: int = 4,
                           report_every: int = 65536, check_tokens: int = 0,
                           progress: bool = True) -> LongStreamResult:
    """Perplexity of one very long stream (``(T,)`` or ``(1, T)`` token ids) under a bounded ``policy``, decoded
    as ``segments`` rows of one static-engine batch (:func:`segment_rows`); returns a :class:`LongStreamResult`.

    SepLLM Table 4 (PG19 to 4M tokens) and LaCache Figs. 5-6 (600K-10M tokens) stream one text token by token:
    at batch 1 that is hours. Here row ``r`` re-creates the cache a sequential pass would hold at the start of
    segment ``r`` by decoding the stream's first ``sink`` tokens and the ``warmup`` tokens before the segment.

    **What it approximates.** With ``positions="cache"`` (or ``"insertion"``) a row's cache after warm-up holds
    the same tokens as the sequential pass (for StreamingLLM exactly; SepLLM's separators and LaCache's ladder
    reach back further), but keys and values of layers > 0 carry history from before the warm-up only through
    attention, which the row never saw. For StreamingLLM this error vanishes after ``layers x window`` tokens
    (layer ``l``'s entries depend on ``l`` windows back; tested): a warm-up that long is exact up to rounding.
    Policies that compact in cycles keep, in addition, what the *phase* of their cycle dictates, and that phase
    is set by the whole history: SepLLM's streaming cache compacts every ``c + 1 - a - s - w`` tokens once its
    separator slots are full, at steps shifted by how long it took to fill them; LaCache's ladder passes move on
    a cursor. A row may then sit in another phase than the sequential pass (another, equally typical cache
    state): per-token NLLs differ, the average much less. Measure the error on your model with ``check_tokens=N``
    (:func:`long_stream_deviation` on the first ``N`` tokens, segments of the same length, stored in
    ``result.deviation``). With ``warmup >= T`` every row is a prefix of the stream: one sequential pass (tested).

    Pseudocode::

        rows = [ids[:sink] + ids[b_r - 1 - warmup : b_{r+1}] for r in range(segments)]   # padded to one length
        nll_rows = decode_static(model, rows, policy)["nll"]                                  # (segments, R - 1)
        nll[b_r - 1 : b_{r+1} - 1] = last b_{r+1} - b_r entries of nll_rows[r]               # stream order
    """
    ids = _long_stream_ids(model, ids, policy, segments, warmup, sink)
    check_int("report_every", report_every, 2)
    check_int("check_tokens", check_tokens, 0, ids.numel())
    rows, spans = segment_rows(ids, segments, warmup, sink)
    run = decode_static(model, rows, policy, progress=progress)
    nll = torch.empty(ids.numel() - 1, dtype=torch.float64)
    kv = torch.empty(ids.numel() - 1, dtype=torch.float32)
    for r, (first, end, length) in enumerate(spans):
        steps = slice(length - 1 - (end - first), length - 1)
        nll[first - 1:end - 1] = run["nll"][r, steps]
        kv[first - 1:end - 1] = run["trace"][steps, r].float().mean(dim=1)
    deviation = None
    if check_tokens:
        per_segment = max(1, (ids.numel() - 1) // segments)
        deviation = long_stream_deviation(model, ids[:check_tokens], policy, warmup=warmup, sink=sink,
                                          segments=max(2, round((check_tokens - 1) / per_segment)), progress=progress)
    return LongStreamResult(policy=repr(policy), nll=nll, kv_trace=kv, segments=segments, warmup=warmup, sink=sink,
                            seconds=run["seconds"], report_every=report_every, deviation=deviation)


@torch.no_grad()
def long_stream_deviation(model, ids: torch.Tensor, policy: Policy, *, segments: int, warmup: int, sink: int = 4,
                          progress: bool = False) -> dict:
    """How far :func:`long_stream_perplexity` is from one sequential :func:`~kvlab.eval.fast.decode_static` pass
    on the same (short enough) stream ``ids``: both are run and compared token by token.

    Returns ``dict(tokens, segments, warmup, sink, sequential_ppl, segmented_ppl, ppl_rel_diff,
    mean_abs_nll_diff, max_abs_nll_diff, approximated_tokens, approximated_ppl_rel_diff)``; the
    ``approximated_*`` entries cover only the segments whose row is not a prefix of the stream.
    """
    ids = _long_stream_ids(model, ids, policy, segments, warmup, sink)
    sequential = decode_static(model, ids[None], policy, progress=progress)["nll"][0]
    segmented = long_stream_perplexity(model, ids, policy, segments=segments, warmup=warmup, sink=sink,
                                       progress=progress).nll
    approximated = torch.zeros_like(sequential, dtype=torch.bool)
    for first, end, length in segment_rows(ids, segments, warmup, sink)[1]:
        approximated[first - 1:end - 1] = length != end
    diff = (segmented - sequential).abs()
    some = bool(approximated.any())
    return dict(tokens=ids.numel(), segments=segments, warmup=warmup, sink=sink,
                sequential_ppl=math.exp(float(sequential.mean())), segmented_ppl=math.exp(float(segmented.mean())),
                ppl_rel_diff=math.exp(float(segmented.mean() - sequential.mean())) - 1,
                mean_abs_nll_diff=float(diff.mean()), max_abs_nll_diff=float(diff.max()),
                approximated_tokens=int(approximated.sum()),
                approximated_ppl_rel_diff=(math.exp(float(segmented[approximated].mean()
                                                          - sequential[approximated].mean())) - 1) if some else 0.0)
