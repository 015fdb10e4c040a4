#!/usr/bin/env bash
# dhsa-exp (issue 24): DHSA's needle grid (Fig. 2/6) under both protocols on one H200, through the fast path
# (the kept set from the chunk ranking + torch SDPA: `--backend sdpa`), one record per (prompt, method) with the raw
# answer; GPU tests of the fast path first.
#
#   bash benchmarks/gpu_2026_11_25/dhsa-exp.sh OUTDIR [ROUND]       # plain python, repository root, one H200
#   SMOKE=1 bash benchmarks/gpu_2026_11_25/dhsa-exp.sh OUTDIR        # tiny CPU run of the same steps
#
# ROUND (default: $ROUND, else 1): 1 = SmolLM2-135M-Instruct at 4k tokens (~240 s); 2 = gemma3-270m (base) at 4k
# plus SmolLM2's second budget and the NMS ablation (~420 s).
# Protocols: "app_a" = the text (App. A: sparse question, sparse decode, 4 initial keys, boundaries per layer);
# "authors" = their code (dense question tail, dense decode, boundaries shared by all layers, 128 initial + 128
# recent keys). Their needle script: budget 1024, block 128, NMS 8; the paper also shows 512.
# Writes flat into OUTDIR: device.txt, tests.log, needle_*.log, dhsa_needle_*_2026_11_25.examples.jsonl,
# rc_<step>.txt and times.txt.
set -uo pipefail
OUT=${1:?usage: dhsa-exp.sh OUTDIR [ROUND]}
ROUND=${2:-${ROUND:-1}}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PY:-python}
step() {  # step NAME SECONDS CMD...: run with a timeout, log, keep the exit code, go on whatever happens
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$rc" > "$OUT/rc_$name.txt"
  echo "$name: exit $rc, $(( $(date +%s) - t0 )) s" | tee -a "$OUT/times.txt"
}
$PY -c "import torch, transformers; print(torch.__version__, transformers.__version__,
torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')" > "$OUT/device.txt" 2>&1
NEEDLE=(-m kvlab.dhsa.experiments needle --depths 0.1,0.5,0.9 --initial 4 --authors-initial 128 --authors-local 128
        --chunk-size 128)
if [ "${SMOKE:-0}" = 1 ]; then
  step tests 300 $PY -m pytest tests/test_dhsa_needle_fast.py -q -x -p no:cacheprovider -k "reference_mask and not cuda"
  step needle_smollm2_4k 300 $PY "${NEEDLE[@]}" --model smollm2-135m --lengths 512 --trials 2 --budgets 384 \
    --max-new-tokens 8 --threads 1 --max-seconds 20 --out "$OUT/dhsa_needle_smoke.examples.jsonl"
  exit 0
fi
step tests 60 $PY -m pytest tests/test_dhsa_needle_fast.py -q -p no:cacheprovider
if [ "$ROUND" = 1 ]; then
  # 60 prompts x 4 methods at the paper's smaller budget (512 of 4k tokens)
  step needle_smollm2_4k 165 $PY "${NEEDLE[@]}" --model smollm2-135m --lengths 4096 --trials 20 --budgets 512 \
    --max-seconds 130 --out "$OUT/dhsa_needle_smollm2_4k_2026_11_25.examples.jsonl"
else
  step needle_gemma3_4k 200 $PY "${NEEDLE[@]}" --model gemma3-270m --lengths 4096 --trials 20 --budgets 512 \
    --max-seconds 160 --out "$OUT/dhsa_needle_gemma3_4k_2026_11_25.examples.jsonl"
  step needle_smollm2_4k_b1024 120 $PY "${NEEDLE[@]}" --model smollm2-135m --lengths 4096 --trials 20 --budgets 1024 \
    --baselines block-sparse --max-seconds 90 --out "$OUT/dhsa_needle_smollm2_4k_b1024_2026_11_25.examples.jsonl"
fi
