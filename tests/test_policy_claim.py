"""Unit tests for core/policy/claim.py: plain candidates in, the ids that may start out."""

from __future__ import annotations

from queickd.core.policy.claim import Request, Row, Running, Selection, Totals, plain, select


def row(job_id: int, key: str | None = None, func: str = "m:f", pool: str = "default",
        net: bool = False) -> Row:
    return Row(job_id, key, func, pool, net)


def test_candidates_start_in_queue_order_up_to_the_limit():
    assert select([row(i) for i in range(1, 6)], Request(3), Running()) == [1, 2, 3]


def test_a_key_starts_one_job_per_claim():
    assert select([row(1, "k"), row(2, "k"), row(3)], Request(5), Running()) == [1, 3]


def test_a_key_with_a_running_job_starts_nothing():
    assert select([row(1, "k"), row(2)], Request(5), Running(keys=frozenset({"k"}))) == [2]


def test_jobs_of_a_paused_function_are_passed_over():
    assert select([row(1, func="m:bad"), row(2)], Request(5), Running(paused_funcs=frozenset({"m:bad"}))) == [2]


def test_jobs_of_a_paused_key_are_passed_over():
    assert select([row(1, "k"), row(2, "j")], Request(5), Running(paused_keys=frozenset({"k"}))) == [2]


def test_a_head_passed_over_for_its_function_holds_its_key():
    cands = [row(1, "k", func="m:bad"), row(2, "k"), row(3)]
    assert select(cands, Request(5), Running(paused_funcs=frozenset({"m:bad"}))) == [3]


def test_network_jobs_wait_while_the_network_is_down():
    assert select([row(1, net=True), row(2)], Request(5, network_up=False), Running()) == [2]


def test_network_jobs_start_while_the_network_is_up():
    assert select([row(1, net=True)], Request(5), Running()) == [1]


def test_a_head_waiting_for_the_network_holds_its_key():
    assert select([row(1, "k", net=True), row(2, "k")], Request(5, network_up=False), Running()) == []


def test_only_the_served_pools_start():
    cands = [row(1, pool="a"), row(2, pool="b"), row(3)]
    assert select(cands, Request.of(5, pools=["a", "default"]), Running()) == [1, 3]


def test_a_head_of_another_pool_holds_its_key():
    assert select([row(1, "k", pool="b"), row(2, "k")], Request.of(5, pools=["default"]), Running()) == []


def test_a_job_the_claimer_sets_aside_is_passed_over():
    assert select([row(1), row(2)], Request.of(5, exclude=[1]), Running()) == [2]


def test_a_head_the_claimer_sets_aside_holds_its_key():
    assert select([row(1, "k"), row(2, "k"), row(3)], Request.of(5, exclude=[1]), Running()) == [3]


def test_plain_leaves_a_head_set_aside_to_the_selection():
    assert plain([row(1), row(2)], Request.of(2, exclude=[2]), False) is None
    assert plain([row(1), row(2)], Request.of(2, exclude=[3]), False) == [1, 2]


def test_no_pool_at_all_starts_nothing():
    assert select([row(1)], Request.of(5, pools=[]), Running()) == []


def test_a_limit_of_zero_starts_nothing():
    assert select([row(1)], Request(0), Running()) == []


def test_running_of_ignores_jobs_without_a_key_and_splits_pauses_by_kind():
    r = Running.of(["a", None, "b"], [("key", "k"), ("func", "m:f")])
    assert (r.keys, r.paused_keys, r.paused_funcs) == ({"a", "b"}, {"k"}, {"m:f"})


def test_a_selection_offered_one_by_one_says_which_start_and_when_it_is_full():
    s = Selection(Request(2), Running())
    assert [s.offer(c) for c in (row(1, "k"), row(2, "k"), row(3))] == [True, False, True]
    assert s.full and not s.offer(row(4)) and s.chosen == [1, 3]


def test_offering_all_at_once_decides_as_offering_one_by_one():
    cands = [row(1, "k"), row(2, "k", func="m:bad"), row(3, "j", net=True), row(4, "j"), row(5), row(6)]
    req, run = Request(3, network_up=False), Running(paused_funcs=frozenset({"m:bad"}))
    one = Selection(req, run)
    for c in cands:
        one.offer(c)
    assert select(cands, req, run) == one.chosen == [1, 5, 6]



def test_a_pause_whose_probe_is_due_lets_exactly_one_job_through():
    s = Selection(Request(5), Running(paused_funcs=frozenset({"m:bad"}), probes=frozenset({("func", "m:bad")})))
    s.offer_all([row(1, func="m:bad"), row(2, func="m:bad"), row(3)])
    assert s.chosen == [1, 3] and s.probes == [(("func", "m:bad"), 1)]


def test_a_probe_is_not_taken_by_a_job_its_key_holds_back():
    running = Running(keys=frozenset({"k"}), paused_funcs=frozenset({"m:bad"}),
                      probes=frozenset({("func", "m:bad")}))
    s = Selection(Request(5), running)
    s.offer_all([row(1, "k", func="m:bad"), row(2, func="m:bad"), row(3, func="m:bad")])
    assert s.chosen == [2] and s.probes == [(("func", "m:bad"), 2)]


