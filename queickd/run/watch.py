"""One process job's child, watched from the worker thread that runs it until the zygote
reports it reaped (run/process.py starts it): output drained as it comes (a child never
blocks on a full pipe) and kept up to the cap, the report read from its own pipe, the
wall-time deadline, and while a memory limit is set the memory watch (its cgroup's usage,
else tree_memory). At a limit the child's process group gets SIGTERM (time) or SIGKILL
(memory, output), and SIGKILL after the grace. What happened becomes the RunReport (JSON,
never unpickled); progress lines ahead of the report go to the runner's progress sink.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..core.fate import clean
from ..core.sandbox import Limits
from .base import RunReport
from .capture import finite
from .context import NOTE_MAX
from .supervisor import Pending

WATCH_INTERVAL = 0.02  # seconds between looks at a memory-limited child's RSS
MAX_STORED_OUTPUT = 64 * 1024  # bytes of captured output kept with the job
MAX_REPORT = 1 << 20  # bytes of report beyond the result's own cap (traceback, message)
CPU_LIMIT_NEAR = 0.5  # seconds: a child killed with this close to its CPU time limit reached it


def _status(pid: int, fields: tuple[bytes, ...]) -> int | None:
    """The sum of the named /proc/PID/status fields, in bytes (None: the process is gone)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            total = 0
            for line in f:
                if line.startswith(fields):
                    total += int(line.split()[1]) * 1024
            return total
    except (OSError, ValueError, IndexError):
        return None


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            pass
    return out


def _descendants(pid: int) -> Iterator[int]:
    """Each process below `pid` (the rest of its tree), once."""
    todo, seen = _children(pid), {pid}
    while todo and len(seen) < 4096:  # pids.max-like bound on one look's work
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        yield p
        todo += _children(p)


