#!/usr/bin/env bash
# How long each numbered notebook takes a student on one CPU core: every notebook's defaults, then its CI set, each
# pinned to a core of its own with one thread (taskset, KVLAB_THREADS=1, the GPU hidden), up to one notebook per
# core at once, each stopped at 6 min. Uses the GPU host's 16 idle cores; the GPU stays idle.
#
#   KVLAB_RESULTS=DIR bash benchmarks/gpu/notebook_times.sh        # at most 10 min on a 16-core host
#
# Writes under $KVLAB_RESULTS/benchmarks/results/notebook_times/: ci_1thread.{json,md} and
# defaults_cpu_1thread.{json,md} (the tables `python -m kvlab notebooks times stamp --ci ... --defaults ...` reads
# to write each notebook's run-time line), runs/<date>_{ci,defaults}.log and setup.log. A notebook stopped at its
# limit is a row "timeout" with the CPU seconds it had spent (stamped as "more than N min"), never an estimate.
# Inputs the staging lacks are replaced through the notebooks' own parameters (recorded in each row's parameters):
# 02 other_tokenizer "" without gemma3-270m; 11 other_models = the extra models present; 12 zeroshot_tasks = the
# tasks present. 15 writes under /tmp, never over the committed results.
# Knobs: CORES (default 0-15, or the cores there are), LIMIT (seconds per notebook, default 360), BUDGET (seconds
# for the whole topic, default 600), NOTEBOOKS (default all).
# SMOKE=1: notebook 00 only, on core 0, the same code: SMOKE=1 KVLAB_RESULTS=/tmp/x PY=.venv/bin/python bash ...
set -uo pipefail
PY=${PY:-python3}
: "${KVLAB_RESULTS:?KVLAB_RESULTS must name the folder the results are written under}"
START=$(date +%s)
D="$KVLAB_RESULTS/benchmarks/results/notebook_times"
mkdir -p "$D/runs"
# this launcher's own logs beside the tables: `notebooks times run` leaves them alone (kvlab/outputs.py: keep lines)
[ -f "$D/.kvlab-outputs" ] || printf 'keep: setup.log\nkeep: runs\n' > "$D/.kvlab-outputs"
# kvlab reads KVLAB_RESULTS as the committed results the notebooks compare with: the repository's, not this folder
export KVLAB_RESULTS="$PWD/benchmarks/results"
n=$(nproc)
CORES=${CORES:-0-$(( n < 16 ? n - 1 : 15 ))}
LIMIT=${LIMIT:-360}
BUDGET=${BUDGET:-600}
NOTEBOOKS=${NOTEBOOKS:-}
if [ "${SMOKE:-0}" = 1 ]; then CORES=0; NOTEBOOKS=00; LIMIT=${SMOKE_LIMIT:-240}; BUDGET=600; fi
STAMP=$(date -u +%Y-%m-%d)
LOG="$D/setup.log"
export CUDA_VISIBLE_DEVICES="" TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
unset MPLBACKEND
{
  echo "start $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname), $n cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  if ! "$PY" -c "import papermill, nbclient, ipykernel, psutil" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
    echo "wheels installed into /tmp/site: exit $?"
  fi
} > "$LOG" 2>&1
[ -d /tmp/site ] && export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}/tmp/site"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{
  "$PY" -c "import torch, transformers, papermill; print('torch', torch.__version__, 'transformers', \
transformers.__version__, 'papermill', papermill.__version__, 'cuda visible', torch.cuda.is_available())"
  echo "KVLAB_CACHE=${KVLAB_CACHE:-unset}"
  # the model's one-time conversion, so that 16 kernels do not all convert it at once
  "$PY" -c "import kvlab; kvlab.load_model('smollm2-135m', device='cpu'); print('smollm2-135m loads')"
} >> "$LOG" 2>&1

# optional inputs the staging lacks: each notebook runs without them through its own parameters
OVERRIDES=$("$PY" - <<'EOF' 2>> "$LOG"
import json, sys
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
print("assets missing:", [a for a in ("gemma3-270m", "qwen2.5-coder-0.5b", "mmlu", "hotpotqa", "squad", "piqa",
      "winogrande", "hellaswag", "arc-easy", "arc-challenge") if not have(a)], file=sys.stderr)
print("\n".join(args))
EOF
)
mapfile -t OVERRIDE_ARGS <<< "$OVERRIDES"
echo "overrides of the defaults: ${OVERRIDE_ARGS[*]}" | tee -a "$LOG"
cat "$LOG"

left() { echo $(( BUDGET - ($(date +%s) - START) - 15 )); }  # 15 s kept to write the tables
# the defaults first (the longer runs, each given its full limit), then the CI sets
echo "== the defaults, cores $CORES, limit $LIMIT s each (stopped by $(left) s from now)"
# shellcheck disable=SC2086
"$PY" -m kvlab notebooks times run --set defaults -p device cpu -p out /tmp/notebook-times-defaults \
  "${OVERRIDE_ARGS[@]}" --cores "$CORES" --timeout "$LIMIT" --deadline "$(left)" --out "$D" \
  --name defaults_cpu_1thread $NOTEBOOKS 2>&1 | tee "$D/runs/${STAMP}_defaults.log"
# shellcheck disable=SC2086
echo "== the CI sets, cores $CORES, limit $LIMIT s each (stopped by $(left) s from now)"
"$PY" -m kvlab notebooks times run --set ci -p out /tmp/notebook-times-ci --cores "$CORES" --timeout "$LIMIT" \
  --deadline "$(left)" --out "$D" --name ci_1thread $NOTEBOOKS 2>&1 | tee "$D/runs/${STAMP}_ci.log"
echo "done in $(( $(date +%s) - START )) s"
cat "$D/ci_1thread.md" "$D/defaults_cpu_1thread.md" 2>/dev/null
