"""A submit whose outcome the client cannot know: the connection broke after the request
left, or the store failed at COMMIT. The client resends under the same idempotency key
(its own `auto:` key unless one was given) and gets the job stored the first time; the
daemon says `maybe_committed` when the store raised during or after COMMIT."""

from __future__ import annotations

import contextlib
import json
import socket
import threading

import pytest

from queickd import JobQueue, QueueError
from queickd.clientwire import _auto_key


class ReplyDroppingProxy:
    """A TCP proxy in front of the daemon. On its first connection it forwards the hello
    reply and then cuts both sides instead of forwarding the next reply: the request got
    to the daemon, its answer never came back. Later connections are forwarded whole."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.cut = threading.Event()
        self.accepting = threading.Thread(target=self._accept, daemon=True)
        self.accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            upstream = socket.create_connection(("127.0.0.1", self.target), timeout=30)
            threading.Thread(target=self._pump, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, self.connections == 1),
                             daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, cut_second_line: bool | None) -> None:
        try:
            if cut_second_line:
                f = src.makefile("rb")
                dst.sendall(f.readline())  # the hello reply
                f.readline()  # the enqueue's reply, read and dropped
                self.cut.set()
                for s in (src, dst):
                    s.shutdown(socket.SHUT_RDWR)
                    s.close()
                return
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def close(self) -> None:
        # A close alone leaves accept() blocked in the other thread; a shutdown wakes it.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.accepting.join(5)
        assert not self.accepting.is_alive()


@pytest.fixture
def proxy(daemon):
    p = ReplyDroppingProxy(daemon.port)
    yield p
    p.close()


def test_an_enqueue_whose_reply_was_lost_is_resent_and_returns_the_first_job(daemon, proxy):
    with JobQueue("127.0.0.1", proxy.port) as q:
        job_id = q.enqueue("testjobs:noop")
    assert proxy.cut.is_set() and proxy.connections == 2
    with daemon.client() as q:
        jobs = q.jobs()
    assert [j["id"] for j in jobs] == [job_id]
    assert jobs[0]["idempotency_key"].startswith("auto:")


def test_a_lost_reply_with_the_callers_own_key_keeps_that_key(daemon, proxy):
    with JobQueue("127.0.0.1", proxy.port) as q:
        job_id = q.enqueue("testjobs:noop", idempotency_key="order-17")
    with daemon.client() as q:
        assert [(j["id"], j["idempotency_key"]) for j in q.jobs()] == [(job_id, "order-17")]


def _refusing_at_commit(start_daemon, pg_url):
    """A daemon on PostgreSQL whose every insert of a job fails at COMMIT, not before."""
    import psycopg

    d = start_daemon(pg_url, workers=0)
    with d.client() as q:
        q.enqueue("testjobs:noop")  # the schema exists now
    with psycopg.connect(pg_url, autocommit=True) as c:  # a check that fails only at COMMIT
        c.execute("CREATE FUNCTION refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS "
                  "$$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$")
        c.execute("CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT ON jobs DEFERRABLE "
                  "INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_at_commit()")
    return d


def test_a_store_failing_at_commit_answers_internal_with_maybe_committed(start_daemon, pg_url):
    d = _refusing_at_commit(start_daemon, pg_url)
    with socket.create_connection(("127.0.0.1", d.port), timeout=20) as s:
        s.sendall(b'{"op":"enqueue","func":"testjobs:noop"}\n')
        reply = json.loads(s.makefile("rb").readline())
    assert reply["error"]["code"] == "internal" and reply["error"]["maybe_committed"] is True


def test_a_pipelined_enqueue_failing_at_commit_raises_with_maybe_committed(start_daemon, pg_url):
    d = _refusing_at_commit(start_daemon, pg_url)
    with d.client() as q:
        with pytest.raises(QueueError) as e:
            q.enqueue_pipelined([q.job("testjobs:noop")])
    assert e.value.code == "internal" and e.value.maybe_committed is True


def test_enqueue_many_gives_no_automatic_keys_so_a_batch_costs_no_lookup_per_job(client):
    ids = client.enqueue_many([client.job("testjobs:noop") for _ in range(3)])
    assert [client.get(i)["idempotency_key"] for i in ids] == [None, None, None]
    single = client.enqueue("testjobs:noop")
    assert client.get(single)["idempotency_key"].startswith("auto:")


def test_automatic_keys_sort_in_the_order_they_were_made():
    # The store's unique index then takes each new key at its right edge, not a random page.
    keys = [_auto_key() for _ in range(1000)]
    assert keys == sorted(keys)


def test_automatic_keys_made_at_the_same_moment_differ():
    assert len({_auto_key() for _ in range(10_000)}) == 10_000
