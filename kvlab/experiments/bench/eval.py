"""``python -m kvlab bench eval decode``: tokens/s of a streaming evaluation, four ways, in one process.

A SmolLM2-135M-shaped Llama with random weights (no model files needed; the speed does not depend on the
weights), random token ids, one token per step:

* ``plain`` — transformers alone: a ``DynamicCache`` and ``model(token, past_key_values=cache)`` in a loop
  (an un-attached copy of the model, SDPA);
* ``generate`` — transformers' ``generate(cache_implementation="static")``, as transformers ships it
  (GPU only; greedy, ``min_new_tokens`` so it never stops early);
* ``hooks`` — ``kvlab.eval.streaming_perplexity(engine="hooks")``: the model's forward through a KVCache;
* ``static`` — ``engine="static"``: :class:`kvlab.eval.FastDecoder` (CUDA graph on a GPU), timed after the
  capture (``static e2e`` is the whole ``streaming_perplexity`` call, capture included);
* ``compiled`` (``--compile``) — ``engine="compiled"``: the same with the layers compiled by ``torch.compile``
  before the capture, timed after compiling and capture;

for Full, StreamingLLM, SepLLMStreaming and LaCache, batch 1, each dtype; then ``--streams`` streams in
one batch (aggregate tokens/s), and the share of a step spent in the policy's keep + compaction
(``cache.end_step``, timed alone the same way the step is: a graph replay on CUDA, eager on CPU).
Ratios are against ``plain`` (CPU target: static within 1.1x of its time) and ``generate``.
``--repeats R`` times plain and static back to back R times per policy (the ratio is the median of the
pairs; tokens/s the best run) and keeps the best of R hooks runs: a shared CPU is noisy. ``plain`` and
``hooks`` run ``--plain-tokens`` / ``--hooks-tokens`` tokens (they are the slow ones on a GPU).

``python -m kvlab bench eval streams``: the static engine at 1 / 64 / 256 streams (issue 28) with each cache
layout (``--kernels compact,triton``: the engine before and after the indexed layout) beside transformers'
static ``generate`` at the same batch, on SmolLM2-135M-Instruct (``--model``) with StreamingLLM(4, 324) by
default; every row's cache is filled first (``budget + 1`` steps), then ``--steps`` steps are timed; the step
at ``--profile-batches`` is profiled (top GPU kernels) and ``begin_step`` / ``end_step`` timed alone. Each engine
row carries the work model of its step (:mod:`kvlab.kernels.roofline`: the bytes it must move and the FLOPs it must
do, from the model's config and the policy's budget) and what the measured step reaches of the device's nominal
peaks and of a copy bandwidth measured at the start of the run (printed, in the JSON as ``work``, a table in the .md).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
from kvlab.kernels.benchmarking import synchronize

__all__ = ["SMOLLM2_SHAPE", "main", "main_streams", "random_smollm2"]

#: SmolLM2-135M's architecture (its config.json).
SMOLLM2_SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                     num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
                     rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)


def random_smollm2(device, dtype, *, attached: bool = True):
    """A SmolLM2-135M-shaped Llama with random weights (seed 0; speed only, no model file), attached to kvlab
    unless ``attached=False``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from kvlab.core import attach

    config = LlamaConfig(**SMOLLM2_SHAPE)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
    return attach(model) if attached else model


def _models(device, dtype):
    """``(attached, plain)``: the same random weights, once attached to kvlab and once untouched."""
    plain = random_smollm2(device, dtype, attached=False)
    return random_smollm2(device, dtype), plain


