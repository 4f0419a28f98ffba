"""The client across processes and broken connections: a JobQueue copied into a child by
os.fork() gets a connection and lock of its own, and a pipelined request whose connection
is reset raises RequestLostError, as every lost request does."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import threading

import pytest

from queickd import JobQueue
from queickd.client import RequestLostError


def _in_child(fn) -> str:
    """Run fn() in a child made by os.fork(); its result (or error) as text, within 20 s."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(r)
            out = repr(fn())
        except BaseException as e:  # noqa: BLE001 - whatever it was, the parent reports it
            out = f"raised {type(e).__name__}: {e}"
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        f_ready = threading.Event()
        box: list[bytes] = []
        threading.Thread(target=lambda: (box.append(f.read()), f_ready.set()), daemon=True).start()
        done = f_ready.wait(20)
    if not done:
        os.kill(pid, 9)
    os.waitpid(pid, 0)
    assert done, "the child did not answer within 20 s"
    return box[0].decode()


def test_a_forked_child_gets_its_own_connection_and_its_own_jobs_ids(client):
    parent_id = client.enqueue("testjobs:noop")
    child = _in_child(lambda: [client.get(client.enqueue("testjobs:noop"))["id"] for _ in range(20)])
    ids = json.loads(child)
    assert len(set(ids)) == 20 and parent_id not in ids  # each reply its own request's
    assert [client.get(client.enqueue("testjobs:noop"))["id"] for _ in range(20)] != ids  # the parent's too


def test_a_child_forked_while_another_thread_held_the_client_does_not_block(client):
    client.stats()
    with client._lock:  # another thread's request in flight at the fork
        child = _in_child(lambda: client.enqueue("testjobs:noop"))
    assert child.isdigit()


@pytest.fixture
def resetting_peer():
    """A peer that answers the hello, reads part of the next request, then resets the
    connection (a daemon killed mid-request)."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = srv.accept()
        f = conn.makefile("rb")
        f.readline()
        conn.sendall(b'{"ok": true, "server": "queickd", "version": "0", "protocol": 1}\n')
        conn.recv(4096)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1]
    srv.close()


def test_a_long_pipeline_whose_connection_is_reset_raises_request_lost(resetting_peer):
    q = JobQueue("127.0.0.1", resetting_peer, timeout=20)
    with pytest.raises(RequestLostError):
        q.enqueue_pipelined([q.job("testjobs:noop") for _ in range(5000)])
    assert q._sock is None  # let go: the next call connects anew


class _InterruptError(Exception):
    """What a signal handler raised (a REPL's Ctrl-C, a SIGALRM timeout)."""


def test_a_request_interrupted_while_it_waits_never_takes_the_next_ones_reply(daemon, gate):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers run in the main thread only")

    def interrupt(signum, frame):
        raise _InterruptError

    with daemon.client() as q:
        job = q.enqueue("testjobs:gate", (gate.port, "held"))
        assert gate.arrival() == "held"
        old = signal.signal(signal.SIGALRM, interrupt)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(_InterruptError):
                q.wait(job, 30)  # its reply is owed until the job ends
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        threading.Timer(0.3, gate.release_all).start()  # the job ends while the next request waits
        other = q.enqueue("testjobs:add", (2, 3))
        assert other != job
        assert q.wait(other, 20)["result"] == 5
