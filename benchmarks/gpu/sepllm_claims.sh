#!/usr/bin/env bash
# SepLLM's ablations and needle figures as paired experiments on SmolLM2-135M-Instruct, per-example records.
#
#   KVLAB_RESULTS=DIR CUDA_VISIBLE_DEVICES=N bash benchmarks/gpu/sepllm_claims.sh          # ~7 min on one H100
#   SMOKE=1 KVLAB_RESULTS=/tmp/x PY=.venv/bin/python bash benchmarks/gpu/sepllm_claims.sh  # the same code, tiny, CPU
#
# 1. GSM8K answer-NLL proxy (teacher-forced NLL of the reference solution after the 8-shot prompt), a=3, n=256,
#    on all 1,319 test problems (PROBLEMS): Table 17 (SepLLM vs FixLLM interval 4 and 5), Table 16 (nine vs four
#    vs two separators vs none, and StreamingLLM widened to the nine-separator r.KV), Table 9 (SepLLM vs 6/7/8 of
#    9 query heads sliding, the rest full, each window matched to SepLLM's mean r.KV). Planned n: the proxy's
#    paired SD is about 0.03 nats (300-problem run at n=128), so 1,319 problems resolve differences of ~0.002.
# 2. Needle: Figs. 8-9's basic design (n=64 H/T with and without separators) and App. F's streaming cache
#    (4, 32, 224, 324) vs StreamingLLM (4 + 320) at 4 lengths (1K-4K) x 16 depths = 64 cells per policy; Figs.
#    10-11's n = 2048 (32 initial tokens, first/last two layers full, with and without separators) at 4K-8K.
#    Planned n: the earlier 15-cell answer-NLL difference had SD ~0.1 with mean 0.03: 64 cells give SE ~0.013.
# PARTS="needle" runs the needle half alone (default "gsm8k needle").
# Writes $KVLAB_RESULTS/benchmarks/results/sepllm/claims/{table9,table16,table17}_gsm8k_n256.{json,examples.jsonl.gz},
# needle_{streaming,basic}.{json,examples.jsonl.gz} and run.log; prints progress and per-pair statistics.
set -uo pipefail
PY=${PY:-python3}
: "${KVLAB_RESULTS:?set KVLAB_RESULTS to the results folder}"
D="$KVLAB_RESULTS/benchmarks/results/sepllm/claims"
mkdir -p "$D"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# the log this launcher tees beside the records is kvlab's too (python -m kvlab run refuses files it did not write)
"$PY" -c "import sys; from kvlab.outputs import OutputFolder; OutputFolder(sys.argv[1], 'benchmarks/gpu/sepllm_claims.sh').claim(*sys.argv[2:])" \
  "$D" '*.log'
if [ "${SMOKE:-0}" = 1 ]; then
  GSM=(--problems 1 --tables 17,9 --threads 2 --device cpu)
  NEEDLE=(--lengths 384 --depths 2 --design streaming --threads 2 --device cpu)
else
  GSM=(--problems "${PROBLEMS:-1319}" --tables 17,16,9)
  NEEDLE=(--lengths 1024,2048,3072,4096 --depths "${DEPTHS:-16}" --design streaming,basic)
  NEEDLE_WIDE=(--lengths 4096,6144,8192 --depths "${DEPTHS:-16}" --design n2048)
fi
{
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name --format=csv,noheader
  if [[ " ${PARTS:-gsm8k needle} " == *" gsm8k "* ]]; then
    echo "== gsm8k: Tables 17, 16, 9"
    t0=$(date +%s)
    "$PY" -m kvlab run sepllm-ablations gsm8k --neighbors 256 "${GSM[@]}" --out "$D" 2>&1 | grep --line-buffered -v "Loading weights"
    echo "gsm8k: $(( $(date +%s) - t0 )) s"
  fi
  echo "== needle: Figs. 8-11"
  t0=$(date +%s)
  "$PY" -m kvlab run sepllm-ablations needle "${NEEDLE[@]}" --out "$D" 2>&1 | grep --line-buffered -v "Loading weights"
  echo "needle: $(( $(date +%s) - t0 )) s"
  if [ "${SMOKE:-0}" != 1 ]; then  # Figs. 10-11's n = 2048 needs contexts beyond 2,048 tokens
    "$PY" -m kvlab run sepllm-ablations needle "${NEEDLE_WIDE[@]}" --out "$D" 2>&1 | grep --line-buffered -v "Loading weights"
    echo "needle n2048: $(( $(date +%s) - t0 )) s"
  fi
  echo "== a few raw needle answers"
  head -n 3 "$D"/needle_streaming.examples.jsonl | cut -c 1-400
} 2>&1 | tee "$D/run.log"
