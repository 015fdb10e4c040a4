"""Time the numbered notebooks as a student runs them: one kernel per notebook, pinned to one core, one thread.

    python -m kvlab notebooks times run --set ci --out benchmarks/results/notebook_times --name ci_1thread
    python -m kvlab notebooks times run --set defaults -p device cpu --cores 2-15 --timeout 500 --deadline 520 \\
        --out OUTDIR --name defaults_cpu_1thread
    python -m kvlab notebooks times table benchmarks/results/notebook_times/ci_1thread.json

``run`` executes each notebook through papermill (kernel ``python3``, working directory ``notebooks/``, as
``python -m kvlab notebooks`` does) with either its CI set (``notebooks/params/NN_name.ci.yaml``) or its defaults, then
the ``-p NAME YAML`` overrides; an override is passed only to notebooks that declare that parameter, and
``num_threads: 1`` is always added where declared. Every process gets ``KVLAB_THREADS=1`` and ``OMP_NUM_THREADS=1``,
so torch computes with one thread in every notebook, and runs under ``taskset -c CORE``: ``--jobs`` notebooks at
once, each on its own core of ``--cores``.

Two times per notebook:

* ``wall_s``: seconds from start to end, which a loaded machine stretches;
* ``cpu_s``: user + system CPU seconds of the whole process tree (papermill, the kernel, what the kernel started and
  waited for), from ``wait4``. With one thread on one core this is what the wall time would be on an idle core,
  so it is the number to quote on a busy machine. ``kernel_cpu_s`` is the kernel's own count, printed by a cell
  appended after the last one (``resource.getrusage``), as a cross-check.

A notebook still running at ``--timeout`` seconds (or at ``--deadline`` seconds after the start of the whole run,
whichever comes first) is killed and reported as ``> N s`` with the last cell it reached and, in ``log_tail``, the
Python stack of each kernel thread just before (SIGUSR1, through a startup file in the kernel's IPYTHONDIR).
Results go to ``OUT/NAME.json`` and ``OUT/NAME.md``; executed notebooks to ``OUT/NAME_executed/`` (``--keep-notebooks``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
PARAMS = NOTEBOOKS / "params"
MARKER = "NOTEBOOK_TIMES "
# appended after the notebook's last cell: the kernel's own CPU time (itself and the children it waited for)
RUSAGE_CELL = f"""import json as _nt_json, resource as _nt_resource
_nt_self = _nt_resource.getrusage(_nt_resource.RUSAGE_SELF)
_nt_children = _nt_resource.getrusage(_nt_resource.RUSAGE_CHILDREN)
print({MARKER!r} + _nt_json.dumps({{"self_s": _nt_self.ru_utime + _nt_self.ru_stime,
      "children_s": _nt_children.ru_utime + _nt_children.ru_stime, "maxrss_mb": _nt_self.ru_maxrss / 1024}}))"""
THREAD_ENV = {"KVLAB_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


# ----------------------------------------------------------------------------------------------- inputs
def parse_cores(text: str) -> list[int]:
    """``"2-15"``, ``"0"`` or ``"1,3,5-7"`` -> a list of core ids."""
    cores: list[int] = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ValueError(f"--cores must be core ids and ranges like '2-15' or '0,2,4-7', got {text!r}")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ValueError(f"--cores range {part!r} runs backwards: write it low-high, e.g. '{hi}-{lo}'")
        cores.extend(range(lo, hi + 1))
    if len(set(cores)) != len(cores):
        raise ValueError(f"--cores names a core twice: {text!r}")
    return cores


def ci_parameters(nb: pathlib.Path) -> dict:
    """The CI set of ``nb``: ``notebooks/params/NN_name.ci.yaml`` ({} where there is none)."""
    import yaml

    path = PARAMS / f"{nb.stem}.ci.yaml"
    return yaml.safe_load(path.read_text()) or {} if path.exists() else {}


def declared(nb: pathlib.Path) -> dict:
    """Parameters the notebook's ``parameters`` cell declares, with their default values (as written where the
    text is not a Python literal)."""
    import ast

    import papermill

    def value(text: str):
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return text

    return {name: value(info["default"]) for name, info in papermill.inspect_notebook(str(nb)).items()}


def plan(nb: pathlib.Path, which: str, overrides: dict) -> tuple[dict, list[str]]:
    """Parameters to inject into ``nb`` for set ``which`` ("ci" or "defaults") plus ``overrides`` (kept only
    where the notebook declares the name), and the override names it does not declare."""
    names = declared(nb)
    params = ci_parameters(nb) if which == "ci" else {}
    extra = {"num_threads": 1, **overrides}
    params.update({k: v for k, v in extra.items() if k in names})
    return params, sorted(k for k in overrides if k not in names)


def selected(names: list[str]) -> list[pathlib.Path]:
    if not names:
        return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    out = []
    for n in names:
        path = pathlib.Path(n)
        if not path.exists():  # a number or a stem: "03", "03_sepllm_streaming"
            found = sorted(NOTEBOOKS.glob(f"{n}*.ipynb"))
            if len(found) != 1:
                raise SystemExit(f"notebook {n!r}: give a path or a unique prefix of a file in {NOTEBOOKS} "
                                 f"(found {[f.name for f in found]})")
            path = found[0]
        out.append(path.resolve())
    return out


# ----------------------------------------------------------------------------------------------- one notebook
def execute(source: pathlib.Path, target: pathlib.Path, params_json: str) -> None:
    """Child process: run ``source`` with papermill into ``target``, the rusage cell appended."""
    import nbformat
    import papermill

    nb = nbformat.read(source, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(RUSAGE_CELL))
    staged = target.with_name(target.stem + ".input.ipynb")
    nbformat.write(nb, staged)
    try:
        papermill.execute_notebook(str(staged), str(target), parameters=json.loads(params_json),
                                   kernel_name="python3", cwd=str(NOTEBOOKS), progress_bar=False)
    finally:
        staged.unlink(missing_ok=True)


def progress(target: pathlib.Path) -> dict:
    """From the (partial) executed notebook papermill saves after each cell: cells done, the last cell reached
    (index among all cells, first line of its source), the three slowest cells (wall seconds), the kernel's CPU
    line and the error of a failed cell."""
    import nbformat

    info: dict = {"cells": None, "cells_done": None, "last_cell": None, "slowest_cells": {}, "kernel": None,
                  "error": None}
    try:
        nb = nbformat.read(target, as_version=4)
    except Exception:  # not written yet, or written half when the process was killed
        return info
    cells = nb.cells[:-1] if nb.cells and MARKER.strip() in nb.cells[-1].source else nb.cells
    info["cells"] = len(cells)
    reached = [i for i, c in enumerate(cells) if c.metadata.get("papermill", {}).get("status") in ("completed",
                                                                                                     "running")]
    info["cells_done"] = sum(c.metadata.get("papermill", {}).get("status") == "completed" for c in cells)
    took = [(c.metadata.get("papermill", {}).get("duration") or 0.0, i) for i, c in enumerate(cells)]
    info["slowest_cells"] = {f"cell {i}": round(d, 1) for d, i in sorted(took, reverse=True)[:3] if d >= 0.5}
    if reached:
        i = reached[-1]
        first = next((line for line in cells[i].source.splitlines()
                      if line.strip() and not line.startswith("# NBVAL")), "")
        info["last_cell"] = f"cell {i} of {len(cells)}: {first[:80]}"
    info.update(_kernel_and_error(nb))
    return info


def _kernel_and_error(nb) -> dict:
    """The kernel's CPU line (printed by :data:`RUSAGE_CELL`) and the last error output of ``nb``, where there are."""
    found = {}
    for out in (o for cell in nb.cells for o in cell.get("outputs", [])):
        if out.get("output_type") == "stream" and MARKER in out.get("text", ""):
            line = next(x for x in out["text"].splitlines() if x.startswith(MARKER))
            found["kernel"] = json.loads(line[len(MARKER):])
        if out.get("output_type") == "error":
            found["error"] = f"{out.get('ename')}: {out.get('evalue')}"[:400]
    return found


