"""Protocol v1 on a raw socket: framing, ordering, errors, authentication."""

import json
import socket

import pytest
from helpers import DaemonProcess

from queickd import JobQueue
from queickd.core.job import State
from queickd.core.protocol import QueueError
from queickd.store.sqlite.store import SQLiteStore


class Raw:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        self.rfile = self.sock.makefile("rb")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def reply(self) -> dict:
        line = self.rfile.readline()
        assert line, "connection closed"
        return json.loads(line)

    def ask(self, obj) -> dict:
        self.send(json.dumps(obj).encode() + b"\n")
        return self.reply()

    def closed(self) -> bool:
        """True once the daemon has hung up (EOF, or a reset if our bytes were unread)."""
        try:
            return self.rfile.readline() == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw(daemon):
    r = Raw(daemon.port)
    yield r
    r.close()


def test_hello_names_the_server_and_protocol(raw):
    r = raw.ask({"op": "hello"})
    assert (r["ok"], r["server"], r["protocol"]) == (True, "queickd", 1)
    assert isinstance(r["version"], str)


@pytest.mark.parametrize("line", [
    b"this is not json",
    b"\xff\xfe\x00garbage",
    b"[1, 2, 3]",
    b'{"no_op": 1}',
    b'{"op": "explode"}',
    b'{"op": "enqueue", "func": "testjobs:noop", "surprise": 1}',
    b'{"op": "enqueue", "func": "testjobs:noop", "args": "not a list"}',
    b'{"op": "enqueue", "func": "testjobs:noop", "delay": -1}',
    b'{"op": "enqueue", "func": "not a function name"}',
    b'{"op": "enqueue", "func": "testjobs:noop", "retry": {"policy": "sometimes"}}',
    b'{"op": "get", "job_id": "1"}',
    b'{"op": "jobs", "state": "finished"}',
], ids=["not-json", "not-utf8", "array", "no-op", "unknown-op", "unknown-field", "args-type",
        "negative-delay", "bad-func", "bad-policy", "id-type", "bad-state"])
def test_bad_input_gets_bad_request_and_the_connection_keeps_serving(raw, line):
    raw.send(line + b"\n")
    r = raw.reply()
    assert r["ok"] is False and r["error"]["code"] == "bad_request" and r["error"]["message"]
    assert raw.ask({"op": "hello"})["ok"] is True


def test_an_oversized_line_is_refused_and_the_connection_closed(daemon, raw):
    raw.send(b'{"op": "enqueue", "func": "testjobs:noop", "args": ["' + b"x" * (1 << 20) + b'"]}\n')
    r = raw.reply()
    assert r["error"]["code"] == "bad_request" and "longer than" in r["error"]["message"]
    assert raw.closed()
    with daemon.client() as q:  # the daemon itself is fine
        assert q.wait(q.enqueue("testjobs:noop"), 20)["state"] == State.SUCCEEDED


def test_an_endless_line_without_newline_is_cut_off(raw):
    chunk = b"a" * 65536
    try:
        for _ in range(64):  # 4 MiB, four times the limit
            raw.send(chunk)
    except OSError:
        pass  # the daemon hung up while we were still sending: that is the refusal
    try:
        r = raw.reply()
    except ConnectionResetError:
        return  # closed with our unread bytes pending: refused all the same
    assert r["error"]["code"] == "bad_request"
    assert raw.closed()


def test_bad_input_never_damages_the_store(start_daemon, tmp_path):
    d = start_daemon()
    raw = Raw(d.port)
    for line in (b"\x00\x01\x02", b"{" * 1000, b'{"op":"enqueue","func":"testjobs:noop","args":[1e999]}'):
        raw.send(line + b"\n")
        assert raw.reply()["ok"] is False
    ok = raw.ask({"op": "enqueue", "func": "testjobs:add", "args": [1, 2]})
    raw.close()
    assert d.terminate() == 0
    store = SQLiteStore(str(tmp_path / "queue.db"))
    assert store.integrity_check() == "ok"
    assert [j.id for j in store.list_jobs(None, 10)] == [ok["job_id"]]
    store.close()


def test_a_request_longer_than_one_read_arrives_whole(raw):
    arg = "x" * 300_000  # several reads of the server's 64 KiB buffer
    reply = raw.ask({"op": "enqueue", "func": "testjobs:noop", "args": [arg]})
    job = raw.ask({"op": "get", "job_id": reply["job_id"]})["job"]
    assert job["args"] == [arg]


