"""What some stores can do and others cannot, each a protocol a store implements (test
with isinstance once, when the caller is built: the test reads every member)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

from ...core.job import Job, Outcome
from .transaction import Transaction


@runtime_checkable
class PassInOneCall(Protocol):
    """A store whose round trips cost more than a pass's statements (PostgreSQL): a worker
    pool's steady-state pass is one call."""

    def finish_and_claim(self, outcomes: Sequence[Outcome], now: float, limit: int, network_up: bool = True,
                         pools: Sequence[str] | None = None) -> list[Job] | None:
        """A worker pool's pass in the steady state as one call, in a transaction of its
        own (never inside transaction()): `outcomes`, all successes of jobs outside workflows, as
        finish_if_running stores them, then claim_available(...) of up to `limit` jobs; the
        claimed jobs, in queue order. None: nothing done, the pass goes the general way
        (outcomes it does not take: a failure, a workflow step's job, too many for one
        notification; or a claim that resource control must make)."""
        ...


@runtime_checkable
class ClaimsInSubmit(Protocol):
    """A store whose submit and claim can share one transaction (SQLite: one writer serves
    both): a submit and the worker pool's pass in one, a commit less per job."""

    def claiming_transaction(self) -> AbstractContextManager[Transaction]:
        """transaction(), for submit_requests followed by a worker pool's pass
        (finish_if_running, claim_available) made through its handle, in that order; its
        commit is visible to claims before it is durable: the caller calls flush() before
        acknowledging a submit."""
        ...
