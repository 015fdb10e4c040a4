#!/usr/bin/env bash
# DHSA's Table 1 on the LongBench stand-in kvlab can build (SQuAD single-document, HotpotQA multi-document and
# few-shot QA prompts of 2,048 tokens), under the authors' protocol with block-sparse under the same protocol as
# the control, and under the text's protocol (App. A) with its block-sparse; dense attention as the ceiling.
#
#   KVLAB_RESULTS=DIR CUDA_VISIBLE_DEVICES=N bash benchmarks/gpu/dhsa_longbench.sh          # ~6 min on one H100
#   SMOKE=1 KVLAB_RESULTS=/tmp/x PY=.venv/bin/python bash benchmarks/gpu/dhsa_longbench.sh  # the same code, tiny, CPU
#
# SmolLM2-135M-Instruct, budget 512 (the paper: 2k of LongBench's longer prompts), PER_TASK questions per task
# (default 24: 72 questions, paired across methods), the shipped layer-0 predictor (kvlab/dhsa/data; run after
# dhsa_needle.sh on the same GPU to use the one it trains). One record per (question, method): token F1 and the
# answer's NLL, with every setting and the keys ranked per query. Stops starting questions after QA_SECONDS
# (default 330). Writes $KVLAB_RESULTS/benchmarks/results/dhsa/dhsa_longbench_smollm2_2k.examples.jsonl.gz
# (python -m kvlab run dhsa-qa) and $KVLAB_RESULTS/logs/dhsa_longbench_smollm2_2k.log.
# PROTOCOLS (default "authors,app_a"): the App. A protocol ranks keys per query on the torch path, about ten times
# slower a question than the authors'; PART names a second file (dhsa_longbench_smollm2_2k.PART.*) for a run that
# asks another question than the first.
set -uo pipefail
PY=${PY:-python3}
: "${KVLAB_RESULTS:?set KVLAB_RESULTS to the results folder}"
D="$KVLAB_RESULTS/benchmarks/results/dhsa"
mkdir -p "$KVLAB_RESULTS/logs"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PRED=shipped
[ -f "$KVLAB_RESULTS/kvlab/dhsa/data/smollm2-135m-l0.pt" ] && PRED="$KVLAB_RESULTS/kvlab/dhsa/data/smollm2-135m-l0.pt"
if [ "${SMOKE:-0}" = 1 ]; then
  ARGS=(--qa-per-task "${PER_TASK:-24}" --qa-context 2048 --budgets 512 --chunk-size 32 --smoke)
else
  ARGS=(--qa-per-task "${PER_TASK:-24}" --qa-context 2048 --budgets 512 --chunk-size 32 --max-new-tokens 16)
fi
echo "== qa: LongBench stand-in, predictor $PRED"
t0=$(date +%s)
NAME=dhsa_longbench_smollm2_2k${PART:+.$PART}
timeout "${QA_SECONDS:-330}" "$PY" -m kvlab run dhsa-qa --model smollm2-135m --predictor "$PRED" "${ARGS[@]}" \
  --protocols "${PROTOCOLS:-authors,app_a}" --baselines dense,block-sparse --backend sdpa \
  --name "$NAME" --out "$D" 2>&1 | grep -v "Loading weights" | tee "$KVLAB_RESULTS/logs/$NAME.log"
echo "qa: $(( $(date +%s) - t0 )) s"
[ -s "$D/$NAME.examples.jsonl.gz" ] || { echo "qa wrote no records" >&2; exit 1; }