def test_a_job_under_a_pause_with_no_probe_due_waits_though_its_other_pause_probes():
    running = Running(paused_funcs=frozenset({"m:bad"}), paused_keys=frozenset({"k"}),
                      probes=frozenset({("key", "k")}))
    assert select([row(1, "k", func="m:bad")], Request(5), running) == []


def test_jobs_of_a_paused_pool_are_passed_over():
    assert select([row(1), row(2, pool="gpu")], Request(5), Running.of([], [("pool", "default")])) == [2]


def test_plain_takes_the_heads_when_no_rule_applies_to_them():
    assert plain([row(1), row(2)], Request(2), paused=False) == [1, 2]


def test_plain_defers_to_the_selection_when_a_rule_may_apply():
    from queickd.core.policy.claim import Limits

    assert plain([row(1), row(2, "k")], Request(2), paused=False) is None  # a key
    assert plain([row(1)], Request(1), paused=True) is None  # a pause somewhere
    assert plain([row(1, net=True)], Request(1, network_up=False), paused=False) is None
    assert plain([row(1, pool="other")], Request(1, pools=frozenset({"default"})), paused=False) is None
    assert plain([row(1)], Request(1, limits=Limits(pools={"default": 3})), paused=False) is None
    grouped = Row(1, None, "m:f", "default", False, 0.0, "api", 2, 1.0)
    assert plain([grouped], Request(1), paused=False) is None


def test_plain_decides_as_the_selection_whenever_it_answers():
    import random

    rnd = random.Random(7)
    answered = 0
    for _ in range(2000):
        rows = [row(i, key=rnd.choice([None, None, None, "k", "j"]), pool=rnd.choice(["default", "default", "b"]),
                    net=rnd.random() < 0.2) for i in range(1, rnd.randint(1, 8))]
        req = Request(rnd.randint(1, 5), network_up=rnd.random() < 0.7,
                      pools=rnd.choice([None, frozenset({"default"})]))
        got = plain(rows[:req.limit], req, paused=False)
        if got is not None:
            answered += 1
            assert got == select(rows, req, Running())
    assert answered > 200  # the common case is common here too


def grouped_row(job_id: int, group: str | None, limit: int | None = 2, units: float | None = None,
                pool: str = "default", key: str | None = None, net: bool = False) -> Row:
    return Row(job_id, key, "m:f", pool, net, 0.0, group, limit, units)


def running_of(*jobs: tuple[str | None, int | None, str, float | None]) -> Running:
    """What runs, from (group, limit, pool, cost) of each running job."""
    return Running.of_jobs([(None, g, None, n, p, u) for g, n, p, u in jobs])


def totals_of(*jobs: tuple[str | None, int | None, str, float | None]) -> Totals:
    """What runs in total, as a store reads it (claim.Totals), from the same jobs."""
    limits = [n or 1 for g, n, _, _ in jobs if g is not None]
    return Totals(len(jobs), min(limits) if limits else None, sum(max(1.0 if u is None else u, 0.0) for *_, u in jobs))


def test_plain_takes_grouped_heads_within_their_groups_and_budgets():
    from queickd.core.policy.claim import Limits

    heads = [grouped_row(1, "api", 3, 2.0), grouped_row(2, "api", 3, 2.0), grouped_row(3, None)]
    req = Request(3, limits=Limits(pools={"default": 8}, groups={"api": 5}))
    assert plain(heads, req, paused=False, running=running_of(("api", 3, "default", 1.0))) == [1, 2, 3]


def test_plain_needs_what_runs_for_a_grouped_head_or_a_budget():
    from queickd.core.policy.claim import Limits

    assert plain([grouped_row(1, "api")], Request(1), paused=False) is None
    assert plain([row(1)], Request(1, limits=Limits(pools={"default": 3})), paused=False) is None


def test_plain_defers_when_a_heads_group_is_full_with_the_heads_before_it():
    heads = [grouped_row(1, "api", 2), grouped_row(2, "api", 2)]
    assert plain(heads, Request(2), paused=False, running=running_of(("api", 2, "default", None))) is None


def test_plain_defers_when_a_head_is_over_its_pool_budget_with_the_heads_before_it():
    from queickd.core.policy.claim import Limits

    heads = [grouped_row(1, None, units=3.0), grouped_row(2, None, units=3.0)]
    req = Request(2, limits=Limits(pools={"default": 8}))
    assert plain(heads, req, paused=False, running=running_of((None, None, "default", 3.0))) is None


def test_plain_defers_when_a_head_is_over_its_group_budget():
    from queickd.core.policy.claim import Limits

    req = Request(1, limits=Limits(groups={"api": 2}))
    assert plain([grouped_row(1, "api", 5, 1.5)], req, paused=False,
                 running=running_of(("api", 5, "default", 1.0))) is None


