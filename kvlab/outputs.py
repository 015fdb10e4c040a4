"""The output rule of every kvlab command that writes a folder: kvlab deletes or overwrites only files it wrote.

A command opens its folder with :class:`OutputFolder` before any work. The folder must be new, empty, or hold
only files kvlab wrote there, listed in its manifest ``.kvlab-outputs`` (one path per line, relative to the folder;
a line ending in ``/`` owns a whole sub-folder that a tool such as Sphinx fills). Anything else in it is the
user's: the command refuses at once, naming that file and the fix, before it deletes or writes anything. A file
tracked by git is never deleted, whoever wrote it. A line ``keep: PATH`` marks a person's file or sub-folder
(a results README) that kvlab leaves alone: it neither blocks the command nor is ever written. A sub-folder holding its own manifest belongs to another
kvlab command (the leaderboard's ``cells/`` is a sweep's folder) and is left to it.

    out = OutputFolder("build/notebooks", "python -m kvlab notebooks prepare")
    path = out.claim("01_attention_sinks.ipynb")   # recorded in the manifest before it is written
    out.remove("00_old.ipynb")                      # only a file the manifest lists

A command that wrote folders before the manifest existed passes ``recognise``: a file it can tell is its own
(a sweep's result record, a book copy with its stamp) is taken into the manifest instead of being refused.
"""
from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable

__all__ = ["MANIFEST", "OutputFolder", "OutputRefused"]

MANIFEST = ".kvlab-outputs"


class OutputRefused(ValueError):
    """The folder holds a file kvlab did not write (or a committed file would be deleted): nothing was touched."""


