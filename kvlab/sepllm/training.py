"""Training with SepLLM's mask: a small Llama from scratch (Sec. 4.3, Fig. 5, Tables 2-3) and a short
SepLLM-mask fine-tuning of a pretrained model (Sec. 4.4, Fig. 6).

The mask is applied through :func:`kvlab.core.use_pattern` with :class:`~kvlab.sepllm.SepLLMPattern`
(differentiable; ``backend="flex"`` or ``"triton"`` on a GPU), so the model code is transformers' own.
Variants (:class:`Variant`) as in Table 2: vanilla, SepLLM ``n=64`` / ``n=128``, SepLLM with the first
("H") or first and last ("H/T") layers full, and StreamingLLM (SepLLM's mask without separators).

Vocabulary: the SmolLM2 tokenizer has 49k ids, which would make a CPU-sized model mostly embedding.
:class:`CompactVocab` keeps the ``size - 1`` most frequent ids of the training text and maps the rest to
one "unknown" id; separators keep their own ids, so segments are those of the real tokenizer.

FLOPs (Table 3, Fig. 5b): matrix multiplications only, forward + backward = 3 x forward::

    dense   = 2 * (non-embedding weights + output head) * tokens
    attention = 2 * 2 * hidden * (kept query-key entries, summed over layers)   # Q K^T and P V
    step FLOPs = 3 * (dense + attention)

"Attention-map ratio" is the share of the causal triangle's entries that the mask keeps, over layers.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from kvlab.core import attach, use_pattern
from kvlab.sepllm.pattern import SepLLMPattern
from kvlab.sepllm.reference import kept_fraction

__all__ = ["CompactVocab", "Variant", "TinyConfig", "TrainResult", "VARIANTS", "tiny_llama", "batches",
           "step_flops", "train", "evaluate_loss", "finetune"]


class CompactVocab:
    """Map tokenizer ids to ``0..size-1``: the most frequent ids of ``token_ids`` plus ``unk = size - 1``.

    ``separators`` (tokenizer ids) are always kept so the SepLLM mask sees every separator.
    """

    def __init__(self, token_ids: torch.Tensor, size: int, separators=()):
        if size < 2:
            raise ValueError(f"size must be >= 2, got {size}")
        counts = Counter(token_ids.flatten().tolist())
        present_seps = [s for s in sorted({int(s) for s in separators}) if s in counts]
        chosen = list(present_seps)
        for tok, _ in counts.most_common():
            if len(chosen) >= size - 1:
                break
            if tok not in present_seps:
                chosen.append(tok)
        self.size = size
        self.unk = size - 1
        self.ids = torch.tensor(chosen, dtype=torch.long)
        self._table = torch.full((int(token_ids.max()) + 1,), self.unk, dtype=torch.long)
        self._table[self.ids] = torch.arange(len(chosen))
        self.separators = torch.arange(len(present_seps))

    def encode(self, token_ids: torch.Tensor) -> torch.Tensor:
        inside = token_ids < self._table.numel()
        return torch.where(inside, self._table[token_ids.clamp(max=self._table.numel() - 1)], self.unk)

    def coverage(self, token_ids: torch.Tensor) -> float:
        """Share of tokens that are not mapped to unknown."""
        return float((self.encode(token_ids) != self.unk).float().mean())


@dataclass(frozen=True)
class Variant:
    """An attention mask for training: ``kind`` in {"vanilla", "sepllm", "streaming"}; ``full_layers``
    lists layers that keep full attention (hybrid "H" = first layer, "H/T" = first and last)."""

    name: str
    kind: str = "sepllm"
    init: int = 4
    neighbors: int = 64
    full_layers: tuple[int, ...] = ()

    def __post_init__(self):
        if self.kind not in ("vanilla", "sepllm", "streaming"):
            raise ValueError(f"kind must be vanilla, sepllm or streaming, got {self.kind!r}")

    def pattern(self, separators, backend: str = "mask") -> SepLLMPattern | None:
        if self.kind == "vanilla":
            return None
        return SepLLMPattern(separators if self.kind == "sepllm" else (), self.init, self.neighbors, backend=backend)

    def sparse_layers(self, num_layers: int) -> list[int]:
        full = {i % num_layers for i in self.full_layers}
        return [i for i in range(num_layers) if self.kind != "vanilla" and i not in full]


def VARIANTS(short: int = 64, long: int = 128, init: int = 4) -> list[Variant]:
    """Table 2's rows: vanilla, StrmLLM(n=short), SepLLM(n=short), SepLLM(n=long), SepLLM(n=short, H/T)."""
    return [
        Variant("Vanilla", "vanilla"),
        Variant(f"StrmLLM(n={short})", "streaming", init, short),
        Variant(f"SepLLM(n={short})", "sepllm", init, short),
        Variant(f"SepLLM(n={long})", "sepllm", init, long),
        Variant(f"SepLLM(n={short},H/T)", "sepllm", init, short, (0, -1)),
    ]


@dataclass(frozen=True)
class TinyConfig:
    """A small Llama-style model (RoPE, RMSNorm, SwiGLU, grouped-query attention)."""

    vocab: int = 4096
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 384
    max_positions: int = 4096


