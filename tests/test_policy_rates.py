"""core/policy/rates.py and its place in the claim's selection: at most `limit` starts of a
key per window of `per` seconds, skip not block, and the time a refused key may start."""

import json

from queickd.core.policy import claim, rates
from queickd.core.policy.claim import Request, Row, Running


def row(i: int, rate: tuple | None = None, key: str | None = None) -> Row:
    rl = None if rate is None else json.dumps(dict(zip(("key", "limit", "per"), rate, strict=True)))
    return Row(i, key, "m:f", "default", False, rate_limit=rl)


def pick(rows, windows, now: float, limit: int = 10):
    s = claim.Selection(Request.of(limit, now=now), Running(rates=windows))
    s.offer_all(rows)
    return s


def test_a_key_starts_at_most_its_limit_in_one_claim():
    s = pick([row(i, ("k", 2, 1.0)) for i in range(5)], {}, now=100.0)
    assert s.chosen == [0, 1]


def test_a_start_leaves_the_window_after_per_seconds():
    w = {"k": rates.Window(1, 1.0, [99.0])}
    assert pick([row(1, ("k", 1, 1.0))], w, now=99.99).chosen == []
    assert pick([row(1, ("k", 1, 1.0))], w, now=100.0).chosen == [1]


def test_a_refused_job_holds_nothing_behind_it():
    w = {"k": rates.Window(1, 10.0, [100.0])}
    assert pick([row(1, ("k", 1, 10.0)), row(2), row(3, ("other", 1, 10.0))], w, now=101.0).chosen == [2, 3]


def test_a_refused_job_still_holds_its_serial_key():
    w = {"k": rates.Window(1, 10.0, [100.0])}
    assert pick([row(1, ("k", 1, 10.0), key="s"), row(2, key="s")], w, now=101.0).chosen == []


def test_the_selection_says_when_a_refused_key_may_start():
    w = {"k": rates.Window(2, 10.0, [95.0, 100.0])}
    assert pick([row(1, ("k", 2, 10.0))], w, now=101.0).rates.next_at() == 105.0


def test_a_blocked_key_starts_nothing_until_its_time():
    w = {"k": rates.Window(100, 1.0, [], blocked_until=130.0)}
    s = pick([row(1, ("k", 100, 1.0))], w, now=129.0)
    assert s.chosen == [] and s.rates.next_at() == 130.0
    assert pick([row(1, ("k", 100, 1.0))], w, now=130.0).chosen == [1]


def test_a_claim_that_fills_a_window_says_when_it_opens():
    s = pick([row(1, ("k", 1, 2.0))], {}, now=100.0)
    assert s.chosen == [1] and s.rates.next_at() == 102.0


def test_the_log_keeps_only_the_newest_limit_starts_and_the_given_windows_are_left_alone():
    given = {"k": rates.Window(2, 9.5, [90.0, 91.0])}
    s = pick([row(1, ("k", 2, 9.5))], given, now=100.0)
    assert s.rates.windows["k"].starts == [91.0, 100.0] and given["k"].starts == [90.0, 91.0]


def test_the_log_forgets_starts_that_left_the_window():
    s = pick([row(1, ("k", 5, 1.0))], {"k": rates.Window(5, 1.0, [90.0, 99.5])}, now=100.0)
    assert s.rates.windows["k"].starts == [99.5, 100.0]


def test_plain_leaves_a_rate_limited_head_to_the_selection():
    assert claim.plain([row(1, ("k", 5, 1.0))], Request.of(1), False) is None


def test_a_claim_that_starts_several_jobs_of_a_key_logs_each_start():
    s = pick([row(i, ("k", 5, 1000.0)) for i in range(4)], {"k": rates.Window(5, 1000.0, [99.0])}, now=100.0)
    assert s.chosen == [0, 1, 2, 3] and s.rates.started_windows["k"].starts == [99.0, 100.0, 100.0, 100.0, 100.0]


def test_the_common_claim_takes_rate_limited_heads_only_if_their_keys_admit_every_one():
    heads = [row(1, ("k", 2, 1.0)), row(2, ("k", 2, 1.0)), row(3)]
    assert rates.admit_all(heads, {}, now=100.0) is not None
    assert claim.plain(heads, Request.of(3), False, rated=True) == [1, 2, 3]
    assert rates.admit_all(heads, {"k": rates.Window(2, 1.0, [99.5])}, now=100.0) is None
