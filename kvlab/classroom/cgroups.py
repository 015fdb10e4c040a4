"""One control group per graded child: the kernel's own limits on what a whole child may hold (its threads and
processes, its memory including shared memory, memfd and tmpfs pages it writes, its CPU), made and removed by the
grader.

Two kinds of machine are handled:

- **cgroup v2** (the unified hierarchy, as on a current systemd distribution): the grader needs a sub-tree it may
  write, with the ``pids``, ``memory`` and ``cpu`` controllers: as root it makes one beside its own group; as a
  user it needs a delegated one (``systemd-run --user --scope -p Delegate=yes python -m kvlab lessons grade ...``).
  A group of its own (``kvlab-grade-PID``) holds the grader's children's groups (``child-N``); the controllers
  are enabled in it, the children's groups get ``pids.max``, ``memory.max`` (and ``memory.swap.max`` 0) and
  ``cpu.max`` (one CPU).
- **cgroup v1** (the controllers on their own hierarchies, as in many containers): as root, a group per child in
  each of the ``pids``, ``memory``, ``cpu`` and ``cpuacct`` hierarchies, under the grader's own group there
  (``pids.max``, ``memory.limit_in_bytes`` and ``memory.memsw.limit_in_bytes``, ``cpu.cfs_quota_us``).

Memory is charged to the group of the process that first touches a page: what a child copies of the zygote's
memory, allocates, or writes into a memfd, ``/dev/shm`` or a tmpfs counts against its own limit, and what it
shares unchanged with the zygote does not. A child over its ``pids.max`` cannot start a thread (its own code
fails, nobody else's fork does); over its memory limit the kernel kills it.

:func:`probe` says which kind is usable here (or why none is); the grader refuses to grade untrusted submissions
without one unless asked for the weaker per-process limits (``--no-cgroups``: rlimits only, see the guide).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

__all__ = ["ChildGroup", "Groups", "probe"]

V1_CONTROLLERS = ("pids", "memory", "cpu", "cpuacct")
V2_CONTROLLERS = ("pids", "memory", "cpu")
PERIOD_US = 100_000  # CPU quota period: one CPU is PERIOD_US of CPU time per PERIOD_US


def _own(line_prefix: str) -> str | None:
    """This process's group in the hierarchy whose /proc/self/cgroup line starts with ``line_prefix``."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                parts = line.rstrip("\n").split(":", 2)
                if len(parts) == 3 and parts[0] + ":" + parts[1] == line_prefix:
                    return parts[2]
                if len(parts) == 3 and line_prefix.startswith("*:") and line_prefix[2:] in parts[1].split(","):
                    return parts[2]
    except OSError:
        return None
    return None


def _write(path: str, value) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


@dataclass
class ChildGroup:
    """One child's group: ``paths``, its folder per controller (one folder for all on cgroup v2)."""

    paths: dict[str, str]
    version: int

    def folders(self) -> list[str]:
        return list(dict.fromkeys(self.paths.values()))

    def join(self) -> None:
        """Move the calling process into the group (called by the child itself, before it runs student code)."""
        pid = str(os.getpid())
        for p in self.folders():
            _write(os.path.join(p, "cgroup.procs"), pid)

    def cpu_seconds(self) -> float:
        """CPU time of every process and thread the group held, so far."""
        try:
            if self.version == 2:
                for line in _read(os.path.join(self.paths["cpu"], "cpu.stat")).splitlines():
                    if line.startswith("usage_usec "):
                        return int(line.split()[1]) / 1e6
                return 0.0
            return int(_read(os.path.join(self.paths["cpuacct"], "cpuacct.usage")).strip()) / 1e9
        except (OSError, ValueError):
            return 0.0

    def events(self) -> dict[str, bool]:
        """``pids``: a fork or thread was refused by ``pids.max``; ``memory``: the kernel killed for its memory."""
        out = {"pids": _counter(os.path.join(self.paths["pids"], "pids.events"), ("max",))}
        if self.version == 2:
            out["memory"] = _counter(os.path.join(self.paths["memory"], "memory.events"), ("oom_kill", "oom"))
        else:
            out["memory"] = _counter(os.path.join(self.paths["memory"], "memory.oom_control"), ("oom_kill",))
        return out

    def _pids(self) -> set[int]:
        pids = set()
        for p in self.folders():
            try:
                pids.update(int(x) for x in _read(os.path.join(p, "cgroup.procs")).split())
            except (OSError, ValueError):
                pass
        return pids

    def kill(self) -> None:
        """SIGKILL every process in the group (cgroup.kill on v2; each listed pid, until none is left, on v1)."""
        if self.version == 2:
            try:
                _write(os.path.join(self.paths["pids"], "cgroup.kill"), 1)
                return
            except OSError:
                pass
        for _ in range(100):
            pids = self._pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.005)

    def remove(self) -> None:
        """Kill what is left in the group and remove it (a group still emptying is retried for a second)."""
        self.kill()
        for p in self.folders():
            for _ in range(200):
                try:
                    os.rmdir(p)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    self.kill()
                    time.sleep(0.005)


def _counter(path: str, keys: tuple[str, ...]) -> bool:
    """Whether one of the ``keys`` lines of a cgroup events file counts more than 0."""
    try:
        lines = _read(path).splitlines()
    except OSError:
        return False
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[0] in keys and parts[1].isdigit() and int(parts[1]) > 0:
            return True
    return False


