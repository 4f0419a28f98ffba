"""Jobs through a real daemon: run, results, failures, retries, scheduling, operator actions."""

import functools
import time

import pytest
from helpers import read_lines, run_together

from queickd import SchedulingTime
from queickd.core.job import State
from queickd.core.protocol import Code, QueueError


def test_an_enqueued_job_runs_and_its_result_is_stored(client):
    job_id = client.enqueue("testjobs:add", args=(2, 3))
    job = client.wait(job_id, 20)
    assert (job["state"], job["result"], job["attempts"]) == (State.SUCCEEDED, 5, 1)
    assert job["finished_at"] >= job["started_at"] >= job["created_at"]


def test_dotted_function_names_and_kwargs_are_accepted(client):
    job_id = client.enqueue("testjobs.kwargs_echo", kwargs={"a": 1, "b": [2]})
    assert client.wait(job_id, 20)["result"] == {"a": 1, "b": [2]}


def test_a_callable_is_named_by_its_module(client):
    import testjobs

    assert client.wait(client.enqueue(testjobs.add, args=(1, 1)), 20)["result"] == 2


def test_a_failing_job_without_retry_is_dead_with_its_error(client):
    job = client.wait(client.enqueue("testjobs:fail", args=("bad thing",)), 20)
    assert job["state"] == State.DEAD and job["attempts"] == 1
    assert job["error"]["type"] == "ValueError"
    assert job["error"]["message"] == "bad thing"
    assert "testjobs.py" in job["error"]["traceback"]


def test_retries_stop_at_max_attempts(client):
    job_id = client.enqueue("testjobs:fail", retry=True, retry_type="count_increasing", max_attempts=3)
    job = client.wait(job_id, 30)
    assert (job["state"], job["attempts"]) == (State.DEAD, 3)


def test_retry_delays_are_timed_from_each_failure(client, tmp_path):
    # count_increasing waits 1 s after the first failure and 2 s after the second.
    log = tmp_path / "times.txt"
    job_id = client.enqueue("testjobs:append_time_and_fail", args=(str(log),), retry=True,
                            retry_type="count_increasing", max_attempts=3)
    assert client.wait(job_id, 30)["state"] == State.DEAD
    t = [float(x) for x in read_lines(log)]
    assert len(t) == 3
    assert t[1] - t[0] >= 1.0 and t[2] - t[1] >= 2.0


def test_a_failed_job_waits_scheduled_for_its_backoff(client):
    job_id = client.enqueue("testjobs:fail", retry=True, retry_type="constant", retry_interval=3600,
                            max_attempts=2)
    job = client.wait(job_id, 20, states=[State.SCHEDULED])
    assert (job["state"], job["attempts"]) == (State.SCHEDULED, 1)
    assert job["error"]["type"] == "ValueError"
    assert job["run_at"] - job["started_at"] == pytest.approx(3600, abs=5)


def test_run_at_in_the_future_keeps_the_job_scheduled_until_then(client):
    start = time.time()
    job_id = client.enqueue_at(start + 1.0, "testjobs:add", args=(1, 2))
    assert client.get(job_id)["state"] == State.SCHEDULED
    job = client.wait(job_id, 20)
    assert job["state"] == State.SUCCEEDED
    assert job["started_at"] >= start + 1.0


def test_delay_is_relative_to_the_daemon_clock(client):
    job_id = client.enqueue("testjobs:noop", delay=1.0)
    job = client.wait(job_id, 20)
    # run_at is taken when the daemon reads the request; created_at when its commit lands,
    # a little later: the delay counts from the first, and the job never starts early.
    assert 0 < job["run_at"] - job["created_at"] <= 1.0
    assert job["started_at"] >= job["run_at"]


def test_enqueue_many_stores_all_jobs_in_order(client):
    ids = client.enqueue_many([client.job("testjobs:add", (i, i)) for i in range(50)])
    assert ids == sorted(ids) and len(set(ids)) == 50
    assert [client.wait(i, 20)["result"] for i in ids] == [2 * i for i in range(50)]


def test_an_idempotency_key_returns_the_first_job(client):
    a = client.enqueue("testjobs:noop", idempotency_key="once")
    b = client.enqueue("testjobs:noop", idempotency_key="once")
    assert a == b


def test_cancel_stops_a_scheduled_job_from_running(client):
    job_id = client.enqueue("testjobs:noop", delay=3600)
    assert client.cancel(job_id)["state"] == State.CANCELLED
    assert client.get(job_id)["state"] == State.CANCELLED


