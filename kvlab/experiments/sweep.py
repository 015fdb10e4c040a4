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
    python -m kvlab sweep grid.yaml --gpu-workers auto    # one worker pinned to each visible GPU
    python -m kvlab worker-env tcp://10.0.0.5:8786 | bash # on each GPU host: one `dask worker` per GPU, pinned

A grid file::

    target: kvlab.sepllm.theory:sliding_window_layers   # or: notebooks/03_sepllm_streaming.ipynb
    out: results/window_layers                          # relative to the grid file
    name: "d{distance}-n{neighbors}"                    # task name (file name), from the parameters
    fixed: {}                                           # the same for every task
    grid: {distance: [1024, 4096], neighbors: [64, 256]}   # every combination
    device: cpu                                          # or gpu: runs on workers started with the GPU resource

GPUs: a GPU worker is pinned to one device by ``CUDA_VISIBLE_DEVICES`` in its environment, so that inside it
``cuda:0`` is its own GPU. The devices are those this process sees (:func:`visible_gpus`); ``gpu_workers="auto"``
starts one worker per device (``workers_per_gpu`` per device to share each one between several model copies),
and asking for more is an error. Where GPU workers run, the CPU workers see no GPU. A ``device: gpu`` task runs
only on a worker holding the ``GPU`` resource; with none in the cluster the sweep refuses to start.
"""
from __future__ import annotations

import hashlib
import importlib
import itertools
import json
import logging
import os
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Task", "SweepReport", "grid_tasks", "load_grid", "run_sweep", "task_key", "local_cluster", "check_name",
           "check_target", "plain_json", "visible_gpus", "gpu_worker_devices", "worker_commands", "main",
           "worker_env_main"]

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


def task_finished(task: Task, out: Path) -> bool:
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


def call_task(task: Task, out: str, python_path: list[str]) -> str:
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
    # where it ran: which host and which GPU (a pinned worker's CUDA_VISIBLE_DEVICES), for per-device counts
    worker = dict(host=socket.gethostname(), pid=os.getpid(),
                  cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
    record = dict(name=task.name, key=task_key(task), target=task.target, params=task.params, device=task.device,
                  worker=worker, started=begin, wall_seconds=time.time() - begin,
                  result=plain_json(result, f"the result of task {task.name!r}"))
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


def check_notebook_params(target: str, tasks: list[Task]) -> None:
    """Every parameter a task passes to notebook ``target`` is declared in its ``parameters`` cell (papermill injects
    an undeclared name as a new variable that no cell reads, so the notebook would run with its default), of the
    declared type (element types of lists included), finite and in range: :func:`kvlab.core.checks.
    check_notebook_parameters`, before any cluster starts."""
    import papermill

    from kvlab.core.checks import check_notebook_parameters

    declared = set(papermill.inspect_notebook(target))
    unknown = sorted({k for t in tasks for k in t.params} - declared)
    if unknown:
        import difflib

        hints = [f"{k} (did you mean {near[0]!r}?)" if (near := difflib.get_close_matches(k, declared, n=1)) else k
                 for k in unknown]
        raise ValueError(f"{target} declares no parameter {', '.join(hints)} in its parameters cell (it declares "
                         f"{sorted(declared) or 'none'}): the notebook would run with its defaults; fix the names in "
                         "the grid / fixed, or declare them in the notebook's cell tagged 'parameters'")
    for t in tasks:
        try:
            check_notebook_parameters(target, t.params, f"task {t.name}")
        except TypeError as exc:
            raise ValueError(str(exc)) from None


def _sweep_record(path: Path) -> bool:
    """A result record a sweep wrote (before its folder kept a manifest), or an executed notebook of one."""
    if path.suffix == ".ipynb":
        return path.with_suffix(".json").is_file() and _sweep_record(path.with_suffix(".json"))
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and {"key", "target", "params", "result"} <= set(record)


def open_results(tasks: list[Task], out) -> "OutputFolder":
    """The result folder of ``tasks`` under the output rule (:mod:`kvlab.outputs`): new, or holding only what a
    sweep wrote (a file of the user's at ``OUT/<name>.json``, or anything else there, stops the sweep before it
    starts, naming the file); every result file the tasks will write is recorded in its manifest first."""
    from kvlab.outputs import OutputFolder

    folder = OutputFolder(out, "kvlab sweep", recognise=_sweep_record)
    folder.claim(".*.json.tmp*")  # the atomic writes' temporary files
    for t in tasks:  # left by a worker stopped while it wrote (Ctrl-C, a kill): never a result, so removed
        for stale in Path(out).glob(f".{t.name}.json.tmp*"):
            stale.unlink(missing_ok=True)
    folder.claim(*[f"{t.name}.json" for t in tasks])
    notebooks = [f"{t.name}.ipynb" for t in tasks if t.target.endswith(".ipynb")]
    if notebooks:
        folder.claim(*notebooks)
    return folder


def _keep_other_results(tasks: list[Task], out: Path, folder=None) -> None:
    """A result file in ``out`` under a task's name but from other parameters or another target (a changed
    ``fixed:`` value, a name pattern that leaves the changed parameter out) is kept, never replaced: it moves to
    ``<name>.<its key>.json``; a result kept that way for this task's parameters moves back and counts as done. A
    result of the same parameters from another kvlab version is redone in place."""
    for t in tasks:
        path = out / f"{t.name}.json"
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # absent or damaged: written (again)
        if not isinstance(old, dict) or (old.get("target") == t.target and json.dumps(
                old.get("params"), sort_keys=True, default=str) == json.dumps(
                plain_json(t.params, "params"), sort_keys=True, default=str)):
            continue
        aside = out / f"{t.name}.{old.get('key') or hashlib.sha256(path.read_bytes()).hexdigest()[:16]}.json"
        if folder is not None:
            folder.claim(aside.name)
        os.replace(path, aside)
        print(f"sweep: {path.name} holds other parameters ({json.dumps(old.get('params'), default=str)}); kept as "
              f"{aside.name}", file=sys.stderr)
        mine = out / f"{t.name}.{task_key(t)}.json"
        if mine.exists():
            os.replace(mine, path)


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA names them: the entries of ``CUDA_VISIBLE_DEVICES`` where it is set
    (indices or UUIDs, kept as written, up to the first invalid one as CUDA reads it; empty: none), else
    ``0 .. torch.cuda.device_count() - 1`` (none on a CPU machine)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        devices = []
        for entry in listed.split(","):
            entry = entry.strip()
            if not entry or entry.startswith("-"):  # CUDA stops at the first invalid entry; -1 hides every GPU
                break
            devices.append(entry)
        return devices
    try:
        import torch
    except ImportError:
        return []
    return [str(i) for i in range(torch.cuda.device_count())]


def _check_gpu_workers(gpu_workers, workers_per_gpu: int = 1) -> None:
    if gpu_workers != "auto":
        _check_count("gpu_workers", gpu_workers, 0)
    _check_count("workers_per_gpu", workers_per_gpu, 1)


def gpu_worker_devices(gpu_workers: int | str = "auto", workers_per_gpu: int = 1) -> list[str]:
    """The device each GPU worker is pinned to (its ``CUDA_VISIBLE_DEVICES``), worker ``i`` on
    ``visible_gpus()[i % len(visible_gpus())]``. ``gpu_workers="auto"``: ``workers_per_gpu`` per visible GPU (none
    on a CPU machine). Raises ValueError for more workers than ``workers_per_gpu`` per visible GPU."""
    _check_gpu_workers(gpu_workers, workers_per_gpu)
    if gpu_workers == 0:
        return []  # no GPU asked for: torch is not even imported
    gpus = visible_gpus()
    where = (f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r}" if "CUDA_VISIBLE_DEVICES" in os.environ
             else "torch.cuda.device_count()")
    if gpu_workers == "auto":
        gpu_workers = len(gpus) * workers_per_gpu
    if gpu_workers > len(gpus) * workers_per_gpu:
        if not gpus:
            raise ValueError(f"gpu_workers={gpu_workers} but this machine shows no GPU ({where}): leave gpu_workers "
                             "at 0 (or 'auto') and give the tasks device: cpu, or run on a machine with GPUs")
        raise ValueError(f"gpu_workers={gpu_workers} but {len(gpus)} GPU(s) are visible ({where}) with "
                         f"workers_per_gpu={workers_per_gpu}: ask for at most {len(gpus) * workers_per_gpu}, or "
                         f"'auto' (every GPU), or workers_per_gpu={-(-gpu_workers // len(gpus))} to share each GPU "
                         "between several workers")
    return [gpus[i % len(gpus)] for i in range(gpu_workers)]


def local_cluster(workers: int, gpu_workers: int | str = 0, *, workers_per_gpu: int = 1):
    """A Dask cluster on this machine: ``workers`` CPU processes with one thread each, plus ``gpu_workers``
    processes (``"auto"``: ``workers_per_gpu`` per visible GPU) that hold the ``GPU`` resource (tasks with
    ``device="gpu"`` run only there). GPU worker ``gpu-i`` is pinned to its device (:func:`gpu_worker_devices`)
    by ``CUDA_VISIBLE_DEVICES``; where there are GPU workers, the CPU workers see no GPU."""
    from distributed import Nanny, Scheduler, SpecCluster

    from kvlab.threads import worker_env

    _check_count("workers", workers, 0)
    devices = gpu_worker_devices(gpu_workers, workers_per_gpu)
    if not workers and not devices:
        raise ValueError("a local cluster needs at least one worker: give workers >= 1 or gpu_workers >= 1"
                         + (" (gpu_workers='auto' found no GPU)" if gpu_workers == "auto" else ""))
    # failures are reported by run_sweep, once; the worker processes share the cores (kvlab.threads)
    env = worker_env(max(1, workers + len(devices)))
    quiet = {"nthreads": 1, "silence_logs": logging.CRITICAL}
    cpu_env = {**env, "CUDA_VISIBLE_DEVICES": ""} if devices else env
    specs = {f"cpu-{i}": {"cls": Nanny, "options": {**quiet, "env": cpu_env}} for i in range(workers)}
    specs.update({f"gpu-{i}": {"cls": Nanny, "options": {**quiet, "resources": {"GPU": 1},
                                                         "env": {**env, "CUDA_VISIBLE_DEVICES": device}}}
                  for i, device in enumerate(devices)})
    # Ctrl-C in a terminal reaches the whole process group: this process takes it and closes the cluster, which
    # stops the workers; the workers ignore it, so none prints a traceback. A worker's Python starts with SIGINT
    # ignored (the disposition survives exec; Dask's start threads do not carry this thread's signal mask): the
    # spawn executable is, while the cluster starts, a shell line that ignores SIGINT and runs this Python. While
    # the cluster starts, SIGINT is blocked here: a Ctrl-C then arrives once the cluster exists, and closes it.
    import signal
    from multiprocessing import spawn

    for spec in specs.values():
        spec["options"]["preload"] = [__name__]
    blocked = hasattr(signal, "pthread_sigmask")
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if blocked else None
    executable = spawn.get_executable()
    if os.name == "posix":
        spawn.set_executable(_python_ignoring_sigint(executable))
    try:
        cluster = SpecCluster(workers=specs, scheduler={"cls": Scheduler, "options": {"dashboard_address": None}},
                              silence_logs=logging.ERROR)
    finally:
        spawn.set_executable(executable)
        if blocked and signal.SIGINT not in before:
            try:
                signal.pthread_sigmask(signal.SIG_SETMASK, before)  # a Ctrl-C during the start is raised here
            except KeyboardInterrupt:
                if "cluster" in locals():
                    cluster.close()
                raise
    return cluster


def _python_ignoring_sigint(python) -> str:
    """An executable that runs ``python`` with SIGINT ignored from its first instruction (``trap '' INT``; an
    ignored signal stays ignored across exec, and Python then installs no KeyboardInterrupt handler). Written once
    into the kvlab cache, named by the Python it runs."""
    import shlex
    import tempfile

    from kvlab.assets.integrity import cache_dir

    python = os.fsdecode(python)
    folder = cache_dir() / "bin"
    path = folder / f"python-ignoring-sigint-{hashlib.sha256(python.encode()).hexdigest()[:12]}"
    text = f"#!/bin/sh\ntrap '' INT\nexec {shlex.quote(python)} \"$@\"\n"
    if not path.is_file() or path.read_text() != text:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, prefix=".tmp-") as f:
            f.write(text)
        os.chmod(f.name, 0o755)
        os.replace(f.name, path)  # atomic: another process starting a cluster sees the old file or the whole one
    return str(path)


def dask_setup(worker) -> None:
    """Runs in each worker process of :func:`local_cluster` as it starts (a Dask preload): the worker ignores
    SIGINT (its cluster's process stops it) and takes it out of the signals blocked while the cluster started."""
    import signal

    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    except ValueError:  # not the main thread of the worker's process: leave the signals as they are
        pass


def _no_gpu_worker(gpu_tasks: list[Task], where: str) -> ValueError:
    return ValueError(f"{len(gpu_tasks)} task(s) ask for a GPU (device: gpu), e.g. {gpu_tasks[0].name!r}, but {where} "
                      "holds the GPU resource, and a GPU task never runs on a CPU-only worker: start GPU workers "
                      "(--gpu-workers auto / gpu_workers='auto' on a GPU machine; on a cluster `dask worker ADDRESS "
                      "--resources GPU=1` per GPU, as `python -m kvlab worker-env ADDRESS` prints) or set device: cpu")


def _check_torch_sees(devices: list[str]) -> None:
    """``gpu_workers='auto'`` found GPUs in ``CUDA_VISIBLE_DEVICES``: check that torch sees them, or GPU tasks would
    run on the CPU and be recorded as run on a GPU."""
    import torch

    seen = torch.cuda.device_count()
    if seen < len(set(devices)):
        raise ValueError(f"gpu_workers='auto': CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r} names "
                         f"{len(set(devices))} GPU(s) but torch sees {seen} (no GPU or no CUDA build of torch here): "
                         "run on the GPU machine, fix CUDA_VISIBLE_DEVICES, or give the tasks device: cpu")


def _check_sweep_args(tasks: list[Task], workers, gpu_workers, workers_per_gpu: int, retries: int,
                      python_path: list[str] | None) -> list[str]:
    """Refuse repeated task names and bad counts; put ``python_path`` on ``sys.path`` and check every target.
    Returns ``python_path`` resolved."""
    names = [check_name(t.name) for t in tasks]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"task names must be unique (each one names its result file); repeated: {twice[:5]}")
    if workers is not None:
        _check_count("workers", workers, 0 if gpu_workers else 1)
    _check_gpu_workers(gpu_workers, workers_per_gpu)
    _check_count("retries", retries, 0)
    python_path = [str(Path(p).resolve()) for p in (python_path or [])]
    for p in python_path:  # the workers import targets with these on the path; so does the check
        if p not in sys.path:
            sys.path.insert(0, p)
    for target in sorted({t.target for t in tasks}):
        check_target(target)
        if target.endswith(".ipynb"):
            check_notebook_params(target, [t for t in tasks if t.target == target])
    return python_path


