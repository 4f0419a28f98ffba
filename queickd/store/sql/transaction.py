"""A SQL store's open transaction: the contract.transaction.Transaction its transaction()
yields. Each call runs what the store's own method runs inside its transaction, on the
connection this one is open on, with no BEGIN or COMMIT of its own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...core.job import Job, NewJob, Outcome, Submitted
from ...core.policy import admission as adm
from ...core.policy import claim
from ...core.policy.memory import Footprint
from ..derived import accepted
from ..records import Finished, Minute
from . import operator, stats


class SqlTransaction:
    """Bound to `conn`, used only inside the store's transaction() block; `store`: a SqlStore."""

    __slots__ = ("store", "conn")

    def __init__(self, store: Any, conn: Any) -> None:
        self.store = store
        self.conn = conn

    def submit_requests(
        self, requests: Sequence[Sequence[NewJob]], now: float, admission: adm.Admission = adm.NO_LIMITS
    ) -> list[list[Submitted] | adm.Refusal]:
        s, c = self.store, self.conn
        s.dialect.lock_admission(c)  # a shared store's submit decides on what every other committed
        return s._submit_in(c, requests, now, admission)

    def submit(self, jobs: Sequence[NewJob], now: float) -> list[Submitted]:
        return accepted(self.submit_requests([jobs], now)[0])

    def claim_available(self, request: claim.Request) -> list[Job]:
        return self.store._claim_in(self.conn, request)

    def finish_if_running(self, outcomes: Sequence[Outcome], now: float, pause_after: int | None = None,
                          pause_cooldown: float | None = None) -> Finished:
        if not outcomes:
            return Finished(0, [])
        return self.store._finish_in(self.conn, outcomes, now, pause_after, pause_cooldown)

    def set_progress_if_running(self, updates: Sequence[tuple[int, int, dict[str, Any]]]) -> int:
        if not updates:
            return 0
        return operator.set_progress_if_running(self.store.dialect, self.conn, updates)

    def add_minute(self, m: Minute) -> None:
        stats.add_minute(self.store.dialect, self.conn, m)

    def record_runs(self, runs: list[tuple[str, int | None, float, bool, bool]], now: float) -> None:
        stats.record_runs(self.store.dialect, self.conn, runs, now)

    def release_unstarted(self, job_ids: list[int]) -> int:
        return operator.release_unstarted(self.store.dialect, self.conn, job_ids)

    def footprints(self, funcs: list[str]) -> dict[str, Footprint]:
        return stats.footprints(self.store.dialect, self.conn, funcs)
