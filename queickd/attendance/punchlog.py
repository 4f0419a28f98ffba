"""The attendance log: the card registry and every punch, in one SQLite file.

A tap becomes a punch here, committed with a full fsync, before anything else happens
(the Slack post is a queue job enqueued afterwards). The log decides what a tap means:
ignored inside the debounce, "in" or "out" by toggling the person's punches of the work
day, and whether the person's previous work day ended without a clock-out.

Standard library only. One PunchLog may be shared by threads (one lock around its
connection); other processes (the CLI, the daemon running the post job) open their own:
WAL mode lets them read while the terminal writes.
"""

from __future__ import annotations

import datetime as dt
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

IN, OUT, UNKNOWN = "in", "out", "unknown"
ACCEPTED, IGNORED = "accepted", "ignored"
UNKNOWN_POLICIES = ("once", "every", "never")  # when an unknown card's tap is posted
DEFAULT_UNKNOWN_CARDS = "once"
DEFAULT_DEBOUNCE = 60.0  # seconds in which the same card again is ignored
DEFAULT_DAY_BOUNDARY = "04:00"  # a work day starts then, so a night shift is one day

_SCHEMA = """
CREATE TABLE IF NOT EXISTS cards (
    card_id       TEXT PRIMARY KEY,
    name          TEXT NOT NULL,
    slack_user    TEXT,
    registered_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS punches (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,  -- tap order
    punch_id       TEXT NOT NULL UNIQUE,               -- the post job's idempotency key
    card_id        TEXT NOT NULL,
    name           TEXT,                               -- NULL for an unknown card
    slack_user     TEXT,
    direction      TEXT NOT NULL,                      -- in | out | unknown
    tapped_at      REAL NOT NULL,
    day            TEXT NOT NULL,                      -- the work day (see work_day)
    missed_out_day TEXT,                               -- previous work day had no clock-out
    job_id         INTEGER,                            -- the daemon's post job, once enqueued
    posted_at      REAL,
    slack_ts       TEXT,
    posting_at     REAL                                -- a post may have reached Slack (see begin_post)
);
CREATE INDEX IF NOT EXISTS punches_name ON punches (name, seq);
CREATE INDEX IF NOT EXISTS punches_card ON punches (card_id, seq);
CREATE INDEX IF NOT EXISTS punches_day ON punches (day, seq);
CREATE INDEX IF NOT EXISTS punches_unsent ON punches (seq) WHERE job_id IS NULL;
CREATE TABLE IF NOT EXISTS unknown_cards (
    card_id  TEXT PRIMARY KEY,
    first_at REAL NOT NULL,
    last_at  REAL NOT NULL,
    taps     INTEGER NOT NULL
);
"""

_HEX = re.compile(r"^[0-9A-F]+$")


def normalize_card_id(text: str) -> str:
    """'01:2e:4c:…' / '012E4C…' / ' 012e4c ' → '012E4C…'. ValueError if it is not hex."""
    card = re.sub(r"[\s:\-]", "", text).upper()
    if not card or not _HEX.match(card) or len(card) > 64:
        raise ValueError(f"{text!r} is not a card id (hex digits, e.g. the FeliCa IDm or the Type A UID)")
    return card


def parse_day_boundary(text: str) -> int:
    """'04:00' → minutes after midnight at which a work day starts."""
    m = re.fullmatch(r"(\d{1,2}):(\d{2})", text.strip())
    if not m or int(m.group(1)) > 23 or int(m.group(2)) > 59:
        raise ValueError(f"day boundary {text!r} is not a time of day like 04:00")
    return int(m.group(1)) * 60 + int(m.group(2))


def work_day(t: float, boundary_minutes: int) -> str:
    """The work day a local time belongs to: with a 04:00 boundary, 02:30 on the 2nd
    still counts as the 1st, so a night shift is one day."""
    local = dt.datetime.fromtimestamp(t) - dt.timedelta(minutes=boundary_minutes)
    return local.date().isoformat()


def work_days(first: float, last: float, boundary_minutes: int) -> list[str]:
    """The work days from the one `first` belongs to through the one `last` belongs to."""
    start, end = (dt.date.fromisoformat(work_day(t, boundary_minutes)) for t in (first, last))
    return [(start + dt.timedelta(days=i)).isoformat() for i in range((end - start).days + 1)]


@dataclass(frozen=True)
class Card:
    card_id: str
    name: str
    slack_user: str | None
    registered_at: float