def tiny_llama(cfg: TinyConfig, seed: int = 0):
    """A randomly initialised ``LlamaForCausalLM`` of ``cfg``, attached to kvlab (patterns work on it)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
                         num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
                         num_key_value_heads=cfg.kv_heads, max_position_embeddings=cfg.max_positions,
                         tie_word_embeddings=True)
    return attach(LlamaForCausalLM(config))


def batches(ids: torch.Tensor, batch: int, seq_len: int, steps: int, seed: int = 0):
    """``steps`` batches ``(batch, seq_len)`` of random windows of the 1-d stream ``ids`` (same for all variants
    given the seed)."""
    if ids.numel() <= seq_len:
        raise ValueError(f"need more than seq_len={seq_len} tokens, got {ids.numel()}")
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, ids.numel() - seq_len, (batch,), generator=g)
        yield torch.stack([ids[s:s + seq_len] for s in starts.tolist()])


def step_flops(model, variant: Variant, batch_ids: torch.Tensor, separators) -> tuple[float, float]:
    """(FLOPs of one training step on ``batch_ids``, attention-map ratio), see the module docstring."""
    cfg = model.config
    b, t = batch_ids.shape
    emb = cfg.vocab_size * cfg.hidden_size
    weights = sum(p.numel() for p in model.parameters()) - emb  # tied head: counted once below
    dense = 2 * (weights + emb) * b * t
    causal = b * t * (t + 1) / 2
    if variant.kind == "vanilla":
        ratio_sparse = 1.0
    else:
        sep = torch.as_tensor(list(separators) if variant.kind == "sepllm" else [], dtype=torch.long)
        is_sep = torch.isin(batch_ids, sep)
        ratio_sparse = kept_fraction(is_sep, variant.init, variant.neighbors)
    sparse = len(variant.sparse_layers(cfg.num_hidden_layers))
    full = cfg.num_hidden_layers - sparse
    kept = causal * (sparse * ratio_sparse + full)
    attention = 2 * 2 * cfg.hidden_size * kept
    return 3.0 * (dense + attention), kept / (causal * cfg.num_hidden_layers)


@dataclass
class TrainResult:
    variant: str
    losses: list[float] = field(default_factory=list)
    flops: list[float] = field(default_factory=list)  # cumulative, after each step
    attention_ratio: float = 1.0
    eval_loss: float | None = None
    seconds: float = 0.0

    def smoothed(self, k: int = 10) -> list[float]:
        out, acc = [], []
        for x in self.losses:
            acc.append(x)
            acc = acc[-k:]
            out.append(sum(acc) / len(acc))
        return out


def _loss(model, ids: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def train(model, variant: Variant, data: torch.Tensor, separators, *, steps: int = 200, batch: int = 8,
          seq_len: int = 256, lr: float = 3e-3, warmup: int = 20, seed: int = 0, backend: str = "mask",
          progress: bool = False) -> TrainResult:
    """Train ``model`` on windows of ``data`` (1-d ids) under ``variant``'s mask; AdamW, warmup + cosine.

    On CUDA the forward and backward run under bfloat16 autocast (weights and optimiser stay float32),
    the usual mixed-precision recipe; on the CPU everything is float32.
    """
    from tqdm.auto import tqdm

    pattern = variant.pattern(separators, backend)
    layers = variant.sparse_layers(model.config.num_hidden_layers)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(warmup, 1)) * 0.5 * (1 + math.cos(math.pi * min(s / steps, 1.0))))
    result = TrainResult(variant.name)
    total, ratios = 0.0, []
    model.train()
    start = time.perf_counter()
    device = next(model.parameters()).device
    for ids in tqdm(batches(data, batch, seq_len, steps, seed), total=steps, desc=variant.name, disable=not progress):
        ids = ids.to(device)
        amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
        with amp, use_pattern(model, pattern, layers):
            loss = _loss(model, ids)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        flops, ratio = step_flops(model, variant, ids.cpu(), separators)
        total += flops
        ratios.append(ratio)
        result.losses.append(loss.item())
        result.flops.append(total)
    model.eval()
    result.seconds = time.perf_counter() - start
    result.attention_ratio = sum(ratios) / len(ratios)
    return result


@torch.no_grad()
def evaluate_loss(model, data: torch.Tensor, *, pattern=None, layers=None, seq_len: int = 256,
                  max_windows: int = 8) -> float:
    """Mean next-token loss over consecutive windows of ``data`` (1-d), under ``pattern`` if given."""
    model.eval()
    device = next(model.parameters()).device
    n = min(max_windows, (data.numel() - 1) // seq_len)
    if n < 1:
        raise ValueError(f"need at least seq_len + 1 = {seq_len + 1} tokens, got {data.numel()}")
    ids = data[:n * seq_len].view(n, seq_len).to(device)
    with use_pattern(model, pattern, layers):
        return float(_loss(model, ids))


def finetune(model, data: torch.Tensor, pattern, *, steps: int = 20, batch: int = 1, seq_len: int = 256,
             lr: float = 2e-5, seed: int = 0, layers=None, progress: bool = False) -> list[float]:
    """Post-training (Sec. 4.4): a few AdamW steps of a pretrained model under ``pattern``; returns losses."""
    from tqdm.auto import tqdm

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    device = next(model.parameters()).device
    losses = []
    model.train()
    for ids in tqdm(batches(data, batch, seq_len, steps, seed), total=steps, desc="finetune", disable=not progress):
        with use_pattern(model, pattern, layers):
            loss = _loss(model, ids.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses
