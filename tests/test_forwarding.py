"""An edge daemon forwards the jobs of its upstream's functions to a central daemon: held
while the link is down, sent when it is up, each once, and shown on the edge as the
central has them. Two real daemons on loopback; a LinkProxy is the link."""

from __future__ import annotations

import pytest
from forwardhelpers import NONE_HELD, central_keys, central_order, edge_ids, held_count, start_edge
from linkproxy import REFUSE


@pytest.fixture
def edge(start_daemon, tmp_path, proxy):
    return start_edge(start_daemon, tmp_path, proxy)


def test_a_job_of_an_upstream_function_runs_on_the_central_and_its_result_is_read_on_the_edge(edge, central):
    with edge.client() as q:
        job_id = q.enqueue("testjobs:add", (2, 3))
        job = q.wait(job_id, timeout=20)
    assert (job["state"], job["result"]) == ("succeeded", 5)
    assert job["upstream"]["id"] > 0
    with central.client() as c:
        assert c.get(job["upstream"]["id"])["result"] == 5


def test_a_job_of_another_function_runs_on_the_edge(start_daemon, tmp_path, proxy):
    edge = start_edge(start_daemon, tmp_path, proxy, functions=("other:*",))
    with edge.client() as q:
        job = q.wait(q.enqueue("testjobs:add", (1, 1)), timeout=20)
    assert (job["state"], job["result"], job.get("upstream_id")) == ("succeeded", 2, None)


def test_jobs_enqueued_while_the_link_is_down_are_held_then_forwarded_once_in_order(edge, proxy, tmp_path):
    proxy.set(REFUSE)
    with edge.client() as q:
        ids = [q.enqueue("testjobs:noop", key="badge-7") for _ in range(20)]
        assert {q.get(i)["state"] for i in ids} == {"held"}
        assert held_count(q, 20) == 20
    proxy.set("pass")
    edge.wait_for_line(NONE_HELD, timeout=20)
    copies = central_keys(tmp_path / "central.db")
    assert copies == dict.fromkeys(ids, 1)
    assert central_order(tmp_path / "central.db") == ids
    assert set(edge_ids(tmp_path / "edge.db").values()) <= {"forwarded", "succeeded"}


def test_a_forwarded_job_shows_the_centrals_state_in_get_and_queick_show(edge, central):
    import subprocess
    import sys

    with edge.client() as q:
        job_id = q.enqueue("testjobs:noop", delay=3600)  # waits on the central, scheduled
        job = q.wait(job_id, timeout=20, states=["scheduled"])
    assert job["state"] == "scheduled" and job["upstream"]["state"] == "scheduled"
    with central.client() as c:
        assert c.get(job["upstream"]["id"])["run_at"] == pytest.approx(job["run_at"], abs=1)
    out = subprocess.run([sys.executable, "-m", "queickd", "show", str(job_id), "--port", str(edge.port)],
                         capture_output=True, text=True, timeout=30).stdout
    assert "state: scheduled" in out and f'"id": {job["upstream"]["id"]}' in out


def test_a_job_dead_on_the_central_is_dead_on_the_edge_with_its_error(edge):
    with edge.client() as q:
        job_id = q.enqueue("testjobs:fail", ("no ink",))
        job = q.wait(job_id, timeout=20)
        listed = q.jobs("dead")
    assert (job["state"], job["error"]["type"], job["error"]["message"]) == ("dead", "ValueError", "no ink")
    assert [j["id"] for j in listed] == [job_id]  # settled here: listed without asking the central
