"""kvlab.experiments.sweep on several GPUs: one worker pinned to each device, GPU tasks only on GPU workers, and the multi-host
recipe (a scheduler and `dask worker` processes started apart) on this machine, with fake device indices."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvlab.experiments import sweep
from kvlab.experiments.sweep import Task, gpu_worker_devices, local_cluster, run_sweep, visible_gpus

PROBE = '''
import os, time

def where(i, sleep=0.0):
    """Which worker ran this task and the GPUs its process may use."""
    from distributed import get_worker
    time.sleep(sleep)
    return {"i": i, "worker": get_worker().name, "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid()}
'''


@pytest.fixture
def probe(tmp_path):
    (tmp_path / "gpu_probe.py").write_text(PROBE)
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    sys.modules.pop("gpu_probe", None)


def test_visible_gpus_and_worker_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 5,GPU-8f2a")
    assert visible_gpus() == ["3", "5", "GPU-8f2a"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,-1,4")  # CUDA stops at the first invalid entry
    assert visible_gpus() == ["2"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == [] and gpu_worker_devices("auto") == []
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    import torch

    assert visible_gpus() == [str(i) for i in range(torch.cuda.device_count())]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert gpu_worker_devices("auto") == ["0", "1"] and gpu_worker_devices(1) == ["0"]
    assert gpu_worker_devices("auto", workers_per_gpu=2) == ["0", "1", "0", "1"]
    with pytest.raises(ValueError, match=r"gpu_workers=3 but 2 GPU\(s\) are visible .*workers_per_gpu=2"):
        gpu_worker_devices(3)
    with pytest.raises(ValueError, match="gpu_workers must be an int >= 0"):
        gpu_worker_devices("all")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ValueError, match="shows no GPU"):
        local_cluster(1, 2)


def test_worker_i_sees_only_device_i(probe, monkeypatch):
    """Each GPU worker's environment, read back by a task run on it: gpu-i has device i of the visible list, and
    the CPU worker beside them sees none."""
    from distributed import Client

    from gpu_probe import where

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    with local_cluster(1, "auto") as cluster, Client(cluster) as client:
        client.wait_for_workers(3, timeout=60)
        seen = {name: client.submit(where, name, workers=[name], pure=False).result(timeout=60)
                for name in ("cpu-0", "gpu-0", "gpu-1")}
        assert {n: r["worker"] for n, r in seen.items()} == {n: n for n in seen}
        assert {n: r["cuda"] for n, r in seen.items()} == {"cpu-0": "", "gpu-0": "3", "gpu-1": "5"}
        assert {w["name"]: w["resources"] for w in client.scheduler_info(n_workers=-1)["workers"].values()} == {
            "cpu-0": {}, "gpu-0": {"GPU": 1}, "gpu-1": {"GPU": 1}}


def test_gpu_task_without_gpu_worker_is_refused(tmp_path, monkeypatch, capsys):
    """Before: a device="gpu" task ran on a CPU worker when no worker held the GPU resource."""
    def no_cluster(*args, **kwargs):
        raise AssertionError("a cluster was started for GPU tasks with no GPU worker")

    monkeypatch.setattr(sweep, "local_cluster", no_cluster)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    task = Task("g", "os:getcwd", {}, device="gpu")
    for gpu_workers in (0, "auto"):
        with pytest.raises(ValueError, match=r"ask for a GPU .*'g'.*start GPU workers.*or set device: cpu"):
            run_sweep([task], tmp_path, workers=1, gpu_workers=gpu_workers, progress=False)
    grid = tmp_path / "g.yaml"
    grid.write_text("target: os:getcwd\ndevice: gpu\n")
    assert sweep.main([str(grid), "--workers", "1"]) == 2
    assert "never runs on a CPU-only worker" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.json"))


def _start(cmd, *, env, cwd, log):
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            shell=isinstance(cmd, str))


def test_scheduler_and_worker_processes_started_apart(probe, monkeypatch):
    """The multi-host recipe on one machine: `dask scheduler`, then the lines of `python -m kvlab worker-env` run by
    bash (a CPU-only host first, then a host of two fake GPUs), then `python -m kvlab sweep --scheduler ADDRESS`."""
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", ""), "PYTHONPATH": str(probe)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    log = open(probe / "processes.log", "w")
    procs = []
    try:
        procs.append(_start([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port",
                             "0", "--no-dashboard", "--scheduler-file", str(probe / "scheduler.json")],
                            env=env, cwd=probe, log=log))
        deadline = time.time() + 60
        while not (probe / "scheduler.json").exists():
            assert time.time() < deadline and procs[0].poll() is None, (probe / "processes.log").read_text()
            time.sleep(0.2)
        time.sleep(0.2)
        address = json.loads((probe / "scheduler.json").read_text())["address"]

        def host(devices, *flags):
            lines = subprocess.run([sys.executable, "-m", "kvlab", "worker-env", address, "--name", "h", *flags],
                                   env={**env, "CUDA_VISIBLE_DEVICES": devices}, cwd=probe, capture_output=True,
                                   text=True, check=True).stdout
            procs.append(_start(["bash", "-c", lines], env=env, cwd=probe, log=log))
            return lines

        cpu_lines = host("", "--cpu-workers", "1")
        assert "--resources" not in cpu_lines and "--name h-cpu0" in cpu_lines
        from distributed import Client

        with Client(address, timeout=30) as client:
            client.wait_for_workers(1, timeout=60)
            gpu_task = [Task(f"g{i}", "gpu_probe:where", {"i": i, "sleep": 2.0}, device="gpu") for i in range(2)]
            monkeypatch.setattr(sweep, "SCHEDULER_TIMEOUT", 1)
            with pytest.raises(ValueError, match=f"no worker of the cluster at {address} holds the GPU resource"):
                run_sweep(gpu_task, probe / "refused", scheduler=address, progress=False)
            assert not (probe / "refused").exists() or not list((probe / "refused").glob("*.json"))

            gpu_lines = host("4,7")
            assert gpu_lines.count("--resources GPU=1") == 2 and "CUDA_VISIBLE_DEVICES=7 " in gpu_lines
            client.wait_for_workers(3, timeout=60)
        (probe / "grid.yaml").write_text("target: gpu_probe:where\nout: res\ndevice: gpu\nname: 'g{i}'\n"
                                         "fixed: {sleep: 2.0}\ngrid: {i: [0, 1]}\n")
        done = subprocess.run([sys.executable, "-m", "kvlab", "sweep", "grid.yaml", "--scheduler", address],
                              env=env, cwd=probe, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        seen = [json.loads((probe / "res" / f"g{i}.json").read_text())["result"] for i in range(2)]
        # one GPU task per GPU worker (each holds GPU=1 and the tasks overlap), never on the CPU-only worker
        assert sorted((r["worker"], r["cuda"]) for r in seen) == [("h-gpu4", "4"), ("h-gpu7", "7")]
    finally:
        for proc in reversed(procs):  # the workers first, then the scheduler: each group we started, by its id
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


def test_leaderboard_cells_go_to_pinned_gpu_workers(tmp_path, monkeypatch, capsys):
    """The leaderboard hands run_sweep one GPU worker per visible GPU (times --workers-per-gpu), no CPU worker, and
    cells marked device="gpu"; on a machine without GPUs, 'auto' leaves the CPU workers and CPU cells."""
    from kvlab.experiments import leaderboard
    from kvlab.experiments.sweep import SweepReport

    calls = []

    def record(cells, out, **kwargs):  # what the leaderboard asks of the sweep; the sweep itself is tested above
        calls.append(({c.device for c in cells}, kwargs))
        return SweepReport()

    monkeypatch.setattr(sweep, "run_sweep", record)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert leaderboard.main(["--out", str(tmp_path), "--methods", "Full", "--tasks", "ppl", "--gpu-workers", "auto",
                             "--workers-per-gpu", "2"]) == 0
    devices, kwargs = calls[-1]
    assert devices == {"gpu"} and kwargs["gpu_workers"] == 4 and kwargs["workers_per_gpu"] == 2
    assert kwargs["workers"] is None and kwargs["scheduler"] is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    leaderboard.run_leaderboard("tiny", tmp_path, methods=["Full"], tasks=["ppl"], gpu_workers="auto", progress=False)
    devices, kwargs = calls[-1]
    assert devices == {"cpu"} and kwargs["gpu_workers"] == 0 and kwargs["workers"] == 2
    leaderboard.run_leaderboard("tiny", tmp_path, methods=["Full"], tasks=["ppl"], scheduler="tcp://h:1",
                                device="gpu", progress=False)
    assert calls[-1][0] == {"gpu"} and calls[-1][1]["scheduler"] == "tcp://h:1"
    assert leaderboard.main(["--report-only", "--out", str(tmp_path), "--workers", "2", "--gpu-workers", "1"]) == 2
    assert "give one" in capsys.readouterr().err
