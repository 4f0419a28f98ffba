"""The measuring side of the benchmarks: one measurement per process, run by bench/run.py.

    python bench/probes.py KIND [options]      # prints one JSON object on the last stdout line

Standard library only at import time, so the same file runs under this project's Python
(queickd's client), under the peer virtualenv's Python (Queick 1.2.1's client) and under
the huey virtualenv's Python (huey 3.5.4, which enqueues straight into its SQLite file). Each
kind imports its client lazily. Every loop is bounded by a count and, where the count
could take long, by a deadline as well.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import socket
import sys
import time
from typing import Any

# Run as a script, sys.path[0] is this directory, so `benchjobs` is a top-level module here
# exactly as the daemons import it (queickd: --app-dir bench/; Queick: a copy in its cwd).
import benchjobs  # noqa: E402
import rawprobes  # noqa: E402  # the raw kinds, beside this file

CLIENT_TIMEOUT = 60.0  # seconds any single request may take before the probe fails


def _cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _written() -> int:
    """Bytes this process has dirtied in files so far (processes.proc_written: this module
    runs under the peers' venvs too, so it reads /proc itself)."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("write_bytes:"))
    except (OSError, StopIteration):
        return 0


def _emit(result: dict[str, Any]) -> None:
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    sys.stdout.flush()


# --- queickd -------------------------------------------------------------------------------------
def queickd_enqueue(a: argparse.Namespace) -> dict[str, Any]:
    """N no-op jobs, one at a time / pipelined in chunks / enqueue_many in chunks."""
    from queickd import JobQueue

    q = JobQueue("127.0.0.1", a.port, timeout=CLIENT_TIMEOUT)
    q.stats()  # connect and hello outside the timed part
    n, chunk = a.n, a.chunk
    ids: list[int] = []
    cpu0, t0 = _cpu_seconds(), time.perf_counter()
    if a.mode == "single":
        for _ in range(n):
            ids.append(q.enqueue(benchjobs.noop))
    else:
        send = q.enqueue_pipelined if a.mode == "pipelined" else q.enqueue_many
        for start in range(0, n, chunk):
            size = min(chunk, n - start)
            ids += send([JobQueue.job(benchjobs.noop) for _ in range(size)])
    elapsed = time.perf_counter() - t0
    cpu = _cpu_seconds() - cpu0
    counts = q.stats()["counts"]
    q.close()
    if len(ids) != n or len(set(ids)) != n:
        raise SystemExit(f"expected {n} distinct job ids, got {len(set(ids))}")
    if counts.get("queued", 0) != n:
        raise SystemExit(f"expected {n} queued jobs in the daemon, stats say {counts}")
    return {"n": n, "seconds": elapsed, "rate": n / elapsed, "client_cpu_s": cpu, "counts": counts}


def queickd_fill(a: argparse.Namespace) -> dict[str, Any]:
    """N far-future jobs with enqueue_many in chunks (the memory/disk scenario)."""
    from queickd import JobQueue

    q = JobQueue("127.0.0.1", a.port, timeout=CLIENT_TIMEOUT)
    q.stats()
    t0 = time.perf_counter()
    stored = 0
    for start in range(0, a.n, a.chunk):
        size = min(a.chunk, a.n - start)
        stored += len(q.enqueue_many([JobQueue.job(benchjobs.noop, delay=a.delay) for _ in range(size)]))
    elapsed = time.perf_counter() - t0
    counts = q.stats()["counts"]
    q.close()
    if stored != a.n or counts.get("scheduled", 0) != a.n:
        raise SystemExit(f"expected {a.n} scheduled jobs, stored {stored}, stats say {counts}")
    return {"n": a.n, "seconds": elapsed, "rate": a.n / elapsed, "counts": counts}


# --- Queick 1.2.1 (run under the peer virtualenv's Python) ----------------------------------
def _queick_client() -> Any:
    from queick import JobQueue  # Queick 1.2.1's client: one TCP connection per job

    return JobQueue()


def queick_enqueue(a: argparse.Namespace) -> dict[str, Any]:
    socket.setdefaulttimeout(CLIENT_TIMEOUT)  # Queick's client sets no timeout of its own
    q = _queick_client()
    failed = 0
    cpu0, t0 = _cpu_seconds(), time.perf_counter()
    for _ in range(a.n):
        # args=() because Queick calls func(*args): its default args=None fails in the worker.
        reply = q.enqueue(benchjobs.noop, args=())
        failed += not (reply and reply.get("success"))
    elapsed = time.perf_counter() - t0
    cpu = _cpu_seconds() - cpu0
    if failed:
        raise SystemExit(f"Queick refused {failed} of {a.n} jobs")
    return {"n": a.n, "seconds": elapsed, "rate": a.n / elapsed, "client_cpu_s": cpu}


def queick_fill(a: argparse.Namespace) -> dict[str, Any]:
    socket.setdefaulttimeout(CLIENT_TIMEOUT)
    q = _queick_client()
    failed = 0
    t0 = time.perf_counter()
    deadline = time.monotonic() + a.max_seconds
    for i in range(a.n):
        reply = q.enqueue_at(time.time() + a.delay, benchjobs.noop, args=())
        failed += not (reply and reply.get("success"))
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up after {i + 1} of {a.n} jobs: over {a.max_seconds:.0f} s")
    elapsed = time.perf_counter() - t0
    if failed:
        raise SystemExit(f"Queick refused {failed} of {a.n} jobs")
    return {"n": a.n, "seconds": elapsed, "rate": a.n / elapsed}


# --- huey 3.5.4 (run under the huey virtualenv's Python) -------------------------------------
def _huey_tasks(a: argparse.Namespace) -> Any:
    """The hueyjobs module run.py wrote into the run's temp dir (the SqliteHuey instance and
    its tasks); the probe runs with that dir as its cwd."""
    sys.path.insert(0, os.path.abspath(a.dir))
    import hueyjobs  # type: ignore[import-not-found]

    return hueyjobs


def huey_enqueue(a: argparse.Namespace) -> dict[str, Any]:
    """N no-op tasks, one task call at a time: each call is one fsync'd insert into the SQLite
    file, done by this process (huey has no server). No consumer runs meanwhile."""
    tasks = _huey_tasks(a)
    tasks.huey.pending_count()  # open the connection and set its pragmas outside the timed part
    cpu0, t0 = _cpu_seconds(), time.perf_counter()
    for _ in range(a.n):
        tasks.noop()
    elapsed = time.perf_counter() - t0
    cpu = _cpu_seconds() - cpu0
    pending = tasks.huey.pending_count()
    if pending != a.n:
        raise SystemExit(f"expected {a.n} tasks in huey's queue, it holds {pending}")
    return {"n": a.n, "seconds": elapsed, "rate": a.n / elapsed, "client_cpu_s": cpu, "pending": pending}


def huey_fill(a: argparse.Namespace) -> dict[str, Any]:
    """N far-future tasks with task.schedule(delay=...), one at a time: huey has no batch
    enqueue, and each call commits on its own (`begin exclusive`), so calls cannot share a
    transaction. Progress goes to stderr about every 10 s."""
    tasks = _huey_tasks(a)
    tasks.huey.pending_count()
    t0 = time.perf_counter()
    deadline, next_report = time.monotonic() + a.max_seconds, time.monotonic() + 10.0
    for i in range(a.n):
        tasks.noop.schedule(delay=a.delay)
        now = time.monotonic()
        if now > deadline:
            raise SystemExit(f"gave up after {i + 1} of {a.n} tasks: over {a.max_seconds:.0f} s")
        if now > next_report:
            print(f"huey-fill: {i + 1:,} of {a.n:,} tasks scheduled", file=sys.stderr, flush=True)
            next_report = now + 10.0
    elapsed = time.perf_counter() - t0
    return {"n": a.n, "seconds": elapsed, "rate": a.n / elapsed}


# --- end to end: N jobs that each append one byte, until the file holds N bytes ---------------
def _wait_size(path: str, n: int, deadline: float) -> int:
    """Poll path's size every 2 ms until it reaches n bytes or the deadline passes."""
    size = 0
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            size = os.path.getsize(path)
        if size >= n:
            return size
        time.sleep(0.002)
    raise SystemExit(f"only {size} of {n} bytes in {path} before the deadline")


def _e2e(a: argparse.Namespace, send_all: Any) -> dict[str, Any]:
    path = os.path.join(os.path.abspath(a.dir), "e2e.out")
    deadline = time.monotonic() + a.max_seconds
    written0, cpu0, t0 = _written(), _cpu_seconds(), time.perf_counter()
    send_all(path)
    t_sent = time.perf_counter()
    cpu = _cpu_seconds() - cpu0
    _wait_size(path, a.n, deadline)
    elapsed = time.perf_counter() - t0
    written = _written() - written0
    time.sleep(0.2)  # anything running twice would show up as extra bytes
    final = os.path.getsize(path)
    return {"n": a.n, "seconds": elapsed, "rate": a.n / elapsed, "enqueue_seconds": t_sent - t0,
            "client_cpu_s": cpu, "client_written": written, "final_bytes": final}


def queickd_e2e(a: argparse.Namespace) -> dict[str, Any]:
    from queickd import JobQueue

    q = JobQueue("127.0.0.1", a.port, timeout=CLIENT_TIMEOUT)
    q.stats()
    last: list[int] = []

    def send_all(path: str) -> None:
        if a.mode == "single":  # as a Queick user writes it: one enqueue per job
            for _ in range(a.n):
                last[:] = [q.enqueue(benchjobs.append_byte, (path,))]
            return
        for start in range(0, a.n, a.chunk):
            size = min(a.chunk, a.n - start)
            last[:] = q.enqueue_many([JobQueue.job(benchjobs.append_byte, (path,)) for _ in range(size)])[-1:]

    out = _e2e(a, send_all)
    job = q.wait(last[0], timeout=30.0)
    out["last_job_state"] = job["state"]
    out["counts"] = q.stats()["counts"]
    q.close()
    return out


def queick_e2e(a: argparse.Namespace) -> dict[str, Any]:
    socket.setdefaulttimeout(CLIENT_TIMEOUT)
    q = _queick_client()

    def send_all(path: str) -> None:
        for _ in range(a.n):
            reply = q.enqueue(benchjobs.append_byte, args=(path,))
            if not (reply and reply.get("success")):
                raise SystemExit(f"Queick refused a job: {reply}")

    return _e2e(a, send_all)


def huey_e2e(a: argparse.Namespace) -> dict[str, Any]:
    import sqlite3

    tasks = _huey_tasks(a)
    retried = [0]

    def send_all(path: str) -> None:
        # The consumer shares the file: on a slow disk a call can fail with "database is
        # locked" (huey's connection waits 5 s at most). A user would retry it, as the
        # many-clients probe does, and it is counted.
        for _ in range(a.n):
            while True:
                try:
                    tasks.append_byte(path)
                    break
                except sqlite3.OperationalError as e:
                    if "locked" not in str(e) or retried[0] >= 1000:
                        raise
                    retried[0] += 1

    out = _e2e(a, send_all)
    out["retried"] = retried[0]
    return out


# --- enqueue -> start latency: single jobs at a fixed interval ---------------------------------
def _latency(a: argparse.Namespace, send: Any) -> dict[str, Any]:
    """send(path, sent_at) enqueues benchjobs.record_latency(path, sent_at), which appends
    time.time() - sent_at when the job starts. One job every --interval seconds."""
    path = os.path.join(os.path.abspath(a.dir), "latency.out")
    t0 = time.monotonic()
    for i in range(a.n):
        pause = t0 + i * a.interval - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        send(path, time.time())
    deadline = time.monotonic() + 30.0
    lines: list[str] = []
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError), open(path) as f:
            lines = [ln for ln in f.read().splitlines() if ln.strip()]
        if len(lines) >= a.n:
            break
        time.sleep(0.01)
    # A target that loses a job (Queick keeps jobs in RAM and drops one now and then) still
    # has the latency of those that ran; the jobs that never ran are a row of their own.
    if not lines:
        raise SystemExit(f"none of {a.n} latency jobs ran within 30 s of the last enqueue")
    ms = sorted(float(x) * 1000.0 for x in lines)

    def pct(p: float) -> float:  # nearest rank
        return ms[min(len(ms), max(1, math.ceil(p / 100.0 * len(ms)))) - 1]

    return {"n": len(ms), "never_ran": a.n - len(ms), "p50_ms": pct(50), "p90_ms": pct(90), "p99_ms": pct(99), "max_ms": ms[-1],
            "min_ms": ms[0], "samples_ms": ms}


