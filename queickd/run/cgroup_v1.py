"""Per-job cgroups on a cgroup v1 host (a hybrid one included: Debian and Raspberry Pi OS
Buster, a container given writable v1 mounts), used when no v2 hierarchy has the memory
and pids controllers. The interface of cgroup.py's v2 groups, over one group per job in
each of the pids, (when writable) freezer and (for a memory limit) memory hierarchies;
the child joins each.

v1 lets a group hold processes and child groups at once, so the daemon stays where it is
and a job's groups go under the daemon's own group in each hierarchy. v1 has no
`cgroup.kill`: `kill()` freezes the job's group, SIGKILLs every process in it and thaws
it, so nothing can fork in between; without the freezer it kills until a pass finds no
new process, and `remove()` kills again until the groups can go (pids.max bounds them).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Callable
from typing import Any

REQUIRED = ("memory", "pids")
_JOB_GROUP = re.compile(r"job-\d+-(\d+)-\d+")  # job-<job id>-<daemon pid>-<n>, v1's and v2's
OPTIONAL = ("freezer",)  # a race-free kill when mounted


def write(path: str, text: str) -> None:
    """Write a cgroup control file (v1's and v2's alike)."""
    fd = os.open(path, os.O_WRONLY)  # not open(): its text layer is most of a per-job group's cost
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _rmdir(path: str) -> bool:
    """Removed (or gone already); False while it holds a process."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


def read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def number(text: str | None) -> int | None:
    return int(text) if text and text.strip().isdigit() else None


def procs(paths: tuple[str, ...]) -> set[int]:
    """The processes in the groups at `paths`."""
    return {int(p) for path in paths for p in (read(os.path.join(path, "cgroup.procs")) or "").split()}


def remove(paths: tuple[str, ...], kill: Callable[[], None]) -> None:
    """Remove a job's groups, killing what is left in them while one cannot go (a group
    with processes cannot be removed). Empty groups (the usual end: the zygote has killed
    and reaped what the job left) go at once, with no kill."""
    left = [p for p in paths if not _rmdir(p)]
    for _ in range(200 if left else 0):  # killed processes leave their groups within milliseconds
        kill()
        left = [p for p in left if not _rmdir(p)]
        if not left:
            return
        time.sleep(0.005)


def counts_oom_kill(text: str | None) -> bool:
    """Whether a memory.events (v2) or memory.oom_control (v1) text counts an OOM kill."""
    for line in (text or "").splitlines():
        name, _, n = line.partition(" ")
        if name == "oom_kill" and n.strip() != "0":
            return True
    return False


def pid_alive(pid: int) -> bool:
    """Is `pid` a live process here (one of another user's counts)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def sweep(bases: list[str], group: Callable[[dict[str, str]], Any]) -> list[tuple[str, int, bool]]:
    """Kill and remove the jobs' groups (v2 and v1 alike) under `bases` that a daemon killed
    with SIGKILL left behind: (name, processes killed in them, removed) for each. `group`
    makes one job's groups from {base: its path}. Only a group named as ours whose daemon
    pid is no live process here is one of them (a live daemon may be using it)."""
    found: dict[str, dict[str, str]] = {}
    for base in bases:
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            m = _JOB_GROUP.fullmatch(name)
            if m and int(m.group(1)) != os.getpid() and not pid_alive(int(m.group(1))):
                path = os.path.join(base, name)
                if os.path.isdir(path):
                    found.setdefault(name, {})[base] = path
    done = []
    for name, paths in sorted(found.items()):
        g = group(paths)
        killed = len(procs(g.paths))
        g.remove()
        done.append((name, killed, not any(os.path.exists(p) for p in g.paths)))
    return done


def mounts(root: str = "/") -> list[tuple[str, str, set[str]]]:
    """The cgroup v1 hierarchies mounted, from `proc/self/mountinfo` under root: (the
    mount's root within its hierarchy, where it is mounted, under root; its controllers,
    from the super options). OSError when mountinfo cannot be read. Also the memory
    gate's (services/memory_gate.py), which reads the daemon's own v1 memory group."""
    out = []
    with open(os.path.join(root, "proc/self/mountinfo")) as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, fs = left.split(), right.split()
            if fs[:1] != ["cgroup"] or len(fs) < 3 or len(fields) < 5:
                continue
            out.append((fields[3], os.path.join(root, fields[4].lstrip("/")), set(fs[2].split(","))))
    return out


def locate(found: list[tuple[str, str, set[str]]], controller: str, path: str) -> str | None:
    """The directory of the group at `path` (as /proc/self/cgroup names it) in the
    controller's hierarchy: under the first of its mounts that shows it (not a sub-tree
    of the hierarchy that leaves it out); None when none does."""
    for root, mount, names in found:
        if controller in names:
            rel = os.path.relpath(path, root)
            if not rel.startswith(".."):
                return os.path.normpath(os.path.join(mount, rel))
    return None


def own_groups(root: str = "/") -> dict[str, str]:
    """Controller -> the directory of this process's group in that controller's v1
    hierarchy: its path in /proc/self/cgroup under the hierarchy's mount in mountinfo."""
    own: dict[str, str] = {}
    with open(os.path.join(root, "proc/self/cgroup")) as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            for name in names.split(","):
                own[name] = path
    found = mounts(root)
    return {name: d for name, path in own.items() if (d := locate(found, name, path)) is not None}


