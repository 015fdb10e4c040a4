#!/usr/bin/env bash
# Issue 28, OrthoRank's routed layer and REFORM's fused scoring on one H200 (helper ortho-reform).
# Usage: bash benchmarks/gpu_2026_11_25/ortho-reform.sh OUTDIR   (from the repository root; plain python)
# Every step writes its log into OUTDIR, also when it fails; each has its own time limit (total ~175 s).
# SMOKE=1: tiny CPU configuration (Triton interpreter) to check the script itself.
set -uo pipefail
OUT=${1:?usage: ortho-reform.sh OUTDIR}
mkdir -p "$OUT"
PY=${PY:-python}
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

# 1. the kernels against the fp64 oracle, compiled on the GPU
step tests_orthorank 40 $PY -m pytest tests/test_orthorank.py -q -p no:cacheprovider -m triton \
  -k "rmsnorm or silu_mul or rope_heads or unmasked_prefix or causal_on_original or routed_layer_matches or router_matches"
step tests_reform 20 $PY -m pytest tests/test_reform.py -q -p no:cacheprovider -k "h2o_scores or triton_backend or backend_choice"

# 2. REFORM's scoring: eager vs fused at the run's shapes (budget 2048 + chunk) and at 256k keys, fp32 and bf16
step reform_scoring 25 $PY -m kvlab bench reform scoring --out "$OUT/reform_scoring.json" \
  --chunks 2048 8192 260096 --time-budget 0.3 --run-tokens 262144

# 3. OrthoRank: one routed layer of the 8B shape with a per-kernel profile, then the model's throughput
step ortho_layer 40 $PY -m kvlab bench orthorank layer --shapes 8b --budget 0.5 --backends triton --kernels \
  --out "$OUT" --tag h200_8b
step ortho_throughput 55 $PY -m kvlab bench orthorank throughput --shapes 8b --sparsities 20 --budget 0.5 \
  --backends triton --no-layer --out "$OUT" --tag h200_8b
ls -la "$OUT" >> "$OUT/steps.txt"
