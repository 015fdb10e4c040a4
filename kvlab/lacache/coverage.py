"""Coverage theory for layer-wise KV patterns, and the random-pattern search of LaCache's Fig. 3.

Coverage (Sec. 3.2, "lower bound of information retention"): after ``t`` tokens, position ``p`` is
*covered* by the layers whose cache still holds it; ``coverage[p]`` counts them (``0..L``). With the same
per-layer budget ``B`` every policy holds ``L * B`` entries in all, so ``sum_p coverage[p] <= L * B``:
StreamingLLM spends all of it on the newest ``B`` positions (coverage ``L`` there, 0 before); LaCache
spreads it thinner over many more positions. The paper's argument is about the worst case: if the tokens
that matter sit at the least-covered position, what counts is ``min coverage`` over the positions one
hopes to remember. :func:`worst_case_coverage` gives it for every distance ``d`` back from the newest
token, and :func:`reach` the farthest ``d`` at which every position is still held by ``k`` layers.

Everything here simulates policies on positions alone (:func:`simulate`), without a model, except
:func:`pattern_perplexity`, which scores fixed per-layer patterns on a model (Fig. 3 analogue).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from kvlab.baselines import Full
from kvlab.core import KVCache, LayerView

__all__ = [
    "Simulation",
    "simulate",
    "coverage",
    "worst_case_coverage",
    "reach",
    "random_patterns",
    "pattern_perplexity",
    "is_dominated",
]


@dataclass
class Simulation:
    """What a policy kept, layer by layer, when run on positions alone.

    kept: per layer, ``(n_l,)`` original positions held at the end, ascending.
    snapshots: step -> ``(layers, step)`` bool mask of held positions after that many tokens.
    held: ``(steps, layers)`` entries each layer held after each step.
    """

    num_layers: int
    steps: int
    kept: list[torch.Tensor]
    snapshots: dict[int, torch.Tensor]
    held: torch.Tensor

    def mask(self) -> torch.Tensor:
        """``(layers, steps)`` bool: which positions each layer holds at the end."""
        out = torch.zeros(self.num_layers, self.steps, dtype=torch.bool)
        for layer, pos in enumerate(self.kept):
            out[layer, pos] = True
        return out


def simulate(policy, num_layers: int, steps: int, *, chunk: int = 1, snapshots=()) -> Simulation:
    """Feed ``steps`` positions to ``policy`` (``chunk`` at a time, as a decoder would) and keep what it keeps.

    Works for every policy that decides from positions only (Full, StreamingLLM, LaCache); policies that
    need attention scores raise. ``snapshots``: step counts after which to record the ``(layers, step)`` mask.
    """
    if getattr(policy, "needs_scores", False):
        raise ValueError(f"{type(policy).__name__} needs attention scores: simulate it on a model instead")
    if steps < 1 or chunk < 1:
        raise ValueError(f"steps and chunk must be >= 1, got {steps}, {chunk}")
    policy.check_model(num_layers)
    wanted = set(int(s) for s in snapshots)
    positions = [torch.empty(1, 0, dtype=torch.long) for _ in range(num_layers)]
    states = [{} for _ in range(num_layers)]
    shots: dict[int, torch.Tensor] = {}
    held = []
    seen = 0
    while seen < steps:
        new = torch.arange(seen, min(seen + chunk, steps))[None]
        seen += new.shape[1]
        for layer in range(num_layers):
            pos = torch.cat([positions[layer], new], dim=1)
            view = LayerView(layer, num_layers, seen, pos, pos, None, None, states[layer])
            index = policy.keep(view)
            positions[layer] = pos if index is None else pos[:, index] if index.dim() == 1 else pos.gather(1, index)
        held.append([p.shape[1] for p in positions])
        if seen in wanted:
            mask = torch.zeros(num_layers, seen, dtype=torch.bool)
            for layer, p in enumerate(positions):
                mask[layer, p[0]] = True
            shots[seen] = mask
    return Simulation(num_layers, steps, [p[0] for p in positions], shots, torch.tensor(held))


def coverage(mask: torch.Tensor) -> torch.Tensor:
    """``(positions,)`` long: how many layers hold each position, from a ``(layers, positions)`` bool mask."""
    return mask.sum(dim=0)


def worst_case_coverage(mask: torch.Tensor, sink: int = 0) -> torch.Tensor:
    """``(positions - sink,)``: entry ``d - 1`` is the least coverage among the ``d`` newest positions.

    The sink is left out (every policy here keeps it in every layer). Non-increasing in ``d``.
    """
    cov = coverage(mask)[sink:]
    return cov.flip(0).cummin(dim=0).values


def reach(mask: torch.Tensor, k: int = 1, sink: int = 0) -> int:
    """Farthest distance ``d`` such that each of the ``d`` newest positions is held by at least ``k`` layers."""
    worst = worst_case_coverage(mask, sink)
    return int((worst >= k).sum())


def random_patterns(num_layers: int, context: int, size: int, count: int, *, sink: int = 4,
                    generator: torch.Generator | None = None) -> list[tuple[str, list[torch.Tensor]]]:
    """``count`` random valid per-layer patterns, each layer holding exactly ``size`` of ``context`` positions.

    Every pattern keeps the ``sink`` first positions in every layer (all the policies compared do) and then,
    layer by layer, draws ``size - sink`` more from one of three families (cycled, so each is equally
    represented):

    * ``"window+block"``: a recent window of random length plus one contiguous block at a random place;
    * ``"scattered"``: a uniformly random subset of the non-sink positions;
    * ``"window+strided"``: a recent window of random length plus every ``s``-th older position
      from a random start (a stride pattern of random density).

    Returns ``[(family, [ (size,) long per layer ]), ...]``, indices ascending.
    """
    if not 0 <= sink < size <= context:
        raise ValueError(f"need 0 <= sink < size <= context, got sink={sink}, size={size}, context={context}")
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    free = size - sink
    body = context - sink  # positions sink..context-1
    families = ("window+block", "scattered", "window+strided")
    out = []
    for i in range(count):
        family = families[i % len(families)]
        layers = []
        for _ in range(num_layers):
            if family == "scattered":
                chosen = torch.randperm(body, generator=g)[:free] + sink
            else:
                window = int(torch.randint(0, free + 1, (1,), generator=g))
                rest = free - window
                older = body - window  # positions sink .. context-window-1 remain to draw from
                if family == "window+block":
                    start = int(torch.randint(0, older - rest + 1, (1,), generator=g))
                    picked = torch.arange(start, start + rest)
                else:
                    stride = max(1, older // max(rest, 1))
                    stride = int(torch.randint(1, stride + 1, (1,), generator=g))
                    start = int(torch.randint(0, older - (rest - 1) * stride, (1,), generator=g)) if rest else 0
                    picked = start + stride * torch.arange(rest)
                chosen = torch.cat([picked + sink, torch.arange(context - window, context)])
            layers.append(torch.cat([torch.arange(sink), chosen.sort().values]))
        out.append((family, layers))
    return out


@torch.no_grad()
def pattern_perplexity(model, ids: torch.Tensor, context: int, patterns, *, positions: str = "cache") -> torch.Tensor:
    """Perplexity of the continuation ``ids[context:]`` after the context's cache is cut to each pattern.

    ids: ``(1, T)``, ``T > context + 1``. patterns: a list of per-layer index lists (``(n_l,)`` long into
    ``0..context-1``, ascending). The context is run once with the full cache; for every pattern each layer
    keeps only its indices and the continuation is scored in one forward pass over the kept entries
    (so the kept entries were computed with full attention: a one-shot snapshot, not a streaming run).
    Token ``context`` is left out: it is predicted by the context's last logits, the same for every pattern.

    Returns ``(len(patterns),)`` float64 perplexities over tokens ``context+1 .. T-1``.
    """
    if ids.dim() != 2 or ids.shape[0] != 1:
        raise ValueError(f"ids must be (1, T), got {tuple(ids.shape)}")
    if not 0 < context < ids.shape[1] - 1:
        raise ValueError(f"context must be in 1..T-2 (T={ids.shape[1]}), got {context}")
    device = next(model.parameters()).device
    ids = ids.to(device)
    base = KVCache(model, Full(positions=positions))
    model(input_ids=ids[:, :context], past_key_values=base, use_cache=True)
    target = ids[:, context + 1:]
    out = torch.empty(len(patterns), dtype=torch.float64)
    for p, pattern in enumerate(patterns):
        if len(pattern) != len(base.layers):
            raise ValueError(f"pattern {p} has {len(pattern)} layers, the model {len(base.layers)}")
        cache = KVCache(model, Full(positions=positions))
        cache.seen = base.seen
        for i, layer in enumerate(base.layers):
            index = torch.as_tensor(pattern[i], dtype=torch.long)
            if index.numel() and (int(index.min()) < 0 or int(index.max()) >= context):
                raise ValueError(f"pattern {p}, layer {i}: indices must lie in 0..{context - 1}")
            clone = copy.copy(layer)  # select() rebinds its tensors, so the base cache stays intact
            clone.cache, clone.state = cache, {}
            clone.select(index.to(device))
            cache.layers[i] = clone
        logits = model(input_ids=ids[:, context:], past_key_values=cache, use_cache=True).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(logits[0].float(), target[0], reduction="mean")
        out[p] = float(nll.double().exp())
    return out


def is_dominated(size: float, ppl: float, sizes, ppls) -> bool:
    """True when some point of ``(sizes, ppls)`` is at least as small and strictly better: ``(size, ppl)`` is
    then off the Pareto front of perplexity against cache size."""
    return any(s <= size and p < ppl for s, p in zip(sizes, ppls))
