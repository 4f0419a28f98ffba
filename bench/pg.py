"""queickd on PostgreSQL against pgqueuer and procrastinate, on the same local server in one
run: enqueue rate, end-to-end rate of no-op jobs, idle load on the database, and kill -9 of
the workers under load.

    python -m bench.pg --quick             # a smoke run: fewer jobs, one round, short idle
    python -m bench.pg                     # 3 rounds of everything
    python -m bench.pg --only e2e,idle --rounds 5 --json pg.json
    python -m bench.pg --help

queickd targets: one daemon (`queick run --workers 0`: the protocol, no jobs) plus k external
workers (`queick worker`, k = 1, 2, 4) sharing --concurrency job slots between them. queickd
is imported from wherever this Python finds it (PYTHONPATH included); the path is passed on
to every queickd process, and printed in the header.

The peers live in virtualenvs of their own, created on first use and reused when their
pinned versions are there (--pgqueuer-venv / $BENCH_PGQUEUER_VENV, --procrastinate-venv /
$BENCH_PROCRASTINATE_VENV, default bench/.bench-cache/NAME-venv); they are always run as
VENV/bin/python -m ..., never through a console script or PATH. Each run copies
pgqueuer_app.py / procrastinate_app.py and benchjobs.py into its temp dir, where the peer's
workers and client probes run. Peers get --peer-processes worker processes (default 1)
sharing the same --concurrency.

Every run gets a fresh database (CREATE DATABASE, dropped WITH (FORCE) afterwards) and temp
dir; targets alternate over the rounds. Only loopback addresses are used. Every process this
script starts is in its own process group and is killed at the end, even on error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from bench.goals import pg_goal_lines
from bench.pgreport import (
    machine_info,
    notes,
    render,
)
from bench.pgscenarios import (
    scenarios,
    select,
)
from bench.pgsetup import (
    PGQUEUER,
    PGQUEUER_PINS,
    PROCRASTINATE,
    PROCRASTINATE_PINS,
    Settings,
    check_queickd,
    ensure_venv,
)
from bench.processes import (
    CACHE_DIR,
    compile_sources,
    default_queickd_path,
    kill_all,
    log,
)
from bench.report import Results
from bench.run import print_scenarios, run_rounds, stop_on_sigterm


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.pg",
        description="Benchmark queickd's PostgreSQL store (1, 2 and 4 external worker processes) against pgqueuer "
        "and procrastinate on the same local PostgreSQL: enqueue rate, end-to-end jobs/s, idle transactions per "
        "minute, kill -9 of the workers. Targets alternate over the rounds, each on a fresh database.",
        epilog="Scenarios: enqueue-single, enqueue-batch, raw, app-tx, e2e, idle, crash. The peers' venvs are created on "
        "first use (see the top of bench/pg.py and bench/README.md).",
    )
    p.add_argument("--rounds", type=int, default=None, help="rounds per scenario (default: 3; 1 with --quick)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 1,000 jobs per enqueue run, 2,000 e2e jobs, 5 s + 20 s idle, 300 acks "
                   "before the crash, one round")
    p.add_argument("--only", metavar="SCENARIO", help="only these scenarios (names or prefixes, comma-separated)")
    p.add_argument("--targets", metavar="TEXT",
                   help="only targets whose name contains one of these (comma-separated), e.g. 'pgqueuer,1 worker'")
    p.add_argument("--crash-recovery-max", type=float, default=180.0,
                   help="seconds after the kill -9 that acknowledged jobs get to run (default: 180)")
    p.add_argument("--json", metavar="PATH", help="also write every value of every round as JSON to PATH")
    p.add_argument("--list", action="store_true", help="list the scenarios and their targets, and exit")
    p.add_argument("--pg", default=os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
                   help="the server's maintenance database; each run creates and drops its own database there "
                   "[env BENCH_PG_URL] (default: %(default)s)")
    p.add_argument("--jobs", type=int, default=None, help="jobs per enqueue run (default: 5,000; 1,000 with --quick)")
    p.add_argument("--chunk", type=int, default=1000, help="jobs per batch request (default: 1000)")
    p.add_argument("--e2e-jobs", type=int, default=None, help="jobs per e2e run (default: 5,000; 2,000 with --quick)")
    p.add_argument("--concurrency", type=int, default=4, help="job slots per target (default: 4)")
    p.add_argument("--worker-procs", default="1,2,4",
                   help="queickd worker process counts to run, comma-separated (default: 1,2,4)")
    p.add_argument("--peer-processes", type=int, default=1,
                   help="worker processes per peer, sharing --concurrency (default: 1; pgqueuer needs >= 2 slots "
                   "per process)")
    p.add_argument("--idle-warmup", type=float, default=None, help="seconds before idle is measured (default: 30; 5 "
                   "with --quick)")
    p.add_argument("--idle-seconds", type=float, default=None, help="idle window in seconds (default: 60; 20 with "
                   "--quick)")
    p.add_argument("--crash-acks", type=int, default=None, help="acks before kill -9 (default: 1,000; 300 with --quick)")
    p.add_argument("--pgqueuer-venv", type=Path,
                   default=Path(os.environ.get("BENCH_PGQUEUER_VENV", CACHE_DIR / "pgqueuer-venv")),
                   help="virtualenv with pgqueuer 1.6.0 + asyncpg, created if missing [env BENCH_PGQUEUER_VENV]")
    p.add_argument("--procrastinate-venv", type=Path,
                   default=Path(os.environ.get("BENCH_PROCRASTINATE_VENV", CACHE_DIR / "procrastinate-venv")),
                   help="virtualenv with procrastinate 3.10.0 + psycopg, created if missing "
                   "[env BENCH_PROCRASTINATE_VENV]")
    p.add_argument("--queickd-path", type=Path, default=os.environ.get("BENCH_QUEICKD_PATH"),
                   help="directory holding the queickd package to benchmark, passed to every queickd process "
                   "as PYTHONPATH [env BENCH_QUEICKD_PATH] (default: the first $PYTHONPATH entry holding one, "
                   "else where this Python imports queickd from)")
    p.add_argument("--tmp-dir", type=Path, default=Path(tempfile.gettempdir()),
                   help="where the per-run temp dirs go (default: %(default)s)")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    rounds = a.rounds if a.rounds is not None else (1 if a.quick else 3)
    try:
        procs = sorted({int(x) for x in a.worker_procs.split(",") if x.strip()})
    except ValueError:
        raise SystemExit("bench.pg: --worker-procs takes numbers, e.g. 1,2,4") from None
    if rounds < 1 or a.concurrency < 1 or not procs or min(procs) < 1 or max(procs) > a.concurrency:
        raise SystemExit("bench.pg: --rounds and --concurrency must be positive; --worker-procs between 1 and "
                         "--concurrency")
    if not 1 <= a.peer_processes <= a.concurrency or not 1 <= a.chunk <= 10_000:
        raise SystemExit("bench.pg: --peer-processes between 1 and --concurrency, --chunk 1-10000")
    s = Settings(
        rounds=rounds, quick=a.quick, admin_url=a.pg, tmp_root=a.tmp_dir.resolve(),
        enqueue_jobs=a.jobs or (1_000 if a.quick else 5_000), chunk=a.chunk,
        e2e_jobs=a.e2e_jobs or (2_000 if a.quick else 5_000), concurrency=a.concurrency, worker_procs=procs,
        peer_processes=a.peer_processes,
        idle_warmup=a.idle_warmup if a.idle_warmup is not None else (5.0 if a.quick else 30.0),
        idle_seconds=a.idle_seconds or (20.0 if a.quick else 60.0),
        crash_acks=a.crash_acks or (300 if a.quick else 1_000), crash_recovery_max=a.crash_recovery_max,
        pgqueuer_venv=a.pgqueuer_venv.resolve(), procrastinate_venv=a.procrastinate_venv.resolve(),
    )
    order = select(scenarios(s), a.only)
    if a.targets:
        wanted = [w.strip() for w in a.targets.split(",") if w.strip()]
        for sc in order:
            sc.targets = [t for t in sc.targets if any(w in t for w in wanted)]
        order = [sc for sc in order if sc.targets]
    if a.list:
        print_scenarios(scenarios(s))
        return 0
    s.tmp_root.mkdir(parents=True, exist_ok=True)
    stop_on_sigterm()
    res = Results()
    skipped: dict[tuple[str, str], str] = {}
    s.queickd_path = a.queickd_path.resolve() if a.queickd_path else default_queickd_path()
    compile_sources(s.queickd_path)
    s.queickd_skip = check_queickd(s.queickd_path, s.tmp_root)
    if s.queickd_skip:
        log(f"queickd targets skipped: {s.queickd_skip}")
    info = machine_info(s)
    try:
        for peer, venv, pins in ((PGQUEUER, s.pgqueuer_venv, PGQUEUER_PINS),
                                 (PROCRASTINATE, s.procrastinate_venv, PROCRASTINATE_PINS)):
            try:
                s.pythons[peer] = ensure_venv(venv, pins)
            except Exception as e:  # no registry, no venv module: that peer's rows fail
                s.venv_errors[peer] = f"{type(e).__name__}: {e}"
                log(f"cannot prepare the {peer} venv ({s.venv_errors[peer]}); its runs will fail")
        run_rounds(order, s, res, skipped)
    except KeyboardInterrupt:
        log("interrupted; reporting what was measured")
        res.notes.append("interrupted before the end")
    finally:
        kill_all()
    info["loadavg_end"] = os.getloadavg()
    res.notes += notes(s, {sc.name for sc in order})
    print(render(res, order, info, s, skipped), flush=True)
    if a.json:
        doc = {
            "machine": info,
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(s).items() if k != "pythons"},
            "scenarios": [{"name": sc.name, "title": sc.title, "targets": sc.targets} for sc in order],
            "skipped": [{"scenario": k[0], "target": k[1], "reason": v} for k, v in skipped.items()],
            "results": [
                {"scenario": m.scenario, "metric": m.label, "target": m.target, "unit": m.unit, "values": m.values,
                 "median": m.median, "min": min(m.values) if m.values else None,
                 "max": max(m.values) if m.values else None, "errors": m.errors, "rounds": m.rounds}
                for m in res.metrics.values()
            ],
            "goals": pg_goal_lines(res),
            "notes": res.notes,
        }
        Path(a.json).write_text(json.dumps(doc, indent=2, default=str) + "\n")
        log(f"wrote {a.json}")
    return 1 if res.has_errors() else 0


if __name__ == "__main__":
    sys.exit(main())
