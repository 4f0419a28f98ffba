"""The rate keys' windows (core/policy/rates.py) as both SQL stores keep them: `rate_keys`
(key, lim, per, blocked_until, kept: how many starts rate_starts holds for it) and
`rate_starts` (key, at, n: n starts of the key at time at, one row per claim). A claim
reads a key's row, and its starts only when the key nears its limit (then those that
left the window are deleted); it adds its starts as a row and to `kept`. Read in the
claim's transaction after the lock its store serializes such claims under (SQLite's
writer; PostgreSQL's claim lock, which its fast path and its prune take too); tightened by
a finish that was told to wait. Every change of `kept` is relative, so claims, finishes
and the retention's prune compose."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any

from ...core.policy import rates
from ..records import Claimed, RateKey
from .dialect import Dialect, marked

_READ = "SELECT key, lim, per, blocked_until, kept FROM rate_keys"
_STARTS = "SELECT at, n FROM rate_starts WHERE key = ? ORDER BY at"
# The starts that left a key's window, deleted: how many.
_FORGET = "DELETE FROM rate_starts WHERE key = ? AND at <= ? RETURNING n"
_UNKEEP = "UPDATE rate_keys SET kept = kept - ? WHERE key = ?"
# The starts a claim adds: to its keys' rows (made if new) and as a row of rate_starts each.
_KEPT = " ON CONFLICT (key) DO UPDATE SET lim = excluded.lim, per = excluded.per, kept = rate_keys.kept + excluded.kept"
_LOGGED = " ON CONFLICT (key, at) DO UPDATE SET n = rate_starts.n + excluded.n"
_WRITE = "INSERT INTO rate_keys (key, lim, per, blocked_until, kept) VALUES (?, ?, ?, NULL, ?)" + _KEPT
_LOG = "INSERT INTO rate_starts (key, at, n) VALUES (?, ?, ?)" + _LOGGED
_WRITE_MANY = ("INSERT INTO rate_keys (key, lim, per, blocked_until, kept) SELECT k, l, p, NULL, n"
               " FROM unnest(%s::text[], %s::int[], %s::float8[], %s::int[]) AS t(k, l, p, n)" + _KEPT)
_LOG_MANY = "INSERT INTO rate_starts (key, at, n) SELECT k, %s, n FROM unnest(%s::text[], %s::int[]) AS t(k, n)" + _LOGGED
_TIGHTEN = ("INSERT INTO rate_keys (key, lim, per, blocked_until) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (key) DO UPDATE SET blocked_until ="
            " CASE WHEN rate_keys.blocked_until > excluded.blocked_until THEN rate_keys.blocked_until"
            " ELSE excluded.blocked_until END")


def _window(row: tuple) -> rates.Window:
    """A window from a row of (key, lim, per, blocked_until, kept), its starts unread."""
    _, lim, per, blocked, kept = row
    return rates.Window(lim, per, None, blocked or 0.0, kept)


def windows_of(rows: Iterable[tuple]) -> dict[str, rates.Window]:
    """Windows, their starts unread, from rows of (key, lim, per, blocked_until, kept)."""
    return {r[0]: _window(r) for r in rows}


def _exact(c: Any, key: str, w: rates.Window, now: float) -> rates.Window:
    """`w` with its starts: those that left the window deleted (and no longer kept), the
    rest read."""
    gone = sum(n for (n,) in c.execute(marked(c, _FORGET), (key, now - w.per)).fetchall())
    if gone:
        c.execute(marked(c, _UNKEEP), (gone, key))
    starts = [at for at, n in c.execute(marked(c, _STARTS), (key,)).fetchall() for _ in range(n)]
    return rates.Window(w.limit, w.per, starts, w.blocked_until, w.kept - gone)


_FULL_KEPT = 1024  # full windows kept before those open already are dropped


class Reader:
    """The windows of the keys a claim meets, read one key at a time as it meets them (a
    claim meets few of the keys), their starts only when asked (`exact`). `full`, kept by
    a store whose claims are all its own (SQLite's one writer), holds the exact windows of
    keys read full, each until it opens: no start can come before then to change it."""

    __slots__ = ("c", "read", "full")

    def __init__(self, c: Any, known: dict[str, rates.Window] | None = None,
                 full: dict[str, tuple[float, rates.Window]] | None = None) -> None:
        self.c = c
        self.read: dict[str, rates.Window | None] = dict(known or {})
        self.full = full

    def get(self, key: str, /) -> rates.Window | None:
        if key in self.read:
            return self.read[key]
        row = self.c.execute(marked(self.c, _READ + " WHERE key = ?"), (key,)).fetchone()
        w = self.read[key] = None if row is None else _window(row)
        return w

    def exact(self, key: str, now: float, /) -> rates.Window | None:
        if self.full is not None and key in self.full:
            opens, w = self.full[key]
            if now < opens:
                self.read[key] = w
                return w
            del self.full[key]
        w = self.get(key)
        if w is not None and w.starts is None:
            w = self.read[key] = _exact(self.c, key, w, now)
            opens = w.next_at(w.limit, w.per)
            if self.full is not None and opens is not None and opens > now:
                if len(self.full) >= _FULL_KEPT:  # keys met once: those open already go
                    for k in [k for k, (t, _) in self.full.items() if t <= now]:
                        del self.full[k]
                self.full[key] = (opens, w)
        return w


def write(c: Any, rule: rates.RateLimits) -> None:
    """The starts a claim's selection made, logged (its transaction commits them with the starts)."""
    if not rule.added:
        return
    rule.next_at()  # the timer, before these starts are in the store
    full = getattr(rule.given, "full", None)
    for k in rule.added if full else ():
        full.pop(k, None)  # its window changed
    now = rule.now
    rows = [(k, rule.last[k].limit, rule.last[k].per, len(added)) for k, added in sorted(rule.added.items())]
    if isinstance(c, sqlite3.Connection):
        c.executemany(_WRITE, rows)
        c.executemany(_LOG, [(k, now, n) for k, _, _, n in rows])
    else:  # one statement each, one round trip
        cols = [list(col) for col in zip(*rows, strict=True)]
        c.execute(_WRITE_MANY, cols)
        c.execute(_LOG_MANY, (now, cols[0], cols[3]))


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
        c.cursor().executemany(marked(c, _TIGHTEN), sorted(rows))


def prune(d: Dialect, c: Any, now: float) -> int:
    """Forget the starts that left their key's window, then delete the rate keys that keep
    none and are not blocked; how many keys. A claim that logs a start meanwhile adds to
    its key's row, or makes it again."""
    gone: dict[str, int] = {}
    for key, n in c.execute(d.q("DELETE FROM rate_starts WHERE at <= ? - (SELECT k.per FROM rate_keys k"
                                " WHERE k.key = rate_starts.key) RETURNING key, n"), (now,)).fetchall():
        gone[key] = gone.get(key, 0) + n
    if gone:
        c.cursor().executemany(d.q(_UNKEEP), [(n, k) for k, n in sorted(gone.items())])
    idle = "SELECT key FROM rate_keys WHERE kept <= 0 AND (blocked_until IS NULL OR blocked_until <= ?)"
    if not isinstance(c, sqlite3.Connection):  # a row a claim holds is left for the next prune
        idle += " ORDER BY key FOR UPDATE SKIP LOCKED"
    return c.execute(d.q(f"DELETE FROM rate_keys WHERE key IN ({idle}) AND kept <= 0"), (now,)).rowcount


def keys(d: Dialect, c: Any, now: float) -> list[RateKey]:
    """Every rate key as operators see it: its starts within the window counted (along its
    key, from the window's edge), and read for a key whose window is full (when it opens)."""
    out = []
    for k, lim, per, blocked, n in c.execute(d.q("SELECT k.key, k.lim, k.per, k.blocked_until,"
                                                   " (SELECT coalesce(sum(s.n), 0) FROM rate_starts s"
                                                   " WHERE s.key = k.key AND s.at > ? - k.per)"
                                                   " FROM rate_keys k ORDER BY k.key"), (now,)).fetchall():
        opens = now
        if n >= lim:
            starts = [at for at, m in c.execute(d.q(_STARTS), (k,)).fetchall() if at > now - per for _ in range(m)]
            opens = max(now, starts[-lim] + per)
        blocked_until = blocked if blocked is not None and blocked > now else None
        out.append(RateKey(k, lim, per, int(n), max(opens, blocked_until or now), blocked_until))
    return out
