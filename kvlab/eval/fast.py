"""The fast decode engine: one-token steps through a :class:`~kvlab.core.StaticKVCache`, graph-captured on CUDA.

The hooks engine (``model(ids, past_key_values=KVCache(...))``) pays per token for transformers' mask
construction, kvlab's model hooks, tensors concatenated and re-gathered every layer and a Python policy
returning indices of data-dependent length: tens of milliseconds on a GPU for a 135M model whose step is
microseconds of arithmetic. :class:`FastDecoder` runs the same maths as a fixed sequence of kernels::

    hidden = embed_tokens(ids)                          # (B, 1, hidden)
    rope = cache.begin_step(ids)                        # per-row rope positions, in place
    cos, sin = rotary_emb(hidden, rope)
    for layer in decoder layers:                        # the model's own modules
        hidden = layer(hidden, past_key_values=cache)   # cache.update + cache.attend (slot mask)
    logits = lm_head(norm(hidden))
    cache.end_step()                                    # policy.static_keep per layer + compaction

On CUDA the step is warmed up on a side stream, captured once in a ``torch.cuda.CUDAGraph`` and replayed
with the input buffer refilled; on CPU it runs eagerly. :func:`static_reason` says when a model or policy
cannot take this path (the evaluators then fall back to the hooks engine, with a warning).
"""

from __future__ import annotations

import time

import torch

from kvlab.core import Policy, StaticKVCache, model_state, static_support
from kvlab.core.state import StepInfo

__all__ = ["FastDecoder", "decode_static", "generate_static", "static_reason"]


def static_reason(model, policy: Policy) -> str | None:
    """None when :class:`FastDecoder` can run ``policy`` on ``model``; otherwise why not (one line)."""
    return static_support(model, policy)


def _text_config(model):
    return model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config


