"""A policy-driven KV cache with static shapes: the decode step as a fixed sequence of GPU kernels.

:class:`~kvlab.core.KVCache` holds exactly the kept entries: its tensors change shape every step, and the
policy returns indices of data-dependent length. That is simple and exact, but each step then costs
Python, host synchronisation and dozens of small allocations. :class:`StaticKVCache` keeps the *same
entries* in buffers of fixed capacity ``C``::

    keys, values   (L, B, kv_heads, C, d)   entries of layer l, row b ("compact": a prefix, oldest first;
                                            indexed layouts: entry i in physical slot phys[l, b, i])
    phys           (L, B, C)   indexed layouts only: a permutation of the slots per row
    positions      (L, B, C)   original stream position of each entry (entry i at index i, oldest first)
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
                                           # (indexed: physical slot phys[l, b, length[l, b]])
        attend(q, l)                       # the entries < length + 1 (SDPA with a slot mask, or the kernel)
    end_step()                             # length += 1; keep = policy.static_keep(view): (L*B, C) bool,
                                           # every layer and row in one call;
                                           # stable partition (cumsums, one scatter): kept slots move
                                           # to the front, in order (indexed: the metadata and phys only)

Positions follow :mod:`kvlab.core.cache` exactly: with ``"cache"`` the query sits at the largest number of
entries any layer holds and entry ``i`` of a layer holding ``n`` is re-rotated to ``query - n + i``; with
``"insertion"`` the query sits at layer 0's count and cached keys are never moved.

Two layouts (``kernel=``), the same entries and the same arithmetic up to the attention's own rounding:

* ``"compact"`` (the engine until 2026-11): kept entries are moved to the front of every row each step (a stable
  partition of every slot of keys and values) and every slot's key is re-rotated in ``begin_step``; attention is
  SDPA over all ``C`` slots with a slot mask. A step moves ``O(layers x rows x C x d)`` bytes several times over,
  whatever the policy dropped: 43 ms a step at 256 rows of SmolLM2-135M in fp32 on an H200.
* ``"indexed"`` / ``"triton"``: keys and values never move. ``phys (L, B, C)`` says in which physical slot the
  ``i``-th entry (oldest first) of a row lives; the compaction partitions only the small integer metadata
  (``positions``, ``token_ids``, ``rot``, ``phys``: the dropped entries' physical slots go behind the kept ones,
  so ``phys[length]`` is always a free slot, where the next entry is written: ``O(rows)`` bytes of keys and
  values a step). The re-rotation is lazy: attention rotates each live key by its shift as it reads it
  (:mod:`kvlab.core.static_triton`, one kernel per layer that reads only the ``length`` live entries of a
  row, once), or, with ``"indexed"``, torch gathers the row in logical order and rotates it as ``"compact"``
  does (the portable path: bit-identical to ``"compact"``, used on a CPU). ``"auto"``: ``"triton"`` on CUDA,
  ``"indexed"`` elsewhere.

On a CPU the step runs eagerly, so reading a count costs nothing: :meth:`update` hands out only the live
prefix, skips a re-rotation by zero and a compaction that drops nothing (the hooks engine's arithmetic).

The ragged Triton kernel (``kvlab.kernels.decode.ragged_decode_attention``) wants the rows packed back to back
(``cu_seqlens``); here every row owns ``C`` slots of which ``length`` are live, in the order ``phys`` gives, so
the engine has its own kernel (in kvlab.core: the core imports nothing else of kvlab).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache

from kvlab.core.rope import rerotate, rotate_half
from kvlab.core.pattern import attend
from kvlab.core.policy import Policy
from kvlab.core.state import model_state
from kvlab.core.views import StaticView

__all__ = ["KERNELS", "StaticKVCache", "StaticView", "static_support"]

#: The step's layout and attention (see the module docstring).
KERNELS = ("auto", "compact", "indexed", "triton")


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


@torch.compiler.disable
def _triton_attention(*args, **kwargs):
    """The Triton kernel, outside torch.compile's tracing (engine="compiled" compiles the layers around it; the
    kernel times its choices once per shape, host code dynamo need not see)."""
    from kvlab.core.static_triton import static_decode_triton

    return static_decode_triton(*args, **kwargs)


class StaticKVCache(Cache):
    """Fixed-capacity, policy-compacted KV cache for one-token decode steps (see the module docstring).

    ``StaticKVCache(model, policy, batch, capacity)``; ``capacity`` must be at least ``policy.budget + 1``
    (the kept entries plus the new one), or at least ``max_steps`` when the streams are known to be that
    short; for an unbounded policy (``Full``) it bounds the steps (the decoder checks them on the host).
    ``kernel``: ``"auto"`` (``"triton"`` on CUDA, ``"indexed"`` elsewhere), ``"compact"`` (every slot moved and
    re-rotated each step, SDPA with a slot mask: the engine before the indexed layout), ``"indexed"`` (entries
    stay in their slot; torch gathers and rotates them), ``"triton"`` (entries stay; one Triton kernel per layer
    reads the live ones and rotates them as it reads). :meth:`prepare` creates the buffers.
    """

    def __init__(self, model: torch.nn.Module, policy: Policy, batch: int, capacity: int, *,
                 max_steps: int | None = None, kernel: str = "auto"):
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
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        super().__init__(layers=[])
        self.kernel_choice = kernel
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
        self.kernel = self.kernel_choice
        if self.kernel == "auto":
            self.kernel = "triton" if dev.type == "cuda" else "indexed"
        self.indexed = self.kernel != "compact"
        if self.kernel == "triton":
            from kvlab.core.static_triton import check_static_triton

            check_static_triton(k, d)
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
        # indexed layouts: the physical slot of the i-th entry of a row (a permutation of 0..C-1 per row)
        self.phys = torch.arange(c, device=dev).expand(L, b, c).clone() if self.indexed else None
        # "triton" also keeps the inverse (the logical index of each physical slot's entry) and each slot's rotation,
        # so that the kernel may walk the slots in memory order (its PHYS_ORDER configs)
        triton = self.kernel == "triton"
        self.inv = torch.arange(c, device=dev).expand(L, b, c).clone() if triton else None
        self.rot_phys = torch.zeros((L, b, c), **long) if triton else None
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
            self._base_of = [first[id(f)] for f in self.inv_freq]  # host ints: the Triton kernel's argument
            self._base = torch.tensor(self._base_of, **long)[:, None, None]  # (L, 1, 1)
            # "compact": the keys as attention reads them this step, every layer re-rotated at once in begin_step
            # (a few kernels per step, not per layer); update() writes the new key into both buffers.
            self.rotated = None if self.indexed else torch.zeros_like(self.keys)
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
            for index in (self.phys, self.inv):
                if index is not None:
                    index.copy_(torch.arange(self.capacity, device=self.device).expand_as(index))

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
        if self.kernel == "triton":  # the new entry's physical slot in every layer, and its rotation there
            self._slot_phys = self.phys.gather(2, slot)  # (L, B, 1)
            if mode == "cache":
                self.rot_phys.scatter_(2, self._slot_phys, self.rope[None].expand(shape))
        if mode == "cache" and not self.shortcuts and not self.indexed:
            # entry i of a layer holding n goes to query - n + i (the new one, i = n, to the query: no move)
            slots = torch.arange(self.capacity, device=self.device)
            want = self.rope[None] - slot + slots  # (L, B, C)
            index = (want - self.rot).clamp(-2 * self.capacity, 2 * self.capacity) + self._base
            cos, sin = self._cos[index][:, :, None], self._sin[index][:, :, None]  # (L, B, 1, C, d)
            torch.add(self.keys * cos, rotate_half(self.keys) * sin, out=self.rotated)
        self.in_step = True
        return self.rope

    def _shift_index(self, layer_idx: int, rot: torch.Tensor) -> torch.Tensor:
        """``(B, C)`` rows of the cos/sin table that move entry ``i`` of each row from ``rot`` to ``query - n + i``."""
        slots = torch.arange(rot.shape[1], device=self.device)[None]
        want = self.rope - self.length[layer_idx][:, None] + slots
        c = self.capacity
        return (want - rot).clamp(-2 * c, 2 * c) + self._base_of[layer_idx]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write the new entry at (logical) slot ``length[b]`` of every row; returns the keys and values attention
        reads: ``"compact"``, the full buffers (keys re-rotated behind the query when ``positions == "cache"``);
        ``"indexed"``, the rows gathered in logical order (and rotated); ``"triton"``, the raw buffers (the
        kernel reads them through ``phys``)."""
        if not self.in_step:
            raise RuntimeError("StaticKVCache.update outside a step: drive it with kvlab.eval.fast.FastDecoder")
        if key_states.shape[2] != 1:
            raise ValueError(f"StaticKVCache decodes one token per step, got {key_states.shape[2]}")
        slot = self.length[layer_idx][:, None]  # (B, 1)
        k, v = self.keys[layer_idx], self.values[layer_idx]
        if self.kernel == "triton":
            where = self._slot_phys[layer_idx]  # begin_step looked it up for every layer at once
        else:
            where = slot if not self.indexed else self.phys[layer_idx].gather(1, slot)  # physical slot of the entry
        k.scatter_(2, where[:, None, :, None].expand(-1, k.shape[1], 1, k.shape[3]), key_states)
        v.scatter_(2, where[:, None, :, None].expand(-1, v.shape[1], 1, v.shape[3]), value_states)
        if self.kernel == "triton":
            return k, v
        rot = self.rot[layer_idx]
        live = k.shape[2]
        if self.shortcuts:  # eager: hand out the live prefix only (reading the count costs nothing)
            live = int(self.length[layer_idx].max()) + 1
            rot = rot[:, :live]
        if self.indexed:  # the rows in logical order (slots >= length + 1 are garbage, as in "compact")
            order = self.phys[layer_idx][:, None, :live, None]
            k = k.gather(2, order.expand(-1, k.shape[1], -1, k.shape[3]))
            v = v.gather(2, order.expand(-1, v.shape[1], -1, v.shape[3]))
        else:
            k, v = k[:, :, :live], v[:, :, :live]
        if self.policy.positions == "cache":
            if self.shortcuts:  # eager (CPU): as KVCache, and only when something moves
                slots = torch.arange(live, device=self.device)[None]
                want = self.rope - self.length[layer_idx][:, None] + slots  # entry i at query - n + i
                if not torch.equal(want, rot):
                    return rerotate(k, want - rot, self.inv_freq[layer_idx]), v
                return k, v
            if self.indexed:  # begin_step's arithmetic, for this layer (same table, same bits)
                index = self._shift_index(layer_idx, rot)
                cos, sin = self._cos[index][:, None], self._sin[index][:, None]  # (B, 1, C, d)
                return k * cos + rotate_half(k) * sin, v
            rotated = self.rotated[layer_idx]  # begin_step moved the kept keys; the new one needs no move
            rotated.scatter_(2, slot[:, None, :, None].expand(-1, k.shape[1], 1, k.shape[3]), key_states)
            return rotated, v
        return k, v

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer_idx: int,
               scaling: float) -> torch.Tensor:
        """Attention of the step's queries ``(B, heads, 1, d)`` over the live slots (and the new entry)."""
        length = self.length[layer_idx]  # on a CPU, update handed out the live prefix only
        if self.kernel == "triton":
            cache = self.policy.positions == "cache"
            return _triton_attention(
                query[:, :, 0], key, value, self.phys[layer_idx], length, scaling,
                rot=self.rot[layer_idx] if cache else None, rope=self.rope[:, 0] if cache else None,
                cos=self._cos if cache else None, sin=self._sin if cache else None,
                base=self._base_of[layer_idx] if cache else 0, inv=self.inv[layer_idx],
                rot_phys=self.rot_phys[layer_idx] if cache else None)[:, :, None]
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
        if not self.indexed:  # "compact": every slot of keys and values moves
            for buf in (self.keys, self.values):
                flat = buf.view(rows, buf.shape[2], c, buf.shape[4])
                flat.copy_(torch.empty_like(flat).scatter_(2, dest[:, None, :, None].expand_as(flat), flat))
        # indexed: only the metadata moves; phys stays a permutation (dropped slots behind the kept ones: free)
        for buf in (self.positions, self.token_ids, self.rot) + ((self.phys,) if self.indexed else ()):
            flat = buf.view(rows, c)
            flat.copy_(torch.empty_like(flat).scatter_(1, dest, flat))
        self.length.view(rows).copy_(kept[:, 0])
        if self.inv is not None:  # inverse of the new order: slot phys[i] holds entry i
            phys = self.phys.view(rows, c)
            self.inv.view(rows, c).scatter_(1, phys, torch.arange(c, device=self.device).expand(rows, c))

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
        return (f"StaticKVCache({self.policy!r}, batch={self.batch}, capacity={self.capacity}, "
                f"kernel={getattr(self, 'kernel', self.kernel_choice)!r})")

