"""The bench's goal report: each goal's ratio and verdict, and the lines that say what sets
the batched aims, from results of a run (built here, no process started)."""

from __future__ import annotations

from bench.goals import goal_lines, pg_goal_lines
from bench.peers import HUEY, QUEICK, QUEICKD_MEMORY, QUEICKD_SQLITE
from bench.pgsetup import (
    APP_CPU,
    APP_ENQUEUE,
    APP_INSERT,
    APP_ROW,
    APP_ROW_JOB,
    APP_WALL,
    PGQUEUER,
    QUEICKD_DIRECT,
    QUEICKD_ENQUEUE,
    RAW_ROWS,
    queickd_target,
)
from bench.report import Results
from bench.running import E2E_MANY, E2E_SINGLE


def results(*values: tuple[str, str, str, float]) -> Results:
    res = Results()
    for scenario, target, label, v in values:
        res.add(scenario, label, target, "", v, higher_is_better=True)
    return res


def test_a_goal_says_its_ratio_and_whether_it_holds():
    res = results(("e2e", QUEICKD_SQLITE, E2E_SINGLE, 1500.0), ("e2e", QUEICK, E2E_SINGLE, 1000.0),
                  ("e2e", HUEY, E2E_SINGLE, 500.0))
    lines = goal_lines(res)
    assert "end to end, one enqueue per job: sqlite/full >= 2x Queick: 1.50x  MISSES" in lines
    assert "end to end, one enqueue per job: sqlite/full >= 2x huey: 3.00x  holds" in lines


def test_the_batched_aims_are_set_beside_the_cpu_spent_per_job():
    res = results(("enqueue-single", QUEICK, "enqueue rate", 10_000.0),
                  ("enqueue-many", QUEICKD_SQLITE, "enqueue rate", 200_000.0),
                  ("enqueue-many", QUEICKD_SQLITE, "server CPU per job", 4.0),
                  ("enqueue-many", QUEICKD_SQLITE, "client CPU per job", 1.0),
                  ("e2e", HUEY, E2E_SINGLE, 1_000.0), ("e2e-many", QUEICKD_MEMORY, E2E_MANY, 7_000.0))
    lines = goal_lines(res)
    assert ("enqueue_many: 30x Queick = 300,000 jobs/s, 3.3 µs a job; the daemon spent 4.0 µs of CPU a job "
            "and the client 1.0, one after the other") in lines
    assert ("end to end, batched: 6x huey = 6,000 jobs/s; the memory store, the same process with nothing to "
            "write, got 7,000 (7.00x huey)") in lines
    assert not [line for line in lines if line.startswith("pipelined:")]  # not measured: not said


def test_postgres_lines_set_the_batch_aim_beside_the_servers_cpu_per_row():
    res = results(("enqueue-batch", PGQUEUER, "enqueue rate", 50_000.0),
                  ("enqueue-batch", QUEICKD_ENQUEUE, "enqueue rate", 40_000.0),
                  ("enqueue-batch", QUEICKD_ENQUEUE, "CPU per job, its server backends", 17.0),
                  ("e2e", queickd_target(1), "transactions per job", 0.5),
                  ("e2e", queickd_target(4), "transactions per job", 1.0),
                  ("e2e", queickd_target(1), "CPU per job, its server backends", 150.0),
                  ("e2e", queickd_target(4), "CPU per job, its server backends", 280.0))
    lines = pg_goal_lines(res)
    assert "1,000 per request: queickd pg >= 2x pgqueuer: 0.80x  MISSES" in lines
    assert "1,000 per request: 2x pgqueuer leaves 10.0 µs a job; the server alone spent 17.0 µs of CPU per queickd row" in lines
    assert any(line.startswith("end to end: 0.50 transactions a job with 1 worker process of 4 slots, 1.00 with 4")
               for line in lines)
    assert ("end to end: server CPU per transaction 300 µs with 1 worker process, 280 with 4; at the same cost a "
            "transaction, 4 processes of 1 slot spend 2.00x the database CPU a job of 1 of 4 slots") in lines


def test_postgres_direct_enqueue_goals_read_pgqueuer_the_floor_and_the_app_transaction():
    res = results(("enqueue-single", PGQUEUER, "enqueue rate", 3_000.0),
                  ("enqueue-single", QUEICKD_DIRECT, "enqueue rate", 3_600.0),
                  ("raw", RAW_ROWS, "rows/s, one per statement", 4_000.0),
                  ("enqueue-batch", PGQUEUER, "enqueue rate", 60_000.0),
                  ("enqueue-batch", QUEICKD_DIRECT, "enqueue rate", 60_000.0),
                  ("app-tx", APP_ROW, APP_WALL, 300.0), ("app-tx", APP_ROW_JOB, APP_WALL, 450.0),
                  ("app-tx", APP_ROW, APP_CPU, 100.0), ("app-tx", APP_ROW_JOB, APP_CPU, 250.0),
                  ("app-tx", APP_ROW_JOB, APP_INSERT, 80.0), ("app-tx", APP_ROW_JOB, APP_ENQUEUE, 160.0))
    lines = pg_goal_lines(res)
    assert "one enqueue at a time, queickd.pg on the app's connection: >= 1.1x pgqueuer: 1.20x  holds" in lines
    assert ("one enqueue at a time, queickd.pg on the app's connection: >= 0.8x bare rows, one per statement: "
            "0.90x  holds") in lines
    assert "1,000 per call, queickd.pg on the app's connection: >= 1.5x pgqueuer: 1.00x  MISSES" in lines
    assert ("in an app transaction: client+server CPU the enqueue adds <= 1.3x the app's INSERT transaction's: "
            "1.50x  MISSES") in lines
    assert "in an app transaction: wall time the enqueue adds <= 1.3x the app's INSERT transaction's: 0.50x  holds" in lines
    assert ("in an app transaction, statements alone: the enqueue call 160 µs of wall time, the app's INSERT 80 µs "
            "(2.00x)") in lines


def test_targets_keeps_the_named_targets_and_sets_up_no_peer_left_out():
    from bench.run import Scenario, keep_targets

    def nothing(*_: object) -> None:
        return None

    order = [Scenario("e2e", "e2e", [QUEICKD_SQLITE, QUEICKD_MEMORY, QUEICK, HUEY], nothing, True, True),
             Scenario("idle", "idle", [QUEICK, HUEY], nothing, True, True)]
    kept = keep_targets(order, "sqlite/full, memory")
    assert [(sc.name, sc.targets, sc.needs_peer, sc.needs_huey) for sc in kept] == [
        ("e2e", [QUEICKD_SQLITE, QUEICKD_MEMORY], False, False)]
