"""The cache directory and what kvlab checks on its own about the files in it.

Checks, and why they are placed where they are:

* **Size, on every access.** A ``stat`` costs nothing, and a truncated or grown file is the
  common damage (an interrupted copy, a full disk, an editor). :func:`problem` compares every
  cached file with the size in the registry; ``is_cached`` and ``fetch --list`` use it too.
* **sha256, once per process per file.** :func:`sha256_file` remembers a digest under the
  file's path, size, mtime and inode, so a file is hashed the first time a process uses it
  (and again when it was replaced or touched). Hashing runs at about 1-2 GB/s, a small part of
  what reading and parsing the same bytes costs afterwards (a corpus is tokenized, a model
  dequantized), and it catches bits flipped in place. ``fetch --list`` hashes only files up to
  :data:`LIST_DIGEST_MAX_BYTES` (all corpora) so that listing stays instant with 2 GB of models.
* ``fetch --verify`` hashes every file again, ignoring what this process remembers.

The cache directory itself (``$KVLAB_CACHE`` or the user cache dir) is checked once per
process: :func:`checked_cache_dir` raises one :class:`CacheDirError` naming the variable and
the fix when it is a file or cannot be written.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path

from kvlab.assets.registry import Asset, get_asset

__all__ = [
    "ChecksumError",
    "DamagedAssetError",
    "CacheDirError",
    "cache_dir",
    "checked_cache_dir",
    "asset_path",
    "sha256_file",
    "remember_digest",
    "manifest",
    "problem",
    "cache_state",
    "is_cached",
    "progress_bar",
    "MANIFEST",
    "LIST_DIGEST_MAX_BYTES",
    "damage_message",
    "file_problem",
]

CHUNK = 1 << 20
PROGRESS_MIN_BYTES = 16 << 20  # below this, extraction and hashing are too quick to need a bar
MANIFEST = "SHA256SUMS"
#: ``is_cached`` / ``fetch --list`` hash files up to this size (every corpus; not the GGUF models).
LIST_DIGEST_MAX_BYTES = 64 << 20


class ChecksumError(RuntimeError):
    """A downloaded archive or an extracted file does not have the pinned sha256."""


class DamagedAssetError(ChecksumError):
    """A cached file no longer is what the registry says (size, sha256 or text encoding)."""


class CacheDirError(OSError):
    """``$KVLAB_CACHE`` (or the default cache directory) is a file or cannot be written."""


# --------------------------------------------------------------------------- the cache directory


def cache_dir() -> Path:
    """Root of kvlab's cache: ``$KVLAB_CACHE`` if set, else the user cache dir's ``kvlab``."""
    env = os.environ.get("KVLAB_CACHE")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("kvlab", appauthor=False))


_CHECKED_DIRS: set[tuple[str, bool]] = set()


def _describe_root(root: Path) -> str:
    if os.environ.get("KVLAB_CACHE"):
        return f"KVLAB_CACHE={os.environ['KVLAB_CACHE']}"
    return f"kvlab's cache directory {root} (KVLAB_CACHE is not set)"


def checked_cache_dir(*, write: bool = False) -> Path:
    """:func:`cache_dir`, checked once per process: a directory (or absent), and writable if ``write``.

    Raises :class:`CacheDirError` with one message naming ``KVLAB_CACHE`` and the fix.
    """
    root = cache_dir()
    key = (str(root), write)
    if key in _CHECKED_DIRS:
        return root
    fix = ("point KVLAB_CACHE at a directory you can write (it is created if missing), "
           "e.g. `export KVLAB_CACHE=~/kvlab-cache`, or unset it to use the default")
    if root.exists() and not root.is_dir():
        raise CacheDirError(f"{_describe_root(root)} is a file, not a directory: {fix}")
    if write:
        try:
            root.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".kvlab-write-test.", dir=root)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise CacheDirError(f"{_describe_root(root)} cannot be written ({reason}), and kvlab needs to "
                                f"write there to fetch or convert: {fix}") from None
    _CHECKED_DIRS.add(key)
    return root


def make_cache_subdir(path: Path) -> Path:
    """``path.mkdir(parents=True, exist_ok=True)`` for a folder inside the cache; a file standing where a folder
    must be is a :class:`CacheDirError` naming it and the fix (not a bare FileExistsError)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), path)
        raise CacheDirError(f"{blocker} is a file, but kvlab keeps a folder there (in {_describe_root(cache_dir())}): "
                            f"move or delete that file, or point KVLAB_CACHE at another directory") from None
    return path


def asset_path(asset_id: str) -> Path:
    """Where :func:`kvlab.assets.fetch` puts ``asset_id`` (a file, or a folder for collections)."""
    return cache_dir() / "assets" / asset_id / get_asset(asset_id).filename


# --------------------------------------------------------------------------- digests


def progress_bar(total: int | None, desc: str, enabled: bool):
    if not enabled:
        return contextlib.nullcontext(None)
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, leave=False)


_DIGESTS: dict[tuple[str, int, int, int], str] = {}


def _stat_key(path: Path) -> tuple[str, int, int, int]:
    st = path.stat()
    return str(Path(path).absolute()), st.st_size, st.st_mtime_ns, st.st_ino


