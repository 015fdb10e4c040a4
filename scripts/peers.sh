#!/usr/bin/env bash
# The kvpress peer check: NVIDIA kvpress needs transformers<5.3, kvlab pins a newer one, so the check
# has its own environment, .venv-peers (made once; again only when constraints-peers.txt or pyproject.toml change).
# Then tests/test_peers.py runs there: kvlab's StreamingLLM/TOVA/H2O against kvpress's presses, kept positions.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv-peers/bin/python ] || "$PYTHON" -m venv .venv-peers
stamp=.venv-peers/.kvlab-install-stamp
want=$(cat pyproject.toml constraints-peers.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "kvlab: installing kvlab[peers] into .venv-peers (pinned by constraints-peers.txt)"
  .venv-peers/bin/python -m pip install -q --disable-pip-version-check -c constraints-peers.txt -e '.[peers]' 2>&1 \
    | { grep -v "Location 'file:" || true; }
  echo "$want" > "$stamp"
fi
# --install-only: make the environment and stop (scripts/test.sh installs it while the unit tests run)
[ "${1:-}" = --install-only ] && exit 0
.venv-peers/bin/python -m pytest tests/test_peers.py -q -p no:cacheprovider "$@"
