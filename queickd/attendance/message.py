"""What the terminal says: a punch's Slack message, and the day report. Pure functions."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from .punchlog import IN, OUT, UNKNOWN, Punch

DEFAULT_LATE_AFTER = 60.0  # a post later than this after the tap says how late it is


def clock(t: float) -> str:
    return time.strftime("%H:%M", time.localtime(t))


def span(seconds: float) -> str:
    """3725 → '1 h 02 min'; 75 → '1 min 15 s'."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    if s >= 60:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s} s"


def who(name: str | None, slack_user: str | None) -> str:
    if slack_user:
        return f"<@{slack_user}> ({name})" if name else f"<@{slack_user}>"
    return name or "?"


def punch_text(p: Punch, posted_at: float, late_after: float = DEFAULT_LATE_AFTER) -> str:
    """The message for one punch: the person, in or out, and the time the card was tapped
    (not the time of posting); a post that comes late says how late."""
    tapped = time.strftime("%H:%M:%S", time.localtime(p.tapped_at))
    if time.localtime(p.tapped_at)[:3] != time.localtime(posted_at)[:3]:
        tapped += time.strftime(" on %Y-%m-%d", time.localtime(p.tapped_at))
    if p.direction == UNKNOWN:
        text = (f"Unknown card {p.card_id} tapped at {tapped}. Register it with "
                f"`queick attendance register --card {p.card_id} --name NAME`.")
    else:
        verb = {IN: "clocked in", OUT: "clocked out"}[p.direction]
        text = f"{who(p.name, p.slack_user)} {verb} at {tapped}."
    if p.missed_out_day:
        text += f" (No clock-out was recorded on {p.missed_out_day}.)"
    if posted_at - p.tapped_at > late_after:
        text += f" (Posted {span(posted_at - p.tapped_at)} late: the network or Slack was unavailable.)"
    return text


@dataclass
class PersonDay:
    name: str
    periods: list[tuple[float, float | None]] = field(default_factory=list)  # (in, out or None)

    @property
    def seconds(self) -> float:
        return sum(out - in_ for in_, out in self.periods if out is not None)

    @property
    def open(self) -> bool:
        return bool(self.periods) and self.periods[-1][1] is None


def day_report(punches: Iterable[Punch]) -> list[PersonDay]:
    """Per person, in order of first punch: the in/out pairs of the day and the hours."""
    people: dict[str, PersonDay] = {}
    for p in punches:
        if p.name is None or p.direction not in (IN, OUT):
            continue
        day = people.setdefault(p.name, PersonDay(p.name))
        if p.direction == IN:
            day.periods.append((p.tapped_at, None))
        elif day.open:
            day.periods[-1] = (day.periods[-1][0], p.tapped_at)
        else:  # an "out" with no "in" before it (the in was on the previous work day)
            day.periods.append((p.tapped_at, p.tapped_at))
    return list(people.values())


def summary_text(day: str, report: list[PersonDay]) -> str:
    if not report:
        return f"Attendance {day}: nobody clocked in."
    lines = [f"Attendance {day}:"]
    for person in report:
        times = ", ".join(f"{clock(i)}–{clock(o) if o is not None else '…'}" for i, o in person.periods)
        tail = " (no clock-out yet)" if person.open else ""
        lines.append(f"• {person.name}: {span(person.seconds)} ({times}){tail}")
    return "\n".join(lines)
