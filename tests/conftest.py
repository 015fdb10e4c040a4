"""Shared fixtures: tiny random models of the three supported architectures (fast, no download)."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

# Triton reads TRITON_INTERPRET when it is imported. scripts/test.sh exports it before pytest; for a plain
# `pytest` run without a GPU this sets it before any test module can import triton.
_INTERPRET_IN_TIME = True
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    _INTERPRET_IN_TIME = "triton" not in sys.modules
    os.environ["TRITON_INTERPRET"] = "1"
TRITON_READY = importlib.util.find_spec("triton") is not None and _INTERPRET_IN_TIME


def import_script(rel: str):
    """Import a script of the repository (``benchmarks/x.py``) by its file name; its folder goes on sys.path,
    which spawned workers inherit."""
    import importlib
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / rel
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    return importlib.import_module(path.stem)


def pytest_addoption(parser):
    parser.addoption("--max-test-seconds", type=float, default=None, metavar="S",
                     help="fail the run when one test (its setup, call and teardown together) takes more than S "
                          "seconds; the README's test command sets it (scripts/test.sh)")


def pytest_configure(config):
    config.addinivalue_line("markers", "triton: runs Triton kernels (on CUDA, or in the interpreter on CPU)")


_SECONDS: dict[str, float] = {}  # test id -> seconds of its setup, call and teardown


def pytest_runtest_logreport(report):
    """Sum each test's phases (with pytest-xdist the controller receives every worker's reports)."""
    _SECONDS[report.nodeid] = _SECONDS.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    """The time guard: every test over --max-test-seconds is named, and the run fails."""
    limit = session.config.getoption("--max-test-seconds")
    if limit is None or hasattr(session.config, "workerinput"):
        return
    over = sorted(((s, n) for n, s in _SECONDS.items() if s > limit), reverse=True)
    if over:
        lines = "\n".join(f"  {s:7.1f} s  {n}" for s, n in over)
        session.config.get_terminal_writer().line(
            f"kvlab: {len(over)} test(s) took more than {limit:g} s (setup + call + teardown); make them faster "
            f"with a smaller fixture on the same code path, or move them to the GPU suite:\n{lines}", red=True)
        if session.exitstatus == 0:
            session.exitstatus = 1


def pytest_collection_modifyitems(config, items):
    if TRITON_READY:
        return
    skip = pytest.mark.skip(reason="needs triton, and CUDA or TRITON_INTERPRET=1 set before triton is imported")
    for item in items:
        if "triton" in item.keywords:
            item.add_marker(skip)


def _tiny(arch: str):
    from transformers import (Gemma3TextConfig, Gemma3ForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM)

    from kvlab.core import attach

    common = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(0)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif arch == "gemma3":
        cfg = Gemma3TextConfig(**common, head_dim=16, sliding_window=8,
                               layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                            "sliding_attention"])
        model = Gemma3ForCausalLM(cfg)
    else:  # pragma: no cover
        raise ValueError(arch)
    model.eval()
    return attach(model)


@pytest.fixture(scope="session", params=["llama", "qwen2", "gemma3"])
def tiny_model(request):
    return _tiny(request.param)


@pytest.fixture(scope="session")
def tiny_llama():
    return _tiny("llama")


@pytest.fixture(scope="session")
def tiny_gemma():
    return _tiny("gemma3")


class IdTokenizer:
    """Stands in for a tokenizer when the text already is token ids."""

    eos_token_id = None


@pytest.fixture
def ids():
    torch.manual_seed(1)
    return torch.randint(0, 96, (1, 48))


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors gain nothing from threads, and a busy machine makes extra threads very slow.
    Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty kvlab cache for the test (``KVLAB_CACHE``)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("KVLAB_CACHE", str(root))
    return root


@pytest.fixture
def asset_shelf(tmp_path, monkeypatch):
    """Archives served from a local folder instead of the network: ``(folder, calls)``, where ``calls`` records
    each download asked for; an archive missing from the folder fails as a network error would."""
    from pathlib import Path

    from kvlab.assets import fetcher

    folder = tmp_path / "shelf"
    folder.mkdir()
    calls: list[str] = []

    def download(source, dest_dir, *, progress):
        calls.append(source.filename)
        if not (folder / source.filename).exists():
            raise OSError(f"{source.filename}: no network in this test")
        target = Path(dest_dir) / source.filename
        target.write_bytes((folder / source.filename).read_bytes())
        return target

    monkeypatch.setattr(fetcher, "_download_archive", download)
    return folder, calls
