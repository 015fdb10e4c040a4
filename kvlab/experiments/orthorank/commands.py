"""OrthoRank's studies from the command line: ``python -m kvlab run orthorank-WHAT [OPTIONS]``.

``WHAT`` is one of :data:`STUDIES`: ``zeroshot`` (Table 2), ``geometry`` (Figs. 2-3 in numbers), ``model`` (Figs.
2-3 and Table 1 on another model), ``table4`` (layer vs token ratio), ``table1`` (one window per C4 document,
Table 3's rows with ``--table3``), ``alignment`` (Figs. 2-3, 6-7 per window), ``fig4`` (layer-wise selection) and
``table4docs`` (Table 4 per window). Each writes ``OUT/NAME.json`` (its parameters and summary) and
``OUT/NAME.examples.jsonl.gz`` (:mod:`kvlab.experiments.records`); every option is checked before the model loads,
and a second run into the same ``--out`` with the same ``--name`` is refused. ``--smoke`` runs the same code on a
few short windows with SmolLM2-135M's tokenizer over a tiny random model of its architecture (4 layers; the layers
of a ``--layers`` file are folded onto them, :func:`read_layers`). With a ``--layers`` file, ``fig4`` and
``table4docs`` size and name their plans on the full model's 30 layers and its ``l_sink`` (the file's) and run them
folded onto the 4 (:mod:`~kvlab.experiments.orthorank.layer_frame`), so a smoke run writes the full run's method
names (``Fig4 orthogonal (mean over layers 12-28)``, ``T4 layers 0.30 / tokens 0.33``).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kvlab.experiments import records, registry
from kvlab.experiments.orthorank.layer_frame import read_layers
from kvlab.experiments.registry import ParameterError
from kvlab.experiments.system import options
from kvlab.outputs import OutputFolder

__all__ = ["STUDIES", "PLAN_NAMES", "parser", "check", "run", "load_model", "read_layers"]

STUDIES = ("zeroshot", "geometry", "model", "table4", "table1", "alignment", "fig4", "table4docs")
#: The plans table1 can evaluate (``--plans`` picks some): Table 1's and Table 3's rows.
PLAN_NAMES = ("Dense", "SLEB 10%", "OrthoRank 10%", "SLEB 20%", "OrthoRank 20%", "Shortened LLaMA PPL 10%",
              "Shortened LLaMA Taylor+ 10%", "OrthoRank one-shot 10%", "T3 1 random", "T3 2 least orthogonal",
              "T3 3 raw states", "T3 4 no KV for unselected (sink K/V kept)", "T3 4b no KV for unselected nor the sink",
              "T3 5 OrthoRank", "T3 sink computed", "T3 Eq. 1 exactly")
WITH_RECORDS = ("alignment", "fig4", "table4docs", "table1")  # per-window records; the others per plan or layer


def _windows_spec(text: str) -> tuple[int, int]:
    import argparse

    n, sep, length = str(text).partition("x")
    try:
        n, length = int(n), int(length)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not N x LEN (e.g. 8x256)") from None
    if not sep or n < 1 or length < 2:
        raise argparse.ArgumentTypeError(f"{text!r}: windows are N x LEN with N >= 1 and LEN >= 2 (e.g. 8x256)")
    return n, length


def _ratio(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"token ratio {value} must lie strictly between 0 and 1")
    return value


def parser(what: str):
    from kvlab.eval import zeroshot

    p = registry.experiment_parser(f"orthorank-{what}", __doc__.split("\n\n")[0])
    p.set_defaults(what=what)
    p.add_argument("--name", type=options.stem, default=what,
                   help="stem of the files written (NAME.json, NAME.examples.jsonl.gz; default %(default)s)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--profile", type=_windows_spec, default=(4, 256), help="sink geometry sequences, N x LEN")
    p.add_argument("--calib", type=_windows_spec, default=(8, 256), help="calibration windows, N x LEN (WikiText)")
    p.add_argument("--calib-offset", type=options.nonnegative_int, default=1024, help="first calibration token")
    p.add_argument("--eval", type=_windows_spec, default=(16, 256), help="evaluation windows, N x LEN (C4)")
    p.add_argument("--questions", type=registry.positive_int, default=100, help="zeroshot: questions per task")
    p.add_argument("--tasks", type=registry.names_list(zeroshot.TASKS, what="task"), default=list(zeroshot.TASKS))
    p.add_argument("--layers", default="", help="JSON with sleb_order / orthorank_order found on the same "
                   "calibration windows (notebook 11's results), reused instead of searching")
    p.add_argument("--token-ratio", type=_ratio, default=0.33)
    p.add_argument("--doc-len", type=registry.positive_int, default=256, help="tokens of the one window per document")
    p.add_argument("--documents", type=options.nonnegative_int, default=0,
                   help="at most this many documents (0: every one with --doc-len tokens)")
    p.add_argument("--table3", action="store_true", help="table1: also Table 3's rows on OrthoRank's 20%% layers")
    p.add_argument("--plans", type=registry.names_list(PLAN_NAMES, what="plan"), default=None,
                   help="table1: evaluate only these plans (comma-separated names); default every one")
    p.add_argument("--batch-size", type=registry.positive_int, default=4)
    p.add_argument("--threads", type=options.nonnegative_int, default=0, help="torch threads (0: torch's default)")
    return p


def check(args) -> None:
    options.check_model(args.model)
    options.check_device(args.device)
    if args.layers and not Path(args.layers).is_file():
        raise ParameterError(f"--layers {args.layers}: no such file (notebook 11's results JSON, e.g. "
                             "benchmarks/results/orthorank/notebook11_default_smollm2_cpu.json)")
    if args.documents == 1:
        raise ParameterError("--documents 1: an interval needs at least 2 documents (0: every one)")
    if args.plans and args.what != "table1":
        raise ParameterError("--plans goes with orthorank-table1")
    if args.plans and any(p.startswith("T3 ") for p in args.plans) and not args.table3:
        raise ParameterError(f"--plans {','.join(args.plans)} names Table 3's rows: add --table3")
    options.refuse_rerun(args.out, args.name + ".json", options.records_name(args.name))
    if args.smoke:  # the same code in seconds: a tiny random model (load_model) on a few short windows
        args.model = "smollm2-135m"
        args.doc_len, args.documents = min(args.doc_len, 16), 3
        args.calib, args.eval, args.profile = (1, 16), (2, 16), (2, 16)
        args.calib_offset = min(args.calib_offset, 64)
        args.questions, args.tasks = 2, args.tasks[:1]
        args.threads = 1  # a shared machine: one thread, no spinning against other processes


def load_model(args):
    """``(model, tokenizer)`` of ``args.model`` on ``args.device``; ``--smoke``: its tokenizer over a tiny random
    model of the same architecture (4 layers), so the layer searches take seconds."""
    from kvlab.experiments.sepllm.common import load_model as load

    return load(args.model, options.resolve_device(args.device), smoke=args.smoke)


def _load(args):
    import torch

    import kvlab
    from kvlab.orthorank.layers import text_windows

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, tokenizer = load_model(args)
    calib_text = kvlab.datasets.load_text("wikitext")
    # windows start with BOS where the tokenizer adds one (Gemma3); SmolLM2 and Qwen2.5 add none
    calib = text_windows(tokenizer, calib_text, args.calib[1], args.calib[0], offset=args.calib_offset, bos=None)
    return model, tokenizer, calib, calib_text


def run(args) -> list[Path]:
    out = OutputFolder(args.out, f"python -m kvlab run orthorank-{args.what}")
    started = time.perf_counter()
    model, tokenizer, calib, calib_text = _load(args)
    summary: dict[str, Any] = {"model": args.model, "calib": "x".join(map(str, args.calib)),
                               "calib_offset": args.calib_offset, "eval": "x".join(map(str, args.eval)),
                               "token_ratio": args.token_ratio, "command": f"python -m kvlab run orthorank-{args.what}",
                               "device": options.device_string(next(model.parameters()).device), "smoke": args.smoke}
    found, recs = STUDY[args.what](args, model, tokenizer, calib, calib_text)
    summary.update(found)
    summary["seconds"] = time.perf_counter() - started
    path = records.write(options.records_name(args.name), recs, out=out)
    summary["examples"] = path.name
    js = options.write_json(out, args.name + ".json", summary)
    print(f"wrote {js} and {path} ({summary['seconds']:.0f} s)")
    return [path, js]


# ------------------------------------------------------------------------------------------------ the studies
def _plan_records(table: list[dict], args, device: str, metric: str = "ppl") -> list[dict]:
    """One record per row of a perplexity table (example: the evaluation windows)."""
    config = {"model": args.model, "calib": list(args.calib), "eval": list(args.eval), "token_ratio": args.token_ratio}
    return [records.record("c4-sample/eval", str(r["method"]), metric, r[metric], config=config, device=device)
            for r in table]


def _zeroshot(args, model, tokenizer, calib, calib_text):
    from kvlab.experiments.orthorank import studies
    from kvlab.orthorank.api import after_sink, sink_profile

    if args.layers:
        num_layers = model.config.get_text_config().num_hidden_layers
        known = read_layers(args.layers, num_layers, args.smoke)
        plans = studies.plans_from_orders(num_layers, known["sleb_order"],
                                          known["orthorank_order"], token_ratio=args.token_ratio)
    else:
        sink = sink_profile(model, calib[:1], attention=False).sink_layer
        plans = studies.standard_plans(model, calib, after_sink(model, sink), token_ratio=args.token_ratio,
                                       batch_size=args.batch_size, progress=True)["plans"]
    table = studies.zero_shot(model, tokenizer, plans, tasks=tuple(args.tasks), questions=args.questions,
                              progress=True)
    device = options.device_string(next(model.parameters()).device)
    recs = [records.record(task, plan, metric, row[metric], config={"n": row["n"], "model": args.model},
                           device=device)
            for plan, by_task in table.items() for task, row in by_task.items() for metric in ("acc", "acc_norm")]
    found = {"plans": {k: {"removed": list(p.removed), "routed": list(p.routed)} for k, p in plans.items()},
             "table": table, "mean_acc": {k: studies.mean_accuracy(v) for k, v in table.items()},
             "mean_acc_norm": {k: studies.mean_accuracy(v, "acc_norm") for k, v in table.items()}}
    return found, recs


def _geometry(args, model, tokenizer, calib, calib_text):
    from kvlab.experiments.orthorank import studies
    from kvlab.orthorank.layers import text_windows

    found = studies.geometry(model, text_windows(tokenizer, calib_text, args.profile[1], args.profile[0], bos=None))
    device = options.device_string(next(model.parameters()).device)
    config = {"model": args.model, "profile": list(args.profile), "l_sink": found["l_sink"]}
    recs = [records.record(f"layer{i:02d}", key, "value", float(v), config=config, device=device)
            for key in ("norm_ratio", "attention_mass", "cos_to_sink", "norm_spread") for i, v in enumerate(found[key])]
    return found, recs


def _model_study(args, model, tokenizer, calib, calib_text):
    import kvlab
    from kvlab.experiments.orthorank import studies
    from kvlab.orthorank.layers import text_windows

    evaluation = text_windows(tokenizer, kvlab.datasets.load_text("c4-sample"), args.eval[1], args.eval[0], bos=None)
    profile = text_windows(tokenizer, calib_text, args.profile[1], args.profile[0], bos=None)
    found = studies.model_study(model, calib, evaluation, profile=profile, token_ratio=args.token_ratio,
                                batch_size=args.batch_size, progress=True)
    return found, _plan_records(found["table"], args, options.device_string(next(model.parameters()).device))


def _known_orders(args, model, frame=None) -> dict:
    """The ``--layers`` file's greedy orders by token ratio; folded onto a smoke run's tiny model unless ``frame``
    folds them itself (:mod:`~kvlab.experiments.orthorank.layer_frame`: the full model's layers are kept)."""
    if not args.layers:
        return {}
    fold = args.smoke and not (frame is not None and frame.folded)
    found = read_layers(args.layers, model.config.get_text_config().num_hidden_layers, fold)
    return {0.0: found["sleb_order"], args.token_ratio: found["orthorank_order"]}


def _sink(model, tokenizer, calib_text, smoke: bool = False) -> int:
    """l_sink as notebook 11 finds it: profiled on the first 4 x 256 WikiText tokens (smoke: 1 x 64)."""
    from kvlab.orthorank.api import sink_profile
    from kvlab.orthorank.layers import text_windows

    n, length = (1, 64) if smoke else (4, 256)
    return sink_profile(model, text_windows(tokenizer, calib_text, length, n, bos=None), attention=False).sink_layer


def _table4(args, model, tokenizer, calib, calib_text):
    import kvlab
    from kvlab.experiments.orthorank import studies
    from kvlab.orthorank.api import after_sink
    from kvlab.orthorank.layers import text_windows

    evaluation = text_windows(tokenizer, kvlab.datasets.load_text("c4-sample"), args.eval[1], args.eval[0], bos=None)
    sink = _sink(model, tokenizer, calib_text, args.smoke)
    rows = studies.layer_token_table(model, calib, evaluation, after_sink(model, sink),
                                     token_ratios=(0.0, args.token_ratio, 0.5), batch_size=args.batch_size,
                                     known=_known_orders(args, model), progress=True)
    table = [dict(r, method=f"T4 layers {r['layer_ratio']:.2f} / tokens {r['token_ratio']:.2f}") for r in rows]
    return {"l_sink": sink, "table4": rows}, _plan_records(table, args,
                                                             options.device_string(next(model.parameters()).device))


def _documents(args, tokenizer):
    import kvlab
    from kvlab.experiments.orthorank import studies

    return studies.document_windows(tokenizer, kvlab.datasets.load_documents("c4-sample"), args.doc_len,
                                    args.documents or None, bos=None)


def _table1(args, model, tokenizer, calib, calib_text):
    from kvlab.experiments.orthorank import studies
    from kvlab.orthorank.api import after_sink

    found: dict[str, Any] = {}
    if args.layers:  # the plans notebook 11 found (its results JSON)
        found_layers = read_layers(args.layers, model.config.get_text_config().num_hidden_layers, args.smoke)
        plans = studies.plans_from_results(found_layers, args.token_ratio)
        found["plans_from"] = args.layers
    else:  # notebook 11's searches: sink profiled on the first 1,024 tokens, calibration after them
        found["l_sink"] = _sink(model, tokenizer, calib_text, args.smoke)
        plans = studies.table1_plans(model, calib, after_sink(model, found["l_sink"]), token_ratio=args.token_ratio,
                                     batch_size=args.batch_size, progress=True)
    if args.table3:
        plans.update(studies.table3_plans(plans["OrthoRank 20%"].routed, args.token_ratio))
    if args.plans:
        plans = {p: plans[p] for p in args.plans}
    windows, names = _documents(args, tokenizer)
    found.update(eval_documents=len(names), doc_len=args.doc_len)
    # with --layers the plans come from a file and --calib is not used: the records say so, not the default
    calib_used = "unused: the plans' own calibration (plans_from)" if args.layers else "x".join(map(str, args.calib))
    config = {"model": args.model, "doc_len": args.doc_len, "calib": calib_used, "plans_from": args.layers or "search"}
    study = studies.table1_study(model, windows, names, plans, batch_size=args.batch_size, config=config,
                                 pairs=studies.TABLE1_PAIRS + studies.TABLE3_PAIRS, progress=True)
    found["table"], found["pairs"] = study["table"], study["pairs"]
    for p in study["pairs"]:
        print(f"  {p['challenger']} / {p['baseline']}: ppl ratio {p['ratio']:.3f} "
              f"[{p['low']:.3f}, {p['high']:.3f}] over {p['n']} windows")
    return found, study["examples"]


def _alignment(args, model, windows, names, sink):
    from kvlab.experiments.orthorank import studies

    found = studies.sink_alignment(model, windows, names, sink_layer=sink)
    examples = found.pop("examples")
    return found, examples, list(studies.ALIGNMENT_PAIRS), "cos"


def _fig4(args, model, windows, names, frame):
    from kvlab.experiments.orthorank import studies

    layers = frame.after_sink()  # the full model's layers, also in a smoke run (named as the full run names them)
    plans, pairs = studies.layerwise_plans(layers, args.token_ratio)
    if frame.folded:
        plans = {name: frame.plan(plan) for name, plan in plans.items()}
    config = {"model": args.model, "doc_len": args.doc_len}
    study = studies.table1_study(model, windows, names, plans, batch_size=args.batch_size, config=config,
                                 pairs=pairs, progress=True)
    examples = study["examples"]
    pooled = [f"Fig4 {kind} (mean over layers {layers[0]}-{layers[-2]})" for kind in ("orthogonal",
                                                                                      "least orthogonal")]
    for kind, name in zip(("orthogonal", "least orthogonal"), pooled):  # every layer after the sink but the last
        examples += studies.pooled_records(examples, [f"Fig4 L{l} {kind}" for l in layers[:-1]], name)
    return {"table": study["table"]}, examples, pairs + [tuple(pooled)], "nll"


def _table4docs(args, model, windows, names, frame, calib):
    from kvlab.experiments.orthorank import studies

    plans = studies.table4_plans(model, calib, frame.after_sink(), token_ratios=(0.0, args.token_ratio, 0.5),
                                 batch_size=args.batch_size, known=_known_orders(args, model, frame),
                                 progress=True, num_layers=frame.num_layers)
    n = list(plans)
    pairs = [(n[1], n[0]), (n[2], n[0]), (n[1], n[2])]
    config = {"model": args.model, "doc_len": args.doc_len}
    study = studies.table1_study(model, windows, names, plans, batch_size=args.batch_size, config=config,
                                 pairs=pairs, progress=True)
    return {"table": study["table"]}, study["examples"], pairs, "nll"


def _per_window(args, model, tokenizer, calib, calib_text):
    """alignment, fig4, table4docs: one window per C4 document, then the paired differences of the study."""
    from kvlab.experiments.orthorank import studies
    from kvlab.experiments.orthorank.layer_frame import layer_frame

    sink = _sink(model, tokenizer, calib_text, args.smoke)
    frame = layer_frame(args, model, sink)  # a smoke run: the full model's layers where known, folded
    windows, names = _documents(args, tokenizer)
    if args.what == "alignment":
        found, examples, pairs, metric = _alignment(args, model, windows, names, sink)
    elif args.what == "fig4":
        found, examples, pairs, metric = _fig4(args, model, windows, names, frame)
    else:
        found, examples, pairs, metric = _table4docs(args, model, windows, names, frame, calib)
    found.update(l_sink=sink, eval_documents=len(names), doc_len=args.doc_len)
    if frame.folded and args.what != "alignment":
        found["layer_frame"] = frame.as_dict()  # the plans' layers and l_sink: the full model's, folded
    values: dict[str, dict[str, float]] = {}
    for r in examples:
        if r["metric"] == metric:
            values.setdefault(r["method"], {})[r["example"]] = r["value"]
    found["pairs"] = []
    for a, b in pairs:
        keys = sorted(values[a])
        d = studies.paired_difference([values[a][k] for k in keys], [values[b][k] for k in keys])
        found["pairs"].append({"a": a, "b": b, "metric": metric, **d})
        print(f"  {a} - {b} ({metric}): {d['mean_diff']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}] n={d['n']}, "
              f"sign p={d['sign_p']:.3g}", flush=True)
    return found, examples


STUDY = {"zeroshot": _zeroshot, "geometry": _geometry, "model": _model_study, "table4": _table4, "table1": _table1,
         "alignment": _per_window, "fig4": _per_window, "table4docs": _per_window}
