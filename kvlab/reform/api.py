"""Public entry point of REFORM (https://arxiv.org/abs/2506.01215): checks inputs, runs Algorithm 1, answers.

    model, tok = kvlab.load_model("smollm2-135m")
    out = reform_generate(model, tok, long_text, "What is the value corresponding to the id ...?",
                          answer_prefix=" The value corresponding to the id ... is", max_new_tokens=24)
    out.text, out.gathered, out.stats

The mechanism is :mod:`kvlab.reform.reference` (the specification, which drives the decoder layers
directly). This module resolves the defaults, the heads and the tokens, checks every argument, picks the
backend of the compression step, and recomputes: the gathered context plus the query go through
``model.generate`` as a fresh prompt.

Backends (``backend=``) of the per-chunk compression (heavy-hitter scoring and the kept-entry gather):
``"torch"`` the reference's eager code; ``"triton"`` the fused kernels of :mod:`kvlab.reform.triton` (CUDA, or
the CPU interpreter with ``TRITON_INTERPRET=1``; a head dim that is a power of two in [16, 256]; bf16, fp16 or
fp32 weights); ``"auto"`` (default) is ``"torch"`` on every device. Measured on an H200
(``benchmarks/results/reform/scoring_h200_2026_11_25.md``): the fused scoring does less device work in bf16 (0.056
vs 0.112 ms a call at 4096 keys, 2.3 vs 5.7 ms at 256k) but more in fp32 (0.128 vs 0.102 ms; 5.6 vs 5.4 ms at 256k
keys); at the sizes a REFORM run scores, a call is bound by the host (launches), and two runs of the same code
gave the fused path 1.30x / 1.65x (fp32 / bf16) and 0.54x / 0.82x of the eager time. That is not the >= 1.2x in
both precisions that ``auto`` asks for; the compaction kernel is 1.0-2.0x faster. ``backend="triton"`` runs both
kernels. An explicit ``"triton"`` the kernels cannot take raises ValueError naming the constraint.

reading: the defaults scale the paper's settings to the model's window ``W`` (``max_position_embeddings``): the paper
runs a 128k-window model with chunks and compression budget of 32k (``W/4``) and a recompute budget of
8k-16k (``W/16``-``W/8``); we take ``chunk_size = budget = W/4`` and ``recompute_budget = W/4`` (so that
REFORM answers from as many entries as the baselines hold), ``n_initial = n_recent = n_final = 256`` or a
quarter of the budget they live in, whichever is smaller.
"""

from __future__ import annotations

import importlib.util
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import torch

from kvlab.core import check_choice, check_int, check_token_ids
from kvlab.memory import kv_bytes_per_token, shape_of
from kvlab.reform.reference import HEAD_KINDS, Head, decoder_of, reform

__all__ = ["ReformOutput", "settings_for_budget", "reform_generate", "reform_answer_nll", "reform_gather", "load_heads", "parse_heads",
           "heads_file", "model_signature"]

HEADS_DIR = Path(__file__).parent / "heads"
BACKENDS = ("auto", "torch", "triton")


@dataclass
class ReformOutput:
    """What :func:`reform_generate` / :func:`reform_gather` return.

    text: the generated continuation ("" for :func:`reform_gather`); gathered: ``(m,)`` context token
    indices that were recomputed (ascending); scores: ``(n_context,)`` significance of every context token;
    input_ids: ``(1, m + q)`` what the model recomputed; stats: sizes, bytes and seconds.
    """

    text: str
    gathered: torch.Tensor
    scores: torch.Tensor
    input_ids: torch.Tensor
    heads: list[Head]
    settings: dict[str, Any]
    stats: dict[str, Any] = field(default_factory=dict)
    trace: Any = None  # kvlab.reform.reference.ReformTrace


# --------------------------------------------------------------------------- heads


def model_signature(model) -> dict[str, Any]:
    """What a heads file must match: architecture and attention sizes."""
    cfg = decoder_of(model).config
    return {"model_type": cfg.model_type, "num_layers": int(cfg.num_hidden_layers),
            "num_heads": int(cfg.num_attention_heads), "num_kv_heads": int(cfg.num_key_value_heads),
            "hidden_size": int(cfg.hidden_size)}


