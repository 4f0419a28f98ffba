"""What a claim costs while jobs wait that cannot run: `python -m bench.parked`.

For each store (SQLite, PostgreSQL) and round, a fresh daemon with 4 workers on a fresh
store runs 400 plain no-op jobs (one enqueue_many, then a wait on each; three such batches,
the median their rate) in each scenario:
- `none`: nothing else waits;
- `parked`: N jobs wait in a pool no worker serves, each in its own concurrency group;
- `parked+full`: those, and a group with limit 1 whose one slot a long job holds while a
  second job of it waits at priority -10 (ahead of every other job);
- `full`: the full group alone.
It prints the rate (jobs a second, first enqueue to last finish) and each scenario's ratio
to `none` of the same store and round. The daemon and the client are the real ones, as
users run them; the client runs in this process. Scenarios alternate within a round, so a
slow patch of the shared machine hits every one.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from .processes import BENCH_DIR, LISTENING, LineWaiter, _clean_env, _kill_group, _spawn, log

SCENARIOS = ("none", "parked", "parked+full", "full")
BATCH = 10_000  # protocol.MAX_BATCH


@contextlib.contextmanager
def _daemon(url: str, cwd: Path, workers: int) -> Iterator[int]:
    """`python -m queickd run` on url; yields its port; killed on leaving."""
    cmd = [sys.executable, "-m", "queickd", "run", "--store", url, "--bind", "127.0.0.1", "--port", "0",
           "--workers", str(workers), "--app-dir", str(BENCH_DIR), "--log-level", "info"]
    proc = _spawn(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                  env=_clean_env(extra_path=True))
    try:
        out = LineWaiter(proc)
        yield int(out.wait_for(LISTENING, timeout=120.0).group(2))
    finally:
        _kill_group(proc)
        with contextlib.suppress(Exception):
            proc.wait(10)


@contextlib.contextmanager
def _store(kind: str, admin_url: str) -> Iterator[tuple[str, Path]]:
    """A fresh store's URL and a temp dir, both gone afterwards."""
    with tempfile.TemporaryDirectory(prefix="queickd-parked-") as d:
        if kind == "sqlite":
            yield f"sqlite:///{d}/queue.db", Path(d)
            return
        from .pgsetup import Database

        with Database(admin_url) as db:
            yield db.dsn, Path(d)


def _park(q, parked: int) -> None:  # noqa: ANN001 - a JobQueue
    """`parked` jobs in a pool no worker serves, each in a concurrency group of its own."""
    for start in range(0, parked, BATCH):
        q.enqueue_many([q.job("benchjobs:noop", pool="unserved", concurrency_group=f"parked-{i}")
                        for i in range(start, min(parked, start + BATCH))])


def _fill_group(q) -> None:  # noqa: ANN001
    """A group of limit 1 held by a long job, a second job of it waiting at priority -10."""
    long_id = q.enqueue("benchjobs:hold", [3600], concurrency_group="full", concurrency_limit=1)
    q.wait(long_id, timeout=120.0, states=["running"])
    q.enqueue("benchjobs:noop", concurrency_group="full", concurrency_limit=1, priority=-10)


def _settle(url: str) -> None:
    """PostgreSQL: the table vacuumed and analyzed once the parked jobs are in, as
    autovacuum leaves a table that stays put; else it does that work during the timed run."""
    import psycopg

    from queickd.store.postgres.namespace import split_url

    with psycopg.connect(split_url(url)[0], autocommit=True) as c:  # in the queue's schema
        c.execute("VACUUM ANALYZE jobs")


def run_one(kind: str, scenario: str, parked: int, jobs: int, admin_url: str, repeat: int) -> float:
    """Jobs a second for `jobs` no-op jobs, in `scenario` on a fresh `kind` store: the
    median of `repeat` batches, one after the other."""
    from queickd.client import JobQueue

    with _store(kind, admin_url) as (url, d), _daemon(url, d, 4) as port:
        q = JobQueue("127.0.0.1", port, timeout=600.0)
        try:
            if scenario.startswith("parked"):
                _park(q, parked)
            if scenario.endswith("full"):
                _fill_group(q)
            if kind == "pg":
                _settle(url)
            rates = []
            for _ in range(repeat):  # the parked jobs and the full group stay as they are
                specs = [q.job("benchjobs:noop") for _ in range(jobs)]
                t0 = time.perf_counter()
                ids = q.enqueue_many(specs)
                for i in ids:
                    if q.wait(i, timeout=600.0)["state"] != "succeeded":
                        raise RuntimeError(f"job {i} did not succeed")
                rates.append(jobs / (time.perf_counter() - t0))
            return statistics.median(rates)
        finally:
            q.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.parked", description=__doc__.split("\n\n")[0])
    p.add_argument("--stores", default="sqlite,pg", help="sqlite, pg or both (default)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"of {', '.join(SCENARIOS)}")
    p.add_argument("--parked", type=int, default=100_000, help="jobs parked in the unserved pool")
    p.add_argument("--jobs", type=int, default=400, help="no-op jobs timed per run")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3, help="batches timed per run (the median is its rate)")
    p.add_argument("--pg", default=os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
                   help="the PostgreSQL maintenance database")
    a = p.parse_args(argv)
    stores = a.stores.split(",")
    scenarios = a.scenarios.split(",")
    if "none" not in scenarios:
        scenarios.insert(0, "none")
    rates: dict[tuple[str, str], list[float]] = {}
    ratios: dict[tuple[str, str], list[float]] = {}
    for rnd in range(a.rounds):
        for kind in stores:
            base = None
            for sc in scenarios:
                rate = run_one(kind, sc, a.parked, a.jobs, a.pg, a.repeat)
                base = rate if sc == "none" else base
                rates.setdefault((kind, sc), []).append(rate)
                ratios.setdefault((kind, sc), []).append(rate / base)  # type: ignore[operator]
                log(f"round {rnd + 1} {kind:6} {sc:12} {rate:8.1f} jobs/s  x{rate / base:.2f}")  # type: ignore[operator]
    print(f"\n{a.jobs} no-op jobs, {a.parked:,} parked in an unserved pool, each in its own group; "
          f"{a.rounds} round(s), median of {a.repeat} batches a run, then of the rounds")
    print(f"{'store':8}{'scenario':14}{'jobs/s':>10}{'vs none':>10}   (each round's ratio)")
    for kind in stores:
        for sc in scenarios:
            r, x = rates[(kind, sc)], ratios[(kind, sc)]
            each = " ".join(f"{v:.2f}" for v in x)
            print(f"{kind:8}{sc:14}{statistics.median(r):10.1f}{statistics.median(x):10.2f}   ({each})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
