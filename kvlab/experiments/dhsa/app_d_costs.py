"""DHSA App. D (Figs. 7-10): prefill latency and memory of block-sparse vs dense attention, and decode time and
memory of dense vs a decode-stage KV compression (StreamingLLM) as the context grows, with repeats paired by round,
on SmolLM2-135M-Instruct (float32; every layer is global, so DHSA's patterns apply to all).

    python -m kvlab run dhsa-app-d-costs decode --out DIR [--contexts 512,4096 --cache 128 --rounds 20 --steps 8]
    python -m kvlab run dhsa-app-d-costs decode --device cuda --out DIR [--contexts 1024,4096,8192 --cache 128,2048]
    python -m kvlab run dhsa-app-d-costs decode --device cuda --shape gemma2-2b-global --out DIR  # random weights
    python -m kvlab run dhsa-app-d-costs prefill --out DIR [--length 1024 --budget 256 --blocks 64,128 --rounds 20]

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
are taken after ``torch.cuda.synchronize``; one warm-up round is run and not recorded. ``--steps 8,64`` (several
counts, Fig. 10: "decoding time is largely proportional to the number of newly generated tokens") makes one cell
per (context, method, count), named ``dense@8192+64t``, each with ``decode_total_ms`` (the decode's whole time) too.

``prefill``: one prefill of ``--length`` tokens per method and round (rotating order): ``dense`` (the model's SDPA)
and ``block-sparse{block}`` (:func:`kvlab.dhsa.pattern.block_sparse_pattern`: fixed blocks, mean pooling, TopK
``--budget`` keys per query, kvlab's CPU backend), ``prefill_latency_ms`` per record; the peak memory of one prefill
per method (``torch.profiler``, torch's CPU allocations above the inputs) is measured once, apart from the timing,
and written to ``prefill_memory.json`` (it does not vary between rounds).

Records: ``decode.examples.jsonl.gz`` / ``prefill.examples.jsonl.gz`` (:mod:`kvlab.experiments.records`); a second
run into the same ``--out`` is refused. ``--smoke``: a tiny random-weight model, 2 rounds, 2 steps.
"""

from __future__ import annotations

import gc
import json
import platform
import time
from pathlib import Path

from kvlab.experiments import records, registry
from kvlab.experiments.system import options
from kvlab.outputs import OutputFolder

__all__ = ["parser", "check", "run", "rotated"]

NAME = "dhsa-app-d-costs"


def parser():
    p = registry.experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("what", nargs="?", choices=["decode", "prefill"], default="decode",
                   help="decode (default) or prefill")
    p.add_argument("--contexts", type=options.number_list(int, low=8, what="context"), default=[512, 4096],
                   help="decode: context lengths")
    p.add_argument("--cache", type=options.number_list(int, low=8, what="cache size"), default=[128],
                   help="decode: entries per layer of StreamingLLM, one or several (128,2048)")
    p.add_argument("--shape", default=None, help="decode: a random-weight model of this shape (gemma2-2b-global, "
                   "gemma3-1b: App. D's models; kvlab.experiments.dhsa.measures.MODEL_SHAPES) instead of SmolLM2")
    p.add_argument("--rounds", type=registry.positive_int, default=20)
    p.add_argument("--steps", type=options.number_list(int, low=1, what="step count"), default=[8],
                   help="decode: greedy tokens per round; several (8,64) make one cell per count (Fig. 10: decode "
                   "time against the number of new tokens; needs --device cuda or --shape)")
    p.add_argument("--length", type=registry.positive_int, default=1024, help="prefill: tokens")
    p.add_argument("--budget", type=registry.positive_int, default=256, help="prefill: keys per query")
    p.add_argument("--blocks", type=options.number_list(int, low=1, what="block"), default=[64, 128],
                   help="prefill: block sizes of block-sparse")
    return p