def _policies(tokens: int):
    import kvlab  # the paper policies, reached through the root package as the other eval CLIs do

    seps = list(range(0, SMOLLM2_SHAPE["vocab_size"], 16))  # ~6% of random tokens are "separators"
    b = max(tokens // 4, 64)  # the budget: a quarter of the stream (StreamingLLM(4, 124) at 512 tokens)
    methods = (kvlab.policies.StreamingLLM, kvlab.policies.SepLLMStreaming, kvlab.policies.LaCache)
    return [kvlab.policies.Full()] + [m.for_budget(b, tokenizer=seps) for m in methods]


def _timed(fn, device) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


@torch.no_grad()
def _plain_loop(plain, ids) -> None:
    from transformers import DynamicCache

    cache = DynamicCache(config=plain.config)
    nll = torch.empty(ids.shape[1] - 1, device=ids.device)
    for t in range(ids.shape[1] - 1):
        logits = plain(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits[:, -1]
        nll[t] = torch.nn.functional.cross_entropy(logits.float(), ids[:, t + 1])


@torch.no_grad()
def _generate(plain, ids) -> None:
    n = ids.shape[1] - 1
    plain.generate(ids[:, :1], max_new_tokens=n, min_new_tokens=n, do_sample=False, cache_implementation="static",
                   pad_token_id=0)


@torch.no_grad()
def _static_steady(model, policy, ids, device, compile: bool = False) -> tuple[float, float]:
    """Seconds of ``T - 1`` steps of a FastDecoder after its capture, and seconds of one ``end_step`` (the
    policy's keep + compaction) timed the same way."""
    from kvlab.eval import FastDecoder

    decoder = FastDecoder(model, policy, ids.shape[0], max_steps=ids.shape[1], compile=compile)
    decoder.step(ids[:, :1])  # compile and capture (CUDA) / first step
    decoder.reset()

    def run():
        for t in range(ids.shape[1] - 1):
            logits = decoder.step(ids[:, t:t + 1])
            torch.nn.functional.cross_entropy(logits.float(), ids[:, t + 1])

    seconds = _timed(run, device)
    reps = 50
    cache = decoder.cache
    if device.type == "cuda":
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            cache.end_step()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            cache.end_step()
        keep = _timed(lambda: [graph.replay() for _ in range(reps)], device)
    else:
        keep = _timed(lambda: [cache.end_step() for _ in range(reps)], device)
    return seconds, keep / reps


def _run_dtypes(args, cuda: bool) -> list:
    """``--dtypes``: ``auto`` is float32 and bfloat16 on a GPU, float32 on the CPU."""
    if args.dtypes == "auto":
        return [torch.float32, torch.bfloat16] if cuda else [torch.float32]
    return [getattr(torch, d) for d in args.dtypes.split(",")]


def _policy_row(args, model, plain, policy, ids, plain_ids, hook_ids, name: str, device) -> dict:
    """One policy's row of tokens/s: plain loop, hooks, the static engine (and compiled), paired ratios."""
    from kvlab.eval import streaming_perplexity

    # plain and static timed back to back, `repeats` times: a shared machine's load changes slowly
    pairs = []
    for _ in range(args.repeats):
        plain_s = _timed(lambda: _plain_loop(plain, plain_ids), device) / (plain_ids.shape[1] - 1)
        steady, keep_s = _static_steady(model, policy, ids, device)
        pairs.append((plain_s, steady / (args.tokens - 1), keep_s))
    plain_s, static_s, keep_s = (min(p[i] for p in pairs) for i in range(3))
    ratio = sorted(p[1] / p[0] for p in pairs)[len(pairs) // 2]  # median of the paired ratios
    hooks_s = min(streaming_perplexity(model, None, hook_ids, policy, None, progress=False,
                                       engine="hooks").seconds for _ in range(args.repeats))
    e2e = streaming_perplexity(model, None, ids, policy, None, progress=False, engine="static")
    hooks_tps = (hook_ids.shape[1] - 1) / hooks_s
    row = dict(dtype=name, policy=type(policy).__name__, plain=1 / plain_s, hooks=hooks_tps,
               static=1 / static_s, static_e2e=(args.tokens - 1) / e2e.seconds,
               x_hooks=1 / static_s / hooks_tps, time_vs_plain=ratio, policy_share=keep_s / static_s)
    if args.compile:
        compiled_s = _static_steady(model, policy, ids, device, compile=True)[0] / (args.tokens - 1)
        row.update(compiled=1 / compiled_s, x_hooks_compiled=1 / compiled_s / hooks_tps,
                   compiled_share=keep_s / compiled_s)
    return row


def _add_generate(plain, ids, rows: list[dict], name: str, tokens: int, device) -> None:
    """Time transformers' generate and add it (and the ratios to it) to ``rows``."""
    _generate(plain, ids)  # warm-up (and whatever compilation transformers does)
    gen_tps = (tokens - 1) / _timed(lambda: _generate(plain, ids), device)
    print(json.dumps(dict(dtype=name, generate=gen_tps)), flush=True)
    for row in rows:
        row.update(generate=gen_tps, x_generate=row["static"] / gen_tps)
        if "compiled" in row:
            row["x_generate_compiled"] = row["compiled"] / gen_tps


def _many_streams(args, device, dtype, gen) -> list[dict]:
    """Aggregate tokens/s of ``--streams`` streams at once, per policy."""
    streams = []
    model, _ = _models(device, dtype)
    many = torch.randint(0, SMOLLM2_SHAPE["vocab_size"], (args.streams, args.tokens), generator=gen).to(device)
    for policy in _policies(args.tokens):
        steady, _ = _static_steady(model, policy, many, device)
        streams.append(dict(dtype=str(dtype).replace("torch.", ""), policy=type(policy).__name__,
                            streams=args.streams, tokens_per_s=args.streams * (args.tokens - 1) / steady))
        if args.compile:
            steady, _ = _static_steady(model, policy, many, device, compile=True)
            streams[-1]["compiled_tokens_per_s"] = args.streams * (args.tokens - 1) / steady
        print(json.dumps(streams[-1]), flush=True)
    return streams


def run(args) -> dict:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    dtypes = _run_dtypes(args, cuda)
    rows = []
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, SMOLLM2_SHAPE["vocab_size"], (1, args.tokens), generator=gen).to(device)
    hook_ids = ids[:, :args.hooks_tokens]
    for dtype in dtypes:
        model, plain = _models(device, dtype)
        name = str(dtype).replace("torch.", "")
        _plain_loop(plain, ids[:, :8])  # warm-up
        plain_ids = ids[:, :args.plain_tokens]
        first = len(rows)
        for policy in _policies(args.tokens):
            rows.append(_policy_row(args, model, plain, policy, ids, plain_ids, hook_ids, name, device))
            print(json.dumps(rows[-1]), flush=True)
        if cuda and not args.no_generate:  # last: its compilation may take long (rows above are printed)
            _add_generate(plain, ids, rows[first:], name, args.tokens, device)
        del model, plain
    streams = _many_streams(args, device, dtypes[-1], gen) if args.streams else []
    return dict(rows=rows, streams=streams, tokens=args.tokens, hooks_tokens=hook_ids.shape[1],
                plain_tokens=args.plain_tokens, repeats=args.repeats)


def fmt_table(rows: list[dict], cols: list[tuple[str, str, str]]) -> str:
    """A markdown table (kvlab.kernels.benchmarking has one, but kvlab.eval may not import kvlab.kernels)."""
    lines = ["| " + " | ".join(c[1] for c in cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in rows:
        lines.append("| " + " | ".join("" if row.get(k) is None else (f.format(row[k]) if f else str(row[k]))
                                       for k, _, f in cols) + " |")
    return "\n".join(lines)


def _table(rec: dict) -> str:
    cols = [("dtype", "dtype", ""), ("policy", "policy", ""), ("plain", "plain tok/s", "{:.1f}"),
            ("generate", "generate(static) tok/s", "{:.1f}"), ("hooks", "hooks tok/s", "{:.1f}"),
            ("static", "static tok/s", "{:.1f}"), ("static_e2e", "static e2e tok/s", "{:.1f}"),
            ("x_hooks", "static / hooks", "{:.2f}x"), ("x_generate", "static / generate", "{:.2f}x"),
            ("time_vs_plain", "static time / plain (paired)", "{:.3f}x"), ("policy_share", "keep+compact share", "{:.1%}")]
    if any("compiled" in row for row in rec["rows"]):
        cols[7:7] = [("compiled", "compiled tok/s", "{:.1f}"), ("x_hooks_compiled", "compiled / hooks", "{:.2f}x"),
                     ("x_generate_compiled", "compiled / generate", "{:.2f}x")]
        cols.append(("compiled_share", "keep+compact share (compiled)", "{:.1%}"))
    text = fmt_table(rec["rows"], cols)
    if rec["streams"]:
        text += "\n\n" + fmt_table(rec["streams"], [("dtype", "dtype", ""), ("policy", "policy", ""),
                                                    ("streams", "streams", ""),
                                                    ("tokens_per_s", "aggregate tok/s", "{:.0f}"),
                                                    ("compiled_tokens_per_s", "compiled aggregate tok/s", "{:.0f}")])
    return text


# ----------------------------------------------------------------------------------------------------------
# ``streams``: the static engine at many streams (issue 28), its layouts beside transformers' static generate

def _plain_copy(model):
    """The same weights in an un-attached model running SDPA (for transformers' own ``generate``)."""
    import copy

    config = copy.deepcopy(model.config)
    config._attn_implementation = "sdpa"
    plain = type(model)(config).to(device=model.device, dtype=next(model.parameters()).dtype).eval()
    plain.load_state_dict(model.state_dict())
    return plain


def _stream_ids(tok, vocab: int, rows: int, tokens: int, gen) -> torch.Tensor:
    """``(rows, tokens)`` token ids: consecutive pieces of a real text when there is a tokenizer (wikitext,
    repeated as needed), random ids otherwise."""
    if tok is None:
        return torch.randint(0, vocab, (rows, tokens), generator=gen)
    import kvlab

    text = kvlab.datasets.load_text("wikitext")
    ids = torch.tensor(tok(text[: 4_000_000], add_special_tokens=False)["input_ids"], dtype=torch.long)
    need = rows * tokens
    ids = ids.repeat(need // ids.numel() + 1)[:need]
    return ids.view(rows, tokens)


def _stream_policy(name: str, tok, cache: int):
    import kvlab

    methods = {"streamingllm": kvlab.policies.StreamingLLM, "sepllm": kvlab.policies.SepLLMStreaming}
    if name not in methods:
        raise ValueError(f"--policies takes streamingllm and sepllm, got {name!r}")
    seps = tok if tok is not None else list(range(0, SMOLLM2_SHAPE["vocab_size"], 16))
    return methods[name].for_budget(cache, tokenizer=seps)


def _kernel_table(prof, steps: int, top: int = 15) -> tuple[list[dict], float]:
    """The profiler's CUDA kernels by GPU time: ``(rows, total ms per step)``."""
    events = [e for e in prof.key_averages() if getattr(e, "device_type", None) is not None
              and str(e.device_type).endswith("CUDA")]
    timed = [(e.key, getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0),
              e.count) for e in events]
    timed = [t for t in timed if t[1] > 0]
    total = sum(t[1] for t in timed) / 1e3 / steps
    timed.sort(key=lambda t: -t[1])
    rows = [dict(kernel=name[:90], ms_per_step=us / 1e3 / steps, share=us / 1e3 / steps / total if total else 0.0,
                 calls_per_step=count / steps) for name, us, count in timed[:top]]
    return rows, total


def _graph_profile():
    from torch.profiler import ProfilerActivity, profile as torch_profile

    return torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])


_PHASES = ("begin_step", "update", "attend", "end_step")


def _phase_table(decoder, ids, device) -> tuple[list[dict], float]:
    """GPU time per step of each part of the cache's work (``begin_step``: the new entry's metadata and, for
    "compact", every slot's re-rotation; ``update``: the new key/value written, 30x; ``attend``: attention, 30x;
    ``end_step``: the policy's keep + compaction) and of the model around them, from eager steps."""
    from torch.profiler import record_function

    cache, steps = decoder.cache, ids.shape[1]
    saved = {name: getattr(cache, name) for name in _PHASES}

    def labelled(name, fn):
        def call(*args, **kwargs):
            with record_function(f"phase:{name}"):
                return fn(*args, **kwargs)
        return call

    for name in _PHASES:
        setattr(cache, name, labelled(name, saved[name]))
    try:
        with _graph_profile() as prof:
            for t in range(steps):
                with record_function("phase:step"):
                    decoder.ids.copy_(ids[:, t:t + 1])
                    decoder._forward()
            synchronize(device)
    finally:
        for name in _PHASES:
            delattr(cache, name)  # back to the class's methods
    times = {}
    for e in prof.key_averages():
        if e.key.startswith("phase:") and str(getattr(e, "device_type", "CPU")).endswith("CPU"):  # not the GPU span
            times[e.key[6:]] = (getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)) / 1e3 / steps
    total = times.pop("step", 0.0)
    rows = [dict(phase=name, ms_per_step=times.get(name, 0.0)) for name in _PHASES]
    rows.append(dict(phase="model (the rest)", ms_per_step=total - sum(r["ms_per_step"] for r in rows)))
    for row in rows:
        row["share"] = row["ms_per_step"] / total if total else 0.0
    return rows, total


@torch.no_grad()
def _engine_run(model, policy, ids, kernel: str, fill: int, steps: int, device, profile: bool) -> dict:
    """Fill every row's cache (``fill`` steps), then time ``steps`` graph-replayed steps (with the eval loop's
    cross entropy); optionally profile 3 more steps and time ``begin_step`` / ``end_step`` alone."""
    from kvlab.eval import FastDecoder

    batch = ids.shape[0]
    tuned = None
    if kernel in ("auto", "triton") and device.type == "cuda":
        from kvlab.core import static_triton as tuned  # the kernel's one-off timing of its choices, for the record

        logged = len(tuned.TUNE_LOG)
    start = time.perf_counter()
    decoder = FastDecoder(model, policy, batch, kernel=kernel)
    decoder.step(ids[:, :1])  # capture
    synchronize(device)
    capture_s = time.perf_counter() - start
    fill_s = _timed(lambda: [decoder.step(ids[:, t:t + 1]) for t in range(1, fill)], device)

    def run():
        for t in range(fill, fill + steps):
            logits = decoder.step(ids[:, t:t + 1])
            torch.nn.functional.cross_entropy(logits.float(), ids[:, t + 1])

    seconds = _timed(run, device)
    held = decoder.cache.length.float().mean().item()
    out = dict(kernel=decoder.cache.kernel, batch=batch, step_ms=seconds / steps * 1e3,
               tokens_per_s=batch * steps / seconds, capture_s=capture_s, fill_steps=fill,
               fill_tokens_per_s=batch * (fill - 1) / fill_s, mean_held=held)
    if tuned is not None:
        out["kernel_timings"] = tuned.TUNE_LOG[logged:]
        best = min(out["kernel_timings"], key=lambda r: r["ms"], default=None)
        if best is not None:
            out["kernel_config"] = best["config"]
            out["kernel_ms"] = best["ms"]
    if profile and device.type == "cuda":
        t0 = fill + steps
        with _graph_profile() as prof:  # the graph replays as they run
            for t in range(t0, t0 + 3):
                decoder.step(ids[:, t:t + 1])
            synchronize(device)
        out["profile"], out["profile_ms_per_step"] = _kernel_table(prof, 3)
        # the same step run eagerly (decoder._forward, same buffers), each part of the cache's work labelled:
        # GPU time per part, the rest is the model's own layers
        out["phases"], out["phases_ms_per_step"] = _phase_table(decoder, ids[:, t0 + 3:t0 + 6], device)
        # begin_step (re-rotation of every slot, "compact") and end_step (keep + compaction) alone, graph-replayed
        cache = decoder.cache
        for part, fn in (("begin_step", lambda: cache.begin_step(decoder.ids)), ("end_step", cache.end_step)):
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            out[f"{part}_ms"] = _timed(lambda: [graph.replay() for _ in range(10)], device) / 10 * 1e3
    del decoder
    return out


@torch.no_grad()
def _generate_run(plain, ids, new: int, device, compile: bool) -> dict:
    """transformers' ``generate(cache_implementation="static")``, greedy, ``new`` tokens from a 1-token prompt (its
    static cache then holds ``new + 1`` slots, like the engine's ``budget + 1`` plus the timed steps): a warm-up call
    (its compilation, when transformers compiles), then the timed call."""
    kwargs = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, cache_implementation="static",
                  pad_token_id=0)
    if not compile:
        kwargs["disable_compile"] = True
    prompt = ids[:, :1]
    # compiled: the warm-up must have the timed call's shapes (its static cache length); eager: 8 tokens warm it
    warm_kwargs = kwargs if compile else dict(kwargs, max_new_tokens=8, min_new_tokens=8)
    warm = _timed(lambda: plain.generate(prompt, **warm_kwargs), device)
    seconds = _timed(lambda: plain.generate(prompt, **kwargs), device)
    return dict(kernel="generate" if compile else "generate-nocompile", batch=ids.shape[0],
                step_ms=seconds / new * 1e3, tokens_per_s=ids.shape[0] * new / seconds, warmup_s=warm,
                fill_steps=new)


