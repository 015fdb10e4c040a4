"""DHSA App. D (Figs. 7-10): prefill latency and memory of block-sparse vs dense attention, and decode time and
memory of dense vs a decode-stage KV compression (StreamingLLM) as the context grows, with repeats paired by round,
on SmolLM2-135M-Instruct (float32; every layer is global, so DHSA's patterns apply to all).

    python benchmarks/dhsa_app_d_costs.py decode --out DIR [--contexts 512,4096 --cache 128 --rounds 20 --steps 8]
    python benchmarks/dhsa_app_d_costs.py decode --device cuda --out DIR [--contexts 1024,4096,8192 --cache 128,2048]
    python benchmarks/dhsa_app_d_costs.py decode --device cuda --shape gemma2-2b-global --out DIR  # random weights
    python benchmarks/dhsa_app_d_costs.py prefill --out DIR [--length 1024 --budget 256 --blocks 64,128 --rounds 20]

``decode``: every (context, method) cell gets one prefill of ``context`` WikiText tokens in one piece (its time is
recorded once, as ``prefill_ms`` in the config), then the cells decode in turns, ``--steps`` greedy tokens each, for
``--rounds`` rounds, the order rotating from round to round so that a load change of the shared machine falls on
every cell alike. One record per (round, cell) and metric: ``decode_latency_ms`` (mean ms per token of the round)
and ``decode_cache_memory_bytes`` (bytes of keys and values the cache holds after the round). Methods: ``dense``
(the full cache) and ``streamingllm{cache}`` (4 sinks, ``--cache`` entries per layer; App. D's decode-stage methods
hold 128; ``--cache`` may list several sizes); example ids ``round07``, method ``dense@4096``.

``decode --device cuda`` or ``--shape`` (App. D's own measurement, ``torch.cuda.max_memory_allocated``): every round, every cell in
the rotating order starts alone on the GPU (the previous cell's cache freed), prefills its context, then decodes
``--steps`` greedy tokens. Records per (round, cell): ``prefill_latency_ms``, ``prefill_peak_memory_bytes`` (the
allocator's peak during the prefill, the weights included; ``base_memory_bytes``, what was allocated when the cell
began, after a garbage collection), ``decode_latency_ms`` (mean ms per token) and
``decode_peak_memory_bytes`` (the peak during the decode steps, counted from a reset after the prefill). The times
are taken after ``torch.cuda.synchronize``; one warm-up round is run and not recorded.

``prefill``: one prefill of ``--length`` tokens per method and round (rotating order): ``dense`` (the model's SDPA)
and ``block-sparse{block}`` (:func:`kvlab.dhsa.pattern.block_sparse_pattern`: fixed blocks, mean pooling, TopK
``--budget`` keys per query, kvlab's CPU backend), ``prefill_latency_ms`` per record; the peak memory of one prefill
per method (``torch.profiler``, torch's CPU allocations above the inputs) is measured once, apart from the timing,
and written to ``prefill_memory.json`` (it does not vary between rounds).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _device_line(device: str = "cpu") -> str:
    import torch

    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    return f"cpu ({platform.machine()}), torch {torch.__version__}, threads {torch.get_num_threads()}"


def _model_and_text(tokens: int, device: str = "cpu"):
    import torch

    if device == "cpu":
        torch.set_num_threads(1)
    import kvlab
    from kvlab.datasets import load_text

    model, tok = kvlab.load_model("smollm2-135m", device=device, dtype="float32")
    ids = tok(load_text("wikitext")[: 8 * tokens], return_tensors="pt").input_ids[:, :tokens]
    if ids.shape[1] < tokens:
        raise ValueError(f"wikitext has fewer than {tokens} tokens in its first {8 * tokens} characters")
    return model, ids.to(device)


def rotated(items: list, round_: int) -> list:
    """``items`` started at position ``round_ mod len(items)``: the order of round ``round_``."""
    k = round_ % len(items)
    return items[k:] + items[:k]


def _decode_methods(cache_sizes: str | int) -> dict:
    from kvlab.policies import Full, StreamingLLM

    methods = {"dense": lambda: Full()}
    for size in (int(x) for x in str(cache_sizes).split(",")):
        methods[f"streamingllm{size}"] = lambda size=size: StreamingLLM(sink=4, cache_size=size)
    return methods


def run_decode_fresh(args) -> None:
    """Every cell alone on the device each round: prefill, then ``--steps`` greedy tokens; on CUDA with the
    allocator's peaks. ``--shape``: a random-weight model of that shape (:data:`kvlab.experiments.dhsa.MODEL_SHAPES`,
    App. D's Gemma2-2b and Gemma3-1b) on random token ids instead of SmolLM2 on WikiText."""
    import torch

    from kvlab.experiments.dhsa import decode_cost

    contexts = [int(x) for x in args.contexts.split(",")]
    cuda = args.device.startswith("cuda")
    if args.shape:
        from kvlab.experiments.dhsa import random_model

        model = random_model(args.shape, device=args.device)
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, model.config.vocab_size, (1, max(contexts)), generator=gen).to(args.device)
    else:
        model, ids = _model_and_text(max(contexts), args.device)
    methods = _decode_methods(args.cache)
    cells = [(ctx, name) for ctx in contexts for name in methods]

    def one(ctx: int, name: str) -> tuple[dict, str]:
        gc.collect()  # the previous cell's cache sits in reference cycles until collected: free it first
        policy = methods[name]()
        out = {"base_memory_bytes": float(torch.cuda.memory_allocated())} if cuda else {}  # the weights, if alone
        c = decode_cost(model, ids[:, :ctx], policy, steps=args.steps)
        out["prefill_latency_ms"] = c["prefill_ms"]
        out["decode_latency_ms"] = sum(c["step_ms"]) / len(c["step_ms"])
        out["decode_cache_memory_bytes"] = float(c["cache_bytes"][-1])
        if cuda:  # the allocator's peaks with everything allocated, as App. D reports them
            out["prefill_peak_memory_bytes"] = float(c["prefill_peak_bytes"])
            out["decode_peak_memory_bytes"] = float(c["decode_base_bytes"] + max(c["peak_bytes"]))
        return out, repr(policy)

    model_name = f"random {args.shape}" if args.shape else "smollm2-135m"
    with torch.no_grad():
        for ctx, name in cells:  # warm-up, not recorded
            one(ctx, name)
        path = Path(args.out) / "decode.examples.jsonl"
        with path.open("w") as f:
            for r in range(args.rounds):
                order = rotated(cells, r)
                for ctx, name in order:
                    res, policy = one(ctx, name)
                    config = {"model": model_name, "context": ctx, "policy": policy, "steps": args.steps,
                              "position_in_round": order.index((ctx, name)), "device": _device_line(args.device)}
                    for metric, value in res.items():
                        f.write(json.dumps({"example": f"round{r:02d}", "method": f"{name}@{ctx}", "output": None,
                                            "target": None, "config": config, "metric": metric,
                                            "value": value}) + "\n")
                f.flush()
                print(f"round {r + 1}/{args.rounds} done", flush=True)


