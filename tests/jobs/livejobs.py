"""Jobs that report progress, go quiet, hang or burn CPU, for tests/test_liveness.py."""

import asyncio
import socket
import time

import queickd


def _gate(port, token):
    """Tell the test's Gate `token`, then block until it answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
        s.sendall(f"{token}\n".encode())
        return s.recv(100).decode().strip()


def report_every(times, interval):
    """Report a new value every `interval` seconds, `times` times; returns times."""
    for i in range(times):
        queickd.progress(i + 1, times)
        time.sleep(interval)
    return times


async def areport_every(times, interval):
    for i in range(times):
        queickd.progress(i + 1, times)
        await asyncio.sleep(interval)
    return times


def quiet_then_report(port):
    """Report once, then go quiet on the Gate ("quiet"); once released, report again and
    wait on the Gate a second time ("reported")."""
    queickd.progress(1, 2, "started")
    _gate(port, "quiet")
    queickd.progress(2, 2, "going again")
    _gate(port, "reported")


async def aquiet_then_report(port):
    queickd.progress(1, 2, "started")
    await asyncio.to_thread(_gate, port, "quiet")
    queickd.progress(2, 2, "going again")
    await asyncio.to_thread(_gate, port, "reported")


def hang():
    """Wait without a word and without CPU time."""
    time.sleep(300)


async def ahang(path):
    with open(path, "a") as f:
        f.write(f"{queickd.current_job().attempt}\n")
    await asyncio.sleep(300)


def python_wait(path):
    """As hang, in a Python loop a thread's interrupt reaches (a short sleep per turn)."""
    with open(path, "a") as f:
        f.write(f"{queickd.current_job().attempt}\n")
    end = time.monotonic() + 300
    while time.monotonic() < end:
        time.sleep(0.05)


def burn(seconds):
    """Busy on the CPU for `seconds`, saying nothing; returns how many turns it made."""
    end, turns = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        turns += 1
    return turns
