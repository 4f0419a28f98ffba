"""Workflow transition cost: steps per second and store transactions per step, against the
plain job end-to-end rate measured in the same run, on SQLite and PostgreSQL; and huey
3.5.4's pipelines where its virtualenv exists.

    python -m bench.workflows                     # SQLite and PostgreSQL, and huey if found
    python -m bench.workflows --stores sqlite --runs 20 --items 1000 --jobs 2000
    python -m bench.workflows --huey-venv VENV --json results.json

Two parts:
- end to end, through a daemon (`python -m queickd run`, 4 workers, a fresh store): N plain
  no-op jobs (enqueue_many, each waited for); R runs of 10 no-op task steps, started at once;
  one run with a fan-out of I no-op items. Rates are from the first request to the last
  job's (or run's) end.
- transactions per step, in this process, with the pool's own pattern (each pass finishes
  what ran and claims the next jobs in one transaction): SQLite's COMMITs counted on its
  writing connection, PostgreSQL's from pg_stat_database of a fresh database (read once
  every connection has closed, so every backend's counts are flushed).
Celery's canvas needs a broker (RabbitMQ or Redis), which this machine does not run; the
peer is huey's pipelines (`task.s().then(...)`, SqliteHuey, 4 thread workers) and, for the
fan-out, huey's `task.map(items)`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
LISTENING = re.compile(r"listening on (\S+):(\d+)")
STEP, ITEM, NOOP = "wfjobs:step", "wfjobs:item", "wfjobs:noop"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


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
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


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
    out["chain_vs_plain"] = out["chain_steps_per_s"] / out["plain_jobs_per_s"]
    out["fan_out_vs_plain"] = out["fan_out_items_per_s"] / out["plain_jobs_per_s"]
    return out


# --- transactions per step, in this process ---------------------------------------------------
def _drive(store: Any, jobs: list[Any] | None = None, slots: int = 4) -> int:
    """The pool's pattern with `slots` workers: each pass finishes what ran and claims the
    next jobs in one transaction. Returns the jobs run."""
    from queickd.core.job import Outcome

    ran, held = 0, list(jobs or [])
    with store.batch(bookkeeping=True):
        held += store.claim_available(slots, time.time())
    while held:
        outcomes = []
        for j in held:
            mod, fn = j.func.split(":")
            outcomes.append(Outcome.succeeded(j.id, getattr(importlib.import_module(mod), fn)(*j.args),
                                              j.workflow_run))
        ran += len(held)
        with store.batch(bookkeeping=True):
            store.finish_if_running(outcomes, time.time())
            held = store.claim_available(slots, time.time())
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


# --- huey's pipelines -----------------------------------------------------------------------
HUEY_APP = '''
from huey import SqliteHuey
huey = SqliteHuey("bench", filename={db!r}, fsync=True)

@huey.task()
def step(*a):
    return 1  # huey stores no None result, and a result is what a caller waits for
'''

HUEY_CLIENT = '''
import json, sys, time
sys.path.insert(0, {d!r})
from hueyjobs import huey, step
runs, items = {runs}, {items}
t0 = time.perf_counter()
results = []
for _ in range(runs):
    p = step.s()
    for _ in range(9):
        p = p.then(step)
    results.append(huey.enqueue(p))
for r in results:
    r.get(blocking=True, timeout=600)  # a pipeline's results, once its last step ran
chain = runs * 10 / (time.perf_counter() - t0)
t0 = time.perf_counter()
group = step.map([(i,) for i in range(items)])
group.get(blocking=True, timeout=600)
fan = items / (time.perf_counter() - t0)
t0 = time.perf_counter()
plain = [step() for _ in range({jobs})]
for r in plain:
    r.get(blocking=True, timeout=600)
print(json.dumps({{"chain_steps_per_s": chain, "fan_out_items_per_s": fan,
                  "plain_jobs_per_s": {jobs} / (time.perf_counter() - t0)}}))
'''


def huey(venv: Path, runs: int, items: int, jobs: int) -> dict[str, float] | None:
    consumer = venv / "bin" / "huey_consumer"
    if not consumer.exists():
        log(f"huey: no consumer at {consumer}; skipped (give --huey-venv)")
        return None
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "hueyjobs.py").write_text(HUEY_APP.format(db=f"{d}/huey.db"))
        proc = subprocess.Popen([str(consumer), "hueyjobs.huey", "-w", "4", "-k", "thread"], cwd=d,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            for line in proc.stderr:  # type: ignore[union-attr]
                if "Huey consumer started" in line:
                    break
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # type: ignore[union-attr]
            script = HUEY_CLIENT.format(d=d, runs=runs, items=items, jobs=jobs)
            res = subprocess.run([str(venv / "bin" / "python"), "-c", script], cwd=d, capture_output=True,
                                 text=True, timeout=1800)
            if res.returncode:
                log(f"huey: client failed: {res.stderr[-2000:]}")
                return None
            out = json.loads(res.stdout.strip().splitlines()[-1])
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    out["chain_vs_plain"] = out["chain_steps_per_s"] / out["plain_jobs_per_s"]
    out["fan_out_vs_plain"] = out["fan_out_items_per_s"] / out["plain_jobs_per_s"]
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
        "BENCH_HUEY_VENV", BENCH_DIR / ".bench-cache" / "huey-venv")), help="a virtualenv with huey 3.5.4")
    p.add_argument("--json", type=Path, help="also write the results here")
    a = p.parse_args(argv)
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
    h = huey(a.huey_venv, a.runs, a.items, a.jobs)
    if h is not None:
        results["e2e"]["huey 3.5.4 (SqliteHuey)"] = h
    print(render(results))
    if a.json:
        a.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
