"""Damage found without the user asking, and bad arguments to load_model (issue 17).

Every case asserts the error type and a key phrase of its message, or the correct result. The
damage cases run on tiny assets made here (a wheel of a few bytes, a GGUF of a 2-layer model)
in a temporary KVLAB_CACHE; the one network function is replaced, nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import socket
import sys
import time
import tomllib
import zipfile
from pathlib import Path

import numpy as np
import pytest

from kvlab import assets, datasets, models
from kvlab.assets import Asset, CacheDirError, DamagedAssetError, Source, fetcher, integrity, registry, weights

REPO = Path(__file__).resolve().parents[1]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- tiny assets


@pytest.fixture
def shelf(asset_shelf):
    return asset_shelf


def add_asset(monkeypatch, shelf_dir: Path, asset_id: str, files: dict[str, bytes], *, kind: str = "corpus",
              collection: bool = False, filename: str | None = None) -> Asset:
    """A one-wheel asset: a single file (``files`` has one entry) or a collection, registered for the test."""
    wheel = shelf_dir / f"{asset_id.replace('-', '_')}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in files.items():
            z.writestr(f"pkg/data/{name}", data)
    members = ("pkg/data/*",) if collection else tuple(f"pkg/data/{n}" for n in files)
    source = Source(asset_id, "1.0", "wheel", wheel.name, sha(wheel.read_bytes()), wheel.stat().st_size, members)
    if collection:
        documents = {n: registry.Document(len(d), sha(d)) for n, d in files.items()}
        digest = sha(integrity.manifest({n: d.sha256 for n, d in documents.items()}).encode())
        size = sum(len(d) for d in files.values())
    else:
        (data,) = files.values()
        documents, digest, size = None, sha(data), len(data)
    asset = Asset(id=asset_id, kind=kind, sources=(source,), sha256=digest,
                  filename=filename or (asset_id if collection else next(iter(files))), licence="test",
                  description="test asset", stands_in_for="nothing", collection=collection, size=size,
                  files=documents)
    monkeypatch.setitem(assets.ASSETS, asset_id, asset)
    return asset


def keep_mtime_write(path: Path, data: bytes) -> None:
    """Change a file's bytes in place but keep its size and mtime (bits flipped on the disk)."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*")] if root.exists() else []


TEXT = "It was the best of times, it was the worst of times.\n" * 40


# --------------------------------------------------------------------------- the registry is data


def test_registry_is_json_package_data_with_sizes():
    spec = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "assets/*.json" in spec["tool"]["setuptools"]["package-data"]["kvlab"]
    raw = json.loads((REPO / "kvlab" / "assets" / "registry.json").read_text())
    assert [a["id"] for a in raw["assets"]] == list(assets.ASSETS)
    assert not (REPO / "kvlab" / "assets.py").exists()
    for asset in assets.ASSETS.values():
        assert isinstance(asset.size, int) and asset.size > 0, asset.id
        if asset.collection:
            # the per-file record gives the pinned manifest, the total size and data/manifests/<id>.sha256
            text = integrity.manifest({n: d.sha256 for n, d in asset.files.items()})
            assert sha(text.encode()) == asset.sha256
            assert sum(d.size for d in asset.files.values()) == asset.size
            assert (REPO / "data" / "manifests" / f"{asset.id}.sha256").read_text() == text


def test_registry_typo_is_named():
    raw = json.loads((REPO / "kvlab" / "assets" / "registry.json").read_text())
    raw["assets"][0]["sha265"] = raw["assets"][0].pop("sha256")
    with pytest.raises(ValueError, match=r"smollm2-135m.*unknown field\(s\) \['sha265'\].*missing field\(s\) \['sha256'\]"):
        registry.parse_registry(json.dumps(raw))


# --------------------------------------------------------------------------- a damaged cached corpus


