"""KV policies: which cached entries each layer keeps after every step.

``Full`` and ``StreamingLLM`` are the common baselines; each paper adds its own policy here.
"""

from kvlab.policies.base import Full, Policy, StreamingLLM
from kvlab.policies.h2o import H2O
from kvlab.policies.lacache import LaCache
from kvlab.policies.sepllm import FixLLM, SepLLM, SepLLMStreaming

__all__ = ["Policy", "Full", "StreamingLLM", "H2O", "LaCache", "SepLLM", "SepLLMStreaming", "FixLLM"]
