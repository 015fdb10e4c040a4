#!/usr/bin/env bash
# DHSA against block-sparse on a needle grid that can separate chunkings: the shipped predictor (layer 0, keys with
# RoPE undone: chunks that follow the text), the authors' protocol, budgets 512 and 1024, 8K-token prompts.
#
#   KVLAB_RESULTS=DIR GPUS=0,1,2,3 bash benchmarks/gpu/dhsa_needle_separating.sh   # ~45 GPU-min in all
#   SMOKE=1 KVLAB_RESULTS=/tmp/x PY=.venv/bin/python bash benchmarks/gpu/dhsa_needle_separating.sh   # tiny, CPU
#
# 1. pilot: dense and block-sparse (authors' protocol) at depths 0.2 .. 0.8 of 8,192-token prompts, PILOT_TRIALS
#    haystacks (default 6); `python -m kvlab run dhsa-needle-separating depths` keeps the depths whose needle lies past the keys
#    every query keeps (token >= 1,152), where dense is below the ceiling (<= 0.95) and >= 0.15 above block-sparse
#    at both budgets. DEPTHS=0.3,0.5 skips the pilot; LENGTH=4096 runs 4K-token prompts instead (if 8K leaves
#    dense below the ceiling nowhere above the sparse methods, the pilot says so and the topic stops).
# 2. grid: dense, DHSA and block-sparse (authors' protocol: 128-query blocks, 128 initial + 128 recent keys, heads
#    shared, dense question and decode; DHSA's chunks uncut at p > sigmoid(1.1); block-sparse: fixed 128-token key
#    chunks, one change) at the chosen depths, TRIALS haystacks each (default 72: about 288 prompts over four
#    depths, sized so that a 0.05 gap has ~80 % power at the paired spread 0.3 of the earlier grid), split over
#    GPUS (default: CUDA_VISIBLE_DEVICES; GPUS=0,1,2,3 runs four shards of trials at once). Each shard stops
#    starting prompts after NEEDLE_SECONDS (default 2400).
# 3. summary: DHSA - block-sparse per budget (paired bootstrap), dense - block-sparse, and the control
#    block-sparse 1024 - block-sparse 512 (+0.059 in the earlier 4K grid): the grid detects a 0.05 difference when the
#    control's interval excludes 0.
# Writes $KVLAB_RESULTS/benchmarks/results/dhsa/dhsa_needle_separating_8k.{pilot.examples.jsonl.gz,examples.jsonl.gz (the
# shards' gzip members joined), depths.txt, summary.json}, the shards' folders shards/K/ and the logs in
# $KVLAB_RESULTS/logs/ (python -m kvlab run dhsa-needle and dhsa-needle-separating).
set -uo pipefail
PY=${PY:-python3}
: "${KVLAB_RESULTS:?set KVLAB_RESULTS to the results folder}"
D="$KVLAB_RESULTS/benchmarks/results/dhsa"
L="$KVLAB_RESULTS/logs"
mkdir -p "$L"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
NAME=dhsa_needle_separating_8k
if [ "${SMOKE:-0}" = 1 ]; then
  COMMON=(--lengths 8192 --budgets 512,1024 --smoke)
  PILOT_DEPTHS=0.3,0.6; PILOT_TRIALS=1; TRIALS=${TRIALS:-2}; CAP=60; SEL=(--smoke)
  BUDGETS=512,1024
else
  COMMON=(--lengths "${LENGTH:-8192}" --budgets 512,1024 --max-new-tokens 16)
  PILOT_DEPTHS=0.2,0.3,0.4,0.5,0.6,0.7,0.8; PILOT_TRIALS=${PILOT_TRIALS:-6}; TRIALS=${TRIALS:-72}
  CAP=${NEEDLE_SECONDS:-2400}; SEL=(); BUDGETS=512,1024
fi
IFS=, read -ra GPU_LIST <<< "${GPUS:-${CUDA_VISIBLE_DEVICES:-0}}"  # GPUS=0,1,2,3: one shard of trials per GPU
SHARDS=${#GPU_LIST[@]}
RUN=("$PY" -m kvlab run dhsa-needle --model smollm2-135m --predictor shipped --protocols authors
     --backend sdpa "${COMMON[@]}")

DEPTHS=${DEPTHS:-}
if [ -z "$DEPTHS" ]; then
  echo "== pilot: dense and block-sparse at depths $PILOT_DEPTHS, $PILOT_TRIALS haystacks"
  t0=$(date +%s)
  "${RUN[@]}" --depths "$PILOT_DEPTHS" --trials "$PILOT_TRIALS" --baselines dense,block-sparse --max-seconds "$CAP" \
    --name "$NAME.pilot" --out "$D" 2>&1 | grep -v "Loading weights" > "$L/$NAME.pilot.log"
  tail -8 "$L/$NAME.pilot.log"
  # the pilot's DHSA rows are not used for the choice: only dense and block-sparse decide which depths separate
  "$PY" -m kvlab run dhsa-needle-separating depths --records "$D/$NAME.pilot.examples.jsonl.gz" --budgets "$BUDGETS" \
    "${SEL[@]}" --name "$NAME" --out "$D" > "$L/$NAME.depths.log" 2>&1
  DEPTHS=$(cat "$D/$NAME.depths.txt")
  [ -n "$DEPTHS" ] || { echo "no depth separates dense from block-sparse: see $L/$NAME.pilot.log" >&2; exit 1; }
  echo "pilot: $(( $(date +%s) - t0 )) s; depths $DEPTHS"
fi

echo "== grid: depths $DEPTHS, $TRIALS haystacks, $SHARDS shard(s)"
t0=$(date +%s)
pids=(); files=()
for ((s = 0; s < SHARDS; s++)); do
  first=$(( s * TRIALS / SHARDS )); last=$(( (s + 1) * TRIALS / SHARDS ))
  f="$D/shards/$s/$NAME.examples.jsonl.gz"; files+=("$f")
  CUDA_VISIBLE_DEVICES=${GPU_LIST[$s]} "${RUN[@]}" --depths "$DEPTHS" --trials "$TRIALS" --first-trial "$first" \
    --last-trial "$last" --baselines dense,block-sparse --max-seconds "$CAP" --name "$NAME" --out "$D/shards/$s" 2>&1 \
    | grep -v "Loading weights" > "$L/$NAME.shard$s.log" &
  pids+=($!)
done
wait "${pids[@]}"
echo "grid: $(( $(date +%s) - t0 )) s"
tail -6 "$L/$NAME.shard0.log"
joined=$(IFS=,; echo "${files[*]}")
"$PY" -m kvlab run dhsa-needle-separating summary --records "$joined" --budgets "$BUDGETS" "${SEL[@]}" --name "$NAME" \
  --out "$D"
# one records file for the ledger (its rows name one file): the shards' gzip members joined (a valid gzip stream)
cat "${files[@]}" > "$D/$NAME.examples.jsonl.gz"
