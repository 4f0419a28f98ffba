"""The routing runner: runs each job in a thread or in a process, as core.sandbox.decide
says from the job's fields, its function's config table and the daemon's flags; counts
runs by isolation. Decides nothing else and never touches the store.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from ..core import sandbox
from ..core.job import Job
from . import context, isolate
from .base import RunReport
from .loader import FunctionLoader
from .process import ProcessRunner
from .supervisor import ZygoteSupervisor
from .thread import ThreadRunner

log = logging.getLogger("queickd.sandbox")


class Liveness(Protocol):
    """What watches the runs of jobs with a stalled_after (services/liveness.py): told as
    each begins (`process`: in a process, whose CPU time counts as alive) and ends."""

    def began(self, job: Job, process: bool) -> None: ...

    def ended(self, job: Job) -> None: ...


class RoutingRunner:
    def __init__(self, thread: ThreadRunner, process: ProcessRunner | None, defaults: sandbox.Defaults) -> None:
        self.thread = thread
        self.process = process  # None: this host cannot run jobs in processes
        self.defaults = defaults
        self.runs = dict.fromkeys(sandbox.ISOLATIONS, 0)
        self._lock = threading.Lock()
        self.dumpable: str | None = None  # why this process is still dumpable (None: it is not)
        self.liveness: Liveness | None = None  # told of the runs of jobs with a stalled_after

    @property
    def supervisor(self) -> ZygoteSupervisor | None:
        return self.process.supervisor if self.process is not None else None

    def announce(self) -> None:
        """Once at start, after the daemon's (or worker's) own start line: remove the job
        directories and per-job cgroups a daemon killed with SIGKILL left behind (never a
        live daemon's: their names hold its pid), and say how process jobs' memory limits
        hold here."""
        if self.process is None:
            return
        self.process.sweep()
        m = self.process.means
        if m["reason"] is None:
            log.info("process jobs: memory limits by %s (a group per job under %s, pids.max %d)",
                     m["memory"], ", ".join(m["groups"]), m["pids_max"])
        else:
            log.info("process jobs: memory limits by %s (no per-job cgroup: %s)", m["memory"], m["reason"])
        log.info("sandbox: %s", ", ".join(
            f"{name} yes" if why is None else f"{name} unknown ({why})" if why.startswith("not probed")
            else f"{name} no ({why})" for name, why in self.in_force()))

    def in_force(self) -> list[tuple[str, str | None]]:
        """Each mechanism that keeps process jobs from the daemon and from each other, and
        why it is not in force here (None: it is): what the start line says."""
        m = self.process.means if self.process is not None else {"memory": None}
        cgroup = None if str(m["memory"]).startswith("cgroup") else "limits by RSS watch"
        ns = self.supervisor.namespaces if self.supervisor is not None else "no process jobs"
        user = None if self.process is not None and self.process.user is not None else "not set"
        how = "pids.max" if cgroup is None else "RLIMIT_NPROC"  # RLIMIT_NPROC: per user, root exempt
        nproc = "root is exempt from RLIMIT_NPROC and no cgroup has pids.max" if (
            cgroup is not None and os.geteuid() == 0 and user is not None) else None
        return [("non-dumpable daemon", self.dumpable), ("pid namespace", ns), ("mount namespace", ns),
                ("cgroup memory", cgroup), (f"process cap ({how})", nproc), ("job user", user)]

    def start(self) -> None:
        """Start the zygote at once when the settings send jobs to processes."""
        d = self.defaults
        tables = (d.functions or {}).values()
        eager = d.isolation == sandbox.PROCESS or any(getattr(d, k) is not None for k in sandbox.LIMITS) or any(
            t.get("isolation") == sandbox.PROCESS or any(t.get(k) is not None for k in sandbox.LIMITS)
            for t in tables)
        if eager and self.supervisor is not None:
            try:
                self.supervisor.start()
            except Exception as e:  # the first process job tries again (and fails as crashed)
                log.error("cannot start the zygote: %s", e)

    def stop(self) -> None:
        if self.supervisor is not None:
            self.supervisor.stop()

    def reload(self) -> None:
        if self.supervisor is not None:
            self.supervisor.reload()

    def report_progress_to(self, sink: context.ProgressSink) -> None:
        """Where queickd.progress() of the jobs run here goes (services/progress.py), in a
        thread or in a process. Before start()."""
        self.thread.progress = sink
        if self.process is not None:
            self.process.progress = sink

    def cancel(self, job_id: int, held: bool = False) -> None:
        """Runner.cancel: a process job is killed; a thread job is interrupted (ThreadRunner)."""
        self.thread.cancel(job_id, held)
        if self.process is not None:
            self.process.cancel(job_id, held)

    def stall(self, job_id: int, message: str) -> bool:
        """Stop a stalled run (on_stall = kill) as its timeout would: a process job is
        killed, an async job's task cancelled, a thread job interrupted (a call blocked in C
        only as it returns). The run reports `stalled`. False when it does not run here."""
        if self.process is not None and self.process.stall(job_id, message):
            return True
        return self.thread.stall(job_id, message)

    def cpu_time(self, job_id: int) -> float | None:
        """Seconds of CPU time a process job's tree has used so far; None for any other."""
        return self.process.cpu_time(job_id) if self.process is not None else None

    def stopping(self) -> frozenset[int]:
        return self.thread.stopping() | (self.process.stopping() if self.process is not None else frozenset())

    def stats(self) -> dict:
        """Runs by isolation, limit kills by kind, the zygote's liveness and restarts, and how
        memory limits hold (`limits`: ProcessRunner.means)."""
        sup, proc = self.supervisor, self.process
        return {"runs": dict(self.runs), "kills": dict(proc.kills) if proc else {},
                "limits": dict(proc.means) if proc else None,
                "crashed": proc.crashed if proc else 0,
                "zygote": {"alive": sup.alive if sup else False, "pid": sup.pid if sup else None,
                           "restarts": sup.restarts if sup else 0}}

    def is_async(self, job: Job, resolve: bool = False) -> bool:
        """Whether the job is a thread job whose function is an async def
        (ThreadRunner.is_async). A process job is not: its module is never imported here.
        A sync function resolved before is told by a dict look alone (every sync job asks)."""
        told = self.thread.is_async(job)
        if told is False:
            return False
        limits = sandbox.decide(job, self.defaults)
        if limits is not None and limits.isolation != sandbox.THREAD:
            return False
        return told is True or (resolve and self.thread.is_async(job, True) is True)

    def start_on_loop(self, job: Job, done: Callable[[RunReport], None]) -> bool:
        """Start a job is_async() told as a task of the event loop (ThreadRunner
        .start_on_loop), with its thread timeout; False for any other job."""
        limits = sandbox.decide(job, self.defaults)
        if limits is not None and limits.isolation != sandbox.THREAD:
            return False
        watch = self.liveness if job.stalled_after is not None else None
        if watch is not None:
            told = done

            def done(report: RunReport) -> None:
                watch.ended(job)
                told(report)

            watch.began(job, False)
        if not self.thread.start_on_loop(job, None if limits is None else limits.timeout, done):
            if watch is not None:
                watch.ended(job)
            return False
        with self._lock:
            self.runs[sandbox.THREAD] += 1
        return True

    def run(self, job: Job) -> RunReport:
        limits = sandbox.decide(job, self.defaults)
        isolation = sandbox.THREAD if limits is None else limits.isolation
        with self._lock:
            self.runs[isolation] += 1
        watch = self.liveness
        if watch is None or job.stalled_after is None:
            return self._run(job, limits, isolation)
        watch.began(job, isolation == sandbox.PROCESS and self.process is not None)
        try:
            return self._run(job, limits, isolation)
        finally:
            watch.ended(job)

    def _run(self, job: Job, limits: sandbox.Limits | None, isolation: str) -> RunReport:
        if limits is None:
            return self.thread.run(job)
        if isolation == sandbox.THREAD:  # a thread job with a timeout
            return self.thread.run(job, limits.timeout)
        if self.process is None:  # never a silent downgrade to a thread
            return RunReport(False, None, "sandbox_unavailable", "this worker cannot run jobs in a "
                             "process (isolation, timeout, memory_mb or output_kb)", None, permanent=True)
        return self.process.run(job, limits)


def make_runner(loader: FunctionLoader, defaults: sandbox.Defaults, passthrough_env: Sequence[str] = (),
                measure: Callable[[str], bool] | None = None, *, hidden: Sequence[str] = (),
                namespaces: bool = True, user: str | None = None) -> RoutingRunner:
    """The runner a daemon or `queick worker` uses: threads, and a zygote for process jobs.
    The zygote starts now when the settings send jobs to processes, else with the first
    process job (a Pi that never runs one pays nothing for it). `hidden`: what each process
    job's mount namespace covers (isolate.hidden_paths); `namespaces`: False keeps jobs in
    the zygote's namespaces; `user`: --job-user (checked at start: isolate.job_user)."""
    supervisor = ZygoteSupervisor(loader.app_dir, loader.allow, preload=list(defaults.functions or ()),
                                  namespaces=namespaces)
    runner = RoutingRunner(ThreadRunner(loader, measure), ProcessRunner(supervisor, passthrough_env, hidden=hidden,
                                                                  user=isolate.job_user(user) if user else None),
                           defaults)
    # Before any process job runs: none of them (the same user) may read this process's
    # memory, environment or descriptors (a token, a store password), nor ptrace it.
    runner.dumpable = isolate.not_dumpable()
    return runner
