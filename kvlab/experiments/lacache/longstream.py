#!/usr/bin/env bash
# Issue 14, very long streams: SepLLM Table 4 (PG19 1M-4M tokens, c=324, a=4, w=224, s=32/64) and LaCache Figs. 5-6
# (LaCache vs StreamingLLM on concatenated PG19) on SmolLM2-135M, one H100, from the repo root, < 9 minutes.
#
# Stream: kvlab.datasets.load_text("austen") + "\n\n" + load_text("shakespeare") (2.96M SmolLM2 tokens), our PG19
# stand-in. kvlab.eval.long_stream_perplexity cuts it into SEGMENTS contiguous segments decoded side by side as the
# rows of one static-engine batch (CUDA graph); row r = the stream's first 4 tokens (sinks), WARMUP
# tokens before the segment (decoded, not scored), then the segment (scored). An approximation: keys/values of
# layers > 0 know nothing from before the warm-up, and SepLLM's / LaCache's compaction cycle may be in another phase
# than in one sequential pass (see docs/guide/engine.md, "Very long streams"); step 4 measures the effect.
#
#   1. load SmolLM2-135M in float32 (on the CPU, 640 tokens, bf16 moved perplexity by 0.2-0.3% and the
#      SepLLM-StreamingLLM gap by 0.1 point; the paper's gaps are 4-6%: fp32 costs little here), tokenize the stream
#   2. calibrate: time 40 steady-state steps of the batch; choose the segment length so that the four policies and
#      the check fit in BUDGET_S seconds (at most the whole stream, at most MAX_TOKENS)
#   3. StreamingLLM(4, cache_size=324); SepLLMStreaming(4, 32, 224, 324); LaCache.official(324, 16, 0);
#      SepLLMStreaming(4, 64, 224, 324) (official-style separators: kvlab.sepllm.separator_ids, 17 ids), each the
#      same tokens, segments and warm-up; a policy that would overrun the time left is skipped (said in the log)
#   4. deviation checks (CHECK_POLICIES, default SepLLM s=32 and LaCache: the two whose kept set depends on more than
#      the last window): segmented vs one sequential pass on the first CHECK_TOKENS tokens (2 segments, same warm-up)
# Results: $OUT/longstream/<policy>.json (perplexity at every REPORT_EVERY tokens, cumulative and per window, at
# 1M / 1.5M / 2M, per-segment perplexity, mean KV, tokens, segments, warm-up, seconds), deviation_<policy>.json,
# run.json (the plan and calibration), log.txt. Knobs (env): POLICIES (a subset of the four names), DTYPE=float32,
# SEGMENTS=256 WARMUP=2048 MAX_TOKENS=2000001
# CHECK_TOKENS=8193 CHECK_POLICIES="sepllm_s32 lacache_official_s16o0" MIN_TOKENS=1000000 BUDGET_S=460 LIMIT=530
# REPORT_EVERY=131072.
# Runtime: ~30 s load + tokenize + calibration; 2 checks x ~75 s (8,193 steps at batch 1 at ~4.4 ms, 6.2K at batch 2);
# 4 policies x (L + ~2,100) steps at batch 256. The plan fills BUDGET_S=460 s (hard limit 530 s): at 10 ms per step
# (a guess for 256 rows, c=325, fp32; 5.3 ms was measured for 32 rows, c=128, bf16) L is ~4K, ~1.0M tokens; at 6 ms
# the whole 2M. Below MIN_TOKENS the LaCache check is dropped first. Each policy's JSON is written when it finishes.
# Smoke test on a CPU (a few hundred tokens, small caches): SMOKE=1 OUT=/tmp/kv/out_longstream bash benchmarks/longstream.sh
# (the lead sources gpujobs/setup_devw.sh before this on the GPU machine: KVLAB_CACHE, PYTHONPATH).
set -uo pipefail
OUT=${OUT:-$PWD/out}
R="$OUT/longstream"
mkdir -p "$R"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET
if [ "${SMOKE:-0}" = 1 ]; then
  export DEVICE=cpu SEGMENTS=${SEGMENTS:-4} WARMUP=${WARMUP:-16} MAX_TOKENS=${MAX_TOKENS:-301} \
    CHECK_TOKENS=${CHECK_TOKENS:-129} REPORT_EVERY=${REPORT_EVERY:-100} BUDGET_S=${BUDGET_S:-330} CAPACITY=48 LOCAL=24 \
    SEP_SMALL=8 SEP_LARGE=12 MIN_TOKENS=0 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
