"""SepLLM Table 11 ("different architectures") on the architectures kvlab can stream: SepLLM against StreamingLLM at
the same cache size, one record per text, so that the ledger can pair them per model.

The paper streams PG19 with Pythia-6.9B and Llama-3-8B (a=4, c=800, s=64, w=256): SepLLM holds fewer entries (r.KV
562 against 800) at a perplexity equal or lower on both backbones (15.8 vs 15.9, 33.4 vs 37.9). Here each ``--models``
model (default Qwen2.5-Coder-0.5B: Qwen2, grouped-query attention, QKV biases; SmolLM2, Llama-shaped, has its rows in
Tables 5-8) streams ``--texts`` disjoint pieces of WikiText of ``--tokens`` tokens each as one batch on the static
engine (each row equal to its own run), under

- ``strm324``: ``StreamingLLM(sink=4, cache_size=324)``
- ``sep32``: ``SepLLMStreaming(4, 32, 224, 324, separators)``, the paper's c=324 setting of Tables 5-8

with kvlab's shifted positions for both, and writes each piece's mean NLL over the tokens after the cache first
fills (``--skip``) as ``{"example", "method", "metric": "window_nll", "value"}``::

    OMP_NUM_THREADS=1 python benchmarks/sepllm_architectures.py --out benchmarks/results/sepllm/architectures_cpu
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from sepllm_position_shift import records, wikitext_pieces, write_examples  # noqa: E402 (shared with Table 8)


def policies(separators) -> dict:
    from kvlab.policies import StreamingLLM
    from kvlab.sepllm import SepLLMStreaming

    return {"strm324": StreamingLLM(sink=4, cache_size=324),
            "sep32": SepLLMStreaming(4, 32, 224, 324, separators=separators)}


def main(argv=None) -> int:
    import kvlab
    from kvlab.sepllm import separator_ids

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="qwen2.5-coder-0.5b", help="comma list of kvlab model ids")
    ap.add_argument("--texts", type=int, default=20, help="disjoint WikiText pieces (the ledger's n)")
    ap.add_argument("--tokens", type=int, default=768, help="tokens per piece")
    ap.add_argument("--skip", type=int, default=324, help="tokens not scored (the cache fills at 324)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.texts < 1 or args.tokens <= args.skip + 1:
        raise SystemExit(f"--texts must be >= 1 and --tokens > --skip + 1 (tokens left to score), got "
                         f"{args.texts} and {args.tokens} with --skip {args.skip}")
    torch.set_num_threads(args.threads)
    recs = []
    for name in args.models.split(","):
        model, tok = kvlab.load_model(name, device="cpu")
        rows = wikitext_pieces(tok, args.texts, args.tokens)
        config = {"model": name, "tokens": args.tokens, "skip": args.skip,
                  "command": "python benchmarks/sepllm_architectures.py " + " ".join(argv or sys.argv[1:])}
        print(f"{name}: {args.texts} pieces of {args.tokens} tokens", flush=True)
        recs += records(model, tok, rows, policies(separator_ids(tok)), skip=args.skip,
                        prefix=f"{name}/wikitext-{args.tokens}-p", config=config)
    write_examples(Path(args.out) / "architectures.examples.jsonl", recs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
