"""A peer check: kvlab's baselines against NVIDIA kvpress, on one model, one prompt, one budget.

kvpress (https://github.com/NVIDIA/kvpress) compresses the KV cache once, after the prefill of a context, with
"presses": each scores every cached entry of a layer and keeps the ``n_kept`` best per KV head. Where kvpress
and kvlab define the same method, the two must keep the same positions; where they differ, the difference is
written here, line by line, and measured (:func:`compare_kept`).

=====================  ===================================  ===========================================================
kvlab baseline         kvpress press                        definition (what is compared)
=====================  ===================================  ===========================================================
``StreamingLLM``       ``StreamingLLMPress(n_sink)``        the same: first ``n_sink`` + last ``n_kept - n_sink``.
                                                            Neither re-rotates kept keys at prefill (kvlab
                                                            ``positions="original"``; kvpress: no rerotation unless
                                                            wrapped in ``KeyRerotationPress``). Expected: identical.
``TOVA``               ``TOVAPress``                        the last query's attention averaged over all heads, one
                                                            selection for every head. kvpress gives the last token
                                                            the score ``max + 1`` (always kept); kvlab keeps its own
                                                            attention weight, which is almost always among the
                                                            highest. Expected: identical but for near-ties.
``H2O``                ``ObservedAttentionPress``           *not the same definition.* kvlab H2O: ``recent`` newest
                                                            entries + heavy hitters by attention **summed** over
                                                            queries and heads, one selection per layer. kvpress:
                                                            attention **averaged** over the queries that can see the
                                                            entry (divided by ``n - i``, which lifts late entries),
                                                            averaged in each GQA group, **one selection per KV
                                                            head**, no recent window. Expected: partial overlap.
(none)                 ``KnormPress``, ``SnapKVPress``,     no kvlab definition; usable as baselines through
                       ``ExpectedAttentionPress``           :func:`press_prefill` (the adapter).
=====================  ===================================  ===========================================================

kvpress needs ``transformers<5.3`` while kvlab pins a newer one, so it lives in its own environment::

    python -m venv .venv-peers
    .venv-peers/bin/pip install -c constraints-peers.txt -e '.[peers]'
    .venv-peers/bin/python -m kvlab.eval.peers --tokens 2048 --budget 256

kvlab itself runs on that transformers (5.2); :func:`require_kvpress` says what to do where it is missing.
"""
from __future__ import annotations

import argparse
import json
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from kvlab.core import eager_base

__all__ = ["PAIRS", "require_kvpress", "make_press", "press_prefill", "kvlab_prefill", "kvpress_kept", "kvlab_kept",
           "compare_kept", "answer_from_cache", "retrieval_check", "main"]

#: kvlab baseline -> (kvpress press class, whether the definitions are the same)
PAIRS = {"StreamingLLM": ("StreamingLLMPress", True), "TOVA": ("TOVAPress", True),
         "H2O": ("ObservedAttentionPress", False)}


def require_kvpress():
    """Import kvpress, or raise ImportError saying how to get it."""
    try:
        import kvpress
    except ImportError as exc:
        raise ImportError("kvpress is not installed here: it needs transformers<5.3, so it has its own environment: "
                          "python -m venv .venv-peers && .venv-peers/bin/pip install -c constraints-peers.txt "
                          "-e '.[peers]'") from exc
    return kvpress


def make_press(name: str, n_tokens: int, budget: int, *, sink: int = 4):
    """The kvpress press ``name`` (a class of ``kvpress.presses``) keeping ``budget`` of ``n_tokens`` entries."""
    kvpress = require_kvpress()
    if not 0 < budget < n_tokens:
        raise ValueError(f"budget must be in [1, n_tokens) = [1, {n_tokens}), got {budget}: kvpress keeps "
                         "int(n_tokens * (1 - compression_ratio)) entries")
    # kvpress keeps int(n * (1 - ratio)); pick the ratio that lands exactly on ``budget``
    ratio = 1.0 - (budget + 0.5) / n_tokens
    cls = getattr(kvpress, name, None)
    if cls is None:
        raise ValueError(f"kvpress has no press {name!r}")
    press = cls(compression_ratio=ratio, n_sink=sink) if name == "StreamingLLMPress" else cls(compression_ratio=ratio)
    from kvpress.utils import compute_n_kept

    assert compute_n_kept(n_tokens, ratio) == budget
    return press


