"""The measuring side of the PostgreSQL benchmarks: one measurement per process, run by
bench/pg.py.

    python bench/pg_probes.py KIND --dsn DSN [options]   # prints one JSON object, last stdout line

KIND is SYSTEM-WHAT: SYSTEM is queickd (runs under this project's Python and talks to the
daemon's port), pgqueuer (runs under the pgqueuer virtualenv's Python: asyncpg) or
procrastinate (under the procrastinate virtualenv's Python: psycopg) or raw (bare rows, no
queue, this project's Python: psycopg), direct (queickd.pg on the probe's own psycopg
connection, no daemon in the way), approw / approwjob (an application's transaction
inserting its own row, without / with a queickd.pg enqueue beside it); WHAT is enqueue,
e2e or crash-client. Standard library only at import time; each kind imports its client
lazily.
Peer probes run in the run's temp dir, which holds benchjobs.py and the peer's app module
(pgqueuer_app.py / procrastinate_app.py), so they enqueue exactly what the peer's workers run.
Every loop is bounded by a count and a deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

CLIENT_TIMEOUT = 60.0  # seconds any single request may take before the probe fails


def _cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _emit(result: dict[str, Any]) -> None:
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    sys.stdout.flush()


def _backend_cpu(pids: list[int]) -> float | None:
    """CPU seconds of these server backends so far (/proc, same machine), None with none."""
    if not pids:
        return None
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # from the state (field 3) on
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _chunks(n: int, size: int) -> list[int]:
    return [min(size, n - start) for start in range(0, n, size)]


# --- what each system offers the probes ---------------------------------------------------------
class Client:
    """One system's enqueue side, as the probes need it. Paths are absolute."""

    async def open(self, a: argparse.Namespace) -> None: ...

    async def close(self) -> None: ...

    async def backend_pids(self) -> list[int]:
        """The server backends this client's requests run on, when it holds them itself."""
        return []

    def timings(self) -> dict[str, Any]:
        """What the client timed itself, beyond the measurement's own clock."""
        return {}

    async def noop(self, n: int) -> int:
        """Enqueue n no-op jobs in one request (n == 1: the system's one-job call)."""
        raise NotImplementedError

    async def append_byte(self, path: str, n: int) -> None:
        """Enqueue n jobs that each append one byte to path, in one request."""
        raise NotImplementedError

    async def append_line_after(self, path: str, token: str, seconds: float) -> None:
        """Enqueue one job that works for `seconds` (a sleep), then appends token and a
        newline to path."""
        raise NotImplementedError

    async def states(self) -> dict[str, int]:
        """Jobs per state, in the system's own words."""
        raise NotImplementedError

    async def unfinished(self) -> int:
        """Jobs not finished yet, as the system's own tables say."""
        raise NotImplementedError


class QueickdClient(Client):
    """queickd's JobQueue against the daemon's port (the daemon writes to PostgreSQL). The
    client is synchronous: it runs in this event loop's thread, one request at a time."""

    async def open(self, a: argparse.Namespace) -> None:
        import benchjobs

        from queickd import JobQueue

        self.jq, self.jobs = JobQueue, benchjobs
        self.q = JobQueue("127.0.0.1", a.port, timeout=CLIENT_TIMEOUT)
        self.q.stats()  # connect and hello outside the timed part

    async def close(self) -> None:
        self.q.close()

    async def noop(self, n: int) -> int:
        if n == 1:
            self.q.enqueue(self.jobs.noop)
            return 1
        return len(self.q.enqueue_many([self.jq.job(self.jobs.noop) for _ in range(n)]))

    async def append_byte(self, path: str, n: int) -> None:
        if n == 1:
            self.q.enqueue(self.jobs.append_byte, args=(path,))
        else:
            self.q.enqueue_many([self.jq.job(self.jobs.append_byte, (path,)) for _ in range(n)])

    async def append_line_after(self, path: str, token: str, seconds: float) -> None:
        self.q.enqueue(self.jobs.append_line_after, args=(path, token, seconds))

    async def unfinished(self) -> int:
        counts = self.q.stats()["counts"]
        return sum(counts.get(k, 0) for k in ("queued", "running", "scheduled", "waiting_network"))

    async def states(self) -> dict[str, int]:
        return {k: v for k, v in self.q.stats()["counts"].items() if v}


