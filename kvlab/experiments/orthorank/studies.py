"""Experiments of the OrthoRank notebooks (11, 12) that are also run from the command line.

Paper: OrthoRank (Shin, Oh and Oh, ICML 2025), Tables 1-4, Figs. 2-7. What is here:

* :func:`zero_shot` (Table 2): lm-eval's zero-shot ``acc`` / ``acc_norm`` (:mod:`kvlab.eval.zeroshot`) of each
  plan (dense, SLEB, OrthoRank at 10% / 20%) on PIQA, WinoGrande, HellaSwag, ARC-e and ARC-c;
* :func:`model_study` (Figs. 2-3 and Table 1 on another model): the sink layer and the cosine curves, then the
  greedy SLEB and OrthoRank searches on a small calibration set and their perplexity on the C4 stand-in, with
  the CPU time of each plan's evaluation beside it;
* :func:`layer_token_table` (Table 4): at one sparsity, layers removed (token ratio 0) against layers routed
  at each token ratio, every configuration with its own greedy search;
* :func:`sink_alignment` (Figs. 2-3, 6-7 per window): on one window per C4 document, the cosine of the tokens
  to the sink right after ``l_sink`` and at the last layer, the same for another token, and the sink's and the
  other tokens' self-similarity across the layers after ``l_sink``; :data:`ALIGNMENT_PAIRS` the readings;
* :func:`layerwise_plans` (Fig. 4): each layer routed alone, most against least orthogonal tokens, and
  :func:`pooled_records` for the claim over all layers but the last; :func:`table4_plans` (Table 4 on the
  same windows); :func:`paired_difference` (bootstrap interval and exact sign test of each comparison);
* :func:`table1_plans`, :func:`document_windows`, :func:`window_nll`, :func:`paired_ppl_ratio` (Table 1 with
  intervals, and Table 3's rows on the same windows): one window from each of many C4 documents, the NLL of
  every window under every plan (``*.examples.jsonl`` records), and a paired bootstrap over the windows for
  each comparison of the paper (OrthoRank vs SLEB, OrthoRank one-shot vs Shortened LLaMA).

Command line (:mod:`kvlab.experiments.orthorank.commands`; each writes ``NAME.json`` with its parameters and
``NAME.examples.jsonl.gz``; ``benchmarks/results/orthorank/README.md`` lists the commands behind the numbers quoted)::

    python -m kvlab run orthorank-zeroshot --questions 20 --layers notebook11.json --out DIR
    python -m kvlab run orthorank-geometry --model qwen2.5-coder-0.5b --profile 4x128 --out DIR
    python -m kvlab run orthorank-model --model gemma3-270m --calib 2x128 --eval 4x128 --out DIR
    python -m kvlab run orthorank-table4 --calib 8x256 --eval 16x256 --layers notebook11.json --out DIR
    python -m kvlab run orthorank-table1 --layers notebook11.json --doc-len 256 --table3 --out DIR
    python -m kvlab run orthorank-alignment --model gemma3-270m --doc-len 256 --out DIR
    python -m kvlab run orthorank-fig4 --layers notebook11.json --doc-len 256 --out DIR
    python -m kvlab run orthorank-table4docs --layers notebook11.json --doc-len 256 --out DIR

Windows start with a BOS token where the model's tokenizer adds one (Gemma3: its sink is the BOS token).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from kvlab.core import check_float, check_int, check_token_ids
from kvlab.eval import zeroshot
from kvlab.eval.stats import paired_bootstrap
from kvlab.experiments.records import NOT_RECORDED, record
from kvlab.orthorank.api import after_sink, sink_profile
from kvlab.orthorank.layers import Plan, layers_for_sparsity, perplexity, search_layers, text_windows, use_plan

__all__ = ["standard_plans", "zero_shot", "mean_accuracy", "geometry", "model_study", "layer_token_table",
           "table1_plans", "table3_plans", "document_windows", "window_nll", "paired_ppl_ratio", "TABLE1_PAIRS",
           "TABLE3_PAIRS", "plans_from_results", "table1_study", "sink_alignment", "ALIGNMENT_PAIRS",
           "paired_difference", "layerwise_plans", "pooled_records", "table4_plans",
           "plans_from_orders", "shortened_kept_blocks"]


def standard_plans(model: torch.nn.Module, calib: torch.Tensor, candidates: list[int], *,
                   sparsities=(0.1, 0.2), token_ratio: float = 0.33, batch_size: int = 4,
                   progress: bool = False) -> dict[str, Any]:
    """Greedy SLEB (every layer a candidate) and OrthoRank (``candidates``) searches on ``calib`` deep enough for
    the largest sparsity; returns ``{"plans": {"Dense": Plan(), "SLEB 10%": ..., "OrthoRank 10%": ...},
    "sleb": LayerSearch, "orthorank": LayerSearch}``. The smaller sparsities use prefixes of the greedy order."""
    num_layers = model.config.get_text_config().num_hidden_layers
    n_remove = {s: layers_for_sparsity(num_layers, s) for s in sparsities}
    n_route = {s: min(layers_for_sparsity(num_layers, s, token_ratio), len(candidates)) for s in sparsities}
    sleb = search_layers(model, calib, max(n_remove.values()), action="remove", batch_size=batch_size,
                         progress=progress)
    ortho = search_layers(model, calib, max(n_route.values()), action="route", candidates=candidates,
                          router={"token_ratio": token_ratio}, batch_size=batch_size, progress=progress)
    plans: dict[str, Plan] = {"Dense": Plan()}
    for s in sparsities:
        plans[f"SLEB {s:.0%}"] = sleb.plan(n_remove[s])
        plans[f"OrthoRank {s:.0%}"] = ortho.plan(n_route[s])
    return {"plans": plans, "sleb": sleb, "orthorank": ortho}


def zero_shot(model: torch.nn.Module, tokenizer, plans: dict[str, Plan], *, tasks=zeroshot.TASKS,
              questions: int = 100, add_bos: bool = False, progress: bool = False) -> dict[str, dict[str, dict]]:
    """Table 2: ``{plan name: {task: {"acc", "acc_norm", "acc_stderr", "acc_norm_stderr", "n"}}}`` on the first
    ``questions`` of each task, the model running each plan in turn (one sequence per forward pass)."""
    questions = check_int("questions", questions, 1)
    loaded = {t: zeroshot.load_task(t, questions) for t in tasks}
    table: dict[str, dict[str, dict]] = {}
    for name, plan in plans.items():
        table[name] = {}
        for task, qs in loaded.items():
            t0 = time.perf_counter()
            with use_plan(model, plan):
                r = zeroshot.evaluate_task(model, tokenizer, qs, add_bos=add_bos)
            table[name][task] = {"acc": r.acc, "acc_norm": r.acc_norm, "acc_stderr": r.acc_stderr,
                                 "acc_norm_stderr": r.acc_norm_stderr, "n": r.n,
                                 "seconds": time.perf_counter() - t0}
            if progress:
                print(f"  {name:16s} {task:14s} acc {r.acc:.3f} acc_norm "
                      f"{'-' if r.acc_norm is None else f'{r.acc_norm:.3f}'} ({time.perf_counter() - t0:.0f} s)",
                      flush=True)
    return table


def mean_accuracy(row: dict[str, dict], metric: str = "acc") -> float:
    """Mean over tasks of ``metric`` (``"acc"``, or ``"acc_norm"`` where the task has it and ``acc`` where it
    does not, as WinoGrande)."""
    values = [r[metric] if r.get(metric) is not None else r["acc"] for r in row.values()]
    return sum(values) / len(values)


@torch.no_grad()
def model_study(model: torch.nn.Module, calib: torch.Tensor, evaluation: torch.Tensor, *, profile: torch.Tensor,
                sparsities=(0.1, 0.2), token_ratio: float = 0.33, batch_size: int = 4,
                progress: bool = False) -> dict[str, Any]:
    """Figs. 2-3 and Table 1 on one model: ``l_sink`` and the curves from ``profile (n, seq)`` ids, greedy
    SLEB / OrthoRank on ``calib``, perplexity of each plan on ``evaluation`` with its CPU/GPU seconds."""
    prof = sink_profile(model, profile, attention=False)
    candidates = after_sink(model, prof.sink_layer)
    t0 = time.perf_counter()
    found = standard_plans(model, calib, candidates, sparsities=sparsities, token_ratio=token_ratio,
                           batch_size=batch_size, progress=progress)
    search_seconds = time.perf_counter() - t0
    num_layers = model.config.get_text_config().num_hidden_layers
    rows = []
    for name, plan in found["plans"].items():
        t1 = time.perf_counter()
        ppl = perplexity(model, evaluation, plan, batch_size=batch_size)
        rows.append({"method": name, "sparsity": plan.sparsity(num_layers), "ppl": ppl,
                     "removed": list(plan.removed), "routed": list(plan.routed),
                     "seconds": time.perf_counter() - t1})
        if progress:
            print(f"  {name:16s} ppl {ppl:8.2f}", flush=True)
    post = prof.cos_tokens[prof.sink_layer + 1:]
    return {
        "num_layers": num_layers, "l_sink": prof.sink_layer,
        "norm_ratio": prof.norm_ratio.tolist(), "cos_to_sink": prof.cos_to_sink.tolist(),
        "sink_self_cos": prof.sink_self_cos.tolist(), "token_self_cos": prof.token_self_cos.tolist(),
        "rising_share": float((post[-1] >= post[0]).float().mean()) if len(post) > 1 else None,
        "sleb_order": found["sleb"].order, "orthorank_order": found["orthorank"].order,
        "search_seconds": search_seconds, "table": rows,
    }


@torch.no_grad()
def geometry(model: torch.nn.Module, profile: torch.Tensor) -> dict[str, Any]:
    """Figs. 2-3 in numbers: ``l_sink``, the norm ratio, attention mass on token 0, the cosine to the sink per
    layer, and the self-similarity across layers after ``l_sink`` (sink vs other tokens)."""
    prof = sink_profile(model, profile)
    s = prof.sink_layer
    num_layers = len(prof.cos_to_sink)
    box = slice(s + 1, num_layers)
    off = ~torch.eye(max(num_layers - s - 1, 0), dtype=torch.bool)
    post = prof.cos_tokens[s + 1:]
    return {
        "num_layers": num_layers, "l_sink": s, "attention_layer": prof.attention_layer,
        "norm_ratio": prof.norm_ratio.tolist(), "attention_mass": prof.attention_mass.tolist(),
        "cos_to_sink": prof.cos_to_sink.tolist(), "norm_spread": prof.norm_spread.tolist(),
        "sink_self_cos": prof.sink_self_cos.tolist(), "token_self_cos": prof.token_self_cos.tolist(),
        "sink_self_after": float(prof.sink_self_cos[box, box][off].mean()) if off.numel() else None,
        "token_self_after": float(prof.token_self_cos[box, box][off].mean()) if off.numel() else None,
        "rising_share": float((post[-1] >= post[0]).float().mean()) if len(post) > 1 else None,
    }


def layer_token_table(model: torch.nn.Module, calib: torch.Tensor, evaluation: torch.Tensor, candidates: list[int],
                      *, sparsity: float = 0.2, token_ratios=(0.0, 0.33, 0.5), batch_size: int = 4,
                      known: dict[float, list[int]] | None = None, progress: bool = False) -> list[dict[str, Any]]:
    """Table 4: at ``sparsity``, for each token ratio the fewest layers that reach it (ratio 0: removed, SLEB's
    search over every layer; otherwise routed, OrthoRank's search over ``candidates``) and the perplexity.
    ``known``: token ratio -> greedy order already found on the same ``calib`` and candidates (its prefix is
    what the search would return), so that search is not run again."""
    num_layers = model.config.get_text_config().num_hidden_layers
    plans = table4_plans(model, calib, candidates, sparsity=sparsity, token_ratios=token_ratios,
                         batch_size=batch_size, known=known, progress=progress)
    rows = []
    for ratio, plan in zip(token_ratios, plans.values()):
        n = len(plan.removed or plan.routed)
        ppl = perplexity(model, evaluation, plan, batch_size=batch_size)
        rows.append({"layer_ratio": n / num_layers, "token_ratio": ratio, "layers": n,
                     "sparsity": plan.sparsity(num_layers) if ratio else n / num_layers, "ppl": ppl,
                     "chosen": list(plan.removed or plan.routed)})
        if progress:
            print(f"  token ratio {ratio:.2f}: {n} layers, ppl {ppl:.2f}", flush=True)
    return rows


# ---------------------------------------------------------------------------------------------------
# Table 1 with intervals: one window per C4 document, per-window NLL, paired bootstrap over windows

#: The comparisons of Table 1 (challenger, baseline): OrthoRank against the pruning it is paired with.
TABLE1_PAIRS = (("OrthoRank 10%", "SLEB 10%"), ("OrthoRank 20%", "SLEB 20%"),
                ("OrthoRank one-shot 10%", "Shortened LLaMA PPL 10%"),
                ("OrthoRank one-shot 10%", "Shortened LLaMA Taylor+ 10%"))
#: Table 3: the method (row 5) against each ablation row on the same layers; row 4 against its confounded variant.
TABLE3_PAIRS = tuple(("T3 5 OrthoRank", row) for row in (
    "T3 1 random", "T3 2 least orthogonal", "T3 3 raw states", "T3 4 no KV for unselected (sink K/V kept)",
    "T3 4b no KV for unselected nor the sink")) + (
    ("T3 4 no KV for unselected (sink K/V kept)", "T3 4b no KV for unselected nor the sink"),)


def table1_plans(model: torch.nn.Module, calib: torch.Tensor, candidates: list[int], *, token_ratio: float = 0.33,
                 sparsities=(0.1, 0.2), batch_size: int = 4, progress: bool = False) -> dict[str, Plan]:
    """Table 1's plans as notebook 11 finds them on ``calib``: dense; greedy SLEB and OrthoRank at each sparsity;
    at the smallest sparsity Shortened LLaMA (one-shot PPL and Taylor+ removal) and OrthoRank one-shot (the
    layers whose single-layer routing hurts least, among ``candidates``)."""
    found = standard_plans(model, calib, candidates, sparsities=sparsities, token_ratio=token_ratio,
                           batch_size=batch_size, progress=progress)
    plans = dict(found["plans"])
    num_layers = model.config.get_text_config().num_hidden_layers
    s0 = min(sparsities)
    n_remove = layers_for_sparsity(num_layers, s0)
    n_route = min(layers_for_sparsity(num_layers, s0, token_ratio), len(candidates))
    plans[f"Shortened LLaMA PPL {s0:.0%}"] = search_layers(model, calib, n_remove, action="remove", search="one-shot",
                                                           batch_size=batch_size).plan(n_remove)
    keep_first, keep_last = shortened_kept_blocks(num_layers, n_remove)
    plans[f"Shortened LLaMA Taylor+ {s0:.0%}"] = search_layers(
        model, calib, n_remove, action="remove", search="taylor", keep_first=keep_first, keep_last=keep_last,
        batch_size=batch_size).plan(n_remove)
    plans[f"OrthoRank one-shot {s0:.0%}"] = search_layers(
        model, calib, n_route, action="route", search="one-shot", candidates=candidates,
        router={"token_ratio": token_ratio}, batch_size=batch_size).plan(n_route)
    return plans


def shortened_kept_blocks(num_layers: int, n_remove: int, keep_first: int = 4, keep_last: int = 2) -> tuple[int, int]:
    """The first and last blocks Shortened LLaMA's Taylor+ never removes: its ``keep_first`` / ``keep_last``
    (4 and 2, as in :func:`~kvlab.orthorank.layers.search_layers`), fewer only on a model too shallow to leave
    ``n_remove`` candidates between them (e.g. a smoke run's 4 layers: first 2 and last 1 kept, the one
    block between them removed), in the same 2 : 1 proportion."""
    num_layers = check_int("num_layers", num_layers, 1)
    n_remove = check_int("n_remove", n_remove, 0, num_layers)
    spare = num_layers - n_remove  # blocks that can be kept with n_remove candidates left
    if keep_first + keep_last <= spare:
        return keep_first, keep_last
    first = spare * keep_first // (keep_first + keep_last)
    return first, spare - first


def plans_from_results(found: dict[str, Any], token_ratio: float = 0.33) -> dict[str, Plan]:
    """Table 1's plans from a notebook-11 results JSON (its ``table``: method, target, removed, routed)."""
    names = {"Dense": "Dense", "SLEB": "SLEB", "+OrthoRank": "OrthoRank",
             "Shortened LLaMA (PPL)": "Shortened LLaMA PPL", "Shortened LLaMA (Taylor+)": "Shortened LLaMA Taylor+",
             "+OrthoRank (one-shot)": "OrthoRank one-shot"}
    plans: dict[str, Plan] = {}
    for row in found["table"]:
        base = names[row["method"]]
        name = base if base == "Dense" else f"{base} {row['target']:.0%}"
        routed = tuple(row["routed"])
        plans[name] = Plan(removed=tuple(row["removed"]), routed=routed,
                           router={"token_ratio": token_ratio} if routed else {})
    return plans


def table3_plans(routed: tuple[int, ...], token_ratio: float = 0.33) -> dict[str, Plan]:
    """Table 3's rows on fixed ``routed`` layers (the method's), each one change against row 5, plus the
    confounded row 4 (the sink's K/V removed as well) and two rows outside the paper (notebook 12)."""
    rows = {"T3 1 random": {"criterion": "random"}, "T3 2 least orthogonal": {"criterion": "least_orthogonal"},
            "T3 3 raw states": {"stage": "raw"}, "T3 4 no KV for unselected (sink K/V kept)": {"kv": "selected"},
            "T3 4b no KV for unselected nor the sink": {"kv": "selected_no_sink"}, "T3 5 OrthoRank": {},
            "T3 sink computed": {"sink": "select"}, "T3 Eq. 1 exactly": {"score": "grad"}}
    return {name: Plan(routed=tuple(routed), router={"token_ratio": token_ratio, **opts})
            for name, opts in rows.items()}


def document_windows(tokenizer, documents: dict[str, str], seq_len: int, n: int | None = None, *,
                     bos: bool | None = False) -> tuple[torch.Tensor, list[str]]:
    """One window per document: ``(ids (m, seq_len), names)``, the first ``seq_len`` tokens of each document
    (in the dict's order) that has that many; documents too short are skipped, ``n`` caps ``m``.

    Windows from different documents are independent samples of the corpus, so an interval over windows means
    something; consecutive windows of one document (:func:`~kvlab.orthorank.layers.text_windows`) are not.
    ``bos``: as in :func:`~kvlab.orthorank.layers.text_windows` (None: BOS first where the tokenizer adds one).
    Raises when fewer than 2 documents are long enough."""
    seq_len = check_int("seq_len", seq_len, 2)
    if n is not None:
        n = check_int("n", n, 2)
    if bos is None:
        bos = tokenizer.bos_token_id is not None and tokenizer("a").input_ids[:1] == [tokenizer.bos_token_id]
    if bos and tokenizer.bos_token_id is None:
        raise ValueError("bos=True but the tokenizer has no BOS token: use bos=False")
    body = seq_len - 1 if bos else seq_len
    rows, names = [], []
    seen: dict[tuple, str] = {}
    for name, text in documents.items():
        ids = tokenizer(text, add_special_tokens=False).input_ids
        if len(ids) < body:
            continue
        window = tuple(ids[:body])
        if window in seen:  # the same text twice is one sample, not two: an interval would be too narrow
            continue
        seen[window] = name
        rows.append(([tokenizer.bos_token_id] if bos else []) + list(ids[:body]))
        names.append(name)
        if n is not None and len(rows) == n:
            break
    if len(rows) < 2:
        repeated = len(documents) - len(rows)
        raise ValueError(f"only {len(rows)} of {len(documents)} documents have {body} tokens and differ from every "
                         f"other document's first {body} tokens ({repeated} short or repeated): use a shorter seq_len "
                         "or more distinct documents")
    return torch.tensor(rows), names


@torch.no_grad()
def window_nll(model: torch.nn.Module, windows: torch.Tensor, plan: Plan | None = None, *,
               batch_size: int = 4) -> list[float]:
    """Mean NLL (nats per predicted token) of each window ``(n, seq_len)`` under ``plan``: one value per window,
    ``exp(mean(values))`` is :func:`~kvlab.orthorank.layers.perplexity` of the same windows."""
    if not isinstance(windows, torch.Tensor) or windows.dim() != 2 or windows.shape[1] < 2:
        raise ValueError(f"windows must be token ids of shape (n, seq_len >= 2), got "
                         f"{getattr(windows, 'shape', type(windows).__name__)}")
    windows = check_token_ids("windows", windows, model.get_input_embeddings().num_embeddings)
    device = next(model.parameters()).device
    out: list[float] = []
    with use_plan(model, plan):
        for ids in windows.split(check_int("batch_size", batch_size, 1)):
            ids = ids.to(device)
            logits = model(input_ids=ids, use_cache=False).logits
            nll = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2).float(), ids[:, 1:],
                                                    reduction="none").double().mean(dim=1)
            out.extend(nll.cpu().tolist())
    return out