class Groups:
    """Where the grader makes its children's groups: ``bases``, its own folder per controller."""

    def __init__(self, version: int, bases: dict[str, str]):
        self.version = version
        self.bases = bases
        self.count = 0

    def make(self, pids: int, memory: int, cpus: float = 1.0) -> ChildGroup:
        """A new group for one child: at most ``pids`` processes and threads, ``memory`` bytes (no swap),
        ``cpus`` CPUs."""
        self.count += 1
        name = f"child-{self.count}"
        group = ChildGroup({c: os.path.join(b, name) for c, b in self.bases.items()}, self.version)
        for p in group.folders():
            os.mkdir(p)
        quota = max(1000, int(cpus * PERIOD_US))
        try:
            if self.version == 2:
                p = group.paths["pids"]
                _write(os.path.join(p, "pids.max"), pids)
                _write(os.path.join(p, "memory.max"), memory)
                if os.path.exists(os.path.join(p, "memory.swap.max")):
                    _write(os.path.join(p, "memory.swap.max"), 0)
                _write(os.path.join(p, "cpu.max"), f"{quota} {PERIOD_US}")
            else:
                _write(os.path.join(group.paths["pids"], "pids.max"), pids)
                _write(os.path.join(group.paths["memory"], "memory.limit_in_bytes"), memory)
                memsw = os.path.join(group.paths["memory"], "memory.memsw.limit_in_bytes")
                if os.path.exists(memsw):
                    _write(memsw, memory)
                _write(os.path.join(group.paths["cpu"], "cpu.cfs_period_us"), PERIOD_US)
                _write(os.path.join(group.paths["cpu"], "cpu.cfs_quota_us"), quota)
        except OSError:
            group.remove()
            raise
        return group

    def close(self) -> None:
        """Remove every child's group left and the grader's own folders."""
        for b in dict.fromkeys(self.bases.values()):
            for entry in _subdirs(b):
                ChildGroup({"pids": entry, "memory": entry, "cpu": entry, "cpuacct": entry}, 2).remove()
            try:
                os.rmdir(b)
            except OSError:
                pass


def _subdirs(path: str) -> list[str]:
    try:
        return [os.path.join(path, d) for d in os.listdir(path) if os.path.isdir(os.path.join(path, d))]
    except OSError:
        return []


def _v2(root: str) -> Groups | str:
    own = _own("0:")
    if own is None:
        return "this process is in no cgroup v2 group"
    parent = os.path.join(root, own.lstrip("/"))
    try:
        available = _read(os.path.join(parent, "cgroup.controllers")).split()
    except OSError as exc:
        return f"its cgroup v2 group {parent} cannot be read ({exc.strerror})"
    missing = [c for c in V2_CONTROLLERS if c not in available]
    if missing:
        return f"the controllers {', '.join(missing)} are not available in the cgroup v2 group {parent}"
    base = os.path.join(parent, f"kvlab-grade-{os.getpid()}")
    try:
        os.mkdir(base)
        _write(os.path.join(base, "cgroup.subtree_control"), " ".join(f"+{c}" for c in V2_CONTROLLERS))
    except OSError as exc:
        try:
            os.rmdir(base)
        except OSError:
            pass
        return f"no group can be made and given the controllers under {parent} ({exc.strerror})"
    return Groups(2, {c: base for c in V1_CONTROLLERS})


def _v1(root: str) -> Groups | str:
    bases: dict[str, str] = {}
    for controller in V1_CONTROLLERS:
        mount = os.path.join(root, controller)
        own = _own(f"*:{controller}")
        if own is None or not os.path.isdir(mount):
            _undo(bases)
            return f"the cgroup v1 controller {controller} is not mounted"
        base = os.path.join(os.path.realpath(mount), own.lstrip("/"), f"kvlab-grade-{os.getpid()}")
        if base in bases.values():  # co-mounted controllers (cpu,cpuacct): one folder
            bases[controller] = base
            continue
        try:
            os.mkdir(base)
        except OSError as exc:
            _undo(bases)
            return f"no group can be made in {os.path.dirname(base)} ({exc.strerror})"
        bases[controller] = base
    return Groups(1, bases)


def _undo(bases: dict[str, str]) -> None:
    for b in bases.values():
        try:
            os.rmdir(b)
        except OSError:
            pass


def _sweep(parent: str) -> None:
    """Remove the groups a grader that was killed left under ``parent`` (``kvlab-grade-PID`` of a dead PID)."""
    for entry in _subdirs(parent):
        name = os.path.basename(entry)
        if not name.startswith("kvlab-grade-") or not name[12:].isdigit():
            continue
        if os.path.exists(f"/proc/{name[12:]}"):
            continue
        for child in _subdirs(entry):
            ChildGroup({c: child for c in V1_CONTROLLERS}, 2).remove()
        try:
            os.rmdir(entry)
        except OSError:
            pass


def probe(root: str = "/sys/fs/cgroup") -> Groups | str:
    """The grader's groups (made now; :meth:`Groups.close` removes them), or why none can be made here. Groups a
    killed grader left behind are removed first."""
    if not os.path.isdir(root):
        return f"{root} does not exist (no cgroups: not Linux, or not mounted)"
    reasons = []
    unified = root if os.path.exists(os.path.join(root, "cgroup.controllers")) else os.path.join(root, "unified")
    if os.path.exists(os.path.join(unified, "cgroup.controllers")):
        got = _v2(unified)
        if isinstance(got, Groups):
            _sweep(os.path.dirname(got.bases["pids"]))
            return got
        reasons.append(f"cgroup v2: {got}")
    if os.path.isdir(os.path.join(root, "pids")):
        got = _v1(root)
        if isinstance(got, Groups):
            for base in dict.fromkeys(got.bases.values()):
                _sweep(os.path.dirname(base))
            return got
        reasons.append(f"cgroup v1: {got}")
    return "; ".join(reasons) or f"no cgroup hierarchy under {root}"
