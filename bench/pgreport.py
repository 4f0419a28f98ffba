"""bench.pg's report: the table with each queickd row's ratio to the peers, the machine's
header, and the notes on what each scenario measures. Runs nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from bench.goals import pg_goal_lines
from bench.pgscenarios import (
    Scenario,
)
from bench.pgsetup import (
    CRASH_JOB_SECONDS,
    PGQUEUER,
    PGQUEUER_PINS,
    PROCRASTINATE,
    PROCRASTINATE_PINS,
    Settings,
    _queickd_env,
    server_version,
)
from bench.report import Results, _fmt, _fs_type, host_info


# --- report -------------------------------------------------------------------------------------------
def _ratio(res: Results, m: Any, peer: str) -> str:
    if not m.target.startswith("queickd") or m.median is None:
        return ""
    p = res.metrics.get((m.scenario, peer, m.label))
    if p is None or p.median is None:
        return "-"
    if not p.median:
        return "0=0" if not m.median else "n/a"  # zero beside zero: no ratio to show
    return f"{m.median / p.median:,.2f}x"


def render(res: Results, order: list[Scenario], info: dict[str, Any], s: Settings,
           skipped: dict[tuple[str, str], str]) -> str:
    lines = [
        f"queickd {info['queickd']} ({info['queickd_path']}) vs {PGQUEUER} and {PROCRASTINATE} on PostgreSQL "
        f"{info['postgres']} ({s.admin_url.rpartition('/')[0]}): {s.rounds} round(s){' (--quick)' if s.quick else ''}; "
        f"{info['nproc']} CPUs, Python {info['python']}, temp dirs on {info['tmp_fs']}",
        f"{s.concurrency} job slots per target: queickd k worker processes share them, the peers run "
        f"{s.peer_processes} worker process(es). Ratios = queickd median / peer median (rates: >1 is faster; "
        "CPU, transactions, time, counts: <1 is less).",
        "",
    ]
    head = ("scenario", "metric", "target", "median", "min–max", "unit", "vs pgqueuer", "vs procrast.")
    rows: list[tuple[str, ...]] = []
    for sc in order:
        labels: list[str] = []
        for m in res.metrics.values():
            if m.scenario == sc.name and m.label not in labels and m.label != "error":
                labels.append(m.label)
        for label in labels:
            for target in sc.targets:
                m = res.metrics.get((sc.name, target, label))
                if m is None or not m.values:
                    continue
                span = f"{_fmt(min(m.values), m.unit)}–{_fmt(max(m.values), m.unit)}"
                rows.append((sc.title, label, target, _fmt(m.median, m.unit), span, m.unit,
                             _ratio(res, m, PGQUEUER), _ratio(res, m, PROCRASTINATE)))
        for target in sc.targets:
            if (sc.name, target) in skipped:
                rows.append((sc.title, "SKIPPED", target, "", "", "", skipped[(sc.name, target)], ""))
                continue
            m = res.metrics.get((sc.name, target, "error"))
            for e in m.errors if m is not None else []:
                first = e.strip().splitlines()[0] if e.strip() else "error"
                rows.append((sc.title, "FAILED", target, "", "", "", first, ""))
        rows.append(())
    widths = [max([len(h)] + [len(r[i]) for r in rows if r and r[1] not in ("FAILED", "SKIPPED")])
              for i, h in enumerate(head)]
    right = {3, 4, 6, 7}

    def fmt_row(r: tuple[str, ...]) -> str:
        if r[1] in ("FAILED", "SKIPPED"):
            return f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[6]}"
        return "  ".join(f"{c:>{w}}" if i in right else f"{c:<{w}}" for i, (c, w) in enumerate(zip(r, widths, strict=True)))

    lines += [fmt_row(head), "-" * (sum(widths) + 2 * (len(widths) - 1))]
    prev = None
    for r in rows:
        if not r:
            lines.append("")
            prev = None
            continue
        lines.append(fmt_row(r if r[0] != prev else ("",) + r[1:]).rstrip())
        prev = r[0]
    goals = pg_goal_lines(res)
    if goals:
        lines += ["", "goals (ratios of medians of this run):"] + [f"  {g}" for g in goals]
    if res.notes:
        lines += ["notes:"] + [f"  - {n}" for n in res.notes]
    return "\n".join(lines)


def machine_info(s: Settings) -> dict[str, Any]:
    try:
        qv = subprocess.run([sys.executable, "-c", "import queickd; print(queickd.__version__)"], capture_output=True,
                            text=True, timeout=60, cwd=s.tmp_root, env=_queickd_env(s.queickd_path)).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        qv = "?"
    try:
        pg = server_version(s.admin_url)
    except Exception as e:  # reported; every run will fail with the same reason
        pg = f"unreachable ({type(e).__name__}: {e})"
    return {**host_info(), "queickd": qv,
            "queickd_path": str(s.queickd_path), "postgres": pg, "pgqueuer": PGQUEUER_PINS,
            "procrastinate": PROCRASTINATE_PINS, "tmp_fs": _fs_type(s.tmp_root), "loadavg_start": os.getloadavg()}


def notes(s: Settings, names: set[str]) -> list[str]:
    out = ["Every system acknowledges an enqueue only after PostgreSQL committed it (synchronous_commit as the "
           "server has it), and all three re-run a job whose worker died: queickd after 3 missed 10 s heartbeats, "
           "pgqueuer when a picked job's heartbeat is 30 s old, procrastinate through its documented "
           "retry-stalled-jobs periodic task (every 30 s here, 30 s heartbeat window; see procrastinate_app.py)."]
    if names & {"enqueue-single", "enqueue-batch"}:
        out.append("enqueue: nothing consumes the jobs. queickd's client talks to the daemon (--workers 0), which "
                   "writes to PostgreSQL; the peers' clients write to PostgreSQL themselves (pgqueuer: Queries.enqueue "
                   "on one asyncpg connection; procrastinate: defer_async / batch_defer_async on its psycopg pool). "
                   "queickd pg (direct) writes past the daemon with queickd.pg on one psycopg connection: enqueue in "
                   "autocommit (one transaction a job), enqueue_many in a transaction a chunk; its daemon is up (it "
                   "migrated the schema and published the rules) and not counted. CPU is the client's plus the "
                   "daemon's (the peers and the direct client have none). Server backends' CPU: the daemon's "
                   "connections, or the backend of a client's own single connection, read by the probe (not "
                   "procrastinate's pool).")
    if "app-tx" in names:
        out.append("app-tx: one psycopg connection, per transaction BEGIN, INSERT the app's row (RETURNING id), with "
                   "the job target queickd.pg.enqueue(conn, noop, args=[id]), COMMIT; on a schema a queickd daemon "
                   "migrated. What the enqueue adds = the median with the job less the median without; CPU is the "
                   "client's and its backend's. The statements alone are timed by the client around each call.")
    if "e2e" in names:
        out.append(f"e2e: jobs append one byte to a file (a no-op with a trace); the clock stops when the file holds N "
                   f"bytes and the system's own tables show no unfinished job (queickd: stats; pgqueuer: rows left in "
                   f"its queue table; procrastinate: todo/doing rows). Enqueued in batches of {s.chunk} while the "
                   "workers run. pgqueuer runs with --max-concurrent-tasks = slots, --batch-size = slots/2 (its rule: "
                   "the cap must be at least twice the batch); procrastinate with --concurrency = slots. Transactions "
                   "per job: commits + rollbacks in pg_stat_database over the run.")
    if names & {"enqueue-single", "enqueue-batch", "e2e"}:
        out.append("WAL written per job: the server's WAL insert position before and after the measured part "
                   "(pg_current_wal_insert_lsn), over the jobs: what the job path costs the disk and any replica. "
                   "It is the whole server's; nothing else works meanwhile, but a checkpoint inside the window adds "
                   "the full-page images of the pages touched first after it.")
    if "idle" in names:
        out.append("idle: pg_stat_database counts transactions (a statement in autocommit is one), not statements "
                   "(pg_stat_statements needs a server restart to load). Backends report their counts at most every "
                   "second and idle ones within ~10 s, so the window's edges blur by that much. CPU: utime+stime from "
                   "/proc of the target's process groups, and of the server backends connected to the run's "
                   "database, in 10 ms ticks. queickd's sweep (60 s) and procrastinate's retry-stalled task are "
                   "included when they fall inside the window.")
    if "crash" in names:
        out.append(f"crash: jobs work {CRASH_JOB_SECONDS * 1000:g} ms (queickd: time.sleep in a worker thread; the "
                   "peers: asyncio.sleep on their loop), then append their token, so jobs are running at the kill. "
                   "kill -9 of every worker process group (queickd's daemon only takes requests and stays up; "
                   "the peers' clients write to PostgreSQL themselves), then the workers restart on the same database. "
                   "'kill to all ran' (the workers restart at once) is bounded by each system's recovery window for "
                   f"jobs a dead worker held, and by --crash-recovery-max ({s.crash_recovery_max:g} s).")
    return out
