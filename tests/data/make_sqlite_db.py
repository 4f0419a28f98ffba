"""Make sqlite-schema3.db (or -schema1.db) with the queickd of an earlier release (see README.md).

Run with that release on PYTHONPATH; it imports its flat modules (queickd.job, ...)."""
import os
import sys

from queickd.job import NewJob, Outcome
from queickd.retry import make_spec
from queickd.store.admission import Admission

from queickd import protocol
from queickd.store.records import CronRecord, NewEvent
from queickd.store.sqlite.store import SQLiteStore

T0 = 1_700_000_000.0
GPU = {"pool": "gpu"} if "pool" in NewJob.__dataclass_fields__ else {}  # schema 1 had no pools
path = sys.argv[1]
for suffix in ("", "-wal", "-shm"):
    if os.path.exists(path + suffix):
        os.remove(path + suffix)
s = SQLiteStore(path)
retry = make_spec("constant", interval=5.0, max_attempts=2)
ids = [x.job_id for x in s.submit([
    NewJob("jobs:add", [1, 2], {}, T0),                                               # 1 succeeded
    NewJob("jobs:fail", [], {"why": "x"}, T0, retry=retry, key="k-fail"),             # 2 dead, paused key
    NewJob("jobs:slow", [3], {}, T0, priority=-1),                                     # 3 running
    NewJob("jobs:net", [], {}, T0, retry_on_network=True),                             # 4 waiting_network
    NewJob("jobs:later", [], {"at": 1}, T0 + 3600, priority=5, key="k-later", **GPU),  # 5 scheduled
    NewJob("jobs:drop", [], {}, T0 + 60),                                              # 6 cancelled
    NewJob("jobs:once", ["é"], {}, T0, idempotency_key="once-1"),                      # 7 queued
], T0)]
claimed = {j.func: j.id for j in s.claim_available(10, T0 + 1, network_up=True)}
assert sorted(claimed) == ["jobs:add", "jobs:fail", "jobs:net", "jobs:once", "jobs:slow"], claimed
s.finish_if_running([Outcome.succeeded(claimed["jobs:add"], {"sum": 3})], T0 + 2)
s.finish_if_running([Outcome.dead(claimed["jobs:fail"], {"type": "ValueError", "message": "no"})], T0 + 2,
                    pause_after=1)
s.finish_if_running([Outcome.waiting_network(claimed["jobs:net"], {"type": "OSError", "message": "down"})],
                    T0 + 2)
s.cancel(ids[5], T0 + 3)
# jobs:once back to queued: a stopped worker's job, requeued at the next start
s.finish_if_running([Outcome.retry_at(claimed["jobs:once"], T0, {"type": "E", "message": "again"})], T0 + 3)
s.promote_due(T0 + 4)
name, schedule, template = protocol.parse_cron(
    {"op": "cron", "name": "hourly", "cron": "0 * * * *", "func": "jobs:tick", "args": [1], "key": "tick",
     "retry": {"max_attempts": 3}, **GPU}, T0)
s.cron_save(CronRecord(name, schedule, template, T0 + 3600, None, T0, 0))
full = Admission(max_queued=1)  # the queue is over it: the event stays pending in the outbox
ev = s.accept_event(NewEvent("order-42", NewJob("jobs:ship", [42], {}, T0, key="ship")), T0 + 5, full)
assert ev.state == "pending", ev
print({j.id: j.state for j in s.list_jobs(None, 100)}, s.pauses(), s.cron_list(), s.list_events(None, 10))
s.close()
