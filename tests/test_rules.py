"""Run-queue rules against a real daemon: serial keys, caps, conflicts, folding, events,
idempotency, dead letters, auto-pause, retention. No path drops a job silently."""

import itertools
import json
import subprocess
import sys
import threading

import pytest
from helpers import read_lines, run_together

from queickd.core.job import State
from queickd.core.protocol import QueueError


def queick(port, *args):
    return subprocess.run([sys.executable, "-m", "queickd", *args, "--port", str(port)],
                          capture_output=True, text=True, timeout=60)


# --- serial keys -------------------------------------------------------------------------
def test_one_job_per_key_runs_while_other_keys_go_on(client, gate):
    held = client.enqueue("testjobs:gate", args=(gate.port, "a1"), key="a")
    assert gate.arrival() == "a1"
    a2 = client.enqueue("testjobs:add", args=(1, 1), key="a")
    b1 = client.enqueue("testjobs:add", args=(2, 2), key="b")
    assert client.wait(b1, 20)["state"] == State.SUCCEEDED  # another key is not held up
    assert client.get(a2)["state"] == State.QUEUED  # the same key is
    gate.release_all()
    assert client.wait(held, 20)["state"] == State.SUCCEEDED
    assert client.wait(a2, 20)["started_at"] >= client.get(held)["finished_at"]


def test_jobs_of_one_key_run_one_at_a_time_in_enqueue_order(client, tmp_path):
    out = tmp_path / "order.txt"
    ids = {k: [client.enqueue("testjobs:append", args=(str(out), f"{k}{i}"), key=k) for i in range(15)]
           for k in "xyz"}
    for k in ids:
        jobs = [client.wait(i, 30) for i in ids[k]]
        for before, after in itertools.pairwise(jobs):
            assert after["started_at"] >= before["finished_at"]  # never overlapping
    lines = read_lines(out)
    for k in "xyz":
        assert [x for x in lines if x[0] == k] == [f"{k}{i}" for i in range(15)]


# --- overflow ----------------------------------------------------------------------------
@pytest.fixture
def capped(start_daemon):
    return start_daemon(None, "--max-queued-per-key", "2", "--max-queued", "5")


def test_a_full_key_answers_queue_full_with_retry_after(capped):
    with capped.client() as q:
        for _ in range(2):
            q.enqueue("testjobs:noop", key="k", delay=3600)
        with pytest.raises(QueueError) as e:
            q.enqueue("testjobs:noop", key="k", delay=3600)
        assert e.value.code == "queue_full" and e.value.retry_after > 0
        assert q.enqueue("testjobs:noop", key="other", delay=3600)  # other keys still get in
        assert q.stats()["refused"] == 1


def test_a_full_queue_answers_queue_full(capped):
    with capped.client() as q:
        q.enqueue_many([q.job("testjobs:noop", delay=3600) for _ in range(5)])
        with pytest.raises(QueueError) as e:
            q.enqueue("testjobs:noop")
        assert e.value.code == "queue_full"


def test_enqueue_many_over_the_cap_stores_none_of_its_jobs(capped):
    with capped.client() as q:
        with pytest.raises(QueueError) as e:
            q.enqueue_many([q.job("testjobs:noop", key="k", delay=3600) for _ in range(3)])
        assert e.value.code == "queue_full"
        assert q.stats()["counts"][State.SCHEDULED] == 0


def test_retrying_after_retry_after_is_accepted_once_there_is_room(capped):
    with capped.client() as q:
        first = q.enqueue("testjobs:noop", key="k", delay=3600)
        q.enqueue("testjobs:noop", key="k", delay=3600)
        result: list[int] = []
        sender = threading.Thread(target=lambda: result.append(
            q_block.enqueue("testjobs:noop", key="k", delay=3600, block=True, block_timeout=30)))
        with capped.client() as q_block:
            sender.start()
            q.cancel(first)  # room again
            sender.join(40)
        assert len(result) == 1 and q.get(result[0])["state"] == State.SCHEDULED


def test_a_manual_run_for_a_busy_key_is_a_conflict_naming_the_job(daemon):
    with daemon.client() as q:
        waiting = q.enqueue("testjobs:noop", key="pipeline", delay=3600)
        with pytest.raises(QueueError) as e:
            q.enqueue("testjobs:noop", key="pipeline", manual=True)
        assert e.value.code == "conflict" and e.value.job_id == waiting
        assert str(waiting) in e.value.message
    r = queick(daemon.port, "enqueue", "testjobs:noop", "--key", "pipeline", "--manual")
    assert r.returncode == 1 and "conflict" in r.stderr