def paired_ppl_ratio(challenger: list[float], baseline: list[float], *, resamples: int = 10000,
                     seed: int = 0) -> dict[str, float]:
    """Perplexity ratio ``exp(mean(challenger) - mean(baseline))`` of two methods' per-window NLLs on the same
    windows, with the 95 % paired percentile bootstrap of :func:`kvlab.eval.stats.paired_bootstrap` (windows
    resampled with replacement, the same draw for both methods) mapped through ``exp``. Below 1: the challenger
    has the lower perplexity. Returns ``ratio``, ``low``, ``high``, ``n``."""
    if len(challenger) != len(baseline) or len(challenger) < 2:
        raise ValueError(f"challenger and baseline must hold one NLL per window, the same >= 2 windows; got "
                         f"{len(challenger)} and {len(baseline)}")
    diff = paired_bootstrap(challenger, baseline, resamples=resamples, seed=seed)
    worst = max(abs(diff.estimate), abs(diff.low), abs(diff.high))
    if worst > 700:  # exp overflows a float past ~709
        raise ValueError(f"challenger and baseline differ by up to {worst:.0f} nats per token, so the perplexity "
                         "ratio exp(difference) overflows a float: pass mean NLLs per predicted token (window_nll "
                         "gives them), not summed NLLs or logits")
    return {"ratio": math.exp(diff.estimate), "low": math.exp(diff.low), "high": math.exp(diff.high), "n": diff.n}


