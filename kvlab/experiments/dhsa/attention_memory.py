"""The memory attention itself allocates during a prefill: an instrument that sees DHSA's workspace.

``torch.cuda.max_memory_allocated`` over a whole prefill is set outside attention (the MLP's intermediate, the
logits), so it reads the same for dense SDPA and DHSA even where their attention allocates differently (the
ledger's ``dhsa-t3-memory-32k`` row: byte-identical peaks in all 40 rounds). Here every attention call of a
prefill (kvlab's attention function, the one transformers calls in each layer, pattern or dense alike) is measured
on its own: the most bytes allocated at once during the call above what was allocated when it began
(:func:`kvlab.experiments.dhsa.measures.peak_bytes`: the allocator's peak on CUDA, torch.profiler's allocation
events on the CPU). That counts the attention output, the chunk scores, the selection's index tables, the
kernel's log-sum-exp and anything a backend materialises (an eager mask, a ``(seq, seq)`` score matrix); the
projections before and after the call are outside it, and the same for every method.

    with attention_peaks(device) as calls:       # [(layer, bytes), ...], one per attention call
        model(input_ids=ids, use_cache=False, logits_to_keep=1)
    peak = attention_peak_bytes(model, ids, pattern, layers)     # one prefill: the largest call in ``layers``
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

__all__ = ["attention_peaks", "attention_peak_bytes", "NAMES"]

NAMES = ("kvlab", "kvlab_eager")  # what kvlab.core.attach registers with transformers' AttentionInterface


@contextlib.contextmanager
def attention_peaks(device, measure=None) -> Iterator[list[tuple[int, int]]]:
    """While open, every call of kvlab's attention function is measured: yields the list it fills with
    ``(layer, bytes)`` per call. ``measure(fn, device) -> bytes`` defaults to
    :func:`~kvlab.experiments.dhsa.measures.peak_bytes`. The registered functions are restored on exit."""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from kvlab.experiments.dhsa.measures import peak_bytes

    measure = measure or peak_bytes
    device = torch.device(device)
    calls: list[tuple[int, int]] = []
    originals = {name: ALL_ATTENTION_FUNCTIONS[name] for name in NAMES if name in ALL_ATTENTION_FUNCTIONS}
    if not originals:
        raise RuntimeError("kvlab's attention function is not registered: attach a model first (kvlab.core.attach)")

    def wrap(original):
        def measured(module, *args, **kwargs):
            box = {}

            def call():
                box["out"] = original(module, *args, **kwargs)

            calls.append((int(getattr(module, "layer_idx", -1)), int(measure(call, device))))
            return box["out"]

        return measured

    try:
        for name, fn in originals.items():
            AttentionInterface.register(name, wrap(fn))
        yield calls
    finally:
        for name, fn in originals.items():
            AttentionInterface.register(name, fn)


@torch.no_grad()
def attention_peak_bytes(model, ids: torch.Tensor, pattern=None, layers=None, *, measure=None) -> dict:
    """One prefill of ``ids`` ``(1, n)`` with ``pattern`` in ``layers`` (None: the model's dense attention),
    every attention call measured. Returns ``{"attention_peak_bytes": the largest call among ``layers`` (all
    layers if None), "per_layer": [bytes of each layer's call, in layer order]}``."""
    from kvlab.core import use_pattern

    device = next(model.parameters()).device
    ctx = use_pattern(model, pattern, layers) if pattern is not None else contextlib.nullcontext()
    with attention_peaks(device, measure) as calls, ctx:
        model(input_ids=ids.to(device), use_cache=False, logits_to_keep=1)
    wanted = set(range(model.config.num_hidden_layers) if layers is None else layers)
    per_layer = [b for layer, b in sorted(calls) if layer in wanted]
    if not per_layer:
        raise RuntimeError("no attention call was measured (is the model attached to kvlab?)")
    return {"attention_peak_bytes": max(per_layer), "per_layer": per_layer}
