"""GET /metrics (checked by the Prometheus client's own parser), /healthz and /jobs/ID."""

from __future__ import annotations

import time

import pytest
from httphelpers import scrape, start_web

pytest.importorskip("prometheus_client.parser", reason="prometheus_client is a test dependency")


@pytest.fixture
def web(start_daemon, tmp_path):
    return start_web(start_daemon, tmp_path, '[hooks.gh]\nfunc = "webjobs:echo"\n')


def test_metrics_count_what_the_test_did(web):
    with web.daemon.client() as q:
        ids = [q.enqueue("testjobs:add", [1, 2]), q.enqueue("testjobs:add", [3, 4]),
               q.enqueue("testjobs:fail", ["no"])]
        for i in ids:
            q.wait(i, 20)
    assert web.post_json("/hooks/gh", {}).status == 202
    m = scrape(web)
    add, fail = (("func", "testjobs:add"),), (("func", "testjobs:fail"),)
    assert m[("queickd_enqueued_total", add)] == 2
    assert m[("queickd_enqueued_total", fail)] == 1
    assert m[("queickd_completed_total", add)] == 2
    assert m[("queickd_failed_total", fail)] == 1
    assert m[("queickd_job_run_duration_seconds_count", add)] == 2
    assert m[("queickd_job_run_duration_seconds_bucket", (("func", "testjobs:add"), ("le", "+Inf")))] == 2
    assert m[("queickd_webhook_deliveries_total", (("hook", "gh"),))] == 1
    assert m[("queickd_jobs", (("state", "dead"),))] == 1
    assert m[("queickd_dead_letters", (("kind", "job"),))] == 1
    assert m[("queickd_workers", (("state", "idle"),))] + m[("queickd_workers", (("state", "busy"),))] == 4
    assert m[("queickd_scheduler_up", ())] == 1
    assert m[("queickd_running_without_worker", ())] == 0
    assert m[("queickd_outbox_pending_events", ())] == 0


def test_metrics_show_how_long_the_oldest_job_has_waited(start_daemon, tmp_path):
    web = start_web(start_daemon, tmp_path, workers=0)  # nothing runs: jobs wait
    with web.daemon.client() as q:
        q.enqueue("testjobs:noop", run_at=time.time() - 120)
        q.enqueue("testjobs:noop", run_at=time.time() - 300, key="door")
        q.enqueue("testjobs:noop", key="door")
    m = scrape(web)
    assert m[("queickd_oldest_queued_seconds", ())] >= 300
    assert m[("queickd_key_waiting_jobs", (("key", "door"),))] == 2
    assert m[("queickd_key_oldest_waiting_seconds", (("key", "door"),))] >= 300
    assert m[("queickd_jobs", (("state", "queued"),))] == 3


def test_metrics_show_each_pools_workers_and_waiting_jobs(start_daemon, tmp_path):
    web = start_web(start_daemon, tmp_path, 'pool = ["a"]\n', workers=3)
    with web.daemon.client() as q:
        q.enqueue("testjobs:noop", pool="gpu")  # no worker serves gpu: it waits
    m = scrape(web)
    assert m[("queickd_pool_workers", (("pool", "a"),))] == 3
    assert m[("queickd_pool_waiting_jobs", (("pool", "a"),))] == 0
    assert m[("queickd_pool_workers", (("pool", "gpu"),))] == 0
    assert m[("queickd_pool_waiting_jobs", (("pool", "gpu"),))] == 1


def test_metrics_show_a_drain_from_its_start_to_its_end(web):
    assert scrape(web)[("queickd_draining", ())] == 0
    with web.daemon.client() as q:
        q.drain(0)
        assert scrape(web)[("queickd_draining", ())] == 1
        q.drain(off=True)
    assert scrape(web)[("queickd_draining", ())] == 0


def test_metric_labels_carry_any_key_name_intact(start_daemon, tmp_path):
    web = start_web(start_daemon, tmp_path, workers=0)
    key = 'door "A"\\1\nnext'
    with web.daemon.client() as q:
        q.enqueue("testjobs:noop", key=key)
    assert scrape(web)[("queickd_key_waiting_jobs", (("key", key),))] == 1


def test_metrics_show_the_network_checker_and_its_state(start_daemon, tmp_path):
    web = start_web(start_daemon, tmp_path, "", "--ping-host", "127.0.0.1:1")  # nothing listens on 1
    web.daemon.wait_for_line("network is down")
    m = scrape(web)
    assert m[("queickd_network_checker_up", ())] == 1
    assert m[("queickd_network_up", ())] == 0


def test_healthz_is_200_while_store_and_scheduler_answer(web):
    r = web.get("/healthz")
    assert (r.status, r.body) == (200, b"ok\n")


def test_healthz_turns_503_when_the_scheduler_thread_stops(web):
    with web.daemon.client() as q:
        job = q.wait(q.enqueue("webjobs:stop_scheduler"), 20)
    assert job["result"] == 1
    r = web.get("/healthz")
    assert r.status == 503
    assert b"scheduler" in r.body
    assert scrape(web)[("queickd_scheduler_up", ())] == 0


def test_jobs_id_returns_the_job_as_json(web):
    with web.daemon.client() as q:
        job_id = q.enqueue("testjobs:add", [2, 3])
        q.wait(job_id, 20)
    r = web.get(f"/jobs/{job_id}")
    assert r.status == 200
    job = r.json()["job"]
    assert (job["id"], job["state"], job["result"]) == (job_id, "succeeded", 5)


def test_jobs_id_of_an_unknown_job_is_404(web):
    assert web.get("/jobs/999999").status == 404
    assert web.get("/jobs/abc").status == 404


def test_unknown_path_is_404_and_other_methods_405(web):
    assert web.get("/nothing").status == 404
    assert web.request("DELETE", "/jobs/1").status == 405
