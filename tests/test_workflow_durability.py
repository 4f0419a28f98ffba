"""Workflow runs survive crashes: kill -9 of the daemon at random points (SQLite), and a
worker killed mid-run in a PostgreSQL fleet. After restarts every run reaches its final
state, every step output is recorded exactly once, and the final states are what an
uninterrupted run gives."""

from __future__ import annotations

import random
import signal
import time

import pytest
from fleethelpers import WorkerProcess
from store_contract_workflows import drive

from queickd.core import workflow as wf
from queickd.store import open_store

HEARTBEAT = 0.5  # a killed worker is gone after 3 missed beats: 1.5 s
STEPS = [{"name": "plan", "func": "wfsteps:plan"},
         {"name": "fan", "kind": "for_each", "items": "tasks", "func": "wfsteps:record_key", "result": "results"},
         {"name": "sum", "func": "wfsteps:total"},
         {"name": "count", "func": "wfsteps:count_up"}]
DEFINITION = {"name": "durable", "steps": STEPS, "budget": {"max_transitions": 50}}


def _state(i: int, where) -> dict:
    return {"n": 3 + i % 6, "until": 3, "dir": str(where), "hold": 0.4}


def _uninterrupted(states: list[dict], scratch) -> list[tuple[dict, list]]:
    """Each run's final state (without its dir) and its outputs' (step, item, loop), run
    without any crash on the memory store."""
    store, out = open_store("memory://"), []
    scratch.mkdir()
    for s in states:
        run, _ = store.workflow_start(wf.parse(DEFINITION), {**s, "dir": str(scratch), "hold": 0}, 0.0)
        drive(store, 0.0)
        final = store.workflow_get(run.id)
        assert final.status == wf.RunState.SUCCEEDED
        out.append(({k: v for k, v in final.state.items() if k not in ("dir", "hold")},
                    [(o["step"], o["item"], o["loop"]) for o in store.workflow_outputs(run.id)]))
    return out


def _check(store, run_ids: list[int], expected: list[tuple[dict, list]], keys_log) -> None:
    for run_id, (state, outputs) in zip(run_ids, expected, strict=True):
        run = store.workflow_get(run_id)
        assert run.status == wf.RunState.SUCCEEDED, run.reason
        assert {k: v for k, v in run.state.items() if k not in ("dir", "hold")} == state
        assert [(o["step"], o["item"], o["loop"]) for o in store.workflow_outputs(run_id)] == outputs
    # The crashes did interrupt steps: some step job was running when its process died.
    assert any(j.orphaned for r in run_ids for j in store.workflow_jobs(r))
    ran = {line.split()[0] for line in keys_log.read_text().splitlines()}
    expected_keys = {wf.step_key(r, 1, item, 0) for r, (_, outs) in zip(run_ids, expected, strict=True)
                     for step, item, _ in outs if step == 1}
    assert ran == expected_keys  # every item ran (at least once: a kill may repeat one)


def _wait_for_a_step_job(q, rng: random.Random, run_ids: list[int]) -> bool:
    """Wait for a random running step job to finish; False if every run has ended.

    Only a running one: it ends within a step's hold, so the kills come while most of the
    work is still ahead, however fast the daemon gets through the rest. Right after a
    restart nothing may run yet (the orphans are back in the queue): a queued job picked
    then could be far back in it, and the runs could all end before the next kills. So it
    waits, briefly, for one to start."""
    deadline = time.monotonic() + 30
    while True:
        running = [r for r in run_ids if q.workflow_get(r)["state"] == "running"]
        if not running:
            return False
        pick = [j["job_id"] for r in running for s in q.workflow_get(r)["steps"] for j in s["jobs"]
                if j["state"] == "running"]
        if pick:
            q.wait(rng.choice(pick), 30)
            return True
        assert time.monotonic() < deadline, "no step job started within 30 s"
        time.sleep(0.02)


def _wait_until_it_ran_a_step(log, pid: int, timeout: float = 30.0) -> None:
    """Wait until the worker `pid` has run a fan-out item (its line in the steps' log)."""
    deadline = time.monotonic() + timeout
    while not (log.exists() and any(line.split()[1:2] == [str(pid)] for line in log.read_text().splitlines())):
        assert time.monotonic() < deadline, f"worker {pid} ran no step"
        time.sleep(0.02)


def test_kill_9_of_the_daemon_at_random_points_loses_and_doubles_no_step(start_daemon, tmp_path):
    rng = random.Random(19)
    states = [_state(i, tmp_path) for i in range(20)]
    expected = _uninterrupted(states, tmp_path / "scratch")
    d = start_daemon(None, "--max-orphan-requeues", "100", workers=4)
    with d.client() as q:
        run_ids = [q._call({"op": "workflow_start", "definition": DEFINITION, "state": s})["run_id"]
                   for s in states]
    mid_run = 0  # kills that found runs still running
    for _ in range(6):
        with d.client() as q:
            mid_run += _wait_for_a_step_job(q, rng, run_ids)
        d.kill()  # SIGKILL, wherever the daemon is: mid-finish, mid-claim, mid-commit
        d.start()
    assert mid_run >= 5, f"only {mid_run} of 6 kills came while runs were running"
    with d.client() as q:
        for r in run_ids:
            q.workflow_wait(r, 120)
    d.terminate()
    store = open_store(d.store_url)
    try:
        _check(store, run_ids, expected, tmp_path / "keys.log")
    finally:
        store.close()


def test_a_run_on_postgres_advances_once_per_step_across_two_workers_one_killed_mid_run(
        pg_fresh_database, start_daemon, tmp_path):
    from queickd.store.postgres.store import PostgresStore

    url = pg_fresh_database
    states = [_state(i, tmp_path) for i in range(10)]
    expected = _uninterrupted(states, tmp_path / "scratch")
    d = start_daemon(url, "--heartbeat", str(HEARTBEAT), workers=0)
    doomed = WorkerProcess(url, workers=2, heartbeat=HEARTBEAT).start()
    other = WorkerProcess(url, workers=2, heartbeat=HEARTBEAT).start()
    try:
        with d.client() as q:
            run_ids = [q._call({"op": "workflow_start", "definition": DEFINITION, "state": s})["run_id"]
                       for s in states]
            assert _wait_for_a_step_job(q, random.Random(5), run_ids)
            _wait_until_it_ran_a_step(tmp_path / "keys.log", doomed.pid)  # killed mid-run, not idle
            doomed.proc.send_signal(signal.SIGKILL)
            doomed.proc.wait(10)
            for r in run_ids:
                q.workflow_wait(r, 120)
        store = PostgresStore(url)
        try:
            _check(store, run_ids, expected, tmp_path / "keys.log")
        finally:
            store.close()
        pids = {line.split()[1] for line in (tmp_path / "keys.log").read_text().splitlines()}
        assert len(pids) == 2  # the steps of the runs ran on both workers
    finally:
        doomed.close()
        other.close()


@pytest.fixture(autouse=True)
def _keys_log(tmp_path):
    (tmp_path / "keys.log").touch()
