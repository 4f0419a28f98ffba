"""Unit tests for core/policy/orphans.py: (job id, times orphaned) in, the plan out."""

from __future__ import annotations

from queickd.core.policy import orphans


def test_an_orphan_under_the_limit_is_requeued():
    assert orphans.plan([(7, 0)], 3) == orphans.Plan(requeue=[7], dead=[])


def test_an_orphan_at_the_limit_is_dead():
    assert orphans.plan([(7, 3)], 3) == orphans.Plan(requeue=[], dead=[7])


def test_a_limit_of_zero_gives_up_every_orphan():
    assert orphans.plan([(1, 0), (2, 5)], 0).dead == [1, 2]


def test_ids_come_out_sorted():
    p = orphans.plan([(9, 0), (3, 2), (5, 0), (1, 2)], 2)
    assert (p.requeue, p.dead) == ([5, 9], [1, 3])


def test_no_orphans_plan_nothing():
    assert orphans.plan([], 3) == orphans.Plan([], [])


def test_a_given_up_orphan_is_told_why():
    assert orphans.ERROR["type"] == "orphaned"


def test_a_job_running_in_this_process_is_not_an_orphan():
    assert orphans.plan([(1, 0), (2, 0), (3, 5)], 3, running_here={2, 3}) == orphans.Plan([1], [])
