"""LaCache claims that a 2-core CPU can decide: more perplexity windows for Table 1 and Fig. 10, and Fig. 7's
decode throughput, on SmolLM2-135M-Instruct (float32, one thread).

    python benchmarks/lacache_cpu_claims.py ppl --out DIR [--start 16384 --tokens 6144]
    python benchmarks/lacache_cpu_claims.py throughput --out DIR [--repeats 30 --prefill 1024 --steps 16]

``ppl``: one WikiText stream of ``--tokens`` tokens that starts at token ``--start`` of the corpus (the text that
``benchmarks/quality_runs.py`` tokenises the same way: ``load_text("wikitext")[: 8 * end]``; the GPU sweep used
tokens 0-16,383, so the windows here are new examples), through each policy of ``--policies`` (the expressions and
method names of the GPU sweep in ``../results/fidelity/``, chunks of 16 tokens), one record per window of 1,024
tokens (its mean NLL). The records carry the GPU sweep's method names so that the ledger pairs them with its 16
windows by example id (``wikitext-s16384-w000`` ...). A policy already in the output is skipped (resumable).

``throughput`` (Fig. 7): every policy gets one prefill of ``--prefill`` tokens, then the policies decode in turns,
``--steps`` greedy tokens each, for ``--repeats`` rounds; the order of the policies rotates from round to round, so
that a load change of the shared machine falls on every policy alike. One record per (round, policy): decode
tokens per second over that round's steps, and the cache entries per layer after it.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

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


def _policy(expr: str):
    from kvlab.baselines import H2O
    from kvlab.lacache.policy import LaCache
    from kvlab.policies import Full, StreamingLLM

    names = {"Full": Full, "StreamingLLM": StreamingLLM, "LaCache": LaCache, "H2O": H2O}
    return eval(expr, {"__builtins__": {}}, names)  # expressions come from the tables above


def _device_line() -> str:
    import torch

    return f"cpu ({platform.processor() or platform.machine()}), torch {torch.__version__}, threads {torch.get_num_threads()}"


def _load():
    import torch

    torch.set_num_threads(1)
    import kvlab

    return kvlab.load_model("smollm2-135m", device="cpu", dtype="float32")


def run_ppl(args) -> None:
    from kvlab.datasets import load_text
    from kvlab.eval import chunked_perplexity

    model, tok = _load()
    path = Path(args.out) / "ppl.examples.jsonl"
    done = {json.loads(line)["method"] for line in path.read_text().splitlines()} if path.exists() else set()
    end = args.start + args.tokens
    ids = tok(load_text("wikitext")[: 8 * end], return_tensors="pt").input_ids[:, args.start:end]
    if ids.shape[1] < args.tokens:
        raise ValueError(f"wikitext has fewer than {end} tokens in its first {8 * end} characters")
    for slug in args.policies.split(","):
        if slug in done:
            continue
        policy = _policy(PPL_POLICIES[slug])
        begin = time.perf_counter()
        r = chunked_perplexity(model, tok, ids, policy, max_tokens=None, chunk_size=16)
        nll = r.nll.double()
        config = {"policy": repr(policy), "chunk": 16, "start": args.start, "tokens": args.tokens,
                  "device": _device_line(), "mean_kv": round(float(r.kv_trace_per_layer.float().mean()), 2),
                  "seconds": round(time.perf_counter() - begin, 1)}
        with path.open("a") as f:
            for w in range(len(nll) // args.window):
                f.write(json.dumps({"example": f"wikitext-s{args.start}-w{w:03d}", "method": slug, "output": None,
                                    "target": None, "metric": "window_nll", "config": config,
                                    "value": float(nll[w * args.window:(w + 1) * args.window].mean())}) + "\n")
        print(f"{slug}: {float(nll.mean()):.4f} ({config['seconds']} s)", flush=True)


def run_throughput(args) -> None:
    import torch

    from kvlab.core import KVCache

    model, tok = _load()
    from kvlab.datasets import load_text

    ids = tok(load_text("wikitext")[: 8 * args.prefill], return_tensors="pt").input_ids[:, : args.prefill]
    slugs = args.policies.split(",")
    state = {}
    with torch.no_grad():
        for slug in slugs:
            cache = KVCache(model, _policy(THROUGHPUT_POLICIES[slug]))
            logits = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
            state[slug] = (cache, logits[:, -1].argmax(-1, keepdim=True))
            for _ in range(args.warmup):  # fill to the budget and past the first compaction
                token = state[slug][1]
                logits = model(input_ids=token, past_key_values=cache, use_cache=True).logits
                state[slug] = (cache, logits[:, -1].argmax(-1, keepdim=True))
        path = Path(args.out) / "throughput.examples.jsonl"
        with path.open("w") as f:
            for rep in range(args.repeats):
                order = slugs[rep % len(slugs):] + slugs[: rep % len(slugs)]
                for slug in order:
                    cache, token = state[slug]
                    t0 = time.perf_counter()
                    for _ in range(args.steps):
                        logits = model(input_ids=token, past_key_values=cache, use_cache=True).logits
                        token = logits[:, -1].argmax(-1, keepdim=True)
                    seconds = time.perf_counter() - t0
                    state[slug] = (cache, token)
                    f.write(json.dumps({"example": f"round{rep:02d}", "method": slug, "output": None, "target": None,
                                        "metric": "decode_tokens_per_s", "value": args.steps / seconds,
                                        "config": {"policy": THROUGHPUT_POLICIES[slug], "prefill": args.prefill,
                                                   "steps": args.steps, "position_in_round": order.index(slug),
                                                   "cache_entries_per_layer": cache.trace.per_layer[-1],
                                                   "cache_bytes": cache.trace.nbytes[-1],
                                                   "device": _device_line()}}) + "\n")
                    f.flush()
                print(f"round {rep}: " + ", ".join(f"{s}" for s in order), flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    a = sub.add_parser("ppl")
    a.add_argument("--out", required=True)
    a.add_argument("--start", type=int, default=16384)
    a.add_argument("--tokens", type=int, default=6144)
    a.add_argument("--window", type=int, default=1024)
    a.add_argument("--policies", default=",".join(list(PPL_POLICIES)[:4]))
    b = sub.add_parser("throughput")
    b.add_argument("--out", required=True)
    b.add_argument("--prefill", type=int, default=1024)
    b.add_argument("--steps", type=int, default=16)
    b.add_argument("--warmup", type=int, default=8)
    b.add_argument("--repeats", type=int, default=30)
    b.add_argument("--policies", default=",".join(THROUGHPUT_POLICIES))
    args = p.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (run_ppl if args.what == "ppl" else run_throughput)(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
