"""The store contract, by role: every backend (memory, SQLite, PostgreSQL) implements
`Store`, the union of the roles; a service asks for the roles it uses.

- lifecycle.Lifecycle: ownership, transactions (transaction(), whose handle is a
  transaction.Transaction), durability, close.
- queue.Queue: submit, claim, finish, and giving claimed jobs back.
- schedule.Schedule: scheduled jobs coming due, network parking, crons, outbox delivery.
- operator.Operator: pauses, cancels, retries, purges and retention, pools.
- inspect.Inspect: jobs, counts, pauses, events and per-minute counters, read.
- resources.Resources: memory footprints and cost budgets.
- workflows.Workflows: workflow runs.
- forward.Forwarding: an edge daemon's jobs for its upstream, held and forwarded.
- fleet.FleetStore: a store shared by a fleet of worker processes (PostgreSQL).
- capabilities: what only some stores do (PassInOneCall, ClaimsInSubmit).
A capability or the fleet is a protocol a store implements: test for it with isinstance.

Rules that hold for every method unless its docstring says otherwise:
- Each call is one transaction: it happens entirely or not at all, and when it returns
  the change is as durable as the backend promises (SQLite: on disk per --durability;
  memory: until the process exits). transaction() makes several calls one transaction.
- Methods are safe to call from any thread, concurrently.
- Order among waiting jobs is priority (smaller first), then run_at, then id (insertion).
- Times are unix seconds (wall clock) and are passed in by the caller (`now`), so tests
  control time and stores never read the clock for decisions. One exception: PostgreSQL
  judges a worker's heartbeats by the database's clock, the one clock its hosts share.
Backends stay thin: retry policies, backoff, cron arithmetic and serialisation of results
live in the core, and admission is a plan made by core/policy that the store applies;
a store records what it is told, atomically.
"""

from __future__ import annotations

from typing import Protocol

from .forward import Forwarding
from .inspect import Inspect
from .lifecycle import Lifecycle
from .operator import Operator
from .queue import Queue
from .resources import Resources
from .schedule import Schedule
from .workflows import Workflows

__all__ = ["Forwarding", "Inspect", "Lifecycle", "Operator", "Queue", "Resources", "Schedule", "Store", "Workflows"]


class Store(Lifecycle, Queue, Schedule, Operator, Inspect, Resources, Workflows, Forwarding, Protocol):
    """Every role: what every backend implements."""
