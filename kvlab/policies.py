"""Every KV policy of kvlab in one place: ``from kvlab.policies import X``.

An index only: each policy lives with its method (:mod:`kvlab.baselines`, :mod:`kvlab.sepllm`,
:mod:`kvlab.lacache`, ...). A new policy joins the policy contract test (``tests/test_policy_contract.py``)
by being listed here.
"""

from kvlab.baselines import H2O, TOVA, Full, StreamingLLM
from kvlab.core import Policy
from kvlab.lacache.policy import LaCache
from kvlab.sepllm.policy import FixLLM, SepLLM, SepLLMStreaming

__all__ = ["Policy", "Full", "StreamingLLM", "H2O", "TOVA", "LaCache", "SepLLM", "SepLLMStreaming", "FixLLM"]
