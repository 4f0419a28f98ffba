"""The network checker under the privileges a hardened unit gives it: an ICMP echo with no
`ping` program, a probe that cannot run said so (not "network down"), and a supervisor that
outlives a checker that cannot even start."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from helpers import DaemonProcess

from queickd.services.netcheck import NetworkMonitor

ROOT = Path(__file__).resolve().parent.parent
NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--no-new-privs"]
CHECKER = ["-m", "queickd.services.netcheck", "icmp://127.0.0.1", "--interval", "0.2"]


def _python_for_nobody() -> str | None:
    """An interpreter (3.11+) the unprivileged user may run, or None."""
    if shutil.which("setpriv") is None:
        return None
    for python in (sys.executable, "/usr/bin/python3"):
        r = subprocess.run([*NOBODY, python, "-c", "import sys; assert sys.version_info >= (3, 11)"],
                           capture_output=True, cwd="/")
        if r.returncode == 0:
            return python
    return None


def _nobody_outside_ping_group_range() -> bool:
    low, high = map(int, Path("/proc/sys/net/ipv4/ping_group_range").read_text().split())
    return not low <= 65534 <= high


def _first_report(cmd: list[str], root: Path = ROOT) -> tuple[str, int]:
    """The checker's first stdout line and how it ended (killed after that line if it runs on)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd="/",
                            env={**os.environ, "PYTHONPATH": str(root)})
    try:
        line = proc.stdout.readline().strip()  # type: ignore[union-attr]
    finally:
        proc.kill()
        code = proc.wait(10)
    return line, code


@pytest.fixture(scope="module")
def nobody_root():
    """Where the user nobody can import queickd from: the checkout, or (a checkout in a
    private directory, as a fresh clone under mktemp is) a world-readable copy of the package."""
    python = _python_for_nobody()
    if python is None:
        pytest.skip("needs setpriv and a Python 3.11+ the user nobody may run")
    if subprocess.run([*NOBODY, "test", "-r", str(ROOT / "queickd" / "__init__.py")]).returncode == 0:
        yield ROOT
        return
    copy = Path(tempfile.mkdtemp(prefix="queickd-for-nobody-"))
    try:
        shutil.copytree(ROOT / "queickd", copy / "queickd", ignore=shutil.ignore_patterns("__pycache__"))
        for d in [copy, *copy.rglob("*")]:
            d.chmod(0o755 if d.is_dir() else 0o644)
        yield copy
    finally:
        shutil.rmtree(copy, ignore_errors=True)


@pytest.fixture
def nobody_python():
    python = _python_for_nobody()
    if python is None:
        pytest.skip("needs setpriv and a Python 3.11+ the user nobody may run")
    return python


def test_an_icmp_probe_without_socket_permission_reports_it_cannot_run(nobody_python, nobody_root):
    if not _nobody_outside_ping_group_range():
        pytest.skip("net.ipv4.ping_group_range admits nobody here: the probe can run")
    line, _ = _first_report([*NOBODY, nobody_python, *CHECKER], nobody_root)
    assert line.startswith("error probe cannot run: ") and "ping_group_range" in line and "CAP_NET_RAW" in line


def test_an_icmp_probe_runs_unprivileged_where_ping_group_range_admits_the_group(nobody_python, nobody_root):
    # A network namespace of its own: its ping_group_range can be opened without touching the host's.
    setup = "ip link set lo up && echo '0 2147483647' > /proc/sys/net/ipv4/ping_group_range"
    probe = subprocess.run(["unshare", "--net", "sh", "-c", setup], capture_output=True)
    if probe.returncode != 0 or shutil.which("ip") is None:
        pytest.skip(f"cannot make a network namespace here: {probe.stderr.decode().strip()}")
    cmd = ["unshare", "--net", "sh", "-c", f'{setup} && exec "$@"', "sh", *NOBODY, nobody_python, *CHECKER]
    assert _first_report(cmd, nobody_root)[0] == "up"


def test_a_daemon_whose_icmp_probe_cannot_run_says_so_in_stats_and_its_log(tmp_path):
    if shutil.which("setpriv") is None or os.geteuid() != 0:
        pytest.skip("needs setpriv and root, to take CAP_NET_RAW away from a daemon")
    low, high = map(int, Path("/proc/sys/net/ipv4/ping_group_range").read_text().split())
    if low <= os.getgid() <= high:
        pytest.skip("net.ipv4.ping_group_range admits this group: the probe can run")
    no_raw = ["setpriv", "--bounding-set=-net_raw", "--inh-caps=-net_raw"]
    d = DaemonProcess(f"sqlite:///{tmp_path / 'q.db'}", "--ping-host", "icmp://127.0.0.1",
                      "--ping-interval", "0.2", prefix=no_raw).start()
    try:
        d.wait_for_line(r"network checker \(pid \d+\): probe cannot run")  # the supervisor has read it
        with d.client() as q:
            net = q.stats()["network"]
        assert net["error"].startswith("probe cannot run: ") and net["state"] == "unknown"
    finally:
        d.close()


class _Seen(logging.Handler):
    """Sets an event when a log message containing `text` is emitted."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.event = text, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


def test_the_supervisor_keeps_restarting_a_checker_that_cannot_start(tmp_path):
    target = socket.create_server(("127.0.0.1", 0))
    checker = tmp_path / "checker"
    checker.write_text(f"#!/bin/sh\nexec {sys.executable} -m queickd.services.netcheck \"$@\"\n")
    checker.chmod(0o644)  # not executable: Popen raises PermissionError
    seen = _Seen("cannot start")
    logging.getLogger("queickd.netcheck").addHandler(seen)
    up = threading.Event()
    monitor = NetworkMonitor(f"127.0.0.1:{target.getsockname()[1]}", 0.2, lambda is_up: is_up and up.set(),
                             command=[str(checker)])
    try:
        monitor.start()
        assert seen.event.wait(20)
        assert "PermissionError" in monitor.snapshot()["error"]
        checker.chmod(0o755)
        assert up.wait(30), monitor.snapshot()
        snap = monitor.snapshot()
        assert snap["restarts"] >= 1 and snap["checker_alive"] and snap["error"] is None
    finally:
        monitor.stop()
        logging.getLogger("queickd.netcheck").removeHandler(seen)
        target.close()
