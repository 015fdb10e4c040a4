"""``python -m kvlab bench sepllm WHAT``: GPU benchmarks of SepLLM's attention kernels, with a JSON record.

Subcommands (each writes ``<out>/<name>.json`` with the device name and versions, prints a table):

* ``ops``     SepLLM attention at N = 4k..64k: dense causal SDPA, FlexAttention with the SepLLM block
  mask (the paper's kernel), the Triton kernel, and the kept-entry density (the physical limit on
  saved work); forward and forward+backward; separators at random 8% of positions and from real
  text (``kvlab/sepllm/data/separators_*.npz``, package data; SmolLM2 tokenizer). Also draws ``ops.png``.
* ``prefill`` a Llama-3-8B-shaped model (random weights, bf16), 32k-token prefill, SDPA vs the Triton
  SepLLM kernel plugged in through ``kvlab.core.use_pattern``.
* ``train``   training-step time of a ~100M-parameter Llama-style model at 4k-8k context.
* ``tune``    tile-size sweep of the Triton kernels (used to choose the defaults).

Timing: CUDA events around each call, after a warm-up call (compilation), median of repeats sized to
a time budget. Useful work of SepLLM attention = 4 * dim flops per kept (query, key) entry forward
(QK^T and PV), 2.5 times that backward (FlashAttention's convention).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from kvlab.kernels.benchmarking import (allow_many_compiles, bench_ms, device_info, fmt_table, ints, random_qkv,
                                        require_cuda, spin, write_outputs)

DATA = Path(__file__).resolve().parents[2] / "sepllm" / "data"  # package data: works from a wheel too

__all__ = ["main", "load_separators", "roofline", "tile_work"]


def load_separators(name: str, n: int, batch: int = 1, seed: int = 0):
    """``(batch, n)`` bool separator flags: ``random<P>`` (P percent) or a text in ``kvlab/sepllm/data``."""
    torch = require_cuda()
    if name.startswith("random"):
        p = float(name[len("random"):] or 8) / 100
        g = torch.Generator(device="cuda").manual_seed(seed)
        return torch.rand(batch, n, generator=g, device="cuda") < p
    import numpy as np

    path = DATA / f"separators_{name}.npz"
    if not path.exists():
        known = sorted(p.stem.removeprefix("separators_") for p in DATA.glob("separators_*.npz"))
        raise ValueError(f"no separator data {name!r}: use randomP (e.g. random8) or one of {known}")
    arr = np.load(path)["is_sep"]
    if len(arr) < n:
        raise ValueError(f"{name} has only {len(arr)} tokens < {n}")
    rows = [arr[(i * 997) % max(1, len(arr) - n):][:n] for i in range(batch)]
    return torch.as_tensor(np.stack(rows), device="cuda")




# ---------------------------------------------------------------------------------------------
# ops: SepLLM attention, SDPA vs Flex vs Triton
# ---------------------------------------------------------------------------------------------
def variant_config(spec: str, dim: int, dtype) -> dict:
    """The default config of a variant named ``NAME[+OPTION...]``, so that ``ops`` times such options side by side.

    Options (of the ``tma`` forward, the backward keeps its tiles): ``+split`` whole window tiles through an
    unmasked loop (``window_split``); ``+ws`` the far loop warp-specialised (``warp_spec``); ``+diag`` the masked
    window tiles split at the diagonal, each with the cheaper mask that holds there (``window_diag``); ``+wN``
    window tiles of N keys (the forward's ``BLOCK_N``, also the window alignment: ``tma+w64``); ``+sK`` the window
    loop pipelined in K stages (``window_stages``; the far loop keeps ``num_stages``); ``+rerun`` nothing changed,
    the same config timed once more in the same run (the within-run spread beside the options' differences).
    """
    import re

    from kvlab.sepllm.triton import default_config

    name, *flags = spec.split("+")
    cfg = default_config(dim, dtype, variant=name)
    fwd = dict(cfg["fwd"])
    for flag in flags:
        key = {"split": "window_split", "ws": "warp_spec", "diag": "window_diag"}.get(flag)
        num = re.fullmatch(r"([ws])(\d+)", flag)
        if flag == "rerun":
            continue
        if name != "tma":
            raise ValueError(f"variant {spec!r}: option {flag!r} is one of the tma forward's (use tma+{flag})")
        if key is not None:
            fwd[key] = True
        elif num and num[1] == "w":
            fwd["BLOCK_N"] = int(num[2])
        elif num:
            fwd["window_stages"] = int(num[2])
        else:
            raise ValueError(f"variant {spec!r}: unknown option {flag!r} (use +split, +ws, +diag, +wN, +sK, +rerun)")
    cfg["fwd"] = fwd
    return cfg


def tile_work(is_sep, init: int, neighbors: int, cfg: dict, heads: int, kv_heads: int, dim: int,
              elsize: int = 2) -> dict:
    """What the forward kernel computes and moves for one batch of separator flags, counted from its tiling.

    Per query tile of ``BLOCK_M`` rows: the far keys (kept keys before the window region) in tiles of
    ``BLOCK_F``, the window region in tiles of ``BLOCK_N`` (:mod:`kvlab.sepllm.triton`). Returns the computed
    and useful FLOP (4 * dim per (query, key) pair: QK^T and PV), the bytes of K/V rows the programs load
    into shared memory (mostly L2 hits: a head's compacted K/V is a few hundred KB), and the fewest bytes
    the call must move through device memory (q, k, v read once, o written once, plus the compacted copy
    of the kept K/V rows for the ``tma`` variant).
    """
    import torch

    from kvlab.sepllm.reference import kept_fraction
    from kvlab.sepllm.triton import compact_kept_keys_torch

    fwd = cfg["fwd"]
    bm, bn, bf = fwd["BLOCK_M"], fwd["BLOCK_N"], fwd["BLOCK_F"]
    b, n = is_sep.shape
    _, _, cnt = compact_kept_keys_torch(is_sep.cpu(), init)
    q0 = torch.arange(0, n, bm)
    lo = torch.clamp(q0 - neighbors + 1, min=0) // bn * bn
    hi = torch.clamp(q0 + bm, max=n)
    n_far = cnt[:, lo].double()  # (batch, tiles)
    far_rows = torch.ceil(n_far / bf) * bf
    win_rows = (torch.ceil((hi - lo) / bn) * bn).double()
    rows = (far_rows + win_rows[None]).sum().item() * heads  # key rows walked, all programs
    pairs = rows * bm
    useful_pairs = kept_fraction(is_sep, init, neighbors) * b * n * (n + 1) / 2 * heads
    kept_rows = cnt[:, -1].double().sum().item() * kv_heads
    hbm = (2 * b * heads * n + 2 * b * kv_heads * n) * dim * elsize
    if cfg.get("variant") == "tma":
        hbm += 3 * kept_rows * 2 * dim * elsize  # gather: read + write the kept rows; the kernel reads them once
    return {"computed_flop": 4 * dim * pairs, "useful_flop": 4 * dim * useful_pairs,
            "smem_bytes": rows * 2 * dim * elsize, "hbm_bytes_min": hbm,
            "far_share": float((far_rows.sum() / (far_rows.sum() + win_rows.sum() * b)).item())}


def run_ops(args) -> dict:
    torch = require_cuda()
    import torch.nn.functional as F

    from kvlab.kernels.benchmarking import machine_ceilings
    from kvlab.sepllm.flex import sep_attention_flex, sepllm_block_mask
    from kvlab.sepllm.reference import kept_fraction
    from kvlab.sepllm.triton import sep_attention_triton

    allow_many_compiles()
    a, w, h, hk, d, dtype = args.init, args.neighbors, args.heads, args.kv_heads, args.dim, torch.bfloat16
    ceilings = machine_ceilings()
    print(json.dumps(ceilings), flush=True)
    configs = {var: variant_config(var, d, dtype) for var in args.variants}
    rows = []
    for n in args.seqs:
        q, k, v = random_qkv(n, h, hk, d, dtype)
        do = torch.randn_like(q)
        qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
        causal_flops = 4 * d * h * n * (n + 1) / 2

        def fwd_bwd(f):
            def run():
                out = f(qg, kg, vg)
                torch.autograd.grad(out, (qg, kg, vg), do)
            return run

        budget = args.budget
        sdpa = lambda q_, k_, v_: F.scaled_dot_product_attention(q_, k_, v_, is_causal=True,  # noqa: E731
                                                                 enable_gqa=h != hk)
        r_sdpa_f = bench_ms(lambda: sdpa(q, k, v), budget)
        r_sdpa_b = bench_ms(fwd_bwd(sdpa), budget)
        base = {"N": n, "heads": h, "kv_heads": hk, "dim": d}
        rows.append(base | {"method": "sdpa_causal", "sep": "-", "density": 1.0, "fwd_ms": r_sdpa_f["ms"],
                            "fwdbwd_ms": r_sdpa_b["ms"],
                            "fwd_TFLOPs": causal_flops / r_sdpa_f["ms"] / 1e9,
                            "fwdbwd_TFLOPs": 3.5 * causal_flops / r_sdpa_b["ms"] / 1e9})
        print(f"N={n} sdpa fwd {r_sdpa_f['ms']:.3f} fwd+bwd {r_sdpa_b['ms']:.3f}", flush=True)
        for src in args.seps:
            is_sep = load_separators(src, n)
            dens = kept_fraction(is_sep, a, w)
            useful = causal_flops * dens
            flex_row = None
            if not args.no_flex and n <= args.flex_max_n:
                t0 = time.perf_counter()
                bm = sepllm_block_mask(is_sep, a, w)
                torch.cuda.synchronize()
                mask_s = time.perf_counter() - t0
                fl = lambda q_, k_, v_: sep_attention_flex(q_, k_, v_, is_sep, a, w, block_mask=bm)  # noqa: E731, B023
                f_f = bench_ms(lambda: fl(q, k, v), budget)  # noqa: B023
                f_b = bench_ms(fwd_bwd(fl), budget)
                sparsity = 1.0 - bm.kv_num_blocks.sum().item() / (bm.kv_num_blocks.shape[-1] * (bm.kv_num_blocks.shape[-1] + 1) / 2)
                flex_row = base | {"method": "flex", "sep": src, "density": dens, "fwd_ms": f_f["ms"],
                                   "fwdbwd_ms": f_b["ms"], "fwd_TFLOPs": useful / f_f["ms"] / 1e9,
                                   "fwdbwd_TFLOPs": 3.5 * useful / f_b["ms"] / 1e9,
                                   "block_mask_s": mask_s, "blocks_skipped_vs_causal": sparsity}
                rows.append(flex_row)
                print(f"N={n} {src} flex fwd {f_f['ms']:.3f} fwd+bwd {f_b['ms']:.3f}", flush=True)
            tri_rows = []
            for var, cfg in configs.items():
                tri = lambda q_, k_, v_: sep_attention_triton(q_, k_, v_, is_sep, a, w, config=cfg)  # noqa: E731, B023
                try:
                    r_f = bench_ms(lambda: tri(q, k, v), budget)  # noqa: B023
                    r_b = bench_ms(fwd_bwd(tri), budget)
                except Exception as exc:  # noqa: BLE001 - a variant that fails to build leaves the others timed
                    print(f"N={n} {src} triton-{var} failed: {exc}", flush=True)
                    rows.append(base | {"method": f"triton-{var}", "variant": var, "sep": src, "error": str(exc)[:500]})
                    continue
                work = tile_work(is_sep, a, w, cfg, h, hk, d)
                row = base | {"method": f"triton-{var}", "variant": var, "sep": src,
                              "sep_frac": is_sep.float().mean().item(),
                              "density": dens, "fwd_ms": r_f["ms"], "fwdbwd_ms": r_b["ms"],
                              "fwd_TFLOPs": useful / r_f["ms"] / 1e9,
                              "fwd_TFLOPs_computed": work["computed_flop"] / r_f["ms"] / 1e9,
                              "fwdbwd_TFLOPs": 3.5 * useful / r_b["ms"] / 1e9,
                              "ideal_fwd_ms": dens * r_sdpa_f["ms"], "ideal_fwdbwd_ms": dens * r_sdpa_b["ms"],
                              "x_sdpa_fwd": r_sdpa_f["ms"] / r_f["ms"], "x_sdpa_fwdbwd": r_sdpa_b["ms"] / r_b["ms"],
                              "share_of_limit_fwd": dens * r_sdpa_f["ms"] / r_f["ms"],
                              "share_of_limit_fwdbwd": dens * r_sdpa_b["ms"] / r_b["ms"],
                              "config": cfg, "work": work,
                              "smem_GBps_fwd": work["smem_bytes"] / r_f["ms"] / 1e6,
                              "hbm_GBps_min_fwd": work["hbm_bytes_min"] / r_f["ms"] / 1e6}
                if flex_row is not None:
                    row["x_flex_fwd"] = flex_row["fwd_ms"] / r_f["ms"]
                    row["x_flex_fwdbwd"] = flex_row["fwdbwd_ms"] / r_b["ms"]
                print(f"N={n} {src} density {dens:.3f} triton-{var} fwd {r_f['ms']:.3f} fwd+bwd {r_b['ms']:.3f} "
                      f"({row['x_sdpa_fwd']:.2f}x / {row['x_sdpa_fwdbwd']:.2f}x SDPA)", flush=True)
                tri_rows.append(row)
            if len(tri_rows) > 1:  # the first variant against each other one, measured in this run
                for other in tri_rows[1:]:
                    tri_rows[0][f"x_{other['variant']}_fwd"] = other["fwd_ms"] / tri_rows[0]["fwd_ms"]
                    tri_rows[0][f"x_{other['variant']}_fwdbwd"] = other["fwdbwd_ms"] / tri_rows[0]["fwdbwd_ms"]
            rows += tri_rows
        del q, k, v, do, qg, kg, vg
        torch.cuda.empty_cache()
    return {"init": a, "neighbors": w, "dtype": "bfloat16", "variants": list(args.variants), "ceilings": ceilings,
            "rows": rows}


def roofline(rec: dict, n: int | None = None) -> list[dict]:
    """Where each method of an ``ops`` record stands at length ``n`` (default: the longest): its time, the
    FLOP it computes and the bytes it must move (``tile_work``'s model for the Triton rows; for SDPA the
    causal triangle and q, k, v, o once), the rates that gives, and the ceilings measured in the same run."""
    n = n or max(r["N"] for r in rec["rows"])
    cei = rec.get("ceilings", {})
    out = []
    for r in rec["rows"]:
        if r["N"] != n or "fwd_ms" not in r:
            continue
        d, h, hk = r["dim"], r["heads"], r["kv_heads"]
        causal = 4 * d * h * n * (n + 1) / 2
        if r["method"] == "sdpa_causal":
            flop, useful = causal, causal
            hbm, smem = (2 * h + 2 * hk) * n * d * 2, None
        elif "work" in r:
            flop, useful = r["work"]["computed_flop"], r["work"]["useful_flop"]
            hbm, smem = r["work"]["hbm_bytes_min"], r["work"]["smem_bytes"]
        else:  # flex: no work model (it computes every touched 128 x 128 tile)
            continue
        ms = r["fwd_ms"]
        out.append({"method": r["method"], "sep": r["sep"], "fwd_ms": ms, "computed_TFLOPs": flop / ms / 1e9,
                    "useful_TFLOPs": useful / ms / 1e9, "hbm_GBps_min": hbm / ms / 1e6,
                    "intensity_hbm": flop / hbm, "smem_GBps": smem / ms / 1e6 if smem else None,
                    "intensity_smem": flop / smem if smem else None,
                    "share_of_limit": r.get("share_of_limit_fwd"), "x_sdpa": r.get("x_sdpa_fwd"),
                    "bf16_mm_TFLOPs": cei.get("bf16_mm_TFLOPs"), "copy_GBps": cei.get("copy_GBps")})
    return out


def print_ops(rec: dict) -> str:
    cols = [("N", "N", ""), ("method", "method", ""), ("sep", "separators", ""), ("density", "kept", "{:.3f}"),
            ("fwd_ms", "fwd ms", "{:.3f}"), ("fwd_TFLOPs", "fwd TFLOP/s", "{:.0f}"),
            ("fwdbwd_ms", "fwd+bwd ms", "{:.3f}"), ("fwdbwd_TFLOPs", "fwd+bwd TFLOP/s", "{:.0f}"),
            ("ideal_fwd_ms", "kept x SDPA fwd", "{:.3f}"),
            ("x_sdpa_fwd", "SDPA/Triton fwd", "{:.2f}"), ("x_flex_fwd", "Flex/Triton fwd", "{:.2f}"),
            ("x_sdpa_fwdbwd", "SDPA/Triton f+b", "{:.2f}"), ("x_flex_fwdbwd", "Flex/Triton f+b", "{:.2f}"),
            ("share_of_limit_fwd", "share of limit fwd", "{:.0%}"), ("share_of_limit_fwdbwd", "share of limit f+b", "{:.0%}")]
    others = [v for v in rec.get("variants", [])[1:]]
    cols += [(f"x_{v}_fwd", f"{v}/{rec['variants'][0]} fwd", "{:.2f}") for v in others]
    cols += [(f"x_{v}_fwdbwd", f"{v}/{rec['variants'][0]} f+b", "{:.2f}") for v in others]
    return fmt_table(rec["rows"], cols)


def plot_ops(rec: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = rec["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, title in ((axes[0], "fwd_ms", "forward"), (axes[1], "fwdbwd_ms", "forward + backward")):
        series = {}
        for r in rows:
            label = "dense SDPA (causal)" if r["method"] == "sdpa_causal" else f"{r['method']} ({r['sep']})"
            series.setdefault(label, []).append((r["N"], r[key]))
        for label, pts in sorted(series.items()):
            pts.sort()
            style = "-o" if "triton" in label else ("--s" if "flex" in label else "-k^")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label, ms=4)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel("ms")
        ax.set_title(f"SepLLM attention, {title}")
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7)
    dev = rec.get("info", {}).get("device", "")
    fig.suptitle(f"{dev}: bf16, {rows[0]['heads']} heads, dim {rows[0]['dim']}, a={rec['init']}, n={rec['neighbors']}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# ---------------------------------------------------------------------------------------------
# model level: prefill of a Llama-3-8B-shaped model, training step of a ~100M model
# ---------------------------------------------------------------------------------------------
def _real_text_ids(n: int, batch: int = 1):
    import numpy as np
    import torch

    data = np.load(DATA / "separators_paradise_lost.npz")
    ids = data["token_ids"]
    reps = math.ceil(n * batch / len(ids))
    ids = np.tile(ids, reps)[: n * batch].reshape(batch, n)
    return torch.as_tensor(ids.astype(np.int64)), torch.as_tensor(data["separator_ids"].astype(np.int64))


def run_prefill(args) -> dict:
    torch = require_cuda()
    from transformers import LlamaConfig, LlamaForCausalLM

    from kvlab.core import attach, use_pattern
    from kvlab.sepllm.pattern import SepLLMPattern
    from kvlab.sepllm.reference import kept_fraction

    cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=args.seq,
                      rope_theta=500000.0)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # build the 8B weights directly in bf16 on the GPU
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(default)
    attach(model)
    ids, sep_ids = _real_text_ids(args.seq)
    ids = ids.cuda()
    ids.clamp_(max=cfg.vocab_size - 1)
    pattern = SepLLMPattern(sep_ids, init=args.init, neighbors=args.neighbors, backend="triton")
    dens = kept_fraction(torch.isin(ids, sep_ids.cuda()), args.init, args.neighbors)

    @torch.no_grad()
    def step():
        return model(input_ids=ids, use_cache=False, logits_to_keep=1).logits

    res = {"sdpa": bench_ms(step, budget_s=3.0, max_reps=5)}
    with use_pattern(model, pattern):
        res["sepllm_triton"] = bench_ms(step, budget_s=3.0, max_reps=5)
    # attention alone per layer, same shapes (to split the end-to-end time)
    n_params = sum(p.numel() for p in model.parameters())
    return {"model": "Llama-3-8B shape, random weights, bf16", "params": n_params, "seq": args.seq,
            "init": args.init, "neighbors": args.neighbors, "density": dens,
            "rows": [{"method": k, "ms": v["ms"], "tokens_per_s": args.seq / v["ms"] * 1e3} for k, v in res.items()],
            "speedup": res["sdpa"]["ms"] / res["sepllm_triton"]["ms"]}


def run_train(args) -> dict:
    torch = require_cuda()
    from transformers import LlamaConfig, LlamaForCausalLM

    from kvlab.core import attach, use_pattern
    from kvlab.sepllm.pattern import SepLLMPattern

    cfg = LlamaConfig(vocab_size=49152, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                      num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=max(args.seqs),
                      tie_word_embeddings=True)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).cuda().train()
    attach(model)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    rows = []
    for n in args.seqs:
        batch = max(1, args.tokens // n)
        ids, sep_ids = _real_text_ids(n, batch)
        ids = ids.cuda()
        pattern = SepLLMPattern(sep_ids, init=args.init, neighbors=args.neighbors, backend="triton")

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        r_dense = bench_ms(step, budget_s=3.0, max_reps=10)
        with use_pattern(model, pattern):
            r_sep = bench_ms(step, budget_s=3.0, max_reps=10)
        rows.append({"seq": n, "batch": batch, "sdpa_ms": r_dense["ms"], "sepllm_triton_ms": r_sep["ms"],
                     "speedup": r_dense["ms"] / r_sep["ms"]})
        print(rows[-1], flush=True)
    return {"model": "Llama-style, random weights, bf16 autocast, AdamW", "params": n_params,
            "config": {k: getattr(cfg, k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                    "num_attention_heads", "vocab_size")},
            "init": args.init, "neighbors": args.neighbors, "rows": rows}


# ---------------------------------------------------------------------------------------------
# tune: tile-size sweep (used to pick kvlab.sepllm.triton.default_config)
# ---------------------------------------------------------------------------------------------
def _tune_fwd_choices(var: str, parts: list[str]) -> list[tuple]:
    """The forward tiles (BLOCK_M, BLOCK_N, BLOCK_F, warps, stages[, warp_spec, extra]) that ``--parts`` fwd
    (round 1) or fwd-near (round 2, tma only) sweep for ``var``."""
    choices = []
    if "fwd" in parts:
        if var == "tma":
            split = {"window_split": True}
            choices = [(128, 64, 128, 8, 3, False, split), (128, 64, 128, 8, 2), (128, 64, 128, 8, 4),
                       (128, 128, 128, 8, 3), (128, 64, 64, 4, 3), (128, 32, 64, 4, 2), (64, 64, 128, 4, 3),
                       (128, 32, 128, 8, 3, False, split), (128, 64, 128, 8, 3, True), (128, 64, 64, 4, 3, True)]
        else:
            choices = [(128, 32, 64, 4, 2), (128, 64, 128, 8, 3)]
    if "fwd-near" in parts and var == "tma":  # round 2: around the round-1 winner (128 x 32 / 64, 4 warps)
        split, ws = {"window_split": True}, True
        choices = [(128, 32, 64, 4, 3), (128, 32, 64, 8, 2), (128, 64, 64, 4, 2), (128, 32, 128, 4, 2),
                   (128, 16, 64, 4, 2), (128, 32, 64, 4, 2, ws, split)]
    return choices


def _with_kind(base, kind, bm, bn, bf, nw, ns, ws=False, extra=None):
    """``base`` with the tiles of kernel ``kind`` replaced, and the row's name."""
    cfg = {key: dict(val) if isinstance(val, dict) else val for key, val in base.items()}
    cfg[kind] = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_F=bf, num_warps=nw, num_stages=ns, warp_spec=ws) | (extra or {})
    more = "".join(f" {key}" for key, val in (extra or {}).items() if val)
    return f"{cfg['variant']} {kind} {bm}x{bn}/{bf} w{nw} s{ns}{' ws' if ws else ''}{more}", cfg


def _rel(x, ref):
    return ((x.float() - ref.float()).norm() / ref.float().norm()).item()


class _Tune:
    """One ``tune`` run: the inputs, the first release's outputs to check against, the rows timed so far."""

    def __init__(self, args):
        self.torch = torch = require_cuda()
        from kvlab.sepllm import triton as st

        self.args, self.st = args, st
        self.n, self.h, self.hk, self.d = args.seq, args.heads, args.kv_heads, args.dim
        self.a, self.w = args.init, args.neighbors
        self.q, self.k, self.v = random_qkv(self.n, self.h, self.hk, self.d)
        self.dtype = self.q.dtype
        self.do = torch.randn_like(self.q)
        self.scale = self.d ** -0.5
        self.causal_flops = 4 * self.d * self.h * self.n * (self.n + 1) / 2
        self.rows = []

    def record(self, name, fn, flop=None, **extra):
        rows = self.rows
        try:
            ms = bench_ms(fn, self.args.budget)["ms"]
            rows.append({"variant": name, "ms": ms, **extra} | ({"TFLOPs": flop / ms / 1e9} if flop else {}))
        except Exception as exc:  # noqa: BLE001 - out of shared memory, unsupported option, etc.
            rows.append({"variant": name, "error": str(exc)[:300]})
        print(rows[-1], flush=True)

    def sdpa(self):
        """PyTorch's causal SDPA, forward and forward + backward."""
        import torch.nn.functional as F

        torch, q, k, v, do, h, hk = self.torch, self.q, self.k, self.v, self.do, self.h, self.hk
        qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
        self.record("sdpa causal fwd",
                    lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=h != hk),
                    self.causal_flops)

        def sdpa_fb():
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True, enable_gqa=h != hk)
            torch.autograd.grad(out, (qg, kg, vg), do)

        self.record("sdpa causal fwd+bwd", sdpa_fb, 3.5 * self.causal_flops)

    def prepare(self):
        """The separators, the kept keys and the reference outputs; times the compaction."""
        st, q, k, v, a = self.st, self.q, self.k, self.v, self.a
        self.is_sep = is_sep = load_separators("random8", self.n)
        self.kept, self.idx, self.cnt = kept, idx, cnt = st.compact_kept_keys(is_sep, a)
        # every timed variant is also checked against the first release's kernels (relative L2 error)
        ref_cfg = st.default_config(self.d, self.dtype, variant="gather")
        self.o_ref, lse_ref = st._forward(q, k, v, kept, idx, cnt, self.w, self.scale, ref_cfg, False)
        self.dq_ref = st._backward(self.do, q, k, v, self.o_ref, lse_ref, kept, idx, cnt, self.w, self.scale, ref_cfg,
                                   False, ("dq",))[0]
        self.record("compact_kept_keys", lambda: st.compact_kept_keys(is_sep, a))
        self.record("compact_kv (gather kept K/V rows)", lambda: st.compact_kv(k, v, idx, cnt))

    def fwd(self, cfg, kept=None, idx=None, cnt=None):
        kept, idx, cnt = (self.kept, self.idx, self.cnt) if kept is None else (kept, idx, cnt)
        return self.st._forward(self.q, self.k, self.v, kept, idx, cnt, self.w, self.scale, cfg, False)

    def bwd(self, cfg, part):
        return self.st._backward(self.do, self.q, self.k, self.v, self.o, self.lse, self.kept, self.idx, self.cnt,
                                 self.w, self.scale, cfg, False, (part,))

    def variant(self, var):
        """Every sweep of ``--parts`` for one Triton variant."""
        parts = self.args.parts
        base = self.defaults(var)
        if var == "tma" and "parts" in parts:
            self.fwd_parts(base)
        self.fwd_tiles(base, _tune_fwd_choices(var, parts))
        if "dq" in parts:
            self.dq_tiles(base, var)
        if "dkdv" in parts:
            self.dkdv_tiles(base)
        if "far" in parts and "far" in base:  # the tma variant's far dK/dV kernel has its own tiles
            self.far_tiles(base)
        if "splits" in parts:
            for per in (128, 256, 1 << 20):
                cfg = dict(base, far_splits_per=per)
                self.record(f"bwd far_splits_per={per}", lambda: self.bwd(cfg, "far"))  # noqa: B023

    def defaults(self, var):
        """The variant's default config: forward, and each part of the backward."""
        base = self.st.default_config(self.d, self.dtype, variant=var)
        work = tile_work(self.is_sep, self.a, self.w, base, self.h, self.hk, self.d)
        self.o, self.lse = self.fwd(base)
        rows = self.rows
        self.record(f"{var} fwd default", lambda: self.fwd(base), work["useful_flop"], TFLOPs_computed=None)
        rows[-1]["TFLOPs_computed"] = work["computed_flop"] / rows[-1]["ms"] / 1e9 if "ms" in rows[-1] else None
        print("   ", {"TFLOPs_computed": rows[-1]["TFLOPs_computed"], "work": work}, flush=True)
        for part in ("dq", "window", "far"):
            self.record(f"{var} bwd part {part} (default)", lambda: self.bwd(base, part))  # noqa: B023
        return base

    def fwd_parts(self, base):
        """Where the forward time goes, and the core loop's dense rate."""
        for parts, label in ((1, "far keys only"), (2, "window only"), (0, "neither (compaction, q, o, lse)")):
            cfg = {key: dict(val) if isinstance(val, dict) else val for key, val in base.items()}
            cfg["fwd"]["parts"] = parts
            self.record(f"tma fwd {label}", lambda: self.fwd(cfg))  # noqa: B023
        all_sep = self.torch.ones_like(self.is_sep)
        kept1, idx1, cnt1 = self.st.compact_kept_keys(all_sep, self.a)
        self.record("tma fwd, every key kept (causal through the far loop)",
                    lambda: self.fwd(base, kept1, idx1, cnt1), self.causal_flops)

    def fwd_tiles(self, base, choices):
        rows = self.rows
        for choice in choices:
            name, cfg = _with_kind(base, "fwd", *choice)
            wk = tile_work(self.is_sep, self.a, self.w, cfg, self.h, self.hk, self.d)
            self.record(name, lambda: self.fwd(cfg), wk["useful_flop"], TFLOPs_computed=None)  # noqa: B023
            if "ms" in rows[-1]:
                rows[-1]["TFLOPs_computed"] = wk["computed_flop"] / rows[-1]["ms"] / 1e9
                rows[-1]["rel_err_vs_ref"] = _rel(self.fwd(cfg)[0], self.o_ref)
                print("   ", {key: rows[-1][key] for key in ("TFLOPs_computed", "rel_err_vs_ref")}, flush=True)

    def dq_tiles(self, base, var):
        rows = self.rows
        choices = ([(64, 64, 64, 4, 3), (128, 64, 64, 8, 3), (64, 32, 128, 4, 3), (128, 64, 128, 8, 2),
                    (64, 32, 64, 4, 3, True)] if var == "tma" else [])
        for choice in choices:
            name, cfg = _with_kind(base, "dq", *choice)
            self.record("bwd " + name, lambda: self.bwd(cfg, "dq"))  # noqa: B023
            if "ms" in rows[-1]:
                rows[-1]["rel_err_vs_ref"] = _rel(self.bwd(cfg, "dq")[0], self.dq_ref)
                print("    rel_err_vs_ref", rows[-1]["rel_err_vs_ref"], flush=True)

    def dkdv_tiles(self, base):
        for choice in [(64, 128, 128, 8, 3), (32, 128, 128, 8, 3), (64, 64, 64, 4, 3), (32, 64, 128, 4, 3),
                       (64, 64, 128, 8, 3)]:
            name, cfg = _with_kind(base, "dkdv", *choice)
            for part in ("window",) + (() if "far" in base else ("far",)):
                self.record(f"bwd {name} [{part}]", lambda: self.bwd(cfg, part))  # noqa: B023

    def far_tiles(self, base):
        for choice in [(64, 64, 128, 8, 3), (128, 64, 128, 8, 3), (64, 64, 64, 4, 3), (32, 64, 128, 4, 4),
                       (64, 64, 128, 8, 2)]:
            name, cfg = _with_kind(base, "far", *choice)
            self.record(f"bwd {name}", lambda: self.bwd(cfg, "far"))  # noqa: B023

    def decode(self):
        """The ragged decode kernel's tiles (16 sequences of 6-8k keys)."""
        from kvlab.kernels.decode.triton import ragged_decode_triton

        torch, dtype = self.torch, self.dtype
        g = torch.Generator(device="cuda").manual_seed(0)
        lens = torch.randint(6144, 8193, (16,), device="cuda", generator=g)
        cu = torch.zeros(17, dtype=torch.int32, device="cuda")
        cu[1:] = torch.cumsum(lens, 0)
        qd = torch.randn(16, 32, 128, device="cuda", dtype=dtype)
        kd = torch.randn(int(cu[-1]), 8, 128, device="cuda", dtype=dtype)
        vd = torch.randn_like(kd)
        for bn, per_sm, nw, ns in [(64, 3, 4, 3), (64, 2, 4, 3), (64, 4, 4, 2), (32, 4, 4, 4), (32, 6, 4, 3),
                                   (128, 1, 8, 3), (64, 3, 4, 4)]:
            cfg = dict(BLOCK_N=bn, chunks=None, programs_per_sm=per_sm, num_warps=nw, num_stages=ns)
            self.record(f"decode {bn} {per_sm}/SM w{nw} s{ns}",
                        lambda: ragged_decode_triton(qd, kd, vd, cu, max_seqlen=8192, config=cfg))  # noqa: B023


