"""The contract of a store shared by a fleet of processes (PostgreSQL), on top of `Store`:
the workers' registry and heartbeats, the schema versions every member must
match, and a connection that LISTENs for wake-ups."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from ..records import Beat
from . import Store


@runtime_checkable
class FleetStore(Store, Protocol):
    """A store shared by a fleet of worker processes (PostgreSQL): a registry of workers
    with heartbeats, schema versions every member must match, and a connection that
    LISTENs for wake-ups. Test for it with isinstance(store, FleetStore); a store that is
    not one is served by one daemon alone."""

    def connect(self, **options: Any) -> Any:
        """A new autocommit connection for LISTEN (the caller closes it); options are the
        driver's (keepalives=1, ...)."""
        ...

    def wake_claimers(self) -> None:
        """Wake every claimer of the fleet (each pool passes): a rate key's window opened
        while the process that held its timer had no free slot, and the others hold none."""
        ...

    def publish_admission(self, limits: Any) -> None:
        """Record the admission limits (core/policy/admission.Admission) this daemon applies,
        for the jobs other connections enqueue in their own transactions."""
        ...

    def direct_counts(self) -> dict[str, int]:
        """Jobs enqueued by applications' own transactions (enqueue(), queickd.pg), by
        state (states with none absent); every other job came through a daemon. Read
        from their own small index."""
        ...

    def versions(self) -> tuple[str | None, int]:
        """(queickd version, schema version) the database was migrated by."""
        ...

    def check_version(self) -> None:
        """Raise if the database was migrated by another queickd version than this one."""
        ...

    def register_worker(self, kind: str, pools: Sequence[str], slots: int, heartbeat: float,
                        refused: str | None = None) -> int:
        """Record this process as a worker serving `pools` (or, with `refused`, why it will
        not); its claims carry the returned id."""
        ...

    def beat(self, max_orphan_requeues: int | None = None, now: float | None = None) -> Beat:
        """Heartbeat: whether this worker's record was still there, and the database's
        versions; with max_orphan_requeues, recover_orphans too, in the same transaction
        (a failed sweep leaves the beat written: Beat.recovered is then None)."""
        ...

    def deregister_worker(self) -> int:
        """Remove this process's record; returns how many jobs it still held running."""
        ...

    def forget_gone_workers(self, older_than: float) -> int:
        """Delete records of workers silent for more than `older_than` seconds."""
        ...

    def workers(self) -> list[dict[str, Any]]:
        """Every registered worker, with `alive` and seconds since its last beat."""
        ...

    def running_without_worker(self) -> int:
        """Running jobs whose worker is gone (what the next orphan sweep re-queues)."""
        ...
