#!/usr/bin/env bash
# Issue 23, sections 2-4: OrthoRank Table 1 / Table 3 over one window per C4 document, and SepLLM's GSM8K
# comparison at matched r.KV, with per-example records (*.examples.jsonl) for paired intervals. One GPU, repo root,
# plain `python` (torch 2.11, transformers 5.x), about 4-6 minutes on one H200 (estimate: SmolLM2-135M forward
# passes only, no generation unless GENERATE > 0).
#
#   bash benchmarks/gpu/orthorank_docs_sepllm_gsm8k.sh OUT_DIR
#
# 1. OrthoRank Table 1 with the searches of notebook 11 (sink profiled on the first 1,024 WikiText tokens,
#    calibration 8 x 256 after them, greedy SLEB / OrthoRank, one-shot Shortened LLaMA PPL / Taylor+ /
#    OrthoRank), every plan and Table 3's rows on the first 256 tokens of each C4 document that has them
#    (78 documents): OUT/orthorank/table1_docs256_search.{json,examples.jsonl.gz} (python -m kvlab run orthorank-table1)
# 2. The same plans as the committed CPU results (notebook11_default_smollm2_cpu.json), same windows:
#    OUT/orthorank/table1_docs256_nb11.{json,examples.jsonl.gz}; their logs in OUT/logs/
# 3. SepLLM GSM8K answer-NLL proxy, SepLLM (a=3) against StreamingLLM with the window matched to SepLLM's mean
#    r.KV: n=128 on the first 300 problems with >= 192 tokens of question + solution (the window binds), and
#    n=256 (Table 1's) on the first 300 problems (the window holds most problems whole, as in the paper's setting):
#    OUT/sepllm/gsm8k_matched_n{128,256}.{json,examples.jsonl}. GENERATE=N adds greedy generation (exact match)
#    on the first N of the n=128 problems for SepLLM and the matched window (batch 1, ~150 tokens per problem:
#    about 2 x N x 150 x 25 ms on the GPU, e.g. 12 minutes for N=100: run it as its own call).
# CPU smoke test: SMOKE=1 bash benchmarks/gpu/orthorank_docs_sepllm_gsm8k.sh /tmp/out_issue23
set -euo pipefail
OUT=${1:?usage: bash benchmarks/gpu/orthorank_docs_sepllm_gsm8k.sh OUT_DIR}
mkdir -p "$OUT/orthorank" "$OUT/sepllm" "$OUT/logs"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python}
# the log this launcher tees beside the records is kvlab's too (python -m kvlab run refuses files it did not write)
"$PY" -c "import sys; from kvlab.outputs import OutputFolder; OutputFolder(sys.argv[1], 'benchmarks/gpu/orthorank_docs_sepllm_gsm8k.sh').claim(*sys.argv[2:])" \
  "$OUT/sepllm" '*.log'
NB11=benchmarks/results/orthorank/notebook11_default_smollm2_cpu.json
if [ "${SMOKE:-0}" = 1 ]; then
  # a few windows and problems on the CPU: checks that every step runs and writes its files
  $PY -m kvlab run orthorank-table1 --layers "$NB11" --smoke \
    --plans "Dense,OrthoRank 20%,Shortened LLaMA PPL 10%" --name table1_smoke --out "$OUT/orthorank"
  $PY -m kvlab run sepllm-gsm8k-matched --neighbors 128 --problems 2 --generate "${GENERATE:-0}" --max-new-tokens 8 \
    --threads 2 --out "$OUT/sepllm"
  exit 0
fi
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
T0=$(date +%s)
$PY -m kvlab run orthorank-table1 --doc-len 256 --table3 --name table1_docs256_search --out "$OUT/orthorank" \
  2>&1 | grep -v "Loading weights" | tee "$OUT/logs/table1_search.log"
$PY -m kvlab run orthorank-table1 --layers "$NB11" --doc-len 256 --table3 \
  --name table1_docs256_nb11 --out "$OUT/orthorank" 2>&1 | grep -v "Loading weights" | tee "$OUT/logs/table1_nb11.log"
echo "orthorank: $(( $(date +%s) - T0 )) s" | tee -a "$OUT/times.txt"
T1=$(date +%s)
$PY -m kvlab run sepllm-gsm8k-matched --neighbors 128 --problems 300 --generate "${GENERATE:-0}" --out "$OUT/sepllm" \
  2>&1 | grep -v "Loading weights" | tee "$OUT/sepllm/gsm8k_n128.log"
$PY -m kvlab run sepllm-gsm8k-matched --neighbors 256 --min-tokens 1 --problems 300 --out "$OUT/sepllm" \
  2>&1 | grep -v "Loading weights" | tee "$OUT/sepllm/gsm8k_n256.log"
echo "sepllm: $(( $(date +%s) - T1 )) s" | tee -a "$OUT/times.txt"
