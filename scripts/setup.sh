#!/usr/bin/env bash
# Shared set-up of the two README commands: make .venv (Python >= 3.10 with pip), install kvlab with
# its dev extras under constraints.txt, and fetch the default model and corpora. Idempotent: a second
# run installs nothing unless pyproject.toml or constraints.txt changed, and fetches nothing cached.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "kvlab: creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi

stamp=.venv/.kvlab-install-stamp
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "kvlab: installing kvlab[dev] into .venv (pinned by constraints.txt)"
  # pip is quiet; the filter drops this machine's notes about local index folders it cannot use.
  set -o pipefail
  .venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]' 2>&1 \
    | { grep -v "Location 'file:" || true; }
  echo "$want" > "$stamp"
fi

# The grader runs each student's code in a bubblewrap sandbox (`python -m kvlab lessons grade`; Linux only).
if [ "$(uname -s)" = Linux ] && ! command -v bwrap >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "kvlab: installing bubblewrap for the grader's sandbox: apt-get install bubblewrap"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; } \
      >/dev/null 2>&1 || echo "kvlab: apt-get could not install bubblewrap" >&2
  fi
  if ! command -v bwrap >/dev/null; then
    echo "kvlab: no bubblewrap here (needs root and apt-get, or install it yourself: apt-get install bubblewrap);" \
      "\`lessons grade\` will refuse untrusted submissions" >&2
  fi
fi

echo "kvlab: fetching the default model and corpora (cached under \${KVLAB_CACHE:-the user cache dir})"
.venv/bin/python -m kvlab fetch
# The first load converts the default model's GGUF into a safetensors copy (once, ~30 s).
.venv/bin/python -c "import kvlab.models as m; m.converted_path('smollm2-135m').exists() or m.load_model(device='cpu')"