def test_cron_ticks_while_a_run_is_running_keep_one_waiting_and_fold_the_rest(start_daemon, gate):
    d = start_daemon(None, "--sweep", "0.5")
    with d.client() as q:
        from queickd import SchedulingTime

        q.cron(SchedulingTime().every(seconds=0.3).from_now(), "testjobs:gate", args=(gate.port, "t"),
               name="slow")
        assert gate.arrival() == "t"  # the first run is held running
        d.wait_for_line("cron slow: its previous run is still waiting; tick folded")
        (cron,) = q.crons()
        jobs = [j for j in q.jobs() if j["cron"] == "slow"]
        assert cron["folded"] >= 1 and q.stats()["crons_folded"] >= 1
        assert sorted(j["state"] for j in jobs) == [State.QUEUED, State.RUNNING]
        q.cron_delete("slow")
        gate.release_all()


# --- events ------------------------------------------------------------------------------
def test_an_event_becomes_a_job_and_a_repeat_is_a_duplicate(client):
    first = client.emit_event("tap-1", "testjobs:add", args=(1, 2), key="reader")
    assert first["state"] == "delivered" and client.wait(first["job_id"], 20)["result"] == 3
    again = client.emit_event("tap-1", "testjobs:add", args=(1, 2), key="reader")
    assert again["duplicate"] and again["job_id"] == first["job_id"]


def test_an_event_waits_in_the_outbox_until_there_is_room(start_daemon):
    d = start_daemon(None, "--max-queued-per-key", "1", "--sweep", "0.5")
    with d.client() as q:
        blocker = q.enqueue("testjobs:noop", key="reader", delay=3600)
        ev = q.emit_event("tap-2", "testjobs:add", args=(2, 2), key="reader")
        assert (ev["state"], ev["job_id"]) == ("pending", None)
        assert q.stats()["events"]["pending"] == 1
        q.cancel(blocker)
        job_id = int(d.wait_for_line(r"event tap-2 delivered from the outbox as job (\d+)").group(1))
        assert q.wait(job_id, 20)["result"] == 4


def test_events_of_one_key_become_jobs_in_the_order_accepted_even_when_room_comes_between(start_daemon):
    d = start_daemon(None, "--max-queued-per-key", "1", "--sweep", "0.5")
    with d.client() as q:
        # The key is paused until tap-b is in: had the outbox delivered tap-a (it may, once
        # there is room) and its job run before tap-b came, tap-b would find room of its own.
        q.pause("reader")
        blocker = q.enqueue("testjobs:noop", key="reader", delay=3600)
        assert q.emit_event("tap-a", "testjobs:add", args=(1, 1), key="reader")["state"] == "pending"
        q.cancel(blocker)  # room for one: the later tap must not take it
        assert q.emit_event("tap-b", "testjobs:add", args=(2, 2), key="reader")["state"] == "pending"
        q.resume("reader")
        first = int(d.wait_for_line(r"event tap-a delivered from the outbox as job (\d+)").group(1))
        second = int(d.wait_for_line(r"event tap-b delivered from the outbox as job (\d+)").group(1))
        assert first < second
        assert q.wait(first, 20)["result"] == 2 and q.wait(second, 20)["result"] == 4


def test_an_undeliverable_event_becomes_a_dead_letter_and_can_be_retried(start_daemon):
    d = start_daemon(None, "--max-queued-per-key", "1", "--event-max-attempts", "2", "--sweep", "0.5")
    with d.client() as q:
        blocker = q.enqueue("testjobs:noop", key="reader", delay=3600)
        q.emit_event("tap-3", "testjobs:add", args=(3, 3), key="reader")
        d.wait_for_line("event tap-3 could not be delivered after 2 attempts")
        dead = q.dead()
        assert [e["event_id"] for e in dead["events"]] == ["tap-3"]
        assert "queue_full" in dead["events"][0]["last_error"]
        listing = queick(d.port, "dead").stdout
        assert "tap-3" in listing
        q.cancel(blocker)
        assert q.retry_event("tap-3")["state"] == "pending"
        job_id = int(d.wait_for_line(r"event tap-3 delivered from the outbox as job (\d+)").group(1))
        assert q.wait(job_id, 20)["result"] == 6


