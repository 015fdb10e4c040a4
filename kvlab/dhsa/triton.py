"""DHSA prefill attention in Triton: variable-length chunks, per-query-chunk ranked key lists,
online softmax, causal. Forward pass.

Paper: Xiong et al., "Long-Context Modeling with Dynamic Hierarchical Sparse Attention for On-Device
LLMs" (arXiv:2510.24606), Sec. 2.1 and App. A (prefill). Specification:
:func:`kvlab.dhsa.reference.dhsa_attention_reference` with ``keep_diagonal=True``. The authors run
their mask through a block-sparse FlashAttention (their ``Block-Sparse-Attention`` fork) and, in
the legacy code, an SDPA call per query block over gathered keys; this kernel is ours.

What is computed
----------------
Query ``i`` of chunk ``c = [b_c, b_{c+1})`` keeps (see :class:`kvlab.dhsa.reference.ChunkPlan`)::

    initial keys   [0, min(initial, i + 1))
    diagonal       [max(b_c, initial), i]
    ranked list    tok[c, 0 : room_i]        room_i = budget - |initial U diagonal|

``tok[c]`` lists the candidate tokens of the earlier chunks in decreasing chunk score (Eq. 4
representations, ``S = Q_C K_C^T``), built once per call in PyTorch by
:func:`kvlab.dhsa.reference.chunk_plan`. The selection is per query *row* (TopK of each row under
the budget), but all rows of a chunk share the ranked list: a row only takes a longer or shorter
prefix of it (its diagonal grows by one key per row, so its room shrinks by one). So a query tile
made of rows of one chunk loads each listed key and value once for all its rows.

How: one program per (query tile, batch x head)
-----------------------------------------------
A query tile holds up to ``BLOCK_M`` rows of *one* chunk (a chunk longer than ``BLOCK_M`` has
several tiles; a short one leaves rows idle). Its loops over key tiles feed one online softmax
(FlashAttention's running max ``m``, sum ``l``, rescaled accumulator; base 2, ``exp2``). Three
variants, chosen with ``variant=`` (``"packed"`` is what :func:`kvlab.dhsa.dhsa_attention` runs: the
fastest in every setting measured on an H200, 2026-11-25):

``"ranges"`` (the first kernel): three loops, every tile masked --

1. the initial keys, contiguous, causal mask;
2. the diagonal range, contiguous, causal mask;
3. the ranked list, ``BLOCK_N`` gathered keys at a time, mask ``slot < room_i``.

``"lists"``: the initial keys are folded into the list. For a chunk starting after the initial
keys, ``[0, initial)`` is visible to every row, so the list becomes ``[0 .. initial) ++ tok[c]``
and row ``i`` takes its first ``take_i = budget - (i + 1 - b_c)`` entries (``initial + room_i``);
a chunk starting at or before ``initial`` keeps exactly ``[0, i]`` (no list, one causal range).
Then

1. the *bulk* of the list, the slots every row of the tile takes (``< take`` of its last row):
   no mask at all, gathered tiles of ``BLOCK_N`` keys (most of the work: ~``budget - BLOCK_M``);
2. the *tail*, slots only the first rows take (at most ``BLOCK_M - 1`` + one tile): mask
   ``slot < take_i``;
3. the diagonal ``[d_0, r1)`` (``d_0 = b_c``, or 0 without a list), contiguous, causal mask.

and the tiles are launched in decreasing order of work (the last chunks of a long sequence have
the longest lists when the budget exceeds what early chunks can use), so the machine does not
end on a few long programs.

``"packed"`` (issue 24): the loops of ``"lists"`` over fewer, fuller programs --

* a program's ``BLOCK_M = ROWS x PACK`` rows are positions ``r0 + m % ROWS`` of the query heads
  ``h0 + m // ROWS``: with one selection for all heads (``share_heads=True``, as the authors' code
  averages heads) the ``PACK`` query heads of one key/value head (GQA) share the list and every
  key load, so the key/value bytes drop by ``PACK``;
* tiles are never shorter than 64 rows on a GPU (Hopper's warpgroup MMA is 64 rows tall; the
  ``"lists"`` default took 16/32-row tiles for short predicted chunks, on the older MMA), and chunks
  longer than ``ROWS`` go to a second launch of ``LONG_ROWS``-row tiles, so a chunk loads its list
  once, not once per 64 rows;
* ``RUNS``: where every ``BLOCK_N``-slot tile of every list is one run of consecutive positions
  (fixed chunks aligned to the tiles; :func:`lists_are_runs`), one index locates a key tile and
  one TMA copy (``RUNS=2``, Hopper's bulk tensor copy through a descriptor) or a block of pointer
  loads (``RUNS=1``) replaces the 64-row gather; ``"auto"`` picks TMA where it applies;
* ``LAZY`` (an option): the unmasked bulk loop keeps a stale running max and rescales the
  accumulator only when some row's max grows by more than ``2^8``.

Work and what bounds it. Each row computes ``budget`` scores plus the idle rows of short chunks
and the tails of the last key tile of each loop. Every listed key is loaded once per query tile,
so the key/value bytes a head reads are ``n / BLOCK_M x budget x 2 x dim x 2 B``: at N = 32k,
64-token chunks, budget 2048, dim 128 that is 16 GiB over 32 heads, which the L2 cache must
deliver (the gathers touch the whole 16 MiB K/V of a head, so there is little reuse in L1). A
chunk of ``BLOCK_M`` rows is the most rows that share one list, so chunks of 64 tokens fix this
traffic; longer chunks, or GQA heads sharing a selection (``"packed"``), lower it.
``python -m kvlab bench dhsa ops`` reports it (``kv_gib``) beside the time, the share of live rows
in the tiles (``row_use``) and, with ``--diagnose``, the ``"packed"`` kernel's loads alone
(``LOADS_ONLY``) and its arithmetic alone (every list pointed at one hot key tile).

Backward: not needed, so not written. The boundary predictor trains on labels computed from the
model's *dense* attention (Eq. 5-8, :mod:`kvlab.dhsa.training`): its loss (Eq. 9) reaches the
predictor through the key features only, and the keys are recorded under ``torch.no_grad()``; no
gradient flows through sparse attention. DHSA itself is a plug-in at inference ("without
retraining the base model", Sec. 1). Training a model through DHSA attention would need one; the
``"torch"`` and ``"flex"`` backends are differentiable (a test runs ``gradcheck`` on the
reference), and ``backend="triton"`` refuses tensors that require grad.

Tests: ``tests/test_dhsa.py`` and ``tests/test_dhsa_kernel.py`` (``"packed"``: variable chunks, local
and initial keys, GQA packing, ragged ends, both launches, TMA runs, lazy rescaling) against the
float64 reference (CPU with ``TRITON_INTERPRET=1``, small shapes; compiled on a GPU, also at the
production tile sizes). Benchmark: ``python -m kvlab bench dhsa ops`` (variants side by side) and
``tune`` (tile sweep).

Measured, variant ``"ranges"`` (``python -m kvlab bench dhsa ops``, H100 80GB, torch 2.11, triton
3.6; bf16, 32 heads, dim 128, budget 2048, 64 initial): at N = 32k it takes 5.1 ms (64-token
chunks) and 6.1-6.3 ms (chunk lengths in [16, 128]) against 14.3 ms for dense causal SDPA
(2.3-2.8x) and 64-95 ms for FlexAttention on the same kept set (12-15x; Flex evaluates
``mask_mod`` in every touched tile); building the plan costs another 2.1-2.6 ms with one selection
for all heads, 6.7-7.4 ms per head. The kept density is 0.121, so the limit is about 8x: the
kernel reaches ~230 TFLOP/s of kept work where SDPA reaches ~610, with 64-row query tiles and
gathered keys. At N <= 8k it is slower than SDPA. Variant ``"lists"`` (same run as a second
measurement of ``"ranges"``, which took 3.9 ms there after the launch tables stopped being copied):
3.6 ms at 32k with 64-token chunks (3.96x SDPA, 17.8x Flex) and 4.8 ms with chunks of 16-128 tokens
(2.9x), loading keys and values at 4.8-4.9 TB/s from L2 -- the traffic bound above (16 GiB at
~5 TB/s is ~3.4 ms), so the >= 6x target needs less traffic (longer chunks, GQA-shared selection),
not a faster loop.

Measured, variant ``"packed"`` (H200, torch 2.11, triton 3.6, 2026-11-25, same settings,
``benchmarks/results/dhsa/dhsa_ops_h200_2026_11_25.*``): 2.87 ms at 32k with 64-token chunks (TMA key
tiles; 5.13x SDPA's 14.71 ms; ``"lists"`` 3.37 ms = 4.37x in the same run) and 5.26 ms with
predictor-like chunks (2.80x; ``"lists"`` 10.32 ms). The diagnosis above no longer holds for it: its
arithmetic alone (every list pointed at one hot key tile) takes 2.80 ms and its gathered loads alone
3.20 ms, so with TMA copies it is bound by its own arithmetic and issue (64-row tiles of one
warpgroup, the softmax between the two MMAs: 372 TFLOP/s of kept work where SDPA reaches 598), and
6x (434 TFLOP/s) would need a better-overlapped loop (FlashAttention-3's ping-pong of two
warpgroups), which Triton 3.6 does not express here (its warp specialisation fails on this kernel
for Hopper). ``LAZY`` measured slower (2.99-3.06 ms), so it stays off.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kvlab.kernels.triton_utils import dot, gathered_tile, interpreting, online_softmax_step

from .reference import ChunkPlan, chunk_plan, represent_sums

__all__ = ["dhsa_attention_triton", "launch_tables", "launch_tables_fast", "chunk_plan_fast", "host_plan",
           "LaunchTables", "query_tiles", "default_config", "VARIANTS",
           "kv_bytes", "mma_rows", "lists_are_runs"]

VARIANTS = ("ranges", "lists", "packed")


def default_config(plan: ChunkPlan, dtype: torch.dtype, variant: str = "lists", *, head_dim: int = 128,
                   group: int = 1) -> dict:
    """Tile sizes: query tiles about the typical chunk length (idle rows cost work).

    ``"ranges"``: chosen by ``python -m kvlab bench dhsa tune --seq 32768`` on an H100 (bf16, 32
    heads, dim 128, budget 2048): BLOCK_M 64, BLOCK_N 32, 4 warps, 2 stages was fastest for 64-token
    chunks (4.60 ms; BLOCK_N 64: 4.78 ms; 8 warps: >= 8.3 ms; BLOCK_M 128: >= 8.4 ms) and within 2%
    of the best for chunk lengths drawn in [16, 128]. ``"lists"``: the same query tiles, 64-key
    gathered tiles, 4 warps, 3 stages (3.56 ms at 32k, 64-token chunks; 2 stages 3.64, 32-key tiles
    3.66, 8 warps >= 4.36, BLOCK_M 128 >= 6.33: ``bench dhsa tune --variant lists``).

    ``"packed"`` (``head_dim`` and the GQA ``group`` = heads / kv_heads matter): never fewer than 64
    rows per program on a GPU (Hopper's warpgroup MMA is 64 rows tall; 16/32-row tiles fall back to
    the older MMA), ``PACK`` query heads of one key/value head per program when the selection is
    shared (``ROWS`` positions x ``PACK`` heads = ``BLOCK_M`` rows, one key load for all), and, without
    packing, a second launch of ``LONG_ROWS``-row tiles for chunks longer than ``ROWS`` (one list
    load per chunk instead of one per 64 rows); ``RUNS="auto"``: TMA copies of whole key tiles where
    the chunks are aligned to them. Measured on an H200 (``bench dhsa tune``, 2026-11-25, 32k, budget
    2048): 32 x 128 heads, fixed 64-token chunks, 64 x 64 tiles, 4 warps, 3 stages: TMA 2.93 ms,
    contiguous pointer loads 3.21, gathers 3.45 (2 stages: 3.21 / 3.27 / 3.66); Gemma2-2b's layer (8 / 4
    heads, dim 256, shared selection, predictor-like chunks): PACK 2 x 64 rows, 64-key tiles, 8 warps,
    2 stages 2.05 ms; 32-key tiles 2.94; 2 x 32 rows + a 2 x 64-row long launch 2.53-2.73; no packing
    with a 128-row long launch 3.07. Round 2 (TMA, fixed chunks): 64-key tiles 2.91 ms, ``LAZY`` 3.06,
    32-key tiles 3.11 (3 stages) / 3.35 (2), 8 warps 6.06.
    """
    if variant == "packed":
        return _packed_config(plan, head_dim, group)
    if interpreting():
        return dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
    lengths = torch.cat([e - s for s, e in zip(plan.starts, plan.ends)]).float()
    typical = float(lengths.median())
    block_m = 16 if typical <= 24 else 32 if typical <= 48 else 64
    if variant == "lists":
        return dict(BLOCK_M=block_m, BLOCK_N=64, num_warps=4, num_stages=3)
    return dict(BLOCK_M=block_m, BLOCK_N=32, num_warps=4, num_stages=2)


def _packed_config(plan: ChunkPlan, head_dim: int, group: int) -> dict:
    shared = plan.tokens[0].shape[0] == 1
    pack = 1
    while shared and pack * 2 <= min(group, 4) and group % (pack * 2) == 0:
        pack *= 2
    if interpreting():
        return dict(ROWS=16 // pack, PACK=pack, BLOCK_M=16, BLOCK_N=16, num_warps=4,
                    num_stages=1, LONG_ROWS=32 if pack == 1 else 0, LONG_WARPS=4, RUNS="auto")
    rows = 64 if pack == 1 else 128 // pack
    longest = max(int((e - s).max()) for s, e in zip(plan.starts, plan.ends))
    long_rows = 128 if pack == 1 and longest > rows else 0
    big = head_dim > 128  # 256: 64-key tiles fit beside 128-row tiles only with 2 stages (196 KB)
    block_n = 32 if big and pack == 1 else 64
    return dict(ROWS=rows, PACK=pack, BLOCK_M=rows * pack, BLOCK_N=block_n, num_warps=4 * (rows * pack // 64),
                num_stages=2 if big else 3, LONG_ROWS=long_rows, LONG_WARPS=8, RUNS="auto")


def query_tiles(plan: ChunkPlan, block_m: int, lengths: tuple[int, int] | None = None) -> torch.Tensor:
    """``(batch, tiles, 4)`` int32 rows ``(chunk, chunk start, first row, end row)``: every chunk cut
    into tiles of at most ``block_m`` rows; sequences with fewer tiles are padded with empty tiles
    (first row = end row = 0). ``lengths=(lo, hi)``: only the chunks of ``lo < length <= hi`` rows."""
    per = []
    for st, en in zip(plan.starts, plan.ends):
        lengths_c = en - st
        n_t = (lengths_c + block_m - 1) // block_m  # tiles of each chunk
        if lengths is not None:
            n_t = torch.where((lengths_c > lengths[0]) & (lengths_c <= lengths[1]), n_t, 0)
        c = torch.repeat_interleave(torch.arange(st.numel(), device=st.device), n_t)
        first_tile = torch.cumsum(n_t, 0) - n_t
        j = torch.arange(c.numel(), device=st.device) - first_tile[c]  # tile index within its chunk
        r0 = st[c] + j * block_m
        r1 = torch.minimum(r0 + block_m, en[c])
        per.append(torch.stack([c, st[c], r0, r1], dim=1))
    return _pad_stack(per, 4)


def _pad_stack(per: list[torch.Tensor], width: int) -> torch.Tensor:
    t_max = max(1, max(p.shape[0] for p in per))
    out = torch.zeros(len(per), t_max, width, dtype=torch.int32, device=per[0].device)
    for b, p in enumerate(per):
        out[b, : p.shape[0]] = p.to(torch.int32)
    return out


# ---------------------------------------------------------------------------------------------
# Launch tables: what the kernels read besides q, k, v (built once per plan, reusable)
# ---------------------------------------------------------------------------------------------
class LaunchTables(NamedTuple):
    """Inputs of one call besides ``q, k, v``: ``tiles`` ``(batch, T, 4)`` int32 query tiles,
    ``tok`` ``(batch, heads | 1, C, L)`` int32 ranked lists, ``ntok`` ``(batch, heads | 1, C)`` int32
    list lengths (``"lists"``/``"packed"``: of ``[0 .. initial) ++ tok``, 0 for chunks without a list),
    the variant, its config, and the plan's budget and initial count. ``launches`` holds one
    ``(tiles, config)`` per kernel launch (``"packed"``: a second one with taller tiles for long
    chunks); ``tiles`` / ``config`` are the first."""
    tiles: torch.Tensor
    tok: torch.Tensor
    ntok: torch.Tensor
    variant: str
    config: dict
    budget: int
    initial: int
    launches: tuple = ()


def launch_tables(plan: ChunkPlan, variant: str = "lists", config: dict | None = None,
                  dtype: torch.dtype = torch.bfloat16, *, head_dim: int = 128, group: int = 1) -> LaunchTables:
    """Query tiles and list tensors of ``plan`` for one variant (:class:`LaunchTables`).

    ``"ranges"``: tiles ``(chunk, chunk start, r0, r1)`` in sequence order. ``"lists"``: tiles
    ``(chunk, d_0, r0, r1)`` with ``d_0`` the first key of the causal diagonal range (the chunk
    start, or 0 for a chunk starting at or before ``initial``), in decreasing order of the keys
    the tile visits (list prefix of its first row + diagonal). ``"packed"``: the same tiles, of at
    most ``ROWS`` rows, and (``LONG_ROWS > 0``) chunks longer than ``ROWS`` in tiles of ``LONG_ROWS``
    rows, launched apart; ``head_dim`` and ``group`` (query heads per key/value head) pick its
    default config. The readable version, on the plan's device (each data-dependent size is a host
    synchronisation there); :func:`launch_tables_fast` builds the same tables from the host copy of the plan.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    cfg = default_config(plan, dtype, variant, head_dim=head_dim, group=group) if config is None else dict(config)
    tok, ntok = _batched_lists(plan)
    return _tables(plan, plan, tok, ntok, ntok, variant, cfg, lambda x: x, None)


