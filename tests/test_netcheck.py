"""The network checker under the privileges a hardened unit gives it: an ICMP echo with no
`ping` program, a probe that cannot run said so (not "network down"), and a supervisor that
outlives a checker that cannot even start or that hangs (SIGSTOP stands in for a wedge)."""

from __future__ import annotations

import logging
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from helpers import DaemonProcess, Listener, let_others_reach_the_checkout

from queickd.services.netcheck import NetworkMonitor

ROOT = Path(__file__).resolve().parent.parent
NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--no-new-privs", "env",
          f"PYTHONPATH={ROOT}"]  # this checkout: nobody's interpreter has no install of queickd
CHECKER = ["-m", "queickd.services.netcheck", "icmp://127.0.0.1", "--interval", "0.2"]


def _python_for_nobody() -> str | None:
    """An interpreter (3.11+) the unprivileged user may run, or None."""
    if shutil.which("setpriv") is None:
        return None
    let_others_reach_the_checkout()
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


def _lines_of(proc: subprocess.Popen, n: int, timeout: float) -> list[str]:
    """The first `n` lines `proc` prints, or as many as came within `timeout` seconds."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.strip()) for line in proc.stdout], daemon=True).start()
    got, deadline = [], time.monotonic() + timeout
    while len(got) < n:
        try:
            got.append(lines.get(timeout=max(0.0, deadline - time.monotonic())))
        except queue.Empty:
            break
    return got


def _checker(net: Listener, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "queickd.services.netcheck", f"127.0.0.1:{net.port}", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd="/",
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_the_checker_repeats_an_unchanged_state_at_each_heartbeat():
    net = Listener()
    proc = _checker(net, "--interval", "0.1", "--heartbeat", "0.1")
    try:
        assert _lines_of(proc, 3, timeout=20) == ["up", "up", "up"]  # not only the first transition
    finally:
        proc.kill()
        proc.wait(10)
        net.close()


def test_the_checker_reports_a_change_at_once_and_is_quiet_between_heartbeats():
    net = Listener()
    proc = _checker(net, "--interval", "0.1", "--heartbeat", "3600")
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.strip()) for line in proc.stdout], daemon=True).start()
    try:
        assert lines.get(timeout=20) == "up"
        # Ten probes or so: none is printed while nothing changes (the daemon is not woken).
        with pytest.raises(queue.Empty):
            lines.get(timeout=1.0)
        net.close()
        assert lines.get(timeout=20) == "down"  # a change does not wait for a heartbeat
    finally:
        proc.kill()
        proc.wait(10)
        net.close()


class _Monitored:
    """A NetworkMonitor on a real checker probing `net`, and events for what it says."""

    def __init__(self, net: Listener, **kw) -> None:
        self.up, self.down = threading.Event(), threading.Event()
        self.monitor = NetworkMonitor(f"127.0.0.1:{net.port}", 0.1, self._changed, **{"heartbeat": 0.1, **kw})

    def _changed(self, up: bool) -> None:
        (self.up if up else self.down).set()


@pytest.fixture
def watch_log():
    """watch_log(text) -> an event set once the netcheck logger emits `text`."""
    handlers = []
    logger = logging.getLogger("queickd.netcheck")
    level = logger.level
    logger.setLevel(logging.INFO)  # "started" is said at INFO

    def watch(text: str) -> threading.Event:
        handlers.append(seen := _Seen(text))
        logger.addHandler(seen)
        return seen.event
    yield watch
    for h in handlers:
        logger.removeHandler(h)
    logger.setLevel(level)


@pytest.fixture
def hung(watch_log):
    """A monitor whose checker reported "up", then hung; the monitor has noticed, and waits
    long before starting a new one."""
    net = Listener()
    m = _Monitored(net, hung_after=1.0, backoff=(60,))
    noticed = watch_log("hung; killed it")
    try:
        m.monitor.start()
        assert m.up.wait(20), m.monitor.snapshot()
        pid = m.monitor.pid
        os.kill(pid, signal.SIGSTOP)
        assert noticed.wait(20), m.monitor.snapshot()
        yield m.monitor
    finally:
        m.monitor.stop()
        net.close()


def test_a_hung_checker_is_killed_reaped_and_restarted(watch_log):
    net = Listener()
    m = _Monitored(net, hung_after=1.0, backoff=(0.1,))
    try:
        m.monitor.start()
        assert m.up.wait(20), m.monitor.snapshot()
        pid = m.monitor.pid
        restarted = watch_log("network checker started")
        os.kill(pid, signal.SIGSTOP)
        assert restarted.wait(20), m.monitor.snapshot()
        with pytest.raises(ChildProcessError):  # killed and reaped: no longer anyone's child
            os.waitpid(pid, os.WNOHANG)
        snap = m.monitor.snapshot()
        assert snap["checker_pid"] != pid and snap["restarts"] == 1
    finally:
        m.monitor.stop()
        net.close()


def test_a_hung_checker_is_not_reported_alive(hung):
    assert hung.snapshot()["checker_alive"] is False


def test_the_network_state_is_unknown_while_a_hung_checker_is_replaced(hung):
    assert hung.up is None and hung.snapshot()["state"] == "unknown"


class _Ticks:
    """A wall clock that counts its readings: the monitor reads it at every report."""

    def __init__(self) -> None:
        self.n, self.cond = 0, threading.Condition()

    def __call__(self) -> float:
        with self.cond:
            self.n += 1
            self.cond.notify_all()
            return float(self.n)

    def wait_for(self, n: int, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.n >= n, timeout)


def test_a_checker_whose_probes_take_their_whole_timeout_is_kept():
    # A listener whose accept queue is full drops new connections: every probe times out.
    full = socket.create_server(("127.0.0.1", 0), backlog=0)
    filler = socket.create_connection(full.getsockname())
    ticks = _Ticks()
    monitor = NetworkMonitor("{}:{}".format(*full.getsockname()), 0.5, lambda up: None, clock=ticks, heartbeat=0.5)
    try:
        monitor.start()
        assert ticks.wait_for(1, 20)  # the first report
        pid, first = monitor.pid, time.monotonic()
        assert ticks.wait_for(8, 30), monitor.snapshot()  # reports for longer than hung_after
        assert time.monotonic() - first > monitor.hung_after
        snap = monitor.snapshot()
        assert (snap["state"], snap["checker_alive"], snap["checker_pid"], snap["restarts"]) == \
            ("down", True, pid, 0)
    finally:
        monitor.stop()
        filler.close()
        full.close()
