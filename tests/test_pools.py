"""Worker pools on the one-machine stores: a daemon runs only the pools it serves, and an
operator moves waiting work between pools (logged)."""

import json
import os
import subprocess
import sys

from queickd.core.job import State


def queick(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "queickd", *args], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ), stdin=subprocess.DEVNULL)


def test_a_daemon_runs_only_its_pools_and_pool_set_moves_a_keys_waiting_jobs(start_daemon):
    d = start_daemon(None, "--pool", "a", "--pool", "b")
    with d.client() as q:
        a = q.enqueue("testjobs:add", [1, 2], pool="a")
        elsewhere = q.enqueue("testjobs:add", [3, 4], pool="gpu", key="scan")
        assert q.wait(a, 20)["state"] == State.SUCCEEDED
        assert q.get(elsewhere)["state"] == State.QUEUED
        assert q.stats()["pools"]["gpu"] == {"waiting": 1, "workers": 0}
        shown = queick("stats", "--port", str(d.port)).stdout
        assert "pool gpu: 1 waiting, 0 worker slot(s) alive   NO WORKERS" in shown
        assert "pool a: 0 waiting, 4 worker slot(s) alive" in shown
        r = queick("pool", "set", "scan", "b", "--port", str(d.port), "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {"moved": 1}
        moved = q.wait(elsewhere, 20)
    assert (moved["state"], moved["pool"], moved["result"]) == (State.SUCCEEDED, "b", 7)
    d.wait_for_line(r"operator moved key 'scan' to pool 'b'")


def test_pool_set_needs_exactly_one_target(daemon):
    r = queick("pool", "set", "k", "gpu", "--job", "1", "--port", str(daemon.port))
    assert r.returncode == 2 and "give a KEY" in r.stderr


def test_set_pool_moves_a_cron_and_crons_show_its_pool(start_daemon):
    from queickd import SchedulingTime

    d = start_daemon(None, "--pool", "default")
    with d.client() as q:
        q.cron(SchedulingTime().every(hours=1), "testjobs:noop", name="hourly")
        assert q.set_pool("gpu", cron="hourly") == 1
        (cron,) = q.crons()
    assert (cron["name"], cron["pool"]) == ("hourly", "gpu")
