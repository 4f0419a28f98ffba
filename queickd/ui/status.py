"""The detailed `stats` picture: what `queick status`, `queick top`, the status page and
/metrics show besides the plain counts. Reads the store (a few small, indexed queries) and
the daemon's metrics; called from the server's I/O threads and HTTP threads.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from ..core.job import State
from ..store.contract.inspect import Inspect
from ..store.records import EventState, Minute, Pause
from .metrics import HISTORY_MINUTES, Metrics

DEAD_SHOWN = 10
RUNNING_SHOWN = 20
SCHEDULED_READ = 1000  # scheduled jobs read to tell retries from later runs (a Pi has few)
HEADS_READ = 200  # queued jobs of a key read to find its head


def first_minute(now: float) -> int:
    """The first minute (unix time // 60) of the last hour's history."""
    return int(now // 60) - HISTORY_MINUTES + 1


def last_hour(minutes: list[Minute], live: Collection[str] | None = None) -> dict[str, Any]:
    """The last hour's runs from the store's per-minute counts: the fleet's (every daemon and
    worker that ran jobs), and each member's beside them; with `live`, only those members'
    (the totals still count every run)."""
    per: dict[str, list] = {}
    for m in minutes:
        c = per.setdefault(m.member, [0, 0, 0.0])
        c[0] += m.completed
        c[1] += m.failed
        c[2] += m.seconds
    members = [{"member": k, "completed": c[0], "failed": c[1], "seconds": round(c[2], 3)}
               for k, c in sorted(per.items()) if c[0] or c[1]]
    return {"completed": sum(m["completed"] for m in members), "failed": sum(m["failed"] for m in members),
            "seconds": round(sum(m["seconds"] for m in members), 3),
            "members": [m for m in members if live is None or m["member"] in live]}


def history(now: float, minutes: list[Minute], mine: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per minute of the last hour, oldest first: runs and the sampled queue depth
    from the store (they survive a restart, and count every member of a fleet), enqueued
    and this process's latest depth sample from its own metrics (`mine`, Metrics.history)."""
    first = first_minute(now)
    runs: dict[int, list] = {}
    for m in minutes:
        r = runs.setdefault(m.minute, [0, 0, None])
        r[0] += m.completed
        r[1] += m.failed
        if m.depth is not None:
            r[2] = m.depth if r[2] is None else max(r[2], m.depth)
    own = {int(h["t"] // 60): h for h in mine}
    out, depth = [], None
    for minute in range(first, first + HISTORY_MINUTES):
        r, h = runs.get(minute), own.get(minute)
        # The store's sample (every daemon's), else this process's own (carried forward).
        sampled = r[2] if r is not None and r[2] is not None else (h["depth"] if h is not None else None)
        if sampled is not None:
            depth = sampled
        out.append({"t": minute * 60, "enqueued": h["enqueued"] if h else 0, "completed": r[0] if r else 0,
                    "failed": r[1] if r else 0, "depth": depth})
    return out


def detail(store: Inspect, metrics: Metrics | None, now: float, counts: dict[str, int],
           minutes: list[Minute] | None = None) -> dict[str, Any]:
    """The extra fields of `stats` with detail=true; `counts` is the reply's jobs by state,
    `minutes` the store's per-minute counts of the last hour (read here if not given).
    Takes the parts it reads, not the service, so the service may import it."""
    running = store.list_jobs(State.RUNNING, RUNNING_SHOWN)
    dead = store.list_jobs(State.DEAD, DEAD_SHOWN)
    out: dict[str, Any] = {
        "now": now,
        "oldest_queued_at": store.oldest_queued_at(),
        "outbox_oldest_pending_at": store.oldest_pending_event_at(),
        "running": [{"id": j.id, "func": j.func, "key": j.key, "started_at": j.started_at,
                     "attempts": j.attempts, "progress": j.progress, "stalled_at": j.stalled_at} for j in running],
        "dead_jobs": [{"id": j.id, "func": j.func, "key": j.key, "finished_at": j.finished_at,
                       "error": {"type": (j.error or {}).get("type"), "message": (j.error or {}).get("message")}}
                      for j in dead],
        "dead_events": [e.to_dict() for e in store.list_events(EventState.DEAD, DEAD_SHOWN)],
        "history": [],
    }
    out.update(scheduled_split(store))
    out["key_blocks"] = key_blocks(store, store.pauses(), [k for k, _, _ in store.waiting_by_key(10)])
    mine: list[dict[str, Any]] = []
    if metrics is not None:
        metrics.sample_depth(sum(counts.get(s, 0) for s in State.PENDING))
        mine = metrics.history()
    if minutes is None:
        minutes = store.minutes(first_minute(now))
    out["history"] = history(now, minutes, mine)
    return out


def scheduled_split(store: Inspect) -> dict[str, Any]:
    """Scheduled jobs waiting out a retry (they have run) apart from those scheduled for
    later (never run yet), and the next retry's time. Reads at most SCHEDULED_READ of them
    (`scheduled_capped` says so)."""
    jobs = store.list_jobs(State.SCHEDULED, SCHEDULED_READ)
    retrying = [j for j in jobs if j.attempts > 0]
    return {"retrying": len(retrying), "scheduled_later": len(jobs) - len(retrying),
            "next_retry_at": min((j.run_at for j in retrying), default=None),
            "scheduled_capped": len(jobs) >= SCHEDULED_READ}


def key_blocks(store: Inspect, pauses: list[Pause], keys: list[str]) -> dict[str, str]:
    """Why a key's queued jobs do not start, for the keys that are held: its own pause, or
    its head job's function paused (which holds every job of the key behind it)."""
    paused_keys = {p.name for p in pauses if p.kind == "key"}
    paused_funcs = {p.name for p in pauses if p.kind == "func"}
    out: dict[str, str] = {}
    for k in keys:
        if k in paused_keys:
            out[k] = "the key is paused"
        elif paused_funcs:
            queued = store.list_jobs(State.QUEUED, HEADS_READ, key=k)
            head = min(queued, key=lambda j: (j.priority, j.run_at, j.id), default=None)
            if head is not None and head.func in paused_funcs:
                out[k] = f"blocked: its next job's function {head.func} is paused"
    return out