def queickd_latency(a: argparse.Namespace) -> dict[str, Any]:
    from queickd import JobQueue

    q = JobQueue("127.0.0.1", a.port, timeout=CLIENT_TIMEOUT)
    q.stats()
    out = _latency(a, lambda path, sent_at: q.enqueue(benchjobs.record_latency, args=(path, sent_at)))
    q.close()
    return out


def queick_latency(a: argparse.Namespace) -> dict[str, Any]:
    socket.setdefaulttimeout(CLIENT_TIMEOUT)
    q = _queick_client()

    def send(path: str, sent_at: float) -> None:
        reply = q.enqueue(benchjobs.record_latency, args=(path, sent_at))
        if not (reply and reply.get("success")):
            raise SystemExit(f"Queick refused a job: {reply}")

    return _latency(a, send)


def huey_latency(a: argparse.Namespace) -> dict[str, Any]:
    tasks = _huey_tasks(a)
    return _latency(a, lambda path, sent_at: tasks.record_latency(path, sent_at))


# --- kill -9 under load: the client side ------------------------------------------------------
def _crash_client(a: argparse.Namespace, send: Any, errors: tuple[type[BaseException], ...]) -> dict[str, Any]:
    """Enqueue benchjobs.append_line(out, token) one at a time; after each acknowledgement
    append the token to acked.txt (flushed, so run.py can count). Stops at the first failed
    request (the daemon was killed), when run.py creates the file `stop`, at --n tokens or
    at --max-seconds."""
    d = os.path.abspath(a.dir)
    out, stop = os.path.join(d, "tokens.out"), os.path.join(d, "stop")
    acked, failure = 0, None
    deadline = time.monotonic() + a.max_seconds
    with open(os.path.join(d, "acked.txt"), "a", buffering=1) as f:
        for i in range(a.n):
            if os.path.exists(stop) or time.monotonic() > deadline:
                break
            token = f"t{i}"
            try:
                send(out, token)
            except errors as e:
                failure = f"{type(e).__name__}: {e}"
                break
            f.write(token + "\n")
            acked += 1
    return {"acked": acked, "stopped_by": failure or "stop file / limit"}


