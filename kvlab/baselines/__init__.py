"""The methods the papers compare against: keep everything, attention sinks + window, and the two
attention-score policies (H2O accumulates the attention an entry received, TOVA reads the newest query's)."""

from kvlab.baselines.h2o import H2O
from kvlab.baselines.policy import Full, StreamingLLM
from kvlab.baselines.tova import TOVA

__all__ = ["Full", "StreamingLLM", "H2O", "TOVA"]
