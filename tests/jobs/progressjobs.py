"""Jobs that report their progress (queickd.progress), for tests/test_progress.py."""

import socket

import queickd


def _gate(port, token):
    """Tell the test's Gate `token`, then block until it answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(f"{token}\n".encode())
        return s.recv(100).decode().strip()


def report_then_gate(port, done, total, note):
    """Report progress once, then wait on the Gate; returns what progress() answered."""
    said = queickd.progress(done, total, note)
    _gate(port, "reported")
    return said


def repeat_then_gate(port, times):
    """Report 1/10 `times` times, wait on the Gate, report 1/10 `times` times again and then
    2/10, and wait on the Gate again: two changes in all."""
    for _ in range(times):
        queickd.progress(1, 10)
    _gate(port, "first")
    for _ in range(times):
        queickd.progress(1, 10)
    queickd.progress(2, 10)
    _gate(port, "second")


def count_up(n):
    """Report each step of n (a job that reports as fast as it can); returns n."""
    for i in range(n):
        queickd.progress(i + 1, n)
    return n


def current_on_attempt(n):
    """Fail until attempt n; then return [id, attempt, deadline] of queickd.current_job()."""
    me = queickd.current_job()
    if me.attempt < n:
        raise RuntimeError(f"attempt {me.attempt} fails on purpose")
    return [me.id, me.attempt, me.deadline]


async def areport_then_gate(port, done, total, note):
    """As report_then_gate, from an async job: its task reports, then waits on the Gate off
    the loop (the Gate's socket blocks)."""
    import asyncio

    said = queickd.progress(done, total, note)
    await asyncio.to_thread(_gate, port, "reported")
    return said