def _start_local_cluster(todo: list[Task], gpu_tasks: list[Task], workers, gpu_workers, workers_per_gpu: int):
    """A local cluster for ``todo``: ValueError where GPU tasks would find no GPU worker."""
    devices = gpu_worker_devices(gpu_workers, workers_per_gpu)
    if gpu_workers == "auto" and gpu_tasks and devices:
        _check_torch_sees(devices)
    if gpu_tasks and not devices:
        raise _no_gpu_worker(gpu_tasks, "no local worker" + (" (gpu_workers='auto' found no GPU)"
                                                             if gpu_workers == "auto" else ""))
    if workers is None:
        workers = 0 if devices and len(gpu_tasks) == len(todo) else max((os.cpu_count() or 2) - 1, 1)
    return local_cluster(workers, len(devices), workers_per_gpu=workers_per_gpu)


def _connect(scheduler: str):
    """A client of the running scheduler at ``scheduler``, or ConnectionError naming how to start one."""
    from distributed import Client

    try:
        return Client(scheduler, timeout=SCHEDULER_TIMEOUT)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ConnectionError(f"no Dask scheduler answers at {scheduler} within {SCHEDULER_TIMEOUT} s "
                              f"({type(exc).__name__}): start one with `dask scheduler` and `dask worker "
                              f"{scheduler} --nthreads 1`, or leave out --scheduler for a local cluster"
                              ) from None


