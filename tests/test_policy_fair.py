"""core/policy/fair.py: the order in which a claim offers jobs with fair shares, its standings,
and the weights of the config file."""

import itertools

import pytest

from queickd.core.policy import claim, fair
from queickd.core.policy.claim import Request, Row, Running


def unit(key: str, ids, vtime: float = 0.0, last: float = 0.0, pool: str = "default") -> fair.Unit:
    return fair.Unit(pool, key, vtime, last, iter([Row(i, None, "m:f", pool, False) for i in ids]))


def offer(units, limit: int, weights=None, now: float = 100.0):
    pick = claim.Selection(Request.of(limit, now=now), Running())
    shares = fair.FairShares(weights or {}, now)
    shares.offer(pick, units)
    return pick.chosen, shares


def test_keys_of_equal_standing_take_turns():
    chosen, _ = offer([unit("a", range(0, 10)), unit("b", range(10, 20))], 4)
    assert chosen == [0, 10, 1, 11]


def test_the_least_advanced_key_goes_first():
    chosen, _ = offer([unit("b", [10], vtime=0.0), unit("a", [0, 1, 2], vtime=5.0)], 2)
    assert chosen == [10, 0]


def test_of_equal_standing_the_longest_since_its_last_start_goes_first():
    chosen, _ = offer([unit("b", [10], last=5.0), unit("a", [0], last=50.0)], 1)
    assert chosen == [10]


def test_a_weight_of_two_starts_two_jobs_for_anothers_one():
    chosen, _ = offer([unit("a", range(0, 30)), unit("b", range(100, 130))], 30, {"a": 2.0})
    assert (sum(i < 100 for i in chosen), sum(i >= 100 for i in chosen)) == (20, 10)


def test_a_started_key_advances_by_one_over_its_weight_and_marks_its_start():
    _, shares = offer([unit("a", [0, 1], vtime=3.0)], 2, {"a": 4.0}, now=77.0)
    moved = shares.moved[("default", "a")]
    assert (moved.vtime, moved.last_start) == (3.5, 77.0)


def test_a_job_passed_over_lets_its_keys_next_job_start_in_its_turn():
    pick = claim.Selection(Request.of(2, exclude=[0]), Running())
    fair.FairShares({}, 0.0).offer(pick, [unit("a", [0, 1]), unit("b", [10])])
    assert pick.chosen == [1, 10]


def test_a_claim_reads_no_more_keys_than_it_needs_however_many_wait():
    read = []

    def keys():
        for n in itertools.count():
            read.append(n)
            yield unit(f"k{n:05}", [n], vtime=float(n))

    chosen, _ = offer(keys(), 3)
    assert chosen == [0, 1, 2] and len(read) <= 4


def test_a_key_that_starts_waiting_again_comes_in_at_the_least_standing():
    assert fair.comes_in(2.0, 40.0) == 40.0
    assert fair.comes_in(50.0, 40.0) == 50.0  # never below its own
    assert fair.comes_in(2.0, None) == 2.0


def test_only_a_serial_keys_head_is_offered():
    rows = [Row(1, "k", "m:f", "default", False), Row(2, "k", "m:f", "default", False), Row(3, None, "m:f", "default", False)]
    assert [r.id for r in fair.heads_only(rows)] == [1, 3]


@pytest.mark.parametrize("weight", [0, -1, float("nan"), float("inf"), "2", True])
def test_a_weight_that_is_not_a_positive_number_is_refused_naming_its_key(weight):
    with pytest.raises(ValueError, match="fair_shares.acme"):
        fair.check_weights({"acme": weight})
