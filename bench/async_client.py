"""The asyncio client against the sync client, no-op jobs end to end.

    PYTHONPATH=$PWD python -m bench.async_client [--jobs 20000] [--rounds 3] [--in-flight 100]

Each run starts a fresh queickd (SQLite store, full durability, 4 workers), sends N
`benchjobs.noop` jobs and stops the clock when all N have succeeded. `async`: one
`await noop.aenqueue()` per job from one AsyncJobQueue, --in-flight awaits at a time (each
enqueue carries its automatic idempotency key, as every enqueue does). `sync`: JobQueue's
enqueue_pipelined in chunks of --chunk (the bench's default 1000), and `sync-window` in
chunks of --in-flight, as many in flight as the async client has at most (both send the
specs as given, with no key). Each round runs the three in a rotated order; prints each
run's rate and client CPU, the medians and the ratios. The client runs in this process.
Figures go to bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.processes import BENCH_DIR, QueickdDaemon

sys.path.insert(0, str(BENCH_DIR))
import benchjobs  # noqa: E402  (a top-level module, as the daemon imports it)

from queickd import AsyncJobQueue, JobQueue  # noqa: E402


def _all_done(port: int, n: int, last_id: int) -> None:
    with JobQueue("127.0.0.1", port) as q:
        q.wait(last_id, timeout=600)
        while q.stats()["counts"].get("succeeded", 0) < n:  # the few still running after the last
            time.sleep(0.005)


def run_sync(port: int, n: int, chunk: int) -> float:
    with JobQueue("127.0.0.1", port) as q:
        q.stats()  # connected before the clock starts
        t0 = time.perf_counter()
        spec = JobQueue.job(benchjobs.noop)
        ids: list[int] = []
        for i in range(0, n, chunk):
            ids += q.enqueue_pipelined([dict(spec) for _ in range(min(chunk, n - i))])
        _all_done(port, n, ids[-1])
        return n / (time.perf_counter() - t0)


def run_async(port: int, n: int, in_flight: int) -> float:
    async def main() -> float:
        async with AsyncJobQueue("127.0.0.1", port) as q:
            noop = q.task(benchjobs.noop)
            await q.stats()
            t0 = time.perf_counter()
            left = [n]
            last = [0]

            async def sender() -> None:
                while left[0] > 0:
                    left[0] -= 1
                    job = await noop.aenqueue()
                    last[0] = max(last[0], job.id)

            await asyncio.gather(*(sender() for _ in range(in_flight)))
            await asyncio.to_thread(_all_done, port, n, last[0])
            return n / (time.perf_counter() - t0)

    return asyncio.run(main())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--in-flight", type=int, default=100)
    p.add_argument("--chunk", type=int, default=1000)
    a = p.parse_args(argv)
    kinds = ["sync", "sync-window", "async"]
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(a.rounds):
        for kind in kinds[r % 3:] + kinds[:r % 3]:
            with tempfile.TemporaryDirectory() as d, QueickdDaemon("sqlite", Path(d), workers=4) as daemon:
                cpu0 = time.process_time()
                rate = (run_async(daemon.port, a.jobs, a.in_flight) if kind == "async"
                        else run_sync(daemon.port, a.jobs, a.chunk if kind == "sync" else a.in_flight))
                cpu = (time.process_time() - cpu0) / a.jobs * 1e6
                daemon.stop()
            rates[kind].append(rate)
            print(f"round {r + 1} {kind:11}: {rate:8.0f} jobs/s, client CPU {cpu:5.1f} µs/job", flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"median jobs/s: sync (chunks of {a.chunk}) {med['sync']:.0f}, sync-window (chunks of {a.in_flight}) "
          f"{med['sync-window']:.0f}, async ({a.in_flight} in flight) {med['async']:.0f}")
    print(f"async / sync {med['async'] / med['sync']:.2f} (goal >= 0.90); "
          f"async / sync-window {med['async'] / med['sync-window']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
