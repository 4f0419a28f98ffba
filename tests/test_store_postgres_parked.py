"""PostgreSQL's claim while jobs wait that cannot start: jobs in a pool no claimer serves,
each in a group of its own, cost it nothing (skips without a server). The claim's results
in that case are the store contract's (store_contract_parked.py)."""

from store_contract import T0, job

from queickd.core.policy.claim import Request

_HEAD = (-(1 << 31), float("-inf"), 0)


def _park(store, n: int) -> None:
    store.submit([job(pool="unserved", concurrency_group=f"parked-{i}") for i in range(n)], T0)


def test_the_fast_path_claims_while_grouped_jobs_wait_only_in_pools_it_does_not_serve(pg_store):
    _park(pg_store, 3)
    plain = [s.job_id for s in pg_store.submit([job(), job()], T0)]
    got = pg_store.finish_and_claim([], T0, 5, pools=["default"])
    assert got is not None, "the pass asked the selection to claim"
    assert [j.id for j in got] == plain


def test_the_fast_path_still_gives_way_to_the_selection_for_a_grouped_job_of_a_pool_it_serves(pg_store):
    _park(pg_store, 3)
    pg_store.submit([job(concurrency_group="g")], T0)
    assert pg_store.finish_and_claim([], T0, 5, pools=["default"]) is None


def _page_scans(url: str, pools: list[str] | None) -> int:
    """Index scans of the jobs table by one page of the selection, from the head of the queue:
    counted by PostgreSQL in the transaction (pg_stat_xact_user_tables), not timed."""
    import psycopg

    with psycopg.connect(url) as c, c.transaction():
        count = ("SELECT idx_scan FROM pg_stat_xact_user_tables WHERE relname = 'jobs'"
                 " AND schemaname = current_schema()")
        before = c.execute(count).fetchone()[0]
        c.execute("SELECT * FROM queickd_candidates_after(%s, '{}', 32, %s, %s, %s, '{}')", (pools, *_HEAD)).fetchall()
        return c.execute(count).fetchone()[0] - before


def test_a_selection_page_does_not_grow_with_the_groups_of_a_pool_it_does_not_serve(pg_url, pg_store):
    pg_store.submit([job(concurrency_group="full", concurrency_limit=1), job()], T0)
    _park(pg_store, 10)
    few = _page_scans(pg_url, ["default"])
    _park(pg_store, 300)
    many = _page_scans(pg_url, ["default"])
    assert many == few


def _fill(store, group: str = "full", pool: str = "default") -> None:
    """A group of limit 1 whose slot a running job holds, and a job of it waiting ahead of every other."""
    (holder,) = store.submit([job(concurrency_group=group, concurrency_limit=1, pool=pool, priority=-20)], T0)
    assert [j.id for j in store.claim_available(Request.of(1, pools=[pool], now=T0))] == [holder.job_id]
    store.submit([job(concurrency_group=group, concurrency_limit=1, pool=pool, priority=-10)], T0)


def test_the_fast_path_claims_past_a_full_groups_waiting_job(pg_store):
    _fill(pg_store)
    plain = [s.job_id for s in pg_store.submit([job(), job()], T0)]
    got = pg_store.finish_and_claim([], T0, 5, pools=["default"])
    assert got is not None, "the pass asked the selection to claim"
    assert [j.id for j in got] == plain


def test_the_fast_path_gives_way_to_a_group_with_a_slot_free_behind_a_full_one(pg_store):
    _fill(pg_store, "full", "a")
    pg_store.submit([job(concurrency_group="open", concurrency_limit=1, pool="b"), job(pool="a")], T0)
    assert pg_store.finish_and_claim([], T0, 5, pools=["a", "b"]) is None


def _claim_reads(store, limit: int) -> tuple[int, int]:
    """(jobs claimed, index entries of the jobs table the claim fetched): counted by
    PostgreSQL in the claim's transaction (pg_stat_xact_user_tables), not timed."""
    with store.transaction(bookkeeping=True) as tx:
        c = store._bookkeeping_conn()
        count = ("SELECT idx_tup_fetch FROM pg_stat_xact_user_tables WHERE relname = 'jobs'"
                 " AND schemaname = current_schema()")
        before = c.execute(count).fetchone()[0]
        got = tx.claim_available(Request.of(limit, pools=["default"], now=T0))
        return len(got), c.execute(count).fetchone()[0] - before


def test_a_claim_past_a_full_groups_waiting_job_reads_what_it_reads_without_one_and_the_group(pg_store):
    _park(pg_store, 50)
    pg_store.submit([job() for _ in range(20)], T0)
    assert _claim_reads(pg_store, 2)[0] == 2
    _, without = _claim_reads(pg_store, 2)
    _fill(pg_store)
    assert _claim_reads(pg_store, 2)[0] == 2
    _, past_full = _claim_reads(pg_store, 2)
    # The group found waiting and its running job, whatever else runs.
    assert past_full <= without + 2, (without, past_full)
