"""A PostgreSQL worker pool's pass and claim: each claim function planned once, the fast
path and when it leaves the claim to the selection, the pass in one statement and whom its
finishes tell (skips without a server). Listeners and lost answers:
test_store_postgres_listen.py."""

import threading

import pytest
from contract_jobs import trip_bad
from pgfixtures import listen_for_queickd
from store_contract import T0, job

from queickd.core.job import Outcome, State
from queickd.core.policy.claim import Request


def test_every_claim_function_is_planned_once_per_session(pg_store):
    """The claim's functions take parameters; PL/pgSQL plans such statements again on each
    call while a generic plan prices above the values' own, and the view's always did
    (store/postgres/claim_sql.PLANNED): a worker of one slot planned on every job. Each function of the
    claim's path says force_generic_plan, with the planner settings its plans rely on."""
    rows = pg_store._conn().execute(
        "SELECT proname, proconfig FROM pg_proc WHERE proname LIKE 'queickd\\_%' ORDER BY proname").fetchall()
    names = {name for name, _ in rows}
    assert {"queickd_claim", "queickd_claim_view", "queickd_candidates", "queickd_candidates_after",
            "queickd_start"} <= names
    for name, config in rows:
        assert "plan_cache_mode=force_generic_plan" in (config or []), name
        assert "enable_seqscan=off" in config, name


class _CountingConnection:
    """A store connection that counts the statements sent through it."""

    def __init__(self, conn):
        self._conn, self.sent = conn, []

    def execute(self, query, params=None, **kw):
        self.sent.append(str(query).split("(")[0])
        return self._conn.execute(query, params, **kw)

    def __getattr__(self, name):
        return getattr(self._conn, name)


def test_a_claim_with_no_group_or_budget_in_play_is_one_statement(pg_store, monkeypatch):
    # A worker of one slot claims once per job: its claim's round trips are per job too.
    pg_store.submit([job(), job()], T0)
    counting = _CountingConnection(pg_store._bookkeeping_conn())
    monkeypatch.setattr(pg_store, "_bookkeeping_conn", lambda: counting)
    with pg_store.transaction(bookkeeping=True) as tx:
        (claimed,) = tx.claim_available(Request.of(1, now=T0))
    assert len(counting.sent) == 1 and pg_store.get(claimed.id).state == State.RUNNING


def test_the_fast_path_leaves_the_claim_to_the_selection_when_a_grouped_job_waits(pg_store):
    from queickd.store.postgres.claim import _BUDGET_LOCK

    plain, grouped = pg_store.submit([job(), job(concurrency_group="g", concurrency_limit=1)], T0)
    c = pg_store._bookkeeping_conn()
    with c.transaction(force_rollback=True):
        rows = c.execute("SELECT id, state FROM queickd_claim(%s, %s, 1, NULL, true, 5)", (_BUDGET_LOCK, T0)).fetchall()
        assert rows == [(None, None)]  # nothing claimed: the selection's turn
    assert pg_store.get(plain.job_id).state == State.QUEUED
    got = pg_store.claim_available(Request.of(5, now=T0))
    assert sorted(j.id for j in got) == sorted([plain.job_id, grouped.job_id])


def test_the_fast_path_leaves_the_claim_to_the_selection_when_a_served_pool_has_a_budget(pg_store):
    from queickd.core.policy.claim import Limits

    pg_store.adopt_budgets(Limits(pools={"b": 2}))
    pg_store.submit([job(pool="b", cost_units=1.0) for _ in range(3)], T0)
    got = pg_store.claim_available(Request.of(5, pools=["b"], now=T0))
    assert len(got) == 2  # the budget held: the selection claimed, not the fast path


def _heard(c) -> list[tuple[str, str]]:
    return sorted((n.channel, n.payload.split(":")[0]) for n in c.notifies(timeout=0.5, stop_after=10))


def _finish_and_claim_both_ways(store, one_step: bool, outcomes, now):
    if one_step:
        got = store.finish_and_claim(outcomes, now, 2)
        assert got is not None
        return got
    with store.transaction(bookkeeping=True) as tx:
        tx.finish_if_running(outcomes, now)
        return tx.claim_available(Request.of(2, now=now))


