"""Rate limits, the claim's rule about starts per key and time window (claim.py applies it
with the others).

A job may carry `rate_limit` {"key", "limit", "per"}: at most `limit` jobs of that key
start in any window of `per` seconds. The store keeps, per key, the times of its latest
starts (a sliding-window log of at most `limit` entries: exact, where a token bucket or a
generic cell rate would let `limit + 1` through in some window) and `blocked_until`, a time
before which none of its jobs starts (a job told so by the service it calls: an HTTP 429's
Retry-After, `queickd.RateLimited`). The rule:
- admits a job while its key has fewer than `limit` starts in the last `per` seconds
  (`now - per < t`) and is not blocked; started: `now` is logged for its key;
- passes over a job of a key that is not admitted, holding nothing (skip, not block): the
  jobs behind it, of other keys or of none, may start; its key's later jobs wait too, so
  a key's jobs start in queue order;
- knows when each key it refused may start next (`next_at`): the claimer's timer, so no
  one polls.
Pure: no I/O; `now` is the claim's.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

MAX_LIMIT = 10_000  # starts per window: the log kept per key is at most this long
MIN_PER, MAX_PER = 0.001, 86_400.0  # seconds: a millisecond to a day


class RateLimit(NamedTuple):
    key: str
    limit: int
    per: float


def parse(value: Any) -> RateLimit | None:
    """A job's rate_limit as stored (its JSON text, or the dict a Job holds) -> RateLimit."""
    if value is None:
        return None
    if type(value) is str:
        return _parse_text(value)
    return RateLimit(value["key"], int(value["limit"]), float(value["per"]))


@functools.lru_cache(maxsize=4096)
def _parse_text(text: str) -> RateLimit:
    return parse(json.loads(text))  # type: ignore[return-value]


def wire(r: RateLimit) -> dict[str, Any]:
    """The stored and wire form."""
    return {"key": r.key, "limit": r.limit, "per": r.per}


@dataclass(slots=True)
class Window:
    """One key's state: its limit and window as its last started job carried them, the
    times of its latest starts (oldest first, at most `limit` of them), and the time before
    which none of its jobs may start (0: none)."""

    limit: int
    per: float
    starts: list[float]
    blocked_until: float = 0.0

    def next_at(self, limit: int, per: float) -> float:
        """When a job of this key with this limit and window may start next."""
        t = self.blocked_until
        if len(self.starts) >= limit:
            t = max(t, self.starts[-limit] + per)
        return t

    def used(self, now: float, per: float | None = None) -> int:
        """Starts within the window that ends now."""
        edge = now - (self.per if per is None else per)
        return sum(1 for t in self.starts if t > edge)

    def full(self, now: float) -> bool:
        return self.next_at(self.limit, self.per) > now


def window_of(limit: int, per: float, starts: Iterable[float], blocked_until: float | None) -> Window:
    """A key's state as a store read it (starts in any order)."""
    return Window(limit, per, sorted(starts)[-limit:], blocked_until or 0.0)


class Windows(Protocol):
    """Where the rule reads a key's window: a dict, or a store's reader of one key at a time."""

    def get(self, key: str, /) -> Window | None: ...


class RateLimits:
    """The rule (claim.Rule): at most `limit` starts of a key per `per` seconds."""

    __slots__ = ("given", "started_windows", "now", "refused")

    def __init__(self, windows: Windows, now: float) -> None:
        self.given = windows  # key -> its window before this claim; never changed here
        self.started_windows: dict[str, Window] = {}  # the windows of keys started here, as they are now
        self.now = now
        self.refused: dict[str, float] = {}  # key -> when a job refused here may start

    @property
    def changed(self) -> list[str]:
        """Keys with a start logged here."""
        return sorted(self.started_windows)

    @property
    def windows(self) -> dict[str, Window]:
        """The windows given (a dict) with those of the keys started here."""
        return {**self.given, **self.started_windows}  # type: ignore[dict-item]

    def window(self, key: str) -> Window | None:
        w = self.started_windows.get(key)
        return w if w is not None else self.given.get(key)

    def admits(self, c: Any) -> bool:
        raw = c.rate_limit
        if raw is None:
            return True
        r = parse(raw)
        w = self.window(r.key)  # type: ignore[union-attr]
        if w is None:
            return True
        t = w.next_at(r.limit, r.per)  # type: ignore[union-attr]
        if t <= self.now:
            return True
        self.refused[r.key] = min(self.refused.get(r.key, math.inf), t)  # type: ignore[union-attr]
        return False

    def started(self, c: Any) -> None:
        raw = c.rate_limit
        if raw is None:
            return
        r = parse(raw)
        assert r is not None
        w = self.window(r.key)
        # As its latest job says. Only the starts still in the window are kept: the log
        # stays as short as the key is busy.
        edge = self.now - r.per
        kept = [] if w is None else [t for t in w.starts[-r.limit:] if t > edge]
        self.started_windows[r.key] = Window(r.limit, r.per, [*kept[max(0, len(kept) + 1 - r.limit):], self.now],
                                             0.0 if w is None else w.blocked_until)

    def passed(self, c: Any) -> None:
        pass  # skip, not block: what waits behind it may start

    def full(self, key: str) -> bool:
        """Does `key` admit no job now, by the limit and window its last started job carried?
        A store may leave such a key's jobs unread (they would be refused: the same when a
        key's jobs agree on their limit); it is counted as refused for next_at()."""
        w = self.window(key)
        if w is None or w.next_at(w.limit, w.per) <= self.now:
            return False
        self.refused[key] = min(self.refused.get(key, math.inf), w.next_at(w.limit, w.per))
        return True

    def next_at(self) -> float | None:
        """When the first key refused here, or filled here, may start a job next: the
        claimer's timer (a claim that fills a key's window may not be offered its next job,
        and the claims after it may leave the key's jobs unread until then)."""
        filled = (w.next_at(w.limit, w.per) for w in self.started_windows.values())
        return min((*self.refused.values(), *(t for t in filled if t > self.now)), default=None)


def admit_all(heads: Iterable[Any], windows: Windows, now: float) -> RateLimits | None:
    """The rule after it admitted and started each of `heads` in turn, or None if it refuses
    one: for the common claim (claim.plain with `rated`), whose heads all start or none."""
    rule = RateLimits(windows, now)
    for c in heads:
        if not rule.admits(c):
            return None
        rule.started(c)
    return rule


def tightened(w: Window | None, until: float) -> float:
    """A key's blocked_until after a job of it was told to wait until `until`."""
    return until if w is None else max(w.blocked_until, until)
