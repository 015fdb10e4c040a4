#!/usr/bin/env bash
# The leaderboard's full grid on one GPU, then on two GPUs of the same host, then through the multi-host recipe
# (a `dask scheduler` and `python -m kvlab worker-env` workers started as separate processes): wall time, cells per
# device, GPU utilisation per device (nvidia-smi sampled every 0.5 s) and a check that every cell is identical.
#
#   KVLAB_RESULTS=DIR CUDA_VISIBLE_DEVICES=0,1 bash benchmarks/gpu/leaderboard_scaling.sh
#
# Needs two visible GPUs, SmolLM2-135M-Instruct and the corpora staged (scripts/gpu_stage.sh unpack) and Dask's wheels
# installed (the GPU image has no Dask). The kvpress rows are left out: kvpress needs transformers < 5.3 and runs in
# its own CPU environment (`bash scripts/peers.sh`). Knobs: WPG (workers per GPU, default 2), EXAMPLES (texts per
# length and depth of the question tasks, default the grid's 2), SEEDS (replicates, e.g. 0,1,2: a grid large enough
# that the fixed start of a run weighs little), SKIP_RECIPE=1, RUNS (one, two or both, default both: a grid too long
# for one call of the device tool runs "one" in a call and "two" in the next of the same lease; the runs are kept
# in /tmp/kvlab-leaderboard-runs between them, and the report is written once both are there).
# NAME: another grid size's results (leaderboard/gpus_NAME). SMOKE=1: the tiny grid on the CPU, one "GPU" lane.
set -uo pipefail
PY=${PY:-python3}
D="$KVLAB_RESULTS/benchmarks/results/leaderboard/gpus${NAME:+_$NAME}"  # each run beside it: ${D}_one_gpu ...
W=${RUNS_DIR:-/tmp/kvlab-leaderboard-runs}
RUNS=${RUNS:-both}
case "$RUNS" in one|two|both) ;; *) echo "RUNS must be one, two or both, got $RUNS" >&2; exit 2 ;; esac
[ "$RUNS" != both ] || rm -rf "$W"  # one and two: the other run may already be there
mkdir -p "$W"
mkdir -p "$D"
WPG=${WPG:-2}
METHODS=Full,StreamingLLM,H2O,TOVA,SepLLM,LaCache,REFORM,DHSA,OrthoRank
if [ "${SMOKE:-0}" = 1 ]; then
  GRID=(--grid tiny --tasks ppl,passkey --methods Full,StreamingLLM,H2O)
  RUN=(--workers 1)   # the smoke's "one GPU" lane: one CPU worker; its "two GPUs": two
  RUN2=(--workers 2)
else
  GRID=(--grid full --models smollm2-135m --methods "$METHODS" ${EXAMPLES:+--examples "$EXAMPLES"}
        ${SEEDS:+--seeds "$SEEDS"})
  RUN=(--gpu-workers auto --workers-per-gpu "$WPG")
  RUN2=("${RUN[@]}")
fi
DASK=(dask); command -v dask >/dev/null || DASK=("$PY" -m dask)

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$D/device.txt"
  nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader,nounits -lms 500 \
    >> "$W/gpu_util.csv" 2>/dev/null &
  SMI=$!
fi
all=${CUDA_VISIBLE_DEVICES:-0,1}
first=${all%%,*}

timed_run() {  # NAME DEVICES ARGS...: one leaderboard run on those GPUs into $W/NAME, wall seconds in $W/NAME.seconds
  local name=$1 devices=$2 t0 t1
  shift 2
  echo "== $name (GPUs $devices)"
  t0=$(date +%s.%N)
  CUDA_VISIBLE_DEVICES=$devices "$PY" -m kvlab leaderboard "${GRID[@]}" "$@" --out "$W/$name"
  t1=$(date +%s.%N)
  "$PY" -c "print($t1 - $t0)" > "$W/$name.seconds"
}
[ "$RUNS" = two ] || timed_run one_gpu "$first" "${RUN[@]}"
[ "$RUNS" = one ] || timed_run two_gpus "$all" "${RUN2[@]}"

if [ "${SKIP_RECIPE:-0}" != 1 ]; then
echo "== the multi-host recipe on this host: scheduler and workers as separate processes (perplexity cells)"
port=$(( 8786 + RANDOM % 500 ))
setsid "${DASK[@]}" scheduler --port "$port" --no-dashboard > "$W/scheduler.log" 2>&1 &
SCHED=$!
sleep 5
"$PY" -m kvlab worker-env "tcp://127.0.0.1:$port" ${SMOKE:+--cpu-workers 2} > "$W/recipe_workers.sh" 2> "$W/worker-env.err" \
  || { [ "${SMOKE:-0}" = 1 ] && "$PY" -m kvlab worker-env "tcp://127.0.0.1:$port" --cpu-workers 2 > "$W/recipe_workers.sh"; }
