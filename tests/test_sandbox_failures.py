"""Process jobs that fail in ways the sandbox itself must outlive: a job module that exits,
kills its process or fails with a huge message as it is imported, a zygote that never
answers, a result nested too deep, the CPU time limit. Real zygotes and children (no
daemon); the misbehaving job modules are written into a fresh app directory per test."""

from __future__ import annotations

import contextlib
import json
import math
import os
import selectors
import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_fate import make_job

from queickd.core.sandbox import Limits
from queickd.run import process
from queickd.run.base import RunReport
from queickd.run.loader import FunctionLoader
from queickd.run.process import KILL_GRACE, ProcessRunner
from queickd.run.supervisor import Pending, ZygoteSupervisor
from queickd.run.thread import ThreadRunner
from queickd.run.watch import Watch

JOBS = str(Path(__file__).parent / "jobs")
FINE = "import os\n\ndef ok():\n    return os.getpid()\n"
JOB = "\ndef job():\n    return 1\n"


@contextlib.contextmanager
def _runner(app: Path, *, preload: tuple[str, ...] = (), kill_grace: float = KILL_GRACE,
            **modules: str) -> Iterator[ProcessRunner]:
    """A runner with a zygote of its own on an app directory holding `modules` (name -> code)."""
    app.mkdir(exist_ok=True)
    for name, code in modules.items():
        (app / f"{name}.py").write_text(code)
    sup = ZygoteSupervisor(str(app), preload=preload)
    try:
        yield ProcessRunner(sup, use_cgroup=False, kill_grace=kill_grace)
    finally:
        sup.stop()


def _run(runner: ProcessRunner, func: str, *args, limits: Limits | None = None) -> RunReport:
    return runner.run(make_job(func=func, args=list(args)), limits)


@pytest.fixture(scope="module")
def jobs_runner():
    sup = ZygoteSupervisor(JOBS)
    yield ProcessRunner(sup, use_cgroup=False)
    sup.stop()


# --- a job module's import -------------------------------------------------------------------

@pytest.mark.parametrize(("code", "error_type"), [("import sys\nsys.exit('SETTING is not set')\n", "SystemExit"),
                                                  ("raise KeyboardInterrupt\n", "KeyboardInterrupt")])
def test_a_module_that_exits_at_import_fails_its_own_job_and_the_zygote_serves_on(tmp_path, code, error_type):
    with _runner(tmp_path / "app", fine=FINE, bad=code + JOB) as r:
        assert _run(r, "fine:ok").ok
        zygote = r.supervisor.pid
        bad = _run(r, "bad:job")
        assert (bad.ok, bad.error_type) == (False, error_type)
        after = _run(r, "fine:ok")
        assert after.ok and r.supervisor.pid == zygote  # the same zygote: it lived on


def test_a_module_that_ends_the_zygote_at_import_is_not_imported_by_the_next_zygote(tmp_path):
    with _runner(tmp_path / "app", fine=FINE, dies="import os\nos._exit(3)\n" + JOB) as r:
        dead = _run(r, "dies:job")
        assert (dead.ok, dead.error_type) == (False, "crashed") and "zygote died" in dead.error_message
        assert _run(r, "fine:ok").ok  # the zygote started for it does not import dies.py first


def test_a_preloaded_function_whose_module_exits_at_import_is_dropped_and_the_zygote_serves(tmp_path):
    with _runner(tmp_path / "app", preload=("bad:job",), fine=FINE, bad="import sys\nsys.exit(2)\n" + JOB) as r:
        assert _run(r, "fine:ok").ok
        os.kill(r.supervisor.pid, signal.SIGKILL)  # the next zygote preloads what imported, not what failed
        assert _run(r, "fine:ok").ok
        with open(f"/proc/{r.supervisor.pid}/cmdline") as f:
            args = f.read().split("\0")
        assert "fine:ok" in args and "bad:job" not in args


def test_a_module_whose_import_fails_with_a_huge_message_fails_its_job_with_the_message_cut(tmp_path):
    big = ("CONFIG = {f'key{i}': 'v' * 20 for i in range(20000)}\n"  # ~700 KB in the message
           "raise ValueError(f'bad configuration: {CONFIG!r}')\n")
    with _runner(tmp_path / "app", big=big + JOB) as r:
        bad = _run(r, "big:job")  # no timeout: only the zygote's answer ends the wait
    assert (bad.ok, bad.error_type) == (False, "ValueError")
    assert bad.error_message.startswith("bad configuration: {'key0': 'vvv")
    assert bad.error_message.endswith("characters in all]") and len(bad.error_message) < 20_000


