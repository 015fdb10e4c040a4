"""One leaderboard for every method: the same tasks, at matched mean KV or matched FLOPs, swept on Dask.

Methods (:data:`METHODS`) and what they are matched on:

=================  ==========  ============================================================================
method             cost axis   the one parameter chosen to meet the budget
=================  ==========  ============================================================================
``Full``           reference   none (dense attention, every entry kept)
``StreamingLLM``   mean KV     ``cache_size`` (4 sinks + window)
``H2O``            mean KV     ``budget`` (heavy hitters + recent)
``TOVA``           mean KV     ``budget``
``SepLLM``         mean KV     ``cache`` of :class:`~kvlab.sepllm.policy.SepLLMStreaming` (init 4, separators
                               ``cache // 4``, local ``cache // 2``)
``LaCache``        mean KV     ``budget`` (ladder, strict accounting)
``REFORM``         mean KV     compression and recompute budget: the model answers from that many context
                               entries (``mean_kv`` = tokens gathered); question tasks only
``kvpress:<P>``    mean KV     kvpress press ``P`` (prefill compression to exactly the budget, through
                               :mod:`kvlab.eval.peers`); question tasks only, and only where kvpress imports
``DHSA``           FLOPs       ``N_b``, keys per query: kept share of the causal attention FLOPs
``OrthoRank``      FLOPs       routed layers at ``token_ratio = 0.33``: kept share of the decoder FLOPs
                               (:func:`kvlab.orthorank.flop_sparsity`, which counts what routed layers still do)
=================  ==========  ============================================================================

Matched mean KV: the papers' "r.KV", entries a layer holds averaged over the steps of the run (each token
counted once) and over layers. A capped cache fills up first, so its mean is below its cap; each cache method's
parameter is found by bisection on a trace of what the policy keeps (:func:`held_trace`: the held counts
depend on positions and token ids only, never on the weights), and the run reports the mean KV it really held.
A parameter that misses the budget by more than :data:`KV_TOLERANCE` raises ValueError.

Tasks (:data:`TASKS`): ``ppl`` streaming perplexity of WikiText (chunks of ``chunk`` tokens, the cache
compacted after each); ``passkey`` the passkey grid (lengths x depths); ``kv_retrieval`` RULER-style
key-value retrieval (UUID pairs in WikiText, the asked pair beyond the cache window); ``qa`` SQuAD questions over
their article (single-document QA stand-in), scored by the teacher-forced answer NLL (a 135M model's exact
answers are noise). A method that does not apply to a task gives the cell ``status = "n/a: why"``.

Each cell is one :class:`kvlab.experiments.sweep.Task` (target :func:`run_cell`); its parameters hold the method, task,
budget, model id and checksum, seed and sizes, so a finished cell is skipped on a rerun and a changed model file
or kvlab version runs again::

    python -m kvlab leaderboard --grid tiny --workers 2          # local Dask cluster
    python -m kvlab leaderboard --grid full --gpu-workers auto --workers-per-gpu 4   # 4 model copies per GPU
    python -m kvlab leaderboard --grid default --scheduler tcp://10.0.0.5:8786 [--device gpu]
    .venv-peers/bin/python -m kvlab leaderboard --grid tiny --methods kvpress:SnapKVPress   # the peer's rows

``.venv-peers`` (kvpress, transformers<5.3) has no Dask: there the cells run one after the other in-process, into
the same folder, and replace the n/a cells the main environment made for the presses (:func:`collect`).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import importlib.util
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import torch

__all__ = ["METHODS", "CACHE_METHODS", "MATCHED_POLICIES", "FLOP_METHODS", "PRESSES", "TASKS", "GRIDS", "KV_TOLERANCE", "held_trace",
           "match_cache", "match_dhsa", "match_orthorank", "check_budgets", "model_checksum", "sized_grid",
           "cell_tasks", "run_cell", "collect", "markdown", "pareto_plot", "run_leaderboard", "main"]

PRESSES = ("SnapKVPress", "KnormPress", "ExpectedAttentionPress")
#: the methods held to a mean KV budget: the policies (their cap matched by :func:`match_cache`), REFORM (its budget
#: split by its own rule) and the kvpress presses (``n_kept`` = the budget); every one runs in the cells
MATCHED_POLICIES = ("StreamingLLM", "H2O", "TOVA", "SepLLM", "LaCache")
CACHE_METHODS = MATCHED_POLICIES + ("REFORM",) + tuple(f"kvpress:{p}" for p in PRESSES)
FLOP_METHODS = ("DHSA", "OrthoRank")
METHODS = ("Full",) + CACHE_METHODS + FLOP_METHODS
TASKS = ("ppl", "passkey", "kv_retrieval", "qa")
#: the number each task is ranked by, and whether lower is better
MAIN_METRIC = {"ppl": ("ppl", True), "passkey": ("accuracy", False), "kv_retrieval": ("answer_nll", True),
               "qa": ("answer_nll", True)}  # a 135M model rarely spells out a UUID: the answer NLL separates methods
KV_TOLERANCE = 0.05  # relative: a matched cache method's mean KV lies within 5% of the budget
TOKEN_RATIO = 0.33  # OrthoRank's share of tokens a routed layer computes (the paper's)

#: grids: models, budget levels (mean KV entries for cache methods, kept FLOP share for DHSA / OrthoRank) and sizes
GRIDS = {
    "tiny": dict(models=["smollm2-135m"], kv_budgets=[40, 56], flop_budgets=[0.7, 0.85], tokens=160, lengths=[200],
                 depths=[0.5], examples=1, chunk=32, max_new_tokens=6, seeds=[0]),
    "default": dict(models=["smollm2-135m", "gemma3-270m"], kv_budgets=[64, 128], flop_budgets=[0.6, 0.8],
                    tokens=512, lengths=[512], depths=[0.25, 0.75], examples=2, chunk=64, max_new_tokens=12,
                    seeds=[0]),
    # about ten minutes on one H100 with four Dask workers: two models, 2K-token inputs
    "full": dict(models=["smollm2-135m", "qwen2.5-coder-0.5b"], kv_budgets=[128, 256], flop_budgets=[0.5, 0.8],
                 tokens=2048, lengths=[2048], depths=[0.25, 0.75], examples=2, chunk=128, max_new_tokens=12,
                 seeds=[0]),
}


# ================================================================================================
# budgets and matching
# ================================================================================================
def check_budgets(kv_budgets, flop_budgets, tokens: int) -> None:
    """Budgets the leaderboard can match, or ValueError naming the rule: mean KV budgets are ints in
    [16, tokens / 2) (a stream of ``tokens`` tokens under a full cache holds about ``tokens / 2`` on average, so a
    budget at or above that evicts nothing), FLOP budgets are kept fractions in (0, 1); two lists of equal length
    (one level each)."""
    if not kv_budgets or len(kv_budgets) != len(flop_budgets):
        raise ValueError(f"kv_budgets and flop_budgets must be non-empty lists of equal length (one budget level "
                         f"each), got {kv_budgets!r} and {flop_budgets!r}")
    for b in kv_budgets:
        if isinstance(b, bool) or not isinstance(b, int) or not 16 <= b < tokens // 2:
            raise ValueError(f"mean KV budgets must be ints in [16, tokens // 2) = [16, {tokens // 2}) (a full cache "
                             f"holds about tokens / 2 on average over a {tokens}-token stream), got {b!r}: lower the "
                             "budget or raise tokens")
    for f in flop_budgets:
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 < float(f) < 1.0:
            raise ValueError(f"FLOP budgets are kept fractions in (0, 1) (1 is the dense model), got {f!r}")


def held_trace(policy, num_layers: int, ids: torch.Tensor, chunk: int, *, vocab_size: int | None = None
               ) -> torch.Tensor:
    """``(T,)`` entries held per layer (averaged over layers) after the step of each of the ``T`` tokens of
    ``ids`` ``(1, T)``, streamed ``chunk`` at a time through ``policy``, as :class:`kvlab.KVCache` would hold
    them; simulated on positions and token ids (attention scores, which only H2O and TOVA read to choose *which*
    entries, are zeros here: they do not change *how many*). ``vocab_size``: the tokenizer's vocabulary, checked
    against a policy that reads token ids (SepLLM's separators); the largest id of ``ids`` is no stand-in for it
    (a separator may have a larger id than every token of the text)."""
    from kvlab.core.cache import LayerView
    from kvlab.core.checks import check_int

    chunk = check_int("chunk", chunk, 1)
    num_layers = check_int("num_layers", num_layers, 1)
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] < 1:
        raise ValueError(f"ids must be token ids of shape (1, T) with T >= 1 (the stream), got "
                         f"{tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__}: pass "
                         "tokenizer(text, return_tensors='pt').input_ids of a non-empty text")
    policy.check_model(num_layers)
    if vocab_size is not None and hasattr(policy, "check_vocab"):
        policy.check_vocab(vocab_size)
    n = ids.shape[1]
    pos = [torch.empty(1, 0, dtype=torch.long) for _ in range(num_layers)]
    tok = [torch.empty(1, 0, dtype=torch.long) for _ in range(num_layers)]
    states = [{} for _ in range(num_layers)]
    trace = []
    for start in range(0, n, chunk):
        end = min(start + chunk, n)
        held = 0
        for layer in range(num_layers):
            p = torch.cat([pos[layer], torch.arange(start, end)[None]], dim=1)
            t = torch.cat([tok[layer], ids[:, start:end].cpu()], dim=1)
            zeros = torch.zeros(p.shape, dtype=torch.float32)
            index = policy.keep(LayerView(layer, num_layers, end, p, t, zeros, zeros, states[layer]))
            if index is not None:
                index = index if index.dim() == 2 else index[None]
                p, t = p.gather(1, index), t.gather(1, index)
            pos[layer], tok[layer] = p, t
            held += p.shape[1]
        trace += [held / num_layers] * (end - start)
    return torch.tensor(trace, dtype=torch.float64)


def cache_policies() -> dict:
    """The policy class of each cache method; each splits a cap into its parts by its own ``for_budget`` rule."""
    from kvlab.policies import H2O, TOVA, LaCache, SepLLMStreaming, StreamingLLM

    family = {"StreamingLLM": StreamingLLM, "H2O": H2O, "TOVA": TOVA, "SepLLM": SepLLMStreaming, "LaCache": LaCache}
    return {m: family[m] for m in MATCHED_POLICIES}


def _cache_family(method: str, tokenizer):
    """The one-parameter family of a cache method: cap -> policy (mean KV grows with the cap)."""
    family = cache_policies()
    if method not in family:
        raise ValueError(f"{method!r} is not a cache method of the leaderboard; choose one of {sorted(family)}")
    policy = family[method]
    return lambda c: policy.for_budget(c, tokenizer=tokenizer)


def match_cache(method: str, budget: int, ids: torch.Tensor, chunk: int, num_layers: int, tokenizer):
    """``(cap, policy, mean_kv)``: the cap of ``method`` whose mean KV over streaming ``ids`` in chunks of
    ``chunk`` is closest to ``budget`` (bisection: the mean grows with the cap). Raises ValueError when the
    closest misses by more than :data:`KV_TOLERANCE`."""
    from kvlab.core.checks import check_float, check_int

    if method not in MATCHED_POLICIES:
        why = (": Full keeps every entry, it has no cap to match" if method == "Full" else
               ": it is held to the budget by its own rule, not by a cap" if method in CACHE_METHODS else "")
        raise ValueError(f"match_cache matches the cap of the policies {list(MATCHED_POLICIES)}, got {method!r}{why}")
    budget = check_float("budget (mean KV entries)", budget, 0.0, low_open=True)
    chunk = check_int("chunk", chunk, 1)
    make = _cache_family(method, tokenizer)
    hi = ids.shape[1]

    @functools.lru_cache(None)
    def mean(c: int) -> float:
        try:
            return float(held_trace(make(c), num_layers, ids, chunk, vocab_size=len(tokenizer)).mean())
        except ValueError:  # a cap too small for the method's fixed parts (LaCache's ladder): below every budget
            if c >= hi:  # a full cache that cannot run: the method's error, not the cap's
                raise
            return -math.inf

    if mean(hi) < budget:
        raise ValueError(f"{method}: a full cache holds {mean(hi):.1f} entries on average over these "
                         f"{hi} tokens, below the mean KV budget {budget}: lower the budget or lengthen the input")
    a, b = 1, hi
    while b - a > 1:  # invariant: mean(a) < budget <= mean(b) (or cap a is too small to be valid)
        mid = (a + b) // 2
        if mean(mid) < budget:
            a = mid
        else:
            b = mid
    cap = min((a, b), key=lambda c: abs(mean(c) - budget))
    if abs(mean(cap) - budget) > KV_TOLERANCE * budget:
        raise ValueError(f"{method}: no cap gives mean KV within {KV_TOLERANCE:.0%} of {budget} on this input "
                         f"(closest: cap {cap}, mean KV {mean(cap):.1f}); choose another budget")
    return cap, make(cap), mean(cap)


def attention_fraction(n: int, keys_per_query: int) -> float:
    """Kept share of causal attention FLOPs when each of ``n`` queries reads at most ``keys_per_query`` keys."""
    i = torch.arange(1, n + 1, dtype=torch.float64)
    return float(i.clamp(max=keys_per_query).sum() / i.sum())


def match_dhsa(fraction: float, n: int, *, minimum: int = 20) -> tuple[int, float]:
    """``(N_b, kept fraction)``: DHSA's keys per query whose kept attention FLOPs over an ``n``-token prefill are
    closest to ``fraction``; ``minimum`` = initial (4) + the longest chunk (16)."""
    best = min(range(minimum, n + 1), key=lambda b: abs(attention_fraction(n, b) - fraction))
    return best, attention_fraction(n, best)


def match_orthorank(config, fraction: float, n: int, token_ratio: float = TOKEN_RATIO, *,
                    candidates: int | None = None) -> tuple[int, float]:
    """``(routed layers, kept fraction)``: the number of routed layers (at most ``candidates``, the layers after
    the sink) whose kept decoder FLOPs over ``n`` tokens (:func:`kvlab.orthorank.flop_sparsity`) are closest to
    ``fraction``."""
    from kvlab.orthorank import flop_sparsity

    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    most = cfg.num_hidden_layers - 1 if candidates is None else min(candidates, cfg.num_hidden_layers)
    kept = {r: 1.0 - flop_sparsity(config, routed=r, token_ratio=token_ratio, seq_len=n)
            for r in range(1, most + 1)}
    best = min(kept, key=lambda r: abs(kept[r] - fraction))
    return best, kept[best]


# ================================================================================================
# models, tasks
# ================================================================================================
def model_checksum(model_id: str) -> str:
    """The sha256 of a registered model's file (``kvlab/assets/registry.json``); ``"unregistered"`` for a hub id
    or local directory (then the cell is keyed by the id alone)."""
    from kvlab import assets

    try:
        return assets.get_asset(model_id).sha256
    except (KeyError, ValueError):
        return "unregistered"


@functools.lru_cache(maxsize=1)
def _model(model_id: str):
    import kvlab

    from kvlab.threads import set_threads

    set_threads(int(os.environ.get("KVLAB_LEADERBOARD_THREADS", "0")))  # 0: KVLAB_THREADS, else this worker's share
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a worker's loading bars would land in the notebook's output, one per worker
    return kvlab.load_model(model_id, device="cpu" if not torch.cuda.is_available() else None)


def _num_layers(model) -> int:
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(cfg.num_hidden_layers)


def _passkey_task(tokenizer, length: int, depth: float, seed: int):
    from kvlab.datasets import passkey_prompt
    from kvlab.eval.tasks import LongTask

    p = passkey_prompt(tokenizer, length, depth, seed=seed + length + int(depth * 1000))
    query, prefix = " What is the pass key?", " The pass key is"
    context = p.prompt[: -len(query + prefix)]
    if context + query + prefix != p.prompt:
        raise RuntimeError("kvlab.datasets.passkey_prompt changed its layout; update kvlab.experiments.leaderboard")
    return LongTask("passkey", context, query, prefix, p.answer, [], {"answers": [p.info["passkey"]]})


def _qa_tasks(tokenizer, n: int, tokens: int, seed: int):
    from kvlab.eval.qa import qa_items
    from kvlab.eval.tasks import LongTask

    out = []
    for item in qa_items(tokenizer, "single-doc", n, tokens, seed=seed):
        cut = item.prompt.rindex("\n\nAnswer the question")
        out.append(LongTask("qa", item.prompt[:cut], item.prompt[cut:], "", " " + item.answers[0], [],
                            {"answers": item.answers}))
    return out


def _long_tasks(task: str, tokenizer, lengths, depths, examples: int, tokens: int, seed: int):
    from kvlab.eval.tasks import kv_task

    if task == "passkey":
        return [_passkey_task(tokenizer, n, d, seed) for n in lengths for d in depths]
    if task == "kv_retrieval":
        cells = [(n, d) for n in lengths for d in depths]  # seeds never share a key-value set
        return [kv_task(tokenizer, n, depth=d, seed=seed * len(cells) + i) for i, (n, d) in enumerate(cells)]
    return _qa_tasks(tokenizer, examples, tokens, seed)


# ================================================================================================
# one cell
# ================================================================================================
def _na(why: str) -> dict:
    return {"status": f"n/a: {why}"}


def _applies(method: str, task: str) -> str | None:
    """Why ``method`` does not apply to ``task`` (None: it does)."""
    if task == "ppl" and (method == "REFORM" or method.startswith("kvpress:")):
        what = "REFORM answers a question about a long input (compress, gather, recompute)" if method == "REFORM" \
            else "kvpress compresses once after a prefill"
        return f"{what}; it defines no streaming next-token loss"
    if method.startswith("kvpress:"):
        try:
            from kvlab.eval.peers import require_kvpress

            require_kvpress()
        except ImportError:
            return ("kvpress is not importable here (it needs transformers<5.3: run the leaderboard from "
                    ".venv-peers, see kvlab.eval.peers)")
    return None


@torch.no_grad()
def _nll_after(model, cache, ids: torch.Tensor, target: torch.Tensor, start: int | None = None) -> float:
    """Teacher-forced mean NLL of ``target`` after ``ids`` appended to (a copy of) ``cache``. ``start``: the
    position of the first appended token when the cache holds fewer entries than the context had (a kvpress
    cache; kvlab's own cache assigns positions itself)."""
    cache = copy.deepcopy(cache)
    seq = torch.cat([ids, target[:, :-1]], 1)
    pos = None if start is None else torch.arange(start, start + seq.shape[1], device=seq.device)[None]
    logits = model(input_ids=seq, past_key_values=cache, position_ids=pos).logits[0, ids.shape[1] - 1:]
    return float(torch.nn.functional.cross_entropy(logits.float(), target[0]))


def _press_answer(model, tokenizer, task, press_name: str, budget: int, max_new_tokens: int):
    from kvlab.eval.peers import answer_from_cache, make_press, press_prefill

    dev = next(model.parameters()).device
    ctx = tokenizer(task.context, return_tensors="pt").input_ids.to(dev)
    q = tokenizer(task.query + task.answer_prefix, return_tensors="pt", add_special_tokens=False).input_ids.to(dev)
    target = tokenizer(task.answer, return_tensors="pt", add_special_tokens=False).input_ids.to(dev)
    cache, logits = press_prefill(model, ctx, make_press(press_name, ctx.shape[1], budget))
    nll = _nll_after(model, cache, q, target, start=ctx.shape[1])
    said = tokenizer.decode(answer_from_cache(model, cache, q, max_new_tokens, start=ctx.shape[1]),
                            skip_special_tokens=True)
    return said, nll


def _orthorank_layers(model_id: str, routed: int) -> list[int]:
    """Routed layers: the ``routed`` best after the sink layer by the one-shot calibration perplexity
    (Shortened LLaMA's PPL criterion, :func:`kvlab.orthorank.search_layers`) on two WikiText windows."""
    return list(_orthorank_ranking(model_id)[:routed])


@functools.lru_cache(maxsize=4)
def _orthorank_ranking(model_id: str) -> tuple[int, ...]:
    from kvlab.datasets import load_text
    from kvlab.orthorank import after_sink, search_layers, sink_profile, text_windows

    model, tok = _model(model_id)
    text = load_text("wikitext")
    l_sink = sink_profile(model, text_windows(tok, text, 64, 2), attention=False).sink_layer
    calib = text_windows(tok, text, 64, 2, offset=256)
    candidates = after_sink(model, l_sink)
    found = search_layers(model, calib, len(candidates), action="route", search="one-shot", candidates=candidates,
                          router={"token_ratio": TOKEN_RATIO}, batch_size=2)
    return tuple(found.order)


@torch.no_grad()
def run_cell(method: str, task: str, level: int, kv_budget: int, flop_budget: float, model: str,
             model_sha256: str, seed: int, tokens: int, lengths: list, depths: list, examples: int, chunk: int,
             max_new_tokens: int, kvpress: str | None = None) -> dict:
    """One leaderboard cell: ``method`` on ``task`` at budget level ``level`` (``kv_budget`` mean KV entries for
    cache methods, ``flop_budget`` kept FLOP share for DHSA / OrthoRank) on ``model``. Returns a dict with
    ``status`` (``"ok"`` or ``"n/a: why"``), the metrics, ``mean_kv`` / ``flop_fraction`` and ``method_params``
    (what the method ran with). ``kvpress``: the installed kvpress version (part of the key of kvpress cells)."""
    from kvlab import __version__

    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    check_budgets([kv_budget], [flop_budget], tokens)
    if model_sha256 != model_checksum(model):
        raise ValueError(f"model {model!r} has checksum {model_checksum(model)}, the cell was made for "
                         f"{model_sha256}: rebuild the grid (python -m kvlab leaderboard)")
    why = _applies(method, task)
    base = {"kvlab": __version__, "method": method, "task": task, "level": level, "model": model}
    if why:
        return {**base, **_na(why)}
    torch.manual_seed(seed)
    net, tok = _model(model)
    out = {**base, "status": "ok", "method_params": {}}
    runner = _runner(method, _CellContext(net, tok, model, kv_budget, flop_budget, chunk, max_new_tokens))
    if task == "ppl":
        from kvlab.datasets import load_text
        from kvlab.eval import stream_ids

        ids = stream_ids(net, tok, load_text("wikitext"), tokens * (seed + 1))[:, seed * tokens:]  # seed-th window
        if ids.shape[1] != tokens:
            raise ValueError(f"seed {seed}: WikiText holds fewer than {tokens * (seed + 1)} tokens for the "
                             f"{seed}-th window of {tokens}: use smaller seeds or fewer tokens")
        out.update(runner.perplexity(ids, tokens))
        return out
    # question tasks: every example a LongTask (context + query + answer prefix, reference answer)
    from kvlab.eval.tasks import task_score

    why = runner.unavailable()
    if why:
        return {**base, **_na(why)}
    items = _long_tasks(task, tok, lengths, depths, examples, tokens, seed)
    acc, nlls, kv, fracs, answers = [], [], [], [], []
    for item in items:
        said, nll, held, frac, params = runner.answer(item)
        out["method_params"] = params or out["method_params"]
        kv += [held] if held is not None else []
        fracs += [frac] if frac is not None else []
        acc.append(task_score(said, item))
        nlls.append(nll)
        answers.append(said)
    out.update(accuracy=sum(acc) / len(acc), answer_nll=sum(nlls) / len(nlls), examples=len(items),
               answers=answers, mean_kv=sum(kv) / len(kv) if kv else None,
               flop_fraction=sum(fracs) / len(fracs) if fracs else runner.full_fraction)
    return out


# ------------------------------------------------------------------------------------------------
# one runner per kind of method: a cache budget (policies, REFORM, kvpress) or a FLOP budget (DHSA, OrthoRank)
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class _CellContext:
    net: Any
    tok: Any
    model_id: str
    kv_budget: int
    flop_budget: float
    chunk: int
    max_new_tokens: int

    @property
    def layers(self) -> int:
        return _num_layers(self.net)


class _PolicyRunner:
    """A KV policy in kvlab's cache (Full, or a cache method matched to the mean KV budget)."""

    full_fraction = None

    def __init__(self, method: str, ctx: _CellContext):
        self.method, self.ctx = method, ctx
        if method == "Full":
            self.full_fraction = 1.0

    def unavailable(self) -> str | None:
        return None

    def _policy(self, ids) -> tuple[Any, float, dict]:
        from kvlab.baselines import Full

        c = self.ctx
        if self.method == "Full":
            policy = Full()
            return policy, float(held_trace(policy, c.layers, ids, c.chunk).mean()), {}
        cap, policy, simulated = match_cache(self.method, c.kv_budget, ids, c.chunk, c.layers, c.tok)
        return policy, simulated, {"cap": cap, "policy": repr(policy)}

    def perplexity(self, ids, tokens: int) -> dict:
        from kvlab.eval import chunked_perplexity

        c = self.ctx
        policy, simulated, params = self._policy(ids)
        if params:
            params["simulated_mean_kv"] = simulated
        r = chunked_perplexity(c.net, c.tok, ids, policy, max_tokens=tokens, chunk_size=c.chunk)
        return dict(ppl=r.ppl, mean_kv=r.mean_kv, flop_fraction=self.full_fraction, method_params=params)

    def answer(self, item):
        from kvlab.eval import ask

        c = self.ctx
        ids = c.tok(item.prompt, return_tensors="pt").input_ids
        policy, held, params = self._policy(ids)
        said, nll = ask(c.net, c.tok, item.prompt, item.answer, policy, chunk_size=c.chunk,
                        max_new_tokens=c.max_new_tokens)
        return said, nll, held, None, params


class _ReformRunner(_PolicyRunner):
    """REFORM at the KV budget, split by its own rule (:func:`kvlab.reform.api.settings_for_budget`)."""

    def unavailable(self) -> str | None:
        from kvlab.reform.api import heads_file

        if heads_file(self.ctx.net) is None:
            return ("kvlab ships no REFORM heads for this model (kvlab/reform/heads/); choose them with "
                    "python -m kvlab.reform.heads")
        return None

    def answer(self, item):
        from kvlab.experiments.reform.compare import run_method
        from kvlab.reform.api import settings_for_budget

        c = self.ctx
        settings = settings_for_budget(c.kv_budget, chunk_size=c.chunk)
        r = run_method("reform", c.net, c.tok, item, max_new_tokens=c.max_new_tokens,
                       **{k: v for k, v in settings.items() if k != "recompute_budget"})
        return r.text, r.answer_nll, r.extra["gathered"], None, settings


class _PressRunner(_PolicyRunner):
    """A kvpress press at ``n_kept`` = the KV budget, after one prefill."""

    def answer(self, item):
        c = self.ctx
        press = self.method.split(":", 1)[1]
        said, nll = _press_answer(c.net, c.tok, item, press, c.kv_budget, c.max_new_tokens)
        return said, nll, c.kv_budget, None, {"press": press, "n_kept": c.kv_budget}


class _FlopRunner(_PolicyRunner):
    """DHSA's pattern or OrthoRank's router, matched to the kept FLOP share; the whole prompt in one prefill."""

    def setup(self, n: int, causal: bool = False):
        """The pattern or router context for an ``n``-token input, its kept fraction and its parameters.
        ``causal``: teacher-forced scoring, so DHSA ranks keys with the causal chunk query (the whole-chunk
        query averages later tokens: a leak into perplexity, notebook 07)."""
        c = self.ctx
        if self.method == "DHSA":
            return _dhsa_setup(c, n, causal)
        return _orthorank_setup(c, n)

    def perplexity(self, ids, tokens: int) -> dict:
        net = self.ctx.net
        ctx, frac, params = self.setup(ids.shape[1], causal=True)
        with ctx:
            logits = net(input_ids=ids.to(net.device), use_cache=False).logits[0, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:].to(logits.device))
        return dict(ppl=math.exp(float(nll)), flop_fraction=frac, method_params=params)

    def answer(self, item):
        from kvlab.baselines import Full
        from kvlab.eval import ask

        c = self.ctx
        n = c.tok(item.prompt, return_tensors="pt").input_ids.shape[1]
        ctx, frac, params = self.setup(n)
        with ctx:  # the whole prompt in one prefill under the pattern / router
            said, nll = ask(c.net, c.tok, item.prompt, item.answer, Full(), chunk_size=n + 1,
                            max_new_tokens=c.max_new_tokens)
        return said, nll, None, frac, params


def _dhsa_setup(c: _CellContext, n: int, causal: bool):
    from kvlab.core import use_pattern
    from kvlab.dhsa.pattern import DHSAPattern, dhsa_layers

    layers = c.layers
    chosen = dhsa_layers(c.net)  # global layers; sliding-window layers (Gemma3) stay as they are
    target = 1.0 - (1.0 - c.flop_budget) * layers / len(chosen) if len(chosen) < layers else c.flop_budget
    nb, _ = match_dhsa(target, n)
    frac = (len(chosen) * attention_fraction(n, nb) + layers - len(chosen)) / layers
    params = {"budget": nb, "chunking": "fixed", "chunk_size": 16, "initial": 4, "layers": len(chosen),
              "causal_query": causal}
    pattern = DHSAPattern(nb, chunking="fixed", chunk_size=16, causal_query=causal,
                          backend="torch" if causal else "auto")  # the causal query is the eager backend's
    return use_pattern(c.net, pattern, chosen), frac, params


def _orthorank_setup(c: _CellContext, n: int):
    from kvlab.orthorank import orthorank

    routed, frac = match_orthorank(c.net.config, c.flop_budget, n, candidates=len(_orthorank_ranking(c.model_id)))
    chosen = _orthorank_layers(c.model_id, routed)
    if len(chosen) != routed:
        raise RuntimeError(f"OrthoRank: {routed} layers to route, {len(chosen)} ranked")
    params = {"layers": chosen, "token_ratio": TOKEN_RATIO, "decode": "threshold"}
    return orthorank(c.net, chosen, TOKEN_RATIO), frac, params


def _runner(method: str, ctx: _CellContext) -> _PolicyRunner:
    """The runner of ``method``: one class per kind of budget, chosen here and nowhere else."""
    if method in FLOP_METHODS:
        return _FlopRunner(method, ctx)
    if method == "REFORM":
        return _ReformRunner(method, ctx)
    if method.startswith("kvpress:"):
        return _PressRunner(method, ctx)
    return _PolicyRunner(method, ctx)


# ================================================================================================
# the grid, the table, the plot
# ================================================================================================
NO_KVPRESS = "not installed"  # the kvpress version recorded in a cell made where kvpress does not import


def _kvpress_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("kvpress")
    except metadata.PackageNotFoundError:
        return NO_KVPRESS


def sized_grid(grid: str | dict = "tiny", *, models=None, examples: int | None = None, seeds=None) -> dict:
    """The grid's spec (a name of :data:`GRIDS` or a dict like them) with a subset of its ``models``, another
    number of ``examples`` per length and depth, and other ``seeds`` (each seed one more replicate of every cell:
    other haystacks, keys, questions and another WikiText window; seed 0 is the committed grid's); checks them."""
    if isinstance(grid, str) and grid not in GRIDS:
        raise ValueError(f"grid must be one of {sorted(GRIDS)}, got {grid!r}")
    spec = dict(GRIDS[grid]) if isinstance(grid, str) else dict(grid)
    missing = [k for k in GRIDS["tiny"] if k not in spec]
    if missing:
        raise ValueError(f"a grid dict needs every key of the named grids {list(GRIDS['tiny'])}; missing {missing} "
                         f"(start from dict(kvlab.experiments.leaderboard.GRIDS['tiny']) and change what differs)")
    if models is not None:
        spec["models"] = _grid_models(models, spec["models"])
    if examples is not None:
        if isinstance(examples, bool) or not isinstance(examples, int) or examples < 1:
            raise ValueError(f"examples must be an int >= 1 (texts per length and depth), got {examples!r}")
        spec["examples"] = examples
    if seeds is not None:
        spec["seeds"] = _grid_seeds(seeds)
    return spec


def _grid_models(models, known) -> list:
    models = list(models)
    unknown = [m for m in models if m not in known]
    if not models or unknown:
        raise ValueError(f"models must be a non-empty subset of this grid's models {known}, got "
                         f"{models!r}: name models of the grid, or choose another --grid")
    return models


def _grid_seeds(seeds) -> list[int]:
    seeds = list(seeds)
    if not seeds or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in seeds) \
            or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be a non-empty list of distinct ints >= 0 (one replicate each), got "
                         f"{seeds!r}: e.g. seeds=[0, 1, 2] or --seeds 0,1,2")
    return seeds


