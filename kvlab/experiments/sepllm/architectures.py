"""SepLLM Table 11 ("different architectures") on the architectures kvlab can stream: SepLLM against StreamingLLM at
the same cache size, one record per text, so that the ledger can pair them per model.

The paper streams PG19 with Pythia-6.9B and Llama-3-8B (a=4, c=800, s=64, w=256): SepLLM holds fewer entries (r.KV
562 against 800) at a perplexity equal or lower on both backbones (15.8 vs 15.9, 33.4 vs 37.9). Here each ``--models``
model (default Qwen2.5-Coder-0.5B: Qwen2, grouped-query attention, QKV biases; SmolLM2, Llama-shaped, has its rows in
Tables 5-8) streams ``--texts`` disjoint pieces of WikiText of ``--tokens`` tokens each as one batch on the static
engine (each row equal to its own run), under

- ``strm324``: ``StreamingLLM(sink=4, cache_size=324)``
- ``sep32``: ``SepLLMStreaming(4, 32, 224, 324, separators)``, the paper's c=324 setting of Tables 5-8

with kvlab's shifted positions for both; each piece's mean NLL over the tokens after the cache first fills
(``--skip``) is one ``window_nll`` record in ``architectures.examples.jsonl.gz``::

    OMP_NUM_THREADS=1 python -m kvlab run sepllm-architectures --out benchmarks/results/sepllm/architectures_cpu
"""
from __future__ import annotations

from kvlab.experiments.registry import experiment_parser
from kvlab.experiments.sepllm.streaming import add_stream_options, check_stream_options, run_streams

NAME = "sepllm-architectures"


def policies(separators) -> dict:
    from kvlab.policies import StreamingLLM
    from kvlab.sepllm import SepLLMStreaming

    return {"strm324": StreamingLLM(sink=4, cache_size=324),
            "sep32": SepLLMStreaming(4, 32, 224, 324, separators=separators)}


def _models(text: str) -> list[str]:
    import argparse

    from pathlib import Path

    from kvlab.models import MODEL_IDS

    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in MODEL_IDS and not Path(n).exists()]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"unknown model {bad or text!r}: give kvlab model ids ({', '.join(MODEL_IDS)}) "
                                         "or local model paths")
    return names


def parser():
    p = experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--models", type=_models, default=["qwen2.5-coder-0.5b"], help="comma list of kvlab model ids")
    add_stream_options(p, texts=20, tokens=768)
    return p


def check(args) -> None:
    check_stream_options(args)
    if args.smoke:
        args.models = ["smollm2-135m"]


def run(args):
    return run_streams(args, NAME, "architectures", args.models, policies, prefix_model=True)
