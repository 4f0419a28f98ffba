"""The performance goals the benches check (bench.run's on SQLite and memory, bench.pg's on
PostgreSQL): each a ratio of two medians of the same run (or one value against a bound),
printed with whether it holds. Pure: it reads the results and starts nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bench.manyclients import RATE
from bench.peers import HUEY, QUEICK, QUEICKD_MEMORY, QUEICKD_SQLITE
from bench.pgsetup import (
    APP_CPU,
    APP_ENQUEUE,
    APP_INSERT,
    APP_ROW,
    APP_ROW_JOB,
    APP_WALL,
    JOB_ROWS,
    ONE_ROW,
    PGQUEUER,
    QUEICKD_DIRECT,
    QUEICKD_ENQUEUE,
    RAW_LOOPBACK,
    RAW_ROWS,
    queickd_target,
)
from bench.running import E2E_MANY, E2E_SINGLE
from bench.scenarios import RAW_LONE, RAW_LONE_TCP

if TYPE_CHECKING:
    from bench.report import Results

Key = tuple[str, str, str]  # (scenario, target, metric label)


def serial_floor(res: Results) -> float | None:
    """Acks/s of one client waiting for each durable ack: 1 / (lone loopback round trip + lone
    fsync'd commit), both p50s of this run."""
    trip = res.median(("raw-lone-tcp", RAW_LONE_TCP, "lone round trip p50"))
    commit = res.median(("raw-lone-commit", RAW_LONE, "lone commit p50"))
    return 1000.0 / (trip + commit) if trip is not None and commit is not None else None


@dataclass(frozen=True)
class Goal:
    text: str
    value: Key | Callable[[Results], float | None]
    base: Key | Callable[[Results], float | None] | None  # None: `value` itself against the bound
    bound: float
    at_least: bool = True

    def measured(self, res: Results) -> float | None:
        return self.value(res) if callable(self.value) else res.median(self.value)

    def check(self, res: Results) -> str:
        v = self.measured(res)
        if self.base is None:
            b: float | None = 1.0
        elif callable(self.base):
            b = self.base(res)
        else:
            b = res.median(self.base)
        if v is None or not b:
            return f"{self.text}: not measured in this run"
        r = v / b
        holds = r >= self.bound if self.at_least else r <= self.bound
        shown = f"{v:,.1f}" if self.base is None else f"{r:.2f}x"
        return f"{self.text}: {shown}  {'holds' if holds else 'MISSES'}"


def _q(scenario: str, label: str, target: str = QUEICKD_SQLITE) -> Key:
    return (scenario, target, label)


ENQ = "enqueue rate"
GOALS = [
    Goal("many clients, 4 workers: sqlite/full >= 2x Queick", _q("many-clients", RATE),
         _q("many-clients", RATE, QUEICK), 2.0),
    Goal("many clients, enqueue only: sqlite/full >= 1.5x huey", _q("many-clients-enqueue", RATE),
         _q("many-clients-enqueue", RATE, HUEY), 1.5),
    Goal("many clients, enqueue only: sqlite/full >= 0.7x memory", _q("many-clients-enqueue", RATE),
         _q("many-clients-enqueue", RATE, QUEICKD_MEMORY), 0.7),
    Goal("end to end, one enqueue per job: sqlite/full >= 2x Queick", _q("e2e", E2E_SINGLE),
         _q("e2e", E2E_SINGLE, QUEICK), 2.0),
    Goal("end to end, one enqueue per job: sqlite/full >= 2x huey", _q("e2e", E2E_SINGLE),
         _q("e2e", E2E_SINGLE, HUEY), 2.0),
    Goal("end to end, enqueue_many (batched): sqlite/full >= 6x huey one at a time", _q("e2e-many", E2E_MANY),
         _q("e2e", E2E_SINGLE, HUEY), 6.0),
    Goal("one client, one at a time: sqlite/full >= 0.6x the serial floor", _q("enqueue-single", ENQ),
         serial_floor, 0.6),
    Goal("one client, one at a time: memory >= 1.5x Queick", _q("enqueue-single", ENQ, QUEICKD_MEMORY),
         _q("enqueue-single", ENQ, QUEICK), 1.5),
    Goal("pipelined: sqlite/full >= 20x Queick one at a time", _q("enqueue-pipelined", ENQ),
         _q("enqueue-single", ENQ, QUEICK), 20.0),
    Goal("enqueue_many: sqlite/full >= 30x Queick one at a time", _q("enqueue-many", ENQ),
         _q("enqueue-single", ENQ, QUEICK), 30.0),
    Goal("latency p50: sqlite/full <= 0.6x Queick", _q("latency", "enqueue→start p50"),
         _q("latency", "enqueue→start p50", QUEICK), 0.6, at_least=False),
    Goal("latency p99: sqlite/full <= 0.2x Queick", _q("latency", "enqueue→start p99"),
         _q("latency", "enqueue→start p99", QUEICK), 0.2, at_least=False),
    Goal("kill -9: acknowledged jobs never run = 0 (sqlite/full)", _q("crash", "acknowledged, never ran"),
         None, 0.0, at_least=False),
    Goal("SD card, many clients (enqueue only): sqlite/full >= 10x huey", _q("sd-many-clients", RATE),
         _q("sd-many-clients", RATE, HUEY), 10.0),
    Goal("SD card, end to end: sqlite/full >= 5x huey", _q("sd-e2e", E2E_SINGLE), _q("sd-e2e", E2E_SINGLE, HUEY),
         5.0),
]


def _floor_text(res: Results) -> list[str]:
    """What sets the batched aims in this run: the time per job each aim leaves against the
    CPU the daemon and the client spent per job (one after the other: a call waits for its
    replies), and what the same process does with nothing to write."""
    out = []
    queick = res.median(_q("enqueue-single", ENQ, QUEICK))
    for scenario, what, times in (("enqueue-pipelined", "pipelined", 20), ("enqueue-many", "enqueue_many", 30)):
        server = res.median(_q(scenario, "server CPU per job"))
        client = res.median(_q(scenario, "client CPU per job"))
        if queick and server is not None and client is not None:
            aim = times * queick
            out.append(f"{what}: {times}x Queick = {aim:,.0f} jobs/s, {1e6 / aim:.1f} µs a job; the daemon spent "
                       f"{server:.1f} µs of CPU a job and the client {client:.1f}, one after the other")
    huey, memory = res.median(_q("e2e", E2E_SINGLE, HUEY)), res.median(_q("e2e-many", E2E_MANY, QUEICKD_MEMORY))
    if huey and memory:
        out.append(f"end to end, batched: 6x huey = {6 * huey:,.0f} jobs/s; the memory store, the same process "
                   f"with nothing to write, got {memory:,.0f} ({memory / huey:.2f}x huey)")
    return out


def goal_lines(res: Results) -> list[str]:
    """One line per goal whose value was measured in this run, then what sets the batched aims."""
    return [g.check(res) for g in GOALS if g.measured(res) is not None] + _floor_text(res)


# --- PostgreSQL (bench.pg) ------------------------------------------------------------------
def _per_process(scenario: str, label: str, k: int) -> Callable[[Results], float | None]:
    """A queickd fleet's value divided among its processes: the daemon and k workers."""
    def value(res: Results) -> float | None:
        v = res.median((scenario, queickd_target(k), label))
        return None if v is None else v / (k + 1)
    return value


PG_ENQ, PG_IDLE_TX, PG_E2E, PG_BACKEND_CPU = ("enqueue rate", "transactions", "jobs/s",
                                               "CPU per job, its server backends")


def pg_serial_floor(res: Results) -> float | None:
    """Acks/s of one client that waits for each ack from a daemon writing to PostgreSQL:
    1 / (loopback round trip + a bare one-row autocommit insert), both of this run."""
    trip = res.median(("raw", RAW_LOOPBACK, "round trip"))
    rows = res.median(("raw", RAW_ROWS, ONE_ROW))
    return 1e6 / (trip + 1e6 / rows) if trip and rows else None


def _added_by_enqueue(label: str) -> Callable[[Results], float | None]:
    """What enqueueing a job adds to an application's transaction that inserts its own
    row: the transaction with the job less the one without, per transaction."""
    def value(res: Results) -> float | None:
        with_job, alone = res.median(("app-tx", APP_ROW_JOB, label)), res.median(("app-tx", APP_ROW, label))
        return None if with_job is None or alone is None else with_job - alone
    return value


def _app_tx_text(res: Results) -> list[str]:
    """The app transaction's parts, each statement timed alone by the client."""
    insert, enqueue = res.median(("app-tx", APP_ROW_JOB, APP_INSERT)), res.median(("app-tx", APP_ROW_JOB, APP_ENQUEUE))
    wall, cpu = _added_by_enqueue(APP_WALL)(res), _added_by_enqueue(APP_CPU)(res)
    alone_wall, alone_cpu = res.median(("app-tx", APP_ROW, APP_WALL)), res.median(("app-tx", APP_ROW, APP_CPU))
    out = []
    if wall is not None and cpu is not None and alone_wall and alone_cpu:
        out.append(f"in an app transaction: the enqueue adds {wall:.0f} µs of wall time and {cpu:.0f} µs of client+"
                   f"server CPU to a transaction of the app's INSERT alone ({alone_wall:.0f} µs, {alone_cpu:.0f} µs "
                   "of CPU, its COMMIT included)")
    if insert and enqueue is not None:
        out.append(f"in an app transaction, statements alone: the enqueue call {enqueue:.0f} µs of wall time, the "
                   f"app's INSERT {insert:.0f} µs ({enqueue / insert:.2f}x)")
    return out


def _pg_floor_text(res: Results) -> list[str]:
    """What the floors of this run allow against pgqueuer: where an aim is past them."""
    peer_one = res.median(("enqueue-single", PGQUEUER, PG_ENQ))
    peer_batch = res.median(("enqueue-batch", PGQUEUER, PG_ENQ))
    floor = pg_serial_floor(res)
    rows_batch = next((res.median(k) for k in res.metrics if k[:2] == ("raw", RAW_ROWS)
                       and k[2].startswith("rows/s, ") and "one per" not in k[2]), None)
    out = []
    direct, bare = res.median(("enqueue-single", QUEICKD_DIRECT, PG_ENQ)), res.median(("raw", RAW_ROWS, ONE_ROW))
    table = res.median(("raw", RAW_ROWS, JOB_ROWS))
    if direct and bare and table:
        out.append(f"one enqueue at a time on the app's connection: a minimal row of queickd's jobs table alone is "
                   f"{table:,.0f}/s = {table / bare:.2f}x bare rows (the table's width and indexes); queickd.pg is "
                   f"{direct / table:.2f}x that floor")
    if floor and peer_one:
        out.append(f"one enqueue at a time through a daemon: its serial floor is {floor:,.0f} jobs/s = "
                   f"{floor / peer_one:.2f}x pgqueuer (an aim above that is past the floor)")
    if rows_batch and peer_batch:
        out.append(f"1,000 per request: bare rows, {rows_batch:,.0f}/s = {rows_batch / peer_batch:.2f}x pgqueuer")
    server = res.median(("enqueue-batch", QUEICKD_ENQUEUE, PG_BACKEND_CPU))
    if server is not None and peer_batch:
        out.append(f"1,000 per request: 2x pgqueuer leaves {1e6 / (2 * peer_batch):.1f} µs a job; the server "
                   f"alone spent {server:.1f} µs of CPU per queickd row")
    tx1, tx4 = (res.median(("e2e", queickd_target(k), "transactions per job")) for k in (1, 4))
    if tx1 is not None and tx4 is not None:
        out.append(f"end to end: {tx1:.2f} transactions a job with 1 worker process of 4 slots, {tx4:.2f} with 4 "
                   "of 1 slot (a worker claims only what it can start: one of 1 slot, one job a pass)")
        cpu1, cpu4 = (res.median(("e2e", queickd_target(k), PG_BACKEND_CPU)) for k in (1, 4))
        if cpu1 and cpu4 and tx1 and tx4:
            # A pass costs the server about the same for one job as for several: the
            # database CPU per job then goes as the passes per job.
            out.append(f"end to end: server CPU per transaction {cpu1 / tx1:.0f} µs with 1 worker process, "
                       f"{cpu4 / tx4:.0f} with 4; at the same cost a transaction, 4 processes of 1 slot spend "
                       f"{tx4 / tx1:.2f}x the database CPU a job of 1 of 4 slots")
    return out


PG_GOALS = [
    Goal("one enqueue at a time: queickd pg >= 1.5x pgqueuer", ("enqueue-single", QUEICKD_ENQUEUE, PG_ENQ),
         ("enqueue-single", PGQUEUER, PG_ENQ), 1.5),
    Goal("one enqueue at a time: queickd pg >= 0.6x its serial floor", ("enqueue-single", QUEICKD_ENQUEUE, PG_ENQ),
         pg_serial_floor, 0.6),
    Goal("1,000 per request: queickd pg >= 2x pgqueuer", ("enqueue-batch", QUEICKD_ENQUEUE, PG_ENQ),
         ("enqueue-batch", PGQUEUER, PG_ENQ), 2.0),
    Goal("one enqueue at a time, queickd.pg on the app's connection: >= 1.1x pgqueuer",
         ("enqueue-single", QUEICKD_DIRECT, PG_ENQ), ("enqueue-single", PGQUEUER, PG_ENQ), 1.1),
    Goal("one enqueue at a time, queickd.pg on the app's connection: >= 0.8x bare rows, one per statement",
         ("enqueue-single", QUEICKD_DIRECT, PG_ENQ), ("raw", RAW_ROWS, ONE_ROW), 0.8),
    Goal("1,000 per call, queickd.pg on the app's connection: >= 1.5x pgqueuer",
         ("enqueue-batch", QUEICKD_DIRECT, PG_ENQ), ("enqueue-batch", PGQUEUER, PG_ENQ), 1.5),
    Goal("in an app transaction: client+server CPU the enqueue adds <= 1.3x the app's INSERT transaction's",
         _added_by_enqueue(APP_CPU), ("app-tx", APP_ROW, APP_CPU), 1.3, at_least=False),
    Goal("in an app transaction: wall time the enqueue adds <= 1.3x the app's INSERT transaction's",
         _added_by_enqueue(APP_WALL), ("app-tx", APP_ROW, APP_WALL), 1.3, at_least=False),
    Goal("idle, daemon + 1 worker: transactions/min per process <= pgqueuer's", _per_process("idle", PG_IDLE_TX, 1),
         ("idle", PGQUEUER, PG_IDLE_TX), 1.0, at_least=False),
    Goal("idle, daemon + 4 workers: transactions/min per process <= pgqueuer's",
         _per_process("idle", PG_IDLE_TX, 4), ("idle", PGQUEUER, PG_IDLE_TX), 1.0, at_least=False),
    Goal("idle, daemon + 4 workers: connections per process <= 3", _per_process("idle", "connections", 4), None,
         3.0, at_least=False),
    Goal("end to end: 4 worker processes >= 1", ("e2e", queickd_target(4), PG_E2E), ("e2e", queickd_target(1), PG_E2E),
         1.0),
    Goal("end to end: database CPU per job, 4 worker processes <= 1.2x 1",
         ("e2e", queickd_target(4), PG_BACKEND_CPU), ("e2e", queickd_target(1), PG_BACKEND_CPU), 1.2,
         at_least=False),
]


def pg_goal_lines(res: Results) -> list[str]:
    """One line per PostgreSQL goal whose value was measured in this run, then what the
    floors of this run allow."""
    return ([g.check(res) for g in PG_GOALS if g.measured(res) is not None] + _pg_floor_text(res)
            + _app_tx_text(res))
