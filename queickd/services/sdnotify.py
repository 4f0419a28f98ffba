"""systemd notifications (sd_notify) in a few lines of standard library.

READY=1 once the daemon serves, STOPPING=1 when it begins to stop, and WATCHDOG=1 every
half watchdog interval while the scheduler thread is alive, so a wedged daemon is
restarted by systemd. Does nothing outside systemd (no NOTIFY_SOCKET).
"""

from __future__ import annotations

import os
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