def cell_tasks(grid: str | dict = "tiny", *, methods=METHODS, tasks=TASKS):
    """The :class:`kvlab.experiments.sweep.Task` s of a grid (a name of :data:`GRIDS` or a dict like them); checks the
    budgets first."""
    from kvlab.experiments.sweep import Task

    spec = dict(GRIDS[grid]) if isinstance(grid, str) else dict(grid)
    check_budgets(spec["kv_budgets"], spec["flop_budgets"], spec["tokens"])
    for m in methods:
        if m not in METHODS:
            raise ValueError(f"methods must be among {METHODS}, got {m!r}")
    sizes = {k: spec[k] for k in ("tokens", "lengths", "depths", "examples", "chunk", "max_new_tokens")}
    out = []
    for rank, model in enumerate(spec["models"]):  # one model after the other: a worker holds one model
        sha = model_checksum(model)
        for seed in spec["seeds"]:
            for task in tasks:
                for method in methods:
                    levels = [0] if method == "Full" else range(len(spec["kv_budgets"]))
                    for level in levels:
                        params = dict(method=method, task=task, level=level, kv_budget=spec["kv_budgets"][level],
                                      flop_budget=spec["flop_budgets"][level], model=model, model_sha256=sha,
                                      seed=seed, **sizes)
                        if method.startswith("kvpress:"):  # a cell made where kvpress is missing is redone where it is
                            params["kvpress"] = _kvpress_version()
                        name = f"{model}-s{seed}-{task}-{method.replace(':', '-')}-b{level}"
                        if params.get("kvpress") == NO_KVPRESS:  # never overwrites a cell run with kvpress
                            name += "-no-kvpress"
                        cost = 10.0 * (len(spec["models"]) - rank) + (
                            0.2 if _applies(method, task) else 3.0 if method == "REFORM" else 1.0)
                        out.append(Task(name, "kvlab.experiments.leaderboard:run_cell", params, cost=cost))
    return out


