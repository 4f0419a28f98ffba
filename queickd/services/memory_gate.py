"""The memory gate: before claimed jobs start, the worker pool asks it which fit.

The room is the lower of the process's own cgroup's (v2 or v1: its limit less what it uses
but for inactive file pages) and `proc/meminfo`'s MemAvailable (a Pi has no memory cgroup
by default), less the reserve; `--max-rss` caps the process's own RSS. Each reader takes
the root it reads under (tests point them at a tree they write). The gate keeps the
functions' footprints (read from the store once per function, then its own updates,
written back in the pool's pass), tells which thread runs measure themselves
(mem.worth_measuring) and counts deferrals by reason. The decisions are
core/policy/memory.py's; it never touches a job.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from ..core.job import Job
from ..core.policy import memory as mem
from ..run import cgroup_v1
from ..settings import DEFAULT_RESERVE_MB
from ..store.contract.resources import Resources
from ..store.contract.transaction import Transaction

log = logging.getLogger("queickd.worker")

# Seconds a reading of the room may serve the passes after it, less what the jobs running
# here may still take, to let a job start (never to defer one: that is looked at again).
# The room rarely changes faster than jobs start, and a reading is five files.
ROOM_FRESH = 0.25
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _read(path: str) -> str | None:
    # os-level: pathlib's read_text costs many times the read itself
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 65536).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _stat(text: str | None, name: str) -> int:
    for line in (text or "").splitlines():
        k, _, v = line.partition(" ")
        if k == name:
            return int(v)
    return 0


@functools.lru_cache(maxsize=16)
def _v1_memory_group(root: str, path: str) -> str | None:
    """The directory of the process's v1 memory group: where mountinfo says the memory
    hierarchy is mounted (as the per-job groups find it: run/cgroup_v1.py). A tree with no
    mountinfo (an old test tree) gets the usual place, sys/fs/cgroup/memory. Kept per group
    path: the kernel writes mountinfo afresh for every read, and cgroup mounts do not move."""
    try:
        found = cgroup_v1.mounts(root)
    except OSError:
        return os.path.join(root, "sys/fs/cgroup/memory", path.lstrip("/"))
    return cgroup_v1.locate(found, "memory", path)


def cgroup_room(root: str = "/") -> int | None:
    """Bytes the process's cgroup may still take, or None with no memory limit there."""
    j = os.path.join
    text = _read(j(root, "proc/self/cgroup")) or ""
    for line in text.splitlines():
        hier, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        rel = path.strip().lstrip("/")
        if hier == "0" and controllers == "":  # v2
            d = j(root, "sys/fs/cgroup", rel)
            limit = (_read(j(d, "memory.max")) or "").strip()
            current = (_read(j(d, "memory.current")) or "").strip()
            if not limit or limit == "max" or not current:
                continue
            used = int(current) - _stat(_read(j(d, "memory.stat")), "inactive_file")
            return max(0, int(limit) - used)
        if "memory" in controllers.split(","):  # v1
            d = _v1_memory_group(root, path.strip())
            if d is None:
                continue
            limit = (_read(j(d, "memory.limit_in_bytes")) or "").strip()
            usage = (_read(j(d, "memory.usage_in_bytes")) or "").strip()
            if not limit or not usage or int(limit) >= 1 << 62:  # v1's "no limit" is a huge number
                continue
            used = int(usage) - _stat(_read(j(d, "memory.stat")), "total_inactive_file")
            return max(0, int(limit) - used)
    return None


def meminfo_available(root: str = "/") -> int | None:
    for line in (_read(os.path.join(root, "proc/meminfo")) or "").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def own_rss(root: str = "/") -> int | None:
    text = _read(os.path.join(root, "proc/self/statm"))
    return int(text.split()[1]) * _PAGE if text else None