def table1_study(model: torch.nn.Module, windows: torch.Tensor, names: list[str], plans: dict[str, Plan], *,
                 batch_size: int = 4, pairs=TABLE1_PAIRS, resamples: int = 10000, config: dict | None = None,
                 progress: bool = False) -> dict[str, Any]:
    """Every plan on every window: ``{"table": [{method, ppl, removed, routed, seconds}], "pairs":
    [{challenger, baseline, ratio, low, high, n}], "examples": [per-window records]}``. The records follow the
    shared ``*.examples.jsonl`` format (``example``: the document's name and token range, ``metric``: ``"nll"``)."""
    if len(names) != windows.shape[0]:
        raise ValueError(f"names must name each of the {windows.shape[0]} windows, got {len(names)}")
    num_layers = model.config.get_text_config().num_hidden_layers
    nll: dict[str, list[float]] = {}
    table, examples = [], []
    for name, plan in plans.items():
        t0 = time.perf_counter()
        nll[name] = window_nll(model, windows, plan, batch_size=batch_size)
        seconds = time.perf_counter() - t0
        ppl = math.exp(sum(nll[name]) / len(names))
        table.append({"method": name, "sparsity": plan.sparsity(num_layers), "ppl": ppl,
                      "removed": list(plan.removed), "routed": list(plan.routed), "router": dict(plan.router),
                      "seconds": seconds})
        for doc, value in zip(names, nll[name]):
            examples.append(record(f"{doc}:0-{windows.shape[1]}", name, "nll", value, config=config or {},
                                   device=_device(model)))
        if progress:
            print(f"  {name:44s} ppl {table[-1]['ppl']:8.2f} ({seconds:.0f} s)", flush=True)
    compared = [{"challenger": a, "baseline": b, **paired_ppl_ratio(nll[a], nll[b], resamples=resamples)}
                for a, b in pairs if a in nll and b in nll]
    return {"table": table, "pairs": compared, "examples": examples}



