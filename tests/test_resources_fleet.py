"""Concurrency groups across `queick worker` processes on one PostgreSQL database: exact
limits with several claimers, and slots that come back after a worker is killed."""

from __future__ import annotations

import signal

from test_resources_daemon import peak, runs

from queickd.core.job import State

HEARTBEAT = 0.5




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
