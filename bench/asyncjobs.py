"""The `asyncjobs` scenario: many async jobs at once (`python -m bench.asyncjobs`).

N `benchjobs.asleep(1)` jobs (`await asyncio.sleep(1)`), enqueued by one enqueue_many,
on a daemon started with `--workers 4 --async-jobs N` (SQLite, durability full). Measured:
the wall time from the enqueue to the last job's finish (the client waits for each), and
the daemon's threads at the end (async jobs take no thread each). The goal: 1,000 jobs
finish in 3 s or less. Self-contained; the daemon it starts is killed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from queickd.client import JobQueue  # noqa: E402

GOAL = 3.0  # seconds for 1,000 jobs


def one_round(jobs: int, seconds: float, workers: int, tmp: str) -> tuple[float, int]:
    """-> (seconds from the enqueue to the last finish, the daemon's threads after)."""
    cmd = [sys.executable, "-m", "queickd", "run", "--store", f"sqlite:///{tmp}/q.db", "--port", "0",
           "--app-dir", str(HERE), "--workers", str(workers), "--async-jobs", str(jobs), "--log-level", "info"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    try:
        port = None
        for line in proc.stderr:  # type: ignore[union-attr]
            m = re.search(r"listening on \S+:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        if port is None:
            raise RuntimeError("the daemon did not start")
        with JobQueue("127.0.0.1", port) as q:
            batch = [JobQueue.job("benchjobs:asleep", [seconds]) for _ in range(jobs)]
            began = time.monotonic()
            ids = q.enqueue_many(batch)
            done = [q.wait(i, 120) for i in ids]
            took = time.monotonic() - began
        bad = [j for j in done if j["state"] != "succeeded"]
        if bad:
            raise RuntimeError(f"{len(bad)} jobs did not succeed: {bad[0]}")
        threads = len(os.listdir(f"/proc/{proc.pid}/task"))
        return took, threads
    finally:
        proc.kill()
        proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=1.0, help="each job's asyncio.sleep")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    took = []
    for r in range(a.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            t, threads = one_round(a.jobs, a.seconds, a.workers, tmp)
        took.append(t)
        print(f"round {r + 1}: {a.jobs} x asyncio.sleep({a.seconds:g}) on --workers {a.workers} "
              f"--async-jobs {a.jobs}: {t:.2f} s (daemon threads after: {threads})", flush=True)
    best, worst = min(took), max(took)
    ok = a.jobs != 1000 or a.seconds != 1.0 or worst <= GOAL
    print(f"best {best:.2f} s, worst {worst:.2f} s; goal (1,000 in <= {GOAL:g} s): {'holds' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
