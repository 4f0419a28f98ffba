"""TLS on the TCP port and named tokens: who can connect, who is refused, and what a
revocation (a line removed from the token file, then SIGHUP) does to a live device. Real
daemons, real certificates (made with openssl), real TLS sockets on loopback."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import socket
import subprocess
import sys

import pytest
from helpers import JOBS_DIR
from tlshelpers import make_certs

from queickd import JobQueue
from queickd.aclient import AsyncJobQueue
from queickd.cli import EX_CONFIG
from queickd.core.protocol import QueueError


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


def tls_flags(certs, *extra: str) -> tuple[str, ...]:
    return ("--tls-cert", certs.server_cert, "--tls-key", certs.server_key, *extra)


@pytest.fixture
def tokens(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("# devices\nkitchen:k1tchen-secret\nporch:p0rch-secret\n")
    return path


def test_a_client_trusting_the_ca_enqueues_over_tls(start_daemon, certs):
    d = start_daemon(None, *tls_flags(certs))
    with JobQueue("127.0.0.1", d.port, tls=certs.ca) as q:
        job_id = q.enqueue("testjobs:add", (1, 2))
        assert q.wait(job_id)["result"] == 3
        assert q._sock.version() is not None  # the requests went over TLS


def test_a_client_without_the_ca_cannot_connect(start_daemon, certs):
    d = start_daemon(None, *tls_flags(certs))
    other = JobQueue("127.0.0.1", d.port, tls=certs.other_ca)
    with pytest.raises(ConnectionError, match="certificate verify failed"):
        other.enqueue("testjobs:noop")
    assert d.client(tls=certs.ca).enqueue("testjobs:noop") > 0  # the same port, trusting the CA


def test_plaintext_to_a_tls_port_fails_fast(start_daemon, certs):
    d = start_daemon(None, *tls_flags(certs))
    q = JobQueue("127.0.0.1", d.port, timeout=5, connect_timeout=5)  # bounds a hang; a fail-fast never nears it
    with pytest.raises(QueueError, match="this port speaks TLS") as e:
        q.stats()
    assert e.value.code == "bad_request"


def test_a_tls_client_to_a_plaintext_port_fails_fast(start_daemon, certs):
    d = start_daemon()
    q = JobQueue("127.0.0.1", d.port, tls=certs.ca, timeout=5, connect_timeout=5)
    with pytest.raises(ConnectionError, match="TLS with queickd") as e:
        q.stats()
    assert "timed out" not in str(e.value)  # the daemon answered at once, not at its hello timeout


def test_mutual_tls_refuses_a_client_without_a_certificate(start_daemon, certs):
    d = start_daemon(None, *tls_flags(certs, "--tls-client-ca", certs.ca))
    with pytest.raises(ConnectionError):
        JobQueue("127.0.0.1", d.port, tls=certs.ca, timeout=10).stats()
    with JobQueue("127.0.0.1", d.port, tls=certs.client_context(with_cert=True)) as q:
        assert q.wait(q.enqueue("testjobs:add", (2, 3)))["result"] == 5


def test_a_revoked_named_token_is_refused_while_the_others_keep_working(start_daemon, tokens):
    d = start_daemon(None, "--token-file", str(tokens))
    kitchen, porch = d.client(token="k1tchen-secret"), d.client(token="p0rch-secret")
    kitchen.enqueue("testjobs:noop")
    porch.enqueue("testjobs:noop")
    tokens.write_text("# devices\nporch:p0rch-secret\n")
    d.proc.send_signal(signal.SIGHUP)
    d.wait_for_line(r"closed a connection of the revoked token kitchen")
    with pytest.raises(QueueError, match="bad or missing token"):
        kitchen.enqueue("testjobs:noop")  # its live connection is gone; a new one is refused
    assert porch.enqueue("testjobs:noop") > 0  # its connection was kept, and serves on
    by_name = {t["name"]: t for t in porch.stats()["tokens"]}
    assert by_name["kitchen"]["revoked"] and not by_name["porch"]["revoked"]
    assert by_name["porch"]["connections"] == 1  # the same connection throughout


def test_a_bare_token_file_keeps_working(start_daemon, tmp_path):
    path = tmp_path / "token"
    path.write_text("s3cret\n")
    d = start_daemon(None, "--token-file", str(path))
    with pytest.raises(QueueError, match="bad or missing token"):
        d.client(token="wrong").stats()
    with d.client(token="s3cret") as q:
        assert q.enqueue("testjobs:noop") > 0
        assert q.server_info["token_name"] == "default"


def test_the_token_name_is_logged_with_what_it_enqueued(start_daemon, tokens):
    d = start_daemon(None, "--token-file", str(tokens))
    job_id = d.client(token="p0rch-secret").enqueue("testjobs:add", (1, 1))
    d.wait_for_line(rf"token porch from 127\.0\.0\.1 enqueued job\(s\) {job_id}: testjobs:add")


def test_status_shows_token_names(start_daemon, tokens, tmp_path):
    d = start_daemon(None, "--token-file", str(tokens))
    with d.client(token="k1tchen-secret") as q:
        q.enqueue_many([q.job("testjobs:noop"), q.job("testjobs:noop")])
    porch = tmp_path / "porch-token"  # the porch device's own file
    porch.write_text("porch:p0rch-secret\n")
    status = [sys.executable, "-m", "queickd", "status", "--port", str(d.port), "--token-file", str(porch)]
    r = subprocess.run(status, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines()[r.stdout.splitlines().index(
        next(line for line in r.stdout.splitlines() if line.startswith("TOKEN"))) + 1:] if line.strip()}
    assert rows["kitchen"][:2] == ["1", "2"]  # connections, enqueued
    assert rows["porch"][:2] == ["1", "0"]  # this status's own connection
    r = subprocess.run([*status, "--json"], capture_output=True, text=True, timeout=60)
    by_name = {t["name"]: t for t in json.loads(r.stdout)["tokens"]}
    assert by_name["kitchen"]["enqueued"] == 2 and by_name["porch"]["connections"] == 2


def test_tls_cert_is_reloaded_on_sighup(start_daemon, certs, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    shutil.copy(certs.client_cert, cert)  # a certificate not for 127.0.0.1: clients refuse it
    shutil.copy(certs.client_key, key)
    d = start_daemon(None, "--tls-cert", str(cert), "--tls-key", str(key))
    with pytest.raises(ConnectionError, match="certificate verify failed|IP address mismatch"):
        JobQueue("127.0.0.1", d.port, tls=certs.ca).stats()
    shutil.copy(certs.server_cert, cert)  # renewed in place, as certbot does
    shutil.copy(certs.server_key, key)
    d.proc.send_signal(signal.SIGHUP)
    d.wait_for_line("TLS certificate reloaded")
    assert JobQueue("127.0.0.1", d.port, tls=certs.ca).enqueue("testjobs:noop") > 0


@pytest.mark.parametrize("flags,message", [
    (lambda c: ("--tls-cert", c.server_cert), "--tls-cert and --tls-key"),
    (lambda c: ("--tls-cert", c.server_cert, "--tls-key", "/no/such/key"), "cannot read --tls-key"),
    (lambda c: ("--tls-cert", c.server_cert, "--tls-key", c.client_key), "does not match --tls-cert"),
    (lambda c: ("--tls-client-ca", c.ca), "--tls-client-ca"),
    (lambda c: ("--tls-cert", c.server_cert, "--tls-key", c.server_key, "--accept-queick-clients"),
     "cannot speak TLS"),
], ids=["cert-without-key", "unreadable-key", "key-not-matching", "client-ca-without-cert",
        "queick-clients-with-tls"])
def test_a_cert_without_its_key_exits_78(certs, tmp_path, flags, message):
    r = subprocess.run([sys.executable, "-m", "queickd", "run", "--port", "0", "--store", "memory://",
                        "--app-dir", str(JOBS_DIR), *flags(certs)], capture_output=True, text=True, timeout=60)
    assert r.returncode == EX_CONFIG and message in r.stderr and "Traceback" not in r.stderr


def test_async_client_over_tls(start_daemon, certs):
    d = start_daemon(None, *tls_flags(certs))

    async def main() -> object:
        q = AsyncJobQueue("127.0.0.1", d.port, tls=certs.ca)
        try:
            return (await q.wait(await q.enqueue("testjobs:add", (4, 5))))["result"]
        finally:
            await q.close()

    assert asyncio.run(main()) == 9


def test_a_plaintext_connection_to_a_tls_port_is_told_before_it_is_closed(start_daemon, certs):
    d = start_daemon(None, *tls_flags(certs))
    with socket.create_connection(("127.0.0.1", d.port), timeout=10) as s:
        s.sendall(b'{"op":"stats"}\n')
        replies = [json.loads(line) for line in s.makefile("rb")]
    assert [r["error"]["code"] for r in replies] == ["bad_request"]


@pytest.mark.parametrize("first", [b"", b"\x16\x03\x01"], ids=["silent", "handshake-begun"])
def test_a_tls_connection_that_does_not_finish_its_handshake_is_closed_at_the_hello_timeout(start_daemon, certs,
                                                                                            first):
    d = start_daemon(None, *tls_flags(certs, "--hello-timeout", "1"))
    with socket.create_connection(("127.0.0.1", d.port), timeout=30) as s:  # bounds a hang only
        s.sendall(first)
        assert s.recv(1024) == b""  # closed by the daemon, unanswered