def _without_kvpress(params: dict) -> str:
    return json.dumps({k: v for k, v in params.items() if k != "kvpress"}, sort_keys=True, default=str)


def collect(out, cells=None) -> list[dict]:
    """The rows of the tidy table from the cell records under ``out/cells`` (a committed run: ``out/cells.jsonl.gz``,
    :func:`_packed_cells`); with ``cells`` (the grid's
    :class:`kvlab.experiments.sweep.Task` s) only theirs, made by this kvlab and these model files. A kvpress cell run where
    kvpress imports (``.venv-peers``) replaces the same cell marked n/a where it does not."""
    found = [(p.stem, p, None) for p in sorted(Path(out, "cells").glob("*.json"))] or _packed_cells(out)
    if cells is not None:  # only this grid's cell files and their twins (NAME-no-kvpress, NAME-...); not others'
        bases = {t.name.removesuffix("-no-kvpress") for t in cells}
        found = [f for f in found if f[0] in bases or any(f[0].startswith(b + "-") for b in bases)]
    records = [_cell_record(path, rec) for _, path, rec in found]
    if cells is not None:
        records = _grid_records(records, cells)
    return [_row(rec) for rec in records]


#: a committed run keeps its cells in one file beside its table (benchmarks/results holds no cells/ folder)
CELLS_PACK = "cells.jsonl.gz"


