"""One of many concurrent clients (the many-clients scenarios), run by bench/manyclients.py.

    python bench/client_probe.py queickd|queick|huey --dir DIR --index I --n N [--port P] [--job noop|append]

Connects (or opens huey's SQLite file), creates DIR/ready.I, waits for DIR/go, then sends N
jobs one request at a time, each waiting for its ack, and prints one JSON object on the
last stdout line. Standard library only at import time, like probes.py, so it runs under
this project's Python and under each peer venv's Python. Bounded by --max-seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import sqlite3
import sys
import time
from collections.abc import Callable

import benchjobs  # a top-level module here, as the daemons import it

CLIENT_TIMEOUT = 60.0


def _sender(a: argparse.Namespace, out: str) -> Callable[[], None]:
    """A function that enqueues one job and returns once it is acknowledged."""
    func, args = (benchjobs.append_byte, (out,)) if a.job == "append" else (benchjobs.noop, ())
    if a.system == "queickd":
        from queickd import JobQueue

        q = JobQueue("127.0.0.1", a.port, timeout=CLIENT_TIMEOUT)
        q.stats()  # connected and greeted before the start
        return lambda: q.enqueue(func, args)
    if a.system == "queick":
        socket.setdefaulttimeout(CLIENT_TIMEOUT)
        from queick import JobQueue  # Queick 1.2.1: one TCP connection per job

        qk = JobQueue()

        def send() -> None:
            reply = qk.enqueue(func, args=args)
            if not (reply and reply.get("success")):
                raise SystemExit(f"Queick refused a job: {reply}")

        return send
    sys.path.insert(0, a.dir)
    import hueyjobs  # type: ignore[import-not-found]  # written into DIR by the bench

    hueyjobs.huey.pending_count()  # the connection open and its pragmas set before the start
    task = hueyjobs.append_byte if a.job == "append" else hueyjobs.noop
    return lambda: task(*args)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="One of the many-clients scenario's clients.")
    p.add_argument("system", choices=("queickd", "queick", "huey"))
    p.add_argument("--dir", required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--job", choices=("noop", "append"), default="noop")
    p.add_argument("--max-seconds", type=float, default=600.0)
    a = p.parse_args(argv)
    a.dir = os.path.abspath(a.dir)
    send = _sender(a, os.path.join(a.dir, "e2e.out"))
    deadline = time.monotonic() + a.max_seconds
    open(os.path.join(a.dir, f"ready.{a.index}"), "w").close()
    go = os.path.join(a.dir, "go")
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            raise SystemExit("no start signal before the deadline")
        time.sleep(0.001)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    # huey's clients share one SQLite file: under load a call can fail with "database is
    # locked" (its connection waits 5 s at most). A user would retry that call, so do we,
    # and count it.
    retried = 0
    for i in range(a.n):
        while True:
            try:
                send()
                break
            except sqlite3.OperationalError as e:
                if a.system != "huey" or "locked" not in str(e) or retried >= 1000:
                    raise
                retried += 1
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up after {i + 1} of {a.n} jobs: over {a.max_seconds:.0f} s")
    elapsed = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
    sys.stdout.write("\n" + json.dumps({"n": a.n, "seconds": elapsed, "client_cpu_s": cpu, "retried": retried}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