def _wait_for_gpu_worker(client, gpu_tasks: list[Task], scheduler: str) -> None:
    deadline = time.time() + SCHEDULER_TIMEOUT  # a worker may still be joining
    while not any("GPU" in (w.get("resources") or {})
                  for w in client.scheduler_info(n_workers=-1)["workers"].values()):
        if time.time() > deadline:
            raise _no_gpu_worker(gpu_tasks, f"no worker of the cluster at {scheduler}")
        time.sleep(0.2)


def _submit_and_collect(client, todo: list[Task], out: Path, python_path: list[str], retries: int,
                        report: SweepReport, progress: bool) -> None:
    """Submit every task of ``todo`` and note each one done or failed in ``report`` as it ends."""
    from distributed import as_completed
    from tqdm.auto import tqdm

    futures = {}
    for t in todo:
        resources = {"GPU": 1} if t.device == "gpu" else None
        fut = client.submit(call_task, t, str(out.resolve()), python_path, key=f"{t.name}-{task_key(t)}",
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


def run_sweep(tasks: list[Task], out, *, scheduler: str | None = None, workers: int | None = None,
              gpu_workers: int | str = 0, workers_per_gpu: int = 1, retries: int = 1,
              python_path: list[str] | None = None, progress: bool = True) -> SweepReport:
    """Run every unfinished task on a Dask cluster (``scheduler`` address, or a local one of ``workers`` CPU and
    ``gpu_workers`` GPU processes, see :func:`local_cluster`; ``workers=None``: none where GPU workers take every
    task, else cores - 1) and report. A ``device="gpu"`` task runs only on a worker holding the ``GPU`` resource:
    with none in the cluster, ValueError before anything runs."""
    from distributed import Client

    python_path = _check_sweep_args(tasks, workers, gpu_workers, workers_per_gpu, retries, python_path)
    out = Path(out)
    _keep_other_results(tasks, out, open_results(tasks, out))
    report = SweepReport(skipped=[t.name for t in tasks if task_finished(t, out)])
    todo = sorted((t for t in tasks if t.name not in report.skipped), key=lambda t: -t.cost)
    if not todo:
        return report
    gpu_tasks = [t for t in todo if t.device == "gpu"]
    cluster = client = None
    try:  # from the cluster's start on: an interrupt (Ctrl-C) anywhere closes what was started
        if scheduler is None:
            cluster = _start_local_cluster(todo, gpu_tasks, workers, gpu_workers, workers_per_gpu)
            client = Client(cluster)
        else:
            client = _connect(scheduler)
        if gpu_tasks and scheduler is not None:
            _wait_for_gpu_worker(client, gpu_tasks, scheduler)
        _submit_and_collect(client, todo, out, python_path, retries, report, progress)
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
    return report


def _check_count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _check_grid(grid, fixed, device: str) -> None:
    if not isinstance(grid, dict):
        raise ValueError(f"grid must be a mapping of parameter -> list of values, got {type(grid).__name__}")
    if fixed is not None and not isinstance(fixed, dict):
        raise ValueError(f"fixed must be a mapping of parameter -> value, got {type(fixed).__name__}")
    if device not in ("cpu", "gpu"):
        raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"grid entry {key!r} must be a non-empty list, e.g. {key}: [{values!r}] (got {values!r})")
    both = sorted(set(fixed or {}) & set(grid))
    if both:
        raise ValueError(f"{both} given both in fixed and in grid: the grid's values would silently replace the fixed "
                         "one; keep each parameter in one of them")


