"""The asyncio client against the sync client, no-op jobs end to end.

    PYTHONPATH=$PWD python -m bench.async_client [--jobs 20000] [--rounds 3] [--in-flight 100] [--kinds ...]

Each run starts a fresh queickd (SQLite store, full durability, 4 workers), sends N
`benchjobs.noop` jobs and stops the clock when all N have succeeded. `async`: one
`await noop.aenqueue()` per job from one AsyncJobQueue, --in-flight awaits at a time (each
enqueue carries its automatic idempotency key, as every enqueue does). `sync`: JobQueue's
enqueue_pipelined in chunks of --chunk (the bench's default 1000), the specs as given, with
no key, as its users call it. References beside it, to show what the gap is made of:
`sync-keys`, the same with a key per job as enqueue makes one (the daemon's lookup and
index entry per key); `sync-window`, the same in chunks of --in-flight, as many in flight
as the async client has at most (the daemon commits at most that many at once); and
`sync-window-keys`, both: what the async client asks of the daemon, sent by the sync client.
Each round runs the kinds in a rotated order; prints each run's rate and the client's and
daemon's CPU per job, the medians and the ratios. The client runs in this process.
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

from bench.processes import BENCH_DIR, QueickdDaemon, proc_cpu

sys.path.insert(0, str(BENCH_DIR))
import benchjobs  # noqa: E402  (a top-level module, as the daemon imports it)

from queickd import AsyncJobQueue, JobQueue  # noqa: E402
from queickd.clientwire import _auto_key  # noqa: E402


def _all_done(port: int, n: int, last_id: int) -> None:
    with JobQueue("127.0.0.1", port) as q:
        q.wait(last_id, timeout=600)
        while q.stats()["counts"].get("succeeded", 0) < n:  # the few still running after the last
            time.sleep(0.005)


def run_sync(port: int, n: int, chunk: int, keys: bool = False) -> float:
    with JobQueue("127.0.0.1", port) as q:
        q.stats()  # connected before the clock starts
        t0 = time.perf_counter()
        spec = JobQueue.job(benchjobs.noop)
        ids: list[int] = []
        for i in range(0, n, chunk):
            specs = [dict(spec) for _ in range(min(chunk, n - i))]
            if keys:
                for s in specs:
                    s["idempotency_key"] = _auto_key()
            ids += q.enqueue_pipelined(specs)
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


KINDS = ("sync", "sync-keys", "sync-window", "sync-window-keys", "async")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--in-flight", type=int, default=100)
    p.add_argument("--chunk", type=int, default=1000)
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of: {', '.join(KINDS)}")
    a = p.parse_args(argv)
    kinds = a.kinds.split(",")
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(a.rounds):
        for kind in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
            with tempfile.TemporaryDirectory() as d, QueickdDaemon("sqlite", Path(d), workers=4) as daemon:
                cpu0, daemon0 = time.process_time(), proc_cpu(daemon.pid)
                if kind == "async":
                    rate = run_async(daemon.port, a.jobs, a.in_flight)
                else:
                    rate = run_sync(daemon.port, a.jobs, a.in_flight if "window" in kind else a.chunk,
                                    keys=kind.endswith("-keys"))
                cpu = (time.process_time() - cpu0) / a.jobs * 1e6
                daemon_cpu = (proc_cpu(daemon.pid) - daemon0) / a.jobs * 1e6
                daemon.stop()
            rates[kind].append(rate)
            print(f"round {r + 1} {kind:16}: {rate:8.0f} jobs/s, CPU µs/job: client {cpu:5.1f}, "
                  f"daemon {daemon_cpu:5.0f}", flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print("median jobs/s: " + ", ".join(f"{k} {v:.0f}" for k, v in med.items()))
    if "sync" in med:
        print(", ".join(f"{k} / sync {v / med['sync']:.2f}" for k, v in med.items() if k != "sync")
              + " (goal: async >= 0.90)")
    if "async" in med:
        print(", ".join(f"async / {k} {med['async'] / v:.2f}" for k, v in med.items() if "window" in k))
    return 0


if __name__ == "__main__":
    sys.exit(main())
