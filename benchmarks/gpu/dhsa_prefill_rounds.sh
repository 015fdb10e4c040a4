#!/usr/bin/env bash
# DHSA Tables 2-3 and Figs. 8-10 as paired rows for the ledger: prefill latency and peak memory (torch.cuda.
# max_memory_allocated above the weights) of dense SDPA vs DHSA (the paper's setup: predicted chunks shared by all
# layers, the packed Triton kernel, one selection for all heads), 20 rounds per length, the order of the methods
# rotating from round to round, random weights of Gemma2-2b's shape (every layer global), 16K and 32K tokens.
#
#   KVLAB_RESULTS=DIR CUDA_VISIBLE_DEVICES=N bash benchmarks/gpu/dhsa_prefill_rounds.sh            # one H100, ~5 min
#   SMOKE=1 KVLAB_RESULTS=/tmp/x PY=.venv/bin/python bash benchmarks/gpu/dhsa_prefill_rounds.sh    # the same code, tiny, CPU
#
# Planned n: 20 rounds per length (the ledger's minimum; the earlier medians of 3 repeats put DHSA's prefill
# within a few per cent of SDPA's, so 20 paired rounds decide a gap of that size if the round-to-round noise stays
# under ~5 %). Writes $KVLAB_RESULTS/benchmarks/results/dhsa/prefill_rounds/{dhsa_prefill_rounds.examples.jsonl,
# dhsa_prefill_e2e.json,dhsa_prefill_e2e.md} (python -m kvlab run dhsa-prefill-e2e) and $KVLAB_RESULTS/dhsa_prefill_rounds.log.
set -uo pipefail
PY=${PY:-python3}
: "${KVLAB_RESULTS:?set KVLAB_RESULTS to the results folder}"
D="$KVLAB_RESULTS/benchmarks/results/dhsa/prefill_rounds"
mkdir -p "$KVLAB_RESULTS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "${SMOKE:-0}" = 1 ]; then
  ARGS=(--shapes gemma2-2b-global --seqs 16384,32768 --rounds 20 --smoke)
else
  ARGS=(--shapes gemma2-2b-global --seqs 16384,32768 --rounds 20)
fi
{
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name --format=csv,noheader
  t0=$(date +%s)
  "$PY" -m kvlab run dhsa-prefill-e2e --out "$D" --methods sdpa,dhsa-pred --kernels packed --share-heads 1 \
    "${ARGS[@]}" 2>&1 | grep --line-buffered -v "profiler_st\|CPUAllocator"
  echo "prefill rounds: $(( $(date +%s) - t0 )) s"
} 2>&1 | tee "$KVLAB_RESULTS/dhsa_prefill_rounds.log"