@pytest.mark.parametrize("one_step", [False, True], ids=["finish_then_claim", "one_statement"])
def test_a_pass_in_one_statement_stores_what_the_finish_and_the_claim_store(pg, one_step):
    # The steady state's pass restates finish_if_running for successes (store/postgres/pass_sql.py):
    # the rows, the streaks and pauses, and the notifications must be the same either way.
    from queickd.store.postgres.store import PostgresStore

    url, admin = pg
    store = PostgresStore(url)
    try:
        trip_bad(store)  # m:bad paused, its probe due at T0 + 60; k:1 has a failure streak
        store.submit([job(func="m:f", key="k1")], T0)
        (keyed,) = store.claim_available(Request.of(1, now=T0))
        store.finish_if_running([Outcome.dead(keyed.id, {"type": "E", "message": "no"})], T0)
        store.submit([job(func="m:bad"), job(func="m:f", key="k1"), job(func="m:g")], T0)
        running = store.claim_available(Request.of(5, now=T0 + 60))  # the probe, the keyed job, the plain one
        assert len(running) == 3
        store.submit([job(func="m:next") for _ in range(3)], T0 + 60)
        ears = listen_for_queickd(url)
        claimed = _finish_and_claim_both_ways(
            store, one_step, [Outcome.succeeded(j.id, {"n": j.id}, output=f"out {j.id}") for j in running], T0 + 61)
        rows = admin.execute("SELECT func, state, result, error, output, finished_at, worker_id, attempts"
                             " FROM jobs WHERE id = ANY(%s) ORDER BY id", ([j.id for j in running],)).fetchall()
        assert [r[1] for r in rows] == ["succeeded"] * 3
        assert [(r[2], r[4], r[5], r[6], r[7]) for r in rows] == [
            (f'{{"n":{j.id}}}', f"out {j.id}", T0 + 61, None, 1) for j in running]
        assert all(r[3] is None for r in rows)
        assert store.pauses() == [] and admin.execute("SELECT count(*) FROM streaks").fetchone()[0] == 0
        assert [j.func for j in claimed] == ["m:next", "m:next"]
        assert _heard(ears) == [("queickd", "fk"), ("queickd", "r")]
    finally:
        store.close()


@pytest.mark.parametrize("one_step", [False, True], ids=["finish_then_claim", "one_statement"])
def test_a_pass_with_room_left_takes_due_probes_for_that_room_only(pg_store, one_step):
    # The pass claims with the fast path's statement, then hands the room left (not its
    # whole limit) to queickd_claim when a pause's probe is due (store/postgres/pass_sql.py).
    trip_bad(pg_store)  # m:bad and m:worse paused, their probes due at T0 + 60
    trip_bad(pg_store, "m:worse")
    pg_store.submit([job(func="m:g")], T0)
    (plain,) = pg_store.claim_available(Request.of(1, now=T0))
    pg_store.submit([job(func="m:bad"), job(func="m:worse"), job(func="m:h")], T0 + 60)
    claimed = _finish_and_claim_both_ways(pg_store, one_step, [Outcome.succeeded(plain.id, None)], T0 + 61)
    funcs = sorted(j.func for j in claimed)
    assert len(funcs) == 2 and "m:h" in funcs  # a limit of 2: the plain job and one probe
    (probe,) = [j for j in claimed if j.func != "m:h"]
    assert [p.probe_job for p in pg_store.pauses() if p.name == probe.func] == [probe.id]


def test_a_pass_lifts_no_pause_and_tells_no_finish_for_a_job_it_did_not_finish(pg):
    # A probe given back meanwhile (not started) is no longer running: a late outcome for it
    # changes nothing, the pause still names its probe, and the finish told names only the
    # job that did finish.
    from queickd.store.postgres.store import PostgresStore

    url, _ = pg
    store = PostgresStore(url)
    try:
        trip_bad(store)
        store.submit([job(func="m:g", key="k")], T0)
        (keyed,) = store.claim_available(Request.of(1, now=T0))
        store.submit([job(func="m:bad")], T0 + 60)
        (probe,) = store.claim_available(Request.of(1, now=T0 + 60))
        assert store.release_unstarted([probe.id]) == 1
        ears = listen_for_queickd(url)
        outcomes = [Outcome.succeeded(keyed.id, None), Outcome.succeeded(probe.id, None)]
        assert store.finish_and_claim(outcomes, T0 + 61, 0) == []  # finishes only
        assert store.get(keyed.id).state == State.SUCCEEDED
        assert [p.probe_job for p in store.pauses()] == [probe.id]
        assert store.get(probe.id).state == State.QUEUED
        told = [(n.channel, n.payload) for n in ears.notifies(timeout=0.5, stop_after=5)]
        assert told == [("queickd", f"fk:{keyed.id}")]  # a freed key; not the given-back probe
    finally:
        store.close()


def _finish_one(store, one_step: bool, job_id: int) -> None:
    if one_step:
        assert store.finish_and_claim([Outcome.succeeded(job_id, None)], T0, 1) == []
    else:
        store.finish_if_running([Outcome.succeeded(job_id, None)], T0)


@pytest.fixture
def running(pg):
    """(URL, an admin connection, a store of its own, a job it claimed)."""
    from queickd.store.postgres.store import PostgresStore

    url, admin = pg
    store = PostgresStore(url)
    try:
        store.submit([job()], T0)
        (j,) = store.claim_available(Request.of(1, now=T0))
        yield url, admin, store, j
    finally:
        store.close()


@pytest.mark.parametrize("one_step", [False, True], ids=["finish", "one_statement"])
def test_a_finish_that_frees_nothing_and_nobody_waits_on_tells_no_one(running, one_step):
    # PostgreSQL 15 wakes every listening backend of the database on each notifying commit.
    url, _, store, j = running
    ears = listen_for_queickd(url)
    _finish_one(store, one_step, j.id)
    assert store.get(j.id).state == State.SUCCEEDED and _heard(ears) == []


