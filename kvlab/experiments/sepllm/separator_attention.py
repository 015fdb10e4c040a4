"""SepLLM Fig. 2 (the observation the method rests on): separator tokens such as "," and "." receive more
attention than the other tokens, layer by layer, on a GSM8K problem.

The paper shows attention maps of Llama-3-8B-instruct on one GSM8K problem and its solution. Here each of
``--problems`` GSM8K test problems, written as ``Q: <question>\\nA: <worked solution>`` (the CoT style of
:func:`kvlab.eval.gsm8k.reference_solution`), is run once through ``--model`` with full attention, and per layer
the attention a key receives is averaged over heads and over every query that sees it (``i >= j``). Per problem and
layer, ``separators`` is the mean of that over the separator keys and ``other`` over every other key; the first
token (the attention sink, which the paper keeps as its own block) is left out of both. Records (methods
``separators`` and ``other``): example ``gsm8k-<i>``, metric ``attention_per_key`` (the mean over layers, the
ledger's row) and example ``gsm8k-<i>/L<l>``, metric ``attention_per_key_layer`` (one per layer, the figure)::

    OMP_NUM_THREADS=1 python -m kvlab run sepllm-separator-attention --out benchmarks/results/sepllm/separator_attention_cpu
"""

from __future__ import annotations

import time

import torch

from kvlab.experiments import records
from kvlab.experiments.registry import experiment_parser, positive_int
from kvlab.experiments.sepllm.common import device_label, open_out, resolve_device

NAME = "sepllm-separator-attention"


def received_per_key(maps: torch.Tensor) -> torch.Tensor:
    """``maps``: ``(layers, heads, T, T)`` causal attention probabilities. Returns ``(layers, T)``: per key ``j``
    the attention it receives, averaged over heads and over the queries ``i >= j`` that see it."""
    per_layer = maps.mean(dim=1)  # (layers, T, T)
    t = per_layer.shape[-1]
    seen_by = torch.arange(t, 0, -1, dtype=per_layer.dtype)  # key j is seen by T - j queries
    return per_layer.sum(dim=1) / seen_by


def separator_vs_other(maps: torch.Tensor, is_sep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per layer, the mean attention received per separator key and per other key, the first token left out.
    ``is_sep``: ``(T,)`` bool. Returns two ``(layers,)`` tensors."""
    got = received_per_key(maps)[:, 1:]
    sep = is_sep[1:]
    if not sep.any() or sep.all():
        raise ValueError("the text needs both separator and other tokens after the first")
    return got[:, sep].mean(dim=1), got[:, ~sep].mean(dim=1)


def parser():
    p = experiment_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="kvlab model id")
    p.add_argument("--problems", type=positive_int, default=40, help="GSM8K test problems (the ledger's n)")
    p.add_argument("--threads", type=positive_int, default=1, help="CPU threads")
    return p


def check(args) -> None:
    if args.smoke:
        args.problems = 2


def run(args):
    import kvlab
    from kvlab.core import capture_attention
    from kvlab.eval.gsm8k import load_gsm8k, reference_solution
    from kvlab.sepllm import is_separator, separator_ids

    rel = "separator_attention" + records.SUFFIX
    out = open_out(args, NAME, [rel])
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    model, tok = kvlab.load_model(args.model, device=device)
    seps = torch.tensor(separator_ids(tok))
    problems, _ = load_gsm8k(args.problems)
    recs, begin, label = [], time.perf_counter(), device_label(device)
    for i, p in enumerate(problems):
        text = f"Q: {p['question']}\nA:{reference_solution(p['answer'])}"
        ids = tok(text, return_tensors="pt").input_ids.to(device)
        maps = capture_attention(model, ids).float().cpu()  # (layers, heads, T, T)
        sep, other = separator_vs_other(maps, is_separator(ids[0].cpu(), seps))
        ex = f"gsm8k-{i}"
        config = {"model": args.model, "problems": args.problems}
        for method, per_layer in (("separators", sep), ("other", other)):
            recs.append(records.record(ex, method, "attention_per_key", float(per_layer.mean()), config=config,
                                       device=label, tokens=ids.shape[1]))
            recs += [records.record(f"{ex}/L{layer}", method, "attention_per_key_layer", float(v), config=config,
                                    device=label) for layer, v in enumerate(per_layer)]
        print(f"{ex}: {ids.shape[1]} tokens, separators {float(sep.mean()):.4f} vs other {float(other.mean()):.4f}",
              flush=True)
    print(f"{len(problems)} problems in {time.perf_counter() - begin:.0f} s")
    return [records.write(rel, recs, out=out)]
