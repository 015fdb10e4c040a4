#!/usr/bin/env bash
# Open the lab: set up (.venv, install, default assets), then JupyterLab on the repository with the start
# page notebooks/START.md (every numbered notebook linked, the assignments named; students get their copies from the
# hand-out bundle, never the masters in lessons/) open as a rendered page.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

extra=()
if [ "$(id -u)" = 0 ]; then
  # JupyterLab refuses to start as root ("Running as root is not recommended") unless told to.
  echo "kvlab: WARNING: running as root (a container or a cloud VM?); starting JupyterLab with --allow-root." >&2
  echo "kvlab: the notebooks can then read and write anything on this machine; prefer a normal user account." >&2
  extra+=(--allow-root)
fi

# Markdown files open rendered (the start page): a settings override kept in the project, read through the
# project's own JupyterLab config; nothing is written into the environment.
exec .venv/bin/jupyter lab --config=scripts/jupyter_lab_config.py --notebook-dir=. "${extra[@]}" "$@" notebooks/START.md
