"""POST /hooks/NAME against a real daemon: every reply code a sender can act on."""

from __future__ import annotations

import base64
import http.client
import json
import socket
import time

import pytest
from httphelpers import sign, start_web

HOOK = '[hooks.gh]\nfunc = "webjobs:echo"\n'


@pytest.fixture
def web(start_daemon, tmp_path):
    return start_web(start_daemon, tmp_path, HOOK)


def test_delivery_becomes_a_job_called_with_the_body_and_headers(web):
    r = web.post_json("/hooks/gh", {"action": "opened"},
                      {"Authorization": "Bearer secret", "Cookie": "a=b", "X-Event": "push"})
    assert r.status == 202
    job_id = r.json()["job_id"]
    with web.daemon.client() as q:
        job = q.wait(job_id, 20)
    assert job["state"] == "succeeded"
    arg = job["result"]
    assert arg["hook"] == "gh"
    assert arg["json"] == {"action": "opened"}
    assert arg["headers"]["X-Event"] == "push"
    assert not {"authorization", "cookie"} & {k.lower() for k in arg["headers"]}


def test_non_json_body_is_passed_as_base64_with_its_content_type(web):
    body = b"\x00\x01binary\xff"
    r = web.request("POST", "/hooks/gh", body, {"Content-Type": "application/octet-stream"})
    assert r.status == 202
    with web.daemon.client() as q:
        arg = q.wait(r.json()["job_id"], 20)["result"]
    assert base64.b64decode(arg["body_b64"]) == body
    assert arg["content_type"] == "application/octet-stream"
    assert "json" not in arg


@pytest.mark.parametrize("header", ["X-Delivery-Id", "X-GitHub-Delivery", "Idempotency-Key"])
def test_repeated_delivery_answers_200_with_the_first_job(web, header):
    first = web.post_json("/hooks/gh", {"n": 1}, {header: "d-1"})
    again = web.post_json("/hooks/gh", {"n": 1}, {header: "d-1"})
    other = web.post_json("/hooks/gh", {"n": 2}, {header: "d-2"})
    assert (first.status, again.status, other.status) == (202, 200, 202)
    assert again.json()["job_id"] == first.json()["job_id"]
    assert again.json()["duplicate"] is True
    assert other.json()["job_id"] != first.json()["job_id"]


def test_configured_idempotency_header_names_the_delivery(start_daemon, tmp_path):
    web = start_web(start_daemon, tmp_path, HOOK + 'idempotency_header = "X-Stripe-Id"\n')
    first = web.post_json("/hooks/gh", {}, {"X-Stripe-Id": "evt_1"})
    again = web.post_json("/hooks/gh", {}, {"X-Stripe-Id": "evt_1"})
    assert (first.status, again.status) == (202, 200)
    assert again.json()["job_id"] == first.json()["job_id"]


@pytest.mark.parametrize("header", ["X-Api-Key", "Api-Key", "X-Auth", "X-Secret", "X-Auth-Token",
                                    "X-Webhook-Signature", "X-Password", "Set-Cookie", "X-SECRET-VALUE"])
def test_headers_named_like_credentials_are_never_stored(web, header):
    r = web.post_json("/hooks/gh", {"a": 1}, {header: "s3cr3t-value", "X-Event": "push"})
    assert r.status == 202
    with web.daemon.client() as q:
        job = q.wait(r.json()["job_id"], 20)
        got = q.get(job["id"])
    assert job["result"]["headers"]["X-Event"] == "push"
    assert header.lower() not in {k.lower() for k in job["result"]["headers"]}
    assert "s3cr3t-value" not in json.dumps(got)
    assert b"s3cr3t-value" not in web.get(f"/jobs/{job['id']}").body


def test_a_delivery_id_in_a_header_named_like_a_credential_still_deduplicates(start_daemon, tmp_path):
    web = start_web(start_daemon, tmp_path, HOOK + 'idempotency_header = "X-Delivery-Token"\n')
    first = web.post_json("/hooks/gh", {}, {"X-Delivery-Token": "evt_1"})
    again = web.post_json("/hooks/gh", {}, {"X-Delivery-Token": "evt_1"})
    assert (first.status, again.status) == (202, 200)
    assert again.json()["job_id"] == first.json()["job_id"]
    with web.daemon.client() as q:
        job = q.wait(first.json()["job_id"], 20)
    assert "x-delivery-token" not in {k.lower() for k in job["result"]["headers"]}


def test_unknown_hook_is_404(web):
    r = web.post_json("/hooks/nope", {})
    assert r.status == 404
    assert r.json()["error"]["code"] == "not_found"


def test_body_that_does_not_parse_is_400_and_no_job(web):
    r = web.request("POST", "/hooks/gh", b"{not json", {"Content-Type": "application/json"})
    assert r.status == 400
    with web.daemon.client() as q:
        assert q.jobs() == []