def test_connections_sending_halves_of_lines_in_turn_each_get_their_own_line(daemon):
    # Every connection of the loop reads into one buffer: what one read left must not
    # show up in another connection's request.
    a, b = Raw(daemon.port), Raw(daemon.port)
    try:
        lines = {c: json.dumps({"op": "enqueue", "func": "testjobs:noop", "args": [name * 1000]}).encode() + b"\n"
                 for c, name in ((a, "a"), (b, "b"))}
        for c in (a, b):
            c.send(lines[c][:700])
        for c in (a, b):
            c.send(lines[c][700:])
        for c, name in ((a, "a"), (b, "b")):
            job_id = c.reply()["job_id"]
            assert c.ask({"op": "get", "job_id": job_id})["job"]["args"] == [name * 1000]
    finally:
        a.close()
        b.close()


def test_pipelined_requests_are_answered_in_order(raw):
    reqs = []
    for i in range(200):
        reqs.append({"op": "enqueue", "func": "testjobs:add", "args": [i, 0]})
        if i % 50 == 0:
            reqs.append({"op": "stats"})
            reqs.append({"op": "nonsense"})
    raw.send(b"".join(json.dumps(r).encode() + b"\n" for r in reqs))
    replies = [raw.reply() for _ in reqs]
    kinds = [("stats" if "counts" in r else "enqueue" if "job_id" in r else "error") for r in replies]
    expected = [{"enqueue": "enqueue", "stats": "stats", "nonsense": "error"}[r["op"]] for r in reqs]
    assert kinds == expected
    ids = [r["job_id"] for r in replies if "job_id" in r]
    assert ids == sorted(ids) and len(set(ids)) == 200


def test_a_pipelined_request_sees_what_the_enqueues_before_it_stored(raw):
    # Answered in order, and done in order: a listing or a bulk cancel sent right behind
    # enqueues finds their jobs (ten rounds: each was a race before).
    for n in range(10):
        key = f"k{n}"
        reqs = [{"op": "enqueue", "func": "testjobs:noop", "delay": 3600, "key": key}] * 2 + [
            {"op": "jobs", "state": "scheduled", "key": key},
            {"op": "cancel", "state": "scheduled", "key": key},
            {"op": "jobs", "state": "cancelled", "key": key}]
        raw.send(b"".join(json.dumps(r).encode() + b"\n" for r in reqs))
        first, second, listed, cancelled, after = (raw.reply() for _ in reqs)
        ids = sorted([first["job_id"], second["job_id"]])
        assert sorted(j["id"] for j in listed["jobs"]) == ids
        assert cancelled["cancelled"] == 2 and sorted(j["id"] for j in after["jobs"]) == ids


def test_an_enqueue_pipelined_behind_a_bulk_cancel_is_not_cancelled_by_it(raw):
    for n in range(10):
        key = f"k{n}"
        raw.send(b"".join(json.dumps(r).encode() + b"\n" for r in [
            {"op": "enqueue", "func": "testjobs:noop", "delay": 3600, "key": key},
            {"op": "cancel", "state": "scheduled", "key": key},
            {"op": "enqueue", "func": "testjobs:noop", "delay": 3600, "key": key},
            {"op": "jobs", "state": "scheduled", "key": key}]))
        _, cancelled, kept, listed = (raw.reply() for _ in range(4))
        assert cancelled["cancelled"] == 1 and [j["id"] for j in listed["jobs"]] == [kept["job_id"]]


def test_a_pipelined_mix_of_enqueues_duplicates_batches_and_errors_gets_each_its_own_reply(raw):
    reqs = [
        {"op": "enqueue", "func": "testjobs:noop"},
        {"op": "enqueue", "func": "testjobs:noop", "idempotency_key": "once"},
        {"op": "enqueue", "func": "testjobs:noop", "idempotency_key": "once"},
        {"op": "enqueue", "func": 42},
        {"op": "enqueue", "func": "testjobs:noop", "delay": 3600},
        {"op": "enqueue_many", "jobs": [{"func": "testjobs:noop"}, {"func": "testjobs:noop"}]},
        {"op": "enqueue", "func": "testjobs:noop"},
    ]
    raw.send(b"".join(json.dumps(r).encode() + b"\n" for r in reqs))
    first, once, again, bad, later, many, last = (raw.reply() for _ in reqs)
    assert (first["state"], once["state"], later["state"], last["state"]) == ("queued", "queued", "scheduled", "queued")
    assert again == {"ok": True, "job_id": once["job_id"], "state": "queued", "duplicate": True}
    assert bad["error"]["code"] == "bad_request"
    assert first["job_id"] < once["job_id"] < later["job_id"] < many["job_ids"][0] < many["job_ids"][1] < last["job_id"]


