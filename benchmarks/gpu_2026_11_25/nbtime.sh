#!/usr/bin/env bash
# Each numbered notebook at its defaults, on one CPU core with one thread, on the GPU machine's CPUs (the GPU hidden):
# the "Run time ... at the defaults" line of each notebook's first cell comes from here (issue 25).
#
#   bash benchmarks/gpu_2026_11_25/nbtime.sh OUTDIR [NN ...]   # from the repository root, plain `python`
#   round 1: NBTIME_BUDGET=540 (all 16)
#   round 2: NBTIME_CI=1 NBTIME_BUDGET=1280 ... OUTDIR 01 02 03 07 08 09 10 11 12 13 14 15
#   NBTIME_CI=1: the defaults on cores 2-13, and every notebook's CI set on cores 14-15 beside them (ci_1thread.*)
#
# Needs: KVLAB_CACHE with smollm2-135m and the corpora (set by the lead's staging); the wheels in .whl/ (papermill,
# nbclient, ipykernel and their needs, which the image lacks; installed into /tmp/site). Up to 14 notebooks run at
# once, each pinned to its own core of 2-15 with KVLAB_THREADS=1; each may run NBTIME_BUDGET - 30 s and all stop by
# the time budget (NBTIME_BUDGET, default 540 s, counted from this script's start). A notebook stopped at its limit
# is reported as "> N s" with the last cell it reached and its kernel's Python stacks (in the JSON's log_tail).
#
# Assets beyond the staged ones: a notebook whose optional inputs are missing runs without them, through its own
# parameters (recorded in the JSON beside each notebook's parameters), so its time is then a lower bound:
#   02  other_tokenizer "" without gemma3-270m (the second tokenizer's separator list only); MMLU needs mmlu
#   11  other_models = those of gemma3-270m / qwen2.5-coder-0.5b present (Figs. 2-3 on more models)
#   12  zeroshot_tasks = those of piqa / winogrande / hellaswag / arc-easy / arc-challenge present
#   08 needs hotpotqa and squad (QA); 15's default grid needs gemma3-270m and squad: these fail without them.
#
# Smoke test on a small machine (notebook 00 only, on core 0, no wheels installed: the environment has them):
#   PATH=$PWD/.venv/bin:$PATH NBTIME_SMOKE=1 bash benchmarks/gpu_2026_11_25/nbtime.sh /tmp/out
set -uo pipefail
OUT=${1:?usage: nbtime.sh OUTDIR [NN ...]}
shift
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
START=$(date +%s)
BUDGET=${NBTIME_BUDGET:-${BUDGET:-540}}
TIMEOUT=$(( BUDGET - 30 ))
LOG="$OUT/nbtime_setup.log"
{
  echo "start $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname), $(nproc) cores"
  grep -m1 "model name" /proc/cpuinfo
  if [ -z "${NBTIME_SMOKE:-}" ] && ls .whl/*.whl > /dev/null 2>&1; then
    python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    echo "wheels installed: exit $?"
  fi
} > "$LOG" 2>&1
if [ -z "${NBTIME_SMOKE:-}" ]; then
  export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export CUDA_VISIBLE_DEVICES="" TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
{
  python -c "import torch, transformers, papermill, nbclient, ipykernel; print('torch', torch.__version__, \
'transformers', transformers.__version__, 'papermill', papermill.__version__, 'nbclient', nbclient.__version__, \
'ipykernel', ipykernel.__version__, 'cuda visible', torch.cuda.is_available())"
  echo "KVLAB_CACHE=${KVLAB_CACHE:-unset}"
  # the model's one-time conversion, so that 14 kernels do not all convert it at once
  python -c "import kvlab; kvlab.load_model('smollm2-135m', device='cpu'); print('smollm2-135m loads')"
} >> "$LOG" 2>&1

# optional inputs present in the cache decide the overrides (see the header)
OVERRIDES=$(python - <<'EOF' 2>> "$LOG"
import json
from kvlab.assets.fetcher import asset_path

def have(name):
    try:
        return asset_path(name).exists()
    except Exception:
        return False

args = []
if not have("gemma3-270m"):
    args += ["-p", "other_tokenizer", '""']
args += ["-p", "other_models", json.dumps([m for m in ("gemma3-270m", "qwen2.5-coder-0.5b") if have(m)])]
tasks = [t for t in ("piqa", "winogrande", "hellaswag", "arc-easy", "arc-challenge") if have(t)]
args += ["-p", "zeroshot_tasks", json.dumps(tasks or ["piqa"])]
missing = [a for a in ("gemma3-270m", "qwen2.5-coder-0.5b", "mmlu", "hotpotqa", "squad", "piqa", "winogrande",
                       "hellaswag", "arc-easy", "arc-challenge") if not have(a)]
import sys
print("assets missing:", missing, file=sys.stderr)
print("\n".join(args))
EOF
)
mapfile -t OVERRIDE_ARGS <<< "$OVERRIDES"
echo "overrides: ${OVERRIDE_ARGS[*]}" >> "$LOG"

ELAPSED=$(( $(date +%s) - START ))
DEADLINE=$(( BUDGET - ELAPSED - 20 ))  # 20 s left to write the tables and pack the notebooks
echo "setup took ${ELAPSED} s; notebooks stop by ${DEADLINE} s from now" >> "$LOG"
CORES=2-15
NOTEBOOKS="10 09 04 01 02 03 06 07 08 11 12 15 05 13 14 00"  # the longest first: the two last wait for a free core
if [ $# -gt 0 ]; then NOTEBOOKS="$*"; fi
CI_PID=""
if [ -n "${NBTIME_CI:-}" ]; then
  # beside them, every notebook's CI set on two more idle cores, one after the other on each: the CI sets'
  # times on idle cores (the project's 2-core machine is shared, which inflates even CPU time)
  CORES=2-13
  CI_CORES=14-15
  CI_LIST=""  # all
  if [ -n "${NBTIME_SMOKE:-}" ]; then CI_CORES=1; CI_LIST=00; fi
  # shellcheck disable=SC2086
  python scripts/notebook_times.py run --set ci -p out /tmp/nbtime-leaderboard-ci --cores "$CI_CORES" --timeout 600 --deadline "$DEADLINE" \
    --out "$OUT" --name ci_1thread --keep-notebooks $CI_LIST > "$OUT/ci_1thread.log" 2>&1 &
  CI_PID=$!
fi
if [ -n "${NBTIME_SMOKE:-}" ]; then CORES=0; NOTEBOOKS=00; fi
# shellcheck disable=SC2086
python scripts/notebook_times.py run --set defaults -p device cpu -p out /tmp/nbtime-leaderboard \
  "${OVERRIDE_ARGS[@]}" --cores "$CORES" --timeout "$TIMEOUT" --deadline "$DEADLINE" --out "$OUT" --name nbtime \
  --keep-notebooks $NOTEBOOKS > "$OUT/nbtime.log" 2>&1
echo "notebook_times (defaults) exit $? at $(( $(date +%s) - START )) s" >> "$LOG"
if [ -n "$CI_PID" ]; then
  wait "$CI_PID"
  echo "notebook_times (CI sets) exit $? at $(( $(date +%s) - START )) s" >> "$LOG"
fi
FOLDERS=$(cd "$OUT" && ls -d nbtime_executed ci_1thread_executed 2>/dev/null)
# shellcheck disable=SC2086
tar -C "$OUT" -cJf "$OUT/nbtime_executed.tar.xz" $FOLDERS >> "$LOG" 2>&1 && (cd "$OUT" && rm -rf $FOLDERS)
echo "done at $(( $(date +%s) - START )) s" >> "$LOG"