def _tune_kernel(batch: int, kv_heads: int, heads: int, dim: int, capacity: int, dtypes, device) -> list[dict]:
    """The static Triton kernel alone at the engine's shape (every row full, keys rotated as under
    positions='cache'), a few tile / warp / pipelining choices: GPU time and the bandwidth its live K/V bytes
    (+ the cos/sin rows it gathers, from L2) imply."""
    import triton

    from kvlab.core.static_triton import default_config, static_decode_reference, static_decode_triton

    rows = []
    for dtype in dtypes:
        gen = torch.Generator(device=device).manual_seed(0)
        q = torch.randn(batch, heads, dim, device=device, dtype=dtype, generator=gen)
        k, v = (torch.randn(batch, kv_heads, capacity, dim, device=device, dtype=dtype, generator=gen)
                for _ in range(2))
        phys = torch.argsort(torch.rand(batch, capacity, device=device, generator=gen), dim=1)
        length = torch.full((batch,), capacity - 1, device=device)
        rot = torch.randint(0, capacity, (batch, capacity), device=device, generator=gen)
        rope = torch.full((batch,), capacity, device=device)
        table = torch.randn(4 * capacity + 1, dim, device=device, dtype=dtype, generator=gen)
        live_bytes = 2 * batch * kv_heads * capacity * dim * k.element_size()
        truth = {}  # rotate -> the float64 oracle's output on these inputs (each config's error is read against it)
        for rotate in (True, False):
            wide = table.double()
            oracle = dict(rot=rot, rope=rope, cos=wide, sin=wide, base=2 * capacity) if rotate else {}
            truth[rotate] = static_decode_reference(q.double(), k.double(), v.double(), phys, length + 1, dim ** -0.5,
                                                    **oracle)
        tiles = [(16, 2, 2, "broadcast"), (32, 4, 2, "broadcast"), (32, 4, 3, "broadcast"), (64, 4, 2, "broadcast"),
                 (64, 8, 2, "broadcast"), (32, 2, 2, "broadcast"), (16, 4, 2, "broadcast"), (128, 8, 2, "broadcast"),
                 (32, 4, 2, "dot ieee")]
        if dtype == torch.float32:  # tensor-core products in three TF32 passes (close to fp32, not bit-equal)
            tiles += [(16, 4, 2, "dot tf32x3"), (32, 4, 2, "dot tf32x3"), (64, 4, 2, "dot tf32x3")]
        for block, warps, stages, products in tiles:
            cfg = dict(default_config(), BLOCK_N=block, num_warps=warps, num_stages=stages,
                       USE_DOT=products != "broadcast", DOT_PRECISION=products.split()[-1])
            for rotate in (True, False):
                extra = dict(rot=rot, rope=rope, cos=table, sin=table, base=2 * capacity) if rotate else {}
                fn = lambda: static_decode_triton(q, k, v, phys, length, dim ** -0.5, config=cfg, **extra)  # noqa
                try:
                    ms = triton.testing.do_bench(fn, warmup=5, rep=20, return_mode="median")
                except Exception as err:  # a tile that does not fit is a row, not the end
                    rows.append(dict(dtype=str(dtype)[6:], BLOCK_N=block, num_warps=warps, num_stages=stages,
                                     rotate=rotate, products=products, error=f"{type(err).__name__}: {err}"[:200]))
                    continue
                want = truth[rotate]
                rel_err = ((fn().double() - want).abs().max() / want.abs().max()).item()
                rows.append(dict(dtype=str(dtype)[6:], BLOCK_N=block, num_warps=warps, num_stages=stages,
                                 rotate=rotate, ms=ms, kv_gb_s=live_bytes / ms / 1e6, batch=batch, part="kernel",
                                 products=products, rel_err=rel_err))
                print(json.dumps(rows[-1]), flush=True)
        # what bounds the default tiles: the same loads with no arithmetic (LOADS_ONLY), and the same arithmetic with
        # every entry read from one slot (phys and rot all 0: the keys and values stay in cache)
        hot = dict(phys=torch.zeros_like(phys), rot=torch.zeros_like(rot))
        for rotate in (True, False):
            for part, cfg, inputs in (("loads only", dict(default_config(), LOADS_ONLY=True), {}),
                                      ("arithmetic (hot keys)", default_config(), hot)):
                p_, r_ = inputs.get("phys", phys), inputs.get("rot", rot)
                extra = dict(rot=r_, rope=rope, cos=table, sin=table, base=2 * capacity) if rotate else {}
                fn = lambda: static_decode_triton(q, k, v, p_, length, dim ** -0.5, config=cfg, **extra)  # noqa
                ms = triton.testing.do_bench(fn, warmup=5, rep=20, return_mode="median")
                rows.append(dict(dtype=str(dtype)[6:], BLOCK_N=cfg["BLOCK_N"], num_warps=cfg["num_warps"],
                                 num_stages=cfg["num_stages"], rotate=rotate, ms=ms, kv_gb_s=live_bytes / ms / 1e6,
                                 batch=batch, part=part, products="broadcast"))
                print(json.dumps(rows[-1]), flush=True)
    return rows


