"""Rate limits' costs, on SQLite and PostgreSQL:
- end to end with every job under a rate limit that never binds, against the same run
  without them (target >= 0.9x);
- a binding limit of 100 starts a second on one key with 10,000 of its jobs waiting ahead
  of 1,000 others: the others' end-to-end rate against theirs alone (target >= 0.9x), and
  the limited key's starts a second over 20 s (target 100 +- 5); PostgreSQL with two
  worker processes (two daemons on one database).
A run ends at its last job's finish as the store stamped it, found by waiting on the daemon:
polling the store or `stats` would cost the arm with more rows or rate keys more.

    python -m bench.rates                     # everything, a few minutes
    python -m bench.rates --quick             # smaller end-to-end runs, one round
    python -m bench.rates --only binding --pg ''   # the binding row alone, SQLite only

PostgreSQL runs use a scratch database made (and dropped) on --pg's server; without a
reachable server they are skipped and say so. Every process started here is killed at the
end; only loopback addresses are used.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.processes import compile_sources, default_queickd_path
from bench.resources import Daemon, _truncate, pg_database

KEYS = 50  # rate keys of the non-binding run
BATCH = 500  # jobs per enqueue_many of the end-to-end rows: both arms alike
ROWS = ("e2e", "binding")
HOT_LIMIT, HOT_WAITING, OTHERS, WINDOW = 100, 10_000, 1_000, 20.0


def _all_done(q, ids: list[int], timeout: float = 900.0) -> None:
    """Return once every job of `ids` has ended, waiting on the daemon (no polling): the
    last enqueued first, then any of the rest still running. A poll of the store or of
    `stats` would cost the arm with more rows or more rate keys more than the other."""
    deadline = time.monotonic() + timeout
    for job_id in (ids[-1], *ids[:-1]):
        q.wait(job_id, max(1.0, deadline - time.monotonic()))


def _last_finish(store: str, rated: bool | None) -> float:
    """The latest finish stamp of the jobs (None: all; else with or without a rate limit)."""
    where = "" if rated is None else f" AND rate_limit IS {'NOT ' if rated else ''}NULL"
    return _read(store, f"SELECT max(finished_at) FROM jobs WHERE finished_at IS NOT NULL{where}")[0][0]


def e2e(store: str, n: int, limited: bool) -> float:
    """Jobs per second from the first enqueue to the last success; `limited`: each job under
    one of KEYS rate limits that never binds (10,000 starts a second)."""
    with Daemon(store) as daemon, daemon.client() as q:
        specs = [q.job("benchjobs:noop", **({"rate_limit": (f"k{i % KEYS}", 10_000, 1.0)} if limited else {}))
                 for i in range(n)]
        began, ids = time.time(), []
        for i in range(0, n, BATCH):
            ids += q.enqueue_many(specs[i:i + BATCH])
        _all_done(q, ids)
        return n / (_last_finish(store, None) - began)


def _read(store: str, sql: str) -> list[tuple]:
    if store.startswith("sqlite:///"):
        import sqlite3

        with contextlib.closing(sqlite3.connect(store[len("sqlite:///"):])) as c:
            return c.execute(sql).fetchall()
    import psycopg

    from queickd.store.postgres.namespace import split_url

    with psycopg.connect(split_url(store)[0]) as c:
        return c.execute(sql).fetchall()


def _hot_starts(store: str) -> list[float]:
    """The start times of the hot key's jobs, as the claims stamped them."""
    return [r[0] for r in _read(store, "SELECT started_at FROM jobs WHERE started_at IS NOT NULL"
                                       " AND rate_limit IS NOT NULL ORDER BY started_at")]


def _others_done(store: str) -> int:
    return _read(store, "SELECT count(*) FROM jobs WHERE rate_limit IS NULL AND state = 'succeeded'")[0][0]


def _clear(pg: str) -> None:
    """A fresh queue on the scratch database, rate keys and their starts included (a key's
    row counts the starts its table holds: one emptied without the other miscounts)."""
    import psycopg

    from queickd.store.postgres.namespace import split_url

    _truncate(pg)
    with psycopg.connect(split_url(pg)[0], autocommit=True) as c:
        if c.execute("SELECT to_regclass('rate_keys') IS NOT NULL").fetchone()[0]:
            c.execute("TRUNCATE rate_keys, rate_starts")


