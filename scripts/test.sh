#!/usr/bin/env bash
# Run the tests: set up (.venv, install, default assets), then the unit tests, then every notebook
# (with the small parameters of notebooks/params/NN_name.ci.yaml) through nbval.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage's wall time is printed as it ends and as a table at the end (the CI log shows where the time goes).
STAGES=""; T0=$(date +%s); T=$T0
stage() {  # stage NAME: close the stage that ran since the last call
  local now dt; now=$(date +%s); dt=$((now - T)); T=$now
  STAGES="$STAGES$(printf '%-22s %6d s' "$1" "$dt")\n"
  echo "kvlab: stage $1 took $dt s"
}
trap 'printf "kvlab: stage times\n$STAGES%-22s %6d s\n" total $(( $(date +%s) - T0 ))' EXIT
bash scripts/setup.sh
stage set-up
# The peer check's own environment installs while the unit tests run (pip waits on the network and the disk).
mkdir -p build
bash scripts/peers.sh --install-only > build/peers-install.log 2>&1 &
PEERS_INSTALL=$!
# Without a GPU, Triton kernels run in Triton's interpreter.
if ! .venv/bin/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  export TRITON_INTERPRET=1
fi
export MPLBACKEND=Agg
# pytest-xdist: one worker per core, each test file kept on one worker (files share fixtures and build folders).
# No test's call may take over 60 s here (tests/conftest.py); the long ones run with `bash scripts/test.sh --full`.
.venv/bin/python -m pytest tests -q -p no:cacheprovider -n auto --dist loadfile --durations=50 \
  --max-test-seconds 60 "$@"
stage unit-tests
if ! wait "$PEERS_INSTALL"; then cat build/peers-install.log >&2; exit 1; fi
bash scripts/peers.sh   # the kvpress peer check, in its own environment (kvpress needs transformers<5.3)
stage peer-check
.venv/bin/python -m kvlab notebooks prepare --out build/notebooks
# The notebooks run once, here: nbval checks them and the tolerant-checks plugin saves each as executed into build/executed
# for the book. MPLBACKEND is unset for the kernels so that matplotlib's inline backend makes figures outputs.
rm -rf build/executed
# One notebook at a time: two side by side (pytest-xdist) took 954 s, one after the other 643 s in an earlier run of
# the same 2-core kind of machine. --durations names the slow cells.
env -u MPLBACKEND KVLAB_EXECUTED_DIR=build/executed \
  .venv/bin/python -m pytest build/notebooks --nbval-lax --nbval-current-env -q -p no:cacheprovider \
  --nbval-cell-timeout=900 --durations=15
stage notebooks

# The book from those executed copies (nothing runs again): build/book/html/index.html.
bash scripts/book.sh
stage book

# The browser checks (tests/browser): the book and the lab in headless Chromium from the system's packages.
if ! { command -v chromium || command -v chromium-browser; } >/dev/null || ! command -v chromedriver >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "kvlab: installing Chromium and its driver for the browser checks: apt-get install chromium chromium-driver"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } \
      >/dev/null 2>&1 || echo "kvlab: apt-get could not install chromium chromium-driver" >&2
  fi
  if ! command -v chromedriver >/dev/null; then
    echo "kvlab: no Chromium + chromedriver here (needs root and apt-get, or install them yourself:" \
      "apt-get install chromium chromium-driver); the browser checks will be skipped" >&2
  fi
fi
.venv/bin/python -m pytest tests/browser -q -p no:cacheprovider -rs
stage browser-checks
echo "kvlab: the book is in build/book/html/index.html, screenshots in build/screenshots/"
