"""The DHSA needle grid (Fig. 2/6), its boundary study (App. B), the LongBench stand-in (Table 1) and Table 2's
costs: ``python -m kvlab run dhsa-needle | dhsa-boundaries | dhsa-qa | dhsa-table2``.

Dense, block-sparse and DHSA under the text's protocol (``app_a``: sparse question, sparse decode) and the
authors' (``authors``: dense question tail, dense decode, shared boundaries), one record per (prompt, method) in
``OUT/NAME.examples.jsonl.gz`` as it goes (:mod:`kvlab.experiments.dhsa.measures` measures; this module reads the
options, checks them all before the model loads, and writes through the output rule).
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

from kvlab.experiments import records, registry
from kvlab.experiments.registry import ParameterError
from kvlab.experiments.system import options
from kvlab.outputs import OutputFolder

__all__ = ["parser", "check", "run", "PROTOCOLS", "BASELINES", "BACKENDS"]

PROTOCOLS = ("app_a", "authors")
BASELINES = ("dense", "block-sparse", "none")
BACKENDS = ("sdpa", "auto", "torch", "triton")
QA_TASK_NAMES = ("single-doc", "multi-doc", "few-shot")  # kvlab.eval.qa.QA_TASKS (checked by a test)

DESCRIPTIONS = {
    "needle": "Fig. 2/6 needle grid with dense, block-sparse and DHSA under the text's protocol (App. A) and the "
              "authors'; one record per (prompt, method): needle_recall and answer_nll.",
    "boundaries": "App. B: attention mass kept, chunk counts and lengths per NMS window, one record per prompt.",
    "qa": "Table 1's LongBench stand-in (SQuAD, HotpotQA, few-shot QA prompts of --qa-context tokens): token F1 "
          "and the answer's NLL per (question, method).",
    "table2": "Table 2: prefill latency / peak memory per method and backend beside the needle accuracy of "
              "--needle-file (NAME.json and NAME.md; one record per method and metric).",
}
DEFAULT_NAMES = {"needle": "dhsa_needle", "boundaries": "dhsa_boundaries", "qa": "dhsa_longbench",
                 "table2": "dhsa_table2"}


def parser(what: str):
    p = registry.experiment_parser(f"dhsa-{what}", DESCRIPTIONS[what])
    p.set_defaults(what=what)
    p.add_argument("--name", type=options.stem, default=DEFAULT_NAMES[what],
                   help="stem of the files written (NAME.examples.jsonl.gz; default %(default)s)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--predictor", default="shipped",
                   help="'shipped' (the one kvlab picks for the layer), 'shipped:NAME' (one shipped file by name, e.g. "
                        "shipped:smollm2-135m-l0, what a run before another was shipped used), a predictor file, or "
                        "'oracle'")
    p.add_argument("--budgets", type=options.number_list(int, low=1, what="budget"), default=[512],
                   help="keys per query (N_b); under the authors' protocol at least --authors-initial + --authors-local")
    p.add_argument("--chunk-size", type=registry.positive_int, default=32,
                   help="fixed chunk length; dynamic chunks are cut at twice it")
    p.add_argument("--initial", type=options.nonnegative_int, default=4, help="app_a: initial keys")
    p.add_argument("--authors-initial", type=options.nonnegative_int, default=128, help="authors: initial keys")
    p.add_argument("--authors-local", type=options.nonnegative_int, default=128,
                   help="authors: recent keys before a query block's end")
    p.add_argument("--query-block", type=registry.positive_int, default=128, help="authors: query block")
    p.add_argument("--protocols", type=registry.names_list(PROTOCOLS, what="protocol"), default=list(PROTOCOLS))
    p.add_argument("--baselines", type=registry.names_list(BASELINES, what="baseline"),
                   default=["dense", "block-sparse"], help="comma list of dense, block-sparse; or none")
    p.add_argument("--backend", choices=BACKENDS, default="sdpa", help="prefill backend of the patterns")
    p.add_argument("--nms-window", dest="nms_windows", type=options.number_list(int, low=0, what="NMS window"),
                   default=[8], help="NMS distance(s) of the predicted boundaries (0: none); several: one set of "
                                     "DHSA methods each, named with ' nms<w>'")
    p.add_argument("--newlines", action="store_true", help="DHSA also ends a chunk after every newline token")
    p.add_argument("--suffix", default="", help="appended to the DHSA method names (an ablation's label)")
    p.add_argument("--max-new-tokens", type=registry.positive_int, default=16)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=options.nonnegative_int, default=0, help="torch threads (0: torch's default)")
    if what != "qa":
        p.add_argument("--lengths", type=options.number_list(int, low=64, what="length"), default=[4096])
        p.add_argument("--depths", type=options.number_list(float, low=0.0, high=1.0, what="depth"),
                       default=[0.0, 0.25, 0.5, 0.75, 1.0])
    if what in ("needle", "boundaries"):
        p.add_argument("--trials", type=registry.positive_int, default=20, help="haystacks per (length, depth)")
    if what == "needle":
        p.add_argument("--first-trial", type=options.nonnegative_int, default=0,
                       help="start at this trial (the haystacks stay those of --trials)")
        p.add_argument("--last-trial", type=registry.positive_int, default=None,
                       help="stop before this trial (a shard of the grid)")
        p.add_argument("--max-seconds", type=float, default=None,
                       help="start no new prompt after this many seconds (the cells stay balanced)")
    if what == "table2":
        p.add_argument("--needle-file", type=options.number_list(str, what="records file"), default=None,
                       help="needle records (comma list) for the accuracy column")
        p.add_argument("--timing-backends", type=registry.names_list(BACKENDS, what="backend"),
                       default=["torch", "sdpa", "triton"])
        p.add_argument("--repeats", type=registry.positive_int, default=3, help="timed prefills per row (median)")
    if what == "qa":
        p.add_argument("--qa-per-task", type=registry.positive_int, default=12, help="questions per task")
        p.add_argument("--qa-context", type=registry.positive_int, default=2048, help="tokens of each prompt")
        p.add_argument("--seed", type=options.nonnegative_int, default=0, help="which questions")
        p.add_argument("--tasks", type=registry.names_list(QA_TASK_NAMES, what="task"), default=list(QA_TASK_NAMES),
                       help="the QA tasks (default all)")
    return p


def check(args) -> None:
    options.check_model(args.model)
    options.check_device(args.device)
    if args.predictor.startswith("shipped:"):
        from kvlab.dhsa.training import SHIPPED

        have = sorted(f.stem for f in SHIPPED.glob("*.pt"))
        if args.predictor.split(":", 1)[1] not in have:
            raise ParameterError(f"--predictor {args.predictor!r}: kvlab ships {have}; give shipped:NAME with one "
                                 "of them, 'shipped', 'oracle' or a predictor file")
    elif args.predictor not in ("shipped", "oracle") and not Path(args.predictor).is_file():
        raise ParameterError(f"--predictor {args.predictor!r}: give 'shipped', 'shipped:NAME', 'oracle' or a "
                             "predictor file (kvlab/dhsa/data/*.pt)")
    _check_methods(args)
    _check_selection(args)
    if args.what == "table2":
        options.refuse_rerun(args.out, options.records_name(args.name), args.name + ".json", args.name + ".md")
    else:  # the grid resumes: records already in OUT/NAME are kept and their examples not run again
        options.refuse_rerun(args.out, options.records_name(args.name) + ".partial")
    if args.smoke:  # the same code at tiny size: one short prompt per method, a few new tokens
        _shrink(args)


def _check_methods(args) -> None:
    """The budgets hold the keys each protocol always keeps; 'none' is the only baseline when given."""
    small = [b for b in args.budgets if b < args.authors_initial + args.authors_local]
    if "authors" in args.protocols and small:
        raise ParameterError(f"--budgets {','.join(map(str, small))}: under the authors' protocol a budget holds the "
                             f"--authors-initial {args.authors_initial} + --authors-local {args.authors_local} keys "
                             "every query block keeps; raise the budget or lower those")
    if "app_a" in args.protocols and any(b <= args.initial for b in args.budgets):
        raise ParameterError(f"--budgets must exceed --initial {args.initial} (App. A keeps the initial keys)")
    if "none" in args.baselines and len(args.baselines) > 1:
        raise ParameterError(f"--baselines {','.join(args.baselines)}: 'none' stands alone")


def _check_selection(args) -> None:
    """The prompts to run are not empty; the needle files to read are there."""
    if getattr(args, "max_seconds", None) is not None and args.max_seconds <= 0:
        raise ParameterError("--max-seconds must be > 0 (leave it out for no limit)")
    if args.what == "needle":
        end = args.trials if args.last_trial is None else min(args.last_trial, args.trials)
        if args.first_trial >= end:
            raise ParameterError(f"--first-trial {args.first_trial} leaves no trial before {end} (--trials "
                                 f"{args.trials}, --last-trial {args.last_trial}): nothing would run")
    for f in getattr(args, "needle_file", None) or []:
        try:
            records.resolve(f)
        except FileNotFoundError:
            raise ParameterError(f"--needle-file {f}: no such records file") from None


def _shrink(args) -> None:
    args.model = "smollm2-135m"  # its tokenizer (in the cache) over a tiny random-weight model
    if hasattr(args, "lengths"):
        args.lengths = [min(args.lengths[0], 320)]
        args.depths = args.depths[:1]
    if args.what == "needle":  # one haystack: the shard's first, so that shards stay apart
        args.last_trial = args.first_trial + 1
    elif args.what == "boundaries":
        args.trials = 1
    if args.what == "qa":
        args.qa_per_task, args.qa_context, args.tasks = 1, 256, args.tasks[:1]
    if args.what == "table2":
        args.repeats, args.timing_backends = 1, ["sdpa"]
    args.max_new_tokens = min(args.max_new_tokens, 4)
    args.threads = 1  # a shared machine: one thread, no spinning against other processes


def _predictor(args, device):
    from kvlab.dhsa.training import load_predictor, shipped_predictor

    if args.predictor == "oracle":
        return None
    if args.predictor == "shipped":
        return shipped_predictor(args.model, device)[0]
    if args.predictor.startswith("shipped:"):
        return shipped_predictor(args.model, device, file=args.predictor.split(":", 1)[1])[0]
    return load_predictor(args.predictor, device)[0]


def _methods(args, pred, backend: str, baselines) -> dict:
    from kvlab.experiments.dhsa.measures import needle_methods

    methods: dict = {}
    for i, w in enumerate(args.nms_windows):
        suffix = args.suffix + (f" nms{w}" if len(args.nms_windows) > 1 else "")
        methods.update(needle_methods(args.budgets, predictor=pred, chunk_size=args.chunk_size, initial=args.initial,
                                      authors_initial=args.authors_initial, authors_local=args.authors_local,
                                      query_block=args.query_block, protocols=args.protocols,
                                      baselines=baselines if i == 0 else (), backend=backend, nms_window=w,
                                      suffix=suffix, newlines=args.newlines))
    return methods


def _command(args) -> str:
    return f"python -m kvlab run dhsa-{args.what}" + (" --smoke" if args.smoke else "")


def run(args) -> list[Path]:
    import torch

    import kvlab
    from kvlab.dhsa.pattern import dhsa_layers

    out = OutputFolder(args.out, _command(args))
    device = options.resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.smoke:
        model, tok = options.smoke_model(args.model)
        pred = None if args.predictor == "oracle" else options.smoke_predictor(model)
    else:
        model, tok = kvlab.load_model(args.model, device=device, dtype=getattr(torch, args.dtype))
        pred = _predictor(args, device)
    if args.what == "table2":
        return _table2(args, out, model, tok, pred)
    baselines = () if args.baselines == ["none"] else tuple(args.baselines)
    methods = _methods(args, pred, args.backend, baselines)
    t0 = time.perf_counter()
    with records.RecordWriter(options.records_name(args.name), out=out, keep=True) as w:
        done = _done_examples(w, methods, SUMMARY_METRICS[args.what] if args.what == "boundaries" else None)
        if done:
            print(f"resuming: {len(done)} examples of {w.path} are done and not run again", flush=True)

        def sink(recs):
            for r in recs:
                w.add(r | {"config": r["config"] | {"command": _command(args)}})

        _grid(args, model, tok, methods, dhsa_layers(model), sink, done)
    recs = records.read(w.path)
    print(f"{len(recs)} records in {time.perf_counter() - t0:.0f} s -> {w.path}")
    _summary(args.what, recs, methods)
    return [w.path]


def _done_examples(w, methods, metrics=None) -> set[str]:
    """The examples whose every method has its records in the resumed file."""
    by: dict[str, set] = {}
    for example, method, metric in w.done():
        by.setdefault(example, set()).add(method)
    return {ex for ex, got in by.items() if set(methods) <= got or (metrics and set(methods) - {"dense"} <= got)}


def _grid(args, model, tok, methods, layers, sink, done=()) -> None:
    from kvlab.eval.qa import qa_items
    from kvlab.experiments.dhsa import measures

    if args.what == "qa":
        items = [it for task in args.tasks for it in qa_items(tok, task, args.qa_per_task, args.qa_context,
                                                            seed=args.seed)]
        measures.qa_records(model, tok, methods, layers, items, model_name=args.model,
                            max_new_tokens=args.max_new_tokens, sink=sink, skip=done)
    elif args.what == "boundaries":
        methods = {k: v for k, v in methods.items() if v is not None}  # block-sparse too: fixed chunks
        measures.boundary_records(model, tok, methods, layers, args.lengths[0], args.depths, trials=args.trials,
                                  model_name=args.model, sink=sink, skip=done)
    else:
        measures.needle_records(model, tok, methods, layers, args.lengths, args.depths, trials=args.trials,
                                max_new_tokens=args.max_new_tokens, model_name=args.model, progress=True,
                                sink=sink, max_seconds=args.max_seconds, first_trial=args.first_trial,
                                last_trial=args.last_trial, skip=done)


SUMMARY_METRICS = {"needle": ("needle_recall",), "boundaries": ("attention_recall", "chunks", "chunk_len"),
                   "qa": ("f1",)}


def _summary(what: str, recs: list[dict], methods) -> None:
    for name in methods:
        for metric in SUMMARY_METRICS[what]:
            v = [r["value"] for r in recs if r["method"] == name and r["metric"] == metric]
            if v:
                print(f"  {name:28s} {metric:16s} {statistics.mean(v):.4f} over {len(v)} examples")


def _table2(args, out, model, tok, pred) -> list[Path]:
    """Latency / peak memory of one prefill per method and backend beside the needle accuracy of the same
    configuration (read from ``--needle-file``): records, then NAME.json and NAME.md."""
    from kvlab import datasets
    from kvlab.dhsa.pattern import DHSAPattern, dhsa_layers
    from kvlab.experiments.dhsa.measures import _accuracy, table2_markdown, table2_rows

    prompt = datasets.niah_prompt(tok, datasets.load_text("paul-graham"), args.lengths[0], 0.5).prompt
    methods = {"dense [sdpa]": None, "dense [eager]": DHSAPattern(None, backend="torch")}
    base = {"dense [sdpa]": "dense", "dense [eager]": "dense"}
    for be in args.timing_backends:
        for name, pattern in _methods(args, pred, be, ("block-sparse",)).items():
            methods[f"{name} [{be}]"] = pattern
            base[f"{name} [{be}]"] = name
    needle = [r for f in args.needle_file or [] for r in records.read(f)]
    device = options.device_string(next(model.parameters()).device)
    meta = {"model": args.model, "device": device, "command": _command(args), "needle_file": args.needle_file}
    rows, json_name = [], args.name + ".json"
    with records.RecordWriter(options.records_name(args.name), out=out) as w:
        for r in table2_rows(model, tok, methods, dhsa_layers(model), prompt, repeats=args.repeats):
            acc, k, low, high = _accuracy(needle, base[r["method"]])
            rows.append(r | {"accuracy_of": base[r["method"]], "needle_recall": acc, "n": k, "ci_low": low,
                             "ci_high": high})
            config = {"model": args.model, "tokens": r["tokens"], "repeats": args.repeats}
            w.add(records.record(f"table2/L{r['tokens']}", r["method"], "prefill_latency_ms", r["ms"],
                                 config=config, device=device))
            w.add(records.record(f"table2/L{r['tokens']}", r["method"], "prefill_peak_memory_bytes",
                                 r["peak_bytes"], config=config, device=device))
            print(f"  {r['method']:32s} {r['ms']:9.1f} ms  needle {'-' if acc is None else f'{acc:.3f}'} (n {k})")
            meta["tokens"] = r["tokens"]
            options.write_json(out, json_name, meta | {"rows": rows})  # kept if stopped
    md = options.write_text(out, args.name + ".md", table2_markdown(meta, rows))
    return [w.path, out.root / json_name, md]