@dataclass(frozen=True)
class Punch:
    seq: int
    punch_id: str
    card_id: str
    name: str | None
    slack_user: str | None
    direction: str
    tapped_at: float
    day: str
    missed_out_day: str | None
    job_id: int | None = None
    posted_at: float | None = None
    slack_ts: str | None = None
    posting_at: float | None = None  # set before each post; cleared when Slack surely did not take it

    @property
    def maybe_posted(self) -> bool:
        """A post was started and nobody knows how it ended (a kill, a cut connection)."""
        return self.posted_at is None and self.posting_at is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Tap:
    """What a tap came to. `punch` is None when nothing is to be posted."""

    card_id: str
    outcome: str  # ACCEPTED or IGNORED
    reason: str  # "in", "out", "unknown card", "within debounce (12 s after the last tap)", ...
    punch: Punch | None = None
    name: str | None = None


class PunchLog:
    def __init__(self, path: str, *, debounce: float = DEFAULT_DEBOUNCE, day_boundary: int | None = None,
                 unknown_cards: str = DEFAULT_UNKNOWN_CARDS, synchronous: str = "FULL") -> None:
        if unknown_cards not in UNKNOWN_POLICIES:
            raise ValueError(f"unknown_cards must be one of {', '.join(UNKNOWN_POLICIES)}")
        if debounce < 0:
            raise ValueError("debounce must not be negative")
        self.path = path
        self.debounce = debounce
        self.day_boundary = parse_day_boundary(DEFAULT_DAY_BOUNDARY) if day_boundary is None else day_boundary
        self.unknown_cards = unknown_cards
        self._lock = threading.Lock()  # guards _db: one statement or transaction at a time
        self._db = sqlite3.connect(path, timeout=10, isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        # FULL: a punch that was accepted (and beeped) survives a power cut.
        self._db.execute(f"PRAGMA synchronous={synchronous}")
        self._db.executescript(_SCHEMA)
        self._upgrade()

    def _upgrade(self) -> None:
        # Logs written before posting_at existed gain it; NULL there means "never tried".
        columns = {r["name"] for r in self._db.execute("PRAGMA table_info(punches)")}
        if "posting_at" not in columns:
            self._db.execute("ALTER TABLE punches ADD COLUMN posting_at REAL")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> PunchLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _query(self, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    # --- the registry -------------------------------------------------------------------------
    def register(self, card_id: str, name: str, slack_user: str | None = None,
                 now: float | None = None) -> Card:
        """Add or replace a card. The person is known by name from now on."""
        card_id, name = normalize_card_id(card_id), name.strip()
        if not name:
            raise ValueError("a card needs a person's name")
        now = time.time() if now is None else now
        with self._tx() as db:
            db.execute("INSERT INTO cards VALUES (?, ?, ?, ?) ON CONFLICT (card_id) DO UPDATE SET "
                       "name = excluded.name, slack_user = excluded.slack_user", (card_id, name, slack_user, now))
            db.execute("DELETE FROM unknown_cards WHERE card_id = ?", (card_id,))
        return self.card(card_id)  # type: ignore[return-value]

    def card(self, card_id: str) -> Card | None:
        rows = self._query("SELECT * FROM cards WHERE card_id = ?", (normalize_card_id(card_id),))
        return Card(**dict(rows[0])) if rows else None

    def cards(self) -> list[Card]:
        return [Card(**dict(r)) for r in self._query("SELECT * FROM cards ORDER BY name, card_id")]

    def remove(self, card_id: str) -> bool:
        """Forget a card; its punches stay. False if it was not registered."""
        with self._tx() as db:
            return db.execute("DELETE FROM cards WHERE card_id = ?", (normalize_card_id(card_id),)).rowcount > 0

    def unknown(self) -> list[dict[str, Any]]:
        """Unregistered cards that were tapped, most recent first."""
        return [dict(r) for r in self._query("SELECT * FROM unknown_cards ORDER BY last_at DESC")]

    # --- taps ---------------------------------------------------------------------------------
    def record_tap(self, card_id: str, now: float | None = None) -> Tap:
        """Decide what a tap means and, if it is to be posted, commit its punch (fsync'd)
        before returning."""
        card_id = normalize_card_id(card_id)
        now = time.time() if now is None else now
        with self._tx() as db:
            row = db.execute("SELECT * FROM cards WHERE card_id = ?", (card_id,)).fetchone()
            if row is None:
                return self._unknown_tap(db, card_id, now)
            card = Card(**dict(row))
            # Its last punch, not a tap that showed it unknown (registered since: punch at once).
            last_of_card = db.execute("SELECT tapped_at FROM punches WHERE card_id = ? AND direction != ?"
                                      " ORDER BY seq DESC LIMIT 1", (card_id, UNKNOWN)).fetchone()
            if last_of_card is not None and 0 <= now - last_of_card[0] < self.debounce:
                return Tap(card_id, IGNORED, f"within the debounce ({now - last_of_card[0]:.0f} s after "
                           f"the last tap, debounce {self.debounce:g} s)", name=card.name)
            day = work_day(now, self.day_boundary)
            last = db.execute("SELECT direction, day FROM punches WHERE name = ? ORDER BY seq DESC LIMIT 1",
                              (card.name,)).fetchone()
            missed = None
            if last is not None and last["day"] == day:
                direction = OUT if last["direction"] == IN else IN
            else:
                direction = IN
                if last is not None and last["direction"] == IN:
                    missed = last["day"]  # clocked in that day and never out
            punch = self._insert(db, card_id, card.name, card.slack_user, direction, now, day, missed)
        return Tap(card_id, ACCEPTED, direction, punch, card.name)

    def _unknown_tap(self, db: sqlite3.Connection, card_id: str, now: float) -> Tap:
        seen = db.execute("SELECT * FROM unknown_cards WHERE card_id = ?", (card_id,)).fetchone()
        if seen is not None and 0 <= now - seen["last_at"] < self.debounce:
            return Tap(card_id, IGNORED, "unknown card, within the debounce")
        db.execute("INSERT INTO unknown_cards VALUES (?, ?, ?, 1) ON CONFLICT (card_id) DO UPDATE SET "
                   "last_at = excluded.last_at, taps = taps + 1", (card_id, now, now))
        punch = None
        if self.unknown_cards == "every" or (self.unknown_cards == "once" and seen is None):
            punch = self._insert(db, card_id, None, None, UNKNOWN, now, work_day(now, self.day_boundary), None)
        return Tap(card_id, ACCEPTED, "unknown card", punch)

    def _insert(self, db: sqlite3.Connection, card_id: str, name: str | None, slack_user: str | None,
                direction: str, now: float, day: str, missed: str | None) -> Punch:
        punch_id = "punch-" + uuid.uuid4().hex
        cur = db.execute("INSERT INTO punches (punch_id, card_id, name, slack_user, direction, tapped_at, day, "
                         "missed_out_day) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         (punch_id, card_id, name, slack_user, direction, now, day, missed))
        return Punch(cur.lastrowid, punch_id, card_id, name, slack_user, direction, now, day, missed)  # type: ignore[arg-type]

    # --- posting ------------------------------------------------------------------------------
    def unsent(self, limit: int = 100) -> list[Punch]:
        """Punches not yet handed to the daemon, in tap order."""
        return [Punch(**dict(r)) for r in
                self._query("SELECT * FROM punches WHERE job_id IS NULL ORDER BY seq LIMIT ?", (limit,))]

    def mark_enqueued(self, punch_id: str, job_id: int) -> None:
        with self._tx() as db:
            db.execute("UPDATE punches SET job_id = ? WHERE punch_id = ?", (job_id, punch_id))

    def begin_post(self, punch_id: str, now: float | None = None) -> Punch | None:
        """Mark the punch "about to post" (committed, fsync'd, before Slack is called) and
        return it as it was before: if it already had the mark, an earlier post may have
        reached Slack with its outcome lost (the daemon killed mid-post). None if unknown."""
        with self._tx() as db:
            row = db.execute("SELECT * FROM punches WHERE punch_id = ?", (punch_id,)).fetchone()
            if row is None:
                return None
            db.execute("UPDATE punches SET posting_at = ? WHERE punch_id = ?",
                       (time.time() if now is None else now, punch_id))
        return Punch(**dict(row))

    def post_not_sent(self, punch_id: str) -> None:
        """Slack surely did not take the post (it answered with an error, or the connection
        was refused): the next try need not look for it first."""
        with self._tx() as db:
            db.execute("UPDATE punches SET posting_at = NULL WHERE punch_id = ? AND posted_at IS NULL", (punch_id,))

    def mark_posted(self, punch_id: str, slack_ts: str | None, now: float | None = None) -> None:
        with self._tx() as db:
            db.execute("UPDATE punches SET posted_at = ?, slack_ts = ? WHERE punch_id = ?",
                       (time.time() if now is None else now, slack_ts, punch_id))

    def punch(self, punch_id: str) -> Punch | None:
        rows = self._query("SELECT * FROM punches WHERE punch_id = ?", (punch_id,))
        return Punch(**dict(rows[0])) if rows else None

    def punches(self, day: str | None = None) -> list[Punch]:
        """Every punch (of one work day), in tap order."""
        if day is None:
            return [Punch(**dict(r)) for r in self._query("SELECT * FROM punches ORDER BY seq")]
        return [Punch(**dict(r)) for r in self._query("SELECT * FROM punches WHERE day = ? ORDER BY seq", (day,))]
