"""DHSA as a prefill attention pattern: chosen layers of a model attend through :func:`dhsa_attention`.

Paper: DHSA (arXiv:2508.02124), Sec. 2 and App. A. Usage::

    pattern = DHSAPattern(budget=256, chunking="fixed", chunk_size=32)       # block-sparse-like
    with use_pattern(model, pattern, layers=dhsa_layers(model)):
        logits = model(input_ids).logits

Chunkings (``chunking=``):

* ``"fixed"``: chunks of ``chunk_size`` tokens (with ``aggregation="mean"`` this is the block-sparse
  baseline, :func:`block_sparse_pattern`),
* ``"oracle"``: boundaries from the layer's own attention by the labelling rule (Eq. 5-7 +
  NMS, :func:`kvlab.dhsa.reference.oracle_boundaries`): what a perfect predictor would give; it
  computes the dense attention map, so it is for small inputs and for analysis,
* ``"predictor"``: the learned :class:`~kvlab.dhsa.reference.BoundaryPredictor` on the layer's keys,
* ``"predictor+fixed"``: the predictor's boundaries plus the fixed ``chunk_size`` grid. Reading (ours):
  the paper's Table 1 row "DHSA (+bs)" does not say what "+bs" adds; we read it as DHSA combined with
  block-sparse chunking, so no chunk crosses a block boundary.

Layers: by default :func:`dhsa_layers`, the global-attention layers (all layers of a model without
sliding windows; Gemma3's every sixth). Reading: the paper says DHSA is "integrated into each of the
Transformer layers" (Sec. 2); the authors' code also runs it in the sliding-window layers of
Gemma2 (inside the window). Our choice follows the issue: only global layers, where a query can
see the whole context; a sliding-window layer raises.

Decode: when the same pattern sees new tokens after its prefill (one-token steps, or several at once
as in a teacher-forced answer), it applies the decode rule of App. A to each new token in turn with
the chunks it found at prefill (earlier new tokens form one chunk, the token itself another).
Reading (authors' legacy code): their Gemma runs decode densely ("TODO: add support for decoding
stage"); leave the pattern's block before decoding to do the same.
"""
from __future__ import annotations

import math

import torch

from kvlab.core import AttentionCall, AttentionPattern, MaskPattern, causal_mask, model_state

from .api import dhsa_attention
from .policy import decode_attention
from .reference import (BoundaryPredictor, attention_recall, dhsa_mask, fixed_boundaries, oracle_boundaries,
                        predict_boundaries, split_long_chunks)

__all__ = ["DHSAPattern", "block_sparse_pattern", "sliding_window_pattern", "dhsa_layers", "CHUNKINGS"]

CHUNKINGS = ("fixed", "oracle", "predictor", "predictor+fixed")


def dhsa_layers(model) -> list[int]:
    """The layers DHSA replaces by default: those without a sliding window (global attention)."""
    state = model_state(model)
    return [i for i, w in enumerate(state.sliding_window) if w is None]


def _pos_int(name, value, minimum=1):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