def _packed_cells(out) -> list[tuple[str, str, dict]]:
    """(name, where, record) of each cell in ``out/cells.jsonl.gz``: one line ``{"file": "NAME.json", "cell": ...}``
    per file that the run wrote into ``cells/``; empty when there is no such file."""
    import gzip

    path = Path(out, CELLS_PACK)
    if not path.is_file():
        return []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        lines = [(i, json.loads(line)) for i, line in enumerate(fh, start=1) if line.strip()]
    return [(Path(d["file"]).stem, f"{path}:{i}", d["cell"]) for i, d in lines]


def pack_cells(out, into) -> Path:
    """``into/cells.jsonl.gz`` from the cell files of ``out/cells`` (what :func:`_packed_cells` reads back): a run's
    cells as one file, the way the committed results keep them."""
    import gzip

    path = Path(into, CELLS_PACK)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
        for f in sorted(Path(out, "cells").glob("*.json")):
            cell = {"file": f.name, "cell": json.loads(f.read_text())}
            gz.write((json.dumps(cell, separators=(",", ":")) + "\n").encode())
    return path


def _cell_record(path, rec: dict | None = None) -> dict:
    try:
        rec = json.loads(Path(path).read_text()) if rec is None else rec
        rec["params"]["method"], rec["result"]["status"], rec["key"]  # noqa: B018 - the fields rows need
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"leaderboard cell file {path} is damaged or not a cell record ({type(exc).__name__}: "
                         f"{exc}); delete it and run the leaderboard again (without --report-only) to "
                         "recompute that cell") from None
    return rec