def test_enqueue_many_rejects_the_whole_batch_if_one_job_is_bad(raw):
    r = raw.ask({"op": "enqueue_many", "jobs": [{"func": "testjobs:noop"}, {"func": 42}]})
    assert r["error"]["code"] == "bad_request" and "jobs[1]" in r["error"]["message"]
    assert raw.ask({"op": "stats"})["enqueued"] == 0


@pytest.fixture
def token_daemon(start_daemon, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    return start_daemon(None, "--token-file", str(token))


def test_with_a_token_every_op_before_hello_is_unauthorized(token_daemon):
    raw = Raw(token_daemon.port)
    assert raw.ask({"op": "stats"})["error"]["code"] == "unauthorized"
    assert raw.ask({"op": "hello", "token": "wrong"})["error"]["code"] == "unauthorized"
    assert raw.ask({"op": "enqueue", "func": "testjobs:noop"})["error"]["code"] == "unauthorized"
    assert raw.ask({"op": "hello", "token": "s3cret"})["ok"] is True
    assert raw.ask({"op": "stats"})["ok"] is True
    raw.close()


def test_the_client_sends_its_token(token_daemon):
    with JobQueue("127.0.0.1", token_daemon.port, token="s3cret") as q:
        assert q.wait(q.enqueue("testjobs:noop"), 20)["state"] == State.SUCCEEDED
    with pytest.raises(QueueError) as e, JobQueue("127.0.0.1", token_daemon.port, token="nope") as q:
        q.stats()
    assert e.value.code == "unauthorized"


def test_the_client_reconnects_after_the_daemon_restarts(tmp_path):
    d = DaemonProcess(f"sqlite:///{tmp_path / 'q.db'}").start()
    try:
        q = JobQueue("127.0.0.1", d.port)
        assert q.wait(q.enqueue("testjobs:noop"), 20)["state"] == State.SUCCEEDED
        port = d.port
        assert d.terminate() == 0
        d.extra = ["--port", str(port)]  # the later --port wins
        d.start()
        assert q.wait(q.enqueue("testjobs:noop"), 20)["state"] == State.SUCCEEDED
        q.close()
    finally:
        d.close()


def test_an_unreachable_daemon_raises_connection_error():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(ConnectionError, match="is the daemon running"):
        JobQueue("127.0.0.1", port).stats()


def _send_then_half_close(port: int, reqs: list[dict]) -> list[dict]:
    """Send every request, shut our sending side (as `nc -q1` does), read until the daemon closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(b"".join(json.dumps(r).encode() + b"\n" for r in reqs))
        sock.shutdown(socket.SHUT_WR)
        with sock.makefile("rb") as rfile:
            return [json.loads(line) for line in rfile]


def test_every_request_sent_before_a_half_close_is_answered(daemon):
    reqs = [{"op": "enqueue", "func": "testjobs:add", "args": [i, 1]} for i in range(50)] + [{"op": "stats"}]
    replies = _send_then_half_close(daemon.port, reqs)
    assert len(replies) == len(reqs)
    assert all(r["ok"] for r in replies) and "counts" in replies[-1]


def test_a_lone_read_request_before_a_half_close_is_answered(daemon):
    replies = _send_then_half_close(daemon.port, [{"op": "stats"}])
    assert len(replies) == 1 and "counts" in replies[0]


def test_enqueues_acked_before_a_half_close_are_committed(daemon, tmp_path):
    reqs = [{"op": "enqueue", "func": "testjobs:add", "args": [i, 1], "delay": 3600} for i in range(20)]
    ids = [r["job_id"] for r in _send_then_half_close(daemon.port, reqs)]
    store = SQLiteStore(str(tmp_path / "queue.db"))
    try:
        assert [store.get(i).id for i in ids] == ids
    finally:
        store.close()
