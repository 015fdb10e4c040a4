"""The leaderboard on one GPU against the same grid on several GPUs of one host: wall time, cells per device, GPU
utilisation per device while each run ran, and whether every cell's numbers are identical.

    python -m kvlab leaderboard scaling report --run 1gpu=DIR1:SECONDS --run 2gpu=DIR2:SECONDS \
        [--util gpu_util.csv] [--command "..."] [--device "..."] > scaling.md

Each DIR is a leaderboard ``--out`` folder (``DIR/cells/*.json``, one record per cell, as :mod:`kvlab.experiments.sweep`
writes them: ``worker.cuda_visible_devices`` says which GPU ran the cell, ``started`` and ``wall_seconds`` when and
how long). The first run is the reference: a later run's cells must have the same keys and identical ``result``
fields (every number the table is made of). ``--util`` is ``nvidia-smi --query-gpu=timestamp,index,utilization.gpu,
memory.used --format=csv,noheader,nounits -lms 500`` output; its samples are split by run from the cells' start and
end times. Exit status 1 when a run's cells differ from the reference.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path


def load_cells(folder) -> dict[str, dict]:
    """``{cell name: record}`` of a leaderboard folder's ``cells/``."""
    paths = sorted(Path(folder, "cells").glob("*.json"))
    if not paths:
        raise SystemExit(f"leaderboard_scaling: no cell records under {folder}/cells: run the leaderboard there first")
    return {p.stem: json.loads(p.read_text()) for p in paths}


def differences(reference: dict[str, dict], other: dict[str, dict], subset: bool = False) -> list[str]:
    """What differs between two runs of one grid: missing or extra cells, other keys, other results (``subset``:
    the other run may hold only some of the reference's cells)."""
    out = [] if subset else [f"missing: {n}" for n in sorted(set(reference) - set(other))]
    out += [f"extra: {n}" for n in sorted(set(other) - set(reference))]
    for name in sorted(set(reference) & set(other)):
        a, b = reference[name], other[name]
        if a["key"] != b["key"]:
            out.append(f"{name}: key {a['key']} vs {b['key']}")
        elif a["result"] != b["result"]:
            fields = sorted(k for k in set(a["result"]) | set(b["result"])
                            if a["result"].get(k) != b["result"].get(k))
            out.append(f"{name}: result differs in {', '.join(fields)}")
    return out


def read_util(path) -> list[tuple[float, str, float, float]]:
    """``(epoch seconds, gpu index, utilisation %, memory MiB)`` samples of an nvidia-smi CSV log."""
    rows = []
    for line in Path(path).read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            t = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            rows.append((t, parts[1], float(parts[2]), float(parts[3])))
        except ValueError:
            continue
    return rows


def summarise(name: str, folder, seconds: float, util) -> dict:
    cells = load_cells(folder)
    per_device = Counter(str((r.get("worker") or {}).get("cuda_visible_devices")) for r in cells.values())
    busy = defaultdict(float)
    for r in cells.values():
        busy[str((r.get("worker") or {}).get("cuda_visible_devices"))] += r["wall_seconds"]
    starts = [r["started"] for r in cells.values() if "started" in r]
    ends = [r["started"] + r["wall_seconds"] for r in cells.values() if "started" in r]
    first, last = (min(starts), max(ends)) if starts else (None, None)
    gpu_util = {}
    if util and first is not None:
        window = [u for u in util if first <= u[0] <= last]
        for gpu in sorted({u[1] for u in window}):
            vals = [u[2] for u in window if u[1] == gpu]
            mem = [u[3] for u in window if u[1] == gpu]
            gpu_util[gpu] = (sum(vals) / len(vals), max(mem), len(vals))
    return dict(name=name, cells=cells, seconds=seconds, per_device=per_device, busy=busy, first=first, last=last,
                gpu_util=gpu_util)


def report(runs: list[dict], command: str, device: str, subset: bool = False) -> tuple[str, bool]:
    ref = runs[0]
    lines = [f"Measured by `{command}` on {device}." if command else "", "",
             "| run | wall time (s) | speed-up | cells | cells per device | cell-seconds per device | "
             "first cell start -> last cell end (s) | GPU utilisation per device (mean %, peak MiB, samples) | "
             "cells identical to the first run |",
             "|---|---|---|---|---|---|---|---|---|"]
    ok = True
    for r in runs:
        diff = [] if r is ref else differences(ref["cells"], r["cells"], subset)
        ok &= not diff
        span = f"{r['last'] - r['first']:.0f}" if r["first"] is not None else "n/a"
        util = "; ".join(f"GPU {g}: {m:.0f} %, {p:.0f} MiB ({n})" for g, (m, p, n) in r["gpu_util"].items()) or "n/a"
        same = "reference" if r is ref else (("yes, all" if not subset else f"yes, all {len(r['cells'])}")
                                             if not diff else f"**no**: {len(diff)} differ")
        lines.append(f"| {r['name']} | {r['seconds']:.0f} | {ref['seconds'] / r['seconds']:.2f}x | {len(r['cells'])} | "
                     + ", ".join(f"GPU {d}: {n}" for d, n in sorted(r["per_device"].items())) + " | "
                     + ", ".join(f"GPU {d}: {s:.0f}" for d, s in sorted(r["busy"].items())) + f" | {span} | {util} | "
                     f"{same} |")
        if diff:
            lines += ["", f"Differences of {r['name']} (first 20):", ""] + [f"- {d}" for d in diff[:20]]
    return "\n".join(lines).strip() + "\n", ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvlab leaderboard scaling", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("report")
    r.add_argument("--run", action="append", required=True, help="NAME=DIR:SECONDS (the first is the reference)")
    r.add_argument("--util", help="nvidia-smi CSV log sampled during the runs")
    r.add_argument("--command", default="", help="the command that made the runs (written in the table's header)")
    r.add_argument("--device", default="", help="the machine, in words")
    r.add_argument("--subset", action="store_true", help="later runs hold only some of the first run's cells")
    args = p.parse_args(argv)
    util = read_util(args.util) if args.util and Path(args.util).exists() else []
    runs = []
    for spec in args.run:
        name, _, rest = spec.partition("=")
        folder, _, seconds = rest.rpartition(":")
        if not name or not folder or not seconds:
            p.error(f"--run must be NAME=DIR:SECONDS, got {spec!r}")
        runs.append(summarise(name, folder, float(seconds), util))
    text, ok = report(runs, args.command, args.device, args.subset)
    sys.stdout.write(text)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
