#!/usr/bin/env bash
# Run the tests: set up (.venv, install, default assets), then the unit tests, then every notebook
# (with the small parameters of notebooks/NN_name.ci.yaml) through nbval.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Without a GPU, Triton kernels run in Triton's interpreter.
if ! .venv/bin/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  export TRITON_INTERPRET=1
fi
export MPLBACKEND=Agg
.venv/bin/python -m pytest tests -q -p no:cacheprovider "$@"
bash scripts/peers.sh   # the kvpress peer check, in its own environment (kvpress needs transformers<5.3)
.venv/bin/python scripts/notebooks.py prepare --out build/notebooks
.venv/bin/python -m pytest build/notebooks --nbval-lax --nbval-current-env -q -p no:cacheprovider \
  --nbval-cell-timeout=900
