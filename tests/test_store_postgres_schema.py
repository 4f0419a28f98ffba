"""The PostgreSQL queue in a schema of its own: the store URL's `?schema=`, a database of an
older layout (its tables where the default search_path put them) moved in place, and the
application's own tables of the same names left alone."""

from __future__ import annotations

import pytest
from store_contract import job

from queickd.core.job import State
from queickd.store.postgres.namespace import DEFAULT_SCHEMA, split_url

psycopg = pytest.importorskip("psycopg")


def test_the_schema_is_queickd_unless_the_url_names_one_and_leaves_the_conninfo():
    dsn, schema = split_url("postgresql://u:p@h:5432/db")
    assert schema == DEFAULT_SCHEMA
    assert "options=-c%20search_path%3Dqueickd" in dsn and "schema" not in dsn.replace("search_path", "")
    dsn, schema = split_url("postgresql://u@h/db?schema=app_q&sslmode=disable")
    assert schema == "app_q" and "sslmode=disable" in dsn and "schema=" not in dsn
    # A URL that set a search_path in its options before: that schema is the queue's.
    dsn, schema = split_url("postgresql://u@h/db?options=-csearch_path%3Dt_1%20-c%20work_mem%3D8MB")
    assert schema == "t_1" and dsn.count("search_path") == 1 and "work_mem" in dsn
    dsn, schema = split_url("postgresql://u@h/db?options=-c%20search_path%3Dapp_q%2Cpublic")
    assert schema == "app_q" and "public" not in dsn
    for bad in ("Upper", "a-b", "x;drop", ""):
        with pytest.raises(ValueError, match="schema"):
            split_url(f"postgresql://u@h/db?schema={bad}")


def _legacy_database(url: str, version: int) -> dict[str, int]:
    """What a queickd of schema `version` left: its tables in public, a job in every state;
    returns their ids by state."""
    from queickd.store.postgres.schema import MIGRATIONS

    ids = {}
    with psycopg.connect(url) as c:
        for sql in MIGRATIONS[:version]:
            c.execute(sql)
        c.execute("INSERT INTO queickd_meta VALUES ('schema_version', %s) ON CONFLICT (key) DO UPDATE"
                  " SET value = excluded.value", (str(version),))
        for state in State.ALL:
            ids[state] = c.execute("INSERT INTO jobs (state, func, run_at, created_at, idempotency_key)"
                                   " VALUES (%s, 'testjobs:noop', 1, 1, %s) RETURNING id",
                                   (state, "k-" + state)).fetchone()[0]
        assert c.execute("SELECT current_schema()").fetchone()[0] == "public"
    return ids


def test_a_database_of_schema_28_in_public_moves_into_the_queue_schema_keeping_every_job(
        pg_fresh_database, start_daemon):
    from queickd.store.postgres.schema import SCHEMA_VERSION
    from queickd.store.postgres.store import PostgresStore

    ids = _legacy_database(pg_fresh_database, 28)
    store = PostgresStore(pg_fresh_database)
    try:
        assert store.versions()[1] == SCHEMA_VERSION
        assert store.counts() == dict.fromkeys(State.ALL, 1)
        c = store.connect()
        where = dict(c.execute("SELECT c.relname, n.nspname FROM pg_class c JOIN pg_namespace n"
                               " ON n.oid = c.relnamespace WHERE c.relname IN ('jobs', 'queickd_meta',"
                               " 'jobs_id_seq', 'jobs_queued', 'events')").fetchall())
        assert where == dict.fromkeys(["jobs", "queickd_meta", "jobs_id_seq", "jobs_queued", "events"], "queickd")
        functions = c.execute("SELECT n.nspname, p.proconfig FROM pg_proc p JOIN pg_namespace n"
                              " ON n.oid = p.pronamespace WHERE p.proname LIKE 'queickd\\_%'").fetchall()
        assert functions and {n for n, _ in functions} == {"queickd"}
        assert all("search_path=queickd, pg_temp" in cfg for _, cfg in functions)
        # The serial goes on from where it was: a new job does not reuse an id.
        new = store.submit([job()], 2.0)[0].job_id
        assert new > max(ids.values())
        c.close()
    finally:
        store.close()
    with psycopg.connect(pg_fresh_database) as c:  # public is empty of them now
        assert c.execute("SELECT to_regclass('public.jobs'), to_regclass('public.queickd_meta')").fetchone() \
            == (None, None)
    d = start_daemon(pg_fresh_database, "--heartbeat", "0.5", workers=2)
    with d.client() as q:
        assert q.wait(ids[State.QUEUED], 30)["state"] == State.SUCCEEDED
        assert q.wait(ids[State.SCHEDULED], 30)["state"] == State.SUCCEEDED  # its run_at is long past
        assert q.get(ids[State.DEAD])["state"] == State.DEAD
        assert q.get(ids[State.SUCCEEDED])["state"] == State.SUCCEEDED


