"""SepLLM Table 6 (the separator cache's capacity ``s``): the same streaming cache with ``s = 32`` and ``s = 64``
on the same texts, one record per text, so that the ledger can pair them.

The paper streams WikiText with Llama-3-8B at a=4, w=224, c=324 and finds that a larger separator cache lowers the
perplexity a little (5K tokens: 13.11 at s=32, 13.03 at s=48, 13.01 at s=64; r.KV 292, 300, 308). Here each
``--texts`` disjoint piece of WikiText of ``--tokens`` tokens is streamed as one batch on the static engine under

- ``sep32``: ``SepLLMStreaming(4, 32, 224, 324, separators)``
- ``sep48``: ``SepLLMStreaming(4, 48, 224, 324, separators)``
- ``sep64``: ``SepLLMStreaming(4, 64, 224, 324, separators)``

with kvlab's shifted positions, and each piece's mean NLL over the tokens after the cache first fills (``--skip``)
is written as ``{"example", "method", "metric": "window_nll", "value"}``::

    python benchmarks/sepllm_separator_cache.py --texts 30 --tokens 4096 --out DIR      # GPU: benchmarks/gpu/sepllm_separator_cache.sh
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

CAPACITIES = (32, 48, 64)


def policies(separators, capacities=CAPACITIES) -> dict:
    from kvlab.sepllm import SepLLMStreaming

    return {f"sep{s}": SepLLMStreaming(4, s, 224, 324, separators=separators) for s in capacities}


def main(argv=None) -> int:
    import kvlab
    from kvlab.sepllm import separator_ids

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="kvlab model id")
    ap.add_argument("--texts", type=int, default=30, help="disjoint WikiText pieces (the ledger's n)")
    ap.add_argument("--tokens", type=int, default=1024, help="tokens per piece")
    ap.add_argument("--skip", type=int, default=324, help="tokens not scored (the cache fills at 324)")
    ap.add_argument("--capacities", default=",".join(map(str, CAPACITIES)), help="comma list of s")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when there is one)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.texts < 1 or args.tokens <= args.skip + 1:
        raise SystemExit(f"--texts must be >= 1 and --tokens > --skip + 1 (tokens left to score), got "
                         f"{args.texts} and {args.tokens} with --skip {args.skip}")
    torch.set_num_threads(args.threads)
    model, tok = kvlab.load_model(args.model, device=args.device)
    rows = wikitext_pieces(tok, args.texts, args.tokens)
    config = {"model": args.model, "tokens": args.tokens, "skip": args.skip,
              "command": "python benchmarks/sepllm_separator_cache.py " + " ".join(argv or sys.argv[1:])}
    capacities = tuple(int(s) for s in args.capacities.split(","))
    print(f"{args.model}: {args.texts} pieces of {args.tokens} tokens, s in {capacities}", flush=True)
    recs = records(model, tok, rows, policies(separator_ids(tok), capacities), skip=args.skip,
                   prefix=f"{args.model}/wikitext-{args.tokens}-p", config=config)
    write_examples(Path(args.out) / "separator_cache.examples.jsonl", recs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
