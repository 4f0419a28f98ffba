"""The job's own process, freshly forked from the zygote: it locks itself in (_lock_in),
runs the one job and writes its run report as JSON on fd 3 (after its progress lines,
run/progress_pipe.py), then exits without running any clean-up of the zygote it was copied
from. As the subreaper of whatever it starts, a grandchild that calls setsid is still its
own (and the zygote's once it is gone). Its peak memory is its own VmHWM. It never
unpickles anything and never returns to its caller.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

from ..core.fate import clean, storable_result
from ..core.protocol import MAX_DEPTH, too_deep
from . import capture, cgroup_v1, context, isolate
from .base import RunReport
from .progress_pipe import ProgressPipe

REPORT_FD = 3
_RLIMITS = {"as": resource.RLIMIT_AS, "cpu": resource.RLIMIT_CPU, "fsize": resource.RLIMIT_FSIZE,
            "nofile": resource.RLIMIT_NOFILE, "nproc": resource.RLIMIT_NPROC}
_strict = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
# What the child sets back to the default before job code runs, as plain ints: the
# signal module's wrapper would look each one up as an enum, and every object a child
# touches costs it a copied page.
_DEFAULT_SIGNALS = tuple(int(s) for s in (signal.SIGCHLD, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE))
_SIG_DFL = int(signal.SIG_DFL)
_stdio_ready = False  # the zygote opened sys.stdin/stdout/stderr on fds 0-2 as a child wants them


def open_stdio() -> None:
    """sys.stdin, stdout and stderr on fds 0, 1 and 2, line-buffered, undecodable text
    escaped. The zygote calls it once, so that its children, which take the zygote's
    fds 0-2 over with /dev/null and the output pipe, need not open them again."""
    global _stdio_ready
    try:
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - fd 0 lives as long as the process
        sys.stdout = open(1, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115
    except OSError:  # a descriptor is not open here: each child opens them itself
        return
    _stdio_ready = True


def peak_memory() -> int | None:
    """This process's peak resident memory in bytes (VmHWM): its own, unlike wait4's
    ru_maxrss, which for a forked child starts from the parent's size at fork."""
    try:
        fd = os.open("/proc/self/status", os.O_RDONLY)
        try:
            status = os.read(fd, 1 << 16)
        finally:
            os.close(fd)
        return int(status.split(b"VmHWM:", 1)[1].split(None, 1)[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None


def cpu_time() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def _lock_in(req: dict[str, Any], out_fd: int, rep_fd: int) -> None:
    os.setpgid(0, 0)
    signal.set_wakeup_fd(-1)
    for sig in _DEFAULT_SIGNALS:
        signal.signal(sig, _SIG_DFL)
    _term_after(req.get("deadline"))
    isolate.prctl(isolate.PR_SET_PDEATHSIG, signal.SIGKILL)
    isolate.prctl(isolate.PR_SET_CHILD_SUBREAPER, 1)
    for group in req.get("cgroups") or ():  # one on v2; one per hierarchy on v1
        cgroup_v1.write(group + "/cgroup.procs", str(os.getpid()))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    os.dup2(rep_fd, REPORT_FD)
    os.closerange(REPORT_FD + 1, max(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 256))
    user = req.get("user")  # --job-user: (uid, gid)
    for name, value in (req.get("rlimits") or {}).items():
        if value is not None:
            if name == "nproc":  # above what the job's user runs now: the count is per user
                value += isolate.user_tasks(user[0] if user else os.getuid())
            resource.setrlimit(_RLIMITS[name], (value, value))
    os.chdir(req["cwd"])
    os.environ.update(req["env_job"])  # the zygote holds the runner's part: only this job's
    if not _stdio_ready:
        open_stdio()
    if user and not req.get("isolate"):
        isolate.hand_over([req["cwd"]], *user)
    if req.get("isolate"):  # the job goes on in a fork, pid 1 of namespaces of its own
        isolate.enter(req["isolate"], user)
    if user:  # last: the mounts above needed root
        isolate.become(*user)


def _term_after(deadline: float | None) -> None:
    """SIGTERM ends the job only once its deadline has passed (the watch's timeout kill,
    on the same monotonic clock); before, it is someone else's stop (systemd signalling
    every process of the unit) and the daemon drives that: the job runs on. A handler,
    not SIG_IGN: an exec (the job's own subprocesses) sets it back to the default."""
    def on_term(signum: int, frame: Any) -> None:
        if deadline is not None and time.monotonic() >= deadline:
            if os.getpid() == 1:  # its namespace's init ignores its own default-action signals
                os._exit(128 + signum)
            signal.signal(signum, _SIG_DFL)
            os.kill(os.getpid(), signum)

    signal.signal(int(signal.SIGTERM), on_term)


def _judge(report: RunReport, value: Any, max_result: int) -> RunReport:
    """A process job's result must be JSON within its output cap: nothing else crosses. One
    nested more than MAX_DEPTH levels deep is stored as a thread job's is: as
    storable_result's placeholder string (the value could not be read back)."""
    if not report.ok:
        return report
    try:
        text = _strict.encode(value)
        # Fewer brackets than levels allowed cannot nest too deep: most results skip the walk.
        deep = text.count("[") + text.count("{") > MAX_DEPTH and too_deep(value, MAX_DEPTH)
    except RecursionError:  # nested far deeper still: the encoder gave up
        deep = True
    except (TypeError, ValueError) as e:
        return RunReport(False, None, "not_json", clean(
            f"the job returned a {type(value).__name__}, which is not JSON ({e}); a process job "
            "returns JSON data: None, bool, int, float, str, list, dict"), None, permanent=True,
            runtime=report.runtime)
    if deep:
        report.result = storable_result(value)
        return report
    size = len(text.encode("utf-8"))
    if size > max_result:
        return RunReport(False, None, "output_limit", f"the result is {size} bytes, over the output "
                         f"limit of {max_result} bytes", None, permanent=True, runtime=report.runtime)
    report.result = value
    return report


def warm_up() -> None:
    """Run, in the zygote, the parts of a child's path that are safe to run here, until the
    interpreter has specialised their code: a child then writes to fewer of those code
    objects (3.11 counts each call to a code object until it is specialised), and each page
    a child writes is a page it copies from the zygote."""
    for _ in range(16):
        report = _judge(RunReport(True, None, runtime=0.0), {"k": [1, "v"]}, 1 << 20)
        report.peak_memory, report.cpu_time = peak_memory(), cpu_time()
        json.dumps(report.to_dict(), ensure_ascii=False).encode("utf-8", "backslashreplace")
        time.monotonic()


def run(req: dict[str, Any], out_fd: int, rep_fd: int, fn: Callable[..., Any]) -> NoReturn:
    """Run the job in this freshly forked process and exit; never returns."""
    code = 0
    pipe: ProgressPipe | None = None
    try:
        try:
            _lock_in(req, out_fd, rep_fd)
        except BaseException as e:
            report = capture.failed(e, 0.0)
            report.error_type, report.permanent = "sandbox_setup", True
        else:
            began = time.monotonic()
            value: Any = None
            try:
                if req.get("args_file"):
                    with open(req["args_file"], encoding="utf-8") as f:
                        req["args"], req["kwargs"] = json.load(f)
                    os.unlink(req["args_file"])
                ticks = req.get("cron_ticks")  # what queickd.current_job(), workflow_key() and cron_*() read
                job = context.CurrentJob(*req.get("job") or (None, None, None), req.get("workflow_key"),
                                         None if not ticks else (ticks[0], ticks[1]))
                if req.get("progress"):  # queickd.progress(): lines ahead of the report
                    job.progress_to = pipe = ProgressPipe(REPORT_FD)
                context.set_job(job)
                value = fn(*req["args"], **req["kwargs"])
                if capture.awaitable(value):  # an async job: awaited on a loop of its own
                    from .aio import awaited  # asyncio's import is paid by async jobs only

                    value = awaited(value)
            except BaseException as e:  # the job's SystemExit too: it is the report
                report = capture.failed(e, time.monotonic() - began)
            else:
                report = RunReport(True, None, runtime=time.monotonic() - began)
            report = _judge(report, value, req["max_result"])
        if pipe is not None:
            pipe.close()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed or broken stream must not lose the report
                pass
        report.peak_memory, report.cpu_time = peak_memory(), cpu_time()
        data = json.dumps(capture.fit(report).to_dict(), ensure_ascii=False).encode("utf-8", "backslashreplace")
        view = memoryview(data)
        while view:
            view = view[os.write(REPORT_FD, view):]
    except BaseException:
        code = 70  # no report could be written: the parent says crashed with this code
    os._exit(code)
