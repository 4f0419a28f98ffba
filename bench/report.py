"""The report: metrics per scenario, target and round, their medians and ratios, the
machine's description, the text table with its context lines, and the JSON. It starts
no process and measures nothing.
"""

from __future__ import annotations

import contextlib
import os
import platform
import sqlite3
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.goals import goal_lines
from bench.manyclients import RATE
from bench.peers import HUEY, HUEY_VERSION, QUEICK, QUEICK_VERSION, QUEICKD_MEMORY, QUEICKD_SQLITE
from bench.processes import default_queickd_path
from bench.running import E2E_SINGLE
from bench.scenarios import RAW_LONE, RAW_LONE_TCP, RAW_TCP

if TYPE_CHECKING:
    from bench.run import Scenario
    from bench.scenarios import Settings

# --- results -----------------------------------------------------------------------------------
@dataclass
class Metric:
    scenario: str  # e.g. "enqueue-single"
    label: str  # what the table shows in its scenario column
    target: str
    unit: str
    higher_is_better: bool
    peer: tuple[str, str, str] | None = None  # (scenario, target, label) this is compared to
    values: list[float] = field(default_factory=list)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def median(self) -> float | None:
        return statistics.median(self.values) if self.values else None


class Results:
    def __init__(self) -> None:
        self.metrics: dict[tuple[str, str, str], Metric] = {}
        self.notes: list[str] = []

    def add(self, scenario: str, label: str, target: str, unit: str, value: float, *,
            higher_is_better: bool, peer: tuple[str, str, str] | None = None,
            raw: dict[str, Any] | None = None) -> None:
        key = (scenario, target, label)
        m = self.metrics.get(key)
        if m is None:
            m = self.metrics[key] = Metric(scenario, label, target, unit, higher_is_better, peer)
        m.values.append(value)
        if raw is not None:
            m.rounds.append(raw)

    def error(self, scenario: str, target: str, message: str) -> None:
        key = (scenario, target, "error")
        m = self.metrics.get(key)
        if m is None:
            m = self.metrics[key] = Metric(scenario, "error", target, "", True)
        m.errors.append(message)

    def ratio(self, m: Metric) -> float | None:
        if m.peer is None or m.median is None:
            return None
        p = self.metrics.get(m.peer)
        if p is None or not p.median:
            return None
        return m.median / p.median

    def median(self, key: tuple[str, str, str]) -> float | None:
        """The median of (scenario, target, label), None when not measured."""
        m = self.metrics.get(key)
        return m.median if m else None

    def has_errors(self) -> bool:
        return any(m.errors for m in self.metrics.values())


# --- machine and report ---------------------------------------------------------------------------
def _fs_type(path: Path) -> str:
    best, fstype = "", "?"
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and str(path).startswith(parts[1]) and len(parts[1]) >= len(best):
                best, fstype = parts[1], f"{parts[2]} ({parts[0]} on {parts[1]})"
    return fstype


