"""Decoding speed under a KV policy: tokens per second once the cache is full."""

from __future__ import annotations

import time

import torch

from kvlab.core import KVCache, check_int
from kvlab.eval.streaming import check_policy

__all__ = ["decode_throughput"]


@torch.no_grad()
def decode_throughput(model, ids: torch.Tensor, policy, *, prefill: int = 512, steps: int = 128,
                      chunk_size: int = 64) -> float:
    """Tokens per second of token-by-token decoding through ``policy`` once its cache is full.

    ``ids``: ``(1, >= prefill + steps)``. The first ``prefill`` tokens are streamed in chunks (not timed);
    then ``steps`` single tokens are fed and timed, policy work included (LaCache's compaction, H2O's
    eager attention and top-k). A wall-clock number: compare policies measured on the same machine, at the
    same time.
    """
    check_policy(policy)
    check_int("prefill", prefill, 1)
    check_int("steps", steps, 1)
    check_int("chunk_size", chunk_size, 1)
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] < prefill + steps:
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
