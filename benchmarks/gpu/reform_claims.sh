#!/usr/bin/env bash
# REFORM's undecided claims at the sizes that decide them, on SmolLM2-135M-Instruct (float32), one H100:
#
#   KVLAB_RESULTS=DIR CUDA_VISIBLE_DEVICES=N bash benchmarks/gpu/reform_claims.sh            # ~8 min on one H100
#   SMOKE=1 KVLAB_RESULTS=/tmp/x PY=.venv/bin/python bash benchmarks/gpu/reform_claims.sh    # the same code, tiny, CPU
#
# benchmarks/reform_reruns.py run --scale claims (PLANS["claims"] there, in this priority order):
#   1. Table 1 key-value retrieval re-run with the fixed answer loop, scored on the whole value: 20 prompts of
#      16,384 tokens (2x the window), 12 pairs, truncation / StreamingLLM / H2O / REFORM at budget 2,048.
#   2. Table 4 code completion on 48 distinct target lines (click, jinja2, requests, urllib3; the committed
#      benchmarks/inputs/reform_repo_8192_distinct.json.gz): truncation / StreamingLLM / InfiniPot / REFORM.
#   3. Table 6a random and worst heads vs REFORM, multi-key + multi-query seeds 20-59 (pooled with the earlier
#      seeds 0-19: n = 120), recompute budget 1,024.
#   4. Table 1 BABILong qa1/qa2 seeds 20-99, StreamingLLM / REFORM (pooled n = 200).
#   5. Table 5 REFORM vs BM25 RAG, four needle kinds, seeds 20-39 (pooled n = 160).
# Stops starting units after LIMIT seconds (default 400); writes $KVLAB_RESULTS/benchmarks/results/reform/claims/
# {reform.examples.jsonl (one record per example, method and metric, raw output), summary.md, raw_outputs.md, run.log}.
set -uo pipefail
PY=${PY:-python3}
: "${KVLAB_RESULTS:?set KVLAB_RESULTS to the results folder}"
D="$KVLAB_RESULTS/benchmarks/results/reform/claims"
mkdir -p "$D"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "${SMOKE:-0}" = 1 ]; then
  "$PY" benchmarks/reform_reruns.py tasks --scale claims-smoke --packages requests --examples 2 \
    --out "$D/repo_smoke.json.gz" || exit 1
  ARGS=(--scale claims-smoke --workers 1 --limit "${LIMIT:-600}" --repo-file "$D/repo_smoke.json.gz")
else
  ARGS=(--scale claims --workers "${WORKERS:-14}" --limit "${LIMIT:-400}"
        --repo-file benchmarks/inputs/reform_repo_8192_distinct.json.gz)
fi
t0=$(date +%s)
"$PY" -c "import torch; print('device:', torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu', torch.__version__)" \
  | tee "$D/device.txt"
"$PY" benchmarks/reform_reruns.py run --out "$D" "${ARGS[@]}" 2>&1 | grep -v "Loading weights" | tee "$D/run.log"
rm -rf "$D/parts"   # merged into reform.examples.jsonl
echo "reform_claims: $(( $(date +%s) - t0 )) s"
[ -s "$D/reform.examples.jsonl" ] || { echo "no records written" >&2; exit 1; }
head -c 3000 "$D/raw_outputs.md"
