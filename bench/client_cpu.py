"""The clients' own CPU per enqueue, against a stub server that answers every request at once.

    PYTHONPATH=$PWD python -m bench.client_cpu [--jobs 50000] [--rounds 3] [--in-flight 100] [--profile KIND]

The stub (a subprocess, so its CPU is not the client's) reads request lines and answers each
with `{"ok":true,"job_id":N}` without parsing it: what is left is the client's work alone,
which on a small machine competes with the daemon for its cores. Kinds: `async` (one
`await noop.aenqueue()` per job from one AsyncJobQueue, --in-flight awaits at a time, as
bench/async_client.py sends them), `sync` (enqueue_pipelined in chunks of 1000, no keys),
`sync-keys` (the same, each spec with a key as `enqueue` makes one). Prints µs of client CPU
per job and jobs/s; --profile KIND runs that kind once under cProfile instead. Figures go to
bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import socket
import statistics
import subprocess
import sys
import time

from bench.processes import BENCH_DIR

sys.path.insert(0, str(BENCH_DIR))
import benchjobs  # noqa: E402

from queickd import AsyncJobQueue, JobQueue  # noqa: E402
from queickd.clientwire import _auto_key  # noqa: E402

_STUB = r"""
import socket, sys, threading
srv = socket.create_server(("127.0.0.1", 0))
print(srv.getsockname()[1], flush=True)
def serve(conn):
    n = 0
    rest = b""
    with conn:
        while data := conn.recv(1 << 16):
            k = data.count(b"\n")
            if k:
                conn.sendall(b"".join(b'{"ok":true,"job_id":%d}\n' % (n + i) for i in range(1, k + 1)))
                n += k
while True:
    c, _ = srv.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


def run_async(port: int, n: int, in_flight: int) -> None:
    async def main() -> None:
        async with AsyncJobQueue("127.0.0.1", port) as q:
            noop = q.task(benchjobs.noop)
            left = [n]

            async def sender() -> None:
                while left[0] > 0:
                    left[0] -= 1
                    await noop.aenqueue()

            await asyncio.gather(*(sender() for _ in range(in_flight)))

    asyncio.run(main())


def run_sync(port: int, n: int, keys: bool) -> None:
    with JobQueue("127.0.0.1", port) as q:
        spec = JobQueue.job(benchjobs.noop)
        for i in range(0, n, 1000):
            specs = [dict(spec) for _ in range(min(1000, n - i))]
            if keys:
                for s in specs:
                    s["idempotency_key"] = _auto_key()
            q.enqueue_pipelined(specs)


def run(kind: str, port: int, n: int, in_flight: int) -> tuple[float, float]:
    """(µs of client CPU per job, jobs/s)."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    if kind == "async":
        run_async(port, n, in_flight)
    else:
        run_sync(port, n, keys=kind == "sync-keys")
    return (time.process_time() - cpu0) / n * 1e6, n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=50_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--in-flight", type=int, default=100)
    p.add_argument("--kinds", default="sync,sync-keys,async", help="comma-separated, of: sync, sync-keys, async")
    p.add_argument("--profile", choices=("async", "sync", "sync-keys"))
    a = p.parse_args(argv)
    stub = subprocess.Popen([sys.executable, "-c", _STUB], stdout=subprocess.PIPE, text=True)
    try:
        port = int(stub.stdout.readline())  # type: ignore[union-attr]
        socket.create_connection(("127.0.0.1", port)).close()
        if a.profile:
            prof = cProfile.Profile()
            prof.runcall(run, a.profile, port, a.jobs, a.in_flight)
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
            return 0
        kinds = a.kinds.split(",")
        cpu: dict[str, list[float]] = {k: [] for k in kinds}
        for r in range(a.rounds):
            for kind in kinds:
                us, rate = run(kind, port, a.jobs, a.in_flight)
                cpu[kind].append(us)
                print(f"round {r + 1} {kind:9}: {us:5.2f} µs/job client CPU, {rate:7.0f} jobs/s", flush=True)
        print("median µs/job: " + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in cpu.items()))
    finally:
        stub.kill()
        stub.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