cp "$W/recipe_workers.sh" "$D/recipe_workers.txt"  # what worker-env printed, kept with the results as text
cat "$W/recipe_workers.sh"
setsid bash "$W/recipe_workers.sh" > "$W/workers.log" 2>&1 &
WORKERS=$!
n=$(grep -c "dask worker" "$W/recipe_workers.sh")
"$PY" -c "from distributed import Client; c = Client('tcp://127.0.0.1:$port', timeout=60); c.wait_for_workers($n, timeout=120); print(len(c.scheduler_info()['workers']), 'workers up'); c.close()"
t3=$(date +%s.%N)
if [ "${SMOKE:-0}" = 1 ]; then
  "$PY" -m kvlab leaderboard --grid tiny --tasks ppl --methods Full,StreamingLLM,H2O \
    --scheduler "tcp://127.0.0.1:$port" --out "$W/recipe"
else
  "$PY" -m kvlab leaderboard --grid full --models smollm2-135m --methods "$METHODS" ${EXAMPLES:+--examples "$EXAMPLES"} \
    --tasks ppl --scheduler "tcp://127.0.0.1:$port" --device gpu --out "$W/recipe"
fi
t4=$(date +%s.%N)
kill -- -"$WORKERS" -"$SCHED" 2>/dev/null; sleep 2
fi
[ -n "${SMI:-}" ] && kill "$SMI" 2>/dev/null

for run in one_gpu two_gpus recipe; do
  [ -d "$W/$run" ] || continue
  mkdir -p "${D}_$run"  # the results keep a run's cells in one file (kvlab.experiments.leaderboard.pack_cells)
  "$PY" -c "import sys; from kvlab.experiments.leaderboard import pack_cells; pack_cells(*sys.argv[1:])" \
    "$W/$run" "${D}_$run"
  cp "$W/$run/leaderboard.md" "$W/$run/leaderboard.csv" "$W/$run/pareto.png" "${D}_$run/" 2>/dev/null
done
cp "$W/scheduler.log" "$W/workers.log" "$W/gpu_util.csv" "$D/" 2>/dev/null
if [ ! -f "$W/one_gpu.seconds" ] || [ ! -f "$W/two_gpus.seconds" ]; then
  echo "RUNS=$RUNS: the report needs both runs; run RUNS=$([ "$RUNS" = one ] && echo two || echo one) next" \
    "(same lease: $W keeps this run)"
  exit 0
fi
s1=$(cat "$W/one_gpu.seconds"); s2=$(cat "$W/two_gpus.seconds")
[ "${SKIP_RECIPE:-0}" = 1 ] || s4=$("$PY" -c "print(round($t4 - $t3, 1))")
cmd="KVLAB_RESULTS=DIR CUDA_VISIBLE_DEVICES=$all bash benchmarks/gpu/leaderboard_scaling.sh (WPG=$WPG${EXAMPLES:+ EXAMPLES=$EXAMPLES}${SEEDS:+ SEEDS=$SEEDS}$([ "$RUNS" = both ] || echo "; the two runs in separate calls of one lease, RUNS=one and RUNS=two"))"
dev=$(head -2 "$D/device.txt" 2>/dev/null | tail -1 | cut -d, -f1)
"$PY" -m kvlab leaderboard scaling report --run "1 GPU=$W/one_gpu:$s1" --run "2 GPUs=$W/two_gpus:$s2" \
  --util "$W/gpu_util.csv" --command "$cmd" --device "$(nvidia-smi -L 2>/dev/null | wc -l) x ${dev:-CPU}" \
  > "$D/scaling.md"
[ "${SKIP_RECIPE:-0}" = 1 ] || echo "recipe (scheduler + worker-env workers as separate processes, perplexity cells): $s4 s" >> "$D/scaling.md"
[ "${SKIP_RECIPE:-0}" = 1 ] || "$PY" -m kvlab leaderboard scaling report --subset --run "2 GPUs=$W/two_gpus:$s2" --run "recipe=$W/recipe:$s4" \
  > "$D/recipe_vs_two_gpus.md" || true
cat "$D/scaling.md" "$D/recipe_vs_two_gpus.md" 2>/dev/null
rm -rf "$W"
