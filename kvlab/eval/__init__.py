"""Method-agnostic evaluation under KV policies and attention patterns: streaming and chunked perplexity,
retrieval grids (passkey, needle in a haystack), decoding throughput, the GSM8K harness, and zero-shot multiple
choice scored by log-likelihood as the LM Evaluation Harness does (:mod:`kvlab.eval.zeroshot`), and the paired
bootstrap / exact tests behind every verdict of the claims ledger (:mod:`kvlab.eval.stats`)."""

from kvlab.eval.gsm8k import (GSM8KResult, cot_prompt, extract_answers, gsm8k_answer_nll, gsm8k_generate,
                              load_gsm8k, reference_solution)
from kvlab.eval.retrieval import RetrievalResult, ask, needle_in_haystack, passkey
from kvlab.eval.fast import FastDecoder
from kvlab.eval.streaming import (LongStreamResult, StreamingResult, chunked_perplexity, decode_stepwise,
                                  long_stream_deviation, long_stream_perplexity, parallel_nll, ppl_at_lengths,
                                  segment_rows, stream_ids, streaming_perplexity, streaming_perplexity_batch)
from kvlab.eval.stats import Interval, SignTest, mcnemar_exact, paired_bootstrap, proportion_interval, sign_test
from kvlab.eval.throughput import decode_throughput
from kvlab.eval.zeroshot import ZeroShotResult, evaluate_task, load_task

__all__ = [
    "GSM8KResult", "cot_prompt", "extract_answers", "gsm8k_answer_nll", "gsm8k_generate", "load_gsm8k",
    "reference_solution",
    "RetrievalResult", "ask", "needle_in_haystack", "passkey",
    "StreamingResult", "chunked_perplexity", "decode_stepwise", "parallel_nll", "ppl_at_lengths", "stream_ids",
    "streaming_perplexity", "streaming_perplexity_batch", "FastDecoder",
    "LongStreamResult", "long_stream_deviation", "long_stream_perplexity", "segment_rows",
    "decode_throughput",
    "Interval", "SignTest", "mcnemar_exact", "paired_bootstrap", "proportion_interval", "sign_test",
    "ZeroShotResult", "evaluate_task", "load_task",
]
