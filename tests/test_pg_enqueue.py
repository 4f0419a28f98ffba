"""queickd.pg and the SQL function enqueue(): a job enqueued in the application's own
transaction exists if and only if that transaction commits, and wakes the workers then."""

from __future__ import annotations

import itertools
import statistics
import threading
import time

import pytest
from store_contract import job

from queickd.core.job import State
from queickd.core.policy.admission import Admission
from queickd.core.protocol import Code, QueueError

psycopg = pytest.importorskip("psycopg")
qpg = pytest.importorskip("queickd.pg")


@pytest.fixture
def app(pg_database, pg_store):
    """(the application's connection, the queue's schema): the connection has the
    database's default search_path, not the queue's, as an application's would."""
    c = psycopg.connect(pg_database)
    yield c, pg_store.schema
    c.close()


def _jobs(store, **where) -> list:
    cond = " AND ".join(f"{k} = %s" for k in where) or "true"
    return store._conn().execute(f"SELECT id, state, func, args FROM jobs WHERE {cond} ORDER BY id",
                                 tuple(where.values())).fetchall()


def test_a_rolled_back_transaction_leaves_no_job(app, pg_store):
    c, schema = app
    job_id = qpg.enqueue(c, "m:f", [1], schema=schema)
    assert _jobs(pg_store) == []  # not visible before the commit
    c.rollback()
    assert _jobs(pg_store) == []
    assert qpg.enqueue(c, "m:f", [2], schema=schema) > job_id  # the connection goes on
    c.commit()
    assert [(s, a) for _, s, _, a in _jobs(pg_store)] == [(State.QUEUED, "[2]")]


def test_a_savepoint_rolled_back_inside_a_committed_transaction_leaves_its_job_out(app, pg_store):
    c, schema = app
    with c.transaction():
        kept = qpg.enqueue(c, "m:kept", schema=schema)
        with pytest.raises(RuntimeError), c.transaction():
            qpg.enqueue(c, "m:dropped", schema=schema)
            raise RuntimeError("the application gives this part up")
    assert [(i, f) for i, _, f, _ in _jobs(pg_store)] == [(kept, "m:kept")]


def test_an_idempotency_key_in_two_transactions_makes_one_job(app, pg_store, pg_database):
    c, schema = app
    first = qpg.enqueue(c, "m:f", idempotency_key="order-1", schema=schema)
    c.commit()
    assert qpg.enqueue(c, "m:f", idempotency_key="order-1", schema=schema) == first
    c.commit()
    # Two open at once: the second waits for the first's commit and answers with its job.
    third = qpg.enqueue(c, "m:f", idempotency_key="order-2", schema=schema)
    got: list = []
    with psycopg.connect(pg_database) as other:
        t = threading.Thread(target=lambda: got.append(qpg.enqueue(other, "m:f", idempotency_key="order-2",
                                                                   schema=schema)))
        t.start()
        # The other's insert waits on this transaction's row: commit only then, so it meets
        # the key committed under it (not in a lookup before it).
        with psycopg.connect(pg_database, autocommit=True) as watch:
            deadline = time.monotonic() + 10
            while not watch.execute("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                    " AND datname = current_database())").fetchone()[0]:
                assert time.monotonic() < deadline, "the other enqueue never waited for this one's row"
        c.commit()
        t.join(30)
        other.commit()
    assert got == [third]
    assert len(_jobs(pg_store)) == 2


def test_a_refusal_inside_the_applications_transaction_leaves_it_free_to_go_on(app, pg_store):
    c, schema = app
    pg_store.publish_admission(Admission(max_queued_per_key=1))
    c.execute(f"CREATE TABLE {schema}.orders_app (n int)")  # the application's own table
    c.execute(f"INSERT INTO {schema}.orders_app VALUES (1)")
    qpg.enqueue(c, "m:f", key="k", schema=schema)
    with pytest.raises(QueueError) as refused, c.transaction():  # a savepoint: the refusal undoes it only
        qpg.enqueue(c, "m:f", key="k", schema=schema)
    assert (refused.value.code, refused.value.retry_after) == (Code.QUEUE_FULL, 1.0)
    c.execute(f"INSERT INTO {schema}.orders_app VALUES (2)")
    c.commit()
    assert c.execute(f"SELECT count(*) FROM {schema}.orders_app").fetchone()[0] == 2
    assert len(_jobs(pg_store)) == 1
    # Without a savepoint the transaction has failed, as after any failed statement: said
    # so, and usable again after a rollback.
    with pytest.raises(QueueError, match="queue_full"):
        qpg.enqueue(c, "m:f", key="k", schema=schema)
    with pytest.raises(QueueError, match="roll it back"):
        qpg.enqueue(c, "m:g", schema=schema)
    c.rollback()
    assert qpg.enqueue(c, "m:g", schema=schema) > 0


