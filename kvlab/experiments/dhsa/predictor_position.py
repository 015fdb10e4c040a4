"""Do DHSA's predicted chunks follow the text or the position? Three checks on held-out text, per predictor file.

On text no predictor was trained on (the ``botchan`` corpus), at 1K, 4K and 8K tokens, for each predictor file:

* **(a) position invariance**: the same 1,024 tokens alone (offset 0) and as positions 3,072-4,095 of a 4,096-token
  input; the share of the boundaries of one run with a boundary of the other within 2 tokens (both directions,
  interior positions; the target is >= 0.80);
* **(b) agreement with layer 0's own labels**: precision (share of predicted boundaries within 2 tokens of a
  label) and recall (share of labels within 2 tokens of a prediction), beside random placement of the same number
  of boundaries; the labels are App. B's hard labels of layer 0 on the same input (soft label >= 0.5, i.e. ratio
  >= 2, after NMS with window 8: what the predictor is trained to find);
* **(c) sentence ends**: the share of predicted boundaries within 1 token of a sentence end (a token holding
  ``.``, ``!`` or ``?``, or a blank line), beside random placement and beside the labels themselves.

Also: interior boundaries per 1K region of the 4K inputs (a position-driven predictor places more further on).
Boundaries as the experiments take them under the authors' protocol: layer 0's keys, NMS window 8, at most
``8 * ceil(n / 128)`` chunks, no cut; threshold ``p > sigmoid(1.1)`` (the authors' logit > 1.1) and each file's
own calibrated threshold. Intervals: 95 % bootstrap over inputs (``kvlab.eval.stats.paired_bootstrap``).

    python -m kvlab run dhsa-predictor-position --out benchmarks/results/dhsa/predictor_position   # CPU, ~10 min
    python -m kvlab run dhsa-predictor-position --out /tmp/x --smoke                                # seconds

Writes ``OUT/position.json`` and ``OUT/position.examples.jsonl.gz``: per input and predictor, the precision,
recall and sentence-end share of (b)-(c), and (a)'s agreement on the 4K inputs.
"""
from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import torch

from kvlab.datasets import load_text
from kvlab.dhsa.boundary_predictor import label_ratios, label_valid, nms_boundaries, predict_boundaries
from kvlab.dhsa.boundary_predictor import soft_labels
from kvlab.dhsa.pattern import AUTHORS_THRESHOLD
from kvlab.dhsa.training import SHIPPED, load_predictor
from kvlab.eval.stats import paired_bootstrap
from kvlab.experiments import records, registry
from kvlab.experiments.dhsa.measures import record_qk
from kvlab.experiments.registry import ParameterError
from kvlab.experiments.system import options
from kvlab.outputs import OutputFolder

__all__ = ["parser", "check", "run", "evaluate", "near", "windows"]

NAME = "dhsa-predictor-position"

TOL = 2  # tokens: two boundaries "agree" within this distance


def first_layer_model(name: str):
    """The model with only its first layer: layer 0's keys and attention need no other."""
    from kvlab.models import load_model

    model, tok = load_model(name, dtype=torch.float32, device="cpu")
    model.model.layers = model.model.layers[:1]
    model.config.num_hidden_layers = 1
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:1]
    return model, tok