def _batched_lists(plan: ChunkPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """``(batch, heads | 1, C, L)`` lists and ``(batch, heads | 1, C)`` counts of the plan's sequences."""
    bsz = len(plan.starts)
    if bsz == 1:  # no copy: the plan's tensors as they are (padding slots are never read)
        return plan.tokens[0][None], plan.n_tokens[0][None]
    c_max = max(t.shape[1] for t in plan.tokens)  # one padded tensor for the batch
    l_max = max(t.shape[2] for t in plan.tokens)
    hs = plan.tokens[0].shape[0]
    dev = plan.tokens[0].device
    tok = torch.zeros(bsz, hs, c_max, l_max, dtype=torch.int32, device=dev)
    ntok = torch.zeros(bsz, hs, c_max, dtype=torch.int32, device=dev)
    for b, (t, c) in enumerate(zip(plan.tokens, plan.n_tokens)):
        tok[b, :, : t.shape[1], : t.shape[2]] = t
        ntok[b, :, : c.shape[1]] = c
    return tok, ntok


def _tables(plan, tplan, tok, ntok, tntok, variant, cfg, move, local) -> LaunchTables:
    # The tiles come from ``tplan`` / ``tntok`` (the plan itself, or its host copy) and reach the kernel's
    # device through ``move``; the lists ``tok`` / ``ntok`` are on the device. ``local``: the plan's local
    # keys when known (the host copy knows them), for the run check without the lists.
    if variant == "packed":
        return _packed_tables(plan, tplan, tok, tntok, cfg, move, local)
    tiles = query_tiles(tplan, cfg["BLOCK_M"])
    if variant == "lists":
        tiles, tntok = _list_tiles(tplan, tiles, tntok)
        ntok = move(tntok)
    tiles, tok, ntok = move(tiles).contiguous(), tok.contiguous(), ntok.contiguous()
    return LaunchTables(tiles, tok, ntok, variant, cfg, plan.budget, plan.initial, ((tiles, cfg),))


def _packed_tables(plan, tplan, tok, tntok, cfg, move, local) -> LaunchTables:
    cfg = _check_packed_config(cfg, tok.shape[1])
    rows, long_rows = cfg["ROWS"], cfg.get("LONG_ROWS", 0)
    if long_rows:
        short = query_tiles(tplan, rows, (0, rows))
        long_ = query_tiles(tplan, long_rows, (rows, tplan.n))
        cfg_long = dict(cfg, ROWS=long_rows, BLOCK_M=long_rows * cfg["PACK"],
                        num_warps=cfg.get("LONG_WARPS", cfg["num_warps"]))
        parts = [(short, cfg), (long_, cfg_long)]
    else:
        parts = [(query_tiles(tplan, rows), cfg)]
    launches, lens = [], None
    for tiles_p, cfg_p in parts:
        if not bool((tiles_p[..., 3] > tiles_p[..., 2]).any()):
            continue
        tiles_p, lens = _list_tiles(tplan, tiles_p, tntok)
        launches.append((tiles_p, cfg_p))
    if not launches:  # cannot happen for a sequence of >= 1 token; keep the tables well formed
        tiles_p, lens = _list_tiles(tplan, parts[0][0], tntok)
        launches.append((tiles_p, parts[0][1]))
    launches = [(move(t).contiguous(), c) for t, c in launches]
    lens_dev = move(lens).contiguous()
    if cfg.get("RUNS", 0) == "auto":
        runs = _auto_runs(tplan, tok, lens_dev, cfg["BLOCK_N"], local)
        cfg = dict(cfg, RUNS=runs)
        launches = [(t, dict(c, RUNS=runs)) for t, c in launches]
    if int(cfg.get("RUNS", 0)) and not (_aligned_runs(tplan, cfg["BLOCK_N"], local)
                                        or lists_are_runs(tok, lens_dev, plan.initial, cfg["BLOCK_N"])):
        raise ValueError(f"config RUNS={cfg['RUNS']} loads each {cfg['BLOCK_N']}-slot tile of a list as one "
                         "contiguous run, but some tile of these lists is not (chunks must be fixed, with "
                         "BLOCK_N dividing the chunk size, initial and local); use RUNS=0 (gathered loads)")
    return LaunchTables(launches[0][0], tok.contiguous(), lens_dev, "packed", launches[0][1],
                        plan.budget, plan.initial, tuple(launches))


def lists_are_runs(tok: torch.Tensor, n_list: torch.Tensor, initial: int, block_n: int) -> bool:
    """True when every ``block_n``-slot tile of every list ``[0 .. initial) ++ tok`` (its first ``n_list``
    slots) holds consecutive positions: then one index locates a whole key tile (config ``RUNS``)."""
    b, hs, c, length = tok.shape
    first = torch.arange(initial, device=tok.device, dtype=tok.dtype).expand(b, hs, c, initial)
    lst = torch.cat([first, tok], -1).long()
    slot = torch.arange(1, lst.shape[-1], device=tok.device)
    inner = (slot % block_n != 0) & (slot[None, None, None, :] < n_list[..., None].long())
    step = lst[..., 1:] - lst[..., :-1]
    return bool(((step == 1) | ~inner).all())


def _auto_runs(plan: ChunkPlan, tok: torch.Tensor, lens: torch.Tensor, block_n: int, local: int | None = None) -> int:
    """``RUNS="auto"``: TMA copies (2) where every list tile is one run and the GPU has the copy engine
    (Hopper or later; the interpreter emulates it), else gathered loads (0). Chunks whose starts are not
    multiples of ``block_n`` never give runs, so the exact check runs only for aligned chunkings (and not at
    all where :func:`_aligned_runs` proves it from the chunk offsets)."""
    if plan.initial % block_n or any(bool((st % block_n).any()) for st in plan.starts):
        return 0
    if not interpreting() and not (tok.is_cuda and torch.cuda.get_device_capability(tok.device)[0] >= 9):
        return 0
    if _aligned_runs(plan, block_n, local):
        return 2
    return 2 if lists_are_runs(tok, lens, plan.initial, block_n) else 0


def _aligned_runs(plan: ChunkPlan, block_n: int, local: int | None) -> bool:
    """True when the chunk offsets alone prove :func:`lists_are_runs`: a list is ``[0, initial)``, the local
    range ``[ls_c, b_c)`` and whole candidate ranges ``[max(b_c', initial), min(b_c'+1, ls_c))``; with
    ``initial``, every ``b_c`` and every ``b_c - ls_c`` multiples of ``block_n`` each piece starts at a slot and a
    position that are multiples of ``block_n`` and has a multiple of ``block_n`` tokens, so every tile is one run.
    Needs ``local`` (None: unknown, False)."""
    from .reference import local_starts

    if local is None or plan.initial % block_n:
        return False
    for st, en in zip(plan.starts, plan.ends):
        bd = torch.cat([st, en[-1:]])
        if bool((st % block_n).any()) or bool(((st - local_starts(bd, local, plan.initial)) % block_n).any()):
            return False
    return True


def _check_packed_config(cfg: dict, selection_heads: int) -> dict:
    for key in ("ROWS", "PACK", "BLOCK_N", "num_warps", "num_stages"):
        if key not in cfg:
            raise ValueError(f"config for variant 'packed' must have {key!r} (see default_config), got {cfg}")
    pack = cfg["PACK"]
    if pack > 1 and selection_heads != 1:
        raise ValueError(f"config PACK={pack} packs query heads that share one key list: it needs a shared "
                         "selection (share_heads=True); use PACK=1")
    cfg = dict(cfg)
    cfg.setdefault("BLOCK_M", cfg["ROWS"] * pack)
    if cfg["BLOCK_M"] != cfg["ROWS"] * pack:
        raise ValueError(f"config BLOCK_M ({cfg['BLOCK_M']}) must be ROWS x PACK ({cfg['ROWS']} x {pack})")
    return cfg


def _list_tiles(plan: ChunkPlan, tiles: torch.Tensor, ntok: torch.Tensor):
    # Fold the initial keys into the lists, set d_0, and order tiles by decreasing work.
    initial, budget = plan.initial, plan.budget
    out, lens = [], torch.zeros_like(ntok)
    for b, st in enumerate(plan.starts):
        has_list = st > initial  # (C,): the chunk sees all initial keys and may have ranked ones
        lens[b, :, : st.numel()] = torch.where(has_list, ntok[b, :, : st.numel()] + initial, 0)
        t = tiles[b].long()
        c, r0, r1 = t[:, 0], t[:, 2], t[:, 3]
        d0 = torch.where(has_list[c], st[c], 0)
        take_first = (budget - (r0 + 1 - d0)).clamp(min=0)
        work = torch.minimum(lens[b, :, c].float().mean(0), take_first.float()) + (r1 - d0)
        work = torch.where(r1 > r0, work, -1.0)  # padding tiles last
        order = torch.sort(work, descending=True, stable=True).indices
        out.append(torch.stack([c, d0, r0, r1], dim=1)[order])
    return _pad_stack(out, 4), lens


def kv_bytes(tables: LaunchTables, plan: ChunkPlan, heads: int, head_dim: int, elt_bytes: int = 2) -> int:
    """Key + value bytes the kernel loads (every key tile it visits, whole tiles), for all heads:
    what the L2 cache must deliver. An estimate from the tables, with the head-averaged list length
    (``"packed"``: one load serves the ``PACK`` heads of a program)."""
    total = 0
    for tiles, cfg in (tables.launches or ((tables.tiles, tables.config),)):
        bn = cfg["BLOCK_N"]
        t = tiles.long()
        c, x, r0, r1 = t[..., 0], t[..., 1], t[..., 2], t[..., 3]
        live = r1 > r0
        lens = tables.ntok.float().mean(1)  # (batch, C)
        if tables.variant in ("lists", "packed"):
            take = torch.minimum(torch.gather(lens, 1, c), (plan.budget - (r0 + 1 - x)).float())
            keys = torch.ceil(take / bn) * bn + torch.ceil((r1 - x) / bn) * bn
        else:
            init = min(plan.initial, plan.n)
            room = (plan.budget - (r0 + 1 - (x - init).clamp(min=0))).float()
            keys = (torch.ceil(torch.minimum(torch.gather(lens, 1, c), room) / bn) * bn
                    + math.ceil(init / bn) * bn + torch.ceil((r1 - x.clamp(min=init)).clamp(min=0) / bn) * bn)
        programs_per_tile = heads // cfg.get("PACK", 1)
        total += int((keys * live).sum()) * programs_per_tile * 2 * head_dim * elt_bytes
    return total


def mma_rows(tables: LaunchTables, heads: int) -> tuple[int, int]:
    """``(rows computed, rows live)`` over all programs: the rows the tiles' MMAs run (``BLOCK_M`` per
    program) and the query rows they hold (the rest are idle rows of short chunks)."""
    comp = live = 0
    for tiles, cfg in (tables.launches or ((tables.tiles, tables.config),)):
        t = tiles.long()
        n_rows = (t[..., 3] - t[..., 2])
        progs = int((n_rows > 0).sum()) * (heads // cfg.get("PACK", 1))
        comp += progs * cfg["BLOCK_M"]
        live += int(n_rows.sum()) * heads
    return comp, live


# ---------------------------------------------------------------------------------------------
# Shared pieces of both kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def _tile_setup(K, V, TILES, T_MAX, stride_kb, stride_kh, stride_vb, stride_vh, H: tl.constexpr,
                GROUP: tl.constexpr, SHARED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    # Which tile this program owns: (chunk, x, rows [r0, r1)) with x the chunk start ("ranges") or d_0
    # ("lists"); its batch row and head, the key/value head it reads (GQA), the head of its selection.
    pid_t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP
    hs = 0 if SHARED else h
    tile = TILES + (b * T_MAX + pid_t) * 4
    c = tl.load(tile)
    x = tl.load(tile + 1)
    r0 = tl.load(tile + 2)
    r1 = tl.load(tile + 3)
    offs_m = r0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    Kbh = K + b * stride_kb + hk * stride_kh
    Vbh = V + b * stride_vb + hk * stride_vh
    return b, h, hs, c, x, r0, r1, offs_m, offs_d, Kbh, Vbh


@triton.jit
def _load_rows(Q, b, h, offs_m, r1, offs_d, stride_qb, stride_qh, stride_qn):
    return tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :],
                   mask=(offs_m < r1)[:, None], other=0.0)