def test_plain_defers_for_a_group_its_running_jobs_fill_though_the_heads_limit_is_higher():
    # The stores leave such a group's jobs out of what they read (Selection.full_groups).
    assert plain([grouped_row(1, "api", 5)], Request(1), paused=False,
                 running=running_of(("api", 1, "default", None))) is None


def test_plain_with_totals_takes_grouped_heads_that_fit_with_every_running_job_in_their_group():
    from queickd.core.policy.claim import Limits

    heads = [grouped_row(1, "api", 5, 1.0), grouped_row(2, "api", 5, 1.0)]
    req = Request(2, limits=Limits(pools={"default": 10}, groups={"api": 10}))
    assert plain(heads, req, paused=False, running=Totals(3, 5, 3.0)) == [1, 2]


def test_plain_with_totals_defers_when_the_running_jobs_could_fill_a_heads_group():
    heads = [grouped_row(1, "api", 3), grouped_row(2, "api", 3)]
    assert plain(heads, Request(2), paused=False, running=Totals(2, 3, None)) is None


def test_plain_with_totals_defers_while_a_running_job_of_a_lower_limit_may_fill_its_group():
    assert plain([grouped_row(1, "api", 5)], Request(1), paused=False, running=Totals(1, 1, None)) is None


def test_plain_with_totals_defers_at_a_budgets_edge():
    from queickd.core.policy.claim import Limits

    req = Request(1, limits=Limits(pools={"default": 3}))
    assert plain([grouped_row(1, None, units=1.0)], req, paused=False, running=Totals(2, None, 2.0)) is None
    assert plain([grouped_row(1, None, units=1.0)], req, paused=False, running=Totals(2, None, 1.9)) == [1]


def test_plain_with_totals_counts_the_heads_before_each_in_its_budgets():
    from queickd.core.policy.claim import Limits

    heads = [grouped_row(1, None, units=2.0), grouped_row(2, None, units=2.0)]
    req = Request(2, limits=Limits(pools={"default": 3}))
    assert plain(heads, req, paused=False, running=Totals(0, None, 0.0)) is None


def test_plain_with_totals_needs_their_units_while_a_budget_is_in_force():
    from queickd.core.policy.claim import Limits

    req = Request(1, limits=Limits(pools={"default": 3}))
    assert plain([row(1)], req, paused=False, running=Totals(0, None, None)) is None


def test_plain_with_what_runs_or_its_totals_decides_as_the_selection_whenever_it_answers():
    import random
    from collections import Counter

    from queickd.core.policy.claim import Limits

    rnd = random.Random(11)
    answered: Counter[type] = Counter()
    grouped_answers: Counter[type] = Counter()
    for _ in range(2000):
        groups = ["a", "b", "c"]
        limit_of = {g: rnd.choice([1, 2, 3, None]) for g in groups}

        def units() -> float | None:
            return rnd.choice([None, None, 0.5, 1.0, 2.5, 0.1])

        rows = []
        for i in range(1, rnd.randint(1, 8)):
            g = rnd.choice([None, *groups, *groups])
            lim = limit_of[g] if g is not None and rnd.random() < 0.9 else rnd.choice([1, 2, 4])
            rows.append(Row(i, rnd.choice([None] * 8 + ["k"]), "m:f", rnd.choice(["default"] * 4 + ["b"]),
                            rnd.random() < 0.1, rnd.choice([0.0, -100.0]), g, lim, units()))
        ran = [(g, limit_of[g] if g else None, rnd.choice(["default", "b"]), units())
               for g in rnd.choices([None, *groups], k=rnd.randint(0, 4))]
        budget = Limits(pools=rnd.choice([{}, {"default": rnd.choice([2.0, 4.0, 100.0])}]),
                        groups=rnd.choice([{}, {g: rnd.choice([1.0, 3.0, 50.0]) for g in rnd.sample(groups, 2)}]),
                        patience=rnd.choice([30.0, 0.0]))
        req = Request(rnd.randint(1, 5), network_up=rnd.random() < 0.8,
                      pools=rnd.choice([None, None, frozenset({"default"})]), limits=budget, now=50.0)
        running = running_of(*ran)
        want = select(rows, req, running)
        for what in (running, totals_of(*ran)):
            got = plain(rows[:req.limit], req, paused=False, running=what)
            if got is not None:
                answered[type(what)] += 1
                grouped = any(r.concurrency_group is not None for r in rows[:req.limit]) or budget.any
                grouped_answers[type(what)] += grouped
                assert got == want
    # heads with groups or budgets are answered often here, from what runs or its totals
    assert grouped_answers[Running] > 300 and grouped_answers[Totals] > 200, grouped_answers


def test_plain_defers_when_a_grouped_head_before_it_has_a_lower_limit():
    heads = [grouped_row(1, "api", 1), grouped_row(2, "api", 3)]  # the selection takes only the first
    assert plain(heads, Request(2), paused=False, running=Running()) is None
    assert plain(heads, Request(2), paused=False, running=Totals(0, None, None)) is None
