"""How the PostgreSQL store reads jobs by state: no index holds every state (each version of
every row would take an entry in it), so each query by state must find the partial index
that holds its states. Plans are read with EXPLAIN on a table of a realistic mix, through
the store's own connections, for the statements its methods really send."""

import time

import psycopg
import pytest
from store_contract import job

from queickd.core.job import State
from queickd.core.policy.admission import Admission
from queickd.core.policy.costs import Limits

MIX = {State.SUCCEEDED: 20_000, State.QUEUED: 2_000, State.SCHEDULED: 500, State.RUNNING: 50,
       State.DEAD: 50, State.WAITING_NETWORK: 20, State.CANCELLED: 20, State.HELD: 20, State.FORWARDED: 20}


class Explaining(psycopg.Cursor):
    """A cursor that records the plan of each statement on `jobs` before running it."""

    plans: list[tuple[str, str]] = []

    def execute(self, query, params=None, **kwargs):
        text = query if isinstance(query, str) else ""
        if " jobs " in f"{text} " and text.lstrip().upper().startswith(("SELECT", "UPDATE", "DELETE", "WITH")):
            plan = "\n".join(r[0] for r in super().execute("EXPLAIN " + text, params).fetchall())
            Explaining.plans.append((text, plan))
        return super().execute(query, params, **kwargs)


@pytest.fixture
def explained(pg_fresh_database, monkeypatch):
    """A store whose connections explain every statement on jobs, on a table of MIX rows.
    In a database of its own: another test's open snapshot in the same database would keep
    VACUUM from marking the new rows' pages all-visible, and the planner would then read the
    settled jobs by scanning the table rather than their index. For the same reason the
    table's autovacuum is off while it fills."""
    from queickd.store.postgres.store import PostgresStore

    connect = PostgresStore.connect
    monkeypatch.setattr(PostgresStore, "connect", lambda self, **o: connect(self, cursor_factory=Explaining, **o))
    store = PostgresStore(pg_fresh_database)
    # No autovacuum here while the table fills: an automatic ANALYZE that starts between two
    # of the inserts holds a snapshot that the later rows are not visible to, and the VACUUM
    # below then leaves their pages not all-visible (seen: 465 of 520 in a full run).
    store._conn().execute("ALTER TABLE jobs SET (autovacuum_enabled = false)")
    now = time.time()
    for state, n in MIX.items():
        store._conn().execute(
            "INSERT INTO jobs (state, func, run_at, created_at, finished_at, cost_units)"
            " SELECT %s, 'm:f', %s - g, %s, CASE WHEN %s THEN %s END, 1 + g %% 3 FROM generate_series(1, %s) g",
            (state, now, now, state in State.FINAL, now, n))
    # As autovacuum leaves it (every 2 % of changes). A transaction elsewhere on the server
    # (another test's CREATE or DROP DATABASE holds an xid) can keep the newest rows from
    # counting as visible to all for a moment: VACUUM again until they do, a bounded number
    # of times (each pass is a few ms on these 520 pages).
    for _ in range(200):
        store._conn().execute("VACUUM ANALYZE jobs")
        pages, visible = store._conn().execute(
            "SELECT relpages, relallvisible FROM pg_class WHERE relname = 'jobs'").fetchone()
        if visible == pages:
            break
    assert visible == pages, f"VACUUM left {pages - visible} of {pages} pages not all-visible: a snapshot held it"
    Explaining.plans.clear()
    yield store
    store.close()


def _scans_of_the_table(plans: list[tuple[str, str]]) -> list[str]:
    assert plans, "no statement on jobs was sent"
    return [f"{text}\n{plan}" for text, plan in plans if "Seq Scan on jobs" in plan]


def test_every_index_of_jobs_but_its_primary_key_is_partial(pg_store):
    defs = [d for (d,) in pg_store._conn().execute(
        "SELECT indexdef FROM pg_indexes WHERE tablename = 'jobs' AND schemaname = current_schema()"
        " AND indexname <> 'jobs_pkey'")]
    assert defs and [d for d in defs if " WHERE " not in d] == []


def test_counts_of_every_state_are_read_from_indexes(explained):
    counts = explained.counts()
    assert counts == {s: MIX[s] for s in State.ALL}
    assert _scans_of_the_table(Explaining.plans) == []


def test_the_waiting_jobs_by_pool_are_read_from_indexes(explained):
    waiting = MIX[State.QUEUED] + MIX[State.SCHEDULED] + MIX[State.WAITING_NETWORK]
    assert explained.waiting_by_pool() == {"default": waiting}
    assert _scans_of_the_table(Explaining.plans) == []


def test_a_submit_under_a_queue_cap_counts_the_waiting_jobs_from_indexes(explained):
    (answer,) = explained.submit_requests([[job()]], time.time(), Admission(max_queued=10**6))
    assert not hasattr(answer, "code")
    assert _scans_of_the_table(Explaining.plans) == []


def test_budget_reports_read_the_waiting_and_running_jobs_from_indexes(explained):
    over = explained.waiting_over_budgets(Limits(pools={"default": 2.0}))
    usage = explained.budget_usage(["default"], [])
    assert len(over) == sum(1 for s in (State.QUEUED, State.SCHEDULED, State.WAITING_NETWORK)
                            for g in range(1, MIX[s] + 1) if 1 + g % 3 > 2)
    assert usage[("pool", "default")][1] == MIX[State.RUNNING]
    assert _scans_of_the_table(Explaining.plans) == []


def test_dead_and_network_parked_jobs_are_found_from_an_index(explained):
    assert len(explained.list_jobs(State.DEAD, 10)) == 10
    assert explained.release_network_waiting(time.time()) == MIX[State.WAITING_NETWORK]
    assert explained.retry_all_dead(time.time()) == MIX[State.DEAD]
    assert _scans_of_the_table(Explaining.plans) == []


def test_a_database_of_schema_23_keeps_every_job_and_count_through_migration_24(pg_url):
    from queickd.store.postgres.schema import MIGRATIONS
    from queickd.store.postgres.store import PostgresStore

    with psycopg.connect(pg_url) as c:  # what a queickd of schema 23 left, with jobs in every state
        for sql in MIGRATIONS[:23]:
            c.execute(sql)
        c.execute("INSERT INTO queickd_meta VALUES ('schema_version', '23') ON CONFLICT (key) DO UPDATE"
                  " SET value = excluded.value")
        for state in State.ALL:
            c.execute("INSERT INTO jobs (state, func, run_at, created_at) SELECT %s, 'm:f', g, g"
                      " FROM generate_series(1, 3) g", (state,))
    store = PostgresStore(pg_url)
    try:
        assert store.versions()[1] == len(MIGRATIONS)
        assert store.counts() == dict.fromkeys(State.ALL, 3)
        assert len(store.list_jobs(State.DEAD, 10)) == 3
        names = {n for (n,) in store._conn().execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'jobs' AND schemaname = current_schema()")}
        assert "jobs_settled" in names and "jobs_state" not in names
    finally:
        store.close()
