#!/usr/bin/env bash
# dhsa-pred (issue 24): DHSA's fast chunking on one H200 -- GPU tests of kvlab/dhsa/chunking.py, the predictor-time
# benchmark (fast path beside the old ones and one layer's SDPA, 32k tokens), and a boundary predictor at the paper's
# size (hidden 256) trained on 500 windows of 1024 tokens of five corpora (labels from SmolLM2-135M-Instruct).
#
#   bash benchmarks/gpu/dhsa_predictor_training.sh OUTDIR      # plain python, repository root, <= 235 s on one H200
#   SMOKE=1 bash benchmarks/gpu/dhsa_predictor_training.sh OUTDIR   # tiny CPU run of the same steps (interpreter)
#
# Writes into OUTDIR: tests.log, bench.log, predictor_time/dhsa_predictor_time.{json,md,examples.jsonl.gz}
# (python -m kvlab run dhsa-predictor-time), train.log,
# smollm2-135m-h256.{pt,json} (the predictor and its sidecar: command, sha256, held-out metrics, the shipped
# predictor's metrics on the same windows), and rc_<step>.txt with each step's exit code.
set -uo pipefail
OUT=${1:?usage: dhsa-pred.sh OUTDIR}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PY:-python}
source benchmarks/gpu/step.sh  # step NAME SECONDS CMD...: a time limit, a log, the exit code kept
if [ "${SMOKE:-0}" = 1 ]; then
  export TRITON_INTERPRET=1
  step tests 600 $PY -m pytest tests/test_dhsa_chunking.py -q -x -p no:cacheprovider -k "edge_cases and short"
  step bench 300 $PY -m kvlab run dhsa-predictor-time --out "$OUT/predictor_time" --smoke
  step train 300 $PY -m kvlab.dhsa.training --model smollm2-135m --corpus austen:2,c4-sample:1 \
    --val-corpus austen,c4-sample --val-samples 1 --seq-len 64 --epochs 1 --hidden 16 --cache-keys --label-batch 2 \
    --compare shipped --threads 1 --out "$OUT/smollm2-135m-h256.pt"
  exit 0
fi
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/device.txt" 2>&1
step tests 40 $PY -m pytest tests/test_dhsa_chunking.py -q -k cuda -p no:cacheprovider
step bench 70 $PY -m kvlab run dhsa-predictor-time --out "$OUT/predictor_time" --seq 32768 --shapes gemma2-2b,gemma3-270m \
  --profile
step train 120 $PY -m kvlab.dhsa.training --model smollm2-135m \
  --corpus austen:120,c4-sample:50,paul-graham:100,shakespeare:115,wikitext:115 \
  --val-corpus austen,c4-sample,paul-graham,shakespeare,wikitext --val-samples 10 --seq-len 1024 \
  --epochs 2 --lr 5e-4 --hidden 256 --heads 8 --window 4 --device cuda --cache-keys --label-batch 16 \
  --max-train-seconds 45 --compare shipped --out "$OUT/smollm2-135m-h256.pt"
