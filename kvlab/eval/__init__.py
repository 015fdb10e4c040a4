"""Method-agnostic evaluation under KV policies and attention patterns: streaming and chunked perplexity,
retrieval grids (passkey, needle in a haystack), decoding throughput, and the GSM8K harness."""

from kvlab.eval.gsm8k import (GSM8KResult, cot_prompt, extract_answers, gsm8k_answer_nll, gsm8k_generate,
                              load_gsm8k, reference_solution)
from kvlab.eval.retrieval import RetrievalResult, ask, needle_in_haystack, passkey
from kvlab.eval.streaming import (StreamingResult, chunked_perplexity, decode_stepwise, parallel_nll, ppl_at_lengths,
                                  stream_ids, streaming_perplexity)
from kvlab.eval.throughput import decode_throughput

__all__ = [
    "GSM8KResult", "cot_prompt", "extract_answers", "gsm8k_answer_nll", "gsm8k_generate", "load_gsm8k",
    "reference_solution",
    "RetrievalResult", "ask", "needle_in_haystack", "passkey",
    "StreamingResult", "chunked_perplexity", "decode_stepwise", "parallel_nll", "ppl_at_lengths", "stream_ids",
    "streaming_perplexity",
    "decode_throughput",
]
