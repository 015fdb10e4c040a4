#!/usr/bin/env bash
# OrthoRank's zero-shot tables with one record per question, on SmolLM2-135M-Instruct, the five zero-shot tasks of
# kvlab.eval.zeroshot, 200 questions each (n = 1,000 per pair):
#   TABLE=2 (default): Table 2, OrthoRank vs SLEB at 10 % and 20 % sparsity, the plans of notebook 11's greedy
#     orders (benchmarks/results/orthorank/notebook11_default_smollm2_cpu.json, as `python -m kvlab run
#     orthorank-zeroshot --layers` builds them);
#   TABLE=4: Table 4 / Fig. 5, the layer vs token ratio at 20 % sparsity (0.2 / 0, 0.3 / 0.33, 0.4 / 0.5), the plans
#     the per-document perplexity run chose (benchmarks/results/orthorank/layer_token_selection_cpu/
#     table4docs_smollm2.json), so accuracy and perplexity rows score the same plans.
#
#   KVLAB_RESULTS=DIR CUDA_VISIBLE_DEVICES=N [TABLE=4] bash benchmarks/gpu/orthorank_zeroshot.sh          # one H100
#   SMOKE=1 KVLAB_RESULTS=/tmp/x PY=.venv/bin/python bash benchmarks/gpu/orthorank_zeroshot.sh             # tiny, CPU
#
# Planned n: the 60-question CPU pilot (benchmarks/results/orthorank/table2_per_question_cpu) sizes the discordant
# share; 1,000 questions put the exact bound of a 20-30 % discordant share near +-0.03, the size of the paper's gaps
# (2.7 points for Llama3-8B at 20 % in Table 2; 2-4 points in Table 4).
# Writes $KVLAB_RESULTS/benchmarks/results/orthorank/table{2,4}_per_question_gpu/zeroshot.examples.jsonl.gz (python -m
# kvlab run orthorank-zeroshot-records) and $KVLAB_RESULTS/orthorank_zeroshot_table{2,4}.log.
set -uo pipefail
PY=${PY:-python3}
: "${KVLAB_RESULTS:?set KVLAB_RESULTS to the results folder}"
TABLE=${TABLE:-2}
D="$KVLAB_RESULTS/benchmarks/results/orthorank/table${TABLE}_per_question_gpu"
mkdir -p "$KVLAB_RESULTS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "$TABLE" = 4 ]; then
  PLANS=(--table4 benchmarks/results/orthorank/layer_token_selection_cpu/table4docs_smollm2.json)
else
  PLANS=(--layers benchmarks/results/orthorank/notebook11_default_smollm2_cpu.json --sparsities 0.1,0.2)
fi
if [ "${SMOKE:-0}" = 1 ]; then
  ARGS=(--tasks piqa,winogrande,hellaswag,arc-easy,arc-challenge --questions 200 --smoke)
else
  ARGS=(--tasks piqa,winogrande,hellaswag,arc-easy,arc-challenge --questions 200)
fi
{
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name --format=csv,noheader
  t0=$(date +%s)
  "$PY" -m kvlab run orthorank-zeroshot-records "${PLANS[@]}" "${ARGS[@]}" --out "$D" 2>&1 \
    | grep --line-buffered -v "Loading weights"
  echo "zeroshot (Table $TABLE): $(( $(date +%s) - t0 )) s"
} 2>&1 | tee "$KVLAB_RESULTS/orthorank_zeroshot_table$TABLE.log"
