"""Streaming perplexity: decode a text token by token through a KV policy.

This is how StreamingLLM (Sec. 4.1), SepLLM (Sec. 4.5, Tables 4-8) and LaCache (Sec. 4.2, Tables 1-2)
measure language modelling under a bounded cache: token ``t`` is fed alone, attends to whatever the
policy kept of tokens ``0..t-1`` plus itself, and its logits score token ``t + 1``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from kvlab.cache import KVCache
from kvlab.policies import Policy

__all__ = ["StreamingResult", "decode_stepwise", "streaming_perplexity", "parallel_nll"]


@dataclass
class StreamingResult:
    """What one streaming run measured.

    nll: ``(T - 1,)`` negative log-likelihood (nats) of tokens ``1..T-1``.
    kv_trace_per_layer: ``(T, layers)`` entries each layer held after each step.
    peak_memory: most bytes of keys and values the cache held after a step (what a policy saves);
    peak_device_memory: ``torch.cuda.max_memory_allocated`` on CUDA (all tensors), None on CPU.
    """

    policy: str
    nll: torch.Tensor
    kv_trace_per_layer: torch.Tensor
    seconds: float
    peak_memory: int
    peak_device_memory: int | None

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
                f"tokens={self.nll.numel() + 1}, seconds={self.seconds:.1f})")


def _tokens(tokenizer, text: str | torch.Tensor, max_tokens: int | None) -> torch.Tensor:
    if isinstance(text, torch.Tensor):
        ids = text.reshape(1, -1) if text.dim() == 1 else text
    else:
        # Tokenizing a whole book takes seconds; a prefix of ~8 characters per token is plenty.
        prefix = text if max_tokens is None else text[: 8 * max_tokens]
        ids = tokenizer(prefix, return_tensors="pt").input_ids
        if max_tokens is not None and ids.shape[1] < max_tokens and len(prefix) < len(text):
            ids = tokenizer(text, return_tensors="pt").input_ids
    if max_tokens is not None:
        ids = ids[:, :max_tokens]
    if ids.shape[1] < 2:
        raise ValueError(f"need at least 2 tokens to measure perplexity, got {ids.shape[1]}")
    return ids


@torch.no_grad()
def streaming_perplexity(model, tokenizer, text: str | torch.Tensor, policy: Policy, max_tokens: int | None = 4096,
                         *, progress: bool = True) -> StreamingResult:
    """Decode ``text`` (a string or token ids) token by token through ``policy``; returns a
    :class:`StreamingResult` with per-token NLL, perplexity, KV trace, time and memory.

    Pseudocode::

        cache = KVCache(model, policy)
        for t in 0..T-2:
            logits = model(tokens[t], past_key_values=cache)   # attends to kept entries + itself
            nll[t] = -log softmax(logits)[tokens[t + 1]]
            # the cache's policy compacts every layer here
    """
    from tqdm.auto import tqdm

    device = next(model.parameters()).device
    ids = _tokens(tokenizer, text, max_tokens).to(device)
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
def parallel_nll(model, tokenizer, text: str | torch.Tensor, max_tokens: int | None = 4096) -> torch.Tensor:
    """NLL of tokens ``1..T-1`` from one ordinary causal forward pass: the oracle for ``Full()``."""
    device = next(model.parameters()).device
    ids = _tokens(tokenizer, text, max_tokens).to(device)
    logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
    return torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none").double().cpu()


@torch.no_grad()
def decode_stepwise(model, ids: torch.Tensor, policy: Policy) -> tuple[torch.Tensor, KVCache]:
    """Feed ``ids`` ``(batch, T)`` one token at a time through ``policy``; returns the logits
    ``(batch, T, vocab)`` of every step and the cache as it is after the last step.

    The building block of the property tests: a policy decoded token by token against the prefill pattern
    (or the plain forward pass) that should give the same logits.
    """
    cache = KVCache(model, policy)
    steps = [model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits
             for t in range(ids.shape[1])]
    return torch.cat(steps, dim=1), cache