# ---------------------------------------------------------------------------------------------------
# Figs. 2-3, 6-7 per window; Fig. 4 layer by layer; Table 4 and Table 2 with per-example records


@torch.no_grad()
def sink_alignment(model: torch.nn.Module, windows: torch.Tensor, names: list[str], *, sink_layer: int,
                   other: int | None = None) -> dict[str, Any]:
    """Figs. 2-3 and 6-7, one value per window (windows from different documents are independent samples).

    For each window ``(seq,)`` of ``windows (n, seq)``, on the normalised states ``h_bar`` (the input RMSNorm
    of each layer) of layers ``first = sink_layer + 1`` and ``last = L - 1``:

    * ``to sink at first`` / ``to sink at last``: mean ``cos(h_bar_0, h_bar_j)`` over ``j >= 1`` (Fig. 2: it
      rises after the sink layer);
    * ``to token i at first`` / ``to token i at last``: the same for token ``i = other`` (default ``seq // 2``)
      against ``j not in {0, i}`` (Fig. 7 c-d: another token draws no such alignment), and the two rises
      ``rise to sink`` / ``rise to token i`` (last minus first);
    * ``sink across layers`` / ``other tokens across layers``: mean off-diagonal ``cos(h_bar^a, h_bar^b)``
      over pairs of layers ``a != b`` after the sink layer, of the sink and (averaged) of tokens ``j >= 1``
      (Figs. 3 and 6: the sink barely moves, other tokens drift).

    Returns ``{"sink_layer", "first", "last", "other", "means": {name: mean}, "examples": [records]}`` with
    records in the shared ``*.examples.jsonl`` format (metric ``"cos"``)."""
    if not isinstance(windows, torch.Tensor) or windows.dim() != 2 or windows.shape[1] < 3:
        raise ValueError(f"windows must be token ids of shape (n, seq >= 3), got "
                         f"{getattr(windows, 'shape', type(windows).__name__)}")
    if len(names) != windows.shape[0]:
        raise ValueError(f"names must name each of the {windows.shape[0]} windows, got {len(names)}")
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    layers = list(decoder.layers)
    num_layers = len(layers)
    sink_layer = check_int("sink_layer", sink_layer, -1, num_layers - 3)
    seq = windows.shape[1]
    other = seq // 2 if other is None else check_int("other", other, 1, seq - 1)
    first, last = sink_layer + 1, num_layers - 1
    device = next(model.parameters()).device
    values: dict[str, list[float]] = {k: [] for k in (
        "to sink at first", "to sink at last", "to token i at first", "to token i at last", "rise to sink",
        "rise to token i", "sink across layers", "other tokens across layers")}
    rest = [j for j in range(1, seq) if j != other]
    for ids in windows:
        states = model(input_ids=ids[None].to(device), output_hidden_states=True, use_cache=False).hidden_states
        unit = torch.stack([torch.nn.functional.normalize(layers[l].input_layernorm(states[l]).float()[0], dim=-1)
                            for l in range(first, num_layers)])  # (layers after the sink, seq, hidden)
        to_sink = (unit[:, 1:] @ unit[:, 0, :, None]).squeeze(-1).mean(dim=1)  # per layer
        to_other = (unit[:, rest] @ unit[:, other, :, None]).squeeze(-1).mean(dim=1)
        k = unit.shape[0]
        off = ~torch.eye(k, dtype=torch.bool, device=unit.device)
        sink_self = unit[:, 0] @ unit[:, 0].T
        token_self = torch.einsum("anh,bnh->ab", unit[:, 1:], unit[:, 1:]) / (seq - 1)
        row = {"to sink at first": to_sink[0], "to sink at last": to_sink[-1], "to token i at first": to_other[0],
               "to token i at last": to_other[-1], "rise to sink": to_sink[-1] - to_sink[0],
               "rise to token i": to_other[-1] - to_other[0],
               "sink across layers": sink_self[off].mean() if k > 1 else sink_self[0, 0],
               "other tokens across layers": token_self[off].mean() if k > 1 else token_self[0, 0]}
        for key, v in row.items():
            values[key].append(float(v))
    config = {"sink_layer": sink_layer, "first": first, "last": last, "other": other, "seq": seq}
    examples = [record(f"{doc}:0-{seq}", key, "cos", v, config=config, device=_device(model))
                for key, vs in values.items() for doc, v in zip(names, vs)]
    return {**config, "means": {k: sum(v) / len(v) for k, v in values.items()}, "examples": examples}


