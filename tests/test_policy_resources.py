"""The pure resource policies: claim rules for groups and budgets, per-function defaults and
the enqueue-time refusals (core/policy/claim.py, core/policy/resources.py)."""

from __future__ import annotations

import pytest

from queickd.core.job import NewJob
from queickd.core.policy.claim import Limits, Request, Row, Running, select
from queickd.core.policy.resources import budget_changes, budget_view, describe_budgets, parse
from queickd.core.protocol import QueueError


def row(i, group=None, limit=None, cost=None, pool="default", run_at=0.0, key=None):
    return Row(i, key, "m:f", pool, False, run_at, group, limit, cost)


def test_a_full_group_is_skipped_not_blocking():
    running = Running.of_jobs([(None, "api", 1, 1, "default", None)])
    assert select([row(1, "api", 1), row(2, "db", 1), row(3)], Request(5), running) == [2, 3]


def test_slots_are_the_lowest_free_numbers():
    from queickd.core.policy.claim import Selection

    s = Selection(Request(5), Running.of_jobs([(None, "api", 2, 3, "default", None)]))
    s.offer_all([row(1, "api", 3), row(2, "api", 3), row(3, "api", 3)])
    assert s.chosen == [1, 2] and (s.slot(1), s.slot(2)) == (1, 3)


def test_a_cheaper_job_passes_one_over_the_budget_until_it_is_patient():
    limits = Limits(pools={"default": 4}, patience=10)
    running = Running.of_jobs([(None, None, None, None, "default", 2)])
    heavy, light = row(1, cost=3, run_at=0.0), row(2, cost=1, run_at=1.0)
    assert select([heavy, light], Request(5, limits=limits, now=5.0), running) == [2]
    assert select([heavy, light], Request(5, limits=limits, now=10.0), running) == []


def test_a_function_default_fills_only_what_the_job_left_unset():
    r = parse({"m:f": {"cost_units": 3, "concurrency_group": "api", "concurrency_limit": 2}}, {}, 30)
    job = r.apply(NewJob("m:f", run_at=0, cost_units=1.5))
    assert (job.cost_units, job.concurrency_group, job.concurrency_limit) == (1.5, "api", 2)


def test_a_functions_fair_key_is_its_jobs_default():
    r = parse({"m:f": {"fair_by": "acme"}}, {}, 30)
    assert (r.apply(NewJob("m:f", run_at=0)).fair_by, r.apply(NewJob("m:f", run_at=0, fair_by="b")).fair_by) == (
        "acme", "b")


def test_fair_shares_weights_come_with_the_budgets():
    assert parse({}, {}, 30, {"acme": 2}).limits.fair == {"acme": 2.0}


def test_a_job_over_a_whole_budget_is_refused_naming_it():
    r = parse({}, {"pools": {"gpu": 2}}, 30)
    with pytest.raises(QueueError, match="pool 'gpu'"):
        r.apply(NewJob("m:f", run_at=0, pool="gpu", cost_units=3))


@pytest.mark.parametrize(("functions", "budgets", "named"), [
    ({"m:f": {"cost_units": -1}}, {}, "cost_units"),
    ({"m:f": {"nonsense": 1}}, {}, "nonsense"),
    ({}, {"pools": {"p": 0}}, "budgets.pools.p"),
    ({}, {"groups": {"g" * 201: 1}}, "200 bytes"),
    ({}, {"tenants": {"a": 1}}, "tenants"),
    ({"m:f": {"fair_by": "x" * 201}}, {}, "fair_by"),
])
def test_bad_tables_are_refused_naming_the_field(functions, budgets, named):
    with pytest.raises(ValueError, match=named):
        parse(functions, budgets, 30)


def test_the_budget_view_lists_every_budget_with_its_use():
    limits = Limits(pools={"p": 5}, groups={"g": 2})
    view = budget_view(limits, {("pool", "p"): (3.0, 2, 1.0, 1)})
    assert view == [{"kind": "pool", "name": "p", "limit": 5, "running": 3.0, "running_jobs": 2, "waiting": 1.0,
                     "waiting_jobs": 1},
                    {"kind": "group", "name": "g", "limit": 2, "running": 0.0, "running_jobs": 0, "waiting": 0.0,
                     "waiting_jobs": 0}]


