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
every method is full attention) is written as ``{"example", "method", "metric": "window_nll", "value"}``::

    OMP_NUM_THREADS=1 python benchmarks/sepllm_position_shift.py --out benchmarks/results/sepllm/position_shift_cpu
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def policies(separators) -> dict:
    from kvlab.policies import StreamingLLM
    from kvlab.sepllm import SepLLMStreaming

    return {"strm324-insertion": StreamingLLM(sink=4, cache_size=324, positions="insertion"),
            "sep32-insertion": SepLLMStreaming(4, 32, 224, 324, separators=separators, positions="insertion"),
            "sep32-shift": SepLLMStreaming(4, 32, 224, 324, separators=separators)}


def records(model, tokenizer, rows: list[torch.Tensor], methods: dict, *, skip: int, prefix: str,
            config: dict | None = None) -> list[dict]:
    """One ``window_nll`` record per (row, method): the mean NLL of the row's tokens after position ``skip``.
    ``rows``: ``(1, T)`` token-id tensors of equal length; ``methods``: ``{name: policy}``."""
    from kvlab.eval.streaming import streaming_perplexity_batch

    if not rows or any(r.shape != rows[0].shape for r in rows):
        raise ValueError("rows must be a non-empty list of (1, T) id tensors of one length")
    if not 0 <= skip < rows[0].shape[1] - 1:
        raise ValueError(f"skip={skip} must leave tokens to score (0 <= skip < {rows[0].shape[1] - 1})")
    out = []
    for name, policy in methods.items():
        begin = time.perf_counter()
        results = streaming_perplexity_batch(model, tokenizer, rows, policy, max_tokens=None, progress=False)
        seconds = time.perf_counter() - begin
        for i, res in enumerate(results):
            nll = res.nll[skip:]
            out.append({"example": f"{prefix}{i:03d}", "method": name, "metric": "window_nll",
                        "value": float(nll.mean()), "tokens_scored": int(nll.numel()),
                        "config": {**(config or {}), "policy": res.policy, "batch_seconds": round(seconds, 1)}})
        print(f"{name}: {seconds:.0f} s, mean NLL {sum(r['value'] for r in out[-len(rows):]) / len(rows):.4f}",
              flush=True)
    return out


def wikitext_pieces(tokenizer, texts: int, tokens: int) -> list[torch.Tensor]:
    """``texts`` disjoint ``(1, tokens)`` pieces from the start of WikiText under ``tokenizer``."""
    from kvlab import datasets

    ids = tokenizer(datasets.load_text("wikitext"), return_tensors="pt").input_ids[0]
    if ids.numel() < texts * tokens:
        raise SystemExit(f"WikiText has {ids.numel()} tokens under this tokenizer, fewer than --texts x --tokens "
                         f"= {texts * tokens}")
    return [ids[i * tokens:(i + 1) * tokens].unsqueeze(0) for i in range(texts)]


def write_examples(path: Path, recs: list[dict]) -> None:
    """``recs`` as JSON lines at ``path``, written whole or not at all (a temporary file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in recs))
    tmp.replace(path)


def main(argv=None) -> int:
    import kvlab
    from kvlab.sepllm import separator_ids

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--texts", type=int, default=20, help="disjoint WikiText pieces (the ledger's n)")
    ap.add_argument("--tokens", type=int, default=1024, help="tokens per piece")
    ap.add_argument("--skip", type=int, default=324, help="tokens not scored (the cache fills at 324)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    problems = []  # every flag checked before the model loads
    if args.texts < 2:
        problems.append(f"--texts must be >= 2 (an interval needs several pieces), got {args.texts}")
    if args.skip < 0:
        problems.append(f"--skip must be >= 0, got {args.skip}")
    if args.tokens < args.skip + 2:
        problems.append(f"--tokens must exceed --skip + 1 = {args.skip + 1} (tokens are scored only after the first "
                        f"--skip), got --tokens {args.tokens}: raise --tokens or lower --skip")
    if args.threads < 1:
        problems.append(f"--threads must be >= 1, got {args.threads}")
    if problems:
        ap.error("; ".join(problems))
    torch.set_num_threads(args.threads)
    model, tok = kvlab.load_model(args.model, device="cpu")
    rows = wikitext_pieces(tok, args.texts, args.tokens)
    config = {"model": args.model, "tokens": args.tokens, "skip": args.skip,
              "command": "python benchmarks/sepllm_position_shift.py " + " ".join(argv or sys.argv[1:])}
    recs = records(model, tok, rows, policies(separator_ids(tok)), skip=args.skip,
                   prefix=f"wikitext-{args.tokens}-p", config=config)
    write_examples(Path(args.out) / "position_shift.examples.jsonl", recs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
