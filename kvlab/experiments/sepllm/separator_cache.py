"""SepLLM Table 6 (the separator cache's capacity ``s``): the same streaming cache with ``s = 32``, ``48`` and ``64``
on the same texts, one record per text, so that the ledger can pair them.

The paper streams WikiText with Llama-3-8B at a=4, w=224, c=324 and finds that a larger separator cache lowers the
perplexity a little (5K tokens: 13.11 at s=32, 13.03 at s=48, 13.01 at s=64; r.KV 292, 300, 308). Here each of
``--texts`` disjoint pieces of WikiText of ``--tokens`` tokens is streamed as one batch on the static engine under
``sep<s>``: ``SepLLMStreaming(4, s, 224, 324, separators)`` for each ``s`` of ``--capacities``, with kvlab's shifted
positions, and each piece's mean NLL after the cache first fills (``--skip``) is one ``window_nll`` record in
``separator_cache.examples.jsonl.gz``::

    python -m kvlab run sepllm-separator-cache --texts 30 --tokens 4096 --out DIR   # GPU: benchmarks/gpu/sepllm_separator_cache.sh
"""
from __future__ import annotations

from kvlab.experiments.registry import ParameterError, experiment_parser
from kvlab.experiments.sepllm.common import int_list
from kvlab.experiments.sepllm.streaming import add_stream_options, check_stream_options, run_streams

NAME = "sepllm-separator-cache"
CAPACITIES = (32, 48, 64)


def policies(separators, capacities=CAPACITIES) -> dict:
    from kvlab.sepllm import SepLLMStreaming

    return {f"sep{s}": SepLLMStreaming(4, s, 224, 324, separators=separators) for s in capacities}


def parser():
    p = experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="kvlab model id")
    add_stream_options(p, texts=30, tokens=1024)
    p.add_argument("--capacities", type=int_list(1, "capacity"), default=list(CAPACITIES),
                   help="comma list of separator-cache capacities s (default 32,48,64)")
    return p


def check(args) -> None:
    check_stream_options(args)
    if any(s > 324 - 4 - 224 for s in args.capacities):
        raise ParameterError(f"--capacities: s must leave room in c=324 beside a=4 and w=224 (s <= 96), got "
                             f"{args.capacities}")


def run(args):
    return run_streams(args, NAME, "separator_cache", [args.model],
                       lambda seps: policies(seps, tuple(args.capacities)), prefix_model=True)