def _streams_tune(args, device) -> list[dict]:
    """``--tune`` on a GPU: the Triton kernel's tile sweep (else none)."""
    if not (args.tune and device.type == "cuda"):
        return []
    shape = SMOLLM2_SHAPE
    return _tune_kernel(max(int(b) for b in args.batches.split(",")), shape["num_key_value_heads"],
                        shape["num_attention_heads"], shape["head_dim"], args.cache + 1,
                        [getattr(torch, d) for d in args.dtypes.split(",")], device)


def _streams_model(args, dtype, device):
    import kvlab

    if args.model == "random":
        return random_smollm2(device, dtype), None
    return kvlab.load_model(args.model, dtype=dtype, device=device)


def _stream_row(args, model, plain, policy, policy_name: str, ids, kernel: str, fill: int, batch: int, device):
    """One engine's (or generate's) row at ``batch`` streams; None where generate is not timed (it knows no
    policy: once per dtype and batch); an error is a row."""
    try:
        if kernel.startswith("generate"):
            if plain is None or policy_name != args.policies.split(",")[0]:
                return None  # generate knows no policy: once per dtype and batch
            return _generate_run(plain, ids, fill + args.steps, device, compile=kernel == "generate")
        return _engine_run(model, policy, ids, kernel, fill, args.steps, device,
                           profile=batch in args.profile_batches)
    except Exception as err:  # a failure is a row of the table, not the end of the run
        return dict(error=f"{type(err).__name__}: {err}"[:400])


