"""A fleet on one PostgreSQL database: daemons and external workers as real processes.

Each test gets a database of its own (notifications are per database). Heartbeats are
short here (0.5 s) so that "gone after 3 missed beats" takes about 1.5 s, not 30 s.
These tests skip, saying why, when no PostgreSQL server is reachable.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
from fleethelpers import WorkerProcess

from queickd.core.job import NewJob, State
from queickd.settings import EX_VERSION

HEARTBEAT = 0.5
WINDOW = 3 * HEARTBEAT  # silent this long: gone




def _daemon(start_daemon, url: str, *extra: str, workers: int = 0):
    return start_daemon(url, "--heartbeat", str(HEARTBEAT), *extra, workers=workers)


def _runs(path: Path) -> list[tuple[str, int, float, float]]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        token, pid, start, end = line.split()
        out.append((token, int(pid), float(start), float(end)))
    return out


def test_every_job_runs_once_on_a_worker_of_its_own_pool_and_one_at_a_time_per_key(
        pg, start_daemon, start_worker, tmp_path):
    url, _ = pg
    d = _daemon(start_daemon, url)  # --workers 0: protocol, timers and rules only
    a1, a2 = start_worker(url, "a", workers=3), start_worker(url, "a", workers=3)
    b = start_worker(url, "b", "c", workers=2)
    out = tmp_path / "runs.txt"
    with d.client() as q:
        jobs = {}
        for i in range(90):
            pool = "ab"[i % 2] if i % 3 else "c"
            key = f"k{i % 5}" if i % 4 == 0 else None
            token = f"{pool}-{key}-{i}"
            jobs[token] = q.enqueue("testjobs:span", [str(out), token, 0.03], pool=pool, key=key)
        done = [q.wait(job_id, 60) for job_id in jobs.values()]
        stats = q.stats()
    assert {j["state"] for j in done} == {State.SUCCEEDED}
    runs = _runs(out)
    assert sorted(r[0] for r in runs) == sorted(jobs)  # each job ran, and ran once
    pids = {"a": {a1.pid, a2.pid}, "b": {b.pid}, "c": {b.pid}}
    assert [r for r in runs if r[1] not in pids[r[0][0]]] == []  # never on another pool's worker
    assert {r[1] for r in runs if r[0][0] == "a"} == {a1.pid, a2.pid}  # both pool-a workers pulled
    per_key = defaultdict(list)
    for token, _, start, end in runs:
        if token.split("-")[1] != "None":
            per_key[token.split("-")[1]].append((start, end))
    for key, spans in per_key.items():
        spans.sort()
        assert all(prev[1] <= nxt[0] for prev, nxt in zip(spans, spans[1:], strict=False)), f"key {key} overlapped"
    assert {name: p["workers"] for name, p in stats["pools"].items() if name in "abc"} == {"a": 6, "b": 2, "c": 2}
    assert sum(1 for w in stats["fleet"] if w["alive"] and w["kind"] == "worker") == 3


def test_a_retry_scheduled_by_an_external_worker_is_promoted_by_the_daemon_on_time(
        pg, start_daemon, start_worker):
    url, _ = pg
    d = _daemon(start_daemon, url, "--sweep", "600")  # its safety sweep would be far too late
    start_worker(url)
    with d.client() as q:
        job_id = q.enqueue("testjobs:fail", retry=True, retry_type="constant", retry_interval=0.5,
                           max_attempts=2)
        job = q.wait(job_id, 30)
    assert (job["state"], job["attempts"]) == (State.DEAD, 2)


def test_a_pool_without_workers_keeps_its_jobs_waiting_and_stats_say_so(pg, start_daemon):
    url, _ = pg
    d = _daemon(start_daemon, url, workers=2)  # serves the default pool only
    with d.client() as q:
        gpu = q.enqueue("testjobs:noop", pool="gpu")
        plain = q.enqueue("testjobs:noop")
        assert q.wait(plain, 20)["state"] == State.SUCCEEDED
        stats = q.stats()
        assert q.get(gpu)["state"] == State.QUEUED
    assert stats["pools"]["gpu"] == {"waiting": 1, "workers": 0}


def test_a_daemon_on_postgres_registers_while_it_runs_and_deregisters_on_sigterm(pg, start_daemon):
    url, admin = pg
    d = _daemon(start_daemon, url, workers=2)
    kinds = admin.execute("SELECT kind, pools, slots FROM workers WHERE pid = %s", (d.proc.pid,)).fetchall()
    assert kinds == [("daemon", ["default"], 2)]
    assert d.terminate() == 0
    assert admin.execute("SELECT count(*) FROM workers WHERE pid = %s", (d.proc.pid,)).fetchone()[0] == 0


def test_a_worker_killed_mid_job_loses_it_only_after_the_heartbeat_window_then_it_runs_again(
        pg, start_daemon, start_worker, gate):
    url, admin = pg
    d = _daemon(start_daemon, url)
    doomed = start_worker(url, heartbeat=HEARTBEAT)
    with d.client() as q:
        job_id = q.enqueue("testjobs:gate", [gate.port, "first"])
        assert gate.arrival() == "first"
        doomed.proc.send_signal(signal.SIGKILL)
        doomed.proc.wait(10)
        assert q.get(job_id)["state"] == State.RUNNING  # nobody takes it for dead yet
        (last_beat,) = admin.execute("SELECT beat_at FROM workers WHERE pid = %s", (doomed.pid,)).fetchone()
        start_worker(url, heartbeat=HEARTBEAT)  # the rescuer
        assert gate.arrival(timeout=30) == "first"  # it runs once more, on the rescuer
        # Not before the dead worker's last beat was 3 beats old (both on the database clock).
        (now,) = admin.execute("SELECT extract(epoch from clock_timestamp())::float8").fetchone()
        assert now - last_beat >= WINDOW
        gate.release_all()
        job = q.wait(job_id, 20)
    assert (job["state"], job["attempts"], job["orphaned"]) == (State.SUCCEEDED, 2, 1)


def test_a_worker_that_only_pauses_for_less_than_the_window_keeps_its_job(
        pg, start_daemon, start_worker, gate):
    url, _ = pg
    d = _daemon(start_daemon, url)  # sweeps for orphans every 0.5 s
    slow = start_worker(url, heartbeat=1.5)  # window 4.5 s
    with d.client() as q:
        job_id = q.enqueue("testjobs:gate", [gate.port, "only"])
        assert gate.arrival() == "only"
        slow.proc.send_signal(signal.SIGSTOP)
        time.sleep(1.0)  # the stimulus: a stall well inside the window (at most 2.5 s silent)
        slow.proc.send_signal(signal.SIGCONT)
        assert q.get(job_id)["state"] == State.RUNNING
        gate.release_all()
        job = q.wait(job_id, 20)
    assert (job["state"], job["attempts"], job["orphaned"]) == (State.SUCCEEDED, 1, 0)


def test_a_worker_that_lost_its_job_while_stalled_and_claimed_it_again_ignores_its_first_runs_outcome(
        pg, start_daemon, start_worker, gate):
    # Stalled past the window, the worker's job is swept; back, it claims it again and runs
    # it a second time. The first run's end must not finish the second claim: the job stays
    # running, and its key stays held, until the second run ends.
    url, _ = pg
    d = _daemon(start_daemon, url)
    w = start_worker(url, heartbeat=HEARTBEAT, workers=2)
    with d.client() as q:
        job_id = q.enqueue("testjobs:gate", [gate.port, "first"], key="k")
        next_id = q.enqueue("testjobs:gate", [gate.port, "next"], key="k")
        assert gate.arrival() == "first"
        w.proc.send_signal(signal.SIGSTOP)
        d.wait_for_line("jobs of workers that stopped beating: 1 re-queued", 30)  # swept as an orphan
        w.proc.send_signal(signal.SIGCONT)
        assert gate.arrival(timeout=30) == "first"  # claimed again by the same worker
        gate.release_first()  # the first run ends
        w.wait_for_line("a run under an earlier claim ended")
        job = q.get(job_id)
        assert (job["state"], job["attempts"]) == (State.RUNNING, 2)
        assert q.get(next_id)["state"] == State.QUEUED  # the key is still held
        gate.release_first()
        assert q.wait(job_id, 20)["state"] == State.SUCCEEDED
        assert gate.arrival(timeout=30) == "next"
        gate.release_all()
        assert q.wait(next_id, 20)["state"] == State.SUCCEEDED


def test_a_worker_whose_pass_waits_on_another_sessions_lock_keeps_beating_and_its_running_job(
        pg, start_daemon, start_worker, gate):
    # Another process stalled inside a grouped claim holds the claim lock (here: the test's
    # own session). This worker's next pass waits on it; its beats, on the same connection,
    # must not: its long job is not taken for an orphan's.
    from queickd.store.postgres.claim_sql import CLAIM_LOCK

    url, admin = pg
    d = _daemon(start_daemon, url)
    start_worker(url, heartbeat=HEARTBEAT, workers=2)
    with d.client() as q:
        long_id = q.enqueue("testjobs:gate", [gate.port, "long"])
        assert gate.arrival() == "long"
        with admin.transaction():
            admin.execute("SELECT pg_advisory_xact_lock(%s)", (CLAIM_LOCK,))
            grouped = q.enqueue("testjobs:noop", concurrency_group="g", concurrency_limit=1)  # wakes its pass
            time.sleep(2 * WINDOW)  # the stimulus: the lock held twice as long as the window
        assert not [line for line in d.lines if "stopped beating" in line]
        job = q.get(long_id)
        assert (job["state"], job["attempts"], job["orphaned"]) == (State.RUNNING, 1, 0)
        gate.release_all()
        assert q.wait(long_id, 20)["attempts"] == 1
        assert q.wait(grouped, 30)["state"] == State.SUCCEEDED


def test_a_registered_member_limits_its_sessions_to_the_heartbeat_window(pg_fresh_database):
    from queickd.store import open_store

    store = open_store(pg_fresh_database, "full")
    try:
        store.register_worker("worker", ["default"], 1, 0.5)
        with store.transaction(bookkeeping=True) as tx:
            bk = tx.conn.execute("SELECT current_setting('lock_timeout'),"
                                 " current_setting('idle_in_transaction_session_timeout')").fetchone()
        shared = store._conn().execute("SELECT current_setting('idle_in_transaction_session_timeout')").fetchone()
        assert (bk, shared) == (("500ms", "1500ms"), ("1500ms",))
    finally:
        store.deregister_worker()
        store.close()


def test_a_killed_listener_connection_reconnects_and_work_flows_without_waiting_for_the_sweep(
        pg, start_daemon, start_worker):
    url, admin = pg
    d = _daemon(start_daemon, url)
    w = start_worker(url, extra=("--sweep", "600"))  # a sweep would come far too late to explain it
    w.wait_for_line("listener: listening")
    gone = admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
        (f"queickd-listener-{w.pid}",)).fetchall()
    assert gone == [(True,)]
    with d.client() as q:
        job_id = q.enqueue("testjobs:noop")  # its NOTIFY may reach nobody in the worker
        assert q.wait(job_id, 30)["state"] == State.SUCCEEDED
    w.wait_for_line("listener: reconnected")


def test_two_daemons_on_one_database_fire_each_cron_tick_exactly_once(pg, start_daemon, tmp_path):
    """Kept short: about 6 one-second ticks, not a minute's worth."""
    from queickd import SchedulingTime

    url, admin = pg
    out = tmp_path / "ticks.txt"
    first = _daemon(start_daemon, url, workers=2)
    with first.client() as q:
        q.cron(SchedulingTime().every(seconds=1).from_now(), "testjobs:append", [str(out), "tick"], name="c")
    second = _daemon(start_daemon, url, workers=2)  # reads the cron at its first sweep
    time.sleep(6.0)  # the stimulus: ticks pass while both daemons race for them
    with first.client() as q:
        q.cron_delete("c")
        ids = [row[0] for row in admin.execute("SELECT id FROM jobs WHERE cron = 'c' ORDER BY id")]
        jobs = [q.wait(i, 20) for i in ids]
    ticks = [float(j["idempotency_key"].split(":")[2]) for j in jobs]
    assert len(ticks) == len(set(ticks))  # no tick fired twice
    assert len(ticks) >= 4
    assert all(abs(round(t - ticks[0]) - (t - ticks[0])) < 1e-6 for t in ticks)  # on the 1 s grid
    assert {j["state"] for j in jobs} == {State.SUCCEEDED}
    assert out.read_text().splitlines() == ["tick"] * len(jobs)  # each fired tick ran once
    fired_logs = sum(len([ln for ln in d.lines if "cron c fired job" in ln]) for d in (first, second))
    assert fired_logs == len(jobs)  # no daemon fired a tick the other had fired