def kvlab_policy(name: str, budget: int, *, sink: int = 4):
    """kvlab's baseline ``name`` at ``budget`` entries, with positions as kvpress keeps them (not re-rotated)."""
    from kvlab.baselines import H2O, TOVA, StreamingLLM

    if name == "StreamingLLM":
        return StreamingLLM(sink=sink, cache_size=budget, positions="original")
    if name == "TOVA":
        return TOVA(budget, positions="original")
    if name == "H2O":
        return H2O(budget, positions="original")
    raise ValueError(f"no kvlab baseline {name!r}; choose one of {sorted(PAIRS)}")


@torch.no_grad()
def press_prefill(model, ids: torch.Tensor, press=None):
    """The adapter: prefill ``ids`` under a kvpress press (``None``: no compression); returns (the
    DynamicCache, last logits). The cache continues like any transformers cache (questions, generate)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    with eager_base(model), (press(model) if press is not None else nullcontext()):
        out = model(ids, past_key_values=cache)
    return cache, out.logits[:, -1]


@torch.no_grad()
def kvlab_prefill(model, ids: torch.Tensor, policy):
    """Prefill ``ids`` in one step under a kvlab policy (compressed at the end of the step, as kvpress does);
    then the cache stops evicting (``Full``), so a question and an answer are appended uncompressed."""
    from kvlab.baselines import Full
    from kvlab.core import KVCache

    cache = KVCache(model, policy)
    out = model(ids, past_key_values=cache)
    cache.policy = Full(positions=policy.positions)
    return cache, out.logits[:, -1]


def kvpress_kept(full_cache, pressed_cache, layer: int) -> torch.Tensor:
    """Positions kvpress kept in ``layer``, per KV head ``(kv_heads, n_kept)``, sorted: each kept key matched
    to the identical key of an uncompressed prefill (a press changes the cache, never the computation)."""
    full = full_cache.layers[layer].keys[0].float()  # (kv_heads, n, d)
    kept = pressed_cache.layers[layer].keys[0].float()  # (kv_heads, m, d)
    dist = torch.cdist(kept, full, compute_mode="donot_use_mm_for_euclid_dist")  # exact, not |x|²+|y|²-2xy
    best, where = dist.min(dim=-1)
    scale = full.norm(dim=-1).max()
    if float(best.max()) > 1e-4 * float(scale):
        raise RuntimeError(f"a kept key of layer {layer} matches no key of the full prefill (distance "
                           f"{float(best.max()):.3g}, key norms up to {float(scale):.3g}): the runs computed differently")
    return where.sort(dim=-1).values


def kvlab_kept(cache, layer: int) -> torch.Tensor:
    """Positions a kvlab cache holds in ``layer`` (one selection for every head), sorted."""
    return cache.layers[layer].positions[0].sort().values


@dataclass
class KeptComparison:
    method: str
    press: str
    same_definition: bool
    budget: int
    identical_layers: int
    layers: int
    mean_overlap: float  # |kvlab ∩ kvpress| / budget, averaged over layers and KV heads
    min_overlap: float


def compare_kept(model, ids: torch.Tensor, budget: int, methods=tuple(PAIRS), *, sink: int = 4) -> list[KeptComparison]:
    """Prefill ``ids`` under each kvlab baseline and its kvpress press; compare the kept positions per layer."""
    full, _ = press_prefill(model, ids)
    n = ids.shape[1]
    rows = []
    for method in methods:
        press_name, same = PAIRS[method]
        pressed, _ = press_prefill(model, ids, make_press(press_name, n, budget, sink=sink))
        ours, _ = kvlab_prefill(model, ids, kvlab_policy(method, budget, sink=sink))
        overlaps, identical = [], 0
        for layer in range(len(ours.layers)):
            theirs = kvpress_kept(full, pressed, layer)  # (kv_heads, budget)
            mine = kvlab_kept(ours, layer).to(theirs.device)
            same_set = [torch.isin(theirs[h], mine).float().mean().item() for h in range(theirs.shape[0])]
            overlaps += same_set
            identical += int(all(s == 1.0 for s in same_set) and mine.numel() == theirs.shape[1])
        rows.append(KeptComparison(method, press_name, same, budget, identical, len(ours.layers),
                                   sum(overlaps) / len(overlaps), min(overlaps)))
    return rows


@torch.no_grad()
def answer_from_cache(model, cache, question_ids: torch.Tensor, max_new_tokens: int, *, start: int):
    """Append the question to a compressed cache and decode greedily; returns the generated ids.

    ``start`` is the length of the compressed context: new tokens take positions ``start, start + 1, ...``
    as they would without compression (kvpress's pipeline does the same; a plain transformers cache would
    otherwise place them at its *compressed* length). kvlab's cache assigns positions itself."""
    from kvlab.core import KVCache

    def step(ids, at):
        if isinstance(cache, KVCache):
            return model(ids, past_key_values=cache).logits[:, -1:]
        pos = torch.arange(at, at + ids.shape[1], device=ids.device)[None]
        return model(ids, past_key_values=cache, position_ids=pos).logits[:, -1:]

    token = step(question_ids, start).argmax(-1)
    at, generated = start + question_ids.shape[1], [token]
    for _ in range(max_new_tokens - 1):
        token = step(token, at).argmax(-1)
        at += 1
        generated.append(token)
    return torch.cat(generated, dim=1)[0]


