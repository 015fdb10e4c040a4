#!/usr/bin/env bash
# Issue 28, OrthoRank's routed layer and REFORM's fused scoring on one H200 (helper ortho-reform).
# Usage: bash benchmarks/gpu/orthorank_routed_reform_scoring.sh OUTDIR   (from the repository root; plain python)
# Every step writes its log into OUTDIR, also when it fails; each has its own time limit (total <= 180 s).
# SMOKE=1: the changed kernels' tests on the CPU interpreter (checks the script itself).
set -uo pipefail
OUT=${1:?usage: ortho-reform.sh OUTDIR}
mkdir -p "$OUT"
PY=${PY:-python}
export PYTHONUNBUFFERED=1  # a step cut by its time limit still leaves what it printed
step() {  # step NAME SECONDS CMD...: run with a limit, log to OUT/NAME.log, record the exit status
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc seconds=$(( $(date +%s) - t0 ))" | tee -a "$OUT/steps.txt"
}
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv 2>&1; $PY -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"; } > "$OUT/device.txt" 2>&1

if [ "${SMOKE:-0}" = 1 ]; then
  export TRITON_INTERPRET=1
  step tests 600 $PY -m pytest tests/test_orthorank.py -q -x -p no:cacheprovider -k "rmsnorm or silu_mul or unmasked_prefix"
  exit 0
fi

# 1. OrthoRank's changed kernels against the fp64 oracle, compiled on the GPU
step tests_orthorank 20 $PY -m pytest tests/test_orthorank.py -q -p no:cacheprovider -m triton \
  -k "rmsnorm or silu_mul or unmasked_prefix or causal_on_original"
# 2. the 8B shape's prefill throughput at 20 %: dense, SLEB, OrthoRank (Triton), one forward of each profiled
step ortho_throughput 50 $PY -m kvlab bench orthorank throughput --shapes 8b --sparsities 20 --budget 0.3 \
  --backends triton --no-layer --kernels --out "$OUT" --tag h200_8b
# 3. REFORM's kernels against the fp64 oracle; auto picks them on CUDA
step tests_reform 45 $PY -m pytest tests/test_reform.py -q -p no:cacheprovider -k "h2o_scores or compress_matches or backend_choice"
# 4. REFORM's scoring, eager vs fused, fp32 and bf16: one call at the run's shape (2048 + 2048 keys) and at 256k keys,
#    then every scoring call of a 1M-token pass (random inputs, synchronised per call like the profile's timers)
step reform_scoring 40 $PY -m kvlab bench reform scoring --out "$OUT/reform_scoring.json" \
  --chunks 2048 260096 --time-budget 0.2 --run-tokens 1048576
# 5. a 256k-token REFORM pass, time split per phase, eager then fused (random-weight SmolLM2 shape, fp32)
step reform_profile 25 $PY -m kvlab bench reform profile --lengths 262144 --profile --backends torch triton \
  --out "$OUT/reform_profile_256k.json"
ls -la "$OUT" >> "$OUT/steps.txt"