def test_json_with_a_lone_surrogate_is_400(web):
    r = web.request("POST", "/hooks/gh", b'{"a": "\\ud800"}', {"Content-Type": "application/json"})
    assert r.status == 400


def test_body_over_the_limit_is_413_decided_from_content_length(start_daemon, tmp_path):
    web = start_web(start_daemon, tmp_path, HOOK + "max_body = 100\n")
    # Announce 10 MB and send none of it: the answer must come without the body being read.
    with socket.create_connection((web.host, web.port), timeout=10) as s:
        s.sendall(b"POST /hooks/gh HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 10000000\r\n\r\n")
        head = s.makefile("rb").readline()
    assert head.split()[1] == b"413"
    assert web.post_json("/hooks/gh", {"fits": "x" * 50}).status == 202


def test_expect_100_continue_invites_a_body_within_the_limit(web):
    body = b'{"big": "' + b"x" * 2000 + b'"}'
    with socket.create_connection((web.host, web.port), timeout=10) as s:
        s.sendall(b"POST /hooks/gh HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
        f = s.makefile("rb")
        assert f.readline().split()[1] == b"100"
        assert f.readline() == b"\r\n"
        s.sendall(body)
        assert f.readline().split()[1] == b"202"


def test_expect_100_continue_over_the_limit_is_answered_413_without_inviting_the_body(start_daemon, tmp_path):
    web = start_web(start_daemon, tmp_path, HOOK + "max_body = 100\n")
    with socket.create_connection((web.host, web.port), timeout=10) as s:
        s.sendall(b"POST /hooks/gh HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Expect: 100-continue\r\nContent-Length: 5000\r\n\r\n")
        assert s.makefile("rb").readline().split()[1] == b"413"


def test_missing_content_length_is_411(web):
    with socket.create_connection((web.host, web.port), timeout=10) as s:
        s.sendall(b"POST /hooks/gh HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\r\n")
        head = s.makefile("rb").readline()
    assert head.split()[1] == b"411"


@pytest.fixture
def signed(start_daemon, tmp_path):
    secret = tmp_path / "gh.secret"
    secret.write_text("s3cret\n")
    return start_web(start_daemon, tmp_path, HOOK + f'secret_file = "{secret}"\n')


def test_signed_hook_refuses_a_missing_signature_with_401(signed):
    r = signed.post_json("/hooks/gh", {"a": 1})
    assert r.status == 401
    assert r.json()["error"]["code"] == "unauthorized"


def test_signed_hook_refuses_a_wrong_signature_with_401(signed):
    body = b'{"a": 1}'
    r = signed.request("POST", "/hooks/gh", body, {"Content-Type": "application/json",
                                                   "X-Hub-Signature-256": sign(b"other", body)})
    assert r.status == 401


def test_signed_hook_accepts_the_right_signature(signed):
    body = b'{"a": 1}'
    r = signed.request("POST", "/hooks/gh", body, {"Content-Type": "application/json",
                                                   "X-Hub-Signature-256": sign(b"s3cret", body)})
    assert r.status == 202


def test_full_key_answers_429_with_retry_after_and_a_retry_after_that_time_is_accepted(start_daemon, tmp_path):
    # No workers: the first delivery stays waiting and fills its key.
    web = start_web(start_daemon, tmp_path, 'max-queued-per-key = 1\n' + HOOK + 'key = "gh"\n', workers=0)
    first = web.post_json("/hooks/gh", {"n": 1})
    refused = web.post_json("/hooks/gh", {"n": 2})
    assert first.status == 202
    assert refused.status == 429
    assert refused.json()["error"]["code"] == "queue_full"
    retry_after = int(refused.headers["retry-after"])
    assert retry_after >= 1
    with web.daemon.client() as q:
        assert len(q.jobs()) == 1  # refused means not stored
        q.cancel(first.json()["job_id"])  # the key drains
    time.sleep(retry_after)  # a well-behaved sender waits as told; this is what is under test
    again = web.post_json("/hooks/gh", {"n": 2})
    assert again.status == 202


def test_full_queue_answers_429(start_daemon, tmp_path):
    web = start_web(start_daemon, tmp_path, 'max-queued = 1\n' + HOOK, workers=0)
    assert web.post_json("/hooks/gh", {}).status == 202
    r = web.post_json("/hooks/gh", {})
    assert r.status == 429
    assert "retry-after" in r.headers


def test_daemon_with_http_stops_cleanly_on_sigterm_with_a_connection_open(web):
    conn = http.client.HTTPConnection(web.host, web.port, timeout=10)
    conn.request("GET", "/healthz")
    assert conn.getresponse().read() == b"ok\n"  # the connection stays open (keep-alive)
    try:
        assert web.daemon.terminate() == 0
    finally:
        conn.close()
    web.daemon.wait_for_line("stopped")
