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

__all__ = ["Task", "SweepReport", "grid_tasks", "load_grid", "run_sweep", "task_key", "local_cluster", "check_name",
           "check_target", "plain_json", "main"]

SCHEDULER_TIMEOUT = 5  # seconds to wait for a scheduler given by address before saying it does not answer


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


def plain_json(value, where: str = "result"):
    """``value`` as plain JSON data: numpy / torch arrays become (nested) lists, their scalars numbers; anything
    else that JSON cannot hold raises TypeError naming where it is (never stored as its ``str``, which a
    rerun would take for a finished result)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            raise TypeError(f"{where}: dict keys must be strings to be stored as JSON, got {bad[0]!r}")
        return {k: plain_json(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(v, f"{where}[{i}]") for i, v in enumerate(value)]
    kind = type(value).__module__.split(".")[0]
    if kind in ("numpy", "torch") and hasattr(value, "tolist"):
        if kind == "torch":
            value = value.detach().cpu()
        return plain_json(value.tolist(), where)
    raise TypeError(f"{where} is a {type(value).__module__}.{type(value).__name__}, which JSON cannot hold: return "
                    "numbers, strings, lists, dicts (numpy and torch arrays are stored as lists), or write large "
                    "data to a file yourself and return its path")


def _write_atomic(path: Path, record: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(record, ensure_ascii=False))
    os.replace(tmp, path)


def _call(task: Task, out: str, python_path: list[str]) -> str:
    """Runs in the worker: the call itself, then its record written atomically. Errors propagate to Dask."""
    for p in python_path:
        if p not in sys.path:
            sys.path.insert(0, p)
    if os.environ.get("KVLAB_THREADS"):  # a worker kvlab started (or one the user sized): its share of the cores
        from kvlab.threads import set_threads

        set_threads()
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
                  wall_seconds=time.time() - begin, result=plain_json(result, f"the result of task {task.name!r}"))
    _write_atomic(out_dir / f"{task.name}.json", record)
    return task.name


def check_name(name) -> str:
    """A task name is a file name inside ``out``: no path separator, no ``..``, not absolute, not hidden."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"task name must be a non-empty string, got {name!r}")
    if "/" in name or "\\" in name or os.sep in name or name in (".", "..") or name.startswith(".") \
            or Path(name).is_absolute() or "\0" in name:
        raise ValueError(f"task name {name!r} must be a plain file name (no '/', '\\', leading '.', '..' or absolute "
                         "path): it names OUT/<name>.json; change the grid's 'name' pattern or the parameter values")
    return name


def check_target(target: str) -> None:
    """A target that cannot run fails here, before any cluster starts: a notebook that does not exist, a module
    that does not import or has no such function."""
    if not isinstance(target, str) or not target:
        raise ValueError(f"target must be 'package.module:function' or a .ipynb path, got {target!r}")
    if target.endswith(".ipynb"):
        if not Path(target).is_file():
            raise ValueError(f"target notebook {target} does not exist")
        return
    module, _, function = target.partition(":")
    if not function:
        raise ValueError(f"target {target!r} must be 'package.module:function' or a .ipynb path")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise ValueError(f"target {target!r}: module {module!r} does not import ({exc})") from exc
    if not callable(getattr(mod, function, None)):
        raise ValueError(f"target {target!r}: module {module!r} has no function {function!r}")