def test_a_manual_run_conflicts_with_its_keys_waiting_job_naming_it(app, pg_store):
    c, schema = app
    waiting = qpg.enqueue(c, "m:f", key="k", schema=schema)
    with pytest.raises(QueueError) as e:
        qpg.enqueue(c, "m:f", key="k", manual=True, schema=schema)
    assert (e.value.code, e.value.job_id) == (Code.CONFLICT, waiting)


def test_bad_jobs_are_refused_with_bad_request_and_nothing_is_inserted(app, pg_store):
    c, schema = app
    for func, args, options, says in [
            ("m:f", [object()], {}, "not JSON"),
            ("m:f", [], {"colour": "red"}, "unknown job field"),
            ("nonsense", [], {}, "func must be"),
            ("m:f", [], {"priority": "high"}, "priority"),
            ("m:f", [], {"delay": 1, "run_at": 5}, "run_at or delay")]:
        with pytest.raises(QueueError, match=says) as e:
            qpg.enqueue(c, func, args, schema=schema, **options)
        assert e.value.code == Code.BAD_REQUEST
        c.rollback()
    with pytest.raises(QueueError, match=r"jobs\[1\]"):
        qpg.enqueue_many(c, [{"func": "m:f"}, {"func": "m:f", "kwargs": 3}], schema=schema)
    assert _jobs(pg_store) == []


def test_the_sql_function_refuses_with_a_stable_sqlstate(app):
    c, schema = app
    with pytest.raises(psycopg.Error) as e:
        c.execute(f"SELECT {schema}.enqueue('m:f', '[]', '{{\"colour\": 1}}')")
    assert e.value.sqlstate == "QD400" and str(e.value).startswith("bad_request: unknown job field(s): colour")


def test_enqueue_many_is_all_or_nothing_and_answers_a_repeated_key_with_the_first_job(app, pg_store):
    c, schema = app
    pg_store.publish_admission(Admission(max_queued_per_key=2))
    ids = qpg.enqueue_many(c, [{"func": "m:a", "args": [1], "idempotency_key": "x"},
                               {"func": "m:b", "delay": 3600},
                               {"func": "m:a", "idempotency_key": "x"}], schema=schema)
    assert ids[0] == ids[2] and ids[1] != ids[0]
    with pytest.raises(QueueError, match="queue_full"), c.transaction():
        qpg.enqueue_many(c, [{"func": "m:k", "key": "k"}] * 3, schema=schema)
    c.commit()
    assert [s for _, s, _, _ in _jobs(pg_store)] == [State.QUEUED, State.SCHEDULED]


def test_a_database_without_the_queue_says_to_migrate(pg_fresh_database):
    with psycopg.connect(pg_fresh_database) as c, pytest.raises(QueueError, match="queick db migrate"):
        qpg.enqueue(c, "m:f")


def test_a_trigger_enqueues_a_job_for_each_inserted_row(pg):
    from queickd.store.postgres.store import PostgresStore

    url, admin = pg
    PostgresStore(url).close()  # migrated
    with psycopg.connect(url) as c:
        c.execute("""
            CREATE TABLE public.orders (id bigint PRIMARY KEY, total numeric);
            CREATE FUNCTION public.ship_order() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM queickd.enqueue('app.tasks:ship', jsonb_build_array(NEW.id),
                                        jsonb_build_object('key', 'order-' || NEW.id));
                RETURN NEW;
            END $$;
            CREATE TRIGGER orders_ship AFTER INSERT ON public.orders
                FOR EACH ROW EXECUTE FUNCTION public.ship_order();
            INSERT INTO public.orders VALUES (7, 10), (8, 20);""")
    assert admin.execute("SELECT func, args, key, state FROM jobs ORDER BY id").fetchall() == [
        ("app.tasks:ship", "[7]", "order-7", State.QUEUED), ("app.tasks:ship", "[8]", "order-8", State.QUEUED)]


def test_the_wake_up_is_sent_at_the_commit_and_never_for_a_rollback(pg):
    from pgfixtures import listen_for_queickd

    from queickd.store.postgres.channels import QUEUED_CHANNEL
    from queickd.store.postgres.store import PostgresStore

    url, _ = pg
    PostgresStore(url).close()
    listener = listen_for_queickd(url)
    listener.execute(f"LISTEN {QUEUED_CHANNEL}")
    try:
        with psycopg.connect(url) as c:
            qpg.enqueue(c, "m:f", pool="rolled_back")
            qpg.enqueue(c, "m:plain")  # a plain job's statement, not the function
            c.rollback()
            qpg.enqueue(c, "m:f", pool="committed")
            c.commit()
            qpg.enqueue(c, "m:plain", [1])
            c.commit()
        heard = [(n.channel, n.payload) for n in itertools.islice(listener.notifies(timeout=30), 2)]
        assert heard == [(QUEUED_CHANNEL, "q:committed"), (QUEUED_CHANNEL, "q:default")]
    finally:
        listener.close()


