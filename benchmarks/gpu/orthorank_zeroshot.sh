#!/usr/bin/env bash
# OrthoRank Table 2 (zero-shot accuracy, OrthoRank vs SLEB at 10 % and 20 % sparsity) with one record per question,
# on SmolLM2-135M-Instruct, the five zero-shot tasks of kvlab.eval.zeroshot, 200 questions each (n = 1,000 per pair).
#
#   KVLAB_RESULTS=DIR CUDA_VISIBLE_DEVICES=N bash benchmarks/gpu/orthorank_zeroshot.sh            # one H100
#   SMOKE=1 KVLAB_RESULTS=/tmp/x PY=.venv/bin/python bash benchmarks/gpu/orthorank_zeroshot.sh    # the same code, tiny, CPU
#
# Plans: notebook 11's greedy orders (benchmarks/results/orthorank/notebook11_default_smollm2_cpu.json), as
# `python -m kvlab.experiments.orthorank zeroshot --layers` builds them. Planned n: the 60-question CPU pilot
# (benchmarks/results/orthorank/table2_per_question_cpu) sizes the discordant share; 1,000 questions put the exact
# bound of a 20-30 % discordant share near +-0.03, the size of the paper's 2.7-point gap (Llama3-8B at 20 %).
# Writes $KVLAB_RESULTS/benchmarks/results/orthorank/table2_per_question_gpu/{zeroshot.examples.jsonl,run.log}.
set -uo pipefail
PY=${PY:-python3}
: "${KVLAB_RESULTS:?set KVLAB_RESULTS to the results folder}"
D="$KVLAB_RESULTS/benchmarks/results/orthorank/table2_per_question_gpu"
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
  "$PY" benchmarks/orthorank_zeroshot_records.py --layers benchmarks/results/orthorank/notebook11_default_smollm2_cpu.json \
    --sparsities 0.1,0.2 "${ARGS[@]}" --out "$D" 2>&1 | grep --line-buffered -v "Loading weights"
  echo "zeroshot: $(( $(date +%s) - t0 )) s"
} 2>&1 | tee "$D/run.log"
