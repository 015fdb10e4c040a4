#!/usr/bin/env bash
# The kernel table of the benchmark README, re-measured in one call with the project's own commands (random weights:
# no model assets, so a lease can start with it): the static decode engine at 256 streams (default kernel config and
# the tuned one, each beside compiled `generate`, with the kernel-alone tile sweep), OrthoRank's routed layer against
# SLEB, SepLLM's forward and backward against SDPA (the default tiles beside the window-tile options the last sweep
# pointed at), DHSA's kernel with its selection and chunking, and DHSA end to end in Gemma2-2b's shape with its
# non-attention floor. The GPU tests of the kernels changed since the last lease run first.
# Writes under $KVLAB_RESULTS/benchmarks/results/kernels/limits_<card>/ (limits_h200 on an H200; each command's
# files prefixed by its step).
#
#   KVLAB_RESULTS=DIR bash benchmarks/gpu/kernel_limits.sh                 # on the GPU host (a topic of run.sh)
#   SMOKE=1 KVLAB_RESULTS=/tmp/x PY=.venv/bin/python bash benchmarks/gpu/kernel_limits.sh   # CPU: the kernels' tests
set -uo pipefail
PY=${PY:-python}
# the results folder is named by the card (limits_h200, limits_h100): timings of two cards never share a folder
GPU_TAG=${GPU_TAG:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 \
  | grep -o -i 'h[0-9]00' | tr 'H' 'h')}
GPU_TAG=${GPU_TAG:-gpu}
D=${KVLAB_RESULTS:?set KVLAB_RESULTS}/benchmarks/results/kernels/limits_$GPU_TAG
STEPS=${STEPS:-tests engine bound tuned orthorank sepllm dhsa e2e}
mkdir -p "$D"
step() {  # step NAME LIMIT CMD...: log to NAME.log, the exit to steps.txt; a failing step does not stop the others
  local name=$1 limit=$2 t0; shift 2
  case " $STEPS " in *" $name "*) ;; *) return ;; esac
  t0=$(date +%s)
  PYTHONUNBUFFERED=1 timeout -k 5 "$limit" "$@" > "$D/$name.log" 2>&1
  echo "$name: exit $?, $(( $(date +%s) - t0 )) s (limit $limit)" | tee -a "$D/steps.txt"
}
if [ "${SMOKE:-0}" = 1 ]; then
  TRITON_INTERPRET=1 step tests 900 "$PY" -m pytest tests/test_static_triton.py -q -x -p no:cacheprovider \
    -k "oracle or live_entries"
  exit 0
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  "$PY" -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
  } > "$D/device.txt" 2>&1
ENGINE=(--model random --dtypes float32 --policies streamingllm --cache 324 --batches 256 --steps 64
        --profile-batches 256)
step tests 120 "$PY" -m pytest tests/test_static_triton.py tests/test_fast_decode.py \
  tests/test_bad_inputs.py::test_static_triton_opt_in_configs_ignore_dead_slots -q -p no:cacheprovider --full \
  -k "cuda or reads_only_live or triton_engine or dead_slots"
step engine 150 "$PY" -m kvlab bench eval streams "${ENGINE[@]}" --kernels triton,generate --tune --out "$D/engine"
# the kernel alone: tile sweep, then the default tiles' loads alone and arithmetic alone (what bounds it)
step bound 90 "$PY" -m kvlab bench eval streams --model random --dtypes float32 --cache 324 --batches 256 \
  --kernels "" --tune --out "$D/bound"
KVLAB_STATIC_TUNE=1 step tuned 150 "$PY" -m kvlab bench eval streams "${ENGINE[@]}" --kernels triton,generate \
  --out "$D/tuned"
step orthorank 60 "$PY" -m kvlab bench orthorank throughput --shapes 8b --sparsities 20 --budget 0.3 \
  --backends triton --no-layer --kernels --out "$D/orthorank" --tag $GPU_TAG
step sepllm 100 "$PY" -m kvlab bench sepllm ops --seqs 32768 --variants tma,tma+w64,tma+diag,tma+rerun --budget 0.3 \
  --no-flex --out "$D/sepllm" --tag $GPU_TAG
step dhsa 60 "$PY" -m kvlab bench dhsa ops --seqs 32768 --share 0,1 --variants packed --chunkings fixed64,spaced64 \
  --no-flex --time-budget 0.4 --out "$D/dhsa" --tag $GPU_TAG
step e2e 100 "$PY" -m kvlab run dhsa-prefill-e2e --out "$D/e2e" --shapes gemma2-2b-global --seqs 32768,16384 \
  --methods sdpa,dhsa-pred-shared --combos packed:1 --repeats 3 --no-compile
# the results folder holds files, not folders (TOPIC/RUN/FILE): each command's folder is lifted, its files prefixed
for sub in engine bound tuned orthorank sepllm dhsa e2e; do
  [ -d "$D/$sub" ] || continue
  find "$D/$sub" -maxdepth 1 -type f ! -name .kvlab-outputs | while read -r f; do mv "$f" "$D/${sub}_$(basename "$f")"; done
  rm -rf "$D/$sub"
done
cat "$D/steps.txt"
