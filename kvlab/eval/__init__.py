"""Evaluation under KV policies: streaming perplexity and retrieval grids."""

from kvlab.eval.gsm8k import (GSM8KResult, cot_prompt, extract_answers, gsm8k_answer_nll, gsm8k_generate,
                              load_gsm8k, reference_solution)
from kvlab.eval.retrieval import RetrievalResult, ask, needle_in_haystack, passkey
from kvlab.eval.streaming import StreamingResult, decode_stepwise, parallel_nll, streaming_perplexity

__all__ = [
    "GSM8KResult",
    "cot_prompt",
    "extract_answers",
    "gsm8k_answer_nll",
    "gsm8k_generate",
    "load_gsm8k",
    "reference_solution",
    "RetrievalResult",
    "StreamingResult",
    "ask",
    "decode_stepwise",
    "needle_in_haystack",
    "parallel_nll",
    "passkey",
    "streaming_perplexity",
]
