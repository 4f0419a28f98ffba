"""Memory-aware start: the readers on fake /proc and cgroup trees, the pure decision, and a
real daemon that defers a job that may not fit (no attempt spent), starts it once room
appears, and starts it anyway when nothing else runs."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from test_fate import make_job

from queickd.core.job import State
from queickd.core.policy import memory as mem
from queickd.services import memory_gate as gate_mod
from queickd.store import open_store

MB = 1024 * 1024


def fake_tree(root: Path, *, v2: tuple[int, int, int] | None = None, v1: tuple[int, int, int] | None = None,
              available_kb: int = 8_000_000) -> None:
    """A /proc and /sys/fs/cgroup under root: v2 or v1 (limit, usage, inactive file), or none."""
    (root / "proc/self").mkdir(parents=True, exist_ok=True)
    (root / "proc/meminfo").write_text(f"MemTotal: 16000000 kB\nMemAvailable: {available_kb} kB\n")
    if v2 is not None:
        (root / "proc/self/cgroup").write_text("0::/queickd.service\n")
        d = root / "sys/fs/cgroup/queickd.service"
        d.mkdir(parents=True, exist_ok=True)
        (d / "memory.max").write_text(f"{v2[0]}\n")
        (d / "memory.current").write_text(f"{v2[1]}\n")
        (d / "memory.stat").write_text(f"anon 1\ninactive_file {v2[2]}\nactive_file 3\n")
    elif v1 is not None:
        (root / "proc/self/cgroup").write_text("12:cpu,cpuacct:/q\n4:memory:/q\n")
        d = root / "sys/fs/cgroup/memory/q"
        d.mkdir(parents=True, exist_ok=True)
        (d / "memory.limit_in_bytes").write_text(f"{v1[0]}\n")
        (d / "memory.usage_in_bytes").write_text(f"{v1[1]}\n")
        (d / "memory.stat").write_text(f"cache 5\ntotal_inactive_file {v1[2]}\n")
    else:
        (root / "proc/self/cgroup").write_text("0::/\n")


def test_cgroup_v2_room_is_max_less_current_less_inactive_file(tmp_path):
    fake_tree(tmp_path, v2=(1000 * MB, 700 * MB, 100 * MB))
    assert gate_mod.room(str(tmp_path)) == (400 * MB, "cgroup")


def test_cgroup_v1_room_is_limit_less_usage_less_inactive_file(tmp_path):
    fake_tree(tmp_path, v1=(1000 * MB, 900 * MB, 50 * MB))
    assert gate_mod.room(str(tmp_path)) == (150 * MB, "cgroup")


def test_cgroup_v1_room_is_read_where_mountinfo_says_the_memory_hierarchy_is(tmp_path):
    fake_tree(tmp_path, v1=(1000 * MB, 900 * MB, 50 * MB))  # a decoy at the usual place
    (tmp_path / "proc/self/cgroup").write_text("4:memory:/pod7/q\n3:pids:/pod7\n")
    (tmp_path / "proc/self/mountinfo").write_text(
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
        # a sub-tree of the hierarchy that leaves the group out: not this one
        "44 31 0:32 /other /srv/other-mem rw,relatime - cgroup cgroup rw,memory\n"
        # the memory hierarchy at a place of its own, from the container's group down
        "45 31 0:32 /pod7 /opt/cg/mem rw,relatime - cgroup cgroup rw,memory\n")
    d = tmp_path / "opt/cg/mem/q"
    d.mkdir(parents=True)
    (d / "memory.limit_in_bytes").write_text(f"{2000 * MB}\n")
    (d / "memory.usage_in_bytes").write_text(f"{1500 * MB}\n")
    (d / "memory.stat").write_text(f"total_inactive_file {100 * MB}\n")
    assert gate_mod.room(str(tmp_path)) == (600 * MB, "cgroup")
    bare = tmp_path / "bare"
    fake_tree(bare, v1=(1000 * MB, 900 * MB, 50 * MB))
    (bare / "proc/self/mountinfo").write_text("31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n")
    assert gate_mod.cgroup_room(str(bare)) is None  # no memory hierarchy mounted: no cgroup room


def test_without_a_memory_cgroup_meminfo_is_the_source(tmp_path):
    fake_tree(tmp_path, available_kb=512 * 1024)
    assert gate_mod.room(str(tmp_path)) == (512 * MB, "meminfo")


def test_the_lower_of_cgroup_and_meminfo_is_in_force(tmp_path):
    fake_tree(tmp_path, v2=(4000 * MB, 0, 0), available_kb=300 * 1024)
    assert gate_mod.room(str(tmp_path)) == (300 * MB, "meminfo")


def test_a_footprint_favours_recent_runs_and_a_memory_kill_raises_it():
    fp = mem.update(None, 100 * MB, 1.0)
    fp = mem.update(fp, 200 * MB, 1.0)
    assert fp.peak == 150 * MB and fp.runs == 2
    killed = mem.update(fp, 160 * MB, 1.0, killed=True)
    assert killed.peak == 160 * MB * mem.KILLED_MARGIN


def test_a_function_is_measured_on_every_run_until_its_footprint_is_learnt():
    assert mem.worth_measuring(None, 40)
    young = mem.Footprint(0.0, 0.001, mem.LEARNING_RUNS - 1, estimated=True)
    assert all(mem.worth_measuring(young, n) for n in range(1, 40))


def test_a_function_with_a_negligible_peak_is_measured_once_in_a_sample():
    small = mem.Footprint(4096.0, 0.001, mem.LEARNING_RUNS, estimated=True)
    measured = [n for n in range(4 * mem.SAMPLE_EVERY) if mem.worth_measuring(small, n)]
    assert measured == [0, mem.SAMPLE_EVERY, 2 * mem.SAMPLE_EVERY, 3 * mem.SAMPLE_EVERY]


def test_a_function_whose_peak_matters_is_measured_on_every_run():
    big = mem.Footprint(50 * MB, 1.0, 100, estimated=True)
    assert all(mem.worth_measuring(big, n) for n in range(40))


def test_the_gate_counts_each_function_s_runs_for_its_sample():
    store = open_store("memory://")
    store.record_runs([("app:small", 0, 0.001, False, True)] * mem.LEARNING_RUNS, 0.0)
    store.record_runs([("app:big", 100 * MB, 1.0, False, False)], 0.0)
    gate = gate_mod.MemoryGate(store)
    gate.footprint("app:small"), gate.footprint("app:big")  # as a pass does before they start
    small = [gate.measures_run("app:small") for _ in range(2 * mem.SAMPLE_EVERY)]
    assert small.count(True) == 2 and small[0]
    assert all(gate.measures_run("app:big") for _ in range(mem.SAMPLE_EVERY))
    assert all(gate.measures_run("app:unknown") for _ in range(3))  # nothing learnt yet


def test_a_job_that_does_not_fit_waits_unless_nothing_else_runs():
    assert mem.decide(50 * MB, 40 * MB, 0, running_here=1) == mem.Decision(False, "memory")
    assert mem.decide(50 * MB, 40 * MB, 0, running_here=0) == mem.Decision(True, "alone")
    assert mem.decide(50 * MB, 400 * MB, 0, running_here=3, rss_room=10 * MB) == mem.Decision(False, "max_rss")


def test_the_backoff_is_short_grows_and_has_jitter():
    rng = random.Random(7)
    waits = [mem.backoff(n, rng) for n in range(8)]
    assert 0.25 <= waits[0] <= 0.75 and max(waits) <= 15
    assert len({round(w, 6) for w in waits}) == len(waits)


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "root"
    fake_tree(root, v2=(4000 * MB, 0, 0))
    return root


def tighten(root: Path, free_mb: int) -> None:
    (root / "sys/fs/cgroup/queickd.service/memory.current").write_text(f"{(4000 - free_mb) * MB}\n")


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'queue.db'}"
    return request.getfixturevalue("pg_fresh_database")


def test_a_job_that_may_not_fit_is_deferred_without_an_attempt_then_starts_when_room_appears(
        start_daemon, store_url, tree, gate):
    d = start_daemon(store_url, "--memory-root", str(tree), workers=2)
    with d.client() as q:
        assert q.wait(q.enqueue("testjobs:hold_memory", [40]), 20)["state"] == State.SUCCEEDED  # learnt
        tighten(tree, 80)  # 80 MB free, 64 reserved: 16 MB of room for a 40 MB job
        q.enqueue("testjobs:gate", [gate.port, "busy"])
        assert gate.arrival() == "busy"  # something else runs on this worker
        big = q.enqueue("testjobs:hold_memory", [40])
        d.wait_for_line(rf"job {big} testjobs:hold_memory deferred")
        job = q.get(big)
        assert job["state"] == State.QUEUED and job["attempts"] == 0
        assert q.stats()["memory"]["deferred"]["memory"] >= 1
        assert q.stats()["memory"]["source"] == "cgroup"
        tighten(tree, 2000)
        done = q.wait(big, 30)
        gate.release_all()
    assert (done["state"], done["attempts"]) == (State.SUCCEEDED, 1)


def test_a_job_deferred_for_memory_keeps_the_head_of_its_serial_key(start_daemon, store_url, tree, gate):
    d = start_daemon(store_url, "--memory-root", str(tree), workers=2)
    with d.client() as q:
        assert q.wait(q.enqueue("testjobs:hold_memory", [40]), 20)["state"] == State.SUCCEEDED  # learnt
        tighten(tree, 80)  # room for 16 MB: a 40 MB job is deferred while another job runs
        q.enqueue("testjobs:gate", [gate.port, "busy"])
        assert gate.arrival() == "busy"
        big = q.enqueue("testjobs:hold_memory", [40], key="k")
        small = q.enqueue("testjobs:add", [1, 2], key="k")  # enqueued after it: runs after it
        d.wait_for_lines(rf"job {big} testjobs:hold_memory deferred", 2)  # claimed again, deferred again
        assert q.get(small)["state"] == State.QUEUED  # a worker was free all along: the key held it
        tighten(tree, 2000)
        first, second = q.wait(big, 30), q.wait(small, 30)
        gate.release_all()
    assert (first["state"], second["state"]) == (State.SUCCEEDED, State.SUCCEEDED)
    assert second["started_at"] >= first["finished_at"]


def test_an_external_worker_claims_a_job_it_set_aside_again_and_keeps_its_key_order(
        start_daemon, start_worker, pg_fresh_database, tree, gate):
    d = start_daemon(pg_fresh_database, workers=0)
    w = start_worker(pg_fresh_database, extra=("--memory-root", str(tree), "--sweep", "60"))
    with d.client() as q:
        assert q.wait(q.enqueue("testjobs:hold_memory", [40]), 20)["state"] == State.SUCCEEDED  # learnt
        tighten(tree, 80)
        q.enqueue("testjobs:gate", [gate.port, "busy"])
        assert gate.arrival() == "busy"
        big = q.enqueue("testjobs:hold_memory", [40], key="k")
        small = q.enqueue("testjobs:add", [1, 2], key="k")
        w.wait_for_lines(rf"job {big} testjobs:hold_memory deferred", 2)  # its wait up, claimed again
        assert q.get(small)["state"] == State.QUEUED
        tighten(tree, 2000)
        first, second = q.wait(big, 30), q.wait(small, 30)
        gate.release_all()
    assert second["started_at"] >= first["finished_at"]


def test_a_job_that_may_not_fit_starts_anyway_when_nothing_else_runs(start_daemon, tree):
    d = start_daemon(None, "--memory-root", str(tree), workers=2)
    with d.client() as q:
        assert q.wait(q.enqueue("testjobs:hold_memory", [40]), 20)["state"] == State.SUCCEEDED
        tighten(tree, 10)
        job = q.wait(q.enqueue("testjobs:hold_memory", [40]), 20)
        assert q.stats()["memory"]["deferred"] == {}
    assert (job["state"], job["attempts"]) == (State.SUCCEEDED, 1)
    d.wait_for_line(r"starts although it may not fit in memory")


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _gate_with_a_100mb_function(tree: Path) -> tuple[gate_mod.MemoryGate, _Clock]:
    store = open_store("memory://")
    store.record_runs([("app:big", 100 * MB, 1.0, False, False)], 0.0)
    clock = _Clock()
    return gate_mod.MemoryGate(store, reserve_mb=0, root=str(tree), clock=clock), clock


def _big(job_id: int):
    return make_job(id=job_id, func="app:big")


def test_a_fresh_reading_of_the_room_lets_the_next_passes_start_jobs_without_reading_it_again(tmp_path):
    fake_tree(tmp_path, v2=(1000 * MB, 0, 0))
    gate, clock = _gate_with_a_100mb_function(tmp_path)
    assert gate.split([_big(1)], running_here=0) == ([_big(1)], [])
    fake_tree(tmp_path, v2=(1000 * MB, 950 * MB, 0))  # the files say no room now
    clock.now += gate_mod.ROOM_FRESH / 2
    assert gate.split([_big(2)], running_here=1) == ([_big(2)], [])  # the reading, less job 1's 100 MB
    clock.now += gate_mod.ROOM_FRESH
    assert gate.split([_big(3)], running_here=2) == ([], [_big(3)])  # stale: read again, no room


def test_a_reading_less_what_started_since_never_defers_a_job_without_a_look_at_the_room(tmp_path):
    fake_tree(tmp_path, v2=(150 * MB, 0, 0))
    gate, clock = _gate_with_a_100mb_function(tmp_path)
    assert gate.split([_big(1)], running_here=0) == ([_big(1)], [])
    fake_tree(tmp_path, v2=(1000 * MB, 0, 0))  # room appeared (job 1 ended, say)
    clock.now += gate_mod.ROOM_FRESH / 2
    # The reading less job 1's 100 MB leaves 50 MB: not trusted to defer, the files say 1000.
    assert gate.split([_big(2)], running_here=1) == ([_big(2)], [])


def test_what_a_running_job_may_still_take_is_its_peak_less_the_drop_in_room_since_it_started():
    assert mem.still_to_take([], 500 * MB) == 0
    assert mem.still_to_take([(100 * MB, 500 * MB)], 500 * MB) == 100 * MB  # not grown yet
    assert mem.still_to_take([(100 * MB, 500 * MB)], 440 * MB) == 40 * MB  # grown by 60
    assert mem.still_to_take([(100 * MB, 500 * MB)], 300 * MB) == 0  # past its peak
    assert mem.still_to_take([(100 * MB, 500 * MB)], 900 * MB) == 100 * MB  # room freed elsewhere
    # Two started together, the room down by 100: that is one of them grown, not both.
    assert mem.still_to_take([(100 * MB, 500 * MB), (100 * MB, 500 * MB)], 400 * MB) == 100 * MB


def test_a_started_job_s_expected_peak_counts_after_the_room_is_read_again_until_it_ends(tmp_path):
    fake_tree(tmp_path, v2=(1000 * MB, 864 * MB, 0))  # 136 MB of room
    gate, clock = _gate_with_a_100mb_function(tmp_path)
    assert gate.split([_big(1)], running_here=0) == ([_big(1)], [])
    clock.now += 4 * gate_mod.ROOM_FRESH  # stale: read again; job 1 has not grown yet
    assert gate.split([_big(2)], running_here=1) == ([], [_big(2)])
    gate.after_run(_big(1), 100 * MB, 1.0, killed=False, estimated=False)
    assert gate.split([_big(2)], running_here=0) == ([_big(2)], [])


def test_under_max_rss_a_started_job_s_expected_peak_counts_after_the_room_is_read_again(tmp_path):
    fake_tree(tmp_path, v2=(4000 * MB, 0, 0))
    (tmp_path / "proc/self/statm").write_text(f"0 {164 * MB // gate_mod._PAGE} 0 0 0 0 0\n")
    store = open_store("memory://")
    store.record_runs([("app:big", 100 * MB, 1.0, False, False)], 0.0)
    clock = _Clock()
    gate = gate_mod.MemoryGate(store, reserve_mb=0, max_rss_mb=300, root=str(tmp_path), clock=clock)
    assert gate.split([_big(1)], running_here=0) == ([_big(1)], [])  # 136 MB under --max-rss
    clock.now += 4 * gate_mod.ROOM_FRESH
    assert gate.split([_big(2)], running_here=1) == ([], [_big(2)])
    assert gate.snapshot()["deferred"] == {"max_rss": 1}


def test_a_pass_reads_footprints_in_its_transaction_while_a_writer_waits_on_its_claimed_rows(pg_url):
    # A pass that claimed a job holds its row; a client's wait on that job marks the row from
    # the shared connection and waits for it. The pass's footprint read must not wait for
    # that connection in turn: it reads in the pass's own transaction.
    import threading

    import psycopg
    from store_contract import T0, job

    from queickd.core.policy.claim import Request
    from queickd.store.postgres.store import PostgresStore

    store = PostgresStore(pg_url)
    watching = psycopg.connect(pg_url, autocommit=True)
    try:
        store.submit([job()], T0)
        gate = gate_mod.MemoryGate(store)
        with store.transaction(bookkeeping=True) as tx:
            claimed = tx.claim_available(Request.of(1, now=T0))
            waiter = threading.Thread(target=store.watch_finish, args=(claimed[0].id,), daemon=True)
            waiter.start()
            for _ in range(2000):  # until the mark waits for the claimed row's lock
                if watching.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                    " AND query LIKE 'UPDATE jobs SET waited%%'").fetchone()[0]:
                    break
                waiter.join(0.005)
            else:
                pytest.fail("the client's mark never waited for the claimed row")
            assert gate.split(claimed, 0, tx) == (claimed, [])
        waiter.join(10)
        assert not waiter.is_alive()
    finally:
        watching.close()
        store.close()