@triton.jit
def _store_rows(O, acc, l_i, b, h, offs_m, r1, offs_d, stride_ob, stride_oh, stride_on):
    # every row kept at least itself (idle rows see the diagonal too), so l_i > 0
    acc = acc / l_i[:, None]
    tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :],
             acc.to(O.dtype.element_ty), mask=(offs_m < r1)[:, None])


@triton.jit
def _causal_range(q, Kbh, Vbh, lo, hi, offs_m, offs_d, stride_kn, stride_vn, qk_scale, m_i, l_i, acc,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FP32_DOT: tl.constexpr):
    # Keys [lo, hi), each seen by the queries at or after it (causal), folded into the running softmax.
    for start in range(lo, hi, BLOCK_N):
        kpos = start + tl.arange(0, BLOCK_N)
        live = kpos < hi
        k = tl.load(Kbh + kpos[:, None] * stride_kn + offs_d[None, :], mask=live[:, None], other=0.0)
        v = tl.load(Vbh + kpos[:, None] * stride_vn + offs_d[None, :], mask=live[:, None], other=0.0)
        s = dot(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), FP32_DOT)
        vis = live[None, :] & (kpos[None, :] <= offs_m[:, None])
        s = tl.where(vis, s * qk_scale, float("-inf"))
        m_i, l_i, acc = online_softmax_step(s, v, m_i, l_i, acc, FP32_DOT)
    return m_i, l_i, acc