def _task_label(name: str | None, params: dict, keys: list, combo: tuple) -> str:
    """The task's name: ``name`` formatted with ``params``, or ``KEYVALUE-...`` of the grid's values."""
    if not name:
        return "-".join(f"{k}{v}" for k, v in zip(keys, combo)) or "task"
    try:
        return str(name).format(**params)
    except KeyError as exc:
        raise ValueError(f"name {name!r} uses {{{exc.args[0]}}}, which is not a parameter; the parameters "
                         f"are {sorted(params)}") from None
    except (IndexError, ValueError) as exc:
        raise ValueError(f"name {name!r} is not a format pattern of the parameters ({exc}); write fields "
                         f"as {{parameter}}, from {sorted(params)}") from None


def grid_tasks(target: str, grid: dict, *, fixed: dict | None = None, name: str | None = None,
               device: str = "cpu") -> list[Task]:
    """Every combination of ``grid`` (a dict of lists) as a task; ``name`` formats the parameters.

    Raises ValueError (naming the entry and the fix) for a grid that is not a dict of non-empty lists, a
    ``name`` pattern with a field the parameters lack, a name that is not a plain file name, and two tasks of
    the same name."""
    _check_grid(grid, fixed, device)
    keys = list(grid)
    tasks = []
    for combo in itertools.product(*(grid[k] for k in keys)):
        params = {**(fixed or {}), **dict(zip(keys, combo))}
        tasks.append(Task(check_name(_task_label(name, params, keys, combo)), target, params, device))
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
    if not path.is_file():
        raise ValueError(f"grid file {path} does not exist")
    try:
        spec = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ValueError(f"{path} is not valid YAML{where}: {getattr(exc, 'problem', None) or exc}; see the grid "
                         "format in `python -m kvlab sweep --help`") from None
    if not isinstance(spec, dict):
        raise ValueError(f"{path}: a grid file is a YAML mapping (target:, grid:, ...), got {type(spec).__name__}")
    unknown = set(spec) - {"target", "out", "name", "fixed", "grid", "device"}
    if unknown or "target" not in spec:
        raise ValueError(f"{path}: a grid file has 'target' (required), 'out', 'name', 'fixed', 'grid', 'device'"
                         + (f"; unknown keys {sorted(unknown)}" if unknown else ""))
    target = spec["target"]
    if not isinstance(target, str):
        raise ValueError(f"{path}: target must be 'package.module:function' or a .ipynb path, got {target!r}")
    if target.endswith(".ipynb"):
        target = str((path.parent / target).resolve())
    out = path.parent / spec.get("out", path.stem + "-results")
    tasks = grid_tasks(target, spec.get("grid") or {}, fixed=spec.get("fixed"), name=spec.get("name"),
                       device=spec.get("device", "cpu"))
    return tasks, out


