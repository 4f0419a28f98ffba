"""bench.pg's scenarios: enqueue (one and a batch per request), end to end, idle and kill -9
of the workers; each run records its metrics into the results. Reports nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.pgserve import (
    fresh,
    run_probe,
    serve,
)
from bench.pgsetup import (
    APP_CPU,
    APP_ENQUEUE,
    APP_INSERT,
    APP_ROW,
    APP_ROW_JOB,
    APP_WALL,
    CRASH_JOB_SECONDS,
    JOB_ROWS,
    ONE_ROW,
    PEERS,
    PROBES,
    QUEICKD_DIRECT,
    QUEICKD_ENQUEUE,
    RAW_LOOPBACK,
    RAW_ROWS,
    Settings,
    queickd_target,
)
from bench.processes import (
    BENCH_DIR,
    _clean_env,
    _kill_group,
    _reap,
    _spawn,
)
from bench.report import Results
from bench.scenarios import against_echo_server


# --- scenarios ----------------------------------------------------------------------------------------
def run_enqueue(s: Settings, res: Results, scenario: str, target: str) -> None:
    """N no-op jobs from one client process, nothing consuming them: one job per request
    (single) or s.chunk per request (batch). Each request is acknowledged after its commit."""
    mode = scenario.removeprefix("enqueue-")
    n = s.enqueue_jobs
    with fresh(s, "enqueue") as (db, d), serve(s, target, db, d, with_workers=False) as srv:
        cpu0, be0, wal0 = sum(srv.cpu().values()), _cpu_of(db.backends()), db.wal_bytes()
        probe = srv.probe("enqueue", "--mode", mode, "--n", str(n), "--chunk", str(s.chunk),
                          timeout=60.0 + n / 50)
        server_cpu, be1, wal1 = sum(srv.cpu().values()) - cpu0, _cpu_of(db.backends()), db.wal_bytes()
        srv.check_alive()
    if srv.client:  # queickd.pg: the daemon is up (it set the schema up) but out of the way
        server_cpu = 0.0
    if srv.system == "queickd" and not srv.client:  # a probe's client connects after be0, leaves before be1
        res.add(scenario, "CPU per job, its server backends", target, "µs",
                sum(be1[p] - be0.get(p, 0.0) for p in be1) / n * 1e6, higher_is_better=False)  # the daemon connects on its first request
    elif probe.get("backend_cpu_s") is not None:  # the probe read its own connection's backend
        res.add(scenario, "CPU per job, its server backends", target, "µs", probe["backend_cpu_s"] / n * 1e6,
                higher_is_better=False)
    res.add(scenario, "enqueue rate", target, "jobs/s", probe["rate"], higher_is_better=True,
            raw={**probe, "server_cpu_s": server_cpu})
    res.add(scenario, "client+daemon CPU per job", target, "µs", (probe["client_cpu_s"] + server_cpu) / n * 1e6,
            higher_is_better=False)
    res.add(scenario, "WAL written per job", target, "bytes", (wal1 - wal0) / n, higher_is_better=False)


def run_raw(s: Settings, res: Results, scenario: str, target: str) -> None:
    """The floors under the enqueue rows, from the same run: bare rows inserted one and
    s.chunk per autocommit statement (what a client writing to the database itself pays at
    the least), a minimal row of queickd's own jobs table one per statement (what any
    enqueue into that table pays: its width and indexes, no rule), and one loopback round
    trip between two processes (what a client talking to a daemon pays on top, one per
    request)."""
    if target == RAW_LOOPBACK:
        probe = against_echo_server("tcp-rtt", "--seconds", "3", timeout=60.0)
        res.add(scenario, "round trip", target, "µs", 1e6 / probe["rate"], higher_is_better=False, raw=probe)
        return
    n = s.enqueue_jobs
    env = {**_clean_env(), "PYTHONPATH": str(BENCH_DIR)}
    for mode, label in (("single", ONE_ROW), ("batch", f"rows/s, {s.chunk} per statement")):
        with fresh(s, "raw") as (db, d):
            probe = run_probe(sys.executable, "raw-enqueue", ["--dsn", db.dsn, "--mode", mode, "--n", str(n),
                                                              "--chunk", str(s.chunk)], d, env, 60.0 + n / 50)
        res.add(scenario, label, target, "rows/s", probe["rate"], higher_is_better=True, raw=probe)
        if mode == "single":  # a batch's few statements take less than the 10 ms /proc counts in
            res.add(scenario, "server CPU per row, one per statement", target, "µs",
                    probe["backend_cpu_s"] / n * 1e6, higher_is_better=False)
    with fresh(s, "jobrow") as (db, d):
        subprocess.run([sys.executable, "-m", "queickd", "db", "migrate", "--store", db.dsn], check=True,
                       capture_output=True, timeout=120)
        probe = run_probe(sys.executable, "jobrow-enqueue", ["--dsn", db.dsn, "--mode", "single", "--n", str(n)],
                          d, env, 60.0 + n / 50)
    res.add(scenario, JOB_ROWS, target, "rows/s", probe["rate"], higher_is_better=True, raw=probe)
    res.add(scenario, "server CPU per row of the jobs table", target, "µs", probe["backend_cpu_s"] / n * 1e6,
            higher_is_better=False)


def run_app_tx(s: Settings, res: Results, scenario: str, target: str) -> None:
    """N application transactions from one psycopg connection, each inserting the app's own
    row (an order) and, for APP_ROW_JOB, enqueueing a job beside it with queickd.pg, then
    committing; on a schema a queickd daemon migrated. What the enqueue adds is the
    difference of the two targets."""
    n = s.enqueue_jobs
    with fresh(s, "apptx") as (db, d), serve(s, target, db, d, with_workers=False) as srv:
        probe = srv.probe("enqueue", "--mode", "single", "--n", str(n), timeout=60.0 + n / 50)
        srv.check_alive()
    server = probe["backend_cpu_s"]
    res.add(scenario, "transactions/s", target, "xacts/s", probe["rate"], higher_is_better=True, raw=probe)
    res.add(scenario, APP_WALL, target, "µs", probe["seconds"] / n * 1e6, higher_is_better=False)
    res.add(scenario, APP_CPU, target, "µs", (probe["client_cpu_s"] + server) / n * 1e6, higher_is_better=False)
    res.add(scenario, "server CPU per transaction", target, "µs", server / n * 1e6, higher_is_better=False)
    res.add(scenario, APP_INSERT, target, "µs", probe["insert_s"] / n * 1e6, higher_is_better=False)
    if target == APP_ROW_JOB:
        res.add(scenario, APP_ENQUEUE, target, "µs", probe["enqueue_s"] / n * 1e6, higher_is_better=False)


def run_e2e(s: Settings, res: Results, scenario: str, target: str) -> None:
    """N jobs that each append one byte, enqueued in batches of s.chunk while the workers run;
    timed from the first enqueue until every job ran and no job is unfinished in the
    database. The file must hold exactly N bytes."""
    n = s.e2e_jobs
    with fresh(s, "e2e") as (db, d):
        with serve(s, target, db, d, with_workers=True) as srv:
            # tx0 may lack the warm-up's last transactions (reported later, in the window):
            # a handful, against thousands of jobs.
            cpu0, tx0, be0, wal0 = srv.cpu(), db.transactions(), _cpu_of(db.backends()), db.wal_bytes()
            probe = srv.probe("e2e", "--n", str(n), "--chunk", str(s.chunk), "--max-seconds", str(60 + n / 20),
                              timeout=90.0 + n / 20)
            cpu1, be1, wal1 = srv.cpu(), _cpu_of(db.backends()), db.wal_bytes()
            srv.check_alive()
        tx1 = db.transactions_once_gone()
    if probe["final_bytes"] != n:
        raise RuntimeError(f"{probe['final_bytes']} bytes for {n} jobs: some job ran twice")
    target_cpu = sum(cpu1[p] - cpu0[p] for p in set(cpu0) & set(cpu1))
    be_cpu = sum(be1[p] - be0[p] for p in set(be0) & set(be1))
    res.add(scenario, "jobs/s", target, "jobs/s", probe["rate"], higher_is_better=True,
            raw={**probe, "target_cpu_s": target_cpu, "backend_cpu_s": be_cpu, "transactions": tx1 - tx0})
    res.add(scenario, "CPU per job, client + target", target, "µs", (probe["client_cpu_s"] + target_cpu) / n * 1e6,
            higher_is_better=False)
    res.add(scenario, "CPU per job, its server backends", target, "µs", be_cpu / n * 1e6, higher_is_better=False)
    res.add(scenario, "transactions per job", target, "xacts", (tx1 - tx0) / n, higher_is_better=False)
    res.add(scenario, "WAL written per job", target, "bytes", (wal1 - wal0) / n, higher_is_better=False)


def run_idle(s: Settings, res: Results, scenario: str, target: str) -> None:
    """An empty queue with its workers up: after a warm-up, the transactions committed or
    rolled back in the run's database (pg_stat_database) and the CPU of the target's
    processes and of their server backends, per minute."""
    with fresh(s, "idle") as (db, d), serve(s, target, db, d, with_workers=True) as srv:
        time.sleep(s.idle_warmup)
        backends0 = db.backends()
        tx0, cpu0, be0, t0 = db.transactions(), srv.cpu(), _cpu_of(backends0), time.monotonic()
        time.sleep(s.idle_seconds)
        tx1, cpu1, t1 = db.transactions(), srv.cpu(), time.monotonic()
        backends1 = db.backends()
        be1 = _cpu_of(backends1)
        srv.check_alive()
    per_min = 60.0 / (t1 - t0)
    cpu = sum(cpu1[p] - cpu0[p] for p in set(cpu0) & set(cpu1))
    be_cpu = sum(be1[p] - be0[p] for p in set(be0) & set(be1))
    raw = {"warmup_s": s.idle_warmup, "measured_s": t1 - t0, "transactions": tx1 - tx0, "cpu_s": cpu,
           "backend_cpu_s": be_cpu, "backends_before": backends0, "backends_after": backends1}
    res.add(scenario, "transactions", target, "/min", (tx1 - tx0) * per_min, higher_is_better=False, raw=raw)
    res.add(scenario, "CPU, target processes", target, "ms/min", cpu * 1000 * per_min, higher_is_better=False)
    res.add(scenario, "CPU, its server backends", target, "ms/min", be_cpu * 1000 * per_min,
            higher_is_better=False)
    res.add(scenario, "connections", target, "", len(backends1), higher_is_better=False)


def _cpu_of(pids: list[int]) -> dict[int, float]:
    """CPU seconds of these processes (server backends, which are no group of ours)."""
    from bench.processes import proc_cpu

    return {p: proc_cpu(p) for p in pids if os.path.exists(f"/proc/{p}")}


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except FileNotFoundError:
        return []


def run_crash(s: Settings, res: Results, scenario: str, target: str) -> None:
    """A client enqueues jobs that work 50 ms, then append their token to tokens.out, one at
    a time, and logs each ack while the workers run; after s.crash_acks acks every worker
    process gets SIGKILL (queickd's daemon, which only takes requests, lives on) and the
    client stops; the workers restart at once and the bench waits until every acknowledged
    token ran, or nothing is unfinished and the output stopped growing for 3 s, bounded by
    s.crash_recovery_max after the kill."""
    with fresh(s, "crash") as (db, d), serve(s, target, db, d, with_workers=True) as srv:
        acked_file, out_file = d / "acked.txt", d / "tokens.out"
        client = _spawn([str(srv.python), str(PROBES), f"{srv.system}-crash-client", "--dsn", db.dsn, "--port",
                         str(srv.port), "--dir", str(d), "--n", "1000000", "--max-seconds", "300",
                         "--job-seconds", str(CRASH_JOB_SECONDS)],
                        cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=srv.env)
        try:
            deadline = time.monotonic() + 240.0
            while len(_lines(acked_file)) < s.crash_acks:
                if client.poll() is not None:
                    raise RuntimeError(f"crash client exited early:\n{client.communicate()[1][-2000:]}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"fewer than {s.crash_acks} acks in 240 s")
                time.sleep(0.005)
            srv.kill_workers()
            t_kill = time.monotonic()
            ran_at_kill = len(_lines(out_file))
            (d / "stop").touch()
            out, err = client.communicate(timeout=60.0)
        finally:
            _kill_group(client)
            _reap(client)
        if client.returncode != 0:
            raise RuntimeError(f"crash client failed with {client.returncode}:\n{err[-2000:]}")
        srv.start_workers(warm_up=False)  # at once, on the same database
        t_up = time.monotonic()
        want = set(_lines(acked_file))
        deadline, last, stable_since = t_kill + s.crash_recovery_max, -1, time.monotonic()
        while True:
            ran = _lines(out_file)
            if want <= set(ran):
                break
            if len(ran) != last:
                last, stable_since = len(ran), time.monotonic()
            elif time.monotonic() - stable_since > 3.0 and srv.probe("unfinished", timeout=60.0)["unfinished"] == 0:
                break
            if time.monotonic() > deadline:
                break  # counted below as never ran: the peer's recovery did not come in time
            time.sleep(0.05)
        drained = time.monotonic() - t_kill
        end = srv.probe("unfinished", timeout=60.0)
        ran = _lines(out_file)  # again: jobs may have finished while the probe started
        left = end["unfinished"]
        srv.check_alive()
    counts: dict[str, int] = {}
    for tok in ran:
        counts[tok] = counts.get(tok, 0) + 1
    lost = sorted(want - set(counts))
    dup = [t for t, c in counts.items() if c > 1]
    raw = {"acked": len(want), "ran_at_kill": ran_at_kill, "lines_run": len(ran), "lost": len(lost),
           "lost_sample": lost[:20], "run_twice_or_more": len(dup), "dup_sample": dup[:20],
           "kill_to_all_ran_s": drained, "kill_to_restart_s": t_up - t_kill, "unfinished_at_end": left,
           "states_at_end": end["states"],
           "gave_up": not want <= set(ran) and drained > s.crash_recovery_max}
    res.add(scenario, "acknowledged", target, "jobs", len(want), higher_is_better=True, raw=raw)
    res.add(scenario, "acknowledged, never ran", target, "jobs", len(lost), higher_is_better=False)
    res.add(scenario, "ran more than once", target, "jobs", len(dup), higher_is_better=False)
    res.add(scenario, "kill to all ran", target, "s", drained, higher_is_better=False)
    if lost:
        res.notes.append(f"crash, {target}: {len(lost)} acknowledged job(s) had not run {drained:.0f} s after "
                         f"the kill; {left} unfinished in its tables at the end ({end['states']})")


@dataclass
class Scenario:
    name: str
    title: str
    targets: list[str]
    run: Callable[[Settings, Results, str, str], None]


def scenarios(s: Settings) -> list[Scenario]:
    fleet = [queickd_target(k) for k in s.worker_procs] + list(PEERS)
    enq = [QUEICKD_ENQUEUE, QUEICKD_DIRECT, *PEERS]
    return [
        Scenario("enqueue-single", f"enqueue {s.enqueue_jobs:,} no-ops, one per request", enq, run_enqueue),
        Scenario("enqueue-batch", f"enqueue {s.enqueue_jobs:,} no-ops, {s.chunk} per request", enq, run_enqueue),
        Scenario("raw", "the floors: bare rows, a loopback round trip", [RAW_ROWS, RAW_LOOPBACK], run_raw),
        Scenario("app-tx", f"{s.enqueue_jobs:,} app transactions: INSERT its row (+ queickd.pg.enqueue), COMMIT",
                 [APP_ROW, APP_ROW_JOB], run_app_tx),
        Scenario("e2e", f"end to end, {s.e2e_jobs:,} one-byte jobs, {s.concurrency} slots", fleet, run_e2e),
        Scenario("idle", f"idle, {s.idle_seconds:g} s after {s.idle_warmup:g} s warm-up", fleet, run_idle),
        Scenario("crash", f"kill -9 of the workers after {s.crash_acks:,} acks",
                 [queickd_target(1), *PEERS], run_crash),
    ]


def select(all_scenarios: list[Scenario], only: str | None) -> list[Scenario]:
    """--only takes names or prefixes, comma-separated: 'enqueue', 'e2e,idle'."""
    if not only:
        return all_scenarios
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    unknown = [w for w in wanted if not any(sc.name.startswith(w) for sc in all_scenarios)]
    if unknown:
        names = ", ".join(sc.name for sc in all_scenarios)
        raise SystemExit(f"bench.pg: unknown scenario(s) {', '.join(unknown)}; choose from: {names}")
    return [sc for sc in all_scenarios if any(sc.name.startswith(w) for w in wanted)]
