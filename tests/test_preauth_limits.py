"""What anyone who can reach the TCP port can cost the daemon before authenticating, and
what one connection can make it hold: connection cap, hello timeout, the pre-auth line
limit, wrong tokens, and back-pressure on pending replies. Real daemon, real sockets."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from attackhelpers import bystander_enqueue_seconds, rss_mb


def _lines_until_closed(s: socket.socket) -> list[dict]:
    f = s.makefile("rb")
    return [json.loads(line) for line in iter(f.readline, b"")]


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text("s3cret\n")
    return str(path)


def test_a_connection_over_max_connections_is_told_and_closed(start_daemon):
    d = start_daemon(None, "--max-connections", "3")
    held = []
    for _ in range(3):  # each proven by a request: unproven ones have a cap of their own
        held.append(socket.create_connection(("127.0.0.1", d.port), timeout=10))
        held[-1].sendall(b'{"op":"stats"}\n')
        assert json.loads(held[-1].makefile("rb").readline())["ok"] is True
    try:
        with socket.create_connection(("127.0.0.1", d.port), timeout=10) as extra:
            [reply] = _lines_until_closed(extra)
        assert reply["error"]["code"] == "queue_full" and "too many connections" in reply["error"]["message"]
    finally:
        for s in held:
            s.close()


def test_a_connection_that_never_authenticates_is_closed_after_the_hello_timeout(start_daemon, token_file):
    d = start_daemon(None, "--token-file", token_file, "--hello-timeout", "0.5")
    with socket.create_connection(("127.0.0.1", d.port), timeout=10) as s:
        s.sendall(b'{"op":"stats"}\n')  # a complete line is not a hello
        replies = _lines_until_closed(s)
    assert [r["error"]["code"] for r in replies] == ["unauthorized", "unauthorized"]
    assert "no hello within 0.5 s" in replies[-1]["error"]["message"]


def test_without_a_token_a_connection_that_never_completes_a_line_is_closed(start_daemon):
    d = start_daemon(None, "--hello-timeout", "0.5")
    with socket.create_connection(("127.0.0.1", d.port), timeout=10) as s:
        s.sendall(b'{"op":"sta')
        [reply] = _lines_until_closed(s)
    assert "no request within 0.5 s" in reply["error"]["message"]


def test_an_authenticated_connection_may_stay_idle_past_the_hello_timeout(start_daemon, token_file):
    d = start_daemon(None, "--token-file", token_file, "--hello-timeout", "0.3")
    with socket.create_connection(("127.0.0.1", d.port), timeout=10) as s:
        f = s.makefile("rb")
        s.sendall(b'{"op":"hello","token":"s3cret"}\n')
        assert json.loads(f.readline())["ok"] is True
        s.settimeout(1.0)  # three hello timeouts: the daemon must not close it (no EOF comes)
        with pytest.raises(TimeoutError):
            s.recv(1)
        s.settimeout(10)
        s.sendall(b'{"op":"stats"}\n')
        assert json.loads(f.readline())["ok"] is True


def test_before_the_token_a_line_over_4_kib_closes_the_connection(start_daemon, token_file):
    d = start_daemon(None, "--token-file", token_file)
    before = rss_mb(d)
    with socket.create_connection(("127.0.0.1", d.port), timeout=10) as s:
        try:
            s.sendall(b"x" * 8192)
        except OSError:
            pass
        [reply] = _lines_until_closed(s)
    assert "longer than 4096 bytes" in reply["error"]["message"]
    assert rss_mb(d) - before < 5


def test_the_third_wrong_token_closes_the_connection_and_each_is_answered_late(start_daemon, token_file):
    d = start_daemon(None, "--token-file", token_file)
    with socket.create_connection(("127.0.0.1", d.port), timeout=10) as s:
        t0 = time.monotonic()
        s.sendall(b'{"op":"hello","token":"guess"}\n' * 1000)
        replies = _lines_until_closed(s)
        elapsed = time.monotonic() - t0
    assert [r["error"]["code"] for r in replies] == ["unauthorized"] * 3
    assert elapsed >= 0.5


def test_a_wait_flood_waits_in_the_socket_and_every_wait_is_answered_in_order(start_daemon):
    d = start_daemon(None, "--max-pending", "16")
    with d.client() as q:
        far = q.enqueue("testjobs:noop", delay=3600)
        before = rss_mb(d)
        flood = socket.create_connection(("127.0.0.1", d.port), timeout=30)
        flood.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
        lines = json.dumps({"op": "wait", "job_id": far, "timeout": 60}).encode() + b"\n"
        lines *= 20_000
        sender = threading.Thread(target=flood.sendall, args=(lines,), daemon=True)
        sender.start()
        sender.join(2.0)
        assert sender.is_alive()  # the daemon stopped reading: the waits queue in the socket
        assert bystander_enqueue_seconds(d) < 1.0
        assert rss_mb(d) - before < 20
        q.cancel(far)  # every wait ends: the daemon reads the rest as the replies drain
        f = flood.makefile("rb")
        states = [json.loads(f.readline())["job"]["state"] for _ in range(20_000)]
        sender.join(30)
        flood.close()
    assert states == ["cancelled"] * 20_000


def _connect_from(address: str, port: int) -> socket.socket:
    """A connection from `address` (another loopback address stands for another host)."""
    return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(address, 0))


def _hello(s: socket.socket, token: str = "s3cret") -> dict:
    s.sendall(json.dumps({"op": "hello", "token": token}).encode() + b"\n")
    return json.loads(s.makefile("rb").readline())


def test_a_host_holding_the_unauthenticated_pool_is_refused_more_and_another_host_gets_in(start_daemon, token_file):
    d = start_daemon(None, "--token-file", token_file, "--max-connections", "16")  # pool 12, share 2
    held = [_connect_from("127.0.0.1", d.port) for _ in range(12)]
    try:
        with _connect_from("127.0.0.1", d.port) as more:
            [reply] = _lines_until_closed(more)
        assert reply["error"]["code"] == "queue_full"
        assert "too many unauthenticated connections from 127.0.0.1" in reply["error"]["message"]
        with _connect_from("127.0.0.2", d.port) as other_host:
            assert _hello(other_host)["ok"] is True
        [evicted] = _lines_until_closed(held[0])  # the oldest made room for it
        assert "another host waited" in evicted["error"]["message"]
    finally:
        for s in held:
            s.close()


def test_hosts_that_never_authenticate_cannot_lock_out_a_token_holder(start_daemon, token_file):
    d = start_daemon(None, "--token-file", token_file, "--max-connections", "16")
    held = [_connect_from(f"127.0.1.{n}", d.port) for n in range(1, 9) for _ in range(2)]  # 8 hosts x 2: all 16
    try:
        with _connect_from("127.0.0.2", d.port) as holder:
            assert _hello(holder)["ok"] is True
            holder.sendall(b'{"op":"stats"}\n')
            assert json.loads(holder.makefile("rb").readline())["ok"] is True
    finally:
        for s in held:
            s.close()


def test_without_a_token_a_connection_counts_as_unauthenticated_until_its_first_request(start_daemon):
    d = start_daemon(None, "--max-connections", "8")  # pool 6
    held = [_connect_from("127.0.0.1", d.port) for _ in range(6)]
    try:
        with _connect_from("127.0.0.1", d.port) as seventh:
            [reply] = _lines_until_closed(seventh)
        assert "too many unauthenticated connections from 127.0.0.1" in reply["error"]["message"]
        held[-1].sendall(b'{"op":"stats"}\n')
        assert json.loads(held[-1].makefile("rb").readline())["ok"] is True
        with _connect_from("127.0.0.1", d.port) as again:
            again.sendall(b'{"op":"stats"}\n')
            assert json.loads(again.makefile("rb").readline())["ok"] is True
    finally:
        for s in held:
            s.close()


def test_an_ipv6_host_counts_as_its_64_and_a_mapped_ipv4_address_as_that_address():
    from queickd.api.preauth import source_of

    same_host = {source_of(("2001:db8:1:2::5", 9999, 0, 0)), source_of(("2001:db8:1:2:ffff::9", 9999, 0, 0))}
    assert same_host == {"2001:db8:1:2::/64"}
    assert source_of(("2001:db8:1:3::5", 9999, 0, 0)) == "2001:db8:1:3::/64"
    assert source_of(("::ffff:10.0.0.1", 9999, 0, 0)) == source_of(("10.0.0.1", 9999)) == "10.0.0.1"


def test_a_queick_first_byte_alone_does_not_take_a_connection_out_of_the_unauthenticated_shares(start_daemon):
    d = start_daemon(None, "--accept-queick-clients", "--max-connections", "16")  # pool 12, share 2
    held = []
    for _ in range(16):  # a pickle's first bytes and nothing more: no request yet
        s = _connect_from("127.0.0.1", d.port)
        try:
            s.sendall(b"\x80\x02")
        except OSError:
            pass  # refused and closed already
        held.append(s)
        with _connect_from("127.0.0.3", d.port) as marker:  # answered once the loop has read s
            marker.sendall(b'{"op":"stats"}\n')
            assert marker.makefile("rb").readline()
    try:
        with _connect_from("127.0.0.2", d.port) as other_host:
            other_host.sendall(b'{"op":"stats"}\n')
            reply = json.loads(other_host.makefile("rb").readline())
        assert reply["ok"] is True, reply
    finally:
        for s in held:
            s.close()
