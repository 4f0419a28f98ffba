"""The `sandbox` scenario: what running jobs in processes costs (`python -m bench.sandbox`).

Rows, in one run, printed as a table with their ratios:
  * e2e: N `benchjobs.append_byte` jobs end to end with 4 workers (SQLite, durability
    full), rounds alternating: `isolation=process` with one enqueue per job, the row
    compared with huey 3.5.4's process consumer (`huey_consumer -w 4 -k process`,
    SqliteHuey fsync=True; its client calls the task once per job), when a virtualenv
    holding it is given (--huey-venv or $BENCH_HUEY_VENV); and, labelled batched,
    `isolation=process` vs `thread` on the same daemon from enqueue_many x1000 (what a
    process costs over a thread, the enqueues out of the way). Done = the file holds N
    bytes (one per job), for every target.
  * start latency: single jobs one after the other; enqueue -> start p50/p95 from the job
    record (created_at -> started_at, the daemon's clock), process vs thread.
  * CPU per job: the daemon's and the zygote's CPU time (the zygote's reaped children,
    the jobs' processes, included) over the e2e run, per job, process vs thread.
  * fork floor: a bare fork() + _exit + waitpid loop in a fresh small Python process, the
    floor under any fresh-process-per-job design on this machine, measured each round.
  * idle: the zygote's context switches (wake-ups) per minute while no job runs.
With --tree given more than once (another checkout of queickd, e.g. a base commit's
worktree), each tree gets its own daemon and its rows, the rounds alternating between them.
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

from bench.processes import compile_sources  # noqa: E402
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


FORK_FLOOR = """
import os, resource, sys, time
n = int(sys.argv[1])
began = time.perf_counter()
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
took = time.perf_counter() - began
c = resource.getrusage(resource.RUSAGE_CHILDREN)
print(n / took, (c.ru_utime + c.ru_stime) / n)
"""


def fork_floor(n: int = 1000) -> tuple[float, float]:
    """(forks a second, the child's CPU seconds per fork) of a bare fork + _exit + waitpid."""
    out = subprocess.run([sys.executable, "-c", FORK_FLOOR, str(n)], capture_output=True, text=True, check=True)
    rate, cpu = out.stdout.split()
    return float(rate), float(cpu)


def _cpu(pid: int) -> float:
    """utime + stime + cutime + cstime of a process, in seconds (its reaped children's too)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


class Daemon:
    def __init__(self, tmp: Path, tree: Path = ROOT) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QUEICKD_")}
        env["PYTHONPATH"] = str(tree)
        tmp = tmp / f"d-{time.monotonic_ns()}"
        tmp.mkdir()
        self.log = tmp / "queickd.log"
        with open(self.log, "w") as err:  # a file, not a pipe: an unread pipe would block the daemon
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "queickd", "run", "--store", f"sqlite:///{tmp / 'q.db'}", "--port", "0",
                 "--app-dir", str(HERE), "--workers", "4", "--log-level", "info"],
                stderr=err, stdout=subprocess.DEVNULL, env=env, start_new_session=True,
                cwd=tree)  # `-m` puts the working directory first on sys.path: the tree's own queickd
        self.port = int(_wait_line(self.log, r"listening on \S+:(\d+)", self.proc).group(1))

    def client(self) -> JobQueue:
        return JobQueue("127.0.0.1", self.port)

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)


def queickd_e2e(d: Daemon, tmp: Path, n: int, isolation: str, batched: bool = True) -> tuple[float, float]:
    """(jobs a second, CPU seconds per job of the daemon and the zygote with its children).
    batched: enqueue_many in chunks of 1,000; else one enqueue per job, as huey's client
    calls its task once per job (the row compared with huey)."""
    path = tmp / f"e2e-{isolation}-{time.monotonic_ns()}"
    jobs = [JobQueue.job("benchjobs:append_byte", [str(path)], isolation=isolation) for _ in range(n)]
    with d.client() as q:
        zygote = q.stats()["sandbox"]["zygote"]["pid"]
        cpu = _cpu(d.proc.pid) + (_cpu(zygote) if zygote else 0.0)
        began = time.perf_counter()
        if batched:
            for i in range(0, n, 1000):
                q.enqueue_many(jobs[i:i + 1000])
        else:
            for _ in range(n):
                q.enqueue("benchjobs:append_byte", [str(path)], isolation=isolation)
        _wait_bytes(path, n, 600)
        rate = n / (time.perf_counter() - began)
        time.sleep(0.2)  # the last jobs' reaping and bookkeeping
        if zygote is not None and q.stats()["sandbox"]["zygote"]["pid"] != zygote:
            raise RuntimeError("the zygote was restarted during the run")
        return rate, (_cpu(d.proc.pid) + (_cpu(zygote) if zygote else 0.0) - cpu) / n


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
    p.add_argument("--idle-seconds", type=float, default=60, help="0: no idle row")
    p.add_argument("--fork-floor", type=int, default=1000, help="forks per fork-floor measure (0: none)")
    p.add_argument("--tree", action="append", type=Path, default=[],
                   help="a queickd checkout to run the daemon from (default this one); repeat to compare")
    p.add_argument("--huey-venv", default=os.environ.get("BENCH_HUEY_VENV"),
                   help="a virtualenv with huey==3.5.4 (python3 -m venv DIR && DIR/bin/pip install huey==3.5.4)")
    a = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # `timeout` must not leave daemons behind
    trees = [t.resolve() for t in a.tree] or [ROOT]
    for tree in trees:
        compile_sources(tree)
    names = [t.name if len(trees) > 1 else "" for t in trees]
    rows: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    lat: dict[str, list[tuple[float, float]]] = {}
    idle: dict[str, float] = {}
    floor: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as t:
        tmp = Path(t)
        daemons: list[Daemon] = []
        try:
            for tree in trees:
                daemons.append(Daemon(tmp, tree))
            for d in daemons:
                queickd_e2e(d, tmp, 200, "process")  # warm: the zygote is up, benchjobs imported
                queickd_e2e(d, tmp, 200, "thread")
            for r in range(a.rounds):
                order = list(zip(names, daemons, strict=True))
                for name, d in order if r % 2 == 0 else order[::-1]:  # alternate which goes first
                    for iso in ("thread", "process"):
                        rate, c = queickd_e2e(d, tmp, a.jobs, iso)
                        rows.setdefault(f"{name} {iso}".strip(), []).append(rate)
                        cpu.setdefault(f"{name} {iso}".strip(), []).append(c)
                    rate, _ = queickd_e2e(d, tmp, a.jobs, "process", batched=False)
                    rows.setdefault(f"{name} process-single".strip(), []).append(rate)
                if a.huey_venv:
                    rows.setdefault("huey", []).append(huey_e2e(Path(a.huey_venv), tmp, a.jobs))
                if a.fork_floor:
                    floor.append(fork_floor(a.fork_floor))
                print(f"round {r + 1}: " + "  ".join(f"{k} {v[-1]:.0f}/s" for k, v in rows.items())
                      + (f"  fork floor {floor[-1][0]:.0f}/s" if floor else ""), file=sys.stderr, flush=True)
            for name, d in zip(names, daemons, strict=True):
                for iso in ("thread", "process"):
                    lat[f"{name} {iso}".strip()] = [start_latency(d, a.latency_jobs, iso)] if a.latency_jobs else []
                if a.idle_seconds:
                    idle[name] = zygote_wakeups(d, a.idle_seconds)
        finally:
            for d in daemons:
                d.close()
    med = {k: statistics.median(v) for k, v in rows.items() if v}
    out: list[tuple[str, str, str]] = []
    for name in names:
        th, pr, ps = f"{name} thread".strip(), f"{name} process".strip(), f"{name} process-single".strip()
        label = f" ({name})" if name else ""
        out += [
            (f"e2e append_byte, 4 workers, one enqueue per job, process{label}", f"{med[ps]:.0f} jobs/s", ""),
            (f"batched: e2e, enqueue_many x1000, 4 workers, thread{label}", f"{med[th]:.0f} jobs/s", ""),
            (f"batched: e2e, enqueue_many x1000, 4 workers, process{label}", f"{med[pr]:.0f} jobs/s",
             f"{med[pr] / med[th]:.2f}x thread"),
            (f"CPU per job, thread / process{label}",
             f"{statistics.median(cpu[th]) * 1e3:.2f} / {statistics.median(cpu[pr]) * 1e3:.2f} ms",
             "daemon + zygote + its children"),
        ]
        if "huey" in med:
            out.append((f"process / huey, both one enqueue per job{label}", "",
                        f"{med[ps] / med['huey']:.2f}x (target >= 2)"))
        if floor:
            out.append((f"process (batched) / fork floor{label}", "",
                        f"{med[pr] / statistics.median(f[0] for f in floor):.2f}x"))
        if lat.get(th) and lat.get(pr):
            p50 = {k: statistics.median(x[0] for x in lat[k]) for k in (th, pr)}
            p95 = {k: statistics.median(x[1] for x in lat[k]) for k in (th, pr)}
            out += [
                (f"enqueue->start p50 / p95, thread{label}", f"{p50[th]:.2f} / {p95[th]:.2f} ms", ""),
                (f"enqueue->start p50 / p95, process{label}", f"{p50[pr]:.2f} / {p95[pr]:.2f} ms",
                 f"+{p50[pr] - p50[th]:.2f} ms (target <= +3)"),
            ]
        if name in idle:
            out.append((f"zygote wake-ups while idle{label}", f"{idle[name]:.1f} /min", "(target <= 1)"))
    if "huey" in med:
        out.append(("huey 3.5.4 -k process -w 4, one task call per job", f"{med['huey']:.0f} jobs/s", ""))
    if floor:
        out.append(("fork floor: fork + _exit + waitpid, small Python",
                    f"{statistics.median(f[0] for f in floor):.0f} /s",
                    f"child CPU {statistics.median(f[1] for f in floor) * 1e3:.2f} ms per fork"))
    w = max(len(r[0]) for r in out)
    print(f"| {'row':<{w}} | value | ratio |\n|{'-' * (w + 2)}|---|---|")
    for row in out:
        print(f"| {row[0]:<{w}} | {row[1]} | {row[2]} |")
    print("rounds: " + "; ".join(f"{k} " + ", ".join(f"{x:.0f}" for x in v) for k, v in rows.items())
          + ("; fork floor " + ", ".join(f"{f[0]:.0f}" for f in floor) if floor else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
