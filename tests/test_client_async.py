"""AsyncJobQueue against a real daemon: many awaits in flight on one connection, each
given the reply to its own request, waits on connections of their own, and the
connection closed at the end of `async with`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import taskjobs
import wfsteps

from queickd import AsyncJobHandle, AsyncJobQueue, JobFailed, QueueError


class ReplyHoldingProxy:
    """A TCP proxy in front of the daemon that passes requests on at once but holds every
    reply after the hello's until `requests` more request lines have come through: a
    client that waited for a reply before sending its next request never gets there (the
    proxy then gives up after 30 s and cuts the connection)."""

    def __init__(self, port: int, requests: int) -> None:
        self.target, self.requests = port, requests
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.all_sent = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.sock.accept()
                self.connections += 1
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=60)
                threading.Thread(target=self._requests, args=(client, upstream), daemon=True).start()
                threading.Thread(target=self._replies, args=(upstream, client), daemon=True).start()

    def _requests(self, src: socket.socket, dst: socket.socket) -> None:
        lines = 0
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
                lines += data.count(b"\n")
                if lines >= 1 + self.requests:  # the hello, then the requests
                    self.all_sent.set()

    def _replies(self, src: socket.socket, dst: socket.socket) -> None:
        f = src.makefile("rb")
        with contextlib.suppress(OSError):
            dst.sendall(f.readline())  # the hello's reply
            if not self.all_sent.wait(30):
                dst.shutdown(socket.SHUT_RDWR)
                return
            while data := f.read1(65536):
                dst.sendall(data)

    def close(self) -> None:
        self.sock.close()


def established_to(port: int) -> int:
    """TCP connections of this machine in ESTABLISHED state whose remote port is `port`."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                    count += 1
    return count


def test_async_client_pipelines_1000_enqueues(daemon):
    proxy = ReplyHoldingProxy(daemon.port, requests=1000)

    async def main():
        async with AsyncJobQueue("127.0.0.1", proxy.port) as q:
            add = q.task(taskjobs.add.func)
            handles = await asyncio.gather(*(add.aenqueue(i, 1) for i in range(1000)))
            return [h.id for h in handles]

    try:
        ids = asyncio.run(main())
    finally:
        proxy.close()
    assert proxy.all_sent.is_set() and proxy.connections == 1
    assert len(set(ids)) == 1000
    with daemon.client() as q:
        assert [q.wait(ids[i], timeout=20)["result"] for i in (0, 999)] == [1, 1000]


def test_async_client_matches_replies_in_order(daemon):
    async def main():
        async with AsyncJobQueue("127.0.0.1", daemon.port) as q:
            ids = await asyncio.gather(*(q.enqueue("testjobs:add", args=(i, 1000)) for i in range(200)))
            return ids, await asyncio.gather(q.wait(ids[0], timeout=20), *(q.get(i) for i in ids),
                                             q.get(10**12), q.enqueue("testjobs:add", args=(1, 2), isolation="nowhere"),
                                             q.stats(), return_exceptions=True)

    ids, (waited, *got) = asyncio.run(main())
    jobs, missing, refused, stats = got[:200], got[200], got[201], got[202]
    assert waited["id"] == ids[0] and waited["result"] == 1000
    assert [(j["id"], j["args"]) for j in jobs] == [(job_id, [i, 1000]) for i, job_id in enumerate(ids)]
    assert isinstance(missing, QueueError) and missing.code == "not_found"
    assert isinstance(refused, QueueError) and refused.code == "bad_request"
    assert "counts" in stats


def test_a_cancelled_await_leaves_every_other_reply_matched(daemon):
    async def main():
        async with AsyncJobQueue("127.0.0.1", daemon.port) as q:
            ids = await asyncio.gather(*(q.enqueue("testjobs:add", args=(i, 0)) for i in range(100)))
            gets = [asyncio.ensure_future(q.get(i)) for i in ids]
            await asyncio.sleep(0)  # every get is sent (or about to be) before the cancels
            for g in gets[::2]:
                g.cancel()
            done = await asyncio.gather(*gets[1::2])
            return ids, done, await q.get(ids[0])

    ids, done, first = asyncio.run(main())
    assert [(j["id"], j["args"][0]) for j in done] == [(ids[i], i) for i in range(1, 100, 2)]
    assert first["id"] == ids[0]


