"""The `sandbox` scenario: what running jobs in processes costs (`python -m bench.sandbox`).

Rows, in one run, printed as a table with their ratios:
  * e2e: N `benchjobs.append_byte` jobs end to end with 4 workers, `isolation=process` vs
    `thread` on the same daemon (SQLite, durability full), rounds alternating; and huey
    3.5.4's process consumer (`huey_consumer -w 4 -k process`, SqliteHuey fsync=True) on
    the same machine, when a virtualenv holding it is given (--huey-venv or $BENCH_HUEY_VENV).
    Done = the file holds N bytes (one per job), for both.
  * start latency: single jobs one after the other; enqueue -> start p50/p95 from the job
    record (created_at -> started_at, the daemon's clock), process vs thread.
  * idle: the zygote's context switches (wake-ups) per minute while no job runs.
Self-contained (it shares no code with bench/run.py); every process it starts is killed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from queickd import JobQueue  # noqa: E402

HUEY_APP = '''
import benchjobs
from huey import SqliteHuey
huey = SqliteHuey("bench", filename={db!r}, fsync=True)

@huey.task()
def append_byte(path):
    benchjobs.append_byte(path)
'''
HUEY_CLIENT = '''
import sys, hueyjobs
path, n = sys.argv[1], int(sys.argv[2])
for _ in range(n):
    hueyjobs.append_byte(path)
'''


def _wait_line(path: Path, pattern: str, proc: subprocess.Popen, timeout: float = 60) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if m := re.search(pattern, path.read_text()):
            return m
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError(f"no {pattern!r} in {path}:\n{path.read_text()[-2000:]}")


def _wait_bytes(path: Path, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (path.stat().st_size if path.exists() else 0) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} holds {path.stat().st_size if path.exists() else 0} of {n} bytes")
        time.sleep(0.01)


class Daemon:
    def __init__(self, tmp: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QUEICKD_")}
        env["PYTHONPATH"] = str(ROOT)
        self.log = tmp / "queickd.log"
        with open(self.log, "w") as err:  # a file, not a pipe: an unread pipe would block the daemon
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "queickd", "run", "--store", f"sqlite:///{tmp / 'q.db'}", "--port", "0",
                 "--app-dir", str(HERE), "--workers", "4", "--log-level", "info"],
                stderr=err, stdout=subprocess.DEVNULL, env=env, start_new_session=True)
        self.port = int(_wait_line(self.log, r"listening on \S+:(\d+)", self.proc).group(1))

    def client(self) -> JobQueue:
        return JobQueue("127.0.0.1", self.port)

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)


def queickd_e2e(d: Daemon, tmp: Path, n: int, isolation: str) -> float:
    path = tmp / f"e2e-{isolation}-{time.monotonic_ns()}"
    jobs = [JobQueue.job("benchjobs:append_byte", [str(path)], isolation=isolation) for _ in range(n)]
    with d.client() as q:
        began = time.perf_counter()
        for i in range(0, n, 1000):
            q.enqueue_many(jobs[i:i + 1000])
        _wait_bytes(path, n, 600)
        return n / (time.perf_counter() - began)


def start_latency(d: Daemon, n: int, isolation: str) -> tuple[float, float]:
    lat = []
    with d.client() as q:
        for _ in range(n):
            job = q.wait(q.enqueue("benchjobs:noop", isolation=isolation), 30)
            lat.append(job["started_at"] - job["created_at"])
    lat.sort()
    return statistics.median(lat) * 1000, lat[int(len(lat) * 0.95)] * 1000


def huey_e2e(venv: Path, tmp: Path, n: int) -> float:
    work = tmp / f"huey-{time.monotonic_ns()}"
    work.mkdir()
    shutil.copy(HERE / "benchjobs.py", work / "benchjobs.py")
    (work / "hueyjobs.py").write_text(HUEY_APP.format(db=str(work / "huey.db")))
    (work / "client.py").write_text(HUEY_CLIENT)
    path = work / "out"
    log = work / "consumer.log"
    with open(log, "w") as err:
        consumer = subprocess.Popen([str(venv / "bin" / "huey_consumer"), "hueyjobs.huey", "-w", "4", "-k",
                                     "process"], cwd=work, stderr=err, stdout=subprocess.DEVNULL,
                                    start_new_session=True)
    try:
        _wait_line(log, r"(?i)huey consumer started", consumer)
        began = time.perf_counter()
        subprocess.run([str(venv / "bin" / "python"), "client.py", str(path), str(n)], cwd=work, check=True)
        _wait_bytes(path, n, 600)
        return n / (time.perf_counter() - began)
    finally:
        os.killpg(consumer.pid, signal.SIGKILL)
        consumer.wait(10)


def zygote_wakeups(d: Daemon, seconds: float) -> float:
    with d.client() as q:
        q.wait(q.enqueue("benchjobs:noop", isolation="process"), 30)
        pid = q.stats()["sandbox"]["zygote"]["pid"]

    def switches() -> int:
        with open(f"/proc/{pid}/status") as f:
            return sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)

    time.sleep(2)  # the last job's reaping is over
    before = switches()
    time.sleep(seconds)
    return (switches() - before) * 60 / seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sandbox", description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=2000, help="jobs per end-to-end run (default 2000)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--latency-jobs", type=int, default=200)
    p.add_argument("--idle-seconds", type=float, default=60)
    p.add_argument("--huey-venv", default=os.environ.get("BENCH_HUEY_VENV"),
                   help="a virtualenv with huey==3.5.4 (python3 -m venv DIR && DIR/bin/pip install huey==3.5.4)")
    a = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # `timeout` must not leave daemons behind
    rows: dict[str, list[float]] = {"thread": [], "process": [], "huey": []}
    lat: dict[str, list[tuple[float, float]]] = {"thread": [], "process": []}
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as t:
        tmp = Path(t)
        d = Daemon(tmp)
        try:
            queickd_e2e(d, tmp, 200, "process")  # warm: the zygote is up, benchjobs imported
            queickd_e2e(d, tmp, 200, "thread")
            for r in range(a.rounds):
                for iso in ("thread", "process"):
                    rows[iso].append(queickd_e2e(d, tmp, a.jobs, iso))
                if a.huey_venv:
                    rows["huey"].append(huey_e2e(Path(a.huey_venv), tmp, a.jobs))
                print(f"round {r + 1}: " + "  ".join(f"{k} {v[-1]:.0f}/s" for k, v in rows.items() if v),
                      file=sys.stderr, flush=True)
            for iso in ("thread", "process"):
                lat[iso].append(start_latency(d, a.latency_jobs, iso))
            idle = zygote_wakeups(d, a.idle_seconds)
        finally:
            d.close()
    med = {k: statistics.median(v) for k, v in rows.items() if v}
    p50 = {k: statistics.median(x[0] for x in v) for k, v in lat.items()}
    p95 = {k: statistics.median(x[1] for x in v) for k, v in lat.items()}
    out: list[tuple[str, str, str]] = [
        ("e2e append_byte, 4 workers, thread", f"{med['thread']:.0f} jobs/s", ""),
        ("e2e append_byte, 4 workers, process", f"{med['process']:.0f} jobs/s",
         f"{med['process'] / med['thread']:.2f}x thread"),
    ]
    if "huey" in med:
        out.append(("huey 3.5.4 -k process -w 4", f"{med['huey']:.0f} jobs/s",
                    f"process/huey {med['process'] / med['huey']:.2f}x (target >= 2)"))
    out += [
        ("enqueue->start p50 / p95, thread", f"{p50['thread']:.2f} / {p95['thread']:.2f} ms", ""),
        ("enqueue->start p50 / p95, process", f"{p50['process']:.2f} / {p95['process']:.2f} ms",
         f"+{p50['process'] - p50['thread']:.2f} ms (target <= +3)"),
        ("zygote wake-ups while idle", f"{idle:.1f} /min", "(target <= 1)"),
    ]
    w = max(len(r[0]) for r in out)
    print(f"| {'row':<{w}} | value | ratio |\n|{'-' * (w + 2)}|---|---|")
    for row in out:
        print(f"| {row[0]:<{w}} | {row[1]} | {row[2]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
