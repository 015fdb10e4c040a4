"""``python -m kvlab bench orthorank WHAT``: GPU benchmarks of OrthoRank, with a JSON record.

Subcommands (each writes ``<out>/orthorank_<what>[_tag].json`` and ``.md`` with the device named):

* ``throughput``  prefill throughput, batch x 2048 tokens (the paper's setting: batch 32, Sec. 4.1), for a
  1B-class (Llama-3.2-1B shape) and an 8B-class (Llama-3-8B shape) model with random bf16 weights: dense,
  SLEB (layers removed) and OrthoRank (layers routed at ``token_ratio``) with each of ``--backends`` (the
  PyTorch routed layer and the Triton one) at 10% and 20% sparsity, with the paper's accounting
  (``kvlab.orthorank.layers_for_sparsity``); then the ``layer`` table of the same shapes (``--no-layer``
  skips it). Ratios are measured side by side in one run.
* ``layer``       one decoder layer of each shape: dense forward, the input RMSNorm alone, and per backend the
  routed forward, its bookkeeping alone (Eq. 4 scores, top-k, row gathers, causal mask or key ranges, scatter;
  the RMSNorm is not counted: the dense layer computes it too) and its attention alone.

Readings: throughput counts prompt tokens per second of a full forward pass without a cache whose logits are
only computed for the last position (``logits_to_keep=1``; the paper does not say what it times); which
layers are removed or routed does not change the time, so they are spread evenly over the second half of the
network (their choice needs a trained model: :func:`kvlab.orthorank.search_layers`).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvlab.kernels.benchmarking import bench_ms, device_info, fmt_table, ints, require_cuda, spin, write_outputs

__all__ = ["COMMANDS", "SHAPES", "kernel_profile", "main", "spread_layers"]

SHAPES = {
    # Llama-3.2-1B and Llama-3-8B (vocabulary 128256, GQA 8 KV heads)
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, head_dim=64, tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
}


ATTENTION_CONFIGS = [dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st)
                     for bm, bn, w, st in ((128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3), (64, 64, 4, 4),
                                           (64, 32, 4, 3), (64, 64, 8, 3), (64, 128, 4, 3), (32, 64, 4, 3))]


def spread_layers(num_layers: int, n: int) -> list[int]:
    """``n`` layers spread evenly over the second half of ``num_layers`` (the last layer excluded)."""
    if n == 0:
        return []
    lo, hi = num_layers // 2, num_layers - 2
    if n > hi - lo + 1:
        lo = max(1, hi - n + 1)
    return sorted({lo + round(i * (hi - lo) / max(1, n - 1)) for i in range(n)})[:n]


def _model(shape: str, seq: int):
    torch = require_cuda()
    from transformers import LlamaConfig, LlamaForCausalLM

    from kvlab.core import attach

    cfg = LlamaConfig(vocab_size=128256, max_position_embeddings=max(seq, 8192), rope_theta=500000.0,
                      **SHAPES[shape])
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(default)
    return attach(model), cfg


def _method(backend: str) -> str:
    return f"OrthoRank ({backend})"


def run_throughput(args) -> dict:
    torch = require_cuda()
    from kvlab.orthorank import layers_for_sparsity, nominal_sparsity, orthorank, skip_layers

    rows = []
    for shape in args.shapes:
        model, cfg = _model(shape, args.seq)
        L = cfg.num_hidden_layers
        ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device="cuda",
                            generator=torch.Generator(device="cuda").manual_seed(1))

        @torch.no_grad()
        def step():
            return model(input_ids=ids, use_cache=False, logits_to_keep=1).logits

        spin(2.0)
        dense = bench_ms(step, budget_s=args.budget, max_reps=20)
        rows.append({"shape": shape, "method": "dense", "sparsity": 0.0, "nominal": 0.0, "layers": [], **dense})
        if args.kernels:  # device time of one forward beside its wall time: idle gaps show as the difference
            rows[-1]["kernels"] = kernel_profile(step, reps=1, top=30)
        for s in args.sparsities:
            removed = spread_layers(L, layers_for_sparsity(L, s))
            with skip_layers(model, removed):
                res = bench_ms(step, budget_s=args.budget, max_reps=20)
            rows.append({"shape": shape, "method": "SLEB", "sparsity": s, "layers": removed,
                         "nominal": nominal_sparsity(L, removed=len(removed)), **res})
            routed = spread_layers(L, layers_for_sparsity(L, s, args.token_ratio))
            for backend in args.backends:
                extra = {"inplace": True} if args.inplace and backend == "triton" else {}
                with orthorank(model, layers=routed, token_ratio=args.token_ratio, backend=backend, **extra):
                    res = bench_ms(step, budget_s=args.budget, max_reps=20)
                    if args.kernels:
                        res["kernels"] = kernel_profile(step, reps=1, top=30)
                rows.append({"shape": shape, "method": _method(backend), "sparsity": s, "layers": routed,
                             "nominal": nominal_sparsity(L, routed=len(routed), token_ratio=args.token_ratio),
                             **res})
        for r in rows:
            if r["shape"] == shape:
                r["tokens_per_s"] = args.batch * args.seq / r["ms"] * 1e3
                r["x_dense"] = dense["ms"] / r["ms"]
        del model
        torch.cuda.empty_cache()
    for r in rows:
        if r["method"].startswith("OrthoRank"):
            sleb = next(x for x in rows if x["shape"] == r["shape"] and x["method"] == "SLEB"
                        and x["sparsity"] == r["sparsity"])
            r["x_sleb"] = sleb["ms"] / r["ms"]
            # removed layers of one shape all save the same time: SLEB's time at OrthoRank's own sparsity
            dense_ms = next(x["ms"] for x in rows if x["shape"] == r["shape"] and x["method"] == "dense")
            at_same = dense_ms + (sleb["ms"] - dense_ms) * r["nominal"] / sleb["nominal"]
            r["x_sleb_same_sparsity"] = at_same / r["ms"]
    return {"batch": args.batch, "seq": args.seq, "token_ratio": args.token_ratio, "backends": args.backends,
            "rows": rows}


def run_layer(args) -> dict:
    torch = require_cuda()
    from kvlab.orthorank import triton as kernels
    from kvlab.orthorank.reference import (take_rows, alignment, attention, project_qkv, routed_layer,
                                           select_topk, tokens_for_ratio)

    rows = []
    for shape in args.shapes:
        model, cfg = _model(shape, args.seq)
        layer = model.model.layers[cfg.num_hidden_layers // 2]
        gen = torch.Generator(device="cuda").manual_seed(2)
        h = torch.randn(args.batch, args.seq, cfg.hidden_size, device="cuda", dtype=torch.bfloat16, generator=gen)
        pos = torch.arange(args.seq, device="cuda")[None]
        pe = model.model.rotary_emb(h, pos)
        k = tokens_for_ratio(args.token_ratio, args.seq)

        @torch.no_grad()
        def dense():
            return layer(h, position_embeddings=pe, attention_mask=None, position_ids=pos)

        with torch.no_grad():
            normed = layer.input_layernorm(h)
            sel = select_topk(alignment(normed), k)
            cos, sin = (t.expand(args.batch, -1, -1) for t in pe)
            query, key, value = project_qkv(layer, take_rows(normed, sel), take_rows(cos, sel),
                                            take_rows(sin, sel), normed, cos, sin)
            positions = pos.expand(args.batch, -1)
            q_pos = positions.gather(1, sel)

        @torch.no_grad()
        def norm():
            return layer.input_layernorm(h)

        # what each backend's router does: score the normalised states, reuse them for K and V
        @torch.no_grad()
        def routed_torch():
            normed_ = layer.input_layernorm(h)
            return routed_layer(layer, h, select_topk(alignment(normed_), k), position_embeddings=pe, positions=pos,
                                normed=normed_)

        @torch.no_grad()
        def routed_triton():
            normed_, scores_ = kernels.normalized_scores(layer, h)  # the RMSNorm and Eq. 4 in one pass
            sel_ = kernels.topk_in_order(scores_, k)
            return kernels.routed_layer_triton(layer, h, sel_, position_embeddings=pe, positions=pos, normed=normed_)

        @torch.no_grad()
        def norm_scores_triton():
            return kernels.normalized_scores(layer, h)

        # everything of the routed path but the norm, the projections, attention and the MLP
        @torch.no_grad()
        def bookkeeping_torch():
            sel_ = select_topk(alignment(normed), k)
            idx = sel_[..., None].expand(-1, -1, cfg.hidden_size)
            x_sel, h_sel = normed.gather(1, idx), h.gather(1, idx)
            mask = positions.gather(1, sel_)[:, :, None] >= positions[:, None, :]
            return h.scatter(1, idx, h_sel + x_sel), mask

        @torch.no_grad()
        def bookkeeping_triton():
            sel_ = kernels.topk_in_order(kernels.orthogonal_scores(normed), k)
            x_sel = kernels.gather_rows(normed, sel_)
            ranges = kernels.key_ranges(positions.gather(1, sel_), positions)
            a = kernels.gather_rows(h, sel_, add=x_sel)  # the attention block's residual add
            return kernels.scatter_rows(h, sel_, a, x_sel), ranges

        @torch.no_grad()
        def attention_torch():
            mask = q_pos[:, :, None] >= positions[:, None, :]
            return attention(query, key, value, mask[:, None], layer.self_attn.scaling)

        @torch.no_grad()
        def attention_triton():
            return kernels.selected_attention(query, key, value, q_pos, positions, layer.self_attn.scaling)

        spin(1.0)
        common = {"dense": dense, "norm": norm}
        per_backend = {"torch": (routed_torch, bookkeeping_torch, attention_torch),
                       "triton": (routed_triton, bookkeeping_triton, attention_triton)}
        base = {name: bench_ms(fn, budget_s=args.budget)["ms"] for name, fn in common.items()}
        for backend in args.backends:
            res = {name: bench_ms(fn, budget_s=args.budget)["ms"]
                   for name, fn in zip(("routed", "bookkeeping", "attention"), per_backend[backend])}
            if backend == "triton":
                res["norm_scores"] = bench_ms(norm_scores_triton, budget_s=args.budget)["ms"]
            row = {"shape": shape, "backend": backend, "tokens": args.batch * args.seq, "k": k,
                   **{f"{n}_ms": v for n, v in (base | res).items()},
                   "routed_x_dense": res["routed"] / base["dense"],
                   "bookkeeping_share": res["bookkeeping"] / res["routed"]}
            if args.kernels:  # where the routed layer's time goes, kernel by kernel (torch.profiler)
                row["kernels"] = kernel_profile(per_backend[backend][0])
                row["dense_kernels"] = kernel_profile(dense)
                if backend == "triton":  # the selected-attention kernel's tiles (how _attention_config was chosen)
                    row["attention_configs"] = [
                        {**c, "ms": bench_ms(lambda c=c: kernels.selected_attention(
                            query, key, value, q_pos, positions, layer.self_attn.scaling, config=c),
                            budget_s=0.2)["ms"]} for c in ATTENTION_CONFIGS]
            rows.append(row)
        del model
        torch.cuda.empty_cache()
    return {"batch": args.batch, "seq": args.seq, "token_ratio": args.token_ratio, "backends": args.backends,
            "rows": rows}


def kernel_profile(fn, reps: int = 3, top: int = 25) -> list[dict]:
    """The GPU kernels of ``fn()`` by device time per call (torch.profiler), longest first: name, ms, calls."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        ms = getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)) / reps / 1e3
        if ms > 0:
            rows.append({"kernel": e.key[:120], "ms": round(ms, 4), "calls": e.count // reps})
    rows.sort(key=lambda r: -r["ms"])
    total = sum(r["ms"] for r in rows)
    return [{"kernel": "TOTAL (device)", "ms": round(total, 4), "calls": 0}] + rows[:top]


def _parser(what: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=f"kvlab bench orthorank {what}", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="build/bench",
                    help="folder for the JSON and Markdown record (default build/bench; the committed "
                         "benchmarks/results only when named)")
    ap.add_argument("--tag", default="", help="suffix for output names (e.g. the device)")
    ap.add_argument("--shapes", default="1b,8b", help=f"comma-separated model shapes: {', '.join(SHAPES)}")
    for flag, kind, default in (("--batch", int, 32), ("--seq", int, 2048), ("--token-ratio", float, 0.33)):
        ap.add_argument(flag, type=kind, default=default)  # the paper's throughput setting (Table 1)
    ap.add_argument("--sparsities", default="10,20", help="comma-separated target sparsities in percent")
    ap.add_argument("--budget", type=float, default=2.0, help="seconds of repeats per measurement")
    ap.add_argument("--backends", default="torch,triton", help="OrthoRank routed-layer backends to compare")
    ap.add_argument("--kernels", action="store_true", help="layer: add a per-kernel device-time profile to each row")
    ap.add_argument("--inplace", action="store_true",
                    help="throughput: the Triton routed layer writes into its input (OrthoRankRouter(inplace=True))")
    if what == "throughput":
        ap.add_argument("--no-layer", action="store_true", help="skip the per-layer table after the throughput")
    return ap


def _args(what: str, argv: list[str]):
    args = _parser(what).parse_args(argv)
    args.shapes = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in args.shapes if s not in SHAPES]
    if unknown:
        raise SystemExit(f"--shapes: unknown {unknown}; choose from {list(SHAPES)}")
    args.sparsities = [p / 100 for p in ints(args.sparsities)]
    args.backends = [b for b in args.backends.split(",") if b]
    unknown = [b for b in args.backends if b not in ("torch", "triton")]
    if unknown or not args.backends:
        raise SystemExit(f"--backends: unknown {unknown}; choose from torch, triton")
    return args


def throughput(argv: list[str]) -> int:
    args = _args("throughput", argv)
    info = device_info()
    rec = run_throughput(args) | {"info": info}
    table = fmt_table(rec["rows"], [("shape", "shape", ""), ("method", "method", ""),
                                    ("sparsity", "target", "{:.0%}"), ("nominal", "sparsity", "{:.1%}"),
                                    ("ms", "ms", "{:.1f}"), ("tokens_per_s", "tokens/s", "{:.0f}"),
                                    ("x_dense", "x dense", "{:.3f}"), ("x_sleb", "x SLEB", "{:.3f}"),
                                    ("x_sleb_same_sparsity", "x SLEB at equal sparsity", "{:.3f}")])
    table += ("\n'x SLEB at equal sparsity': SLEB's time interpolated linearly in the number of removed layers "
              "to OrthoRank's nominal sparsity")
    table += f"\nbatch {args.batch} x {args.seq} tokens, token ratio {args.token_ratio}, bf16, random weights"
    if not args.no_layer:
        rec["layer"] = run_layer(args)
        table += "\n\nOne routed layer (the middle one of each shape):\n\n" + _layer_table(rec["layer"])
    write_outputs(Path(args.out), "orthorank_throughput" + (f"_{args.tag}" if args.tag else ""), rec, table, info)
    return 0


def _layer_table(rec: dict) -> str:
    table = fmt_table(rec["rows"], [("shape", "shape", ""), ("backend", "backend", ""), ("tokens", "tokens", ""),
                                    ("k", "k/seq", ""), ("dense_ms", "dense ms", "{:.2f}"),
                                    ("norm_ms", "RMSNorm ms", "{:.2f}"), ("routed_ms", "routed ms", "{:.2f}"),
                                    ("bookkeeping_ms", "bookkeeping ms", "{:.2f}"),
                                    ("attention_ms", "attention ms", "{:.2f}"),
                                    ("routed_x_dense", "routed / dense", "{:.3f}"),
                                    ("bookkeeping_share", "bookkeeping / routed", "{:.1%}")])
    return table + ("\nbookkeeping: Eq. 4 scores, top-k, row gathers, causal mask (torch) or key ranges (triton), "
                    "scatter; the RMSNorm (shown apart) is not counted, the dense layer computes it too")


def layer(argv: list[str]) -> int:
    args = _args("layer", argv)
    info = device_info()
    rec = run_layer(args) | {"info": info}
    table = _layer_table(rec)
    write_outputs(Path(args.out), "orthorank_layer" + (f"_{args.tag}" if args.tag else ""), rec, table, info)
    return 0


COMMANDS = {"throughput": throughput, "layer": layer}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(f"usage: python -m kvlab bench orthorank {{{','.join(COMMANDS)}}} [options]\n\n{__doc__}")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    return COMMANDS[argv[0]](argv[1:]) or 0