def test_async_with_closes_the_connection(daemon):
    async def main():
        async with AsyncJobQueue("127.0.0.1", daemon.port) as q:
            job_id = await q.enqueue("testjobs:add", args=(1, 2))
            assert (await q.wait(job_id, timeout=20))["result"] == 3  # the wait has a connection of its own
            open_inside = established_to(daemon.port)
        return open_inside, established_to(daemon.port)

    inside, after = asyncio.run(main())
    assert (inside, after) == (2, 0)


def test_async_task_handles_await_the_result(daemon):
    async def main():
        async with AsyncJobQueue("127.0.0.1", daemon.port) as q:
            fail = q.task(taskjobs.fail.func)
            job = await fail.aenqueue("late")
            assert isinstance(job, AsyncJobHandle)
            with pytest.raises(JobFailed, match="ValueError: late"):
                await job.result(timeout=20)
            return (await job.get())["state"]

    assert asyncio.run(main()) == "dead"


def test_a_task_of_an_async_queue_refuses_a_blocking_enqueue(daemon):
    add = AsyncJobQueue("127.0.0.1", daemon.port).task(taskjobs.add.func)
    with pytest.raises(TypeError, match=r"await task\.aenqueue"):
        add.enqueue(2, 3)


def test_a_queue_awaits_from_one_event_loop_after_another(daemon):
    q = taskjobs.queue  # a module's queue, its task awaited from each test's own loop
    q.close()
    q.host, q.port = "127.0.0.1", daemon.port

    async def one_loop(a):
        return await (await taskjobs.add.aenqueue(a, 1)).result(timeout=20)

    assert [asyncio.run(one_loop(a)) for a in (1, 2, 3)] == [2, 3, 4]


def test_async_workflow_runs_through_the_same_builder(daemon):
    async def main():
        async with AsyncJobQueue("127.0.0.1", daemon.port) as q:
            run_id = await (q.workflow("squares").then(wfsteps.plan).for_each("tasks", wfsteps.square, "results")
                            .then(wfsteps.total).start(state={"n": 4}))
            return await q.workflow_wait(run_id, 30)

    run = asyncio.run(main())
    assert run["state"] == "succeeded" and run["data"]["total"] == 14


def test_async_refused_option_raises_queue_error_with_the_daemons_code(daemon):
    async def main():
        async with AsyncJobQueue("127.0.0.1", daemon.port) as q:
            await q.enqueue("testjobs:add", args=(1, 2), pool="")

    with pytest.raises(QueueError) as info:
        asyncio.run(main())
    assert info.value.code == "bad_request" and "pool" in info.value.message


def test_an_unreachable_daemon_is_a_connection_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused

        async def main():
            async with AsyncJobQueue("127.0.0.1", port) as q:
                await q.stats()

        with pytest.raises(ConnectionError, match="is the daemon running"):
            asyncio.run(main())


def test_a_program_that_never_awaits_does_not_import_asyncio():
    code = ("import sys, queickd, taskjobs; assert 'asyncio' not in sys.modules; "
            "from queickd import AsyncJobQueue; assert 'asyncio' in sys.modules")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)


def test_a_cancelled_wait_does_not_hold_the_next_one(daemon):
    async def main():
        async with AsyncJobQueue("127.0.0.1", daemon.port) as q:
            later = await q.enqueue("testjobs:add", args=(1, 2), delay=3600)
            now = await q.enqueue("testjobs:add", args=(3, 4))
            with pytest.raises(asyncio.TimeoutError):  # the daemon holds this wait for 30 s
                await asyncio.wait_for(q.wait(later, timeout=30), 0.5)
            # Answered at once (the job is done or about to be), not after the wait given up.
            return await asyncio.wait_for(q.wait(now, timeout=20), 15)

    assert asyncio.run(main())["result"] == 7


def test_an_await_cancelled_during_the_hello_closes_its_connection():
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers the hello
        port = silent.getsockname()[1]

        async def main():
            q = AsyncJobQueue("127.0.0.1", port)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(q.stats(), 0.5)
            await asyncio.sleep(0)  # the close's turn of the loop
            return q

        q = asyncio.run(main())
        conn, _ = silent.accept()
        with conn:
            conn.settimeout(20)
            assert conn.recv(4096).startswith(b'{"op"')  # the hello
            assert conn.recv(4096) == b""  # then the client's end: closed, not left open
        assert q._conn is None