def room(root: str = "/") -> tuple[float, str]:
    """(free bytes, the source in force: "cgroup", "meminfo" or "none")."""
    cg, mi = cgroup_room(root), meminfo_available(root)
    if cg is not None and (mi is None or cg <= mi):
        return float(cg), "cgroup"
    if mi is not None:
        return float(mi), "meminfo"
    return float("inf"), "none"


class MemoryGate:
    """Which claimed jobs may start now; the rest go back to the queue for a short while."""

    def __init__(self, store: Resources, *, reserve_mb: float = DEFAULT_RESERVE_MB, max_rss_mb: float | None = None,
                 root: str = "/", rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.reserve = reserve_mb * mem.MB
        self.max_rss = None if max_rss_mb is None else max_rss_mb * mem.MB
        self.root = root
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._known: dict[str, mem.Footprint | None] = {}  # func -> footprint (None: none yet)
        self._runs: dict[str, int] = {}  # func -> thread runs asked about here (measures_run)
        self._pending: list[tuple[str, int | None, float, bool, bool]] = []  # runs to store
        self._deferrals: dict[int, int] = {}  # job id -> times deferred
        self.deferred: dict[str, int] = {}  # reason -> count
        self.source = "none"
        self._clock = clock
        self._reading: tuple[float, float, float | None] | None = None  # (when, room, --max-rss room)
        # The jobs started here and not yet ended, oldest first: job id -> (expected peak,
        # room and --max-rss room read when it started). Counted against every reading, old
        # or new, until they end: a job takes its memory as it runs, not when it starts.
        self._running: dict[int, tuple[float, float, float | None]] = {}

    def measures_run(self, func: str) -> bool:
        """Should a thread run of func measure itself (mem.worth_measuring)? Counts the run."""
        with self._lock:
            nth = self._runs.get(func, 0)
            self._runs[func] = nth + 1
            if len(self._runs) > 10_000:  # functions long gone: their counts only phase the sample
                self._runs.clear()
            return mem.worth_measuring(self._known.get(func), nth)

    def footprint(self, func: str, reader: Transaction | None = None) -> mem.Footprint | None:
        """Its footprint, read once (through `reader`, a pass's open transaction, if given)."""
        with self._lock:
            if func in self._known:
                return self._known[func]
        fp = (reader or self.store).footprints([func]).get(func)
        with self._lock:
            self._known.setdefault(func, fp)
            return self._known[func]

    def typical(self) -> float:
        """The footprint of a typical job here (the largest known), for pool growth."""
        with self._lock:
            return max((f.peak for f in self._known.values() if f is not None), default=0.0)

    def fits_one_more(self) -> bool:
        need = self.typical()
        if not mem.matters(need):
            return True
        free, self.source = room(self.root)
        return need <= free - self.reserve

    def split(self, jobs: list[Job], running_here: int,
              reader: Transaction | None = None) -> tuple[list[Job], list[Job]]:
        """(may start, deferred) among claimed jobs, in their order; footprints not known yet
        are read through `reader` (the pass's transaction that claimed them), else the store."""
        start: list[Job] = []
        later: list[Job] = []
        free: float | None = None
        rss_room: float | None = None
        read_now = False  # free was read in this pass (not an earlier pass's reading)
        taken = 0.0
        started: list[tuple[int, float]] = []  # (job id, expected peak) of those that matter
        if running_here == 0:
            with self._lock:  # none of them runs (one whose start was undone is forgotten here)
                self._running.clear()
        for job in jobs:
            fp = self.footprint(job.func, reader)
            need = fp.peak if fp is not None else 0.0
            if not mem.matters(need):
                start.append(job)
                continue
            if free is None:
                free, rss_room, read_now = self._room(reuse=True)
            d = mem.decide(need, free, taken, running_here + len(start), rss_room)
            if not d.start and not read_now:  # an earlier reading never defers a job: look now
                free, rss_room, read_now = self._room(reuse=False)
                d = mem.decide(need, free, taken, running_here + len(start), rss_room)
            if d.start:
                if d.reason == "alone":
                    log.info("job %d %s starts although it may not fit in memory (expected %.0f MB,"
                             " %.0f MB free): nothing else runs here", job.id, job.func, need / mem.MB,
                             max(0.0, free) / mem.MB)
                taken += need
                started.append((job.id, need))
                start.append(job)
            else:
                later.append(job)
                with self._lock:
                    self.deferred[d.reason or "memory"] = self.deferred.get(d.reason or "memory", 0) + 1
        if started:
            with self._lock:
                assert self._reading is not None  # read for the first of them
                _, free_at, rss_at = self._reading
                for job_id, need in started:
                    self._running.pop(job_id, None)  # a retry of one: newest last
                    self._running[job_id] = (need, free_at, rss_at)
        return start, later

    def _room(self, reuse: bool) -> tuple[float, float | None, bool]:
        """(room less the reserve, room under --max-rss or None, read just now), each less
        what the jobs running here may still take: an earlier reading still fresh when
        `reuse`; else the files."""
        now = self._clock()
        with self._lock:
            reading = self._reading
        read_now = not (reuse and reading is not None and now - reading[0] < ROOM_FRESH)
        if read_now:
            free, self.source = room(self.root)
            rss_room = None
            if self.max_rss is not None:
                rss = own_rss(self.root)
                rss_room = self.max_rss - rss if rss is not None else None
            reading = (now, free - self.reserve, rss_room)
            with self._lock:
                self._reading = reading
        assert reading is not None
        _, free, rss_room = reading
        with self._lock:
            running = list(self._running.values())
        free -= mem.still_to_take([(peak, at) for peak, at, _ in running], free)
        if rss_room is not None:
            now_rss = rss_room
            rss_room -= mem.still_to_take([(peak, now_rss if at is None else at) for peak, _, at in running],
                                          now_rss)
        return free, rss_room, read_now

    def backoffs(self, jobs: list[Job]) -> list[float]:
        """Each deferred job's wait (seconds), longer each time it is deferred."""
        out = []
        with self._lock:
            for job in jobs:
                n = self._deferrals.get(job.id, 0)
                self._deferrals[job.id] = n + 1
                out.append(mem.backoff(n, self._rng))
            if len(self._deferrals) > 10_000:  # jobs long gone
                self._deferrals.clear()
        return out

    def after_run(self, job: Job, peak: int | None, runtime: float, killed: bool, estimated: bool) -> None:
        """A run's measure, kept until the pool's next pass writes it."""
        with self._lock:
            self._deferrals.pop(job.id, None)
            self._running.pop(job.id, None)  # ended: the room read from now on shows what it left
            old = self._known.get(job.func)
            new = mem.update(old, peak, runtime, killed, estimated)
            self._known[job.func] = new
            # Written only when it tells something (a first real measure, a kill, a change
            # of a tenth or more): a run of a small function costs no write.
            if new is not None and (killed or (old is None and new.peak >= mem.MB)
                                    or (old is not None and abs(new.peak - old.peak) > 0.1 * max(old.peak, mem.MB))):
                self._pending.append((job.func, peak, runtime, killed, estimated))

    def has_pending(self) -> bool:
        """Runs measured and not yet written (the next pass's flush writes them)."""
        return bool(self._pending)

    def flush(self, now: float, tx: Transaction) -> None:
        """Write the runs measured since the last flush, in `tx` (the pool's transaction)."""
        with self._lock:
            pending, self._pending = self._pending, []
        if pending:
            tx.record_runs(pending, now)

    def snapshot(self) -> dict[str, Any]:
        self.source = room(self.root)[1]
        with self._lock:
            return {"source": self.source, "reserve_mb": self.reserve / mem.MB, "deferred": dict(self.deferred),
                    "max_rss_mb": None if self.max_rss is None else self.max_rss / mem.MB}

