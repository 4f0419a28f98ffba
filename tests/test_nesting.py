"""Nesting is bounded where a request is decoded: a job the daemon acknowledges can always be
read back, by every path that shows it, and deeper requests are refused as bad_request."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from httphelpers import Web, start_web

from queickd.core.protocol import MAX_DEPTH


def nested(levels: int) -> list:
    """A list nesting `levels` levels deep: nested(1) == [0]."""
    v: list = [0]
    for _ in range(levels - 1):
        v = [v]
    return v


# The request object is one level and its args list another; the rest is the args' content.
DEEPEST_ARG = nested(MAX_DEPTH - 2)


def raw(port: int, request: dict | str) -> dict:
    line = request if isinstance(request, str) else json.dumps(request)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(line.encode() + b"\n")
        return json.loads(s.makefile("rb").readline())


@pytest.fixture(params=["sqlite", "postgres"])
def deep(request, start_daemon, tmp_path):
    """A daemon with its HTTP listener, holding a dead job whose args nest as deep as a
    request may: (web, job id)."""
    store = None if request.param == "sqlite" else request.getfixturevalue("pg_url")
    web = start_web(start_daemon, tmp_path, store_url=store)
    reply = raw(web.daemon.port, {"op": "enqueue", "func": "testjobs:fail", "args": [DEEPEST_ARG]})
    assert reply["ok"], reply
    with web.daemon.client() as q:
        assert q.wait(reply["job_id"], 20)["state"] == "dead"  # fail() takes no such argument
    return web, reply["job_id"]


def cli(web: Web, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "queickd", *args, "--port", str(web.daemon.port)],
                          capture_output=True, text=True, timeout=30)


def test_get_reads_back_the_deepest_accepted_arguments(deep):
    web, job_id = deep
    with web.daemon.client() as q:
        assert q.get(job_id)["args"] == [DEEPEST_ARG]


def test_wait_returns_the_job_with_the_deepest_accepted_arguments(deep):
    web, job_id = deep
    with web.daemon.client() as q:
        assert q.wait(job_id, 5)["args"] == [DEEPEST_ARG]


def test_jobs_lists_the_job_with_the_deepest_accepted_arguments(deep):
    web, job_id = deep
    with web.daemon.client() as q:
        assert [j["args"] for j in q.jobs() if j["id"] == job_id] == [[DEEPEST_ARG]]


def test_dead_lists_the_job_with_the_deepest_accepted_arguments(deep):
    web, job_id = deep
    with web.daemon.client() as q:
        assert [j["args"] for j in q.dead()["jobs"] if j["id"] == job_id] == [[DEEPEST_ARG]]


def test_queick_show_prints_the_job_with_the_deepest_accepted_arguments(deep):
    web, job_id = deep
    r = cli(web, "show", str(job_id), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["args"] == [DEEPEST_ARG]


def test_queick_jobs_lists_the_job_with_the_deepest_accepted_arguments(deep):
    web, job_id = deep
    r = cli(web, "jobs")
    assert r.returncode == 0, r.stderr
    assert str(job_id) in r.stdout


def test_queick_status_shows_the_dead_job_with_the_deepest_accepted_arguments(deep):
    web, job_id = deep
    r = cli(web, "status")
    assert r.returncode == 0, r.stderr
    assert "testjobs:fail" in r.stdout


def test_http_job_page_serves_the_deepest_accepted_arguments(deep):
    web, job_id = deep
    r = web.get(f"/jobs/{job_id}")
    assert r.status == 200
    assert r.json()["job"]["args"] == [DEEPEST_ARG]


def test_status_page_serves_with_the_deepest_accepted_arguments_stored(deep):
    web, job_id = deep
    r = web.get("/")
    assert r.status == 200 and b"testjobs:fail" in r.body


def test_one_level_deeper_than_the_bound_is_refused_as_bad_request(daemon):
    reply = raw(daemon.port, {"op": "enqueue", "func": "testjobs:noop", "args": [[DEEPEST_ARG]]})
    assert reply["error"]["code"] == "bad_request" and str(MAX_DEPTH) in reply["error"]["message"]
    with daemon.client() as q:
        assert q.jobs() == []


def test_a_hundred_thousand_levels_are_refused_as_bad_request(daemon):
    line = '{"op":"enqueue","func":"testjobs:noop","args":' + "[" * 100_000 + "]" * 100_000 + "}"
    assert raw(daemon.port, line)["error"]["code"] == "bad_request"


def test_deep_nesting_inside_a_batch_is_refused_as_bad_request(daemon):
    jobs = [{"func": "testjobs:noop"}, {"func": "testjobs:noop", "args": [DEEPEST_ARG]}]
    assert raw(daemon.port, {"op": "enqueue_many", "jobs": jobs})["error"]["code"] == "bad_request"


def test_a_webhook_body_nested_too_deep_is_400_and_no_job(start_daemon, tmp_path):
    web = start_web(start_daemon, tmp_path, '[hooks.gh]\nfunc = "webjobs:echo"\n')
    r = web.request("POST", "/hooks/gh", json.dumps(nested(MAX_DEPTH)).encode(),
                    {"Content-Type": "application/json"})
    assert r.status == 400
    with web.daemon.client() as q:
        assert q.jobs() == []


def test_a_result_nested_deeper_than_the_bound_is_not_stored_and_the_job_reads_back(client):
    job = client.wait(client.enqueue("testjobs:nested_result", [600]), 20)
    assert job["state"] == "succeeded" and "not stored" in job["result"]
    assert [j["id"] for j in client.jobs()] == [job["id"]]


def test_a_result_as_deep_as_a_request_may_be_is_stored_whole(client):
    job = client.wait(client.enqueue("testjobs:nested_result", [MAX_DEPTH]), 20)
    assert job["result"] == nested(MAX_DEPTH)
