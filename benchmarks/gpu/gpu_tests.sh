#!/usr/bin/env bash
# The repository's GPU tests: every test that runs a Triton kernel or needs CUDA, run on one GPU (the CPU suite runs
# the same kernels only in Triton's interpreter, which cannot show what a compiled kernel does with dead memory,
# fp32 dots or NaN-ignoring max).
#
#   KVLAB_RESULTS=DIR CUDA_VISIBLE_DEVICES=N bash benchmarks/gpu/gpu_tests.sh           # up to 40 min on a fresh GPU
#   GPU_TEST_SETS="triton" ... bash benchmarks/gpu/gpu_tests.sh                           # one set (or several)
#   SMOKE=1 KVLAB_RESULTS=/tmp/x PY=.venv/bin/python bash benchmarks/gpu/gpu_tests.sh   # the same code, CPU, tiny
#
# Three pytest runs, one log and one JUnit XML each (per-test outcomes and times), under
# $KVLAB_RESULTS/benchmarks/results/gpu_tests/:
#   static_engine  tests/test_static_triton.py, whole, and the dead-slot test of tests/test_bad_inputs.py
#                  (the static engine's kernel against its float64 oracle, dead slots, tuned configs, CUDA graphs)
#   triton         the Triton-marked tests (`-m triton`) of the kernel files (DHSA, OrthoRank, ragged decode,
#                  REFORM, separator attention), compiled for the GPU
#   cuda           the CUDA-only tests named `cuda` (`-k cuda`) of the other files (CUDA graphs, the SDPA backend)
# summary.txt holds one line per run (exit code, seconds, pytest's last line) and summary.json the same per set
# (device, exit code, seconds, limit, stopped, and the tests passed / failed / errors / skipped from the JUnit XML);
# tests/test_gpu_test_summary.py fails on a committed summary.json with a failure or a stopped set. Each set's limit
# fits a run on a fresh machine, Triton's compilation of every kernel included (a fresh machine compiles every
# kernel on first use: the Triton set ran past 210 s there); run the script detached (`bg:gpu_tests=2700`, then
# `collect:gpu_tests`) when a call allows less. With SMOKE=1 each run keeps only its
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
  LIMIT=(${STATIC_LIMIT:-600} ${TRITON_LIMIT:-1500} ${CUDA_LIMIT:-400})
fi
"$PY" - <<'EOF' | tee "$D/device.txt"
import torch, triton
print("torch", torch.__version__, "triton", triton.__version__,
      "device", torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (interpreter)")
EOF

STATIC=(tests/test_static_triton.py tests/test_bad_inputs.py::test_static_triton_opt_in_configs_ignore_dead_slots)
TRITON=(tests/test_dhsa.py tests/test_dhsa_chunking.py tests/test_dhsa_kernel.py tests/test_dhsa_fast_selection.py
        tests/test_dhsa_protocol.py
        tests/test_orthorank.py tests/test_ragged_decode.py tests/test_reform.py tests/test_sep_attention.py)
CUDA=(tests/test_dhsa_needle_fast.py tests/test_fast_decode.py)  # the kernel files' cuda tests are Triton-marked

status=0
run() {  # NAME SECONDS PYTEST-ARGS...
  local name=$1 limit=$2 t0 rc; shift 2
  echo "== $name: pytest $* (stopped after $limit s)"
  t0=$(date +%s)
  rm -f "$D/$name.junit.xml"  # never read an earlier run's counts
  timeout -k 10 "$limit" "$PY" -m pytest -p no:cacheprovider -v -rfEs --durations=10 --full \
    --junitxml="$D/$name.junit.xml" "$@" > "$D/$name.log" 2>&1 < /dev/null
  rc=$?
  tail -n 1 "$D/$name.log"
  echo "$name $rc $(( $(date +%s) - t0 )) $limit" >> "$D/.sets"
  echo "$name: exit $rc$([ $rc = 124 ] && echo " (stopped at $limit s)"), $(( $(date +%s) - t0 )) s, $(tail -n 1 "$D/$name.log")" \
    >> "$D/summary.txt"
  # 5: no test selected (a file without a matching test in SMOKE): not a failure
  if [ $rc -ne 0 ] && [ $rc -ne 5 ]; then status=1; fi
}
: > "$D/summary.txt"
: > "$D/.sets"
SETS=" ${GPU_TEST_SETS:-static_engine triton cuda} "
for s in $SETS; do
  case $s in static_engine|triton|cuda) ;;
    *) echo "gpu_tests: unknown set '$s' in GPU_TEST_SETS; the sets are static_engine, triton, cuda"; exit 2;;
  esac
done
want() { [[ "$SETS" == *" $1 "* ]]; }
if want static_engine; then run static_engine "${LIMIT[0]}" "${STATIC[@]}" "${SELECT[@]}"; fi
if [ "${SMOKE:-0}" = 1 ]; then
  if want triton; then run triton "${LIMIT[1]}" "${TRITON[@]}" -m triton "${SELECT[@]}"; fi
  if want cuda; then run cuda "${LIMIT[2]}" "${CUDA[@]}" -m "not triton" "${SELECT[@]}"; fi
else
  if want triton; then run triton "${LIMIT[1]}" "${TRITON[@]}" -m triton; fi
  if want cuda; then run cuda "${LIMIT[2]}" "${CUDA[@]}" -m "not triton" -k cuda; fi
fi
# summary.json: one entry per set run, its counts read from its JUnit XML (a set stopped by its limit has none)
"$PY" - "$D" "${SMOKE:-0}" <<'EOF'
import json, pathlib, sys
import xml.etree.ElementTree as ET

d, smoke = pathlib.Path(sys.argv[1]), sys.argv[2] == "1"
sets = {}
for line in (d / ".sets").read_text().splitlines():
    name, rc, seconds, limit = line.split()
    entry = {"exit": int(rc), "seconds": int(seconds), "limit_s": int(limit), "stopped": int(rc) in (124, 137),
             "tests": None, "passed": None, "failed": None, "errors": None, "skipped": None}
    xml = d / f"{name}.junit.xml"
    if xml.exists() and not entry["stopped"]:
        root = ET.parse(xml).getroot()
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
        entry.update(tests=n["tests"], failed=n["failures"], errors=n["errors"], skipped=n["skipped"],
                     passed=n["tests"] - n["failures"] - n["errors"] - n["skipped"])
    sets[name] = entry
device = (d / "device.txt").read_text().strip() if (d / "device.txt").exists() else ""
(d / "summary.json").write_text(json.dumps({"device": device, "smoke": smoke, "sets": sets}, indent=1) + "\n")
EOF
rm -f "$D/.sets"
cat "$D/summary.txt"
exit $status
