"""The rate keys' windows (core/policy/rates.py) as both SQL stores keep them, in the table
`rate_keys` (key, lim, per, blocked_until, starts: a JSON list of the latest start times).
Read by a claim that offers the selection rate-limited jobs, in its transaction after the
lock its store serializes such claims under (SQLite's writer; PostgreSQL's claim lock);
written with the starts it made; tightened by a finish that was told to wait."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from typing import Any

from ...core.policy import rates
from ..records import Claimed, RateKey
from .dialect import Dialect

_READ = "SELECT key, lim, per, blocked_until, starts FROM rate_keys"
_WRITE = ("INSERT INTO rate_keys (key, lim, per, blocked_until, starts) VALUES (?, ?, ?, NULL, ?)"
          " ON CONFLICT (key) DO UPDATE SET lim = excluded.lim, per = excluded.per, starts = excluded.starts")
_WRITE_MANY = ("INSERT INTO rate_keys (key, lim, per, blocked_until, starts)"
               " SELECT k, l, p, NULL, s FROM unnest(%s::text[], %s::int[], %s::float8[], %s::text[]) AS t(k, l, p, s)"
               " ON CONFLICT (key) DO UPDATE SET lim = excluded.lim, per = excluded.per, starts = excluded.starts")
_TIGHTEN = ("INSERT INTO rate_keys (key, lim, per, blocked_until) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (key) DO UPDATE SET blocked_until ="
            " CASE WHEN rate_keys.blocked_until > excluded.blocked_until THEN rate_keys.blocked_until"
            " ELSE excluded.blocked_until END")


def _q(c: Any, sql: str) -> str:
    """`sql` in the connection's marker: sqlite3's `?` or psycopg's `%s`."""
    return sql if isinstance(c, sqlite3.Connection) else sql.replace("?", "%s")


def windows(c: Any) -> dict[str, rates.Window]:
    """Every rate key's window."""
    return windows_of(c.execute(_q(c, _READ)).fetchall())


class Reader:
    """The windows of the keys a claim meets, read one key at a time as it meets them (a
    claim meets few of the keys; reading them all would cost a read of every key's log)."""

    __slots__ = ("c", "read")

    def __init__(self, c: Any) -> None:
        self.c = c
        self.read: dict[str, rates.Window | None] = {}

    def get(self, key: str, /) -> rates.Window | None:
        if key in self.read:
            return self.read[key]
        row = self.c.execute(_q(self.c, _READ + " WHERE key = ?"), (key,)).fetchone()
        w = self.read[key] = None if row is None else windows_of([row])[key]
        return w


def windows_of(rows: Iterable[tuple]) -> dict[str, rates.Window]:
    """Windows from rows of (key, lim, per, blocked_until, starts) as the table holds them."""
    return {k: rates.window_of(lim, per, json.loads(starts), blocked) for k, lim, per, blocked, starts in rows}


def write(c: Any, rule: rates.RateLimits) -> None:
    """The starts a claim's selection made, logged (its transaction commits them with the starts)."""
    if not rule.started_windows:
        return
    rows = [(k, w.limit, w.per, json.dumps(w.starts)) for k, w in sorted(rule.started_windows.items())]
    if isinstance(c, sqlite3.Connection):
        c.executemany(_WRITE, rows)
    else:  # one statement, one round trip
        c.execute(_WRITE_MANY, [list(col) for col in zip(*rows, strict=True)])


def claimed(jobs: Iterable[Any], rule: rates.RateLimits | None) -> Claimed:
    out = Claimed(jobs)
    if rule is not None:
        out.rate_at = rule.next_at()
    return out


def tighten(c: Any, blocks: list[tuple[Any, float]]) -> None:
    """(a job's stored rate_limit, until when) for each run told to wait: no job of its key
    starts before then (a later time told before stays)."""
    rows = []
    for raw, until in blocks:
        r = rates.parse(raw)
        if r is not None:
            rows.append((r.key, r.limit, r.per, until))
    if rows:
        c.cursor().executemany(_q(c, _TIGHTEN), sorted(rows))


# A key's row goes once it says nothing: no start within its window, no block ahead. Deleted
# only if unchanged since it was read (a claim that logged a start meanwhile keeps it).
_STALE = ("DELETE FROM rate_keys WHERE key = ? AND coalesce(starts, '') = coalesce(?, '')"
          " AND (blocked_until IS NULL OR blocked_until <= ?)")


def prune(d: Dialect, c: Any, now: float) -> int:
    """Delete the rate keys whose window is empty and that are not blocked; how many."""
    stale = [(k, starts, now) for k, lim, per, blocked, starts in c.execute(_q(c, _READ)).fetchall()
             if (blocked is None or blocked <= now) and max(json.loads(starts or "[]"), default=-per) + per <= now]
    return sum(c.execute(_q(c, _STALE), row).rowcount for row in stale)


def keys(c: Any, now: float) -> list[RateKey]:
    """Every rate key as operators see it."""
    out = []
    for k, w in sorted(windows(c).items()):
        blocked = w.blocked_until if w.blocked_until > now else None
        out.append(RateKey(k, w.limit, w.per, w.used(now), max(now, w.next_at(w.limit, w.per)), blocked))
    return out
