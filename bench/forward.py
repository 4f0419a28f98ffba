"""An edge daemon forwarding to a central one on loopback: `python -m bench.forward`.

- rate: N no-op jobs enqueued on the edge while its upstream is down (held), then the
  central started: jobs a second from the first forward to the last, against the peer,
  the same jobs enqueued straight into the central by enqueue_many in chunks of the
  forwarder's batch (what forwarding adds is the ratio).
- idle: three daemons left alone side by side, nothing pending: a plain one (no upstream,
  the baseline), an edge whose upstream is reachable (one job forwarded and settled
  before), and an edge whose upstream is down (one job held; its reconnects back off to
  one a minute after about a minute). Wake-ups of the forwarder a minute (its own count),
  and each process group's CPU and context switches a minute against the plain one's.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from .processes import BENCH_DIR, LISTENING, LineWaiter, _clean_env, _kill_group, _spawn, group_usage, log

BATCH = 10_000  # protocol.MAX_BATCH


@contextlib.contextmanager
def _daemon(d: Path, name: str, port: int = 0, upstream: str | None = None,
            workers: int = 1) -> Iterator[tuple[int, subprocess.Popen, LineWaiter]]:
    """A daemon on a fresh SQLite store in d; with `upstream`, the [upstream] section's body."""
    cmd = [sys.executable, "-m", "queickd", "run", "--store", f"sqlite:///{d}/{name}.db", "--bind", "127.0.0.1",
           "--port", str(port), "--workers", str(workers), "--app-dir", str(BENCH_DIR), "--log-level", "info"]
    if upstream is not None:
        (d / f"{name}.toml").write_text(f"[upstream]\n{upstream}")
        cmd += ["--config", str(d / f"{name}.toml")]
    proc = _spawn(cmd, cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                  env=_clean_env(extra_path=True))
    try:
        lines = LineWaiter(proc)
        yield int(lines.wait_for(LISTENING, timeout=120.0).group(2)), proc, lines
    finally:
        _kill_group(proc)
        with contextlib.suppress(Exception):
            proc.wait(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _upstream(port: int, batch: int, retry_max: float) -> str:
    return (f'url = "queickd://127.0.0.1:{port}"\nfunctions = ["benchjobs:*"]\nidentity = "bench-edge"\n'
            f"batch_jobs = {batch}\nretry_max = {retry_max}\n")


def _at(line: str) -> float:
    """The time of a daemon's log line (its asctime, to the millisecond)."""
    stamp, ms = line[:23].split(",")
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(ms) / 1000


def forward_rate(jobs: int, batch: int) -> float:
    """Jobs a second from the edge's first forward to its last, by its log lines' times."""
    from queickd.client import JobQueue

    with tempfile.TemporaryDirectory(prefix="queickd-forward-") as tmp:
        d, central_port = Path(tmp), _free_port()
        with _daemon(d, "edge", upstream=_upstream(central_port, batch, 1.0)) as (edge_port, _, lines):
            with JobQueue("127.0.0.1", edge_port, timeout=600.0) as q:
                for at in range(0, jobs, BATCH):
                    q.enqueue_many([q.job("benchjobs:noop") for _ in range(min(BATCH, jobs - at))])
            with _daemon(d, "central", port=central_port):
                first = lines.wait_for(re.compile(r"reachable; forwarding"), timeout=120.0).string
                last = lines.wait_for(re.compile(r"none held"), timeout=600.0).string
            return jobs / max(0.001, _at(last) - _at(first))


def direct_rate(jobs: int, batch: int) -> float:
    from queickd.client import JobQueue

    with tempfile.TemporaryDirectory(prefix="queickd-forward-") as tmp, _daemon(Path(tmp), "central") as (port, _, _):
        with JobQueue("127.0.0.1", port, timeout=600.0) as q:
            specs = [q.job("benchjobs:noop") for _ in range(jobs)]
            t0 = time.perf_counter()
            for at in range(0, jobs, batch):
                q.enqueue_many(specs[at:at + batch])
            return jobs / (time.perf_counter() - t0)


def idle(warmup: float, seconds: float) -> dict[str, tuple[float, float, float | None]]:
    """{daemon: (CPU ms/min, context switches/min, forwarder wake-ups/min or None)}."""
    from queickd.client import JobQueue

    with tempfile.TemporaryDirectory(prefix="queickd-forward-") as tmp, contextlib.ExitStack() as stack:
        d = Path(tmp)
        central_port, _, _ = stack.enter_context(_daemon(d, "central"))
        procs = {"plain": stack.enter_context(_daemon(d, "plain"))}
        procs["reachable"] = stack.enter_context(_daemon(d, "reachable", upstream=_upstream(central_port, 500, 60.0)))
        procs["unreachable"] = stack.enter_context(_daemon(d, "unreachable",
                                                           upstream=_upstream(_free_port(), 500, 60.0)))
        for name in ("reachable", "unreachable"):
            with JobQueue("127.0.0.1", procs[name][0], timeout=60.0) as q:
                job_id = q.enqueue("benchjobs:noop")
                if name == "reachable":
                    q.wait(job_id, timeout=120.0)  # forwarded, run on the central, settled here
        log(f"idle: {warmup:g} s warm-up, then {seconds:g} s measured")
        time.sleep(warmup)

        def sample() -> dict[str, tuple[float, int, int | None]]:
            out = {}
            for name, (port, proc, _) in procs.items():
                usage = group_usage(proc.pid)
                with JobQueue("127.0.0.1", port, timeout=60.0) as q:  # every daemon asked alike
                    up = q.stats()["upstream"]
                wakes = None if up is None else up["wakeups"]
                out[name] = (sum(u[0] for u in usage.values()), sum(u[1] for u in usage.values()), wakes)
            return out

        a, t0 = sample(), time.monotonic()
        time.sleep(seconds)
        b, t1 = sample(), time.monotonic()
        per_min = 60.0 / (t1 - t0)
        # The stats requests of the samples count in each daemon's own figures alike.
        return {n: ((b[n][0] - a[n][0]) * 1000 * per_min, (b[n][1] - a[n][1]) * per_min,
                    None if a[n][2] is None else (b[n][2] - a[n][2]) * per_min)
                for n in procs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.forward", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=20_000, help="jobs held, then forwarded")
    p.add_argument("--batch", type=int, default=500, help="the forwarder's batch_jobs")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--idle-warmup", type=float, default=70.0, help="seconds before the idle measure "
                   "(the unreachable edge's back-off reaches its minute after about 63 s)")
    p.add_argument("--idle-seconds", type=float, default=60.0)
    p.add_argument("--skip-idle", action="store_true")
    p.add_argument("--skip-rate", action="store_true")
    a = p.parse_args(argv)
    fwd, direct = [], []
    for rnd in range(0 if a.skip_rate else a.rounds):
        fwd.append(forward_rate(a.jobs, a.batch))
        direct.append(direct_rate(a.jobs, a.batch))
        log(f"round {rnd + 1}: forwarded {fwd[-1]:,.0f} jobs/s, direct enqueue_many x{a.batch} {direct[-1]:,.0f} jobs/s")
    if fwd:
        _print_rate(a, statistics.median(fwd), statistics.median(direct))
    if not a.skip_idle:
        _print_idle(a)
    return 0


def _print_rate(a: argparse.Namespace, f: float, dr: float) -> None:
    print(f"\n{a.jobs:,} no-op jobs held on an edge, then forwarded on loopback in batches of {a.batch}; "
          f"median of {a.rounds} round(s)")
    print(f"{'':34}{'jobs/s':>10}{'vs direct':>11}")
    print(f"{'forwarded after a partition':34}{f:10,.0f}{f / dr:11.2f}   goal >= 5,000 jobs/s: "
          f"{'holds' if f >= 5000 else 'MISSED'}")
    print(f"{'direct enqueue_many to the central':34}{dr:10,.0f}{1.0:11.2f}")


def _print_idle(a: argparse.Namespace) -> None:
    res = idle(a.idle_warmup, a.idle_seconds)
    base_cpu, base_cs = res["plain"][0], res["plain"][1]
    print(f"\nidle, {a.idle_seconds:g} s after {a.idle_warmup:g} s, nothing pending")
    print(f"{'daemon':14}{'CPU ms/min':>12}{'vs plain':>10}{'ctx sw/min':>12}{'vs plain':>10}{'fwd wakes/min':>15}")
    for n, (cpu, cs, wakes) in res.items():
        print(f"{n:14}{cpu:12.1f}{cpu / base_cpu if base_cpu else float('nan'):10.2f}{cs:12.1f}"
              f"{cs / base_cs if base_cs else float('nan'):10.2f}{'-' if wakes is None else f'{wakes:.1f}':>15}")
    print("goal: at most 1 forwarder wake-up a minute beyond the plain daemon's idle: "
          + ("holds" if all(w is None or w <= 1.0 for _, _, w in res.values()) else "MISSED"))


if __name__ == "__main__":
    sys.exit(main())
