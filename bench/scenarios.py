"""The scenarios that measure enqueues, stored size and the machine's raw limits, and the
settings every scenario reads. Each run_* starts its target in a fresh temp dir, runs one
probe and adds its metrics to the results; it never prints the report.
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.peers import (
    HUEY,
    HUEY_VERSION,
    QUEICK,
    QUEICK_VERSION,
    QUEICKD_TARGETS,
    HueyConsumer,
    QueickServer,
    huey_table_counts,
    write_huey_app,
)
from bench.processes import (
    CACHE_DIR,
    LISTENING,
    PROBES,
    LineWaiter,
    QueickdDaemon,
    _clean_env,
    _kill_group,
    _reap,
    _spawn,
    log,
    proc_cpu,
    proc_mem,
    run_probe,
    sqlite_files,
)

if TYPE_CHECKING:
    from bench.report import Results

FAR_FUTURE = 10**7  # seconds: jobs that stay scheduled for the whole run


# --- scenarios -----------------------------------------------------------------------------------
@dataclass
class Settings:
    rounds: int
    quick: bool
    enqueue_jobs: int
    chunk: int
    memory_sizes: list[int]
    queick_memory_max: int
    raw_seconds: float
    tmp_root: Path
    venv: Path
    e2e_jobs: int = 5_000
    latency_samples: int = 100
    idle_warmup: float = 90.0
    idle_seconds: float = 30.0
    crash_acks: int = 2_000
    clients: int = 16  # many-clients: client processes
    client_jobs: int = 500  # many-clients: jobs per client
    slow_fsync_ms: float = 5.0  # sd-*: delay added to every fsync/fdatasync
    huey_venv: Path = CACHE_DIR / "huey-venv"
    # memory-* runs with more jobs leave huey out: its fill is one fsync'd commit per task and its
    # consumer then moves each task to its schedule table, 4-6 minutes per 100,000 here
    huey_memory_max: int = 100_000
    peer_python: Path | None = None
    peer_error: str | None = None
    huey_python: Path | None = None
    huey_error: str | None = None

    def peer(self) -> Path:
        if self.peer_python is None:
            raise RuntimeError(f"no Queick {QUEICK_VERSION} venv: {self.peer_error}")
        return self.peer_python

    def huey(self) -> Path:
        if self.huey_python is None:
            raise RuntimeError(f"no huey {HUEY_VERSION} venv: {self.huey_error}")
        return self.huey_python


def _fresh_dir(s: Settings, name: str) -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix=f"queickd-bench-{name}-", dir=s.tmp_root)


def _enqueue_metrics(res: Results, scenario: str, target: str, n: int, probe: dict[str, Any],
                     server_cpu: float | None) -> None:
    """server_cpu is None for huey: it has no server, and its consumer does not run while its
    enqueues are measured."""

    def peer(label: str) -> tuple[str, str, str] | None:
        return ("enqueue-single", QUEICK, label) if target not in (QUEICK, HUEY) else None

    res.add(scenario, "enqueue rate", target, "jobs/s", probe["rate"], higher_is_better=True,
            peer=peer("enqueue rate"), raw={**probe, "server_cpu_s": server_cpu})
    if server_cpu is not None:
        res.add(scenario, "server CPU per job", target, "µs", server_cpu / n * 1e6, higher_is_better=False,
                peer=peer("server CPU per job"))
    if "client_cpu_s" in probe:
        res.add(scenario, "client CPU per job", target, "µs", probe["client_cpu_s"] / n * 1e6,
                higher_is_better=False, peer=peer("client CPU per job"))


def run_enqueue(s: Settings, res: Results, scenario: str, target: str) -> None:
    n = s.enqueue_jobs
    timeout = 60.0 + n / 200  # far above the slowest expected rate, still bounded
    if target == QUEICK:
        peer_python = s.peer()
        with _fresh_dir(s, "queick") as d, QueickServer(s.venv, Path(d)) as srv:
            pids = srv.pids()
            cpu0 = sum(proc_cpu(p) for p in pids)
            probe = run_probe(peer_python, "queick-enqueue", "--n", str(n), cwd=Path(d), timeout=timeout)
            cpu = sum(proc_cpu(p) for p in srv.pids()) - cpu0
            probe["job_errors_logged"] = srv.job_errors()
        _enqueue_metrics(res, scenario, target, n, probe, cpu)
        return
    if target == HUEY:
        # No consumer: like queickd's --workers 0, nothing dequeues while enqueues are measured.
        huey_python = s.huey()
        with _fresh_dir(s, "huey") as d:
            write_huey_app(Path(d), huey_python)
            probe = run_probe(huey_python, "huey-enqueue", "--n", str(n), "--dir", d, cwd=Path(d), timeout=timeout)
        _enqueue_metrics(res, scenario, target, n, probe, None)
        return
    store, durability = QUEICKD_TARGETS[target]
    mode = scenario.removeprefix("enqueue-")
    with _fresh_dir(s, store) as d, QueickdDaemon(store, Path(d), workers=0, durability=durability) as daemon:
        cpu0 = proc_cpu(daemon.pid)
        probe = run_probe(sys.executable, "queickd-enqueue", "--port", str(daemon.port), "--mode", mode,
                          "--n", str(n), "--chunk", str(s.chunk), timeout=timeout)
        cpu = proc_cpu(daemon.pid) - cpu0
    _enqueue_metrics(res, scenario, target, n, probe, cpu)


def run_memory(s: Settings, res: Results, scenario: str, target: str, n: int) -> None:
    mib = 1024 * 1024

    def peer_of(label: str) -> tuple[str, str, str] | None:
        return (scenario, QUEICK, label) if target not in (QUEICK, HUEY) and n <= s.queick_memory_max else None

    if target == QUEICK:
        peer_python = s.peer()
        with _fresh_dir(s, "queick") as d, QueickServer(s.venv, Path(d)) as srv:
            before = {p: proc_mem(p) for p in srv.pids()}
            probe = run_probe(peer_python, "queick-fill", "--n", str(n), "--delay", str(FAR_FUTURE),
                              "--max-seconds", "900", cwd=Path(d), timeout=960.0)
            after = {p: proc_mem(p) for p in srv.pids()}
        rss0 = sum(v["VmRSS"] for v in before.values())
        rss1 = sum(v["VmRSS"] for v in after.values())
        hwm1 = sum(v["VmHWM"] for v in after.values())
        raw = {**probe, "before": before, "after": after, "processes": len(after)}
        store_per_job = None
    elif target == HUEY:
        rss0, rss1, hwm1, probe, raw = _huey_memory(s, res, scenario, n)
    else:
        with _fresh_dir(s, "sqlite") as d, QueickdDaemon("sqlite", Path(d), workers=4) as daemon:
            m0 = proc_mem(daemon.pid)
            probe = run_probe(sys.executable, "queickd-fill", "--port", str(daemon.port), "--n", str(n),
                              "--chunk", str(s.chunk), "--delay", str(FAR_FUTURE), timeout=120.0 + n / 1000)
            m1 = proc_mem(daemon.pid)
            files = daemon.store_bytes()
            stop_s = daemon.stop()
            files_stopped = daemon.store_bytes()
        rss0, rss1, hwm1 = m0["VmRSS"], m1["VmRSS"], m1["VmHWM"]
        store_per_job = (files["db"] + files["db-wal"]) / n
        raw = {**probe, "before": m0, "after": m1, "files": files, "files_after_stop": files_stopped,
               "stop_seconds": stop_s}
        res.add(scenario, "store (db+wal) per job", target, "bytes", store_per_job, higher_is_better=False)
        res.add(scenario, "store per job, after clean stop", target, "bytes", files_stopped["db"] / n,
                higher_is_better=False)
    res.add(scenario, "RSS before", target, "MiB", rss0 / mib, higher_is_better=False, peer=peer_of("RSS before"))
    res.add(scenario, "RSS after", target, "MiB", rss1 / mib, higher_is_better=False, peer=peer_of("RSS after"))
    res.add(scenario, "VmHWM after", target, "MiB", hwm1 / mib, higher_is_better=False,
            peer=peer_of("VmHWM after"))
    res.add(scenario, "RSS growth per job", target, "bytes", (rss1 - rss0) / n, higher_is_better=False,
            peer=peer_of("RSS growth per job"), raw=raw)
    res.add(scenario, "fill rate", target, "jobs/s", probe["rate"], higher_is_better=True,
            peer=peer_of("fill rate"))


def _wait_huey_scheduled(consumer: HueyConsumer, n: int, timeout: float) -> tuple[float, dict[str, int]]:
    """Wait until huey's consumer has moved all n far-future tasks from its queue table to its
    schedule table (a worker dequeues each, sees it is not due, and inserts it into
    `schedule`), logging progress about every 10 s. Returns (seconds waited, table counts)."""
    t0 = time.monotonic()
    next_report = t0 + 10.0
    while True:
        counts = huey_table_counts(consumer.db_path)
        if counts["task"] == 0 and counts["schedule"] >= n:
            return time.monotonic() - t0, counts
        now = time.monotonic()
        if now - t0 > timeout:
            raise TimeoutError(f"huey's consumer had not scheduled {n:,} tasks {timeout:.0f} s after the fill: "
                               f"{counts}")
        if consumer.proc is not None and consumer.proc.poll() is not None:
            raise RuntimeError(f"huey's consumer exited with {consumer.proc.returncode}:\n"
                               f"{consumer.out.tail() if consumer.out else ''}")
        if now > next_report:
            log(f"  huey consumer: {counts['schedule']:,} of {n:,} tasks in its schedule table")
            next_report = now + 10.0
        time.sleep(0.5)


def _huey_memory(s: Settings, res: Results, scenario: str, n: int) -> tuple[int, int, int, dict[str, Any],
                                                                              dict[str, Any]]:
    """huey's part of run_memory: its consumer runs (-w 4 -k thread); a client process calls
    noop.schedule(delay=FAR_FUTURE) n times; once the consumer has moved them all into its
    schedule table, the consumer's RSS and the SQLite files are measured, then again after a
    graceful stop. Adds the store rows; returns (RSS before, RSS after, VmHWM after, probe, raw)."""
    huey_python = s.huey()
    fill_max = 120.0 + n / 100  # one fsync'd commit per task; 100 tasks/s is far below anything seen
    with _fresh_dir(s, "huey") as d, HueyConsumer(s.huey_venv, Path(d)) as consumer:
        before = {p: proc_mem(p) for p in consumer.pids()}
        probe = run_probe(huey_python, "huey-fill", "--n", str(n), "--delay", str(FAR_FUTURE), "--dir", d,
                          "--max-seconds", str(fill_max), cwd=Path(d), timeout=fill_max + 60.0, progress=True)
        right_after_fill = {p: proc_mem(p) for p in consumer.pids()}
        drain_s, counts = _wait_huey_scheduled(consumer, n, timeout=120.0 + n / 100)
        after = {p: proc_mem(p) for p in consumer.pids()}
        files = sqlite_files(consumer.db_path)
        with contextlib.closing(sqlite3.connect(consumer.db_path, timeout=10.0)) as c:
            pages = {k: c.execute(f"PRAGMA {k}").fetchone()[0] for k in ("page_size", "page_count", "freelist_count")}
        stop_s = consumer.stop()
        files_stopped = sqlite_files(consumer.db_path)
    if counts["schedule"] != n:
        raise RuntimeError(f"{counts['schedule']:,} tasks in huey's schedule table for {n:,} scheduled")
    store_per_job = (files["db"] + files["db-wal"]) / n
    res.add(scenario, "store (db+wal) per job", HUEY, "bytes", store_per_job, higher_is_better=False)
    res.add(scenario, "store per job, after clean stop", HUEY, "bytes",
            (files_stopped["db"] + files_stopped["db-wal"]) / n, higher_is_better=False)
    res.add(scenario, "consumer scheduling after the fill", HUEY, "s", drain_s, higher_is_better=False)
    raw = {**probe, "before": before, "right_after_fill": right_after_fill, "after": after,
           "processes": len(after), "counts": counts, "files": files, "pages": pages,
           "files_after_stop": files_stopped, "stop_seconds": stop_s, "scheduling_seconds": drain_s}
    return (sum(v["VmRSS"] for v in before.values()), sum(v["VmRSS"] for v in after.values()),
            sum(v["VmHWM"] for v in after.values()), probe, raw)


RAW_SQLITE = {
    "WAL sync=FULL, 1 row/commit": ("FULL", 1),
    "WAL sync=FULL, 100 rows/commit": ("FULL", 100),
    "WAL sync=NORMAL, 1 row/commit": ("NORMAL", 1),
    "WAL sync=NORMAL, 100 rows/commit": ("NORMAL", 100),
}
RAW_TCP = "loopback, 1 connection"
RAW_LONE = "WAL sync=FULL, 1 row, 50 ms apart"
RAW_LONE_TCP = "loopback, 2 processes, 50 ms apart"


def run_raw_sqlite(s: Settings, res: Results, scenario: str, target: str) -> None:
    sync, rows = RAW_SQLITE[target]
    with _fresh_dir(s, "sqlite-raw") as d:
        probe = run_probe(sys.executable, "sqlite-commits", "--dir", d, "--sync", sync, "--rows", str(rows),
                          "--seconds", str(s.raw_seconds), timeout=60.0 + s.raw_seconds)
    res.add(scenario, "commits/s", target, "commits/s", probe["rate"], higher_is_better=True, raw=probe)
    if rows > 1:
        res.add(scenario, "rows/s", target, "rows/s", probe["rows_per_s"], higher_is_better=True)


def run_raw_lone(s: Settings, res: Results, scenario: str, target: str) -> None:
    with _fresh_dir(s, "sqlite-lone") as d:
        probe = run_probe(sys.executable, "sqlite-lone-commits", "--dir", d, "--sync", "FULL",
                          "--n", str(s.latency_samples), "--interval", "0.05", timeout=60.0 + s.latency_samples)
    for key in ("p50", "p90", "p99"):
        res.add(scenario, f"lone commit {key}", target, "ms", probe[f"{key}_ms"], higher_is_better=False,
                raw=probe if key == "p50" else None)


def against_echo_server(*args: str, timeout: float) -> dict[str, Any]:
    """Run a probe against a fresh loopback echo server process."""
    server = _spawn([sys.executable, str(PROBES), "tcp-echo-server", "--max-seconds", str(30 + timeout)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_clean_env())
    try:
        port = int(LineWaiter(server).wait_for(LISTENING, timeout=20.0).group(2))
        return run_probe(sys.executable, args[0], "--port", str(port), *args[1:], timeout=timeout)
    finally:
        _kill_group(server)
        _reap(server)


def run_raw_tcp(s: Settings, res: Results, scenario: str, target: str) -> None:
    probe = against_echo_server("tcp-rtt", "--seconds", str(s.raw_seconds), timeout=60.0 + s.raw_seconds)
    res.add(scenario, "round trips/s", target, "trips/s", probe["rate"], higher_is_better=True, raw=probe)


def run_raw_lone_tcp(s: Settings, res: Results, scenario: str, target: str) -> None:
    probe = against_echo_server("tcp-lone-rtt", "--n", str(s.latency_samples), "--interval", "0.05",
                                 timeout=60.0 + s.latency_samples)
    for key in ("p50", "p90", "p99"):
        res.add(scenario, f"lone round trip {key}", target, "ms", probe[f"{key}_ms"], higher_is_better=False,
                raw=probe if key == "p50" else None)


