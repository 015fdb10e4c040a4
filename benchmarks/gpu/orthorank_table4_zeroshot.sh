#!/usr/bin/env bash
# OrthoRank Table 4 (layer ratio vs token ratio at 20 % sparsity: 0.2 / 0, 0.3 / 0.33, 0.4 / 0.5) as zero-shot
# accuracy with one record per question, on SmolLM2-135M-Instruct, the five zero-shot tasks of kvlab.eval.zeroshot,
# 200 questions each (n = 1,000 per pair). The plans are the layers the per-document perplexity run chose
# (benchmarks/results/orthorank/layer_token_selection_cpu/table4docs_smollm2.json), so accuracy and perplexity rows
# score the same plans.
#
#   KVLAB_RESULTS=DIR CUDA_VISIBLE_DEVICES=N bash benchmarks/gpu/orthorank_table4_zeroshot.sh            # one H100
#   SMOKE=1 KVLAB_RESULTS=/tmp/x PY=.venv/bin/python bash benchmarks/gpu/orthorank_table4_zeroshot.sh    # CPU, tiny
#
# Planned n: 1,000 questions per pair, as Table 2's GPU run (the paper's gaps are 2-4 points of accuracy; with a
# 20-30 % discordant share 1,000 questions resolve about 3 points). Writes
# $KVLAB_RESULTS/benchmarks/results/orthorank/table4_per_question_gpu/{zeroshot.examples.jsonl,run.log}.
set -uo pipefail
PY=${PY:-python3}
: "${KVLAB_RESULTS:?set KVLAB_RESULTS to the results folder}"
D="$KVLAB_RESULTS/benchmarks/results/orthorank/table4_per_question_gpu"
mkdir -p "$D"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "${SMOKE:-0}" = 1 ]; then
  ARGS=(--device cpu --tasks piqa --questions 2 --threads 2)
else
  ARGS=(--tasks piqa,winogrande,hellaswag,arc-easy,arc-challenge --questions 200)
fi
{
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name --format=csv,noheader
  t0=$(date +%s)
  "$PY" benchmarks/orthorank_zeroshot_records.py \
    --table4 benchmarks/results/orthorank/layer_token_selection_cpu/table4docs_smollm2.json \
    "${ARGS[@]}" --out "$D" 2>&1 | grep --line-buffered -v "Loading weights"
  echo "table4 zeroshot: $(( $(date +%s) - t0 )) s"
} 2>&1 | tee "$D/run.log"
