"""Unit tests for core/policy/pauses.py: finished runs and the streaks read in, the plan out."""

from __future__ import annotations

from queickd.core.job import State
from queickd.core.policy import pauses as pz

NOW = 1_750_000_000.0
E = {"type": "E", "message": "no"}


def look(streaks: dict | None = None, paused: set | None = None) -> pz.Lookups:
    streaks, paused = streaks or {}, paused or set()
    return pz.Lookups(lambda t: (streaks.get(t, 0), t in paused))


def failed(key: str | None = None, func: str = "m:f", err: dict | None = E) -> pz.Finish:
    return pz.Finish(State.DEAD, err, key, func)


def test_a_failure_extends_the_streaks_of_its_key_and_function():
    p = pz.plan([failed("k")], NOW, 3, look({("func", "m:f"): 1}))
    assert p.streaks == {("key", "k"): (1, E), ("func", "m:f"): (2, E)} and p.pauses == {}


def test_a_scheduled_retry_counts_for_nothing():
    # Only a job with no retry left counts: its own retries come first.
    assert pz.plan([pz.Finish(State.SCHEDULED, E, None, "m:f")], NOW, 1, look()) == pz.Plan()


def test_the_death_of_a_job_whose_function_was_missing_counts_for_nothing():
    missing = {"type": "not_found", "message": "module m defines no function 'f'"}
    streaks = {("key", "k"): 2, ("func", "m:f"): 2}
    assert pz.plan([failed("k", err=missing)] * 3, NOW, 3, look(streaks)) == pz.Plan()


def test_a_streak_reaching_pause_after_begins_a_pause():
    p = pz.plan([failed()], NOW, 3, look({("func", "m:f"): 2}))
    assert p.new == [(("func", "m:f"), 3, E)] and p.pauses == {("func", "m:f"): (NOW, 3, E)}


def test_without_pause_after_nothing_pauses():
    assert pz.plan([failed()], NOW, None, look({("func", "m:f"): 99})).pauses == {}


def test_a_failure_of_a_paused_target_updates_the_pause_and_keeps_its_time():
    p = pz.plan([failed()], NOW, 3, look({("func", "m:f"): 5}, {("func", "m:f")}))
    assert p.new == [] and p.pauses == {("func", "m:f"): (None, 6, E)}


def test_a_success_ends_a_streak():
    p = pz.plan([pz.Finish(State.SUCCEEDED, None, "k", "m:f")], NOW, 3, look({("key", "k"): 2}))
    assert p.reset == [("key", "k")] and p.streaks == {}


def test_a_success_with_no_streak_writes_nothing():
    assert pz.plan([pz.Finish(State.SUCCEEDED, None, "k", "m:f")], NOW, 3, look()) == pz.Plan()


def test_a_success_does_not_lift_a_pause():
    p = pz.plan([pz.Finish(State.SUCCEEDED, None, None, "m:f")], NOW, 3,
                look({("func", "m:f"): 4}, {("func", "m:f")}))
    assert p.reset == [("func", "m:f")] and p.pauses == {}


def test_a_run_parked_for_the_network_counts_for_nothing():
    assert pz.plan([pz.Finish(State.WAITING_NETWORK, E, "k", "m:f")], NOW, 1, look()) == pz.Plan()


def test_runs_finished_together_count_in_order():
    p = pz.plan([failed(), failed(), pz.Finish(State.SUCCEEDED, None, None, "m:f"), failed()], NOW, 9, look())
    assert p.reset == [("func", "m:f")] and p.streaks == {("func", "m:f"): (1, E)}


def test_a_pause_begun_in_a_batch_is_reported_as_begun_and_written_as_it_ends():
    late = {"type": "L", "message": ""}
    p = pz.plan([failed(), failed(), failed(err=late)], NOW, 2, look())
    assert p.new == [(("func", "m:f"), 2, E)] and p.pauses == {("func", "m:f"): (NOW, 3, late)}


def test_each_target_is_read_once_per_plan():
    reads = []
    p = pz.plan([failed("k"), failed("k")], NOW, 9, pz.Lookups(lambda t: reads.append(t) or (0, False)))
    assert sorted(reads) == [("func", "m:f"), ("key", "k")] and p.streaks[("key", "k")] == (2, E)


def test_targets_are_the_key_then_the_function():
    assert pz.targets("k", "m:f") == [("key", "k"), ("func", "m:f")] and pz.targets(None, "m:f") == [("func", "m:f")]


# --- the breaker: cooldowns and probes --------------------------------------------------
def probing(job_id: int, trips: int = 1, failures: int = 3) -> pz.Lookups:
    t = ("func", "m:f")
    return pz.Lookups(lambda x: (failures, True) if x == t else (0, False),
                      lambda x: (trips, job_id) if x == t else (0, None))


def test_a_pause_begun_with_a_cooldown_has_its_probe_one_cooldown_later():
    p = pz.plan([failed()], NOW, 3, look({("func", "m:f"): 2}), cooldown=60.0)
    assert p.probes == {("func", "m:f"): (NOW + 60.0, 1)} and p.next_probe == NOW + 60.0


def test_a_pause_begun_without_a_cooldown_has_no_probe():
    assert pz.plan([failed()], NOW, 3, look({("func", "m:f"): 2})).probes == {}


def test_the_probes_success_lifts_the_pause_and_its_streak():
    p = pz.plan([pz.Finish(State.SUCCEEDED, None, None, "m:f", 7)], NOW, 3, probing(7), cooldown=60.0)
    assert p.resumed == [("func", "m:f")] and p.reset == [("func", "m:f")] and p.pauses == {}


def test_a_success_of_another_job_does_not_lift_the_pause():
    p = pz.plan([pz.Finish(State.SUCCEEDED, None, None, "m:f", 8)], NOW, 3, probing(7), cooldown=60.0)
    assert p.resumed == [] and p.pauses == {}


def test_the_probes_failure_pauses_again_with_a_doubled_cooldown():
    p = pz.plan([pz.Finish(State.DEAD, E, None, "m:f", 7)], NOW, 3, probing(7, trips=2), cooldown=60.0)
    assert p.probes == {("func", "m:f"): (NOW + 240.0, 3)} and p.pauses == {("func", "m:f"): (None, 4, E)}


def test_the_probes_death_for_a_missing_function_is_a_failed_probe():
    missing = {"type": "not_found", "message": "module m defines no function 'f'"}
    p = pz.plan([pz.Finish(State.DEAD, missing, None, "m:f", 7)], NOW, 3, probing(7), cooldown=60.0)
    assert p.probes == {("func", "m:f"): (NOW + 120.0, 2)}


def test_the_probes_scheduled_retry_is_a_failed_probe():
    p = pz.plan([pz.Finish(State.SCHEDULED, E, None, "m:f", 7)], NOW, 3, probing(7), cooldown=60.0)
    assert p.probes == {("func", "m:f"): (NOW + 120.0, 2)}


def test_the_cooldown_grows_to_an_hour_at_most():
    assert [pz.cooldown_for(300, n) for n in (1, 2, 3, 4, 5, 9)] == [300, 600, 1200, 2400, 3600, 3600]
    assert pz.cooldown_for(7200, 3) == 7200  # a cooldown longer than the cap is kept
