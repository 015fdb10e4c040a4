"""Public entry point of LaCache (https://arxiv.org/abs/2507.14204): checks inputs, returns patterns.

LaCache only chooses *which* entries each layer keeps; attention itself stays the model's own (SDPA or
FlashAttention), so there is no kernel backend to pick. The specification is
:mod:`kvlab.lacache.reference`; the policy that runs it inside a model is
:class:`kvlab.policies.lacache.LaCache`, re-exported here.
"""

from __future__ import annotations

import torch

from kvlab.lacache.reference import LAYOUTS, LadderGeometry, default_span_overlap, ladder_mask
from kvlab.policies.lacache import LaCache

__all__ = ["LaCache", "LAYOUTS", "ladder_geometry", "ladder_pattern", "compaction_snapshots", "chunked_perplexity",
           "ppl_at_lengths", "decode_throughput"]


def ladder_geometry(num_layers: int, span: int | None = None, overlap: int | None = None) -> LadderGeometry:
    """The ladder's sizes (step ``D``, group ``G``, kept ``A``, freed ``R``) for a model with ``num_layers``
    layers. Defaults: the paper's language-modelling setting, ``S = L/4`` and ``O = S/2`` (Sec. 4.4)."""
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"num_layers must be a positive int, got {num_layers!r}")
    span = default_span_overlap(num_layers)[0] if span is None else span
    overlap = span // 2 if overlap is None else overlap
    return LadderGeometry(num_layers, span, overlap)


def ladder_pattern(num_layers: int, length: int, span: int | None = None, overlap: int | None = None, *,
                   layout: str = "bands", sink: int = 0) -> torch.Tensor:
    """``(layers, length)`` bool: the ladder applied once to ``length`` dense tokens (Fig. 2).

    The first ``sink`` tokens stay in every layer; the others are cut into ladders of ``G`` tokens, of which
    layer ``l`` keeps ``A`` from its offset; a trailing partial ladder stays whole.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise ValueError(f"length must be an int >= 0, got {length!r}")
    return ladder_mask(ladder_geometry(num_layers, span, overlap), length, layout, sink)


def compaction_snapshots(num_layers: int, budget: int, steps: list[int], span: int | None = None,
                         overlap: int | None = None, *, sink: int = 4, recent: int | None = None,
                         layout: str = "bands") -> dict[int, torch.Tensor]:
    """What a LaCache of ``budget`` entries per layer holds after each of ``steps`` tokens (Fig. 4):
    step -> ``(layers, step)`` bool mask. Simulated on positions alone, no model needed."""
    from kvlab.lacache.coverage import simulate

    if not steps or any(int(s) < 1 for s in steps):
        raise ValueError(f"steps must be a non-empty list of positive token counts, got {steps!r}")
    policy = LaCache(budget, span, overlap, sink, recent=recent, layout=layout)
    return simulate(policy, num_layers, max(steps), snapshots=steps).snapshots


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
    import time

    from kvlab.cache import KVCache
    from kvlab.eval.streaming import StreamingResult, _tokens

    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an int >= 1, got {chunk_size!r}")
    device = next(model.parameters()).device
    ids = _tokens(tokenizer, text, max_tokens).to(device)
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
    import math

    out = {}
    for length in lengths:
        if 2 <= length <= result.nll.numel() + 1:
            out[int(length)] = math.exp(float(result.nll[:length - 1].mean()))
    return out


@torch.no_grad()
def decode_throughput(model, ids: torch.Tensor, policy, *, prefill: int = 512, steps: int = 128,
                      chunk_size: int = 64) -> float:
    """Tokens per second of token-by-token decoding through ``policy`` once its cache is full.

    ``ids``: ``(1, >= prefill + steps)``. The first ``prefill`` tokens are streamed in chunks (not timed);
    then ``steps`` single tokens are fed and timed, policy work included (LaCache's compaction, H2O's
    eager attention and top-k). A wall-clock number: compare policies measured on the same machine, at the
    same time.
    """
    import time

    from kvlab.cache import KVCache

    if ids.dim() != 2 or ids.shape[1] < prefill + steps:
        raise ValueError(f"ids must be (1, >= prefill + steps = {prefill + steps}), got {tuple(ids.shape)}")
    device = next(model.parameters()).device
    ids = ids.to(device)
    cache = KVCache(model, policy)
    for start in range(0, prefill, chunk_size):
        model(input_ids=ids[:, start:min(start + chunk_size, prefill)], past_key_values=cache, use_cache=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    begin = time.perf_counter()
    for t in range(prefill, prefill + steps):
        model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return steps / (time.perf_counter() - begin)
