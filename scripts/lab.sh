#!/usr/bin/env bash
# Open the lab: set up (.venv, install, default assets), then JupyterLab on notebooks/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/jupyter lab --notebook-dir=notebooks "$@"