#: Figs. 2-3 / 6-7 comparisons (a, b), the paper reading a > b.
ALIGNMENT_PAIRS = (("to sink at last", "to sink at first"), ("sink across layers", "other tokens across layers"),
                   ("rise to sink", "rise to token i"))


def paired_difference(a: list[float], b: list[float]) -> dict[str, float]:
    """Mean ``a - b`` over paired examples with its 95 % paired bootstrap interval and the exact sign test."""
    from kvlab.eval.stats import sign_test

    d = paired_bootstrap(a, b)
    s = sign_test(a, b)
    return {"mean_diff": d.estimate, "low": d.low, "high": d.high, "n": d.n, "a_above": s.wins,
            "b_above": s.losses, "ties": s.ties, "sign_p": s.p}


def layerwise_plans(layers: list[int], token_ratio: float = 0.33) -> tuple[dict[str, Plan], list[tuple[str, str]]]:
    """Fig. 4: one routed layer at a time, the most orthogonal tokens (the method) against the least orthogonal
    (the opposite criterion); ``({name: plan}, [(orthogonal, least orthogonal) per layer])``."""
    if not layers:
        raise ValueError("layers must name at least one layer to route (Fig. 4: the layers after the sink)")
    for layer in layers:
        check_int("layers[i]", layer, 0)
    repeated = sorted({x for x in layers if list(layers).count(x) > 1})
    if repeated:
        raise ValueError(f"layers must be distinct (each gives one pair of Fig. 4), got {list(layers)} with "
                         f"{repeated} repeated: name each layer once")
    plans, pairs = {}, []
    for layer in layers:
        a, b = f"Fig4 L{layer} orthogonal", f"Fig4 L{layer} least orthogonal"
        plans[a] = Plan(routed=(layer,), router={"token_ratio": token_ratio})
        plans[b] = Plan(routed=(layer,), router={"token_ratio": token_ratio, "criterion": "least_orthogonal"})
        pairs.append((a, b))
    return plans, pairs


