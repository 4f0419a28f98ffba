"""Per-job cgroups, where the daemon may create them: a memory limit with no swap and
`pids.max` per job, every process of the job (setsid ones included) inside it, all of
them killed at once and the group removed after the job. cgroup v2 here; a v1 host's
groups (a hybrid one's) are cgroup_v1.py's, behind the same interface.

v2 is used when the daemon's own cgroup is on a writable v2 hierarchy with the memory and
pids controllers, i.e. systemd's `Delegate=yes` (or root on a host with a v2 hierarchy).
cgroup v2 lets a group hand controllers to its children only while it holds no process
itself, so the daemon first moves itself into a leaf (`<own>/daemon`) and the jobs'
groups are its siblings. Otherwise v1, when its memory and pids hierarchies are mounted
and writable. `find()` says why neither when it cannot; the runner then watches RSS
instead. Owns nothing of a job but its groups' files.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from . import cgroup_v1
from .cgroup_v1 import write as _write

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


class JobCgroup:
    def __init__(self, path: str) -> None:
        self.path = path
        self.paths = (path,)  # the groups the child joins: one on v2

    def _read(self, name: str) -> str | None:
        return cgroup_v1.read(os.path.join(self.path, name))

    def memory_peak(self) -> int | None:
        return cgroup_v1.number(self._read("memory.peak") or self._read("memory.current"))

    def oom_killed(self) -> bool:
        return cgroup_v1.counts_oom_kill(self._read("memory.events"))

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            _write(os.path.join(self.path, "cgroup.kill"), "1")

    def remove(self) -> None:
        cgroup_v1.remove(self.paths, self.kill)


def means(found: JobCgroups | cgroup_v1.JobCgroupsV1 | None, reason: str) -> dict[str, Any]:
    """How a process job's memory limit (and process count) is enforced here: the one
    description the start log, `stats`, `/metrics` and the status page show. `memory` is
    "cgroup v2", "cgroup v1" or "RSS watch"; `reason` says why no cgroup (else None)."""
    if isinstance(found, JobCgroups):
        return {"memory": "cgroup v2", "pids_max": PIDS_MAX, "groups": [found.base], "reason": None}
    if found is not None:
        return {"memory": "cgroup v1", "pids_max": PIDS_MAX, "groups": sorted(set(found.bases.values())),
                "reason": None}
    return {"memory": "RSS watch", "pids_max": None, "groups": [], "reason": reason or "cgroups are not used"}


class JobCgroups:
    """Creates the jobs' groups next to the daemon's own leaf."""

    reason = ""  # why the last find() found none

    def __init__(self, base: str) -> None:
        self.base = base
        self._n = 0

    @classmethod
    def find(cls) -> JobCgroups | cgroup_v1.JobCgroupsV1 | None:
        """v2 groups when they can be made, else v1 groups, else None (and `reason`)."""
        cls.reason = ""
        found = cls._find_v2()
        if found is not None:
            return found
        v1, why = cgroup_v1.find(PIDS_MAX)
        if v1 is None:
            cls.reason = f"{cls.reason}; {why}"
        return v1

    @classmethod
    def _find_v2(cls) -> JobCgroups | None:
        try:
            base = _own_cgroup()
            if base is None:
                cls.reason = "no cgroup v2 hierarchy is mounted"
                return None
            with open(os.path.join(base, "cgroup.controllers")) as f:
                have = set(f.read().split())
            if not {"memory", "pids"} <= have:
                cls.reason = f"the cgroup v2 group {base} lacks the memory or pids controller"
                return None
            if os.path.basename(base) == "daemon" and os.path.exists(os.path.join(base, "..", "cgroup.kill")):
                base = os.path.dirname(base)  # moved there by an earlier start of this process
            else:
                leaf = os.path.join(base, "daemon")
                os.makedirs(leaf, exist_ok=True)
                _write(os.path.join(leaf, "cgroup.procs"), str(os.getpid()))
            _write(os.path.join(base, "cgroup.subtree_control"), "+memory +pids")
        except OSError as e:
            cls.reason = f"cannot delegate a cgroup v2 group for jobs: {e}"
            return None
        return cls(base)

    def sweep(self) -> list[tuple[str, int, bool]]:
        """Kill and remove the groups a daemon killed with SIGKILL left behind (cgroup_v1.sweep)."""
        return cgroup_v1.sweep([self.base], lambda paths: JobCgroup(paths[self.base]))

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
