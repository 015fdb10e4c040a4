"""A policy-driven KV cache with static shapes: the decode step as a fixed sequence of GPU kernels.

:class:`~kvlab.core.KVCache` holds exactly the kept entries: its tensors change shape every step, and the
policy returns indices of data-dependent length. That is simple and exact, but each step then costs
Python, host synchronisation and dozens of small allocations. :class:`StaticKVCache` keeps the *same
entries* in buffers of fixed capacity ``C``::

    keys, values   (L, B, kv_heads, C, d)   entries of layer l, row b: compacted as a prefix, oldest first
    positions      (L, B, C)   original stream position of each entry
    token_ids      (L, B, C)   its token id
    rot            (L, B, C)   position its key was rotated at when stored (RoPE)
    length         (L, B)      entries held (slots >= length are garbage, never read)

Everything that changes per step lives in device tensors updated in place (``seen``, ``length``, the
policy's scratch state), so one step has no ``.item()``, no Python loop over entries and no
data-dependent shape: it can be captured once in a CUDA graph and replayed.

One step (one token per row)::

    begin_step(ids)                        # rope position per row ("original" / "cache" / "insertion");
                                           # the new entry's position, id, rotation into slot length[l, b]
    for each layer l:                      # inside the model
        update(k, v, l)                    # scatter its key and value into slot length[l, b]
        attend(q, l)                       # SDPA over the slots < length + 1 (a boolean slot mask)
    end_step()                             # length += 1; keep = policy.static_keep(view): (L*B, C) bool,
                                           # every layer and row in one call;
                                           # stable partition (cumsums, one scatter): kept slots move
                                           # to the front, in order

Positions follow :mod:`kvlab.core.cache` exactly: with ``"cache"`` the query sits at the largest number of
entries any layer holds and entry ``i`` of a layer holding ``n`` is re-rotated to ``query - n + i``; with
``"insertion"`` the query sits at layer 0's count and cached keys are never moved.

On a CPU the step runs eagerly, so reading a count costs nothing: :meth:`update` hands out only the live
prefix, skips a re-rotation by zero and a compaction that drops nothing (the hooks engine's arithmetic).

Attention reads the cache through a slot mask with SDPA, not the ragged Triton kernel
(``kvlab.kernels.decode.ragged_decode_attention``): that kernel wants the rows packed back to back
(``cu_seqlens``: row b owns ``[cu[b], cu[b+1])``), and here every row owns ``C`` slots of which only a
prefix is live, a layout the packed offsets cannot describe without copying the live prefixes together
every layer and step (a kernel taking per-row starts and lengths would fit; kvlab.core may not import
kvlab.kernels either). At a budget of a few hundred entries the masked SDPA reads at most ``C`` slots.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache

from kvlab.core.cache import rerotate, rotate_half
from kvlab.core.pattern import attend
from kvlab.core.policy import Policy
from kvlab.core.state import model_state
from kvlab.core.views import StaticView

__all__ = ["StaticKVCache", "StaticView", "static_support"]


def static_support(model: torch.nn.Module, policy: Policy) -> str | None:
    """None when the static engine can run ``policy`` on ``model``, else the reason it cannot."""
    state = model_state(model)
    model_type = getattr(model.config, "model_type", None)
    if model_type not in ("llama", "qwen2"):
        return f"the static engine supports Llama and Qwen2 models, this one is {model_type!r}"
    if any(w is not None for w in state.sliding_window):
        return "the model has sliding-window layers"
    if state.routers or state.patterns:
        return "a layer router or attention pattern is installed"
    if state.base_implementation != "sdpa":
        return f"the model runs {state.base_implementation!r} attention"
    if policy.positions == "cache" and any(f is None for f in state.inv_freq):
        return "positions='cache' needs the rotary frequencies of every layer"
    return policy.static_reason


class StaticKVCache(Cache):
    """Fixed-capacity, policy-compacted KV cache for one-token decode steps (see the module docstring).

    ``StaticKVCache(model, policy, batch, capacity)``; ``capacity`` must be at least ``policy.budget + 1``
    (the kept entries plus the new one), or at least ``max_steps`` when the streams are known to be that
    short; for an unbounded policy (``Full``) it bounds the steps (the decoder checks them on the host).
    :meth:`prepare` creates the buffers.
    """

    def __init__(self, model: torch.nn.Module, policy: Policy, batch: int, capacity: int, *,
                 max_steps: int | None = None):
        reason = static_support(model, policy)
        if reason is not None:
            raise NotImplementedError(f"StaticKVCache cannot run {type(policy).__name__}: {reason}")
        state = model_state(model)
        budget = policy.budget
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        short = max_steps is not None and capacity >= max_steps  # a stream this short never fills it
        if budget is not None and capacity < budget + 1 and not short:
            raise ValueError(f"capacity ({capacity}) must be >= policy budget + 1 = {budget + 1} (the kept entries "
                             f"plus the new token); pass capacity={budget + 1} or more")
        if budget is None and max_steps is not None and not short:
            raise ValueError(f"capacity ({capacity}) must be >= max_steps ({max_steps}): "
                             f"{type(policy).__name__} keeps every entry")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a positive int, got {batch!r}")
        super().__init__(layers=[])
        self.policy, self.batch, self.capacity = policy, batch, capacity
        self.num_layers = state.num_layers
        self.inv_freq = state.inv_freq
        self.steps = 0  # one-token steps taken: a host counter the decoder keeps (never read from the device)
        self.ready = False
        self.in_step = False

    # -- buffers ------------------------------------------------------------------------------------------
    def _allocate(self, k: torch.Tensor, v: torch.Tensor) -> None:
        b, h, _, d = k.shape
        c, dev = self.capacity, k.device
        self.device, self.dtype = dev, k.dtype
        # Host reads that cost nothing when running eagerly on a CPU (and would break a CUDA graph elsewhere).
        self.shortcuts = dev.type == "cpu"
        L = self.num_layers
        # One tensor per kind for all layers: layer l is a view, and the policy decides for every layer
        # and row at once (rows = L * B), a handful of kernels per step instead of a handful per layer.
        self.keys = k.new_zeros((L, b, h, c, d))
        self.values = v.new_zeros((L, b, v.shape[1], c, v.shape[-1]))
        long = dict(dtype=torch.long, device=dev)
        self.positions = torch.zeros((L, b, c), **long)
        self.token_ids = torch.zeros((L, b, c), **long)
        self.rot = torch.zeros((L, b, c), **long)
        self.length = torch.zeros((L, b), **long)
        self.layer_of_row = torch.arange(L, device=dev).repeat_interleave(b)  # (L * B,)
        self._init_state = self.policy.static_state(L * b, dev)
        self.state = {key: t.clone() for key, t in self._init_state.items()}
        self.inv_freq = [None if f is None else f.to(dev) for f in self.inv_freq]
        if self.policy.positions == "cache":
            # Re-rotation shifts lie in [-2C, 2C] (positions within the cache; garbage slots clamped): cos/sin of
            # every shift once, gathered per step, instead of float64 trigonometry per layer and step. The values
            # are rerotate's (float64 angles, then the key dtype), so the results are the same bits. Layers that
            # share their frequencies share a table; ``_base[l]`` is where layer l's table starts, shift 0.
            shifts = torch.arange(-2 * c, 2 * c + 1, device=dev, dtype=torch.float64)
            tables, first = [], {}
            for f in self.inv_freq:
                if f is not None and id(f) not in first:
                    first[id(f)] = len(tables) * len(shifts) + 2 * c
                    angles = shifts[:, None] * f.to(torch.float64)[None]
                    tables.append(torch.cat((angles, angles), dim=-1))
            emb = torch.cat(tables)
            self._cos, self._sin = emb.cos().to(k.dtype), emb.sin().to(k.dtype)
            self._base = torch.tensor([first[id(f)] for f in self.inv_freq], **long)[:, None, None]  # (L, 1, 1)
            # The keys as attention reads them this step, every layer re-rotated at once in begin_step (a few
            # kernels per step, not per layer); update() writes the new key into both buffers.
            self.rotated = torch.zeros_like(self.keys)
        self.ready = True

    def prepare(self, device, dtype, kv_heads: int, head_dim: int) -> None:
        """Create the buffers and the step inputs before the first step (the decoder calls it)."""
        long = dict(dtype=torch.long, device=device)
        self.seen = torch.zeros((), **long)  # tokens processed before the step under way
        self.new_ids = torch.zeros((self.batch, 1), **long)
        self.rope = torch.zeros((self.batch, 1), **long)
        probe = torch.zeros((self.batch, kv_heads, 1, head_dim), device=device, dtype=dtype)
        self._allocate(probe, probe)

    def reset(self) -> None:
        """Empty the cache (buffers keep their memory); the policy state goes back to its start."""
        self.steps = 0
        if self.ready:
            self.seen.zero_()
            self.length.zero_()
            for key, t in self.state.items():
                t.copy_(self._init_state[key])

    # -- one step -----------------------------------------------------------------------------------------
    def begin_step(self, ids: torch.Tensor) -> torch.Tensor:
        """Copy ``ids`` ``(B, 1)`` into the step input and compute the rope positions ``(B, 1)`` (in place)."""
        self.new_ids.copy_(ids)
        mode = self.policy.positions
        if mode == "original":
            self.rope.copy_(self.seen.expand(self.batch, 1))
        elif mode == "cache":
            self.rope.copy_(self.length.max(dim=0).values[:, None])
        else:  # insertion: the count layer 0 holds
            self.rope.copy_(self.length[0][:, None])
        # The new entry's facts go to slot length[l, b] of every layer at once; its k/v come in update().
        slot = self.length[:, :, None]  # (L, B, 1)
        shape = slot.shape
        self.positions.scatter_(2, slot, self.seen.expand(shape))
        self.token_ids.scatter_(2, slot, self.new_ids[None].expand(shape))
        self.rot.scatter_(2, slot, self.rope[None].expand(shape))
        if mode == "cache" and not self.shortcuts:
            # entry i of a layer holding n goes to query - n + i (the new one, i = n, to the query: no move)
            slots = torch.arange(self.capacity, device=self.device)
            want = self.rope[None] - slot + slots  # (L, B, C)
            index = (want - self.rot).clamp(-2 * self.capacity, 2 * self.capacity) + self._base
            cos, sin = self._cos[index][:, :, None], self._sin[index][:, :, None]  # (L, B, 1, C, d)
            torch.add(self.keys * cos, rotate_half(self.keys) * sin, out=self.rotated)
        self.in_step = True
        return self.rope

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write the new entry at slot ``length[b]`` of every row; returns the full key/value buffers (keys
        re-rotated behind the query when ``positions == "cache"``)."""
        if not self.in_step:
            raise RuntimeError("StaticKVCache.update outside a step: drive it with kvlab.eval.fast.FastDecoder")
        if key_states.shape[2] != 1:
            raise ValueError(f"StaticKVCache decodes one token per step, got {key_states.shape[2]}")
        slot = self.length[layer_idx][:, None]  # (B, 1)
        k, v = self.keys[layer_idx], self.values[layer_idx]
        k.scatter_(2, slot[:, None, :, None].expand(-1, k.shape[1], 1, k.shape[3]), key_states)
        v.scatter_(2, slot[:, None, :, None].expand(-1, v.shape[1], 1, v.shape[3]), value_states)
        rot = self.rot[layer_idx]
        if self.shortcuts:  # eager: hand out the live prefix only (reading the count costs nothing)
            live = int(self.length[layer_idx].max()) + 1
            k, v, rot = k[:, :, :live], v[:, :, :live], rot[:, :live]
        if self.policy.positions == "cache":
            if self.shortcuts:  # eager (CPU): as KVCache, and only when something moves
                slots = torch.arange(k.shape[2], device=self.device)[None]
                want = self.rope - self.length[layer_idx][:, None] + slots  # entry i at query - n + i
                if not torch.equal(want, rot):
                    return rerotate(k, want - rot, self.inv_freq[layer_idx]), v
                return k, v
            rotated = self.rotated[layer_idx]  # begin_step moved the kept keys; the new one needs no move
            rotated.scatter_(2, slot[:, None, :, None].expand(-1, k.shape[1], 1, k.shape[3]), key_states)
            return rotated, v
        return k, v

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer_idx: int,
               scaling: float) -> torch.Tensor:
        """Attention of the step's queries ``(B, heads, 1, d)`` over the live slots (and the new entry)."""
        length = self.length[layer_idx]  # on a CPU, update handed out the live prefix only
        slots = torch.arange(key.shape[2], device=self.device)[None]
        mask = (slots <= length[:, None])[:, None, None, :]  # (B, 1, 1, slots)
        if self.shortcuts and self.batch == 1:
            mask = None  # every slot of the prefix is live
        out, _ = attend(query, key, value, mask, scaling)
        return out

    def end_step(self) -> None:
        """Count the step, let the policy decide for every layer and row, compact the kept slots to the
        front, in order."""
        self.in_step = False
        self.length += 1
        self.seen += 1
        rows, c = self.num_layers * self.batch, self.capacity
        view = StaticView(self.layer_of_row, self.num_layers, self.seen, self.length.view(rows),
                          self.positions.view(rows, c), self.token_ids.view(rows, c), self.state)
        keep = self.policy.static_keep(view)
        if keep is None:
            return
        live = view.live
        keep = keep & live
        if self.shortcuts and bool((keep == live).all()):
            return  # eager on a CPU: asking is cheaper than moving every entry in place
        # A stable partition: slot i moves to (kept before it) if kept, else behind all kept ones.
        kept = keep.sum(dim=1, keepdim=True)
        dest = torch.where(keep, keep.cumsum(dim=1) - 1, kept + (~keep).cumsum(dim=1) - 1)
        for buf in (self.keys, self.values):
            flat = buf.view(rows, buf.shape[2], c, buf.shape[4])
            flat.copy_(torch.empty_like(flat).scatter_(2, dest[:, None, :, None].expand_as(flat), flat))
        for buf in (self.positions, self.token_ids, self.rot):
            flat = buf.view(rows, c)
            flat.copy_(torch.empty_like(flat).scatter_(1, dest, flat))
        self.length.view(rows).copy_(kept[:, 0])

    # -- what a run reports -------------------------------------------------------------------------------
    def entry_bytes(self) -> int:
        """Bytes of keys and values one entry of one layer and row takes."""
        return (self.keys.shape[2] * self.keys.shape[4] + self.values.shape[2] * self.values.shape[4]) \
            * self.keys.element_size()

    def held(self, layer: int, row: int = 0) -> dict[str, torch.Tensor]:
        """The live entries of one layer and row (for tests and pictures): positions, token ids, rot."""
        n = int(self.length[layer, row])
        return {"positions": self.positions[layer][row, :n], "token_ids": self.token_ids[layer][row, :n],
                "rot": self.rot[layer][row, :n]}

    # -- transformers Cache interface -----------------------------------------------------------------
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.steps

    def get_mask_sizes(self, query_length, layer_idx: int = 0) -> tuple[int, int]:
        return self.capacity, 0

    @property
    def is_compileable(self) -> bool:
        return False

    def __len__(self) -> int:
        return self.num_layers

    def __repr__(self) -> str:
        return f"StaticKVCache({self.policy!r}, batch={self.batch}, capacity={self.capacity})"

