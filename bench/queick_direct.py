"""An independent check of the bench's Queick end-to-end row: Queick 1.2.1 driven as its
README shows, with none of the bench's machinery.

    python -m bench.queick_direct [--n 5000] [--rounds 3] [--job-module small|benchjobs]
                                  [--no-bytecode]

It starts `VENV/bin/queick` in a fresh directory holding the job module, then runs a client
under `VENV/bin/python` that does what Queick's README does (`from queick import JobQueue`,
`JobQueue().enqueue(func, args=(...))`, one call per job) and times from the first enqueue
until the jobs' output file holds N bytes (each job appends one byte), polled every 2 ms:
the same observation of "ran" the bench makes for every target. The job module is either a
small one a user would write (`small`, the default) or a copy of bench/benchjobs.py (what the
bench sends); `--no-bytecode` sets PYTHONDONTWRITEBYTECODE=1 for Queick's server, so every
import of the job module compiles its source. Prints one line per round and the median.

It never touches port 9999 while another Queick holds it (it waits for it to be free) and
kills the server's whole process group after each round.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_VENV = HERE / ".bench-cache" / "queick-venv"

SMALL_JOBS = '''def append_byte(path):
    with open(path, "ab") as f:
        f.write(b".")
'''

CLIENT = '''import os, sys, time
from queick import JobQueue
from {module} import append_byte

n, path = int(sys.argv[1]), sys.argv[2]
q = JobQueue()
t0 = time.perf_counter()
for _ in range(n):
    q.enqueue(append_byte, args=(path,))
t_sent = time.perf_counter()
# Queick keeps jobs in memory and can drop one: stop at N bytes, or once the file has not
# grown for 2 s (then the rate counts the bytes there are, up to their last growth).
size, t_grew, deadline = -1, time.perf_counter(), time.monotonic() + 300
while time.monotonic() < deadline:
    now_size = os.path.getsize(path) if os.path.exists(path) else 0
    if now_size != size:
        size, t_grew = now_size, time.perf_counter()
    if size >= n or time.perf_counter() - t_grew > 2.0:
        break
    time.sleep(0.002)
print(size / (t_grew - t0), t_sent - t0, t_grew - t0, size)
'''


def _port_free(port: int = 9999) -> bool:
    """Nothing bound to 127.0.0.1:port, read from /proc/net/tcp: a connection closed without
    data would make Queick's receiver leave its accept loop for good."""
    with open("/proc/net/tcp") as f:
        return not any(line.split()[1] == f"0100007F:{port:04X}" for line in f.readlines()[1:])


def _wait_port(free: bool, deadline: float) -> None:
    while _port_free() != free:
        if time.monotonic() > deadline:
            raise SystemExit(f"127.0.0.1:9999 still {'taken' if free else 'closed'}")
        time.sleep(0.05)


def one_round(venv: Path, n: int, module: str, no_bytecode: bool) -> tuple[float, float, float, int]:
    """One fresh Queick server and one client; returns (jobs/s, enqueue s, total s, jobs that
    never ran)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    if no_bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    with tempfile.TemporaryDirectory(prefix="queick-direct-") as tmp:
        d = Path(tmp)
        if module == "small":
            (d / "jobs.py").write_text(SMALL_JOBS)
            modname = "jobs"
        else:
            shutil.copy(HERE / "benchjobs.py", d / "benchjobs.py")
            modname = "benchjobs"
        (d / "client.py").write_text(CLIENT.format(module=modname))
        _wait_port(True, time.monotonic() + 75)
        with open(d / "queick.log", "wb") as logf:
            server = subprocess.Popen([str(venv / "bin" / "queick")], cwd=d, stdout=logf, stderr=subprocess.STDOUT,
                                      env=env, start_new_session=True)
        try:
            _wait_port(False, time.monotonic() + 30)
            out = subprocess.run([str(venv / "bin" / "python"), "client.py", str(n), str(d / "out")], cwd=d,
                                 env=env, capture_output=True, text=True, timeout=400, check=True).stdout
        finally:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        rate, sent, total, size = out.split()
        return float(rate), float(sent), float(total), n - int(size)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--venv", type=Path, default=Path(os.environ.get("BENCH_QUEICK_VENV", DEFAULT_VENV)))
    p.add_argument("--job-module", choices=("small", "benchjobs"), default="small")
    p.add_argument("--no-bytecode", action="store_true")
    a = p.parse_args(argv)
    rates = []
    for i in range(a.rounds):
        rate, sent, total, lost = one_round(a.venv, a.n, a.job_module, a.no_bytecode)
        rates.append(rate)
        print(f"round {i + 1}: {rate:,.0f} jobs/s (enqueued in {sent:.2f} s, ran in {total:.2f} s"
              f"{f', {lost} never ran' if lost else ''})", flush=True)
    print(f"median: {statistics.median(rates):,.0f} jobs/s ({a.job_module} job module"
          f"{', no bytecode' if a.no_bytecode else ''}, {a.n} jobs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
