#!/usr/bin/env bash
# SepLLM Table 6 (separator cache capacity s = 32 / 48 / 64 at a=4, w=224, c=324) on SmolLM2-135M-Instruct:
# 30 disjoint WikiText pieces of 4,096 tokens streamed as one batch per capacity, one mean NLL per piece after the
# cache first fills, paired across capacities by piece (python -m kvlab run sepllm-separator-cache).
#
#   KVLAB_RESULTS=DIR CUDA_VISIBLE_DEVICES=N bash benchmarks/gpu/sepllm_separator_cache.sh            # one H100
#   SMOKE=1 KVLAB_RESULTS=/tmp/x PY=.venv/bin/python bash benchmarks/gpu/sepllm_separator_cache.sh    # the same code, tiny, CPU
#
# Planned n = 30 pieces: the paper's gap is small (5K tokens: ln(13.01/13.11) = -0.0077 nats for s = 64 vs 32), and
# pieces of 4,096 tokens give the separator cache room to overflow at s = 32 (about 500 separators a piece) where
# 768-token pieces barely fill it; the CPU could not stream them on the shared machine (load average above 20).
# Writes $KVLAB_RESULTS/benchmarks/results/sepllm/separator_cache_gpu/{separator_cache.examples.jsonl,run.log}.
set -uo pipefail
PY=${PY:-python3}
: "${KVLAB_RESULTS:?set KVLAB_RESULTS to the results folder}"
D="$KVLAB_RESULTS/benchmarks/results/sepllm/separator_cache_gpu"
mkdir -p "$D"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# the log this launcher tees beside the records is kvlab's too (python -m kvlab run refuses files it did not write)
"$PY" -c "import sys; from kvlab.outputs import OutputFolder; OutputFolder(sys.argv[1], 'benchmarks/gpu/sepllm_separator_cache.sh').claim(*sys.argv[2:])" \
  "$D" '*.log'
if [ "${SMOKE:-0}" = 1 ]; then
  ARGS=(--device cpu --texts 2 --tokens 340 --skip 324 --capacities 32,64 --threads 2)
else
  ARGS=(--texts 30 --tokens 4096 --capacities 32,48,64)
fi
{
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name --format=csv,noheader
  t0=$(date +%s)
  "$PY" -m kvlab run sepllm-separator-cache "${ARGS[@]}" --out "$D" 2>&1 | grep --line-buffered -v "Loading weights"
  echo "separator cache: $(( $(date +%s) - t0 )) s"
} 2>&1 | tee "$D/run.log"