class OutputFolder:
    """A folder a kvlab ``command`` writes into, checked against the rule above when it is opened."""

    def __init__(self, folder, command: str, *, recognise: Callable[[Path], bool] | None = None,
                 others: tuple[str, ...] = ()):
        self.root = Path(folder)
        self.command = command
        if self.root.exists() and not self.root.is_dir():
            raise OutputRefused(f"{command}: the output {self.root} is a file, not a folder; give a folder "
                                "(new, or one an earlier run of this command wrote)")
        self.root.mkdir(parents=True, exist_ok=True)
        self.manifest = self.root / MANIFEST
        self.entries: set[str] = set()
        self.kept: set[str] = set()  # "keep: PATH" lines: a person's files kvlab leaves alone (a results README)
        self.others = {o.rstrip("/") for o in others}  # sub-folders another kvlab command checks and writes
        if self.manifest.is_file():
            for line in self.manifest.read_text(encoding="utf-8").splitlines():
                line = line.strip()
                if line.startswith("keep:"):
                    self.kept.add(line[5:].strip())
                elif line and not line.startswith("#"):
                    self.entries.add(line)
        adopted = []
        for rel in self._files():
            if self.owns(rel) or _under(rel, self.kept):
                continue
            if recognise is not None and recognise(self.root / rel):
                adopted.append(rel)
                continue
            raise OutputRefused(
                f"{command}: {self.root / rel} was not written by kvlab ({self.root} is not a new folder and its "
                f"manifest {MANIFEST} does not list that file); kvlab writes only into a new folder or one holding "
                f"only files it wrote, so nothing was changed: move that file out of {self.root}, or give another "
                f"output folder")
        self.entries.update(adopted)
        self._save()

    # --- what is in the folder ---------------------------------------------------------------------------------
    def _files(self) -> list[str]:
        """Every file under the folder (relative, posix), the manifest and other commands' folders left out."""
        found = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            here = Path(dirpath)
            rel_dir = here.relative_to(self.root).as_posix()
            keep = []
            for d in sorted(dirnames):
                rel = f"{d}/" if rel_dir == "." else f"{rel_dir}/{d}/"
                if (here / d / MANIFEST).is_file() or rel in self.entries or rel.rstrip("/") in self.others:
                    continue  # another command's folder, or a sub-folder this command owns whole
                keep.append(d)
            dirnames[:] = keep
            for f in sorted(filenames):
                rel = f if rel_dir == "." else f"{rel_dir}/{f}"
                if here == self.root and f == MANIFEST:
                    continue
                found.append(rel)
        return found

    def owns(self, rel: str) -> bool:
        """Whether ``rel`` (relative to the folder) is kvlab's: listed, matched by a listed pattern, or under a
        listed sub-folder."""
        rel = Path(rel).as_posix()
        if rel in self.entries:
            return True
        return any((e.endswith("/") and rel.startswith(e)) or (any(c in e for c in "*?[") and fnmatch.fnmatch(rel, e))
                   for e in self.entries)

    def _save(self) -> None:
        tmp = self.manifest.with_name(f"{MANIFEST}.tmp{os.getpid()}")
        tmp.write_text(f"# files written by kvlab ({self.command}); it deletes or overwrites only these\n"
                       + "".join(f"keep: {k}\n" for k in sorted(self.kept))
                       + "".join(f"{e}\n" for e in sorted(self.entries)), encoding="utf-8")
        os.replace(tmp, self.manifest)

    def _rel(self, rel) -> str:
        path = Path(rel)
        if path.is_absolute():
            for base in (self.root.resolve(), self.root.absolute()):
                if path.is_relative_to(base):
                    path = path.relative_to(base)
                    break
            else:
                raise OutputRefused(f"{self.command}: {rel} is outside the output folder {self.root}, so it was not "
                                    "written by kvlab there")
        text = path.as_posix()
        if text.startswith("../") or text == ".." or "/../" in text:
            raise OutputRefused(f"{self.command}: {rel} is outside the output folder {self.root}")
        return text

    # --- writing ------------------------------------------------------------------------------------------------
    def claim(self, *rels) -> Path | list[Path]:
        """Record ``rels`` (paths or patterns such as ``.*.tmp*``, or ``sub/`` for a whole sub-folder) as kvlab's
        before writing them; returns the path (or the paths). A path that exists must already be kvlab's."""
        paths = []
        for rel in rels:
            rel = self._rel(rel) + ("/" if str(rel).endswith("/") else "")
            target = self.root / rel
            if _under(rel, self.kept):
                raise OutputRefused(f"{self.command}: {target} is marked 'keep' in {self.manifest}: kvlab does not "
                                    "write it")
            if target.is_file() and not self.owns(rel):
                raise OutputRefused(f"{self.command}: {target} was not written by kvlab; move it away or give "
                                    "another output folder")
            self.entries.add(rel)
            paths.append(target)
        self._save()
        return paths[0] if len(paths) == 1 else paths

    def adopt_tree(self, rel) -> list[Path]:
        """Record every file kvlab (or a tool it ran, such as otter) has just written under ``rel``."""
        base = self.root / self._rel(rel)
        files = [p for p in base.rglob("*") if p.is_file()] if base.is_dir() else []
        for p in files:
            self.entries.add(p.relative_to(self.root).as_posix())
        self._save()
        return files

    def remove(self, rel) -> None:
        """Delete one file kvlab wrote (never one it did not, never one tracked by git) and forget it."""
        rel = self._rel(rel)
        target = self.root / rel
        if not self.owns(rel):
            raise OutputRefused(f"{self.command}: will not delete {target}: kvlab did not write it")
        if target.is_file():
            _refuse_committed([target], self.command)
            target.unlink()
        self.entries.discard(rel)
        self._save()

    def remove_tree(self, rel) -> None:
        """Delete every file kvlab wrote under ``rel`` (a user's file there stops it first) and the folders left
        empty."""
        rel = self._rel(rel)
        base = self.root / rel
        if not base.exists():
            return
        files = [p.relative_to(self.root).as_posix() for p in base.rglob("*") if p.is_file() or p.is_symlink()]
        foreign = [f for f in files if not self.owns(f)]
        if foreign:
            raise OutputRefused(f"{self.command}: will not delete {base}: {self.root / foreign[0]} was not written "
                                f"by kvlab; move it away or give another output folder")
        _refuse_committed([self.root / f for f in files], self.command)
        if base.is_dir() and f"{rel}/" in self.entries:
            shutil.rmtree(base)
        else:
            for f in files:
                (self.root / f).unlink()
            for d in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                d.rmdir()
            base.rmdir()
        self.entries = {e for e in self.entries if not (e == rel or e.startswith(f"{rel}/"))}
        self._save()


def _under(rel: str, folders: set[str]) -> bool:
    return any(rel == k.rstrip("/") or rel.startswith(k.rstrip("/") + "/") for k in folders)


def _refuse_committed(paths: list[Path], command: str) -> None:
    """A file tracked by git is never deleted by kvlab (git not installed, or no repository: nothing is tracked)."""
    if not paths:
        return
    where = paths[0].parent.resolve()
    try:
        done = subprocess.run(["git", "-C", str(where), "ls-files", "-z", "--", *(str(p.resolve()) for p in paths)],
                              capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return
    tracked = [t for t in done.stdout.decode(errors="replace").split("\0") if t] if done.returncode == 0 else []
    if tracked:
        raise OutputRefused(f"{command}: will not delete {tracked[0]}: it is committed to git; give an output "
                            "folder outside the repository's committed files")