STACKS_ENV = "NOTEBOOK_TIMES_STACKS"
STARTUP = f"""import faulthandler, os, signal
faulthandler.register(signal.SIGUSR1, file=open(os.environ[{STACKS_ENV!r}], "w"), all_threads=True)
"""


def ipython_dir(folder: pathlib.Path) -> pathlib.Path:
    """An IPYTHONDIR whose startup file lets SIGUSR1 dump the kernel's stacks (to ``$NOTEBOOK_TIMES_STACKS``)."""
    path = folder / "ipython"
    startup = path / "profile_default" / "startup" / "00-notebook-times.py"
    startup.parent.mkdir(parents=True, exist_ok=True)
    startup.write_text(STARTUP)
    return path


def _is_kernel(process) -> bool:
    try:
        return "ipykernel_launcher" in " ".join(process.cmdline())
    except Exception:
        return False


class Run:
    """One notebook's process tree, pinned to one core."""

    def __init__(self, nb: pathlib.Path, params: dict, core: int, target: pathlib.Path, limit: float):
        self.nb, self.params, self.core, self.target, self.limit = nb, params, core, target, limit
        self.log = target.with_suffix(".log")
        command = [sys.executable, "-m", "kvlab.notebooks.times", "_execute", str(nb), str(target),
                   json.dumps(params)]
        if shutil.which("taskset"):
            command = ["taskset", "-c", str(core), *command]
        self.stacks = target.with_suffix(".stacks")
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # kvlab, installed or not
        env = {**os.environ, **THREAD_ENV, "PYTHONPATH": path, "IPYTHONDIR": str(ipython_dir(target.parent)), STACKS_ENV: str(self.stacks)}
        self.start = time.monotonic()
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True,
                                         preexec_fn=None if shutil.which("taskset") else self._pin)
        self.samples: dict[int, float] = {}  # pid -> its own CPU seconds when last seen (for a killed tree)
        self.result: dict | None = None

    def _pin(self) -> None:
        os.sched_setaffinity(0, {self.core})

    def _sample(self) -> None:
        try:
            import psutil
        except ImportError:
            return
        try:
            root = psutil.Process(self.proc.pid)
            for p in [root, *root.children(recursive=True)]:
                t = p.cpu_times()
                self.samples[p.pid] = t.user + t.system
        except psutil.Error:
            pass

    def poll(self, now: float) -> bool:
        """True once finished (normally, with an error, or killed at its limit)."""
        pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
        if pid == 0:
            if now - self.start < self.limit:
                self._sample()
                return False
            self._sample()
            self._kill()
            pid, status, usage = os.wait4(self.proc.pid, 0)
            self._finish(now, status, usage, timed_out=True)
            return True
        self._finish(now, status, usage, timed_out=False)
        return True

    def _kill(self) -> None:
        try:
            import psutil

            root = psutil.Process(self.proc.pid)
            tree = [root, *root.children(recursive=True)]
        except Exception:
            tree = []
        # first ask each kernel where it is: the startup file makes SIGUSR1 write every thread's Python stack to
        # NN.stacks (a kernel that waits instead of computing shows on what)
        kernels = [p for p in tree if _is_kernel(p)]
        for p in kernels:
            try:
                p.send_signal(signal.SIGUSR1)
            except Exception:
                pass
        if kernels:
            time.sleep(2)
        for p in reversed(tree):  # the kernel and what it started, then papermill
            try:
                p.kill()
            except Exception:
                pass
        if not tree:
            self.proc.kill()

    def _finish(self, now: float, status: int, usage, timed_out: bool) -> None:
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        tree_cpu = usage.ru_utime + usage.ru_stime
        info = progress(self.target)
        kernel = info.pop("kernel")
        wall = now - self.start
        if timed_out:
            state = "timeout"
        elif self.proc.returncode == 0 and kernel is not None:
            state = "ok"
        else:
            state = "failed"
        sampled = sum(self.samples.values())
        tail = ""
        if state != "ok":
            text = self.log.read_text(errors="replace") if self.log.exists() else ""
            tail = "\n".join(text.strip().splitlines()[-40:])
        if timed_out and self.stacks.exists():  # where the kernel was when it was stopped, its main thread first
            blocks = self.stacks.read_text(errors="replace").strip().split("\n\n")
            blocks.sort(key=lambda b: not b.startswith("Current thread"))
            tail = (tail + "\n--- kernel stacks at the timeout ---\n"
                    + "\n".join("\n\n".join(blocks).splitlines()[:60])).strip()
        self.result = {
            "notebook": self.nb.name, "status": state, "core": self.core, "parameters": self.params,
            "wall_s": round(wall, 1), "limit_s": round(self.limit, 1),
            # a killed tree was not waited for: its CPU is what the last sample saw
            "cpu_s": round(max(tree_cpu, sampled) if timed_out else tree_cpu, 1),
            "kernel_cpu_s": round(kernel["self_s"] + kernel["children_s"], 1) if kernel else None,
            "kernel_maxrss_mb": round(kernel["maxrss_mb"]) if kernel else None,
            **info, "returncode": self.proc.returncode, "log_tail": tail,
        }