def streams(args, save=None) -> dict:
    """Tokens/s of the static engine's layouts and of transformers' static generate at several batch sizes;
    ``save(record)`` is called after every row (a run stopped by a time limit keeps what it measured)."""
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    deadline = time.perf_counter() + args.budget_s
    gen = torch.Generator().manual_seed(0)
    rows, skipped = [], []
    tune = _streams_tune(args, device)
    meta = dict(steps=args.steps, cache=args.cache, model=args.model, tune=tune, device_name=_device_name(device),
                copy_GBps=_copy_GBps(device) if args.kernels else None)
    for dtype_name in args.dtypes.split(",") if args.kernels else ():  # --kernels "": the kernel tuning only
        dtype = getattr(torch, dtype_name)
        model, tok = _streams_model(args, dtype, device)
        vocab = model.config.vocab_size
        plain = _plain_copy(model) if "generate" in args.kernels and device.type == "cuda" else None
        for policy_name in args.policies.split(","):
            policy = _stream_policy(policy_name, tok, args.cache)
            fill = policy.budget + 1
            for batch in (int(b) for b in args.batches.split(",")):
                ids = _stream_ids(tok, vocab, batch, fill + args.steps + 8, gen).to(device)
                for kernel in args.kernels.split(","):
                    label = dict(dtype=dtype_name, policy=policy_name, batch=batch, kernel=kernel)
                    if time.perf_counter() > deadline:
                        skipped.append(label)
                        print(json.dumps(dict(label, skipped="time budget")), flush=True)
                        continue
                    row = _stream_row(args, model, plain, policy, policy_name, ids, kernel, fill, batch, device)
                    if row is None:
                        continue
                    row.update(label)
                    _add_work(row, model, policy, dtype, meta)
                    rows.append(row)
                    print(json.dumps({k: v for k, v in row.items()
                                      if k not in ("profile", "phases", "kernel_timings", "work")}), flush=True)
                    if row.get("work"):
                        print(_work_line(row), flush=True)
                    if save is not None:
                        save(_with_ratios(dict(meta, rows=rows, skipped=skipped)))
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
        del model, plain
    return _with_ratios(dict(meta, rows=rows, skipped=skipped))


