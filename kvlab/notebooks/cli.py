"""``python -m kvlab notebooks COMMAND [ARGS]``: the notebooks' copies, plain runs and timings."""
from __future__ import annotations

import sys

USAGE = """usage: python -m kvlab notebooks COMMAND [ARGS]

commands:
  prepare [NN ...] [--out DIR]   copies for nbval: CI parameters and recorded checks injected (scripts/test.sh)
  record [NN ...]                execute with the CI parameters and write the checked cells' outputs
  book NN ... [--out DIR]        execute with the book set into the book's executed copies (a GPU host: minutes)
  stale [NN ...]                 which book copies no longer match their notebook or book set
  markers [NN ...]               move nbval's first-line markers into cell tags
  run NOTEBOOK --out DIR [-f YAML] [-p NAME VALUE]   the code cells in this process, without Jupyter
  times run|table|stamp|merge ...                   time the notebooks as a student runs them (one core, one thread)
"""

COPIES = ("prepare", "record", "book", "stale", "markers")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command in COPIES:
        from kvlab.notebooks.copies import main as copies_main

        return copies_main(argv) or 0
    if command == "run":
        from kvlab.notebooks.plain_run import main as plain_main

        return plain_main(rest) or 0
    if command == "times":
        from kvlab.notebooks.times import main as times_main

        return times_main(rest) or 0
    print(f"kvlab notebooks: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
