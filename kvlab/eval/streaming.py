"""Streaming perplexity: decode a text token by token through a KV policy.

This is how StreamingLLM (Sec. 4.1), SepLLM (Sec. 4.5, Tables 4-8) and LaCache (Sec. 4.2, Tables 1-2)
measure language modelling under a bounded cache: token ``t`` is fed alone, attends to whatever the
policy kept of tokens ``0..t-1`` plus itself, and its logits score token ``t + 1``.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass

import torch

from kvlab.core import KVCache, Policy, check_choice, check_int, check_token_ids
from kvlab.eval.fast import decode_static, static_reason

__all__ = ["ENGINES", "StreamingResult", "chunked_perplexity", "decode_stepwise", "parallel_nll", "ppl_at_lengths",
           "stream_ids", "streaming_perplexity", "streaming_perplexity_batch"]

#: How a streaming run decodes: "static" (kvlab.eval.fast, CUDA graphs on a GPU), "hooks" (the model's own
#: forward through a KVCache), "auto" (static when the model and policy allow it, else hooks with a warning).
ENGINES = ("auto", "static", "hooks")


@dataclass
class StreamingResult:
    """What one streaming run measured.

    nll: ``(T - 1,)`` negative log-likelihood (nats) of tokens ``1..T-1``.
    kv_trace_per_layer: ``(T, layers)`` entries each layer held after each step.
    peak_memory: most bytes of keys and values the cache held after a step (what a policy saves; the static
    engine allocates ``capacity`` slots but counts the entries held, as the hooks engine does);
    peak_device_memory: ``torch.cuda.max_memory_allocated`` on CUDA (all tensors), None on CPU.
    engine: which engine decoded ("static" or "hooks", see :data:`ENGINES`).
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
        """Perplexity of consecutive blocks of ``every`` tokens: how quality evolves along the stream."""
        usable = (self.nll.numel() // every) * every
        return self.nll[:usable].double().view(-1, every).mean(dim=1).exp()

    def __repr__(self) -> str:
        return (f"StreamingResult({self.policy}: ppl={self.ppl:.3f}, mean_kv={self.mean_kv:.1f}, "
                f"tokens={self.nll.numel() + 1}, seconds={self.seconds:.1f}, engine={self.engine})")


def _vocab_size(model) -> int | None:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return getattr(config, "vocab_size", None)


def _check_policy(policy) -> None:
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
    """``"static"`` or ``"hooks"`` for ``engine`` in :data:`ENGINES`: ``"static"`` raises when the fast engine
    cannot run, ``"auto"`` falls back to the hooks engine with a one-line warning naming the reason."""
    check_choice("engine", engine, ENGINES)
    if engine == "hooks":
        return engine
    reason = static_reason(model, policy)
    if reason is None:
        return "static"
    if engine == "static":
        raise NotImplementedError(f"engine='static' cannot run {type(policy).__name__}: {reason}; "
                                  "use engine='hooks' (or 'auto')")
    warnings.warn(f"{caller}: {type(policy).__name__} runs on the slower hooks engine: {reason}", stacklevel=3)
    return "hooks"


def _static_results(model, ids, policy, progress, device) -> list[StreamingResult]:
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    run = decode_static(model, ids, policy, progress=progress)
    peak_device = torch.cuda.max_memory_allocated(device) if cuda else None
    out = []
    for b in range(ids.shape[0]):
        trace = run["trace"][:, b]
        out.append(StreamingResult(policy=repr(policy), nll=run["nll"][b], kv_trace_per_layer=trace,
                                   seconds=run["seconds"],
                                   peak_memory=int(trace.sum(dim=1).max()) * run["entry_bytes"],
                                   peak_device_memory=peak_device, engine="static"))
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

    _check_policy(policy)
    engine = choose_engine(model, policy, engine)
    device = next(model.parameters()).device
    ids = stream_ids(model, tokenizer, text, max_tokens).to(device)
    if engine == "static":
        return _static_results(model, ids, policy, progress, device)[0]
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
                               progress: bool = True) -> list[StreamingResult]:
    """:func:`streaming_perplexity` of several texts at once, one batch row each, on the static engine.

    Every row is fed one token per step (all texts are cut to the shortest one's length) and keeps its
    own entries: the rows' caches may hold different counts (SepLLM's separators differ per text). Each
    result equals a single run of its text (tested); ``seconds`` is the time of the whole batch.
    """
    _check_policy(policy)
    choose_engine(model, policy, "static", "streaming_perplexity_batch")
    texts = list(texts)
    if not texts:
        raise ValueError("texts is empty: pass at least one text (a string or token ids)")
    device = next(model.parameters()).device
    rows = [stream_ids(model, tokenizer, text, max_tokens) for text in texts]
    n = min(row.shape[1] for row in rows)
    ids = torch.cat([row[:, :n] for row in rows]).to(device)
    return _static_results(model, ids, policy, progress, device)


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
    _check_policy(policy)
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
    _check_policy(policy)
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
    Tables 1-2): ``exp(mean(nll[:N-1]))``; lengths beyond the run are left out."""
    out = {}
    for length in lengths:
        if 2 <= length <= result.nll.numel() + 1:
            out[int(length)] = math.exp(float(result.nll[:length - 1].mean()))
    return out
