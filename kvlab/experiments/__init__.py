"""Everything kvlab measures, beside (never inside) the mechanisms it measures.

One module per paper's experiments (:mod:`.sepllm`, :mod:`.dhsa`, :mod:`.reform`, :mod:`.orthorank`; LaCache's tables
use :mod:`kvlab.eval` directly), the GPU benchmarks (:mod:`.bench`, ``python -m kvlab bench METHOD WHAT``), the claims
ledger (:mod:`.claims`), the leaderboard (:mod:`.leaderboard`) and the Dask sweeps under both (:mod:`.sweep`).
These modules import the paper folders; the paper folders never import them.
"""
from kvlab.core.lazy import attach

__getattr__, __dir__, __all__ = attach(
    __name__,
    submodules=["bench", "checks", "claims", "records", "registry", "dhsa", "leaderboard", "orthorank", "system", "reform", "lacache", "leaderboard_scaling", "sepllm",
                "quality", "sweep"],
    names={},
)
