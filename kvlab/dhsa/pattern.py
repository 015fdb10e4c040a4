"""DHSA as a prefill attention pattern: chosen layers of a model attend through :func:`dhsa_attention`.

Paper: DHSA (arXiv:2510.24606), Sec. 2 and App. A. Usage::

    pattern = DHSAPattern(budget=256, chunking="fixed", chunk_size=32)       # block-sparse-like
    with use_pattern(model, pattern, layers=dhsa_layers(model)):
        logits = model(input_ids).logits

Chunkings (``chunking=``):

* ``"fixed"``: chunks of ``chunk_size`` tokens (with ``aggregation="mean"`` this is the block-sparse
  baseline, :func:`block_sparse_pattern`),
* ``"oracle"``: boundaries from the layer's own attention by the labelling rule (Eq. 5-7 +
  NMS, :func:`kvlab.dhsa.boundary_predictor.oracle_boundaries`): what a perfect predictor would give; it
  computes the dense attention map, so it is for small inputs and for analysis,
* ``"predictor"``: the learned :class:`~kvlab.dhsa.boundary_predictor.BoundaryPredictor` on the layer's keys,
* ``"predictor+fixed"``: the predictor's boundaries plus the fixed ``chunk_size`` grid. Reading (ours):
  the paper's Table 1 row "DHSA (+bs)" does not say what "+bs" adds; we read it as DHSA combined with
  block-sparse chunking, so no chunk crosses a block boundary.

Layers: by default :func:`dhsa_layers`, the global-attention layers (all layers of a model without
sliding windows; Gemma3's every sixth). Reading: the paper says DHSA is "integrated into each of the
Transformer layers" (Sec. 2); the authors' code also runs it in the sliding-window layers of
Gemma2 (inside the window). Our choice follows the issue: only global layers, where a query can
see the whole context; a sliding-window layer raises.

Decode: when the same pattern sees new tokens after its prefill (one-token steps, or several at once
as in a teacher-forced answer), ``decode="app_a"`` applies the decode rule of App. A to each new token
in turn with the chunks it found at prefill (earlier new tokens form one chunk, the token itself
another); ``decode="dense"`` attends to the whole cache, as the authors' code does.

Two protocols (notebook 08 puts them side by side):

============================  ==========================================  ==========================================
                              the text (App. A): kvlab's default          the authors' code (:func:`authors_pattern`)
============================  ==========================================  ==========================================
question / instruction        sparse like every query                     ``dense_tail``: its queries attend densely
decode                        App. A, sparse (``decode="app_a"``)         dense (``decode="dense"``)
boundaries                    per layer, from its own keys                once per forward, shared by all layers
                                                                          (``share_boundaries=True``)
always-kept keys              ``initial`` + the query's chunk             128 initial + 128 recent (``local``)
initial keys in the budget    forced; ranked keys fill the rest           written over the 128 lowest-position
                              (``initial_rule="kvlab"``)                  entries of the list (``"authors"``)
boundary threshold            calibrated at training                      predictor logit > 1.1 (p > 0.7503)
============================  ==========================================  ==========================================

The two columns are :meth:`DHSAProtocol.kvlab` and :meth:`DHSAProtocol.authors` (with the chunking settings of
:func:`authors_pattern`). Under the text's protocol every layer chunks its own keys; kvlab's SmolLM2 predictor is
trained on the first layer's keys and places few boundaries in the other layers, so there the chunks are the
``max_len`` cuts, i.e. fixed blocks (``pattern.chunk_stats`` counts them per layer).

The default is the text's: it is what the paper describes, and it makes every query and every
generated token go through the selection, so the mechanism is what is measured. The authors' numbers
(Fig. 2/6, Table 1) come from their code; with its protocol the needle test measures whether the
*context* survives a sparse prefill, which is an easier test (the question and the answer see
everything). ``share_selection=True`` also shares the kept set (computed in the first DHSA layer of
the forward) with every later layer.

Readings (authors' legacy code and the issue that re-ran it): "instruction" tokens dense at prefill,
decode dense ("TODO: add support for decoding stage"), one set of boundaries for all layers, 128 recent keys
forced and keys 0-127 written over the 128 lowest-position entries of the ranked list. Ours: the shared boundaries come from the keys of the first DHSA layer of the
forward; the recent keys are the ``local`` keys before the query's chunk (a query keeps between
``local`` and ``local`` + its chunk length recent keys: what a chunk-granular kernel can list).
"""
from __future__ import annotations

import math
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace

import torch

from kvlab.core import AttentionCall, AttentionPattern, MaskPattern, attend, causal_mask, model_state

from .api import check_flag, dhsa_attention, dhsa_selection, predict_boundaries
from .policy import decode_attention, decode_attention_sdpa
from .api import BACKENDS
from .reference import INITIAL_RULES, TIE_ORDERS
from .reference import (_per_batch, block_query_mask, chunk_index, chunk_similarity, dhsa_mask, fixed_boundaries,
                        local_starts, split_long_chunks)
from .boundary_predictor import BoundaryPredictor, attention_recall, oracle_boundaries

__all__ = ["DHSAPattern", "DHSAProtocol", "DHSAChunking", "AUTHORS_THRESHOLD", "authors_pattern", "block_sparse_pattern", "sliding_window_pattern", "dhsa_layers",
           "ranked_chunk_mask", "CHUNKINGS", "DECODES", "PATTERN_BACKENDS"]

CHUNKINGS = ("fixed", "oracle", "predictor", "predictor+fixed")
DECODES = ("app_a", "dense")
PATTERN_BACKENDS = BACKENDS + ("sdpa",)  # "sdpa": ranked_chunk_mask + torch's scaled_dot_product_attention