def sha256_file(path: Path, *, progress: bool = False, fresh: bool = False) -> str:
    """sha256 of a file, remembered for this process under (path, size, mtime, inode).

    ``fresh=True`` hashes it again whatever was remembered (``fetch --verify``).
    """
    path = Path(path)
    key = _stat_key(path)
    if not fresh and key in _DIGESTS:
        return _DIGESTS[key]
    h = hashlib.sha256()
    with open(path, "rb") as f, progress_bar(key[1], f"sha256 {path.name}",
                                             progress and key[1] >= PROGRESS_MIN_BYTES) as bar:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            if bar is not None:
                bar.update(len(chunk))
    digest = h.hexdigest()
    if _stat_key(path) == key:  # not changed while we read it
        _DIGESTS[key] = digest
    return digest


def remember_digest(path: Path, digest: str) -> None:
    """Record the sha256 of a file kvlab has just written and checked (saves hashing it again)."""
    _DIGESTS[_stat_key(Path(path))] = digest


def manifest(files: dict[str, str]) -> str:
    """``sha256sum``-compatible manifest of ``{name: sha256}``, sorted by name."""
    return "".join(f"{files[name]}  {name}\n" for name in sorted(files))


# --------------------------------------------------------------------------- checking a cached copy


def _fix(asset: Asset, path: Path) -> str:
    return f"delete {path} and re-run `python -m kvlab fetch {asset.id}`"


def file_problem(path: Path, size: int | None, sha256: str | None, digest: str, progress: bool) -> str | None:
    """What is wrong with one file (``None``: nothing). ``digest``: "never", "small", "once" or "fresh"."""
    if not path.is_file():
        return f"{path} is missing" if not path.exists() else f"{path} is not a regular file"
    actual_size = path.stat().st_size
    if size is not None and actual_size != size:
        return f"{path} has {actual_size} bytes, the registry says {size}"
    if sha256 is None or digest == "never" or (digest == "small" and actual_size > LIST_DIGEST_MAX_BYTES):
        return None
    actual = sha256_file(path, progress=progress, fresh=digest == "fresh")
    if actual != sha256:
        return f"{path} has sha256 {actual}, the registry says {sha256}"
    return None


def _expected_documents(asset: Asset, folder: Path) -> tuple[dict[str, tuple[int | None, str]] | None, str | None]:
    """``({name: (size, sha256)}, None)`` of a collection, or ``(None, problem)``."""
    if asset.files is not None:
        return {name: (d.size, d.sha256) for name, d in asset.files.items()}, None
    # No per-file record (an entry made by hand): the cached manifest, whose sha256 is pinned, gives the sums.
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        return None, f"{manifest_path} is missing"
    text = manifest_path.read_bytes()
    if hashlib.sha256(text).hexdigest() != asset.sha256:
        return None, f"{manifest_path} does not have the sha256 {asset.sha256} of the registry"
    out: dict[str, tuple[int | None, str]] = {}
    for line in text.decode("utf-8").splitlines():
        digest, _, name = line.partition("  ")
        out[name] = (None, digest)
    return out, None


def problem(asset_id: str, *, digest: str = "once", progress: bool = False) -> str | None:
    """What is wrong with the cached copy of ``asset_id``, in one sentence; ``None`` if it is intact.

    A missing copy is not a problem here (``cache_state`` tells it apart). ``digest``:
    ``"once"`` (sha256 once per process per file), ``"small"`` (only files up to
    :data:`LIST_DIGEST_MAX_BYTES`), ``"fresh"`` (hash again) or ``"never"`` (sizes only).
    """
    if digest not in ("never", "small", "once", "fresh"):
        raise ValueError(f"digest must be 'never', 'small', 'once' or 'fresh', got {digest!r}")
    asset = get_asset(asset_id)
    path = asset_path(asset_id)
    if not path.exists():
        return None
    if not asset.collection:
        return file_problem(path, asset.size, asset.sha256, digest, progress)
    if not path.is_dir():
        return f"{path} should be a folder of {asset.id}'s documents but is a file"
    expected, trouble = _expected_documents(asset, path)
    if trouble:
        return trouble
    present = {p.name for p in path.iterdir() if p.name != MANIFEST}
    missing = sorted(set(expected) - present)
    extra = sorted(present - set(expected))
    if missing:
        return f"{path} lacks {len(missing)} of its documents ({', '.join(missing[:5])})"
    if extra:
        return f"{path} holds files that are not part of {asset.id} ({', '.join(extra[:5])})"
    for name in sorted(expected):  # sizes of all first: cheap, and the usual damage
        size, _ = expected[name]
        trouble = file_problem(path / name, size, None, "never", progress)
        if trouble:
            return trouble
    for name in sorted(expected):
        size, sha = expected[name]
        trouble = file_problem(path / name, size, sha, digest, progress)
        if trouble:
            return trouble
    return None


def cache_state(asset_id: str, *, digest: str = "small") -> str:
    """``"cached"`` (present and intact), ``"damaged"`` or ``"missing"`` (see :func:`problem`)."""
    if not asset_path(asset_id).exists():
        return "missing"
    return "damaged" if problem(asset_id, digest=digest) else "cached"


def is_cached(asset_id: str) -> bool:
    """Whether ``asset_id`` is in the cache and intact: sizes always checked, sha256 of files up to
    :data:`LIST_DIGEST_MAX_BYTES` (once per process). A damaged copy is not cached."""
    checked_cache_dir()
    return cache_state(asset_id) == "cached"


def damage_message(asset: Asset, path: Path, what: str) -> str:
    """The sentence a :class:`DamagedAssetError` carries: the file, expected vs found, and the fix."""
    return f"the cached copy of {asset.id!r} is damaged: {what}. Fix: {_fix(asset, path)}"