# ---------------------------------------------------------------------------------------------
# Variant "ranges": initial range, diagonal range, ranked list; every tile masked
# ---------------------------------------------------------------------------------------------
@triton.jit
def _dhsa_ranges_kernel(
    Q, K, V, O, TILES, TOK, NTOK,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_on,
    stride_tb, stride_th, stride_tc,  # TOK (batch, heads|1, C, L)
    stride_nb, stride_nh,  # NTOK (batch, heads|1, C)
    T_MAX, BUDGET, INITIAL, qk_scale,
    H: tl.constexpr, GROUP: tl.constexpr, SHARED: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FP32_DOT: tl.constexpr,
):
    b, h, hs, c, c_start, r0, r1, offs_m, offs_d, Kbh, Vbh = _tile_setup(
        K, V, TILES, T_MAX, stride_kb, stride_kh, stride_vb, stride_vh, H, GROUP, SHARED, HEAD_DIM, BLOCK_M)
    if r1 > r0:
        q = _load_rows(Q, b, h, offs_m, r1, offs_d, stride_qb, stride_qh, stride_qn)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

        # -- stage 1: initial keys [0, min(INITIAL, r1)), causal
        m_i, l_i, acc = _causal_range(q, Kbh, Vbh, 0, tl.minimum(INITIAL, r1), offs_m, offs_d, stride_kn, stride_vn,
                                      qk_scale, m_i, l_i, acc, BLOCK_M, BLOCK_N, FP32_DOT)

        # -- stage 2: the diagonal chunk [max(c_start, INITIAL), row], causal
        m_i, l_i, acc = _causal_range(q, Kbh, Vbh, tl.maximum(c_start, INITIAL), r1, offs_m, offs_d, stride_kn,
                                      stride_vn, qk_scale, m_i, l_i, acc, BLOCK_M, BLOCK_N, FP32_DOT)

        # -- stage 3: the ranked list of chunk c; row i takes its first room_i entries
        room = BUDGET - (offs_m + 1 - tl.maximum(c_start - INITIAL, 0))  # (BLOCK_M,)
        room_first = BUDGET - (r0 + 1 - tl.maximum(c_start - INITIAL, 0))  # the tile's largest room
        n_use = tl.minimum(tl.load(NTOK + b * stride_nb + hs * stride_nh + c), room_first)
        TOKc = TOK + b * stride_tb + hs * stride_th + c * stride_tc
        for start in range(0, n_use, BLOCK_N):
            k, v, s, live, slot, kpos = gathered_tile(q, TOKc, Kbh, Vbh, start, n_use, stride_kn, stride_vn, offs_d,
                                                      BLOCK_M, BLOCK_N, FP32_DOT)
            vis = live[None, :] & (slot[None, :] < room[:, None]) & (kpos[None, :] <= offs_m[:, None])
            s = tl.where(vis, s * qk_scale, float("-inf"))
            m_i, l_i, acc = online_softmax_step(s, v, m_i, l_i, acc, FP32_DOT)

        # -- epilogue
        _store_rows(O, acc, l_i, b, h, offs_m, r1, offs_d, stride_ob, stride_oh, stride_on)


