#!/usr/bin/env bash
# LaCache's undecided claims at the sizes that decide them, on SmolLM2-135M-Instruct (float32), one H100:
#
#   KVLAB_RESULTS=DIR CUDA_VISIBLE_DEVICES=N bash benchmarks/gpu/lacache_claims.sh           # ~7 min on one H100
#   SMOKE=1 KVLAB_RESULTS=/tmp/x PY=.venv/bin/python bash benchmarks/gpu/lacache_claims.sh   # the same code, tiny, CPU
#
# benchmarks/lacache_reruns.py --scale claims (PPL_POLICIES and CLAIMS_PASSKEY there), in this order:
#   1. WikiText perplexity in chunks of 16 (64 windows of 1,024 tokens, paired by
#      window): Table 1 at budgets 256 and 512 (LaCache official S = 16, O = 0 vs StreamingLLM, 4 sinks) and
#      Fig. 10's span ablation at budget 256 (S = 4, 8, 16, 30 on 30 layers; the paper finds S ~ L/4 best).
#   2. Figs. 8-9 passkey under LaCache's retrieval protocol (full prefill, compact once, 64 sinks, 50 % budget),
#      LaCache S = 15 O = 0 vs StreamingLLM, 2,048 tokens, 5 depths x seeds 4-23 (100 prompts; with the earlier
#      seeds 0-3, n = 120).
# Stops starting units after LIMIT seconds (default 380); writes $KVLAB_RESULTS/benchmarks/results/lacache/claims/
# {lacache.examples.jsonl (one record per window or prompt, raw passkey answers), summary.md, raw_outputs.md, run.log}.
set -uo pipefail
PY=${PY:-python3}
: "${KVLAB_RESULTS:?set KVLAB_RESULTS to the results folder}"
D="$KVLAB_RESULTS/benchmarks/results/lacache/claims"
mkdir -p "$D"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "${SMOKE:-0}" = 1 ]; then
  ARGS=(--scale claims-smoke --workers 1 --limit "${LIMIT:-600}")
else
  ARGS=(--scale claims --workers "${WORKERS:-12}" --limit "${LIMIT:-380}")
fi
t0=$(date +%s)
"$PY" -c "import torch; print('device:', torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu', torch.__version__)" \
  | tee "$D/device.txt"
"$PY" benchmarks/lacache_reruns.py --out "$D" "${ARGS[@]}" 2>&1 | grep -v "Loading weights" | tee "$D/run.log"
rm -rf "$D/parts"   # merged into lacache.examples.jsonl
echo "lacache_claims: $(( $(date +%s) - t0 )) s"
[ -s "$D/lacache.examples.jsonl" ] || { echo "no records written" >&2; exit 1; }
cat "$D/summary.md"; head -c 2000 "$D/raw_outputs.md"
