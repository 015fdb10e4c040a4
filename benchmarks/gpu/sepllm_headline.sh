#!/usr/bin/env bash
# SepLLM's headline accuracy claims on Qwen2.5-Coder-0.5B-Instruct (above the accuracy floor SmolLM2-135M sits on):
# Table 1 (GSM8K-CoT 8-shot, MMLU 5-shot: Vanilla, SepLLM n=256, StreamingLLM at n=256 and at SepLLM's measured
# r.KV) and Table 15 (H2O at the matched entries), per-example records, paired intervals (python -m kvlab run sepllm-headline).
#
#   KVLAB_RESULTS=DIR CUDA_VISIBLE_DEVICES=N bash benchmarks/gpu/sepllm_headline.sh          # ~8 min on one H100
#   SMOKE=1 KVLAB_RESULTS=/tmp/x PY=.venv/bin/python bash benchmarks/gpu/sepllm_headline.sh  # the same code, tiny, CPU
#
# Two processes on the one GPU at the same time: GSM8K (the static engine, one pass of 1,319 streams per method,
# then H2O through the hooks engine one problem at a time until H2O_SECONDS) and MMLU (the hooks engine, one
# question a forward pass: latency-bound, it leaves the GPU to the GSM8K pass most of the time).
# Planned n (benchmarks/results/headline/README.md): GSM8K all 1,319 test problems, MMLU 57 subjects x 20 questions =
# 1,140, H2O the first 128 problems or what H2O_SECONDS allows. MODEL=qwen2.5-coder-1.5b runs the larger candidate
# (staged with pack-qwen15). Writes $KVLAB_RESULTS/benchmarks/results/headline/sepllm_<model>/table1_{gsm8k,mmlu}.
# {json,examples.jsonl.gz} and {gsm8k,mmlu}.log; both files are rewritten after every method.
set -uo pipefail
PY=${PY:-python3}
: "${KVLAB_RESULTS:?set KVLAB_RESULTS to the results folder}"
MODEL=${MODEL:-qwen2.5-coder-0.5b}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "${SMOKE:-0}" = 1 ]; then
  # the smallest model and prompt that take every code path: 3 problems (two passes of the static engine), 1-shot
  MODEL=${SMOKE_MODEL:-smollm2-135m}
  GSM=(--gsm8k 3 --shots 1 --max-new-tokens 6 --batch 2 --h2o 1 --h2o-seconds 1 --threads 1 --device cpu)
  MMLU=(--mmlu-subjects 2 --mmlu-questions 1 --threads 1 --device cpu)
else
  GSM=(--gsm8k "${GSM8K:-1319}" --batch "${BATCH:-1319}" --h2o "${H2O:-128}" --h2o-seconds "${H2O_SECONDS:-60}")
  MMLU=(--mmlu-questions "${MMLU_QUESTIONS:-20}")
fi
D="$KVLAB_RESULTS/benchmarks/results/headline/sepllm_$MODEL"
mkdir -p "$D"
# the logs this launcher tees beside the records are kvlab's too (the output rule: python -m kvlab run refuses a folder
# holding files it did not write); both parts' files are claimed before the two processes start
"$PY" -c "import sys; from kvlab.outputs import OutputFolder; OutputFolder(sys.argv[1], 'benchmarks/gpu/sepllm_headline.sh').claim(*sys.argv[2:])" \
  "$D" '*.log' 'table1_*' 'table9_*'
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
t0=$(date +%s)
part() {  # gsm8k|mmlu ARGS...
  local p=$1; shift
  "$PY" -m kvlab run sepllm-headline --part "$p" --model "$MODEL" "$@" --out "$D" 2>&1 \
    | grep --line-buffered -v "Loading weights\|sha256 \|Converting and de-quantizing" | tee "$D/$p.log"
  echo "$p: $(( $(date +%s) - t0 )) s" | tee -a "$D/$p.log"
}
# the GGUF is converted to safetensors once, before the two processes could both try
"$PY" -c "import kvlab; kvlab.load_model('$MODEL', device='cpu')" 2>&1 | grep -v "Loading weights\|sha256 \|Converting"
echo "model ready: $(( $(date +%s) - t0 )) s"
part gsm8k "${GSM[@]}" &
gsm=$!
part mmlu "${MMLU[@]}"
wait "$gsm"
echo "sepllm_headline: $(( $(date +%s) - t0 )) s"