def run_tune(args) -> dict:
    t = _Tune(args)
    t.sdpa()
    t.prepare()
    for var in args.variants:
        t.variant(var)
    if "decode" in args.parts:
        t.decode()
    return {"seq": t.n, "heads": t.h, "kv_heads": t.hk, "dim": t.d, "rows": t.rows}


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="kvlab bench sepllm", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["ops", "prefill", "train", "tune"])
    ap.add_argument("--out", default="build/bench",
                    help="folder for JSON/PNG/table (default build/bench; the committed "
                         "benchmarks/results only when named)")
    ap.add_argument("--tag", default="", help="suffix for output names (e.g. the device)")
    ap.add_argument("--seqs", type=ints, default=None, help="comma-separated sequence lengths")
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--seps", default="random8,paradise_lost", help="separator sources: randomP or a data name")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--init", type=int, default=4)
    ap.add_argument("--neighbors", type=int, default=256)
    ap.add_argument("--budget", type=float, default=None, help="seconds of repeats per measurement "
                    "(default 1.0; tune: 0.4)")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--flex-max-n", type=int, default=65536)
    ap.add_argument("--tokens", type=int, default=16384, help="tokens per training step")
    ap.add_argument("--variants", default="tma,gather",
                    help="Triton variants to time (ops, tune), the first is compared with the others; ops "
                         "takes options of the tma forward (variant_config): tma+split, +ws, +diag, +w64 (window "
                         "tiles of 64), +s3 (window loop in 3 stages), +rerun (the same config timed again)")
    ap.add_argument("--parts", default="fwd,dq,dkdv,splits,decode", help="what tune sweeps")
    return ap


