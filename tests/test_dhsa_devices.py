"""A boundary predictor runs on its keys' device: one loaded on the CPU (``load_predictor(path)``,
``shipped_predictor(name)``) applied to CUDA keys, or one trained on a GPU applied to CPU keys, is moved there
instead of failing with "Expected all tensors to be on the same device" inside its forward.

The CPU stand-in for a second device is the meta device: the predictor's forward is stopped by a pre-hook that
records where its weights and its input are."""

from __future__ import annotations

import pytest
import torch

from kvlab.dhsa import api
from kvlab.dhsa import boundary_predictor as B


class _Stop(Exception):
    pass


def _spy(predictor):
    seen = []

    def hook(module, args):
        seen.append((next(module.parameters()).device, args[0].device))
        raise _Stop

    predictor.register_forward_pre_hook(hook)
    return seen


@pytest.mark.parametrize("entry", [B.predict_boundaries, api.predict_boundaries], ids=["reference", "api"])
def test_predictor_runs_on_the_keys_device(entry):
    torch.manual_seed(0)
    predictor = B.BoundaryPredictor(8, window=2, heads=2, hidden=8)  # on the CPU
    seen = _spy(predictor)
    keys = torch.randn(1, 2, 16, 4, device="meta")  # keys on another device
    with pytest.raises(_Stop):
        entry(predictor, keys, max_chunks=4)
    assert seen == [(torch.device("meta"), torch.device("meta"))], seen


def test_on_device_of_keeps_a_predictor_already_there():
    predictor = B.BoundaryPredictor(8, window=2, heads=2, hidden=8)
    before = predictor.qkv.weight
    assert B.on_device_of(predictor, torch.zeros(1)) is predictor and predictor.qkv.weight is before


def test_prediction_is_unchanged_on_one_device():
    torch.manual_seed(0)
    predictor = B.BoundaryPredictor(8, window=2, heads=2, hidden=8).eval()
    keys = torch.randn(2, 2, 32, 4, dtype=torch.float64)
    a = B.predict_boundaries(predictor, keys, max_chunks=6, nms_window=2)
    b = api.predict_boundaries(predictor, keys, max_chunks=6, nms_window=2, backend="torch")
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and all(x.device == keys.device for x in a)


def test_auto_backend_takes_torch_where_only_torch_ranks_per_row():
    """On a GPU "auto" means Triton, which ranks one list per query chunk: a causal chunk query or a kept set
    without the diagonal (ranked per query row) must go to torch instead of raising (notebook 07 on a GPU)."""
    from types import SimpleNamespace

    from kvlab.dhsa.api import _resolve_backend

    gpu = SimpleNamespace(is_cuda=True)
    assert _resolve_backend("auto", gpu) == "triton"
    assert _resolve_backend("auto", gpu, rowwise=True) == "torch"
    assert _resolve_backend("triton", gpu, rowwise=True) == "triton"  # asked for by name: the clear error follows
    assert _resolve_backend("auto", SimpleNamespace(is_cuda=False)) == "torch"
