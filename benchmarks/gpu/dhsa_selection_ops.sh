#!/usr/bin/env bash
# DHSA's selection as GPU work, measured beside the kernel: the fast selection's GPU tests against the reference,
# the kernel table's DHSA row (`bench dhsa ops`, 32k, 32 x 128 heads: kernel, selection and chunking in one run, the
# reference selection's time beside the fast one) and the end-to-end prefill of Gemma2-2b's shape (DHSA in all 26
# layers, 16k and 32k, SDPA beside it). Writes under $KVLAB_RESULTS/benchmarks/results/dhsa/selection_gpu/.
#
#   KVLAB_RESULTS=DIR bash benchmarks/gpu/dhsa_selection_ops.sh          # on the GPU host (a topic of run.sh)
#   SMOKE=1 KVLAB_RESULTS=/tmp/x PY=.venv/bin/python bash benchmarks/gpu/dhsa_selection_ops.sh   # CPU: tests + tiny e2e
set -uo pipefail
PY=${PY:-python}
D=${KVLAB_RESULTS:?set KVLAB_RESULTS}/benchmarks/results/dhsa/selection_gpu
mkdir -p "$D"
step() {  # step NAME CMD...: log to NAME.log, the exit to steps.txt; a failing step does not stop the others
  local name=$1 t0; shift; t0=$(date +%s)
  PYTHONUNBUFFERED=1 "$@" > "$D/$name.log" 2>&1
  echo "$name: exit $?, $(( $(date +%s) - t0 )) s" | tee -a "$D/steps.txt"
}
if [ "${SMOKE:-0}" = 1 ]; then
  TRITON_INTERPRET=1 step tests "$PY" -m pytest tests/test_dhsa_fast_selection.py -q -x -p no:cacheprovider
  step e2e "$PY" -m kvlab run dhsa-prefill-e2e --out "$D/e2e" --smoke --methods sdpa,dhsa-pred-shared --kernels packed
  exit 0  # (the smoke keeps its e2e folder)
fi
step tests "$PY" -m pytest tests/test_dhsa_fast_selection.py tests/test_dhsa_kernel.py -q -p no:cacheprovider \
  -k "fast or cuda or auto"
step ops "$PY" -m kvlab bench dhsa ops --seqs 32768 --share 0,1 --variants packed --chunkings fixed64,spaced64 \
  --no-flex --time-budget 0.4 --out "$D/ops" --tag h200
step e2e "$PY" -m kvlab run dhsa-prefill-e2e --out "$D/e2e" --shapes gemma2-2b-global --seqs 32768,16384 \
  --methods sdpa,dhsa-pred-shared --combos packed:1 --repeats 3 --no-compile
# the results folder holds files, not folders (TOPIC/RUN/FILE): each command wrote a folder of its own, lifted here
for sub in ops e2e; do [ -d "$D/$sub" ] && find "$D/$sub" -maxdepth 1 -type f ! -name .kvlab-outputs -exec mv {} "$D/" \; \
  && rm -rf "$D/$sub"; done
