"""The network checker: a separate process that probes reachability, and its supervisor.

The checker (`python -m queickd.services.netcheck TARGET`) probes every `interval` seconds:
a TCP connect to HOST:PORT (port 80 by default), or for `icmp://HOST` one ICMP echo sent
from Python itself, over an unprivileged ICMP datagram socket where
`net.ipv4.ping_group_range` admits the process's group, else over a raw socket
(CAP_NET_RAW); not the `ping` program, whose file capability `NoNewPrivileges=yes`
disables. It prints `up` or `down` on its stdout at each change, and again after
`heartbeat` seconds without one, so the daemon's reader wakes rarely on a steady network.
A probe that cannot run at all is not "down": it prints `error probe cannot run: WHY` and
exits with status 3. It exits when its parent dies.

NetworkMonitor (in the daemon) runs the checker and restarts it, with backoff, when it
dies, cannot start, or hangs (silent past `hung_after`: its last word is stale, so the
state becomes unknown); it keeps the last error for `stats` and calls on_change(up) at each
transition. The state is None ("unknown") until a checker has spoken, so the daemon never
assumes the network is up. The monitor only reports; it never parks or releases jobs.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..settings import DEFAULT_INTERVAL

log = logging.getLogger("queickd.netcheck")

DEFAULT_PORT = 80
_RESTART_BACKOFF = (0.5, 1, 2, 5, 10, 30)
EX_CANNOT_RUN = 3  # the checker's exit status when its probe cannot run at all
HUNG_INTERVALS = 3  # a checker silent for this many intervals plus a probe's timeout is hung
MIN_HUNG_AFTER = 2.0  # ...but never sooner: a loaded host can stall a healthy process a moment
START_GRACE = 15.0  # extra time for the first report: an interpreter starts slowly on a Pi
HEARTBEAT = 30.0  # seconds: a checker whose state has not changed still reports this often
_ECHO = {socket.AF_INET: (8, 0), socket.AF_INET6: (128, 129)}  # echo request, reply types
_SEQ = itertools.count(1)


class ProbeCannotRunError(Exception):
    """The probe cannot be made at all (a permission, a missing facility): not "network down"."""


def probe_timeout(interval: float) -> float:
    """How long one probe may take: the interval, within [0.2, 5] s."""
    return max(0.2, min(interval, 5.0))


def default_hung_after(interval: float, heartbeat: float = HEARTBEAT) -> float:
    """Silence after which a checker counts as hung. A report is due at most a heartbeat
    after the last, and a probe may then take its timeout: this leaves room for a few slow
    probes."""
    return max(MIN_HUNG_AFTER, heartbeat + HUNG_INTERVALS * interval + probe_timeout(interval))


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
    """One probe: True if HOST answered. Raises ProbeCannotRunError if it cannot be made at all."""
    if kind == "tcp":
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return True
        except OSError:
            return False
    return icmp_echo(host, timeout)


def _icmp_socket(family: int) -> tuple[socket.socket, bool]:
    """An ICMP socket and whether it is raw: the unprivileged datagram kind first."""
    proto = socket.IPPROTO_ICMP if family == socket.AF_INET else socket.IPPROTO_ICMPV6
    errors = []
    for kind in (socket.SOCK_DGRAM, socket.SOCK_RAW):
        try:
            return socket.socket(family, kind, proto), kind == socket.SOCK_RAW
        except OSError as e:
            errors.append(f"{'datagram' if kind == socket.SOCK_DGRAM else 'raw'}: {e.strerror or e}")
    raise ProbeCannotRunError(
        f"no ICMP socket may be opened ({'; '.join(errors)}): let group {os.getgid()} in "
        "net.ipv4.ping_group_range (sysctl) or give the process CAP_NET_RAW "
        "(AmbientCapabilities=CAP_NET_RAW and CapabilityBoundingSet=CAP_NET_RAW in the unit)")


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF


def icmp_echo(host: str, timeout: float) -> bool:
    """Send one ICMP echo request to `host` and wait up to `timeout` s for its reply."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)[0]
    except socket.gaierror:
        return False  # no name resolution is no network, as far as the jobs are concerned
    request, reply = _ECHO[family]
    sock, raw = _icmp_socket(family)
    seq = next(_SEQ) & 0xFFFF
    payload = b"queickd" + os.urandom(8)  # matched on the way back: a raw socket sees all ICMP
    header = struct.pack("!BBHHH", request, 0, 0, os.getpid() & 0xFFFF, seq)
    packet = struct.pack("!BBHHH", request, 0, _checksum(header + payload), os.getpid() & 0xFFFF, seq) + payload
    deadline = time.monotonic() + timeout
    with sock:
        try:
            sock.sendto(packet, addr)
            while (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                data = sock.recv(2048)
                if raw and family == socket.AF_INET:
                    data = data[(data[0] & 0x0F) * 4:]  # a raw IPv4 socket hands over the IP header too
                if len(data) >= 8 and data[0] == reply and data[8:] == payload:
                    return True
        except OSError:  # unreachable, timed out, refused by a firewall: down
            return False
    return False


def checker_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m queickd.services.netcheck",
                                description="Probe reachability; print up or down when it changes, "
                                "and at least every --heartbeat seconds.")
    p.add_argument("target", help="HOST[:PORT] (TCP connect, port 80 by default) or icmp://HOST")
    p.add_argument("--interval", type=float, default=DEFAULT_INTERVAL, help="seconds between probes")
    p.add_argument("--heartbeat", type=float, default=HEARTBEAT,
                   help="seconds after which an unchanged state is printed again (default: %(default)g)")
    a = p.parse_args(argv)
    try:
        kind, host, port = parse_target(a.target)
    except ValueError as e:
        print(f"netcheck: {e}", file=sys.stderr)
        return 2
    parent = os.getppid()
    timeout = probe_timeout(a.interval)
    said: bool | None = None
    said_at = 0.0
    while os.getppid() == parent:  # reparented: the daemon is gone, so are we
        started = time.monotonic()
        try:
            up = probe(kind, host, port, timeout)
        except ProbeCannotRunError as e:
            print(f"netcheck: probe cannot run: {e}", file=sys.stderr)
            try:
                sys.stdout.write(f"error probe cannot run: {e}\n")
                sys.stdout.flush()
            except BrokenPipeError:
                pass
            return EX_CANNOT_RUN
        if up != said or time.monotonic() - said_at >= a.heartbeat:
            try:  # a change, or the heartbeat: the daemon tells a hung checker by its silence
                sys.stdout.write("up\n" if up else "down\n")
                sys.stdout.flush()
            except BrokenPipeError:
                return 0
            said, said_at = up, time.monotonic()
        time.sleep(max(0.0, a.interval - (time.monotonic() - started)))
    return 0


