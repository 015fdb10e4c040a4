"""SepLLM Table 3 (FLOPs and attention-map ratios of the training variants), per training sequence: the share of
the causal attention map each variant's mask keeps (measured on real text) and the training FLOPs that follow
(computed with :func:`kvlab.sepllm.training.step_flops` for a model of the paper's shape).

The paper trains Pythia-160m-deduped on 2,048-token sequences and reports, against Vanilla (100 %), FLOPs 70.11 /
71.77 / 72.58 / 72.83 / 73.90 % and attention-map ratios 6.43 / 17.21 / 22.48 / 24.11 / 31.01 % for StrmLLM(n=64),
SepLLM(n=64), SepLLM(n=128), SepLLM(n=64, H) and SepLLM(n=64, H/T). Here each of ``--texts`` disjoint 2,048-token
pieces of WikiText (``--tokenizer``'s ids, the separators of :func:`kvlab.sepllm.separator_ids`) is one training
sequence; every variant of :func:`kvlab.sepllm.training.VARIANTS` (4 initial tokens) gets, per piece::

    example "wikitext-2048-p<i>", method <variant>, metric "attention_map_share", value: the kept share
    example ..., method ..., metric "flops_share", value: FLOPs / Vanilla's FLOPs

FLOPs are those of a GPT-NeoX model of Pythia-160m's shape (12 layers, width 768, MLP 3,072, vocabulary 50,304),
built on the meta device (no weights)::

    python -m kvlab run sepllm-flops-ratio --out benchmarks/results/sepllm/flops_ratio_cpu
"""

from __future__ import annotations

import torch

from kvlab.experiments import records
from kvlab.experiments.registry import ParameterError, experiment_parser, positive_int
from kvlab.experiments.sepllm.common import open_out

NAME = "sepllm-flops-ratio"
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


def parser():
    p = experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", default="smollm2-135m", help="kvlab model id whose tokenizer cuts the text")
    p.add_argument("--texts", type=positive_int, default=30, help="disjoint pieces (the ledger's n)")
    p.add_argument("--tokens", type=positive_int, default=2048, help="tokens per piece (a training sequence)")
    p.add_argument("--start", type=int, default=0,
                   help="skip the first START pieces: fresh pieces for a re-run planned after a look at the first ones")
    return p


def check(args) -> None:
    if args.smoke:
        args.texts, args.tokens = 1, 160
    if args.tokens < 129:
        raise ParameterError(f"--tokens must exceed the largest window of Table 3 (n=128), got {args.tokens}")
    if args.start < 0:
        raise ParameterError(f"--start counts pieces to skip, a whole number >= 0, got {args.start}")


def run(args):
    from kvlab.models import load_tokenizer
    from kvlab.experiments.sepllm.streaming import wikitext_pieces
    from kvlab.sepllm import separator_ids
    from kvlab.sepllm.training import step_flops

    rel = "flops_ratio" + records.SUFFIX
    out = open_out(args, NAME, [rel])
    tok = load_tokenizer(args.tokenizer)
    seps = separator_ids(tok)
    model = pythia_160m_shape()
    config = {"tokenizer": args.tokenizer, "tokens": args.tokens, "texts": args.texts,
              "model_shape": "pythia-160m (meta device)", **({"start": args.start} if args.start else {})}
    recs = []
    pieces = wikitext_pieces(tok, args.start + args.texts, args.tokens, whole=not args.smoke)[args.start:]
    for i, piece in enumerate(pieces, start=args.start):
        ex = f"wikitext-{args.tokens}-p{i:03d}"
        base, _ = step_flops(model, variants()[0], piece, seps)
        for v in variants():
            flops, ratio = step_flops(model, v, piece, seps)
            recs += [records.record(ex, v.name, "attention_map_share", ratio, config=config, device="cpu"),
                     records.record(ex, v.name, "flops_share", flops / base, config=config, device="cpu")]
    for v in variants():
        a = [r["value"] for r in recs if r["method"] == v.name and r["metric"] == "attention_map_share"]
        f = [r["value"] for r in recs if r["method"] == v.name and r["metric"] == "flops_share"]
        print(f"{v.name:22s} attention {100 * sum(a) / len(a):6.2f} %   FLOPs {100 * sum(f) / len(f):6.2f} %")
    return [records.write(rel, recs, out=out)]
