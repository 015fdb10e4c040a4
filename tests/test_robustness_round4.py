"""Bad inputs and faults that gave a silent wrong result, lost data or an unclear error: each is now a clear error
naming the argument, the constraint and the fix, or a correct result. One test per case."""

from __future__ import annotations

import os

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICES = (["cpu"] if INTERPRET else []) + (["cuda"] if torch.cuda.is_available() else [])


# -- the static engine's Triton kernel: slots past a row's length are never read into the output


@pytest.mark.triton
@pytest.mark.skipif(not DEVICES, reason="needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config", [dict(BLOCK_N=8, splits=3), dict(BLOCK_N=16, splits=2, USE_DOT=True),
                                    dict(BLOCK_N=8, PHYS_ORDER=True), dict(BLOCK_N=8, splits=3, PHYS_ORDER=True),
                                    dict(BLOCK_N=16, splits=3, USE_DOT=True, PHYS_ORDER=True)],
                         ids=["3-ranges", "dot-2-ranges", "physical", "physical-3-ranges", "dot-physical-3-ranges"])
def test_static_triton_opt_in_configs_ignore_dead_slots(device, config):
    """NaN in every slot past a row's live entries: the opt-in configurations (ranges, tl.dot, memory order) give
    the output of clean buffers. Rows of 1 and 3 live entries leave whole tiles and ranges with dead slots only."""
    from test_static_triton import _case

    from kvlab.core.static_triton import default_config, static_decode_triton

    for seed in range(4):
        t, extra = _case(device, torch.float32, seed=seed)
        t["length"][1], t["length"][2] = 0, 2
        scale = 0.25
        cfg = dict(default_config(), **config)
        clean = static_decode_triton(t["q"], t["keys"], t["values"], t["phys"], t["length"], scale, config=cfg,
                                     **extra)
        keys, values = t["keys"].clone(), t["values"].clone()
        for b in range(keys.shape[0]):
            dead = t["phys"][b, int(t["length"][b]) + 1:]
            keys[b][:, dead] = float("nan")
            values[b][:, dead] = float("nan")
        dirty = static_decode_triton(t["q"], keys, values, t["phys"], t["length"], scale, config=cfg, **extra)
        assert torch.isfinite(dirty).all(), (seed, config)
        torch.testing.assert_close(dirty, clean, rtol=1e-5, atol=1e-6)