def _grid_records(records: list[dict], cells) -> list[dict]:
    """The records of the grid's cells; a kvpress cell made where kvpress imports (its params name its version,
    ok or n/a) replaces its twin made where it does not."""
    from kvlab import __version__
    from kvlab.experiments.sweep import task_key

    wanted = {task_key(t) for t in cells}
    peers = {_without_kvpress(t.params) for t in cells if t.params["method"].startswith("kvpress:")}
    peer_made = [rec for rec in records if rec["params"]["method"].startswith("kvpress:")
                 and rec["params"].get("kvpress") not in (None, NO_KVPRESS)
                 and rec["result"].get("kvlab") == __version__
                 and _without_kvpress(rec["params"]) in peers]
    ran = {_without_kvpress(rec["params"]) for rec in peer_made}
    return [rec for rec in records if rec["key"] in wanted and not any(rec is q for q in peer_made)
            and _without_kvpress(rec["params"]) not in ran] + peer_made


def _row(rec: dict) -> dict:
    p, r = rec["params"], rec["result"]
    kind = "reference" if p["method"] == "Full" else "flops" if p["method"] in FLOP_METHODS else "kv"
    return dict(model=p["model"], model_sha256=p["model_sha256"], seed=p["seed"], task=p["task"],
                method=p["method"], kind=kind, level=p["level"],
                kv_budget=p["kv_budget"] if kind == "kv" else None,
                flop_budget=p["flop_budget"] if kind == "flops" else None,
                mean_kv=r.get("mean_kv"), flop_fraction=r.get("flop_fraction"), ppl=r.get("ppl"),
                accuracy=r.get("accuracy"), answer_nll=r.get("answer_nll"), status=r["status"],
                method_params=json.dumps(r.get("method_params", {}), sort_keys=True),
                kvlab=r.get("kvlab"), key=rec["key"], seconds=round(rec["wall_seconds"], 2))