def run_decode(args) -> None:
    import torch

    from kvlab.core import KVCache

    if args.device != "cpu" or getattr(args, "shape", None):
        return run_decode_fresh(args)
    contexts = [int(x) for x in args.contexts.split(",")]
    model, ids = _model_and_text(max(contexts))
    methods = _decode_methods(args.cache)
    cells, state = [], {}
    with torch.no_grad():
        for ctx in contexts:
            for name, make in methods.items():
                cell = f"{name}@{ctx}"
                cache = KVCache(model, make())
                t0 = time.perf_counter()
                logits = model(input_ids=ids[:, :ctx], past_key_values=cache, use_cache=True, logits_to_keep=1).logits
                prefill_ms = (time.perf_counter() - t0) * 1e3
                token = logits[:, -1].argmax(-1, keepdim=True)
                logits = model(input_ids=token, past_key_values=cache, use_cache=True).logits  # warm-up step
                state[cell] = [cache, logits[:, -1].argmax(-1, keepdim=True), prefill_ms]
                cells.append(cell)
                print(f"{cell}: prefill {prefill_ms:.0f} ms", flush=True)
        path = Path(args.out) / "decode.examples.jsonl"
        with path.open("w") as f:
            for r in range(args.rounds):
                for cell in rotated(cells, r):
                    cache, token, prefill_ms = state[cell]
                    t0 = time.perf_counter()
                    for _ in range(args.steps):
                        logits = model(input_ids=token, past_key_values=cache, use_cache=True).logits
                        token = logits[:, -1].argmax(-1, keepdim=True)
                    ms = (time.perf_counter() - t0) * 1e3 / args.steps
                    state[cell][1] = token
                    config = {"context": int(cell.split("@")[1]), "policy": repr(cache.policy), "steps": args.steps,
                              "prefill_ms": round(prefill_ms, 1), "position_in_round": rotated(cells, r).index(cell),
                              "device": _device_line()}
                    common = {"example": f"round{r:02d}", "method": cell, "output": None, "target": None,
                              "config": config}
                    f.write(json.dumps({**common, "metric": "decode_latency_ms", "value": ms}) + "\n")
                    f.write(json.dumps({**common, "metric": "decode_cache_memory_bytes",
                                        "value": float(cache.trace.nbytes[-1])}) + "\n")
                f.flush()
                print(f"round {r} done", flush=True)


