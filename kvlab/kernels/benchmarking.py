"""What every ``kvlab bench`` command shares: a CUDA check, device facts, CUDA-event timing, machine
ceilings (copy/read bandwidth, bf16 matmul rate), and the JSON + Markdown record of a run.

Timing: CUDA events around each call, after a warm-up call (compilation), median of repeats sized to a
time budget. Benchmarks print ratios measured side by side in one run, with the device named.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

__all__ = ["synchronize", "require_cuda", "device_info", "bench_ms", "spin", "machine_ceilings", "save_record", "fmt_table",
           "ints", "write_outputs", "allow_many_compiles", "random_qkv", "perf_report_against_sdpa"]


def synchronize(where) -> None:
    """Wait for the GPU work queued on ``where`` (a device, a tensor or a model) before reading a clock; no-op on CPU."""
    import torch

    if isinstance(where, torch.nn.Module):
        where = next(where.parameters()).device
    elif isinstance(where, torch.Tensor):
        where = where.device
    if torch.device(where).type == "cuda":
        torch.cuda.synchronize(where)


def require_cuda():
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("kvlab bench needs a CUDA GPU (the kernels' CPU path is the Triton interpreter, "
                         "far too slow to time)")
    return torch


def device_info() -> dict:
    torch = require_cuda()
    import triton

    props = torch.cuda.get_device_properties(0)
    info = {"device": props.name, "sm_count": props.multi_processor_count,
            "capability": f"{props.major}.{props.minor}", "memory_gib": round(props.total_memory / 2**30, 1),
            "torch": torch.__version__, "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def bench_ms(fn, budget_s: float = 1.0, min_reps: int = 3, max_reps: int = 100) -> dict:
    """Median milliseconds of ``fn()`` with CUDA events, after one warm-up call."""
    torch = require_cuda()
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    once = time.perf_counter() - t0
    reps = int(min(max_reps, max(min_reps, budget_s / max(once, 1e-6))))
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return {"ms": statistics.median(times), "min_ms": min(times), "reps": reps}


def spin(seconds: float) -> None:
    """Keep the GPU busy for a while so that its clocks are up before short, memory-bound timings."""
    torch = require_cuda()
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def machine_ceilings() -> dict:
    """Measured copy bandwidth (bytes read + written), read bandwidth and bf16 matmul rate."""
    torch = require_cuda()
    x = torch.randn(512 * 2**20, device="cuda", dtype=torch.bfloat16)  # 1 GiB
    y = torch.empty_like(x)
    copy = bench_ms(lambda: y.copy_(x), budget_s=0.5)["ms"]
    read = bench_ms(lambda: x.view(-1, 4096).amax(dim=1), budget_s=0.5)["ms"]
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm = bench_ms(lambda: a @ b, budget_s=0.5)["ms"]
    nbytes = x.numel() * 2
    del x, y, a, b
    torch.cuda.empty_cache()
    return {"copy_GBps": 2 * nbytes / copy / 1e6, "read_GBps": nbytes / read / 1e6,
            "bf16_mm_TFLOPs": 2 * 8192**3 / mm / 1e9}


def save_record(out_dir: Path, name: str, record: dict) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(record, indent=1))
    return path


def fmt_table(rows: list[dict], cols: list[tuple[str, str, str]]) -> str:
    head = "| " + " | ".join(c[1] for c in cols) + " |"
    sep = "|" + "|".join("---" for _ in cols) + "|"
    lines = [head, sep]
    for r in rows:
        cells = []
        for key, _, fmt in cols:
            val = r.get(key)
            cells.append("" if val is None else (fmt.format(val) if fmt else str(val)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ints(s: str) -> list[int]:
    """``"1,2,3"`` -> ``[1, 2, 3]`` (argparse type of comma-separated sizes)."""
    try:
        return [int(x) for x in s.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None


def write_outputs(out: Path, name: str, rec: dict, table: str, info: dict) -> Path:
    """Save ``rec`` (with its table) as ``name.json`` and the table as ``name.md``; print it."""
    rec["table"] = table
    path = save_record(out, name, rec)
    (out / f"{name}.md").write_text(f"{info['device']} ({info['date']})\n\n{table}\n")
    print(f"\n## {name} ({info['device']})\n{table}\n-> {path}", flush=True)
    return path


def allow_many_compiles(limit: int = 64) -> None:
    """One compiled FlexAttention graph per shape and mask: the default recompile limit (8) is too low for a
    sweep over sequence lengths."""
    torch = require_cuda()
    try:
        torch._dynamo.config.cache_size_limit = limit
        torch._dynamo.config.recompile_limit = limit
    except AttributeError:
        pass


def random_qkv(n: int, heads: int, kv_heads: int, dim: int, dtype=None, seed: int | None = None):
    """``q (1, heads, n, dim)``, ``k, v (1, kv_heads, n, dim)`` on the GPU (bf16 by default), seeded by ``n``."""
    torch = require_cuda()
    dtype = dtype or torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(n if seed is None else seed)
    q = torch.randn(1, heads, n, dim, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(1, kv_heads, n, dim, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(1, kv_heads, n, dim, device="cuda", dtype=dtype, generator=gen)
    return q, k, v


def perf_report_against_sdpa(plot_name: str, line_name: str, make_fn):
    """A ``triton.testing.perf_report`` of a kernel against dense causal SDPA at N = 4k..32k (32 heads, dim 128,
    bf16): ``make_fn(q, k, v) -> callable`` builds the kernel call. Run it with ``.run(print_data=True)``."""
    torch = require_cuda()
    import torch.nn.functional as F
    import triton

    @triton.testing.perf_report(triton.testing.Benchmark(
        x_names=["N"], x_vals=[4096, 8192, 16384, 32768], line_arg="provider", line_vals=["sdpa", "triton"],
        line_names=["dense SDPA (causal)", line_name], ylabel="ms", plot_name=plot_name, args={"H": 32, "D": 128}))
    def bench(N, H, D, provider):
        q, k, v = random_qkv(N, H, H, D)
        fn = (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)) if provider == "sdpa" \
            else make_fn(q, k, v)
        return triton.testing.do_bench(fn, return_mode="median")

    return bench
