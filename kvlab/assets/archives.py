"""Reading published archives: wheels (zip), sdists (tar), Debian packages (ar + tar).

:class:`Archive` gives member names, sizes and streams whatever the format;
:func:`resolve_members` picks the members a :class:`~kvlab.assets.registry.Source` names
(globs sorted by name); :func:`concatenate` writes the members of several archives, in
order, into one stream (split models: a GGUF cut into parts across several packages).
"""

from __future__ import annotations

import fnmatch
import io
import tarfile
import zipfile
from pathlib import Path
from typing import IO

from kvlab.assets.integrity import CHUNK, PROGRESS_MIN_BYTES, progress_bar
from kvlab.assets.registry import Source

__all__ = ["Archive", "deb_data_tar", "resolve_members", "concatenate", "read_members"]


class Archive:
    """Read-only view of a wheel, sdist or .deb: member names, sizes and streams."""

    def __init__(self, path: Path, kind: str):
        self._zip: zipfile.ZipFile | None = None
        self._tar: tarfile.TarFile | None = None
        if kind == "wheel" or path.suffix == ".zip":
            self._zip = zipfile.ZipFile(path)
            self.sizes = {i.filename: i.file_size for i in self._zip.infolist() if not i.is_dir()}
            return
        if kind == "deb":
            # A .deb is an ar archive whose data.tar.* holds the files; debs used here are small.
            compression, data = deb_data_tar(path)
            self._tar = tarfile.open(fileobj=io.BytesIO(data), mode=f"r:{compression}")
        else:
            self._tar = tarfile.open(path, mode="r:*")
        self._members = {m.name.removeprefix("./"): m for m in self._tar.getmembers() if m.isfile()}
        self.sizes = {name: m.size for name, m in self._members.items()}

    def open(self, name: str) -> IO[bytes]:
        if self._zip is not None:
            return self._zip.open(name)
        return self._tar.extractfile(self._members[name])

    def close(self) -> None:
        (self._zip or self._tar).close()

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def deb_data_tar(path: Path) -> tuple[str, bytes]:
    """``(compression, bytes)`` of the ``data.tar.*`` member of a Debian package (an ar archive)."""
    blob = path.read_bytes()
    if not blob.startswith(b"!<arch>\n"):
        raise ValueError(f"{path.name} is not a Debian package")
    pos = 8
    while pos + 60 <= len(blob):
        header = blob[pos:pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        body = blob[pos + 60:pos + 60 + size]
        if name.startswith("data.tar"):
            compression = {".xz": "xz", ".gz": "gz", ".bz2": "bz2", "": ""}.get(name[8:])
            if compression is None:
                raise ValueError(f"{path.name}: {name} is not supported (xz, gz, bz2 are)")
            return compression, body
        pos += 60 + size + (size & 1)
    raise ValueError(f"{path.name} has no data.tar member")


def resolve_members(source: Source, names: list[str]) -> list[str]:
    """Archive names matching ``source.members`` in order (globs sorted by name)."""
    out: list[str] = []
    for pattern in source.members:
        if any(c in pattern for c in "*?["):
            hits = sorted(n for n in names if fnmatch.fnmatchcase(n, pattern))
        else:
            hits = [pattern] if pattern in names else []
        if not hits:
            raise FileNotFoundError(f"{pattern} is not in {source.filename} ({source.spec})")
        out.extend(hits)
    return out


def concatenate(sources: tuple[Source, ...], archives: dict[str, Path], out: IO[bytes], h, progress: bool) -> None:
    """Write the members of every source in order into ``out``, updating the hash ``h``."""
    for source in sources:
        with Archive(archives[source.filename], source.archive) as archive:
            for name in resolve_members(source, list(archive.sizes)):
                size = archive.sizes[name]
                show = progress and size >= PROGRESS_MIN_BYTES
                with archive.open(name) as src, progress_bar(size, f"extract {Path(name).name}", show) as bar:
                    while chunk := src.read(CHUNK):
                        out.write(chunk)
                        h.update(chunk)
                        if bar is not None:
                            bar.update(len(chunk))


def read_members(sources: tuple[Source, ...], archives: dict[str, Path]) -> dict[str, bytes]:
    """``{member name: bytes}`` of every member the sources name (collections: small files)."""
    raw: dict[str, bytes] = {}
    for source in sources:
        with Archive(archives[source.filename], source.archive) as archive:
            for name in resolve_members(source, list(archive.sizes)):
                with archive.open(name) as src:
                    raw[name] = src.read()
    return raw