class NetworkMonitor:
    """Supervises the checker process; the daemon's view of the network. Thread-safe reads.

    `heartbeat` (how often an unchanged state is reported), `hung_after` (seconds of
    silence before a checker counts as hung), `start_grace` (extra time for its first
    report) and `backoff` (delays between restarts) are injectable."""

    def __init__(self, target: str, interval: float, on_change: Callable[[bool], None],
                 clock: Callable[[], float] = time.time, command: Sequence[str] | None = None, *,
                 heartbeat: float = HEARTBEAT, hung_after: float | None = None, start_grace: float = START_GRACE,
                 backoff: Sequence[float] = _RESTART_BACKOFF) -> None:
        parse_target(target)  # fail at start-up, not in the child
        self.target = target
        # The checker's program and its first arguments (the target and interval follow).
        self.command = list(command or [sys.executable, "-m", "queickd.services.netcheck"])
        self.interval = interval
        self.heartbeat = heartbeat
        self.hung_after = default_hung_after(interval, heartbeat) if hung_after is None else hung_after
        self.start_grace = start_grace
        self.backoff = tuple(backoff)
        self._on_change = on_change
        self._clock = clock
        self.up: bool | None = None  # None until the checker has spoken, or after it hung
        self.since: float | None = None  # wall time of the last transition
        self.restarts = 0
        self.last_report_at: float | None = None
        self.error: str | None = None  # why the probe cannot run, or the checker cannot start
        self._proc: subprocess.Popen | None = None
        self._deadline = 0.0  # monotonic time by which the running checker must speak again
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        """A running checker that has not been silent past its deadline (a hung one is not)."""
        return (self._proc is not None and self._proc.poll() is None
                and time.monotonic() < self._deadline)

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
                "restarts": self.restarts, "last_report_at": self.last_report_at, "error": self.error}

    def _spawn(self) -> subprocess.Popen:
        return subprocess.Popen(
            [*self.command, self.target, "--interval", str(self.interval), "--heartbeat", str(self.heartbeat)],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, bufsize=0,
        )

    def _supervise(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            spoke = self._run_once()
            if self._stopping.is_set():
                return
            self.restarts += 1
            failures = 0 if spoke else failures + 1
            delay = self.backoff[min(failures, len(self.backoff) - 1)]
            log.warning("network checker stopped; restarting in %g s", delay)
            if self._stopping.wait(delay):
                return

    def _run_once(self) -> bool:
        """Start the checker and read it until it exits, or kill it once it is silent past its
        deadline. True if it reported up or down. Any failure to start it is logged and
        survived: the supervisor must outlive it."""
        try:
            self._deadline = time.monotonic() + self.start_grace + self.hung_after
            self._proc = proc = self._spawn()
        except Exception as e:  # PermissionError, a missing interpreter, no more processes...
            self.error = f"checker cannot start: {type(e).__name__}: {e}"
            log.error("network checker cannot start: %s", e)
            return False
        log.info("network checker started (pid %d, probing %s every %g s)", proc.pid,
                 self.target, self.interval)
        spoke = False
        for line in self._lines(proc):
            if line is None:
                self._hung(proc)
                break
            self._deadline = time.monotonic() + self.hung_after  # any line is a heartbeat
            if line.startswith("error "):
                self.error = line[len("error "):]
                log.error("network checker (pid %d): %s; the network state stays unknown", proc.pid, self.error)
            elif line in ("up", "down"):
                spoke = True
                self.error = None
                self._report(line == "up")
        code = proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        if not self._stopping.is_set():
            log.warning("network checker (pid %d) exited with %s", proc.pid, code)
        return spoke

    def _lines(self, proc: subprocess.Popen) -> Iterator[str | None]:
        """The checker's stdout lines as they come, until EOF; None (and the end) once it
        has been silent past self._deadline, which the caller moves on at every line."""
        fd = proc.stdout.fileno()  # type: ignore[union-attr]
        poller = select.poll()  # not select(): a busy daemon's descriptors may pass 1024
        poller.register(fd, select.POLLIN)
        pending = b""
        while (left := self._deadline - time.monotonic()) > 0:
            if not poller.poll(left * 1000):
                continue  # timed out: the loop condition notices
            chunk = os.read(fd, 4096)
            if not chunk:
                return
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                yield line.decode(errors="replace").strip()
        yield None

    def _hung(self, proc: subprocess.Popen) -> None:
        """The checker is silent past its deadline: whatever it said last is stale, so the
        state is unknown (jobs that need the network wait) until a new checker speaks."""
        if self._stopping.is_set():
            return  # stop() is ending it anyway
        if self.up is not None:
            self.up, self.since = None, self._clock()
        proc.kill()  # SIGKILL works on a stopped or wedged process too; the caller reaps it
        log.warning("network checker (pid %d) silent for over %g s: hung; killed it, the network "
                    "state is unknown until a new checker reports", proc.pid, self.hung_after)

    def _report(self, up: bool) -> None:
        self.last_report_at = self._clock()
        if up == self.up:
            return  # every probe repeats the state we already know
        was, self.up, self.since = self.up, up, self._clock()
        log.info("network is %s (was %s)", "up" if up else "down",
                 "unknown" if was is None else "up" if was else "down")
        try:
            self._on_change(up)
        except Exception:  # the daemon's sweep applies the state again; keep supervising
            log.exception("error while acting on the network change")


if __name__ == "__main__":
    sys.exit(checker_main())