def test_a_database_of_an_older_schema_migrates_up_then_moves(pg_fresh_database):
    from queickd.store.postgres.store import PostgresStore

    _legacy_database(pg_fresh_database, 12)
    store = PostgresStore(pg_fresh_database + "?schema=work_queue")
    try:
        assert store.counts() == dict.fromkeys(State.ALL, 1)
        assert store.connect().execute("SELECT to_regclass('work_queue.jobs')").fetchone()[0] is not None
    finally:
        store.close()


def test_the_applications_own_tables_of_the_same_names_are_left_alone(pg_fresh_database):
    from queickd.store.postgres.store import PostgresStore

    with psycopg.connect(pg_fresh_database, autocommit=True) as c:
        c.execute("CREATE TABLE jobs (title text); INSERT INTO jobs VALUES ('the app''s own')")
        c.execute("CREATE TABLE events (at date)")
    store = PostgresStore(pg_fresh_database)
    try:
        assert store.counts() == dict.fromkeys(State.ALL, 0)
    finally:
        store.close()
    with psycopg.connect(pg_fresh_database) as c:
        assert c.execute("SELECT title FROM public.jobs").fetchall() == [("the app's own",)]
        assert c.execute("SELECT count(*) FROM queickd.jobs").fetchone()[0] == 0


def test_a_rate_keys_json_log_becomes_its_rows_and_still_binds(pg_fresh_database):
    from queickd.core.policy.claim import Request
    from queickd.store.postgres.store import PostgresStore

    t0 = 1_700_000_000.0
    PostgresStore(pg_fresh_database).close()
    with psycopg.connect(pg_fresh_database, options="-c search_path=queickd") as c:  # as schema 36 left it
        c.execute("DROP TABLE rate_starts")
        c.execute("DROP INDEX rate_keys_room")
        c.execute("ALTER TABLE rate_keys DROP COLUMN kept")
        c.execute("ALTER TABLE rate_keys ADD COLUMN starts text NOT NULL DEFAULT '[]'")
        c.execute("UPDATE queickd_meta SET value = '36' WHERE key = 'schema_version'")
        c.execute("INSERT INTO rate_keys (key, lim, per, blocked_until, starts) VALUES"
                  " ('k', 3, 10.0, NULL, %s), ('told', 5, 1.0, %s, '[]')", (f"[{t0}, {t0}, {t0 + 1}]", t0 + 60))
    store = PostgresStore(pg_fresh_database)
    try:
        c = store.connect()
        assert sorted(c.execute("SELECT key, at, n FROM rate_starts").fetchall()) == [("k", t0, 2), ("k", t0 + 1, 1)]
        assert sorted(c.execute("SELECT key, kept FROM rate_keys").fetchall()) == [("k", 3), ("told", 0)]
        c.close()
        rl = {"key": "k", "limit": 3, "per": 10.0}
        ids = [s.job_id for s in store.submit([job(rate_limit=rl) for _ in range(3)], t0 + 2)]
        assert store.claim_available(Request.of(1, now=t0 + 9.9)) == []
        assert [j.id for j in store.claim_available(Request.of(5, now=t0 + 10))] == ids[:2]
        assert store.claim_available(Request.of(5, now=t0 + 10.5)) == []
        assert [j.id for j in store.claim_available(Request.of(5, now=t0 + 11))] == ids[2:]
    finally:
        store.close()
