"""Fair shares' cost: the claim's time from 10 to 1,000 to 10,000 fair keys with work waiting
(each key 2 jobs, kept so: what a claim starts finishes and is queued again under its key),
against the same claim with as many jobs and no fair key, on SQLite and PostgreSQL. The
claim must walk an index of the keys waiting, never every key or every waiting job: its
cost stays flat as keys grow. On PostgreSQL also the pages a claim reads, a figure the
machine's load does not move.

    python -m bench.fair                 # 200 claims per row
    python -m bench.fair --quick         # 50
    python -m bench.fair --pg ''         # SQLite only

PostgreSQL runs use a scratch database made (and dropped) on --pg's server; without a
reachable server they are skipped and say so.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench.resources import _BLOCKS, BUFFER_CLAIMS, pg_database

KEYS = (10, 1000, 10000)
PER_KEY = 2  # jobs waiting per key
CLAIM = 4  # jobs per claim, as a daemon of 4 workers asks


def claim_cost(store_url: str, keys: int, fair: bool, rounds: int) -> tuple[float, float | None]:
    """(Median microseconds per claim of CLAIM jobs, median pages read per claim on
    PostgreSQL, else None) with `keys` fair keys of PER_KEY jobs each waiting (`fair`), or as
    many jobs without a fair key."""
    from queickd.core.job import NewJob, Outcome, State
    from queickd.core.policy.claim import Request
    from queickd.store import open_store

    s = open_store(store_url)
    pg = store_url.startswith(("postgresql://", "postgres://"))
    try:
        now = time.time()

        def new(key: str | None) -> NewJob:
            return NewJob("benchjobs:noop", run_at=now, fair_by=key)

        def claimed(got: list) -> None:
            s.finish_if_running([Outcome(j.id, State.SUCCEEDED) for j in got], now)
            s.submit([new(j.fair_by) for j in got], now)  # the key keeps its work waiting

        names = [f"tenant-{i:05}" if fair else None for i in range(keys)]
        for i in range(0, keys, 1000):
            s.submit([new(k) for k in names[i:i + 1000] for _ in range(PER_KEY)], now)
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            got = s.claim_available(Request.of(CLAIM, now=now))
            times.append(time.perf_counter() - t0)
            assert len(got) == CLAIM
            claimed(got)
        pages = []
        for _ in range(BUFFER_CLAIMS if pg else 0):  # untimed: the counters' reads are round trips more
            with s.transaction() as tx:
                c = tx.conn
                before = c.execute(_BLOCKS).fetchone()[0]
                got = tx.claim_available(Request.of(CLAIM, now=now))
                pages.append(c.execute(_BLOCKS).fetchone()[0] - before)
            claimed(got)
        return statistics.median(times) * 1e6, statistics.median(pages) if pages else None
    finally:
        s.close()


def _truncate(url: str) -> None:
    import psycopg

    from queickd.store.postgres.namespace import split_url

    with psycopg.connect(split_url(url)[0], autocommit=True) as c:
        if c.execute("SELECT to_regclass('jobs') IS NOT NULL").fetchone()[0]:
            c.execute("TRUNCATE jobs, fair_keys")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fair", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="50 claims per row, not 200")
    p.add_argument("--pg", default=os.environ.get("QUEICKD_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"),
                   help="a PostgreSQL server URL for the PostgreSQL rows ('' to skip them)")
    a = p.parse_args(argv)
    rounds = 50 if a.quick else 200
    print("| measure | store | 10 / 1,000 / 10,000 keys | 10,000 vs 10 |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="queickd-bench-fair-") as tmp, pg_database(a.pg) as pg:
        stores = [("SQLite", lambda k: f"sqlite:///{Path(tmp) / f'{k}.db'}")]
        if pg:
            stores.append(("PostgreSQL", lambda k: pg))
        for name, url in stores:
            rows = {}
            for fair in (True, False):
                for k in KEYS:
                    if name == "PostgreSQL":
                        _truncate(pg)
                    rows[fair, k] = claim_cost(url(f"{fair}{k}"), k, fair, rounds)
            for fair, what in ((True, "fair shares on"), (False, "no fair key, as many jobs")):
                us = [rows[fair, k][0] for k in KEYS]
                pages = [rows[fair, k][1] for k in KEYS]
                extra = ("; pages read per claim " + " / ".join(f"{x:.0f}" for x in pages)) if pages[0] is not None else ""
                print(f"| claim of {CLAIM}, {what}: us | {name} | {' / '.join(f'{x:.0f}' for x in us)}{extra}"
                      f" | {us[-1] / us[0]:.2f}x |")
            ratio = [rows[True, k][0] / rows[False, k][0] for k in KEYS]
            print(f"| fair shares on vs off, same jobs | {name} | {' / '.join(f'{x:.2f}x' for x in ratio)} | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
