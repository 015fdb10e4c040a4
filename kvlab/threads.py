"""How many CPU threads a kvlab process computes with.

torch starts as many compute threads as the machine has cores in *every* process. Two processes that each
do so on the same cores (a notebook kernel beside a script, two grading jobs, Dask workers) oversubscribe
them, and a decode step, which waits for its slowest thread, collapses far below half speed (issue 27: 9
tokens/s alone, 0.43 beside one other kernel). kvlab therefore sizes threads per process:

* ``KVLAB_THREADS=N`` (environment) wins everywhere: every process kvlab starts or configures uses ``N``.
* otherwise one core is left to the rest of the machine (the notebook server, a neighbour process) and the
  processes kvlab starts share the others: ``(cores - 1) // workers`` each, at least 1 (``lessons grade
  --jobs``, the Dask workers of sweeps and the leaderboard). On a busy 2-core machine one thread decodes three
  times faster than two (``benchmarks/results/threads/``), and on an idle one two threads gain little;
* a notebook's ``num_threads`` parameter (0: this default) and scripts call :func:`set_threads`.

``python -m kvlab run package-threads`` measures one process alone against two side by side.
"""

from __future__ import annotations

import os

__all__ = ["cpu_cores", "default_threads", "set_threads", "share_threads", "worker_env", "ENV"]

ENV = "KVLAB_THREADS"


def cpu_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS says, else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def default_threads(workers: int = 1) -> int:
    """Threads for each of ``workers`` processes computing at once: ``$KVLAB_THREADS`` if set, else
    ``(cores - 1) // workers`` (at least 1). Raises ValueError for a ``KVLAB_THREADS`` that is not an int >= 1."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    value = os.environ.get(ENV, "").strip()
    if value:
        try:
            threads = int(value)
        except ValueError:
            threads = 0
        if threads < 1:
            raise ValueError(f"{ENV} must be a whole number of threads >= 1, got {value!r}: unset it for kvlab's "
                             f"choice (cores // processes) or set e.g. {ENV}=1")
        return threads
    return max(1, (cpu_cores() - 1) // workers)


def set_threads(threads: int = 0, *, workers: int = 1) -> int:
    """``torch.set_num_threads``: ``threads`` if > 0, else :func:`default_threads` (``workers`` processes
    computing at once). Returns the number set."""
    import torch

    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ValueError(f"threads must be an int >= 0 (0: kvlab's default), got {threads!r}")
    n = threads or default_threads(workers)
    torch.set_num_threads(n)
    return n


def worker_env(workers: int) -> dict[str, str]:
    """Environment for each of ``workers`` processes kvlab starts to compute at once: ``KVLAB_THREADS`` and
    ``OMP_NUM_THREADS`` (read by torch when it starts) set to :func:`default_threads` ``(workers)``."""
    n = str(default_threads(workers))
    return {ENV: n, "OMP_NUM_THREADS": n}


def share_threads(workers: int) -> int:
    """Before starting ``workers`` processes that compute at once: put :func:`worker_env` into this process's
    environment (which they inherit), keeping a ``KVLAB_THREADS`` / ``OMP_NUM_THREADS`` the user set.
    Returns the threads each will use."""
    env = worker_env(workers)
    for key, value in env.items():
        os.environ.setdefault(key, value)
    return int(os.environ[ENV])
