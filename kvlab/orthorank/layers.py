"""Which layers: OrthoRank's layer choice (Sec. 3.2) and the two layer-pruning baselines, one engine.

Every method here picks decoder layers by their effect on the calibration perplexity; they differ in what
is done to a picked layer (*action*) and in how the picks are made (*search*):

============================  =====================  ===========================================
method                        action on a layer      search
============================  =====================  ===========================================
SLEB (Song et al. 2024)       remove it              iterative: add the layer that hurts least,
                                                     given the ones already picked, and repeat
Shortened LLaMA, PPL          remove it              one-shot: each layer alone, keep the n best
Shortened LLaMA, Taylor+      remove it              one-shot by ``sum |dL/dW * W|`` over its weights
OrthoRank (+SLEB)             route its tokens       iterative, like SLEB (Sec. 3.2: "we measure
                                                     performance by applying token selection to layers
                                                     incrementally")
OrthoRank (+Shortened LLaMA)  route its tokens       one-shot PPL (Table 1's last row)
============================  =====================  ===========================================

Readings:

* **Calibration perplexity** is ``exp(mean NLL)`` over non-overlapping windows of ``seq_len`` tokens cut from
  the tokenised text (every window is an independent sequence whose first token is the sink), as SLEB
  evaluates; the paper calibrates on WikiText-2 and reports C4 (Table 1).
* **Candidates.** OrthoRank only considers layers after the sink layer ("our selection criteria are less
  valid before the attention sink occurs", Sec. 3.2); the baselines consider every layer. The search never
  reconsiders a layer once picked, so the 10% set is a prefix of the 20% set.
* **Sparsity** (Sec. 4.1, Table 4): ``(removed + routed * (1 - token_ratio)) / num_layers``. A target is met
  with the *fewest layers that reach at least it* (``layers_for_sparsity``), so OrthoRank is never given
  less sparsity than the baseline it is compared with: 40 layers at 33% tokens: 6 (10%) and 12 (20%)
  routed layers, as the paper's 15% / 30%.
* **Taylor+** (Kim et al. 2024, Sec. 3.2, from that paper, not from the OrthoRank text): a block's importance
  is ``sum |dL/dW * W|`` over its weights on the calibration data; the first ``keep_first=4`` and last
  ``keep_last=2`` blocks are never pruned (the "+" heuristic; plain Taylor: 0 and 0).

Speed: an iterative step evaluates every candidate once. A candidate ``l`` only changes layers ``>= l``, so
the inputs of every layer under the current choice are recorded once per step and each candidate's pass
starts at its own layer (the layers before it are skipped and its recorded input injected): identical
numbers, about half the work.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from kvlab.core import LayerRouter, RouteCall, check_choice, check_float, check_int, model_state, use_router
from kvlab.orthorank.router import OrthoRankRouter, SkipLayer

__all__ = ["ACTIONS", "SEARCHES", "Plan", "LayerSearch", "text_windows", "perplexity", "use_plan", "refusing_padding",
           "search_layers",
           "taylor_importance", "layers_for_sparsity", "nominal_sparsity"]

ACTIONS = ("remove", "route")
SEARCHES = ("iterative", "one-shot", "taylor")
_REUSE_LIMIT_BYTES = 2 << 30


@dataclass(frozen=True)
class Plan:
    """What happens to the decoder layers: ``removed`` are skipped, ``routed`` run OrthoRank's token selection
    with ``router`` options (``token_ratio``, ``criterion``, ...). The empty plan is the dense model."""

    removed: tuple[int, ...] = ()
    routed: tuple[int, ...] = ()
    router: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        overlap = set(self.removed) & set(self.routed)
        if overlap:
            raise ValueError(f"a layer is either removed or routed, not both: {sorted(overlap)}")

    def with_layer(self, layer: int, action: str) -> "Plan":
        if action == "remove":
            return dataclasses.replace(self, removed=tuple(sorted((*self.removed, layer))))
        return dataclasses.replace(self, routed=tuple(sorted((*self.routed, layer))))

    def sparsity(self, num_layers: int) -> float:
        """Nominal sparsity, the paper's accounting (see the module docstring)."""
        return nominal_sparsity(num_layers, removed=len(self.removed), routed=len(self.routed),
                                token_ratio=self.router.get("token_ratio", 0.33))


