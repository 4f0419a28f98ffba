"""What /metrics and `queick status` show of a fleet on PostgreSQL: pools, their live
workers and their waiting jobs, read from the worker registry. A daemon with its HTTP
listener and an external `queick worker` as real processes; skips without a server."""

from __future__ import annotations

import subprocess
import sys

import pytest
from fleethelpers import WorkerProcess
from httphelpers import scrape, start_web

from queickd.core.job import State

pytest.importorskip("prometheus_client.parser", reason="prometheus_client is a test dependency")

HEARTBEAT = 0.5
GPU = (("pool", "gpu"),)


def status(port: int) -> list[str]:
    r = subprocess.run([sys.executable, "-m", "queickd", "status", "--port", str(port)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def pool_line(lines: list[str], pool: str) -> list[str]:
    return next(line for line in lines if line.split()[:1] == [pool]).split()


def test_a_pool_shows_no_workers_until_an_external_worker_serves_it(pg_fresh_database, start_daemon,
                                                                    tmp_path, gate):
    url = pg_fresh_database
    web = start_web(start_daemon, tmp_path, "", "--heartbeat", str(HEARTBEAT), store_url=url, workers=0)
    with web.daemon.client() as q:
        held = q.enqueue("testjobs:gate", [gate.port, "held"], pool="gpu")
        quick = [q.enqueue("testjobs:add", [i, 1], pool="gpu") for i in range(3)]

        m = scrape(web)
        assert m[("queickd_pool_workers", GPU)] == 0
        assert m[("queickd_pool_waiting_jobs", GPU)] == 4
        assert pool_line(status(web.daemon.port), "gpu") == ["gpu", "4", "0", "NO", "LIVE", "WORKER:", "its",
                                                             "jobs", "wait"]

        worker = WorkerProcess(url, "gpu", workers=2, heartbeat=HEARTBEAT).start()
        try:
            assert gate.arrival() == "held"  # the worker took the first job and holds it
            assert [q.wait(i, 30)["result"] for i in quick] == [1, 2, 3]
            m = scrape(web)
            assert m[("queickd_pool_workers", GPU)] == 2
            assert m[("queickd_pool_waiting_jobs", GPU)] == 0
            assert m[("queickd_jobs", (("state", State.RUNNING),))] == 1
            # held by a live worker of another process: not a job without a worker
            assert m[("queickd_running_without_worker", ())] == 0
            lines = status(web.daemon.port)
            assert pool_line(lines, "gpu") == ["gpu", "0", "2"]
            assert any(f":{worker.pid} pools gpu" in line and line.endswith("alive") for line in lines)
            gate.release_all()
            assert q.wait(held, 30)["state"] == State.SUCCEEDED
        finally:
            worker.close()


def test_with_workers_0_the_last_hour_counts_the_external_workers_runs(pg_fresh_database, start_daemon, tmp_path):
    url = pg_fresh_database
    web = start_web(start_daemon, tmp_path, "", "--heartbeat", str(HEARTBEAT), store_url=url, workers=0)
    worker = WorkerProcess(url, "default", workers=2, heartbeat=HEARTBEAT).start()
    try:
        with web.daemon.client() as q:
            ok = [q.enqueue("testjobs:add", [i, 1]) for i in range(4)]
            bad = q.enqueue("testjobs:fail")
            assert [q.wait(i, 30)["result"] for i in ok] == [1, 2, 3, 4]
            assert q.wait(bad, 30)["state"] == State.DEAD
            # The worker wrote its counts in the transaction of its last finish, before the
            # finish was announced: once every job is waited for, they are all in the store.
            hour = q.stats()["last_hour"]
            assert (hour["completed"], hour["failed"]) == (4, 1)
            (m,) = hour["members"]
            assert m["member"].endswith(f":{worker.pid}") and (m["completed"], m["failed"]) == (4, 1)
            assert hour["seconds"] >= 0
            history = q.stats(detail=True)["history"]
            assert sum(h["completed"] for h in history) == 4 and sum(h["failed"] for h in history) == 1
        lines = status(web.daemon.port)
        assert any("5 in the last hour (1 failed)" in line for line in lines)
        metrics = scrape(web)
        label = (("member", m["member"]), ("result", "completed"))
        assert metrics[("queickd_fleet_runs_last_hour", label)] == 4
        assert ("queickd_fleet_run_seconds_last_hour", (("member", m["member"]),)) in metrics
    finally:
        worker.close()
