"""Wording shared by the terminal views (`queick stats`, `status`, `top`) and the status
page: ages, what a pause waits for, a pool no worker serves, a job's progress. Plain functions of plain
values: a client command imports them without the daemon's modules."""

from __future__ import annotations

import time
from typing import Any


def unserved(pool: dict[str, int]) -> bool:
    """A pool (an entry of pools_view) whose jobs wait because no live worker serves it."""
    return pool["waiting"] > 0 and pool["workers"] == 0


ERROR_SHOWN = 300  # characters of an error message in one row of a table ('queick show ID': all)


def one_line(text: Any, limit: int | None = None) -> str:
    """`text` fit for one row of a table: its line breaks shown as '⏎' (a traceback-like message
    would otherwise break the rows apart) and, with `limit`, cut to that many characters."""
    t = " ⏎ ".join(line.strip() for line in str(text).splitlines() if line.strip()) if text is not None else "None"
    if limit is not None and len(t) > limit:
        t = t[: limit - 1] + "…"
    return t


def pause_cause(p: dict[str, Any], limit: int | None = None) -> str:
    """Why a pause (a `stats` pause dict) was put on: 'after N failures: Type: message', or
    'by hand' for one put on by 'queick pause' (it has no error)."""
    err = p.get("last_error")
    if not err:
        return "by hand"
    return f"after {p['failures']} failures: {err.get('type')}: {one_line(err.get('message'), limit)}"


def local_time(t: float | None) -> str:
    """A unix time as local 'YYYY-mm-dd HH:MM:SS' ('-' for none). A time the platform cannot
    show (a store written before such times were refused) is printed as the number."""
    if t is None:
        return "-"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    except (OverflowError, OSError, ValueError):
        return f"{t:.0f}"


def ago(now: float, t: float | None, sep: str = " ") -> str:
    """How long before `now` the time `t` was, for people: '45 s', '12 min', '3.5 h', '2.0 d'
    (with sep="": '45s', '12m', ...); '-' when there is no time."""
    if t is None:
        return "-"
    s = max(0.0, now - t)
    if s < 120:
        return f"{s:.0f}{sep}s"
    if s < 7200:
        return f"{s / 60:.0f}{sep}{'min' if sep else 'm'}"
    if s < 172800:
        return f"{s / 3600:.1f}{sep}h"
    return f"{s / 86400:.1f}{sep}d"


def probe_text(p: dict[str, Any], now: float) -> str:
    """What a pause (a `stats` pause dict) waits for: its next probe, its probe running, or
    a resume by hand."""
    at = p.get("probe_at")
    if at is None:
        return " (until resumed)"
    if p.get("probe_job") is not None and at <= now:
        return f" (probe job {p['probe_job']} running)"
    return f" (next probe {'now' if at <= now else 'in ' + ago(at, now, sep='')})"


def progress_text(p: dict[str, Any] | None, limit: int | None = None) -> str:
    """A job's `progress` for people: '42/100 (42%) copying', '7 copying' without a total,
    '' when it said none. `limit`: characters of the note kept."""
    if not p:
        return ""
    done, total, note = p.get("done"), p.get("total"), p.get("note")
    text = f"{done:g}" if isinstance(done, (int, float)) else str(done)
    if isinstance(total, (int, float)):
        text += f"/{total:g}"
        if total > 0 and isinstance(done, (int, float)):
            text += f" ({100 * done / total:.0f}%)"
    if note:
        text += f" {one_line(note, limit)}"
    return text


STALLED = "stalled"  # what a running job with a stalled mark shows (core/policy/liveness.py)


def stalled_text(j: dict[str, Any]) -> str:
    """'STALLED since 12:03:04' for a running job its worker marked stalled, else ''."""
    at = j.get("stalled_at")
    if at is None or j.get("state", "running") != "running":
        return ""
    return f"STALLED since {local_time(at)}"
