"""The detailed `stats` picture: what `queick status`, `queick top`, the status page and
/metrics show besides the plain counts. Reads the store (a few small, indexed queries) and
the daemon's metrics; called from the server's I/O threads and HTTP threads.
"""

from __future__ import annotations

from typing import Any

from ..core.job import State
from ..store.base import EventState, Store
from .metrics import Metrics

DEAD_SHOWN = 10
RUNNING_SHOWN = 20


def detail(store: Store, metrics: Metrics | None, now: float, counts: dict[str, int]) -> dict[str, Any]:
    """The extra fields of `stats` with detail=true; `counts` is the reply's jobs by state.
    Takes the parts it reads, not the service, so the service may import it."""
    running = store.list_jobs(State.RUNNING, RUNNING_SHOWN)
    dead = store.list_jobs(State.DEAD, DEAD_SHOWN)
    out: dict[str, Any] = {
        "now": now,
        "oldest_queued_at": store.oldest_queued_at(),
        "outbox_oldest_pending_at": store.oldest_pending_event_at(),
        "running": [{"id": j.id, "func": j.func, "key": j.key, "started_at": j.started_at,
                     "attempts": j.attempts} for j in running],
        "dead_jobs": [{"id": j.id, "func": j.func, "key": j.key, "finished_at": j.finished_at,
                       "error": {"type": (j.error or {}).get("type"), "message": (j.error or {}).get("message")}}
                      for j in dead],
        "dead_events": [e.to_dict() for e in store.list_events(EventState.DEAD, DEAD_SHOWN)],
        "history": [],
    }
    if metrics is not None:
        metrics.sample_depth(sum(counts.get(s, 0) for s in State.PENDING))
        out["history"] = metrics.history()
    return out


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
