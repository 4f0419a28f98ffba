"""What an operator sees at the edges: error messages that would break a table apart, the
command pointed at something that is not queickd, numbers that are not numbers, and config
file values of the wrong type."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

import pytest

from queickd.cli import parse_args
from queickd.config import ConfigFileError


def queick(port, *args, timeout=60):
    return subprocess.run([sys.executable, "-m", "queickd", *args, "--port", str(port)],
                          capture_output=True, text=True, timeout=timeout)


def test_a_multi_line_or_very_long_error_keeps_to_its_row_in_jobs_dead_and_status(daemon):
    with daemon.client() as q:
        multi = q.enqueue("testjobs:fail", kwargs={"message": "first line\nsecond line\nthird line"})
        long = q.enqueue("testjobs:fail", kwargs={"message": "x" * 5000})
        for job_id in (multi, long):
            assert q.wait(job_id, 30)["state"] == "dead"
    for command in ("jobs", "dead"):
        out = queick(daemon.port, command).stdout.splitlines()
        rows = {line.split()[0]: line for line in out[1:]}
        assert set(rows) == {str(multi), str(long)}, out  # one row per job, no stray lines
        assert "first line ⏎ second line ⏎ third line" in rows[str(multi)]
        assert len(rows[str(long)]) < 500  # the whole message is 'queick show ID''s
    status = queick(daemon.port, "status").stdout.splitlines()
    dead = status[status.index(next(line for line in status if line.strip().startswith("DEAD"))) + 1:]
    assert [line.split()[0] for line in dead] == [str(long), str(multi)], status
    full = queick(daemon.port, "show", str(long)).stdout
    assert "x" * 5000 in full


def test_a_port_that_is_not_queickds_says_so_instead_of_a_json_error(start_daemon):
    d = start_daemon(None, "--http", "127.0.0.1:0")
    http_port = d.wait_for_line(r"HTTP endpoint http://(\S+):(\d+)/").group(2)
    r = queick(http_port, "jobs")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "does not speak queickd's protocol" in r.stderr and "Expecting value" not in r.stderr, r.stderr


def test_a_port_that_answers_json_that_is_not_an_object_says_so_instead_of_a_traceback():
    with socket.create_server(("127.0.0.1", 0)) as srv:
        def answer():
            conn, _ = srv.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b"[1, 2]\n")
        t = threading.Thread(target=answer, daemon=True)
        t.start()
        r = queick(srv.getsockname()[1], "jobs")
        t.join(10)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "does not speak queickd's protocol" in r.stderr, r.stderr


def test_a_token_file_that_cannot_be_read_is_named_as_the_token_file(daemon, tmp_path):
    r = queick(daemon.port, "jobs", "--token-file", str(tmp_path / "missing"))
    assert r.returncode == 1
    assert f"cannot read token file {tmp_path / 'missing'}: No such file or directory" in r.stderr, r.stderr


@pytest.mark.parametrize("args", [
    ["enqueue", "testjobs:noop", "--delay", "inf"],
    ["enqueue", "testjobs:noop", "--cost-units", "nan"],
    ["purge", "--dead", "--older-than", "nan"],
    ["drain", "--timeout", "nan"],
])
def test_nan_or_infinity_on_a_client_command_is_a_usage_error(daemon, args):
    r = queick(daemon.port, *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "is not a" in r.stderr and "not JSON" not in r.stderr and "still busy" not in r.stdout


@pytest.mark.parametrize("how", ["flag", "env", "file"])
def test_nan_or_infinity_as_a_daemon_setting_is_refused(tmp_path, how):
    args, env = [sys.executable, "-m", "queickd", "run", "--store", "memory://", "--port", "0"], {}
    if how == "flag":
        args += ["--sweep", "nan"]
    elif how == "env":
        env["QUEICKD_STOP_TIMEOUT"] = "inf"
    else:
        (tmp_path / "q.toml").write_text("sweep = nan\n")
        args += ["--config", str(tmp_path / "q.toml")]
    r = subprocess.run(args, capture_output=True, text=True, timeout=20, env={**os.environ, **env})
    assert r.returncode == (2 if how == "flag" else 78), r.stderr
    assert "is not a number" in r.stderr


@pytest.mark.parametrize("text, message", [
    ("store = 5\n", "store must be a string, not 5"),
    ("pool = [1, 2]\n", "pool must be a string or a list of strings"),
    ("allow = [[\"a\"]]\n", "allow must be a string or a list of strings"),
    ("bind = true\n", "bind must be a string, not True"),
    ("workers = [1]\n", "workers must be one value, not a list"),
    ("help = true\n", "unknown setting 'help'"),
])
def test_a_config_value_of_the_wrong_type_is_refused_naming_file_and_key(tmp_path, text, message):
    path = tmp_path / "queickd.toml"
    path.write_text(text)
    with pytest.raises(ConfigFileError, match=f"^{path}: {message}".replace("[", r"\[")):
        parse_args(["--config", str(path)])


def test_a_workers_bad_budget_patience_in_its_config_file_is_a_configuration_error(tmp_path):
    path = tmp_path / "queickd.toml"
    path.write_text('budget-patience = "soon"\n')
    r = subprocess.run([sys.executable, "-m", "queickd", "worker", "--store", "postgresql://nobody@127.0.0.1:1/x",
                        "--config", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 78 and "Traceback" not in r.stderr, r.stderr
    assert f"{path}: budget_patience: 'soon' is not a duration" in r.stderr


def test_a_pause_by_hand_reads_by_hand_and_status_says_what_holds_each_key(daemon):
    assert queick(daemon.port, "pause", "frozen").returncode == 0
    assert queick(daemon.port, "pause", "--func", "testjobs:add").returncode == 0
    with daemon.client() as q:
        q.enqueue("testjobs:noop", key="frozen")
        q.enqueue("testjobs:add", [1, 2], key="behind")
    status = queick(daemon.port, "status").stdout
    jobs = queick(daemon.port, "jobs").stdout
    for text in (status, jobs):
        assert "None: None" not in text and "after 0 failures" not in text, text
        assert "PAUSED key frozen" in text and "by hand" in text
    rows = {line.split()[0]: line for line in status.splitlines() if line.startswith(("frozen", "behind"))}
    assert "HELD: the key is paused" in rows["frozen"], status
    assert "HELD: blocked: its next job's function testjobs:add is paused" in rows["behind"], status


def test_the_waiting_peak_is_never_below_the_number_waiting_now():
    from queickd.ui import statusview

    s = {"now": 1000.0, "version": "x", "uptime": 5, "store": "memory://", "draining": False,
         "workers": {"busy": 0, "total": 1}, "scheduler": {"alive": True, "last_fired_at": None},
         "counts": {"scheduled": 0, "queued": 7, "waiting_network": 0, "running": 0, "dead": 0},
         "events": {"pending": 0, "dead": 0}, "enqueued": 7, "completed": 0, "failed": 0, "refused": 0,
         "history": [{"t": 960.0, "enqueued": 7, "completed": 0, "failed": 0, "depth": 2}],
         "waiting_by_key": [], "paused": []}
    line = next(x for x in statusview.lines(s) if x.startswith("waiting "))
    assert line.endswith("now 7, peak 7"), line


def test_pool_set_of_a_job_or_cron_that_is_not_there_fails_and_says_why(daemon):
    with daemon.client() as q:
        waiting = q.enqueue("testjobs:noop", delay=3600)
    r = queick(daemon.port, "pool", "set", "--job", "99999", "gpu")
    assert r.returncode == 1 and "job 99999 is not waiting" in r.stderr, (r.stdout, r.stderr)
    r = queick(daemon.port, "pool", "set", "--cron", "nope", "gpu")
    assert r.returncode == 1 and "no cron named 'nope'" in r.stderr, (r.stdout, r.stderr)
    r = queick(daemon.port, "pool", "set", "--job", str(waiting), "gpu")
    assert r.returncode == 0 and r.stdout.strip() == "1 moved to pool gpu"
    assert queick(daemon.port, "pool", "set", "idle-key", "gpu").returncode == 0  # a key may have none


def test_workflows_with_no_runs_says_so(daemon):
    r = queick(daemon.port, "workflows")
    assert (r.returncode, r.stdout.strip()) == (0, "no workflow runs")
    assert queick(daemon.port, "workflows", "--state", "failed").stdout.strip() == "no failed workflow runs"
    assert queick(daemon.port, "workflows", "--json").stdout.strip() == "[]"


@pytest.mark.parametrize("action, done", [("check", "checked"), ("recover", "recovered")])
def test_db_check_and_recover_of_a_store_that_is_not_sqlite_say_what_they_do(action, done, tmp_path):
    args = [sys.executable, "-m", "queickd", "db", action, "--store", "memory://"]
    if action == "recover":
        args += ["--to", str(tmp_path / "new.db")]
    r = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert f"only an SQLite store (sqlite:///path) is {done} this way, not 'memory://'" in r.stderr, r.stderr
    assert "pg_dump" not in r.stderr