def retrieval_check(model, tokenizer, budget: int, *, lengths=(1024,), depths=(0.1, 0.5, 0.9),
                    presses=("KnormPress", "SnapKVPress"), sink: int = 4) -> list[dict]:
    """Needle-in-a-haystack with prefill compression (the setting kvpress is built for): the document is
    compressed once to ``budget`` entries, then the question is asked and answered greedily; score = needle
    word recall (as :func:`kvlab.eval.needle_in_haystack`). Methods: kvlab's baselines, their kvpress
    twins, and kvpress presses kvlab does not define."""
    from kvlab import datasets
    from kvlab.eval.retrieval import needle_score

    device = next(model.parameters()).device
    haystack = datasets.load_text("paul-graham")
    methods = [(m, "kvlab") for m in PAIRS] + [(PAIRS[m][0], "kvpress") for m in PAIRS]
    methods += [(p, "kvpress") for p in presses]
    scores = {m: [] for m in methods}
    for length in lengths:
        for depth in depths:
            ex = datasets.niah_prompt(tokenizer, haystack, length, depth)
            cut = ex.prompt.index("\n\nQuestion:")  # the document is compressed, the question is not
            ids = tokenizer(ex.prompt[:cut], return_tensors="pt").input_ids.to(device)
            q_ids = tokenizer(ex.prompt[cut:], return_tensors="pt", add_special_tokens=False).input_ids.to(device)
            for name, source in methods:
                if source == "kvlab":
                    cache, _ = kvlab_prefill(model, ids, kvlab_policy(name, budget, sink=sink))
                else:
                    cache, _ = press_prefill(model, ids, make_press(name, ids.shape[1], budget, sink=sink))
                said = tokenizer.decode(answer_from_cache(model, cache, q_ids, 24, start=ids.shape[1]))
                scores[(name, source)].append(needle_score(said, ex.answer))
    return [{"method": name, "source": source, "budget": budget, "score": sum(v) / len(v), "n": len(v)}
            for (name, source), v in scores.items()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvlab.eval.peers", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--tokens", type=int, default=1024, help="context length of the kept-position check")
    p.add_argument("--budget", type=int, default=128)
    p.add_argument("--retrieval", action="store_true", help="also run the needle check with prefill compression")
    p.add_argument("--lengths", default="1024")
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    args = p.parse_args(argv)
    require_kvpress()
    import transformers

    import kvlab
    from kvlab.datasets import load_text

    model, tok = kvlab.load_model(args.model, device="cpu", dtype="float32")
    ids = tok(load_text("wikitext"), return_tensors="pt").input_ids[:, : args.tokens]
    rows = [vars(r) for r in compare_kept(model, ids, args.budget)]
    print("| kvlab | kvpress | same definition | identical layers | mean overlap | min overlap |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['method']} | {r['press']} | {r['same_definition']} | {r['identical_layers']}/{r['layers']} | "
              f"{r['mean_overlap']:.3f} | {r['min_overlap']:.3f} |")
    result = {"kept": rows, "model": args.model, "tokens": args.tokens, "budget": args.budget,
              "transformers": transformers.__version__}
    if args.retrieval:
        result["retrieval"] = retrieval_check(model, tok, args.budget, lengths=[int(x) for x in args.lengths.split(",")])
        for r in result["retrieval"]:
            print(f"{r['source']:8s} {r['method']:24s} needle recall {r['score']:.2f} (n={r['n']})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
