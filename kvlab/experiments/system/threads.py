"""CPU decode speed of one kvlab process alone and of two side by side (issue 27, "under load").

Each process streams the same text through ``streaming_perplexity`` on the static engine (SmolLM2-135M, a
StreamingLLM cache) and reports tokens per second over ``--repeats`` runs of ``--tokens`` tokens, started at the
same moment as its neighbour. Threads per process: ``--threads N`` (torch.set_num_threads(N)), ``--threads 0``
(torch's own default: every core), or ``--threads kvlab`` (kvlab's choice, :func:`kvlab.threads.default_threads`;
``KVLAB_THREADS`` is honoured). The goal: with kvlab's choice, each of two processes keeps at least 40 % of the
speed one process has alone.

    python -m kvlab run package-threads --out benchmarks/results/threads        # ~9 min on 2 cores
    taskset -c 0,1 python -m kvlab run package-threads --random-weights --out DIR   # 2 cores of a bigger box

writes ``threads_<machine>.json`` (every configuration, per process), ``threads.examples.jsonl.gz`` (tokens per
second of each process alone and side by side) and prints a table. ``--smoke``: random weights, a few tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from kvlab.experiments import records, registry
from kvlab.experiments.system import options
from kvlab.outputs import OutputFolder

__all__ = ["parser", "check", "run"]

NAME = "package-threads"


def worker(args) -> None:
    import torch

    import kvlab
    from kvlab.eval import streaming_perplexity
    from kvlab.policies import StreamingLLM
    from kvlab.threads import default_threads

    if args.threads == "kvlab":
        torch.set_num_threads(default_threads())
    elif int(args.threads) > 0:
        torch.set_num_threads(int(args.threads))
    if args.random_weights:  # SmolLM2-135M's shape, random weights: no download (speed does not depend on them)
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                          tie_word_embeddings=True)
        model, tok = kvlab.core.attach(LlamaForCausalLM(cfg).eval()), None
        text = torch.randint(0, 49152, (1, 4 * args.tokens))
    else:
        model, tok = kvlab.load_model("smollm2-135m", device="cpu")
        text = kvlab.datasets.load_text("wikitext")[:20000]
    policy = StreamingLLM(4, 60)
    streaming_perplexity(model, tok, text, policy, 8, progress=False, engine="static")  # warm-up
    while time.time() < args.start:  # both processes begin the measured part together
        time.sleep(0.01)
    begin = time.perf_counter()
    for _ in range(args.repeats):
        streaming_perplexity(model, tok, text, policy, args.tokens, progress=False, engine="static")
    seconds = time.perf_counter() - begin
    print(json.dumps({"threads": torch.get_num_threads(), "tokens": args.repeats * (args.tokens - 1),
                      "seconds": seconds, "tokens_per_s": args.repeats * (args.tokens - 1) / seconds}))


def measure(procs: int, threads: str, args) -> list[dict]:
    start = time.time() + args.load_seconds
    cmd = [sys.executable, "-m", "kvlab.experiments.system.threads", "--worker", "--threads", threads,
           "--tokens", str(args.tokens), "--repeats", str(args.repeats), "--start", str(start)]
    cmd += ["--random-weights"] if args.random_weights else []
    children = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(procs)]
    out = []
    for child in children:
        stdout, _ = child.communicate()
        if child.returncode:
            raise RuntimeError(f"worker failed ({child.returncode})")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def _threads_setting(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t != "kvlab" and not t.isdigit()]
    if not items or bad:
        raise argparse.ArgumentTypeError(f"{text!r}: thread settings are integers (0: torch's default) or 'kvlab'")
    return items


def parser():
    p = registry.experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=registry.positive_int, default=48, help="tokens per streamed run")
    p.add_argument("--repeats", type=registry.positive_int, default=3, help="runs per measurement")
    p.add_argument("--configs", type=_threads_setting, default=["0", "1", "kvlab"],
                   help="thread settings to compare (0: torch default)")
    p.add_argument("--load-seconds", type=float, default=25.0, help="time given to load the model before the start")
    p.add_argument("--random-weights", action="store_true",
                   help="SmolLM2-135M's shape with random weights (no model file needed; same speed)")
    return p


def check(args) -> None:
    options.check_device(args.device)
    if args.load_seconds < 0:
        raise registry.ParameterError("--load-seconds must be >= 0")
    if args.tokens < 9:
        raise registry.ParameterError(f"--tokens {args.tokens}: at least 9 (the warm-up streams 8)")
    options.refuse_rerun(args.out, options.records_name("threads"))
    if args.smoke:
        args.tokens, args.repeats, args.configs, args.load_seconds, args.random_weights = 12, 1, ["1"], 0.0, True


def run(args) -> list[Path]:
    out = OutputFolder(args.out, f"python -m kvlab run {NAME}")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load_before = os.getloadavg()[0]
    machine = f"{platform.node() or 'cpu'}-{cores}cores"
    rows, recs = [], []
    for threads in args.configs:
        alone = measure(1, threads, args)[0]
        pair = measure(2, threads, args)
        share = [r["tokens_per_s"] / alone["tokens_per_s"] for r in pair]
        rows.append({"threads_setting": threads, "threads": alone["threads"], "alone": alone, "side_by_side": pair,
                     "share_of_alone": share, "meets_40_percent": min(share) >= 0.4})
        config = {"threads_setting": threads, "threads": alone["threads"], "tokens": args.tokens, "cores": cores}
        recs.append(records.record(f"threads={threads}", "alone", "tokens_per_s", alone["tokens_per_s"],
                                   config=config, device="cpu"))
        recs += [records.record(f"threads={threads}", f"side by side {i}", "tokens_per_s", r["tokens_per_s"],
                                config=config, device="cpu") for i, r in enumerate(pair)]
        print(f"threads={threads:5s} ({alone['threads']}): alone {alone['tokens_per_s']:.2f} tok/s; side by side "
              + ", ".join(f"{r['tokens_per_s']:.2f}" for r in pair) + " tok/s ("
              + ", ".join(f"{s:.0%}" for s in share) + " of alone)", flush=True)
    record = {"machine": machine, "load_average_1min_at_start": load_before,
              "load_average_1min_at_end": os.getloadavg()[0],
              "note": "measured on a machine other processes were using too; see load_average",
              "processor": platform.processor() or platform.machine(), "cores": cores,
              "kvlab_threads_env": os.environ.get("KVLAB_THREADS"), "tokens": args.tokens, "repeats": args.repeats,
              "model": "smollm2-135m" + (" (shape, random weights)" if args.random_weights else ""),
              "policy": "StreamingLLM(4, 60)", "engine": "static", "command": f"python -m kvlab run {NAME}",
              "rows": rows}
    path = records.write(options.records_name("threads"), recs, out=out)
    return [path, options.write_json(out, f"threads_{machine}.json", record)]


def _worker_main(argv=None) -> int:
    """The measured process (started by :func:`measure`): ``python -m kvlab.experiments.system.threads --worker``."""
    p = argparse.ArgumentParser(prog="kvlab.experiments.system.threads", allow_abbrev=False)
    p.add_argument("--worker", action="store_true", required=True)
    p.add_argument("--threads", default="kvlab")
    p.add_argument("--tokens", type=int, required=True)
    p.add_argument("--repeats", type=int, required=True)
    p.add_argument("--start", type=float, required=True)
    p.add_argument("--random-weights", action="store_true")
    worker(p.parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(_worker_main())
