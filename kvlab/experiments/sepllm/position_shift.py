"""SepLLM Table 8's "without positional shift" rows, one record per text, so that the ledger can pair them.

Table 8 streams with a capped cache and either re-rotates the kept keys to their cache slots ("shift", kvlab's
default ``positions="shifted"``) or keeps the official code's behaviour without the shift (``positions="insertion"``:
a new token is rotated at the current cache length and cached keys keep their first rotation). The paper: without
the shift both methods collapse, SepLLM far less than StreamingLLM (Llama-3-8B, 20K tokens: 174.4 vs 506.8; with
the shift 8.8 vs 8.9).

Here ``--texts`` disjoint pieces of WikiText, ``--tokens`` tokens each, are streamed as one batch on the static
engine (:func:`kvlab.eval.streaming.streaming_perplexity_batch`, each row equal to its own run) under

- ``strm324-insertion``: ``StreamingLLM(sink=4, cache_size=324, positions="insertion")``
- ``sep32-insertion``: ``SepLLMStreaming(4, 32, 224, 324, separators, positions="insertion")``
- ``sep32-shift``: the same SepLLM with the shift (the control: what the shift buys)

and each text's mean NLL over the tokens scored after the cache first fills (``--skip``, default 324: before that
every method is full attention) is one ``window_nll`` record in ``position_shift.examples.jsonl.gz``::

    OMP_NUM_THREADS=1 python -m kvlab run sepllm-position-shift --out benchmarks/results/sepllm/position_shift_cpu
"""
from __future__ import annotations

from kvlab.experiments.registry import experiment_parser
from kvlab.experiments.sepllm.streaming import add_stream_options, check_stream_options, run_streams

NAME = "sepllm-position-shift"


def policies(separators) -> dict:
    from kvlab.policies import StreamingLLM
    from kvlab.sepllm import SepLLMStreaming

    return {"strm324-insertion": StreamingLLM(sink=4, cache_size=324, positions="insertion"),
            "sep32-insertion": SepLLMStreaming(4, 32, 224, 324, separators=separators, positions="insertion"),
            "sep32-shift": SepLLMStreaming(4, 32, 224, 324, separators=separators)}


def parser():
    p = experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="kvlab model id")
    add_stream_options(p, texts=20, tokens=1024)
    return p


def check(args) -> None:
    check_stream_options(args, min_texts=2)


def run(args):
    return run_streams(args, NAME, "position_shift", [args.model], policies, prefix_model=False)