def parse_heads(heads: Iterable[Any], model=None) -> list[Head]:
    """Heads from :class:`Head`, ``("v", 12, 1)`` tuples or ``"v:12:1"`` strings; checked against ``model``."""
    out = []
    for h in heads:
        if isinstance(h, Head):
            item = h
        elif isinstance(h, str):
            parts = h.split(":")
            if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
                raise ValueError(f"heads: {h!r} must read 'kind:layer:head', e.g. 'v:12:1'")
            item = Head(parts[0], int(parts[1]), int(parts[2]))
        elif isinstance(h, (tuple, list)) and len(h) == 3:
            if not isinstance(h[0], str):
                raise TypeError(f"heads: the kind of {h!r} must be a string in {HEAD_KINDS}, got {type(h[0]).__name__}")
            item = Head(h[0], check_int(f"heads: the layer of {h!r}", h[1]),
                        check_int(f"heads: the head of {h!r}", h[2]))
        else:
            raise TypeError(f"heads: each head must be a Head, a (kind, layer, head) tuple or 'kind:layer:head', "
                            f"got {h!r}")
        if item.kind not in HEAD_KINDS:
            raise ValueError(f"heads: kind must be one of {HEAD_KINDS}, got {item.kind!r} in {h!r}")
        out.append(item)
    if not out:
        raise ValueError("heads must name at least one head, e.g. ['v:12:1']")
    if model is not None:
        sig = model_signature(model)
        for h in out:
            count = sig["num_heads"] if h.kind == "q" else sig["num_kv_heads"]
            if not 0 <= h.layer < sig["num_layers"]:
                raise ValueError(f"heads: layer of {h} must be in [0, {sig['num_layers'] - 1}] (the model's layers)")
            if not 0 <= h.head < count:
                raise ValueError(f"heads: head of {h} must be in [0, {count - 1}] ({h.kind} heads per layer)")
    return sorted(set(out))


def heads_file(model) -> Path | None:
    """The shipped heads file (``kvlab/reform/heads/*.json``) whose signature matches ``model``, if any."""
    sig = model_signature(model)
    for path in sorted(HEADS_DIR.glob("*.json")):
        if json.loads(path.read_text()).get("signature") == sig:
            return path
    return None


def load_heads(heads: Any, model, *, any_model: bool = False) -> list[Head]:
    """Resolve ``heads``: None (the shipped file for this model), a path to a heads JSON file (written by
    ``python -m kvlab.reform.heads``), or a list of heads (see :func:`parse_heads`).

    A heads file must carry the ``signature`` of the model it was chosen for, and it must match ``model``;
    ``any_model=True`` applies a file without one (heads chosen elsewhere, checked only against the model's
    layer and head counts)."""
    if not isinstance(any_model, bool):
        raise TypeError(f"any_model must be True or False, got {type(any_model).__name__} {any_model!r}")
    if heads is None:
        path = heads_file(model)
        if path is None:
            raise ValueError(
                "heads=None but kvlab ships no heads file for this model "
                f"({model_signature(model)}); choose heads with `python -m kvlab.reform.heads --model MODEL "
                "--out heads.json` and pass heads='heads.json', or pass a list like ['v:12:1']")
        heads = path
    if isinstance(heads, (str, Path)) and (str(heads).endswith(".json") or Path(heads).exists()):
        path = Path(heads)
        if not path.is_file():
            raise ValueError(f"heads file {str(path)!r} does not exist; write one with `python -m kvlab.reform.heads "
                             "--model MODEL --out heads.json` or pass a list of heads like ['v:12:1']")
        try:
            data = json.loads(path.read_text())
            names = data["heads"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"heads file {str(path)!r} is not a heads file (a JSON object with a 'heads' list, as "
                             f"`python -m kvlab.reform.heads` writes): {exc}") from None
        sig = data.get("signature") if isinstance(data, dict) else None
        if sig is None and not any_model:
            raise ValueError(f"heads file {str(path)!r} has no 'signature' (the model its heads were chosen for), so "
                             "it could be applied to any model; write it with `python -m kvlab.reform.heads --model "
                             "MODEL`, add the signature kvlab.reform.model_signature(model) gives, or load it with "
                             "kvlab.reform.api.load_heads(path, model, any_model=True) and pass that list as heads")
        if sig is not None and sig != model_signature(model):
            raise ValueError(f"heads file {str(path)!r} was chosen for a different model ({sig}); this model is "
                             f"{model_signature(model)}: choose heads for it with `python -m kvlab.reform.heads`")
        return parse_heads(names, model)
    if isinstance(heads, str):
        raise ValueError(f"heads={heads!r}: a string must be a heads JSON file; pass a list for single heads")
    return parse_heads(heads, model)