@torch.no_grad()
def ranked_chunk_mask(q: torch.Tensor, k: torch.Tensor, boundaries, budget: int | None, *, initial: int = 0,
                      local: int = 0, aggregation: str = "eq4", share_heads: bool = False, dense_tail: int = 0,
                      score_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """:func:`~kvlab.dhsa.reference.dhsa_mask` (``keep_diagonal=True``, ``causal_query=False``) without the
    token-level sort: the same ``(batch, heads | 1, seq, seq)`` bool mask, built from the chunk ranking.

    The reference upsamples the chunk scores to ``(seq, seq)`` and sorts every row (``O(seq^2 log seq)``, 90 %
    of a 1k-token needle prompt on a CPU). Every token of a chunk carries its chunk's score and ties go to the
    lower position, so a row's sorted candidates are its query chunk's ranked key chunks laid end to end::

        order[h, c]        = key chunks by decreasing S[h, c, :] (ties: lower chunk first), candidates only
        before[h, c, c']   = candidate tokens of the chunks ranked above c'       (exclusive cumsum)
        place[h, c, j]     = before[h, c, c(j)] + (j - max(b_c(j), initial))     (j's place in c's list)
        keep[h, i, j]      = forced(i, j)  or  place[h, c(i), j] < budget - |forced(i)|

    with ``forced(i, j)`` = ``j <= i`` and (``j < initial`` or ``j >= local_starts[c(i)]``) and candidates
    ``initial <= j < local_starts[c]``. One sort of ``(heads, C, C)`` and a gather: no loop over chunks or rows.
    Arguments as :func:`~kvlab.dhsa.reference.dhsa_mask`; ``dense_tail`` rows keep every causal key.
    """
    bsz, _, n, _ = q.shape
    per = _per_batch(boundaries, bsz, n)
    if budget is not None and budget >= n:
        budget = None
    dev = q.device
    pos = torch.arange(n, device=dev)
    causal = pos[None, :] <= pos[:, None]
    out = []
    for b in range(bsz):
        bd = per[b].to(dev)
        st, en = bd[:-1], bd[1:]
        nc = st.numel()
        cidx = chunk_index(bd, n).to(dev)
        ls = local_starts(bd, local, initial)  # (C,) first always-kept key before each query chunk
        forced = causal & ((pos[None, :] < initial) | (pos[None, :] >= ls[cidx][:, None]))  # (n, n)
        if budget is None:
            heads = 1 if share_heads else q.shape[1]
            m = causal[None].expand(heads, n, n).clone()
        else:
            s = chunk_similarity(q[b:b + 1], k[b:b + 1], bd, aggregation, share_heads, score_dtype)[0]  # (H, C, C)
            cstart = st.clamp(min=initial)
            clen = (torch.minimum(en[None, :], ls[:, None]) - cstart[None, :]).clamp(min=0)  # (C query, C key)
            ci = torch.arange(nc, device=dev)
            is_cand = (ci[None, :] < ci[:, None]) & (clen > 0)
            order = torch.sort(s.masked_fill(~is_cand[None], float("-inf")), dim=-1, descending=True,
                               stable=True).indices  # (H, C, C)
            olen = torch.gather((clen * is_cand)[None].expand_as(order), -1, order)
            before = torch.empty_like(order)
            before.scatter_(-1, order, olen.cumsum(-1) - olen)  # back to key-chunk order
            place = before[:, :, cidx] + (pos - cstart[cidx])[None, None, :]  # (H, C, n)
            cand = (pos[None, :] >= initial) & (pos[None, :] < ls[:, None])  # (C, n)
            place = place.masked_fill(~cand[None], n).to(torch.int32)
            n_forced = forced.sum(-1)  # (n,)
            if int(n_forced.max()) > budget:
                raise ValueError(f"budget={budget} is smaller than the always-kept keys of some query "
                                 f"({int(n_forced.max())} = initial + local + its chunk so far): raise budget, lower "
                                 "initial or local, or use shorter chunks")
            room = (budget - n_forced).to(torch.int32)
            m = (place[:, cidx, :] < room[None, :, None]) | forced[None]
        if dense_tail:
            t = min(dense_tail, n)
            m[:, n - t:] = causal[n - t:]
        out.append(m)
    return torch.stack(out)


class _PhaseTimer:
    """Milliseconds per phase (chunking / selection / attention), CUDA events on a GPU (no sync until read)."""

    def __init__(self):
        self.events: list = []
        self.cpu: dict[str, float] = defaultdict(float)

    @contextmanager
    def phase(self, name: str, device: torch.device):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self.events.append((name, start, end))
        else:
            t0 = time.perf_counter()
            yield
            self.cpu[name] += (time.perf_counter() - t0) * 1e3

    def totals(self) -> dict[str, float]:
        out = defaultdict(float, self.cpu)
        if self.events:
            torch.cuda.synchronize()
            for name, start, end in self.events:
                out[name] += start.elapsed_time(end)
        return dict(out)


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


AUTHORS_THRESHOLD = 1.0 / (1.0 + math.exp(-1.1))  # the authors' code: predictor logit > 1.1, i.e. p > 0.7503


@dataclass(frozen=True)
class DHSAProtocol:
    """Which queries are sparse and which keys every query keeps (the selection around the chunks).

    Two named configurations: :meth:`kvlab` (the text, App. A: kvlab's default) and :meth:`authors` (the authors'
    ``legacy/`` code). Fields as :class:`DHSAPattern`'s arguments of the same names; ``initial_rule`` and ``ties``
    as :func:`kvlab.dhsa.reference.block_query_mask` (fixed query blocks only)."""

    initial: int = 4
    local: int = 0
    keep_diagonal: bool = True
    aggregation: str = "eq4"
    share_heads: bool = False
    dense_tail: int | str = 0
    decode: str = "app_a"
    share_boundaries: bool = False
    share_selection: bool = False
    causal_query: bool = False
    query_block: int | None = None
    initial_rule: str = "kvlab"
    ties: str = "position"

    def __post_init__(self):
        _pos_int("initial", self.initial, 0)
        _pos_int("local", self.local, 0)
        if self.dense_tail != "question":
            _pos_int("dense_tail", self.dense_tail, 0)
        if self.decode not in DECODES:
            raise ValueError(f"decode must be one of {DECODES} ('app_a': App. A sparse decode, 'dense': the authors' "
                             f"code), got {self.decode!r}")
        for flag in ("keep_diagonal", "share_heads", "share_boundaries", "share_selection", "causal_query"):
            check_flag(flag, getattr(self, flag))
        if self.initial_rule not in INITIAL_RULES or self.ties not in TIE_ORDERS:
            raise ValueError(f"initial_rule must be one of {INITIAL_RULES} and ties one of {TIE_ORDERS}, got "
                             f"{self.initial_rule!r}, {self.ties!r}")
        if self.query_block is not None:
            _pos_int("query_block", self.query_block)
            if self.decode != "dense" or self.causal_query or not self.keep_diagonal:
                raise ValueError(f"query_block={self.query_block} (fixed query blocks, the authors' selection) needs "
                                 "backend='sdpa', decode='dense', causal_query=False and keep_diagonal=True, got "
                                 f"decode={self.decode!r}, causal_query={self.causal_query}, "
                                 f"keep_diagonal={self.keep_diagonal}: set those, or query_block=None")
        elif (self.initial_rule, self.ties) != ("kvlab", "position"):
            raise ValueError("initial_rule='authors' and ties='topk' are rules of fixed query blocks: set query_block")

    @classmethod
    def kvlab(cls, **changes) -> "DHSAProtocol":
        """The text (App. A), kvlab's default: every query and generated token sparse, boundaries per layer."""
        return cls(**changes)

    @classmethod
    def authors(cls, **changes) -> "DHSAProtocol":
        """The authors' code, setting by setting (see :func:`authors_pattern`). With ``query_block=None`` (queries
        chunked like the keys) the two rules of their fixed query blocks do not apply: kvlab's are used."""
        base = dict(initial=128, local=128, share_heads=True, dense_tail="question", decode="dense",
                    share_boundaries=True, query_block=128, initial_rule="authors", ties="topk")
        merged = base | changes
        if merged["query_block"] is None:
            merged |= {k: changes.get(k, v) for k, v in (("initial_rule", "kvlab"), ("ties", "position"))}
        return cls(**merged)


@dataclass(frozen=True)
class DHSAChunking:
    """How the keys are cut into chunks: ``chunking`` (``"fixed" | "oracle" | "predictor" | "predictor+fixed"``)
    and its settings, as :class:`DHSAPattern`'s arguments of the same names."""

    chunking: str = "fixed"
    chunk_size: int = 64
    predictor: BoundaryPredictor | None = None
    max_chunks: int | None = None
    threshold: float | None = None
    nms_window: int = 8
    window: int = 4
    max_len: int | None = None
    newlines: bool = False

    def __post_init__(self):
        if self.chunking not in CHUNKINGS:
            raise ValueError(f"chunking must be one of {CHUNKINGS}, got {self.chunking!r}")
        _pos_int("chunk_size", self.chunk_size)
        _pos_int("nms_window", self.nms_window, 0)
        _pos_int("window", self.window)
        if self.max_chunks is not None:
            _pos_int("max_chunks", self.max_chunks)
        if self.max_len is not None:
            _pos_int("max_len", self.max_len, 0)
        check_flag("newlines", self.newlines)
        _check_threshold(self.threshold, self.chunking)
        dynamic = self.chunking != "fixed"
        if not dynamic and self.newlines:
            raise ValueError("newlines=True adds boundaries to a dynamic chunking ('oracle', 'predictor', "
                             "'predictor+fixed'); chunking='fixed' is the block-sparse baseline")
        if self.chunking.startswith("predictor") and not isinstance(getattr(self.predictor, "_orig_mod",
                                                                            self.predictor), BoundaryPredictor):
            raise ValueError(f"chunking={self.chunking!r} needs predictor=BoundaryPredictor(...) (train one with "
                             "kvlab.dhsa.training, or load one with kvlab.dhsa.training.load_predictor / "
                             "shipped_predictor)")


def _check_threshold(threshold, chunking: str) -> None:
    if threshold is None:
        return
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise ValueError(f"threshold must be a finite number (a ratio for the oracle, a probability in [0, 1) "
                         f"for the predictor) or None for the default, got {threshold!r}")
    if chunking.startswith("predictor") and not 0 <= threshold < 1:
        raise ValueError(f"threshold={threshold!r} is a probability for chunking={chunking!r}: it must be in "
                         "[0, 1) (p > threshold ends a chunk; >= 1 keeps none)")


_PROTOCOL_FIELDS = {f.name for f in fields(DHSAProtocol)}
_CHUNKING_FIELDS = {f.name for f in fields(DHSAChunking)}


def _split_options(protocol: DHSAProtocol, chunker: DHSAChunking, options: dict):
    """The keyword options of :class:`DHSAPattern` applied to its two configurations."""
    unknown = set(options) - _PROTOCOL_FIELDS - _CHUNKING_FIELDS
    if unknown:
        raise TypeError(f"DHSAPattern got unknown options {sorted(unknown)}; the protocol's are "
                        f"{sorted(_PROTOCOL_FIELDS)}, the chunking's {sorted(_CHUNKING_FIELDS)}")
    protocol = replace(protocol, **{k: v for k, v in options.items() if k in _PROTOCOL_FIELDS})
    chunker = replace(chunker, **{k: v for k, v in options.items() if k in _CHUNKING_FIELDS})
    return protocol, chunker


def _check_backend(protocol: DHSAProtocol, backend: str) -> None:
    if backend == "sdpa" and (protocol.causal_query or not protocol.keep_diagonal):
        raise ValueError("backend='sdpa' builds the kept set from the chunk ranking (one list per query chunk), "
                         "which needs keep_diagonal=True and causal_query=False; use backend='torch' for "
                         "causal_query=True (perplexity) or keep_diagonal=False")
    if protocol.query_block is not None and backend != "sdpa":
        raise ValueError(f"query_block={protocol.query_block} (fixed query blocks, the authors' selection) needs "
                         f"backend='sdpa', decode='dense', causal_query=False and keep_diagonal=True, got "
                         f"backend={backend!r}: set those, or query_block=None")


def _resolve_chunker(chunker: DHSAChunking, protocol: DHSAProtocol, budget: int | None) -> DHSAChunking:
    """The chunker with its budget-dependent defaults filled in (``max_len``, ``threshold``), checked against the
    budget: every query keeps ``initial + local`` keys and, without query blocks, its own chunk."""
    p = protocol
    forced = p.initial + p.local if p.keep_diagonal else 0
    if budget is not None and p.query_block is not None and p.initial + p.local > budget:
        raise ValueError(f"budget={budget} must be >= initial ({p.initial}) + local ({p.local}), the keys every "
                         "query block keeps; raise budget or lower initial / local")
    room = None if budget is None else budget - forced
    max_len = chunker.max_len
    if max_len is None:
        twice = 2 * chunker.chunk_size
        max_len = twice if room is None or p.query_block else max(1, min(twice, room))
    if max_len == 0 and p.query_block is None:
        raise ValueError("max_len must be >= 1 without query_block (a query keeps its own chunk, so chunks need a "
                         "cut); max_len=0 (no cut, the authors' code) goes with query_block")
    if p.keep_diagonal and room is not None and p.query_block is None:
        longest = chunker.chunk_size if chunker.chunking == "fixed" else max_len
        if longest > room:
            what = "chunk_size" if chunker.chunking == "fixed" else "max_len"
            raise ValueError(f"budget={budget} must be >= initial ({p.initial}) + local ({p.local}) + the longest "
                             f"chunk ({what}={longest}): every query keeps its own chunk; raise budget or lower "
                             f"{what}")
    return replace(chunker, max_len=max_len, threshold=_default_threshold(chunker))


def _default_threshold(chunker: DHSAChunking) -> float:
    """The given threshold, else the oracle's ratio 1.1, a predictor's calibrated threshold, or p > 0.5."""
    if chunker.threshold is not None:
        return chunker.threshold
    calibrated = getattr(getattr(chunker.predictor, "_orig_mod", chunker.predictor), "calibrated_threshold", None)
    return 1.1 if chunker.chunking == "oracle" else (calibrated if calibrated is not None else 0.5)


class _Option:
    """A :class:`DHSAPattern` attribute that is a field of one of its configurations: reading it reads the field,
    setting it replaces the configuration (checked again)."""

    def __init__(self, group: str):
        self.group = group

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, owner=None):
        return self if obj is None else getattr(getattr(obj, self.group), self.name)

    def __set__(self, obj, value):
        setattr(obj, self.group, replace(getattr(obj, self.group), **{self.name: value}))


