"""Test helpers: a real daemon in a subprocess, and a gate that holds jobs running."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from queickd import JobQueue

JOBS_DIR = Path(__file__).parent / "jobs"
STARTED: list[DaemonProcess] = []  # every daemon a test started; conftest kills leftovers
_LISTENING = re.compile(r"listening on (\S+):(\d+)")


class DaemonProcess:
    """`python -m queickd run` on a free port with the given store; stderr is collected."""

    def __init__(self, store_url: str, *extra: str, workers: int = 4, env: dict | None = None,
                 prefix: list[str] | None = None) -> None:
        self.store_url = store_url
        self.prefix = prefix or []  # a command the daemon runs under, e.g. setpriv dropping a capability
        self.extra = list(extra)
        self.workers = workers
        self.env = env or {}
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.lines: list[str] = []
        self._lines_q: queue.Queue[str | None] = queue.Queue()

    def start(self, timeout: float = 20.0) -> DaemonProcess:
        cmd = [*self.prefix, sys.executable, "-m", "queickd", "run", "--store", self.store_url, "--port", "0",
               "--app-dir", str(JOBS_DIR), "--workers", str(self.workers), "--log-level", "debug",
               *self.extra]
        env = {**os.environ, **self.env}
        env.pop("JOURNAL_STREAM", None)
        self.lines, self._lines_q = [], queue.Queue()
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     stdin=subprocess.DEVNULL, text=True, env=env)
        STARTED.append(self)
        threading.Thread(target=self._read, args=(self.proc, self._lines_q), daemon=True).start()
        m = self.wait_for_line(_LISTENING, timeout)
        self.port = int(m.group(2))
        return self

    def _read(self, proc: subprocess.Popen, q: queue.Queue) -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            self.lines.append(line)
            q.put(line)
        q.put(None)

    def wait_for_line(self, pattern: re.Pattern | str, timeout: float = 20.0) -> re.Match:
        """Wait until the daemon logs a line matching pattern (lines already read count)."""
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        for line in list(self.lines):
            if m := rx.search(line):
                return m
        while True:
            try:
                line = self._lines_q.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"daemon never logged {rx.pattern!r}:\n{''.join(self.lines)}") from None
            if line is None:
                raise RuntimeError(f"daemon exited before logging {rx.pattern!r}:\n{''.join(self.lines)}")
            if m := rx.search(line):
                return m

    def wait_for_lines(self, pattern: str, count: int, timeout: float = 20.0) -> list[re.Match]:
        """Wait until `count` of the daemon's lines match pattern (lines already read count)."""
        rx, seen, found = re.compile(pattern), 0, []
        deadline = time.monotonic() + timeout
        while True:
            lines = self.lines  # appended to by the reader thread alone
            while seen < len(lines):
                if m := rx.search(lines[seen]):
                    found.append(m)
                seen += 1
            if len(found) >= count:
                return found[:count]
            try:  # woken by the next line read (or one already queued)
                if self._lines_q.get(timeout=max(0.0, deadline - time.monotonic())) is None:
                    raise RuntimeError(f"daemon exited before logging {count} x {rx.pattern!r}")
            except queue.Empty:
                raise TimeoutError(f"daemon logged {rx.pattern!r} {len(found)} of {count} times") from None

    def client(self, **kw) -> JobQueue:
        return JobQueue("127.0.0.1", self.port, **kw)

    def stacks(self) -> str:
        """Every thread's stack (faulthandler, on SIGUSR1) after the log's last 200 lines:
        what a test that finds the daemon stuck puts in its failure message."""
        assert self.proc is not None
        before = len(self.lines)
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 5
        try:  # the dump comes in one write: read until the daemon is quiet a moment (or 5 s)
            while self._lines_q.get(timeout=1.0) is not None and time.monotonic() < deadline:
                pass
        except queue.Empty:
            pass
        return "".join(self.lines[max(0, before - 200):])

    def terminate(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGUSR1)  # faulthandler: dump every thread's stack
            try:
                self.wait_for_line("Current thread|Thread 0x", 5)
                self.proc.wait(2)
            except (TimeoutError, RuntimeError, subprocess.TimeoutExpired):
                pass
            self.kill()
            raise AssertionError("daemon did not stop on SIGTERM:\n" + "".join(self.lines)) from None

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class Gate:
    """A local listener that jobs.gate() connects to: lets a test see a job start and decide
    when it may finish, with no sleeping on either side."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []

    def arrival(self, timeout: float = 20.0) -> str:
        """Wait for the next gated job to start; returns its token."""
        self.sock.settimeout(timeout)
        conn, _ = self.sock.accept()
        conn.settimeout(timeout)
        token = conn.makefile("r").readline().strip()
        self.held.append(conn)
        return token

    def release_first(self, answer: str = "go") -> None:
        """Let the earliest held job finish, the others wait on."""
        c = self.held.pop(0)
        try:
            c.sendall(answer.encode() + b"\n")
        finally:
            c.close()

    def release_all(self, answer: str = "go") -> None:
        for c in self.held:
            try:
                c.sendall(answer.encode() + b"\n")
            finally:
                c.close()
        self.held.clear()

    def close(self) -> None:
        self.release_all()
        self.sock.close()


def read_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


class Listener:
    """A local TCP service the tests switch on and off, standing in for 'the network'.
    It accepts connections and closes them; closed, connects are refused."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self.sock: socket.socket | None = None
        self.open()

    def open(self) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(64)
        self.port = sock.getsockname()[1]
        self.sock = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            conn.close()

    def close(self) -> None:
        if self.sock is not None:
            # shutdown() wakes the thread blocked in accept(); close() alone would leave the
            # port listening on Linux until that accept returned.
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()
            self.sock = None


def run_together(*calls, timeout: float = 60.0) -> None:
    """Run each call in a thread of its own, all at once, and wait for them all. A call
    that raises fails the test with its error (a thread's exception is otherwise only
    printed), and one still running after `timeout` seconds fails it too: a stuck thread
    must not pass unseen."""
    errors: list[BaseException] = []

    def guarded(call) -> None:
        try:
            call()
        except BaseException as e:  # re-raised below, on the test's thread
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(c,), daemon=True) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    stuck = sum(t.is_alive() for t in threads)
    if errors:
        raise errors[0]
    assert not stuck, f"{stuck} of {len(threads)} threads still running after {timeout} s"


def let_others_reach_the_checkout() -> None:
    """Let a daemon run as another user (nobody) reach this checkout's code and job modules:
    a fresh clone may sit under a private (0700) temporary directory. Adds only the right to
    pass through (o+x) to the directories above the checkout that lack it, never to list or
    read them; as root only, and left so (the directories are the test run's own)."""
    if os.geteuid() != 0:
        return
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    while True:
        mode = os.stat(here).st_mode
        if not mode & 0o001:
            os.chmod(here, (mode & 0o7777) | 0o001)
        parent = os.path.dirname(here)
        if parent == here:
            return
        here = parent