def test_budget_changes_name_each_budget_added_changed_and_removed():
    old = Limits(pools={"default": 3, "gpu": 2}, groups={"api": 2})
    new = Limits(pools={"default": 5}, groups={"api": 2, "db": 1}, patience=5)  # patience: not a budget
    assert [str(c) for c in budget_changes(old, new)] == [
        "pool 'default' 3 -> 5", "pool 'gpu' 2 -> none", "group 'db' none -> 1"]
    assert budget_changes(new, Limits(new.pools, new.groups)) == []
    assert describe_budgets(new) == "pool 'default' 5, group 'api' 2, group 'db' 1"


# --- what a claim leaves out, and what a job that can never start holds ---------------------
def test_a_used_up_group_budgets_backlog_is_left_out_and_not_counted_against_the_look_ahead():
    from queickd.core.policy.claim import LOOK_AHEAD, Selection

    running = Running.of_jobs([(None, "openai", 1, 100, "default", 1.0)])
    s = Selection(Request(1, limits=Limits(groups={"openai": 1})), running)
    assert s.out_groups == {"openai"}
    s.offer_all([row(i, "openai", 100, 1) for i in range(1, LOOK_AHEAD + 65)])
    assert not s.done
    s.offer_all([row(10_000)])
    assert s.chosen == [10_000]


def test_a_used_up_pool_budgets_backlog_is_left_out_and_not_counted_against_the_look_ahead():
    from queickd.core.policy.claim import LOOK_AHEAD, Selection

    running = Running.of_jobs([(None, None, None, None, "gpu", 2.0)])
    s = Selection(Request(1, limits=Limits(pools={"gpu": 2})), running)
    assert s.out_pools == {"gpu"}
    s.offer_all([row(i, pool="gpu") for i in range(1, LOOK_AHEAD + 65)])
    assert not s.done
    s.offer_all([row(10_000)])
    assert s.chosen == [10_000]


def test_the_selection_stops_at_its_look_ahead_of_candidates_it_counts():
    from queickd.core.policy.claim import LOOK_AHEAD

    over = [row(i, cost=9) for i in range(1, LOOK_AHEAD + 65)]  # a budget of 5 has room, not for them
    assert select([*over, row(10_000)], Request(1, limits=Limits(pools={"default": 5})), Running()) == []


def test_a_job_over_its_budgets_whole_limit_reserves_nothing_however_long_it_waited():
    limits = Limits(pools={"default": 2}, patience=10)  # lowered below the cost it was accepted with
    big, small = row(1, cost=3, run_at=0.0), row(2, cost=1, run_at=50.0)
    assert select([big, small], Request(5, limits=limits, now=100.0), Running()) == [2]


def test_a_job_over_one_whole_budget_reserves_none_of_its_other_budgets():
    limits = Limits(pools={"default": 4}, groups={"api": 2}, patience=10)
    running = Running.of_jobs([(None, None, None, None, "default", 2.0)])
    big, small = row(1, "api", 5, cost=3, run_at=0.0), row(2, cost=1, run_at=50.0)
    assert select([big, small], Request(5, limits=limits, now=100.0), running) == [2]


def test_never_fit_names_each_budget_its_waiting_jobs_exceed_and_how_to_act():
    from queickd.core.policy.costs import never_fit

    limits = Limits(pools={"default": 2}, groups={"api": 5})
    jobs = [(1, "default", None, 3.0), (2, "default", "api", 6.0), (3, "default", "api", 1.5), (4, "b", None, None)]
    found = never_fit(limits, jobs)
    assert [(m.kind, m.name, m.job_ids) for m in found] == [("group", "api", [2]), ("pool", "default", [1, 2])]
    assert str(found[1]) == ("2 waiting job(s) cost more than the whole budget of pool 'default' (2) and can never"
                             " start (ids 1, 2): cancel them, or raise the budget (budgets.pools.default >= 6)")


def test_a_group_admits_no_job_past_the_lowest_limit_of_its_running_jobs():
    running = Running.of_jobs([(None, "g", 1, 1, "default", None)])  # it runs with limit 1
    assert select([row(i, "g", 3) for i in (1, 2, 3)], Request(5), running) == []


def test_a_job_started_with_a_lower_limit_caps_its_group_for_the_jobs_after_it():
    assert select([row(1, "g", 1), row(2, "g", 3), row(3, "g", 3)], Request(5), Running()) == [1]