def binding(store: str, daemons: int, with_hot: bool) -> tuple[float, float | None]:
    """(the others' jobs a second, enqueue to last success; the hot key's starts a second
    over WINDOW s, None without it). The hot key's jobs are enqueued first: ahead of the
    others in the queue."""
    with contextlib.ExitStack() as stack:
        ds = [stack.enter_context(Daemon(store)) for _ in range(daemons)]
        q = stack.enter_context(ds[0].client())
        if with_hot:
            hot = [q.job("benchjobs:noop", rate_limit=("hot", HOT_LIMIT, 1.0)) for _ in range(HOT_WAITING)]
            for i in range(0, len(hot), 500):
                q.enqueue_many(hot[i:i + 500])
        began = time.time()
        ids = q.enqueue_many([q.job("benchjobs:noop") for _ in range(OTHERS)])
        enqueued = time.time()
        _all_done(q, ids, 600)
        if _others_done(store) < OTHERS:
            raise RuntimeError("the others ended, not all succeeded")
        others = OTHERS / (_last_finish(store, False) - began)
        if not with_hot:
            return others, None
        # Measured once every job is in (the enqueues' commits compete with the claims
        # for SQLite's writer), past the first window.
        first = enqueued + 1.0
        starts = _hot_starts(store)
        while starts[-1] < first + WINDOW:  # enough starts for the window
            time.sleep(0.5)
            starts = _hot_starts(store)
        return others, sum(1 for t in starts if first <= t < first + WINDOW) / WINDOW


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rates", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller end-to-end runs, one round")
    p.add_argument("--pg", default=os.environ.get("QUEICKD_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"),
                   help="a PostgreSQL server URL for the PostgreSQL rows ('' to skip them)")
    p.add_argument("--rounds", type=int, default=None, help="rounds of each row (alternating arms; medians);"
                   " default 3, quick 1")
    p.add_argument("--only", default=",".join(ROWS), help=f"the rows to run, of {', '.join(ROWS)} (default: all)")
    a = p.parse_args(argv)
    compile_sources(default_queickd_path())
    only = set(a.only.split(","))
    if not only <= set(ROWS):
        p.error(f"--only takes {', '.join(ROWS)}")
    rounds = a.rounds or (1 if a.quick else 3)
    n = 2000 if a.quick else 10000
    print("| measure | store | result |")
    print("|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="queickd-bench-rates-") as tmp, pg_database(a.pg) as pg:
        d = Path(tmp)
        stores = [("SQLite", lambda k: f"sqlite:///{d / f'{k}.db'}", 1)]
        if pg:
            stores.append(("PostgreSQL", lambda k: pg, 2))
        for name, url, _ in stores if "e2e" in only else ():
            plain, limited = [], []
            for r in range(rounds):  # alternating, each run on a fresh store
                for runs, flag in ((plain, False), (limited, True)):
                    if name == "PostgreSQL":
                        _clear(pg)
                    runs.append(e2e(url(f"e{r}{flag}"), n, flag))
            a_, b_ = statistics.median(plain), statistics.median(limited)
            print(f"| end to end, {n} jobs enqueued {BATCH} a call (batched): no rate limits | {name} |"
                  f" {a_:,.0f} jobs/s |")
            print(f"| the same (batched): {KEYS} rate keys, none binding | {name} | {b_:,.0f} jobs/s"
                  f" ({b_ / a_:.2f}x; target >= 0.9x) |")
        for name, url, daemons in stores if "binding" in only else ():
            alones, behind, rates = [], [], []
            for r in range(rounds):  # alternating, each run on a fresh store
                for hot in (False, True):
                    if name == "PostgreSQL":
                        _clear(pg)
                    others, rate = binding(url(f"b{r}{hot}"), daemons, hot)
                    (behind if hot else alones).append(others)
                    if rate is not None:
                        rates.append(rate)
            alone, others, rate = statistics.median(alones), statistics.median(behind), statistics.median(rates)
            procs = f", {daemons} worker processes" if daemons > 1 else ""
            print(f"| {OTHERS} jobs alone, enqueued in one call (batched){procs} | {name} | {alone:,.0f} jobs/s |")
            print(f"| the same (batched) behind {HOT_WAITING:,} jobs of a key limited to {HOT_LIMIT}/s{procs} | {name} |"
                  f" {others:,.0f} jobs/s ({others / alone:.2f}x; target >= 0.9x); the key: {rate:.1f} starts/s"
                  f" over {WINDOW:.0f} s (target {HOT_LIMIT} +- 5) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