def check(args) -> None:
    from kvlab.experiments.dhsa.measures import MODEL_SHAPES

    options.check_device(args.device)
    if args.shape is not None:
        if args.what != "decode":
            raise registry.ParameterError("--shape goes with decode (prefill times SmolLM2-135M)")
        registry.names_list(MODEL_SHAPES, what="shape")(args.shape)
    if len(args.steps) != len(set(args.steps)):
        raise registry.ParameterError(f"--steps lists a count twice ({args.steps}); give each count once")
    fresh = options.resolve_device(args.device) != "cpu" or args.shape is not None or args.smoke
    if len(args.steps) > 1 and not fresh:
        raise registry.ParameterError(
            f"--steps {','.join(map(str, args.steps))}: several step counts need one cell per count, alone on the "
            "device each round (--device cuda or --shape); the CPU measurement decodes prefilled cells in turns "
            "and takes one count")
    options.refuse_rerun(args.out, f"{args.what}{records.SUFFIX}", *(["prefill_memory.json"] if args.what == "prefill"
                                                                    else []))
    if args.smoke:
        args.rounds = min(args.rounds, 2)
        args.steps = [min(s, 2 * (i + 1)) for i, s in enumerate(args.steps)]
        args.length = min(args.length, 256)


def run(args) -> list[Path]:
    out = OutputFolder(args.out, f"python -m kvlab run {NAME} {args.what}")
    device = options.resolve_device(args.device)
    if args.what == "prefill":
        return run_prefill(args, out)
    if device != "cpu" or args.shape or args.smoke:
        return [run_decode_fresh(args, out, device)]
    return [run_decode(args, out)]


def _device_line(device: str = "cpu") -> str:
    import torch

    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    return f"cpu ({platform.machine()}), torch {torch.__version__}, threads {torch.get_num_threads()}"


def _model_and_text(tokens: int, device: str = "cpu", smoke: bool = False):
    import torch

    if device == "cpu":
        torch.set_num_threads(1)
    if smoke:  # a tiny random-weight model on random ids: the same code in a fraction of a second
        from kvlab.experiments.dhsa.measures import random_model

        model = random_model("tiny-global", device=device)
        gen = torch.Generator().manual_seed(0)
        return model, torch.randint(0, model.config.vocab_size, (1, tokens), generator=gen).to(device)
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


def _decode_methods(cache_sizes) -> dict:
    from kvlab.policies import Full, StreamingLLM

    methods = {"dense": lambda: Full()}
    for size in cache_sizes:
        methods[f"streamingllm{size}"] = lambda size=size: StreamingLLM(sink=4, cache_size=size)
    return methods


def run_decode_fresh(args, out, device: str) -> Path:
    """Every cell alone on the device each round: prefill, then ``--steps`` greedy tokens; on CUDA with the
    allocator's peaks. ``--shape``: a random-weight model of that shape (:data:`~kvlab.experiments.dhsa.measures.
    MODEL_SHAPES`, App. D's Gemma2-2b and Gemma3-1b) on random token ids instead of SmolLM2 on WikiText."""
    import torch

    if args.shape and not args.smoke:
        from kvlab.experiments.dhsa.measures import random_model

        model = random_model(args.shape, device=device)
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, model.config.vocab_size, (1, max(args.contexts)), generator=gen).to(device)
    else:
        model, ids = _model_and_text(max(args.contexts), device, smoke=args.smoke)
    methods = _decode_methods(args.cache)
    cells = [(ctx, name, steps) for ctx in args.contexts for name in methods for steps in args.steps]
    model_name = f"random {args.shape}" if args.shape else "smollm2-135m"
    dev = options.device_string(device)
    # --smoke: at most 256 tokens of each context are run; the records keep the context asked for (their config says)
    tokens = {ctx: min(ctx, 256) if args.smoke else ctx for ctx in args.contexts}
    with torch.no_grad():
        for ctx, name, steps in cells:  # warm-up, not recorded
            _fresh_cell(model, ids, methods[name](), tokens[ctx], steps, device)
        with records.RecordWriter(f"decode{records.SUFFIX}", out=out) as w:
            for r in range(args.rounds):
                order = rotated(cells, r)
                for ctx, name, steps in order:
                    res, policy = _fresh_cell(model, ids, methods[name](), tokens[ctx], steps, device)
                    config = {"model": model_name, "context": ctx, "tokens": tokens[ctx], "policy": policy,
                              "steps": steps,
                              "position_in_round": order.index((ctx, name, steps)), "machine": _device_line(device)}
                    if len(args.steps) > 1:  # one cell per step count: the total decode time is the quantity
                        res["decode_total_ms"] = res["decode_latency_ms"] * steps
                    method = f"{name}@{ctx}" + (f"+{steps}t" if len(args.steps) > 1 else "")
                    for metric, value in res.items():
                        w.add(records.record(f"round{r:02d}", method, metric, value, config=config, device=dev))
                print(f"round {r + 1}/{args.rounds} done", flush=True)
    return w.path


