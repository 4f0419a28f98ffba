"""Outcomes stored one by one after a failed batch (services/outcomes.py), on a real memory store."""

import time

from store_contract import job

from queickd.core.job import Outcome, State
from queickd.core.policy.claim import Request
from queickd.services.outcomes import store_one_by_one
from queickd.store.sqlite.inmemory import IN_MEMORY
from queickd.store.sqlite.store import SQLiteStore


class Refuses(SQLiteStore):
    """Refuses, as a bug would, any outcome carrying a result of "bad"; with `down`, is
    unavailable as a lost connection is."""

    UNAVAILABLE = (ConnectionError,)

    def __init__(self) -> None:
        super().__init__(IN_MEMORY)
        self.down = False

    def finish_if_running(self, outcomes, now, *a, **kw):
        if self.down:
            raise ConnectionError("the store went away")
        if any(o.result == "bad" for o in outcomes):
            raise ValueError("cannot store this")
        return super().finish_if_running(outcomes, now, *a, **kw)


def _running(store, n):
    store.submit([job(func="m:f") for _ in range(n)], time.time())
    return [j.id for j in store.claim_available(Request.of(n, now=time.time()))]


def test_an_outcome_the_store_cannot_take_is_stored_dead_and_the_others_as_they_are():
    store = Refuses()
    a, b = _running(store, 2)
    stored, left = store_one_by_one(store, [Outcome(a, State.SUCCEEDED, result="bad"), Outcome(b, State.SUCCEEDED)],
                                    time.time, None, None)
    assert left == [] and [o.state for o, _ in stored] == [State.DEAD, State.SUCCEEDED]
    assert store.get(a).state == State.DEAD and store.get(a).error["type"] == "unstorable_outcome"
    assert store.get(b).state == State.SUCCEEDED


def test_a_store_that_is_unavailable_keeps_every_outcome_not_yet_stored_as_it_is():
    store = Refuses()
    a, b = _running(store, 2)
    store.down = True
    outcomes = [Outcome(a, State.SUCCEEDED), Outcome(b, State.SUCCEEDED)]
    stored, left = store_one_by_one(store, outcomes, time.time, None, None)
    assert stored == [] and left == outcomes
    assert {store.get(a).state, store.get(b).state} == {State.RUNNING}
