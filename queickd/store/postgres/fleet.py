"""The PostgreSQL store's records of the fleet (contract.fleet.FleetStore): schema migration
and versions, and the worker registry (who serves which pools, and who still beats). Times
of beats are the database's clock, so hosts whose clocks disagree agree on who is alive.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from ...core.policy.admission import Admission
from ...version import __version__
from ..records import Beat, Recovered
from . import namespace
from .channels import CHANNEL
from .schema import MIGRATE_LOCK, MIGRATIONS, SCHEMA_VERSION, VersionMismatchError, parse_version

log = logging.getLogger("queickd.store")

MISSED_BEATS = 3  # a worker that missed this many heartbeats is gone
DB_NOW = "extract(epoch from clock_timestamp())"
# A worker is alive while its last beat is younger than MISSED_BEATS of its intervals.
ALIVE = f"w.refused IS NULL AND w.beat_at >= {DB_NOW} - {MISSED_BEATS} * w.heartbeat"
# A running job whose worker is gone: no registered worker claimed it, or its record is
# missing or has missed its beats (what the orphan sweep takes).
ORPHANED = ("state = 'running' AND (worker_id IS NULL OR NOT EXISTS"
            f" (SELECT 1 FROM workers w WHERE w.id = jobs.worker_id AND {ALIVE}))")


def notify(c: psycopg.Connection, payload: str, channel: str = CHANNEL) -> None:
    """NOTIFY the channel; delivered when the caller's transaction commits, if it does."""
    c.execute("SELECT pg_notify(%s, %s)", (channel, payload))


def migrate(c: psycopg.Connection, schema: str) -> int:
    """Bring the schema up to date in `c`'s transaction (idempotent; safe with several
    daemons starting at once), the queue's objects in `schema` (namespace.py). Returns the
    schema version. Raises VersionMismatchError when the database was migrated by a newer
    queickd."""
    c.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK,))
    legacy = namespace.enter(c, schema)  # objects not yet in the schema: their place
    version, current = versions(c)
    if current > SCHEMA_VERSION or (version and parse_version(version) > parse_version(__version__)):
        raise VersionMismatchError(
            f"the database was migrated by queickd {version} (schema {current}); this is "
            f"queickd {__version__} (schema {SCHEMA_VERSION}): upgrade this host")
    for at, sql in enumerate(MIGRATIONS[current:], current):
        if legacy and at == namespace.MOVE:
            namespace.leave(c, schema)
        c.execute(sql)
    c.execute(namespace.PIN_FUNCTIONS)  # a function a migration (re)created included
    c.execute("INSERT INTO queickd_meta VALUES ('schema_version', %s), ('queickd_version', %s)"
              " ON CONFLICT (key) DO UPDATE SET value = excluded.value", (str(SCHEMA_VERSION), __version__))
    return SCHEMA_VERSION


def versions(c: Any) -> tuple[str | None, int]:
    """(queickd version, schema version) recorded by the last migration; (None, 0) if
    the database was never migrated."""
    if c.execute("SELECT to_regclass('queickd_meta')").fetchone()[0] is None:
        return None, 0
    return _recorded(c)


def _recorded(c: Any) -> tuple[str | None, int]:
    rows = dict(c.execute("SELECT key, value FROM queickd_meta").fetchall())
    return rows.get("queickd_version"), int(rows.get("schema_version", 0))


def publish_admission(c: psycopg.Connection, limits: Admission) -> None:
    """Record the limits this daemon admits jobs under, for the jobs enqueued by other
    connections' transactions (enqueue_sql.py): the daemon started last is the one whose
    limits they meet."""
    c.execute("INSERT INTO queickd_meta VALUES ('admission', %s)"
              " ON CONFLICT (key) DO UPDATE SET value = excluded.value", (json.dumps(dataclasses.asdict(limits)),))


