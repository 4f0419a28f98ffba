import concurrent.futures
import sqlite3

import pytest
from store_contract import T0, StoreContract, job

from queickd.core.job import State
from queickd.core.policy.claim import Request
from queickd.store import open_store, rows
from queickd.store.sqlite.store import SCHEMA_VERSION, SQLiteStore


class TestSQLiteStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path):
        s = SQLiteStore(str(tmp_path / "q.db"))
        yield s
        s.close()


def test_jobs_survive_closing_and_reopening(tmp_path):
    path = str(tmp_path / "q.db")
    s = SQLiteStore(path)
    (sub,) = s.submit([job(args=[7])], T0)
    s.close()
    again = SQLiteStore(path)
    assert again.get(sub.job_id).args == [7]
    again.close()


def test_ids_are_never_reused_after_rows_are_deleted(tmp_path):
    path = str(tmp_path / "q.db")
    s = SQLiteStore(path)
    (a,) = s.submit([job()], T0)
    with sqlite3.connect(path) as c:
        c.execute("DELETE FROM jobs")
    (b,) = s.submit([job()], T0)
    assert b.job_id > a.job_id
    s.close()


@pytest.mark.parametrize("durability,level", [("full", 2), ("normal", 1)])
def test_wal_and_the_chosen_durability_are_in_force(tmp_path, durability, level):
    s = SQLiteStore(str(tmp_path / "q.db"), durability=durability)
    c = s._conn()
    assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert c.execute("PRAGMA synchronous").fetchone()[0] == level
    s.close()


def test_a_store_written_by_a_newer_version_is_refused(tmp_path):
    path = str(tmp_path / "q.db")
    SQLiteStore(path).close()
    with sqlite3.connect(path) as c:
        c.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    with pytest.raises(RuntimeError, match="newer"):
        SQLiteStore(path)


def test_claim_merges_the_served_pools_queue_order_walks_without_sorting(tmp_path):
    s = SQLiteStore(str(tmp_path / "q.db"))
    s.submit([job() for _ in range(100)], T0)
    c = s._writer()  # claims run on the writing connection
    c.execute("ANALYZE")  # with or without statistics, the plan must not change
    c.set_trace_callback(None)
    sql = []
    c.set_trace_callback(sql.append)
    s.claim_available(Request.of(1, now=T0))
    c.set_trace_callback(None)
    claim = next(q for q in sql if "state = 'queued'" in q and q.startswith("SELECT"))
    plan = " ".join(str(r) for r in c.execute("EXPLAIN QUERY PLAN " + claim))
    assert "MERGE (UNION ALL)" in plan and "TEMP B-TREE" not in plan  # the two walks merged, not sorted
    assert "USING INDEX jobs_queued_pool_plain (pool=?)" in plan and "USING INDEX jobs_queued_pool_grouped (pool=?)" in plan
    s.close()


def test_the_event_prune_reads_the_old_delivered_events_not_the_whole_outbox(tmp_path):
    s = SQLiteStore(str(tmp_path / "q.db"))
    c = s._writer()  # retention's prune runs on the writing connection
    sql = []
    c.set_trace_callback(sql.append)
    s.prune_events(T0, 500)
    c.set_trace_callback(None)
    prune = next(q for q in sql if q.startswith("DELETE FROM events"))
    plan = " ".join(str(r) for r in c.execute("EXPLAIN QUERY PLAN " + prune))
    assert "USING INDEX events_delivered (created_at<?)" in plan and "SCAN e" not in plan
    s.close()


def _claim_steps(s, request):
    """(jobs claimed, SQLite VM instructions the claim ran): the work it did, not its time."""
    c = s._writer()
    steps = [0]

    def count():
        steps[0] += 1
        return 0

    c.set_progress_handler(count, 1)
    try:
        return s.claim_available(request), steps[0]
    finally:
        c.set_progress_handler(None, 1)


def test_a_claim_with_every_group_full_reaches_the_jobs_behind_them_by_reading_no_full_groups_jobs(tmp_path):
    steps = {}
    for waiting in (10, 2000):
        s = SQLiteStore(str(tmp_path / f"q{waiting}.db"))
        s.submit([job(concurrency_group=f"g{i}", concurrency_limit=1) for i in range(5)], T0)
        assert len(s.claim_available(Request.of(5, now=T0))) == 5  # every group is full
        s.submit([job(concurrency_group=f"g{i % 5}", concurrency_limit=1) for i in range(waiting)], T0)
        plain = s.submit([job() for _ in range(2)], T0)
        got, steps[waiting] = _claim_steps(s, Request.of(2, now=T0))
        assert [j.id for j in got] == [p.job_id for p in plain]
        s.close()
    # The same work with 200 times the full groups' backlog: none of it was read.
    assert steps[2000] <= steps[10] * 1.05


