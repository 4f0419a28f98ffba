"""Workflow transition cost: steps per second and store transactions per step, against the
plain job end-to-end rate measured in the same run, on SQLite and PostgreSQL; and, as peers,
huey 3.5.4's pipelines and Celery 5.7.0's canvas.

    python -m bench.workflows                     # SQLite and PostgreSQL, huey and Celery
    python -m bench.workflows --stores sqlite --runs 20 --items 1000 --jobs 2000
    python -m bench.workflows --huey-venv VENV --celery-venv VENV --json results.json

Two parts:
- end to end, through a daemon (`python -m queickd run`, 4 workers, a fresh store): N plain
  no-op jobs (enqueue_many, each waited for); R runs of 10 no-op task steps, started at once;
  one run with a fan-out of I no-op items. Rates are from the first request to the last
  job's (or run's) end.
- transactions per step, in this process, with the pool's own pattern (each pass finishes
  what ran and claims the next jobs in one transaction): SQLite's COMMITs counted on its
  writing connection, PostgreSQL's from pg_stat_database of a fresh database (read once
  every connection has closed, so every backend's counts are flushed).

The peers run the same three measurements end to end, each with 4 thread workers and in a
virtualenv of its own, created on first use (bench.peers; --huey-venv, else
$BENCH_HUEY_VENV, else bench/.bench-cache/huey-venv; --celery-venv, else
$BENCH_CELERY_VENV, else bench/.bench-cache/celery-venv):
- huey: pipelines (`task.s().then(...)`), SqliteHuey with fsync=True, `huey_consumer -w 4
  -k thread`; the fan-out is huey's `task.map(items)`.
- Celery: the canvas, `chain(step.s(), ... 10 steps)` and, for the fan-out,
  `group(step.s(i) for i in items)` (a chord would add a callback step), each waited for
  with `.get()`; plain jobs are `step.delay()`. The worker is `celery -A celeryjobs worker
  --pool threads --concurrency 4` (Celery's default log level). The broker is RabbitMQ
  (--celery-broker, default amqp://guest:guest@127.0.0.1:5672//), Celery's default broker,
  with Celery's defaults there: a durable queue, persistent messages, a message acked just
  before its task runs. Chains and groups are waited on through results, so there is a
  result backend: Redis (--celery-results, default redis://127.0.0.1:6379/7, a database of
  its own, flushed before the run; the queue is purged). The Redis server here keeps
  nothing on disk (no RDB snapshots, no AOF), so Celery's result store is not durable,
  whereas queickd's rates are with fsync'd commits (--durability full). When the broker or
  the result store cannot be reached, the Celery row is skipped with the reason logged.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.peers import CELERY_VERSION, HUEY_VERSION, ensure_celery_venv, ensure_huey_venv
from bench.processes import compile_sources, log, stop_group
from bench.wfpeers import CELERY_BROKER, CELERY_RESULTS, CELERY_TARGET, celery, huey, with_ratios

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
LISTENING = re.compile(r"listening on (\S+):(\d+)")
STEP, ITEM, NOOP = "wfjobs:step", "wfjobs:item", "wfjobs:noop"


def chain(steps: int = 10) -> dict[str, Any]:
    return {"name": "chain", "steps": [{"name": f"s{i}", "func": STEP} for i in range(steps)]}


def fan_out() -> dict[str, Any]:
    return {"name": "fan", "steps": [{"name": "fan", "kind": "for_each", "items": "xs", "func": ITEM}]}


# --- end to end, through a daemon -------------------------------------------------------------
@contextlib.contextmanager
def daemon(store_url: str, workers: int = 4) -> Iterator[int]:
    cmd = [sys.executable, "-m", "queickd", "run", "--store", store_url, "--port", "0", "--app-dir",
           str(BENCH_DIR), "--workers", str(workers), "--log-level", "info", "--durability", "full"]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            text=True, env=env, start_new_session=True)
    port: list[int] = []
    ready = threading.Event()

    def read() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            m = LISTENING.search(line)
            if m and not port:
                port.append(int(m.group(2)))
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the daemon did not start")
        yield port[0]
    finally:
        stop_group(proc, 30)


def end_to_end(store_url: str, jobs: int, runs: int, items: int) -> dict[str, float]:
    from queickd import JobQueue

    out: dict[str, float] = {}
    with daemon(store_url) as port, JobQueue("127.0.0.1", port) as q:
        t0 = time.perf_counter()
        ids: list[int] = []
        for i in range(0, jobs, 1000):
            ids += q.enqueue_many([{"func": NOOP} for _ in range(min(1000, jobs - i))])
        for job_id in ids:
            q.wait(job_id, 300)
        out["plain_jobs_per_s"] = jobs / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        run_ids = [q._call({"op": "workflow_start", "definition": chain(), "state": {}})["run_id"]
                   for _ in range(runs)]
        for r in run_ids:
            assert q.workflow_wait(r, 600)["state"] == "succeeded"
        out["chain_steps_per_s"] = runs * 10 / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        r = q._call({"op": "workflow_start", "definition": fan_out(), "state": {"xs": list(range(items))}})
        assert q.workflow_wait(r["run_id"], 600)["state"] == "succeeded"
        out["fan_out_items_per_s"] = items / (time.perf_counter() - t0)
    return with_ratios(out)


# --- transactions per step, in this process ---------------------------------------------------
def _drive(store: Any, jobs: list[Any] | None = None, slots: int = 4) -> int:
    """The pool's pattern with `slots` workers: each pass finishes what ran and claims the
    next jobs in one transaction. Returns the jobs run."""
    from queickd.core.job import Outcome
    from queickd.core.policy.claim import Request
    from queickd.services.step_state import StepState

    states = StepState(store)  # as the pool: a step job stored without its run's state gets it
    ran, held = 0, list(jobs or [])
    with store.transaction(bookkeeping=True) as tx:
        held += tx.claim_available(Request.of(slots, now=time.time()))
    while held:
        outcomes = []
        for j in map(states.complete, held):
            mod, fn = j.func.split(":")
            outcomes.append(Outcome.succeeded(j.id, getattr(importlib.import_module(mod), fn)(*j.args),
                                              j.workflow_run))
        ran += len(held)
        with store.transaction(bookkeeping=True) as tx:
            tx.finish_if_running(outcomes, time.time())
            held = tx.claim_available(Request.of(slots, now=time.time()))
    return ran


SCENARIOS = ("plain job (submit, claim, finish)", "10-step chain (start, then each step)",
             "fan-out (start, then each item)")


def run_scenario(store: Any, index: int, runs: int, items: int, jobs: int) -> int:
    """One scenario from its first write to its last finish; returns the jobs (steps) run."""
    from queickd.core import workflow as wf
    from queickd.core.job import NewJob

    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))  # wfjobs, as the daemon's --app-dir finds it
    now = time.time()
    if index == 0:
        store.submit([NewJob(func=NOOP, run_at=now) for _ in range(jobs)], now)
    elif index == 1:
        for _ in range(runs):
            store.workflow_start(wf.parse(chain()), {}, now)
    else:
        store.workflow_start(wf.parse(fan_out()), {"xs": list(range(items))}, now)
    return _drive(store)


def transactions_sqlite(runs: int, items: int, jobs: int) -> list[dict[str, Any]]:
    from queickd.store import open_store

    out = []
    with tempfile.TemporaryDirectory() as d:
        store = open_store(f"sqlite:///{d}/bench.db", "full")
        commits = [0]  # COMMITs on the one writing connection: every write transaction
        store._writer().set_trace_callback(
            lambda sql: commits.__setitem__(0, commits[0] + sql.lstrip().upper().startswith("COMMIT")))
        for i, name in enumerate(SCENARIOS):
            before, t0 = commits[0], time.perf_counter()
            n = run_scenario(store, i, runs, items, jobs)
            tx = commits[0] - before
            out.append({"scenario": name, "units": n, "transactions": tx, "per_unit": tx / n,
                        "per_s": n / (time.perf_counter() - t0)})
        store.close()
    return out


def transactions_postgres(admin_url: str, runs: int, items: int, jobs: int) -> list[dict[str, Any]]:
    from bench.pgsetup import Database
    from queickd.store import open_store

    out = []
    for i, name in enumerate(SCENARIOS):  # a fresh database each: its count is the scenario's alone
        with Database(admin_url) as db:
            open_store(db.dsn).close()  # migrated by a backend that then exits
            time.sleep(1.5)  # a backend's statistics are flushed when it exits
            before = db.transactions()
            store = open_store(db.dsn)
            t0 = time.perf_counter()
            n = run_scenario(store, i, runs, items, jobs)
            elapsed = time.perf_counter() - t0
            store.close()
            time.sleep(1.5)
            # less the store's own opening (its migrate check: counted by opening once more)
            mid = db.transactions()
            open_store(db.dsn).close()
            time.sleep(1.5)
            opening = db.transactions() - mid
            tx = mid - before - opening
            out.append({"scenario": name, "units": n, "transactions": tx, "per_unit": tx / n, "per_s": n / elapsed})
    return out


# --- report ---------------------------------------------------------------------------------
def render(results: dict[str, Any]) -> str:
    lines = ["| target | plain jobs/s | 10-step chain steps/s (× plain) | fan-out items/s (× plain) |",
             "|---|---:|---:|---:|"]
    for target, r in results["e2e"].items():
        lines.append(f"| {target} | {r['plain_jobs_per_s']:.0f} | {r['chain_steps_per_s']:.0f}"
                     f" ({r['chain_vs_plain']:.2f}×) | {r['fan_out_items_per_s']:.0f} ({r['fan_out_vs_plain']:.2f}×) |")
    lines += ["", "| store | scenario | units | store transactions | per unit | units/s (in process) |",
              "|---|---|---:|---:|---:|---:|"]
    for store, rows in results["transactions"].items():
        for r in rows:
            lines.append(f"| {store} | {r['scenario']} | {r['units']} | {r['transactions']} | {r['per_unit']:.3f}"
                         f" | {r['per_s']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.workflows", description=__doc__.split("\n\n")[0])
    p.add_argument("--stores", default="sqlite,postgres", help="sqlite, postgres or both (default: both)")
    p.add_argument("--pg", default=os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
                   help="PostgreSQL maintenance database [env BENCH_PG_URL] (default: %(default)s)")
    p.add_argument("--runs", type=int, default=20, help="runs of 10 no-op steps (default: 20)")
    p.add_argument("--items", type=int, default=1000, help="items of the fan-out (default: 1000)")
    p.add_argument("--jobs", type=int, default=2000, help="plain no-op jobs (default: 2000)")
    p.add_argument("--huey-venv", type=Path, default=Path(os.environ.get(
        "BENCH_HUEY_VENV", BENCH_DIR / ".bench-cache" / "huey-venv")),
        help=f"virtualenv holding huey {HUEY_VERSION}, created if missing [env BENCH_HUEY_VENV] "
        "(default: bench/.bench-cache/huey-venv)")
    p.add_argument("--celery-venv", type=Path, default=Path(os.environ.get(
        "BENCH_CELERY_VENV", BENCH_DIR / ".bench-cache" / "celery-venv")),
        help=f"virtualenv holding celery[redis] {CELERY_VERSION}, created if missing [env BENCH_CELERY_VENV] "
        "(default: bench/.bench-cache/celery-venv)")
    p.add_argument("--celery-broker", default=os.environ.get("BENCH_CELERY_BROKER", CELERY_BROKER),
                   help="Celery's broker [env BENCH_CELERY_BROKER] (default: %(default)s)")
    p.add_argument("--celery-results", default=os.environ.get("BENCH_CELERY_RESULTS", CELERY_RESULTS),
                   help="Celery's result backend, a Redis database the bench flushes [env BENCH_CELERY_RESULTS] "
                   "(default: %(default)s)")
    p.add_argument("--json", type=Path, help="also write the results here")
    a = p.parse_args(argv)
    compile_sources(ROOT)  # the checkout its daemons run (PYTHONPATH puts it first)
    a.huey_venv, a.celery_venv = a.huey_venv.resolve(), a.celery_venv.resolve()  # run from temp dirs
    stores = a.stores.split(",")
    results: dict[str, Any] = {"e2e": {}, "transactions": {}}
    if "sqlite" in stores:
        with tempfile.TemporaryDirectory() as d:
            log("sqlite: end to end")
            results["e2e"]["queickd sqlite"] = end_to_end(f"sqlite:///{d}/queue.db", a.jobs, a.runs, a.items)
        log("sqlite: transactions")
        results["transactions"]["sqlite"] = transactions_sqlite(a.runs, a.items, a.jobs)
    if "postgres" in stores:
        from bench.pgsetup import Database

        with Database(a.pg) as db:
            log("postgres: end to end")
            results["e2e"]["queickd postgres"] = end_to_end(db.dsn, a.jobs, a.runs, a.items)
        log("postgres: transactions")
        results["transactions"]["postgres"] = transactions_postgres(a.pg, a.runs, a.items, a.jobs)
    h = c = None  # a peer whose venv cannot be made is skipped, with the reason
    try:
        ensure_huey_venv(a.huey_venv)
    except Exception as e:
        log(f"huey: cannot prepare the venv {a.huey_venv} ({type(e).__name__}: {e}); skipped")
    else:
        log("huey: end to end")
        h = huey(a.huey_venv, a.runs, a.items, a.jobs)
    if h is not None:
        results["e2e"][f"huey {HUEY_VERSION} (SqliteHuey)"] = h
    try:
        ensure_celery_venv(a.celery_venv)
    except Exception as e:
        log(f"celery: cannot prepare the venv {a.celery_venv} ({type(e).__name__}: {e}); skipped")
    else:
        log("celery: end to end")
        try:  # a broker that accepts connections but never answers, say: the row is skipped, not the bench
            c = celery(a.celery_venv, a.runs, a.items, a.jobs, a.celery_broker, a.celery_results)
        except Exception as e:
            log(f"celery: {type(e).__name__}: {e}; skipped")
    if c is not None:
        results["e2e"][CELERY_TARGET] = c
    print(render(results))
    if a.json:
        a.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