def tree_memory(pid: int, follower: bool = False) -> int | None:
    """What the RSS watch counts of a job: its process's resident memory (VmRSS) and the
    private memory (anonymous and shared-memory pages) of every process it started, setsid
    ones included (the job's process is their subreaper). Pages a child shares with its
    parent count in both: the watch errs towards the kill. In its namespaces, the files in
    its own /dev/shm count too. `follower`: `pid` only follows
    the job (run/isolate.py), whose process is its one child. None: the job is gone."""
    shm = 0
    if follower:
        kids = _children(pid)
        if not kids:
            return _status(pid, (b"VmRSS:",))
        pid = kids[0]
        try:  # its own /dev/shm's files, where this process may look into its mounts (root)
            st = os.statvfs(f"/proc/{pid}/root/dev/shm")
            shm = (st.f_blocks - st.f_bfree) * st.f_frsize
        except OSError:
            pass  # capped at the memory limit by its size instead
    total = _status(pid, (b"VmRSS:",))
    if total is None:
        return None
    return total + shm + sum(_status(p, (b"RssAnon:", b"RssShmem:")) or 0 for p in _descendants(pid))


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu(pid: int) -> float | None:
    """Seconds of CPU time of one process and of its children it has reaped (utime, stime,
    cutime, cstime of /proc/PID/stat); None: it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2:].split()  # after the name, which may hold spaces
        return sum(int(x) for x in fields[11:15]) / _TICK
    except (OSError, ValueError, IndexError):
        return None


def tree_cpu(pid: int) -> float | None:
    """Seconds of CPU time the job's process tree has used (its living processes', and what
    they reaped): what its liveness watch reads between two looks. None: the job is gone."""
    total = _cpu(pid)
    if total is None:
        return None
    return total + sum(_cpu(p) or 0.0 for p in _descendants(pid))


class Watch:
    """One running child, watched until the zygote reports it reaped."""

    def __init__(self, p: Pending, sel: selectors.BaseSelector, out_r: int, rep_r: int,
                 limits: Limits, max_out: int, cg: Any, began: float, kill_grace: float,
                 cpu_limit: int | None = None, follower: bool = False,
                 progress: Callable[[float, float | None, str | None, float], None] | None = None) -> None:
        self.p, self.limits, self.max_out, self.cg = p, limits, max_out, cg
        self.follower = follower  # the pid only follows the job in its namespaces (run/isolate.py)
        self.kill_grace = kill_grace
        self.cpu_limit = cpu_limit  # the child's RLIMIT_CPU, seconds
        self.progress = progress  # takes the progress lines the child sends before its report
        self.began = began
        self.out, self.out_len, self.report = bytearray(), 0, bytearray()
        self.killed: tuple[str, str] | None = None  # (error type, message)
        self.kill_at: float | None = None  # SIGKILL after the grace
        self.exit: dict[str, Any] | None = None
        self.peak_seen = 0
        self.sel = sel  # the thread's, with its wake-up pipe registered
        os.set_blocking(out_r, False)
        os.set_blocking(rep_r, False)
        self.pipes = {out_r, rep_r}  # those not at their end yet
        sel.register(out_r, selectors.EVENT_READ, "out")
        sel.register(rep_r, selectors.EVENT_READ, "rep")

    @property
    def pid(self) -> int | None:
        """The child's pid, once the zygote has said it (read when needed: it wakes no one)."""
        return self.p.pid

    def run(self) -> RunReport:
        deadline = None if self.limits.timeout is None else self.began + self.limits.timeout
        watch = self.limits.memory_mb is not None
        try:
            while self.exit is None:
                now = time.monotonic()
                waits = [t - now for t in (deadline, self.kill_at) if t is not None]
                if watch and self.pid is not None:
                    waits.append(WATCH_INTERVAL)
                for key, _ in self.sel.select(max(0.0, min(waits)) if waits else None):
                    if key.data == "wake":
                        self._replies(key.fd)
                    else:
                        self._read(key.fd, key.data)
                if self.exit is not None:
                    break
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    deadline = None  # passed: no more waits for it (a wait of 0 would spin)
                    if self.killed is None:  # a pid not known yet is killed as it comes
                        self.kill("timeout", f"the job ran past its timeout of {self.limits.timeout:g} s "
                                   f"(killed after {now - self.began:.1f} s)", signal.SIGTERM)
                if self.kill_at is not None and now >= self.kill_at:
                    if self.pid is None:  # the zygote never said it forked the job: nothing to wait for
                        self.exit = {"no_pid": True}
                        break
                    self._signal(signal.SIGKILL)
                    self.kill_at = None
                if watch and self.pid is not None and self.killed is None:
                    self._watch_memory()
            for key in [self.sel.get_key(fd) for fd in self.pipes]:  # what is in them: never wait for EOF
                self._read(key.fd, key.data)
        finally:
            for fd in self.pipes:
                self.sel.unregister(fd)
            self.pipes.clear()
        return self._report()

    # --- events ------------------------------------------------------------------------------
    def _replies(self, fd: int) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(fd, 64)
        for msg in self.p.take():
            if "pid" in msg:
                if self.killed is not None:  # killed (cancelled) before its pid was known
                    self._signal(signal.SIGKILL)
            elif self.exit is None:
                # The first answer stands: a zygote may end just after its last job's
                # exit, and the news of its end may come in the same batch.
                self.exit = msg

    def _read(self, fd: int, which: str) -> None:
        """Everything the pipe holds now (it is non-blocking): never wait for its EOF, which
        a grandchild holding the pipe could keep from coming."""
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return
            if not data:
                self.sel.unregister(fd)
                self.pipes.discard(fd)
                return
            if which == "out":
                self.out_len += len(data)
                room = self.max_out - len(self.out)
                if room > 0:
                    self.out += data[:room]
                if self.out_len > self.max_out and self.killed is None:
                    self.kill("output_limit", f"the job wrote more than its output limit of "
                               f"{self.limits.output_kb} KB to stdout/stderr", signal.SIGKILL)
            elif len(self.report) <= self.max_out + MAX_REPORT:
                self.report += data
                if b"\n" in data:
                    self._progress_lines()

    def _progress_lines(self) -> None:
        """The child's progress lines ([done, total, note, at] in JSON, each ended by a
        newline, which its one-line report never holds) are taken off the front of what
        it sent; one that does not read as that is dropped."""
        while (end := self.report.find(b"\n")) >= 0:
            line = bytes(self.report[:end])
            del self.report[:end + 1]
            try:
                msg = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if not isinstance(msg, list) or len(msg) != 4:
                continue
            done, total, note, at = msg
            if (self.progress is not None and finite(done) and (total is None or finite(total))
                    and (note is None or isinstance(note, str)) and finite(at)):
                self.progress(done, total, note if note is None else note[:NOTE_MAX], at)

    def _watch_memory(self) -> None:
        used = self.cg.memory_peak() if self.cg is not None else tree_memory(self.pid, self.follower)  # type: ignore[arg-type]
        if used is None:
            return
        self.peak_seen = max(self.peak_seen, used)
        limit = self.limits.memory_mb << 20  # type: ignore[operator]
        if self.cg is None and used > limit:
            self.kill("memory_limit", f"the job used {used >> 20} MB, over its memory limit of "
                       f"{self.limits.memory_mb} MB", signal.SIGKILL)

    def kill(self, kind: str, message: str, sig: int) -> None:
        self.killed = (kind, message)
        self._signal(sig)
        if sig == signal.SIGTERM:
            self.kill_at = time.monotonic() + self.kill_grace

    def _signal(self, sig: int) -> None:
        pid = self.p.want_pid()  # not known yet: its arrival wakes the loop, which kills then
        if pid is None or self.exit is not None:
            return
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        if self.cg is not None and sig == signal.SIGKILL:
            self.cg.kill()

    # --- the report --------------------------------------------------------------------------
    def _report(self) -> RunReport:
        runtime = time.monotonic() - self.began
        exit_msg = self.exit or {}
        output = self._output()
        if "report" in exit_msg:  # the zygote could not load the function: nothing was forked
            r = RunReport.from_dict(exit_msg["report"])
            r.runtime = runtime
            return r
        if "no_pid" in exit_msg:
            return RunReport(False, None, "crashed", "the job never started: the zygote did not say it had "
                             f"forked it within its timeout of {self.limits.timeout:g} s and the "
                             f"{self.kill_grace:g} s grace (still importing its module?)", None, runtime=runtime)
        cpu = exit_msg.get("cpu")
        if self.cg is not None and self.limits.memory_mb is not None:
            # The group's own high-water mark: the look every 20 ms may have missed the last rise.
            self.peak_seen = max(self.peak_seen, self.cg.memory_peak() or 0)
            if self.killed is None and self.cg.oom_killed():
                self.killed = ("memory_limit", f"the job went over its memory limit of {self.limits.memory_mb} "
                               f"MB (peak {(self.cg.memory_peak() or 0) >> 20} MB in its cgroup)")
        if self.killed is not None:
            kind, message = self.killed
            r = RunReport(False, None, kind, message, None, runtime=runtime, cpu_time=cpu,
                          peak_memory=self.peak_seen or None)
        elif "zygote_died" in exit_msg:
            r = RunReport(False, None, "crashed", "the zygote died while the job ran "
                          f"(exit status {exit_msg['zygote_died']})", None, runtime=runtime)
        else:
            r = self._parse(exit_msg, runtime, cpu)
        if r.error_type == "MemoryError" and self.limits.memory_mb is not None:
            r.error_type = "memory_limit"
            r.error_message = (f"the job ran out of memory under its limit of {self.limits.memory_mb} MB "
                               f"({r.error_message or 'MemoryError'})")
        r.output = output  # kept with the job whatever its fate
        return r

    def _parse(self, exit_msg: dict[str, Any], runtime: float, cpu: float | None) -> RunReport:
        status = exit_msg.get("exit", 0)
        code = os.waitstatus_to_exitcode(status) if isinstance(status, int) else -1
        if self.report:
            try:
                r = RunReport.from_dict(json.loads(bytes(self.report)))
            except (ValueError, TypeError, RecursionError) as e:
                return RunReport(False, None, "crashed", f"the job's report is not readable ({e}); "
                                 f"exit code {code}", None, runtime=runtime, cpu_time=cpu)
            r.runtime = r.runtime or runtime
            if r.cpu_time is None:
                r.cpu_time = cpu
            return r
        if -code in (signal.SIGKILL, signal.SIGXCPU) and self._at_cpu_limit(cpu):
            return RunReport(False, None, "timeout", f"the job used up its CPU time limit of {self.cpu_limit} s "
                             f"(its timeout of {self.limits.timeout:g} s on each core) and was killed",
                             None, runtime=runtime, cpu_time=cpu)
        how = f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        return RunReport(False, None, "crashed", f"the job's process {how} without a report", None,
                         runtime=runtime, cpu_time=cpu)

    def _at_cpu_limit(self, cpu: float | None) -> bool:
        """Did the child's CPU time reach its RLIMIT_CPU? The kernel kills it there (SIGKILL
        when the soft limit is the hard one, else SIGXCPU first): a timeout, not a crash."""
        return self.cpu_limit is not None and cpu is not None and cpu >= self.cpu_limit - CPU_LIMIT_NEAR

    def _output(self) -> str | None:
        """What the job wrote, as it is stored: its first MAX_STORED_OUTPUT bytes as text (a
        NUL escaped, as PostgreSQL text holds none), with a marker when more was written;
        None when it wrote nothing."""
        if not self.out_len:
            return None
        kept = bytes(self.out[:MAX_STORED_OUTPUT])
        text = clean(kept.decode("utf-8", "backslashreplace")).replace("\x00", "\\x00")
        if self.out_len > len(kept):
            text += f"\n[… {self.out_len} bytes in all; the first {len(kept)} kept]"
        return text
