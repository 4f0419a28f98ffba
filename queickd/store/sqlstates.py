"""The job states as the SQL stores' statements test them, written once (State.PENDING is
where the waiting states are named). Imports nothing of the stores, so every SQL module
(the workflows' too) can use it. Executes no SQL."""

from __future__ import annotations

from ..core.job import State


def state_any(*states: str) -> str:
    """`state` is one of `states`, as an OR of equalities. PostgreSQL reads each one through
    the partial index that holds that state (a BitmapOr); `state IN (...)` it can match to
    no partial index, and no index holds every state (migration 24): it would scan the
    table. SQLite reads the two forms alike."""
    return "(" + " OR ".join(f"state = '{s}'" for s in states) + ")"


def state_in(*states: str) -> str:
    """The list for `state IN`, where another index leads (jobs_key, jobs_cron,
    jobs_workflow, an id)."""
    return "(" + ", ".join(f"'{s}'" for s in states) + ")"


WAITING_ANY = state_any(*State.PENDING)  # a job still waiting, in any of its three states
WAITING_IN = state_in(*State.PENDING)
UNFINISHED_IN = state_in(*State.PENDING, State.RUNNING)  # waiting or running: the key is taken
UNFINISHED_ANY = state_any(*State.PENDING, State.RUNNING)