class FastDecoder:
    """Decode ``batch`` streams one token per step through ``policy`` with static shapes.

    ``capacity``: slots per layer and row; default ``policy.budget + 1``, or ``max_steps`` (the most tokens
    that will be fed) when smaller; an unbounded policy (``Full``) needs one of the two. ``record``: steps
    whose per-layer entry counts are kept on the device (:meth:`trace`). ``graph``: capture a CUDA graph
    (default: on CUDA). ``compile``: ``torch.compile`` the layers (inductor fuses each layer's norms, rotary,
    SiLU and residual adds) before the graph is captured: about 1.8x the tokens/s on an H100, for roughly a
    minute of compiling the first time a model shape, dtype and policy kind is seen (cached after that).
    Several streams: ``batch=B`` rows, one token each per step, each row its own kept entries. ``kernel``: the
    cache's layout and attention (:class:`~kvlab.core.StaticKVCache`): ``"auto"`` (the Triton kernel over entries
    that never move, on CUDA), ``"compact"`` (every slot moved and re-rotated each step: the engine before
    2026-11, kept for comparison), ``"indexed"``, ``"triton"``.

    >>> dec = FastDecoder(model, StreamingLLM(4, 252))
    >>> logits = dec.step(ids[:, t:t + 1])   # (B, vocab); on CUDA valid until the next step (clone to keep)
    """

    def __init__(self, model, policy: Policy, batch: int = 1, capacity: int | None = None, *,
                 max_steps: int | None = None, record: int = 0, graph: bool | None = None, compile: bool = False,
                 kernel: str = "auto"):
        if not isinstance(policy, Policy):
            raise TypeError(f"policy must be a kvlab Policy, got {type(policy).__name__}")
        reason = static_reason(model, policy)
        if reason is not None:
            raise NotImplementedError(f"the static decode engine cannot run {type(policy).__name__}: {reason}; "
                                      "use engine='hooks'")
        self.state = model_state(model)
        policy.check_model(self.state.num_layers)
        config = _text_config(model)
        if getattr(config, "vocab_size", None):
            policy.check_vocab(int(config.vocab_size))
        budget = policy.budget
        if capacity is None:
            if budget is None and max_steps is None:
                raise ValueError(f"{type(policy).__name__} keeps every entry (no budget): pass capacity= (or "
                                 "max_steps=) the number of tokens to decode")
            capacity = min(c for c in (None if budget is None else budget + 1, max_steps) if c is not None)
        self.model, self.policy = model, policy
        self.inner = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        self.cache = StaticKVCache(model, policy, batch, capacity, max_steps=max_steps, kernel=kernel)
        # the most steps it may take (checked on the host): max_steps, or the capacity of an unbounded policy
        self.limit = max_steps if max_steps is not None else (capacity if budget is None else None)
        param = next(model.parameters())
        self.device = param.device
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.cache.prepare(self.device, param.dtype, config.num_key_value_heads, head_dim)
        self.ids = torch.zeros((batch, 1), dtype=torch.long, device=self.device)
        self.vocab = int(getattr(config, "vocab_size", None) or self.inner.embed_tokens.num_embeddings)
        self.record = record
        self._trace = torch.zeros((record, batch, self.state.num_layers), dtype=torch.long, device=self.device)
        self._index = torch.zeros(1, dtype=torch.long, device=self.device)
        self.graph = (self.device.type == "cuda") if graph is None else graph
        # torch.compile (inductor) fuses each layer's elementwise chains (norms, rotary, SiLU, residuals) into a
        # few kernels; the CUDA graph then replays those. Compiling happens in the first step (warm-up).
        self._body = self._layers
        if compile:
            # every decoder shares the compiled code of _layers; each model shape, dtype, batch, capacity and
            # position mode is one more specialisation of it (dynamo's default allows 8)
            config = torch._dynamo.config
            config.recompile_limit = max(config.recompile_limit, 64)
            self._body = torch.compile(self._layers, dynamic=False)
        self._graph: torch.cuda.CUDAGraph | None = None
        self._logits: torch.Tensor | None = None

    @property
    def steps(self) -> int:
        return self.cache.steps

    def _layers(self, hidden: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        inner = self.inner
        position_embeddings = inner.rotary_emb(hidden, position_ids=rope)
        for layer in inner.layers[: self.state.num_layers]:
            hidden = layer(hidden, attention_mask=None, position_embeddings=position_embeddings,
                           position_ids=rope, past_key_values=self.cache, use_cache=True)
            hidden = hidden[0] if isinstance(hidden, tuple) else hidden
        return self.model.lm_head(inner.norm(hidden))[:, -1]

    def _forward(self) -> torch.Tensor:
        cache = self.cache
        hidden = self.inner.embed_tokens(self.ids)
        rope = cache.begin_step(self.ids)
        self.state.step = StepInfo(self.ids, rope, cache, False)
        try:
            logits = self._body(hidden, rope)
        finally:
            self.state.step = None
        cache.end_step()
        if self.record:
            self._trace.index_copy_(0, self._index, cache.length.t()[None])
            self._index += 1
        return logits

    def _reset(self) -> None:
        self.cache.reset()
        self._index.zero_()

    def _capture(self) -> None:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # warm-up: lazy initialisation, kernel autotuning, allocator pools
            for _ in range(2):
                self._forward()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self._reset()
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._logits = self._forward()
        self._reset()

    @torch.no_grad()
    def step(self, ids: torch.Tensor) -> torch.Tensor:
        """Feed ``ids`` ``(B, 1)``; returns the logits ``(B, vocab)`` of this step."""
        if self.limit is not None and self.cache.steps >= self.limit:
            raise ValueError(f"step {self.cache.steps + 1} exceeds the {self.limit} steps this decoder was made for "
                             f"(capacity={self.cache.capacity}, {self.policy!r}); create it with a larger "
                             "capacity / max_steps")
        if self.record and self.cache.steps >= self.record:
            raise ValueError(f"step {self.cache.steps + 1} exceeds record={self.record} traced steps")
        if ids.shape != self.ids.shape:
            raise ValueError(f"ids must have shape {tuple(self.ids.shape)} (batch, 1), got {tuple(ids.shape)}")
        _check_ids(ids, self.vocab, host_only=True)
        self.ids.copy_(ids)
        if self.graph:
            if self._graph is None:
                self._capture()
            self._graph.replay()
            out = self._logits
        else:
            out = self._forward()
        self.cache.steps += 1
        return out

    def reset(self) -> None:
        """Start new streams (the captured graph is kept)."""
        self._reset()

    def trace(self) -> torch.Tensor:
        """``(steps, B, layers)`` entries each layer held after each recorded step (one copy to the host)."""
        return self._trace[: min(self.cache.steps, self.record)].cpu()


@torch.no_grad()
def _check_ids(ids: torch.Tensor, vocab: int | None, host_only: bool = False) -> None:
    """Token ids are integers in ``[0, vocab)``: a float id would be truncated and an id out of range would fail
    deep in the embedding. ``host_only``: check the range only for host tensors (a per-step check of GPU ids would
    synchronise every step; :func:`decode_static` checks a whole GPU stream once)."""
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"ids must be integer token ids, got dtype {ids.dtype}; convert exact ids with "
                         ".long() (a float id such as 7.9 is not a token)")
    if vocab is None or ids.numel() == 0 or (host_only and ids.device.type != "cpu"):
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise ValueError(f"ids must lie in [0, {vocab}) (the model's vocabulary), got {bad}; tokenize with this "
                         "model's tokenizer")