class PgqueuerClient(Client):
    """pgqueuer's Queries over one asyncpg connection: enqueue() with a scalar inserts one
    job, with lists inserts them all in one statement."""

    async def open(self, a: argparse.Namespace) -> None:
        import asyncpg
        from pgqueuer import Queries

        self.conn = await asyncpg.connect(a.dsn, timeout=CLIENT_TIMEOUT)
        self.q = Queries.from_asyncpg_connection(self.conn)

    async def close(self) -> None:
        await self.conn.close()

    async def backend_pids(self) -> list[int]:
        return [int(await self.conn.fetchval("SELECT pg_backend_pid()"))]

    async def noop(self, n: int) -> int:
        if n == 1:
            return len(await self.q.enqueue("noop", None))
        return len(await self.q.enqueue(["noop"] * n, [None] * n, [0] * n))

    async def append_byte(self, path: str, n: int) -> None:
        p = path.encode()
        if n == 1:
            await self.q.enqueue("append_byte", p)
        else:
            await self.q.enqueue(["append_byte"] * n, [p] * n, [0] * n)

    async def append_line_after(self, path: str, token: str, seconds: float) -> None:
        await self.q.enqueue("append_line_after", json.dumps([path, token, seconds]).encode())

    async def unfinished(self) -> int:
        # a job's row leaves the queue table when its outcome is logged
        return await self.conn.fetchval("SELECT count(*) FROM pgqueuer")

    async def states(self) -> dict[str, int]:
        rows = await self.conn.fetch("SELECT status::text AS s, count(*) AS n FROM pgqueuer GROUP BY 1")
        logged = await self.conn.fetch("SELECT status::text AS s, count(*) AS n FROM pgqueuer_log "
                                       "WHERE status <> 'queued' AND status <> 'picked' GROUP BY 1")
        return {**{r["s"]: r["n"] for r in rows}, **{f"log:{r['s']}": r["n"] for r in logged}}


class ProcrastinateClient(Client):
    """procrastinate's App (PsycopgConnector, an async pool) from procrastinate_app.py:
    defer_async inserts one job, batch_defer_async many in one statement."""

    async def open(self, a: argparse.Namespace) -> None:
        import procrastinate_app  # type: ignore[import-not-found]

        self.mod = procrastinate_app
        self.app = procrastinate_app.app
        await self.app.open_async()

    async def close(self) -> None:
        await self.app.close_async()

    async def noop(self, n: int) -> int:
        if n == 1:
            await self.mod.noop.defer_async()
            return 1
        return len(await self.mod.noop.batch_defer_async(*({} for _ in range(n))))

    async def append_byte(self, path: str, n: int) -> None:
        if n == 1:
            await self.mod.append_byte.defer_async(path=path)
        else:
            await self.mod.append_byte.batch_defer_async(*({"path": path} for _ in range(n)))

    async def append_line_after(self, path: str, token: str, seconds: float) -> None:
        await self.mod.append_line_after.defer_async(path=path, line=token, seconds=seconds)

    async def unfinished(self) -> int:
        rows = await self.app.connector.execute_query_all_async(
            "SELECT count(*) AS n FROM procrastinate_jobs WHERE status IN ('todo', 'doing')")
        return int(rows[0]["n"])

    async def states(self) -> dict[str, int]:
        rows = await self.app.connector.execute_query_all_async(
            "SELECT task_name || ':' || status AS s, count(*) AS n FROM procrastinate_jobs GROUP BY 1")
        return {r["s"]: int(r["n"]) for r in rows}


class OwnConnection(Client):
    """A client writing through one psycopg connection of its own, in autocommit (the
    probe reads its server backend's CPU); it enqueues jobs nothing runs."""

    def connect(self, a: argparse.Namespace) -> None:
        import psycopg

        self.conn = psycopg.connect(a.dsn, autocommit=True, connect_timeout=int(CLIENT_TIMEOUT))

    async def close(self) -> None:
        self.conn.close()

    async def backend_pids(self) -> list[int]:
        return [self.conn.info.backend_pid]

    async def append_byte(self, path: str, n: int) -> None:
        raise NotImplementedError("enqueue only: nothing runs these jobs")

    async def append_line_after(self, path: str, token: str, seconds: float) -> None:
        raise NotImplementedError("enqueue only: nothing runs these jobs")

    async def states(self) -> dict[str, int]:
        return {"rows": await self.unfinished()}