def test_truncated_corpus_is_not_cached_and_is_fetched_again(cache, shelf, monkeypatch, capsys):
    shelf_dir, calls = shelf
    add_asset(monkeypatch, shelf_dir, "tiny-text", {"wiki.utf8": TEXT.encode()})
    path = assets.fetch("tiny-text", progress=False)
    path.write_bytes(TEXT.encode()[:300])  # cut, as `wiki.utf8` cut to 1 MB
    assert assets.problem("tiny-text") == f"{path} has 300 bytes, the registry says {len(TEXT)}"
    assert not assets.is_cached("tiny-text") and assets.cache_state("tiny-text") == "damaged"
    assert assets.main(["--list"]) == 0
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if " tiny-text " in l)
    assert "damaged" in line and "cached" not in line
    assert "`python -m kvlab fetch tiny-text` fetches it again" in out
    # fetch (and so load_text) finds it, says so, and builds it again from the kept archive
    assert assets.fetch("tiny-text", progress=False).read_text() == TEXT
    assert "damaged" in capsys.readouterr().err and calls == ["tiny_text-1.0-py3-none-any.whl"]
    assert assets.is_cached("tiny-text") and leftovers(cache) == []


def test_load_text_of_a_truncated_corpus_returns_the_whole_text(cache, shelf, monkeypatch):
    shelf_dir, _ = shelf
    add_asset(monkeypatch, shelf_dir, "tiny-book", {"book.txt": TEXT.encode()})
    monkeypatch.setitem(datasets._TEXT_LAYOUT, "tiny-book", "single")
    datasets._documents.cache_clear()
    try:
        path = assets.fetch("tiny-book", progress=False)
        path.write_bytes(TEXT.encode()[: len(TEXT) // 2])
        assert datasets.load_text("tiny-book") == TEXT.strip("\n") + "\n"
    finally:
        datasets._documents.cache_clear()


def test_bits_flipped_in_place_are_found_by_the_digest(cache, shelf, monkeypatch, capsys):
    shelf_dir, _ = shelf
    add_asset(monkeypatch, shelf_dir, "tiny-text", {"wiki.utf8": TEXT.encode()})
    path = assets.fetch("tiny-text", progress=False)
    keep_mtime_write(path, b"It was the BEST")
    # this process hashed it when it wrote it and remembers the digest under (path, size, mtime, inode):
    # a flip that keeps all four is found by --verify ...
    assert assets.fetch("tiny-text", progress=False).read_bytes().startswith(b"It was the BEST")
    assert assets.main(["--verify", "--quiet", "tiny-text"]) == 0
    assert "has sha256" in capsys.readouterr().err and path.read_text() == TEXT
    # ... and by the first use in any other process (simulated: forget what was hashed)
    keep_mtime_write(path, b"It was the BEST")
    integrity._DIGESTS.clear()
    assert assets.problem("tiny-text", digest="never") is None  # the size alone cannot see it
    assert re.fullmatch(rf"{re.escape(str(path))} has sha256 [0-9a-f]{{64}}, the registry says {sha(TEXT.encode())}",
                        assets.problem("tiny-text"))
    assert not assets.is_cached("tiny-text")  # small files: --list hashes them
    assert assets.fetch("tiny-text", progress=False).read_text() == TEXT


def test_damaged_copy_that_cannot_be_fetched_again_names_file_and_fix(cache, shelf, monkeypatch):
    shelf_dir, _ = shelf
    asset = add_asset(monkeypatch, shelf_dir, "tiny-text", {"wiki.utf8": TEXT.encode()})
    path = assets.fetch("tiny-text", progress=False)
    path.write_bytes(b"cut")
    (cache / "downloads" / asset.sources[0].filename).unlink()
    (shelf_dir / asset.sources[0].filename).unlink()  # and no network
    with pytest.raises(DamagedAssetError) as err:
        assets.fetch("tiny-text", progress=False)
    message = str(err.value)
    assert f"{path} has 3 bytes, the registry says {len(TEXT)}" in message
    assert f"delete {path} and re-run `python -m kvlab fetch tiny-text`" in message
    assert "no network in this test" in message


def test_damaged_collection_names_the_document(cache, shelf, monkeypatch, capsys):
    shelf_dir, _ = shelf
    books = {"emma.txt": b"Emma Woodhouse, handsome, clever, and rich.\n", "persuasion.txt": b"Sir Walter Elliot.\n"}
    add_asset(monkeypatch, shelf_dir, "tiny-novels", books, collection=True, filename="novels")
    folder = assets.fetch("tiny-novels", progress=False)
    (folder / "emma.txt").write_bytes(b"Emma")
    assert assets.problem("tiny-novels") == f"{folder / 'emma.txt'} has 4 bytes, the registry says {len(books['emma.txt'])}"
    (folder / "emma.txt").unlink()
    assert "lacks 1 of its documents (emma.txt)" in assets.problem("tiny-novels")
    assert assets.fetch("tiny-novels", progress=False).joinpath("emma.txt").read_bytes() == books["emma.txt"]
    (folder / "notes.txt").write_text("a stray file would be read as one more book\n")
    assert "not part of tiny-novels (notes.txt)" in assets.problem("tiny-novels")
    assert sorted(p.name for p in assets.fetch("tiny-novels", progress=False).iterdir()) == [
        "SHA256SUMS", "emma.txt", "persuasion.txt"]
    assert leftovers(cache) == []


def test_interrupted_fetch_and_repair_leave_nothing_half_written(cache, shelf, monkeypatch):
    shelf_dir, _ = shelf
    add_asset(monkeypatch, shelf_dir, "tiny-text", {"wiki.utf8": TEXT.encode()})
    final = assets.asset_path("tiny-text")
    real_concatenate = fetcher.concatenate

    def sigint_midway(sources, archives, out, h, progress):
        out.write(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(fetcher, "concatenate", sigint_midway)  # SIGINT during extraction
    with pytest.raises(KeyboardInterrupt):
        assets.fetch("tiny-text", progress=False)
    assert not final.exists() and leftovers(cache) == []
    monkeypatch.setattr(fetcher, "concatenate", real_concatenate)
    assert assets.fetch("tiny-text", progress=False).read_text() == TEXT
    final.write_bytes(b"damaged")
    monkeypatch.setattr(fetcher, "concatenate", sigint_midway)  # SIGINT while repairing
    with pytest.raises(KeyboardInterrupt):
        assets.fetch("tiny-text", progress=False)
    assert final.read_bytes() == b"damaged" and leftovers(cache) == []  # still found next time
    monkeypatch.setattr(fetcher, "concatenate", real_concatenate)
    assert assets.fetch("tiny-text", progress=False).read_text() == TEXT


def test_corpus_that_is_not_utf8_names_file_and_fix(cache, shelf, monkeypatch):
    shelf_dir, _ = shelf
    add_asset(monkeypatch, shelf_dir, "tiny-latin", {"book.txt": "caf\u00e9 au lait\n".encode("latin-1")})
    add_asset(monkeypatch, shelf_dir, "tiny-book", {"book.txt": TEXT.encode()})
    monkeypatch.setitem(datasets._TEXT_LAYOUT, "tiny-latin", "single")
    monkeypatch.setitem(datasets._TEXT_LAYOUT, "tiny-book", "single")
    datasets._documents.cache_clear()
    try:
        # a registry entry whose text is not UTF-8
        with pytest.raises(DamagedAssetError) as err:
            datasets.load_text("tiny-latin")
        path = assets.asset_path("tiny-latin")
        assert f"{path} is not UTF-8 text (byte 0xe9 at offset 3)" in str(err.value)
        assert f"delete {path} and re-run `python -m kvlab fetch tiny-latin`" in str(err.value)
        # a file damaged in place after this process checked it
        path = assets.fetch("tiny-book", progress=False)
        keep_mtime_write(path, b"\xff\xfe")
        with pytest.raises(DamagedAssetError, match="is not UTF-8 text .byte 0xff at offset 0."):
            datasets.load_text("tiny-book")
    finally:
        datasets._documents.cache_clear()


# --------------------------------------------------------------------------- the cache directory


def test_kvlab_cache_pointing_at_a_file(tmp_path, monkeypatch, capsys):
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("x")
    monkeypatch.setenv("KVLAB_CACHE", str(a_file))
    with pytest.raises(CacheDirError, match=rf"KVLAB_CACHE={re.escape(str(a_file))} is a file, not a directory: "
                                            r"point KVLAB_CACHE at a directory"):
        assets.fetch("wikitext")
    datasets._documents.cache_clear()  # a text loaded earlier in this process is served from memory
    with pytest.raises(CacheDirError, match="is a file"):
        datasets.load_text("wikitext")
    assert assets.main(["--list"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "KVLAB_CACHE=" in err and "Traceback" not in err


def test_kvlab_cache_read_only(tmp_path, cache, shelf, monkeypatch):
    shelf_dir, _ = shelf
    add_asset(monkeypatch, shelf_dir, "tiny-text", {"wiki.utf8": TEXT.encode()})
    add_asset(monkeypatch, shelf_dir, "tiny-other", {"other.txt": b"other\n"})
    path = assets.fetch("tiny-text", progress=False)
    integrity._CHECKED_DIRS.clear()
    if os.geteuid() == 0:  # root writes through permission bits: make the write probe fail as a read-only mount would
        real_mkstemp = integrity.tempfile.mkstemp

        def read_only(*args, dir=None, **kwargs):
            if dir is not None and Path(dir).resolve() == cache.resolve():
                raise PermissionError(13, "Permission denied")
            return real_mkstemp(*args, dir=dir, **kwargs)

        monkeypatch.setattr(integrity.tempfile, "mkstemp", read_only)
    else:
        for p in (cache, *cache.rglob("*")):
            if p.is_dir():
                p.chmod(0o555)
    try:
        # reading what is there works (a shared read-only cache is fine) ...
        assert assets.fetch("tiny-text", progress=False) == path
        # ... and what needs writing gets one message naming the variable and the fix
        with pytest.raises(CacheDirError) as err:
            assets.fetch("tiny-other", progress=False)
        assert re.search(rf"KVLAB_CACHE={re.escape(str(cache))} cannot be written \(Permission denied\)", str(err.value))
        assert "point KVLAB_CACHE at a directory you can write" in str(err.value)
    finally:
        for p in (cache, *cache.rglob("*")):
            if p.is_dir():
                p.chmod(0o755)


# --------------------------------------------------------------------------- load_model's arguments


def test_empty_name_is_refused():
    with pytest.raises(ValueError, match="model name is empty .an empty path would mean the current directory."):
        models.load_model("")
    with pytest.raises(ValueError, match="model name is empty"):
        models.load_model("  ")


def test_directory_that_is_not_a_model(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError) as err:
        models.load_model(str(tmp_path), device="cpu")
    message = str(err.value)
    assert "is a directory but not a model directory" in message
    for needed in ("config.json", "model.safetensors", "tokenizer.json"):
        assert needed in message
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="It holds m.gguf: pass that file's path instead"):
        models.load_model(str(tmp_path), device="cpu")
    with pytest.raises(ValueError, match="is a file but not a .gguf file"):
        models.load_model(str(tmp_path / "notes.txt"), device="cpu")


def test_truncated_safetensors_in_a_model_directory(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    tiny = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2))
    tiny.save_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    weights_file = tmp_path / "model.safetensors"
    data = weights_file.read_bytes()
    weights_file.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError) as err:
        models.load_model(str(tmp_path), device="cpu")
    assert f"{weights_file} has {len(data) // 2} bytes, but its header describes {len(data)}: the file is truncated" \
        in str(err.value)
    assert f"replace {weights_file} with a complete copy" in str(err.value)
    weights_file.write_bytes(data[:5])
    assert "fewer than a safetensors header" in weights.safetensors_problem(weights_file)


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_hub_id_without_a_hub_fails_fast_and_lists_local_ids(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy",
                "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    start = time.monotonic()
    with pytest.raises(ConnectionError) as err:
        models.load_model("kvlab-test/no-such-model", device="cpu")
    assert time.monotonic() - start < 10
    assert "no Hugging Face hub is reachable" in str(err.value)
    assert all(model_id in str(err.value) for model_id in models.MODEL_IDS)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConnectionError, match="HF_HUB_OFFLINE .or TRANSFORMERS_OFFLINE. is set.*smollm2-135m"):
        models.load_model("kvlab-test/no-such-model", device="cpu")


def test_missing_gpu_is_refused_before_any_weights_are_read(monkeypatch):
    import torch

    def no_loading(*args, **kwargs):
        raise AssertionError("weights were looked up before the device was checked")

    monkeypatch.setattr(models, "_source", no_loading)
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"this machine has \d+ CUDA GPU"):
            models.load_model("smollm2-135m", device=f"cuda:{torch.cuda.device_count()}")
    else:
        with pytest.raises(ValueError, match="asks for a CUDA GPU, but torch sees none") as err:
            models.load_model("smollm2-135m", device="cuda")
        assert "device='cpu'" in str(err.value)
    with pytest.raises(ValueError, match="device='gpu' is not a device torch knows"):
        models.load_model("smollm2-135m", device="gpu")
    with pytest.raises(TypeError, match="dtype must be a torch.dtype or its name"):
        models.load_model("smollm2-135m", dtype=16, device="cpu")


# --------------------------------------------------------------------------- GGUF: truncated, converted, damaged


def _byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values (the alphabet of byte-level BPE)."""
    printable = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
    out, extra = [], 0
    for b in range(256):
        if b in printable:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def make_tiny_gguf(path: Path, seed: int = 0) -> Path:
    """A 2-layer Llama with a byte-level vocabulary of 259 tokens, float32, as llama.cpp lays it out."""
    import gguf

    rng = np.random.default_rng(seed)
    tokens = _byte_alphabet() + ["\u0120t", "he", "<|endoftext|>"]
    hidden, heads, kv_heads, ffn, layers = 32, 4, 2, 64, 2
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("kvlab-tiny")
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hidden // heads)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - 1) + [3])
    w.add_token_merges(["\u0120 t", "h e"])
    w.add_bos_token_id(len(tokens) - 1)
    w.add_eos_token_id(len(tokens) - 1)

    def rand(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    w.add_tensor("token_embd.weight", rand(len(tokens), hidden))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    w.add_tensor("output.weight", rand(len(tokens), hidden))
    head_dim = hidden // heads
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", rand(heads * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_k.weight", rand(kv_heads * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_v.weight", rand(kv_heads * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_output.weight", rand(hidden, heads * head_dim))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", rand(ffn, hidden))
        w.add_tensor(f"blk.{i}.ffn_up.weight", rand(ffn, hidden))
        w.add_tensor(f"blk.{i}.ffn_down.weight", rand(hidden, ffn))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_truncated_gguf_file_gets_a_clear_message(tmp_path):
    good = make_tiny_gguf(tmp_path / "tiny.gguf")
    assert weights.gguf_problem(good) is None
    data = good.read_bytes()
    cut = tmp_path / "cut.gguf"
    for n, phrase in ((len(data) - 10, "but its header describes"), (len(data) // 2, "but its header describes"),
                      (200, "ends inside its own header"), (10, "fewer than a GGUF header")):
        cut.write_bytes(data[:n])
        assert phrase in weights.gguf_problem(cut)
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError) as err:
        models.load_model(str(cut), device="cpu")
    assert f"is not a complete GGUF file: {cut} has {len(data) // 2} bytes" in str(err.value)
    assert "the file is truncated" in str(err.value)
    cut.write_bytes(b"PK\x03\x04" + data[4:])
    assert "does not start with the GGUF magic bytes" in weights.gguf_problem(cut)


def test_gguf_walk_agrees_with_the_real_default_model():
    path = assets.asset_path("smollm2-135m")
    if not path.exists():
        pytest.skip("the default model is not fetched (python -m kvlab fetch)")
    assert weights.gguf_problem(path) is None  # its header describes no more than the file holds
    assert path.stat().st_size == assets.ASSETS["smollm2-135m"].size


@pytest.fixture
def tiny_model_asset(cache, shelf, monkeypatch, tmp_path):
    """A kvlab model id whose GGUF is the tiny Llama above, served from the shelf."""
    import torch

    torch.set_num_threads(1)
    shelf_dir, calls = shelf
    gguf_bytes = make_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()
    asset = add_asset(monkeypatch, shelf_dir, "tiny-llama", {"tiny-llama.gguf": gguf_bytes}, kind="model")
    monkeypatch.setattr(models, "MODEL_IDS", (*models.MODEL_IDS, "tiny-llama"))
    return asset, calls, shelf_dir


def _embedding(model):
    return model.model.embed_tokens.weight.detach().clone()


def test_converted_copy_records_and_checks_its_files(tiny_model_asset, capsys):
    asset, calls, _ = tiny_model_asset
    model, tokenizer = models._load_raw("tiny-llama", device="cpu")
    reference = _embedding(model)
    folder = models.converted_path("tiny-llama")
    record = json.loads((folder / "kvlab-source.json").read_text())
    assert record["format"] == 2 and record["gguf_sha256"] == asset.sha256
    for name, meta in record["files"].items():
        data = (folder / name).read_bytes()
        assert meta == {"size": len(data), "sha256": sha(data)}
    assert set(record["files"]) >= {"model.safetensors", "config.json", "tokenizer.json"}
    assert models._converted_problem(folder, asset, digest="fresh") is None
    capsys.readouterr()

    # truncated (size, checked on every load): converted again, atomically, and the same weights come back
    weights_file = folder / "model.safetensors"
    data = weights_file.read_bytes()
    weights_file.write_bytes(data[: len(data) // 3])
    model, _ = models._load_raw("tiny-llama", device="cpu")
    err = capsys.readouterr().err
    assert f"{weights_file} has {len(data) // 3} bytes, the registry says {len(data)}" in err
    assert "converting it again" in err
    assert torch_equal(_embedding(model), reference) and weights_file.read_bytes() == data

    # bits flipped (sha256, checked on the first load in a process)
    flipped = bytearray(data)
    flipped[-100] ^= 0xFF
    keep_mtime_write(weights_file, bytes(flipped))
    integrity._DIGESTS.clear()  # a new process
    model, _ = models._load_raw("tiny-llama", device="cpu")
    assert "has sha256" in capsys.readouterr().err
    assert torch_equal(_embedding(model), reference)

    # a copy made by an older kvlab (no sizes and sums in its record) is made again
    record = json.loads((folder / "kvlab-source.json").read_text())
    del record["files"], record["format"]
    (folder / "kvlab-source.json").write_text(json.dumps(record))
    models._load_raw("tiny-llama", device="cpu")
    assert "written by an older kvlab" in capsys.readouterr().err
    assert "files" in json.loads((folder / "kvlab-source.json").read_text())

    # `fetch --verify` hashes the converted copy too
    assert assets.main(["--verify", "--quiet", "tiny-llama"], verify_model=models.verify_converted) == 0
    assert f"converted copy {folder} verified" in capsys.readouterr().out
    assert leftovers(folder.parent) == [] and calls == ["tiny_llama-1.0-py3-none-any.whl"]


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)


def test_damaged_converted_copy_that_cannot_be_rebuilt_says_what_to_delete(tiny_model_asset):
    asset, _, shelf_dir = tiny_model_asset
    models._load_raw("tiny-llama", device="cpu")
    folder = models.converted_path("tiny-llama")
    (folder / "model.safetensors").write_bytes(b"cut")
    assets.asset_path("tiny-llama").unlink()  # the GGUF is gone and its archive cannot be downloaded
    (shelf_dir / asset.sources[0].filename).unlink()
    with pytest.raises(DamagedAssetError) as err:
        models.load_model("tiny-llama", device="cpu")
    message = str(err.value)
    assert "the converted copy of 'tiny-llama' is damaged" in message and "has 3 bytes" in message
    assert f"delete {folder} and re-run kvlab.load_model('tiny-llama')" in message


def test_interrupted_conversion_leaves_nothing(tiny_model_asset, monkeypatch):
    def sigint(tmp, final):
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "put_in_place", sigint)
    with pytest.raises(KeyboardInterrupt):
        models._load_raw("tiny-llama", device="cpu")
    folder = models.converted_path("tiny-llama")
    assert not folder.exists() and leftovers(folder.parent) == []


def test_truncated_cached_gguf(tiny_model_asset, capsys):
    asset, calls, _ = tiny_model_asset
    gguf_path = assets.fetch("tiny-llama", progress=False)
    data = gguf_path.read_bytes()
    gguf_path.write_bytes(data[: len(data) // 2])
    # given by path: one sentence with the fix
    with pytest.raises(DamagedAssetError) as err:
        models.load_model(str(gguf_path), device="cpu")
    assert "the file is truncated" in str(err.value)
    assert f"delete {gguf_path} and re-run `python -m kvlab fetch tiny-llama`" in str(err.value)
    # by id: the size check finds it, the GGUF is fetched again and converted
    model, _ = models._load_raw("tiny-llama", device="cpu")
    assert gguf_path.read_bytes() == data and "damaged" in capsys.readouterr().err
    assert model.config.num_hidden_layers == 2