# ----------------------------------------------------------------------------------------------- the run
def machine() -> dict:
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    info = {"host": platform.node(), "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version()}
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        pass
    try:
        info["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    return info


def run(args: argparse.Namespace) -> dict:
    import yaml

    cores = parse_cores(args.cores)
    jobs = args.jobs or len(cores)
    if jobs < 1 or jobs > len(cores):
        raise SystemExit(f"--jobs must be between 1 and the {len(cores)} cores of --cores, got {jobs}: "
                         f"name more cores or run fewer at once")
    if args.timeout <= 0:
        raise SystemExit(f"--timeout must be > 0 seconds, got {args.timeout}")
    overrides = {k: yaml.safe_load(v) for k, v in args.parameter}
    queue = []
    for nb in selected(args.names):
        params, ignored = plan(nb, args.set, overrides)
        queue.append((nb, params, ignored))
    folder = open_output(args.out.resolve(), args.name)
    out = folder.root
    executed = folder.claim(f"{args.name}_executed/")
    executed.mkdir(parents=True, exist_ok=True)
    report = {"set": args.set, "overrides": overrides, "threads": 1, "jobs": jobs, "cores": cores,
              "timeout_s": args.timeout, "deadline_s": args.deadline, "command": " ".join(sys.argv),
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": machine(), "notebooks": []}
    t0 = time.monotonic()
    free, running, results = list(cores[:jobs]), [], {}
    while queue or running:
        now = time.monotonic()
        while queue and free:
            nb, params, ignored = queue.pop(0)
            limit = args.timeout if args.deadline is None else min(args.timeout, args.deadline - (now - t0))
            if limit <= 1:
                results[nb.name] = {"notebook": nb.name, "status": "not started", "parameters": params,
                                    "wall_s": None, "cpu_s": None, "limit_s": 0,
                                    "last_cell": "none: the run's deadline came first"}
                continue
            run_ = Run(nb, params, free.pop(0), executed / nb.name, limit)
            run_.ignored = ignored
            running.append(run_)
            print(f"[{now - t0:6.0f} s] start {nb.name} on core {run_.core} (limit {limit:.0f} s) {params}",
                  flush=True)
        time.sleep(0.5)
        now = time.monotonic()
        for r in list(running):
            if r.poll(now):
                running.remove(r)
                free.append(r.core)
                r.result["overrides_not_declared"] = r.ignored
                results[r.nb.name] = r.result
                print(f"[{now - t0:6.0f} s] {r.result['status']:7s} {r.nb.name}: wall {r.result['wall_s']} s, "
                      f"cpu {r.result['cpu_s']} s, {r.result['last_cell']}", flush=True)
                if r.result["status"] != "ok" and r.result.get("log_tail"):
                    print("    " + r.result["log_tail"].replace("\n", "\n    "), flush=True)
    report["notebooks"] = [results[k] for k in sorted(results)]
    report["total_wall_s"] = round(time.monotonic() - t0, 1)
    folder.claim(f"{args.name}.json").write_text(json.dumps(report, indent=1) + "\n")
    folder.claim(f"{args.name}.md").write_text(table(report))
    if args.keep_notebooks:
        strip_images(executed)
    else:
        folder.remove_tree(f"{args.name}_executed")
    print(f"wrote {out / args.name}.json and .md")
    return report


def _times_report(path: pathlib.Path) -> bool:
    """A file an earlier ``times run`` wrote (before its folder kept a manifest): a report (JSON with the run's set
    and notebooks, or its table), or what it kept of the executed notebooks. (``benchmarks/gpu/notebook_times.sh``
    marks its own logs beside them ``keep:`` in the folder's manifest.)"""
    if any(part.endswith("_executed") for part in path.parent.parts):
        return True
    try:
        if path.suffix == ".json":
            report = json.loads(path.read_text())
            return isinstance(report, dict) and {"set", "notebooks"} <= set(report)
        return path.suffix == ".md" and path.with_suffix(".json").is_file() and _times_report(path.with_suffix(".json"))
    except (OSError, ValueError):
        return False


def open_output(out: pathlib.Path, name: str):
    """``out`` under the output rule (:mod:`kvlab.outputs`): a file of anyone else's there stops the run before any
    notebook starts."""
    from kvlab.outputs import OutputFolder

    return OutputFolder(out, "python -m kvlab notebooks times run", recognise=_times_report)


def strip_images(folder: pathlib.Path) -> None:
    """Drop the pictures from the executed notebooks in ``folder`` (they are kept to read the text outputs)."""
    import nbformat

    for path in folder.glob("*.ipynb"):
        try:
            nb = nbformat.read(path, as_version=4)
        except Exception:
            continue
        for cell in nb.cells:
            for out in cell.get("outputs", []):
                for key in [k for k in out.get("data", {}) if k.startswith("image/")]:
                    del out["data"][key]
        nbformat.write(nb, path)


def shown(r: dict, key: str) -> str:
    value = r.get(key)
    if r["status"] == "timeout" and key in ("wall_s", "cpu_s"):  # stopped at its limit: a lower bound
        return f"> {r['limit_s']:.0f}" if key == "wall_s" else f"≥ {value:.0f}"
    return "—" if value is None else f"{value:.0f}"


def _machine(m: dict) -> str:
    return f"{m.get('host', '?')} ({m.get('cpu', '?')}, {m.get('cores', '?')} cores; torch {m.get('torch', '?')})"


def table(report: dict) -> str:
    what = "its CI set (notebooks/params/NN.ci.yaml)" if report["set"] == "ci" else "its defaults"
    lines = [f"# Notebook run times: {what}, one thread", ""]
    if report.get("runs"):  # merged: each row names its run
        lines += ["Each notebook pinned to its own core, KVLAB_THREADS=1; the rows come from these runs (each row: the "
                  "last run that finished the notebook; overrides apply where a notebook declares them):", ""]
        lines += [f"- `{r['file']}`: {r['date']} on {_machine(r['machine'])}, overrides {r['overrides'] or 'none'}: "
                  f"`{r['command']}`" for r in report["runs"]]
    else:
        lines += [f"Measured {report['date']} on {_machine(report['machine'])}, {report['jobs']} notebook(s) at once, "
                  f"each pinned to its own core, KVLAB_THREADS=1. Overrides: {report['overrides'] or 'none'} (where "
                  "declared). Command:", "", f"    {report['command']}"]
    lines += [
        "",
        "`cpu` is the CPU seconds of the notebook's process tree (papermill and its kernel): with one thread this is "
        "the wall time on an idle core. `wall` is what this run took on this machine.",
        "",
        "| notebook | status | cpu s | wall s | kernel cpu s | peak MB | last cell reached / error |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in report["notebooks"]:
        note = r.get("error") or (r.get("last_cell") if r["status"] != "ok" else "")
        if report.get("runs") and r.get("run"):
            note = f"`{r['run']['file']}`" + (f": {note}" if note else "")
        lines.append(f"| {r['notebook']} | {r['status']} | {shown(r, 'cpu_s')} | {shown(r, 'wall_s')} | "
                     f"{shown(r, 'kernel_cpu_s')} | {shown(r, 'kernel_maxrss_mb')} | "
                     f"{(note or '').replace('|', '/')} |")
    lines.append("")
    return "\n".join(lines)


def _rank(row: dict) -> tuple:
    """Which of two rows of one notebook tells more: finished > stopped at a limit (the longer) > failed."""
    order = {"ok": 3, "timeout": 2, "failed": 1}.get(row["status"], 0)
    return (order, row.get("cpu_s") or 0) if row["status"] == "timeout" else (order, 0)


def merge(paths: list[pathlib.Path], out: pathlib.Path) -> dict:
    """One table from several runs of the same set: per notebook the row of the last file that ran it to the end
    (else the one stopped latest, else the last file's), each row naming its run (``run``: date, machine, command)."""
    reports = [json.loads(p.read_text()) for p in paths]
    if len({r["set"] for r in reports}) != 1:
        raise SystemExit(f"merge takes runs of one set (ci or defaults), got {[r['set'] for r in reports]}")
    rows: dict[str, dict] = {}
    for path, report in zip(paths, reports):
        for row in report["notebooks"]:
            row = {**row, "run": row.get("run") or {"file": path.name, "date": report["date"],
                                                    "machine": report["machine"], "command": report["command"]}}
            old = rows.get(row["notebook"])
            if old is None or _rank(row) >= _rank(old):
                rows[row["notebook"]] = row
    merged = {**reports[-1], "command": "merged: " + " + ".join(p.name for p in paths),
              "runs": [{"file": p.name, "date": r["date"], "machine": r["machine"], "command": r["command"],
                        "overrides": r["overrides"]} for p, r in zip(paths, reports)],
              "notebooks": [rows[k] for k in sorted(rows)]}
    out.with_suffix(".json").write_text(json.dumps(merged, indent=1) + "\n")
    out.with_suffix(".md").write_text(table(merged))
    return merged


# ----------------------------------------------------------------------------------------------- the first cells
LINE = "**Run time** on one CPU core, one thread: "
# what ``stamp`` writes and the tests read back: the defaults' time (a lower bound where the run was stopped or ran
# without an input that was not at hand), then the CI set's seconds
RUN_TIME = re.compile(r"\*\*Run time\*\* on one CPU core, one thread: (about|at least|more than) (\d+) (s|min) at the "
                      r"defaults(?: \(([^()]*)\))?, about (\d+) s with the small parameter set "
                      r"`params/([\w.-]+)\.ci\.yaml`")
# parameters that say where and how a notebook runs, not what it computes
NEUTRAL = {"device", "num_threads", "out", "results_path", "examples_out"}


def stated(source: str) -> list[tuple[str, ...]]:
    """The run-time statements in a cell's text (line breaks read as spaces): RUN_TIME's groups for each."""
    return RUN_TIME.findall(" ".join(source.split()))


def rounded(seconds: float) -> tuple[int, str]:
    """Seconds as the first cell states them: below 2 min to 5 s (at least 5 s), else to the minute."""
    if seconds < 120:
        return max(5, 5 * round(seconds / 5)), "s"
    return round(seconds / 60), "min"


def run_time_line(stem: str, ci: dict, defaults: dict, declared_defaults: dict, date: str) -> str:
    """The sentence for a notebook from its rows of the CI table and of the defaults table."""
    if ci.get("status") != "ok":
        raise ValueError(f"{stem}: its CI set did not run to the end ({ci.get('status')}): measure it again")
    ci_s, unit = rounded(ci["cpu_s"])
    if unit != "s":
        raise ValueError(f"{stem}: its CI set takes {ci['cpu_s']:.0f} s of CPU, over the 2 min target: shrink "
                         f"notebooks/params/{stem}.ci.yaml")
    changed = {k: v for k, v in defaults.get("parameters", {}).items()
               if k not in NEUTRAL and k in declared_defaults and declared_defaults[k] != v}
    if defaults.get("status") == "timeout":  # stopped: what it had taken by then is a lower bound. Pinned to one
        # core with one thread, its wall time at the stop (the limit) is what a student would have waited too
        head = f"more than {int(max(defaults['cpu_s'], defaults.get('wall_s') or 0) // 60)} min"
    elif defaults.get("status") == "ok":
        value, unit = rounded(defaults["cpu_s"])
        head = f"{'at least' if changed else 'about'} {value} {unit}"
    else:
        raise ValueError(f"{stem}: its defaults run {defaults.get('status')} ({defaults.get('error')}): no time to "
                         f"state")
    note = ""
    if changed:
        note = " (measured with " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in changed.items()) + \
               ": what it leaves out was not at hand)"
    return (f"{LINE}{head} at the defaults{note}, about {ci_s} s with the small parameter set "
            f"`params/{stem}.ci.yaml` (CPU time, {date}; `benchmarks/results/notebook_times/`).")


def set_first_cell_line(path: pathlib.Path, line: str) -> bool:
    """Put ``line`` (wrapped at 118 characters) as the last paragraph of the notebook's first (markdown) cell,
    replacing an earlier one.
    Reads the file just before writing it and touches nothing else. Returns whether the file changed."""
    text = path.read_text()
    nb = json.loads(text)
    cell = nb["cells"][0]
    if cell["cell_type"] != "markdown":
        raise ValueError(f"{path.name}: the first cell is not the title cell (markdown)")
    source = "".join(cell["source"])
    kept = [p for p in source.rstrip("\n").split("\n\n") if not p.startswith(LINE)]
    wrapped = textwrap.fill(line, width=118, break_long_words=False, break_on_hyphens=False)
    new = "\n\n".join([*kept, wrapped])
    if new == source:
        return False
    cell["source"] = new.splitlines(keepends=True)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return True


def stamp(ci_path: pathlib.Path, defaults_path: pathlib.Path, names: list[str]) -> None:
    ci, defaults = json.loads(ci_path.read_text()), json.loads(defaults_path.read_text())
    ci_rows = {r["notebook"]: r for r in ci["notebooks"]}
    default_rows = {r["notebook"]: r for r in defaults["notebooks"]}
    date = defaults["date"].split()[0]
    problems = []
    for nb in selected(names):
        try:
            if nb.name not in ci_rows or nb.name not in default_rows:
                raise ValueError(f"{nb.stem}: not in {ci_path.name} and {defaults_path.name} both")
            line = run_time_line(nb.stem, ci_rows[nb.name], default_rows[nb.name], declared(nb), date)
        except ValueError as err:
            problems.append(str(err))
            continue
        print(("updated " if set_first_cell_line(nb, line) else "unchanged ") + nb.name)
    if problems:
        raise SystemExit("not stamped:\n  " + "\n  ".join(problems))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvlab notebooks times", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="execute and time notebooks")
    r.add_argument("--set", choices=["ci", "defaults"], required=True,
                   help="start from the CI parameter set or from the notebook's defaults")
    r.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "YAML"),
                   help="override a parameter where the notebook declares it, e.g. -p device cpu")
    r.add_argument("--cores", default="0", help="cores to pin notebooks to, e.g. 0 or 2-15 (default 0)")
    r.add_argument("--jobs", type=int, default=0, help="notebooks at once (default: one per core of --cores)")
    r.add_argument("--timeout", type=float, default=600, help="seconds each notebook may run (default 600)")
    r.add_argument("--deadline", type=float, default=None,
                   help="seconds after the start by which every notebook is stopped (default: none)")
    r.add_argument("--out", type=pathlib.Path, default=ROOT / "build" / "notebook_times")
    r.add_argument("--name", default="times", help="file names: OUT/NAME.json, OUT/NAME.md")
    r.add_argument("--keep-notebooks", action="store_true", help="keep the executed notebooks (pictures dropped) and their logs in OUT/NAME_executed")
    r.add_argument("names", nargs="*", help="notebooks (paths, or prefixes such as 03); default: all numbered")
    t = sub.add_parser("table", help="print the markdown table of a results JSON")
    t.add_argument("json", type=pathlib.Path)
    st = sub.add_parser("stamp", help="write the run-time line into each notebook's first cell")
    st.add_argument("--ci", type=pathlib.Path, required=True, help="results JSON of the CI sets")
    st.add_argument("--defaults", type=pathlib.Path, required=True, help="results JSON of the defaults")
    st.add_argument("names", nargs="*")
    m = sub.add_parser("merge", help="one table from several runs of the same set (later runs win)")
    m.add_argument("--out", type=pathlib.Path, required=True, help="OUT.json and OUT.md")
    m.add_argument("json", type=pathlib.Path, nargs="+")
    e = sub.add_parser("_execute", help=argparse.SUPPRESS)
    e.add_argument("source", type=pathlib.Path)
    e.add_argument("target", type=pathlib.Path)
    e.add_argument("params")
    args = parser.parse_args(argv)
    if args.command == "run":
        try:
            run(args)
        except ValueError as err:
            raise SystemExit(str(err))
    elif args.command == "merge":
        merge(args.json, args.out)
    elif args.command == "stamp":
        stamp(args.ci, args.defaults, args.names)
    elif args.command == "table":
        print(table(json.loads(args.json.read_text())), end="")
    else:
        execute(args.source, args.target, args.params)


if __name__ == "__main__":
    main()
