"""Unit tests for queickd.core.retry: spec defaults, validation and the four backoff policies."""

from __future__ import annotations

import random

import pytest

from queickd.core.job import RetrySpec
from queickd.core.retry import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_INTERVAL,
    RETRY_TYPE,
    delay,
    make_spec,
    spec_from_dict,
)

# --- make_spec: defaults ------------------------------------------------------------------


def test_make_spec_defaults_to_exponential_from_one_second():
    spec = make_spec()
    assert spec == RetrySpec(
        policy=RETRY_TYPE.EXPONENTIAL,
        interval=1.0,
        max_interval=DEFAULT_MAX_INTERVAL,
        max_attempts=DEFAULT_MAX_ATTEMPTS,
    )


def test_make_spec_default_max_interval_is_one_hour_and_max_attempts_ten():
    spec = make_spec()
    assert spec.max_interval == 3600.0
    assert spec.max_attempts == 10


@pytest.mark.parametrize(
    ("policy", "interval"),
    [
        (RETRY_TYPE.EXPONENTIAL, 1.0),
        (RETRY_TYPE.CONSTANT, 10.0),
        (RETRY_TYPE.LINEAR_INCREASING, 5.0),
        (RETRY_TYPE.COUNT_INCREASING, 1.0),
    ],
)
def test_make_spec_default_interval_depends_on_the_policy(policy, interval):
    assert make_spec(policy).interval == interval


def test_make_spec_keeps_given_values_as_floats_and_int():
    spec = make_spec(RETRY_TYPE.CONSTANT, interval=3, max_interval=30, max_attempts=4)
    assert spec == RetrySpec(RETRY_TYPE.CONSTANT, 3.0, 30.0, 4)
    assert isinstance(spec.interval, float)
    assert isinstance(spec.max_interval, float)
    assert isinstance(spec.max_attempts, int)


def test_make_spec_accepts_a_single_attempt():
    assert make_spec(max_attempts=1).max_attempts == 1


# --- make_spec: validation ------------------------------------------------------------------


def test_make_spec_rejects_an_unknown_policy():
    with pytest.raises(ValueError, match="policy"):
        make_spec("fibonacci")


@pytest.mark.parametrize("interval", [0, -1.0])
def test_make_spec_rejects_a_non_positive_interval(interval):
    with pytest.raises(ValueError, match="positive"):
        make_spec(interval=interval)


@pytest.mark.parametrize("max_interval", [0, -5.0])
def test_make_spec_rejects_a_non_positive_max_interval(max_interval):
    with pytest.raises(ValueError, match="positive"):
        make_spec(max_interval=max_interval)


@pytest.mark.parametrize("max_attempts", [0, -3])
def test_make_spec_rejects_max_attempts_below_one(max_attempts):
    with pytest.raises(ValueError, match="max_attempts"):
        make_spec(max_attempts=max_attempts)


# --- spec_from_dict ---------------------------------------------------------------------------


def test_spec_from_dict_none_is_none():
    assert spec_from_dict(None) is None


def test_spec_from_dict_builds_a_spec_with_defaults_filled_in():
    assert spec_from_dict({"policy": RETRY_TYPE.LINEAR_INCREASING}) == make_spec(RETRY_TYPE.LINEAR_INCREASING)


def test_spec_from_dict_round_trips_to_dict():
    spec = make_spec(RETRY_TYPE.CONSTANT, interval=2.5, max_interval=20, max_attempts=3)
    assert spec_from_dict(spec.to_dict()) == spec


def test_spec_from_dict_validates_like_make_spec():
    with pytest.raises(ValueError):
        spec_from_dict({"policy": "nope"})


# --- delay: exponential -------------------------------------------------------------------


@pytest.mark.parametrize("failures", [1, 2, 3, 4, 5, 6])
def test_exponential_delay_doubles_from_interval_within_25_percent_jitter(failures):
    spec = make_spec(RETRY_TYPE.EXPONENTIAL, interval=2.0)
    base = 2.0 * 2 ** (failures - 1)
    for seed in range(50):
        d = delay(spec, failures, random.Random(seed))
        assert 0.75 * base <= d <= 1.25 * base


