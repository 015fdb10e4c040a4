#!/usr/bin/env bash
# DHSA timings (prefill, predictor, kernel) and its needle grid as its authors run it, on one H200, plain `python` (torch 2.11, triton 3.6, transformers 5.x), from
# the repository root. One step per call (each under the device tool's 10-minute limit); results go to
# $OUT/dhsa_prefill_timings/<step>/ (python -m kvlab run dhsa-predictor-time | dhsa-prefill-e2e | dhsa-needle; logs in
# $OUT/dhsa_prefill_timings/logs/; copy them to benchmarks/results/dhsa/ and commit). Expected times on one H200 in brackets.
#
#   bash benchmarks/gpu/dhsa_prefill_timings.sh predictor   # predictor + NMS vs one layer's SDPA at 32k, 3 shapes     [~2 min]
#   bash benchmarks/gpu/dhsa_prefill_timings.sh e2e         # end-to-end prefill, SDPA vs DHSA (paper's setup), 16k/32k [~3-5 min]
#   bash benchmarks/gpu/dhsa_prefill_timings.sh kernel      # the Triton kernel vs SDPA at 32k, same run                [~1 min]
#   # the needle grid needs SmolLM2 and the essays on the machine: two staging calls first (scripts/gpu_stage.sh:
#   # `bash scripts/gpu_stage.sh pack` here; carry .cache/gpu/gguf.part1, run `bash scripts/gpu_stage.sh unpack`;
#   # carry .cache/gpu/gguf.part2 .cache/gpu/corpora.tar.xz .whl) then, in the second call or a later one:
#   source scripts/gpu_stage.sh unpack; bash benchmarks/gpu/dhsa_prefill_timings.sh needle                            [~4-6 min]
#   source scripts/gpu_stage.sh unpack; bash benchmarks/gpu/dhsa_prefill_timings.sh train   # optional, paper-size predictor [~4 min]
#
# LIMIT (seconds) overrides each step's timeout; a step killed by it keeps what it wrote (the needle records are
# appended prompt by prompt).
set -uo pipefail
OUT=${OUT:-$PWD/out}
R="$OUT/dhsa_prefill_timings"
mkdir -p "$R/logs"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
case "${1:-}" in
  predictor)
    timeout "${LIMIT:-420}" python -m kvlab run dhsa-predictor-time --out "$R/predictor" --seq 32768 \
      --shapes gemma2-2b,gemma3-270m,ops 2>&1 | tee "$R/logs/predictor.log" ;;
  e2e)
    timeout "${LIMIT:-560}" python -m kvlab run dhsa-prefill-e2e --out "$R/e2e" --shapes gemma2-2b-global,gemma3-270m \
      --seqs 16384,32768 --budget 2048 --initial 128 --local 128 --repeats 3 2>&1 | tee "$R/logs/e2e.log" ;;
  kernel)
    timeout "${LIMIT:-420}" python -m kvlab bench dhsa ops --seqs 32768 --share 0,1 --variants ranges,lists \
      --chunkings fixed64,random16-128 --no-flex --out "$R/kernel" --tag h200 2>&1 | tee "$R/logs/kernel.log" ;;
  needle)
    # Fig. 2/6 at 4k tokens: 3 depths x 20 haystacks, dense / block-sparse / DHSA (App. A) / DHSA (authors) at
    # N_b = 256 (a 6 % budget: the paper's 512 of 8k), the shipped SmolLM2 predictor; 240 prompt x method runs.
    timeout "${LIMIT:-570}" python -m kvlab run dhsa-needle --model smollm2-135m --lengths 4096 \
      --depths 0.1,0.5,0.9 --trials 20 --budgets 256 --chunk-size 32 --initial 4 --protocols app_a,authors \
      --name dhsa_needle_smollm2_4k --out "$R/needle" 2>&1 | tee "$R/logs/needle.log" ;;
  train)
    # a predictor at the paper's size (hidden 256) on 12x the windows of the shipped one, 1024 tokens each
    timeout "${LIMIT:-570}" python -m kvlab.dhsa.training --model smollm2-135m --corpus wikitext --samples 300 \
      --val-corpus paul-graham --val-samples 16 --seq-len 1024 --epochs 2 --hidden 256 --lr 3e-4 --device cuda \
      --out "$R/smollm2-135m-h256.pt" 2>&1 | tee "$R/logs/train.log" ;;
  *) echo "usage: bash benchmarks/gpu/dhsa_prefill_timings.sh predictor|e2e|kernel|needle|train" >&2; exit 2 ;;
esac
