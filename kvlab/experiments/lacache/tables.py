#!/usr/bin/env bash
# Issue 14, helper "lacache_tables": LaCache Table 5 (RULER-style tasks), Tables 3/4 (LongBench stand-in: SQuAD
# article / HotpotQA paragraphs padded with distractor paragraphs) and Table 6 (overlap O = 0, S/4, S/2) on the
# pretrained SmolLM2-135M (float32), 2K and 4K-token inputs: exactly the 126 `longtask` jobs of
# benchmarks/quality_runs.py (lacache_task_jobs: 5 RULER kinds x 6 examples + 2 QA tasks x 8 questions, 9 policies,
# 2 lengths = 828 answered prompts), all on the H100 (GPU workers; one model copy each).
#
# Needs the model and corpora, which are not in git: stage .devw/st/01, 02 (model pieces), 03 (paul-graham, squad,
# wheels incl. dask/distributed) and 04 (hotpotqa) as for gpujobs/fidelity2.sh, one call each:
#   run(carry=[".devw/st/NN"], command="mkdir -p /tmp/devw && cp -a .devw/st/NN/. /tmp/devw/")
# then:  bash benchmarks/results/lacache/tables/run.sh
# Results: one JSON per job in /tmp/devw/lct (finished jobs are skipped on a re-run, so a second call continues),
# copied to $OUT/lacache_tables/, plus run.log and the rendered tables (tables.md).
#   GPUW: GPU worker processes (default 8); LIMIT: seconds (default 480); ONLY: regex (default every new job).
set -uo pipefail
OUT=${OUT:-$PWD/out}; R="$OUT/lacache_tables"; mkdir -p "$R"
[ -f gpujobs/setup_devw.sh ] && source gpujobs/setup_devw.sh  # our GPU machine only: assets staged into a kvlab cache
nvidia-smi -L || true
ONLY=${ONLY:-'^lacache-(ruler|longqa)-'}
timeout ${LIMIT:-480} python benchmarks/quality_runs.py run --out /tmp/devw/lct --only "$ONLY" --cpu-workers 1 \
  --gpu-workers ${GPUW:-8} --quiet > "$R/run.log" 2>&1
echo "exit $?"
grep -a "done,\|failed\|FAILED\|Error" "$R/run.log" | tail -8
tar czf "$R/records.tgz" -C /tmp/devw lct
ls /tmp/devw/lct/*.json 2>/dev/null | wc -l
python benchmarks/quality_report.py /tmp/devw/lct --summary "$R/lacache_tables_summary.json" > "$R/tables.md" 2>&1
sed -n '/## LaCache long-input tables/,$p' "$R/tables.md"
