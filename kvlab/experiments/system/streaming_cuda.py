"""kvlab.eval.streaming_perplexity on CUDA: the foundation's equalities, and what a bounded cache saves.

The GPU machine has no model assets, so this uses a randomly initialised model with SmolLM2-135M's shape
(30 layers, 9 heads, 3 KV heads, head dim 64) fed random tokens: the equalities hold for any weights.

    python -m kvlab run package-streaming-cuda --tokens 1024 --out DIR     # one GPU
    python -m kvlab run package-streaming-cuda --smoke --out DIR           # CPU, 2 layers, 64 tokens

Writes ``OUT/streaming_cuda.json`` (the report) and ``OUT/streaming_cuda.examples.jsonl.gz``: per policy, the
perplexity, seconds and peak KV bytes, and whether the widest window equals the full cache exactly.
"""
from __future__ import annotations

import math
from pathlib import Path

from kvlab.experiments import records, registry
from kvlab.experiments.system import options
from kvlab.outputs import OutputFolder

__all__ = ["parser", "check", "run"]

NAME = "package-streaming-cuda"
STEM = "streaming_cuda"


def parser():
    p = registry.experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=registry.positive_int, default=1024)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    return p


def check(args) -> None:
    options.check_device(args.device, needs_cuda=not args.smoke)
    if args.tokens < 130:
        raise registry.ParameterError(f"--tokens {args.tokens}: at least 130, so the 124-entry cache is bounded")
    options.refuse_rerun(args.out, STEM + ".json", options.records_name(STEM))
    if args.smoke:
        args.tokens, args.dtype = 160, "float32"


def _model(args, device: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from kvlab.core import attach

    torch.manual_seed(0)
    layers, hidden = (2, 64) if args.smoke else (30, 576)
    config = LlamaConfig(vocab_size=49152, hidden_size=hidden, intermediate_size=1536 if not args.smoke else 128,
                         num_hidden_layers=layers, num_attention_heads=9 if not args.smoke else 4,
                         num_key_value_heads=3 if not args.smoke else 2, max_position_embeddings=8192,
                         tie_word_embeddings=True)
    return attach(LlamaForCausalLM(config).to(device, getattr(torch, args.dtype)).eval()), config


def run(args) -> list[Path]:
    import torch

    from kvlab.eval import parallel_nll, streaming_perplexity
    from kvlab.policies import Full, StreamingLLM

    out = OutputFolder(args.out, f"python -m kvlab run {NAME}")
    device = options.resolve_device(args.device)
    model, config = _model(args, device)
    ids = torch.randint(0, config.vocab_size, (1, args.tokens))
    full = streaming_perplexity(model, None, ids, Full(), max_tokens=None, progress=False)
    ref = parallel_nll(model, None, ids, max_tokens=None)
    wide = streaming_perplexity(model, None, ids, StreamingLLM(4, args.tokens), max_tokens=None, progress=False)
    small = streaming_perplexity(model, None, ids, StreamingLLM(4, 124), max_tokens=None, progress=False)
    ppl_ref = math.exp(float(ref.mean()))
    dev = options.device_string(device)
    report = {"device": dev, "dtype": args.dtype, "tokens": args.tokens, "full_stream_ppl": full.ppl,
              "parallel_ppl": ppl_ref, "relative_ppl_difference": abs(full.ppl - ppl_ref) / ppl_ref,
              "wide_window_equals_full_exactly": bool(torch.equal(full.nll, wide.nll)),
              "full": {"seconds": full.seconds, "peak_kv_bytes": full.peak_memory,
                       "peak_device_bytes": full.peak_device_memory, "mean_kv": full.mean_kv},
              "streaming_128": {"seconds": small.seconds, "peak_kv_bytes": small.peak_memory,
                                "peak_device_bytes": small.peak_device_memory, "mean_kv": small.mean_kv}}
    cfg = {"tokens": args.tokens, "dtype": args.dtype, "smoke": args.smoke}
    recs = [records.record("random-ids", name, metric, value, config=cfg, device=dev)
            for name, r in (("full", full), ("streamingllm124", small))
            for metric, value in (("ppl", r.ppl), ("seconds", r.seconds), ("peak_kv_bytes", r.peak_memory))]
    recs.append(records.record("random-ids", "streamingllm-wide", "equals_full_exactly",
                               report["wide_window_equals_full_exactly"], config=cfg, device=dev))
    path = records.write(options.records_name(STEM), recs, out=out)
    return [path, options.write_json(out, STEM + ".json", report)]
