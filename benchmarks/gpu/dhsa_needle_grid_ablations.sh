#!/usr/bin/env bash
# dhsa-exp (issue 24): DHSA's needle grid (Fig. 2/6) under both protocols on one H200, through the fast path
# (`--backend sdpa`: the kept set from the chunk ranking + torch SDPA, prefill and App. A decode), one record per
# (prompt, method) with the raw answer; App. B's ablations (NMS none / 8 / 64, newline boundaries); Table 2's
# latency / memory beside the needle accuracy; GPU tests of the fast path first.
#
#   bash benchmarks/gpu/dhsa_needle_grid_ablations.sh OUTDIR [ROUND]       # plain python, repository root, one H200
#   SMOKE=1 bash benchmarks/gpu/dhsa_needle_grid_ablations.sh OUTDIR        # tiny CPU run of the same steps
#
# ROUND (default: $ROUND, else 2): 1 = SmolLM2-135M-Instruct at 4k tokens (~240 s, ran 2026-11-25 01:35);
# 2 = gemma3-270m (base) at 4k, the rest of round 1's grid, the ablations and Table 2 (~420 s).
# Protocols: "app_a" = the text (App. A: sparse question, sparse decode, 4 initial keys, boundaries per layer);
# "authors" = their code (dense question tail, dense decode, boundaries shared by all layers, 128 initial + 128
# recent keys). Their needle script: budget 1024, blocks of 128, NMS 8; the paper also shows 512 (used here).
# Writes into OUTDIR: device.txt, tests.log, <step>.log, rc_<step>.txt and times.txt, and in OUTDIR/records (the
# experiments' folder, python -m kvlab run dhsa-needle | dhsa-boundaries | dhsa-table2) dhsa_*_2026_11_25.examples.jsonl.gz
# and dhsa_table2_*.{json,md}.
set -uo pipefail
OUT=${1:?usage: dhsa-exp.sh OUTDIR [ROUND]}
ROUND=${2:-${ROUND:-2}}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PY:-python}
source benchmarks/gpu/step.sh  # step NAME SECONDS CMD...: a time limit, a log, the exit code kept
$PY -c "import torch, transformers; print(torch.__version__, transformers.__version__,
torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')" > "$OUT/device.txt" 2>&1
X=($PY -m kvlab run)
R="$OUT/records"
C=(--depths 0.1,0.5,0.9 --initial 4 --authors-initial 128 --authors-local 128 --chunk-size 128)
L=4096; B=512; T=20; K=1  # tokens, budget, haystacks per cell; K scales the time limits
TESTS=(-k "not slow")
if [ "${SMOKE:-0}" = 1 ]; then
  T=2; C+=(--smoke); TESTS=(-k "reference_mask and not cuda")
fi
lim() { $PY -c "print(max(5, round($1 * $K)))"; }
S=(--model smollm2-135m --lengths $L --budgets $B)
step tests 45 $PY -m pytest tests/test_dhsa_needle_fast.py -q -p no:cacheprovider "${TESTS[@]}"
if [ "$ROUND" = 1 ]; then
  # 60 prompts x 4 methods at the paper's smaller budget (512 of 4k tokens); ran 23 prompts in 130 s (App. A decode
  # through the reference loop then, 1.3 s of a 2 s prompt; round 2 has the all-at-once decode)
  step needle_smollm2_4k 165 "${X[@]}" dhsa-needle "${C[@]}" "${S[@]}" --trials $T --max-seconds 130 \
    --name dhsa_needle_smollm2_4k_2026_11_25 --out "$R"
  exit 0
fi
# gemma3-270m (base): no predictor is shipped for it, so DHSA cuts at the oracle's boundaries (App. B's labelling rule
# on the attention of the first global layer, shared by the authors' protocol): DHSA with a perfect predictor
step needle_gemma3_4k $(lim 140) "${X[@]}" dhsa-needle "${C[@]}" --model gemma3-270m --lengths $L --budgets $B \
  --predictor oracle --suffix " oracle" --trials $T --max-seconds $(lim 95) \
  --name dhsa_needle_gemma3_4k_2026_11_25 --out "$R"
# SmolLM2: the rest of round 1's grid (it stopped after 23 of 60 prompts, inside trial 7)
step needle_smollm2_4k_rest $(lim 100) "${X[@]}" dhsa-needle "${C[@]}" "${S[@]}" --trials $T --first-trial $((T * 2 / 5)) \
  --max-seconds $(lim 70) --name dhsa_needle_smollm2_4k_rest_2026_11_25 --out "$R"
# App. B: what NMS none / 8 / 64 does to the chunks (attention mass kept, chunk counts), block-sparse beside
step boundaries_smollm2_4k $(lim 50) "${X[@]}" dhsa-boundaries "${C[@]}" "${S[@]}" --trials $(( T * 7 / 20 > 0 ? T * 7 / 20 : 1 )) \
  --protocols app_a --nms-window 0,8,64 --name dhsa_boundaries_smollm2_4k_2026_11_25 --out "$R"
# ... and to the needle (authors' protocol; NMS 8 is the main run)
step needle_smollm2_4k_nms $(lim 60) "${X[@]}" dhsa-needle "${C[@]}" "${S[@]}" --trials $T --protocols authors \
  --baselines none --nms-window 0,64 --max-seconds $(lim 40) --name dhsa_needle_smollm2_4k_nms_2026_11_25 --out "$R"
# Table 2: one prefill's latency / peak memory per method and backend, the needle accuracy of round 1 beside it
step table2_smollm2_4k $(lim 60) "${X[@]}" dhsa-table2 "${C[@]}" "${S[@]}" --repeats 3 \
  --needle-file benchmarks/results/dhsa/dhsa_needle_smollm2_4k_2026_11_25.examples.jsonl.gz \
  --timing-backends torch,sdpa,$([ "${SMOKE:-0}" = 1 ] && echo sdpa || echo triton) \
  --name dhsa_table2_smollm2_4k_2026_11_25 --out "$R"
# App. B: newline boundaries added to the predicted ones (authors' protocol)
step needle_smollm2_4k_newlines $(lim 45) "${X[@]}" dhsa-needle "${C[@]}" "${S[@]}" --trials $T --protocols authors \
  --baselines none --newlines --suffix " newlines" --max-seconds $(lim 30) \
  --name dhsa_needle_smollm2_4k_newlines_2026_11_25 --out "$R"
