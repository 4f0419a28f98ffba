"""Concurrency groups and budgets across `queick worker` processes on one PostgreSQL
database: exact limits with several claimers, slots that come back after a worker is
killed, and the budgets in force kept in the database, whatever each claimer was started with."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request

import pytest
from test_resources_daemon import config, peak, runs

from queickd.core.job import State
from queickd.core.protocol import QueueError

HEARTBEAT = 0.5


def pids(path) -> set[int]:
    """The processes that ran the spans of `path`."""
    return {int(line.split()[1]) for line in path.read_text().splitlines()} if path.exists() else set()


def test_three_workers_never_run_more_than_a_groups_limit_and_every_job_once(
        pg_fresh_database, start_daemon, start_worker, tmp_path):
    url = pg_fresh_database
    d = start_daemon(url, "--heartbeat", str(HEARTBEAT), workers=0)
    for _ in range(3):
        start_worker(url, workers=3, heartbeat=HEARTBEAT)
    out = tmp_path / "runs.txt"
    with d.client() as q:
        ids = q.enqueue_many([q.job("testjobs:span", [str(out), f"j{i}", 0.01], concurrency_group="api",
                                    concurrency_limit=3) for i in range(300)])
        for i in ids:
            assert q.wait(i, 120)["state"] == State.SUCCEEDED
    spans = runs(out)
    assert sorted(t for t, _, _ in spans) == sorted(f"j{i}" for i in range(300))  # each once
    assert peak([(s, e, 1) for _, s, e in spans]) <= 3


def test_a_killed_workers_group_slots_come_back_after_the_heartbeat_window(
        pg_fresh_database, start_daemon, start_worker, gate, tmp_path):
    url = pg_fresh_database
    d = start_daemon(url, "--heartbeat", str(HEARTBEAT), workers=0)  # sweeps for orphans
    doomed = start_worker(url, workers=4, heartbeat=HEARTBEAT)
    out = tmp_path / "runs.txt"
    with d.client() as q:
        held = [q.enqueue("testjobs:gate", [gate.port, f"g{i}"], concurrency_group="api", concurrency_limit=2)
                for i in range(2)]
        assert {gate.arrival(), gate.arrival()} == {"g0", "g1"}  # both slots taken
        behind = [q.enqueue("testjobs:span", [str(out), f"s{i}", 0.01], concurrency_group="api",
                            concurrency_limit=2) for i in range(4)]
        doomed.proc.send_signal(signal.SIGKILL)
        doomed.proc.wait(10)
        for conn in gate.held:  # the dead worker's connections
            conn.close()
        gate.held.clear()
        start_worker(url, workers=4, heartbeat=HEARTBEAT)  # the rescuer
        # The orphans get their slots back first (they lead the queue); the jobs behind
        # them do not run while both slots are held.
        assert {gate.arrival(30), gate.arrival(30)} == {"g0", "g1"}
        assert runs(out) == []
        assert [q.get(i)["state"] for i in behind] == [State.QUEUED] * 4
        gate.release_all()
        for i in behind:
            assert q.wait(i, 30)["state"] == State.SUCCEEDED
        finished = [q.wait(i, 30) for i in held]
    assert [(j["state"], j["attempts"], j["orphaned"]) for j in finished] == [(State.SUCCEEDED, 2, 1)] * 2
    assert sorted(t for t, _, _ in runs(out)) == ["s0", "s1", "s2", "s3"]


def test_queick_workers_apply_the_budgets_of_their_config_file(pg_fresh_database, start_daemon, start_worker,
                                                               tmp_path):
    url = pg_fresh_database
    cfg = tmp_path / "queickd.toml"
    cfg.write_text("[budgets.pools]\ndefault = 3\n")
    d = start_daemon(url, "--heartbeat", str(HEARTBEAT), workers=0)
    for _ in range(2):
        start_worker(url, workers=3, heartbeat=HEARTBEAT, extra=("--config", str(cfg)))
    out = tmp_path / "runs.txt"
    with d.client() as q:
        ids = [q.enqueue("testjobs:span", [str(out), f"j{i}", 0.05], cost_units=(1, 2)[i % 2]) for i in range(12)]
        for i in ids:
            assert q.wait(i, 60)["state"] == State.SUCCEEDED
    spans = runs(out)
    assert len(spans) == 12
    assert peak([(s, e, (1, 2)[int(t[1:]) % 2]) for t, s, e in spans]) <= 3


def test_a_daemon_with_budgets_and_a_worker_without_never_together_exceed_them(pg_fresh_database, start_daemon,
                                                                                start_worker, tmp_path):
    url = pg_fresh_database
    cfg = config(tmp_path, "[budgets.pools]\ndefault = 3\n")
    # One slot on the daemon, three on the worker: together more than the budget, and the
    # worker is sure to claim (with three each, the daemon could take every job first).
    d = start_daemon(url, "--heartbeat", str(HEARTBEAT), "--config", cfg, workers=1)
    w = start_worker(url, workers=3, heartbeat=HEARTBEAT)  # no --config: no budgets of its own
    w.wait_for_line("budgets: in force on .* \\(not set here\\): pool 'default' 3")
    out = tmp_path / "runs.txt"
    with d.client() as q:
        ids = [q.enqueue("testjobs:span", [str(out), f"j{i}", 0.05], cost_units=(1, 2)[i % 2]) for i in range(30)]
        for i in ids:
            assert q.wait(i, 60)["state"] == State.SUCCEEDED
    spans = runs(out)
    assert len(spans) == 30
    assert peak([(s, e, (1, 2)[int(t[1:]) % 2]) for t, s, e in spans]) <= 3
    assert w.pid in pids(out)  # the worker claimed budgeted jobs too, under the daemon's budgets


def test_a_worker_started_with_other_budgets_replaces_them_and_says_so(pg_fresh_database, start_daemon,
                                                                       start_worker, tmp_path):
    url = pg_fresh_database
    d = start_daemon(url, "--heartbeat", str(HEARTBEAT), "--config",
                     config(tmp_path, "[budgets.pools]\ndefault = 3\n"), workers=0)
    other = tmp_path / "worker.toml"
    other.write_text("[budgets.pools]\ndefault = 5\n[budgets.groups]\napi = 2\n")
    w = start_worker(url, workers=2, heartbeat=HEARTBEAT, extra=("--config", str(other)))
    line = w.wait_for_line("replaces the budgets in force").string
    assert "WARNING" in line and "group 'api' none -> 2" in line and "pool 'default' 3 -> 5" in line
    d.wait_for_line("another process changed the budgets in force")  # the daemon follows
    with d.client() as q:
        shown = {(b["kind"], b["name"]): b["limit"] for b in q.stats()["budgets"]}
        q.enqueue("testjobs:noop", cost_units=4)  # over the old budget, within the new one
    assert shown == {("pool", "default"): 5, ("group", "api"): 2}


def test_a_daemon_started_without_budgets_shows_and_applies_those_in_force(pg_fresh_database, start_daemon,
                                                                          start_worker, tmp_path):
    url = pg_fresh_database
    d = start_daemon(url, "--heartbeat", str(HEARTBEAT), "--http", "127.0.0.1:0", workers=0)
    port = int(d.wait_for_line(r"HTTP endpoint http://\S+:(\d+)/").group(1))
    start_worker(url, workers=1, heartbeat=HEARTBEAT,
                 extra=("--config", config(tmp_path, "[budgets.pools]\ndefault = 3\n")))
    d.wait_for_line("another process changed the budgets in force: pool 'default' none -> 3")
    with d.client() as q:
        (budget,) = q.stats()["budgets"]
        with pytest.raises(QueueError, match="exceeds the whole budget of pool 'default'"):
            q.enqueue("testjobs:noop", cost_units=4)
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    shown = subprocess.run([sys.executable, "-m", "queickd", "budgets", "--port", str(d.port)],
                           capture_output=True, text=True, timeout=60, env=dict(os.environ)).stdout
    assert (budget["kind"], budget["name"], budget["limit"]) == ("pool", "default", 3)
    assert 'queickd_budget_limit_units{kind="pool",name="default"} 3' in metrics
    assert "budget pool default: 0/3 units running" in shown


def test_a_paused_functions_grouped_jobs_let_one_probe_through_after_the_cooldown(pg_fresh_database, start_daemon,
                                                                                  start_worker, gate):
    # Grouped jobs are claimed through the store's selection, on the daemon and the worker alike.
    import socket

    url = pg_fresh_database
    breaker = ("--pause-after", "2", "--pause-cooldown", "1")
    d = start_daemon(url, "--heartbeat", str(HEARTBEAT), *breaker, workers=2)
    start_worker(url, workers=2, heartbeat=HEARTBEAT, extra=(*breaker, "--sweep", "0.5"))
    grouped = {"concurrency_group": "api", "concurrency_limit": 5}
    with socket.create_server(("127.0.0.1", 0)) as closed:
        nobody = closed.getsockname()[1]  # a port nothing listens on once closed: those runs fail
    with d.client() as q:
        for i in range(2):
            assert q.wait(q.enqueue("testjobs:gate", [nobody, f"x{i}"], **grouped), 20)["state"] == State.DEAD
        held = [q.enqueue("testjobs:gate", [gate.port, f"g{i}"], **grouped) for i in range(3)]
        assert gate.arrival(20) == "g0"  # the probe, once the cooldown is over
        (pause,) = q.stats()["paused"]
        states = [q.get(i)["state"] for i in held]
        gate.release_all()  # the probe succeeds: the function resumes and the others run
        for _ in range(2):
            gate.arrival(20)
        gate.release_all()
        finished = [q.wait(i, 20)["state"] for i in held]
    assert pause["probe_job"] == held[0]
    assert states == [State.RUNNING, State.QUEUED, State.QUEUED]  # one probe, and only one
    assert finished == [State.SUCCEEDED] * 3


def test_a_job_held_back_by_its_group_on_one_worker_starts_when_another_worker_frees_the_slot(
        pg_fresh_database, start_daemon, start_worker, gate):
    url = pg_fresh_database
    # Sweeps far apart: only a wake-up from the finish can start the job in time.
    d = start_daemon(url, "--heartbeat", str(HEARTBEAT), "--sweep", "600", workers=0)
    start_worker(url, "a", workers=1, heartbeat=HEARTBEAT, extra=("--sweep", "600"))
    start_worker(url, "b", workers=1, heartbeat=HEARTBEAT, extra=("--sweep", "600"))
    with d.client() as q:
        held = q.enqueue("testjobs:gate", [gate.port, "x"], pool="a", concurrency_group="api", concurrency_limit=1)
        assert gate.arrival() == "x"
        behind = q.enqueue("testjobs:noop", pool="b", concurrency_group="api", concurrency_limit=1)
        assert q.get(behind)["state"] == State.QUEUED  # the group's one slot is held
        gate.release_all()
        assert q.wait(held, 20)["state"] == State.SUCCEEDED
        assert q.wait(behind, 20)["state"] == State.SUCCEEDED


def test_clear_budgets_removes_the_budgets_in_force_and_every_claimer_follows(pg_fresh_database, start_daemon,
                                                                             tmp_path):
    url = pg_fresh_database
    d = start_daemon(url, "--heartbeat", str(HEARTBEAT), "--config",
                     config(tmp_path, "[budgets.pools]\ndefault = 3\n"), workers=0)
    with d.client() as q:
        with pytest.raises(QueueError, match="exceeds the whole budget of pool 'default'"):
            q.enqueue("testjobs:noop", cost_units=4)
    out = subprocess.run([sys.executable, "-m", "queickd", "db", "clear-budgets", "--store", url],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "removed the budget of pool 'default' (3 units)" in out.stdout
    d.wait_for_line("another process changed the budgets in force: pool 'default' 3 -> none")
    with d.client() as q:
        assert q.stats()["budgets"] == []
        q.enqueue("testjobs:noop", cost_units=4)  # no budget holds it back any more


def test_clear_budgets_on_sqlite_says_the_config_file_holds_them(tmp_path):
    url = f"sqlite:///{tmp_path}/queue.db"
    out = subprocess.run([sys.executable, "-m", "queickd", "db", "clear-budgets", "--store", url],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 78
    assert "config file" in out.stderr
    assert not (tmp_path / "queue.db").exists()  # nothing was created


def test_a_worker_probes_a_pause_it_began_when_the_cooldown_ends_not_at_its_sweep(pg_fresh_database, start_daemon,
                                                                                 start_worker, gate):
    import socket

    url = pg_fresh_database
    breaker = ("--pause-after", "2", "--pause-cooldown", "1")
    d = start_daemon(url, "--heartbeat", str(HEARTBEAT), "--sweep", "600", *breaker, workers=0)
    start_worker(url, workers=1, heartbeat=HEARTBEAT, extra=(*breaker, "--sweep", "600"))
    with socket.create_server(("127.0.0.1", 0)) as closed:
        nobody = closed.getsockname()[1]  # a port nothing listens on once closed: those runs fail
    with d.client() as q:
        for i in range(2):
            assert q.wait(q.enqueue("testjobs:gate", [nobody, f"x{i}"]), 20)["state"] == State.DEAD
        probe = q.enqueue("testjobs:gate", [gate.port, "probe"])
        assert gate.arrival(20) == "probe"  # a second after the pause began, not 600
        gate.release_all()
        assert q.wait(probe, 20)["state"] == State.SUCCEEDED
        assert q.stats()["paused"] == []  # the probe's success lifted the pause