def _fresh_cell(model, ids, policy, ctx: int, steps: int, device: str) -> tuple[dict, str]:
    """One cell alone: garbage collected first (the previous cell's cache sits in reference cycles), then
    :func:`~kvlab.experiments.dhsa.measures.decode_cost`; the metrics of one record each."""
    import torch

    from kvlab.experiments.dhsa.measures import decode_cost

    gc.collect()
    cuda = device.startswith("cuda")
    out = {"base_memory_bytes": float(torch.cuda.memory_allocated())} if cuda else {}  # the weights, if alone
    c = decode_cost(model, ids[:, :ctx], policy, steps=steps)
    out["prefill_latency_ms"] = c["prefill_ms"]
    out["decode_latency_ms"] = sum(c["step_ms"]) / len(c["step_ms"])
    out["decode_cache_memory_bytes"] = float(c["cache_bytes"][-1])
    if cuda:  # the allocator's peaks with everything allocated, as App. D reports them
        out["prefill_peak_memory_bytes"] = float(c["prefill_peak_bytes"])
        out["decode_peak_memory_bytes"] = float(c["decode_base_bytes"] + max(c["peak_bytes"]))
    return out, repr(policy)


def _prefilled_cells(model, ids, contexts, methods) -> tuple[list, dict]:
    """One cache per (context, method), prefilled in one piece and one warm-up step decoded."""
    from kvlab.core import KVCache

    cells, state = [], {}
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
    return cells, state


def run_decode(args, out) -> Path:
    """CPU: every cell prefilled once, then the cells decode in turns, ``--steps`` tokens a round."""
    import torch

    (steps,) = args.steps  # one count (check refuses several here)
    model, ids = _model_and_text(max(args.contexts))
    with torch.no_grad():
        cells, state = _prefilled_cells(model, ids, args.contexts, _decode_methods(args.cache))
        with records.RecordWriter(f"decode{records.SUFFIX}", out=out) as w:
            for r in range(args.rounds):
                order = rotated(cells, r)
                for cell in order:
                    cache, token, prefill_ms = state[cell]
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        logits = model(input_ids=token, past_key_values=cache, use_cache=True).logits
                        token = logits[:, -1].argmax(-1, keepdim=True)
                    ms = (time.perf_counter() - t0) * 1e3 / steps
                    state[cell][1] = token
                    config = {"context": int(cell.split("@")[1]), "policy": repr(cache.policy), "steps": steps,
                              "prefill_ms": round(prefill_ms, 1), "position_in_round": order.index(cell),
                              "machine": _device_line()}
                    w.add(records.record(f"round{r:02d}", cell, "decode_latency_ms", ms, config=config,
                                         device="cpu"))
                    w.add(records.record(f"round{r:02d}", cell, "decode_cache_memory_bytes",
                                         float(cache.trace.nbytes[-1]), config=config, device="cpu"))
                print(f"round {r} done", flush=True)
    return w.path


def run_prefill(args, out) -> list[Path]:
    import torch

    from kvlab.core import use_pattern
    from kvlab.dhsa.pattern import block_sparse_pattern, dhsa_layers
    from kvlab.experiments.dhsa.measures import peak_bytes

    model, ids = _model_and_text(args.length, smoke=args.smoke)
    layers = dhsa_layers(model)
    methods = {"dense": None, **{f"block-sparse{b}": block_sparse_pattern(args.budget, block=b) for b in args.blocks}}

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
    with records.RecordWriter(f"prefill{records.SUFFIX}", out=out) as w:
        for r in range(args.rounds):
            for name in rotated(names, r):
                t0 = time.perf_counter()
                prefill(methods[name])
                ms = (time.perf_counter() - t0) * 1e3
                config = {"length": args.length, "budget": args.budget, "pattern": repr(methods[name]),
                          "machine": _device_line(), "position_in_round": rotated(names, r).index(name)}
                w.add(records.record(f"round{r:02d}", name, "prefill_latency_ms", ms, config=config, device="cpu"))
            print(f"round {r} done", flush=True)
    memory = {name: peak_bytes(lambda p=methods[name]: prefill(p), torch.device("cpu")) for name in names}
    mem = options.write_json(out, "prefill_memory.json", {"length": args.length, "budget": args.budget,
                                                          "device": _device_line(),
                                                          "peak_bytes_above_inputs": memory})
    print(json.dumps(memory), flush=True)
    return [w.path, mem]