# ---------------------------------------------------------------------------------------------
# Variant "lists": one list [0 .. initial) ++ ranked (unmasked bulk, masked tail), then the diagonal
# ---------------------------------------------------------------------------------------------
@triton.jit
def _list_tile(q, TOKc, Kbh, Vbh, start, INITIAL, n_list, stride_kn, stride_vn, offs_d, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, FP32_DOT: tl.constexpr):
    # Slots [start, start + BLOCK_N) of the list [0 .. INITIAL) ++ TOKc[0 : n_list - INITIAL]: the first
    # INITIAL slots are their own positions (no load), the rest come from the ranked list. Slots past
    # n_list read row 0 (in bounds); the caller masks them.
    slot = start + tl.arange(0, BLOCK_N)
    ranked = (slot >= INITIAL) & (slot < n_list)
    kpos = tl.where(slot < INITIAL, slot, tl.load(TOKc + (slot - INITIAL), mask=ranked, other=0))
    k = tl.load(Kbh + kpos[:, None] * stride_kn + offs_d[None, :])
    v = tl.load(Vbh + kpos[:, None] * stride_vn + offs_d[None, :])
    s = dot(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), FP32_DOT)
    return v, s, slot


@triton.jit
def _dhsa_lists_kernel(
    Q, K, V, O, TILES, TOK, NLIST,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_on,
    stride_tb, stride_th, stride_tc,  # TOK (batch, heads|1, C, L)
    stride_nb, stride_nh,  # NLIST (batch, heads|1, C): length of [0 .. INITIAL) ++ ranked, 0 if none
    T_MAX, BUDGET, INITIAL, qk_scale,
    H: tl.constexpr, GROUP: tl.constexpr, SHARED: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FP32_DOT: tl.constexpr,
):
    b, h, hs, c, d0, r0, r1, offs_m, offs_d, Kbh, Vbh = _tile_setup(
        K, V, TILES, T_MAX, stride_kb, stride_kh, stride_vb, stride_vh, H, GROUP, SHARED, HEAD_DIM, BLOCK_M)
    if r1 > r0:
        q = _load_rows(Q, b, h, offs_m, r1, offs_d, stride_qb, stride_qh, stride_qn)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

        # -- how much of the list each row takes: take_i = BUDGET - |diagonal_i|, at most the list
        n_list = tl.load(NLIST + b * stride_nb + hs * stride_nh + c)
        take = tl.minimum(BUDGET - (offs_m + 1 - d0), n_list)  # (BLOCK_M,), decreasing along the rows
        take_first = tl.minimum(BUDGET - (r0 + 1 - d0), n_list)
        take_last = tl.minimum(BUDGET - (r1 - d0), n_list)
        bulk = (take_last // BLOCK_N) * BLOCK_N
        TOKc = TOK + b * stride_tb + hs * stride_th + c * stride_tc

        # -- stage 1: the bulk, slots every row takes: no mask
        for start in range(0, bulk, BLOCK_N):
            v, s, slot = _list_tile(q, TOKc, Kbh, Vbh, start, INITIAL, n_list, stride_kn, stride_vn, offs_d,
                                    BLOCK_M, BLOCK_N, FP32_DOT)
            m_i, l_i, acc = online_softmax_step(s * qk_scale, v, m_i, l_i, acc, FP32_DOT)

        # -- stage 2: the tail, slots only the first rows take
        for start in range(bulk, take_first, BLOCK_N):
            v, s, slot = _list_tile(q, TOKc, Kbh, Vbh, start, INITIAL, n_list, stride_kn, stride_vn, offs_d,
                                    BLOCK_M, BLOCK_N, FP32_DOT)
            s = tl.where(slot[None, :] < take[:, None], s * qk_scale, float("-inf"))
            m_i, l_i, acc = online_softmax_step(s, v, m_i, l_i, acc, FP32_DOT)

        # -- stage 3: the diagonal [d0, row], causal (all of [0, row] for a chunk without a list)
        m_i, l_i, acc = _causal_range(q, Kbh, Vbh, d0, r1, offs_m, offs_d, stride_kn, stride_vn, qk_scale, m_i, l_i,
                                      acc, BLOCK_M, BLOCK_N, FP32_DOT)

        # -- epilogue
        _store_rows(O, acc, l_i, b, h, offs_m, r1, offs_d, stride_ob, stride_oh, stride_on)


# ---------------------------------------------------------------------------------------------
# Variant "packed": the "lists" loops over tiles of >= 64 rows that may hold several query heads
# ---------------------------------------------------------------------------------------------
@triton.jit
def _packed_loads_only(TOKc, Kbh, Vbh, start, INITIAL, n_list, stride_kn, stride_vn, offs_d, acc_l,
                       BLOCK_N: tl.constexpr):
    # LOADS_ONLY diagnostics: the same key/value gathers as _list_tile, summed instead of multiplied
    slot = start + tl.arange(0, BLOCK_N)
    ranked = (slot >= INITIAL) & (slot < n_list)
    kpos = tl.where(slot < INITIAL, slot, tl.load(TOKc + (slot - INITIAL), mask=ranked, other=0))
    k = tl.load(Kbh + kpos[:, None] * stride_kn + offs_d[None, :])
    v = tl.load(Vbh + kpos[:, None] * stride_vn + offs_d[None, :])
    return acc_l + tl.sum(k.to(tl.float32) + v.to(tl.float32), 0)


@triton.jit
def _lazy_softmax_step(s, v, m_i, l_i, acc, FP32_DOT: tl.constexpr):
    # LAZY, unmasked tiles only: keep a stale running max unless some row's max grew by more than 8 (base 2: a
    # factor 256), so the accumulator is rescaled only then (rarely, once the first tiles set the max); the
    # result is the same softmax (numerator and denominator share the stale max), p = exp2(s - m) <= 256
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if tl.max(m_new - m_i, 0) > 8.0:
        alpha = tl.exp2(m_i - m_new)
        acc = acc * alpha[:, None]
        l_i = l_i * alpha
        m_i = m_new
    p = tl.exp2(s - m_i[:, None])
    l_i = l_i + tl.sum(p, 1)
    acc = dot(p.to(v.dtype), v, acc, FP32_DOT)
    return m_i, l_i, acc


@triton.jit
def _packed_tile(q, TOKc, Kbh, Vbh, KD, VD, b, hk, start, INITIAL, n_list, N_KEYS, stride_kn, stride_vn, offs_d,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, FP32_DOT: tl.constexpr,
                 RUNS: tl.constexpr):
    # One BLOCK_N-slot tile of the list. RUNS == 0: gathered row by row (_list_tile). RUNS > 0: the tables
    # checked that every tile of every list is one contiguous run of positions (fixed chunks aligned to
    # BLOCK_N), so one index gives the tile: 1 = a block of pointer loads, 2 = one TMA copy per tensor.
    if RUNS == 0:
        v, s, slot = _list_tile(q, TOKc, Kbh, Vbh, start, INITIAL, n_list, stride_kn, stride_vn, offs_d, BLOCK_M,
                                BLOCK_N, FP32_DOT)
    else:
        slot = start + tl.arange(0, BLOCK_N)
        p0 = tl.where(start < INITIAL, start, tl.load(TOKc + tl.maximum(start - INITIAL, 0)))
        if RUNS == 1:
            kpos = tl.minimum(p0 + tl.arange(0, BLOCK_N), N_KEYS - 1)
            k = tl.load(Kbh + kpos[:, None] * stride_kn + offs_d[None, :])
            v = tl.load(Vbh + kpos[:, None] * stride_vn + offs_d[None, :])
        else:
            k = KD.load([b, hk, p0, 0]).reshape(BLOCK_N, HEAD_DIM)
            v = VD.load([b, hk, p0, 0]).reshape(BLOCK_N, HEAD_DIM)
        s = dot(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), FP32_DOT)
    return v, s, slot


