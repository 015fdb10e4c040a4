"""Refusals: each case that gave a silent wrong result, an unclear error or a fault is now a clear error naming the
input, the constraint and the fix (sweeps, the leaderboard, caches, REFORM's heads, fetching), one test per case.

Silent wrong results first, then unclear errors, then faults, then the two-process thread case. DHSA's argument
cases (``scale``, ``predict_boundaries``, ``share_heads``) are tested with DHSA.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import IdTokenizer
from kvlab.core import KVCache, attach
from kvlab.policies import Full, StreamingLLM

pytestmark = pytest.mark.usefixtures("one_thread")
TOK = IdTokenizer()
REPO = Path(__file__).resolve().parents[1]


def tiny_llama(layers: int = 4, rope_theta: float = 10000.0, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      rope_theta=rope_theta)
    return attach(LlamaForCausalLM(cfg).eval())


# =========================================================================== silent wrong results
def test_orthorank_left_padded_batch_is_refused(tiny_llama):
    from kvlab.orthorank import Plan, orthorank, use_plan

    torch.manual_seed(0)
    ids = torch.randint(0, 96, (2, 16))
    padded = torch.ones_like(ids)
    padded[0, :5] = 0  # row 0 left-padded: its first token (the sink) would be a pad
    with torch.no_grad():
        with orthorank(tiny_llama, layers=[1, 2], token_ratio=0.5):
            with pytest.raises(ValueError, match=r"padded batches .*\[5, 0\] pad tokens per row"):
                tiny_llama(input_ids=ids, attention_mask=padded)
            tiny_llama(input_ids=ids, attention_mask=torch.ones_like(ids))  # no zeros: runs
        with use_plan(tiny_llama, Plan(routed=(1,), router={"token_ratio": 0.5})):
            with pytest.raises(ValueError, match="padded batches"):
                tiny_llama(ids, padded)  # the mask given by position
        tiny_llama(input_ids=ids, attention_mask=padded)  # outside the block: the dense model takes padding


def test_kv_cache_refuses_a_model_with_other_rope_frequencies():
    a, b = tiny_llama(rope_theta=10000.0), tiny_llama(rope_theta=500000.0)
    ids = torch.randint(0, 96, (1, 10))
    cache = KVCache(a, StreamingLLM(2, 4, positions="cache"))
    with torch.no_grad():
        a(input_ids=ids[:, :8], past_key_values=cache, use_cache=True)
        with pytest.raises(ValueError, match="other RoPE frequencies.*KVCache\\(model, policy\\)"):
            b(input_ids=ids[:, 8:9], past_key_values=cache, use_cache=True)
        assert cache.seen == 8  # nothing of the refused step stays
        c = tiny_llama(rope_theta=10000.0, seed=1)  # same kind of model (other weights): the cache fits it
        c(input_ids=ids[:, 8:9], past_key_values=cache, use_cache=True)


def test_kv_cache_made_for_more_layers_is_refused():
    big, small = tiny_llama(layers=4), tiny_llama(layers=2)
    ids = torch.randint(0, 96, (1, 6))
    with torch.no_grad(), pytest.raises(ValueError, match="made for a model with 4 layers.*has 2"):
        small(input_ids=ids, past_key_values=KVCache(big, Full()), use_cache=True)


def test_sweep_array_results_are_stored_as_lists_and_other_objects_refused(tmp_path):
    from kvlab.experiments.sweep import Task, call_task, task_finished

    arrays = Task("arange", "numpy:arange", {"stop": 2000})
    call_task(arrays, str(tmp_path), [])
    stored = json.loads((tmp_path / "arange.json").read_text())["result"]
    assert stored == list(range(2000))
    objects = Task("object", "builtins:object", {})
    with pytest.raises(TypeError, match="JSON cannot hold"):
        call_task(objects, str(tmp_path), [])
    assert not (tmp_path / "object.json").exists() and not task_finished(objects, tmp_path)


@pytest.mark.parametrize("value", ["../../x", "/tmp/kvlab-sweep-x", "a/b", ".hidden", ".."])
def test_sweep_task_names_cannot_write_outside_out(tmp_path, value):
    from kvlab.experiments.sweep import Task, grid_tasks, run_sweep

    with pytest.raises(ValueError, match="plain file name"):
        grid_tasks("numpy:arange", {"p": [value]}, name="{p}")
    begin = time.perf_counter()
    with pytest.raises(ValueError, match="plain file name"):
        run_sweep([Task(value, "numpy:arange", {"stop": 3})], tmp_path / "out", progress=False)
    assert time.perf_counter() - begin < 5  # refused before any cluster starts
    assert not (tmp_path / "out").exists()


def _committed_ppl_cells(into: Path) -> None:
    """The committed tiny grid's SmolLM2 perplexity cells (kept in one file, ``cells.jsonl.gz``), written into
    ``into`` as the files a run leaves in ``cells/``."""
    from kvlab.experiments import leaderboard

    into.mkdir(parents=True)
    found = leaderboard._packed_cells(REPO / "benchmarks/results/leaderboard")
    for name, _, rec in found:
        if name.startswith("smollm2-135m-s0-ppl-"):
            (into / f"{name}.json").write_text(json.dumps(rec, indent=1))
    assert any(name.startswith("smollm2-135m-s0-ppl-") for name, _, _ in found)


def test_leaderboard_report_only_never_rewrites_the_committed_table(tmp_path, monkeypatch, capsys):
    from kvlab.experiments import leaderboard

    committed = tmp_path / "benchmarks" / "results" / "leaderboard"
    _committed_ppl_cells(committed / "cells")
    (committed / "leaderboard.md").write_text("the committed table\n")
    monkeypatch.chdir(tmp_path)
    assert leaderboard.main(["--report-only", "--methods", "Full,StreamingLLM", "--tasks", "ppl"]) == 0
    assert (committed / "leaderboard.md").read_text() == "the committed table\n"
    assert not (committed / "leaderboard.csv").exists()
    # named explicitly, a table kvlab did not write is still the user's: refused, untouched
    assert leaderboard.main(["--report-only", "--methods", "Full,StreamingLLM", "--tasks", "ppl",
                             "--out", str(committed)]) == 2
    assert "leaderboard.md was not written by kvlab" in capsys.readouterr().err
    assert (committed / "leaderboard.md").read_text() == "the committed table\n"
    # once the folder's manifest lists it (an earlier leaderboard run wrote it), the report rewrites it
    (committed / ".kvlab-outputs").write_text("leaderboard.md\n")
    assert leaderboard.main(["--report-only", "--methods", "Full,StreamingLLM", "--tasks", "ppl",
                             "--out", str(committed)]) == 0
    assert "StreamingLLM" in (committed / "leaderboard.md").read_text()


@pytest.mark.parametrize("method", ["sepllm", "dhsa", "eval", "kernels", "orthorank"])
def test_benches_write_under_build_by_default(method, monkeypatch):
    import argparse
    import importlib

    class Parsed(Exception):
        pass

    def parse_args(self, args=None, namespace=None):
        raise Parsed(self.get_default("out"))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
    module = importlib.import_module(f"kvlab.experiments.bench.{method}")
    with pytest.raises(Parsed) as got:
        module.main(["ops"] if method != "orthorank" else ["layer"])
    assert not str(got.value.args[0]).startswith("benchmarks"), got.value.args[0]


@pytest.mark.parametrize("spec", [("v", 3.9, 1), ("v", True, False), ("v", 3, 1.0), (1, 3, 1)])
def test_reform_head_specs_are_not_coerced(spec):
    from kvlab.reform.api import parse_heads

    with pytest.raises(TypeError, match="heads"):
        parse_heads([spec])
    assert parse_heads([("v", 3, 1)])[0].layer == 3


def test_reform_heads_file_without_signature_is_refused(tmp_path, tiny_llama):
    from kvlab.reform.api import load_heads

    path = tmp_path / "heads.json"
    path.write_text(json.dumps({"heads": ["v:1:0"]}))
    with pytest.raises(ValueError, match="no 'signature'.*any_model=True"):
        load_heads(str(path), tiny_llama)
    assert [str(h) for h in load_heads(str(path), tiny_llama, any_model=True)] == ["v:1:0"]


def test_streaming_perplexity_batch_refuses_texts_of_different_lengths(tiny_llama):
    from kvlab.eval import streaming_perplexity_batch

    torch.manual_seed(0)
    long, short = torch.randint(0, 96, (1, 40)), torch.randint(0, 96, (1, 4))
    with pytest.raises(ValueError, match=r"different lengths in tokens \(\[40, 4\]\)"):
        streaming_perplexity_batch(tiny_llama, TOK, [long, short], Full(), None, progress=False)
    cut = streaming_perplexity_batch(tiny_llama, TOK, [long, short], Full(), None, progress=False, truncate=True)
    assert [r.nll.numel() for r in cut] == [3, 3]


# =========================================================================== unclear errors
def test_kv_cache_made_for_4_layers_used_on_more_layers():
    small, big = tiny_llama(layers=2), tiny_llama(layers=4)
    ids = torch.randint(0, 96, (1, 6))
    with torch.no_grad(), pytest.raises(ValueError, match="made for a model with 2 layers.*has 4"):
        big(input_ids=ids, past_key_values=KVCache(small, Full()), use_cache=True)


@pytest.mark.parametrize("bad", [200, -1])
def test_reform_context_ids_out_of_vocabulary(tiny_llama, bad):
    from kvlab.reform import reform_gather

    context = torch.randint(0, 96, (1, 300))
    context[0, 17] = bad
    with pytest.raises(ValueError, match=r"context must be token ids in \[0, 96\)"):
        reform_gather(tiny_llama, TOK, context, torch.randint(0, 96, (1, 5)), heads=["v:0:0"], progress=False)


def test_reform_context_of_three_dimensions(tiny_llama):
    from kvlab.reform import reform_gather

    with pytest.raises(ValueError, match=r"context must be .* \(seq,\) or \(1, seq\), got \(1, 1, 300\)"):
        reform_gather(tiny_llama, TOK, torch.randint(0, 96, (1, 1, 300)), torch.randint(0, 96, (1, 5)),
                      heads=["v:0:0"], progress=False)


def test_sepllm_with_no_separators_says_it_is_a_window_cache():
    from kvlab.sepllm.policy import FixLLM, SepLLM, SepLLMStreaming

    with pytest.warns(UserWarning, match=r"SepLLM\(separators=\[\]\) has no separator ids.*StreamingLLM"):
        SepLLM(3, 16, separators=[])
    with pytest.warns(UserWarning, match="SepLLMStreaming"):
        SepLLMStreaming(4, 8, 16, 40, separators=[])
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FixLLM(3, 16, 8)  # no separators by design
        SepLLM(3, 16, separators=[5])


@pytest.mark.parametrize("every, error, match", [(0, ValueError, ">= 1"), (-5, ValueError, ">= 1"),
                                                 (2.5, TypeError, "must be an int"),
                                                 (1000, ValueError, "<= 19 \\(the tokens this run scored\\)")])
def test_ppl_curve_block_size(tiny_llama, every, error, match):
    from kvlab.eval import streaming_perplexity

    result = streaming_perplexity(tiny_llama, TOK, torch.randint(0, 96, (1, 20)), Full(), None, progress=False)
    assert result.ppl_curve(19).numel() == 1
    with pytest.raises(error, match=f"every must be {match}" if error is ValueError else match):
        result.ppl_curve(every)


def test_load_text_with_a_repeated_document():
    from kvlab.datasets import load_documents, load_text

    with pytest.raises(ValueError, match="'emma' more than once"):
        load_text("austen", documents=["emma", "emma"])
    with pytest.raises(ValueError, match="more than once"):
        load_documents("austen", documents=["emma", "persuasion", "emma"])


def _grid(tmp_path, body: str) -> str:
    path = tmp_path / "grid.yaml"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_sweep_name_with_a_missing_field(tmp_path, capsys):
    from kvlab.experiments.sweep import main

    grid = _grid(tmp_path, """
        target: numpy:arange
        name: "y{y}"
        grid: {stop: [1, 2]}
    """)
    assert main([grid, "--dry-run"]) == 2
    assert "uses {y}, which is not a parameter; the parameters are ['stop']" in capsys.readouterr().err


@pytest.mark.parametrize("body, message", [
    ("target: numpy:arange\ngrid: {stop: 3}\n", "grid entry 'stop' must be a non-empty list"),
    ("target: numpy:arange\nname: same\ngrid: {stop: [1, 2]}\n", "same name ['same']"),
    ("- a\n- b\n", "a grid file is a YAML mapping"),
])
def test_sweep_bad_grid_files_are_one_sentence(tmp_path, capsys, body, message):
    from kvlab.experiments.sweep import main

    assert main([_grid(tmp_path, body), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_sweep_unreachable_scheduler_fails_fast(tmp_path):
    import socket

    from kvlab.experiments.sweep import Task, run_sweep

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    begin = time.perf_counter()
    with pytest.raises(ConnectionError, match=f"no Dask scheduler answers at tcp://127.0.0.1:{port}"):
        run_sweep([Task("a", "numpy:arange", {"stop": 3})], tmp_path, scheduler=f"tcp://127.0.0.1:{port}",
                  progress=False)
    assert time.perf_counter() - begin < 20


@pytest.mark.parametrize("flags, message", [(["--workers", "0"], "--workers must be >= 1, got 0"),
                                            (["--retries", "-1"], "--retries must be >= 0, got -1")])
def test_sweep_worker_and_retry_counts(tmp_path, capsys, flags, message):
    from kvlab.experiments.sweep import main

    grid = _grid(tmp_path, "target: numpy:arange\ngrid: {stop: [1]}\n")
    assert main([grid, *flags]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("target, message", [("kvlab.no_such_module:f", "does not import"),
                                             ("numpy:no_such_function", "has no function 'no_such_function'"),
                                             ("nowhere.ipynb", "does not exist")])
def test_sweep_invalid_target_is_found_before_the_cluster_starts(tmp_path, monkeypatch, target, message):
    from kvlab.experiments import sweep

    def no_cluster(*args, **kwargs):
        raise AssertionError("a cluster was started for a target that cannot run")

    monkeypatch.setattr(sweep, "local_cluster", no_cluster)
    with pytest.raises(ValueError, match=message):
        sweep.run_sweep([sweep.Task("a", target, {})], tmp_path, progress=False)


@pytest.mark.parametrize("flags, message", [(["--methods", "Bogus"], "--methods must be among"),
                                            (["--workers", "-1"], "--workers must be >= 1, got -1")])
def test_leaderboard_bad_methods_and_workers(tmp_path, capsys, flags, message):
    from kvlab.experiments import leaderboard

    assert leaderboard.main(["--report-only", "--out", str(tmp_path), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_leaderboard_truncated_cell_is_named_and_other_grids_are_not_read(tmp_path, capsys):
    from kvlab.experiments import leaderboard

    cells = tmp_path / "cells"
    _committed_ppl_cells(cells)
    (cells / "another-grid-cell.json").write_text("{not json")  # another grid's file: never read
    assert leaderboard.main(["--report-only", "--out", str(tmp_path), "--methods", "Full", "--tasks", "ppl"]) == 0
    broken = cells / "smollm2-135m-s0-ppl-Full-b0.json"
    broken.write_text(broken.read_text()[:50])
    assert leaderboard.main(["--report-only", "--out", str(tmp_path), "--methods", "Full", "--tasks", "ppl"]) == 2
    assert f"leaderboard cell file {broken} is damaged" in capsys.readouterr().err


def test_papermill_negative_parameter_fails_in_the_check_cell(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    papermill = pytest.importorskip("papermill")
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("max_tokens: int = 4096  # tokens to stream\nlabel: str = 'x'  # a name")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell("import kvlab\nkvlab.check_parameters(globals())"),
                nbformat.v4.new_code_cell("print('work that should not run')")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    src, out = tmp_path / "nb.ipynb", tmp_path / "out.ipynb"
    nbformat.write(nb, src)
    with pytest.raises(papermill.PapermillExecutionError, match="max_tokens must be >= 0 .its default is 4096.*got -5"):
        papermill.execute_notebook(str(src), str(out), parameters={"max_tokens": -5}, progress_bar=False,
                                   kernel_name="python3")
    papermill.execute_notebook(str(src), str(out), parameters={"max_tokens": 5}, progress_bar=False,
                               kernel_name="python3")


# =========================================================================== faults
def test_kill_9_of_fetch_stops_its_pip_child(tmp_path):
    pidfile = tmp_path / "child.pid"
    script = textwrap.dedent(f"""
        import sys
        from kvlab.assets.fetcher import _run_child
        _run_child([sys.executable, "-c", "import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); "
                    "time.sleep(60)"], progress=False)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    try:
        deadline = time.time() + 30
        while not (pidfile.exists() and pidfile.read_text()) and time.time() < deadline:
            time.sleep(0.1)
        child = int(pidfile.read_text())
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.time() + 10
        while _alive(child) and time.time() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "the pip child kept running after kill -9 of kvlab fetch"
    finally:
        if parent.poll() is None:
            parent.kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by init) is not running
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_stale_fetch_temporaries_are_cleaned_on_the_next_run(cache, asset_shelf, monkeypatch):
    from kvlab.assets import fetch
    from test_robustness_assets import TEXT, add_asset

    add_asset(monkeypatch, asset_shelf[0], "tiny-text", {"tiny.txt": TEXT.encode()})
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    downloads, folder = cache / "downloads", cache / "assets" / "tiny-text"
    downloads.mkdir(parents=True)
    folder.mkdir(parents=True)
    stale_download = downloads / f".pkg.whl.kvlab{dead}.abc123"
    stale_download.mkdir()
    (stale_download / "pkg.whl").write_bytes(b"x" * 1000)
    stale_extract = folder / f".tiny.txt.kvlab{dead}.def456.tmp"
    stale_extract.write_bytes(b"")
    mine = downloads / f".other.whl.kvlab{os.getpid()}.zzz"  # a live process's temporary: left alone
    mine.mkdir()
    fetch("tiny-text", progress=False)
    assert not stale_download.exists() and not stale_extract.exists()
    assert mine.exists()


