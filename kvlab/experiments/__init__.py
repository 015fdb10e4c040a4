"""Everything kvlab measures, beside (never inside) the mechanisms it measures.

One folder per paper's experiments (:mod:`.sepllm`, :mod:`.lacache`, :mod:`.dhsa`, :mod:`.reform`, :mod:`.orthorank`),
each registered by name in :mod:`.registry` (``python -m kvlab run NAME``) and writing per-example records in the one
format (:mod:`.records`); the GPU benchmarks (:mod:`.bench`, ``python -m kvlab bench METHOD WHAT``), the claims
ledger (:mod:`.claims`; its command line :mod:`.ledger_cli`; the runs each row names :mod:`.ledger_runs`, rerun by
:mod:`.rerun`), the leaderboard (:mod:`.leaderboard`) and the Dask sweeps under both (:mod:`.sweep`).
These modules import the paper folders; the paper folders never import them.
"""
from kvlab.core.lazy import attach

__getattr__, __dir__, __all__ = attach(
    __name__,
    submodules=["bench", "checks", "claims", "ledger_cli", "ledger_runs", "records", "registry", "rerun", "dhsa",
                "leaderboard", "orthorank", "system", "reform", "lacache", "leaderboard_scaling", "sepllm", "quality",
                "sweep"],
    names={},
)
