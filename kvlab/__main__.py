"""Command line: ``python -m kvlab fetch [ID ...]`` and ``python -m kvlab bench ...``."""

from __future__ import annotations

import sys

USAGE = """usage: python -m kvlab COMMAND [ARGS]

commands:
  run NAME [OPTIONS]  one experiment by name (`run --list`: every experiment, what it needs, how long it takes)
  fetch [ID ...]   download models and corpora into the cache (no ID: the default set; --list, --all)
  bench METHOD WHAT  GPU benchmarks of a method (see `python -m kvlab bench --help`)
  sweep GRID.yaml  run a grid of calls or notebooks on a Dask cluster (see `python -m kvlab sweep --help`)
  worker-env ADDRESS  print this host's `dask worker` lines, one pinned to each GPU (`| bash` starts them)
  leaderboard      every method on the same tasks at matched mean KV / FLOPs, on Dask (`leaderboard --help`);
                   `leaderboard scaling report --run ...` compares a 1-GPU run with a several-GPU run of one grid
  lessons make|grade|class|attacks|time  student versions, grading to a CSV, test classes and timing (see `python -m kvlab lessons -h`)
  claims           the claims ledger: --counts, --update, --write-readme, --check, --table PAPER (`claims -h`)
  notebooks prepare|record|book|stale|markers|run|times  the notebooks' copies for nbval and the book, a plain run
                   without Jupyter, their timings (`python -m kvlab notebooks --help`)
"""


def _fetch(rest: list[str]) -> int:
    from kvlab.assets import main as fetch_main
    from kvlab.models import verify_converted

    return fetch_main(rest, verify_model=verify_converted) or 0


def _leaderboard(rest: list[str]) -> int:
    if rest[:1] == ["scaling"]:
        from kvlab.experiments.leaderboard_scaling import main as scaling_main

        return scaling_main(rest[1:]) or 0
    from kvlab.experiments.leaderboard import main as leaderboard_main

    return leaderboard_main(rest) or 0


# command -> (module, function) of the commands that take their arguments as they are
_COMMANDS = {
    "run": ("kvlab.experiments.registry", "main"),
    "bench": ("kvlab.experiments.bench", "main"),
    "sweep": ("kvlab.experiments.sweep", "main"),
    "worker-env": ("kvlab.experiments.sweep", "worker_env_main"),
    "lessons": ("kvlab.classroom.cli", "main"),
    "claims": ("kvlab.experiments.ledger_cli", "main"),
    "notebooks": ("kvlab.notebooks.cli", "main"),
}


# what an interrupted command (Ctrl-C) leaves, for the commands whose interrupt path is tested
# (tests/test_interrupts.py); the others say only that they were interrupted
_INTERRUPTED = {
    "sweep": "every finished result is whole in the output folder, none is half-written; the same command goes "
             "on with the unfinished tasks",
    "leaderboard": "every finished cell is whole in OUT/cells and no table is half-written; the same command goes "
                   "on with the other cells, then writes the table",
    "claims": "a records file is written whole or not at all; the same command runs the row again",
    "lessons": "no grade or feedback file is half-written; the same command grades again",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    try:
        return _dispatch(argv[0], argv[1:])
    except KeyboardInterrupt:
        import signal

        # a second Ctrl-C (or one a child's shutdown relays) while this command winds down must not turn its clean
        # exit into a death by signal: the first one has been taken
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        what = _INTERRUPTED.get(argv[0])
        print(f"\nkvlab {argv[0]}: interrupted" + (f"; {what}" if what else ""), file=sys.stderr)
        return 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C


def _dispatch(command: str, rest: list[str]) -> int:
    if command == "fetch":
        return _fetch(rest)
    if command == "leaderboard":
        return _leaderboard(rest)
    if command in _COMMANDS:
        import importlib

        module, function = _COMMANDS[command]
        return getattr(importlib.import_module(module), function)(rest) or 0
    print(f"unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