def _fmt(x, digits=2):
    return "" if x is None else f"{x:.{digits}f}"


def markdown(rows: list[dict]) -> str:
    """One table per model: a row per method and budget level, a column per task (its main metric)."""
    lines = []
    tasks = [t for t in TASKS if any(r["task"] == t for r in rows)]  # the tasks this run has
    for model in sorted({r["model"] for r in rows}):
        lines += _model_table(model, [r for r in rows if r["model"] == model], tasks) + [""]
    reasons = sorted({(r["method"], r["task"], r["status"][5:]) for r in rows if r["status"] != "ok"})
    if reasons:
        lines.append("n/a: " + "; ".join(f"{m} on {t}: {why}" for m, t, why in reasons))
    return "\n".join(lines)


def _model_table(model: str, mine: list[dict], tasks: list[str]) -> list[str]:
    heads = " | ".join(f"{t}{'' if MAIN_METRIC[t][0] == t else ' ' + MAIN_METRIC[t][0]} "
                       f"{'↓' if MAIN_METRIC[t][1] else '↑'}" for t in tasks)
    lines = [f"**{model}**", "", f"| method | level | cost | {heads} |", "|---|---|---|" + "---|" * len(tasks)]
    for method in METHODS:
        for level in sorted({r["level"] for r in mine if r["method"] == method}):
            cells = {r["task"]: r for r in mine if r["method"] == method and r["level"] == level}
            vals = [_cell_text(cells.get(t), t) for t in tasks]
            lines.append(f"| {method} | {'-' if method == 'Full' else level} | {_cost_text(cells)} | "
                         + " | ".join(vals) + " |")
    return lines


def _cost_text(cells: dict) -> str:
    """The cost column of one method and level: the range of mean KV (or kept FLOP share) of its ok cells."""
    ok = [r for r in cells.values() if r["status"] == "ok"]
    if not ok:
        return ""
    if ok[0]["kind"] == "flops":
        return f"FLOPs {min(r['flop_fraction'] for r in ok):.2f}-{max(r['flop_fraction'] for r in ok):.2f}"
    kvs = [r["mean_kv"] for r in ok if r["mean_kv"] is not None]
    return f"KV {min(kvs):.0f}-{max(kvs):.0f}" if kvs else ""


def _cell_text(row: dict | None, task: str) -> str:
    if row is None:
        return ""
    if row["status"] != "ok":
        return "n/a"
    metric = MAIN_METRIC[task][0]
    return _fmt(row[metric], 3 if metric == "answer_nll" else 2)


def _pareto(points: list[tuple[float, float]], lower_better: bool) -> list[tuple[float, float]]:
    """The non-dominated points (less cost, better quality), by cost."""
    front, best = [], None
    for x, y in sorted(points):
        if best is None or (y < best if lower_better else y > best):
            front.append((x, y))
            best = y
    return front