def test_a_claim_after_one_that_met_a_full_group_reads_in_one_statement_as_without_it(tmp_path):
    reads = {}
    for full_group in (False, True):
        s = SQLiteStore(str(tmp_path / f"q{full_group}.db"))
        if full_group:  # its slot taken, a job of it waiting ahead of every other
            s.submit([job(concurrency_group="full", concurrency_limit=1)], T0)
            assert len(s.claim_available(Request.of(1, pools=["default"], now=T0))) == 1
            s.submit([job(concurrency_group="full", concurrency_limit=1, priority=-10)], T0)
        plain = s.submit([job() for _ in range(4)], T0)
        assert len(s.claim_available(Request.of(2, pools=["default"], now=T0))) == 2  # the one that met it
        sql = []
        s._writer().set_trace_callback(sql.append)
        assert [j.id for j in s.claim_available(Request.of(2, pools=["default"], now=T0))] == [p.job_id for p in plain[2:]]
        s._writer().set_trace_callback(None)
        reads[full_group] = [q for q in sql if q.startswith(("SELECT", "WITH"))]
        s.close()
    assert len(reads[True]) == len(reads[False]) == 1, reads


def test_a_grouped_job_with_its_other_fields_at_their_defaults_is_inserted_with_eight_columns(tmp_path):
    s = SQLiteStore(str(tmp_path / "q.db"))
    sql = []
    s._writer().set_trace_callback(sql.append)
    short, other = s.submit([job(concurrency_group="api", concurrency_limit=3, cost_units=2.5),
                             job(concurrency_group="api", priority=4)], T0)
    s._writer().set_trace_callback(None)
    # dict.fromkeys: a statement that enters a trigger (fair keys': schema.py) is traced again.
    inserts = list(dict.fromkeys(q for q in sql if q.startswith("INSERT INTO jobs")))
    assert [q.split(")")[0].count(",") + 1 for q in inserts] == [8, len(rows.INSERT_COLS)]
    a, b = s.get(short.job_id), s.get(other.job_id)
    assert (a.concurrency_group, a.concurrency_limit, a.cost_units, a.priority, a.state) == ("api", 3, 2.5, 0, "queued")
    assert (b.concurrency_group, b.concurrency_limit, b.cost_units, b.priority) == ("api", None, None, 4)
    s.close()


def test_sqlite_urls_name_relative_and_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rel = open_store("sqlite:///rel.db")
    assert (tmp_path / "rel.db").exists()
    absolute = open_store(f"sqlite:///{tmp_path / 'abs.db'}")
    assert absolute.path == str(tmp_path / "abs.db")
    rel.close()
    absolute.close()
    assert SQLiteStore(str(tmp_path / "abs.db")).counts()[State.QUEUED] == 0


