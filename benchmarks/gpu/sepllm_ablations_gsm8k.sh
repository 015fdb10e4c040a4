#!/usr/bin/env bash
# SepLLM's GSM8K ablations as accuracy (the paper's quantity) on Qwen2.5-Coder-1.5B-Instruct, the registry model above
# GSM8K's floor (benchmarks/results/headline): Table 16 (nine separators vs four ". , ? ;" vs two ". ?" vs none,
# and StreamingLLM widened to SepLLM's r.KV), Table 17 (SepLLM vs FixLLM with one kept entry every 4 or 5 positions),
# a = 3, n = 256, 8-shot CoT, all 1,319 test problems, the static decode engine; then Table 15's H2O at the matched
# entries through the hooks engine, one problem at a time, until H2O_SECONDS (python -m kvlab run sepllm-headline).
#
#   KVLAB_RESULTS=DIR CUDA_VISIBLE_DEVICES=N bash benchmarks/gpu/sepllm_ablations_gsm8k.sh        # ~8 min on one H200
#   SMOKE=1 KVLAB_RESULTS=/tmp/x PY=.venv/bin/python bash benchmarks/gpu/sepllm_ablations_gsm8k.sh # tiny, CPU
#
# PART=ablations (Tables 16-17) or PART=h2o (Table 15; SepLLM re-run first, every pair is read against it).
# Planned n: all 1,319 problems per method (Table 1's run on this model put SepLLM vs StreamingLLM n=256 at +2.1
# points [+0.2, +4.1]: the paper's 0.5-8 point gaps need the whole test set); H2O as many problems as H2O_SECONDS
# allows, at least 30. Writes $KVLAB_RESULTS/benchmarks/results/headline/sepllm_<model>/{table16_17,table15_h2o}_gsm8k.
# {json,examples.jsonl.gz} and the logs.
set -uo pipefail
PY=${PY:-python3}
: "${KVLAB_RESULTS:?set KVLAB_RESULTS to the results folder}"
MODEL=${MODEL:-qwen2.5-coder-1.5b}
PART=${PART:-ablations}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "${SMOKE:-0}" = 1 ]; then
  MODEL=${SMOKE_MODEL:-smollm2-135m}
  COMMON=(--gsm8k 2 --shots 1 --max-new-tokens 4 --batch 2 --threads 1 --device cpu)
  H2O=(--h2o 1 --h2o-seconds 1)
else
  COMMON=(--gsm8k "${GSM8K:-1319}" --batch "${BATCH:-1319}")
  H2O=(--h2o "${H2O_N:-256}" --h2o-seconds "${H2O_SECONDS:-420}")
fi
D="$KVLAB_RESULTS/benchmarks/results/headline/sepllm_$MODEL"
mkdir -p "$D"
# the logs this launcher tees beside the records are kvlab's too (the output rule: python -m kvlab run refuses a folder
# holding files it did not write); both parts' files are claimed before the two processes start
"$PY" -c "import sys; from kvlab.outputs import OutputFolder; OutputFolder(sys.argv[1], 'benchmarks/gpu/sepllm_ablations_gsm8k.sh').claim(*sys.argv[2:])" \
  "$D" '*.log'
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
t0=$(date +%s)
"$PY" -c "import kvlab; kvlab.load_model('$MODEL', device='cpu')" 2>&1 | grep -v "Loading weights\|sha256 \|Converting"
if [ "$PART" = h2o ]; then
  ARGS=(--methods h2o "${H2O[@]}" --stem table15_h2o_gsm8k)
else
  ARGS=(--methods sep4,sep2,strm256,matched,fix4,fix5 --h2o 0 --stem table16_17_gsm8k)
fi
"$PY" -m kvlab run sepllm-headline --part gsm8k --model "$MODEL" "${COMMON[@]}" "${ARGS[@]}" --out "$D" 2>&1 \
  | grep --line-buffered -v "Loading weights\|sha256 \|Converting and de-quantizing" | tee "$D/${PART}_gsm8k.log"
echo "sepllm_ablations_gsm8k ($PART): $(( $(date +%s) - t0 )) s"
