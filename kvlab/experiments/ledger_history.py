"""Whether a ledger row's plan came before its data, read from git history (``python -m kvlab claims --check``).

A claim is decided only by a plan fixed before its data: the row's ``planned_n``, together with its paper cell, metric
and comparison (``paper_cell``, ``metric``, ``method_a``, ``method_b``), must appear in a commit of
``benchmarks/claims.csv`` whose tree holds none of the row's results yet. The results of a row are its
``results_file`` and every file beside it with the same stem (``table1_gsm8k.json`` beside
``table1_gsm8k.examples.jsonl.gz``; the uncompressed ``*.examples.jsonl`` it was converted from), followed through
renames; the earliest of them is when the data came. :func:`plan_order` classifies one row:

- ``"before"``: the plan's first commit is older than the data's first commit;
- ``"with or after"``: the plan came in the same commit as the data or later (a plan written after a look);
- ``"no plan"``: the row states no ``planned_n``;
- ``"unknown"``: the history cannot say (no git, a shallow clone, a file or row not yet committed).

``python -m kvlab claims --update`` writes the order into the row's ``plan`` column and ``--check`` verifies it;
only a claim whose plan came ``"before"`` its data counts as decided
(:func:`kvlab.experiments.claims.decided_strictly`).
"""
from __future__ import annotations

import csv
import io
import subprocess
from pathlib import Path, PurePosixPath

__all__ = ["History", "plan_order", "PLAN_COLUMNS"]

#: the columns that make a plan: the n and what is compared on which cell of the paper
PLAN_COLUMNS = ("planned_n", "paper_cell", "metric", "method_a", "method_b")
LEDGER = "benchmarks/claims.csv"


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout


class History:
    """The repository's history as the plan check needs it: the order of commits, when each results path first
    appeared (through renames), and every committed version of the ledger's rows.

    ``History(root)`` raises ``RuntimeError`` when ``root`` has no usable history (not a git checkout, a shallow
    clone): the check then says it cannot tell, never that a plan is fine."""

    def __init__(self, root: str | Path, ledger: str = LEDGER):
        self.root = Path(root)
        self.ledger = ledger
        try:
            if _git(self.root, "rev-parse", "--is-shallow-repository").strip() == "true":
                raise RuntimeError(f"{self.root} is a shallow clone: the history cannot date plans and data")
            order = _git(self.root, "rev-list", "--reverse", "--topo-order", "HEAD").split()
        except (OSError, subprocess.CalledProcessError) as e:
            raise RuntimeError(f"no git history at {self.root} ({e})") from None
        self.index = {c: i for i, c in enumerate(order)}
        self.first_seen = self._first_seen()
        self.by_stem: dict[tuple[str, str], int] = {}  # (folder, stem) -> the earliest file of that stem there
        for p, i in self.first_seen.items():
            q = PurePosixPath(p)
            key = (str(q.parent), q.name.split(".")[0])
            self.by_stem[key] = min(i, self.by_stem.get(key, i))
        self.versions = self._ledger_versions()

    def _first_seen(self) -> dict[str, int]:
        """Per path under benchmarks/ (and anywhere a results file may sit), the index of the commit that first
        added it, a renamed path inheriting its old name's."""
        log = _git(self.root, "log", "--reverse", "--topo-order", "-M", "--name-status", "--format=commit %H")
        seen: dict[str, int] = {}
        at = -1
        for line in log.splitlines():
            if line.startswith("commit "):
                at = self.index.get(line.split()[1], at)
                continue
            parts = line.split("\t")
            if len(parts) == 3 and parts[0].startswith(("R", "C")):
                seen.setdefault(parts[2], seen.get(parts[1], at))
            elif len(parts) == 2 and parts[0] == "A":
                seen.setdefault(parts[1], at)
        return seen

    def _ledger_versions(self) -> list[tuple[int, dict[str, dict]]]:
        """Every committed version of the ledger, oldest first: (commit index, rows by id)."""
        commits = _git(self.root, "log", "--reverse", "--topo-order", "--format=%H", "--", self.ledger).split()
        # every version in one `git cat-file --batch` (a process per version takes seconds)
        request = "".join(f"{c}:{self.ledger}\n" for c in commits).encode()
        blob = subprocess.run(["git", "-C", str(self.root), "cat-file", "--batch"], input=request,
                              capture_output=True, check=True).stdout
        out, at = [], 0
        for c in commits:
            header_end = blob.index(b"\n", at)
            header = blob[at:header_end].split()
            at = header_end + 1
            if header[-1] == b"missing":  # the commit deleted the ledger
                continue
            size = int(header[2])
            text = blob[at:at + size].decode("utf-8")
            at += size + 1
            rows = {r.get("id"): r for r in csv.DictReader(io.StringIO(text)) if r.get("id")}
            out.append((self.index[c], rows))
        return out

    def data_commit(self, row: dict) -> int | None:
        """The index of the first commit holding any of the row's results (see the module docstring), or None."""
        found = []
        for f in row.get("results_file", "").split(";"):
            f = f.strip()
            if not f:
                continue
            path = PurePosixPath(f)
            key = (str(path.parent), path.name.split(".")[0])
            if key in self.by_stem:
                found.append(self.by_stem[key])
        return min(found) if found else None

    def plan_commit(self, row: dict) -> int | None:
        """The index of the first ledger commit in which the row has its present plan (:data:`PLAN_COLUMNS`)."""
        want = {k: row.get(k, "").strip() for k in PLAN_COLUMNS}
        for i, rows in self.versions:
            old = rows.get(row["id"])
            if old is not None and all((old.get(k) or "").strip() == v for k, v in want.items()):
                return i
        return None


def plan_order(row: dict, history: History) -> str:
    """``"before"``, ``"with or after"``, ``"no plan"`` or ``"unknown"``: when the row's plan came, against its data
    (module docstring)."""
    if not row.get("planned_n", "").strip():
        return "no plan"
    plan, data = history.plan_commit(row), history.data_commit(row)
    if plan is None or data is None:
        return "unknown"
    return "before" if plan < data else "with or after"