class DHSAPattern(AttentionPattern):
    """DHSA prefill attention in the layers it is installed in.

    Args:
        budget: ``N_b`` keys per query (initial and diagonal included); None = dense.
        chunking: ``"fixed" | "oracle" | "predictor"`` (module docstring).
        chunk_size: fixed chunk length; for the dynamic chunkings it sets the default ``max_chunks``.
        predictor: a trained :class:`~kvlab.dhsa.boundary_predictor.BoundaryPredictor` (``chunking="predictor"``), or
            ``torch.compile`` of one (the fast path; it runs in its own dtype, e.g. bf16 on a GPU).
        max_chunks: ``N_c``; default ``8 * ceil(seq / chunk_size)`` (the authors' code: ``chunk_beta = 8``
            times the number of fixed blocks, so that NMS, not ``N_c``, sets the chunk lengths).
        threshold: boundary threshold: on the ratio for the oracle (code: 1.1), on the probability
            for the predictor (default: the threshold calibrated when it was trained,
            :func:`kvlab.dhsa.training.calibrate_threshold`, else 0.5).
        nms_window: NMS distance (App. B: 8 or 64).
        window: ``w`` of the labelling rule for the oracle (the predictor has its own).
        max_len: dynamic chunks longer than this are cut (ours; default ``min(2 chunk_size, budget - initial)``);
            0: no cut (the authors' code; only with ``query_block``, where a query's own chunk is not forced).
        initial, keep_diagonal, aggregation, share_heads: as :func:`kvlab.dhsa.dhsa_attention`.
        backend: ``"auto" | "torch" | "flex" | "triton"`` (:func:`kvlab.dhsa.dhsa_attention`), or ``"sdpa"``:
            the reference's kept set built from the chunk ranking (:func:`ranked_chunk_mask`, no token-level
            sort) and torch's ``scaled_dot_product_attention`` with it, any device: the fast path of the needle
            grid (``keep_diagonal=True``, ``causal_query=False``).
        record: keep, per layer, the chunk offsets of the last call (always) and the share of dense
            attention mass the mask keeps (``self.recall``; computes the dense map: small inputs).
        local: keys before each query's chunk always kept (the authors' 128 "recent" keys), in the budget.
        dense_tail: at prefill, the last ``dense_tail`` queries attend densely (the authors' dense question
            / instruction). An int, or ``"question"``: the length is found per prompt by the harness, which
            sets ``pattern.question_tokens`` before the prefill (:func:`kvlab.experiments.dhsa.measures.needle_records`
            does, from the prompt's ``"Question:"`` line); a prefill without it raises.
        decode: ``"app_a"`` (App. A, sparse; default) or ``"dense"`` (the authors' code) for tokens after
            the prefill.
        share_boundaries: chunk once per forward (the first DHSA layer's keys) and reuse the boundaries in
            every later layer (the authors' code); False: every layer chunks its own keys.
        share_selection: also reuse the first DHSA layer's kept set in every later layer of the forward.
        causal_query: each query's chunk vector from its chunk's queries up to itself (no later token
            enters its selection): the variant teacher-forced perplexity needs (notebook 07); ``"torch"``.
        profile: accumulate the time of chunking / selection / attention (``self.timings()``; CUDA events).
        newlines: also end a chunk after every newline token (App. B: "we also augment the output with explicit
            boundaries such as \\n, \\n\\n"); the harness sets ``pattern.newline_ends`` per prompt
            (:func:`kvlab.experiments.dhsa.measures.newline_ends`); a prefill without it raises.
        query_block: None (the text: queries are chunked like the keys) or the length of fixed query blocks
            (the authors' code: one selection per block of ``query_block`` queries, ``local`` = the last keys
            before the block's end, :func:`kvlab.dhsa.reference.block_query_mask`); needs ``backend="sdpa"``
            and ``decode="dense"``.

        protocol, chunker: the two configurations the options above fill (:class:`DHSAProtocol`: which queries
            are sparse and which keys are always kept, named :meth:`DHSAProtocol.kvlab` and
            :meth:`DHSAProtocol.authors`; :class:`DHSAChunking`: the chunking and its settings); an option given
            by name replaces that field. Every option is also an attribute (reading and setting the field).

    After each prefill, ``pattern.stats()`` gives, for the layer the boundaries were taken from, the number
    of chunks, how many of them come from cutting chunks longer than ``max_len`` (``cut_chunks``; the rest
    are the chunking's own), and, over the DHSA layers, the mean number of keys a query keeps and of those
    chosen by the ranking (``ranked_keys``: kept minus always-kept). ``pattern.settings()`` is every setting
    a record needs (initial, local, budget, predictor, share_heads, ...).
    """

    def __init__(self, budget: int | None, *, protocol: "DHSAProtocol | None" = None,
                 chunker: "DHSAChunking | None" = None, backend: str = "auto", record: bool = False,
                 name: str | None = None, profile: bool = False, **options):
        if budget is not None:
            _pos_int("budget", budget)
        for flag, val in (("record", record), ("profile", profile)):
            check_flag(flag, val)
        if backend not in PATTERN_BACKENDS:
            raise ValueError(f"backend must be one of {PATTERN_BACKENDS}, got {backend!r}")
        protocol, chunker = _split_options(protocol or DHSAProtocol(), chunker or DHSAChunking(), options)
        _check_backend(protocol, backend)
        self.budget, self.backend, self.record = budget, backend, record
        self.protocol = protocol
        self.chunker = _resolve_chunker(chunker, protocol, budget)
        self.question_tokens: int | None = None  # set per prompt when dense_tail == "question"
        self.newline_ends = None  # set per prompt when newlines: offsets just after each newline token
        self.chunk_stats: dict[int, dict] = {}  # layer -> chunks / cut_chunks of the last prefill
        self.key_stats: dict[int, dict] = {}  # layer -> kept_keys / ranked_keys of the last prefill
        self.name = name or f"DHSA({self.chunking}, budget={budget})"
        self.boundaries: dict[int, list[torch.Tensor]] = {}
        self.recall: dict[int, float] = {}
        self.chunk_calls = 0  # how many times boundaries were computed (once per forward when shared)
        self._timer = _PhaseTimer() if profile else None
        self._shared: dict = {}  # per forward: "n", "layer" (last seen), "bds", "selection"

    # every option reads (and sets) its field of the protocol or the chunker
    initial = _Option("protocol")
    local = _Option("protocol")
    keep_diagonal = _Option("protocol")
    aggregation = _Option("protocol")
    share_heads = _Option("protocol")
    dense_tail = _Option("protocol")
    decode = _Option("protocol")
    share_boundaries = _Option("protocol")
    share_selection = _Option("protocol")
    causal_query = _Option("protocol")
    query_block = _Option("protocol")
    initial_rule = _Option("protocol")
    ties = _Option("protocol")
    chunking = _Option("chunker")
    chunk_size = _Option("chunker")
    predictor = _Option("chunker")
    max_chunks = _Option("chunker")
    threshold = _Option("chunker")
    nms_window = _Option("chunker")
    window = _Option("chunker")
    max_len = _Option("chunker")
    newlines = _Option("chunker")

    def __repr__(self) -> str:
        return self.name

    # -- chunking ---------------------------------------------------------------------------------
    def chunks(self, query: torch.Tensor, key: torch.Tensor, scaling: float) -> list[torch.Tensor]:
        """Offsets of the chunks of each sequence for this call (prefill: ``q == n``)."""
        bsz, _, n, _ = query.shape
        dev = query.device
        max_chunks = self.max_chunks or 8 * math.ceil(n / self.chunk_size)
        if self.chunking == "fixed":
            self._cuts = [0] * bsz
            return [fixed_boundaries(n, self.chunk_size, device=dev)] * bsz
        if self.chunking == "oracle":
            g = query.shape[1] // key.shape[1]
            k = key.repeat_interleave(g, 1).float()
            s = (query.float() @ k.transpose(-1, -2)) * scaling
            causal = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
            attn = torch.softmax(s.masked_fill(~causal, float("-inf")), -1).mean(1)  # heads averaged
            own = [oracle_boundaries(attn[b], window=self.window, max_chunks=max_chunks,
                                     threshold=self.threshold, nms_window=self.nms_window) for b in range(bsz)]
        else:
            own = predict_boundaries(self.predictor.to(dev), key, max_chunks=max_chunks, threshold=self.threshold,
                                     nms_window=self.nms_window, max_len=None)
        out = [split_long_chunks(bd, self.max_len) for bd in own] if self.max_len else list(own)
        self._cuts = [len(a) - len(b) for a, b in zip(out, own)]  # chunks made by the max_len cut, per sequence
        if self.chunking == "oracle":
            return self._with_newlines(out, n)
        if self.chunking == "predictor+fixed":
            fixed = fixed_boundaries(n, self.chunk_size, device=dev)
            out = [torch.unique(torch.cat([b, fixed])) for b in out]
        return self._with_newlines(out, n)

    def _with_newlines(self, out: list[torch.Tensor], n: int) -> list[torch.Tensor]:
        """``newlines=True``: the predicted offsets plus a boundary after every newline token (App. B)."""
        if not self.newlines:
            return out
        if self.newline_ends is None:
            raise ValueError("newlines=True needs pattern.newline_ends (offsets just after each newline token of the "
                             "prompt) set before the prefill; kvlab.experiments.dhsa.measures.newline_ends finds them")
        ends = torch.as_tensor(self.newline_ends, dtype=torch.long)
        ends = ends[(ends > 0) & (ends < n)]
        return [torch.unique(torch.cat([b, ends.to(b.device)])) for b in out]

    # -- attention --------------------------------------------------------------------------------
    def _tail(self) -> int:
        if self.dense_tail != "question":
            return self.dense_tail
        if self.question_tokens is None:
            raise ValueError("dense_tail='question' needs pattern.question_tokens (the question's length in tokens) "
                             "set before the prefill; kvlab.experiments.dhsa.measures.question_tail_tokens finds it")
        return self.question_tokens

    def _kw(self):
        return dict(budget=self.budget, initial=self.initial, keep_diagonal=self.keep_diagonal,
                    aggregation=self.aggregation, share_heads=self.share_heads, local=self.local)

    def timings(self, reset: bool = False) -> dict[str, float]:
        """Milliseconds spent in ``"chunking"``, ``"selection"`` and ``"attention"`` since the last reset
        (``profile=True``; on a GPU, CUDA events read with one synchronisation here)."""
        if self._timer is None:
            raise ValueError("timings() needs DHSAPattern(..., profile=True)")
        out = self._timer.totals()
        if reset:
            self._timer = _PhaseTimer()
        return out

    def _phase(self, name, device):
        return self._timer.phase(name, device) if self._timer is not None else _nothing()

    def _sdpa_prefill(self, query, key, value, bds, mask, scaling, layer):
        """The ``"sdpa"`` backend: :func:`ranked_chunk_mask` (the reference's kept set) and torch's fused
        attention with that boolean mask, all heads at once."""
        if mask is None:
            with self._phase("selection", query.device):
                mask = self._mask(query, key, bds)
            if self.share_selection:
                self._shared["selection"] = mask
        self._count_keys(layer, mask, bds)
        with self._phase("attention", query.device):
            g = query.shape[1] // key.shape[1]
            k, v = (key, value) if g == 1 else (key.repeat_interleave(g, 1), value.repeat_interleave(g, 1))
            return torch.nn.functional.scaled_dot_product_attention(query, k, v, attn_mask=mask, scale=scaling)

    def _mask(self, query, key, bds):
        """The kept set of the ``"sdpa"`` backend: per query chunk (the text) or per fixed query block."""
        kw = self._kw()
        if self.query_block is not None:
            return block_query_mask(query, key, bds, kw["budget"], query_block=self.query_block,
                                    initial=kw["initial"], local=kw["local"], aggregation=kw["aggregation"],
                                    share_heads=kw["share_heads"], dense_tail=self._tail(),
                                    initial_rule=self.initial_rule, ties=self.ties)
        return ranked_chunk_mask(query, key, bds, kw["budget"], dense_tail=self._tail(), initial=kw["initial"],
                                 local=kw["local"], aggregation=kw["aggregation"], share_heads=kw["share_heads"])

    def _forced(self, bd: torch.Tensor, n: int) -> torch.Tensor:
        """``(n, n)`` bool: the always-kept keys of each query (initial, local, own chunk or block), causal."""
        dev = bd.device
        pos = torch.arange(n, device=dev)
        causal = pos[None, :] <= pos[:, None]
        early = pos[None, :] < self.initial
        if self.query_block is not None:
            upper = torch.clamp((pos // self.query_block + 1) * self.query_block, max=n)
            return causal & (early | (pos[None, :] >= (upper - self.local)[:, None]))
        if not self.keep_diagonal:
            return causal & early
        ls = local_starts(bd, self.local, self.initial)[chunk_index(bd, n).to(dev)]
        return causal & (early | (pos[None, :] >= ls[:, None]))

    def _count_keys(self, layer: int, mask: torch.Tensor, bds) -> None:
        """Mean kept and ranked keys per sparse query of this layer (the dense tail left out)."""
        n = mask.shape[-1]
        rows = n - min(self._tail(), n)
        if rows == 0:
            return
        kept = ranked = 0.0
        for b, bd in enumerate(bds):
            m = mask[b, :, :rows]
            forced = self._forced(bd.to(mask.device), n)[:rows]
            kept += float(m.sum(-1).float().mean())
            ranked += float((m & ~forced[None]).sum(-1).float().mean())
        self.key_stats[layer] = {"kept_keys": kept / len(bds), "ranked_keys": ranked / len(bds)}

    def settings(self) -> dict:
        """Every setting a record stores: the selection, the chunking and the protocol."""
        module = getattr(self.predictor, "_orig_mod", self.predictor)
        return {"budget": self.budget, "initial": self.initial, "local": self.local,
                "share_heads": self.share_heads, "query_block": self.query_block, "chunking": self.chunking,
                "predictor": None if module is None else getattr(module, "source", "unnamed"),
                "chunk_size": self.chunk_size, "max_len": self.max_len, "nms_window": self.nms_window,
                "threshold": self.threshold, "aggregation": self.aggregation, "dense_tail": self.dense_tail,
                "decode": self.decode, "share_boundaries": self.share_boundaries,
                "share_selection": self.share_selection, "keep_diagonal": self.keep_diagonal,
                "causal_query": self.causal_query, "newlines": self.newlines, "initial_rule": self.initial_rule,
                "ties": self.ties, "max_chunks": self.max_chunks}

    def stats(self) -> dict:
        """What the last prefill did: chunks and max_len cuts at the layer the boundaries came from (the first
        layer that chunked), and the kept / ranked keys per query averaged over the layers that counted them."""
        out = {}
        if self.chunk_stats:
            first = min(self.chunk_stats)
            out.update({"boundary_layer": first} | self.chunk_stats[first])
        if self.key_stats:
            for key in ("kept_keys", "ranked_keys"):
                out[key] = sum(v[key] for v in self.key_stats.values()) / len(self.key_stats)
        return out

    def _prefill_boundaries(self, query, key, call):
        """Boundaries of this layer: computed here, or (``share_boundaries``) once per forward."""
        st = self._shared
        new_forward = (not st or call.layer_idx <= st["layer"] or st["n"] != key.shape[2]
                       or st["bsz"] != key.shape[0])
        if new_forward:
            self._shared = st = {"n": key.shape[2], "bsz": key.shape[0], "layer": call.layer_idx, "bds": None,
                                 "selection": None}
        st["layer"] = call.layer_idx
        if self.share_boundaries and st["bds"] is not None:
            return st["bds"]
        with self._phase("chunking", query.device):
            bds = self.chunks(query, key, call.scaling)
        counts = [len(b) - 1 for b in bds]
        cuts = self.__dict__.pop("_cuts", None)  # None: chunks() was replaced and did not say
        self.chunk_stats[call.layer_idx] = {"chunks": sum(counts) / len(counts),
                                            "cut_chunks": None if cuts is None else sum(cuts) / len(cuts),
                                            "cut_share": None if cuts is None else sum(cuts) / sum(counts)}
        self.chunk_calls += 1
        st["bds"] = bds
        return bds

    def __call__(self, query, key, value, call: AttentionCall) -> torch.Tensor:
        if call.sliding_window is not None:
            raise ValueError(f"layer {call.layer_idx} is a sliding-window layer; DHSA replaces global layers: "
                             "install the pattern with layers=dhsa_layers(model)")
        q_len, n = query.shape[2], key.shape[2]
        if q_len == n:
            bds = self._prefill_boundaries(query, key, call)
            self.boundaries[call.layer_idx] = [b.detach().cpu() for b in bds]
            kw = self._kw()
            if self.record:
                if self.query_block is not None:
                    mask = self._mask(query, key, bds)
                elif self.keep_diagonal and not self.causal_query:  # the same mask without the token sort
                    kw.pop("keep_diagonal")
                    mask = ranked_chunk_mask(query, key, bds, kw.pop("budget"), dense_tail=self._tail(), **kw)
                else:
                    mask = dhsa_mask(query, key, bds, kw.pop("budget"), dense_tail=self._tail(),
                                     causal_query=self.causal_query, **kw)
                self.recall[call.layer_idx] = float(attention_recall(query, key, mask, call.scaling).mean())
            sel = self._shared["selection"] if self.share_selection else None
            if self.backend == "sdpa":
                return self._sdpa_prefill(query, key, value, bds, sel, call.scaling, call.layer_idx)
            if sel is None:
                with self._phase("selection", query.device):
                    sel = dhsa_selection(query, key, chunks=bds, causal_query=self.causal_query,
                                         backend=self.backend, **self._kw())
                if self.share_selection:
                    self._shared["selection"] = sel
            with self._phase("attention", query.device):
                return dhsa_attention(query, key, value, chunks=bds, scale=call.scaling, backend=self.backend,
                                      selection=sel, dense_tail=self._tail(), **self._kw())
        if self.decode == "dense":  # the authors' code: every generated token sees the whole cache
            return attend(query, key, value, call.causal_mask(), call.scaling)[0]
        prompt = self.boundaries.get(call.layer_idx)
        if prompt is None or int(prompt[0][-1]) > n - q_len:
            raise ValueError(f"layer {call.layer_idx}: {q_len} new queries over {n} keys, but no prefill of the first "
                             f"{n - q_len} keys under this pattern; run the prompt through the model in one piece "
                             "inside the same use_pattern block (chunked prefill is not supported)")
        # decode (App. A), one new token after the other: earlier new tokens form one chunk
        if self.backend == "sdpa" and self.aggregation != "padded_mean":  # the same keys, all new tokens at once
            kw = self._kw()
            return decode_attention_sdpa(query, key, value, [b.to(query.device) for b in prompt], scale=call.scaling,
                                         budget=kw["budget"], initial=kw["initial"], local=kw["local"],
                                         aggregation=kw["aggregation"], share_heads=kw["share_heads"])
        return decode_attention(query, key, value, [b.to(query.device) for b in prompt], scale=call.scaling,
                                **self._kw())


@contextmanager
def _nothing():
    yield


def authors_pattern(budget: int | None, *, chunking: str = "predictor", backend: str = "sdpa",
                    **options) -> DHSAPattern:
    """DHSA as the authors' code runs it: :meth:`DHSAProtocol.authors` and their chunking settings.

    The comparison is with the authors' ``legacy/`` folder (github.com/xiongsiheng/DHSA; the repository's top
    level now holds a different method without a boundary predictor). Setting by setting
    (``tests/test_dhsa_protocol.py`` keeps this table and diffs :meth:`DHSAPattern.settings` against it):

    Each line: setting = here (the default) | the authors' ``legacy/`` code | kvlab's protocol (:class:`DHSAPattern`).

    * ``query_block`` = 128 | ``--block_size 128`` (needle script) | None: queries chunked like the keys
    * ``share_heads`` = True | ``_obtain_dhsa_mask``: ``query_states.mean(dim=1)``, ``key_states.mean(dim=1)`` |
      False: one list per head
    * ``initial`` = 128 | ``dhsa_sdpa(global_tokens=128)`` | 4
    * ``local`` = 128 | ``dhsa_sdpa(local_tokens=128)``: ``recent_idx = allowed_i[-recent_tokens:]`` | 0 (the
      query's own chunk)
    * ``initial_rule`` = ``"authors"`` | ``dhsa_sdpa``: ``torch.cat([global_idx, topk_indices[..., global_tokens:]])``
      on the list sorted by position | ``"kvlab"``: the ranked keys fill what initial + local leave
    * ``ties`` = ``"topk"`` | ``_obtain_dhsa_mask``: ``torch.topk(scores_copy, k=k_select)`` on token-level scores |
      ``"position"``: the earlier key first
    * ``budget`` = ``N_b`` | ``--budget_prefill 1024`` (needle script) | ``N_b``
    * ``aggregation`` = ``"eq4"`` | ``--dhsa_chunk_repre_pooling avgpool_norm``: mean * sqrt(length) | ``"eq4"``
    * ``chunking`` = ``"predictor"`` | ``--dhsa_ckpt_path`` (their Gemma2 predictor; ours is for SmolLM2) |
      ``"fixed"``
    * ``threshold`` = :data:`AUTHORS_THRESHOLD` (p > 0.7503) | ``predict_boundaries(theta=1.1)`` on the logit
      (``boundary_ratio_theta = 1.1``) | the threshold calibrated at training
    * ``max_chunks`` = ``8 * ceil(n / 128)`` | ``(n // block_size) * chunk_beta``, ``chunk_beta = 8`` |
      ``8 * ceil(n / chunk_size)``
    * ``nms_window`` = 8 | ``--dhsa_nms_window_size 8`` | 8
    * ``max_len`` = 0, no cut | no cut | ``min(2 chunk_size, budget - initial - local)``
    * ``share_boundaries`` = True | ``--dhsa_share_boundaries``: the first layer's keys, shared | False
    * ``share_selection`` = False | no ``--dhsa_share_sparsity_masks`` | False
    * ``dense_tail`` = ``"question"`` | ``instruction_tokens``: those queries attend densely | 0
    * ``decode`` = ``"dense"`` | "TODO: add support for decoding stage" | ``"app_a"`` (App. A)

    Differences left, named: the authors' ``_select_boundary_candidates`` forces a boundary where the instruction
    starts and ignores candidates after it (here the question's keys are chunked like the rest); their
    ``predict_boundaries`` blocks only the first ``w - 1`` and last ``w`` positions (here
    :func:`~kvlab.dhsa.boundary_predictor.label_valid`: ``2w - 1`` and ``2w``); their predictor reads the rotated
    keys of Gemma2 and was trained on their data (the shipped SmolLM2 predictor: see
    :func:`kvlab.dhsa.training.shipped_predictor`); their ``dhsa_sdpa`` attends to a key listed twice (a ranked key
    among the first 128 that the overwrite lists again) with twice its weight, a boolean mask once.

    ``chunking="fixed"`` (with ``chunk_size``) is the block-sparse control under the same protocol: one change,
    the chunking. ``options``: :class:`DHSAProtocol` or :class:`DHSAChunking` fields that differ (e.g.
    ``initial_rule="kvlab"``, ``ties="position"``: kvlab's selection rule under the authors' protocol);
    ``name`` defaults to ``"DHSA authors(...)"``."""
    options.setdefault("name", f"DHSA authors({chunking}, budget={budget})")
    proto = DHSAProtocol.authors(**{k: options.pop(k) for k in list(options) if k in _PROTOCOL_FIELDS})
    options.setdefault("chunk_size", proto.query_block)
    options.setdefault("max_len", 0)
    if chunking.startswith("predictor"):
        options.setdefault("threshold", AUTHORS_THRESHOLD)
    return DHSAPattern(budget, protocol=proto, chunking=chunking, backend=backend, **options)


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