@torch.no_grad()
def layer0(model, ids: torch.Tensor):
    """Layer 0's keys ``(1, kv_heads, n, dim)`` and its hard-label boundaries (interior chunk ends ``t``)."""
    rec = record_qk(model, ids[None], [0])
    q, k = rec.q[0], rec.k[0]
    n = k.shape[2]
    g = q.shape[1] // k.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    attn = torch.zeros(n, n)
    for h in range(q.shape[1]):  # head by head: an 8K map per head, not nine at once
        s = (q[0, h] @ k[0, h // g].T) * rec.scaling[0]
        attn += torch.softmax(s.masked_fill(~causal, float("-inf")), -1)
    attn /= q.shape[1]
    y = soft_labels(label_ratios(attn, 4)).float()
    valid = label_valid(n, 4)
    bd = nms_boundaries(y[None], max_chunks=n, threshold=0.4999, nms_window=8, valid=valid[None])[0]
    return k, set((bd[1:-1] - 1).tolist())


def predicted(pred, k, threshold: float) -> set[int]:
    n = k.shape[2]
    bd = predict_boundaries(pred, k, max_chunks=8 * math.ceil(n / 128), threshold=threshold, nms_window=8)[0]
    return set((bd[1:-1] - 1).tolist())


def near(a: set[int], b: set[int], tol: int) -> float:
    """Share of ``a`` with an element of ``b`` within ``tol`` (nan for an empty ``a``)."""
    if not a:
        return float("nan")
    return sum(any(abs(x - y) <= tol for y in b) for x in a) / len(a)


def random_sets(count: int, n: int, draws: int, seed: int) -> list[set[int]]:
    rng = random.Random(seed)
    pool = [t for t in range(7, n - 8)]  # label_valid's positions
    return [set(rng.sample(pool, min(count, len(pool)))) for _ in range(draws)]


def sentence_ends(tok, ids: torch.Tensor) -> set[int]:
    """Tokens that end a sentence (hold ``.``, ``!`` or ``?``) or a paragraph (a blank line); a single newline is
    left out: the held-out text is wrapped at about 70 characters, mid-sentence."""
    return {i for i, t in enumerate(ids.tolist()) if any(c in tok.decode([t]) for c in ".!?") or
            "\n\n" in tok.decode([t])}


def mean_ci(values: list[float]) -> dict:
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return {"mean": float("nan"), "low": float("nan"), "high": float("nan"), "n": 0}
    iv = paired_bootstrap(vals)
    return {"mean": round(iv.estimate, 4), "low": round(iv.low, 4), "high": round(iv.high, 4), "n": len(vals)}


def windows(tok, text: str, plan: dict[int, int]) -> dict[int, list[torch.Tensor]]:
    """Non-overlapping token windows of each length, one after another through the text."""
    ids = tok(text, return_tensors="pt", add_special_tokens=False).input_ids[0]
    out, at = {}, 0
    for n, count in plan.items():
        out[n] = []
        for _ in range(count):
            if at + n > ids.numel():
                raise ValueError(f"the held-out text has {ids.numel()} tokens, too few for the plan {plan}")
            out[n].append(ids[at:at + n].clone())
            at += n
    return out


def _agreement(r: dict, got: set, labels: set, ends: set, n: int, draws: int, seed: int) -> None:
    """(b) and (c) of one input for one predictor, beside ``draws`` random placements of as many boundaries."""
    r["count"].append(len(got) * 1000 / n)
    r["precision"].append(near(got, labels, TOL))
    r["recall"].append(near(labels, got, TOL))
    r["sentence"].append(near(got, ends, 1))
    rs = random_sets(len(got), n, draws, seed=seed)
    r["rand_precision"].append(sum(near(s, labels, TOL) for s in rs) / draws)
    r["rand_recall"].append(sum(near(labels, s, TOL) for s in rs) / draws)
    r["rand_sentence"].append(sum(near(s, ends, 1) for s in rs) / draws)


def _alone_vs_inside(model, ids, pred, thr, got: set) -> dict:
    """(a): the last 1,024 tokens of a 4K input alone against their boundaries inside it."""
    k_alone, _ = layer0(model, ids[3072:])
    alone = {t for t in predicted(pred, k_alone, thr) if 8 <= t < 1016}
    inside = {t - 3072 for t in got if 3072 + 8 <= t < 4096 - 8}
    return {"alone": len(alone), "inside": len(inside), "alone_in_inside": near(alone, inside, TOL),
            "inside_in_alone": near(inside, alone, TOL)}


def _a_summary(a: list[dict]) -> dict:
    both = [(x["alone_in_inside"] + x["inside_in_alone"]) / 2 for x in a]
    return {"agree_mean_of_both_directions": mean_ci(both), "alone_in_inside": mean_ci([x["alone_in_inside"] for x in a]),
            "inside_in_alone": mean_ci([x["inside_in_alone"] for x in a])}


def evaluate(model, tok, preds: dict, wins: dict[int, list[torch.Tensor]], draws: int,
             recs: list | None = None) -> dict:
    """(a)-(c) for every predictor on every window; ``recs`` (a list) receives one record per (input, predictor,
    measure)."""
    rows = {name: {"b": {}, "c": {}, "a": [], "per_1k": []} for name in preds}
    labels_c, random_c = {}, {}
    for n, group in wins.items():
        per = {name: {"precision": [], "recall": [], "rand_precision": [], "rand_recall": [], "sentence": [],
                      "rand_sentence": [], "count": []} for name in preds}
        lab_sent, lab_count = [], []
        for i, ids in enumerate(group):
            t0 = time.perf_counter()
            k, labels = layer0(model, ids)
            ends = sentence_ends(tok, ids)
            lab_sent.append(near(labels, ends, 1))
            lab_count.append(len(labels) * 1000 / n)
            for name, (pred, thr) in preds.items():
                got = predicted(pred, k, thr)
                _agreement(per[name], got, labels, ends, n, draws, seed=1000 * n + i)
                if n == 4096:  # (a): the last 1,024 tokens alone against their boundaries inside the 4K input
                    rows[name]["a"].append(_alone_vs_inside(model, ids, pred, thr, got))
                    rows[name]["per_1k"].append([sum(1 for t in got if 1024 * j <= t < 1024 * (j + 1))
                                                 for j in range(4)])
            print(f"  n={n} input {i}: {time.perf_counter() - t0:.0f} s", flush=True)
        for name in preds:
            rows[name]["b"][n] = {key: mean_ci(v) for key, v in per[name].items()}
            if recs is not None:
                recs += [records.record(f"botchan/L{n}/{j}", name, key, None if math.isnan(v) else v,
                                        config={"length": n, "tolerance": TOL, "draws": draws}, device="cpu")
                         for key, vals in per[name].items() for j, v in enumerate(vals)]
        labels_c[n] = {"sentence": mean_ci(lab_sent), "per_1k_tokens": mean_ci(lab_count)}
        random_c[n] = None
    for name in preds:
        if rows[name]["a"]:
            rows[name]["a_summary"] = _a_summary(rows[name]["a"])
    return {"predictors": rows, "labels": labels_c}


def parser():
    p = registry.experiment_parser(NAME, __doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--corpus", default="botchan", help="held-out text (no predictor was trained on it)")
    p.add_argument("--files", type=options.number_list(str, what="predictor file"),
                   default=["smollm2-135m-l0.pt", "smollm2-135m-l0-unrotated.pt"],
                   help="predictor files (in kvlab/dhsa/data/ or paths)")
    p.add_argument("--draws", type=registry.positive_int, default=20, help="random placements per input")
    return p


def _path(f: str) -> Path:
    return Path(f) if Path(f).exists() else SHIPPED / f


def check(args) -> None:
    from kvlab import assets

    options.check_model(args.model)
    options.check_device(args.device)
    missing = [f for f in args.files if not _path(f).is_file()]
    if missing:
        raise ParameterError(f"--files: no predictor file {missing} (in {SHIPPED} or as a path)")
    if args.corpus not in assets.list_assets("corpus"):
        raise ParameterError(f"--corpus {args.corpus!r}: not a kvlab corpus ({assets.list_assets('corpus')})")
    options.refuse_rerun(args.out, "position.json", "position" + records.SUFFIX)
    if args.smoke:
        args.draws = min(args.draws, 2)


def run(args) -> list[Path]:
    out = OutputFolder(args.out, f"python -m kvlab run {NAME}")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    model, tok = first_layer_model(args.model)
    plan = {256: 1, 1024: 1} if args.smoke else {1024: 8, 4096: 6, 8192: 2}
    wins = windows(tok, load_text(args.corpus), plan)
    preds = {}
    for f in args.files:
        path = _path(f)
        pred, meta = load_predictor(path)
        cal = pred.calibrated_threshold if pred.calibrated_threshold is not None else 0.5
        preds[f"{path.name} p>{AUTHORS_THRESHOLD:.2f}"] = (pred, AUTHORS_THRESHOLD)
        if abs(cal - AUTHORS_THRESHOLD) > 0.01:
            preds[f"{path.name} p>{cal:.2f} (calibrated)"] = (pred, cal)
    recs: list = []
    result = evaluate(model, tok, preds, wins, args.draws, recs)
    result["meta"] = {"command": f"python -m kvlab run {NAME}" + (" --smoke" if args.smoke else ""),
                      "corpus": args.corpus, "plan": {str(k): v for k, v in plan.items()}, "tolerance": TOL,
                      "draws": args.draws, "threads": 1, "seconds": round(time.perf_counter() - t_start),
                      "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    rec_path = records.write("position" + records.SUFFIX, recs, out=out)
    js = options.write_json(out, "position.json", result)
    print(json.dumps({name: r.get("a_summary") for name, r in result["predictors"].items()}, indent=1))
    return [rec_path, js]