def test_cancel_of_a_finished_job_is_a_conflict(client):
    job_id = client.enqueue("testjobs:noop")
    client.wait(job_id, 20)
    with pytest.raises(QueueError) as e:
        client.cancel(job_id)
    assert e.value.code == "conflict"


def test_retry_sends_a_dead_job_back_to_the_queue(client, tmp_path):
    job_id = client.enqueue("testjobs:fail")
    assert client.wait(job_id, 20)["state"] == State.DEAD
    assert client.retry(job_id)["state"] in (State.QUEUED, State.RUNNING, State.DEAD)
    job = client.wait(job_id, 20)
    assert job["state"] == State.DEAD and job["attempts"] == 1  # ran again, failed again


def test_retry_of_a_job_that_is_not_dead_is_a_conflict(client):
    job_id = client.enqueue("testjobs:noop")
    client.wait(job_id, 20)
    with pytest.raises(QueueError) as e:
        client.retry(job_id)
    assert e.value.code == "conflict"


def test_unknown_job_ids_are_not_found(client):
    with pytest.raises(QueueError) as e:
        client.get(987654)
    assert e.value.code == "not_found"


def test_functions_outside_the_app_dir_are_not_allowed(client):
    for func in ("os:system", "subprocess:run", "builtins:eval"):
        with pytest.raises(QueueError) as e:
            client.enqueue(func, args=("true",))
        assert e.value.code == "not_allowed"
    assert client.stats()["enqueued"] == 0


def test_allow_patterns_admit_more_modules(start_daemon):
    d = start_daemon(None, "--allow", "json")
    with d.client() as q:
        assert q.wait(q.enqueue("json:dumps", args=([1],)), 20)["result"] == "[1]"


def test_a_missing_function_in_an_allowed_module_is_refused_not_a_crash(client):
    with pytest.raises(QueueError) as info:
        client.enqueue("testjobs:no_such_function")
    assert info.value.code == Code.NOT_FOUND
    assert client.wait(client.enqueue("testjobs:noop"), 20)["state"] == State.SUCCEEDED


def test_a_job_calling_sys_exit_does_not_stop_the_worker(client):
    assert client.wait(client.enqueue("testjobs:exit_job"), 20)["state"] == State.DEAD
    assert client.wait(client.enqueue("testjobs:add", args=(1, 1)), 20)["result"] == 2


def test_results_that_are_not_json_or_too_large_are_replaced_by_a_note(client):
    odd = client.wait(client.enqueue("testjobs:unserializable"), 20)
    assert odd["state"] == State.SUCCEEDED and odd["result"].startswith("<object object")
    big = client.wait(client.enqueue("testjobs:big_result", args=(200_000,)), 20)
    assert big["state"] == State.SUCCEEDED and "over the" in big["result"]


def test_wait_times_out_on_an_unfinished_job(client):
    job_id = client.enqueue("testjobs:noop", delay=3600)
    with pytest.raises(TimeoutError):
        client.wait(job_id, 0.2)


def test_jobs_lists_by_state(client):
    ok = client.enqueue("testjobs:noop")
    bad = client.enqueue("testjobs:fail")
    client.wait(ok, 20), client.wait(bad, 20)
    assert [j["id"] for j in client.jobs(State.DEAD)] == [bad]
    assert [j["id"] for j in client.jobs(limit=1)] == [bad]


def test_stats_count_jobs_by_state_and_show_the_scheduler_alive(client):
    client.wait(client.enqueue("testjobs:noop"), 20)
    s = client.stats()
    assert s["counts"][State.SUCCEEDED] == 1 and set(s["counts"]) == set(State.ALL)
    assert s["scheduler"]["alive"] is True
    assert s["workers"]["total"] == 4 and s["enqueued"] == 1