@triton.jit
def _dhsa_packed_kernel(
    Q, K, V, O, TILES, TOK, NLIST, KD, VD,  # KD, VD: TMA descriptors of K, V (RUNS == 2), else K, V again
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_on,
    stride_tb, stride_th, stride_tc,  # TOK (batch, heads|1, C, L)
    stride_nb, stride_nh,  # NLIST (batch, heads|1, C): length of [0 .. INITIAL) ++ ranked, 0 if none
    T_MAX, BUDGET, INITIAL, N_KEYS, qk_scale,
    H: tl.constexpr, GROUP: tl.constexpr, SHARED: tl.constexpr, HEAD_DIM: tl.constexpr,
    ROWS: tl.constexpr, PACK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FP32_DOT: tl.constexpr,
    LOADS_ONLY: tl.constexpr, RUNS: tl.constexpr, LAZY: tl.constexpr,
):
    # -- which tile: rows [r0, r1) of chunk c, for the PACK query heads h0 .. h0 + PACK - 1, which read one
    #    key/value head and (PACK > 1 needs a shared selection) one list. Program row m is position
    #    r0 + m % ROWS of head h0 + m // ROWS: BLOCK_M = ROWS x PACK rows share every key load.
    pid_t = tl.program_id(0)
    pid_g = tl.program_id(1)
    b = pid_g // (H // PACK)
    h0 = (pid_g % (H // PACK)) * PACK
    hk = h0 // GROUP
    hs = 0 if SHARED else h0
    tile = TILES + (b * T_MAX + pid_t) * 4
    c = tl.load(tile)
    d0 = tl.load(tile + 1)
    r0 = tl.load(tile + 2)
    r1 = tl.load(tile + 3)
    m = tl.arange(0, BLOCK_M)
    pos = r0 + m % ROWS  # (BLOCK_M,) query position of each program row
    head = h0 + m // ROWS
    offs_d = tl.arange(0, HEAD_DIM)
    Kbh = K + b * stride_kb + hk * stride_kh
    Vbh = V + b * stride_vb + hk * stride_vh
    if r1 > r0:
        row_ok = (pos < r1)[:, None]
        q = tl.load(Q + b * stride_qb + head[:, None] * stride_qh + pos[:, None] * stride_qn + offs_d[None, :],
                    mask=row_ok, other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

        # -- how much of the list each row takes (as "lists"; rows of every packed head alike)
        n_list = tl.load(NLIST + b * stride_nb + hs * stride_nh + c)
        take = tl.minimum(BUDGET - (pos + 1 - d0), n_list)
        take_first = tl.minimum(BUDGET - (r0 + 1 - d0), n_list)
        take_last = tl.minimum(BUDGET - (r1 - d0), n_list)
        bulk = (take_last // BLOCK_N) * BLOCK_N
        TOKc = TOK + b * stride_tb + hs * stride_th + c * stride_tc

        if LOADS_ONLY:  # diagnostics: the key/value traffic without the arithmetic
            acc_l = tl.zeros([HEAD_DIM], dtype=tl.float32)
            for start in range(0, take_first, BLOCK_N):
                acc_l = _packed_loads_only(TOKc, Kbh, Vbh, start, INITIAL, n_list, stride_kn, stride_vn, offs_d,
                                           acc_l, BLOCK_N)
            acc += acc_l[None, :]
            l_i += 1.0
        else:
            # -- stage 1: the bulk, slots every row takes: no mask
            for start in range(0, bulk, BLOCK_N):
                v, s, slot = _packed_tile(q, TOKc, Kbh, Vbh, KD, VD, b, hk, start, INITIAL, n_list, N_KEYS, stride_kn,
                                          stride_vn, offs_d, BLOCK_M, BLOCK_N, HEAD_DIM, FP32_DOT, RUNS)
                if LAZY:
                    m_i, l_i, acc = _lazy_softmax_step(s * qk_scale, v, m_i, l_i, acc, FP32_DOT)
                else:
                    m_i, l_i, acc = online_softmax_step(s * qk_scale, v, m_i, l_i, acc, FP32_DOT)

            # -- stage 2: the tail, slots only the first rows take
            for start in range(bulk, take_first, BLOCK_N):
                v, s, slot = _packed_tile(q, TOKc, Kbh, Vbh, KD, VD, b, hk, start, INITIAL, n_list, N_KEYS, stride_kn,
                                          stride_vn, offs_d, BLOCK_M, BLOCK_N, HEAD_DIM, FP32_DOT, RUNS)
                s = tl.where(slot[None, :] < take[:, None], s * qk_scale, float("-inf"))
                m_i, l_i, acc = online_softmax_step(s, v, m_i, l_i, acc, FP32_DOT)

            # -- stage 3: the diagonal [d0, row], causal (idle rows, past r1, see all of it: l_i > 0)
            m_i, l_i, acc = _causal_range(q, Kbh, Vbh, d0, r1, pos, offs_d, stride_kn, stride_vn, qk_scale, m_i,
                                          l_i, acc, BLOCK_M, BLOCK_N, FP32_DOT)

        # -- epilogue
        acc = acc / l_i[:, None]
        tl.store(O + b * stride_ob + head[:, None] * stride_oh + pos[:, None] * stride_on + offs_d[None, :],
                 acc.to(O.dtype.element_ty), mask=row_ok)


_KERNELS = {"ranges": _dhsa_ranges_kernel, "lists": _dhsa_lists_kernel, "packed": _dhsa_packed_kernel}


def _descriptor(x: torch.Tensor, block_n: int):
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 1, block_n, x.shape[-1]])


def _lastdim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def dhsa_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, boundaries, budget: int | None, *,
                          initial: int = 0, aggregation: str = "eq4", share_heads: bool = False,
                          scale: float | None = None, plan: ChunkPlan | None = None,
                          config: dict | None = None, variant: str = "lists",
                          tables: LaunchTables | None = None) -> torch.Tensor:
    """DHSA prefill attention (``keep_diagonal=True``) with the Triton kernel; forward only.

    Shapes and arguments as :func:`kvlab.dhsa.reference.dhsa_attention_reference`; inputs are
    assumed valid (:func:`kvlab.dhsa.dhsa_attention` checks them). ``plan`` reuses a
    :func:`~kvlab.dhsa.reference.chunk_plan` and ``tables`` its :func:`launch_tables` (a benchmark
    times them apart); ``config`` overrides :func:`default_config`; ``variant`` picks the kernel
    (``"ranges"`` | ``"lists"``, module docstring).
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    bsz, h, n, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if tables is None:
        if plan is None:
            plan = chunk_plan(q, k, boundaries, budget, initial=initial, aggregation=aggregation,
                              share_heads=share_heads)
        tables = launch_tables(plan, variant, config, q.dtype, head_dim=d, group=h // k.shape[1])
    tok, ntok = tables.tok, tables.ntok
    q, k, v = (_lastdim_contiguous(x) for x in (q, k, v))
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    fp32_dot = q.dtype == torch.float32 or interpreting()
    hs = tok.shape[1]
    group = h // k.shape[1]
    args = (q.stride(0), q.stride(1), q.stride(2),
            k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2),
            o.stride(0), o.stride(1), o.stride(2),
            tok.stride(0), tok.stride(1), tok.stride(2),
            ntok.stride(0), ntok.stride(1))
    common = dict(H=h, GROUP=group, SHARED=hs == 1 and h > 1, HEAD_DIM=d, FP32_DOT=fp32_dot)
    for tiles, cfg in (tables.launches or ((tables.tiles, tables.config),)):
        if tables.variant == "packed":
            pack = cfg["PACK"]
            if group % pack or (pack > 1 and hs != 1):
                raise ValueError(f"config PACK={pack} must divide the query heads per key/value head ({group}) and "
                                 "needs a shared selection (share_heads=True); use PACK=1")
            runs = int(cfg.get("RUNS", 0))
            kd, vd = (_descriptor(x, cfg["BLOCK_N"]) for x in (k, v)) if runs == 2 else (k, v)
            _dhsa_packed_kernel[(tiles.shape[1], bsz * h // pack)](
                q, k, v, o, tiles, tok, ntok, kd, vd, *args, tiles.shape[1], tables.budget, tables.initial, n,
                scale * 1.4426950408889634, ROWS=cfg["ROWS"], PACK=pack, BLOCK_M=cfg["ROWS"] * pack,
                BLOCK_N=cfg["BLOCK_N"], LOADS_ONLY=bool(cfg.get("LOADS_ONLY", False)), RUNS=runs,
                LAZY=bool(cfg.get("LAZY", False)),
                num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **common)
        else:
            _KERNELS[tables.variant][(tiles.shape[1], bsz * h)](
                q, k, v, o, tiles, tok, ntok, *args, tiles.shape[1], tables.budget, tables.initial,
                scale * 1.4426950408889634, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
                num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **common)
    return o


# ---------------------------------------------------------------------------------------------
# The selection on the GPU: chunk_plan and launch_tables without host synchronisations
# ---------------------------------------------------------------------------------------------
# What depends on the scores is GPU work: the chunk sums of Eq. 4 (one Triton pass over q and k in the selection
# dtype, instead of a float32 copy of both and an index_add_), S = Q_C K_C^T and the stable sort of each row
# (PyTorch, the reference's own ops), and the lists, written by one Triton program per (query chunk, head) from
# the sorted row (instead of (heads, C, L) int64 searchsorted / gather tensors). Everything else depends on the
# chunk offsets alone and is computed on the host from a host copy of them: a list's length is
# ``min(total_c, room_c)`` with ``total_c = (b_c - ls_c) + max(ls_c - initial, 0)`` (the candidate chunks tile
# ``[0, b_c)``), so ``L``, the counts, the query tiles and their order, and the TMA run check need no value
# from the GPU; they travel in pinned, non-blocking copies.
@triton.jit
def _chunk_sums_kernel(X, OUT, ST, EN, D, stride_xh, stride_xn, stride_xd, stride_oh, stride_oc,
                       BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    # OUT[h, c] = sum of X[h, b_c : b_c+1] over the chunk's rows, accumulated in OUT's dtype (the selection dtype)
    c = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    s = tl.load(ST + c)
    e = tl.load(EN + c)
    offs_d = tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=OUT.dtype.element_ty)
    for r0 in range(s, e, BLOCK_R):
        rows = (r0 + tl.arange(0, BLOCK_R)).to(tl.int64)
        x = tl.load(X + h * stride_xh + rows[:, None] * stride_xn + offs_d[None, :] * stride_xd,
                    mask=(rows < e)[:, None] & (offs_d < D)[None, :], other=0.0)
        acc += x.to(OUT.dtype.element_ty)
    tl.store(OUT + h * stride_oh + c * stride_oc + offs_d, tl.sum(acc, 0), mask=offs_d < D)


@triton.jit
def _fill_lists_kernel(ORDER, CSTART, CEND, LS, ST, NTOK, TOK, C, L, stride_oh, stride_oc, stride_th, stride_tc,
                       R: tl.constexpr, BLOCK: tl.constexpr):
    # tok[h, c] = [ls_c, b_c) ++ the candidate tokens of the chunks ORDER[h, c, :] in that order, first NTOK[c]
    # slots, -1 after. Chunk j gives the tokens [CSTART[j], min(CEND[j], ls_c)) when j < c (none otherwise).
    c = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    n_tok = tl.load(NTOK + c)
    ls = tl.load(LS + c)
    out = TOK + h * stride_th + c * stride_tc
    offs = tl.arange(0, BLOCK)
    # -- rank 0: the local range before the chunk
    loc = tl.load(ST + c) - ls
    for s0 in range(0, loc, BLOCK):
        s = s0 + offs
        tl.store(out + s, ls + s, mask=(s < loc) & (s < n_tok))
    # -- ranks 1..: R sorted chunks at a time; each slot finds its chunk by a prefix sum of the lengths
    base = loc
    m0 = c * 0
    ar = tl.arange(0, R)
    while (m0 < C) & (base < n_tok):
        m = m0 + ar
        j = tl.load(ORDER + h * stride_oh + c * stride_oc + m, mask=m < C, other=0).to(tl.int32)
        j = tl.where(m < C, j, c)  # past the row: no candidate
        cs = tl.load(CSTART + j)
        ln = tl.maximum(tl.minimum(tl.load(CEND + j), ls) - cs, 0)
        ln = tl.where(j < c, ln, 0)
        incl = tl.cumsum(ln, 0)
        shift = cs - (incl - ln)  # token of slot base + x in chunk r: x + shift[r]
        stop = tl.minimum(base + tl.sum(ln, 0), n_tok)
        for s0 in range(base, stop, BLOCK):
            s = s0 + offs
            rel = s - base
            r = tl.sum((incl[None, :] <= rel[:, None]).to(tl.int32), 1)  # the chunk whose range holds the slot
            tokv = rel + tl.sum(tl.where(r[:, None] == ar[None, :], shift[None, :], 0), 1)
            tl.store(out + s, tokv, mask=s < stop)
        base = base + tl.sum(ln, 0)
        m0 += R
    # -- padding
    for s0 in range(n_tok, L, BLOCK):
        s = s0 + offs
        tl.store(out + s, tl.full([BLOCK], -1, dtype=tl.int32), mask=s < L)


def _pinned_to(x: torch.Tensor, device) -> torch.Tensor:
    """A host tensor on ``device`` without a synchronisation (pinned, non-blocking) where that is CUDA."""
    device = torch.device(device)
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def _host_boundaries(boundaries, bsz: int, n: int) -> list[torch.Tensor]:
    """Checked offsets per sequence, on the host (one copy of all of them where they are on a GPU)."""
    from .reference import _per_batch

    if isinstance(boundaries, (list, tuple)) and boundaries and all(isinstance(b, torch.Tensor) for b in boundaries):
        on_gpu = [b for b in boundaries if b.device.type != "cpu"]
        if on_gpu:  # one copy for the batch
            flat = torch.cat([b.reshape(-1).long() for b in boundaries]).cpu()
            boundaries = list(torch.split(flat, [b.numel() for b in boundaries]))
    elif isinstance(boundaries, torch.Tensor):
        boundaries = boundaries.cpu()
    return _per_batch(boundaries, bsz, n)


def _sequence_meta(bd: torch.Tensor, budget: int, initial: int, local: int) -> torch.Tensor:
    """``(5, C)`` int64 host rows ``b_c, b_{c+1}, max(b_c, initial), ls_c, n_tokens_c`` of one sequence."""
    from .reference import local_starts, max_forced

    need = max_forced(bd, initial, local=local)
    if need > budget:
        raise ValueError(f"budget={budget} is smaller than the always-kept keys of some query ({need} = "
                         "initial tokens + its diagonal chunk): the budget must be at least initial + the "
                         "longest chunk; raise budget or use shorter chunks")
    st, en = bd[:-1], bd[1:]
    ls = local_starts(bd, local, initial)
    total = (st - ls) + (ls - initial).clamp(min=0)  # local range + every candidate token of [initial, ls_c)
    room = budget - (torch.clamp(st, max=initial) + 1)  # room of the chunk's first row
    return torch.stack([st, en, st.clamp(min=initial), ls, torch.minimum(total, room)])


def _chunk_sums(x: torch.Tensor, st: torch.Tensor, en: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``(heads, C, dim)`` chunk sums of ``x`` ``(heads, seq, dim)`` in ``dtype`` (one Triton pass)."""
    h, _, d = x.shape
    out = torch.empty(h, st.numel(), d, dtype=dtype, device=x.device)
    block_d = triton.next_power_of_2(d)
    _chunk_sums_kernel[(st.numel(), h)](x, out, st, en, d, x.stride(0), x.stride(1), x.stride(2), out.stride(0),
                                        out.stride(1), BLOCK_R=16 if interpreting() else max(8, 4096 // block_d),
                                        BLOCK_D=block_d, num_warps=4)
    return out


def _sequence_lists(q, k, meta_dev, length, aggregation, share_heads, score_dtype):
    """``(heads | 1, C, length)`` int32 ranked lists of one sequence (``q`` ``(heads, n, d)``, ``k`` ``(kv, n, d)``)."""
    st, en, cstart, ls, n_tok = meta_dev  # int32 rows on the device
    lengths = (en - st).to(score_dtype)
    qs, ks = _chunk_sums(q, st, en, score_dtype), _chunk_sums(k, st, en, score_dtype)
    if share_heads:  # the mean over heads of every token, then its chunk sum: the sum of the head sums / heads
        qs, ks = qs.sum(0, keepdim=True) / q.shape[0], ks.sum(0, keepdim=True) / k.shape[0]
    qc, kc = represent_sums(qs, lengths, aggregation)[None], represent_sums(ks, lengths, aggregation)[None]
    kc = kc.repeat_interleave(qc.shape[1] // kc.shape[1], dim=1)
    s = (qc @ kc.transpose(-1, -2))[0]  # (H, C, C), as chunk_similarity
    C = st.numel()
    ci = torch.arange(C, device=q.device)
    is_cand = (ci[None, :] < ci[:, None]) & (torch.minimum(en[None, :], ls[:, None]) > cstart[None, :])
    order = torch.sort(s.masked_fill(~is_cand[None], float("-inf")), dim=-1, descending=True, stable=True).indices
    tok = torch.empty(s.shape[0], C, length, dtype=torch.int32, device=q.device)
    _fill_lists_kernel[(C, s.shape[0])](order, cstart, en, ls, st, n_tok, tok, C, length, order.stride(0),
                                        order.stride(1), tok.stride(0), tok.stride(1), R=16 if interpreting() else 32,
                                        BLOCK=16 if interpreting() else 128, num_warps=4)
    return tok


def chunk_plan_fast(q: torch.Tensor, k: torch.Tensor, boundaries, budget: int | None, *, initial: int = 0,
                    aggregation: str = "eq4", share_heads: bool = False,
                    score_dtype: torch.dtype = torch.float32, local: int = 0) -> ChunkPlan:
    """:func:`kvlab.dhsa.reference.chunk_plan` (same arguments, same plan) as GPU work without host synchronisations.

    ``boundaries`` on the host cost nothing; on a GPU they are copied to the host once for the batch (the one
    synchronisation). The plan carries that host copy (``plan.host``, a :class:`ChunkPlan` of host offsets and counts
    with ``local``) for :func:`launch_tables_fast`. Equal to the reference wherever the chunk scores are equal; they
    are the same products of chunk sums accumulated in another order (exactly equal for integer-valued inputs),
    so on floats a near tie (within float32 rounding) may rank the other way.
    """
    if score_dtype not in (torch.float32, torch.float64):
        raise ValueError(f"score_dtype must be torch.float32 or torch.float64, got {score_dtype}")
    bsz, h, n, _ = q.shape
    per = _host_boundaries(boundaries, bsz, n)
    if budget is None or budget >= n:
        budget = n
    hs = 1 if share_heads else h
    starts, ends, toks, counts, hstarts, hends, hcounts = [], [], [], [], [], [], []
    for b in range(bsz):
        meta = _sequence_meta(per[b], budget, initial, local)
        length = max(int(meta[4].max()), 1)  # a host tensor: no synchronisation
        meta_dev = _pinned_to(meta, q.device)
        rows = meta_dev.to(torch.int32)
        toks.append(_sequence_lists(q[b], k[b], rows, length, aggregation, share_heads, score_dtype))
        starts.append(meta_dev[0])
        ends.append(meta_dev[1])
        counts.append(rows[4][None].expand(hs, -1).contiguous())
        hstarts.append(meta[0])
        hends.append(meta[1])
        hcounts.append(meta[4].to(torch.int32)[None].expand(hs, -1).contiguous())
    plan = ChunkPlan(starts, ends, toks, counts, budget, initial, n)
    host = ChunkPlan(hstarts, hends, [torch.empty(hs, c.shape[1], 0, dtype=torch.int32) for c in hcounts],
                     hcounts, budget, initial, n)
    host.local = local
    plan.host = host
    return plan


def host_plan(plan: ChunkPlan) -> ChunkPlan:
    """The host copy of ``plan``'s offsets and counts (``plan.host`` of :func:`chunk_plan_fast`; built with one copy
    for a plan of :func:`~kvlab.dhsa.reference.chunk_plan`, whose ``local`` is then unknown: None)."""
    host = getattr(plan, "host", None)
    if host is None:
        host = ChunkPlan([s.cpu() for s in plan.starts], [e.cpu() for e in plan.ends],
                         [torch.empty(t.shape[0], t.shape[1], 0, dtype=torch.int32) for t in plan.tokens],
                         [c.cpu() for c in plan.n_tokens], plan.budget, plan.initial, plan.n)
        host.local = None
    return host


def launch_tables_fast(plan: ChunkPlan, variant: str = "lists", config: dict | None = None,
                       dtype: torch.dtype = torch.bfloat16, *, head_dim: int = 128, group: int = 1) -> LaunchTables:
    """:func:`launch_tables` (same arguments, the same tables) with its tiles, counts and config computed from the
    plan's host copy (:func:`host_plan`) and copied to the device without a synchronisation; the TMA run check
    reads the offsets alone where they prove it (fixed chunks aligned to the key tiles, :func:`_aligned_runs`)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    host = host_plan(plan)
    cfg = default_config(host, dtype, variant, head_dim=head_dim, group=group) if config is None else dict(config)
    tok, ntok = _batched_lists(plan)
    dev = tok.device
    _, hntok = _batched_counts(host)
    return _tables(plan, host, tok, ntok, hntok, variant, cfg, lambda x: _pinned_to(x, dev), host.local)


def _batched_counts(host: ChunkPlan) -> tuple[None, torch.Tensor]:
    """:func:`_batched_lists`' counts of a host plan (its lists are empty placeholders)."""
    if len(host.starts) == 1:
        return None, host.n_tokens[0][None]
    c_max = max(c.shape[1] for c in host.n_tokens)
    ntok = torch.zeros(len(host.starts), host.n_tokens[0].shape[0], c_max, dtype=torch.int32)
    for b, c in enumerate(host.n_tokens):
        ntok[b, :, : c.shape[1]] = c
    return None, ntok


# ---------------------------------------------------------------------------------------------
# Benchmark: python -m kvlab.dhsa.triton (GPU). The full suite is `python -m kvlab bench dhsa`.
# ---------------------------------------------------------------------------------------------
if __name__ == "__main__":
    from kvlab.kernels.benchmarking import perf_report_against_sdpa

    from .reference import fixed_boundaries

    def _dhsa(q, k, v):
        bd = fixed_boundaries(q.shape[2], 64, device=q.device)
        plan = chunk_plan(q, k, bd, 2048, initial=64)
        tables = launch_tables(plan, "lists", dtype=q.dtype)
        return lambda: dhsa_attention_triton(q, k, v, bd, 2048, initial=64, tables=tables)

    perf_report_against_sdpa("dhsa_attention_fwd", "DHSA Triton (2k budget)", _dhsa).run(print_data=True)
