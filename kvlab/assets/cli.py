"""``python -m kvlab fetch [ID ...] [--all] [--list] [--verify] [--quiet]``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from kvlab.assets.fetcher import fetch
from kvlab.assets.integrity import ChecksumError, CacheDirError, cache_dir, cache_state, checked_cache_dir, problem
from kvlab.assets.registry import ASSETS, DEFAULT_ASSETS

__all__ = ["main"]


def _human(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def main(argv: Sequence[str] | None = None, verify_model: Callable[[str], str | None] | None = None) -> int:
    """``python -m kvlab fetch [ID ...] [--all] [--list] [--verify] [--quiet]``.

    No ids fetches :data:`DEFAULT_ASSETS`; ``--list`` prints every id with its size and
    licence (``*`` marks the default set; ``cached`` what is here and intact, ``damaged``
    what is here but no longer matches the registry). ``--verify`` hashes the cached copies
    again and rebuilds what does not match; ``verify_model(id)`` (``python -m kvlab`` passes
    :func:`kvlab.models.verify_converted`) does the same for a model's converted copy.
    """
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["fetch"]:
        args_in = args_in[1:]
    parser = argparse.ArgumentParser(
        prog="python -m kvlab fetch",
        description=f"Download kvlab's models and corpora into {cache_dir()} "
                    "(set KVLAB_CACHE to move it).")
    parser.add_argument("ids", nargs="*", metavar="ID", help="asset ids (default: the default set)")
    parser.add_argument("--all", action="store_true", help="fetch every asset (about 2 GB)")
    parser.add_argument("--list", action="store_true",
                        help="list the assets and exit (checks sizes, and sha256 of files up to 64 MiB)")
    parser.add_argument("--verify", action="store_true",
                        help="hash cached copies again (converted models too) and rebuild what does not match")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(args_in)

    try:
        checked_cache_dir()
        if args.list:
            return _list()
        ids = list(ASSETS) if args.all else (args.ids or list(DEFAULT_ASSETS))
        unknown = [i for i in ids if i not in ASSETS]
        if unknown:
            parser.error(f"unknown asset id(s) {', '.join(unknown)}; valid ids: {', '.join(ASSETS)}")
        for asset_id in ids:
            path = fetch(asset_id, progress=not args.quiet, verify=args.verify)
            print(f"{asset_id}: {path}")
            if args.verify and ASSETS[asset_id].kind == "model" and verify_model is not None:
                note = verify_model(asset_id)
                if note:
                    print(f"{asset_id}: {note}")
    except (CacheDirError, ChecksumError) as exc:
        print(f"python -m kvlab fetch: error: {exc}", file=sys.stderr)
        return 1
    return 0


def _list() -> int:
    damaged = []
    for asset in ASSETS.values():
        mark = "*" if asset.id in DEFAULT_ASSETS else " "
        state = cache_state(asset.id, digest="small")
        if state == "damaged":
            damaged.append(asset.id)
        shown = "" if state == "missing" else state
        print(f"{mark} {asset.id:<20} {asset.kind:<6} {_human(asset.download_size):>9}  "
              f"{shown:<7}  {asset.licence}")
    print("* = fetched by default")
    for asset_id in damaged:
        print(f"damaged: {problem(asset_id, digest='small')}; `python -m kvlab fetch {asset_id}` fetches it again")
    return 0