@pytest.mark.parametrize("one_step", [False, True], ids=["finish", "one_statement"])
def test_a_finish_of_a_job_a_client_waits_on_tells_the_finished_channel(running, one_step):
    url, _, store, j = running
    store.watch_finish(j.id)
    ears = listen_for_queickd(url)
    _finish_one(store, one_step, j.id)
    assert _heard(ears) == [("queickd_finished", "f")]


@pytest.mark.parametrize("one_step", [False, True], ids=["finish", "one_statement"])
def test_a_finish_made_while_a_wait_is_being_marked_sees_the_mark(running, one_step):
    # The mark and the finish update one row: the finish waits for the mark's commit and
    # reads it from the row's newest version.
    url, admin, store, j = running
    ears = listen_for_queickd(url)
    admin.autocommit = False
    try:
        admin.execute("UPDATE jobs SET waited = true WHERE id = %s", (j.id,))  # the mark, not yet committed
        finishing = threading.Thread(target=_finish_one, args=(store, one_step, j.id))
        finishing.start()
        finishing.join(0.5)
        assert finishing.is_alive()  # held by the mark's row lock
        admin.commit()
        finishing.join(10)
        assert not finishing.is_alive() and store.get(j.id).state == State.SUCCEEDED
        assert _heard(ears) == [("queickd_finished", "f")]
    finally:
        admin.rollback()
        admin.autocommit = True


def test_a_mark_made_while_the_finish_is_uncommitted_leaves_the_job_as_finished(pg_store):
    # The daemon's look after the mark then sees the finish: nothing needs telling.
    import threading

    pg_store.submit([job()], T0)
    (j,) = pg_store.claim_available(Request.of(1, now=T0))
    with pg_store.transaction(bookkeeping=True) as tx:
        tx.finish_if_running([Outcome.succeeded(j.id, None)], T0)
        marking = threading.Thread(target=pg_store.watch_finish, args=(j.id,))
        marking.start()
        marking.join(0.5)
        assert marking.is_alive()  # held by the finish's row lock
    marking.join(10)
    assert not marking.is_alive() and pg_store.get(j.id).state == State.SUCCEEDED


@pytest.mark.parametrize("outcome", ["dead", "retry", "workflow_step"])
def test_a_pass_in_one_statement_is_only_for_successes_outside_workflows(pg_store, outcome):
    pg_store.submit([job(), job()], T0)
    j, _ = pg_store.claim_available(Request.of(1, now=T0)) + [None]
    o = {"dead": lambda: Outcome.dead(j.id, {"type": "E", "message": "no"}),
         "retry": lambda: Outcome.retry_at(j.id, T0 + 5, {"type": "E", "message": "no"}),
         "workflow_step": lambda: Outcome.succeeded(j.id, None, workflow_run=1)}[outcome]()
    assert pg_store.finish_and_claim([o], T0, 1) is None
    assert pg_store.get(j.id).state == State.RUNNING and pg_store.counts()["queued"] == 1  # nothing done


def test_a_pass_in_one_statement_does_nothing_when_the_selection_must_claim(pg_store):
    pg_store.submit([job()], T0)
    (j,) = pg_store.claim_available(Request.of(1, now=T0))
    pg_store.submit([job(concurrency_group="g", concurrency_limit=1)], T0)
    assert pg_store.finish_and_claim([Outcome.succeeded(j.id, None)], T0, 1) is None
    assert pg_store.get(j.id).state == State.RUNNING and pg_store.counts()["queued"] == 1


def test_jobs_a_pass_in_one_statement_claimed_but_cannot_read_are_given_back(pg_store, monkeypatch):
    # Its transaction has committed: jobs left `running` under a worker that beats on
    # without them would never run.
    from queickd.store.postgres import claim as pgclaim

    (s,) = pg_store.submit([job()], T0)

    def unreadable(row):
        raise ValueError("a row this worker cannot read")

    monkeypatch.setattr(pgclaim.dbrows, "row_to_job", unreadable)
    with pytest.raises(ValueError, match="cannot read"):
        pg_store.finish_and_claim([], T0, 1)
    monkeypatch.undo()
    back = pg_store.get(s.job_id)
    assert back.state == State.QUEUED and back.attempts == 0 and back.run_at == T0


def test_a_pass_keeps_its_cursor_unless_its_outcomes_were_large(pg_store):
    pg_store.submit([job() for _ in range(3)], T0)
    (a,) = pg_store.claim_available(Request.of(1, now=T0))
    (b,) = pg_store.finish_and_claim([Outcome.succeeded(a.id, 1)], T0, 1)
    kept = pg_store._passes.cursor
    (c,) = pg_store.finish_and_claim([Outcome.succeeded(b.id, 1, output="x" * 100_000)], T0, 1)
    assert kept is not None and pg_store._passes.cursor is None  # it held the 100 KB output
    pg_store.finish_and_claim([Outcome.succeeded(c.id, 1)], T0, 1)
    assert pg_store._passes.cursor is not None
    assert pg_store.get(b.id).output == "x" * 100_000
