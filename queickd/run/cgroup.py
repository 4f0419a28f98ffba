"""Per-job cgroups (v2), where the daemon may create them: `memory.max` with no swap and
`pids.max` per job, every process of the job (setsid ones included) inside it, all of
them killed at once (`cgroup.kill`) and the group removed after the job.

The daemon may create them when its own cgroup is on a writable cgroup v2 hierarchy with
the memory and pids controllers, i.e. systemd's `Delegate=yes` (or root on a host with a
v2 hierarchy). cgroup v2 lets a group hand controllers to its children only while it holds
no process itself, so the daemon first moves itself into a leaf (`<own>/daemon`) and the
jobs' groups are its siblings. `find()` says why not when it cannot; the runner then
watches RSS instead. Owns nothing of a job but its group's files.
"""

from __future__ import annotations

import contextlib
import os
import time

PIDS_MAX = 512  # processes one job may have at once


def _own_cgroup() -> str | None:
    """The path of this process's cgroup on the v2 hierarchy, from /proc."""
    mount = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split()[:1] == ["cgroup2"]:
                mount = left.split()[4]
                break
    if mount is None:
        return None
    with open("/proc/self/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                return os.path.join(mount, line[3:].strip().lstrip("/"))
    return None


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


class JobCgroup:
    def __init__(self, path: str) -> None:
        self.path = path

    def _read(self, name: str) -> str | None:
        try:
            with open(os.path.join(self.path, name)) as f:
                return f.read()
        except OSError:
            return None

    def memory_peak(self) -> int | None:
        v = self._read("memory.peak") or self._read("memory.current")
        return int(v) if v and v.strip().isdigit() else None

    def oom_killed(self) -> bool:
        for line in (self._read("memory.events") or "").splitlines():
            name, _, n = line.partition(" ")
            if name == "oom_kill" and n.strip() != "0":
                return True
        return False

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            _write(os.path.join(self.path, "cgroup.kill"), "1")

    def remove(self) -> None:
        """Kill what is left in it and remove it (a group with processes cannot be removed)."""
        self.kill()
        for _ in range(200):  # the kernel empties it within milliseconds of cgroup.kill
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.005)


class JobCgroups:
    """Creates the jobs' groups next to the daemon's own leaf."""

    reason = ""  # why the last find() found none

    def __init__(self, base: str) -> None:
        self.base = base
        self._n = 0

    @classmethod
    def find(cls) -> JobCgroups | None:
        try:
            base = _own_cgroup()
            if base is None:
                cls.reason = "no cgroup v2 hierarchy is mounted"
                return None
            with open(os.path.join(base, "cgroup.controllers")) as f:
                have = set(f.read().split())
            if not {"memory", "pids"} <= have:
                cls.reason = f"the cgroup {base} lacks the memory or pids controller"
                return None
            if os.path.basename(base) == "daemon" and os.path.exists(os.path.join(base, "..", "cgroup.kill")):
                base = os.path.dirname(base)  # moved there by an earlier start of this process
            else:
                leaf = os.path.join(base, "daemon")
                os.makedirs(leaf, exist_ok=True)
                _write(os.path.join(leaf, "cgroup.procs"), str(os.getpid()))
            _write(os.path.join(base, "cgroup.subtree_control"), "+memory +pids")
        except OSError as e:
            cls.reason = f"cannot delegate a cgroup for jobs: {e}"
            return None
        return cls(base)

    def create(self, job_id: int, memory_mb: int | None) -> JobCgroup:
        self._n += 1
        path = os.path.join(self.base, f"job-{job_id}-{os.getpid()}-{self._n}")
        os.mkdir(path)
        g = JobCgroup(path)
        try:
            if memory_mb is not None:
                _write(os.path.join(path, "memory.max"), str(memory_mb << 20))
                with contextlib.suppress(OSError):
                    _write(os.path.join(path, "memory.swap.max"), "0")
                with contextlib.suppress(OSError):
                    _write(os.path.join(path, "memory.oom.group"), "1")
            _write(os.path.join(path, "pids.max"), str(PIDS_MAX))
        except OSError:
            g.remove()
            raise
        return g
