"""SepLLM attention with PyTorch FlexAttention and a block mask: the paper's own kernel design.

Paper: SepLLM (https://arxiv.org/abs/2412.12094), Sec. 3.2 and App. C: the training kernel is
FlexAttention with the SepLLM mask as ``mask_mod``. The block mask skips a 128 x 128 tile only
when no entry in it is visible; with separators scattered through the text nearly every causal
tile holds one, so this does about the work of dense causal attention (see
``benchmarks/results``). The mask itself is :func:`kvlab.sepllm.reference.sepllm_mask`.

On CUDA the attention call goes through ``torch.compile`` (FlexAttention's fast path); on CPU it
runs FlexAttention's eager path, which materialises scores and is only for small tests.
"""
from __future__ import annotations

import math

import torch

__all__ = ["sepllm_block_mask", "sep_attention_flex"]

_COMPILED = {}  # device type -> compiled flex_attention (compiling once per process is the point)


def _flex_fn(device: torch.device):
    """FlexAttention for tensors on ``device``: compiled on CUDA, eager elsewhere (decided by the tensors,
    not by whether the machine has a GPU: CPU tensors on a GPU machine take the eager path)."""
    from torch.nn.attention.flex_attention import flex_attention

    if device.type != "cuda":
        return flex_attention
    if device.type not in _COMPILED:
        _COMPILED[device.type] = torch.compile(flex_attention, dynamic=False)
    return _COMPILED[device.type]


def sepllm_block_mask(is_sep: torch.Tensor, init: int, neighbors: int, block_size: int = 128):
    """FlexAttention ``BlockMask`` for the SepLLM mask.

    Args:
        is_sep: ``(batch, seq)`` bool; one mask per sequence, shared by all heads.
        init, neighbors: as in :func:`kvlab.sepllm.reference.sepllm_mask`.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    bsz, n = is_sep.shape
    sep = is_sep.bool()

    def mask_mod(b, h, q_idx, kv_idx):
        causal = kv_idx <= q_idx
        return causal & ((kv_idx < init) | (q_idx - kv_idx < neighbors) | sep[b, kv_idx])

    return create_block_mask(mask_mod, bsz, None, n, n, device=is_sep.device, BLOCK_SIZE=block_size)


def sep_attention_flex(q, k, v, is_sep, init: int, neighbors: int, scale: float | None = None,
                       block_mask=None) -> torch.Tensor:
    """SepLLM attention through FlexAttention. Shapes as in the reference.

    ``block_mask`` may be passed to reuse one built by :func:`sepllm_block_mask` (building it
    costs a pass over all tiles, which a benchmark should time separately).
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if block_mask is None:
        block_mask = sepllm_block_mask(is_sep, init, neighbors)
    gqa = q.shape[1] != k.shape[1]
    return _flex_fn(q.device)(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa)