def _linked(tmp_path):
    """etc/q.db, a symlink to data/q.db (as a Pi's config might point at a USB disk)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "q.db").symlink_to(tmp_path / "data" / "q.db")
    return tmp_path / "etc" / "q.db", tmp_path / "data" / "q.db"


def test_a_store_opened_through_a_symlink_commits_durably_with_its_side_files_beside_the_target(tmp_path):
    link, target = _linked(tmp_path)
    s = SQLiteStore(str(link), durability="full")
    try:
        [[sub]] = s.submit_requests([[job()]], T0)  # its flush reads the WAL SQLite writes
        assert sub.job_id == 1
        assert s.path == str(target) and s.url == f"sqlite:///{link}"
        assert (tmp_path / "data" / "q.db-wal").exists() and (tmp_path / "data" / "q.db.id").exists()
        assert sorted(p.name for p in (tmp_path / "etc").iterdir()) == ["q.db"]
    finally:
        s.close()
    assert SQLiteStore(str(target)).counts()[State.QUEUED] == 1


def test_one_daemon_per_store_holds_whether_the_store_is_named_by_a_symlink_or_its_target(tmp_path):
    from queickd.store.records import StoreInUseError

    link, target = _linked(tmp_path)
    first, second = SQLiteStore(str(link)), SQLiteStore(str(target))
    try:
        first.take_ownership()
        with pytest.raises(StoreInUseError):
            second.take_ownership()
    finally:
        first.close()
        second.close()


def test_the_database_commands_find_a_linked_store_where_the_daemon_locks_it(tmp_path):
    from queickd.store.sqlite import backup as sqlitebackup

    link, target = _linked(tmp_path)
    assert sqlitebackup.sqlite_path(f"sqlite:///{link}") == str(target)


@pytest.mark.parametrize("url", ["sqlite://", "redis://x", "nonsense"])
def test_unusable_store_urls_are_refused_clearly(url):
    with pytest.raises(ValueError, match="URL"):
        open_store(url)


def test_a_transaction_that_raises_leaves_nothing_behind(tmp_path):
    s = SQLiteStore(str(tmp_path / "q.db"))
    s.submit([job(), job()], T0)
    with pytest.raises(RuntimeError), s.transaction(bookkeeping=True) as tx:
        assert len(tx.claim_available(Request.of(2, now=T0))) == 2
        raise RuntimeError("the dispatcher failed before it could run them")
    assert s.counts()[State.QUEUED] == 2 and s.counts()[State.RUNNING] == 0
    s.close()


def test_a_transaction_that_raises_gives_the_writer_back_to_other_threads_and_to_its_own(tmp_path):
    s = SQLiteStore(str(tmp_path / "q.db"))
    s.submit([job()], T0)
    with pytest.raises(RuntimeError), s.transaction(bookkeeping=True) as tx:
        tx.claim_available(Request.of(1, now=T0))
        raise RuntimeError("failed halfway")
    other = concurrent.futures.ThreadPoolExecutor(1)
    assert len(other.submit(s.submit, [job()], T0).result(timeout=10)) == 1  # the write lock is free
    other.shutdown()
    s.submit([job()], T0)  # outside the transaction: this thread's write commits on its own
    reader = SQLiteStore(str(tmp_path / "q.db"))
    assert reader.counts()[State.QUEUED] == 3
    reader.close()
    s.close()


def test_a_version_1_file_gains_the_pool_column_and_keeps_its_jobs(tmp_path):
    path = str(tmp_path / "q.db")
    s = SQLiteStore(path)
    (sub,) = s.submit([job(args=[1])], T0)
    s.close()
    with sqlite3.connect(path) as c:  # what a queickd of schema 1 left behind
        for name in ("plain", "grouped", "group", "rated", "rate_key"):  # the indexes that name the pool came later
            c.execute(f"DROP INDEX jobs_queued_pool_{name}")
        c.execute("DROP INDEX jobs_queued_fair")  # and fair keys' index and triggers
        for name in ("insert", "update", "delete"):
            c.execute(f"DROP TRIGGER jobs_fair_{name}")
        c.execute("ALTER TABLE jobs DROP COLUMN pool")
        c.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    again = SQLiteStore(path)
    assert again.get(sub.job_id).pool == "default"
    assert [j.id for j in again.claim_available(Request.of(5, pools=["default"], now=T0))] == [sub.job_id]
    assert again._conn().execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
    again.close()


def test_a_version_2_file_loses_its_insert_trigger_and_counts_each_new_job_once(tmp_path):
    path = str(tmp_path / "q.db")
    s = SQLiteStore(path)
    s.submit([job(), job(run_at=T0 + 60)], T0)
    s.close()
    with sqlite3.connect(path) as c:  # what a queickd of schema 2 left behind: inserts counted by a trigger
        c.execute("CREATE TRIGGER jobs_count_insert AFTER INSERT ON jobs BEGIN INSERT INTO state_counts"
                  " VALUES (NEW.state, 1) ON CONFLICT (state) DO UPDATE SET n = n + 1; END")
        c.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    again = SQLiteStore(path)
    again.submit([job() for _ in range(300)] + [job(args=[1], run_at=T0 + 60)], T0)
    counts = again.counts()
    assert (counts["queued"], counts["scheduled"]) == (301, 2)
    assert again._conn().execute("SELECT count(*) FROM sqlite_master WHERE name = 'jobs_count_insert'").fetchone()[0] == 0
    again.close()


def test_a_batch_fits_an_sqlite_build_that_allows_only_999_parameters_per_statement(tmp_path):
    s = SQLiteStore(str(tmp_path / "q.db"))
    s._writer().setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)  # what SQLite before 3.32 allows
    subs = s.submit([job(args=[i], key=f"k{i}") for i in range(300)] + [job() for _ in range(300)], T0)
    assert len({x.job_id for x in subs}) == 600
    assert s.get(subs[299].job_id).args == [299] and s.counts()[State.QUEUED] == 600
    s.close()


def test_the_idempotency_keys_of_a_commit_are_looked_up_with_one_statement(tmp_path):
    s = SQLiteStore(str(tmp_path / "q.db"))
    keyed = [[job(idempotency_key=f"k{i}")] for i in range(20)]  # twenty enqueues sharing a commit
    sql: list[str] = []
    s._writer().set_trace_callback(sql.append)
    first = s.submit_requests(keyed, T0)
    again = s.submit_requests(keyed, T0)  # each sent again: answered with the stored job
    s._writer().set_trace_callback(None)
    lookups = [q for q in sql if "idempotency_key" in q and q.startswith("SELECT")]
    assert len(lookups) == 2  # one per commit, not one per key
    assert [a[0].job_id for a in again] == [a[0].job_id for a in first]
    assert all(a[0].duplicate for a in again) and not any(a[0].duplicate for a in first)
    s.close()


def page_size(path) -> int:
    with sqlite3.connect(path) as c:
        return c.execute("PRAGMA page_size").fetchone()[0]


def test_a_new_store_file_gets_small_pages(tmp_path):
    path = str(tmp_path / "q.db")
    SQLiteStore(path).close()
    assert page_size(path) == 1024


def test_a_store_file_with_larger_pages_keeps_them_and_its_jobs(tmp_path):
    path = str(tmp_path / "q.db")
    with sqlite3.connect(path) as c:  # as an earlier release made it: 4 KiB pages, then WAL
        c.execute("PRAGMA page_size=4096")
        c.execute("PRAGMA journal_mode=WAL")
    s = SQLiteStore(path)
    (sub,) = s.submit([job(args=[7])], T0)
    s.close()
    again = SQLiteStore(path)
    assert (page_size(path), again.get(sub.job_id).args) == (4096, [7])
    again.close()


def test_a_job_larger_than_many_pages_comes_back_whole(tmp_path):
    path = str(tmp_path / "q.db")
    s = SQLiteStore(path)
    big = ["x" * 50_000, {"k": list(range(2_000))}]
    (sub,) = s.submit([job(args=big)], T0)
    s.close()
    again = SQLiteStore(path)
    assert again.get(sub.job_id).args == big
    again.close()


@pytest.mark.parametrize("full_group", [False, True], ids=["no full group", "a full group"])
def test_a_claims_work_does_not_grow_with_the_jobs_and_groups_of_a_pool_it_does_not_serve(tmp_path, full_group):
    steps = []
    for parked in (10, 2000):
        s = SQLiteStore(str(tmp_path / f"q{parked}.db"))
        s.submit([job(pool="unserved", concurrency_group=f"parked-{i}") for i in range(parked)], T0)
        if full_group:  # its slot taken, a job of it waiting ahead of every other
            s.submit([job(concurrency_group="full", concurrency_limit=1)], T0)
            assert len(s.claim_available(Request.of(1, pools=["default"], now=T0))) == 1
            s.submit([job(concurrency_group="full", concurrency_limit=1, priority=-10)], T0)
        s.submit([job() for _ in range(5)], T0)
        s.claim_available(Request.of(1, pools=["default"], now=T0))  # the claim after one that met the full group
        steps.append(_claim_steps(s, Request.of(1, pools=["default"], now=T0))[1])
        s.close()
    assert steps[1] <= steps[0] * 1.1 + 10, steps


def test_a_claim_behind_a_full_rate_keys_backlog_reads_past_it_in_two_statements_and_keeps_its_timer(tmp_path):
    s = SQLiteStore(str(tmp_path / "q.db"))
    rl = {"key": "hot", "limit": 1, "per": 10.0}
    s.submit([job(rate_limit=rl) for _ in range(50)], T0)
    plain = s.submit([job() for _ in range(4)], T0)
    assert len(s.claim_available(Request.of(2, now=T0))) == 2  # the key's first job, and it fills
    sql = []
    s._writer().set_trace_callback(sql.append)
    got = s.claim_available(Request.of(2, now=T0 + 1))
    s._writer().set_trace_callback(None)
    assert ([j.id for j in got], got.rate_at) == ([p.job_id for p in plain[1:3]], T0 + 10)
    # Whether a job of another rate key waits, then the queue's first jobs but the key's:
    # as without the key, a statement more (the pools waiting asked first).
    reads = [q for q in sql if q.startswith(("SELECT", "WITH"))]
    assert len(reads) == 3, reads
    s.close()
