"""Full-size REFORM runs (SmolLM2-135M, an 8k window): head choice, RULER-style comparison, efficiency.

``python -m kvlab bench reform WHAT [options]``::

    tasks       build every input once, here (needs the corpora): a gzipped JSON the GPU machine reads
    heads       MNR of every head on the head-choice sets, the chosen heads (Fig. 2, Tables 2/7)
    compare     every method at equal budget on the RULER-style key-value sets and multi-hop QA (Tables 1, 5,
                6a ablations: pool 5, random heads, worst heads)
    efficiency  seconds and peak GPU memory to answer 10 tokens after a long input (Table 6b), with the
                REFORM time split into chunked forwarding, gather and recompute
    scoring     the compression step alone at SmolLM2-135M's shapes (9 heads, 3 KV heads, dim 64; cache budget
                2048 + a chunk of 2048..8192, the last 128 queries): heavy-hitter scoring and the kept-entry gather,
                eager PyTorch vs the Triton kernels (:mod:`kvlab.reform.triton`), fp32 and bf16, with the
                largest difference between the two
    profile     REFORM on random token ids through a SmolLM2-135M-shaped model with random weights (no model
                file needed), each ``--backends``: seconds, peak memory, and with ``--profile`` the split of
                chunked forwarding into layers, embeddings, scoring and compression

The GPU machine has no corpora and no network: ``tasks`` writes the inputs (text) and a stretch of WikiText for
the efficiency inputs into one file that travels with the command; the model is a ``.gguf`` path there.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

from kvlab.experiments.bench.eval import SMOLLM2_SHAPE, random_smollm2
from kvlab.kernels.benchmarking import synchronize

__all__ = ["COMMANDS", "main"]


def _load(args):
    from kvlab.models import load_model

    model, tok = load_model(args.model, device=args.device, dtype=args.dtype)
    if args.round_bf16:  # the local copy of a kvlab model id is stored in bf16: same weights as a CPU run
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).to(p.dtype))
    return model, tok


def _read_tasks(path):
    from kvlab.eval.tasks import LongTask

    data = json.loads(gzip.open(path, "rt").read())
    out = {}
    for k, v in data.items():
        if k == "filler":
            out[k] = v
        elif isinstance(v, dict):
            out[k] = {n: [LongTask.from_dict(t) for t in ts] for n, ts in v.items()}
        else:
            out[k] = [LongTask.from_dict(t) for t in v]
    return out


def _write(path, data) -> None:
    Path(path).write_text(json.dumps(data, indent=1))
    print(f"-> {path}")


# --------------------------------------------------------------------------- tasks (here, CPU)


def run_tasks(args) -> int:
    from kvlab.models import load_tokenizer
    from kvlab.eval.tasks import filler_text, kv_task, multihop_task

    tok = load_tokenizer(args.model)
    data: dict[str, Any] = {
        "heads_kv": [kv_task(tok, args.head_tokens, seed=1000 + i).to_dict() for i in range(args.head_samples)],
        "heads_qa": [multihop_task(tok, args.head_tokens, seed=1000 + i).to_dict() for i in range(args.head_samples)],
        "ruler": {str(n): [kv_task(tok, n, seed=i).to_dict() for i in range(args.samples)] for n in args.lengths},
        "qa": {str(n): [multihop_task(tok, n, seed=i).to_dict() for i in range(args.samples)]
               for n in args.qa_lengths},
        "filler": filler_text("wikitext"),
    }
    with gzip.open(args.out, "wt") as f:
        json.dump(data, f)
    print(f"-> {args.out}")
    return 0


# --------------------------------------------------------------------------- heads


def run_heads(args) -> int:
    from kvlab.reform.heads import choose_heads_for_model

    model, tok = _load(args)
    tasks = _read_tasks(args.tasks)
    kv, qa = tasks["heads_kv"][:args.samples], tasks["heads_qa"][:args.samples]
    data = choose_heads_for_model(model, tok, tasks=(kv, qa), tokens=args.head_tokens, chunk_size=args.chunk_size,
                                  budget=args.budget, progress=True)
    data = {"model": "smollm2-135m", **data, "command": "python -m kvlab bench reform " + " ".join(args.argv)}
    _write(args.out, data)
    for task, table in data["table"].items():
        print(f"Best-3 MNR, {task}: " + "; ".join(f"{k} {v}" for k, v in table.items()))
    print("heads", data["heads"])
    return 0


# --------------------------------------------------------------------------- compare


def _variants(heads_data, seed: int = 0) -> dict[str, dict[str, Any]]:
    """REFORM ablations (Table 6a): kernel 5, four random heads below 70% depth, the four worst heads."""
    from kvlab.reform.heads import worst_heads
    from kvlab.reform.reference import Head

    sig = heads_data["signature"]
    rng = random.Random(seed)
    top = int(0.7 * sig["num_layers"])
    pool = [Head(k, layer, h) for k in "qkv" for layer in range(top)
            for h in range(sig["num_heads"] if k == "q" else sig["num_kv_heads"])]
    return {"reform_pool5": {"pool": 5},
            "reform_random_heads": {"heads": sorted(rng.sample(pool, 4))},
            "reform_worst_heads": {"heads": worst_heads(heads_data)}}


def _single_needle(tok, filler: str, n: int, samples: int) -> list:
    """Key-value retrieval with one pair (RULER's single needle), built from the carried filler: about ``n``
    tokens (WikiText sentences run about 27 SmolLM2 tokens), example ``i`` reading the filler from character
    ``50000 * i``."""
    from kvlab.eval.tasks import kv_task

    return [kv_task(tok, None, n_filler=int(n / 27), text=filler[i * 50000:], seed=100 + i, n_pairs=1)
            for i in range(samples)]


def run_compare(args) -> int:
    from kvlab.reform.api import load_heads
    from kvlab.experiments.reform.compare import METHODS, as_dicts, run_method, summarise

    model, tok = _load(args)
    tasks = _read_tasks(args.tasks)
    heads_data = json.loads(Path(args.heads).read_text())
    heads = load_heads(args.heads, model)
    variants = _variants(heads_data)
    settings = dict(budget=args.budget, chunk_size=args.chunk_size, n_initial=args.n_initial, n_recent=args.n_recent,
                    n_final=args.n_final, max_new_tokens=args.max_new_tokens)
    sets = [("single", n, _single_needle(tok, tasks["filler"], n, args.single_samples)) for n in args.single_lengths]
    sets += [("ruler", n, ts[:args.samples]) for n, ts in tasks["ruler"].items()]
    sets += [("qa", n, ts[:args.samples]) for n, ts in tasks["qa"].items()]
    report: dict[str, Any] = {"settings": settings, "heads": [str(h) for h in heads], "device": _device(model),
                              "command": "python -m kvlab bench reform " + " ".join(args.argv), "sets": {}}
    begin = time.perf_counter()
    for name, n, ts in sets:
        if not ts:
            continue
        methods = list(args.methods) + (list(variants) if name == "ruler" and args.ablations else [])
        results = []
        for task in ts:
            for m in methods:
                extra = dict(variants.get(m, {}))
                extra.setdefault("heads", heads)
                r = run_method("reform" if m in variants else m, model, tok, task, **settings, **extra)
                r.method = m
                results.append(r)
        table = summarise(results)
        report["sets"][f"{name}-{n}"] = {"summary": table, "results": as_dicts(results)}
        print(f"{name} {n} tokens ({len(ts)} examples, {time.perf_counter() - begin:.0f} s):")
        for m, row in table.items():
            print(f"  {m:22s} acc {row['accuracy']:6.1f}  nll {row['answer_nll']:.3f}  {row['seconds']:.2f} s")
        _write(args.out, report)
    assert set(args.methods) <= set(METHODS)
    return 0


# --------------------------------------------------------------------------- efficiency


def _device(model) -> str:
    return torch.cuda.get_device_name() if next(model.parameters()).is_cuda else "cpu"


def _peak_reset(model) -> None:
    if next(model.parameters()).is_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _peak(model) -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if next(model.parameters()).is_cuda else float("nan")


@torch.no_grad()
def _efficiency_one(method, model, tok, task, args, heads) -> dict[str, Any]:
    from kvlab.core import KVCache
    from kvlab.experiments.reform import compare as C
    from kvlab.eval.retrieval import greedy_answer
    from kvlab.reform.api import reform_gather

    device = next(model.parameters()).device
    context_ids = tok(task.context, return_tensors="pt").input_ids.to(device)
    query_ids = tok(task.query + task.answer_prefix, return_tensors="pt", add_special_tokens=False).input_ids.to(device)
    n = int(context_ids.shape[1])
    _peak_reset(model)
    base = torch.cuda.memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    begin = time.perf_counter()
    phases: dict[str, float] = {}
    if method == "reform":
        out = reform_gather(model, tok, context_ids, task.query, answer_prefix=task.answer_prefix,
                            chunk_size=args.chunk_size, budget=args.budget, heads=heads,
                            recompute_budget=args.budget, n_initial=args.n_initial, n_recent=args.n_recent,
                            n_final=args.n_final, progress=False, profile=args.profile, backend=args.backend)
        synchronize(model)
        phases.update(out.trace.timings)
        t1 = time.perf_counter()
        ids = out.input_ids
        o = model(input_ids=ids, use_cache=True)
        text = greedy_answer(tok, o.logits[:, -1], lambda t: model(input_ids=t, past_key_values=o.past_key_values,
                                                              use_cache=True).logits[:, -1], args.new_tokens)
        synchronize(model)
        phases["recompute_and_generate"] = time.perf_counter() - t1
        extra = {"cache_peak_bytes": out.stats["cache_peak_bytes"], "embedding_bytes": out.stats["embedding_bytes"]}
    elif method == "compress_only":
        target = tok(task.answer, return_tensors="pt", add_special_tokens=False).input_ids.to(device)[:, :1]
        text, _, held = C._answer_compressed(model, tok, context_ids, query_ids, target, chunk_size=args.chunk_size,
                                             budget=args.budget, n_initial=args.n_initial, n_recent=args.n_recent,
                                             max_new_tokens=args.new_tokens)
        extra = {"held": held}
    elif method in ("streamingllm", "h2o", "tova"):
        policy = C.baseline_policy(method, args.budget, args.n_initial, args.n_recent,
                                    question=(n, n + int(query_ids.shape[1])))
        cache = KVCache(model, policy)
        ids = torch.cat([context_ids, query_ids], dim=1)
        logits = None
        for s in range(0, ids.shape[1], args.chunk_size):
            logits = model(input_ids=ids[:, s:s + args.chunk_size], past_key_values=cache, use_cache=True).logits[:, -1]
        text = greedy_answer(tok, logits, lambda t: model(input_ids=t, past_key_values=cache, use_cache=True).logits[:, -1],
                         args.new_tokens)
        extra = {}
    else:
        raise ValueError(f"efficiency times reform, compress_only, streamingllm, h2o and tova; got method={method!r} "
                         "(drop it from --methods)")
    synchronize(model)
    seconds = time.perf_counter() - begin
    return {"method": method, "tokens": n, "seconds": round(seconds, 2), "peak_gib": round(_peak(model), 3),
            "before_gib": round(base, 3), "text": text, "answer": task.answer,
            "correct": task.answer.strip()[:12] in text, "phases": {k: round(v, 2) for k, v in phases.items()},
            **extra}


def run_efficiency(args) -> int:
    from kvlab.reform.api import load_heads
    from kvlab.eval.tasks import kv_task

    model, tok = _load(args)
    heads = load_heads(args.heads, model)
    filler = _read_tasks(args.tasks)["filler"]
    per_sentence = 27.0  # WikiText sentences average about 27 SmolLM2 tokens (measured on the first 2k sentences)
    report: dict[str, Any] = {"device": _device(model), "rows": [],
                              "command": "python -m kvlab bench reform " + " ".join(args.argv),
                              "kv_cache_gib_32k_window": round(_kv_gib(model, 32768), 3)}
    for n in args.lengths:
        task = kv_task(tok, None, n_filler=int(n / per_sentence), text=filler, seed=7, n_pairs=16, depth=0.4)
        for method in args.methods:
            if method != "reform" and n > args.baseline_max:
                continue
            if method in ("truncation", "rag", "rag_bm25", "infinipot", "reform_no_gather"):
                print(f"efficiency: {method} is not timed (reform, compress_only and the eviction baselines are)")
                continue
            row = _efficiency_one(method, model, tok, task, args, heads)
            row["backend"] = args.backend if method == "reform" else None
            report["rows"].append(row)
            print(row)
            _write(args.out, report)
    return 0


# --------------------------------------------------------------------------- kernels (random weights, no files)

def _device_ms_per_call(fn, reps: int = 10) -> float:
    """Milliseconds the GPU spends in kernels per call of ``fn`` (torch.profiler): beside the wall time of
    :func:`bench_ms` it separates launch and host overhead from device work."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    total = sum(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0))
                for e in prof.key_averages())
    return total / reps / 1e3


