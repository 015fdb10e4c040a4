"""Sweeps on Dask: a grid of function calls or papermill runs, as tasks on a local or remote cluster.

A sweep is a list of :class:`Task` s. Each task calls ``target`` (``"package.module:function"``, or a notebook path
run by papermill) with its parameters, in a Dask worker process, and writes its result atomically to
``OUT/<name>.json``. A task whose result file exists *with the same key* (target, parameters, kvlab version) is
skipped, so a sweep cut short goes on where it stopped and a changed parameter runs again. A task that raises is
retried once (``retries``); if it fails again it is listed with its parameters and the error, and the others
finish. A worker process that dies is replaced by Dask and its task rescheduled.

Why Dask (``distributed``) and not Ray: it is pure Python (a few MB from PyPI, no raylet/object store), a
``LocalCluster`` of two processes starts in seconds on a laptop or in CI, and the same code runs on many machines
by pointing it at a scheduler started with ``dask scheduler`` / ``dask worker ADDRESS`` on each machine.

    python -m kvlab sweep grid.yaml                       # local cluster, one worker per core
    python -m kvlab sweep grid.yaml --workers 2 --dry-run # print the tasks
    python -m kvlab sweep grid.yaml --scheduler tcp://10.0.0.5:8786   # an existing cluster

A grid file::

    target: kvlab.sepllm.theory:sliding_window_layers   # or: notebooks/03_sepllm_streaming.ipynb
    out: results/window_layers                          # relative to the grid file
    name: "d{distance}-n{neighbors}"                    # task name (file name), from the parameters
    fixed: {}                                           # the same for every task
    grid: {distance: [1024, 4096], neighbors: [64, 256]}   # every combination
    device: cpu                                          # or gpu: runs on workers started with the GPU resource
"""
from __future__ import annotations

import hashlib
import importlib
import itertools
import json
import logging
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Task", "SweepReport", "grid_tasks", "load_grid", "run_sweep", "task_key", "local_cluster", "main"]


@dataclass
class Task:
    """One call: ``target(**params)`` (a function) or a papermill run of a notebook with ``params``."""

    name: str
    target: str
    params: dict = field(default_factory=dict)
    device: str = "cpu"  # "cpu" or "gpu" (needs a worker with the GPU resource)
    cost: float = 1.0  # rough minutes, for longest-first submission


@dataclass
class SweepReport:
    done: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[tuple[Task, str]] = field(default_factory=list)

    def summary(self) -> str:
        lines = [f"{len(self.done)} done, {len(self.skipped)} already done (skipped), {len(self.failed)} failed"]
        for task, error in self.failed:
            lines.append(f"FAILED {task.name} {json.dumps(task.params, default=str)}: {error.strip().splitlines()[-1]}")
        return "\n".join(lines)