class DHSAPattern(AttentionPattern):
    """DHSA prefill attention in the layers it is installed in.

    Args:
        budget: ``N_b`` keys per query (initial and diagonal included); None = dense.
        chunking: ``"fixed" | "oracle" | "predictor"`` (module docstring).
        chunk_size: fixed chunk length; for the dynamic chunkings it sets the default ``max_chunks``.
        predictor: a trained :class:`~kvlab.dhsa.reference.BoundaryPredictor` (``chunking="predictor"``).
        max_chunks: ``N_c``; default ``8 * ceil(seq / chunk_size)`` (the authors' code: ``chunk_beta = 8``
            times the number of fixed blocks, so that NMS, not ``N_c``, sets the chunk lengths).
        threshold: boundary threshold: on the ratio for the oracle (code: 1.1), on the probability
            for the predictor (default 0.5).
        nms_window: NMS distance (App. B: 8 or 64).
        window: ``w`` of the labelling rule for the oracle (the predictor has its own).
        max_len: dynamic chunks longer than this are cut (ours; default ``min(2 chunk_size, budget - initial)``).
        initial, keep_diagonal, aggregation, share_heads: as :func:`kvlab.dhsa.dhsa_attention`.
        backend: ``"auto" | "torch" | "flex" | "triton"``.
        record: keep, per layer, the chunk offsets of the last call (always) and the share of dense
            attention mass the mask keeps (``self.recall``; computes the dense map: small inputs).
    """

    def __init__(self, budget: int | None, *, chunking: str = "fixed", chunk_size: int = 64,
                 predictor: BoundaryPredictor | None = None, max_chunks: int | None = None,
                 threshold: float | None = None, nms_window: int = 8, window: int = 4, max_len: int | None = None,
                 initial: int = 4, keep_diagonal: bool = True, aggregation: str = "eq4", share_heads: bool = False,
                 backend: str = "auto", record: bool = False, name: str | None = None):
        if budget is not None:
            _pos_int("budget", budget)
        if chunking not in CHUNKINGS:
            raise ValueError(f"chunking must be one of {CHUNKINGS}, got {chunking!r}")
        _pos_int("chunk_size", chunk_size)
        _pos_int("initial", initial, 0)
        _pos_int("nms_window", nms_window, 0)
        _pos_int("window", window)
        if max_chunks is not None:
            _pos_int("max_chunks", max_chunks)
        if chunking.startswith("predictor") and not isinstance(predictor, BoundaryPredictor):
            raise ValueError(f"chunking={chunking!r} needs predictor=BoundaryPredictor(...) (train one with "
                             "kvlab.dhsa.training, or load one with kvlab.dhsa.training.load_predictor / "
                             "shipped_predictor)")
        room = None if budget is None else budget - (initial if keep_diagonal else 0)
        if max_len is None:
            max_len = 2 * chunk_size if room is None else max(1, min(2 * chunk_size, room))
        _pos_int("max_len", max_len)
        if keep_diagonal and room is not None:
            longest = chunk_size if chunking == "fixed" else max_len
            if longest > room:
                what = "chunk_size" if chunking == "fixed" else "max_len"
                raise ValueError(f"budget={budget} must be >= initial ({initial}) + the longest chunk ({what}="
                                 f"{longest}): every query keeps its own chunk; raise budget or lower {what}")
        self.budget, self.chunking, self.chunk_size, self.predictor = budget, chunking, chunk_size, predictor
        self.max_chunks, self.nms_window, self.window, self.max_len = max_chunks, nms_window, window, max_len
        self.threshold = threshold if threshold is not None else (1.1 if chunking == "oracle" else 0.5)
        self.initial, self.keep_diagonal, self.aggregation = initial, keep_diagonal, aggregation
        self.share_heads, self.backend, self.record = share_heads, backend, record
        self.name = name or f"DHSA({chunking}, budget={budget})"
        self.boundaries: dict[int, list[torch.Tensor]] = {}
        self.recall: dict[int, float] = {}

    def __repr__(self) -> str:
        return self.name

    # -- chunking ---------------------------------------------------------------------------------
    def chunks(self, query: torch.Tensor, key: torch.Tensor, scaling: float) -> list[torch.Tensor]:
        """Offsets of the chunks of each sequence for this call (prefill: ``q == n``)."""
        bsz, _, n, _ = query.shape
        dev = query.device
        max_chunks = self.max_chunks or 8 * math.ceil(n / self.chunk_size)
        if self.chunking == "fixed":
            return [fixed_boundaries(n, self.chunk_size, device=dev)] * bsz
        if self.chunking == "oracle":
            g = query.shape[1] // key.shape[1]
            k = key.repeat_interleave(g, 1).float()
            s = (query.float() @ k.transpose(-1, -2)) * scaling
            causal = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
            attn = torch.softmax(s.masked_fill(~causal, float("-inf")), -1).mean(1)  # heads averaged
            out = []
            for b in range(bsz):
                bd = oracle_boundaries(attn[b], window=self.window, max_chunks=max_chunks,
                                       threshold=self.threshold, nms_window=self.nms_window)
                out.append(split_long_chunks(bd, self.max_len))
            return out
        out = predict_boundaries(self.predictor.to(dev), key, max_chunks=max_chunks, threshold=self.threshold,
                                 nms_window=self.nms_window, max_len=self.max_len)
        if self.chunking == "predictor+fixed":
            fixed = fixed_boundaries(n, self.chunk_size, device=dev)
            out = [torch.unique(torch.cat([b, fixed])) for b in out]
        return out

    # -- attention --------------------------------------------------------------------------------
    def _kw(self):
        return dict(budget=self.budget, initial=self.initial, keep_diagonal=self.keep_diagonal,
                    aggregation=self.aggregation, share_heads=self.share_heads)

    def __call__(self, query, key, value, call: AttentionCall) -> torch.Tensor:
        if call.sliding_window is not None:
            raise ValueError(f"layer {call.layer_idx} is a sliding-window layer; DHSA replaces global layers: "
                             "install the pattern with layers=dhsa_layers(model)")
        q_len, n = query.shape[2], key.shape[2]
        if q_len == n:
            bds = self.chunks(query, key, call.scaling)
            self.boundaries[call.layer_idx] = [b.detach().cpu() for b in bds]
            if self.record:
                mask = dhsa_mask(query, key, bds, self.budget, initial=self.initial, keep_diagonal=self.keep_diagonal,
                                 aggregation=self.aggregation, share_heads=self.share_heads)
                self.recall[call.layer_idx] = float(attention_recall(query, key, mask, call.scaling).mean())
            return dhsa_attention(query, key, value, chunks=bds, scale=call.scaling, backend=self.backend,
                                  **self._kw())
        prompt = self.boundaries.get(call.layer_idx)
        if prompt is None or int(prompt[0][-1]) > n - q_len:
            raise ValueError(f"layer {call.layer_idx}: {q_len} new queries over {n} keys, but no prefill of the first "
                             f"{n - q_len} keys under this pattern; run the prompt through the model in one piece "
                             "inside the same use_pattern block (chunked prefill is not supported)")
        # decode (App. A), one new token after the other: earlier new tokens form one chunk
        return decode_attention(query, key, value, [b.to(query.device) for b in prompt], scale=call.scaling,
                                **self._kw())


def block_sparse_pattern(budget: int | None, block: int = 64, *, initial: int = 4, backend: str = "auto",
                         record: bool = False) -> DHSAPattern:
    """The block-sparse baseline ("Han 2024" in the paper): fixed chunks, plain mean pooling, the same
    per-query TopK. Reading: the paper's baseline lacks "dynamic chunking and improved chunk
    representations" (Sec. 3), i.e. DHSA with fixed chunks and mean pooling."""
    return DHSAPattern(budget, chunking="fixed", chunk_size=block, aggregation="mean", initial=initial,
                       backend=backend, record=record, name=f"block-sparse(block={block}, budget={budget})")


def sliding_window_pattern(window: int) -> MaskPattern:
    """Every query sees its ``window`` nearest keys (itself included): the static baseline of Fig. 6."""
    _pos_int("window", window)

    def mask_fn(call):
        return causal_mask(call.q_positions, call.k_positions, window)

    return MaskPattern(mask_fn, name=f"sliding window {window}")
