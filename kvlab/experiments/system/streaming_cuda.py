"""kvlab.eval.streaming_perplexity on CUDA: the foundation's equalities, and what a bounded cache saves.

The GPU machine has no model assets, so this uses a randomly initialised model with SmolLM2-135M's shape
(30 layers, 9 heads, 3 KV heads, head dim 64) fed random tokens: the equalities hold for any weights.

    PYTHONPATH=. python benchmarks/streaming_cuda_check.py --tokens 1024 --out results/streaming_cuda.json
"""

from __future__ import annotations

import argparse
import json
import math

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from kvlab.eval import parallel_nll, streaming_perplexity
from kvlab.core import attach
from kvlab.policies import Full, StreamingLLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("this check needs a CUDA device")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                         tie_word_embeddings=True)
    model = attach(LlamaForCausalLM(config).to("cuda", getattr(torch, args.dtype)).eval())
    ids = torch.randint(0, config.vocab_size, (1, args.tokens))
    full = streaming_perplexity(model, None, ids, Full(), max_tokens=None, progress=False)
    ref = parallel_nll(model, None, ids, max_tokens=None)
    wide = streaming_perplexity(model, None, ids, StreamingLLM(4, args.tokens), max_tokens=None, progress=False)
    small = streaming_perplexity(model, None, ids, StreamingLLM(4, 124), max_tokens=None, progress=False)
    ppl_ref = math.exp(float(ref.mean()))
    report = {
        "device": torch.cuda.get_device_name(),
        "dtype": args.dtype,
        "tokens": args.tokens,
        "full_stream_ppl": full.ppl,
        "parallel_ppl": ppl_ref,
        "relative_ppl_difference": abs(full.ppl - ppl_ref) / ppl_ref,
        "wide_window_equals_full_exactly": bool(torch.equal(full.nll, wide.nll)),
        "full": {"seconds": full.seconds, "peak_kv_bytes": full.peak_memory, "peak_device_bytes": full.peak_device_memory,
                 "mean_kv": full.mean_kv},
        "streaming_128": {"seconds": small.seconds, "peak_kv_bytes": small.peak_memory,
                          "peak_device_bytes": small.peak_device_memory, "mean_kv": small.mean_kv},
    }
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