def test_a_cron_fires_on_its_interval(client, gate):
    cron = client.cron(SchedulingTime().every(seconds=1).from_now(), "testjobs:gate",
                       args=(gate.port, "tick"))
    assert gate.arrival() == "tick"
    gate.release_all()  # runs of one cron never overlap: the next tick waits for this one
    assert gate.arrival() == "tick"
    gate.release_all()
    fired = [j for j in client.jobs() if j["cron"] == cron["name"]]
    assert len(fired) >= 2
    assert fired[0]["created_at"] - fired[-1]["created_at"] >= 0.9
    assert client.crons()[0]["last_fired_at"] >= cron["next_run_at"]


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_cron_run_reads_the_tick_it_was_fired_for(daemon, client, isolation):
    cron = client.cron(SchedulingTime().every(seconds=1).from_now(), "testjobs:my_tick", name=f"tick-{isolation}",
                       isolation=isolation)
    job_id = int(daemon.wait_for_line(rf"cron tick-{isolation} fired job (\d+)").group(1))
    job = client.wait(job_id, 20)
    assert job["state"] == State.SUCCEEDED
    assert job["result"] == float(job["idempotency_key"].rsplit(":", 1)[1]) >= cron["next_run_at"] - 0.001
    client.cron_delete(cron["name"])


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_cron_run_held_back_reads_the_last_tick_folded_into_it(daemon, client, gate, isolation):
    name = f"held-{isolation}"
    client.cron(SchedulingTime().every(seconds=0.3).from_now(), "testjobs:my_ticks_after_gate",
                args=(gate.port, "t"), name=name, isolation=isolation)
    assert gate.arrival() == "t"  # the first run is held running; the next waits behind it
    # and the ticks after that are folded into the waiting one
    daemon.wait_for_lines(f"cron {name}: its previous run is still waiting; tick folded", 2)
    client.cron_delete(name)
    gate.release_all()
    assert gate.arrival() == "t"  # the waiting run starts
    gate.release_all()
    first, second = sorted((j for j in client.jobs() if j["cron"] == name), key=lambda j: j["id"])[:2]
    assert client.wait(first["id"], 20)["result"][0] == client.wait(first["id"], 20)["result"][1]
    tick, last = client.wait(second["id"], 20)["result"]
    assert tick == float(second["idempotency_key"].rsplit(":", 1)[1])
    assert last >= tick + 2 * 0.3 - 0.001  # two folded ticks at least, 0.3 s apart


def test_a_job_that_no_cron_fired_reads_no_tick(client):
    assert client.wait(client.enqueue("testjobs:my_tick"), 20)["result"] is None


def test_registering_the_same_cron_again_replaces_it(client):
    st = SchedulingTime().every(hours=1).starting_from(time.time() + 3600)
    client.cron(st, "testjobs:noop")
    client.cron(st, "testjobs:noop")
    assert len(client.crons()) == 1


def test_registering_an_interval_cron_again_keeps_its_next_tick(client):
    # A script that registers its crons at every start must not push them back each time.
    first = client.cron(SchedulingTime().every(hours=1), "testjobs:noop", name="hourly")
    again = client.cron(SchedulingTime().every(hours=1), "testjobs:noop", args=(1,), name="hourly")
    assert again["next_run_at"] == first["next_run_at"] and again["args"] == [1]
    assert client.crons()[0]["next_run_at"] == first["next_run_at"]


def test_registering_a_cron_with_another_start_moves_its_next_tick(client):
    client.cron(SchedulingTime().every(hours=1), "testjobs:noop", name="hourly")
    start = time.time() + 7200
    client.cron(SchedulingTime().every(hours=1).starting_from(start), "testjobs:noop", name="hourly")
    assert client.crons()[0]["next_run_at"] == start


def test_a_job_due_past_the_year_9999_is_refused_and_jobs_still_list(client):
    with pytest.raises(QueueError) as e:
        client.enqueue_at(1e20, "testjobs:noop")
    assert e.value.code == "bad_request"
    client.enqueue("testjobs:noop", delay=3600)
    assert len(client.jobs()) == 1


def test_a_cron_expression_is_validated(client):
    with pytest.raises(QueueError) as e:
        client.cron("61 * * * *", "testjobs:noop")
    assert e.value.code == "bad_request"
    client.cron("*/5 * * * *", "testjobs:noop", name="five")
    assert client.crons()[0]["schedule"] == {"cron": "*/5 * * * *"}
    client.cron_delete("five")
    assert client.crons() == []


def test_one_client_is_safe_to_share_between_threads(client):
    import threading

    ids: list[int] = []
    lock = threading.Lock()

    def work(n: int) -> None:
        for i in range(25):
            job_id = client.enqueue("testjobs:add", args=(n, i))
            assert client.get(job_id)["args"] == [n, i]  # replies never cross between threads
            with lock:
                ids.append(job_id)

    run_together(*(functools.partial(work, n) for n in range(8)))
    assert len(set(ids)) == 200
    assert {client.wait(i, 30)["state"] for i in ids} == {State.SUCCEEDED}
