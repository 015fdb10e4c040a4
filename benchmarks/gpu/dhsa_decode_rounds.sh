#!/usr/bin/env bash
# DHSA App. D (Figs. 7, 8, 10) on the GPU as paired rounds: prefill and decode latency and the allocator's peak
# memory (torch.cuda.max_memory_allocated) of dense attention vs the decode-stage KV compression App. D times
# (StreamingLLM with 4 sinks and 128 entries per layer; 2,048 entries for Fig. 10's smaller reduction), at contexts
# of 1K, 4K and 8K tokens, SmolLM2-135M-Instruct (float32, every layer global), 20 rounds, the order rotating.
#
#   KVLAB_RESULTS=DIR CUDA_VISIBLE_DEVICES=N bash benchmarks/gpu/dhsa_decode_rounds.sh             # one H100, ~2 min
#   SMOKE=1 KVLAB_RESULTS=/tmp/x PY=.venv/bin/python bash benchmarks/gpu/dhsa_decode_rounds.sh     # CPU, tiny
#
# Planned n: 20 rounds (the ledger's minimum); the allocator's peaks do not vary between rounds, and dense decoding
# at 8K reads 64x the keys of a 128-entry cache, a gap far above a round's noise. Writes
# $KVLAB_RESULTS/benchmarks/results/dhsa/decode_rounds_gpu/{decode.examples.jsonl,run.log}.
set -uo pipefail
PY=${PY:-python3}
: "${KVLAB_RESULTS:?set KVLAB_RESULTS to the results folder}"
D="$KVLAB_RESULTS/benchmarks/results/dhsa/decode_rounds_gpu"
mkdir -p "$D"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "${SMOKE:-0}" = 1 ]; then
  ARGS=(decode --contexts 64,128 --cache 16,32 --rounds 2 --steps 2)
else
  ARGS=(decode --device cuda --contexts 1024,4096,8192 --cache 128,2048 --rounds 20 --steps 16)
fi
{
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name --format=csv,noheader
  t0=$(date +%s)
  "$PY" benchmarks/dhsa_app_d_costs.py "${ARGS[@]}" --out "$D" 2>&1 | grep --line-buffered -v "Loading weights"
  echo "decode rounds: $(( $(date +%s) - t0 )) s"
} 2>&1 | tee "$D/run.log"