def test_a_worker_of_another_version_refuses_claims_and_exits_with_its_own_status(pg):
    from queickd.store.postgres.store import PostgresStore

    url, admin = pg
    store = PostgresStore(url)  # migrates, as a daemon would
    (sub,) = store.submit([NewJob("testjobs:noop", run_at=0.0)], time.time())
    admin.execute("UPDATE queickd_meta SET value = '0.0.1' WHERE key = 'queickd_version'")
    w = WorkerProcess(url).spawn()
    assert w.proc.wait(30) == EX_VERSION
    w.wait_for_line("refusing to claim")  # read through the pipe up to it (its reader may lag the exit)
    assert store.get(sub.job_id).state == State.QUEUED  # claimed by nobody
    (record,) = [r for r in store.workers() if r["pid"] == w.pid]  # what `queick stats` lists
    assert "0.0.1" in record["refused"] and not record["alive"]
    store.close()


def _worker_run(url: str) -> subprocess.CompletedProcess:
    """`queick worker` to its end (one that refuses to start), at the default log level."""
    from helpers import JOBS_DIR

    return subprocess.run([sys.executable, "-m", "queickd", "worker", "--store", url, "--app-dir", str(JOBS_DIR)],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_a_worker_on_a_database_with_no_schema_yet_says_so_in_one_line_and_exits_to_be_restarted(pg):
    url, _ = pg  # a fresh database: nobody migrated it yet
    r = _worker_run(url)
    assert r.returncode == 1  # like an unreachable database: systemd tries again (78 it would not)
    (line,) = r.stderr.splitlines()
    assert "has no queickd schema" in line and "queick db migrate" in line


def test_a_worker_on_a_database_of_a_newer_schema_refuses_in_one_line_without_a_traceback(pg):
    from queickd.store.postgres.schema import SCHEMA_VERSION
    from queickd.store.postgres.store import PostgresStore

    url, admin = pg
    PostgresStore(url).close()  # migrated, as a daemon would
    admin.execute("UPDATE queickd_meta SET value = %s WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    admin.execute("UPDATE queickd_meta SET value = '99.0' WHERE key = 'queickd_version'")
    admin.execute("ALTER TABLE workers DROP COLUMN refused")  # what a newer schema may have changed
    r = _worker_run(url)
    assert r.returncode == EX_VERSION
    (line,) = r.stderr.splitlines()
    assert "refusing to claim" in line and "install queickd 99.0" in line


def test_a_daemon_stops_with_the_version_status_when_the_database_moves_to_another_version(pg, start_daemon):
    url, admin = pg
    d = _daemon(start_daemon, url, workers=1)
    admin.execute("UPDATE queickd_meta SET value = '99.0' WHERE key = 'queickd_version'")
    assert d.proc.wait(30) == EX_VERSION
    d.wait_for_line(r"99\.0.*stopping|stopping.*99\.0")  # read through the pipe up to it


def test_sigterm_lets_the_running_job_finish_then_the_worker_deregisters(pg, start_daemon, start_worker, gate):
    url, admin = pg
    d = _daemon(start_daemon, url)
    w = start_worker(url)
    with d.client() as q:
        job_id = q.enqueue("testjobs:gate", [gate.port, "t"])
        assert gate.arrival() == "t"
        w.proc.send_signal(signal.SIGTERM)
        w.wait_for_line("waiting up to")
        gate.release_all()
        assert w.proc.wait(20) == 0
        assert q.get(job_id)["state"] == State.SUCCEEDED
    assert admin.execute("SELECT count(*) FROM workers WHERE pid = %s", (w.pid,)).fetchone()[0] == 0


def test_the_systemd_units_do_not_restart_a_worker_of_the_wrong_version():
    root = Path(__file__).parent.parent / "systemd"
    for unit in ("queickd.service", "queickd-worker@.service"):
        text = (root / unit).read_text()
        line = next(ln for ln in text.splitlines() if ln.startswith("RestartPreventExitStatus="))
        assert str(EX_VERSION) in line.split("=", 1)[1].split(), unit


def test_the_compose_fleet_is_a_daemon_running_no_jobs_and_two_workers_in_two_pools(monkeypatch):
    yaml = pytest.importorskip("yaml", reason="checking docker-compose.yml needs PyYAML")
    import shlex

    from queickd.cli import build_parser

    compose = yaml.safe_load((Path(__file__).parent.parent / "docker" / "docker-compose.yml").read_text())
    services = compose["services"]
    assert services["queickd"]["command"] == ["queick", "run", "--workers", "0"]
    pools = []
    for name in ("worker-default", "worker-gpu"):
        for var, value in services[name]["environment"].items():  # as compose sets them
            monkeypatch.setenv(var, value)
        worker_cmd = services[name]["command"][-1].split("exec ", 1)[1]
        args = build_parser().parse_args(shlex.split(worker_cmd)[1:])  # flags our CLI takes
        assert args.command == "worker" and services[name]["environment"]["QUEICKD_STORE"].startswith("postgresql://")
        pools += args.pool
    assert sorted(pools) == ["default", "gpu"]