def _copy_GBps(device) -> float | None:
    """This run's device-to-device copy bandwidth (GB/s, read + written), beside the datasheet's; None off CUDA."""
    from kvlab.kernels.roofline import copy_bandwidth

    bps = copy_bandwidth(device)
    if bps is None:
        return None
    print(json.dumps(dict(copy_GBps=bps / 1e9)), flush=True)
    return bps / 1e9


def _device_name(device) -> str:
    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"


def _add_work(row: dict, model, policy, dtype, meta: dict) -> None:
    """``row["work"]``: the minimum bytes and FLOPs of one step of an engine row (its streams, each attending to
    the policy's ``budget`` kept entries plus the new token, the rows being full after the fill) and what the
    measured step reaches of them (:mod:`kvlab.kernels.roofline`); none for generate's rows (full attention over
    its growing static cache: another computation) or a row without a time."""
    if row.get("kernel", "").startswith("generate") or "step_ms" not in row or policy.budget is None:
        return
    from kvlab.kernels.roofline import achieved, decode_step_work

    work = decode_step_work(model.config, row["batch"], policy.budget + 1, dtype)
    copy = meta["copy_GBps"] * 1e9 if meta.get("copy_GBps") else None
    row["work"] = dict(work, **achieved(work, row["step_ms"] / 1e3, meta["device_name"], copy))


def _work_line(row: dict) -> str:
    """One printed line: the step's minimum traffic and FLOPs and the shares of the limits the row reaches."""
    w = row["work"]
    text = (f"work model, {row['kernel']} {row['policy']} {row['dtype']} {row['batch']} streams: "
            f"{w['bytes'] / 1e9:.3f} GB a step (weights {w['weight_bytes'] / 1e6:.1f} MB, K/V read "
            f"{w['kv_read_bytes'] / 1e6:.1f} MB at {w['entries']} entries, K/V written "
            f"{w['kv_write_bytes'] / 1e6:.1f} MB, "
            f"logits {w['logits_bytes'] / 1e6:.1f} MB), {w['flops'] / 1e9:.2f} GFLOP, {w['intensity']:.1f} FLOP/B; "
            f"at {w['step_ms']:.2f} ms: {w['Bps'] / 1e9:.0f} GB/s, {w['flops_per_s'] / 1e12:.2f} TFLOP/s")
    if w["bw_share"] is None:
        text += f" (unknown device: {w['device']}, no peak to compare)"
    else:
        text += (f" = {w['bw_share']:.1%} of the {w['peak']}'s {w['peak_Bps'] / 1e12:.2f} TB/s and "
                 f"{w['flop_share']:.1%} of its {w['peak_flops'] / 1e12:.1f} TFLOP/s ({w['math_mode']}); "
                 f"roofline floor {w['floor_ms']:.3f} ms ({w['bound']}-bound) = {w['floor_share']:.1%} of the step")
    if w.get("copy_Bps"):
        text += f"; {w['copy_share']:.1%} of the measured copy bandwidth ({w['copy_Bps'] / 1e9:.0f} GB/s)"
    return text