def _clip_outliers(ax, values: list[float], lower_better: bool, factor: float = 4.0) -> None:
    """Clip a lower-is-better axis to the meaningful range: values above ``factor`` x the median (a collapsed
    run's perplexity in the tens of thousands) leave the axis, and a note on the axes says how many and the largest."""
    if not lower_better or len(values) < 3:
        return
    ordered = sorted(values)
    median = ordered[len(ordered) // 2]
    top = factor * median
    above = [v for v in ordered if v > top]
    if median <= 0 or not above:
        return
    kept = [v for v in ordered if v <= top]
    ax.set_ylim(kept[0] - 0.05 * (top - kept[0]), top)
    ax.text(0.98, 0.97, f"{len(above)} point{'s' if len(above) > 1 else ''} above, up to {max(above):,.0f}",
            transform=ax.transAxes, ha="right", va="top", fontsize=7, color="dimgrey")


def pareto_plot(rows: list[dict], path=None):
    """Quality against cost, one row of axes per task: left mean KV (cache methods, Full), right kept FLOP share
    (DHSA, OrthoRank, Full); one marker per model, the Pareto front of each model dashed, every method named in
    the legend under its column. A lower-is-better axis whose outliers run far above the rest (a collapsed
    perplexity) is clipped, with the outliers counted on the axes. Saves to ``path`` if given."""
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in rows})
    tasks = [t for t in TASKS if any(r["task"] == t for r in rows)]
    style = {"markers": dict(zip(models, "os^Dv")), "colors": {m: plt.cm.tab20(i % 20) for i, m in enumerate(METHODS)}}
    columns = [("mean_kv", ("kv", "reference"), "mean KV (entries)"),
               ("flop_fraction", ("flops", "reference"), "kept FLOP share")]
    fig, axes = plt.subplots(len(tasks), 2, figsize=(10, 2.9 * len(tasks) + 1.6), squeeze=False)
    legends = [{}, {}]  # per column: method -> a marker handle
    for row, task in enumerate(tasks):
        for col, column in enumerate(columns):
            _pareto_axes(axes[row][col], rows, task, models, column, style, legends[col])
    fig.suptitle("kvlab leaderboard: " + ", ".join(f"{m} ({style['markers'][m]})" for m in models))
    for col, entries in enumerate(legends):  # one legend per column, under the grid: it never covers a point
        if entries:
            axes[-1][col].legend(list(entries.values()), list(entries.keys()), fontsize=7, frameon=False,
                                 loc="upper center", ncol=3, bbox_to_anchor=(0.5, -0.3))
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    return fig


def _pareto_axes(ax, rows: list[dict], task: str, models: list, column: tuple, style: dict, legend: dict) -> None:
    """One task's points of one cost column (every model), each model's Pareto front dashed."""
    metric, lower = MAIN_METRIC[task]
    xkey, kinds, label = column
    shown = []
    for model in models:
        pts = [r for r in rows if r["task"] == task and r["model"] == model and r["kind"] in kinds
               and r["status"] == "ok" and r.get(xkey) is not None and r.get(metric) is not None]
        for r in pts:
            handle = ax.scatter(r[xkey], r[metric], color=style["colors"][r["method"]],
                                marker=style["markers"][model], s=40)
            legend.setdefault(r["method"], handle)  # the first point of a method, whatever model
            shown.append(float(r[metric]))
        front = _pareto([(r[xkey], r[metric]) for r in pts], lower)
        if len(front) > 1:
            ax.plot(*zip(*front), ls="--", color="grey", lw=0.8)
    if metric == "ppl":  # a collapsed run's perplexity would flatten every other point
        _clip_outliers(ax, shown, lower)
    ax.set_xlabel(label)
    ax.set_ylabel(f"{metric} ({'lower' if lower else 'higher'} is better)", fontsize=8)
    ax.set_title(task, fontsize=9)


#: what a run writes beside ``cells/``
TABLE_FILES = ("leaderboard.csv", "leaderboard.parquet", "leaderboard.md", "pareto.png")

#: where a run writes unless told: never over the committed ``benchmarks/results/leaderboard`` (pass ``--out`` for that)
DEFAULT_OUT = "build/leaderboard"


def run_leaderboard(grid: str | dict = "tiny", out=DEFAULT_OUT, *, workers: int | None = 2,
                    scheduler: str | None = None, methods=METHODS, tasks=TASKS, progress: bool = True,
                    run: bool = True, gpu_workers: int | str = 0, workers_per_gpu: int = 1,
                    device: str | None = None, models=None, examples: int | None = None, seeds=None):
    """Run (or resume) a grid on a Dask cluster, then write ``leaderboard.csv`` (and ``.parquet`` where pyarrow
    is installed), ``leaderboard.md`` and ``pareto.png`` under ``out``; ``run=False`` only writes them from the
    cells already finished (a sweep cut short). Returns ``(report, rows)``.

    ``gpu_workers`` (``"auto"``: ``workers_per_gpu`` per visible GPU) starts a local cluster of GPU workers, each
    pinned to one GPU (:func:`kvlab.experiments.sweep.local_cluster`); then every cell runs on them and ``workers`` is not
    used. ``device="gpu"`` sends the cells to the GPU workers of a ``scheduler``'s cluster (default: ``"gpu"``
    with local GPU workers, else ``"cpu"``). ``models`` runs a subset of the grid's models, ``examples`` sets the
    number of texts per length and depth of the question tasks (more work per cell, other cells' keys), ``seeds``
    the replicates (more cells: :func:`sized_grid`)."""
    from kvlab.experiments.sweep import SweepReport
    from kvlab.outputs import OutputFolder

    out = Path(out)
    spec = sized_grid(grid, models=models, examples=examples, seeds=seeds)
    cells = cell_tasks(spec, methods=methods, tasks=tasks)
    if device not in (None, "cpu", "gpu"):
        raise ValueError(f"device must be 'cpu', 'gpu' or None (gpu with local GPU workers), got {device!r}")
    if run and scheduler is None and gpu_workers:
        from kvlab.experiments.sweep import gpu_worker_devices

        gpu_workers = len(gpu_worker_devices(gpu_workers, workers_per_gpu))  # "auto" on a CPU machine: 0
        if gpu_workers:
            workers = None  # every cell goes to the GPU workers
    device = device or ("gpu" if gpu_workers and scheduler is None else "cpu")
    for cell in cells:
        cell.device = device
    # the output rule (kvlab.outputs): out holds only what the leaderboard wrote (its manifest says which; a file
    # named leaderboard.md that it did not write is the user's); cells/ is the sweep's, checked by it
    written = OutputFolder(out, "python -m kvlab leaderboard", others=("cells",))
    report = _run_cells(cells, out, scheduler=scheduler, workers=workers, progress=progress,
                        gpu_workers=gpu_workers, workers_per_gpu=workers_per_gpu) if run else SweepReport()
    rows = collect(out, cells)
    if rows:
        _write_tables(written, rows, _how(grid, out, tasks, methods, models, examples, seeds))
    return report, rows


