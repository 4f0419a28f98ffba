"""Retry policies: Queick's four backoff kinds and their defaults.

The delay before attempt n+1 is timed from the failure of attempt n, never from the job's
first scheduled time, so a job that was down for an hour does not burst to catch up.
"""

from __future__ import annotations

import random
from typing import Any

from .job import RetrySpec


class RETRY_TYPE:  # noqa: N801 - Queick's public name, kept for drop-in clients
    EXPONENTIAL = "exponential"
    CONSTANT = "constant"
    LINEAR_INCREASING = "linear_increasing"
    COUNT_INCREASING = "count_increasing"


POLICIES = (
    RETRY_TYPE.EXPONENTIAL,
    RETRY_TYPE.CONSTANT,
    RETRY_TYPE.LINEAR_INCREASING,
    RETRY_TYPE.COUNT_INCREASING,
)

# Default interval per policy: exponential 1, 2, 4 … s; constant 10 s; linear 5, 10, 15 … s;
# count_increasing is always 1, 2, 3 … s.
DEFAULT_INTERVAL = {
    RETRY_TYPE.EXPONENTIAL: 1.0,
    RETRY_TYPE.CONSTANT: 10.0,
    RETRY_TYPE.LINEAR_INCREASING: 5.0,
    RETRY_TYPE.COUNT_INCREASING: 1.0,
}
DEFAULT_MAX_INTERVAL = 3600.0
DEFAULT_MAX_ATTEMPTS = 10  # every run, the first included
DEFAULT_POLICY = RETRY_TYPE.EXPONENTIAL


def make_spec(
    policy: str = DEFAULT_POLICY,
    interval: float | None = None,
    max_interval: float | None = None,
    max_attempts: int | None = None,
) -> RetrySpec:
    """Build a RetrySpec with the defaults filled in. Raises ValueError on bad values."""
    if policy not in POLICIES:
        raise ValueError(f"retry policy must be one of {', '.join(POLICIES)}")
    spec = RetrySpec(
        policy=policy,
        interval=float(DEFAULT_INTERVAL[policy] if interval is None else interval),
        max_interval=float(DEFAULT_MAX_INTERVAL if max_interval is None else max_interval),
        max_attempts=int(DEFAULT_MAX_ATTEMPTS if max_attempts is None else max_attempts),
    )
    if spec.interval <= 0 or spec.max_interval <= 0:
        raise ValueError("retry interval and max_interval must be positive")
    if spec.max_attempts < 1:
        raise ValueError("retry max_attempts must be at least 1")
    return spec


def spec_from_dict(d: dict[str, Any] | None) -> RetrySpec | None:
    return make_spec(**d) if d else None


def delay(spec: RetrySpec, failures: int, rand: random.Random | None = None) -> float:
    """Seconds to wait after the `failures`-th failed attempt (1-based) before the next.

    Exponential doubling carries ±25 % jitter so that jobs that failed together do not
    retry together; the others are exact, as their names promise. All are capped by
    max_interval.
    """
    n = max(1, failures)
    if spec.policy == RETRY_TYPE.EXPONENTIAL:
        base = spec.interval * 2.0 ** min(n - 1, 62)
        jitter = (rand or random).uniform(0.75, 1.25)
        return min(spec.max_interval, base * jitter)
    if spec.policy == RETRY_TYPE.CONSTANT:
        return min(spec.max_interval, spec.interval)
    if spec.policy == RETRY_TYPE.LINEAR_INCREASING:
        return min(spec.max_interval, spec.interval * n)
    # count_increasing: n seconds after the n-th failure, as in Queick (interval unused)
    return min(spec.max_interval, float(n))
