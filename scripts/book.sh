#!/usr/bin/env bash
# Build the book: the numbered notebooks as the test run executed them (build/executed, written by nbval in
# scripts/test.sh), or, where book/executed holds a current copy executed at the notebook's book parameter set
# (benchmarks/gpu/book_notebooks.sh), that copy; the assignments' student versions, a page per paper and the results page from the claims
# ledger, as HTML in build/book/html/index.html. Nothing is executed here; see book/build.py for the checks
# (broken links, missing figures, notebooks that did not run through fail the build).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  echo "kvlab: no .venv; run 'bash scripts/setup.sh' (or 'bash scripts/test.sh', which also runs the notebooks)" >&2
  exit 1
fi
exec .venv/bin/python book/build.py "$@"
