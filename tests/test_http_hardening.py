"""The HTTP listener against an attacker: strict framing (no request smuggling), a bad
signature header answered 401, credentials never stored with a webhook's job, and the
optional bearer token of the read endpoints, the connection cap and the request deadline.
Real daemon, real sockets."""

from __future__ import annotations

import http.client
import resource
import socket
import time

import pytest
from httphelpers import sign, start_web

from queickd.api.httpd import connection_cap

HOOK = '[hooks.gh]\nfunc = "webjobs:echo"\n'
SIGNED = '[hooks.gh]\nfunc = "webjobs:echo"\nsecret_file = "{secret}"\n'


@pytest.fixture
def web(start_daemon, tmp_path):
    return start_web(start_daemon, tmp_path, HOOK)


def _raw(web, data: bytes) -> bytes:
    """Send raw bytes, read until the server closes (or 10 s pass): every reply it sent."""
    with socket.create_connection((web.host, web.port), timeout=10) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            pass
        return out


def _statuses(raw: bytes) -> list[int]:
    return [int(line.split()[1]) for line in raw.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]


def test_transfer_encoding_with_content_length_is_400_and_the_rest_is_never_served(web):
    smuggled = b"GET /jobs/1 HTTP/1.1\r\nHost: x\r\n\r\n"
    body = b"0\r\n\r\n" + smuggled
    req = (b"POST /hooks/gh HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Transfer-Encoding: chunked\r\nContent-Length: %d\r\n\r\n" % 5) + body
    assert _statuses(_raw(web, req)) == [400]