def test_niah_prompt_with_a_short_haystack_is_linear():
    from kvlab.datasets import niah_prompt
    from kvlab.models import load_tokenizer

    tok = load_tokenizer("smollm2-135m")
    hay = ("The quick brown fox jumps over the lazy dog near the river bank. " * 14)[:900]
    begin = time.perf_counter()
    prompt = niah_prompt(tok, hay, 20000, 0.5)
    seconds = time.perf_counter() - begin
    assert 19000 < prompt.n_tokens <= 20000
    assert seconds < 15, f"niah_prompt took {seconds:.1f} s for 20k tokens"


# =========================================================================== under load (CPU threads)
def test_threads_per_process_follow_kvlab_threads_and_the_workers(monkeypatch):
    from kvlab import threads

    monkeypatch.delenv("KVLAB_THREADS", raising=False)
    cores = threads.cpu_cores()
    assert threads.default_threads() == max(1, cores - 1)  # one core left to the rest of the machine
    assert threads.default_threads(workers=cores * 2) == 1
    assert threads.default_threads(workers=2) == max(1, (cores - 1) // 2)
    monkeypatch.setenv("KVLAB_THREADS", "3")
    assert threads.default_threads(workers=4) == 3
    assert threads.worker_env(2) == {"KVLAB_THREADS": "3", "OMP_NUM_THREADS": "3"}
    for bad in ("0", "-2", "two"):
        monkeypatch.setenv("KVLAB_THREADS", bad)
        with pytest.raises(ValueError, match="KVLAB_THREADS must be a whole number of threads >= 1"):
            threads.default_threads()


def test_sweep_workers_compute_with_their_share_of_the_cores(tmp_path, monkeypatch):
    from kvlab.experiments.sweep import Task, run_sweep

    monkeypatch.setenv("KVLAB_THREADS", "2")  # the user's choice reaches every worker kvlab starts
    tasks = [Task(f"t{i}", "torch:get_num_threads", {}) for i in range(2)]
    report = run_sweep(tasks, tmp_path, workers=2, progress=False)
    assert not report.failed
    assert [json.loads((tmp_path / f"t{i}.json").read_text())["result"] for i in range(2)] == [2, 2]
