#!/usr/bin/env bash
# The repository's GPU tests: every test that runs a Triton kernel or needs CUDA, run on one GPU (the CPU suite runs
# the same kernels only in Triton's interpreter, which cannot show what a compiled kernel does with dead memory,
# fp32 dots or NaN-ignoring max).
#
#   KVLAB_RESULTS=DIR CUDA_VISIBLE_DEVICES=N bash benchmarks/gpu/gpu_tests.sh           # ~5 min on one H100
#   SMOKE=1 KVLAB_RESULTS=/tmp/x PY=.venv/bin/python bash benchmarks/gpu/gpu_tests.sh   # the same code, CPU, tiny
#
# Three pytest runs, one log and one JUnit XML each (per-test outcomes and times), under
# $KVLAB_RESULTS/benchmarks/results/gpu_tests/:
#   static_engine  tests/test_static_triton.py, whole, and the dead-slot test of tests/test_robustness_round4.py
#                  (the static engine's kernel against its float64 oracle, dead slots, tuned configs, CUDA graphs)
#   triton         the Triton-marked tests (`-m triton`) of the kernel files (DHSA, OrthoRank, ragged decode,
#                  REFORM, separator attention), compiled for the GPU
#   cuda           the CUDA-only tests named `cuda` (`-k cuda`) of the other files (CUDA graphs, the SDPA backend)
# summary.txt holds one line per run (exit code, seconds, pytest's last line). With SMOKE=1 each run keeps only its
# dead-slot / live-entry tests, in the interpreter (TRITON_INTERPRET=1), so the script itself is checked on a CPU.
# Needs pytest on the GPU host (a wheel in .whl/ if the image lacks it: scripts/gpu_stage.sh installs them).
set -uo pipefail
PY=${PY:-python3}
: "${KVLAB_RESULTS:?set KVLAB_RESULTS to the results folder}"
D="$KVLAB_RESULTS/benchmarks/results/gpu_tests"
mkdir -p "$D"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c "import pytest" 2>/dev/null; then
  echo "gpu_tests: $PY cannot import pytest; put a pytest wheel (and pluggy, iniconfig) in .whl/ before staging," \
       "or set PY to a Python that has it" | tee "$D/summary.txt"
  exit 3
fi

if [ "${SMOKE:-0}" = 1 ]; then
  export TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES=""
  SELECT=(-k "live_entries or dead_slots")
  LIMIT=(300 120 120)
else
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_tests: torch sees no CUDA device')" \
    || exit 4
  unset TRITON_INTERPRET
  SELECT=()
  LIMIT=(150 210 90)
fi
"$PY" - <<'EOF' | tee "$D/device.txt"
import torch, triton
print("torch", torch.__version__, "triton", triton.__version__,
      "device", torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (interpreter)")
EOF

STATIC=(tests/test_static_triton.py tests/test_robustness_round4.py::test_static_triton_opt_in_configs_ignore_dead_slots)
TRITON=(tests/test_dhsa.py tests/test_dhsa_chunking.py tests/test_dhsa_kernel.py tests/test_dhsa_protocol.py
        tests/test_orthorank.py tests/test_ragged_decode.py tests/test_reform.py tests/test_sep_attention.py)
CUDA=(tests/test_dhsa_needle_fast.py tests/test_fast_decode.py)  # the kernel files' cuda tests are Triton-marked

status=0
run() {  # NAME SECONDS PYTEST-ARGS...
  local name=$1 limit=$2 t0 rc; shift 2
  echo "== $name: pytest $* (stopped after $limit s)"
  t0=$(date +%s)
  timeout -k 10 "$limit" "$PY" -m pytest -p no:cacheprovider -v -rfEs --durations=10 \
    --junitxml="$D/$name.junit.xml" "$@" > "$D/$name.log" 2>&1 < /dev/null
  rc=$?
  tail -n 1 "$D/$name.log"
  echo "$name: exit $rc$([ $rc = 124 ] && echo " (stopped at $limit s)"), $(( $(date +%s) - t0 )) s, $(tail -n 1 "$D/$name.log")" \
    >> "$D/summary.txt"
  # 5: no test selected (a file without a matching test in SMOKE): not a failure
  if [ $rc -ne 0 ] && [ $rc -ne 5 ]; then status=1; fi
}
: > "$D/summary.txt"
run static_engine "${LIMIT[0]}" "${STATIC[@]}" "${SELECT[@]}"
if [ "${SMOKE:-0}" = 1 ]; then
  run triton "${LIMIT[1]}" "${TRITON[@]}" -m triton "${SELECT[@]}"
  run cuda "${LIMIT[2]}" "${CUDA[@]}" -m "not triton" "${SELECT[@]}"
else
  run triton "${LIMIT[1]}" "${TRITON[@]}" -m triton
  run cuda "${LIMIT[2]}" "${CUDA[@]}" -m "not triton" -k cuda
fi
cat "$D/summary.txt"
exit $status
