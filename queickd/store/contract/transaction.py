"""An open transaction of a store (Lifecycle.transaction): the calls that may share one.

A `Transaction` is bound to its transaction explicitly: its calls run in it, calls made on
the store itself are transactions of their own. Each method is the store method of that
name (queue.py, inspect.py, resources.py say what it does), minus "one transaction": the
enclosing one commits or rolls back all of them together. A store is itself a Transaction
whose every call commits on its own, so code that takes one (a pass's store calls) runs
either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ...core.job import Job, NewJob, Outcome, Submitted
from ...core.policy import claim
from ...core.policy.admission import NO_LIMITS, Admission, Refusal
from ...core.policy.memory import Footprint
from ..records import Finished, Minute


class Transaction(Protocol):
    def submit_requests(
        self, requests: Sequence[Sequence[NewJob]], now: float, admission: Admission = NO_LIMITS
    ) -> list[list[Submitted] | Refusal]: ...

    def submit(self, jobs: Sequence[NewJob], now: float) -> list[Submitted]: ...

    def claim_available(self, request: claim.Request) -> list[Job]: ...

    def finish_if_running(self, outcomes: Sequence[Outcome], now: float, pause_after: int | None = None,
                          pause_cooldown: float | None = None) -> Finished: ...

    def set_progress_if_running(self, updates: Sequence[tuple[int, int, dict[str, Any]]]) -> int: ...

    def add_minute(self, m: Minute) -> None: ...

    def record_runs(self, runs: list[tuple[str, int | None, float, bool, bool]], now: float) -> None: ...

    def release_unstarted(self, job_ids: list[int]) -> int: ...

    # A read in the transaction, on its connection: a read on the store's own connections
    # could wait for a writer that waits for this transaction's row locks.
    def footprints(self, funcs: list[str]) -> dict[str, Footprint]: ...