class RawClient(OwnConnection):
    """No queue: bare rows (a bigserial id and a short text) inserted into a table of their
    own by psycopg in autocommit, one statement per request, the way a queue's client
    that writes to the database itself would at the least. The floor under any of them."""

    async def open(self, a: argparse.Namespace) -> None:
        self.connect(a)
        self.conn.execute("CREATE TABLE IF NOT EXISTS raw_rows (id bigserial PRIMARY KEY, v text)")

    async def noop(self, n: int) -> int:
        if n == 1:
            self.conn.execute("INSERT INTO raw_rows (v) VALUES (%s)", ("noop",))
            return 1
        return self.conn.execute("INSERT INTO raw_rows (v) SELECT unnest(%s::text[])", (["noop"] * n,)).rowcount

    async def unfinished(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM raw_rows").fetchone()[0])


class JobRowClient(OwnConnection):
    """No rules: one minimal row (a queued no-op, every other column at its default) inserted
    into queickd's own jobs table by psycopg in autocommit, its id returned, with no cap and
    no wake-up. What any enqueue into that table that answers with the job's id pays at the
    least: the floor under queickd.pg's own rows (the table's width and indexes)."""

    async def open(self, a: argparse.Namespace) -> None:
        from queickd.store.postgres.namespace import DEFAULT_SCHEMA

        self.connect(a)
        self.table = f"{DEFAULT_SCHEMA}.jobs"

    async def noop(self, n: int) -> int:
        if n != 1:
            raise NotImplementedError("one row per statement only")
        self.conn.execute(f"INSERT INTO {self.table} (state, func, run_at, created_at) VALUES"
                          " ('queued', 'benchjobs:noop', extract(epoch from clock_timestamp()),"
                          " extract(epoch from clock_timestamp())) RETURNING id").fetchone()
        return 1

    async def unfinished(self) -> int:
        return int(self.conn.execute(f"SELECT count(*) FROM {self.table}").fetchone()[0])


def _queickd_pg() -> tuple[Any, str]:
    """queickd.pg, and the no-op job's function name as queickd spells it."""
    import benchjobs

    import queickd.pg
    from queickd.client import func_name

    return queickd.pg, func_name(benchjobs.noop)


class DirectClient(OwnConnection):
    """queickd.pg on the application's own psycopg connection, no daemon in the way: one
    job is one autocommit `enqueue` (a transaction of its own), a batch one `enqueue_many`
    in a transaction of its own. A daemon migrated the schema and published its rules."""

    async def open(self, a: argparse.Namespace) -> None:
        self.pg, self.func = _queickd_pg()
        self.connect(a)

    async def noop(self, n: int) -> int:
        if n == 1:
            self.pg.enqueue(self.conn, self.func)
            return 1
        with self.conn.transaction():
            return len(self.pg.enqueue_many(self.conn, [{"func": self.func}] * n))

    async def unfinished(self) -> int:
        from queickd.store.postgres.namespace import DEFAULT_SCHEMA

        return int(self.conn.execute(f"SELECT count(*) FROM {DEFAULT_SCHEMA}.jobs").fetchone()[0])


class AppRowClient(OwnConnection):
    """An application's transaction: its own row (an order) inserted, and with with_job a
    job enqueued beside it by queickd.pg, then the commit. Each statement is timed apart."""

    with_job = False

    async def open(self, a: argparse.Namespace) -> None:
        self.pg, self.func = _queickd_pg()
        self.connect(a)
        self.conn.execute("CREATE TABLE IF NOT EXISTS app_orders (id bigserial PRIMARY KEY, customer text NOT NULL,"
                          " created_at timestamptz NOT NULL DEFAULT now())")
        self.insert_s = self.enqueue_s = 0.0

    def timings(self) -> dict[str, Any]:
        return {"insert_s": self.insert_s, "enqueue_s": self.enqueue_s}

    async def noop(self, n: int) -> int:
        for _ in range(n):
            with self.conn.transaction():
                t0 = time.perf_counter()
                order = self.conn.execute("INSERT INTO app_orders (customer) VALUES (%s) RETURNING id",
                                          ("c-1",)).fetchone()[0]
                t1 = time.perf_counter()
                if self.with_job:
                    self.pg.enqueue(self.conn, self.func, args=[order])
                    self.enqueue_s += time.perf_counter() - t1
                self.insert_s += t1 - t0
        return n

    async def unfinished(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM app_orders").fetchone()[0])


class AppRowJobClient(AppRowClient):
    with_job = True


CLIENTS: dict[str, type[Client]] = {
    "queickd": QueickdClient, "pgqueuer": PgqueuerClient, "procrastinate": ProcrastinateClient, "raw": RawClient,
    "jobrow": JobRowClient, "direct": DirectClient, "approw": AppRowClient, "approwjob": AppRowJobClient,
}


# --- measurements ---------------------------------------------------------------------------------
async def enqueue(c: Client, a: argparse.Namespace) -> dict[str, Any]:
    """N no-op jobs: one per request (--mode single) or --chunk per request (--mode batch)."""
    sizes = [1] * a.n if a.mode == "single" else _chunks(a.n, a.chunk)
    stored = 0
    pids = await c.backend_pids()
    be0, cpu0, t0 = _backend_cpu(pids), _cpu_seconds(), time.perf_counter()
    for size in sizes:
        stored += await c.noop(size)
    elapsed = time.perf_counter() - t0
    cpu, be1 = _cpu_seconds() - cpu0, _backend_cpu(pids)
    waiting = await c.unfinished()
    if stored != a.n or waiting != a.n:
        raise SystemExit(f"expected {a.n} stored and waiting jobs, got {stored} stored, {waiting} waiting")
    return {"n": a.n, "seconds": elapsed, "rate": a.n / elapsed, "client_cpu_s": cpu,
            "backend_cpu_s": None if be0 is None or be1 is None else be1 - be0, **c.timings()}


async def _wait_size(path: str, n: int, deadline: float) -> int:
    """Poll path's size every 2 ms until it holds n bytes or the deadline passes."""
    size = 0
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            size = os.path.getsize(path)
        if size >= n:
            return size
        await asyncio.sleep(0.002)
    raise SystemExit(f"only {size} of {n} bytes in {path} before the deadline")


async def _wait_drained(c: Client, deadline: float) -> None:
    """Until the system's own tables hold no unfinished job (every outcome committed)."""
    left = -1
    while time.monotonic() < deadline:
        left = await c.unfinished()
        if left == 0:
            return
        await asyncio.sleep(0.005)
    raise SystemExit(f"{left} jobs still unfinished in the database at the deadline")


async def e2e(c: Client, a: argparse.Namespace) -> dict[str, Any]:
    """N jobs that each append one byte to DIR/NAME.out, enqueued in --chunk batches while the
    workers run; timed until the file holds N bytes and no job is unfinished in the database."""
    path = os.path.join(os.path.abspath(a.dir), f"{a.name}.out")
    deadline = time.monotonic() + a.max_seconds
    cpu0, t0 = _cpu_seconds(), time.perf_counter()
    for size in _chunks(a.n, a.chunk):
        await c.append_byte(path, size)
    t_sent = time.perf_counter()
    cpu = _cpu_seconds() - cpu0
    await _wait_size(path, a.n, deadline)
    t_ran = time.perf_counter()
    await _wait_drained(c, deadline)
    elapsed = time.perf_counter() - t0
    await asyncio.sleep(0.2)  # anything running twice would show up as extra bytes
    return {"n": a.n, "seconds": elapsed, "rate": a.n / elapsed, "enqueue_seconds": t_sent - t0,
            "ran_seconds": t_ran - t0, "client_cpu_s": cpu, "final_bytes": os.path.getsize(path)}


async def crash_client(c: Client, a: argparse.Namespace) -> dict[str, Any]:
    """Enqueue append_line_after(DIR/tokens.out, token, --job-seconds) one at a time, appending each acknowledged
    token to DIR/acked.txt (line-buffered, so pg.py can count). Stops at --n tokens, when the
    file DIR/stop appears, or at --max-seconds."""
    d = os.path.abspath(a.dir)
    out, stop = os.path.join(d, "tokens.out"), os.path.join(d, "stop")
    acked = 0
    deadline = time.monotonic() + a.max_seconds
    with open(os.path.join(d, "acked.txt"), "a", buffering=1) as f:
        for i in range(a.n):
            if os.path.exists(stop) or time.monotonic() > deadline:
                break
            token = f"t{i}"
            await c.append_line_after(out, token, a.job_seconds)
            f.write(token + "\n")
            acked += 1
    return {"acked": acked}


async def unfinished(c: Client, a: argparse.Namespace) -> dict[str, Any]:
    return {"unfinished": await c.unfinished(), "states": await c.states()}


MEASUREMENTS: dict[str, Callable[[Client, argparse.Namespace], Awaitable[dict[str, Any]]]] = {
    "enqueue": enqueue, "e2e": e2e, "crash-client": crash_client, "unfinished": unfinished,
}
KINDS = sorted(f"{system}-{what}" for system in CLIENTS for what in MEASUREMENTS)


async def _run(a: argparse.Namespace) -> dict[str, Any]:
    system, _, what = a.kind.partition("-")
    client = CLIENTS[system]()
    await client.open(a)
    try:
        return await MEASUREMENTS[what](client, a)
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="One PostgreSQL benchmark measurement (used by bench/pg.py).")
    p.add_argument("kind", choices=KINDS)
    p.add_argument("--dsn", required=True, help="the run's database (peers connect to it directly)")
    p.add_argument("--port", type=int, default=0, help="queickd daemon's port")
    p.add_argument("--dir", default=".", help="the run's temp dir (output files)")
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--chunk", type=int, default=1000)
    p.add_argument("--mode", choices=("single", "batch"), default="single")
    p.add_argument("--name", default="e2e", help="output file name (without .out) for e2e")
    p.add_argument("--max-seconds", type=float, default=600.0)
    p.add_argument("--job-seconds", type=float, default=0.05, help="how long each crash job works")
    a = p.parse_args(argv)
    # the peers' app modules and benchjobs.py live in the run dir (the cwd); queickd's client
    # gets bench/ on sys.path, where this file is
    sys.path.insert(0, os.getcwd())
    _emit(asyncio.run(_run(a)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
