"""The process and its service manager: systemd notifications (sd_notify) in a few lines of
standard library, and the signals it is stopped and reloaded with.

READY=1 once the daemon serves, STOPPING=1 when it begins to stop, and WATCHDOG=1 every
half watchdog interval while the scheduler thread is alive, so a wedged daemon is
restarted by systemd. Does nothing outside systemd (no NOTIFY_SOCKET).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Callable


def notify(state: str) -> bool:
    """Send one notification; False when not under systemd or the send failed."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]  # abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(state.encode(), addr)
        return True
    except OSError:
        return False


def start_watchdog(healthy: Callable[[], bool], stop: threading.Event) -> threading.Thread | None:
    """Ping the watchdog at half its interval while healthy() holds; None without one."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and int(pid) != os.getpid()):
        return None
    interval = int(usec) / 2e6

    def loop() -> None:
        while not stop.wait(interval):
            if healthy():
                notify("WATCHDOG=1")

    t = threading.Thread(target=loop, name="queickd-watchdog", daemon=True)
    t.start()
    return t


class Signals:
    """SIGTERM, SIGINT and SIGHUP, caught from construction on (one that comes before wait()
    is kept for it). The kernel may hand a signal to any thread, and CPython then only flags
    it for the main thread, which a lock could block for ever: so the C-level handler writes
    it to a pipe (signal.set_wakeup_fd) that wait() reads. No polling, no lost SIGTERM."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        signal.set_wakeup_fd(self._w)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda *_: None)  # the byte in the pipe is what counts

    def wait(self, stop: threading.Event, on_hup: Callable[[], object]) -> None:
        """Block until SIGTERM/SIGINT or `stop` is set (from any thread); call `on_hup` at
        each SIGHUP."""

        def relay() -> None:
            stop.wait()
            try:
                os.write(self._w, b"\0")
            except OSError:
                pass  # the pipe is full: a byte is on its way already

        threading.Thread(target=relay, name="queickd-stop-relay", daemon=True).start()
        while not stop.is_set():
            data = os.read(self._r, 64)
            if signal.SIGTERM in data or signal.SIGINT in data:
                stop.set()
            elif signal.SIGHUP in data:
                on_hup()
