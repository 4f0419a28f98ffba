"""A fan-out's cost per item does not grow with its size, and its items wait under
--max-queued like any enqueue. In process on a real SQLite file, through a daemon."""

from __future__ import annotations

import re
import time

import pytest

from queickd import QueueError
from queickd.core import workflow as wf
from queickd.core.job import Outcome
from queickd.core.policy.claim import Request
from queickd.services.step_state import StepState
from queickd.store.sqlite.store import SQLiteStore

T0 = 1_700_000_000.0
FAN = wf.parse({"name": "fan", "steps": [{"name": "f", "kind": "for_each", "items": "xs", "func": "wfsteps:square"}]})


def _fan_out_items(path, n: int) -> tuple[list[str], list[int], SQLiteStore]:
    """Run a fan-out of n items to its last batch of 10; the SQL its finishes ran and the
    size of the state each item was handed (JSON characters)."""
    s = SQLiteStore(path)
    s.workflow_start(FAN, {"xs": list(range(n)), "factor": 3}, T0)
    states, handed, sql = StepState(s), [], []
    c = s._writer()
    held = s.claim_available(Request.of(10, now=T0))
    finished = 0
    while finished + len(held) < n:
        jobs = [states.complete(j) for j in held]
        handed += [len(str(j.args[1])) for j in jobs]
        c.set_trace_callback(sql.append)
        with s.transaction(bookkeeping=True) as tx:
            tx.finish_if_running([Outcome.succeeded(j.id, j.args[0] ** 2, j.workflow_run) for j in jobs], T0)
            c.set_trace_callback(None)
            finished += len(held)
            held = tx.claim_available(Request.of(10, now=T0))
    return sql, handed, s


def test_fan_out_cost_per_item_is_flat(tmp_path):
    per_item, handed_sizes = {}, {}
    for n in (100, 2000):
        sql, handed, s = _fan_out_items(str(tmp_path / f"q{n}.db"), n)
        s.close()
        # Until the step completes, an item's finish neither reads nor writes the run's state
        # (the list of n items in it), and runs as many statements whatever n.
        assert not [q for q in sql if "workflow_states" in q or ("workflow_runs" in q and re.search(r"\bstate\b", q))]
        per_item[n] = len(sql) / (n - 10)
        handed_sizes[n] = set(handed)
    assert per_item[100] == per_item[2000]
    assert handed_sizes[100] == handed_sizes[2000] == {len(str({"factor": 3}))}  # the list not handed on


def test_a_fan_out_completes_with_every_items_result_in_order(tmp_path):
    s = SQLiteStore(str(tmp_path / "q.db"))
    run, _ = s.workflow_start(FAN, {"xs": list(range(300))}, T0)
    states = StepState(s)
    held = s.claim_available(Request.of(50, now=T0))
    while held:
        jobs = [states.complete(j) for j in held]
        with s.transaction(bookkeeping=True) as tx:
            tx.finish_if_running([Outcome.succeeded(j.id, j.args[0] ** 2, j.workflow_run) for j in jobs], time.time())
            held = tx.claim_available(Request.of(50, now=T0))
    done = s.workflow_get(run.id)
    assert done.status == "succeeded" and done.state["f"] == [i * i for i in range(300)]
    s.close()


def test_fan_out_respects_max_queued(start_daemon):
    d = start_daemon(None, "--max-queued", "20", workers=0)  # nothing runs: what waits stays
    with d.client() as q:
        q.enqueue_many([{"func": "wfsteps:noop"} for _ in range(5)])
        run_id = q.workflow("fan").for_each("xs", "wfsteps:square").start(state={"xs": list(range(1000))})
        assert q.stats()["counts"]["queued"] == 20  # 15 of its items: the cap, not 1,000
        run = q.workflow_get(run_id)
        assert (run["state"], run["progress"]["total"], run["progress"]["queued"]) == ("running", 1000, 15)
        with pytest.raises(QueueError) as e:
            q.enqueue("wfsteps:noop")
        assert e.value.code == "queue_full"