# --------------------------------------------------------------------------- settings and checks


def _ids(tokenizer, text: Any, name: str, special: bool, vocab_size: int | None = None) -> torch.Tensor:
    if isinstance(text, torch.Tensor):
        if text.dim() not in (1, 2) or (text.dim() == 2 and text.shape[0] != 1) or text.is_floating_point():
            raise ValueError(f"{name} must be a string or token ids of shape (seq,) or (1, seq), "
                             f"got {tuple(text.shape)} {text.dtype}; e.g. ids.reshape(1, -1)")
        ids = check_token_ids(name, text, vocab_size)
        return ids if ids.dim() == 2 else ids[None]
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a string or a tensor of token ids, got {type(text).__name__}")
    return tokenizer(text, return_tensors="pt", add_special_tokens=special).input_ids


def _settings(model, n_context: int, n_query: int, chunk_size, budget, early_exit_layer, heads, recompute_budget,
              n_initial, n_recent, n_final, pool, score_window) -> tuple[dict[str, Any], list[Head]]:
    cfg = decoder_of(model).config
    num_layers = int(cfg.num_hidden_layers)
    window = int(getattr(cfg, "max_position_embeddings", 8192) or 8192)
    heads = load_heads(heads, model)
    if n_query < 1:
        raise ValueError("query must hold at least one token")
    if n_query >= n_context:
        raise ValueError(f"query ({n_query} tokens) must be shorter than the input context ({n_context} tokens): "
                         "REFORM gathers from a long context for a short query")
    chunk_size = check_int("chunk_size", window // 4 if chunk_size is None else chunk_size, 1)
    budget = check_int("budget", window // 4 if budget is None else budget, 1)
    recompute_budget = check_int("recompute_budget", window // 4 if recompute_budget is None else recompute_budget, 1)
    n_initial = check_int("n_initial", min(256, budget // 4) if n_initial is None else n_initial, 0)
    n_recent = check_int("n_recent", min(256, budget // 4) if n_recent is None else n_recent, 0)
    n_final = check_int("n_final", min(256, recompute_budget // 4) if n_final is None else n_final, 0)
    pool = check_int("pool", pool, 1)
    score_window = check_int("score_window", score_window, 1)
    if pool % 2 == 0:
        raise ValueError(f"pool must be odd (the token and pool // 2 neighbours on each side), got {pool}")
    if budget <= n_initial + n_recent:
        raise ValueError(f"budget ({budget}) must be larger than n_initial + n_recent ({n_initial} + {n_recent} = "
                         f"{n_initial + n_recent}): the initial and recent tokens are part of it and heavy hitters "
                         "need room; raise budget or lower n_initial/n_recent")
    if recompute_budget < n_initial + n_final:
        raise ValueError(f"recompute_budget ({recompute_budget}) must be >= n_initial + n_final ({n_initial} + "
                         f"{n_final} = {n_initial + n_final}): the initial and final tokens are always recomputed; "
                         "raise recompute_budget or lower n_initial/n_final")
    top = max(h.layer for h in heads)
    if early_exit_layer is None:
        early_exit_layer = top + 1
    early_exit_layer = check_int("early_exit_layer", early_exit_layer, 1)
    if not top + 1 <= early_exit_layer <= num_layers:
        raise ValueError(f"early_exit_layer ({early_exit_layer}) must be in [{top + 1}, {num_layers}]: above the "
                         f"highest embedding layer ({top}) and at most the model's {num_layers} layers")
    settings = dict(chunk_size=chunk_size, budget=budget, early_exit_layer=early_exit_layer,
                    recompute_budget=recompute_budget, n_initial=n_initial, n_recent=n_recent, n_final=n_final,
                    pool=pool, score_window=score_window)
    return settings, heads


def settings_for_budget(budget: int, *, chunk_size: int = 1) -> dict[str, int]:
    """REFORM at one token budget, split by kvlab's rule (the leaderboard's): the compressed cache and the recompute
    budget are both ``budget``; 4 initial tokens, a quarter of the budget recent and a quarter final; chunks of at
    least ``budget`` tokens (``chunk_size``: the caller's chunk, raised to the budget). Keyword arguments of
    :func:`reform_generate`."""
    budget = check_int("budget", budget, 8)
    return dict(budget=budget, recompute_budget=budget, chunk_size=max(check_int("chunk_size", chunk_size, 1), budget),
                n_initial=4, n_recent=budget // 4, n_final=budget // 4)


def _triton_problem(model) -> str | None:
    """Why the Triton kernels cannot take ``model`` (a sentence naming the constraint), or None."""
    from kvlab.kernels.triton_utils import check_triton_inputs

    if importlib.util.find_spec("triton") is None:
        return "backend='triton' needs the triton package (pip install triton); use backend='torch'"
    try:
        check_triton_inputs(next(model.parameters()), int(decoder_of(model).layers[0].self_attn.head_dim))
    except ValueError as exc:
        return str(exc)
    return None


def _backend(model, backend: str) -> tuple[str, dict[str, Any]]:
    """The backend used and the kernels :func:`kvlab.reform.reference.reform` takes for it."""
    check_choice("backend", backend, BACKENDS)
    if backend == "auto":  # measured: the fused scoring does not win in both precisions (module docstring)
        backend = "torch"
    if backend == "torch":
        return backend, {}
    problem = _triton_problem(model)
    if problem is not None:
        raise ValueError(problem)
    from kvlab.reform.triton import compress_kv_triton, h2o_scores_triton

    return backend, {"score_fn": h2o_scores_triton, "compress_fn": compress_kv_triton}


def _progress(enabled: bool, n_chunks: int):
    if not enabled or n_chunks < 3:
        return None
    from tqdm.auto import tqdm

    return lambda chunks: tqdm(chunks, desc="REFORM chunked forwarding", unit="chunk", mininterval=2.0)


def _kv_bytes_per_token(model) -> int:
    """Bytes of keys and values one token adds to the model's full cache, in the model's dtype."""
    return kv_bytes_per_token(shape_of(decoder_of(model).config), next(model.parameters()).dtype)


# --------------------------------------------------------------------------- entry points


@torch.no_grad()
def reform_gather(model, tokenizer, context, query, *, answer_prefix: str = "", chunk_size: int | None = None,
                  budget: int | None = None, early_exit_layer: int | None = None, heads: Any = None,
                  recompute_budget: int | None = None, n_initial: int | None = None, n_recent: int | None = None,
                  n_final: int | None = None, pool: int = 129, score_window: int = 128,
                  progress: bool = True, profile: bool = False, backend: str = "auto") -> ReformOutput:
    """Compress and gather (Algorithm 1 up to ``GatherRelevant``): which context tokens REFORM recomputes.

    context: text or token ids (``(seq,)``/``(1, seq)``), tokenised with the tokenizer's special tokens;
    query: the question (its tokens drive the similarity search); answer_prefix: text the answer continues
    (e.g. ``" The answer is"``): forwarded after the query but left out of the similarity (App. C.6).
    ``profile``: time each step of chunked forwarding (``out.trace.timings``; synchronises the device).
    ``backend``: ``"auto" | "torch" | "triton"``, the compression step's kernels (module docstring).
    Every other argument: see the module docstring and :func:`kvlab.reform.reference.reform`.
    """
    device = next(model.parameters()).device
    vocab = getattr(decoder_of(model).config, "vocab_size", None)
    context_ids = _ids(tokenizer, context, "context", True, vocab).to(device)
    query_ids = _ids(tokenizer, query, "query", False, vocab).to(device)
    prefix_ids = _ids(tokenizer, answer_prefix, "answer_prefix", False, vocab).to(device) if answer_prefix else \
        query_ids[:, :0]
    settings, heads = _settings(model, context_ids.shape[1], query_ids.shape[1] + prefix_ids.shape[1], chunk_size,
                                budget, early_exit_layer, heads, recompute_budget, n_initial, n_recent, n_final,
                                pool, score_window)
    full_query = torch.cat([query_ids, prefix_ids], dim=1)
    special = torch.tensor([int(t) in set(tokenizer.all_special_ids) for t in full_query[0]]) if hasattr(
        tokenizer, "all_special_ids") else torch.zeros(full_query.shape[1], dtype=torch.bool)
    query_mask = torch.zeros(full_query.shape[1], dtype=torch.bool)
    query_mask[:query_ids.shape[1]] = True
    query_mask &= ~special
    if not bool(query_mask.any()):
        raise ValueError("query has no token left for the similarity search once special tokens are removed")
    backend, kernels = _backend(model, backend)
    n_chunks = -(-context_ids.shape[1] // settings["chunk_size"]) + 1
    begin = time.perf_counter()
    trace = reform(model, context_ids, full_query, heads=heads, query_mask=query_mask,
                   progress=_progress(progress, n_chunks), profile=profile, **kernels, **settings)
    seconds = time.perf_counter() - begin
    emb_bytes = trace.embeddings.shape[-1] * trace.embeddings.element_size()
    stats = dict(context_tokens=int(context_ids.shape[1]), query_tokens=int(full_query.shape[1]),
                 gathered_tokens=int(trace.gathered.numel()), chunks=trace.chunks,
                 cache_peak_bytes=int(trace.cache_bytes_peak),
                 layers_with_cache=int(sum(trace.cache.allocated())),
                 full_depth_cache_bytes=int(trace.cache_bytes_peak * decoder_of(model).config.num_hidden_layers
                                            / settings["early_exit_layer"]),
                 embedding_bytes_per_token=int(emb_bytes), kv_bytes_per_token=_kv_bytes_per_token(model),
                 embedding_bytes=int(emb_bytes * trace.embeddings.shape[0]), seconds_gather=seconds,
                 backend=backend)
    return ReformOutput("", trace.gathered, trace.scores, trace.input_ids, heads, settings, stats, trace)


@torch.no_grad()
def reform_generate(model, tokenizer, context, query, *, answer_prefix: str = "", chunk_size: int | None = None,
                    budget: int | None = None, early_exit_layer: int | None = None, heads: Any = None,
                    recompute_budget: int | None = None, max_new_tokens: int = 32, n_initial: int | None = None,
                    n_recent: int | None = None, n_final: int | None = None, pool: int = 129,
                    score_window: int = 128, progress: bool = True, backend: str = "auto") -> ReformOutput:
    """REFORM end to end: compress, gather, recompute, then greedy generation (``out.text``).

    Recompute is ``model.generate`` on the gathered context tokens followed by the query and answer prefix
    (positions ``0..m+q-1``): the model's full-depth KV cache is rebuilt for those tokens only.
    """
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
    out = reform_gather(model, tokenizer, context, query, answer_prefix=answer_prefix, chunk_size=chunk_size,
                        budget=budget, early_exit_layer=early_exit_layer, heads=heads,
                        recompute_budget=recompute_budget, n_initial=n_initial, n_recent=n_recent, n_final=n_final,
                        pool=pool, score_window=score_window, progress=progress, backend=backend)
    begin = time.perf_counter()
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = pad if pad is not None else getattr(tokenizer, "eos_token_id", None)
    generated = model.generate(input_ids=out.input_ids, attention_mask=torch.ones_like(out.input_ids),
                               max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad)
    new = generated[0, out.input_ids.shape[1]:]
    out.text = tokenizer.decode(new, skip_special_tokens=True)
    out.stats["seconds_recompute_generate"] = time.perf_counter() - begin
    out.stats["recomputed_kv_bytes"] = int(out.input_ids.shape[1] * _kv_bytes_per_token(model))
    return out


@torch.no_grad()
def reform_answer_nll(model, tokenizer, context, query, answer: str, **kwargs) -> tuple[float, ReformOutput]:
    """Teacher-forced mean NLL (nats/token) of ``answer`` after REFORM's recomputed prompt: the proxy that
    still separates methods when a small model rarely answers exactly. ``kwargs``: as :func:`reform_gather`.
    Returns ``(nll, output)``."""
    if not isinstance(answer, str) or not answer:
        raise ValueError("answer must be a non-empty string (the reference continuation, with its leading space)")
    out = reform_gather(model, tokenizer, context, query, **kwargs)
    target = tokenizer(answer, add_special_tokens=False, return_tensors="pt").input_ids.to(out.input_ids.device)
    ids = torch.cat([out.input_ids, target], dim=1)
    logits = model(input_ids=ids).logits[0, out.input_ids.shape[1] - 1:-1].float()
    nll = float(torch.nn.functional.cross_entropy(logits, target[0]))
    return nll, out