def run_prefill(args) -> None:
    import torch

    from kvlab.experiments.dhsa import peak_bytes
    from kvlab.dhsa.pattern import block_sparse_pattern, dhsa_layers
    from kvlab.core import use_pattern

    model, ids = _model_and_text(args.length)
    layers = dhsa_layers(model)
    methods = {"dense": None, **{f"block-sparse{b}": block_sparse_pattern(args.budget, block=b)
                                 for b in (int(x) for x in args.blocks.split(","))}}

    def prefill(pattern):
        with torch.no_grad():
            if pattern is None:
                model(input_ids=ids, use_cache=False, logits_to_keep=1)
            else:
                with use_pattern(model, pattern, layers):
                    model(input_ids=ids, use_cache=False, logits_to_keep=1)

    names = list(methods)
    for name in names:  # warm-up
        prefill(methods[name])
    path = Path(args.out) / "prefill.examples.jsonl"
    with path.open("w") as f:
        for r in range(args.rounds):
            for name in rotated(names, r):
                t0 = time.perf_counter()
                prefill(methods[name])
                ms = (time.perf_counter() - t0) * 1e3
                f.write(json.dumps({"example": f"round{r:02d}", "method": name, "output": None, "target": None,
                                    "metric": "prefill_latency_ms", "value": ms,
                                    "config": {"length": args.length, "budget": args.budget,
                                               "pattern": repr(methods[name]), "device": _device_line(),
                                               "position_in_round": rotated(names, r).index(name)}}) + "\n")
            f.flush()
            print(f"round {r} done", flush=True)
    memory = {name: peak_bytes(lambda p=methods[name]: prefill(p), torch.device("cpu")) for name in names}
    (Path(args.out) / "prefill_memory.json").write_text(json.dumps(
        {"length": args.length, "budget": args.budget, "device": _device_line(),
         "peak_bytes_above_inputs": memory}, indent=1) + "\n")
    print(json.dumps(memory), flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    d = sub.add_parser("decode")
    d.add_argument("--out", required=True)
    d.add_argument("--contexts", default="512,4096")
    d.add_argument("--cache", default="128", help="entries per layer of StreamingLLM, one or several (128,2048)")
    d.add_argument("--device", default="cpu", help="cpu, or cuda for the allocator's peak memory (App. D)")
    d.add_argument("--shape", default=None, help="a random-weight model of this shape (gemma2-2b-global, gemma3-1b: "
                   "App. D's models; kvlab.experiments.dhsa.MODEL_SHAPES) instead of SmolLM2-135M-Instruct")
    d.add_argument("--rounds", type=int, default=20)
    d.add_argument("--steps", type=int, default=8)
    q = sub.add_parser("prefill")
    q.add_argument("--out", required=True)
    q.add_argument("--length", type=int, default=1024)
    q.add_argument("--budget", type=int, default=256)
    q.add_argument("--blocks", default="64,128")
    q.add_argument("--rounds", type=int, default=20)
    args = p.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (run_decode if args.what == "decode" else run_prefill)(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
