"""The process runner: runs a job in a fresh child of the zygote, holds it to its limits and
turns what happened into a `RunReport`.

Per job, in the calling worker thread: a fresh directory (the child's cwd, HOME and
TMPDIR, removed afterwards), its cgroups, the output and report pipes (handed to the
zygote, which forks the child onto them), then the child watched to its end (run/watch.py).
The child sees of the daemon's environment only `child_env`'s, plus `job_env`'s own part.
Never forks, never decides a fate, never unpickles: the report is JSON.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import re
import selectors
import shutil
import signal
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..core.fate import CANCELLED
from ..core.job import Job
from ..core.policy.liveness import STALLED
from ..core.sandbox import Limits
from . import capture, cgroup, cgroup_v1, context, credentials, isolate
from .base import CANCEL_KEPT, RunReport
from .supervisor import ZygoteSupervisor, ZygoteUnavailableError
from .watch import Watch, tree_cpu

log = logging.getLogger("queickd.sandbox")

KILL_GRACE = 1.0  # seconds between SIGTERM and SIGKILL at a timeout
FSIZE_LIMIT = 1 << 30  # bytes: the largest file a process job may write
NOFILE_LIMIT = 1024
INLINE_ARGS = 64 * 1024  # bytes of arguments sent in the request; more go through a file
_PASSED_ENV = ("PATH", "LANG", "TZ")
LIMIT_KINDS = ("timeout", "memory_limit", "output_limit", STALLED)
_JOB_DIR = re.compile(r"queickd-job-\d+-(\d+)-\d+")  # _job_dir's names: job id, daemon pid, counter


def child_env(passthrough: Sequence[str] = ()) -> dict[str, str]:
    """What every process job's environment holds of the daemon's: PATH, LANG/LC_*, TZ and
    the names --sandbox-env passes on. With `job_env`'s part, that is all a job sees."""
    env = {k: v for k, v in os.environ.items() if k in _PASSED_ENV or k.startswith("LC_")}
    env.setdefault("PATH", os.defpath)
    for name in passthrough:
        if name in os.environ and not name.startswith("QUEICKD_"):
            env[name] = os.environ[name]
    return env


def job_env(job_dir: str, creds_dir: str | None = None) -> dict[str, str]:
    """One job's own part of its environment: HOME and TMPDIR (its fresh directory), and its
    own credentials directory when its function names credentials."""
    env = {"HOME": job_dir, "TMPDIR": job_dir}
    if creds_dir is not None:
        env[credentials.ENV] = creds_dir
    return env


class _ThreadIO:
    """A worker thread's selector and wake-up pipe, kept from job to job (not made and
    closed for each), closed when the thread ends and its thread-local goes."""

    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self.wake = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.sel.register(self.wake[0], selectors.EVENT_READ, "wake")

    def __del__(self) -> None:
        self.sel.close()
        for fd in self.wake:
            os.close(fd)