def gpu_workers_arg(value: str):
    import argparse

    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 'auto' (one per visible GPU) or an int >= 0, got {value!r}")
    return n


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m kvlab sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("grid", help="a grid YAML file")
    p.add_argument("--out", help="result folder (default: the grid's 'out')")
    p.add_argument("--scheduler", help="address of a running Dask scheduler (default: a local cluster)")
    p.add_argument("--workers", type=int, default=None,
                   help="local CPU worker processes (default: none if GPU workers take every task, else cores - 1)")
    p.add_argument("--gpu-workers", type=gpu_workers_arg, default=0,
                   help="local worker processes holding the GPU resource, each pinned to one GPU by "
                        "CUDA_VISIBLE_DEVICES; 'auto': one per visible GPU (default 0)")
    p.add_argument("--workers-per-gpu", type=int, default=1,
                   help="GPU workers sharing one GPU (each its own model copy; default 1)")
    p.add_argument("--retries", type=int, default=1)
    p.add_argument("--dry-run", action="store_true", help="print the tasks and whether each is done")
    args = p.parse_args(argv)
    for flag, value, minimum in (("--workers", args.workers, 0 if args.gpu_workers else 1),
                                 ("--workers-per-gpu", args.workers_per_gpu, 1), ("--retries", args.retries, 0)):
        if value is not None and value < minimum:
            print(f"kvlab sweep: {flag} must be >= {minimum}, got {value}", file=sys.stderr)
            return 2
    try:
        tasks, out = load_grid(args.grid)
        out = Path(args.out) if args.out else out
        if args.dry_run:
            for t in tasks:
                print(f"{'done' if task_finished(t, out) else 'todo'}  {t.name:30s} {json.dumps(t.params, default=str)}")
            return 0
        report = run_sweep(tasks, out, scheduler=args.scheduler, workers=args.workers, gpu_workers=args.gpu_workers,
                           workers_per_gpu=args.workers_per_gpu, retries=args.retries, python_path=[os.getcwd()])
    except (ValueError, OSError) as exc:  # a bad grid, target, name or scheduler: one sentence, no traceback
        print(str(exc) if str(exc).startswith("kvlab sweep:") else f"kvlab sweep: {exc}", file=sys.stderr)
        return 2
    print(report.summary())
    return 1 if report.failed else 0