def pooled_records(examples: list[dict], methods: list[str], name: str) -> list[dict]:
    """Per example, the mean value of ``methods`` (e.g. Fig. 4's orthogonal layers but the last) as records of
    a method ``name``: one paired comparison over windows for a claim about many layers at once."""
    if not methods:
        raise ValueError("methods must name at least one method to pool")
    if len(set(methods)) != len(methods):
        raise ValueError(f"methods must be distinct, got {list(methods)}: a method named twice would count twice")
    by_example: dict = {}
    metrics = sorted({str(r["metric"]) for r in examples if r["method"] in methods})
    if len(metrics) > 1:
        raise ValueError(f"the records of {list(methods)} hold several metrics {metrics}: a mean over different "
                         "metrics means nothing; pass the records of one metric")
    config = {}
    duplicates = []
    for r in examples:
        if r["method"] in methods:
            values = by_example.setdefault(r["example"], {})
            if r["method"] in values:
                duplicates.append((r["example"], r["method"]))
            values[r["method"]] = r["value"]
            config = r.get("config", {})
    if duplicates:
        raise ValueError(f"{len(duplicates)} duplicate records (the same example and method twice), e.g. "
                         f"{duplicates[:3]}: keep one record per example and method")
    short = {k: sorted(set(methods) - set(v)) for k, v in by_example.items() if set(v) != set(methods)}
    if not by_example or short:
        raise ValueError(f"every example needs a value for each of the {len(methods)} methods {list(methods)}; "
                         f"missing: {list(short.items())[:3] or 'all'}")
    return [record(k, name, metrics[0], sum(v.values()) / len(v), config=dict(config, pooled=list(methods)),
                   device=config.get("device", NOT_RECORDED)) for k, v in by_example.items()]