def task_key(task: Task) -> str:
    """What makes a result reusable: the target, the parameters and the kvlab version."""
    from kvlab import __version__

    blob = json.dumps({"target": task.target, "params": task.params, "kvlab": __version__}, sort_keys=True,
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _finished(task: Task, out: Path) -> bool:
    path = out / f"{task.name}.json"
    if not path.exists():
        return False
    try:
        return json.loads(path.read_text()).get("key") == task_key(task)
    except (OSError, ValueError):
        return False  # a damaged file is redone, never trusted


def _write_atomic(path: Path, record: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(record, ensure_ascii=False, default=str))
    os.replace(tmp, path)


def _call(task: Task, out: str, python_path: list[str]) -> str:
    """Runs in the worker: the call itself, then its record written atomically. Errors propagate to Dask."""
    for p in python_path:
        if p not in sys.path:
            sys.path.insert(0, p)
    begin = time.time()
    out_dir = Path(out)
    if task.target.endswith(".ipynb"):
        import papermill

        executed = out_dir / f"{task.name}.ipynb"
        papermill.execute_notebook(task.target, str(executed), parameters=task.params, progress_bar=False,
                                   cwd=str(Path(task.target).parent))
        result = {"notebook": str(executed)}
    else:
        module, _, function = task.target.partition(":")
        if not function:
            raise ValueError(f"target {task.target!r} must be 'package.module:function' or a .ipynb path")
        result = getattr(importlib.import_module(module), function)(**task.params)
    record = dict(name=task.name, key=task_key(task), target=task.target, params=task.params, device=task.device,
                  wall_seconds=time.time() - begin, result=result)
    _write_atomic(out_dir / f"{task.name}.json", record)
    return task.name


def local_cluster(workers: int, gpu_workers: int = 0):
    """A Dask cluster on this machine: ``workers`` CPU processes with one thread each, plus ``gpu_workers``
    processes that hold the ``GPU`` resource (tasks with ``device="gpu"`` run only there)."""
    from distributed import Nanny, Scheduler, SpecCluster

    quiet = {"nthreads": 1, "silence_logs": logging.CRITICAL}  # failures are reported by run_sweep, once
    specs = {f"cpu-{i}": {"cls": Nanny, "options": quiet} for i in range(workers)}
    specs.update({f"gpu-{i}": {"cls": Nanny, "options": {**quiet, "resources": {"GPU": 1}}} for i in range(gpu_workers)})
    if not specs:
        raise ValueError("a local cluster needs at least one worker: give workers >= 1 or gpu_workers >= 1")
    return SpecCluster(workers=specs, scheduler={"cls": Scheduler, "options": {"dashboard_address": None}},
                       silence_logs=logging.ERROR)


def run_sweep(tasks: list[Task], out, *, scheduler: str | None = None, workers: int | None = None,
              gpu_workers: int = 0, retries: int = 1, python_path: list[str] | None = None,
              progress: bool = True) -> SweepReport:
    """Run every unfinished task on a Dask cluster (``scheduler`` address, or a local one) and report."""
    from distributed import Client, as_completed
    from tqdm.auto import tqdm

    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise ValueError("task names must be unique: each one names its result file")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    report = SweepReport(skipped=[t.name for t in tasks if _finished(t, out)])
    todo = sorted((t for t in tasks if t.name not in report.skipped), key=lambda t: -t.cost)
    if not todo:
        return report
    python_path = [str(Path(p).resolve()) for p in (python_path or [])]
    cluster = None
    if scheduler is None:
        cluster = local_cluster(workers or max((os.cpu_count() or 2) - 1, 1), gpu_workers)
    client = Client(scheduler or cluster)
    try:
        has_gpu = any("GPU" in (w.get("resources") or {}) for w in client.scheduler_info()["workers"].values())
        futures = {}
        for t in todo:
            resources = {"GPU": 1} if t.device == "gpu" and has_gpu else None
            fut = client.submit(_call, t, str(out.resolve()), python_path, key=f"{t.name}-{task_key(t)}",
                                retries=retries, resources=resources, pure=False)
            futures[fut] = t
        bar = tqdm(total=len(todo), desc="sweep", disable=not progress)
        for fut in as_completed(futures):
            task = futures[fut]
            if fut.status == "finished":
                report.done.append(task.name)
            else:
                exc = fut.exception()
                tb = "".join(traceback.format_tb(fut.traceback())) if fut.traceback() else ""
                report.failed.append((task, f"{tb}{type(exc).__name__}: {exc}"))
                bar.write(f"FAILED {task.name} {json.dumps(task.params, default=str)}: {type(exc).__name__}: {exc}")
            bar.update()
        bar.close()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    return report


def grid_tasks(target: str, grid: dict, *, fixed: dict | None = None, name: str | None = None,
               device: str = "cpu") -> list[Task]:
    """Every combination of ``grid`` (a dict of lists) as a task; ``name`` formats the parameters."""
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"grid entry {key!r} must be a non-empty list (got {values!r})")
    keys = list(grid)
    tasks = []
    for combo in itertools.product(*(grid[k] for k in keys)):
        params = {**(fixed or {}), **dict(zip(keys, combo))}
        label = name.format(**params) if name else "-".join(f"{k}{v}" for k, v in zip(keys, combo)) or "task"
        tasks.append(Task(label, target, params, device))
    return tasks


def load_grid(path) -> tuple[list[Task], Path]:
    """Read a grid YAML (see the module docstring): the tasks and the output folder."""
    import yaml

    path = Path(path)
    spec = yaml.safe_load(path.read_text()) or {}
    unknown = set(spec) - {"target", "out", "name", "fixed", "grid", "device"}
    if unknown or "target" not in spec:
        raise ValueError(f"{path}: a grid file has 'target' (required), 'out', 'name', 'fixed', 'grid', 'device'"
                         + (f"; unknown keys {sorted(unknown)}" if unknown else ""))
    target = spec["target"]
    if target.endswith(".ipynb"):
        target = str((path.parent / target).resolve())
    out = path.parent / spec.get("out", path.stem + "-results")
    tasks = grid_tasks(target, spec.get("grid") or {}, fixed=spec.get("fixed"), name=spec.get("name"),
                       device=spec.get("device", "cpu"))
    return tasks, out


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m kvlab sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("grid", help="a grid YAML file")
    p.add_argument("--out", help="result folder (default: the grid's 'out')")
    p.add_argument("--scheduler", help="address of a running Dask scheduler (default: a local cluster)")
    p.add_argument("--workers", type=int, default=None, help="local CPU worker processes (default: cores - 1)")
    p.add_argument("--gpu-workers", type=int, default=0, help="local worker processes holding the GPU resource")
    p.add_argument("--retries", type=int, default=1)
    p.add_argument("--dry-run", action="store_true", help="print the tasks and whether each is done")
    args = p.parse_args(argv)
    tasks, out = load_grid(args.grid)
    out = Path(args.out) if args.out else out
    if args.dry_run:
        for t in tasks:
            print(f"{'done' if _finished(t, out) else 'todo'}  {t.name:30s} {json.dumps(t.params, default=str)}")
        return 0
    report = run_sweep(tasks, out, scheduler=args.scheduler, workers=args.workers, gpu_workers=args.gpu_workers,
                       retries=args.retries, python_path=[os.getcwd()])
    print(report.summary())
    return 1 if report.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
