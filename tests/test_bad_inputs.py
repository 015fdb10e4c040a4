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


def decoder_of(batch=2):
    from conftest import _tiny

    from kvlab.eval import FastDecoder
    from kvlab.policies import StreamingLLM

    return FastDecoder(_tiny("llama"), StreamingLLM(2, 6), batch, max_steps=4, record=4, graph=False)


def test_fast_decoder_step_refuses_float_token_ids():
    """A float id was truncated (7.9 ran as 7); now it is refused before it reaches the embedding."""
    decoder = decoder_of()
    with pytest.raises(ValueError, match=r"ids must be integer token ids, got dtype torch.float32.*\.long\(\)"):
        decoder.step(torch.tensor([[7.9], [3.0]]))


@pytest.mark.parametrize("bad", [96, -1], ids=["vocab", "negative"])
def test_fast_decoder_step_names_an_id_out_of_the_vocabulary(bad):
    """An id >= vocab or < 0 was an IndexError deep in the embedding."""
    decoder = decoder_of()
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


# -- sweeps


def _no_cluster(*args, **kwargs):
    raise AssertionError("a cluster was started for a sweep that must be refused")


def test_sweep_refuses_a_notebook_parameter_the_notebook_does_not_declare(tmp_path, monkeypatch):
    """A grid over `max_tokenz` ran every cell with the default and marked it done."""
    import nbformat

    from kvlab.experiments import sweep

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("max_tokens: int = 64  # tokens to stream")
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, nbformat.v4.new_code_cell("print(max_tokens)")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "lesson.ipynb"
    nbformat.write(nb, path)
    monkeypatch.setattr(sweep, "local_cluster", _no_cluster)
    tasks = sweep.grid_tasks(str(path), {"max_tokenz": [8, 16]})
    with pytest.raises(ValueError, match=r"declares no parameter max_tokenz \(did you mean 'max_tokens'\?\).*declares \['max_tokens'\]"):
        sweep.run_sweep(tasks, tmp_path / "out", workers=1, progress=False)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_sweep_keeps_results_of_other_fixed_values(tmp_path):
    """A re-run with a changed `fixed:` value and the same name pattern into the same out replaced the results."""
    import json

    from kvlab.experiments import sweep

    out = tmp_path / "out"
    first = sweep.grid_tasks("builtins:dict", {"a": [1]}, fixed={"b": 1}, name="a{a}")
    again = sweep.grid_tasks("builtins:dict", {"a": [1]}, fixed={"b": 2}, name="a{a}")
    assert sweep.run_sweep(first, out, workers=1, progress=False).done == ["a1"]
    assert sweep.run_sweep(again, out, workers=1, progress=False).done == ["a1"]
    kept = {json.dumps(json.loads(p.read_text())["result"], sort_keys=True) for p in out.glob("a1*.json")}
    assert kept == {'{"a": 1, "b": 1}', '{"a": 1, "b": 2}'}
    assert json.loads((out / "a1.json").read_text())["params"] == {"b": 2, "a": 1}
    # back to the first value: its kept result counts as done, nothing runs
    assert sweep.run_sweep(first, out, workers=1, progress=False).skipped == ["a1"]
    assert json.loads((out / "a1.json").read_text())["params"] == {"b": 1, "a": 1}
    assert len(list(out.glob("a1*.json"))) == 2


def test_sweep_gpu_workers_auto_checks_that_torch_sees_the_gpus(tmp_path, monkeypatch):
    """CUDA_VISIBLE_DEVICES=0 on a machine without a GPU: 'auto' ran device: gpu tasks on the CPU and recorded them
    as run on a GPU."""
    from kvlab.experiments import sweep

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(sweep, "local_cluster", _no_cluster)
    task = sweep.Task("g", "os:getcwd", {}, device="gpu")
    with pytest.raises(ValueError, match=r"CUDA_VISIBLE_DEVICES='0' names 1 GPU\(s\) but torch sees 0"):
        sweep.run_sweep([task], tmp_path, workers=1, gpu_workers="auto", progress=False)


# -- the book


def test_book_stage_deletes_only_what_it_wrote(tmp_path):
    """`book/build.py --out OUT` deleted every file under OUT/src that it did not write this time."""
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "book"))
    import build as book

    src = tmp_path / "src"
    (src / "notes").mkdir(parents=True)
    foreign = src / "notes" / "mine.md"
    foreign.write_text("my own notes")
    import nbformat

    lesson = tmp_path / "01_lesson.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), lesson)  # the stage reads a lesson to take nbval's markers off
    book.stage(src, tmp_path, [], [lesson])
    assert (src / "lessons" / lesson.name).is_file()
    book.stage(src, tmp_path, [], [])  # the lesson left the course: its page goes, the user's file stays
    assert not (src / "lessons" / lesson.name).exists()
    assert foreign.read_text() == "my own notes"


# -- an attention pattern ignores attention_mask: a padded batch is refused, not silently wrong


def test_pattern_refuses_a_padded_batch(tiny_llama):
    """DHSA and SepLLM patterns read positions and token ids, never ``attention_mask``: a left-padded row would be
    attended as if its padding were text. The forward pass refuses it, naming the argument and the fix."""
    from kvlab.core.pattern import use_pattern
    from kvlab.sepllm.pattern import SepLLMPattern

    ids = torch.randint(5, 90, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # row 1 left-padded
    pattern = SepLLMPattern([7, 11], init=2, neighbors=4)
    with torch.no_grad(), use_pattern(tiny_llama, pattern):
        with pytest.raises((NotImplementedError, ValueError), match=r"attention_mask.*one sequence at a time"):
            tiny_llama(input_ids=ids, attention_mask=mask, use_cache=False)
        tiny_llama(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)  # no padding: runs
    tiny_llama(input_ids=ids, attention_mask=mask, use_cache=False)  # no pattern: the base attention masks it
