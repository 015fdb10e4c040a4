#!/usr/bin/env bash
# DHSA App. D (Figs. 7-10) on the GPU as paired rounds: prefill and decode latency and the allocator's peak memory
# (torch.cuda.max_memory_allocated) of dense attention vs the decode-stage KV compression App. D times (StreamingLLM,
# 4 sinks and 128 entries per layer; 2,048 entries for Fig. 10's smaller reduction), at contexts of 1K, 4K and 8K
# tokens, 20 rounds with the order rotating, on random-weight models of App. D's two shapes (no model assets needed):
# Gemma2-2b's (every layer global: Figs. 7, 8, 10) and Gemma3-1b's (a global layer every sixth: Fig. 9).
#
#   KVLAB_RESULTS=DIR CUDA_VISIBLE_DEVICES=N bash benchmarks/gpu/dhsa_decode_rounds.sh             # one H200, ~2 min
#   SMOKE=1 KVLAB_RESULTS=/tmp/x PY=.venv/bin/python bash benchmarks/gpu/dhsa_decode_rounds.sh     # CPU, --smoke
#
# Planned n: 20 rounds (the ledger's minimum); the allocator's peaks do not vary between rounds, and dense decoding
# at 8K reads 64x the keys of a 128-entry cache. Writes $KVLAB_RESULTS/benchmarks/results/dhsa/decode_rounds_gpu_
# {gemma2-2b-global,gemma3-1b}/decode.examples.jsonl.gz (python -m kvlab run dhsa-app-d-costs decode) and run.log.
set -uo pipefail
PY=${PY:-python3}
: "${KVLAB_RESULTS:?set KVLAB_RESULTS to the results folder}"
D="$KVLAB_RESULTS/benchmarks/results/dhsa/decode_rounds_gpu"
mkdir -p "$KVLAB_RESULTS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name --format=csv,noheader
  t0=$(date +%s)
  runs=("gemma2-2b-global|1024,4096,8192|128,2048|20|8" "gemma3-1b|1024,4096,8192|128|20|8"); DEV=cuda
  EXTRA=()
  if [ "${SMOKE:-0}" = 1 ]; then DEV=cpu; EXTRA=(--smoke); fi
  for r in "${runs[@]}"; do
    IFS='|' read -r shape contexts cache rounds steps <<< "$r"
    echo "== $shape"
    "$PY" -m kvlab run dhsa-app-d-costs decode --device "$DEV" --shape "$shape" --contexts "$contexts" \
      --cache "$cache" --rounds "$rounds" --steps "$steps" "${EXTRA[@]}" --out "${D}_$shape"
    echo "$shape: $(( $(date +%s) - t0 )) s"
  done
} 2>&1 | tee "$KVLAB_RESULTS/dhsa_decode_rounds.log"