def run_scoring(args) -> int:
    from kvlab.kernels.benchmarking import bench_ms, device_info, fmt_table, require_cuda
    from kvlab.reform.reference import CompressedCache, h2o_keep, h2o_scores
    from kvlab.reform.triton import compress_kv_triton, h2o_scores_triton

    require_cuda()
    device = "cuda"
    model = random_smollm2(device, torch.float32)
    h, hk, d = (SMOLLM2_SHAPE[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim"))
    w = 128  # the paper's scoring window: the chunk's last 128 queries
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for chunk in args.chunks:
            n = args.budget + chunk
            gen = torch.Generator(device=device).manual_seed(n)
            q = (torch.randn(1, h, w, d, device=device, generator=gen) * 2).to(dtype)
            k = torch.randn(1, hk, n, d, device=device, generator=gen).to(dtype)
            v = torch.randn(1, hk, n, d, device=device, generator=gen).to(dtype)
            q_pos, k_pos = torch.arange(n - w, n, device=device), torch.arange(n, device=device)
            score = {"torch": lambda: h2o_scores(q, k, d ** -0.5, q_pos, k_pos),
                     "triton": lambda: h2o_scores_triton(q, k, d ** -0.5, q_pos, k_pos)}
            scores = score["torch"]()[0]

            def compress(fn):  # what forward_chunk does for one layer once scored: choose, then gather
                cache = CompressedCache(1, fn)
                cache.keys, cache.values, cache.origin = [k], [v], [torch.arange(n)]
                cache.compress(model, {0: h2o_keep(scores, args.budget, args.n_initial, args.n_recent)})
                return cache

            row = {"dtype": str(dtype)[6:], "chunk": chunk, "cache": n, "queries": w}
            for name, fn in score.items():
                row[f"score_{name}_ms"] = bench_ms(fn, args.time_budget)["ms"]
                row[f"score_{name}_device_ms"] = _device_ms_per_call(fn)  # kernel time alone: the rest is host
            for name, fn in (("torch", None), ("triton", compress_kv_triton)):
                row[f"compress_{name}_ms"] = bench_ms(lambda: compress(fn), args.time_budget)["ms"]
            row["score_speedup"] = row["score_torch_ms"] / row["score_triton_ms"]
            row["compress_speedup"] = row["compress_torch_ms"] / row["compress_triton_ms"]
            row["score_max_diff"] = float((score["triton"]()[0] - scores).abs().max())
            row["keys_max_diff"] = float((compress(compress_kv_triton).keys[0].float()
                                          - compress(None).keys[0].float()).abs().max())
            rows.append(row)
            print(row, flush=True)
    table = fmt_table(rows, [("dtype", "dtype", ""), ("chunk", "chunk", ""), ("cache", "keys scored", ""),
                             ("score_torch_ms", "score torch ms", "{:.3f}"),
                             ("score_triton_ms", "score Triton ms", "{:.3f}"),
                             ("score_speedup", "x", "{:.2f}"), ("score_torch_device_ms", "torch kernels ms", "{:.3f}"),
                             ("score_triton_device_ms", "Triton kernels ms", "{:.3f}"),
                             ("compress_torch_ms", "gather torch ms", "{:.3f}"),
                             ("compress_triton_ms", "gather Triton ms", "{:.3f}"),
                             ("compress_speedup", "x", "{:.1f}"), ("score_max_diff", "max diff", "{:.1e}")])
    print(table)
    tune = []  # float32 products: three tf32 ones (the default) or plain fp32, at the middle chunk
    n = args.budget + args.chunks[len(args.chunks) // 2]
    for dtype in (torch.float32, torch.bfloat16):
        q = torch.randn(1, h, w, d, device=device).to(dtype)
        k = torch.randn(1, hk, n, d, device=device).to(dtype)
        q_pos, k_pos = torch.arange(n - w, n, device=device), torch.arange(n, device=device)
        for bm, bn, warps, precision in ((128, 64, 4, "tf32x3"), (128, 64, 4, "ieee")):  # each compiles: ~3 s
            if precision == "ieee" and dtype != torch.float32:
                continue
            cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK=64, num_warps=warps, fp32_precision=precision)
            ms = bench_ms(lambda: h2o_scores_triton(q, k, d ** -0.5, q_pos, k_pos, config=cfg), args.time_budget)
            tune.append({"dtype": str(dtype)[6:], "cache": n, **cfg, "ms": ms["ms"]})
            print(tune[-1], flush=True)
    run = _scoring_of_a_run(args, h, hk, d, w) if args.run_tokens else []
    report = {"device": device_info(), "shape": "SmolLM2-135M: 9 heads, 3 KV heads, dim 64, last 128 queries",
              "budget": args.budget, "n_initial": args.n_initial, "n_recent": args.n_recent, "rows": rows,
              "table": table, "tune": tune, "run_scoring": run,
              "command": "python -m kvlab bench reform " + " ".join(args.argv)}
    _write(args.out, report)
    return 0


def _scoring_of_a_run(args, h: int, hk: int, d: int, w: int) -> list[dict[str, Any]]:
    """The scoring part of a ``--run-tokens`` REFORM pass on random inputs: every chunk after the first scores
    ``budget + chunk`` keys in each layer below the shipped heads file's exit layer, the device synchronised after
    each call as the profile's timers do; eager vs fused, fp32 and bf16, in one process."""
    from kvlab.reform.reference import h2o_scores
    from kvlab.reform.triton import h2o_scores_triton

    heads = json.loads((Path(__file__).resolve().parents[2] / "reform" / "heads" / "smollm2-135m.json").read_text())
    layers = int(heads["early_exit_layer"])
    calls = (args.run_tokens // args.chunk_size - 1) * layers
    n = args.budget + args.chunk_size
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        q = (torch.randn(1, h, w, d, device="cuda") * 2).to(dtype)
        k = torch.randn(1, hk, n, d, device="cuda").to(dtype)
        q_pos, k_pos = torch.arange(n - w, n, device="cuda"), torch.arange(n, device="cuda")
        row = {"dtype": str(dtype)[6:], "tokens": args.run_tokens, "calls": calls, "keys_per_call": n}
        for name, fn in (("torch", h2o_scores), ("triton", h2o_scores_triton)):
            fn(q, k, d ** -0.5, q_pos, k_pos)
            torch.cuda.synchronize()
            begin = time.perf_counter()
            for _ in range(calls):
                fn(q, k, d ** -0.5, q_pos, k_pos)
                torch.cuda.synchronize()
            row[f"{name}_s"] = round(time.perf_counter() - begin, 3)
        row["speedup"] = round(row["torch_s"] / row["triton_s"], 2)
        out.append(row)
        print(row, flush=True)
    return out


def run_profile(args) -> int:
    from kvlab.kernels.benchmarking import device_info, require_cuda
    from kvlab.reform.api import load_heads, reform_gather

    device = args.device or "cuda"  # --device cpu: a small smoke run (Triton then needs TRITON_INTERPRET=1)
    if device == "cuda":
        require_cuda()
    dtype = getattr(torch, args.dtype)
    model = random_smollm2(device, dtype)
    heads = load_heads(args.heads or str(Path(__file__).resolve().parents[2] / "reform" / "heads" / "smollm2-135m.json"), model)
    settings = dict(chunk_size=args.chunk_size, budget=args.budget, recompute_budget=args.budget, heads=heads,
                    n_initial=args.n_initial, n_recent=args.n_recent, n_final=args.n_final, progress=False)
    gen = torch.Generator().manual_seed(0)
    query = torch.randint(0, SMOLLM2_SHAPE["vocab_size"], (1, 32), generator=gen)
    report: dict[str, Any] = {"device": device_info() if device == "cuda" else device, "rows": [], "dtype": args.dtype,
                              "model": "SmolLM2-135M shape, random weights, random token ids",
                              "command": "python -m kvlab bench reform " + " ".join(args.argv)}
    for backend in args.backends:  # warm-up: compile the kernels, fill the allocator
        reform_gather(model, None, torch.randint(0, 1000, (1, 3 * args.chunk_size), generator=gen), query,
                      backend=backend, **settings)
    for n in args.lengths:
        ids = torch.randint(0, SMOLLM2_SHAPE["vocab_size"], (1, n), generator=gen)
        for backend in args.backends:
            _peak_reset(model)
            base = torch.cuda.memory_allocated() / 2**30 if device == "cuda" else float("nan")
            begin = time.perf_counter()
            out = reform_gather(model, None, ids, query, backend=backend, profile=args.profile, **settings)
            synchronize(model)
            gathered = time.perf_counter()
            o = model(input_ids=out.input_ids.to(device), use_cache=True)
            token = o.logits[:, -1:].argmax(-1)
            for _ in range(args.new_tokens - 1):
                token = model(input_ids=token, past_key_values=o.past_key_values, use_cache=True).logits.argmax(-1)
            synchronize(model)
            end = time.perf_counter()
            phases = dict(out.trace.timings)
            phases["recompute_and_generate"] = end - gathered
            forwarding = {k.split(".", 1)[1]: v for k, v in phases.items() if k.startswith("forwarding.")}
            total = sum(forwarding.values())
            row = {"backend": out.stats["backend"], "tokens": n, "seconds": round(end - begin, 2),
                   "peak_gib": round(_peak(model), 3), "before_gib": round(base, 3),
                   "phases": {k: round(v, 3) for k, v in phases.items()},
                   "forwarding_share": {k: round(v / total, 3) for k, v in forwarding.items()} if total else {}}
            report["rows"].append(row)
            print(row, flush=True)
            _write(args.out, report)
    return 0


def _kv_gib(model, tokens: int) -> float:
    from kvlab.memory import kv_bytes_per_token, shape_of

    return kv_bytes_per_token(shape_of(model.config), next(model.parameters()).dtype) * tokens / 2**30


# --------------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvlab bench reform", description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=sorted(_RUNNERS))
    p.add_argument("--model", default="smollm2-135m", help="kvlab model id, model folder or .gguf file")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--round-bf16", action="store_true", help="round the weights through bf16 (as kvlab's local copy)")
    p.add_argument("--tasks", default="reform_tasks.json.gz", help="file written by `tasks`")
    p.add_argument("--heads", default=None, help="heads file (for compare/efficiency)")
    p.add_argument("--out", required=True)
    p.add_argument("--head-samples", type=int, default=100)
    p.add_argument("--head-tokens", type=int, default=4096)
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--lengths", type=int, nargs="+", default=[16384, 32768])
    p.add_argument("--qa-lengths", type=int, nargs="*", default=[16384])
    p.add_argument("--single-lengths", type=int, nargs="*", default=[],
                   help="compare: also key-value retrieval with a single pair at these lengths")
    p.add_argument("--single-samples", type=int, default=12)
    p.add_argument("--methods", nargs="+", default=["reform", "truncation", "streamingllm", "h2o", "compress_only",
                                                   "rag"])
    p.add_argument("--ablations", action="store_true", help="add REFORM's Table 6a variants on the key-value sets")
    p.add_argument("--chunk-size", type=int, default=None)
    p.add_argument("--budget", type=int, default=None)
    p.add_argument("--n-initial", type=int, default=256)
    p.add_argument("--n-recent", type=int, default=256)
    p.add_argument("--n-final", type=int, default=256)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=10)
    p.add_argument("--profile", action="store_true",
                   help="efficiency, profile: time each step of chunked forwarding")
    p.add_argument("--backend", default="auto", choices=["auto", "torch", "triton"],
                   help="efficiency: REFORM's compression kernels (kvlab.reform.api)")
    p.add_argument("--backends", nargs="+", default=["torch", "triton"], choices=["torch", "triton"],
                   help="profile: the backends to run, one after the other")
    p.add_argument("--chunks", type=int, nargs="+", default=[2048, 4096, 8192],
                   help="scoring: chunk lengths added to the budget (keys scored = budget + chunk)")
    p.add_argument("--time-budget", type=float, default=0.5, help="scoring: seconds of repeats per timing")
    p.add_argument("--run-tokens", type=int, default=0,
                   help="scoring: also time every scoring call of a REFORM pass over this many tokens (random inputs)")
    p.add_argument("--baseline-max", type=int, default=262144, help="longest input the baselines run on")
    return p


_RUNNERS = {"tasks": run_tasks, "heads": run_heads, "compare": run_compare, "efficiency": run_efficiency,
            "scoring": run_scoring, "profile": run_profile}
#: ``python -m kvlab bench reform WHAT ...``: each entry takes the options after WHAT.
COMMANDS = {what: (lambda argv, what=what: main([what, *argv])) for what in _RUNNERS}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    args.argv = argv
    defaults = {"heads": (1024, 256), "compare": (2048, 2048), "efficiency": (2048, 2048), "tasks": (0, 0),
                "scoring": (2048, 2048), "profile": (2048, 2048)}
    chunk, budget = defaults[args.what]
    args.chunk_size = chunk if args.chunk_size is None else args.chunk_size
    args.budget = budget if args.budget is None else args.budget
    return _RUNNERS[args.what](args) or 0


if __name__ == "__main__":
    raise SystemExit(main())
