"""Very long streams: SepLLM Table 4 (PG19 1M-4M tokens, c=324, a=4, w=224, s=32/64) and LaCache Figs. 5-6
(LaCache vs StreamingLLM on concatenated PG19) on SmolLM2-135M, one GPU, in under 9 minutes.

    python -m kvlab run lacache-longstream --out DIR [--policies lacache_official_s16o0,sepllm_s64] [--segments 128]

Stream: ``kvlab.datasets.load_text("austen") + "\\n\\n" + load_text("shakespeare")`` (2.96M SmolLM2 tokens), our PG19
stand-in. :func:`kvlab.eval.long_stream_perplexity` cuts it into ``--segments`` contiguous segments decoded side by
side as the rows of one static-engine batch (CUDA graph); row r = the stream's first 4 tokens (sinks), ``--warmup``
tokens before the segment (decoded, not scored), then the segment (scored). An approximation: keys/values of layers
> 0 know nothing from before the warm-up, and SepLLM's / LaCache's compaction cycle may be in another phase than in
one sequential pass (see docs/guide/engine.md, "Very long streams"); step 4 measures the effect.

1. load SmolLM2-135M in float32 (bf16 moved perplexity by 0.2-0.3 % on the CPU; the paper's gaps are 4-6 %),
   tokenize the stream;
2. calibrate: time 40 steady-state steps of the batch; choose the segment length so that the policies and the
   checks fit in ``--budget-s`` seconds (at most the whole stream, at most ``--max-tokens``). ``--segment-tokens N``
   fixes the length instead: no calibration, and no policy or check is skipped for time, so the run's size does
   not depend on the machine (``--smoke`` does this: 2 segments of 24 tokens, the second row past the cache's 36
   entries, so that both policies evict);
3. StreamingLLM(4, cache_size=324); SepLLMStreaming(4, 32, 224, 324); LaCache.official(324, 16, 0);
   SepLLMStreaming(4, 64, 224, 324) (official-style separators: :func:`kvlab.sepllm.separator_ids`), each the same
   tokens, segments and warm-up; a policy that would overrun the time left is skipped (said in the log);
4. deviation checks (``--check-policies``, default SepLLM s=32 and LaCache): segmented vs one sequential pass on the
   first ``--check-tokens`` tokens (2 segments, same warm-up).

Results in ``--out``: ``segments.examples.jsonl.gz`` (per policy and segment its mean NLL, the ledger's records),
``<policy>.json`` (perplexity at every ``--report-every`` tokens, cumulative and per window, at the paper's lengths,
per-segment perplexity, mean KV), ``deviation_<policy>.json``, ``run.json`` (the plan and calibration;
``corpus_tokens``: the tokens of the text read, the whole stream unless ``--max-tokens`` is far below it). Below
``--min-tokens`` the deviation checks beyond the first are dropped before the stream gets shorter.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from kvlab.experiments import records, registry

NAME = "lacache-longstream"
RECORDS = "segments" + records.SUFFIX
# --smoke: a fixed size (no calibration, nothing skipped for time), about 90 decode steps in all. 36 entries are
# the fewest LaCache.official(c, 16, 0) takes on the model's 30 layers (4 sinks + 30 recent + a ladder of 2); the
# second segment's row (4 sinks + 12 warm-up tokens, not the stream's prefix + its 24 scored tokens: 40) outgrows
# them, so both policies evict while it is scored.
SMOKE = dict(segments=2, warmup=12, max_tokens=49, segment_tokens=24, check_tokens=7, report_every=8, capacity=36,
             local=12, sep_small=4, sep_large=6, min_tokens=0, policies=["streamingllm", "lacache_official_s16o0"],
             check_policies=["lacache_official_s16o0"])
OVERHEAD = 1.15  # SepLLM / LaCache steps and graph captures cost a little more than StreamingLLM's


def policy_names(args) -> list[str]:
    """The four policies' names, the Table 4 pair first (the separator counts name SepLLM's)."""
    return ["streamingllm", f"sepllm_s{args.sep_small}", "lacache_official_s16o0", f"sepllm_s{args.sep_large}"]


def _policies(args, tok) -> dict:
    from kvlab.policies import LaCache, SepLLMStreaming, StreamingLLM
    from kvlab.sepllm import separator_ids

    seps = separator_ids(tok)
    c = args.capacity
    every = dict(zip(policy_names(args), (StreamingLLM(4, cache_size=c),
                                          SepLLMStreaming(4, args.sep_small, args.local, c, separators=seps),
                                          LaCache.official(c, 16, 0),
                                          SepLLMStreaming(4, args.sep_large, args.local, c, separators=seps))))
    return {name: every[name] for name in args.policies}, len(seps)


def _step_seconds(model, stream, capacity: int, batch: int, device: str, steps: int = 40) -> float:
    """Steady-state seconds per step of a batch of ``batch`` rows (the cache full: eviction every step)."""
    import torch

    from kvlab.eval import FastDecoder
    from kvlab.policies import StreamingLLM

    dec = FastDecoder(model, StreamingLLM(4, cache_size=capacity), batch)
    ids = stream[:batch].view(batch, 1).to(dec.device)
    for _ in range(capacity + 8):
        dec.step(ids)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        dec.step(ids)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def _fixed_plan(args, stream) -> dict:
    """``--segment-tokens``: the length given (the stream must hold it), no timing, nothing skipped for time."""
    if args.segments * args.segment_tokens + 1 > min(args.max_tokens, stream.numel()):
        raise registry.ParameterError(f"--segments {args.segments} x --segment-tokens {args.segment_tokens} + 1 "
                                      f"exceeds the {min(args.max_tokens, stream.numel()):,} tokens of the stream "
                                      "(--max-tokens)")
    return dict(segment_tokens=args.segment_tokens, fixed_size=True, check_policies=list(args.check_policies))


def _plan(args, model, stream, n_policies: int, t0: float) -> dict:
    """Calibrate, then the segment length that fits the policies and the checks in ``--budget-s``
    (``--segment-tokens``: the length given, see :func:`_fixed_plan`)."""
    if args.segment_tokens:
        return _fixed_plan(args, stream)
    t_batch = _step_seconds(model, stream, args.capacity, args.segments, args.device)
    t_one = _step_seconds(model, stream, args.capacity, 1, args.device)
    checks = list(args.check_policies)
    one_check = 0.0 if not checks else OVERHEAD * (args.check_tokens * t_one + ((args.check_tokens - 1) // 2
                                                                                + args.warmup)
                                                   * _step_seconds(model, stream, args.capacity, 2, args.device))
    spent = time.perf_counter() - t0

    def segment_length(n_checks: int) -> int:  # tokens per segment that fit beside n_checks deviation checks
        steps = int((args.budget_s - spent - n_checks * one_check) / (n_policies * t_batch * OVERHEAD))
        return min((min(args.max_tokens, stream.numel()) - 1) // args.segments, steps - args.warmup)

    while len(checks) > 1 and args.segments * segment_length(len(checks)) < args.min_tokens:
        print(f"dropping the deviation check of {checks.pop()} to reach {args.min_tokens:,} tokens", flush=True)
    seg_len = segment_length(len(checks))
    if seg_len < 1:
        raise RuntimeError(f"no time for even one token per segment: {t_batch * 1e3:.1f} ms per step at batch "
                           f"{args.segments}; raise --budget-s or lower --segments")
    return dict(segment_tokens=seg_len, ms_per_step_batch=t_batch * 1e3, ms_per_step_one=t_one * 1e3,
                expected_seconds_per_policy=(seg_len + args.warmup) * t_batch * OVERHEAD,
                expected_check_seconds=one_check * len(checks), one_check=one_check, check_policies=checks)


def _result_json(name, policy, result, segments: int, num_layers: int) -> dict:
    from kvlab.eval import ppl_at_lengths
    from kvlab.policies import LaCache

    bounds = [1 + r * (result.tokens - 1) // segments for r in range(segments + 1)]
    out = result.summary()
    out.update(name=name, policy_after_run=repr(policy), ppl_at_paper_lengths=ppl_at_lengths(
        result, [k * 500_000 for k in range(1, 9)]), window_ppl_16k=result.window_ppl(16384),
               segment_ppl=[math.exp(float(result.nll[a - 1:b - 1].mean())) for a, b in zip(bounds, bounds[1:])])
    if isinstance(policy, LaCache):
        out["lacache_settings"] = policy.settings(num_layers)
    return out


def _device_name(device: str) -> str:
    import torch

    return f"cuda ({torch.cuda.get_device_name()})" if device.startswith("cuda") else "cpu"


def check(args) -> None:
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
    names = policy_names(args)
    args.policies = args.policies or names
    args.check_policies = [] if args.check_policies == ["none"] else (
        args.check_policies if args.check_policies is not None else [names[1], names[2]])
    for option, chosen in (("--policies", args.policies), ("--check-policies", args.check_policies)):
        wrong = [p for p in chosen if p not in names]
        if wrong:
            raise registry.ParameterError(f"{option} {','.join(wrong)}: the policies are {names} (SepLLM's named by "
                                          "--sep-small / --sep-large)")
    args.check_policies = [p for p in args.check_policies if p in args.policies]
    if args.segment_tokens < 0 or args.segments * args.segment_tokens + 1 > args.max_tokens:
        raise registry.ParameterError(f"--segment-tokens {args.segment_tokens}: 0 (calibrate) or a length whose "
                                      f"--segments {args.segments} segments fit --max-tokens {args.max_tokens} "
                                      "(segments x length + 1 tokens)")


def _no_time(args, plan, t0: float, seconds: float) -> bool:
    """Whether a step of the plan that needs ``seconds`` more is skipped for time (a fixed-size plan skips none)."""
    return not plan.get("fixed_size") and time.perf_counter() - t0 + seconds > args.budget_s + 30


def _policy_runs(args, model, ids, policies, plan, t0, out, writer) -> list[Path]:
    from kvlab.eval import long_stream_perplexity

    written = []
    for name, policy in policies.items():
        if _no_time(args, plan, t0, plan.get("expected_seconds_per_policy", 0) + plan.get("expected_check_seconds", 0)):
            elapsed = time.perf_counter() - t0
            print(f"SKIP {name}: {elapsed:.0f} s elapsed, {plan['expected_seconds_per_policy']:.0f} s needed")
            continue
        result = long_stream_perplexity(model, ids, policy, segments=args.segments, warmup=args.warmup, sink=4,
                                        report_every=args.report_every, progress=True)
        summary = _result_json(name, policy, result, args.segments, model.config.num_hidden_layers)
        out.claim(f"{name}.json").write_text(json.dumps(summary, indent=1))
        written.append(out.root / f"{name}.json")
        config = {"policy": summary["policy"], "segments": args.segments, "warmup": args.warmup,
                  "segment_tokens": plan["segment_tokens"], "dtype": args.dtype}
        for i, ppl in enumerate(summary["segment_ppl"]):
            writer.add(records.record(f"segment-{i:03d}", name, "segment_nll", math.log(ppl), config=config,
                                      device=_device_name(args.device), tokens=summary["segment_tokens"]))
        print(f"{name}: ppl {result.ppl:.3f}, mean KV {result.mean_kv:.1f}, {result.seconds:.0f} s", flush=True)
    return written


def run(args) -> list[Path]:
    import torch

    import kvlab
    from kvlab.eval import long_stream_deviation
    from kvlab.outputs import OutputFolder

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    out = OutputFolder(args.out, f"python -m kvlab run {NAME}")
    if (out.root / RECORDS).exists():
        raise registry.ParameterError(f"{out.root / RECORDS} holds an earlier run's segments; give a new --out")
    t0 = time.perf_counter()
    torch.manual_seed(0)
    model, tok = kvlab.load_model("smollm2-135m", dtype=getattr(torch, args.dtype), device=args.device)
    text = kvlab.datasets.load_text("austen") + "\n\n" + kvlab.datasets.load_text("shakespeare")
    # the text of at most --max-tokens tokens (about 4 characters each): the whole stream at the default
    text = text[: 8 * max(args.max_tokens, args.check_tokens)]
    stream = tok(text, return_tensors="pt").input_ids[0]
    policies, n_seps = _policies(args, tok)
    plan = _plan(args, model, stream, len(policies), t0)
    ids = stream[: args.segments * plan["segment_tokens"] + 1]
    run_json = dict(device=_device_name(args.device), dtype=args.dtype, tokens=ids.numel(),
                    corpus_tokens=stream.numel(), segments=args.segments, warmup=args.warmup, sink=4,
                    capacity=args.capacity, check_tokens=args.check_tokens, separators=n_seps,
                    torch=torch.__version__, **{k: v for k, v in plan.items() if k != "one_check"})
    print("plan:", json.dumps(run_json), flush=True)
    out.claim("run.json").write_text(json.dumps(run_json, indent=1))
    with records.RecordWriter(RECORDS, out=out) as writer:
        written = _policy_runs(args, model, ids, policies, plan, t0, out, writer)
    for name in plan["check_policies"]:  # 4. the segmented numbers against one sequential pass
        if _no_time(args, plan, t0, plan.get("one_check", 0)):
            print(f"SKIP deviation check {name}: no time left", flush=True)
            continue
        dev = long_stream_deviation(model, stream[:args.check_tokens], policies[name], segments=2,
                                    warmup=args.warmup, sink=4, progress=True)
        out.claim(f"deviation_{name}.json").write_text(json.dumps({**dev, "policy": name}, indent=1))
        written.append(out.root / f"deviation_{name}.json")
    print(f"total {time.perf_counter() - t0:.0f} s", flush=True)
    return [writer.path, out.root / "run.json", *written]


def parser() -> argparse.ArgumentParser:
    p = registry.experiment_parser(NAME, __doc__.split("\n\n")[0])
    pos = registry.positive_int
    p.add_argument("--policies", type=lambda t: [x.strip() for x in t.split(",") if x.strip()], default=None,
                   help="a subset of the four (default all): streamingllm, sepllm_s32, lacache_official_s16o0, "
                        "sepllm_s64")
    p.add_argument("--check-policies", type=lambda t: [x.strip() for x in t.split(",") if x.strip()], default=None,
                   help="the deviation checks ('none': none; default sepllm_s32,lacache_official_s16o0)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--segments", type=pos, default=256)
    p.add_argument("--warmup", type=pos, default=2048)
    p.add_argument("--max-tokens", type=pos, default=2000001)
    p.add_argument("--check-tokens", type=pos, default=8193)
    p.add_argument("--min-tokens", type=int, default=1000000)
    p.add_argument("--budget-s", type=pos, default=460, help="seconds the plan fills")
    p.add_argument("--segment-tokens", type=int, default=0,
                   help="tokens per segment, fixed (no calibration, nothing skipped for time); default 0: the most "
                        "that fit --budget-s")
    p.add_argument("--report-every", type=pos, default=131072)
    p.add_argument("--capacity", type=pos, default=324)
    p.add_argument("--local", type=pos, default=224)
    p.add_argument("--sep-small", type=pos, default=32)
    p.add_argument("--sep-large", type=pos, default=64)
    return p
