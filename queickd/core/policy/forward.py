"""Forwarding to an upstream daemon, as pure rules: which jobs go upstream, the idempotency
key a forwarded job carries, what an upstream's reply to one job means, the pacing of
batches (bytes per second) and the back-off of reconnects. No I/O, no clock: the forwarder
(services/forwarder/) passes the time in."""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..fields import FIELDS
from ..jsontext import dumps
from ..protocol import Code

# Every forwarded job's idempotency key starts so: `<prefix><edge identity>:<local id>:<its
# created_at>` (the time tells a job of a store made anew, whose ids start again, from the
# job of the same id the old store forwarded).
# The upstream keeps these keys for as long as it keeps the job (admission exempts them
# from --idempotency-ttl): a resend after any outage, however long, finds the first copy.
KEY_PREFIX = "queickd-forward:"

# What a reply to one forwarded job can mean.
ACCEPTED = "accepted"  # the upstream has it (a new job, or the copy a resend found)
REFUSED = "refused"  # the upstream will never take it: it is dead here, with the reason
STOP = "stop"  # the upstream refuses us (a revoked token): hold everything, say so loudly
LATER = "later"  # the upstream cannot take it now (full, or failing): try again later

# An enqueue refused so is refused again when resent: the function is not allowed or not
# defined there, or the job is malformed for it.
REFUSING = frozenset({Code.NOT_ALLOWED, Code.BAD_REQUEST, Code.NOT_FOUND})

# The fields of an enqueue a forwarded job carries: what a client could have said, less
# the edge's own idempotency key (the forward's key replaces it), its run_at (sent as the
# delay left) and `manual` (not stored).
CARRIED = tuple(f for f in FIELDS if f.enqueue and f.job and f.name not in ("idempotency_key", "run_at"))


def forward_key(identity: str, job_id: int, created_at: float) -> str:
    return f"{KEY_PREFIX}{identity}:{job_id}:{created_at:.6f}"


def is_forward_key(key: str) -> bool:
    return key.startswith(KEY_PREFIX)


@dataclass(frozen=True)
class Route:
    """Which functions go upstream (fnmatch patterns, as `app:*`)."""

    patterns: tuple[str, ...] = ()

    def upstream(self, func: str) -> bool:
        return any(fnmatch.fnmatchcase(func, p) for p in self.patterns)


def meaning(reply: dict[str, Any]) -> str:
    """What the upstream's reply to one forwarded enqueue means (ACCEPTED ... LATER)."""
    if reply.get("ok"):
        return ACCEPTED
    code = (reply.get("error") or {}).get("code")
    if code == Code.UNAUTHORIZED:
        return STOP
    if code in REFUSING:
        return REFUSED
    return LATER


def request(job: Any, identity: str, now: float) -> dict[str, Any]:
    """The enqueue request that forwards a held job (a Job)."""
    req: dict[str, Any] = {"op": "enqueue", "idempotency_key": forward_key(identity, job.id, job.created_at)}
    for f in CARRIED:
        value = getattr(job, f.name)
        if value is not None and value != f.fresh_default():
            req[f.wire_name] = value.to_dict() if f.codec == "retry" else value
    if job.run_at > now:
        req["delay"] = job.run_at - now
    return req


def size(job: Any) -> int:
    """A held job's bytes, as the backlog and the pacing count them (and the SQL stores'
    held_backlog): its function's and its arguments' JSON text's length."""
    return len(job.func) + len(dumps(job.args)) + len(dumps(job.kwargs))


@dataclass
class Pacing:
    """A token bucket of bytes per second (0: no cap), one second's worth deep."""

    rate: float
    tokens: float = 0.0
    at: float | None = None

    def take(self, n: int, now: float) -> float:
        """Take n bytes' worth; returns how long to wait before sending them (0: at once)."""
        if self.rate <= 0:
            return 0.0
        if self.at is not None:
            self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate)
        self.at = now
        self.tokens -= n
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


def cut(sizes: Sequence[int], max_jobs: int, max_bytes: int) -> int:
    """How many of the next held jobs (their sizes, oldest first) one batch takes: at most
    max_jobs and, but for the first, no more than max_bytes."""
    total = 0
    for i, n in enumerate(sizes[:max_jobs]):
        total += n
        if i and total > max_bytes:
            return i
    return min(len(sizes), max_jobs)


@dataclass
class Backoff:
    """Reconnect delays: doubling from `first` to at most `most` seconds, reset by a success."""

    first: float = 1.0
    most: float = 60.0
    failures: int = 0

    def failed(self) -> float:
        self.failures += 1
        return min(self.most, self.first * math.pow(2, self.failures - 1))

    def succeeded(self) -> None:
        self.failures = 0
