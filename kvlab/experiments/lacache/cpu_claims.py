"""LaCache claims that a 2-core CPU can decide: more perplexity windows for Table 1 and Fig. 10, and Fig. 7's
decode throughput, on SmolLM2-135M-Instruct (float32, one thread).

    python -m kvlab run lacache-cpu-claims ppl --out DIR [--start 16384 --tokens 6144]
    python -m kvlab run lacache-cpu-claims throughput --out DIR [--repeats 30 --prefill 1024 --steps 16]

``ppl``: one WikiText stream of ``--tokens`` tokens that starts at token ``--start`` of the corpus (the text that
:mod:`kvlab.experiments.quality.runs` tokenises the same way: ``load_text("wikitext")[: 8 * end]``; the GPU sweep used
tokens 0-16,383, so the windows here are new examples), through each policy of ``--policies`` (the expressions and
method names of the GPU sweep in ``benchmarks/results/fidelity/``, chunks of 16 tokens), one record per window of 1,024
tokens (its mean NLL). The records carry the GPU sweep's method names so that the ledger pairs them with its 16
windows by example id (``wikitext-s16384-w000`` ...). A policy already in the output is skipped (resumable).
Records: ``ppl.examples.jsonl.gz`` / ``throughput.examples.jsonl.gz``; a throughput run refuses an ``--out`` that
holds one (its rounds are one measurement).

``throughput`` (Fig. 7): every policy gets one prefill of ``--prefill`` tokens, then the policies decode in turns,
``--steps`` greedy tokens each, for ``--repeats`` rounds; the order of the policies rotates from round to round, so
that a load change of the shared machine falls on every policy alike. One record per (round, policy): decode
tokens per second over that round's steps, and the cache entries per layer after it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kvlab.experiments import records, registry
from kvlab.experiments.lacache.common import device_line, load_cpu_model, policy, window_records

NAME = "lacache-cpu-claims"

#: GPU sweep name -> policy expression (benchmarks/quality_runs.py, fidelity_jobs and the Table 1 jobs).
PPL_POLICIES = {
    "lacache-sweep256-s8o0-16k": "LaCache(256, span=8, overlap=0)",
    "lacache-sweep256-s4o2-16k": "LaCache(256, span=4, overlap=2)",
    "lacache-sweep512-official-s16o0-16k": "LaCache.official(512, 16, 0)",
    "lacache-t1-strm512-16k": "StreamingLLM(sink=4, cache_size=512)",
    "lacache-sweep256-s16o0-16k": "LaCache(256, span=16, overlap=0)",
}
#: Fig. 7's methods at a cache budget of 256 entries per layer (Full keeps everything).
THROUGHPUT_POLICIES = {
    "lacache256": "LaCache.official(256, 16, 0)",
    "streamingllm256": "StreamingLLM(sink=4, cache_size=256)",
    "h2o256": "H2O(256, recent=128)",
    "full": "Full()",
}


# a smoke keeps --policies, or every default policy (a ledger row compares two of them), at a tiny size: ppl three
# windows of 32 tokens, throughput two rounds of two steps
SMOKE = {"ppl": dict(tokens=96, window=32),
         "throughput": dict(prefill=32, steps=2, warmup=1, repeats=2)}


def run_ppl(args, out) -> Path:
    from kvlab.datasets import load_text
    from kvlab.eval import chunked_perplexity

    model, tok = load_cpu_model()
    end = args.start + args.tokens
    ids = tok(load_text("wikitext")[: 8 * end], return_tensors="pt").input_ids[:, args.start:end]
    if ids.shape[1] < args.tokens:
        raise ValueError(f"wikitext has fewer than {end} tokens in its first {8 * end} characters")
    with records.RecordWriter("ppl" + records.SUFFIX, keep=True, out=out) as writer:
        done = {method for _, method, _ in writer.done()}
        for slug in (s for s in args.policies if s not in done):
            pol = policy(PPL_POLICIES[slug])
            begin = time.perf_counter()
            r = chunked_perplexity(model, tok, ids, pol, max_tokens=None, chunk_size=16)
            config = {"policy": repr(pol), "chunk": 16, "start": args.start, "tokens": args.tokens,
                      "mean_kv": round(float(r.kv_trace_per_layer.float().mean()), 2),
                      "seconds": round(time.perf_counter() - begin, 1)}
            for rec in window_records(r.nll, args.window, lambda w: f"wikitext-s{args.start}-w{w:03d}", slug, config,
                                      device_line(), output=None, target=None):
                writer.add(rec)
            print(f"{slug}: {float(r.nll.double().mean()):.4f} ({config['seconds']} s)", flush=True)
    return writer.path


def _prefilled(model, ids, slugs: list[str], warmup: int) -> dict:
    """Per policy: its cache after one prefill of ``ids`` and ``warmup`` greedy steps, and the next token."""
    from kvlab.core import KVCache

    state = {}
    for slug in slugs:
        cache = KVCache(model, policy(THROUGHPUT_POLICIES[slug]))
        token = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1].argmax(
            -1, keepdim=True)
        for _ in range(warmup):  # fill to the budget and past the first compaction
            token = model(input_ids=token, past_key_values=cache, use_cache=True).logits[:, -1].argmax(-1, keepdim=True)
        state[slug] = (cache, token)
    return state


def run_throughput(args, out) -> Path:
    import torch

    from kvlab.datasets import load_text

    model, tok = load_cpu_model()
    ids = tok(load_text("wikitext")[: 8 * args.prefill], return_tensors="pt").input_ids[:, : args.prefill]
    slugs = list(args.policies)
    with torch.no_grad(), records.RecordWriter("throughput" + records.SUFFIX, out=out) as writer:
        state = _prefilled(model, ids, slugs, args.warmup)
        for rep in range(args.repeats):
            order = slugs[rep % len(slugs):] + slugs[: rep % len(slugs)]
            for slug in order:
                cache, token = state[slug]
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    token = model(input_ids=token, past_key_values=cache, use_cache=True).logits[:, -1].argmax(
                        -1, keepdim=True)
                seconds = time.perf_counter() - t0
                state[slug] = (cache, token)
                config = {"policy": THROUGHPUT_POLICIES[slug], "prefill": args.prefill, "steps": args.steps,
                          "position_in_round": order.index(slug), "cache_entries_per_layer": cache.trace.per_layer[-1],
                          "cache_bytes": cache.trace.nbytes[-1]}
                writer.add(records.record(f"round{rep:02d}", slug, "decode_tokens_per_s", args.steps / seconds,
                                          config=config, device=device_line(), output=None, target=None))
            print(f"round {rep}: " + ", ".join(order), flush=True)
    return writer.path


def check(args) -> None:
    if args.smoke:
        for key, value in SMOKE[args.what].items():
            setattr(args, key, value)
    table = PPL_POLICIES if args.what == "ppl" else THROUGHPUT_POLICIES
    if args.policies is None:
        args.policies = list(table)[:4] if args.what == "ppl" else list(table)
    wrong = [p for p in args.policies if p not in table]
    if wrong:
        raise registry.ParameterError(f"--policies {','.join(wrong)}: not a policy of {args.what}; its policies are "
                                      f"{list(table)}")
    if args.what == "ppl" and args.tokens < args.window:
        raise registry.ParameterError(f"--tokens {args.tokens} is below one --window of {args.window}: no record")
    if args.what == "throughput" and (Path(args.out) / ("throughput" + records.SUFFIX)).exists():
        raise registry.ParameterError(f"{args.out} already holds a throughput run (its rounds are one measurement); "
                                      "give a new --out")


def parser() -> argparse.ArgumentParser:
    p = registry.experiment_parser(NAME, __doc__.split("\n\n")[0])
    pos = registry.positive_int
    p.add_argument("what", choices=["ppl", "throughput"])
    p.add_argument("--policies", type=registry.names_list([*PPL_POLICIES, *THROUGHPUT_POLICIES], what="policy"),
                   default=None, help="ppl: of the GPU sweep's names (default the first four); throughput: all four")
    p.add_argument("--start", type=int, default=16384, help="ppl: the stream's first token in the corpus")
    p.add_argument("--tokens", type=pos, default=6144, help="ppl: the stream's tokens")
    p.add_argument("--window", type=pos, default=1024, help="ppl: tokens per record")
    p.add_argument("--prefill", type=pos, default=1024, help="throughput: prompt tokens")
    p.add_argument("--steps", type=pos, default=16, help="throughput: greedy tokens per policy and round")
    p.add_argument("--warmup", type=int, default=8, help="throughput: steps before the first round")
    p.add_argument("--repeats", type=pos, default=30, help="throughput: rounds")
    return p


def run(args) -> list[Path]:
    from kvlab.outputs import OutputFolder

    if args.policies is None:
        check(args)
    out = OutputFolder(args.out, f"python -m kvlab run {NAME} {args.what}")
    return [(run_ppl if args.what == "ppl" else run_throughput)(args, out)]