def test_a_transfer_encoding_alone_is_refused_as_not_implemented(web):
    req = (b"POST /hooks/gh HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
    assert _statuses(_raw(web, req)) == [501]


@pytest.mark.parametrize("length", [b"0_7", b"+5", b" 5x", b"\xd9\xa3", b"-1"])
def test_a_content_length_that_is_not_plain_digits_is_400(web, length):
    req = (b"POST /hooks/gh HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: " + length + b"\r\n\r\n{}")
    assert _statuses(_raw(web, req)) == [400]


def test_a_get_with_a_body_is_answered_and_its_body_never_read_as_a_request(web):
    smuggled = b"GET /jobs/1 HTTP/1.1\r\nHost: x\r\n\r\n"
    req = b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(smuggled) + smuggled
    assert _statuses(_raw(web, req)) == [200]


@pytest.mark.parametrize("header", [b"Content-Length : %d", b"Content-Length\t: %d"])
def test_a_header_with_whitespace_before_its_colon_is_400_and_the_rest_is_never_served(web, header):
    smuggled = b"GET /jobs/1 HTTP/1.1\r\nHost: x\r\n\r\n"
    req = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + header % len(smuggled) + b"\r\n\r\n" + smuggled
    assert _statuses(_raw(web, req)) == [400]


def test_a_transfer_encoding_with_a_space_before_its_colon_is_400(web):
    req = (b"POST /hooks/gh HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Transfer-Encoding : chunked\r\nContent-Length: 2\r\n\r\n{}")
    assert _statuses(_raw(web, req)) == [400]


def test_a_continuation_header_line_is_400_and_the_rest_is_never_served(web):
    smuggled = b"GET /jobs/1 HTTP/1.1\r\nHost: x\r\n\r\n"
    req = (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\r\n Content-Length: %d\r\n\r\n" % len(smuggled)
           + smuggled)
    assert _statuses(_raw(web, req)) == [400]


@pytest.mark.parametrize("job_id", [2**63, 10**19 - 1])
def test_a_job_id_beyond_the_largest_is_404(web, job_id):
    r = web.get(f"/jobs/{job_id}")
    assert (r.status, r.json()["error"]["code"]) == (404, "not_found")


def _closed_within(sock: socket.socket, seconds: float, dribble: bytes) -> bool:
    """Send a byte a second (each read of the server's gets a fresh second); True once the
    server closes the connection, False if it still holds it after `seconds`."""
    end = time.monotonic() + seconds
    sock.settimeout(1.0)
    for byte in dribble * int(seconds + 1):
        if time.monotonic() > end:
            return False
        try:
            sock.sendall(bytes([byte]))
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:  # reset: closed with our bytes unread
            return True
    return False


def test_a_request_dribbled_a_byte_at_a_time_is_cut_off_at_its_deadline(web):
    with socket.create_connection((web.host, web.port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\n")
        assert _closed_within(s, 20.0, b"X-Slow: ")


def test_connections_beyond_the_cap_are_answered_503_and_closed(web):
    cap = connection_cap(resource.getrlimit(resource.RLIMIT_NOFILE)[0])  # the daemon's: inherited
    held = []
    try:
        for i in range(cap):  # each served once, then kept alive: it holds its slot
            # From a host per eighth of the cap: one host alone gets no more past 3/4 of it.
            conn = http.client.HTTPConnection(web.host, web.port, timeout=10,
                                              source_address=(f"127.0.1.{i * 8 // cap + 1}", 0))
            held.append(conn)
            conn.request("GET", "/healthz")
            assert conn.getresponse().read() == b"ok\n"
        with socket.create_connection((web.host, web.port), timeout=10) as extra:
            reply = b""
            while chunk := extra.recv(65536):  # the server closes it at once
                reply += chunk
        assert _statuses(reply) == [503]
    finally:
        for conn in held:
            conn.close()


def test_one_host_holding_every_connection_cannot_keep_another_from_the_http_listener(web):
    cap = connection_cap(resource.getrlimit(resource.RLIMIT_NOFILE)[0])  # the daemon's: inherited
    # Connections that never send a request, each held until its request deadline.
    held = [socket.create_connection((web.host, web.port), timeout=10, source_address=("127.0.0.1", 0))
            for _ in range(cap)]
    try:
        other = http.client.HTTPConnection(web.host, web.port, timeout=10, source_address=("127.0.0.2", 0))
        other.request("GET", "/healthz")
        assert other.getresponse().status == 200
        other.close()
    finally:
        for s in held:
            s.close()


def test_a_non_ascii_signature_header_is_answered_401(start_daemon, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("k3y\n")
    web = start_web(start_daemon, tmp_path, SIGNED.format(secret=secret))
    req = (b"POST /hooks/gh HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"X-Hub-Signature-256: sha256=\xe9\xe9\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
    assert _statuses(_raw(web, req)) == [401]


def test_credential_headers_are_never_stored_with_a_webhook_job(web):
    secrets = {"Authorization": "Bearer a", "Proxy-Authorization": "Basic b", "Cookie": "c=d",
               "X-Gitlab-Token": "e", "X-Token": "f", "X-Hub-Signature": "sha1=g",
               "X-Hub-Signature-256": "sha256=h"}
    r = web.post_json("/hooks/gh", {"a": 1}, {**secrets, "X-Event": "push"})
    assert r.status == 202
    with web.daemon.client() as q:
        job = q.wait(r.json()["job_id"], 20)
    stored = {k.lower() for k in job["result"]["headers"]}
    assert "x-event" in stored and not stored & {k.lower() for k in secrets}
    assert web.get(f"/jobs/{job['id']}").body.count(b"Bearer a") == 0


def test_the_hooks_own_signature_header_is_not_stored(start_daemon, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("k3y\n")
    web = start_web(start_daemon, tmp_path, SIGNED.format(secret=secret) + 'signature_header = "X-Sig"\n')
    body = b'{"a": 1}'
    r = web.request("POST", "/hooks/gh", body, {"Content-Type": "application/json", "X-Sig": sign(b"k3y", body)})
    assert r.status == 202
    with web.daemon.client() as q:
        job = q.wait(r.json()["job_id"], 20)
    assert "x-sig" not in {k.lower() for k in job["result"]["headers"]}


@pytest.fixture
def guarded(start_daemon, tmp_path):
    token = tmp_path / "http.token"
    token.write_text("r3ad\n")
    return start_web(start_daemon, tmp_path, HOOK, "--http-token-file", str(token))


@pytest.mark.parametrize("path", ["/", "/metrics", "/jobs/1"])
def test_with_an_http_token_the_read_endpoints_want_it(guarded, path):
    assert guarded.get(path).status == 401
    assert guarded.request("GET", path, headers={"Authorization": "Bearer wrong"}).status == 401
    assert guarded.request("GET", path, headers={"Authorization": "Bearer r3ad"}).status in (200, 404)


def test_with_an_http_token_healthz_and_the_hooks_stay_open(guarded):
    assert guarded.get("/healthz").status == 200
    assert guarded.post_json("/hooks/gh", {"a": 1}).status == 202