def test_exponential_delay_is_base_times_the_jitter_drawn_from_rand():
    spec = make_spec(RETRY_TYPE.EXPONENTIAL, interval=1.0)
    expected = 4.0 * random.Random(7).uniform(0.75, 1.25)
    assert delay(spec, 3, random.Random(7)) == pytest.approx(expected)


def test_exponential_delay_is_deterministic_for_a_seeded_rand():
    spec = make_spec(RETRY_TYPE.EXPONENTIAL)
    assert delay(spec, 4, random.Random(42)) == delay(spec, 4, random.Random(42))


def test_exponential_delay_jitter_spreads_jobs_that_failed_together():
    spec = make_spec(RETRY_TYPE.EXPONENTIAL, interval=10.0)
    delays = {delay(spec, 2, random.Random(seed)) for seed in range(20)}
    assert len(delays) > 1


def test_exponential_delay_without_rand_stays_within_jitter_bounds():
    spec = make_spec(RETRY_TYPE.EXPONENTIAL, interval=1.0)
    for _ in range(100):
        assert 3.0 <= delay(spec, 3) <= 5.0


def test_exponential_delay_is_capped_by_max_interval():
    spec = make_spec(RETRY_TYPE.EXPONENTIAL, interval=1.0, max_interval=10.0)
    for seed in range(20):
        assert delay(spec, 10, random.Random(seed)) == 10.0


def test_exponential_delay_does_not_overflow_for_a_huge_failure_count():
    spec = make_spec(RETRY_TYPE.EXPONENTIAL, interval=1.0, max_interval=60.0)
    assert delay(spec, 10_000, random.Random(0)) == 60.0


def test_exponential_delay_treats_zero_failures_as_the_first():
    spec = make_spec(RETRY_TYPE.EXPONENTIAL, interval=8.0)
    assert delay(spec, 0, random.Random(3)) == delay(spec, 1, random.Random(3))


# --- delay: constant, linear_increasing, count_increasing -----------------------------------


@pytest.mark.parametrize("failures", [1, 2, 5, 9])
def test_constant_delay_is_always_the_interval(failures):
    spec = make_spec(RETRY_TYPE.CONSTANT, interval=7.0)
    assert delay(spec, failures) == 7.0


def test_constant_delay_is_capped_by_max_interval():
    spec = make_spec(RETRY_TYPE.CONSTANT, interval=100.0, max_interval=30.0)
    assert delay(spec, 1) == 30.0


@pytest.mark.parametrize("failures", [1, 2, 3, 7])
def test_linear_increasing_delay_is_interval_times_n(failures):
    spec = make_spec(RETRY_TYPE.LINEAR_INCREASING, interval=5.0)
    assert delay(spec, failures) == 5.0 * failures


def test_linear_increasing_delay_is_capped_by_max_interval():
    spec = make_spec(RETRY_TYPE.LINEAR_INCREASING, interval=5.0, max_interval=12.0)
    assert delay(spec, 3) == 12.0


@pytest.mark.parametrize("failures", [1, 2, 3, 8])
def test_count_increasing_waits_n_seconds_whatever_the_interval(failures):
    spec = make_spec(RETRY_TYPE.COUNT_INCREASING, interval=100.0)
    assert delay(spec, failures) == float(failures)


def test_count_increasing_delay_is_capped_by_max_interval():
    spec = make_spec(RETRY_TYPE.COUNT_INCREASING, max_interval=4.0)
    assert delay(spec, 9) == 4.0


@pytest.mark.parametrize(
    "policy", [RETRY_TYPE.CONSTANT, RETRY_TYPE.LINEAR_INCREASING, RETRY_TYPE.COUNT_INCREASING]
)
def test_non_exponential_delays_ignore_rand(policy):
    spec = make_spec(policy, interval=3.0)
    assert delay(spec, 2, random.Random(1)) == delay(spec, 2, random.Random(99))
