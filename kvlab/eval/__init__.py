"""Evaluation under KV policies: streaming perplexity and retrieval grids."""

from kvlab.eval.retrieval import RetrievalResult, ask, needle_in_haystack, passkey
from kvlab.eval.streaming import StreamingResult, decode_stepwise, parallel_nll, streaming_perplexity

__all__ = [
    "RetrievalResult",
    "StreamingResult",
    "ask",
    "decode_stepwise",
    "needle_in_haystack",
    "parallel_nll",
    "passkey",
    "streaming_perplexity",
]
