#!/usr/bin/env bash
# The papers' speed and memory items as paired rounds for the ledger, in one GPU call, random weights (no model
# assets: a lease can start with it):
#
#   sepllm    SepLLM Table 10: ms per training iteration (forward + backward + AdamW) of a Pythia-160m-shaped model,
#             sequences of 2,048, 4 micro-batches of 16, Vanilla (causal SDPA) vs SepLLM(n=64) through kvlab's
#             Triton kernel with its backward (python -m kvlab run sepllm-training-speed)
#   dhsa8k    DHSA Table 2 (NarrativeQA, torch.sdpa rows, 8K): prefill latency and peak memory of dense SDPA vs DHSA
#             (predicted chunks, packed kernel, one selection for all heads) at 8,192 tokens on Gemma2-2b's shape,
#             with attention's own peak per round (python -m kvlab run dhsa-prefill-e2e --attention-memory)
#   decode    DHSA App. D Figs. 8 and 10: decode ms per token and the allocator's peaks of dense vs StreamingLLM
#             128 / 2,048 at contexts of 1K-8K on Gemma2-2b's shape (python -m kvlab run dhsa-app-d-costs decode)
#   mem32k    the attention-memory instrument at 32K (the dhsa-t3-memory-32k row's length), dense vs DHSA
#   fig10     DHSA App. D Fig. 10 ("decoding time is largely proportional to the number of newly generated tokens"):
#             dense and StreamingLLM 128 after 8,192 tokens, decoding 8 and 32 new tokens, one cell per count
#             (python -m kvlab run dhsa-app-d-costs decode --steps 8,32)
#
#   KVLAB_RESULTS=DIR CUDA_VISIBLE_DEVICES=N bash benchmarks/gpu/paper_speed_rows.sh               # one H200, ~7 min
#   SMOKE=1 KVLAB_RESULTS=/tmp/x PY=.venv/bin/python bash benchmarks/gpu/paper_speed_rows.sh       # the same, tiny, CPU
#   STEPS="sepllm dhsa8k" ... bash benchmarks/gpu/paper_speed_rows.sh                              # some of them
#
# Planned n (the ledger rows' planned_n, committed before each run): 30 paired rounds for sepllm, dhsa8k and fig10
# (re-planned: their first runs of 20 rounds were planned only here), 20 for decode and mem32k; per cell, each
# round one measurement per method in an order that rotates from round to round (the paper's effects are 1.53x
# (Table 10), 0.83x latency / 1.10x memory (Table 2), and dense decoding at 8K reads 64x the keys of a 128-entry
# cache (Fig. 8), each far outside the few per cent of round-to-round noise the earlier GPU rounds showed). The
# steps run in the order above, the longest last, so a time limit cuts the least (fig10, added later, runs when
# named). Writes under $KVLAB_RESULTS/benchmarks/results/:
#   sepllm/training_speed_rounds_gpu/training_speed.{examples.jsonl.gz,json}
#   dhsa/prefill_8k_rounds_gpu/dhsa_prefill_rounds.examples.jsonl.gz (+ dhsa_prefill_8k.{json,md})
#   dhsa/decode_context_gpu/decode.examples.jsonl.gz
#   dhsa/attention_memory_32k_gpu/dhsa_prefill_rounds.examples.jsonl.gz (+ dhsa_attention_memory_32k.{json,md})
#   dhsa/decode_new_tokens_gpu/decode.examples.jsonl.gz
# and $KVLAB_RESULTS/paper_speed_rows.log.
set -uo pipefail
PY=${PY:-python3}
: "${KVLAB_RESULTS:?set KVLAB_RESULTS to the results folder}"
R="$KVLAB_RESULTS/benchmarks/results"
STEPS=${STEPS:-sepllm dhsa8k decode mem32k}
mkdir -p "$KVLAB_RESULTS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
DEV=cuda; EXTRA=()
if [ "${SMOKE:-0}" = 1 ]; then DEV=cpu; EXTRA=(--smoke); fi
DHSA=(--shapes gemma2-2b-global --methods sdpa,dhsa-pred --kernels packed --share-heads 1 --attention-memory)
status=0

step() {  # NAME COMMAND...: run one step, note its time and exit code, go on with the next
  local name=$1 t0 rc; shift
  echo "== $name"
  t0=$(date +%s)
  "$@" 2>&1 | grep --line-buffered -v "profiler_st\|CPUAllocator"
  rc=${PIPESTATUS[0]}
  echo "$name: exit $rc, $(( $(date +%s) - t0 )) s"
  [ "$rc" = 0 ] || status=1
}

{
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name --format=csv,noheader
  for s in $STEPS; do
    case "$s" in
      sepllm) step sepllm "$PY" -m kvlab run sepllm-training-speed --device "$DEV" --shape pythia-160m --seq 2048 \
                --batch 16 --accumulate 4 --neighbors 64 --rounds 30 --warmup 3 "${EXTRA[@]}" \
                --out "$R/sepllm/training_speed_rounds_gpu" ;;
      dhsa8k) step dhsa8k "$PY" -m kvlab run dhsa-prefill-e2e --device "$DEV" "${DHSA[@]}" --rounds 30 --seqs 8192 \
                --name dhsa_prefill_8k "${EXTRA[@]}" --out "$R/dhsa/prefill_8k_rounds_gpu" ;;
      decode) step decode "$PY" -m kvlab run dhsa-app-d-costs decode --device "$DEV" --shape gemma2-2b-global \
                --contexts 1024,2048,4096,8192 --cache 128,2048 --rounds 20 --steps 8 "${EXTRA[@]}" \
                --out "$R/dhsa/decode_context_gpu" ;;
      mem32k) step mem32k "$PY" -m kvlab run dhsa-prefill-e2e --device "$DEV" "${DHSA[@]}" --rounds 20 --seqs 32768 \
                --name dhsa_attention_memory_32k "${EXTRA[@]}" --out "$R/dhsa/attention_memory_32k_gpu" ;;
      fig10) step fig10 "$PY" -m kvlab run dhsa-app-d-costs decode --device "$DEV" --shape gemma2-2b-global \
                --contexts 8192 --cache 128 --rounds 30 --steps 8,32 "${EXTRA[@]}" \
                --out "$R/dhsa/decode_new_tokens_gpu" ;;
      *) echo "unknown step $s (the steps: sepllm dhsa8k decode mem32k fig10)"; status=1 ;;
    esac
  done
  exit $status
} 2>&1 | tee "$KVLAB_RESULTS/paper_speed_rows.log"
exit "${PIPESTATUS[0]}"
