#!/usr/bin/env bash
# The GPU calls of the 2026-11-24 session (issues 23 and 24), as they ran on one H200 through the device tool, from
# the repo root with plain `python` (torch 2.11, triton 3.6, transformers 5.x preinstalled; no registry access).
# Assets travel in two carries (scripts/gpu_stage.sh); results are written under build/gpu (kept between calls while
# the machine stays warm, so a cut run resumes) and copied to $OUT at the end of each call.
#
#   call 1: carry .cache/gpu/gguf.part1;                       bash benchmarks/gpu/ledger_reruns.sh dhsa
#   call 2: carry .cache/gpu/gguf.part2 .cache/gpu/corpora.tar.xz .whl;  bash benchmarks/gpu/ledger_reruns.sh main
#   call 3 (if units are left): the same command as call 2 with `resume` (runs DHSA's needle grid too)
#   The machine went back after 30 minutes held; on the next one:
#   call 4: carry .cache/gpu/gguf.part1;                        bash benchmarks/gpu/ledger_reruns.sh kernels
#   call 5: carry part2, corpora, .whl and the REFORM parts so far; bash benchmarks/gpu/ledger_reruns.sh reform
#   call 6: the same, if REFORM units are left
#
# Phases:
#   dhsa    DHSA's predictor time vs dense SDPA of one layer and the end-to-end prefill in the paper's setup
#           (random weights: needs no asset)
#   main    REFORM Tables 1/4/5/6a re-run, LaCache RULER + passkey re-run, OrthoRank Table 1/3 over C4 documents and
#           SepLLM GSM8K at matched r.KV, side by side (16 cores, one GPU), each stopping new units after LIMIT s
#   resume  the unfinished units of `main`, then DHSA's needle grid under both protocols
set -uo pipefail
phase=${1:?usage: ledger_reruns.sh dhsa|main|resume}
OUT=${OUT:-$PWD/out}
LIMIT=${LIMIT:-450}
bash scripts/gpu_stage.sh unpack > "$OUT/stage_$phase.log" 2>&1
export KVLAB_CACHE="$PWD/.cache/kvlab" PYTHONPATH="$PWD" TOKENIZERS_PARALLELISM=false
unset TRITON_INTERPRET
G=build/gpu
mkdir -p "$G"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$G/device.txt" 2>&1
python -c "import torch, transformers; print(torch.__version__, transformers.__version__)" >> "$G/device.txt"
case "$phase" in
  dhsa)
    timeout 240 python -m kvlab run dhsa-predictor-time --out "$G/dhsa_predictor" > "$G/dhsa_predictor.log" 2>&1
    echo "predictor exit $?" >> "$G/times.txt"
    timeout 280 python -m kvlab run dhsa-prefill-e2e --out "$G/dhsa_e2e" > "$G/dhsa_e2e.log" 2>&1
    echo "e2e exit $?" >> "$G/times.txt" ;;
  kernels)
    # the Triton kernels against their references on a real GPU (CI runs them in the interpreter)
    timeout 500 python -m pytest tests/test_sep_attention.py tests/test_ragged_decode.py tests/test_dhsa.py \
      tests/test_dhsa_protocol.py tests/test_orthorank.py tests/test_reform.py tests/test_fast_decode.py -q \
      -p no:cacheprovider -k "triton or cuda or gpu or kernel" > "$G/gpu_tests.log" 2>&1
    echo "gpu tests exit $?" >> "$G/times.txt" ;;
  reform)
    python -c "import kvlab; kvlab.load_model('smollm2-135m', device='cpu')" > "$G/convert.log" 2>&1
    t0=$(date +%s)
    timeout $((LIMIT + 90)) python benchmarks/reform_reruns.py run --out "$G/reform" --workers 13 --limit "$LIMIT" \
      > "$G/reform_${phase}_$t0.log" 2>&1 &
    if [ "${NEEDLE:-0}" = 1 ]; then  # 75 s a prompt at 4k (7 patterns): too slow for this session
      timeout $((LIMIT + 60)) python -m kvlab run dhsa-needle --lengths 4096 --trials 20 --budgets 128,256 \
        --name dhsa_needle_4096 --out "$G/dhsa_needle" > "$G/dhsa_needle.log" 2>&1 &
    fi
    wait
    echo "$phase: $(( $(date +%s) - t0 )) s" >> "$G/times.txt" ;;
  main|resume)
    # convert the GGUF once before the parallel jobs start (each would otherwise race to write the same copy)
    python -c "import kvlab; kvlab.load_model('smollm2-135m', device='cpu')" > "$G/convert.log" 2>&1
    t0=$(date +%s)
    timeout $((LIMIT + 90)) python benchmarks/reform_reruns.py run --out "$G/reform" --workers 7 --limit "$LIMIT" \
      > "$G/reform_$phase.log" 2>&1 &
    timeout $((LIMIT + 90)) python benchmarks/lacache_reruns.py --out "$G/lacache" --workers 5 --limit "$LIMIT" \
      > "$G/lacache_$phase.log" 2>&1 &
    if [ "$phase" = main ]; then
      timeout $((LIMIT + 90)) bash benchmarks/gpu/orthorank_docs_sepllm_gsm8k.sh "$G/o23" > "$G/o23.log" 2>&1 &
    else
      timeout $((LIMIT + 90)) python -m kvlab run dhsa-needle --lengths 4096 --trials 20 --budgets 128 \
        --authors-initial 128 --authors-local 128 --name dhsa_needle_4096 --out "$G/dhsa_needle" \
        > "$G/dhsa_needle.log" 2>&1 &
    fi
    wait
    echo "$phase: $(( $(date +%s) - t0 )) s" >> "$G/times.txt" ;;
esac
tar czf "$OUT/gpu.tgz" -C build gpu
