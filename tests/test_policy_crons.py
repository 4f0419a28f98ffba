"""Unit tests for core/policy/crons.py: a due tick fires a job or folds into a waiting run."""

from __future__ import annotations

from queickd.core.job import NewJob
from queickd.core.policy import crons

NOW = 1_750_000_000.0
TICK = NOW - 2


def test_a_tick_while_a_run_waits_is_folded():
    assert crons.fire("c", NewJob(func="m:f"), TICK, NOW, run_waiting=True) == crons.Fire(True, None)


def test_a_tick_with_no_run_waiting_fires_a_job_due_now():
    fire = crons.fire("c", NewJob(func="m:f", args=[1], run_at=0.0), TICK, NOW, run_waiting=False)
    assert not fire.folded
    assert (fire.job.func, fire.job.args, fire.job.run_at, fire.job.cron) == ("m:f", [1], NOW, "c")


def test_a_fired_job_is_serialized_under_the_crons_name():
    assert crons.job_for("c", NewJob(func="m:f"), TICK, NOW).key == "cron:c"


def test_a_template_key_wins_over_the_crons_name():
    assert crons.job_for("c", NewJob(func="m:f", key="k"), TICK, NOW).key == "k"


def test_each_tick_fires_under_its_own_idempotency_key():
    a, b = (crons.job_for("c", NewJob(func="m:f"), t, NOW) for t in (TICK, TICK + 60))
    assert a.idempotency_key == f"cron:c:{TICK!r}" and a.idempotency_key != b.idempotency_key
