"""In-process counters, run-duration histograms and the last hour's history; Prometheus text.

Counters are fed by hooks the daemon calls (a commit, a finished run, a webhook delivery),
never by scanning the store; gauges (jobs by state, oldest wait, ...) come from the `stats`
picture when /metrics is read. The history keeps one bucket per minute for the last hour:
the jobs enqueued as they come, and the queue depth as last sampled (on each safety sweep
and each read), so an idle daemon adds no timer; the runs are the store's per-minute
counts (ui/status.py). Thread-safe.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from ..core.job import Job, NewJob, Outcome, State, Submitted

# Upper bounds (seconds) of the run-duration buckets: a Pi's jobs run from milliseconds
# (a counter bump) to minutes (an upload over a slow link).
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
HISTORY_MINUTES = 60


class _Histogram:
    __slots__ = ("counts", "sum", "count")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, v)] += 1
        self.sum += v
        self.count += 1


class Metrics:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()  # guards every field below; held only for a few updates
        self.enqueued: dict[str, int] = {}
        self.completed: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self.hook_deliveries: dict[str, int] = {}
        self.durations: dict[str, _Histogram] = {}
        # [minute (unix time // 60), enqueued, depth or None]
        self._minutes: deque[list[Any]] = deque(maxlen=HISTORY_MINUTES + 1)
        # The stats() of the runner, the progress writer and the liveness watch, set by the
        # daemon: read, never copied, so there is one count of each.
        self.sandbox: Callable[[], dict[str, Any]] | None = None
        self.progress: Callable[[], dict[str, int]] | None = None
        self.liveness: Callable[[], dict[str, Any]] | None = None

    def sandbox_stats(self) -> dict[str, Any] | None:
        return self.sandbox() if self.sandbox is not None else None

    def progress_stats(self) -> dict[str, int] | None:
        return self.progress() if self.progress is not None else None

    def liveness_stats(self) -> dict[str, Any] | None:
        return self.liveness() if self.liveness is not None else None

    def _bucket(self, now: float) -> list[Any]:
        minute = int(now // 60)
        if not self._minutes or self._minutes[-1][0] != minute:
            self._minutes.append([minute, 0, None])
        return self._minutes[-1]

    # --- hooks, called by the daemon's parts ----------------------------------------------
    def on_committed(self, jobs: Sequence[NewJob], submitted: Sequence[Submitted]) -> None:
        """Committer thread: jobs stored by one commit (duplicates are not new jobs)."""
        with self._lock:
            n = 0
            for j, s in zip(jobs, submitted, strict=True):
                if not s.duplicate:
                    self.enqueued[j.func] = self.enqueued.get(j.func, 0) + 1
                    n += 1
            self._bucket(self._clock())[1] += n

    def on_ran(self, job: Job, outcome: Outcome, seconds: float) -> None:
        """Worker thread: one run of a job ended; a run that did not succeed is a failure."""
        with self._lock:
            ok = outcome.state == State.SUCCEEDED
            table = self.completed if ok else self.failed
            table[job.func] = table.get(job.func, 0) + 1
            h = self.durations.get(job.func)
            if h is None:
                h = self.durations[job.func] = _Histogram()
            h.observe(seconds)

    def on_hook(self, name: str) -> None:
        with self._lock:
            self.hook_deliveries[name] = self.hook_deliveries.get(name, 0) + 1

    def sample_depth(self, waiting: int) -> None:
        """Record the number of waiting jobs (scheduled, queued, waiting_network) now."""
        with self._lock:
            self._bucket(self._clock())[2] = waiting

    def history(self) -> list[dict[str, Any]]:
        """The last hour's enqueued and depth, one entry per minute, oldest first; minutes with
        no sample of the depth carry the previous one forward (None before the first)."""
        now = self._clock()
        last = int(now // 60)
        with self._lock:
            by_minute = {b[0]: list(b) for b in self._minutes}
        out, depth = [], None
        for m in range(last - HISTORY_MINUTES + 1, last + 1):
            b = by_minute.get(m)
            if b is not None and b[2] is not None:
                depth = b[2]
            out.append({"t": m * 60, "enqueued": b[1] if b else 0, "depth": depth})
        return out

    # --- Prometheus text format -----------------------------------------------------------
    def render(self, stats: dict[str, Any]) -> str:
        """The exposition text, from a detailed `stats` reply plus these counters."""
        now = self._clock()
        out: list[str] = []

        def family(name: str, kind: str, help: str, samples: list[tuple[dict[str, str], float]]) -> None:
            out.append(f"# HELP {name} {help}")
            out.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                out.append(f"{name}{_labels(labels)} {_num(value)}")

        counts = stats["counts"]
        family("queickd_jobs", "gauge", "Jobs by state.",
               [({"state": s}, counts.get(s, 0)) for s in State.ALL])
        oldest = stats.get("oldest_queued_at")
        family("queickd_oldest_queued_seconds", "gauge",
               "Age of the oldest job due and waiting for a worker (0 when none).",
               [({}, max(0.0, now - oldest) if oldest is not None else 0.0)])
        family("queickd_key_waiting_jobs", "gauge", "Waiting jobs per serial key (the busiest keys).",
               [({"key": k["key"]}, k["waiting"]) for k in stats["waiting_by_key"]])
        family("queickd_key_oldest_waiting_seconds", "gauge",
               "Age of the oldest waiting job per serial key (0 while it is not yet due).",
               [({"key": k["key"]}, max(0.0, now - k["oldest_run_at"])) for k in stats["waiting_by_key"]])
        w = stats["workers"]
        family("queickd_workers", "gauge", "Worker threads by activity.",
               [({"state": "busy"}, w["busy"]), ({"state": "idle"}, w["total"] - w["busy"])])
        family("queickd_pool_size", "gauge", "Worker threads of this process now, and the adaptive "
               "pool's bounds (min = max for a fixed size).",
               [({"bound": "size"}, w.get("size", w["total"])), ({"bound": "min"}, w.get("min", w["total"])),
                ({"bound": "max"}, w.get("max", w["total"]))])
        family("queickd_running_without_worker", "gauge",
               "Jobs recorded as running whose worker is gone. Shared PostgreSQL store: running jobs "
               "whose worker record is missing or missed 3 heartbeats (the orphan sweep re-queues them). "
               "SQLite and memory: running jobs this daemon's workers do not hold.",
               [({}, stats["running_without_worker"])])
        pools = stats.get("pools") or {}
        family("queickd_pool_workers", "gauge",
               "Live worker slots serving each pool (every registered daemon and external worker on "
               "PostgreSQL; this daemon's own workers on SQLite and memory). With waiting jobs and 0 "
               "here, the pool's jobs wait until a worker serves it.",
               [({"pool": name}, p["workers"]) for name, p in pools.items()])
        family("queickd_pool_waiting_jobs", "gauge",
               "Waiting jobs (scheduled, queued, waiting for the network) per pool.",
               [({"pool": name}, p["waiting"]) for name, p in pools.items()])
        budgets = stats.get("budgets") or []
        for metric, what, help_text in (
                ("queickd_budget_limit_units", "limit", "Each cost budget's limit (cost units)."),
                ("queickd_budget_running_units", "running", "Cost units running against each budget."),
                ("queickd_budget_waiting_units", "waiting", "Cost units of the jobs waiting for each budget.")):
            family(metric, "gauge", help_text, [({"kind": b["kind"], "name": b["name"]}, b[what]) for b in budgets])
        rated = stats.get("rate_keys") or []
        for metric, what, help_text in (
                ("queickd_rate_limit_starts", "limit", "Each rate key's limit: starts per window."),
                ("queickd_rate_window_seconds", "per", "Each rate key's window (seconds)."),
                ("queickd_rate_window_used_starts", "used", "Starts of each rate key in the window that ends now."),
                ("queickd_rate_next_start_timestamp_seconds", "next_start",
                 "When each rate key may start its next job (unix time; now when it has room).")):
            family(metric, "gauge", help_text, [({"key": k["key"]}, k[what]) for k in rated])
        family("queickd_rate_blocked_until_timestamp_seconds", "gauge",
               "Until when a rate key starts nothing, told by its service (an HTTP 429's Retry-After).",
               [({"key": k["key"]}, k["blocked_until"]) for k in rated if k.get("blocked_until") is not None])
        fair = stats.get("fair_keys") or []
        family("queickd_fair_waiting_jobs", "gauge",
               "Queued jobs of each fair key with work waiting (the most waiting first, at most 20).",
               [({"pool": k["pool"], "key": k["key"]}, k["waiting"]) for k in fair])
        family("queickd_fair_last_start_timestamp_seconds", "gauge",
               "When each fair key with work waiting last started a job (unix time; 0: not yet).",
               [({"pool": k["pool"], "key": k["key"]}, k["last_start"]) for k in fair])
        memory = stats.get("memory") or {}
        family("queickd_deferred_total", "counter", "Claimed jobs sent back to wait, by reason (memory: "
               "they may not fit in the memory left; max_rss: in what --max-rss leaves).",
               [({"reason": r}, n) for r, n in sorted((memory.get("deferred") or {}).items())])
        ev = stats["events"]
        ev_oldest = stats.get("outbox_oldest_pending_at")
        family("queickd_outbox_pending_events", "gauge", "Events in the outbox waiting for room.",
               [({}, ev.get("pending", 0))])
        family("queickd_outbox_oldest_pending_seconds", "gauge",
               "Age of the oldest pending outbox event (0 when none).",
               [({}, max(0.0, now - ev_oldest) if ev_oldest is not None else 0.0)])
        family("queickd_dead_letters", "gauge", "Dead jobs and dead outbox events.",
               [({"kind": "job"}, counts.get(State.DEAD, 0)), ({"kind": "event"}, ev.get("dead", 0))])
        hour = stats.get("last_hour") or {"members": []}
        family("queickd_fleet_runs_last_hour", "gauge",
               "Runs in the last hour by each daemon and worker of the store (result: completed or "
               "failed), from the store's per-minute counts; the fleet's is their sum. On SQLite and "
               "memory, this daemon's alone (not its earlier starts').",
               [({"member": m["member"], "result": r}, m[r]) for m in hour["members"] for r in ("completed", "failed")])
        family("queickd_fleet_run_seconds_last_hour", "gauge",
               "Seconds spent running jobs in the last hour, by each daemon and worker of the store.",
               [({"member": m["member"]}, m["seconds"]) for m in hour["members"]])
        family("queickd_paused", "gauge", "Keys, functions and pools paused, after repeated failures "
               "or by hand (1 each).",
               [({"kind": p["kind"], "name": p["name"]}, 1) for p in stats["paused"]])
        family("queickd_pause_next_probe_timestamp_seconds", "gauge",
               "When a paused key or function lets its next probe job through (unix time; "
               "absent for a pause by hand, which lasts until resumed).",
               [({"kind": p["kind"], "name": p["name"]}, p["probe_at"]) for p in stats["paused"]
                if p.get("probe_at") is not None])
        family("queickd_draining", "gauge", "1 while an operator's drain holds this daemon's new "
               "job starts ('queick drain'; ended by 'queick drain --off' or a restart).",
               [({}, 1 if stats.get("draining") else 0)])
        wf = stats.get("workflows") or {"runs": {}, "budget_stops": {}}
        family("queickd_workflow_runs", "gauge", "Workflow runs by state.",
               [({"state": k}, v) for k, v in wf["runs"].items()])
        family("queickd_workflow_budget_stops", "gauge", "Workflow runs stopped by a budget, by budget.",
               [({"budget": k}, v) for k, v in sorted(wf["budget_stops"].items())])
        family("queickd_store_writable", "gauge", "1 while the store accepts writes and makes them durable; "
               "0 after a failed flush or a store file deleted under the daemon (see its log).",
               [({}, 0 if stats.get("store_problem") else 1)])
        sch = stats["scheduler"]
        family("queickd_scheduler_up", "gauge", "1 while the scheduler thread runs.",
               [({}, 1 if sch["alive"] else 0)])
        family("queickd_scheduler_last_fired_timestamp_seconds", "gauge",
               "When the scheduler last promoted a job or fired a cron (unix time; 0 never).",
               [({}, sch["last_fired_at"] or 0)])
        net = stats.get("network")
        family("queickd_network_checker_up", "gauge",
               "1 while the network checker process runs (0 also when none is configured).",
               [({}, 1 if net and net["checker_alive"] else 0)])
        family("queickd_network_up", "gauge", "1 network up, 0 down, NaN unknown or no checker.",
               [({}, {"up": 1, "down": 0}.get(net["state"], math.nan) if net else math.nan)])
        up = stats.get("upstream")
        if up is not None:  # an edge daemon's forwarding: slow (held shrinks) or stuck (oldest grows)
            family("queickd_upstream_up", "gauge", "1 while the upstream takes forwarded jobs; 0 unreachable, "
                   "refusing our token or certificate; NaN not tried yet.",
                   [({"link": up["link"]}, {"up": 1, "idle": math.nan}.get(up["link"], 0))])
            for metric, kind, what, help_text in (
                    ("queickd_upstream_held_jobs", "gauge", "held", "Jobs held for the upstream, not yet forwarded."),
                    ("queickd_upstream_held_bytes", "gauge", "held_bytes", "Bytes of the jobs held for the upstream."),
                    ("queickd_upstream_oldest_held_age_seconds", "gauge", "oldest_held_age",
                     "Age of the oldest job held for the upstream (0 when none is)."),
                    ("queickd_upstream_last_forward_timestamp_seconds", "gauge", "last_forward_at",
                     "When the upstream last took jobs (unix time; 0 never)."),
                    ("queickd_upstream_forwarded_total", "counter", "forwarded", "Jobs the upstream took."),
                    ("queickd_upstream_refused_total", "counter", "refused", "Jobs the upstream refused (dead here)."),
                    ("queickd_upstream_wakeups_total", "counter", "wakeups", "Times the forwarder woke.")):
                family(metric, kind, help_text, [({}, up[what] or 0)])
        pr = stats.get("progress")
        if pr is not None:
            family("queickd_progress_updates_total", "counter", "Progress values jobs reported "
                   "(queickd.progress), a repeat of a job's last value not counted.", [({}, pr["offered"])])
            family("queickd_progress_writes_total", "counter", "Jobs' progress rows written to the store "
                   "(the latest value of each job, at most a few times a second).", [({}, pr["written"])])
        lv = stats.get("liveness")
        if lv is not None:
            family("queickd_jobs_stalled", "gauge", "Running jobs marked stalled: no progress (nor, in a "
                   "process, CPU time) for their stalled_after, whichever host runs them.", [({}, lv["stalled"])])
            if "stalls" in lv:
                family("queickd_stalls_total", "counter", "Runs this process found stalled, by their "
                       "on_stall (mark: shown as stalled; kill: stopped and retried per their policy).",
                       [({"on_stall": k}, n) for k, n in lv["stalls"].items()])
        sb = stats.get("sandbox")
        if sb is not None:
            family("queickd_runs_total", "counter", "Job runs by isolation (thread or process).",
                   [({"isolation": k}, n) for k, n in sb["runs"].items()])
            family("queickd_limit_kills_total", "counter", "Process jobs killed at a limit, by kind.",
                   [({"kind": k}, n) for k, n in sb["kills"].items()])
            family("queickd_process_crashes_total", "counter",
                   "Process jobs that died by a signal or exited without a report.", [({}, sb["crashed"])])
            family("queickd_zygote_up", "gauge", "1 while the zygote (the process jobs' fork server) runs.",
                   [({}, 1 if sb["zygote"]["alive"] else 0)])
            family("queickd_zygote_restarts_total", "counter", "Times the zygote died and was restarted.",
                   [({}, sb["zygote"]["restarts"])])
            if sb.get("limits"):
                family("queickd_memory_limits_info", "gauge", "How process jobs' memory limits are enforced "
                       "here: by cgroup v2, cgroup v1 or RSS watch (always 1).",
                       [({"by": sb["limits"]["memory"]}, 1)])
        family("queickd_requests_refused_total", "counter", "Enqueue requests refused (queue full, conflict).",
               [({}, stats["refused"])])
        family("queickd_start_time_seconds", "gauge", "When the daemon started (unix time).",
               [({}, now - stats["uptime"])])
        with self._lock:
            enq, comp, fail = dict(self.enqueued), dict(self.completed), dict(self.failed)
            hooks = dict(self.hook_deliveries)
            hists = {f: (list(h.counts), h.sum, h.count) for f, h in self.durations.items()}
        family("queickd_enqueued_total", "counter", "Jobs stored through the enqueue path (TCP, webhooks, "
               "legacy clients), duplicates excluded.", [({"func": f}, n) for f, n in sorted(enq.items())])
        family("queickd_completed_total", "counter", "Runs that succeeded.",
               [({"func": f}, n) for f, n in sorted(comp.items())])
        family("queickd_failed_total", "counter", "Runs that did not succeed (retried, dead or parked).",
               [({"func": f}, n) for f, n in sorted(fail.items())])
        family("queickd_webhook_deliveries_total", "counter", "Webhook deliveries accepted as new jobs.",
               [({"hook": h}, n) for h, n in sorted(hooks.items())])
        name = "queickd_job_run_duration_seconds"
        out.append(f"# HELP {name} How long job runs took, per function.")
        out.append(f"# TYPE {name} histogram")
        for f, (buckets, total, count) in sorted(hists.items()):
            acc = 0
            for bound, n in zip((*BUCKETS, math.inf), buckets, strict=True):
                acc += n
                out.append(f"{name}_bucket{_labels({'func': f, 'le': _num(bound)})} {acc}")
            out.append(f"{name}_sum{_labels({'func': f})} {_num(total)}")
            out.append(f"{name}_count{_labels({'func': f})} {count}")
        return "\n".join(out) + "\n"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items()) + "}"


def _num(v: float) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "+Inf" if v > 0 else "-Inf"
        return repr(v)
    return str(v)