def test_a_job_the_zygote_never_forks_is_crashed_at_its_deadline_plus_the_grace(tmp_path):
    release = tmp_path / "release"
    os.mkfifo(release)  # the module's import waits for a writer: the zygote never answers meanwhile
    with _runner(tmp_path / "app", kill_grace=0.5, stuck=f"open({str(release)!r}).read()\n" + JOB) as r:
        began = time.monotonic()
        try:
            stuck = _run(r, "stuck:job", limits=Limits(timeout=1))
        finally:
            with contextlib.suppress(OSError):  # ENXIO: no reader (the zygote is gone)
                os.close(os.open(release, os.O_WRONLY | os.O_NONBLOCK))
        took = time.monotonic() - began
    assert (stuck.ok, stuck.error_type) == (False, "crashed") and "never started" in stuck.error_message
    assert 1.5 <= took < 4


# --- the result ------------------------------------------------------------------------------

@pytest.mark.parametrize("levels", [65, 600, 5000])
def test_a_result_nested_deeper_than_the_limit_is_stored_as_a_thread_run_stores_it(jobs_runner, levels):
    job = make_job(func="testjobs:nested_result", args=[levels])
    in_thread = ThreadRunner(FunctionLoader(JOBS)).run(job)
    in_process = jobs_runner.run(job, None)
    assert in_process.ok and in_process.result == in_thread.result
    assert in_process.result == "<result nested more than 64 levels deep; not stored>"


# --- the CPU time limit ----------------------------------------------------------------------

def test_a_timed_process_job_gets_a_cpu_time_limit_of_its_timeout_on_every_core(tmp_path):
    probe = "import resource\n\ndef cpu_limit():\n    return resource.getrlimit(resource.RLIMIT_CPU)\n"
    with _runner(tmp_path / "app", probe=probe) as r:
        got = _run(r, "probe:cpu_limit", limits=Limits(timeout=5))
    assert got.result == [math.ceil(5 * os.cpu_count()) + 2] * 2  # its threads may use every core


def test_a_child_killed_at_its_cpu_time_limit_is_a_timeout_not_a_crash(jobs_runner, monkeypatch):
    # The real limit lets a job's threads use every core until the wall-clock kill; a limit of
    # 1 s lets one busy thread reach it first (the timeout only stops a failing test).
    monkeypatch.setattr(process, "cpu_limit", lambda timeout: 1, raising=False)
    spun = jobs_runner.run(make_job(func="sandboxjobs:spin"), Limits(timeout=20))
    assert (spun.ok, spun.error_type) == (False, "timeout") and "CPU time limit of 1 s" in spun.error_message
    assert spun.runtime < 20


# --- reloads while a job is on its way to a zygote -------------------------------------------

class ImportGate:
    """A unix socket that the gated module's import connects to and then waits on: each
    zygote importing it is held there, the test knowing it is, until the test lets it go."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.srv = socket.socket(socket.AF_UNIX)
        self.srv.bind(self.path)
        self.srv.listen()
        self.srv.settimeout(20)  # only a failing test waits this long
        self.code = (f"import os, socket\nif os.path.exists({self.path!r}):\n"
                     f"    with socket.socket(socket.AF_UNIX) as s:\n"
                     f"        s.connect({self.path!r})\n        s.recv(1)\n" + JOB)

    def held(self) -> socket.socket:
        """Wait until a zygote is importing the module; closing what it returns lets it go."""
        return self.srv.accept()[0]

    def remove(self) -> None:
        """From now on the module imports without waiting."""
        os.unlink(self.path)
        self.srv.close()


def test_a_job_whose_zygote_is_reloaded_as_it_starts_runs(tmp_path):
    gate = ImportGate(tmp_path / "g")
    with _runner(tmp_path / "app", preload=("gated:job",), gated=gate.code) as r:
        with ThreadPoolExecutor(1) as pool:
            job = pool.submit(_run, r, "gated:job")
            for last in (False, True):  # two reloads, each while the zygote started for the job imports
                held = gate.held()
                r.supervisor.reload("test")
                if last:
                    gate.remove()
                held.close()
            done = job.result(timeout=30)
    assert done.ok and done.result == 1


def test_a_jobs_exit_stands_when_its_zygote_ends_just_after_it(tmp_path):
    out_r, out_w = os.pipe()
    rep_r, rep_w = os.pipe()
    os.write(rep_w, json.dumps(RunReport(True, 5, None, None, None).to_dict()).encode())
    os.close(out_w)
    os.close(rep_w)
    sel = selectors.DefaultSelector()
    wake_r, wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    p = Pending(1, wake_r, wake_w, pid=4242)
    p.post({"id": 1, "exit": 0, "cpu": 0.01})  # the job's end, then its zygote's: both read at once
    p.post({"id": 1, "zygote_died": 0})
    try:
        report = Watch(p, sel, out_r, rep_r, Limits(), 1024, None, time.monotonic(), KILL_GRACE).run()
    finally:
        p.close()
        sel.close()
        os.close(out_r)
        os.close(rep_r)
    assert (report.ok, report.result) == (True, 5)
