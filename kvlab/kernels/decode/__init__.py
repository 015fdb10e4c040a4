"""Decode attention over ragged, compacted KV caches (one query token per sequence).

Public name: :func:`ragged_decode_attention` (backends ``"torch" | "sdpa" | "triton"``).
"""
from .api import BACKENDS, ragged_decode_attention

__all__ = ["ragged_decode_attention", "BACKENDS"]