def find(pids_max: int) -> tuple[JobCgroupsV1 | None, str]:
    """The v1 groups the daemon may create jobs' groups under, or None and why not."""
    try:
        own = own_groups()
    except (OSError, ValueError) as e:
        return None, f"cannot read this process's cgroups: {e}"
    bases = {}
    for name in REQUIRED + OPTIONAL:
        base = own.get(name)
        if base is None:
            if name in REQUIRED:
                return None, f"no cgroup v1 {name} hierarchy is mounted"
            continue
        probe = os.path.join(base, f"queickd-probe-{os.getpid()}")
        try:  # being root is not enough: the hierarchy may be mounted read-only
            os.mkdir(probe)
            os.rmdir(probe)
        except OSError as e:
            if name in REQUIRED:
                return None, f"cannot create a cgroup v1 group under {base}: {e.strerror}"
            continue
        bases[name] = base
    return JobCgroupsV1(bases, pids_max), ""


class JobCgroupV1:
    """One job's groups, one per hierarchy; `path` is its memory group (a job without a
    memory limit has none)."""

    def __init__(self, groups: dict[str, str]) -> None:
        self.groups = groups
        self.path = groups.get("memory") or next(iter(groups.values()))
        self.paths = tuple(groups.values())  # the child joins each

    def memory_peak(self) -> int | None:
        if "memory" not in self.groups:
            return None
        return number(read(os.path.join(self.path, "memory.max_usage_in_bytes")))

    def oom_killed(self) -> bool:
        """From oom_control's `oom_kill` count (Linux 4.13 and later). memory.failcnt is no
        substitute: it counts limit hits that reclaim resolved (page cache), and some
        kernels leave it at 0 through an OOM kill. An older kernel's OOM kill is a crash
        by SIGKILL."""
        if "memory" not in self.groups:
            return False
        return counts_oom_kill(read(os.path.join(self.path, "memory.oom_control")))

    def _freeze(self, state: str) -> bool:
        freezer = self.groups.get("freezer")
        if freezer is None:
            return False
        path = os.path.join(freezer, "freezer.state")
        try:
            write(path, state)
        except OSError:
            return False
        for _ in range(200):  # FREEZING until every task has stopped: milliseconds
            if (read(path) or "").strip() == state:
                return True
            time.sleep(0.002)
        return False  # a task that will not stop (in D state): the loop below goes on

    def kill(self) -> None:
        """SIGKILL every process of the job (setsid ones included: they are still in it)."""
        frozen = self._freeze("FROZEN")
        killed: set[int] = set()
        try:
            for _ in range(1000):  # each pass kills what has forked since the last one
                new = procs(self.paths) - killed
                if not new:
                    return
                for pid in new:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                killed |= new
                if frozen:
                    return  # nothing could fork while frozen: all of it is killed
        finally:
            if "freezer" in self.groups:
                self._freeze("THAWED")  # a frozen task dies of its SIGKILL only once thawed

    def remove(self) -> None:
        remove(self.paths, self.kill)


class JobCgroupsV1:
    """Creates the jobs' groups under the daemon's own group in each hierarchy."""

    def __init__(self, bases: dict[str, str], pids_max: int) -> None:
        self.bases = bases
        self.pids_max = pids_max
        self._n = 0

    def sweep(self) -> list[tuple[str, int, bool]]:
        by_base = {base: c for c, base in self.bases.items()}
        return sweep(list(by_base), lambda paths: JobCgroupV1({by_base[b]: p for b, p in paths.items()}))

    def create(self, job_id: int, memory_mb: int | None) -> JobCgroupV1:
        self._n += 1
        name = f"job-{job_id}-{os.getpid()}-{self._n}"
        # A memory group only for a memory limit: with none there is nothing for one to hold
        # (the peak is the child's own VmHWM), and a v1 memory group costs the most to make,
        # to join and to remove. pids (pids.max) and the freezer (the kill) are every job's.
        g = JobCgroupV1({c: os.path.join(base, name) for c, base in self.bases.items()
                         if c != "memory" or memory_mb is not None})
        try:
            for path in g.paths:
                os.mkdir(path)
            if memory_mb is not None:
                limit = str(memory_mb << 20)
                write(os.path.join(g.path, "memory.limit_in_bytes"), limit)
                # memory+swap at the memory limit: no swap. It may never be below
                # limit_in_bytes, so it is written after it.
                try:
                    write(os.path.join(g.path, "memory.memsw.limit_in_bytes"), limit)
                except OSError:  # no swap accounting (swapaccount=0): reclaim at the limit then never swaps
                    with contextlib.suppress(OSError):
                        write(os.path.join(g.path, "memory.swappiness"), "0")
            write(os.path.join(g.groups["pids"], "pids.max"), str(self.pids_max))
        except OSError:
            g.remove()
            raise
        return g