def decode_static(model, ids: torch.Tensor, policy: Policy, *, progress: bool = False,
                  graph: bool | None = None, compile: bool = False, kernel: str = "auto") -> dict:
    """Decode ``ids`` ``(B, T)`` token by token with :class:`FastDecoder`; the NLL of tokens ``1..T-1``.
    ``compile``: torch.compile the layers first; ``kernel``: the cache's layout (see :class:`FastDecoder`).

    Returns ``dict(nll=(B, T-1) float64, trace=(T-1, B, layers), seconds, entry_bytes)`` (host tensors).
    """
    from tqdm.auto import tqdm

    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        raise ValueError(f"ids must be a (batch, tokens) tensor of token ids, got "
                         f"{tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__}")
    batch, n = ids.shape
    if n < 2:
        raise ValueError(f"ids has {n} token(s) per row; decode_static scores tokens 1..T-1 from the ones before "
                         "them, so it needs at least 2 tokens per row: pass a longer ids")
    _check_ids(ids, int(getattr(_text_config(model), "vocab_size", 0) or 0) or None)
    decoder = FastDecoder(model, policy, batch, max_steps=n - 1, record=n - 1, graph=graph, compile=compile,
                          kernel=kernel)
    ids = ids.to(decoder.device).long()  # int32 ids are fine tokens; cross_entropy's targets must be long
    nll = torch.empty((n - 1, batch), dtype=torch.float64, device=decoder.device)
    cuda = decoder.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(decoder.device)
    start = time.perf_counter()
    for t in tqdm(range(n - 1), desc=f"stream {type(policy).__name__} (static)", disable=not progress,
                  mininterval=1.0):
        logits = decoder.step(ids[:, t:t + 1])
        nll[t] = torch.nn.functional.cross_entropy(logits.float(), ids[:, t + 1], reduction="none")
    if cuda:
        torch.cuda.synchronize(decoder.device)
    seconds = time.perf_counter() - start
    return dict(nll=nll.t().cpu(), trace=decoder.trace(), seconds=seconds, entry_bytes=decoder.cache.entry_bytes())



