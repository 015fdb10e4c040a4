#!/usr/bin/env bash
# sep's GPU round (issue 28): SepLLM's Triton attention on one H200, the "tma" variant (far keys from a compacted
# K/V copy through tensor descriptors) beside the first release's "gather" variant, dense SDPA and FlexAttention.
# Writes everything flat into OUTDIR:
#
#   bash benchmarks/gpu/sepllm_attention_kernel.sh OUTDIR        # from the repository root, plain `python`
#
# Steps (each with its own time limit and log; a failing step does not stop the others; steps.txt has the exits):
#   tests     the kernels' GPU tests of the default variant (float64 oracle, 4k-token shapes): tests/test_sep_attention.py
#   ops       python -m kvlab bench sepllm ops at 32k: SDPA, triton-gather (the old kernel), triton-tma (the new one) and
#             two options of it in one run, random 8 % and Paradise Lost separators (package data kvlab/sepllm/data)
#                                                                                 -> sepllm_ops_h200.{json,md,png}
#   tune      python -m kvlab bench sepllm tune at 32k, random 8 %: per-part forward times, the far loop's rate on
#             dense tiles (every key kept), a short sweep near the default tiles, each checked against the old kernel
#                                                                                 -> sepllm_tune_h200.{json,md}
#   ops_flex  the same ops with FlexAttention (compiled, slow to build) beside SDPA and triton-tma, in the time left
#             (SEP_FLEX=0 leaves it out)                                          -> sepllm_ops_h200_flex.{json,md,png}
# Round 1 (2026-11-25 01:20) ran tests, ops without Flex, and a wider tune (--parts parts,fwd,dq,splits,dkdv).
# Environment: SEP_STEPS (default tests,ops,tune,ops_flex), SEP_FLEX (1), SEP_SEQS (32768), BUDGET (seconds, 175).
# Smoke test on a CPU (interpreter tests only): SEP_STEPS=tests bash ... /tmp/out
set -uo pipefail
OUT=${1:?usage: sep.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python}
STEPS=${SEP_STEPS:-tests,ops,tune,ops_flex}
SEQS=${SEP_SEQS:-32768}
START=$(date +%s)
BUDGET=${BUDGET:-175}

step() {  # step NAME LIMIT_S CMD...: run with a limit (never past the budget), log to NAME.log, record the exit
  local name=$1 limit=$2; shift 2
  case ",$STEPS," in *",$name,"*) ;; *) return ;; esac
  local left=$(( BUDGET - ($(date +%s) - START) ))
  (( left < limit )) && limit=$left
  if (( limit < 5 )); then echo "$name: skipped (budget spent)" >> "$OUT/steps.txt"; return; fi
  local t0=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $?, $(( $(date +%s) - t0 )) s (limit $limit)" >> "$OUT/steps.txt"
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  $PY -c "import torch, triton; print(torch.__version__, triton.__version__)"; } > "$OUT/device.txt" 2>&1
git log -1 --format='%H %s' > "$OUT/commit.txt" 2>/dev/null

XDIST=""
$PY -c "import xdist" 2>/dev/null && XDIST="-n 8"
step tests 50 $PY -m pytest tests/test_sep_attention.py -q -x -p no:cacheprovider $XDIST \
  -k "(tma and (large or strided or tile_shapes)) or compact or default_variant"
# the benchmark: SDPA, the old kernel (gather) and the new one (tma, and its two options) in one run
step ops 70 $PY -m kvlab bench sepllm ops --seqs "$SEQS" --variants tma,gather,tma+split,tma+ws --budget 0.3 \
  --no-flex --out "$OUT" --tag h200
# where the forward's time goes (far loop, window loop, the rest; the far loop's rate on dense tiles), a sweep near
# the default tiles
step tune 35 $PY -m kvlab bench sepllm tune --seq 32768 --variants tma --parts parts,fwd-near --budget 0.25 \
  --out "$OUT" --tag h200
# FlexAttention (the paper's kernel, compiled: slow to build) beside SDPA and the new kernel, in the time left
FLEX_TAG=h200_flex
[ "${SEP_FLEX:-1}" = "0" ] && FLEX_TAG=""
[ -n "$FLEX_TAG" ] && step ops_flex 90 $PY -m kvlab bench sepllm ops --seqs "$SEQS" --variants tma --budget 0.3 \
  --out "$OUT" --tag "$FLEX_TAG"
for f in "$OUT"/*_h200*.*; do  # the names the results folder keeps
  [ -e "$f" ] && mv "$f" "$OUT/sepllm_$(basename "$f")"
done
cat "$OUT/steps.txt"