def _with_ratios(rec: dict) -> dict:
    """Each row's tokens/s against the engine before ("compact") and generate, same dtype and batch."""
    rows = rec["rows"]
    for row in rows:
        for anchor in ("compact", "generate", "generate-nocompile"):
            same = [r for r in rows if r.get("kernel") == anchor and r["dtype"] == row["dtype"]
                    and r["batch"] == row["batch"] and "tokens_per_s" in r
                    and (anchor.startswith("generate") or r["policy"] == row["policy"])]
            if same and "tokens_per_s" in row:
                row[f"x_{anchor.replace('-', '_')}"] = row["tokens_per_s"] / same[0]["tokens_per_s"]
    return rec


def _streams_md(rec: dict) -> str:
    cols = [("dtype", "dtype", ""), ("policy", "policy", ""), ("batch", "streams", ""), ("kernel", "engine", ""),
            ("step_ms", "ms / step", "{:.2f}"), ("tokens_per_s", "aggregate tok/s", "{:.0f}"),
            ("x_compact", "x engine before", "{:.2f}x"), ("x_generate", "x generate", "{:.2f}x"),
            ("x_generate_nocompile", "x generate (no compile)", "{:.2f}x"),
            ("mean_held", "entries held", "{:.0f}"), ("kernel_ms", "kernel ms / layer (full rows)", "{:.4f}"),
            ("error", "error", "")]
    text = fmt_table(rec["rows"], cols)
    for row in rec["rows"]:
        if row.get("phases"):
            text += (f"\n\n### Where the step's GPU time goes, {row['kernel']}, {row['policy']}, {row['dtype']}, "
                     f"{row['batch']} streams (eager step: {row['phases_ms_per_step']:.2f} ms of kernels)\n\n")
            text += fmt_table(row["phases"], [("phase", "part", ""), ("ms_per_step", "ms / step", "{:.3f}"),
                                              ("share", "share", "{:.1%}")])
        if row.get("profile"):
            text += (f"\n\n### Top GPU kernels, {row['kernel']}, {row['policy']}, {row['dtype']}, {row['batch']} streams "
                     f"({row['profile_ms_per_step']:.2f} ms of kernels per step)\n\n")
            text += fmt_table(row["profile"], [("kernel", "kernel", ""), ("ms_per_step", "ms / step", "{:.3f}"),
                                               ("share", "share", "{:.1%}"), ("calls_per_step", "calls / step", "{:.0f}")])
    text += _work_md(rec)
    for row in rec["rows"]:
        if row.get("kernel_timings"):
            text += (f"\n\n### The Triton kernel's choices timed by the engine, {row['dtype']}, {row['batch']} streams "
                     "(full rows, one layer)\n\n")
            text += fmt_table([dict(r["config"], ms=r["ms"]) for r in row["kernel_timings"]],
                              [("USE_DOT", "tl.dot", ""), ("PHYS_ORDER", "memory order", ""), ("BLOCK_N", "BLOCK_N", ""),
                               ("num_warps", "warps", ""), ("splits", "ranges / row", ""), ("ms", "ms", "{:.4f}")])
    if rec.get("tune"):
        text += "\n\n### The static Triton kernel alone (every row full), tiles and warps\n\n" + fmt_table(
            rec["tune"], [("dtype", "dtype", ""), ("part", "what runs", ""), ("products", "products", ""),
                          ("rotate", "rotate", ""),
                          ("BLOCK_N", "BLOCK_N", ""),
                          ("num_warps", "warps", ""), ("num_stages", "stages", ""), ("ms", "ms", "{:.4f}"),
                          ("kv_gb_s", "GB/s of live K/V", "{:.0f}"),
                          ("rel_err", "max error / max output (float64 oracle)", "{:.1e}"), ("error", "error", "")])
    if rec["skipped"]:
        text += "\n\nskipped (time budget): " + "; ".join(
            f"{s['dtype']} {s['policy']} {s['batch']} {s['kernel']}" for s in rec["skipped"])
    return text


def _work_md(rec: dict) -> str:
    """The work model of one step per engine row (kvlab.kernels.roofline), with the peaks' source."""
    rows = [dict(r, **{k: v for k, v in r["work"].items() if k not in r}) for r in rec["rows"] if r.get("work")]
    if not rows:
        return ""
    from kvlab.kernels.roofline import PEAKS_SOURCE

    for r in rows:
        r.update(GB=r["bytes"] / 1e9, weights_MB=r["weight_bytes"] / 1e6, kv_read_MB=r["kv_read_bytes"] / 1e6,
                 kv_write_MB=r["kv_write_bytes"] / 1e6, logits_MB=r["logits_bytes"] / 1e6, GFLOP=r["flops"] / 1e9,
                 GBps=r["Bps"] / 1e9, TFLOPs=r["flops_per_s"] / 1e12)
    peak = rows[0]["peak"]
    copy = rec.get("copy_GBps")
    text = (f"\n\n### Work model of one step (the minimum: weights once, each stream's kept K/V entries and the new "
            f"token's, the new K/V written, logits written and read by the loss; FLOPs 2 x linear weights x streams "
            f"+ 4 x layers x heads x head_dim x entries per stream), "
            + (f"against the {peak} ({PEAKS_SOURCE})" if peak != "unknown device"
               else f"{rows[0]['device']}: unknown device, no peak to compare")
            + (f" and this run's measured copy bandwidth, {copy:.0f} GB/s" if copy else "") + "\n\n")
    return text + fmt_table(rows, [
        ("dtype", "dtype", ""), ("policy", "policy", ""), ("batch", "streams", ""), ("kernel", "engine", ""),
        ("entries", "entries / stream", ""), ("weights_MB", "weights MB", "{:.1f}"),
        ("kv_read_MB", "K/V read MB", "{:.1f}"), ("kv_write_MB", "K/V written MB", "{:.1f}"),
        ("logits_MB", "logits MB", "{:.1f}"), ("GB", "GB / step", "{:.3f}"), ("GFLOP", "GFLOP / step", "{:.2f}"),
        ("intensity", "FLOP / B", "{:.1f}"), ("step_ms", "ms / step", "{:.2f}"), ("GBps", "GB/s", "{:.1f}"),
        ("bw_share", "share of peak B/s", "{:.1%}"), ("copy_share", "share of copy B/s", "{:.1%}"),
        ("TFLOPs", "TFLOP/s", "{:.2f}"), ("flop_share", "share of peak FLOP/s", "{:.1%}"), ("math_mode", "math", ""),
        ("floor_ms", "floor ms", "{:.3f}"), ("bound", "bound", ""), ("floor_share", "floor / step", "{:.1%}")])