def queickd_crash(a: argparse.Namespace) -> dict[str, Any]:
    from queickd import JobQueue

    q = JobQueue("127.0.0.1", a.port, timeout=10.0)
    q.stats()
    return _crash_client(a, lambda out, tok: q.enqueue(benchjobs.append_line, args=(out, tok)), (Exception,))


def queick_crash(a: argparse.Namespace) -> dict[str, Any]:
    socket.setdefaulttimeout(10.0)
    q = _queick_client()

    def send(out: str, tok: str) -> None:
        reply = q.enqueue(benchjobs.append_line, args=(out, tok))
        if not (reply and reply.get("success")):
            raise RuntimeError(f"Queick refused a job: {reply}")

    return _crash_client(a, send, (Exception,))


def huey_crash(a: argparse.Namespace) -> dict[str, Any]:
    tasks = _huey_tasks(a)
    return _crash_client(a, lambda out, tok: tasks.append_line(out, tok), (Exception,))


KINDS = {
    "queickd-enqueue": queickd_enqueue,
    "queickd-fill": queickd_fill,
    "queick-enqueue": queick_enqueue,
    "queick-fill": queick_fill,
    "huey-enqueue": huey_enqueue,
    "huey-fill": huey_fill,
    "queickd-e2e": queickd_e2e,
    "queick-e2e": queick_e2e,
    "huey-e2e": huey_e2e,
    "queickd-latency": queickd_latency,
    "queick-latency": queick_latency,
    "huey-latency": huey_latency,
    "queickd-crash": queickd_crash,
    "queick-crash": queick_crash,
    "huey-crash": huey_crash,
    "sqlite-commits": rawprobes.sqlite_commits,
    "sqlite-lone-commits": rawprobes.sqlite_lone_commits,
    "tcp-echo-server": rawprobes.tcp_echo_server,
    "tcp-rtt": rawprobes.tcp_rtt,
    "tcp-lone-rtt": rawprobes.tcp_lone_rtt,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="One benchmark measurement (used by bench/run.py).")
    p.add_argument("kind", choices=sorted(KINDS))
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--chunk", type=int, default=1000)
    p.add_argument("--mode", choices=("single", "pipelined", "many"), default="single")
    p.add_argument("--delay", type=float, default=1e7)
    p.add_argument("--dir", default=".")
    p.add_argument("--sync", choices=("FULL", "NORMAL"), default="FULL")
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--max-commits", type=int, default=200_000)
    p.add_argument("--max-trips", type=int, default=2_000_000)
    p.add_argument("--max-seconds", type=float, default=600.0)
    p.add_argument("--interval", type=float, default=0.05, help="seconds between latency jobs")
    a = p.parse_args(argv)
    _emit(KINDS[a.kind](a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