def worker_commands(address: str, *, workers_per_gpu: int = 1, cpu_workers: int = 0,
                    name: str | None = None) -> list[str]:
    """Shell lines that start this host's Dask workers for the scheduler at ``address``: ``workers_per_gpu``
    ``dask worker ADDRESS --nthreads 1 --resources GPU=1`` per visible GPU (:func:`visible_gpus`), each with
    ``CUDA_VISIBLE_DEVICES`` set to its device, and ``cpu_workers`` CPU workers that see no GPU; every one with its
    share of the cores (:func:`kvlab.threads.worker_env`) and a name ``NAME-gpuDEVICE[-k]`` / ``NAME-cpuI``
    (``name``: the host name). Each line ends in ``&`` and a last ``wait`` keeps them, so the output runs as a
    script (``| bash``)."""
    import shlex
    import socket

    from kvlab.threads import worker_env

    if not isinstance(address, str) or not address.strip():
        raise ValueError(f"address must be the scheduler's address, e.g. tcp://10.0.0.5:8786, got {address!r}")
    _check_count("workers_per_gpu", workers_per_gpu, 1)
    _check_count("cpu_workers", cpu_workers, 0)
    devices = gpu_worker_devices("auto", workers_per_gpu)
    if not devices and not cpu_workers:
        raise ValueError("this host shows no GPU (CUDA_VISIBLE_DEVICES / torch.cuda.device_count()): give "
                         "cpu_workers >= 1 (--cpu-workers N) for CPU workers, or run this on a GPU host")
    name = name or socket.gethostname()
    threads = worker_env(len(devices) + cpu_workers)
    lines = []
    for i, device in enumerate(devices):
        copy = f"-{i // len(set(devices))}" if workers_per_gpu > 1 else ""
        env = {**threads, "CUDA_VISIBLE_DEVICES": device}
        lines.append(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + f" dask worker {shlex.quote(address)}"
                     f" --nthreads 1 --resources GPU=1 --name {shlex.quote(f'{name}-gpu{device}{copy}')} &")
    for i in range(cpu_workers):
        env = {**threads, "CUDA_VISIBLE_DEVICES": ""} if devices else threads
        lines.append(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + f" dask worker {shlex.quote(address)}"
                     f" --nthreads 1 --name {shlex.quote(f'{name}-cpu{i}')} &")
    return lines + ["wait"]


def worker_env_main(argv: list[str] | None = None) -> int:
    """``python -m kvlab worker-env ADDRESS``: print :func:`worker_commands` (run them with ``| bash``)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m kvlab worker-env",
                                description="Print the `dask worker` command lines for this host's GPUs, one worker "
                                            "pinned to each GPU by CUDA_VISIBLE_DEVICES (pipe into bash to start them)")
    p.add_argument("address", help="the scheduler's address, e.g. tcp://10.0.0.5:8786 (from `dask scheduler`)")
    p.add_argument("--workers-per-gpu", type=int, default=1, help="workers sharing each GPU (default 1)")
    p.add_argument("--cpu-workers", type=int, default=0, help="CPU-only workers on this host too (default 0)")
    p.add_argument("--name", help="worker name prefix (default: the host name)")
    args = p.parse_args(argv)
    try:
        lines = worker_commands(args.address, workers_per_gpu=args.workers_per_gpu, cpu_workers=args.cpu_workers,
                                name=args.name)
    except ValueError as exc:
        print(f"kvlab worker-env: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