def local_cluster(workers: int, gpu_workers: int = 0):
    """A Dask cluster on this machine: ``workers`` CPU processes with one thread each, plus ``gpu_workers``
    processes that hold the ``GPU`` resource (tasks with ``device="gpu"`` run only there)."""
    from distributed import Nanny, Scheduler, SpecCluster

    from kvlab.threads import worker_env

    # failures are reported by run_sweep, once; the worker processes share the cores (kvlab.threads)
    quiet = {"nthreads": 1, "silence_logs": logging.CRITICAL, "env": worker_env(max(1, workers + gpu_workers))}
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

    names = [check_name(t.name) for t in tasks]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"task names must be unique (each one names its result file); repeated: {twice[:5]}")
    if workers is not None:
        _check_count("workers", workers, 1)
    _check_count("gpu_workers", gpu_workers, 0)
    _check_count("retries", retries, 0)
    python_path = [str(Path(p).resolve()) for p in (python_path or [])]
    for p in python_path:  # the workers import targets with these on the path; so does the check
        if p not in sys.path:
            sys.path.insert(0, p)
    for target in sorted({t.target for t in tasks}):
        check_target(target)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    report = SweepReport(skipped=[t.name for t in tasks if _finished(t, out)])
    todo = sorted((t for t in tasks if t.name not in report.skipped), key=lambda t: -t.cost)
    if not todo:
        return report
    cluster = None
    if scheduler is None:
        cluster = local_cluster(workers or max((os.cpu_count() or 2) - 1, 1), gpu_workers)
        client = Client(cluster)
    else:
        try:
            client = Client(scheduler, timeout=SCHEDULER_TIMEOUT)
        except (OSError, TimeoutError, ValueError) as exc:
            raise ConnectionError(f"no Dask scheduler answers at {scheduler} within {SCHEDULER_TIMEOUT} s "
                                  f"({type(exc).__name__}): start one with `dask scheduler` and `dask worker "
                                  f"{scheduler} --nthreads 1`, or leave out --scheduler for a local cluster"
                                  ) from None
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


def _check_count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def grid_tasks(target: str, grid: dict, *, fixed: dict | None = None, name: str | None = None,
               device: str = "cpu") -> list[Task]:
    """Every combination of ``grid`` (a dict of lists) as a task; ``name`` formats the parameters.

    Raises ValueError (naming the entry and the fix) for a grid that is not a dict of non-empty lists, a
    ``name`` pattern with a field the parameters lack, a name that is not a plain file name, and two tasks of
    the same name."""
    if not isinstance(grid, dict):
        raise ValueError(f"grid must be a mapping of parameter -> list of values, got {type(grid).__name__}")
    if fixed is not None and not isinstance(fixed, dict):
        raise ValueError(f"fixed must be a mapping of parameter -> value, got {type(fixed).__name__}")
    if device not in ("cpu", "gpu"):
        raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"grid entry {key!r} must be a non-empty list, e.g. {key}: [{values!r}] (got {values!r})")
    keys = list(grid)
    tasks = []
    for combo in itertools.product(*(grid[k] for k in keys)):
        params = {**(fixed or {}), **dict(zip(keys, combo))}
        if name:
            try:
                label = str(name).format(**params)
            except KeyError as exc:
                raise ValueError(f"name {name!r} uses {{{exc.args[0]}}}, which is not a parameter; the parameters "
                                 f"are {sorted(params)}") from None
            except (IndexError, ValueError) as exc:
                raise ValueError(f"name {name!r} is not a format pattern of the parameters ({exc}); write fields "
                                 f"as {{parameter}}, from {sorted(params)}") from None
        else:
            label = "-".join(f"{k}{v}" for k, v in zip(keys, combo)) or "task"
        tasks.append(Task(check_name(label), target, params, device))
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"name {name!r} gives several tasks the same name {twice[:3]} (each names its result "
                         "file): use every grid parameter in the pattern")
    return tasks


def load_grid(path) -> tuple[list[Task], Path]:
    """Read a grid YAML (see the module docstring): the tasks and the output folder."""
    import yaml

    path = Path(path)
    spec = yaml.safe_load(path.read_text()) or {}
    if not isinstance(spec, dict):
        raise ValueError(f"{path}: a grid file is a YAML mapping (target:, grid:, ...), got {type(spec).__name__}")
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
    for flag, value, minimum in (("--workers", args.workers, 1), ("--gpu-workers", args.gpu_workers, 0),
                                 ("--retries", args.retries, 0)):
        if value is not None and value < minimum:
            print(f"kvlab sweep: {flag} must be >= {minimum}, got {value}", file=sys.stderr)
            return 2
    try:
        tasks, out = load_grid(args.grid)
        out = Path(args.out) if args.out else out
        if args.dry_run:
            for t in tasks:
                print(f"{'done' if _finished(t, out) else 'todo'}  {t.name:30s} {json.dumps(t.params, default=str)}")
            return 0
        report = run_sweep(tasks, out, scheduler=args.scheduler, workers=args.workers, gpu_workers=args.gpu_workers,
                           retries=args.retries, python_path=[os.getcwd()])
    except (ValueError, OSError) as exc:  # a bad grid, target, name or scheduler: one sentence, no traceback
        print(f"kvlab sweep: {exc}", file=sys.stderr)
        return 2
    print(report.summary())
    return 1 if report.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
