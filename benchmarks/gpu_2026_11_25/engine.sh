#!/usr/bin/env bash
# engine's GPU round (issue 28): the static decode engine at 1 / 64 / 256 streams on one H200, the cache layout
# before ("compact": every slot moved and re-rotated each step, masked SDPA) and after ("triton": entries never
# move, metadata-only compaction, one Triton kernel per layer that reads the live entries and re-rotates them as
# it reads), beside transformers' static generate at the same batch. Writes everything flat into OUTDIR:
#
#   bash benchmarks/gpu_2026_11_25/engine.sh OUTDIR        # from the repository root, plain `python`
#
# Steps (each with its own time limit and log; a failing step does not stop the others; steps.txt has the exits):
#   tests  GPU tests of the kernel and the engine: tests/test_static_triton.py (float64 oracle, indexed == compact,
#          greedy tokens), the CUDA tests of tests/test_fast_decode.py (graph replay == hooks engine)
#   bench  python -m kvlab bench eval streams: SmolLM2-135M-Instruct, StreamingLLM(4, cache_size=324) (the long-stream
#          runs' policy), caches filled first, 64 timed steps, batches 256/64/1, compact / triton / generate; the
#          256-stream step profiled (top GPU kernels; begin_step and end_step alone)   -> engine_streams.{json,md}
#   tune   the Triton kernel alone, a few tiles / warps / stages at the 256-stream shape -> engine_streams_tune.{json,md}
#   compiled  engine="compiled" with the Triton kernel inside torch.compile'd layers (one CUDA test)
# Environment: ENGINE_STEPS (tests,bench,compiled,tune), ENGINE_DTYPES (float32,bfloat16), ENGINE_BATCHES (256,64,1),
# ENGINE_KERNELS (compact,triton,generate), ENGINE_POLICIES (streamingllm), ENGINE_MODEL (smollm2-135m),
# ENGINE_CACHE (324), ENGINE_TIMED (64), BUDGET (seconds in all, 150).
# Smoke test on a CPU: ENGINE_STEPS=bench ENGINE_MODEL=random ENGINE_BATCHES=2 ENGINE_CACHE=24 ENGINE_TIMED=2 \
#   ENGINE_KERNELS=compact,indexed ENGINE_DTYPES=float32 bash benchmarks/gpu_2026_11_25/engine.sh /tmp/out
set -uo pipefail
OUT=${1:?usage: engine.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python}
STEPS=${ENGINE_STEPS:-tests,bench,compiled,tune}
START=$(date +%s)
BUDGET=${BUDGET:-150}

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

step tests 40 $PY -m pytest tests/test_static_triton.py tests/test_fast_decode.py -q -p no:cacheprovider \
  -k "(cuda and not compiled) or kernel_matches or reads_only_live or triton_engine"
LEFT=$(( BUDGET - ($(date +%s) - START) - 60 ))
step bench $(( LEFT > 5 ? LEFT : 5 )) $PY -m kvlab bench eval streams --out "$OUT" \
  --model "${ENGINE_MODEL:-smollm2-135m}" --dtypes "${ENGINE_DTYPES:-float32,bfloat16}" \
  --policies "${ENGINE_POLICIES:-streamingllm}" --batches "${ENGINE_BATCHES:-256,64,1}" \
  --kernels "${ENGINE_KERNELS:-compact,triton,generate}" --cache "${ENGINE_CACHE:-324}" \
  --steps "${ENGINE_TIMED:-64}" --budget-s $(( LEFT > 20 ? LEFT - 20 : 1 ))
# the kernel alone over a few tiles / warps / stages at the 256-stream shape
step tune 40 $PY -m kvlab bench eval streams --out "$OUT" --tag tune --kernels "" --tune \
  --dtypes "${ENGINE_DTYPES:-float32,bfloat16}" --batches "${ENGINE_BATCHES:-256,64,1}" --cache "${ENGINE_CACHE:-324}"
# engine="compiled" (torch.compile'd layers calling the Triton kernel, captured in the graph): one policy
step compiled 40 $PY -m pytest tests/test_fast_decode.py -q -p no:cacheprovider -k "cuda_compiled and StreamingLLM"
echo "total: $(( $(date +%s) - START )) s" >> "$OUT/steps.txt"
cat "$OUT/steps.txt"
