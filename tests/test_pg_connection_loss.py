"""PostgreSQL connections killed while jobs finish (pg_terminate_backend, as a server restart
or a failover does): a lost connection is the store's trouble, never an outcome's, so every
job that succeeded is recorded as succeeded once the daemon has reconnected."""

from __future__ import annotations

import threading

from queickd.core.protocol import QueueError


def test_no_succeeded_job_is_recorded_dead_when_the_daemons_connections_are_killed(pg, start_daemon, tmp_path):
    url, admin = pg
    d = start_daemon(url, "--sweep", "0.5", workers=4)
    done = tmp_path / "runs.txt"
    stop = threading.Event()
    kills = []

    def kill_the_daemons_connections() -> None:
        # Every backend of this test's database but our own: the daemon's writers, its
        # bookkeeping connection, its per-thread readers and its listener.
        while not stop.wait(0.15):
            kills.append(admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchone()[0])

    killer = threading.Thread(target=kill_the_daemons_connections)
    acked: list[int] = []
    with d.client() as q:
        killer.start()
        try:
            i = 0
            while len(kills) < 25:  # jobs finish all through 25 kills
                i += 1
                try:
                    acked.append(q.enqueue("testjobs:span", [str(done), str(i), 0.005]))
                except (QueueError, OSError):
                    pass  # refused while the store was away: not acknowledged, not counted
        finally:
            stop.set()
            killer.join()
        assert sum(kills) > 0
        jobs = [q.wait(job_id, 60) for job_id in acked]
    ran = {line.split()[0] for line in done.read_text().splitlines()}
    succeeded_but_dead = [(j["id"], j["error"]) for j in jobs if j["state"] == "dead" and j["args"][1] in ran]
    assert succeeded_but_dead == []
    assert {j["state"] for j in jobs} == {"succeeded"}