fi
PY=${PYTHON:-python}
begin=$(date +%s)
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"; } > "$R/device.txt"
timeout ${LIMIT:-530} $PY - <<'EOF' 2>&1 | tee "$R/log.txt"
import json, math, os, time
from pathlib import Path

import torch

import kvlab
from kvlab.eval import FastDecoder, long_stream_deviation, long_stream_perplexity, ppl_at_lengths
from kvlab.policies import LaCache, SepLLMStreaming, StreamingLLM
from kvlab.sepllm import separator_ids

env = os.environ.get
R = Path(env("OUT", "out")) / "longstream"
device = env("DEVICE", "cuda")
segments, warmup = int(env("SEGMENTS", "256")), int(env("WARMUP", "2048"))
max_tokens, check_tokens = int(env("MAX_TOKENS", "2000001")), int(env("CHECK_TOKENS", "8193"))
report_every, budget_s = int(env("REPORT_EVERY", "131072")), float(env("BUDGET_S", "460"))
min_tokens = int(env("MIN_TOKENS", "1000000"))  # checks beyond the first are dropped before the stream gets shorter
C, local, s_small, s_large = (int(env(k, d)) for k, d in
                              (("CAPACITY", "324"), ("LOCAL", "224"), ("SEP_SMALL", "32"), ("SEP_LARGE", "64")))
t0 = time.perf_counter()
torch.manual_seed(0)

# 1. model (float32) and the stream
dtype = getattr(torch, env("DTYPE", "float32"))
model, tok = kvlab.load_model("smollm2-135m", dtype=dtype, device=device)
text = kvlab.datasets.load_text("austen") + "\n\n" + kvlab.datasets.load_text("shakespeare")
stream = tok(text, return_tensors="pt").input_ids[0]
print(f"stream: {stream.numel():,} tokens (austen + shakespeare); load + tokenize {time.perf_counter() - t0:.0f} s",
      flush=True)
seps = separator_ids(tok)
policies = {  # priority order: the Table 4 pair first
    "streamingllm": StreamingLLM(4, cache_size=C),
    f"sepllm_s{s_small}": SepLLMStreaming(4, s_small, local, C, separators=seps),
    "lacache_official_s16o0": LaCache.official(C, 16, 0),
    f"sepllm_s{s_large}": SepLLMStreaming(4, s_large, local, C, separators=seps),
}
if env("POLICIES"):  # a subset (one device call may not hold all four at 1M+ tokens)
    policies = {name: policies[name] for name in env("POLICIES").split()}


# 2. calibration: steady-state seconds per step at this batch (and at batch 1, for the sequential check)
def step_seconds(batch: int, steps: int = 40) -> float:
    dec = FastDecoder(model, StreamingLLM(4, cache_size=C), batch)
    ids = stream[:batch].view(batch, 1).to(dec.device)
    for _ in range(C + 8):  # fill the cache: eviction every step from here on
        dec.step(ids)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        dec.step(ids)
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


