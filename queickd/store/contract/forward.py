"""Forwarding: an edge daemon's jobs for its upstream daemon (services/forwarder/). Such a
job is stored `held` (never claimed here), becomes `forwarded` once the upstream has it
(its id there kept in upstream_id), and ends in the upstream's final state once that is
known here; a job the upstream refuses ends `dead` here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ...core.job import Job
from .backend import Backend


class Forwarding(Backend, Protocol):
    def held_jobs(self, limit: int, after: int = 0) -> list[Job]:
        """Up to `limit` `held` jobs with an id above `after`, oldest (smallest id) first:
        the order they were accepted in, so each serial key's in its enqueue order."""
        ...

    def held_backlog(self) -> tuple[int, int, float | None]:
        """(jobs, bytes, oldest created_at) of the `held` jobs; bytes are their function's,
        arguments' and keyword arguments' stored lengths."""
        ...

    def mark_forwarded(self, pairs: Sequence[tuple[int, int]]) -> int:
        """Each (job id, upstream id): that job, if still `held`, becomes `forwarded` with
        that upstream id. One transaction. Returns how many changed."""
        ...

    def refuse_held(self, job_id: int, error: dict[str, Any], now: float) -> bool:
        """A `held` job the upstream will never take becomes `dead` with `error`."""
        ...

    def settle_forwarded(self, job_id: int, state: str, result: Any, error: dict[str, Any] | None,
                         finished_at: float | None) -> bool:
        """A `forwarded` job takes the final state (succeeded, dead, cancelled), result and
        error its upstream copy ended with. False if it was not `forwarded`. ValueError for
        a state that is not final."""
        ...

    def forwarded_jobs(self, limit: int, after: int = 0) -> list[tuple[int, int]]:
        """Up to `limit` (job id, upstream id) of `forwarded` jobs with an id above `after`, by id."""
        ...
