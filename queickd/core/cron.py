"""Recurring schedules: 5-field cron expressions and Queick's fixed-interval SchedulingTime.

A schedule answers one question, `next_after(t)`: the first tick strictly after unix time t.
Cron expressions are read in the daemon's local time, as cron(8) does. Pure functions, no
I/O; safe from any thread.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from .numbers import in_range

_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# How far ahead a tick is looked for: 29 February on a given weekday comes back within 28
# years (and 2100 is no leap year), so 30 finds every tick of a schedule that fires at all.
_SEARCH_YEARS = 30
# The latest time a job or a schedule may name (9999-12-31 23:59:59 UTC): what every store,
# clock and printer here handles. Milliseconds given for seconds land past it.
LATEST = 253402300799.0
_MONTHS = "jan feb mar apr may jun jul aug sep oct nov dec".split()
_DAYS = "sun mon tue wed thu fri sat".split()
# (name, low, high, names) for minute, hour, day of month, month, day of week
_FIELDS = (
    ("minute", 0, 59, None),
    ("hour", 0, 23, None),
    ("day of month", 1, 31, None),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
)


def _value(text: str, low: int, names: list[str] | None) -> int:
    if names and text.lower() in names:
        return names.index(text.lower()) + (1 if low == 1 else 0)
    if not text.isdigit():
        raise ValueError(f"{text!r} is not a number")
    return int(text)


def _parse_field(text: str, name: str, low: int, high: int, names: list[str] | None) -> frozenset:
    out: set[int] = set()
    for part in text.split(","):
        rng, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if step_text and (not step_text.isdigit() or step < 1):
            raise ValueError(f"bad step in {name} field: {part!r}")
        if rng == "*":
            start, stop = low, high
        elif "-" in rng:
            a, b = rng.split("-", 1)
            start, stop = _value(a, low, names), _value(b, low, names)
        else:
            start = _value(rng, low, names)
            stop = high if step_text else start
        if not (low <= start <= high and low <= stop <= high) or start > stop:
            raise ValueError(f"{name} field {part!r} is outside {low}-{high}")
        out.update(range(start, stop + 1, step))
    return frozenset(out)


@dataclass(frozen=True)
class CronExpr:
    """A parsed 5-field cron expression (minute hour day-of-month month day-of-week)."""

    text: str
    minutes: frozenset
    hours: frozenset
    days: frozenset
    months: frozenset
    weekdays: frozenset  # 0 = Sunday
    any_day: bool  # day-of-month was "*"
    any_weekday: bool  # day-of-week was "*"
    any_time: bool = False  # the minute or hour field was "*": runs in both passes of a repeated hour

    @classmethod
    def parse(cls, text: str) -> CronExpr:
        expr = _ALIASES.get(text.strip().lower(), text)
        parts = expr.split()
        if len(parts) != 5:
            raise ValueError(f"a cron expression has 5 fields, got {len(parts)}: {text!r}")
        sets = [_parse_field(p, *f) for p, f in zip(parts, _FIELDS, strict=True)]
        weekdays = frozenset(d % 7 for d in sets[4])
        # As in Vixie cron, a day field starting with "*" (also "*/2") counts as unrestricted.
        return cls(text, *sets[:4], weekdays, parts[2].startswith("*"), parts[4].startswith("*"),
                   parts[0].startswith("*") or parts[1].startswith("*"))

    def _day_matches(self, d: datetime) -> bool:
        dom = d.day in self.days
        dow = (d.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:  # cron(8): if either is "*", both must match
            return dom and dow
        return dom or dow  # both restricted: either matches

    def _matches(self, d: datetime) -> bool:
        return d.minute in self.minutes and d.hour in self.hours and d.month in self.months and self._day_matches(d)

    def next_after(self, t: float) -> float:
        tick = self._next_on_the_wall(t)
        if self.any_time:
            again = self._in_second_pass(t)
            if again is not None and again < tick:
                return again
        return tick

    def _in_second_pass(self, t: float) -> float | None:
        """When daylight saving ends, the clocks go back and an hour of wall times comes
        twice. The wall-clock walk of _next_on_the_wall, from t in the first pass, passes
        the wall times up to t's only once: their second pass is looked at here. As in
        Vixie cron, only for a schedule whose minute or hour is "*" (`*/15 * * * *` keeps
        its pace through that hour; `30 2 * * *` runs once)."""
        d = datetime.fromtimestamp(t).replace(second=0, microsecond=0)
        if d.fold or not _repeated(d):
            return None
        start = d
        while _repeated(start - timedelta(minutes=1)):
            start -= timedelta(minutes=1)
        while start <= d:
            if self._matches(start):
                return start.replace(fold=1).timestamp()
            start += timedelta(minutes=1)
        return None

    def _next_on_the_wall(self, t: float) -> float:
        d = datetime.fromtimestamp(t).replace(second=0, microsecond=0) + timedelta(minutes=1)
        limit = d + timedelta(days=366 * _SEARCH_YEARS)
        while d < limit:
            if d.month not in self.months:
                d = (d.replace(day=1, hour=0, minute=0) + timedelta(days=32)).replace(day=1)
            elif not self._day_matches(d):
                d = d.replace(hour=0, minute=0) + timedelta(days=1)
            elif d.hour not in self.hours:
                d = d.replace(minute=0) + timedelta(hours=1)
            elif d.minute not in self.minutes:
                d += timedelta(minutes=1)
            else:
                # In the hour repeated when daylight saving ends, a wall time happens twice
                # (fold 0, then fold 1); the tick is the first of them still after t.
                for ts in (d.timestamp(), d.replace(fold=1).timestamp()):
                    if ts > t:
                        return ts
                d += timedelta(minutes=1)
        raise ValueError(f"cron expression {self.text!r} never fires")


def _repeated(d: datetime) -> bool:
    """A wall time that happens twice (the hour repeated when daylight saving ends); a
    wall time skipped when it begins maps the other way round."""
    return d.replace(fold=0).timestamp() < d.replace(fold=1).timestamp()


@dataclass(frozen=True)
class Every:
    """A fixed interval from a start time: start_at, start_at + interval, …"""

    interval: float
    start_at: float

    def next_after(self, t: float) -> float:
        if t < self.start_at:
            return self.start_at
        n = math.floor((t - self.start_at) / self.interval) + 1
        for _ in range(3):  # float division may land one or two short
            if self.start_at + n * self.interval > t:
                return self.start_at + n * self.interval
            n += 1
        return math.nextafter(t, math.inf) + self.interval  # interval below float precision


Schedule = CronExpr | Every
MIN_INTERVAL = 0.1  # seconds; finer intervals are a busy loop, and below float precision never advance
MAX_INTERVAL = 100 * 366 * 86400.0  # seconds: a century; ticks stay far below LATEST


def parse_schedule(d: dict[str, Any], now: float | None = None) -> Schedule:
    """Read the wire/stored form: {"cron": "*/5 * * * *"} or {"every": s, "start_at": t}.
    Without start_at, an interval starts one interval after `now` (default: the clock)."""
    if "cron" in d:
        if not isinstance(d["cron"], str):
            raise ValueError("cron must be a string")
        return CronExpr.parse(d["cron"])
    if "every" in d:
        every = in_range("every", d["every"], MIN_INTERVAL, MAX_INTERVAL, message=(
            f"every must be a number of seconds, at least {MIN_INTERVAL} and at most {MAX_INTERVAL:.0f}"))
        if d.get("start_at") is None:
            start: float | None = (time.time() if now is None else now) + every
        else:
            start = in_range("start_at", d["start_at"], 0, LATEST,
                             message=f"start_at must be unix seconds, from 0 to {LATEST:.0f} (the year 9999)")
        return Every(every, start)
    raise ValueError("a schedule needs 'cron' or 'every'")


def schedule_to_dict(s: Schedule) -> dict[str, Any]:
    if isinstance(s, CronExpr):
        return {"cron": s.text}
    return {"every": s.interval, "start_at": s.start_at}


class SchedulingTime:
    """Queick's builder: `SchedulingTime().every(minutes=1).starting_from(t)`."""

    def __init__(self) -> None:
        self.interval: float = 600.0
        self.start_at: float | None = None

    def every(self, seconds: float = 0, minutes: float = 0, hours: float = 0, days: float = 0):
        self.interval = seconds + minutes * 60 + hours * 3600 + days * 86400
        return self

    def starting_from(self, start_at: float):
        self.start_at = start_at
        return self

    def from_now(self):
        self.start_at = time.time()
        return self

    def validate(self) -> None:
        if not (self.interval > 0 and math.isfinite(self.interval)):
            raise ValueError("the interval must be a finite number above 0")

    def to_dict(self) -> dict[str, Any]:
        self.validate()
        return {"every": self.interval, "start_at": self.start_at}