def _main_ops(args, info, out, tag):
    args.kv_heads = args.kv_heads or args.heads
    args.seqs = args.seqs or [4096, 16384, 32768, 65536]
    rec = run_ops(args) | {"info": info}
    table = print_ops(rec)
    out.mkdir(parents=True, exist_ok=True)
    plot_ops(rec, out / f"ops{tag}.png")
    return rec, table


def _main_prefill(args, info, out, tag):
    args.seq = args.seq or 32768
    rec = run_prefill(args) | {"info": info}
    table = fmt_table(rec["rows"], [("method", "method", ""), ("ms", "ms", "{:.1f}"),
                                     ("tokens_per_s", "tokens/s", "{:.0f}")])
    table += f"\nspeedup {rec['speedup']:.2f}x, kept density {rec['density']:.3f}"
    return rec, table


def _main_train(args, info, out, tag):
    args.seqs = args.seqs or [4096, 8192]
    rec = run_train(args) | {"info": info}
    table = (f"{rec['params'] / 1e6:.0f}M parameters\n" +
             fmt_table(rec["rows"], [("seq", "seq", ""), ("batch", "batch", ""), ("sdpa_ms", "SDPA ms", "{:.1f}"),
                                      ("sepllm_triton_ms", "SepLLM Triton ms", "{:.1f}"),
                                      ("speedup", "speedup", "{:.2f}")]))
    return rec, table


def _main_tune(args, info, out, tag):
    args.kv_heads = args.kv_heads or args.heads
    args.seq = args.seq or 32768
    args.budget = args.budget or 0.4
    rec = run_tune(args) | {"info": info}
    table = "\n".join(f"{r['variant']}: {r.get('ms', r.get('error'))}" for r in rec["rows"])
    return rec, table


_MAIN = {"ops": _main_ops, "prefill": _main_prefill, "train": _main_train, "tune": _main_tune}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.seps = [s for s in args.seps.split(",") if s]
    args.variants = [s for s in args.variants.split(",") if s]
    args.parts = [s for s in args.parts.split(",") if s]
    args.budget = args.budget if args.budget is not None or args.what == "tune" else 1.0
    out = Path(args.out)
    tag = f"_{args.tag}" if args.tag else ""
    info = device_info()
    print(json.dumps(info), flush=True)
    rec, table = _MAIN[args.what](args, info, out, tag)
    write_outputs(out, args.what + tag, rec, table, info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
