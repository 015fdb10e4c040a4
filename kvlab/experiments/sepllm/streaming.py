"""What SepLLM's streaming tables (6, 8, 11) share: disjoint WikiText pieces, one window-NLL record per piece and
policy from one batched run of the static engine, and the options every one of them takes."""
from __future__ import annotations

import time

import torch

from kvlab.experiments import records
from kvlab.experiments.registry import ParameterError, positive_int
from kvlab.experiments.sepllm.common import device_label, load_model, nonnegative_int, open_out, resolve_device

__all__ = ["add_stream_options", "check_stream_options", "wikitext_pieces", "window_nll_records", "run_streams"]

SMOKE = {"texts": 2, "tokens": 24, "skip": 8}


def add_stream_options(p, *, texts: int, tokens: int) -> None:
    p.add_argument("--texts", type=positive_int, default=texts, help="disjoint WikiText pieces (the ledger's n)")
    p.add_argument("--tokens", type=positive_int, default=tokens, help="tokens per piece")
    p.add_argument("--skip", type=nonnegative_int, default=324, help="tokens not scored (the cache fills at 324)")
    p.add_argument("--threads", type=positive_int, default=1, help="CPU threads")


def check_stream_options(args, *, min_texts: int = 1) -> None:
    """Every count checked before a model loads; ``--smoke`` shrinks the pieces."""
    if args.smoke:
        args.texts, args.tokens, args.skip = SMOKE["texts"], SMOKE["tokens"], SMOKE["skip"]
    if args.texts < min_texts:
        raise ParameterError(f"--texts must be >= {min_texts} (an interval needs several pieces), got {args.texts}")
    if args.tokens < args.skip + 2:
        raise ParameterError(f"--tokens must exceed --skip + 1 = {args.skip + 1} (tokens are scored only after the "
                             f"first --skip), got --tokens {args.tokens}: raise --tokens or lower --skip")


def wikitext_pieces(tokenizer, texts: int, tokens: int, *, whole: bool = True) -> list[torch.Tensor]:
    """``texts`` disjoint ``(1, tokens)`` pieces from the start of WikiText under ``tokenizer`` (``whole=False``:
    tokenize only the first characters the pieces need, for a smoke run)."""
    from kvlab import datasets

    text = datasets.load_text("wikitext")
    ids = tokenizer(text if whole else text[:16 * texts * tokens], return_tensors="pt").input_ids[0]
    if ids.numel() < texts * tokens:
        raise ParameterError(f"WikiText has {ids.numel()} tokens under this tokenizer, fewer than --texts x --tokens "
                             f"= {texts * tokens}")
    return [ids[i * tokens:(i + 1) * tokens].unsqueeze(0) for i in range(texts)]


def window_nll_records(model, tokenizer, rows: list[torch.Tensor], methods: dict, *, skip: int, prefix: str,
                       config: dict, device: str) -> list[dict]:
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
            out.append(records.record(f"{prefix}{i:03d}", name, "window_nll", float(nll.mean()),
                                      config={**config, "policy": res.policy, "batch_seconds": round(seconds, 1)},
                                      device=device, tokens_scored=int(nll.numel())))
        print(f"{name}: {seconds:.0f} s, mean NLL {sum(r['value'] for r in out[-len(rows):]) / len(rows):.4f}",
              flush=True)
    return out


def run_streams(args, name: str, stem: str, models: list[str], policies, *, prefix_model: bool) -> list:
    """Stream ``args.texts`` pieces of each model in ``models`` under ``policies(separator_ids)`` and write the
    records as ``stem.examples.jsonl.gz``."""
    from kvlab.sepllm import separator_ids

    rel = stem + records.SUFFIX
    out = open_out(args, name, [rel])
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    recs = []
    for model_name in models:
        model, tok = load_model(model_name, device, smoke=args.smoke)
        rows = wikitext_pieces(tok, args.texts, args.tokens, whole=not args.smoke)
        config = {"model": model_name, "texts": args.texts, "tokens": args.tokens, "skip": args.skip}
        print(f"{model_name}: {args.texts} pieces of {args.tokens} tokens", flush=True)
        prefix = f"{model_name}/wikitext-{args.tokens}-p" if prefix_model else f"wikitext-{args.tokens}-p"
        recs += window_nll_records(model, tok, rows, policies(separator_ids(tok)), skip=args.skip, prefix=prefix,
                                   config=config, device=device_label(device))
    return [records.write(rel, recs, out=out)]
