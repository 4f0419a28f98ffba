"""The process runner on its own: real zygote, real children, real limits (no daemon).

Each test runs jobs of tests/jobs/sandboxjobs.py through one ProcessRunner whose zygote is
started once per module; the limits are the real ones (signals, RSS, pipes)."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_fate import make_job

from queickd.core import sandbox
from queickd.core.fate import after_failure, after_success
from queickd.core.job import State
from queickd.core.sandbox import Limits
from queickd.run import cgroup, cgroup_v1
from queickd.run.process import KILL_GRACE, ProcessRunner, child_env
from queickd.run.supervisor import ZygoteSupervisor
from queickd.run.watch import MAX_STORED_OUTPUT

JOBS = str(Path(__file__).parent / "jobs")


@pytest.fixture(scope="module")
def runner():
    sup = ZygoteSupervisor(JOBS)
    r = ProcessRunner(sup, use_cgroup=False)
    yield r
    sup.stop()


@pytest.fixture(scope="module")
def plain_runner():
    """Jobs in the zygote's namespaces (where the kernel allows none of their own): what they
    leave behind is found by the zygote, their subreaper, and killed."""
    sup = ZygoteSupervisor(JOBS, namespaces=False)
    r = ProcessRunner(sup, use_cgroup=False)
    yield r
    sup.stop()


def run(runner: ProcessRunner, func: str, *args, limits: Limits | None = None):
    return runner.run(make_job(func=f"sandboxjobs:{func}", args=list(args)), limits)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_process_job_returns_its_result_with_its_own_peak_memory_and_cpu_time(runner):
    r = run(runner, "allocate", 64)
    assert (r.ok, r.result) == (True, 64)
    assert r.peak_memory is not None and r.peak_memory >= 64 << 20  # its VmHWM holds the 64 MB it touched
    small = run(runner, "noop")
    assert small.peak_memory < r.peak_memory  # its own, not the zygote's at fork or the last job's
    burnt = run(runner, "burn", 0.2)
    assert 0.15 <= burnt.cpu_time < 2


def test_an_infinite_loop_is_killed_at_its_timeout_and_the_next_job_runs(runner):
    began = time.monotonic()
    r = run(runner, "spin", limits=Limits(timeout=1))
    took = time.monotonic() - began
    assert r.error_type == "timeout" and "1 s" in r.error_message
    assert 1 <= took < 1 + KILL_GRACE + 0.5
    assert run(runner, "noop").ok


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace_and_its_watch_waits_without_spinning(runner):
    began, cpu = time.monotonic(), time.thread_time()
    r = run(runner, "deaf", limits=Limits(timeout=0.5))
    took, cpu = time.monotonic() - began, time.thread_time() - cpu
    assert r.error_type == "timeout" and 0.5 + KILL_GRACE <= took < 0.5 + KILL_GRACE + 1
    assert cpu < 0.3  # the watching thread slept through the grace, it did not poll it


def test_a_timeout_leaves_no_grandchild_behind_even_one_that_called_setsid(plain_runner, tmp_path):
    pidfile = tmp_path / "pids"
    r = run(plain_runner, "spawn_and_hang", str(pidfile), limits=Limits(timeout=1))
    assert r.error_type == "timeout"
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 2 and all(_gone(p) for p in pids)  # killed and reaped before the report


def test_a_job_that_returns_leaves_nothing_running_either(plain_runner, tmp_path):
    pidfile = tmp_path / "pids"
    r = run(plain_runner, "spawn_and_return", str(pidfile))
    assert (r.ok, r.result) == (True, "left one behind")
    assert _gone(int(pidfile.read_text()))


def test_a_job_past_its_memory_limit_is_killed_with_what_was_measured(runner):
    r = run(runner, "hog", limits=Limits(memory_mb=64))
    assert r.error_type == "memory_limit" and "64 MB" in r.error_message
    assert not r.ok and r.runtime < 10


def test_a_job_flooding_stdout_is_cut_at_its_output_limit_and_killed(runner):
    r = run(runner, "flood", 100, limits=Limits(output_kb=64))
    assert r.error_type == "output_limit" and "64 KB" in r.error_message
    assert r.output.startswith("y" * 1000) and "bytes in all" in r.output
    assert len(r.output) < 66 * 1024


def test_the_captured_output_of_a_failed_job_goes_with_its_outcome(runner):
    r = run(runner, "chatty")
    assert r.error_type == "ValueError"
    assert "to stdout" in r.output and "to stderr" in r.output
    outcome = after_failure(make_job(retry=None, max_attempts=1), r, 0.0)
    assert "to stderr" in outcome.output and "output" not in outcome.error


def test_the_captured_output_of_a_job_that_succeeds_goes_with_its_outcome(runner):
    r = run(runner, "talk")
    assert (r.ok, r.result) == (True, "talked")
    assert after_success(make_job(), r).output == "to stdout\nto stderr\n"


def test_a_job_that_writes_nothing_has_no_output(runner):
    assert run(runner, "noop").output is None


def test_output_past_the_stored_maximum_is_cut_with_a_marker_and_the_job_still_succeeds(runner):
    r = run(runner, "talk", 100)
    assert r.ok
    kept, marker = r.output.rsplit("\n", 1)
    assert kept.startswith("to stdout\nto stderr\nzzz") and len(kept.encode()) == MAX_STORED_OUTPUT
    assert marker == f"[… {100 * 1024 + 20} bytes in all; the first {MAX_STORED_OUTPUT} kept]"


def test_a_nul_in_the_output_is_stored_escaped(runner):
    assert run(runner, "write_nul").output == "a\\x00b"


def test_the_child_sees_none_of_the_daemons_secrets_and_runs_in_a_fresh_directory_that_is_removed(
        monkeypatch):
    for name, value in (("QUEICKD_TOKEN", "secret"), ("QUEICKD_STORE", "postgresql://u:pw@db/q"),
                        ("DATABASE_URL", "postgresql://u:pw@db/q"), ("AWS_SECRET_ACCESS_KEY", "aws")):
        monkeypatch.setenv(name, value)
    sup = ZygoteSupervisor(JOBS)  # made after the secrets are set: they are in its environment
    try:
        r = run(ProcessRunner(sup, use_cgroup=False), "whoami")
    finally:
        sup.stop()
    env, cwd = r.result["env"], r.result["cwd"]
    assert not {"QUEICKD_TOKEN", "QUEICKD_STORE", "DATABASE_URL", "AWS_SECRET_ACCESS_KEY"} & env.keys()
    assert "postgresql://" not in repr(env)
    assert set(env) <= {"PATH", "LANG", "TZ", "HOME", "TMPDIR"} | {k for k in env if k.startswith("LC_")}
    assert env["HOME"] == env["TMPDIR"] == cwd and r.result["pid"] != os.getpid()
    assert not os.path.exists(cwd)


def test_the_zygote_imports_neither_http_client_nor_ssl():
    # Every forked child maps and tears down what the zygote holds: those two are 6 MB.
    out = subprocess.run([sys.executable, "-c", "import sys, queickd.run.zygote; print(sorted(m for m in "
                          "('http.client', 'ssl', 'urllib.error', 'email.parser') if m in sys.modules))"],
                         capture_output=True, text=True, check=True, cwd=Path(__file__).parent.parent)
    assert out.stdout.strip() == "[]"


def test_a_job_directory_name_someone_else_took_is_never_used(runner, tmp_path):
    runner._tmp, runner._dirs = str(tmp_path), itertools.count(7)
    squatted = tmp_path / f"queickd-job-4242-{os.getpid()}-7"  # the next name it would make
    squatted.mkdir()
    (squatted / "planted").write_text("x")
    r = runner.run(make_job(id=4242, func="sandboxjobs:whoami"))
    assert r.ok and r.result["cwd"] != str(squatted) and r.result["cwd"].startswith(str(tmp_path))
    assert (squatted / "planted").read_text() == "x" and not os.path.exists(r.result["cwd"])


def test_sandbox_env_passes_on_a_named_variable_but_never_a_queickd_one(monkeypatch, tmp_path):
    monkeypatch.setenv("APP_MODE", "edge")
    monkeypatch.setenv("QUEICKD_TOKEN", "secret")
    env = child_env(["APP_MODE", "QUEICKD_TOKEN"])
    assert env["APP_MODE"] == "edge" and "QUEICKD_TOKEN" not in env


def test_os_exit_is_crashed_with_its_code(runner):
    r = run(runner, "exit3")
    assert r.error_type == "crashed" and "code 3" in r.error_message


def test_a_segfault_is_crashed_with_its_signal(runner):
    r = run(runner, "segfault")
    assert r.error_type == "crashed" and "SIGSEGV" in r.error_message


def test_a_result_that_is_not_json_is_a_clear_permanent_error(runner):
    r = run(runner, "returns_a_set")
    assert (r.ok, r.error_type, r.permanent) == (False, "not_json", True)
    assert "set" in r.error_message and "JSON" in r.error_message


def test_an_exception_class_the_parent_cannot_rebuild_arrives_as_its_name_message_and_traceback(runner):
    r = run(runner, "raises_unbuildable")
    assert (r.error_type, r.error_message) == ("UnbuildableError", "needs 1 and 2")
    assert "raises_unbuildable" in r.traceback


def test_a_function_that_cannot_be_imported_fails_without_a_fork(runner):
    r = runner.run(make_job(func="sandboxjobs:missing"), None)
    assert (r.error_type, r.permanent) == ("not_found", True)
    assert "defines no function 'missing'" in r.error_message


def test_a_zygote_killed_with_sigkill_is_restarted_and_the_next_job_runs(caplog):
    sup = ZygoteSupervisor(JOBS)
    r = ProcessRunner(sup, use_cgroup=False)
    try:
        assert run(r, "noop").ok
        first = sup.pid
        os.kill(first, signal.SIGKILL)
        after = run(r, "whoami")  # waits out the backoff if the restart has not happened yet
        assert after.ok and sup.pid not in (None, first)
        assert sup.restarts == 1
    finally:
        sup.stop()


def test_a_reload_reimports_in_the_same_zygote_for_the_next_jobs(runner):
    assert run(runner, "noop").ok  # the zygote is up (a first job starts it)
    before = runner.supervisor.pid
    assert before is not None
    runner.supervisor.reload("test")
    assert run(runner, "noop").ok
    assert runner.supervisor.pid == before


def test_a_limit_on_the_job_wins_over_its_function_and_the_daemon():
    d = sandbox.Defaults(timeout=60, functions={"m:f": {"timeout": 30, "memory_mb": 128}})
    limits = sandbox.decide(make_job(func="m:f", timeout=5), d)
    assert (limits.timeout, limits.memory_mb) == (5, 128)


def test_a_job_that_asks_for_a_thread_stays_off_the_daemons_limits():
    d = sandbox.Defaults(timeout=60)
    assert sandbox.decide(make_job(isolation="thread"), d) is None
    assert sandbox.decide(make_job(), d).timeout == 60


def test_a_job_or_function_that_asks_for_a_thread_keeps_its_timeout_there():
    d = sandbox.Defaults(functions={"m:f": {"isolation": "thread", "timeout": 30}, "m:g": {"timeout": 20}})
    own = sandbox.decide(make_job(isolation="thread", timeout=5), d)
    table = sandbox.decide(make_job(func="m:f"), d)
    both = sandbox.decide(make_job(func="m:g", isolation="thread"), d)
    assert [(x.isolation, x.timeout) for x in (own, table, both)] == [("thread", 5), ("thread", 30), ("thread", 20)]
    assert sandbox.decide(make_job(func="m:h", timeout=5), d).isolation == "process"  # a bare timeout: a process


def test_a_thread_asked_for_with_a_memory_limit_from_its_function_still_runs_in_a_process():
    d = sandbox.Defaults(functions={"m:f": {"memory_mb": 64}})
    limits = sandbox.decide(make_job(func="m:f", isolation="thread", timeout=5), d)
    assert (limits.isolation, limits.memory_mb, limits.timeout) == ("process", 64, 5)


def test_a_job_with_a_limit_runs_in_a_process_even_on_a_thread_daemon():
    assert sandbox.decide(make_job(memory_mb=64), sandbox.Defaults()) is not None
    assert sandbox.decide(make_job(), sandbox.Defaults()) is None


def test_a_job_that_failed_at_its_memory_limit_gets_no_more_memory_on_its_next_try():
    job = make_job(memory_mb=64)
    assert job.memory_mb == 64 and sandbox.decide(job, sandbox.Defaults()).memory_mb == 64
    from queickd.run.base import RunReport

    out = after_failure(job, RunReport(False, None, "memory_limit", "over", None), 0.0)
    assert out.state == State.SCHEDULED  # retried like any failure


# --- per-job cgroups (v2, or v1 on a hybrid host): real groups, skipped where none can be made ---

@pytest.fixture(scope="module")
def cgroups():
    found = cgroup.JobCgroups.find()
    if found is None:
        pytest.skip(f"no per-job cgroup here: {cgroup.JobCgroups.reason}")
    return found


@pytest.fixture(scope="module")
def cg_runner(cgroups):
    sup = ZygoteSupervisor(JOBS, namespaces=False)  # the groups alone hold what the job starts
    r = ProcessRunner(sup)
    assert r.cgroups is not None
    yield r
    sup.stop()
    assert not _groups_left(r.cgroups)


def _groups_left(found) -> list[str]:
    """This process's jobs' groups still there, in every hierarchy (others share the roots)."""
    bases = found.bases.values() if isinstance(found, cgroup_v1.JobCgroupsV1) else [found.base]
    mine = f"-{os.getpid()}-"
    return [os.path.join(b, n) for b in bases for n in os.listdir(b) if n.startswith("job-") and mine in n]


def _procs(g) -> set[int]:
    out: set[int] = set()
    for path in g.paths:
        with open(os.path.join(path, "cgroup.procs")) as f:
            out.update(int(p) for p in f.read().split())
    return out


def _until(cond, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def test_per_job_cgroups_hold_the_memory_limit_where_a_cgroup_can_be_created(cg_runner):
    out = run(cg_runner, "hog", limits=Limits(memory_mb=64))
    assert out.error_type == "memory_limit"
    assert not _groups_left(cg_runner.cgroups)


def _job_groups(runner, limits=None) -> dict[str, str]:
    """Controller ("" on v2) -> the path of the group the child ran in."""
    lines = run(runner, "own_cgroups", limits=limits).result.splitlines()
    groups = {names: path for _, names, path in (line.split(":", 2) for line in lines)}
    found = runner.cgroups
    wanted = found.bases if isinstance(found, cgroup_v1.JobCgroupsV1) else {"": found.base}
    return {name: next(p for names, p in groups.items() if name in names.split(",")) for name in wanted}


def test_the_child_runs_in_a_group_of_its_own_in_each_hierarchy(cg_runner):
    for name, path in _job_groups(cg_runner, Limits(memory_mb=256)).items():
        assert os.path.basename(path).startswith("job-"), (name, path)


def test_on_v1_a_job_without_a_memory_limit_gets_no_memory_group_but_the_others(cg_runner):
    if not isinstance(cg_runner.cgroups, cgroup_v1.JobCgroupsV1):
        pytest.skip("v2 has one group for every controller")
    groups = _job_groups(cg_runner)
    assert not os.path.basename(groups.pop("memory")).startswith("job-")  # the zygote's own
    for name, path in groups.items():  # pids.max and the freezer hold every job
        assert os.path.basename(path).startswith("job-"), (name, path)


def test_a_job_past_its_memory_limit_is_killed_in_its_cgroup_which_reports_the_peak(cg_runner):
    r = run(cg_runner, "hog", limits=Limits(memory_mb=64))
    assert r.error_type == "memory_limit" and "in its cgroup" in r.error_message
    # The group's high-water mark: at most the limit it held (a look at the RSS would see
    # it past the limit, the watch's trigger), and not far under it.
    assert 56 << 20 <= r.peak_memory <= 64 << 20
    assert not _groups_left(cg_runner.cgroups)


def test_a_setsid_grandchild_of_a_job_that_times_out_in_a_cgroup_is_gone_with_its_groups(
        cg_runner, tmp_path):
    pidfile = tmp_path / "pids"
    r = run(cg_runner, "spawn_and_hang", str(pidfile), limits=Limits(timeout=1))
    assert r.error_type == "timeout"
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 2 and all(_gone(p) for p in pids)
    assert not _groups_left(cg_runner.cgroups)


def test_a_job_that_forks_without_end_is_held_by_pids_max(cg_runner):
    r = run(cg_runner, "spawn_until_refused", 2 * cgroup.PIDS_MAX)
    assert r.ok and cgroup.PIDS_MAX - 8 <= r.result < cgroup.PIDS_MAX  # the job itself is one of them
    assert not _groups_left(cg_runner.cgroups)


@contextlib.contextmanager
def _bomb(g) -> Iterator[subprocess.Popen]:
    """A fork bomb in the job groups `g`, forking at full speed; the groups are removed and
    its reaper ended afterwards, whatever the test found."""
    p = subprocess.Popen([sys.executable, os.path.join(JOBS, "forkbomb.py"), *g.paths],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert p.stdout.readline() == b"in\n"
        assert _until(lambda: len(_procs(g)) >= cgroup.PIDS_MAX // 2)
        yield p
    finally:
        g.remove()
        p.kill()
        p.wait()


def test_kill_empties_the_groups_of_a_fork_bomb_racing_it(cgroups):
    g = cgroups.create(0, None)
    with _bomb(g) as reaper:
        g.kill()  # v2: cgroup.kill; v1: frozen, killed, thawed
        assert _until(lambda: not _procs(g))
        assert reaper.wait(10) == 0
    assert not any(os.path.exists(p) for p in g.paths)


def test_without_a_freezer_remove_still_kills_a_fork_bomb_and_removes_its_groups(cgroups):
    if not isinstance(cgroups, cgroup_v1.JobCgroupsV1):
        pytest.skip("the freezer is cgroup v1's; v2 kills with cgroup.kill")
    bases = {k: v for k, v in cgroups.bases.items() if k != "freezer"}
    g = cgroup_v1.JobCgroupsV1(bases, cgroup.PIDS_MAX).create(0, None)
    with _bomb(g) as reaper:
        g.remove()  # kills until no new process appears, again until each group can go
        assert not any(os.path.exists(p) for p in g.paths)
        assert reaper.wait(10) == 0


def test_a_changed_app_module_is_imported_afresh_for_the_next_process_job(tmp_path):
    app = tmp_path / "app"
    app.mkdir()
    mod = app / "changing.py"
    mod.write_text("def version():\n    return 1\n")
    sup = ZygoteSupervisor(str(app))
    r = ProcessRunner(sup, use_cgroup=False)
    try:
        assert r.run(make_job(func="changing:version"), None).result == 1
        mod.write_text("def version():\n    return 2\n")
        os.utime(mod, (time.time() + 5, time.time() + 5))  # a new mtime even on a coarse clock
        again = r.run(make_job(func="changing:version"), None)
        assert (again.ok, again.result) == (True, 2)
    finally:
        sup.stop()


def test_a_function_tables_credential_is_copied_into_the_jobs_own_directory_and_a_missing_one_refused(tmp_path, monkeypatch):
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "slack-token").write_text("xoxb")
    (creds / "db-password").write_text("hunter2")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    sup = ZygoteSupervisor(JOBS)
    r = ProcessRunner(sup, use_cgroup=False)
    try:
        out = r.run(make_job(func="sandboxjobs:whoami"), Limits(credentials=("slack-token",)))
        own = out.result["env"]["CREDENTIALS_DIRECTORY"]
        assert own.startswith(out.result["cwd"]) and own != str(creds)
        assert not os.path.exists(own)  # removed with the job's directory
        refused = r.run(make_job(func="sandboxjobs:whoami"), Limits(credentials=("nope",)))
        assert refused.error_type == "sandbox_setup" and "nope" in refused.error_message
    finally:
        sup.stop()


def test_arguments_larger_than_a_socket_packet_reach_the_child(runner):
    r = runner.run(make_job(func="sandboxjobs:size", args=["x" * 900_000], kwargs={"extra": {"a": 1}}), None)
    assert (r.ok, r.result) == (True, 900_001)


def test_a_job_cancelled_before_it_starts_is_never_forked(runner):
    job = make_job(id=9001, func="sandboxjobs:spin")
    runner.cancel(job.id, held=True)  # claimed, then cancelled while it waited for its worker thread
    began = time.monotonic()
    r = runner.run(job, Limits(timeout=30))
    assert (r.ok, r.error_type) == (False, "cancelled") and time.monotonic() - began < 5
    assert run(runner, "sleep", 0).ok  # the cancel was used up by its own job


def test_a_cancel_of_a_job_not_held_here_does_not_stop_its_later_run_here(runner):
    # Another host's job, cancelled there (a fleet tells every host); retried and claimed here.
    runner.cancel(9003)
    assert runner.run(make_job(id=9003, func="sandboxjobs:sleep", args=[0]), None).ok


def test_a_job_cancelled_as_its_child_starts_is_killed_once_its_pid_is_known(runner, monkeypatch):
    job = make_job(id=9002, func="sandboxjobs:spin")
    submit = runner.supervisor.submit

    def submit_then_cancel(*a, **kw):  # the cancel comes while the zygote forks: no pid known yet
        pending = submit(*a, **kw)
        runner.cancel(job.id, held=True)
        return pending

    monkeypatch.setattr(runner.supervisor, "submit", submit_then_cancel)
    began = time.monotonic()
    r = runner.run(job, Limits(timeout=30))  # the timeout only stops a failing test
    assert (r.ok, r.error_type) == (False, "cancelled") and time.monotonic() - began < 5