class ProcessRunner:
    """Runs jobs in zygote children. Safe from many worker threads at once."""

    def __init__(self, supervisor: ZygoteSupervisor, passthrough_env: Sequence[str] = (),
                 *, use_cgroup: bool = True, kill_grace: float = KILL_GRACE, hidden: Sequence[str] = (),
                 user: tuple[int, int] | None = None) -> None:
        self.supervisor = supervisor
        self.user = user  # --job-user's (uid, gid): jobs run as that user
        self.hidden = list(hidden)  # what a job's mount namespace covers (isolate.hidden_paths)
        self.passthrough_env = tuple(passthrough_env)
        self.kill_grace = kill_grace
        self.env = child_env(self.passthrough_env)  # once: the daemon's environment does not change
        self.cgroups = cgroup.JobCgroups.find() if use_cgroup else None
        # How memory limits hold here (cgroup v2, cgroup v1 or the RSS watch, and why):
        # what stats, /metrics, the status page and the start log say.
        self.means = cgroup.means(self.cgroups, cgroup.JobCgroups.reason if use_cgroup
                                  else "cgroups are off for this runner")
        self.kills = dict.fromkeys(LIMIT_KINDS, 0)  # limit kills by kind
        self.crashed = 0
        self._count_lock = threading.Lock()
        self._watches: dict[int, Watch] = {}  # job id -> its running child (under _count_lock)
        # Cancels of jobs not (yet) watched here: a job cancelled while it waited for a worker
        # thread or its child. Job id -> when; kept CANCEL_KEPT seconds at most.
        self._cancelled: dict[int, float] = {}
        self._local = threading.local()  # each worker thread's _ThreadIO
        self._tmp = tempfile.gettempdir()
        self._dirs = itertools.count(1)  # the job directories' names (next() is atomic)
        self.progress: context.ProgressSink | None = None  # where queickd.progress() in a child goes

    def sweep(self) -> None:
        """At start: the job directories and per-job groups of a daemon that was killed with
        SIGKILL while its process jobs ran (its pid is in their names, and it is gone) are
        removed, the groups killed first (whatever its jobs left in them), each logged."""
        for path in left_dirs(self._tmp):
            shutil.rmtree(path, ignore_errors=True)
            log.warning("%s the job directory %s left behind by a daemon that is gone",
                        "cannot remove" if os.path.lexists(path) else "removed", path)
        if self.cgroups is None:
            return
        try:
            done = self.cgroups.sweep()
        except OSError as e:
            log.warning("cannot look for cgroups left behind by a daemon that is gone: %s", e)
            return
        for name, killed, removed in done:
            if removed:
                log.warning("removed the cgroup %s left behind by a daemon that is gone, killing %d "
                            "process(es) left in it", name, killed)
            else:
                log.warning("cannot remove the cgroup %s left behind by a daemon that is gone (%d "
                            "process(es) were in it)", name, killed)

    def cancel(self, job_id: int, held: bool = False) -> None:
        """An operator cancelled the running job: its process group is killed at once (the
        store has already marked it cancelled, so what it reports is discarded). A job not
        watched yet and `held` (claimed here, still starting) is killed as soon as it is, or
        not started; one not held here runs elsewhere, or not at all (Runner.cancel)."""
        now = time.monotonic()
        with self._count_lock:
            watch = self._watches.get(job_id)
            if watch is None and held:
                self._cancelled = {j: t for j, t in self._cancelled.items() if now - t < CANCEL_KEPT}
                self._cancelled[job_id] = now
        if watch is not None:
            watch.kill(CANCELLED, "cancelled by an operator while it ran", signal.SIGKILL)

    def stall(self, job_id: int, message: str) -> bool:
        """Runner.stall: the job's process group is killed (SIGKILL, as a cancel's: it comes
        from another thread than the watch's, which would not wake for a grace's end); the
        run fails as `stalled`. False when it is not watched here."""
        with self._count_lock:
            watch = self._watches.get(job_id)
        if watch is None:
            return False
        if watch.killed is None:  # a limit or a cancel that came first stands
            watch.kill(STALLED, message, signal.SIGKILL)
        return True

    def cpu_time(self, job_id: int) -> float | None:
        """Seconds of CPU time the job's process tree has used so far; None when it does not
        run here (or its pid is not known yet)."""
        with self._count_lock:
            watch = self._watches.get(job_id)
        pid = None if watch is None else watch.pid
        return None if pid is None else tree_cpu(pid)

    def stopping(self) -> frozenset[int]:
        """Runner.stopping: the jobs whose child was told to die (a limit, a cancel) and
        has not been reaped yet."""
        with self._count_lock:
            return frozenset(j for j, w in self._watches.items() if w.killed is not None)

    def _job_dir(self, job_id: int) -> str:
        """A fresh directory for one job, made by mkdir (0700): it fails rather than take one
        that exists, so a name made here from the pid and a counter is as safe as mkdtemp's
        random one, at a fraction of its cost; a name taken by someone else gets mkdtemp's."""
        path = os.path.join(self._tmp, f"queickd-job-{job_id}-{os.getpid()}-{next(self._dirs)}")
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            return tempfile.mkdtemp(prefix=f"queickd-job-{job_id}-", dir=self._tmp)
        return path

    def _progress_of(self, job: Job) -> Callable[[float, float | None, str | None, float], None] | None:
        sink = self.progress
        if sink is None:
            return None
        return lambda done, total, note, at: sink(job.id, job.attempts, done, total, note, at)

    def _count(self, error_type: str | None) -> None:
        with self._count_lock:
            if error_type in self.kills:
                self.kills[error_type] += 1
            elif error_type == "crashed":
                self.crashed += 1

    def run(self, job: Job, limits: Limits | None = None) -> RunReport:
        limits = limits or Limits()
        began = time.monotonic()
        with self._count_lock:
            cancelled = self._cancelled.pop(job.id, None) is not None
        if cancelled:
            return RunReport(False, None, CANCELLED, "cancelled by an operator before it started", None)
        job_dir = self._job_dir(job.id)
        cg = None
        try:
            creds = credentials.copy(job_dir, limits.credentials)
            if self.cgroups is not None:
                cg = self.cgroups.create(job.id, limits.memory_mb)
            report = self._run(job, limits, job_dir, creds, cg, began)
        except Exception as e:  # the sandbox itself failed: the job did not run as asked
            log.exception("cannot run job %d in a process", job.id)
            report = capture.failed(e, time.monotonic() - began)
            report.error_type = "sandbox_setup"
        finally:
            if cg is not None:
                cg.remove()
            try:
                os.rmdir(job_dir)  # what most jobs leave: an empty directory
            except OSError:
                shutil.rmtree(job_dir, ignore_errors=True)
        self._count(report.error_type)
        if self.user is not None and self.supervisor.namespaces is not None:
            self._clear_shm()
        return report

    def _clear_shm(self) -> None:
        """Without namespaces /dev/shm is the host's: what the job user left there is
        removed once no process job of this runner runs (a running one may be using it)."""
        with self._count_lock:
            if self._watches:
                return
            removed = isolate.remove_shm(self.user[0])  # type: ignore[index]
        if removed:
            log.info("removed %d file(s) the job user left in /dev/shm: %s", len(removed), ", ".join(removed[:10]))

    def _run(self, job: Job, limits: Limits, job_dir: str, creds: str | None, cg: Any,
             began: float) -> RunReport:
        max_out = limits.output_kb * 1024
        rlimits = {"fsize": FSIZE_LIMIT, "nofile": NOFILE_LIMIT}
        if limits.memory_mb is not None and cg is None:  # the backstop of the RSS watch
            rlimits["as"] = (2 * limits.memory_mb + 1024) << 20
        if limits.timeout is not None:
            rlimits["cpu"] = cpu_limit(limits.timeout)
        if cg is None and (os.geteuid() != 0 or self.user is not None):
            # No pids.max: RLIMIT_NPROC, which counts every process (thread) of the user, the
            # daemon's own included, so the child sets it PIDS_MAX above what the user runs
            # as it starts (root is exempt from it).
            rlimits["nproc"] = cgroup.PIDS_MAX
        req = {"op": "run", "func": job.func, "args": job.args, "kwargs": job.kwargs,
               "env": self.env, "env_job": job_env(job_dir, creds), "cwd": job_dir,
               "deadline": None if limits.timeout is None else began + limits.timeout,
               # Its namespaces' set-up, if the zygote found the kernel allows them (run/isolate.py).
               "user": self.user,
               "isolate": {"tmp": self._tmp, "job_dir": job_dir, "hide": self.hidden, "shm_mb": limits.memory_mb},
               "rlimits": rlimits, "cgroups": list(cg.paths) if cg is not None else [], "max_result": max_out,
               "workflow_key": job.idempotency_key if job.workflow_run is not None else None,
               "cron_ticks": context.ticks_of(job.cron, job.idempotency_key, job.cron_until),
               "job": [job.id, job.attempts, None if limits.timeout is None
                       else time.time() + limits.timeout - (time.monotonic() - began)],
               "progress": self.progress is not None}  # the child sends it on its report pipe
        if len(job.args) + len(job.kwargs) and len(json.dumps([job.args, job.kwargs])) > INLINE_ARGS:
            # A socket packet is bounded by the socket's buffer (~200 KB): large arguments go
            # to the child in a file of its own directory, which it reads and removes.
            req["args"], req["kwargs"] = [], {}
            req["args_file"] = os.path.join(job_dir, ".queickd-args.json")
            with open(req["args_file"], "w", encoding="utf-8") as f:
                json.dump([job.args, job.kwargs], f, ensure_ascii=False)
        retry = True  # a zygote that died before it forked the job: once more, on a new one
        while True:
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            rep_r, rep_w = os.pipe2(os.O_CLOEXEC)
            try:
                io = getattr(self._local, "io", None)
                if io is None:
                    io = self._local.io = _ThreadIO()
                try:
                    # A memory watch needs the child's pid as soon as it is known.
                    p = self.supervisor.submit(job.func, req, (out_w, rep_w), wake=io.wake,
                                               wake_on_pid=limits.memory_mb is not None)
                except ZygoteUnavailableError as e:
                    return RunReport(False, None, "crashed", f"the job could not start: {e}", None,
                                     runtime=time.monotonic() - began)
                finally:
                    os.close(out_w)
                    os.close(rep_w)
                watch = Watch(p, io.sel, out_r, rep_r, limits, max_out, cg, began, self.kill_grace,
                              rlimits.get("cpu"), follower=self.supervisor.namespaces is None,
                              progress=self._progress_of(job))
                with self._count_lock:
                    self._watches[job.id] = watch
                    cancelled = self._cancelled.pop(job.id, None) is not None
                if cancelled:  # between the start of run() and now
                    watch.kill(CANCELLED, "cancelled by an operator as it started", signal.SIGKILL)
                try:
                    report = watch.run()
                finally:
                    with self._count_lock:
                        self._watches.pop(job.id, None)
                    self.supervisor.done(p)
                if p.pid is not None or not retry or "zygote_died" not in (watch.exit or {}):
                    return report
                retry = False
            finally:
                os.close(out_r)
                os.close(rep_r)


def left_dirs(tmp: str) -> list[str]:
    """The job directories in `tmp` of a daemon that is gone: named as _job_dir names them,
    with a pid that is no live process here (never this one's), a directory (not a link)
    of this user's. Anything else is left alone."""
    try:
        names = os.listdir(tmp)
    except OSError:
        return []
    out = []
    for name in sorted(names):
        m = _JOB_DIR.fullmatch(name)
        if m is None or int(m.group(1)) == os.getpid() or cgroup_v1.pid_alive(int(m.group(1))):
            continue
        path = os.path.join(tmp, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
            out.append(path)
    return out


def cpu_limit(timeout: float) -> int:
    """A timed job's RLIMIT_CPU, seconds: a backstop for a child no watch kills (the daemon
    stopped, or its pid never came). CPU time counts every thread of the child, so a job
    busy on every core for its whole timeout stays within it and meets the wall-clock kill
    first, which says `timeout` (a job's threads working in parallel are no crash)."""
    return math.ceil(timeout * (os.cpu_count() or 1)) + 2
