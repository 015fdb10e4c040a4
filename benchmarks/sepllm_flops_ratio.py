"""SepLLM Table 3 (FLOPs and attention-map ratios of the training variants), per training sequence: the share of
the causal attention map each variant's mask keeps (measured on real text) and the training FLOPs that follow
(computed with :func:`kvlab.sepllm.training.step_flops` for a model of the paper's shape).

The paper trains Pythia-160m-deduped on 2,048-token sequences and reports, against Vanilla (100 %), FLOPs 70.11 /
71.77 / 72.58 / 72.83 / 73.90 % and attention-map ratios 6.43 / 17.21 / 22.48 / 24.11 / 31.01 % for StrmLLM(n=64),
SepLLM(n=64), SepLLM(n=128), SepLLM(n=64, H) and SepLLM(n=64, H/T). Here each of ``--texts`` disjoint 2,048-token
pieces of WikiText (``--tokenizer``'s ids, the separators of :func:`kvlab.sepllm.separator_ids`) is one training
sequence; every variant of :func:`kvlab.sepllm.training.VARIANTS` (4 initial tokens) gets, per piece::

    {"example": "wikitext-2048-p<i>", "method": <variant>, "metric": "attention_map_share", "value": ...}
    {"example": ..., "method": ..., "metric": "flops_share", "value": FLOPs / Vanilla's FLOPs}

FLOPs are those of a GPT-NeoX model of Pythia-160m's shape (12 layers, width 768, MLP 3,072, vocabulary 50,304),
built on the meta device (no weights)::

    python benchmarks/sepllm_flops_ratio.py --out benchmarks/results/sepllm/flops_ratio_cpu
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from sepllm_position_shift import wikitext_pieces, write_examples  # noqa: E402 (WikiText pieces, atomic writer)

HYBRID_H = "SepLLM(n=64,H)"


def pythia_160m_shape():
    """A GPT-NeoX model of Pythia-160m's shape on the meta device: parameter counts without weights."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(vocab_size=50304, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                           intermediate_size=3072, max_position_embeddings=2048, tie_word_embeddings=False)
    with torch.device("meta"):
        return GPTNeoXForCausalLM(config)


def variants():
    """Table 3's columns: :func:`VARIANTS` plus SepLLM(n=64, H) (first layer full)."""
    from kvlab.sepllm.training import VARIANTS, Variant

    out = VARIANTS(64, 128, 4)
    out.insert(4, Variant(HYBRID_H, "sepllm", 4, 64, (0,)))
    return out


def main(argv=None) -> int:
    from kvlab.models import load_tokenizer
    from kvlab.sepllm import separator_ids
    from kvlab.sepllm.training import step_flops

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", default="smollm2-135m", help="kvlab model id whose tokenizer cuts the text")
    ap.add_argument("--texts", type=int, default=30, help="disjoint 2,048-token pieces (the ledger's n)")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    tok = load_tokenizer(args.tokenizer)
    seps = separator_ids(tok)
    model = pythia_160m_shape()
    recs = []
    for i, piece in enumerate(wikitext_pieces(tok, args.texts, args.tokens)):
        ex = f"wikitext-{args.tokens}-p{i:03d}"
        base, _ = step_flops(model, variants()[0], piece, seps)
        for v in variants():
            flops, ratio = step_flops(model, v, piece, seps)
            recs += [{"example": ex, "method": v.name, "metric": "attention_map_share", "value": ratio},
                     {"example": ex, "method": v.name, "metric": "flops_share", "value": flops / base}]
    write_examples(Path(args.out) / "flops_ratio.examples.jsonl", recs)
    for v in variants():
        a = [r["value"] for r in recs if r["method"] == v.name and r["metric"] == "attention_map_share"]
        f = [r["value"] for r in recs if r["method"] == v.name and r["metric"] == "flops_share"]
        print(f"{v.name:22s} attention {100 * sum(a) / len(a):6.2f} %   FLOPs {100 * sum(f) / len(f):6.2f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
