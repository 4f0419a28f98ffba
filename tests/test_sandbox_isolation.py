"""What a process job can reach of the daemon (issue: a sandboxed job took everything the
daemon's user owns). Each attack is a job in tests/jobs/sandboxjobs.py run through a real
daemon; where the kernel or this test's privileges do not allow a mechanism, the test
skips and says why."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from queickd.core.job import State

SETPRIV = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def _python_for_nobody() -> str | None:
    """An interpreter (3.11+) the user nobody may run and import queickd with, or None."""
    for python in (sys.executable, "/usr/bin/python3"):
        r = subprocess.run([*SETPRIV, "sh", "-c", f'exec {python} "$@"', "sh", "-c",
                            "import sys, queickd; assert sys.version_info >= (3, 11)"], capture_output=True, cwd="/")
        if r.returncode == 0:
            return python
    return None


@pytest.fixture
def nobody():
    """(a store URL in a directory the user nobody owns, the prefix that starts a daemon as
    nobody on an interpreter it may run)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv, to start a daemon as the user nobody")
    python = _python_for_nobody()
    if python is None:
        pytest.skip("no Python 3.11+ here that the user nobody may run and import queickd with")
    path = tempfile.mkdtemp(prefix="queickd-nobody-")
    os.chown(path, 65534, 65534)
    # DaemonProcess runs sys.executable: the shell puts the interpreter nobody may run in its place.
    yield f"sqlite:///{path}/q.db", [*SETPRIV, "sh", "-c", f'shift; exec {python} "$@"', "sh"]
    shutil.rmtree(path, ignore_errors=True)


def test_a_process_job_of_the_daemons_user_cannot_read_the_daemons_or_the_zygotes_memory(
        start_daemon, nobody):
    d = start_daemon(nobody[0], prefix=nobody[1])
    with d.client() as q:
        job = q.wait(q.enqueue("sandboxjobs:peek", [[d.proc.pid]], isolation="process"), 30)
    assert job["state"] == State.SUCCEEDED, job
    got = job["result"]
    for who in ("zygote", f"pid {d.proc.pid}"):
        assert got[f"{who} environ"] == got[f"{who} mem"] == "PermissionError", got
        assert got[f"{who} environ by cat"] == "refused", got  # a program the job runs: no better


def test_the_start_log_says_which_sandbox_mechanisms_are_in_force(start_daemon):
    d = start_daemon(None, "--isolation", "process")
    line = d.wait_for_line(r"INFO queickd.sandbox: sandbox: (.*)").group(1)
    assert "non-dumpable daemon yes" in line and "cgroup memory " in line