def main_streams(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="kvlab bench eval streams",
                                 description="the static engine's layouts at many streams beside generate")
    ap.add_argument("what", choices=["streams"])
    ap.add_argument("--model", default="smollm2-135m", help="a kvlab model id, or 'random' (SmolLM2 shape)")
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--policies", default="streamingllm", help="streamingllm,sepllm")
    ap.add_argument("--cache", type=int, default=324, help="policy budget (StreamingLLM cache_size, SepLLM c)")
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--kernels", default="generate,compact,triton",
                    help="engine layouts (compact, indexed, triton) and generate / 'generate-nocompile'")
    ap.add_argument("--steps", type=int, default=64, help="timed steps after the caches are full")
    ap.add_argument("--profile-batches", default="256", help="batches whose step is profiled")
    ap.add_argument("--tune", action="store_true", help="first time the Triton kernel alone over a few configs")
    ap.add_argument("--budget-s", type=float, default=1e9, help="skip what starts after this many seconds")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default="build/bench")
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    args.profile_batches = {int(b) for b in args.profile_batches.split(",") if b}
    cuda = torch.cuda.is_available() and (args.device or "cuda").startswith("cuda")
    info = dict(device=torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
                torch=torch.__version__, date=time.strftime("%Y-%m-%d %H:%M:%S"),
                command="python -m kvlab bench eval " + " ".join(argv))
    try:
        import transformers
        import triton

        info.update(transformers=transformers.__version__, triton=triton.__version__)
    except ImportError:
        pass
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "engine_streams" + (f"_{args.tag}" if args.tag else "")

    def save(rec: dict) -> str:
        rec["info"] = info
        table = _streams_md(rec)
        rec["table"] = table
        (out / f"{name}.json").write_text(json.dumps(rec, indent=1))
        (out / f"{name}.md").write_text(f"{info['device']} ({info['date']})\n\n`{info['command']}`\n\n{table}\n")
        return table

    rec = streams(args, save)
    table = save(rec)
    print(f"\n## {name} ({info['device']})\n{table}\n-> {out / name}.json", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["streams"]:
        return main_streams(argv)
    ap = argparse.ArgumentParser(prog="kvlab bench eval", description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["decode", "streams"], nargs="?", default="decode")
    ap.add_argument("--tokens", type=int, default=512, help="tokens per stream (plain, generate, static)")
    ap.add_argument("--hooks-tokens", type=int, default=128, help="tokens for the (slow) hooks engine")
    ap.add_argument("--plain-tokens", type=int, default=128, help="tokens for the (slow) plain loop")
    ap.add_argument("--streams", type=int, default=32, help="streams decoded in one batch (0: skip)")
    ap.add_argument("--dtypes", default="auto", help="'auto' (fp32+bf16 on CUDA, fp32 on CPU) or e.g. 'float32'")
    ap.add_argument("--device", default=None)
    ap.add_argument("--repeats", type=int, default=1, help="best of this many runs (a shared CPU is noisy)")
    ap.add_argument("--no-generate", action="store_true", help="skip transformers' generate (GPU)")
    ap.add_argument("--compile", action="store_true", help="also time engine='compiled' (torch.compile first)")
    ap.add_argument("--out", default="build/bench",
                    help="folder for JSON/table (default build/bench; the committed "
                         "benchmarks/results only when named)")
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    for name in ("tokens", "hooks_tokens", "plain_tokens"):
        if getattr(args, name) < 8:
            ap.error(f"--{name.replace('_', '-')} must be >= 8")
    args.hooks_tokens = min(args.hooks_tokens, args.tokens)
    args.plain_tokens = min(args.plain_tokens, args.tokens)
    rec = run(args)
    cuda = torch.cuda.is_available() and (args.device or "cuda").startswith("cuda")
    rec["info"] = dict(device=torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
                       torch=torch.__version__, threads=torch.get_num_threads(),
                       date=time.strftime("%Y-%m-%d %H:%M:%S"),
                       command="python -m kvlab bench eval " + " ".join(argv if argv is not None else sys.argv[1:]))
    table = _table(rec)
    rec["table"] = table
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "eval_decode" + (f"_{args.tag}" if args.tag else "")
    (out / f"{name}.json").write_text(json.dumps(rec, indent=1))
    (out / f"{name}.md").write_text(f"{rec['info']['device']} ({rec['info']['date']})\n\n{table}\n")
    print(f"\n## {name} ({info['device']})\n{table}\n-> {out / name}.json", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