def _run_cells(cells, out: Path, *, scheduler, workers, progress, gpu_workers, workers_per_gpu):
    """Run the grid's unfinished cells into ``out/cells``: on a Dask cluster, or one after the other where Dask is
    missing (``.venv-peers``: kvpress, no Dask)."""
    from kvlab.experiments.sweep import SweepReport, call_task, open_results, run_sweep, task_finished

    if importlib.util.find_spec("distributed") is not None:
        return run_sweep(cells, out / "cells", scheduler=scheduler, workers=workers, progress=progress,
                         gpu_workers=gpu_workers if scheduler is None else 0, workers_per_gpu=workers_per_gpu,
                         python_path=[str(Path(__file__).resolve().parents[2])])
    report = SweepReport()
    open_results(cells, out / "cells")
    for t in cells:
        if task_finished(t, out / "cells"):
            report.skipped.append(t.name)
        else:
            report.done.append(call_task(t, str(out / "cells"), []))
    return report


def _how(grid, out, tasks, methods, models, examples, seeds) -> str:
    """The command that makes this table, for its first line."""
    if not isinstance(grid, str):
        return f"`kvlab.experiments.leaderboard.run_leaderboard({grid!r})`"
    subset = "".join(f" --{what} {','.join(chosen)}" for what, chosen, every in
                     (("tasks", tasks, TASKS), ("methods", methods, METHODS)) if tuple(chosen) != tuple(every))
    subset += (f" --models {','.join(models)}" if models else "") + (f" --examples {examples}" if examples else "")
    subset += f" --seeds {','.join(map(str, seeds))}" if seeds is not None else ""
    return f"`python -m kvlab leaderboard --grid {grid}{subset} --out {out}`"


def _write_whole(written, name: str, write) -> None:
    """``write(path)`` into a temporary sibling, then renamed to ``name``: an interrupted run (Ctrl-C) leaves the
    earlier file or the new one, never half of one. Both names are claimed in the folder's manifest first."""
    final, tmp = written.claim(name, f".partial-{name}")  # the extension stays last: matplotlib reads it
    try:
        write(tmp)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def _write_tables(written, rows: list[dict], how: str) -> None:
    """``leaderboard.csv`` (and ``.parquet`` where pyarrow is installed), ``leaderboard.md`` and ``pareto.png``,
    each claimed in the folder's manifest first and each written whole (:func:`_write_whole`)."""
    import csv

    def table(path):
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)

    _write_whole(written, "leaderboard.csv", table)
    try:
        import pandas as pd
        import pyarrow  # noqa: F401

        _write_whole(written, "leaderboard.parquet", pd.DataFrame(rows).to_parquet)
    except ImportError:
        if written.owns("leaderboard.parquet") and (written.root / "leaderboard.parquet").exists():
            written.remove("leaderboard.parquet")  # never leave a stale copy beside the CSV
    text = (f"Made by {how} (kvlab {__import__('kvlab').__version__}); cells in `cells/`, every number in "
            f"`leaderboard.csv`.\n\n{markdown(rows)}\n")
    _write_whole(written, "leaderboard.md", lambda path: path.write_text(text))
    import matplotlib.pyplot as plt

    _write_whole(written, "pareto.png", lambda path: plt.close(pareto_plot(rows, path)))


def main(argv: list[str] | None = None) -> int:
    import argparse

    from kvlab.experiments.sweep import gpu_workers_arg

    p = argparse.ArgumentParser(prog="python -m kvlab leaderboard", description=__doc__.split("\n\n")[0])
    p.add_argument("--grid", default="tiny", choices=sorted(GRIDS))
    p.add_argument("--out", default=DEFAULT_OUT,
                   help=f"result folder (default {DEFAULT_OUT}; the committed table is benchmarks/results/leaderboard, "
                        "written only when named here)")
    p.add_argument("--workers", type=int, default=None, help="local Dask worker processes (default: cores - 1)")
    p.add_argument("--gpu-workers", type=gpu_workers_arg, default=0,
                   help="local workers each pinned to one GPU (CUDA_VISIBLE_DEVICES), every cell on them; 'auto': "
                        "one per visible GPU (default 0: the CPU workers, which use a GPU when there is one)")
    p.add_argument("--workers-per-gpu", type=int, default=1, help="GPU workers sharing one GPU (default 1)")
    p.add_argument("--scheduler", help="address of a running Dask scheduler (default: a local cluster)")
    p.add_argument("--device", choices=["cpu", "gpu"], default=None,
                   help="gpu: cells only on workers holding the GPU resource (default: gpu with --gpu-workers)")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of the methods")
    p.add_argument("--tasks", default=",".join(TASKS), help="comma-separated subset of the tasks")
    p.add_argument("--report-only", action="store_true", help="write the table and plot from finished cells only")
    p.add_argument("--models", default=None, help="comma-separated subset of the grid's models (default: all)")
    p.add_argument("--examples", type=int, default=None,
                   help="texts per length and depth of the question tasks (default: the grid's)")
    p.add_argument("--seeds", default=None,
                   help="comma-separated replicate seeds, e.g. 0,1,2 (default: the grid's; seed 0 is the committed one)")
    args = p.parse_args(argv)
    tasks, methods = args.tasks.split(","), args.methods.split(",")
    problems = [f"--tasks must be among {', '.join(TASKS)}, got {t!r}" for t in tasks if t not in TASKS]
    problems += [f"--methods must be among {', '.join(METHODS)}, got {m!r}" for m in methods if m not in METHODS]
    if args.workers is not None and args.workers < 1:
        problems.append(f"--workers must be >= 1, got {args.workers}")
    if args.workers is not None and args.gpu_workers:
        problems.append("--workers and --gpu-workers: give one (with GPU workers every cell runs on them)")
    if args.workers_per_gpu < 1:
        problems.append(f"--workers-per-gpu must be >= 1, got {args.workers_per_gpu}")
    seeds = None
    if args.seeds is not None:
        try:
            seeds = [int(x) for x in args.seeds.split(",")]
        except ValueError:
            problems.append(f"--seeds must be comma-separated whole numbers such as 0,1,2, got {args.seeds!r}")
    if problems:
        print("kvlab leaderboard: " + "; ".join(problems), file=sys.stderr)
        return 2
    try:
        report, rows = run_leaderboard(args.grid, args.out, workers=args.workers, scheduler=args.scheduler,
                                       methods=methods, tasks=tasks, run=not args.report_only,
                                       gpu_workers=args.gpu_workers, workers_per_gpu=args.workers_per_gpu,
                                       device=args.device, examples=args.examples, seeds=seeds,
                                       models=args.models.split(",") if args.models else None)
    except (ValueError, OSError) as exc:
        print(str(exc) if str(exc).startswith("kvlab leaderboard:") else f"kvlab leaderboard: {exc}", file=sys.stderr)
        return 2
    print(report.summary())
    if not rows:
        print(f"kvlab leaderboard: no finished cells of this grid under {args.out}/cells", file=sys.stderr)
    print(markdown(rows))
    return 1 if report.failed else 0
