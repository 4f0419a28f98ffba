"""queickd against the original Queick 1.2.1 and huey 3.5.4 (SqliteHuey): enqueue rate,
memory and disk per queued job, end-to-end rate, enqueue->start latency, idle cost and
kill -9 recovery, and the machine's raw limits for context.

    python -m bench.run                    # 3 rounds of everything (the 1M-job run takes minutes)
    python -m bench.run --quick            # a fast smoke run: fewer jobs, one round, no 1M run
    python -m bench.run --only enqueue-single,raw --json results.json
    python bench/run.py --help

The peer: Queick 1.2.1 (PyPI `queick==1.2.1`, stdlib only, in-memory) cannot be installed
next to queickd, because both install a console script named `queick`. So it lives in a
virtualenv of its own, which this script creates on first use and reuses afterwards:

    python3 -m venv VENV && VENV/bin/pip install queick==1.2.1

VENV is --peer-venv, else $BENCH_QUEICK_VENV, else bench/.bench-cache/queick-venv (ignored
by git). An existing venv is reused when its `queick` package reports version 1.2.1. The
Queick server is started as VENV/bin/queick (an absolute path, never via PATH) and its
client runs under VENV/bin/python; queickd runs as `python -m queickd` under this Python.
huey 3.5.4 gets its own virtualenv the same way (--huey-venv, else $BENCH_HUEY_VENV, else
bench/.bench-cache/huey-venv); see HueyConsumer.

Every target runs in a fresh process with a fresh temp data dir; targets alternate
(A B C A B C ...) over the rounds. Only loopback addresses are used. Every process this
script starts is in its own process group and is killed at the end, even on error.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if not __package__:  # run as `python bench/run.py`: the bench package sits one level up
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.manyclients import run_many_clients, run_slowed
from bench.peers import (
    HUEY,
    HUEY_VERSION,
    QUEICK,
    QUEICKD_MEMORY,
    QUEICKD_NORMAL,
    QUEICKD_SQLITE,
    ensure_huey_venv,
    ensure_peer_venv,
)
from bench.processes import CACHE_DIR, compile_sources, default_queickd_path, kill_all, log
from bench.report import Results, machine_info, render, to_json
from bench.running import run_crash, run_e2e, run_idle, run_latency
from bench.scenarios import (
    RAW_LONE,
    RAW_LONE_TCP,
    RAW_SQLITE,
    RAW_TCP,
    Settings,
    run_enqueue,
    run_memory,
    run_raw_lone,
    run_raw_lone_tcp,
    run_raw_sqlite,
    run_raw_tcp,
)


@dataclass
class Scenario:
    name: str
    title: str
    targets: list[str]
    run: Callable[[Settings, Results, str, str], None]
    needs_peer: bool = False
    needs_huey: bool = False


def scenarios(s: Settings) -> list[Scenario]:
    out = [
        Scenario("enqueue-single", "enqueue, one request at a time",
                 [QUEICKD_SQLITE, QUEICKD_NORMAL, QUEICKD_MEMORY, QUEICK, HUEY],
                 run_enqueue, needs_peer=True, needs_huey=True),
        Scenario("enqueue-pipelined", f"enqueue_pipelined, chunks of {s.chunk}", [QUEICKD_SQLITE, QUEICKD_MEMORY],
                 run_enqueue),
        Scenario("enqueue-many", f"enqueue_many, chunks of {s.chunk}", [QUEICKD_SQLITE, QUEICKD_MEMORY],
                 run_enqueue),
    ]
    for n in s.memory_sizes:
        name = f"memory-{n // 1000}k" if n < 1_000_000 else f"memory-{n // 1_000_000}m"
        targets = [QUEICKD_SQLITE] + ([QUEICK] if n <= s.queick_memory_max else []) + \
            ([HUEY] if n <= s.huey_memory_max else [])

        def run(st: Settings, res: Results, scenario: str, target: str, n: int = n) -> None:
            run_memory(st, res, scenario, target, n)

        out.append(Scenario(name, f"memory/disk, {n:,} far-future jobs", targets, run,
                            needs_peer=QUEICK in targets, needs_huey=HUEY in targets))
    all4 = [QUEICKD_SQLITE, QUEICKD_MEMORY, QUEICK, HUEY]
    out += [
        Scenario("e2e", f"end to end, {s.e2e_jobs:,} append-byte jobs, one enqueue each, 4 workers", all4,
                 run_e2e, needs_peer=True, needs_huey=True),
        Scenario("e2e-many", f"end to end, {s.e2e_jobs:,} jobs, batched: enqueue_many x{s.chunk}, 4 workers",
                 [QUEICKD_SQLITE, QUEICKD_MEMORY], run_e2e_many),
        Scenario("many-clients", f"{s.clients} clients x {s.client_jobs} jobs, one request at a time, 4 workers",
                 all4, run_many_workers, needs_peer=True, needs_huey=True),
        Scenario("many-clients-enqueue", f"{s.clients} clients x {s.client_jobs} jobs, one request at a time, "
                 "--workers 0 (enqueue only)", [QUEICKD_SQLITE, QUEICKD_MEMORY, HUEY], run_many_enqueue,
                 needs_huey=True),
        Scenario("latency", f"enqueue→start, {s.latency_samples} single jobs 50 ms apart",
                 [QUEICKD_SQLITE, QUEICKD_NORMAL, QUEICKD_MEMORY, QUEICK, HUEY], run_latency,
                 needs_peer=True, needs_huey=True),
        Scenario("idle", f"idle, {s.idle_seconds:g} s after {s.idle_warmup:g} s warm-up",
                 [QUEICKD_SQLITE, QUEICK, HUEY], run_idle, needs_peer=True, needs_huey=True),
        Scenario("crash", f"kill -9 after {s.crash_acks:,} acks, restart", [QUEICKD_SQLITE, QUEICK, HUEY],
                 run_crash, needs_peer=True, needs_huey=True),
    ]
    sd = f"SD card (fsync +{s.slow_fsync_ms:g} ms)"
    out += [
        Scenario("sd-many-clients", f"{sd}: {s.clients} clients x {s.client_jobs} jobs, enqueue only",
                 [QUEICKD_SQLITE, HUEY], run_slowed, needs_huey=True),
        Scenario("sd-e2e", f"{sd}: end to end, {s.e2e_jobs:,} jobs, one enqueue each, 4 workers",
                 [QUEICKD_SQLITE, HUEY], run_slowed, needs_huey=True),
        Scenario("sd-e2e-many", f"{sd}: end to end, {s.e2e_jobs:,} jobs, batched: enqueue_many x{s.chunk}, "
                 "4 workers", [QUEICKD_SQLITE], run_slowed),
    ]
    out.append(Scenario("raw-sqlite", "raw: sqlite3 commits", list(RAW_SQLITE), run_raw_sqlite))
    out.append(Scenario("raw-lone-commit", "raw: lone fsync'd commit latency", [RAW_LONE], run_raw_lone))
    out.append(Scenario("raw-tcp", "raw: TCP request/response", [RAW_TCP], run_raw_tcp))
    out.append(Scenario("raw-lone-tcp", "raw: lone TCP round trip latency", [RAW_LONE_TCP], run_raw_lone_tcp))
    return out


def run_e2e_many(s: Settings, res: Results, scenario: str, target: str) -> None:
    run_e2e(s, res, scenario, target, batched=True)


def run_many_workers(s: Settings, res: Results, scenario: str, target: str) -> None:
    run_many_clients(s, res, scenario, target, workers=4)


def run_many_enqueue(s: Settings, res: Results, scenario: str, target: str) -> None:
    run_many_clients(s, res, scenario, target, workers=0)


def print_scenarios(all_scenarios: list[Any]) -> None:
    """--list: one line per scenario, its title and targets."""
    width = max(len(sc.name) for sc in all_scenarios) + 2
    for sc in all_scenarios:
        print(f"{sc.name:<{width}} {sc.title}  [{', '.join(sc.targets)}]")


def stop_on_sigterm() -> None:
    """SIGTERM ends a run like Ctrl-C, so the cleanup kills every process group it started."""
    def on_term(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)


def select(all_scenarios: list[Scenario], only: str | None) -> list[Scenario]:
    """--only takes names or prefixes, comma-separated: 'enqueue', 'memory-100k,raw'."""
    if not only:
        return all_scenarios
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    picked = [sc for sc in all_scenarios if any(sc.name == w or sc.name.startswith(w) for w in wanted)]
    unknown = [w for w in wanted if not any(sc.name == w or sc.name.startswith(w) for sc in all_scenarios)]
    if unknown:
        names = ", ".join(sc.name for sc in all_scenarios)
        raise SystemExit(f"bench: unknown scenario(s) {', '.join(unknown)}; choose from: {names}")
    return picked


def keep_targets(order: list[Scenario], targets: str | None) -> list[Scenario]:
    """--targets: only targets whose name contains one of these words (comma-separated);
    scenarios left with none are dropped, and a peer left out is not set up."""
    if not targets:
        return order
    wanted = [w.strip() for w in targets.split(",") if w.strip()]
    for sc in order:
        sc.targets = [t for t in sc.targets if any(w in t for w in wanted)]
        sc.needs_peer = sc.needs_peer and QUEICK in sc.targets
        sc.needs_huey = sc.needs_huey and HUEY in sc.targets
    return [sc for sc in order if sc.targets]


# --- main ------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.run",
        description="Benchmark queickd against Queick 1.2.1 and huey 3.5.4 (enqueue rate, memory and "
        "disk per queued job, end-to-end rate, latency, idle cost, kill -9) and measure the machine's raw "
        "SQLite and loopback TCP limits. Targets alternate over the rounds, each in a fresh process and "
        "temp dir.",
        epilog="Scenarios: enqueue-single, enqueue-pipelined, enqueue-many, memory-100k, memory-1m, "
        "e2e, e2e-many, many-clients, many-clients-enqueue, latency, idle, crash, sd-many-clients, sd-e2e, sd-e2e-many, "
        "raw-sqlite, raw-lone-commit, raw-tcp, raw-lone-tcp (--list shows them). The Queick and huey venvs are created on first "
        "use (see the top of bench/run.py).",
    )
    p.add_argument("--rounds", type=int, default=None, help="rounds per scenario (default: 3; 1 with --quick)")
    p.add_argument("--quick", action="store_true",
                   help="fast smoke run: 2,000 jobs per enqueue run, no 1M memory run, 0.5 s raw runs, "
                   "1,000 e2e jobs, 20 latency samples, 10 s + 10 s idle, 500 acks before the crash")
    p.add_argument("--only", metavar="SCENARIO", help="run only these scenarios (names or prefixes, comma-separated)")
    p.add_argument("--targets", metavar="TEXT",
                   help="only targets whose name contains one of these (comma-separated), e.g. 'queickd sqlite/full'")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument("--jobs", type=int, default=None, help="jobs per enqueue run (default: 20,000; 2,000 with --quick)")
    p.add_argument("--chunk", type=int, default=1000, help="jobs per enqueue_many / pipelined chunk (default: 1000)")
    p.add_argument("--peer-venv", type=Path,
                   default=Path(os.environ.get("BENCH_QUEICK_VENV", CACHE_DIR / "queick-venv")),
                   help="virtualenv holding Queick 1.2.1, created if missing [env BENCH_QUEICK_VENV] "
                   "(default: bench/.bench-cache/queick-venv)")
    p.add_argument("--huey-venv", type=Path,
                   default=Path(os.environ.get("BENCH_HUEY_VENV", CACHE_DIR / "huey-venv")),
                   help=f"virtualenv holding huey {HUEY_VERSION}, created if missing [env BENCH_HUEY_VENV] "
                   "(default: bench/.bench-cache/huey-venv)")
    p.add_argument("--e2e-jobs", type=int, default=None, help="jobs per e2e run (default: 5,000; 1,000 with --quick)")
    p.add_argument("--idle-warmup", type=float, default=None,
                   help="seconds an idle target runs before measuring (default: 90; 10 with --quick)")
    p.add_argument("--idle-seconds", type=float, default=None,
                   help="seconds the idle cost is measured over (default: 30; 10 with --quick)")
    p.add_argument("--tmp-dir", type=Path, default=Path(tempfile.gettempdir()),
                   help="where the fresh per-run data dirs go; put it on the disk you care about "
                   "(default: %(default)s)")
    p.add_argument("--clients", type=int, default=16, help="client processes in many-clients (default: 16)")
    p.add_argument("--client-jobs", type=int, default=None,
                   help="jobs per client in many-clients (default: 500; 100 with --quick)")
    p.add_argument("--slow-fsync", type=float, default=5.0, metavar="MS",
                   help="milliseconds the sd-* scenarios add to every fsync/fdatasync of the target's processes, "
                   "with an LD_PRELOAD shim built from bench/slowfsync.c by the system C compiler (default: 5)")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    return p


class TargetSkippedError(Exception):
    """A target that cannot run here: reported as SKIPPED with the reason, not as a failure."""


def run_rounds(order: Sequence[Any], s: Any, res: Results,
               skipped: dict[tuple[str, str], str] | None = None) -> None:
    """Run every scenario's targets in turn (A B C A B C ...), s.rounds times, each run on
    its own: a failed run is recorded and the others go on, and a target that raises
    TargetSkippedError is recorded in `skipped` and not tried again."""
    skipped = {} if skipped is None else skipped
    for sc in order:
        for r in range(s.rounds):
            for target in sc.targets:
                if (sc.name, target) in skipped:
                    continue
                log(f"{sc.name} round {r + 1}/{s.rounds}: {target}")
                t0 = time.perf_counter()
                try:
                    sc.run(s, res, sc.name, target)
                except TargetSkippedError as e:
                    skipped[(sc.name, target)] = f"skipped: {e}"
                    log(f"  skipped: {e}")
                except Exception as e:  # one failed run must not lose the others
                    log(f"  FAILED: {type(e).__name__}: {e}")
                    res.error(sc.name, target, f"round {r + 1}: {e}")
                finally:
                    kill_all()  # nothing outlives its run
                log(f"  done in {time.perf_counter() - t0:.1f} s")


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    rounds = a.rounds if a.rounds is not None else (1 if a.quick else 3)
    if rounds < 1 or (a.jobs is not None and a.jobs < 1) or not 1 <= a.chunk <= 10_000:
        raise SystemExit("bench: --rounds and --jobs must be positive, --chunk 1-10000")
    if (a.e2e_jobs is not None and a.e2e_jobs < 1) or (a.idle_warmup or 0) < 0 or (a.idle_seconds or 1) <= 0:
        raise SystemExit("bench: --e2e-jobs and --idle-seconds must be positive, --idle-warmup not negative")
    if a.clients < 1 or (a.client_jobs is not None and a.client_jobs < 1) or a.slow_fsync < 0:
        raise SystemExit("bench: --clients and --client-jobs must be positive, --slow-fsync not negative")
    s = Settings(
        rounds=rounds, quick=a.quick, enqueue_jobs=a.jobs or (2_000 if a.quick else 20_000), chunk=a.chunk,
        memory_sizes=[100_000] if a.quick else [100_000, 1_000_000], queick_memory_max=100_000,
        raw_seconds=0.5 if a.quick else 2.0, tmp_root=a.tmp_dir.resolve(), venv=a.peer_venv.resolve(),
        e2e_jobs=a.e2e_jobs or (1_000 if a.quick else 5_000), latency_samples=20 if a.quick else 100,
        idle_warmup=a.idle_warmup if a.idle_warmup is not None else (10.0 if a.quick else 90.0),
        idle_seconds=a.idle_seconds or (10.0 if a.quick else 30.0), crash_acks=500 if a.quick else 2_000,
        huey_venv=a.huey_venv.resolve(), clients=a.clients,
        client_jobs=a.client_jobs or (100 if a.quick else 500), slow_fsync_ms=a.slow_fsync,
    )
    order = keep_targets(select(scenarios(s), a.only), a.targets)
    if a.list:
        print_scenarios(scenarios(s))
        return 0
    s.tmp_root.mkdir(parents=True, exist_ok=True)
    compile_sources(default_queickd_path())
    stop_on_sigterm()
    res = Results()
    info = machine_info(s)
    try:
        if any(sc.needs_peer for sc in order):
            try:
                s.peer_python = ensure_peer_venv(s.venv)
            except Exception as e:  # no registry, no venv module, ...: Queick's rows fail
                s.peer_error = f"{type(e).__name__}: {e}"
                log(f"cannot prepare the Queick venv ({s.peer_error}); its runs will fail")
        if any(sc.needs_huey for sc in order):
            try:
                s.huey_python = ensure_huey_venv(s.huey_venv)
            except Exception as e:
                s.huey_error = f"{type(e).__name__}: {e}"
                log(f"cannot prepare the huey venv ({s.huey_error}); its runs will fail")
        run_rounds(order, s, res)
    except KeyboardInterrupt:
        log("interrupted; reporting what was measured")
        res.notes.append("interrupted before the end")
    finally:
        kill_all()
    info["loadavg_end"] = os.getloadavg()
    names = {sc.name for sc in order}
    if names & {"enqueue-single"}:
        res.notes.append("queickd runs with --workers 0 during enqueue runs, so no job runs while they are "
                         "measured. Queick cannot be stopped from running jobs: its dispatcher process runs "
                         "each no-op (in a new thread pool per job) during its measurement, on the same 2 cores.")
        res.notes.append("enqueue-single: huey has no server; its client inserts each task into the SQLite file "
                         "itself (one fsync'd commit per task call), and no huey consumer runs during the "
                         "measurement (as queickd runs with --workers 0), so huey has no server CPU row and its "
                         "client CPU is the whole enqueue cost.")
    if any(n.startswith("memory") for n in names):
        res.notes.append("memory: queickd sqlite/full runs with 4 workers (jobs are far-future, none runs); "
                         "RSS is the daemon's. Queick's RSS is the sum over its process group (dispatcher + "
                         "receiver). In Queick 1.2.1 the first far-future job blocks its dispatcher inside "
                         "sched.run() until that job is due, so the later ones wait in the receiver's "
                         "multiprocessing.Queue buffer (and no immediate job would run meanwhile).")
        if any(HUEY in sc.targets for sc in order if sc.name.startswith("memory")):
            res.notes.append("memory: huey's consumer runs (-w 4 -k thread) while a client calls "
                             "noop.schedule(delay=10**7) once per task: huey has no batch enqueue and each call "
                             "commits on its own. The task lands in huey's queue table; a worker dequeues it, sees "
                             "it is not due and inserts it into the schedule table. RSS (the consumer's), store "
                             "bytes and the table counts are read once every task is in the schedule table "
                             "('consumer scheduling after the fill' is that wait); its fill rate is the client's, "
                             "with the consumer competing for the database. huey's SQLite connection has an 8 MB "
                             "page cache (cache_mb=8), a ceiling on its RSS growth. After a clean stop (SIGINT) "
                             "the last connection closes and SQLite checkpoints and removes the WAL.")
        if not s.quick and "memory-1m" in names:
            res.notes.append("memory-1m: Queick skipped at 1,000,000 jobs (one TCP connection per job, "
                             "~10 minutes per round here; it is not durable either). huey skipped too: one "
                             "fsync'd commit per task plus its consumer's move of each task to the schedule table "
                             "took 4 to 6 minutes for 100,000 tasks here, so most of an hour per round.")
    if names & {"e2e", "e2e-many", "sd-e2e", "sd-e2e-many"}:
        res.notes.append("e2e: every target runs its jobs with 4 workers (Queick: its defaults) and gets one "
                         "enqueue per job, as a Queick or huey user writes it (queickd: JobQueue().enqueue in a "
                         "loop, Queick one TCP connection per job, huey one task call, an SQLite insert by the "
                         f"client); e2e-many is queickd batched, enqueue_many in chunks of {s.chunk}, compared with "
                         "Queick one at a time (*). Timed from the first enqueue until the output file holds N "
                         "bytes; CPU is the daemon's process group plus the client's (huey's client does the "
                         "enqueue work itself).")
    if names & {"many-clients", "many-clients-enqueue", "sd-many-clients"}:
        res.notes.append(f"many-clients: {s.clients} client processes, each sending {s.client_jobs} jobs one "
                         "request at a time and waiting for every ack, started together once all are connected; "
                         "with 4 workers timed until every job ran (append-byte jobs), with --workers 0 (huey: no "
                         "consumer, its clients insert into SqliteHuey themselves) until the last ack.")
    if any(n.startswith("sd-") for n in names):
        res.notes.append(f"sd-*: every fsync/fdatasync of the target's processes (daemon, consumer, huey's "
                         f"clients) takes {s.slow_fsync_ms:g} ms more, as on an SD card: an LD_PRELOAD shim "
                         "(bench/slowfsync.c, built with cc into the cache dir).")
    if "latency" in names:
        res.notes.append("latency: the job itself appends time.time() - sent_at when it starts, so import and "
                         "dispatch costs count. huey's workers poll SQLite with a backoff (0.1 s growing x1.15 "
                         "per empty poll, up to 10 s), so its latency depends on its polling, not on a wake-up.")
    if "idle" in names:
        res.notes.append("idle: utime+stime from /proc/PID/stat and voluntary+involuntary context switches "
                         "over /proc/PID/task/*/status, summed over the process group; clock ticks are 10 ms, "
                         "so small CPU figures are coarse.")
    if "crash" in names:
        res.notes.append("crash: SIGKILL to the whole process group mid-load, restart on the same data (queickd "
                         "--store file, huey's SQLite file; Queick has nothing to restart from, so every job it "
                         "had not run yet is gone). 'never ran' counts acknowledged tokens absent after the "
                         "drain; 'ran more than once' counts tokens written twice or more (queickd re-runs jobs "
                         "that were running when killed: at least once; huey deletes a task from its table "
                         "before running it: at most once).")
    if any(HUEY in sc.targets for sc in order):
        res.notes.append(f"huey rows ({HUEY}) carry no ratio: the ratio column compares with Queick; see "
                         "context for queickd vs huey.")
    res.notes.append("Queick keeps every job in RAM and loses them on exit: it is not durable. queickd "
                     "sqlite/full acknowledges a job only after its transaction is fsync'd.")
    text = render(res, order, info, s)
    print(text, flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(to_json(res, info, s, order), indent=2) + "\n")
        log(f"wrote {a.json}")
    return 1 if res.has_errors() else 0


if __name__ == "__main__":
    sys.exit(main())