def test_a_committed_job_runs_once_promptly_on_an_idle_worker_and_a_rolled_back_one_never(
        pg, start_daemon, tmp_path):
    url, admin = pg
    d = start_daemon(url, "--heartbeat", "0.5", workers=1)
    out = tmp_path / "runs.txt"
    with psycopg.connect(url) as c:
        c.execute("CREATE TABLE public.orders (id int)")
        c.commit()
        c.execute("INSERT INTO public.orders VALUES (1)")
        qpg.enqueue(c, "testjobs:append", [str(out), "rolled-back"])
        c.rollback()
        c.execute("INSERT INTO public.orders VALUES (2)")
        job_id = qpg.enqueue(c, "testjobs:append", [str(out), "committed"])
        c.commit()
        committed_at = time.time()
    with d.client() as q:
        job = q.wait(job_id, 30)
    assert job["state"] == State.SUCCEEDED and job["attempts"] == 1
    assert out.read_text().split() == ["committed"]
    assert job["started_at"] - committed_at < 2.0
    assert admin.execute("SELECT count(*) FROM jobs").fetchone()[0] == 1


def test_an_idle_worker_starts_a_job_within_50_ms_of_its_commit(pg, start_daemon):
    # The wake-up rides on the commit's NOTIFY: a worker idle on LISTEN starts the job
    # then, not at its next poll. The median of seven, each with the worker idle again
    # (its own start and finish on the same host's clock), so one scheduling hiccup of
    # a loaded machine does not decide it.
    url, _ = pg
    d = start_daemon(url, workers=1)
    lags = []
    with psycopg.connect(url) as c, d.client() as q:
        for _ in range(7):
            job_id = qpg.enqueue(c, "testjobs:noop")
            c.commit()
            committed_at = time.time()
            lags.append(q.wait(job_id, 30)["started_at"] - committed_at)
    assert statistics.median(lags) < 0.05, lags


def test_sqlalchemy_hands_its_psycopg_connection_over(pg):
    sqlalchemy = pytest.importorskip(
        "sqlalchemy", reason="SQLAlchemy is not installed here (the docs' example is not run)")
    from queickd.store.postgres.store import PostgresStore

    url, admin = pg
    PostgresStore(url).close()
    engine = sqlalchemy.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        job_id = qpg.enqueue(conn.connection.driver_connection, "m:f", [1])
    assert admin.execute("SELECT id FROM jobs").fetchall() == [(job_id,)]


def test_the_store_counts_the_jobs_applications_enqueued_by_state(app, pg_store):
    c, schema = app
    qpg.enqueue(c, "m:now", schema=schema)
    qpg.enqueue(c, "m:later", delay=3600, schema=schema)
    c.commit()
    pg_store.submit([job()], time.time())  # through a daemon's submit: not counted
    assert pg_store.direct_counts() == {State.QUEUED: 1, State.SCHEDULED: 1}


def test_status_shows_the_jobs_by_origin(pg, start_daemon):
    import subprocess
    import sys

    url, _ = pg
    d = start_daemon(url, workers=0)
    with psycopg.connect(url) as c:
        qpg.enqueue(c, "testjobs:noop")
        c.commit()
    with d.client() as q:
        q.enqueue("testjobs:noop")
        assert q.stats()["direct"] == {State.QUEUED: 1}
    out = subprocess.run([sys.executable, "-m", "queickd", "status", "--port", str(d.port)],
                         capture_output=True, text=True, timeout=60).stdout
    assert "jobs     by origin: 1 through a daemon, 1 in applications' transactions   direct queued 1" in out


def test_a_connection_with_its_own_row_factory_enqueues(pg_database, pg_store):
    from psycopg.rows import dict_row

    with psycopg.connect(pg_database, row_factory=dict_row, autocommit=True) as c:
        plain = qpg.enqueue(c, "m:f", [1], schema=pg_store.schema)
        keyed = qpg.enqueue(c, "m:f", key="k", schema=pg_store.schema)
        many = qpg.enqueue_many(c, [{"func": "m:f"}] * 2, schema=pg_store.schema)
        assert c.execute("SELECT 1 AS one").fetchone() == {"one": 1}  # the connection's own cursors unchanged
    assert [i for i, *_ in _jobs(pg_store)] == [plain, keyed, *many]
