"""The network checker: a separate process that probes reachability, and its supervisor.

The checker (`python -m queickd.netcheck TARGET`) probes every `interval` seconds, a TCP
connect to HOST:PORT (port 80 by default) or, for `icmp://HOST`, one echo through the
system `ping`. It prints `up` or `down` on its stdout once at start and then on every
transition; that pipe is the local channel to the daemon. It exits when its parent dies.

NetworkMonitor (in the daemon) starts the checker, reads its reports on a thread, restarts
it when it dies (logged, with backoff), and calls on_change(up) on every transition. The
state is None ("unknown") until the checker has spoken once, so the daemon never assumes
the network is up.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("queickd.netcheck")

DEFAULT_PORT = 80
DEFAULT_INTERVAL = 1.0
_RESTART_BACKOFF = (0.5, 1, 2, 5, 10, 30)


def parse_target(target: str) -> tuple[str, str, int | None]:
    """'host[:port]' → ('tcp', host, port); 'icmp://host' → ('icmp', host, None)."""
    if target.startswith("icmp://"):
        host = target[len("icmp://"):].strip("/")
        if not host:
            raise ValueError("icmp:// needs a host")
        return "icmp", host, None
    if target.startswith("tcp://"):
        target = target[len("tcp://"):]
    host, port = target, DEFAULT_PORT
    if target.startswith("["):  # [v6::addr]:port
        host, _, rest = target[1:].partition("]")
        if rest.startswith(":"):
            port = int(rest[1:])
    elif target.count(":") == 1:
        host, _, p = target.partition(":")
        port = int(p)
    if not host or not 0 < port < 65536:
        raise ValueError(f"bad ping target {target!r}: use HOST[:PORT] or icmp://HOST")
    return "tcp", host, port


def probe(kind: str, host: str, port: int | None, timeout: float) -> bool:
    if kind == "tcp":
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return True
        except OSError:
            return False
    wait = str(max(1, round(timeout)))
    r = subprocess.run(["ping", "-c", "1", "-W", wait, host], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=timeout + 5)
    return r.returncode == 0


def checker_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m queickd.netcheck",
                                description="Probe reachability; print up/down on transitions.")
    p.add_argument("target", help="HOST[:PORT] (TCP connect, port 80 by default) or icmp://HOST")
    p.add_argument("--interval", type=float, default=DEFAULT_INTERVAL, help="seconds between probes")
    a = p.parse_args(argv)
    try:
        kind, host, port = parse_target(a.target)
    except ValueError as e:
        print(f"netcheck: {e}", file=sys.stderr)
        return 2
    if kind == "icmp" and shutil.which("ping") is None:
        print("netcheck: icmp:// needs the system 'ping' command", file=sys.stderr)
        return 2
    parent = os.getppid()
    last: bool | None = None
    timeout = max(0.2, min(a.interval, 5.0))
    while os.getppid() == parent:  # reparented: the daemon is gone, so are we
        started = time.monotonic()
        up = probe(kind, host, port, timeout)
        if up != last:
            try:
                sys.stdout.write("up\n" if up else "down\n")
                sys.stdout.flush()
            except BrokenPipeError:
                return 0
            last = up
        time.sleep(max(0.0, a.interval - (time.monotonic() - started)))
    return 0


class NetworkMonitor:
    """Supervises the checker process; the daemon's view of the network. Thread-safe reads."""

    def __init__(self, target: str, interval: float, on_change: Callable[[bool], None],
                 clock: Callable[[], float] = time.time) -> None:
        parse_target(target)  # fail at start-up, not in the child
        self.target = target
        self.interval = interval
        self._on_change = on_change
        self._clock = clock
        self.up: bool | None = None  # None until the checker has spoken
        self.since: float | None = None  # wall time of the last transition
        self.restarts = 0
        self.last_report_at: float | None = None
        self._proc: subprocess.Popen | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._supervise, name="queickd-netcheck", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Idempotent; safe before start()."""
        self._stopping.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self._thread is not None:
            self._thread.join(5)

    def snapshot(self) -> dict[str, Any]:
        state = "unknown" if self.up is None else "up" if self.up else "down"
        return {"target": self.target, "checker_alive": self.alive, "checker_pid": self.pid,
                "state": state, "since": self.since, "down_since": self.since if self.up is False else None,
                "restarts": self.restarts, "last_report_at": self.last_report_at}

    def _spawn(self) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "queickd.services.netcheck", self.target, "--interval", str(self.interval)],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, bufsize=1,
        )

    def _supervise(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            self._proc = proc = self._spawn()
            log.info("network checker started (pid %d, probing %s every %g s)", proc.pid,
                     self.target, self.interval)
            spoke = False
            for line in proc.stdout:  # type: ignore[union-attr]
                spoke = True
                self._report(line.strip() == "up")
            code = proc.wait()
            if self._stopping.is_set():
                return
            self.restarts += 1
            failures = 0 if spoke else failures + 1
            delay = _RESTART_BACKOFF[min(failures, len(_RESTART_BACKOFF) - 1)]
            log.warning("network checker (pid %d) exited with %s; restarting in %g s",
                        proc.pid, code, delay)
            if self._stopping.wait(delay):
                return

    def _report(self, up: bool) -> None:
        self.last_report_at = self._clock()
        if up == self.up:
            return  # a restarted checker repeats the state we already know
        was, self.up, self.since = self.up, up, self._clock()
        log.info("network is %s (was %s)", "up" if up else "down",
                 "unknown" if was is None else "up" if was else "down")
        try:
            self._on_change(up)
        except Exception:  # the daemon's sweep applies the state again; keep supervising
            log.exception("error while acting on the network change")


if __name__ == "__main__":
    sys.exit(checker_main())
