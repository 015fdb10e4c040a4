#!/usr/bin/env bash
# engine's GPU round (issue 28): the static decode engine at 256 / 64 / 1 streams on one H200, the cache layout
# before ("compact": every slot moved and re-rotated each step, masked SDPA) and after ("triton": entries never
# move, metadata-only compaction, one Triton kernel per layer that reads the live entries and re-rotates them as
# it reads, its tiles / ranges / walk order timed once per shape), beside transformers' static generate at the same
# batch. Writes everything flat into OUTDIR:
#
#   bash benchmarks/gpu/static_decode_engine.sh OUTDIR        # from the repository root, plain `python`
#
# Steps (each with its own time limit and log; a failing step does not stop the others; steps.txt has the exits):
#   tests  GPU tests: tests/test_static_triton.py (float64 oracle of the kernel in bf16/fp32, every walk and product
#          variant; the engine's greedy tokens and kept entries equal to the engine before; the one-off timing), the
#          CUDA tests of tests/test_fast_decode.py (graph replay == hooks engine, now on the Triton path)
#   bench  python -m kvlab bench eval streams: SmolLM2-135M-Instruct fp32, StreamingLLM(4, cache_size=324) (the
#          long-stream runs' policy), caches filled first (325 steps), 64 timed steps, batches 256/64/1: compact /
#          triton / generate (transformers' static cache, its auto-compile off); the 256-stream step profiled (top GPU
#          kernels; GPU time per part of the step)                                  -> engine_streams.{json,md}
#   gen    transformers' generate as shipped (it compiles the forward on CUDA) at 256 streams, fp32
#                                                                                  -> engine_streams_gen.{json,md}
#   bf16   the bench at 256 streams in bf16                                        -> engine_streams_bf16.{json,md}
#   compiled  engine="compiled" (torch.compile'd layers around the Triton kernel), one CUDA test
# Environment: ENGINE_STEPS (tests,bench,gen,bf16,compiled), ENGINE_BATCHES (256,64,1), ENGINE_MODEL
# (smollm2-135m), ENGINE_CACHE (324), ENGINE_TIMED (64), BUDGET (seconds in all, 150).
# Smoke test on a CPU: ENGINE_STEPS=bench ENGINE_MODEL=random ENGINE_BATCHES=2 ENGINE_CACHE=24 ENGINE_TIMED=2 \
#   ENGINE_KERNELS=compact,indexed bash benchmarks/gpu/static_decode_engine.sh /tmp/out
set -uo pipefail
OUT=${1:?usage: engine.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python}
STEPS=${ENGINE_STEPS:-tests,bench,gen,bf16,compiled}
START=$(date +%s)
BUDGET=${BUDGET:-150}
MODEL=${ENGINE_MODEL:-smollm2-135m}
CACHE=${ENGINE_CACHE:-324}
TIMED=${ENGINE_TIMED:-64}

step() {  # step NAME LIMIT_S CMD...: run with a limit (never past the budget), log to NAME.log, record the exit
  local name=$1 limit=$2; shift 2
  case ",$STEPS," in *",$name,"*) ;; *) return ;; esac
  local left=$(( BUDGET - ($(date +%s) - START) - 3 ))
  (( left < limit )) && limit=$left
  if (( limit < 5 )); then echo "$name: skipped (budget spent)" >> "$OUT/steps.txt"; return; fi
  local t0=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $?, $(( $(date +%s) - t0 )) s (limit $limit)" >> "$OUT/steps.txt"
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  $PY -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
} > "$OUT/device.txt" 2>&1

step tests 32 $PY -m pytest tests/test_static_triton.py tests/test_fast_decode.py -q -p no:cacheprovider \
  -k "(cuda and not compiled) or (kernel_matches and rotate and not no-rotate) or reads_only_live or triton_engine"
step bench 85 $PY -m kvlab bench eval streams --out "$OUT" --model "$MODEL" --dtypes float32 \
  --policies streamingllm --batches "${ENGINE_BATCHES:-256,64,1}" \
  --kernels "${ENGINE_KERNELS:-compact,triton,generate-nocompile}" --cache "$CACHE" --steps "$TIMED"
step gen 30 $PY -m kvlab bench eval streams --out "$OUT" --tag gen --model "$MODEL" --dtypes float32 \
  --policies streamingllm --batches 256 --kernels generate --cache "$CACHE" --steps "$TIMED"
step bf16 40 $PY -m kvlab bench eval streams --out "$OUT" --tag bf16 --model "$MODEL" --dtypes bfloat16 \
  --policies streamingllm --batches 256 --kernels compact,triton,generate-nocompile --cache "$CACHE" \
  --steps "$TIMED" --profile-batches ""
step compiled 30 $PY -m pytest tests/test_fast_decode.py -q -p no:cacheprovider -k "cuda_compiled and StreamingLLM"
echo "total: $(( $(date +%s) - START )) s" >> "$OUT/steps.txt"
cat "$OUT/steps.txt"
