"""KV policies: which cached entries each layer keeps after every step.

``Full`` and ``StreamingLLM`` are the common baselines; each paper adds its own policy here.
"""

from kvlab.policies.base import Full, Policy, StreamingLLM

__all__ = ["Policy", "Full", "StreamingLLM"]
