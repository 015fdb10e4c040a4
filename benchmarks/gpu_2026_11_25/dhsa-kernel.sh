#!/usr/bin/env bash
# dhsa-kernel's GPU round (issue 24): DHSA's Triton kernel on one H200 against SDPA in the same run, and the
# end-to-end prefill in the paper's setup. Writes everything flat into OUTDIR:
#
#   bash benchmarks/gpu_2026_11_25/dhsa-kernel.sh OUTDIR        # from the repository root, plain `python`
#
# Steps (each with its own time limit and log; a failing step does not stop the others; steps.txt has the exits).
# DHSA_ROUND=1 is what ran in round 1 (01:22 UTC; its tune steps swept the tiles, TMA and packing); the default
# (round 2) measures the chosen defaults:
#   tests   the kernel's GPU tests (production tile sizes, float64 oracle): tests/test_dhsa_kernel.py
#   ops     python -m kvlab bench dhsa ops at 32k, 32 x 128 heads: SDPA, kernel "lists" (before), "packed" (now) and
#           "packed+lazy" in one run, fixed 64-token and predictor-like chunks, the packed kernel's loads-only and
#           hot-keys diagnostics (its traffic and arithmetic limits)                  -> dhsa_ops_h200.{json,md}
#   e2e     benchmarks/dhsa_prefill_e2e.py, Gemma2-2b shape (DHSA in all 26 layers), 16k and 32k: SDPA vs the
#           paper's setup with the earlier kernel (selection per head) and the packed one (one selection, as the
#           authors' code averages heads); dense attention alone timed beside SDPA   -> dhsa_prefill_e2e.{json,md}
#   ops_gemma2  the same ops at the e2e layer's shape (8 / 4 heads, dim 256, one selection)
#                                                                                  -> dhsa_ops_h200_gemma2.{json,md}
# Smoke test on a CPU (interpreter tests and a tiny e2e only): DHSA_SMOKE=1 bash ... /tmp/out
set -uo pipefail
OUT=${1:?usage: dhsa-kernel.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python}
SMOKE=${DHSA_SMOKE:-0}
STEPS=${DHSA_STEPS:-tests,ops,e2e,tune_gemma2,tune,ops_gemma2}
START=$(date +%s)
BUDGET=${BUDGET:-177}

step() {  # step NAME LIMIT_S CMD...: run with a limit (never past the budget), log to NAME.log, record the exit
  local name=$1 limit=$2; shift 2
  case ",$STEPS," in *",$name,"*) ;; *) return ;; esac
  local left=$(( BUDGET - ($(date +%s) - START) ))
  (( left < limit )) && limit=$left
  if (( limit < 5 )); then echo "$name: skipped (budget spent)" >> "$OUT/steps.txt"; return; fi
  local t0=$(date +%s)
  PYTHONUNBUFFERED=1 timeout -k 5 "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $?, $(( $(date +%s) - t0 )) s (limit $limit s)" >> "$OUT/steps.txt"
}

{ date -u '+%Y-%m-%d %H:%M:%S UTC'; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" 2>&1
  git log --oneline -1 2>&1; } > "$OUT/device.txt"

if [ "$SMOKE" = 1 ]; then
  step tests 300 $PY -m pytest tests/test_dhsa_kernel.py -q -x -p no:cacheprovider -k "configs"
  step e2e 300 $PY benchmarks/dhsa_prefill_e2e.py --out "$OUT" --shapes tiny-global --seqs 256 --budget 64 \
    --initial 4 --local 4 --chunk 16 --max-len 16 --repeats 1 --methods sdpa,dhsa-pred-shared --kernels packed
  exit 0
fi

case "${DHSA_ROUND:-2}" in
1)  # round 1 (2026-11-25 01:22 UTC): first look, the tile sweeps
step tests 20 $PY -m pytest tests/test_dhsa_kernel.py -q -p no:cacheprovider -k "cuda or run_loads or lazy"
step ops 45 $PY -m kvlab bench dhsa ops --seqs 32768 --share 0,1 --variants lists,packed \
  --chunkings fixed64,spaced64 --no-flex --diagnose --time-budget 0.4 --out "$OUT" --tag h200
step e2e 60 $PY benchmarks/dhsa_prefill_e2e.py --out "$OUT" --shapes gemma2-2b-global --seqs 16384,32768 \
  --methods sdpa,dhsa-pred-shared --kernels lists,packed --share-heads 0,1 --repeats 2 --no-compile
# the e2e layer's shape (Gemma2-2b: 8 heads, 4 key/value heads, dim 256), one selection, predictor-like chunks
step tune_gemma2 25 $PY -m kvlab bench dhsa tune --seq 32768 --heads 8 --kv-heads 4 --dim 256 --share-tune 1 \
  --budget-keys 2048 --initial 128 --variant packed --chunkings spaced64 --out "$OUT" --tag h200_gemma2 --configs \
  '[{"ROWS":64,"PACK":2,"BLOCK_N":32,"num_warps":8,"num_stages":2,"LONG_ROWS":0},
    {"ROWS":32,"PACK":2,"BLOCK_N":32,"num_warps":4,"num_stages":2,"LONG_ROWS":64,"LONG_WARPS":8},
    {"ROWS":64,"PACK":2,"BLOCK_N":64,"num_warps":8,"num_stages":2,"LONG_ROWS":0},
    {"ROWS":64,"PACK":1,"BLOCK_N":32,"num_warps":4,"num_stages":2,"LONG_ROWS":128,"LONG_WARPS":8},
    {"ROWS":32,"PACK":2,"BLOCK_N":32,"num_warps":4,"num_stages":3,"LONG_ROWS":64,"LONG_WARPS":8}]'
step tune 20 $PY -m kvlab bench dhsa tune --seq 32768 --variant packed --chunkings fixed64 \
  --grid 64:64:4:2,3 --runs 0,1,2 --out "$OUT" --tag h200 ;;
*)  # round 2: the defaults chosen from round 1, measured against SDPA and the earlier kernel in one run
step tests 22 $PY -m pytest tests/test_dhsa_kernel.py -q -p no:cacheprovider -k "cuda or run_loads or lazy or auto"
step ops 40 $PY -m kvlab bench dhsa ops --seqs 32768 --share 0 --variants lists,packed,packed+lazy \
  --chunkings fixed64,spaced64 --no-flex --diagnose --time-budget 0.4 --out "$OUT" --tag h200
step e2e 85 $PY benchmarks/dhsa_prefill_e2e.py --out "$OUT" --shapes gemma2-2b-global --seqs 16384,32768 \
  --methods sdpa,dhsa-pred-shared --combos lists:0,packed:1 --repeats 2 --no-compile
step ops_gemma2 30 $PY -m kvlab bench dhsa ops --seqs 32768 --heads 8 --kv-heads 4 --dim 256 --initial 128 \
  --share 1 --variants lists,packed,packed+lazy --chunkings spaced64,fixed64 --no-flex --time-budget 0.4 \
  --out "$OUT" --tag h200_gemma2 ;;
esac
exit 0