# --- idempotency -------------------------------------------------------------------------
def test_concurrent_duplicate_enqueues_return_one_id(daemon):
    ids, lock = [], threading.Lock()

    def send():
        with daemon.client() as q:
            for _ in range(20):
                job_id = q.enqueue("testjobs:noop", idempotency_key="order-42")
                with lock:
                    ids.append(job_id)

    run_together(*[send] * 4)
    assert len(ids) == 80 and len(set(ids)) == 1


# --- dead letters ------------------------------------------------------------------------
def test_dead_retry_all_and_purge(daemon):
    port = daemon.port
    with daemon.client() as q:
        ids = [q.enqueue("testjobs:fail") for _ in range(3)]
        for i in ids:
            q.wait(i, 20)
        assert sorted(j["id"] for j in q.dead()["jobs"]) == ids
        assert json.loads(queick(port, "retry", "--all", "--json").stdout) == {"retried": 3}
        for i in ids:
            assert q.wait(i, 20)["state"] == State.DEAD  # they ran again and failed again
        assert "0 dead" in queick(port, "purge", "--dead", "--older-than", "7d").stdout
        assert "3 dead" in queick(port, "purge", "--dead", "--older-than", "0").stdout
        assert q.dead()["jobs"] == []


def test_bad_durations_are_usage_errors(daemon):
    r = queick(daemon.port, "purge", "--dead", "--older-than", "soon")
    assert r.returncode == 2 and "duration" in r.stderr


# --- auto-pause --------------------------------------------------------------------------
@pytest.fixture
def pausing(start_daemon):
    return start_daemon(None, "--pause-after", "2", workers=1)


def _pause_key(q, d):
    for _ in range(2):
        q.wait(q.enqueue("testjobs:fail", key="ledger"), 20)
    d.wait_for_line("key ledger paused after 2 failed runs")


def test_repeated_failures_pause_a_key_until_resumed(pausing):
    with pausing.client() as q:
        _pause_key(q, pausing)
        waiting = q.enqueue("testjobs:add", args=(1, 1), key="ledger")
        other = q.enqueue("testjobs:noop")  # enqueued after, claimed past the paused job
        q.wait(other, 20)
        assert q.get(waiting)["state"] == State.QUEUED
        paused = q.stats()["paused"]
        assert {(p["kind"], p["name"]) for p in paused} >= {("key", "ledger")}
        assert paused[0]["last_error"]["type"] == "ValueError"
        assert "PAUSED key ledger" in queick(pausing.port, "jobs").stdout
        assert queick(pausing.port, "resume", "ledger").returncode == 0
        q.resume(func="testjobs:fail")
        assert q.wait(waiting, 20)["result"] == 2
        assert q.stats()["paused"] == []


def test_a_manual_run_resumes_a_paused_key(pausing):
    with pausing.client() as q:
        _pause_key(q, pausing)
        q.resume(func="testjobs:fail")
        job = q.wait(q.enqueue("testjobs:add", args=(2, 2), key="ledger", manual=True), 20)
        assert job["result"] == 4


def test_resuming_something_not_paused_is_not_found(daemon):
    with daemon.client() as q, pytest.raises(QueueError) as e:
        q.resume("nothing")
    assert e.value.code == "not_found"


# --- retention ---------------------------------------------------------------------------
def test_finished_jobs_are_pruned_after_keep_finished(start_daemon):
    d = start_daemon(None, "--keep-finished", "0", "--sweep", "0.5")
    with d.client() as q:
        done = q.enqueue("testjobs:noop")  # not waited on: at keep 0 it may be gone by then
        dead = q.enqueue("testjobs:fail")
        q.wait(dead, 20)
        d.wait_for_line("retention: pruned 1 finished job")
        with pytest.raises(QueueError):
            q.get(done)
        assert q.get(dead)["state"] == State.DEAD  # dead letters stay until purged


def test_a_retention_shorter_than_the_idempotency_ttl_is_warned_of_at_start(start_daemon):
    d = start_daemon(None, "--keep-finished", "1h", "--idempotency-ttl", "1d")
    d.wait_for_line("keep_finished .* is shorter than idempotency_ttl")
