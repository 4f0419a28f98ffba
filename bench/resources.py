"""Resource control's costs: end to end with groups and budgets configured but not binding
against the same run without them (SQLite and PostgreSQL); the claim's cost from 10 to
10,000 waiting jobs over 50 groups (it must not scan the queue; on PostgreSQL also the pages
a claim reads, a figure the machine's load does not move); the adaptive pool's idle
cost against a fixed pool of its maximum size.

    python -m bench.resources                 # everything, a few minutes
    python -m bench.resources --quick         # smaller runs, one round
    python -m bench.resources --pg postgresql://postgres@127.0.0.1:5432/postgres
    python -m bench.resources --only e2e --pg ''   # the end-to-end rows alone, SQLite only

PostgreSQL runs use a scratch database made (and dropped) on --pg's server; without a
reachable server they are skipped and say so. Every process started here is killed at the
end; only loopback addresses are used.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.processes import compile_sources, default_queickd_path

BENCH_DIR = Path(__file__).resolve().parent
LISTENING = re.compile(r"listening on (\S+):(\d+)")
GROUPS = 50
ROWS = ("e2e", "claim", "idle")  # what --only may name: end to end, the claim's cost, the idle pool


# --- helpers ------------------------------------------------------------------------------
@contextlib.contextmanager
def pg_database(server: str | None) -> Iterator[str | None]:
    """A scratch database on `server`, dropped at the end; None without a server."""
    if not server:
        yield None
        return
    try:
        import psycopg

        admin = psycopg.connect(server, autocommit=True, connect_timeout=5)
    except Exception as e:  # no driver, no server: the PostgreSQL rows say so
        print(f"# PostgreSQL skipped: {e}".strip(), file=sys.stderr)
        yield None
        return
    name = f"queickd_bench_res_{os.getpid()}"
    admin.execute(f"DROP DATABASE IF EXISTS {name}")
    admin.execute(f"CREATE DATABASE {name}")
    base = server.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()


class Daemon:
    """`python -m queickd run` on a free port, its stderr read on a thread."""

    def __init__(self, store: str, *extra: str, workers: int = 4) -> None:
        self.cmd = [sys.executable, "-m", "queickd", "run", "--store", store, "--port", "0", "--workers",
                    str(workers), "--app-dir", str(BENCH_DIR), "--log-level", "info", *extra]
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def __enter__(self) -> Daemon:
        self.proc = subprocess.Popen(self.cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        ready = threading.Event()

        def read() -> None:
            assert self.proc is not None and self.proc.stderr is not None
            for line in self.proc.stderr:
                m = LISTENING.search(line)
                if m and not ready.is_set():
                    self.port = int(m.group(2))
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(30):
            self.__exit__()
            raise RuntimeError(f"the daemon did not start: {' '.join(self.cmd)}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(5)

    def client(self) -> Any:
        from queickd import JobQueue

        return JobQueue(port=self.port)

    def cpu_and_switches(self) -> tuple[float, int]:
        """(CPU seconds, context switches of every thread) of the daemon so far."""
        assert self.proc is not None
        pid = self.proc.pid
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        switches = 0
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                for line in (task / "status").read_text().splitlines():
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        switches += int(line.split()[1])
        return cpu, switches


def config_file(d: Path, constrained: bool) -> list[str]:
    if not constrained:
        return []
    p = d / "resources.toml"
    groups = "\n".join(f"g{i} = 1000000" for i in range(GROUPS))
    p.write_text(f"[budgets.pools]\ndefault = 1000000\n[budgets.groups]\n{groups}\n")
    return ["--config", str(p)]


# --- end to end ------------------------------------------------------------------------------
def e2e(store: str, n: int, constrained: bool, d: Path) -> float:
    """Jobs per second from the first enqueue to the last success."""
    with Daemon(store, *config_file(d, constrained)) as daemon, daemon.client() as q:
        specs = [q.job("benchjobs:noop", **({"concurrency_group": f"g{i % GROUPS}", "concurrency_limit": 1000,
                                              "cost_units": 1} if constrained else {})) for i in range(n)]
        began = time.perf_counter()
        ids: list[int] = []
        for i in range(0, n, 500):
            ids += q.enqueue_many(specs[i:i + 500])
        q.wait(ids[-1], 600)  # the last in queue order; then the few still running, if any
        while q.stats()["counts"]["succeeded"] < n:
            time.sleep(0.01)
        return n / (time.perf_counter() - began)


# --- claim cost ------------------------------------------------------------------------------
# Pages of the store's tables and indexes this backend's transaction has read (hit or not):
# PostgreSQL's per-transaction counters, flushed only between transactions, so the
# difference across one claim in a batch is what that claim read, whatever the load.
_BLOCKS = ("SELECT coalesce(sum(pg_stat_get_xact_blocks_fetched(oid)), 0)::bigint FROM pg_class"
           " WHERE relnamespace = current_schema()::regnamespace")
BUFFER_CLAIMS = 5  # claims counted for buffers after the timed ones (PostgreSQL)


def claim_cost(store_url: str, waiting: int, limits: Any, full: bool, rounds: int) -> tuple[float, float | None]:
    """(Microseconds per claim of 4 jobs, median buffers read per claim on PostgreSQL, else
    None) with `waiting` jobs over 50 groups (limit 2); `full`: every group already runs its
    limit, and ungrouped jobs come last."""
    from queickd.core.job import NewJob, Outcome, State
    from queickd.core.policy.claim import Request
    from queickd.store import open_store

    s = open_store(store_url)
    pg = store_url.startswith(("postgresql://", "postgres://"))
    try:
        now = time.time()

        def grouped(i: int) -> NewJob:
            return NewJob("benchjobs:noop", run_at=now, concurrency_group=f"g{i % GROUPS}", concurrency_limit=2)

        def claimed(got: list) -> None:
            s.finish_if_running([Outcome(j.id, State.SUCCEEDED) for j in got], now)
            if not full:  # keep the queue as deep as it was
                s.submit([grouped(j.id) for j in got], now)

        if full:
            s.submit([grouped(i) for i in range(2 * GROUPS)], now)
            assert len(s.claim_available(Request.of(2 * GROUPS, limits=limits, now=now))) == 2 * GROUPS
        for i in range(0, waiting, 1000):
            s.submit([grouped(j) for j in range(i, min(waiting, i + 1000))], now)
        if full:
            s.submit([NewJob("benchjobs:noop", run_at=now) for _ in range(4 * (rounds + BUFFER_CLAIMS))], now)
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            got = s.claim_available(Request.of(4, limits=limits, now=now))
            times.append(time.perf_counter() - t0)
            claimed(got)
        buffers = []
        for _ in range(BUFFER_CLAIMS if pg else 0):  # untimed: the counters' reads are round trips more
            with s.transaction() as tx:
                c = tx.conn  # the transaction's connection: the claim's backend
                before = c.execute(_BLOCKS).fetchone()[0]
                got = tx.claim_available(Request.of(4, limits=limits, now=now))
                buffers.append(c.execute(_BLOCKS).fetchone()[0] - before)
            claimed(got)
        return statistics.median(times) * 1e6, statistics.median(buffers) if buffers else None
    finally:
        s.close()


# --- idle cost -------------------------------------------------------------------------------
def idle(store: str, adaptive: bool, seconds: float) -> tuple[float, int]:
    """(CPU ms, context switches) of an idle daemon over `seconds`, after a warm-up."""
    extra = ["--min-workers", "1", "--max-workers", "8"] if adaptive else []
    with Daemon(store, *extra, workers=8) as daemon:
        time.sleep(1.0)
        c0, s0 = daemon.cpu_and_switches()
        time.sleep(seconds)
        c1, s1 = daemon.cpu_and_switches()
    return (c1 - c0) * 1000, s1 - s0


# --- main ------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.resources", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller runs, one round")
    p.add_argument("--pg", default=os.environ.get("QUEICKD_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"),
                   help="a PostgreSQL server URL for the PostgreSQL rows ('' to skip them)")
    p.add_argument("--rounds", type=int, default=None, help="end-to-end rounds (alternating); default 3, quick 1")
    p.add_argument("--only", default=",".join(ROWS),
                   help=f"the rows to run, comma-separated, of {', '.join(ROWS)} (default: all)")
    a = p.parse_args(argv)
    compile_sources(default_queickd_path())
    only = set(a.only.split(","))
    if not only <= set(ROWS):
        p.error(f"--only takes {', '.join(ROWS)}")
    rounds = a.rounds or (1 if a.quick else 3)
    n = 2000 if a.quick else 10000
    from queickd.core.policy.claim import Limits

    limits = Limits(pools={"default": 1e6}, groups={f"g{i}": 1e6 for i in range(GROUPS)})
    print("| measure | store | result |")
    print("|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="queickd-bench-res-") as tmp, pg_database(a.pg) as pg:
        d = Path(tmp)
        stores = [("SQLite", lambda k: f"sqlite:///{d / f'e2e-{k}.db'}")]
        if pg:
            stores.append(("PostgreSQL", lambda k: pg))
        for name, url in stores if "e2e" in only else ():
            plain, limited = [], []
            for r in range(rounds):  # alternating, each run on a fresh store
                if name == "PostgreSQL":
                    _truncate(pg)
                plain.append(e2e(url(f"p{r}"), n, False, d))
                if name == "PostgreSQL":
                    _truncate(pg)
                limited.append(e2e(url(f"l{r}"), n, True, d))
            a_, b_ = statistics.median(plain), statistics.median(limited)
            print(f"| end to end, {n} jobs: unconstrained | {name} | {a_:,.0f} jobs/s |")
            print(f"| end to end: 50 groups + budgets, not binding | {name} | {b_:,.0f} jobs/s"
                  f" ({b_ / a_:.2f}x; target >= 0.9x) |")
        claim_rounds = 50 if a.quick else 200
        for name, url in stores if "claim" in only else ():
            for full in (False, True):
                costs = {}
                # 10 waiting jobs fill only 10 of the 50 groups; from 50 on every group has some:
                # 50 -> 10,000 is the same groups behind a 200 times longer queue.
                for w in (10, GROUPS, 1000, 10000):
                    if name == "PostgreSQL":
                        _truncate(pg)
                    costs[w] = claim_cost(url(f"c{w}{full}") if name == "SQLite" else pg, w, limits, full,
                                          claim_rounds)
                what = "every group full, ungrouped jobs behind" if full else "groups with room"
                us = {w: c[0] for w, c in costs.items()}
                bufs = " / ".join(f"{c[1]:.0f}" for c in costs.values()) if costs[10][1] is not None else ""
                print(f"| claim of 4, {what}: 10 / {GROUPS} / 1,000 / 10,000 waiting | {name} | "
                      f"{us[10]:.0f} / {us[GROUPS]:.0f} / {us[1000]:.0f} / {us[10000]:.0f} us"
                      f" ({us[10000] / us[10]:.2f}x from 10 to 10,000; {us[10000] / us[GROUPS]:.2f}x"
                      f" from {GROUPS}, every group waiting)"
                      + (f"; buffers read per claim (noise-free): {bufs}" if bufs else "") + " |")
        if "idle" not in only:
            return 0
        secs = 3.0 if a.quick else 10.0
        fixed = idle(f"sqlite:///{d / 'idle-f.db'}", False, secs)
        adapt = idle(f"sqlite:///{d / 'idle-a.db'}", True, secs)
        print(f"| idle {secs:.0f} s: fixed pool of 8 | SQLite | {fixed[0]:.0f} ms CPU, {fixed[1]} context switches |")
        print(f"| idle {secs:.0f} s: adaptive 1-8 | SQLite | {adapt[0]:.0f} ms CPU, {adapt[1]} context switches |")
    return 0


def _truncate(url: str | None) -> None:
    import psycopg

    from queickd.store.postgres.namespace import split_url

    with psycopg.connect(split_url(url)[0], autocommit=True) as c:  # in the queue's schema
        exists = c.execute("SELECT to_regclass('jobs') IS NOT NULL").fetchone()[0]
        if exists:
            c.execute("TRUNCATE jobs, footprints, streaks, pauses")


if __name__ == "__main__":
    raise SystemExit(main())
