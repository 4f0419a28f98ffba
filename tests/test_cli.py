"""`queick` as a person uses it: real subprocesses against a real daemon."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import JOBS_DIR, DaemonProcess

from queickd.cli import EX_CONFIG
from queickd.core.job import State


def queick(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "queickd", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def test_help_lists_the_commands():
    out = queick("--help").stdout
    for cmd in ("run", "enqueue", "jobs", "show", "cancel", "retry", "stats", "crons"):
        assert cmd in out


def test_help_ends_with_where_to_read_more_and_that_page_exists():
    last = " ".join(queick("--help").stdout.split()[-20:])
    assert "Documentation: docs/index.md" in last and "/usr/share/doc/queickd/" in last
    assert (Path(__file__).parent.parent / "docs" / "index.md").is_file()


def test_run_help_explains_each_flag_and_its_environment_variable():
    out = queick("run", "--help").stdout
    for flag in ("--store", "--durability", "--port", "--workers", "--app-dir", "--allow",
                 "--token-file", "--stop-timeout"):
        assert flag in out
    assert "QUEICKD_STORE" in out and "QUEICKD_PORT" in out


@pytest.mark.parametrize("argv", [["jobs"], ["enqueue", "m:f"], ["stats"], ["status"]])
def test_a_client_command_loads_none_of_the_daemons_modules(argv):
    # The daemon's modules are two thirds of `queick`'s start; a command that only talks to
    # the daemon parses its arguments and connects without them.
    code = ("import sys; from queickd.cli import parse_args; parse_args(sys.argv[1:]);"
            " print(sorted(m for m in sys.modules if m.split('.')[:2] in"
            " (['queickd', 'daemon'], ['queickd', 'store'], ['queickd', 'services'], ['queickd', 'api'])))")
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout.strip()) == (0, "[]"), r.stderr


def test_the_run_command_takes_its_defaults_from_the_daemons_settings():
    from queickd.cli import parse_args
    from queickd.settings import Config

    a = parse_args(["run"])
    assert (a.store, a.port, a.workers, a.max_connections) == (
        Config.store, Config.port, Config.workers, Config.max_connections)


def test_enqueue_wait_prints_only_the_result(daemon):
    r = queick("enqueue", "testjobs:add", "--args", "[1, 2]", "--wait", "30", "--port", str(daemon.port))
    assert (r.returncode, r.stdout, r.stderr) == (0, "3\n", "")


def test_enqueue_wait_json_prints_the_record(daemon):
    r = queick("enqueue", "testjobs:add", "--args", "[20, 22]", "--wait", "30", "--json",
               "--port", str(daemon.port))
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)
    assert (job["state"], job["result"]) == (State.SUCCEEDED, 42)


def test_enqueue_prints_the_job_id_and_show_prints_the_job(daemon):
    r = queick("enqueue", "testjobs:noop", "--delay", "3600", "--port", str(daemon.port))
    job_id = int(r.stdout)
    show = queick("show", str(job_id), "--port", str(daemon.port))
    assert show.returncode == 0 and "scheduled" in show.stdout and "testjobs:noop" in show.stdout


def test_jobs_stats_cancel_and_retry_commands(daemon):
    port = ["--port", str(daemon.port)]
    later = int(queick("enqueue", "testjobs:noop", "--delay", "3600", *port).stdout)
    failed = json.loads(queick("enqueue", "testjobs:fail", "--wait", "30", "--json", *port).stdout)
    assert failed["state"] == State.DEAD
    listing = queick("jobs", "--state", "dead", *port).stdout
    assert str(failed["id"]) in listing and "ValueError" in listing
    assert queick("cancel", str(later), *port).returncode == 0
    assert queick("retry", str(failed["id"]), *port).returncode == 0
    stats = json.loads(queick("stats", "--json", *port).stdout)
    assert stats["counts"][State.CANCELLED] == 1
    assert "jobs:" in queick("stats", *port).stdout


def test_tries_after_an_orphaned_run_reads_honestly(start_daemon, gate):
    # A job of one attempt runs, its daemon is killed, the next daemon re-queues it (an
    # orphan) and runs it to success: two runs, of which the crashed one does not count.
    first = start_daemon(workers=1)
    with first.client() as q:
        job_id = q.enqueue("testjobs:gate", [gate.port, "held"])
    assert gate.arrival() == "held"
    first.kill()
    second = start_daemon(workers=1)
    assert gate.arrival() == "held"
    gate.release_all()
    with second.client() as q:
        assert q.wait(job_id, 30)["state"] == State.SUCCEEDED
    listing = queick("jobs", "--state", "succeeded", "--port", str(second.port)).stdout
    row = next(line for line in listing.splitlines() if line.split()[:1] == [str(job_id)])
    assert row.split()[2] == "1/1", row
    assert "testjobs:gate  (+1 run lost to a crash, not counted)" in row, row


def test_a_failing_job_with_wait_exits_nonzero(daemon):
    r = queick("enqueue", "testjobs:fail", "--wait", "30", "--port", str(daemon.port))
    assert r.returncode == 1 and r.stdout == ""
    assert "queick: job " in r.stderr and " is dead: ValueError: boom (" in r.stderr


def test_refusals_print_the_error_code_and_exit_1(daemon):
    r = queick("enqueue", "os:system", "--args", '["true"]', "--port", str(daemon.port))
    assert r.returncode == 1 and "not_allowed" in r.stderr
    r = queick("show", "999999", "--port", str(daemon.port))
    assert r.returncode == 1 and "not_found" in r.stderr


def test_bad_json_arguments_are_a_usage_error():
    r = queick("enqueue", "testjobs:noop", "--args", "{not json")
    assert r.returncode == 2 and "not JSON" in r.stderr


def test_a_mistyped_command_is_named_with_the_nearest_one_and_starts_nothing():
    r = queick("workflos")
    assert r.returncode == 2 and "unknown command 'workflos'" in r.stderr and "'workflows'" in r.stderr


def test_no_daemon_is_a_clear_error():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    r = queick("stats", "--port", str(port))
    assert r.returncode == 1 and "is the daemon running" in r.stderr


def test_flags_come_from_the_environment(daemon):
    r = queick("stats", "--json", env={"QUEICKD_PORT": str(daemon.port)})
    assert r.returncode == 0 and json.loads(r.stdout)["workers"]["total"] == 4


@pytest.mark.parametrize("args,message", [
    (["--app-dir", "/no/such/dir"], "app directory"),
    (["--store", "redis://localhost"], "unknown store URL"),
    (["--workers", "-1"], "workers"),
])
def test_configuration_errors_exit_with_ex_config(args, message, tmp_path):
    r = queick("run", "--port", "0", "--store", f"sqlite:///{tmp_path / 'q.db'}", *args, timeout=30)
    assert r.returncode == EX_CONFIG and message in r.stderr


@pytest.mark.parametrize("env,message", [
    ({"QUEICKD_TOKEN_FILE": "/no/such/token"}, "cannot read token file /no/such/token"),
    ({"QUEICKD_WORKERS": "four"}, "QUEICKD_WORKERS='four'"),
    ({"QUEICKD_LOG_LEVEL": "loud"}, "Unknown level"),
    ({"QUEICKD_BIND": "no-such-host.invalid"}, "cannot resolve the address to listen on"),
], ids=["missing-token-file", "bad-env-value", "bad-env-log-level", "unresolvable-bind"])
def test_start_up_configuration_errors_from_the_environment_exit_with_ex_config(env, message, tmp_path):
    r = queick("run", "--port", "0", "--store", f"sqlite:///{tmp_path / 'q.db'}", env=env, timeout=30)
    assert r.returncode == EX_CONFIG and message in r.stderr and "Traceback" not in r.stderr


def test_no_subcommand_runs_the_daemon(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "queickd", "--port", "0", "--store",
                             f"sqlite:///{tmp_path / 'q.db'}", "--app-dir", str(JOBS_DIR)],
                            stderr=subprocess.PIPE, text=True)
    try:
        assert "listening on" in proc.stderr.readline()
        proc.terminate()
        assert proc.wait(30) == 0
    finally:
        proc.kill()


def test_the_daemon_tells_systemd_it_is_ready_and_stopping(tmp_path):
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(20)
    d = DaemonProcess(f"sqlite:///{tmp_path / 'q.db'}", env={"NOTIFY_SOCKET": path}).start()
    try:
        assert sock.recv(100) == b"READY=1"
        d.proc.terminate()
        assert sock.recv(100) == b"STOPPING=1"
        assert d.proc.wait(30) == 0
    finally:
        d.close()
        sock.close()


def test_logs_carry_syslog_priorities_under_journald(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "queickd", "run", "--port", "0", "--store",
                             f"sqlite:///{tmp_path / 'q.db'}", "--app-dir", str(JOBS_DIR)],
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "JOURNAL_STREAM": "8:1"})
    try:
        line = proc.stderr.readline()
        assert line.startswith("<6>queickd.daemon: queickd ") and "listening on" in line
    finally:
        proc.kill()
        proc.wait(10)


def test_output_piped_into_a_closed_reader_ends_quietly(daemon):
    with daemon.client() as q:  # ~100 KiB of listing: more than a pipe buffer holds
        q.enqueue_many([q.job("testjobs:noop", delay=3600) for _ in range(1500)])
    p = subprocess.Popen([sys.executable, "-m", "queickd", "jobs", "--limit", "1500", "--port",
                          str(daemon.port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.readline()
    p.stdout.close()  # like `| head -1`
    assert p.wait(30) == 0 and "Broken pipe" not in p.stderr.read()


_TGKILL = {"x86_64": 234, "aarch64": 131, "armv7l": 268, "armv6l": 268}.get(os.uname().machine)


@pytest.mark.skipif(sys.platform != "linux" or _TGKILL is None, reason="needs Linux tgkill on a known CPU")
def test_sigterm_delivered_to_a_worker_thread_still_stops_the_daemon(tmp_path):
    import ctypes

    d = DaemonProcess(f"sqlite:///{tmp_path / 'q.db'}").start()
    try:
        pid = d.proc.pid
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)
        assert tids, "the daemon has threads besides the main one"
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.syscall(_TGKILL, pid, tids[0], 15) == 0  # SIGTERM to a non-main thread
        assert d.proc.wait(30) == 0
    finally:
        d.close()
