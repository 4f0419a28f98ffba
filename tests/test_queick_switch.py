"""Switching from Queick 1.2.1 unchanged: its command line works (`-debug`, `--ping-host`
with `--ping-port`, `--log-filepath`), and an app directory holding a module named like a
standard one (Queick's README puts a test.py beside jobfunc.py) starts; only a job naming
that module is refused."""

from __future__ import annotations

import subprocess
import sys

import pytest

from queickd.cli.parser import parse_args
from queickd.core.protocol import Code, QueueError


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_module_shadowing_the_stdlib_is_refused_only_when_named(start_daemon, tmp_path, isolation):
    app = tmp_path / "app"
    app.mkdir()
    # json: one queickd itself imports, in the daemon and in a process job's zygote
    (app / "json.py").write_text("def f():\n    return 'the app json'\n")
    (app / "jobfunc.py").write_text("import json\n\n\ndef function(a):\n    return [a, hasattr(json, 'dumps')]\n")
    d = start_daemon(None, "--app-dir", str(app), "--isolation", isolation)
    d.wait_for_line(r"cannot run as jobs .*json: the standard library's json")
    with d.client() as q:
        with pytest.raises(QueueError) as info:
            q.enqueue("json:f")
        assert info.value.code == Code.NOT_ALLOWED
        assert "the app directory's json is named like the standard library's json" in info.value.message
        # The app's jobs import the real json, as the daemon does.
        assert q.wait(q.enqueue("jobfunc:function", ["x"]), 20)["result"] == ["x", True]


def test_queick_flags_are_accepted():
    a = parse_args(["-debug", "--ping-host", "example.org", "--ping-port", "8080", "--log-filepath", "/tmp/q.log"])
    assert (a.command, a.log_level, a.ping_host, a.log_filepath) == ("run", "debug", "example.org:8080", "/tmp/q.log")
    assert parse_args(["--ping-host", "::1", "--ping-port", "81"]).ping_host == "[::1]:81"
    assert parse_args(["--ping-port", "80"]).ping_host is None  # alone it does nothing, as in Queick
    assert parse_args([]).log_level == "info"


@pytest.mark.parametrize("target", ["example.org:80", "icmp://example.org"])
def test_a_ping_port_given_twice_is_a_usage_error(target):
    r = subprocess.run([sys.executable, "-m", "queickd", "--ping-host", target, "--ping-port", "8080"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--ping-port 8080" in r.stderr


def test_a_daemon_started_with_queicks_flags_logs_debug_lines_to_the_file(start_daemon, tmp_path):
    logfile = tmp_path / "queick.log"
    d = start_daemon(None, "-debug", "--log-level", "info", "--log-filepath", str(logfile))
    with d.client() as q:
        q.wait(q.enqueue("testjobs:noop"), 20)
    d.terminate()
    text = logfile.read_text()
    assert "listening on" in text and " DEBUG " in text  # -debug wins over --log-level info


def test_an_unwritable_log_filepath_is_a_configuration_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "queickd", "--store", "memory://", "--port", "0",
                        "--log-filepath", str(tmp_path / "no" / "such" / "dir.log")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 78 and "--log-filepath" in r.stderr
