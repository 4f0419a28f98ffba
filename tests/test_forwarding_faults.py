"""What an edge daemon does when its upstream refuses it: a revoked token stops forwarding
loudly with every job held; a job the central refuses is dead on the edge with the
central's reason while the others go on; a certificate that does not verify lets nothing
through. And forwarding over TLS with a named token."""

from __future__ import annotations

import pytest
from forwardhelpers import NONE_HELD, central_keys, edge_config
from linkproxy import LinkProxy
from tlshelpers import make_certs

from queickd.core.protocol import QueueError


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def tokens(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("terminal-1:t1-secret\nterminal-2:t2-secret\n")
    return path


def _start(start_daemon, tmp_path, central_flags=(), extra="", scheme="queickd", functions=("testjobs:*",)):
    central = start_daemon(f"sqlite:///{tmp_path / 'central.db'}", *central_flags)
    proxy = LinkProxy(central.port)
    edge = start_daemon(f"sqlite:///{tmp_path / 'edge.db'}", "--config",
                        edge_config(tmp_path / "edge.toml", proxy, extra=extra, scheme=scheme, functions=functions))
    return central, proxy, edge


def test_a_refused_token_stops_forwarding_loudly_and_keeps_every_job_held(start_daemon, tmp_path, tokens):
    (tmp_path / "edge-token").write_text("revoked-secret\n")
    central, proxy, edge = _start(start_daemon, tmp_path, ("--token-file", str(tokens)),
                                  extra=f'token_file = "{tmp_path / "edge-token"}"\n')
    with edge.client() as q:
        ids = [q.enqueue("testjobs:noop") for _ in range(3)]
        edge.wait_for_line(r"ERROR.*forwarding to .* stopped, 3 job\(s\) held: the upstream refuses our token")
        assert {q.get(i)["state"] for i in ids} == {"held"}
        assert q.stats()["upstream"]["link"] == "unauthorized"
    assert central_keys(tmp_path / "central.db") == {}
    proxy.close()


def test_an_unreadable_token_file_stops_forwarding_as_unauthorized_not_down(start_daemon, tmp_path):
    missing = tmp_path / "no-such-token"
    central, proxy, edge = _start(start_daemon, tmp_path, extra=f'token_file = "{missing}"\n')
    with edge.client() as q:
        job_id = q.enqueue("testjobs:noop")
        edge.wait_for_line(r"ERROR.*forwarding to .* stopped, 1 job\(s\) held: the upstream token_file cannot be used: cannot read")
        assert q.get(job_id)["state"] == "held"
        assert q.stats()["upstream"]["link"] == "unauthorized"
    assert central_keys(tmp_path / "central.db") == {}
    proxy.close()


def test_a_job_the_central_refuses_is_dead_on_the_edge_with_its_reason_and_the_rest_go_on(start_daemon, tmp_path):
    central, proxy, edge = _start(start_daemon, tmp_path, functions=("testjobs:*", "os:*"))
    with edge.client() as q:
        before = q.enqueue("testjobs:noop")
        refused = q.enqueue("os:getpid")  # a standard module: the central never runs it
        after = q.enqueue("testjobs:noop")
        edge.wait_for_line(NONE_HELD)
        job = q.get(refused)
    assert (job["state"], job["error"]["type"]) == ("dead", "not_allowed")
    assert sorted(central_keys(tmp_path / "central.db")) == [before, after]
    with edge.client() as q, pytest.raises(QueueError, match="for the upstream"):
        q.retry(refused)  # it would run here, where it never runs
    proxy.close()


def test_a_central_certificate_that_does_not_verify_lets_nothing_through(start_daemon, tmp_path, certs):
    central, proxy, edge = _start(start_daemon, tmp_path, ("--tls-cert", certs.server_cert, "--tls-key",
                                                          certs.server_key),
                                  extra=f'ca_file = "{certs.other_ca}"\n', scheme="queickd+tls")
    with edge.client() as q:
        job_id = q.enqueue("testjobs:noop")
        edge.wait_for_line(r"ERROR.*forwarding to .* stopped.*certificate does not verify")
        assert q.get(job_id)["state"] == "held"
        assert q.stats()["upstream"]["link"] == "certificate_rejected"
    assert central_keys(tmp_path / "central.db") == {}
    proxy.close()


def test_an_edge_forwards_over_tls_with_its_named_token(start_daemon, tmp_path, certs, tokens):
    (tmp_path / "edge-token").write_text("t2-secret\n")
    central, proxy, edge = _start(
        start_daemon, tmp_path, ("--tls-cert", certs.server_cert, "--tls-key", certs.server_key,
                                 "--token-file", str(tokens)),
        extra=f'ca_file = "{certs.ca}"\ntoken_file = "{tmp_path / "edge-token"}"\n', scheme="queickd+tls")
    with edge.client() as q:
        job = q.wait(q.enqueue("testjobs:add", (4, 5)), timeout=20)
    assert job["result"] == 9
    central.wait_for_line(r"terminal-2")  # the central knows which device sent it
    proxy.close()
