"""Small experiments of the DHSA notebooks: queries/keys of a layer, perplexity and needle retrieval
under prefill patterns (dense, block-sparse, DHSA with fixed / oracle / predicted chunks).

Paper: DHSA (arXiv:2508.02124), Sec. 3 and App. C-D (needle-in-a-haystack with a token budget per
query; LongBench at a 2k budget). Ours at small scale: SmolLM2-135M on CPU.
"""
from __future__ import annotations

import math

import torch

from kvlab.core import AttentionCall, AttentionPattern, attend, use_pattern

__all__ = ["QKRecorder", "record_qk", "pattern_perplexity", "needle_under_patterns"]


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


@torch.no_grad()
def pattern_perplexity(model, ids: torch.Tensor, patterns: dict, layers, *, skip: int = 0) -> dict[str, float]:
    """Teacher-forced perplexity of ``ids`` ``(1, seq)`` when each pattern computes attention in ``layers``
    during one prefill forward pass (``None``: dense). Tokens at positions ``< skip`` are not scored
    (e.g. those whose queries fit the budget and are dense anyway)."""
    out = {}
    ids = ids.to(model.device)
    for name, pattern in patterns.items():
        with use_pattern(model, pattern, layers):
            logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits[skip:], ids[0, 1 + skip:], reduction="mean")
        out[name] = math.exp(float(nll))
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