def host_info() -> dict[str, Any]:
    """The machine a run names (CPU model, cores, memory, kernel, Python, when): the same
    keys in bench.run's and bench.pg's JSON, which bench/publish.py prints above a table."""
    cpu = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = "?"
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        mem = f"{int(f.readline().split()[1]) / 1024**2:.1f} GiB"
    return {"nproc": os.cpu_count(), "cpu": cpu, "mem_total": mem, "kernel": platform.release(),
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def machine_info(s: Settings) -> dict[str, Any]:
    try:
        from queickd import __version__ as qv
    except ImportError:  # pragma: no cover
        qv = "?"
    return {
        **host_info(), "sqlite": sqlite3.sqlite_version, "queickd": qv,
        "queickd_path": str(default_queickd_path()),
        "queick": QUEICK_VERSION, "huey": HUEY_VERSION, "tmp_dir": str(s.tmp_root), "tmp_fs": _fs_type(s.tmp_root.resolve()),
        "loadavg_start": os.getloadavg(),
    }


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit in ("MiB",) or abs(v) < 100:
        return f"{v:,.1f}"
    return f"{v:,.0f}"


def render(res: Results, order: list[Scenario], info: dict[str, Any], s: Settings) -> str:
    lines = [
        f"queickd {info['queickd']} ({info['queickd_path']}) vs Queick {QUEICK_VERSION}: {s.rounds} round(s)"
        f"{' (--quick)' if s.quick else ''}; {info['nproc']} CPUs ({info['cpu']}), {info['mem_total']} RAM,"
        f" Python {info['python']}, SQLite {info['sqlite']}, temp dirs on {info['tmp_fs']}",
        "ratio = queickd median / peer median (for rates >1 means queickd is faster; for sizes, CPU, latency"
        " and counts <1 means queickd uses less). * = compared with Queick one-at-a-time, its only enqueue mode.",
        "",
    ]
    rows: list[tuple[str, ...]] = []
    for sc in order:
        ms = [m for m in res.metrics.values() if m.scenario == sc.name]
        labels: list[str] = []
        for m in ms:
            if m.label not in labels and m.label != "error":
                labels.append(m.label)
        for label in labels:
            for target in sc.targets:
                m = res.metrics.get((sc.name, target, label))
                if m is None:
                    continue
                r = res.ratio(m)
                if m.target == QUEICK:
                    rs = "(peer)"
                elif r is None:
                    rs = "-"
                else:
                    rs = f"{r:,.2f}x" + ("*" if m.peer and m.peer[0] != sc.name else "")
                span = f"{_fmt(min(m.values), m.unit)}–{_fmt(max(m.values), m.unit)}" if m.values else "-"
                rows.append((sc.title, label, target, _fmt(m.median, m.unit), span, m.unit, rs))
        for target in sc.targets:
            m = res.metrics.get((sc.name, target, "error"))
            for e in m.errors if m is not None else []:
                first = e.strip().splitlines()[0] if e.strip() else "error"
                rows.append((sc.title, "FAILED", target, "", "", "", first))
        rows.append(())
    head = ("scenario", "metric", "target", "median", "min–max", "unit", "queickd/peer")
    widths = [max([len(h)] + [len(r[i]) for r in rows if r and r[1] != "FAILED"]) for i, h in enumerate(head)]
    right = {3, 4, 6}

    def fmt_row(r: tuple[str, ...]) -> str:
        if r[1] == "FAILED":
            return f"{r[0]:<{widths[0]}}  {'FAILED':<{widths[1]}}  {r[2]:<{widths[2]}}  {r[6]}"
        return "  ".join(f"{c:>{w}}" if i in right else f"{c:<{w}}" for i, (c, w) in enumerate(zip(r, widths, strict=True)))

    lines.append(fmt_row(head))
    lines.append("-" * (sum(widths) + 2 * (len(widths) - 1)))
    prev = None
    for r in rows:
        if not r:
            lines.append("")
            prev = None
            continue
        shown = r if r[0] != prev else ("",) + r[1:]
        prev = r[0]
        lines.append(fmt_row(shown).rstrip())
    goals = goal_lines(res)
    if goals:
        lines += ["goals (ratios of medians of this run):"] + [f"  {g}" for g in goals] + [""]
    ctx = _context_lines(res)
    if ctx:
        lines += ["context:"] + [f"  {c}" for c in ctx] + [""]
    if res.notes:
        lines += ["notes:"] + [f"  - {n}" for n in res.notes]
    return "\n".join(lines)


def _context_lines(res: Results) -> list[str]:
    def med(scenario: str, target: str, label: str) -> float | None:
        m = res.metrics.get((scenario, target, label))
        return m.median if m else None

    out = []
    q1 = med("enqueue-single", QUEICKD_SQLITE, "enqueue rate")
    raw1 = med("raw-sqlite", "WAL sync=FULL, 1 row/commit", "commits/s")
    if q1 and raw1:
        out.append(f"queickd sqlite/full one-at-a-time enqueue = {q1 / raw1:.0%} of raw FULL 1-row commits/s"
                   " (each lone request is one fsync'd commit)")
    qk1 = med("enqueue-single", QUEICK, "enqueue rate")
    if qk1 and raw1:
        out.append(f"1.5x Queick one at a time = {1.5 * qk1:,.0f} acks/s; this disk did {raw1:,.0f} fsync'd 1-row commits/s"
                   f" ({raw1 / qk1:.2f}x Queick): the ceiling of a client that waits for each durable ack")
    lat, lone = med("latency", QUEICKD_SQLITE, "enqueue→start p50"), med("raw-lone-commit", RAW_LONE, "lone commit p50")
    if lat and lone:
        out.append(f"queickd sqlite/full latency p50 {lat:.1f} ms, of which a lone fsync'd commit alone takes "
                   f"{lone:.1f} ms (p50) on this disk")
    lat_m, trip = med("latency", QUEICKD_MEMORY, "enqueue→start p50"), med("raw-lone-tcp", RAW_LONE_TCP,
                                                                             "lone round trip p50")
    if lat_m and trip:
        out.append(f"queickd memory latency p50 {lat_m:.1f} ms, of which a lone loopback round trip between two "
                   f"idle processes alone takes {trip:.2f} ms (p50) on this machine")
    qm = med("enqueue-single", QUEICKD_MEMORY, "enqueue rate")
    rtt = med("raw-tcp", RAW_TCP, "round trips/s")
    if qm and rtt:
        out.append(f"queickd memory one-at-a-time enqueue = {qm / rtt:.0%} of raw loopback round trips/s")
    qk = med("enqueue-single", QUEICK, "enqueue rate")
    if qk and rtt:
        out.append(f"Queick one-at-a-time enqueue = {qk / rtt:.0%} of raw loopback round trips/s "
                   "(it opens a new TCP connection per job)")
        out.append(f"1.5x Queick one at a time = {1.5 * qk:,.0f} requests/s; this loopback did {rtt:,.0f}"
                   " request/response round trips/s between two processes doing nothing else: the ceiling of"
                   " a client that waits for each reply, whatever the server does")
    e2e_qk, e2e_h = med("e2e", QUEICK, E2E_SINGLE), med("e2e", HUEY, E2E_SINGLE)
    if q1 and (e2e_qk or e2e_h):
        best = max(e2e_qk or 0.0, e2e_h or 0.0)
        out.append(f"2x the faster peer end to end = {2 * best:,.0f} jobs/s; the same client enqueueing one at a"
                   f" time with no worker running got {q1:,.0f} (sqlite/full): the ceiling of one enqueue per job"
                   " at full durability")
    many = med("enqueue-many", QUEICKD_SQLITE, "enqueue rate")
    raw100 = med("raw-sqlite", "WAL sync=FULL, 100 rows/commit", "rows/s")
    if many and raw100:
        out.append(f"queickd sqlite/full enqueue_many = {many / raw100:.0%} of raw FULL 100-row-batch rows/s")
    for scenario, label_q, label_h, what in (
        ("enqueue-single", "enqueue rate", "enqueue rate", "enqueue rate (one at a time)"),
        ("memory-100k", "store (db+wal) per job", "store (db+wal) per job", "store (db+wal) per job, 100k"),
        ("memory-100k", "store per job, after clean stop", "store per job, after clean stop",
         "store per job after clean stop, 100k"),
        ("memory-100k", "RSS after", "RSS after", "RSS with 100k scheduled"),
        ("e2e", E2E_SINGLE, E2E_SINGLE, "e2e rate, one enqueue per job"),
        ("many-clients-enqueue", RATE, RATE, "many clients, enqueue only"),
        ("e2e", "CPU per job (server+client)", "CPU per job (server+client)", "e2e CPU per job"),
        ("latency", "enqueue→start p50", "enqueue→start p50", "latency p50"),
        ("latency", "enqueue→start p99", "enqueue→start p99", "latency p99"),
        ("idle", "CPU", "CPU", "idle CPU"),
        ("idle", "context switches", "context switches", "idle context switches"),
    ):
        q, h = med(scenario, QUEICKD_SQLITE, label_q), med(scenario, HUEY, label_h)
        if q is not None and h:
            out.append(f"queickd sqlite/full vs huey: {what} {_fmt(q, '')} vs {_fmt(h, '')} = {q / h:.2f}x")
    return out


def to_json(res: Results, info: dict[str, Any], s: Settings, order: list[Scenario]) -> dict[str, Any]:
    return {
        "machine": info,
        "settings": {"rounds": s.rounds, "quick": s.quick, "enqueue_jobs": s.enqueue_jobs, "chunk": s.chunk,
                     "e2e_jobs": s.e2e_jobs, "latency_samples": s.latency_samples, "idle_warmup": s.idle_warmup,
                     "idle_seconds": s.idle_seconds, "crash_acks": s.crash_acks, "huey_venv": str(s.huey_venv),
                     "memory_sizes": s.memory_sizes, "queick_memory_max": s.queick_memory_max,
                     "huey_memory_max": s.huey_memory_max,
                     "raw_seconds": s.raw_seconds, "peer_venv": str(s.venv), "clients": s.clients,
                     "client_jobs": s.client_jobs, "slow_fsync_ms": s.slow_fsync_ms},
        "scenarios": [{"name": sc.name, "title": sc.title, "targets": sc.targets} for sc in order],
        "results": [
            {"scenario": m.scenario, "metric": m.label, "target": m.target, "unit": m.unit,
             "values": m.values, "median": m.median, "min": min(m.values) if m.values else None,
             "max": max(m.values) if m.values else None, "ratio_vs_peer": res.ratio(m),
             "peer": list(m.peer) if m.peer else None, "errors": m.errors, "rounds": m.rounds}
            for m in res.metrics.values()
        ],
        "goals": goal_lines(res),
        "notes": res.notes,
    }