@torch.no_grad()
def generate_static(model, prompts: list[list[int]], policy: Policy, *, max_new_tokens: int, stop_ids=(),
                    stopped=None, batch: int = 256, check_every: int = 16, graph: bool | None = None,
                    compile: bool = False, kernel: str = "auto", progress: bool = False) -> list[dict]:
    """Greedy generation for many prompts at once through :class:`FastDecoder`, ``batch`` streams a pass.

    Every stream is its prompt fed one token a step, then its own greedy tokens: all streams move in lockstep (one
    token each a step), a stream whose prompt is shorter starts generating earlier, so the policy sees each stream
    exactly as it would alone (a prompt streamed through the policy is the policy's prefill pattern: SepLLM,
    StreamingLLM and Full keep the same entries either way). Prompts go into passes sorted by length (less idle
    feeding); one decoder (one CUDA graph) serves every pass, the last pass padded with copies of its first prompt.

    A stream stops at its first token in ``stop_ids`` (kept as its last token) or when ``stopped(tokens)`` (host
    callback on the stream's last ``check_every + 8`` tokens, asked every ``check_every`` steps for streams still
    running: e.g. "the text holds a stop string" of at most 8 tokens)
    says so; the pass ends when every stream has stopped or ``max_new_tokens`` were generated.

    Returns, in the order of ``prompts``: ``[{"tokens": generated ids (up to the first stop id), "r_kv": mean over
    its generated tokens of (entries held, mean over layers) / (tokens seen), "steps": the pass's steps}]``.
    """
    from tqdm.auto import tqdm

    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not prompts or any(len(p) < 1 for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token id lists")
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    batch = min(batch, len(prompts))
    longest = max(len(p) for p in prompts)
    steps_max = longest + max_new_tokens - 1  # the last generated token is never fed
    decoder = FastDecoder(model, policy, batch, max_steps=steps_max, record=steps_max, graph=graph, compile=compile,
                          kernel=kernel)
    stop_list = sorted({int(i) for i in stop_ids})
    stop_t = torch.tensor(stop_list or [-1], device=decoder.device)
    out: list[dict | None] = [None] * len(prompts)
    for start in tqdm(range(0, len(order), batch), desc=f"generate {type(policy).__name__} (static)",
                      disable=not progress):
        rows = order[start:start + batch]
        rows = rows + [rows[0]] * (batch - len(rows))
        lens = torch.tensor([len(prompts[i]) for i in rows], device=decoder.device)
        width = int(lens.max())
        table = torch.zeros((batch, width + 1), dtype=torch.long, device=decoder.device)
        for b, i in enumerate(rows):
            table[b, :len(prompts[i])] = torch.tensor(prompts[i])
        gen = torch.full((batch, max_new_tokens), -1, dtype=torch.long, device=decoder.device)
        done = torch.zeros(batch, dtype=torch.bool, device=decoder.device)  # a stop id was generated
        finished = [False] * batch  # host view: stop id or stop string seen
        decoder.reset()
        current = table[:, :1].clone()
        steps = width + max_new_tokens - 1
        for t in range(steps):
            logits = decoder.step(current)
            token = logits.argmax(dim=-1)  # (B,): stream b's token at position t + 1
            index = t + 1 - lens  # where it goes among the generated tokens (< 0: still in the prompt)
            writing = (index >= 0) & (index < max_new_tokens) & ~done
            slot = index.clamp(0, max_new_tokens - 1)[:, None]
            gen.scatter_(1, slot, torch.where(writing, token, gen.gather(1, slot)[:, 0])[:, None])
            done |= writing & torch.isin(token, stop_t)
            current.copy_(torch.where(index >= 0, token, table[:, min(t + 1, width)])[:, None])
            if (t + 1) % check_every == 0 or t == steps - 1:
                host_done, host_gen = done.cpu(), gen.cpu()
                for b in range(batch):
                    if not finished[b]:
                        tokens = [x for x in host_gen[b].tolist() if x >= 0]
                        # a stop string that ended since the last check lies in the last check_every + 8 tokens
                        finished[b] = (bool(host_done[b]) or len(tokens) == max_new_tokens or (
                            stopped is not None and bool(tokens) and stopped(tokens[-(check_every + 8):])))
                if all(finished):
                    break
        trace = decoder.trace().float().mean(dim=2)  # (steps taken, B): entries held after each step
        host_gen = gen.cpu()
        for b, i in enumerate(rows[:len(order[start:start + batch])]):
            tokens = [x for x in host_gen[b].tolist() if x >= 0]
            first_stop = next((k for k, x in enumerate(tokens) if x in stop_list), None)
            tokens = tokens if first_stop is None else tokens[:first_stop + 1]
            n = len(prompts[i])
            # the hooks engine's r.KV: after each generated token but the last is fed (step n + k, seen n + k + 1)
            fed = range(n, min(n + len(tokens) - 1, trace.shape[0]))
            ratios = [float(trace[s, b]) / (s + 1) for s in fed]
            out[i] = {"tokens": tokens, "r_kv": sum(ratios) / len(ratios) if ratios else 1.0, "steps": t + 1}
    return out