def table4_plans(model: torch.nn.Module, calib: torch.Tensor, candidates: list[int], *, sparsity: float = 0.2,
                 token_ratios=(0.0, 0.33, 0.5), batch_size: int = 4, known: dict[float, list[int]] | None = None,
                 progress: bool = False, num_layers: int | None = None) -> dict[str, Plan]:
    """Table 4's configurations at ``sparsity`` (see :func:`layer_token_table`) as plans named
    ``"T4 layers 0.20 / tokens 0.00"`` (layer ratio = layers changed / layers).

    ``num_layers``: the depth the plans are sized and named for (default the model's). Deeper than the model (a
    smoke run's tiny model standing in for the full one, :mod:`kvlab.experiments.orthorank.layer_frame`):
    ``candidates`` and ``known`` are that depth's layers, layer ``l`` runs as ``l mod`` the model's depth, and a
    configuration with no known order is searched on the model for its own count of layers at ``sparsity``."""
    sparsity = check_float("sparsity", sparsity, 0.0, 1.0)
    depth = model.config.get_text_config().num_hidden_layers
    sized = depth if num_layers is None else check_int("num_layers", num_layers, depth)
    known = known or {}
    folded = sized > depth
    pool = _fold(candidates, depth) if folded else list(candidates)
    plans = {}
    for ratio in token_ratios:
        n = _table4_layers(sized, sparsity, ratio, len(candidates))
        m = _table4_layers(depth, sparsity, ratio, len(pool))  # the same as n unless folded
        if ratio in known and len(known[ratio]) >= n:
            chosen = _fold(known[ratio][:n], depth) if folded else tuple(sorted(known[ratio][:n]))
            plan = Plan(removed=chosen) if ratio == 0 else Plan(routed=chosen, router={"token_ratio": ratio})
        elif ratio == 0:
            plan = search_layers(model, calib, m, action="remove", batch_size=batch_size, progress=progress).plan(m)
        else:
            plan = search_layers(model, calib, m, action="route", candidates=pool, router={"token_ratio": ratio},
                                 batch_size=batch_size, progress=progress).plan(m)
        plans[f"T4 layers {n / sized:.2f} / tokens {ratio:.2f}"] = plan
    return plans


