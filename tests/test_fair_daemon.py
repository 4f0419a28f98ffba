"""Fair shares against a real daemon (SQLite and PostgreSQL): the order of starts measured
from the claims' own stamps, weights from the config file, and bad input refused naming the
field (at enqueue, by the SQL function enqueue(), and in the config file: exit 78)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from test_resources_daemon import config

from queickd.core.job import State
from queickd.core.protocol import Code, QueueError


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'queue.db'}"
    return request.getfixturevalue("pg_fresh_database")


def _started(q, job_id: int) -> float:
    got = q.get(job_id)["started_at"]
    return float("inf") if got is None else got


def _first_started_after(q, ids: list[int], t: float) -> int:
    """The index of the first of `ids` (which start in this order) started after `t`."""
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if _started(q, ids[mid]) > t:
            hi = mid
        else:
            lo = mid + 1
    return lo


def test_a_backlog_of_10000_delays_another_tenants_first_job_by_one_turn_at_most(start_daemon, store_url):
    d = start_daemon(store_url, workers=1)
    with d.client() as q:
        backlog = []
        for _ in range(10):
            backlog += q.enqueue_many([{"func": "testjobs:noop", "fair_by": "a"} for _ in range(1000)])
        assert q.wait(backlog[20], 60)["state"] == State.SUCCEEDED  # a's jobs are under way
        b = q.enqueue("testjobs:noop", fair_by="b")
        acked = time.time()  # b is committed, so visible to every claim from here on
        done = q.wait(b, 60)
        assert done["state"] == State.SUCCEEDED
        # a's jobs start in their order: those started between b's ack and b's start (a claim
        # racing the ack may still take one of a's; b's created_at is stamped before its
        # commit, so a's jobs started in between were claimed before b could be seen).
        ahead = (_first_started_after(q, backlog, done["started_at"])
                 - _first_started_after(q, backlog, acked))
        assert ahead <= 1, ahead
        assert _started(q, backlog[-1]) == float("inf") or _started(q, backlog[-1]) > done["started_at"]


def test_weights_from_the_config_file_share_starts_two_to_one(start_daemon, store_url, tmp_path):
    d = start_daemon(store_url, "--config", config(tmp_path, "[fair_shares]\nbig = 2\n"), workers=1)
    with d.client() as q:
        ids = q.enqueue_many([{"func": "testjobs:noop", "fair_by": t} for t in ["big"] * 30 + ["small"] * 30])
        for i in ids:
            assert q.wait(i, 60)["state"] == State.SUCCEEDED
        starts = sorted((q.get(i)["started_at"], q.get(i)["fair_by"]) for i in ids)
    first = [t for _, t in starts[:30]]  # while both had work
    assert 19 <= first.count("big") <= 21, first


def test_priority_orders_a_tenants_jobs(start_daemon, store_url):
    d = start_daemon(store_url, workers=1)
    with d.client() as q:
        ids = q.enqueue_many([{"func": "testjobs:noop", "fair_by": "a", "priority": p, "delay": 0.5}
                              for p in (5, 0, 3, 1)])
        for i in ids:
            assert q.wait(i, 60)["state"] == State.SUCCEEDED
        order = sorted(ids, key=lambda i: q.get(i)["started_at"])
    assert order == [ids[1], ids[3], ids[2], ids[0]]


@pytest.mark.parametrize("value", ["x" * 201, 7, ""])
def test_a_bad_fair_by_is_refused_at_enqueue_naming_the_field(client, value):
    with pytest.raises(QueueError) as e:
        client.enqueue("testjobs:noop", fair_by=value)
    assert e.value.code == Code.BAD_REQUEST and "fair_by" in e.value.message


def test_the_sql_function_refuses_a_fair_by_over_200_bytes(pg_store, pg_database):
    psycopg = pytest.importorskip("psycopg")
    qpg = pytest.importorskip("queickd.pg")
    with psycopg.connect(pg_database) as c:
        with pytest.raises(QueueError, match="fair_by") as e:
            qpg.enqueue(c, "m:f", [], schema=pg_store.schema, fair_by="é" * 101)  # 202 bytes
        assert e.value.code == Code.BAD_REQUEST


def test_the_sql_function_takes_a_fair_by(pg_store, pg_database):
    psycopg = pytest.importorskip("psycopg")
    qpg = pytest.importorskip("queickd.pg")
    with psycopg.connect(pg_database) as c:
        job_id = qpg.enqueue(c, "m:f", [], schema=pg_store.schema, fair_by="acme")
        c.commit()
    assert pg_store.get(job_id).fair_by == "acme"
    assert [(k.key, k.waiting) for k in pg_store.fair_keys()] == [("acme", 1)]


@pytest.mark.parametrize("text", ["[fair_shares]\nacme = 0\n", "[fair_shares]\nacme = -2\n",
                                  "[fair_shares]\nacme = nan\n", '[fair_shares]\nacme = "two"\n'])
def test_a_bad_weight_in_the_config_file_exits_78_naming_its_key(tmp_path, text):
    r = subprocess.run([sys.executable, "-m", "queickd", "run", "--config", config(tmp_path, text), "--port", "0",
                        "--store", f"sqlite:///{tmp_path / 'q.db'}"], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ), stdin=subprocess.DEVNULL)
    assert r.returncode == 78 and "fair_shares.acme" in r.stderr, r.stderr


def test_operators_see_the_jobs_waiting_per_fair_key(start_daemon):
    from test_operator_cli import queick

    d = start_daemon(None, workers=0)
    with d.client() as q:
        q.enqueue_many([{"func": "testjobs:noop", "fair_by": t} for t in ["acme"] * 3 + ["globex"]])
        assert [(k["key"], k["waiting"]) for k in q.stats()["fair_keys"]] == [("acme", 3), ("globex", 1)]
    lines = queick(d.port, "status").stdout.splitlines()
    assert next(x for x in lines if x.startswith("acme")).split() == ["acme", "default", "3"]


def test_two_worker_processes_on_postgres_run_every_fair_job_once_keys_one_at_a_time(pg, start_daemon,
                                                                                      start_worker, tmp_path):
    url, _ = pg
    d = start_daemon(url, workers=0)
    start_worker(url, "default", workers=3), start_worker(url, "default", workers=3)
    out = tmp_path / "runs.txt"
    with d.client() as q:
        jobs = {}
        for i in range(120):
            token = f"t{i % 4}-{'k' if i % 5 == 0 else 'x'}-{i}"
            jobs[token] = q.enqueue("testjobs:span", [str(out), token, 0.01], fair_by=f"t{i % 4}",
                                    key="k" if i % 5 == 0 else None)
        done = [q.wait(job_id, 60) for job_id in jobs.values()]
    assert {j["state"] for j in done} == {State.SUCCEEDED} and {j["attempts"] for j in done} == {1}
    runs = [line.split() for line in out.read_text().splitlines()]
    assert sorted(r[0] for r in runs) == sorted(jobs)  # each ran, once
    keyed = sorted((float(start), float(end), token) for token, _, start, end in runs if "-k-" in token)
    assert all(a[1] <= b[0] for a, b in zip(keyed, keyed[1:], strict=False))  # the serial key one at a time
    assert [t for _, _, t in keyed] == [t for t in jobs if "-k-" in t]  # in enqueue order


def test_operators_see_each_fair_keys_waiting_jobs_on_the_status_page_and_in_metrics(start_daemon, tmp_path):
    from httphelpers import scrape, start_web

    web = start_web(start_daemon, tmp_path, workers=0)  # nothing runs: every job waits
    with web.daemon.client() as q:
        q.enqueue_many([q.job("testjobs:noop", fair_by="acme") for _ in range(3)]
                       + [q.job("testjobs:noop", fair_by="zeta")])
    m = scrape(web)
    assert m[("queickd_fair_waiting_jobs", (("key", "acme"), ("pool", "default")))] == 3
    assert m[("queickd_fair_waiting_jobs", (("key", "zeta"), ("pool", "default")))] == 1
    page = web.get("/").body.decode()
    assert "Fair shares" in page and "acme" in page and "not yet" in page
