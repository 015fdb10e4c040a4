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
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

__all__ = ["SMOLLM2_SHAPE", "main", "random_smollm2"]

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

    Full, LaCache = kvlab.policies.Full, kvlab.policies.LaCache
    SepLLMStreaming, StreamingLLM = kvlab.policies.SepLLMStreaming, kvlab.policies.StreamingLLM
    seps = list(range(0, SMOLLM2_SHAPE["vocab_size"], 16))  # ~6% of random tokens are "separators"
    b = max(tokens // 4, 64)  # the budget: a quarter of the stream (StreamingLLM(4, 124) at 512 tokens)
    return [Full(), StreamingLLM(4, b - 4), SepLLMStreaming(4, b // 8, b // 2, b, separators=seps), LaCache(b)]


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
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


def run(args) -> dict:
    from kvlab.eval import streaming_perplexity

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    dtypes = [torch.float32, torch.bfloat16] if cuda and args.dtypes == "auto" else (
        [torch.float32] if args.dtypes == "auto" else [getattr(torch, d) for d in args.dtypes.split(",")])
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
            rows.append(dict(dtype=name, policy=type(policy).__name__, plain=1 / plain_s, hooks=hooks_tps,
                             static=1 / static_s, static_e2e=(args.tokens - 1) / e2e.seconds,
                             x_hooks=1 / static_s / hooks_tps, time_vs_plain=ratio, policy_share=keep_s / static_s))
            if args.compile:
                compiled_s = _static_steady(model, policy, ids, device, compile=True)[0] / (args.tokens - 1)
                rows[-1].update(compiled=1 / compiled_s, x_hooks_compiled=1 / compiled_s / hooks_tps,
                                compiled_share=keep_s / compiled_s)
            print(json.dumps(rows[-1]), flush=True)
        if cuda and not args.no_generate:  # last: its compilation may take long (rows above are printed)
            _generate(plain, ids)  # warm-up (and whatever compilation transformers does)
            gen_tps = (args.tokens - 1) / _timed(lambda: _generate(plain, ids), device)
            print(json.dumps(dict(dtype=name, generate=gen_tps)), flush=True)
            for row in rows[first:]:
                row.update(generate=gen_tps, x_generate=row["static"] / gen_tps)
                if "compiled" in row:
                    row["x_generate_compiled"] = row["compiled"] / gen_tps
        del model, plain
    streams = []
    if args.streams:
        model, _ = _models(device, dtypes[-1])
        many = torch.randint(0, SMOLLM2_SHAPE["vocab_size"], (args.streams, args.tokens), generator=gen).to(device)
        for policy in _policies(args.tokens):
            steady, _ = _static_steady(model, policy, many, device)
            streams.append(dict(dtype=str(dtypes[-1]).replace("torch.", ""), policy=type(policy).__name__,
                                streams=args.streams, tokens_per_s=args.streams * (args.tokens - 1) / steady))
            if args.compile:
                steady, _ = _static_steady(model, policy, many, device, compile=True)
                streams[-1]["compiled_tokens_per_s"] = args.streams * (args.tokens - 1) / steady
            print(json.dumps(streams[-1]), flush=True)
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kvlab bench eval", description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["decode"], nargs="?", default="decode")
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
    print(f"\n## {name} ({rec['info']['device']})\n{table}\n-> {out / name}.json", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
