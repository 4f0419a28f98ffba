"""What the liveness watch (stalled_after) costs: no-op jobs end to end watched and not,
and a progress() call through the watch.

    PYTHONPATH=$PWD python -m bench.liveness [--jobs 20000] [--rounds 3]

Each run starts a fresh queickd (SQLite store, full durability, 4 workers), enqueues N
`benchjobs.noop` jobs (enqueue_pipelined, chunks of 1,000), with `stalled_after=60`
(`watched`: each run told to the watch as it begins and ends) or without (`plain`), and
stops the clock when all N have succeeded. Each round runs the two kinds in a rotated
order; prints each run's rate, the medians and the ratio (goal: watched >= 0.95x plain),
then the cost of a progress() call in a thread job whose sink is the watch's (the job
watched) beside one whose sink is the progress writer itself.
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

KINDS = ["plain", "watched"]


def run(port: int, kind: str, n: int) -> float:
    with JobQueue("127.0.0.1", port) as q:
        q.stats()  # connected before the clock starts
        t0 = time.perf_counter()
        spec = JobQueue.job(benchjobs.noop, stalled_after=60 if kind == "watched" else None)
        ids: list[int] = []
        for i in range(0, n, 1000):
            ids += q.enqueue_pipelined([dict(spec) for _ in range(min(1000, n - i))])
        q.wait(ids[-1], timeout=600)
        while q.stats()["counts"].get("succeeded", 0) < n:  # the few still running after the last
            time.sleep(0.005)
        return n / (time.perf_counter() - t0)


def call_cost() -> tuple[float, float]:
    """µs per changed progress() value in a thread job: straight to the writer, and through
    the liveness watch's sink with the job watched."""
    from queickd.core.job import Job
    from queickd.run import context
    from queickd.services.liveness import LivenessWatch
    from queickd.services.progress import ProgressWriter
    from queickd.store import open_store

    store = open_store("memory://")
    writer = ProgressWriter(store)
    watch = LivenessWatch(store, runner=None, thread=False)  # type: ignore[arg-type]
    watch.began(Job(1, "m:f", [], {}, "running", 0, 0.0, 0.0, 1, 1, None, False, None, None, None, 0, None,
                    None, None, None, None, stalled_after=60.0), False)
    job = context.CurrentJob(1, 1, None)
    token = context.set_job(job)
    counter = iter(range(10**9))
    n = 200_000
    try:
        out = []
        for sink in (writer.offer, watch.sink(writer.offer)):
            job.progress_to = sink
            out.append(min(timeit.repeat(lambda: context.progress(next(counter), 10), number=n, repeat=5)) / n * 1e6)
        return out[0], out[1]
    finally:
        context.reset_job(token)
        writer.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args(argv)
    rates: dict[str, list[float]] = {k: [] for k in KINDS}
    for r in range(a.rounds):
        for kind in KINDS[r % len(KINDS):] + KINDS[:r % len(KINDS)]:
            with tempfile.TemporaryDirectory() as d, QueickdDaemon("sqlite", Path(d), workers=4) as daemon:
                rate = run(daemon.port, kind, a.jobs)
                daemon.stop()
            rates[kind].append(rate)
            print(f"round {r + 1} {kind:7}: {rate:8.0f} no-op jobs/s", flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print("median jobs/s: " + ", ".join(f"{k} {v:.0f}" for k, v in med.items()))
    print(f"watched / plain {med['watched'] / med['plain']:.3f} (goal >= 0.95)")
    plain, watched = call_cost()
    print(f"a changed progress() value in a thread job: {plain:.2f} µs to the writer, {watched:.2f} µs "
          f"through the watch ({watched / plain:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