def _refuse_padding(model, args, kwargs):
    """Forward pre-hook while OrthoRank routes: a padding mask (zeros) is refused, never scored silently.

    Algorithm 1 takes each row's first token as the sink and counts every token towards ``k``; in a left-padded
    row the sink would be a pad and pads would take token slots (row 0's logits moved by 10 on SmolLM2)."""
    mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and not bool(mask.bool().all()):
        pads = (~mask.bool()).sum(dim=1).tolist()
        raise ValueError(f"OrthoRank does not take padded batches (attention_mask has zeros: {pads} pad tokens per "
                         "row): the sink is each row's first token and every token counts towards the token ratio, "
                         "so a pad would be the sink. Run rows of equal length without padding, or one row at a time")


@contextlib.contextmanager
def refusing_padding(model: torch.nn.Module):
    """Within the block the model refuses an ``attention_mask`` with zeros (see :func:`_refuse_padding`)."""
    handle = model.register_forward_pre_hook(_refuse_padding, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


@contextlib.contextmanager
def use_plan(model: torch.nn.Module, plan: Plan | None):
    """Within the block the model runs ``plan`` (None or the empty plan: the dense model). Yields the router of
    the routed layers (or None). A plan with routed layers refuses padded batches (``attention_mask`` with
    zeros)."""
    plan = plan or Plan()
    router = OrthoRankRouter(**plan.router) if plan.routed else None
    with contextlib.ExitStack() as stack:
        if plan.routed:
            stack.enter_context(refusing_padding(model))
        if plan.removed:
            stack.enter_context(use_router(model, SkipLayer(), plan.removed))
        if plan.routed:
            stack.enter_context(use_router(model, router, plan.routed))
        yield router


def text_windows(tokenizer, text: str, seq_len: int, n_windows: int, *, offset: int = 0,
                 bos: bool | None = False) -> torch.Tensor:
    """``(n_windows, seq_len)`` token ids: consecutive non-overlapping windows of the tokenised ``text`` from
    token ``offset``. Raises when the text is too short.

    ``bos=True``: every window starts with the tokenizer's BOS token, then ``seq_len - 1`` text tokens;
    ``None``: BOS only where the tokenizer adds one by itself (Gemma3 does; its attention sink *is* the BOS
    token: without it no token draws the attention mass). Default False: text tokens only (SmolLM2, Qwen2.5
    add no BOS)."""
    seq_len = check_int("seq_len", seq_len, 2)
    n_windows = check_int("n_windows", n_windows, 1)
    offset = check_int("offset", offset, 0)
    if bos is None:
        bos = tokenizer.bos_token_id is not None and tokenizer("a").input_ids[:1] == [tokenizer.bos_token_id]
    if bos:
        if tokenizer.bos_token_id is None:
            raise ValueError("bos=True but the tokenizer has no BOS token: use bos=False")
        body = text_windows(tokenizer, text, seq_len - 1, n_windows, offset=offset) if seq_len > 2 else None
        if body is None:
            raise ValueError("bos=True needs seq_len >= 3 (the BOS token and at least 2 text tokens)")
        return torch.cat([torch.full((n_windows, 1), tokenizer.bos_token_id, dtype=body.dtype), body], dim=1)
    need = offset + seq_len * n_windows
    # tokenise a prefix long enough (characters per token is well above 1 for every tokenizer we use)
    chars = max(need * 8, 4096)
    ids = tokenizer(text[:chars], return_tensors="pt", add_special_tokens=False).input_ids[0]
    if ids.numel() < need:
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids[0]
    if ids.numel() < need:
        raise ValueError(f"the text has {ids.numel()} tokens; n_windows * seq_len + offset = {need} are needed: "
                         "ask for fewer or shorter windows")
    return ids[offset:need].reshape(n_windows, seq_len)


def _nll_sum(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(),
                                             reduction="sum").double()


@torch.no_grad()
def perplexity(model: torch.nn.Module, windows: torch.Tensor, plan: Plan | None = None, *,
               batch_size: int = 4) -> float:
    """``exp(mean NLL)`` of every next-token prediction in ``windows (n, seq_len)`` (each an independent
    sequence) with the model running ``plan``."""
    return math.exp(_Evaluator(model, windows, batch_size).nll(plan or Plan()))


class _Inject(LayerRouter):
    """At the first layer of a resumed pass: replace the input by the recorded one, then run ``inner``."""

    def __init__(self, hidden: torch.Tensor, inner: LayerRouter | None):
        self.hidden, self.inner = hidden, inner

    def __call__(self, call: RouteCall) -> torch.Tensor:
        call = dataclasses.replace(call, hidden_states=self.hidden)
        return self.inner(call) if self.inner is not None else call.run()


class _Record(LayerRouter):
    """Records each layer's input, then runs the plan's router for that layer (or the layer itself)."""

    def __init__(self, store: list, inner: dict[int, LayerRouter]):
        self.store, self.inner = store, inner

    def __call__(self, call: RouteCall) -> torch.Tensor:
        self.store[call.layer_idx] = call.hidden_states
        inner = self.inner.get(call.layer_idx)
        return inner(call) if inner is not None else call.run()


class _Evaluator:
    """Calibration NLL of plans over fixed windows, with per-layer inputs recorded for resumed passes."""

    def __init__(self, model, windows: torch.Tensor, batch_size: int):
        if not isinstance(windows, torch.Tensor) or windows.dim() != 2 or windows.shape[1] < 2:
            raise ValueError(f"windows must be token ids of shape (n, seq_len >= 2), got "
                             f"{getattr(windows, 'shape', type(windows).__name__)}")
        self.model = model
        self.device = next(model.parameters()).device
        self.batches = [w.to(self.device) for w in windows.split(check_int("batch_size", batch_size, 1))]
        self.count = windows.shape[0] * (windows.shape[1] - 1)
        self.num_layers = model_state(model).num_layers
        self.recorded: list[list[torch.Tensor]] | None = None

    def _routers(self, plan: Plan) -> dict[int, LayerRouter]:
        routers: dict[int, LayerRouter] = {i: SkipLayer() for i in plan.removed}
        if plan.routed:
            shared = OrthoRankRouter(**plan.router)
            routers.update({i: shared for i in plan.routed})
        return routers

    @torch.no_grad()
    def nll(self, plan: Plan, *, record: bool = False, start: int = 0) -> float:
        """Mean NLL under ``plan``; ``record`` keeps every layer's input; ``start > 0`` resumes at layer
        ``start`` from the inputs recorded under a plan that agrees with ``plan`` below ``start``."""
        routers = self._routers(plan)
        total = torch.zeros((), dtype=torch.float64)
        recorded = []
        for b, ids in enumerate(self.batches):
            table: dict[int, LayerRouter] = dict(routers)
            if record:
                store: list = [None] * self.num_layers
                table = {i: _Record(store, routers) for i in range(self.num_layers)}
            elif start > 0:
                table.update({i: SkipLayer() for i in range(start)})
                table[start] = _Inject(self.recorded[b][start], routers.get(start))
            with contextlib.ExitStack() as stack:
                for i, router in table.items():
                    stack.enter_context(use_router(self.model, router, [i]))
                logits = self.model(input_ids=ids, use_cache=False).logits
            total += _nll_sum(logits, ids).cpu()
            if record:
                recorded.append(store)
        if record:
            self.recorded = recorded
        return float(total) / self.count

    def can_resume(self) -> bool:
        b = self.batches
        size = sum(x.numel() for x in b) * self.num_layers * self.model.config.get_text_config().hidden_size * 4
        return size <= _REUSE_LIMIT_BYTES


@dataclass
class LayerSearch:
    """The result of :func:`search_layers`.

    order: layers in the order picked. ppl: calibration perplexity after each pick (``ppl[j]`` with the first
    ``j + 1`` layers; one-shot: the perplexity of that layer alone, Taylor: its importance). candidates: the
    layers considered. trials: per step, candidate -> calibration perplexity (one-shot and iterative).
    dense_ppl: calibration perplexity of the unchanged model.
    """

    method: str
    action: str
    order: list[int]
    ppl: list[float]
    candidates: list[int]
    trials: list[dict[int, float]]
    dense_ppl: float
    router: dict[str, Any]

    def plan(self, n: int) -> Plan:
        """The plan with the first ``n`` picked layers."""
        n = check_int("n", n, 0, len(self.order))
        chosen = tuple(sorted(self.order[:n]))
        if self.action == "remove":
            return Plan(removed=chosen)
        return Plan(routed=chosen, router=dict(self.router))


def search_layers(model: torch.nn.Module, windows: torch.Tensor, n: int, *, action: str = "route",
                  search: str = "iterative", candidates: Iterable[int] | None = None,
                  router: dict[str, Any] | None = None, batch_size: int = 4, keep_first: int = 4,
                  keep_last: int = 2, progress: bool = False) -> LayerSearch:
    """Pick ``n`` decoder layers by calibration perplexity on ``windows (m, seq_len)``.

    action ``"remove"`` (layer pruning) or ``"route"`` (OrthoRank token selection with ``router`` options);
    search ``"iterative"`` (SLEB's greedy), ``"one-shot"`` (Shortened LLaMA's PPL criterion) or ``"taylor"``
    (Shortened LLaMA's Taylor+, ``action="remove"`` only; ``keep_first`` / ``keep_last`` blocks are never
    candidates). ``candidates`` default: every layer.
    """
    action = check_choice("action", action, ACTIONS)
    search = check_choice("search", search, SEARCHES)
    router = dict(router or {})
    pool = _candidate_pool(model, candidates, action, search, router, keep_first, keep_last)
    n = check_int("n", n, 0, len(pool))
    evaluator = _Evaluator(model, windows, batch_size)
    resume = evaluator.can_resume()
    dense = math.exp(evaluator.nll(Plan(), record=resume))
    if search == "taylor":
        scores = taylor_importance(model, windows, batch_size=batch_size)
        ranked = sorted(pool, key=lambda c: float(scores[c]))[:n]
        return LayerSearch("taylor", action, ranked, [float(scores[c]) for c in ranked], pool, [], dense, router)
    base = Plan(router=router) if action == "route" else Plan()
    if search == "one-shot":
        tried = _try_each(evaluator, base, pool, action, resume, "  one-shot" if progress else None)
        ranked = sorted(tried, key=tried.get)[:n]
        return LayerSearch("one-shot", action, ranked, [tried[c] for c in ranked], pool, [tried], dense, router)
    order: list[int] = []
    ppl: list[float] = []
    trials: list[dict[int, float]] = []
    current = base
    for step in range(n):  # SLEB: remove (or route) the layer whose loss hurts least, then search again
        todo = [c for c in pool if c not in order]
        tried = _try_each(evaluator, current, todo, action, resume, f"  step {step + 1}/{n}" if progress else None)
        trials.append(tried)
        best = min(tried, key=tried.get)
        order.append(best)
        ppl.append(tried[best])
        current = current.with_layer(best, action)
        if resume and step + 1 < n:
            evaluator.nll(current, record=True)
    return LayerSearch("iterative", action, order, ppl, pool, trials, dense, router)


def _candidate_pool(model, candidates, action: str, search: str, router: dict, keep_first: int,
                    keep_last: int) -> list[int]:
    """The layers a search may pick, checked (``candidates``; Taylor+ spares the first and last blocks)."""
    num_layers = model_state(model).num_layers
    pool = list(range(num_layers)) if candidates is None else sorted(set(int(c) for c in candidates))
    if any(not 0 <= c < num_layers for c in pool):
        raise ValueError(f"candidates must be layers in 0..{num_layers - 1}, got {pool}")
    if action == "remove" and router:
        raise ValueError("router options only apply to action='route'")
    if action == "route":
        OrthoRankRouter(**router)  # checks the options now rather than halfway through the search
    if search != "taylor":
        return pool
    if action != "remove":
        raise ValueError("search='taylor' ranks blocks for removal (Shortened LLaMA); use action='remove'")
    return [c for c in pool if keep_first <= c < num_layers - keep_last]


def _try_each(evaluator, current: Plan, todo: list[int], action: str, resume: bool, label) -> dict[int, float]:
    """Calibration perplexity of ``current`` plus each candidate layer."""
    if label:
        print(f"{label}: {len(todo)} candidates", flush=True)
    return {c: math.exp(evaluator.nll(current.with_layer(c, action), start=c if resume else 0)) for c in todo}


def taylor_importance(model: torch.nn.Module, windows: torch.Tensor, *, batch_size: int = 4) -> torch.Tensor:
    """``(num_layers,)`` Shortened LLaMA's block importance ``sum_W |dL/dW * W|`` (L: mean NLL on ``windows``),
    gradients accumulated over the batches. The model's parameters are left unchanged (grads cleared)."""
    layers = (model.get_decoder() if hasattr(model, "get_decoder") else model.model).layers
    params = [list(layer.parameters()) for layer in layers]
    device = next(model.parameters()).device
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    for group in params:
        for p in group:
            p.requires_grad_(True)
            p.grad = None
    count = windows.shape[0] * (windows.shape[1] - 1)
    try:
        for ids in windows.split(check_int("batch_size", batch_size, 1)):
            ids = ids.to(device)
            logits = model(input_ids=ids, use_cache=False).logits
            (_nll_sum(logits, ids) / count).backward()
        scores = torch.tensor([sum(float((p.grad.double() * p.detach().double()).abs().sum())
                                   for p in group if p.grad is not None) for group in params])
    finally:
        for p, flag in zip(model.parameters(), flags):
            p.grad = None
            p.requires_grad_(flag)
    return scores


def nominal_sparsity(num_layers: int, *, removed: int = 0, routed: int = 0, token_ratio: float = 0.33) -> float:
    """The paper's sparsity: ``(removed + routed * (1 - token_ratio)) / num_layers`` (Sec. 4.1, Table 4)."""
    num_layers = check_int("num_layers", num_layers, 1)
    token_ratio = check_float("token_ratio", token_ratio, 0.0, 1.0)
    return (check_int("removed", removed, 0) + check_int("routed", routed, 0) * (1.0 - token_ratio)) / num_layers


def layers_for_sparsity(num_layers: int, sparsity: float, token_ratio: float = 0.0) -> int:
    """The fewest layers that reach at least ``sparsity``: removed layers (``token_ratio=0``) or routed layers
    computing ``token_ratio`` of the tokens. 40 layers, 10% / 20%: 4 / 8 removed, 6 / 12 routed at 0.33."""
    num_layers = check_int("num_layers", num_layers, 1)
    sparsity = check_float("sparsity", sparsity, 0.0, 1.0)
    token_ratio = check_float("token_ratio", token_ratio, 0.0, 1.0, high_open=True)
    n = math.ceil(sparsity * num_layers / (1.0 - token_ratio) - 1e-9)
    if n > num_layers:
        raise ValueError(f"sparsity={sparsity} at token_ratio={token_ratio} needs {n} layers but the model has "
                         f"{num_layers}: lower the sparsity or the token ratio")
    return n