t_batch, t_one = step_seconds(segments), step_seconds(1)
overhead = 1.15  # SepLLM / LaCache steps and graph captures cost a little more than StreamingLLM's
checks = [n for n in env("CHECK_POLICIES", f"sepllm_s{s_small} lacache_official_s16o0").split() if n in policies]
one_check = 0.0 if not checks else None
one_check = one_check if one_check is not None else \
    overhead * (check_tokens * t_one + ((check_tokens - 1) // 2 + warmup) * step_seconds(2))
spent = time.perf_counter() - t0


def segment_length(n_checks: int) -> int:  # tokens per segment that fit beside n_checks deviation checks
    steps = int((budget_s - spent - n_checks * one_check) / (len(policies) * t_batch * overhead))
    return min((min(max_tokens, stream.numel()) - 1) // segments, steps - warmup)


while len(checks) > 1 and segments * segment_length(len(checks)) < min_tokens:
    print(f"dropping the deviation check of {checks.pop()} to reach {min_tokens:,} tokens", flush=True)
check_s = one_check * len(checks)
seg_len = segment_length(len(checks))
if seg_len < 1:
    raise SystemExit(f"no time for even one token per segment: {t_batch * 1e3:.1f} ms per step at batch {segments}")
ids = stream[: segments * seg_len + 1]
plan = dict(device=torch.cuda.get_device_name() if device == "cuda" else "cpu", dtype=str(dtype)[6:],
            tokens=ids.numel(), corpus_tokens=stream.numel(), segments=segments, segment_tokens=seg_len,
            warmup=warmup, sink=4, capacity=C, ms_per_step_batch=t_batch * 1e3,
            ms_per_step_one=t_one * 1e3, expected_seconds_per_policy=(seg_len + warmup) * t_batch * overhead,
            expected_check_seconds=check_s, check_policies=checks, check_tokens=check_tokens,
            separators=len(seps), torch=torch.__version__)
print("plan:", json.dumps(plan), flush=True)
(R / "run.json").write_text(json.dumps(plan, indent=1))


# 3. the policies, the same segmented stream each
def record(name, policy, result):
    bounds = [1 + r * (result.tokens - 1) // segments for r in range(segments + 1)]
    out = result.summary()
    out.update(name=name, policy_after_run=repr(policy), ppl_at_paper_lengths=ppl_at_lengths(
        result, [k * 500_000 for k in range(1, 9)]), window_ppl_16k=result.window_ppl(16384),
               segment_ppl=[math.exp(float(result.nll[a - 1:b - 1].mean())) for a, b in zip(bounds, bounds[1:])])
    if isinstance(policy, LaCache):
        out["lacache_settings"] = policy.settings(len(model.model.layers))
    (R / f"{name}.json").write_text(json.dumps(out, indent=1))
    return out


done = {}
for name, policy in policies.items():
    elapsed = time.perf_counter() - t0
    if elapsed + plan["expected_seconds_per_policy"] + check_s > budget_s + 30:
        print(f"SKIP {name}: {elapsed:.0f} s elapsed, {plan['expected_seconds_per_policy']:.0f} s needed", flush=True)
        continue
    result = long_stream_perplexity(model, ids, policy, segments=segments, warmup=warmup, sink=4,
                                    report_every=report_every, progress=True)
    done[name] = record(name, policy, result)
    print(f"{name}: ppl {result.ppl:.3f}, mean KV {result.mean_kv:.1f}, {result.seconds:.0f} s "
          f"({(result.tokens - 1) / result.seconds:,.0f} scored tok/s); cumulative "
          + ", ".join(f"{n:,}: {p:.3f}" for n, p in result.cumulative_ppl().items()), flush=True)

# 4. how far the segmented numbers are from one sequential pass (first CHECK_TOKENS tokens)
for name in checks:
    if time.perf_counter() - t0 + one_check > budget_s + 30:
        print(f"SKIP deviation check {name}: no time left", flush=True)
        continue
    dev = long_stream_deviation(model, stream[:check_tokens], policies[name], segments=2, warmup=warmup,
                                sink=4, progress=True)
    dev["policy"] = name
    (R / f"deviation_{name}.json").write_text(json.dumps(dev, indent=1))
    print(f"deviation {name}:", json.dumps(dev), flush=True)

if done:
    base = done.get("streamingllm")
    points = lambda out: out["ppl_at_paper_lengths"] or out["cumulative_ppl"]  # 0.5M steps, else every report
    print(f"\n| policy | tokens | mean KV | " + " | ".join(f"ppl @{n:,}" for n in points(next(iter(done.values()))))
          + " |")
    for name, out in done.items():
        print(f"| {name} | {out['tokens']:,} | {out['mean_kv']:.1f} | "
              + " | ".join(f"{p:.3f}" for p in points(out).values()) + " |")
    if base:
        for name, out in done.items():
            wins = sum(a < b for a, b in zip(out["segment_ppl"], base["segment_ppl"]))
            if name != "streamingllm":
                print(f"{name}: lower perplexity than StreamingLLM in {wins} of {segments} segments")
print(f"total {time.perf_counter() - t0:.0f} s", flush=True)
EOF
echo "done in $(( $(date +%s) - begin )) s; results in $R"