def check_version(version: str | None, schema: int) -> None:
    """Raise VersionMismatchError unless the database was migrated by this very
    version of queickd (both the package and the schema version must match)."""
    if version != __version__ or schema != SCHEMA_VERSION:
        raise VersionMismatchError(
            f"database is at queickd {version} (schema {schema}), this worker is queickd "
            f"{__version__} (schema {SCHEMA_VERSION})")


def register(c: psycopg.Connection, kind: str, pools: Sequence[str], slots: int, heartbeat: float,
             refused: str | None) -> int:
    """Record this process as a worker serving `pools`; returns its id. A stale record of
    the same host and pid (this pid's previous owner: pids are compared only on their own
    host) is dropped, so its jobs become orphans."""
    host, pid = socket.gethostname(), os.getpid()
    c.execute("DELETE FROM workers WHERE host = %s AND pid = %s", (host, pid))
    return c.execute(
        "INSERT INTO workers (host, pid, pools, slots, version, schema_version, kind, started_at,"
        f" beat_at, heartbeat, refused) VALUES (%s, %s, %s, %s, %s, %s, %s, {DB_NOW}, {DB_NOW}, %s, %s)"
        " RETURNING id",
        (host, pid, list(pools), slots, __version__, SCHEMA_VERSION, kind, heartbeat, refused),
    ).fetchone()[0]


def beat(c: psycopg.Connection, worker_id: int | None,
         sweep: Callable[[psycopg.Connection], Recovered] | None) -> Beat:
    """Heartbeat: our record was still there, and the database's queickd and schema
    versions. A record that is gone (swept as dead after a long stall) is recreated by
    the caller; the jobs it held were re-queued and are no longer ours. With `sweep`, the
    orphan sweep rides in the same transaction (one a beat: an idle fleet's load), under
    a savepoint: a sweep that fails leaves the beat written."""
    recovered = None
    found = c.execute(f"UPDATE workers SET beat_at = {DB_NOW} WHERE id = %s RETURNING id",
                      (worker_id,)).fetchone() is not None
    version, schema = _recorded(c)
    if sweep is not None:
        try:
            with c.transaction():
                recovered = sweep(c)
        except Exception:
            log.exception("orphan sweep failed; the beat stands, the next beat sweeps again")
    return Beat(found, version, schema, recovered)


def deregister(c: psycopg.Connection, worker_id: int) -> int:
    """Remove a worker's record. Returns how many jobs it still held running (they become
    orphans: re-queued by the next sweep anywhere)."""
    held = c.execute("SELECT count(*) FROM jobs WHERE state = 'running' AND worker_id = %s",
                     (worker_id,)).fetchone()[0]
    c.execute("DELETE FROM workers WHERE id = %s", (worker_id,))
    if held:
        notify(c, "r")
    return held


def forget_gone_workers(c: psycopg.Connection, older_than: float) -> int:
    """Delete records of workers silent for more than `older_than` seconds."""
    return c.execute(f"DELETE FROM workers WHERE beat_at < {DB_NOW} - %s", (older_than,)).rowcount


def workers(c: Any) -> list[dict[str, Any]]:
    """Every registered worker, with `alive` and seconds since its last beat."""
    rows = c.execute(
        f"SELECT w.id, w.host, w.pid, w.pools, w.slots, w.version, w.schema_version, w.kind, w.started_at,"
        f" {DB_NOW} - w.beat_at, w.heartbeat, w.refused, {ALIVE},"
        " (SELECT count(*) FROM jobs j WHERE j.state = 'running' AND j.worker_id = w.id)"
        " FROM workers w ORDER BY w.id").fetchall()
    keys = ("id", "host", "pid", "pools", "slots", "version", "schema_version", "kind", "started_at",
            "silent_for", "heartbeat", "refused", "alive", "running")
    return [dict(zip(keys, r, strict=True)) for r in rows]


def running_without_worker(c: Any) -> int:
    """Running jobs whose worker is gone (ORPHANED): those the next orphan sweep re-queues;
    a job of a live worker never counts, however long it runs."""
    return c.execute(f"SELECT count(*) FROM jobs WHERE {ORPHANED}").fetchone()[0]
