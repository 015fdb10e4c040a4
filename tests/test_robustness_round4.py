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


# -- the static decode engine: token ids


def _decoder(batch=2):
    from conftest import _tiny

    from kvlab.eval import FastDecoder
    from kvlab.policies import StreamingLLM

    return FastDecoder(_tiny("llama"), StreamingLLM(2, 6), batch, max_steps=4, record=4, graph=False)


def test_fast_decoder_step_refuses_float_token_ids():
    """A float id was truncated (7.9 ran as 7); now it is refused before it reaches the embedding."""
    decoder = _decoder()
    with pytest.raises(ValueError, match=r"ids must be integer token ids, got dtype torch.float32.*\.long\(\)"):
        decoder.step(torch.tensor([[7.9], [3.0]]))


@pytest.mark.parametrize("bad", [96, -1], ids=["vocab", "negative"])
def test_fast_decoder_step_names_an_id_out_of_the_vocabulary(bad):
    """An id >= vocab or < 0 was an IndexError deep in the embedding."""
    decoder = _decoder()
    with pytest.raises(ValueError, match=rf"ids must lie in \[0, 96\) \(the model's vocabulary\), got {bad}"):
        decoder.step(torch.tensor([[bad], [3]]))


@pytest.mark.parametrize("tokens", [0, 1])
def test_decode_static_needs_two_tokens(tokens):
    """0 or 1 tokens per row said "capacity must be a positive int" (the caller passed no capacity)."""
    from conftest import _tiny

    from kvlab.eval.fast import decode_static
    from kvlab.policies import StreamingLLM

    with pytest.raises(ValueError, match=rf"ids has {tokens} token\(s\) per row.*at least 2 tokens"):
        decode_static(_tiny("llama"), torch.zeros((2, tokens), dtype=torch.long), StreamingLLM(2, 6), graph=False)


# -- SepLLM without separators


def test_sepllm_streaming_without_a_separator_cache_warns():
    """SepLLMStreaming(sep=0) ran silently as a sink + window cache under SepLLM's name."""
    from kvlab.policies import SepLLMStreaming

    with pytest.warns(UserWarning, match=r"SepLLMStreaming\(sep=0\) keeps no separator.*StreamingLLM"):
        SepLLMStreaming(2, 0, 4, 12, separators=[5, 9])


# -- the asset cache


def test_a_file_where_an_asset_folder_goes_is_named(cache, asset_shelf, monkeypatch):
    """A file at the asset's folder in the cache was a bare FileExistsError."""
    from test_robustness_assets import TEXT, add_asset

    from kvlab import assets
    from kvlab.assets import CacheDirError

    add_asset(monkeypatch, asset_shelf[0], "tiny-text", {"wiki.utf8": TEXT.encode()})
    blocker = cache / "assets" / "tiny-text"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("not a folder")
    with pytest.raises(CacheDirError, match=rf"{blocker} is a file, but kvlab keeps a folder there.*move or delete"):
        assets.fetch("tiny-text", progress=False)
