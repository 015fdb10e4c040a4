#!/usr/bin/env bash
# The book's executed copies: notebooks 01, 03, 05, 06, 07, 10, 12 and 15 run through papermill with their book
# parameter sets (notebooks/params/NN_name.book.yaml), several at a time on one GPU, each under its own time limit;
# each copy is stamped with a hash of its notebook's code cells and of its book set (python -m kvlab notebooks book) so
# that tests/test_book.py can tell when it goes stale.
#
#   KVLAB_RESULTS=DIR CUDA_VISIBLE_DEVICES=0 bash benchmarks/gpu/book_notebooks.sh     # about 9 min on one H100
#
# Writes $KVLAB_RESULTS/book/executed/NN_name.ipynb (copy these over book/executed/ and commit them) and
# $KVLAB_RESULTS/benchmarks/results/book_notebooks/{times.tsv,logs/NN.log,device.txt}: per notebook its exit code,
# seconds and limit, and the log of a failed or stopped one. A notebook stopped at its limit or failing leaves no
# copy (the book then shows the CI-executed notebook and says so).
# Knobs: NOTEBOOKS (default "01 03 05 06 07 10 12 15"), JOBS (notebooks at once, default 8), LIMIT (seconds each,
# default 500), THREADS (torch CPU threads per notebook, default the cores / JOBS), DEVICE (default: cuda when torch
# sees a GPU, else cpu).
# SMOKE=1: the same machinery at tiny sizes on the CPU: each notebook's CI set (notebooks/params/NN_name.ci.yaml),
# notebook 05 only unless NOTEBOOKS is set; the copies are stamped as CI-set copies, which tests/test_book.py refuses.
#   SMOKE=1 KVLAB_RESULTS=/tmp/x PY=.venv/bin/python bash benchmarks/gpu/book_notebooks.sh
set -uo pipefail
PY=${PY:-python3}
: "${KVLAB_RESULTS:?KVLAB_RESULTS must name the folder the results are written under}"
COPIES="$KVLAB_RESULTS/book/executed"
R="$KVLAB_RESULTS/benchmarks/results/book_notebooks"
mkdir -p "$COPIES" "$R/logs"
# kvlab reads KVLAB_RESULTS as the folder of the committed results the notebooks compare with: the notebooks must
# find the repository's benchmarks/results there, not this topic's output folder
export KVLAB_RESULTS="$PWD/benchmarks/results"
SET=book
if [ "${SMOKE:-0}" = 1 ]; then
  SET=ci
  NOTEBOOKS=${NOTEBOOKS:-05}
  LIMIT=${LIMIT:-300}
  DEVICE=${DEVICE:-cpu}
fi
NOTEBOOKS=${NOTEBOOKS:-01 03 05 06 07 10 12 15}
LIMIT=${LIMIT:-500}
JOBS=${JOBS:-8}
CORES=$(nproc)
THREADS=${THREADS:-$(( CORES / JOBS > 0 ? CORES / JOBS : 1 ))}
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 BOOK_NOTEBOOKS_RUN=$$
unset MPLBACKEND  # the kernels' inline backend makes figures outputs (a non-interactive backend would drop them)

# papermill, nbclient and ipykernel: the GPU image lacks them; the wheels travel in .whl/ (benchmarks/gpu/README.md)
if ! "$PY" -c "import papermill, nbclient, ipykernel" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    > "$R/logs/wheels.log" 2>&1
  export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}/tmp/site"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -z "${DEVICE:-}" ]; then
  DEVICE=$("$PY" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')" 2>/dev/null || echo cpu)
fi
{
  date -u '+%Y-%m-%d %H:%M UTC'
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no GPU"
  echo "$CORES cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  "$PY" -c "import torch, transformers, papermill; print('torch', torch.__version__, 'transformers', \
transformers.__version__, 'papermill', papermill.__version__)"
  echo "set $SET, device $DEVICE, $JOBS at once, $THREADS threads each, limit $LIMIT s each"
} > "$R/device.txt" 2>&1
cat "$R/device.txt"

MODELS=smollm2-135m
# notebook 15's book set is the leaderboard's default grid, which needs gemma3-270m: left out where it is not staged
if [[ " $NOTEBOOKS " == *" 15 "* ]] && [ "$SET" = book ] && ! "$PY" -c "
import sys
from kvlab.assets.fetcher import asset_path
sys.exit(0 if asset_path('gemma3-270m').exists() else 1)" 2>/dev/null; then
  NOTEBOOKS=$(echo " $NOTEBOOKS " | sed 's/ 15 / /; s/^ *//; s/ *$//')
  echo "15: gemma3-270m is not staged here, so the leaderboard's default grid cannot run: left out" \
    | tee -a "$R/device.txt"
elif [[ " $NOTEBOOKS " == *" 15 "* ]] && [ "$SET" = book ]; then
  MODELS="$MODELS gemma3-270m"
fi
# each model's one-time conversion here, so that the notebooks (and notebook 15's Dask workers) do not all convert it
for m in $MODELS; do
  "$PY" -c "import kvlab; kvlab.load_model('$m', device='cpu'); print('$m loads')" \
    || echo "$m did not load here: the notebooks will say why"
done
T0=$(date +%s)
[ -s "$R/times.tsv" ] || printf "notebook\texit\tseconds\tlimit_s\n" > "$R/times.tsv"  # two runs into one folder: both rows
one() {  # NN: one notebook under its limit; its line in times.tsv
  local nn=$1 t0 rc
  t0=$(date +%s)
  timeout -k 20 "$LIMIT" "$PY" -m kvlab notebooks book "$nn" --set "$SET" --out "$COPIES" \
    -p device "$DEVICE" -p num_threads "$THREADS" > "$R/logs/$nn.log" 2>&1
  rc=$?
  printf "%s\t%s\t%s\t%s\n" "$nn" "$rc" "$(( $(date +%s) - t0 ))" "$LIMIT" >> "$R/times.tsv"
  echo "[$(( $(date +%s) - T0 )) s] $nn: exit $rc$([ $rc = 124 ] && echo " (stopped at $LIMIT s)") after" \
    "$(( $(date +%s) - t0 )) s: $(tail -1 "$R/logs/$nn.log" | cut -c1-200)"
}
for nn in $NOTEBOOKS; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 1; done
  echo "[$(( $(date +%s) - T0 )) s] start $nn"
  one "$nn" &
done
wait
# a kernel whose papermill was stopped at its limit may outlive it: end those this run started (marked in their
# environment), so they hold neither the GPU nor a core for the next topic
for p in /proc/[0-9]*; do
  [ "${p#/proc/}" = $$ ] && continue
  grep -qz "^BOOK_NOTEBOOKS_RUN=$$\$" "$p/environ" 2>/dev/null && kill -9 "${p#/proc/}" 2>/dev/null
done
rm -f "$COPIES"/*.partial.ipynb  # what a stopped notebook had reached: not a copy
echo "done in $(( $(date +%s) - T0 )) s; copies:"
ls -la "$COPIES"
du -sh "$COPIES"
