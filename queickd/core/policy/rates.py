"""Rate limits, the claim's rule about starts per key and time window (claim.py applies it
with the others).

A job may carry `rate_limit` {"key", "limit", "per"}: at most `limit` jobs of that key
start in any window of `per` seconds. The store keeps, per key, a log of its starts (exact,
where a token bucket or a generic cell rate would let `limit + 1` through in some window),
how many it holds (`kept`: at least the window's use, as starts that left the window go
lazily) and `blocked_until`, a time before which none of its jobs starts (a job told so by
the service it calls: an HTTP 429's Retry-After, `queickd.RateLimited`). The rule:
- admits a job while its key has fewer than `limit` starts in the last `per` seconds
  (`now - per < t`) and is not blocked; started: `now` is logged for its key. While the
  key keeps fewer than `limit` starts the count alone says so: the log is read only when a
  key nears its limit (a limit that does not bind costs a counter, not a walk of the log);
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
    times of its starts within the window (oldest first) or None where they were not read,
    how many starts the store keeps for it (`kept`, at least those in the window; that of
    `starts` when not given), and the time before which none of its jobs may start (0:
    none)."""

    limit: int
    per: float
    starts: list[float] | None
    blocked_until: float = 0.0
    kept: int = -1

    def __post_init__(self) -> None:
        if self.kept < 0:
            self.kept = len(self.starts or ())

    def next_at(self, limit: int, per: float) -> float | None:
        """When a job of this key with this limit and window may start next; None when the
        count cannot tell and the starts were not read."""
        t = self.blocked_until
        if self.starts is None:
            return t if self.kept < limit else None
        if len(self.starts) >= limit:
            t = max(t, self.starts[-limit] + per)
        return t


class Windows(Protocol):
    """Where the rule reads a key's window: a dict of windows with their starts, or a
    store's reader, whose `get` may leave the starts unread and whose `exact` reads them
    (the starts of the last `per` seconds)."""

    def get(self, key: str, /) -> Window | None: ...


class RateLimits:
    """The rule (claim.Rule): at most `limit` starts of a key per `per` seconds."""

    __slots__ = ("given", "read", "added", "last", "now", "refused", "_opens")

    def __init__(self, windows: Windows, now: float) -> None:
        self.given = windows  # key -> its window before this claim; never changed here
        self.read: dict[str, Window | None] = {}  # the windows of the keys met, as given or read exactly
        self.added: dict[str, list[float]] = {}  # key -> the starts logged here
        self.last: dict[str, RateLimit] = {}  # key -> the rate limit of its latest job started here
        self.now = now
        self.refused: dict[str, float] = {}  # key -> when a job refused here may start
        self._opens: float | None | bool = False  # next_at(), once asked (False: not yet)

    @property
    def changed(self) -> list[str]:
        """Keys with a start logged here."""
        return sorted(self.added)

    @property
    def started_windows(self) -> dict[str, Window]:
        """The windows of the keys started here, as they are now."""
        return {k: w for k in self.added if (w := self.window(k)) is not None}

    @property
    def windows(self) -> dict[str, Window]:
        """The windows given (a dict) with those of the keys started here."""
        return {**self.given, **self.started_windows}  # type: ignore[dict-item]

    def _base(self, key: str, exact: bool = False) -> Window | None:
        if key not in self.read:
            self.read[key] = self.given.get(key)
        w = self.read[key]
        if exact and w is not None and w.starts is None:
            w = self.read[key] = self.given.exact(key, self.now)  # type: ignore[attr-defined]
        return w

    def window(self, key: str, exact: bool = False) -> Window | None:
        """`key`'s window with the starts logged here (`exact`: its starts read)."""
        w = self._base(key, exact)
        added = self.added.get(key)
        if not added:
            return w
        r = self.last[key]
        if w is None:
            return Window(r.limit, r.per, list(added), 0.0, len(added))
        if w.starts is None:
            return Window(r.limit, r.per, None, w.blocked_until, w.kept + len(added))
        # Only the starts still in the window, and at most `limit` of them, are kept.
        edge = self.now - r.per
        kept = [t for t in w.starts if t > edge] + added
        return Window(r.limit, r.per, kept[-r.limit:], w.blocked_until, w.kept + len(added))

    def _next_at(self, key: str, limit: int, per: float) -> float:
        w = self.window(key)
        t = None if w is None else w.next_at(limit, per)
        if w is not None and t is None:  # the count cannot tell: the starts read
            w = self.window(key, exact=True)
            t = 0.0 if w is None else w.next_at(limit, per)
        return 0.0 if t is None else t

    def admits(self, c: Any) -> bool:
        raw = c.rate_limit
        if raw is None:
            return True
        r = parse(raw)
        assert r is not None
        t = self._next_at(r.key, r.limit, r.per)
        if t <= self.now:
            return True
        self.refused[r.key] = min(self.refused.get(r.key, math.inf), t)
        return False

    def started(self, c: Any) -> None:
        raw = c.rate_limit
        if raw is None:
            return
        r = parse(raw)
        assert r is not None
        self._base(r.key)
        self.added.setdefault(r.key, []).append(self.now)
        self.last[r.key] = r

    def passed(self, c: Any) -> None:
        pass  # skip, not block: what waits behind it may start

    def full(self, key: str) -> bool:
        """Does `key` admit no job now, by the limit and window its last started job carried?
        A store may leave such a key's jobs unread (they would be refused: the same when a
        key's jobs agree on their limit); it is counted as refused for next_at()."""
        w = self.window(key)
        if w is None:
            return False
        t = self._next_at(key, w.limit, w.per)
        if t <= self.now:
            return False
        self.refused[key] = min(self.refused.get(key, math.inf), t)
        return True

    def next_at(self) -> float | None:
        """When the first key refused here, or filled here, may start a job next: the
        claimer's timer (a claim that fills a key's window may not be offered its next job,
        and the claims after it may leave the key's jobs unread until then). Answered once,
        when first asked: a store asks before it logs this claim's starts, which a window
        read afterwards would count twice."""
        if self._opens is False:  # asked once the claim is made: a store asks before it logs the starts
            filled = (self._next_at(k, r.limit, r.per) for k, r in self.last.items())
            self._opens = min((*self.refused.values(), *(t for t in filled if t > self.now)), default=None)
        return self._opens  # type: ignore[return-value]


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