def _table4_layers(num_layers: int, sparsity: float, ratio: float, candidates: int) -> int:
    """Table 4's layer count: removed (ratio 0) over every layer, routed at most the candidates."""
    if ratio == 0:
        return layers_for_sparsity(num_layers, sparsity)
    return min(layers_for_sparsity(num_layers, sparsity, ratio), candidates)


def _fold(layers, num_layers: int) -> tuple[int, ...]:
    """``layers`` of a model at least as deep as one of ``num_layers`` on it (``l mod num_layers``), sorted, once."""
    return tuple(sorted({int(layer) % num_layers for layer in layers}))


def plans_from_orders(num_layers: int, sleb_order: list[int], ortho_order: list[int], *, token_ratio: float = 0.33,
                      sparsities=(0.1, 0.2)) -> dict[str, Plan]:
    """Dense, SLEB and OrthoRank at each sparsity from greedy orders already found (prefixes of them)."""
    plans = {"Dense": Plan()}
    for s in sparsities:
        plans[f"SLEB {s:.0%}"] = Plan(removed=tuple(sorted(sleb_order[:layers_for_sparsity(num_layers, s)])))
        n = layers_for_sparsity(num_layers, s, token_ratio)
        plans[f"OrthoRank {s:.0%}"] = Plan(routed=tuple(sorted(ortho_order[:n])), router={"token_ratio": token_ratio})
    return plans


def _device(model) -> str:
    """The ``device`` of a record: ``"cpu"`` or ``"cuda (NVIDIA H200)"``."""
    dev = next(model.parameters()).device
    return f"cuda ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else dev.type
