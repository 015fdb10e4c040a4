"""What more than one method's kernels share: the ragged decode attention over compacted caches
(:mod:`kvlab.kernels.decode`), Triton helpers (:mod:`kvlab.kernels.triton_utils`: the precision-aware dot,
interpreter detection, eligibility checks) and the benchmark toolkit (:mod:`kvlab.kernels.benchmarking`).

No method's backend imports another method's backend: they meet here.
"""

from kvlab.kernels.decode import BACKENDS as DECODE_BACKENDS
from kvlab.kernels.decode import ragged_decode_attention

__all__ = ["ragged_decode_attention", "DECODE_BACKENDS"]
