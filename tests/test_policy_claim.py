"""Unit tests for core/policy/claim.py: plain candidates in, the ids that may start out."""

from __future__ import annotations

from queickd.core.policy.claim import Request, Row, Running, Selection, plain, select


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
