"""The one format of kvlab's per-example records: gzip-compressed JSON lines, one record per (example, method, metric).

Every statistical row of the claims ledger, every notebook's "paper | this run" table and every results page reads
its numbers through :func:`read`; every experiment writes them through :func:`write` or :class:`RecordWriter`.
A record is one JSON object with

    example   str    the example's id (a GSM8K problem's index, a needle's seed and depth, a round's number)
    method    str    the method's name as the ledger's method_a / method_b columns name it
    metric    str    what ``value`` measures (``flexible``, ``nll``, ``decode_latency_ms`` ...)
    value     number the measurement (null only where the metric was not defined for that example)
    config    dict   the configuration that produced it; always holds ``device`` (``"not recorded"`` for
                     records older than this rule)

and any further keys a reader may show (the raw ``output``, the ``target``, ``seconds``). Files are named
``NAME.examples.jsonl.gz`` (:data:`SUFFIX`); :func:`read` also reads an uncompressed ``.examples.jsonl`` that a user
wrote by hand. Writes are atomic: a file appears whole, under its final name, or not at all.

    from kvlab.experiments import records
    records.write("build/runs/x/gsm8k.examples.jsonl.gz",
                  [records.record("q17", "sepllm", "flexible", 1.0, config={"n_shot": 8}, device="cuda (H200)")])
    rows = records.read("build/runs/x/gsm8k.examples.jsonl.gz")
"""
from __future__ import annotations

import gzip
import io
import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

__all__ = ["SUFFIX", "REQUIRED", "NOT_RECORDED", "RecordError", "record", "check", "write", "read", "iter_records",
           "RecordWriter", "resolve"]

SUFFIX = ".examples.jsonl.gz"
REQUIRED = ("example", "method", "metric", "value", "config")
NOT_RECORDED = "not recorded"


class RecordError(ValueError):
    """A record (or a records file) does not follow the schema above; the message names the file, line and key."""


def record(example: Any, method: str, metric: str, value: float | int | bool | None, *, config: dict | None = None,
           device: str | None = None, **extra: Any) -> dict:
    """One record in the schema; ``device`` goes into ``config`` (it may also already be there)."""
    cfg = dict(config or {})
    if device is not None:
        cfg["device"] = device
    rec = {"example": str(example), "method": method, "metric": metric,
           "value": None if value is None else (float(value) if isinstance(value, bool) else value),
           "config": cfg, **extra}
    check(rec)
    return rec


def check(rec: Any, where: str = "record") -> dict:
    """Raise :class:`RecordError` unless ``rec`` follows the schema; return it."""
    if not isinstance(rec, dict):
        raise RecordError(f"{where}: a record must be a JSON object, got {type(rec).__name__}")
    for key in REQUIRED:
        if key not in rec or (key != "value" and rec[key] is None):
            raise RecordError(f"{where}: record has no {key!r} (or it is null); every record names "
                              f"{', '.join(REQUIRED)} (see kvlab.experiments.records)")
    for key in ("example", "method", "metric"):
        if not isinstance(rec[key], str) or not rec[key]:
            raise RecordError(f"{where}: {key!r} must be a non-empty string, got {rec[key]!r}")
    value = rec["value"]
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise RecordError(f"{where}: 'value' must be a number or null, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise RecordError(f"{where}: 'value' is {value}; write null for an undefined measurement")
    if not isinstance(rec["config"], dict) or "device" not in rec["config"]:
        raise RecordError(f"{where}: 'config' must be an object holding 'device' (the device the value was "
                          f"measured on, or {NOT_RECORDED!r})")
    return rec


def resolve(path: str | Path) -> Path:
    """The file ``path`` names: itself, or its compressed twin (a ledger written before the gzip rule names
    ``x.examples.jsonl``; the committed file is ``x.examples.jsonl.gz``)."""
    path = Path(path)
    if path.is_file():
        return path
    for twin in (Path(str(path) + ".gz"), Path(str(path)[:-3]) if str(path).endswith(".gz") else None):
        if twin is not None and twin.is_file():
            return twin
    raise FileNotFoundError(f"no records file {path} (nor {path.name}.gz); records are written by an experiment "
                            "(python -m kvlab claims --list-experiments)")


def _open_text(path: Path):
    if path.name.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return path.open(encoding="utf-8")


def iter_records(path: str | Path, *, where: str | None = None) -> Iterator[tuple[dict, str]]:
    """Each record of one file with ``file:line`` for messages; a malformed line names its file and line."""
    path = resolve(path)
    label = where or str(path)
    with _open_text(path) as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            at = f"{label}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise RecordError(f"{at}: not a JSON record ({e.msg} at column {e.colno}); a truncated line? Each "
                                  "line of a records file is one complete JSON object") from None
            yield check(rec, at), at


def read(path: str | Path) -> list[dict]:
    """Every record of one file, checked."""
    return [rec for rec, _ in iter_records(path)]


def _dump(rec: dict) -> str:
    return json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n"


def write(path: str | Path, recs: Iterable[dict], *, out=None) -> Path:
    """Write ``recs`` to ``path`` (``*.examples.jsonl.gz``; inside ``out``, an OutputFolder, when given)
    atomically; every record is checked as it is written."""
    with RecordWriter(path, out=out) as w:
        for rec in recs:
            w.add(rec)
    return w.path


class RecordWriter:
    """Records written one at a time (a long run shows them as it goes) into ``path.partial``, renamed to ``path``
    when the ``with`` block ends without an error; an interrupted run leaves no file under the final name.

    ``RecordWriter(NAME, out=folder)`` writes ``NAME`` inside a :class:`kvlab.outputs.OutputFolder` and records it
    (and its ``.partial``) in the folder's manifest first. ``RecordWriter(path, keep=True)`` starts from the records already in ``path`` (a run that goes on where an
    earlier one stopped); :meth:`done` says which (example, method, metric) keys are there."""

    def __init__(self, path: str | Path, *, keep: bool = False, out=None):
        self.path = Path(path) if out is None else out.root / path
        if out is not None:  # the output rule: both names are recorded in the folder's manifest before writing
            out.claim(str(path), str(path) + ".partial")
        if not self.path.name.endswith(SUFFIX):
            raise RecordError(f"records file {self.path}: the name must end in {SUFFIX!r}")
        self.partial = self.path.with_name(self.path.name + ".partial")
        self.count = 0
        self._keys: set[tuple[str, str, str]] = set()
        self._earlier = read(self.path) if keep and self.path.is_file() else []
        self._fh = None

    def __enter__(self) -> "RecordWriter":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._raw = open(self.partial, "wb")
        self._fh = io.TextIOWrapper(gzip.GzipFile(filename="", mode="wb", fileobj=self._raw, compresslevel=9, mtime=0),
                                    encoding="utf-8")
        for rec in self._earlier:
            self.add(rec)
        return self

    def done(self) -> set[tuple[str, str, str]]:
        return set(self._keys)

    def add(self, rec: dict) -> None:
        check(rec, f"{self.path} (record {self.count + 1})")
        self._fh.write(_dump(rec))
        self._keys.add((rec["example"], rec["method"], rec["metric"]))
        self.count += 1

    def __exit__(self, exc_type, exc, tb) -> None:
        self._fh.close()
        self._raw.close()
        if exc_type is None:
            os.replace(self.partial, self.path)
        else:
            self.partial.unlink(missing_ok=True)
