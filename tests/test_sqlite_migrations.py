"""SQLite's numbered migrations (store/sqlite/schema.py) on files of earlier releases."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from queickd.core.job import NewJob, Outcome, RetrySpec, new_record
from queickd.core.policy import admission as adm
from queickd.core.policy.claim import Request
from queickd.store.sqlite import resource_steps
from queickd.store.sqlite import schema as sqlite_schema
from queickd.store.sqlite.store import SCHEMA_VERSION, SchemaTooNewError, SQLiteStore

T0 = 1_700_000_000.0
DATA = Path(__file__).parent / "data"  # see data/README.md
# Files of earlier releases, and the pool their "gpu" jobs are in (schema 1 had no pools).
RELEASES = {"sqlite-schema3.db": "gpu", "sqlite-schema1.db": "default"}


@pytest.fixture(params=sorted(RELEASES))
def old(request, tmp_path):
    path = tmp_path / "q.db"
    shutil.copy(DATA / request.param, path)  # never write to the file kept in the repository
    s = SQLiteStore(str(path))
    yield s, RELEASES[request.param]
    s.close()


def test_a_file_of_an_earlier_release_keeps_every_job(old):
    old_store, pool = old
    jobs = {j.id: j for j in old_store.list_jobs(None, 100)}
    assert {i: (j.func, j.state) for i, j in jobs.items()} == {
        1: ("jobs:add", "succeeded"), 2: ("jobs:fail", "dead"), 3: ("jobs:slow", "running"),
        4: ("jobs:net", "waiting_network"), 5: ("jobs:later", "scheduled"), 6: ("jobs:drop", "cancelled"),
        7: ("jobs:once", "queued")}
    assert (jobs[1].args, jobs[1].result, jobs[1].finished_at) == ([1, 2], {"sum": 3}, T0 + 2)
    assert (jobs[2].retry, jobs[2].max_attempts) == (RetrySpec("constant", 5.0, 3600.0, 2), 2)
    assert (jobs[2].kwargs, jobs[2].key, jobs[2].error) == ({"why": "x"}, "k-fail",
                                                             {"type": "ValueError", "message": "no"})
    assert (jobs[3].priority, jobs[3].attempts, jobs[3].started_at) == (-1, 1, T0 + 1)
    assert jobs[4].retry_on_network is True and jobs[4].attempts == 0
    assert (jobs[5].run_at, jobs[5].priority, jobs[5].key, jobs[5].pool, jobs[5].kwargs) == (
        T0 + 3600, 5, "k-later", pool, {"at": 1})
    assert (jobs[7].args, jobs[7].idempotency_key, jobs[7].attempts) == (["é"], "once-1", 1)
    assert all(j.created_at == T0 for j in jobs.values())
    assert old_store.counts() == {"scheduled": 1, "queued": 1, "running": 1, "succeeded": 1, "dead": 1,
                                  "waiting_network": 1, "cancelled": 1, "held": 0, "forwarded": 0}


def test_a_file_of_an_earlier_release_keeps_its_cron_pauses_and_outbox_event(old):
    old_store, pool = old
    (cron,) = old_store.cron_list()
    assert (cron.name, cron.schedule, cron.next_run_at, cron.created_at) == ("hourly", {"cron": "0 * * * *"},
                                                                             T0 + 3600, T0)
    t = cron.template
    assert (t.func, t.args, t.key, t.pool, t.retry.max_attempts) == ("jobs:tick", [1], "tick", pool, 3)
    assert {(p.kind, p.name, p.failures) for p in old_store.pauses()} == {("key", "k-fail", 1),
                                                                           ("func", "jobs:fail", 1)}
    (event,) = old_store.list_events(None, 10)
    assert (event.event_id, event.state, event.func, event.key) == ("order-42", "pending", "jobs:ship", "ship")


def test_a_file_of_an_earlier_release_is_at_todays_schema_version_and_takes_new_jobs(old):
    old_store, _ = old
    assert sqlite_schema.version(old_store._conn()) == SCHEMA_VERSION
    (sub,) = old_store.submit([NewJob("jobs:new", [8], key="k-new")], T0 + 10)
    assert sub.job_id == 8 and old_store.get(8).args == [8]
    delivered = old_store.deliver_events(T0 + 10, adm.NO_LIMITS, 5, lambda n: 1.0)
    assert [(e.event_id, e.state) for e in delivered] == [("order-42", "delivered")]
    assert old_store.counts()["queued"] == 3


def test_a_file_of_an_earlier_release_keeps_its_queued_job_in_the_queue_order_that_replaced_jobs_queued(old):
    old_store, _ = old
    indexes = {r[0] for r in old_store._conn().execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "jobs_queued" not in indexes and "jobs_queued_plain" not in indexes
    assert {"jobs_queued_pool_plain", "jobs_queued_pool_grouped", "jobs_queued_pool_group"} <= indexes
    assert old_store.oldest_queued_at() == old_store.get(7).run_at
    assert [j.id for j in old_store.claim_available(Request.of(5, now=T0 + 10))] == [7]


def test_a_file_of_an_earlier_release_gets_the_output_column_null_for_every_job(old):
    old_store, _ = old
    assert "output" in {r[1] for r in old_store._conn().execute("PRAGMA table_info(jobs)")}
    assert [j.output for j in old_store.list_jobs(None, 100)] == [None] * 7
    # its running job finishes there with its output
    assert old_store.finish_if_running([Outcome.succeeded(3, None, output="done\n")], T0 + 5).changed == 1
    assert old_store.get(3).output == "done\n"


def test_a_file_from_a_newer_queickd_is_refused_and_left_as_it_was(tmp_path):
    path = str(tmp_path / "q.db")
    SQLiteStore(path).close()
    with sqlite3.connect(path) as c:
        c.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
        before = c.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()
    c.close()
    with pytest.raises(SchemaTooNewError, match=f"schema version {SCHEMA_VERSION + 1}, newer than this queickd"):
        SQLiteStore(path)
    with sqlite3.connect(path) as c:
        assert c.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall() == before
        assert c.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(
            SCHEMA_VERSION + 1)
    c.close()


def test_a_new_file_gets_every_step_and_the_last_version(tmp_path):
    path = str(tmp_path / "q.db")
    SQLiteStore(path).close()
    with sqlite3.connect(path) as c:
        names = {r[0] for r in c.execute("SELECT name FROM sqlite_master")}
        assert sqlite_schema.version(c) == SCHEMA_VERSION == len(sqlite_schema.MIGRATIONS)
        assert "pool" in {r[1] for r in c.execute("PRAGMA table_info(jobs)")}
    c.close()
    assert {"jobs", "meta", "state_counts", "crons", "streaks", "pauses", "events"} <= names
    assert "jobs_count_insert" not in names  # dropped by step 3



@pytest.mark.parametrize("new", [NewJob("m:f", run_at=T0), NewJob("m:f", [1], {"a": 1}, 3, T0, key="k", pool="p")],
                         ids=["plain insert", "full insert"])
def test_a_new_job_reads_back_as_the_declared_new_record(tmp_path, new):
    # A plain insert names five columns and leaves the others to the columns' defaults,
    # which must be the declared ones (the memory store's record is built from those).
    s = SQLiteStore(str(tmp_path / "q.db"))
    (sub,) = s.submit([new], T0)
    assert s.get(sub.job_id) == new_record(sub.job_id, "queued", T0, new)
    s.close()


def test_an_upgrade_makes_a_keys_pending_events_due_in_the_order_accepted(tmp_path):
    from queickd.store import rows

    path = tmp_path / "q.db"
    SQLiteStore(str(path)).close()
    c = sqlite3.connect(path)
    template = rows.template_to_json(NewJob(func="m:tap", key="k"))
    for event_id, next_attempt in (("A", 1_700_000_060.0), ("B", 1_700_000_001.0)):  # B due first: as before
        c.execute("INSERT INTO events (event_id, state, job, func, key, created_at, next_attempt_at)"
                  " VALUES (?, 'pending', ?, 'm:tap', 'k', 1700000000.0, ?)", (event_id, template, next_attempt))
    c.execute("UPDATE meta SET value = '11' WHERE key = 'schema_version'")
    c.commit()
    c.close()
    store = SQLiteStore(str(path))
    try:
        assert store.deliver_events(1_700_000_002.0, adm.NO_LIMITS, 5, lambda n: 1.0) == []  # B waits for A
        assert [a.event_id for a in store.deliver_events(1_700_000_060.0, adm.NO_LIMITS, 5, lambda n: 1.0)] == ["A", "B"]
    finally:
        store.close()


def test_a_workflow_runs_state_moves_to_its_own_table(tmp_path):
    from queickd.core import workflow as wf

    path = str(tmp_path / "q.db")
    s = SQLiteStore(path)
    spec = wf.parse({"name": "w", "steps": [{"name": "a", "func": "m:f"}]})
    run, _ = s.workflow_start(spec, {"kept": "as it was"}, T0)
    s.close()
    with sqlite3.connect(path) as c:  # the file as schema 15 left it: the state in the run's row
        c.execute("UPDATE workflow_runs SET state = '{\"kept\":\"as it was\"}'")
        c.execute("DROP TABLE workflow_states")
        c.execute("UPDATE meta SET value = '15' WHERE key = 'schema_version'")
    s = SQLiteStore(path)
    assert s.workflow_get(run.id).state == {"kept": "as it was"}
    assert s._conn().execute("SELECT state FROM workflow_runs").fetchall() == [("",)]
    s.close()


def test_a_rate_keys_json_log_becomes_its_rows_and_still_binds(tmp_path):
    path = str(tmp_path / "q.db")
    SQLiteStore(path).close()
    with sqlite3.connect(path) as c:  # the file as schema 23 left it: each key's starts as JSON
        c.execute("DROP TABLE rate_starts")
        c.execute("DROP TABLE rate_keys")
        c.executescript(resource_steps.RATE_KEYS_21)
        c.execute("INSERT INTO rate_keys (key, lim, per, starts) VALUES ('k', 2, 10.0, ?)", (f"[{T0}, {T0 + 1}]",))
        c.execute("UPDATE meta SET value = '23' WHERE key = 'schema_version'")
    s = SQLiteStore(path)
    try:
        limited = NewJob(func="m:f", run_at=T0 + 2, rate_limit={"key": "k", "limit": 2, "per": 10.0})
        ids = [r.job_id for r in s.submit([limited, limited], T0 + 2)]
        assert s.claim_available(Request.of(10, now=T0 + 9.9)) == []
        assert [j.id for j in s.claim_available(Request.of(10, now=T0 + 10))] == ids[:1]
        assert s._conn().execute("SELECT at, n FROM rate_starts").fetchall() == [(T0 + 1, 1), (T0 + 10, 1)]
    finally:
        s.close()


def test_a_file_of_schema_25_finds_its_full_rate_keys_by_the_index_of_full_keys_alone(tmp_path):
    path = str(tmp_path / "q.db")
    SQLiteStore(path).close()
    with sqlite3.connect(path) as c:  # the file as schema 25 left it: every key in rate_keys_room
        c.execute("DROP INDEX rate_keys_full")
        c.execute("CREATE INDEX rate_keys_room ON rate_keys (lim - kept)")
        c.execute("INSERT INTO rate_keys (key, lim, per, kept) VALUES ('full', 1, 10.0, 1), ('open', 5, 10.0, 1)")
        c.execute("INSERT INTO rate_starts (key, at, n) VALUES ('full', ?, 1), ('open', ?, 1)", (T0, T0))
        c.execute("UPDATE meta SET value = '25' WHERE key = 'schema_version'")
    s = SQLiteStore(path)
    try:
        indexes = {r[0] for r in s._conn().execute("SELECT name FROM sqlite_master WHERE tbl_name = 'rate_keys'")}
        assert "rate_keys_room" not in indexes and "rate_keys_full" in indexes
        assert s._conn().execute("SELECT key FROM rate_keys INDEXED BY rate_keys_full"
                                 f" WHERE {resource_steps.RATE_KEY_FULL}").fetchall() == [("full",)]
        full, other = (NewJob(func="m:f", run_at=T0, rate_limit={"key": k, "limit": n, "per": 10.0})
                       for k, n in (("full", 1), ("open", 5)))
        ids = [r.job_id for r in s.submit([full, other], T0)]
        assert [j.id for j in s.claim_available(Request.of(10, now=T0 + 1))] == ids[1:]
    finally:
        s.close()
