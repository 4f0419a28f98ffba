"""The in-process work that bench/instructions.py counts under valgrind: one probe a run,
`python bench/instrprobes.py PROBE N DIR`, queickd imported from $PYTHONPATH. Each probe
does its setting up, then N units of one kind of work; the counter subtracts a run of N
from a run of 3N, so the setting up (imports, opening the store) cancels out.

  submit-lone    N submits of one job (SQLite, durability normal: no fsync to count)
  submit-batch   N jobs submitted in batches of 1,000
  pass           N passes of the worker pool's store calls: one finish, one claim
  pool           N no-op jobs run end to end by a worker pool of one thread (submits of
                 1,000, then a pass per job: finish, claim, run)
"""

from __future__ import annotations

import os
import sys
import threading
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))


def _store(d: str):
    from queickd.store import open_store

    return open_store(f"sqlite:///{d}/q.db", durability="normal")


def _jobs(n: int, now: float) -> list:
    from queickd.core.job import NewJob

    return [NewJob("benchjobs:noop", run_at=now) for _ in range(n)]


def submit_lone(n: int, d: str) -> None:
    s, now = _store(d), time.time()
    for _ in range(n):
        s.submit(_jobs(1, now), now)


def submit_batch(n: int, d: str) -> None:
    s, now = _store(d), time.time()
    for i in range(0, n, 1000):
        s.submit(_jobs(min(1000, n - i), now), now)


def passes(n: int, d: str) -> None:
    from queickd.core.job import Outcome
    from queickd.core.policy.claim import Request

    s, now = _store(d), time.time()
    for i in range(0, n + 1, 1000):
        s.submit(_jobs(min(1000, n + 1 - i), now), now)
    held = s.claim_available(Request.of(1, now=now))
    for _ in range(n):
        with s.transaction(bookkeeping=True) as tx:
            tx.finish_if_running([Outcome.succeeded(j.id, None) for j in held], now)
            held = tx.claim_available(Request.of(1, now=now))


def pool(n: int, d: str) -> None:
    from queickd.run.loader import FunctionLoader
    from queickd.services.pool_config import PoolConfig, PoolHooks
    from queickd.services.worker import WorkerPool

    s, now = _store(d), time.time()
    done, ran = threading.Event(), [0]

    def finished(outcomes: list) -> None:
        ran[0] += len(outcomes)
        if ran[0] >= n:
            done.set()

    workers = WorkerPool(s, FunctionLoader(BENCH_DIR), PoolConfig(1), PoolHooks(on_finished=finished))
    for i in range(0, n, 1000):
        s.submit(_jobs(min(1000, n - i), now), now)
    workers.start()
    workers.wake()
    if not done.wait(600):
        raise SystemExit(f"only {ran[0]} of {n} jobs ran in 600 s")
    workers.stop(10)


PROBES = {"submit-lone": (submit_lone, "submit"), "submit-batch": (submit_batch, "job"),
          "pass": (passes, "pass"), "pool": (pool, "job")}

if __name__ == "__main__":
    probe, n, d = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    PROBES[probe][0](n, d)
