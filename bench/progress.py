"""What queickd.progress costs: no-op jobs end to end beside a job that reports, and the
call itself.

    PYTHONPATH=$PWD python -m bench.progress [--jobs 20000] [--rounds 3] [--steps 10000]

Each run starts a fresh queickd (SQLite store, full durability, 4 workers), enqueues one long
job first, then N `benchjobs.noop` jobs (enqueue_pipelined, chunks of 1,000), and stops the
clock when all N no-op jobs have succeeded. The long job is `report_steps` (calls
queickd.progress --steps times, each a new value, --pause seconds apart: about as long as
the run) or `quiet_steps` (the same sleeps, no calls): the two differ by the progress calls
and their writes alone. `noop` runs without a long job; `each` makes every job of the N a
`report_once` (one progress value per job: a row written per job, in batches). Each round
runs the kinds in a rotated order; prints each run's rate, the medians and the ratios, then
the call's own cost in this process (a thread job's CurrentJob over a ProgressWriter whose
store is a memory store, memory://). Figures go to bench/README.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

from bench.processes import BENCH_DIR, QueickdDaemon

sys.path.insert(0, str(BENCH_DIR))
import benchjobs  # noqa: E402  (a top-level module, as the daemon imports it)

from queickd import JobQueue  # noqa: E402

KINDS = ["quiet", "report", "noop", "each"]


def run(port: int, kind: str, n: int, steps: int, pause: float) -> tuple[float, dict]:
    with JobQueue("127.0.0.1", port) as q:
        q.stats()  # connected before the clock starts
        t0 = time.perf_counter()
        long = None
        if kind in ("quiet", "report"):
            fn = benchjobs.report_steps if kind == "report" else benchjobs.quiet_steps
            long = q.enqueue(fn, args=(steps, pause))
        spec = JobQueue.job(benchjobs.report_once if kind == "each" else benchjobs.noop)
        ids: list[int] = []
        for i in range(0, n, 1000):
            ids += q.enqueue_pipelined([dict(spec) for _ in range(min(1000, n - i))])
        q.wait(ids[-1], timeout=600)
        while q.stats()["counts"].get("succeeded", 0) < n:  # the few still running after the last
            time.sleep(0.005)
        rate = n / (time.perf_counter() - t0)
        if long is not None:
            q.wait(long, timeout=600)
        return rate, q.stats()["progress"]


def call_cost() -> tuple[float, float]:
    """µs per progress() call in a thread job: a repeat of the last value, and a change."""
    from queickd.run import context
    from queickd.services.progress import ProgressWriter
    from queickd.store import open_store

    writer = ProgressWriter(open_store("memory://"))
    job = context.CurrentJob(1, 1, None)
    job.progress_to = writer.offer
    token = context.set_job(job)
    try:
        n = 200_000
        same = min(timeit.repeat(lambda: context.progress(5, 10), number=n, repeat=5)) / n * 1e6
        counter = iter(range(10**9))
        changed = min(timeit.repeat(lambda: context.progress(next(counter), 10), number=n, repeat=5)) / n * 1e6
        base = min(timeit.repeat(lambda: next(counter), number=n, repeat=5)) / n * 1e6
        return same, changed - base
    finally:
        context.reset_job(token)
        writer.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=10_000)
    p.add_argument("--pause", type=float, default=0.0002, help="seconds between two steps of the long job")
    a = p.parse_args(argv)
    rates: dict[str, list[float]] = {k: [] for k in KINDS}
    for r in range(a.rounds):
        for kind in KINDS[r % len(KINDS):] + KINDS[:r % len(KINDS)]:
            with tempfile.TemporaryDirectory() as d, QueickdDaemon("sqlite", Path(d), workers=4) as daemon:
                rate, written = run(daemon.port, kind, a.jobs, a.steps, a.pause)
                daemon.stop()
            rates[kind].append(rate)
            print(f"round {r + 1} {kind:6}: {rate:8.0f} no-op jobs/s   progress {written}", flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print("median jobs/s: " + ", ".join(f"{k} {v:.0f}" for k, v in med.items()))
    print(f"report / quiet {med['report'] / med['quiet']:.3f} (goal >= 0.95); quiet / noop "
          f"{med['quiet'] / med['noop']:.3f}; each / noop {med['each'] / med['noop']:.3f}")
    same, changed = call_cost()
    print(f"progress() in a thread job: {same:.2f} µs a repeat, {changed:.2f} µs a change; "
          f"{a.steps:,} changes {a.steps * changed / 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
