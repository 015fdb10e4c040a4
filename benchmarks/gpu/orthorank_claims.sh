#!/usr/bin/env bash
# OrthoRank's Fig. 4 (layer-wise token selection) and Table 4 (layer vs token ratio at 20 % sparsity) on
# SmolLM2-135M-Instruct, one 256-token window from each of the 78 C4 documents that have one, per-window NLL.
#
#   KVLAB_RESULTS=DIR CUDA_VISIBLE_DEVICES=N bash benchmarks/gpu/orthorank_claims.sh          # ~3 min on one H100
#   SMOKE=1 KVLAB_RESULTS=/tmp/x PY=.venv/bin/python bash benchmarks/gpu/orthorank_claims.sh  # the same code, tiny, CPU
#
# 1. fig4: each layer after l_sink routed alone (token ratio 0.33), most vs least orthogonal tokens; per layer and
#    pooled over the layers but the last (the paper: orthogonal better everywhere except the final layer).
# 2. table4docs: 20 % sparsity as layers removed (token ratio 0), routed at 0.33 (notebook 11's greedy order) and
#    routed at 0.5 (greedy search on the 8 x 256 calibration windows).
# Planned n: all 78 documents; Table 1's windows gave paired SDs of ~0.15 nats, SE ~0.017, against the paper's
# Table 4 gaps of 2-4 accuracy points and Fig. 4's ppl gaps of 0.1-1 (log-ppl 0.01-0.1).
# Writes $KVLAB_RESULTS/benchmarks/results/orthorank/claims/{fig4,table4docs}_smollm2.{json,examples.jsonl.gz}
# (python -m kvlab run orthorank-fig4 | orthorank-table4docs) and $KVLAB_RESULTS/orthorank_claims.log.
set -uo pipefail
PY=${PY:-python3}
: "${KVLAB_RESULTS:?set KVLAB_RESULTS to the results folder}"
D="$KVLAB_RESULTS/benchmarks/results/orthorank/claims"
mkdir -p "$KVLAB_RESULTS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
NB11=benchmarks/results/orthorank/notebook11_default_smollm2_cpu.json
if [ "${SMOKE:-0}" = 1 ]; then
  ARGS=(--doc-len 256 --calib 8x256 --smoke)
else
  ARGS=(--doc-len 256 --calib 8x256)
fi
{
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name --format=csv,noheader
  for what in fig4 table4docs; do
    echo "== $what"
    t0=$(date +%s)
    "$PY" -m kvlab run "orthorank-$what" --layers "$NB11" "${ARGS[@]}" \
      --name "${what}_smollm2" --out "$D" 2>&1 | grep --line-buffered -v "Loading weights"
    echo "$what: $(( $(date +%s) - t0 )) s"
  done
} 2>&1 | tee "$KVLAB_RESULTS/orthorank_claims.log"
